//! MaxPool's second output, `Indices` (ONNX MaxPool; onnx reference `op_max_pool.py`):
//! the flat index `(n * C + c) * prod(spatial) + offset` of each window's first maximum,
//! `offset` row-major (`storage_order = 0`) or column-major (`1`) over the spatial dims.
//!
//! Lowering: pad `x` with -inf, gather every window's positions with constant indices
//! (`[N, C, O * K]`), ArgMax over the window, and map the winning window slot to its input
//! offset through a constant table.

use crate::ctx::{Ctx, R};
use rlx_ir::infer_shape::window_out_dim;
use rlx_ir::{NodeId, Op, PadMode, PoolAttrs, Tensor};

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        c[a] = flat % dims[a];
        flat /= dims[a];
    }
    c
}

pub(crate) fn max_pool_indices(
    cx: &mut Ctx,
    x: NodeId,
    a: &PoolAttrs,
    col_major: bool,
) -> R<NodeId> {
    let xd = cx.dims(x);
    if !cx.dtype(x).is_float() {
        return Err(format!(
            "the Indices output needs a float input, got {}",
            cx.shape(x)
        ));
    }
    let (nb, ch) = (xd[0], xd[1]);
    let sp = xd[2..].to_vec();
    let nd = sp.len();
    let mut od = Vec::with_capacity(nd);
    let mut padded = Vec::with_capacity(nd);
    let mut pads = vec![(0, 0), (0, 0)];
    // `i` indexes the spatial dims and four attribute lists at once.
    #[allow(clippy::needless_range_loop)]
    for i in 0..nd {
        let o = window_out_dim(
            sp[i],
            a.pads[i],
            a.kernel[i],
            a.strides[i],
            a.dilations[i],
            a.ceil_mode,
        )
        .map_err(|e| e.0)?;
        let need = (o - 1) * a.strides[i] + a.dilations[i] * (a.kernel[i] - 1) + 1;
        let p = need.max(sp[i] + a.pads[i].0 + a.pads[i].1);
        pads.push((a.pads[i].0, p - sp[i] - a.pads[i].0));
        od.push(o);
        padded.push(p);
    }
    let o_n: usize = od.iter().product();
    let k_n: usize = a.kernel.iter().product();
    let p_n: usize = padded.iter().product();
    let s_n: usize = sp.iter().product();
    // Per (output, window slot): position in the padded input, and input offset.
    let mut gidx = Vec::with_capacity(o_n * k_n);
    let mut table = Vec::with_capacity(o_n * k_n);
    for o in 0..o_n {
        let oc = unravel(o, &od);
        for k in 0..k_n {
            let kc = unravel(k, &a.kernel);
            let mut pflat = 0usize;
            let mut off = 0i64;
            let mut inside = true;
            let mut col_stride = 1i64;
            let mut pos = vec![0i64; nd];
            for i in 0..nd {
                let pp = oc[i] * a.strides[i] + kc[i] * a.dilations[i];
                pflat = pflat * padded[i] + pp;
                pos[i] = pp as i64 - a.pads[i].0 as i64;
                if pos[i] < 0 || pos[i] >= sp[i] as i64 {
                    inside = false;
                }
            }
            if inside {
                if col_major {
                    for i in 0..nd {
                        off += pos[i] * col_stride;
                        col_stride *= sp[i] as i64;
                    }
                } else {
                    for i in 0..nd {
                        off = off * sp[i] as i64 + pos[i];
                    }
                }
            }
            gidx.push(pflat as i64);
            table.push(off);
        }
    }
    let xp = cx.add(
        Op::Pad {
            pads,
            mode: PadMode::Constant(f64::NEG_INFINITY),
        },
        vec![x],
    )?;
    let xp = cx.reshape(xp, vec![nb, ch, p_n])?;
    let gidx = cx.constant(Tensor::from_i64(&[o_n * k_n], gidx).map_err(|e| e.to_string())?);
    let win = cx.add(Op::Gather { axis: 2 }, vec![xp, gidx])?;
    let win = cx.reshape(win, vec![nb, ch, o_n, k_n])?;
    let am = cx.add(
        Op::ArgReduce {
            max: true,
            axis: 3,
            keepdims: false,
            select_last_index: false,
        },
        vec![win],
    )?;
    let slot_base: Vec<i64> = (0..o_n).map(|o| (o * k_n) as i64).collect();
    let slot_base = cx.constant(Tensor::from_i64(&[o_n], slot_base).map_err(|e| e.to_string())?);
    let slot = cx.binary(rlx_ir::BinaryOp::Add, am, slot_base)?;
    let table = cx.constant(Tensor::from_i64(&[o_n * k_n], table).map_err(|e| e.to_string())?);
    let off = cx.add(Op::Gather { axis: 0 }, vec![table, slot])?;
    let base: Vec<i64> = (0..nb * ch).map(|i| (i * s_n) as i64).collect();
    let base = cx.constant(Tensor::from_i64(&[nb, ch, 1], base).map_err(|e| e.to_string())?);
    let idx = cx.binary(rlx_ir::BinaryOp::Add, off, base)?;
    let mut out = vec![nb, ch];
    out.extend_from_slice(&od);
    cx.reshape(idx, out)
}

/// ONNX MaxUnpool (opset 11+; onnx reference `op_max_unpool.py`): scatter `X` into zeros of
/// the inferred shape `[N, C, (in - 1) * stride - pad_begin - pad_end + kernel, ...]` at the
/// flat positions `I` (MaxPool's `Indices`), then zero-pad at the end of each axis up to
/// `output_shape` (input 2, known at import time) when given. Lowered to Broadcast zeros,
/// ScatterElements on the flattened tensor, Reshape and Pad. An index out of range is a run
/// time error of the ScatterElements.
pub fn max_unpool(cx: &mut Ctx, n: &crate::ctx::ONode) -> R<Vec<NodeId>> {
    let (x, idx) = (n.inp(0)?, n.inp(1)?);
    let xd = cx.dims(x);
    if xd.len() < 3 {
        return Err(format!("X must have rank >= 3, got {xd:?}"));
    }
    let nd = xd.len() - 2;
    let kernel = crate::ctx::to_usizes(
        &n.ints("kernel_shape")?
            .ok_or("attribute kernel_shape is required")?,
        "kernel_shape",
    )?;
    let strides = match n.ints("strides")? {
        Some(s) => crate::ctx::to_usizes(&s, "strides")?,
        None => vec![1; nd],
    };
    let pads = match n.ints("pads")? {
        Some(p) => crate::ctx::to_usizes(&p, "pads")?,
        None => vec![0; 2 * nd],
    };
    if kernel.len() != nd || strides.len() != nd || pads.len() != 2 * nd {
        return Err(format!(
            "kernel_shape {kernel:?}, strides {strides:?}, pads {pads:?} do not fit {nd} spatial dims"
        ));
    }
    let mut inferred = xd[..2].to_vec();
    for i in 0..nd {
        let v = ((xd[i + 2].max(1) - 1) * strides[i] + kernel[i]) as i64
            - (pads[i] + pads[nd + i]) as i64;
        if v < 0 {
            return Err(format!("inferred output dim {i} is negative ({v})"));
        }
        inferred.push(v as usize);
    }
    let total: usize = inferred.iter().product();
    let numel: usize = xd.iter().product();
    if cx.dims(idx).iter().product::<usize>() != numel {
        return Err(format!(
            "I {:?} must have as many elements as X {xd:?}",
            cx.dims(idx)
        ));
    }
    let dt = cx.dtype(x);
    let zero = cx.scalar(dt, 0.0);
    let zeros = cx.add(Op::Broadcast { dims: vec![total] }, vec![zero])?;
    let flat_x = cx.reshape(x, vec![numel])?;
    let flat_i = cx.reshape(idx, vec![numel])?;
    let flat_i = cx.cast(flat_i, rlx_ir::DType::I64)?;
    let y = cx.add(
        Op::ScatterElements {
            axis: 0,
            reduction: rlx_ir::ScatterReduction::None,
        },
        vec![zeros, flat_i, flat_x],
    )?;
    let y = cx.reshape(y, inferred.clone())?;
    let Some(os) = n.opt(2) else {
        return Ok(vec![y]);
    };
    let want = cx.const_i64s(os, "output_shape")?;
    let want = crate::ctx::to_usizes(&want, "output_shape")?;
    if want.len() != inferred.len() || want.iter().zip(&inferred).any(|(w, i)| w < i) {
        return Err(format!(
            "output_shape {want:?} must have rank {} and be at least the inferred {inferred:?}",
            inferred.len()
        ));
    }
    if want == inferred {
        return Ok(vec![y]);
    }
    let pads = want
        .iter()
        .zip(&inferred)
        .map(|(w, i)| (0, w - i))
        .collect();
    Ok(vec![cx.add(
        Op::Pad {
            pads,
            mode: PadMode::Constant(0.0),
        },
        vec![y],
    )?])
}
