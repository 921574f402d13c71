//! The body of the `onnx_model` fuzz target (`fuzz/fuzz_targets/onnx_model.rs`), here so the
//! target and the regression test that replays its crashers
//! (`tests/fuzz_regressions.rs`) run the same code.

use std::collections::HashMap;

/// Any bytes as an ONNX model: decode, import (symbolic dims bound to 1), import with
/// symbolic dims and specialize (see [`crate::sym`]), cut at the first
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
    // The symbolic import (symbols probed at 2), specialized at the probe and at 3.
    let at = |n: usize| crate::ImportOptions {
        default_dim: n,
        ..Default::default()
    };
    if let Ok(t) = m.import_symbolic(&at(2)) {
        for n in [2, 3] {
            let shapes: HashMap<String, Vec<usize>> = t
                .inputs
                .iter()
                .map(|(name, d)| {
                    let d = d
                        .iter()
                        .map(|e| match e.as_const() {
                            Some(c) => c.max(0) as usize,
                            None => n,
                        })
                        .collect();
                    (name.clone(), d)
                })
                .collect();
            let _ = t.specialize(&shapes);
        }
    }
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
