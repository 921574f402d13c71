//! Matrix products with f32, bf16 or f16 operands that never widen a whole 16-bit operand.
//!
//! * [`small_m`]: few rows (`max_m`) (decode's matrix·vector), B read in place in one of
//!   two layouts ([`Layout`]): rows of Bᵀ contiguous (`W[n, :]`, the checkpoint layout read
//!   through `Transpose(W, [1, 0])`: `y[m, n] = x[m, :] · W[n, :]`) or rows of B contiguous
//!   (`[K, N]`, axpy-style). 16-bit weights are widened in registers (bf16: a 16-bit left
//!   shift; f16: `vcvtph2ps`), products are accumulated with FMA in f32 and each output is
//!   rounded once to the dtype. N is split over the caller's rayon pool when the weights
//!   are large enough ([`MV_PAR_BYTES`]).
//! * [`panels`]: any M with 16-bit operands: B is widened `PANEL_N` columns at a time into
//!   a reused per-thread f32 buffer and multiplied by `gemm` (A in blocks of `PANEL_M`
//!   rows), so the conversion is amortized over the rows and no K×N f32 copy exists.
//!
//! Semantics are those of widening both operands exactly to f32, multiplying in f32 and
//! rounding the result once: every product term is formed (no term is skipped for a zero
//! operand), so NaN and Inf reach exactly the outputs whose f32 dot products have them
//! (NaN in `x[m, k]` makes row m NaN, `Inf · 0` is NaN). Sums are accumulated in another
//! order than gemm's, so values may differ from gemm's by f32 round-off. No `vdpbf16ps`
//! (it flushes denormals).

use super::gemm_calls::{gemm_uninit_ptr, View, GEMM_PAR_FLOPS};
use super::KResult;
use half::{bf16, f16};
use rayon::prelude::*;
use std::cell::RefCell;

/// Products with at most this many rows (after folding batch into M) and Bᵀ rows
/// contiguous take [`small_m`]; above it f32 goes to gemm and 16-bit types to [`panels`].
/// Measured (1024×3072, Sapphire Rapids, 1 and 2 threads): gemm packing a transposed B
/// costs ~2 ms, so [`small_m`] is faster up to M = 32 at least (f32 M=32: 2.5 vs 3.4 ms;
/// M=512: 49 vs 18 ms).
pub(crate) const MV_MAX_M_ROWS: usize = 32;
/// The same bound for B rows contiguous (`[K, N]`, the axpy kernel), which gemm packs
/// cheaply.
pub(crate) const MV_MAX_M_COLS: usize = 8;

/// The largest M that [`small_m`] takes for B in layout `lay`.
pub(crate) fn max_m(lay: Layout) -> usize {
    match lay {
        Layout::Rows => MV_MAX_M_ROWS,
        Layout::Cols => MV_MAX_M_COLS,
    }
}

/// [`small_m`] splits N over the rayon threads from this many bytes of B (~15 µs of
/// streaming at one core), or from [`GEMM_PAR_FLOPS`] multiply-adds. A matrix·vector
/// product is memory-bound: about 1 multiply-add per 2-4 bytes, so far fewer flops than
/// gemm's bound already pay for waking a worker.
pub(crate) const MV_PAR_BYTES: usize = 1 << 18;

/// Columns of B widened per panel in [`panels`], and rows of A per block.
const PANEL_N: usize = 256;
const PANEL_M: usize = 256;

/// Output columns per block of the `[K, N]` kernel (its f32 partial sums stay in L1).
const COL_BLOCK: usize = 1024;
/// Rows of x per pass of the `[K, N]` kernel.
const COL_ROWS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    F32,
    BF16,
    F16,
}

/// An element type of [`small_m`] / [`panels`]: exact widening to f32, rounding back.
pub(crate) trait MvElem: Copy + Send + Sync + 'static {
    const KIND: Kind;
    fn widen(self) -> f32;
    fn narrow(v: f32) -> Self;
}
impl MvElem for f32 {
    const KIND: Kind = Kind::F32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(v: f32) -> f32 {
        v
    }
}
impl MvElem for bf16 {
    const KIND: Kind = Kind::BF16;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn narrow(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}
impl MvElem for f16 {
    const KIND: Kind = Kind::F16;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

/// How B (`k × n`, element (t, j) at `off + t*rs + j*cs`) lies in memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Layout {
    /// Bᵀ rows contiguous: row j of Bᵀ (length k) starts at `off + j*cs`.
    Rows,
    /// B rows contiguous: row t (length n) starts at `off + t*rs`.
    Cols,
}

/// The layout [`small_m`] can read `b` in, if any.
pub(crate) fn layout<T>(b: &View<T>, k: usize, n: usize) -> Option<Layout> {
    if b.rs == 1 || k == 1 {
        Some(Layout::Rows)
    } else if b.cs == 1 || n == 1 {
        Some(Layout::Cols)
    } else {
        None
    }
}

/// The vector ISA the kernels run with (checked once).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Simd {
    Avx512,
    Avx2,
    Plain,
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Simd {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    if avx2 && has!("avx512f") {
        Simd::Avx512
    } else if avx2 {
        Simd::Avx2
    } else {
        Simd::Plain
    }
}
#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Simd {
    Simd::Plain
}

/// Tests pin a narrower ISA here (0: none) to check every copy of the kernels.
#[cfg(test)]
pub(crate) static FORCE_SIMD: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

pub(crate) fn simd() -> Simd {
    static S: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    let s = *S.get_or_init(detect);
    #[cfg(test)]
    {
        match FORCE_SIMD.load(std::sync::atomic::Ordering::Relaxed) {
            1 if s == Simd::Avx512 => return Simd::Avx512,
            2 if s != Simd::Plain => return Simd::Avx2,
            3 => return Simd::Plain,
            _ => {}
        }
    }
    s
}

/// A raw pointer that rayon tasks may share (each writes a disjoint part; also
/// `shape::concat_copy`'s).
#[derive(Clone, Copy)]
pub(crate) struct Ptr<T>(pub(crate) *mut T);
// SAFETY: only used for disjoint writes by the tasks of one call, which outlives them.
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}
impl<T> Ptr<T> {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
#[derive(Clone, Copy)]
struct CPtr<T>(*const T);
// SAFETY: read-only data that outlives the tasks.
unsafe impl<T> Send for CPtr<T> {}
unsafe impl<T> Sync for CPtr<T> {}
impl<T> CPtr<T> {
    fn get(self) -> *const T {
        self.0
    }
}

// ---------------------------------------------------------------------------------------
// Kernels. Each ISA module has `rows`, `cols` and `widen` with the same contracts:
//
// `rows(m, x, xrs, k, w, wcs, n0, n1, out, ors)`: for i < m, j in n0..n1,
//   `out[i*ors + j] = narrow(Σ_t x[i*xrs + t] * widen(w[j*wcs + t]))`.
// `cols(m, x, xrs, k, w, wrs, n0, n1, out, ors)`: same outputs with B's element (t, j)
//   at `w[t*wrs + j]`.
// `widen(src, dst, len)`: `dst[i] = widen(src[i])`.
//
// Safety (all): the pointers are valid for those reads and writes.
// ---------------------------------------------------------------------------------------

/// The ISA-generic bodies, instantiated inside each SIMD module, which defines `V` and
/// the `#[target_feature]` helpers `zero fma ldx stx set1 hsum ld_bf16 ld_f16`.
#[cfg(target_arch = "x86_64")]
macro_rules! mv_kernels {
    ($feat:literal, $lanes:expr, $mr:expr) => {
        use super::{Kind, MvElem, COL_BLOCK, COL_ROWS};

        const L: usize = $lanes;
        /// x rows per register block of `rows`.
        const MR: usize = $mr;
        /// Bᵀ rows per register block of `rows`.
        const NR: usize = 4;

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn load<W: MvElem>(p: *const W) -> V {
            match W::KIND {
                Kind::F32 => ldx(p.cast()),
                Kind::BF16 => ld_bf16(p.cast()),
                Kind::F16 => ld_f16(p.cast()),
            }
        }

        /// `out[i*ors + r] = x[i, :] · w[r, :]` for i < R, r < C: R×C accumulators.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::needless_range_loop)]
        unsafe fn group<W: MvElem, O: MvElem, const R: usize, const C: usize>(
            x: *const f32,
            xrs: usize,
            k: usize,
            w: *const W,
            wcs: usize,
            out: *mut O,
            ors: usize,
        ) {
            let kv = k - k % L;
            let mut acc = [[zero(); C]; R];
            let mut t = 0;
            while t < kv {
                let mut b = [zero(); C];
                for r in 0..C {
                    let p = w.add(r * wcs + t);
                    b[r] = load(p);
                    // The next block's rows at the same offset (a hint: never faults).
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(C * wcs).cast(),
                    );
                }
                for i in 0..R {
                    let a = ldx(x.add(i * xrs + t));
                    for r in 0..C {
                        acc[i][r] = fma(a, b[r], acc[i][r]);
                    }
                }
                t += L;
            }
            for i in 0..R {
                for r in 0..C {
                    let mut s = hsum(acc[i][r]);
                    for tt in kv..k {
                        s = (*x.add(i * xrs + tt)).mul_add((*w.add(r * wcs + tt)).widen(), s);
                    }
                    *out.add(i * ors + r) = O::narrow(s);
                }
            }
        }

        /// [`group`] for all m rows of x, in blocks of MR.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn mblocks<W: MvElem, O: MvElem, const C: usize>(
            m: usize,
            x: *const f32,
            xrs: usize,
            k: usize,
            w: *const W,
            wcs: usize,
            out: *mut O,
            ors: usize,
        ) {
            let mut i = 0;
            while i + MR <= m {
                group::<W, O, MR, C>(x.add(i * xrs), xrs, k, w, wcs, out.add(i * ors), ors);
                i += MR;
            }
            let (x, out) = (x.add(i * xrs), out.add(i * ors));
            match m - i {
                1 => group::<W, O, 1, C>(x, xrs, k, w, wcs, out, ors),
                2 => group::<W, O, 2, C>(x, xrs, k, w, wcs, out, ors),
                3 => group::<W, O, 3, C>(x, xrs, k, w, wcs, out, ors),
                _ => {}
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn rows<W: MvElem, O: MvElem>(
            m: usize,
            x: *const f32,
            xrs: usize,
            k: usize,
            w: *const W,
            wcs: usize,
            n0: usize,
            n1: usize,
            out: *mut O,
            ors: usize,
        ) {
            let mut j = n0;
            while j + NR <= n1 {
                mblocks::<W, O, NR>(m, x, xrs, k, w.add(j * wcs), wcs, out.add(j), ors);
                j += NR;
            }
            while j < n1 {
                mblocks::<W, O, 1>(m, x, xrs, k, w.add(j * wcs), wcs, out.add(j), ors);
                j += 1;
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
        pub(super) unsafe fn cols<W: MvElem, O: MvElem>(
            m: usize,
            x: *const f32,
            xrs: usize,
            k: usize,
            w: *const W,
            wrs: usize,
            n0: usize,
            n1: usize,
            out: *mut O,
            ors: usize,
        ) {
            let mut acc = [0f32; COL_ROWS * COL_BLOCK];
            let accp = acc.as_mut_ptr();
            let mut c0 = n0;
            while c0 < n1 {
                let cw = COL_BLOCK.min(n1 - c0);
                let cv = cw - cw % L;
                let mut i0 = 0;
                while i0 < m {
                    let mr = COL_ROWS.min(m - i0);
                    for i in 0..mr {
                        std::slice::from_raw_parts_mut(accp.add(i * COL_BLOCK), cw).fill(0.0);
                    }
                    let xi = x.add(i0 * xrs);
                    // Four rows of B per pass over the partial sums (each output still
                    // sums its terms in order of t).
                    let k4 = k - k % 4;
                    let mut t = 0;
                    while t < k4 {
                        let w0 = w.add(t * wrs + c0);
                        let (w1, w2, w3) = (w0.add(wrs), w0.add(2 * wrs), w0.add(3 * wrs));
                        let mut c = 0;
                        while c < cv {
                            let (b0, b1, b2, b3) = (
                                load(w0.add(c)),
                                load(w1.add(c)),
                                load(w2.add(c)),
                                load(w3.add(c)),
                            );
                            for i in 0..mr {
                                let xt = xi.add(i * xrs + t);
                                let p = accp.add(i * COL_BLOCK + c);
                                let mut a = ldx(p);
                                a = fma(set1(*xt), b0, a);
                                a = fma(set1(*xt.add(1)), b1, a);
                                a = fma(set1(*xt.add(2)), b2, a);
                                a = fma(set1(*xt.add(3)), b3, a);
                                stx(p, a);
                            }
                            c += L;
                        }
                        for c in cv..cw {
                            for i in 0..mr {
                                let xt = xi.add(i * xrs + t);
                                let p = accp.add(i * COL_BLOCK + c);
                                let mut a = *p;
                                a = (*xt).mul_add((*w0.add(c)).widen(), a);
                                a = (*xt.add(1)).mul_add((*w1.add(c)).widen(), a);
                                a = (*xt.add(2)).mul_add((*w2.add(c)).widen(), a);
                                a = (*xt.add(3)).mul_add((*w3.add(c)).widen(), a);
                                *p = a;
                            }
                        }
                        t += 4;
                    }
                    for t in k4..k {
                        let wr = w.add(t * wrs + c0);
                        let mut xs = [zero(); COL_ROWS];
                        for i in 0..mr {
                            xs[i] = set1(*xi.add(i * xrs + t));
                        }
                        let mut c = 0;
                        while c < cv {
                            let b = load(wr.add(c));
                            for i in 0..mr {
                                let p = accp.add(i * COL_BLOCK + c);
                                stx(p, fma(xs[i], b, ldx(p)));
                            }
                            c += L;
                        }
                        for c in cv..cw {
                            let b = (*wr.add(c)).widen();
                            for i in 0..mr {
                                let p = accp.add(i * COL_BLOCK + c);
                                *p = (*xi.add(i * xrs + t)).mul_add(b, *p);
                            }
                        }
                    }
                    for i in 0..mr {
                        let o = out.add((i0 + i) * ors + c0);
                        for c in 0..cw {
                            *o.add(c) = O::narrow(*accp.add(i * COL_BLOCK + c));
                        }
                    }
                    i0 += mr;
                }
                c0 += cw;
            }
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn widen<W: MvElem>(src: *const W, dst: *mut f32, len: usize) {
            let mut i = 0;
            while i + L <= len {
                stx(dst.add(i), load(src.add(i)));
                i += L;
            }
            while i < len {
                *dst.add(i) = (*src.add(i)).widen();
                i += 1;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    type V = __m512;

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> V {
        _mm512_setzero_ps()
    }
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        _mm512_fmadd_ps(a, b, c)
    }
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn ldx(p: *const f32) -> V {
        _mm512_loadu_ps(p)
    }
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn stx(p: *mut f32, v: V) {
        _mm512_storeu_ps(p, v)
    }
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn set1(v: f32) -> V {
        _mm512_set1_ps(v)
    }
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum(v: V) -> f32 {
        _mm512_reduce_add_ps(v)
    }
    /// 16 bf16 → f32: zero-extend to 32 bits, shift into the high half (exact).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_bf16(p: *const u16) -> V {
        let h = _mm256_loadu_si256(p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    /// 16 f16 → f32 (`vcvtph2ps`, exact, denormals included).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_f16(p: *const u16) -> V {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }

    mv_kernels!("avx512f,avx2,fma,f16c", 16, 4);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    type V = __m256;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> V {
        _mm256_setzero_ps()
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        _mm256_fmadd_ps(a, b, c)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn ldx(p: *const f32) -> V {
        _mm256_loadu_ps(p)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn stx(p: *mut f32, v: V) {
        _mm256_storeu_ps(p, v)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn set1(v: f32) -> V {
        _mm256_set1_ps(v)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum(v: V) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
    /// 8 bf16 → f32: zero-extend to 32 bits, shift into the high half (exact).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_bf16(p: *const u16) -> V {
        let h = _mm_loadu_si128(p.cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
    /// 8 f16 → f32 (F16C `vcvtph2ps`, exact).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_f16(p: *const u16) -> V {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    // 16 registers: 2 x rows × 4 Bᵀ rows of accumulators + 4 loaded rows + x.
    mv_kernels!("avx2,fma,f16c", 8, 2);
}

/// The portable copies (no FMA: a separate multiply and add, both rounded to f32).
mod plain {
    use super::{MvElem, COL_BLOCK};

    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows<W: MvElem, O: MvElem>(
        m: usize,
        x: *const f32,
        xrs: usize,
        k: usize,
        w: *const W,
        wcs: usize,
        n0: usize,
        n1: usize,
        out: *mut O,
        ors: usize,
    ) {
        for j in n0..n1 {
            let wj = std::slice::from_raw_parts(w.add(j * wcs), k);
            for i in 0..m {
                let xi = std::slice::from_raw_parts(x.add(i * xrs), k);
                // Four partial sums (over t mod 4) let the loop pipeline.
                let mut s = [0f32; 4];
                let mut t = 0;
                while t + 4 <= k {
                    for l in 0..4 {
                        s[l] += xi[t + l] * wj[t + l].widen();
                    }
                    t += 4;
                }
                while t < k {
                    s[0] += xi[t] * wj[t].widen();
                    t += 1;
                }
                *out.add(i * ors + j) = O::narrow((s[0] + s[1]) + (s[2] + s[3]));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn cols<W: MvElem, O: MvElem>(
        m: usize,
        x: *const f32,
        xrs: usize,
        k: usize,
        w: *const W,
        wrs: usize,
        n0: usize,
        n1: usize,
        out: *mut O,
        ors: usize,
    ) {
        let mut acc = vec![0f32; COL_BLOCK];
        let mut c0 = n0;
        while c0 < n1 {
            let cw = COL_BLOCK.min(n1 - c0);
            for i in 0..m {
                let acc = &mut acc[..cw];
                acc.fill(0.0);
                for t in 0..k {
                    let a = *x.add(i * xrs + t);
                    let wr = std::slice::from_raw_parts(w.add(t * wrs + c0), cw);
                    for (s, &b) in acc.iter_mut().zip(wr) {
                        *s += a * b.widen();
                    }
                }
                for (c, &s) in acc.iter().enumerate() {
                    *out.add(i * ors + c0 + c) = O::narrow(s);
                }
            }
            c0 += cw;
        }
    }

    pub(super) unsafe fn widen<W: MvElem>(src: *const W, dst: *mut f32, len: usize) {
        for i in 0..len {
            *dst.add(i) = (*src.add(i)).widen();
        }
    }
}

/// `rows` / `cols` of the given ISA.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<W: MvElem, O: MvElem>(
    isa: Simd,
    lay: Layout,
    m: usize,
    x: *const f32,
    xrs: usize,
    k: usize,
    w: *const W,
    ws: usize,
    n0: usize,
    n1: usize,
    out: *mut O,
    ors: usize,
) {
    // SAFETY (the SIMD arms): `isa` is at most what `simd()` detected.
    match (isa, lay) {
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, Layout::Rows) => avx512::rows(m, x, xrs, k, w, ws, n0, n1, out, ors),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, Layout::Cols) => avx512::cols(m, x, xrs, k, w, ws, n0, n1, out, ors),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2, Layout::Rows) => avx2::rows(m, x, xrs, k, w, ws, n0, n1, out, ors),
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2, Layout::Cols) => avx2::cols(m, x, xrs, k, w, ws, n0, n1, out, ors),
        (_, Layout::Rows) => plain::rows(m, x, xrs, k, w, ws, n0, n1, out, ors),
        (_, Layout::Cols) => plain::cols(m, x, xrs, k, w, ws, n0, n1, out, ors),
    }
}

/// `dst[..len] = widen(src[..len])`.
unsafe fn widen_run<W: MvElem>(isa: Simd, src: *const W, dst: *mut f32, len: usize) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => avx512::widen(src, dst, len),
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => avx2::widen(src, dst, len),
        _ => plain::widen(src, dst, len),
    }
}

/// The rows of `a` (`m × k`) as f32 with their row stride: `a` itself when it is f32 with
/// contiguous rows, else a widened copy (`m*k` values; `m` is small here or a block).
fn rows_f32<'a, T: MvElem>(
    isa: Simd,
    m: usize,
    k: usize,
    a: &View<'a, T>,
    buf: &'a mut Vec<f32>,
) -> (*const f32, usize) {
    if T::KIND == Kind::F32 && (a.cs == 1 || k == 1) {
        // SAFETY: T is f32 (KIND), the same type.
        return (unsafe { a.data.as_ptr().add(a.off).cast::<f32>() }, a.rs);
    }
    buf.clear();
    buf.reserve(m * k);
    let p = buf.spare_capacity_mut().as_mut_ptr().cast::<f32>();
    for i in 0..m {
        let row = a.off + i * a.rs;
        if a.cs == 1 || k == 1 {
            // SAFETY: the caller checked that a's m×k elements lie in `a.data`; p has m*k.
            unsafe { widen_run(isa, a.data.as_ptr().add(row), p.add(i * k), k) };
        } else {
            for t in 0..k {
                // SAFETY: as above.
                unsafe { *p.add(i * k + t) = a.data[row + t * a.cs].widen() };
            }
        }
    }
    // SAFETY: all m*k written above.
    unsafe { buf.set_len(m * k) };
    (buf.as_ptr(), k)
}

/// `dst (m×n, row-major) = a (m×k) · b (k×n)` for small m, b in layout `lay`
/// ([`layout`]). The operand views must fit their data (the caller checks).
///
/// # Safety
/// `dst` valid for writes of `m*n` elements, not aliasing `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn small_m<T: MvElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    lay: Layout,
    dst: *mut T,
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let isa = simd();
    let mut buf = Vec::new();
    let (x, xrs) = rows_f32(isa, m, k, &a, &mut buf);
    let w = b.data.as_ptr().add(b.off);
    let ws = match lay {
        Layout::Rows => b.cs,
        Layout::Cols => b.rs,
    };
    let threads = rayon::current_num_threads();
    let bytes = k * n * std::mem::size_of::<T>();
    let split = parallel && threads > 1 && (bytes >= MV_PAR_BYTES || m * n * k >= GEMM_PAR_FLOPS);
    // Chunks of whole register blocks; two per thread so a slow thread sheds work.
    let align = match lay {
        Layout::Rows => 4,
        Layout::Cols => 16,
    };
    let tasks = if split { 2 * threads } else { 1 };
    let chunk = n.div_ceil(tasks).next_multiple_of(align).max(align);
    let tasks = n.div_ceil(chunk);
    let (xp, wp, op) = (CPtr(x), CPtr(w), Ptr(dst));
    let run = move |c: usize| {
        let (n0, n1) = (c * chunk, ((c + 1) * chunk).min(n));
        // SAFETY: the caller's contract; tasks write disjoint column ranges.
        unsafe {
            kernel(
                isa,
                lay,
                m,
                xp.get(),
                xrs,
                k,
                wp.get(),
                ws,
                n0,
                n1,
                op.get(),
                n,
            )
        };
    };
    if tasks <= 1 {
        run(0);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

thread_local! {
    /// Per-thread f32 buffers of [`panels`]: the widened B panel and the output tile.
    static PANEL: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `dst (m×n, row-major) = a (m×k) · b (k×n)` for 16-bit (or f32) operands of any shape:
/// A widened `PANEL_M` rows at a time, B `PANEL_N` columns at a time into a per-thread f32
/// buffer, each panel product by gemm into a per-thread f32 tile, rounded into `dst`.
/// The operand views must fit their data (the caller checks).
///
/// # Safety
/// `dst` valid for writes of `m*n` elements, not aliasing `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panels<T: MvElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    dst: *mut T,
    parallel: bool,
) -> KResult<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let isa = simd();
    let threads = rayon::current_num_threads();
    let npan = n.div_ceil(PANEL_N);
    let mut abuf = Vec::new();
    let op = Ptr(dst);
    for i0 in (0..m).step_by(PANEL_M) {
        let mc = PANEL_M.min(m - i0);
        let ai = View {
            off: a.off + i0 * a.rs,
            ..a
        };
        let (x, xrs) = rows_f32(isa, mc, k, &ai, &mut abuf);
        let xs = std::slice::from_raw_parts(x, if mc == 0 { 0 } else { (mc - 1) * xrs + k });
        let av = View {
            data: xs,
            off: 0,
            rs: xrs,
            cs: 1,
        };
        let big = parallel && threads > 1 && mc * n * k >= GEMM_PAR_FLOPS;
        // Enough panels: one task each; else gemm splits each panel's product.
        let split = big && npan >= 2 * threads;
        let gemm_par = big && !split;
        let one = |p: usize| -> KResult<()> {
            let j0 = p * PANEL_N;
            let nc = PANEL_N.min(n - j0);
            let mut fresh = (Vec::new(), Vec::new());
            PANEL.with(|cell| {
                let mut held = cell.try_borrow_mut();
                let (pb, tile) = match held.as_mut() {
                    Ok(g) => {
                        let g = &mut **g;
                        (&mut g.0, &mut g.1)
                    }
                    Err(_) => (&mut fresh.0, &mut fresh.1),
                };
                pb.clear();
                pb.reserve(k * nc);
                let pp = pb.spare_capacity_mut().as_mut_ptr().cast::<f32>();
                let src = b.data.as_ptr().add(b.off + j0 * b.cs);
                // The panel is laid out like b: Bᵀ rows (k long) or B rows (nc long).
                let (prs, pcs) = if b.rs == 1 || k == 1 {
                    for c in 0..nc {
                        widen_run(isa, src.add(c * b.cs), pp.add(c * k), k);
                    }
                    (1, k)
                } else if b.cs == 1 {
                    for t in 0..k {
                        widen_run(isa, src.add(t * b.rs), pp.add(t * nc), nc);
                    }
                    (nc, 1)
                } else {
                    for t in 0..k {
                        for c in 0..nc {
                            *pp.add(t * nc + c) = (*src.add(t * b.rs + c * b.cs)).widen();
                        }
                    }
                    (nc, 1)
                };
                pb.set_len(k * nc);
                let bv = View {
                    data: &pb[..],
                    off: 0,
                    rs: prs,
                    cs: pcs,
                };
                let out = op.get().add(i0 * n + j0);
                if T::KIND == Kind::F32 {
                    // f32: straight into dst.
                    return gemm_uninit_ptr(
                        mc,
                        nc,
                        k,
                        av,
                        bv,
                        out.cast::<f32>(),
                        (n, 1),
                        gemm_par,
                        false,
                    );
                }
                tile.clear();
                tile.reserve(mc * nc);
                let tp = tile.spare_capacity_mut().as_mut_ptr().cast::<f32>();
                gemm_uninit_ptr(mc, nc, k, av, bv, tp, (nc, 1), gemm_par, false)?;
                for i in 0..mc {
                    for c in 0..nc {
                        *out.add(i * n + c) = T::narrow(*tp.add(i * nc + c));
                    }
                }
                Ok(())
            })
        };
        if split {
            (0..npan).into_par_iter().try_for_each(one)?;
        } else {
            (0..npan).try_for_each(one)?;
        }
    }
    Ok(())
}
