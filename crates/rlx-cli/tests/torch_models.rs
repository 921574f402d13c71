//! torch.export programs (`.pt2`, written by scripts/gen_torch_models.py with random weights)
//! against PyTorch eager's outputs, and the planted-NaN modules against the module path and
//! source line the script recorded from its own text.

mod common;
use common::*;
use rlx_cli::load::{load, ModelArgs};
use rlx_cli::npy::read_npy;
use rlx_runtime::{Device, Session};
use std::path::Path;
use std::process::Command;

/// Import `dir/model.pt2` with the folder's `input_<name>.npy` files, run it on the CPU and
/// compare every output with `expected_<i>.npy` (float32 rtol 1e-4, as the issue asks).
fn matches_pytorch(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/torch/{name}")) else {
        return;
    };
    let loaded = load(
        &ModelArgs {
            model: dir.clone(),
            ..Default::default()
        },
        true,
    )
    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let mut s = Session::new(Device::Cpu)
        .try_compile(loaded.graph)
        .unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    let outs = run(&mut s, &loaded.feeds);
    let mut n = 0;
    while dir.join(format!("expected_{n}.npy")).exists() {
        let want = read_npy(&dir.join(format!("expected_{n}.npy"))).unwrap();
        assert!(
            n < outs.len(),
            "{name}: RLX gave {} outputs, PyTorch more",
            outs.len()
        );
        let scale = (0..want.numel())
            .map(|i| want.data().get_f64(i).abs())
            .fold(0.0f64, f64::max);
        // rtol 1e-4; atol 1e-5 of the output's scale (elements near 0 carry absolute
        // round-off from sums of larger terms).
        assert_close(
            &format!("{name} output {n}"),
            &outs[n],
            &want,
            1e-4,
            1e-5 * scale.max(1e-3),
        );
        n += 1;
    }
    assert_eq!(n, outs.len(), "{name}: output count differs from PyTorch's");
    assert!(n > 0, "{name}: no expected outputs");
}

macro_rules! model_tests {
    ($($t:ident),*) => { $( #[test] fn $t() { matches_pytorch(stringify!($t)); } )* };
}
model_tests!(
    mlp,
    mlp_dynamic,
    small_cnn,
    attn_block,
    reductions,
    resnet18,
    mobilenet_v3_small,
    vit_b16_small,
    vit_b16,
    bert,
    gpt2,
    llama,
    qwen3,
    t5,
    whisper_encoder,
    // torch.export's older layouts (torch 2.6's flat zip; torch 2.7/2.8's pt2 with
    // torch.save'd weights), written by the generator's "legacy" group
    legacy_flat_mlp_dynamic,
    legacy_flat_small_cnn,
    legacy_pickled_small_cnn,
    legacy_pickled_attn_block
);

/// The non-constant outputs check: a model whose outputs are all equal proves little.
#[test]
fn fixtures_have_varied_outputs() {
    for name in [
        "resnet18",
        "mobilenet_v3_small",
        "vit_b16_small",
        "vit_b16",
        "qwen3",
    ] {
        let Some(dir) = fixture(&format!("fixtures/torch/{name}")) else {
            return;
        };
        let t = read_npy(&dir.join("expected_0.npy")).unwrap();
        let v: Vec<f64> = (0..t.numel()).map(|i| t.data().get_f64(i)).collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(
            hi - lo > 1e-3,
            "{name}: expected outputs span only {lo}..{hi}"
        );
    }
}

/// `RLX_DEBUG_NANS=1 rlx run dir --nan-report r.json`: the reports as JSON.
fn nan_reports(dir: &Path) -> Vec<serde_json::Value> {
    let tmp = TmpDir(std::env::temp_dir().join(format!(
        "rlx_torch_nan_{}_{}",
        std::process::id(),
        dir.file_name().unwrap().to_string_lossy()
    )));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let json = tmp.join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["run", "-q"])
        .arg(dir)
        .arg("--nan-report")
        .arg(&json)
        .env("RLX_DEBUG_NANS", "1")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap_or_else(|e| {
        panic!(
            "{}: no report ({e}); stderr: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    }))
    .unwrap();
    v["reports"].as_array().cloned().unwrap_or_default()
}

/// The planted modules: the one culprit is at the recorded module path and source line (or,
/// for an Inf that a later op turns into NaN, the Inf's origin is), and nothing downstream
/// is blamed.
fn planted(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/torch/{name}")) else {
        return;
    };
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected_report.json")).unwrap()).unwrap();
    let reports = nan_reports(&dir);
    let culprits: Vec<&serde_json::Value> = reports
        .iter()
        .filter(|r| r["cause"]["kind"] != "propagated")
        .collect();
    assert_eq!(
        culprits.len(),
        1,
        "{name}: one culprit expected, got {reports:#?}"
    );
    let r = culprits[0];
    let line = want["source"]["line"].as_u64().unwrap();
    let file = want["source"]["file"].as_str().unwrap();
    let code = want["source"]["code"].as_str().unwrap();
    let at = |k: &str| -> Option<(String, u64, String)> {
        let s = r.get(k)?;
        Some((
            s["file"].as_str()?.rsplit('/').next()?.to_string(),
            s["line"].as_u64()?,
            s["code"].as_str().unwrap_or("").to_string(),
        ))
    };
    let expected = Some((file.to_string(), line, code.to_string()));
    let module = want["module"].as_str().unwrap();
    if want["kind"] == "NaN" {
        assert_eq!(at("source"), expected, "{name}: {r:#}");
        let label = r["label"].as_str().unwrap();
        if !module.is_empty() {
            assert!(
                label.starts_with(&format!("{module}/")),
                "{name}: label {label}"
            );
        }
    } else {
        // The Inf's creator is named as the origin of the NaN-making op.
        assert_eq!(at("inf_origin_source"), expected, "{name}: {r:#}");
        let origin = r["cause"]["inf_origin_label"].as_str().unwrap();
        assert!(
            origin.starts_with(&format!("{module}/")),
            "{name}: origin {origin}"
        );
    }
}

#[test]
fn planted_f16_overflow() {
    planted("nan_f16_overflow");
}
#[test]
fn planted_layernorm_eps0() {
    planted("nan_layernorm_eps0");
}
#[test]
fn planted_masked_softmax() {
    planted("nan_masked_softmax");
}

/// Files are read by what they hold, not by their name: a `.pt2` renamed `.onnx` (or with no
/// extension) and an ONNX model renamed `.pt2` both run; a folder with neither model file
/// names both.
#[test]
fn renamed_files_are_read_by_content() {
    let Some(dir) = fixture("fixtures/torch/mlp") else {
        return;
    };
    let tmp =
        TmpDir(std::env::temp_dir().join(format!("rlx_torch_renamed_{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let rlx = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let x = dir.join("input_x.npy");
    let mask = dir.join("input_mask.npy");
    for name in ["renamed.onnx", "renamed"] {
        let p = tmp.join(name);
        std::fs::copy(dir.join("model.pt2"), &p).unwrap();
        let (code, text) = rlx(&[
            "run".as_ref(),
            "-q".as_ref(),
            p.as_os_str(),
            "--input".as_ref(),
            format!("x={}", x.display()).as_ref(),
            "--input".as_ref(),
            format!("mask={}", mask.display()).as_ref(),
        ]);
        assert_eq!(code, Some(0), "{name}: {text}");
    }
    let onnx = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/healthy_mlp/model.onnx");
    let p = tmp.join("renamed.pt2");
    std::fs::copy(&onnx, &p).unwrap();
    let (code, text) = rlx(&["run".as_ref(), "-q".as_ref(), p.as_os_str()]);
    assert_eq!(code, Some(0), "ONNX renamed .pt2: {text}");
    let empty = tmp.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, text) = rlx(&["run".as_ref(), empty.as_os_str()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("model.onnx") && text.contains("model.pt2"),
        "{text}"
    );
}

/// `torch.export.Dim("batch", min=1, max=64)`: a batch inside the range runs, one outside it
/// is refused with the input, the dim and the range named (torch.export promised nothing
/// there).
#[test]
fn dims_outside_the_exported_range_are_refused() {
    let Some(dir) = fixture("fixtures/torch/mlp_dynamic") else {
        return;
    };
    let tmp = TmpDir(std::env::temp_dir().join(format!("rlx_torch_range_{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    for (batch, ok) in [(64usize, true), (65, false)] {
        let x = tmp.join(format!("x{batch}.npy"));
        let m = tmp.join(format!("m{batch}.npy"));
        rlx_cli::npy::write_npy(
            &x,
            &rlx_ir::Tensor::from_f32(&[batch, 16], vec![0.5; batch * 16]).unwrap(),
        )
        .unwrap();
        rlx_cli::npy::write_npy(
            &m,
            &rlx_ir::Tensor::from_f32(&[batch, 8], vec![0.0; batch * 8]).unwrap(),
        )
        .unwrap();
        let r = load(
            &ModelArgs {
                model: dir.join("model.pt2"),
                inputs: vec![
                    format!("x={}", x.display()),
                    format!("mask={}", m.display()),
                ],
                ..Default::default()
            },
            true,
        );
        match (r, ok) {
            (Ok(_), true) => {}
            (Err(e), false) => {
                let e = format!("{e:#}");
                assert!(
                    e.contains("\"x\"") && e.contains("65") && e.contains("[1, 64]"),
                    "{e}"
                );
            }
            (Ok(_), false) => panic!("batch {batch} imported outside the range [1, 64]"),
            (Err(e), true) => panic!("batch {batch}: {e:#}"),
        }
    }
}

/// Bad values stored in the checkpoint: the report names the parameter or buffer (by its
/// state-dict name) and the planted element, with the checkpoint fix, and blames no op that
/// only read it (the linear, the Mul).
fn planted_weight(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/torch/{name}")) else {
        return;
    };
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected_report.json")).unwrap()).unwrap();
    let reports = nan_reports(&dir);
    assert_eq!(reports.len(), 1, "{name}: {reports:#?}");
    let r = &reports[0];
    let kind = match want["kind"].as_str().unwrap() {
        "NaN" => "NaN",
        "+inf" => "PosInf",
        _ => "NegInf",
    };
    assert_eq!(r["op"], "Initializer", "{name}: {r:#}");
    assert_eq!(r["label"], want["initializer"], "{name}: {r:#}");
    assert_eq!(r["kind"], kind, "{name}: {r:#}");
    assert_eq!(r["index"], want["index"], "{name}: {r:#}");
    assert_eq!(r["cause"]["kind"], "leaf", "{name}: {r:#}");
    assert!(
        r["fix"].as_str().unwrap_or("").contains("checkpoint"),
        "{name}: {r:#}"
    );
}

#[test]
fn planted_nan_weight() {
    planted_weight("nan_weight");
}

#[test]
fn planted_inf_buffer() {
    planted_weight("inf_buffer");
}

/// `rlx trace` of a `.pt2`: the first non-finite op carries the user's line in trace.json
/// (`at`) and shows it in trace.html, in the summary and in the op's row.
#[test]
fn trace_shows_the_source_line() {
    let Some(dir) = fixture("fixtures/torch/nan_layernorm_eps0") else {
        return;
    };
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected_report.json")).unwrap()).unwrap();
    let line = format!(
        "{}:{}",
        want["source"]["file"].as_str().unwrap(),
        want["source"]["line"]
    );
    let tmp = TmpDir(std::env::temp_dir().join(format!("rlx_torch_trace_{}", std::process::id())));
    let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["trace", "-o"])
        .arg(&tmp.0)
        .arg(&dir)
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.join("trace.json")).unwrap()).unwrap();
    let first = j["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["nan"].as_u64().unwrap_or(0) > 0)
        .expect("a NaN op");
    assert!(
        first["at"].as_str().unwrap_or("").contains(&line),
        "{first:#}"
    );
    let html = std::fs::read_to_string(tmp.join("trace.html")).unwrap();
    let summary = html
        .split("id=\"first-nonfinite-summary\"")
        .nth(1)
        .unwrap_or("");
    let summary = summary.split("</p>").next().unwrap_or("");
    assert!(summary.contains(&line), "summary: {summary}");
    assert!(html.contains("class=\"at\""), "no source line in the table");
}

/// `rlx trace` names a NaN stored in a weight at the weight (as nan-check does), not at the
/// Transpose that first reads it.
#[test]
fn trace_names_a_bad_weight() {
    let Some(dir) = fixture("fixtures/torch/nan_weight") else {
        return;
    };
    let tmp =
        TmpDir(std::env::temp_dir().join(format!("rlx_torch_trace_w_{}", std::process::id())));
    let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["trace", "-o"])
        .arg(&tmp.0)
        .arg(&dir)
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.join("trace.json")).unwrap()).unwrap();
    let f = &j["first_nonfinite"];
    assert_eq!(
        (f["op"].as_str(), f["label"].as_str()),
        (Some("Initializer"), Some("fc.weight")),
        "{f:#}"
    );
}

/// A `.pt2` cut short by even one byte is called truncated: the zip reader would otherwise
/// find the zip stored inside it (`data/sample_inputs/model.pt`) and `rlx` would read that.
#[test]
fn an_archive_cut_short_is_called_truncated() {
    let Some(dir) = fixture("fixtures/torch/small_cnn") else {
        return;
    };
    let tmp = TmpDir(std::env::temp_dir().join(format!("rlx_torch_cut_{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let b = std::fs::read(dir.join("model.pt2")).unwrap();
    for cut in [1usize, 200] {
        let p = tmp.join(format!("cut{cut}.pt2"));
        std::fs::write(&p, &b[..b.len() - cut]).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(["run", "-q"])
            .arg(&p)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.contains("truncated") && !text.contains("manifest"),
            "cut {cut}: {text}"
        );
    }
}

/// Every command takes a `.pt2` as it takes an `.onnx`: lint, diverge, bench, compile (and
/// the package runs to PyTorch's outputs).
#[test]
fn every_command_accepts_a_pt2() {
    let Some(dir) = fixture("fixtures/torch/mlp") else {
        return;
    };
    let tmp = TmpDir(std::env::temp_dir().join(format!("rlx_torch_cmds_{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let rlx = |args: Vec<std::ffi::OsString>| {
        let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(&args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "rlx {args:?}: {text}");
        text
    };
    let d = dir.clone().into_os_string();
    let lint = rlx(vec!["lint".into(), d.clone()]);
    assert!(lint.contains("no constant folds to NaN/Inf"), "{lint}");
    rlx(vec!["diverge".into(), "-q".into(), d.clone()]);
    let bench = rlx(vec![
        "bench".into(),
        "--runs".into(),
        "2".into(),
        "--warmup".into(),
        "1".into(),
        d.clone(),
    ]);
    assert!(bench.contains("min:"), "{bench}");
    let pkg = tmp.join("mlp.rlxpkg");
    rlx(vec![
        "compile".into(),
        d.clone(),
        "-o".into(),
        pkg.clone().into_os_string(),
    ]);
    let out = tmp.join("out");
    rlx(vec![
        "run".into(),
        "-q".into(),
        pkg.into_os_string(),
        "--input".into(),
        format!("x={}", dir.join("input_x.npy").display()).into(),
        "--input".into(),
        format!("mask={}", dir.join("input_mask.npy").display()).into(),
        "-o".into(),
        out.clone().into_os_string(),
    ]);
    let got = read_npy(&out.join("output_0.npy")).unwrap();
    let want = read_npy(&dir.join("expected_0.npy")).unwrap();
    assert_close("package output", &got, &want, 1e-4, 1e-6);
}
