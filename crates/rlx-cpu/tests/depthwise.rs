//! Depthwise 2-D Conv (group = C = M) through `eval_op` against the ONNX Conv definition
//! written here as plain loops in f64: kernels 3×3/5×5/7×7 (and 4×4, which takes the generic
//! path), strides 1/2/3, dilations 1/2, asymmetric pads, odd and tiny planes, bias or not,
//! batch 2, and NaN/Inf in inputs and weights.

mod common;

use common::rnd;
use rlx_cpu::eval_op;
use rlx_ir::*;

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: (usize, usize),
    s: (usize, usize),
    d: (usize, usize),
    /// (top, left, bottom, right)
    p: (usize, usize, usize, usize),
    bias: bool,
}

fn out_hw(cs: &Case) -> (usize, usize) {
    let o = |i: usize, pb: usize, pe: usize, k: usize, d: usize, s: usize| {
        (i + pb + pe - d * (k - 1) - 1) / s + 1
    };
    (
        o(cs.h, cs.p.0, cs.p.2, cs.k.0, cs.d.0, cs.s.0),
        o(cs.w, cs.p.1, cs.p.3, cs.k.1, cs.d.1, cs.s.1),
    )
}

/// out[n, c, oy, ox] = b[c] + Σ_{ky, kx} w[c, 0, ky, kx] · x[n, c, oy·sh + ky·dh − pt,
/// ox·sw + kx·dw − pl], with x = 0 outside the image (ONNX's zero padding: a tap there adds
/// `w · 0`, which is NaN for an infinite or NaN weight, as onnxruntime and the ONNX
/// reference evaluator's im2col give it). Also returns Σ |w·x| per output, the scale of the
/// rounding error.
fn naive(cs: &Case, x: &[f32], w: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (oh, ow) = out_hw(cs);
    let (kh, kw) = cs.k;
    let (mut out, mut mag) = (vec![], vec![]);
    for ni in 0..cs.n {
        for c in 0..cs.c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = if cs.bias { b[c] as f64 } else { 0.0 };
                    let mut m = acc.abs();
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (oy * cs.s.0 + ky * cs.d.0) as isize - cs.p.0 as isize;
                            let ix = (ox * cs.s.1 + kx * cs.d.1) as isize - cs.p.1 as isize;
                            let wv = w[(c * kh + ky) * kw + kx];
                            if iy < 0 || ix < 0 || iy >= cs.h as isize || ix >= cs.w as isize {
                                acc += wv as f64 * 0.0;
                                continue;
                            }
                            let xv = x[((ni * cs.c + c) * cs.h + iy as usize) * cs.w + ix as usize];
                            acc += xv as f64 * wv as f64;
                            m += (xv as f64 * wv as f64).abs();
                        }
                    }
                    out.push(acc);
                    mag.push(m);
                }
            }
        }
    }
    (out, mag)
}

fn run(cs: &Case, x: Vec<f32>, w: Vec<f32>, b: Vec<f32>) -> Vec<f32> {
    let (oh, ow) = out_hw(cs);
    let xt = Tensor::from_f32(&[cs.n, cs.c, cs.h, cs.w], x).unwrap();
    let wt = Tensor::from_f32(&[cs.c, 1, cs.k.0, cs.k.1], w).unwrap();
    let bt = Tensor::from_f32(&[cs.c], b).unwrap();
    let a = ConvAttrs {
        strides: vec![cs.s.0, cs.s.1],
        pads: vec![(cs.p.0, cs.p.2), (cs.p.1, cs.p.3)],
        dilations: vec![cs.d.0, cs.d.1],
        groups: cs.c,
    };
    let mut ins = vec![&xt, &wt];
    if cs.bias {
        ins.push(&bt);
    }
    let y = eval_op(
        &Op::Conv(a),
        &ins,
        &Shape::new(&[cs.n, cs.c, oh, ow], DType::F32),
    )
    .unwrap();
    y.as_f32().unwrap().to_vec()
}

/// Same value class as the reference: NaN where it is NaN, the same infinity, else within
/// f32 rounding of a sum of that magnitude.
fn check(cs: &Case, x: Vec<f32>, w: Vec<f32>, b: Vec<f32>) {
    let (want, mag) = naive(cs, &x, &w, &b);
    let got = run(cs, x, w, b);
    assert_eq!(got.len(), want.len(), "{cs:?}");
    for (i, (&g, (&r, &m))) in got.iter().zip(want.iter().zip(&mag)).enumerate() {
        let r32 = r as f32;
        if r.is_nan() {
            assert!(g.is_nan(), "{cs:?} at {i}: {g}, want NaN");
        } else if r.is_infinite() || r32.is_infinite() {
            assert_eq!(g, r32, "{cs:?} at {i}");
        } else {
            let tol = 1e-6 * (1.0 + m);
            assert!(
                (g as f64 - r).abs() <= tol,
                "{cs:?} at {i}: {g} vs {r} (tol {tol})"
            );
        }
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![];
    let base = Case {
        n: 1,
        c: 3,
        h: 9,
        w: 9,
        k: (3, 3),
        s: (1, 1),
        d: (1, 1),
        p: (1, 1, 1, 1),
        bias: true,
    };
    // MobileNet/EfficientNet-like: 3×3 and 5×5, stride 1 and 2, "same" pads (symmetric, and
    // TF's asymmetric stride-2 pads), planes from 112 to 1.
    for &k in &[3usize, 5] {
        for &s in &[1usize, 2] {
            for &hw in &[112usize, 57, 33, 17, 16, 15, 14, 8, 7, 3, 2, 1] {
                let p = k / 2;
                v.push(Case {
                    c: if hw >= 57 { 2 } else { 4 },
                    h: hw,
                    w: hw,
                    k: (k, k),
                    s: (s, s),
                    p: (p, p, p, p),
                    ..base
                });
                if s == 2 {
                    v.push(Case {
                        c: 2,
                        h: hw,
                        w: hw,
                        k: (k, k),
                        s: (s, s),
                        p: (p - 1, p - 1, p, p),
                        bias: false,
                        ..base
                    });
                }
            }
        }
    }
    // dilation, odd shapes, asymmetric/no/large pads, 7×7, 4×4 (generic path), stride 3, batch 2
    let more = [
        ((3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 11, 13),
        ((5, 5), (2, 2), (2, 2), (4, 3, 4, 2), 20, 23),
        ((3, 3), (2, 1), (1, 2), (0, 1, 2, 0), 10, 31),
        ((3, 3), (1, 2), (2, 1), (1, 0, 0, 3), 19, 18),
        ((5, 5), (1, 1), (1, 1), (0, 0, 0, 0), 12, 40),
        ((3, 3), (1, 1), (1, 1), (3, 3, 3, 3), 5, 6),
        ((7, 7), (1, 1), (1, 1), (3, 3, 3, 3), 14, 14),
        ((7, 7), (2, 2), (1, 1), (3, 2, 3, 4), 15, 21),
        ((4, 4), (2, 2), (1, 1), (1, 1, 2, 2), 9, 9),
        ((3, 3), (3, 3), (1, 1), (1, 1, 1, 1), 17, 35),
        ((5, 5), (3, 3), (2, 2), (2, 4, 2, 0), 16, 29),
        // Stride 2 straight from the input (`s2_plane`): rows wider than two strips, odd
        // widths, pads on one side only.
        ((3, 3), (2, 2), (1, 1), (0, 1, 2, 1), 13, 70),
        ((5, 5), (2, 2), (1, 1), (2, 0, 1, 2), 21, 67),
        ((3, 3), (2, 2), (1, 1), (1, 0, 1, 0), 6, 33),
    ];
    for (i, &(k, s, d, p, h, w)) in more.iter().enumerate() {
        v.push(Case {
            n: 2,
            c: 3,
            h,
            w,
            k,
            s,
            d,
            p,
            bias: i % 2 == 0,
        });
    }
    // big enough for fill_chunks to split planes over threads
    v.push(Case {
        c: 8,
        h: 64,
        w: 72,
        ..base
    });
    // only geometries with a non-empty output
    v.retain(|cs| {
        cs.h + cs.p.0 + cs.p.2 > cs.d.0 * (cs.k.0 - 1)
            && cs.w + cs.p.1 + cs.p.3 > cs.d.1 * (cs.k.1 - 1)
    });
    v
}

#[test]
fn depthwise_matches_definition() {
    for (i, cs) in cases().iter().enumerate() {
        let nx = cs.n * cs.c * cs.h * cs.w;
        let x = rnd(nx, 3 * i as u64 + 1);
        let w = rnd(cs.c * cs.k.0 * cs.k.1, 3 * i as u64 + 2);
        let b = rnd(cs.c, 3 * i as u64 + 3);
        check(cs, x, w, b);
    }
}

#[test]
fn depthwise_nan_inf_propagate_as_definition() {
    for (i, cs) in cases().iter().enumerate() {
        let nx = cs.n * cs.c * cs.h * cs.w;
        let mut x = rnd(nx, 7 * i as u64 + 1);
        let mut w = rnd(cs.c * cs.k.0 * cs.k.1, 7 * i as u64 + 2);
        let b = rnd(cs.c, 7 * i as u64 + 3);
        // NaN, +Inf, -Inf and an Inf that meets a 0 weight (NaN) at spread positions,
        // including the image corners (where border taps are masked off).
        let last = nx - 1;
        for (j, v) in [
            (0, f32::NAN),
            (last, f32::INFINITY),
            (nx / 2, f32::NEG_INFINITY),
        ] {
            x[j] = v;
        }
        if nx > 8 {
            x[nx / 3] = f32::INFINITY;
            x[nx / 3 + 1] = f32::NEG_INFINITY; // neighbours: +Inf + -Inf = NaN
            x[nx / 5] = f32::NAN;
        }
        if cs.c > 1 {
            // channel 1: an Inf weight at a corner tap (only meets in-image values where that
            // tap is inside the image), a zero weight at the centre
            let kk = cs.k.0 * cs.k.1;
            w[kk] = f32::INFINITY;
            w[kk + kk / 2] = 0.0;
        }
        if cs.c > 2 {
            // channel 2: a NaN weight at the last tap
            let kk = cs.k.0 * cs.k.1;
            w[3 * kk - 1] = f32::NAN;
        }
        check(cs, x, w, b);
    }
}

#[test]
fn depthwise_overflow_to_inf() {
    let cs = Case {
        n: 1,
        c: 2,
        h: 20,
        w: 20,
        k: (3, 3),
        s: (1, 1),
        d: (1, 1),
        p: (1, 1, 1, 1),
        bias: true,
    };
    let x = vec![3e38f32; 800];
    let w = vec![1.0f32; 18];
    check(&cs, x, w, vec![0.0, -1.0]);
}
