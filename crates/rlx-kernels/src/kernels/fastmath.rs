//! Vectorizable f32 `exp`, `erf` and sigmoid for whole buffers.
//!
//! `exp`: Cephes `expf` (range reduction `x = n·ln2 + r` with ln2 split in two, a degree-5
//! polynomial on `r`, `2^n` built in the exponent bits), about 1 ulp on `[-87, 88]`; inputs
//! outside that range (NaN, ±inf, overflow, subnormal results) take `f32::exp`, so every
//! IEEE special case is the C library's. `erf`: the rational approximation Eigen uses for
//! `float` (`generic_fast_erf_float`: x·P(x²)/Q(x²) on x clamped to [-4, 4]), a few ulp;
//! NaN propagates. The loops are compiled twice, plain and with AVX2+FMA, picked at run time.
//! The polynomials are written with `mul_add`, so every copy computes the same fused
//! multiply-adds (one instruction with FMA; the C library's `fmaf`, same bits but slow, in
//! the plain copy, which runs only on CPUs without AVX2+FMA).

#![allow(clippy::excessive_precision)] // coefficients as published (Cephes, Eigen)

/// A whole-buffer f32 kernel: `dst[i] = f(src[i])`.
pub(crate) type SliceKernel = fn(&[f32], &mut [f32]);

/// Below this, `exp` is +0 (see [`exp_outside`]).
pub(crate) const EXP_ZERO_BELOW: f32 = -104.0;
use super::simd::{EXP2_16THS, EXPN_POLY, EXPN_SHIFT, EXPN_X_HI};
pub(crate) use super::simd::{EXP_HI, EXP_LN2, EXP_LO, EXP_POLY};

/// The widest vector ISA of this CPU that the slice kernels are compiled for (checked once).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Plain,
}

/// Which copy of the `isa_fn!` kernels runs: the CPU's best, within `RLX_CPU_ISA`
/// ([`crate::kernels::simd::isa_cap`]: `avx2` runs the AVX2 copies on an AVX-512 CPU,
/// `portable` the plain ones). Every copy gives the same bits (see the module docs).
#[cfg(target_arch = "x86_64")]
pub(crate) fn isa() -> Isa {
    use crate::kernels::simd::{isa_cap, IsaCap};
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if is_x86_feature_detected!("avx512f") && fma && isa_cap() == IsaCap::Avx512 {
            Isa::Avx512
        } else if fma && isa_cap() >= IsaCap::Avx2 {
            Isa::Avx2
        } else {
            Isa::Plain
        }
    })
}

#[inline(always)]
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN; the conversion below needs NaN-free lanes
fn exp_core(x: f32) -> f32 {
    // max/min (which drop a NaN operand) keep every lane, NaN included, in range, so the
    // unchecked conversion below is defined; out-of-range lanes are redone by the callers.
    exp_clamped(x.max(EXP_LO).min(EXP_HI))
}

/// [`exp_core`] after its clamp: `xc` in [`EXP_LO`, `EXP_HI`].
#[inline(always)]
fn exp_clamped(xc: f32) -> f32 {
    let n = xc.mul_add(std::f32::consts::LOG2_E, 0.5).floor();
    let r = n.mul_add(EXP_LN2[0], xc);
    let r = n.mul_add(EXP_LN2[1], r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let y = (p * r).mul_add(r, r) + 1.0;
    // SAFETY: `n` is finite and within [-126, 127] (from `xc` in [EXP_LO, EXP_HI]), so the
    // conversion is exact (`as` would add a saturation check per lane and stop vectorizing).
    let ni: i32 = unsafe { n.to_int_unchecked() };
    let scale = f32::from_bits(((ni + 127) as u32) << 23);
    y * scale
}

/// `e^-x` for the sigmoid, `x` in [[`EXP_LO`], [`EXPN_X_HI`]] (larger `x` as
/// `EXPN_X_HI`; below the range and NaN some finite value the callers replace): `-x·log2 e`
/// rounded to a multiple of 1/16, `m`; `r = -x - m·ln 2` (ln 2 in Cephes' two parts,
/// `|r| ≤ ln 2/32`); `e^-x = 2^floor(m) · 2^(j/16) · e^r` with `2^(j/16)` from a 16-entry
/// table held as two f32 (`j` the sixteenths of `m`) and `e^r - 1` a degree-3 polynomial.
/// The table leaves Cephes' degree-5 polynomial and its `floor` out: 15-25% of the SiLU's
/// time (bench/NOTES.md §42); the sigmoid's error stays at Cephes' (at most
/// 1.241·|y|·2^-23 against f64 over every f32 in [-87, 88]).
#[inline(always)]
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN; the exponent below needs NaN-free lanes
fn exp_neg_core(x: f32) -> f32 {
    // The lower clamp only keeps the lanes that the callers replace in range here (the
    // SIMD form leaves it out); `f32::min` drops a NaN operand as `minps` does.
    let xc = x.max(EXP_LO).min(EXPN_X_HI);
    let t = xc.mul_add(-std::f32::consts::LOG2_E, EXPN_SHIFT);
    let m = t - EXPN_SHIFT;
    let r = (-m).mul_add(-EXP_LN2[0], -xc);
    let r = m.mul_add(EXP_LN2[1], r);
    let q = EXPN_POLY[0].mul_add(r, EXPN_POLY[1]);
    let u = q.mul_add(r * r, r);
    let j = (t.to_bits() & 15) as usize;
    let hi = EXP2_16THS[0][j];
    let e = hi + hi.mul_add(u, EXP2_16THS[1][j]);
    // `floor(m)` is in [-126, 125] for `xc` in [-87, 87]: `2^floor(m)` is a normal f32.
    e * f32::from_bits(((m.floor() as i32 + 127) as u32) << 23)
}

/// `exp(x)` for `x` outside [`EXP_LO`, `EXP_HI`]: +0 below -104 (e^-104 < 2^-150, half the
/// smallest subnormal, so the correctly rounded result is +0, as the C library returns;
/// that also covers -inf), else `f32::exp` (overflow, subnormal results, NaN). Softmax over
/// a causal mask sends half its inputs here; libm's underflow path is slow.
#[inline(always)]
fn exp_outside(x: f32) -> f32 {
    if x < EXP_ZERO_BELOW {
        0.0
    } else {
        x.exp()
    }
}

/// Below this |x|, `erf(x) = 2x/sqrt(pi)` to f32 rounding (the next term, `x^2/3`, is under
/// 2^-25 relative).
const ERF_LINEAR_BELOW: f32 = 1.0 / 4096.0;

#[inline(always)]
pub(crate) fn erf_core(a: f32) -> f32 {
    // Tiny |a|: `2a/sqrt(pi)` in one product. The rational form below multiplies `P(x^2)`
    // (about -0.016) by `x` before dividing, which goes subnormal for |x| below ~1e-36 and
    // lost bits there (erf(FLT_MIN) was 2.5e-6 relative off); the product also keeps
    // erf(±0) = ±0.
    let lin = a * std::f32::consts::FRAC_2_SQRT_PI;
    let x = a.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10f32;
    p = p.mul_add(x2, 2.770_681_4e-8);
    p = p.mul_add(x2, -2.101_024e-6);
    p = p.mul_add(x2, -5.692_506_4e-5);
    p = p.mul_add(x2, -7.349_906_3e-4);
    p = p.mul_add(x2, -2.954_600_5e-3);
    p = p.mul_add(x2, -1.609_603_3e-2);
    p *= x;
    let mut q = -1.456_607_2e-5f32;
    q = q.mul_add(x2, -2.133_740_6e-4);
    q = q.mul_add(x2, -1.682_827e-3);
    q = q.mul_add(x2, -7.373_329_2e-3);
    q = q.mul_add(x2, -1.426_474e-2);
    if a.abs() < ERF_LINEAR_BELOW {
        lin
    } else {
        p / q
    }
}

#[inline(always)]
pub(crate) fn exp_slice_generic(src: &[f32], dst: &mut [f32]) {
    // Lanes below -104 (a softmax's masked entries, -inf included) are +0 by a select in
    // the vector loop (see `exp_outside`); only the rest of the out-of-range lanes (NaN,
    // overflow, subnormal results) need the scalar pass.
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        let y = exp_core(x);
        *d = if x < EXP_ZERO_BELOW { 0.0 } else { y };
        bad |= !(x < EXP_ZERO_BELOW || (EXP_LO..=EXP_HI).contains(&x));
    }
    if bad {
        for (d, &x) in dst.iter_mut().zip(src) {
            if !(EXP_LO..=EXP_HI).contains(&x) {
                *d = exp_outside(x);
            }
        }
    }
}

#[inline(always)]
fn erf_slice_generic(src: &[f32], dst: &mut [f32]) {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = erf_core(x);
        bad |= x.is_nan();
    }
    if bad {
        for (d, &x) in dst.iter_mut().zip(src) {
            if x.is_nan() {
                *d = x;
            }
        }
    }
}

/// Below this, Gelu's `1 + erf(x/sqrt 2)` has cancelled more than a factor of 3 (it is
/// 0.317 at -1 and 0.0027 at -3): those lanes are redone with `erfc` in f64.
const GELU_TAIL_BELOW: f32 = -1.0;

/// Gelu (erf form): `(x/2) (1 + erf(x/sqrt 2))` with [`erf_core`] where `x >= -1` (the sum
/// cancels at most a factor of 3 there; halving first keeps `x = f32::MAX` finite), and the
/// scalar `Activation::Gelu.apply_f32` (`x/2 erfc(-x/sqrt 2)` in f64) on the negative tail and
/// NaN, where `1 + erf` would cancel: Gelu(-5) was 6% off and Gelu(-6..-13) gave -0.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(a >= b)` is true for NaN too
fn gelu_slice_generic(src: &[f32], dst: &mut [f32]) {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        let e = erf_core(x * std::f32::consts::FRAC_1_SQRT_2);
        *d = (0.5 * x) * (1.0 + e);
        bad |= !(x >= GELU_TAIL_BELOW);
    }
    if bad {
        for (d, &x) in dst.iter_mut().zip(src) {
            if !(x >= GELU_TAIL_BELOW) {
                *d = rlx_ir::Activation::Gelu.apply_f32(x);
            }
        }
    }
}

isa_fn!(
    /// `dst[i] = gelu(src[i])` (erf form; lengths must match).
    pub(crate) fn gelu_slice[](src: &[f32], dst: &mut [f32]) {
        gelu_slice_generic(src, dst)
    }
);

/// Logistic sigmoid, `1/(1+e^-x)` in one form for every `x` at or above [`EXP_LO`] (-87),
/// with `e^-x` from [`exp_neg_core`] (which takes `x > 87` as 87: `e^-87`, whose sum with 1
/// rounds to 1 as the exact sigmoid does); for negative `x`, `e^-x` up to `e^87` stays
/// finite and `1/(1+e^-x)` keeps about an ulp relative (error at most 1.241·|y|·2^-23
/// against f64 over every f32 in [-87, 88], as with the Cephes exp this table-driven one
/// replaced; at most 2 ulp of the rounded f64 value in the tests; the two-form
/// `e^x/(1+e^x)` below 0 was 1.5·|y|·2^-23 and cost an `|x|`, a product and a select per
/// lane, 12% of the kernel). Lanes below -87 (where the result is subnormal or 0) and NaN
/// are redone with the scalar `Activation::Sigmoid.apply_f32`.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(a >= b)` is the one compare that is true for NaN
fn sigmoid_slice_generic(src: &[f32], dst: &mut [f32]) {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        let e = exp_neg_core(x);
        *d = 1.0 / (1.0 + e);
        // One unordered compare: true for NaN and for x below the range.
        bad |= !(x >= EXP_LO);
    }
    if bad {
        for (d, &x) in dst.iter_mut().zip(src) {
            if !(x >= EXP_LO) {
                *d = rlx_ir::Activation::Sigmoid.apply_f32(x);
            }
        }
    }
}

/// Taylor coefficients of tanh: x^(2k+1) for k = 1..=9 (the odd Bernoulli-number series,
/// tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315 + ...).
const TANH_TAYLOR: [f32; 9] = [
    -1.0 / 3.0,
    2.0 / 15.0,
    -17.0 / 315.0,
    62.0 / 2835.0,
    -1382.0 / 155925.0,
    21844.0 / 6081075.0,
    -929569.0 / 638512875.0,
    6404582.0 / 10854718875.0,
    -443861162.0 / 1856156927625.0,
];

/// tanh: below |x| = 0.625 the Taylor series through x^19 (truncation < 1e-8 relative);
/// above, `1 - 2/(e^(2|x|) + 1)` with [`exp_core`] (whose clamp at 88 gives exactly 1 for
/// |x| > 44, where tanh rounds to 1 anyway); the sign is copied back, so tanh(-0) = -0.
/// NaN lanes return the input NaN.
#[inline(always)]
fn tanh_slice_generic(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let a = x.abs();
        let z = a * a;
        let mut p = TANH_TAYLOR[8];
        for &c in TANH_TAYLOR[..8].iter().rev() {
            p = p.mul_add(z, c);
        }
        let small = (a * z).mul_add(p, a);
        let e = exp_core(2.0 * a);
        let large = 1.0 - 2.0 / (e + 1.0);
        let r = if a < 0.625 { small } else { large };
        *d = if x.is_nan() { x } else { r.copysign(x) };
    }
}

isa_fn!(
    /// `dst[i] = tanh(src[i])` (lengths must match); within a few ulp of the correctly rounded
    /// value (tested against f64), exact ±1 saturation, NaN propagated.
    pub(crate) fn tanh_slice[](src: &[f32], dst: &mut [f32]) {
        tanh_slice_generic(src, dst)
    }
);

/// Sigmoid and SiLU on SIMD lanes, four vectors a step: [`sigmoid_slice_generic`]'s bits.
#[cfg(target_arch = "x86_64")]
mod logistic;

/// `dst[i] = sigmoid(src[i])` (lengths must match; extra elements are left alone); a few
/// ulp from the correctly rounded value on the exp range, the scalar definition outside it.
/// The same bits on every instruction set: [`sigmoid_slice_generic`] on CPUs without AVX2 +
/// FMA, its op-for-op SIMD form (`logistic`) on the others.
pub(crate) fn sigmoid_slice(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: the CPU has these features (checked at run time by `isa`).
        Isa::Avx512 => return unsafe { logistic::sigmoid512(src, dst) },
        Isa::Avx2 => return unsafe { logistic::sigmoid256(src, dst) },
        Isa::Plain => {}
    }
    sigmoid_slice_generic(src, dst)
}

/// A buffer-level kernel for the activation `act` on f32, when one exists.
pub fn act_slice_kernel(act: rlx_ir::Activation) -> Option<SliceKernel> {
    match act {
        rlx_ir::Activation::Sigmoid => Some(sigmoid_slice),
        rlx_ir::Activation::Tanh => Some(tanh_slice),
        rlx_ir::Activation::Gelu => Some(gelu_slice),
        _ => None,
    }
}

isa_fn!(
    /// `dst[i] = exp(src[i])` (lengths must match; extra elements are left alone).
    pub(crate) fn exp_slice[](src: &[f32], dst: &mut [f32]) {
        exp_slice_generic(src, dst)
    }
);

isa_fn!(
    /// `dst[i] = erf(src[i])` (lengths must match; extra elements are left alone).
    pub(crate) fn erf_slice[](src: &[f32], dst: &mut [f32]) {
        erf_slice_generic(src, dst)
    }
);

/// In-place [`exp_slice`] / [`erf_slice`] through a small stack buffer.
pub fn map_inplace(v: &mut [f32], f: SliceKernel) {
    let mut tmp = [0f32; 256];
    for ch in v.chunks_mut(256) {
        let t = &mut tmp[..ch.len()];
        t.copy_from_slice(ch);
        f(t, ch);
    }
}

/// A buffer-level kernel for `op` on f32, when one exists.
pub fn slice_kernel(op: rlx_ir::UnaryOp) -> Option<SliceKernel> {
    match op {
        rlx_ir::UnaryOp::Exp => Some(exp_slice),
        rlx_ir::UnaryOp::Erf => Some(erf_slice),
        _ => None,
    }
}

/// `out = kernel(v)`, split over rayon above the parallel threshold.
pub(crate) fn map_new(v: &[f32], f: SliceKernel) -> Vec<f32> {
    // Every element is written below (the slice kernels write all of `dst`).
    let mut out = crate::buffers::overwritten(v.len());
    if super::par_worth(v.len()) {
        use rayon::prelude::*;
        out.par_chunks_mut(8192)
            .zip(v.par_chunks(8192))
            .for_each(|(d, s)| f(s, d));
    } else {
        f(v, &mut out);
    }
    out
}

/// `v[i] = v[i] * sigmoid(v[i])` (SiLU), with [`sigmoid_slice`] and an f32 product: the
/// bits of the unfused `Sigmoid` then `Mul`. Split over rayon above the parallel threshold.
pub fn silu_inplace(v: &mut [f32]) {
    silu_pass(v, None, None)
}

/// `v[i] = silu(v[i] + b)`: the same bits as adding `b` in its own pass and then
/// [`silu_inplace`], in one pass over `v` (256 elements at a time, the sum, the sigmoid and
/// the product while they are in L1). With `seen`, the largest |v[i] + b| bits (as
/// `wide::max_abs_bits` gives them: NaN's above +inf's) are folded into it, for the NaN
/// scan of a fused conv group, which needs each value before the activation.
pub fn silu_bias_inplace(v: &mut [f32], b: f32, seen: Option<&std::sync::atomic::AtomicU32>) {
    silu_pass(v, Some(b), seen)
}

/// The SiLU pass of [`silu_inplace`] and [`silu_bias_inplace`]: with AVX2 + FMA one pass of
/// `logistic`'s SIMD SiLU (bias, largest |v + b| bits, sigmoid and product per vector);
/// without, 256 elements at a time, the bias added first when given (and the largest
/// |v + b| bits folded into `seen`), then `sigmoid_slice` into a stack buffer and the
/// product. The same bits either way; split over rayon above the parallel threshold.
fn silu_pass(v: &mut [f32], b: Option<f32>, seen: Option<&std::sync::atomic::AtomicU32>) {
    let run = |c: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU has these features (checked at run time by `isa`).
            let bits = match isa() {
                Isa::Avx512 => Some(unsafe { logistic::silu512(c, b, seen.is_some()) }),
                Isa::Avx2 => Some(unsafe { logistic::silu256(c, b, seen.is_some()) }),
                Isa::Plain => None,
            };
            if let Some(bits) = bits {
                if let Some(s) = seen {
                    s.fetch_max(bits, std::sync::atomic::Ordering::Relaxed);
                }
                return;
            }
        }
        let mut tmp = [0f32; 256];
        let mut bits = 0u32;
        for ch in c.chunks_mut(256) {
            if let Some(b) = b {
                super::wide::map1_inplace(ch, |x| x + b);
            }
            if seen.is_some() {
                bits = bits.max(super::wide::max_abs_bits(ch));
            }
            let t = &mut tmp[..ch.len()];
            sigmoid_slice(ch, t);
            super::wide::map2_inplace(ch, t, |x, s| x * s);
        }
        if let Some(s) = seen {
            s.fetch_max(bits, std::sync::atomic::Ordering::Relaxed);
        }
    };
    if super::par_worth(v.len()) {
        use rayon::prelude::*;
        v.par_chunks_mut(8192).for_each(run);
    } else {
        run(v);
    }
}

/// `map_inplace`, split over rayon above the parallel threshold.
pub fn map_inplace_par(v: &mut [f32], f: SliceKernel) {
    if super::par_worth(v.len()) {
        use rayon::prelude::*;
        v.par_chunks_mut(8192).for_each(|c| map_inplace(c, f));
    } else {
        map_inplace(v, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulp_diff(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_matches_f64_reference_and_special_cases() {
        let xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0441).collect();
        let mut out = vec![0f32; xs.len()];
        exp_slice(&xs, &mut out);
        for (&x, &y) in xs.iter().zip(&out) {
            let r = (x as f64).exp() as f32; // correctly rounded reference (f64 then round)
            assert!(ulp_diff(y, r) <= 2, "exp({x}) = {y}, want {r}");
        }
        let sp = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            100.0,
            -100.0,
            -88.5,
        ];
        let mut o = [0f32; 6];
        exp_slice(&sp, &mut o);
        assert!(o[0].is_nan());
        assert_eq!(o[1], f32::INFINITY);
        assert_eq!(o[2], 0.0);
        assert_eq!(o[3], f32::INFINITY);
        assert!(ulp_diff(o[4], (-100f64).exp() as f32) <= 1);
        assert!(ulp_diff(o[5], (-88.5f64).exp() as f32) <= 1);
    }

    #[test]
    fn exp_underflow_range_matches_f64_reference() {
        // The fix-up path: subnormal results, the cut to +0 near -104, and masks such as
        // -3.4e38 or -1e9 (causal attention) that land far below it.
        let mut xs: Vec<f32> = (0..=4000).map(|i| -87.0 - i as f32 * 0.0055).collect();
        xs.extend([
            -103.27,
            -103.97,
            -103.98,
            -104.0,
            -1e9,
            f32::MIN,
            -f32::MAX / 2.0,
        ]);
        let mut out = vec![1f32; xs.len()];
        exp_slice(&xs, &mut out);
        for (&x, &y) in xs.iter().zip(&out) {
            let r = (x as f64).exp() as f32;
            assert!(ulp_diff(y, r) <= 1, "exp({x}) = {y:e}, want {r:e}");
            assert!(y >= 0.0 && y.is_sign_positive(), "exp({x}) = {y:e}");
        }
    }

    #[test]
    fn tanh_matches_f64_reference_and_special_cases() {
        let mut xs: Vec<f32> = (-40000..=40000).map(|i| i as f32 * 0.00025).collect();
        xs.extend((0..2000).map(|i| 10.0 + i as f32 * 0.05));
        xs.extend([
            0.624_999_9,
            0.625,
            1e-30,
            -1e-30,
            1e-45,
            50.0,
            -50.0,
            1e30,
            -1e30,
        ]);
        let mut out = vec![0f32; xs.len()];
        tanh_slice(&xs, &mut out);
        let mut worst = 0;
        for (&x, &y) in xs.iter().zip(&out) {
            let r = (x as f64).tanh() as f32;
            worst = worst.max(ulp_diff(y, r));
            assert!(ulp_diff(y, r) <= 3, "tanh({x}) = {y}, want {r}");
        }
        assert!(worst <= 3);
        let sp = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        let mut o = [9f32; 5];
        tanh_slice(&sp, &mut o);
        assert!(o[0].is_nan());
        assert_eq!(o[1], 1.0);
        assert_eq!(o[2], -1.0);
        assert_eq!(o[3].to_bits(), 0f32.to_bits());
        assert_eq!(o[4].to_bits(), (-0f32).to_bits());
    }

    #[test]
    fn sigmoid_matches_f64_definition_and_special_cases() {
        let xs: Vec<f32> = (-3000..=3000).map(|i| i as f32 * 0.0357).collect();
        let mut out = vec![0f32; xs.len()];
        sigmoid_slice(&xs, &mut out);
        for (&x, &y) in xs.iter().zip(&out) {
            let r = (1.0 / (1.0 + (-(x as f64)).exp())) as f32; // f64 definition, rounded
            assert!(ulp_diff(y, r) <= 2, "sigmoid({x}) = {y}, want {r}");
        }
        // Both sides of the exp range's ends (-87 is redone by the scalar path below it;
        // above 87 the clamp gives e^-87, and 1 + e^-87 rounds to 1), normal and subnormal
        // results, and huge |x| (the clamp keeps the exponent conversion defined).
        for x in [
            -86.99f32, -87.0, -87.01, -88.0, -95.0, -103.0, -104.5, 86.99, 87.0, 87.01, 88.5, 1e30,
            -1e30,
        ] {
            let mut o = [0f32];
            sigmoid_slice(&[x; 1], &mut o);
            let r = (1.0 / (1.0 + (-(x as f64)).exp())) as f32;
            assert!(ulp_diff(o[0], r) <= 2, "sigmoid({x}) = {}, want {r}", o[0]);
            let mut o = [0f32; 19];
            sigmoid_slice(&[x; 19], &mut o);
            assert!(
                o.iter().all(|&y| ulp_diff(y, r) <= 2),
                "sigmoid({x}) in a vector = {o:?}, want {r}"
            );
        }
        let sp = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            100.0,
            -100.0,
            0.0,
        ];
        let mut o = [0f32; 6];
        sigmoid_slice(&sp, &mut o);
        assert!(o[0].is_nan());
        assert_eq!(o[1], 1.0);
        assert_eq!(o[2], 0.0);
        assert_eq!(o[3], 1.0);
        assert!(ulp_diff(o[4], (-100f64).exp() as f32) <= 1);
        assert_eq!(o[5], 0.5);
        // A NaN as the only lane outside the exp range (nothing else sends the slice to
        // the scalar fix-up), at every position of a vector.
        for at in 0..33 {
            let mut xs = vec![0.25f32; 33];
            xs[at] = f32::NAN;
            let mut o = vec![0f32; 33];
            sigmoid_slice(&xs, &mut o);
            assert!(o[at].is_nan(), "sigmoid(NaN) at {at} = {}", o[at]);
        }
    }

    #[test]
    fn silu_bias_is_the_bias_pass_then_silu_bit_for_bit() {
        use std::sync::atomic::{AtomicU32, Ordering};
        // Lengths around the 256-element chunks and the vector widths; values over the
        // exp range's ends, NaN and infinities.
        for n in [1usize, 7, 16, 255, 256, 257, 1000, 12544] {
            let xs: Vec<f32> = (0..n)
                .map(|i| match i % 97 {
                    13 => f32::NAN,
                    29 => f32::INFINITY,
                    31 => f32::NEG_INFINITY,
                    47 => -95.0,
                    _ => (i as f32 * 0.731).sin() * 40.0,
                })
                .collect();
            for b in [0.0f32, -0.375, 2.5] {
                let mut want = xs.clone();
                want.iter_mut().for_each(|v| *v += b);
                let want_bits = crate::kernels::wide::max_abs_bits(&want);
                silu_inplace(&mut want);
                let mut got = xs.clone();
                let seen = AtomicU32::new(0);
                silu_bias_inplace(&mut got, b, Some(&seen));
                for i in 0..n {
                    let (g, w) = (got[i], want[i]);
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "n {n} b {b} at {i}: {g} vs {w}"
                    );
                    // And the definition: y * sigmoid(y) in f64, y = x + b.
                    let y = (xs[i] + b) as f64; // the f32 sum, as the kernel adds
                    let d = (y / (1.0 + (-y).exp())) as f32;
                    if y.is_finite() && y > -80.0 {
                        assert!(ulp_diff(g, d) <= 3, "silu({y}) = {g}, want {d}");
                    }
                }
                assert_eq!(seen.load(Ordering::Relaxed), want_bits, "n {n} b {b}");
                let mut quiet = xs.clone();
                silu_bias_inplace(&mut quiet, b, None);
                assert!(quiet
                    .iter()
                    .zip(&got)
                    .all(|(a, c)| a.to_bits() == c.to_bits() || a.is_nan()));
            }
        }
    }

    /// The sigmoid's `e^-x` table is `2^(j/16)` split into two f32 (the rounded value and
    /// the rounded rest), from f64's `exp2`; its polynomial's `c2` is the closed form
    /// [`EXPN_POLY`] gives, and that polynomial is within 0.015·2^-23 of `e^r − 1` relative
    /// to `e^r` on `|r| ≤ ln 2/32` (f64 evaluation, 20001 points).
    #[test]
    fn exp_neg_table_and_polynomial_are_their_definitions() {
        for (j, (&hi, &lo)) in EXP2_16THS[0].iter().zip(&EXP2_16THS[1]).enumerate() {
            let v = (j as f64 / 16.0).exp2();
            assert_eq!(hi, v as f32, "2^({j}/16)");
            assert_eq!(lo, (v - hi as f64) as f32, "2^({j}/16) rest");
            let sum = hi as f64 + lo as f64;
            assert!(
                ((sum - v) / v).abs() < 2f64.powi(-45),
                "2^({j}/16) in two parts"
            );
        }
        let a = std::f64::consts::LN_2 / 32.0;
        assert_eq!(EXPN_POLY[0], (1.0f64 / 6.0) as f32);
        assert_eq!(
            EXPN_POLY[1],
            (0.5 + (2f64.sqrt() - 1.0) * a * a / 12.0) as f32
        );
        let (c3, c2) = (EXPN_POLY[0] as f64, EXPN_POLY[1] as f64);
        let worst = (-10_000..=10_000)
            .map(|i| {
                let r = a * 1.001 * i as f64 / 10_000.0;
                ((1.0 + r + r * r * (c2 + c3 * r)) / r.exp() - 1.0).abs()
            })
            .fold(0.0f64, f64::max);
        assert!(worst < 0.015 * 2f64.powi(-23), "{worst:e}");
    }

    /// `e^-x` within 0.6 ulp (relative, against f64) and the sigmoid within 1.25·|y|·2^-23
    /// on every 97th f32 in [-87, 88] (a sweep of every f32 there gave at most 1.241·2^-23,
    /// the same as the Cephes exp it replaced).
    #[test]
    fn exp_neg_and_sigmoid_error_over_a_sweep() {
        let ulp = 2f64.powi(-23);
        let (mut worst_e, mut worst_s) = (0f64, 0f64);
        let mut xs = Vec::new();
        for (lo, hi) in [(0u32, 88f32.to_bits()), (1u32 << 31, EXP_LO.to_bits())] {
            xs.extend((lo..=hi).step_by(97).map(f32::from_bits));
        }
        let mut sig = vec![0f32; xs.len()];
        sigmoid_slice(&xs, &mut sig);
        for (&x, &y) in xs.iter().zip(&sig) {
            let e = (-(x as f64)).exp();
            if x <= EXPN_X_HI {
                worst_e = worst_e.max(((exp_neg_core(x) as f64 - e) / e).abs());
            }
            let want = 1.0 / (1.0 + e);
            worst_s = worst_s.max(((y as f64 - want) / want).abs());
        }
        assert!(worst_e <= 0.6 * ulp, "e^-x: {}", worst_e / ulp);
        assert!(worst_s <= 1.25 * ulp, "sigmoid: {}", worst_s / ulp);
    }

    /// Inputs for the bit-for-bit checks: a sweep over [-110, 110] by 1/1024 (both ends of
    /// the exp range inside), specials, and pseudo-random bit patterns (every exponent,
    /// NaN payloads, subnormals).
    fn logistic_inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (-112_640..=112_640).map(|i| i as f32 / 1024.0).collect();
        xs.extend([
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -1e-40,
            EXP_LO,
            f32::from_bits(EXP_LO.to_bits() - 1),
            f32::from_bits(EXP_LO.to_bits() + 1),
            EXP_HI,
            -EXP_HI,
        ]);
        let mut r = 0x2545_f491u32;
        xs.extend((0..100_000).map(|_| {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            f32::from_bits(r)
        }));
        xs
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    type Sig = fn(&[f32], &mut [f32]);
    type Silu = fn(&mut [f32], Option<f32>, bool) -> u32;

    /// The SIMD sigmoid and SiLU copies (`logistic`) this CPU can run, by name.
    fn logistic_copies() -> Vec<(&'static str, Sig, Silu)> {
        let mut v: Vec<(&'static str, Sig, Silu)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: checked just above.
                v.push((
                    "avx2",
                    |s, d| unsafe { logistic::sigmoid256(s, d) },
                    |x, b, seen| unsafe { logistic::silu256(x, b, seen) },
                ));
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
                // SAFETY: checked just above.
                v.push((
                    "avx512",
                    |s, d| unsafe { logistic::sigmoid512(s, d) },
                    |x, b, seen| unsafe { logistic::silu512(x, b, seen) },
                ));
            }
        }
        v
    }

    /// The SIMD sigmoid and SiLU (`logistic`, every copy this CPU runs, and the dispatching
    /// `sigmoid_slice` / `silu_bias_inplace`) against the plain loop
    /// [`sigmoid_slice_generic`], bit for bit: on every length around the vector widths and
    /// the four-vector steps (the masked tail), with and without a bias, and the largest
    /// |x| bits the NaN scan folds.
    #[test]
    fn simd_sigmoid_and_silu_are_the_generic_loop_bit_for_bit() {
        let xs = logistic_inputs();
        let mut want = vec![0f32; xs.len()];
        sigmoid_slice_generic(&xs, &mut want);
        let mut sigs: Vec<(&str, Sig)> = vec![("dispatch", sigmoid_slice)];
        let mut silus: Vec<(&str, Silu)> = vec![("dispatch", |v, b, seen| {
            let s = std::sync::atomic::AtomicU32::new(0);
            match b {
                Some(b) => silu_bias_inplace(v, b, seen.then_some(&s)),
                None => silu_inplace(v),
            }
            s.into_inner()
        })];
        for (name, sig, silu) in logistic_copies() {
            sigs.push((name, sig));
            silus.push((name, silu));
        }
        assert!(
            sigs.len() > 1 || !cfg!(target_arch = "x86_64") || !is_x86_feature_detected!("avx2")
        );
        for &(name, sig) in &sigs {
            let mut got = vec![0f32; xs.len()];
            sig(&xs, &mut got);
            for i in 0..xs.len() {
                assert!(
                    same(got[i], want[i]),
                    "{name}: sigmoid({:e}) = {:e}, want {:e}",
                    xs[i],
                    got[i],
                    want[i]
                );
            }
            // Every length up to 80 at a few offsets (one lane below the exp range among
            // them), and what lies past the slice untouched.
            for start in [0usize, 3, 112_640 - 87 * 1024 - 5] {
                for len in 0..80 {
                    let mut out = vec![7f32; len + 1];
                    sig(&xs[start..start + len], &mut out[..len]);
                    for j in 0..len {
                        assert!(same(out[j], want[start + j]), "{name}: len {len} at {j}");
                    }
                    assert_eq!(out[len], 7.0, "{name}: len {len}");
                }
            }
        }
        for b in [None, Some(0.0f32), Some(-0.375), Some(3.0)] {
            let x: Vec<f32> = xs.iter().map(|&v| b.map_or(v, |b| v + b)).collect();
            let mut sig = vec![0f32; x.len()];
            sigmoid_slice_generic(&x, &mut sig);
            let want: Vec<f32> = x.iter().zip(&sig).map(|(&v, &s)| v * s).collect();
            for &(name, silu) in &silus {
                for (start, len) in [
                    (0, xs.len()),
                    (0, 1),
                    (5, 15),
                    (9, 17),
                    (1, 33),
                    (2, 63),
                    (4, 64),
                    (7, 65),
                    (112_640 - 87 * 1024 - 70, 79),
                ] {
                    let mut got = xs[start..start + len].to_vec();
                    let bits = silu(&mut got, b, true);
                    for i in 0..len {
                        let (g, w) = (got[i], want[start + i]);
                        assert!(
                            same(g, w),
                            "{name}: silu b {b:?} ({:e}) = {g:e}, want {w:e}",
                            x[start + i]
                        );
                    }
                    if b.is_some() {
                        let want_bits = crate::kernels::wide::max_abs_bits(&x[start..start + len]);
                        assert_eq!(bits, want_bits, "{name}: b {b:?} len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn erf_of_tiny_and_zero_is_2x_over_sqrt_pi() {
        let xs = [0.0f32, -0.0, 1e-7, -3e-5, f32::MIN_POSITIVE, -1e-40, 1e-45];
        let mut out = [9f32; 7];
        erf_slice(&xs, &mut out);
        for (&x, &got) in xs.iter().zip(&out) {
            // within 1 ulp of the correctly rounded value (the constant is an f32), signs kept
            let want = (x as f64 * std::f64::consts::FRAC_2_SQRT_PI) as f32;
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 1, "erf({x:e}) = {got:e}, want {want:e}");
        }
    }

    #[test]
    fn gelu_keeps_its_negative_tail() {
        let xs = [
            -0.5f32,
            -1.0,
            -2.0,
            -3.0,
            -5.0,
            -8.0,
            -12.0,
            0.0,
            1.0,
            3e38,
            f32::NAN,
        ];
        let mut out = [0f32; 11];
        gelu_slice(&xs, &mut out);
        for (&x, &got) in xs.iter().zip(&out) {
            let w = 0.5 * x as f64 * erfc_ref(-x as f64 / std::f64::consts::SQRT_2);
            if x.is_nan() {
                assert!(got.is_nan());
                continue;
            }
            let tol = 16.0 * f32::EPSILON as f64 * w.abs();
            assert!(
                (got as f64 - w).abs() <= tol,
                "gelu({x}) = {got:e}, want {w:e}"
            );
        }
    }

    /// The reference erfc: `rlx_ir`'s f64 one (libm's).
    fn erfc_ref(x: f64) -> f64 {
        rlx_ir::op::erfc_f64(x)
    }

    #[test]
    fn erf_matches_table_values() {
        // Abramowitz & Stegun table 7.1 values.
        let table = [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (1.5, 0.966_105_146_5),
            (2.0, 0.995_322_265_0),
            (-1.0, -0.842_700_792_9),
            (3.0, 0.999_977_909_5),
            (10.0, 1.0),
        ];
        let xs: Vec<f32> = table.iter().map(|t| t.0).collect();
        let mut out = vec![0f32; xs.len()];
        erf_slice(&xs, &mut out);
        for ((x, want), got) in table.iter().zip(&out) {
            assert!(
                (*got as f64 - want).abs() < 3e-7,
                "erf({x}) = {got}, want {want}"
            );
        }
        let mut o = [0f32; 3];
        erf_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &mut o);
        assert!(o[0].is_nan());
        assert_eq!(o[1], 1.0);
        assert_eq!(o[2], -1.0);
    }
}
