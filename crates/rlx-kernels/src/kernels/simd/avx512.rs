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
