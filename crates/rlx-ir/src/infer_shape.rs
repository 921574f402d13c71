//! Shape inference: the output type of an op from its input types.
//!
//! [`infer_output`] is the single definition of every op's output type, kept beside the op
//! definitions ([`crate::op`]) so that every crate that builds graphs (the ONNX and torch
//! importers, `rlx-models`) infers shapes without depending on the compiler; importers call
//! it for each node they create, and `rlx_compile::verify` checks stored node shapes against
//! it. Definitions follow the ONNX operator spec of each op (the IR's own variants, e.g.
//! [`Op::Broadcast`] or [`Op::Slice`], are documented in [`crate::op`]).

use crate::{broadcast_dims, DType, Op, Shape};

/// An op's inputs do not fit it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

/// Number of inputs `op` takes: `(min, max)`, `max = None` for variadic ops.
///
/// Leaves take none; `Conv` takes 2–3 (optional bias), `LayerNorm` 2–3 (optional bias),
/// `Concat` one or more; every other op a fixed count (see the `inputs:` lists in [`crate::op`]).
pub fn arity(op: &Op) -> (usize, Option<usize>) {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant(_) => (0, Some(0)),
        Op::Binary(_)
        | Op::MatMul
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherND { .. }
        | Op::GridSample { .. } => (2, Some(2)),
        Op::Select | Op::ScatterElements { .. } | Op::ScatterND { .. } => (3, Some(3)),
        Op::Conv(_) | Op::LayerNorm { .. } => (2, Some(3)),
        Op::BatchNorm { .. } => (5, Some(5)),
        Op::Concat { .. } => (1, None),
        _ => (1, Some(1)),
    }
}

fn static_dims(s: &Shape, what: impl FnOnce() -> String) -> Result<Vec<usize>, ShapeError> {
    s.static_dims()
        .map(|d| d.to_vec())
        .ok_or_else(|| ShapeError(format!("{} has symbolic dims {s}; bind them first", what())))
}

fn same_dtype(a: &Shape, b: &Shape, op: &str) -> Result<(), ShapeError> {
    if a.dtype != b.dtype {
        return err(format!(
            "{op}: input dtypes differ ({} vs {})",
            a.dtype, b.dtype
        ));
    }
    Ok(())
}

fn int_indices(s: &Shape, op: &str) -> Result<(), ShapeError> {
    if !matches!(s.dtype, DType::I64 | DType::I32) {
        return err(format!("{op}: indices must be i64 or i32, got {}", s.dtype));
    }
    Ok(())
}

fn check_axis(axis: usize, rank: usize, op: &str) -> Result<(), ShapeError> {
    if axis >= rank {
        return err(format!("{op}: axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

/// Output spatial size of a convolution / pooling window (ONNX Conv, MaxPool):
/// `floor((in + pb + pe - dil*(k-1) - 1) / stride) + 1`, or rounded up with `ceil_mode`
/// (dropping a last window that would start beyond `in + pb`).
/// Errors when the (dilated) window is larger than the padded input or `stride == 0`.
pub fn window_out_dim(
    input: usize,
    pads: (usize, usize),
    kernel: usize,
    stride: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Result<usize, ShapeError> {
    if stride == 0 || dilation == 0 || kernel == 0 {
        return err(format!(
            "kernel {kernel}, stride {stride} and dilation {dilation} must be positive"
        ));
    }
    let too_big = || {
        ShapeError(format!(
            "pads {pads:?} / kernel {kernel} / dilation {dilation} overflow"
        ))
    };
    let padded = input
        .checked_add(pads.0)
        .and_then(|v| v.checked_add(pads.1))
        .ok_or_else(too_big)?;
    let span = dilation
        .checked_mul(kernel - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(too_big)?;
    if span > padded {
        return err(format!(
            "window of {span} (kernel {kernel}, dilation {dilation}) exceeds padded input {padded}"
        ));
    }
    let num = padded - span;
    let mut out = if ceil_mode {
        num.div_ceil(stride) + 1
    } else {
        num / stride + 1
    };
    if ceil_mode && out > 1 && (out - 1) * stride >= input + pads.0 {
        out -= 1;
    }
    Ok(out)
}

/// Output dims of `np.matmul(a, b)` (ONNX MatMul): 1-D operands are promoted (a to `[1,K]`,
/// b to `[K,1]`) and the promoted dim removed afterwards; batch dims broadcast.
pub fn matmul_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>, ShapeError> {
    if a.is_empty() || b.is_empty() {
        return err("MatMul: operands must have rank >= 1");
    }
    let a2: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k1) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k1 != k2 {
        return err(format!(
            "MatMul: inner dims {k1} and {k2} differ ({a:?} x {b:?})"
        ));
    }
    let batch = broadcast_dims(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).ok_or_else(|| {
        ShapeError(format!(
            "MatMul: batch dims of {a:?} and {b:?} do not broadcast"
        ))
    })?;
    let mut out = batch;
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Ok(out)
}

/// Output type of `op` applied to inputs of types `inputs` (static dims).
///
/// Errors name what does not fit (e.g. `MatMul: inner dims 3 and 4 differ`); callers add
/// the node label. Definitions follow the ONNX operator spec of each op:
/// elementwise ops broadcast NumPy-style and keep the dtype (predicates give `Bool`),
/// `Cast` gives `to`, `ArgReduce` gives `I64`, `Conv`/`Pool` use [`window_out_dim`],
/// shape ops follow the attributes the importer resolved. `Constant` returns its tensor's
/// type; `Input`/`Param` have no inputs to infer from and are an error.
pub fn infer_output(op: &Op, inputs: &[&Shape]) -> Result<Shape, ShapeError> {
    for (i, s) in inputs.iter().enumerate() {
        if let Some(d) = s.static_dims() {
            if checked_numel(&d).is_none() {
                return err(format!(
                    "{}: input {i} type {s} has too many elements",
                    op.name()
                ));
            }
        }
    }
    let out = infer_unchecked(op, inputs)?;
    if checked_numel(&out.dims_usize()).is_none() {
        return err(format!(
            "{}: output type {out} has too many elements",
            op.name()
        ));
    }
    Ok(out)
}

/// Product of `dims`, `None` on overflow (a bogus model must not wrap or panic).
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn infer_unchecked(op: &Op, inputs: &[&Shape]) -> Result<Shape, ShapeError> {
    let name = op.name();
    let (lo, hi) = arity(op);
    if inputs.len() < lo || hi.is_some_and(|h| inputs.len() > h) {
        let want = match hi {
            Some(h) if h == lo => format!("{lo}"),
            Some(h) => format!("{lo}..={h}"),
            None => format!("at least {lo}"),
        };
        return err(format!(
            "{name}: expects {want} inputs, got {}",
            inputs.len()
        ));
    }
    let dims: Vec<Vec<usize>> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| static_dims(s, || format!("{name} input {i}")))
        .collect::<Result<_, _>>()?;
    let x = || inputs[0];
    let xd = || dims[0].clone();
    let out = |d: Vec<usize>, dt: DType| Ok(Shape::new(&d, dt));

    match op {
        Op::Input { .. } | Op::Param { .. } => {
            err(format!("{name}: a leaf's type is declared, not inferred"))
        }
        Op::Constant(t) => Ok(t.shape()),
        Op::Unary(u) => {
            if *u == crate::UnaryOp::BitNot && !x().dtype.is_int() {
                return err(format!(
                    "BitNot: input must be an integer, got {}",
                    x().dtype
                ));
            }
            let dt = if u.is_predicate() {
                DType::Bool
            } else {
                x().dtype
            };
            out(xd(), dt)
        }
        Op::Activation(_) | Op::CumSum { .. } | Op::Trilu { .. } | Op::Lrn { .. } => {
            if let Op::CumSum { axis, .. } = op {
                check_axis(*axis, dims[0].len(), &name)?;
            }
            if matches!(op, Op::Trilu { .. }) && dims[0].len() < 2 {
                return err("Trilu: input rank must be >= 2");
            }
            if matches!(op, Op::Lrn { .. }) && dims[0].len() < 2 {
                return err("LRN: input rank must be >= 2 (N, C, ...)");
            }
            out(xd(), x().dtype)
        }
        Op::Binary(b) => {
            if *b != crate::BinaryOp::Pow {
                same_dtype(inputs[0], inputs[1], &name)?;
            }
            if b.is_bitwise() && !x().dtype.is_int() {
                return err(format!(
                    "{name}: inputs must be integers, got {}",
                    x().dtype
                ));
            }
            let d = broadcast_dims(&dims[0], &dims[1]).ok_or_else(|| {
                ShapeError(format!(
                    "{name}: shapes {:?} and {:?} do not broadcast",
                    dims[0], dims[1]
                ))
            })?;
            let dt = if b.is_predicate() {
                DType::Bool
            } else {
                x().dtype
            };
            out(d, dt)
        }
        Op::Select => {
            if inputs[0].dtype != DType::Bool {
                return err(format!(
                    "Select: condition must be bool, got {}",
                    inputs[0].dtype
                ));
            }
            same_dtype(inputs[1], inputs[2], &name)?;
            let d = broadcast_dims(&dims[0], &dims[1])
                .and_then(|d| broadcast_dims(&d, &dims[2]))
                .ok_or_else(|| {
                    ShapeError(format!(
                        "Select: shapes {:?}, {:?}, {:?} do not broadcast",
                        dims[0], dims[1], dims[2]
                    ))
                })?;
            out(d, inputs[1].dtype)
        }
        Op::Cast { to, .. } => out(xd(), *to),
        Op::BitCast { to } => {
            let from = x().dtype;
            if from.is_narrow() || to.is_narrow() || from.bits() != to.bits() {
                return err(format!(
                    "{name}: cannot reinterpret {from} ({} bits) as {to} ({} bits): \
                     BitCast needs two non-narrow types of the same width",
                    from.bits(),
                    to.bits()
                ));
            }
            out(xd(), *to)
        }
        Op::MatMul => {
            same_dtype(inputs[0], inputs[1], &name)?;
            out(matmul_dims(&dims[0], &dims[1])?, x().dtype)
        }
        Op::Conv(a) => {
            let (xs, ws) = (&dims[0], &dims[1]);
            if xs.len() < 3 || ws.len() != xs.len() {
                return err(format!(
                    "Conv: x {xs:?} and w {ws:?} must have the same rank >= 3"
                ));
            }
            same_dtype(inputs[0], inputs[1], &name)?;
            let ns = xs.len() - 2;
            if a.strides.len() != ns || a.pads.len() != ns || a.dilations.len() != ns {
                return err(format!(
                    "Conv: strides/pads/dilations need {ns} entries, got {}/{}/{}",
                    a.strides.len(),
                    a.pads.len(),
                    a.dilations.len()
                ));
            }
            if a.groups == 0 || xs[1] != ws[1] * a.groups || ws[0] % a.groups != 0 {
                return err(format!(
                    "Conv: x channels {} != w channels {} x groups {} (or M={} not divisible)",
                    xs[1], ws[1], a.groups, ws[0]
                ));
            }
            if inputs.len() == 3 && dims[2] != [ws[0]] {
                return err(format!("Conv: bias must be [{}], got {:?}", ws[0], dims[2]));
            }
            let mut o = vec![xs[0], ws[0]];
            for i in 0..ns {
                o.push(
                    window_out_dim(
                        xs[i + 2],
                        a.pads[i],
                        ws[i + 2],
                        a.strides[i],
                        a.dilations[i],
                        false,
                    )
                    .map_err(|e| ShapeError(format!("Conv: spatial axis {i}: {e}")))?,
                );
            }
            out(o, x().dtype)
        }
        Op::Reduce { axes, keepdims, .. } => {
            let r = dims[0].len();
            for w in axes.windows(2) {
                if w[0] >= w[1] {
                    return err(format!("{name}: axes {axes:?} must be sorted and unique"));
                }
            }
            let mut o = Vec::new();
            for (i, &d) in dims[0].iter().enumerate() {
                if axes.contains(&i) {
                    if *keepdims {
                        o.push(1);
                    }
                } else {
                    o.push(d);
                }
            }
            if let Some(&a) = axes.iter().find(|&&a| a >= r) {
                return err(format!("{name}: axis {a} out of range for rank {r}"));
            }
            out(o, x().dtype)
        }
        Op::ArgReduce { axis, keepdims, .. } => {
            check_axis(*axis, dims[0].len(), &name)?;
            let mut o = xd();
            if *keepdims {
                o[*axis] = 1;
            } else {
                o.remove(*axis);
            }
            out(o, DType::I64)
        }
        Op::Pool(a) => {
            let xs = &dims[0];
            if xs.len() < 3 {
                return err(format!("{name}: input {xs:?} must have rank >= 3"));
            }
            let ns = xs.len() - 2;
            if a.kernel.len() != ns
                || a.strides.len() != ns
                || a.pads.len() != ns
                || a.dilations.len() != ns
            {
                return err(format!(
                    "{name}: kernel/strides/pads/dilations need {ns} entries, got {}/{}/{}/{}",
                    a.kernel.len(),
                    a.strides.len(),
                    a.pads.len(),
                    a.dilations.len()
                ));
            }
            let mut o = vec![xs[0], xs[1]];
            for i in 0..ns {
                o.push(
                    window_out_dim(
                        xs[i + 2],
                        a.pads[i],
                        a.kernel[i],
                        a.strides[i],
                        a.dilations[i],
                        a.ceil_mode,
                    )
                    .map_err(|e| ShapeError(format!("{name}: spatial axis {i}: {e}")))?,
                );
            }
            out(o, x().dtype)
        }
        Op::Reshape { dims: to } => {
            let a: usize = dims[0].iter().product();
            let b = checked_numel(to).unwrap_or(usize::MAX);
            if a != b {
                return err(format!(
                    "Reshape: {:?} ({a} elements) cannot become {to:?} ({b} elements)",
                    dims[0]
                ));
            }
            out(to.clone(), x().dtype)
        }
        Op::Transpose { perm } => {
            let r = dims[0].len();
            let mut seen = vec![false; r];
            if perm.len() != r
                || perm
                    .iter()
                    .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
            {
                return err(format!(
                    "Transpose: perm {perm:?} is not a permutation of 0..{r}"
                ));
            }
            out(perm.iter().map(|&p| dims[0][p]).collect(), x().dtype)
        }
        Op::Broadcast { dims: to } => {
            if broadcast_dims(&dims[0], to).as_ref() != Some(to) {
                return err(format!(
                    "Broadcast: {:?} does not broadcast to {to:?}",
                    dims[0]
                ));
            }
            out(to.clone(), x().dtype)
        }
        Op::Concat { axis } => {
            let r = dims[0].len();
            check_axis(*axis, r, &name)?;
            let mut o = xd();
            for (i, d) in dims.iter().enumerate().skip(1) {
                same_dtype(inputs[0], inputs[i], &name)?;
                let fits = d.len() == r
                    && d.iter()
                        .zip(&dims[0])
                        .enumerate()
                        .all(|(k, (a, b))| k == *axis || a == b);
                if !fits {
                    return err(format!(
                        "Concat: input {i} {d:?} does not match input 0 {:?} off axis {axis}",
                        dims[0]
                    ));
                }
                o[*axis] = o[*axis]
                    .checked_add(d[*axis])
                    .ok_or_else(|| ShapeError("Concat: output dim overflows".into()))?;
            }
            out(o, x().dtype)
        }
        Op::Slice {
            starts,
            steps,
            sizes,
        } => {
            let r = dims[0].len();
            if starts.len() != r || steps.len() != r || sizes.len() != r {
                return err(format!(
                    "Slice: starts/steps/sizes need {r} entries, got {}/{}/{}",
                    starts.len(),
                    steps.len(),
                    sizes.len()
                ));
            }
            for i in 0..r {
                if steps[i] == 0 {
                    return err(format!("Slice: step 0 on axis {i}"));
                }
                if sizes[i] == 0 {
                    continue;
                }
                let last = starts[i] as i128 + (sizes[i] as i128 - 1) * steps[i] as i128;
                if starts[i] >= dims[0][i] || last < 0 || last >= dims[0][i] as i128 {
                    return err(format!(
                        "Slice: axis {i} (size {}) start {} step {} size {} leaves the input",
                        dims[0][i], starts[i], steps[i], sizes[i]
                    ));
                }
            }
            out(sizes.clone(), x().dtype)
        }
        Op::Pad { pads, .. } => {
            if pads.len() != dims[0].len() {
                return err(format!(
                    "Pad: {} pads for rank {}",
                    pads.len(),
                    dims[0].len()
                ));
            }
            out(
                dims[0]
                    .iter()
                    .zip(pads)
                    .map(|(d, (b, e))| d.checked_add(*b).and_then(|v| v.checked_add(*e)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ShapeError(format!("Pad: pads {pads:?} overflow")))?,
                x().dtype,
            )
        }
        Op::Tile { repeats } => {
            if repeats.len() != dims[0].len() {
                return err(format!(
                    "Tile: {} repeats for rank {}",
                    repeats.len(),
                    dims[0].len()
                ));
            }
            out(
                dims[0]
                    .iter()
                    .zip(repeats)
                    .map(|(d, r)| d.checked_mul(*r))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ShapeError(format!("Tile: repeats {repeats:?} overflow")))?,
                x().dtype,
            )
        }
        Op::Gather { axis } => {
            check_axis(*axis, dims[0].len(), &name)?;
            if !matches!(inputs[1].dtype, DType::I64 | DType::I32) {
                return err(format!(
                    "Gather: indices must be i64 or i32, got {}",
                    inputs[1].dtype
                ));
            }
            let mut o = dims[0][..*axis].to_vec();
            o.extend_from_slice(&dims[1]);
            o.extend_from_slice(&dims[0][axis + 1..]);
            out(o, x().dtype)
        }
        Op::GatherElements { axis } => {
            check_axis(*axis, dims[0].len(), &name)?;
            if dims[1].len() != dims[0].len() {
                return err(format!(
                    "GatherElements: indices rank {} != data rank {}",
                    dims[1].len(),
                    dims[0].len()
                ));
            }
            if !matches!(inputs[1].dtype, DType::I64 | DType::I32) {
                return err(format!(
                    "GatherElements: indices must be i64 or i32, got {}",
                    inputs[1].dtype
                ));
            }
            out(dims[1].clone(), x().dtype)
        }
        Op::GatherND { batch_dims } => {
            let (dd, id) = (&dims[0], &dims[1]);
            int_indices(inputs[1], &name)?;
            let b = *batch_dims;
            let q = *id
                .last()
                .ok_or_else(|| ShapeError("GatherND: indices must have rank >= 1".into()))?;
            if b >= id.len() || b + q > dd.len() || dd[..b] != id[..b] {
                return err(format!(
                    "GatherND: data {dd:?}, indices {id:?} and batch_dims {b} do not fit"
                ));
            }
            let mut o = id[..id.len() - 1].to_vec();
            o.extend_from_slice(&dd[b + q..]);
            out(o, x().dtype)
        }
        Op::ScatterElements { axis, .. } => {
            check_axis(*axis, dims[0].len(), &name)?;
            int_indices(inputs[1], &name)?;
            same_dtype(inputs[0], inputs[2], &name)?;
            let (dd, id) = (&dims[0], &dims[1]);
            if id.len() != dd.len() || dims[2] != *id {
                return err(format!(
                    "ScatterElements: data {dd:?}, indices {id:?}, updates {:?}: indices must have data's rank and updates indices' dims",
                    dims[2]
                ));
            }
            out(xd(), x().dtype)
        }
        Op::ScatterND { .. } => {
            int_indices(inputs[1], &name)?;
            same_dtype(inputs[0], inputs[2], &name)?;
            let (dd, id) = (&dims[0], &dims[1]);
            let q = id.last().copied().unwrap_or(usize::MAX);
            let fits = q <= dd.len() && {
                let mut want = id[..id.len() - 1].to_vec();
                want.extend_from_slice(&dd[q..]);
                want == dims[2]
            };
            if !fits {
                return err(format!(
                    "ScatterND: data {dd:?}, indices {id:?}, updates {:?} do not fit",
                    dims[2]
                ));
            }
            out(xd(), x().dtype)
        }
        Op::TopK {
            k, axis, indices, ..
        } => {
            check_axis(*axis, dims[0].len(), &name)?;
            if *k > dims[0][*axis] {
                return err(format!(
                    "TopK: k = {k} exceeds axis {axis} of size {}",
                    dims[0][*axis]
                ));
            }
            let mut o = xd();
            o[*axis] = *k;
            out(o, if *indices { DType::I64 } else { x().dtype })
        }
        Op::GridSample { .. } => {
            let (xd, gd) = (&dims[0], &dims[1]);
            let nd = xd.len().saturating_sub(2);
            if nd == 0 || gd.len() != nd + 2 || gd[0] != xd[0] || gd[nd + 1] != nd {
                return err(format!(
                    "GridSample: x {xd:?} and grid {gd:?} must be [N, C, *in] and [N, *out, {nd}]"
                ));
            }
            if !x().dtype.is_float() || !inputs[1].dtype.is_float() {
                return err(format!(
                    "GridSample: x and grid must be float tensors, got {} and {}",
                    x().dtype,
                    inputs[1].dtype
                ));
            }
            let mut o = vec![xd[0], xd[1]];
            o.extend_from_slice(&gd[1..=nd]);
            out(o, x().dtype)
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            check_axis(*axis, dims[0].len(), &name)?;
            out(xd(), x().dtype)
        }
        Op::LayerNorm { axis, .. } => {
            check_axis(*axis, dims[0].len(), &name)?;
            let norm = &dims[0][*axis..];
            for (i, d) in dims.iter().enumerate().skip(1) {
                if broadcast_dims(d, norm).as_deref() != Some(norm) {
                    return err(format!(
                        "LayerNorm: input {i} {d:?} does not broadcast to the normalized dims {norm:?}"
                    ));
                }
            }
            out(xd(), x().dtype)
        }
        Op::BatchNorm { .. } => {
            let xs = &dims[0];
            if xs.len() < 2 {
                return err(format!("BatchNorm: input {xs:?} must have rank >= 2"));
            }
            for (i, d) in dims.iter().enumerate().skip(1) {
                if d != &[xs[1]] {
                    return err(format!(
                        "BatchNorm: input {i} must be [{}], got {d:?}",
                        xs[1]
                    ));
                }
            }
            out(xd(), x().dtype)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Activation, BinaryOp, ConvAttrs, PoolAttrs, PoolKind, ReduceKind, Tensor, UnaryOp,
    };

    fn s(d: &[usize]) -> Shape {
        Shape::new(d, DType::F32)
    }
    fn inf(op: Op, ins: &[Shape]) -> Result<Shape, ShapeError> {
        let r: Vec<&Shape> = ins.iter().collect();
        infer_output(&op, &r)
    }

    #[test]
    fn broadcasting_and_predicates() {
        let o = inf(Op::Binary(BinaryOp::Add), &[s(&[2, 1, 4]), s(&[3, 1])]).unwrap();
        assert_eq!(o, s(&[2, 3, 4]));
        let o = inf(Op::Binary(BinaryOp::Lt), &[s(&[4]), s(&[])]).unwrap();
        assert_eq!(o, Shape::new(&[4], DType::Bool));
        assert!(inf(Op::Binary(BinaryOp::Add), &[s(&[2]), s(&[3])]).is_err());
        let i = Shape::new(&[2], DType::I64);
        assert!(inf(Op::Binary(BinaryOp::Add), &[s(&[2]), i]).is_err());
        let o = inf(Op::Unary(UnaryOp::IsNaN), &[s(&[5])]).unwrap();
        assert_eq!(o.dtype, DType::Bool);
        let c = Shape::new(&[2, 1], DType::Bool);
        let o = inf(Op::Select, &[c, s(&[3]), s(&[])]).unwrap();
        assert_eq!(o, s(&[2, 3]));
        assert!(inf(Op::Select, &[s(&[1]), s(&[1]), s(&[1])]).is_err());
    }

    #[test]
    fn arity_is_checked() {
        let e = inf(Op::Activation(Activation::Relu), &[]).unwrap_err();
        assert!(e.0.contains("expects 1 inputs"), "{e}");
        assert!(inf(Op::Binary(BinaryOp::Add), &[s(&[1])]).is_err());
    }

    #[test]
    fn matmul_rules() {
        assert_eq!(matmul_dims(&[2, 3], &[3, 4]).unwrap(), vec![2, 4]);
        assert_eq!(matmul_dims(&[3], &[3, 4]).unwrap(), vec![4]);
        assert_eq!(matmul_dims(&[2, 3], &[3]).unwrap(), vec![2]);
        assert_eq!(matmul_dims(&[3], &[3]).unwrap(), Vec::<usize>::new());
        assert_eq!(
            matmul_dims(&[5, 1, 2, 3], &[4, 3, 6]).unwrap(),
            vec![5, 4, 2, 6]
        );
        assert!(matmul_dims(&[2, 3], &[4, 5]).is_err());
        assert!(matmul_dims(&[2, 2, 3], &[3, 3, 4]).is_err());
    }

    #[test]
    fn conv_and_pool_dims() {
        let conv = Op::Conv(ConvAttrs {
            strides: vec![2, 2],
            pads: vec![(3, 3), (3, 3)],
            dilations: vec![1, 1],
            groups: 1,
        });
        let o = inf(conv, &[s(&[1, 3, 224, 224]), s(&[64, 3, 7, 7]), s(&[64])]).unwrap();
        assert_eq!(o, s(&[1, 64, 112, 112]));
        let grouped = Op::Conv(ConvAttrs {
            strides: vec![1],
            pads: vec![(0, 0)],
            dilations: vec![2],
            groups: 2,
        });
        let o = inf(grouped, &[s(&[1, 4, 10]), s(&[6, 2, 3])]).unwrap();
        assert_eq!(o, s(&[1, 6, 6]));
        let pool = |ceil_mode| {
            Op::Pool(PoolAttrs {
                kind: PoolKind::Max,
                kernel: vec![3, 3],
                strides: vec![2, 2],
                pads: vec![(0, 0), (0, 0)],
                dilations: vec![1, 1],
                ceil_mode,
            })
        };
        // GoogLeNet pool1: 112 → 55 (floor) / 56 (ceil).
        assert_eq!(
            inf(pool(false), &[s(&[1, 64, 112, 112])]).unwrap(),
            s(&[1, 64, 55, 55])
        );
        assert_eq!(
            inf(pool(true), &[s(&[1, 64, 112, 112])]).unwrap(),
            s(&[1, 64, 56, 56])
        );
        // ceil_mode never starts a window past the input: in 5, k 2, s 2, pad 1+1.
        assert_eq!(window_out_dim(5, (1, 1), 2, 2, 1, true).unwrap(), 3);
        assert_eq!(window_out_dim(4, (0, 0), 2, 2, 1, true).unwrap(), 2);
        assert!(window_out_dim(2, (0, 0), 3, 1, 1, false).is_err());
    }

    #[test]
    fn reductions_and_shape_ops() {
        let r = Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![1, 2],
            keepdims: true,
        };
        assert_eq!(inf(r, &[s(&[2, 3, 4])]).unwrap(), s(&[2, 1, 1]));
        let r = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
            keepdims: false,
        };
        assert_eq!(inf(r, &[s(&[2, 3])]).unwrap(), s(&[3]));
        let a = Op::ArgReduce {
            max: true,
            axis: 1,
            keepdims: false,
            select_last_index: false,
        };
        assert_eq!(inf(a, &[s(&[2, 3])]).unwrap(), Shape::new(&[2], DType::I64));
        assert_eq!(
            inf(Op::Reshape { dims: vec![6] }, &[s(&[2, 3])]).unwrap(),
            s(&[6])
        );
        assert!(inf(Op::Reshape { dims: vec![7] }, &[s(&[2, 3])]).is_err());
        assert_eq!(
            inf(Op::Transpose { perm: vec![1, 0] }, &[s(&[2, 3])]).unwrap(),
            s(&[3, 2])
        );
        assert!(inf(Op::Transpose { perm: vec![0, 0] }, &[s(&[2, 3])]).is_err());
        assert_eq!(
            inf(
                Op::Broadcast {
                    dims: vec![4, 2, 3]
                },
                &[s(&[2, 1])]
            )
            .unwrap(),
            s(&[4, 2, 3])
        );
        assert!(inf(Op::Broadcast { dims: vec![3] }, &[s(&[2])]).is_err());
        assert_eq!(
            inf(Op::Concat { axis: 1 }, &[s(&[2, 3]), s(&[2, 5])]).unwrap(),
            s(&[2, 8])
        );
        assert!(inf(Op::Concat { axis: 1 }, &[s(&[2, 3]), s(&[3, 5])]).is_err());
        let sl = Op::Slice {
            starts: vec![4, 0],
            steps: vec![-2, 1],
            sizes: vec![3, 2],
        };
        assert_eq!(inf(sl, &[s(&[5, 2])]).unwrap(), s(&[3, 2]));
        let bad = Op::Slice {
            starts: vec![4],
            steps: vec![1],
            sizes: vec![2],
        };
        assert!(inf(bad, &[s(&[5])]).is_err());
        let idx = Shape::new(&[2, 2], DType::I64);
        assert_eq!(
            inf(Op::Gather { axis: 1 }, &[s(&[3, 4, 5]), idx.clone()]).unwrap(),
            s(&[3, 2, 2, 5])
        );
        assert_eq!(
            inf(
                Op::Cast {
                    to: DType::F16,
                    saturate: true
                },
                &[s(&[3])]
            )
            .unwrap(),
            Shape::new(&[3], DType::F16)
        );
        let c = Op::Constant(std::sync::Arc::new(Tensor::zeros(&[2], DType::I64)));
        assert_eq!(inf(c, &[]).unwrap(), Shape::new(&[2], DType::I64));
    }

    #[test]
    fn norms() {
        let ln = Op::LayerNorm {
            axis: 2,
            epsilon: 1e-5,
        };
        assert_eq!(
            inf(ln.clone(), &[s(&[2, 3, 8]), s(&[8]), s(&[8])]).unwrap(),
            s(&[2, 3, 8])
        );
        assert!(inf(ln, &[s(&[2, 3, 8]), s(&[3])]).is_err());
        let bn = Op::BatchNorm { epsilon: 1e-5 };
        let c = s(&[4]);
        assert_eq!(
            inf(
                bn.clone(),
                &[s(&[1, 4, 2, 2]), c.clone(), c.clone(), c.clone(), c.clone()]
            )
            .unwrap(),
            s(&[1, 4, 2, 2])
        );
        assert!(inf(
            bn,
            &[s(&[1, 4, 2, 2]), c.clone(), c.clone(), c.clone(), s(&[3])]
        )
        .is_err());
    }
}
