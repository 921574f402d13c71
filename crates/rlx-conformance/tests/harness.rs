//! The suite runner survives children that hang, crash, or die during the localizer run.
//! Stand-in children are shell scripts (unix only).
#![cfg(unix)]

use rlx_conformance::case::Stage;
use rlx_conformance::suite::{run_suite, SuiteOptions};
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
    opts.freeze = true;
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
