//! TensorProto decoding of the 16/32/64-bit integer types and the packed / narrow types
//! (onnx.proto `TensorProto`: 4-bit types two per byte, 2-bit four per byte, low bits first;
//! int16/uint16 and narrow codes in `int32_data`; uint32/uint64 in `uint64_data`).

use rlx_ir::{DType, Tensor, TensorData};
use rlx_onnx_import::proto::{data_type as dt, TensorProto};
use rlx_onnx_import::tensor::{tensor_from_proto, tensor_to_proto};

fn proto(data_type: i32, dims: &[i64]) -> TensorProto {
    TensorProto {
        data_type,
        dims: dims.to_vec(),
        name: "w".into(),
        ..Default::default()
    }
}

#[test]
fn packed_int4_raw_and_typed() {
    // [7, -8, 1] as int4: 0x87 (7 low, 8 high), then 0x01.
    let mut p = proto(dt::INT4, &[3]);
    p.raw_data = vec![0x87, 0x01];
    let t = tensor_from_proto(&p, None).unwrap();
    assert_eq!(t.dtype(), DType::I4);
    assert_eq!(t.data().to_i64_vec(), vec![7, -8, 1]);
    let mut q = proto(dt::INT4, &[3]);
    q.int32_data = vec![0x87, 0x01];
    assert_eq!(tensor_from_proto(&q, None).unwrap(), t);
    // Round trip through raw_data.
    assert_eq!(
        tensor_from_proto(&tensor_to_proto("w", &t), None).unwrap(),
        t
    );
}

#[test]
fn packed_2bit_and_float4() {
    // uint2 [1, 2, 3, 0, 3]: 0b00_11_10_01 = 0x39, then 0x03.
    let mut p = proto(dt::UINT2, &[5]);
    p.raw_data = vec![0x39, 0x03];
    let t = tensor_from_proto(&p, None).unwrap();
    assert_eq!(t.data().to_i64_vec(), vec![1, 2, 3, 0, 3]);
    // float4 e2m1 [6, -0.5]: codes 0x7, 0x9 → 0x97.
    let mut f = proto(dt::FLOAT4E2M1, &[2]);
    f.raw_data = vec![0x97];
    let t = tensor_from_proto(&f, None).unwrap();
    assert_eq!(t.data().to_f64_vec(), vec![6.0, -0.5]);
}

#[test]
fn wrong_packed_byte_count_is_an_error() {
    let mut p = proto(dt::UINT4, &[3]);
    p.raw_data = vec![0x12, 0x34, 0x56];
    let e = tensor_from_proto(&p, None).unwrap_err();
    assert!(
        e.contains("raw_data has 3 bytes") && e.contains("need 2"),
        "{e}"
    );
    let mut q = proto(dt::INT4, &[4]);
    q.int32_data = vec![1];
    let e = tensor_from_proto(&q, None).unwrap_err();
    assert!(e.contains("need 2"), "{e}");
}

#[test]
fn float8_one_code_per_byte() {
    let mut p = proto(dt::FLOAT8E4M3FN, &[2]);
    p.raw_data = vec![0x1d, 0x7f];
    let t = tensor_from_proto(&p, None).unwrap();
    let v = t.data().to_f64_vec();
    assert_eq!(v[0], 0.1015625);
    assert!(v[1].is_nan());
}

#[test]
fn wide_unsigned_and_int16() {
    let mut p = proto(dt::UINT64, &[2]);
    p.uint64_data = vec![u64::MAX, 1];
    let t = tensor_from_proto(&p, None).unwrap();
    assert_eq!(t.data(), &TensorData::U64(vec![u64::MAX, 1]));
    assert_eq!(
        tensor_from_proto(&tensor_to_proto("w", &t), None).unwrap(),
        t
    );
    let mut p = proto(dt::UINT32, &[1]);
    p.uint64_data = vec![4_000_000_000];
    assert_eq!(
        tensor_from_proto(&p, None).unwrap().data(),
        &TensorData::U32(vec![4_000_000_000])
    );
    let mut p = proto(dt::INT16, &[2]);
    p.int32_data = vec![-300, 32767];
    assert_eq!(
        tensor_from_proto(&p, None).unwrap().data(),
        &TensorData::I16(vec![-300, 32767])
    );
    let mut p = proto(dt::UINT16, &[1]);
    p.raw_data = 65535u16.to_le_bytes().to_vec();
    let t = tensor_from_proto(&p, None).unwrap();
    assert_eq!(t.data(), &TensorData::U16(vec![65535]));
    let _ = Tensor::new(vec![1], TensorData::U16(vec![1])).unwrap();
}
