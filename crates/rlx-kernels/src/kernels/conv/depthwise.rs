//! Depthwise 2-D conv (one filter per channel) computed directly: the generic loop for
//! any element type, and the f32 entry to the SIMD kernels of [`super::dw_simd`].

use super::common::{inside_cols, Epilogue, Geo};
use crate::kernels::gemm_calls::GemmElem;
use crate::kernels::{fill_chunks, Elem};

/// Depthwise 2-D conv (groups == C == M, one filter per channel) computed directly: per
/// output plane, each kernel tap adds `w * x` over the span of output columns whose input
/// column is inside the image (the same span arithmetic as [`im2col_2d`]). No im2col buffer,
/// no per-channel 1-row gemm.
pub(super) fn depthwise_2d<
    T: GemmElem + Elem + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
>(
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
/// `epi`'s clamp is applied to each output value in registers before it is stored, then
/// its `post` runs on each output plane right after it is computed (while it is in cache).
/// With `epi.seen`, the largest |y| bits before the clamp (as
/// [`crate::kernels::wide::max_abs_bits`] gives them) are folded into it.
pub(super) fn depthwise_2d_f32(x: &[f32], w: &[f32], g: &Geo, epi: &Epilogue) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        super::dw_simd::run(x, w, g, epi)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, g, epi);
        None
    }
}
