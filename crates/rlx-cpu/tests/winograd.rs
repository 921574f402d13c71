//! The Winograd F(2×2, 3×3) conv path through the executor: values against the ONNX Conv
//! definition computed here in f64, and NaN/Inf values and scanner reports identical to
//! the im2col path (the Winograd transforms would turn an Inf into Inf − Inf = NaN; the
//! executor recomputes such a conv directly). Expected values are derived by hand from
//! IEEE 754: inf · w summed with finite terms is ±inf, inf + (−inf) is NaN.

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

const C: usize = 32; // input channels
const M: usize = 40; // output channels
const H: usize = 9;
const W: usize = 7;

fn s(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

/// Weights of both signs, none zero (so inf · w is never NaN).
fn weights() -> Vec<f32> {
    (0..M * C * 9)
        .map(|i| ((i * 7 % 11) as f32 - 5.5) * 0.05)
        .collect()
}

fn bias() -> Vec<f32> {
    (0..M).map(|i| i as f32 * 0.1 - 2.0).collect()
}

fn input() -> Vec<f32> {
    (0..C * H * W)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.125)
        .collect()
}

/// x [1, C, H, W] → Conv(3×3, pad 1, bias) → Relu when `relu` (a fused Relu-only group).
fn graph(relu: bool) -> (Graph, NodeId) {
    let mut g = Graph::new("wino");
    let x = g.input("x", s(&[1, C, H, W]));
    let w = g.constant(Tensor::from_f32(&[M, C, 3, 3], weights()).unwrap());
    let b = g.constant(Tensor::from_f32(&[M], bias()).unwrap());
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let conv = g.add_node(Op::Conv(attrs), vec![x, w, b], s(&[1, M, H, W]));
    g.set_name(conv, "layer1.conv");
    let mut out = conv;
    if relu {
        out = g.add_node(
            Op::Activation(Activation::Relu),
            vec![conv],
            s(&[1, M, H, W]),
        );
        g.set_name(out, "layer1.relu");
    }
    g.set_outputs(vec![out]);
    (g, conv)
}

/// The definition in f64 (ONNX Conv is a cross-correlation, zero outside the image), with
/// per element the sum of the magnitudes of its terms (for a rounding bound).
fn reference(x: &[f32]) -> Vec<(f64, f64)> {
    conv3x3_ref(x, &weights(), Some(&bias()), (C, M, H, W))
}

/// [`reference`] for any 3×3, pad 1, stride 1 conv: `x` `[c, h, w]`, `w` `[m, c, 3, 3]`,
/// `b` `[m]`; one (value, sum of |terms|) per output element, `[m, h, w]` order.
fn conv3x3_ref(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    (c, m, h, wd): (usize, usize, usize, usize),
) -> Vec<(f64, f64)> {
    let mut out = vec![];
    for o in 0..m {
        for oy in 0..h {
            for ox in 0..wd {
                let mut acc = b.map_or(0.0, |b| b[o] as f64);
                let mut mag = acc.abs();
                for ci in 0..c {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy + ky, ox + kx);
                            if iy < 1 || ix < 1 || iy > h || ix > wd {
                                continue;
                            }
                            let t = x[(ci * h + iy - 1) * wd + ix - 1] as f64
                                * w[((o * c + ci) * 3 + ky) * 3 + kx] as f64;
                            acc += t;
                            mag += t.abs();
                        }
                    }
                }
                out.push((acc, mag));
            }
        }
    }
    out
}

/// Run `g` with the Winograd path on or off (fusion on) and a scanner in `mode` when
/// given: the reports (node, element, label) and the output.
fn run(
    g: Graph,
    wino: bool,
    mode: Option<DebugMode>,
    xs: &[f32],
) -> (Vec<(NodeId, usize, String)>, Vec<f32>) {
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!(
        ex.winograd_convs(),
        1,
        "the 3x3 conv is prepared for Winograd"
    );
    ex.set_winograd(wino);
    let mut sc = mode.map(|m| {
        let mut sc = DebugScanner::new(m, "cpu");
        sc.set_print(false);
        sc
    });
    let y = ex
        .run(
            &[Tensor::from_f32(&[1, C, H, W], xs.to_vec()).unwrap()],
            sc.as_mut(),
        )
        .unwrap();
    let r = sc.map_or(vec![], |sc| {
        sc.reports()
            .iter()
            .map(|r| (r.node, r.index, r.label.clone()))
            .collect()
    });
    (r, y[0].as_f32().unwrap().to_vec())
}

#[test]
fn winograd_conv_matches_the_definition() {
    let xs = input();
    let want = reference(&xs);
    for relu in [false, true] {
        let (_, on) = run(graph(relu).0, true, None, &xs);
        let (_, off) = run(graph(relu).0, false, None, &xs);
        assert_ne!(on, off, "relu {relu}: the two paths round differently");
        for (i, ((a, b), &(r, mag))) in on.iter().zip(&off).zip(&want).enumerate() {
            let r = if relu { r.max(0.0) } else { r };
            // f32 round-off over C·9 terms: a few ulps of the terms' magnitude.
            let tol = 1e-6 * mag + 1e-6;
            assert!((*a as f64 - r).abs() <= tol, "winograd [{i}]: {a} vs {r}");
            assert!((*b as f64 - r).abs() <= tol, "im2col [{i}]: {b} vs {r}");
        }
    }
}

#[test]
fn inf_and_nan_from_a_winograd_conv_are_the_direct_conv_ones() {
    // (a) +inf alone: the conv carries ±inf (inf times weights of both signs plus finite
    //     terms; no window sees two infinities), where the transform alone would make NaN.
    // (b) +inf and -inf two columns apart: the windows between them sum inf + (-inf) = NaN,
    //     which the conv creates and the scanner names.
    let mut one = input();
    one[(3 * H + 4) * W + 3] = f32::INFINITY;
    let mut two = input();
    two[4 * W + 2] = f32::INFINITY;
    two[4 * W + 4] = f32::NEG_INFINITY;
    for (case, xs) in [("inf", one), ("inf and -inf", two)] {
        for relu in [false, true] {
            for mode in [DebugMode::Warn, DebugMode::Strict] {
                let (g, conv) = graph(relu);
                let (r_on, y_on) = run(g.clone(), true, Some(mode), &xs);
                let (r_off, y_off) = run(g, false, Some(mode), &xs);
                assert_eq!(r_on, r_off, "{case} relu {relu} {mode:?}");
                let on: Vec<u32> = y_on.iter().map(|v| v.to_bits()).collect();
                let off: Vec<u32> = y_off.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    on, off,
                    "{case} relu {relu} {mode:?}: bitwise the direct conv"
                );
                let nans = y_on.iter().filter(|v| v.is_nan()).count();
                let infs = y_on.iter().filter(|v| v.is_infinite()).count();
                if case == "inf" {
                    assert_eq!(nans, 0, "{case}: a lone inf is carried, not made NaN");
                    assert!(relu || infs > 0, "{case}: the conv output holds the inf");
                } else {
                    assert!(nans > 0, "{case}: inf + -inf is NaN");
                    assert!(
                        r_on.iter().any(|(n, _, _)| *n == conv),
                        "{case} {mode:?}: the conv is named: {r_on:?}"
                    );
                }
            }
        }
    }
}

/// The Winograd path is skipped for a plane of under 32 2×2 tiles whose transformed
/// weights exceed 1 MiB (`conv::winograd_pays`: in a model those weights come from memory
/// each run, and are used only a few times per run) and taken for the same weights on a
/// larger plane or for small weights on the small plane; it yields to RLX's product kernel
/// (where this CPU runs it: `conv::pack_form`) when tiles × input channels are under 2048
/// (`winograd::packed_first`). Every case matches the ONNX Conv definition computed here
/// in f64.
#[test]
fn winograd_is_skipped_on_small_planes_with_large_weights() {
    // (output channels, input channels, plane, Winograd expected, or None: Winograd where
    // the packed kernel does not take the conv on this CPU)
    let cases = [
        (128, 160, 7, Some(false)), // 16 tiles, 16·128·160·4 B = 1.25 MiB transformed
        (128, 160, 12, Some(true)), // 36 tiles (× 160 channels: 5760)
        (64, 192, 10, Some(true)),  // 25 tiles (× 192: 4800), 0.75 MiB
        (64, 64, 7, None),          // 16 tiles × 64 channels: 1024
        (256, 64, 13, Some(true)),  // SqueezeNet's expand 3×3 at 13²: 49 × 64 = 3136
        (192, 48, 13, Some(true)),  // and 49 × 48 = 2352
        (64, 40, 13, None),         // 49 × 40 = 1960
        (128, 32, 27, Some(true)),  // and at 27²: 196 × 32 = 6272
    ];
    for (m, c, hw, wino) in cases {
        let attrs = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(1, 1), (1, 1)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let wino = wino.unwrap_or_else(|| {
            let w = Tensor::from_f32(&[m, c, 3, 3], vec![0.0; m * c * 9]).unwrap();
            rlx_kernels::kernels::conv::pack_form(&w, &attrs, &s(&[1, m, hw, hw])).is_none()
        });
        let mut g = Graph::new("wino-plane");
        let x = g.input("x", s(&[1, c, hw, hw]));
        let wv: Vec<f32> = (0..m * c * 9)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01)
            .collect();
        let xv: Vec<f32> = (0..c * hw * hw)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let w = g.constant(Tensor::from_f32(&[m, c, 3, 3], wv.clone()).unwrap());
        let y = g.add_node(Op::Conv(attrs), vec![x, w], s(&[1, m, hw, hw]));
        g.set_outputs(vec![y]);
        let mut ex = CpuExecutor::new(g).unwrap();
        assert_eq!(
            ex.winograd_convs(),
            wino as usize,
            "{m}x{c} channels at {hw}x{hw}"
        );
        let out = ex
            .run(
                &[Tensor::from_f32(&[1, c, hw, hw], xv.clone()).unwrap()],
                None,
            )
            .unwrap();
        let got = out[0].as_f32().unwrap();
        let want = conv3x3_ref(&xv, &wv, None, (c, m, hw, hw));
        for (i, (&v, &(r, mag))) in got.iter().zip(&want).enumerate() {
            assert!(
                (v as f64 - r).abs() <= 1e-5 * mag + 1e-6,
                "{m}x{c} at {hw}: [{i}] {v} vs {r}"
            );
        }
    }
}

/// The Winograd conv by slabs of tile rows (`winograd::conv_slabs`: transformed weights of
/// at most 1 MiB; larger ones by output-channel parts with several threads, by whole steps
/// with one), on planes of several slabs with odd
/// sides (edge tiles cut), two images, at 1 and 3 threads: every output against the ONNX
/// Conv definition computed here in f64, and the Winograd path taken (its round-off
/// differs from im2col's).
#[test]
fn winograd_slabs_match_the_definition_at_every_thread_count() {
    // (images, output channels, input channels, height, width)
    let cases = [
        (1, 40, 32, 39, 37),   // 16·40·32·4 B = 80 KiB: slabs, several per image
        (2, 32, 32, 41, 9),    // two images, narrow plane
        (1, 136, 128, 15, 15), // 1.06 MiB: channel parts (48, 48, 40 at 3 threads)
    ];
    for (n, m, c, h, wd) in cases {
        let mut g = Graph::new("wino-slabs");
        let x = g.input("x", s(&[n, c, h, wd]));
        let wv: Vec<f32> = (0..m * c * 9)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01)
            .collect();
        let bv: Vec<f32> = (0..m).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
        let xv: Vec<f32> = (0..n * c * h * wd)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let w = g.constant(Tensor::from_f32(&[m, c, 3, 3], wv.clone()).unwrap());
        let b = g.constant(Tensor::from_f32(&[m], bv.clone()).unwrap());
        let attrs = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(1, 1), (1, 1)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let y = g.add_node(Op::Conv(attrs), vec![x, w, b], s(&[n, m, h, wd]));
        g.set_outputs(vec![y]);
        let want: Vec<(f64, f64)> = xv
            .chunks(c * h * wd)
            .flat_map(|xi| conv3x3_ref(xi, &wv, Some(&bv), (c, m, h, wd)))
            .collect();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut outs = vec![];
            for wino in [true, false] {
                let mut ex = CpuExecutor::new(g.clone()).unwrap();
                assert_eq!(ex.winograd_convs(), 1, "{m}x{c} at {h}x{wd}");
                ex.set_winograd(wino);
                let t = Tensor::from_f32(&[n, c, h, wd], xv.clone()).unwrap();
                let out = pool.install(|| ex.run(&[t], None)).unwrap();
                outs.push(out[0].as_f32().unwrap().to_vec());
            }
            let case = format!("{n}x{m}x{c} at {h}x{wd}, {threads} threads");
            assert_ne!(outs[0], outs[1], "{case}: the Winograd path was not taken");
            for (i, (&v, &(r, mag))) in outs[0].iter().zip(&want).enumerate() {
                assert!(
                    (v as f64 - r).abs() <= 1e-5 * mag + 1e-6,
                    "{case}: [{i}] {v} vs {r}"
                );
            }
        }
    }
}
