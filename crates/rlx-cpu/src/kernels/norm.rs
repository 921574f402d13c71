//! Normalization (in progress).
use super::KResult;
use rlx_ir::Tensor;
pub(crate) fn layer_norm(
    _x: &Tensor,
    _s: &Tensor,
    _b: Option<&Tensor>,
    _axis: usize,
    _eps: f32,
) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "LayerNorm (not yet implemented)".into(),
    ))
}
pub(crate) fn batch_norm(_i: &[&Tensor], _eps: f32) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "BatchNorm (not yet implemented)".into(),
    ))
}
pub(crate) fn lrn(
    _x: &Tensor,
    _size: usize,
    _alpha: f32,
    _beta: f32,
    _bias: f32,
) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "LRN (not yet implemented)".into(),
    ))
}
