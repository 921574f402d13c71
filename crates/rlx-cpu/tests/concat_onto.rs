//! A Concat whose first input dies at it extends that input's buffer (`shape::concat_onto`,
//! the executor asking the pool for room: `Plan::reserve`): SqueezeNet's fire module
//! (squeeze 1×1 → expand 1×1 and expand 3×3 → channel Concat) against the ONNX definition
//! computed here in f64, fusion on and off, 1 and 3 threads; the layouts where the first
//! input is not taken (a graph input, a value also read later, batch 2) give the same
//! values; a NaN in the input gives the same reports and output either way.

mod common;

use common::{pool, rnd, scanned_fusion_on_off, sh};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

const C: usize = 8;
const S: usize = 4;
const E1: usize = 6;
const E3: usize = 5;
const H: usize = 9;

/// Conv (square kernel `k`, stride 1, padding `p`) with bias, then Relu, in f64:
/// `y[m, i, j] = max(0, b[m] + Σ_{c, u, v} w[m, c, u, v] · x[c, i + u − p, j + v − p])`.
fn conv_relu(x: &[f64], c: usize, w: &[f32], b: &[f32], m: usize, k: usize, p: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * H * H];
    for o in 0..m {
        for i in 0..H {
            for j in 0..H {
                let mut s = b[o] as f64;
                for ci in 0..c {
                    for u in 0..k {
                        for v in 0..k {
                            let (yi, xj) =
                                ((i + u) as isize - p as isize, (j + v) as isize - p as isize);
                            if yi >= 0 && xj >= 0 && (yi as usize) < H && (xj as usize) < H {
                                s += w[((o * c + ci) * k + u) * k + v] as f64
                                    * x[(ci * H + yi as usize) * H + xj as usize];
                            }
                        }
                    }
                }
                y[(o * H + i) * H + j] = s.max(0.0);
            }
        }
    }
    y
}

struct Fire {
    w: [Vec<f32>; 3],
    b: [Vec<f32>; 3],
}

impl Fire {
    fn new() -> Fire {
        Fire {
            w: [rnd(S * C, 1), rnd(E1 * S, 2), rnd(E3 * S * 9, 3)],
            b: [rnd(S, 4), rnd(E1, 5), rnd(E3, 6)],
        }
    }

    /// The fire module on batch `n`; `also_out`: the expand 1×1 value is a graph output
    /// too (so the Concat may not take it). Returns the graph and the squeeze conv.
    fn graph(&self, n: usize, also_out: bool) -> (Graph, NodeId) {
        let mut g = Graph::new("fire");
        let x = g.input("x", sh(&[n, C, H, H]));
        let conv = |g: &mut Graph, x: NodeId, i: usize, m: usize, c: usize, k: usize| {
            let w = g.constant(Tensor::from_f32(&[m, c, k, k], self.w[i].clone()).unwrap());
            let b = g.constant(Tensor::from_f32(&[m], self.b[i].clone()).unwrap());
            let p = k / 2;
            let a = ConvAttrs {
                strides: vec![1, 1],
                pads: vec![(p, p); 2],
                dilations: vec![1, 1],
                groups: 1,
            };
            let y = g.add_node(Op::Conv(a), vec![x, w, b], sh(&[n, m, H, H]));
            g.add_node(Op::Activation(Activation::Relu), vec![y], sh(&[n, m, H, H]))
        };
        let sq = conv(&mut g, x, 0, S, C, 1);
        let sq_conv = g.node(sq).inputs[0];
        let e1 = conv(&mut g, sq, 1, E1, S, 1);
        let e3 = conv(&mut g, sq, 2, E3, S, 3);
        let cat = g.add_node(
            Op::Concat { axis: 1 },
            vec![e1, e3],
            sh(&[n, E1 + E3, H, H]),
        );
        g.outputs = if also_out { vec![cat, e1] } else { vec![cat] };
        (g, sq_conv)
    }

    /// The Concat's output in f64 for `x` (`[n, C, H, H]`).
    fn reference(&self, x: &[f32], n: usize) -> Vec<f64> {
        let mut out = vec![];
        for xi in x.chunks(C * H * H).take(n) {
            let xi: Vec<f64> = xi.iter().map(|&v| v as f64).collect();
            let sq = conv_relu(&xi, C, &self.w[0], &self.b[0], S, 1, 0);
            out.extend(conv_relu(&sq, S, &self.w[1], &self.b[1], E1, 1, 0));
            out.extend(conv_relu(&sq, S, &self.w[2], &self.b[2], E3, 3, 1));
        }
        out
    }
}

fn close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}: element {i}: {g} against {w}"
        );
    }
}

#[test]
fn fire_concat_matches_the_definition_taken_or_not() {
    let f = Fire::new();
    for threads in [1, 3] {
        for (n, also_out) in [(1, false), (1, true), (2, false)] {
            let x = rnd(n * C * H * H, 7 + n as u64);
            let xt = Tensor::from_f32(&[n, C, H, H], x.clone()).unwrap();
            let want = f.reference(&x, n);
            let mut outs = vec![];
            for fuse in [true, false] {
                let (g, _) = f.graph(n, also_out);
                let mut ex = CpuExecutor::new(g).unwrap();
                ex.set_fusion(fuse);
                let what = format!(
                    "batch {n}, also an output {also_out}, fusion {fuse}, {threads} threads"
                );
                for run in 0..3 {
                    // Runs after the first reuse pooled buffers that hold other values.
                    let (y, onto) = pool(threads).install(|| {
                        let (b0, b1) = rlx_kernels::kernels::shape::concats_onto();
                        let y = ex.run(std::slice::from_ref(&xt), None).unwrap();
                        let (a0, a1) = rlx_kernels::kernels::shape::concats_onto();
                        (y, (a0 - b0, a1 - b1))
                    });
                    close(y[0].as_f32().unwrap(), &want, &format!("{what}, run {run}"));
                    // Taken at batch 1 when it dies there; with fusion, the group that
                    // makes it got a buffer with room for the Concat.
                    let taken = u64::from(n == 1 && !also_out);
                    assert_eq!(onto.0, taken, "{what}: Concat in place");
                    if fuse {
                        assert_eq!(onto.1, taken, "{what}: no room for the Concat");
                    }
                    outs.push(common::bits(y[0].as_f32().unwrap()));
                }
            }
            assert!(
                outs.windows(2).all(|w| w[0] == w[1]),
                "bits differ between runs or fusion on/off"
            );
        }
    }
}

#[test]
fn nan_before_a_concat_in_place_is_reported_as_with_fusion_off() {
    let f = Fire::new();
    let mut x = rnd(C * H * H, 9);
    x[40] = f32::NAN;
    let xt = Tensor::from_f32(&[1, C, H, H], x).unwrap();
    let runs = scanned_fusion_on_off(|| f.graph(1, false), &[xt], DebugMode::Warn);
    let (_, _, first, y1) = &runs[0];
    assert_eq!(
        first.first().map(|r| r.0),
        Some(NodeId(0)),
        "the input is reported first"
    );
    assert!(
        y1.iter().any(|v| v.is_nan()),
        "the NaN reaches the Concat's output"
    );
    for (fuse, _, r, y) in &runs[1..] {
        assert_eq!(r, first, "reports with fusion {fuse}");
        assert_eq!(common::bits(y), common::bits(y1));
    }
}
