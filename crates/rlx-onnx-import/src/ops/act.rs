//! Activations lowered onto existing primitives: Celu, ThresholdedRelu, Shrink, Mish,
//! Swish, SwiGLU (ONNX operator spec / reference implementation of the same name).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{Activation, BinaryOp, NodeId, Op};

/// ONNX Celu: `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))` = `alpha * Elu_1(x / alpha)`.
pub fn celu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let alpha = n.f("alpha", 1.0)? as f64;
    if alpha == 0.0 {
        return Err("alpha must be non-zero".into());
    }
    let dt = cx.dtype(x);
    let a = cx.scalar(dt, alpha);
    let xs = cx.binary(BinaryOp::Div, x, a)?;
    let e = cx.add(Op::Activation(Activation::Elu { alpha: 1.0 }), vec![xs])?;
    Ok(vec![cx.binary(BinaryOp::Mul, e, a)?])
}

/// ONNX ThresholdedRelu: `x > alpha ? x : 0` (alpha default 1).
pub fn thresholded_relu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let a = cx.scalar(dt, n.f("alpha", 1.0)? as f64);
    let zero = cx.scalar(dt, 0.0);
    let gt = cx.binary(BinaryOp::Gt, x, a)?;
    Ok(vec![cx.add(Op::Select, vec![gt, x, zero])?])
}

/// ONNX Shrink: `x < -lambd ? x + bias : (x > lambd ? x - bias : 0)`.
pub fn shrink(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let lambd = n.f("lambd", 0.5)? as f64;
    let bias = n.f("bias", 0.0)? as f64;
    let (nl, l) = (cx.scalar(dt, -lambd), cx.scalar(dt, lambd));
    let b = cx.scalar(dt, bias);
    let zero = cx.scalar(dt, 0.0);
    let lo = cx.binary(BinaryOp::Lt, x, nl)?;
    let hi = cx.binary(BinaryOp::Gt, x, l)?;
    let xpb = cx.binary(BinaryOp::Add, x, b)?;
    let xmb = cx.binary(BinaryOp::Sub, x, b)?;
    let inner = cx.add(Op::Select, vec![hi, xmb, zero])?;
    Ok(vec![cx.add(Op::Select, vec![lo, xpb, inner])?])
}

/// ONNX Mish: `x * tanh(softplus(x))`.
pub fn mish(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let sp = cx.add(Op::Activation(Activation::Softplus), vec![x])?;
    let t = cx.add(Op::Activation(Activation::Tanh), vec![sp])?;
    Ok(vec![cx.binary(BinaryOp::Mul, x, t)?])
}

/// `x * sigmoid(alpha * x)`.
fn swish_of(cx: &mut Ctx, x: NodeId, alpha: f64) -> R<NodeId> {
    if alpha == 1.0 {
        return cx.add(Op::Activation(Activation::Silu), vec![x]);
    }
    let a = cx.scalar(cx.dtype(x), alpha);
    let ax = cx.binary(BinaryOp::Mul, x, a)?;
    let s = cx.add(Op::Activation(Activation::Sigmoid), vec![ax])?;
    cx.binary(BinaryOp::Mul, x, s)
}

/// ONNX Swish (opset 24): `x * sigmoid(alpha * x)`, alpha default 1.
pub fn swish(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let alpha = n.f("alpha", 1.0)? as f64;
    Ok(vec![swish_of(cx, x, alpha)?])
}

/// ONNX SwiGLU: `Swish_alpha(a) * b`, A and B of the same shape.
pub fn swiglu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (a, b) = (n.inp(0)?, n.inp(1)?);
    if cx.shape(a) != cx.shape(b) {
        return Err(format!(
            "A {} and B {} must have the same type",
            cx.shape(a),
            cx.shape(b)
        ));
    }
    let alpha = n.f("alpha", 1.0)? as f64;
    let s = swish_of(cx, a, alpha)?;
    Ok(vec![cx.binary(BinaryOp::Mul, s, b)?])
}

/// ONNX LpPool: `(sum |x|^p)^(1/p)` over each window's positions inside the input (pads
/// excluded), as the node suite's expected outputs compute it.
pub fn lp_pool(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let p = match n.attr("p") {
        Some(a) if a.r#type == crate::proto::attr_type::FLOAT => a.f,
        Some(a) => a.i as f32,
        None => 2.0,
    };
    if p <= 0.0 {
        return Err(format!("p must be positive, got {p}"));
    }
    let kind = rlx_ir::PoolKind::Lp { p };
    // Pooled in a wider dtype (f16 -> f32, f32/bf16 -> f64) and cast back: x^p of large
    // finite values overflows the input dtype where the p-norm is finite.
    let dt = cx.dtype(x);
    let wdt = match dt {
        rlx_ir::DType::F16 => rlx_ir::DType::F32,
        rlx_ir::DType::F32 | rlx_ir::DType::BF16 => rlx_ir::DType::F64,
        d => d,
    };
    let xw = cx.cast(x, wdt)?;
    let y = super::nn::pool_on(cx, n, xw, kind, true)?;
    Ok(vec![cx.cast(y, dt)?])
}
