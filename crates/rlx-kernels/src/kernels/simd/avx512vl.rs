//! [`Lanes`] on AVX-512F + VL at 8 lanes (ymm) with mask registers (`__mmask8`).

use super::avx2::ymm_common;
use super::Lanes;
use std::arch::x86_64::*;

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
    ymm_common!();
    #[inline(always)]
    unsafe fn load_m(p: *const f32, m: u8) -> __m256 {
        _mm256_maskz_loadu_ps(m, p)
    }
    #[inline(always)]
    unsafe fn load_or(p: *const f32, m: u8, fill: __m256) -> __m256 {
        _mm256_mask_loadu_ps(fill, m, p)
    }
    #[inline(always)]
    unsafe fn fma_m(w: __m256, x: __m256, acc: __m256, m: u8) -> __m256 {
        _mm256_mask3_fmadd_ps(w, x, acc, m)
    }
    #[inline(always)]
    unsafe fn store_m(p: *mut f32, v: __m256, m: u8) {
        _mm256_mask_storeu_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn zero_off(v: __m256, m: u8) -> __m256 {
        _mm256_maskz_mov_ps(m, v)
    }
    #[inline(always)]
    unsafe fn cmp<const P: i32>(a: __m256, b: __m256) -> u8 {
        _mm256_cmp_ps_mask::<P>(a, b)
    }
    #[inline(always)]
    unsafe fn and_m(a: u8, b: u8) -> u8 {
        a & b
    }
    #[inline(always)]
    unsafe fn or_m(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    unsafe fn not_m(m: u8) -> u8 {
        !m
    }
    #[inline(always)]
    unsafe fn any(m: u8) -> bool {
        m != 0
    }
}
