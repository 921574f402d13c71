//! Normalizations lowered onto primitives (Reduce, elementwise): InstanceNormalization,
//! GroupNormalization, RMSNormalization, MeanVarianceNormalization, LpNormalization, and
//! LayerNormalization when its Mean / InvStdDev outputs are requested.
//!
//! Half-precision inputs are normalized in f32 (ONNX `stash_type = 1`) and cast back.

use crate::ctx::{norm_axes, norm_axis, Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind, UnaryOp};

/// `Reduce { kind, axes, keepdims: true }`.
pub(crate) fn reduce_keep(
    cx: &mut Ctx,
    x: NodeId,
    kind: ReduceKind,
    axes: Vec<usize>,
) -> R<NodeId> {
    cx.add(
        Op::Reduce {
            kind,
            axes,
            keepdims: true,
        },
        vec![x],
    )
}

/// The dtype normalization statistics are computed in: f32 for half types, else `dt`.
fn stash(dt: DType) -> DType {
    match dt {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// `(x - mean) * rsqrt(mean((x - mean)^2) + eps)` over `axes`; returns (normalized, mean, inv_std).
fn standardize(cx: &mut Ctx, x: NodeId, axes: Vec<usize>, eps: f64) -> R<(NodeId, NodeId, NodeId)> {
    let dt = cx.dtype(x);
    let mean = reduce_keep(cx, x, ReduceKind::Mean, axes.clone())?;
    let d = cx.binary(BinaryOp::Sub, x, mean)?;
    let sq = cx.binary(BinaryOp::Mul, d, d)?;
    let var = reduce_keep(cx, sq, ReduceKind::Mean, axes)?;
    let e = cx.scalar(dt, eps);
    let ve = cx.binary(BinaryOp::Add, var, e)?;
    let sd = cx.unary(UnaryOp::Sqrt, ve)?;
    let inv = cx.unary(UnaryOp::Reciprocal, sd)?;
    let y = cx.binary(BinaryOp::Mul, d, inv)?;
    Ok((y, mean, inv))
}

/// Reshape a per-channel vector `[C]` to `[1, C, 1, ...]` for a rank-`rank` NC* tensor.
fn per_channel(cx: &mut Ctx, v: NodeId, rank: usize) -> R<NodeId> {
    let d = cx.dims(v);
    if d.len() != 1 {
        return Err(format!(
            "per-channel input must be 1-D, got {}",
            cx.shape(v)
        ));
    }
    let mut dims = vec![1; rank];
    dims[1] = d[0];
    cx.reshape(v, dims)
}

/// ONNX InstanceNormalization: per (n, c), normalize over the spatial axes, then
/// `scale[c] * y + B[c]`.
pub fn instance_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s, b) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let r = cx.rank(x);
    if r < 3 {
        return Err(format!("input must have rank >= 3, got {}", cx.shape(x)));
    }
    let dt = cx.dtype(x);
    let xs = cx.cast(x, stash(dt))?;
    let eps = n.f("epsilon", 1e-5)? as f64;
    let (y, _, _) = standardize(cx, xs, (2..r).collect(), eps)?;
    let y = cx.cast(y, dt)?;
    let s = per_channel(cx, s, r)?;
    let b = per_channel(cx, b, r)?;
    let y = cx.binary(BinaryOp::Mul, y, s)?;
    Ok(vec![cx.binary(BinaryOp::Add, y, b)?])
}

/// ONNX GroupNormalization: `[N, C, *]` viewed as `[N, G, C/G * spatial]`, normalized over the
/// last axis, then an affine per channel (opset 21) or per group (opset 18).
pub fn group_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s, b) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let d = cx.dims(x);
    if d.len() < 3 {
        return Err(format!("input must have rank >= 3, got {}", cx.shape(x)));
    }
    let g = n.i("num_groups", 0)?;
    if g <= 0 || !d[1].is_multiple_of(g as usize) {
        return Err(format!(
            "num_groups {g} must divide the channel count {}",
            d[1]
        ));
    }
    let g = g as usize;
    let dt = cx.dtype(x);
    let eps = n.f("epsilon", 1e-5)? as f64;
    let rest: usize = d[1..].iter().product::<usize>() / g;
    let xs = cx.cast(x, stash(dt))?;
    let xg = cx.reshape(xs, vec![d[0], g, rest])?;
    let (y, _, _) = standardize(cx, xg, vec![2], eps)?;
    let y = cx.cast(y, dt)?;
    let (s, b) = if n.opset < 21 {
        // Per-group scale / bias: expand to channels.
        let cpg = d[1] / g;
        let mut ex = |v: NodeId| -> R<NodeId> {
            let v = cx.reshape(v, vec![g, 1])?;
            let v = cx.add(Op::Broadcast { dims: vec![g, cpg] }, vec![v])?;
            cx.reshape(v, vec![d[1]])
        };
        (ex(s)?, ex(b)?)
    } else {
        (s, b)
    };
    let y = cx.reshape(y, d.clone())?;
    let s = per_channel(cx, s, d.len())?;
    let b = per_channel(cx, b, d.len())?;
    let y = cx.binary(BinaryOp::Mul, y, s)?;
    Ok(vec![cx.binary(BinaryOp::Add, y, b)?])
}

/// ONNX RMSNormalization (opset 23): `x / sqrt(mean(x^2 over axis..) + eps) * scale`.
pub fn rms_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s) = (n.inp(0)?, n.inp(1)?);
    let r = cx.rank(x);
    let axis = norm_axis(n.i("axis", -1)?, r)?;
    let eps = n.f("epsilon", 1e-5)? as f64;
    let dt = cx.dtype(x);
    let xs = cx.cast(x, stash(dt))?;
    let sq = cx.binary(BinaryOp::Mul, xs, xs)?;
    let ms = reduce_keep(cx, sq, ReduceKind::Mean, (axis..r).collect())?;
    let e = cx.scalar(cx.dtype(xs), eps);
    let ms = cx.binary(BinaryOp::Add, ms, e)?;
    let rms = cx.unary(UnaryOp::Sqrt, ms)?;
    let inv = cx.unary(UnaryOp::Reciprocal, rms)?;
    let y = cx.binary(BinaryOp::Mul, xs, inv)?;
    let y = cx.cast(y, dt)?;
    Ok(vec![cx.binary(BinaryOp::Mul, y, s)?])
}

/// ONNX LayerNormalization with its optional Mean and InvStdDev outputs (shape
/// `X.shape[..axis] + [1] * (rank - axis)`), lowered onto primitives.
pub fn layer_norm_full(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s) = (n.inp(0)?, n.inp(1)?);
    let r = cx.rank(x);
    let axis = norm_axis(n.i("axis", -1)?, r)?;
    let eps = n.f("epsilon", 1e-5)? as f64;
    let dt = cx.dtype(x);
    let xs = cx.cast(x, stash(dt))?;
    let (y, mean, inv) = standardize(cx, xs, (axis..r).collect(), eps)?;
    let y = cx.cast(y, dt)?;
    let mut y = cx.binary(BinaryOp::Mul, y, s)?;
    if let Some(b) = n.opt(2) {
        y = cx.binary(BinaryOp::Add, y, b)?;
    }
    Ok(vec![y, cx.cast(mean, dt)?, cx.cast(inv, dt)?])
}

/// `max|x|` over `axes` (kept), with 1 where it is 0 or ±inf: dividing by it keeps `x/s` in
/// [-1, 1], so squares and sums of it cannot overflow or underflow to 0.
pub(crate) fn safe_scale(cx: &mut Ctx, x: NodeId, axes: Vec<usize>) -> R<NodeId> {
    let dt = cx.dtype(x);
    let a = cx.unary(UnaryOp::Abs, x)?;
    let m = reduce_keep(cx, a, ReduceKind::Max, axes)?;
    let zero = cx.scalar(dt, 0.0);
    let one = cx.scalar(dt, 1.0);
    let z = cx.binary(BinaryOp::Eq, m, zero)?;
    let m = cx.add(Op::Select, vec![z, one, m])?;
    let inf = cx.unary(
        UnaryOp::IsInf {
            pos: true,
            neg: true,
        },
        m,
    )?;
    cx.add(Op::Select, vec![inf, one, m])
}

/// ONNX MeanVarianceNormalization: `(x - E[x]) / (sqrt(Var[x]) + 1e-9)` over `axes` (default
/// `[0, 2, 3]`). ONNX's function body computes the variance as `E[x²] - E[x]²`, which
/// cancels catastrophically on a large offset (x = 1e4 + noise in f32 gave 5× wrong
/// values); the variance is computed centered, `E[(x - E[x])²]`, its mathematical
/// definition (float16/bfloat16 in float32).
pub fn mean_variance_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let axes = norm_axes(&n.ints("axes")?.unwrap_or(vec![0, 2, 3]), r)?;
    let dt = cx.dtype(x);
    let xs = cx.cast(x, stash(dt))?;
    let sdt = cx.dtype(xs);
    let mean = reduce_keep(cx, xs, ReduceKind::Mean, axes.clone())?;
    let d = cx.binary(BinaryOp::Sub, xs, mean)?;
    let sq = cx.binary(BinaryOp::Mul, d, d)?;
    let var = reduce_keep(cx, sq, ReduceKind::Mean, axes)?;
    let sd = cx.unary(UnaryOp::Sqrt, var)?;
    let eps = cx.scalar(sdt, 1e-9);
    let sd = cx.binary(BinaryOp::Add, sd, eps)?;
    let y = cx.binary(BinaryOp::Div, d, sd)?;
    Ok(vec![cx.cast(y, dt)?])
}

/// ONNX LpNormalization (`p` 1 or 2) along `axis`; a zero norm gives 0. Computed on `x / s`
/// with `s = max|x|` ([`safe_scale`]): `x²` overflows float32 above 1.8e19 and underflows
/// below 1e-19 (both gave 0 where the normalized values are finite).
pub fn lp_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let axis = norm_axis(n.i("axis", -1)?, cx.rank(x))?;
    let p = n.i("p", 2)?;
    let dt = cx.dtype(x);
    let x = if dt.is_float() {
        let sc = safe_scale(cx, x, vec![axis])?;
        cx.binary(BinaryOp::Div, x, sc)?
    } else {
        x
    };
    let norm = match p {
        1 => {
            let a = cx.unary(UnaryOp::Abs, x)?;
            reduce_keep(cx, a, ReduceKind::Sum, vec![axis])?
        }
        2 => {
            let sq = cx.binary(BinaryOp::Mul, x, x)?;
            let s = reduce_keep(cx, sq, ReduceKind::Sum, vec![axis])?;
            cx.unary(UnaryOp::Sqrt, s)?
        }
        o => return Err(format!("p must be 1 or 2, got {o}")),
    };
    let zero = cx.scalar(dt, 0.0);
    let is0 = cx.binary(BinaryOp::Eq, norm, zero)?;
    let y = cx.binary(BinaryOp::Div, x, norm)?;
    Ok(vec![cx.add(Op::Select, vec![is0, zero, y])?])
}

/// ONNX LayerNormalization: the `LayerNorm` op, or the primitive lowering when the Mean /
/// InvStdDev outputs are requested.
pub fn layer_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    if n.wants_output(1) || n.wants_output(2) {
        return layer_norm_full(cx, n);
    }
    super::nn::layer_norm(cx, n)
}

/// ONNX BatchNormalization: the inference `BatchNorm` op, or in training mode (opset 14+:
/// outputs `Y, running_mean, running_var`) batch statistics over every axis but 1, with
/// `running = input_running * momentum + batch_stat * (1 - momentum)`.
pub fn batch_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let training = n.i("training_mode", 0)? != 0 || n.wants_output(1) || n.wants_output(2);
    if !training {
        return super::nn::batch_norm(cx, n);
    }
    if n.opset < 14 {
        return Err("training-mode outputs before opset 14 are not supported".into());
    }
    let ins = (0..5).map(|i| n.inp(i)).collect::<R<Vec<_>>>()?;
    let (x, s, b, rm, rv) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
    let r = cx.rank(x);
    if r < 2 {
        return Err(format!("input must have rank >= 2, got {}", cx.shape(x)));
    }
    let eps = n.f("epsilon", 1e-5)? as f64;
    let mom = n.f("momentum", 0.9)? as f64;
    let dt = cx.dtype(x);
    let axes: Vec<usize> = (0..r).filter(|&a| a != 1).collect();
    let (y, mean, _) = standardize(cx, x, axes.clone(), eps)?;
    let s = per_channel(cx, s, r)?;
    let b = per_channel(cx, b, r)?;
    let y = cx.binary(BinaryOp::Mul, y, s)?;
    let y = cx.binary(BinaryOp::Add, y, b)?;
    let c = cx.dims(x)[1];
    let d = cx.binary(BinaryOp::Sub, x, mean)?;
    let sq = cx.binary(BinaryOp::Mul, d, d)?;
    let var = reduce_keep(cx, sq, ReduceKind::Mean, axes)?;
    let mean = cx.reshape(mean, vec![c])?;
    let var = cx.reshape(var, vec![c])?;
    let m = cx.scalar(dt, mom);
    let m1 = cx.scalar(dt, 1.0 - mom);
    let run = |cx: &mut Ctx, old: NodeId, cur: NodeId| -> R<NodeId> {
        let a = cx.binary(BinaryOp::Mul, old, m)?;
        let b = cx.binary(BinaryOp::Mul, cur, m1)?;
        cx.binary(BinaryOp::Add, a, b)
    };
    let om = run(cx, rm, mean)?;
    let ov = run(cx, rv, var)?;
    Ok(vec![y, om, ov])
}
