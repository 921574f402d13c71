//! Recognizing a sampler's temperature division in a graph, so that a temperature of 0 gets
//! a fix line about sampling instead of the generic division-by-zero advice (issue 31).
//!
//! A sampler written as graph ops divides the logits `[.., vocab]` by a temperature `T` (one
//! value) before a softmax, an argmax or a top-k: `softmax(logits / T)`, or
//! `logits * reciprocal(T)`. With `T = 0` every logit becomes `±inf` (`0 / 0` is NaN) and the
//! softmax turns the row into NaN. [`temperature_division`] recognizes the division by its
//! shape (a single-value divisor of a tensor whose last axis holds more than one value) and
//! either its name (the divisor or the op is labelled `*temperature*`) or its use (its value
//! reaches a `Softmax`, `LogSoftmax`, `ArgMax` or `TopK` through elementwise, shape and cast
//! ops). [`sampler_fix`] gives the fix line for a NaN/Inf report whose value was made there.

use crate::numeric_check::Cause;
use crate::op::{BinaryOp, UnaryOp};
use crate::provenance::{node_label, source_op_type};
use crate::{Graph, NodeId, Op};

/// The fix line of a report blamed on a sampler's temperature division.
pub const TEMPERATURE_FIX: &str = "the sampler divides the logits by a temperature of 0 (x / 0 is ±inf, 0 / 0 is NaN, and the softmax of a row holding +inf is NaN; a tiny temperature overflows the same way): take the greedy path for T = 0, the argmax of the logits, as transformers' do_sample=False does, or clamp the temperature before dividing (logits / max(T, 1e-5))";

/// Nodes that read `id`'s value.
fn consumers(g: &Graph, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
    g.nodes
        .iter()
        .filter(move |n| n.inputs.contains(&id))
        .map(|n| n.id)
}

fn one_value(g: &Graph, id: NodeId) -> bool {
    g.node(id).shape.numel() == 1
}

/// More than one value along the last axis (a row of logits).
fn row_of_logits(g: &Graph, id: NodeId) -> bool {
    g.node(id).shape.dims_usize().last().is_some_and(|&v| v > 1)
        && g.node(id).shape.dtype.is_float()
}

/// A weight or literal: an attention block's `scores / sqrt(d)` divides by one, so a
/// constant divisor counts as a temperature by name only.
fn constant(g: &Graph, id: NodeId) -> bool {
    matches!(g.node(id).op, Op::Constant(_) | Op::Param { .. })
}

fn named_temperature(g: &Graph, id: NodeId) -> bool {
    node_label(g, id)
        .to_ascii_lowercase()
        .contains("temperature")
}

/// Whether `id`'s value reaches a softmax, an argmax or a top-k through at most a few
/// elementwise, shape or cast ops (the ops of a sampler between the division and the
/// distribution).
fn feeds_a_distribution(g: &Graph, id: NodeId) -> bool {
    let sink = |n: NodeId| {
        let node = g.node(n);
        matches!(
            node.op,
            Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::TopK { .. }
        ) || matches!(node.op, Op::ArgReduce { max: true, .. })
            || source_op_type(g, n).is_some_and(|s| {
                let s = s.to_ascii_lowercase();
                ["softmax", "logsoftmax", "argmax", "topk"].contains(&s.as_str())
                    || s.starts_with("aten._softmax")
                    || s.starts_with("aten.softmax")
                    || s.starts_with("aten._log_softmax")
                    || s.starts_with("aten.argmax")
                    || s.starts_with("aten.topk")
            })
    };
    let pass = |n: NodeId| {
        matches!(
            g.node(n).op,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Activation(_)
                | Op::Select
                | Op::Cast { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Broadcast { .. }
        )
    };
    let mut frontier = vec![id];
    let mut seen = vec![id];
    for _ in 0..6 {
        let mut next = vec![];
        for f in frontier {
            for c in consumers(g, f) {
                if sink(c) {
                    return true;
                }
                if pass(c) && !seen.contains(&c) && seen.len() < 64 {
                    seen.push(c);
                    next.push(c);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    false
}

/// Whether node `id` is a sampler's temperature division: `Div(logits, T)`, or
/// `Mul(logits, R)` / `R` itself where `R = Reciprocal(T)`, with `T` a single value, the
/// logits a float tensor with more than one value in its last axis, and the division either
/// named (`*temperature*`, in the label of the op, of `T` or of `R`) or, when `T` is not a
/// constant or weight (an attention block's `scores / sqrt(d)` is), feeding a softmax,
/// argmax or top-k.
pub fn temperature_division(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    let recip_of_one = |r: NodeId| {
        matches!(g.node(r).op, Op::Unary(UnaryOp::Reciprocal)) && one_value(g, g.node(r).inputs[0])
    };
    let is_div = |d: NodeId| {
        let n = g.node(d);
        match n.op {
            Op::Binary(BinaryOp::Div) => {
                let (x, t) = (n.inputs[0], n.inputs[1]);
                one_value(g, t)
                    && row_of_logits(g, x)
                    && (named_temperature(g, d)
                        || named_temperature(g, t)
                        || (!constant(g, t) && feeds_a_distribution(g, d)))
            }
            Op::Binary(BinaryOp::Mul) => n.inputs.iter().enumerate().any(|(k, &r)| {
                let x = n.inputs[1 - k];
                recip_of_one(r)
                    && row_of_logits(g, x)
                    && (named_temperature(g, d)
                        || named_temperature(g, r)
                        || named_temperature(g, g.node(r).inputs[0])
                        || (!constant(g, g.node(r).inputs[0]) && feeds_a_distribution(g, d)))
            }),
            _ => false,
        }
    };
    match n.op {
        Op::Unary(UnaryOp::Reciprocal) if one_value(g, n.inputs[0]) => {
            consumers(g, id).any(&is_div)
        }
        _ => is_div(id),
    }
}

/// The sampler's fix line for a report at `id` with `cause`, when the value was made by a
/// temperature division ([`temperature_division`]): `id` itself created it (a `0 / 0` NaN,
/// an Inf that reached an output), or `id` turned into NaN an infinity created there (the
/// softmax after it). `None` otherwise.
pub fn sampler_fix(g: &Graph, id: NodeId, cause: &Cause) -> Option<String> {
    let origin = match cause {
        Cause::InputsFinite => Some(id),
        Cause::InputsHeldInf { inf_origin, .. } => *inf_origin,
        _ => None,
    }?;
    temperature_division(g, origin).then(|| TEMPERATURE_FIX.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Shape, Tensor};

    /// `softmax(x / t)` with `x` `[1, v]`, `t` as `divisor` makes it.
    fn sampler(v: usize, divisor: impl Fn(&mut Graph) -> NodeId) -> (Graph, NodeId) {
        let mut g = Graph::new("s");
        let x = g.input("logits", Shape::new(&[1, v], DType::F32));
        let t = divisor(&mut g);
        let d = g.div(x, t, Shape::new(&[1, v], DType::F32));
        let p = g.softmax(d, 1, Shape::new(&[1, v], DType::F32));
        g.set_outputs(vec![p]);
        (g, d)
    }

    #[test]
    fn recognized_by_use_or_name() {
        // a scalar input (any name) feeding a softmax
        let (g, d) = sampler(16, |g| g.input("t", Shape::new(&[], DType::F32)));
        assert!(temperature_division(&g, d));
        // a constant divisor counts by name only (an attention scale does not)
        let (g, d) = sampler(16, |g| g.constant(Tensor::scalar(DType::F32, 8.0)));
        assert!(!temperature_division(&g, d));
        let (g, d) = sampler(16, |g| {
            g.param("gen.temperature", Shape::new(&[1], DType::F32))
        });
        assert!(temperature_division(&g, d));
        // a per-row divisor (a norm's) is not a temperature
        let (g, d) = sampler(16, |g| g.input("t", Shape::new(&[1, 16], DType::F32)));
        assert!(!temperature_division(&g, d));
        // a single logit is no distribution
        let (g, d) = sampler(1, |g| g.input("t", Shape::new(&[], DType::F32)));
        assert!(!temperature_division(&g, d));
    }

    #[test]
    fn reciprocal_then_mul() {
        let mut g = Graph::new("s");
        let f = |d: &[usize]| Shape::new(d, DType::F32);
        let x = g.input("logits", f(&[2, 8]));
        let t = g.input("temperature", f(&[1]));
        let r = g.unary(UnaryOp::Reciprocal, t, f(&[1]));
        let m = g.mul(x, r, f(&[2, 8]));
        g.set_outputs(vec![m]);
        assert!(temperature_division(&g, m));
        assert!(temperature_division(&g, r));
        let c = Cause::InputsFinite;
        assert!(sampler_fix(&g, r, &c).is_some());
        assert!(sampler_fix(&g, x, &c).is_none());
    }
}
