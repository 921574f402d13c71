//! Elementwise row loops compiled for the CPU's widest vector ISA.
//!
//! Each loop is written once and instantiated by `isa_fn!` (kernels/mod.rs) inside `#[target_feature]`
//! functions for AVX-512 and AVX2+FMA and picked at run time ([`super::fastmath::isa`]).
//! The caller's closure is inlined into each copy, so a plain expression vectorizes 16 or 8
//! lanes wide instead of SSE2's 4. Rust never contracts `a * b + c` into an FMA on its own,
//! so every copy returns the same bits as the plain loop.
//!
//! The row helpers are generic over element types, like the kernels that call them; the
//! wide copies are taken when all element types are `f32` (a `TypeId` test, resolved at
//! compile time), other types run the plain loop.

use std::any::TypeId;

isa_fn!(
    /// `v[i] = f(v[i])`.
    pub(crate) fn map1_inplace[F: Fn(f32) -> f32 + Copy](v: &mut [f32], f: F) {
        for x in v.iter_mut() {
            *x = f(*x);
        }
    }
);

isa_fn!(
    /// `a[i] = f(a[i], b[i])` over the shorter length.
    pub(crate) fn map2_inplace[F: Fn(f32, f32) -> f32 + Copy](a: &mut [f32], b: &[f32], f: F) {
        for (x, &y) in a.iter_mut().zip(b) {
            *x = f(*x, y);
        }
    }
);

isa_fn!(
    /// `dst[i] = f(a[i])` over the shorter length.
    pub(crate) fn map1_into[F: Fn(f32) -> f32 + Copy](dst: &mut [f32], a: &[f32], f: F) {
        for (d, &x) in dst.iter_mut().zip(a) {
            *d = f(x);
        }
    }
);

isa_fn!(
    /// `dst[i] = f(a[i], b[i])` over the shortest length.
    pub(crate) fn map2_into[F: Fn(f32, f32) -> f32 + Copy](dst: &mut [f32], a: &[f32], b: &[f32], f: F) {
        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *d = f(x, y);
        }
    }
);

isa_fn!(
    /// `dst[i] = f(...f(f(init, srcs[0][i]), srcs[1][i])..., srcs[last][i])`: the taps
    /// combined in list order, 16 outputs at a time in a register (a pass per tap over
    /// the outputs in memory would reload each output right after a masked store).
    fn fold_taps_f32[F: Fn(f32, f32) -> f32 + Copy](dst: &mut [f32], srcs: &[&[f32]], init: f32, f: F) {
        const B: usize = 16;
        let n = dst.len();
        if n < B && srcs.iter().all(|s| s.len() >= B) {
            // A short row whose taps have a whole block readable: fold all 16 lanes,
            // keep the first n.
            let mut acc = [init; B];
            for s in srcs {
                let s: &[f32; B] = s[..B].try_into().unwrap();
                for j in 0..B {
                    acc[j] = f(acc[j], s[j]);
                }
            }
            dst.copy_from_slice(&acc[..n]);
            return;
        }
        if n < B {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = srcs.iter().fold(init, |acc, s| f(acc, s[i]));
            }
            return;
        }
        // Blocks at 0, 16, 32, ... and a last one ending at n (it may overlap the one
        // before it: those outputs are computed twice, to the same value).
        let mut i = 0;
        loop {
            let mut acc = [init; B];
            for s in srcs {
                let s: &[f32; B] = s[i..i + B].try_into().unwrap();
                for j in 0..B {
                    acc[j] = f(acc[j], s[j]);
                }
            }
            dst[i..i + B].copy_from_slice(&acc);
            if i + B == n {
                break;
            }
            i = (i + B).min(n - B);
        }
    }
);

/// `dst[i]` = `init` combined with `srcs[t][i]` for each tap t in order, through `f`
/// (a pooling window's taps over one output row). Each `srcs[t]` is at least `dst.len()`
/// long; a row shorter than 16 is fastest when every `srcs[t]` has 16 readable elements.
pub(crate) fn fold_taps<T: Copy + 'static>(
    dst: &mut [T],
    srcs: &[&[T]],
    init: T,
    f: impl Fn(T, T) -> T + Copy,
) {
    if is_f32::<T>() {
        // SAFETY: T is f32, so `&[T]` and `&[f32]` have the same layout.
        let s32: &[&[f32]] =
            unsafe { std::slice::from_raw_parts(srcs.as_ptr().cast(), srcs.len()) };
        let g = move |x: f32, y: f32| back(f(conv1(x), conv1(y)));
        return fold_taps_f32(as_f32_mut(dst), s32, back(init), g);
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = srcs.iter().fold(init, |acc, s| f(acc, s[i]));
    }
}

pub(crate) fn is_f32<T: 'static>() -> bool {
    TypeId::of::<T>() == TypeId::of::<f32>()
}

/// Reinterpret a slice whose element type is `f32` (checked by the caller through
/// [`is_f32`]; [`as_f32_mut`] likewise).
pub fn as_f32<T: 'static>(s: &[T]) -> &[f32] {
    debug_assert!(is_f32::<T>());
    // SAFETY: T is f32 (same type, same layout).
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

pub fn as_f32_mut<T: 'static>(s: &mut [T]) -> &mut [f32] {
    debug_assert!(is_f32::<T>());
    // SAFETY: T is f32 (same type, same layout).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// `f` seen as an `f32` function (identity reinterpretations; T is f32 at the call sites).
#[inline(always)]
fn conv1<T: Copy + 'static>(x: f32) -> T {
    // SAFETY: T is f32 (checked by the callers through `is_f32`).
    unsafe { std::mem::transmute_copy(&x) }
}

#[inline(always)]
fn back<T: Copy + 'static>(x: T) -> f32 {
    // SAFETY: T is f32 (checked by the callers through `is_f32`).
    unsafe { std::mem::transmute_copy(&x) }
}

/// `dst[i] = f(a[i], b[i])`.
#[inline]
pub(crate) fn zip_into<A, B, O>(dst: &mut [O], a: &[A], b: &[B], f: impl Fn(A, B) -> O + Copy)
where
    A: Copy + 'static,
    B: Copy + 'static,
    O: Copy + 'static,
{
    if is_f32::<A>() && is_f32::<B>() && is_f32::<O>() {
        let g = move |x: f32, y: f32| back(f(conv1(x), conv1(y)));
        return map2_into(as_f32_mut(dst), as_f32(a), as_f32(b), g);
    }
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

/// `dst[i] = f(a[i])`.
#[inline]
pub(crate) fn map_into<A, O>(dst: &mut [O], a: &[A], f: impl Fn(A) -> O + Copy)
where
    A: Copy + 'static,
    O: Copy + 'static,
{
    if is_f32::<A>() && is_f32::<O>() {
        let g = move |x: f32| back(f(conv1(x)));
        return map1_into(as_f32_mut(dst), as_f32(a), g);
    }
    for (d, &x) in dst.iter_mut().zip(a) {
        *d = f(x);
    }
}

/// `a[i] = f(a[i], b[i])`.
#[inline]
pub fn zip_inplace<T, B>(a: &mut [T], b: &[B], f: impl Fn(T, B) -> T + Copy)
where
    T: Copy + 'static,
    B: Copy + 'static,
{
    if is_f32::<T>() && is_f32::<B>() {
        let g = move |x: f32, y: f32| back(f(conv1(x), conv1(y)));
        return map2_inplace(as_f32_mut(a), as_f32(b), g);
    }
    for (x, &y) in a.iter_mut().zip(b) {
        *x = f(*x, y);
    }
}

/// `a[i] = f(a[i])`.
#[inline]
pub fn map_inplace<T: Copy + 'static>(a: &mut [T], f: impl Fn(T) -> T + Copy) {
    if is_f32::<T>() {
        let g = move |x: f32| back(f(conv1(x)));
        return map1_inplace(as_f32_mut(a), g);
    }
    for x in a.iter_mut() {
        *x = f(*x);
    }
}

/// The NaN/±inf counts of a buffer, as `rlx_ir::numeric_check::scan_data` gives them: a
/// clean f32 buffer is recognized by [`max_abs_bits`] (split over rayon when large), every
/// other buffer goes to `scan_data`. This is the scanner's per-op cost on the CPU.
pub fn scan_counts(d: &rlx_ir::TensorData) -> rlx_ir::numeric_check::NonFiniteCounts {
    let clean = match d {
        rlx_ir::TensorData::F32(v) => max_abs_bits(v) < 0x7f80_0000,
        // A 16-bit float is finite when its exponent field is not all ones.
        rlx_ir::TensorData::BF16(v) => max_abs_bits16(bf16_as_bits(v)) < 0x7f80,
        rlx_ir::TensorData::F16(v) => max_abs_bits16(f16_as_bits(v)) < 0x7c00,
        _ => false,
    };
    if clean {
        return rlx_ir::numeric_check::NonFiniteCounts {
            len: d.len(),
            ..Default::default()
        };
    }
    rlx_ir::numeric_check::scan_data(d)
}

/// `v ↦ min(hi, max(lo, v + b))` in place (`maxps`/`minps` operand order: a NaN comes
/// through; with `nan_out` it becomes `f32::NAN`), returning the largest `bits &
/// 0x7fff_ffff` of `v + b` before the clamp, as [`max_abs_bits`] gives it: one pass where
/// the NaN scan of a conv with a fused Relu/Clip took a scan pass and a clamp pass. The
/// caller passes `b = -0.0` for no bias (`v + -0.0` is `v`, -0 included).
pub(crate) fn bias_clamp_bits(v: &mut [f32], b: f32, lo: f32, hi: f32, nan_out: bool) -> u32 {
    isa_fn!(
        #[allow(clippy::eq_op)] // t != t: NaN
        fn one[](v: &mut [f32], b: f32, lo: f32, hi: f32, nan_out: bool) -> u32 {
            let mut m = 0u32;
            let clamp = |t: f32| {
                let c = if lo > t { lo } else { t };
                if hi < c {
                    hi
                } else {
                    c
                }
            };
            // One loop per case, each branch-free inside, so each vectorizes.
            if nan_out {
                for x in v.iter_mut() {
                    let t = *x + b;
                    m = m.max(t.to_bits() & 0x7fff_ffff);
                    *x = if t != t { f32::NAN } else { clamp(t) };
                }
            } else {
                for x in v.iter_mut() {
                    let t = *x + b;
                    m = m.max(t.to_bits() & 0x7fff_ffff);
                    *x = clamp(t);
                }
            }
            m
        }
    );
    one(v, b, lo, hi, nan_out)
}

/// The largest `bits & 0x7fff_ffff` over `v`: below `0x7f80_0000` exactly when every element
/// is finite, and then `f32::from_bits` of it is max|v| (the order of IEEE bit patterns
/// without the sign is the order of magnitudes). One integer-max pass at the widest ISA,
/// split over rayon when large.
pub fn max_abs_bits(v: &[f32]) -> u32 {
    isa_fn!(
        fn one[](v: &[f32]) -> u32 {
            v.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff))
        }
    );
    use rayon::prelude::*;
    if super::par_worth(v.len()) {
        v.par_chunks(1 << 15).map(one).max().unwrap_or(0)
    } else {
        one(v)
    }
}

/// `half::bf16::to_f32` on bits: the 16-bit shift, a signalling NaN made quiet (bit 6 of
/// the bfloat16 set), as `half` does it.
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    let b = b as u32;
    let b = if b & 0x7fff > 0x7f80 { b | 0x40 } else { b };
    f32::from_bits(b << 16)
}

/// `half::bf16::from_f32` on bits: round to nearest, ties to even (`x + 0x7fff + lsb`, the
/// same carries as `half`'s test of the round bit and the bits below it or the lsb), a NaN
/// kept quiet with the top of its payload.
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let x = x.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        ((x >> 16) | 0x40) as u16
    } else {
        (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16
    }
}

isa_fn!(
    /// `dst[i] = src[i] as f32` for bfloat16 bits (over the shorter length).
    pub(crate) fn widen_bf16[](dst: &mut [f32], src: &[half::bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_bits_to_f32(s.to_bits());
        }
    }
);

isa_fn!(
    /// `dst[i] = bf16::from_f32(src[i])` (over the shorter length).
    pub fn narrow_bf16[](dst: &mut [half::bf16], src: &[f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = half::bf16::from_bits(f32_to_bf16_bits(s));
        }
    }
);

isa_fn!(
    /// `v[i] = bf16::from_f32(v[i]).to_f32()`: a value rounded to bfloat16 and held in f32.
    pub(crate) fn round_bf16_inplace[](v: &mut [f32]) {
        for x in v.iter_mut() {
            *x = bf16_bits_to_f32(f32_to_bf16_bits(*x));
        }
    }
);

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    use std::sync::OnceLock;
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx"))
}

/// `dst[i] = src[i].to_f32()` for float16 (over the shorter length): F16C 8 at a time where
/// the CPU has it (what `half` calls per element then), else `half`.
pub(crate) fn widen_f16(dst: &mut [f32], src: &[half::f16]) {
    let n = dst.len().min(src.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        #[target_feature(enable = "avx,f16c")]
        unsafe fn run(dst: &mut [f32], src: &[half::f16]) {
            use std::arch::x86_64::*;
            let n = dst.len();
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 <= n elements of each slice.
                unsafe {
                    let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                }
                i += 8;
            }
            for j in i..n {
                dst[j] = src[j].to_f32();
            }
        }
        // SAFETY: the CPU has AVX and F16C (checked above).
        return unsafe { run(&mut dst[..n], &src[..n]) };
    }
    for (d, s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d = s.to_f32();
    }
}

/// `dst[i] = f16::from_f32(src[i])` (over the shorter length): F16C round to nearest even
/// 8 at a time where the CPU has it (what `half` calls per element then), else `half`.
pub fn narrow_f16(dst: &mut [half::f16], src: &[f32]) {
    let n = dst.len().min(src.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        #[target_feature(enable = "avx,f16c")]
        unsafe fn run(dst: &mut [half::f16], src: &[f32]) {
            use std::arch::x86_64::*;
            let n = dst.len();
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 <= n elements of each slice.
                unsafe {
                    let v = _mm256_loadu_ps(src.as_ptr().add(i));
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                    _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
                }
                i += 8;
            }
            for j in i..n {
                dst[j] = half::f16::from_f32(src[j]);
            }
        }
        // SAFETY: the CPU has AVX and F16C (checked above).
        return unsafe { run(&mut dst[..n], &src[..n]) };
    }
    for (d, &s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d = half::f16::from_f32(s);
    }
}

/// `v[i] = f16::from_f32(v[i]).to_f32()`, through blocks of [`narrow_f16`] and [`widen_f16`].
pub(crate) fn round_f16_inplace(v: &mut [f32]) {
    let mut t = [half::f16::ZERO; 256];
    for c in v.chunks_mut(256) {
        let t = &mut t[..c.len()];
        narrow_f16(t, c);
        widen_f16(c, t);
    }
}

/// A 16-bit float stored in memory and computed in f32 (kernels/mod.rs): its conversions
/// over slices, vectorized, with `half`'s bits.
pub trait Half: Copy + Default + Send + Sync + 'static {
    /// `dst[i] = src[i] as f32` over the shorter length.
    fn widen(dst: &mut [f32], src: &[Self]);
    /// `dst[i] = Self::from_f32(src[i])` over the shorter length.
    fn narrow(dst: &mut [Self], src: &[f32]);
    /// `v[i] = Self::from_f32(v[i]) as f32`.
    fn round_inplace(v: &mut [f32]);
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Half for half::bf16 {
    fn widen(dst: &mut [f32], src: &[Self]) {
        widen_bf16(dst, src)
    }
    fn narrow(dst: &mut [Self], src: &[f32]) {
        narrow_bf16(dst, src)
    }
    fn round_inplace(v: &mut [f32]) {
        round_bf16_inplace(v)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

impl Half for half::f16 {
    fn widen(dst: &mut [f32], src: &[Self]) {
        widen_f16(dst, src)
    }
    fn narrow(dst: &mut [Self], src: &[f32]) {
        narrow_f16(dst, src)
    }
    fn round_inplace(v: &mut [f32]) {
        round_f16_inplace(v)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

/// Elements per f32 block of the 16-bit float loops (three such blocks on the stack).
pub(crate) const HBLOCK: usize = 512;

/// `out[i] = H::from_f32(k(v as f32)[i])` with `k` an f32 slice kernel `(src, dst)`, block
/// by block through f32 stack buffers, split over rayon above the parallel threshold.
pub(crate) fn half_map<H: Half>(
    v: &[H],
    k: impl Fn(&[f32], &mut [f32]) + Sync + Send + Copy,
) -> Vec<H> {
    fn run<H: Half>(d: &mut [H], s: &[H], k: impl Fn(&[f32], &mut [f32])) {
        let mut a = [0f32; HBLOCK];
        let mut b = [0f32; HBLOCK];
        for (dc, sc) in d.chunks_mut(HBLOCK).zip(s.chunks(HBLOCK)) {
            let n = dc.len();
            H::widen(&mut a[..n], sc);
            k(&a[..n], &mut b[..n]);
            H::narrow(dc, &b[..n]);
        }
    }
    // Every element is written below.
    let mut out = crate::buffers::overwritten(v.len());
    if super::par_worth(v.len()) {
        use rayon::prelude::*;
        out.par_chunks_mut(8192)
            .zip(v.par_chunks(8192))
            .for_each(|(d, s)| run(d, s, k));
    } else {
        run(&mut out, v, k);
    }
    out
}

fn bf16_as_bits(v: &[half::bf16]) -> &[u16] {
    // SAFETY: bf16 is a transparent wrapper of u16.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

fn f16_as_bits(v: &[half::f16]) -> &[u16] {
    // SAFETY: f16 is a transparent wrapper of u16.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

/// The largest `bits & 0x7fff` over 16-bit float bits ([`max_abs_bits`] for float16 and
/// bfloat16), split over rayon when large.
pub(crate) fn max_abs_bits16(v: &[u16]) -> u16 {
    isa_fn!(
        fn one[](v: &[u16]) -> u16 {
            v.iter().fold(0u16, |m, x| m.max(x & 0x7fff))
        }
    );
    use rayon::prelude::*;
    if super::par_worth(v.len()) {
        v.par_chunks(1 << 15).map(one).max().unwrap_or(0)
    } else {
        one(v)
    }
}
