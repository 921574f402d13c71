//! Matrix products (in progress).
use super::KResult;
use rlx_ir::{Shape, Tensor};
pub(crate) fn matmul(_a: &Tensor, _b: &Tensor, _out: &Shape) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "MatMul (not yet implemented)".into(),
    ))
}
