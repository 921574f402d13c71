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
