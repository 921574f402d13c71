//! Pointwise (1×1) convs on large planes with the output *positions* on the vector side:
//! `out[M][P] = W[M][K] · X[K][P]` with `X` the input planes read where they lie and the
//! weights packed once as `[ceil(M/MR)][K][MR]` ([`super::pack::pack_rows`]), on AVX-512F.
//!
//! Why beside [`super::packed`]'s kernel (channels on the vector side): on planes larger
//! than 14² that kernel lost to gemm (256←64 at 56²: 918 against 611 µs hot, bench/NOTES.md
//! §26) because its tiles are written `[position][channel]` and must be transposed into
//! NCHW rows. Here a tile is [`MR`] output channels × up to [`NV`] 16-lane vectors of
//! consecutive positions: per `k`, `NV` loads of row `k` of `X` (contiguous in NCHW), `MR`
//! broadcasts of the block's weights (one sequential stream, as gemm's packed operand but
//! packed once, when the executor is built), `MR·NV` FMAs; the sums are stored straight
//! into the `MR` output rows, the last vector of a row masked. No packing of `X`, no
//! transposition.
//!
//! Definition and rounding: as [`super::packed`] (sums over `k` in order, one FMA per term,
//! from +0; then the epilogue per output row with `conv_float`'s functions), so values
//! differ from gemm's by rounding only and a NaN or ±Inf input reaches the same outputs.

use super::common::{with_scratch, Act, Epilogue, Geo, SendPtr, PRODUCTS};
use super::im2col::CONV_SPLIT_FLOPS;
use super::pack::{finish_rows, PackedConv, MR};
use crate::kernels::simd::{Avx512, Lanes};

/// 16-lane vectors of positions per tile (64 positions).
const NV: usize = 4;

/// Positions per tile.
const TILE: usize = NV * 16;

/// Bytes of a chunk's output (every channel, its positions): inside L2, so that the
/// channel blocks' partial sums (per [`KC`] rows) and the epilogue read it from there.
const OUT_BYTES: usize = 256 << 10;

/// Rows of `X` per pass: a tile's `KC × 64` inputs (16 KB) stay in L1 while every channel
/// block runs on them.
const KC: usize = 64;

/// A conv's residual as [`run`] takes it.
pub(super) enum RowsRes<'a> {
    None,
    /// `(conv + bias) + r`, added per row by the epilogue.
    Read(&'a [f32]),
    /// A [`super::common::Residual::Into`] buffer: `r` is added to the sums in registers
    /// and the result stored over it, `(conv + r) + bias` as gemm's accumulation onto it
    /// gives; it is the output, and no pass reads `r` again (nor writes a new buffer).
    Into(Vec<f32>),
}

/// The stride-1 1×1 conv `g` (input planes `x`, `[N, C, P]`) through `pk`'s weights (packed
/// by [`super::pack::pack_rows`]), with `epi` and the residual `res` per output row as
/// [`super::im2col::conv_float`] applies them. The caller checked that `pk` fits `g`, that
/// `g` is a stride-1 1×1 conv without padding, that an `Into` buffer holds the output's
/// `N·M·P` values, and that the CPU has AVX-512F.
///
/// Per task (an image and a chunk of whole tiles of positions, sized so that the chunk's
/// output of every channel stays in L2): per [`KC`] rows of `X`, per tile, every channel
/// block (the tile's `KC × 64` inputs from L1, the weights a sequential stream); partial
/// sums of a `K` longer than [`KC`] wait in a per-thread scratch, and the last pass stores
/// into the output; then the epilogue over the chunk's rows.
pub(super) fn run(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: RowsRes) -> Vec<f32> {
    let (m, k) = (g.m, pk.k());
    let p = g.osp[0] * g.osp[1];
    let total = g.n * m * p;
    let (mut out, fold, read) = match res {
        RowsRes::Into(v) => (v, true, None),
        RowsRes::Read(r) => (crate::buffers::overwritten::<f32>(total), false, Some(r)),
        RowsRes::None => (crate::buffers::overwritten::<f32>(total), false, None),
    };
    if total == 0 {
        return out;
    }
    let w = pk.data();
    let nb = m.div_ceil(MR);
    // The last pass adds the bias and applies the clamp in registers, where the epilogue's
    // row pass would give the same values: no read residual (`(conv + b) + r` is added per
    // row), no scan of the values before the clamp, no NaN canonicalization. The row pass
    // then runs only `post` (none after a clamp), or nothing.
    let regs = read.is_none() && epi.seen.is_none() && epi.clamp.is_none_or(|c| !c.nan_out);
    let (bias, clamp) = if regs {
        (epi.bias, epi.clamp.map(|c| (c.lo, c.hi)))
    } else {
        (None, None)
    };
    // What the row pass keeps: `post` where no clamp replaces it, nothing else.
    let post = Act {
        clamp: epi.clamp,
        post: epi.post,
        ..Act::NONE
    }
    .post_unless_clamped();
    let rest = Act { post, ..Act::NONE }.with_bias(None);
    let rest = if regs { &rest } else { epi };
    // Chunks of whole tiles whose output fits OUT_BYTES, of near-equal size.
    let tiles_all = p.div_ceil(TILE);
    let per = (OUT_BYTES / (4 * m * TILE)).clamp(1, tiles_all);
    let mut nchunk = tiles_all.div_ceil(per);
    let threads = rayon::current_num_threads();
    let par = threads > 1 && total * k >= CONV_SPLIT_FLOPS;
    if par && g.n * nchunk < 2 * threads {
        nchunk = (2 * threads).div_ceil(g.n).min(tiles_all);
    }
    let per = tiles_all.div_ceil(nchunk);
    let nchunk = tiles_all.div_ceil(per);
    let tasks = g.n * nchunk;
    let dst = SendPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (ni, ci) = (t / nchunk, t % nchunk);
        let j0 = ci * per * TILE;
        let j1 = ((ci + 1) * per * TILE).min(p);
        let cl = j1 - j0;
        let xi = &x[ni * k * p..(ni + 1) * k * p];
        let obase = ni * m * p;
        // Partial sums (row `i` at `i·cl`), for a K longer than one pass.
        let scratch_len = if k > KC { m * cl } else { 0 };
        let mut panel = [0f32; KC * TILE];
        with_scratch(&PRODUCTS, scratch_len, |part: &mut [f32]| {
            let part = part.as_mut_ptr();
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let last = k0 + kc == k;
                let mut q = j0;
                while q < j1 {
                    let n = (j1 - q).min(TILE);
                    // The tile's kc rows of X, copied into one contiguous panel (rows
                    // TILE apart): every channel block then reads 16 KB from L1 and a
                    // handful of pages, not kc rows a plane apart.
                    for (c, row) in panel.chunks_exact_mut(TILE).take(kc).enumerate() {
                        let src = &xi[(k0 + c) * p + q..][..n];
                        row[..n].copy_from_slice(src);
                    }
                    for b in 0..nb {
                        let m0 = b * MR;
                        let (o_at, s_at) = (obase + m0 * p + q, m0 * cl + (q - j0));
                        // SAFETY: the pointers below stay inside: block b's weight rows
                        // k0..k0+kc (kc·MR values); the panel's kc rows of TILE (lanes
                        // past n are masked off);
                        // the scratch's rows m0..min(m0+MR, m) at stride cl, positions
                        // q-j0..q-j0+n (written by the pass before when k0 > 0); the
                        // output's rows m0.. of image ni at stride p, positions q..q+n
                        // (holding the residual when `fold`). All of it this task's
                        // alone (tasks split positions); AVX-512F: the caller's check.
                        unsafe {
                            let (a, a_s) = if k0 > 0 {
                                (part.add(s_at).cast_const(), cl)
                            } else {
                                (std::ptr::null(), 0)
                            };
                            let (d, d_s) = if last {
                                (dst.get().add(o_at), p)
                            } else {
                                (part.add(s_at), cl)
                            };
                            let r = if last && fold {
                                d.cast_const()
                            } else {
                                std::ptr::null()
                            };
                            let ep = if last {
                                Regs {
                                    bias: bias.map_or(std::ptr::null(), |b| b.as_ptr().add(m0)),
                                    clamp,
                                }
                            } else {
                                Regs::NONE
                            };
                            tile(
                                MR.min(m - m0),
                                n,
                                kc,
                                w.as_ptr().add((b * k + k0) * MR),
                                panel.as_ptr(),
                                TILE,
                                (a, a_s),
                                (d, d_s),
                                r,
                                ep,
                            )
                        };
                    }
                    q += n;
                }
            }
        });
        // SAFETY: rows 0..m of image ni, positions j0..j1: written just above, this
        // task's alone.
        unsafe { finish_rows(dst.get(), obase + j0, 0, m, cl, p, rest, read, false) };
    };
    if par {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    out
}

/// What a last pass applies in registers before its store ([`tile`]): row `i`'s bias
/// `bias[i]` (null: none), then `min(hi, max(lo, ·))` (a NaN kept).
#[derive(Clone, Copy)]
struct Regs {
    bias: *const f32,
    clamp: Option<(f32, f32)>,
}

impl Regs {
    /// Nothing: a pass before the last.
    const NONE: Regs = Regs {
        bias: std::ptr::null(),
        clamp: None,
    };
}

/// One tile of `rows` output rows × `n` positions: row `i`, position `j` of `d` (stride
/// `d.1`) gets `(a ? a[i·a.1 + j] : +0) + Σ_c w[c·MR + i] · x[c·xs + j]` over `c < k`,
/// one FMA per term, in order, then `+ r[i·d.1 + j]` where `r` is not null (it may be `d`
/// itself: each value is read before it is stored over), then `ep`'s bias and clamp.
///
/// # Safety
/// AVX-512F; `rows` in `1..=MR`, `n` in `1..=TILE`; `w` holds `k·MR` values; `x` rows
/// `0..k` at stride `xs`, `a` (when not null) and `r` (when not null) rows `0..rows` hold
/// `n` values each; `d` rows `0..rows` have room for `n`; `ep.bias` null or holding `rows`
/// values.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    rows: usize,
    n: usize,
    k: usize,
    w: *const f32,
    x: *const f32,
    xs: usize,
    a: (*const f32, usize),
    d: (*mut f32, usize),
    r: *const f32,
    ep: Regs,
) {
    let v = n.div_ceil(16);
    // Lanes of the last vector inside the row.
    let last = ((1u32 << (n - (v - 1) * 16)) - 1) as u16;
    macro_rules! go {
        ($($r:literal)*) => {
            match (rows, v) {
                $(($r, 4) => tile_avx512::<$r, 4>(k, w, x, xs, a, d, r, ep, last),
                  ($r, 3) => tile_avx512::<$r, 3>(k, w, x, xs, a, d, r, ep, last),
                  ($r, 2) => tile_avx512::<$r, 2>(k, w, x, xs, a, d, r, ep, last),
                  ($r, 1) => tile_avx512::<$r, 1>(k, w, x, xs, a, d, r, ep, last),)*
                _ => unreachable!("tile {rows} x {v}"),
            }
        };
    }
    // SAFETY: the caller's contract.
    unsafe { go!(1 2 3 4 5 6) }
}

/// [`tile`] for `R` rows and `V` vectors, the last vector's lanes `last`.
///
/// # Safety
/// As [`tile`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize, const V: usize>(
    k: usize,
    w: *const f32,
    x: *const f32,
    xs: usize,
    (a, a_s): (*const f32, usize),
    (d, d_s): (*mut f32, usize),
    r: *const f32,
    ep: Regs,
    last: u16,
) {
    use std::arch::x86_64::*;
    // Row `i`'s `V` vectors at `p` (the last one masked).
    #[inline(always)]
    unsafe fn load<const V: usize>(p: *const f32, j: usize, last: u16) -> __m512 {
        // SAFETY: the caller's row holds the lanes loaded.
        unsafe {
            if j + 1 == V {
                _mm512_maskz_loadu_ps(last, p.add(16 * j))
            } else {
                _mm512_loadu_ps(p.add(16 * j))
            }
        }
    }
    // SAFETY: [`tile`]'s contract: every load and store below is inside it (the last
    // vector's lanes past `n` are masked off, and masked lanes are not accessed).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if !a.is_null() {
            for (i, ai) in acc.iter_mut().enumerate() {
                for (j, aj) in ai.iter_mut().enumerate() {
                    *aj = load::<V>(a.add(i * a_s), j, last);
                }
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..k {
            let mut xv = [_mm512_setzero_ps(); V];
            for (j, xj) in xv.iter_mut().enumerate() {
                *xj = load::<V>(xp, j, last);
            }
            for (i, ai) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*wp.add(i));
                for j in 0..V {
                    ai[j] = _mm512_fmadd_ps(b, xv[j], ai[j]);
                }
            }
            wp = wp.add(MR);
            xp = xp.add(xs);
        }
        if !r.is_null() {
            for (i, ai) in acc.iter_mut().enumerate() {
                for (j, aj) in ai.iter_mut().enumerate() {
                    *aj = _mm512_add_ps(*aj, load::<V>(r.add(i * d_s), j, last));
                }
            }
        }
        if !ep.bias.is_null() {
            for (i, ai) in acc.iter_mut().enumerate() {
                let b = Avx512::splat(*ep.bias.add(i));
                for aj in ai.iter_mut() {
                    *aj = Avx512::add(*aj, b);
                }
            }
        }
        if let Some((lo, hi)) = ep.clamp {
            let (lo, hi) = (Avx512::splat(lo), Avx512::splat(hi));
            for aj in acc.iter_mut().flatten() {
                // A NaN stays (`Lanes::clamp`).
                *aj = Avx512::clamp(*aj, lo, hi);
            }
        }
        for (i, ai) in acc.iter().enumerate() {
            let row = d.add(i * d_s);
            for (j, aj) in ai.iter().enumerate() {
                if j + 1 == V {
                    _mm512_mask_storeu_ps(row.add(16 * j), last, *aj);
                } else {
                    _mm512_storeu_ps(row.add(16 * j), *aj);
                }
            }
        }
    }
}
