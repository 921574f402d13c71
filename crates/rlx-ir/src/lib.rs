//! RLX graph IR.
//!
//! * [`Graph`], [`Node`], [`NodeId`] (printed `%N`), [`Op`], [`Shape`], [`DType`], [`Tensor`];
//! * a builder API (`g.input`, `g.param`, `g.matmul`, `g.activation`, `g.set_outputs`);
//! * [`infer_shape::infer_output`]: every op's output type from its input types;
//! * [`provenance::node_label`]: names nodes in the user's terms;
//! * [`numeric_check`]: the NaN/Inf localizer every backend calls;
//! * [`env`]: the registry of every `RLX_*` environment variable (`rlx env` prints it).

pub mod dtype;
pub mod env;
pub mod graph;
pub mod infer_shape;
pub mod narrow;
pub mod numeric_check;
pub mod op;
pub mod provenance;
pub mod sampling;
pub mod shape;
pub mod sym;
pub mod tensor;

pub use dtype::DType;
pub use graph::{Graph, LoopIteration, Node, NodeId, Origin, SourceLoc};
pub use numeric_check::{DebugMode, DebugScanner, NanReport};
pub use op::{
    Activation, BinaryOp, ConvAttrs, GridMode, GridPadding, Op, PadMode, PoolAttrs, PoolKind,
    ReduceKind, ScatterReduction, UnaryOp,
};
pub use shape::{broadcast_dims, strides_of, Dim, Shape};
pub use tensor::{Dims, ElementCountError, Tensor, TensorData};
