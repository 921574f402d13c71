//! The Softmax row kernel ([`super::softmax_rows`]' vector path), written once over
//! [`Lanes`] and compiled for AVX-512 (16 lanes) and AVX2 + FMA (8 lanes; AMD Zen 2, for
//! one): four rows at a time, each step (max, `x - m` and exp, the f64 sum, the division)
//! over the four rows in turn, so the max and sum chains of one row overlap the others'.
//! The same operations as [`softmax_rows_f32`] in the same order per element (the exp
//! polynomial of `fastmath::exp_clamped`, fused multiply-adds included: [`exp`]; the f64
//! sum in 8 lanes, chunk after chunk, then lane after lane), so the same bits on either
//! width. A row whose `x - m` leaves the exp's vector range anywhere other than below -104
//! (a NaN or an inf in the row, a subnormal result) is redone by [`softmax_rows_f32`].
//! Rows are f32, `n` long, a multiple of the lane width (the dispatch sends other lengths
//! to [`softmax_rows_f32`]).

use super::softmax_rows_f32;
use crate::kernels::fastmath::{EXP_HI, EXP_LO, EXP_ZERO_BELOW};
use crate::kernels::simd::{exp, Avx2, Avx512, Lanes};
use std::arch::x86_64::{_CMP_GE_OQ, _CMP_LE_OQ, _CMP_LT_OQ};

/// A group kernel: softmax of `R` rows from row `r`, the bits of rows to redo.
type Group = unsafe fn(&[f32], &mut [f32], usize, usize) -> u32;

/// Rows of `n` (a positive multiple of `S::N`) by [`group`] over `S`, each entry point
/// compiled with `S`'s features.
macro_rules! entry {
    ($(#[$m:meta])* $rows:ident, $group:ident, $s:ty, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $group<const R: usize>(
            src: &[f32],
            dst: &mut [f32],
            n: usize,
            r: usize,
        ) -> u32 {
            // SAFETY: the caller has the features; rows of n, a multiple of the width.
            unsafe { group::<$s, R>(src, dst, n, r) }
        }

        $(#[$m])*
        /// # Safety
        #[doc = concat!("The CPU must have ", $feat, "; `n` is a positive multiple of")]
        /// the lane width and `src`, `dst` hold whole rows of `n`.
        pub(super) unsafe fn $rows(src: &[f32], dst: &mut [f32], n: usize) {
            assert!(n.is_multiple_of(<$s as Lanes>::N));
            // SAFETY: the caller's contract (the features, rows of n).
            unsafe { rows_by(src, dst, n, $group::<4>, $group::<1>) }
        }
    };
}
entry!(
    /// [`group`] on AVX-512F, 16 lanes.
    rows512, group512, Avx512, "avx512f"
);
entry!(
    /// [`group`] on AVX2 + FMA, 8 lanes (the f64 sum's 8 lanes as two vectors of 4).
    rows256, group256, Avx2, "avx2,fma"
);
#[cfg(test)]
entry!(
    /// [`group`] on AVX-512VL, 8 lanes with mask registers (tests only: the kernel's
    /// bits do not depend on the lane type).
    rows256vl, group256vl, crate::kernels::simd::Avx512Y, "avx512f,avx512vl,fma"
);

/// Rows in groups of four (`g4`), then one by one (`g1`), each group's rows that left
/// the vector range redone by the reference kernel.
///
/// # Safety
/// `g4` and `g1` must be safe to call on this CPU for rows of `n` (a positive multiple
/// of their vector width); `src` and `dst` hold whole rows of `n`.
unsafe fn rows_by(src: &[f32], dst: &mut [f32], n: usize, g4: Group, g1: Group) {
    assert!(n > 0 && src.len() == dst.len() && src.len().is_multiple_of(n));
    let rows = src.len() / n;
    let mut r = 0;
    while r + 4 <= rows {
        let bad = unsafe { g4(src, dst, n, r) };
        redo(src, dst, n, r, bad);
        r += 4;
    }
    while r < rows {
        let bad = unsafe { g1(src, dst, n, r) };
        redo(src, dst, n, r, bad);
        r += 1;
    }
}

/// Rows `r..r + R` whose bit is set in `bad`, by the reference row kernel.
fn redo(src: &[f32], dst: &mut [f32], n: usize, r: usize, bad: u32) {
    for k in (0..32).filter(|k| bad >> k & 1 == 1) {
        let at = (r + k) * n..(r + k + 1) * n;
        softmax_rows_f32(&src[at.clone()], &mut dst[at], n);
    }
}

/// Softmax of rows `r..r + R`; bit k of the result is set when row `r + k` must be redone.
///
/// # Safety
/// The CPU must have `S`'s features; `n` is a positive multiple of `S::N`.
#[inline(always)]
unsafe fn group<S: Lanes, const R: usize>(src: &[f32], dst: &mut [f32], n: usize, r: usize) -> u32 {
    let s = &src[r * n..(r + R) * n];
    let d = &mut dst[r * n..(r + R) * n];
    let sp = s.as_ptr();
    let dp = d.as_mut_ptr();
    let nv = n / S::N;
    // SAFETY (every load and store below): vector k of row j is at j*n + N*k, inside
    // the R rows of `s` and `d` (k < nv = n / N); the rest are register operations.
    // (No closure calls a `Lanes` method: a closure does not take the entry point's
    // `#[target_feature]`.)
    let at = |j: usize, k: usize| j * n + S::N * k;
    unsafe {
        // The row maxima (`maxps` is order-free: a NaN or inf in the row makes some
        // `x - m` leave the range below, and the row is redone).
        let mut mx = [S::splat(f32::NEG_INFINITY); R];
        for k in 0..nv {
            for (j, m) in mx.iter_mut().enumerate() {
                *m = S::max(*m, S::load(sp.add(at(j, k))));
            }
        }
        let mut m = mx;
        for v in m.iter_mut() {
            *v = S::splat(S::hmax(*v));
        }
        // d = x - m, e = exp(d) (+0 below -104), stored in `dst`.
        let (lo, hi, zero_below) = (S::splat(EXP_LO), S::splat(EXP_HI), S::splat(EXP_ZERO_BELOW));
        let mut redo = 0u32;
        for (j, &mj) in m.iter().enumerate() {
            let mut bad = S::range(0, 0);
            for k in 0..nv {
                let dv = S::sub(S::load(sp.add(at(j, k))), mj);
                let low = S::cmp::<_CMP_LT_OQ>(dv, zero_below);
                let inside = S::and_m(S::cmp::<_CMP_GE_OQ>(dv, lo), S::cmp::<_CMP_LE_OQ>(dv, hi));
                bad = S::or_m(bad, S::not_m(S::or_m(low, inside)));
                let e = S::zero_off(exp::<S>(dv), S::not_m(low));
                S::store(dp.add(at(j, k)), e);
            }
            redo |= u32::from(S::any(bad)) << j;
        }
        // The f64 sums: 8 lanes, chunk after chunk (`lane_sum`'s order).
        // (Summing in the exp loop above, one row's chains at a time, ran slower.)
        let mut acc = [S::zero_d(); R];
        for k in 0..nv {
            for (j, a) in acc.iter_mut().enumerate() {
                for i in 0..S::N / 8 {
                    *a = S::add8_d(*a, dp.add(at(j, k) + 8 * i));
                }
            }
        }
        let mut sum = [S::splat(0.0); R];
        for (s, a) in sum.iter_mut().zip(acc) {
            // `lane_sum`: the lanes in order, then its (empty) tail.
            let lanes = S::lanes_d(a);
            let t = lanes.iter().sum::<f64>() + std::iter::empty::<f64>().sum::<f64>();
            *s = S::splat(t as f32);
        }
        for (j, s) in sum.iter().enumerate() {
            for k in 0..nv {
                let p = dp.add(at(j, k));
                S::store(p, S::div(S::load(p), *s));
            }
        }
        redo
    }
}
