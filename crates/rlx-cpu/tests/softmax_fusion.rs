//! Softmax row fusion (`rlx_cpu`'s rowfuse): the five primitives rlx-compile lowers an ONNX
//! Softmax over the last axis into (ReduceMax, Sub, Exp, ReduceSum, Div) run as one pass
//! per row. Checked here: the fused output is bit for bit the unfused one and matches the
//! f64 definition `exp(x - max) / sum(exp(x - max))`; a value that is not finite makes the
//! scanner report exactly what the unfused run reports (the group is replayed op by op).
//! Expected non-finite values are derived by hand from IEEE 754.

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

/// `x` [rows..., n] → Softmax over the last axis, laid out as rlx-compile's decomposition.
/// Returns (graph, [max, sub, exp, sum, div]).
fn softmax_graph(dims: &[usize]) -> (Graph, [NodeId; 5]) {
    let mut g = Graph::new("softmax");
    let s = Shape::new(dims, DType::F32);
    let mut rd = dims.to_vec();
    *rd.last_mut().unwrap() = 1;
    let r = Shape::new(&rd, DType::F32);
    let last = dims.len() - 1;
    let x = g.input("x", s.clone());
    let red = |kind| Op::Reduce {
        kind,
        axes: vec![last],
        keepdims: true,
    };
    let m = g.add_node(red(ReduceKind::Max), vec![x], r.clone());
    let d = g.sub(x, m, s.clone());
    let e = g.unary(UnaryOp::Exp, d, s.clone());
    let sum = g.add_node(red(ReduceKind::Sum), vec![e], r);
    let y = g.div(e, sum, s);
    for id in [m, d, e, sum, y] {
        g.set_name(id, "attn.softmax");
    }
    g.set_outputs(vec![y]);
    (g, [m, d, e, sum, y])
}

fn run(
    dims: &[usize],
    xs: &[f32],
    fuse: bool,
    mode: DebugMode,
) -> (Vec<(NodeId, usize, String)>, Vec<f32>) {
    let mut ex = CpuExecutor::new(softmax_graph(dims).0).unwrap();
    assert_eq!(ex.fused_softmaxes(), 1);
    ex.set_fusion(fuse);
    let mut sc = DebugScanner::new(mode, "cpu");
    sc.set_print(false);
    let y = ex
        .run(
            &[Tensor::from_f32(dims, xs.to_vec()).unwrap()],
            Some(&mut sc),
        )
        .unwrap();
    let r = sc
        .reports()
        .iter()
        .map(|r| (r.node, r.index, r.label.clone()))
        .collect();
    (r, y[0].as_f32().unwrap().to_vec())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

fn data(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 1009) as f32 / 50.0 - 10.0)
        .collect()
}

#[test]
fn fused_softmax_is_the_unfused_bits_and_the_definition() {
    // Rows shorter than a vector, not a multiple of 16, and longer than the kernel's
    // 256-element chunks; a causal-mask row (most entries -1e30: exp gives +0 there).
    for dims in [vec![3, 5], vec![2, 3, 37], vec![2, 300], vec![4, 128]] {
        let n = *dims.last().unwrap();
        let mut xs = data(dims.iter().product());
        if n == 128 {
            for (i, v) in xs.iter_mut().enumerate() {
                if i % n > (i / n) * 30 {
                    *v = -1e30;
                }
            }
        }
        for mode in [DebugMode::Off, DebugMode::Strict] {
            let (rf, yf) = run(&dims, &xs, true, mode);
            let (rp, yp) = run(&dims, &xs, false, mode);
            assert_eq!(bits(&yf), bits(&yp), "{dims:?} {mode:?}");
            assert!(rf.is_empty() && rp.is_empty());
        }
        let (_, y) = run(&dims, &xs, true, DebugMode::Off);
        for (row, got) in xs.chunks(n).zip(y.chunks(n)) {
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            for (g, e) in got.iter().zip(&e) {
                let want = e / s;
                assert!(
                    (*g as f64 - want).abs() <= 4e-6 * want + 1e-30,
                    "{dims:?}: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn non_finite_values_are_reported_as_unfused() {
    let dims = [3, 40];
    let (_, [_, sub, _, _, _]) = softmax_graph(&dims);
    // Row 0: +inf and NaN inputs (the max is NaN, d is NaN); row 1: 3e38 and -3e38, whose
    // difference -6e38 overflows to -inf in the Sub (created there); row 2: -inf entries
    // (a mask), carried by the Sub as -inf and made +0 by the Exp.
    let mut xs = data(120);
    xs[3] = f32::INFINITY;
    xs[7] = f32::NAN;
    xs[40 + 1] = 3e38;
    xs[40 + 2] = -3e38;
    xs[80 + 5] = f32::NEG_INFINITY;
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (rf, yf) = run(&dims, &xs, true, mode);
        let (rp, yp) = run(&dims, &xs, false, mode);
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
    // Without a scanner the fused kernel runs on these values too: still the same bits.
    let (_, yf) = run(&dims, &xs, true, DebugMode::Off);
    let (_, yp) = run(&dims, &xs, false, DebugMode::Off);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(yf[..40].iter().all(|v| v.is_nan()));
    assert_eq!(yf[80 + 5], 0.0);
    // Only row 1's values: the first non-finite value is the Sub's -inf (-3e38 - 3e38),
    // made there, which strict mode names (the input is finite).
    let mut xs = data(120);
    xs[40 + 1] = 3e38;
    xs[40 + 2] = -3e38;
    let (rf, yf) = run(&dims, &xs, true, DebugMode::Strict);
    let (rp, yp) = run(&dims, &xs, false, DebugMode::Strict);
    assert_eq!(rf, rp);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(
        rf.iter().any(|(n, i, _)| *n == sub && *i == 40 + 2),
        "{rf:?}"
    );
}
