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
    if xd.len() != 3 || !xd[1].is_multiple_of(k) {
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

/// ONNX DeformConv (opset 19, 2-D): each kernel tap samples `X` bilinearly at its regular
/// position plus the learned `offset` (`[N, offset_group * 2 * kH * kW, oH, oW]`, (dy, dx)
/// pairs per tap), scaled by `mask` when given; the sampled columns are then contracted
/// with `W` per group (as im2col + MatMul) and `B` is added.
///
/// Lowering: the sampling positions become a normalized grid (`align_corners = 0`,
/// `x_norm = (2x + 1) / W - 1`) for one `GridSample` (linear, zeros) per offset group,
/// whose zero padding is DeformConv's (a tap outside the image reads 0).
pub fn deform_conv(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    use rlx_ir::{GridMode, GridPadding};
    let x = n.inp(0)?;
    let w = n.inp(1)?;
    let off = n.inp(2)?;
    let xd = cx.dims(x);
    let wd = cx.dims(w);
    if xd.len() != 4 || wd.len() != 4 {
        return Err(format!(
            "only 2-D DeformConv is supported: X {}, W {}",
            cx.shape(x),
            cx.shape(w)
        ));
    }
    let (nb, c, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
    let (oc, kh, kw) = (wd[0], wd[2], wd[3]);
    if let Some(ks) = n.ints("kernel_shape")? {
        if ks != [kh as i64, kw as i64] {
            return Err(format!("kernel_shape {ks:?} does not match W {wd:?}"));
        }
    }
    let ints2 = |name: &str, def: usize, len: usize| -> R<Vec<usize>> {
        match n.ints(name)? {
            Some(v) if v.len() == len => to_usizes(&v, name),
            Some(v) => Err(format!("{name} {v:?} needs {len} entries")),
            None => Ok(vec![def; len]),
        }
    };
    let s = ints2("strides", 1, 2)?;
    let d = ints2("dilations", 1, 2)?;
    let p = ints2("pads", 0, 4)?;
    let group = n.i("group", 1)?.max(1) as usize;
    let og = n.i("offset_group", 1)?.max(1) as usize;
    if s.contains(&0) || d.contains(&0) || c % group != 0 || oc % group != 0 || c % og != 0 {
        return Err(format!(
            "bad attributes: strides {s:?}, dilations {d:?}, group {group}, offset_group {og} for C {c}, M {oc}"
        ));
    }
    if wd[1] * group != c {
        return Err(format!(
            "W {wd:?} needs C / group = {} input channels",
            c / group
        ));
    }
    let out_dim = |len: usize, pb: usize, pe: usize, k: usize, st: usize, dl: usize| -> R<usize> {
        let span = dl * (k - 1) + 1;
        let padded = len + pb + pe;
        if k == 0 || padded < span {
            return Err(format!("kernel {k} does not fit the padded input {padded}"));
        }
        Ok((padded - span) / st + 1)
    };
    let oh = out_dim(h, p[0], p[2], kh, s[0], d[0])?;
    let ow = out_dim(wi, p[1], p[3], kw, s[1], d[1])?;
    let k = kh * kw;
    if cx.dims(off) != [nb, og * 2 * k, oh, ow] {
        return Err(format!(
            "offset {} must be [{nb}, {}, {oh}, {ow}]",
            cx.shape(off),
            og * 2 * k
        ));
    }
    let mask = match n.opt(4) {
        Some(m) => {
            if cx.dims(m) != [nb, og * k, oh, ow] {
                return Err(format!(
                    "mask {} must be [{nb}, {}, {oh}, {ow}]",
                    cx.shape(m),
                    og * k
                ));
            }
            Some(cx.reshape(m, vec![nb, og, 1, k, oh, ow])?)
        }
        None => None,
    };
    let dt = cx.dtype(x);
    // Regular tap positions [K, oH, oW] along each axis, already normalized:
    // norm = pos * (2 / L) + (1 / L - 1).
    let mut base_y = Vec::with_capacity(k * oh * ow);
    let mut base_x = Vec::with_capacity(k * oh * ow);
    for t in 0..k {
        let (ti, tj) = (t / kw, t % kw);
        for a in 0..oh {
            for b in 0..ow {
                base_y.push((a * s[0] + ti * d[0]) as f64 - p[0] as f64);
                base_x.push((b * s[1] + tj * d[1]) as f64 - p[1] as f64);
            }
        }
    }
    let konst = |cx: &mut Ctx, v: Vec<f64>| -> R<NodeId> {
        let t = Tensor::new(vec![k, oh, ow], rlx_ir::TensorData::from_f64(dt, &v))
            .map_err(|e| e.to_string())?;
        Ok(cx.constant(t))
    };
    let by = konst(cx, base_y)?;
    let bx = konst(cx, base_x)?;
    let off = cx.reshape(off, vec![nb, og, k, 2, oh, ow])?;
    let cg = c / og;
    let norm = |cx: &mut Ctx, v: NodeId, len: usize| -> R<NodeId> {
        let sc = cx.scalar(dt, 2.0 / len as f64);
        let sh = cx.scalar(dt, 1.0 / len as f64 - 1.0);
        let v = cx.binary(BinaryOp::Mul, v, sc)?;
        cx.binary(BinaryOp::Add, v, sh)
    };
    let slice6 = |cx: &mut Ctx, v: NodeId, dims: &[usize], ax: usize, at: usize| -> R<NodeId> {
        let mut starts = vec![0; dims.len()];
        let mut sizes = dims.to_vec();
        starts[ax] = at;
        sizes[ax] = 1;
        cx.add(
            Op::Slice {
                starts,
                steps: vec![1; dims.len()],
                sizes,
            },
            vec![v],
        )
    };
    let offd = [nb, og, k, 2, oh, ow];
    let mut cols = Vec::with_capacity(og);
    for g in 0..og {
        let og_off = slice6(cx, off, &offd, 1, g)?;
        let od = [nb, 1, k, 2, oh, ow];
        let dy = slice6(cx, og_off, &od, 3, 0)?;
        let dx = slice6(cx, og_off, &od, 3, 1)?;
        let dy = cx.reshape(dy, vec![nb, k, oh, ow])?;
        let dx = cx.reshape(dx, vec![nb, k, oh, ow])?;
        let py = cx.binary(BinaryOp::Add, dy, by)?;
        let px = cx.binary(BinaryOp::Add, dx, bx)?;
        let gy = norm(cx, py, h)?;
        let gx = norm(cx, px, wi)?;
        let gy = cx.reshape(gy, vec![nb, k * oh, ow, 1])?;
        let gx = cx.reshape(gx, vec![nb, k * oh, ow, 1])?;
        let grid = cx.add(Op::Concat { axis: 3 }, vec![gx, gy])?;
        let xg = if og == 1 {
            x
        } else {
            cx.add(
                Op::Slice {
                    starts: vec![0, g * cg, 0, 0],
                    steps: vec![1; 4],
                    sizes: vec![nb, cg, h, wi],
                },
                vec![x],
            )?
        };
        let col = cx.add(
            Op::GridSample {
                mode: GridMode::Linear,
                padding: GridPadding::Zeros,
                align_corners: false,
            },
            vec![xg, grid],
        )?;
        let mut col = cx.reshape(col, vec![nb, cg, k, oh, ow])?;
        if let Some(m) = mask {
            let md = [nb, og, 1, k, oh, ow];
            let mg = slice6(cx, m, &md, 1, g)?;
            let mg = cx.reshape(mg, vec![nb, 1, k, oh, ow])?;
            col = cx.binary(BinaryOp::Mul, col, mg)?;
        }
        cols.push(col);
    }
    let cols = if cols.len() == 1 {
        cols[0]
    } else {
        cx.add(Op::Concat { axis: 1 }, cols)?
    };
    // [N, group, (C/group) * K, oH * oW] against W [group, M/group, (C/group) * K].
    let cpg = c / group;
    let cols = cx.reshape(cols, vec![nb, group, cpg * k, oh * ow])?;
    let wm = cx.reshape(w, vec![group, oc / group, cpg * k])?;
    let y = cx.add(Op::MatMul, vec![wm, cols])?;
    let mut y = cx.reshape(y, vec![nb, oc, oh, ow])?;
    if let Some(b) = n.opt(3) {
        if cx.dims(b) != [oc] {
            return Err(format!("B {} must be [{oc}]", cx.shape(b)));
        }
        let b = cx.reshape(b, vec![oc, 1, 1])?;
        y = cx.binary(BinaryOp::Add, y, b)?;
    }
    Ok(vec![y])
}
