//! One SIMD width per type ([`Avx512`], [`Avx512Y`], [`Avx2`]) behind the [`Lanes`]
//! trait that the depthwise kernels are written over.

use std::arch::x86_64::*;

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

pub(crate) struct Avx512;
impl Lanes for Avx512 {
    const N: usize = 16;
    type V = __m512;
    type M = __mmask16;
    fn range(a: usize, b: usize) -> u16 {
        let upto = |n: usize| if n >= 16 { 0xffffu16 } else { (1u16 << n) - 1 };
        if b <= a {
            0
        } else {
            upto(b) & !upto(a)
        }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_m(p: *const f32, m: u16) -> __m512 {
        _mm512_maskz_loadu_ps(m, p)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(w: __m512, x: __m512, acc: __m512) -> __m512 {
        _mm512_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn fma_m(w: __m512, x: __m512, acc: __m512, m: u16) -> __m512 {
        _mm512_mask3_fmadd_ps(w, x, acc, m)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn store_m(p: *mut f32, v: __m512, m: u16) {
        _mm512_mask_storeu_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn clamp(v: __m512, lo: __m512, hi: __m512) -> __m512 {
        _mm512_min_ps(hi, _mm512_max_ps(lo, v))
    }
    #[inline(always)]
    unsafe fn nan_out(v: __m512) -> __m512 {
        let m = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_mask_blend_ps(m, v, _mm512_set1_ps(f32::NAN))
    }
    #[inline(always)]
    unsafe fn max_abs_bits(acc: __m512, v: __m512) -> __m512 {
        let abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fff_ffff));
        _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(acc), abs))
    }
    #[inline(always)]
    unsafe fn hmax_bits(acc: __m512) -> u32 {
        _mm512_reduce_max_epu32(_mm512_castps_si512(acc))
    }
    #[inline(always)]
    unsafe fn zero_off(v: __m512, m: u16) -> __m512 {
        _mm512_maskz_mov_ps(m, v)
    }
    #[inline(always)]
    unsafe fn transpose(r: &mut [__m512; 16]) {
        transpose16(r)
    }
}

/// [`Lanes::clamp`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
#[inline(always)]
unsafe fn clamp_256(v: __m256, lo: __m256, hi: __m256) -> __m256 {
    _mm256_min_ps(hi, _mm256_max_ps(lo, v))
}

/// [`Lanes::nan_out`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
#[inline(always)]
unsafe fn nan_out_256(v: __m256) -> __m256 {
    let m = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
    _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), m)
}

/// [`Lanes::max_abs_bits`] on 8 lanes (ymm), for [`Avx512Y`] and [`Avx2`].
#[inline(always)]
unsafe fn max_abs_bits_256(acc: __m256, v: __m256) -> __m256 {
    let abs = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff));
    _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), abs))
}

/// [`Lanes::hmax_bits`] on 8 lanes (ymm).
#[inline(always)]
unsafe fn hmax_bits_256(acc: __m256) -> u32 {
    let lanes: [u32; 8] = std::mem::transmute(acc);
    lanes.into_iter().max().unwrap_or(0)
}

/// AVX-512VL on 8 lanes (ymm): planes at most 8 columns wide (7×7) leave half of a
/// 16-lane register idle, and a 512-bit op costs two 256-bit ones on some cores (Zen 4).
pub(crate) struct Avx512Y;
impl Lanes for Avx512Y {
    const N: usize = 8;
    type V = __m256;
    type M = __mmask8;
    fn range(a: usize, b: usize) -> u8 {
        let upto = |n: usize| if n >= 8 { 0xffu8 } else { (1u8 << n) - 1 };
        if b <= a {
            0
        } else {
            upto(b) & !upto(a)
        }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_m(p: *const f32, m: u8) -> __m256 {
        _mm256_maskz_loadu_ps(m, p)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(w: __m256, x: __m256, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: u8) -> __m256 {
        _mm256_mask3_fmadd_ps(w, x, acc, m)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn store_m(p: *mut f32, v: __m256, m: u8) {
        _mm256_mask_storeu_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
        clamp_256(v, lo, hi)
    }
    #[inline(always)]
    unsafe fn nan_out(v: __m256) -> __m256 {
        nan_out_256(v)
    }
    #[inline(always)]
    unsafe fn max_abs_bits(acc: __m256, v: __m256) -> __m256 {
        max_abs_bits_256(acc, v)
    }
    #[inline(always)]
    unsafe fn hmax_bits(acc: __m256) -> u32 {
        hmax_bits_256(acc)
    }
    #[inline(always)]
    unsafe fn zero_off(v: __m256, m: u8) -> __m256 {
        _mm256_maskz_mov_ps(m, v)
    }
    #[inline(always)]
    unsafe fn transpose(r: &mut [__m256; 16]) {
        transpose8(r)
    }
}

pub(crate) struct Avx2;
impl Lanes for Avx2 {
    const N: usize = 8;
    type V = __m256;
    type M = __m256i;
    fn range(a: usize, b: usize) -> __m256i {
        let lanes: [i32; 8] = std::array::from_fn(|l| if a <= l && l < b { -1 } else { 0 });
        // SAFETY: [i32; 8] and __m256i have the same size; every bit pattern is valid.
        unsafe { std::mem::transmute::<[i32; 8], __m256i>(lanes) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_m(p: *const f32, m: __m256i) -> __m256 {
        _mm256_maskload_ps(p, m)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(w: __m256, x: __m256, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: __m256i) -> __m256 {
        _mm256_blendv_ps(acc, _mm256_fmadd_ps(w, x, acc), _mm256_castsi256_ps(m))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn store_m(p: *mut f32, v: __m256, m: __m256i) {
        _mm256_maskstore_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
        clamp_256(v, lo, hi)
    }
    #[inline(always)]
    unsafe fn nan_out(v: __m256) -> __m256 {
        nan_out_256(v)
    }
    #[inline(always)]
    unsafe fn max_abs_bits(acc: __m256, v: __m256) -> __m256 {
        max_abs_bits_256(acc, v)
    }
    #[inline(always)]
    unsafe fn hmax_bits(acc: __m256) -> u32 {
        hmax_bits_256(acc)
    }
    #[inline(always)]
    unsafe fn zero_off(v: __m256, m: __m256i) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(m))
    }
    #[inline(always)]
    unsafe fn transpose(r: &mut [__m256; 16]) {
        transpose8(r)
    }
}

/// Transpose 16 rows of 16 f32 in registers: `r[i][j]` becomes `r[j][i]`.
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    // SAFETY: register shuffles only; the caller has AVX-512F.
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for i in 0..4 {
            let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
            let pd = |x: __m512| _mm512_castps_pd(x);
            r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
            r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
            r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
            r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
        }
        for i in 0..2 {
            for j in 0..4 {
                let (a, b) = (r[8 * i + j], r[8 * i + 4 + j]);
                t[8 * i + j] = _mm512_shuffle_f32x4::<0x88>(a, b);
                t[8 * i + 4 + j] = _mm512_shuffle_f32x4::<0xdd>(a, b);
            }
        }
        for j in 0..8 {
            r[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[8 + j]);
            r[8 + j] = _mm512_shuffle_f32x4::<0xdd>(t[j], t[8 + j]);
        }
    }
}

/// Transpose the first 8 rows of 8 f32 in registers: `r[i][j]` becomes `r[j][i]` for
/// `i, j < 8`.
#[inline(always)]
unsafe fn transpose8(r: &mut [__m256; 16]) {
    // SAFETY: register shuffles only; the caller has AVX2.
    unsafe {
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm256_setzero_ps(); 8];
        for i in 0..2 {
            let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
            u[4 * i] = _mm256_shuffle_ps::<0x44>(a, c);
            u[4 * i + 1] = _mm256_shuffle_ps::<0xee>(a, c);
            u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(b, d);
            u[4 * i + 3] = _mm256_shuffle_ps::<0xee>(b, d);
        }
        for j in 0..4 {
            r[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
            r[4 + j] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
        }
    }
}
