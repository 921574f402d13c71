//! Kernels on the 16/32/64-bit unsigned and 16-bit signed integers and on the storage-only
//! narrow types. Expected values from the ONNX operator definitions and NumPy semantics.

use rlx_cpu::eval_op;
use rlx_ir::*;

fn ev(op: Op, ins: &[&Tensor], d: &[usize], dt: DType) -> Result<Tensor, rlx_cpu::KernelError> {
    eval_op(&op, ins, &Shape::new(d, dt))
}
fn t(d: &[usize], data: TensorData) -> Tensor {
    Tensor::new(d.to_vec(), data).unwrap()
}

#[test]
fn u64_arithmetic_and_compare_are_unsigned() {
    let big = u64::MAX - 1;
    let a = t(&[3], TensorData::U64(vec![big, 10, 7]));
    let b = t(&[3], TensorData::U64(vec![3, big, 0]));
    let gt = ev(Op::Binary(BinaryOp::Gt), &[&a, &b], &[3], DType::Bool).unwrap();
    assert_eq!(gt.data(), &TensorData::Bool(vec![true, false, true]));
    let div = ev(Op::Binary(BinaryOp::Div), &[&a, &b], &[3], DType::U64).unwrap();
    assert_eq!(div.data(), &TensorData::U64(vec![big / 3, 0, 0]));
    let shr = ev(
        Op::Binary(BinaryOp::ShiftRight),
        &[&a, &b],
        &[3],
        DType::U64,
    )
    .unwrap();
    assert_eq!(shr.data(), &TensorData::U64(vec![big >> 3, 0, 7]));
    let mx = ev(Op::Binary(BinaryOp::Max), &[&a, &b], &[3], DType::U64).unwrap();
    assert_eq!(mx.data(), &TensorData::U64(vec![big, big, 7]));
}

#[test]
fn small_ints_wrap_and_compare() {
    let a = t(&[2], TensorData::U16(vec![65535, 3]));
    let b = t(&[2], TensorData::U16(vec![1, 5]));
    let s = ev(Op::Binary(BinaryOp::Add), &[&a, &b], &[2], DType::U16).unwrap();
    assert_eq!(s.data(), &TensorData::U16(vec![0, 8]));
    let d = ev(Op::Binary(BinaryOp::Sub), &[&b, &a], &[2], DType::U16).unwrap();
    assert_eq!(d.data(), &TensorData::U16(vec![2, 2]));
    // ONNX Mod (fmod=0) on int16 takes the divisor's sign: -4 mod 3 = 2, 4 mod -3 = -2.
    let x = t(&[2], TensorData::I16(vec![-4, 4]));
    let y = t(&[2], TensorData::I16(vec![3, -3]));
    let m = ev(Op::Binary(BinaryOp::Mod), &[&x, &y], &[2], DType::I16).unwrap();
    assert_eq!(m.data(), &TensorData::I16(vec![2, -2]));
}

#[test]
fn cast_saturate_attribute_reaches_the_kernel() {
    let x = Tensor::from_f32(&[2], vec![1e6, -0.0]).unwrap();
    let on = Op::Cast {
        to: DType::F8E5M2,
        saturate: true,
    };
    let off = Op::Cast {
        to: DType::F8E5M2,
        saturate: false,
    };
    let a = ev(on, &[&x], &[2], DType::F8E5M2).unwrap();
    let b = ev(off, &[&x], &[2], DType::F8E5M2).unwrap();
    // E5M2: max 57344 is 0x7b, +inf 0x7c, -0 0x80.
    assert_eq!(
        a.data(),
        &TensorData::narrow(DType::F8E5M2, vec![0x7b, 0x80])
    );
    assert_eq!(
        b.data(),
        &TensorData::narrow(DType::F8E5M2, vec![0x7c, 0x80])
    );
}

#[test]
fn narrow_data_moves_but_math_is_refused() {
    let x = t(&[2, 2], TensorData::narrow(DType::I4, vec![1, 2, 3, 0xf]));
    let tr = ev(
        Op::Transpose { perm: vec![1, 0] },
        &[&x],
        &[2, 2],
        DType::I4,
    )
    .unwrap();
    assert_eq!(tr.data().to_i64_vec(), vec![1, 3, 2, -1]);
    let e = ev(Op::Binary(BinaryOp::Add), &[&x, &x], &[2, 2], DType::I4).unwrap_err();
    assert!(e.to_string().contains("storage-only"), "{e}");
}

#[test]
fn scanner_sees_float8_nan_and_inf() {
    use rlx_ir::numeric_check::scan_data;
    // E4M3FN: 0x7f NaN; E5M2: 0x7c +inf, 0xfc -inf; FNUZ: 0x80 NaN.
    let c = scan_data(&TensorData::narrow(DType::F8E4M3FN, vec![0x7f, 0x7e, 0xff]));
    assert_eq!((c.nan, c.pos_inf), (2, 0));
    let c = scan_data(&TensorData::narrow(
        DType::F8E5M2,
        vec![0x7c, 0xfc, 0x7e, 0x01],
    ));
    assert_eq!((c.nan, c.pos_inf, c.neg_inf), (1, 1, 1));
    let c = scan_data(&TensorData::narrow(DType::F8E4M3FNUZ, vec![0x80, 0x00]));
    assert_eq!(c.nan, 1);
    let c = scan_data(&TensorData::narrow(DType::I4, vec![0x8, 0xf]));
    assert_eq!(c.nan + c.pos_inf + c.neg_inf, 0);
}
