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
///
/// A `Transpose` whose every reader is a `MatMul` (and that is not a graph output) is not
/// folded either: a MatMul reads a transposed operand in place (the CPU executor passes the
/// Transpose's input to gemm with permuted strides, `matmul_perm`), so folding it would only
/// add a transposed copy of the constant, a whole second copy of a weight for `x @ Wᵀ`
/// (`MatMul(x, Transpose(W))`, how a linear layer reads a checkpoint's `[out, in]` weight).
/// For a backend without that in-place read (the GPU backends copy a Transpose per run),
/// [`const_fold_with`]`(g, false)` folds it like any other constant subgraph, whatever its
/// size (one transposed copy instead of a copy kernel per run); `rlx_runtime::Session` picks per
/// device ([`crate::compiler::CompileOptions::keep_matmul_transposes`]).
pub fn const_fold(g: &Graph) -> Graph {
    const_fold_with(g, true)
}

/// [`const_fold`], keeping weight Transposes read only by MatMuls when
/// `keep_matmul_transposes`, folding them otherwise.
pub fn const_fold_with(g: &Graph, keep_matmul_transposes: bool) -> Graph {
    const_fold_owned(g.clone(), keep_matmul_transposes)
}

/// [`const_fold_with`] on a graph the caller gives up: folds in place and drops dead nodes
/// by moving the live ones ([`eliminate_dead_owned`]), with no copy of the graph (the
/// compiler's pipeline; a dynamic model plans it per size signature, where three node-by-node
/// copies per fold were ~10% of planning a decode step).
pub fn const_fold_owned(g: Graph, keep_matmul_transposes: bool) -> Graph {
    fold_held(g, keep_matmul_transposes, &mut Vec::new())
}

/// [`const_fold_owned`] where a node tagged non-zero in `tags` (one entry per node; empty:
/// none), and every node that depends on one, is not folded; `tags` is rewritten to follow
/// the surviving nodes. A symbolic template's compile holds the nodes whose sizes or values
/// depend on symbols (they are folded after specialization).
pub fn fold_held(mut g: Graph, keep_matmul_transposes: bool, tags: &mut Vec<u32>) -> Graph {
    let mut held: Vec<bool> = vec![false; g.len()];
    if !tags.is_empty() {
        for n in &g.nodes {
            let i = n.id.index();
            held[i] = tags[i] != 0 || n.inputs.iter().any(|x| held[x.index()]);
        }
    }
    let mut values: Vec<Option<Arc<Tensor>>> = vec![None; g.len()];
    let mut finite: Vec<Option<bool>> = vec![None; g.len()];
    let mm_transposes = matmul_only_transposes(&g);
    let (read_in_place, any_size) = if keep_matmul_transposes {
        (mm_transposes, vec![false; g.len()])
    } else {
        // Folded whatever their size: the alternative is a copy of the weight every run
        // (a tied lm_head's 155M-element embedding in a Qwen3-0.6B decode step).
        (vec![false; g.len()], mm_transposes)
    };
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let folded = match &node.op {
            Op::Constant(t) => {
                values[i] = Some(t.clone());
                None
            }
            Op::Input { .. } | Op::Param { .. } => None,
            op => {
                if !read_in_place[i]
                    && !held[i]
                    && (node.shape.numel() <= MAX_FOLD_ELEMENTS || any_size[i])
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
                    rlx_kernels::eval_op(op, &ins, &node.shape)
                        .ok()
                        .map(Arc::new)
                } else {
                    None
                }
            }
        };
        if let Some(t) = folded {
            values[i] = Some(t.clone());
            let n = &mut g.nodes[i];
            n.op = Op::Constant(t);
            n.inputs.clear();
        }
    }
    eliminate_dead_tagged(g, tags)
}

/// Per node: a `Transpose` that is not a graph output and whose readers (at least one) are
/// all `MatMul`s, which read it in place ([`const_fold`] keeps it).
fn matmul_only_transposes(g: &Graph) -> Vec<bool> {
    let mut readers = vec![0usize; g.len()];
    let mut matmuls = vec![0usize; g.len()];
    for node in &g.nodes {
        for x in &node.inputs {
            readers[x.index()] += 1;
            if node.op == Op::MatMul {
                matmuls[x.index()] += 1;
            }
        }
    }
    for o in &g.outputs {
        // a graph output is read by the caller: a value, not a view
        readers[o.index()] += 1;
    }
    g.nodes
        .iter()
        .map(|n| {
            let i = n.id.index();
            matches!(n.op, Op::Transpose { .. }) && readers[i] > 0 && readers[i] == matmuls[i]
        })
        .collect()
}

/// Drop nodes no graph output depends on (graph inputs and params are always kept).
pub fn eliminate_dead(g: &Graph) -> Graph {
    eliminate_dead_owned(g.clone())
}

/// [`eliminate_dead`] on a graph the caller gives up: the live nodes are moved, not
/// copied, and a graph with no dead node comes back as it is.
pub fn eliminate_dead_owned(g: Graph) -> Graph {
    eliminate_dead_tagged(g, &mut Vec::new())
}

/// [`eliminate_dead_owned`], rewriting `tags` (one entry per node, or empty) to follow the
/// surviving nodes.
fn eliminate_dead_tagged(mut g: Graph, tags: &mut Vec<u32>) -> Graph {
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
    if live.iter().all(|&l| l) {
        return g;
    }
    let old = std::mem::take(&mut g.nodes);
    let mut map: Vec<Option<NodeId>> = vec![None; old.len()];
    for mut n in old {
        let id = n.id.index();
        if !live[id] {
            continue;
        }
        n.id = NodeId(g.nodes.len() as u32);
        for x in n.inputs.iter_mut() {
            *x = map[x.index()].expect("live input");
        }
        map[id] = Some(n.id);
        g.nodes.push(n);
    }
    for o in g.outputs.iter_mut() {
        *o = map[o.index()].expect("live output");
    }
    if !tags.is_empty() {
        let mut t = vec![0; g.nodes.len()];
        for (old, m) in map.iter().enumerate() {
            if let Some(m) = m {
                t[m.index()] = tags[old];
            }
        }
        *tags = t;
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{DType, Shape};

    fn weight(g: &mut Graph) -> NodeId {
        g.constant(Tensor::from_f32(&[3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap())
    }

    fn transpose(g: &mut Graph, w: NodeId) -> NodeId {
        g.add_node(
            Op::Transpose { perm: vec![1, 0] },
            vec![w],
            Shape::new(&[2, 3], DType::F32),
        )
    }

    /// `x @ Wᵀ`: the Transpose of the weight stays an op on the same constant (no copy).
    #[test]
    fn a_transpose_only_matmuls_read_is_not_folded() {
        let mut g = Graph::new("linear");
        let x = g.input("x", Shape::new(&[4, 2], DType::F32));
        let x2 = g.input("x2", Shape::new(&[1, 2], DType::F32));
        let w = weight(&mut g);
        let wt = transpose(&mut g, w);
        let y = g.add_node(Op::MatMul, vec![x, wt], Shape::new(&[4, 3], DType::F32));
        let y2 = g.add_node(Op::MatMul, vec![x2, wt], Shape::new(&[1, 3], DType::F32));
        g.set_outputs(vec![y, y2]);
        let f = const_fold(&g);
        let t = f
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Transpose { .. }))
            .expect("the Transpose stays");
        match &f.node(t.inputs[0]).op {
            Op::Constant(c) => match &g.node(w).op {
                Op::Constant(orig) => assert!(Arc::ptr_eq(c, orig)),
                _ => unreachable!(),
            },
            o => panic!("Transpose reads {o:?}"),
        }
    }

    /// For a backend without the in-place read (`const_fold_with(g, false)`), a weight
    /// Transpose read by MatMuls is folded, even above `MAX_FOLD_ELEMENTS` (a tied lm_head),
    /// into the transposed values.
    #[test]
    fn gpu_sessions_fold_matmul_transposes_of_any_size() {
        let (r, c) = (MAX_FOLD_ELEMENTS / 8 + 1, 8);
        let mut g = Graph::new("lm_head");
        let x = g.input("x", Shape::new(&[1, r], DType::F32));
        let vals: Vec<f32> = (0..r * c).map(|i| i as f32).collect();
        let w = g.constant(Tensor::from_f32(&[c, r], vals).unwrap());
        let wt = g.add_node(
            Op::Transpose { perm: vec![1, 0] },
            vec![w],
            Shape::new(&[r, c], DType::F32),
        );
        let y = g.add_node(Op::MatMul, vec![x, wt], Shape::new(&[1, c], DType::F32));
        g.set_outputs(vec![y]);
        assert!(const_fold_with(&g, true)
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::Transpose { .. })));
        let f = const_fold_with(&g, false);
        assert!(!f.nodes.iter().any(|n| matches!(n.op, Op::Transpose { .. })));
        let t = f
            .nodes
            .iter()
            .find_map(|n| match &n.op {
                Op::Constant(t) if t.dims() == [r, c] => Some(t.clone()),
                _ => None,
            })
            .expect("the transposed weight");
        let d = t.data().to_f32_vec();
        // element (i, j) of Wᵀ is W[j, i] = j·r + i
        assert_eq!(d[3 * c + 5], (5 * r + 3) as f32);
    }

    /// A Transpose of a constant that something other than a MatMul reads (or that is an
    /// output) is folded as before.
    #[test]
    fn other_transposes_of_constants_are_folded() {
        for as_output in [false, true] {
            let mut g = Graph::new("t");
            let x = g.input("x", Shape::new(&[2, 3], DType::F32));
            let w = weight(&mut g);
            let wt = transpose(&mut g, w);
            let s = g.add_node(
                Op::Binary(rlx_ir::BinaryOp::Add),
                vec![x, wt],
                Shape::new(&[2, 3], DType::F32),
            );
            let mut outs = vec![s];
            if as_output {
                let x4 = g.input("x4", Shape::new(&[4, 2], DType::F32));
                let y = g.add_node(Op::MatMul, vec![x4, wt], Shape::new(&[4, 3], DType::F32));
                outs = vec![y, wt];
            }
            g.set_outputs(outs);
            let f = const_fold(&g);
            assert!(
                !f.nodes.iter().any(|n| matches!(n.op, Op::Transpose { .. })),
                "as_output {as_output}"
            );
            let folded = f
                .nodes
                .iter()
                .filter_map(|n| match &n.op {
                    Op::Constant(c) if c.dims() == [2, 3] => Some(c.data().to_f32_vec()),
                    _ => None,
                })
                .next()
                .expect("a folded [2, 3] constant");
            assert_eq!(folded, vec![1., 3., 5., 2., 4., 6.]);
        }
    }

    /// Dead nodes between live ones are dropped and the survivors renumbered in order, their
    /// inputs and the outputs following them; a graph with nothing dead comes back the same.
    #[test]
    fn dead_nodes_are_dropped_and_ids_follow() {
        use rlx_ir::UnaryOp;
        let f = |d: &[usize]| Shape::new(d, DType::F32);
        let mut g = Graph::new("dce");
        let x = g.input("x", f(&[2]));
        let dead1 = g.add_node(Op::Unary(UnaryOp::Exp), vec![x], f(&[2]));
        let a = g.add_node(Op::Unary(UnaryOp::Neg), vec![x], f(&[2]));
        let _dead2 = g.add_node(Op::Unary(UnaryOp::Abs), vec![dead1], f(&[2]));
        let b = g.add_node(Op::Unary(UnaryOp::Sqrt), vec![a], f(&[2]));
        g.set_name(b, "b");
        g.set_outputs(vec![b, a]);
        let out = eliminate_dead_owned(g.clone());
        assert_eq!(out.len(), 3);
        let ops: Vec<&Op> = out.nodes.iter().map(|n| &n.op).collect();
        assert!(matches!(ops[0], Op::Input { .. }));
        assert_eq!(ops[1], &Op::Unary(UnaryOp::Neg));
        assert_eq!(ops[2], &Op::Unary(UnaryOp::Sqrt));
        assert!(out.nodes.iter().enumerate().all(|(i, n)| n.id.index() == i));
        assert_eq!(out.nodes[1].inputs, vec![NodeId(0)]);
        assert_eq!(out.nodes[2].inputs, vec![NodeId(1)]);
        assert_eq!(out.nodes[2].name.as_deref(), Some("b"));
        assert_eq!(out.outputs, vec![NodeId(2), NodeId(1)]);
        // The by-reference form gives the same graph; nothing dead: unchanged.
        assert_eq!(eliminate_dead(&g).nodes, out.nodes);
        let again = eliminate_dead_owned(out.clone());
        assert_eq!(again.nodes, out.nodes);
        assert_eq!(again.outputs, out.outputs);
    }
}
