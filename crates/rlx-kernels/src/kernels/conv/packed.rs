//! RLX's own f32 conv product (issue 34): `out[M][P] = W[M][K] · X[K][P]` for a 2-D conv
//! with one group, on weights packed once when the executor is built ([`PackedConv`]).
//!
//! Why not the gemm crate here (bench/NOTES.md §24–25): with NCHW output it reads the
//! weights unpacked, so each weight miss stalls its micro-kernel, and a 7² plane (49
//! positions) ends every column tile with a one-position call. This kernel puts the output
//! channels on the vector side instead (NCHWc-style): the weights are packed as
//! `[M/mb][K][mb]` (`mb` = 32 channels on AVX-512, 16 on AVX2), so one tile's weights are
//! one sequential stream that the hardware prefetcher runs ahead of the FMAs, and each
//! input value `X[k][p]` is broadcast against them. A tile is `mb` channels × `np`
//! positions (up to 10 on AVX-512, 20 accumulators; up to 6 on AVX2, 12), and a plane is
//! cut into tiles of near-equal width (49 = 5 tiles of 10/10/10/10/9), so no tile runs a
//! single position. Each tile is written `[np][mb]` into a per-thread stripe, which is
//! transposed into the NCHW output rows by 8×8 blocks; the bias, residual, clamp and
//! `post` then run per output row exactly as in [`super::im2col::conv_float`] (the same
//! functions, the same order), so the fused epilogues and the NaN scan behave as there.
//!
//! `X` is the input planes themselves for a stride-1 1×1 conv, the gathered pixels for a
//! strided 1×1 conv, and im2col's column matrix (a block of output rows at a time) for
//! any other. Sums run over `k` in order, one FMA each, from +0: values differ from gemm's
//! by rounding only (the tests' bound: `|Δ| ≤ 4·K·ε·Σ|w·x|`).

use super::common::{with_col, with_scratch, Epilogue, Geo, SendPtr, PANELS, PHASES};
use super::im2col::{im2col_2d, CONV_SPLIT_FLOPS};
use super::pack::{count_run, near_equal_tiles, task_blocks, MkIsa, PackedConv, Slice, Split};
use super::packed_rows::RowsRes;
use crate::kernels::simd::{isa_cap, IsaCap};

/// Bytes of a task's `X` block (`K` rows of its positions) and its output stripe together:
/// inside L2.
const CHUNK_BYTES: usize = 768 << 10;

/// Most `K` rows per pass: a channel block's `KC` rows of weights (16 KB at 32 channels)
/// stay in L1 for every tile of positions (`packed_timing`, 1 thread: 128 read within
/// noise of 256 and 512, a little ahead on 1000←512 at 13²).
pub(super) const KC: usize = 128;

/// True when `pk` (packed from weights of dims `wdims`) fits conv `g` on this CPU.
pub(super) fn fits(pk: &PackedConv, wdims: &[usize], g: &Geo) -> bool {
    g.sp.len() == 2
        && g.groups == 1
        && wdims == pk.wdims.as_slice()
        && g.m == pk.m
        && g.c * g.ks.iter().product::<usize>() == pk.k
        && match pk.isa {
            MkIsa::Avx512 => isa_cap() == IsaCap::Avx512,
            MkIsa::Avx2 => isa_cap() >= IsaCap::Avx2,
        }
        && (!pk.rows || (g.ks == [1, 1] && g.pads == [(0, 0); 2]))
}

/// The conv `g` through `pk`'s kernel, with `epi` (and the residual `res`, added after the
/// bias) per output row as [`super::im2col::conv_float`] applies them. None (nothing
/// computed) where `pk` does not fit `g` (other weights, groups, rank).
pub(super) fn conv_packed_f32(
    x: &[f32],
    pk: &PackedConv,
    wdims: &[usize],
    g: &Geo,
    epi: &Epilogue,
    res: Option<&[f32]>,
) -> Option<Vec<f32>> {
    if !fits(pk, wdims, g) {
        return None;
    }
    // A strided 1×1 conv without padding reads every s-th pixel: gathered once into
    // [N, C, OH, OW], then a stride-1 product (as conv_float does).
    if g.ks == [1, 1] && g.pads == [(0, 0); 2] && !g.direct() {
        let (h, w_in) = (g.sp[0], g.sp[1]);
        let (oh, ow) = (g.osp[0], g.osp[1]);
        let (sh, sw) = (g.strides[0], g.strides[1]);
        return with_scratch(&PHASES, g.n * g.c * oh * ow, |xs: &mut [f32]| {
            for (src, dst) in x.chunks_exact(h * w_in).zip(xs.chunks_exact_mut(oh * ow)) {
                for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
                    let line = &src[oy * sh * w_in..];
                    for (ox, v) in row.iter_mut().enumerate() {
                        *v = line[ox * sw];
                    }
                }
            }
            let g1 = Geo {
                sp: g.osp.clone(),
                strides: vec![1, 1],
                ks: g.ks.clone(),
                osp: g.osp.clone(),
                pads: g.pads.clone(),
                dil: g.dil.clone(),
                ..*g
            };
            Some(run_any(xs, pk, &g1, epi, res))
        });
    }
    Some(run_any(x, pk, g, epi, res))
}

/// [`conv_packed_f32`] for a conv whose residual is a
/// [`super::common::Residual::Into`] buffer `v` (its values; `(conv + r) + bias`): the
/// output, written over `v`, where `pk` is packed for [`super::packed_rows`] and fits a
/// stride-1 `g`; else `v` back, nothing computed.
pub(super) fn conv_packed_into(
    x: &[f32],
    pk: &PackedConv,
    wdims: &[usize],
    g: &Geo,
    epi: &Epilogue,
    v: Vec<f32>,
) -> Result<Vec<f32>, Vec<f32>> {
    if !pk.rows || !fits(pk, wdims, g) || !g.direct() || v.len() != g.n * g.m * g.sp[0] * g.sp[1] {
        return Err(v);
    }
    Ok(super::packed_rows::run(x, pk, g, epi, RowsRes::Into(v)))
}

/// [`run`], or [`super::packed_rows::run`] for weights packed for it.
fn run_any(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: Option<&[f32]>) -> Vec<f32> {
    if pk.rows {
        let res = res.map_or(RowsRes::None, RowsRes::Read);
        super::packed_rows::run(x, pk, g, epi, res)
    } else {
        run(x, pk, g, epi, res)
    }
}

/// [`conv_packed_f32`] once `pk` fits `g`. Per task (an image, a block of output rows,
/// a range of channel blocks): per channel block, per `KC` rows of its weights (read
/// from memory once, in order, then from L1), every tile of positions (`X` read in place
/// from L2), into a stripe `[position][mb]`; then the stripe goes to the block's NCHW
/// output rows with the epilogue.
fn run(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: Option<&[f32]>) -> Vec<f32> {
    // The in-place kernel has no half-block tile (only 1×1 convs get half blocks).
    if super::packed_im::takes(g) && !pk.half_last() {
        return super::packed_im::run(x, pk, g, epi, res);
    }
    run_cols(x, pk, g, epi, res)
}

/// [`run`] through im2col's column matrix (or the input planes of a stride-1 1×1 conv).
fn run_cols(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: Option<&[f32]>) -> Vec<f32> {
    let min = if panels_on() {
        PANEL_MIN_BLOCKS
    } else {
        usize::MAX
    };
    run_cols_with(x, pk, g, epi, res, min)
}

/// [`run_cols`], a stride-1 1×1 conv's tasks of at least `panel_min` channel blocks
/// reading their `X` from tile panels ([`panels`]).
fn run_cols_with(
    x: &[f32],
    pk: &PackedConv,
    g: &Geo,
    epi: &Epilogue,
    res: Option<&[f32]>,
    panel_min: usize,
) -> Vec<f32> {
    let (m, k, isa) = (g.m, pk.k, pk.isa);
    let (mb, np_max) = (isa.mb(), isa.np_max());
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let p = oh * ow;
    let plane = g.sp[0] * g.sp[1];
    let total = g.n * m * p;
    count_run();
    let mut out = crate::buffers::overwritten::<f32>(total);
    if total == 0 {
        return out;
    }
    let direct = g.direct();
    let nb = m.div_ceil(mb);
    let kc_max = k.clamp(1, KC);
    // Blocks of output rows whose X and stripe fit CHUNK_BYTES.
    let rows = (CHUNK_BYTES / (4 * (k + mb)) / ow.max(1)).clamp(1, oh);
    let threads = rayon::current_num_threads();
    let par = threads > 1 && g.n * m * p * k >= CONV_SPLIT_FLOPS;
    // Runs of positions only where the columns are the input planes (im2col's are by row).
    let xw = (g.c * plane, m * k);
    let split = Split::new(par, g.n, (oh, ow), rows, direct, xw, nb, threads);
    let tasks = split.tasks();
    let dst = SendPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (ni, (j0, pb), (b0, b1)) = split.task(t);
        let (oy0, oy1) = (j0 / ow.max(1), (j0 + pb).div_ceil(ow.max(1)));
        let xi = &x[ni * g.c * plane..(ni + 1) * g.c * plane];
        let sched = near_equal_tiles(pb, np_max);
        // SAFETY: the CPU has `isa` (checked above); rows b0·mb.. of image ni, columns
        // j0..j0+pb: this task's (disjoint from every other task's); X's rows of `K` hold
        // pb values at stride xs (the planes from j0, or im2col's columns).
        let body = |xp: &[f32], xs: Xs| unsafe {
            task_blocks(
                pk,
                (ni, j0, pb),
                (b0, b1),
                kc_max,
                sched.clone(),
                (dst.get(), m, p),
                (epi, res),
                |s, stripe| slice_tile(isa, s, xp, xs, stripe),
            )
        };
        if direct && b1 - b0 >= panel_min {
            // The tiles' rows of X one after another (`[tile][k][np]`), read by every
            // channel block of the task.
            with_scratch(&PANELS, k * pb, |col: &mut [f32]| {
                fill_panels(&xi[j0..], plane, k, sched.clone().1, col);
                body(col, Xs::Panel(k))
            })
        } else if direct {
            body(&xi[j0..], Xs::Rows(plane))
        } else {
            with_col(k * pb, |col: &mut [f32]| {
                im2col_2d(xi, g, col, (oy0, oy1));
                body(col, Xs::Rows(pb))
            })
        }
    };
    if par {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    out
}

/// Where the rows of `K` of a product's `X` (`K` rows of positions) lie for its tiles.
#[derive(Clone, Copy, Debug)]
pub(super) enum Xs {
    /// Row `k` at `k·xs` (input planes: `xs` is the plane; im2col's columns: the block's
    /// positions).
    Rows(usize),
    /// Tile panels of rows of `K` values ([`fill_panels`]): the tile from position `p0`,
    /// `np` wide, at `p0·K`, its row `k` at `p0·K + k·np`.
    Panel(usize),
}

/// Whether a product whose input `X` is read by `blocks` channel blocks (a stride-1 1×1
/// conv's task, the 1×1 conv of a [`super::pw_dw`] pair, one ξ of Winograd's products)
/// copies `X` into tile panels first ([`fill_panels`]) rather than reading it in place.
/// In place, each tile reads `np` values (up to 40 bytes) from each of `K` rows a plane
/// (Winograd: 16 planes) apart, one or two cache lines per row, for every channel block;
/// in panels a tile's `X` is one sequential run of `K·np` values, at the cost of one copy
/// of `X`. Per conv alone on an Intel Ice Lake VM (1 thread, `rlx bench` min of 4-5
/// interleaved rounds, bench/NOTES.md §49), in place → panels: 2048←512 at 7² 0.88-0.90 →
/// 0.73-0.78 ms, 512←2048 at 7² 0.81-0.85 → 0.71-0.76, 1024←256 at 14² 0.83-0.86 →
/// 0.74-0.79, Winograd's 256←256 3×3 at 14² 1.16-1.20 → 1.03-1.07, and at 8 blocks
/// 256←1024 at 14² 0.83-0.87 → 0.80-0.83; with fewer the copy costs more than it saves
/// (128←512 at 14², 4 blocks, 0.197-0.204 → 0.203-0.209; 64←256, 2 blocks, 0.053-0.055 →
/// 0.058-0.063). Measured on that CPU only; `RLX_CPU_PANELS=0` (read once per process)
/// reads in place everywhere, to time it elsewhere.
pub(super) fn panels(blocks: usize) -> bool {
    blocks >= PANEL_MIN_BLOCKS && panels_on()
}

/// `RLX_CPU_PANELS` not off (read once per process): see [`panels`].
fn panels_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_PANELS"))
}

/// See [`panels`].
const PANEL_MIN_BLOCKS: usize = 8;

/// `X` rows of `pb` positions at stride `xs` in `x` into `panel` (`k·pb` values) as
/// [`Xs::Panel`] lays them for the tiles `tiles` ((first position, width), covering
/// `0..pb` in order): `panel[p0·k + kk·np + j] = x[kk·xs + p0 + j]`.
pub(super) fn fill_panels(
    x: &[f32],
    xs: usize,
    k: usize,
    tiles: impl Iterator<Item = (usize, usize)> + Clone,
    panel: &mut [f32],
) {
    let last = tiles.clone().last().map_or(0, |(p0, np)| p0 + np);
    assert!(
        panel.len() >= k * last && (k == 0 || x.len() >= (k - 1) * xs + last),
        "fill_panels: operands do not fit"
    );
    if isa_cap() == IsaCap::Avx512 && tiles.clone().all(|(_, np)| np <= 16) {
        for (p0, np) in tiles {
            // SAFETY: AVX-512F; rows kk < k of x hold p0 + np values at stride xs, and the
            // panel holds (p0 + np)·k values (asserted above).
            unsafe { panel_avx512(x[p0..].as_ptr(), xs, k, np, panel[p0 * k..].as_mut_ptr()) };
        }
        return;
    }
    for (p0, np) in tiles {
        for (kk, dst) in panel[p0 * k..(p0 + np) * k]
            .chunks_exact_mut(np)
            .enumerate()
        {
            dst.copy_from_slice(&x[kk * xs + p0..kk * xs + p0 + np]);
        }
    }
}

/// One tile's panel: `k` rows of `np ≤ 16` values at stride `xs` from `x` to `d`, one
/// after another, by masked loads and stores (a `memcpy` call per row of a few values
/// cost more than the panels saved: 128←512 at 14² 0.21 → 0.26 ms).
///
/// # Safety
/// AVX-512F; `x` rows `0..k` at stride `xs` hold `np` values each; `d` has room for `k·np`.
#[target_feature(enable = "avx512f")]
unsafe fn panel_avx512(x: *const f32, xs: usize, k: usize, np: usize, d: *mut f32) {
    use std::arch::x86_64::*;
    let mask: __mmask16 = ((1u32 << np) - 1) as u16;
    // SAFETY: the caller's contract; masked lanes are not read or written.
    unsafe {
        for kk in 0..k {
            let v = _mm512_maskz_loadu_ps(mask, x.add(kk * xs));
            _mm512_mask_storeu_ps(d.add(kk * np), mask, v);
        }
    }
}

/// [`tile`] on slice `s` of a product whose rows of `K` lie in `xp` as `xs` says (input
/// planes, im2col's columns, or tile panels), into its positions of `stripe`
/// (`[position][mb]`).
///
/// # Safety
/// The CPU has `isa`; `xp` holds rows `s.k0..s.k0 + s.kc` of the slice's tile (`s.p0 +
/// s.np` values at stride `xs` for [`Xs::Rows`], the tile's panel for [`Xs::Panel`]);
/// `stripe` holds `(s.p0 + s.np)·mb` values.
pub(super) unsafe fn slice_tile(isa: MkIsa, s: &Slice, xp: &[f32], xs: Xs, stripe: &mut [f32]) {
    let (x, xs) = match xs {
        Xs::Rows(xs) => (&xp[s.k0 * xs + s.p0..], xs),
        Xs::Panel(k) => (&xp[s.p0 * k + s.k0 * s.np..], s.np),
    };
    // SAFETY: `s.w` holds kc·mb values (`block_product`); the rest is the caller's.
    unsafe {
        if s.half {
            return tile16(
                s.np,
                s.kc,
                s.k0 > 0,
                s.w.as_ptr(),
                x.as_ptr(),
                xs,
                stripe.as_mut_ptr().add(s.p0 * isa.mb()),
                s.pf,
            );
        }
        tile(
            isa,
            s.np,
            s.kc,
            s.k0 > 0,
            s.w.as_ptr(),
            x.as_ptr(),
            xs,
            stripe.as_mut_ptr().add(s.p0 * isa.mb()),
            s.pf,
        )
    }
}

/// One tile: `np` positions × `isa.mb()` channels, `t[j·mb + i] = (acc ? t[j·mb + i] :
/// +0) + Σ_c w[c·mb + i] · x[c·xs + j]` over `c < k`, one FMA per term, in order.
///
/// # Safety
/// `w` holds `k·mb` values, `x` rows `0..k` at stride `xs` hold `np` values each, `t` has
/// room for `np·mb` (initialized when `acc`); `np` is in `1..=isa.np_max()`; the CPU has
/// `isa`. `pf`: per row of `k`, the line at `pf.0` (and the next when `pf.1 > 16`) is
/// prefetched, `pf.0` advancing `pf.1` floats (any address: a prefetch does not fault).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    isa: MkIsa,
    np: usize,
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    xs: usize,
    t: *mut f32,
    pf: (*const f32, usize),
) {
    macro_rules! go {
        ($f:ident, $($n:literal)*) => {
            match np {
                $($n => $f::<$n>(k, acc, w, x, xs, t, pf),)*
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
    xs: usize,
    t: *mut f32,
    (mut pf, pfl): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: [`tile`]'s contract.
    unsafe {
        let mut a0 = [_mm512_setzero_ps(); NP];
        let mut a1 = [_mm512_setzero_ps(); NP];
        if acc {
            for j in 0..NP {
                a0[j] = _mm512_loadu_ps(t.add(j * 32));
                a1[j] = _mm512_loadu_ps(t.add(j * 32 + 16));
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..k {
            let w0 = _mm512_loadu_ps(wp);
            let w1 = _mm512_loadu_ps(wp.add(16));
            for j in 0..NP {
                let b = _mm512_set1_ps(*xp.add(j));
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
            xp = xp.add(xs);
        }
        for j in 0..NP {
            _mm512_storeu_ps(t.add(j * 32), a0[j]);
            _mm512_storeu_ps(t.add(j * 32 + 16), a1[j]);
        }
    }
}

/// [`tile`] for a last block of at most 16 channels on AVX-512F ([`PackedConv::half_last`]:
/// weights packed 32 wide, the upper 16 of each row the zero padding, not read): one zmm of
/// weights, `np` broadcasts, `np` accumulators. `t`'s positions get their first 16 values
/// (the first 16 lanes of [`tile`]'s, the same sums in the same order); the other 16 are
/// left as they are.
///
/// # Safety
/// As [`tile`]'s for [`MkIsa::Avx512`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile16(
    np: usize,
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    xs: usize,
    t: *mut f32,
    pf: (*const f32, usize),
) {
    macro_rules! go {
        ($($n:literal)*) => {
            match np {
                $($n => tile16_avx512::<$n>(k, acc, w, x, xs, t, pf),)*
                _ => unreachable!("tile width {np}"),
            }
        };
    }
    // SAFETY: the caller's contract.
    unsafe { go!(1 2 3 4 5 6 7 8 9 10 11 12) }
}

/// [`tile16`]'s kernel: one zmm of weights, `NP` broadcasts, `NP` accumulators.
#[target_feature(enable = "avx512f")]
unsafe fn tile16_avx512<const NP: usize>(
    k: usize,
    acc: bool,
    w: *const f32,
    x: *const f32,
    xs: usize,
    t: *mut f32,
    (mut pf, pfl): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: [`tile16`]'s contract.
    unsafe {
        let mut a0 = [_mm512_setzero_ps(); NP];
        if acc {
            for (j, a) in a0.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(t.add(j * 32));
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..k {
            let w0 = _mm512_loadu_ps(wp);
            for (j, a) in a0.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w0, _mm512_set1_ps(*xp.add(j)), *a);
            }
            if pfl > 0 {
                _mm_prefetch::<_MM_HINT_T0>(pf.cast());
                pf = pf.wrapping_add(pfl);
            }
            wp = wp.add(32);
            xp = xp.add(xs);
        }
        for (j, a) in a0.iter().enumerate() {
            _mm512_storeu_ps(t.add(j * 32), *a);
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
    xs: usize,
    t: *mut f32,
    (mut pf, pfl): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: [`tile`]'s contract.
    unsafe {
        let mut a0 = [_mm256_setzero_ps(); NP];
        let mut a1 = [_mm256_setzero_ps(); NP];
        if acc {
            for j in 0..NP {
                a0[j] = _mm256_loadu_ps(t.add(j * 16));
                a1[j] = _mm256_loadu_ps(t.add(j * 16 + 8));
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..k {
            let w0 = _mm256_loadu_ps(wp);
            let w1 = _mm256_loadu_ps(wp.add(8));
            for j in 0..NP {
                let b = _mm256_broadcast_ss(&*xp.add(j));
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
            xp = xp.add(xs);
        }
        for j in 0..NP {
            _mm256_storeu_ps(t.add(j * 16), a0[j]);
            _mm256_storeu_ps(t.add(j * 16 + 8), a1[j]);
        }
    }
}

#[cfg(test)]
pub(super) fn run_for_test(
    isa: MkIsa,
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
    res: Option<&[f32]>,
) -> Option<Vec<f32>> {
    let (pk, wd) = packed_for_test(isa, w, g);
    conv_packed_f32(x, &pk, &wd, g, epi, res)
}

/// [`run_for_test`] through im2col's columns, never [`super::packed_im`].
#[cfg(test)]
pub(super) fn run_cols_for_test(
    isa: MkIsa,
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
    res: Option<&[f32]>,
) -> Vec<f32> {
    let (pk, wd) = packed_for_test(isa, w, g);
    assert!(fits(&pk, &wd, g));
    run_cols(x, &pk, g, epi, res)
}

/// `w` (conv `g`'s weights) packed for `isa`'s tiles, and their dims.
#[cfg(test)]
fn packed_for_test(isa: MkIsa, w: &[f32], g: &Geo) -> (PackedConv, Vec<usize>) {
    let mut wd = vec![g.m, g.c];
    wd.extend(&g.ks);
    (PackedConv::new(isa, w, &wd), wd)
}

/// [`run_cols_for_test`] with a stride-1 1×1 conv's `X` in tile panels for every task
/// (`panels`) or for none.
#[cfg(test)]
pub(super) fn run_panels_for_test(
    isa: MkIsa,
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
    panels: bool,
) -> Vec<f32> {
    let (pk, wd) = packed_for_test(isa, w, g);
    assert!(fits(&pk, &wd, g) && g.direct());
    let min = if panels { 0 } else { usize::MAX };
    run_cols_with(x, &pk, g, epi, None, min)
}

/// [`tile`] for the tests' timing.
#[cfg(test)]
pub(super) unsafe fn tile_for_test(
    isa: MkIsa,
    np: usize,
    k: usize,
    w: *const f32,
    x: *const f32,
    xs: usize,
    t: *mut f32,
) {
    // SAFETY: the caller's.
    unsafe { tile(isa, np, k, false, w, x, xs, t, (std::ptr::null(), 0)) }
}

/// [`super::packed_rows::run`] on `w` packed for it (a stride-1 1×1 conv `g`), for tests.
#[cfg(test)]
pub(super) fn run_rows_for_test(
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
    res: RowsRes,
) -> Vec<f32> {
    let mut wd = vec![g.m, g.c];
    wd.extend(&g.ks);
    let pk = PackedConv::new_rows(w, &wd);
    assert!(fits(&pk, &wd, g) && g.direct(), "a stride-1 1x1 conv");
    super::packed_rows::run(x, &pk, g, epi, res)
}
