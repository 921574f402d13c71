//! `rlx reduce` end to end: every example with a NaN/Inf reduces to a repro of a handful of
//! nodes that, run alone, names the culprit the full model's report names (and that
//! `examples/*/expect.json` declares: derived from onnx's reference evaluator, not from RLX);
//! onnxruntime loads the repro and produces the NaN/Inf too; a planted wgpu kernel bug
//! reduces to a repro that still diverges; bad arguments are one clear error each.
//!
//! The onnxruntime checks use `.venv/bin/python` (scripts/setup-venv.sh) and skip without
//! it, unless RLX_REQUIRE_NUMPY=1 (CI), where they fail. The wgpu test skips without an
//! adapter unless RLX_REQUIRE_GPU=1.

mod common;
use common::{fixture, gpu, repo, TmpDir};
use prost::Message;
use rlx_onnx_import::proto::ModelProto;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(tag: &str) -> TmpDir {
    let p = std::env::temp_dir().join(format!("rlx-reduce-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    TmpDir(p)
}

/// Run `rlx ARGS` in the repo root with `env`; (exit code, stdout, stderr).
fn rlx(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx"));
    c.args(args).current_dir(repo());
    c.env_remove("RLX_DEBUG_NANS")
        .env_remove("RLX_TEST_PLANTED_BUG");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run rlx");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert!(!err.contains("panicked"), "rlx {args:?} panicked: {err}");
    (o.status.code().unwrap_or(-1), out, err)
}

fn expect(name: &str, key: &str) -> String {
    let p = repo().join("examples").join(name).join("expect.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: {key}"))
        .to_string()
}

/// The label in the first `rlx nan-check: KIND at ... "label"` line of `err` for `kind`
/// (`NaN`, or `inf` for either sign).
fn first_report(err: &str, kind: &str) -> Option<String> {
    err.lines()
        .filter(|l| l.starts_with("rlx nan-check: ") && !l.contains(" note: "))
        .find(|l| l.contains(&format!(" {kind} at ")) || (kind == "inf" && l.contains("inf at ")))
        .and_then(|l| {
            l.rsplit_once(" \"")
                .map(|(_, r)| r.trim_end_matches('"').to_string())
        })
}

fn onnx_nodes(p: &Path) -> Vec<(String, String)> {
    let m = ModelProto::decode(&std::fs::read(p).unwrap()[..]).unwrap();
    m.graph
        .unwrap()
        .node
        .into_iter()
        .map(|n| (n.name, n.op_type))
        .collect()
}

fn python() -> Option<PathBuf> {
    let venv = repo().join(".venv/bin/python");
    let ok = venv.is_file()
        && Command::new(&venv)
            .args(["-c", "import numpy, onnxruntime"])
            .status()
            .is_ok_and(|s| s.success());
    if ok {
        return Some(venv);
    }
    assert!(
        !rlx_ir::env::is_on("RLX_REQUIRE_NUMPY"),
        "RLX_REQUIRE_NUMPY=1 but {} has no numpy/onnxruntime",
        venv.display()
    );
    use std::io::Write; // past the test harness's capture: the skip shows in CI logs
    let _ = writeln!(
        std::io::stderr(),
        "skipping the onnxruntime check of {}: no .venv with onnxruntime",
        std::thread::current().name().unwrap_or("?")
    );
    None
}

/// Run the repro in onnxruntime; returns (NaN count, Inf count) over its outputs.
fn ort_nonfinite(py: &Path, dir: &Path) -> (usize, usize) {
    let script = r#"
import sys, glob, os, numpy as np, onnxruntime as ort
d = sys.argv[1]
s = ort.InferenceSession(os.path.join(d, "model.onnx"), providers=["CPUExecutionProvider"])
feeds = {}
for i in s.get_inputs():
    safe = "".join(c if (c.isalnum() and c.isascii()) or c in "._-" else "_" for c in i.name)
    feeds[i.name] = np.load(os.path.join(d, "input_" + safe + ".npy"))
nan = inf = 0
for v in s.run(None, feeds):
    if v.dtype.kind == "f":
        nan += int(np.isnan(v).sum()); inf += int(np.isinf(v).sum())
print(nan, inf)
"#;
    let o = Command::new(py)
        .args(["-c", script])
        .arg(dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "onnxruntime on {}: {out}{}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Vec<usize> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// Reduce `examples/NAME` with `--until KIND`, and check the repro: a handful of nodes, the
/// culprit kept, the same culprit named when run alone, and onnxruntime's NaN/Inf.
fn reduces(name: &str, until: &str, key: &str, max_nodes: usize) {
    let ex = format!("examples/{name}");
    let want = expect(name, key);
    // The full model's own report names the culprit too.
    let (strict, kind) = if until == "nan" {
        ("1", "NaN")
    } else {
        ("strict", "inf")
    };
    let (_, _, err) = rlx(&["run", &ex], &[("RLX_DEBUG_NANS", strict)]);
    assert_eq!(
        first_report(&err, kind).as_deref(),
        Some(want.as_str()),
        "{err}"
    );

    let dir = tmp(name);
    let d = dir.0.display().to_string();
    let (code, out, err) = rlx(&["reduce", &ex, "--until", until, "-o", &d], &[]);
    assert_eq!(code, 0, "{name}: {out}{err}");
    assert!(out.contains("rlx reduce: "), "{out}");
    let nodes = onnx_nodes(&dir.join("model.onnx"));
    assert!(
        !nodes.is_empty() && nodes.len() <= max_nodes,
        "{name}: {nodes:?}"
    );
    assert!(nodes.iter().any(|(n, _)| *n == want), "{name}: {nodes:?}");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains(&want) && readme.contains(&ex), "{readme}");
    assert!(readme.contains("onnxruntime"), "{readme}");
    // Alone, as a user would run it.
    let (_, _, err) = rlx(&["run", &d], &[("RLX_DEBUG_NANS", strict)]);
    assert_eq!(
        first_report(&err, kind).as_deref(),
        Some(want.as_str()),
        "{name}: repro: {err}"
    );
    if let Some(py) = python() {
        let (nan, inf) = ort_nonfinite(&py, &dir);
        if until == "nan" {
            assert!(nan > 0, "{name}: onnxruntime gives no NaN");
        } else {
            assert!(inf > 0, "{name}: onnxruntime gives no Inf");
        }
    }
    eprintln!(
        "{name}: {} -> {} nodes ({})",
        onnx_nodes(&repo().join(&ex).join("model.onnx")).len(),
        nodes.len(),
        out.lines().next().unwrap_or("")
    );
}

#[test]
fn attention_masked_nan_reduces_to_the_softmax() {
    reduces("attention_masked_nan", "nan", "nan_origin", 3);
}

#[test]
fn rmsnorm_eps0_nan_reduces_to_the_div() {
    reduces("rmsnorm_eps0_nan", "nan", "nan_origin", 3);
}

#[test]
fn rmsnorm_rsqrt_inf_nan_reduces_to_the_mul() {
    reduces("rmsnorm_rsqrt_inf_nan", "nan", "nan_origin", 3);
}

#[test]
fn cast_f16_overflow_reduces_to_the_f16_softmax() {
    reduces("cast_f16_overflow", "nan", "nan_origin", 3);
}

#[test]
fn f16_activation_growth_reduces_to_the_overflowing_mul() {
    reduces("f16_activation_growth", "inf", "inf_origin", 3);
}

#[test]
fn no_failure_writes_nothing_and_exits_1() {
    let dir = tmp("healthy");
    let d = dir.0.display().to_string();
    let (code, out, err) = rlx(
        &["reduce", "examples/healthy_mlp", "--until", "nan", "-o", &d],
        &[],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("does not fail"), "{out}{err}");
    assert!(!dir.exists());
    // Inf only: no NaN anywhere in f16_activation_growth.
    let (code, out, _) = rlx(
        &[
            "reduce",
            "examples/f16_activation_growth",
            "--until",
            "nan",
            "-o",
            &d,
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(!dir.exists());
}

#[test]
fn an_existing_folder_needs_force() {
    let dir = tmp("force");
    let d = dir.0.display().to_string();
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::write(dir.join("README.md"), "mine").unwrap();
    std::fs::write(dir.join("input_stale.npy"), "old").unwrap();
    let args = [
        "reduce",
        "examples/rmsnorm_eps0_nan",
        "--until",
        "nan",
        "-o",
        &d,
    ];
    let (code, out, err) = rlx(&args, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("--force") && err.lines().count() == 1, "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "mine"
    );
    let mut forced = args.to_vec();
    forced.push("--force");
    let (code, out, err) = rlx(&forced, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(dir.join("model.onnx").is_file());
    assert!(!dir.join("input_stale.npy").exists());
    assert_ne!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "mine"
    );
}

#[test]
fn bad_arguments_are_one_clear_error_each() {
    let dir = tmp("bad");
    let d = dir.0.display().to_string();
    let ex = "examples/rmsnorm_eps0_nan";
    let (code, _, err) = rlx(
        &[
            "reduce",
            ex,
            "--until",
            "nan",
            "-o",
            &d,
            "--input",
            "x=/nonexistent/x.npy",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/x.npy"), "{err}");
    let x = format!("{ex}/input_x.npy");
    let wrong = format!("nope={x}");
    let (code, _, err) = rlx(
        &["reduce", ex, "--until", "nan", "-o", &d, "--input", &wrong],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no input named \"nope\""), "{err}");
    let (code, _, err) = rlx(&["reduce", ex, "--until", "overflow", "-o", &d], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown kind \"overflow\""), "{err}");
    let (code, _, err) = rlx(
        &["reduce", "/nonexistent/m.onnx", "--until", "nan", "-o", &d],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/m.onnx"), "{err}");
    // A torch.export program: not yet, one line saying so.
    let (code, _, err) = rlx(
        &["reduce", "/nonexistent/m.pt2", "--until", "nan", "-o", &d],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not reduce .pt2 programs yet") && err.lines().count() == 1,
        "{err}"
    );
    let (code, _, err) = rlx(&["reduce", ex, "--until", "diverge:cpu", "-o", &d], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the CPU is the oracle"), "{err}");
    assert!(!dir.exists());
}

/// `--until error:TEXT`: a node whose op type RLX does not know reduces to that node alone.
#[test]
fn an_import_error_reduces_to_the_node_it_names() {
    let src = tmp("err-src");
    std::fs::create_dir_all(&src.0).unwrap();
    let ex = repo().join("examples/rmsnorm_eps0_nan");
    let mut m = ModelProto::decode(&std::fs::read(ex.join("model.onnx")).unwrap()[..]).unwrap();
    let g = m.graph.as_mut().unwrap();
    let k = g
        .node
        .iter()
        .position(|n| n.name == "layer0.rms_norm.sqrt")
        .unwrap();
    g.node[k].op_type = "NotAnOnnxOp".into();
    std::fs::write(src.join("model.onnx"), m.encode_to_vec()).unwrap();
    std::fs::copy(ex.join("input_x.npy"), src.join("input_x.npy")).unwrap();
    let dir = tmp("err");
    let d = dir.0.display().to_string();
    let s = src.0.display().to_string();
    let (code, out, err) = rlx(
        &["reduce", &s, "--until", "error:NotAnOnnxOp", "-o", &d],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let nodes = onnx_nodes(&dir.join("model.onnx"));
    assert_eq!(
        nodes,
        vec![(
            "layer0.rms_norm.sqrt".to_string(),
            "NotAnOnnxOp".to_string()
        )]
    );
    let (code, _, err) = rlx(&["run", &d], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("NotAnOnnxOp") && err.contains("layer0.rms_norm.sqrt"),
        "{err}"
    );
    // Another text: the model does not fail that way.
    let (code, out, _) = rlx(&["reduce", &s, "--until", "error:Gemm", "-o", &d], &[]);
    assert_eq!(code, 1, "{out}");
}

/// The label in `rlx diverge`'s `first divergence at %N Op "label"` line.
fn first_divergence(out: &str) -> Option<String> {
    let l = out.lines().find(|l| l.contains("first divergence at"))?;
    let rest = l.split_once(" \"")?.1;
    Some(rest.split_once('"')?.0.to_string())
}

#[test]
fn planted_wgpu_divergence_reduces_to_a_small_repro_that_still_diverges() {
    if !gpu() {
        return;
    }
    let Some(_) = fixture("fixtures/transformers/bert_tiny") else {
        return;
    };
    let bug = [("RLX_TEST_PLANTED_BUG", "matmul_drop_last_k")];
    let m = "fixtures/transformers/bert_tiny";
    let (code, out, err) = rlx(&["diverge", "-q", m, "--backends", "wgpu"], &bug);
    assert_eq!(code, 1, "{out}{err}");
    let want = first_divergence(&out).unwrap_or_else(|| panic!("{out}"));
    let dir = tmp("diverge");
    let d = dir.0.display().to_string();
    let (code, out, err) = rlx(&["reduce", m, "--until", "diverge:wgpu", "-o", &d], &bug);
    assert_eq!(code, 0, "{out}{err}");
    let nodes = onnx_nodes(&dir.join("model.onnx"));
    assert!(nodes.len() <= 3, "{nodes:?}");
    assert!(nodes.iter().any(|(n, _)| *n == want), "{want}: {nodes:?}");
    let (code, out, err) = rlx(&["diverge", "-q", &d, "--backends", "wgpu"], &bug);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        first_divergence(&out).as_deref(),
        Some(want.as_str()),
        "{out}"
    );
    // Without the planted bug the repro is round-off: the repro holds the bug, not the data.
    let (code, out, err) = rlx(&["diverge", "-q", &d, "--backends", "wgpu"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    // The README's command carries the planted bug, so it reproduces as written.
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        readme.contains("RLX_TEST_PLANTED_BUG=matmul_drop_last_k rlx diverge"),
        "{readme}"
    );
    // onnxruntime loads and runs the repro (its MatMul is correct: all finite).
    if let Some(py) = python() {
        assert_eq!(ort_nonfinite(&py, &dir), (0, 0));
    }
    eprintln!(
        "bert_tiny: {} -> {} nodes ({})",
        onnx_nodes(&repo().join(m).join("model.onnx")).len(),
        nodes.len(),
        out.lines().next().unwrap_or("")
    );
}

/// ddmin finds a 1-minimal subset: here exactly the two items the test needs.
#[test]
fn ddmin_finds_the_needed_items() {
    let mut runs = 0;
    let got = rlx_cli::reduce::ddmin((0..40).collect(), &mut |s: &[usize]| {
        runs += 1;
        (s.contains(&3) && s.contains(&31)).then(|| s.to_vec())
    });
    assert_eq!(got, vec![3, 31]);
    assert!(runs < 100, "{runs} tests");
    // A test that reports the smaller set it really used shrinks faster.
    let got = rlx_cli::reduce::ddmin((0..40).collect(), &mut |s: &[usize]| {
        s.contains(&7).then(|| vec![7])
    });
    assert_eq!(got, vec![7]);
}

/// A NaN that the input data already holds was created by no node: nothing to reduce.
#[test]
fn a_nan_in_the_input_data_is_not_reduced() {
    let src = tmp("nan-input");
    std::fs::create_dir_all(&src.0).unwrap();
    let ex = repo().join("examples/healthy_mlp");
    std::fs::copy(ex.join("model.onnx"), src.join("model.onnx")).unwrap();
    let mut v = vec![0.5f32; 4 * 16];
    v[5] = f32::NAN;
    let t = rlx_ir::Tensor::new(vec![4, 16], rlx_ir::TensorData::F32(v)).unwrap();
    rlx_cli::npy::write_npy(&src.join("input_x.npy"), &t).unwrap();
    let dir = tmp("nan-input-out");
    let (s, d) = (src.0.display().to_string(), dir.0.display().to_string());
    let (code, out, err) = rlx(&["reduce", &s, "--until", "nan", "-o", &d], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("graph input or initializer \"x\""), "{err}");
    assert!(!dir.exists());
}

#[test]
fn the_repro_may_not_replace_the_model_being_reduced() {
    let t = tmp("selfcopy");
    let m = t.join("selfcopy");
    std::fs::create_dir_all(&m).unwrap();
    for e in std::fs::read_dir(repo().join("examples/attention_masked_nan"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(e.path(), m.join(e.file_name())).unwrap();
    }
    let before: Vec<(std::ffi::OsString, Vec<u8>)> = {
        let mut v: Vec<_> = std::fs::read_dir(&m)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    let d = m.display().to_string();
    let model = m.join("model.onnx").display().to_string();
    for args in [
        vec![
            "reduce",
            d.as_str(),
            "--until",
            "nan",
            "-o",
            d.as_str(),
            "--force",
        ],
        vec![
            "reduce",
            model.as_str(),
            "--until",
            "nan",
            "-o",
            d.as_str(),
            "--force",
        ],
    ] {
        let (code, out, err) = rlx(&args, &[]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            err.contains("is the folder of the model being reduced"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let mut after: Vec<_> = std::fs::read_dir(&m)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
        .collect();
    after.sort();
    assert!(before == after, "the model's folder changed");
}

#[test]
fn the_readme_ends_with_a_newline_and_negative_tol_rel_is_the_commands_error() {
    let dir = tmp("newline");
    let d = dir.0.display().to_string();
    let (code, out, err) = rlx(
        &[
            "reduce",
            "examples/attention_masked_nan",
            "--until",
            "nan",
            "-o",
            &d,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        readme.ends_with("```\n") && !readme.ends_with("\n\n"),
        "README.md does not end with one newline: {:?}",
        &readme[readme.len().saturating_sub(20)..]
    );
    let (code, _, err) = rlx(
        &[
            "reduce",
            "examples/attention_masked_nan",
            "--until",
            "diverge",
            "--tol-rel",
            "-1",
            "-o",
            &format!("{d}-neg"),
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--tol-rel -1: must be a positive number"),
        "{err}"
    );
}
