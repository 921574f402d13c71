//! Pooling (in progress).
use super::KResult;
use rlx_ir::{PoolAttrs, Shape, Tensor};
pub(crate) fn pool(_x: &Tensor, _a: &PoolAttrs, _out: &Shape) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "Pool (not yet implemented)".into(),
    ))
}
