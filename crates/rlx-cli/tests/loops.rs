//! NaN made inside an ONNX Loop (issue 32): the report names the body node and the
//! iteration, in `rlx run` (warn and abort), the value printer and `rlx trace`, for a Loop
//! with a constant trip count (unrolled at import) and one whose trip count is a graph input
//! (run alone between segments, its body's ops still scanned). Fixtures: fixtures/loops,
//! written by scripts/gen_loop_models.py; the expected node and iteration come from the
//! model's math (numpy) checked against onnxruntime, in `expected.json`.

mod common;
use common::*;
use rlx_cli::npy::read_npy;
use std::path::{Path, PathBuf};
use std::process::Command;

const RLX: &str = env!("CARGO_BIN_EXE_rlx");

/// Exit code and stdout + stderr.
fn rlx(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(RLX);
    c.args(args).current_dir(repo());
    for v in [
        "RLX_DEBUG_NANS",
        "RLX_LINT_NUMERICS",
        "RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER",
        "RLX_FILTERED_OPS_TO_PRINT",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run rlx");
    // stdout (rlx trace's summary) then stderr (reports, printer lines)
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), text)
}

fn tmp(name: &str) -> PathBuf {
    common::scratch_dir("rlx-cli-loops").join(name)
}

/// `(node, loop, iteration)` from the generator's `expected.json`.
fn expected(dir: &Path) -> (String, String, u64) {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    (
        j["node"].as_str().unwrap().to_string(),
        j["loop"].as_str().unwrap().to_string(),
        j["iteration"].as_u64().unwrap(),
    )
}

/// The report's header line for `node`, and the lines up to the next report.
fn report_of<'a>(err: &'a str, node: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = err.lines().collect();
    let Some(k) = lines
        .iter()
        .position(|l| l.starts_with("rlx nan-check:") && l.contains(&format!("\"{node}\"")))
    else {
        panic!("no report names \"{node}\":\n{err}");
    };
    let end = lines[k + 1..]
        .iter()
        .position(|l| l.starts_with("rlx"))
        .map_or(lines.len(), |e| k + 1 + e);
    lines[k..end].to_vec()
}

fn check_case(name: &str) {
    let Some(dir) = fixture(&format!("fixtures/loops/{name}")) else {
        return;
    };
    let (node, lp, it) = expected(&dir);
    let d = dir.to_str().unwrap();
    let want = format!("\"{node}\" (iteration {it} of Loop \"{lp}\")");

    // warn: the body node, its iteration, created here; no other body copy is a culprit
    let out = tmp(name);
    let (code, err) = rlx(
        &["run", d, "--output-dir", out.to_str().unwrap()],
        &[("RLX_DEBUG_NANS", "1")],
    );
    assert_eq!(code, 0, "{name}: {err}");
    let r = report_of(&err, &node);
    assert!(
        r[0].contains("NaN at index 0 of") && r[0].contains(&format!("Sqrt {want}")),
        "{name}: the report names the body node and iteration {it}: {err}"
    );
    assert!(
        r.iter()
            .any(|l| l.contains("→ inputs finite, this op produced it")),
        "{name}: iteration {it} created the NaN: {err}"
    );
    let culprits_in_body = err
        .lines()
        .filter(|l| l.starts_with("rlx nan-check:") && l.contains("loop_body/"))
        .count();
    assert_eq!(
        culprits_in_body, 1,
        "{name}: later iterations only carried it: {err}"
    );
    // the value is onnxruntime's (NaN everywhere)
    let got = read_npy(&out.join("y.npy")).unwrap();
    let exp = read_npy(&dir.join("expected_y.npy")).unwrap();
    assert_close(&format!("{name} y"), &got, &exp, 0.0, 0.0);

    // abort: the same node and iteration on the stop line, exit 3
    let (code, err) = rlx(&["run", d, "-q"], &[("RLX_DEBUG_NANS", "abort")]);
    assert_eq!(code, 3, "{name}: {err}");
    let stop = err
        .lines()
        .find(|l| l.starts_with("rlx: run stopped by RLX_DEBUG_NANS=abort at"))
        .unwrap_or_else(|| panic!("{name}: no stop line: {err}"));
    // (a node run between segments keeps the report's context: "(run alone between segments)")
    assert!(stop.contains(&format!("Sqrt {want}")), "{name}: {stop}");

    // the printer: one line per iteration, each naming its own
    let (code, err) = rlx(
        &["run", d, "-q"],
        &[
            ("RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER", "1"),
            ("RLX_FILTERED_OPS_TO_PRINT", node.as_str()),
        ],
    );
    assert_eq!(code, 0, "{name}: {err}");
    let printed: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx print:"))
        .collect();
    assert_eq!(printed.len(), 5, "{name}: five iterations: {err}");
    for (k, l) in printed.iter().enumerate() {
        assert!(
            l.contains(&format!("\"{node}\" (iteration {k} of Loop \"{lp}\")")),
            "{name}: line {k}: {l}"
        );
        assert_eq!(l.contains("nan=0"), (k as u64) < it, "{name}: {l}");
    }
}

/// `rlx run DIR --output-dir` with `env`; asserts it succeeded and that each named output
/// has the dims of `expected_<name>.npy` (onnxruntime's, from scripts/gen_loop_models.py) and
/// its values within `tol` (absolute and relative). Returns the run's stderr.
fn run_and_compare(
    dir: &Path,
    case: &str,
    outputs: &[&str],
    env: &[(&str, &str)],
    tol: f64,
) -> String {
    let out = tmp(case);
    let (code, err) = rlx(
        &[
            "run",
            dir.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
        ],
        env,
    );
    assert_eq!(code, 0, "{err}");
    for o in outputs {
        let got = read_npy(&out.join(format!("{o}.npy"))).unwrap();
        let exp = read_npy(&dir.join(format!("expected_{o}.npy"))).unwrap();
        assert_eq!(got.dims(), exp.dims(), "{case} {o}");
        assert_close(&format!("{case} {o}"), &got, &exp, tol, tol);
    }
    err
}

#[test]
fn nan_in_an_unrolled_loop_names_the_iteration() {
    check_case("loop_const");
}

#[test]
fn nan_in_a_loop_run_between_segments_names_the_iteration() {
    check_case("loop_dyn");
}

/// `rlx trace`: the first non-finite op is the body node at the iteration, in the summary
/// line and trace.json (`iteration`, `iteration_text`).
#[test]
fn trace_names_the_iteration() {
    let Some(dir) = fixture("fixtures/loops/loop_const") else {
        return;
    };
    let (node, lp, it) = expected(&dir);
    let out = tmp("trace");
    let (code, err) = rlx(
        &["trace", dir.to_str().unwrap(), "-o", out.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let first = err
        .lines()
        .find(|l| l.starts_with("rlx trace: first non-finite value at"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        first.contains(&format!(
            " Sqrt \"{node}\" (iteration {it} of Loop \"{lp}\") ("
        )),
        "{first}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap()).unwrap();
    let f = &j["first_nonfinite"];
    assert_eq!(f["label"], node.as_str(), "{f}");
    assert_eq!(f["iteration"][0]["node"], lp.as_str(), "{f}");
    assert_eq!(f["iteration"][0]["op_type"], "Loop", "{f}");
    assert_eq!(f["iteration"][0]["iteration"], it, "{f}");
    assert_eq!(
        f["iteration_text"],
        format!("iteration {it} of Loop \"{lp}\"").as_str()
    );
    let html = std::fs::read_to_string(out.join("trace.html")).unwrap();
    assert!(
        html.contains(&format!("iteration {it} of Loop &quot;{lp}&quot;")),
        "the HTML names the iteration"
    );
}

/// A while loop (no trip count; the body computes its condition from data, so the importer
/// cannot unroll it): its body runs once per iteration at run time. The NaN report names the
/// body node and the iteration; the carried output and the scan output (every iteration's v,
/// stacked) are onnxruntime's.
#[test]
fn nan_in_a_loop_run_at_run_time_names_the_iteration() {
    let Some(dir) = fixture("fixtures/loops/loop_while") else {
        return;
    };
    let (node, lp, it) = expected(&dir);
    let err = run_and_compare(
        &dir,
        "loop_while",
        &["y", "v_scan"],
        &[("RLX_DEBUG_NANS", "1")],
        1e-6,
    );
    let r = report_of(&err, &node);
    assert!(
        r[0].contains(&format!(
            "Sqrt \"{node}\" (iteration {it} of Loop \"{lp}\", its body run at run time)"
        )),
        "the report names the body node and iteration {it}: {err}"
    );
    assert!(
        r.iter()
            .any(|l| l.contains("→ inputs finite, this op produced it")),
        "{err}"
    );
    // The iterations and the segment after the Loop only carry it: their inputs' reports
    // ("the graph input already holds it") are not printed.
    assert_eq!(
        err.matches("rlx nan-check:").count(),
        1,
        "one report, at the culprit: {err}"
    );
    // The abort line names the iteration as the report does.
    let (code, err) = rlx(
        &["run", dir.to_str().unwrap()],
        &[("RLX_DEBUG_NANS", "abort")],
    );
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains(&format!(
            "run stopped by RLX_DEBUG_NANS=abort at %6 Sqrt \"{node}\" (iteration {it} of Loop \"{lp}\", its body run at run time)"
        )),
        "{err}"
    );
}

/// A constant trip count beyond what the importer unrolls (5000 > 4096) runs at run time and
/// gives onnxruntime's (and the math's: x + 5000) output.
#[test]
fn a_loop_longer_than_the_unroll_limit_runs_at_run_time() {
    let Some(dir) = fixture("fixtures/loops/loop_long") else {
        return;
    };
    run_and_compare(&dir, "loop_long", &["y"], &[], 0.0);
}

/// Zero iterations (a trip count of 0 fed at run time) with a scan output: the carried value
/// unchanged and an empty `[0, 3]` stack, as onnxruntime gives.
#[test]
fn a_loop_of_zero_iterations_gives_an_empty_scan_output() {
    let Some(dir) = fixture("fixtures/loops/loop_zero") else {
        return;
    };
    run_and_compare(&dir, "loop_zero", &["y", "v_scan"], &[], 0.0);
}
