//! [`Lanes`] on AVX-512F: 16 f32 lanes (zmm), `__mmask16` masks.

use super::Lanes;
use std::arch::x86_64::*;

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
    #[inline(always)]
    unsafe fn load_or(p: *const f32, m: u16, fill: __m512) -> __m512 {
        _mm512_mask_loadu_ps(fill, m, p)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn floor(v: __m512) -> __m512 {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(v)
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m512) -> __m512 {
        let e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
    }
    #[inline(always)]
    unsafe fn scale_pow2(y: __m512, n: __m512) -> __m512 {
        _mm512_scalef_ps(y, n)
    }
    #[inline(always)]
    unsafe fn scale_pow2_floor(y: __m512, m: __m512) -> __m512 {
        _mm512_scalef_ps(y, m)
    }
    #[inline(always)]
    unsafe fn fnms(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmsub_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn lookup16(tab: &[f32; 16], i: __m512) -> __m512 {
        _mm512_permutexvar_ps(_mm512_castps_si512(i), _mm512_loadu_ps(tab.as_ptr()))
    }
    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        _mm512_reduce_max_ps(v)
    }
    #[inline(always)]
    unsafe fn cmp<const P: i32>(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<P>(a, b)
    }
    #[inline(always)]
    unsafe fn and_m(a: u16, b: u16) -> u16 {
        a & b
    }
    #[inline(always)]
    unsafe fn or_m(a: u16, b: u16) -> u16 {
        a | b
    }
    #[inline(always)]
    unsafe fn not_m(m: u16) -> u16 {
        !m
    }
    #[inline(always)]
    unsafe fn any(m: u16) -> bool {
        m != 0
    }
    #[inline(always)]
    unsafe fn even(a: __m512, b: __m512) -> __m512 {
        let idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        _mm512_permutex2var_ps(a, idx, b)
    }
    #[inline(always)]
    unsafe fn odd(a: __m512, b: __m512) -> __m512 {
        let idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        _mm512_permutex2var_ps(a, idx, b)
    }
    #[inline(always)]
    unsafe fn shift_in(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(
            _mm512_castps_si512(b),
            _mm512_castps_si512(a),
        ))
    }
    type D = __m512d;
    #[inline(always)]
    unsafe fn zero_d() -> __m512d {
        _mm512_setzero_pd()
    }
    #[inline(always)]
    unsafe fn add8_d(acc: __m512d, p: *const f32) -> __m512d {
        _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(p)))
    }
    #[inline(always)]
    unsafe fn lanes_d(acc: __m512d) -> [f64; 8] {
        let mut lanes = [0f64; 8];
        _mm512_storeu_pd(lanes.as_mut_ptr(), acc);
        lanes
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
