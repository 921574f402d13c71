//! [`Lanes`] on AVX-512F + VL at 8 lanes (ymm) with mask registers (`__mmask8`).

use super::avx2::{clamp_256, hmax_bits_256, max_abs_bits_256, nan_out_256, transpose8};
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
