//! The driver of the direct f32 conv kernel ([`super::dconv`]): which convs it takes, and
//! the bias, residual and activation around it.

use super::common::Epilogue;
use super::common::Geo;
#[cfg(target_arch = "x86_64")]
use super::common::{add_bias_residual, bias_clamp, with_scratch, PHASES};
#[cfg(target_arch = "x86_64")]
use rlx_ir::TensorData;
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::Ordering;

/// A 2-D f32 conv with one group, dilation 1, the same stride (1 or 2) on both axes and a
/// kernel larger than 1×1 through the direct kernel ([`super::dconv`]), with the bias and
/// activation (`epi`) applied per output channel as [`super::im2col::conv_float`] applies them. None, with
/// nothing computed, for other convs, or without AVX-512.
pub(super) fn conv_direct_f32(
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
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
        let Epilogue {
            bias,
            clamp,
            post,
            seen,
            ..
        } = *epi;
        let in_regs = clamp
            .filter(|c| !c.nan_out && seen.is_none() && res.is_none())
            .map(|c| (c.lo, c.hi));
        let base = out.as_ptr() as usize;
        let pass = |_: usize, seg: &mut [f32]| {
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
            super::dconv::conv(g.n, x, w, bias, in_regs, &d, &mut out, ph, &pass)
        });
        if ok {
            return Some(out);
        }
        crate::buffers::give(TensorData::F32(out));
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, g, epi, res);
        None
    }
}

/// Fewest output positions (rows times padded row length) for which [`conv_direct_f32`]
/// takes a conv; below, im2col + gemm.
const DCONV_MIN_POSITIONS: usize = 192;
