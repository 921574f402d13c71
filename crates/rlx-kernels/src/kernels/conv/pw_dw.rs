//! A pointwise conv and the depthwise conv that reads its output, interleaved by bands of
//! rows so that the pointwise output stays in L2 (MobileNet's and EfficientNet's
//! expansion then depthwise): the entry that checks the pair ([`pw_dw`]) and the banded
//! loop ([`pw_dw_bands`], AVX-512).

#[cfg(target_arch = "x86_64")]
use super::common::Epilogue;
#[cfg(target_arch = "x86_64")]
use super::common::{bias_clamp, with_col, Geo};
use super::common::{geometry, Act};
#[cfg(target_arch = "x86_64")]
use super::dw_simd::{
    best_isa, flat_plan, plan, rows_avx512, s2_plane, Flat, Isa, Plan, RowsFn, S2Fn,
};
#[cfg(target_arch = "x86_64")]
use crate::kernels::gemm_calls::{gemm_uninit_ptr, View};
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::Avx512;
use crate::kernels::{make, out_dims, KResult};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::Ordering;

#[cfg(target_arch = "x86_64")]
/// Target bytes of one band of the pointwise output in [`pw_dw`] (all of a thread's
/// channels, a few rows): with the rows kept for later outputs, inside Zen 4's 1 MB
/// L2. MobileNetV2's first pair (16→96 at 112², then stride 2), 1 thread, per-node
/// profile, two runs each: 400–404 / 382–388 / 379–396 / 366–371 / 375–381 µs at 128 /
/// 256 / 384 / 512 / 768 KB bands (the two convs apart: 638–846).
const BAND_BYTES: usize = 512 << 10;

#[cfg(target_arch = "x86_64")]
/// The depthwise kernel of [`pw_dw_bands`]: output rows of one plane.
enum RowKernel {
    /// Stride 1, planes over 1024 pixels (where the unfused conv takes the per-row path too).
    Rows(Plan<u16>, RowsFn),
    /// Stride 2, 3×3 or 5×5 ([`s2_plane`], as the unfused conv).
    S2(Flat, S2Fn),
}

#[cfg(target_arch = "x86_64")]
/// A pointwise conv and the depthwise conv that reads its output, interleaved by bands
/// of rows (MobileNet's and EfficientNet's expansion then depthwise): per band, the
/// pointwise conv's product (gemm), bias and activation for those rows of every
/// channel, then every depthwise output row whose window rows are all computed. The
/// pointwise output lives only in a window of rows per thread (the band and the few
/// rows later outputs still read), which stays in L2: the depthwise conv reads it
/// there, and the whole tensor (4.8 MB in MobileNetV2's first block) is never written
/// out to L3 or memory.
///
/// `x`: one image `[c, h, w]`; `(wa, c)`: the pointwise weights `[m, c]`; `epi_a`: the
/// pointwise conv's epilogue as its group applies it (its `post` is called on every row
/// segment: [`super::no_post`] where the clamp replaces it). `g`: the depthwise conv (`m`
/// channels of `h × w`, finite weights `wb`); `epi_b` likewise.
/// `out` (`m·oh·ow`) receives the depthwise output.
/// Each value is computed by the same kernels, in the same order, as the two convs
/// unfused ([`super::im2col::conv_float`]'s per-row bias and clamp after gemm, [`plane`] or
/// [`s2_plane`] per output row). Channels are split over threads, each thread
/// banding its own. Returns false (nothing written) where no row kernel applies:
/// not AVX-512, other kernel sizes, dilation, small planes.
fn pw_dw_bands(
    x: &[f32],
    (wa, c): (&[f32], usize),
    epi_a: &Epilogue,
    g: &Geo,
    wb: &[f32],
    epi_b: &Epilogue,
    out: &mut [f32],
) -> KResult<bool> {
    use rayon::prelude::*;
    // The dw kernels take the largest |y| before the clamp when asked to.
    let clamp_b = epi_b.in_regs();
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
    let nt = if crate::kernels::par_worth(m * hw) {
        rayon::current_num_threads().min(m)
    } else {
        1
    };
    let per = m.div_ceil(nt);
    let chunk = |(t, out): (usize, &mut [f32])| -> KResult<()> {
        let (m0, mc) = (t * per, out.len() / op);
        // A window of `cap` rows per channel holds the pointwise output from image row
        // `base` on: each band is computed below the rows kept, and after the depthwise
        // rows it completes, the rows later outputs still read (fewer than `k`) move to
        // the top. The window stays in this thread's L2 and is never written out whole.
        let band = (BAND_BYTES / (mc * w * 4)).max(k + s);
        let cap = band + k;
        with_col::<f32, _>(mc * cap * w, |win| -> KResult<()> {
            let (mut done, mut base) = (0, 0);
            for r0 in (0..h).step_by(band) {
                let r1 = (r0 + band).min(h);
                debug_assert!(base <= r0 && r1 - base <= cap);
                let a = View {
                    data: wa,
                    off: m0 * c,
                    rs: c,
                    cs: 1,
                };
                let b = View {
                    data: x,
                    off: r0 * w,
                    rs: hw,
                    cs: 1,
                };
                // SAFETY: rows i < mc, columns [(r0 - base)·w, (r1 - base)·w) of the
                // window's `cap·w` per channel, inside `win`.
                unsafe {
                    gemm_uninit_ptr(
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
                    let b = epi_a.bias.map(|b| b[m0 + i]);
                    let bits = bias_clamp(seg, b, epi_a.clamp, epi_a.seen.is_some());
                    if let Some(sa) = epi_a.seen {
                        sa.fetch_max(bits, Ordering::Relaxed);
                    }
                    (epi_a.post)(seg);
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
                    let b = epi_b.bias.map_or(0.0, |b| b[m0 + i]);
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
                    if let Some(sb) = epi_b.seen {
                        sb.fetch_max(bits, Ordering::Relaxed);
                    }
                    (epi_b.post)(&mut dst[done * ow..hi * ow]);
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

/// The pointwise conv `a` (1×1, stride 1, no padding, one group, dilation 1; weights `wa`
/// `[M, C, 1, 1]`, bias `ba` `[M]`) on one f32 image `x` `[1, C, H, W]`, then the depthwise
/// conv `b` (`M` groups; weights `wb` `[M, 1, k, k]`, all finite, bias `bb`) on its output,
/// interleaved by bands of rows ([`pw_dw_bands`]) so that the depthwise conv reads the
/// pointwise output from L2. `act_a`, `act_b`: each conv's activation and scan, as [`super::conv_post`]
/// applies it. Returns the depthwise conv's output `[1, M, OH, OW]` (`out_b`), the same
/// bits as the two convs run one after the other; None, with nothing computed, where the
/// interleaved path does not apply (another shape, dtype or kernel; no AVX-512; planes of
/// 1024 pixels or fewer, which stay in L2 anyway).
///
/// # Errors
/// A shape that does not fit its conv (as [`super::conv`]).
pub fn pw_dw(
    x: &Tensor,
    (wa, ba, attrs_a, out_a, act_a): (&Tensor, Option<&Tensor>, &ConvAttrs, &Shape, Act),
    (wb, bb, attrs_b, out_b, act_b): (&Tensor, Option<&Tensor>, &ConvAttrs, &Shape, Act),
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
        let (D::F32(xv), D::F32(wav), D::F32(wbv), Some(bav), Some(bbv)) = (
            x.data(),
            wa.data(),
            wb.data(),
            f32s(ba, ga.m),
            f32s(bb, gb.m),
        ) else {
            return Ok(None);
        };
        if !pointwise || !depthwise || crate::kernels::wide::max_abs_bits(wbv) >= 0x7f80_0000 {
            return Ok(None);
        }
        let op = gb.osp[0] * gb.osp[1];
        let mut out = crate::buffers::overwritten::<f32>(gb.m * op);
        // Each side's `post` runs only where its clamp does not replace it.
        let epi_a = Epilogue {
            post: act_a.post_unless_clamped(),
            ..act_a.with_bias(bav)
        };
        let epi_b = Epilogue {
            post: act_b.post_unless_clamped(),
            ..act_b.with_bias(bbv)
        };
        let ok = pw_dw_bands(xv, (wav, ga.c), &epi_a, &gb, wbv, &epi_b, &mut out)?;
        if !ok {
            crate::buffers::give(D::F32(out));
            return Ok(None);
        }
        make(od_b, D::F32(out)).map(Some)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (
            x, wa, ba, attrs_a, out_a, act_a, wb, bb, attrs_b, out_b, act_b,
        );
        Ok(None)
    }
}
