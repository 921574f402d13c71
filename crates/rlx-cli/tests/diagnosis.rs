//! Diagnosis quality on small models written here (issue 28): RLX's own arithmetic must not
//! create a NaN/Inf the math does not have, stash types are honoured, and the reports and
//! lint lines name the op that created a value with advice that follows from the cause.
//!
//! Expected values are float64 evaluations of each op's definition (the ONNX operator text
//! and function bodies), written out in the test, never RLX's own output.

use prost::Message;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::{NanReport, Tensor, TensorData};
use rlx_onnx_import::proto::*;
use rlx_onnx_import::tensor::tensor_to_proto;
use rlx_onnx_import::{import_onnx_bytes, ImportOptions};
use rlx_runtime::{CompiledGraph, Device, Session};

// ---- a small ONNX model builder ----

fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(DimValue::DimValue(d)),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            }),
            denotation: String::new(),
        }),
    }
}

fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        domain: String::new(),
        attribute: attrs,
    }
}

fn a_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INT,
        i: v,
        ..Default::default()
    }
}

fn a_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::FLOAT,
        f: v,
        ..Default::default()
    }
}

fn init(name: &str, t: &Tensor) -> TensorProto {
    tensor_to_proto(name, t)
}

/// A model of `nodes` with graph inputs `inputs` (name, ONNX elem type, dims) and outputs
/// `outputs` (names; their types are inferred).
fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: &[(&str, i32, &[i64])],
    outputs: &[&str],
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "diagnosis".into(),
            initializer: inits,
            input: inputs.iter().map(|(n, e, d)| vi(n, *e, d)).collect(),
            output: outputs
                .iter()
                .map(|n| ValueInfoProto {
                    name: n.to_string(),
                    r#type: None,
                })
                .collect(),
            value_info: vec![],
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn compile(bytes: &[u8], mode: DebugMode) -> CompiledGraph {
    let g = import_onnx_bytes(bytes, None, &ImportOptions::default()).expect("import");
    let mut s = Session::new(Device::Cpu).try_compile(g).expect("compile");
    s.set_debug_mode(Some(mode));
    s.set_print_reports(false);
    s
}

/// Run with the scanner in `mode`: outputs, reports, summary line.
fn run(
    bytes: &[u8],
    mode: DebugMode,
    feeds: Vec<(&str, Tensor)>,
) -> (Vec<Tensor>, Vec<NanReport>, Option<String>) {
    let mut s = compile(bytes, mode);
    let out = s.run_tensors(feeds).expect("run");
    (
        out,
        s.nan_reports().to_vec(),
        s.nan_summary().map(str::to_string),
    )
}

fn f16_tensor(dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::new(dims.to_vec(), TensorData::from_f64(rlx_ir::DType::F16, v)).unwrap()
}

/// float64 value rounded to f32 / f16, as the output dtype holds it.
fn f16_round(x: f64) -> f64 {
    half::f16::from_f64(x).to_f64()
}

// ---- RLX's own arithmetic never makes an Inf the math does not have ----

/// The case: ReduceLogSumExp over a row whose largest value is about 95. `exp(95)`
/// overflows float32, but log-sum-exp is 95.x; onnxruntime and the reference evaluator
/// return it. Expected: the float64 definition `m + log(sum(exp(x - m)))`.
#[test]
fn reduce_log_sum_exp_of_large_values_is_finite_and_unreported() {
    let rows: [[f32; 4]; 3] = [
        [95.0, 93.0, 1.0, -3.0],        // exp(95) overflows f32
        [-1e4, -1e4 + 1.0, -2e4, -1e4], // every exp underflows to 0: log(0) = -inf directly
        [0.5, -0.25, 2.0, 1.0],         // ordinary
    ];
    let want: Vec<f64> = rows
        .iter()
        .map(|r| {
            let m = r
                .iter()
                .map(|&v| v as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            m + r.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
        })
        .collect();
    for (opset, keepdims) in [(18, 1), (18, 0), (13, 0)] {
        let mut attrs = vec![a_int("keepdims", keepdims)];
        let (ins, inits): (Vec<&str>, Vec<TensorProto>) = if opset >= 18 {
            (
                vec!["x", "axes"],
                vec![init("axes", &Tensor::from_i64(&[1], vec![1]).unwrap())],
            )
        } else {
            attrs.push(AttributeProto {
                name: "axes".into(),
                r#type: attr_type::INTS,
                ints: vec![1],
                ..Default::default()
            });
            (vec!["x"], vec![])
        };
        let m = model(
            opset,
            vec![node("ReduceLogSumExp", "lse", &ins, &["y"], attrs)],
            inits,
            &[("x", data_type::FLOAT, &[3, 4])],
            &["y"],
        );
        let x = Tensor::from_f32(&[3, 4], rows.concat()).unwrap();
        let (out, reports, summary) = run(&m, DebugMode::Warn, vec![("x", x)]);
        let y = out[0].data().to_f64_vec();
        assert_eq!(y.len(), 3);
        for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
            assert!(
                g.is_finite() && (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "opset {opset} keepdims {keepdims} row {i}: got {g}, exact {w}"
            );
        }
        assert!(reports.is_empty(), "no report expected: {reports:?}");
        assert!(
            summary.is_none(),
            "no absorbed-Inf note expected: {summary:?}"
        );
    }
    // The definition's own infinities are kept: a row of -inf is -inf, a +inf is +inf.
    let m = model(
        13,
        vec![node(
            "ReduceLogSumExp",
            "lse",
            &["x"],
            &["y"],
            vec![
                a_int("keepdims", 0),
                AttributeProto {
                    name: "axes".into(),
                    r#type: attr_type::INTS,
                    ints: vec![1],
                    ..Default::default()
                },
            ],
        )],
        vec![],
        &[("x", data_type::FLOAT, &[3, 2])],
        &["y"],
    );
    let x = Tensor::from_f32(
        &[3, 2],
        vec![
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::INFINITY,
            1.0,
            f32::NAN,
            1.0,
        ],
    )
    .unwrap();
    let (out, _, _) = run(&m, DebugMode::Off, vec![("x", x)]);
    let y = out[0].data().to_f64_vec();
    assert_eq!(y[0], f64::NEG_INFINITY);
    assert_eq!(y[1], f64::INFINITY);
    assert!(y[2].is_nan());
}

// ---- stash and accumulation types ----

/// float16 LayerNormalization (opset 17, `stash_type` default 1): the function body casts X
/// to float32 for stage one (mean, variance, normalized value), so a spiky token whose
/// square overflows float16 (300² = 90000 > 65504) is still normalized. Computed in float16
/// the variance is +inf, 1/sqrt gives 0 and the row silently becomes the bias.
/// Expected: the body's stage one in float64, rounded to float16, then `* scale + bias`.
#[test]
fn float16_layer_norm_honours_stash_type() {
    let n = 8;
    let rows: [[f64; 8]; 2] = [
        [300.0, 1.0, -1.0, 2.0, 0.5, -2.0, 3.0, 0.25],
        [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8],
    ];
    let scale: Vec<f64> = (0..n).map(|i| 0.5 + 0.125 * i as f64).collect();
    let bias: Vec<f64> = (0..n).map(|i| 0.25 - 0.0625 * i as f64).collect();
    let eps = 1e-5;
    for stash in [None, Some(1)] {
        let mut attrs = vec![a_float("epsilon", eps as f32), a_int("axis", -1)];
        attrs.extend(stash.map(|s| a_int("stash_type", s)));
        let m = model(
            17,
            vec![node(
                "LayerNormalization",
                "ln",
                &["x", "s", "b"],
                &["y"],
                attrs,
            )],
            vec![
                init("s", &f16_tensor(&[n], &scale)),
                init("b", &f16_tensor(&[n], &bias)),
            ],
            &[("x", data_type::FLOAT16, &[2, n as i64])],
            &["y"],
        );
        let x = f16_tensor(&[2, n], &rows.concat());
        let (out, reports, _) = run(&m, DebugMode::Warn, vec![("x", x)]);
        let y = out[0].data().to_f64_vec();
        for (r, row) in rows.iter().enumerate() {
            let xr: Vec<f64> = row.iter().map(|&v| f16_round(v)).collect();
            let mean = xr.iter().sum::<f64>() / n as f64;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            for i in 0..n {
                let normalized = f16_round((xr[i] - mean) / (var + eps).sqrt());
                let want = f16_round(f16_round(normalized * scale[i]) + bias[i]);
                let got = y[r * n + i];
                // Two float16 units in the last place of the value (2^-10 relative), plus
                // one of the bias's scale for results near zero.
                let tol = 2.0 * want.abs() * 2f64.powi(-10) + 2f64.powi(-12);
                assert!(
                    (got - want).abs() <= tol,
                    "stash {stash:?} row {r} elem {i}: got {got}, function body {want}"
                );
            }
        }
        assert!(reports.is_empty(), "{reports:?}");
    }
}

// ---- overflow that silently zeroes data is reported; intended infinities stay quiet ----

fn f32s(dims: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32(dims, v).unwrap()
}

fn scalar_init(name: &str, v: f32) -> TensorProto {
    init(name, &Tensor::scalar_f32(v))
}

/// An RMSNorm written with basic ops (Pow, ReduceMean, Add, Sqrt, Div) on a row holding one
/// spiky token: 1e20² overflows float32, the mean square is +inf, and `x / inf` gives 0 for
/// the whole row, where the exact values are finite (1e20 / (1e20/√4) = 2 for the spike).
/// The output is all finite, so the old rule called the Inf "absorbed"; it destroyed data.
#[test]
fn overflow_that_zeroes_a_row_is_reported_at_the_overflowing_op() {
    let m = model(
        18,
        vec![
            node("Pow", "rms.pow", &["x", "two"], &["sq"], vec![]),
            node("ReduceMean", "rms.mean", &["sq", "axes"], &["ms"], vec![]),
            node("Add", "rms.add_eps", &["ms", "eps"], &["mse"], vec![]),
            node("Sqrt", "rms.sqrt", &["mse"], &["rms"], vec![]),
            node("Div", "rms.div", &["x", "rms"], &["y"], vec![]),
        ],
        vec![
            scalar_init("two", 2.0),
            scalar_init("eps", 1e-6),
            init("axes", &Tensor::from_i64(&[1], vec![-1]).unwrap()),
        ],
        &[("x", data_type::FLOAT, &[2, 4])],
        &["y"],
    );
    let x = f32s(&[2, 4], vec![1e20, 1.0, -2.0, 3.0, 0.5, 1.0, -1.5, 2.0]);
    let (out, reports, summary) = run(&m, DebugMode::Warn, vec![("x", x)]);
    // The exact output of row 0 is finite and non-zero; RLX's value is still computed in
    // f32 (this test is about the report, not about rescuing the value).
    let y = out[0].data().to_f64_vec();
    assert!(y[..4].iter().all(|v| *v == 0.0), "row 0 zeroed: {y:?}");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0];
    assert_eq!(r.label, "rms.pow");
    assert_eq!(r.kind, rlx_ir::numeric_check::BadKind::PosInf);
    let note = r.note.as_deref().unwrap_or("");
    assert!(
        note.contains("rms.div") && note.contains("destructively") && note.contains("0 in 4 of 8"),
        "{note}"
    );
    let fix = r.fix.as_deref().unwrap_or("");
    assert!(
        fix.contains("overflow") && !fix.contains("negative base"),
        "{fix}"
    );
    assert!(summary.is_none(), "not called absorbed: {summary:?}");
    // Abort mode stops there.
    let mut s = compile(&m, DebugMode::Abort);
    let x = f32s(&[2, 4], vec![1e20, 1.0, -2.0, 3.0, 0.5, 1.0, -1.5, 2.0]);
    let e = s.run_tensors(vec![("x", x)]).unwrap_err();
    assert!(e.as_nan_abort().is_some(), "{e}");
}

/// The intended infinities the Inf policy exists for stay quiet: a float16 attention score
/// plus an HF-style `finfo(float16).min` mask overflows to -inf and the softmax turns it
/// into 0 (`exp(-inf)`); a T5-style `log(0)` is discarded by a `Where`.
#[test]
fn intended_infinities_stay_quiet() {
    // Softmax over [score + mask] in float16: -100 + -65504 rounds to -inf.
    let m = model(
        17,
        vec![
            node(
                "Add",
                "attn.mask_add",
                &["score", "mask"],
                &["masked"],
                vec![],
            ),
            node(
                "Softmax",
                "attn.softmax",
                &["masked"],
                &["p"],
                vec![a_int("axis", -1)],
            ),
        ],
        vec![],
        &[
            ("score", data_type::FLOAT16, &[1, 4]),
            ("mask", data_type::FLOAT16, &[1, 4]),
        ],
        &["p"],
    );
    let score = f16_tensor(&[1, 4], &[1.0, -100.0, 2.0, -100.0]);
    let mask = f16_tensor(&[1, 4], &[0.0, -65504.0, 0.0, -65504.0]);
    let (out, reports, _) = run(&m, DebugMode::Warn, vec![("score", score), ("mask", mask)]);
    let p = out[0].data().to_f64_vec();
    // Exact: softmax([1, -inf, 2, -inf]) = [1/(1+e), 0, e/(1+e), 0].
    let e = std::f64::consts::E;
    for (g, w) in p.iter().zip([1.0 / (1.0 + e), 0.0, e / (1.0 + e), 0.0]) {
        assert!((g - w).abs() <= 2e-3, "{p:?}");
    }
    assert!(reports.is_empty(), "{reports:#?}");

    // T5-style: log of relative positions (0 at the diagonal gives -inf), used only where
    // the position is large; small positions take the exact bucket.
    let m = model(
        17,
        vec![
            node("Log", "t5.log", &["rel"], &["l"], vec![]),
            node("Less", "t5.is_small", &["rel", "eight"], &["small"], vec![]),
            node("Where", "t5.bucket", &["small", "rel", "l"], &["b"], vec![]),
        ],
        vec![scalar_init("eight", 8.0)],
        &[("rel", data_type::FLOAT, &[4])],
        &["b"],
    );
    let rel = f32s(&[4], vec![0.0, 3.0, 16.0, 100.0]);
    let (out, reports, _) = run(&m, DebugMode::Warn, vec![("rel", rel)]);
    let b = out[0].data().to_f64_vec();
    assert_eq!(b[..2], [0.0, 3.0]);
    assert!((b[2] - 16f64.ln()).abs() < 1e-6 && (b[3] - 100f64.ln()).abs() < 1e-5);
    assert!(reports.is_empty(), "{reports:#?}");
}

// ---- fix lines follow the cause chain ----

/// The first culprit report of a one-input model run on `x` (float32 `[1, n]`).
fn culprit(m: &[u8], x: Tensor) -> NanReport {
    let (_, reports, _) = run(m, DebugMode::Warn, vec![("x", x)]);
    reports
        .into_iter()
        .find(|r| r.is_culprit())
        .expect("a culprit report")
}

fn fix_of(r: &NanReport) -> String {
    r.fix.clone().unwrap_or_default()
}

/// Underflow to 0, then log: a cross-entropy written as `onehot * log(softmax(x))`. The
/// logit -200 below the max underflows exp to 0, log(0) = -inf, and `0 × -inf` = NaN at the
/// Mul. The cure is LogSoftmax (or a clamp before the log), not a mask fill value.
#[test]
fn fix_for_log_of_an_underflowed_softmax() {
    let m = model(
        17,
        vec![
            node(
                "Softmax",
                "ce.softmax",
                &["x"],
                &["p"],
                vec![a_int("axis", -1)],
            ),
            node("Log", "ce.log", &["p"], &["lp"], vec![]),
            node("Mul", "ce.mul", &["onehot", "lp"], &["y"], vec![]),
        ],
        vec![init("onehot", &f32s(&[1, 3], vec![1.0, 0.0, 0.0]))],
        &[("x", data_type::FLOAT, &[1, 3])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 3], vec![0.0, -200.0, -1.0]));
    assert_eq!(r.label, "ce.mul");
    let fix = fix_of(&r);
    assert!(
        fix.contains("LogSoftmax") && fix.contains("log(max("),
        "{fix}"
    );
    assert!(!fix.contains("fill value"), "{fix}");
}

/// Underflow to 0, then divide: `x / softmax(s)` where a probability underflows to 0 gives
/// +inf at the Div (finite inputs), which reaches the output.
#[test]
fn fix_for_division_by_an_underflowed_value() {
    let m = model(
        17,
        vec![
            node(
                "Softmax",
                "w.softmax",
                &["x"],
                &["p"],
                vec![a_int("axis", -1)],
            ),
            node("Div", "w.div", &["one", "p"], &["y"], vec![]),
        ],
        vec![scalar_init("one", 1.0)],
        &[("x", data_type::FLOAT, &[1, 3])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 3], vec![0.0, -200.0, -1.0]));
    assert_eq!(
        (r.label.as_str(), r.kind),
        ("w.div", rlx_ir::numeric_check::BadKind::PosInf)
    );
    let fix = fix_of(&r);
    assert!(
        fix.contains("division by zero") && fix.contains("epsilon"),
        "{fix}"
    );
}

/// Overflow: float16 `Pow(x, 2)` of 300 (90000 > 65504) is +inf from finite inputs. It is
/// not "a negative base with a fractional exponent".
#[test]
fn fix_for_float16_pow_overflow() {
    let m = model(
        17,
        vec![node("Pow", "sq.pow", &["x", "two"], &["y"], vec![])],
        vec![init("two", &f16_tensor(&[], &[2.0]))],
        &[("x", data_type::FLOAT16, &[1, 3])],
        &["y"],
    );
    let r = culprit(&m, f16_tensor(&[1, 3], &[300.0, 1.0, 2.0]));
    assert_eq!(
        (r.label.as_str(), r.kind),
        ("sq.pow", rlx_ir::numeric_check::BadKind::PosInf)
    );
    let fix = fix_of(&r);
    assert!(fix.contains("overflow") && fix.contains("f32"), "{fix}");
    assert!(!fix.contains("negative base"), "{fix}");
}

/// Domain errors: sqrt of a negative value, and a negative base to a fractional power.
#[test]
fn fix_for_domain_errors() {
    let m = model(
        17,
        vec![node("Sqrt", "d.sqrt", &["x"], &["y"], vec![])],
        vec![],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![4.0, -1.0]));
    assert_eq!(r.cause, rlx_ir::numeric_check::Cause::InputsFinite);
    assert!(fix_of(&r).contains("negative"), "{}", fix_of(&r));
    let m = model(
        17,
        vec![node("Pow", "d.pow", &["x", "half"], &["y"], vec![])],
        vec![scalar_init("half", 0.5)],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![4.0, -1.0]));
    assert!(fix_of(&r).contains("negative base"), "{}", fix_of(&r));
}

/// 0/0 at a Div with finite inputs.
#[test]
fn fix_for_zero_over_zero() {
    let m = model(
        17,
        vec![node("Div", "z.div", &["x", "x"], &["y"], vec![])],
        vec![],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![0.0, 3.0]));
    assert_eq!(r.cause, rlx_ir::numeric_check::Cause::InputsFinite);
    assert!(
        fix_of(&r).contains("0/0") && fix_of(&r).contains("epsilon"),
        "{}",
        fix_of(&r)
    );
}

/// 0 × inf from a mask fill (`Where(mask, x, -inf)` then a product with a zero weight):
/// the fill advice fits. 0 × inf from an overflow (`exp(100)` times a zero): it does not;
/// the overflowing op is the cure.
#[test]
fn fix_for_zero_times_inf_from_a_mask_and_from_an_overflow() {
    let m = model(
        17,
        vec![
            node("Where", "m.fill", &["keep", "x", "ninf"], &["f"], vec![]),
            node("Mul", "m.mul", &["f", "w"], &["y"], vec![]),
        ],
        vec![
            init(
                "keep",
                &Tensor::new(vec![1, 2], TensorData::Bool(vec![true, false])).unwrap(),
            ),
            scalar_init("ninf", f32::NEG_INFINITY),
            init("w", &f32s(&[1, 2], vec![1.0, 0.0])),
        ],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![1.0, 2.0]));
    assert_eq!(r.label, "m.mul");
    assert!(fix_of(&r).contains("finite fill value"), "{}", fix_of(&r));

    let m = model(
        17,
        vec![
            node("Exp", "o.exp", &["x"], &["e"], vec![]),
            node("Mul", "o.mul", &["e", "w"], &["y"], vec![]),
        ],
        vec![init("w", &f32s(&[1, 2], vec![1.0, 0.0]))],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![1.0, 100.0]));
    assert_eq!(r.label, "o.mul");
    let fix = fix_of(&r);
    assert!(fix.contains("overflow") && fix.contains("0 × inf"), "{fix}");
    assert!(!fix.contains("fill value"), "{fix}");
}

/// inf - inf from two overflows of opposite sign (exp(100) - exp(100) after a negation is
/// not needed: x·1e38 and x·-1e38 added).
#[test]
fn fix_for_inf_minus_inf_from_overflows() {
    let m = model(
        17,
        vec![
            node("Mul", "s.up", &["x", "big"], &["u"], vec![]),
            node("Mul", "s.down", &["x", "nbig"], &["d"], vec![]),
            node("Add", "s.add", &["u", "d"], &["y"], vec![]),
        ],
        vec![scalar_init("big", 1e38), scalar_init("nbig", -1e38)],
        &[("x", data_type::FLOAT, &[1, 2])],
        &["y"],
    );
    let r = culprit(&m, f32s(&[1, 2], vec![1.0, 10.0]));
    assert_eq!(r.label, "s.add");
    let fix = fix_of(&r);
    assert!(
        fix.contains("inf - inf") && fix.contains("overflow"),
        "{fix}"
    );
}

/// The shipped rmsnorm_rsqrt_inf_nan example: Reciprocal of a zero mean square (eps = 0)
/// is +inf, then 0 × inf at the Mul. Its README's cure is eps > 0.
#[test]
fn fix_for_the_rmsnorm_rsqrt_example_names_epsilon() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/rmsnorm_rsqrt_inf_nan");
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap();
    let x = rlx_cli::npy::read_npy(&dir.join("input_x.npy")).unwrap();
    let (_, reports, _) = run(&bytes, DebugMode::Warn, vec![("x", x)]);
    let r = reports.iter().find(|r| r.is_culprit()).expect("culprit");
    assert_eq!(r.label, "layer0.rms_norm.mul_rsqrt");
    let fix = fix_of(r);
    assert!(
        fix.contains("division by zero") && fix.contains("epsilon"),
        "{fix}"
    );
    assert!(!fix.contains("fill value"), "{fix}");
}

// ---- the lint follows the localizer's rules ----

/// The case: a constant prior with a zero in it; `Log(prior)` is -inf,
/// `Mul(prior, log_prior)` turns it into NaN (0 × -inf), a `ReduceSum` carries the NaN into
/// the runtime graph. The lint names the Log (-inf, with a log fix) and the Mul (the NaN
/// maker, with the Log as its Inf origin), and nothing for the ReduceSum.
fn neg_entropy_model() -> Vec<u8> {
    model(
        18,
        vec![
            node("Log", "prior.log", &["prior"], &["log_prior"], vec![]),
            node(
                "Mul",
                "prior.p_log_p",
                &["prior", "log_prior"],
                &["plogp"],
                vec![],
            ),
            node(
                "ReduceSum",
                "prior.neg_entropy",
                &["plogp"],
                &["negent"],
                vec![a_int("keepdims", 0)],
            ),
            node("Add", "score.add_prior", &["x", "negent"], &["y"], vec![]),
        ],
        vec![init("prior", &f32s(&[4], vec![0.5, 0.25, 0.25, 0.0]))],
        &[("x", data_type::FLOAT, &[2])],
        &["y"],
    )
}

#[test]
fn lint_names_the_origin_inside_a_constant_chain() {
    let g = import_onnx_bytes(&neg_entropy_model(), None, &ImportOptions::default()).unwrap();
    let lints = rlx_compile::numeric_lint::numeric_lint(&g);
    let text: Vec<String> = lints.iter().map(|l| l.to_string()).collect();
    assert_eq!(lints.len(), 2, "{text:#?}");
    let (log, mul) = (&lints[0], &lints[1]);
    assert_eq!(
        (log.label.as_str(), log.op.as_str(), log.kind),
        ("prior.log", "Log", rlx_ir::numeric_check::BadKind::NegInf)
    );
    let lfix = log.fix.as_deref().unwrap_or("");
    assert!(
        lfix.contains("log of zero") && lfix.contains("clamp"),
        "{lfix}"
    );
    assert_eq!(
        (mul.label.as_str(), mul.kind),
        ("prior.p_log_p", rlx_ir::numeric_check::BadKind::NaN)
    );
    assert_eq!(
        mul.inf_origin.as_ref().map(|o| o.1.as_str()),
        Some("prior.log")
    );
    let mfix = mul.fix.as_deref().unwrap_or("");
    assert!(
        mfix.contains("log of zero") && !mfix.contains("accumulation"),
        "{mfix}"
    );
    assert!(
        text.iter().all(|t| !t.contains("neg_entropy\"")),
        "the ReduceSum only carried the NaN: {text:#?}"
    );
}

#[test]
fn rlx_lint_cli_names_the_log() {
    let dir = std::env::temp_dir().join(format!("rlx-diag-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.onnx");
    std::fs::write(&path, neg_entropy_model()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["lint"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("-inf \"prior.log\""), "{text}");
    assert!(text.contains("NaN \"prior.p_log_p\""), "{text}");
    assert!(!text.contains("\"prior.neg_entropy\":"), "{text}");
    assert!(!text.contains("accumulation overflowed"), "{text}");
}

/// ONNX `Attention` with `is_causal` and a boolean mask: its function body builds the mask
/// bias with -inf, and so does RLX's lowering. That -inf is the op's definition, read only
/// by the op itself, not a constant the user wrote: the lint stays quiet. The same -inf
/// written by the user (a `Where` fill) is still reported.
#[test]
fn lint_is_quiet_on_attentions_own_mask_bias() {
    let m = model(
        23,
        vec![node(
            "Attention",
            "attn",
            &["q", "k", "v", "mask"],
            &["y"],
            vec![a_int("is_causal", 1)],
        )],
        vec![],
        &[
            ("q", data_type::FLOAT, &[1, 2, 4, 8]),
            ("k", data_type::FLOAT, &[1, 2, 4, 8]),
            ("v", data_type::FLOAT, &[1, 2, 4, 8]),
            ("mask", data_type::BOOL, &[4, 4]),
        ],
        &["y"],
    );
    let g = import_onnx_bytes(&m, None, &ImportOptions::default()).unwrap();
    let lints = rlx_compile::numeric_lint::numeric_lint(&g);
    assert!(lints.is_empty(), "{lints:#?}");

    let user_fill = model(
        18,
        vec![node(
            "Where",
            "fill",
            &["mask", "x", "ninf"],
            &["y"],
            vec![],
        )],
        vec![scalar_init("ninf", f32::NEG_INFINITY)],
        &[
            ("mask", data_type::BOOL, &[4]),
            ("x", data_type::FLOAT, &[4]),
        ],
        &["y"],
    );
    let g = import_onnx_bytes(&user_fill, None, &ImportOptions::default()).unwrap();
    let lints = rlx_compile::numeric_lint::numeric_lint(&g);
    assert_eq!(lints.len(), 1, "{lints:#?}");
    assert_eq!(lints[0].kind, rlx_ir::numeric_check::BadKind::NegInf);
}

/// A 0/-inf mask initializer added straight onto an output (no softmax to absorb it): the
/// -inf reaches the output and is reported at the Add, naming the constant it came from as a
/// fill (not "inputs finite"), with the finite-fill advice.
#[test]
fn a_fill_constant_reaching_an_output_is_named_as_the_source() {
    let m = model(
        18,
        vec![node("Add", "bias.add_mask", &["x", "mask"], &["y"], vec![])],
        vec![init(
            "mask",
            &f32s(&[4], vec![0.0, f32::NEG_INFINITY, 0.0, 0.0]),
        )],
        &[("x", data_type::FLOAT, &[2, 4])],
        &["y"],
    );
    let x = f32s(&[2, 4], vec![0.5; 8]);
    let (_, reports, _) = run(&m, DebugMode::Warn, vec![("x", x)]);
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0];
    assert_eq!(r.label, "bias.add_mask");
    match &r.cause {
        rlx_ir::numeric_check::Cause::FillEntered { input_label, .. } => {
            assert_eq!(input_label, "mask")
        }
        c => panic!("cause {c:?}"),
    }
    let text = r.to_string();
    assert!(
        text.contains("constant input") && text.contains("\"mask\""),
        "{text}"
    );
    assert!(fix_of(r).contains("finfo(dtype).min"), "{text}");
}
