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

use common::chromium::{chromium, dump_dom, nonwhite, red, screenshot};
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
    assert!(
        err.contains(&bad.join("input_x.npy").display().to_string()),
        "the error names the file: {err}"
    );
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
    let (w, h, px) = screenshot(&bin, &tmpdir("profile"), &url, &png);
    let nonwhite = nonwhite(&px);
    assert!(
        nonwhite > w * h / 20,
        "screenshot looks blank: {nonwhite} non-white pixels"
    );
    let red = red(&px);
    assert!(red > 100, "no red highlight in the screenshot ({red} px)");
    let dom = dump_dom(&bin, &tmpdir("profile"), &url);
    let marker = dom
        .split(r#"id="first-failure-marker""#)
        .nth(1)
        .expect("first failure marker in the DOM");
    assert!(
        marker[..marker.find("</g>").unwrap()].contains(&format!("\"{first}\"")),
        "marker does not name {first}"
    );
}

// the written model is valid ONNX at the model's opset (onnx.checker, onnxruntime)

/// `.venv/bin/python` with onnx, onnxruntime and numpy, else `None` (skipped, with the reason
/// on stderr) unless RLX_REQUIRE_FIXTURES=1 or RLX_REQUIRE_NUMPY=1.
fn onnx_python() -> Option<PathBuf> {
    let venv = repo().join(".venv/bin/python");
    if venv.is_file()
        && Command::new(&venv)
            .args(["-c", "import onnx, onnxruntime, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Some(venv);
    }
    assert!(
        !rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") && !rlx_ir::env::is_on("RLX_REQUIRE_NUMPY"),
        "RLX_REQUIRE_FIXTURES/RLX_REQUIRE_NUMPY is set but {} has no onnx/onnxruntime/numpy (scripts/setup-venv.sh)",
        venv.display()
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipping the onnx/onnxruntime check of {}: {} has no onnx/onnxruntime/numpy",
        std::thread::current().name().unwrap_or("?"),
        venv.display()
    );
    None
}

/// onnx.checker's full check, no initializer with more NaN/Inf than the float32 model's
/// (argv[3]) of that name, and an onnxruntime CPU session:
/// for bfloat16 only the CPU provider's missing kernel ("Could not find an implementation")
/// is accepted (docs/DEBUGGING.md), never a type error.
const CHECK_PY: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
from onnx import numpy_helper
path, low, src = sys.argv[1], sys.argv[2], sys.argv[3]
m = onnx.load(path)
onnx.checker.check_model(m, full_check=True)
def bad(t):
    a = numpy_helper.to_array(t)
    if a.dtype.kind == "f" or "float" in str(a.dtype):
        return int((~np.isfinite(a.astype(np.float32))).sum())
    return 0
orig = {t.name: bad(t) for t in onnx.load(src).graph.initializer}
for t in m.graph.initializer:
    had = orig.get(t.name.split("__rlx_")[0], 0)
    assert bad(t) <= had, "initializer %s holds %d non-finite value(s), the float32 one %d" % (t.name, bad(t), had)
try:
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    print("onnxruntime: loaded")
except Exception as e:
    if low == "bf16" and "Could not find an implementation" in str(e):
        print("onnxruntime: no CPU kernel:", str(e).splitlines()[0])
    else:
        raise
"#;

/// Write `model --to low` (generated inputs or the folder's), then check it as above.
fn written_model_is_valid_onnx(model: &str, low: &str, want_reason: &str) {
    let Some(dir) = fixture(model) else { return };
    let t = tmpdir("valid");
    let out = t.join("x.onnx");
    let (code, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--to",
        low,
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{model}: {stdout}\n{stderr}");
    assert!(
        stdout.contains(want_reason),
        "{model}: no \"{want_reason}\" in the why-kept table:\n{stdout}"
    );
    let Some(py) = onnx_python() else { return };
    let o = Command::new(py)
        .args(["-c", CHECK_PY, out.to_str().unwrap(), low])
        .arg(dir.join("model.onnx"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{model} --to {low}: the written model fails onnx's full check or onnxruntime:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn isinf_stays_float32_before_opset_20_and_the_model_passes_onnx_checker() {
    written_model_is_valid_onnx(
        "examples/inf_absorbed",
        "f16",
        "IsInf takes no float16 before opset 20",
    );
}

#[test]
fn conv_stays_float32_in_bfloat16_at_opset_17_and_the_model_passes_onnx_checker() {
    written_model_is_valid_onnx(
        "fixtures/precision/cnn_overflow",
        "bf16",
        "Conv takes no bfloat16 before opset 22",
    );
}

#[test]
fn cos_stays_float32_in_bfloat16_at_opset_17_and_the_model_passes_onnx_checker() {
    written_model_is_valid_onnx(
        "fixtures/precision/qwen3_overflow",
        "bf16",
        "Cos takes no bfloat16 before opset 22",
    );
}

/// The generated table (crates/rlx-cli/src/onnx_types.rs) against the installed onnx's
/// schemas, for a few ops, opsets and slots.
#[test]
fn onnx_type_table_matches_onnx_schemas() {
    use rlx_cli::precision::slot_admits;
    use rlx_ir::DType;
    // (op, opset, input slot?, slot)
    let cases: &[(&str, u32, bool, usize)] = &[
        ("IsInf", 17, true, 0),
        ("IsInf", 20, true, 0),
        ("Conv", 17, true, 1),
        ("Conv", 22, true, 1),
        ("Cos", 17, true, 0),
        ("Cos", 22, false, 0),
        ("MatMul", 13, true, 0),
        ("Add", 7, true, 1),
        ("Add", 14, false, 0),
        ("LayerNormalization", 17, false, 1),
        ("Resize", 19, true, 2),
        ("Concat", 13, true, 5),
        ("Where", 16, true, 1),
    ];
    let Some(py) = onnx_python() else { return };
    let spec: Vec<String> = cases
        .iter()
        .map(|(op, v, i, s)| format!("{op}:{v}:{}:{s}", u8::from(*i)))
        .collect();
    let script = r#"
import sys, onnx
from onnx import defs
print(onnx.__version__)
for c in sys.argv[1:]:
    op, v, inp, slot = c.split(":")
    s = defs.get_schema(op, max_inclusive_version=int(v), domain="")
    params = s.inputs if inp == "1" else s.outputs
    p = params[min(int(slot), len(params) - 1)]
    allowed = next((list(t.allowed_type_strs) for t in s.type_constraints if t.type_param_str == p.type_str), [p.type_str])
    print(int("tensor(float16)" in allowed), int("tensor(bfloat16)" in allowed))
"#;
    let o = Command::new(py)
        .arg("-c")
        .arg(script)
        .args(&spec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let mut lines = text.lines();
    let version = lines.next().unwrap();
    if version != rlx_cli::onnx_types::ONNX_VERSION {
        eprintln!(
            "note: the table is from onnx {}, the venv has {version}",
            rlx_cli::onnx_types::ONNX_VERSION
        );
    }
    for ((op, v, input, slot), line) in cases.iter().zip(lines) {
        let want: Vec<bool> = line.split(' ').map(|x| x == "1").collect();
        for (low, w) in [(DType::F16, want[0]), (DType::BF16, want[1])] {
            assert_eq!(
                slot_admits(op, *v, *input, *slot, low),
                Some(w),
                "{op} at opset {v}, {} {slot}, {low:?}",
                if *input { "input" } else { "output" }
            );
        }
    }
}

// the written model holds no non-finite initializer the float32 one lacked

#[test]
fn an_initializer_that_overflows_float16_keeps_its_readers_float32_without_calibration() {
    let Some(dir) = fixture("fixtures/precision/cnn_overflow") else {
        return;
    };
    let t = tmpdir("initinf");
    let out = t.join("z.onnx");
    let (code, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("it would hold inf in f16"),
        "no overflowing-initializer reason:\n{stdout}"
    );
    let bytes = std::fs::read(&out).unwrap();
    let m = <rlx_onnx_import::proto::ModelProto as prost::Message>::decode(&bytes[..]).unwrap();
    for init in &m.graph.unwrap().initializer {
        let v = rlx_onnx_import::tensor::tensor_from_proto(init, None).unwrap();
        assert!(
            v.data().to_f64_vec().iter().all(|x| x.is_finite()),
            "initializer \"{}\" of the written model is not finite",
            init.name
        );
    }
    if let Some(py) = onnx_python() {
        let o = Command::new(py)
            .args(["-c", CHECK_PY, out.to_str().unwrap(), "f16"])
            .arg(dir.join("model.onnx"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

// without calibration inputs: say the inputs were generated

#[test]
fn generated_inputs_are_named_and_calibration_suggested() {
    let Some(dir) = fixture("fixtures/precision/cnn_overflow") else {
        return;
    };
    let t = tmpdir("gen");
    let m = t.join("m");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::copy(dir.join("model.onnx"), m.join("model.onnx")).unwrap();
    let out = t.join("x.onnx");
    let rep = t.join("r.json");
    let (code, stdout, stderr) = precision(&[
        m.to_str().unwrap(),
        "--to",
        "f16",
        "-o",
        out.to_str().unwrap(),
        "--json",
        rep.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("generated") && stderr.contains("--calibration"),
        "{stderr}"
    );
    assert!(!stdout.contains("model folder's inputs"), "{stdout}");
    let sets = json(&rep)["calibration_sets"].to_string();
    assert!(
        sets.contains("generated inputs (deterministic, in [-1, 1)"),
        "{sets}"
    );
}

// outputs: checked before any work, never into the source

#[test]
fn an_unwritable_json_path_is_refused_before_anything_is_written() {
    let t = tmpdir("json");
    let out = t.join("x.onnx");
    for j in [
        "/proc/nope.json".to_string(),
        t.join("missing/r.json").display().to_string(),
    ] {
        let (code, _, err) = precision(&[
            "examples/healthy_mlp",
            "--to",
            "f16",
            "-o",
            out.to_str().unwrap(),
            "--json",
            &j,
            "-q",
        ]);
        assert_one_error(code, 1, &err, "--json", &out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    assert!(!t.join("missing").exists());
}

#[test]
fn an_output_that_is_a_directory_is_refused_even_with_force() {
    let t = tmpdir("odir");
    let d = t.join("adir");
    std::fs::create_dir_all(&d).unwrap();
    let (code, _, err) = precision(&[
        "examples/healthy_mlp",
        "--to",
        "f16",
        "-o",
        d.to_str().unwrap(),
        "--force",
        "-q",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("-o {}: is a directory", d.display())),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
}

#[test]
fn the_output_may_not_be_the_source_model() {
    let t = tmpdir("self");
    let m = t.join("self");
    std::fs::create_dir_all(&m).unwrap();
    let src = repo().join("examples/healthy_mlp/model.onnx");
    std::fs::copy(&src, m.join("model.onnx")).unwrap();
    let before = std::fs::read(m.join("model.onnx")).unwrap();
    for o in [m.join("model.onnx"), m.join(".").join("model.onnx")] {
        let (code, _, err) = precision(&[
            m.to_str().unwrap(),
            "--to",
            "f16",
            "-o",
            o.to_str().unwrap(),
            "--force",
            "-q",
        ]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("is the float32 model itself"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    assert_eq!(std::fs::read(m.join("model.onnx")).unwrap(), before);
}

// the float32 reference and the verification are the same kind of run

#[test]
fn every_node_kept_measures_exactly_zero() {
    let Some(dir) = fixture("fixtures/precision/cnn_overflow") else {
        return;
    };
    let t = tmpdir("zero");
    let out = t.join("tiny.onnx");
    let rep = t.join("r.json");
    let (code, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--to",
        "f16",
        "--tol-rel",
        "1e-12",
        "-o",
        out.to_str().unwrap(),
        "--json",
        rep.to_str().unwrap(),
        "-q",
    ]);
    let j = json(&rep);
    assert_eq!(
        j["kept_count"], j["float_nodes"],
        "every node is kept at 1e-12: {stdout}"
    );
    assert_eq!(
        j["calibration"]["max_rel"].as_f64(),
        Some(0.0),
        "{stdout}\n{stderr}"
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}

// arguments

#[test]
fn a_negative_tol_rel_gets_the_commands_own_error() {
    let t = tmpdir("neg");
    let out = t.join("x.onnx");
    let (code, _, err) = precision(&[
        "examples/healthy_mlp",
        "--to",
        "f16",
        "--tol-rel",
        "-1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_one_error(
        code,
        1,
        &err,
        "--tol-rel -1: must be a positive number",
        &out,
    );
    assert!(!err.contains("'-- -1'"), "{err}");
}

#[test]
fn max_trials_zero_says_the_search_gave_up() {
    let Some(dir) = fixture("fixtures/precision/cnn_overflow") else {
        return;
    };
    let t = tmpdir("trials");
    let out = t.join("x.onnx");
    let (_, stdout, stderr) = precision(&[
        dir.to_str().unwrap(),
        "--calibration",
        dir.join("calib").to_str().unwrap(),
        "--to",
        "f16",
        "--max-trials",
        "0",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains("the search gave up") && stderr.contains("--max-trials"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn help_shows_the_long_description_and_onnx_only() {
    for (cmd, long_line) in [
        ("precision", "Calibration inputs: --calibration DIR"),
        (
            "reduce",
            "--until diverge[:BACKEND]  the first node where BACKEND",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{help}");
        assert!(help.contains(long_line), "rlx {cmd} --help:\n{help}");
        assert!(
            !help.contains(".pt2"),
            "rlx {cmd} --help mentions .pt2:\n{help}"
        );
        assert!(help.contains("folder holding model.onnx"), "{help}");
    }
}
