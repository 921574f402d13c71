//! CpuExecutor: whole-graph runs, liveness/buffer reuse, errors, the NaN scan epilogue.

use rlx_cpu::{eval_op, CpuError, CpuExecutor};
use rlx_ir::*;

fn f32t(d: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(d, v.to_vec()).unwrap()
}
fn s(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

#[test]
fn executor_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<CpuExecutor>();
}

#[test]
fn design_front_door_graph() {
    let mut g = Graph::new("d");
    let x = g.input("x", s(&[2, 2]));
    let w = g.param("w", s(&[2, 2]));
    let y = g.matmul(x, w, s(&[2, 2]));
    g.set_outputs(vec![y]);
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!(ex.missing_params(), vec!["w".to_string()]);
    let xin = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert!(matches!(
        ex.run(std::slice::from_ref(&xin), None),
        Err(CpuError::Param(_))
    ));
    ex.set_param("w", f32t(&[4], &[1.0, 0.0, 0.0, 1.0]))
        .unwrap();
    let out = ex.run(std::slice::from_ref(&xin), None).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    // param errors
    assert!(matches!(
        ex.set_param("nope", f32t(&[4], &[0.0; 4])),
        Err(CpuError::Param(_))
    ));
    assert!(matches!(
        ex.set_param("w", f32t(&[3], &[0.0; 3])),
        Err(CpuError::Param(_))
    ));
    let wi = Tensor::from_i64(&[2, 2], vec![1, 0, 0, 1]).unwrap();
    assert!(matches!(ex.set_param("w", wi), Err(CpuError::Param(_))));
}

#[test]
fn input_checks_name_the_input() {
    let mut g = Graph::new("chk");
    let x = g.input("tokens", s(&[2, 3]));
    let y = g.activation(Activation::Relu, x, s(&[2, 3]));
    g.set_outputs(vec![y]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let e = ex.run(&[f32t(&[3, 2], &[0.0; 6])], None).unwrap_err();
    assert!(matches!(e, CpuError::Input(_)));
    assert!(e.to_string().contains("tokens"), "{e}");
    let e = ex.run(&[], None).unwrap_err();
    assert!(e.to_string().contains("tokens"), "{e}");
    let wrong_dtype = Tensor::from_i64(&[2, 3], vec![0; 6]).unwrap();
    assert!(ex.run(&[wrong_dtype], None).is_err());
}

#[test]
fn bad_gather_index_errors_with_node_label() {
    let mut g = Graph::new("gather");
    let x = g.input("x", s(&[3, 2]));
    let i = g.input("i", Shape::new(&[1], DType::I64));
    g.set_current_origin(Some(Origin {
        label: "/emb/Gather".into(),
        op_type: Some("Gather".into()),
        ..Default::default()
    }));
    let y = g.add_node(Op::Gather { axis: 0 }, vec![x, i], s(&[1, 2]));
    g.set_outputs(vec![y]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let e = ex
        .run(
            &[
                f32t(&[3, 2], &[0.0; 6]),
                Tensor::from_i64(&[1], vec![7]).unwrap(),
            ],
            None,
        )
        .unwrap_err();
    match &e {
        CpuError::Kernel {
            node, op, label, ..
        } => {
            assert_eq!(*node, y);
            assert_eq!(op, "Gather");
            assert_eq!(label, "/emb/Gather");
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// A chain exercising liveness and in-place reuse: every node's value must equal what
/// eval_op computes from the observed inputs.
#[test]
fn chain_matches_eval_op_node_by_node() {
    let mut g = Graph::new("chain");
    let x = g.input("x", s(&[4, 8]));
    let b = g.constant(f32t(
        &[8],
        &(0..8).map(|i| i as f32 * 0.5 - 2.0).collect::<Vec<_>>(),
    ));
    let a = g.add(x, b, s(&[4, 8])); // in place (x is an input: borrowed, so not reused)
    let r = g.activation(Activation::Relu, a, s(&[4, 8])); // reuses a
    let m = g.mul(r, r, s(&[4, 8])); // r used twice: must not be taken
    let t = g.add_node(Op::Reshape { dims: vec![8, 4] }, vec![m], s(&[8, 4]));
    let e = g.unary(UnaryOp::Exp, t, s(&[8, 4]));
    let sm = g.softmax(e, 1, s(&[8, 4]));
    let back = g.add_node(Op::Reshape { dims: vec![4, 8] }, vec![sm], s(&[4, 8]));
    let out2 = g.add(back, a, s(&[4, 8])); // a is also used late
    g.set_outputs(vec![out2, r, r]);
    let graph = g.clone();
    let mut ex = CpuExecutor::new(g).unwrap();
    let xin = f32t(
        &[4, 8],
        &(0..32).map(|i| (i as f32 - 16.0) * 0.1).collect::<Vec<_>>(),
    );
    let mut seen: Vec<Option<Tensor>> = vec![None; graph.len()];
    let outs = ex
        .run_observed(&[xin], None, &mut |id, t| {
            seen[id.index()] = Some(t.clone())
        })
        .unwrap();
    for node in &graph.nodes {
        if node.op.is_leaf() {
            continue;
        }
        let ins: Vec<&Tensor> = node
            .inputs
            .iter()
            .map(|i| seen[i.index()].as_ref().unwrap())
            .collect();
        let want = eval_op(&node.op, &ins, &node.shape).unwrap();
        assert_eq!(
            seen[node.id.index()].as_ref().unwrap(),
            &want,
            "node {}",
            node.id
        );
    }
    assert_eq!(outs.len(), 3);
    assert_eq!(&outs[0], seen[out2.index()].as_ref().unwrap());
    assert_eq!(&outs[1], seen[r.index()].as_ref().unwrap());
    assert_eq!(outs[1], outs[2]);
}

fn div_graph() -> (Graph, NodeId) {
    let mut g = Graph::new("nan");
    let x = g.input("x", s(&[2]));
    let c = g.constant(f32t(&[2], &[0.0, 1.0]));
    g.set_current_origin(Some(Origin {
        label: "ratio".into(),
        op_type: Some("Div".into()),
        ..Default::default()
    }));
    let d = g.div(x, c, s(&[2]));
    g.set_outputs(vec![d]);
    (g, d)
}

#[test]
fn warn_scanner_names_the_div_that_made_zero_over_zero() {
    let (g, d) = div_graph();
    let mut ex = CpuExecutor::new(g).unwrap();
    let xin = f32t(&[2], &[0.0, 1.0]);
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    let out = ex.run(std::slice::from_ref(&xin), Some(&mut sc)).unwrap();
    assert!(out[0].as_f32().unwrap()[0].is_nan());
    assert_eq!(sc.reports().len(), 1);
    let r = &sc.reports()[0];
    assert_eq!(r.node, d);
    assert_eq!(r.op, "Div");
    assert_eq!(r.label, "ratio");
    assert!(r.is_culprit());
    assert_eq!(r.index, 0);

    // Scanner off: no reports, no scan state.
    let mut off = DebugScanner::new(DebugMode::Off, "cpu");
    off.set_print(false);
    ex.run(std::slice::from_ref(&xin), Some(&mut off)).unwrap();
    assert!(off.reports().is_empty());
    ex.run(&[xin], None).unwrap();
}

#[test]
fn abort_scanner_stops_the_run() {
    let (g, d) = div_graph();
    let mut ex = CpuExecutor::new(g).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Abort, "cpu");
    sc.set_print(false);
    match ex.run(&[f32t(&[2], &[0.0, 1.0])], Some(&mut sc)) {
        Err(CpuError::NanAbort(a)) => assert_eq!(a.report.node, d),
        other => panic!("expected NanAbort, got {other:?}"),
    }
}

#[test]
fn scanner_blames_relu_input_not_relu() {
    // x -> Log (NaN for negative) -> Relu (propagates) : one culprit, Log.
    let mut g = Graph::new("prop");
    let x = g.input("x", s(&[3]));
    let l = g.unary(UnaryOp::Log, x, s(&[3]));
    let r = g.activation(Activation::Relu, l, s(&[3]));
    g.set_outputs(vec![r]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    let out = ex
        .run(&[f32t(&[3], &[-1.0, 1.0, 2.0])], Some(&mut sc))
        .unwrap();
    assert!(out[0].as_f32().unwrap()[0].is_nan());
    assert_eq!(sc.reports().len(), 1);
    assert_eq!(sc.reports()[0].node, l);
    assert_eq!(sc.propagator_count(), 1);
}

#[test]
fn new_rejects_non_topological_inputs() {
    let mut g = Graph::new("bad");
    let x = g.input("x", s(&[1]));
    let y = g.add_node(Op::Activation(Activation::Relu), vec![NodeId(5)], s(&[1]));
    let _ = x;
    g.set_outputs(vec![y]);
    assert!(matches!(CpuExecutor::new(g), Err(CpuError::Kernel { .. })));
}

/// Pooled output buffers (`buffers::overwritten` keeps an earlier output's values instead of
/// filling): an executor that ran on other inputs (NaN, ±inf, large values) must give the
/// same bits as a fresh one on every later run. The graph leaves the [32, 128] buffers in
/// the pool at the end of a run (only [32]-sized values follow them), so the next run's
/// Exp/Sigmoid/Erf outputs are written into buffers holding the last run's values.
#[test]
fn reused_executor_matches_a_fresh_one_bit_for_bit() {
    let (r, c) = (32usize, 128usize);
    let build = || {
        let mut g = Graph::new("pool");
        let x = g.input("x", s(&[r, c]));
        let e = g.unary(UnaryOp::Exp, x, s(&[r, c]));
        let sg = g.activation(Activation::Sigmoid, x, s(&[r, c]));
        let er = g.unary(UnaryOp::Erf, x, s(&[r, c]));
        let th = g.activation(Activation::Tanh, x, s(&[r, c]));
        let m = g.mul(e, sg, s(&[r, c]));
        let a = g.add(er, th, s(&[r, c]));
        let t = g.add(m, a, s(&[r, c]));
        let sum = |g: &mut Graph, v| {
            g.add_node(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: vec![1],
                    keepdims: false,
                },
                vec![v],
                s(&[r]),
            )
        };
        let o = sum(&mut g, t);
        g.set_outputs(vec![o]);
        g
    };
    let inputs = |seed: u32| {
        let v: Vec<f32> = (0..r * c)
            .map(|i| match (i as u32 + seed) % 97 {
                0 if seed == 1 => f32::NAN,
                1 if seed == 1 => f32::INFINITY,
                2 if seed == 1 => 1e30,
                k => (k as f32 - 48.0) / (10.0 + seed as f32),
            })
            .collect();
        f32t(&[r, c], &v)
    };
    let mut reused = CpuExecutor::new(build()).unwrap();
    for round in 0..3 {
        for seed in [1u32, 2, 3] {
            let got = reused.run(&[inputs(seed)], None).unwrap();
            let want = CpuExecutor::new(build())
                .unwrap()
                .run(&[inputs(seed)], None)
                .unwrap();
            let (g, w) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
            assert!(
                g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "round {round} seed {seed}: a reused executor differs from a fresh one"
            );
        }
    }
}

/// A depthwise or Winograd conv's output comes from the pool with the stale values of an
/// earlier run (NaN among them) and no fill: every element must still be written. The conv
/// is the first node, so it takes a buffer that the last run's later nodes left in the
/// pool. Fused with a Relu (the clamp in registers) and alone; depthwise at stride 1 and 2
/// on planes whose width is not a multiple of the SIMD width, Winograd (3×3, 128 channels)
/// on odd planes (half tiles), the packed kernel reading its input in place; each run must
/// match a fresh executor's bits.
#[test]
fn convs_on_pooled_buffers_match_a_fresh_executor() {
    let (h, wd) = (13usize, 11usize);
    // (channels, groups, stride)
    // 128 and 32 channels: Winograd; 48 at stride 2: RLX's packed kernel reading the input
    // in place where the CPU has AVX-512, else the direct kernel or im2col.
    let kinds = [
        (5usize, 5usize, 1usize),
        (5, 5, 2),
        (128, 1, 1),
        (32, 1, 1),
        (48, 1, 2),
    ];
    let build = |(c, groups, stride): (usize, usize, usize), relu: bool| {
        let mut g = Graph::new("conv");
        let x = g.input("x", s(&[1, c, h, wd]));
        let cg = c / groups;
        let wv: Vec<f32> = (0..c * cg * 9)
            .map(|i| ((i * 37) % 11) as f32 / (5.0 * cg as f32) - 0.2)
            .collect();
        let w = g.constant(f32t(&[c, cg, 3, 3], &wv));
        let bv: Vec<f32> = (0..c).map(|i| (i % 5) as f32 - 2.0).collect();
        let b = g.constant(f32t(&[c], &bv));
        let (oh, ow) = ((h - 1) / stride + 1, (wd - 1) / stride + 1);
        let os = s(&[1, c, oh, ow]);
        let attrs = ConvAttrs {
            strides: vec![stride, stride],
            pads: vec![(1, 1), (1, 1)],
            dilations: vec![1, 1],
            groups,
        };
        let mut o = g.add_node(Op::Conv(attrs), vec![x, w, b], os.clone());
        if relu {
            o = g.activation(Activation::Relu, o, os.clone());
        }
        // Later same-size intermediates: their buffers stay in the pool for the next run.
        let t = g.activation(Activation::Tanh, o, os.clone());
        let e = g.unary(UnaryOp::Exp, o, os.clone());
        let out = g.add(t, e, os);
        g.set_outputs(vec![out]);
        g
    };
    let inputs = |c: usize, seed: u32| {
        let v: Vec<f32> = (0..c * h * wd)
            .map(|i| match (i as u32 * 7 + seed) % 31 {
                0 if seed == 1 => f32::NAN,
                1 if seed == 1 => 1e30,
                k => (k as f32 - 15.0) / (4.0 + seed as f32),
            })
            .collect();
        f32t(&[1, c, h, wd], &v)
    };
    for kind in kinds {
        for relu in [false, true] {
            let mut reused = CpuExecutor::new(build(kind, relu)).unwrap();
            // Seeds 2 and 3 have no NaN/Inf: the Winograd path keeps their outputs.
            for seed in [1u32, 2, 3, 1, 2, 3] {
                let got = reused.run(&[inputs(kind.0, seed)], None).unwrap();
                let want = CpuExecutor::new(build(kind, relu))
                    .unwrap()
                    .run(&[inputs(kind.0, seed)], None)
                    .unwrap();
                let (g, w) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
                assert!(
                    g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kind:?} relu {relu} seed {seed}: reused executor differs"
                );
            }
        }
    }
    let e = CpuExecutor::new(build(kinds[2], false)).unwrap();
    assert_eq!(
        e.winograd_convs(),
        1,
        "the 128-channel conv takes the Winograd path"
    );
}

/// `bias + x` (torch's operand order: the big operand second) where `x` dies at the Add
/// reuses `x`'s buffer; the values are the definition's `bias[j] + x[i][j]` (and `w[j] *
/// x[i][j]` for Mul) in f32, NaN and ±inf positions included, whether `x` dies there or is
/// still read later (then it must be left as it was).
#[test]
fn add_and_mul_into_their_second_input_match_the_definition() {
    let (r, c) = (3, 5);
    let xs: Vec<f32> = (0..r * c).map(|i| i as f32 * 0.75 - 4.0).collect();
    let bias: Vec<f32> = (0..c).map(|j| 0.5 - j as f32 * 1.25).collect();
    let mut xs = xs;
    xs[4] = f32::NAN;
    xs[7] = f32::INFINITY;
    for op in [BinaryOp::Add, BinaryOp::Mul] {
        for keep_x in [false, true] {
            let mut g = Graph::new("t");
            let x = g.input("x", s(&[r, c]));
            // An owned intermediate (Neg) so that the Add may take its buffer.
            let nx = g.unary(UnaryOp::Neg, x, s(&[r, c]));
            let b = g.constant(f32t(&[c], &bias));
            let y = g.binary(op, b, nx, s(&[r, c]));
            let mut outs = vec![y];
            if keep_x {
                let z = g.unary(UnaryOp::Abs, nx, s(&[r, c]));
                outs.push(z);
            }
            g.set_outputs(outs);
            let mut ex = CpuExecutor::new(g).unwrap();
            let out = ex.run(&[f32t(&[r, c], &xs)], None).unwrap();
            let got = out[0].as_f32().unwrap();
            for i in 0..r * c {
                let (p, q) = (bias[i % c], -xs[i]);
                let want = if op == BinaryOp::Add { p + q } else { p * q };
                assert!(
                    got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                    "{op:?} keep {keep_x} at {i}: {} vs {want}",
                    got[i]
                );
            }
            if keep_x {
                let z = out[1].as_f32().unwrap();
                for i in 0..r * c {
                    let want = xs[i].abs();
                    assert!(
                        z[i] == want || (z[i].is_nan() && want.is_nan()),
                        "abs at {i}"
                    );
                }
            }
        }
    }
}

/// Per-node profiling: off by default; on, it counts runs, sums per node of the executor's
/// graph, records time on the product's node, keeps the values exact (the hand-derived
/// product), and resets when turned on again. Where the time goes (MatMul against the tiny
/// Neg after it) is measured by bench/profile_ratio.py, not asserted here.
#[test]
fn profiling_counts_runs_and_times_each_node() {
    let n = 192;
    let mut g = Graph::new("prof");
    let a = g.input("a", s(&[n, n]));
    let b = g.input("b", s(&[n, n]));
    let m = g.matmul(a, b, s(&[n, n]));
    let sl = g.add_node(
        Op::Slice {
            starts: vec![0, 0],
            steps: vec![1, 1],
            sizes: vec![1, 2],
        },
        vec![m],
        s(&[1, 2]),
    );
    let neg = g.add_node(Op::Unary(UnaryOp::Neg), vec![sl], s(&[1, 2]));
    g.set_outputs(vec![neg]);
    let av: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let bv: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
    // Hand-derived: -(sum_k a[0][k] b[k][j]) for j = 0, 1.
    let want: Vec<f32> = (0..2)
        .map(|j| -(0..n).map(|k| av[k] * bv[k * n + j]).sum::<f32>())
        .collect();
    let ins = [f32t(&[n, n], &av), f32t(&[n, n], &bv)];
    let mut ex = CpuExecutor::new(g).unwrap();
    assert!(ex.profile().is_none(), "off by default");
    ex.run(&ins, None).unwrap();
    assert!(ex.profile().is_none());
    ex.set_profiling(true);
    assert_eq!(ex.profile().unwrap().runs, 0);
    for _ in 0..3 {
        let out = ex.run(&ins, None).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &want[..]);
    }
    let p = ex.profile().unwrap().clone();
    assert_eq!(p.runs, 3);
    assert_eq!(p.ns.len(), ex.graph().len());
    // The product's node recorded some time. (Which node takes the most time is a timing
    // question, not a unit test's: bench/profile_ratio.py prints the MatMul/Neg ratio.)
    assert!(p.ns[m.index()] > 0, "{p:?}");
    // On again: the sums restart; off: gone.
    ex.set_profiling(true);
    assert_eq!(ex.profile().unwrap().runs, 0);
    assert!(ex.profile().unwrap().ns.iter().all(|&t| t == 0));
    ex.set_profiling(false);
    assert!(ex.profile().is_none());
}

/// A run that fails part way (a Param not set, met after a product) adds nothing to the
/// profile: neither a run nor the product's time.
#[test]
fn a_failed_run_adds_nothing_to_the_profile() {
    let n = 64;
    let mut g = Graph::new("prof-fail");
    let a = g.input("a", s(&[n, n]));
    let m = g.matmul(a, a, s(&[n, n]));
    let p = g.param("p", s(&[n, n]));
    let y = g.add(m, p, s(&[n, n]));
    g.set_outputs(vec![y]);
    let mut ex = CpuExecutor::new(g).unwrap();
    ex.set_profiling(true);
    let x = f32t(&[n, n], &vec![0.5; n * n]);
    for _ in 0..3 {
        assert!(matches!(
            ex.run(std::slice::from_ref(&x), None),
            Err(CpuError::Param(_))
        ));
    }
    let prof = ex.profile().unwrap();
    assert_eq!(prof.runs, 0);
    assert!(prof.ns.iter().all(|&t| t == 0), "{prof:?}");
    // Then a good run counts once: 0.5 · 0.5 · 64 + 1 = 17 per element.
    ex.set_param("p", f32t(&[n * n], &vec![1.0; n * n]))
        .unwrap();
    let out = ex.run(&[x], None).unwrap();
    assert!(out[0].as_f32().unwrap().iter().all(|&v| v == 17.0));
    let prof = ex.profile().unwrap();
    assert_eq!(prof.runs, 1);
    assert!(prof.ns[m.index()] > 0);
}
