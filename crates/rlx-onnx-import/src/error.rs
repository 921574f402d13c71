//! Import errors. Every variant names what it is about: the file, the initializer, the
//! graph input/output, or the ONNX node (its name, else its first output name).

/// An ONNX model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid protobuf `ModelProto` / `TensorProto`.
    #[error("{file}: not a valid ONNX protobuf ({msg})")]
    Decode { file: String, msg: String },
    /// The model as a whole is malformed (no graph, no default-domain opset, ...).
    #[error("{0}")]
    Model(String),
    /// An initializer / tensor attribute / test-data tensor is malformed or unsupported.
    #[error("tensor \"{name}\": {msg}")]
    Tensor { name: String, msg: String },
    /// A graph input's declared type is unusable.
    #[error("graph input \"{name}\": {msg}")]
    Input { name: String, msg: String },
    /// A graph output is not produced by the graph.
    #[error("graph output \"{name}\": {msg}")]
    Output { name: String, msg: String },
    /// The importer has no lowering for this op type (domain `ai.onnx` is the default one).
    #[error("node \"{node}\": unsupported op {domain}::{op_type} (opset {opset})")]
    UnsupportedOp {
        node: String,
        op_type: String,
        domain: String,
        opset: i64,
    },
    /// A node could not be lowered (bad attribute, input that must be constant, shapes that
    /// do not fit, ...).
    #[error("node \"{node}\" ({op_type}): {msg}")]
    Node {
        node: String,
        op_type: String,
        msg: String,
    },
}
