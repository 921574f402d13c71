//! RLX CPU backend.
//!
//! * [`eval_op`]: evaluate one op on host tensors (also the constant evaluator used by
//!   `rlx-compile` and the importers for folding);
//! * [`CpuExecutor`]: runs a whole graph in topological order, with the per-op
//!   `scan_node_for_nans` epilogue when a [`rlx_ir::DebugScanner`] is on.

use rlx_ir::numeric_check::NanAbort;
use rlx_ir::{NodeId, Op, Shape, Tensor};

/// A kernel could not run.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("op {0} is not supported by the CPU backend")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
}

/// Evaluate `op` on `inputs`, producing a tensor of type `out` (the node's inferred shape).
///
/// Errors: [`KernelError::Unsupported`] for ops without a CPU kernel, [`KernelError::Invalid`]
/// for inputs whose types do not fit the op (an index out of range, wrong arity, ...).
pub fn eval_op(op: &Op, inputs: &[&Tensor], out: &Shape) -> Result<Tensor, KernelError> {
    let _ = (op, inputs, out);
    Err(KernelError::Unsupported("(not yet implemented)".into()))
}

/// An error from running a graph on the CPU, naming the node.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("{node} {op} \"{label}\": {msg}")]
    Kernel { node: NodeId, op: String, label: String, msg: String },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    NanAbort(#[from] NanAbort),
}
