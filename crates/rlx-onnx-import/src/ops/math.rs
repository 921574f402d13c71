//! Arithmetic, elementwise math and linear algebra (ONNX Add…Pow, unary math, variadic
//! Max/Min/Sum/Mean, MatMul, Gemm, Clip, CumSum).

use crate::ctx::{norm_axis, Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, UnaryOp};

fn bin(cx: &mut Ctx, n: &ONode, b: BinaryOp) -> R<Vec<NodeId>> {
    let (a, c) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![cx.binary(b, a, c)?])
}

fn un(cx: &mut Ctx, n: &ONode, u: UnaryOp) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![cx.unary(u, x)?])
}

pub fn add(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Add)
}
pub fn sub(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Sub)
}
pub fn mul(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Mul)
}
pub fn div(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::Div)
}

/// ONNX Pow allows an exponent of another numeric type; it is cast to the base's type.
pub fn pow(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (a, b) = (n.inp(0)?, n.inp(1)?);
    let b = cx.cast(b, cx.dtype(a))?;
    Ok(vec![cx.binary(BinaryOp::Pow, a, b)?])
}

/// ONNX Mod: `fmod = 1` is C fmod (`Rem`), else Python `%` (`Mod`).
pub fn modulo(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let op = if n.i("fmod", 0)? != 0 {
        BinaryOp::Rem
    } else {
        BinaryOp::Mod
    };
    bin(cx, n, op)
}

macro_rules! unary_ops {
    ($($f:ident => $u:expr),* $(,)?) => {
        $(pub fn $f(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> { un(cx, n, $u) })*
    };
}
unary_ops! {
    sqrt => UnaryOp::Sqrt, reciprocal => UnaryOp::Reciprocal, exp => UnaryOp::Exp,
    log => UnaryOp::Log, neg => UnaryOp::Neg, abs => UnaryOp::Abs, floor => UnaryOp::Floor,
    ceil => UnaryOp::Ceil, round => UnaryOp::Round, sign => UnaryOp::Sign, sin => UnaryOp::Sin,
    cos => UnaryOp::Cos, tan => UnaryOp::Tan, asin => UnaryOp::Asin, acos => UnaryOp::Acos,
    atan => UnaryOp::Atan, sinh => UnaryOp::Sinh, cosh => UnaryOp::Cosh, asinh => UnaryOp::Asinh,
    acosh => UnaryOp::Acosh, atanh => UnaryOp::Atanh, erf => UnaryOp::Erf,
}

/// Variadic op folded left to right: `op(op(x0, x1), x2)…`.
fn variadic(cx: &mut Ctx, n: &ONode, b: BinaryOp) -> R<NodeId> {
    let mut acc = n.inp(0)?;
    for i in 1..n.n_inputs() {
        let x = n.inp(i)?;
        acc = cx.binary(b, acc, x)?;
    }
    Ok(acc)
}

/// ONNX Max (NaN-propagating, like `np.maximum`).
pub fn max(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    Ok(vec![variadic(cx, n, BinaryOp::Max)?])
}
/// ONNX Min (NaN-propagating).
pub fn min(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    Ok(vec![variadic(cx, n, BinaryOp::Min)?])
}
pub fn sum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    Ok(vec![variadic(cx, n, BinaryOp::Add)?])
}
/// ONNX Mean = Sum / count, summed in a wider float type (f64 for f32, f32 for f16/bf16)
/// and rounded once: the sum of finite inputs can overflow where the mean cannot
/// (`Mean(65504, 100)` in float16 is 32802, not inf).
pub fn mean(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    if n.n_inputs() == 1 {
        return Ok(vec![n.inp(0)?]);
    }
    let dt = cx.dtype(n.inp(0)?);
    let wide = crate::ops::reduce::wider(dt);
    let mut acc = None;
    for i in 0..n.n_inputs() {
        let x = cx.cast(n.inp(i)?, wide)?;
        acc = Some(match acc {
            None => x,
            Some(a) => cx.binary(BinaryOp::Add, a, x)?,
        });
    }
    let s = acc.ok_or("Mean needs at least one input")?;
    let k = cx.scalar(wide, n.n_inputs() as f64);
    let m = cx.binary(BinaryOp::Div, s, k)?;
    Ok(vec![cx.cast(m, dt)?])
}

pub fn matmul(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (a, b) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![cx.add(Op::MatMul, vec![a, b])?])
}

/// ONNX Gemm: `alpha * op(A) @ op(B) + beta * C`, `op` = transpose when `transA`/`transB`.
/// Multiplications by 1 are skipped; `beta * C` folds when C is a constant.
pub fn gemm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (mut a, mut b) = (n.inp(0)?, n.inp(1)?);
    let alpha = n.f("alpha", 1.0)?;
    let beta = n.f("beta", 1.0)?;
    if cx.rank(a) != 2 || cx.rank(b) != 2 {
        return Err(format!(
            "A and B must be 2-D, got {} and {}",
            cx.shape(a),
            cx.shape(b)
        ));
    }
    // A float operand's Transpose is not folded here (see [`gemm_keeps_transpose`]).
    let transpose = |cx: &mut Ctx, x: NodeId| {
        let t = Op::Transpose { perm: vec![1, 0] };
        if is_strided_float(cx.dtype(x)) {
            cx.add_unfolded(t, vec![x])
        } else {
            cx.add(t, vec![x])
        }
    };
    if n.i("transA", 0)? != 0 {
        a = transpose(cx, a)?;
    }
    if n.i("transB", 0)? != 0 {
        b = transpose(cx, b)?;
    }
    let mut y = cx.add(Op::MatMul, vec![a, b])?;
    let dt = cx.dtype(y);
    if alpha != 1.0 {
        let k = cx.scalar(dt, alpha as f64);
        y = cx.binary(BinaryOp::Mul, y, k)?;
    }
    if let Some(mut c) = n.opt(2) {
        if beta != 1.0 {
            let k = cx.scalar(dt, beta as f64);
            c = cx.binary(BinaryOp::Mul, c, k)?;
        }
        if beta != 0.0 {
            y = cx.binary(BinaryOp::Add, y, c)?;
        }
    }
    Ok(vec![y])
}

/// The dtypes a CPU MatMul reads through strides (`rlx_cpu`'s `plan_mm_views`): the float
/// types but the narrow (8- and 4-bit) ones.
fn is_strided_float(dt: DType) -> bool {
    dt.is_float() && !dt.is_narrow_float()
}

/// Whether `node` is one of [`gemm`]'s operand Transposes that the importer leaves unfolded
/// even on a constant (a float `Transpose` from a `Gemm`): the compiler decides, keeping it
/// for the CPU (whose MatMul reads it in place: a weight `[N, K]` of `transB` is then
/// streamed one output's K weights at a time, one run per thread's share of N, where a
/// transposed copy was read in 1-4 KB pieces of K rows; bench/NOTES.md §42) and folding it
/// for the GPU backends. The symbolic import's re-folding (`sym::template`) asks this too,
/// so that its graphs stay node for node the per-signature import's.
pub(crate) fn gemm_keeps_transpose(node: &rlx_ir::Node) -> bool {
    matches!(node.op, Op::Transpose { .. })
        && is_strided_float(node.shape.dtype)
        && node
            .origin
            .as_ref()
            .is_some_and(|o| o.op_type.as_deref() == Some("Gemm"))
}

/// ONNX Clip → NaN-propagating `Min(Max(x, lo), hi)`. Bounds are inputs 1, 2 from opset
/// 11, attributes `min`/`max` before; an absent bound is skipped.
pub fn clip(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let (lo, hi) = if n.opset >= 11 {
        (n.opt(1), n.opt(2))
    } else {
        let lo = n.attr("min").map(|a| cx.scalar(dt, a.f as f64));
        let hi = n.attr("max").map(|a| cx.scalar(dt, a.f as f64));
        (lo, hi)
    };
    let mut y = x;
    if let Some(lo) = lo {
        y = cx.binary(BinaryOp::Max, y, lo)?;
    }
    if let Some(hi) = hi {
        y = cx.binary(BinaryOp::Min, y, hi)?;
    }
    Ok(vec![y])
}

/// ONNX CumSum; the axis input must be a constant.
pub fn cumsum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let ax = cx.const_i64s(n.inp(1)?, "axis")?;
    let [ax] = ax[..] else {
        return Err("axis must hold one value".into());
    };
    let axis = norm_axis(ax, cx.rank(x))?;
    let op = Op::CumSum {
        axis,
        exclusive: n.i("exclusive", 0)? != 0,
        reverse: n.i("reverse", 0)? != 0,
    };
    Ok(vec![cx.add(op, vec![x])?])
}
