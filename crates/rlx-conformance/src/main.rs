//! `rlx-conformance`: run the ONNX node test suite, or one case.
//!
//! ```text
//! rlx-conformance suite [--root DIR] [--filter SUBSTR] [--jobs N] [--timeout SECS]
//!                       [--no-debug-nans] [--no-freeze] [--update-manifest]
//! rlx-conformance case DIR [--debug-nans] [--no-freeze] [--pretty]
//! ```
//!
//! `suite` is what `cargo test -p rlx-conformance` runs (defaults from the same environment
//! variables: RLX_ONNX_NODE_DIR, RLX_CONFORMANCE_JOBS, RLX_CONFORMANCE_TIMEOUT_S,
//! RLX_CONFORMANCE_FILTER, RLX_CONFORMANCE_DEBUG_NANS=0, RLX_CONFORMANCE_FREEZE=0); exit
//! status 1 on a regression.
//! `case` runs one case in this process and prints its result lines (JSON, prefixed
//! `@@rlx-conformance `); the suite runs it in a child process per case.

use rlx_conformance::case::{self, Line, LINE_PREFIX};
use rlx_conformance::suite::SuiteOptions;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage:
  rlx-conformance suite [--root DIR] [--filter SUBSTR] [--jobs N] [--timeout SECS] [--no-debug-nans] [--no-freeze] [--update-manifest]
  rlx-conformance case DIR [--debug-nans] [--no-freeze] [--pretty]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("case") => case_cmd(&args[1..]),
        Some("suite") => suite_cmd(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn case_cmd(args: &[String]) -> ExitCode {
    let mut dir = None;
    let mut debug = false;
    let mut pretty = false;
    let mut freeze = true;
    for a in args {
        match a.as_str() {
            "--debug-nans" => debug = true,
            "--no-freeze" => freeze = false,
            "--pretty" => pretty = true,
            s if dir.is_none() && !s.starts_with("--") => dir = Some(PathBuf::from(s)),
            s => {
                eprintln!("rlx-conformance case: unexpected argument {s}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    case::install_quiet_panic_hook();
    let mut emit = |l: &Line| {
        use std::io::Write;
        let j = if pretty {
            serde_json::to_string_pretty(l)
        } else {
            serde_json::to_string(l)
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{LINE_PREFIX}{}", j.unwrap_or_default());
        let _ = out.flush();
    };
    case::run_case(&dir, debug, freeze, &mut emit);
    ExitCode::SUCCESS
}

fn suite_cmd(args: &[String]) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("rlx-conformance: cannot find own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut opts = SuiteOptions::from_env(rlx_conformance::default_root(), exe);
    let mut update = std::env::var("RLX_UPDATE_MANIFEST").is_ok_and(|v| v == "1");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| -> Option<String> {
            let v = it.next().cloned();
            if v.is_none() {
                eprintln!("rlx-conformance suite: {name} needs a value");
            }
            v
        };
        match a.as_str() {
            "--root" => match val("--root") {
                Some(v) => opts.root = v.into(),
                None => return ExitCode::from(2),
            },
            "--filter" => match val("--filter") {
                Some(v) => opts.filter = Some(v),
                None => return ExitCode::from(2),
            },
            "--jobs" => match val("--jobs").and_then(|v| v.parse().ok()) {
                Some(v) => opts.jobs = v,
                None => return ExitCode::from(2),
            },
            "--timeout" => match val("--timeout").and_then(|v| v.parse::<f64>().ok()) {
                Some(v) => opts.timeout = Duration::from_secs_f64(v),
                None => return ExitCode::from(2),
            },
            "--no-debug-nans" => opts.debug_nans = false,
            "--no-freeze" => opts.freeze = false,
            "--update-manifest" => update = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            s => {
                eprintln!("rlx-conformance suite: unexpected argument {s}\n{USAGE}");
                return ExitCode::from(2);
            }
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
