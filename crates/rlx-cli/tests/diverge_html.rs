//! `rlx diverge --html DIR`: diverge.html and diverge.json, checked against facts from an
//! independent path (the text report's first diverging node and its node count), and
//! diverge.html rendered in headless Chromium.
//!
//! Needs a wgpu adapter (lavapipe in CI): without one the GPU tests skip, unless
//! `RLX_REQUIRE_GPU=1`. The Chromium test skips without /usr/bin/chromium unless
//! `RLX_REQUIRE_CHROMIUM=1`.

mod common;

use common::chromium::{chromium, dump_dom, nonwhite, red, screenshot};
use common::{gpu, repo, TmpDir};
use serde_json::Value;

use std::process::Command;

fn tmpdir(tag: &str) -> TmpDir {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!(
        "rlx-diverge-html-{tag}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

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

/// From the text report: the compute node count `M` of "(N/M nodes on wgpu)".
fn nodes_total(out: &str) -> usize {
    let s = out
        .split(" vs cpu (")
        .nth(1)
        .expect("a compared backend line");
    let s = &s[s.find('/').unwrap() + 1..];
    s[..s.find(' ').unwrap()].parse().unwrap()
}

/// From the text report: the first diverging node's label ("first divergence at %47 MatMul
/// \"LABEL\" ...").
fn first_label(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.contains("first divergence at"))
        .unwrap_or_else(|| panic!("no localization: {out}"));
    line.split('"').nth(1).unwrap().to_string()
}

/// `rlx diverge bert_tiny --backends wgpu --html DIR` with the planted MatMul bug; returns
/// (DIR, stdout, html, json).
fn planted() -> (TmpDir, String, String, Value) {
    let dir = tmpdir("planted");
    let d = dir.to_str().unwrap();
    let (code, out, err) = diverge(
        &[
            "fixtures/transformers/bert_tiny",
            "--backends",
            "wgpu",
            "--html",
            d,
        ],
        Some("matmul_drop_last_k"),
    );
    assert_eq!(code, 1, "{out}{err}");
    let html = std::fs::read_to_string(dir.join("diverge.html")).expect("diverge.html");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("diverge.json")).unwrap()).unwrap();
    (dir, out, html, json)
}

#[test]
fn planted_bug_picture_highlights_the_first_diverging_matmul() {
    if !gpu() {
        return;
    }
    let (_dir, out, html, json) = planted();
    // self-contained: no network resource of any kind
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(!html.contains("<script"), "no script needed");
    // one bar per compute node, as many as the text report counts
    let m = nodes_total(&out);
    assert!(m > 100, "{out}");
    assert_eq!(html.matches(r#"<rect class="bar""#).count(), m);
    let nodes = json["backends"][0]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), m);
    // the verdict at the top, before the chart
    let verdict = html.find("SUSPECT").expect("verdict");
    assert!(verdict < html.find("<svg").unwrap());
    // the first diverging node, named by the text report, is marked in the chart and the table
    let label = first_label(&out);
    assert!(
        label.contains("/encoder/layer.0/attention/self/"),
        "{label}"
    );
    let marker = html
        .split(r#"id="first-divergence-marker-wgpu""#)
        .nth(1)
        .expect("first divergence marker");
    let marker = &marker[..marker.find("</g>").unwrap()];
    assert!(marker.contains(&format!("\"{label}\"")), "{marker}");
    assert!(marker.contains("MatMul"), "{marker}");
    let row = html
        .split(r#"data-first-divergence="true""#)
        .nth(1)
        .expect("highlighted row");
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains(&label) && row.contains("MatMul"), "{row}");
    assert_eq!(html.matches(r#"data-first-divergence="true""#).count(), 1);
    // the highlighted bar is the red one
    let bars: Vec<&str> = html
        .split(r#"<rect class="bar""#)
        .skip(1)
        .filter(|b| b.contains("fill=\"#dc2626\""))
        .collect();
    assert_eq!(bars.len(), 1);
    assert!(bars[0].contains(&label), "{}", bars[0]);
    // the JSON's nodes name the same node with a large own (replayed) error
    let n = nodes
        .iter()
        .find(|n| n["label"] == label.as_str())
        .expect("node in json");
    assert_eq!(n["op"], "MatMul");
    assert!(n["own"]["rel"].as_f64().unwrap() > 2e-3, "{n}");
}

#[test]
fn round_off_picture_has_no_highlight() {
    if !gpu() {
        return;
    }
    let dir = tmpdir("roundoff");
    let (code, out, err) = diverge(
        &[
            "fixtures/transformers/bert_tiny",
            "--backends",
            "wgpu",
            "--html",
            dir.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    let html = std::fs::read_to_string(dir.join("diverge.html")).unwrap();
    assert!(html.contains("round-off"));
    assert!(!html.contains("SUSPECT"));
    assert!(!html.contains("first-divergence-marker"));
    assert_eq!(
        html.matches(r#"<rect class="bar""#).count(),
        nodes_total(&out)
    );
}

/// A NaN fed to healthy_mlp reaches its Relu; the planted `relu_drops_nan` wgpu kernel turns
/// it into 0. The picture marks that node (named by the text report) and every node after it
/// as NaN/Inf on one side only.
#[test]
fn nan_on_one_side_is_marked() {
    if !gpu() {
        return;
    }
    let dir = tmpdir("nan");
    let mut b = std::fs::read(repo().join("examples/healthy_mlp/input_x.npy")).unwrap();
    let data = 10 + u16::from_le_bytes([b[8], b[9]]) as usize;
    assert!(String::from_utf8_lossy(&b[10..data]).contains("'<f4'"));
    b[data..data + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let x = dir.join("x_nan.npy");
    std::fs::write(&x, &b).unwrap();
    let out_dir = dir.join("report");
    let (code, out, err) = diverge(
        &[
            "examples/healthy_mlp",
            "--input",
            &format!("x={}", x.display()),
            "--backends",
            "wgpu",
            "--html",
            out_dir.to_str().unwrap(),
        ],
        Some("relu_drops_nan"),
    );
    assert_eq!(code, 1, "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.contains("kernel bug candidate"))
        .unwrap_or_else(|| panic!("no localization: {out}"));
    assert!(line.contains("dropped a NaN"), "{line}");
    let label = line.split('"').nth(1).unwrap();
    let html = std::fs::read_to_string(out_dir.join("diverge.html")).unwrap();
    assert!(html.contains(r#"class="nfmark""#));
    let row = html
        .split(r#"data-first-divergence="true""#)
        .nth(1)
        .expect("highlighted row");
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains(label) && row.contains("dropped a NaN"),
        "{row}"
    );
    let nf_rows = html.matches(r#"class="nf""#).count();
    assert!(
        nf_rows >= 1,
        "nodes after the Relu carry the NaN on one side only"
    );
}

#[test]
fn bad_html_path_is_one_clear_error_before_the_runs() {
    let dir = tmpdir("bad");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for (path, says) in [
        (file.clone(), "is a file, not a directory"),
        (file.join("sub"), "cannot create the directory"),
    ] {
        let (code, out, err) = diverge(
            &[
                "fixtures/transformers/bert_tiny",
                "--html",
                path.to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(code, 2, "{out}{err}");
        assert!(out.is_empty(), "no run before the check: {out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--html") && err.contains(says), "{err}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

// ---------------------------------------------------------------------------------------------
// headless Chromium (helpers in tests/common/chromium.rs)

#[test]
fn picture_renders_in_headless_chromium() {
    if !gpu() {
        return;
    }
    let Some(bin) = chromium() else { return };
    let (dir, out, _, _) = planted();
    let url = format!(
        "file://{}",
        dir.join("diverge.html").canonicalize().unwrap().display()
    );
    let png = dir.join("shot.png");
    let (w, h, px) = screenshot(&bin, &tmpdir("profile"), &url, &png);
    assert_eq!((w, h), (1200, 800));
    let nonwhite = nonwhite(&px);
    assert!(
        nonwhite > w * h / 20,
        "screenshot looks blank: {nonwhite} non-white pixels"
    );
    // the first divergence color (#dc2626) is on screen: its bar, marker and label
    let red = red(&px);
    assert!(red > 100, "no red highlight in the screenshot ({red} px)");
    // DOM as rendered: the marker names the text report's node
    let dom = dump_dom(&bin, &tmpdir("profile"), &url);
    let label = first_label(&out);
    let marker = dom
        .split(r#"id="first-divergence-marker-wgpu""#)
        .nth(1)
        .expect("first divergence marker in the DOM");
    assert!(
        marker[..marker.find("</g>").unwrap()].contains(&format!("\"{label}\"")),
        "marker does not name {label}"
    );
}

#[test]
fn an_unwritable_json_path_is_refused_before_the_html_is_written() {
    let dir = tmpdir("json");
    let html = dir.join("report");
    for j in [
        "/proc/nope.json".to_string(),
        dir.join("missing/d.json").display().to_string(),
    ] {
        let (code, out, err) = diverge(
            &[
                "examples/healthy_mlp",
                "--html",
                html.to_str().unwrap(),
                "--json",
                &j,
            ],
            None,
        );
        assert_eq!(code, 2, "{out}{err}");
        assert!(out.is_empty(), "no run before the check: {out}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--json"), "{err}");
        assert!(!html.exists(), "{} was written", html.display());
    }
}
