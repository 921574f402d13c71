//! [`Lanes`] on AVX2 + FMA: 8 f32 lanes (ymm), lane masks in a vector (`__m256i`, all
//! ones or all zeros per lane). The 8-lane helpers here serve [`super::Avx512Y`] too.

use super::Lanes;
use std::arch::x86_64::*;

/// [`Lanes::clamp`] on 8 lanes (ymm), for [`super::Avx512Y`] and [`Avx2`].
#[inline(always)]
pub(super) unsafe fn clamp_256(v: __m256, lo: __m256, hi: __m256) -> __m256 {
    _mm256_min_ps(hi, _mm256_max_ps(lo, v))
}

/// [`Lanes::nan_out`] on 8 lanes (ymm), for [`super::Avx512Y`] and [`Avx2`].
#[inline(always)]
pub(super) unsafe fn nan_out_256(v: __m256) -> __m256 {
    let m = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
    _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), m)
}

/// [`Lanes::max_abs_bits`] on 8 lanes (ymm), for [`super::Avx512Y`] and [`Avx2`].
#[inline(always)]
pub(super) unsafe fn max_abs_bits_256(acc: __m256, v: __m256) -> __m256 {
    let abs = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff));
    _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), abs))
}

/// [`Lanes::hmax_bits`] on 8 lanes (ymm).
#[inline(always)]
pub(super) unsafe fn hmax_bits_256(acc: __m256) -> u32 {
    let lanes: [u32; 8] = std::mem::transmute(acc);
    lanes.into_iter().max().unwrap_or(0)
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

/// Transpose the first 8 rows of 8 f32 in registers: `r[i][j]` becomes `r[j][i]` for
/// `i, j < 8`.
#[inline(always)]
pub(crate) unsafe fn transpose8(r: &mut [__m256; 16]) {
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
