//! RLX CPU backend.
//!
//! * [`eval_op`]: evaluate one op on host tensors, re-exported from `rlx-kernels` (where
//!   the kernels live; it is also the constant evaluator that `rlx-compile` and the
//!   importers use for folding, through `rlx-kernels` directly);
//! * [`CpuExecutor`]: runs a whole graph in topological order, with the per-op
//!   `scan_node_for_nans` epilogue when a [`rlx_ir::DebugScanner`] is on.

use rlx_ir::numeric_check::NanAbort;
use rlx_ir::NodeId;

pub use rlx_kernels::{direct_conv_images, eval_op, packed_conv_runs, KernelError};

mod ewfuse;
mod executor;
mod fuse;
mod inplace;
mod plan;
mod prepared;
mod rowfuse;
mod steps;

pub use executor::{check_feeds, cpu_supports, CpuExecutor, NodeTimes, Observer};
pub use fuse::{conv_affine_groups, ConvAffineGroup};

/// An error from running a graph on the CPU, naming the node.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("{node} {op} \"{label}\": {msg}")]
    Kernel {
        node: NodeId,
        op: String,
        label: String,
        msg: String,
    },
    /// A run input does not match its Input node (count, dtype or dims).
    #[error("{0}")]
    Input(String),
    /// `set_param` got an unknown name or a value of the wrong type, or a param was not set.
    #[error("{0}")]
    Param(String),
    #[error(transparent)]
    NanAbort(#[from] NanAbort),
}
