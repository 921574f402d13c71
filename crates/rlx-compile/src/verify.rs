//! The verify pass: structural checks plus a shape re-inference of every node.

use crate::error::CompileError;
use crate::infer_shape::{arity, infer_output};
use rlx_ir::provenance::node_label;
use rlx_ir::{Graph, NodeId, Shape};

/// `%id Op "label"`, the way compiler errors name a node.
pub fn describe(g: &Graph, id: NodeId) -> String {
    let n = g.node(id);
    format!("{} {} \"{}\"", id, n.op.name(), node_label(g, id))
}

/// Check that `g` is well formed:
/// * every node's id equals its position;
/// * every input id exists and precedes the node (topological order);
/// * every node has the input count its op takes ([`arity`]);
/// * every graph output id exists, and `output_names` (when set) has one name per output;
/// * every node's stored shape equals [`infer_output`] of its inputs' stored shapes
///   (leaves: `Constant` must match its tensor; `Input`/`Param` are declarations).
///
/// Errors name the node as `%id Op "label"`. The first problem found is returned.
pub fn verify(g: &Graph) -> Result<(), CompileError> {
    for (pos, n) in g.nodes.iter().enumerate() {
        if n.id.index() != pos {
            return Err(CompileError::BadId {
                node: format!(
                    "%{pos} {} \"{}\"",
                    n.op.name(),
                    node_label(g, NodeId(pos as u32))
                ),
                pos,
            });
        }
        let node = || describe(g, n.id);
        for (index, &i) in n.inputs.iter().enumerate() {
            let why = if i.index() >= g.nodes.len() {
                Some("does not exist")
            } else if i.index() >= pos {
                Some("does not precede it")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(CompileError::BadInput {
                    node: node(),
                    index,
                    input: i.to_string(),
                    why,
                });
            }
        }
        let (lo, hi) = arity(&n.op);
        if n.inputs.len() < lo || hi.is_some_and(|h| n.inputs.len() > h) {
            let expected = match hi {
                Some(h) if h == lo => format!("{lo}"),
                Some(h) => format!("{lo}..={h}"),
                None => format!("at least {lo}"),
            };
            return Err(CompileError::Arity {
                node: node(),
                expected,
                got: n.inputs.len(),
            });
        }
        if matches!(n.op, rlx_ir::Op::Input { .. } | rlx_ir::Op::Param { .. }) {
            continue;
        }
        let ins: Vec<&Shape> = n.inputs.iter().map(|&i| &g.node(i).shape).collect();
        let inferred = infer_output(&n.op, &ins).map_err(|e| CompileError::Shape {
            node: node(),
            msg: e.0,
        })?;
        if inferred != n.shape {
            return Err(CompileError::ShapeMismatch {
                node: node(),
                stored: n.shape.to_string(),
                inferred: inferred.to_string(),
            });
        }
    }
    for (index, o) in g.outputs.iter().enumerate() {
        if o.index() >= g.nodes.len() {
            return Err(CompileError::BadOutput {
                index,
                name: g.output_names.get(index).cloned().unwrap_or_default(),
                id: o.to_string(),
                len: g.nodes.len(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{DType, Op, Origin};

    fn sample() -> Graph {
        let mut g = Graph::new("t");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let w = g.param("w", Shape::new(&[3, 4], DType::F32));
        g.set_current_origin(Some(Origin {
            label: "fc".into(),
            op_type: Some("MatMul".into()),
            ..Default::default()
        }));
        let y = g.matmul(x, w, Shape::new(&[2, 4], DType::F32));
        g.set_outputs(vec![y]);
        g
    }

    #[test]
    fn accepts_a_good_graph() {
        verify(&sample()).unwrap();
    }

    #[test]
    fn names_the_node_on_a_shape_mismatch() {
        let mut g = sample();
        g.nodes[2].shape = Shape::new(&[2, 5], DType::F32);
        let e = verify(&g).unwrap_err().to_string();
        assert_eq!(
            e,
            "%2 MatMul \"fc\": stored type f32[2,5] but inputs give f32[2,4]"
        );
    }

    #[test]
    fn rejects_bad_inputs_arity_and_outputs() {
        let mut g = sample();
        g.nodes[2].inputs[1] = rlx_ir::NodeId(7);
        let e = verify(&g).unwrap_err().to_string();
        assert!(e.contains("%7, which does not exist"), "{e}");

        let mut g = sample();
        g.nodes[2].inputs[1] = rlx_ir::NodeId(2);
        let e = verify(&g).unwrap_err().to_string();
        assert!(e.contains("does not precede"), "{e}");

        let mut g = sample();
        g.nodes[2].inputs.pop();
        let e = verify(&g).unwrap_err().to_string();
        assert!(e.contains("expects 2 inputs, got 1"), "{e}");

        let mut g = sample();
        g.outputs[0] = rlx_ir::NodeId(9);
        assert!(matches!(verify(&g), Err(CompileError::BadOutput { .. })));

        let mut g = sample();
        g.nodes[1].shape = Shape::new(&[4, 4], DType::F32);
        let e = verify(&g).unwrap_err().to_string();
        assert!(e.contains("inner dims 3 and 4"), "{e}");
        let _ = Op::MatMul;
    }
}
