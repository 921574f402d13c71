//! The numerical stability harness (issue 28): every case under `fixtures/stability/`
//! (written by `scripts/gen_stability_cases.py`, which `.ci/run` runs) is a one-node model
//! fed extreme inputs with the exact float64 result of the op's definition. RLX's CPU value
//! must be finite wherever that result, rounded to the output dtype, is finite, and within
//! the case's tolerance (`|got - exact| <= atol + rtol * |exact|`); where it is not finite,
//! RLX must give the same NaN / +inf / -inf.
//!
//! A second test checks coverage: every op of the importer's ai.onnx registry has a case, or
//! is listed in `scripts/stability/exempt.txt` (ops that compute no float value, with the
//! reason) or `scripts/stability/pending.txt` (float ops without a case yet: printed by the
//! test, and the list may only shrink).

mod common;

use common::{compile, feeds, repo};
use rlx_cli::npy::read_npy;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::{DType, Tensor};
use rlx_runtime::CompiledGraph;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn cases_dir() -> Option<PathBuf> {
    common::fixture("fixtures/stability")
}

/// `v` rounded to `dt` (the value the output dtype holds for the exact result).
fn round_to(dt: DType, v: f64) -> f64 {
    match dt {
        DType::F32 => v as f32 as f64,
        DType::F16 => rlx_ir::tensor::f16_from_f64(v).to_f64(),
        DType::BF16 => rlx_ir::tensor::bf16_from_f64(v).to_f64(),
        _ => v,
    }
}

fn case_dirs(root: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    v.sort();
    v
}

/// bfloat16 inputs are stored as float32 `.npy` files (numpy has no bfloat16; see
/// `scripts/stability/bf16.py`): cast each to the model input's bfloat16, refusing a file
/// whose values bfloat16 cannot hold exactly (the case's expected values were computed on
/// the file's values).
fn bf16_inputs(
    s: &CompiledGraph,
    f: Vec<(String, Tensor)>,
) -> Result<Vec<(String, Tensor)>, String> {
    let want: std::collections::HashMap<String, DType> = s
        .inputs()
        .into_iter()
        .map(|(n, sh)| (n, sh.dtype))
        .collect();
    f.into_iter()
        .map(|(name, t)| {
            if want.get(&name) != Some(&DType::BF16) || t.dtype() != DType::F32 {
                return Ok((name, t));
            }
            let b = t.data().cast(DType::BF16);
            let (x, y) = (t.data().to_f64_vec(), b.to_f64_vec());
            if let Some(i) =
                (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits() && !x[i].is_nan())
            {
                return Err(format!(
                    "input {name}[{i}] = {:e} is not a bfloat16 value",
                    x[i]
                ));
            }
            Ok((name, Tensor::new(t.dims().to_vec(), b).unwrap()))
        })
        .collect()
}

/// Run one case; `Err` lists its failing elements (at most 5).
fn run_case(dir: &std::path::Path) -> Result<(), String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let (rtol, atol) = (
        meta["rtol"].as_f64().unwrap_or(0.0),
        meta["atol"].as_f64().unwrap_or(0.0),
    );
    let mut s = compile(dir, DebugMode::Off);
    let f = bf16_inputs(&s, feeds(&s, dir, "input_"))?;
    let outs = s
        .run_tensors(f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
        .map_err(|e| format!("run: {e}"))?;
    let names = s.outputs();
    let mut bad = vec![];
    for ((name, _), got) in names.iter().zip(&outs) {
        let want =
            read_npy(&dir.join(format!("expected_{name}.npy"))).map_err(|e| e.to_string())?;
        let (w, g) = (want.data().to_f64_vec(), got.data().to_f64_vec());
        if w.len() != g.len() {
            return Err(format!(
                "{name}: {} elements, expected {}",
                g.len(),
                w.len()
            ));
        }
        let x: Option<Vec<f64>> = f
            .first()
            .filter(|(_, t)| t.numel() == w.len())
            .map(|(_, t)| t.data().to_f64_vec());
        for i in 0..w.len() {
            let exact = round_to(got.dtype(), w[i]);
            let ok = if exact.is_finite() {
                g[i].is_finite() && (g[i] - exact).abs() <= atol + rtol * exact.abs()
            } else if exact.is_nan() {
                g[i].is_nan()
            } else {
                g[i] == exact
            };
            if !ok && bad.len() < 5 {
                let input = x
                    .as_ref()
                    .map(|x| format!(" (input {:e})", x[i]))
                    .unwrap_or_default();
                bad.push(format!(
                    "{name}[{i}]{input}: got {:e}, exact {:e} (as {}: {:e})",
                    g[i],
                    w[i],
                    got.dtype(),
                    exact
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("\n    "))
    }
}

#[test]
fn every_case_is_finite_where_the_math_is_and_within_tolerance() {
    let Some(root) = cases_dir() else { return };
    let dirs = case_dirs(&root);
    assert!(!dirs.is_empty(), "no cases in {}", root.display());
    let mut failed = vec![];
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        if let Err(e) = std::panic::catch_unwind(|| run_case(d))
            .unwrap_or_else(|p| Err(format!("panicked: {p:?}")))
        {
            failed.push(format!("{name}:\n    {e}"));
        }
    }
    eprintln!(
        "stability: {} of {} cases pass",
        dirs.len() - failed.len(),
        dirs.len()
    );
    assert!(
        failed.is_empty(),
        "{} cases fail:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

fn listed(file: &str) -> Vec<(String, String)> {
    let p = repo().join("scripts/stability").join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, why) = l.split_once('\t').unwrap_or((l, ""));
            (op.trim().to_string(), why.trim().to_string())
        })
        .collect()
}

#[test]
fn every_registry_op_has_a_case_or_a_listed_reason() {
    let Some(root) = cases_dir() else { return };
    let covered: BTreeSet<String> = case_dirs(&root)
        .iter()
        .filter_map(|d| {
            let n = d.file_name()?.to_string_lossy().to_string();
            n.split_once("__").map(|(op, _)| op.to_string())
        })
        .collect();
    let exempt = listed("exempt.txt");
    let pending = listed("pending.txt");
    for (op, why) in &exempt {
        assert!(!why.is_empty(), "exempt.txt: {op} needs a reason");
        assert!(
            !covered.contains(op),
            "{op} has a case and is listed as exempt"
        );
    }
    for (op, _) in &pending {
        assert!(
            !covered.contains(op),
            "{op} has a case now: remove it from scripts/stability/pending.txt"
        );
    }
    let mut missing = vec![];
    for op in rlx_onnx_import::supported_ops() {
        let listed = exempt.iter().chain(&pending).any(|(o, _)| o == op);
        if !covered.contains(op) && !listed {
            missing.push(op);
        }
    }
    eprintln!(
        "stability: {} ops covered: {}",
        covered.len(),
        covered.iter().cloned().collect::<Vec<_>>().join(" ")
    );
    eprintln!(
        "stability: {} float ops without a case yet (scripts/stability/pending.txt): {}",
        pending.len(),
        pending
            .iter()
            .map(|p| p.0.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        missing.is_empty(),
        "ops with no stability case and no listed reason: {missing:?} (add a case to \
         scripts/gen_stability_cases.py, or a line to scripts/stability/exempt.txt)"
    );
    // The pending list only shrinks: its size is pinned here.
    assert!(
        !pending.len().gt(&PENDING_AT_MOST),
        "scripts/stability/pending.txt grew to {} (at most {PENDING_AT_MOST})",
        pending.len()
    );
}

/// The number of float ops without a stability case when the harness was written; lower it
/// as cases are added (the test fails if the pending list grows past it).
const PENDING_AT_MOST: usize = 0;
