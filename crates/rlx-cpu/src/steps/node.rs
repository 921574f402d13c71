//! A node run op by op ([`run_op`]: every non-leaf node can, with fusion off, in hooked runs
//! and in a group's replay), and a Transpose that its MatMul reads in place
//! ([`Step::View`](super::Step::View), [`view_turn`]).

use super::{input_values, kernel_err, Run, Slot, Turn};
use crate::plan::Plan;
use crate::{eval_op, CpuError, KernelError};
use rlx_ir::{DType, Graph, NodeId, Op, Tensor};

/// A MatMul operand read through a Transpose's perm (`Plan::mm_views`).
#[derive(Debug, Clone)]
pub(crate) struct MmView {
    pub transpose: NodeId,
    /// The Transpose's input, which the MatMul reads (liveness counts it as a reader).
    pub src: NodeId,
    perm: Vec<usize>,
}

/// Per MatMul node, its operands that are a Transpose of a float (f32, f64, f16, bf16: the
/// dtypes `matmul_perm` reads through strides) whose only use is that MatMul (and not a graph
/// output): `Plan::mm_views`.
pub(crate) fn plan_mm_views(
    g: &Graph,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Vec<[Option<MmView>; 2]> {
    g.nodes
        .iter()
        .map(|node| {
            let view = |t: NodeId| {
                let tn = g.node(t);
                match (&tn.op, tn.inputs.as_slice()) {
                    (Op::Transpose { perm }, &[src])
                        if node.op == Op::MatMul
                            && matches!(
                                tn.shape.dtype,
                                DType::F32 | DType::F64 | DType::F16 | DType::BF16
                            )
                            && perm.len() >= 2
                            && consumers[t.index()].as_slice() == [node.id]
                            && !is_output[t.index()] =>
                    {
                        Some(MmView {
                            transpose: t,
                            src,
                            perm: perm.to_vec(),
                        })
                    }
                    _ => None,
                }
            };
            match node.inputs.as_slice() {
                &[a, b] if node.op == Op::MatMul => [view(a), view(b)],
                _ => [None, None],
            }
        })
        .collect()
}

/// MatMul `id`'s operand `j`: the input itself, or, when it is a Transpose that was not
/// run (`view`, its slot empty), that Transpose's input and perm.
fn mm_operand<'a>(
    g: &Graph,
    id: NodeId,
    slots: &'a [Slot],
    j: usize,
    view: &'a Option<MmView>,
) -> Result<(&'a Tensor, Option<&'a [usize]>), CpuError> {
    match view {
        Some(v) if slots[v.transpose.index()].get().is_none() => {
            let t = input_values(g, v.transpose, slots, &[v.src])?[0];
            Ok((t, Some(v.perm.as_slice())))
        }
        _ => Ok((
            input_values(g, id, slots, &g.node(id).inputs[j..=j])?[0],
            None,
        )),
    }
}

/// The turn of a Transpose that its MatMul reads in place: not run. With a scanner, only
/// when its input is clean (its counts are then the input's, all zero); else it runs, so
/// the report gives the transposed value's positions.
pub(crate) fn view_turn(g: &Graph, id: NodeId, run: &Run) -> Turn {
    if !run.scan || run.finite[g.node(id).inputs[0].index()] {
        Turn::Done
    } else {
        Turn::Op
    }
}

/// Run one non-leaf node op by op, reusing its first input's buffer when that input dies
/// here (or the second's, for an Add or Mul), reading a Transpose operand of a MatMul in
/// place when that Transpose was not run, and a conv's packed (`fast`) or Winograd
/// (`wino`) weights where the plan made them.
pub(crate) fn run_op(
    plan: &Plan,
    g: &Graph,
    id: NodeId,
    op: &Op,
    slots: &mut [Slot],
    wino: bool,
    fast: bool,
) -> Result<Tensor, CpuError> {
    let node = g.node(id);
    let err = |e: KernelError| kernel_err(g, id, e.to_string());
    if plan.can_take0[id.index()] && crate::inplace::can_reuse(op) {
        if let Some(first) = slots[node.inputs[0].index()].take_owned() {
            let rest = input_values(g, id, slots, &node.inputs[1..])?;
            return crate::inplace::eval_owned(op, first, &rest, &node.shape).map_err(err);
        }
    }
    if plan.can_take1[id.index()] {
        if let Some(second) = slots[node.inputs[1].index()].take_owned() {
            let first = input_values(g, id, slots, &node.inputs[..1])?[0];
            return crate::inplace::eval_owned_second(op, first, second, &node.shape).map_err(err);
        }
    }
    let [va, vb] = &plan.mm_views[id.index()];
    if va.is_some() || vb.is_some() {
        let (a, ap) = mm_operand(g, id, slots, 0, va)?;
        let (b, bp) = mm_operand(g, id, slots, 1, vb)?;
        return rlx_kernels::kernels::matmul::matmul_perm(a, ap, b, bp, &node.shape).map_err(err);
    }
    if let (Op::MatMul, Some(pk)) = (op, &plan.mm_packed[id.index()]) {
        let a = input_values(g, id, slots, &node.inputs[..1])?[0];
        if let Some(r) = rlx_kernels::kernels::mm_packed::matmul_packed(a, pk, &node.shape) {
            return r.map_err(err);
        }
    }
    let ins = input_values(g, id, slots, &node.inputs)?;
    if let (Op::Conv(a), Some(pk), true) = (op, &plan.packed[id.index()], fast) {
        return rlx_kernels::kernels::conv::conv_packed(
            ins[0],
            pk,
            ins.get(2).copied(),
            a,
            &node.shape,
            rlx_kernels::kernels::conv::Act::NONE,
            None,
        )
        .map_err(err);
    }
    match (op, &plan.wino[id.index()]) {
        (Op::Conv(a), Some(wg)) if wino => rlx_kernels::kernels::conv::conv_winograd(
            ins[0],
            wg,
            ins[1],
            ins.get(2).copied(),
            a,
            &node.shape,
            &rlx_kernels::kernels::conv::no_post,
        )
        .map_err(err),
        _ => eval_op(op, &ins, &node.shape).map_err(err),
    }
}
