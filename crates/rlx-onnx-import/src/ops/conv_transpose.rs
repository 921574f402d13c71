//! ONNX ConvTranspose, lowered onto `Conv` (any spatial rank, groups, strides, dilations,
//! pads, output_padding, auto_pad, output_shape).
//!
//! The transposed convolution of `X [N, C, *in]` with `W [C, M/g, *k]` equals a stride-1
//! convolution of `X` upsampled with `s - 1` zeros between elements, padded by
//! `d*(k-1) - pad_begin` before and `d*(k-1) - pad_end + output_padding` after (cropped
//! where negative), with `W` regrouped to `[M, C/g, *k]` and flipped along every spatial
//! axis. Output size per spatial axis (ONNX spec):
//! `s*(in-1) + output_padding + d*(k-1) + 1 - pad_begin - pad_end`.
//! Every step is a graph op, so `W` may be a runtime input.

use crate::ctx::{to_usizes, Ctx, ONode, R};
use rlx_ir::{NodeId, Op, PadMode};

/// Pad (`> 0`) or crop (`< 0`) `x` along `axis` by `begin` / `end` elements.
fn pad_or_crop(cx: &mut Ctx, x: NodeId, axis: usize, begin: i64, end: i64) -> R<NodeId> {
    let d = cx.dims(x);
    let r = d.len();
    let mut y = x;
    if begin > 0 || end > 0 {
        let mut pads = vec![(0usize, 0usize); r];
        pads[axis] = (begin.max(0) as usize, end.max(0) as usize);
        y = cx.add(
            Op::Pad {
                pads,
                mode: PadMode::Constant(0.0),
            },
            vec![y],
        )?;
    }
    if begin < 0 || end < 0 {
        let yd = cx.dims(y);
        let cb = (-begin).max(0) as usize;
        let ce = (-end).max(0) as usize;
        if cb + ce >= yd[axis] {
            return Err(format!(
                "pads crop the whole spatial axis {} (size {})",
                axis - 2,
                yd[axis]
            ));
        }
        y = super::shape::slice_axis(cx, y, axis, cb, yd[axis] - cb - ce)?;
    }
    Ok(y)
}

/// Insert `s - 1` zeros between the elements of `x` along `axis`.
fn zero_stuff(cx: &mut Ctx, x: NodeId, axis: usize, s: usize) -> R<NodeId> {
    if s == 1 {
        return Ok(x);
    }
    let d = cx.dims(x);
    let n = d[axis];
    let mut d1 = d.clone();
    d1.insert(axis + 1, 1);
    let y = cx.reshape(x, d1.clone())?;
    let mut pads = vec![(0, 0); d1.len()];
    pads[axis + 1] = (0, s - 1);
    let y = cx.add(
        Op::Pad {
            pads,
            mode: PadMode::Constant(0.0),
        },
        vec![y],
    )?;
    let mut d2 = d.clone();
    d2[axis] = n * s;
    let y = cx.reshape(y, d2)?;
    // keep (n-1)*s + 1 elements: drop the trailing s-1 zeros
    pad_or_crop(cx, y, axis, 0, -(s as i64 - 1))
}

/// ONNX ConvTranspose.
pub fn conv_transpose(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, w) = (n.inp(0)?, n.inp(1)?);
    let (xd, wd) = (cx.dims(x), cx.dims(w));
    let r = xd.len();
    if r < 3 || wd.len() != r {
        return Err(format!(
            "X {} and W {} must have the same rank >= 3",
            cx.shape(x),
            cx.shape(w)
        ));
    }
    let ns = r - 2;
    let g = n.i("group", 1)?;
    let g = usize::try_from(g)
        .ok()
        .filter(|&g| g > 0)
        .ok_or(format!("bad group {g}"))?;
    let c = xd[1];
    if wd[0] != c || c % g != 0 {
        return Err(format!(
            "W {:?} must have X's {c} channels first, divisible by group {g}",
            wd
        ));
    }
    let m = wd[1] * g;
    let k = wd[2..].to_vec();
    if let Some(ks) = n.ints("kernel_shape")? {
        if to_usizes(&ks, "kernel_shape")? != k {
            return Err(format!("kernel_shape {ks:?} does not match W {wd:?}"));
        }
    }
    let get = |name: &str, def: usize| n.spatial_ints(name, ns, def);
    let strides = get("strides", 1)?;
    let dil = get("dilations", 1)?;
    let out_pad = get("output_padding", 0)?;
    if strides.contains(&0) || dil.contains(&0) {
        return Err("strides and dilations must be positive".into());
    }
    let full: Vec<i64> = (0..ns)
        .map(|i| (strides[i] * (xd[i + 2] - 1) + out_pad[i] + dil[i] * (k[i] - 1) + 1) as i64)
        .collect();
    // Pads as onnx's reference resolves them (op_conv_transpose.py): explicit `pads`;
    // otherwise SAME_* splits `full - output_shape` (output_shape defaulting to in*s),
    // and NOTSET with `output_shape` keeps pad_begin 0 and fills/crops at the end.
    let auto_pad = n.s("auto_pad", "NOTSET")?;
    let output_shape = match n.ints("output_shape")? {
        Some(os) => {
            let os = if os.len() == r { os[2..].to_vec() } else { os };
            if os.len() != ns {
                return Err(format!("output_shape {os:?} needs {ns} entries"));
            }
            Some(os)
        }
        None => None,
    };
    let explicit = n.ints("pads")?;
    let same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    let pads: Vec<(i64, i64)> = if let (Some(p), false) = (&explicit, same) {
        if p.len() != 2 * ns {
            return Err(format!("pads {p:?} needs {} entries", 2 * ns));
        }
        (0..ns).map(|i| (p[i], p[i + ns])).collect()
    } else if same {
        (0..ns)
            .map(|i| {
                let os = output_shape
                    .as_ref()
                    .map_or((xd[i + 2] * strides[i]) as i64, |o| o[i]);
                let total = full[i] - os;
                let half = total.div_euclid(2);
                if auto_pad == "SAME_UPPER" {
                    (half, total - half)
                } else {
                    (total - half, half)
                }
            })
            .collect()
    } else {
        match auto_pad.as_str() {
            "NOTSET" | "VALID" => (0..ns)
                .map(|i| (0, output_shape.as_ref().map_or(0, |o| full[i] - o[i])))
                .collect(),
            o => return Err(format!("unknown auto_pad \"{o}\"")),
        }
    };
    // X: zero-stuff, then pad/crop.
    let mut y = x;
    for i in 0..ns {
        y = zero_stuff(cx, y, i + 2, strides[i])?;
        let span = (dil[i] * (k[i] - 1)) as i64;
        y = pad_or_crop(
            cx,
            y,
            i + 2,
            span - pads[i].0,
            span - pads[i].1 + out_pad[i] as i64,
        )?;
    }
    // W [C, M/g, *k] → [g, C/g, M/g, *k] → [g, M/g, C/g, *k] → [M, C/g, *k], flipped.
    let mut wg = vec![g, c / g, wd[1]];
    wg.extend_from_slice(&k);
    let wt = cx.reshape(w, wg)?;
    let mut perm = vec![0, 2, 1];
    perm.extend(3..3 + ns);
    let wt = cx.add(Op::Transpose { perm }, vec![wt])?;
    let mut wm = vec![m, c / g];
    wm.extend_from_slice(&k);
    let wt = cx.reshape(wt, wm.clone())?;
    let mut starts = vec![0; r];
    let mut steps = vec![1i64; r];
    for i in 0..ns {
        starts[i + 2] = k[i] - 1;
        steps[i + 2] = -1;
    }
    let wt = cx.add(
        Op::Slice {
            starts,
            steps,
            sizes: wm,
        },
        vec![wt],
    )?;
    let attrs = rlx_ir::ConvAttrs {
        strides: vec![1; ns],
        pads: vec![(0, 0); ns],
        dilations: dil,
        groups: g,
    };
    let mut ins = vec![y, wt];
    ins.extend(n.opt(2));
    Ok(vec![cx.add(Op::Conv(attrs), ins)?])
}
