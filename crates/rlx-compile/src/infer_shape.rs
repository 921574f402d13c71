//! Shape inference: the output type of an op from its input types.

use rlx_ir::{Op, Shape};

/// An op's inputs do not fit it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

/// Output type of `op` applied to inputs of types `inputs` (static dims).
///
/// Errors name what does not fit (e.g. `MatMul: inner dims 3 and 4 differ`); callers add
/// the node label. Definitions follow the ONNX operator spec of each op.
pub fn infer_output(op: &Op, inputs: &[&Shape]) -> Result<Shape, ShapeError> {
    let _ = (op, inputs);
    Err(ShapeError("not yet implemented".into()))
}
