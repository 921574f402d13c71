//! RLX compiler passes, one file each; [`compiler`] runs them in order.
//!
//! * [`infer_shape`]: output type of every op (defined in `rlx_ir::infer_shape`, beside the
//!   ops; re-exported here for [`verify`] and older callers);
//! * [`verify`]: structural and type checks of a whole graph;
//! * [`error::CompileError`]: errors naming the node as `%id Op "label"`.

pub mod error;
pub use rlx_ir::infer_shape;
pub mod verify;

pub use error::CompileError;
pub mod compiler;
pub mod const_fold;
pub mod decompose;
pub mod numeric_lint;

pub use numeric_lint::{numeric_lint, NumericLint};
