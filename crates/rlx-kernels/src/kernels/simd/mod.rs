//! One SIMD layer for the x86-64 kernels: the [`Lanes`] trait, `N` f32 lanes of one
//! register width and their lane masks, with one type per instruction set, each in its own
//! file: [`Avx512`] (16 lanes, zmm), [`Avx512Y`] (AVX-512VL on 8 lanes, ymm, with mask
//! registers) and [`Avx2`] (8 lanes, ymm, with vector masks). A kernel written once over
//! `S: Lanes` and compiled inside a `#[target_feature]` function of `S`'s features becomes
//! that instruction set's kernel (the depthwise conv's, `conv::dw_simd`). Every method is
//! one instruction or a fixed sequence, the same operations in the same order per lane on
//! every width: a kernel's bits do not depend on which type it runs on.

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
}

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
