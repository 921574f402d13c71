//! Winograd F(2×2, 3×3) for f32 2-D Conv with a 3×3 kernel, stride 1, dilation 1 and one
//! group, any padding (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
//! CVPR 2016, §4.1).
//!
//! Each 2×2 output tile is `Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A` of its 4×4 input tile `d`, with
//!
//! ```text
//! Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1]
//! Aᵀ = [1 1 1 0; 0 1 -1 -1]
//! ```
//!
//! Summed over the input channels, the 16 element-wise products are 16 matrix products
//! `[M, C]·[C, T]` over the T tiles of the batch, which RLX's product tile runs on
//! weights transformed and packed once (`packed::tile`, output channels on the vector
//! side; `gemm` where the tile is off: no AVX-512, or `RLX_CPU_WINO_MK=0`; gemm repacked
//! 16·M·C weights every run and ended 49 tiles with a one-tile call): 16 multiply-adds per 4
//! outputs instead of 36, and no im2col matrix (the transformed input is 16/9 of the
//! activation per 4 outputs, against im2col's 9). The weights' transform `G g Gᵀ` is made
//! once, when the executor is built (in f64, rounded once).
//!
//! Values differ from the direct sum by round-off only (the transforms add and subtract
//! neighbours and halve). Non-finite values are another matter: the input transform
//! subtracts neighbours, so an Inf input can become `Inf − Inf = NaN` where the direct sum
//! gives ±Inf, and a NaN spreads over a whole tile. So [`conv`] returns `None` when any
//! output is not finite, and the caller recomputes that conv directly: every NaN/Inf a
//! model sees is the one im2col + gemm gives.

use super::common::{with_scratch, Post, SendPtr, PANELS, PRODUCTS};
#[cfg(target_arch = "x86_64")]
use super::pack::MkIsa as Tile;
use crate::kernels::gemm_calls::{gemm_uninit_strided, LhsLevel, LhsPacking, View, GEMM_PAR_FLOPS};
use rayon::prelude::*;
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};

/// Transformed weights of one conv: `u[ξ][b][c][i]` = `U[ξ][c][b·bw + i]` for the 16
/// positions ξ = 4·i + j of the 4×4 tile, in blocks of `bw` output channels (f32; output
/// channels contiguous). For RLX's product tile (`tile`: AVX-512, or AVX2 where the packed
/// convs take it) `bw` is the tile's channel block ([`MkIsa::mb`]) and the channels past M
/// in the last block are zero, so each block's weights are one sequential stream; for
/// gemm `bw = M` (one block: `u[ξ][c][m]`, gemm's vector side).
#[derive(Debug)]
pub struct WinogradWeights {
    m: usize,
    c: usize,
    /// Output channels per block of `u`.
    bw: usize,
    /// The product tile's instruction set where `u` is packed for it; None: gemm.
    isa: Option<Tile>,
    u: Vec<f32>,
    /// max over output channels of Σ|w| (f64): with every |x| ≤ X, no partial sum of the
    /// direct conv exceeds X times this (plus the bias).
    abs_sum: f64,
}

impl WinogradWeights {
    /// From ONNX weights `w` `[M, C, 3, 3]` (f32, row-major). None unless `w` holds
    /// `M·C·9` finite values.
    pub(crate) fn new(w: &[f32], m: usize, c: usize) -> Option<WinogradWeights> {
        if w.len() != m * c * 9 || w.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let abs_sum = crate::kernels::max_row_abs_sum(w, c * 9);
        let isa = tile_isa();
        let bw = isa.map_or(m, tile_mb).max(1);
        let nb = m.div_ceil(bw);
        let mut u = vec![0.0f32; 16 * nb * c * bw];
        // G·v for a 3-vector: [v0, (v0+v1+v2)/2, (v0-v1+v2)/2, v2].
        let gv = |v: [f64; 3]| {
            [
                v[0],
                (v[0] + v[1] + v[2]) / 2.0,
                (v[0] - v[1] + v[2]) / 2.0,
                v[2],
            ]
        };
        // Output channels innermost: the 16 rows written advance together (ResNet-18's
        // 9.4M weights: 110 ms filter by filter, 52 ms this way, the f64 arithmetic being
        // most of it; 16x16 tiles did no better).
        for ci in 0..c {
            for mi in 0..m {
                let g = &w[(mi * c + ci) * 9..(mi * c + ci + 1) * 9];
                // Columns of g (3 rows), each transformed: (G g) is 4×3.
                let cols: [[f64; 4]; 3] =
                    std::array::from_fn(|x| gv([g[x] as f64, g[3 + x] as f64, g[6 + x] as f64]));
                for i in 0..4 {
                    // Row i of (G g), transformed by Gᵀ on the right.
                    let row = gv([cols[0][i], cols[1][i], cols[2][i]]);
                    for (j, r) in row.iter().enumerate() {
                        u[(((4 * i + j) * nb + mi / bw) * c + ci) * bw + mi % bw] = *r as f32;
                    }
                }
            }
        }
        Some(WinogradWeights {
            m,
            c,
            bw,
            isa,
            u,
            abs_sum,
        })
    }

    /// Output channels M.
    pub(crate) fn m(&self) -> usize {
        self.m
    }

    /// Input channels C.
    pub(crate) fn c(&self) -> usize {
        self.c
    }

    /// Whether RLX's product tile takes the products (see [`product`]).
    #[cfg(test)]
    pub(crate) fn tiled(&self) -> bool {
        self.isa.is_some()
    }

    /// Channels per block of the products of a part of `ml` output channels (see
    /// [`product`]): the tile's block, or the whole part for gemm.
    fn prod_block(&self, ml: usize) -> usize {
        if self.isa.is_some() {
            self.bw
        } else {
            ml.max(1)
        }
    }

    /// What a part's first output channel must be a multiple of.
    fn align(&self) -> usize {
        if self.isa.is_some() {
            self.bw
        } else {
            16
        }
    }

    /// Whether the direct conv of an input whose largest magnitude has the bits `x_bits`
    /// (`max_abs_bits`), with biases up to `b_max` in magnitude, provably stays below half
    /// of f32::MAX in every partial sum. Only then may the transform's result stand in for
    /// it: where a direct partial sum overflows, the transform's sums can cancel and stay
    /// finite (+2e38 and -2e38 inputs under one window), so its own finiteness check would
    /// not see the Inf the direct conv makes. NaN and Inf inputs fail it too.
    pub(crate) fn direct_stays_finite(&self, x_bits: u32, b_max: f64) -> bool {
        crate::kernels::sums_below_half_max(x_bits, self.abs_sum, b_max)
    }
}

/// The geometry of one call: batch `n`, input `h×w`, pads top/left `pt`/`pl`, output
/// `oh×ow`.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub pt: usize,
    pub pl: usize,
    pub oh: usize,
    pub ow: usize,
}

/// `Bᵀ·[a, b, c, d]`: the input transform along one axis.
#[inline(always)]
fn bt(a: f32, b: f32, c: f32, d: f32) -> [f32; 4] {
    [a - c, b + c, c - b, b - d]
}

isa_fn!(
    /// `Bᵀ d B` for the tiles of one tile row of one input plane: `rows` holds the 4 input
    /// rows, zero-padded, each `wp = 2·tw + 2` wide; `e` is scratch of the same size. Tile
    /// `tx`'s position ξ goes to `v[ξ·ts + tx]`.
    fn transform_row[](rows: &[f32], e: &mut [f32], wp: usize, tw: usize, v: &mut [f32], ts: usize) {
        let h = tw + 1;
        // Each row split into even and odd columns (e[i·wp..][..h] and [h..2h]), so the
        // tile loop below reads contiguous runs: tile tx spans columns 2tx .. 2tx + 3.
        for (r, er) in rows.chunks_exact(wp).zip(e.chunks_exact_mut(wp)).take(4) {
            let (ev, od) = er.split_at_mut(h);
            split_even_odd(&r[..2 * h], ev, od);
        }
        // Bᵀ on the left: rows d0..d3 → d0 − d2, d1 + d2, d2 − d1, d1 − d3.
        let (e0, rest) = e[..4 * wp].split_at_mut(wp);
        let (e1, rest) = rest.split_at_mut(wp);
        let (e2, e3) = rest.split_at_mut(wp);
        for j in 0..wp {
            [e0[j], e1[j], e2[j], e3[j]] = bt(e0[j], e1[j], e2[j], e3[j]);
        }
        // B on the right, per tile: columns a b c d → a − c, b + c, c − b, b − d.
        for (i, er) in [&*e0, &*e1, &*e2, &*e3].into_iter().enumerate() {
            let (ev0, ev1) = (&er[..tw], &er[1..h]);
            let (od0, od1) = (&er[h..h + tw], &er[h + 1..2 * h]);
            let base = 4 * i * ts;
            let (v0, rest) = v[base..base + 3 * ts + tw].split_at_mut(ts);
            let (v1, rest) = rest.split_at_mut(ts);
            let (v2, v3) = rest.split_at_mut(ts);
            let (v0, v1, v2, v3) = (&mut v0[..tw], &mut v1[..tw], &mut v2[..tw], &mut v3[..tw]);
            for tx in 0..tw {
                [v0[tx], v1[tx], v2[tx], v3[tx]] = bt(ev0[tx], od0[tx], ev1[tx], od1[tx]);
            }
        }
    }
);

/// `ev[i] = r[2i]`, `od[i] = r[2i + 1]` for `i < ev.len()` (`r` holds `2·ev.len()`
/// values, `od` as many as `ev`). The compiler leaves this loop scalar (one load and one
/// store per value: half of `transform_row`'s time in `perf annotate`); on AVX-512 two
/// `vpermt2ps` split 32 values at a time.
#[inline]
fn split_even_odd(r: &[f32], ev: &mut [f32], od: &mut [f32]) {
    let h = ev.len();
    assert!(r.len() >= 2 * h && od.len() >= h, "split_even_odd: lengths");
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::simd::isa_cap() == crate::kernels::simd::IsaCap::Avx512 {
        // SAFETY: AVX-512F is present; r holds 2h values, ev and od h each (checked).
        i = unsafe { split_avx512(r.as_ptr(), ev.as_mut_ptr(), od.as_mut_ptr(), h) };
    }
    for j in i..h {
        ev[j] = r[2 * j];
        od[j] = r[2 * j + 1];
    }
}

/// [`split_even_odd`]'s first `16·⌊h/16⌋` values of each half on AVX-512F; returns how
/// many it did.
///
/// # Safety
/// The CPU has AVX-512F; `r` is valid for `2h` reads, `ev` and `od` for `h` writes each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn split_avx512(r: *const f32, ev: *mut f32, od: *mut f32, h: usize) -> usize {
    use std::arch::x86_64::*;
    let ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let mut i = 0;
    while i + 16 <= h {
        // SAFETY: values 2i .. 2i + 32 ≤ 2h of r, i .. i + 16 ≤ h of ev and od.
        unsafe {
            let a = _mm512_loadu_ps(r.add(2 * i));
            let b = _mm512_loadu_ps(r.add(2 * i + 16));
            _mm512_storeu_ps(ev.add(i), _mm512_permutex2var_ps(a, ie, b));
            _mm512_storeu_ps(od.add(i), _mm512_permutex2var_ps(a, io, b));
        }
        i += 16;
    }
    i
}

isa_fn!(
    /// `Aᵀ m A + bias` of one tile for a run of output channels: `ms[ξ]` holds position ξ
    /// for each channel, `bias` one value per channel; the tile's outputs (0,0), (0,1),
    /// (1,0), (1,1) go to `y[0..n]`, `y[n..2n]`, `y[2n..3n]`, `y[3n..4n]` for `n` channels.
    fn untransform_tile[](ms: &[&[f32]; 16], bias: &[f32], y: &mut [f32]) {
        let n = bias.len();
        let [m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15] = *ms;
        let (m0, m1, m2, m3) = (&m0[..n], &m1[..n], &m2[..n], &m3[..n]);
        let (m4, m5, m6, m7) = (&m4[..n], &m5[..n], &m6[..n], &m7[..n]);
        let (m8, m9, m10, m11) = (&m8[..n], &m9[..n], &m10[..n], &m11[..n]);
        let (m12, m13, m14, m15) = (&m12[..n], &m13[..n], &m14[..n], &m15[..n]);
        let (y0, rest) = y[..4 * n].split_at_mut(n);
        let (y1, rest) = rest.split_at_mut(n);
        let (y2, y3) = rest.split_at_mut(n);
        for k in 0..n {
            // Rows of Aᵀ m: s0j = m0j + m1j + m2j, s1j = m1j − m2j − m3j (mij = m[4i + j]).
            let s00 = m0[k] + m4[k] + m8[k];
            let s01 = m1[k] + m5[k] + m9[k];
            let s02 = m2[k] + m6[k] + m10[k];
            let s03 = m3[k] + m7[k] + m11[k];
            let s10 = m4[k] - m8[k] - m12[k];
            let s11 = m5[k] - m9[k] - m13[k];
            let s12 = m6[k] - m10[k] - m14[k];
            let s13 = m7[k] - m11[k] - m15[k];
            y0[k] = s00 + s01 + s02 + bias[k];
            y1[k] = s01 - s02 - s03 + bias[k];
            y2[k] = s10 + s11 + s12 + bias[k];
            y3[k] = s11 - s12 - s13 + bias[k];
        }
    }
);

/// The 4 input rows of tile row `ty` of plane `xp` (`H×W`), zero-padded (`d.pt` rows
/// above, `d.pl` columns left, zeros past the plane), into `rows` (4 rows of
/// `wp = rows.len() / 4` values).
fn padded_rows(xp: &[f32], ty: usize, d: &Dims, rows: &mut [f32]) {
    let wp = rows.len() / 4;
    for (i, r) in rows.chunks_exact_mut(wp).enumerate() {
        let iy = (2 * ty + i) as isize - d.pt as isize;
        if iy < 0 || iy as usize >= d.h {
            r.fill(0.0);
            continue;
        }
        let src = &xp[iy as usize * d.w..(iy as usize + 1) * d.w];
        let lo = d.pl.min(wp);
        let hi = (d.pl + d.w).min(wp);
        r[..lo].fill(0.0);
        r[lo..hi].copy_from_slice(&src[..hi - lo]);
        r[hi..].fill(0.0);
    }
}

/// Product ξ for output channels `m0 .. m0 + ml` (`m0` a multiple of
/// [`WinogradWeights::align`]): `Σ_c U[ξ][c][m0 + i] · v[(c·16 + ξ)·ts + t]` for the `ts`
/// tiles of `v` (the transformed input, `16·C·ts` values), into `dst` as `[b][t][pw]`:
/// blocks of `pw = wg.prod_block(ml)` channels, output channels contiguous. RLX's tile
/// where the weights are packed for it (each sum over `c` in order, one FMA per term, so
/// the same bits whatever the tiles, slabs or threads), else gemm. False when gemm refuses
/// the views.
fn product(
    wg: &WinogradWeights,
    xi: usize,
    m0: usize,
    ml: usize,
    v: &[f32],
    ts: usize,
    dst: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = wg.isa {
        product_tiles(wg, isa, xi, m0, ml, v, ts, dst);
        return true;
    }
    let (m, c) = (wg.m, wg.c);
    let a = View {
        data: &wg.u,
        off: xi * m * c + m0,
        rs: 1,
        cs: m,
    };
    let b = View {
        data: v,
        off: xi * ts,
        rs: 16 * ts,
        cs: 1,
    };
    let dst = &mut dst[..ml * ts];
    // SAFETY: f32 has no invalid bit patterns; gemm only writes `dst`.
    let dst = unsafe {
        std::slice::from_raw_parts_mut(
            dst.as_mut_ptr().cast::<std::mem::MaybeUninit<f32>>(),
            dst.len(),
        )
    };
    gemm_uninit_strided(ml, ts, c, a, b, dst, (1, ml), false).is_ok()
}

/// [`product`] on RLX's tile (`super::packed::tile`): per block of `bw` output channels,
/// per [`WINO_KC`] rows of its weights (read once, then from L1), every tile of
/// up to `np_max` positions (near-equal widths: 49 = 10+10+10+10+9), written `[t][bw]`
/// straight into `dst`: no packing of `v` and no transposition.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn product_tiles(
    wg: &WinogradWeights,
    isa: Tile,
    xi: usize,
    m0: usize,
    ml: usize,
    v: &[f32],
    ts: usize,
    dst: &mut [f32],
) {
    let (c, bw) = (wg.c, wg.bw);
    let nb = wg.m.div_ceil(bw);
    let np_max = isa.np_max();
    let (nt, tiles) = super::pack::near_equal_tiles(ts, np_max);
    let kc_max = WINO_KC;
    assert!(
        m0.is_multiple_of(bw) && v.len() >= 16 * c * ts && dst.len() >= ml.div_ceil(bw) * ts * bw,
        "winograd product: operands do not fit"
    );
    // The weights of this ξ and part are one array read in order; the tiles prefetch the
    // next slice's lines (from `ahead`, in floats) while they run on this one, as in
    // `packed::run_cols` (the weights, 16·M·C values, come from below L2 in a model).
    let (b0, b1) = (m0 / bw, m0 / bw + ml.div_ceil(bw));
    let lim = (xi * nb + b1) * c * bw;
    let mut ahead = ((xi * nb + b0) * c + kc_max.min(c)) * bw;
    // The tiles' rows of `v` (this ξ's, `16·ts` apart) from tile panels where enough
    // channel blocks read them (`packed::panels`): 256←256 at 14² alone 1.16-1.20 →
    // 1.03-1.07 ms (min of 4 rounds) on an Intel Ice Lake (bench/NOTES.md §49).
    let mut run = |panel: Option<&[f32]>| {
        // Row k0 of the tile from position p0, np wide, and the stride of its rows.
        let x = |k0: usize, p0: usize, np: usize| match panel {
            Some(pv) => (pv[p0 * c + k0 * np..].as_ptr(), np),
            None => (v[(k0 * 16 + xi) * ts + p0..].as_ptr(), 16 * ts),
        };
        for b in b0..b1 {
            let wb = &wg.u[((xi * nb + b) * c) * bw..][..c * bw];
            let out = &mut dst[(b - b0) * ts * bw..][..ts * bw];
            for k0 in (0..c).step_by(kc_max) {
                let kc = kc_max.min(c - k0);
                let at0 = ((xi * nb + b) * c + k0) * bw;
                for (p0, np) in tiles.clone() {
                    // Floats of the next slice per row of k: the slice spread over this
                    // slice's tiles; none once it (or the end) is covered.
                    let pfl = if ahead >= lim.min(at0 + 2 * kc * bw) {
                        0
                    } else {
                        bw.div_ceil(nt)
                    };
                    let pf = wg.u.as_ptr().wrapping_add(ahead);
                    ahead += kc * pfl;
                    let (xp, xs) = x(k0, p0, np);
                    // SAFETY: `wb` holds rows k0 .. k0 + kc of `bw` weights; `v` rows
                    // (k·16 + ξ)·ts + p0 .. + np for k < c (checked above), or the tile's
                    // panel (c·np values from p0·c); the tile writes np·bw values from
                    // p0·bw of `out` (ts·bw long); `isa` is this CPU's (`tile_isa`), np in
                    // 1..=np_max.
                    unsafe {
                        super::packed::tile(
                            isa,
                            np,
                            kc,
                            k0 > 0,
                            wb[k0 * bw..].as_ptr(),
                            xp,
                            xs,
                            out[p0 * bw..].as_mut_ptr(),
                            (pf, pfl),
                        )
                    };
                }
            }
        }
    };
    if super::packed::panels(b1 - b0) {
        with_scratch(&PANELS, c * ts, |pv: &mut [f32]| {
            super::packed::fill_panels(&v[xi * ts..], 16 * ts, c, tiles.clone(), pv);
            run(Some(pv))
        })
    } else {
        run(None)
    }
}

/// Most rows of `C` per pass of [`product_tiles`]: a block's slice of weights (8 KB at 32
/// channels) and the tiles' rows of `v` stay in L1 together. Alone, 1 thread, paired
/// medians over 5 interleaved rounds against 128 (`packed::KC`): 256←256 at 14² 0.99,
/// 128←128 at 28² 0.95; 256 read 1.06 slower, 32 no better than 64.
#[cfg(target_arch = "x86_64")]
const WINO_KC: usize = 64;

/// The product tile Winograd takes ([`WinogradWeights`]' layout follows it): the packed
/// convs' ISA (`RLX_CPU_MK`, `RLX_CPU_ISA`) unless `RLX_CPU_WINO_MK=0` (gemm, for A/B).
#[cfg(target_arch = "x86_64")]
fn tile_isa() -> Option<Tile> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_WINO_MK")) {
        super::pack::enabled_isa()
    } else {
        None
    }
}

/// Output channels per block of the tile's weights.
#[cfg(target_arch = "x86_64")]
fn tile_mb(isa: Tile) -> usize {
    isa.mb()
}

/// No product tile off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy, Debug)]
enum Tile {}

#[cfg(not(target_arch = "x86_64"))]
fn tile_isa() -> Option<Tile> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn tile_mb(isa: Tile) -> usize {
    match isa {}
}

/// Position ξ of tile `t` for channels `lo .. lo + n` of a part (one block of it: `lo %
/// pw + n <= pw`), from products laid out as [`product`] writes them (`[ξ][b][t][pw]`,
/// `nbp` blocks per ξ).
#[inline(always)]
fn tile_ms(
    prod: &[f32],
    nbp: usize,
    pw: usize,
    ts: usize,
    t: usize,
    lo: usize,
    n: usize,
) -> [&[f32]; 16] {
    let (b, o) = (lo / pw, lo % pw);
    std::array::from_fn(|xi| &prod[((xi * nbp + b) * ts + t) * pw + o..][..n])
}

/// Largest transformed weights (bytes, `16·M·C·4`) for which [`conv`] runs by slabs
/// ([`conv_slabs`]): each slab reads all of them, so they must stay in a core's L2 (2 MB on
/// the Xeon of bench/NOTES.md §19) from one slab to the next.
const SLAB_MAX_WEIGHT_BYTES: usize = 1 << 20;

/// Bytes of transformed input and products (`16·(C + M)·4` per tile) one slab aims at: a
/// part of L2, beside the weights.
const SLAB_BYTES: usize = 512 << 10;

/// Most scratch bytes (transformed input and products) of one task of [`conv_slabs`] with
/// weights above [`SLAB_MAX_WEIGHT_BYTES`].
const SLAB_MAX_TASK_BYTES: usize = 4 << 20;

/// True when the conv runs through [`conv_slabs`] instead of [`conv`]:
/// `RLX_CPU_WINO_SLABS` not off (read once per process), and the transformed weights fit
/// in [`SLAB_MAX_WEIGHT_BYTES`] or the pool has several threads (then each thread takes
/// its own output channels, so each reads a part of the weights and nothing crosses
/// cores).
pub(crate) fn slabs_on(m: usize, c: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    (weights_fit(m, c) || rayon::current_num_threads() > 1)
        && *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_WINO_SLABS"))
}

/// Whether `m × c` transformed weights (`16·M·C` f32) fit in [`SLAB_MAX_WEIGHT_BYTES`].
fn weights_fit(m: usize, c: usize) -> bool {
    16 * m * c * 4 <= SLAB_MAX_WEIGHT_BYTES
}

/// The outputs of tile row `ty` for `n` channels (`y`: scratch of `4·n`): each tile's
/// `Aᵀ m A + bias` ([`untransform_tile`] on `ms_of(tx)`, its products), laid out in `rows`
/// as each channel's output rows `2·ty` and `2·ty + 1` (the second only inside the plane;
/// the edge tiles' halves outside it are dropped), then the finite check and `post` over
/// them in one call each, then one copy per channel into its plane of `o` (the two rows
/// are adjacent there). Per tile, the four values of each of `n` channels went to `n`
/// planes a plane apart (`store_tile`, `n` scattered stores per value: 12% of 64←64 at
/// 56² in `perf`) with a check and a `post` call per tile. Returns whether every output
/// was finite (before `post`).
///
/// # Safety
/// `o` valid for writes of `n` planes of `d.oh·d.ow`; rows `2·ty`, `2·ty + 1` of those
/// planes written by no one else meanwhile. `rows` holds `2·d.ow·n` values.
#[allow(clippy::too_many_arguments)]
unsafe fn out_row<'a>(
    ms_of: impl Fn(usize) -> [&'a [f32]; 16],
    bias: &[f32],
    d: &Dims,
    ty: usize,
    y: &mut [f32],
    rows: &mut [f32],
    post: Post,
    o: *mut f32,
) -> bool {
    let (n, ow) = (bias.len(), d.ow);
    let oy = 2 * ty;
    let nr = if oy + 1 < d.oh { 2 } else { 1 };
    let span = nr * ow;
    let rows = &mut rows[..n * span];
    let y = &mut y[..4 * n];
    for tx in 0..ow.div_ceil(2) {
        untransform_tile(&ms_of(tx), bias, y);
        let ox = 2 * tx;
        let right = ox + 1 < ow;
        for (k, r) in rows.chunks_exact_mut(span).enumerate() {
            r[ox] = y[k];
            if right {
                r[ox + 1] = y[n + k];
            }
            if nr == 2 {
                r[ow + ox] = y[2 * n + k];
                if right {
                    r[ow + ox + 1] = y[3 * n + k];
                }
            }
        }
    }
    let finite = crate::kernels::wide::max_abs_bits(rows) < 0x7f80_0000;
    post(rows);
    let op = d.oh * ow;
    for (k, r) in rows.chunks_exact(span).enumerate() {
        // SAFETY: the caller's: row oy (and oy + 1 when nr = 2) of plane k of `o`.
        unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), o.add(k * op + oy * ow), span) };
    }
    finite
}

/// [`conv`] by slabs of tile rows: each slab (a few tile rows of one image) runs all three
/// steps on its own tiles (input transform, the 16 products, output transform) in scratch
/// of about [`SLAB_BYTES`], so its intermediates stay in the core's cache and, split over
/// threads, none is read on another core. Each tile's sums run over the same channels as
/// in [`conv`]: on RLX's tile in the same order, so the same bits as [`conv`] at any
/// thread count (test `winograd_tile_products_any_split`); on gemm, which blocks sums
/// over more than 512 channels differently for a different tile count, values can differ
/// from [`conv`]'s (and between thread counts) by round-off.
pub(crate) fn conv_slabs(
    x: &[f32],
    wg: &WinogradWeights,
    bias: Option<&[f32]>,
    d: Dims,
    post: Post,
) -> Option<Vec<f32>> {
    let (m, c) = (wg.m, wg.c);
    let (th, tw) = (d.oh.div_ceil(2), d.ow.div_ceil(2));
    let plane = d.h * d.w;
    let op = d.oh * d.ow;
    let wp = 2 * tw + 2;
    let total = d.n * m * op;
    if th == 0 || tw == 0 || m == 0 || d.n == 0 {
        return Some(vec![0.0; total]);
    }
    let threads = rayon::current_num_threads();
    let par = threads > 1 && m * c * d.n * th * tw * 16 >= GEMM_PAR_FLOPS;
    // Weights that fit in L2: every slab reads all of them, one part of output channels.
    // Larger ones (split over threads only, see `slabs_on`): one part of output channels
    // per thread, each reading its rows of the weights, over slabs as large as
    // SLAB_MAX_TASK_BYTES allows (each slab transforms its input once per part). (Parts
    // per thread for small weights too where the tile rows do not split evenly, 7 at 13²
    // over 2 threads, ran slower: SqueezeNet's 256←48 and 192←48 at 13² +2 to +12 µs,
    // bench/NOTES.md §44.)
    let small = weights_fit(m, c);
    let mparts = if small { 1 } else { threads };
    let al = wg.align();
    let mc = m.div_ceil(mparts).div_ceil(al) * al;
    let mparts = m.div_ceil(mc);
    let per_row = 16 * (c + mc) * tw * 4;
    let budget = if mparts == 1 {
        SLAB_BYTES
    } else {
        SLAB_MAX_TASK_BYTES
    };
    let mut k = (budget / per_row.max(1)).clamp(1, th);
    // Slab j of an image: tile rows [j·k, (j+1)·k), or with `near`, [j·th/per_img,
    // (j+1)·th/per_img).
    let mut near = false;
    let per_thread = threads.div_ceil(d.n).max(1);
    if par && mparts == 1 && th % per_thread == 0 {
        // Rows that split evenly over the threads: at least two slabs per thread, a
        // multiple of the thread count of them, rows near-equal (14 tile rows in slabs of
        // 3 were 5 slabs, 3+3+3+3+2: 6 rows on one thread and 8 on the other; now 6 of
        // 2 or 3, 7 and 7).
        near = true;
    } else if par && mparts == 1 {
        // At least two slabs per thread.
        k = k.min(th.div_ceil(2 * per_thread)).max(1);
    }
    let per_img = if near {
        th.div_ceil(k)
            .max(2 * per_thread)
            .next_multiple_of(per_thread)
            .min(th)
    } else {
        th.div_ceil(k)
    };
    let slabs = d.n * per_img;
    let mut out = crate::buffers::overwritten::<f32>(total);
    let dst = SendPtr(out.as_mut_ptr());
    let zero = vec![0.0f32; m];
    let bias = bias.unwrap_or(&zero);
    // Tasks part by part (rayon's halves then take whole parts: each thread reads its own
    // rows of the weights), slab by slab.
    let slab = |task: usize| -> bool {
        let (mp, si) = (task / slabs, task % slabs);
        let (ni, j) = (si / per_img, si % per_img);
        let (ty0, ty1) = if near {
            (j * th / per_img, (j + 1) * th / per_img)
        } else {
            (j * k, ((j + 1) * k).min(th))
        };
        let ns = (ty1 - ty0) * tw;
        // Output channels m0..m0 + ml of this part.
        let (m0, ml) = (mp * mc, mc.min(m - mp * mc));
        let pw = wg.prod_block(ml);
        let nbp = ml.div_ceil(pw);
        with_scratch(
            &PRODUCTS,
            16 * c * ns + 16 * nbp * pw * ns + 8 * wp,
            |buf: &mut [f32]| {
                let (v, rest) = buf.split_at_mut(16 * c * ns);
                let (mb, rows) = rest.split_at_mut(16 * nbp * pw * ns);
                // Input transform: v[(ci·16 + ξ)·ns + t], t the tile's index in the slab.
                for (ci, vc) in v.chunks_mut(16 * ns).enumerate() {
                    let xp = &x[(ni * c + ci) * plane..(ni * c + ci + 1) * plane];
                    for ty in ty0..ty1 {
                        let (r4, e) = rows.split_at_mut(4 * wp);
                        padded_rows(xp, ty, &d, r4);
                        transform_row(r4, e, wp, tw, &mut vc[(ty - ty0) * tw..], ns);
                    }
                }
                // mb[ξ][b][t][i] = (U[ξ] · V[ξ])ᵀ for this part's channels m0 + b·pw + i.
                let _pack = LhsPacking::set(LhsLevel::Conv);
                for (xi, dst) in mb.chunks_mut(nbp * pw * ns).enumerate() {
                    if !product(wg, xi, m0, ml, v, ns, dst) {
                        return false;
                    }
                }
                // Output transform, this part's channels, this slab's tiles (output rows 2·ty0
                // .. min(2·ty1, OH) of image ni, channels m0 .. m0 + ml: this task's alone).
                let mut y = vec![0.0f32; 4 * pw];
                let mut rows = vec![0.0f32; 2 * d.ow * pw];
                let mut finite = true;
                for lo in (0..ml).step_by(pw) {
                    let n = pw.min(ml - lo);
                    let o = dst.get().wrapping_add((ni * m + m0 + lo) * op);
                    let bias = &bias[m0 + lo..m0 + lo + n];
                    for ty in ty0..ty1 {
                        let ms_of = |tx| tile_ms(mb, nbp, pw, ns, (ty - ty0) * tw + tx, lo, n);
                        // SAFETY: channels m0 + lo .. + n of image ni inside `out`
                        // (total elements), this slab's rows: written by this task
                        // alone; `rows` holds 2·ow·pw values.
                        finite &=
                            unsafe { out_row(ms_of, bias, &d, ty, &mut y, &mut rows, post, o) };
                    }
                }
                finite
            },
        )
    };
    let tasks = slabs * mparts;
    let finite = if par {
        (0..tasks)
            .into_par_iter()
            .map(slab)
            .reduce(|| true, |a, b| a & b)
    } else {
        (0..tasks).map(slab).fold(true, |a, b| a & b)
    };
    // The slabs' tiles cover every output plane (the right and bottom halves of edge tiles
    // are skipped outside it), for every channel and image.
    finite.then_some(out)
}

/// The conv of `x` (`[N, C, H, W]` f32, row-major) with the weights behind `wg` and
/// optional `bias` (`[M]`): `[N, M, OH, OW]`, or None when an output is not finite (the
/// caller then computes the conv directly; see the module docs), with `post` applied to
/// the finite outputs. `d` must match `x` and the
/// conv's output shape (the caller checked it with the direct conv's geometry).
pub(crate) fn conv(
    x: &[f32],
    wg: &WinogradWeights,
    bias: Option<&[f32]>,
    d: Dims,
    v: &mut [f32],
    post: Post,
) -> Option<Vec<f32>> {
    let (m, c) = (wg.m, wg.c);
    let (th, tw) = (d.oh.div_ceil(2), d.ow.div_ceil(2));
    let ts = d.n * th * tw;
    let total = d.n * m * d.oh * d.ow;
    if ts == 0 || m == 0 {
        return Some(vec![0.0; total]);
    }
    let plane = d.h * d.w;
    let wp = 2 * tw + 2;
    let par = rayon::current_num_threads() > 1 && m * c * ts * 16 >= GEMM_PAR_FLOPS;
    // Input transform: v[(ci·16 + ξ)·ts + tile], tile = (ni·th + ty)·tw + tx.
    let v = &mut v[..16 * c * ts];
    let in_plane = |ci: usize, vc: &mut [f32]| {
        let mut buf = vec![0.0f32; 8 * wp];
        for ni in 0..d.n {
            let xp = &x[(ni * c + ci) * plane..(ni * c + ci + 1) * plane];
            for ty in 0..th {
                let (rows, e) = buf.split_at_mut(4 * wp);
                padded_rows(xp, ty, &d, rows);
                let t0 = (ni * th + ty) * tw;
                transform_row(rows, e, wp, tw, &mut vc[t0..], ts);
            }
        }
    };
    if par {
        v.par_chunks_mut(16 * ts)
            .enumerate()
            .for_each(|(ci, vc)| in_plane(ci, vc));
    } else {
        for (ci, vc) in v.chunks_mut(16 * ts).enumerate() {
            in_plane(ci, vc);
        }
    }
    let v = &*v;
    let pw = wg.prod_block(m);
    let nbp = m.div_ceil(pw);
    with_scratch(&PRODUCTS, 16 * nbp * pw * ts, |mb: &mut [f32]| {
        // mb[ξ][b][tile][i] = (U[ξ] · V[ξ])ᵀ: [M, C]·[C, ts], output channels contiguous
        // (blocks of pw) so that the product's vector side is the channels even for a few
        // tiles.
        let prod = |xi: usize, dst: &mut [f32]| product(wg, xi, 0, m, v, ts, dst);
        let _pack = LhsPacking::set(LhsLevel::Conv);
        let ok = if par {
            mb.par_chunks_mut(nbp * pw * ts)
                .enumerate()
                .all(|(xi, dst)| prod(xi, dst))
        } else {
            mb.chunks_mut(nbp * pw * ts)
                .enumerate()
                .all(|(xi, dst)| prod(xi, dst))
        };
        if !ok {
            return None;
        }
        // Every output element is written: the 2×2 tiles cover each plane (the right and
        // bottom halves of edge tiles are skipped outside it), for every channel block.
        let mut out = crate::buffers::overwritten(total);
        let mb = &*mb;
        let zero = vec![0.0f32; m];
        let bias = bias.unwrap_or(&zero);
        let op = d.oh * d.ow;
        // Output channels [m0, m0 + mc) of every image: out planes of those channels.
        // Whether every output of the block was finite (before `post`).
        let out_block = |m0: usize, mc: usize, o: &mut [f32], ni: usize| -> bool {
            assert!(o.len() >= mc * op, "a block holds its planes");
            let mut y = vec![0.0f32; 4 * pw.min(mc)];
            let mut rows = vec![0.0f32; 2 * d.ow * pw.min(mc)];
            let mut finite = true;
            // Runs of channels inside one block of the products (`m0` is a multiple of pw
            // where pw < m).
            let mut lo = m0;
            while lo < m0 + mc {
                let n = (m0 + mc).min((lo / pw + 1) * pw) - lo;
                let oc = o[(lo - m0) * op..].as_mut_ptr();
                for ty in 0..th {
                    let ms_of = |tx| tile_ms(mb, nbp, pw, ts, (ni * th + ty) * tw + tx, lo, n);
                    // SAFETY: `o` holds the block's `mc` planes of `op` elements (checked
                    // above; lo − m0 + n ≤ mc), this task's own (a `par_chunks_mut`
                    // chunk); `rows` holds 2·ow·n values.
                    finite &= unsafe {
                        out_row(
                            ms_of,
                            &bias[lo..lo + n],
                            &d,
                            ty,
                            &mut y,
                            &mut rows,
                            post,
                            oc,
                        )
                    };
                }
                lo += n;
            }
            finite
        };
        let blk = if par {
            let al = wg.align();
            m.div_ceil(4 * rayon::current_num_threads())
                .max(16)
                .div_ceil(al)
                * al
        } else {
            m
        };
        let mut finite = true;
        for (ni, oi) in out.chunks_mut(m * op).enumerate() {
            finite &= if par {
                oi.par_chunks_mut(blk * op)
                    .enumerate()
                    .map(|(bi, o)| out_block(bi * blk, o.len() / op, o, ni))
                    .reduce(|| true, |a, b| a & b)
            } else {
                out_block(0, m, oi, ni)
            };
        }
        finite.then_some(out)
    })
}

/// Winograd weights for `Op::Conv` with weights `w`, attributes `a` and output type `out`,
/// when the conv is one the Winograd path handles (this module): f32, 2-D, 3×3,
/// stride 1, dilation 1, one group, at least [`WINOGRAD_MIN_CH`] input and output channels
/// (below that the transforms cost more than the product saves), and an output for which
/// [`winograd_pays`].
pub fn winograd_weights(w: &Tensor, a: &ConvAttrs, out: &Shape) -> Option<WinogradWeights> {
    winograd_takes(w, a, out)
        .then(|| winograd_transform(w))
        .flatten()
}

/// Whether the Winograd path takes this conv (the conditions on [`winograd_weights`]);
/// reads no weight values.
pub fn winograd_takes(w: &Tensor, a: &ConvAttrs, out: &Shape) -> bool {
    let wd = w.dims();
    let pays = match out.static_dims().as_deref() {
        Some(&[n, _, oh, ow]) if wd.len() == 4 => {
            winograd_pays(wd[0], wd[1], n, oh, ow)
                && !packed_first(w, a, out, n * oh.div_ceil(2) * ow.div_ceil(2))
        }
        _ => true,
    };
    w.dtype() == rlx_ir::DType::F32
        && wd.len() == 4
        && wd[2] == 3
        && wd[3] == 3
        && a.groups <= 1
        && a.strides.iter().all(|&s| s == 1)
        && a.dilations.iter().all(|&d| d == 1)
        && wd[0] >= WINOGRAD_MIN_CH
        && wd[1] >= WINOGRAD_MIN_CH
        && pays
}

/// The Winograd transform of 3×3 weights `w` (f32 `[M, C, 3, 3]`), which depends on the
/// weights alone; None for other weights or a non-finite value.
pub fn winograd_transform(w: &Tensor) -> Option<WinogradWeights> {
    let wd = w.dims();
    match w.data() {
        TensorData::F32(v) if wd.len() == 4 && wd[2..] == [3, 3] => {
            WinogradWeights::new(v, wd[0], wd[1])
        }
        _ => None,
    }
}

/// Whether the Winograd path pays for a conv with `m` output and `c` input channels on `n`
/// images whose output plane is `oh × ow`: not when the batch has fewer than
/// [`WINOGRAD_MIN_TILES`] 2×2 tiles in all and the transformed weights (16·m·c f32, 16/9 of the plain ones) exceed
/// [`WINOGRAD_SMALL_WEIGHTS`]. Each transformed weight is then used only a few times per
/// run, and in a model whose weights do not stay in cache between runs it is read from
/// memory: ResNet-50's 512-channel 3×3 convs at 7² (16 tiles, 16.8 MB transformed) took
/// 3.4-3.5 ms per run through Winograd against 2.2-2.3 through im2col (1 thread, per-node
/// profile, Xeon with AVX-512; alone, where the weights stay in cache, Winograd was
/// ahead, 1.73 against 1.98). At 14² (49 tiles) Winograd stays ahead in the model
/// (1.40-1.48 against 1.69-1.72 ms). Whole models, 3 interleaved pairs, medians: resnet18
/// 28.9-31.3 → 23.7-24.8 ms at 1 thread (min 17.7-18.3 → 15.3-15.7 at 2), resnet50
/// 59.3-62.7 → 56.1-58.6 (min 35.7-36.3 → 34.8-35.3 at 2).
pub(crate) fn winograd_pays(m: usize, c: usize, n: usize, oh: usize, ow: usize) -> bool {
    let tiles = n * oh.div_ceil(2) * ow.div_ceil(2);
    tiles >= WINOGRAD_MIN_TILES || 16 * m * c * 4 <= WINOGRAD_SMALL_WEIGHTS
}

/// True where RLX's product kernel reading the input in place (`packed_im`: where
/// [`super::pack::pack_form`] packs a stride-1 3×3 conv) is the faster path: `tiles` 2×2
/// tiles times input channels under [`WINOGRAD_PACKED_WORK`]. There the input and output
/// transforms, done per tile and channel, weigh on a product too short to pay them back.
/// The bound was 4096 while gemm ran Winograd's products (SqueezeNet's 3×3 expand convs at
/// 13², 49 tiles × 48 and 64 channels, read 400 → 353 µs and 218 → 205 through
/// `packed_im`, bench/NOTES.md §31, §34); since the products run on RLX's tile (§37) those
/// two are faster through Winograd: the whole of SqueezeNet 0.957 at 1 thread against the
/// bound at 4096 (device host, median of 15 paired rounds, §38). Smaller products (16
/// tiles × 64 channels: 1024) were not measured again and stay with `packed_im`.
fn packed_first(w: &Tensor, a: &ConvAttrs, out: &Shape, tiles: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let c = w.dims().get(1).copied().unwrap_or(0);
        tiles.saturating_mul(c) < WINOGRAD_PACKED_WORK
            && super::pack::pack_form(w, a, out).is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, a, out, tiles);
        false
    }
}

/// See [`packed_first`].
pub(crate) const WINOGRAD_PACKED_WORK: usize = 2048;

/// See [`winograd_pays`].
pub(crate) const WINOGRAD_MIN_TILES: usize = 32;
/// See [`winograd_pays`]: 1 MiB.
pub(crate) const WINOGRAD_SMALL_WEIGHTS: usize = 1 << 20;

/// Fewest input and output channels for the Winograd path. SqueezeNet's 3×3 convs with
/// 16 input channels ran slower through it than through im2col (1 thread: 4.17 ms with the
/// bound at 32 against 4.27 ms at 16, best of 3 runs).
pub(crate) const WINOGRAD_MIN_CH: usize = 32;
