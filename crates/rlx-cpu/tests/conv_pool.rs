//! A MaxPool that alone reads a fused conv group (a stem: Conv → BatchNorm → Relu →
//! MaxPool 3×3/2) runs with the conv in bands of rows (`RLX_CPU_CONV_POOL`): against the
//! ONNX definition computed here in f64 (conv, affine, Relu, then the max over each window,
//! padding excluded), at 1 and 3 threads, with pool buffers holding other values; and with
//! a NaN scanner, the same reports as with fusion off (the group replays op by op).

mod common;

use common::{pool, rnd, scanned_fusion_on_off, sh};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

#[derive(Clone, Copy, Debug)]
struct Case {
    c: usize,
    m: usize,
    h: usize,
    w: usize,
    k: usize,
    /// Conv padding (both axes, both ends); stride 2.
    cp: usize,
    /// Pool padding (both axes, both ends); 3×3 stride 2.
    pp: usize,
    ceil: bool,
}

impl Case {
    fn conv_hw(&self) -> (usize, usize) {
        let o = |i: usize| (i + 2 * self.cp - self.k) / 2 + 1;
        (o(self.h), o(self.w))
    }
    fn pool_hw(&self) -> (usize, usize) {
        let (oh, ow) = self.conv_hw();
        let o = |i: usize| {
            let p = i + 2 * self.pp - 3;
            if self.ceil {
                let o = p.div_ceil(2) + 1;
                if (o - 1) * 2 >= i + self.pp {
                    o - 1
                } else {
                    o
                }
            } else {
                p / 2 + 1
            }
        };
        (o(oh), o(ow))
    }
}

/// Conv (weights `w`, bias `b`) → `Mul(a)` → `Add(o)` → Relu → MaxPool, the pool named
/// "stem.pool"; returns the graph and the conv.
fn graph(cs: &Case, w: &[f32], b: &[f32], a: &[f32], o: &[f32]) -> (Graph, NodeId) {
    let mut g = Graph::new("stem");
    let (oh, ow) = cs.conv_hw();
    let (ph, pw) = cs.pool_hw();
    let out = sh(&[1, cs.m, oh, ow]);
    let x = g.input("x", sh(&[1, cs.c, cs.h, cs.w]));
    let wt = g.constant(Tensor::from_f32(&[cs.m, cs.c, cs.k, cs.k], w.to_vec()).unwrap());
    let bt = g.constant(Tensor::from_f32(&[cs.m], b.to_vec()).unwrap());
    let attrs = ConvAttrs {
        strides: vec![2, 2],
        pads: vec![(cs.cp, cs.cp); 2],
        dilations: vec![1, 1],
        groups: 1,
    };
    let conv = g.add_node(Op::Conv(attrs), vec![x, wt, bt], out.clone());
    g.set_name(conv, "stem.conv");
    let at = g.constant(Tensor::from_f32(&[1, cs.m, 1, 1], a.to_vec()).unwrap());
    let ot = g.constant(Tensor::from_f32(&[1, cs.m, 1, 1], o.to_vec()).unwrap());
    let y = g.mul(conv, at, out.clone());
    let y = g.add_node(Op::Binary(BinaryOp::Add), vec![y, ot], out.clone());
    let r = g.add_node(Op::Activation(Activation::Relu), vec![y], out);
    let pa = PoolAttrs {
        kind: PoolKind::Max,
        kernel: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![(cs.pp, cs.pp); 2],
        dilations: vec![1, 1],
        ceil_mode: cs.ceil,
    };
    let p = g.add_node(Op::Pool(pa), vec![r], sh(&[1, cs.m, ph, pw]));
    g.set_name(p, "stem.pool");
    g.set_outputs(vec![p]);
    (g, conv)
}

/// The definition in f64, `[1, M, PH, PW]`.
fn reference(cs: &Case, x: &[f32], w: &[f32], b: &[f32], a: &[f32], o: &[f32]) -> Vec<f64> {
    let (oh, ow) = cs.conv_hw();
    let (ph, pw) = cs.pool_hw();
    let mut y = vec![0f64; cs.m * oh * ow];
    for m in 0..cs.m {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut v = b[m] as f64;
                for c in 0..cs.c {
                    for ky in 0..cs.k {
                        for kx in 0..cs.k {
                            let iy = (oy * 2 + ky) as isize - cs.cp as isize;
                            let ix = (ox * 2 + kx) as isize - cs.cp as isize;
                            if iy < 0 || ix < 0 || iy as usize >= cs.h || ix as usize >= cs.w {
                                continue;
                            }
                            let xv = x[(c * cs.h + iy as usize) * cs.w + ix as usize] as f64;
                            v += w[((m * cs.c + c) * cs.k + ky) * cs.k + kx] as f64 * xv;
                        }
                    }
                }
                y[(m * oh + oy) * ow + ox] = (v * a[m] as f64 + o[m] as f64).max(0.0);
            }
        }
    }
    let mut out = vec![f64::NEG_INFINITY; cs.m * ph * pw];
    for m in 0..cs.m {
        for py in 0..ph {
            for px in 0..pw {
                let acc = &mut out[(m * ph + py) * pw + px];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let iy = (py * 2 + ky) as isize - cs.pp as isize;
                        let ix = (px * 2 + kx) as isize - cs.pp as isize;
                        if iy >= 0 && ix >= 0 && (iy as usize) < oh && (ix as usize) < ow {
                            *acc = acc.max(y[(m * oh + iy as usize) * ow + ix as usize]);
                        }
                    }
                }
            }
        }
    }
    out
}

fn params(cs: &Case, i: u64) -> [Vec<f32>; 4] {
    let w = rnd(cs.m * cs.c * cs.k * cs.k, 1 + i);
    let b = rnd(cs.m, 20 + i);
    let a: Vec<f32> = rnd(cs.m, 30 + i).iter().map(|v| v + 1.5).collect();
    let o = rnd(cs.m, 40 + i);
    [w, b, a, o]
}

/// Conv outputs of 64 channels × 112 columns (28 KB a row), so that the pool's rows are
/// cut into several bands.
fn cases() -> Vec<Case> {
    vec![
        // SqueezeNet's stem: 3×3/2, no padding; MaxPool 3×3/2 with ceil_mode.
        Case {
            c: 3,
            m: 64,
            h: 190,
            w: 225,
            k: 3,
            cp: 0,
            pp: 0,
            ceil: true,
        },
        // ResNet's: 7×7/2 pad 3; MaxPool 3×3/2 pad 1.
        Case {
            c: 3,
            m: 64,
            h: 150,
            w: 224,
            k: 7,
            cp: 3,
            pp: 1,
            ceil: false,
        },
    ]
}

#[test]
fn a_stem_with_its_max_pool_matches_the_definition() {
    let pool_on =
        !rlx_ir::env::is_off("RLX_CPU_CONV_POOL") && !rlx_ir::env::is_off("RLX_CPU_FUSION");
    for (i, cs) in cases().iter().enumerate() {
        let [w, b, a, o] = params(cs, i as u64);
        let (g, _) = graph(cs, &w, &b, &a, &o);
        let mut ex = CpuExecutor::new(g).unwrap();
        assert_eq!(ex.fused_pools(), usize::from(pool_on), "case {i}");
        let x = rnd(cs.c * cs.h * cs.w, 7 + i as u64);
        let want = reference(cs, &x, &w, &b, &a, &o);
        let xt = |v: &[f32]| vec![Tensor::from_f32(&[1, cs.c, cs.h, cs.w], v.to_vec()).unwrap()];
        let other: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
        for threads in [1, 3] {
            for fuse in [true, false] {
                ex.set_fusion(fuse);
                pool(threads).install(|| ex.run(&xt(&other), None)).unwrap();
                let y = pool(threads).install(|| ex.run(&xt(&x), None)).unwrap();
                let got = y[0].as_f32().unwrap();
                assert_eq!(got.len(), want.len());
                for (j, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()),
                        "case {i} ({cs:?}), {threads} threads, fusion {fuse}, element {j}: {g} vs {r}"
                    );
                }
            }
        }
    }
}

/// One input value is NaN: with a scanner, the fused group (whose band values are scanned)
/// sees a non-finite value and replays op by op, so the reports and the NaN positions of
/// the output are those of fusion off.
#[test]
fn a_scanned_run_reports_as_with_fusion_off() {
    let cs = cases()[0];
    let [w, b, a, o] = params(&cs, 0);
    let mut x = rnd(cs.c * cs.h * cs.w, 3);
    x[(cs.h / 2) * cs.w + 50] = f32::NAN;
    let ins = vec![Tensor::from_f32(&[1, cs.c, cs.h, cs.w], x).unwrap()];
    for mode in [DebugMode::Strict, DebugMode::Warn] {
        let runs = scanned_fusion_on_off(|| graph(&cs, &w, &b, &a, &o), &ins, mode);
        let (on, off) = (&runs[0], &runs[1]);
        assert!(!off.2.is_empty(), "{mode:?}: no report with fusion off");
        assert_eq!(on.2, off.2, "{mode:?}: reports differ with fusion on");
        let nan_at = |y: &[f32]| y.iter().map(|v| v.is_nan()).collect::<Vec<_>>();
        assert_eq!(nan_at(&on.3), nan_at(&off.3), "{mode:?}");
        assert!(on.3.iter().any(|v| v.is_nan()));
    }
}
