//! Pooling (ONNX MaxPool / AveragePool / LpPool) over NC + any number of spatial dims.
//!
//! Window tap `t` of output `o` on axis `i` reads input position `o*stride + t*dil - pad_begin`.
//! A position inside the input is *valid*; one in `[-pad_begin, in + pad_end)` but outside
//! the input is *padding*; anything further (ONNX `ceil_mode` windows) is never counted.
//! Max ignores padding and propagates NaN; Avg divides by the valid count, or by
//! valid + padding with `count_include_pad`; Lp is `(Σ|x|^p)^(1/p)` over valid positions.

use super::{fill_chunks, invalid, make, map_float, out_dims, KResult};
use num_traits::Float;
use rlx_ir::{PoolAttrs, PoolKind, Shape, Tensor};

#[derive(Clone, Copy)]
enum Tap {
    Valid(usize),
    Pad,
    Outside,
}

fn pool_impl<T: Float + Send + Sync>(
    v: &[T],
    sp: &[usize],
    osp: &[usize],
    a: &PoolAttrs,
    planes: usize,
) -> Vec<T> {
    let nd = sp.len();
    let plane: usize = sp.iter().product();
    let p: usize = osp.iter().product();
    let sst = rlx_ir::strides_of(sp);
    // taps[i][o] = per-tap status on axis i for output index o
    let taps: Vec<Vec<Vec<Tap>>> = (0..nd)
        .map(|i| {
            (0..osp[i])
                .map(|o| {
                    (0..a.kernel[i])
                        .map(|t| {
                            let pos = (o * a.strides[i] + t * a.dilations[i]) as isize
                                - a.pads[i].0 as isize;
                            if pos >= 0 && (pos as usize) < sp[i] {
                                Tap::Valid(pos as usize)
                            } else if pos >= -(a.pads[i].0 as isize)
                                && pos < (sp[i] + a.pads[i].1) as isize
                            {
                                Tap::Pad
                            } else {
                                Tap::Outside
                            }
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let ktot: usize = a.kernel.iter().product();
    let kst = rlx_ir::strides_of(&a.kernel);
    let mut out = vec![T::zero(); planes * p];
    fill_chunks(&mut out, p.max(1), |pl, dst| {
        if p == 0 {
            return;
        }
        let src = &v[pl * plane..(pl + 1) * plane];
        let mut oidx = vec![0usize; nd];
        for (q, d) in dst.iter_mut().enumerate() {
            let mut rem = q;
            for i in (0..nd).rev() {
                oidx[i] = rem % osp[i];
                rem /= osp[i];
            }
            let mut acc = match a.kind {
                PoolKind::Max => T::neg_infinity(),
                _ => T::zero(),
            };
            let mut nan = false;
            let mut valid = 0usize;
            let mut counted = 0usize;
            for k in 0..ktot {
                let mut off = 0usize;
                let mut status = 0u8; // 0 valid, 1 pad, 2 outside
                let mut kr = k;
                for i in 0..nd {
                    let t = kr / kst[i];
                    kr %= kst[i];
                    match taps[i][oidx[i]][t] {
                        Tap::Valid(pos) => off += pos * sst[i],
                        Tap::Pad => status = status.max(1),
                        Tap::Outside => status = 2,
                    }
                }
                if status == 2 {
                    continue;
                }
                counted += 1;
                if status == 1 {
                    continue;
                }
                valid += 1;
                let x = src[off];
                match a.kind {
                    PoolKind::Max => {
                        if x.is_nan() {
                            nan = true;
                        } else if x > acc {
                            acc = x;
                        }
                    }
                    PoolKind::Avg { .. } => acc = acc + x,
                    PoolKind::Lp { p } => {
                        acc = acc + x.abs().powf(T::from(p).unwrap_or_else(T::nan))
                    }
                }
            }
            *d = match a.kind {
                PoolKind::Max => {
                    if nan {
                        T::nan()
                    } else {
                        acc
                    }
                }
                PoolKind::Avg { count_include_pad } => {
                    let n = if count_include_pad { counted } else { valid };
                    acc / T::from(n).unwrap_or_else(T::zero)
                }
                PoolKind::Lp { p } => acc.powf(T::one() / T::from(p).unwrap_or_else(T::nan)),
            };
        }
    });
    out
}

/// `Op::Pool`: x [N, C, *sp] → the node's [N, C, *osp].
pub(crate) fn pool(x: &Tensor, a: &PoolAttrs, out: &Shape) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let d = x.dims();
    if d.len() < 3 || od.len() != d.len() || od[0] != d[0] || od[1] != d[1] {
        return invalid(format!(
            "pool: input {d:?} and output {od:?} do not fit NC*spatial"
        ));
    }
    let nd = d.len() - 2;
    let mut a = a.clone();
    if a.strides.is_empty() {
        a.strides = vec![1; nd];
    }
    if a.dilations.is_empty() {
        a.dilations = vec![1; nd];
    }
    if a.pads.is_empty() {
        a.pads = vec![(0, 0); nd];
    }
    if a.kernel.len() != nd
        || a.strides.len() != nd
        || a.dilations.len() != nd
        || a.pads.len() != nd
    {
        return invalid("pool: kernel/strides/dilations/pads need one entry per spatial axis");
    }
    let sp = &d[2..];
    let osp = &od[2..];
    let planes = d[0] * d[1];
    let data = map_float!(x.data(), "pool", v => pool_impl(v, sp, osp, &a, planes));
    make(od.clone(), data)
}
