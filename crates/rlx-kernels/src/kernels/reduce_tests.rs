//! Unit tests of `reduce.rs`: the reduction plan (runs and listed offsets), the f64 sums'
//! order, and the f32 extreme and spread kernels.

use super::{extreme_f32, offsets, reduce, run_len, spread_f32, sum4_f32, sum8_f32, sum_f32};
use rlx_ir::{ReduceKind, Tensor};

/// `run_len` agrees with the listed offsets: a run exactly when they are `0..k`.
#[test]
fn run_len_is_the_listed_offsets_when_they_are_a_run() {
    // (size, stride) pairs of a [2, 1, 3, 4] tensor (strides 12, 12, 4, 1).
    let dims = [(2, 12), (1, 12), (3, 4), (4, 1)];
    let subsets: [&[usize]; 7] = [
        &[3],
        &[2, 3],
        &[1, 2, 3],
        &[0, 1, 2, 3],
        &[0, 3],
        &[2],
        &[0, 2],
    ];
    for axes in subsets {
        let sub: Vec<(usize, usize)> = axes.iter().map(|&a| dims[a]).collect();
        let listed = offsets(&sub);
        let is_run = listed.iter().enumerate().all(|(i, &o)| o == i);
        assert_eq!(
            run_len(&sub),
            is_run.then_some(listed.len()),
            "axes {axes:?}"
        );
    }
    assert_eq!(run_len(&[(0, 1)]), None, "an empty axis is listed (empty)");
}

/// Sum and Mean over middle and leading axes whose kept trailing axes are at least 8
/// long (the column-run path): each output is its terms added in f64 in index order,
/// rounded once (the definition the fold uses), bit for bit, at 1 and several threads.
/// The first two terms of every output are +2^60 and -2^60, so another order would lose
/// the small terms (or keep them where this one does not).
#[test]
fn column_runs_sum_in_f64_in_index_order() {
    const L: f32 = (1u64 << 60) as f32;
    let dims = [3usize, 7, 5, 9];
    let len: usize = dims.iter().product();
    let idx = |i: usize| (i / 315, i / 45 % 7, i / 9 % 5, i % 9);
    let small = |i: usize| ((i * 7919) % 1009) as f32 / 7.0 - 70.0;
    // x1: the big pair at b = 0, 1 (summed over axis 1); x2: at (a, c) = (0, 0), (0, 1)
    // (summed over axes 0 and 2).
    let x1: Vec<f32> = (0..len)
        .map(|i| match idx(i).1 {
            0 => L,
            1 => -L,
            _ => small(i),
        })
        .collect();
    let x2: Vec<f32> = (0..len)
        .map(|i| match idx(i) {
            (0, _, 0, _) => L,
            (0, _, 1, _) => -L,
            _ => small(i),
        })
        .collect();
    let at =
        |v: &[f32], a: usize, b: usize, c: usize, d: usize| v[((a * 7 + b) * 5 + c) * 9 + d] as f64;
    let t1 = Tensor::from_f32(&dims, x1.clone()).unwrap();
    let t2 = Tensor::from_f32(&dims, x2.clone()).unwrap();
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            // Over axis 1: runs of 5·9 = 45 outputs.
            let y = reduce(&t1, ReduceKind::Sum, &[1], false).unwrap();
            let want: Vec<f32> = (0..3 * 45)
                .map(|o| (0..7).fold(0.0, |s, b| s + at(&x1, o / 45, b, o % 45 / 9, o % 9)) as f32)
                .collect();
            assert_eq!(y.as_f32().unwrap(), &want[..]);
            assert!(want.iter().all(|w| w.abs() < 1e4), "the small terms kept");
            // Mean over axes 0 and 2 (a list of offsets): runs of 9.
            let y = reduce(&t2, ReduceKind::Mean, &[0, 2], true).unwrap();
            assert_eq!(y.dims(), &[1, 7, 1, 9]);
            let want: Vec<f32> = (0..7 * 9)
                .map(|o| {
                    let mut s = 0.0;
                    for a in 0..3 {
                        for c in 0..5 {
                            s += at(&x2, a, o / 9, c, o % 9);
                        }
                    }
                    (s / 15.0) as f32
                })
                .collect();
            assert_eq!(y.as_f32().unwrap(), &want[..]);
        });
    }
}

/// Reductions over trailing, leading and middle axes against sums written out by hand.
#[test]
fn reduce_over_runs_and_lists_matches_hand_sums() {
    // x[i][j][k] = 100 i + 10 j + k, dims [2, 3, 4].
    let v: Vec<f32> = (0..24)
        .map(|e| (100 * (e / 12) + 10 * (e / 4 % 3) + e % 4) as f32)
        .collect();
    let x = Tensor::from_f32(&[2, 3, 4], v).unwrap();
    let sum = |axes: &[usize]| reduce(&x, ReduceKind::Sum, axes, false).unwrap();
    // Over j, k: 12·100 i + 10·(0+1+2)·4 + (0+1+2+3)·3 = 1200 i + 138.
    assert_eq!(sum(&[1, 2]).as_f32().unwrap(), &[138.0, 1338.0]);
    // Over everything: 138 + 1338.
    assert_eq!(sum(&[0, 1, 2]).as_f32().unwrap(), &[1476.0]);
    // Over i, k (a list): 4·100 + 2·4·10 j + 2·6 = 412 + 80 j.
    assert_eq!(sum(&[0, 2]).as_f32().unwrap(), &[412.0, 492.0, 572.0]);
    let max = reduce(&x, ReduceKind::Max, &[0, 1, 2], true).unwrap();
    assert_eq!(
        (max.dims(), max.as_f32().unwrap()),
        (&[1, 1, 1][..], &[123.0][..])
    );
}

#[test]
fn extreme_f32_is_the_max_and_min_and_sees_every_nan() {
    // Lengths around the AVX2 kernel's 32-element steps and its tail, values from an
    // LCG; the expected extreme is the f64 fold (exact for f32 values).
    let mut seed = 12345u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e3
    };
    let expect = |v: &[f32], max: bool| -> f64 {
        if v.iter().any(|x| x.is_nan()) {
            return f64::NAN;
        }
        let init = if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        v.iter().fold(init, |a, &x| {
            if max {
                a.max(x as f64)
            } else {
                a.min(x as f64)
            }
        })
    };
    let same = |r: f32, e: f64| (r.is_nan() && e.is_nan()) || r as f64 == e;
    for n in (0usize..=100).chain([127, 128, 129, 255, 1000, 4099]) {
        let v: Vec<f32> = (0..n).map(|_| next()).collect();
        for max in [true, false] {
            assert!(
                same(extreme_f32(&v, max), expect(&v, max)),
                "n {n} max {max}"
            );
        }
        // The extreme at each end and at a step boundary, and ±inf.
        for &at in &[0, n / 2, n.saturating_sub(1), 31.min(n.saturating_sub(1))] {
            if n == 0 {
                break;
            }
            for x in [f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30] {
                let mut w = v.clone();
                w[at] = x;
                for max in [true, false] {
                    assert!(
                        same(extreme_f32(&w, max), expect(&w, max)),
                        "n {n} at {at} x {x}"
                    );
                }
            }
        }
    }
    // A NaN (quiet, signalling, negative) at every position of rows of 1..=70.
    for n in 1..=70 {
        let v: Vec<f32> = (0..n).map(|_| next()).collect();
        for at in 0..n {
            for nan in [
                f32::NAN,
                f32::from_bits(0x7f80_0001),
                f32::from_bits(0xffc0_0000),
            ] {
                let mut w = v.clone();
                w[at] = nan;
                for max in [true, false] {
                    assert!(extreme_f32(&w, max).is_nan(), "n {n} NaN at {at} max {max}");
                }
            }
        }
    }
    // All -inf: the max is -inf, not a NaN; empty: the identity.
    assert_eq!(
        extreme_f32(&[f32::NEG_INFINITY; 40], true),
        f32::NEG_INFINITY
    );
    assert_eq!(extreme_f32(&[], true), f32::NEG_INFINITY);
    assert_eq!(extreme_f32(&[], false), f32::INFINITY);
}

/// `max - min` by hand; a NaN anywhere (in the vector body or the tail) or an inf makes
/// it non-finite, as does a spread past f32::MAX.
#[test]
fn spread_is_max_minus_min_and_sees_every_nan() {
    let v: Vec<f32> = (0..100).map(|i| (i as f32 - 40.0) * 0.5).collect();
    assert_eq!(spread_f32(&v), 29.5 - -20.0);
    for at in [0, 31, 32, 50, 95, 99] {
        let mut w = v.clone();
        w[at] = f32::NAN;
        assert!(spread_f32(&w).is_nan(), "NaN at {at}");
    }
    let mut w = v.clone();
    w[7] = f32::NEG_INFINITY;
    assert!(!spread_f32(&w).is_finite());
    let mut w = v.clone();
    w[3] = 3e38;
    w[70] = -3e38;
    assert!(!spread_f32(&w).is_finite());
    w[70] = -3.4e38 + 3e38; // mask-like values with a small max stay finite
    w[3] = -3.4e38;
    assert!(spread_f32(&w).is_finite());
    assert!(!spread_f32(&[]).is_finite());
}

/// Rows for the softmax row kernels: `rows` rows of `n` from an LCG, each of one kind
/// (picked by row index): plain values at several scales, masks (-inf, -3.4e38), a NaN,
/// ±inf, huge values, all-equal rows, ±0, results that go subnormal or to +0.
#[cfg(target_arch = "x86_64")]
fn softmax_rows_input(n: usize, rows: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v = Vec::with_capacity(n * rows);
    for r in 0..rows {
        let kind = (r as u64 + seed) % 14;
        let scale = [1.0f32, 8.0, 40.0, 1e4][(r / 14) % 4];
        for _ in 0..n {
            let u = next();
            let x = (u - 0.5) * 2.0 * scale;
            let mut pick = |p: f32| next() < p;
            v.push(match kind {
                1 if pick(0.5) => f32::NEG_INFINITY,
                2 => f32::NEG_INFINITY,
                3 if pick(0.3) => -3.4e38,
                4 if pick(0.05) => f32::NAN,
                5 if pick(0.05) => f32::INFINITY,
                6 if pick(0.1) => 3e38,
                7 => 1.25,
                8 => [0.0, -0.0][(u * 2.0) as usize],
                // `x - m` between -104 and -87: subnormal or +0 results.
                9 => -(u * 100.0),
                10 => -(u * 17.0) - 87.0,
                11 if pick(0.02) => f32::from_bits(0x7f80_0001),
                12 if pick(0.5) => -1e30,
                _ => x,
            });
        }
    }
    v
}

/// The row lengths the kernels of `width` lanes take: multiples of it, short and long.
#[cfg(target_arch = "x86_64")]
fn softmax_lengths(width: usize) -> Vec<usize> {
    [1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 130]
        .iter()
        .map(|k| k * width)
        .collect()
}

/// Bit equality of two outputs, NaN payloads included.
#[cfg(target_arch = "x86_64")]
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
    }
}

/// Each instantiation of the generic softmax row kernel (16 lanes on AVX-512, 8 on AVX2 +
/// FMA and on AVX-512VL) gives [`softmax_rows_f32`]'s bits on rows of every kind (masks,
/// NaN, inf, huge values, all-equal rows, subnormal results: the rows it redoes included),
/// in groups of four rows and single rows; and `softmax_rows` (the dispatch, any length,
/// tails included) does too.
#[cfg(target_arch = "x86_64")]
#[test]
fn softmax_row_kernels_give_the_reference_bits() {
    use super::softmax_lanes;
    use super::{softmax_rows, softmax_rows_f32};
    type Rows = unsafe fn(&[f32], &mut [f32], usize);
    let avx512 = std::is_x86_feature_detected!("avx512f");
    let fma = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    let has = |f: &str| match f {
        "avx512f" => avx512,
        "avx512vl" => avx512 && fma && std::is_x86_feature_detected!("avx512vl"),
        _ => fma,
    };
    let kernels: [(&str, usize, Rows); 3] = [
        ("avx512f", 16, softmax_lanes::rows512),
        ("fma", 8, softmax_lanes::rows256),
        ("avx512vl", 8, softmax_lanes::rows256vl),
    ];
    for (feat, width, f) in kernels {
        if !has(feat) {
            eprintln!("skipped: no {feat}");
            continue;
        }
        for n in softmax_lengths(width) {
            for rows in [1, 3, 4, 5, 9, 28] {
                let x = softmax_rows_input(n, rows, (n * 31 + rows) as u64);
                let mut want = vec![0f32; x.len()];
                softmax_rows_f32(&x, &mut want, n);
                let mut got = vec![f32::NAN; x.len()];
                // SAFETY: the CPU has the features (checked); rows of n, a multiple of width.
                unsafe { f(&x, &mut got, n) };
                assert_same_bits(&got, &want, &format!("{feat} n {n} rows {rows}"));
            }
        }
    }
    for n in (1..=40).chain([100, 129, 1000]) {
        let x = softmax_rows_input(n, 6, n as u64);
        let mut want = vec![0f32; x.len()];
        softmax_rows_f32(&x, &mut want, n);
        let mut got = vec![f32::NAN; x.len()];
        softmax_rows(&x, &mut got, n);
        assert_same_bits(&got, &want, &format!("softmax_rows n {n}"));
    }
}

/// ReduceSum and ReduceMean of f32 over trailing axes take the rows four at a time
/// (`sum4_f32`): every output is still its row's lane sum alone (`sum_f32`, the bits of
/// one row at a time), for row counts around 4 and rows with and without a tail of 8, NaN,
/// ±inf and large terms among them; and within rounding of the sum in f64 in index order.
#[test]
fn f32_rows_in_fours_sum_as_each_row_alone() {
    for rows in [1usize, 3, 4, 5, 8, 9, 12, 16, 19, 34] {
        for k in [1usize, 7, 8, 9, 16, 49, 196, 1001] {
            let v: Vec<f32> = (0..rows * k)
                .map(|i| match (i % 97, rows) {
                    (13, 9) => f32::NAN,
                    (29, 34) => f32::INFINITY,
                    (31, 5) => f32::NEG_INFINITY,
                    (41, 8) => 3e38,
                    _ => ((i as f32) * 0.618).sin() * 3.0 + (i % 5) as f32,
                })
                .collect();
            // As [rows, k] over axis 1, and as a [1, rows, 1, k] plane (GlobalAveragePool's
            // ReduceMean over the last two axes).
            for (dims, axes) in [
                (vec![rows, k], vec![1usize]),
                (vec![1, rows, 1, k], vec![2, 3]),
            ] {
                let x = Tensor::from_f32(&dims, v.clone()).unwrap();
                for kind in [ReduceKind::Sum, ReduceKind::Mean] {
                    let got = reduce(&x, kind, &axes, false).unwrap();
                    let got = got.as_f32().unwrap();
                    assert_eq!(got.len(), rows);
                    for r in 0..rows {
                        let row = &v[r * k..(r + 1) * k];
                        let s = sum_f32(row);
                        let want = (if kind == ReduceKind::Mean {
                            s / k as f64
                        } else {
                            s
                        }) as f32;
                        let what = format!("{kind:?} rows {rows} k {k} dims {dims:?} row {r}");
                        assert!(
                            got[r].to_bits() == want.to_bits()
                                || (got[r].is_nan() && want.is_nan()),
                            "{what}: {} against {want}",
                            got[r]
                        );
                        let exact: f64 = row.iter().map(|&x| x as f64).sum();
                        let exact = if kind == ReduceKind::Mean {
                            exact / k as f64
                        } else {
                            exact
                        };
                        if exact.is_finite() && exact.abs() < 1e30 {
                            let scale: f64 = row.iter().map(|&x| (x as f64).abs()).sum();
                            assert!(
                                (got[r] as f64 - exact).abs() <= 1e-6 * scale.max(1.0),
                                "{what}"
                            );
                        } else {
                            assert_eq!(got[r].is_nan(), exact.is_nan(), "{what}");
                        }
                    }
                }
            }
        }
    }
}

/// 6000 pseudo-random terms (xorshift from `seed`) of magnitudes 10^-20 to 10^20, so that
/// f64 sums of them round and their order shows.
fn wide_range_terms(seed: u32) -> Vec<f32> {
    let mut r = seed;
    (0..6000)
        .map(|i| {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            let m = (r >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            m * 10f32.powi((i % 41) - 20)
        })
        .collect()
}

/// `sum8_f32`'s f64 sums are `sum_f32`'s (the plain `lane_sum`), bit for bit, as
/// [`sum4_f32_is_sum_f32_per_row_in_f64_bits`] checks for `sum4_f32`: terms over 40 orders
/// of magnitude, lengths with and without a tail, rows anywhere; and with -0, ±inf and NaN.
#[test]
fn sum8_f32_is_sum_f32_per_row_in_f64_bits() {
    let mut v = wide_range_terms(0x9e37_79b9);
    // Special values in rows that start at 3500 (-0 alone, -0 in a tail), 3600 (±inf),
    // 3700 (NaN).
    v[3500..3517].fill(-0.0);
    v[3600] = f32::INFINITY;
    v[3603] = f32::NEG_INFINITY;
    v[3708] = f32::NAN;
    for k in [0usize, 1, 5, 8, 15, 16, 17, 49, 63, 200, 1000] {
        for bases in [
            [0usize, 1, 2, 3, 4, 5, 6, 7],
            [7, 3000, 11, 1500, 2, 4999, 60, 61],
            [3500, 3600, 3700, 0, 3500, 3501, 4000, 4000],
        ] {
            let got = sum8_f32(&v, bases, k);
            for (g, &b) in got.iter().zip(&bases) {
                let row = &v[b..b + k];
                let want = super::lane_sum(row, |x| x as f64);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "k {k} base {b}: {g:e} against {want:e}"
                );
            }
        }
    }
}

/// `sum4_f32`'s f64 sums are `sum_f32`'s, bit for bit, on rows whose terms span 40 orders
/// of magnitude (so the f64 additions round and their order shows), any bases and lengths.
#[test]
fn sum4_f32_is_sum_f32_per_row_in_f64_bits() {
    let v = wide_range_terms(0x1234_5678);
    for k in [1usize, 5, 8, 15, 16, 17, 63, 200, 1000] {
        for bases in [[0usize, 1, 2, 3], [7, 3000, 11, 1500], [4000, 4000, 0, 999]] {
            let rows = bases.map(|b| &v[b..b + k]);
            // The dispatch, and each instruction set's copy this CPU runs.
            let mut runs = vec![("dispatch", sum4_f32(&v, bases, k))];
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx512f") {
                    runs.push(("avx512", unsafe { super::sum4_avx512(rows) }));
                }
                if is_x86_feature_detected!("avx2") {
                    runs.push(("avx2", unsafe { super::sum4_avx2(rows) }));
                }
            }
            for (isa, got) in runs {
                for (g, (&b, row)) in got.iter().zip(bases.iter().zip(rows)) {
                    // The definition's order: lane_sum, plain (no target features).
                    let want = super::lane_sum(row, |x| x as f64);
                    assert_eq!(sum_f32(row).to_bits(), want.to_bits(), "sum_f32 k {k}");
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{isa} k {k} base {b}: {g:e} against {want:e}"
                    );
                }
            }
        }
    }
}
