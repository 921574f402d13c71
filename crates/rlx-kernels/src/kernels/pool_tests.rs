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
