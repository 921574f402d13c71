//! The speed paths keep NaN localization: the vectorized Exp and the cached NaN/Inf counts
//! of constants and params must yield the same reports as a plain per-node scan.
//! Expected causes are derived by hand from IEEE 754: exp(100) overflows f32 to +inf, and
//! inf - inf is NaN.

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::{BadKind, Cause, DebugMode};
use rlx_ir::*;

fn s(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

#[test]
fn nan_from_fast_exp_overflow_names_the_sub_and_the_exp() {
    let mut g = Graph::new("t");
    let x = g.input("x", s(&[300]));
    g.set_current_origin(Some(Origin {
        label: "attn.softmax".into(),
        op_type: Some("Softmax".into()),
        ..Default::default()
    }));
    let e = g.unary(UnaryOp::Exp, x, s(&[300]));
    let d = g.sub(e, e, s(&[300]));
    g.set_current_origin(None);
    g.set_outputs(vec![d]);
    let mut ex = CpuExecutor::new(g).unwrap();
    // Element 260 lies past the first 256-element chunk of the vectorized loops.
    let mut v = vec![0.5f32; 300];
    v[260] = 100.0;
    let xin = Tensor::from_f32(&[300], v).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    let out = ex.run(&[xin], Some(&mut sc)).unwrap();
    assert!(out[0].as_f32().unwrap()[260].is_nan());
    assert_eq!(out[0].as_f32().unwrap()[0], 0.0);
    let r = sc.reports();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].node, d);
    assert_eq!(r[0].index, 260);
    assert_eq!(r[0].label, "attn.softmax");
    assert_eq!(r[0].source_op.as_deref(), Some("Softmax"));
    match &r[0].cause {
        Cause::InputsHeldInf { inf_origin, .. } => assert_eq!(*inf_origin, Some(e)),
        c => panic!("expected InputsHeldInf, got {c:?}"),
    }
}

#[test]
fn cached_counts_of_constants_and_params_still_report() {
    // A NaN param and a NaN constant, each consumed by an Add: scanned from the counts
    // cached at the first scanned run, on every run; a new param value is counted again.
    let mut g = Graph::new("t");
    let x = g.input("x", s(&[4]));
    let w = g.param("w", s(&[4]));
    let c = g.constant(Tensor::from_f32(&[4], vec![0.0, 0.0, 0.0, f32::NAN]).unwrap());
    let a = g.add(x, w, s(&[4]));
    let b = g.add(a, c, s(&[4]));
    g.set_outputs(vec![b]);
    let mut ex = CpuExecutor::new(g).unwrap();
    ex.set_param(
        "w",
        Tensor::from_f32(&[4], vec![0.0, f32::NAN, 0.0, 0.0]).unwrap(),
    )
    .unwrap();
    for _ in 0..2 {
        let mut sc = DebugScanner::new(DebugMode::Strict, "cpu");
        sc.set_print(false);
        let xin = Tensor::from_f32(&[4], vec![1.0; 4]).unwrap();
        let out = ex.run(&[xin], Some(&mut sc)).unwrap();
        let o = out[0].as_f32().unwrap();
        assert!(o[1].is_nan() && o[3].is_nan() && o[0] == 1.0);
        let nodes: Vec<NodeId> = sc.reports().iter().map(|r| r.node).collect();
        assert!(!sc.reports().is_empty());
        // Every report is about a node of this graph that holds a NaN; the param's NaN
        // (index 1) is reported, at the param or at its consumer.
        assert!(
            sc.reports()
                .iter()
                .any(|r| r.index == 1 && (r.node == w || r.node == a)),
            "{nodes:?}"
        );
        // The constant's NaN (index 3) is reported, at the constant or at its consumer.
        assert!(
            sc.reports()
                .iter()
                .any(|r| r.index == 3 && (r.node == c || r.node == b)),
            "{nodes:?}"
        );
    }
    // The param's NaN moves to index 2: its counts are not the first value's.
    ex.set_param(
        "w",
        Tensor::from_f32(&[4], vec![0.0, 0.0, f32::NAN, 0.0]).unwrap(),
    )
    .unwrap();
    let mut sc = DebugScanner::new(DebugMode::Strict, "cpu");
    sc.set_print(false);
    let xin = Tensor::from_f32(&[4], vec![1.0; 4]).unwrap();
    ex.run(&[xin], Some(&mut sc)).unwrap();
    assert!(
        sc.reports()
            .iter()
            .any(|r| r.index == 2 && (r.node == w || r.node == a)),
        "{:?}",
        sc.reports()
    );
}

/// The Inf note names the sign that reached the output: x = [-3e38, 3e38] times 10
/// overflows to [-inf, +inf] (IEEE 754: |product| > f32::MAX rounds to inf), the Relu maps
/// -inf to 0 and keeps +inf, so the output holds +inf at index 1 (not the Mul's first
/// non-finite element, the -inf at index 0).
#[test]
fn inf_note_names_the_sign_that_reached_the_output() {
    let mut g = Graph::new("t");
    let x = g.input("x", s(&[2]));
    let ten = g.constant(Tensor::from_f32(&[], vec![10.0]).unwrap());
    let m = g.mul(x, ten, s(&[2]));
    let r = g.add_node(Op::Activation(Activation::Relu), vec![m], s(&[2]));
    g.set_outputs(vec![r]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    let xin = Tensor::from_f32(&[2], vec![-3e38, 3e38]).unwrap();
    let out = ex.run(&[xin], Some(&mut sc)).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[0.0, f32::INFINITY]);
    let reps = sc.reports();
    assert_eq!(reps.len(), 1, "{reps:?}");
    assert_eq!(reps[0].node, m);
    assert_eq!(reps[0].kind, numeric_check::BadKind::PosInf);
    assert_eq!(reps[0].index, 1);
}

/// An Inf whose sign flips on the way (Neg of a -inf input) then meets a zero: the NaN's
/// report names the input as the origin and says it entered as -inf (IEEE 754: -(-inf) is
/// +inf and +inf · 0 is NaN), instead of calling the input the origin of a +inf it never held.
#[test]
fn inf_that_changed_sign_names_its_entry_sign() {
    let mut g = Graph::new("t");
    let x = g.input("x", s(&[2]));
    let n = g.unary(UnaryOp::Neg, x, s(&[2]));
    let z = g.constant(Tensor::from_f32(&[2], vec![0.0, 0.0]).unwrap());
    let m = g.mul(n, z, s(&[2]));
    g.set_outputs(vec![m]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let xin = Tensor::from_f32(&[2], vec![1.0, f32::NEG_INFINITY]).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    ex.run(&[xin], Some(&mut sc)).unwrap();
    let r = sc.reports();
    let nan = r.iter().find(|r| r.node == m).expect("a report at the Mul");
    match &nan.cause {
        Cause::InputsHeldInf {
            input,
            input_kind,
            inf_origin,
            inf_origin_kind,
            ..
        } => {
            assert_eq!(*input, n);
            assert_eq!(*input_kind, BadKind::PosInf);
            assert_eq!(*inf_origin, Some(x));
            assert_eq!(*inf_origin_kind, Some(BadKind::NegInf));
        }
        c => panic!("expected InputsHeldInf, got {c:?}"),
    }
    let text = nan.to_string();
    assert!(
        text.contains("the infinity entered as -inf at %0 Input \"x\""),
        "{text}"
    );
}

/// Ops that only move values (Transpose, Slice, Concat) are not read by the scanner when
/// every input is finite; an Inf they carry must still be seen and keep its origin. Here
/// exp(100) = +inf at x[1][2], moved by a Transpose, a Slice and a Concat, then inf - inf
/// = NaN in the Sub: its cause names the Exp as the Inf's origin (derived by hand), as with
/// a plain per-node scan. A second, all-finite input gives no report.
#[test]
fn inf_carried_through_moves_keeps_its_origin() {
    let mut g = Graph::new("t");
    let x = g.input("x", s(&[2, 3]));
    let e = g.unary(UnaryOp::Exp, x, s(&[2, 3]));
    let t = g.add_node(Op::Transpose { perm: vec![1, 0] }, vec![e], s(&[3, 2]));
    let sl = g.add_node(
        Op::Slice {
            starts: vec![1, 0],
            steps: vec![1, 1],
            sizes: vec![2, 2],
        },
        vec![t],
        s(&[2, 2]),
    );
    let c = g.add_node(Op::Concat { axis: 0 }, vec![sl, sl], s(&[4, 2]));
    let d = g.sub(c, c, s(&[4, 2]));
    g.set_outputs(vec![d]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    // x[1][2] = 100: e[1][2] = inf, t[2][1] = inf, sl[1][1] = inf, c[1][1] and c[3][1].
    let v = vec![0.5, 0.25, -1.0, 0.0, 2.0, 100.0];
    let out = ex
        .run(&[Tensor::from_f32(&[2, 3], v).unwrap()], Some(&mut sc))
        .unwrap();
    let o = out[0].as_f32().unwrap();
    assert!(o[3].is_nan() && o[7].is_nan());
    assert_eq!(o.iter().filter(|v| v.is_nan()).count(), 2);
    let r = sc.reports();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].node, d);
    assert_eq!(r[0].index, 3);
    match &r[0].cause {
        Cause::InputsHeldInf { inf_origin, .. } => assert_eq!(*inf_origin, Some(e)),
        c => panic!("expected InputsHeldInf from the Exp, got {c:?}"),
    }
    let v = vec![0.5, 0.25, -1.0, 0.0, 2.0, 1.0];
    ex.run(&[Tensor::from_f32(&[2, 3], v).unwrap()], Some(&mut sc))
        .unwrap();
    assert!(sc.reports().is_empty(), "{:?}", sc.reports());
}

/// A Pad's fill is stored in the tensor's own type: 1e5 is finite in f32 but +inf in f16
/// (f16::MAX is 65504), so an f16 Pad with that fill creates an Inf and must be read by the
/// scanner (the value-moving shortcut must not call it clean). Found by a review; opset-10
/// ONNX Pad takes such a fill as a float attribute for f16 data.
#[test]
fn f16_pad_whose_fill_overflows_is_reported() {
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[2, 3], DType::F16));
    let p = g.add_node(
        Op::Pad {
            pads: vec![(0, 0), (1, 1)],
            mode: PadMode::Constant(1e5),
        },
        vec![x],
        Shape::new(&[2, 5], DType::F16),
    );
    g.set_outputs(vec![p]);
    let mut ex = CpuExecutor::new(g).unwrap();
    for mode in [DebugMode::Strict, DebugMode::Warn] {
        let mut sc = DebugScanner::new(mode, "cpu");
        sc.set_print(false);
        let xin = Tensor::new(vec![2, 3], TensorData::from_f64(DType::F16, &[0.5; 6])).unwrap();
        let out = ex.run(&[xin], Some(&mut sc)).unwrap();
        let o = out[0].data().to_f64_vec();
        assert_eq!(o[0], f64::INFINITY, "the fill is +inf in f16: {o:?}");
        let r = sc.reports();
        assert!(!r.is_empty(), "{mode:?}: the Pad's +inf is not reported");
        assert!(
            r.iter().all(|r| r.node == p && r.index == 0),
            "{mode:?}: {r:?}"
        );
    }
}
