//! `ai.onnx.ml` ops lowered onto primitives (reference implementation semantics):
//! Binarizer, ArrayFeatureExtractor.

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{BinaryOp, NodeId, Op};

/// Binarizer: `x > threshold ? 1 : 0` in x's type (threshold default 0).
pub fn binarizer(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let t = cx.scalar(dt, n.f("threshold", 0.0)? as f64);
    let one = cx.scalar(dt, 1.0);
    let zero = cx.scalar(dt, 0.0);
    let gt = cx.binary(BinaryOp::Gt, x, t)?;
    Ok(vec![cx.add(Op::Select, vec![gt, one, zero])?])
}

/// ArrayFeatureExtractor: the last axis of `x` gathered at the (flattened) indices; a 1-D
/// `x` gives `[1, k]` (as onnxruntime and the reference do).
pub fn array_feature_extractor(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx) = (n.inp(0)?, n.inp(1)?);
    let d = cx.dims(x);
    if d.is_empty() {
        return Err(format!("X must have rank >= 1, got {}", cx.shape(x)));
    }
    let k: usize = cx.dims(idx).iter().product();
    let idx = cx.reshape(idx, vec![k])?;
    let y = cx.add(Op::Gather { axis: d.len() - 1 }, vec![x, idx])?;
    if d.len() == 1 {
        return Ok(vec![cx.reshape(y, vec![1, k])?]);
    }
    Ok(vec![y])
}
