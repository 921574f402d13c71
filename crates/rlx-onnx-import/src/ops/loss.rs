//! Losses lowered onto GatherElements / Gather / Select / Reduce:
//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (ONNX spec and reference
//! implementation: weights gathered per target, `ignore_index` positions weigh 0,
//! `mean` divides by the summed weights when there are any).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind};

/// The NLL loss of log-probabilities `x [N, C, d...]` at `target [N, d...]`.
fn nll(cx: &mut Ctx, n: &ONode, x: NodeId, target: NodeId, weight: Option<NodeId>) -> R<NodeId> {
    let xd = cx.dims(x);
    let td = cx.dims(target);
    if xd.len() < 2 {
        return Err(format!("input must have rank >= 2, got {}", cx.shape(x)));
    }
    let mut want = vec![xd[0]];
    want.extend_from_slice(&xd[2..]);
    if td != want {
        return Err(format!(
            "target {} does not match input {} (expected dims {want:?})",
            cx.shape(target),
            cx.shape(x)
        ));
    }
    if !cx.dtype(target).is_int() {
        return Err(format!(
            "target must be an integer tensor, got {}",
            cx.shape(target)
        ));
    }
    let dt = cx.dtype(x);
    let tdt = cx.dtype(target);
    let ignore = n.attr("ignore_index").map(|a| a.i);
    // Positions to ignore, and a target that is a valid index everywhere.
    let (mask, safe_t) = match ignore {
        Some(ii) => {
            let iiv = cx.scalar(tdt, ii as f64);
            let m = cx.binary(BinaryOp::Eq, target, iiv)?;
            let z = cx.scalar(tdt, 0.0);
            let t = cx.add(Op::Select, vec![m, z, target])?;
            (Some(m), t)
        }
        None => (None, target),
    };
    let mut idims = td.clone();
    idims.insert(1, 1);
    let idx = cx.reshape(safe_t, idims)?;
    let g = cx.add(Op::GatherElements { axis: 1 }, vec![x, idx])?;
    let g = cx.reshape(g, td.clone())?;
    let mut loss = cx.unary(rlx_ir::UnaryOp::Neg, g)?;
    let zero = cx.scalar(dt, 0.0);
    // Per-position weights (None: all ones).
    let w = match (weight, mask) {
        (Some(w), m) => {
            let w = cx.add(Op::Gather { axis: 0 }, vec![w, safe_t])?;
            match m {
                Some(m) => Some(cx.add(Op::Select, vec![m, zero, w])?),
                None => Some(w),
            }
        }
        (None, Some(m)) => {
            let one = cx.scalar(dt, 1.0);
            let w = cx.add(Op::Select, vec![m, zero, one])?;
            Some(cx.add(Op::Broadcast { dims: td.clone() }, vec![w])?)
        }
        (None, None) => None,
    };
    if let Some(w) = w {
        loss = cx.binary(BinaryOp::Mul, loss, w)?;
    }
    let all: Vec<usize> = (0..td.len()).collect();
    let red = |cx: &mut Ctx, v: NodeId, kind| {
        cx.add(
            Op::Reduce {
                kind,
                axes: all.clone(),
                keepdims: false,
            },
            vec![v],
        )
    };
    match n.s("reduction", "mean")?.as_str() {
        "none" => Ok(loss),
        "sum" => red(cx, loss, ReduceKind::Sum),
        "mean" => match w {
            Some(w) => {
                let s = red(cx, loss, ReduceKind::Sum)?;
                let ws = red(cx, w, ReduceKind::Sum)?;
                cx.binary(BinaryOp::Div, s, ws)
            }
            None => red(cx, loss, ReduceKind::Mean),
        },
        o => Err(format!("unknown reduction \"{o}\"")),
    }
}

/// ONNX NegativeLogLikelihoodLoss: `-input[n, target[n, d], d] * weight[target]`, reduced.
pub fn nll_loss(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, t) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![nll(cx, n, x, t, n.opt(2))?])
}

/// ONNX SoftmaxCrossEntropyLoss: NLL of `LogSoftmax(scores, axis 1)`; the optional second
/// output is the log-probabilities.
pub fn softmax_cross_entropy_loss(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, t) = (n.inp(0)?, n.inp(1)?);
    if cx.rank(x) < 2 {
        return Err(format!("scores must have rank >= 2, got {}", cx.shape(x)));
    }
    let dt = cx.dtype(x);
    // Half types: log-softmax in f32 for accuracy, results cast back.
    let xs = match dt {
        DType::F16 | DType::BF16 => cx.cast(x, DType::F32)?,
        _ => x,
    };
    let lp = cx.add(Op::LogSoftmax { axis: 1 }, vec![xs])?;
    let w = match n.opt(2) {
        Some(w) => Some(cx.cast(w, cx.dtype(xs))?),
        None => None,
    };
    let loss = nll(cx, n, lp, t, w)?;
    Ok(vec![cx.cast(loss, dt)?, cx.cast(lp, dt)?])
}
