//! The ONNX backend node test suite through the importer and the CPU runtime.
//!
//! Needs `fixtures/onnx-node/` (`scripts/onnx-node-suite`); skips with a note when it is
//! absent, and fails then when `RLX_REQUIRE_FIXTURES=1` (as `.ci/run` sets). Fails when a case
//! listed in `passing.txt` fails, or when running with the NaN/Inf localizer on
//! (`DebugMode::Warn`, what `RLX_DEBUG_NANS=1` selects) changes an output or crashes.
//! `RLX_UPDATE_MANIFEST=1` rewrites `passing.txt` with the cases passing now.
//! Other knobs: RLX_ONNX_NODE_DIR, RLX_CONFORMANCE_JOBS, RLX_CONFORMANCE_TIMEOUT_S,
//! RLX_CONFORMANCE_FILTER, RLX_CONFORMANCE_DEBUG_NANS=0, RLX_CONFORMANCE_FREEZE=0 (see
//! `Outcome::frozen`).

use rlx_conformance::suite::{discover, eprint_now, SuiteOptions};
use std::path::PathBuf;

#[test]
fn onnx_node_suite() {
    let root = rlx_conformance::default_root();
    if discover(&root).is_empty() {
        let msg = format!(
            "no ONNX node test cases under {} (run scripts/onnx-node-suite)",
            root.display()
        );
        if std::env::var("RLX_REQUIRE_FIXTURES").is_ok_and(|v| v == "1") {
            panic!("{msg}; RLX_REQUIRE_FIXTURES=1");
        }
        eprint_now(&format!("SKIPPED onnx_node_suite: {msg}\n"));
        return;
    }
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_rlx-conformance"));
    let opts = SuiteOptions::from_env(root, exe);
    let update = std::env::var("RLX_UPDATE_MANIFEST").is_ok_and(|v| v == "1");
    let (ok, report) = rlx_conformance::run_and_gate(&opts, update);
    assert!(
        ok,
        "ONNX node suite: regressions or localizer violations (see above); {}",
        report.closing_line()
    );
}
