//! Sigmoid and SiLU over [`Lanes`] (AVX-512 and AVX2 + FMA): the bits of
//! [`super::sigmoid_slice_generic`] (and of its product with `x`, SiLU), without the
//! divider.
//!
//! The same operations as the generic loop, per lane: `e = exp(-x)` ([`simd::exp_neg`], op
//! for op: on AVX-512 its table lookups are `vpermps` and its `2^floor(m)` scaling one
//! `vscalefps`, the same bits), `1 / (1 + e)` by
//! the divider, and for SiLU the bias sum before and the product with `x` after, in one
//! pass over the data with four independent vectors per step. Lanes outside the exp range
//! (`x < -87`, where the result is subnormal or 0, and NaN) are redone with the scalar
//! `Activation::Sigmoid.apply_f32`, as the generic loop does. (EfficientNet-B0 spends about
//! a fifth of its run here; the compiler's version of the generic loop, with separate bias
//! and product passes, was 15-25% slower per element, bench/NOTES.md §32. A reciprocal
//! from `rcp14` and Newton steps, exact to the division's bits, was slower still: the
//! core issues 512-bit operations on two ports, and the divider is not what binds.)

use super::EXP_LO;
use crate::kernels::simd::{self, Avx2, Avx512, Lanes};
use std::arch::x86_64::_CMP_NGE_UQ;

/// `sigmoid(x)` per lane, and the lanes to redo in scalar (`!(x >= EXP_LO)`: below the exp
/// range, or NaN).
#[inline(always)]
unsafe fn logistic<S: Lanes>(x: S::V) -> (S::V, S::M) {
    // SAFETY: register operations only; the caller has `S`'s features.
    unsafe {
        let e = simd::exp_neg::<S>(x);
        let y = S::div(S::splat(1.0), S::add(S::splat(1.0), e));
        (y, S::cmp::<_CMP_NGE_UQ>(x, S::splat(EXP_LO)))
    }
}

/// The scalar value of a lane the vector pass does not cover (see the module docs).
fn sigmoid_scalar(x: f32) -> f32 {
    rlx_ir::Activation::Sigmoid.apply_f32(x)
}

/// Vectors per step of the main loops: independent chains for the out-of-order core (one
/// vector at a time left the exp's and the division's latency exposed).
const U: usize = 4;

/// `dst[i] = sigmoid(src[i])` for `i < src.len()` (`dst` at least as long).
// `!(x >= EXP_LO)` is meant: true for NaN too (which the scalar definition takes).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
unsafe fn sigmoid<S: Lanes>(src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: every access is below `n` (steps of U whole vectors, then one vector at a time
    // through a mask); the caller has `S`'s features.
    unsafe {
        let fix = |i0: usize, i1: usize| {
            for j in i0..i1 {
                if !(*sp.add(j) >= EXP_LO) {
                    *dp.add(j) = sigmoid_scalar(*sp.add(j));
                }
            }
        };
        let mut i = 0;
        while i + U * S::N <= n {
            let mut any = S::range(0, 0);
            for u in 0..U {
                let (y, bad) = logistic::<S>(S::load(sp.add(i + u * S::N)));
                S::store(dp.add(i + u * S::N), y);
                any = S::or_m(any, bad);
            }
            if S::any(any) {
                fix(i, i + U * S::N);
            }
            i += U * S::N;
        }
        while i < n {
            let m = S::range(0, n - i);
            let (y, bad) = logistic::<S>(S::load_m(sp.add(i), m));
            S::store_m(dp.add(i), y, m);
            if S::any(S::and_m(bad, m)) {
                fix(i, (i + S::N).min(n));
            }
            i += S::N;
        }
    }
}

/// `v[i] = x · sigmoid(x)` with `x = v[i] + b` (`x = v[i]` without `b`): the bias sum, the
/// sigmoid and the f32 product of the unfused ops, in one pass. Returns the largest
/// `|x|` bits (as `wide::max_abs_bits` folds them: NaN's above +inf's) when `seen`, else 0.
#[inline(always)]
// `!(x >= EXP_LO)` is meant: true for NaN too; `u` indexes several arrays at once.
#[allow(clippy::neg_cmp_op_on_partial_ord, clippy::needless_range_loop)]
unsafe fn silu<S: Lanes>(v: &mut [f32], b: Option<f32>, seen: bool) -> u32 {
    let n = v.len();
    let p = v.as_mut_ptr();
    // SAFETY: every access is below `n` (steps of U whole vectors, then one vector at a time
    // through a mask); the caller has `S`'s features.
    unsafe {
        let mut acc = S::splat(0.0);
        let bv = S::splat(b.unwrap_or(0.0));
        // The lanes [i, i + len) after the vector pass (`x` their inputs): the scalar value
        // where the exp range does not hold.
        let fix = |i: usize, xs: &[f32]| {
            for (j, &xj) in xs.iter().enumerate() {
                if !(xj >= EXP_LO) {
                    *p.add(i + j) = xj * sigmoid_scalar(xj);
                }
            }
        };
        let mut i = 0;
        while i + U * S::N <= n {
            let mut x = [S::splat(0.0); U];
            let mut y = [S::splat(0.0); U];
            let mut bad = [S::range(0, 0); U];
            for u in 0..U {
                x[u] = S::load(p.add(i + u * S::N));
                if b.is_some() {
                    x[u] = S::add(x[u], bv);
                }
                if seen {
                    acc = S::max_abs_bits(acc, x[u]);
                }
            }
            for u in 0..U {
                (y[u], bad[u]) = logistic::<S>(x[u]);
                S::store(p.add(i + u * S::N), S::mul(x[u], y[u]));
            }
            let any = bad.iter().fold(S::range(0, 0), |a, &m| S::or_m(a, m));
            if S::any(any) {
                let mut xs = [0f32; 64];
                for u in 0..U {
                    S::store(xs.as_mut_ptr().add(u * S::N), x[u]);
                }
                fix(i, &xs[..U * S::N]);
            }
            i += U * S::N;
        }
        while i < n {
            let m = S::range(0, n - i);
            let mut x = S::load_m(p.add(i), m);
            if b.is_some() {
                x = S::add(x, bv);
            }
            if seen {
                acc = S::max_abs_bits(acc, S::zero_off(x, m));
            }
            let (y, bad) = logistic::<S>(x);
            S::store_m(p.add(i), S::mul(x, y), m);
            if S::any(S::and_m(bad, m)) {
                let mut xs = [0f32; 16];
                S::store(xs.as_mut_ptr(), x);
                fix(i, &xs[..(n - i).min(S::N)]);
            }
            i += S::N;
        }
        if seen {
            S::hmax_bits(acc)
        } else {
            0
        }
    }
}

/// [`sigmoid`] on AVX-512F (16 lanes).
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn sigmoid512(src: &[f32], dst: &mut [f32]) {
    unsafe { sigmoid::<Avx512>(src, dst) }
}

/// [`sigmoid`] on AVX2 + FMA (8 lanes).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sigmoid256(src: &[f32], dst: &mut [f32]) {
    unsafe { sigmoid::<Avx2>(src, dst) }
}

/// [`silu`] on AVX-512F (16 lanes).
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn silu512(v: &mut [f32], b: Option<f32>, seen: bool) -> u32 {
    unsafe { silu::<Avx512>(v, b, seen) }
}

/// [`silu`] on AVX2 + FMA (8 lanes).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu256(v: &mut [f32], b: Option<f32>, seen: bool) -> u32 {
    unsafe { silu::<Avx2>(v, b, seen) }
}
