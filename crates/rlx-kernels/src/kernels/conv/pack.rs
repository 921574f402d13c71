//! The packed weights of RLX's own f32 conv product (issue 34) and what its three drivers
//! share: [`PackedConv`] (tiles for [`super::packed`] and [`super::packed_im`], rows for
//! [`super::packed_rows`]), which convs get which form ([`pack_form`]), how a driver cuts a
//! conv into tasks ([`Split`]), the epilogue of finished output rows ([`finish_rows`]) and
//! the transposition of a stripe of tiles into NCHW rows ([`transpose_into`]). The drivers
//! import this file; this file imports none of them, so the family has no import loop
//! (`packed` dispatches to `packed_im` and `packed_rows`, which see only this file).

use super::common::{is_identity, row_epilogue, Clamp, Epilogue};
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
    pub(super) isa: MkIsa,
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) wdims: Vec<usize>,
    data: Vec<f32>,
    /// Where the packed values start in `data` (a 64-byte boundary: [`zeroed_aligned`]).
    off: usize,
    /// Packed for [`super::packed_rows`] (positions on the vector side, `[M/6][K][6]`)
    /// instead of this file's tiles.
    pub(super) rows: bool,
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
        let (data, off) = pack_blocks(w, m, k, isa.mb());
        PackedConv {
            isa,
            m,
            k,
            wdims: wdims.to_vec(),
            data,
            off,
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
        let (data, off) = pack_rows(w, m, k);
        PackedConv {
            isa: MkIsa::Avx512,
            m,
            k,
            wdims: wdims.to_vec(),
            data,
            off,
            rows: true,
        }
    }

    /// Products per output (`C·KH·KW`).
    pub(super) fn k(&self) -> usize {
        self.k
    }

    /// The packed weights.
    pub(super) fn data(&self) -> &[f32] {
        &self.data[self.off..]
    }

    /// Output channels per packed block: [`MkIsa::mb`] for tiles, `packed_rows::MR` rows.
    fn block(&self) -> usize {
        if self.rows {
            MR
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
            let blk = &self.data()[(i / mb) * k * mb..][..k * mb];
            for (c, v) in row.iter_mut().enumerate() {
                *v = blk[c * mb + i % mb];
            }
        }
        w
    }

    /// A 1×1 conv's packed weights with input channel `c` scaled by `s[c]`
    /// (`W'[o, c] = W[o, c] · s[c]`, one f32 product per weight, as on the unpacked
    /// weights): the weights of the conv on `x` for the conv on `x ⊙ s` (a
    /// Squeeze-and-Excitation scale). On a buffer from the pool ([`PackedConv::release`]).
    /// None for other kernel sizes or a length of `s` other than `C`.
    pub fn scaled_inputs(&self, s: &[f32]) -> Option<PackedConv> {
        if self.wdims.get(2..) != Some(&[1, 1][..]) || s.len() != self.k || self.k == 0 {
            return None;
        }
        let mut data = crate::buffers::overwritten::<f32>(self.data().len());
        let width = if self.rows { MR } else { self.isa.mb() };
        for (d, w) in data
            .chunks_exact_mut(self.k * width)
            .zip(self.data().chunks_exact(self.k * width))
        {
            for ((d, w), &sc) in d.chunks_exact_mut(width).zip(w.chunks_exact(width)).zip(s) {
                for (d, &w) in d.iter_mut().zip(w) {
                    *d = w * sc;
                }
            }
        }
        Some(PackedConv {
            data,
            off: 0,
            wdims: self.wdims.clone(),
            ..*self
        })
    }

    /// Hands the packed buffer back to the pool (a [`PackedConv::scaled_inputs`] copy).
    pub fn release(self) {
        crate::buffers::give(TensorData::F32(self.data));
    }

    /// Whether the last block holds at most 16 channels on AVX-512 (1×1 convs whose `M`
    /// is 16 past a multiple of 32 or less, e.g. EfficientNet-B0's 112 and 80): its tiles
    /// then compute those 16 only ([`super::packed::tile16`]), not the 32 of a block.
    pub(super) fn half_last(&self) -> bool {
        !self.rows && half_block(self.isa, &self.wdims)
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
/// dilation 1, at least [`min_k`] products per output, at most M/8 padding channels in the
/// last block (M = 48 on AVX-512 computes 64: SqueezeNet's 48←384 lost), and
/// * 1×1 kernels without padding on output planes up to 8² and of `MAX_PLANE` (7², 14²:
///   the pointwise convs where gemm's weight reads hurt most), and on the planes between
///   with at most `mid_plane_w_bytes()` of weights (SqueezeNet's 64←384 and 64←512 at 13²;
///   on AMD with AVX-512 its 2 MB classifier too),
///   and, with as few weights, on planes up to `ODD_PLANE_MAX` (28²) that are not whole
///   64-byte lines (SqueezeNet's 32←256 and 32←128 at 27²);
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

/// Whether tiles of `isa` on weights of dims `wdims` (`[M, C, KH, KW]`) end in a block of
/// at most 16 channels that runs the one-zmm tile ([`PackedConv::half_last`]): a 1×1 conv
/// on AVX-512 whose `M` is 1 to 16 past a multiple of 32.
fn half_block(isa: MkIsa, wdims: &[usize]) -> bool {
    isa == MkIsa::Avx512
        && wdims.get(2..) == Some(&[1, 1][..])
        && matches!(wdims.first().map(|m| m % isa.mb()), Some(1..=16))
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
    let k: usize = d[1..].iter().product();
    let plain = a.groups.max(1) == 1 && a.dilations.iter().all(|&v| v == 1);
    let w_bytes = d[0] * k * size_of::<f32>();
    let small_w = w_bytes <= MID_PLANE_W_BYTES;
    let pw = d[2..] == [1, 1]
        && a.pads.iter().all(|&p| p == (0, 0))
        && (p <= 64
            || p == MAX_PLANE
            || (p < MAX_PLANE && w_bytes <= mid_plane_w_bytes())
            || (p <= ODD_PLANE_MAX && p % 16 != 0 && small_w));
    // Larger kernels: stride 2 on small planes through im2col; with the input read in
    // place (`packed_im`), stride 1 or 2 on any plane with at least KXK_MIN_C input
    // channels (Winograd, where it takes a conv, comes first: the executor's choice).
    let s2 = d[2] * d[3] > 1
        && a.dilations.iter().all(|&v| v == 1)
        && if im_enabled() {
            d[1] >= KXK_MIN_C && a.strides.iter().all(|&s| s == 1 || s == 2)
        } else {
            a.strides == [2, 2] && p <= MAX_PLANE_S2
        };
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
    if !plain || !(pw || s2) || k < min_k() {
        return None;
    }
    let isa = enabled_isa()?;
    // Channels computed past M in the last block: at most an eighth of M. A 1×1 conv's last
    // block of at most 16 channels on AVX-512 computes 16 (`PackedConv::half_last`), which
    // counts on planes over 64 positions: on smaller ones the weights' reads bind, and that
    // block still reads its 32-wide rows (EfficientNet-B0's 48←1152 at 1×1: 19-20 µs on
    // gemm, 22-25 on the half tile).
    let mb = isa.mb();
    let computed = if p > 64 && half_block(isa, d) {
        d[0] - d[0] % mb + 16
    } else {
        d[0].div_ceil(mb) * mb
    };
    if computed * 8 > d[0] * 9 {
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

/// How the packed drivers (`packed`, `packed_im`) cut a conv into tasks: per image,
/// `chunks` blocks of output positions, each in `parts` ranges of channel blocks.
///
/// Without threads (or below [`super::im2col::CONV_SPLIT_FLOPS`]): blocks of `rows` output rows (sized by
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
///   positions: 960←160 at 7² 121 → 238 µs); where the blocks are fewer than the tasks
///   (160←960 at 7²: 5 blocks of 32 channels for 8 tasks at 2 threads, so one thread ran 3
///   and the other 2) and the image is one block of rows that can be cut anywhere, each
///   channel block's positions are cut into runs as well, and the tasks go block by block
///   (a block's runs together), so that rayon's halves share one block's weights at most:
///   160←960 at 7², 2 threads, 99.8 → 89.8 µs (bench/NOTES.md §43).
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
    /// Tasks in order of channel range (a range's blocks of positions together), else
    /// of block of positions.
    by_block: bool,
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
            by_block: false,
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
        // Fewer channel blocks than tasks wanted, one block of rows: each block's
        // positions in runs as well, the tasks in order of block (each block's runs
        // together), so that rayon's halves share at most one block's weights.
        if any_pos && s.chunks == 1 && n * s.parts < want {
            let runs = want.div_ceil(n * s.parts).min(p / MIN_RUN);
            if runs > 1 {
                s.rows = None;
                s.chunks = runs;
                s.by_block = true;
            }
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
        let (ci, mp) = if self.by_block {
            (t % self.chunks, (t % per_image) / self.chunks)
        } else {
            ((t % per_image) / self.parts, t % self.parts)
        };
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
/// and transposition outweigh its FMAs. 128 ([`MIN_K`]) except on AMD with AVX-512
/// ([`MIN_K_AMD512`]); both inputs are read once per process.
pub(super) fn min_k() -> usize {
    if isa_cap() == IsaCap::Avx512 && crate::kernels::simd::amd() {
        MIN_K_AMD512
    } else {
        MIN_K
    }
}

/// [`min_k`] on Intel and on AVX2: 576←96 at 14² ran 129–144 µs against gemm's 119–133,
/// SqueezeNet's 13² convs with K of 48 and 64 lost in the model, and 64 lost again on an
/// Intel Xeon VM in stop 56 (MobileNetV2's 384←64 and 576←96 at 14² 4-23 µs each, model
/// 1.034; bench/NOTES.md §38).
const MIN_K: usize = 128;

/// [`min_k`] on AMD with AVX-512 (Zen 4): the packed tiles beat gemm from K = 64, per node
/// in the models (1 thread, interleaved rounds, bench/NOTES.md §41): MobileNetV2's 576←96
/// at 14² 303-340 → 252-276 µs and 384←64 140-160 → 122-131, EfficientNet-B0's 672←112
/// at 14² 438-479 → 354-401 and 480←80 236-253 → 203-223; K = 48 (SqueezeNet's 192←48 at
/// 13²) no faster.
const MIN_K_AMD512: usize = 64;

/// Largest output plane for which a 1×1 conv is packed: on larger planes gemm (positions
/// on its vector side, no transposition) is faster with hot weights (`packed_timing`:
/// 256←64 at 56² 611 against 918 µs). Between 8² and 14², 14² itself and convs with at
/// most [`MID_PLANE_W_BYTES`] of weights.
const MAX_PLANE: usize = 196;

/// Most weight bytes of a 1×1 conv packed on an output plane between 8² and 14² (not 14²
/// itself) on Intel and AVX2 ([`mid_plane_w_bytes`]; planes that are not whole lines, up
/// to [`ODD_PLANE_MAX`], on every CPU). SqueezeNet's 13² convs, per node in the model, 1
/// thread, against gemm (bench/NOTES.md §38-39): 64←384 and 64←512 (96 and 128 KB)
/// gained on the three CPU kinds (Intel Xeon VM 12-16 µs each, the device host's Xeon
/// 18-27, Zen 4 14-23); 1000←512 (2 MB) lost 25-73 µs on both Xeons (1148–1186 against
/// 1035–1050 in §31) and gained 62 on Zen 4. Between 128 KB and 2 MB nothing was measured.
const MID_PLANE_W_BYTES: usize = 512 << 10;

/// [`MID_PLANE_W_BYTES`], except on AMD with AVX-512 ([`MID_PLANE_W_BYTES_AMD512`]); both
/// inputs are read once per process.
fn mid_plane_w_bytes() -> usize {
    if isa_cap() == IsaCap::Avx512 && crate::kernels::simd::amd() {
        MID_PLANE_W_BYTES_AMD512
    } else {
        MID_PLANE_W_BYTES
    }
}

/// [`mid_plane_w_bytes`] on AMD with AVX-512 (Zen 4): SqueezeNet's 1000←512 classifier at
/// 13² (2 MB of weights, a quarter of the model's time) on the packed tiles, per node in
/// the model (1 thread, 7 interleaved rounds, bench/NOTES.md §45) 1713 → 1634 µs (its
/// GlobalAveragePool after it 22 → 37); the model 0.983 (median of rounds) at 1 thread,
/// 3.813 → 3.747 ms at 2. The Xeons lost 25-73 µs on the same conv (§31), so they keep
/// the 512 KB bound.
const MID_PLANE_W_BYTES_AMD512: usize = 2 << 20;

/// Largest output plane on which a 1×1 conv whose plane is not a whole number of 16-value
/// (64-byte) lines is packed, with at most [`MID_PLANE_W_BYTES`] of weights. On such a
/// plane gemm's vector loads of the input rows straddle cache lines (each row starts at
/// another offset within a line), where the packed tiles read single values: SqueezeNet's
/// 32←256 and 32←128 at 27², per node in the model (1 thread, 7 interleaved rounds on Zen 4,
/// bench/NOTES.md §41), 199 → 133 and 111 → 84 µs; the same 32←256 conv alone at 27² gemm
/// 153-169 against packed 133-148 µs, at 28² (whole lines) 136-140 against 132-137; and
/// MobileNetV2's 32←144 and 32←192 at 28² read 1.01-1.08× slower packed, so 28² and other
/// whole-line planes stay on gemm.
const ODD_PLANE_MAX: usize = 784;

/// The kernel's ISA where convs take it: AVX-512 unless `RLX_CPU_MK=0`; AVX2 only with
/// `RLX_CPU_MK=1` set (not yet measured against gemm's AVX2 kernel on an AVX2-only CPU:
/// here gemm runs AVX-512 even under `RLX_CPU_ISA=avx2`, so the AVX2 kernel read 7–8%
/// behind it in MobileNetV2 and EfficientNet-B0, which says nothing about Zen 2).
pub(super) fn enabled_isa() -> Option<MkIsa> {
    static ON: std::sync::OnceLock<Option<MkIsa>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match MkIsa::best()? {
        MkIsa::Avx512 if !rlx_ir::env::is_off("RLX_CPU_MK") => Some(MkIsa::Avx512),
        MkIsa::Avx2 if rlx_ir::env::is_on("RLX_CPU_MK") => Some(MkIsa::Avx2),
        _ => None,
    })
}

/// A slice of a channel block's product as [`block_product`] hands it to a tile: the
/// slice's first row of `K` (`k0`), its rows (`kc`) and their packed weights (`kc·mb`
/// values), the tile's positions (first, count), and the prefetch the tile runs (a
/// pointer, floats per row of `K`: `super::packed::tile`'s `pf`).
pub(super) struct Slice<'a> {
    /// The last block of a [`PackedConv::half_last`] pack: its 16 channels only.
    pub half: bool,
    pub k0: usize,
    pub kc: usize,
    pub w: &'a [f32],
    pub p0: usize,
    pub np: usize,
    pub pf: (*const f32, usize),
}

/// The packed drivers' schedule of channel block `b`'s product (`pk`'s weights): per
/// `kc_max` rows of the block's weights (read from memory once, in order, then from L1 by
/// the other tiles), every tile of positions `tiles` (`nt` of them), each run by `tile`.
/// The tiles prefetch the next slice's lines (from `*ahead`, in floats, below `lim`: the
/// task's last block's end) while they run on this one, spread over this slice's tiles,
/// so that its memory traffic overlaps their FMAs instead of stalling the first tile of
/// each slice; none once it (or `lim`) is covered. `*ahead` starts at the second slice of
/// the task's first block and carries over from block to block.
pub(super) fn block_product(
    pk: &PackedConv,
    b: usize,
    kc_max: usize,
    (nt, tiles): (usize, impl Iterator<Item = (usize, usize)> + Clone),
    (ahead, lim): (&mut usize, usize),
    mut tile: impl FnMut(Slice),
) {
    let (k, mb) = (pk.k, pk.isa.mb());
    let half = pk.half_last() && b + 1 == pk.m.div_ceil(mb);
    for k0 in (0..k).step_by(kc_max) {
        let kc = kc_max.min(k - k0);
        let at0 = (b * k + k0) * mb;
        let w = &pk.data()[at0..at0 + kc * mb];
        for (p0, np) in tiles.clone() {
            let pfl = if *ahead >= lim.min(at0 + 2 * kc * mb) {
                0
            } else {
                mb.div_ceil(nt)
            };
            let pf = (pk.data().as_ptr().wrapping_add(*ahead), pfl);
            *ahead += kc * pfl;
            tile(Slice {
                half,
                k0,
                kc,
                w,
                p0,
                np,
                pf,
            });
        }
    }
}

/// One task of the packed drivers (`packed`, `packed_im`): channel blocks `b0..b1` of
/// `pk`'s product over `pb` positions from `j0` of image `ni` (tiles `sched`,
/// [`near_equal_tiles`]). Per block, [`block_product`]'s slices run by `tile` (a slice and
/// the scratch stripe `[position][mb]` of `pb·mb` values), the next slice of weights
/// prefetched up to the end of block `b1 − 1`; then the stripe goes into the block's NCHW
/// output rows of `out` (`m` channels of `p` positions per image, [`transpose_into`]) and
/// their epilogue ([`finish_rows`]: the bias, residual `res`, clamp and `post` of `epi`,
/// as `conv_float` applies them).
///
/// # Safety
/// The CPU has `pk.isa`; rows `b0·mb..min(b1·mb, m)` of image `ni`, columns `j0..j0 + pb`
/// of `out` are inside it and this task's alone; `tile` writes its slice's positions of
/// the stripe only (as `super::packed::tile` does).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn task_blocks(
    pk: &PackedConv,
    (ni, j0, pb): (usize, usize, usize),
    (b0, b1): (usize, usize),
    kc_max: usize,
    (nt, tiles): (usize, impl Iterator<Item = (usize, usize)> + Clone),
    (out, m, p): (*mut f32, usize, usize),
    (epi, res): (&Epilogue, Option<&[f32]>),
    mut tile: impl FnMut(&Slice, &mut [f32]),
) {
    use super::common::{with_scratch, PRODUCTS};
    let (k, mb) = (pk.k, pk.isa.mb());
    with_scratch(&PRODUCTS, pb * mb, |stripe: &mut [f32]| {
        let lim = (b1 * k * mb).min(pk.data().len());
        let mut ahead = (b0 * k + kc_max.min(k)) * mb;
        for b in b0..b1 {
            let sched = (nt, tiles.clone());
            block_product(pk, b, kc_max, sched, (&mut ahead, lim), |s| {
                tile(&s, stripe)
            });
            let (m0, m1) = (b * mb, ((b + 1) * mb).min(m));
            let ooff = (ni * m + m0) * p + j0;
            // SAFETY: rows m0..m1 of image ni, columns j0..j0+pb: this task's alone (the
            // caller's contract); the stripe holds pb·mb values.
            unsafe {
                // Without a residual, the bias and clamp go with the transposition.
                let re = if res.is_none() {
                    RowEpi::of(epi, m0, m1)
                } else {
                    RowEpi::NONE
                };
                let bits = transpose_into(stripe.as_ptr(), mb, pb, m1 - m0, out.add(ooff), p, &re);
                if let Some(s) = epi.seen.filter(|_| re.track) {
                    s.fetch_max(bits, Ordering::Relaxed);
                }
                finish_rows(out, ooff, m0, m1 - m0, pb, p, epi, res, res.is_none());
            }
        }
    })
}

/// `n` positions cut into tiles of near-equal width, at most `np_max` each (49 at 10:
/// 10, 10, 10, 10, 9), so that no tile runs a single position: the tile count and each
/// tile's (first position, width).
pub(super) fn near_equal_tiles(
    n: usize,
    np_max: usize,
) -> (usize, impl Iterator<Item = (usize, usize)> + Clone) {
    let nt = n.div_ceil(np_max.max(1));
    let (base, extra) = (n / nt.max(1), n % nt.max(1));
    let tiles = (0..nt).map(move |ti| (ti * base + ti.min(extra), base + usize::from(ti < extra)));
    (nt, tiles)
}

/// The epilogue of `rows` output rows whose sums are in place (row `i` at `dst + ooff +
/// i·p`, `pb` values; its channel `m0 + i`, its residual at the same offset of `res`):
/// the bias, residual, clamp, `post` and the scan's largest |y| per row, exactly as
/// [`super::im2col::conv_float`] applies them (`post` over the whole run when the rows are
/// whole planes). With `in_place`, the bias, clamp and scan bits were applied as the rows
/// were written ([`RowEpi`]): only `post` is left.
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
    in_place: bool,
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
        let at = ooff + i * p;
        let r = res.map(|r| &r[at..at + pb]);
        if !in_place {
            row_epilogue(seg, bias.map(|b| b[m0 + i]), r, clamp, seen);
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

/// Convs run on packed weights in this process, by any driver ([`packed_runs`]).
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts one conv run by this kernel (here or in [`super::packed_im`]).
pub(super) fn count_run() {
    RUNS.fetch_add(1, Ordering::Relaxed);
}

/// How many convs this kernel has run in this process.
pub fn packed_runs() -> u64 {
    RUNS.load(Ordering::Relaxed)
}

/// The bias and clamp of a block's output rows without a residual, applied by
/// [`transpose_into`] as it writes them: per value the f32 operations of
/// [`super::common::row_epilogue`] (`bias_clamp`, or `wide::bias_clamp_bits` when the scan
/// tracks |y|), in the same order, so the same bits, with one pass fewer over the rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowEpi<'a> {
    /// One bias per row, from the block's first channel.
    bias: Option<&'a [f32]>,
    /// The clamp: None where `bias_clamp` applies none (no clamp, or the identity with
    /// nothing to track).
    clamp: Option<Clamp>,
    /// Take the largest `|v + b|` bits before the clamp (only with a clamp).
    pub(super) track: bool,
}

impl<'a> RowEpi<'a> {
    /// Nothing: the plain transposition.
    pub(super) const NONE: RowEpi<'static> = RowEpi {
        bias: None,
        clamp: None,
        track: false,
    };

    /// `epi`'s bias and clamp for output channels `m0..m1` (`row_epilogue`'s choices).
    pub(super) fn of(epi: &Epilogue<'a>, m0: usize, m1: usize) -> RowEpi<'a> {
        let track = epi.seen.is_some();
        let clamp = epi.clamp.filter(|c| track || !is_identity(c));
        RowEpi {
            bias: epi.bias.map(|b| &b[m0..m1]),
            clamp,
            track: track && clamp.is_some(),
        }
    }

    /// One value of row `i`: the output and its |y| bits before the clamp (0 untracked).
    #[inline(always)]
    // `t != t`: NaN.
    #[allow(clippy::eq_op)]
    fn one(&self, v: f32, i: usize) -> (f32, u32) {
        let b = self.bias.map(|b| b[i]);
        let Some(c) = self.clamp else {
            return (b.map_or(v, |b| v + b), 0);
        };
        // `bias_clamp_bits` adds -0 without a bias (the same value).
        let t = match b {
            Some(b) => v + b,
            None if self.track => v + -0.0,
            None => v,
        };
        let bits = if self.track {
            t.to_bits() & 0x7fff_ffff
        } else {
            0
        };
        let lo = if c.lo > t { c.lo } else { t };
        let y = if c.hi < lo { c.hi } else { lo };
        (if c.nan_out && t != t { f32::NAN } else { y }, bits)
    }
}

/// `d[i·ds + j] = s[j·mb + i]` for `i < rows`, `j < pb`: a stripe of tiles into NCHW
/// output rows, by 8×8 blocks in registers (AVX), the edges one value at a time; each value
/// through `epi` ([`RowEpi`]: bias and clamp, row `i` its `i`-th). Returns the largest
/// |y| bits before the clamp when `epi` tracks them, else 0.
///
/// # Safety
/// `s` holds `pb·mb` values (`rows ≤ mb`); `d` rows `0..rows` at stride `ds` have room for
/// `pb` values; `epi`'s bias (if any) holds `rows` values; the CPU has AVX2 (every
/// [`MkIsa`] has).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_into(
    s: *const f32,
    mb: usize,
    pb: usize,
    rows: usize,
    d: *mut f32,
    ds: usize,
    epi: &RowEpi,
) -> u32 {
    use std::arch::x86_64::*;
    let plain = epi.bias.is_none() && epi.clamp.is_none();
    let mut m = 0u32;
    // SAFETY: the caller's contract; every index below is inside those bounds.
    unsafe {
        let c = epi.clamp.unwrap_or(Clamp::NONE);
        let (lo, hi) = (_mm256_set1_ps(c.lo), _mm256_set1_ps(c.hi));
        let (nan, abs) = (_mm256_set1_ps(f32::NAN), _mm256_set1_epi32(0x7fff_ffff));
        let mut acc = _mm256_setzero_si256();
        let mut i = 0;
        while i + 8 <= rows {
            // This block of rows' biases (`-0`, the same value, where there are none).
            let mut bv = [_mm256_set1_ps(-0.0); 8];
            if let Some(b) = epi.bias {
                for (q, v) in bv.iter_mut().enumerate() {
                    *v = _mm256_set1_ps(b[i + q]);
                }
            }
            let mut j = 0;
            while j + 8 <= pb {
                let mut r = [_mm256_setzero_ps(); 16];
                for (q, v) in r.iter_mut().take(8).enumerate() {
                    *v = _mm256_loadu_ps(s.add((j + q) * mb + i));
                }
                crate::kernels::simd::transpose8(&mut r);
                for (q, &v) in r.iter().take(8).enumerate() {
                    let y = if plain {
                        v
                    } else {
                        // The same operations as `RowEpi::one`, per lane.
                        let t = if epi.bias.is_some() || epi.track {
                            _mm256_add_ps(v, bv[q])
                        } else {
                            v
                        };
                        if epi.track {
                            acc = _mm256_max_epu32(
                                acc,
                                _mm256_and_si256(_mm256_castps_si256(t), abs),
                            );
                        }
                        if epi.clamp.is_some() {
                            let y = _mm256_min_ps(hi, _mm256_max_ps(lo, t));
                            if c.nan_out {
                                _mm256_blendv_ps(y, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(t, t))
                            } else {
                                y
                            }
                        } else {
                            t
                        }
                    };
                    _mm256_storeu_ps(d.add((i + q) * ds + j), y);
                }
                j += 8;
            }
            for jj in j..pb {
                for q in 0..8 {
                    let (y, b) = epi.one(*s.add(jj * mb + i + q), i + q);
                    *d.add((i + q) * ds + jj) = y;
                    m = m.max(b);
                }
            }
            i += 8;
        }
        for ii in i..rows {
            for j in 0..pb {
                let (y, b) = epi.one(*s.add(j * mb + ii), ii);
                *d.add(ii * ds + j) = y;
                m = m.max(b);
            }
        }
        let mut lanes = [0u32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc);
        lanes.iter().fold(m, |a, &b| a.max(b))
    }
}

/// Output channels per [`super::packed_rows`] tile (each a broadcast weight; `MR·NV` = 24
/// accumulators there).
pub(super) const MR: usize = 6;

/// `w` (`[m, k]` row-major) as `[ceil(m/MR)][k][MR]`, the channels past `m` zero:
/// `(buffer, offset)` as [`zeroed_aligned`] gives them.
pub(super) fn pack_rows(w: &[f32], m: usize, k: usize) -> (Vec<f32>, usize) {
    pack_blocks(w, m, k, MR)
}

/// `w` (`[m, k]` row-major) as `[ceil(m/mb)][k][mb]`, the channels past `m` zero:
/// `(buffer, offset)` as [`zeroed_aligned`] gives them.
fn pack_blocks(w: &[f32], m: usize, k: usize, mb: usize) -> (Vec<f32>, usize) {
    let (mut buf, off) = zeroed_aligned(m.div_ceil(mb) * k * mb);
    let data = &mut buf[off..];
    for (i, row) in w.chunks_exact(k.max(1)).enumerate().take(m) {
        let blk = &mut data[(i / mb) * k * mb..][..k * mb];
        for (c, &v) in row.iter().enumerate() {
            blk[c * mb + i % mb] = v;
        }
    }
    (buf, off)
}

/// `n` zeros from a 64-byte boundary: `(buffer, offset)`, the values at `buffer[offset..]`
/// (up to 15 values before them). A zmm load of a packed row then reads one cache line, not
/// two: on an Intel Xeon (Ice Lake) VM the 1×1 convs' packed tiles ran 9-13% faster so
/// (bench/NOTES.md §48).
fn zeroed_aligned(n: usize) -> (Vec<f32>, usize) {
    let mut b = vec![0f32; n + 15];
    let off = b.as_ptr().align_offset(64).min(15);
    b.truncate(off + n);
    (b, off)
}

/// True when RLX_CPU_MK_IM is not `0` (read once per process): convs larger than 1×1
/// with packed weights read their input in place instead of through im2col.
pub(super) fn im_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_MK_IM"))
}
