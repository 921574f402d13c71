//! One SIMD layer for the x86-64 kernels: the [`Lanes`] trait, `N` f32 lanes of one
//! register width and their lane masks, with one type per instruction set, each in its own
//! file: [`Avx512`] (16 lanes, zmm), [`Avx512Y`] (AVX-512VL on 8 lanes, ymm, with mask
//! registers) and [`Avx2`] (8 lanes, ymm, with vector masks). A kernel written once over
//! `S: Lanes` and compiled inside a `#[target_feature]` function of `S`'s features becomes
//! that instruction set's kernel (the depthwise conv's, `conv::dw_simd`; the Softmax row
//! kernel, `reduce::softmax_lanes`; MaxPool 3×3 stride 2, `pool::max2d`). Every method is
//! one instruction or a fixed sequence, the same operations in the same order per lane on
//! every width: a kernel's bits do not depend on which type it runs on (the horizontal
//! [`Lanes::hmax`] aside, whose order only matters between ±0 and NaN lanes). [`exp`] is
//! `fastmath`'s exp polynomial over any of them, [`exp_neg`] the sigmoid's table-driven
//! `e^-x`.

mod avx2;
mod avx512;
mod avx512vl;

pub(crate) use avx2::{transpose8, Avx2};
pub(crate) use avx512::Avx512;
pub(crate) use avx512vl::Avx512Y;

/// One SIMD width: `N` f32 lanes, a lane mask type `M`.
pub(crate) trait Lanes {
    const N: usize;
    type V: Copy;
    type M: Copy + Send + Sync;
    /// Lanes `l` with `a <= l < b`.
    fn range(a: usize, b: usize) -> Self::M;
    unsafe fn splat(v: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    /// Masked-off lanes read as 0 and are not accessed.
    unsafe fn load_m(p: *const f32, m: Self::M) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `w * x + acc` in one rounding.
    unsafe fn fma(w: Self::V, x: Self::V, acc: Self::V) -> Self::V;
    /// As [`Lanes::fma`] on the lanes of `m`; the other lanes keep `acc`.
    unsafe fn fma_m(w: Self::V, x: Self::V, acc: Self::V, m: Self::M) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn store_m(p: *mut f32, v: Self::V, m: Self::M);
    /// `Min(Max(v, lo), hi)` per lane as [`Clamp`](crate::kernels::conv::Clamp) defines it (`maxps(lo, v)`
    /// then `minps(hi, ·)`: a NaN `v` comes through, a `v` equal to a bound is kept).
    unsafe fn clamp(v: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
    /// `f32::NAN` in the NaN lanes of `v`.
    unsafe fn nan_out(v: Self::V) -> Self::V;
    /// Per lane, the larger of `acc` and `v`'s bits with the sign cleared, as unsigned
    /// integers (`acc` holds bits, not a float; a NaN's bits are above +inf's).
    unsafe fn max_abs_bits(acc: Self::V, v: Self::V) -> Self::V;
    /// The largest lane of a [`Lanes::max_abs_bits`] accumulator.
    unsafe fn hmax_bits(acc: Self::V) -> u32;
    /// `v` with the lanes outside `m` set to 0.
    unsafe fn zero_off(v: Self::V, m: Self::M) -> Self::V;
    /// Transpose the first `N` rows of `N` lanes in registers: `r[i][j]` becomes
    /// `r[j][i]` for `i, j < N` (rows past `N` untouched).
    unsafe fn transpose(r: &mut [Self::V; 16]);
    /// [`Lanes::load_m`] with the masked-off lanes `fill` (not accessed).
    unsafe fn load_or(p: *const f32, m: Self::M, fill: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// `maxps(a, b)`: per lane `a > b ? a : b`, so `b` when either is NaN, and of ±0 `b`.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `minps(a, b)`: per lane `a < b ? a : b` (`b` when either is NaN, of ±0 `b`).
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Rounded toward -inf.
    unsafe fn floor(v: Self::V) -> Self::V;
    /// `2^n` per lane for `n` integral in [-126, 127]: the float with exponent bits
    /// `n + 127` (`n` converted with truncation).
    unsafe fn pow2i(n: Self::V) -> Self::V;
    /// `y · 2^n` per lane for `n` integral in [-126, 127], rounded once: bit for bit
    /// `mul(y, pow2i(n))` (`2^n` is exact, so both are the correctly rounded product). On
    /// AVX-512 one `vscalefps` in place of the conversion, shift, add and product.
    unsafe fn scale_pow2(y: Self::V, n: Self::V) -> Self::V;
    /// `y · 2^floor(m)` per lane for `floor(m)` in [-126, 127], rounded once: bit for bit
    /// `mul(y, pow2i(floor(m)))`. On AVX-512 one `vscalefps` (which floors `m` itself).
    unsafe fn scale_pow2_floor(y: Self::V, m: Self::V) -> Self::V;
    /// `-(a · b) - c` in one rounding (`vfnmsub`): bit for bit `fma(-a, b, -c)`.
    unsafe fn fnms(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `tab[j]` per lane, `j` the low 4 bits of `i`'s bits (a 16-entry table: one `vpermps`
    /// on 16 lanes; two and a blend on 8).
    unsafe fn lookup16(tab: &[f32; 16], i: Self::V) -> Self::V;
    /// The largest lane (the reduction's order is the instruction set's; of ±0 or with a
    /// NaN lane, which one comes out is not specified).
    unsafe fn hmax(v: Self::V) -> f32;
    /// Lanes where `a P b` holds, `P` an `_CMP_*` predicate of `_mm256_cmp_ps`.
    unsafe fn cmp<const P: i32>(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn and_m(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn or_m(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn not_m(m: Self::M) -> Self::M;
    /// Whether any lane of `m` is set.
    unsafe fn any(m: Self::M) -> bool;
    /// Lanes `0, 2, …, 2N - 2` of the `2N` lanes `a ++ b`.
    unsafe fn even(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes `1, 3, …, 2N - 1` of the `2N` lanes `a ++ b`.
    unsafe fn odd(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes `1..N` of `a`, then lane 0 of `b` (`a ++ b` one lane on).
    unsafe fn shift_in(a: Self::V, b: Self::V) -> Self::V;
    /// 8 f64 lanes (one register or two).
    type D: Copy;
    unsafe fn zero_d() -> Self::D;
    /// `acc` plus the 8 f32 at `p` widened: lane `j` adds `p[j]`.
    unsafe fn add8_d(acc: Self::D, p: *const f32) -> Self::D;
    /// The 8 lanes of `acc`, in order.
    unsafe fn lanes_d(acc: Self::D) -> [f64; 8];
}

/// `fastmath::exp_clamped` of `x` clamped to [`EXP_LO`, `EXP_HI`], op for op (its
/// constants `EXP_LN2` and `EXP_POLY`, the same fused multiply-adds), so its bits in every
/// lane; a NaN lane comes out finite (the clamp drops it).
///
#[inline(always)]
pub(crate) unsafe fn exp<S: Lanes>(x: S::V) -> S::V {
    // SAFETY: register operations only; the caller has `S`'s features. (`S::splat`, not a
    // closure: a closure does not take the caller's `#[target_feature]`.)
    unsafe {
        let xc = S::min(S::max(x, S::splat(EXP_LO)), S::splat(EXP_HI));
        let n = S::floor(S::fma(
            xc,
            S::splat(std::f32::consts::LOG2_E),
            S::splat(0.5),
        ));
        let r = S::fma(n, S::splat(EXP_LN2[0]), xc);
        let r = S::fma(n, S::splat(EXP_LN2[1]), r);
        let mut p = S::splat(EXP_POLY[0]);
        for &k in &EXP_POLY[1..] {
            p = S::fma(p, r, S::splat(k));
        }
        let y = S::add(S::fma(S::mul(p, r), r, r), S::splat(1.0));
        S::scale_pow2(y, n)
    }
}

/// `e^-x` for the logistic sigmoid (`fastmath::exp_neg_core`, op for op, so its bits in
/// every lane) for `x` in [[`EXP_LO`], +inf): `x` is clamped to at most [`EXPN_X_HI`];
/// lanes below `EXP_LO` and NaN lanes come out as some finite or infinite value that the
/// callers replace.
#[inline(always)]
pub(crate) unsafe fn exp_neg<S: Lanes>(x: S::V) -> S::V {
    // SAFETY: register operations only; the caller has `S`'s features.
    unsafe {
        let xc = S::min(x, S::splat(EXPN_X_HI));
        let t = S::fma(
            xc,
            S::splat(-std::f32::consts::LOG2_E),
            S::splat(EXPN_SHIFT),
        );
        let m = S::sub(t, S::splat(EXPN_SHIFT));
        let r = S::fnms(m, S::splat(-EXP_LN2[0]), xc);
        let r = S::fma(m, S::splat(EXP_LN2[1]), r);
        let q = S::fma(S::splat(EXPN_POLY[0]), r, S::splat(EXPN_POLY[1]));
        let u = S::fma(q, S::mul(r, r), r);
        let hi = S::lookup16(&EXP2_16THS[0], t);
        let e = S::add(hi, S::fma(hi, u, S::lookup16(&EXP2_16THS[1], t)));
        S::scale_pow2_floor(e, m)
    }
}

/// The largest `x` whose `e^-x` [`exp_neg`] computes: above it, `e^-87` (normal, 1.6e-38),
/// whose sum with 1 rounds to 1 as the sigmoid's exact value does.
pub(crate) const EXPN_X_HI: f32 = 87.0;
/// 1.5·2^19: `x·(-log2 e) + EXPN_SHIFT` rounds `-x·log2 e` to a multiple of 1/16 (the ulp
/// there), `m`, whose sixteenths are the low 4 bits of the sum's bits (the shift's own
/// low bits are 0) and whose integer part `floor(m)` scales by `2^floor(m)`.
pub(crate) const EXPN_SHIFT: f32 = 786_432.0;
/// `e^r - 1 ≈ r + r²·(c2 + c3·r)` on `|r| ≤ ln 2/32`: `[c3, c2]`, `c3 = 1/6` and `c2 = 1/2 +
/// (√2 − 1)·a²/12` (`a = ln 2/32`), the `c2` that spreads the dropped `r⁴/24` term over the
/// interval (error at most 0.014·2^-23 relative, against Taylor's 0.079).
#[allow(clippy::excessive_precision)]
pub(crate) const EXPN_POLY: [f32; 2] = [1.0 / 6.0, 0.500_016_2];
/// `2^(j/16)` for `j < 16` as two f32, `[hi, lo]`: `hi` the rounded value, `lo` the rounded
/// rest (`2^(j/16) − hi`), so the table is good to about 2^-48 relative.
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub(crate) const EXP2_16THS: [[f32; 16]; 2] = [
    [
        1.0,
        1.044_273_7,
        1.090_507_7,
        1.138_788_6,
        1.189_207_1,
        1.241_857_8,
        1.296_839_6,
        1.354_255_6,
        1.414_213_5,
        1.476_826_2,
        1.542_210_8,
        1.610_490_3,
        1.681_792_9,
        1.756_252_2,
        1.834_008_1,
        1.915_206_6,
    ],
    [
        0.0,
        4.833_470_2e-8,
        -1.307_754e-8,
        5.386_222_3e-8,
        3.797_635_3e-8,
        4.496_838e-8,
        -4.018_999_5e-8,
        -1.012_334_9e-8,
        2.420_323_5e-8,
        -4.500_899e-8,
        8.070_905e-9,
        9.836_217e-9,
        -2.475_532_7e-8,
        -9.235_77e-9,
        -1.123_927_8e-8,
        9.845_328e-9,
    ],
];

/// The widest SIMD the kernels may use: the CPU's best, or less where `RLX_CPU_ISA` asks for
/// it (`avx2`: no AVX-512 kernel; `portable`: no SIMD conv kernel), read once per process.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub(crate) enum IsaCap {
    Portable,
    Avx2,
    Avx512,
}

/// See [`IsaCap`].
pub(crate) fn isa_cap() -> IsaCap {
    static CAP: std::sync::OnceLock<IsaCap> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let has = if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
            IsaCap::Avx512
        } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            IsaCap::Avx2
        } else {
            IsaCap::Portable
        };
        let want = match rlx_ir::env::get("RLX_CPU_ISA").as_deref().map(str::trim) {
            None | Some("") | Some("avx512") => IsaCap::Avx512,
            Some("avx2") => IsaCap::Avx2,
            Some("portable") => IsaCap::Portable,
            Some(v) => {
                rlx_ir::env::note_unrecognized("RLX_CPU_ISA", v, "the CPU's best");
                IsaCap::Avx512
            }
        };
        has.min(want)
    })
}

/// True on an AMD CPU (CPUID vendor string `AuthenticAMD`), read once per process (CPUID
/// traps to the hypervisor in a VM). For kernel-choice bounds measured to differ between
/// AMD's and Intel's cores (the AVX-512 of AMD Zen 4 runs each 512-bit operation as two
/// 256-bit halves): today only `conv::pack::min_k` (bench/NOTES.md §41).
pub(crate) fn amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        // CPUID leaf 0: the vendor string in EBX, EDX, ECX.
        let r = std::arch::x86_64::__cpuid(0);
        [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .eq(*b"AuthenticAMD")
    })
}

/// The range of `fastmath::exp_clamped`'s argument (outside it `fastmath` takes other
/// paths), here beside [`exp`] so that the SIMD layer imports nothing of `fastmath`.
pub(crate) const EXP_LO: f32 = -87.0;
pub(crate) const EXP_HI: f32 = 88.0;
/// Cephes `expf`'s constants: `r = x + n·EXP_LN2[0] + n·EXP_LN2[1]` (−ln 2 in two parts,
/// Cephes' C1 and C2 negated) and the degree-5 polynomial on `r`, highest power first.
/// Shared with the SIMD Softmax kernel (`simd::exp`, `reduce::softmax_lanes`).
pub(crate) const EXP_LN2: [f32; 2] = [-0.693_359_4, 2.121_944_4e-4];
#[allow(clippy::excessive_precision)] // the coefficients as Cephes publishes them
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];
