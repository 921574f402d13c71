//! Several f32 rows summed at once (ReduceSum/ReduceMean over trailing axes, and so
//! GlobalAveragePool): [`sum4_f32`] (four rows; AVX-512, AVX2, plain) and [`sum8_f32`]
//! (eight, AVX-512), each row's sum the bits of [`lane_sum`] on it alone.

use super::lane_sum;

/// Rows summed together by [`sum4_f32`].
pub(super) const SUM_ROWS: usize = 4;

/// [`sum_f32`](super::sum_f32) of each of `SUM_ROWS` rows of `k` elements starting at
/// `bases` in `v`, the same bits: each row's sum in [`lane_sum`]'s order (8 f64 lanes, lane
/// j adding elements j, j+8, ...; then the lanes in order, then the tail), with the four
/// rows' lanes as independent chains. One row's 8 lanes are one chain of f64 adds (4 cycles
/// per 8 elements), which bound GlobalAveragePool (EfficientNet-B0's SE blocks,
/// bench/NOTES.md §32, §36); four rows at a time run four chains. Panics (slice bounds) if
/// a row is not inside `v`.
pub(crate) fn sum4_f32(v: &[f32], bases: [usize; SUM_ROWS], k: usize) -> [f64; SUM_ROWS] {
    let rows = bases.map(|b| &v[b..b + k]);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::fastmath::{isa, Isa};
        // SAFETY: the CPU has these features (checked at run time by `isa`).
        match isa() {
            Isa::Avx512 => return unsafe { sum4_avx512(rows) },
            Isa::Avx2 => return unsafe { sum4_avx2(rows) },
            Isa::Plain => {}
        }
    }
    rows.map(|r| lane_sum(r, |x| x as f64))
}

/// The lanes of [`sum4_f32`]'s rows (`acc[r]`, as [`lane_sum`] holds them after its whole
/// chunks of 8) summed as [`lane_sum`] sums them, with each row's tail.
fn finish_lanes(acc: [[f64; 8]; SUM_ROWS], rows: [&[f32]; SUM_ROWS]) -> [f64; SUM_ROWS] {
    let mut out = [0f64; SUM_ROWS];
    for ((o, a), row) in out.iter_mut().zip(&acc).zip(rows) {
        let tail: f64 = row[row.len() / 8 * 8..].iter().map(|&x| x as f64).sum();
        *o = a.iter().sum::<f64>() + tail;
    }
    out
}

/// Each row's 8 f64 lanes as [`lane_sum`] holds them after its whole chunks of 8 (lane j
/// the sum of elements j, j+8, ... from +0), one zmm per row: the loop of [`sum4_avx512`]
/// and [`sum8_avx512`], the rows' chains independent.
///
/// # Safety
/// The CPU has AVX-512F; the rows have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn lanes_avx512<const N: usize>(rows: [&[f32]; N]) -> [std::arch::x86_64::__m512d; N] {
    use std::arch::x86_64::*;
    let whole = rows[0].len() / 8 * 8;
    let p = rows.map(<[f32]>::as_ptr);
    let mut acc = [_mm512_setzero_pd(); N];
    let mut i = 0;
    // SAFETY: i + 8 <= whole <= each row's length.
    unsafe {
        while i < whole {
            for r in 0..N {
                let x = _mm512_cvtps_pd(_mm256_loadu_ps(p[r].add(i)));
                acc[r] = _mm512_add_pd(acc[r], x);
            }
            i += 8;
        }
    }
    acc
}

/// [`sum4_f32`] on AVX-512F: each row's 8 lanes in one zmm of f64.
///
/// # Safety
/// The CPU has AVX-512F; the rows have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum4_avx512(rows: [&[f32]; SUM_ROWS]) -> [f64; SUM_ROWS] {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    let acc = unsafe { lanes_avx512(rows) };
    let mut lanes = [[0f64; 8]; SUM_ROWS];
    for (l, a) in lanes.iter_mut().zip(acc) {
        // SAFETY: 8 f64 into an [f64; 8].
        unsafe { _mm512_storeu_pd(l.as_mut_ptr(), a) };
    }
    finish_lanes(lanes, rows)
}

/// [`sum4_f32`] on AVX2: each row's 8 lanes in two ymm of f64 (lanes 0-3, 4-7).
///
/// # Safety
/// The CPU has AVX2; the rows have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn sum4_avx2(rows: [&[f32]; SUM_ROWS]) -> [f64; SUM_ROWS] {
    use std::arch::x86_64::*;
    let whole = rows[0].len() / 8 * 8;
    let p = rows.map(<[f32]>::as_ptr);
    let mut lo = [_mm256_setzero_pd(); SUM_ROWS];
    let mut hi = [_mm256_setzero_pd(); SUM_ROWS];
    let mut i = 0;
    // SAFETY: i + 8 <= whole <= each row's length.
    unsafe {
        while i < whole {
            for r in 0..SUM_ROWS {
                lo[r] = _mm256_add_pd(lo[r], _mm256_cvtps_pd(_mm_loadu_ps(p[r].add(i))));
                hi[r] = _mm256_add_pd(hi[r], _mm256_cvtps_pd(_mm_loadu_ps(p[r].add(i + 4))));
            }
            i += 8;
        }
    }
    let mut lanes = [[0f64; 8]; SUM_ROWS];
    for (l, (a, b)) in lanes.iter_mut().zip(lo.into_iter().zip(hi)) {
        // SAFETY: 4 + 4 f64 into an [f64; 8].
        unsafe {
            _mm256_storeu_pd(l.as_mut_ptr(), a);
            _mm256_storeu_pd(l.as_mut_ptr().add(4), b);
        }
    }
    finish_lanes(lanes, rows)
}

/// Rows summed together by [`sum8_f32`].
pub(super) const SUM8_ROWS: usize = 8;

/// Whether [`sum8_f32`] runs on this CPU (AVX-512F; `RLX_CPU_ISA` caps it).
#[cfg(target_arch = "x86_64")]
pub(super) fn sum8_on() -> bool {
    use crate::kernels::fastmath::{isa, Isa};
    matches!(isa(), Isa::Avx512)
}

/// Whether [`sum8_f32`] runs on this CPU: never off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn sum8_on() -> bool {
    false
}

/// [`sum_f32`](super::sum_f32) of each of eight rows of `k` elements starting at `bases` in
/// `v`, the same bits, on AVX-512F (callers check [`sum8_on`]; elsewhere the rows one at a
/// time). As [`sum4_f32`], with the end of each row's sum in vectors too: the eight rows'
/// lane vectors transposed in registers (vector `j` then holds lane `j` of every row),
/// added lane 0 to 7 in order, then each row's tail summed in order and added, as
/// [`lane_sum`] does per row. [`sum4_f32`]'s scalar end was a third of a 7² plane's
/// GlobalAveragePool (EfficientNet-B0's SE blocks). Panics (slice bounds) if a row is not
/// inside `v`.
pub(crate) fn sum8_f32(v: &[f32], bases: [usize; SUM8_ROWS], k: usize) -> [f64; SUM8_ROWS] {
    let rows = bases.map(|b| &v[b..b + k]);
    #[cfg(target_arch = "x86_64")]
    if sum8_on() {
        // SAFETY: the CPU has AVX-512F (`sum8_on`).
        return unsafe { sum8_avx512(rows) };
    }
    rows.map(|r| lane_sum(r, |x| x as f64))
}

/// [`sum8_f32`] on AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F; the rows have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum8_avx512(rows: [&[f32]; SUM8_ROWS]) -> [f64; SUM8_ROWS] {
    use std::arch::x86_64::*;
    let k = rows[0].len();
    let whole = k / 8 * 8;
    let p = rows.map(<[f32]>::as_ptr);
    // SAFETY: the caller's contract; below, indices below k.
    unsafe {
        let a = lanes_avx512(rows);
        // 8×8 transpose: row r's lanes a[r] into c[j] = (a[0][j], ..., a[7][j]).
        let t = |x: __m512d, y: __m512d| (_mm512_unpacklo_pd(x, y), _mm512_unpackhi_pd(x, y));
        let (t0, t1) = t(a[0], a[1]);
        let (t2, t3) = t(a[2], a[3]);
        let (t4, t5) = t(a[4], a[5]);
        let (t6, t7) = t(a[6], a[7]);
        let q = |x: __m512d, y: __m512d| {
            (
                _mm512_shuffle_f64x2::<0x88>(x, y),
                _mm512_shuffle_f64x2::<0xDD>(x, y),
            )
        };
        let (u0, u1) = q(t0, t2);
        let (u2, u3) = q(t1, t3);
        let (u4, u5) = q(t4, t6);
        let (u6, u7) = q(t5, t7);
        let (c0, c4) = q(u0, u4);
        let (c2, c6) = q(u1, u5);
        let (c1, c5) = q(u2, u6);
        let (c3, c7) = q(u3, u7);
        // Lanes 0..7 in order (lane_sum's `acc.iter().sum()`: its start, ±0, leaves
        // lane 0 as it is, and no lane is -0: each starts at +0).
        let mut s = c0;
        for c in [c1, c2, c3, c4, c5, c6, c7] {
            s = _mm512_add_pd(s, c);
        }
        // The tails: each row's elements in order, then added to its lanes' sum.
        if whole < k {
            let col = |j: usize| {
                let e: [f64; SUM8_ROWS] = std::array::from_fn(|r| *p[r].add(j) as f64);
                _mm512_loadu_pd(e.as_ptr())
            };
            let mut tail = col(whole);
            for j in whole + 1..k {
                tail = _mm512_add_pd(tail, col(j));
            }
            s = _mm512_add_pd(s, tail);
        }
        let mut out = [0f64; SUM8_ROWS];
        _mm512_storeu_pd(out.as_mut_ptr(), s);
        out
    }
}
