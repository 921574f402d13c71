//! `rlx trace`: trace.json checked against the reference evaluator's values that the example
//! generator wrote (expect.json's per-node non-finite counts, expected_<output>.npy), and
//! trace.html rendered in headless Chromium (skipped when chromium is missing unless
//! RLX_REQUIRE_CHROMIUM=1).

mod common;

use common::chromium::{chromium, dump_dom, nonwhite, red, screenshot};
use common::TmpDir;
use rlx_cli::npy::read_npy;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmpdir(tag: &str) -> TmpDir {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!("rlx-trace-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

/// Run `rlx trace examples/<name> -o DIR`; returns (DIR, trace.json, stdout).
fn trace(name: &str) -> (TmpDir, Value, String) {
    let dir = tmpdir(name);
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["trace", "-o"])
        .arg(&dir)
        .arg(repo().join("examples").join(name))
        .env_remove("RLX_DEBUG_NANS")
        .env_remove("RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    (dir, j, out)
}

fn expect(name: &str) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(repo().join("examples").join(name).join("expect.json")).unwrap(),
    )
    .unwrap()
}

/// The last recorded op carrying `label` (a decomposed op's last step is the ONNX node's output).
fn last_with_label<'a>(j: &'a Value, label: &str) -> &'a Value {
    j["ops"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|o| o["label"] == label)
        .unwrap_or_else(|| panic!("no op labelled {label}"))
}

/// One float16 unit in the last place at `b` (IEEE 754 binary16: 10 fraction bits, smallest
/// normal 2^-14, subnormal spacing 2^-24).
fn ulp_f16(b: f64) -> f64 {
    let a = b.abs();
    if a < 2f64.powi(-14) {
        2f64.powi(-24)
    } else {
        2f64.powi(a.log2().floor() as i32 - 10)
    }
}

#[test]
fn ulp_f16_follows_binary16_spacing() {
    assert_eq!(ulp_f16(1.0), 2f64.powi(-10));
    assert_eq!(ulp_f16(1.9), 2f64.powi(-10));
    assert_eq!(ulp_f16(-40000.0), 32.0);
    assert_eq!(ulp_f16(65504.0), 32.0);
    assert_eq!(ulp_f16(1e-6), 2f64.powi(-24));
}

#[test]
fn trace_json_matches_the_reference_evaluator() {
    for name in [
        "attention_masked_nan",
        "f16_activation_growth",
        "healthy_mlp",
    ] {
        let (_, j, out) = trace(name);
        let e = expect(name);
        let nodes = e["derived"]["nonfinite_nodes"].as_array().unwrap();
        // first non-finite op = the first ONNX node whose output the reference evaluator
        // found non-finite (in the examples, node order is execution order)
        match nodes.first() {
            Some(n) => {
                assert_eq!(j["first_nonfinite"]["label"], n["node"], "{name}");
                assert!(out.contains("first non-finite value at"), "{out}");
            }
            None => assert!(j["first_nonfinite"].is_null(), "{name}: {j}"),
        }
        for n in nodes {
            let op = last_with_label(&j, n["node"].as_str().unwrap());
            let c = n["outputs"].as_object().unwrap().values().next().unwrap();
            assert_eq!(op["nan"], c["nan"], "{name} {}", n["node"]);
            assert_eq!(op["pos_inf"], c["posinf"], "{name} {}", n["node"]);
            assert_eq!(op["neg_inf"], c["neginf"], "{name} {}", n["node"]);
        }
        // the graph output's statistics against the reference evaluator's output file
        let (oname, _) = e["derived"]["outputs"]
            .as_object()
            .unwrap()
            .iter()
            .next()
            .unwrap();
        let want = read_npy(
            &repo()
                .join("examples")
                .join(name)
                .join(format!("expected_{oname}.npy")),
        )
        .unwrap();
        let v = want.data().to_f64_vec();
        let fin: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        let last = j["ops"].as_array().unwrap().last().unwrap();
        let amax = fin.iter().fold(0f64, |a, x| a.max(x.abs()));
        // float32: 1e-5 relative. float16: RLX and the reference evaluator round each op of
        // the example to float16 on their own, so one value may differ by a few float16
        // units in the last place (onnxruntime differs from the reference by 96 = 3 ulps at
        // magnitudes in [32768, 65504)). Allow 4 ulps of the reference value for min, max and
        // max_abs, and 4 ulps of max_abs for the mean (a mean of values each off by at most
        // that). One wrong element of a few percent fails.
        let f16 = want.dtype() == rlx_ir::DType::F16;
        let tol_of = |b: f64| {
            if f16 {
                4.0 * ulp_f16(b)
            } else {
                1e-5 * (1.0 + b.abs())
            }
        };
        let close = |a: &Value, b: f64| (a.as_f64().unwrap() - b).abs() <= tol_of(b);
        let lo = fin.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = fin.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = fin.iter().sum::<f64>() / fin.len() as f64;
        assert!(
            close(&last["min"], lo),
            "{name}: min {} vs {lo} (tolerance {})",
            last["min"],
            tol_of(lo)
        );
        assert!(
            close(&last["max"], hi),
            "{name}: max {} vs {hi} (tolerance {})",
            last["max"],
            tol_of(hi)
        );
        let mean_tol = if f16 {
            4.0 * ulp_f16(amax)
        } else {
            tol_of(mean)
        };
        assert!(
            (last["mean"].as_f64().unwrap() - mean).abs() <= mean_tol,
            "{name}: mean {} vs {mean} (tolerance {mean_tol})",
            last["mean"]
        );
        assert!(close(&last["max_abs"], amax), "{name}: max_abs");
        assert_eq!(
            last["nan"].as_u64().unwrap() as usize,
            v.iter().filter(|x| x.is_nan()).count()
        );
        // required fields, execution order
        for (k, op) in j["ops"].as_array().unwrap().iter().enumerate() {
            assert_eq!(op["index"], k);
            for f in [
                "id",
                "op",
                "label",
                "source_op",
                "shape",
                "dtype",
                "min",
                "max",
                "mean",
                "max_abs",
                "nan",
                "pos_inf",
                "neg_inf",
            ] {
                assert!(op.get(f).is_some(), "{name}: op {k} lacks {f}");
            }
        }
    }
}

#[test]
fn f16_trace_draws_the_overflow_line_and_climbs_toward_it() {
    let (dir, j, _) = trace("f16_activation_growth");
    assert_eq!(j["overflow_lines"][0]["dtype"], "f16");
    assert_eq!(j["overflow_lines"][0]["max"], 65504.0);
    // max|x| after each block's gain grows block over block (the generator's design: x5 per
    // block) and stays below 65504 until the last one overflows
    let gains: Vec<f64> = (0..6)
        .map(|i| {
            last_with_label(&j, &format!("block{i}.scale"))["max_abs"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(gains.windows(2).all(|w| w[1] > w[0]), "{gains:?}");
    assert!(gains[5] < 65504.0 && gains[5] > 1e4, "{gains:?}");
    let html = std::fs::read_to_string(dir.join("trace.html")).unwrap();
    assert!(html.contains("float16 max 65504"));
    assert!(html.contains(r#"id="first-nonfinite-marker""#));
    // self-contained: no fetched resources (the SVG namespace URI is not fetched)
    let stripped = html.replace("http://www.w3.org/2000/svg", "");
    for bad in ["http://", "https://", "<script src", "<link"] {
        assert!(!stripped.contains(bad), "trace.html references {bad}");
    }
    // no overflow line for a float32 model
    let (dir, j, _) = trace("attention_masked_nan");
    assert_eq!(j["overflow_lines"].as_array().unwrap().len(), 0);
    let html = std::fs::read_to_string(dir.join("trace.html")).unwrap();
    assert!(!html.contains("float16 max"));
}

#[test]
fn trace_of_a_bad_model_is_a_clear_error() {
    let dir = tmpdir("bad");
    let bogus = dir.join("model.onnx");
    std::fs::write(&bogus, b"not an onnx file").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["trace", "-o"])
        .arg(dir.join("out"))
        .arg(&bogus)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model.onnx"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// headless Chromium

#[test]
fn html_report_renders_in_headless_chromium() {
    let Some(bin) = chromium() else { return };
    let (dir, j, _) = trace("attention_masked_nan");
    let html = dir.join("trace.html");
    let url = format!("file://{}", html.canonicalize().unwrap().display());
    // screenshot: exists, and is not blank (many non-white pixels, the red NaN marks drawn)
    let png = dir.join("shot.png");
    let (w, h, px) = screenshot(&bin, &tmpdir("profile"), &url, &png);
    assert_eq!((w, h), (1200, 800));
    let nonwhite = nonwhite(&px);
    assert!(
        nonwhite > w * h / 50,
        "screenshot looks blank: {nonwhite} non-white pixels"
    );
    // the NaN color (#dc2626) is on screen: the first non-finite marker and the NaN bars
    let red = red(&px);
    assert!(red > 100, "no red marks in the screenshot ({red} px)");
    // DOM: the marked first non-finite op is the one trace.json names
    let dom = dump_dom(&bin, &tmpdir("profile"), &url);
    let label = j["first_nonfinite"]["label"].as_str().unwrap();
    assert_eq!(label, "layer0.attn.mask_fill");
    let marker = dom
        .split(r#"id="first-nonfinite-marker""#)
        .nth(1)
        .expect("first non-finite marker in the DOM");
    assert!(
        marker[..marker.find("</g>").unwrap()].contains(&format!("\"{label}\"")),
        "marker does not name {label}"
    );
    let row = dom
        .split(r#"data-first-nonfinite="true""#)
        .nth(1)
        .expect("highlighted table row");
    assert!(row[..row.find("</tr>").unwrap()].contains(label));
}
