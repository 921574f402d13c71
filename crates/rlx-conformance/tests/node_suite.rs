//! The ONNX backend node test suite through the importer and the CPU runtime.
//!
//! Needs `fixtures/onnx-node/` (`scripts/onnx-node-suite`); skips with a note when it is
//! absent, and fails then when `RLX_REQUIRE_FIXTURES=1` (as `.ci/run` sets). Fails when a case
//! listed in `passing.txt` fails, or when running with the NaN/Inf localizer on
//! (`DebugMode::Warn`, what `RLX_DEBUG_NANS=1` selects) changes an output or crashes.
//! `RLX_UPDATE_MANIFEST=1` rewrites `passing.txt` with the cases passing now: only from the full
//! default suite (no filter, default folder), and only when no listed case would go, unless
//! `RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1`. No input is frozen: a case whose import needs a
//! run-time value runs through the runtime's `DynamicModel` (see `Outcome::run_path`).
//! Other knobs: RLX_ONNX_NODE_DIR, RLX_CONFORMANCE_JOBS, RLX_CONFORMANCE_TIMEOUT_S,
//! RLX_CONFORMANCE_FILTER, RLX_CONFORMANCE_DEBUG_NANS=0.

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
        if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
            panic!("{msg}; RLX_REQUIRE_FIXTURES=1");
        }
        eprint_now(&format!("SKIPPED onnx_node_suite: {msg}\n"));
        return;
    }
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_rlx-conformance"));
    let opts = SuiteOptions::try_from_env(root, exe).unwrap_or_else(|e| panic!("{e}"));
    let update = rlx_conformance::ManifestUpdate::from_env();
    if update.is_some() {
        if let Some(why) = rlx_conformance::update_refusal(&opts) {
            panic!("RLX_UPDATE_MANIFEST=1: {why}");
        }
    }
    let (ok, report) = rlx_conformance::run_and_gate(&opts, update);
    assert!(
        ok,
        "ONNX node suite: regressions or localizer violations (see above); {}",
        report.closing_line()
    );
}
