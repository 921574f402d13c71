//! The localizer's policy on hand-built graphs with hand-fed buffers.

use half::f16;
use rlx_ir::numeric_check::*;
use rlx_ir::*;

fn f32s(v: &[f32]) -> TensorData {
    TensorData::F32(v.to_vec())
}

/// x -> log(x) [creates -inf] -> where(isinf, 0, log) [absorbs]  ; also x -> y = 0/0
fn graph() -> (Graph, [NodeId; 5]) {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    g.set_current_origin(Some(Origin {
        label: "feat.log".into(),
        op_type: Some("Log".into()),
        ..Default::default()
    }));
    let l = g.unary(UnaryOp::Log, x, s.clone());
    g.set_current_origin(Some(Origin {
        label: "feat.mul".into(),
        op_type: Some("Mul".into()),
        ..Default::default()
    }));
    let m = g.mul(l, x, s.clone()); // -inf * 0 = NaN
    g.set_current_origin(Some(Origin {
        label: "feat.add".into(),
        op_type: Some("Add".into()),
        ..Default::default()
    }));
    let a = g.add(m, x, s.clone()); // propagates NaN
    g.set_current_origin(None);
    let o = g.add(l, x, s);
    g.set_outputs(vec![a, o]);
    (g, [x, l, m, a, o])
}

#[test]
fn mode_parsing() {
    assert_eq!(DebugMode::parse(None), DebugMode::Off);
    assert_eq!(DebugMode::parse(Some("")), DebugMode::Off);
    assert_eq!(DebugMode::parse(Some("0")), DebugMode::Off);
    assert_eq!(DebugMode::parse(Some("abort")), DebugMode::Abort);
    assert_eq!(DebugMode::parse(Some("strict")), DebugMode::Strict);
    assert_eq!(DebugMode::parse(Some("1")), DebugMode::Warn);
    assert_eq!(DebugMode::parse(Some("yes")), DebugMode::Warn);
    // One rule for every switch: these are off too, as for RLX_LINT_NUMERICS.
    for off in ["false", "off", "No", " 0 "] {
        assert_eq!(DebugMode::parse(Some(off)), DebugMode::Off, "{off}");
    }
    assert_eq!(DebugMode::parse(Some("ABORT")), DebugMode::Abort);
    assert_eq!(DebugMode::parse(Some("garbage")), DebugMode::Warn);
}

#[test]
fn counts_f32_f16() {
    let c = count_nonfinite(&[1.0f32, f32::NAN, f32::NEG_INFINITY, f32::NAN, f32::INFINITY]);
    assert_eq!((c.nan, c.pos_inf, c.neg_inf), (2, 1, 1));
    assert_eq!(c.first_nan, Some(1));
    assert_eq!(c.first(), Some((1, BadKind::NaN)));
    assert_eq!(
        first_bad(&[0.0f32, 2.0, f32::NEG_INFINITY]),
        Some((2, BadKind::NegInf))
    );
    // 70000 overflows f16 (max 65504).
    let h = [f16::from_f32(1.0), f16::from_f32(70000.0)];
    let c = count_nonfinite(&h);
    assert_eq!((c.pos_inf, c.first_pos_inf), (1, Some(1)));
    assert!(scan_data(&TensorData::I64(vec![1, 2])).is_clean());
}

#[test]
fn nan_from_inf_names_both_ops_and_propagators_are_not_blamed() {
    let (g, [x, l, m, a, o]) = graph();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    let inf = f32::NEG_INFINITY;
    sc.scan_node(&g, x, &f32s(&[0.0, 1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[inf, 0.0])).unwrap();
    sc.scan_node(&g, m, &f32s(&[f32::NAN, 0.0])).unwrap();
    sc.scan_node(&g, a, &f32s(&[f32::NAN, 1.0])).unwrap();
    sc.scan_node(&g, o, &f32s(&[inf, 1.0])).unwrap();
    sc.finish_run(&g).unwrap();
    let r = sc.reports();
    assert_eq!(r.len(), 2, "{r:#?}");
    assert_eq!(r[0].node, m);
    assert_eq!(r[0].label, "feat.mul");
    match &r[0].cause {
        Cause::InputsHeldInf {
            input,
            input_kind,
            inf_origin,
            inf_origin_label,
            inf_origin_op,
            inf_origin_kind,
            inf_source,
        } => {
            assert_eq!(inf_origin_op.as_deref(), Some("Log"));
            assert_eq!(
                *inf_source,
                Some(rlx_ir::numeric_check::InfSource::LogOfZero)
            );
            // The Inf kept its sign from the Log to here.
            assert_eq!(*inf_origin_kind, None);
            assert_eq!(
                (*input, *input_kind, *inf_origin),
                (l, BadKind::NegInf, Some(l))
            );
            assert_eq!(inf_origin_label.as_deref(), Some("feat.log"));
        }
        c => panic!("{c:?}"),
    }
    assert!(r[0].fix.as_deref().unwrap().contains("0 × inf"));
    // The -inf also reached output #1: reported at its origin, the Log.
    assert_eq!((r[1].node, r[1].kind), (l, BadKind::NegInf));
    assert!(r[1].note.as_deref().unwrap().contains("output #1"));
    assert_eq!(sc.propagator_count(), 1);
    let text = r[0].to_string();
    assert!(
        text.starts_with("rlx nan-check: NaN at index 0 of %2 Mul \"feat.mul\"\n"),
        "{text}"
    );
}

#[test]
fn abort_stops_at_first_nan_and_off_has_no_state() {
    let (g, [x, l, m, _, _]) = graph();
    let mut sc = DebugScanner::new(DebugMode::Abort, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[0.0, 1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[f32::NEG_INFINITY, 0.0]))
        .unwrap();
    let e = sc.scan_node(&g, m, &f32s(&[f32::NAN, 0.0])).unwrap_err();
    assert_eq!(e.report.node, m);
    assert!(!DebugScanner::new(DebugMode::Off, "cpu").is_on());
}

#[test]
fn absorbed_inf_is_one_summary_line() {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    let l = g.unary(UnaryOp::Log, x, s.clone());
    let e = g.unary(UnaryOp::Exp, l, s.clone()); // exp(-inf) = 0: absorbed
    g.set_outputs(vec![e]);
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[0.0, 1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[f32::NEG_INFINITY, 0.0]))
        .unwrap();
    sc.scan_node(&g, e, &f32s(&[0.0, 1.0])).unwrap();
    sc.finish_run(&g).unwrap();
    assert!(sc.reports().is_empty());
    assert_eq!(sc.absorbed_inf_origins(&g), vec![l]);
    assert!(sc.summary().unwrap().contains("absorbed"));
    // strict: blamed where it first appears
    let mut sc = DebugScanner::new(DebugMode::Strict, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[0.0, 1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[f32::NEG_INFINITY, 0.0]))
        .unwrap();
    sc.scan_node(&g, e, &f32s(&[0.0, 1.0])).unwrap();
    sc.finish_run(&g).unwrap();
    assert_eq!(sc.reports().len(), 1);
    assert_eq!(sc.reports()[0].node, l);
}

#[test]
fn fix_hints_by_op() {
    let c = Cause::InputsFinite;
    for op in ["Rsqrt", "Sqrt", "Log", "Exp", "Div", "Pow", "Constant"] {
        assert!(
            fix_hint(op, None, &c, BadKind::NaN, DType::F32).is_some(),
            "{op}"
        );
    }
    assert!(
        fix_hint("Sub", Some("Softmax"), &c, BadKind::NaN, DType::F32)
            .unwrap()
            .contains("softmax")
    );
    // A softmax's NaN from an inf in its input: a fully masked row (-inf) or a +inf that
    // an op upstream made (x - max is inf - inf); each gets its own fix.
    let held = |k: BadKind| Cause::InputsHeldInf {
        input: NodeId(0),
        input_kind: k,
        inf_origin: None,
        inf_origin_label: None,
        inf_origin_op: None,
        inf_origin_kind: None,
        inf_source: None,
    };
    let softmax_fix =
        |k: BadKind| fix_hint("Sub", Some("Softmax"), &held(k), BadKind::NaN, DType::F32).unwrap();
    let masked = softmax_fix(BadKind::NegInf);
    assert!(masked.contains("masked (-inf)"), "{masked}");
    let pos = softmax_fix(BadKind::PosInf);
    assert!(
        pos.contains("holds +inf") && !pos.contains("masked"),
        "{pos}"
    );
    assert!(fix_hint("Cast", None, &c, BadKind::NegInf, DType::F16)
        .unwrap()
        .contains("65504"));
    // A norm's Inf is an overflow (a huge input or scale), not epsilon 0 (which gives 0/0).
    let inf = fix_hint(
        "Mul",
        Some("LayerNormalization"),
        &c,
        BadKind::PosInf,
        DType::F32,
    )
    .unwrap();
    assert!(
        inf.contains("overflowed") && !inf.starts_with("normalizing a constant"),
        "{inf}"
    );
    let nan = fix_hint(
        "Div",
        Some("LayerNormalization"),
        &c,
        BadKind::NaN,
        DType::F32,
    )
    .unwrap();
    assert!(nan.contains("epsilon 0"), "{nan}");
    assert!(fix_hint(
        "Div",
        None,
        &Cause::Propagated { input: NodeId(0) },
        BadKind::NaN,
        DType::F32
    )
    .is_none());
}

#[test]
fn labels_follow_the_resolution_order() {
    use rlx_ir::provenance::node_label;
    let s = Shape::new(&[1], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("tokens", s.clone());
    let a = g.add(x, x, s.clone());
    assert_eq!(node_label(&g, x), "tokens");
    assert_eq!(node_label(&g, a), "%1");
    g.set_name(a, "free");
    assert_eq!(node_label(&g, a), "free");
    g.node_mut(a).block = Some("layer0".into());
    assert_eq!(node_label(&g, a), "layer0");
    g.node_mut(a).origin = Some(std::sync::Arc::new(Origin {
        label: "onnx_add".into(),
        op_type: None,
        ..Default::default()
    }));
    assert_eq!(node_label(&g, a), "onnx_add");
}

#[test]
fn new_nan_beside_carried_nan_is_still_blamed() {
    // x = [NaN, 0]; y = x / x = [NaN, NaN]: one NaN carried, one created by 0/0.
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    let d = g.div(x, x, s.clone());
    let r = g.unary(UnaryOp::Neg, d, s); // only carries
    g.set_outputs(vec![r]);
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[f32::NAN, 0.0])).unwrap();
    sc.scan_node(&g, d, &f32s(&[f32::NAN, f32::NAN])).unwrap();
    sc.scan_node(&g, r, &f32s(&[f32::NAN, f32::NAN])).unwrap();
    sc.finish_run(&g).unwrap();
    let reps = sc.reports();
    // The input is reported (it holds NaN), and the Div for the NaN it created; Neg is not.
    assert_eq!(reps.len(), 2, "{reps:#?}");
    assert_eq!(reps[0].node, x);
    assert_eq!(reps[1].node, d);
    assert!(
        matches!(
            reps[1].cause,
            Cause::CreatedBesideInputNaN {
                carried_at_most: 1,
                ..
            }
        ),
        "{:?}",
        reps[1].cause
    );
    assert!(reps[1].to_string().contains("this op created the rest"));
}

/// SiLU as exported, `x · sigmoid(x)`, with x = [1, -inf, NaN, 3]: both operands hold the
/// input's NaN at index 2 (counted once, by position), and `-inf · 0` makes a new NaN at
/// index 1. The Mul is blamed, at the index it created; without positions (counts only, as
/// a backend counting on the device reports) the two NaN fit the operands' sum, so the Mul
/// passes as a carrier: the limit the positions lift.
#[test]
fn new_nan_where_both_operands_carry_one_elsewhere_is_blamed() {
    let s = Shape::new(&[4], DType::F32);
    let mut g = Graph::new("silu");
    let x = g.input("x", s.clone());
    let sig = g.add_node(
        rlx_ir::Op::Activation(rlx_ir::Activation::Sigmoid),
        vec![x],
        s.clone(),
    );
    let m = g.mul(x, sig, s);
    g.set_outputs(vec![m]);
    let xs = [1.0, f32::NEG_INFINITY, f32::NAN, 3.0];
    let sg = [0.731, 0.0, f32::NAN, 0.953];
    let ms = [0.731, f32::NAN, f32::NAN, 2.86];
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&xs)).unwrap();
    sc.scan_node(&g, sig, &f32s(&sg)).unwrap();
    sc.scan_node(&g, m, &f32s(&ms)).unwrap();
    sc.finish_run(&g).unwrap();
    let reps = sc.reports();
    assert_eq!(reps.len(), 2, "{reps:#?}");
    assert_eq!((reps[0].node, reps[1].node), (x, m));
    assert!(
        matches!(
            reps[1].cause,
            Cause::CreatedBesideInputNaN {
                carried_at_most: 1,
                ..
            }
        ),
        "{:?}",
        reps[1].cause
    );
    assert_eq!(
        reps[1].index, 1,
        "the NaN the Mul made, not the carried one"
    );
    // Counts only: the Mul is taken for a carrier (2 NaN, operands' sum 2).
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    sc.begin_run(&g);
    for (id, v) in [(x, &xs), (sig, &sg), (m, &ms)] {
        sc.scan_counts(&g, id, scan_data(&f32s(v))).unwrap();
    }
    sc.finish_run(&g).unwrap();
    assert_eq!(sc.reports().len(), 1, "{:#?}", sc.reports());
}

// ---- culprit or propagator: the counts that decide it ----

fn scanner() -> DebugScanner {
    let mut sc = DebugScanner::new(DebugMode::Warn, "test");
    sc.set_print(false);
    sc
}

/// A MatMul spreads one NaN of its left operand over a whole output row (4 NaN from 1): it
/// only carried it. Only elementwise ops can be caught creating NaN beside a carried one
/// (a reduction or product mixes elements, so counts say nothing there).
#[test]
fn matmul_spreading_one_nan_over_a_row_is_a_propagator() {
    let mut g = Graph::new("mm");
    let a = g.input("a", Shape::new(&[2, 3], DType::F32));
    let b = g.input("b", Shape::new(&[3, 4], DType::F32));
    let m = g.matmul(a, b, Shape::new(&[2, 4], DType::F32));
    g.set_outputs(vec![m]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, a, &f32s(&[1.0, f32::NAN, 2.0, 3.0, 4.0, 5.0]))
        .unwrap();
    sc.scan_node(&g, b, &f32s(&[1.0; 12])).unwrap();
    let row0 = [f32::NAN; 4];
    let out: Vec<f32> = row0.iter().copied().chain([9.0, 9.0, 9.0, 9.0]).collect();
    sc.scan_node(&g, m, &f32s(&out)).unwrap();
    sc.finish_run(&g).unwrap();
    // The graph input holds the NaN: reported as a leaf; the MatMul is not blamed.
    let blamed: Vec<NodeId> = sc.reports().iter().map(|r| r.node).collect();
    assert_eq!(blamed, vec![a], "{:#?}", sc.reports());
    assert_eq!(sc.propagator_count(), 1);
}

/// A `[1, 4]` operand with one NaN broadcast over 3 rows gives 3 NaN: each input NaN may
/// reach out.len / in.len = 3 outputs, so the Add carried them all.
#[test]
fn broadcast_elementwise_op_carries_one_nan_per_row() {
    let mut g = Graph::new("bc");
    let a = g.input("a", Shape::new(&[1, 4], DType::F32));
    let b = g.input("b", Shape::new(&[3, 4], DType::F32));
    let y = g.add(a, b, Shape::new(&[3, 4], DType::F32));
    g.set_outputs(vec![y]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, a, &f32s(&[0.0, f32::NAN, 0.0, 0.0]))
        .unwrap();
    sc.scan_node(&g, b, &f32s(&[1.0; 12])).unwrap();
    let mut out = vec![1.0f32; 12];
    for r in 0..3 {
        out[r * 4 + 1] = f32::NAN;
    }
    sc.scan_node(&g, y, &f32s(&out)).unwrap();
    assert!(
        sc.reports().iter().all(|r| r.node != y),
        "{:#?}",
        sc.reports()
    );
    // One more NaN than broadcasting can carry: the Add made it.
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, a, &f32s(&[0.0, f32::NAN, 0.0, 0.0]))
        .unwrap();
    sc.scan_node(&g, b, &f32s(&[1.0; 12])).unwrap();
    out[0] = f32::NAN;
    sc.scan_node(&g, y, &f32s(&out)).unwrap();
    let r = sc
        .reports()
        .iter()
        .find(|r| r.node == y)
        .expect("the Add is blamed");
    assert_eq!(
        r.cause,
        Cause::CreatedBesideInputNaN {
            input: a,
            carried_at_most: 3
        }
    );
    assert_eq!(r.counts.nan, 4);
}

/// An Inf that turns into NaN is named with the NaN; it is not also "absorbed" (no summary
/// line), even though it never reaches an output.
#[test]
fn inf_that_became_nan_is_not_called_absorbed() {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    let l = g.unary(UnaryOp::Log, x, s.clone());
    let m = g.mul(l, x, s);
    g.set_outputs(vec![m]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[0.0, 1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[f32::NEG_INFINITY, 0.0]))
        .unwrap();
    sc.scan_node(&g, m, &f32s(&[f32::NAN, 0.0])).unwrap();
    sc.finish_run(&g).unwrap();
    assert_eq!(sc.reports().len(), 1, "{:#?}", sc.reports());
    assert_eq!(sc.reports()[0].node, m);
    assert!(sc.summary().is_none(), "{:?}", sc.summary());
    assert!(sc.absorbed_inf_origins(&g).is_empty());
}

/// An output holding NaN and -inf from one op (log of [0, -1]): the NaN's report names the
/// op; the -inf that reached the output is not reported a second time.
#[test]
fn output_with_nan_and_inf_is_reported_once() {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    let l = g.unary(UnaryOp::Log, x, s);
    g.set_outputs(vec![l]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[0.0, -1.0])).unwrap();
    sc.scan_node(&g, l, &f32s(&[f32::NEG_INFINITY, f32::NAN]))
        .unwrap();
    sc.finish_run(&g).unwrap();
    assert_eq!(sc.reports().len(), 1, "{:#?}", sc.reports());
    assert_eq!(sc.reports()[0].kind, BadKind::NaN);
    assert_eq!(sc.reports()[0].counts.neg_inf, 1);
}

/// An output that carries the input's NaN and also an +inf its op made (3e38 · 10): the
/// NaN is the input's (reported there, carried by the Mul), and the +inf that reached the
/// output is still reported at the Mul (QA's F2: an output's NaN used to hide it).
#[test]
fn inf_reaching_an_output_beside_a_carried_nan_is_reported() {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let x = g.input("x", s.clone());
    let ten = g.constant(Tensor::from_f32(&[], vec![10.0]).unwrap());
    let m = g.mul(x, ten, s);
    g.set_outputs(vec![m]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, x, &f32s(&[f32::NAN, 3e38])).unwrap();
    sc.scan_node(&g, ten, &f32s(&[10.0])).unwrap();
    sc.scan_node(&g, m, &f32s(&[f32::NAN, f32::INFINITY]))
        .unwrap();
    sc.finish_run(&g).unwrap();
    let r: Vec<(NodeId, BadKind)> = sc.reports().iter().map(|r| (r.node, r.kind)).collect();
    assert_eq!(
        r,
        vec![(x, BadKind::NaN), (m, BadKind::PosInf)],
        "{:#?}",
        sc.reports()
    );
    assert!(sc.reports()[1]
        .to_string()
        .contains("reached graph output #0"));
}

/// Two Inf-carrying inputs: `b + a` with b = [-inf, 1], a = [NaN, +inf]. The output
/// [NaN, +inf] carries a's NaN and a's +inf; the origin inherited from the first
/// Inf-carrying input is b, which holds no +inf: nothing is said about it rather than
/// "-inf of b reached the output" (QA's finding).
#[test]
fn inf_beside_nan_is_not_pinned_on_an_input_without_that_sign() {
    let s = Shape::new(&[2], DType::F32);
    let mut g = Graph::new("t");
    let b = g.input("b", s.clone());
    let a = g.input("a", s.clone());
    let y = g.add(b, a, s);
    g.set_outputs(vec![y]);
    let mut sc = scanner();
    sc.begin_run(&g);
    sc.scan_node(&g, b, &f32s(&[f32::NEG_INFINITY, 1.0]))
        .unwrap();
    sc.scan_node(&g, a, &f32s(&[f32::NAN, f32::INFINITY]))
        .unwrap();
    sc.scan_node(&g, y, &f32s(&[f32::NAN, f32::INFINITY]))
        .unwrap();
    sc.finish_run(&g).unwrap();
    assert!(
        sc.reports()
            .iter()
            .all(|r| !(r.node == b && r.to_string().contains("reached graph output"))),
        "{:#?}",
        sc.reports()
    );
}

/// Fix lines for `torch.export` culprits: the ATen op's advice when it has one (a variance
/// over one element, acos outside [-1, 1]), in-place forms advised as their functional op
/// (`div_`), and the IR step's advice when the ATen op has none.
#[test]
fn fix_lines_for_aten_culprits() {
    use rlx_ir::numeric_check::{fix_hint, BadKind, Cause};
    use rlx_ir::DType;
    let hint = |op: &str, src: &str| {
        fix_hint(
            op,
            Some(src),
            &Cause::InputsFinite,
            BadKind::NaN,
            DType::F32,
        )
        .unwrap_or_default()
    };
    let var = hint("Div", "aten.var.correction");
    assert!(
        var.contains("correction=0") && var.contains("N - 1"),
        "{var}"
    );
    let div = hint("Div", "aten.div_.Tensor");
    assert!(div.contains("division by zero"), "{div}");
    let acos = hint("Acos", "aten.acos.default");
    assert!(acos.contains("[-1, 1]") && acos.contains("clamp"), "{acos}");
    // An ATen op without advice of its own: the IR step's (a Div's) advice.
    let other = hint("Div", "aten.some_composite.default");
    assert!(other.contains("division by zero"), "{other}");
}

/// An eval-mode batch norm's NaN names the checkpoint's running_var as the likely cause.
#[test]
fn batch_norm_nan_names_the_running_var() {
    use rlx_ir::numeric_check::{fix_hint, BadKind, Cause};
    let h = fix_hint(
        "Sqrt",
        Some("aten._native_batch_norm_legit_no_training.default"),
        &Cause::InputsFinite,
        BadKind::NaN,
        rlx_ir::DType::F32,
    )
    .unwrap_or_default();
    assert!(h.contains("running_var"), "{h}");
}
