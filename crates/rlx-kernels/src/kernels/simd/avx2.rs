//! [`Lanes`] on AVX2 + FMA: 8 f32 lanes (ymm), lane masks in a vector (`__m256i`, all
//! ones or all zeros per lane). The methods whose ymm code does not depend on the mask type
//! ([`ymm_common!`]) serve [`super::Avx512Y`] too.

use super::Lanes;
use std::arch::x86_64::*;

/// The [`Lanes`] methods that are the same on every 8-lane (ymm) type, whatever its mask
/// type: inside an `impl Lanes for` of `V = __m256`, `D = [__m256d; 2]`.
macro_rules! ymm_common {
    () => {
        #[inline(always)]
        unsafe fn splat(v: f32) -> __m256 {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
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
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
            _mm256_min_ps(hi, _mm256_max_ps(lo, v))
        }
        #[inline(always)]
        unsafe fn nan_out(v: __m256) -> __m256 {
            let m = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
            _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), m)
        }
        #[inline(always)]
        unsafe fn max_abs_bits(acc: __m256, v: __m256) -> __m256 {
            let abs = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff));
            _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), abs))
        }
        #[inline(always)]
        unsafe fn hmax_bits(acc: __m256) -> u32 {
            let lanes: [u32; 8] = std::mem::transmute(acc);
            lanes.into_iter().max().unwrap_or(0)
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m256; 16]) {
            $crate::kernels::simd::transpose8(r)
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            _mm256_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn div(a: __m256, b: __m256) -> __m256 {
            _mm256_div_ps(a, b)
        }
        #[inline(always)]
        unsafe fn scale_pow2(y: __m256, n: __m256) -> __m256 {
            Self::mul(y, Self::pow2i(n))
        }
        #[inline(always)]
        unsafe fn scale_pow2_floor(y: __m256, m: __m256) -> __m256 {
            Self::mul(y, Self::pow2i(Self::floor(m)))
        }
        #[inline(always)]
        unsafe fn fnms(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fnmsub_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn lookup16(tab: &[f32; 16], i: __m256) -> __m256 {
            let j = _mm256_castps_si256(i);
            let lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab.as_ptr()), j);
            let hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab.as_ptr().add(8)), j);
            // Bit 3 of the index into the sign bit, which `blendv` reads.
            _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(j)))
        }
        #[inline(always)]
        unsafe fn max(a: __m256, b: __m256) -> __m256 {
            _mm256_max_ps(a, b)
        }
        #[inline(always)]
        unsafe fn min(a: __m256, b: __m256) -> __m256 {
            _mm256_min_ps(a, b)
        }
        #[inline(always)]
        unsafe fn floor(v: __m256) -> __m256 {
            _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(v)
        }
        #[inline(always)]
        unsafe fn pow2i(n: __m256) -> __m256 {
            let e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
        #[inline(always)]
        unsafe fn hmax(v: __m256) -> f32 {
            let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
            _mm_cvtss_f32(h)
        }
        #[inline(always)]
        unsafe fn even(a: __m256, b: __m256) -> __m256 {
            // Per 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6; then the 64-bit pieces reordered
            // 0, 2, 1, 3.
            let s = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(s)))
        }
        #[inline(always)]
        unsafe fn odd(a: __m256, b: __m256) -> __m256 {
            let s = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(s)))
        }
        #[inline(always)]
        unsafe fn shift_in(a: __m256, b: __m256) -> __m256 {
            // [a's upper half, b's lower half], then per 128-bit half (that : a) one lane
            // on: a1 a2 a3 a4 | a5 a6 a7 b0.
            let t = _mm256_castps_si256(_mm256_permute2f128_ps::<0x21>(a, b));
            _mm256_castsi256_ps(_mm256_alignr_epi8::<4>(t, _mm256_castps_si256(a)))
        }
        type D = [__m256d; 2];
        #[inline(always)]
        unsafe fn zero_d() -> [__m256d; 2] {
            [_mm256_setzero_pd(); 2]
        }
        #[inline(always)]
        unsafe fn add8_d(acc: [__m256d; 2], p: *const f32) -> [__m256d; 2] {
            [
                _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm_loadu_ps(p))),
                _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm_loadu_ps(p.add(4)))),
            ]
        }
        #[inline(always)]
        unsafe fn lanes_d(acc: [__m256d; 2]) -> [f64; 8] {
            let mut lanes = [0f64; 8];
            _mm256_storeu_pd(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4), acc[1]);
            lanes
        }
    };
}
pub(super) use ymm_common;

pub(crate) struct Avx2;
impl Lanes for Avx2 {
    const N: usize = 8;
    type V = __m256;
    type M = __m256i;
    #[inline(always)]
    fn range(a: usize, b: usize) -> __m256i {
        // Lanes `l < n`: 8 lanes of [-1; 8] ++ [0; 8] from `8 - n` (two loads and an
        // and-not, where a per-lane select compiled to a branch per lane).
        static T: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];
        let upto = |n: usize| -> &[i32] { &T[8 - n.min(8)..][..8] };
        let (hi, lo) = (upto(b), upto(a));
        let lanes: [i32; 8] = std::array::from_fn(|l| hi[l] & !lo[l]);
        // SAFETY: [i32; 8] and __m256i have the same size; every bit pattern is valid.
        unsafe { std::mem::transmute::<[i32; 8], __m256i>(lanes) }
    }
    ymm_common!();
    #[inline(always)]
    unsafe fn load_m(p: *const f32, m: __m256i) -> __m256 {
        _mm256_maskload_ps(p, m)
    }
    #[inline(always)]
    unsafe fn load_or(p: *const f32, m: __m256i, fill: __m256) -> __m256 {
        _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m))
    }
    #[inline(always)]
    unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: __m256i) -> __m256 {
        _mm256_blendv_ps(acc, _mm256_fmadd_ps(w, x, acc), _mm256_castsi256_ps(m))
    }
    #[inline(always)]
    unsafe fn store_m(p: *mut f32, v: __m256, m: __m256i) {
        _mm256_maskstore_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn zero_off(v: __m256, m: __m256i) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(m))
    }
    #[inline(always)]
    unsafe fn cmp<const P: i32>(a: __m256, b: __m256) -> __m256i {
        _mm256_castps_si256(_mm256_cmp_ps::<P>(a, b))
    }
    #[inline(always)]
    unsafe fn and_m(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn or_m(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline(always)]
    unsafe fn not_m(m: __m256i) -> __m256i {
        _mm256_xor_si256(m, _mm256_set1_epi32(-1))
    }
    #[inline(always)]
    unsafe fn any(m: __m256i) -> bool {
        _mm256_movemask_ps(_mm256_castsi256_ps(m)) != 0
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
