//! Comparisons, boolean logic, Where, IsNaN / IsInf.

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{BinaryOp, NodeId, Op, UnaryOp};

fn bin(cx: &mut Ctx, n: &ONode, b: BinaryOp) -> R<Vec<NodeId>> {
    let (x, y) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![cx.binary(b, x, y)?])
}

pub fn equal(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Eq)
}
pub fn less(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Lt)
}
pub fn less_or_equal(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Le)
}
pub fn greater(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Gt)
}
pub fn greater_or_equal(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Ge)
}
pub fn and(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::And)
}
pub fn or(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Or)
}
pub fn xor(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Xor)
}
pub fn not(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![cx.unary(UnaryOp::Not, x)?])
}
/// ONNX Where → `Select(cond, x, y)`.
pub fn where_(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let ins = (0..3).map(|i| n.inp(i)).collect::<R<Vec<_>>>()?;
    Ok(vec![cx.add(Op::Select, ins)?])
}
pub fn is_nan(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![cx.unary(UnaryOp::IsNaN, x)?])
}
/// ONNX IsInf with `detect_positive` / `detect_negative` (both default 1).
pub fn is_inf(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let u = UnaryOp::IsInf {
        pos: n.i("detect_positive", 1)? != 0,
        neg: n.i("detect_negative", 1)? != 0,
    };
    Ok(vec![cx.unary(u, x)?])
}
