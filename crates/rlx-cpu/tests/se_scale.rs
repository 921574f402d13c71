//! A Squeeze-and-Excitation scale folded into the next 1×1 conv (`CpuExecutor::
//! scaled_convs`): `Conv(x · s)` runs as a conv of `x` with `W'[o, c] = W[o, c] · s[c]`.
//! Values against the definition computed here in f64 (sigmoid, per-channel product, 1×1
//! conv, BatchNorm, SiLU), both operand orders, a later reader of `x` (its buffer must
//! outlive the skipped Mul); NaN reports as with fusion off (a scanner runs the Mul unless
//! its value is proven finite, and replays a fold that was not clean);
//! and where the fold is not planned.

mod common;

use common::{packed_on, rnd, run_scanned};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

const C: usize = 24;
const O: usize = 16;

fn sh(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

struct Built {
    g: Graph,
    mul: NodeId,
}

/// x [1, C, h, w], z [1, C, 1, 1] → s = Sigmoid(z) → Mul (s first when `s_first`) → Conv
/// 1×1 (O outputs, bias) → BatchNorm (Mul, Add) → SiLU; with `residual` (needs O == C) the
/// output adds x back, so x is read after the conv.
fn build(h: usize, w: usize, o: usize, s_first: bool, residual: bool) -> Built {
    build_with(h, w, o, s_first, residual, true)
}

/// [`build`], with `s = z` itself (any value) unless `sigmoid`.
fn build_with(h: usize, w: usize, o: usize, s_first: bool, residual: bool, sigmoid: bool) -> Built {
    let mut g = Graph::new("se");
    let x = g.input("x", sh(&[1, C, h, w]));
    let z = g.input("z", sh(&[1, C, 1, 1]));
    let s = if sigmoid {
        g.add_node(
            Op::Activation(Activation::Sigmoid),
            vec![z],
            sh(&[1, C, 1, 1]),
        )
    } else {
        z
    };
    let full = sh(&[1, C, h, w]);
    let ins = if s_first { vec![s, x] } else { vec![x, s] };
    let mul = g.add_node(Op::Binary(BinaryOp::Mul), ins, full);
    g.set_name(mul, "se.scale");
    let wt = g.constant(Tensor::from_f32(&[o, C, 1, 1], rnd(o * C, 1)).unwrap());
    let b = g.constant(Tensor::from_f32(&[o], rnd(o, 2)).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let out = sh(&[1, o, h, w]);
    let conv = g.add_node(Op::Conv(attrs), vec![mul, wt, b], out.clone());
    g.set_name(conv, "project.conv");
    let k = g.constant(Tensor::from_f32(&[o, 1, 1], bn_scale(o)).unwrap());
    let sh_ = g.constant(Tensor::from_f32(&[o, 1, 1], rnd(o, 4)).unwrap());
    let y = g.mul(conv, k, out.clone());
    let y = g.add(y, sh_, out.clone());
    let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![y], out.clone());
    let mut y = g.mul(y, sig, out.clone());
    if residual {
        y = g.add(y, x, out);
    }
    g.set_outputs(vec![y]);
    Built { g, mul }
}

fn bn_scale(o: usize) -> Vec<f32> {
    rnd(o, 3).iter().map(|v| 0.5 + v.abs()).collect()
}

fn reference(h: usize, w: usize, o: usize, residual: bool, x: &[f32], z: &[f32]) -> Vec<f64> {
    let (wt, b, k, sh_) = (rnd(o * C, 1), rnd(o, 2), bn_scale(o), rnd(o, 4));
    let hw = h * w;
    let s: Vec<f64> = z
        .iter()
        .map(|&v| 1.0 / (1.0 + (-(v as f64)).exp()))
        .collect();
    let mut out = vec![0f64; o * hw];
    for m in 0..o {
        for j in 0..hw {
            let mut v = b[m] as f64;
            for c in 0..C {
                v += wt[m * C + c] as f64 * (x[c * hw + j] as f64 * s[c]);
            }
            let v = v * k[m] as f64 + sh_[m] as f64;
            let mut y = v / (1.0 + (-v).exp());
            if residual {
                y += x[m * hw + j] as f64;
            }
            out[m * hw + j] = y;
        }
    }
    out
}

fn feeds(h: usize, w: usize, x: Vec<f32>, z: Vec<f32>) -> [Tensor; 2] {
    [
        Tensor::from_f32(&[1, C, h, w], x).unwrap(),
        Tensor::from_f32(&[1, C, 1, 1], z).unwrap(),
    ]
}

#[test]
fn scale_folded_into_the_conv_matches_the_definition() {
    let (h, w) = (9, 11);
    for (s_first, residual) in [(true, false), (false, false), (true, true)] {
        let o = if residual { C } else { O };
        let mut ex = CpuExecutor::new(build(h, w, o, s_first, residual).g).unwrap();
        assert_eq!(
            ex.scaled_convs(),
            1,
            "s_first {s_first}, residual {residual}"
        );
        let x: Vec<f32> = rnd(C * h * w, 5).iter().map(|v| v * 4.0).collect();
        let z: Vec<f32> = rnd(C, 6).iter().map(|v| v * 6.0).collect();
        let want = reference(h, w, o, residual, &x, &z);
        for fuse in [true, false] {
            ex.set_fusion(fuse);
            let y = ex.run(&feeds(h, w, x.clone(), z.clone()), None).unwrap();
            let y = y[0].as_f32().unwrap();
            for (i, (&got, &r)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (got as f64 - r).abs() <= 2e-5 * (1.0 + r.abs()),
                    "fuse {fuse}, s_first {s_first}, residual {residual}, at {i}: {got} vs {r}"
                );
            }
        }
    }
}

/// x = +inf at one pixel and s = 0 in its channel (z = -inf): the Mul makes inf · 0 = NaN.
/// With a scanner the Mul runs, so strict mode names it ("se.scale") as with fusion off;
/// without one the folded weight is 0 and the conv's 0 · inf gives NaN at the same pixels.
#[test]
fn a_nan_made_by_the_scale_is_reported_at_the_mul() {
    let (h, w) = (9, 11);
    let mut x = rnd(C * h * w, 7);
    x[3 * h * w + 20] = f32::INFINITY;
    let mut z = rnd(C, 8);
    z[3] = f32::NEG_INFINITY;
    let mut seen = vec![];
    for fuse in [true, false] {
        let b = build(h, w, O, true, false);
        let mut ex = CpuExecutor::new(b.g).unwrap();
        ex.set_fusion(fuse);
        let (r, y) = run_scanned(
            &mut ex,
            &feeds(h, w, x.clone(), z.clone()),
            DebugMode::Strict,
        );
        assert!(
            r.iter().any(|(n, _, l)| *n == b.mul && l == "se.scale"),
            "fuse {fuse}: {r:?}"
        );
        let nan: Vec<bool> = y.iter().map(|v| v.is_nan()).collect();
        seen.push((r, nan));
        // Unscanned (folded when fused): NaN at the same outputs.
        let y2 = ex.run(&feeds(h, w, x.clone(), z.clone()), None).unwrap();
        let nan2: Vec<bool> = y2[0].as_f32().unwrap().iter().map(|v| v.is_nan()).collect();
        assert_eq!(nan2, seen.last().unwrap().1, "fuse {fuse}");
        assert!(nan2.iter().any(|&v| v));
    }
    assert_eq!(seen[0], seen[1]);
}

/// With a NaN scan on and clean operands (`x` finite, `s` a Sigmoid's output, so `|x·s| ≤
/// |x|`), the Mul's value is proven finite without making it: the scanned run keeps the
/// fold (`scaled_runs`), reports nothing, and gives the definition's values.
#[test]
fn a_clean_scanned_run_keeps_the_fold() {
    let (h, w) = (9, 11);
    let mut ex = CpuExecutor::new(build(h, w, O, false, false).g).unwrap();
    let x: Vec<f32> = rnd(C * h * w, 11).iter().map(|v| v * 4.0).collect();
    let z: Vec<f32> = rnd(C, 12).iter().map(|v| v * 6.0).collect();
    let want = reference(h, w, O, false, &x, &z);
    for mode in [DebugMode::Strict, DebugMode::Warn] {
        let before = ex.scaled_runs();
        let (r, y) = run_scanned(&mut ex, &feeds(h, w, x.clone(), z.clone()), mode);
        assert!(r.is_empty(), "{mode:?}: {r:?}");
        assert_eq!(
            ex.scaled_runs(),
            before + 1,
            "{mode:?}: the fold was not used"
        );
        for (i, (&got, &r)) in y.iter().zip(&want).enumerate() {
            assert!(
                (got as f64 - r).abs() <= 2e-5 * (1.0 + r.abs()),
                "{mode:?} at {i}: {got} vs {r}"
            );
        }
    }
}

/// A finite Mul whose conv overflows: x = 3e38 everywhere, s in (0, 1), so `x·s` is finite
/// but the 1×1 conv's sums pass f32::MAX. The scanned fused run is not clean, so the Mul's
/// value is made and the group replayed op by op: the reports and the NaN/Inf positions are
/// those of the unfused run, and the first report names the conv.
#[test]
fn an_overflow_after_the_fold_is_replayed_and_named() {
    let (h, w) = (9, 11);
    let x = vec![3e38f32; C * h * w];
    let z = rnd(C, 13);
    let mut seen = vec![];
    for fuse in [true, false] {
        let mut ex = CpuExecutor::new(build(h, w, O, true, false).g).unwrap();
        ex.set_fusion(fuse);
        let (r, y) = run_scanned(
            &mut ex,
            &feeds(h, w, x.clone(), z.clone()),
            DebugMode::Strict,
        );
        assert_eq!(
            ex.scaled_runs(),
            0,
            "fuse {fuse}: a result that was not clean counted"
        );
        assert_eq!(
            r.first().map(|(_, _, l)| l.as_str()),
            Some("project.conv"),
            "fuse {fuse}: {r:?}"
        );
        let kind: Vec<(bool, bool)> = y.iter().map(|v| (v.is_nan(), v.is_infinite())).collect();
        assert!(kind.iter().any(|k| k.0 || k.1));
        seen.push((r, kind));
    }
    assert_eq!(seen[0], seen[1]);
}

/// Near f32::MAX, `(W·s)·x` and `W·(x·s)` round differently: here the op-by-op conv's
/// first partial sum overflows (`W[0]·(x·s)` rounds above f32::MAX) and the folded one's
/// does not, and the second term would bring the folded sum back to 4e37. A scan must not
/// trust the fold there: with a partial sum that could reach half of f32::MAX the Mul runs,
/// and the report names the conv as with fusion off (found by a review helper).
#[test]
fn a_scan_does_not_fold_where_the_two_orders_can_overflow_differently() {
    let mut g = Graph::new("se-edge");
    let x = g.input("x", sh(&[1, 2, 2, 2]));
    let sc = g.input("s", sh(&[1, 2, 1, 1]));
    let mul = g.add_node(Op::Binary(BinaryOp::Mul), vec![x, sc], sh(&[1, 2, 2, 2]));
    g.set_name(mul, "se.scale");
    let wt = g
        .constant(Tensor::from_f32(&[1, 2, 1, 1], vec![f32::from_bits(1066826722), -1.0]).unwrap());
    let b = g.constant(Tensor::from_f32(&[1], vec![0.0]).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let conv = g.add_node(Op::Conv(attrs), vec![mul, wt, b], sh(&[1, 1, 2, 2]));
    g.set_name(conv, "project.conv");
    g.set_outputs(vec![conv]);
    let mut xv = vec![f32::from_bits(2137842675); 4];
    xv.extend([3e38f32; 4]);
    let sv = vec![f32::from_bits(1063997699), 1.0];
    let ins = [
        Tensor::from_f32(&[1, 2, 2, 2], xv).unwrap(),
        Tensor::from_f32(&[1, 2, 1, 1], sv).unwrap(),
    ];
    let mut seen = vec![];
    for fuse in [true, false] {
        let mut ex = CpuExecutor::new(g.clone()).unwrap();
        assert_eq!(ex.scaled_convs(), 1);
        ex.set_fusion(fuse);
        let (r, y) = run_scanned(&mut ex, &ins, DebugMode::Strict);
        assert_eq!(ex.scaled_runs(), 0, "fuse {fuse}");
        assert!(y.iter().all(|v| v.is_infinite()), "fuse {fuse}: {y:?}");
        assert_eq!(
            r.first().map(|(_, _, l)| l.as_str()),
            Some("project.conv"),
            "fuse {fuse}: {r:?}"
        );
        seen.push(r);
    }
    assert_eq!(seen[0], seen[1]);
}

/// Not folded where scaling the weights costs more than the Mul (O ≥ H·W), nor for a
/// constant scale or a Mul read by another node too.
#[test]
fn folds_only_where_it_saves_a_pass() {
    let small = CpuExecutor::new(build(3, 4, O, true, false).g).unwrap();
    assert_eq!(small.scaled_convs(), 0, "O = 16 >= H·W = 12");
    let mut b = build(9, 11, O, true, false);
    let extra = b.g.add_node(
        Op::Activation(Activation::Relu),
        vec![b.mul],
        sh(&[1, C, 9, 11]),
    );
    let mut outs = b.g.outputs.clone();
    outs.push(extra);
    b.g.set_outputs(outs);
    let two_readers = CpuExecutor::new(b.g).unwrap();
    assert_eq!(two_readers.scaled_convs(), 0, "the Mul is read twice");
}

/// A scale above 1 (here 3e38, not from a Sigmoid): `W · s` and `x · s` overflow in
/// different places, so the conv runs on the Mul's value instead of folding. x = 4 in
/// channel 1 and s[1] = 3e38: the Mul gives +inf there for every pixel, and each output is
/// ±inf (or NaN after the SiLU of -inf), fused as unfused; folded, `W[o,1]·3e38·4` stays
/// finite for |W[o,1]| < 0.28.
#[test]
fn a_scale_above_one_runs_the_mul_first() {
    let (h, w) = (9, 11);
    let mut x = rnd(C * h * w, 9);
    x[h * w..2 * h * w].fill(4.0);
    let mut z: Vec<f32> = rnd(C, 10).iter().map(|v| v.abs()).collect();
    z[1] = 3e38;
    let mut outs = vec![];
    for fuse in [true, false] {
        let mut ex = CpuExecutor::new(build_with(h, w, O, true, false, false).g).unwrap();
        assert_eq!(ex.scaled_convs(), 1);
        ex.set_fusion(fuse);
        let y = ex.run(&feeds(h, w, x.clone(), z.clone()), None).unwrap();
        outs.push(y[0].as_f32().unwrap().to_vec());
        assert_eq!(
            ex.scaled_runs(),
            0,
            "fuse {fuse}: the Mul ran, nothing was folded"
        );
    }
    let kind = |v: f32| {
        (
            v.is_nan(),
            v.is_infinite(),
            v.is_sign_negative() && !v.is_nan(),
        )
    };
    for (i, (&a, &b)) in outs[0].iter().zip(&outs[1]).enumerate() {
        assert_eq!(kind(a), kind(b), "at {i}: fused {a}, unfused {b}");
        assert!(!a.is_finite(), "at {i}: {a}, want ±inf or NaN");
    }
}

/// EfficientNet-B0's shapes at 14² (`x [1, c, 14, 14]`, `o` outputs: 112←672 and 80←480,
/// whose last block of 16 channels runs the half tile, and 64←96): the fold takes the
/// conv's packed weights, scaled in their layout, where the packed kernel runs; the values
/// against the f64 definition `b + Σ_c W[o, c]·(x[c]·s[c])` within f32 summation's bound,
/// and a scanned run reports nothing and keeps the fold.
#[test]
fn scale_folded_into_packed_weights_matches_the_definition() {
    let (h, w) = (14, 14);
    let hw = h * w;
    for (c, o) in [(672, 112), (480, 80), (96, 64)] {
        let mut g = Graph::new("se_packed");
        let x = g.input("x", sh(&[1, c, h, w]));
        let z = g.input("z", sh(&[1, c, 1, 1]));
        let s = g.add_node(
            Op::Activation(Activation::Sigmoid),
            vec![z],
            sh(&[1, c, 1, 1]),
        );
        let mul = g.add_node(Op::Binary(BinaryOp::Mul), vec![x, s], sh(&[1, c, h, w]));
        let wv = rnd(o * c, 21);
        let bv = rnd(o, 22);
        let wt = Tensor::from_f32(&[o, c, 1, 1], wv.clone()).unwrap();
        let attrs = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(0, 0), (0, 0)],
            dilations: vec![1, 1],
            groups: 1,
        };
        // Whether this CPU packs the conv (the rule's bounds differ by CPU: K = 96 is
        // packed on AMD with AVX-512, not on Intel).
        let packs = packed_on()
            && rlx_kernels::kernels::conv::pack_form(&wt, &attrs, &sh(&[1, o, h, w])).is_some();
        let wt = g.constant(wt);
        let b = g.constant(Tensor::from_f32(&[o], bv.clone()).unwrap());
        let y = g.add_node(Op::Conv(attrs), vec![mul, wt, b], sh(&[1, o, h, w]));
        g.set_outputs(vec![y]);
        let mut ex = CpuExecutor::new(g).unwrap();
        assert_eq!(ex.scaled_convs(), 1, "{o}<-{c}");
        let xv: Vec<f32> = rnd(c * hw, 23).iter().map(|v| v * 4.0).collect();
        let zv: Vec<f32> = rnd(c, 24).iter().map(|v| v * 6.0).collect();
        let feeds = [
            Tensor::from_f32(&[1, c, h, w], xv.clone()).unwrap(),
            Tensor::from_f32(&[1, c, 1, 1], zv.clone()).unwrap(),
        ];
        let sd: Vec<f64> = zv
            .iter()
            .map(|&v| 1.0 / (1.0 + (-(v as f64)).exp()))
            .collect();
        let check = |y: &[f32], what: &str| {
            for m in 0..o {
                for j in 0..hw {
                    let (mut v, mut a) = (bv[m] as f64, (bv[m] as f64).abs());
                    for ci in 0..c {
                        let t = wv[m * c + ci] as f64 * (xv[ci * hw + j] as f64 * sd[ci]);
                        v += t;
                        a += t.abs();
                    }
                    // f32 sums of c + 1 terms, and the rounding of each scaled weight.
                    let bound = 4.0 * (c as f64 + 2.0) * f32::EPSILON as f64 * (a + 1.0);
                    let got = y[m * hw + j] as f64;
                    assert!(
                        (got - v).abs() <= bound,
                        "{o}<-{c} {what} at ({m}, {j}): {got} vs {v} (bound {bound})"
                    );
                }
            }
        };
        let before = rlx_cpu::packed_conv_runs();
        let folds = ex.scaled_runs();
        let y = ex.run(&feeds, None).unwrap();
        assert_eq!(
            ex.scaled_runs(),
            folds + 1,
            "{o}<-{c}: the fold was not used"
        );
        if packs {
            assert!(
                rlx_cpu::packed_conv_runs() > before,
                "{o}<-{c}: the folded conv took the packed kernel"
            );
        }
        check(y[0].as_f32().unwrap(), "plain");
        let (r, ys) = run_scanned(&mut ex, &feeds, DebugMode::Strict);
        assert!(r.is_empty(), "{o}<-{c}: {r:?}");
        assert_eq!(
            ex.scaled_runs(),
            folds + 2,
            "{o}<-{c}: the scanned run kept the fold"
        );
        check(&ys, "scanned");
    }
}
