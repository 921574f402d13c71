//! Errors of the compiler passes. Every variant names the node as `%id Op "label"`
//! (label from `rlx_ir::provenance::node_label`).

/// A graph failed a compiler pass.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompileError {
    /// A node's input id does not exist or does not precede the node (graphs are stored in
    /// topological order).
    #[error("{node}: input {index} is {input}, which {why}")]
    BadInput {
        node: String,
        index: usize,
        input: String,
        why: &'static str,
    },
    /// A node has the wrong number of inputs for its op.
    #[error("{node}: expects {expected} inputs, got {got}")]
    Arity {
        node: String,
        expected: String,
        got: usize,
    },
    /// A graph output id does not exist.
    #[error("graph output {index} ({name}) is {id}, which does not exist ({len} nodes)")]
    BadOutput {
        index: usize,
        name: String,
        id: String,
        len: usize,
    },
    /// A node's id field does not equal its position.
    #[error("{node}: stored id does not match its position {pos}")]
    BadId { node: String, pos: usize },
    /// Shape inference failed on a node's input types.
    #[error("{node}: {msg}")]
    Shape { node: String, msg: String },
    /// A node's stored type differs from the inferred one.
    #[error("{node}: stored type {stored} but inputs give {inferred}")]
    ShapeMismatch {
        node: String,
        stored: String,
        inferred: String,
    },
}
