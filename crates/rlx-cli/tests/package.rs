//! Packages end to end: a package compiled from each transformer fixture and from a model-zoo
//! light model gives the same outputs (bitwise, on the CPU) as running the model directly,
//! through the CLI (`rlx compile` + `rlx run`/`rlx-run`) and through the library
//! (`save_package` + `load_package`); the transformer outputs also match onnxruntime's.
//! CLI forms of the input check and of the load errors.

mod common;
use common::*;
use rlx_cli::npy::{read_npy, write_npy};
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::Tensor;
use rlx_runtime::{load_package, save_package, Device};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    common::scratch_dir("rlx-cli-package").join(name)
}

fn rlx(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(bin);
    c.args(args).current_dir(repo());
    for v in [
        "RLX_DEBUG_NANS",
        "RLX_LINT_NUMERICS",
        "RLX_RUNTIME_CHECK_INPUTS",
        "RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run rlx");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

const RLX: &str = env!("CARGO_BIN_EXE_rlx");
const RLX_RUN: &str = env!("CARGO_BIN_EXE_rlx-run");

/// Element bits, so NaN payloads and signed zeros compare exactly.
fn bits(t: &Tensor) -> (Vec<usize>, rlx_ir::DType, Vec<u64>) {
    let d = t.data();
    let v = (0..t.numel())
        .map(|i| match d {
            rlx_ir::TensorData::F32(v) => v[i].to_bits() as u64,
            _ => d.get_f64(i).to_bits(),
        })
        .collect();
    (t.dims().to_vec(), t.dtype(), v)
}

/// `--input name=file` for each `input_<name>.npy` of `dir` (positional `input_0.npy`
/// for the model-zoo folders, whose file names are not input names).
fn input_args(dir: &Path, names: &[String]) -> Vec<String> {
    let mut v = vec![];
    for n in names {
        let p = dir.join(format!("input_{n}.npy"));
        if p.is_file() {
            v.push(format!("--input={n}={}", p.display()));
        }
    }
    if v.is_empty() && dir.join("input_0.npy").is_file() {
        v.push(format!("--input={}", dir.join("input_0.npy").display()));
    }
    v
}

fn package_matches_direct(rel: &str, onnxruntime_expected: bool) {
    let Some(dir) = fixture(rel) else { return };
    let tag = rel.replace('/', "_");
    // ---- library: compile, save, load, run both ----
    let mut s = compile(&dir, DebugMode::Off);
    let names: Vec<String> = s.inputs().into_iter().map(|(n, _)| n).collect();
    let f: Vec<(String, Tensor)> = if dir.join("input_0.npy").is_file() {
        vec![(
            names[0].clone(),
            read_npy(&dir.join("input_0.npy")).unwrap(),
        )]
    } else {
        feeds(&s, &dir, "input_")
    };
    let direct = run(&mut s, &f);
    let pkg = tmp(&format!("{tag}.rlxpkg"));
    save_package(&s, &pkg).unwrap();
    let mut l = load_package(&pkg, Device::Cpu).unwrap();
    l.set_print_reports(false);
    l.set_check_inputs(Some(true));
    let loaded = run(&mut l, &f);
    assert_eq!(direct.len(), loaded.len());
    for (k, (a, b)) in direct.iter().zip(&loaded).enumerate() {
        assert!(
            bits(a) == bits(b),
            "{rel}: output {k} differs after a package round trip"
        );
    }
    if onnxruntime_expected {
        for ((oname, _), got) in l.outputs().iter().zip(&loaded) {
            let want = read_npy(&dir.join(format!("expected_{oname}.npy"))).unwrap();
            assert_close(&format!("{rel}/{oname} (package)"), got, &want, 1e-4, 1e-5);
        }
    }
    // ---- CLI: rlx compile, then rlx run on the folder and rlx-run on the package ----
    let cli_pkg = tmp(&format!("{tag}.cli.rlxpkg"));
    let (code, _, err) = rlx(
        RLX,
        &[
            "compile",
            dir.to_str().unwrap(),
            "--device",
            "cpu",
            "-o",
            cli_pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{rel}: rlx compile: {err}");
    let ins = input_args(&dir, &names);
    let out_a = tmp(&format!("{tag}.direct"));
    let out_b = tmp(&format!("{tag}.pkg"));
    let mut args_a: Vec<&str> = vec!["run", dir.to_str().unwrap(), "-q", "--output-dir"];
    args_a.push(out_a.to_str().unwrap());
    args_a.extend(ins.iter().map(String::as_str));
    let (code, _, err) = rlx(RLX, &args_a, &[]);
    assert_eq!(code, 0, "{rel}: rlx run model: {err}");
    let mut args_b: Vec<&str> = vec![cli_pkg.to_str().unwrap(), "-q", "--output-dir"];
    args_b.push(out_b.to_str().unwrap());
    args_b.extend(ins.iter().map(String::as_str));
    let (code, _, err) = rlx(RLX_RUN, &args_b, &[("RLX_RUNTIME_CHECK_INPUTS", "1")]);
    assert_eq!(code, 0, "{rel}: rlx-run package: {err}");
    let mut n = 0;
    for e in std::fs::read_dir(&out_a).unwrap().flatten() {
        let a = std::fs::read(e.path()).unwrap();
        let b = std::fs::read(out_b.join(e.file_name())).unwrap();
        assert!(a == b, "{rel}: {:?} differs", e.file_name());
        n += 1;
    }
    assert_eq!(n, l.outputs().len(), "{rel}: every output written");
}

#[test]
fn bert_tiny_package_matches_direct_run() {
    package_matches_direct("fixtures/transformers/bert_tiny", true);
}

#[test]
fn qwen3_tiny_package_matches_direct_run() {
    package_matches_direct("fixtures/transformers/qwen3_tiny", true);
}

#[test]
fn t5_tiny_package_matches_direct_run() {
    package_matches_direct("fixtures/transformers/t5_tiny", true);
}

#[test]
fn model_zoo_squeezenet_package_matches_direct_run() {
    package_matches_direct("fixtures/large/light/squeezenet", false);
}

#[test]
fn cli_input_check_and_load_errors() {
    let Some(dir) = fixture("fixtures/transformers/bert_tiny") else {
        return;
    };
    let pkg = tmp("bert_check.rlxpkg");
    let (code, _, err) = rlx(
        RLX,
        &[
            "compile",
            dir.to_str().unwrap(),
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    // A float32 file with one token too many for input_ids.
    let bad = tmp("bad_ids.npy");
    write_npy(&bad, &Tensor::from_f32(&[2, 17], vec![0.0; 34]).unwrap()).unwrap();
    let spec = format!("input_ids={}", bad.display());
    let (code, _, err) = rlx(
        RLX,
        &["run", pkg.to_str().unwrap(), "--input", &spec],
        &[("RLX_RUNTIME_CHECK_INPUTS", "1")],
    );
    assert_eq!(code, 1, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx input-check"))
        .collect();
    assert_eq!(
        lines,
        vec![
            r#"rlx input-check: inputs[0] "input_ids": unmatched dtype, expected: i64, but got: f32"#,
            r#"rlx input-check: inputs[0] "input_ids": unmatched dim 1 ("sequence"), expected: 16, but got: 17"#,
        ],
        "{err}"
    );
    // Unchecked: one line naming the input and the file.
    let (code, _, err) = rlx(RLX, &["run", pkg.to_str().unwrap(), "--input", &spec], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("input \"input_ids\": the package expects i64[2,16]"),
        "{err}"
    );
    // A truncated package.
    let bytes = std::fs::read(&pkg).unwrap();
    let t = tmp("bert_trunc.rlxpkg");
    std::fs::write(&t, &bytes[..bytes.len() / 2]).unwrap();
    let (code, _, err) = rlx(RLX, &["run", t.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&t.display().to_string()) && err.contains("not a readable RLX package"),
        "{err}"
    );
    // --dim cannot rebind a compiled package.
    let (code, _, err) = rlx(
        RLX,
        &["run", pkg.to_str().unwrap(), "--dim", "batch=3"],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("fixed when it was compiled"), "{err}");
}

/// A package's run: `--input x=` names no file (was "cannot read : No such file"), and an
/// input generated for want of a file gets one line on stderr saying so.
#[test]
fn package_input_with_no_file_and_generated_inputs_are_said() {
    let pkg = tmp("healthy_mlp_inputs.rlxpkg");
    let (code, _, err) = rlx(
        RLX,
        &[
            "compile",
            "examples/healthy_mlp",
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let p = pkg.to_str().unwrap();
    let (code, _, err) = rlx(RLX, &["run", p, "--input", "x="], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(r#"--input "x=": no file after '='"#), "{err}");
    let (code, _, err) = rlx(RLX, &["run", p, "--seed", "3"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(r#"rlx: input "x" f32[4,16] generated (seed 3): no --input given"#),
        "{err}"
    );
    let (code, _, err) = rlx(RLX, &["run", p, "-q"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("generated"), "{err}");
}
