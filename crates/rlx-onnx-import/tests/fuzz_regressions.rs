//! Inputs that crashed the fuzz targets (`fuzz/fuzz_targets/{onnx_model,tensor_proto}.rs`),
//! minimized and kept in `fuzz/regressions/<target>/`: each goes through the target's code
//! again and must give an error or a value, never a panic.

use std::path::PathBuf;

fn cases(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut v = vec![];
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            v.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            ));
        }
    }
    v.sort();
    v
}

#[test]
fn onnx_model_crashers_are_errors() {
    let cases = cases("onnx_model");
    assert!(
        !cases.is_empty(),
        "fuzz/regressions/onnx_model holds the minimized crashers"
    );
    for (name, data) in cases {
        let r = std::panic::catch_unwind(|| rlx_onnx_import::fuzzing::onnx_model(&data));
        assert!(r.is_ok(), "fuzz/regressions/onnx_model/{name} panics");
    }
}

#[test]
fn tensor_proto_crashers_are_errors() {
    for (name, data) in cases("tensor_proto") {
        let r = std::panic::catch_unwind(|| {
            let _ = rlx_onnx_import::read_tensor_proto(&data);
            let _ = rlx_onnx_import::read_value_proto(&data, false);
            let _ = rlx_onnx_import::read_value_proto(&data, true);
        });
        assert!(r.is_ok(), "fuzz/regressions/tensor_proto/{name} panics");
    }
}
