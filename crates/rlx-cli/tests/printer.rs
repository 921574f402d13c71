//! The intermediate-value printer (RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER, RLX_FILTERED_OPS_TO_PRINT)
//! through `rlx run`, and its statistics through the library, against values from the
//! reference evaluator (examples/healthy_mlp/expected_probs.npy) and hand-derived math.

use rlx_cli::npy::read_npy;
use rlx_ir::{DType, Graph, Shape, Tensor, TensorData};
use rlx_runtime::printer::{format_values, Num, PrinterConfig, TensorStats};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `rlx run -q examples/<name>` with the printer variables; returns the `rlx print:` lines.
fn printed(name: &str, level: Option<&str>, filter: Option<&str>) -> Vec<String> {
    printed_on("cpu", name, level, filter)
}

/// [`printed`] with `--device`.
fn printed_on(dev: &str, name: &str, level: Option<&str>, filter: Option<&str>) -> Vec<String> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx"));
    c.args(["run", "-q", "--device", dev])
        .arg(repo().join("examples").join(name))
        .env_remove("RLX_DEBUG_NANS")
        .env_remove("RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER")
        .env_remove("RLX_FILTERED_OPS_TO_PRINT");
    if let Some(l) = level {
        c.env("RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER", l);
    }
    if let Some(f) = filter {
        c.env("RLX_FILTERED_OPS_TO_PRINT", f);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| l.starts_with("rlx print:") || l.starts_with("  values:"))
        .map(str::to_string)
        .collect()
}

fn field(line: &str, key: &str) -> f64 {
    let s = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"));
    s.parse().unwrap()
}

fn close(a: f64, b: f64) -> bool {
    // printed with 6 significant digits
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

#[test]
fn off_by_default() {
    assert!(printed("healthy_mlp", None, None).is_empty());
    assert!(printed("healthy_mlp", Some("0"), None).is_empty());
}

#[test]
fn level1_prints_each_op_and_the_output_stats_match_the_reference() {
    let lines = printed("healthy_mlp", Some("1"), None);
    assert!(lines.len() >= 4, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l.starts_with("rlx print: %")),
        "{lines:#?}"
    );
    // the input is printed (leaves: graph inputs yes, weights/constants no)
    assert!(lines[0].contains("Input \"x\""), "{}", lines[0]);
    assert!(!lines.iter().any(|l| l.contains("mlp.fc1.weight")));
    // the last op produced the graph output: its stats against the reference evaluator's
    let last = lines.last().unwrap();
    assert!(last.contains("\"mlp.softmax\""), "{last}");
    let want = read_npy(&repo().join("examples/healthy_mlp/expected_probs.npy")).unwrap();
    let v = want.data().to_f64_vec();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    assert!(close(field(last, "min"), lo), "{last} vs {lo}");
    assert!(close(field(last, "max"), hi), "{last} vs {hi}");
    assert!(close(field(last, "mean"), mean), "{last} vs {mean}");
    assert!(close(field(last, "max|x|"), hi), "{last}");
    assert!(last.ends_with("nan=0 +inf=0 -inf=0"), "{last}");
    assert!(
        last.contains("f32[4,10]") || last.contains("f32[4, 10]"),
        "{last}"
    );
}

#[test]
fn level1_counts_nonfinite_like_the_reference() {
    // expect.json: Softmax "layer0.attn.softmax" output has 16 NaN (reference evaluator)
    let lines = printed(
        "attention_masked_nan",
        Some("1"),
        Some("layer0.attn.softmax"),
    );
    let last = lines.last().unwrap();
    assert!(last.contains("nan=16 +inf=0 -inf=0"), "{last}");
}

#[test]
fn level2_prints_first_and_last_values() {
    let lines = printed("healthy_mlp", Some("2"), Some("mlp.softmax"));
    let k = lines
        .iter()
        .rposition(|l| l.starts_with("  values:"))
        .unwrap();
    let want = read_npy(&repo().join("examples/healthy_mlp/expected_probs.npy")).unwrap();
    let v = want.data().to_f64_vec();
    let got: Vec<&str> = lines[k]
        .trim_start_matches("  values: [")
        .trim_end_matches(']')
        .split(", ")
        .collect();
    assert_eq!(got.len(), 7, "{}", lines[k]);
    assert_eq!(got[3], "...");
    let n = v.len();
    for (g, w) in got[..3]
        .iter()
        .zip(&v[..3])
        .chain(got[4..].iter().zip(&v[n - 3..]))
    {
        assert!(close(g.parse().unwrap(), *w), "{g} vs {w}");
    }
}

#[test]
fn level3_names_each_op_before_it_runs() {
    let lines = printed("healthy_mlp", Some("3"), None);
    let mut expecting: Option<String> = None;
    let mut runs = 0;
    for l in &lines {
        if let Some(rest) = l.strip_prefix("rlx print: running ") {
            assert!(expecting.is_none(), "two running lines in a row: {l}");
            expecting = Some(rest.to_string());
            runs += 1;
        } else {
            let head = expecting
                .take()
                .expect("a stats line follows its running line");
            assert!(
                l.starts_with(&format!("rlx print: {head} ")),
                "{head} / {l}"
            );
        }
    }
    assert!(runs >= 4);
}

#[test]
fn filter_matches_label_op_name_and_id() {
    let all = printed("healthy_mlp", Some("1"), None);
    let fc = printed("healthy_mlp", Some("1"), Some("mlp.fc?"));
    assert!(!fc.is_empty() && fc.len() < all.len());
    assert!(
        fc.iter()
            .all(|l| l.contains("\"mlp.fc1\"") || l.contains("\"mlp.fc2\"")),
        "{fc:#?}"
    );
    let mm = printed("healthy_mlp", Some("1"), Some("MatMul"));
    assert!(
        !mm.is_empty() && mm.iter().all(|l| l.contains(" MatMul ")),
        "{mm:#?}"
    );
    // %id of the first printed line
    let id = all[0].split_whitespace().nth(2).unwrap().to_string();
    let one = printed("healthy_mlp", Some("1"), Some(&format!("nothing,{id}")));
    assert_eq!(one, vec![all[0].clone()]);
}

#[test]
fn stats_are_hand_derived() {
    let t = Tensor::new(
        vec![6],
        TensorData::F32(vec![
            1.0,
            -2.0,
            f32::NAN,
            f32::INFINITY,
            4.0,
            f32::NEG_INFINITY,
        ]),
    )
    .unwrap();
    let s = TensorStats::of(&t);
    assert_eq!(s.min, Some(Num::Float(-2.0)));
    assert_eq!(s.max, Some(Num::Float(4.0)));
    assert_eq!(s.mean, Some(1.0));
    assert_eq!(s.max_abs, Some(4.0));
    assert_eq!((s.nan, s.pos_inf, s.neg_inf), (1, 1, 1));
    assert_eq!(
        s.to_string(),
        "min=-2 max=4 mean=1 max|x|=4 nan=1 +inf=1 -inf=1"
    );
    // integers exact beyond 2^53
    let t = Tensor::new(vec![2], TensorData::I64(vec![i64::MAX, -3])).unwrap();
    let s = TensorStats::of(&t);
    assert_eq!(s.max, Some(Num::Int(i64::MAX as i128)));
    assert!(s.to_string().starts_with("min=-3 max=9223372036854775807 "));
    let t = Tensor::new(vec![1], TensorData::U64(vec![u64::MAX])).unwrap();
    assert!(TensorStats::of(&t)
        .to_string()
        .contains("max=18446744073709551615"));
    // f16 read in its own dtype: 65504 is exact
    let t = Tensor::new(vec![2], TensorData::from_f64(DType::F16, &[65504.0, -1.0])).unwrap();
    assert_eq!(TensorStats::of(&t).max_abs, Some(65504.0));
    assert_eq!(
        format_values(&TensorData::I64((1..=9).collect()), 3),
        "[1, 2, 3, ..., 7, 8, 9]"
    );
    assert_eq!(format_values(&TensorData::I64(vec![1, 2]), 3), "[1, 2]");
}

#[test]
fn library_api_formats_lines_and_overrides_the_environment() {
    let mut g = Graph::new("d");
    let x = g.input("x", Shape::new(&[2, 2], DType::F32));
    let w = g.param("w", Shape::new(&[2, 2], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[2, 2], DType::F32));
    g.set_outputs(vec![y]);
    let mut s = rlx_runtime::Session::new(rlx_runtime::Device::Cpu).compile(g);
    s.set_param("w", &[1.0, 0.0, 0.0, 1.0]);
    s.set_value_printer(Some(PrinterConfig::new(2).with_filters(&["MatMul"])));
    let out = s.run(&[("x", &[1.0, 2.0, 3.0, 4.0])]);
    assert_eq!(out[0], vec![1.0, 2.0, 3.0, 4.0]);
    let cfg = PrinterConfig::new(1);
    let g = s.graph();
    let id = g.outputs[0];
    let t = Tensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let line = cfg.line_after(g, id, &t).unwrap();
    assert!(
        line.ends_with("min=1 max=4 mean=2.5 max|x|=4 nan=0 +inf=0 -inf=0"),
        "{line}"
    );
    // params are not printed
    let p = g.params()[0];
    assert!(cfg.line_after(g, p, &t).is_none());
    assert!(PrinterConfig::off().line_after(g, id, &t).is_none());
}

/// The printer on the wgpu backend (values read back after the run, printed in the same
/// order and format as on the CPU): the same ops, the reference's output statistics, and the
/// same NaN count. Skipped without an adapter unless RLX_REQUIRE_GPU=1.
#[test]
fn the_printer_works_on_wgpu() {
    if !rlx_runtime::available_devices().contains(&rlx_runtime::Device::Wgpu) {
        assert!(
            !rlx_ir::env::is_on("RLX_REQUIRE_GPU"),
            "RLX_REQUIRE_GPU=1 but no adapter"
        );
        eprintln!("skipping the_printer_works_on_wgpu: no wgpu adapter");
        return;
    }
    let cpu = printed("healthy_mlp", Some("1"), None);
    let gpu = printed_on("wgpu", "healthy_mlp", Some("1"), None);
    let head = |l: &String| l.split(" min=").next().unwrap().to_string();
    assert_eq!(
        cpu.iter().map(head).collect::<Vec<_>>(),
        gpu.iter().map(head).collect::<Vec<_>>()
    );
    let last = gpu.last().unwrap();
    let want = read_npy(&repo().join("examples/healthy_mlp/expected_probs.npy")).unwrap();
    let hi = want
        .data()
        .to_f64_vec()
        .into_iter()
        .fold(f64::NEG_INFINITY, f64::max);
    assert!((field(last, "max") - hi).abs() <= 1e-5, "{last} vs {hi}");
    let nan = printed_on(
        "wgpu",
        "attention_masked_nan",
        Some("1"),
        Some("layer0.attn.softmax"),
    );
    assert!(
        nan.last().unwrap().contains("nan=16 +inf=0 -inf=0"),
        "{nan:#?}"
    );
    let l3 = printed_on("wgpu", "healthy_mlp", Some("3"), None);
    assert!(
        l3.iter().any(|l| l.starts_with("rlx print: running %")),
        "{l3:#?}"
    );
}
