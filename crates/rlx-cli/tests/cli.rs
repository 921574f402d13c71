//! The `rlx-run` / `rlx` binaries end to end.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rlx_run(args: &[&str], nans: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx-run"));
    c.args(args).current_dir(repo());
    c.env_remove("RLX_DEBUG_NANS")
        .env_remove("RLX_LINT_NUMERICS");
    if let Some(v) = nans {
        c.env("RLX_DEBUG_NANS", v);
    }
    let o = c.output().expect("run rlx-run");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn nan_example_names_the_softmax_and_the_mask() {
    let (code, out, err) = rlx_run(&["examples/attention_masked_nan"], Some("1"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("rlx nan-check: NaN at index"), "{err}");
    assert!(err.contains("\"layer0.attn.softmax\""), "{err}");
    assert!(err.contains("layer0.attn.mask_fill"), "{err}");
    assert!(err.contains("fix: "), "{err}");
    assert!(out.contains("output: f32[2,4,8]"), "{out}");
    // Downstream ops are not blamed: exactly one report.
    assert_eq!(err.matches("rlx nan-check: NaN").count(), 1, "{err}");
}

#[test]
fn abort_exits_nonzero_with_the_report() {
    let (code, _, err) = rlx_run(&["examples/rmsnorm_eps0_nan"], Some("abort"));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("\"layer0.rms_norm.div\""), "{err}");
}

#[test]
fn unset_prints_no_scan_output() {
    let (code, _, err) = rlx_run(&["examples/attention_masked_nan"], None);
    assert_eq!(code, 0);
    assert!(!err.contains("nan-check"), "{err}");
}

#[test]
fn writes_outputs_and_json_report() {
    let dir = std::env::temp_dir().join(format!("rlx-cli-test-{}", std::process::id()));
    let report = dir.join("r.json");
    std::fs::create_dir_all(&dir).unwrap();
    let (code, _, err) = rlx_run(
        &[
            "examples/rmsnorm_eps0_nan",
            "--output-dir",
            dir.to_str().unwrap(),
            "--nan-report",
            report.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let y = rlx_cli::npy::read_npy(&dir.join("y.npy")).unwrap();
    let want =
        rlx_cli::npy::read_npy(&repo().join("examples/rmsnorm_eps0_nan/expected_y.npy")).unwrap();
    assert_eq!(y.dims(), want.dims());
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(j["reports"][0]["label"], "layer0.rms_norm.div");
    assert_eq!(j["reports"][0]["cause"]["kind"], "inputs_finite");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let (code, _, err) = rlx_run(&["examples/nope"], None);
    assert_eq!(code, 1);
    assert!(err.starts_with("rlx: error:"), "{err}");
    let (code, _, err) = rlx_run(
        &[
            "examples/healthy_mlp",
            "--input",
            "nosuch=examples/healthy_mlp/input_x.npy",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("no input named \"nosuch\""), "{err}");
    let (code, _, err) = rlx_run(
        &[
            "examples/healthy_mlp",
            "--input",
            "x=examples/attention_masked_nan/input_attention_mask.npy",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("input \"x\""), "{err}");
}

/// `--input x=` names no file: the error says so (it said "cannot read : No such file or
/// directory"), as does an empty `--input ""`.
#[test]
fn input_with_no_file_is_named_as_such() {
    for (spec, want) in [
        ("x=", r#"--input "x=": no file after '='"#),
        ("", r#"--input "": no file given"#),
    ] {
        let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--input", spec], None);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(want), "--input {spec:?}: {err}");
        assert!(!err.contains("cannot read"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// A model folder's entry named like an input file that is not a regular file (a folder
/// named `input_x.npy`) is an error naming it (it was skipped, and the input generated
/// without a word); a generated input gets one line on stderr saying so.
#[test]
fn folder_input_that_is_no_file_is_refused_and_generated_inputs_are_said() {
    let dir = std::env::temp_dir().join(format!("rlx-cli-folder-input-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("examples/healthy_mlp/model.onnx"),
        dir.join("model.onnx"),
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    // No input file: generated, one line says so (with its shape and seed).
    let (code, _, err) = rlx_run(&[d, "--seed", "7"], None);
    assert_eq!(code, 0, "{err}");
    let want = r#"rlx: input "x" f32[4,16] generated (seed 7): no --input or input_x.npy given"#;
    assert_eq!(err.lines().filter(|l| *l == want).count(), 1, "{err}");
    // The model file, not its folder: no folder to look in.
    let file = dir.join("model.onnx");
    let (code, _, err) = rlx_run(&[file.to_str().unwrap()], None);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(r#"rlx: input "x" f32[4,16] generated (seed 0): no --input given"#),
        "{err}"
    );
    // -q, or the input given: no line.
    let (code, _, err) = rlx_run(&[d, "-q"], None);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("generated"), "{err}");
    let given = "x=examples/healthy_mlp/input_x.npy";
    let (code, _, err) = rlx_run(&[d, "--input", given], None);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("generated"), "{err}");
    // A folder named input_x.npy: refused, naming it, by run and by the other commands
    // that read the folder's inputs.
    let bad = dir.join("input_x.npy");
    std::fs::create_dir(&bad).unwrap();
    let want = format!("{} is not a regular file", bad.display());
    let (code, _, err) = rlx_run(&[d], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&want), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let trace_dir = dir.join("trace");
    for args in [
        vec!["lint", d],
        vec!["trace", d, "-o", trace_dir.to_str().unwrap()],
        vec!["diverge", d],
    ] {
        let cmd = args[0];
        let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(&args)
            .current_dir(repo())
            .env_remove("RLX_DEBUG_NANS")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "rlx {cmd}: {err}");
        assert!(err.contains(&want), "rlx {cmd}: {err}");
    }
    // An input given with --input does not read the folder's entry.
    let (code, _, err) = rlx_run(&[d, "--input", given], None);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn lint_subcommand() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["lint", "examples/const_fold_inf"])
        .current_dir(repo())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("rlx numeric-lint: %") && out.contains("const.inv_zero"),
        "{out}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["lint", "examples/healthy_mlp"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn lint_env_var_during_run() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx-run"));
    c.args(["examples/const_fold_inf", "-q"])
        .current_dir(repo())
        .env("RLX_LINT_NUMERICS", "1")
        .env_remove("RLX_DEBUG_NANS");
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rlx numeric-lint: %"), "{err}");
}

#[test]
fn hostile_files_and_dims_give_clean_errors() {
    let dir = std::env::temp_dir().join(format!("rlx-cli-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A .npy whose v2 header claims 4 GiB of header: refused before allocating.
    let bogus = dir.join("bogus.npy");
    let mut b = b"\x93NUMPY\x02\x00".to_vec();
    b.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    b.extend_from_slice(b"{}");
    std::fs::write(&bogus, &b).unwrap();
    let spec = format!("x={}", bogus.display());
    let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--input", &spec], None);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("input \"x\"") && err.contains("runs past the end"),
        "{err}"
    );
    // A unicode array (NumPy '<U3', 12 bytes per element): named as an unsupported dtype,
    // not as a size mismatch.
    let uni = dir.join("unicode.npy");
    let mut header = "{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&[0u8; 24]);
    std::fs::write(&uni, &b).unwrap();
    let spec = format!("x={}", uni.display());
    let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--input", &spec], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unsupported .npy dtype <U3"), "{err}");
    // Not a regular file.
    let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--input", "x=/dev/zero"], None);
    assert_eq!(code, 1);
    assert!(err.contains("not a regular file"), "{err}");
    // --threads 0.
    let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--threads", "0"], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("--threads 0: need at least one thread"),
        "{err}"
    );
    // A thread count from the environment that would swamp the machine is refused too
    // (100 000 threads made this 1-second run take minutes), for rlx-run and rlx trace;
    // --threads overrides it.
    let swamped = |bin: &str, args: &[&str]| {
        let o = Command::new(bin)
            .args(args)
            .current_dir(repo())
            .env("RAYON_NUM_THREADS", "100000")
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let trace_dir = dir.join("trace");
    let trace = [
        "trace",
        "examples/healthy_mlp",
        "-o",
        trace_dir.to_str().unwrap(),
    ];
    for (bin, args) in [
        (
            env!("CARGO_BIN_EXE_rlx-run"),
            &["examples/healthy_mlp", "-q"][..],
        ),
        (env!("CARGO_BIN_EXE_rlx"), &trace[..]),
    ] {
        let (code, err) = swamped(bin, args);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("RAYON_NUM_THREADS=100000: at most 1024"),
            "{err}"
        );
    }
    let (code, err) = swamped(
        env!("CARGO_BIN_EXE_rlx-run"),
        &["examples/healthy_mlp", "-q", "--threads", "2"],
    );
    assert_eq!(code, Some(0), "{err}");
    // --dim naming no dim of the model, or given twice.
    let (code, _, err) = rlx_run(&["examples/healthy_mlp", "--dim", "foo=3"], None);
    assert_eq!(code, 1);
    assert!(err.contains("no symbolic dim named \"foo\""), "{err}");
    // A dim so large the input cannot exist: an error naming the input, no allocation.
    let (code, _, err) = rlx_run(
        &[
            "fixtures/transformers/bert_tiny/model.onnx",
            "--dim",
            "batch=99999999999",
        ],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("more than this machine's memory") || err.contains("too large"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && err.lines().count() == 1,
        "{err}"
    );
    // A --dim that contradicts an input file.
    let (code, _, err) = rlx_run(
        &["fixtures/transformers/bert_tiny", "--dim", "batch=5"],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("requested batch=5"), "{err}");
    // Never write through a symlink planted in the output dir: the link is replaced.
    let od = dir.join("out");
    std::fs::create_dir_all(&od).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&victim, od.join("probs.npy")).unwrap();
    let (code, _, err) = rlx_run(
        &["examples/healthy_mlp", "-q", "-o", od.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    let m = std::fs::symlink_metadata(od.join("probs.npy")).unwrap();
    assert!(
        m.file_type().is_file(),
        "the link itself was replaced by the output"
    );
    assert!(rlx_cli::npy::read_npy(&od.join("probs.npy")).is_ok());
    // A hard link to another file is replaced too, not written through.
    std::fs::remove_file(od.join("probs.npy")).unwrap();
    std::fs::hard_link(&victim, od.join("probs.npy")).unwrap();
    let (code, _, err) = rlx_run(
        &["examples/healthy_mlp", "-q", "-o", od.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    std::fs::remove_dir_all(&dir).ok();
}

/// `rlx-run` end to end on real models: a model-zoo light model fed its ONNX TensorProto
/// input (compared with the shipped `output_0.pb`), and a transformer export (compared with
/// onnxruntime's outputs written by scripts/gen_transformers.py).
#[test]
fn rlx_run_on_real_models_matches_references() {
    use rlx_cli::npy::read_npy;
    let dir = std::env::temp_dir().join(format!("rlx-cli-real-{}", std::process::id()));
    let light = repo().join("fixtures/large/light/squeezenet");
    if light.exists() {
        let out = dir.join("sq");
        let input = format!("data_0={}", light.join("input_0.pb").display());
        let (code, _, err) = rlx_run(
            &[
                light.join("model.onnx").to_str().unwrap(),
                "--input",
                &input,
                "-o",
                out.to_str().unwrap(),
                "-q",
                "--threads",
                "2",
            ],
            None,
        );
        assert_eq!(code, 0, "{err}");
        let want = read_npy(&light.join("output_0.npy")).unwrap();
        let got = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .next()
            .expect("one output")
            .path();
        let got = read_npy(&got).unwrap();
        assert_eq!(got.dims(), want.dims());
        for i in 0..want.numel() {
            let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
            assert!(
                (a - b).abs() <= 1e-7 + 1e-3 * b.abs(),
                "element {i}: {a} vs {b}"
            );
        }
    } else if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
        panic!("fixtures/large/light missing");
    } else {
        {
            use std::io::Write; // past the test harness's capture: the line shows in CI logs
            let _ = writeln!(
                std::io::stderr(),
                "skipping rlx_run_on_real_models_matches_references's squeezenet part: \
             {} not generated (scripts/gen_light_models.py)",
                light.display()
            );
        }
    }
    let bert = repo().join("fixtures/transformers/bert_tiny");
    let out = dir.join("bert");
    let (code, _, err) = rlx_run(
        &[
            bert.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "-q",
            "--threads",
            "1",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    for name in ["last_hidden_state", "pooler_output"] {
        let got = read_npy(&out.join(format!("{name}.npy"))).unwrap();
        let want = read_npy(&bert.join(format!("expected_{name}.npy"))).unwrap();
        assert_eq!(got.dims(), want.dims());
        for i in 0..want.numel() {
            let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                "{name}[{i}]: {a} vs {b}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
