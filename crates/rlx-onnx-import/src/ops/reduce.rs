//! Reductions (ReduceX, ArgMax/ArgMin).

use crate::ctx::{norm_axes, norm_axis, Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind, UnaryOp};

/// Resolved reduction axes: `None` = reduce nothing (identity).
/// Axes are an input from opset 13 (ReduceSum) / 18 (the others), an attribute before;
/// empty axes reduce everything unless `noop_with_empty_axes = 1`.
fn axes(cx: &Ctx, n: &ONode, input_from: i64) -> R<Option<Vec<usize>>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let given = if n.opset >= input_from {
        match n.opt(1) {
            Some(a) => Some(cx.const_i64s(a, "axes")?),
            None => None,
        }
    } else {
        n.ints("axes")?
    };
    match given {
        Some(a) if !a.is_empty() => Ok(Some(norm_axes(&a, r)?)),
        _ if n.i("noop_with_empty_axes", 0)? != 0 => Ok(None),
        _ => Ok(Some((0..r).collect())),
    }
}

fn reduce_on(cx: &mut Ctx, n: &ONode, x: NodeId, kind: ReduceKind, from: i64) -> R<NodeId> {
    let Some(axes) = axes(cx, n, from)? else {
        return Ok(x);
    };
    let keepdims = n.i("keepdims", 1)? != 0;
    cx.add(
        Op::Reduce {
            kind,
            axes,
            keepdims,
        },
        vec![x],
    )
}

fn reduce(cx: &mut Ctx, n: &ONode, kind: ReduceKind, from: i64) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![reduce_on(cx, n, x, kind, from)?])
}

pub fn reduce_mean(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    reduce(cx, n, ReduceKind::Mean, 18)
}
pub fn reduce_sum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    reduce(cx, n, ReduceKind::Sum, 13)
}
pub fn reduce_max(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    reduce(cx, n, ReduceKind::Max, 18)
}
pub fn reduce_min(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    reduce(cx, n, ReduceKind::Min, 18)
}
pub fn reduce_prod(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    reduce(cx, n, ReduceKind::Prod, 18)
}
/// ReduceL1 = ReduceSum(|x|).
pub fn reduce_l1(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let a = cx.unary(UnaryOp::Abs, x)?;
    Ok(vec![reduce_on(cx, n, a, ReduceKind::Sum, 18)?])
}
/// ReduceSumSquare = ReduceSum(x * x).
pub fn reduce_sum_square(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let sq = cx.binary(BinaryOp::Mul, x, x)?;
    Ok(vec![reduce_on(cx, n, sq, ReduceKind::Sum, 18)?])
}
/// The float type a reduction whose result can overflow is accumulated in: f64 for f32,
/// f32 for f16/bf16; other types unchanged.
pub(crate) fn wider(dt: DType) -> DType {
    match dt {
        DType::F32 => DType::F64,
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// ReduceL2 = `sqrt(sum(x²))`, computed as `s · sqrt(sum((x/s)²))` with `s = max|x|` (1
/// where that is 0 or ±inf): `x²` overflows float32 above 1.8e19 (float16 above 256) and
/// underflows below 1e-19, where the norm itself is finite and non-zero.
pub fn reduce_l2(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    if !cx.dtype(x).is_float() {
        let sq = cx.binary(BinaryOp::Mul, x, x)?;
        let s = reduce_on(cx, n, sq, ReduceKind::Sum, 18)?;
        return Ok(vec![cx.unary(UnaryOp::Sqrt, s)?]);
    }
    let Some(axes) = axes(cx, n, 18)? else {
        return Ok(vec![cx.unary(UnaryOp::Abs, x)?]);
    };
    let keepdims = n.i("keepdims", 1)? != 0;
    let sc = crate::ops::norm::safe_scale(cx, x, axes.clone())?;
    let xs = cx.binary(BinaryOp::Div, x, sc)?;
    let sq = cx.binary(BinaryOp::Mul, xs, xs)?;
    let s = cx.add(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes,
            keepdims,
        },
        vec![sq],
    )?;
    let r = cx.unary(UnaryOp::Sqrt, s)?;
    let sc = if keepdims {
        sc
    } else {
        let dims = cx.dims(r);
        cx.reshape(sc, dims)?
    };
    Ok(vec![cx.binary(BinaryOp::Mul, sc, r)?])
}

/// ReduceLogSumExp, defined by ONNX as `Log(ReduceSum(Exp(x)))`, computed in the stable
/// form `m + log(sum(exp(x - m)))` with `m` the reduced max (0 where that max is ±inf, so a
/// row of all `-inf` gives `-inf` and a row holding `+inf` gives `+inf`, as the definition
/// does; NaN stays NaN). The direct form overflows `exp` for any element above ~88.7 in
/// float32 (~11 in float16) although the result is finite: a row with max 95 gives 95.x, not
/// `+inf`. Integer inputs keep the direct form.
pub fn reduce_log_sum_exp(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    if !dt.is_float() {
        let e = cx.unary(UnaryOp::Exp, x)?;
        let s = reduce_on(cx, n, e, ReduceKind::Sum, 18)?;
        return Ok(vec![cx.unary(UnaryOp::Log, s)?]);
    }
    let Some(axes) = axes(cx, n, 18)? else {
        // Reducing nothing: log(exp(x)) = x.
        return Ok(vec![x]);
    };
    let keepdims = n.i("keepdims", 1)? != 0;
    let m = cx.add(
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: axes.clone(),
            keepdims: true,
        },
        vec![x],
    )?;
    let inf = cx.unary(
        UnaryOp::IsInf {
            pos: true,
            neg: true,
        },
        m,
    )?;
    let zero = cx.scalar(dt, 0.0);
    let ms = cx.add(Op::Select, vec![inf, zero, m])?;
    let d = cx.binary(BinaryOp::Sub, x, ms)?;
    let e = cx.unary(UnaryOp::Exp, d)?;
    let s = cx.add(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes,
            keepdims,
        },
        vec![e],
    )?;
    let l = cx.unary(UnaryOp::Log, s)?;
    let ms = if keepdims {
        ms
    } else {
        let dims = cx.dims(l);
        cx.reshape(ms, dims)?
    };
    Ok(vec![cx.binary(BinaryOp::Add, ms, l)?])
}

/// ReduceLogSum = Log(ReduceSum(x)), the sum taken in a wider float type (f64 for f32,
/// f32 for f16/bf16) so a sum past the type's range still gives its finite log.
pub fn reduce_log_sum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let xw = cx.cast(x, wider(dt))?;
    let s = reduce_on(cx, n, xw, ReduceKind::Sum, 18)?;
    let l = cx.unary(UnaryOp::Log, s)?;
    Ok(vec![cx.cast(l, dt)?])
}

fn arg(cx: &mut Ctx, n: &ONode, max: bool) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let op = Op::ArgReduce {
        max,
        axis: norm_axis(n.i("axis", 0)?, cx.rank(x))?,
        keepdims: n.i("keepdims", 1)? != 0,
        select_last_index: n.i("select_last_index", 0)? != 0,
    };
    Ok(vec![cx.add(op, vec![x])?])
}
pub fn arg_max(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    arg(cx, n, true)
}
pub fn arg_min(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    arg(cx, n, false)
}
