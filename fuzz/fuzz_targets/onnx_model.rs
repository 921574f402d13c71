//! Any bytes as an ONNX model: decode, import (symbolic dims bound to 1), cut at its first
//! top-level node (the run-time segments of `rlx_onnx_import::cut`) and build every part;
//! each must return an error or a value, never panic, hang or allocate what a bogus field
//! asks for. The body is `rlx_onnx_import::fuzzing::onnx_model`, which the regression test
//! replays too.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rlx_onnx_import::fuzzing::onnx_model(data));
