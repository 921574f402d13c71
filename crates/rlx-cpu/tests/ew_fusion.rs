//! Elementwise chains (`rlx_cpu`'s ewfuse): connected f32 Unary/Activation/Binary ops run
//! block by block. Checked: the fused output is the unfused one bit for bit and matches the
//! f64 definition (GELU: `0.5·x·(1 + erf(x/√2))`; `tanh(x + b)`); a broadcast row longer
//! than a block; which chains are not fused (an operand computed after the chain's first
//! op, an intermediate read outside); and that the scanner reports exactly what the unfused
//! run reports when a value in the chain is not finite.

mod common;

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

fn f32s(dims: &[usize]) -> Shape {
    Shape::new(dims, DType::F32)
}

fn scalar(g: &mut Graph, v: f32) -> NodeId {
    g.constant(Tensor::from_f32(&[], vec![v]).unwrap())
}

/// The graph's inputs x `[rows, n]` and b `[n]`, and `h = b + x·1` ("dense.add"): the
/// GELU's operand, a computed value whose buffer can take the chain's output.
fn dense_head(name: &str, n: usize, rows: usize) -> (Graph, Shape, NodeId) {
    let mut g = Graph::new(name);
    let s = f32s(&[rows, n]);
    let x = g.input("x", s.clone());
    let b = g.input("b", f32s(&[n]));
    let one0 = scalar(&mut g, 1.0);
    let x1 = g.mul(x, one0, s.clone());
    let h = g.add(b, x1, s.clone());
    g.set_name(h, "dense.add");
    (g, s, h)
}

/// BERT's exact GELU as torch exports it, on `x·1 + b` (the Mul by one makes the chain's
/// head a computed value whose buffer can take the output): [x, b] → y.
fn gelu_graph(n: usize, rows: usize) -> Graph {
    let (mut g, s, h) = dense_head("gelu", n, rows);
    let r2 = scalar(&mut g, std::f32::consts::SQRT_2);
    let d = g.div(h, r2, s.clone());
    g.set_name(d, "gelu.div");
    let e = g.unary(UnaryOp::Erf, d, s.clone());
    g.set_name(e, "gelu.erf");
    let one = scalar(&mut g, 1.0);
    let a = g.add(e, one, s.clone());
    let m = g.mul(h, a, s.clone());
    let half = scalar(&mut g, 0.5);
    let y = g.mul(m, half, s);
    g.set_name(y, "gelu.mul_1");
    g.set_outputs(vec![y]);
    g
}

type Reports = Vec<common::Report>;

fn run(
    g: Graph,
    ins: &[(&[usize], Vec<f32>)],
    fuse: bool,
    mode: DebugMode,
) -> (usize, Reports, Vec<f32>) {
    let mut ex = CpuExecutor::new(g).unwrap();
    let chains = ex.fused_chains();
    ex.set_fusion(fuse);
    let ts: Vec<Tensor> = ins
        .iter()
        .map(|(d, v)| Tensor::from_f32(d, v.clone()).unwrap())
        .collect();
    let (r, y) = common::run_scanned(&mut ex, &ts, mode);
    (chains, r, y)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

fn data(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + salt) * 7919) % 1009) as f32 / 120.0 - 4.2)
        .collect()
}

/// erf in f64 (Abramowitz–Stegun 7.1.26 is too coarse here; this is the series/continued
/// fraction pair: Taylor below 2.5, else the asymptotic complement), |error| < 1e-12.
fn erf64(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.5 {
        let (mut term, mut sum, mut k) = (a, a, 0.0);
        loop {
            k += 1.0;
            term *= -a * a / k;
            let add = term / (2.0 * k + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(a) by Lentz's continued fraction.
        let mut f = a;
        let (mut c, mut d) = (a, 0.0);
        for k in 1..200 {
            let an = k as f64 / 2.0;
            d = 1.0 / (a + an * d);
            c = a + an / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
    };
    r.copysign(x)
}

#[test]
fn gelu_chain_is_the_unfused_bits_and_the_definition() {
    // 1536 (BERT's FFN width: whole rows per block), 40 (rows in blocks of 2040), 3000
    // (a row longer than a block: rows span blocks).
    for (n, rows) in [(1536, 3), (40, 70), (3000, 2)] {
        let (xs, bs) = (data(n * rows, 1), data(n, 2));
        let ins = [(&[rows, n][..], xs.clone()), (&[n][..], bs.clone())];
        let (chains, r, yf) = run(gelu_graph(n, rows), &ins, true, DebugMode::Off);
        assert_eq!(chains, 1, "n = {n}");
        assert!(r.is_empty());
        let (_, _, yp) = run(gelu_graph(n, rows), &ins, false, DebugMode::Off);
        assert_eq!(bits(&yf), bits(&yp), "n = {n}");
        for (i, got) in yf.iter().enumerate() {
            let h = xs[i] as f64 + bs[i % n] as f64;
            let want = 0.5 * h * (1.0 + erf64(h / std::f64::consts::SQRT_2));
            assert!(
                (*got as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "n = {n}, {i}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn chains_without_a_map_or_with_late_operands_are_not_fused() {
    let s = f32s(&[4, 8]);
    // Add and Mul alone: left to the in-place unfused ops.
    let mut g = Graph::new("arith");
    let x = g.input("x", s.clone());
    let two = scalar(&mut g, 2.0);
    let a = g.mul(x, two, s.clone());
    let y = g.add(a, x, s.clone());
    g.set_outputs(vec![y]);
    assert_eq!(CpuExecutor::new(g).unwrap().fused_chains(), 0);
    // tanh(x) * wᵀ where the Transpose comes after the Tanh: the chain would run at the
    // Tanh, before wᵀ exists.
    let s = f32s(&[8, 8]);
    let mut g = Graph::new("late");
    let x = g.input("x", s.clone());
    let w = g.input("w", s.clone());
    let t = g.activation(Activation::Tanh, x, s.clone());
    let z = g.add_node(Op::Transpose { perm: vec![1, 0] }, vec![w], s.clone());
    let y = g.mul(t, z, s.clone());
    g.set_outputs(vec![y]);
    let ins = [(&[8, 8][..], data(64, 3)), (&[8, 8][..], data(64, 4))];
    let (chains, _, got) = run(g, &ins, true, DebugMode::Off);
    assert_eq!(chains, 0);
    for (i, got) in got.iter().enumerate() {
        let (xv, wv) = (ins[0].1[i] as f64, ins[1].1[(i % 8) * 8 + i / 8] as f64);
        let want = xv.tanh() * wv;
        assert!((*got as f64 - want).abs() <= 1e-6, "{i}: {got} vs {want}");
    }
    let s = f32s(&[4, 8]);
    // An intermediate read outside the chain (a second graph output): the chain stops
    // before it, so [Exp] alone is not a chain and nothing is fused.
    let mut g = Graph::new("escape");
    let x = g.input("x", s.clone());
    let e = g.unary(UnaryOp::Exp, x, s.clone());
    let y = g.add(e, x, s.clone());
    g.set_outputs(vec![y, e]);
    assert_eq!(CpuExecutor::new(g).unwrap().fused_chains(), 0);
}

#[test]
fn non_finite_values_in_a_chain_are_reported_as_unfused() {
    let (n, rows) = (40, 70);
    let bs = data(n, 2);
    // A NaN in x (carried through the chain); a 3e38 that the bias add takes to +inf
    // (created in "dense.add"), which the Erf then maps to 1 and the product keeps inf.
    for (at, v) in [(77, f32::NAN), (1234, 3.3e38)] {
        let mut xs = data(n * rows, 1);
        xs[at] = v;
        let mut b = bs.clone();
        b[at % n] = 3.3e38;
        let ins = [(&[rows, n][..], xs), (&[n][..], b)];
        for mode in [DebugMode::Warn, DebugMode::Strict] {
            let (_, rf, yf) = run(gelu_graph(n, rows), &ins, true, mode);
            let (_, rp, yp) = run(gelu_graph(n, rows), &ins, false, mode);
            assert!(!rp.is_empty() || mode == DebugMode::Warn, "{mode:?} {at}");
            assert_eq!(rf, rp, "{mode:?} {at}");
            assert_eq!(bits(&yf), bits(&yp), "{mode:?} {at}");
        }
        // Without a scanner the chain runs fused on these values: still the same bits.
        let (_, _, yf) = run(gelu_graph(n, rows), &ins, true, DebugMode::Off);
        let (_, _, yp) = run(gelu_graph(n, rows), &ins, false, DebugMode::Off);
        assert_eq!(bits(&yf), bits(&yp));
    }
    // Strict mode names the bias add as where the +inf first appears.
    let mut xs = data(n * rows, 1);
    xs[5] = 3.3e38;
    let mut b = bs.clone();
    b[5] = 3.3e38;
    let ins = [(&[rows, n][..], xs), (&[n][..], b)];
    let (_, rf, _) = run(gelu_graph(n, rows), &ins, true, DebugMode::Strict);
    assert_eq!(
        rf.first().map(|r| (r.1, r.2.as_str())),
        Some((5, "dense.add"))
    );
}

#[test]
fn an_operand_a_matmul_reads_later_keeps_its_buffer() {
    // x feeds a chain (Exp, Add) and, through a Transpose the MatMul reads in place, a
    // MatMul that runs after the chain: x's buffer must not take the chain's output.
    let s = f32s(&[8, 8]);
    let mut g = Graph::new("shared");
    let a = g.input("a", s.clone());
    let b = g.input("b", s.clone());
    let c = g.input("c", s.clone());
    let x = g.add(a, b, s.clone());
    let t = g.add_node(Op::Transpose { perm: vec![1, 0] }, vec![x], s.clone());
    let e = g.unary(UnaryOp::Exp, x, s.clone());
    let y1 = g.add(e, x, s.clone());
    let m = g.matmul(c, t, s.clone());
    g.set_outputs(vec![m, y1]);
    let (xa, xb, xc) = (data(64, 5), data(64, 6), data(64, 7));
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!((ex.fused_chains(), ex.transposes_read_in_place()), (1, 1));
    let ins: Vec<Tensor> = [&xa, &xb, &xc]
        .iter()
        .map(|v| Tensor::from_f32(&[8, 8], v.to_vec()).unwrap())
        .collect();
    let out = ex.run(&ins, None).unwrap();
    let got = out[0].as_f32().unwrap();
    // m = c · xᵀ, x = a + b.
    for i in 0..8 {
        for j in 0..8 {
            let want: f64 = (0..8)
                .map(|k| xc[i * 8 + k] as f64 * (xa[j * 8 + k] + xb[j * 8 + k]) as f64)
                .sum();
            let g = got[i * 8 + j] as f64;
            assert!(
                (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{i},{j}: {g} vs {want}"
            );
        }
    }
    let y = out[1].as_f32().unwrap();
    for i in 0..64 {
        let xv = (xa[i] + xb[i]) as f64;
        assert!((y[i] as f64 - (xv.exp() + xv)).abs() <= 1e-5 * (1.0 + xv.exp()));
    }
}

/// GELU's erf form on `x·1 + b` with the scale as `Div(h, c0)` (`div`) or
/// `Mul(c0, h)`, and the last two products with their operands swapped (`Mul(e1, h)`,
/// `Mul(c2, m)`): [x, b] → y. The product `h · e1` is named "gelu.mul".
fn gelu_variant(n: usize, rows: usize, div: bool, c0: f32) -> Graph {
    let (mut g, s, h) = dense_head("gelu2", n, rows);
    let c = scalar(&mut g, c0);
    let d = if div {
        g.div(h, c, s.clone())
    } else {
        g.mul(c, h, s.clone())
    };
    let e = g.unary(UnaryOp::Erf, d, s.clone());
    let one = scalar(&mut g, 1.0);
    let a = g.add(one, e, s.clone());
    let m = g.mul(a, h, s.clone());
    g.set_name(m, "gelu.mul");
    let half = scalar(&mut g, 0.5);
    let y = g.mul(half, m, s);
    g.set_outputs(vec![y]);
    g
}

/// Values where GELU's pieces take their other paths: NaN, ±inf, overflow of `h · e1`
/// (3e38 · 2), subnormals and zeros of both signs (erf's linear path below 2^-12), the
/// negative tail where `1 + erf` cancels, and the range in between.
fn gelu_inputs(len: usize) -> Vec<f32> {
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3e38,
        -3e38,
        1e-40,
        -1e-40,
        0.0,
        -0.0,
        1e-5,
        -2e-4,
        -1.0,
        -5.0,
        -9.5,
        -13.0,
        -20.0,
        5.0,
        1e4,
        -1e4,
    ];
    let mut v = data(len, 5);
    for (i, s) in special.iter().enumerate() {
        v[i * 37 % len] = *s;
    }
    v
}

#[test]
fn gelu_runs_as_one_pass_with_the_unfused_bits() {
    use std::f32::consts::{FRAC_1_SQRT_2, SQRT_2};
    let (n, rows) = (1536, 2);
    let xs = gelu_inputs(n * rows);
    let bs = vec![0f32; n];
    let ins = [(&[rows, n][..], xs.clone()), (&[n][..], bs)];
    // (div, c0, taken): the one-pass GELU only where a finite x keeps `x / c0` finite.
    for (div, c0, taken) in [
        (true, SQRT_2, 1),
        (false, FRAC_1_SQRT_2, 1),
        (true, 0.5, 0),
        (false, 2.0, 0),
    ] {
        let ex = CpuExecutor::new(gelu_variant(n, rows, div, c0)).unwrap();
        assert_eq!(
            (ex.fused_chains(), ex.fused_gelus()),
            (1, taken),
            "{div} {c0}"
        );
        let (_, r, yf) = run(gelu_variant(n, rows, div, c0), &ins, true, DebugMode::Off);
        assert!(r.is_empty());
        let (_, _, yp) = run(gelu_variant(n, rows, div, c0), &ins, false, DebugMode::Off);
        for (i, (f, p)) in yf.iter().zip(&yp).enumerate() {
            // NaN payloads aside (see ewfuse's docs), the same bits.
            let same = f.to_bits() == p.to_bits() || (f.is_nan() && p.is_nan());
            assert!(
                same,
                "{div} {c0}: [{i}] x = {}: {f:e} fused, {p:e} unfused",
                xs[i]
            );
        }
        if taken == 0 {
            continue;
        }
        for (i, got) in yf.iter().enumerate() {
            let h = xs[i] as f64;
            let want = 0.5 * h * (1.0 + erf64(h / std::f64::consts::SQRT_2));
            if h.is_nan() {
                assert!(got.is_nan(), "[{i}] gelu(NaN) = {got}");
            } else if h.abs() > 1e30 {
                // `h · (1 + erf)` overflows f32 (or is inf · 0 at -inf), as unfused.
                assert!(h < 0.0 || got.is_infinite(), "[{i}] gelu({h}) = {got}");
            } else {
                // Absolute near 0: `1 + erf` cancels in the tail (as the export computes).
                let tol = 2e-6 * (1.0 + want.abs());
                assert!(
                    (*got as f64 - want).abs() <= tol,
                    "[{i}] gelu({h}) = {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn an_overflow_inside_the_one_pass_gelu_is_reported_at_its_op() {
    // x = 3e38: h · (1 + erf) = 6e38 overflows at "gelu.mul"; the last product keeps it
    // inf, so the scanner sees the chain's output not finite and replays it op by op.
    let (n, rows) = (40, 3);
    let mut xs = data(n * rows, 1);
    xs[50] = 3e38;
    let ins = [(&[rows, n][..], xs), (&[n][..], vec![0f32; n])];
    let g = || gelu_variant(n, rows, true, std::f32::consts::SQRT_2);
    assert_eq!(CpuExecutor::new(g()).unwrap().fused_gelus(), 1);
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (_, rf, yf) = run(g(), &ins, true, mode);
        let (_, rp, yp) = run(g(), &ins, false, mode);
        assert_eq!(rf, rp, "{mode:?}");
        assert_eq!(
            rf.first().map(|r| (r.1, r.2.as_str())),
            Some((50, "gelu.mul")),
            "{mode:?}"
        );
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
}
