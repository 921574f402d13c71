//! RLX's own conv kernel ([`super::packed`]) against the gemm crate's path
//! ([`super::im2col::conv_float`]) and a float64 definition, on both instruction sets
//! this CPU runs: random shapes with odd sizes and tails, the strides, pads and kernel
//! sizes the models use, the fused epilogue (bias, residual, clamps, `post`, the scan's
//! largest |y|), and NaN/Inf inputs.
//!
//! The bound: each value is a sum of `K` products in f32, in another order than gemm's,
//! so the two differ by at most `4·K·ε·Σ|w·x|` (ε = 2^-24, the sum over the terms'
//! magnitudes in f64; twice the usual `γ_K` bound of each side).
//!
//! One file over 1,000 lines: every test here runs the same case list ([`cases`]) through
//! the same comparison ([`compare`]) and its helpers, which a split would have to make
//! visible across files; the rows kernel's tests, which have their own cases, are apart
//! (`packed_rows_tests.rs`). Split when a test needs cases of its own.

use super::common::{geometry, Clamp, Epilogue, Geo};
use super::im2col::conv_float;
use super::no_post;
use super::pack::MkIsa;
use super::packed::{run_cols_for_test, run_for_test, run_panels_for_test};
use crate::kernels::simd::{isa_cap, IsaCap};
use rlx_ir::ConvAttrs;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ISAs this CPU runs.
fn isas() -> Vec<MkIsa> {
    let mut v = vec![];
    if isa_cap() >= IsaCap::Avx2 {
        v.push(MkIsa::Avx2);
    }
    if isa_cap() == IsaCap::Avx512 {
        v.push(MkIsa::Avx512);
    }
    v
}

pub(super) use crate::kernels::rnd;

/// A conv case: x `[n, c, h, w]`, `m` filters of `kh × kw`, stride, pad, dilation.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    m: usize,
    k: (usize, usize),
    s: usize,
    p: usize,
    d: usize,
}

impl Case {
    fn geo(&self) -> Geo {
        let (oh, ow) = self.out();
        let a = ConvAttrs {
            strides: vec![self.s, self.s],
            pads: vec![(self.p, self.p), (self.p, self.p)],
            dilations: vec![self.d, self.d],
            groups: 1,
        };
        geometry(
            &[self.n, self.c, self.h, self.w],
            &[self.m, self.c, self.k.0, self.k.1],
            &a,
            &[self.n, self.m, oh, ow],
        )
        .unwrap()
    }

    fn out(&self) -> (usize, usize) {
        let o = |i: usize, k: usize| (i + 2 * self.p - self.d * (k - 1) - 1) / self.s + 1;
        (o(self.h, self.k.0), o(self.w, self.k.1))
    }

    /// Σ|w·x| per output value (f64), for the bound.
    fn magnitudes(&self, x: &[f32], w: &[f32]) -> Vec<f64> {
        let (oh, ow) = self.out();
        let (kh, kw) = self.k;
        let mut out = vec![];
        for ni in 0..self.n {
            for mi in 0..self.m {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0f64;
                        for ci in 0..self.c {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (oy * self.s + ky * self.d) as isize - self.p as isize;
                                    let ix = (ox * self.s + kx * self.d) as isize - self.p as isize;
                                    if iy < 0
                                        || ix < 0
                                        || iy >= self.h as isize
                                        || ix >= self.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = x[((ni * self.c + ci) * self.h + iy as usize)
                                        * self.w
                                        + ix as usize];
                                    let wv = w[((mi * self.c + ci) * kh + ky) * kw + kx];
                                    acc += (xv as f64 * wv as f64).abs();
                                }
                            }
                        }
                        out.push(acc);
                    }
                }
            }
        }
        out
    }
}

/// The cases: 1×1 (the planes of the models: 7², 13², 14², 55², and odd ones), strided
/// 1×1, 3×3 with pads, strides and dilation, a 7×7/2 stem, batch 2, `M` and `K` with
/// tails against every block width.
fn cases() -> Vec<Case> {
    let c = |n, c, h, w, m, k, s, p, d| Case {
        n,
        c,
        h,
        w,
        m,
        k,
        s,
        p,
        d,
    };
    vec![
        c(1, 16, 7, 7, 24, (1, 1), 1, 0, 1),
        c(1, 160, 7, 7, 960, (1, 1), 1, 0, 1),
        c(1, 96, 14, 14, 24, (1, 1), 1, 0, 1),
        c(1, 64, 13, 13, 49, (1, 1), 1, 0, 1),
        c(1, 17, 5, 9, 33, (1, 1), 1, 0, 1),
        c(2, 33, 11, 3, 17, (1, 1), 1, 0, 1),
        c(1, 3, 1, 1, 5, (1, 1), 1, 0, 1),
        c(1, 24, 40, 41, 40, (1, 1), 1, 0, 1),
        c(1, 600, 4, 5, 70, (1, 1), 1, 0, 1),
        c(1, 1100, 3, 3, 40, (1, 1), 1, 0, 1),
        // A last block of 16 channels (`tile16`): EfficientNet-B0's 112←672 and 80←480.
        c(1, 672, 14, 14, 112, (1, 1), 1, 0, 1),
        c(1, 480, 14, 14, 80, (1, 1), 1, 0, 1),
        c(1, 64, 14, 14, 128, (1, 1), 2, 0, 1),
        c(2, 20, 9, 11, 36, (1, 1), 3, 0, 1),
        c(1, 16, 12, 12, 32, (3, 3), 1, 1, 1),
        c(1, 19, 9, 8, 35, (3, 3), 2, 1, 1),
        c(2, 8, 10, 10, 16, (3, 3), 1, 2, 2),
        c(1, 3, 23, 23, 20, (7, 7), 2, 3, 1),
        c(1, 64, 7, 7, 65, (3, 3), 1, 1, 1),
        // Read in place (packed_im): tiles across rows, odd planes, stride 2 on an odd
        // input, 5×5, no padding, a 1×3 kernel, dilation 3.
        c(1, 40, 15, 15, 48, (3, 3), 2, 1, 1),
        c(1, 48, 9, 13, 40, (3, 3), 1, 1, 1),
        c(2, 36, 8, 8, 33, (5, 5), 1, 2, 1),
        c(1, 32, 11, 6, 64, (3, 3), 1, 0, 1),
        c(1, 130, 5, 7, 32, (1, 3), 2, 1, 1),
        c(1, 20, 13, 13, 32, (3, 3), 1, 3, 3),
    ]
}

/// Runs case `t` through `isa`'s kernel and through gemm with the same epilogue (bias,
/// clamp, a read residual), asserts the bound between them and against the f64
/// definition, and that NaN/Inf fall at the same positions.
fn compare(isa: MkIsa, t: &Case, x: &[f32], w: &[f32], clamp: Option<Clamp>, with_res: bool) {
    let g = t.geo();
    let b = rnd(t.m, 7);
    let (oh, ow) = t.out();
    let total = t.n * t.m * oh * ow;
    let r = rnd(total, 11);
    let res = with_res.then_some(&r[..]);
    let seen_a = AtomicU32::new(0);
    let seen_b = AtomicU32::new(0);
    let epi = |seen| Epilogue {
        bias: Some(&b),
        clamp,
        post: &no_post,
        post_bias: None,
        seen: clamp.and(Some(seen)),
    };
    let got = run_for_test(isa, x, w, &g, &epi(&seen_a), res).expect("the kernel takes it");
    let want = conv_float(
        x,
        w,
        &g,
        &epi(&seen_b),
        res.map(super::common::Residual::Read),
    )
    .unwrap();
    let mag = t.magnitudes(x, w);
    let k = (t.c * t.k.0 * t.k.1) as f64;
    assert_eq!(got.len(), want.len());
    for (i, (&a, &e)) in got.iter().zip(&want).enumerate() {
        let tag =
            || format!("{isa:?} {t:?} clamp {clamp:?} res {with_res}: at {i}: {a} vs gemm {e}");
        if e.is_nan() || a.is_nan() {
            assert!(e.is_nan() && a.is_nan(), "{}", tag());
            continue;
        }
        if e.is_infinite() || a.is_infinite() {
            assert_eq!(a, e, "{}", tag());
            continue;
        }
        let bound = 4.0 * k * f32::EPSILON as f64 / 2.0 * mag[i]
            + 2.0 * f32::EPSILON as f64 * (e.abs() as f64 + 2.0);
        assert!(((a - e) as f64).abs() <= bound, "{} (bound {bound})", tag());
    }
    if clamp.is_some() {
        let (sa, sb) = (
            seen_a.load(Ordering::Relaxed),
            seen_b.load(Ordering::Relaxed),
        );
        assert_eq!(
            sa >= 0x7f80_0000,
            sb >= 0x7f80_0000,
            "{isa:?} {t:?}: scan bits"
        );
        let (fa, fb) = (f32::from_bits(sa), f32::from_bits(sb));
        if fb.is_finite() {
            assert!(
                (fa - fb).abs() <= 1e-4 * (1.0 + fb),
                "{isa:?} {t:?}: largest |y| {fa} vs {fb}"
            );
        }
    }
}

#[test]
fn packed_kernel_matches_gemm_on_random_shapes() {
    for isa in isas() {
        for (i, t) in cases().iter().enumerate() {
            let x = rnd(t.n * t.c * t.h * t.w, 100 + i as u64);
            let w = rnd(t.m * t.c * t.k.0 * t.k.1, 200 + i as u64);
            compare(isa, t, &x, &w, None, false);
            compare(isa, t, &x, &w, Some(Clamp::RELU), true);
            compare(isa, t, &x, &w, Some(Clamp::clip(0.0, 6.0)), false);
        }
    }
}

/// The kernel against a float64 definition directly (not through gemm): the sum of
/// products plus the bias, within the same bound.
/// Convs larger than 1×1 read their input in place (`packed_im`) and give, bit for bit,
/// what the same tiles give on im2col's columns: the same products in the same order,
/// the padding's zeros as im2col writes them. NaN/Inf in the input too.
#[test]
fn packed_in_place_matches_im2col_columns_bit_for_bit() {
    for isa in isas() {
        for t in cases().iter().filter(|t| t.k != (1, 1) || t.s > 1) {
            let g = t.geo();
            let mut x = rnd(t.n * t.c * t.h * t.w, 5);
            let w = rnd(t.m * t.c * t.k.0 * t.k.1, 6);
            x[t.w + 1] = f32::NAN;
            let mid = x.len() / 2;
            x[mid] = f32::INFINITY;
            let b = rnd(t.m, 7);
            let epi = Epilogue {
                bias: Some(&b),
                clamp: Some(Clamp::RELU),
                post: &no_post,
                post_bias: None,
                seen: None,
            };
            let got = run_for_test(isa, &x, &w, &g, &epi, None).expect("the kernel takes it");
            let want = run_cols_for_test(isa, &x, &w, &g, &epi, None);
            assert_eq!(got.len(), want.len());
            for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    e.to_bits(),
                    "{isa:?} {t:?}: at {i}: {a} vs {e}"
                );
            }
        }
    }
}

/// The same on 3 threads (tasks split over row blocks and channel blocks, the padded
/// copy made over the pool) as on one, bit for bit: a ResNet-like 3×3/2 and a 7² 3×3/1.
#[test]
fn packed_in_place_threads_match_one_thread() {
    let pools: Vec<_> = [2, 3]
        .map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .into();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let c1 = |n, c, hw, m| Case {
        n,
        c,
        h: hw,
        w: hw,
        m,
        k: (1, 1),
        s: 1,
        p: 0,
        d: 1,
    };
    // Channel parts (weights outweigh the input), runs of positions (the input outweighs
    // the weights: 1×1 at 28² and 14², 3×3 stride 1 and 2), and 20 channel blocks on
    // AVX-512 in 8 parts at 2 threads (boundaries at i·nb/parts).
    let big = [
        c1(1, 128, 28, 32),
        c1(1, 256, 14, 64),
        c1(2, 96, 13, 40),
        c1(1, 128, 7, 320),
        Case {
            n: 1,
            c: 32,
            h: 30,
            w: 30,
            m: 32,
            k: (3, 3),
            s: 1,
            p: 1,
            d: 1,
        },
        Case {
            n: 1,
            c: 48,
            h: 33,
            w: 33,
            m: 40,
            k: (3, 3),
            s: 2,
            p: 1,
            d: 1,
        },
        Case {
            n: 2,
            c: 64,
            h: 29,
            w: 29,
            m: 96,
            k: (3, 3),
            s: 2,
            p: 1,
            d: 1,
        },
        Case {
            n: 1,
            c: 128,
            h: 7,
            w: 7,
            m: 80,
            k: (3, 3),
            s: 1,
            p: 1,
            d: 1,
        },
    ];
    for isa in isas() {
        for t in &big {
            let g = t.geo();
            let x = rnd(t.n * t.c * t.h * t.w, 8);
            let w = rnd(t.m * t.c * t.k.0 * t.k.1, 9);
            let epi = Epilogue {
                bias: None,
                clamp: None,
                post: &no_post,
                post_bias: None,
                seen: None,
            };
            let b = one
                .install(|| run_for_test(isa, &x, &w, &g, &epi, None))
                .unwrap();
            let c = one.install(|| run_cols_for_test(isa, &x, &w, &g, &epi, None));
            assert!(
                b.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{isa:?} {t:?}"
            );
            for pool in &pools {
                let a = pool
                    .install(|| run_for_test(isa, &x, &w, &g, &epi, None))
                    .unwrap();
                assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{isa:?} {t:?} {} threads",
                    pool.current_num_threads()
                );
            }
        }
    }
}

#[test]
fn packed_kernel_matches_the_f64_definition() {
    for isa in isas() {
        for (i, t) in cases().iter().enumerate() {
            let x = rnd(t.n * t.c * t.h * t.w, 300 + i as u64);
            let w = rnd(t.m * t.c * t.k.0 * t.k.1, 400 + i as u64);
            let b = rnd(t.m, 9);
            let g = t.geo();
            let epi = Epilogue {
                bias: Some(&b),
                clamp: None,
                post: &no_post,
                post_bias: None,
                seen: None,
            };
            let got = run_for_test(isa, &x, &w, &g, &epi, None).unwrap();
            let mag = t.magnitudes(&x, &w);
            // The definition: Σ w·x in f64, with the bias.
            let (oh, ow) = t.out();
            let (kh, kw) = t.k;
            let k = (t.c * kh * kw) as f64;
            let mut i_out = 0;
            for ni in 0..t.n {
                for mi in 0..t.m {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut acc = 0f64;
                            for ci in 0..t.c {
                                for ky in 0..kh {
                                    for kx in 0..kw {
                                        let iy = (oy * t.s + ky * t.d) as isize - t.p as isize;
                                        let ix = (ox * t.s + kx * t.d) as isize - t.p as isize;
                                        if iy < 0
                                            || ix < 0
                                            || iy >= t.h as isize
                                            || ix >= t.w as isize
                                        {
                                            continue;
                                        }
                                        acc += x[((ni * t.c + ci) * t.h + iy as usize) * t.w
                                            + ix as usize]
                                            as f64
                                            * w[((mi * t.c + ci) * kh + ky) * kw + kx] as f64;
                                    }
                                }
                            }
                            let want = (acc as f32 + b[mi]) as f64;
                            let a = got[i_out] as f64;
                            let bound = 2.0 * k * f32::EPSILON as f64 / 2.0 * mag[i_out]
                                + f32::EPSILON as f64 * (want.abs() + 2.0);
                            assert!(
                                (a - want).abs() <= bound,
                                "{isa:?} {t:?} at {i_out}: {a} vs {want}"
                            );
                            i_out += 1;
                        }
                    }
                }
            }
        }
    }
}

/// NaN in, NaN out at the same positions as gemm's (a NaN input value reaches every
/// output that reads it, an Inf against weights of both signs gives ±inf or NaN), with
/// and without a clamp (Relu keeps a NaN), and a NaN or Inf weight.
#[test]
fn packed_kernel_nan_and_inf_follow_gemm() {
    for isa in isas() {
        for (i, t) in cases().iter().enumerate() {
            let mut x = rnd(t.n * t.c * t.h * t.w, 500 + i as u64);
            let mut w = rnd(t.m * t.c * t.k.0 * t.k.1, 600 + i as u64);
            let nx = x.len();
            x[nx / 3] = f32::NAN;
            x[(2 * nx) / 3] = f32::INFINITY;
            x[nx - 1] = f32::NEG_INFINITY;
            compare(isa, t, &x, &w, None, false);
            compare(isa, t, &x, &w, Some(Clamp::RELU), false);
            compare(isa, t, &x, &w, Some(Clamp::clip(-1.0, 1.0)), true);
            let nw = w.len();
            w[nw / 2] = f32::NAN;
            w[nw / 5] = f32::INFINITY;
            compare(isa, t, &x, &w, Some(Clamp::RELU), false);
        }
    }
}

/// A stride-1 1×1 conv's `X` read from tile panels gives, bit for bit, what the tiles
/// give reading the input planes in place (the same products in the same order): every
/// 1×1 stride-1 case (a batch of 2, half blocks, sums in several slices of `K`), with
/// NaN and Inf in the input, at 1 and 3 threads.
#[test]
fn panels_give_the_in_place_bits() {
    let mut n = 0;
    for isa in isas() {
        for (i, t) in cases().iter().enumerate() {
            if t.k != (1, 1) || t.s != 1 {
                continue;
            }
            let mut x = rnd(t.n * t.c * t.h * t.w, 700 + i as u64);
            let nx = x.len();
            x[nx / 2] = f32::NAN;
            x[nx / 3] = f32::INFINITY;
            let w = rnd(t.m * t.c, 800 + i as u64);
            let b = rnd(t.m, 5);
            let g = t.geo();
            let epi = Epilogue {
                bias: Some(&b),
                clamp: Some(Clamp::RELU),
                post: &no_post,
                post_bias: None,
                seen: None,
            };
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (a, p) = pool.install(|| {
                    let a = run_panels_for_test(isa, &x, &w, &g, &epi, false);
                    (a, run_panels_for_test(isa, &x, &w, &g, &epi, true))
                });
                assert_eq!(a.len(), p.len());
                for (j, (u, v)) in a.iter().zip(&p).enumerate() {
                    assert_eq!(
                        u.to_bits(),
                        v.to_bits(),
                        "{isa:?} {t:?}, {threads} threads, at {j}: {u} in place, {v} panels"
                    );
                }
                n += 1;
            }
        }
    }
    assert!(n >= 20, "{n} runs");
}

/// Timing against gemm on the models' shapes (not a test: `cargo test --release -p
/// rlx-kernels packed_timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn packed_timing() {
    let c = |c, h, m, k: usize, s, p| Case {
        n: 1,
        c,
        h,
        w: h,
        m,
        k: (k, k),
        s,
        p,
        d: 1,
    };
    let shapes = [
        c(160, 7, 960, 1, 1, 0),
        c(960, 7, 160, 1, 1, 0),
        c(320, 7, 1280, 1, 1, 0),
        c(512, 7, 2048, 1, 1, 0),
        c(2048, 7, 512, 1, 1, 0),
        c(96, 14, 576, 1, 1, 0),
        c(576, 14, 96, 1, 1, 0),
        c(256, 14, 1024, 1, 1, 0),
        c(512, 13, 1000, 1, 1, 0),
        c(512, 7, 512, 3, 1, 1),
        c(256, 14, 512, 3, 2, 1),
        c(3, 224, 64, 7, 2, 3),
    ];
    for t in shapes {
        let x = rnd(t.n * t.c * t.h * t.w, 1);
        let w = rnd(t.m * t.c * t.k.0 * t.k.1, 2);
        let b = rnd(t.m, 3);
        let g = t.geo();
        let epi = Epilogue {
            bias: Some(&b),
            clamp: Some(Clamp::RELU),
            post: &no_post,
            post_bias: None,
            seen: None,
        };
        let time = |f: &dyn Fn() -> Vec<f32>| {
            let mut v = vec![];
            for _ in 0..30 {
                let t0 = std::time::Instant::now();
                let o = f();
                v.push(t0.elapsed().as_secs_f64() * 1e6);
                crate::buffers::give(rlx_ir::TensorData::F32(o));
            }
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let gm = time(&|| conv_float(&x, &w, &g, &epi, None).unwrap());
        let mut line = format!("{:?} gemm {gm:.0} us", (t.m, t.c, t.h, t.k, t.s));
        // Cold weights: 12 copies (beyond what stays cached), one per call in turn.
        let copies = 12;
        let ws: Vec<Vec<f32>> = (0..copies).map(|_| w.clone()).collect();
        let turn = std::cell::Cell::new(0usize);
        let gc = time(&|| {
            turn.set(turn.get() + 1);
            conv_float(&x, &ws[turn.get() % copies], &g, &epi, None).unwrap()
        });
        line += &format!(" (cold {gc:.0})");
        for isa in isas() {
            let mut wd = vec![t.m, t.c];
            wd.extend([t.k.0, t.k.1]);
            let pk = super::pack::PackedConv::new(isa, &w, &wd);
            let mk =
                time(&|| super::packed::conv_packed_f32(&x, &pk, &wd, &g, &epi, None).unwrap());
            let pks: Vec<_> = (0..copies)
                .map(|_| super::pack::PackedConv::new(isa, &w, &wd))
                .collect();
            let mc = time(&|| {
                turn.set(turn.get() + 1);
                super::packed::conv_packed_f32(&x, &pks[turn.get() % copies], &wd, &g, &epi, None)
                    .unwrap()
            });
            line += &format!(" {isa:?} {mk:.0} (cold {mc:.0})");
        }
        println!("{line}");
    }
}

/// The tile kernel alone on L1-resident operands (not a test; `--ignored --nocapture`).
#[test]
#[ignore]
fn packed_tile_peak() {
    for (isa, np, mb) in [
        (MkIsa::Avx512, 12, 32),
        (MkIsa::Avx512, 11, 32),
        (MkIsa::Avx512, 10, 32),
        (MkIsa::Avx512, 9, 32),
        (MkIsa::Avx512, 8, 32),
        (MkIsa::Avx512, 7, 32),
        (MkIsa::Avx2, 6, 16),
        (MkIsa::Avx2, 5, 16),
    ] {
        if !isas().contains(&isa) {
            continue;
        }
        for (k, xs) in [(128, np), (128, 49), (256, 49), (512, 49)] {
            let w = rnd(k * mb, 1);
            let x = rnd(k * xs, 2);
            let mut t = vec![0f32; np * mb];
            let reps = 20000;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: sizes as the tile's contract.
                unsafe {
                    super::packed::tile_for_test(
                        isa,
                        np,
                        k,
                        w.as_ptr(),
                        x.as_ptr(),
                        xs,
                        t.as_mut_ptr(),
                    )
                };
            }
            let s = t0.elapsed().as_secs_f64();
            let gmac = (reps * k * np * mb) as f64 / s / 1e9;
            println!("{isa:?} np {np} k {k} xs {xs}: {gmac:.1} G multiply-adds/s");
        }
    }
}

#[test]
fn unpack_gives_back_the_packed_weights_bit_for_bit() {
    use super::pack::PackedConv;
    // Odd channel counts (a partial last block) and odd K, NaN and -0.0 among the values.
    for (m, k) in [(1, 1), (5, 7), (33, 129), (70, 18), (6, 64)] {
        let mut w = rnd(m * k, (m * 31 + k) as u64);
        w[0] = -0.0;
        if w.len() > 2 {
            w[2] = f32::NAN;
        }
        let dims = [m, k, 1, 1];
        let mut packs: Vec<PackedConv> = isas()
            .into_iter()
            .map(|isa| PackedConv::new(isa, &w, &dims))
            .collect();
        packs.push(PackedConv::new_rows(&w, &dims));
        for pk in packs {
            let back: Vec<u32> = pk.unpack().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
            assert_eq!(back, want, "{m}x{k} {pk:?}");
            assert_eq!(pk.wdims(), &dims);
        }
    }
}

/// Where packed weights do not fit the conv (here weights packed for the pointwise rows
/// kernel, given a 3×3 conv), `conv_packed` runs `conv_post`'s paths on the weights
/// unpacked from them: `conv_post`'s bits on the weights themselves.
#[test]
fn conv_packed_that_does_not_fit_runs_conv_post_on_the_unpacked_weights() {
    use super::{conv_packed, conv_post, Act};
    use rlx_ir::{Shape, Tensor};
    let (c, m, hw) = (16, 24, 9);
    let x = Tensor::from_f32(&[1, c, hw, hw], rnd(c * hw * hw, 3)).unwrap();
    let wv = rnd(m * c * 9, 4);
    let w = Tensor::from_f32(&[m, c, 3, 3], wv.clone()).unwrap();
    let b = Tensor::from_f32(&[m], rnd(m, 5)).unwrap();
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1); 2],
        dilations: vec![1, 1],
        groups: 1,
    };
    let out = Shape::new(&[1, m, hw, hw], rlx_ir::DType::F32);
    let pk = super::pack::PackedConv::new_rows(&wv, &[m, c, 3, 3]);
    let bits =
        |t: Tensor| -> Vec<u32> { t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect() };
    let got = conv_packed(&x, &pk, Some(&b), &a, &out, Act::NONE, None).unwrap();
    let want = conv_post(&x, &w, Some(&b), &a, &out, Act::NONE, None).unwrap();
    assert_eq!(bits(got), bits(want));
    // Packed weights with an input of another dtype: an error, not a panic.
    let x64 = Tensor::new(
        &[1, c, hw, hw][..],
        rlx_ir::TensorData::F64(vec![0.5; c * hw * hw]),
    )
    .unwrap();
    assert!(conv_packed(&x64, &pk, None, &a, &out, Act::NONE, None).is_err());
}

/// The packed drivers' task split covers every position and channel block once, each
/// image's tasks in order (positions or channel ranges first), for cut positions, row
/// blocks and channel parts alike, and splits the way its doc says (runs of positions only
/// where the input outweighs the weights or the channel blocks are fewer than the tasks;
/// in the latter, rayon's halves share at most one channel range).
#[test]
fn packed_split_covers_positions_and_blocks_once() {
    use super::common::TASKS_PER_THREAD;
    use super::pack::Split;
    let mut runs = 0;
    let mut parts = 0;
    let mut both = 0;
    for threads in [1, 2, 3, 16] {
        for (n, oh, ow, rows) in [
            (1, 14, 14, 14),
            (1, 7, 7, 7),
            (2, 13, 13, 4),
            (1, 56, 56, 5),
        ] {
            for any_pos in [false, true] {
                for xw in [(50_000, 10_000), (10_000, 50_000)] {
                    for nb in [1, 6, 20, 60] {
                        let par = threads > 1;
                        let s = Split::new(par, n, (oh, ow), rows, any_pos, xw, nb, threads);
                        let p = oh * ow;
                        let mut next = 0;
                        for ci in 0..s.chunks {
                            let (j0, pb) = s.span(ci);
                            assert_eq!(j0, next, "{threads} {n} {oh} {rows} {any_pos} {nb}");
                            assert!(pb > 0);
                            next = j0 + pb;
                        }
                        assert_eq!(next, p);
                        let mut b = 0;
                        for mp in 0..s.parts {
                            let (b0, b1) = s.blocks(mp);
                            assert_eq!(b0, b);
                            assert!(b1 > b0);
                            b = b1;
                        }
                        assert_eq!(b, nb);
                        assert_eq!(s.tasks(), n * s.chunks * s.parts);
                        // Every (image, positions, channel range) exactly once; an
                        // image's tasks together.
                        let mut seen = std::collections::HashSet::new();
                        let mut prev = (0, 0);
                        for t in 0..s.tasks() {
                            let (ni, span, blocks) = s.task(t);
                            assert_eq!(ni, t / (s.chunks * s.parts));
                            assert!(seen.insert((ni, span, blocks)));
                            let ci = (0..s.chunks).position(|c| s.span(c) == span).unwrap();
                            let mp = (0..s.parts).position(|m| s.blocks(m) == blocks).unwrap();
                            // Consecutive tasks of an image: the next range of positions
                            // of the same channel range, or the next channel range.
                            if t % (s.chunks * s.parts) > 0 {
                                let next = (prev.0 + 1, prev.1) == (ci, mp)
                                    || (prev.1 + 1, 0) == (mp, ci)
                                    || (prev.0, prev.1 + 1) == (ci, mp)
                                    || (prev.0 + 1, 0) == (ci, mp);
                                assert!(next, "{t}: {prev:?} -> {:?}", (ci, mp));
                            }
                            prev = (ci, mp);
                        }
                        assert_eq!(seen.len(), n * s.chunks * s.parts);
                        if !par {
                            assert_eq!((s.chunks, s.parts), (oh.div_ceil(rows), 1));
                        }
                        // Positions are cut off row bounds only where allowed, and where
                        // the input outweighs the weights or the channel blocks are fewer
                        // than the tasks wanted.
                        let cut = (0..s.chunks).any(|ci| !s.span(ci).0.is_multiple_of(ow));
                        let want = TASKS_PER_THREAD * threads;
                        assert!(!cut || (any_pos && (xw.0 > xw.1 || n * nb < want)));
                        runs += usize::from(cut);
                        // Both: positions cut and several channel ranges (blocks
                        // fewer than the tasks).
                        both += usize::from(cut && s.parts > 1);
                        if cut && s.parts > 1 && n == 1 && xw.0 <= xw.1 {
                            // The halves rayon splits the tasks into share at most one
                            // channel range (each range's weights read by one thread).
                            let half = s.tasks() / 2;
                            let ranges = |ts: std::ops::Range<usize>| {
                                ts.map(|t| s.task(t).2)
                                    .collect::<std::collections::HashSet<_>>()
                            };
                            let (a, b) = (ranges(0..half), ranges(half..s.tasks()));
                            assert!(a.intersection(&b).count() <= 1, "{threads} {nb}");
                        }
                        parts += usize::from(s.parts > 1);
                    }
                }
            }
        }
    }
    assert!(runs > 0 && parts > 0 && both > 0);
}

/// Which 1×1 convs on the output planes between 8² and 14² get packed weights
/// ([`super::pack::pack_form`]): those with at most 512 KB of weights (SqueezeNet's 64←384
/// and 64←512 at 13², bench/NOTES.md §39), not SqueezeNet's 2 MB classifier 1000←512 nor
/// a 576 KB one, except on AMD with AVX-512, up to 2 MB (§45); 14² and 7² as before,
/// whatever the weights; up to 28², the planes that are not whole 64-byte lines with at
/// most 512 KB of weights (§41); none where the packed kernel does not run on this CPU.
#[test]
fn pointwise_mid_planes_pack_by_weight_bytes() {
    let on = super::pack::enabled_isa().is_some();
    // AMD with AVX-512 packs up to 2 MB of weights on the planes between 8² and 14².
    let amd512 = crate::kernels::simd::isa_cap() == crate::kernels::simd::IsaCap::Avx512
        && crate::kernels::simd::amd();
    // (output channels, input channels, output plane side, packed where the kernel runs)
    let cases = [
        (64, 384, 13, true),     // 96 KB
        (64, 512, 13, true),     // 128 KB
        (256, 512, 10, true),    // 512 KB: the bound
        (288, 512, 13, amd512),  // 576 KB
        (1000, 512, 13, amd512), // 2 MB (SqueezeNet's classifier): AMD's bound
        (1025, 512, 13, false),  // over 2 MB
        (1000, 512, 14, true),   // 14²: any size
        (1000, 512, 7, true),    // 7²
        (64, 512, 16, false),    // above 14², whole 64-byte lines: gemm
        (64, 512, 15, true),     // 225 values: not whole lines (`ODD_PLANE_MAX`)
        (32, 256, 27, true),     // SqueezeNet's 32←256 at 27² (729)
        (32, 256, 28, false),    // 784 = 49 lines
        (288, 512, 27, false),   // 576 KB
        (32, 256, 29, false),    // 841: above 28²
    ];
    for (m, c, hw, want) in cases {
        let got = pointwise_form(m, c, hw);
        let rows = matches!(got, Some(super::pack::PackForm::Rows));
        assert_eq!(
            got.is_some() && !rows,
            want && on,
            "{m}<-{c} 1x1 at {hw}x{hw}: {got:?}"
        );
    }
}

/// The fewest products per output (`K`) for which a 1×1 conv at 14² gets packed weights
/// ([`super::pack::min_k`]): 128 on Intel and AVX2, 64 on AMD with AVX-512 (bench/NOTES.md
/// §41): MobileNetV2's 576←96 and 384←64 and EfficientNet-B0's 672←112 and 480←80 are
/// packed only there; 48 products never, 128 wherever the packed kernel runs.
#[test]
fn pointwise_products_bound_by_cpu() {
    use crate::kernels::simd::{amd, isa_cap, IsaCap};
    let on = super::pack::enabled_isa().is_some();
    let amd512 = amd() && isa_cap() == IsaCap::Avx512;
    // (output channels, input channels, packed where the kernel runs)
    let cases = [
        (576, 96, amd512),
        (384, 64, amd512),
        (672, 112, amd512),
        (480, 80, amd512),
        (576, 48, false),
        (576, 63, false),
        (576, 128, true),
    ];
    for (m, c, want) in cases {
        let got = pointwise_form(m, c, 14);
        assert_eq!(got.is_some(), want && on, "{m}<-{c} 1x1 at 14x14: {got:?}");
    }
}

/// A 1×1 conv's last block of at most 16 channels counts as 16 on AVX-512 on planes over
/// 64 positions (`PackedConv::half_last`): EfficientNet-B0's 112←672 and 80←480 at 14²
/// are packed there; 48←1152 at 1×1 (weight-bound) and 40←480 at 14² (a last block of 8
/// of 48 computed: past M/8) are not; 24←480 (16 + 8 of 16) is not either.
#[test]
fn pointwise_half_blocks_count_16_channels() {
    let avx512 = super::pack::enabled_isa() == Some(MkIsa::Avx512);
    let k_ok = 480 >= super::pack::min_k();
    for (m, c, hw, want) in [
        (112, 672, 14, avx512),
        (80, 480, 14, avx512 && k_ok),
        (48, 1152, 1, false),
        (40, 480, 14, false),
        (24, 480, 14, false),
    ] {
        let got = pointwise_form(m, c, hw);
        assert_eq!(got.is_some(), want, "{m}<-{c} 1x1 at {hw}x{hw}: {got:?}");
    }
}

/// [`super::pack::pack_form`] of an `m`←`c` stride-1 1×1 conv without padding whose output
/// plane is `hw`×`hw` (zero weights: the form reads no weight values).
fn pointwise_form(m: usize, c: usize, hw: usize) -> Option<super::pack::PackForm> {
    use rlx_ir::{DType, Shape, Tensor};
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let w = Tensor::from_f32(&[m, c, 1, 1], vec![0.0; m * c]).unwrap();
    super::pack::pack_form(&w, &attrs, &Shape::new(&[1, m, hw, hw], DType::F32))
}

/// The bias and clamp applied as a stripe is transposed ([`super::pack::RowEpi`]) give the
/// bits of the transposition followed by `row_epilogue` (the path with a residual, and the
/// one before the fold), and the same scan bits: NaN, ±inf, ±0 and values on the clamp's
/// bounds among the sums; no bias, a bias; no clamp, Relu, Clip (NaN out), the identity
/// with and without tracking; rows and positions with and without 8×8 edges.
#[test]
fn transposed_epilogue_gives_the_row_epilogue_bits() {
    use super::common::row_epilogue;
    use super::pack::{transpose_into, RowEpi};
    if isa_cap() == IsaCap::Portable {
        return;
    }
    let mb = 32;
    for (rows, pb, p) in [
        (32, 196, 196),
        (24, 10, 23),
        (5, 17, 40),
        (32, 8, 8),
        (13, 3, 3),
    ] {
        let mut s = rnd(pb * mb, (rows * 7 + pb) as u64);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            6.0,
            -6.0,
        ];
        for (i, v) in s.iter_mut().enumerate().step_by(5) {
            *v = specials[(i / 5) % specials.len()];
        }
        let mut b = rnd(rows, 9);
        b[0] = -0.0;
        if rows > 2 {
            b[2] = f32::INFINITY;
        }
        let clamps = [
            None,
            Some(Clamp::RELU),
            Some(Clamp::clip(0.0, 6.0)),
            Some(Clamp::NONE),
        ];
        for clamp in clamps {
            for (bias, track) in [
                (None, false),
                (Some(&b[..]), false),
                (Some(&b[..]), true),
                (None, true),
            ] {
                let seen_a = AtomicU32::new(0);
                let seen_b = AtomicU32::new(0);
                let epi = |seen| Epilogue {
                    bias,
                    clamp,
                    post: &no_post,
                    post_bias: None,
                    seen: track.then_some(seen),
                };
                let (ea, eb) = (epi(&seen_a), epi(&seen_b));
                let mut got = vec![1f32; rows * p];
                let mut want = vec![1f32; rows * p];
                let re = RowEpi::of(&ea, 0, rows);
                // SAFETY: s holds pb·mb values, rows ≤ mb, both outputs rows × p ≥ pb.
                let bits =
                    unsafe { transpose_into(s.as_ptr(), mb, pb, rows, got.as_mut_ptr(), p, &re) };
                if re.track {
                    seen_a.fetch_max(bits, Ordering::Relaxed);
                }
                // SAFETY: as above.
                unsafe {
                    transpose_into(
                        s.as_ptr(),
                        mb,
                        pb,
                        rows,
                        want.as_mut_ptr(),
                        p,
                        &RowEpi::NONE,
                    )
                };
                for i in 0..rows {
                    let seg = &mut want[i * p..i * p + pb];
                    row_epilogue(seg, bias.map(|b| b[i]), None, clamp, eb.seen);
                }
                let tag = format!(
                    "rows {rows} pb {pb} clamp {clamp:?} bias {} track {track}",
                    bias.is_some()
                );
                for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "{tag}: at {i}: {a} vs {e}");
                }
                assert_eq!(
                    seen_a.load(Ordering::Relaxed),
                    seen_b.load(Ordering::Relaxed),
                    "{tag}: scan bits"
                );
            }
        }
    }
}
