//! Unit tests of `pool.rs`'s SIMD MaxPool kernels (`max2d`); the op's definition tests
//! are in `rlx-cpu/tests/kernels_math.rs`.

#![cfg(target_arch = "x86_64")]

use super::max2d::{self, Geo};

/// Planes for 3×3 stride-2 MaxPool: every height and width to 40 and some wider, pads 0
/// to 2 before and 0 to 1 after (so `ceil_mode`-like windows that leave the image too).
fn k3s2_geometries() -> Vec<Geo> {
    let mut gs = vec![];
    for h in [1, 2, 3, 4, 5, 7, 8, 13, 20] {
        for w in (1..=40).chain([47, 56, 63, 64, 65, 112, 113]) {
            for (pt, pl, pb, pr) in (0..36).map(|i| (i % 3, i / 3 % 3, i / 9 % 2, i / 18)) {
                if h + pt + pb < 3 || w + pl + pr < 3 {
                    continue;
                }
                gs.push(Geo {
                    h,
                    w,
                    oh: (h + pt + pb - 3) / 2 + 1,
                    ow: (w + pl + pr - 3) / 2 + 1,
                    kh: 3,
                    kw: 3,
                    sh: 2,
                    sw: 2,
                    pt,
                    pl,
                });
            }
        }
    }
    gs
}

/// A plane of `g` from an LCG: small integers (so ties), ±0, ±inf, and with `nan`, one
/// NaN (of a varying payload) at a varying place.
fn k3s2_plane(g: &Geo, seed: u64, nan: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let mut v: Vec<f32> = (0..g.h * g.w)
        .map(|_| match next() % 16 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NEG_INFINITY,
            3 if next() % 8 == 0 => f32::INFINITY,
            k => (k as f32 - 9.0) * 0.5,
        })
        .collect();
    if nan {
        let at = next() % v.len();
        v[at] = [
            f32::NAN,
            f32::from_bits(0xffc0_0001),
            f32::from_bits(0x7f80_0001),
        ][next() % 3];
    }
    v
}

/// The definition: each window's taps in window order, `e > acc ? e : acc` from -inf
/// (the first of equal maxima wins); and whether any window holds a NaN.
fn k3s2_reference(src: &[f32], g: &Geo) -> (Vec<f32>, bool) {
    let mut out = vec![0f32; g.oh * g.ow];
    let mut nan = false;
    for oy in 0..g.oh {
        for ox in 0..g.ow {
            let mut acc = f32::NEG_INFINITY;
            for ky in 0..3 {
                for kx in 0..3 {
                    let (y, x) = (
                        (2 * oy + ky) as isize - g.pt as isize,
                        (2 * ox + kx) as isize - g.pl as isize,
                    );
                    if y < 0 || x < 0 || y >= g.h as isize || x >= g.w as isize {
                        continue;
                    }
                    let e = src[y as usize * g.w + x as usize];
                    nan |= e.is_nan();
                    acc = if e > acc { e } else { acc };
                }
            }
            out[oy * g.ow + ox] = acc;
        }
    }
    (out, nan)
}

type K3s2 = unsafe fn(&[f32], &mut [f32], &Geo) -> bool;

/// The 3×3 stride-2 kernels of the CPU (AVX-512, AVX2).
fn k3s2_kernels() -> Vec<(&'static str, K3s2)> {
    let mut ks: Vec<(&'static str, K3s2)> = vec![];
    if std::is_x86_feature_detected!("avx512f") {
        ks.push(("avx512", max2d::k3s2_avx512));
    }
    if std::is_x86_feature_detected!("avx2") {
        ks.push(("avx2", max2d::k3s2_avx2));
    }
    ks
}

/// On every geometry, each instantiation of the 3×3 stride-2 kernel gives the definition's
/// bits (ties between ±0 included) when no window holds a NaN, and says so (returns true);
/// when a window holds one, it returns false.
#[test]
fn max_pool_k3s2_kernels_are_the_definition() {
    let ks = k3s2_kernels();
    assert!(!ks.is_empty() || !std::is_x86_feature_detected!("avx2"));
    for (i, g) in k3s2_geometries().iter().enumerate() {
        for nan in [false, true] {
            let x = k3s2_plane(g, i as u64, nan);
            let (want, has_nan) = k3s2_reference(&x, g);
            for &(name, f) in &ks {
                let mut got = vec![f32::NAN; g.oh * g.ow];
                // SAFETY: the CPU has the kernel's features (checked); `g` is 3×3 stride 2.
                let clean = unsafe { f(&x, &mut got, g) };
                let at = format!("{name} {}x{} pads {} {} nan {nan}", g.h, g.w, g.pt, g.pl);
                if has_nan {
                    assert!(!clean, "{at}: a NaN tap not seen");
                } else if clean {
                    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{at}: output {k}");
                    }
                } else {
                    // A NaN outside every window but in a column read: only a redo.
                    assert!(nan, "{at}: not clean without a NaN");
                }
            }
        }
    }
}

/// TEMPORARY (removed with the former kernels): the generic kernel against the former
/// per-width copies (`plane_k3s2`, `plane_k3s2_avx2`): the same bits in `dst` and the same
/// answer, NaN planes included.
#[test]
fn k3s2_is_the_former_kernels_bits() {
    let mut pairs: Vec<(&str, K3s2, K3s2)> = vec![];
    if std::is_x86_feature_detected!("avx512f") {
        pairs.push(("avx512", max2d::plane_k3s2, max2d::k3s2_avx512));
    }
    if std::is_x86_feature_detected!("avx2") {
        pairs.push(("avx2", max2d::plane_k3s2_avx2, max2d::k3s2_avx2));
    }
    assert!(!pairs.is_empty());
    let (mut planes, mut outputs, mut unclean) = (0usize, 0usize, 0usize);
    for (i, g) in k3s2_geometries().iter().enumerate() {
        for nan in [false, true] {
            for seed in 0..2u64 {
                let x = k3s2_plane(g, i as u64 * 7 + seed, nan);
                for &(name, old, new) in &pairs {
                    let mut a = vec![0f32; g.oh * g.ow];
                    let mut b = vec![1f32; g.oh * g.ow];
                    // SAFETY: features checked above; `g` is 3×3 stride 2.
                    let (ca, cb) = unsafe { (old(&x, &mut a, g), new(&x, &mut b, g)) };
                    let at = format!("{name} {}x{} pads {} {} nan {nan}", g.h, g.w, g.pt, g.pl);
                    assert_eq!(ca, cb, "{at}: clean");
                    for (k, (p, q)) in a.iter().zip(&b).enumerate() {
                        assert_eq!(p.to_bits(), q.to_bits(), "{at}: output {k}");
                    }
                    planes += 1;
                    outputs += a.len();
                    unclean += usize::from(!ca);
                }
            }
        }
    }
    eprintln!("{planes} planes ({unclean} with a NaN seen), {outputs} outputs: identical");
}

/// TEMPORARY: the former kernels and the generic one timed, interleaved (release,
/// `--ignored --nocapture`, pinned to one core).
#[test]
#[ignore]
fn k3s2_timing() {
    use std::time::Instant;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let kernels: [(&str, K3s2); 4] = [
        ("old512", max2d::plane_k3s2),
        ("new512", max2d::k3s2_avx512),
        ("old256", max2d::plane_k3s2_avx2),
        ("new256", max2d::k3s2_avx2),
    ];
    // ResNet's stem pool (112 → 56, pad 1), SqueezeNet's (111 → 55, no pad), smaller planes.
    for (h, p, planes) in [
        (112usize, 1usize, 16usize),
        (111, 0, 16),
        (28, 1, 64),
        (14, 0, 256),
    ] {
        let o = (h + 2 * p - 3) / 2 + 1;
        let g = Geo {
            h,
            w: h,
            oh: o,
            ow: o,
            kh: 3,
            kw: 3,
            sh: 2,
            sw: 2,
            pt: p,
            pl: p,
        };
        let x: Vec<f32> = (0..planes * h * h)
            .map(|i| (i * 7919 % 1013) as f32 - 500.0)
            .collect();
        let mut y = vec![0f32; planes * o * o];
        let reps = 20;
        let mut rounds: Vec<Vec<f64>> = vec![vec![]; kernels.len()];
        let mut best = vec![f64::INFINITY; kernels.len()];
        for _round in 0..5 {
            for (k, &(_, f)) in kernels.iter().enumerate() {
                let mut samples = vec![];
                for _ in 0..11 {
                    let t = Instant::now();
                    for _ in 0..reps {
                        for (s, d) in x.chunks(h * h).zip(y.chunks_mut(o * o)) {
                            // SAFETY: AVX-512F and AVX2 on the timing machine.
                            unsafe { f(std::hint::black_box(s), d, &g) };
                        }
                    }
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
                }
                best[k] = samples.iter().fold(best[k], |a, &b| a.min(b));
                rounds[k].push(median(samples));
            }
        }
        let line: Vec<String> = kernels
            .iter()
            .zip(rounds.into_iter().zip(&best))
            .map(|(&(name, _), (r, b))| format!("{name} {:.1}us (min {b:.1})", median(r)))
            .collect();
        println!(
            "maxpool 3x3s2 {h}x{h} pad {p} x{planes}: {}",
            line.join("  ")
        );
    }
}
