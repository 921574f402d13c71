//! [`super::packed`]'s product for a conv with a kernel larger than 1×1, without im2col:
//! the tiles read the input where it lies (issue 34, bench/NOTES.md §31).
//!
//! im2col writes `K = C·KH·KW` values per output position (a 3×3 conv: nine copies of its
//! input) that the tiles then read back; in ResNet-50's 3×3 stride-2 convs that copy was
//! 22% of the conv's time (`perf`, 128←128 at 28²). Here the input is copied once into
//! zero-padded planes `[C][HP][WP]` (its size, not nine times it), and the tile reads
//! the value of product row `k = (c, ky, kx)` for output position `(oy, ox)` at
//! `koff[k] + poff[(oy, ox)]`, with `koff[k] = c·HP·WP + ky·dh·WP + kx·dw` and
//! `poff = oy·sh·WP + ox·sw`: a table of `K` offsets made per call and one of each tile's
//! positions. A tile's positions may span output rows, so a plane is cut into tiles of
//! near-equal width as in [`super::packed`] (7² = 49 positions: 10/10/10/10/9).
//!
//! The sums run over `k` in the same order, one FMA each, from +0, on the same packed
//! weights: the values are bit for bit those of [`super::packed`]'s im2col path (the
//! padding's zeros are the zeros im2col writes); the tests check that and the f64
//! definition.

use super::common::{with_scratch, Epilogue, Geo, SendPtr, PHASES};
use super::im2col::CONV_SPLIT_FLOPS;
use super::pack::{count_run, im_enabled, task_blocks, MkIsa, PackedConv, Split};

/// Bytes of a task's input rows (all channels) and its output stripe together: inside L2.
const CHUNK_BYTES: usize = 768 << 10;

/// Most `K` rows per pass (as [`super::packed`]'s `KC`).
const KC: usize = 128;

/// True when this file runs conv `g` (2-D, one group; any kernel, stride, padding and
/// dilation, not a stride-1 1×1 conv without padding, whose input needs no copy).
pub(super) fn takes(g: &Geo) -> bool {
    g.sp.len() == 2 && g.groups == 1 && !g.direct() && im_enabled()
}

/// The conv `g` (which [`takes`]) through `pk`'s tiles, reading `x` through zero-padded
/// planes; the epilogue as [`super::packed`]'s.
pub(super) fn run(
    x: &[f32],
    pk: &PackedConv,
    g: &Geo,
    epi: &Epilogue,
    res: Option<&[f32]>,
) -> Vec<f32> {
    let (m, k, isa) = (g.m, pk.k(), pk.isa());
    let (mb, np_max) = (isa.mb(), isa.np_max());
    let (h, w) = (g.sp[0], g.sp[1]);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = oh * ow;
    let total = g.n * m * p;
    count_run();
    let mut out = crate::buffers::overwritten::<f32>(total);
    if total == 0 {
        return out;
    }
    // Padded planes: every row and column any output reads, zeros outside the input.
    let hp = ((oh - 1) * sh + (kh - 1) * dh + 1).max(pt + h);
    let wp = ((ow - 1) * sw + (kw - 1) * dw + 1).max(pl + w);
    let pplane = hp * wp;
    let koff: Vec<usize> = (0..g.c)
        .flat_map(|c| {
            (0..kh).flat_map(move |a| (0..kw).map(move |b| c * pplane + a * dh * wp + b * dw))
        })
        .collect();
    debug_assert_eq!(koff.len(), k);
    let nb = m.div_ceil(mb);
    let kc_max = k.clamp(1, KC);
    // Blocks of output rows whose input rows and stripe fit CHUNK_BYTES.
    let in_row = 4 * g.c * wp;
    let rows = (1..=oh)
        .take_while(|&r| {
            ((r - 1) * sh + (kh - 1) * dh + 1) * in_row + 4 * r * ow * mb <= CHUNK_BYTES
        })
        .last()
        .unwrap_or(1);
    let threads = rayon::current_num_threads();
    let par = threads > 1 && g.n * m * p * k >= CONV_SPLIT_FLOPS;
    let xw = (g.c * h * w, m * k);
    let split = Split::new(par, g.n, (oh, ow), rows, true, xw, nb, threads);
    let tasks = split.tasks();
    let dst = SendPtr(out.as_mut_ptr());
    with_scratch(&PHASES, g.n * g.c * pplane, |xp: &mut [f32]| {
        pad_planes(x, g, (hp, wp), xp, par);
        let xp: &[f32] = xp;
        let task = |t: usize| {
            let (ni, (j0, pb), (b0, b1)) = split.task(t);
            let xi = &xp[ni * g.c * pplane..(ni + 1) * g.c * pplane];
            let (nt, tiles) = super::pack::near_equal_tiles(pb, np_max);
            // Each tile's position offsets into a padded plane.
            let mut poff = vec![0usize; pb];
            for (i, o) in poff.iter_mut().enumerate() {
                let (oy, ox) = ((j0 + i) / ow, (j0 + i) % ow);
                *o = oy * sh * wp + ox * sw;
            }
            // SAFETY: the CPU has `isa` (checked above); rows b0·mb.. of image ni, columns
            // j0..j0+pb: this task's alone.
            unsafe {
                task_blocks(
                    pk,
                    (ni, j0, pb),
                    (b0, b1),
                    kc_max,
                    (nt, tiles),
                    (dst.get(), m, p),
                    (epi, res),
                    |s, stripe| {
                        // SAFETY: `s.w` holds kc·mb values; every koff + poff is inside
                        // the padded planes `xi` (hp, wp cover every position's taps);
                        // the stripe's tile holds np·mb values.
                        tile(
                            isa,
                            s.np,
                            s.kc,
                            s.k0 > 0,
                            s.w.as_ptr(),
                            xi.as_ptr(),
                            koff[s.k0..].as_ptr(),
                            poff[s.p0..].as_ptr(),
                            stripe.as_mut_ptr().add(s.p0 * mb),
                            s.pf,
                        )
                    },
                )
            }
        };
        if par {
            use rayon::prelude::*;
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
    });
    out
}

/// `x` (`[N][C][H][W]`) into `xp` (`[N][C][HP][WP]`): each plane at row `pt`, column `pl`,
/// zeros around it; over the thread pool's threads when `par`.
fn pad_planes(x: &[f32], g: &Geo, (hp, wp): (usize, usize), xp: &mut [f32], par: bool) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let (hh, ww) = (h.min(hp - pt), w.min(wp - pl));
    let plane = |(src, dst): (&[f32], &mut [f32])| {
        dst[..pt * wp].fill(0.0);
        for (r, drow) in dst[pt * wp..].chunks_exact_mut(wp).enumerate() {
            if r < hh {
                drow[..pl].fill(0.0);
                drow[pl..pl + ww].copy_from_slice(&src[r * w..r * w + ww]);
                drow[pl + ww..].fill(0.0);
            } else {
                drow.fill(0.0);
            }
        }
    };
    if par {
        use rayon::prelude::*;
        x.par_chunks_exact(h * w)
            .zip(xp.par_chunks_exact_mut(hp * wp))
            .with_min_len(8)
            .for_each(plane);
    } else {
        x.chunks_exact(h * w)
            .zip(xp.chunks_exact_mut(hp * wp))
            .for_each(plane);
    }
}

/// One tile: `np` positions × `isa.mb()` channels, `t[j·mb + i] = (acc ? t[j·mb + i] :
/// +0) + Σ_c w[c·mb + i] · x[koff[c] + poff[j]]` over `c < k`, one FMA per term, in order.
///
/// # Safety
/// `w` holds `k·mb` values, `koff` `k` offsets and `poff` `np`, every `x[koff[c] + poff[j]]`
/// is inside `x`'s allocation; `t` has room for `np·mb` (initialized when `acc`); `np` is
/// in `1..=isa.np_max()`; the CPU has `isa`. `pf` as [`super::packed`]'s tile.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: MkIsa,
    np: usize,
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    koff: *const usize,
    poff: *const usize,
    t: *mut f32,
    pf: (*const f32, usize),
) {
    macro_rules! go {
        ($f:ident, $($n:literal)*) => {
            match np {
                $($n => $f::<$n>(k, acc, w, x, koff, poff, t, pf),)*
                _ => unreachable!("tile width {np}"),
            }
        };
    }
    // SAFETY: the caller's contract.
    unsafe {
        match isa {
            MkIsa::Avx512 => go!(tile_avx512, 1 2 3 4 5 6 7 8 9 10 11 12),
            MkIsa::Avx2 => go!(tile_avx2, 1 2 3 4 5 6),
        }
    }
}

/// [`tile`] on AVX-512F: two zmm of weights, `NP` broadcasts, `2·NP` accumulators.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const NP: usize>(
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    koff: *const usize,
    poff: *const usize,
    t: *mut f32,
    (mut pf, pfl): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: [`tile`]'s contract.
    unsafe {
        let mut xs = [x; NP];
        for (j, v) in xs.iter_mut().enumerate() {
            *v = x.add(*poff.add(j));
        }
        let mut a0 = [_mm512_setzero_ps(); NP];
        let mut a1 = [_mm512_setzero_ps(); NP];
        if acc {
            for j in 0..NP {
                a0[j] = _mm512_loadu_ps(t.add(j * 32));
                a1[j] = _mm512_loadu_ps(t.add(j * 32 + 16));
            }
        }
        let mut wp = w;
        for c in 0..k {
            let o = *koff.add(c);
            let w0 = _mm512_loadu_ps(wp);
            let w1 = _mm512_loadu_ps(wp.add(16));
            for j in 0..NP {
                let b = _mm512_set1_ps(*xs[j].add(o));
                a0[j] = _mm512_fmadd_ps(w0, b, a0[j]);
                a1[j] = _mm512_fmadd_ps(w1, b, a1[j]);
            }
            if pfl > 0 {
                _mm_prefetch::<_MM_HINT_T0>(pf.cast());
                if pfl > 16 {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(16).cast());
                }
                pf = pf.wrapping_add(pfl);
            }
            wp = wp.add(32);
        }
        for j in 0..NP {
            _mm512_storeu_ps(t.add(j * 32), a0[j]);
            _mm512_storeu_ps(t.add(j * 32 + 16), a1[j]);
        }
    }
}

/// [`tile`] on AVX2 + FMA: two ymm of weights, `NP` broadcasts, `2·NP` accumulators.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const NP: usize>(
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    koff: *const usize,
    poff: *const usize,
    t: *mut f32,
    (mut pf, pfl): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: [`tile`]'s contract.
    unsafe {
        let mut xs = [x; NP];
        for (j, v) in xs.iter_mut().enumerate() {
            *v = x.add(*poff.add(j));
        }
        let mut a0 = [_mm256_setzero_ps(); NP];
        let mut a1 = [_mm256_setzero_ps(); NP];
        if acc {
            for j in 0..NP {
                a0[j] = _mm256_loadu_ps(t.add(j * 16));
                a1[j] = _mm256_loadu_ps(t.add(j * 16 + 8));
            }
        }
        let mut wp = w;
        for c in 0..k {
            let o = *koff.add(c);
            let w0 = _mm256_loadu_ps(wp);
            let w1 = _mm256_loadu_ps(wp.add(8));
            for j in 0..NP {
                let b = _mm256_broadcast_ss(&*xs[j].add(o));
                a0[j] = _mm256_fmadd_ps(w0, b, a0[j]);
                a1[j] = _mm256_fmadd_ps(w1, b, a1[j]);
            }
            if pfl > 0 {
                _mm_prefetch::<_MM_HINT_T0>(pf.cast());
                if pfl > 16 {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(16).cast());
                }
                pf = pf.wrapping_add(pfl);
            }
            wp = wp.add(16);
        }
        for j in 0..NP {
            _mm256_storeu_ps(t.add(j * 16), a0[j]);
            _mm256_storeu_ps(t.add(j * 16 + 8), a1[j]);
        }
    }
}
