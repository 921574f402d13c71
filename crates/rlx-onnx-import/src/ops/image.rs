//! Scatter-shaped layout ops lowered onto `ScatterElements` with indices computed at import
//! time: Col2Im (opset 18) and TensorScatter (opset 24). Definitions: ONNX operator spec.

use crate::ctx::{to_usizes, Ctx, ONode, R};
use rlx_ir::{BinaryOp, NodeId, Op, ScatterReduction, Tensor};

/// Row-major multi-index of `flat` over `dims`.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        c[a] = flat % dims[a];
        flat /= dims[a];
    }
    c
}

/// ONNX Col2Im: `input [N, C * prod(block), L]` summed into `[N, C, *image_shape]`, the
/// inverse of im2col with `dilations`, `pads` (begin..., end...) and `strides`. Each column
/// entry goes to its image position (entries landing in the padding go to a discarded slot)
/// by a `ScatterElements` with `reduction = add` over zeros.
pub fn col2im(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let image = to_usizes(&cx.const_i64s(n.inp(1)?, "image_shape")?, "image_shape")?;
    let block = to_usizes(&cx.const_i64s(n.inp(2)?, "block_shape")?, "block_shape")?;
    let nd = image.len();
    if nd == 0 || block.len() != nd {
        return Err(format!(
            "image_shape {image:?} and block_shape {block:?} must have the same, non-zero length"
        ));
    }
    let get = |name: &str, def: usize, len: usize| -> R<Vec<usize>> {
        match n.ints(name)? {
            Some(v) => {
                let v = to_usizes(&v, name)?;
                if v.len() != len {
                    return Err(format!("{name} {v:?} needs {len} entries"));
                }
                Ok(v)
            }
            None => Ok(vec![def; len]),
        }
    };
    let dil = get("dilations", 1, nd)?;
    let strides = get("strides", 1, nd)?;
    let pads = get("pads", 0, 2 * nd)?;
    if dil.contains(&0) || strides.contains(&0) || block.contains(&0) {
        return Err("dilations, strides and block_shape must be positive".into());
    }
    let xd = cx.dims(x);
    let k: usize = block.iter().product();
    if xd.len() != 3 || xd[1] % k != 0 {
        return Err(format!("input {} must be [N, C * {k}, L]", cx.shape(x)));
    }
    let (nb, c) = (xd[0], xd[1] / k);
    let mut grid = Vec::with_capacity(nd);
    for i in 0..nd {
        let span = dil[i] * (block[i] - 1) + 1;
        let padded = image[i] + pads[i] + pads[nd + i];
        if padded < span {
            return Err(format!("block {block:?} does not fit the padded image"));
        }
        grid.push((padded - span) / strides[i] + 1);
    }
    let l: usize = grid.iter().product();
    if xd[2] != l {
        return Err(format!(
            "input {} has L = {} but the block grid {grid:?} gives {l}",
            cx.shape(x),
            xd[2]
        ));
    }
    let p: usize = image.iter().product();
    // Target index in [0, p] (p = the discarded slot) for block entry kk and column ll.
    let mut target = Vec::with_capacity(k * l);
    for kk in 0..k {
        let kc = unravel(kk, &block);
        for ll in 0..l {
            let lc = unravel(ll, &grid);
            let mut flat = 0usize;
            let mut inside = true;
            for i in 0..nd {
                let pos = (lc[i] * strides[i] + kc[i] * dil[i]) as i64 - pads[i] as i64;
                if pos < 0 || pos >= image[i] as i64 {
                    inside = false;
                    break;
                }
                flat = flat * image[i] + pos as usize;
            }
            target.push(if inside { flat as i64 } else { p as i64 });
        }
    }
    let idx: Vec<i64> = (0..nb * c).flat_map(|_| target.iter().copied()).collect();
    let idx = cx.constant(Tensor::from_i64(&[nb, c, k * l], idx).map_err(|e| e.to_string())?);
    let xr = cx.reshape(x, vec![nb, c, k * l])?;
    let zero = cx.scalar(cx.dtype(x), 0.0);
    let zeros = cx.add(
        Op::Broadcast {
            dims: vec![nb, c, p + 1],
        },
        vec![zero],
    )?;
    let y = cx.add(
        Op::ScatterElements {
            axis: 2,
            reduction: ScatterReduction::Add,
        },
        vec![zeros, idx, xr],
    )?;
    let y = cx.add(
        Op::Slice {
            starts: vec![0, 0, 0],
            steps: vec![1, 1, 1],
            sizes: vec![nb, c, p],
        },
        vec![y],
    )?;
    let mut od = vec![nb, c];
    od.extend_from_slice(&image);
    Ok(vec![cx.reshape(y, od)?])
}

/// ONNX TensorScatter (opset 24): `present = past_cache` with
/// `present[b, .., (write_indices[b] + s) (mod max_seq if mode = circular), ..] =
/// update[b, .., s, ..]` along `axis` (default -2). `write_indices` (default zeros) may be
/// a runtime value: the indices are `s + write_indices[b]` built with a broadcasting Add,
/// then a `ScatterElements`.
pub fn tensor_scatter(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let past = n.inp(0)?;
    let upd = n.inp(1)?;
    let pd = cx.dims(past);
    let ud = cx.dims(upd);
    let r = pd.len();
    let axis = crate::ctx::norm_axis(n.i("axis", -2)?, r)?;
    if axis == 0 {
        return Err("axis must not be the batch axis 0".into());
    }
    if ud.len() != r || (0..r).any(|a| a != axis && ud[a] != pd[a]) || (ud[axis] > pd[axis]) {
        return Err(format!(
            "update {} does not fit past_cache {} along axis {axis}",
            cx.shape(upd),
            cx.shape(past)
        ));
    }
    let circular = match n.s("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let numel: usize = ud.iter().product();
    let steps: Vec<i64> = (0..numel).map(|f| unravel(f, &ud)[axis] as i64).collect();
    let mut idx = cx.constant(Tensor::from_i64(&ud, steps).map_err(|e| e.to_string())?);
    if let Some(wi) = n.opt(2) {
        if cx.dims(wi) != [pd[0]] {
            return Err(format!(
                "write_indices {} must be [{}]",
                cx.shape(wi),
                pd[0]
            ));
        }
        let wi = cx.cast(wi, rlx_ir::DType::I64)?;
        let mut bd = vec![1; r];
        bd[0] = pd[0];
        let wi = cx.reshape(wi, bd)?;
        idx = cx.binary(BinaryOp::Add, idx, wi)?;
        if circular {
            let m = cx.scalar(rlx_ir::DType::I64, pd[axis] as f64);
            idx = cx.binary(BinaryOp::Mod, idx, m)?;
        }
    }
    Ok(vec![cx.add(
        Op::ScatterElements {
            axis,
            reduction: ScatterReduction::None,
        },
        vec![past, idx, upd],
    )?])
}

/// ONNX GridSample (opset 16: `bilinear`/`bicubic`; opset 20+: `linear`/`cubic`, N-D) →
/// `Op::GridSample`.
pub fn grid_sample(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    use rlx_ir::{GridMode, GridPadding};
    let x = n.inp(0)?;
    let grid = n.inp(1)?;
    let mode = match n
        .s("mode", if n.opset >= 20 { "linear" } else { "bilinear" })?
        .as_str()
    {
        "nearest" => GridMode::Nearest,
        "linear" | "bilinear" => GridMode::Linear,
        "cubic" | "bicubic" => GridMode::Cubic,
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let padding = match n.s("padding_mode", "zeros")?.as_str() {
        "zeros" => GridPadding::Zeros,
        "border" => GridPadding::Border,
        "reflection" => GridPadding::Reflection,
        o => return Err(format!("unknown padding_mode \"{o}\"")),
    };
    let align_corners = n.i("align_corners", 0)? != 0;
    Ok(vec![cx.add(
        Op::GridSample {
            mode,
            padding,
            align_corners,
        },
        vec![x, grid],
    )?])
}
