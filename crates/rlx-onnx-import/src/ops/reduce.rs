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
/// ReduceLogSumExp = Log(ReduceSum(Exp(x))), as the ONNX reference defines it.
pub fn reduce_log_sum_exp(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let e = cx.unary(UnaryOp::Exp, x)?;
    let s = reduce_on(cx, n, e, ReduceKind::Sum, 18)?;
    Ok(vec![cx.unary(UnaryOp::Log, s)?])
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
