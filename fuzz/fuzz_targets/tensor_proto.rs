//! Any bytes as an ONNX `TensorProto` `.pb` (what `rlx run --input x.pb` reads), a sequence
//! and an optional: an error or a tensor, never a panic or an allocation the size of a
//! bogus `dims` field.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rlx_onnx_import::read_tensor_proto(data);
    let _ = rlx_onnx_import::read_value_proto(data, false);
    let _ = rlx_onnx_import::read_value_proto(data, true);
});
