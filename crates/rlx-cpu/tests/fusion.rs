//! Conv epilogue fusion (Conv + decomposed BatchNormalization + Relu run as one conv with
//! folded weights): values against the definition computed here in f64, and NaN/Inf
//! reports identical to the unfused run (the group is replayed op by op when its output is
//! not finite). Expected causes are derived by hand from IEEE 754: inf + (-inf) is NaN.

mod common;

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

const C: usize = 2; // input channels
const M: usize = 3; // output channels
const H: usize = 6;
const W: usize = 5;

fn s(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

fn weights() -> Vec<f32> {
    (0..M * C * 9)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
        .collect()
}

// BatchNorm parameters, per output channel; channel 1 has a negative scale.
const MEAN: [f32; M] = [0.5, -0.25, 1.0];
const K: [f32; M] = [1.5, -2000.0, 0.75];
const BIAS: [f32; M] = [0.1, 0.2, -0.3];
const CONV_B: [f32; M] = [0.05, -0.05, 0.0];

/// Input `x` [1, C, H, W] and a 3x3 pad-1 Conv of it with [`weights`] and bias `b`.
fn conv3x3(g: &mut Graph, b: Option<NodeId>) -> NodeId {
    let x = g.input("x", s(&[1, C, H, W]));
    let w = g.constant(Tensor::from_f32(&[M, C, 3, 3], weights()).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let ins = [x, w].into_iter().chain(b).collect();
    g.add_node(Op::Conv(attrs), ins, s(&[1, M, H, W]))
}

/// Conv(3x3, pad 1) + bias → Sub(mean) → Mul(k) → Add(bias) → Relu, as the BatchNorm
/// decomposition of rlx-compile lays it out (per-channel constants of dims [M, 1, 1]).
fn graph() -> (Graph, NodeId, [NodeId; 4]) {
    let mut g = Graph::new("convbn");
    let b = g.constant(Tensor::from_f32(&[M], CONV_B.to_vec()).unwrap());
    let conv = conv3x3(&mut g, Some(b));
    let out = s(&[1, M, H, W]);
    g.set_name(conv, "layer1.conv");
    let pc =
        |g: &mut Graph, v: [f32; M]| g.constant(Tensor::from_f32(&[M, 1, 1], v.to_vec()).unwrap());
    let (mean, k, bias) = (pc(&mut g, MEAN), pc(&mut g, K), pc(&mut g, BIAS));
    let sub = g.sub(conv, mean, out.clone());
    let mul = g.mul(sub, k, out.clone());
    let add = g.add(mul, bias, out.clone());
    for n in [sub, mul, add] {
        g.set_name(n, "layer1.bn");
    }
    let relu = g.add_node(Op::Activation(Activation::Relu), vec![add], out);
    g.set_name(relu, "layer1.relu");
    g.set_outputs(vec![relu]);
    (g, conv, [sub, mul, add, relu])
}

/// The definition in f64: relu((conv(x, W) + b - mean) * k + bias), and per element the
/// magnitude of the terms it sums (for a rounding bound).
fn reference(x: &[f32]) -> Vec<(f64, f64)> {
    let w = weights();
    let mut out = vec![(0f64, 0f64); M * H * W];
    for m in 0..M {
        for oy in 0..H {
            for ox in 0..W {
                let mut acc = CONV_B[m] as f64;
                let mut mag = (CONV_B[m] as f64).abs();
                for c in 0..C {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) =
                                (oy as isize + ky as isize - 1, ox as isize + kx as isize - 1);
                            if iy < 0 || ix < 0 || iy >= H as isize || ix >= W as isize {
                                continue;
                            }
                            let p = w[((m * C + c) * 3 + ky) * 3 + kx] as f64
                                * x[(c * H + iy as usize) * W + ix as usize] as f64;
                            acc += p;
                            mag += p.abs();
                        }
                    }
                }
                let v = (acc - MEAN[m] as f64) * K[m] as f64 + BIAS[m] as f64;
                let mag =
                    (mag + (MEAN[m] as f64).abs()) * (K[m] as f64).abs() + (BIAS[m] as f64).abs();
                out[(m * H + oy) * W + ox] = (if v.is_nan() { v } else { v.max(0.0) }, mag);
            }
        }
    }
    out
}

fn input() -> Vec<f32> {
    (0..C * H * W)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.25)
        .collect()
}

#[test]
fn fused_conv_bn_relu_matches_the_definition() {
    let (g, _, _) = graph();
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!(ex.fused_groups(), 1);
    let xs = input();
    let want = reference(&xs);
    for fuse in [true, false] {
        ex.set_fusion(fuse);
        let y = ex
            .run(
                &[Tensor::from_f32(&[1, C, H, W], xs.clone()).unwrap()],
                None,
            )
            .unwrap();
        for (i, (&got, &(w, mag))) in y[0].as_f32().unwrap().iter().zip(&want).enumerate() {
            // f32 rounding of sums of 19 terms of magnitude `mag`, fused or not.
            assert!(
                (got as f64 - w).abs() <= 32.0 * f32::EPSILON as f64 * mag,
                "fusion {fuse}: at {i}: {got} vs {w} (terms {mag})"
            );
        }
    }
}

fn reports(fuse: bool, mode: DebugMode, xs: &[f32]) -> (Vec<(NodeId, usize, String)>, Vec<f32>) {
    run_scanned(graph().0, fuse, mode, xs)
}

/// Run `g` (one fusable group) on `xs` with fusion on or off and a scanner in `mode`: the
/// scanner's reports (node, element, label) and the output.
fn run_scanned(
    g: Graph,
    fuse: bool,
    mode: DebugMode,
    xs: &[f32],
) -> (Vec<common::Report>, Vec<f32>) {
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!(ex.fused_groups(), 1);
    ex.set_fusion(fuse);
    let x = Tensor::from_f32(&[1, C, H, W], xs.to_vec()).unwrap();
    common::run_scanned(&mut ex, &[x], mode)
}

#[test]
fn nan_made_inside_a_fused_conv_names_the_conv() {
    // +inf and -inf under one 3x3 window: the conv sums inf + (-inf) = NaN there.
    let mut xs = input();
    xs[2 * W + 2] = f32::INFINITY;
    xs[2 * W + 3] = f32::NEG_INFINITY;
    let (g, conv, _) = graph();
    let _ = g;
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (fused, yf) = reports(true, mode, &xs);
        let (plain, yp) = reports(false, mode, &xs);
        assert_eq!(fused, plain, "{mode:?}");
        assert!(
            fused
                .iter()
                .any(|(n, _, l)| *n == conv && l == "layer1.conv"),
            "{fused:?}"
        );
        assert_eq!(yf.len(), yp.len());
        for (a, b) in yf.iter().zip(&yp) {
            assert!(a.is_nan() == b.is_nan(), "{a} vs {b}");
        }
    }
}

#[test]
fn inf_hidden_by_the_relu_is_still_reported_in_strict_mode() {
    // Input channel 0 zero, channel 1 -1e36: output channel 1's interior sums to
    // -0.6 * -1e36 = 6e35 (its channel-1 weights sum to -0.6; partial sums stay below
    // 2.4e36), and its BatchNorm scale -2000 overflows that to -inf in the Mul; the Relu
    // turns it into 0. Strict mode reports the Inf where it first appears (the Mul), fused
    // or not: the fused conv (weights scaled by -2000) overflows in its sum instead, so the
    // group is replayed op by op.
    let mut xs = vec![0f32; C * H * W];
    xs[H * W..].iter_mut().for_each(|v| *v = -1e36);
    let (_, _, [_, mul, _, _]) = graph();
    let (plain, yp) = reports(false, DebugMode::Strict, &xs);
    let (fused, yf) = reports(true, DebugMode::Strict, &xs);
    assert!(
        plain.iter().any(|(n, _, l)| *n == mul && l == "layer1.bn"),
        "{plain:?}"
    );
    assert_eq!(fused, plain);
    assert_eq!(yf[H * W + 2 * W + 2], 0.0);
    assert_eq!(yp[H * W + 2 * W + 2], 0.0);
}

/// A chain whose net scale is 1 (`Mul(1e30)` then `Div(1e30)`): the fold is the identity,
/// but unfused the Mul overflows to ±inf wherever |conv| > 3.4e8. With the scanner on, the
/// fused value's magnitude bound (1e30 · max|y|) exceeds f32::MAX, so the group is replayed
/// and the Mul is reported, as with fusion off.
#[test]
fn overflow_inside_the_chain_is_reported_as_with_fusion_off() {
    let mut g = Graph::new("updown");
    let conv = conv3x3(&mut g, None);
    let out = s(&[1, M, H, W]);
    let k = g.constant(Tensor::from_f32(&[], vec![1e30]).unwrap());
    let up = g.mul(conv, k, out.clone());
    g.set_name(up, "scale_up");
    let down = g.div(up, k, out);
    g.set_name(down, "scale_down");
    g.set_outputs(vec![down]);
    let xs: Vec<f32> = input().iter().map(|v| v * 1e9).collect();
    let run = |fuse: bool| {
        let (reports, y) = run_scanned(g.clone(), fuse, DebugMode::Strict, &xs);
        let r: Vec<(NodeId, String)> = reports.into_iter().map(|(n, _, l)| (n, l)).collect();
        (r, y.iter().filter(|v| v.is_infinite()).count())
    };
    let (plain, inf_plain) = run(false);
    let (fused, inf_fused) = run(true);
    assert!(
        plain.iter().any(|(n, l)| *n == up && l == "scale_up"),
        "{plain:?}"
    );
    assert!(inf_plain > 0);
    assert_eq!(fused, plain);
    assert_eq!(inf_fused, inf_plain);
}

/// Conv(3x3, pad 1) → Sigmoid → Mul(conv, sigmoid): the SiLU of a torch export
/// (EfficientNet). Returns (graph, conv, sigmoid, mul).
fn silu_graph() -> (Graph, NodeId, NodeId, NodeId) {
    let mut g = Graph::new("convsilu");
    let conv = conv3x3(&mut g, None);
    g.set_name(conv, "stem.conv");
    let out = s(&[1, M, H, W]);
    let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![conv], out.clone());
    g.set_name(sig, "stem.act.sigmoid");
    let mul = g.mul(conv, sig, out);
    g.set_name(mul, "stem.act.mul");
    g.set_outputs(vec![mul]);
    (g, conv, sig, mul)
}

/// The 3x3 pad-1 conv of `xs` with [`weights`] and no bias, in f64, `[M, H, W]` row-major.
fn conv_ref(xs: &[f32]) -> Vec<f64> {
    let w = weights();
    let mut out = vec![0f64; M * H * W];
    for m in 0..M {
        for oy in 0..H {
            for ox in 0..W {
                let mut c = 0f64;
                for ci in 0..C {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy as isize + ky - 1, ox as isize + kx - 1);
                            if (0..H as isize).contains(&iy) && (0..W as isize).contains(&ix) {
                                let xv = xs[ci * H * W + iy as usize * W + ix as usize] as f64;
                                let wv = w[((m * C + ci) * 3 + ky as usize) * 3 + kx as usize];
                                c += xv * wv as f64;
                            }
                        }
                    }
                }
                out[(m * H + oy) * W + ox] = c;
            }
        }
    }
    out
}

fn silu_run(fuse: bool, xs: &[f32]) -> (Vec<(NodeId, usize, String)>, Vec<f32>) {
    run_scanned(silu_graph().0, fuse, DebugMode::Strict, xs)
}

/// Fused SiLU: against the f64 definition c·σ(c) of the conv c (summed here), and
/// bit for bit the unfused Sigmoid then Mul (same kernels). With a -inf input under a
/// window, the conv is -inf there and the Mul makes -inf·σ(-inf) = -inf·0 = NaN: strict
/// mode names the Conv for the Inf and the Mul for the NaN, fused or not.
#[test]
fn fused_silu_matches_the_definition_and_reports_as_unfused() {
    let xs = input();
    let (_, yf) = silu_run(true, &xs);
    let (_, yp) = silu_run(false, &xs);
    assert_eq!(
        yf.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        yp.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    for (i, &c) in conv_ref(&xs).iter().enumerate() {
        let want = c / (1.0 + (-c).exp());
        let got = yf[i] as f64;
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    }
    // -inf alone under some windows: conv -inf (or +inf for negative weights) there.
    let mut xs = input();
    xs[2 * W + 2] = f32::NEG_INFINITY;
    let (fused, yf) = silu_run(true, &xs);
    let (plain, yp) = silu_run(false, &xs);
    let (_, conv, _, mul) = silu_graph();
    assert_eq!(fused, plain);
    assert!(fused.iter().any(|(n, _, _)| *n == conv), "{fused:?}");
    assert!(
        fused
            .iter()
            .any(|(n, _, l)| *n == mul && l == "stem.act.mul"),
        "{fused:?}"
    );
    assert!(yf.iter().any(|v| v.is_nan()));
    for (a, b) in yf.iter().zip(&yp) {
        assert_eq!(a.is_nan(), b.is_nan());
    }
}

/// Conv(3x3, pad 1) → Max(·, lo) → Min(·, hi) with scalar constants: ONNX Clip as imported
/// (MobileNetV2's ReLU6 is lo 0, hi 6). Returns (graph, conv, max, min).
fn clip_graph(lo: f32, hi: f32) -> (Graph, NodeId, NodeId, NodeId) {
    let mut g = Graph::new("convclip");
    let conv = conv3x3(&mut g, None);
    g.set_name(conv, "features.0.conv");
    let out = s(&[1, M, H, W]);
    let lo = g.constant(Tensor::from_f32(&[], vec![lo]).unwrap());
    let hi = g.constant(Tensor::from_f32(&[], vec![hi]).unwrap());
    let max = g.add_node(Op::Binary(BinaryOp::Max), vec![conv, lo], out.clone());
    let min = g.add_node(Op::Binary(BinaryOp::Min), vec![max, hi], out);
    g.set_name(max, "features.0.clip");
    g.set_name(min, "features.0.clip");
    g.set_outputs(vec![min]);
    (g, conv, max, min)
}

/// Fused Clip: against the f64 definition min(max(c, lo), hi) of the conv c, and bit for
/// bit the unfused Max then Min. A window holding +inf and -inf makes the conv NaN there,
/// and Max/Min carry it (ONNX Max/Min propagate NaN): the scanner names the Conv, fused or
/// not, and the NaN reaches the output in both.
#[test]
fn fused_clip_matches_the_definition_and_reports_as_unfused() {
    let (lo, hi) = (0.0f32, 0.5f32);
    let clip_run =
        |fuse: bool, mode: DebugMode, xs: &[f32]| run_scanned(clip_graph(lo, hi).0, fuse, mode, xs);
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // Off: the Clip runs inside the conv, per block; Strict: after the scan.
    for mode in [DebugMode::Off, DebugMode::Strict] {
        let xs = input();
        let (_, yf) = clip_run(true, mode, &xs);
        let (_, yp) = clip_run(false, mode, &xs);
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
        let c = conv_ref(&xs);
        assert!(c.iter().any(|&v| v < lo as f64) && c.iter().any(|&v| v > hi as f64));
        for (i, &v) in c.iter().enumerate() {
            let want = v.max(lo as f64).min(hi as f64);
            let got = yf[i] as f64;
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "[{i}] {got} vs {want}"
            );
        }
        let mut xs = input();
        xs[2 * W + 2] = f32::INFINITY;
        xs[2 * W + 3] = f32::NEG_INFINITY;
        let (fused, yf) = clip_run(true, mode, &xs);
        let (plain, yp) = clip_run(false, mode, &xs);
        assert_eq!(fused, plain, "{mode:?}");
        assert!(yf.iter().any(|v| v.is_nan()), "{mode:?}");
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
        if mode == DebugMode::Strict {
            let (_, conv, _, _) = clip_graph(lo, hi);
            assert!(fused.iter().any(|(n, _, _)| *n == conv), "{fused:?}");
        }
    }
}

/// Clips that must stay unfused, because fused they would not be bit for bit the unfused
/// ops or would hide an Inf from the scan: a bound of +inf or -inf (Max(y, +inf) makes
/// every value +inf after the checked conv output), a NaN bound, and the constant as the
/// first operand (Max(-0.0, +0.0) keeps the constant's sign of zero).
#[test]
fn clips_that_would_change_results_are_not_fused() {
    let cases: [(&str, f32, bool); 4] = [
        ("lo +inf", f32::INFINITY, false),
        ("lo -inf", f32::NEG_INFINITY, false),
        ("lo NaN", f32::NAN, false),
        ("constant first", -0.0, true),
    ];
    for (name, lo, const_first) in cases {
        let mut g = Graph::new("convmax");
        let conv = conv3x3(&mut g, None);
        let out = s(&[1, M, H, W]);
        let c = g.constant(Tensor::from_f32(&[], vec![lo]).unwrap());
        let ins = if const_first {
            vec![c, conv]
        } else {
            vec![conv, c]
        };
        let max = g.add_node(Op::Binary(BinaryOp::Max), ins, out);
        g.set_outputs(vec![max]);
        let ex = CpuExecutor::new(g).unwrap();
        assert_eq!(ex.fused_groups(), 0, "{name}");
    }
}

/// Depthwise Conv(3x3, pad 1, positive weights) → Clip(0, 6), MobileNetV2's ReLU6 after its
/// depthwise convs. Returns (graph, conv).
fn depthwise_clip_graph() -> (Graph, NodeId) {
    let mut g = Graph::new("dwclip");
    let x = g.input("x", s(&[1, C, H, W]));
    let wv: Vec<f32> = (0..C * 9).map(|i| (i % 5 + 1) as f32 * 0.1).collect();
    let w = g.constant(Tensor::from_f32(&[C, 1, 3, 3], wv).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: C,
    };
    let out = s(&[1, C, H, W]);
    let conv = g.add_node(Op::Conv(attrs), vec![x, w], out.clone());
    g.set_name(conv, "features.1.conv.0");
    let lo = g.constant(Tensor::from_f32(&[], vec![0.0]).unwrap());
    let hi = g.constant(Tensor::from_f32(&[], vec![6.0]).unwrap());
    let max = g.add_node(Op::Binary(BinaryOp::Max), vec![conv, lo], out.clone());
    let min = g.add_node(Op::Binary(BinaryOp::Min), vec![max, hi], out);
    g.set_outputs(vec![min]);
    (g, conv)
}

/// The depthwise kernel applies the Clip in registers, also while scanning (it takes the
/// largest |y| before the Clip in the same pass): large finite inputs make the conv
/// overflow to +inf, which the Clip turns into 6. The scanner must report as unfused (in
/// strict mode it names the Conv for those Infs), and the outputs must be the same bits.
#[test]
fn inf_hidden_by_a_clip_after_a_depthwise_conv_is_reported() {
    // A 3x3 block of 3e38 in channel 0: the window centred on it sums 3e38 times the
    // channel's weights (0.1 + 0.2 + ... = 2.5), which overflows to +inf; windows that
    // hold one 3e38 stay finite (at most 0.5 * 3e38 plus small terms).
    let mut xs = input();
    for dy in 1..4 {
        for dx in 1..4 {
            xs[dy * W + dx] = 3e38;
        }
    }
    let (_, conv) = depthwise_clip_graph();
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (fused, yf) = run_scanned(depthwise_clip_graph().0, true, mode, &xs);
        let (plain, yp) = run_scanned(depthwise_clip_graph().0, false, mode, &xs);
        assert_eq!(fused, plain, "{mode:?}");
        // Warn reports what reaches the outputs (nothing here); Strict every Inf.
        if mode == DebugMode::Strict {
            assert!(fused.iter().any(|(n, _, _)| *n == conv), "{fused:?}");
        }
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
        // The window centred on the block: +inf, 6 after the Clip.
        assert_eq!(yf[2 * W + 2], 6.0);
        assert!(yf.iter().all(|v| v.is_finite()));
    }
}

/// Conv (1×1, bias) → Sigmoid → Mul on a 40×36 plane (1440 pixels: the SiLU runs per
/// output-channel row in the conv, `conv::POST_ROW_MIN`), run fused and unfused: the same
/// bits, within round-off of the f64 definition, and, with a +inf input pixel, the same
/// strict reports (the Conv for the Inf, the Mul for `-inf·σ(-inf)` NaN where a weight is
/// negative).
#[test]
fn fused_silu_on_a_large_plane_matches_unfused() {
    const C2: usize = 3;
    const M2: usize = 4;
    const H2: usize = 40;
    const W2: usize = 36;
    let w: Vec<f32> = (0..M2 * C2)
        .map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.3)
        .collect();
    let b: Vec<f32> = (0..M2).map(|i| i as f32 * 0.1 - 0.15).collect();
    let build = || {
        let mut g = Graph::new("convsilu_large");
        let x = g.input("x", s(&[1, C2, H2, W2]));
        let wn = g.constant(Tensor::from_f32(&[M2, C2, 1, 1], w.clone()).unwrap());
        let bn = g.constant(Tensor::from_f32(&[M2], b.clone()).unwrap());
        let attrs = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(0, 0), (0, 0)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let out = s(&[1, M2, H2, W2]);
        let conv = g.add_node(Op::Conv(attrs), vec![x, wn, bn], out.clone());
        g.set_name(conv, "big.conv");
        let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![conv], out.clone());
        let mul = g.mul(conv, sig, out);
        g.set_name(mul, "big.act");
        g.set_outputs(vec![mul]);
        (g, conv, mul)
    };
    let run = |fuse: bool, xs: &[f32]| {
        let mut ex = CpuExecutor::new(build().0).unwrap();
        assert_eq!(ex.fused_groups(), 1);
        ex.set_fusion(fuse);
        let x = Tensor::from_f32(&[1, C2, H2, W2], xs.to_vec()).unwrap();
        let (r, y) = common::run_scanned(&mut ex, &[x], DebugMode::Strict);
        let r: Vec<(NodeId, usize)> = r.iter().map(|r| (r.0, r.1)).collect();
        (r, y)
    };
    let xs: Vec<f32> = (0..C2 * H2 * W2)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07)
        .collect();
    let (_, yf) = run(true, &xs);
    let (_, yp) = run(false, &xs);
    assert_eq!(
        yf.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        yp.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let p = H2 * W2;
    for m in 0..M2 {
        for j in 0..p {
            let c: f64 = b[m] as f64
                + (0..C2)
                    .map(|ci| w[m * C2 + ci] as f64 * xs[ci * p + j] as f64)
                    .sum::<f64>();
            let want = c / (1.0 + (-c).exp());
            let got = yf[m * p + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }
    let mut xs = xs;
    xs[700] = f32::INFINITY;
    let (fused, yf) = run(true, &xs);
    let (plain, yp) = run(false, &xs);
    let (_, conv, mul) = build();
    assert_eq!(fused, plain);
    assert!(fused.iter().any(|(n, _)| *n == conv), "{fused:?}");
    assert!(fused.iter().any(|(n, _)| *n == mul), "{fused:?}");
    for (a, b) in yf.iter().zip(&yp) {
        assert_eq!(a.to_bits(), b.to_bits());
    }
}

/// A 1×1 Conv with bias → Sigmoid → Mul on planes of 40×40 (at least the 1024 elements from
/// which im2col's path runs the SiLU per output row, with the bias in the same pass:
/// `fastmath::silu_bias_inplace`). Returns (graph, conv, mul).
fn silu_bias_graph() -> (Graph, NodeId, NodeId) {
    const C: usize = 4;
    const M: usize = 8;
    let mut g = Graph::new("pwsilu");
    let x = g.input("x", s(&[1, C, 40, 40]));
    let w: Vec<f32> = (0..M * C)
        .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.2)
        .collect();
    let w = g.constant(Tensor::from_f32(&[M, C, 1, 1], w).unwrap());
    let b: Vec<f32> = (0..M).map(|i| i as f32 * 0.7 - 2.5).collect();
    let b = g.constant(Tensor::from_f32(&[M], b).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let out = s(&[1, M, 40, 40]);
    let conv = g.add_node(Op::Conv(attrs), vec![x, w, b], out.clone());
    g.set_name(conv, "expand.conv");
    let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![conv], out.clone());
    let mul = g.mul(conv, sig, out);
    g.set_name(mul, "expand.act.mul");
    g.set_outputs(vec![mul]);
    (g, conv, mul)
}

/// The fused 1×1 conv + bias + SiLU gives the unfused Conv, Sigmoid and Mul bit for bit
/// (with and without the NaN scan), and with an inf input its reports are the unfused ones
/// (the scan's largest |y| is taken in the bias+SiLU pass).
#[test]
fn fused_silu_with_bias_on_large_planes_is_the_unfused_bits() {
    let xs: Vec<f32> = (0..4 * 1600)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.09)
        .collect();
    let run = |fuse: bool, scan: bool, xs: &[f32]| {
        let mut ex = CpuExecutor::new(silu_bias_graph().0).unwrap();
        assert_eq!(ex.fused_groups(), 1);
        ex.set_fusion(fuse);
        let x = Tensor::from_f32(&[1, 4, 40, 40], xs.to_vec()).unwrap();
        if scan {
            common::run_scanned(&mut ex, &[x], DebugMode::Warn)
        } else {
            let y = ex.run(&[x], None).unwrap();
            (vec![], y[0].as_f32().unwrap().to_vec())
        }
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (_, plain) = run(false, false, &xs);
    for scan in [false, true] {
        let (r, fused) = run(true, scan, &xs);
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(bits(&fused), bits(&plain), "scan {scan}");
    }
    // The definition at a few points: y = conv + b, y·σ(y) in f64.
    for &(m, p) in &[(0usize, 0usize), (3, 777), (7, 1599)] {
        let mut y = m as f64 * 0.7 - 2.5;
        for c in 0..4 {
            let w = (((m * 4 + c) * 5 % 13) as f64 - 6.0) * 0.2;
            y += w * xs[c * 1600 + p] as f64;
        }
        let want = y / (1.0 + (-y).exp());
        let got = plain[m * 1600 + p] as f64;
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
        let got = run(true, false, &xs).1[m * 1600 + p] as f64;
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "fused {got} vs {want}"
        );
    }
    // +inf under one pixel: the conv is ±inf there and y·σ(y) NaN for -inf.
    let mut xs = xs;
    xs[1600 + 41] = f32::INFINITY;
    let (fused, yf) = run(true, true, &xs);
    let (plain, yp) = run(false, true, &xs);
    assert_eq!(fused, plain);
    let (_, conv, mul) = silu_bias_graph();
    assert!(fused.iter().any(|(n, _, _)| *n == conv), "{fused:?}");
    assert!(fused.iter().any(|(n, _, _)| *n == mul), "{fused:?}");
    for (a, b) in yf.iter().zip(&yp) {
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
    }
}

/// SiLU (`x · sigmoid(x)`) on x = [1, -inf, NaN, 3, ...]: the Mul makes a NaN at index 1
/// (`-inf · 0`) while both its operands carry the input's NaN at index 2. The CPU executor
/// gives the scanner the NaN positions, so the Mul is blamed at index 1 (by counts alone, 2
/// NaN against the operands' 1 + 1, it passed as a carrier), fused or not.
#[test]
fn silu_nan_beside_a_carried_nan_is_blamed_on_the_mul() {
    let s4 = s(&[1, 64]);
    let mut g = Graph::new("silu");
    let x = g.input("x", s4.clone());
    let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![x], s4.clone());
    let mul = g.mul(x, sig, s4);
    g.set_name(mul, "act.mul");
    g.set_outputs(vec![mul]);
    let mut xs: Vec<f32> = (0..64).map(|i| i as f32 * 0.1 - 3.0).collect();
    xs[1] = f32::NEG_INFINITY;
    xs[2] = f32::NAN;
    for fuse in [true, false] {
        let mut ex = CpuExecutor::new(g.clone()).unwrap();
        ex.set_fusion(fuse);
        let t = Tensor::from_f32(&[1, 64], xs.clone()).unwrap();
        let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
        sc.set_print(false);
        let y = ex.run(&[t], Some(&mut sc)).unwrap();
        let y = y[0].as_f32().unwrap();
        assert!(y[1].is_nan() && y[2].is_nan());
        let r: Vec<(NodeId, usize)> = sc.reports().iter().map(|r| (r.node, r.index)).collect();
        assert_eq!(
            r,
            vec![(x, 2), (mul, 1)],
            "fuse {fuse}: {:#?}",
            sc.reports()
        );
    }
}
