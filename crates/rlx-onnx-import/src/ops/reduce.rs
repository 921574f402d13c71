//! Reductions (ReduceX, ArgMax/ArgMin).

use crate::ctx::{norm_axes, norm_axis, Ctx, ONode, R};
use rlx_ir::{BinaryOp, NodeId, Op, ReduceKind, UnaryOp};

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
/// ReduceL2 = Sqrt(ReduceSum(x * x)).
pub fn reduce_l2(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let sq = cx.binary(BinaryOp::Mul, x, x)?;
    let s = reduce_on(cx, n, sq, ReduceKind::Sum, 18)?;
    Ok(vec![cx.unary(UnaryOp::Sqrt, s)?])
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

/// ReduceLogSum = Log(ReduceSum(x)).
pub fn reduce_log_sum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let s = reduce_on(cx, n, x, ReduceKind::Sum, 18)?;
    Ok(vec![cx.unary(UnaryOp::Log, s)?])
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
