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
