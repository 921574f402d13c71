//! The suite runner survives children that hang, crash, or die during the localizer run.
//! Stand-in children are shell scripts (unix only).
#![cfg(unix)]

use rlx_conformance::case::{RunPath, Stage};
use rlx_conformance::suite::{run_suite, SuiteOptions, SuiteReport};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NORMAL_PASS: &str = r#"@@rlx-conformance {"phase":"normal","stage":"pass","detail":"","ms":1.0,"expected_nonfinite":false}"#;

fn script(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("child.sh");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn suite_with(tag: &str, body: &str, timeout_s: f64) -> rlx_conformance::suite::SuiteReport {
    let tmp = std::env::temp_dir().join(format!(
        "rlx-conformance-harness-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let root = tmp.join("cases");
    std::fs::create_dir_all(root.join("test_one")).unwrap();
    std::fs::write(root.join("test_one/model.onnx"), b"").unwrap();
    let exe = script(&tmp, body);
    let mut opts = SuiteOptions::from_env(root, exe);
    opts.timeout = Duration::from_secs_f64(timeout_s);
    opts.filter = None;
    opts.debug_nans = true;
    opts.progress_every = 0;
    let r = run_suite(&opts);
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

#[test]
fn hang_is_a_timeout() {
    let r = suite_with("hang", "sleep 30", 0.3);
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.results[0].outcome.stage, Stage::Timeout);
    assert!(r.wall_s < 10.0, "the hung child was not killed");
}

#[test]
fn signal_is_a_crash() {
    let r = suite_with("segv", "echo 'fatal: boom' >&2; kill -SEGV $$", 5.0);
    let o = &r.results[0].outcome;
    assert_eq!(o.stage, Stage::Crash);
    assert!(
        o.detail.contains("SIGSEGV") && o.detail.contains("boom"),
        "{}",
        o.detail
    );
}

#[test]
fn death_in_the_localizer_run_is_a_violation_not_a_failure() {
    let r = suite_with("dbg", &format!("echo '{NORMAL_PASS}'; kill -ABRT $$"), 5.0);
    let c = &r.results[0];
    assert!(c.passed());
    let v = c.debug_violation().expect("a violation");
    assert!(v.contains("crash during the localizer run"), "{v}");
}

#[test]
fn case_that_fails_is_not_a_crash() {
    // `rlx-conformance case` exits 1 when the case ran and did not pass.
    let line = r#"@@rlx-conformance {"phase":"normal","stage":"compare","detail":"wrong","ms":1.0,"expected_nonfinite":false}"#;
    let r = suite_with("fail1", &format!("echo '{line}'; exit 1"), 5.0);
    let c = &r.results[0];
    assert_eq!(c.outcome.stage, Stage::Compare, "{}", c.outcome.detail);
    assert!(c.debug_crash.is_none(), "{:?}", c.debug_crash);
    // Exit 1 without a result line is still a crash.
    let r = suite_with("fail2", "exit 1", 5.0);
    assert_eq!(r.results[0].outcome.stage, Stage::Crash);
}

// ---- command line -------------------------------------------------------------------------

const EXE: &str = env!("CARGO_BIN_EXE_rlx-conformance");

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-conformance-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run the binary with a time limit; (exit code, stdout, stderr).
fn exe(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = std::process::Command::new(EXE);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for k in [
        "RLX_UPDATE_MANIFEST",
        "RLX_UPDATE_MANIFEST_ALLOW_REMOVALS",
        "RLX_CONFORMANCE_TIMEOUT_S",
        "RLX_CONFORMANCE_FILTER",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rlx-conformance {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn help_exits_zero_everywhere() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["suite", "--help"],
        &["case", "--help"],
        &["help", "case"],
    ] {
        let (code, out, _) = exe(args, &[]);
        assert_eq!(code, Some(0), "{args:?}");
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
    assert_eq!(exe(&[], &[]).0, Some(2));
    assert_eq!(exe(&["bogus"], &[]).0, Some(2));
}

#[test]
fn bad_timeouts_are_usage_errors() {
    use rlx_conformance::suite::parse_timeout;
    for bad in [
        "-1", "0", "nan", "NaN", "inf", "-inf", "1e30", "86401", "ten", "",
    ] {
        assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_timeout("86400").unwrap(), Duration::from_secs(86400));
    let root = tmp_dir("timeout");
    let root_s = root.to_str().unwrap();
    for bad in ["-1", "nan", "1e30"] {
        let (code, _, err) = exe(&["suite", "--root", root_s, "--timeout", bad], &[]);
        assert_eq!(code, Some(2), "--timeout {bad}: {err}");
    }
    let (code, _, err) = exe(
        &["suite", "--root", root_s],
        &[("RLX_CONFORMANCE_TIMEOUT_S", "-5")],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("RLX_CONFORMANCE_TIMEOUT_S"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn update_is_refused_for_a_partial_run() {
    use rlx_conformance::update_refusal;
    let exe_path = PathBuf::from(EXE);
    let mut opts = SuiteOptions::from_env(rlx_conformance::workspace_root(), exe_path.clone());
    opts.filter = None;
    assert_eq!(update_refusal(&opts), None);
    let mut o = opts.clone();
    o.filter = Some("abs".into());
    assert!(update_refusal(&o).is_some_and(|w| w.contains("filter")));
    let mut o = opts.clone();
    o.root = std::env::temp_dir();
    assert!(update_refusal(&o).is_some_and(|w| w.contains("not the default")));

    // Through the binary: refused before anything runs, passing.txt untouched.
    let manifest = rlx_conformance::manifest_path();
    let before = std::fs::read(&manifest).unwrap();
    let root = tmp_dir("update");
    let root_s = root.to_str().unwrap();
    for (args, env) in [
        (vec!["suite", "--root", root_s, "--update-manifest"], vec![]),
        (
            vec!["suite", "--root", root_s],
            vec![("RLX_UPDATE_MANIFEST", "1")],
        ),
        (
            vec!["suite", "--filter", "abs", "--update-manifest"],
            vec![],
        ),
        (vec!["suite", "--allow-removals"], vec![]),
    ] {
        let (code, _, err) = exe(&args, &env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {err}");
        assert!(
            err.contains("passing.txt") || err.contains("--allow-removals"),
            "{err}"
        );
    }
    assert!(
        std::fs::read(&manifest).unwrap() == before,
        "passing.txt changed"
    );
    let _ = std::fs::remove_dir_all(&root);
}

fn result(name: &str, stage: Stage, run_path: RunPath) -> rlx_conformance::suite::CaseResult {
    rlx_conformance::suite::CaseResult {
        name: name.into(),
        op: "Op".into(),
        expanded: false,
        outcome: rlx_conformance::case::Outcome {
            stage,
            detail: String::new(),
            ms: 0.0,
            expected_nonfinite: false,
            run_path,
        },
        debug: None,
        debug_crash: None,
        ort: None,
    }
}

fn report(results: Vec<rlx_conformance::suite::CaseResult>) -> SuiteReport {
    SuiteReport {
        root: PathBuf::from("/nowhere"),
        results,
        skipped: 0,
        wall_s: 0.0,
        jobs: 1,
        debug_nans: false,
        onnxruntime: None,
    }
}

#[test]
fn manifest_plan_and_gate() {
    use rlx_conformance::suite::{plan_manifest, read_manifest, verdict, write_manifest};
    let dir = tmp_dir("manifest");
    let path = dir.join("passing.txt");
    // A trailing comment is no part of the name (an old manifest's marks still read).
    std::fs::write(&path, "# header\ntest_a\ntest_b  # a note\ntest_c\n").unwrap();
    let m = read_manifest(&path).unwrap();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        m.iter().cloned().collect::<Vec<_>>(),
        names(&["test_a", "test_b", "test_c"])
    );

    // test_c fails now, test_d passes newly; how a case ran does not matter to the manifest.
    let r = report(vec![
        result("test_a", Stage::Pass, RunPath::Static),
        result("test_b", Stage::Pass, RunPath::ByValue),
        result("test_c", Stage::Compare, RunPath::Static),
        result("test_d", Stage::Pass, RunPath::Segments),
    ]);
    let plan = plan_manifest(&r, &m);
    assert_eq!(plan.removed, names(&["test_c"]));
    assert_eq!(plan.added, names(&["test_d"]));
    write_manifest(&path, &plan.cases, "h").unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "# h\ntest_a\ntest_b\ntest_d\n"
    );

    let v = verdict(&r, &m, None);
    assert_eq!(v.regressions.len(), 1, "{:?}", v.regressions);
    assert!(v.regressions[0].starts_with("test_c: compare"));
    assert_eq!(v.newly_passing, names(&["test_d"]));
    assert!(!v.ok());
    // A filter gates only the listed cases it selects; a listed case absent from the run fails.
    assert!(verdict(&r, &m, Some("test_a")).ok());
    let v = verdict(&report(vec![]), &m, Some("test_b"));
    assert_eq!(v.regressions.len(), 1, "{:?}", v.regressions);
    assert!(v.regressions[0].starts_with("test_b: not in the suite"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn case_exit_status_missing_folder_and_fifo() {
    let (code, out, _) = exe(&["case", "/nonexistent/rlx-conformance-case"], &[]);
    assert_eq!(code, Some(1));
    assert!(out.contains(r#""stage":"load""#), "{out}");

    let dir = tmp_dir("fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(dir.join("model.onnx"))
        .status();
    if st.is_ok_and(|s| s.success()) {
        let (code, out, _) = exe(&["case", dir.to_str().unwrap()], &[]);
        assert_eq!(code, Some(1));
        assert!(out.contains("not a regular file"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// onnx's node test case `name` under `fixtures/onnx-node`, or None after a skip line on stderr
/// (a failure under `RLX_REQUIRE_FIXTURES=1`) when the suite is not there.
fn node_case(test: &str, name: &str) -> Option<PathBuf> {
    let src = rlx_conformance::workspace_root().join(name);
    if src.join("model.onnx").is_file() {
        return Some(src);
    }
    assert!(
        rlx_ir::env::get("RLX_REQUIRE_FIXTURES").is_none_or(|v| v != "1"),
        "RLX_REQUIRE_FIXTURES=1 but {} is missing (run scripts/onnx-node-suite)",
        src.display()
    );
    use std::io::Write; // past the test harness's capture: the line shows in CI logs
    let _ = writeln!(
        std::io::stderr(),
        "skipping {test}: no {} (run scripts/onnx-node-suite)",
        src.display()
    );
    None
}

/// A real case (onnx's `test_abs`) when `fixtures/onnx-node` exists: it passes, exits 0; with
/// a stray `output_1.pb` it fails at the output stage, exits 1, and the suite counts it as a
/// failure, not a crash.
#[test]
fn extra_expected_output_is_a_failure() {
    let Some(src) = node_case("extra_expected_output_is_a_failure", "test_abs") else {
        return;
    };
    let tmp = tmp_dir("extra");
    let root = tmp.join("cases");
    for name in ["test_abs", "test_abs_extra"] {
        let ds = root.join(name).join("test_data_set_0");
        std::fs::create_dir_all(&ds).unwrap();
        std::fs::copy(src.join("model.onnx"), root.join(name).join("model.onnx")).unwrap();
        for f in ["input_0.pb", "output_0.pb"] {
            std::fs::copy(src.join("test_data_set_0").join(f), ds.join(f)).unwrap();
        }
    }
    let extra = root.join("test_abs_extra/test_data_set_0");
    std::fs::copy(extra.join("output_0.pb"), extra.join("output_1.pb")).unwrap();

    let (code, out, _) = exe(&["case", root.join("test_abs").to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out, _) = exe(
        &["case", root.join("test_abs_extra").to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(r#""stage":"output""#) && out.contains("output_1.pb"),
        "{out}"
    );

    let mut opts = SuiteOptions::from_env(root.clone(), PathBuf::from(EXE));
    opts.filter = None;
    opts.debug_nans = true;
    opts.progress_every = 0;
    let r = run_suite(&opts);
    let stage = |n: &str| r.results.iter().find(|c| c.name == n).unwrap();
    assert_eq!(stage("test_abs").outcome.stage, Stage::Pass);
    assert!(stage("test_abs").debug_violation().is_none());
    assert_eq!(stage("test_abs_extra").outcome.stage, Stage::Output);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Cases whose import needs a value known only at run time pass with every input fed at run
/// time, through the runtime's dynamic path, and the report counts them by the way they ran:
/// `test_reshape_reduced_dims` feeds Reshape's `shape` (a parameter input: planned by its
/// value), `test_nonzero_example` has a NonZero whose output size depends on its input's
/// values (run in segments), `test_abs` needs neither.
#[test]
fn value_needing_cases_pass_through_the_dynamic_path() {
    use rlx_conformance::case::load_meta;
    let cases = [
        ("test_abs", RunPath::Static),
        ("test_reshape_reduced_dims", RunPath::ByValue),
        ("test_nonzero_example", RunPath::Segments),
    ];
    let mut srcs = vec![];
    for (name, _) in cases {
        match node_case("value_needing_cases_pass_through_the_dynamic_path", name) {
            Some(s) => srcs.push(s),
            None => return,
        }
    }
    // What makes each case need a run-time value is in its model, not in RLX: Reshape reads
    // its second input from a graph input; NonZero reads a graph input.
    let reshape = load_meta(&srcs[1]).unwrap();
    let inputs: Vec<&str> = reshape.inputs.iter().map(|i| i.name.as_str()).collect();
    let node = &reshape.nodes[0];
    assert_eq!(node.op_type, "Reshape");
    assert!(inputs.contains(&node.inputs[1].as_str()), "{inputs:?}");
    let nonzero = load_meta(&srcs[2]).unwrap();
    assert_eq!(nonzero.nodes[0].op_type, "NonZero");
    assert_eq!(nonzero.nodes[0].inputs[0], nonzero.inputs[0].name);

    let tmp = tmp_dir("dynamic");
    let root = tmp.join("cases");
    std::fs::create_dir_all(&root).unwrap();
    for ((name, _), src) in cases.iter().zip(&srcs) {
        let st = std::process::Command::new("cp")
            .arg("-r")
            .arg(src)
            .arg(root.join(name))
            .status()
            .unwrap();
        assert!(st.success(), "cp -r {}", src.display());
    }
    let mut opts = SuiteOptions::from_env(root.clone(), PathBuf::from(EXE));
    opts.filter = None;
    opts.debug_nans = true;
    opts.progress_every = 0;
    let r = run_suite(&opts);
    for (name, path) in cases {
        let c = r.results.iter().find(|c| c.name == name).unwrap();
        assert!(c.passed(), "{name}: {:?}", c.outcome);
        assert_eq!(c.outcome.run_path, path, "{name}");
        assert!(c.debug_violation().is_none(), "{name}");
    }
    assert_eq!(r.passed_by_path(), (1, 1, 1));
    let text = rlx_conformance::suite::render(&r);
    assert!(
        text.contains("1 planned by the value of a parameter input")
            && text.contains("1 ran in segments"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
