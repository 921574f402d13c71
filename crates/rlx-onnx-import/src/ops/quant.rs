//! Integer quantization lowered onto float arithmetic (ONNX spec and reference
//! implementation): QuantizeLinear / DequantizeLinear (per-tensor, per-axis, blocked;
//! int8 / uint8), DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger.
//!
//! Quantizing is `clamp(round_half_even(x / scale) + zero_point, qmin, qmax)`; integer
//! matrix products run in f64, where every int8 product sum the suite needs is exact.

use crate::ctx::{norm_axis, Ctx, ONode, R};
use crate::tensor::{dtype_of, onnx_type_name};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind, UnaryOp};

/// Integer range of a quantized type.
fn qrange(dt: DType) -> R<(f64, f64)> {
    match dt {
        DType::U8 => Ok((0.0, 255.0)),
        DType::I8 => Ok((-128.0, 127.0)),
        DType::U16 => Ok((0.0, 65535.0)),
        DType::I16 => Ok((-32768.0, 32767.0)),
        DType::U4 => Ok((0.0, 15.0)),
        DType::I4 => Ok((-8.0, 7.0)),
        DType::U2 => Ok((0.0, 3.0)),
        DType::I2 => Ok((-2.0, 1.0)),
        DType::I32 => Ok((i32::MIN as f64, i32::MAX as f64)),
        o => Err(format!(
            "quantized type {o} is not supported (8/16/4/2-bit integers, float8, float4)"
        )),
    }
}

/// Make a scale / zero point broadcastable to `xd` (reference `reshape_input`): scalars and
/// one-element tensors as they are, 1-D per-axis vectors reshaped onto `axis`, blocked ones
/// repeated `block` times along `axis` and cut to the input's size.
fn param_like(cx: &mut Ctx, p: NodeId, xd: &[usize], axis: i64, block: usize) -> R<NodeId> {
    let pd = cx.dims(p);
    let numel: usize = pd.iter().product();
    if pd.is_empty() || numel == 1 {
        return cx.reshape(p, vec![]);
    }
    let axis = norm_axis(axis, xd.len())?;
    if block == 0 {
        if pd.len() != 1 || pd[0] != xd[axis] {
            return Err(format!(
                "per-axis parameter {} does not match axis {axis} of {xd:?}",
                cx.shape(p)
            ));
        }
        let mut d = vec![1; xd.len()];
        d[axis] = pd[0];
        return cx.reshape(p, d);
    }
    // A block longer than the axis covers it all: cap it (same values after the cut).
    let block = block.min(xd[axis].max(1));
    if pd.len() != xd.len() || pd[axis].saturating_mul(block) < xd[axis] {
        return Err(format!(
            "blocked parameter {} does not fit input {xd:?} with block_size {block} on axis {axis}",
            cx.shape(p)
        ));
    }
    let mut ins = pd.clone();
    ins.insert(axis + 1, 1);
    let y = cx.reshape(p, ins.clone())?;
    ins[axis + 1] = block;
    let y = cx.add(Op::Broadcast { dims: ins }, vec![y])?;
    let mut full = pd.clone();
    full[axis] *= block;
    let y = cx.reshape(y, full.clone())?;
    if full[axis] == xd[axis] {
        return Ok(y);
    }
    let mut sizes = full;
    sizes[axis] = xd[axis];
    cx.add(
        Op::Slice {
            starts: vec![0; xd.len()],
            steps: vec![1; xd.len()],
            sizes,
        },
        vec![y],
    )
}

/// `clamp(round(v) + zp, range)` cast to `to`; `v` is float. Float8 targets ignore the zero
/// point and cast `v` (saturating per `saturate`); float4 adds it and casts (reference
/// `_CommonQuantizeLinear`).
fn quantize_values(
    cx: &mut Ctx,
    v: NodeId,
    zp: Option<NodeId>,
    to: DType,
    saturate: bool,
) -> R<NodeId> {
    if to.is_narrow_float() {
        let mut y = v;
        if let (DType::F4E2M1, Some(zp)) = (to, zp) {
            let z = cx.cast(zp, cx.dtype(v))?;
            y = cx.binary(BinaryOp::Add, y, z)?;
        }
        return cx.cast_sat(y, to, saturate);
    }
    let (lo, hi) = qrange(to)?;
    let dt = cx.dtype(v);
    let mut y = cx.unary(UnaryOp::Round, v)?;
    if let Some(zp) = zp {
        let z = cx.cast(zp, dt)?;
        y = cx.binary(BinaryOp::Add, y, z)?;
    }
    let lo = cx.scalar(dt, lo);
    let hi = cx.scalar(dt, hi);
    let y = cx.binary(BinaryOp::Max, y, lo)?;
    let y = cx.binary(BinaryOp::Min, y, hi)?;
    cx.cast(y, to)
}

/// The raw `axis` (normalized only where a per-axis parameter needs it) and `block_size`.
fn axis_block(n: &ONode) -> R<(i64, usize)> {
    let axis = n.i("axis", 1)?;
    let block = n.i("block_size", 0)?;
    if block < 0 {
        return Err(format!("block_size must be >= 0, got {block}"));
    }
    Ok((axis, block as usize))
}

/// ONNX QuantizeLinear (8/16/4/2-bit integer, float8 and float4 outputs; type from the
/// zero point, else `output_dtype`, else uint8; `saturate` for float8).
pub fn quantize_linear(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s) = (n.inp(0)?, n.inp(1)?);
    let zp = n.opt(2);
    let to = match (zp, n.attr("output_dtype")) {
        (Some(z), _) => cx.dtype(z),
        (None, Some(a)) if a.i != 0 => dtype_of(a.i as i32).ok_or_else(|| {
            format!(
                "output_dtype {} is not supported",
                onnx_type_name(a.i as i32)
            )
        })?,
        _ => DType::U8,
    };
    let xd = cx.dims(x);
    let (axis, block) = axis_block(n)?;
    let s = param_like(cx, s, &xd, axis, block)?;
    let zp = zp
        .map(|z| param_like(cx, z, &xd, axis, block))
        .transpose()?;
    let xf = if cx.dtype(x).is_float() {
        x
    } else {
        cx.cast(x, DType::F32)?
    };
    let s = cx.cast(s, cx.dtype(xf))?;
    let v = cx.binary(BinaryOp::Div, xf, s)?;
    let saturate = n.i("saturate", 1)? != 0;
    Ok(vec![quantize_values(cx, v, zp, to, saturate)?])
}

/// ONNX DequantizeLinear: `(x - zero_point) * scale` in f32, output of the scale's type
/// (or `output_dtype`).
pub fn dequantize_linear(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, s) = (n.inp(0)?, n.inp(1)?);
    let xd = cx.dims(x);
    let (axis, block) = axis_block(n)?;
    let out = match n.attr("output_dtype") {
        Some(a) if a.i != 0 => dtype_of(a.i as i32).ok_or_else(|| {
            format!(
                "output_dtype {} is not supported",
                onnx_type_name(a.i as i32)
            )
        })?,
        _ => cx.dtype(s),
    };
    // Float8 / float4 inputs ignore the zero point (reference `_CommonDequantizeLinear`).
    let zp = n.opt(2).filter(|_| !cx.dtype(x).is_narrow_float());
    let mut d = cx.cast(x, DType::F32)?;
    if let Some(z) = zp {
        let z = param_like(cx, z, &xd, axis, block)?;
        let z = cx.cast(z, DType::F32)?;
        d = cx.binary(BinaryOp::Sub, d, z)?;
    }
    let s = param_like(cx, s, &xd, axis, block)?;
    let s = cx.cast(s, DType::F32)?;
    let y = cx.binary(BinaryOp::Mul, d, s)?;
    Ok(vec![cx.cast(y, out)?])
}

/// ONNX DynamicQuantizeLinear (uint8): scale `(max(0, max x) - min(0, min x)) / 255`,
/// zero point `round(clamp(-min / scale, 0, 255))`; outputs `[y, y_scale, y_zero_point]`.
pub fn dynamic_quantize_linear(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let dt = cx.dtype(x);
    let x = cx.cast(x, DType::F32)?;
    let all: Vec<usize> = (0..cx.rank(x)).collect();
    let red = |kind| Op::Reduce {
        kind,
        axes: all.clone(),
        keepdims: false,
    };
    let zero = cx.scalar(DType::F32, 0.0);
    let mx = cx.add(red(ReduceKind::Max), vec![x])?;
    let mx = cx.binary(BinaryOp::Max, mx, zero)?;
    let mn = cx.add(red(ReduceKind::Min), vec![x])?;
    let mn = cx.binary(BinaryOp::Min, mn, zero)?;
    let range = cx.binary(BinaryOp::Sub, mx, mn)?;
    let same = cx.binary(BinaryOp::Eq, mx, mn)?;
    let one = cx.scalar(DType::F32, 1.0);
    let range = cx.add(Op::Select, vec![same, one, range])?;
    let q = cx.scalar(DType::F32, 255.0);
    let scale = cx.binary(BinaryOp::Div, range, q)?;
    // max - min overflows f32 when the data spans more than FLT_MAX (FLT_MAX and -FLT_MAX);
    // the scale itself is finite: there, max/255 - min/255 (issue 28). Elsewhere the f32
    // `(max - min) / 255` of the operator text, bit for bit.
    let split = {
        let a = cx.binary(BinaryOp::Div, mx, q)?;
        let b = cx.binary(BinaryOp::Div, mn, q)?;
        cx.binary(BinaryOp::Sub, a, b)?
    };
    let inf = cx.scalar(DType::F32, f64::INFINITY);
    let fits = cx.binary(BinaryOp::Lt, range, inf)?;
    let scale = cx.add(Op::Select, vec![fits, scale, split])?;
    let zf = cx.binary(BinaryOp::Div, mn, scale)?;
    let zf = cx.binary(BinaryOp::Sub, zero, zf)?;
    let zf = cx.binary(BinaryOp::Max, zf, zero)?;
    let zf = cx.binary(BinaryOp::Min, zf, q)?;
    let zr = cx.unary(UnaryOp::Round, zf)?;
    let v = cx.binary(BinaryOp::Div, x, scale)?;
    let y = quantize_values(cx, v, Some(zr), DType::U8, true)?;
    let zp = cx.cast(zr, DType::U8)?;
    Ok(vec![y, cx.cast(scale, dt)?, zp])
}

/// `x - zero_point` in f64; a 1-D zero point applies along `axis` of `x` (`None`: the
/// last axis, NumPy broadcasting).
fn centered(cx: &mut Ctx, x: NodeId, zp: Option<NodeId>, axis: Option<usize>) -> R<NodeId> {
    let xf = cx.cast(x, DType::F64)?;
    let Some(z) = zp else { return Ok(xf) };
    let mut z = cx.cast(z, DType::F64)?;
    let zd = cx.dims(z);
    if let (Some(a), 1) = (axis, zd.len()) {
        if zd[0] > 1 {
            let r = cx.rank(x);
            let mut d = vec![1; r - a];
            d[0] = zd[0];
            z = cx.reshape(z, d)?;
        }
    }
    cx.binary(BinaryOp::Sub, xf, z)
}

/// ONNX MatMulInteger: `(A - a_zero_point) @ (B - b_zero_point)` as int32; a 1-D
/// `a_zero_point` is per row of A, a 1-D `b_zero_point` per column of B.
pub fn matmul_integer(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (a, b) = (n.inp(0)?, n.inp(1)?);
    let ra = cx.rank(a);
    let a = centered(cx, a, n.opt(2), Some(ra.saturating_sub(2)))?;
    let b = centered(cx, b, n.opt(3), None)?;
    let y = cx.add(Op::MatMul, vec![a, b])?;
    Ok(vec![cx.cast(y, DType::I32)?])
}

/// ONNX QLinearMatMul: `quantize((A - azp) @ (B - bzp) * (a_scale * b_scale / y_scale), yzp)`.
pub fn qlinear_matmul(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let ins = (0..8).map(|i| n.opt(i)).collect::<Vec<_>>();
    let (a, a_s, b, b_s, y_s) = (n.inp(0)?, n.inp(1)?, n.inp(3)?, n.inp(4)?, n.inp(6)?);
    let ra = cx.rank(a);
    let ac = centered(cx, a, ins[2], Some(ra.saturating_sub(2)))?;
    let bc = centered(cx, b, ins[5], None)?;
    let c = cx.add(Op::MatMul, vec![ac, bc])?;
    // The multiplier in the scales' own type, as the reference computes it.
    let sdt = cx.dtype(a_s);
    let b_s = cx.cast(b_s, sdt)?;
    let y_s = cx.cast(y_s, sdt)?;
    let m = cx.binary(BinaryOp::Mul, a_s, b_s)?;
    let m = cx.binary(BinaryOp::Div, m, y_s)?;
    let m = cx.cast(m, DType::F64)?;
    let m = wide_when_lost(cx, m, [a_s, b_s, y_s])?;
    let v = cx.binary(BinaryOp::Mul, c, m)?;
    let to = match ins[7] {
        Some(z) => cx.dtype(z),
        None => cx.dtype(a),
    };
    Ok(vec![quantize_values(cx, v, ins[7], to, true)?])
}

/// `native` (the multiplier `s1 * s2 / s3` computed in the scales' own type, cast to f64, as
/// the reference computes it) where it is finite and nonzero, else the same multiplier
/// computed in f64: when `s1 * s2` overflows (1e20 * 1e20 in f32) or underflows, the exact
/// multiplier is still representable, and `inf` would saturate every output (issue 28).
fn wide_when_lost(cx: &mut Ctx, native: NodeId, s: [NodeId; 3]) -> R<NodeId> {
    let [a, b, y] = s.map(|v| cx.cast(v, DType::F64));
    let w = cx.binary(BinaryOp::Mul, a?, b?)?;
    let w = cx.binary(BinaryOp::Div, w, y?)?;
    let abs = cx.unary(UnaryOp::Abs, native)?;
    let inf = cx.scalar(DType::F64, f64::INFINITY);
    let zero = cx.scalar(DType::F64, 0.0);
    let finite = cx.binary(BinaryOp::Lt, abs, inf)?;
    let nonzero = cx.binary(BinaryOp::Gt, abs, zero)?;
    let keep = cx.binary(BinaryOp::And, finite, nonzero)?;
    cx.add(Op::Select, vec![keep, native, w])
}

/// ONNX ConvInteger: Conv of `x - x_zero_point` and `w - w_zero_point` (per output channel
/// when 1-D), int32 output.
pub fn conv_integer(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, w) = (n.inp(0)?, n.inp(1)?);
    let xc = centered(cx, x, n.opt(2), Some(1))?;
    let wc = centered(cx, w, n.opt(3), Some(0))?;
    let y = super::nn::conv_on(cx, n, xc, wc, None)?;
    Ok(vec![cx.cast(y, DType::I32)?])
}

/// ONNX QLinearConv: Conv of the centered integers (plus the int32 bias), scaled by
/// `x_scale * w_scale / y_scale` (`w_scale` per output channel when 1-D), quantized to
/// `y_zero_point`'s type.
pub fn qlinear_conv(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, x_s, w, w_s, y_s) = (n.inp(0)?, n.inp(1)?, n.inp(3)?, n.inp(4)?, n.inp(6)?);
    let xc = centered(cx, x, n.opt(2), Some(1))?;
    let wc = centered(cx, w, n.opt(5), Some(0))?;
    let bias = n.opt(8).map(|b| cx.cast(b, DType::F64)).transpose()?;
    let c = super::nn::conv_on(cx, n, xc, wc, bias)?;
    let r = cx.rank(c);
    let mut ws = cx.cast(w_s, DType::F64)?;
    let wd = cx.dims(ws);
    if wd.iter().product::<usize>() > 1 {
        let mut d = vec![1; r];
        d[1] = wd.iter().product();
        ws = cx.reshape(ws, d)?;
    }
    let xs = cx.cast(x_s, DType::F64)?;
    let ys = cx.cast(y_s, DType::F64)?;
    let m = cx.binary(BinaryOp::Mul, xs, ws)?;
    let m = cx.binary(BinaryOp::Div, m, ys)?;
    let v = cx.binary(BinaryOp::Mul, c, m)?;
    let zp = n.opt(7);
    let to = match zp {
        Some(z) => cx.dtype(z),
        None => cx.dtype(x),
    };
    Ok(vec![quantize_values(cx, v, zp, to, true)?])
}
