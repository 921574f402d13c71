//! Layout and structured-constant ops lowered onto Reshape / Transpose / Select:
//! DepthToSpace, SpaceToDepth, EyeLike, Trilu with a runtime `k`.

use crate::ctx::{Ctx, ONode, R};
use crate::tensor::{dtype_of, onnx_type_name};
use rlx_ir::{BinaryOp, DType, NodeId, Op, Tensor, TensorData};

fn blocksize(n: &ONode) -> R<usize> {
    let b = n.i("blocksize", 0)?;
    if b <= 0 {
        return Err(format!("blocksize must be positive, got {b}"));
    }
    Ok(b as usize)
}

fn dims4(cx: &Ctx, x: NodeId) -> R<[usize; 4]> {
    let d = cx.dims(x);
    d.clone()
        .try_into()
        .map_err(|_| format!("input must be 4-D, got {}", cx.shape(x)))
}

/// ONNX DepthToSpace (`mode` DCR default, or CRD): a Reshape, a Transpose, a Reshape.
pub fn depth_to_space(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let bs = blocksize(n)?;
    let [b, c, h, w] = dims4(cx, x)?;
    if bs > c || c % (bs * bs) != 0 {
        return Err(format!(
            "channels {c} are not divisible by blocksize^2 = {}",
            bs * bs
        ));
    }
    let cc = c / (bs * bs);
    let (tmp, perm) = match n.s("mode", "DCR")?.as_str() {
        "DCR" => (vec![b, bs, bs, cc, h, w], vec![0, 3, 4, 1, 5, 2]),
        "CRD" => (vec![b, cc, bs, bs, h, w], vec![0, 1, 4, 2, 5, 3]),
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let y = cx.reshape(x, tmp)?;
    let y = cx.add(Op::Transpose { perm }, vec![y])?;
    Ok(vec![cx.reshape(y, vec![b, cc, h * bs, w * bs])?])
}

/// ONNX SpaceToDepth (`mode` DCR default, CRD from opset 28).
pub fn space_to_depth(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let bs = blocksize(n)?;
    let [b, c, h, w] = dims4(cx, x)?;
    if h % bs != 0 || w % bs != 0 {
        return Err(format!(
            "spatial dims {h}x{w} are not divisible by blocksize {bs}"
        ));
    }
    let perm = match n.s("mode", "DCR")?.as_str() {
        "DCR" => vec![0, 3, 5, 1, 2, 4],
        "CRD" => vec![0, 1, 3, 5, 2, 4],
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let y = cx.reshape(x, vec![b, c, h / bs, bs, w / bs, bs])?;
    let y = cx.add(Op::Transpose { perm }, vec![y])?;
    Ok(vec![cx.reshape(y, vec![b, c * bs * bs, h / bs, w / bs])?])
}

/// ONNX EyeLike: a constant of the input's 2-D shape with ones on diagonal `k`
/// (`dtype` attribute, default the input's type).
pub fn eye_like(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    let [rows, cols] = d[..] else {
        return Err(format!("input must be 2-D, got {}", cx.shape(x)));
    };
    let dt = match n.attr("dtype") {
        Some(a) => dtype_of(a.i as i32)
            .ok_or_else(|| format!("dtype {} is not supported", onnx_type_name(a.i as i32)))?,
        None => cx.dtype(x),
    };
    let k = n.i("k", 0)?;
    let v: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let (r, c) = ((i / cols) as i64, (i % cols) as i64);
            if c - r == k {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let t =
        Tensor::new(vec![rows, cols], TensorData::from_f64(dt, &v)).map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)])
}

/// ONNX Trilu. A constant `k` becomes `Op::Trilu`; a runtime `k` a mask
/// `(col - row) >= k` (upper) or `<= k` (lower) over the last two axes, and a Select.
pub fn trilu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let upper = n.i("upper", 1)? != 0;
    let k = match n.opt(1) {
        None => {
            return Ok(vec![cx.add(Op::Trilu { upper, k: 0 }, vec![x])?]);
        }
        Some(k) => k,
    };
    if let Some(t) = cx.const_tensor(k) {
        let kv = *t.data().to_i64_vec().first().ok_or("k is empty")?;
        return Ok(vec![cx.add(Op::Trilu { upper, k: kv }, vec![x])?]);
    }
    let d = cx.dims(x);
    if d.len() < 2 {
        return Err(format!("input must have rank >= 2, got {}", cx.shape(x)));
    }
    if cx.dims(k).iter().product::<usize>() != 1 {
        return Err(format!("k must hold one value, got {}", cx.shape(k)));
    }
    let (rows, cols) = (d[d.len() - 2], d[d.len() - 1]);
    let diff: Vec<i64> = (0..rows * cols)
        .map(|i| (i % cols) as i64 - (i / cols) as i64)
        .collect();
    let diff = cx.constant(Tensor::from_i64(&[rows, cols], diff).map_err(|e| e.to_string())?);
    let k = cx.reshape(k, vec![])?;
    let k = cx.cast(k, DType::I64)?;
    let cmp = if upper { BinaryOp::Ge } else { BinaryOp::Le };
    let mask = cx.binary(cmp, diff, k)?;
    let zero = cx.scalar(cx.dtype(x), 0.0);
    Ok(vec![cx.add(Op::Select, vec![mask, x, zero])?])
}

/// ONNX AffineGrid (opset 20): `theta [N, 2, 3]` (or `[N, 3, 4]`) applied to the constant
/// homogeneous grid of normalized coordinates `(x, y[, z], 1)` for `size = [N, C, (D,) H, W]`;
/// output `[N, (D,) H, W, 2|3]`.
pub fn affine_grid(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let theta = n.inp(0)?;
    let size = cx.const_i64s(n.inp(1)?, "size")?;
    let sz = crate::ctx::to_usizes(&size, "size")?;
    let td = cx.dims(theta);
    let nd = sz.len().saturating_sub(2);
    if !(nd == 2 || nd == 3) || td != [sz[0], nd, nd + 1] {
        return Err(format!(
            "theta {} and size {size:?} do not describe a 2-D or 3-D affine grid",
            cx.shape(theta)
        ));
    }
    let align = n.i("align_corners", 0)? != 0;
    let spatial = &sz[2..];
    let coords = |len: usize| -> Vec<f64> {
        (0..len)
            .map(|i| {
                if align {
                    -1.0 + i as f64 * (2.0 / (len as f64 - 1.0))
                } else {
                    let step = 2.0 / len as f64;
                    -1.0 + step / 2.0 + i as f64 * step
                }
            })
            .collect()
    };
    let axes: Vec<Vec<f64>> = spatial.iter().map(|&l| coords(l)).collect();
    let p: usize = spatial.iter().product();
    // Rows of the transposed homogeneous grid: x (last spatial axis), y, (z), 1.
    let mut base = vec![0.0; (nd + 1) * p];
    for k in 0..p {
        let mut rem = k;
        let mut idx = vec![0; nd];
        for a in (0..nd).rev() {
            idx[a] = rem % spatial[a];
            rem /= spatial[a];
        }
        for c in 0..nd {
            let a = nd - 1 - c;
            base[c * p + k] = axes[a][idx[a]];
        }
        base[nd * p + k] = 1.0;
    }
    let dt = cx.dtype(theta);
    let base = cx.constant(
        Tensor::new(vec![nd + 1, p], TensorData::from_f64(dt, &base)).map_err(|e| e.to_string())?,
    );
    let g = cx.add(Op::MatMul, vec![theta, base])?;
    let g = cx.add(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        vec![g],
    )?;
    let mut out = vec![sz[0]];
    out.extend_from_slice(spatial);
    out.push(nd);
    Ok(vec![cx.reshape(g, out)?])
}

/// ONNX CenterCropPad (opset 18): per axis, a centered Slice (crop) or a centered zero Pad
/// to the constant target `shape` (the extra element of an odd difference goes to the end).
pub fn center_crop_pad(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let shape = crate::ctx::to_usizes(&cx.const_i64s(n.inp(1)?, "shape")?, "shape")?;
    let d = cx.dims(x);
    let r = d.len();
    let axes = match n.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| crate::ctx::norm_axis(a, r))
            .collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    if axes.len() != shape.len() {
        return Err(format!("shape {shape:?} needs one entry per axis {axes:?}"));
    }
    let mut starts = vec![0; r];
    let mut sizes = d.clone();
    let mut pads = vec![(0, 0); r];
    for (&a, &s) in axes.iter().zip(&shape) {
        if s < d[a] {
            starts[a] = (d[a] - s) / 2;
            sizes[a] = s;
        } else if s > d[a] {
            let t = s - d[a];
            pads[a] = (t / 2, t - t / 2);
        }
    }
    let mut y = x;
    if sizes != d {
        y = cx.add(
            Op::Slice {
                starts,
                steps: vec![1; r],
                sizes,
            },
            vec![y],
        )?;
    }
    if pads.iter().any(|&(b, e)| b > 0 || e > 0) {
        y = cx.add(
            Op::Pad {
                pads,
                mode: rlx_ir::PadMode::Constant(0.0),
            },
            vec![y],
        )?;
    }
    Ok(vec![y])
}
