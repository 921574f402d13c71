//! `rlx precision`: on the float32 models of scripts/gen_precision_models.py (fixtures/
//! precision/, each with planted float16 overflow), the written mixed model is checked on
//! HELD-BACK input sets (never given to the search) against onnxruntime's float32 outputs,
//! by importing it here and running it with the localizer on; the all-float16 model must
//! fail (so the search had something to do); the kept count is compared with the AutoCast
//! rule's count that the generator computed with onnxruntime; errors are one line each with
//! nothing written; the HTML report renders in headless Chromium with the first overflowing
//! node (from onnxruntime's values, in meta.json) highlighted.
//!
//! Fixtures are generated (skip without them unless RLX_REQUIRE_FIXTURES=1); the Chromium
//! test skips without /usr/bin/chromium unless RLX_REQUIRE_CHROMIUM=1. The onnxruntime check
//! of the written model (scripts/check_precision.py) needs .venv and skips without it unless
//! RLX_REQUIRE_NUMPY=1.

mod common;

use common::chromium::{chromium, chromium_cmd, decode_png};
use common::{fixture, repo, TmpDir};
use rlx_cli::npy::read_npy;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::Tensor;
use rlx_onnx_import::{import_onnx, ImportOptions};
use rlx_runtime::{Device, Session};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const TOL: f64 = 1e-2;

fn tmpdir(tag: &str) -> TmpDir {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!(
        "rlx-precision-{tag}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

fn precision(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .arg("precision")
        .args(args)
        .current_dir(repo())
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .expect("run rlx");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn sets(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

/// max |a − b| / max |b|; infinite when `a` is non-finite.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.data().to_f64_vec(), b.data().to_f64_vec());
    assert_eq!(a.len(), b.len());
    if a.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
    let d = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    d / scale.max(f64::MIN_POSITIVE)
}

/// Run `model` (written by rlx precision) on every held-back set of `dir` with the NaN
/// localizer on; return the worst error against onnxruntime's float32 `expected_*.npy`.
fn held_back_error(model: &Path, dir: &Path) -> f64 {
    let mut worst = 0f64;
    for sd in sets(&dir.join("heldout")) {
        let mut opts = ImportOptions::default();
        let mut feeds = vec![];
        let mut expected = vec![];
        for e in std::fs::read_dir(&sd).unwrap().flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            if let Some(n) = f
                .strip_prefix("input_")
                .and_then(|x| x.strip_suffix(".npy"))
            {
                let t = read_npy(&e.path()).unwrap();
                opts.input_shapes.insert(n.to_string(), t.dims().to_vec());
                feeds.push((n.to_string(), t));
            }
            if let Some(n) = f
                .strip_prefix("expected_")
                .and_then(|x| x.strip_suffix(".npy"))
            {
                expected.push((n.to_string(), read_npy(&e.path()).unwrap()));
            }
        }
        let g = import_onnx(model, &opts).unwrap();
        let bytes = std::fs::read(model).unwrap();
        let m = <rlx_onnx_import::proto::ModelProto as prost::Message>::decode(&bytes[..]).unwrap();
        let outs: Vec<String> = m
            .graph
            .unwrap()
            .output
            .iter()
            .map(|v| v.name.clone())
            .collect();
        let mut s = Session::new(Device::Cpu).try_compile(g).unwrap();
        s.set_debug_mode(Some(DebugMode::Warn));
        s.set_print_reports(false);
        let got = s.run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect());
        let got = got.unwrap();
        let culprits: Vec<_> = s.nan_reports().iter().filter(|r| r.is_culprit()).collect();
        assert!(
            culprits.is_empty(),
            "{}: RLX_DEBUG_NANS names {} on {}",
            model.display(),
            culprits[0].label,
            sd.display()
        );
        assert_eq!(got.len(), expected.len(), "{}", sd.display());
        for (k, t) in got.iter().enumerate() {
            // outputs in graph order; expected files by output name
            let want = expected
                .iter()
                .find(|(n, _)| *n == outs[k])
                .unwrap_or_else(|| panic!("no expected_{}.npy in {}", outs[k], sd.display()));
            worst = worst.max(rel(t, &want.1));
        }
    }
    worst
}

fn python() -> Option<PathBuf> {
    let venv = repo().join(".venv/bin/python");
    if venv.is_file()
        && Command::new(&venv)
            .args(["-c", "import numpy, onnxruntime"])
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Some(venv);
    }
    assert!(
        !rlx_ir::env::is_on("RLX_REQUIRE_NUMPY"),
        "RLX_REQUIRE_NUMPY=1 but {} has no numpy/onnxruntime",
        venv.display()
    );
    None
}

/// The whole Done-when check on one generated model.
fn check_model(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/precision/{name}")) else {
        return;
    };
    let t = tmpdir(name);
    let out = t.join("out.onnx");
    let rep = t.join("report.json");
    let (code, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--calibration",
        dir.join("calib").to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
        "--json",
        rep.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{name}: {stdout}\n{stderr}");
    let j = json(&rep);
    // the all-float16 model is not finite: there was something to find
    assert_eq!(j["all_low"]["finite"], false, "{name}: {}", j["all_low"]);
    let kept = j["kept_count"].as_u64().unwrap();
    let floats = j["float_nodes"].as_u64().unwrap();
    assert!(
        kept >= 1 && kept < floats,
        "{name}: kept {kept} of {floats}"
    );
    // every kept node says why
    for k in j["kept"].as_array().unwrap() {
        assert!(!k["reason"].as_str().unwrap().is_empty(), "{name}: {k}");
    }
    // the written model holds float16 (not just a copy of the float32 one)
    let bytes = std::fs::read(&out).unwrap();
    let m = <rlx_onnx_import::proto::ModelProto as prost::Message>::decode(&bytes[..]).unwrap();
    let g = m.graph.unwrap();
    let f16_casts = g
        .node
        .iter()
        .filter(|n| n.op_type == "Cast" && n.attribute.iter().any(|a| a.name == "to" && a.i == 10))
        .count();
    assert!(
        f16_casts >= 1,
        "{name}: no Cast to float16 in the written model"
    );
    // held back: never seen by the search; against onnxruntime's float32 outputs
    let e = held_back_error(&out, &dir);
    assert!(e <= TOL, "{name}: held-back error {e} > {TOL}");
    // the AutoCast rule (scripts/gen_precision_models.py, onnxruntime's values): RLX keeps no
    // more nodes, unless the rule's own choice fails RLX's check
    let rule = json(&dir.join("autocast_rule.json"));
    let rule_n = rule["count"].as_u64().unwrap();
    if kept > rule_n {
        let names: Vec<&str> = rule["kept"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let (code, stdout, _) = precision(&[
            dir.to_str().unwrap(),
            "--calibration",
            dir.join("calib").to_str().unwrap(),
            "--to",
            "f16",
            "-o",
            t.join("rule.onnx").to_str().unwrap(),
            "--no-search",
            "--keep",
            &names.join(","),
            "-q",
        ]);
        assert_eq!(
            code, 1,
            "{name}: RLX keeps {kept} > the AutoCast rule's {rule_n}, and the rule's choice passes: {stdout}"
        );
    }
    // onnxruntime runs the written model on the held-back sets too
    if let Some(py) = python() {
        let o = Command::new(py)
            .arg(repo().join("scripts/check_precision.py"))
            .arg(&dir)
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}: onnxruntime check failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn cast_f16_overflow_f32_is_fixed() {
    check_model("cast_f16_overflow_f32");
}

#[test]
fn f16_activation_growth_f32_is_fixed() {
    check_model("f16_activation_growth_f32");
}

#[test]
fn bert_encoder_is_fixed() {
    check_model("bert_overflow");
}

#[test]
fn qwen3_decoder_is_fixed() {
    check_model("qwen3_overflow");
}

#[test]
fn cnn_is_fixed() {
    check_model("cnn_overflow");
}

// errors: one line, exit nonzero, nothing written

fn assert_one_error(code: i32, want_code: i32, stderr: &str, want: &str, out: &Path) {
    assert_eq!(code, want_code, "{stderr}");
    assert!(stderr.contains(want), "expected \"{want}\" in: {stderr}");
    assert!(!out.exists(), "{} was written", out.display());
}

#[test]
fn a_model_already_in_float16_is_refused() {
    let t = tmpdir("already");
    let out = t.join("x.onnx");
    let (code, _, err) = precision(&[
        "examples/f16_activation_growth",
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_one_error(code, 1, &err, "is already float16", &out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn a_dtype_the_cpu_cannot_simulate_is_refused() {
    let t = tmpdir("to");
    let out = t.join("x.onnx");
    let (code, _, err) = precision(&[
        "examples/healthy_mlp",
        "--to",
        "fp8",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_one_error(code, 2, &err, "cannot simulate", &out);
}

#[test]
fn calibration_inputs_that_do_not_match_the_model_are_refused() {
    let t = tmpdir("calib");
    let out = t.join("x.onnx");
    // a wrong shape
    let bad = t.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    rlx_cli::npy::write_npy(
        &bad.join("input_x.npy"),
        &Tensor::from_f32(&[3, 3], vec![0.5; 9]).unwrap(),
    )
    .unwrap();
    let (code, _, err) = precision(&[
        "examples/healthy_mlp",
        "--calibration",
        bad.to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_one_error(code, 1, &err, "dim 0 is declared 4", &out);
    assert!(err.contains("bad"), "the error names the folder: {err}");
    // an input the model does not have
    let other = t.join("other");
    std::fs::create_dir_all(&other).unwrap();
    rlx_cli::npy::write_npy(
        &other.join("input_y.npy"),
        &Tensor::from_f32(&[4, 16], vec![0.5; 64]).unwrap(),
    )
    .unwrap();
    let (code, _, err) = precision(&[
        "examples/healthy_mlp",
        "--calibration",
        other.to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_one_error(code, 1, &err, "no input named \"y\"", &out);
}

// the HTML report, in headless Chromium (helpers in tests/common/chromium.rs)

#[test]
fn report_renders_in_headless_chromium_with_the_first_overflow_highlighted() {
    let Some(dir) = fixture("fixtures/precision/bert_overflow") else {
        return;
    };
    let t = tmpdir("html");
    let html_dir = t.join("report");
    let (code, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--calibration",
        dir.join("calib").to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        t.join("out.onnx").to_str().unwrap(),
        "--html",
        html_dir.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // the first node whose float32 value passes 65504, from onnxruntime's values
    let first = json(&dir.join("meta.json"))["first_overflow"]
        .as_str()
        .unwrap()
        .to_string();
    let page = std::fs::read_to_string(html_dir.join("precision.html")).unwrap();
    let row = page
        .split("<tr ")
        .find(|r| r.contains(r#"data-first-failure="true""#))
        .expect("a highlighted row");
    assert!(
        row.contains(&first),
        "highlighted row is not {first}: {row}"
    );
    assert_eq!(page.matches(r#"data-first-failure="true""#).count(), 1);
    let Some(bin) = chromium() else { return };
    let url = format!(
        "file://{}",
        html_dir
            .join("precision.html")
            .canonicalize()
            .unwrap()
            .display()
    );
    let png = t.join("shot.png");
    let o = chromium_cmd(&bin, &tmpdir("profile"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        png.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (w, h, px) = decode_png(&std::fs::read(&png).unwrap());
    let nonwhite = px.iter().filter(|p| p.iter().any(|&c| c < 235)).count();
    assert!(
        nonwhite > w * h / 20,
        "screenshot looks blank: {nonwhite} non-white pixels"
    );
    let red = px
        .iter()
        .filter(|p| p[0] > 200 && p[1] < 70 && p[2] < 70)
        .count();
    assert!(red > 100, "no red highlight in the screenshot ({red} px)");
    let o = chromium_cmd(&bin, &tmpdir("profile"))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&o.stdout);
    let marker = dom
        .split(r#"id="first-failure-marker""#)
        .nth(1)
        .expect("first failure marker in the DOM");
    assert!(
        marker[..marker.find("</g>").unwrap()].contains(&format!("\"{first}\"")),
        "marker does not name {first}"
    );
}
