//! `rlx diverge` end to end: the correct kernels report round-off on every foundation model,
//! and each deliberately wrong kernel (`RLX_TEST_PLANTED_BUG`, test-only) is flagged suspect
//! and localized to the first node that runs it.
//!
//! Needs a wgpu adapter (lavapipe in CI). Without one the GPU tests skip, unless
//! `RLX_REQUIRE_GPU=1` (CI), where they fail.

mod common;
use common::{fixture, gpu, repo, TmpDir};
use rlx_runtime::{available_devices, Device};
use std::process::Command;

fn diverge(args: &[&str], bug: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx"));
    c.arg("diverge").arg("-q").args(args).current_dir(repo());
    c.env_remove("RLX_DEBUG_NANS")
        .env_remove("RLX_TEST_PLANTED_BUG");
    if let Some(b) = bug {
        c.env("RLX_TEST_PLANTED_BUG", b);
    }
    let o = c.output().expect("run rlx");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn correct_kernels_are_round_off_on_every_foundation_model() {
    if !gpu() {
        return;
    }
    let mut models: Vec<String> = vec![];
    for e in std::fs::read_dir(repo().join("examples")).unwrap() {
        let p = e.unwrap().path();
        if p.join("model.onnx").is_file() {
            models.push(format!(
                "examples/{}",
                p.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    for m in ["bert_tiny", "qwen3_tiny", "t5_tiny"] {
        models.push(format!("fixtures/transformers/{m}"));
    }
    if let Some(light) = fixture("fixtures/large/light") {
        for e in std::fs::read_dir(light).unwrap() {
            let p = e.unwrap().path();
            models.push(p.display().to_string());
        }
    }
    assert!(models.len() >= 10, "{models:?}");
    for m in &models {
        let (code, out, err) = diverge(&[m], None);
        assert_eq!(code, 0, "{m}: {out}{err}");
        assert!(out.contains("wgpu vs cpu ("), "{m}: {out}");
        assert!(out.contains(" nodes on wgpu): max_abs="), "{m}: {out}");
        assert!(out.contains("round-off (explainable"), "{m}: {out}");
        assert!(!out.contains("SUSPECT"), "{m}: {out}");
    }
}

#[test]
fn planted_matmul_bug_is_suspect_and_localized_to_the_first_matmul() {
    if !gpu() {
        return;
    }
    // The planted bug drops the last 16-wide k-tile of every MatMul with K > 16. In BERT the
    // first such MatMul is layer 0's query projection (K = hidden = 64); everything before it
    // (embeddings, LayerNorm) runs correct kernels.
    let (code, out, err) = diverge(
        &["fixtures/transformers/bert_tiny"],
        Some("matmul_drop_last_k"),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("SUSPECT"), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("first divergence at"))
        .unwrap_or_else(|| panic!("no localization: {out}"));
    assert!(line.contains(" MatMul \""), "{line}");
    assert!(line.contains("/encoder/layer.0/attention/self/"), "{line}");
    assert!(line.contains("kernel bug candidate"), "{line}");
    assert!(line.contains("inputs agree to"), "{line}");
}

/// The CUDA backend's planted bug (`cuda_matmul_drop_last_k`: cuBLAS is called with K - 1)
/// is flagged and localized like wgpu's. Needs CUDA: skips without it, fails instead with
/// `RLX_REQUIRE_CUDA=1`.
#[test]
fn planted_cuda_matmul_bug_is_suspect_and_localized_to_the_first_matmul() {
    if !available_devices().contains(&Device::Cuda) {
        assert!(
            !rlx_ir::env::is_on("RLX_REQUIRE_CUDA"),
            "RLX_REQUIRE_CUDA=1 but CUDA is not available: {:?}",
            rlx_runtime::backend::probe(Device::Cuda)
        );
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipping: no CUDA device");
        return;
    }
    let (code, out, err) = diverge(
        &["fixtures/transformers/bert_tiny", "--backends", "cuda"],
        Some("cuda_matmul_drop_last_k"),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("cuda vs cpu ("), "{out}");
    assert!(out.contains("SUSPECT"), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("first divergence at"))
        .unwrap_or_else(|| panic!("no localization: {out}"));
    assert!(line.contains(" MatMul \""), "{line}");
    assert!(line.contains("/encoder/layer.0/attention/self/"), "{line}");
    assert!(line.contains("kernel bug candidate"), "{line}");
    // Without the bug, CUDA is round-off on the same model.
    let (code, out, err) = diverge(
        &["fixtures/transformers/bert_tiny", "--backends", "cuda"],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("round-off (explainable"), "{out}");
}

#[test]
fn planted_reduce_bug_is_localized_to_the_first_layernorm_mean() {
    if !gpu() {
        return;
    }
    // ReduceSum/ReduceMean skipping an element: the first reduction in BERT is the mean of
    // the embeddings' LayerNormalization (decomposed; reported as a step of it).
    let dir = tempdir();
    let json = dir.join("r.json");
    let (code, out, err) = diverge(
        &[
            "fixtures/transformers/bert_tiny",
            "--json",
            json.to_str().unwrap(),
        ],
        Some("reduce_sum_skip_last"),
    );
    assert_eq!(code, 1, "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.contains("first divergence at"))
        .unwrap_or_else(|| panic!("no localization: {out}"));
    assert!(line.contains("/embeddings/LayerNorm"), "{line}");
    assert!(line.contains("(a step of LayerNormalization)"), "{line}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["oracle"], "cpu");
    assert_eq!(v["suspect"], true);
    let b = &v["backends"][0];
    assert_eq!(b["device"], "wgpu");
    assert_eq!(b["suspect"], true);
    assert!(b["max_rel"].as_f64().unwrap() > 2e-3);
    assert_eq!(b["localization"]["kind"], "kernel_bug_candidate");
    assert!(b["localization"]["op"]
        .as_str()
        .unwrap()
        .starts_with("Reduce"));
}

#[test]
fn json_to_stdout_and_round_off_verdict() {
    if !gpu() {
        return;
    }
    let (code, out, err) = diverge(&["examples/healthy_mlp", "--json", "-"], None);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stdout is the JSON report");
    assert_eq!(v["suspect"], false);
    assert_eq!(v["backends"][0]["device"], "wgpu");
    assert!(err.contains("round-off (explainable)"), "{err}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (code, _, err) = diverge(&["examples/healthy_mlp", "--backends", "tpu"], None);
    assert_eq!(code, 2);
    assert!(err.contains("unknown backend \"tpu\""), "{err}");
    let (code, _, err) = diverge(&["examples/healthy_mlp", "--tol-rel=-1"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--tol-rel"), "{err}");
    let (code, _, err) = diverge(&["no/such/model.onnx"], None);
    assert_eq!(code, 2);
    assert!(err.contains("no/such/model.onnx"), "{err}");
    let (code, _, err) = diverge(&["examples/healthy_mlp", "--backends", "cpu"], None);
    assert_eq!(code, 2);
    assert!(err.contains("the CPU is the oracle"), "{err}");
    let (code, _, err) = diverge(
        &["examples/healthy_mlp", "--json", "/nonexistent/d/r.json"],
        None,
    );
    assert_eq!(code, 2);
    // Checked before any work, naming the flag and the missing directory.
    assert!(
        err.contains("--json /nonexistent/d/r.json") && err.contains("/nonexistent/d"),
        "{err}"
    );
    let (code, _, err) = diverge(&["examples/healthy_mlp", "--backends", "cuda"], None);
    assert_eq!(code, 2);
    assert!(err.contains("cuda is not available"), "{err}");
}

/// A folder of its own per call (tests run in parallel threads of one process).
fn tempdir() -> TmpDir {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("rlx-diverge-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

#[test]
fn nan_report_on_wgpu_names_the_same_culprit_as_on_cpu() {
    if !gpu() {
        return;
    }
    let run = |dev: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args([
                "run",
                "-q",
                "--device",
                dev,
                "examples/attention_masked_nan",
            ])
            .current_dir(repo())
            .env("RLX_DEBUG_NANS", "1")
            .output()
            .expect("run rlx");
        assert_eq!(o.status.code(), Some(0));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let (cpu, wgpu) = (run("cpu"), run("wgpu"));
    let culprit = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("rlx nan-check:"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no report: {s}"))
    };
    // examples/attention_masked_nan/expect.json: the softmax of a fully masked row.
    assert!(culprit(&cpu).contains("\"layer0.attn.softmax\""), "{cpu}");
    assert_eq!(culprit(&cpu), culprit(&wgpu));
    assert!(wgpu.contains("[wgpu]"), "{wgpu}");
    assert!(wgpu.contains("layer0.attn.mask_fill"), "{wgpu}");
}
