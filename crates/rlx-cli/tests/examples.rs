//! The shipped NaN examples: outputs match onnx's reference evaluator, and the localizer
//! names the culprit that `examples/*/expect.json` declares (derived by the generator from the
//! reference evaluator's intermediate values, not from RLX).

mod common;
use common::*;
use rlx_cli::npy::read_npy;
use rlx_ir::numeric_check::{BadKind, Cause, DebugMode};
use std::path::Path;

fn expect(dir: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(dir.join("expect.json")).expect("expect.json");
    serde_json::from_str(&s).expect("valid json")
}

fn check_outputs(name: &str) {
    let dir = repo().join("examples").join(name);
    let mut s = compile(&dir, DebugMode::Off);
    let f = feeds(&s, &dir, "input_");
    let outs = run(&mut s, &f);
    for ((oname, _), got) in s.outputs().iter().zip(&outs) {
        let want = read_npy(&dir.join(format!("expected_{oname}.npy"))).expect("expected output");
        let tol = if got.dtype() == rlx_ir::DType::F16 {
            1e-3
        } else {
            1e-5
        };
        assert_close(&format!("{name}/{oname}"), got, &want, tol, tol);
    }
}

#[test]
fn outputs_match_reference_evaluator() {
    for name in [
        "attention_masked_nan",
        "rmsnorm_eps0_nan",
        "rmsnorm_rsqrt_inf_nan",
        "const_fold_inf",
        "cast_f16_overflow",
        "healthy_mlp",
        "inf_absorbed",
        "sampler_temperature_zero",
    ] {
        check_outputs(name);
    }
}

/// Run under `mode`; returns the reports and whether the run aborted.
fn diagnose(name: &str, mode: DebugMode) -> (Vec<rlx_ir::NanReport>, bool, Option<String>) {
    let dir = repo().join("examples").join(name);
    let mut s = compile(&dir, mode);
    let f = feeds(&s, &dir, "input_");
    let r = s.run_tensors(f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect());
    let aborted = match r {
        Ok(_) => false,
        Err(e) if e.as_nan_abort().is_some() => true,
        Err(e) => panic!("{name}: {e}"),
    };
    (
        s.nan_reports().to_vec(),
        aborted,
        s.nan_summary().map(str::to_string),
    )
}

#[test]
fn culprits_match_expectations() {
    for name in [
        "attention_masked_nan",
        "rmsnorm_eps0_nan",
        "rmsnorm_rsqrt_inf_nan",
        "cast_f16_overflow",
        "sampler_temperature_zero",
    ] {
        let dir = repo().join("examples").join(name);
        let e = expect(&dir);
        let (reports, aborted, _) = diagnose(name, DebugMode::Warn);
        assert!(!aborted);
        let nan_origin = e["nan_origin"].as_str().unwrap();
        assert_eq!(
            reports.len(),
            1,
            "{name}: exactly one culprit report, got {reports:#?}"
        );
        let r = &reports[0];
        assert_eq!(r.label, nan_origin, "{name}: culprit label");
        assert_eq!(r.kind, BadKind::NaN);
        assert!(r.fix.is_some(), "{name}: a culprit has a fix line");
        match (&r.cause, e["inf_origin"].as_str()) {
            (
                Cause::InputsHeldInf {
                    inf_origin_label, ..
                },
                Some(inf),
            ) => {
                assert_eq!(inf_origin_label.as_deref(), Some(inf), "{name}: inf origin")
            }
            (Cause::InputsFinite, None) => {}
            (c, i) => panic!("{name}: cause {c:?} but expected inf origin {i:?}"),
        }
        let text = r.to_string();
        assert!(text.starts_with("rlx nan-check: NaN at index "), "{text}");
        assert!(text.contains(&format!("\"{nan_origin}\"")), "{text}");
    }
}

/// A temperature of 0 dividing the logits gets the sampler's fix line (issue 31), and only
/// there: the other NaN examples keep their own lines.
#[test]
fn temperature_zero_gets_the_samplers_fix_line() {
    let (reports, _, _) = diagnose("sampler_temperature_zero", DebugMode::Warn);
    let fix = reports[0].fix.as_deref().unwrap_or("");
    assert!(
        fix.starts_with("the sampler divides the logits by a temperature of 0"),
        "{fix}"
    );
    assert!(
        fix.contains("argmax") && fix.contains("do_sample=False"),
        "{fix}"
    );
    assert!(fix.contains("max(T, 1e-5)"), "{fix}");
    for name in [
        "attention_masked_nan",
        "rmsnorm_eps0_nan",
        "rmsnorm_rsqrt_inf_nan",
        "cast_f16_overflow",
    ] {
        let (reports, _, _) = diagnose(name, DebugMode::Warn);
        assert!(
            reports
                .iter()
                .all(|r| !r.fix.as_deref().unwrap_or("").contains("temperature")),
            "{name}: {reports:#?}"
        );
    }
    // From the command line: the report, then the fix, on stderr.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["run", "examples/sampler_temperature_zero"])
        .current_dir(repo())
        .env("RLX_DEBUG_NANS", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("\"sampler.softmax\""), "{err}");
    assert!(err.contains("\"sampler.temperature_div\""), "{err}");
    assert!(
        err.contains("fix: the sampler divides the logits by a temperature of 0"),
        "{err}"
    );
}

#[test]
fn inf_reaching_output_is_reported_at_its_origin() {
    let dir = repo().join("examples/const_fold_inf");
    let e = expect(&dir);
    let (reports, _, _) = diagnose("const_fold_inf", DebugMode::Warn);
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert_eq!(reports[0].label, e["inf_origin"].as_str().unwrap());
    assert_eq!(reports[0].kind, BadKind::PosInf);
    assert!(reports[0]
        .note
        .as_deref()
        .unwrap_or("")
        .contains("reached graph output"));
}

#[test]
fn absorbed_inf_stays_quiet() {
    // The contract (numeric_check's module doc, DESIGN.md): an Inf absorbed downstream is
    // never a culprit report and never aborts; the run keeps one summary line naming how
    // many ops created such an Inf and the first of them, as one of expect.json's intended
    // `inf_origin` ops.
    let e = expect(&repo().join("examples/inf_absorbed"));
    let origins: Vec<&str> = e["inf_origin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let (reports, aborted, summary) = diagnose("inf_absorbed", DebugMode::Abort);
    assert!(reports.is_empty(), "{reports:#?}");
    assert!(!aborted);
    let line = summary.expect("a summary line for the absorbed -inf");
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(line.starts_with("rlx nan-check: note: "), "{line}");
    assert!(line.contains("absorbed"), "{line}");
    assert!(
        line.contains(&format!("{} op(s)", origins.len())),
        "{line}: {origins:?}"
    );
    assert!(
        origins.iter().any(|o| line.contains(&format!("\"{o}\""))),
        "{line}: {origins:?}"
    );
    assert!(!line.contains("NaN"), "{line}");
    let (reports, _, _) = diagnose("healthy_mlp", DebugMode::Warn);
    assert!(reports.is_empty());
}

#[test]
fn abort_mode_stops_at_the_culprit() {
    let (reports, aborted, _) = diagnose("attention_masked_nan", DebugMode::Abort);
    assert!(aborted);
    assert_eq!(reports[0].label, "layer0.attn.softmax");
    let (reports, aborted, _) = diagnose("const_fold_inf", DebugMode::Abort);
    assert!(
        aborted,
        "an Inf reaching an output aborts at the end of the run"
    );
    assert_eq!(reports.len(), 1);
}

#[test]
fn scanning_off_reports_nothing() {
    let (reports, aborted, summary) = diagnose("attention_masked_nan", DebugMode::Off);
    assert!(reports.is_empty() && !aborted && summary.is_none());
}

#[test]
fn strict_mode_reports_inf_where_it_first_appears() {
    let (reports, _, summary) = diagnose("inf_absorbed", DebugMode::Strict);
    assert!(!reports.is_empty(), "strict reports the intended -inf too");
    assert!(reports.iter().all(|r| r.kind != BadKind::NaN));
    // The summary line must not claim they went unreported (the warn-mode wording).
    let summary = summary.expect("a summary of the absorbed Inf");
    assert!(summary.contains("reported above"), "{summary}");
    assert!(!summary.contains("not reported"), "{summary}");
    let (_, _, summary) = diagnose("inf_absorbed", DebugMode::Warn);
    assert!(summary.unwrap().contains("strict reports it"));
}

#[test]
fn lint_reports_constant_inf() {
    use rlx_onnx_import::{import_onnx, ImportOptions};
    for (name, label) in [
        ("const_fold_inf", "const.inv_zero"),
        ("cast_f16_overflow", "attn.mask_fill_cast_f16"),
    ] {
        let g = import_onnx(
            &repo().join("examples").join(name).join("model.onnx"),
            &ImportOptions::default(),
        )
        .unwrap();
        let lints = rlx_compile::numeric_lint(&g);
        assert!(lints.iter().any(|l| l.label == label), "{name}: {lints:#?}");
        assert!(lints[0].to_string().starts_with("rlx numeric-lint: %"));
    }
    for name in ["healthy_mlp", "rmsnorm_eps0_nan"] {
        let g = import_onnx(
            &repo().join("examples").join(name).join("model.onnx"),
            &ImportOptions::default(),
        )
        .unwrap();
        assert!(rlx_compile::numeric_lint(&g).is_empty(), "{name}");
    }
}
