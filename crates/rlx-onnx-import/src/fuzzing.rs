//! The body of the `onnx_model` fuzz target (`fuzz/fuzz_targets/onnx_model.rs`), here so the
//! target and the regression test that replays its crashers
//! (`tests/fuzz_regressions.rs`) run the same code.

use std::collections::HashMap;

/// Any bytes as an ONNX model: decode, import (symbolic dims bound to 1), cut at the first
/// output's node and build the head, node and tail parts. Each step must return an error or
/// a value, never panic, hang or allocate what a bogus field asks for; the results are
/// dropped.
pub fn onnx_model(data: &[u8]) {
    let Ok(m) = crate::OnnxModel::from_bytes(data, "fuzz.onnx") else {
        return;
    };
    let _ = m.declared_inputs();
    let _ = m.parameter_inputs();
    let _ = m.import(&crate::ImportOptions::default());
    let names = m.output_names();
    if let Some(c) = names.first().and_then(|n| m.cut_at(n)) {
        let _ = c.head().map(|h| h.import(&crate::ImportOptions::default()));
        let types: HashMap<String, (rlx_ir::DType, usize)> = c
            .op_inputs()
            .iter()
            .chain(c.tail_inputs())
            .map(|n| (n.clone(), (rlx_ir::DType::F32, 1)))
            .collect();
        let _ = c.op_model(&types);
        let _ = c.tail_model(&types);
    }
}
