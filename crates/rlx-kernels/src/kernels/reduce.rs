//! Reductions and scans: Reduce, ArgReduce, CumSum, Softmax, LogSoftmax.
//!
//! The unit tests are in `reduce_tests.rs`.

use super::wide::{as_f32, is_f32};
use super::{fill_chunks, invalid, make, map_float, par_worth, strides, Elem, KResult};
use num_traits::Float;
use rayon::prelude::*;
use rlx_ir::{ReduceKind, Shape, Tensor, TensorData};

/// Offsets (in the input) of every point of the sub-index space spanned by `(size, stride)`
/// pairs, in row-major order.
fn offsets(sub: &[(usize, usize)]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for &(n, s) in sub {
        let mut next = Vec::with_capacity(offs.len() * n);
        for &o in &offs {
            for j in 0..n {
                next.push(o + j * s);
            }
        }
        offs = next;
    }
    offs
}

/// The input offsets one output reads, relative to its base.
enum Offs {
    /// `0..k`: the reduced axes are the trailing ones (a contiguous run per output).
    Run(usize),
    /// Any other set, listed (at most as many as the elements one output reduces).
    List(Vec<usize>),
}

impl Offs {
    fn len(&self) -> usize {
        match self {
            Offs::Run(k) => *k,
            Offs::List(l) => l.len(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let (run, list) = match self {
            Offs::Run(k) => (0..*k, &[][..]),
            Offs::List(l) => (0..0, &l[..]),
        };
        run.chain(list.iter().copied())
    }
}

/// `Some(k)` when the `(size, stride)` pairs span exactly the offsets `0..k` in row-major
/// order (size-1 axes aside), with k > 0.
fn run_len(sub: &[(usize, usize)]) -> Option<usize> {
    let mut k = 1;
    for &(n, s) in sub.iter().rev() {
        if n == 1 {
            continue;
        }
        if n == 0 || s != k {
            return None;
        }
        k *= n;
    }
    Some(k)
}

struct Plan {
    bases: Vec<usize>,
    offs: Offs,
    out_dims: Vec<usize>,
}

fn plan(dims: &[usize], axes: &[usize], keepdims: bool) -> KResult<Plan> {
    let st = strides(dims);
    if let Some(&a) = axes.iter().find(|&&a| a >= dims.len()) {
        return invalid(format!(
            "reduce: axis {a} out of range for rank {}",
            dims.len()
        ));
    }
    let mut kept = vec![];
    let mut red = vec![];
    let mut out_dims = vec![];
    for (i, &d) in dims.iter().enumerate() {
        if axes.contains(&i) {
            red.push((d, st[i]));
            if keepdims {
                out_dims.push(1);
            }
        } else {
            kept.push((d, st[i]));
            out_dims.push(d);
        }
    }
    Ok(Plan {
        bases: offsets(&kept),
        // A trailing run is not listed: a reduction over all of a large tensor would
        // otherwise list one offset per element (ReduceMax over 12.5 M elements: 69 ms,
        // most of it the list's allocation and page faults; onnxruntime 4 ms).
        offs: match run_len(&red) {
            Some(k) => Offs::Run(k),
            None => Offs::List(offsets(&red)),
        },
        out_dims,
    })
}

fn map_bases<O: Send>(
    bases: &[usize],
    work: usize,
    f: impl Fn(usize) -> O + Sync + Send,
) -> Vec<O> {
    if par_worth(work) && bases.len() > 1 {
        bases.par_iter().map(|&b| f(b)).collect()
    } else {
        bases.iter().map(|&b| f(b)).collect()
    }
}

/// Sum of a contiguous row in f64, in 8 independent lanes (lane j adds elements j, j+8,
/// ...; then the lanes, then the tail), so the loop vectorizes.
#[inline(always)]
fn lane_sum<T: Copy>(row: &[T], wide: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let mut ch = row.chunks_exact(8);
    for c in ch.by_ref() {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += wide(x);
        }
    }
    let tail: f64 = ch.remainder().iter().map(|&x| wide(x)).sum();
    acc.iter().sum::<f64>() + tail
}

/// Max (`max`) or Min of a contiguous row in 8 independent lanes (a select per lane
/// vectorizes to max/min instructions); NaN is tracked on the side, so the lanes never see
/// one decide a comparison. NaN if any element is NaN; the identity (∓inf) for an empty row.
#[inline(always)]
fn lane_extreme<T: Float>(row: &[T], max: bool) -> T {
    // One loop body per direction, so the comparison is fixed inside the vector loop.
    if max {
        lanes_extreme::<T, true>(row)
    } else {
        lanes_extreme::<T, false>(row)
    }
}

#[inline(always)]
fn lanes_extreme<T: Float, const MAX: bool>(row: &[T]) -> T {
    let init = if MAX {
        T::neg_infinity()
    } else {
        T::infinity()
    };
    let better = |x: T, a: T| if MAX { x > a } else { x < a };
    let mut lanes = [init; 16];
    let mut nans = [false; 16];
    let mut ch = row.chunks_exact(16);
    for c in ch.by_ref() {
        for ((a, n), &x) in lanes.iter_mut().zip(nans.iter_mut()).zip(c) {
            *n |= x.is_nan();
            *a = if better(x, *a) { x } else { *a };
        }
    }
    let mut nan = nans.iter().any(|&n| n);
    let mut acc = init;
    for &x in lanes.iter().chain(ch.remainder()) {
        nan |= x.is_nan();
        acc = if better(x, acc) { x } else { acc };
    }
    if nan {
        T::nan()
    } else {
        acc
    }
}

isa_fn!(
    /// [`lane_sum`] of f32, compiled for the widest ISA.
    pub(crate) fn sum_f32[](row: &[f32]) -> f64 {
        lane_sum(row, |x| x as f64)
    }
);

mod row_sums;
#[cfg(all(test, target_arch = "x86_64"))]
use row_sums::{sum4_avx2, sum4_avx512};
use row_sums::{sum4_f32, sum8_f32, sum8_on, SUM8_ROWS, SUM_ROWS};

/// Max (`max`) or Min of an f32 row: NaN if any element is NaN, the identity (∓inf) for an
/// empty row; the result is the row's extreme value, and of equal extremes (±0) one of them.
/// On x86-64 with AVX2 by [`extreme_avx2`], else by [`lane_extreme`].
pub(crate) fn extreme_f32(row: &[f32], max: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        use super::fastmath::{isa, Isa};
        if !matches!(isa(), Isa::Plain) {
            // SAFETY: the CPU has AVX2 (`isa`, checked at run time).
            return unsafe {
                if max {
                    extreme_avx2::<true>(row)
                } else {
                    extreme_avx2::<false>(row)
                }
            };
        }
    }
    lane_extreme(row, max)
}

/// [`extreme_f32`] on AVX2: four vectors of 8 lanes (32 elements per step, so four
/// independent `max` chains), each lane `vmaxps(x, lane)` (`x > lane ? x : lane`, which
/// never lets a NaN into a lane); NaN is seen through the largest `|x|` bits, an integer
/// max (NaN's exceed +inf's `0x7f80_0000`). The elements after the last whole step go
/// through [`lane_extreme`]'s select. ReduceMax over 2^20 f32 held in L3, 1 thread: 168 →
/// 66 µs against onnxruntime's 85 (bench/NOTES.md §25; the autovectorized 16-lane fold
/// packed its NaN flags to bytes every vector).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn extreme_avx2<const MAX: bool>(row: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let init = if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let pick = |x: __m256, a: __m256| {
        if MAX {
            _mm256_max_ps(x, a)
        } else {
            _mm256_min_ps(x, a)
        }
    };
    let abs = _mm256_set1_epi32(0x7fff_ffff);
    let mut acc = [_mm256_set1_ps(init); 4];
    let mut bits = [_mm256_setzero_si256(); 4];
    let mut ch = row.chunks_exact(32);
    for c in ch.by_ref() {
        for (j, (a, b)) in acc.iter_mut().zip(bits.iter_mut()).enumerate() {
            // SAFETY: elements 8j..8j+8 of a chunk of 32.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) };
            *b = _mm256_max_epu32(*b, _mm256_and_si256(_mm256_castps_si256(x), abs));
            *a = pick(x, *a);
        }
    }
    let b = _mm256_max_epu32(
        _mm256_max_epu32(bits[0], bits[1]),
        _mm256_max_epu32(bits[2], bits[3]),
    );
    // Any lane above +inf's bits: a NaN.
    let over = _mm256_cmpgt_epi32(
        _mm256_xor_si256(b, _mm256_set1_epi32(i32::MIN)),
        _mm256_set1_epi32(0x7f80_0000 ^ i32::MIN),
    );
    let tail = lane_extreme(ch.remainder(), MAX);
    if _mm256_movemask_epi8(over) != 0 || tail.is_nan() {
        return f32::NAN;
    }
    let m = pick(
        _mm256_set1_ps(tail),
        pick(pick(acc[0], acc[1]), pick(acc[2], acc[3])),
    );
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats into an array of 8.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    // No lane holds a NaN (`pick` keeps them out), so this is the plain extreme.
    lane_extreme(&lanes, MAX)
}

isa_fn!(
    /// `max(v) - min(v)` in f32: finite exactly when every element is finite and the
    /// spread does not overflow (NaN when `v` holds a NaN, non-finite when empty). 32
    /// independent lanes for each bound, so the loop is not bound by one chain of
    /// compares. Used by `rlx_cpu::rowfuse` to decide whether a scanned Softmax may run fused.
    pub fn spread_f32[](v: &[f32]) -> f32 {
        // A NaN is seen through the largest |x| bits (an integer max, which vectorizes
        // without a mask-to-bool round trip per vector).
        let mut hi = [f32::NEG_INFINITY; 32];
        let mut lo = [f32::INFINITY; 32];
        let mut bits = [0u32; 32];
        let mut ch = v.chunks_exact(32);
        for c in ch.by_ref() {
            for (((h, l), b), &x) in hi.iter_mut().zip(lo.iter_mut()).zip(bits.iter_mut()).zip(c) {
                *h = if x > *h { x } else { *h };
                *l = if x < *l { x } else { *l };
                *b = (*b).max(x.to_bits() & 0x7fff_ffff);
            }
        }
        for &x in ch.remainder() {
            hi[0] = if x > hi[0] { x } else { hi[0] };
            lo[0] = if x < lo[0] { x } else { lo[0] };
            bits[0] = bits[0].max(x.to_bits() & 0x7fff_ffff);
        }
        if bits.iter().any(|&b| b > 0x7f80_0000) {
            return f32::NAN;
        }
        let h = hi.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let l = lo.iter().fold(f32::INFINITY, |a, &b| a.min(b));
        h - l
    }
);

isa_fn!(
    /// Softmax over rows of `n` (`src` and `dst` hold whole rows) with the unfused
    /// primitives' expressions, so their bits: `m` = [`extreme_f32`] of the row, `d = x - m`,
    /// `e` = `fastmath::exp_slice` of `d`, `s` = [`sum_f32`] of `e` rounded to f32, `e / s`.
    /// Used by `rlx_cpu::rowfuse`.
    pub(crate) fn softmax_rows_f32[](src: &[f32], dst: &mut [f32], n: usize) {
        let mut tmp = [0f32; 256];
        for (row, out) in src.chunks_exact(n).zip(dst.chunks_exact_mut(n)) {
            let m = lane_extreme(row, true);
            for (s, d) in row.chunks(256).zip(out.chunks_mut(256)) {
                let t = &mut tmp[..s.len()];
                for (t, &x) in t.iter_mut().zip(s) {
                    *t = x - m;
                }
                super::fastmath::exp_slice_generic(t, d);
            }
            let sum = lane_sum(out, |x| x as f64) as f32;
            for e in out.iter_mut() {
                *e /= sum;
            }
        }
    }
);

/// [`softmax_rows_f32`]'s values, by the AVX-512 row kernel where the CPU has it and rows are
/// a multiple of 16 long, else by the AVX2 one where the CPU has AVX2 + FMA and rows are a
/// multiple of 8 long, else by [`softmax_rows_f32`] itself. `src` and `dst` hold whole rows
/// of `n`.
pub fn softmax_rows(src: &[f32], dst: &mut [f32], n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::fastmath::{isa, Isa};
        if n > 0 && n.is_multiple_of(16) && isa() == Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F (checked by `isa`); rows are a multiple of 16 long.
            unsafe { softmax_lanes::rows512(src, dst, n) };
            return;
        }
        if n > 0 && n.is_multiple_of(8) && isa() != Isa::Plain {
            // SAFETY: the CPU has AVX2 and FMA (checked by `isa`); rows are a multiple of 8.
            unsafe { softmax_lanes::rows256(src, dst, n) };
            return;
        }
    }
    softmax_rows_f32(src, dst, n)
}

/// The Softmax row kernel over [`simd::Lanes`](super::simd::Lanes), on AVX-512 and AVX2 +
/// FMA: [`softmax_rows_f32`]'s bits (see the file).
#[cfg(target_arch = "x86_64")]
mod softmax_lanes;

isa_fn!(
    /// RMSNorm over rows of `n` (`src` and `dst` hold whole rows) with the unfused
    /// primitives' expressions, so their bits: `m` = the row's [`sum_f32`] of `x*x` over `n`
    /// (in f64, rounded to f32, as ReduceMean), `r = num / sqrt(m + eps)`, `y = x * r`, and
    /// with `w`, `w[j] * y`. With `scan`, returns a figure that is below `0x7f80_0000`
    /// exactly when every value the unfused ops compute is finite (the largest `bits &
    /// 0x7fff_ffff` of enough of them), else 0. Used by `rlx_cpu::rowfuse`.
    pub fn rms_rows_f32[](
        src: &[f32],
        dst: &mut [f32],
        n: usize,
        eps: f32,
        num: f32,
        w: Option<&[f32]>,
        scan: bool
    ) -> u32 {
        let abs = |v: f32| v.to_bits() & 0x7fff_ffff;
        let mut bits = 0u32;
        for (row, out) in src.chunks_exact(n).zip(dst.chunks_exact_mut(n)) {
            let m = (lane_sum(row, |x| (x * x) as f64) / n as f64) as f32;
            let a = m + eps;
            let s = a.sqrt();
            let r = num / s;
            for (o, &x) in out.iter_mut().zip(row) {
                *o = x * r;
            }
            if let Some(w) = w {
                for (o, &w) in out.iter_mut().zip(w) {
                    // `w * y`, the unfused Mul's operand order (LLVM may still commute it:
                    // of two different NaNs, which one survives is not guaranteed).
                    let y = *o;
                    *o = w * y;
                }
            }
            if scan {
                // Enough to see every value the unfused ops make: a non-finite `x` or `x*x`
                // makes `m` non-finite (the f64 sum keeps an inf or NaN); a non-finite
                // `x * r` makes `w * (x * r)` non-finite.
                for v in [m, a, s, r] {
                    bits = bits.max(abs(v));
                }
            }
        }
        // The outputs in one pass over the block (in L1): per row, the fold ended in a
        // horizontal max (rows of 16 in Qwen3's q/k norms: 30% of the scanned kernel).
        if scan {
            bits = bits.max(super::wide::max_abs_bits(dst));
        }
        bits
    }
);

isa_fn!(
    /// LayerNorm over rows of `n` (`src` and `dst` hold whole rows) with the unfused
    /// primitives' expressions, so their bits: `m` = the row's [`sum_f32`] over `n` (f64,
    /// rounded to f32, as ReduceMean), `xc = x - m`, `v` = the same mean of `xc * xc`,
    /// `d = sqrt(v + eps)`, `xc / d * scale[j]`, then `+ bias[j]`. With `scan`, returns a
    /// figure below `0x7f80_0000` exactly when every value the unfused ops compute is finite,
    /// else 0. Used by `rlx_cpu::rowfuse`.
    pub fn layer_norm_rows_f32[](
        src: &[f32],
        dst: &mut [f32],
        n: usize,
        eps: f32,
        scale: &[f32],
        bias: Option<&[f32]>,
        scan: bool
    ) -> u32 {
        let abs = |v: f32| v.to_bits() & 0x7fff_ffff;
        let mut bits = 0u32;
        for (row, out) in src.chunks_exact(n).zip(dst.chunks_exact_mut(n)) {
            let m = (lane_sum(row, |x| x as f64) / n as f64) as f32;
            for (o, &x) in out.iter_mut().zip(row) {
                *o = x - m;
            }
            let v = (lane_sum(out, |c| (c * c) as f64) / n as f64) as f32;
            let a = v + eps;
            let d = a.sqrt();
            for (o, &s) in out.iter_mut().zip(scale) {
                *o = *o / d * s;
            }
            if let Some(bias) = bias {
                for (o, &b) in out.iter_mut().zip(bias) {
                    *o += b;
                }
            }
            if scan {
                // Enough to see every value the unfused ops make: a non-finite `x`, `m` or
                // `xc*xc` makes `v` non-finite (the f64 sum keeps an inf or NaN); a
                // non-finite `xc / d` or product makes the output non-finite (inf times or
                // plus a number is inf or NaN).
                for s in [m, v, a, d] {
                    bits = bits.max(abs(s));
                }
            }
        }
        // The outputs in one pass over the block, as in `rms_rows_f32`.
        if scan {
            bits = bits.max(super::wide::max_abs_bits(dst));
        }
        bits
    }
);

/// `Some(inner)` when `bases` is runs of `inner >= 8` consecutive offsets (`bases[c·inner + i]
/// = bases[c·inner] + i`), the outputs of a reduction whose kept trailing axes are
/// contiguous in the input.
fn column_runs(bases: &[usize]) -> Option<usize> {
    let inner = bases
        .iter()
        .enumerate()
        .take_while(|&(i, &b)| b == bases[0] + i)
        .count();
    let ok = inner >= 8
        && bases.len().is_multiple_of(inner)
        && bases
            .chunks(inner)
            .all(|c| c.iter().enumerate().all(|(i, &b)| b == c[0] + i));
    ok.then_some(inner)
}

fn reduce_float<T: Float + Send + Sync + 'static>(v: &[T], p: &Plan, kind: ReduceKind) -> Vec<T> {
    let offs = &p.offs;
    let n = offs.len() as f64;
    // Sum, Mean and Prod accumulate in f64 whatever the dtype, then round once: a running
    // f32 sum stops growing at 2^24 and drifts by ~1% over a million terms.
    let wide = |x: T| x.to_f64().unwrap_or(f64::NAN);
    let narrow = |x: f64| T::from(x).unwrap_or_else(T::nan);
    if let Offs::Run(k) = *offs {
        // Reduced axes are the trailing ones (LayerNorm, Softmax rows): each output reads a
        // contiguous run; f32 rows take the copies compiled per ISA.
        let f32_rows = is_f32::<T>();
        let sum = |row: &[T]| {
            if f32_rows {
                sum_f32(as_f32(row))
            } else {
                lane_sum(row, wide)
            }
        };
        if f32_rows && matches!(kind, ReduceKind::Sum | ReduceKind::Mean) {
            // Rows in eights on AVX-512 ([`sum8_f32`]), else in fours ([`sum4_f32`]), the
            // same bits as one at a time.
            let vf = as_f32(v);
            let div = if kind == ReduceKind::Mean { n } else { 1.0 };
            let val = |x: f64| narrow(if div == 1.0 { x } else { x / div });
            let eights = sum8_on();
            let rows_per = if eights { SUM8_ROWS } else { SUM_ROWS };
            // Each group of (up to) `rows_per` outputs written in place: no buffer per
            // group.
            let group = |(o, g): (&mut [T], &[usize])| {
                if let Ok(b8) = <[usize; SUM8_ROWS]>::try_from(g) {
                    for (oi, x) in o.iter_mut().zip(sum8_f32(vf, b8, k)) {
                        *oi = val(x);
                    }
                    return;
                }
                let (o4, g4) = (o.chunks_mut(SUM_ROWS), g.chunks(SUM_ROWS));
                for (o, g) in o4.zip(g4) {
                    if let Ok(b4) = <[usize; SUM_ROWS]>::try_from(g) {
                        for (oi, x) in o.iter_mut().zip(sum4_f32(vf, b4, k)) {
                            *oi = val(x);
                        }
                    } else {
                        for (oi, &b) in o.iter_mut().zip(g) {
                            *oi = val(sum_f32(&vf[b..b + k]));
                        }
                    }
                }
            };
            let mut out = vec![T::zero(); p.bases.len()];
            if par_worth(v.len()) && p.bases.len() > rows_per {
                out.par_chunks_mut(rows_per)
                    .zip(p.bases.par_chunks(rows_per))
                    .for_each(group);
            } else {
                out.chunks_mut(rows_per)
                    .zip(p.bases.chunks(rows_per))
                    .for_each(group);
            }
            return out;
        }
        return map_bases(&p.bases, v.len(), |b| {
            let row = &v[b..b + k];
            match kind {
                ReduceKind::Sum => narrow(sum(row)),
                ReduceKind::Mean => narrow(sum(row) / n),
                ReduceKind::Prod => narrow(row.iter().fold(1.0, |a, &x| a * wide(x))),
                ReduceKind::Max | ReduceKind::Min => {
                    let max = kind == ReduceKind::Max;
                    if f32_rows {
                        T::from(extreme_f32(as_f32(row), max)).unwrap_or_else(T::nan)
                    } else {
                        lane_extreme(row, max)
                    }
                }
            }
        });
    }
    if matches!(kind, ReduceKind::Sum | ReduceKind::Mean) {
        if let Some(inner) = column_runs(&p.bases) {
            // Outputs in runs of `inner` consecutive bases (kept trailing axes, e.g.
            // ReduceSum over the tokens of [batch, tokens, hidden]): each run's sums are
            // vectors of `inner` f64 lanes, every output adding its terms in `offs` order as
            // the fold below does, so the same bits, without a strided gather per term.
            let run = |b: usize| -> Vec<T> {
                let mut acc = vec![0f64; inner];
                for o in offs.iter() {
                    for (a, &x) in acc.iter_mut().zip(&v[b + o..b + o + inner]) {
                        *a += wide(x);
                    }
                }
                acc.into_iter()
                    .map(|a| narrow(if kind == ReduceKind::Mean { a / n } else { a }))
                    .collect()
            };
            let starts: Vec<usize> = p.bases.iter().step_by(inner).copied().collect();
            return map_bases(&starts, v.len(), run).concat();
        }
    }
    map_bases(&p.bases, v.len(), |b| match kind {
        ReduceKind::Sum => narrow(offs.iter().fold(0.0, |a, o| a + wide(v[b + o]))),
        ReduceKind::Mean => narrow(offs.iter().fold(0.0, |a, o| a + wide(v[b + o])) / n),
        ReduceKind::Prod => narrow(offs.iter().fold(1.0, |a, o| a * wide(v[b + o]))),
        ReduceKind::Max => offs.iter().fold(T::neg_infinity(), |a, o| {
            let x = v[b + o];
            if x.is_nan() || a.is_nan() {
                T::nan()
            } else if x > a {
                x
            } else {
                a
            }
        }),
        ReduceKind::Min => offs.iter().fold(T::infinity(), |a, o| {
            let x = v[b + o];
            if x.is_nan() || a.is_nan() {
                T::nan()
            } else if x < a {
                x
            } else {
                a
            }
        }),
    })
}

fn reduce_int(v: &[i64], p: &Plan, kind: ReduceKind, lo: i64, hi: i64) -> Vec<i64> {
    let offs = &p.offs;
    let n = offs.len() as i64;
    map_bases(&p.bases, v.len(), |b| match kind {
        ReduceKind::Sum => offs.iter().fold(0i64, |a, o| a.wrapping_add(v[b + o])),
        ReduceKind::Mean => {
            let s = offs.iter().fold(0i64, |a, o| a.wrapping_add(v[b + o]));
            if n == 0 {
                0
            } else {
                s / n
            }
        }
        ReduceKind::Prod => offs.iter().fold(1i64, |a, o| a.wrapping_mul(v[b + o])),
        ReduceKind::Max => offs.iter().fold(lo, |a, o| a.max(v[b + o])),
        ReduceKind::Min => offs.iter().fold(hi, |a, o| a.min(v[b + o])),
    })
}

/// `Op::Reduce`: Sum/Mean/Max/Min/Prod over sorted `axes` (empty = identity).
/// Max/Min propagate NaN; an empty reduction gives the identity (0, 1, ∓inf; Mean → NaN).
pub(crate) fn reduce(
    x: &Tensor,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
) -> KResult<Tensor> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    let p = plan(x.dims(), axes, keepdims)?;
    let data = match x.data() {
        TensorData::Bool(v) => {
            // Bool: Max = any, Min = all; others through i64.
            let w: Vec<i64> = v.iter().map(|&b| b as i64).collect();
            let r = reduce_int(&w, &p, kind, 0, 1);
            TensorData::Bool(r.into_iter().map(|x| x != 0).collect())
        }
        d if d.dtype().is_int() => {
            let (lo, hi) = match d.dtype() {
                rlx_ir::DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                rlx_ir::DType::I16 => (i16::MIN as i64, i16::MAX as i64),
                rlx_ir::DType::I8 => (i8::MIN as i64, i8::MAX as i64),
                rlx_ir::DType::U8 => (0, u8::MAX as i64),
                rlx_ir::DType::U16 => (0, u16::MAX as i64),
                rlx_ir::DType::U32 => (0, u32::MAX as i64),
                rlx_ir::DType::I4 => (-8, 7),
                rlx_ir::DType::U4 => (0, 15),
                rlx_ir::DType::I2 => (-2, 1),
                rlx_ir::DType::U2 => (0, 3),
                _ => (i64::MIN, i64::MAX),
            };
            let r = reduce_int(&d.to_i64_vec(), &p, kind, lo, hi);
            TensorData::from_i64(d.dtype(), &r)
        }
        d => map_float!(d, "reduce", v => reduce_float(v, &p, kind)),
    };
    make(p.out_dims, data)
}

fn argreduce_impl<T: Elem>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    max: bool,
    last: bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = f64::NAN;
            let mut bi = 0usize;
            for j in 0..n {
                let x = v[(o * n + j) * inner + i].to_f64();
                if j == 0 {
                    best = x;
                    continue;
                }
                let better = if best.is_nan() {
                    false
                } else if x.is_nan() {
                    true
                } else if max {
                    x > best
                } else {
                    x < best
                };
                let equal = x == best || (x.is_nan() && best.is_nan());
                if better || (last && equal) {
                    best = x;
                    bi = j;
                }
            }
            out.push(bi as i64);
        }
    }
    out
}

/// `Op::ArgReduce` (ONNX ArgMax/ArgMin), output I64. NaN counts as the extreme value
/// (the first NaN wins, or the last with `select_last_index`), like `np.argmax`.
pub(crate) fn argreduce(
    x: &Tensor,
    max: bool,
    axis: usize,
    keepdims: bool,
    last: bool,
) -> KResult<Tensor> {
    let d = x.dims();
    if axis >= d.len() {
        return invalid(format!(
            "argreduce: axis {axis} out of range for rank {}",
            d.len()
        ));
    }
    if d[axis] == 0 {
        return invalid("argreduce over an empty axis");
    }
    let outer: usize = d[..axis].iter().product();
    let inner: usize = d[axis + 1..].iter().product();
    let n = d[axis];
    let r = match x.data() {
        // Compare decoded values, not codes.
        TensorData::Narrow { .. } => {
            argreduce_impl(&x.data().to_f64_vec(), outer, n, inner, max, last)
        }
        d => rlx_ir::with_data!(d, v => argreduce_impl(v, outer, n, inner, max, last)),
    };
    let mut od = d.to_vec();
    if keepdims {
        od[axis] = 1;
    } else {
        od.remove(axis);
    }
    make(od, TensorData::I64(r))
}

fn cumsum_impl<T: Copy + std::ops::Add<Output = T>>(
    v: &[T],
    zero: T,
    outer: usize,
    n: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![zero; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = zero;
            for jj in 0..n {
                let j = if reverse { n - 1 - jj } else { jj };
                let p = (o * n + j) * inner + i;
                if exclusive {
                    out[p] = acc;
                    acc = acc + v[p];
                } else {
                    acc = acc + v[p];
                    out[p] = acc;
                }
            }
        }
    }
    out
}

/// Float CumSum: each prefix sum is accumulated in f64 and rounded once to `T`, so a prefix
/// that overflows `T` (FLT_MAX + FLT_MAX) gives inf there and later prefixes that come back
/// in range (… - FLT_MAX) are finite again, as the exact prefix sums are; a running `T` sum
/// would stay at inf. NaN/inf propagate as in f64.
fn cumsum_float<T: Float>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![T::zero(); v.len()];
    let narrow = |x: f64| T::from(x).unwrap_or_else(T::nan);
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = 0f64;
            for jj in 0..n {
                let j = if reverse { n - 1 - jj } else { jj };
                let p = (o * n + j) * inner + i;
                let x = v[p].to_f64().unwrap_or(f64::NAN);
                if exclusive {
                    out[p] = narrow(acc);
                    acc += x;
                } else {
                    acc += x;
                    out[p] = narrow(acc);
                }
            }
        }
    }
    out
}

#[derive(Clone, Copy)]
struct WrapI64(i64);
impl std::ops::Add for WrapI64 {
    type Output = WrapI64;
    fn add(self, o: WrapI64) -> WrapI64 {
        WrapI64(self.0.wrapping_add(o.0))
    }
}

/// `Op::CumSum` (ONNX CumSum with `exclusive` / `reverse`).
pub(crate) fn cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> KResult<Tensor> {
    let d = x.dims();
    if axis >= d.len() {
        return invalid(format!(
            "cumsum: axis {axis} out of range for rank {}",
            d.len()
        ));
    }
    let outer: usize = d[..axis].iter().product();
    let inner: usize = d[axis + 1..].iter().product();
    let n = d[axis];
    let data = match x.data() {
        TensorData::Bool(_) => return invalid("cumsum on bool"),
        dd if dd.dtype().is_int() => {
            let w: Vec<WrapI64> = dd.to_i64_vec().into_iter().map(WrapI64).collect();
            let r = cumsum_impl(&w, WrapI64(0), outer, n, inner, exclusive, reverse);
            TensorData::from_i64(dd.dtype(), &r.into_iter().map(|w| w.0).collect::<Vec<_>>())
        }
        dd => {
            map_float!(dd, "cumsum", v => cumsum_float(v, outer, n, inner, exclusive, reverse))
        }
    };
    make(d.to_vec(), data)
}

fn softmax_impl<T: Float + Send + Sync + Default + 'static>(
    v: &[T],
    dims: &[usize],
    axis: usize,
    log: bool,
) -> Vec<T> {
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out = crate::buffers::filled(v.len(), T::zero());
    if n == 0 || inner == 0 {
        return out;
    }
    let block = n * inner;
    fill_chunks(&mut out, block, |o, dst| {
        let src = &v[o * block..(o + 1) * block];
        for i in 0..inner {
            let mut m = T::neg_infinity();
            for j in 0..n {
                let x = src[j * inner + i];
                if x > m {
                    m = x;
                }
            }
            // The row sum accumulates in f64, like the reductions.
            let mut acc = 0.0f64;
            for j in 0..n {
                let e = (src[j * inner + i] - m).exp();
                if !log {
                    dst[j * inner + i] = e;
                }
                acc += e.to_f64().unwrap_or(f64::NAN);
            }
            let s = T::from(acc).unwrap_or_else(T::nan);
            if log {
                let ls = s.ln();
                for j in 0..n {
                    dst[j * inner + i] = src[j * inner + i] - m - ls;
                }
            } else {
                for j in 0..n {
                    dst[j * inner + i] = dst[j * inner + i] / s;
                }
            }
        }
    });
    out
}

/// `Op::Softmax` / `Op::LogSoftmax` over `axis` (ONNX opset 13 definition with max
/// subtraction: a row of all -inf gives NaN, as numpy and onnxruntime do).
pub(crate) fn softmax(x: &Tensor, axis: usize, log: bool, out: &Shape) -> KResult<Tensor> {
    let d = x.dims();
    if axis >= d.len() {
        return invalid(format!(
            "softmax: axis {axis} out of range for rank {}",
            d.len()
        ));
    }
    let _ = out;
    let data = map_float!(x.data(), "softmax", v => softmax_impl(v, d, axis, log));
    make(d.to_vec(), data)
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
