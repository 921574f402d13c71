//! Any bytes as an ONNX model: decode, import (symbolic dims bound to 1), cut at its first
//! top-level node (the run-time segments of `rlx_onnx_import::cut`) and build every part;
//! each must return an error or a value, never panic, hang or allocate what a bogus field
//! asks for.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = rlx_onnx_import::OnnxModel::from_bytes(data, "fuzz.onnx") else {
        return;
    };
    let _ = m.declared_inputs();
    let _ = m.parameter_inputs();
    let _ = m.import(&rlx_onnx_import::ImportOptions::default());
    let names = m.output_names();
    if let Some(c) = names.first().and_then(|n| m.cut_at(n)) {
        let _ = c.head().map(|h| h.import(&rlx_onnx_import::ImportOptions::default()));
        let types: HashMap<String, (rlx_ir::DType, usize)> = c
            .op_inputs()
            .iter()
            .chain(c.tail_inputs())
            .map(|n| (n.clone(), (rlx_ir::DType::F32, 1)))
            .collect();
        let _ = c.op_model(&types);
        let _ = c.tail_model(&types);
    }
});
