//! Shape and index ops: Reshape, Transpose, Concat, Split, Slice, Gather(Elements),
//! (Un)Squeeze, Flatten, Expand, Shape, Size, ConstantOfShape, Constant, Range, Tile, Pad,
//! Cast, CastLike, Identity. Shape-defining inputs must be constants at import time.

use crate::ctx::{norm_axes, norm_axis, to_usizes, Ctx, ONode, R};
use crate::tensor::{dtype_of, onnx_type_name, tensor_from_proto};
use rlx_ir::{broadcast_dims, DType, NodeId, Op, PadMode, Tensor, TensorData};

#[path = "shape_sym.rs"]
mod sym_ops;

/// `x` flattened to 2-D around `axis` with symbolic sizes (ONNX Flatten's rule), for the
/// translators of other ops that coerce their input so (Softmax before opset 13).
pub(crate) fn flatten_sym(cx: &mut Ctx, x: NodeId, axis: usize) -> R<NodeId> {
    Ok(sym_ops::flatten(cx, x, axis as i64)?[0])
}

/// Identity (and aliases): no node, the output is the input.
pub fn identity(_cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    Ok(vec![n.inp(0)?])
}

/// ONNX Cast (`to` is a `TensorProto.DataType`; `saturate`, default 1, only changes casts
/// to float8). A cast to the same type is an alias. `round_mode` (opset 24+, casts to
/// FLOAT8E8M0 only): `up` (the default) is the Cast kernel's rounding; `down` and `nearest`
/// are lowered by [`cast_e8m0_rounded`].
pub fn cast(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let to = n.i("to", 0)? as i32;
    let to =
        dtype_of(to).ok_or_else(|| format!("cast to {} is not supported", onnx_type_name(to)))?;
    let saturate = n.i("saturate", 1)? != 0;
    cast_rounded(cx, n, x, to, saturate)
}

/// A Cast honouring `round_mode` for a FLOAT8E8M0 target.
fn cast_rounded(cx: &mut Ctx, n: &ONode, x: NodeId, to: DType, saturate: bool) -> R<Vec<NodeId>> {
    let mode = n.s("round_mode", "up")?;
    if to != DType::F8E8M0 || mode == "up" || cx.dtype(x) == to {
        return Ok(vec![cx.cast_sat(x, to, saturate)?]);
    }
    let nearest = match mode.as_str() {
        "down" => false,
        "nearest" => true,
        m => return Err(format!("round_mode \"{m}\" must be up, down or nearest")),
    };
    Ok(vec![cast_e8m0_rounded(cx, x, saturate, nearest)?])
}

/// Cast to FLOAT8E8M0 rounding `down` or to `nearest` (onnx `numpy_helper.to_float8e8m0`):
/// on the float32 bits `b` (sign dropped), exponent `e = b >> 23` and mantissa `m`; `nearest`
/// adds one to `e` when the guard bit (0x400000) is set and a lower mantissa bit is set or
/// `e > 0`, except for NaN/Inf (`e = 255`) and, with `saturate`, at `e = 254`. The code `e`
/// is turned back into the float `2^(e-127)` (bits `e << 23`), which the Cast kernel
/// encodes exactly.
fn cast_e8m0_rounded(cx: &mut Ctx, x: NodeId, saturate: bool, nearest: bool) -> R<NodeId> {
    use rlx_ir::BinaryOp as B;
    let xf = cx.cast(x, DType::F32)?;
    let bits = cx.add(Op::BitCast { to: DType::I32 }, vec![xf])?;
    let bits = cx.cast(bits, DType::I64)?;
    let k = |cx: &mut Ctx, v: i64| cx.scalar(DType::I64, v as f64);
    let mask = k(cx, 0x7fff_ffff);
    let a = cx.binary(B::BitAnd, bits, mask)?;
    let sh = k(cx, 23);
    let mut e = cx.binary(B::ShiftRight, a, sh)?;
    if nearest {
        let mm = k(cx, 0x7f_ffff);
        let m = cx.binary(B::BitAnd, a, mm)?;
        let gb = k(cx, 0x40_0000);
        let gm = cx.binary(B::BitAnd, m, gb)?;
        let zero = k(cx, 0);
        let g = cx.binary(B::Gt, gm, zero)?;
        let rsb = k(cx, 0x3f_ffff);
        let rs = cx.binary(B::BitAnd, m, rsb)?;
        let rs = cx.binary(B::Gt, rs, zero)?;
        let lsb = cx.binary(B::Gt, e, zero)?;
        let either = cx.binary(B::Or, rs, lsb)?;
        let mut up = cx.binary(B::And, g, either)?;
        let top = k(cx, if saturate { 254 } else { 255 });
        let below = cx.binary(B::Lt, e, top)?;
        up = cx.binary(B::And, up, below)?;
        let up = cx.cast(up, DType::I64)?;
        e = cx.binary(B::Add, e, up)?;
    }
    let code_bits = cx.binary(B::ShiftLeft, e, sh)?;
    let code_bits = cx.cast(code_bits, DType::I32)?;
    let f = cx.add(Op::BitCast { to: DType::F32 }, vec![code_bits])?;
    cx.cast_sat(f, DType::F8E8M0, true)
}

/// ONNX BitCast (opset 26): reinterpret the bits of each element as `to` (same width).
pub fn bitcast(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let to = n.i("to", 0)? as i32;
    let to = dtype_of(to)
        .ok_or_else(|| format!("BitCast to {} is not supported", onnx_type_name(to)))?;
    if cx.dtype(x) == to {
        return Ok(vec![x]);
    }
    Ok(vec![cx.add(Op::BitCast { to }, vec![x])?])
}

/// ONNX CastLike: cast input 0 to the element type of input 1 (`saturate` as in Cast).
pub fn cast_like(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, like) = (n.inp(0)?, n.inp(1)?);
    let to = cx.dtype(like);
    let saturate = n.i("saturate", 1)? != 0;
    cast_rounded(cx, n, x, to, saturate)
}

/// ONNX Reshape: shape from input 1 (attribute `shape` before opset 5); `0` copies the
/// input dim (unless `allowzero`), `-1` is inferred.
pub fn reshape(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if n.opset >= 5 && (cx.is_symbolic(x) || cx.is_symbolic(n.inp(1)?)) {
        return sym_ops::reshape(cx, n, x);
    }
    let spec = if n.opset >= 5 {
        cx.const_i64s(n.inp(1)?, "shape")?
    } else {
        n.ints("shape")?.ok_or("shape attribute is required")?
    };
    let allowzero = n.i("allowzero", 0)? != 0;
    let xd = cx.dims(x);
    let total = rlx_ir::infer_shape::checked_numel(&xd)
        .ok_or_else(|| format!("input dims {xd:?} hold more elements than fit in memory"))?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(
                *xd.get(i)
                    .ok_or_else(|| format!("shape {spec:?}: 0 at {i} has no input dim to copy"))?,
            ),
            s if s >= 0 => out.push(s as usize),
            _ => return Err(format!("invalid shape {spec:?}")),
        }
    }
    if let Some(i) = infer {
        let known = rlx_ir::infer_shape::checked_numel(&out).unwrap_or(0);
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!(
                "cannot reshape {} elements {xd:?} to {spec:?}",
                total
            ));
        }
        out[i] = total / known;
    }
    Ok(vec![cx.reshape(x, out)?])
}

/// ONNX Transpose; `perm` defaults to reversing the axes.
pub fn transpose(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let perm = match n.ints("perm")? {
        Some(p) => p.iter().map(|&a| norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => (0..r).rev().collect(),
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(vec![x]);
    }
    Ok(vec![cx.add(Op::Transpose { perm }, vec![x])?])
}

pub fn concat(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let ins = (0..n.n_inputs()).map(|i| n.inp(i)).collect::<R<Vec<_>>>()?;
    if ins.is_empty() {
        return Err("Concat needs at least one input (inputs: 1 to 2147483647)".into());
    }
    let axis = norm_axis(
        n.i("axis", i64::MIN).and_then(|a| {
            if a == i64::MIN {
                Err("axis attribute is required".into())
            } else {
                Ok(a)
            }
        })?,
        cx.rank(ins[0]),
    )?;
    if ins.len() == 1 {
        return Ok(ins);
    }
    Ok(vec![cx.add(Op::Concat { axis }, ins)?])
}

/// A slice of `x` along one axis: elements `start..start+size`.
pub(crate) fn slice_axis(
    cx: &mut Ctx,
    x: NodeId,
    axis: usize,
    start: usize,
    size: usize,
) -> R<NodeId> {
    if cx.is_symbolic(x) {
        return sym_ops::slice_axis(cx, x, axis, start, size);
    }
    let d = cx.dims(x);
    if axis >= d.len() || start.checked_add(size).is_none_or(|e| e > d[axis]) {
        return Err(format!(
            "cannot take elements {start}..{} of axis {axis} of {}",
            start.saturating_add(size),
            cx.shape(x)
        ));
    }
    if start == 0 && size == d[axis] {
        return Ok(x);
    }
    let mut starts = vec![0; d.len()];
    let mut sizes = d.clone();
    starts[axis] = start;
    sizes[axis] = size;
    cx.add(
        Op::Slice {
            starts,
            steps: vec![1; d.len()],
            sizes,
        },
        vec![x],
    )
}

/// ONNX Split into `len(outputs)` pieces along `axis`: sizes from input 1 (opset 13+),
/// attribute `split` (older), or equal pieces (`num_outputs`, opset 18: last one smaller).
pub fn split(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let axis = norm_axis(n.i("axis", 0)?, cx.rank(x))?;
    let d = match cx.sdims(x)[axis].as_const() {
        // Only the split axis's size is read as a number.
        Some(_) if cx.is_symbolic(x) => cx.probe_sizes(&cx.sdims(x), "dims")?,
        _ => cx.dims(x),
    };
    let nout = n.proto.output.len();
    let given = if n.opset >= 13 {
        match n.opt(1) {
            Some(s) => Some(cx.const_i64s(s, "split")?),
            None => None,
        }
    } else {
        n.ints("split")?
    };
    let sizes = match given {
        Some(s) => to_usizes(&s, "split")?,
        None => {
            let k = n.i("num_outputs", nout as i64)?.max(1) as usize;
            let chunk = d[axis].div_ceil(k);
            if n.opset < 18 && !d[axis].is_multiple_of(k) {
                return Err(format!("dim {} does not split evenly into {k}", d[axis]));
            }
            (0..k)
                .map(|i| chunk.min(d[axis].saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.iter().sum::<usize>() != d[axis] || sizes.len() < nout {
        return Err(format!(
            "split sizes {sizes:?} do not cover dim {} with {nout} outputs",
            d[axis]
        ));
    }
    let mut start = 0;
    let mut outs = Vec::new();
    for s in sizes {
        outs.push(slice_axis(cx, x, axis, start, s)?);
        start += s;
    }
    Ok(outs)
}

/// ONNX Slice: starts/ends/axes/steps from inputs (opset 10+) or attributes (older),
/// with the spec's clamping of out-of-range starts/ends.
pub fn slice(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if n.opset >= 10 && (1..5).any(|i| n.opt(i).is_some_and(|id| cx.is_symbolic(id)))
        || cx.is_symbolic(x)
    {
        return sym_ops::slice(cx, n, x);
    }
    let d = cx.dims(x);
    let r = d.len();
    let (starts, ends, axes, steps) = if n.opset >= 10 {
        let get = |i: usize, what: &str| -> R<Option<Vec<i64>>> {
            n.opt(i).map(|id| cx.const_i64s(id, what)).transpose()
        };
        (
            get(1, "starts")?.ok_or("starts input is required")?,
            get(2, "ends")?.ok_or("ends input is required")?,
            get(3, "axes")?,
            get(4, "steps")?,
        )
    } else {
        (
            n.ints("starts")?.ok_or("starts attribute is required")?,
            n.ints("ends")?.ok_or("ends attribute is required")?,
            n.ints("axes")?,
            None,
        )
    };
    let k = starts.len();
    let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; k]);
    if ends.len() != k || axes.len() != k || steps.len() != k {
        return Err(format!(
            "starts/ends/axes/steps lengths differ: {k}/{}/{}/{}",
            ends.len(),
            axes.len(),
            steps.len()
        ));
    }
    let mut st = vec![0usize; r];
    let mut sp = vec![1i64; r];
    let mut sz = d.clone();
    let mut seen = vec![false; r];
    for i in 0..k {
        let a = norm_axis(axes[i], r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(format!("axis {} repeats", axes[i]));
        }
        let step = steps[i];
        if step == 0 {
            return Err("step 0".into());
        }
        let dim = d[a] as i128;
        let norm = |v: i64| if v < 0 { v as i128 + dim } else { v as i128 };
        let (s, e) = (norm(starts[i]), norm(ends[i]));
        let (s, size) = if step > 0 {
            let s = s.clamp(0, dim);
            let e = e.clamp(0, dim);
            (s, ((e - s).max(0) + step as i128 - 1) / step as i128)
        } else if dim == 0 {
            // Nothing to take backwards from an empty axis (and `clamp(0, -1)` would panic).
            (0, 0)
        } else {
            let s = s.clamp(0, dim - 1);
            let e = e.clamp(-1, dim - 1);
            let m = -(step as i128);
            (s, ((s - e).max(0) + m - 1) / m)
        };
        sp[a] = step;
        sz[a] = size as usize;
        st[a] = if size > 0 { s as usize } else { 0 };
    }
    if sp.iter().all(|&s| s == 1) && st.iter().all(|&s| s == 0) && sz == d {
        return Ok(vec![x]);
    }
    let op = Op::Slice {
        starts: st,
        steps: sp,
        sizes: sz,
    };
    Ok(vec![cx.add(op, vec![x])?])
}

pub fn gather(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx) = (n.inp(0)?, n.inp(1)?);
    let axis = norm_axis(n.i("axis", 0)?, cx.rank(x))?;
    Ok(vec![cx.add(Op::Gather { axis }, vec![x, idx])?])
}

pub fn gather_elements(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx) = (n.inp(0)?, n.inp(1)?);
    let axis = norm_axis(n.i("axis", 0)?, cx.rank(x))?;
    Ok(vec![cx.add(Op::GatherElements { axis }, vec![x, idx])?])
}

/// Axes from input 1 (opset 13+) or the `axes` attribute (older).
fn axes_arg(cx: &Ctx, n: &ONode) -> R<Option<Vec<i64>>> {
    if n.opset >= 13 {
        n.opt(1).map(|a| cx.const_i64s(a, "axes")).transpose()
    } else {
        n.ints("axes")
    }
}

/// ONNX Unsqueeze: insert size-1 dims at `axes` (relative to the output rank).
pub fn unsqueeze(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let axes = axes_arg(cx, n)?.ok_or("axes are required")?;
    if cx.is_symbolic(x) {
        let d = cx.sdims(x);
        let axes = norm_axes(&axes, d.len() + axes.len())?;
        return Ok(vec![cx.reshape_sym(x, sym_ops::unsqueezed(d, &axes))?]);
    }
    let d = cx.dims(x);
    let out_rank = d.len() + axes.len();
    let axes = norm_axes(&axes, out_rank)?;
    let mut it = d.into_iter();
    let out = (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                it.next().unwrap_or(1)
            }
        })
        .collect();
    Ok(vec![cx.reshape(x, out)?])
}

/// ONNX Squeeze: drop size-1 dims at `axes` (all size-1 dims when absent).
pub fn squeeze(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if cx.is_symbolic(x) {
        let axes = axes_arg(cx, n)?;
        return sym_ops::squeeze(cx, x, axes);
    }
    let d = cx.dims(x);
    let axes = match axes_arg(cx, n)? {
        Some(a) => norm_axes(&a, d.len())?,
        None => (0..d.len()).filter(|&i| d[i] == 1).collect(),
    };
    if let Some(&a) = axes.iter().find(|&&a| d[a] != 1) {
        return Err(format!("cannot squeeze axis {a} of size {}", d[a]));
    }
    let out = (0..d.len())
        .filter(|i| !axes.contains(i))
        .map(|i| d[i])
        .collect();
    Ok(vec![cx.reshape(x, out)?])
}

/// ONNX Flatten → 2-D `[prod(dims[..axis]), prod(dims[axis..])]`, `axis` in `[-r, r]`.
pub fn flatten(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if cx.is_symbolic(x) {
        return sym_ops::flatten(cx, x, n.i("axis", 1)?);
    }
    let d = cx.dims(x);
    let r = d.len() as i64;
    let a = n.i("axis", 1)?;
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return Err(format!("axis {a} out of range for rank {r}"));
    }
    let a = a as usize;
    let out = vec![d[..a].iter().product(), d[a..].iter().product()];
    Ok(vec![cx.reshape(x, out)?])
}

/// ONNX Expand: bidirectional broadcast of x with the constant `shape` input.
pub fn expand(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if cx.is_symbolic(x) || cx.is_symbolic(n.inp(1)?) {
        let s = cx.const_dims(n.inp(1)?, "shape")?;
        return sym_ops::expand(cx, x, s);
    }
    let s = to_usizes(&cx.const_i64s(n.inp(1)?, "shape")?, "shape")?;
    let d = cx.dims(x);
    let out = broadcast_dims(&d, &s)
        .ok_or_else(|| format!("{d:?} does not broadcast with shape {s:?}"))?;
    if out == d {
        return Ok(vec![x]);
    }
    Ok(vec![cx.add(Op::Broadcast { dims: out }, vec![x])?])
}

/// ONNX Shape → an i64 constant (opset 15 `start`/`end` slice the dims).
pub fn shape(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if cx.is_symbolic(x) {
        let d = cx.sdims(x);
        let r = d.len() as i64;
        let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (s, e) = (clampi(n.i("start", 0)?), clampi(n.i("end", r)?));
        let v = if s < e { d[s..e].to_vec() } else { vec![] };
        return Ok(vec![cx.const_exprs(vec![v.len()], DType::I64, v)?]);
    }
    let d: Vec<i64> = cx.dims(x).iter().map(|&v| v as i64).collect();
    let r = d.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clampi(n.i("start", 0)?);
    let e = clampi(n.i("end", r)?);
    let v = if s < e { d[s..e].to_vec() } else { vec![] };
    Ok(vec![cx.i64s(&v)])
}

/// ONNX Size → an i64 scalar constant.
pub fn size(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if cx.is_symbolic(x) {
        let p = sym_ops::product(&cx.sdims(x))?;
        return Ok(vec![cx.const_exprs(vec![], DType::I64, vec![p])?]);
    }
    let numel = rlx_ir::infer_shape::checked_numel(&cx.dims(x))
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| {
            format!(
                "input {} has more elements than an int64 holds",
                cx.shape(x)
            )
        })?;
    Ok(vec![cx.constant(
        Tensor::new(vec![], TensorData::I64(vec![numel])).map_err(|e| e.to_string())?,
    )])
}

/// ONNX ConstantOfShape → a scalar constant broadcast to the (constant) shape. Small
/// results fold to a constant; large ones stay a cheap `Broadcast` node.
pub fn constant_of_shape(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let symbolic = cx.is_symbolic(n.inp(0)?);
    let sdims = if symbolic {
        cx.const_dims(n.inp(0)?, "shape")?
    } else {
        vec![]
    };
    let dims = if symbolic {
        cx.probe_sizes(&sdims, "shape")?
    } else {
        to_usizes(&cx.const_i64s(n.inp(0)?, "shape")?, "shape")?
    };
    let value = match n.attr("value").and_then(|a| a.t.as_ref()) {
        Some(t) => {
            let t = tensor_from_proto(t, cx.base_dir).map_err(|e| format!("value: {e}"))?;
            if t.numel() != 1 {
                return Err(format!("value must hold one element, got {}", t.numel()));
            }
            t.reshaped(vec![]).map_err(|e| e.to_string())?
        }
        None => Tensor::scalar(DType::F32, 0.0),
    };
    let v = cx.constant(value);
    if dims.is_empty() {
        return Ok(vec![v]);
    }
    if symbolic {
        return Ok(vec![cx.broadcast_sym(v, sdims)?]);
    }
    Ok(vec![cx.add(Op::Broadcast { dims }, vec![v])?])
}

/// ONNX Constant: `value` (tensor), `value_float(s)`, `value_int(s)`.
pub fn constant(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let t = if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
        tensor_from_proto(t, cx.base_dir).map_err(|e| format!("value: {e}"))?
    } else if let Some(a) = n.attr("value_float") {
        Tensor::scalar_f32(a.f)
    } else if let Some(a) = n.attr("value_floats") {
        Tensor::from_f32(&[a.floats.len()], a.floats.clone()).map_err(|e| e.to_string())?
    } else if let Some(a) = n.attr("value_int") {
        Tensor::new(vec![], TensorData::I64(vec![a.i])).map_err(|e| e.to_string())?
    } else if let Some(a) = n.attr("value_ints") {
        Tensor::from_i64(&[a.ints.len()], a.ints.clone()).map_err(|e| e.to_string())?
    } else {
        return Err("only value, value_float(s) and value_int(s) are supported".into());
    };
    Ok(vec![cx.constant(t)])
}

/// Largest Range the importer materializes.
pub(crate) const RANGE_MAX: usize = 1 << 28;

/// ONNX Range with constant scalar start/limit/delta → a constant.
pub fn range(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (s, l, d) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let dt = cx.dtype(s);
    if [s, l, d].iter().any(|&i| cx.is_symbolic(i)) {
        return sym_ops::range(cx, s, l, d, dt);
    }
    let one = |id: NodeId, what: &str| -> R<f64> {
        let v = cx.const_f64s(id, what)?;
        match v[..] {
            [x] => Ok(x),
            _ => Err(format!("{what} must be a scalar")),
        }
    };
    let (start, limit, delta) = (one(s, "start")?, one(l, "limit")?, one(d, "delta")?);
    if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
        return Err(format!(
            "bad range start {start} limit {limit} delta {delta}"
        ));
    }
    let count = ((limit - start) / delta).ceil().max(0.0);
    if count > RANGE_MAX as f64 {
        return Err(format!("range of {count} elements is too large"));
    }
    let count = count as usize;
    let data = if dt.is_float() {
        let v: Vec<f64> = (0..count).map(|i| start + i as f64 * delta).collect();
        TensorData::from_f64(dt, &v)
    } else {
        let (s, d) = (start as i64, delta as i64);
        let v: Vec<i64> = (0..count as i64).map(|i| s + i * d).collect();
        TensorData::from_i64(dt, &v)
    };
    Ok(vec![cx.constant(
        Tensor::new(vec![count], data).map_err(|e| e.to_string())?,
    )])
}

/// ONNX Tile with constant repeats.
pub fn tile(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let repeats = to_usizes(&cx.const_i64s(n.inp(1)?, "repeats")?, "repeats")?;
    if repeats.iter().all(|&r| r == 1) && repeats.len() == cx.rank(x) {
        return Ok(vec![x]);
    }
    Ok(vec![cx.add(Op::Tile { repeats }, vec![x])?])
}

/// ONNX Pad: pads/constant_value/axes as inputs (opset 11+, axes 18+) or attributes
/// (`pads`/`value`, older). Negative pads crop, lowered to a Slice after the Pad.
pub fn pad(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    let r = d.len();
    let (pads, value, axes) = if n.opset >= 11 {
        let pads = cx.const_i64s(n.inp(1)?, "pads")?;
        let value = match n.opt(2) {
            Some(v) => *cx.const_f64s(v, "constant_value")?.first().unwrap_or(&0.0),
            None => 0.0,
        };
        let axes = n.opt(3).map(|a| cx.const_i64s(a, "axes")).transpose()?;
        (pads, value, axes)
    } else {
        let pads = n
            .ints("pads")?
            .or(n.ints("paddings")?)
            .ok_or("pads attribute is required")?;
        (pads, n.f("value", 0.0)? as f64, None)
    };
    let axes = match axes {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(format!("pads {pads:?} need {} entries", 2 * k));
    }
    let mut full = vec![(0i64, 0i64); r];
    for (i, &a) in axes.iter().enumerate() {
        full[a] = (pads[i], pads[i + k]);
    }
    let mode = match n.s("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant(value),
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let pos: Vec<(usize, usize)> = full
        .iter()
        .map(|&(b, e)| (b.max(0) as usize, e.max(0) as usize))
        .collect();
    let mut y = x;
    if pos.iter().any(|&(b, e)| b > 0 || e > 0) {
        y = cx.add(Op::Pad { pads: pos, mode }, vec![y])?;
    }
    if full.iter().any(|&(b, e)| b < 0 || e < 0) {
        let yd = cx.dims(y);
        let mut starts = vec![0; r];
        let mut sizes = yd.clone();
        for (i, &(b, e)) in full.iter().enumerate() {
            let cut_b = (-b).max(0) as usize;
            let cut_e = (-e).max(0) as usize;
            if cut_b + cut_e > yd[i] {
                return Err(format!("negative pads crop more than axis {i} holds"));
            }
            starts[i] = cut_b;
            sizes[i] = yd[i] - cut_b - cut_e;
        }
        y = cx.add(
            Op::Slice {
                starts,
                steps: vec![1; r],
                sizes,
            },
            vec![y],
        )?;
    }
    Ok(vec![y])
}
