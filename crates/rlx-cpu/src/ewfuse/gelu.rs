//! GELU's erf form inside a chain: the five steps `x / c0` (or `x * c0`), Erf, `+ c1`,
//! `x ·`, `· c2` (BERT's and MiniLM's FFN activation as torch exports it) found at plan time
//! and run as one pass ([`rlx_kernels::kernels::chain::erf_gelu_part`], the five unfused
//! element functions in one loop, so the same bits). The five passes, not memory, were
//! the cost (MiniLM's bias + GELU chain 0.478 → 0.341 ms on Zen 4, docs/DESIGN.md).

use super::{Arg, Op1, Step};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op, UnaryOp};
use rlx_kernels::kernels::chain::{ErfGelu, StepOp};

/// Rewrite every run of five steps that is GELU's erf form (see the file) into four
/// [`Op1::Inside`] steps and one [`Op1::Gelu`] step that reads `x`. Taken only when the
/// four inner values are read by the next step alone, every step is f32, and the
/// constants are finite with `|c0| >= 1` for a division (`<= 1` for a product), so that a
/// finite `x` gives finite inner values and the scanner's check of the last value covers
/// them: `m = x · e1` overflowing makes the output infinite or NaN.
pub(super) fn fuse(g: &Graph, steps: &mut [Step], externals: &[NodeId]) {
    let scalar = |a: Arg| match a {
        Arg::Scalar(k) => match &g.node(externals[k]).op {
            Op::Constant(t) if t.dtype() == DType::F32 => t
                .as_f32()
                .and_then(|v| v.first().copied())
                .filter(|c| c.is_finite()),
            _ => None,
        },
        _ => None,
    };
    // `(operand, constant)` of a binary step `op` with one finite constant operand, in
    // either order (`first_only`: the constant must be second).
    let with_const = |st: &Step, op: BinaryOp, first_only: bool| -> Option<(Arg, f32)> {
        if !matches!(st.op, Op1::Ew(StepOp::Bin(b)) if b == op) {
            return None;
        }
        let [p, q] = st.args;
        match (scalar(p), scalar(q)) {
            (None, Some(c)) => Some((p, c)),
            (Some(c), None) if !first_only => Some((q, c)),
            _ => None,
        }
    };
    let reads = |steps: &[Step], i: usize| {
        steps
            .iter()
            .flat_map(|s| s.args_used())
            .filter(|&&a| a == Arg::Step(i))
            .count()
    };
    let mut k = 0;
    while k + 5 <= steps.len() {
        let s = &steps[k..k + 5];
        let hit = (|| {
            if s.iter().any(|st| st.dtype != DType::F32) {
                return None;
            }
            let (x, c0, div) = match with_const(&s[0], BinaryOp::Div, true) {
                Some((x, c)) => (x, c, true),
                None => with_const(&s[0], BinaryOp::Mul, false).map(|(x, c)| (x, c, false))?,
            };
            let scaled_ok = if div {
                c0.abs() >= 1.0
            } else {
                c0.abs() <= 1.0
            };
            if !scaled_ok || !matches!(x, Arg::Step(_) | Arg::Full(_)) {
                return None;
            }
            let erf = matches!(s[1].op, Op1::Ew(StepOp::Unary(UnaryOp::Erf)));
            if !erf || s[1].args[0] != Arg::Step(k) {
                return None;
            }
            let (e, c1) = with_const(&s[2], BinaryOp::Add, false)?;
            if e != Arg::Step(k + 1) || !matches!(s[3].op, Op1::Ew(StepOp::Bin(BinaryOp::Mul))) {
                return None;
            }
            let [p, q] = s[3].args;
            if !((p == x && q == Arg::Step(k + 2)) || (q == x && p == Arg::Step(k + 2))) {
                return None;
            }
            let (m, c2) = with_const(&s[4], BinaryOp::Mul, false)?;
            if m != Arg::Step(k + 3) {
                return None;
            }
            // The inner values are read once each: by the next step.
            if (k..k + 4).any(|i| reads(steps, i) != 1) {
                return None;
            }
            Some((x, ErfGelu { div, c0, c1, c2 }))
        })();
        match hit {
            Some((x, p)) => {
                for st in &mut steps[k..k + 4] {
                    st.op = Op1::Inside;
                }
                steps[k + 4].op = Op1::Gelu(p);
                steps[k + 4].args = [x, x];
                k += 5;
            }
            None => k += 1,
        }
    }
}
