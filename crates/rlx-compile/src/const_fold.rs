//! Constant folding and dead-node elimination.

use rlx_ir::{Graph, NodeId, Op, Tensor};
use std::sync::Arc;

/// Largest value folded (elements); bigger constant subgraphs stay as ops.
const MAX_FOLD_ELEMENTS: usize = 1 << 24;

/// Return a copy of `g` where every non-leaf node whose inputs are all constants is replaced
/// by a `Constant` holding its value (computed by the CPU reference kernels; ops they cannot
/// evaluate stay), and nodes that no output depends on are dropped. Origins are kept, so a
/// folded constant still names the op it came from.
///
/// A node with an input that already holds NaN/Inf is not folded: folding would give the
/// bad value this node's origin (a `Transpose` of a weight holding NaN would read as "the
/// linear computed it"), so it stays an op and the localizer sees the chain at run time,
/// naming the constant (or the op) that created the value. Such graphs are rare; each
/// constant is scanned at most once.
pub fn const_fold(g: &Graph) -> Graph {
    let mut values: Vec<Option<Arc<Tensor>>> = vec![None; g.len()];
    let mut finite: Vec<Option<bool>> = vec![None; g.len()];
    let mut folded = g.clone();
    for node in &g.nodes {
        let i = node.id.index();
        match &node.op {
            Op::Constant(t) => values[i] = Some(t.clone()),
            Op::Input { .. } | Op::Param { .. } => {}
            op => {
                if node.shape.numel() <= MAX_FOLD_ELEMENTS
                    && node.inputs.iter().all(|x| values[x.index()].is_some())
                    && node.inputs.iter().all(|x| {
                        *finite[x.index()].get_or_insert_with(|| {
                            let t = values[x.index()].as_deref().expect("checked above");
                            !t.dtype().is_float()
                                || rlx_ir::numeric_check::scan_data(t.data()).is_clean()
                        })
                    })
                {
                    let ins: Vec<&Tensor> = node
                        .inputs
                        .iter()
                        .map(|x| values[x.index()].as_deref().expect("checked above"))
                        .collect();
                    if let Ok(t) = rlx_cpu::eval_op(op, &ins, &node.shape) {
                        let t = Arc::new(t);
                        values[i] = Some(t.clone());
                        let n = &mut folded.nodes[i];
                        n.op = Op::Constant(t);
                        n.inputs.clear();
                    }
                }
            }
        }
    }
    eliminate_dead(&folded)
}

/// Drop nodes no graph output depends on (graph inputs and params are always kept).
pub fn eliminate_dead(g: &Graph) -> Graph {
    let mut live = vec![false; g.len()];
    for o in &g.outputs {
        live[o.index()] = true;
    }
    for node in g.nodes.iter().rev() {
        if live[node.id.index()] {
            for x in &node.inputs {
                live[x.index()] = true;
            }
        }
        if matches!(node.op, Op::Input { .. } | Op::Param { .. }) {
            live[node.id.index()] = true;
        }
    }
    let mut out = g.clone();
    out.nodes.clear();
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    for node in &g.nodes {
        if !live[node.id.index()] {
            continue;
        }
        let mut n = node.clone();
        n.id = NodeId(out.nodes.len() as u32);
        n.inputs = node
            .inputs
            .iter()
            .map(|x| map[x.index()].expect("live input"))
            .collect();
        map[node.id.index()] = Some(n.id);
        out.nodes.push(n);
    }
    out.outputs = g
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("live output"))
        .collect();
    out
}
