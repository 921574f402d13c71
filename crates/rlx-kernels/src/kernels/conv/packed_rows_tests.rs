//! The pointwise kernel with positions on the vector side ([`super::packed_rows`]) against
//! a float64 definition and the gemm crate's path ([`super::im2col::conv_float`]): random
//! stride-1 1×1 convs with tails on every side (positions not a multiple of 16 or 64,
//! channels not a multiple of 6, `K` over one pass of 64 rows), batch 2, the fused
//! epilogue (bias, Relu, a read residual and a residual buffer written over), and NaN/Inf.
//!
//! The bound, as in `packed_tests.rs`: `|Δ| ≤ 4·K·ε·Σ|w·x| + 2ε·(|y| + 2)` against gemm
//! (both sides round a sum of `K` products, in different orders), half of it against the
//! definition.

use super::common::{geometry, Clamp, Epilogue, Geo, Residual};
use super::im2col::conv_float;
use super::no_post;
use super::packed::run_rows_for_test;
use super::packed_rows::RowsRes;
use super::packed_tests::rnd;
use crate::kernels::simd::{isa_cap, IsaCap};
use rlx_ir::ConvAttrs;

/// `(n, c, h, w, m)`: 1×1 convs, stride 1, no padding.
const CASES: &[(usize, usize, usize, usize, usize)] = &[
    (1, 64, 56, 56, 256),
    (1, 256, 28, 28, 64),
    (1, 16, 55, 55, 64),
    (2, 33, 17, 19, 13),
    (1, 7, 1, 1, 5),
    (1, 130, 9, 7, 6),
    (1, 200, 5, 13, 11),
    (1, 1100, 3, 5, 7),
    (2, 65, 8, 8, 1),
];

fn geo(&(n, c, h, w, m): &(usize, usize, usize, usize, usize)) -> Geo {
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    geometry(&[n, c, h, w], &[m, c, 1, 1], &a, &[n, m, h, w]).unwrap()
}

/// The f64 definition `Σ_c w[m, c]·x[n, c, p]` and `Σ|w·x|` per output.
fn definition(t: &(usize, usize, usize, usize, usize), x: &[f32], w: &[f32]) -> Vec<(f64, f64)> {
    let &(n, c, h, wd, m) = t;
    let p = h * wd;
    let mut out = Vec::with_capacity(n * m * p);
    for ni in 0..n {
        for mi in 0..m {
            for j in 0..p {
                let (mut s, mut a) = (0f64, 0f64);
                for ci in 0..c {
                    let v = w[mi * c + ci] as f64 * x[(ni * c + ci) * p + j] as f64;
                    s += v;
                    a += v.abs();
                }
                out.push((s, a));
            }
        }
    }
    out
}

fn available() -> bool {
    isa_cap() == IsaCap::Avx512
}

/// Case `t`'s inputs, weights, bias and residual, from seeds `base`, `base + 10`, `+ 20`,
/// `+ 30`.
fn operands(
    &(n, c, h, wd, m): &(usize, usize, usize, usize, usize),
    base: u64,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = h * wd;
    (
        rnd(n * c * p, base),
        rnd(m * c, base + 10),
        rnd(m, base + 20),
        rnd(n * m * p, base + 30),
    )
}

/// Sums, bias, Relu and the residual (read, and taken as the output buffer) against the
/// float64 definition: `relu((Σ + b) + r)` for a read residual, `relu((Σ + r) + b)` for a
/// buffer, each rounding step in f32 as the unfused ops (and gemm) take them; without a
/// residual, a Relu6 clamp (applied in the last pass's registers) and a `post` after the
/// bias (the row pass, which then adds nothing).
#[test]
fn packed_rows_kernel_matches_the_f64_definition() {
    if !available() {
        eprintln!("skipped: no AVX-512F");
        return;
    }
    for (i, t) in CASES.iter().enumerate() {
        let &(n, c, h, wd, m) = t;
        let p = h * wd;
        let (x, w, b, r) = operands(t, 10 + i as u64);
        let g = geo(t);
        let def = definition(t, &x, &w);
        let relu6 = Clamp {
            lo: 0.0,
            hi: 6.0,
            ..Clamp::RELU
        };
        let twice = |s: &mut [f32]| s.iter_mut().for_each(|v| *v *= 2.0);
        for mode in 0..5 {
            let epi = Epilogue {
                bias: Some(&b),
                clamp: match mode {
                    1 | 2 => Some(Clamp::RELU),
                    3 => Some(relu6),
                    _ => None,
                },
                post: if mode == 4 { &twice } else { &no_post },
                post_bias: None,
                seen: None,
            };
            let res = match mode {
                1 => RowsRes::Read(&r),
                2 => RowsRes::Into(r.clone()),
                _ => RowsRes::None,
            };
            let got = run_rows_for_test(&x, &w, &g, &epi, res);
            assert_eq!(got.len(), n * m * p);
            for (o, (&a, &(s, mag))) in got.iter().zip(&def).enumerate() {
                let mi = (o / p) % m;
                let (bv, rv) = (b[mi], r[o]);
                let s32 = s as f32;
                let want = match mode {
                    0 => s32 + bv,
                    1 => ((s32 + bv) + rv).max(0.0),
                    2 => ((s32 + rv) + bv).max(0.0),
                    3 => (s32 + bv).clamp(0.0, 6.0),
                    _ => 2.0 * (s32 + bv),
                } as f64;
                let scale = if mode == 4 { 2.0 } else { 1.0 };
                let bound = scale * 2.0 * c as f64 * f32::EPSILON as f64 * mag
                    + 2.0 * f32::EPSILON as f64 * (want.abs() + 2.0);
                assert!(
                    (a as f64 - want).abs() <= bound,
                    "{t:?} mode {mode} at {o}: {a} vs {want} (bound {bound})"
                );
            }
        }
    }
}

/// Against gemm's path with the same epilogue, and NaN/Inf inputs and weights: the
/// non-finite values fall at gemm's positions (Relu keeps a NaN), the rest within the bound.
#[test]
fn packed_rows_kernel_follows_gemm_with_nan_and_inf() {
    if !available() {
        eprintln!("skipped: no AVX-512F");
        return;
    }
    for (i, t) in CASES.iter().enumerate() {
        let c = t.1;
        let (mut x, mut w, b, r) = operands(t, 50 + i as u64);
        let g = geo(t);
        for poison in 0..2 {
            if poison == 1 {
                let nx = x.len();
                x[nx / 3] = f32::NAN;
                x[(2 * nx) / 3] = f32::INFINITY;
                x[nx - 1] = f32::NEG_INFINITY;
                let nw = w.len();
                w[nw / 2] = f32::NAN;
            }
            let mag: Vec<f64> = definition(t, &x, &w).iter().map(|d| d.1).collect();
            for (into, none) in [(false, false), (true, false), (false, true)] {
                let epi = Epilogue {
                    bias: Some(&b),
                    clamp: Some(Clamp::RELU),
                    post: &no_post,
                    post_bias: None,
                    seen: None,
                };
                let got = if none {
                    run_rows_for_test(&x, &w, &g, &epi, RowsRes::None)
                } else if into {
                    run_rows_for_test(&x, &w, &g, &epi, RowsRes::Into(r.clone()))
                } else {
                    run_rows_for_test(&x, &w, &g, &epi, RowsRes::Read(&r))
                };
                let res = if none {
                    None
                } else if into {
                    Some(Residual::Into(r.clone()))
                } else {
                    Some(Residual::Read(&r))
                };
                let want = conv_float(&x, &w, &g, &epi, res).unwrap();
                for (o, (&a, &e)) in got.iter().zip(&want).enumerate() {
                    let tag = || {
                        format!(
                            "{t:?} poison {poison} into {into} none {none} at {o}: {a} vs gemm {e}"
                        )
                    };
                    if a.is_nan() || e.is_nan() {
                        assert!(a.is_nan() && e.is_nan(), "{}", tag());
                    } else if a.is_infinite() || e.is_infinite() {
                        assert_eq!(a, e, "{}", tag());
                    } else {
                        let bound = 4.0 * c as f64 * f32::EPSILON as f64 * mag[o]
                            + 2.0 * f32::EPSILON as f64 * (e.abs() as f64 + 2.0);
                        assert!(((a - e) as f64).abs() <= bound, "{}", tag());
                    }
                }
            }
        }
    }
}
