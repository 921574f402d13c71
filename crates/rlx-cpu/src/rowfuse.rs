//! Softmax row fusion for the CPU executor. rlx-compile lowers an ONNX Softmax over the
//! last axis into five primitives (`rlx_compile::decompose`), each a pass over the whole
//! tensor with its own buffer:
//!
//! ```text
//! m = ReduceMax(x, [last], keepdims)   d = Sub(x, m)   e = Exp(d)
//! s = ReduceSum(e, [last], keepdims)   y = Div(e, s)
//! ```
//!
//! Here the five run as one pass per row, on the row while it is in L1, with the same row
//! kernels and the same f32 expressions as the unfused ops (the max of
//! `reduce::extreme_f32`, `x - m`, `fastmath::exp_slice`, the f64 row sum of
//! `reduce::sum_f32` rounded to f32, `e / s`): the same bits (tests/fusion.rs checks them).
//! Attention layers spend a large share of a small transformer's time in them (qwen3 at 128
//! tokens: ~14% of the profile).
//!
//! As for conv groups (`crate::fuse`), the graph is not rewritten and the executor decides
//! per run: fused without hooks; with a NaN/Inf scanner, fused when every `d` is finite
//! (then `x` and `m` are finite, `e` lies in [0, 1], `s` in [1, n] and `y` in [0, 1]: every
//! member's value is finite), else replayed op by op so that the report names the op that
//! made the value; with hooks, unfused.

use rlx_ir::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceKind, Tensor, TensorData, UnaryOp};
use std::sync::atomic::{AtomicU32, Ordering};

/// One decomposed Softmax over the last axis.
#[derive(Debug)]
pub(crate) struct SoftmaxGroup {
    /// Sub, Exp, ReduceSum, Div, in order, after the ReduceMax (whose input 0 is `x`, and
    /// at whose place the group runs); the Div's value is the group's output.
    pub members: [NodeId; 4],
}

/// The row fusion plan of one graph.
#[derive(Debug, Default)]
pub(crate) struct RowFusions {
    pub groups: Vec<SoftmaxGroup>,
    /// Per node: the group whose ReduceMax it is.
    pub at: Vec<Option<usize>>,
    /// Per node: the group whose other members it belongs to.
    pub member_of: Vec<Option<usize>>,
}

impl RowFusions {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

/// Find the decomposed Softmaxes of `g` over the last axis of a static f32 tensor whose
/// intermediates are read by nothing else and are not graph outputs. `consumers[i]` lists
/// the nodes reading node i (one entry per use).
pub(crate) fn plan(g: &Graph, consumers: &[Vec<NodeId>], is_output: &[bool]) -> RowFusions {
    let n = g.len();
    let mut out = RowFusions {
        groups: vec![],
        at: vec![None; n],
        member_of: vec![None; n],
    };
    for node in &g.nodes {
        if let Some(members) = softmax_at(g, node.id, consumers, is_output) {
            let k = out.groups.len();
            out.at[node.id.index()] = Some(k);
            for m in members {
                out.member_of[m.index()] = Some(k);
            }
            out.groups.push(SoftmaxGroup { members });
        }
    }
    out
}

/// The Sub, Exp, ReduceSum and Div of a decomposed Softmax whose ReduceMax is `max`.
fn softmax_at(
    g: &Graph,
    max: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<[NodeId; 4]> {
    let node = g.node(max);
    let &[x] = node.inputs.as_slice() else {
        return None;
    };
    let xs = &g.node(x).shape;
    let rank = xs.rank();
    let last_axis = |op: &Op, want: ReduceKind| {
        matches!(op, Op::Reduce { kind, axes, keepdims: true }
            if *kind == want && axes.as_slice() == [rank - 1])
    };
    let static_dims = xs.dims.iter().all(|d| matches!(d, Dim::Static(_)));
    if rank == 0 || xs.dtype != DType::F32 || !static_dims || !last_axis(&node.op, ReduceKind::Max)
    {
        return None;
    }
    // Each intermediate has exactly the consumers named, and is not a graph output.
    let only = |id: NodeId, want: &[NodeId]| {
        !is_output[id.index()] && {
            let mut c = consumers[id.index()].clone();
            c.sort();
            let mut w = want.to_vec();
            w.sort();
            c == w
        }
    };
    let &[sub] = consumers[max.index()].as_slice() else {
        return None;
    };
    let is = |id: NodeId, op: &Op, ins: &[NodeId]| {
        let n = g.node(id);
        &n.op == op && n.inputs.as_slice() == ins && n.shape == *xs
    };
    if !is(sub, &Op::Binary(BinaryOp::Sub), &[x, max]) || !only(max, &[sub]) {
        return None;
    }
    let &[exp] = consumers[sub.index()].as_slice() else {
        return None;
    };
    if !is(exp, &Op::Unary(UnaryOp::Exp), &[sub]) || !only(sub, &[exp]) {
        return None;
    }
    let [c0, c1] = consumers[exp.index()].as_slice() else {
        return None;
    };
    let (sum, div) = if matches!(g.node(*c0).op, Op::Reduce { .. }) {
        (*c0, *c1)
    } else {
        (*c1, *c0)
    };
    let sum_node = g.node(sum);
    if !last_axis(&sum_node.op, ReduceKind::Sum)
        || sum_node.inputs.as_slice() != [exp]
        || sum_node.shape != node.shape
        || !only(exp, &[sum, div])
        || !only(sum, &[div])
        || !is(div, &Op::Binary(BinaryOp::Div), &[exp, sum])
    {
        return None;
    }
    Some([sub, exp, sum, div])
}

/// The fused Softmax of `x` over its last axis (a group found by [`plan`]): the Div's value,
/// and whether every member's value is finite (checked only when `scan`; true otherwise).
///
/// Errors: `x` not f32 (the plan admits only f32 groups).
pub(crate) fn softmax_rows(x: &Tensor, scan: bool) -> Result<(Tensor, bool), crate::KernelError> {
    let TensorData::F32(v) = x.data() else {
        return Err(crate::KernelError::Invalid(
            "fused Softmax: input is not f32".into(),
        ));
    };
    let n = x.dims().last().copied().unwrap_or(1);
    // Every element is written below (the rows cover it).
    let mut out: Vec<f32> = crate::buffers::overwritten(v.len());
    // Largest |d| bits seen (NaN's bits are above +inf's).
    let max_bits = AtomicU32::new(0);
    if n > 0 {
        // Blocks of whole rows, about 4096 elements each (one ISA dispatch per block).
        let block = n * (4096 / n).max(1);
        crate::kernels::fill_chunks(&mut out, block, |b, dst| {
            let src = &v[b * block..b * block + dst.len()];
            let bits = crate::kernels::reduce::softmax_rows_f32(src, dst, n, scan);
            max_bits.fetch_max(bits, Ordering::Relaxed);
        });
    }
    let clean = !scan || max_bits.into_inner() < 0x7f80_0000;
    let t = crate::kernels::make(x.dims(), TensorData::F32(out))?;
    Ok((t, clean))
}
