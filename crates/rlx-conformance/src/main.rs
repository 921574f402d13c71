//! `rlx-conformance`: run the ONNX node test suite, or one case.
//!
//! ```text
//! rlx-conformance suite [--root DIR] [--filter SUBSTR] [--jobs N] [--timeout SECS]
//!                       [--no-debug-nans] [--update-manifest [--allow-removals]]
//! rlx-conformance case DIR [--debug-nans] [--pretty]
//! ```
//!
//! `suite` is what `cargo test -p rlx-conformance` runs (defaults from the same environment
//! variables: RLX_ONNX_NODE_DIR, RLX_CONFORMANCE_JOBS, RLX_CONFORMANCE_TIMEOUT_S,
//! RLX_CONFORMANCE_FILTER, RLX_CONFORMANCE_DEBUG_NANS=0, RLX_UPDATE_MANIFEST=1,
//! RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1); exit status 1 on a regression or a refused manifest
//! update, 2 on a usage error.
//! `case` runs one case in this process and prints its result lines (JSON, prefixed
//! `@@rlx-conformance `); the suite runs it in a child process per case. Exit status 0 when the
//! case passes (and the localizer run, if any, changed nothing), 1 when it does not.
//!
//! No input is ever frozen to its test value: a case whose import needs a value known only at
//! run time (a Reshape's `shape` fed as an input, a NonZero whose output size depends on its
//! data) runs through `rlx_runtime::DynamicModel`, planned by the parameter input's value or
//! run in segments around the value-dependent node, as `rlx run` runs such a model. The suite
//! report counts those cases.

use clap::{Args, Parser, Subcommand};
use rlx_conformance::case::{self, Line, LINE_PREFIX};
use rlx_conformance::suite::{parse_timeout, SuiteOptions};
use rlx_conformance::ManifestUpdate;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "rlx-conformance",
    about = "Run the ONNX backend node test suite (fixtures/onnx-node) through rlx-onnx-import and the CPU runtime",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every case (each in a child process), print the report, gate on passing.txt.
    #[command(after_help = SUITE_ENV)]
    Suite(SuiteArgs),
    /// Run one case in this process; print its result lines (JSON, prefixed `@@rlx-conformance `).
    #[command(
        after_help = "Exit status: 0 when the case passes (and the localizer run, if any, \
                            changed nothing), 1 when it does not, 2 on a usage error."
    )]
    Case(CaseArgs),
}

const SUITE_ENV: &str = "Environment (the options override it): RLX_ONNX_NODE_DIR (--root), \
RLX_CONFORMANCE_JOBS (--jobs), RLX_CONFORMANCE_TIMEOUT_S (--timeout), RLX_CONFORMANCE_FILTER \
(--filter), RLX_CONFORMANCE_DEBUG_NANS=0 (--no-debug-nans), RLX_UPDATE_MANIFEST=1 \
(--update-manifest), RLX_UPDATE_MANIFEST_ALLOW_REMOVALS=1 (--allow-removals).

No input is frozen: a case whose import needs a run-time value runs through the runtime's \
DynamicModel (planned by a parameter input's value, or in segments around a value-dependent \
node); the report counts them.

Exit status: 0 when every case listed in passing.txt passes and the localizer changed nothing; \
1 on a regression, a localizer violation, a refused manifest update or no cases found; 2 on a \
usage error.";

#[derive(Args)]
struct SuiteArgs {
    /// Folder holding one folder per case [default: fixtures/onnx-node]
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Only cases whose name contains SUBSTR (the others count as skipped)
    #[arg(long, value_name = "SUBSTR")]
    filter: Option<String>,
    /// Cases run at once [default: 2, at most the machine's cores]
    #[arg(long, value_name = "N", value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Wall-clock limit per case, seconds (> 0, at most one day) [default: 10]
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// Skip the second run of each case with the NaN/Inf localizer on
    #[arg(long)]
    no_debug_nans: bool,
    /// Rewrite passing.txt with the cases passing now (full default suite only)
    #[arg(long)]
    update_manifest: bool,
    /// With --update-manifest: drop listed cases that no longer pass (refused otherwise)
    #[arg(long)]
    allow_removals: bool,
}

#[derive(Args)]
struct CaseArgs {
    /// The case folder (holding model.onnx and test_data_set_*)
    dir: PathBuf,
    /// Also run with the NaN/Inf localizer on and check that it changes nothing
    #[arg(long)]
    debug_nans: bool,
    /// Pretty-print the JSON lines
    #[arg(long)]
    pretty: bool,
}

fn parse_jobs(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{s:?}: the number of jobs must be a whole number >= 1"
        )),
    }
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Case(a) => case_cmd(a),
        Cmd::Suite(a) => suite_cmd(a),
    }
}

fn case_cmd(a: CaseArgs) -> ExitCode {
    case::install_quiet_panic_hook();
    let mut passed = false;
    let mut debug_same = true;
    let mut emit = |l: &Line| {
        use std::io::Write;
        match l {
            Line::Normal(o) => passed = o.passed(),
            Line::Debug(d) => debug_same = d.same,
        }
        let j = if a.pretty {
            serde_json::to_string_pretty(l)
        } else {
            serde_json::to_string(l)
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{LINE_PREFIX}{}", j.unwrap_or_default());
        let _ = out.flush();
    };
    case::run_case(&a.dir, a.debug_nans, &mut emit);
    if passed && debug_same {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(case::EXIT_NOT_PASSED)
    }
}

fn suite_cmd(a: SuiteArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("rlx-conformance: cannot find own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut opts = match SuiteOptions::try_from_env(rlx_conformance::default_root(), exe) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rlx-conformance suite: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(r) = a.root {
        opts.root = r;
    }
    if let Some(f) = a.filter {
        opts.filter = Some(f);
    }
    if let Some(j) = a.jobs {
        opts.jobs = j;
    }
    if let Some(t) = a.timeout {
        opts.timeout = t;
    }
    if a.no_debug_nans {
        opts.debug_nans = false;
    }
    let mut update = ManifestUpdate::from_env();
    if a.update_manifest {
        let u = update.get_or_insert_with(ManifestUpdate::default);
        u.allow_removals |= a.allow_removals;
    }
    if a.allow_removals && update.is_none() {
        eprintln!(
            "rlx-conformance suite: --allow-removals needs --update-manifest (or RLX_UPDATE_MANIFEST=1)"
        );
        return ExitCode::from(2);
    }
    if update.is_some() {
        if let Some(why) = rlx_conformance::update_refusal(&opts) {
            eprintln!("rlx-conformance suite: {why}");
            return ExitCode::from(2);
        }
    }
    if rlx_conformance::suite::discover(&opts.root).is_empty() {
        eprintln!(
            "rlx-conformance: no cases under {} (run scripts/onnx-node-suite)",
            opts.root.display()
        );
        return ExitCode::FAILURE;
    }
    let (ok, _) = rlx_conformance::run_and_gate(&opts, update);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
