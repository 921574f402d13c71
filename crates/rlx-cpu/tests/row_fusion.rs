//! Row fusion (`rlx_cpu`'s rowfuse): the five primitives rlx-compile lowers an ONNX Softmax
//! over the last axis into (ReduceMax, Sub, Exp, ReduceSum, Div), and the seven of an
//! RMSNorm as torch exports it (Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul by the weight),
//! run as one pass per row. Checked here: the fused output is bit for bit the unfused one
//! and matches the f64 definitions (`exp(x - max) / sum(exp(x - max))`, `w * x /
//! sqrt(mean(x^2) + eps)`); a value that is not finite makes the scanner report exactly
//! what the unfused run reports (the group is replayed op by op). Expected non-finite
//! values are derived by hand from IEEE 754.

mod common;

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

/// Softmax over `dims` (one fused group) on `xs`: the scanner's reports and the output.
fn run(
    dims: &[usize],
    xs: &[f32],
    fuse: bool,
    mode: DebugMode,
) -> (Vec<(NodeId, usize, String)>, Vec<f32>) {
    let (groups, r, y) = run_graph(softmax_graph(dims).0, dims, xs, fuse, mode);
    assert_eq!(groups, 1);
    (r, y)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

fn data(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 1009) as f32 / 50.0 - 10.0)
        .collect()
}

/// Each row of `y` is `exp(x - max) / sum(exp(x - max))` of the same row of `x` in f64
/// (within 4e-6 relative, plus 1e-37 for subnormal results), rows in `skip` aside.
fn assert_softmax_definition(xs: &[f32], y: &[f32], n: usize, skip: &[usize]) {
    for (r, (row, got)) in xs.chunks(n).zip(y.chunks(n)).enumerate() {
        if skip.contains(&r) {
            continue;
        }
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        for (g, e) in got.iter().zip(&e) {
            let want = e / s;
            assert!(
                (*g as f64 - want).abs() <= 4e-6 * want + 1e-37,
                "n = {n}, row {r}: {g} vs {want}"
            );
        }
    }
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
        assert_softmax_definition(&xs, &y, n, &[]);
    }
}

#[test]
fn softmax_vector_rows_redo_only_the_rows_that_leave_the_vector_range() {
    // Rows a multiple of 16 long take the AVX-512 row kernel, rows a multiple of 8 the AVX2
    // one where the CPU lacks AVX-512 (four rows at a time, then one by one); a row where some `x - max` is neither in [-87, 88] nor below -104 is
    // redone by the reference kernel. Rows here, in groups of four plus three: a NaN (row
    // 1), +inf (row 2), a value 95 below the max (exp of -95 is subnormal: libm's path,
    // row 5), -inf and -3e38 masks (rows 4 and 8, which stay on the vector path), and
    // plain rows. Without fusion the same rows go through the five unfused ops.
    for n in [8, 16, 24, 48, 128] {
        let dims = [11, n];
        let mut xs = data(11 * n);
        xs[n + 3] = f32::NAN;
        xs[2 * n + n - 1] = f32::INFINITY;
        let row5 = &mut xs[5 * n..6 * n];
        let m = row5.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        row5[n / 2] = m - 95.0;
        xs[4 * n + 1] = f32::NEG_INFINITY;
        xs[8 * n + 7] = -3e38;
        let (_, yf) = run(&dims, &xs, true, DebugMode::Off);
        let (_, yp) = run(&dims, &xs, false, DebugMode::Off);
        assert_eq!(bits(&yf), bits(&yp), "n = {n}");
        assert!(yf[n..2 * n].iter().all(|v| v.is_nan()));
        // +inf: the max; inf - inf = NaN enters the sum, so the whole row is NaN.
        assert!(yf[2 * n..3 * n].iter().all(|v| v.is_nan()));
        // The f64 definition on every row without NaN or inf.
        assert_softmax_definition(&xs, &yf, n, &[1, 2]);
        assert!(
            yf[5 * n + n / 2] > 0.0 && yf[5 * n + n / 2] < 1e-38,
            "subnormal kept"
        );
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
    // A NaN alone (no inf beside it): the fused kernel must still replay.
    let mut xs = data(120);
    xs[50] = f32::NAN;
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (rf, yf) = run(&dims, &xs, true, mode);
        let (rp, yp) = run(&dims, &xs, false, mode);
        assert!(!rp.is_empty(), "{mode:?}");
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
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

/// `x` [rows..., n] → RMSNorm over the last axis as torch exports it (Qwen3RMSNorm), with a
/// weight of `n` values when `weight`; the intermediate named `output` is also a graph
/// output when given (then nothing may be fused). Returns (graph, [pow, mean, add, sqrt,
/// div, mul, (mul_w)]).
fn rms_graph(
    dims: &[usize],
    eps: f32,
    weight: bool,
    extra_output: Option<usize>,
) -> (Graph, Vec<NodeId>) {
    let mut g = Graph::new("rmsnorm");
    let s = Shape::new(dims, DType::F32);
    let mut rd = dims.to_vec();
    *rd.last_mut().unwrap() = 1;
    let r = Shape::new(&rd, DType::F32);
    let n = *dims.last().unwrap();
    let x = g.input("x", s.clone());
    let c = |g: &mut Graph, v: f32| g.constant(Tensor::from_f32(&[], vec![v]).unwrap());
    let two = c(&mut g, 2.0);
    let pow = g.add_node(Op::Binary(BinaryOp::Pow), vec![x, two], s.clone());
    let mean = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![dims.len() - 1],
            keepdims: true,
        },
        vec![pow],
        r.clone(),
    );
    let e = c(&mut g, eps);
    let add = g.add(mean, e, r.clone());
    let sqrt = g.unary(UnaryOp::Sqrt, add, r.clone());
    let one = c(&mut g, 1.0);
    let div = g.div(one, sqrt, r);
    let mul = g.mul(x, div, s.clone());
    let mut ids = vec![pow, mean, add, sqrt, div, mul];
    if weight {
        let wv: Vec<f32> = (0..n).map(|j| 0.5 + j as f32 / n as f32).collect();
        let w = g.constant(Tensor::from_f32(&[n], wv).unwrap());
        let mw = g.mul(w, mul, s);
        ids.push(mw);
    }
    let mut outs = vec![*ids.last().unwrap()];
    if let Some(k) = extra_output {
        outs.push(ids[k]);
    }
    g.set_outputs(outs);
    (g, ids)
}

/// Run `g` on `xs` with fusion on or off and a scanner in `mode`: the number of row groups
/// fused, the scanner's reports (node, element, label) and the output.
fn run_graph(
    g: Graph,
    dims: &[usize],
    xs: &[f32],
    fuse: bool,
    mode: DebugMode,
) -> (usize, Vec<common::Report>, Vec<f32>) {
    let mut ex = CpuExecutor::new(g).unwrap();
    let groups = ex.fused_row_groups();
    ex.set_fusion(fuse);
    let x = Tensor::from_f32(dims, xs.to_vec()).unwrap();
    let (r, y) = common::run_scanned(&mut ex, &[x], mode);
    (groups, r, y)
}

#[test]
fn fused_rms_norm_is_the_unfused_bits_and_the_definition() {
    let eps = 1e-6f32;
    for dims in [vec![3, 16], vec![2, 4, 64], vec![2, 300], vec![5, 1]] {
        let n = *dims.last().unwrap();
        let xs = data(dims.iter().product());
        for weight in [true, false] {
            let run = |fuse, mode| {
                run_graph(
                    rms_graph(&dims, eps, weight, None).0,
                    &dims,
                    &xs,
                    fuse,
                    mode,
                )
            };
            for mode in [DebugMode::Off, DebugMode::Strict] {
                let (groups, rf, yf) = run(true, mode);
                let (_, rp, yp) = run(false, mode);
                assert_eq!(groups, 1, "{dims:?}");
                assert_eq!(bits(&yf), bits(&yp), "{dims:?} weight {weight} {mode:?}");
                assert!(rf.is_empty() && rp.is_empty());
            }
            let (_, _, y) = run(true, DebugMode::Off);
            for (row, got) in xs.chunks(n).zip(y.chunks(n)) {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
                let r = 1.0 / (ms + eps as f64).sqrt();
                for (j, (g, &x)) in got.iter().zip(row).enumerate() {
                    let w = if weight {
                        0.5 + j as f64 / n as f64
                    } else {
                        1.0
                    };
                    let want = w * x as f64 * r;
                    assert!(
                        (*g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{dims:?}: {g} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn rms_norm_with_an_intermediate_output_is_not_fused_past_it() {
    let dims = [3, 16];
    let xs = data(48);
    // Intermediates 0..5 (Pow to Div) being read elsewhere stop the fusion; the Mul by
    // `r` being an output just ends the group there (the weight's Mul runs on its own).
    for k in 0..6 {
        let (groups, _, yf) = run_graph(
            rms_graph(&dims, 1e-6, true, Some(k)).0,
            &dims,
            &xs,
            true,
            DebugMode::Off,
        );
        assert_eq!(groups, usize::from(k == 5), "intermediate {k} is an output");
        let (_, _, yp) = run_graph(
            rms_graph(&dims, 1e-6, true, Some(k)).0,
            &dims,
            &xs,
            false,
            DebugMode::Off,
        );
        assert_eq!(bits(&yf), bits(&yp));
    }
}

#[test]
fn rms_norm_non_finite_values_are_reported_as_unfused() {
    let dims = [3, 16];
    let (_, ids) = rms_graph(&dims, 0.0, true, None);
    let (pow, div) = (ids[0], ids[4]);
    // Row 0: 1e20 squares to 1e40, +inf in the Pow (made there); row 1: all zeros with eps
    // 0, so the root is 0 and 1/0 = +inf in the Div (made there), then 0 * inf = NaN.
    let mut xs = data(48);
    xs[3] = 1e20;
    let run = |xs: &[f32], fuse, mode| {
        run_graph(rms_graph(&dims, 0.0, true, None).0, &dims, xs, fuse, mode)
    };
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (_, rf, yf) = run(&xs, true, mode);
        let (_, rp, yp) = run(&xs, false, mode);
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
    let (_, rf, _) = run(&xs, true, DebugMode::Strict);
    assert!(rf.iter().any(|(n, i, _)| *n == pow && *i == 3), "{rf:?}");
    let mut xs = data(48);
    xs[16..32].iter_mut().for_each(|v| *v = 0.0);
    let (_, rf, yf) = run(&xs, true, DebugMode::Strict);
    let (_, rp, yp) = run(&xs, false, DebugMode::Strict);
    assert_eq!(rf, rp);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(rf.iter().any(|(n, i, _)| *n == div && *i == 1), "{rf:?}");
    // Without a scanner the fused kernel runs on these values: still the unfused bits.
    let (_, _, yf) = run(&xs, true, DebugMode::Off);
    let (_, _, yp) = run(&xs, false, DebugMode::Off);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(yf[16..32].iter().all(|v| v.is_nan()));
}

/// The weight's Mul overflows (weights of 1e38 times outputs up to 4): only the fused
/// kernel's figure over its outputs sees it, as no intermediate is non-finite. Reports
/// must match the unfused run and name the Mul (made there: its inputs are finite).
#[test]
fn rms_norm_overflow_in_the_weight_is_reported_as_unfused() {
    let dims = [3, 16];
    let graph = || {
        let (mut g, ids) = rms_graph(&dims, 1e-6, true, None);
        let mw = ids[6];
        let w = g.node(mw).inputs[0];
        let big = Tensor::from_f32(&[16], vec![1e38; 16]).unwrap();
        g.node_mut(w).op = Op::Constant(std::sync::Arc::new(big));
        (g, mw)
    };
    // Row 0 is [1, 0, ..., 0]: its output 0 is 1 / sqrt(1/16 + eps) ≈ 4, times 1e38.
    let mut xs = data(48);
    xs[..16].iter_mut().for_each(|v| *v = 0.0);
    xs[0] = 1.0;
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (gf, mw) = graph();
        let (groups, rf, yf) = run_graph(gf, &dims, &xs, true, mode);
        let (_, rp, yp) = run_graph(graph().0, &dims, &xs, false, mode);
        assert_eq!(groups, 1);
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
        assert!(yf.iter().any(|v| v.is_infinite()));
        assert!(
            !rf.is_empty() && rf.iter().all(|(n, _, _)| *n == mw),
            "{rf:?}"
        );
    }
}

/// `x` [rows..., n] → LayerNorm over the last axis as rlx-compile lowers ONNX
/// LayerNormalization (mean, Sub, square, mean, Add eps, Sqrt, Div, Mul scale, Add bias).
/// Returns (graph, [mean, sub, sq, var, add, sqrt, div, mul, (add bias)]).
fn ln_graph(dims: &[usize], eps: f32, bias: bool) -> (Graph, Vec<NodeId>) {
    let mut g = Graph::new("layernorm");
    let s = Shape::new(dims, DType::F32);
    let mut rd = dims.to_vec();
    *rd.last_mut().unwrap() = 1;
    let r = Shape::new(&rd, DType::F32);
    let n = *dims.last().unwrap();
    let x = g.input("x", s.clone());
    let red = || Op::Reduce {
        kind: ReduceKind::Mean,
        axes: vec![dims.len() - 1],
        keepdims: true,
    };
    let mean = g.add_node(red(), vec![x], r.clone());
    let xc = g.sub(x, mean, s.clone());
    let sq = g.mul(xc, xc, s.clone());
    let var = g.add_node(red(), vec![sq], r.clone());
    let e = g.constant(Tensor::from_f32(&[], vec![eps]).unwrap());
    let ve = g.add(var, e, r.clone());
    let den = g.unary(UnaryOp::Sqrt, ve, r);
    let nrm = g.div(xc, den, s.clone());
    let sc: Vec<f32> = (0..n).map(|j| 0.5 + j as f32 / n as f32).collect();
    let sc = g.constant(Tensor::from_f32(&[n], sc).unwrap());
    let y = g.mul(nrm, sc, s.clone());
    let mut ids = vec![mean, xc, sq, var, ve, den, nrm, y];
    if bias {
        let bv: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.1).collect();
        let b = g.constant(Tensor::from_f32(&[n], bv).unwrap());
        ids.push(g.add(y, b, s));
    }
    g.set_outputs(vec![*ids.last().unwrap()]);
    (g, ids)
}

#[test]
fn fused_layer_norm_is_the_unfused_bits_and_the_definition() {
    let eps = 1e-5f32;
    for dims in [vec![3, 16], vec![2, 4, 64], vec![2, 300], vec![5, 1]] {
        let n = *dims.last().unwrap();
        let xs = data(dims.iter().product());
        for bias in [true, false] {
            let run = |fuse, mode| run_graph(ln_graph(&dims, eps, bias).0, &dims, &xs, fuse, mode);
            for mode in [DebugMode::Off, DebugMode::Strict] {
                let (groups, rf, yf) = run(true, mode);
                let (_, rp, yp) = run(false, mode);
                assert_eq!(groups, 1, "{dims:?}");
                assert_eq!(bits(&yf), bits(&yp), "{dims:?} bias {bias} {mode:?}");
                assert!(rf.is_empty() && rp.is_empty());
            }
            let (_, _, y) = run(true, DebugMode::Off);
            for (row, got) in xs.chunks(n).zip(y.chunks(n)) {
                let m = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let v = row.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n as f64;
                for (j, (g, &x)) in got.iter().zip(row).enumerate() {
                    let b = if bias { j as f64 * 0.01 - 0.1 } else { 0.0 };
                    let want =
                        (x as f64 - m) / (v + eps as f64).sqrt() * (0.5 + j as f64 / n as f64) + b;
                    assert!(
                        (*g as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{dims:?}: {g} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn layer_norm_non_finite_values_are_reported_as_unfused() {
    let dims = [3, 16];
    let (_, ids) = ln_graph(&dims, 0.0, true);
    let (sq, div) = (ids[2], ids[6]);
    let run =
        |xs: &[f32], fuse, mode| run_graph(ln_graph(&dims, 0.0, true).0, &dims, xs, fuse, mode);
    // Row 0: a 1e20 makes its centred value about 1e20, whose square (1e40) is +inf in the
    // Mul (made there); row 1 constant with eps 0: variance 0, root 0, 0/0 = NaN in the Div.
    let mut xs = data(48);
    xs[3] = 1e20;
    let (_, rf, yf) = run(&xs, true, DebugMode::Strict);
    let (_, rp, yp) = run(&xs, false, DebugMode::Strict);
    assert_eq!(rf, rp);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(rf.iter().any(|(n, i, _)| *n == sq && *i == 3), "{rf:?}");
    let mut xs = data(48);
    xs[16..32].iter_mut().for_each(|v| *v = 0.25);
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (_, rf, yf) = run(&xs, true, mode);
        let (_, rp, yp) = run(&xs, false, mode);
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
    let (_, rf, _) = run(&xs, true, DebugMode::Strict);
    assert!(rf.iter().any(|(n, i, _)| *n == div && *i == 16), "{rf:?}");
    let (_, _, yf) = run(&xs, true, DebugMode::Off);
    let (_, _, yp) = run(&xs, false, DebugMode::Off);
    assert_eq!(bits(&yf), bits(&yp));
    assert!(yf[16..32].iter().all(|v| v.is_nan()));
}

/// Rows of length 0: the reductions give their identities (ReduceMax -inf, ReduceMean NaN),
/// which the fused kernels would not compute; no group is made and the reports are the
/// unfused ones.
#[test]
fn empty_rows_are_not_fused() {
    let dims = [5, 0];
    let count = |g: Graph| CpuExecutor::new(g).unwrap().fused_row_groups();
    assert_eq!(count(softmax_graph(&dims).0), 0);
    assert_eq!(count(rms_graph(&dims, 1e-6, false, None).0), 0);
    assert_eq!(count(ln_graph(&dims, 1e-5, false).0), 0);
}

/// An RMSNorm on `x` `[1, C, 1, W]` (torch's export, no weight) read by a 1×1 Conv: its final
/// `x * inv` is both a row group's member and, with `inv` `[1, C, 1, 1]`, the shape of a
/// conv's per-channel scale Mul. The row group keeps it (the fused row never stores `inv`, so
/// a conv reading it failed with "input has no value"); the plain run is the unfused bits and
/// the f64 definition `conv(x / sqrt(mean(x^2) + eps))`.
#[test]
fn rms_norm_into_a_pointwise_conv_is_not_also_its_scale() {
    let (c, w, o) = (4usize, 32usize, 4usize);
    let dims = [1, c, 1, w];
    let eps = 1e-6f32;
    let build = || {
        let (mut g, ids) = rms_graph(&dims, eps, false, None);
        let mul = ids[5];
        let wv: Vec<f32> = (0..o * c)
            .map(|k| ((k * 7 % 11) as f32 - 5.0) / 8.0)
            .collect();
        let wt = g.constant(Tensor::from_f32(&[o, c, 1, 1], wv).unwrap());
        let a = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(0, 0), (0, 0)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let y = g.add_node(
            Op::Conv(a),
            vec![mul, wt],
            Shape::new(&[1, o, 1, w], DType::F32),
        );
        g.set_outputs(vec![y]);
        g
    };
    let xs = data(c * w);
    let run = |fuse, mode| {
        let mut ex = CpuExecutor::new(build()).unwrap();
        ex.set_fusion(fuse);
        let x = Tensor::from_f32(&dims, xs.clone()).unwrap();
        common::run_scanned(&mut ex, &[x], mode)
    };
    let (_, yf) = run(true, DebugMode::Off);
    let (_, yp) = run(false, DebugMode::Off);
    assert_eq!(bits(&yf), bits(&yp));
    let (rs, ys) = run(true, DebugMode::Strict);
    assert!(rs.is_empty());
    assert_eq!(bits(&ys), bits(&yp));
    // The definition: per channel row, inv = 1/sqrt(mean(x^2) + eps) over W.
    let mut xn = vec![0f64; c * w];
    for ch in 0..c {
        let row = &xs[ch * w..(ch + 1) * w];
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / w as f64;
        let r = 1.0 / (ms + eps as f64).sqrt();
        for j in 0..w {
            xn[ch * w + j] = row[j] as f64 * r;
        }
    }
    for oc in 0..o {
        for j in 0..w {
            let want: f64 = (0..c)
                .map(|ch| (((oc * c + ch) * 7 % 11) as f64 - 5.0) / 8.0 * xn[ch * w + j])
                .sum();
            let got = yf[oc * w + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "[{oc}, {j}]: {got} vs {want}"
            );
        }
    }
}
