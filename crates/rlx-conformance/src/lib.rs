//! ONNX conformance harness: runs the ONNX backend node test suite (every case of
//! `onnx.backend.test.case.node.collect_testcases(None)`, written to `fixtures/onnx-node/` by
//! `scripts/onnx-node-suite`; 1884 cases for onnx 1.23.2) through `rlx-onnx-import` and the CPU
//! runtime (`Session::new(Device::Cpu).try_compile(g)` then `run_tensors`).
//!
//! * [`compare`]: the output comparison (rtol 1e-3 / atol 1e-7, NaN equal to NaN, dtype and
//!   dims exact, ints/bools exact, bf16 at onnx's wider tolerance);
//! * [`case`]: one case in this process, the plain run and the run with the NaN/Inf localizer
//!   on (`DebugMode::Warn`, which must change no output);
//! * [`suite`]: every case, each in a child process (`rlx-conformance case DIR`) under a time
//!   limit, the per-op table, the manifest gate (`crates/rlx-conformance/passing.txt`).
//!
//! The test target `tests/node_suite.rs` runs the suite under `cargo test`; the
//! `rlx-conformance` binary runs it by hand (`rlx-conformance suite --help`).

pub mod case;
pub mod compare;
pub mod onnx_meta;
pub mod suite;

/// The committed manifest of cases expected to pass.
pub fn manifest_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("passing.txt")
}

/// The suite's default location: `<workspace>/fixtures/onnx-node` (override with
/// `RLX_ONNX_NODE_DIR`).
pub fn default_root() -> std::path::PathBuf {
    match std::env::var_os("RLX_ONNX_NODE_DIR") {
        Some(d) if !d.is_empty() => d.into(),
        _ => {
            let p =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/onnx-node");
            p.canonicalize().unwrap_or(p)
        }
    }
}

/// Header of `passing.txt`.
pub const MANIFEST_HEADER: &str =
    "ONNX node test cases (onnx 1.23.2, scripts/onnx-node-suite) that RLX passes.
A listed case that fails is a regression: `cargo test -p rlx-conformance` fails.
'frozen: x' = the case runs with graph input x frozen to its test value (the importer needs
it at import time: an axes/pads/shape input), as tract's harness does for `input:` cases.
Regenerate: RLX_UPDATE_MANIFEST=1 cargo test -p rlx-conformance --test node_suite
(or: cargo run -p rlx-conformance -- suite --update-manifest).";

/// Run the suite, print the report to stderr, check (or with `update` rewrite) the manifest,
/// write `<root>/rlx_results.json`. Returns whether the gate passed, and the report.
pub fn run_and_gate(opts: &suite::SuiteOptions, update: bool) -> (bool, suite::SuiteReport) {
    use suite::*;
    let report = run_suite(opts);
    eprint_now(&render(&report));
    let results_path = opts.root.join("rlx_results.json");
    if let Err(e) = write_results(&report, &results_path) {
        eprint_now(&format!("cannot write {}: {e}\n", results_path.display()));
    }
    let mpath = manifest_path();
    let manifest = match read_manifest(&mpath) {
        Ok(m) => m,
        Err(e) => {
            eprint_now(&format!("cannot read {}: {e}\n", mpath.display()));
            return (false, report);
        }
    };
    let v = verdict(&report, &manifest, opts.filter.as_deref());
    let mut ok = v.ok();
    if !v.newly_passing.is_empty() {
        eprint_now(&format!(
            "\n{} cases pass that passing.txt does not list (extend it: RLX_UPDATE_MANIFEST=1):\n  {}\n",
            v.newly_passing.len(),
            v.newly_passing.join("\n  ")
        ));
    }
    if !v.regressions.is_empty() {
        eprint_now(&format!(
            "\nREGRESSIONS: {} cases listed in passing.txt fail:\n  {}\n",
            v.regressions.len(),
            v.regressions.join("\n  ")
        ));
    }
    if !v.debug_violations.is_empty() {
        eprint_now(&format!(
            "\nLOCALIZER VIOLATIONS: {} cases changed an output or crashed with RLX_DEBUG_NANS=1:\n  {}\n",
            v.debug_violations.len(),
            v.debug_violations.join("\n  ")
        ));
    }
    if update {
        if opts.filter.is_some() {
            eprint_now("not updating passing.txt: a filter is set\n");
        } else {
            let passing: std::collections::BTreeMap<String, Vec<String>> = report
                .results
                .iter()
                .filter(|c| c.passed())
                .map(|c| (c.name.clone(), c.outcome.frozen.clone()))
                .collect();
            match write_manifest(&mpath, &passing, MANIFEST_HEADER) {
                Ok(()) => {
                    eprint_now(&format!(
                        "wrote {} ({} cases)\n",
                        mpath.display(),
                        passing.len()
                    ));
                    ok = v.debug_violations.is_empty();
                }
                Err(e) => {
                    eprint_now(&format!("cannot write {}: {e}\n", mpath.display()));
                    ok = false;
                }
            }
        }
    }
    eprint_now(&format!("{}\n", report.closing_line()));
    (ok, report)
}
