//! ONNX conformance harness: runs the ONNX backend node test suite (every case of
//! `onnx.backend.test.case.node.collect_testcases(None)`, written to `fixtures/onnx-node/` by
//! `scripts/onnx-node-suite`; 1884 cases for onnx 1.23.2) through `rlx-onnx-import` and the CPU
//! runtime (`Session::new(Device::Cpu).try_compile(g)` then `run_tensors`).
//!
//! No input is frozen: every graph input is fed at run time, as a user's would be. A case whose
//! import needs a value known only at run time runs through [`rlx_runtime::DynamicModel`]
//! (parameter inputs planned by value, value-dependent nodes run in segments), and the report
//! counts those cases ([`case::RunPath`]).
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
    match rlx_ir::env::get_os("RLX_ONNX_NODE_DIR") {
        Some(d) if !d.is_empty() => d.into(),
        _ => workspace_root(),
    }
}

/// `<workspace>/fixtures/onnx-node`, where `scripts/onnx-node-suite` writes the suite: the only
/// folder `passing.txt` is regenerated from.
pub fn workspace_root() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/onnx-node");
    p.canonicalize().unwrap_or(p)
}

/// Header of `passing.txt`.
pub const MANIFEST_HEADER: &str =
    "ONNX node test cases (onnx 1.23.2, scripts/onnx-node-suite) that RLX passes.
A listed case that fails is a regression: `cargo test -p rlx-conformance` fails.
No input is frozen: a case whose import needs a run-time value runs through the runtime's
DynamicModel (planned by a parameter input's value, or in segments around a value-dependent node).
Regenerate: RLX_UPDATE_MANIFEST=1 cargo test -p rlx-conformance --test node_suite
(or: cargo run -p rlx-conformance -- suite --update-manifest).";

/// A request to rewrite `passing.txt` from the run (`RLX_UPDATE_MANIFEST=1`,
/// `suite --update-manifest`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ManifestUpdate {
    /// Drop listed cases that no longer pass (`--allow-removals`,
    /// `RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1`); without it the update is refused when any
    /// listed case would go.
    pub allow_removals: bool,
}

impl ManifestUpdate {
    /// From `RLX_UPDATE_MANIFEST=1` and `RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1`.
    pub fn from_env() -> Option<ManifestUpdate> {
        let on = rlx_ir::env::is_on;
        on("RLX_UPDATE_MANIFEST").then(|| ManifestUpdate {
            allow_removals: on("RLX_UPDATE_MANIFEST_ALLOW_REMOVALS"),
        })
    }
}

/// Why `passing.txt` cannot be regenerated from a run with these options (None: it can). Only
/// the full default suite may rewrite it: the folder `scripts/onnx-node-suite` writes
/// ([`workspace_root`]), no filter.
pub fn update_refusal(opts: &suite::SuiteOptions) -> Option<String> {
    let mut why = vec![];
    let canon = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    if canon(&opts.root) != canon(&workspace_root()) {
        why.push(format!(
            "the suite folder {} is not the default {} (--root / RLX_ONNX_NODE_DIR)",
            opts.root.display(),
            workspace_root().display()
        ));
    }
    if let Some(f) = &opts.filter {
        why.push(format!(
            "a filter is set ({f:?}: --filter / RLX_CONFORMANCE_FILTER)"
        ));
    }
    (!why.is_empty()).then(|| {
        format!(
            "refusing to update passing.txt: it is regenerated from the full default suite only; {}",
            why.join("; ")
        )
    })
}

/// Run the suite, print the report to stderr, check (or with `update` rewrite) the manifest,
/// write `<root>/rlx_results.json`. Returns whether the gate passed, and the report.
///
/// An update is refused (nothing written, gate failed) when the run is not the full default
/// suite ([`update_refusal`]; callers should check that before running), or when listed cases
/// would be removed and `update.allow_removals` is off.
pub fn run_and_gate(
    opts: &suite::SuiteOptions,
    update: Option<ManifestUpdate>,
) -> (bool, suite::SuiteReport) {
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
    if let Some(u) = update {
        if let Some(why) = update_refusal(opts) {
            eprint_now(&format!("\n{why}\n"));
            ok = false;
        } else {
            let plan = plan_manifest(&report, &manifest);
            if !plan.removed.is_empty() && !u.allow_removals {
                eprint_now(&format!(
                    "\nrefusing to update passing.txt: {} listed cases would be removed \
                     (rerun with --allow-removals / RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1 to drop them):\n  {}\n",
                    plan.removed.len(),
                    plan.removed.join("\n  ")
                ));
                ok = false;
            } else {
                match write_manifest(&mpath, &plan.cases, MANIFEST_HEADER) {
                    Ok(()) => {
                        eprint_now(&format!(
                            "wrote {} ({} cases: {} added, {} removed{})\n",
                            mpath.display(),
                            plan.cases.len(),
                            plan.added.len(),
                            plan.removed.len(),
                            if plan.removed.is_empty() {
                                String::new()
                            } else {
                                format!(": {}", plan.removed.join(", "))
                            }
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
    }
    eprint_now(&format!("{}\n", report.closing_line()));
    (ok, report)
}
