//! Naming nodes in the user's own terms.

use crate::{Graph, NodeId, Op};

/// The label reports use for a node, resolved in this order (DESIGN.md contract):
/// a leaf's declared name (input/param name), the node's origin label (the source op's
/// name stamped by the importer), its block, its free-form name, and finally `%id`.
pub fn node_label(g: &Graph, id: NodeId) -> String {
    let n = g.node(id);
    match &n.op {
        Op::Input { name } | Op::Param { name } => return name.clone(),
        _ => {}
    }
    if let Some(o) = &n.origin {
        if !o.label.is_empty() {
            // A torch.export node: `layers.3.mlp/mul_2` (module path, then FX name), in
            // the style of an ONNX exporter's `/layers.3/mlp/Mul`.
            return match o.module.as_deref() {
                Some(m) if !m.is_empty() => format!("{m}/{}", o.label),
                _ => o.label.clone(),
            };
        }
    }
    if let Some(b) = &n.block {
        return b.clone();
    }
    if let Some(nm) = &n.name {
        return nm.clone();
    }
    id.to_string()
}

/// The source op type (e.g. ONNX `Softmax`) of a node, when an importer recorded it.
pub fn source_op_type(g: &Graph, id: NodeId) -> Option<&str> {
    g.node(id)
        .origin
        .as_ref()
        .and_then(|o| o.op_type.as_deref())
}

/// Where the user's code created a node's source op, when the importer recorded it
/// (`torch.export` programs): `model.py:42  y = self.proj(x)`.
pub fn source_location(g: &Graph, id: NodeId) -> Option<&crate::SourceLoc> {
    g.node(id).origin.as_ref().and_then(|o| o.source.as_ref())
}

/// The loop iterations a node was lowered in ([`crate::Origin::iteration`]; empty outside
/// loops), outermost first.
pub fn node_iteration(g: &Graph, id: NodeId) -> &[crate::LoopIteration] {
    g.node(id)
        .origin
        .as_ref()
        .map(|o| o.iteration.as_slice())
        .unwrap_or(&[])
}

/// A node's label quoted, followed by its loop iteration when it has one: the form every
/// report prints a node's name in, `"loop_body/Sqrt" (iteration 3 of Loop "decoder_loop")`
/// (nested: `(iteration 3 of Loop "outer", 5 of Scan "inner")`), or `"fc"` outside loops.
pub fn quoted_label(g: &Graph, id: NodeId) -> String {
    with_iteration(&node_label(g, id), node_iteration(g, id))
}

/// `"label"` followed by ` (iteration …)` when `path` is not empty (see [`quoted_label`]).
pub fn with_iteration(label: &str, path: &[crate::LoopIteration]) -> String {
    match crate::graph::iteration_text(path) {
        Some(it) => format!("\"{label}\" ({it})"),
        None => format!("\"{label}\""),
    }
}
