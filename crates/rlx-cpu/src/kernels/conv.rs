//! Convolution (in progress).
use super::KResult;
use rlx_ir::{ConvAttrs, Shape, Tensor};
pub(crate) fn conv(
    _x: &Tensor,
    _w: &Tensor,
    _b: Option<&Tensor>,
    _a: &ConvAttrs,
    _out: &Shape,
) -> KResult<Tensor> {
    Err(crate::KernelError::Unsupported(
        "Conv (not yet implemented)".into(),
    ))
}
