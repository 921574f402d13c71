//! ONNX Conv (NC + 1..=3 spatial dims, groups, dilations, pads, optional bias) as
//! im2col + gemm. A 1×…×1 kernel with stride 1 and no padding is a plain gemm on the input.

use super::matmul::{gemm_uninit_ptr, GemmElem, View, GEMM_PAR_FLOPS};
use super::wide::map_inplace;
use super::winograd::{self, WinogradWeights};
use super::{fill_chunks, invalid, make, out_dims, values_as, Elem, KResult};
use half::{bf16, f16};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

struct Geo {
    n: usize,
    c: usize,
    m: usize,
    groups: usize,
    sp: Vec<usize>,
    ks: Vec<usize>,
    osp: Vec<usize>,
    strides: Vec<usize>,
    pads: Vec<(usize, usize)>,
    dil: Vec<usize>,
}

impl Geo {
    /// Every kernel dim 1, stride 1, no padding: the conv is a product of the weights and
    /// the input planes as they are (no im2col).
    fn direct(&self) -> bool {
        self.ks.iter().all(|&k| k == 1)
            && self.strides.iter().all(|&s| s == 1)
            && self.pads.iter().all(|&p| p == (0, 0))
    }

    /// 2-D with one filter per channel (groups == C == M > 1).
    fn depthwise_2d(&self) -> bool {
        self.sp.len() == 2 && self.groups == self.c && self.m == self.c && self.groups > 1
    }
}

fn geometry(x: &[usize], w: &[usize], a: &ConvAttrs, od: &[usize]) -> KResult<Geo> {
    if x.len() < 3 || w.len() != x.len() || od.len() != x.len() {
        return invalid(format!(
            "conv: x {x:?}, w {w:?}, out {od:?} ranks do not fit NC*spatial"
        ));
    }
    let nd = x.len() - 2;
    let g = a.groups.max(1);
    let (n, c, m) = (x[0], x[1], w[0]);
    if c % g != 0 || m % g != 0 || w[1] != c / g {
        return invalid(format!(
            "conv: x {x:?} and w {w:?} do not fit groups={g} (w[1] must be C/groups)"
        ));
    }
    let get = |v: &Vec<usize>, d: usize| if v.is_empty() { vec![d; nd] } else { v.clone() };
    let strides = get(&a.strides, 1);
    let dil = get(&a.dilations, 1);
    let pads = if a.pads.is_empty() {
        vec![(0, 0); nd]
    } else {
        a.pads.clone()
    };
    if strides.len() != nd || dil.len() != nd || pads.len() != nd {
        return invalid("conv: strides/dilations/pads need one entry per spatial axis");
    }
    let sp = x[2..].to_vec();
    let ks = w[2..].to_vec();
    let mut osp = vec![];
    for i in 0..nd {
        let span = dil[i] * (ks[i].max(1) - 1) + 1;
        let padded = sp[i] + pads[i].0 + pads[i].1;
        let o = if padded >= span && strides[i] > 0 {
            (padded - span) / strides[i] + 1
        } else {
            0
        };
        osp.push(o);
    }
    if od[0] != n || od[1] != m || od[2..] != osp[..] {
        return invalid(format!(
            "conv: computed output [{n}, {m}, {osp:?}] but the node declares {od:?}"
        ));
    }
    Ok(Geo {
        n,
        c,
        m,
        groups: g,
        sp,
        ks,
        osp,
        strides,
        pads,
        dil,
    })
}

thread_local! {
    /// im2col's column matrix (and Winograd's transformed input), kept between calls on
    /// each thread (8-byte words, viewed as f32 or f64): no allocation, page faults or
    /// zeroing per conv.
    static COL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// A second such buffer, for Winograd's 16 products while COL holds its input.
    pub(super) static PRODUCTS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// A third, for [`im2col_2d`]'s column phases of a strided conv's input rows.
    static PHASES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Scratch buffers above this many bytes are allocated per call instead of kept.
const COL_KEEP_MAX: usize = 64 << 20;

/// Runs `f` on a buffer of `len` elements whose contents are unspecified (left over from
/// earlier calls, but always initialized): the caller overwrites what it reads.
fn with_col<T: GemmElem, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    with_scratch(&COL, len, f)
}

/// [`with_col`] on the thread-local buffer `key`.
pub(super) fn with_scratch<T: GemmElem, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<u64>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let bytes = len * std::mem::size_of::<T>();
    if bytes > COL_KEEP_MAX {
        return f(&mut vec![T::ZERO; len]);
    }
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut buf) => {
            let words = bytes.div_ceil(8);
            if buf.len() < words {
                buf.resize(words, 0);
            }
            // SAFETY: GemmElem is implemented only for f32 and f64: every bit pattern is
            // a valid value, their alignment (4 or 8) divides u64's, and `words` u64s
            // hold `len` of them.
            let s = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<T>(), len) };
            f(s)
        }
        Err(_) => f(&mut vec![T::ZERO; len]),
    })
}

/// 2-D [`im2col`] of output rows `oy0..oy1` only: `col` is `[cg*KH*KW, (oy1-oy0)*OW]`. Per
/// (channel, ky, kx) row, each output row `oy` copies the valid span of input row
/// `oy*sh + ky*dh - pt` (stride `sw`, dilation `dw`) and zero-fills the rest. With a column
/// stride `sw > 1` the input rows those output rows read are first split into their `sw`
/// column phases (phase `q` holds columns `q, q + sw, …`), so every span is a contiguous
/// copy.
fn im2col_2d<T: GemmElem>(x: &[T], g: &Geo, col: &mut [T], (oy0, oy1): (usize, usize)) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let dh = g.dil[0];
    let pt = g.pads[0].0;
    let p = (oy1 - oy0) * g.osp[1];
    if p == 0 {
        return;
    }
    let nch = col.len() / (p * kh * kw);
    // Input rows [r0, r1) are the ones these output rows read.
    let r0 = (oy0 * sh).saturating_sub(pt).min(h);
    let r1 = ((oy1 - 1) * sh + (kh - 1) * dh + 1)
        .saturating_sub(pt)
        .min(h)
        .max(r0);
    let nr = r1 - r0;
    if sw == 1 {
        return im2col_rows(x, g, col, (oy0, oy1), (r0, nr), &[]);
    }
    // Phase-split rows: row r0 + y of channel c at [(c*nr + y)*w, +w), phase q first at
    // offset q*(w/sw) + min(q, w%sw), holding ceil((w - q)/sw) columns.
    with_scratch(&PHASES, nch * nr * w, |phased: &mut [T]| {
        let rows_in = (0..nch).flat_map(|c| x[(c * h + r0) * w..(c * h + r1) * w].chunks_exact(w));
        for (row, out) in rows_in.zip(phased.chunks_exact_mut(w)) {
            split_columns(row, sw, out);
        }
        im2col_rows(x, g, col, (oy0, oy1), (r0, nr), phased)
    })
}

/// Splits `row` (W values) into its `s` column phases, one after another in `out` (W
/// values): phase `q` holds columns `q, q + s, …` and starts at `q·(W/s) + min(q, W mod s)`.
pub(super) fn split_columns<T: Copy>(row: &[T], s: usize, out: &mut [T]) {
    let w = row.len();
    if s == 2 {
        // Even columns then odd ones, in one pass (vectorizes as a deinterleave).
        let (ev, od) = out.split_at_mut(w.div_ceil(2));
        for ((e, o), pair) in ev.iter_mut().zip(od.iter_mut()).zip(row.chunks_exact(2)) {
            *e = pair[0];
            *o = pair[1];
        }
        if w % 2 == 1 {
            ev[w / 2] = row[w - 1];
        }
    } else {
        let mut k = 0;
        for q in 0..s {
            for &v in row.iter().skip(q).step_by(s) {
                out[k] = v;
                k += 1;
            }
        }
    }
}

/// [`im2col_2d`]'s copy, from `x` (stride 1) or from `phased`, its input rows `r0..r0+nr`
/// split into column phases (stride > 1).
fn im2col_rows<T: GemmElem>(
    x: &[T],
    g: &Geo,
    col: &mut [T],
    (oy0, oy1): (usize, usize),
    (r0, nr): (usize, usize),
    phased: &[T],
) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let ow = g.osp[1];
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = (oy1 - oy0) * ow;
    let r1 = r0 + nr;
    let phase_off = |q: usize| q * (w / sw) + q.min(w % sw);
    fill_chunks(col, p, |row, dst| {
        let ch = row / (kh * kw);
        let ky = (row / kw) % kh;
        let kx = row % kw;
        let src = if sw > 1 {
            &phased[ch * nr * w..(ch + 1) * nr * w]
        } else {
            &x[(ch * h + r0) * w..(ch * h + r1) * w]
        };
        let off = kx * dw;
        let (lo, hi) = inside_cols(off, pl, sw, w, ow);
        // First valid input column, its phase and index within the phase.
        let c0 = lo * sw + off - pl.min(lo * sw + off);
        let (q, j0) = (c0 % sw, c0 / sw);
        for (oy, out_row) in (oy0..oy1).zip(dst.chunks_mut(ow)) {
            let iy = (oy * sh + ky * dh) as isize - pt as isize;
            if iy < 0 || iy as usize >= h || lo >= hi {
                out_row.fill(T::default());
                continue;
            }
            let y = iy as usize - r0;
            let srow = &src[y * w..(y + 1) * w];
            out_row[..lo].fill(T::default());
            out_row[hi..].fill(T::default());
            let s0 = phase_off(q) + j0;
            out_row[lo..hi].copy_from_slice(&srow[s0..s0 + (hi - lo)]);
        }
    });
}

/// Fill `col` ([cg*KS, P] row-major) from one group's input planes `x` ([cg, *sp]).
fn im2col<T: GemmElem>(x: &[T], g: &Geo, cg: usize, col: &mut [T]) {
    let nd = g.sp.len();
    if nd == 2 {
        return im2col_2d(x, g, col, (0, g.osp[0]));
    }
    let ksz: usize = g.ks.iter().product();
    let plane: usize = g.sp.iter().product();
    let p: usize = g.osp.iter().product();
    let last_o = g.osp[nd - 1];
    let sst = rlx_ir::strides_of(&g.sp);
    let kst = rlx_ir::strides_of(&g.ks);
    let _ = cg;
    fill_chunks(col, p, |row, dst| {
        let ch = row / ksz;
        let mut kk = row % ksz;
        let src = &x[ch * plane..(ch + 1) * plane];
        // kernel tap per axis
        let mut tap = vec![0usize; nd];
        for i in 0..nd {
            tap[i] = kk / kst[i];
            kk %= kst[i];
        }
        // input index on each axis for each output index (None outside)
        let maps: Vec<Vec<Option<usize>>> = (0..nd)
            .map(|i| {
                (0..g.osp[i])
                    .map(|o| {
                        let pos =
                            (o * g.strides[i] + tap[i] * g.dil[i]) as isize - g.pads[i].0 as isize;
                        if pos >= 0 && (pos as usize) < g.sp[i] {
                            Some(pos as usize)
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .collect();
        let lm = &maps[nd - 1];
        for (r, out_row) in dst.chunks_mut(last_o.max(1)).enumerate() {
            if last_o == 0 {
                break;
            }
            let mut rem = r;
            let mut base = Some(0usize);
            for i in (0..nd - 1).rev() {
                let o = rem % g.osp[i];
                rem /= g.osp[i];
                base = match (base, maps[i][o]) {
                    (Some(b), Some(q)) => Some(b + q * sst[i]),
                    _ => None,
                };
            }
            match base {
                None => out_row.fill(T::default()),
                Some(b) => {
                    for (d, m) in out_row.iter_mut().zip(lm) {
                        *d = match m {
                            Some(q) => src[b + q],
                            None => T::default(),
                        };
                    }
                }
            }
        }
    });
}

/// Depthwise 2-D conv (groups == C == M, one filter per channel) computed directly: per
/// output plane, each kernel tap adds `w * x` over the span of output columns whose input
/// column is inside the image (the same span arithmetic as [`im2col_2d`]). No im2col buffer,
/// no per-channel 1-row gemm.
fn depthwise_2d<T: GemmElem + Elem + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geo,
) -> Vec<T> {
    let (h, wd) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = oh * ow;
    let mut out = crate::buffers::filled(g.n * g.m * p, T::ZERO);
    if p == 0 {
        return out;
    }
    fill_chunks(&mut out, p, |plane, dst| {
        let c = plane % g.m;
        let src = &x[plane * h * wd..(plane + 1) * h * wd];
        let b = bias.map_or(T::ZERO, |b| b[c]);
        dst.fill(b);
        for ky in 0..kh {
            for kx in 0..kw {
                let wv = w[(c * kh + ky) * kw + kx];
                let off = kx * dw;
                let (lo, hi) = inside_cols(off, pl, sw, wd, ow);
                for (oy, orow) in dst.chunks_mut(ow).enumerate() {
                    let iy = (oy * sh + ky * dh) as isize - pt as isize;
                    if iy < 0 || iy as usize >= h {
                        continue;
                    }
                    let srow = &src[iy as usize * wd..(iy as usize + 1) * wd];
                    if sw == 1 {
                        let ix0 = lo + off - pl;
                        for (o, &xv) in orow[lo..hi].iter_mut().zip(&srow[ix0..ix0 + (hi - lo)]) {
                            *o = *o + wv * xv;
                        }
                    } else {
                        for (j, o) in orow[lo..hi].iter_mut().enumerate() {
                            *o = *o + wv * srow[(j + lo) * sw + off - pl];
                        }
                    }
                }
            }
        }
    });
    out
}

/// f32 depthwise 2-D conv with SIMD (x86-64: AVX-512F, else AVX2+FMA; picked at run time),
/// for 3×3, 5×5 and 7×7 kernels (any stride, dilation, pads). Per output row and chunk of
/// `N` output columns, all kernel taps accumulate in one register (bias first, then taps in
/// (ky, kx) order, each a fused multiply-add) and the chunk is stored once: one write pass
/// over the output instead of one read-modify-write pass per tap. Taps whose input column
/// is outside the image are masked off per lane (the accumulator keeps its value), rows
/// outside the image are skipped: the same terms as the generic path, so NaN/Inf propagate
/// the same way. For column stride `s > 1` each input plane is first split into `s` phase
/// planes (`x[iy][j*s + r]` at phase `r`), so every tap reads contiguous columns.
/// `None` where no SIMD path applies (other kernel sizes, no AVX2): the caller falls back
/// to the generic [`depthwise_2d`].
/// Every weight must be finite (`conv_post` sends other convs to im2col).
/// `post` runs on each output plane right after it is computed (while it is in cache).
/// `clamp` is applied to each output value in registers before it is stored, then `post`
/// runs on each plane. With `seen`, the largest |y| bits before the clamp (as
/// [`super::wide::max_abs_bits`] gives them) are folded into it.
fn depthwise_2d_f32(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    g: &Geo,
    post: Post,
    clamp: Clamp,
    seen: Option<&AtomicU32>,
) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        dw_simd::run(x, w, bias, g, post, clamp, seen)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, bias, g, post, clamp, seen);
        None
    }
}

/// A fused activation that a conv kernel applies to each output value in registers, before
/// its store, in place of a [`Post`] pass: `v ↦ minps(hi, maxps(lo, v))`. With x86's
/// `maxps`/`minps` operand rules that keeps a NaN `v` and a `v` equal to a bound, so it is
/// ONNX Relu for `(0, +inf)` (`if v < 0 {0} else {v}`: -0 stays -0, a NaN keeps its bits),
/// Clip for `(lo, hi)` with `nan_out` (RLX's Max/Min give the canonical `f32::NAN` for a
/// NaN operand), and the identity for `(-inf, +inf)` ([`Clamp::NONE`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Clamp {
    pub lo: f32,
    pub hi: f32,
    /// A NaN `v` becomes `f32::NAN` (else it is kept as it is).
    pub nan_out: bool,
    /// The kernel also takes the largest |v| bits before the clamp (for the NaN scan; set
    /// by the kernel's driver when it is given somewhere to put them).
    pub track: bool,
}

impl Clamp {
    /// The identity.
    pub(crate) const NONE: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
        nan_out: false,
        track: false,
    };
    /// ONNX Relu.
    pub(crate) const RELU: Clamp = Clamp {
        lo: 0.0,
        hi: f32::INFINITY,
        nan_out: false,
        track: false,
    };
    /// ONNX Clip as RLX imports it (Max then Min).
    pub(crate) fn clip(lo: f32, hi: f32) -> Clamp {
        Clamp {
            lo,
            hi,
            nan_out: true,
            track: false,
        }
    }
}

/// An elementwise map run in place on output planes (a fused group's activation); it must
/// not depend on the element's position.
pub(crate) type Post<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

/// Shortest output plane that the depthwise conv hands to a [`Post`] on its own.
const POST_MIN_RUN: usize = 1024;

/// The [`Post`] that does nothing.
pub(crate) fn no_post(_: &mut [f32]) {}

#[cfg(target_arch = "x86_64")]
mod dw_simd {
    use super::{fill_chunks, inside_cols, Clamp, Geo, Post};
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// One SIMD width: `N` f32 lanes, a lane mask type `M`.
    pub(super) trait Lanes {
        const N: usize;
        type V: Copy;
        type M: Copy + Send + Sync;
        /// Lanes `l` with `a <= l < b`.
        fn range(a: usize, b: usize) -> Self::M;
        unsafe fn splat(v: f32) -> Self::V;
        unsafe fn load(p: *const f32) -> Self::V;
        /// Masked-off lanes read as 0 and are not accessed.
        unsafe fn load_m(p: *const f32, m: Self::M) -> Self::V;
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
        /// `w * x + acc` in one rounding.
        unsafe fn fma(w: Self::V, x: Self::V, acc: Self::V) -> Self::V;
        /// As [`Lanes::fma`] on the lanes of `m`; the other lanes keep `acc`.
        unsafe fn fma_m(w: Self::V, x: Self::V, acc: Self::V, m: Self::M) -> Self::V;
        unsafe fn store(p: *mut f32, v: Self::V);
        unsafe fn store_m(p: *mut f32, v: Self::V, m: Self::M);
        /// `Min(Max(v, lo), hi)` per lane as [`super::Clamp`] defines it (`maxps(lo, v)`
        /// then `minps(hi, ·)`: a NaN `v` comes through, a `v` equal to a bound is kept).
        unsafe fn clamp(v: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
        /// `f32::NAN` in the NaN lanes of `v`.
        unsafe fn nan_out(v: Self::V) -> Self::V;
        /// Per lane, the larger of `acc` and `v`'s bits with the sign cleared, as unsigned
        /// integers (`acc` holds bits, not a float; a NaN's bits are above +inf's).
        unsafe fn max_abs_bits(acc: Self::V, v: Self::V) -> Self::V;
        /// The largest lane of a [`Lanes::max_abs_bits`] accumulator.
        unsafe fn hmax_bits(acc: Self::V) -> u32;
        /// `v` with the lanes outside `m` set to 0.
        unsafe fn zero_off(v: Self::V, m: Self::M) -> Self::V;
        /// Transpose the first `N` rows of `N` lanes in registers: `r[i][j]` becomes
        /// `r[j][i]` for `i, j < N` (rows past `N` untouched).
        unsafe fn transpose(r: &mut [Self::V; 16]);
    }

    pub(super) struct Avx512;
    impl Lanes for Avx512 {
        const N: usize = 16;
        type V = __m512;
        type M = __mmask16;
        fn range(a: usize, b: usize) -> u16 {
            let upto = |n: usize| if n >= 16 { 0xffffu16 } else { (1u16 << n) - 1 };
            if b <= a {
                0
            } else {
                upto(b) & !upto(a)
            }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> __m512 {
            _mm512_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_m(p: *const f32, m: u16) -> __m512 {
            _mm512_maskz_loadu_ps(m, p)
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fma(w: __m512, x: __m512, acc: __m512) -> __m512 {
            _mm512_fmadd_ps(w, x, acc)
        }
        #[inline(always)]
        unsafe fn fma_m(w: __m512, x: __m512, acc: __m512, m: u16) -> __m512 {
            _mm512_mask3_fmadd_ps(w, x, acc, m)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn store_m(p: *mut f32, v: __m512, m: u16) {
            _mm512_mask_storeu_ps(p, m, v)
        }
        #[inline(always)]
        unsafe fn clamp(v: __m512, lo: __m512, hi: __m512) -> __m512 {
            _mm512_min_ps(hi, _mm512_max_ps(lo, v))
        }
        #[inline(always)]
        unsafe fn nan_out(v: __m512) -> __m512 {
            let m = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            _mm512_mask_blend_ps(m, v, _mm512_set1_ps(f32::NAN))
        }
        #[inline(always)]
        unsafe fn max_abs_bits(acc: __m512, v: __m512) -> __m512 {
            let abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fff_ffff));
            _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(acc), abs))
        }
        #[inline(always)]
        unsafe fn hmax_bits(acc: __m512) -> u32 {
            _mm512_reduce_max_epu32(_mm512_castps_si512(acc))
        }
        #[inline(always)]
        unsafe fn zero_off(v: __m512, m: u16) -> __m512 {
            _mm512_maskz_mov_ps(m, v)
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m512; 16]) {
            transpose16(r)
        }
    }

    /// [`Lanes::clamp`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
    #[inline(always)]
    unsafe fn clamp_256(v: __m256, lo: __m256, hi: __m256) -> __m256 {
        _mm256_min_ps(hi, _mm256_max_ps(lo, v))
    }

    /// [`Lanes::nan_out`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
    #[inline(always)]
    unsafe fn nan_out_256(v: __m256) -> __m256 {
        let m = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), m)
    }

    /// [`Lanes::max_abs_bits`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
    #[inline(always)]
    unsafe fn max_abs_bits_256(acc: __m256, v: __m256) -> __m256 {
        let abs = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff));
        _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), abs))
    }

    /// [`Lanes::hmax_bits`] on 8 lanes (ymm).
    #[inline(always)]
    unsafe fn hmax_bits_256(acc: __m256) -> u32 {
        let lanes: [u32; 8] = std::mem::transmute(acc);
        lanes.into_iter().max().unwrap_or(0)
    }

    /// AVX-512VL on 8 lanes (ymm): planes at most 8 columns wide (7×7) leave half of a
    /// 16-lane register idle, and a 512-bit op costs two 256-bit ones on some cores (Zen 4).
    pub(super) struct Avx512Y;
    impl Lanes for Avx512Y {
        const N: usize = 8;
        type V = __m256;
        type M = __mmask8;
        fn range(a: usize, b: usize) -> u8 {
            let upto = |n: usize| if n >= 8 { 0xffu8 } else { (1u8 << n) - 1 };
            if b <= a {
                0
            } else {
                upto(b) & !upto(a)
            }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> __m256 {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_m(p: *const f32, m: u8) -> __m256 {
            _mm256_maskz_loadu_ps(m, p)
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fma(w: __m256, x: __m256, acc: __m256) -> __m256 {
            _mm256_fmadd_ps(w, x, acc)
        }
        #[inline(always)]
        unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: u8) -> __m256 {
            _mm256_mask3_fmadd_ps(w, x, acc, m)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn store_m(p: *mut f32, v: __m256, m: u8) {
            _mm256_mask_storeu_ps(p, m, v)
        }
        #[inline(always)]
        unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
            clamp_256(v, lo, hi)
        }
        #[inline(always)]
        unsafe fn nan_out(v: __m256) -> __m256 {
            nan_out_256(v)
        }
        #[inline(always)]
        unsafe fn max_abs_bits(acc: __m256, v: __m256) -> __m256 {
            max_abs_bits_256(acc, v)
        }
        #[inline(always)]
        unsafe fn hmax_bits(acc: __m256) -> u32 {
            hmax_bits_256(acc)
        }
        #[inline(always)]
        unsafe fn zero_off(v: __m256, m: u8) -> __m256 {
            _mm256_maskz_mov_ps(m, v)
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m256; 16]) {
            transpose8(r)
        }
    }

    pub(super) struct Avx2;
    impl Lanes for Avx2 {
        const N: usize = 8;
        type V = __m256;
        type M = __m256i;
        fn range(a: usize, b: usize) -> __m256i {
            let lanes: [i32; 8] = std::array::from_fn(|l| if a <= l && l < b { -1 } else { 0 });
            // SAFETY: [i32; 8] and __m256i have the same size; every bit pattern is valid.
            unsafe { std::mem::transmute::<[i32; 8], __m256i>(lanes) }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> __m256 {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_m(p: *const f32, m: __m256i) -> __m256 {
            _mm256_maskload_ps(p, m)
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fma(w: __m256, x: __m256, acc: __m256) -> __m256 {
            _mm256_fmadd_ps(w, x, acc)
        }
        #[inline(always)]
        unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: __m256i) -> __m256 {
            _mm256_blendv_ps(acc, _mm256_fmadd_ps(w, x, acc), _mm256_castsi256_ps(m))
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn store_m(p: *mut f32, v: __m256, m: __m256i) {
            _mm256_maskstore_ps(p, m, v)
        }
        #[inline(always)]
        unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
            clamp_256(v, lo, hi)
        }
        #[inline(always)]
        unsafe fn nan_out(v: __m256) -> __m256 {
            nan_out_256(v)
        }
        #[inline(always)]
        unsafe fn max_abs_bits(acc: __m256, v: __m256) -> __m256 {
            max_abs_bits_256(acc, v)
        }
        #[inline(always)]
        unsafe fn hmax_bits(acc: __m256) -> u32 {
            hmax_bits_256(acc)
        }
        #[inline(always)]
        unsafe fn zero_off(v: __m256, m: __m256i) -> __m256 {
            _mm256_and_ps(v, _mm256_castsi256_ps(m))
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m256; 16]) {
            transpose8(r)
        }
    }

    /// Per-call geometry shared by every plane: input/output sizes, where tap `kx` reads
    /// (offset from the row's phase-plane start plus `ox`), and per chunk of `N` output
    /// columns the lanes each tap may read.
    pub(super) struct Plan<M> {
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
        sh: usize,
        dh: usize,
        pt: usize,
        /// Column stride: 1 reads the input plane, `s > 1` its `s` phase planes.
        s: usize,
        /// Row pitch of the phase planes (`w` for `s == 1`).
        pitch: usize,
        offs: Vec<isize>,
        nch: usize,
        /// `masks[c * kw + kx]`: lanes of chunk `c` whose tap `kx` is inside the image and
        /// whose column is `< ow`.
        masks: Vec<M>,
        /// Chunk `c` has every lane of every tap valid (plain loads, no masks).
        full: Vec<bool>,
        /// Lanes of the last chunk that are `< ow`.
        tail: M,
    }

    pub(super) fn plan<S: Lanes>(g: &Geo) -> Plan<S::M> {
        let n = S::N;
        let (h, w) = (g.sp[0], g.sp[1]);
        let (kw, ow) = (g.ks[1], g.osp[1]);
        let (s, dw, pl) = (g.strides[1], g.dil[1], g.pads[1].0);
        let pitch = if s == 1 {
            w
        } else {
            w.div_ceil(s).next_multiple_of(n)
        };
        let offs = (0..kw)
            .map(|kx| {
                let t = (kx * dw) as isize - pl as isize;
                let (r, q) = (t.rem_euclid(s as isize), t.div_euclid(s as isize));
                r * (h * pitch) as isize + q
            })
            .collect();
        let spans: Vec<(usize, usize)> = (0..kw)
            .map(|kx| inside_cols(kx * dw, pl, s, w, ow))
            .collect();
        let nch = ow.div_ceil(n);
        let mut masks = Vec::with_capacity(nch * kw);
        let mut full = Vec::with_capacity(nch);
        for c in 0..nch {
            let ox0 = c * n;
            let mut all = ox0 + n <= ow;
            for &(lo, hi) in &spans {
                let (a, b) = (lo.max(ox0) - ox0, hi.min(ox0 + n).max(ox0) - ox0);
                masks.push(S::range(a, b));
                all &= a == 0 && b == n;
            }
            full.push(all);
        }
        let tail = S::range(0, ow - (nch.max(1) - 1) * n);
        Plan {
            h,
            w,
            oh: g.osp[0],
            ow,
            sh: g.strides[0],
            dh: g.dil[0],
            pt: g.pads[0].0,
            s,
            pitch,
            offs,
            nch,
            masks,
            full,
            tail,
        }
    }

    /// Output rows `rows` of one output plane (`dst`, `oh * ow`; other rows are left alone)
    /// of a `KH × KW` kernel `wt` from `src`: the input plane (`s == 1`) or its phase
    /// planes. Only the input rows those output rows read are read.
    #[inline(always)]
    unsafe fn plane<S: Lanes, const KH: usize, const KW: usize>(
        p: &Plan<S::M>,
        src: *const f32,
        wt: &[f32],
        b: f32,
        clamp: Clamp,
        dst: &mut [f32],
        rows: std::ops::Range<usize>,
    ) -> u32 {
        let n = S::N;
        let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
        // With `clamp.track`: the largest |y| bits before the clamp. Lanes past the plane's
        // last column are folded in too: they hold the bias, or values of real input
        // columns, so the figure can only be larger (which costs the caller a replay, never
        // a miss).
        let mut seen = S::splat(0.0);
        // Plain loops, not `array::from_fn`: its closures are functions of their own,
        // compiled without this one's target features, so `splat` would be a call per tap.
        let mut wv = [[S::splat(0.0); KW]; KH];
        for (ky, row) in wv.iter_mut().enumerate() {
            for (kx, v) in row.iter_mut().enumerate() {
                *v = S::splat(wt[ky * KW + kx]);
            }
        }
        let offs: [isize; KW] = std::array::from_fn(|kx| p.offs[kx]);
        let bv = S::splat(b);
        let ow = p.ow;
        debug_assert_eq!(dst.len(), p.oh * ow);
        let dp = dst.as_mut_ptr();
        for oy in rows {
            let iy0 = (oy * p.sh) as isize - p.pt as isize;
            let ok: [bool; KH] = std::array::from_fn(|ky| {
                let iy = iy0 + (ky * p.dh) as isize;
                iy >= 0 && (iy as usize) < p.h
            });
            let rows: [*const f32; KH] = std::array::from_fn(|ky| {
                src.wrapping_offset((iy0 + (ky * p.dh) as isize) * p.pitch as isize)
            });
            let orow = dp.add(oy * ow);
            // One accumulator per kernel column (the bias in the first, -0 elsewhere, the
            // sum's identity), added at the end: chains of KH fused multiply-adds instead
            // of one chain of KH*KW, which bound small planes (one chunk per row) on latency.
            let sum = |acc: [S::V; KW]| {
                let mut t = acc[0];
                for a in &acc[1..] {
                    t = S::add(t, *a);
                }
                t
            };
            let mut init = [S::splat(-0.0); KW];
            init[0] = bv;
            if ok.iter().all(|&v| v) {
                // every kernel row inside the image: fully unrolled taps, plain loads on
                // chunks whose taps are all inside, masked loads on the border chunks
                for c in 0..p.nch {
                    let ox0 = c * n;
                    let mut acc = init;
                    if p.full[c] {
                        for ky in 0..KH {
                            let r = rows[ky].wrapping_add(ox0);
                            for kx in 0..KW {
                                let xv = S::load(r.wrapping_offset(offs[kx]));
                                acc[kx] = S::fma(wv[ky][kx], xv, acc[kx]);
                            }
                        }
                    } else {
                        let ms: [S::M; KW] = p.masks[c * KW..][..KW].try_into().expect("KW masks");
                        for ky in 0..KH {
                            let r = rows[ky].wrapping_add(ox0);
                            for kx in 0..KW {
                                let xv = S::load_m(r.wrapping_offset(offs[kx]), ms[kx]);
                                acc[kx] = S::fma_m(wv[ky][kx], xv, acc[kx], ms[kx]);
                            }
                        }
                    }
                    let y = sum(acc);
                    if clamp.track {
                        seen = S::max_abs_bits(seen, y);
                    }
                    let mut acc = S::clamp(y, lo, hi);
                    if clamp.nan_out {
                        acc = S::nan_out(acc);
                    }
                    if ox0 + n <= ow {
                        S::store(orow.add(ox0), acc);
                    } else {
                        S::store_m(orow.add(ox0), acc, p.tail);
                    }
                }
            } else {
                // top/bottom border rows: kernel rows outside the image are skipped
                for c in 0..p.nch {
                    let ox0 = c * n;
                    let mut acc = init;
                    let ms: [S::M; KW] = p.masks[c * KW..][..KW].try_into().expect("KW masks");
                    for ky in 0..KH {
                        if !ok[ky] {
                            continue;
                        }
                        let r = rows[ky].wrapping_add(ox0);
                        for kx in 0..KW {
                            let xv = S::load_m(r.wrapping_offset(offs[kx]), ms[kx]);
                            acc[kx] = S::fma_m(wv[ky][kx], xv, acc[kx], ms[kx]);
                        }
                    }
                    let y = sum(acc);
                    if clamp.track {
                        seen = S::max_abs_bits(seen, y);
                    }
                    let mut acc = S::clamp(y, lo, hi);
                    if clamp.nan_out {
                        acc = S::nan_out(acc);
                    }
                    if ox0 + n <= ow {
                        S::store(orow.add(ox0), acc);
                    } else {
                        S::store_m(orow.add(ox0), acc, p.tail);
                    }
                }
            }
        }
        S::hmax_bits(seen)
    }

    /// Split input plane `x` (`h × w`) into its `s` column phases: `buf[r*h*pitch +
    /// iy*pitch + j] = x[iy*w + j*s + r]`.
    #[inline(always)]
    fn phases(x: &[f32], h: usize, w: usize, s: usize, pitch: usize, buf: &mut [f32]) {
        for iy in 0..h {
            let row = &x[iy * w..(iy + 1) * w];
            if s == 2 {
                let (e, o) = buf.split_at_mut(h * pitch);
                let e = &mut e[iy * pitch..iy * pitch + w.div_ceil(2)];
                let o = &mut o[iy * pitch..iy * pitch + w / 2];
                for ((pair, de), d_o) in row.chunks_exact(2).zip(e.iter_mut()).zip(o.iter_mut()) {
                    *de = pair[0];
                    *d_o = pair[1];
                }
                if w % 2 == 1 {
                    e[w / 2] = row[w - 1];
                }
            } else {
                for r in 0..s.min(w) {
                    let d = &mut buf[r * h * pitch + iy * pitch..];
                    for (j, &v) in row[r..].iter().step_by(s).enumerate() {
                        d[j] = v;
                    }
                }
            }
        }
    }

    /// One output plane: `xs` is the input plane; with `scratch` (column stride > 1) it is
    /// first split into its phase planes there.
    type PlaneFn<M> =
        unsafe fn(&Plan<M>, &[f32], Option<&mut [f32]>, &[f32], f32, Clamp, &mut [f32]) -> u32;

    /// Every output plane, split over threads by [`fill_chunks`] as the generic path. `f`
    /// (a `#[target_feature]` function: the SIMD code is compiled inside it, not in this
    /// closure) does one plane.
    #[allow(clippy::too_many_arguments)]
    fn all_planes<M: Copy + Send + Sync>(
        p: &Plan<M>,
        f: PlaneFn<M>,
        kk: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        m: usize,
        out: &mut [f32],
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) {
        let (h, wd) = (p.h, p.w);
        let clamp = Clamp {
            track: seen.is_some(),
            ..clamp
        };
        fill_chunks(out, p.oh * p.ow, |pi, dst| {
            let c = pi % m;
            let xs = &x[pi * h * wd..(pi + 1) * h * wd];
            let wt = &w[c * kk..(c + 1) * kk];
            let b = bias.map_or(0.0, |b| b[c]);
            if p.s == 1 {
                // SAFETY: `f` was picked for a CPU that has its features.
                let m = unsafe { f(p, xs, None, wt, b, clamp, dst) };
                if let Some(s) = seen {
                    s.fetch_max(m, Ordering::Relaxed);
                }
            } else {
                // The phase planes go in the per-thread column buffer (im2col's; a
                // depthwise conv does not use it otherwise), whose old contents `f`
                // overwrites before reading.
                let m = super::with_col::<f32, _>(p.s * h * p.pitch, |sc| {
                    // SAFETY: as above.
                    unsafe { f(p, xs, Some(sc), wt, b, clamp, dst) }
                });
                if let Some(s) = seen {
                    s.fetch_max(m, Ordering::Relaxed);
                }
            }
            post(dst);
        });
    }

    /// The flat path (AVX-512, column and row stride 1 or 2, no dilation): each input plane
    /// is copied once into a zero-padded scratch buffer, as `s × s` phase planes of `r`
    /// rows and `pitch` columns (phase `(py, px)` holds padded rows `py, py + s, …` and
    /// columns `px, px + s, …`). Output `(oy, ox)`'s tap `(ky, kx)` is then phase
    /// `(ky % s, kx % s)` at row `oy + ky / s`, column `ox + kx / s`: with the outputs
    /// numbered `j = oy * pitch + ox`, every tap is one unmasked 16-lane load at `j` plus a
    /// fixed offset, whatever the plane's width. The `pitch - ow` lanes per output row
    /// that are not outputs are dropped by a compress before the store. Small planes (a
    /// 7×7 plane is 4 vectors here, 7 masked 8-lane rows on the per-row path) and strided
    /// convs (no per-row phase split) gain most. The sums are the per-row path's: one
    /// accumulator per kernel column, the bias first; a tap in the padding adds `w · 0`
    /// where the per-row path skips it, so the path is taken only when every weight is
    /// finite (then `w · 0` adds a zero; `conv_post` sends a conv with a non-finite weight
    /// to im2col, whose `inf · 0 = NaN` is ONNX's zero padding).
    pub(super) struct Flat {
        h: usize,
        w: usize,
        s: usize,
        pt: usize,
        pl: usize,
        /// Rows and columns of each phase plane.
        r: usize,
        pitch: usize,
        oh: usize,
        ow: usize,
        /// Scratch length: the phase planes, and room for the last vector's loads.
        len: usize,
        /// Offset of tap `ky * kw + kx` from `j`.
        offs: Vec<usize>,
        /// Per vector of 16 `j`s: the lanes that are outputs, the first one's index in the
        /// output plane, and the lanes it stores (the outputs, compressed to the front).
        masks: Vec<u16>,
        outs: Vec<usize>,
        stores: Vec<u16>,
        /// Input rows that land in the phase planes (`0..rows_in`).
        rows_in: usize,
        /// Per input row, the column segments [`flat_fill`] copies.
        segs: Vec<FillSeg>,
    }

    /// One segment of an input row: 16 input columns from `ix0` (stride 1) to offset `ca`
    /// of the row's phase-plane row, or 32 (stride 2: lanes `lo`, then `hi` from `ix0 +
    /// 16`) split into the even ones (to `ca`, phase `pl % 2`) and the odd ones (to `cb`,
    /// the other phase). Offsets count from the row of phase `(py, 0)`; masks keep the
    /// columns inside the image and the phase planes.
    struct FillSeg {
        ix0: usize,
        lo: u16,
        hi: u16,
        ca: usize,
        ma: u16,
        cb: usize,
        mb: u16,
    }

    /// The flat path's geometry, or `None` where it does not apply.
    pub(super) fn flat_plan(g: &Geo) -> Option<Flat> {
        let s = g.strides[0];
        if g.strides[1] != s || !(s == 1 || s == 2) || g.dil.iter().any(|&d| d != 1) {
            return None;
        }
        let (kh, kw) = (g.ks[0], g.ks[1]);
        let (oh, ow) = (g.osp[0], g.osp[1]);
        if oh == 0 || ow == 0 || g.sp[0] == 0 || g.sp[1] == 0 {
            return None;
        }
        let (r, pitch) = (oh + (kh - 1) / s, ow + (kw - 1) / s);
        let phase = r * pitch;
        let j = (oh - 1) * pitch + ow;
        let nch = j.div_ceil(16);
        let offs: Vec<usize> = (0..kh * kw)
            .map(|t| {
                let (ky, kx) = (t / kw, t % kw);
                ((ky % s) * s + kx % s) * phase + (ky / s) * pitch + kx / s
            })
            .collect();
        // With stride 1, larger input planes run faster on the per-row path (bench/NOTES.md
        // §13): there the copy into the padded plane costs more than the masks it saves.
        // With stride 2 the per-row path splits phases too, and this one is faster at
        // every size measured (up to 112×112).
        if s == 1 && g.sp[0] * g.sp[1] > 1024 {
            return None;
        }
        let len = (s * s * phase).max(nch * 16 + offs.iter().max()?);
        // The two scratch planes stay under 2 MB.
        if len > 1 << 18 {
            return None;
        }
        let mut masks = Vec::with_capacity(nch);
        let mut outs = Vec::with_capacity(nch);
        let mut stores = Vec::with_capacity(nch);
        let mut o = 0;
        for c in 0..nch {
            let m = (0..16)
                .filter(|l| {
                    let jj = c * 16 + l;
                    jj < j && jj % pitch < ow
                })
                .fold(0u16, |m, l| m | 1 << l);
            masks.push(m);
            outs.push(o);
            stores.push(first(m.count_ones() as usize));
            o += m.count_ones() as usize;
        }
        debug_assert_eq!(o, oh * ow);
        let (h, w, pt, pl) = (g.sp[0], g.sp[1], g.pads[0].0, g.pads[1].0);
        let rows_in = h.min((s * r).saturating_sub(pt));
        let mut segs = Vec::new();
        if s == 1 {
            // Columns `ix` with `pl + ix < pitch`.
            let n = w.min(pitch.saturating_sub(pl));
            for ix0 in (0..n).step_by(16) {
                let m = first(n - ix0);
                segs.push(FillSeg {
                    ix0,
                    lo: m,
                    hi: 0,
                    ca: pl + ix0,
                    ma: m,
                    cb: 0,
                    mb: 0,
                });
            }
        } else {
            // Input column `ix` is padded column `ix + pl`: phase `(ix + pl) % 2`, column
            // `(ix + pl) / 2`. From an even `ix0`, lane `k` of the even columns goes to
            // column `(ix0 + pl) / 2 + k`, of the odd ones to `(ix0 + 1 + pl) / 2 + k`.
            for ix0 in (0..w).step_by(32) {
                let left = w - ix0;
                let (ce, co) = ((ix0 + pl) / 2, (ix0 + 1 + pl) / 2);
                let ne = left.div_ceil(2).min(pitch.saturating_sub(ce));
                let no = (left / 2).min(pitch.saturating_sub(co));
                segs.push(FillSeg {
                    ix0,
                    lo: first(left),
                    hi: first(left.saturating_sub(16)),
                    ca: (pl % 2) * phase + ce,
                    ma: first(ne),
                    cb: ((pl + 1) % 2) * phase + co,
                    mb: first(no),
                });
            }
        }
        Some(Flat {
            h: g.sp[0],
            w: g.sp[1],
            s,
            pt: g.pads[0].0,
            pl: g.pads[1].0,
            r,
            pitch,
            oh,
            ow,
            len,
            offs,
            masks,
            outs,
            stores,
            rows_in,
            segs,
        })
    }

    /// Runs `f` on `len` floats of a thread's scratch buffer `cell` whose positions that `f`
    /// does not write are zero: the buffer is zeroed when `key` (the geometry that decides
    /// which positions are written) differs from the last call's or is too short, else
    /// reused as it is. Re-entered on the same thread (a `post` that waited on rayon), `f`
    /// gets fresh zeros.
    fn keyed_zeros<const N: usize, R>(
        cell: &'static std::thread::LocalKey<std::cell::RefCell<([usize; N], Vec<f32>)>>,
        key: [usize; N],
        len: usize,
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> R {
        cell.with(|cell| match cell.try_borrow_mut() {
            Ok(mut guard) => {
                let (k, buf) = &mut *guard;
                if *k != key || buf.len() < len {
                    buf.clear();
                    buf.resize(len, 0.0);
                    *k = key;
                }
                f(&mut buf[..len])
            }
            Err(_) => f(&mut vec![0.0; len]),
        })
    }

    thread_local! {
        /// The flat path's scratch planes, and the geometry whose padding they hold as
        /// zeros (planes of the same geometry write the same positions, so the padding
        /// stays zero from one call to the next).
        static FLAT: std::cell::RefCell<([usize; 8], Vec<f32>)> =
            const { std::cell::RefCell::new(([0; 8], Vec::new())) };
    }

    /// Lanes `0..n` (all for `n ≥ 16`).
    #[inline(always)]
    fn first(n: usize) -> u16 {
        if n >= 16 {
            0xffff
        } else {
            (1u16 << n) - 1
        }
    }

    /// Copy input plane `x` (`h × w`) into the phase planes in `buf`, row by row with the
    /// column segments of [`Flat::segs`]. The padding positions are never written (the same
    /// for every plane of a geometry): they hold the zeros the buffer was created with.
    #[target_feature(enable = "avx512f")]
    unsafe fn flat_fill(f: &Flat, x: &[f32], buf: &mut [f32]) {
        let (s, p) = (f.s, f.pitch);
        let phase = f.r * p;
        debug_assert!(x.len() >= f.h * f.w && buf.len() >= f.len);
        let bp = buf.as_mut_ptr();
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        for iy in 0..f.rows_in {
            let prow = iy + f.pt;
            let (py, r) = (prow % s, prow / s);
            // SAFETY (all pointer arithmetic below): reads stay in row `iy` of `x` (lanes
            // past `w` are masked off); writes stay in row `r < f.r` of a phase plane
            // (columns `< p`, masked: `flat_plan`), inside `buf`.
            unsafe {
                let src = x.as_ptr().add(iy * f.w);
                let row = bp.add(py * s * phase + r * p);
                for g in &f.segs {
                    let a = _mm512_maskz_loadu_ps(g.lo, src.add(g.ix0));
                    if s == 1 {
                        _mm512_mask_storeu_ps(row.add(g.ca), g.ma, a);
                    } else {
                        let b = _mm512_maskz_loadu_ps(g.hi, src.add(g.ix0 + 16));
                        let v = _mm512_permutex2var_ps(a, even, b);
                        _mm512_mask_storeu_ps(row.add(g.ca), g.ma, v);
                        let v = _mm512_permutex2var_ps(a, odd, b);
                        _mm512_mask_storeu_ps(row.add(g.cb), g.mb, v);
                    }
                }
            }
        }
    }

    /// One output plane (`dst`, `oh * ow`) of a `KH × KW` kernel `wt` from the phase planes
    /// in `buf` ([`flat_fill`]). Returns the largest |y| bits before the clamp over the
    /// plane's outputs when `clamp.track`.
    #[target_feature(enable = "avx512f")]
    unsafe fn flat_plane<const KH: usize, const KW: usize>(
        f: &Flat,
        buf: &[f32],
        wt: &[f32],
        b: f32,
        clamp: Clamp,
        dst: &mut [f32],
    ) -> u32 {
        type S = Avx512;
        debug_assert!(buf.len() >= f.len && dst.len() == f.oh * f.ow && wt.len() == KH * KW);
        // SAFETY: AVX-512F is enabled on this function; loads are at `j0 + off <
        // nch * 16 + max(off) ≤ f.len` (flat_plan); stores write the compressed outputs
        // at `outs[c]..outs[c] + popcount(masks[c])`, inside `dst`.
        unsafe {
            let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
            let mut seen = S::splat(0.0);
            let mut wv = [[S::splat(0.0); KW]; KH];
            let mut offs = [[0usize; KW]; KH];
            for ky in 0..KH {
                for kx in 0..KW {
                    wv[ky][kx] = S::splat(wt[ky * KW + kx]);
                    offs[ky][kx] = f.offs[ky * KW + kx];
                }
            }
            let mut init = [S::splat(-0.0); KW];
            init[0] = S::splat(b);
            let (bp, dp) = (buf.as_ptr(), dst.as_mut_ptr());
            for (c, ((&m, &o), &st)) in f.masks.iter().zip(&f.outs).zip(&f.stores).enumerate() {
                let j0 = c * 16;
                let mut acc = init;
                for ky in 0..KH {
                    for kx in 0..KW {
                        let xv = S::load(bp.add(j0 + offs[ky][kx]));
                        acc[kx] = S::fma(wv[ky][kx], xv, acc[kx]);
                    }
                }
                let mut y = acc[0];
                for a in &acc[1..] {
                    y = S::add(y, *a);
                }
                if clamp.track {
                    seen = S::max_abs_bits(seen, _mm512_maskz_mov_ps(m, y));
                }
                let mut v = S::clamp(y, lo, hi);
                if clamp.nan_out {
                    v = S::nan_out(v);
                }
                // The register form of compress (the memory form is slow on Zen 4), then a
                // store of the first popcount lanes.
                let v = _mm512_maskz_compress_ps(m, v);
                S::store_m(dp.add(o), v, st);
            }
            S::hmax_bits(seen)
        }
    }

    type FlatFn = unsafe fn(&Flat, &[f32], &[f32], f32, Clamp, &mut [f32]) -> u32;
    /// [`s2_plane`]: a [`FlatFn`] for output rows `rows` of the plane.
    type S2Fn =
        unsafe fn(&Flat, *const f32, &[f32], f32, Clamp, &mut [f32], std::ops::Range<usize>) -> u32;

    /// [`flat_plane`] for stride 2 read straight from input plane `x` (`h × w`), without
    /// the copy into phase planes: per output row and 16 outputs, each input row of the
    /// window is loaded once (32 columns and the next few, masked to the image, zeros
    /// outside it) and split into its even and odd columns by two permutes; tap `kx` is the
    /// even (`kx` even) or odd columns shifted by `kx / 2` lanes. The same multiply-adds in
    /// the same order as [`flat_plane`] (a tap outside the image adds `w · 0` there too, the
    /// bias first in column 0's accumulator, the columns' sums added left to right), so the
    /// same bits. The flat path's copy was where the input plane was first read: as much
    /// time as the product (96 ch 112→56: 100 µs each).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `f` is a stride-2 plan of `K × K` taps, `K` 3 or 5;
    /// `x + iy·w` must be readable for `w` floats for every image row `iy` in `[0, h)` that
    /// output rows `rows` read (`x` is the plane's row 0, which need not itself exist: a
    /// window of rows is enough).
    #[target_feature(enable = "avx512f")]
    unsafe fn s2_plane<const K: usize>(
        f: &Flat,
        x: *const f32,
        wt: &[f32],
        b: f32,
        clamp: Clamp,
        dst: &mut [f32],
        rows: std::ops::Range<usize>,
    ) -> u32 {
        type S = Avx512;
        assert!(f.s == 2 && (K == 3 || K == 5) && rows.end <= f.oh);
        assert!(dst.len() == f.oh * f.ow && wt.len() == K * K);
        let (h, w) = (f.h as isize, f.w as isize);
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        // SAFETY: AVX-512F is enabled here; every load is masked to columns [0, w) of a
        // row in [0, h) that output rows `rows` read (lanes outside are not read; those
        // rows are readable: the caller's contract), every store to the `n` outputs of its
        // row inside `dst`.
        unsafe {
            let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
            let mut seen = S::splat(0.0);
            let mut wv = [[S::splat(0.0); K]; K];
            for (ky, row) in wv.iter_mut().enumerate() {
                for (kx, v) in row.iter_mut().enumerate() {
                    *v = S::splat(wt[ky * K + kx]);
                }
            }
            let zero = _mm512_setzero_ps();
            // Lanes l with 0 <= c + l < w.
            let inside = |c: isize| {
                let l = _mm512_add_epi32(lane, _mm512_set1_epi32(c as i32));
                _mm512_cmpge_epi32_mask(l, _mm512_setzero_si512())
                    & _mm512_cmplt_epi32_mask(l, _mm512_set1_epi32(w as i32))
            };
            for oy in rows {
                for ox0 in (0..f.ow).step_by(16) {
                    let n = (f.ow - ox0).min(16);
                    let c0 = (2 * ox0) as isize - f.pl as isize;
                    let mut acc = [S::splat(-0.0); K];
                    acc[0] = S::splat(b);
                    for (ky, wrow) in wv.iter().enumerate() {
                        let iy = (2 * oy + ky) as isize - f.pt as isize;
                        let (e, o, e2, o2) = if iy < 0 || iy >= h {
                            (zero, zero, zero, zero)
                        } else {
                            let row = x.wrapping_offset(iy * w);
                            let ld =
                                |c: isize| _mm512_maskz_loadu_ps(inside(c), row.wrapping_offset(c));
                            let (v0, v1, v2) = (ld(c0), ld(c0 + 16), ld(c0 + 32));
                            (
                                _mm512_permutex2var_ps(v0, even, v1),
                                _mm512_permutex2var_ps(v0, odd, v1),
                                _mm512_permutexvar_ps(even, v2),
                                _mm512_permutexvar_ps(odd, v2),
                            )
                        };
                        let shift = |next: __m512, cur: __m512, by: usize| {
                            let (a, c) = (_mm512_castps_si512(next), _mm512_castps_si512(cur));
                            _mm512_castsi512_ps(match by {
                                1 => _mm512_alignr_epi32::<1>(a, c),
                                _ => _mm512_alignr_epi32::<2>(a, c),
                            })
                        };
                        for (kx, &wk) in wrow.iter().enumerate() {
                            let t = match kx {
                                0 => e,
                                1 => o,
                                2 => shift(e2, e, 1),
                                3 => shift(o2, o, 1),
                                _ => shift(e2, e, 2),
                            };
                            acc[kx] = S::fma(wk, t, acc[kx]);
                        }
                    }
                    let mut y = acc[0];
                    for a in &acc[1..] {
                        y = S::add(y, *a);
                    }
                    let m = first(n);
                    if clamp.track {
                        seen = S::max_abs_bits(seen, _mm512_maskz_mov_ps(m, y));
                    }
                    let mut v = S::clamp(y, lo, hi);
                    if clamp.nan_out {
                        v = S::nan_out(v);
                    }
                    S::store_m(dst.as_mut_ptr().add(oy * f.ow + ox0), v, m);
                }
            }
            S::hmax_bits(seen)
        }
    }

    /// How [`flat_planes`] makes a plane: [`flat_plane`] on the plane copied into phase
    /// planes, or [`s2_plane`] straight from the input plane.
    #[derive(Clone, Copy)]
    enum FlatKind {
        Copy(FlatFn),
        Direct(S2Fn),
    }

    /// Every output plane on the flat path, in groups of planes of about 4096 outputs (two
    /// scratch planes per thread, `FLAT`, zeroed when the geometry changes), split over
    /// threads when the multiply-adds are many: a depthwise output element costs `kh * kw` of them, so the elementwise
    /// bound of [`fill_chunks`] would leave a 576-channel 7×7 layer on one thread.
    #[allow(clippy::too_many_arguments)]
    fn flat_planes(
        f: &Flat,
        plane: FlatKind,
        kk: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        m: usize,
        out: &mut [f32],
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) {
        use rayon::prelude::*;
        let (hw, op) = (f.h * f.w, f.oh * f.ow);
        let group = (4096 / op).max(1);
        let clamp = Clamp {
            track: seen.is_some(),
            ..clamp
        };
        let run = |t: usize, dst: &mut [f32]| {
            let plane = match plane {
                FlatKind::Copy(p) => p,
                FlatKind::Direct(p) => {
                    let mut bits = 0;
                    for (k, d) in dst.chunks_mut(op).enumerate() {
                        let i = t * group + k;
                        let c = i % m;
                        let b = bias.map_or(0.0, |b| b[c]);
                        let (xi, wt) = (&x[i * hw..(i + 1) * hw], &w[c * kk..(c + 1) * kk]);
                        // SAFETY: the caller checked AVX-512F; `p` reads the input plane
                        // and writes `d`.
                        bits = bits.max(unsafe { p(f, xi.as_ptr(), wt, b, clamp, d, 0..f.oh) });
                        post(d);
                    }
                    if let Some(s) = seen {
                        s.fetch_max(bits, Ordering::Relaxed);
                    }
                    return;
                }
            };
            // Two scratch planes: the next input plane is copied into one while the other
            // is read, so the reads do not wait on the copy's stores (which they could not
            // take forwarded: the loads are unaligned, the stores masked).
            let mut planes = |cur: &mut [f32], next: &mut [f32]| {
                let (mut cur, mut next) = (cur, next);
                let src = |k: usize| &x[(t * group + k) * hw..(t * group + k + 1) * hw];
                let planes = dst.len() / op;
                // SAFETY: the caller checked AVX-512F; `flat_fill` writes only inside its
                // buffer (`f.len` long), `plane` reads its buffer and writes `d`.
                unsafe { flat_fill(f, src(0), cur) };
                let mut bits = 0;
                for (k, d) in dst.chunks_mut(op).enumerate() {
                    if k + 1 < planes {
                        unsafe { flat_fill(f, src(k + 1), next) };
                    }
                    let c = (t * group + k) % m;
                    let b = bias.map_or(0.0, |b| b[c]);
                    let wt = &w[c * kk..(c + 1) * kk];
                    bits = bits.max(unsafe { plane(f, cur, wt, b, clamp, d) });
                    post(d);
                    std::mem::swap(&mut cur, &mut next);
                }
                if let Some(s) = seen {
                    s.fetch_max(bits, Ordering::Relaxed);
                }
            };
            let key = [f.h, f.w, f.s, f.pt, f.pl, f.r, f.pitch, f.len];
            keyed_zeros(&FLAT, key, 2 * f.len, |buf| {
                let (cur, next) = buf.split_at_mut(f.len);
                planes(cur, next)
            })
        };
        if super::super::par_worth(out.len() * kk) && out.len() > op * group {
            out.par_chunks_mut(op * group)
                .enumerate()
                .for_each(|(t, d)| run(t, d));
        } else {
            for (t, d) in out.chunks_mut(op * group).enumerate() {
                run(t, d);
            }
        }
    }

    /// Geometry of the channel-block path ([`run_cblock`]).
    pub(super) struct CBlock {
        /// Input plane `h × w`, output plane `oh × ow`, stride `s` (both axes).
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
        /// Row pitch of the padded scratch plane (in positions of 16 channels).
        pw: usize,
        /// Positions of the padded scratch plane.
        len: usize,
        /// Per input position: its position in the padded scratch plane.
        din: Vec<u32>,
        /// Per output position (padded to a multiple of 16 with position 0's): the scratch
        /// position of its window's top-left tap.
        dout: Vec<u32>,
    }

    /// Largest output plane the channel-block path takes (larger planes use their lanes
    /// fully on the per-position paths, and the transposes then cost more than they save).
    const CBLOCK_MAX_PLANE: usize = 1024;

    thread_local! {
        /// The channel-block path's scratch plane, and the geometry whose padding it holds
        /// as zeros (blocks of the same geometry write the same positions, so the padding
        /// stays zero from one block and call to the next).
        static CBLK: std::cell::RefCell<([usize; 7], Vec<f32>)> =
            const { std::cell::RefCell::new(([0; 7], Vec::new())) };
    }

    /// `RLX_CPU_DW_CBLOCK` (read once per process): the channel-block path is on unless it
    /// is off.
    fn cblock_on() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_DW_CBLOCK"))
    }

    /// The channel-block path's geometry for `g`, or `None` where it does not apply (kernel
    /// other than 3×3, 5×5, 7×7; dilation; stride other than 1 or 2 on both axes; an output
    /// plane over [`CBLOCK_MAX_PLANE`]; for the 16-lane kernel, a 3×3 kernel on a plane
    /// wider than 8 outputs). `lanes`: channels per block, 16 ([`cblock`]) or 8
    /// ([`cblock8`]).
    pub(super) fn cblock_plan(g: &Geo, lanes: usize) -> Option<CBlock> {
        let k = g.ks[0];
        let s = g.strides[0];
        if g.ks[1] != k
            || !matches!(k, 3 | 5 | 7)
            || g.strides[1] != s
            || !(s == 1 || s == 2)
            || g.dil.iter().any(|&d| d != 1)
        {
            return None;
        }
        let (h, w, oh, ow) = (g.sp[0], g.sp[1], g.osp[0], g.osp[1]);
        if h == 0 || w == 0 || oh == 0 || ow == 0 || oh * ow > CBLOCK_MAX_PLANE {
            return None;
        }
        // Where it wins (one-node models, bench/NOTES.md §22): 5×5 and 7×7 kernels up to
        // 32² outputs; 3×3 only on planes at most 8 outputs wide, whose rows leave half the
        // lanes of the per-row paths idle. 3×3 convs with 14 output columns ran 5–25%
        // slower here at stride 2 (28² → 14²), and at stride 1 gained at 1 thread but lost
        // at 2: the transposes, per input position, are not paid back by 9 taps. On AVX2
        // (8 lanes, Zen 2) 3×3 gained at every plane up to the bound, 1 and 2 threads
        // (576 ch at 14²: 0.23 → 0.15 ms; 240 ch 3×3/2 at 28²: 0.155 → 0.088 ms; §23).
        if k == 3 && ow > 8 && lanes == 16 {
            return None;
        }
        let (pt, pl) = (g.pads[0].0, g.pads[1].0);
        // Rows and columns every window reads, and every input row and column.
        let ph = ((oh - 1) * s + k).max(h + pt);
        let pw = ((ow - 1) * s + k).max(w + pl);
        let din = (0..h * w)
            .map(|i| ((i / w + pt) * pw + i % w + pl) as u32)
            .collect();
        let op = oh * ow;
        let dout = (0..op.next_multiple_of(16))
            .map(|i| {
                let i = if i < op { i } else { 0 };
                ((i / ow) * s * pw + (i % ow) * s) as u32
            })
            .collect();
        Some(CBlock {
            h,
            w,
            oh,
            ow,
            pw,
            len: ph * pw,
            din,
            dout,
        })
    }

    /// Transpose 16 rows of 16 f32 in registers: `r[i][j]` becomes `r[j][i]`.
    #[inline(always)]
    unsafe fn transpose16(r: &mut [__m512; 16]) {
        // SAFETY: register shuffles only; the caller has AVX-512F.
        unsafe {
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            for i in 0..4 {
                let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
                let pd = |x: __m512| _mm512_castps_pd(x);
                r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
                r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
                r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
                r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
            }
            for i in 0..2 {
                for j in 0..4 {
                    let (a, b) = (r[8 * i + j], r[8 * i + 4 + j]);
                    t[8 * i + j] = _mm512_shuffle_f32x4::<0x88>(a, b);
                    t[8 * i + 4 + j] = _mm512_shuffle_f32x4::<0xdd>(a, b);
                }
            }
            for j in 0..8 {
                r[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[8 + j]);
                r[8 + j] = _mm512_shuffle_f32x4::<0xdd>(t[j], t[8 + j]);
            }
        }
    }

    /// Transpose the first 8 rows of 8 f32 in registers: `r[i][j]` becomes `r[j][i]` for
    /// `i, j < 8`.
    #[inline(always)]
    unsafe fn transpose8(r: &mut [__m256; 16]) {
        // SAFETY: register shuffles only; the caller has AVX2.
        unsafe {
            let mut t = [_mm256_setzero_ps(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for i in 0..2 {
                let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
                u[4 * i] = _mm256_shuffle_ps::<0x44>(a, c);
                u[4 * i + 1] = _mm256_shuffle_ps::<0xee>(a, c);
                u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(b, d);
                u[4 * i + 3] = _mm256_shuffle_ps::<0xee>(b, d);
            }
            for j in 0..4 {
                r[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
                r[4 + j] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
            }
        }
    }

    /// One block of up to `S::N` (16 or 8) channels (`nc`) of one image: input planes `x`
    /// (`nc` planes of `h × w`), weights `w` (`nc` filters of `K × K`), output planes `dst`
    /// (`nc` planes of `oh × ow`). The planes are transposed into `xp` (the padded plane,
    /// `S::N` channels per position, its padding zero), each output position is then summed
    /// with the channels in the lanes of one register (bias, then every tap in (ky, kx)
    /// order, each one fused multiply-add), clamped, transposed back `S::N` positions at a
    /// time and stored, `G` positions summed at a time: one accumulator per kernel column
    /// (the bias in column 0's), each tap one fused multiply-add into its column's, the
    /// columns added left to right. Taps in the padding add `w · (+0)`, as ONNX's zero
    /// padding defines them (the per-row path skips them: the same bits but for the sign
    /// of a zero result, −0 there where every term is −0); `w` must be finite. Returns the largest |y| bits before the clamp over the block's outputs
    /// when `clamp.track`. Compiled into [`cblock`] (AVX-512F, 16 lanes) and [`cblock8`]
    /// (AVX2 + FMA, 8 lanes).
    ///
    /// # Safety
    /// The CPU has `S`'s features, and the caller is compiled with them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn cblock_lanes<S: Lanes, const K: usize, const G: usize>(
        p: &CBlock,
        nc: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        clamp: Clamp,
        xp: &mut [f32],
        dst: &mut [f32],
    ) -> u32 {
        let n_l = S::N;
        let (hw, op) = (p.h * p.w, p.oh * p.ow);
        assert!((1..=n_l).contains(&nc) && x.len() >= nc * hw && w.len() >= nc * K * K);
        assert!(dst.len() >= nc * op && xp.len() >= p.len * n_l);
        // SAFETY: the caller has S's features. Loads of `x` are masked to the block's `nc`
        // planes and each plane's `hw` positions; stores to `xp` go to positions
        // `din[i] < len`; loads from `xp` are at `dout[i] + ky·pw + kx < len` (cblock_plan:
        // the padded plane holds every window); stores to `dst` are masked to the `nc`
        // planes and the plane's `op` positions.
        unsafe {
            let chans = S::range(0, nc);
            // Weights by tap, N channels per vector (channels past `nc`: 0).
            let mut wt = [S::splat(0.0); 49];
            for (t, wv) in wt.iter_mut().enumerate().take(K * K) {
                let mut lanes = [0f32; 16];
                for (l, v) in lanes.iter_mut().enumerate().take(nc) {
                    *v = *w.get_unchecked(l * K * K + t);
                }
                *wv = S::load(lanes.as_ptr());
            }
            let mut bl = [0f32; 16];
            if let Some(b) = bias {
                bl[..nc].copy_from_slice(&b[..nc]);
            }
            let bv = S::load(bl.as_ptr());
            // Input planes into the padded scratch plane, N positions at a time.
            let xq = xp.as_mut_ptr();
            let mut r = [S::splat(0.0); 16];
            for q0 in (0..hw).step_by(n_l) {
                let n = (hw - q0).min(n_l);
                let m = S::range(0, n);
                for (l, v) in r.iter_mut().enumerate().take(n_l) {
                    *v = if l >= nc {
                        S::splat(0.0)
                    } else if n == n_l {
                        S::load(x.as_ptr().add(l * hw + q0))
                    } else {
                        S::load_m(x.as_ptr().add(l * hw + q0), m)
                    };
                }
                S::transpose(&mut r);
                for (j, v) in r.iter().enumerate().take(n) {
                    let d = *p.din.get_unchecked(q0 + j) as usize;
                    S::store(xq.add(d * n_l), *v);
                }
            }
            // Output positions, N at a time, in groups of `G`. The sums as the per-row and
            // flat paths make them, for the same bits: one accumulator per kernel column
            // (the bias in column 0's, -0 in the others), each tap's fused multiply-add
            // into its column's, the columns added left to right.
            let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
            let mut seen = S::splat(0.0);
            let xr = xp.as_ptr();
            let pw = p.pw;
            let mut init = [S::splat(-0.0); K];
            init[0] = bv;
            for o0 in (0..op).step_by(n_l) {
                for g0 in (0..n_l).step_by(G) {
                    let mut acc = [init; G];
                    let mut base = [xr; G];
                    for (g, b) in base.iter_mut().enumerate() {
                        *b = xr.add(*p.dout.get_unchecked(o0 + g0 + g) as usize * n_l);
                    }
                    for ky in 0..K {
                        for kx in 0..K {
                            let wv = wt[ky * K + kx];
                            let off = (ky * pw + kx) * n_l;
                            for g in 0..G {
                                acc[g][kx] = S::fma(wv, S::load(base[g].add(off)), acc[g][kx]);
                            }
                        }
                    }
                    for g in 0..G {
                        let mut y = acc[g][0];
                        for a in &acc[g][1..] {
                            y = S::add(y, *a);
                        }
                        r[g0 + g] = y;
                    }
                }
                let n = (op - o0).min(n_l);
                for (j, v) in r.iter_mut().enumerate().take(n_l) {
                    if clamp.track && j < n {
                        seen = S::max_abs_bits(seen, S::zero_off(*v, chans));
                    }
                    *v = S::clamp(*v, lo, hi);
                    if clamp.nan_out {
                        *v = S::nan_out(*v);
                    }
                }
                S::transpose(&mut r);
                let m = S::range(0, n);
                for (l, v) in r.iter().enumerate().take(nc) {
                    let d = dst.as_mut_ptr().add(l * op + o0);
                    if n == n_l {
                        S::store(d, *v);
                    } else {
                        S::store_m(d, *v, m);
                    }
                }
            }
            S::hmax_bits(seen)
        }
    }

    /// [`cblock_lanes`] on AVX-512F: blocks of 16 channels.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn cblock<const K: usize, const G: usize>(
        p: &CBlock,
        nc: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        clamp: Clamp,
        xp: &mut [f32],
        dst: &mut [f32],
    ) -> u32 {
        // SAFETY: AVX-512F is enabled here; the caller checked the CPU has it.
        unsafe { cblock_lanes::<Avx512, K, G>(p, nc, x, w, bias, clamp, xp, dst) }
    }

    /// [`cblock_lanes`] on AVX2 + FMA, for CPUs without AVX-512: blocks of 8 channels, fewer
    /// positions summed at a time than the AVX-512 kernel (`G`: 16 registers).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn cblock8<const K: usize, const G: usize>(
        p: &CBlock,
        nc: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        clamp: Clamp,
        xp: &mut [f32],
        dst: &mut [f32],
    ) -> u32 {
        // SAFETY: AVX2 and FMA are enabled here; the caller checked the CPU has them.
        unsafe { cblock_lanes::<Avx2, K, G>(p, nc, x, w, bias, clamp, xp, dst) }
    }

    /// [`cblock`] (or [`cblock8`]) for one kernel size.
    type CBlockFn = unsafe fn(
        &CBlock,
        usize,
        &[f32],
        &[f32],
        Option<&[f32]>,
        Clamp,
        &mut [f32],
        &mut [f32],
    ) -> u32;

    /// The channel-block path: every output plane, by blocks of 16 channels of one image
    /// ([`cblock`]; with `avx2`, blocks of 8 on AVX2 + FMA, [`cblock8`]), the blocks split
    /// over threads when the multiply-adds are many. False where [`cblock_plan`] does not
    /// apply (nothing is written). `w` must be finite.
    #[allow(clippy::too_many_arguments)]
    fn run_cblock(
        avx2: bool,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        g: &Geo,
        out: &mut [f32],
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) -> bool {
        use rayon::prelude::*;
        let lanes = if avx2 { 8 } else { 16 };
        let Some(p) = cblock_plan(g, lanes) else {
            return false;
        };
        let k = g.ks[0];
        let f: CBlockFn = match (avx2, k) {
            (false, 3) => cblock::<3, 8>,
            (false, 5) => cblock::<5, 4>,
            (false, _) => cblock::<7, 4>,
            (true, 3) => cblock8::<3, 4>,
            (true, 5) => cblock8::<5, 2>,
            (true, _) => cblock8::<7, 2>,
        };

        let (c, hw, op, kk) = (g.m, p.h * p.w, p.oh * p.ow, k * k);
        let clamp = Clamp {
            track: seen.is_some(),
            ..clamp
        };
        // The blocks: (image, first channel, channels), each with its output planes.
        let par = super::super::par_worth(out.len() * kk);
        let mut blocks = Vec::with_capacity(g.n * c.div_ceil(lanes));
        let mut rest = &mut out[..g.n * c * op];
        for n in 0..g.n {
            for c0 in (0..c).step_by(lanes) {
                let nc = (c - c0).min(lanes);
                let (d, r) = rest.split_at_mut(nc * op);
                rest = r;
                blocks.push((n, c0, nc, d));
            }
        }
        let key = [p.h, p.w, p.pw, p.len, g.pads[0].0, g.pads[1].0, lanes];
        let run = |(n, c0, nc, d): (usize, usize, usize, &mut [f32])| {
            let xs = &x[(n * c + c0) * hw..(n * c + c0 + nc) * hw];
            let ws = &w[c0 * kk..(c0 + nc) * kk];
            let bs = bias.map(|b| &b[c0..c0 + nc]);
            let block = |xp: &mut [f32]| {
                // The scratch plane from a 64-byte boundary: each position's 16 (or 8)
                // channels lie in one cache line (a misaligned one would split loads across
                // two lines).
                let a = xp.as_ptr().align_offset(64).min(15);
                let xa = &mut xp[a..a + p.len * lanes];
                // SAFETY: `run_with` is reached with AVX-512F (or, with `avx2`, AVX2 and
                // FMA); the slices are the block's.
                unsafe { f(&p, nc, xs, ws, bs, clamp, xa, d) }
            };
            let bits = keyed_zeros(&CBLK, key, p.len * lanes + 15, block);
            for plane in d.chunks_mut(op) {
                post(plane);
            }
            bits
        };
        let bits = if par && blocks.len() > 1 {
            blocks.into_par_iter().map(run).max().unwrap_or(0)
        } else {
            blocks.into_iter().map(run).max().unwrap_or(0)
        };
        if let Some(s) = seen {
            s.fetch_max(bits, Ordering::Relaxed);
        }
        true
    }

    /// The flat path for `g`, or false where it does not apply (then nothing is written).
    /// `w` must be finite: a tap in the padding computes `w · 0`, which the per-row path
    /// skips (the same values only with finite weights).
    #[allow(clippy::too_many_arguments)]
    fn run_flat(
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        g: &Geo,
        out: &mut [f32],
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) -> bool {
        let Some(f) = flat_plan(g) else {
            return false;
        };
        // Stride 2: straight from the input planes (`RLX_CPU_DW_S2=0`: the phase copy).
        // Read once per process (this runs per depthwise conv call).
        static DIRECT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let direct = f.s == 2 && *DIRECT.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_DW_S2"));
        let plane = match (g.ks[0], g.ks[1]) {
            (3, 3) if direct => FlatKind::Direct(s2_plane::<3>),
            (5, 5) if direct => FlatKind::Direct(s2_plane::<5>),
            (3, 3) => FlatKind::Copy(flat_plane::<3, 3>),
            (5, 5) => FlatKind::Copy(flat_plane::<5, 5>),
            (7, 7) => FlatKind::Copy(flat_plane::<7, 7>),
            _ => return false,
        };
        flat_planes(
            &f,
            plane,
            g.ks[0] * g.ks[1],
            x,
            w,
            bias,
            g.m,
            out,
            post,
            clamp,
            seen,
        );
        true
    }

    macro_rules! entry {
        ($plane:ident, $run:ident, $s:ty, $feat:literal) => {
            #[target_feature(enable = $feat)]
            unsafe fn $plane<const KH: usize, const KW: usize>(
                p: &Plan<<$s as Lanes>::M>,
                xs: &[f32],
                scratch: Option<&mut [f32]>,
                wt: &[f32],
                b: f32,
                clamp: Clamp,
                dst: &mut [f32],
            ) -> u32 {
                // SAFETY (both): every lane read through `p` lies in `xs` or in the phase
                // planes (the others are masked off); the caller checked the CPU features.
                match scratch {
                    None => unsafe {
                        plane::<$s, KH, KW>(p, xs.as_ptr(), wt, b, clamp, dst, 0..p.oh)
                    },
                    Some(buf) => {
                        phases(xs, p.h, p.w, p.s, p.pitch, buf);
                        unsafe { plane::<$s, KH, KW>(p, buf.as_ptr(), wt, b, clamp, dst, 0..p.oh) }
                    }
                }
            }

            #[allow(clippy::too_many_arguments)]
            fn $run(
                x: &[f32],
                w: &[f32],
                bias: Option<&[f32]>,
                g: &Geo,
                out: &mut [f32],
                post: Post,
                clamp: Clamp,
                seen: Option<&AtomicU32>,
            ) {
                let p = plan::<$s>(g);
                let f: PlaneFn<<$s as Lanes>::M> = match (g.ks[0], g.ks[1]) {
                    (3, 3) => $plane::<3, 3>,
                    (5, 5) => $plane::<5, 5>,
                    (7, 7) => $plane::<7, 7>,
                    _ => unreachable!(),
                };
                all_planes(
                    &p,
                    f,
                    g.ks[0] * g.ks[1],
                    x,
                    w,
                    bias,
                    g.m,
                    out,
                    post,
                    clamp,
                    seen,
                );
            }
        };
    }
    entry!(plane_avx512, run_avx512, Avx512, "avx512f");
    entry!(plane_avx512y, run_avx512y, Avx512Y, "avx512f,avx512vl");
    entry!(plane_avx2, run_avx2, Avx2, "avx2,fma");

    #[derive(Clone, Copy, PartialEq, Debug)]
    pub(super) enum Isa {
        /// AVX-512F and VL: 16 lanes, or 8 ([`Avx512Y`]) for planes at most 8 wide.
        Avx512,
        /// AVX-512F and VL on 8 lanes only (for tests: [`run`] picks it by plane width).
        #[cfg_attr(not(test), allow(dead_code))]
        Avx512Y,
        /// [`Isa::Avx512`] without the flat path (for tests).
        #[cfg_attr(not(test), allow(dead_code))]
        Avx512Rows,
        /// AVX2 + FMA: the channel blocks ([`cblock8`]) where they apply, else 8 lanes per row.
        Avx2,
        /// [`Isa::Avx2`] without the channel blocks (for tests).
        #[cfg_attr(not(test), allow(dead_code))]
        Avx2Rows,
    }

    pub(super) fn best_isa() -> Option<Isa> {
        use std::sync::OnceLock;
        static ISA: OnceLock<Option<Isa>> = OnceLock::new();
        *ISA.get_or_init(|| {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                Some(Isa::Avx512)
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                Some(Isa::Avx2)
            } else {
                None
            }
        })
    }

    /// The SIMD path with `isa` (which the CPU must support: [`best_isa`] or weaker).
    /// `finite_w`: every weight is finite (the flat path needs it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_with(
        isa: Isa,
        finite_w: bool,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        g: &Geo,
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) -> Option<Vec<f32>> {
        if !matches!((g.ks[0], g.ks[1]), (3, 3) | (5, 5) | (7, 7)) {
            return None;
        }
        let p = g.osp[0] * g.osp[1];
        // Every output element is stored (each row's chunks cover it).
        let mut out = crate::buffers::overwritten(g.n * g.m * p);
        if p == 0 || g.sp[0] == 0 || g.sp[1] == 0 {
            return None;
        }
        // The caller picked an `isa` the CPU supports.
        match isa {
            Isa::Avx512
                if finite_w
                    && cblock_on()
                    && run_cblock(false, x, w, bias, g, &mut out, post, clamp, seen) => {}
            Isa::Avx2
                if finite_w
                    && cblock_on()
                    && run_cblock(true, x, w, bias, g, &mut out, post, clamp, seen) => {}
            Isa::Avx512 if finite_w && run_flat(x, w, bias, g, &mut out, post, clamp, seen) => {}
            Isa::Avx512 | Isa::Avx512Rows if g.osp[1] <= 8 => {
                run_avx512y(x, w, bias, g, &mut out, post, clamp, seen)
            }
            Isa::Avx512 | Isa::Avx512Rows => run_avx512(x, w, bias, g, &mut out, post, clamp, seen),
            Isa::Avx512Y => run_avx512y(x, w, bias, g, &mut out, post, clamp, seen),
            Isa::Avx2 | Isa::Avx2Rows => run_avx2(x, w, bias, g, &mut out, post, clamp, seen),
        }
        Some(out)
    }

    /// [`plane`] on 16 lanes for output rows `rows`, compiled with AVX-512F; `src` is the
    /// input plane's row 0, and the rows those output rows read must be readable from it
    /// (as for [`s2_plane`]).
    #[target_feature(enable = "avx512f")]
    unsafe fn rows_avx512<const K: usize>(
        p: &Plan<u16>,
        src: *const f32,
        wt: &[f32],
        b: f32,
        clamp: Clamp,
        dst: &mut [f32],
        rows: std::ops::Range<usize>,
    ) -> u32 {
        // SAFETY: the caller checked AVX-512F; `plane` reads the rows the output rows need
        // (inside the image, masked to its columns) and writes rows `rows` of `dst`.
        unsafe { plane::<Avx512, K, K>(p, src, wt, b, clamp, dst, rows) }
    }

    /// Target bytes of one band of the pointwise output in [`pw_dw`] (all of a thread's
    /// channels, a few rows): with the rows kept for later outputs, inside Zen 4's 1 MB
    /// L2. MobileNetV2's first pair (16→96 at 112², then stride 2), 1 thread, per-node
    /// profile, two runs each: 400–404 / 382–388 / 379–396 / 366–371 / 375–381 µs at 128 /
    /// 256 / 384 / 512 / 768 KB bands (the two convs apart: 638–846).
    const BAND_BYTES: usize = 512 << 10;

    /// [`rows_avx512`]: output rows `rows` of one plane on the per-row path.
    type RowsFn = unsafe fn(
        &Plan<u16>,
        *const f32,
        &[f32],
        f32,
        Clamp,
        &mut [f32],
        std::ops::Range<usize>,
    ) -> u32;

    /// The depthwise kernel of [`pw_dw`]: output rows of one plane.
    enum RowKernel {
        /// Stride 1, planes over 1024 pixels (where the unfused conv takes the per-row path too).
        Rows(Plan<u16>, RowsFn),
        /// Stride 2, 3×3 or 5×5 ([`s2_plane`], as the unfused conv).
        S2(Flat, S2Fn),
    }

    /// A pointwise conv and the depthwise conv that reads its output, interleaved by bands
    /// of rows (MobileNet's and EfficientNet's expansion then depthwise): per band, the
    /// pointwise conv's product (gemm), bias and activation for those rows of every
    /// channel, then every depthwise output row whose window rows are all computed. The
    /// pointwise output lives only in a window of rows per thread (the band and the few
    /// rows later outputs still read), which stays in L2: the depthwise conv reads it
    /// there, and the whole tensor (4.8 MB in MobileNetV2's first block) is never written
    /// out to L3 or memory.
    ///
    /// `x`: one image `[c, h, w]`; `wa`: `[m, c]`; `bias_a`, `clamp_a`, `post_a` (called only
    /// without a clamp): as the pointwise conv's group applies them. `g`: the depthwise
    /// conv (`m` channels of `h × w`, finite weights `wb`); `clamp_b`, `post_b` likewise.
    /// `out` (`m·oh·ow`) receives the depthwise output.
    /// Each value is computed by the same kernels, in the same order, as the two convs
    /// unfused ([`super::conv_float`]'s per-row bias and clamp after gemm, [`plane`] or
    /// [`s2_plane`] per output row). Channels are split over threads, each thread
    /// banding its own. Returns false (nothing written) where no row kernel applies:
    /// not AVX-512, other kernel sizes, dilation, small planes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pw_dw(
        x: &[f32],
        c: usize,
        wa: &[f32],
        bias_a: Option<&[f32]>,
        clamp_a: Option<(f32, f32, bool)>,
        post_a: Option<Post>,
        g: &Geo,
        wb: &[f32],
        bias_b: Option<&[f32]>,
        clamp_b: Clamp,
        post_b: Option<Post>,
        out: &mut [f32],
        seen: [Option<&AtomicU32>; 2],
    ) -> super::KResult<bool> {
        use rayon::prelude::*;
        // The dw kernels take the largest |y| before the clamp when asked to.
        let clamp_b = Clamp {
            track: seen[1].is_some(),
            ..clamp_b
        };
        let (h, w, m) = (g.sp[0], g.sp[1], g.m);
        let (oh, ow) = (g.osp[0], g.osp[1]);
        let (k, s) = (g.ks[0], g.strides[0]);
        let square = g.ks[1] == k && g.strides[1] == s && g.dil.iter().all(|&d| d == 1);
        if best_isa() != Some(Isa::Avx512) || !square || ow <= 8 || h * w <= 1024 {
            return Ok(false);
        }
        let kern = match (s, k) {
            (1, 3) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<3>),
            (1, 5) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<5>),
            (1, 7) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<7>),
            (2, 3 | 5) => match flat_plan(g) {
                Some(f) => RowKernel::S2(f, if k == 3 { s2_plane::<3> } else { s2_plane::<5> }),
                None => return Ok(false),
            },
            _ => return Ok(false),
        };
        let (hw, op, kk) = (h * w, oh * ow, k * k);
        debug_assert!(x.len() == c * hw && out.len() == m * op);
        let pt = g.pads[0].0;
        // Output rows whose window rows are all below `r1` (all rows at the bottom).
        let ready = |r1: usize| {
            if r1 == h {
                oh
            } else if r1 + pt >= k {
                ((r1 + pt - k) / s + 1).min(oh)
            } else {
                0
            }
        };
        let nt = if super::super::par_worth(m * hw) {
            rayon::current_num_threads().min(m)
        } else {
            1
        };
        let per = m.div_ceil(nt);
        let chunk = |(t, out): (usize, &mut [f32])| -> super::KResult<()> {
            let (m0, mc) = (t * per, out.len() / op);
            // A window of `cap` rows per channel holds the pointwise output from image row
            // `base` on: each band is computed below the rows kept, and after the depthwise
            // rows it completes, the rows later outputs still read (fewer than `k`) move to
            // the top. The window stays in this thread's L2 and is never written out whole.
            let band = (BAND_BYTES / (mc * w * 4)).max(k + s);
            let cap = band + k;
            super::with_col::<f32, _>(mc * cap * w, |win| -> super::KResult<()> {
                let (mut done, mut base) = (0, 0);
                for r0 in (0..h).step_by(band) {
                    let r1 = (r0 + band).min(h);
                    debug_assert!(base <= r0 && r1 - base <= cap);
                    let a = super::View {
                        data: wa,
                        off: m0 * c,
                        rs: c,
                        cs: 1,
                    };
                    let b = super::View {
                        data: x,
                        off: r0 * w,
                        rs: hw,
                        cs: 1,
                    };
                    // SAFETY: rows i < mc, columns [(r0 - base)·w, (r1 - base)·w) of the
                    // window's `cap·w` per channel, inside `win`.
                    unsafe {
                        super::gemm_uninit_ptr(
                            mc,
                            (r1 - r0) * w,
                            c,
                            a,
                            b,
                            win.as_mut_ptr().add((r0 - base) * w),
                            (cap * w, 1),
                            false,
                            false,
                        )?;
                    }
                    for i in 0..mc {
                        let at = i * cap * w;
                        let seg = &mut win[at + (r0 - base) * w..at + (r1 - base) * w];
                        let bits = super::bias_clamp(
                            seg,
                            bias_a.map(|b| b[m0 + i]),
                            clamp_a,
                            seen[0].is_some(),
                        );
                        if let Some(sa) = seen[0] {
                            sa.fetch_max(bits, Ordering::Relaxed);
                        }
                        if let Some(p) = post_a {
                            p(seg);
                        }
                    }
                    let hi = ready(r1);
                    for i in 0..mc {
                        if hi == done {
                            break;
                        }
                        // Image row 0 of channel i's window (outside it for base > 0: only
                        // the rows in [base, r1) are read, by the readiness rule).
                        let src = win[i * cap * w..].as_ptr().wrapping_sub(base * w);
                        let dst = &mut out[i * op..(i + 1) * op];
                        let wt = &wb[(m0 + i) * kk..(m0 + i + 1) * kk];
                        let b = bias_b.map_or(0.0, |b| b[m0 + i]);
                        // SAFETY: AVX-512F checked above; output rows done..hi read image
                        // rows in [done·s − pt, hi·s − pt + k) ∩ [0, h), all in [base, r1)
                        // (`ready`, and `base` below), so inside the window; they write
                        // rows done..hi of `dst`.
                        let bits = unsafe {
                            match &kern {
                                RowKernel::Rows(p, f) => f(p, src, wt, b, clamp_b, dst, done..hi),
                                RowKernel::S2(f, k) => k(f, src, wt, b, clamp_b, dst, done..hi),
                            }
                        };
                        if let Some(sb) = seen[1] {
                            sb.fetch_max(bits, Ordering::Relaxed);
                        }
                        if let Some(p) = post_b {
                            p(&mut dst[done * ow..hi * ow]);
                        }
                    }
                    done = hi;
                    // Keep the rows from the next output row's window on.
                    let keep = (done * s).saturating_sub(pt).clamp(base, r1);
                    if keep > base {
                        for i in 0..mc {
                            let at = i * cap * w;
                            win.copy_within(at + (keep - base) * w..at + (r1 - base) * w, at);
                        }
                        base = keep;
                    }
                }
                Ok(())
            })
        };
        if nt > 1 {
            out.par_chunks_mut(per * op)
                .enumerate()
                .try_for_each(chunk)?;
        } else {
            out.chunks_mut(per * op).enumerate().try_for_each(chunk)?;
        }
        Ok(true)
    }

    /// [`run_with`] at the best ISA, for finite weights only (`conv_post` checks them).
    pub(super) fn run(
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        g: &Geo,
        post: Post,
        clamp: Clamp,
        seen: Option<&AtomicU32>,
    ) -> Option<Vec<f32>> {
        run_with(best_isa()?, true, x, w, bias, g, post, clamp, seen)
    }
}

#[allow(clippy::too_many_arguments)]
fn conv_float<
    T: GemmElem + Elem + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
>(
    x: &[T],
    w: &[T],
    bias: Option<Vec<T>>,
    g: &Geo,
    post: &(dyn Fn(&mut [T]) + Sync),
    clamp: Option<(T, T, bool)>,
    seen: Option<&AtomicU32>,
    res: Option<Residual<T>>,
) -> KResult<Vec<T>> {
    let p: usize = g.osp.iter().product();
    // Depthwise directly only with finite weights: it skips the taps in the padding, where
    // ONNX's zero padding gives `inf · 0 = NaN` (onnxruntime does; im2col below does too).
    // (Checked last: only depthwise convs read their weights for it.)
    if g.depthwise_2d() && res.is_none() && w.iter().all(|&v| v * T::ZERO == T::ZERO) {
        let mut out = depthwise_2d(x, w, bias.as_deref(), g);
        if p > 0 {
            fill_chunks(&mut out, p, |_, plane| post(plane));
        }
        return Ok(out);
    }
    // A 2-D 1×1 kernel with a stride above 1 and no padding reads every s-th pixel only:
    // those are gathered once into [N, C, OH, OW] and the conv runs as a plain product on
    // them. (im2col copied the same values per row block, and gemm packed the weights
    // again for each block: ResNet's strided 1×1 shortcuts ran at 70% of the speed of
    // their stride-1 siblings.) The same products, so the same values.
    if g.sp.len() == 2 && g.ks == [1, 1] && g.pads == [(0, 0); 2] && !g.direct() {
        let (h, w_in) = (g.sp[0], g.sp[1]);
        let (oh, ow) = (g.osp[0], g.osp[1]);
        let (sh, sw) = (g.strides[0], g.strides[1]);
        let planes = g.n * g.c;
        return with_scratch(&PHASES, planes * oh * ow, |xs: &mut [T]| {
            for (src, dst) in x.chunks_exact(h * w_in).zip(xs.chunks_exact_mut(oh * ow)) {
                for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
                    let line = &src[oy * sh * w_in..];
                    for (ox, v) in row.iter_mut().enumerate() {
                        *v = line[ox * sw];
                    }
                }
            }
            let g1 = Geo {
                sp: g.osp.clone(),
                strides: vec![1, 1],
                ks: g.ks.clone(),
                osp: g.osp.clone(),
                pads: g.pads.clone(),
                dil: g.dil.clone(),
                ..*g
            };
            conv_float(xs, w, bias, &g1, post, clamp, seen, res)
        });
    }
    let cg = g.c / g.groups;
    let mg = g.m / g.groups;
    let ksz: usize = g.ks.iter().product();
    let kk = cg * ksz;
    let plane: usize = g.sp.iter().product();
    let total = g.n * g.m * p;
    if let Some(r) = res.as_ref().filter(|r| r.len() != total) {
        return invalid(format!(
            "conv: a residual of {} values for an output of {total}",
            r.len()
        ));
    }
    // A residual whose buffer the conv takes: the products accumulate onto it (gemm reads
    // each tile of it as it writes the tile). A read residual: added in the bias pass.
    let acc = matches!(res, Some(Residual::Into(_)));
    let (mut out, read): (Vec<T>, Option<&[T]>) = match res {
        Some(Residual::Into(v)) => (v, None),
        Some(Residual::Read(r)) => (crate::buffers::take(total), Some(r)),
        None => (crate::buffers::take(total), None),
    };
    if total == 0 {
        return Ok(out);
    }
    let direct = g.direct();
    // 2-D convs run in blocks of whole output rows (CONV_BLOCK_BYTES of column matrix and
    // output): the column matrix is a block, not the whole image, and bias and `post` run
    // on each block as gemm leaves it.
    let (oh, ow) = if g.sp.len() == 2 {
        (g.osp[0], g.osp[1])
    } else {
        (1, p)
    };
    let per_col = (mg + if direct { 0 } else { kk }) * std::mem::size_of::<T>();
    let mut rows = if g.sp.len() == 2 {
        (CONV_BLOCK_BYTES / per_col.max(1) / ow.max(1)).clamp(1, oh)
    } else {
        1
    };
    let threads = rayon::current_num_threads();
    let flops = g.n * g.m * p * kk;
    let images = g.n * g.groups;
    // With several threads, a 2-D conv that runs in several blocks gets blocks of near-equal
    // rows, about a multiple of the thread count of them (`rows = ceil(oh / nb)` for `nb`
    // the block count rounded up to that multiple; the rounding can leave fewer blocks and
    // a shorter last one), so that the threads get near-equal rows: 5 blocks of 22 rows and
    // one of 2 (ResNet's stem, 112 rows) left one thread 66 rows and the other 46; now 5 of
    // 19 and one of 17 (57/55). Not when a block would drop under PAR_MIN_COLS pixels (the
    // blocks stay as they were). A conv in one block stays one: gemm splits it, and a row
    // block's `post` runs per output channel.
    let nb0 = oh.div_ceil(rows);
    if threads > 1 && g.sp.len() == 2 && flops >= GEMM_PAR_FLOPS && nb0 > 1 {
        let nb = nb0.div_ceil(threads) * threads;
        let r = oh.div_ceil(nb).max(1);
        if r * ow >= PAR_MIN_COLS {
            rows = r;
        }
    }
    // A conv in one block below GEMM_PAR_FLOPS, whose product gemm would run on one thread,
    // gets one block of rows per thread instead; a 1×1 conv whose rows would be too short
    // for that, a range of output channels per thread.
    let small = (CONV_SPLIT_FLOPS..GEMM_PAR_FLOPS).contains(&flops);
    let mut mparts = 1;
    if threads > 1 && g.sp.len() == 2 && small && nb0 == 1 {
        let r = oh.div_ceil(threads);
        if r * ow >= PAR_MIN_COLS {
            rows = r;
        } else if direct && mg >= 16 {
            mparts = threads.min(mg / 8);
        }
    }
    // Output channels per part, a multiple of 8 (gemm's vector side).
    let mc = mg.div_ceil(mparts).div_ceil(8) * 8;
    let mparts = mg.div_ceil(mc);
    let nblk = oh.div_ceil(rows);
    let tasks = images * nblk * mparts;
    // Blocks in parallel (each product on one thread) when there are enough of them and
    // enough work; else blocks in order, each product free to use the pool.
    let par_blocks = threads > 1 && tasks >= threads && (flops >= GEMM_PAR_FLOPS || small);
    // `out` has `total` elements of capacity (initialized with `acc`, else length 0).
    let dst = SendPtr(out.as_mut_ptr());
    let task = |t: usize| -> KResult<()> {
        let (t, mp) = (t / mparts, t % mparts);
        let (m0, m1) = (mp * mc, ((mp + 1) * mc).min(mg));
        let (ni, gi, b) = (t / (g.groups * nblk), (t / nblk) % g.groups, t % nblk);
        let (oy0, oy1) = (b * rows, ((b + 1) * rows).min(oh));
        let (j0, pb) = (oy0 * ow, (oy1 - oy0) * ow);
        let xoff = (ni * g.c + gi * cg) * plane;
        let xs = &x[xoff..xoff + cg * plane];
        let wv = View {
            data: w,
            off: (gi * mg + m0) * kk,
            rs: kk,
            cs: 1,
        };
        let ooff = (ni * g.m + gi * mg + m0) * p + j0;
        let dst = &dst;
        // `post` per output-channel row (a block of part planes, or planes large enough to
        // be worth a call each), else once over the block's whole planes.
        let post_rows = clamp.is_none() && (pb < p || p >= POST_ROW_MIN);
        let post_block = clamp.is_none() && !post_rows;
        let run = |bview: View<T>| -> KResult<()> {
            // SAFETY: task t writes rows (ni*m + gi*mg + i)*p + [j0, j0 + pb) for i in
            // m0..m1, inside [0, total); distinct tasks write distinct (row, column) ranges.
            unsafe {
                gemm_uninit_ptr(
                    m1 - m0,
                    pb,
                    kk,
                    wv,
                    bview,
                    dst.0.add(ooff),
                    (p, 1),
                    !par_blocks,
                    acc,
                )?;
            }
            let row = |i: usize| {
                // SAFETY: this task's row segment, written just above (now initialized).
                let seg = unsafe { std::slice::from_raw_parts_mut(dst.0.add(ooff + i * p), pb) };
                let mut b = bias.as_ref().map(|b| b[gi * mg + m0 + i]);
                if let Some(r) = read {
                    let at = ooff + i * p;
                    add_bias_residual(seg, b.take(), &r[at..at + pb]);
                }
                let bits = bias_clamp(seg, b, clamp, seen.is_some());
                if let Some(s) = seen {
                    s.fetch_max(bits, Ordering::Relaxed);
                }
                if post_rows {
                    post(seg);
                }
            };
            // Blocks run one after another: split this block's rows over the pool.
            let nm = m1 - m0;
            let split = !par_blocks && super::par_worth(nm * pb);
            if split {
                use rayon::prelude::*;
                (0..nm).into_par_iter().for_each(row);
            } else {
                (0..nm).for_each(row);
            }
            if post_block {
                // Whole planes: the task's rows are one run (short rows cost `post` calls).
                // SAFETY: rows ooff + [0, nm*p) are this task's, written above.
                let run = unsafe { std::slice::from_raw_parts_mut(dst.0.add(ooff), nm * p) };
                if split {
                    fill_chunks(run, 8192, |_, c| post(c));
                } else {
                    post(run);
                }
            }
            Ok(())
        };
        if direct {
            run(View {
                data: xs,
                off: j0,
                rs: p,
                cs: 1,
            })
        } else {
            with_col(kk * pb, |col: &mut [T]| {
                if g.sp.len() == 2 {
                    im2col_2d(xs, g, col, (oy0, oy1));
                } else {
                    im2col(xs, g, cg, col);
                }
                run(View {
                    data: &*col,
                    off: 0,
                    rs: pb,
                    cs: 1,
                })
            })
        }
    };
    let _pack = (!direct).then(ConvLhsPacking::set);
    if par_blocks {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().try_for_each(task)?;
    } else {
        (0..tasks).try_for_each(task)?;
    }
    // SAFETY: the tasks wrote every (image, group, block) range: rows (ni*m + gi*mg + i)*p
    // + [oy0*ow, oy1*ow) over all blocks tile [0, total).
    unsafe { out.set_len(total) };
    Ok(out)
}

/// A 2-D f32 conv with one group, dilation 1, the same stride (1 or 2) on both axes and a
/// kernel larger than 1×1 through the direct kernel ([`super::dconv`]), with the bias and
/// activation applied per output channel as [`conv_float`] applies them. None, with
/// nothing computed, for other convs, or without AVX-512.
#[allow(clippy::too_many_arguments)]
fn conv_direct_f32(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    g: &Geo,
    post: Post,
    clamp: Option<(f32, f32, bool)>,
    seen: Option<&AtomicU32>,
    res: Option<&[f32]>,
) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        let fits = g.sp.len() == 2
            && g.groups == 1
            && g.dil == [1, 1]
            && g.strides[0] == g.strides[1]
            && (1..=2).contains(&g.strides[0])
            && g.ks[0] * g.ks[1] > 1
            // Tiles are 48 positions of padded rows: on small planes most of the last
            // tile is waste (ResNet's 512-channel 3×3 stride 2 at 7²: 56 positions in two
            // tiles, 1487 µs against im2col's 1375 in the model).
            && g.osp[0] * (g.osp[1] + (g.ks[1] - 1) / g.strides[0]) >= DCONV_MIN_POSITIONS
            && super::dconv::enabled();
        if !fits {
            return None;
        }
        let d = super::dconv::Dims {
            c: g.c,
            h: g.sp[0],
            w: g.sp[1],
            m: g.m,
            kh: g.ks[0],
            kw: g.ks[1],
            s: g.strides[0],
            pt: g.pads[0].0,
            pl: g.pads[1].0,
            oh: g.osp[0],
            ow: g.osp[1],
        };
        let mut out = crate::buffers::overwritten::<f32>(g.n * g.m * d.oh * d.ow);
        // The bias is the sums' start. A clamp without NaN canonicalization and without a
        // scan is applied in registers; else it (and the scan) take a pass per block.
        // A residual is added before the clamp, so then the clamp takes the pass too.
        let in_regs = clamp
            .filter(|c| !c.2 && seen.is_none() && res.is_none())
            .map(|c| (c.0, c.1));
        let base = out.as_ptr() as usize;
        let epi = |_: usize, seg: &mut [f32]| {
            if in_regs.is_some() {
                return;
            }
            if let Some(r) = res {
                // `seg` lies in `out`: its offset there is the residual's.
                let at = (seg.as_ptr() as usize - base) / std::mem::size_of::<f32>();
                add_bias_residual(seg, None, &r[at..at + seg.len()]);
            }
            let bits = bias_clamp(seg, None, clamp, seen.is_some());
            if let Some(s) = seen {
                s.fetch_max(bits, Ordering::Relaxed);
            }
            if clamp.is_none() {
                post(seg);
            }
        };
        let ok = with_scratch(&PHASES, d.phase_len(), |ph: &mut [f32]| {
            super::dconv::conv(g.n, x, w, bias, in_regs, &d, &mut out, ph, &epi)
        });
        if ok {
            return Some(out);
        }
        crate::buffers::give(TensorData::F32(out));
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, bias, g, post, clamp, seen, res);
        None
    }
}

/// The largest |bias| with which a [`Residual::Into`] accumulates onto `r` before the
/// bias (see [`conv_post`]).
const BIAS_BEFORE_RESIDUAL: f32 = 18446744073709551616.0; // 2^64

/// A fused conv's residual operand `r` ([`conv_post`]). Values differ from the unfused
/// `Add(conv, r)` by rounding only, in the order of the sums.
pub(crate) enum Residual<'a, T = f32> {
    /// Read: `(conv + bias) + r`, added in the pass that adds the bias, as the unfused ops
    /// round it.
    Read(&'a [T]),
    /// A buffer (`r`'s values) the conv takes for its output: gemm's products accumulate
    /// onto it as it writes each tile, `(conv + r) + bias`, and no pass reads `r` again.
    /// The direct kernel reads it as [`Residual::Read`] and gives it back to the pool, and
    /// so does a conv with a bias above 2^64 in magnitude (the orders could then overflow
    /// in different places).
    Into(Vec<T>),
}

impl<T> Residual<'_, T> {
    fn values(&self) -> &[T] {
        match self {
            Residual::Read(r) => r,
            Residual::Into(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.values().len()
    }
}

/// `seg[j] = (seg[j] + b) + r[j]` (the bias, if any, then the residual `r`, in the unfused
/// ops' order: the conv's Add of its bias, then the graph's Add of the residual).
fn add_bias_residual<T: Copy + std::ops::Add<Output = T>>(seg: &mut [T], b: Option<T>, r: &[T]) {
    match b {
        Some(b) => seg.iter_mut().zip(r).for_each(|(v, &r)| *v = (*v + b) + r),
        None => seg.iter_mut().zip(r).for_each(|(v, &r)| *v = *v + r),
    }
}

/// One output row's bias `b` and activation `clamp` (`(lo, hi, nan_out)` of a [`Clamp`]),
/// in one pass: `maxps(lo, ·)` then `minps(hi, ·)` as scalar expressions, a NaN kept or,
/// with `nan_out`, made the canonical NaN. Each case is its own loop of selects with no
/// branch out of it, so each vectorizes.
///
/// With `track` and a clamp, returns the largest |v + b| bits before the clamp (as
/// [`super::wide::max_abs_bits`] gives them; `u32::MAX`, which reads as "not finite", for a
/// dtype other than f32); else 0.
fn bias_clamp<T: Elem + PartialOrd + std::ops::Add<Output = T>>(
    seg: &mut [T],
    b: Option<T>,
    clamp: Option<(T, T, bool)>,
    track: bool,
) -> u32 {
    let Some((lo, hi, nan_out)) = clamp else {
        if let Some(b) = b {
            map_inplace(seg, |v| v + b);
        }
        return 0;
    };
    if track && super::wide::is_f32::<T>() {
        // T is f32: these conversions are exact. No bias adds -0, which changes no value.
        let f = |x: T| x.to_f64() as f32;
        let seg = super::wide::as_f32_mut(seg);
        return super::wide::bias_clamp_bits(seg, b.map_or(-0.0, f), f(lo), f(hi), nan_out);
    }
    let clamp = move |v: T| {
        let t = if lo > v { lo } else { v };
        if hi < t {
            hi
        } else {
            t
        }
    };
    match (b, nan_out) {
        (Some(b), false) => map_inplace(seg, |v| clamp(v + b)),
        (None, false) => map_inplace(seg, clamp),
        (b, true) => {
            let nan = T::from_f64(f64::NAN);
            // `move`: captured by reference, `nan` was read through a gather.
            #[allow(clippy::eq_op)] // t != t: NaN
            map_inplace(seg, move |v| {
                let t = match b {
                    Some(b) => v + b,
                    None => v,
                };
                let c = clamp(t);
                if t != t {
                    nan
                } else {
                    c
                }
            })
        }
    }
    if track {
        u32::MAX
    } else {
        0
    }
}

/// Target bytes of one conv block's column matrix plus output. Smaller blocks lost more to
/// gemm's per-call setup than they gained in cache (1 thread, best of 3: efficientnet_b0
/// 10.3 / 9.0 / 8.5 / 8.5 ms at 128 KB / 512 KB / 2 MB / unblocked; resnet50 42.2 / 40.5 /
/// 40.9 ms at 512 KB / 2 MB / unblocked).
const CONV_BLOCK_BYTES: usize = 2 << 20;

/// Plane size from which a conv's `post` (an activation that is not a clamp: SiLU, GELU)
/// runs on each output channel's row right after its bias, while the row is in cache,
/// instead of over the whole block after every row's bias.
const POST_ROW_MIN: usize = 1024;

/// Fewest output pixels per row block when [`conv_float`] evens out a conv's row blocks for
/// several threads: below this, gemm's product over a block's few columns loses more than
/// the balance gains, and the conv keeps its [`CONV_BLOCK_BYTES`] blocks.
const PAR_MIN_COLS: usize = 192;

/// Fewest output positions (rows times padded row length) for which [`conv_direct_f32`]
/// takes a conv; below, im2col + gemm.
const DCONV_MIN_POSITIONS: usize = 192;

/// Fewest multiply-adds for which [`conv_float`] splits a conv in one row block over the
/// threads (below [`GEMM_PAR_FLOPS`], gemm runs its product on one thread).
pub(crate) const CONV_SPLIT_FLOPS: usize = 1 << 20;

/// gemm's packing threshold for its left operand on one thread, while an im2col conv's or
/// a Winograd conv's products run (`gemm::set_lhs_packing_threshold_single_thread`, in
/// units of its micro-kernel's column count, 6). gemm computes an im2col conv's product
/// transposed, its left operand the im2col matrix, and copies that into packed panels once
/// the output has more than 8 × 6 = 48 channels; 16 leaves up to 96 output channels
/// unpacked. Against gemm's default (8), interleaved, best of 3 medians, 1 thread:
/// resnet50 -3.9%, resnet18 -4.0%, squeezenet -4.4%, efficientnet_b0 -2.1%, mobilenet_v2
/// +-0 (2 threads: -0.6 to -3%). Setting it for the Winograd products alone, or for 1×1
/// convs too, read within 2% of this. MatMul keeps the default: bert and gpt2 ran 2-3%
/// slower at 16.
const CONV_LHS_PACKING: usize = 16;

/// Sets gemm's single-thread lhs packing threshold to [`CONV_LHS_PACKING`] until dropped.
/// The setting is process-wide, so guards on several threads (several executors) share it:
/// the first to start saves the value before and sets [`CONV_LHS_PACKING`], the last to end
/// puts the saved value back. A product running meanwhile outside a conv (another
/// executor's MatMul) gets the conv's threshold, which changes its speed, not its values.
pub(super) struct ConvLhsPacking(());

/// Guards alive, and the threshold saved by the first.
static CONV_LHS_ACTIVE: std::sync::Mutex<(usize, usize)> = std::sync::Mutex::new((0, 0));

impl ConvLhsPacking {
    pub(super) fn set() -> ConvLhsPacking {
        let mut a = CONV_LHS_ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        if a.0 == 0 {
            a.1 = gemm::get_lhs_packing_threshold_single_thread();
            gemm::set_lhs_packing_threshold_single_thread(CONV_LHS_PACKING);
        }
        a.0 += 1;
        ConvLhsPacking(())
    }
}

impl Drop for ConvLhsPacking {
    fn drop(&mut self) {
        let mut a = CONV_LHS_ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        a.0 -= 1;
        if a.0 == 0 {
            gemm::set_lhs_packing_threshold_single_thread(a.1);
        }
    }
}

/// A raw output pointer shared by a kernel's tasks (each writes its own ranges: conv's
/// blocks, Winograd's slabs).
pub(super) struct SendPtr<T>(pub(super) *mut T);
// SAFETY: the tasks write disjoint element ranges through it (see conv_float).
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    pub(super) fn get(&self) -> *mut T {
        self.0
    }
}

/// `Op::Conv` (ONNX Conv): x [N, C, *sp], w [M, C/groups, *k], optional bias [M];
/// output [N, M, *osp] with `osp = (sp + pad_b + pad_e - dil*(k-1) - 1) / stride + 1`.
pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
) -> KResult<Tensor> {
    conv_post(x, w, bias, a, out, &no_post, None, None, None)
}

/// [`conv`], then `post` on each f32 output plane while it is in cache (a fused group's
/// activation; see `crate::fuse`). Other dtypes ignore `post`. `clamp`, when given, must
/// be the same map as `post`: the f32 kernels then apply it instead of calling `post` (the
/// depthwise kernel in registers before each store, the im2col/gemm path in the same pass
/// as the bias); the Winograd path calls `post`.
///
/// `seen` is for the NaN scan of a fused group, which needs each value before the
/// activation: with a `clamp`, the kernels that apply it fold the largest |y| bits before
/// it (as [`super::wide::max_abs_bits`] gives them) into `seen` in the same pass; the others
/// call `post`, which must then take that figure itself.
///
/// `res`: a residual (f32, as many values as the output, laid out as it) added to each
/// output value before `clamp`/`post` ([`Residual`]; a ResNet shortcut fused into the conv,
/// see `crate::fuse::Residual`). Not with `seen`. Error: `res` of another length, or an
/// input that is not f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_post(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    post: Post,
    clamp: Option<Clamp>,
    seen: Option<&AtomicU32>,
    res: Option<Residual>,
) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let g = geometry(x.dims(), w.dims(), a, &od)?;
    if let Some(r) = &res {
        if r.len() != od.iter().product::<usize>() || x.dtype() != rlx_ir::DType::F32 {
            return invalid(format!(
                "conv: a residual of {} f32 values does not fit the output {od:?} ({})",
                r.len(),
                x.dtype()
            ));
        }
    }
    if let Some(b) = bias {
        if b.numel() != g.m {
            return invalid(format!(
                "conv: bias has {} elements, expected {}",
                b.numel(),
                g.m
            ));
        }
    }
    if x.dtype() != w.dtype() {
        return invalid(format!("conv: x is {} but w is {}", x.dtype(), w.dtype()));
    }
    use TensorData as D;
    let data = match (x.data(), w.data()) {
        (D::F32(xv), D::F32(wv)) => {
            let b: Option<Vec<f32>> = bias.map(|b| values_as(b.data()));
            // `(conv + r) + b` against the unfused `(conv + b) + r`: with every |b| at most
            // 2^64, far below half a unit in the last place at f32::MAX (2^103), the two can
            // overflow differently only by a last-place rounding there. A larger (or
            // non-finite) bias goes first, the unfused order: `r` is then read.
            let spare;
            let res = match res {
                Some(Residual::Into(v))
                    if b.iter()
                        .flatten()
                        .any(|x| x.is_nan() || x.abs() > BIAS_BEFORE_RESIDUAL) =>
                {
                    spare = v;
                    Some(Residual::Read(&spare))
                }
                r => r,
            };
            // The depthwise kernels skip taps in the padding; with a non-finite weight the
            // definition's `inf · 0 = NaN` there matters, so such a conv takes im2col.
            let dw =
                g.depthwise_2d() && res.is_none() && super::wide::max_abs_bits(wv) < 0x7f80_0000;
            // Planes below POST_MIN_RUN elements take `post` in one pass after the conv
            // (per-plane calls cost more than the cache they save there).
            let p: usize = g.osp.iter().product();
            let per_plane = p >= POST_MIN_RUN;
            let dw_post = if per_plane && clamp.is_none() {
                post
            } else {
                &no_post
            };
            let dw_clamp = clamp.unwrap_or(Clamp::NONE);
            match dw
                .then(|| {
                    let seen = seen.filter(|_| clamp.is_some());
                    depthwise_2d_f32(xv, wv, b.as_deref(), &g, dw_post, dw_clamp, seen)
                })
                .flatten()
            {
                Some(mut o) => {
                    if !per_plane && clamp.is_none() {
                        fill_chunks(&mut o, 8192, |_, c| post(c));
                    }
                    D::F32(o)
                }
                None => {
                    let c = clamp.map(|c| (c.lo, c.hi, c.nan_out));
                    let seen = seen.filter(|_| c.is_some());
                    let read = res.as_ref().map(|r| r.values());
                    if let Some(o) = conv_direct_f32(xv, wv, b.as_deref(), &g, post, c, seen, read)
                    {
                        if let Some(Residual::Into(v)) = res {
                            crate::buffers::give(D::F32(v));
                        }
                        return make(od, D::F32(o));
                    }
                    D::F32(conv_float(
                        xv,
                        wv,
                        b,
                        &g,
                        post,
                        c,
                        seen.filter(|_| c.is_some()),
                        res,
                    )?)
                }
            }
        }
        (D::F64(xv), D::F64(wv)) => {
            let b = bias.map(|b| values_as(b.data()));
            D::F64(conv_float(
                xv,
                wv,
                b,
                &g,
                &|_: &mut [f64]| {},
                None,
                None,
                None,
            )?)
        }
        (D::F16(_), D::F16(_)) | (D::BF16(_), D::BF16(_)) => {
            let xv = x.data().to_f32_vec();
            let wv = w.data().to_f32_vec();
            let b = bias.map(|b| values_as(b.data()));
            let r = conv_float(&xv, &wv, b, &g, &no_post, None, None, None)?;
            if x.dtype() == rlx_ir::DType::F16 {
                D::F16(r.into_iter().map(f16::from_f32).collect())
            } else {
                D::BF16(r.into_iter().map(bf16::from_f32).collect())
            }
        }
        (d, _) => return invalid(format!("conv: unsupported dtype {}", d.dtype())),
    };
    make(od, data)
}

/// A fused group's activation as a conv kernel takes it: a clamp applied in registers, or
/// (None) a [`Post`] pass over each output run.
pub(crate) type Act<'a> = (Option<Clamp>, Post<'a>);

/// The pointwise conv `a` (1×1, stride 1, no padding, one group, dilation 1; weights `wa`
/// `[M, C, 1, 1]`, bias `ba` `[M]`) on one f32 image `x` `[1, C, H, W]`, then the depthwise
/// conv `b` (`M` groups; weights `wb` `[M, 1, k, k]`, all finite, bias `bb`) on its output,
/// interleaved by bands of rows (`dw_simd::pw_dw`) so that the depthwise conv reads the
/// pointwise output from L2. `act_a`, `act_b`: each conv's activation, as [`conv_post`]
/// applies it. Returns the depthwise conv's output `[1, M, OH, OW]` (`out_b`), the same
/// bits as the two convs run one after the other; None, with nothing computed, where the
/// interleaved path does not apply (another shape, dtype or kernel; no AVX-512; planes of
/// 1024 pixels or fewer, which stay in L2 anyway).
///
/// # Errors
/// A shape that does not fit its conv (as [`conv`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pw_dw(
    x: &Tensor,
    (wa, ba, attrs_a, out_a, act_a): (&Tensor, Option<&Tensor>, &ConvAttrs, &Shape, Act),
    (wb, bb, attrs_b, out_b, act_b): (&Tensor, Option<&Tensor>, &ConvAttrs, &Shape, Act),
    seen: [Option<&AtomicU32>; 2],
) -> KResult<Option<Tensor>> {
    #[cfg(target_arch = "x86_64")]
    {
        use TensorData as D;
        let od_a = out_dims(out_a)?;
        let od_b = out_dims(out_b)?;
        let ga = geometry(x.dims(), wa.dims(), attrs_a, &od_a)?;
        let gb = geometry(&od_a, wb.dims(), attrs_b, &od_b)?;
        let pointwise = ga.n == 1 && ga.sp.len() == 2 && ga.groups == 1 && ga.direct();
        let depthwise = gb.depthwise_2d();
        fn f32s(b: Option<&Tensor>, n: usize) -> Option<Option<&[f32]>> {
            match b.map(|b| b.data()) {
                None => Some(None),
                Some(TensorData::F32(v)) if v.len() == n => Some(Some(v.as_slice())),
                _ => None,
            }
        }
        fn post<'a>(a: Act<'a>) -> Option<Post<'a>> {
            a.0.is_none().then_some(a.1)
        }
        let (D::F32(xv), D::F32(wav), D::F32(wbv), Some(bav), Some(bbv)) = (
            x.data(),
            wa.data(),
            wb.data(),
            f32s(ba, ga.m),
            f32s(bb, gb.m),
        ) else {
            return Ok(None);
        };
        if !pointwise || !depthwise || super::wide::max_abs_bits(wbv) >= 0x7f80_0000 {
            return Ok(None);
        }
        let op = gb.osp[0] * gb.osp[1];
        let mut out = crate::buffers::overwritten::<f32>(gb.m * op);
        let ok = dw_simd::pw_dw(
            xv,
            ga.c,
            wav,
            bav,
            act_a.0.map(|c| (c.lo, c.hi, c.nan_out)),
            post(act_a),
            &gb,
            wbv,
            bbv,
            act_b.0.unwrap_or(Clamp::NONE),
            post(act_b),
            &mut out,
            seen,
        )?;
        if !ok {
            crate::buffers::give(D::F32(out));
            return Ok(None);
        }
        make(od_b, D::F32(out)).map(Some)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (
            x, wa, ba, attrs_a, out_a, act_a, wb, bb, attrs_b, out_b, act_b, seen,
        );
        Ok(None)
    }
}

/// Winograd weights for `Op::Conv` with weights `w`, attributes `a` and output type `out`,
/// when the conv is one the Winograd path handles ([`super::winograd`]): f32, 2-D, 3×3,
/// stride 1, dilation 1, one group, at least [`WINOGRAD_MIN_CH`] input and output channels
/// (below that the transforms cost more than the product saves), and an output for which
/// [`winograd_pays`].
pub(crate) fn winograd_weights(w: &Tensor, a: &ConvAttrs, out: &Shape) -> Option<WinogradWeights> {
    let wd = w.dims();
    let pays = match out.static_dims().as_deref() {
        Some(&[n, _, oh, ow]) if wd.len() == 4 => winograd_pays(wd[0], wd[1], n, oh, ow),
        _ => true,
    };
    let ok = wd.len() == 4
        && wd[2] == 3
        && wd[3] == 3
        && a.groups <= 1
        && a.strides.iter().all(|&s| s == 1)
        && a.dilations.iter().all(|&d| d == 1)
        && wd[0] >= WINOGRAD_MIN_CH
        && wd[1] >= WINOGRAD_MIN_CH
        && pays;
    match w.data() {
        TensorData::F32(v) if ok => WinogradWeights::new(v, wd[0], wd[1]),
        _ => None,
    }
}

/// Whether the Winograd path pays for a conv with `m` output and `c` input channels on `n`
/// images whose output plane is `oh × ow`: not when the batch has fewer than
/// [`WINOGRAD_MIN_TILES`] 2×2 tiles in all and the transformed weights (16·m·c f32, 16/9 of the plain ones) exceed
/// [`WINOGRAD_SMALL_WEIGHTS`]. Each transformed weight is then used only a few times per
/// run, and in a model whose weights do not stay in cache between runs it is read from
/// memory: ResNet-50's 512-channel 3×3 convs at 7² (16 tiles, 16.8 MB transformed) took
/// 3.4-3.5 ms per run through Winograd against 2.2-2.3 through im2col (1 thread, per-node
/// profile, Xeon with AVX-512; alone, where the weights stay in cache, Winograd was
/// ahead, 1.73 against 1.98). At 14² (49 tiles) Winograd stays ahead in the model
/// (1.40-1.48 against 1.69-1.72 ms). Whole models, 3 interleaved pairs, medians: resnet18
/// 28.9-31.3 → 23.7-24.8 ms at 1 thread (min 17.7-18.3 → 15.3-15.7 at 2), resnet50
/// 59.3-62.7 → 56.1-58.6 (min 35.7-36.3 → 34.8-35.3 at 2).
pub(crate) fn winograd_pays(m: usize, c: usize, n: usize, oh: usize, ow: usize) -> bool {
    let tiles = n * oh.div_ceil(2) * ow.div_ceil(2);
    tiles >= WINOGRAD_MIN_TILES || 16 * m * c * 4 <= WINOGRAD_SMALL_WEIGHTS
}

/// See [`winograd_pays`].
pub(crate) const WINOGRAD_MIN_TILES: usize = 32;
/// See [`winograd_pays`]: 1 MiB.
pub(crate) const WINOGRAD_SMALL_WEIGHTS: usize = 1 << 20;

/// Fewest input and output channels for the Winograd path. SqueezeNet's 3×3 convs with
/// 16 input channels ran slower through it than through im2col (1 thread: 4.17 ms with the
/// bound at 32 against 4.27 ms at 16, best of 3 runs).
pub(crate) const WINOGRAD_MIN_CH: usize = 32;

/// [`conv_post`] through the Winograd transform `wg` of `w` (made by [`winograd_weights`]).
/// Falls back to [`conv_post`] when the shapes do not fit `wg`, when the input holds a
/// NaN/Inf or values large enough that a direct partial sum could overflow
/// ([`WinogradWeights::direct_stays_finite`]), or when an output (before `post`) is not
/// finite; so the result's NaN/Inf are always the direct conv's. Errors as [`conv`].
pub(crate) fn conv_winograd(
    x: &Tensor,
    wg: &WinogradWeights,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    post: Post,
) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let g = geometry(x.dims(), w.dims(), a, &od)?;
    let fits = g.sp.len() == 2
        && g.groups == 1
        && g.ks == [3, 3]
        && g.strides == [1, 1]
        && g.dil == [1, 1]
        && g.m == wg.m()
        && g.c == wg.c()
        && bias.is_none_or(|b| b.numel() == g.m && b.dtype() == rlx_ir::DType::F32);
    if let (true, TensorData::F32(xv)) = (fits, x.data()) {
        let b: Option<Vec<f32>> = bias.map(|b| values_as(b.data()));
        let b_max = b.iter().flatten().fold(0f64, |m, v| m.max(v.abs() as f64));
        if !wg.direct_stays_finite(super::wide::max_abs_bits(xv), b_max) {
            return conv_post(x, w, bias, a, out, post, None, None, None);
        }
        let d = winograd::Dims {
            n: g.n,
            h: g.sp[0],
            w: g.sp[1],
            pt: g.pads[0].0,
            pl: g.pads[1].0,
            oh: g.osp[0],
            ow: g.osp[1],
        };
        let ts = g.n * g.osp[0].div_ceil(2) * g.osp[1].div_ceil(2);
        let o = if winograd::slabs_on(g.m, g.c) {
            winograd::conv_slabs(xv, wg, b.as_deref(), d, post)
        } else {
            with_col(16 * g.c * ts, |v: &mut [f32]| {
                winograd::conv(xv, wg, b.as_deref(), d, v, post)
            })
        };
        if let Some(o) = o {
            return make(od, TensorData::F32(o));
        }
    }
    conv_post(x, w, bias, a, out, post, None, None, None)
}

/// Output columns `ox` in `[lo, hi)` whose input column `ox * sw + off - pl` lies inside
/// `[0, w)`, for a kernel tap at offset `off = kx * dilation`, left padding `pl`, stride `sw`
/// and `ow` output columns.
fn inside_cols(off: usize, pl: usize, sw: usize, w: usize, ow: usize) -> (usize, usize) {
    let lo = if off >= pl {
        0
    } else {
        (pl - off).div_ceil(sw)
    };
    let hi = if w + pl > off {
        ((w + pl - off - 1) / sw + 1).min(ow)
    } else {
        0
    };
    (lo.min(hi), hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::DType;

    /// The ONNX Conv definition as a plain loop (2-D, f64): out[n, m, oy, ox] = b[m] +
    /// Σ_{c in group, ky, kx} w[m, c, ky, kx] · x[n, g·cg + c, oy·s + ky·d − p, ...] (zero
    /// outside the image).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        xd: [usize; 4],
        w: &[f32],
        wd: [usize; 4],
        b: &[f32],
        s: usize,
        d: usize,
        p: usize,
        groups: usize,
    ) -> (Vec<f32>, Vec<usize>) {
        let [n, c, h, wi] = xd;
        let [m, cg, kh, kw] = wd;
        let oh = (h + 2 * p - d * (kh - 1) - 1) / s + 1;
        let ow = (wi + 2 * p - d * (kw - 1) - 1) / s + 1;
        let mg = m / groups;
        let mut out = vec![];
        for ni in 0..n {
            for mi in 0..m {
                let gi = mi / mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = b[mi] as f64;
                        for ci in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (oy * s + ky * d) as isize - p as isize;
                                    let ix = (ox * s + kx * d) as isize - p as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                        continue;
                                    }
                                    let xc = gi * cg + ci;
                                    let xv =
                                        x[((ni * c + xc) * h + iy as usize) * wi + ix as usize];
                                    let wv = w[((mi * cg + ci) * kh + ky) * kw + kx];
                                    acc += xv as f64 * wv as f64;
                                }
                            }
                        }
                        out.push(acc as f32);
                    }
                }
            }
        }
        (out, vec![n, m, oh, ow])
    }

    fn check(xd: [usize; 4], wd: [usize; 4], s: usize, d: usize, p: usize, groups: usize) {
        let nx: usize = xd.iter().product();
        let nw: usize = wd.iter().product();
        let x: Vec<f32> = (0..nx)
            .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..nw)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..wd[0]).map(|i| i as f32 * 0.25 - 0.5).collect();
        let (want, od) = naive(&x, xd, &w, wd, &b, s, d, p, groups);
        let xt = Tensor::new(xd.to_vec(), TensorData::F32(x)).unwrap();
        let wt = Tensor::new(wd.to_vec(), TensorData::F32(w)).unwrap();
        let bt = Tensor::new(vec![wd[0]], TensorData::F32(b)).unwrap();
        let a = ConvAttrs {
            strides: vec![s, s],
            pads: vec![(p, p), (p, p)],
            dilations: vec![d, d],
            groups,
        };
        let out = Shape::new(&od, DType::F32);
        let got = conv(&xt, &wt, Some(&bt), &a, &out).unwrap();
        let got = got.data().to_f32_vec();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{i}: {g} vs {w}");
        }
    }

    /// ONNX pads with zeros, so a depthwise conv's infinite weight makes `inf · 0 = NaN`
    /// where its tap falls in the padding, and +inf where it meets an input of 1 (as
    /// onnxruntime and RLX's im2col convs give it; the depthwise kernels skip padding taps,
    /// so such a conv must not take them). f32 and f64, 3×3 (SIMD kernels) and 3×5.
    #[test]
    fn depthwise_conv_with_an_infinite_weight_multiplies_the_padding() {
        for (kh, kw) in [(3, 3), (3, 5)] {
            let (c, h, wd) = (2, 4, 6);
            let mut w = vec![0.5f64; c * kh * kw];
            w[0] = f64::INFINITY; // channel 0, tap (0, 0): reads (oy - 1, ox - kw/2)
            let a = ConvAttrs {
                strides: vec![1, 1],
                pads: vec![(1, 1), (kw / 2, kw / 2)],
                dilations: vec![1, 1],
                groups: c,
            };
            for dt in [DType::F32, DType::F64] {
                let xt = Tensor::new(
                    vec![1, c, h, wd],
                    TensorData::from_f64(dt, &vec![1.0; c * h * wd]),
                )
                .unwrap();
                let wt = Tensor::new(vec![c, 1, kh, kw], TensorData::from_f64(dt, &w)).unwrap();
                let out = Shape::new(&[1, c, h, wd], dt);
                let y = conv(&xt, &wt, None, &a, &out).unwrap().data().to_f64_vec();
                for oy in 0..h {
                    for ox in 0..wd {
                        let v = y[oy * wd + ox];
                        if oy == 0 || ox < kw / 2 {
                            assert!(v.is_nan(), "{dt:?} {kh}x{kw} ({oy},{ox}): {v}");
                        } else {
                            assert_eq!(v, f64::INFINITY, "{dt:?} {kh}x{kw} ({oy},{ox})");
                        }
                        // Channel 1: 0.5 per tap inside the image.
                        let rows = (oy.max(1) - 1..=(oy + 1).min(h - 1)).count();
                        let cols = (ox.max(kw / 2) - kw / 2..=(ox + kw / 2).min(wd - 1)).count();
                        let v1 = y[h * wd + oy * wd + ox];
                        assert!((v1 - 0.5 * (rows * cols) as f64).abs() < 1e-6, "{v1}");
                    }
                }
            }
        }
    }

    #[test]
    fn im2col_conv_matches_definition() {
        check([2, 3, 9, 8], [4, 3, 3, 3], 1, 1, 1, 1);
        check([1, 3, 11, 10], [5, 3, 3, 3], 2, 1, 1, 1);
        check([1, 4, 10, 9], [4, 2, 3, 2], 2, 2, 2, 2);
        check([1, 3, 7, 7], [2, 3, 7, 7], 2, 1, 3, 1);
        // Stride 3 (three column phases) on widths 1 and 2 past a multiple of 3.
        check([1, 3, 13, 13], [4, 3, 3, 3], 3, 1, 1, 1);
        check([1, 2, 11, 14], [3, 2, 5, 5], 3, 1, 2, 1);
    }

    /// Strided 1×1 convs (ResNet's shortcuts) gather every s-th pixel and run as a product:
    /// odd sizes (the last row and column read), two images, groups, stride 3, dilation.
    #[test]
    fn strided_pointwise_conv_matches_definition() {
        check([2, 5, 9, 8], [6, 5, 1, 1], 2, 1, 0, 1);
        check([1, 4, 10, 11], [6, 2, 1, 1], 3, 2, 0, 2);
        check([1, 16, 7, 7], [24, 16, 1, 1], 2, 1, 0, 1);
    }

    /// Inputs for a Winograd check: x `[n, c, h, w]`, w `[m, c, 3, 3]`, bias `[m]`.
    fn wino_case(
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        m: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let x = (0..n * c * h * w)
            .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let wv = (0..m * c * 9)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b = (0..m).map(|i| i as f32 * 0.25 - 0.5).collect();
        (x, wv, b)
    }

    /// Winograd conv of `x` `[n, c, h, w]` with pads (top, left, bottom, right): the
    /// transform's own result (None when it declined) and `conv_winograd`'s.
    fn wino_run(
        x: &[f32],
        xd: [usize; 4],
        w: &[f32],
        m: usize,
        b: &[f32],
        pads: (usize, usize, usize, usize),
    ) -> (Option<Vec<f32>>, Tensor, Tensor) {
        let [n, c, h, wi] = xd;
        let a = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(pads.0, pads.2), (pads.1, pads.3)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let (oh, ow) = (h + pads.0 + pads.2 - 2, wi + pads.1 + pads.3 - 2);
        let xt = Tensor::new(xd.to_vec(), TensorData::F32(x.to_vec())).unwrap();
        let wt = Tensor::new(vec![m, c, 3, 3], TensorData::F32(w.to_vec())).unwrap();
        let bt = Tensor::new(vec![m], TensorData::F32(b.to_vec())).unwrap();
        let out = Shape::new(&[n, m, oh, ow], DType::F32);
        let wg =
            winograd_weights(&wt, &a, &out).expect("a 3x3 stride-1 conv takes the Winograd path");
        let d = winograd::Dims {
            n,
            h,
            w: wi,
            pt: pads.0,
            pl: pads.1,
            oh,
            ow,
        };
        let ts = n * oh.div_ceil(2) * ow.div_ceil(2);
        let mut v = vec![0.0f32; 16 * c * ts];
        let raw = winograd::conv(x, &wg, Some(b), d, &mut v, &no_post);
        let got = conv_winograd(&xt, &wg, &wt, Some(&bt), &a, &out, &no_post).unwrap();
        let direct = conv(&xt, &wt, Some(&bt), &a, &out).unwrap();
        (raw, got, direct)
    }

    /// Winograd F(2x2, 3x3) against the ONNX definition in f64 (`naive`), with asymmetric
    /// padding applied by padding the input explicitly: odd and even output sizes, a batch,
    /// outputs smaller than one tile, pads of 0 to 2.
    #[test]
    fn winograd_matches_definition() {
        let cases = [
            // (n, c, h, w, m, pads (t, l, b, r))
            (2, 32, 9, 8, 33, (1, 1, 1, 1)),
            (1, 32, 7, 7, 32, (1, 1, 1, 1)),
            (1, 40, 13, 6, 32, (0, 0, 0, 0)),
            (1, 32, 5, 11, 48, (0, 1, 2, 1)),
            (1, 32, 1, 1, 32, (1, 1, 1, 1)),
            (1, 35, 2, 3, 33, (2, 2, 2, 2)),
            (3, 32, 4, 4, 32, (2, 0, 1, 0)),
        ];
        for (ci, &(n, c, h, w, m, p)) in cases.iter().enumerate() {
            let (x, wv, b) = wino_case(n, c, h, w, m);
            let (hp, wp) = (h + p.0 + p.2, w + p.1 + p.3);
            let mut xp = vec![0.0f32; n * c * hp * wp];
            for (pl, src) in x.chunks(h * w).enumerate() {
                for (r, row) in src.chunks(w).enumerate() {
                    let o = (pl * hp + r + p.0) * wp + p.1;
                    xp[o..o + w].copy_from_slice(row);
                }
            }
            let (want, od) = naive(&xp, [n, c, hp, wp], &wv, [m, c, 3, 3], &b, 1, 1, 0, 1);
            let (raw, got, _) = wino_run(&x, [n, c, h, w], &wv, m, &b, p);
            let raw = raw.expect("finite inputs stay on the Winograd path");
            assert_eq!(got.dims(), od.as_slice());
            assert_eq!(
                got.data().to_f32_vec(),
                raw,
                "case {ci}: conv_winograd is the transform"
            );
            for (i, (g, w)) in raw.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "case {ci} at {i}: {g} vs {w}"
                );
            }
        }
    }

    /// Non-finite inputs (Inf, -Inf, NaN, and finite values whose transform overflows):
    /// the transform declines and `conv_winograd` gives exactly the direct conv's values.
    #[test]
    fn winograd_nonfinite_is_direct_conv() {
        let (n, c, h, w, m) = (1, 32, 8, 8, 32);
        let plants: [&[(usize, f32)]; 4] = [
            &[(8 * 8 + 3 * 8 + 3, f32::INFINITY)],
            &[(0, f32::NEG_INFINITY), (5 * 8 * 8 + 9, f32::INFINITY)],
            &[(2 * 8 * 8 + 7, f32::NAN)],
            &[(27, 3.0e38), (28, -3.0e38)],
        ];
        for (pi, plant) in plants.iter().enumerate() {
            let (mut x, wv, b) = wino_case(n, c, h, w, m);
            for &(i, v) in *plant {
                x[i] = v;
            }
            let (raw, got, direct) = wino_run(&x, [n, c, h, w], &wv, m, &b, (1, 1, 1, 1));
            assert!(raw.is_none(), "plant {pi}: the transform must decline");
            let (g, d) = (got.data().to_f32_vec(), direct.data().to_f32_vec());
            assert!(
                d.iter().any(|v| !v.is_finite()),
                "plant {pi}: direct conv is not finite"
            );
            for (i, (a, e)) in g.iter().zip(&d).enumerate() {
                assert!(
                    a.to_bits() == e.to_bits(),
                    "plant {pi} at {i}: {a} vs direct {e}"
                );
            }
        }
    }

    /// Convs large enough to run in several row blocks (CONV_BLOCK_BYTES), in blocks one
    /// after another (1 thread) and in parallel (2 threads): 3x3 pad 1, 3x3 stride 2, 1x1
    /// direct (no im2col), and a grouped conv.
    #[test]
    fn blocked_conv_matches_definition() {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                check([1, 64, 45, 40], [64, 64, 3, 3], 1, 1, 1, 1);
                check([1, 64, 90, 80], [64, 64, 3, 3], 2, 1, 1, 1);
                check([2, 16, 64, 64], [256, 16, 1, 1], 1, 1, 0, 1);
                check([1, 64, 47, 41], [128, 32, 3, 3], 1, 1, 1, 2);
            });
        }
    }

    /// Finite inputs whose direct partial sums overflow while the transform's cancel:
    /// +2e38 on channel 0 and -2e38 on channel 1 under the same taps. The direct conv
    /// (im2col + gemm) makes an Inf there; `conv_winograd` must give exactly its values,
    /// not the transform's finite ones.
    #[test]
    fn winograd_overflow_that_cancels_is_direct_conv() {
        let (n, c, h, w, m) = (1, 32, 7, 7, 32);
        let mut x = vec![0.0f32; c * h * w];
        for (ch, v) in [(0, 2e38f32), (1, -2e38)] {
            x[ch * h * w + 3 * w + 2] = v;
            x[ch * h * w + 3 * w + 4] = v;
        }
        let mut wv = vec![0.0f32; m * c * 9];
        for mi in 0..m {
            for ch in 0..2 {
                wv[(mi * c + ch) * 9 + 3] = 1.0; // tap (1, 0)
                wv[(mi * c + ch) * 9 + 5] = 1.0; // tap (1, 2)
            }
        }
        let b = vec![0.1887f32; m];
        let (_, got, direct) = wino_run(&x, [n, c, h, w], &wv, m, &b, (1, 1, 1, 1));
        let (g, d) = (got.data().to_f32_vec(), direct.data().to_f32_vec());
        assert!(
            d.iter().any(|v| v.is_infinite()),
            "the direct sum overflows"
        );
        for (i, (a, e)) in g.iter().zip(&d).enumerate() {
            assert!(a.to_bits() == e.to_bits(), "at {i}: {a} vs direct {e}");
        }
    }

    #[test]
    fn depthwise_conv_matches_definition() {
        check([2, 6, 9, 8], [6, 1, 3, 3], 1, 1, 1, 6);
        check([1, 5, 12, 11], [5, 1, 3, 3], 2, 1, 1, 5);
        check([1, 4, 10, 10], [4, 1, 5, 5], 2, 2, 2, 4);
        check([1, 3, 6, 6], [3, 1, 3, 3], 1, 1, 0, 3);
    }

    /// The channel-block path (16 channels per register, `dw_simd::cblock`) gives the per-row
    /// path's bits: the conv after a 1×1 conv runs on the per-row kernel in a pair
    /// (`pw_dw`) and on this one alone, and fusion must not change a value. Blocks of 16
    /// and a partial one, batch 2, strides 1 and 2, even and one-sided pads, NaN/Inf in the
    /// input, each clamp, 1 and 3 threads; and the scan's figure is exactly the largest |y|.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn depthwise_channel_blocks_give_the_per_row_bits() {
        use dw_simd::Isa;
        // (channel blocks, per-row path) on each width this CPU has.
        let pairs: &[(Isa, Isa)] = match dw_simd::best_isa() {
            Some(Isa::Avx512) => &[(Isa::Avx512, Isa::Avx512Rows), (Isa::Avx2, Isa::Avx2Rows)],
            Some(Isa::Avx2) => &[(Isa::Avx2, Isa::Avx2Rows)],
            _ => {
                {
                    use std::io::Write; // past the test harness's capture: the skip shows in CI logs
                    let _ = writeln!(std::io::stderr(), "skipping {}: no AVX-512F/VL or AVX2 on this CPU (two SIMD paths to compare)", std::thread::current().name().unwrap_or("?"));
                }
                return;
            }
        };
        // (h, w, k, stride, pads top/left/bottom/right, channels)
        let geos: &[(
            usize,
            usize,
            usize,
            usize,
            (usize, usize, usize, usize),
            usize,
        )] = &[
            (7, 7, 5, 1, (2, 2, 2, 2), 37),
            (7, 7, 3, 1, (1, 1, 1, 1), 16),
            (14, 14, 5, 2, (1, 1, 2, 2), 37),
            (14, 13, 3, 2, (1, 1, 1, 1), 20),
            (11, 7, 3, 1, (0, 1, 2, 1), 5),
            (28, 28, 5, 1, (2, 2, 2, 2), 17),
            (9, 9, 7, 1, (3, 3, 3, 3), 18),
            (3, 4, 5, 1, (2, 2, 2, 2), 1),
        ];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for (gi, &(h, wd, k, s, p, c)) in geos.iter().enumerate() {
            let (oh, ow) = ((h + p.0 + p.2 - k) / s + 1, (wd + p.1 + p.3 - k) / s + 1);
            let a = ConvAttrs {
                strides: vec![s, s],
                pads: vec![(p.0, p.2), (p.1, p.3)],
                dilations: vec![1, 1],
                groups: c,
            };
            let g = geometry(&[2, c, h, wd], &[c, 1, k, k], &a, &[2, c, oh, ow]).unwrap();
            assert!(
                dw_simd::cblock_plan(&g, 16).is_some(),
                "geo {gi} takes the channel blocks"
            );
            let mut x: Vec<f32> = (0..2 * c * h * wd)
                .map(|i| ((i * 7919 + gi) % 97) as f32 / 48.0 - 1.0)
                .collect();
            let n = x.len();
            x[n / 2] = f32::NAN;
            x[n / 3] = f32::INFINITY;
            x[n / 5] = f32::NEG_INFINITY;
            let w: Vec<f32> = (0..c * k * k)
                .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
                .collect();
            let b: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 0.5).collect();
            for clamp in [Clamp::NONE, Clamp::RELU, Clamp::clip(-0.25, 0.5)] {
                let run = |isa, seen: Option<&AtomicU32>| {
                    dw_simd::run_with(isa, true, &x, &w, Some(&b), &g, &no_post, clamp, seen)
                        .unwrap()
                };
                for &(fast, rows) in pairs {
                    let want = run(rows, None);
                    for threads in [1, 3] {
                        let seen = AtomicU32::new(0);
                        let got = if threads == 1 {
                            run(fast, Some(&seen))
                        } else {
                            pool.install(|| run(fast, Some(&seen)))
                        };
                        for (i, (&u, &v)) in got.iter().zip(&want).enumerate() {
                            let nan_ok = u.is_nan() && v.is_nan() && !clamp.nan_out;
                            assert!(
                                u.to_bits() == v.to_bits() || nan_ok,
                                "{fast:?} geo {gi} {clamp:?} {threads} threads at {i}: {u} vs {v}"
                            );
                        }
                        if clamp == Clamp::NONE {
                            let want_bits = crate::kernels::wide::max_abs_bits(&want);
                            assert_eq!(
                                seen.into_inner(),
                                want_bits,
                                "{fast:?} geo {gi} {threads} threads"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Each SIMD width the CPU has (AVX-512 and AVX2 on an AVX-512 machine) against the
    /// generic depthwise loop, NaN/Inf included (same NaN positions, values within rounding).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn depthwise_simd_widths_match_generic() {
        let isas: &[dw_simd::Isa] = match dw_simd::best_isa() {
            Some(dw_simd::Isa::Avx512 | dw_simd::Isa::Avx512Y | dw_simd::Isa::Avx512Rows) => &[
                dw_simd::Isa::Avx512,
                dw_simd::Isa::Avx512Rows,
                dw_simd::Isa::Avx512Y,
                dw_simd::Isa::Avx2,
                dw_simd::Isa::Avx2Rows,
            ],
            Some(dw_simd::Isa::Avx2 | dw_simd::Isa::Avx2Rows) => {
                &[dw_simd::Isa::Avx2, dw_simd::Isa::Avx2Rows]
            }
            None => &[],
        };
        let geos = [
            // (h, w, k, stride, dil, pads (t, l, b, r))
            (9, 9, 3, 1, 1, (1, 1, 1, 1)),
            (7, 7, 3, 2, 1, (0, 0, 1, 1)),
            (1, 1, 3, 1, 1, (1, 1, 1, 1)),
            (2, 3, 5, 2, 1, (2, 2, 2, 2)),
            (20, 37, 5, 2, 2, (3, 4, 2, 1)),
            (17, 33, 3, 3, 1, (1, 1, 1, 1)),
            (14, 14, 7, 1, 1, (3, 3, 3, 3)),
            // the flat path's cases (AVX-512; stride 1 on planes up to 1024, stride 2)
            (14, 14, 3, 2, 1, (1, 1, 1, 1)),
            (57, 70, 3, 2, 1, (1, 1, 1, 1)),
            (40, 40, 5, 2, 1, (2, 1, 2, 2)),
            (13, 13, 5, 2, 1, (2, 2, 2, 2)),
            (7, 7, 5, 1, 1, (2, 2, 2, 2)),
            (32, 31, 3, 2, 1, (1, 0, 1, 1)),
            (5, 40, 3, 1, 1, (0, 1, 2, 1)),
        ];
        // With an infinite weight (`inf · 0` in the padding: the flat path must not be
        // taken) and with finite weights (it is, where the geometry allows).
        let mut nan_cases = 0;
        for (gi, &(h, wd, k, s, d, p), inf_w) in geos
            .iter()
            .enumerate()
            .flat_map(|(gi, geo)| [(gi, geo, true), (gi, geo, false)])
        {
            let c = 3;
            let span = d * (k - 1) + 1;
            let (oh, ow) = (
                (h + p.0 + p.2 - span) / s + 1,
                (wd + p.1 + p.3 - span) / s + 1,
            );
            let a = ConvAttrs {
                strides: vec![s, s],
                pads: vec![(p.0, p.2), (p.1, p.3)],
                dilations: vec![d, d],
                groups: c,
            };
            let g = geometry(&[2, c, h, wd], &[c, 1, k, k], &a, &[2, c, oh, ow]).unwrap();
            let mut x: Vec<f32> = (0..2 * c * h * wd)
                .map(|i| ((i * 7919 + gi) % 97) as f32 / 48.0 - 1.0)
                .collect();
            let mut w: Vec<f32> = (0..c * k * k)
                .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
                .collect();
            let n = x.len();
            x[n / 2] = f32::NAN;
            x[n / 3] = f32::INFINITY;
            x[0] = f32::NEG_INFINITY;
            if inf_w {
                w[k * k] = f32::INFINITY;
            }
            let b: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 0.5).collect();
            // The cases meant for the flat path reach it (the comparison below covers it).
            assert_eq!(
                dw_simd::flat_plan(&g).is_some(),
                d == 1 && (s == 2 || (s == 1 && h * wd <= 1024)),
                "geo {gi}"
            );
            let conv = depthwise_2d(&x, &w, Some(&b), &g);
            // The clamps against ONNX's definitions of the activations on the generic
            // path's values: none, Relu (`x < 0 ? 0 : x`), Clip (NaN kept).
            use crate::kernels::elementwise::{max_f32, min_f32};
            let relu = |v: f32| if v < 0.0 { 0.0 } else { v };
            let clip = |v: f32| min_f32(max_f32(v, -0.25), 0.5);
            let acts: [(Clamp, &dyn Fn(f32) -> f32); 3] = [
                (Clamp::NONE, &|v| v),
                (Clamp::RELU, &relu),
                (Clamp::clip(-0.25, 0.5), &clip),
            ];
            // The NaN scan's figure, taken before the clamp: at least the conv's largest |y|
            // bits (lanes past a row's end may only add to it).
            let conv_bits = crate::kernels::wide::max_abs_bits(&conv);
            // (The infinite weight makes a NaN in every case; the input's NaN, Inf and
            // -Inf reach the output in most, counted below.)
            assert!(
                conv_bits > 0x7f80_0000 || !inf_w,
                "the data puts a NaN in the conv (geo {gi})"
            );
            nan_cases += usize::from(!inf_w && conv_bits > 0x7f80_0000);
            for (clamp, act) in acts {
                let want: Vec<f32> = conv.iter().map(|&v| act(v)).collect();
                for &isa in isas {
                    let seen = AtomicU32::new(0);
                    let got = dw_simd::run_with(
                        isa,
                        !inf_w,
                        &x,
                        &w,
                        Some(&b),
                        &g,
                        &no_post,
                        clamp,
                        Some(&seen),
                    )
                    .unwrap();
                    // (Finite: to round-off, as the sums are in another order.)
                    let seen = seen.into_inner();
                    assert!(
                        seen >= conv_bits
                            || (conv_bits < 0x7f80_0000
                                && f32::from_bits(seen)
                                    >= f32::from_bits(conv_bits) * (1.0 - 1e-5)),
                        "{isa:?} {clamp:?} geo {gi}"
                    );
                    assert_eq!(got.len(), want.len());
                    for (i, (&u, &v)) in got.iter().zip(&want).enumerate() {
                        // Clip's NaN is f32::NAN, bit for bit (as RLX's Max/Min give it).
                        let nan_ok = !clamp.nan_out || u.to_bits() == v.to_bits();
                        let same = (u.is_nan() && v.is_nan() && nan_ok)
                            || u == v
                            || (u - v).abs() <= 1e-5 * (1.0 + v.abs());
                        assert!(same, "{isa:?} {clamp:?} geo {gi} at {i}: {u} vs {v}");
                    }
                }
            }
            // Finite data: the figure is finite (no false alarm) and at least the conv's
            // largest |y| (to round-off: the sums are in another order), which here is
            // above the Clip's bounds.
            let xf: Vec<f32> = x
                .iter()
                .map(|v| if v.is_finite() { *v } else { 3.0 })
                .collect();
            let wf: Vec<f32> = w
                .iter()
                .map(|v| if v.is_finite() { *v } else { 2.0 })
                .collect();
            let conv_max =
                crate::kernels::wide::max_abs_bits(&depthwise_2d(&xf, &wf, Some(&b), &g));
            let conv_max = f32::from_bits(conv_max);
            assert!(conv_max > 0.5);
            for &isa in isas {
                let seen = AtomicU32::new(0);
                let clip = Clamp::clip(-0.25, 0.5);
                dw_simd::run_with(
                    isa,
                    true,
                    &xf,
                    &wf,
                    Some(&b),
                    &g,
                    &no_post,
                    clip,
                    Some(&seen),
                )
                .unwrap();
                let got = f32::from_bits(seen.into_inner());
                assert!(
                    got.is_finite() && got >= conv_max * (1.0 - 1e-5),
                    "{isa:?} geo {gi}: {got} vs {conv_max}"
                );
            }
        }
        assert!(
            nan_cases >= 8,
            "only {nan_cases} finite-weight cases had a NaN output"
        );
    }

    /// The NaN scan's figure sees an Inf at every output position: f32::MAX at each input
    /// position in turn, under a Clip that would hide it, with a centre weight of 2 (so
    /// the output centred there overflows) and 1e-30 elsewhere (so no other output does).
    /// Every SIMD path says non-finite exactly when the generic conv's output holds an Inf.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn depthwise_tracking_sees_every_position() {
        let Some(best) = dw_simd::best_isa() else {
            return;
        };
        let isas = if best == dw_simd::Isa::Avx2 {
            vec![best, dw_simd::Isa::Avx2Rows]
        } else {
            vec![
                dw_simd::Isa::Avx512,
                dw_simd::Isa::Avx512Rows,
                dw_simd::Isa::Avx2,
                dw_simd::Isa::Avx2Rows,
            ]
        };
        // (h, w, k, stride, pad): flat-path geometries and one per-row one
        for (h, wd, k, s, p) in [
            (14, 14, 3, 2, 1),
            (7, 7, 5, 1, 2),
            (9, 13, 3, 1, 1),
            (40, 40, 3, 2, 1),
        ] {
            let (oh, ow) = ((h + 2 * p - k) / s + 1, (wd + 2 * p - k) / s + 1);
            let a = ConvAttrs {
                strides: vec![s, s],
                pads: vec![(p, p), (p, p)],
                dilations: vec![1, 1],
                groups: 1,
            };
            let g = geometry(&[1, 1, h, wd], &[1, 1, k, k], &a, &[1, 1, oh, ow]).unwrap();
            let mut w = vec![1e-30f32; k * k];
            w[k * k / 2] = 2.0;
            for i in 0..h * wd {
                let mut x = vec![0.1f32; h * wd];
                x[i] = f32::MAX;
                let want = crate::kernels::wide::max_abs_bits(&depthwise_2d(&x, &w, None, &g))
                    >= 0x7f80_0000;
                for &isa in &isas {
                    let seen = AtomicU32::new(0);
                    let clip = Clamp::clip(0.0, 6.0);
                    let y =
                        dw_simd::run_with(isa, true, &x, &w, None, &g, &no_post, clip, Some(&seen))
                            .unwrap();
                    assert!(y.iter().all(|v| (0.0..=6.0).contains(v)));
                    let got = seen.into_inner() >= 0x7f80_0000;
                    assert_eq!(got, want, "{isa:?} {h}x{wd} k{k} s{s}: inf at {i}");
                }
            }
        }
    }
}
