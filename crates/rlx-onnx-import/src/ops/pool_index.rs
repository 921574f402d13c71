//! MaxPool's second output, `Indices` (ONNX MaxPool; onnx reference `op_max_pool.py`):
//! the flat index `(n * C + c) * prod(spatial) + offset` of each window's first maximum,
//! `offset` row-major (`storage_order = 0`) or column-major (`1`) over the spatial dims.
//!
//! Lowering: pad `x` with -inf, gather every window's positions with constant indices
//! (`[N, C, O * K]`), ArgMax over the window, and map the winning window slot to its input
//! offset through a constant table.

use crate::ctx::{Ctx, R};
use rlx_compile::infer_shape::window_out_dim;
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
