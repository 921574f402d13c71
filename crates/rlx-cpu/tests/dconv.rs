//! 2-D convs that the direct kernel takes (f32, one group, stride 1 or 2, kernels larger
//! than 1×1; `rlx_cpu::direct_conv_images` counts them) through the executor, against the
//! ONNX Conv definition computed here in f64 with the zero padding as terms of the sum (so
//! `inf · 0 = NaN` where an infinite weight meets the padding), at 1 and 3 threads, with the
//! fused activations a conv takes in registers (Relu, Clip) and after (SiLU); and a NaN
//! scan that names the conv that overflowed, as with fusion off.

mod common;

use common::{act, act_ref, bits, pool, rnd, scanned_fusion_on_off, sh, Act};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    c: usize,
    m: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    s: usize,
    /// (top, left, bottom, right)
    p: (usize, usize, usize, usize),
    bias: bool,
    act: Act,
}

impl Case {
    fn out_hw(&self) -> (usize, usize) {
        let o = |i: usize, k: usize, pb: usize, pe: usize| (i + pb + pe - k) / self.s + 1;
        (
            o(self.h, self.kh, self.p.0, self.p.2),
            o(self.w, self.kw, self.p.1, self.p.3),
        )
    }
}

/// x → Conv (+ bias) → act, the conv named "stem.conv".
fn graph(cs: &Case, w: &[f32], b: &[f32]) -> (Graph, NodeId) {
    let mut g = Graph::new("dconv");
    let x = g.input("x", sh(&[cs.n, cs.c, cs.h, cs.w]));
    let (oh, ow) = cs.out_hw();
    let out = sh(&[cs.n, cs.m, oh, ow]);
    let wt = g.constant(Tensor::from_f32(&[cs.m, cs.c, cs.kh, cs.kw], w.to_vec()).unwrap());
    let mut ins = vec![x, wt];
    if cs.bias {
        ins.push(g.constant(Tensor::from_f32(&[cs.m], b.to_vec()).unwrap()));
    }
    let a = ConvAttrs {
        strides: vec![cs.s, cs.s],
        pads: vec![(cs.p.0, cs.p.2), (cs.p.1, cs.p.3)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let conv = g.add_node(Op::Conv(a), ins, out.clone());
    g.set_name(conv, "stem.conv");
    let y = act(&mut g, conv, cs.act, &out);
    g.set_outputs(vec![y]);
    (g, conv)
}

/// The definition in f64, `[N, M, OH, OW]`; padding taps are `w · 0` terms.
fn reference(cs: &Case, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
    let (oh, ow) = cs.out_hw();
    let mut out = vec![0f64; cs.n * cs.m * oh * ow];
    for n in 0..cs.n {
        for m in 0..cs.m {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut v = if cs.bias { b[m] as f64 } else { 0.0 };
                    for c in 0..cs.c {
                        for ky in 0..cs.kh {
                            for kx in 0..cs.kw {
                                let iy = (oy * cs.s + ky) as isize - cs.p.0 as isize;
                                let ix = (ox * cs.s + kx) as isize - cs.p.1 as isize;
                                let inside = iy >= 0
                                    && ix >= 0
                                    && (iy as usize) < cs.h
                                    && (ix as usize) < cs.w;
                                let xv = if inside {
                                    x[((n * cs.c + c) * cs.h + iy as usize) * cs.w + ix as usize]
                                        as f64
                                } else {
                                    0.0
                                };
                                let wv = w[((m * cs.c + c) * cs.kh + ky) * cs.kw + kx] as f64;
                                v += wv * xv;
                            }
                        }
                    }
                    out[((n * cs.m + m) * oh + oy) * ow + ox] = act_ref(cs.act, v);
                }
            }
        }
    }
    out
}

fn cases() -> Vec<Case> {
    let base = Case {
        n: 1,
        c: 3,
        m: 32,
        h: 41,
        w: 38,
        kh: 3,
        kw: 3,
        s: 2,
        p: (1, 1, 1, 1),
        bias: true,
        act: Act::Relu6,
    };
    vec![
        // MobileNetV2's stem (3×3 stride 2, ReLU6 in registers), odd/even sizes.
        base,
        // ResNet's stem: 7×7 stride 2, pad 3, Relu; channels not a multiple of 8.
        Case {
            m: 21,
            h: 35,
            w: 50,
            kh: 7,
            kw: 7,
            p: (3, 3, 3, 3),
            act: Act::Relu,
            ..base
        },
        // SqueezeNet's expand 3×3 (stride 1), SiLU after the stores, two images, rows
        // long enough for several row blocks and the thread split.
        Case {
            n: 2,
            c: 16,
            m: 67,
            h: 29,
            w: 55,
            s: 1,
            act: Act::Silu,
            ..base
        },
        // Non-square kernel, one-sided pads, no bias, no activation.
        Case {
            c: 5,
            m: 9,
            h: 12,
            w: 50,
            kh: 3,
            kw: 5,
            s: 1,
            p: (0, 2, 1, 0),
            bias: false,
            act: Act::None,
            ..base
        },
        // EfficientNet-style TF padding at stride 2 (bottom/right only), 5×5.
        Case {
            c: 8,
            m: 40,
            h: 30,
            w: 31,
            kh: 5,
            kw: 5,
            p: (1, 1, 2, 2),
            act: Act::Relu,
            ..base
        },
    ]
}

fn run(ex: &mut CpuExecutor, cs: &Case, x: &[f32], threads: usize) -> Vec<f32> {
    let t = Tensor::from_f32(&[cs.n, cs.c, cs.h, cs.w], x.to_vec()).unwrap();
    let y = pool(threads).install(|| ex.run(&[t], None)).unwrap();
    y[0].as_f32().unwrap().to_vec()
}

fn avx512() -> bool {
    common::avx512_kernels(Some("RLX_CPU_DCONV"))
}

fn close(got: f32, want: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got as f64 == want;
    }
    (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs())
}

#[test]
fn direct_convs_match_the_definition() {
    if !avx512() {
        {
            use std::io::Write; // past the test harness's capture: the line shows in CI logs
            let _ = writeln!(
                std::io::stderr(),
                "direct_convs_match_the_definition: no AVX-512F here (or RLX_CPU_DCONV=0): the \
             direct-kernel check is skipped; the values are still checked on the generic path"
            );
        }
    }
    for (i, cs) in cases().iter().enumerate() {
        let w: Vec<f32> = rnd(cs.m * cs.c * cs.kh * cs.kw, 1 + i as u64);
        let b = rnd(cs.m, 20 + i as u64);
        let (g, _) = graph(cs, &w, &b);
        let mut ex = CpuExecutor::new(g).unwrap();
        let x: Vec<f32> = rnd(cs.n * cs.c * cs.h * cs.w, 7 + i as u64)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let want = reference(cs, &x, &w, &b);
        // Another run first: buffers from the executor's pool then hold other values, so
        // an output element the kernel leaves unwritten shows.
        let other: Vec<f32> = x.iter().map(|v| 2.0 - v).collect();
        for threads in [1, 3] {
            run(&mut ex, cs, &other, threads);
            let before = rlx_cpu::direct_conv_images();
            let y = run(&mut ex, cs, &x, threads);
            if avx512() {
                assert!(
                    rlx_cpu::direct_conv_images() >= before + cs.n as u64,
                    "case {i}: the conv did not take the direct kernel"
                );
            }
            assert_eq!(y.len(), want.len());
            for (j, (&got, &r)) in y.iter().zip(&want).enumerate() {
                assert!(
                    close(got, r),
                    "case {i} ({cs:?}), {threads} threads, element {j}: {got} vs {r}"
                );
            }
        }
    }
}

/// An infinite weight: every output whose window takes that tap from the zero padding is
/// `inf · 0 = NaN` by the definition, the others ±inf; as im2col gives.
#[test]
fn an_infinite_weight_times_the_padding_is_nan() {
    let cs = cases()[0];
    let mut w: Vec<f32> = rnd(cs.m * cs.c * cs.kh * cs.kw, 1);
    // Channel 3's tap (c = 1, ky = 0, kx = 0): it reads the padding in output row 0 and
    // column 0.
    w[(3 * cs.c + 1) * 9] = f32::INFINITY;
    let b = rnd(cs.m, 2);
    let x: Vec<f32> = rnd(cs.c * cs.h * cs.w, 3).iter().map(|v| v + 2.0).collect();
    let want = reference(
        &Case {
            act: Act::None,
            ..cs
        },
        &x,
        &w,
        &b,
    );
    assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_infinite()));
    let (g, _) = graph(
        &Case {
            act: Act::None,
            ..cs
        },
        &w,
        &b,
    );
    let mut ex = CpuExecutor::new(g).unwrap();
    let y = run(&mut ex, &cs, &x, 1);
    for (j, (&got, &r)) in y.iter().zip(&want).enumerate() {
        assert!(close(got, r), "element {j}: {got} vs {r}");
    }
}

/// 3e38 at one pixel of every input channel, positive weights: the conv's sums overflow to
/// +inf there, which the fused Clip turns into 6, so the group's output is finite. Strict
/// mode names the conv ("stem.conv") with fusion on, as with fusion off (the scan sees the
/// values before the Clip), and the outputs agree bit for bit.
#[test]
fn a_scanned_run_names_the_conv_as_with_fusion_off() {
    let cs = cases()[0];
    let w: Vec<f32> = rnd(cs.m * cs.c * 9, 1)
        .iter()
        .map(|v| v.abs() + 0.5)
        .collect();
    let b = rnd(cs.m, 2);
    let mut x = rnd(cs.c * cs.h * cs.w, 11);
    for c in 0..cs.c {
        x[c * cs.h * cs.w + 6 * cs.w + 9] = 3e38;
    }
    let t = Tensor::from_f32(&[1, cs.c, cs.h, cs.w], x).unwrap();
    let runs = scanned_fusion_on_off(|| graph(&cs, &w, &b), &[t], DebugMode::Strict);
    for (fuse, conv, r, _) in &runs {
        assert_eq!(r.first().map(|r| r.0), Some(*conv), "fusion {fuse}: {r:?}");
    }
    let out: Vec<_> = runs.iter().map(|(_, _, r, y)| (r, bits(y))).collect();
    assert_eq!(out[0], out[1]);
}
