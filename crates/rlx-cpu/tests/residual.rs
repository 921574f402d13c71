//! A residual `Add` (and its `Relu`) after a fused conv group runs in the conv's epilogue
//! (`fuse::Residual`): against the ONNX definition computed here in f64, with the shortcut's
//! buffer taken for the output (it dies at the Add) or read (a graph input, a value read
//! again later, the conv's own input), through gemm (1×1, strided 1×1), the direct kernel
//! (3×3 with few channels) and Winograd (3×3 with 32+ channels, where the Add stays a
//! node), at 1 and 3 threads; and a NaN scan that names the Add as with fusion off.

mod common;

use common::{pool, rnd, scanned_fusion_on_off, sh};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

/// Where the shortcut comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Skip {
    /// `Relu(s0)`, read only by the Add: its buffer can become the conv's output.
    Owned,
    /// The graph input `s0` itself (borrowed).
    Input,
    /// `Relu(s0)`, also a graph output: read, not taken.
    AlsoOutput,
    /// The conv's own input `Relu(x)` (`y = conv(x) + x`).
    ConvInput,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    c: usize,
    m: usize,
    h: usize,
    w: usize,
    k: usize,
    s: usize,
    /// A per-channel affine after the conv (a decomposed BatchNormalization).
    bn: bool,
    relu: bool,
    /// `Add(skip, y)` instead of `Add(y, skip)`.
    swap: bool,
    skip: Skip,
}

impl Case {
    fn out_hw(&self) -> (usize, usize) {
        let p = self.k / 2;
        (
            (self.h + 2 * p - self.k) / self.s + 1,
            (self.w + 2 * p - self.k) / self.s + 1,
        )
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        c: 24,
        m: 40,
        h: 21,
        w: 19,
        k: 1,
        s: 1,
        bn: true,
        relu: true,
        swap: false,
        skip: Skip::Owned,
    };
    vec![
        // ResNet's bottleneck end: 1×1, BatchNorm, Add, Relu (gemm accumulates onto it).
        base,
        Case {
            swap: true,
            bn: false,
            ..base
        },
        // MobileNetV2's projection: no Relu after the Add.
        Case {
            relu: false,
            ..base
        },
        Case {
            skip: Skip::Input,
            ..base
        },
        Case {
            skip: Skip::AlsoOutput,
            ..base
        },
        Case {
            c: 40,
            skip: Skip::ConvInput,
            ..base
        },
        // Large enough for several row blocks and the thread split.
        Case {
            c: 64,
            m: 96,
            h: 56,
            w: 57,
            ..base
        },
        // A strided 1×1 (gathered, then gemm).
        Case {
            s: 2,
            h: 23,
            w: 30,
            ..base
        },
        // 3×3 with few channels: the direct kernel reads the shortcut.
        Case {
            c: 8,
            m: 16,
            k: 3,
            ..base
        },
        Case {
            c: 8,
            m: 16,
            k: 3,
            s: 2,
            h: 30,
            w: 33,
            skip: Skip::Input,
            ..base
        },
        // 3×3 with 32+ channels: Winograd, the Add apart.
        Case {
            c: 32,
            m: 32,
            k: 3,
            ..base
        },
    ]
}

/// The Add named "block.add", its Relu "block.relu"; returns the graph and the Add.
fn graph(cs: &Case, w: &[f32], b: &[f32], a: &[f32], o: &[f32]) -> (Graph, NodeId) {
    let mut g = Graph::new("residual");
    let (oh, ow) = cs.out_hw();
    let xs = sh(&[1, cs.c, cs.h, cs.w]);
    let out = sh(&[1, cs.m, oh, ow]);
    let x0 = g.input("x", xs.clone());
    let x = if cs.skip == Skip::ConvInput {
        g.add_node(Op::Activation(Activation::Relu), vec![x0], xs)
    } else {
        x0
    };
    let skip = match cs.skip {
        Skip::ConvInput => x,
        Skip::Input => g.input("s0", out.clone()),
        Skip::Owned | Skip::AlsoOutput => {
            let s0 = g.input("s0", out.clone());
            g.add_node(Op::Activation(Activation::Relu), vec![s0], out.clone())
        }
    };
    let wt = g.constant(Tensor::from_f32(&[cs.m, cs.c, cs.k, cs.k], w.to_vec()).unwrap());
    let bt = g.constant(Tensor::from_f32(&[cs.m], b.to_vec()).unwrap());
    let p = cs.k / 2;
    let attrs = ConvAttrs {
        strides: vec![cs.s, cs.s],
        pads: vec![(p, p), (p, p)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let mut y = g.add_node(Op::Conv(attrs), vec![x, wt, bt], out.clone());
    if cs.bn {
        let at = g.constant(Tensor::from_f32(&[1, cs.m, 1, 1], a.to_vec()).unwrap());
        let ot = g.constant(Tensor::from_f32(&[1, cs.m, 1, 1], o.to_vec()).unwrap());
        y = g.mul(y, at, out.clone());
        y = g.add_node(Op::Binary(BinaryOp::Add), vec![y, ot], out.clone());
    }
    let ins = if cs.swap {
        vec![skip, y]
    } else {
        vec![y, skip]
    };
    let add = g.add_node(Op::Binary(BinaryOp::Add), ins, out.clone());
    g.set_name(add, "block.add");
    let mut r = add;
    if cs.relu {
        r = g.add_node(Op::Activation(Activation::Relu), vec![add], out);
        g.set_name(r, "block.relu");
    }
    let mut outs = vec![r];
    if cs.skip == Skip::AlsoOutput {
        outs.push(skip);
    }
    g.set_outputs(outs);
    (g, add)
}

/// The definition in f64: `relu(a·(conv(x) + b) + o + skip)`, `[1, M, OH, OW]`.
#[allow(clippy::too_many_arguments)]
fn reference(
    cs: &Case,
    x: &[f32],
    s0: &[f32],
    w: &[f32],
    b: &[f32],
    a: &[f32],
    o: &[f32],
) -> Vec<f64> {
    let (oh, ow) = cs.out_hw();
    let p = cs.k / 2;
    let xr = |v: f32| if cs.skip == Skip::ConvInput { v.max(0.0) } else { v } as f64;
    let mut out = vec![0f64; cs.m * oh * ow];
    for m in 0..cs.m {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut v = b[m] as f64;
                for c in 0..cs.c {
                    for ky in 0..cs.k {
                        for kx in 0..cs.k {
                            let iy = (oy * cs.s + ky) as isize - p as isize;
                            let ix = (ox * cs.s + kx) as isize - p as isize;
                            if iy < 0 || ix < 0 || iy as usize >= cs.h || ix as usize >= cs.w {
                                continue;
                            }
                            let xv = xr(x[(c * cs.h + iy as usize) * cs.w + ix as usize]);
                            v += w[((m * cs.c + c) * cs.k + ky) * cs.k + kx] as f64 * xv;
                        }
                    }
                }
                if cs.bn {
                    v = v * a[m] as f64 + o[m] as f64;
                }
                let i = (m * oh + oy) * ow + ox;
                v += match cs.skip {
                    Skip::ConvInput => xr(x[i]),
                    Skip::Input => s0[i] as f64,
                    Skip::Owned | Skip::AlsoOutput => s0[i].max(0.0) as f64,
                };
                out[i] = if cs.relu { v.max(0.0) } else { v };
            }
        }
    }
    out
}

fn inputs(cs: &Case, x: &[f32], s0: &[f32]) -> Vec<Tensor> {
    let (oh, ow) = cs.out_hw();
    let mut v = vec![Tensor::from_f32(&[1, cs.c, cs.h, cs.w], x.to_vec()).unwrap()];
    if cs.skip != Skip::ConvInput {
        v.push(Tensor::from_f32(&[1, cs.m, oh, ow], s0.to_vec()).unwrap());
    }
    v
}

fn params(cs: &Case, i: u64) -> [Vec<f32>; 4] {
    let w = rnd(cs.m * cs.c * cs.k * cs.k, 1 + i);
    let b = rnd(cs.m, 20 + i);
    let a: Vec<f32> = rnd(cs.m, 30 + i).iter().map(|v| v + 1.5).collect();
    let o = rnd(cs.m, 40 + i);
    [w, b, a, o]
}

#[test]
fn residual_adds_match_the_definition() {
    let residual_on = !rlx_ir::env::is_off("RLX_CPU_RESIDUAL");
    for (i, cs) in cases().iter().enumerate() {
        let [w, b, a, o] = params(cs, i as u64);
        let (g, _) = graph(cs, &w, &b, &a, &o);
        let mut ex = CpuExecutor::new(g).unwrap();
        if residual_on && !rlx_ir::env::is_off("RLX_CPU_FUSION") {
            assert_eq!(ex.fused_residuals(), 1, "case {i}: the Add was not fused");
        }
        let (oh, ow) = cs.out_hw();
        let x: Vec<f32> = rnd(cs.c * cs.h * cs.w, 7 + i as u64);
        let s0: Vec<f32> = rnd(cs.m * oh * ow, 9 + i as u64)
            .iter()
            .map(|v| v * 2.0)
            .collect();
        let want = reference(cs, &x, &s0, &w, &b, &a, &o);
        // Another run first: pool buffers then hold other values.
        let other: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
        for threads in [1, 3] {
            pool(threads)
                .install(|| ex.run(&inputs(cs, &other, &s0), None))
                .unwrap();
            let y = pool(threads)
                .install(|| ex.run(&inputs(cs, &x, &s0), None))
                .unwrap();
            let got = y[0].as_f32().unwrap();
            assert_eq!(got.len(), want.len());
            for (j, (&g, &r)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()),
                    "case {i} ({cs:?}), {threads} threads, element {j}: {g} vs {r}"
                );
            }
            if cs.skip == Skip::AlsoOutput {
                // The shortcut, read by the conv, is still intact.
                let s = y[1].as_f32().unwrap();
                assert!(
                    s.iter().zip(&s0).all(|(&s, &r)| s == r.max(0.0)),
                    "case {i}"
                );
            }
        }
    }
}

/// The conv's output and the shortcut are both 3e38 at one place: their Add overflows to
/// +inf there (the Relu keeps it). Strict mode names the Add ("block.add") with fusion on,
/// as with fusion off: while scanning, the Add runs as a node.
#[test]
fn a_scanned_run_names_the_add_as_with_fusion_off() {
    let cs = Case {
        bn: false,
        ..cases()[0]
    };
    let (oh, ow) = cs.out_hw();
    let w = vec![0.0f32; cs.m * cs.c];
    let mut b = vec![0.5f32; cs.m];
    b[3] = 3e38;
    let x = rnd(cs.c * cs.h * cs.w, 5);
    let mut s0 = vec![1.0f32; cs.m * oh * ow];
    s0[3 * oh * ow + 17] = 3e38;
    let ins = inputs(&cs, &x, &s0);
    let runs = scanned_fusion_on_off(
        || graph(&cs, &w, &b, &[1.0; 0], &[0.0; 0]),
        &ins,
        DebugMode::Strict,
    );
    for (fuse, add, reports, y) in &runs {
        assert_eq!(reports.len(), 1, "fusion {fuse}: {reports:?}");
        assert_eq!(reports[0].0, *add, "fusion {fuse}: {reports:?}");
        assert_eq!(reports[0].2, "block.add");
        assert_eq!(y[3 * oh * ow + 17], f32::INFINITY);
    }
    // Unscanned, the fused Add gives the same values.
    let (g, _) = graph(&cs, &w, &b, &[], &[]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let y = ex.run(&ins, None).unwrap();
    assert_eq!(y[0].as_f32().unwrap(), &runs[1].3[..]);
}

/// A bias of -1e38, inputs 2e38, a shortcut of 2e38 that the conv may take: the unfused
/// order gives `(2e38 - 1e38) + 2e38 = 3e38`; summing the shortcut before the bias would
/// overflow to +inf. A bias this large goes first (as onnxruntime's unfused ops give it).
#[test]
fn a_huge_bias_is_added_before_the_residual() {
    let cs = Case {
        c: 1,
        m: 1,
        bn: false,
        ..cases()[0]
    };
    let (oh, ow) = cs.out_hw();
    let (g, _) = graph(&cs, &[1.0], &[-1e38], &[], &[]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let x = vec![2e38f32; cs.h * cs.w];
    let s0 = vec![2e38f32; oh * ow];
    let y = ex.run(&inputs(&cs, &x, &s0), None).unwrap();
    let y = y[0].as_f32().unwrap();
    assert!(y.iter().all(|&v| v == 3e38), "{:?}", &y[..4]);
}
