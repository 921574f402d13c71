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

use super::common::{
    add_bias_residual, bias_clamp, with_col, with_scratch, Epilogue, Geo, SendPtr, PHASES, PRODUCTS,
};
use super::im2col::{im2col_2d, CONV_SPLIT_FLOPS};
use super::packed_rows::RowsRes;
use crate::kernels::simd::{isa_cap, IsaCap};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};
use std::sync::atomic::Ordering;

/// The instruction set of a [`PackedConv`]'s kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MkIsa {
    /// AVX-512F: tiles of 32 channels (two zmm) × up to 12 positions.
    Avx512,
    /// AVX2 + FMA: tiles of 16 channels (two ymm) × up to 6 positions.
    Avx2,
}

impl MkIsa {
    /// Output channels per packed block (the tile's vector side).
    pub(super) fn mb(self) -> usize {
        match self {
            MkIsa::Avx512 => 32,
            MkIsa::Avx2 => 16,
        }
    }

    /// Most positions per tile. 10 on AVX-512: tiles of 11 and 12 positions (22–24
    /// accumulators) ran at 75–80% of the speed of tiles of 10 (`packed_tile_peak`;
    /// 1024←256 at 14² 716 against 559 µs).
    pub(super) fn np_max(self) -> usize {
        match self {
            MkIsa::Avx512 => 10,
            MkIsa::Avx2 => 6,
        }
    }

    /// The best this CPU runs (within `RLX_CPU_ISA`), or None (then convs take gemm).
    pub fn best() -> Option<MkIsa> {
        match isa_cap() {
            IsaCap::Avx512 => Some(MkIsa::Avx512),
            IsaCap::Avx2 => Some(MkIsa::Avx2),
            IsaCap::Portable => None,
        }
    }
}

/// A conv's weights `[M, C, KH, KW]` (one group) packed for [`MkIsa`]'s kernel:
/// `[ceil(M/mb)][K][mb]` with `K = C·KH·KW`, the channels past `M` zero.
pub struct PackedConv {
    isa: MkIsa,
    m: usize,
    k: usize,
    wdims: Vec<usize>,
    data: Vec<f32>,
    /// Packed for [`super::packed_rows`] (positions on the vector side, `[M/6][K][6]`)
    /// instead of this file's tiles.
    rows: bool,
}

impl std::fmt::Debug for PackedConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedConv({:?}, {:?}, {} bytes)",
            self.isa,
            self.wdims,
            self.bytes()
        )
    }
}

impl PackedConv {
    /// Packs `w` (`[m, k]` row-major, any trailing dims folded into `k`) for `isa`.
    pub fn new(isa: MkIsa, w: &[f32], wdims: &[usize]) -> PackedConv {
        let m = wdims[0];
        let k = wdims[1..].iter().product::<usize>();
        assert_eq!(w.len(), m * k, "packed conv: weights do not fit {wdims:?}");
        let mb = isa.mb();
        let nb = m.div_ceil(mb);
        let mut data = vec![0f32; nb * k * mb];
        for (i, row) in w.chunks_exact(k.max(1)).enumerate().take(m) {
            let blk = &mut data[(i / mb) * k * mb..][..k * mb];
            for (c, &v) in row.iter().enumerate() {
                blk[c * mb + i % mb] = v;
            }
        }
        PackedConv {
            isa,
            m,
            k,
            wdims: wdims.to_vec(),
            data,
            rows: false,
        }
    }

    /// Packs `w` (`[m, k]` row-major, any trailing dims folded into `k`) for
    /// [`super::packed_rows`]'s AVX-512 kernel (a stride-1 1×1 conv's positions on the
    /// vector side).
    pub fn new_rows(w: &[f32], wdims: &[usize]) -> PackedConv {
        let m = wdims[0];
        let k = wdims[1..].iter().product::<usize>();
        assert_eq!(w.len(), m * k, "packed conv: weights do not fit {wdims:?}");
        PackedConv {
            isa: MkIsa::Avx512,
            m,
            k,
            wdims: wdims.to_vec(),
            data: super::packed_rows::pack(w, m, k),
            rows: true,
        }
    }

    /// Products per output (`C·KH·KW`).
    pub(super) fn k(&self) -> usize {
        self.k
    }

    /// The packed weights.
    pub(super) fn data(&self) -> &[f32] {
        &self.data
    }

    /// Output channels per packed block: [`MkIsa::mb`] for tiles, `packed_rows::MR` rows.
    fn block(&self) -> usize {
        if self.rows {
            super::packed_rows::MR
        } else {
            self.isa.mb()
        }
    }

    /// The weights' dims (`[M, C, KH, KW]`).
    pub fn wdims(&self) -> &[usize] {
        &self.wdims
    }

    /// The weights back in their own layout (`[M, C, KH, KW]` row-major): the exact values
    /// packed (packing moves values, it computes none). For a conv this kernel does not
    /// take (`conv_post`'s paths), so an executor need not keep an unpacked copy too.
    pub fn unpack(&self) -> Vec<f32> {
        let (m, k, mb) = (self.m, self.k, self.block());
        let mut w = vec![0f32; m * k];
        for (i, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(m) {
            let blk = &self.data[(i / mb) * k * mb..][..k * mb];
            for (c, v) in row.iter_mut().enumerate() {
                *v = blk[c * mb + i % mb];
            }
        }
        w
    }

    /// The packed bytes.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    pub fn isa(&self) -> MkIsa {
        self.isa
    }
}

/// Which convs get packed weights (when the executor is built): f32, 2-D, one group,
/// dilation 1, at least `MIN_K` products per output, at most M/8 padding channels in the
/// last block (M = 48 on AVX-512 computes 64: SqueezeNet's 48←384 lost), and
/// * 1×1 kernels without padding on output planes up to 8² and of `MAX_PLANE` (7², 14²:
///   the pointwise convs where gemm's weight reads hurt most);
/// * larger kernels with stride 2 on output planes up to `MAX_PLANE_S2` (ResNet's 3×3/2
///   convs to 7², through im2col: 1 thread, weights cold, 512←256 at 14² read 829–900 µs
///   against gemm's 900–990). Not stride 1 (7²: 1.8–1.9 ms against gemm's 1.65 hot; the
///   larger planes take Winograd or the direct kernel).
///
/// None for others, without AVX-512 (AVX2 with `RLX_CPU_MK=1`), or with `RLX_CPU_MK=0`.
pub fn packed_weights(w: &Tensor, a: &ConvAttrs, out: &Shape) -> Option<PackedConv> {
    pack_form(w, a, out)?.pack(w)
}

/// The form in which [`packed_weights`] packs a conv's weights: the choice (which depends
/// on the conv's output size) apart from the packing (which depends on the weights alone),
/// so the executors of one model at several sizes can share one packed copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackForm {
    /// `[ceil(M/mb)][K][mb]` tiles for [`MkIsa`]'s kernel ([`PackedConv::new`]).
    Tiles(MkIsa),
    /// Positions on the vector side ([`PackedConv::new_rows`]).
    Rows,
}

impl PackForm {
    /// `w` (f32, `[M, C, KH, KW]`) packed in this form; None for other weights.
    pub fn pack(self, w: &Tensor) -> Option<PackedConv> {
        let TensorData::F32(wv) = w.data() else {
            return None;
        };
        let d = w.dims();
        if d.len() != 4 || wv.len() != d.iter().product::<usize>() {
            return None;
        }
        Some(match self {
            PackForm::Tiles(isa) => PackedConv::new(isa, wv, d),
            PackForm::Rows => PackedConv::new_rows(wv, d),
        })
    }
}

/// Whether and how [`packed_weights`] packs the weights `w` of a conv with attributes `a`
/// and output type `out` (the conditions on [`packed_weights`]); reads no weight values.
pub fn pack_form(w: &Tensor, a: &ConvAttrs, out: &Shape) -> Option<PackForm> {
    if w.dtype() != rlx_ir::DType::F32 {
        return None;
    }
    let d = w.dims();
    let od = out.static_dims().filter(|od| od.len() == 4)?;
    if d.len() != 4 {
        return None;
    }
    let p = od[2] * od[3];
    let plain = a.groups.max(1) == 1 && a.dilations.iter().all(|&v| v == 1);
    let pw = d[2..] == [1, 1] && a.pads.iter().all(|&p| p == (0, 0)) && (p <= 64 || p == MAX_PLANE);
    // Larger kernels: stride 2 on small planes through im2col; with the input read in
    // place (`packed_im`), stride 1 or 2 on any plane with at least KXK_MIN_C input
    // channels (Winograd, where it takes a conv, comes first: the executor's choice).
    let s2 = d[2] * d[3] > 1
        && a.dilations.iter().all(|&v| v == 1)
        && if super::packed_im::enabled() {
            d[1] >= KXK_MIN_C && a.strides.iter().all(|&s| s == 1 || s == 2)
        } else {
            a.strides == [2, 2] && p <= MAX_PLANE_S2
        };
    let k: usize = d[1..].iter().product();
    // Stride-1 1×1 convs on planes larger than 14²: positions on the vector side.
    if plain
        && d[2..] == [1, 1]
        && a.pads.iter().all(|&p| p == (0, 0))
        && a.strides.iter().all(|&s| s == 1)
        && p > MAX_PLANE
        && rows_enabled()
    {
        return Some(PackForm::Rows);
    }
    if !plain || !(pw || s2) || k < MIN_K {
        return None;
    }
    let isa = enabled_isa()?;
    // Channels computed past M in the last block: at most an eighth of M.
    if d[0].div_ceil(isa.mb()) * isa.mb() * 8 > d[0] * 9 {
        return None;
    }
    Some(PackForm::Tiles(isa))
}

/// True when stride-1 1×1 convs on planes larger than 14² take [`super::packed_rows`]:
/// AVX-512F and `RLX_CPU_MK_ROWS=1` (read once per process). Off by default: on the AMD
/// EPYC Zen 4 of bench/NOTES.md §27 it ran at gemm's speed, not faster (models 1.00–1.03×
/// with it, 1 thread).
fn rows_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        isa_cap() == IsaCap::Avx512
            && !rlx_ir::env::is_off("RLX_CPU_MK")
            && rlx_ir::env::is_on("RLX_CPU_MK_ROWS")
    })
}

/// How the packed drivers ([`run`] here, `packed_im`) cut a conv into tasks: per image,
/// `chunks` blocks of output positions, each in `parts` ranges of channel blocks.
///
/// Without threads (or below [`CONV_SPLIT_FLOPS`]): blocks of `rows` output rows (sized by
/// the driver so that a block's input and output stay in L2), one part. With threads, where
/// those blocks give fewer than [`super::common::TASKS_PER_THREAD`] tasks per thread, more tasks, so that
/// rayon hands them out as threads free up and a thread that runs slower (another guest on
/// its core) takes fewer:
/// * where an image's input (`x` values: the planes the conv reads) outweighs its weights
///   (`w` values) and the driver can cut anywhere in a plane (`any_pos`), near-equal runs
///   of positions: each task then reads all the weights and its positions' inputs. With
///   channel ranges instead, each task reads every input position and its channels'
///   weights, so every thread reads the whole input, half of it from the cache of the core
///   that wrote it. MobileNetV2's 96←576 and 64←384 at 14² (input 2-4× the weights), 2
///   threads, against one channel range per thread: 263-268 → 199-206 and 123-127 →
///   110-111 µs (bench/NOTES.md §35);
/// * else ranges of channel blocks (its 7² convs, weights 3-25× the input, lost by
///   positions: 960←160 at 7² 121 → 238 µs).
///
/// Run and part boundaries fall at `i·total/count` (floor), so rayon's halving of the task
/// range gives each half near-equal work (20 blocks in 8 parts: 2, 3, 2, 3, ...; with
/// `ceil` sizes, 3, 3, 3, 3, 3, 3, 2 left one half 12 blocks and the other 8). A position's
/// tiles and sums and a channel block's do not depend on the task they fall in: the bits
/// do not depend on the split.
pub(super) struct Split {
    /// Output rows per block, or None for runs of positions.
    rows: Option<usize>,
    n: usize,
    oh: usize,
    ow: usize,
    nb: usize,
    /// Blocks of positions per image.
    pub chunks: usize,
    /// Ranges of channel blocks per block of positions.
    pub parts: usize,
}

impl Split {
    /// `par`: several threads and enough work; `n` images of `(oh, ow)` output positions;
    /// `rows`: the driver's cache-sized block; `nb` channel blocks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        par: bool,
        n: usize,
        (oh, ow): (usize, usize),
        rows: usize,
        any_pos: bool,
        (x, w): (usize, usize),
        nb: usize,
        threads: usize,
    ) -> Split {
        let p = oh * ow;
        let rows = rows.clamp(1, oh.max(1));
        let mut s = Split {
            rows: Some(rows),
            n,
            oh,
            ow,
            nb,
            chunks: oh.div_ceil(rows),
            parts: 1,
        };
        let want = super::common::TASKS_PER_THREAD * threads;
        if !par || n * s.chunks >= want {
            return s;
        }
        let runs = want.div_ceil(n).min(p / MIN_RUN);
        if any_pos && x > w && runs > s.chunks {
            s.rows = None;
            s.chunks = runs;
        }
        if n * s.chunks < want {
            s.parts = want.div_ceil(n * s.chunks).clamp(1, nb.max(1));
        }
        s
    }

    /// Tasks over all images.
    pub(super) fn tasks(&self) -> usize {
        self.n * self.chunks * self.parts
    }

    /// Task `t`'s image, positions (first, count) and channel blocks `b0..b1`.
    pub(super) fn task(&self, t: usize) -> (usize, (usize, usize), (usize, usize)) {
        let per_image = self.chunks * self.parts;
        let (ci, mp) = ((t % per_image) / self.parts, t % self.parts);
        (t / per_image, self.span(ci), self.blocks(mp))
    }

    /// Block `ci`'s first position and position count.
    pub(super) fn span(&self, ci: usize) -> (usize, usize) {
        match self.rows {
            Some(r) => {
                let (oy0, oy1) = (ci * r, ((ci + 1) * r).min(self.oh));
                (oy0 * self.ow, (oy1 - oy0) * self.ow)
            }
            None => {
                let p = self.oh * self.ow;
                let (j0, j1) = (ci * p / self.chunks, (ci + 1) * p / self.chunks);
                (j0, j1 - j0)
            }
        }
    }

    /// Part `mp`'s channel blocks `b0..b1`.
    pub(super) fn blocks(&self, mp: usize) -> (usize, usize) {
        (mp * self.nb / self.parts, (mp + 1) * self.nb / self.parts)
    }
}

/// Fewest positions in a [`Split`]'s run of positions (about two tiles).
const MIN_RUN: usize = 16;

/// See [`packed_weights`].
const MAX_PLANE_S2: usize = 64;

/// Fewest input channels for which a conv larger than 1×1 is packed (read in place):
/// with fewer, the direct kernel (`dconv`) is faster: ResNet's 7×7/2 stem (3 channels)
/// ran 1.21× slower this way alone, SqueezeNet's 3×3 16→64 at 55² (K = 144) 475 against
/// 410 µs in the model (1 thread, Xeon). Wider convs gained (bench/NOTES.md §31).
const KXK_MIN_C: usize = 32;

/// Fewest products per output (`K`) for which a conv is packed: below, the tile's stores
/// and transposition outweigh its FMAs (576←96 at 14²: 129–144 µs against gemm's 119–133;
/// SqueezeNet's 13² convs with K of 48 and 64 lost in the model).
const MIN_K: usize = 128;

/// Largest output plane for which a 1×1 conv is packed: on larger planes gemm (positions
/// on its vector side, no transposition) is faster with hot weights (`packed_timing`:
/// 256←64 at 56² 611 against 918 µs). Between 8² and 14² only 14² itself: SqueezeNet's
/// 1000←512 at 13² read 1148–1186 µs in the model against gemm's 1035–1050 (alone with
/// hot weights 931–1182 against 829); the cause is not found.
const MAX_PLANE: usize = 196;

/// The kernel's ISA where convs take it: AVX-512 unless `RLX_CPU_MK=0`; AVX2 only with
/// `RLX_CPU_MK=1` set (not yet measured against gemm's AVX2 kernel on an AVX2-only CPU:
/// here gemm runs AVX-512 even under `RLX_CPU_ISA=avx2`, so the AVX2 kernel read 7–8%
/// behind it in MobileNetV2 and EfficientNet-B0, which says nothing about Zen 2).
fn enabled_isa() -> Option<MkIsa> {
    static ON: std::sync::OnceLock<Option<MkIsa>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match MkIsa::best()? {
        MkIsa::Avx512 if !rlx_ir::env::is_off("RLX_CPU_MK") => Some(MkIsa::Avx512),
        MkIsa::Avx2 if rlx_ir::env::is_on("RLX_CPU_MK") => Some(MkIsa::Avx2),
        _ => None,
    })
}

/// Bytes of a task's `X` block (`K` rows of its positions) and its output stripe together:
/// inside L2.
const CHUNK_BYTES: usize = 768 << 10;

/// Most `K` rows per pass: a channel block's `KC` rows of weights (16 KB at 32 channels)
/// stay in L1 for every tile of positions (`packed_timing`, 1 thread: 128 read within
/// noise of 256 and 512, a little ahead on 1000←512 at 13²).
const KC: usize = 128;

/// True when `pk` (packed from weights of dims `wdims`) fits conv `g` on this CPU.
fn fits(pk: &PackedConv, wdims: &[usize], g: &Geo) -> bool {
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

/// The epilogue of `rows` output rows whose sums are in place (row `i` at `dst + ooff +
/// i·p`, `pb` values; its channel `m0 + i`, its residual at the same offset of `res`):
/// the bias, residual, clamp, `post` and the scan's largest |y| per row, exactly as
/// [`super::im2col::conv_float`] applies them (`post` over the whole run when the rows are
/// whole planes).
///
/// # Safety
/// Those rows are inside `dst`'s allocation and the caller's alone.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn finish_rows(
    dst: *mut f32,
    ooff: usize,
    m0: usize,
    rows: usize,
    pb: usize,
    p: usize,
    epi: &Epilogue,
    res: Option<&[f32]>,
) {
    let Epilogue {
        bias,
        clamp,
        post,
        seen,
        ..
    } = *epi;
    for i in 0..rows {
        // SAFETY: the caller's row segment.
        let seg = unsafe { std::slice::from_raw_parts_mut(dst.add(ooff + i * p), pb) };
        let mut bv = bias.map(|b| b[m0 + i]);
        if let Some(r) = res {
            let at = ooff + i * p;
            add_bias_residual(seg, bv.take(), &r[at..at + pb]);
        }
        let bits = bias_clamp(seg, bv, clamp, seen.is_some());
        if let Some(s) = seen {
            s.fetch_max(bits, Ordering::Relaxed);
        }
        if clamp.is_none() && pb < p {
            post(seg);
        }
    }
    if clamp.is_none() && pb == p {
        // Whole planes: the rows are one run.
        // SAFETY: the caller's rows, consecutive when pb == p.
        post(unsafe { std::slice::from_raw_parts_mut(dst.add(ooff), rows * p) });
    }
}

/// Convs run by [`run`] in this process ([`packed_runs`]).
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts one conv run by this kernel (here or in [`super::packed_im`]).
pub(super) fn count_run() {
    RUNS.fetch_add(1, Ordering::Relaxed);
}

/// How many convs this kernel has run in this process.
pub fn packed_runs() -> u64 {
    RUNS.load(Ordering::Relaxed)
}

/// [`conv_packed_f32`] once `pk` fits `g`. Per task (an image, a block of output rows,
/// a range of channel blocks): per channel block, per `KC` rows of its weights (read
/// from memory once, in order, then from L1), every tile of positions (`X` read in place
/// from L2), into a stripe `[position][mb]`; then the stripe goes to the block's NCHW
/// output rows with the epilogue.
fn run(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: Option<&[f32]>) -> Vec<f32> {
    if super::packed_im::takes(g) {
        return super::packed_im::run(x, pk, g, epi, res);
    }
    run_cols(x, pk, g, epi, res)
}

/// [`run`] through im2col's column matrix (or the input planes of a stride-1 1×1 conv).
fn run_cols(x: &[f32], pk: &PackedConv, g: &Geo, epi: &Epilogue, res: Option<&[f32]>) -> Vec<f32> {
    let (m, k, isa) = (g.m, pk.k, pk.isa);
    let (mb, np_max) = (isa.mb(), isa.np_max());
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let p = oh * ow;
    let plane = g.sp[0] * g.sp[1];
    let total = g.n * m * p;
    RUNS.fetch_add(1, Ordering::Relaxed);
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
    // Block `b`'s stripe (`pb` positions from `j0` of image `ni`) into its NCHW output
    // rows, then the bias, residual, clamp and `post` per row as conv_float applies them.
    let epilogue = |ni: usize, j0: usize, pb: usize, b: usize, stripe: &[f32]| {
        let (m0, m1) = (b * mb, ((b + 1) * mb).min(m));
        let ooff = (ni * m + m0) * p + j0;
        // SAFETY: rows m0..m1 of image ni, columns j0..j0+pb: the calling task's
        // (disjoint from every other task's); the stripe holds pb·mb values.
        unsafe { transpose_into(stripe.as_ptr(), mb, pb, m1 - m0, dst.get().add(ooff), p) };
        // SAFETY: as above.
        unsafe { finish_rows(dst.get(), ooff, m0, m1 - m0, pb, p, epi, res) };
    };
    let task = |t: usize| {
        let (ni, (j0, pb), (b0, b1)) = split.task(t);
        let (oy0, oy1) = (j0 / ow.max(1), (j0 + pb).div_ceil(ow.max(1)));
        let xi = &x[ni * g.c * plane..(ni + 1) * g.c * plane];
        // Tiles of near-equal width, at most np_max.
        let nt = pb.div_ceil(np_max);
        let (base, extra) = (pb / nt, pb % nt);
        let tiles =
            (0..nt).map(move |ti| (ti * base + ti.min(extra), base + usize::from(ti < extra)));
        let body = |xp: &[f32], xs: usize| {
            with_scratch(&PRODUCTS, pb * mb, |stripe: &mut [f32]| {
                // The weights are one array read in order; the tiles prefetch the next
                // slice's lines (from `ahead`, in floats) while they run on this one, so
                // that its memory traffic overlaps their FMAs instead of stalling the
                // first tile of each slice.
                let lim = (b1 * k * mb).min(pk.data.len());
                let mut ahead = (b0 * k + kc_max.min(k)) * mb;
                for b in b0..b1 {
                    for k0 in (0..k).step_by(kc_max) {
                        let kc = kc_max.min(k - k0);
                        // This block's KC rows of weights: read from memory once, then
                        // from L1 by the other tiles.
                        let at0 = (b * k + k0) * mb;
                        let wb = &pk.data[at0..at0 + kc * mb];
                        for (p0, np) in tiles.clone() {
                            // Floats of the next slice per row of k: the slice spread
                            // over this slice's tiles; none once it (or the end) is covered.
                            let pfl = if ahead >= lim.min(at0 + 2 * kc * mb) {
                                0
                            } else {
                                mb.div_ceil(nt)
                            };
                            let pf = pk.data.as_ptr().wrapping_add(ahead);
                            ahead += kc * pfl;
                            // SAFETY: `wb` holds kc·mb values, X kc rows of np at
                            // stride xs; the stripe's tile holds np·mb values.
                            unsafe {
                                tile(
                                    isa,
                                    np,
                                    kc,
                                    k0 > 0,
                                    wb.as_ptr(),
                                    xp[k0 * xs + p0..].as_ptr(),
                                    xs,
                                    stripe.as_mut_ptr().add(p0 * mb),
                                    (pf, pfl),
                                )
                            };
                        }
                    }
                    epilogue(ni, j0, pb, b, stripe);
                }
            })
        };
        if direct {
            body(&xi[j0..], plane)
        } else {
            with_col(k * pb, |col: &mut [f32]| {
                im2col_2d(xi, g, col, (oy0, oy1));
                body(col, pb)
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

/// One tile: `np` positions × `isa.mb()` channels, `t[j·mb + i] = (acc ? t[j·mb + i] :
/// +0) + Σ_c w[c·mb + i] · x[c·xs + j]` over `c < k`, one FMA per term, in order.
///
/// # Safety
/// `w` holds `k·mb` values, `x` rows `0..k` at stride `xs` hold `np` values each, `t` has
/// room for `np·mb` (initialized when `acc`); `np` is in `1..=isa.np_max()`; the CPU has
/// `isa`. `pf`: per row of `k`, the line at `pf.0` (and the next when `pf.1 > 16`) is
/// prefetched, `pf.0` advancing `pf.1` floats (any address: a prefetch does not fault).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
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

/// `d[i·ds + j] = s[j·mb + i]` for `i < rows`, `j < pb`: a stripe of tiles into NCHW
/// output rows, by 8×8 blocks in registers (AVX), the edges one value at a time.
///
/// # Safety
/// `s` holds `pb·mb` values (`rows ≤ mb`); `d` rows `0..rows` at stride `ds` have room for
/// `pb` values; the CPU has AVX2 (every [`MkIsa`] has).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_into(
    s: *const f32,
    mb: usize,
    pb: usize,
    rows: usize,
    d: *mut f32,
    ds: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract; every index below is inside those bounds.
    unsafe {
        let mut i = 0;
        while i + 8 <= rows {
            let mut j = 0;
            while j + 8 <= pb {
                let mut r = [_mm256_setzero_ps(); 16];
                for (q, v) in r.iter_mut().take(8).enumerate() {
                    *v = _mm256_loadu_ps(s.add((j + q) * mb + i));
                }
                crate::kernels::simd::transpose8(&mut r);
                for (q, v) in r.iter().take(8).enumerate() {
                    _mm256_storeu_ps(d.add((i + q) * ds + j), *v);
                }
                j += 8;
            }
            for jj in j..pb {
                for q in 0..8 {
                    *d.add((i + q) * ds + jj) = *s.add(jj * mb + i + q);
                }
            }
            i += 8;
        }
        for ii in i..rows {
            for j in 0..pb {
                *d.add(ii * ds + j) = *s.add(j * mb + ii);
            }
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
    let mut wd = vec![g.m, g.c];
    wd.extend(&g.ks);
    let pk = PackedConv::new(isa, w, &wd);
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
    let mut wd = vec![g.m, g.c];
    wd.extend(&g.ks);
    let pk = PackedConv::new(isa, w, &wd);
    assert!(fits(&pk, &wd, g));
    run_cols(x, &pk, g, epi, res)
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
