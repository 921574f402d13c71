//! Real models: onnx's model-zoo "light" models against their shipped outputs, transformer
//! exports against onnxruntime (expected files written by scripts/gen_transformers.py).

mod common;
use common::*;
use rlx_cli::npy::read_npy;
use rlx_ir::numeric_check::DebugMode;
use rlx_onnx_import::{import_onnx, ImportOptions};

const LIGHT: [&str; 9] = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
];

fn light(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/large/light/{name}")) else {
        return;
    };
    let g = import_onnx(&dir.join("model.onnx"), &ImportOptions::default()).unwrap();
    assert!(
        rlx_compile::numeric_lint(&g).is_empty(),
        "{name}: lint must stay quiet on model-zoo models"
    );
    let mut s = compile(&dir, DebugMode::Off);
    let input = read_npy(&dir.join("input_0.npy")).unwrap();
    let iname = s.inputs()[0].0.clone();
    let outs = run(&mut s, &[(iname, input)]);
    let want = read_npy(&dir.join("output_0.npy")).unwrap();
    // onnx's backend test runner compares model outputs at rtol 1e-3, atol 1e-7.
    assert_close(name, &outs[0], &want, 1e-3, 1e-7);
}

#[test]
fn light_bvlc_alexnet() {
    light(LIGHT[0]);
}
#[test]
fn light_densenet121() {
    light(LIGHT[1]);
}
#[test]
fn light_inception_v1() {
    light(LIGHT[2]);
}
#[test]
fn light_inception_v2() {
    light(LIGHT[3]);
}
#[test]
fn light_resnet50() {
    light(LIGHT[4]);
}
#[test]
fn light_shufflenet() {
    light(LIGHT[5]);
}
#[test]
fn light_squeezenet() {
    light(LIGHT[6]);
}
#[test]
fn light_vgg19() {
    light(LIGHT[7]);
}
#[test]
fn light_zfnet512() {
    light(LIGHT[8]);
}

/// A zoo-style CNN with random weights whose outputs vary by sample and class
/// (scripts/gen_small_cnn.py: Conv, grouped Conv, 1x1 Conv, BatchNormalization, Relu, padded
/// MaxPool feeding a conv, padded AveragePool without the pad in its count, a residual Add,
/// GlobalAveragePool, Gemm), against onnxruntime's output and against a float64 NumPy
/// evaluation of each op's ONNX definition, at rtol 1e-4 / atol 1e-5 (float32 arithmetic
/// over a few hundred terms per output; onnxruntime is within 5e-6 of float64). In a scratch
/// copy of the generator, MaxPool padding with 0 instead of -inf moves an output by 81 times
/// that tolerance, counting AveragePool's pad 1900 times, a flipped conv kernel 7700 times.
#[test]
fn small_cnn_matches_onnxruntime_and_float64() {
    let Some(dir) = fixture("fixtures/large/small_cnn") else {
        return;
    };
    let g = import_onnx(&dir.join("model.onnx"), &ImportOptions::default()).unwrap();
    assert!(
        rlx_compile::numeric_lint(&g).is_empty(),
        "lint must stay quiet"
    );
    let mut s = compile(&dir, DebugMode::Warn);
    let f = feeds(&s, &dir, "input_");
    let outs = run(&mut s, &f);
    let ort = read_npy(&dir.join("expected_y.npy")).unwrap();
    let f64_ref = read_npy(&dir.join("reference_y.npy")).unwrap();
    // The outputs are not constant: the test can tell a right answer from a wrong one.
    let v = f64_ref.data().to_f64_vec();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    assert!(sd > 1.0, "reference outputs nearly constant (sd {sd})");
    assert_close("small_cnn vs onnxruntime", &outs[0], &ort, 1e-4, 1e-5);
    assert_eq!(outs[0].dims(), f64_ref.dims());
    let got = outs[0].data().to_f64_vec();
    for (i, (a, b)) in got.iter().zip(&v).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
            "small_cnn element {i}: {a} vs float64 {b}"
        );
    }
    assert!(s.nan_reports().is_empty(), "{:#?}", s.nan_reports());
}

/// Run a transformer fixture and compare every output with onnxruntime's at rtol 1e-4 / atol 1e-5.
fn transformer(rel: &str, mode: DebugMode) {
    let Some(dir) = fixture(rel) else { return };
    let mut s = compile(&dir, mode);
    let f = feeds(&s, &dir, "input_");
    let outs = run(&mut s, &f);
    for ((oname, _), got) in s.outputs().iter().zip(&outs) {
        let want = read_npy(&dir.join(format!("expected_{oname}.npy"))).unwrap();
        assert_close(&format!("{rel}/{oname}"), got, &want, 1e-4, 1e-5);
        eprintln!(
            "{rel}/{oname}: max |rlx - onnxruntime| = {:.3e}",
            max_abs_diff(got, &want)
        );
    }
    assert!(s.nan_reports().is_empty(), "{rel}: {:#?}", s.nan_reports());
}

#[test]
fn bert_tiny_matches_onnxruntime() {
    transformer("fixtures/transformers/bert_tiny", DebugMode::Off);
}

#[test]
fn qwen3_tiny_matches_onnxruntime() {
    transformer("fixtures/transformers/qwen3_tiny", DebugMode::Off);
}

#[test]
fn t5_tiny_runs_silently_under_abort() {
    // T5's relative-position bucketing takes log(0) = -inf and discards it with a Where.
    transformer("fixtures/transformers/t5_tiny", DebugMode::Abort);
    transformer("fixtures/transformers/t5_tiny", DebugMode::Off);
}

/// MiniLM-L6 with its real weights against onnxruntime. Needs torch, transformers and the
/// downloaded weights, which CI's venv does not have, so it is ignored by default. Run it with
/// `scripts/setup-venv.sh --torch && .venv/bin/python scripts/gen_transformers.py minilm &&
/// cargo test -p rlx-cli --test models -- --ignored minilm` (fails when the fixture is missing).
#[test]
#[ignore = "needs torch: scripts/setup-venv.sh --torch; scripts/gen_transformers.py minilm"]
fn minilm_l6_real_weights_match_onnxruntime() {
    let dir = repo().join("fixtures/large/minilm_l6");
    assert!(
        dir.exists(),
        "{} missing: run scripts/gen_transformers.py minilm",
        dir.display()
    );
    transformer("fixtures/large/minilm_l6", DebugMode::Off);
}

/// torchvision's ResNet-18 (random weights) against onnxruntime. Needs torch and torchvision,
/// which CI's venv does not have, so it is ignored by default. Run it with
/// `scripts/setup-venv.sh --torch && .venv/bin/python scripts/gen_transformers.py resnet18 &&
/// cargo test -p rlx-cli --test models -- --ignored resnet18` (fails when the fixture is missing).
#[test]
#[ignore = "needs torch: scripts/setup-venv.sh --torch; scripts/gen_transformers.py resnet18"]
fn resnet18_matches_onnxruntime() {
    let dir = repo().join("fixtures/large/resnet18");
    assert!(
        dir.exists(),
        "{} missing: run scripts/gen_transformers.py resnet18",
        dir.display()
    );
    transformer("fixtures/large/resnet18", DebugMode::Off);
}
