//! Direct 2-D convolution, f32 NCHW, one group, dilation 1, on AVX-512: each tile of 8
//! output channels × 48 output pixels is summed in registers from the input read where it
//! lies (after one zero-padded copy), with no im2col column matrix and no gemm packing.
//!
//! Definition (ONNX Conv): `y[m, oy, ox] = Σ_{c, ky, kx} w[m, c, ky, kx] ·
//! xp[c, oy·s + ky, ox·s + kx]`, `xp` the input with `pt`/`pl` zero rows/columns before it
//! (and zeros after). The sum runs over `k = (c·KH + ky)·KW + kx` in increasing order, each
//! term one FMA; the zero padding takes part in it as zeros, so `inf · 0 = NaN` where an
//! infinite weight meets the padding, as the definition (and im2col) gives.
//!
//! **Layout.** The padded input is split into `s × s` phase planes (`s` the stride, the same
//! on both axes), `P[py][px][c][i][j] = xp[c, i·s + py, j·s + px]`, each `hq × wq` with
//! `hq = OH + (KH−1)/s`, `wq = OW + (KW−1)/s`. Output pixel `(oy, ox)` is position
//! `q = oy·wq + ox` of a plane that is `wq` wide, and tap `(c, ky, kx)` of every position
//! is the phase plane `(ky mod s, kx mod s)` of channel `c` at `q + (ky/s)·wq + kx/s`: one
//! offset per tap for every pixel, so 16 consecutive positions are one unaligned load. The
//! `(KW−1)/s` positions past `OW` in each row are computed and dropped.

use super::common::TASKS_PER_THREAD;
use std::arch::x86_64::*;

/// One conv's geometry, for one image.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    /// Stride, both axes.
    pub s: usize,
    pub pt: usize,
    pub pl: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Dims {
    fn hq(&self) -> usize {
        self.oh + (self.kh - 1) / self.s
    }
    fn wq(&self) -> usize {
        self.ow + (self.kw - 1) / self.s
    }
    /// Elements per channel of a phase plane.
    fn cs(&self) -> usize {
        self.hq() * self.wq()
    }
    /// Zeros after the last phase plane: the last tile's 16-lane loads run up to 15
    /// positions past the last row, plus the tap's column offset.
    fn slack(&self) -> usize {
        64 + self.kw
    }
    /// Elements of the phase planes and the zeros after them.
    fn planes_len(&self) -> usize {
        self.s * self.s * self.c * self.cs() + self.slack()
    }
    /// Length of the scratch buffer [`conv`] takes: the phase planes, then one input row
    /// split into its column phases (stride > 1).
    pub fn phase_len(&self) -> usize {
        self.planes_len() + if self.s > 1 { self.w } else { 0 }
    }
}

/// Output channels per tile (one broadcast weight each) and 16-lane vectors per tile.
const MR: usize = 8;
const NV: usize = 3;
const TILE: usize = NV * 16;

/// Scratch bytes per task for its output tiles (channels × rows × `wq`), a part of L2.
const BLOCK_BYTES: usize = 256 << 10;

/// An image's output (all channels) above which each task writes its row block one
/// tile's channels (MR output planes) at a time, prefetching for writing the lines
/// [`PREFETCH_TILES`] tiles ahead, instead of all channels of a tile before the next tile.
/// Such an output is larger than a core's L2 (1 MB on AMD Zen 4) and its buffer is cold
/// when the conv starts (a stem, the first node of a run): with all 32 of a stem's planes
/// written at once, 32 streams of stores each wait for their lines (the hardware
/// prefetchers follow fewer), and MobileNetV2's 32←3 3×3/2 stem at 112² took 680 µs in
/// the model against 315 alone; groupwise, 523 (bench/NOTES.md §40). Smaller outputs
/// (ResNet's and SqueezeNet's stems, whose bands stay in L2, see `banded`) keep the
/// all-channels order: with the output in cache the groupwise order, which reads each
/// tile's inputs once per group, was 2-5% slower.
const GROUPWISE_OUT_BYTES: usize = 1 << 20;

/// See [`GROUPWISE_OUT_BYTES`].
const PREFETCH_TILES: usize = 2;

/// Fewest positions per row block when rows are split for threads (4 tiles).
const MIN_BLOCK_POS: usize = 4 * TILE;

/// True when this CPU runs the direct path (AVX-512F).
fn available() -> bool {
    crate::kernels::simd::isa_cap() == crate::kernels::simd::IsaCap::Avx512
}

thread_local! {
    /// [`conv`]'s tap offsets, kept between calls on each thread.
    static KOFF: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Images convolved by [`conv`] (see [`images`]).
static IMAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many images [`conv`] has convolved in this process.
pub(crate) fn images() -> u64 {
    IMAGES.load(std::sync::atomic::Ordering::Relaxed)
}

/// True when convs take the direct path: AVX-512F, and `RLX_CPU_DCONV` not off (read once
/// per process).
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| available() && !rlx_ir::env::is_off("RLX_CPU_DCONV"))
}

/// Fills `buf` (`d.planes_len()` elements) with the phase planes of one image `x`
/// (`[C, H, W]`), zeros in the padding and after the last plane; `tmp` (W elements at
/// stride > 1) holds each input row split into its column phases. Each padded row `yp`
/// goes to row `yp / s` of phases `(yp mod s, px)` for every `px`.
///
/// On the calling thread: split over rayon, a 2-thread run under `perf record` hung (see
/// bench/NOTES.md §17); the copy is about 10% of a stem.
fn fill_phases(x: &[f32], d: &Dims, buf: &mut [f32], tmp: &mut [f32]) {
    let (s, wq, cs) = (d.s, d.wq(), d.cs());
    buf[s * s * d.c * cs..].fill(0.0);
    // Start of column phase q in a row split into phases (q, q + s, …).
    let phase_off = |q: usize| q * (d.w / s) + q.min(d.w % s);
    for ci in 0..d.c {
        for yp in 0..d.hq() * s {
            let (py, i) = (yp % s, yp / s);
            let y = yp.wrapping_sub(d.pt);
            let src: &[f32] = match (y < d.h).then(|| &x[(ci * d.h + y) * d.w..][..d.w]) {
                Some(r) if s == 1 => r,
                Some(r) => {
                    super::common::split_columns(r, s, tmp);
                    tmp
                }
                None => &[],
            };
            for px in 0..s {
                let dst = &mut buf[((py * s + px) * d.c + ci) * cs + i * wq..][..wq];
                if src.is_empty() {
                    dst.fill(0.0);
                    continue;
                }
                // Columns j whose input column j·s + px − pl lies in [0, W).
                let j0 = d.pl.saturating_sub(px).div_ceil(s).min(wq);
                let j1 = (d.w + d.pl).saturating_sub(px).div_ceil(s).min(wq).max(j0);
                dst[..j0].fill(0.0);
                dst[j1..].fill(0.0);
                if j1 > j0 {
                    let x0 = j0 * s + px - d.pl;
                    let from = phase_off(x0 % s) + x0 / s;
                    dst[j0..j1].copy_from_slice(&src[from..from + (j1 - j0)]);
                }
            }
        }
    }
}

/// Where a tile's vector of 16 positions goes in an output plane: up to 3 runs of lanes
/// (a vector spans at most 3 rows when `wq >= 8`), each a lane mask and the plane offset
/// that lane 0 would have (lane `L` of the run goes to `off + L`).
type Stores = [(isize, u16); 3];

/// The [`Stores`] of the vector at position `q` (plane `wq` wide, `ow` valid columns),
/// leaving out positions at or past `end`.
fn stores(q: usize, end: usize, wq: usize, ow: usize) -> Stores {
    let mut r = [(0isize, 0u16); 3];
    let mut n = 0;
    let mut lane = 0;
    while lane < 16 && q + lane < end && n < 3 {
        let p = q + lane;
        let (oy, ox) = (p / wq, p % wq);
        if ox < ow {
            let len = (ow - ox).min(16 - lane).min(end - p);
            let mask = (((1u32 << len) - 1) << lane) as u16;
            r[n] = ((oy * ow + ox) as isize - lane as isize, mask);
            n += 1;
            lane += len;
        } else {
            lane += wq - ox;
        }
    }
    r
}

/// A tile's operands: the phase buffer at the tile's first position (`src`), the taps'
/// offsets from it (`koff`), the first weight row (`w`, rows `kk` apart) and bias value
/// (null: no bias), the
/// clamp, and the first output channel's plane (`dst`, planes `plane` apart).
#[derive(Clone, Copy)]
struct Tile<'a> {
    src: *const f32,
    koff: &'a [u32],
    w: *const f32,
    kk: usize,
    bias: *const f32,
    clamp: Option<(f32, f32)>,
    dst: *mut f32,
    plane: usize,
}

/// One tile: `R` output channels (weights rows `w + i·kk`, bias `bias[i]`) × `V` vectors of
/// positions from `src` (the phase buffer at the tile's first position), taps at offsets
/// `koff`, summed in registers from the bias; with `clamp`, `min(hi, max(lo, ·))` (a NaN
/// kept); stored to `dst + i·plane` by `st[j]` for vector `j`.
///
/// # Safety
/// AVX-512F; every `src + koff[k] + 16·V` and `w + (R−1)·kk + koff.len()` in bounds;
/// `bias` null or holding `R` values; every stored lane inside `dst`'s allocation.
#[target_feature(enable = "avx512f")]
unsafe fn tile<const R: usize, const V: usize>(t: &Tile, st: &[Stores; NV]) {
    let Tile {
        src,
        koff,
        w,
        kk,
        bias,
        clamp,
        dst,
        plane,
    } = *t;
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    if !bias.is_null() {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = [_mm512_set1_ps(*bias.add(i)); V];
        }
    }
    for (k, &o) in koff.iter().enumerate() {
        let p = src.add(o as usize);
        let mut v = [_mm512_setzero_ps(); V];
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm512_loadu_ps(p.add(16 * j));
        }
        for (i, a) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*w.add(i * kk + k));
            for j in 0..V {
                a[j] = _mm512_fmadd_ps(v[j], b, a[j]);
            }
        }
    }
    if let Some((lo, hi)) = clamp {
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        for a in acc.iter_mut() {
            for aj in a.iter_mut() {
                // maxps/minps return the second operand when one is NaN: a NaN stays.
                *aj = _mm512_min_ps(hi, _mm512_max_ps(lo, *aj));
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let d = dst.wrapping_add(i * plane);
        for (j, aj) in a.iter().enumerate() {
            for &(off, mask) in &st[j] {
                if mask != 0 {
                    _mm512_mask_storeu_ps(d.wrapping_offset(off), mask, *aj);
                }
            }
        }
    }
}

/// [`tile`] with the vector count picked at run time (1..=NV).
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f")]
unsafe fn tile_n<const R: usize>(v: usize, t: &Tile, st: &[Stores; NV]) {
    match v {
        3 => tile::<R, 3>(t, st),
        2 => tile::<R, 2>(t, st),
        _ => tile::<R, 1>(t, st),
    }
}

/// A raw output pointer shared by the tasks (each writes its own channel rows).
struct Out(*mut f32);
// SAFETY: tasks write disjoint element ranges through it (see `conv`).
unsafe impl Sync for Out {}

/// The conv of `n` images `x` (`[N, C, H, W]`) with weights `w` (`[M, C, KH, KW]`) and
/// optional bias `b` (`[M]`) into `out` (`[N, M, OH, OW]`), every element written; with
/// `clamp` (`(lo, hi)`), each value clamped in registers before its store. Then `epi(m,
/// seg)` on each output channel `m`'s rows of a block (`seg`, contiguous, written just
/// before), for what remains of the activation. Splits row blocks and channel ranges over
/// rayon when the pool has several threads and the work is worth it. `scratch`: a buffer of
/// `d.phase_len()` elements.
///
/// Returns false, with nothing written, when the CPU lacks AVX-512F, the output rows are
/// narrower than 8 positions with their dropped columns (`OW + (KW−1)/s < 8`), or the phase
/// buffer would need offsets past `u32`.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv(
    n: usize,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    clamp: Option<(f32, f32)>,
    d: &Dims,
    out: &mut [f32],
    scratch: &mut [f32],
    epi: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> bool {
    let kt = d.kh * d.kw;
    let kk = d.c * kt;
    let (plane_in, plane_out) = (d.c * d.h * d.w, d.m * d.oh * d.ow);
    if !available()
        || d.s == 0
        || kt == 0
        || d.wq() < 8
        || d.phase_len() > u32::MAX as usize
        || x.len() < n * plane_in
        || w.len() < d.m * kk
        || b.is_some_and(|b| b.len() < d.m)
        || out.len() < n * plane_out
        || scratch.len() < d.phase_len()
    {
        return false;
    }
    IMAGES.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    if n == 0 || d.m == 0 || d.oh == 0 || d.ow == 0 {
        return true;
    }
    let (s, wq, cs) = (d.s, d.wq(), d.cs());
    // Tap offsets, k = (c·KH + ky)·KW + kx as the weights are laid out.
    let tap = |k: usize| {
        let (c, t) = (k / kt, k % kt);
        let (ky, kx) = (t / d.kw, t % d.kw);
        let phase = (ky % s) * s + kx % s;
        ((phase * d.c + c) * cs + (ky / s) * wq + kx / s) as u32
    };
    // Kept between calls on this thread (taken out, so no borrow spans the work).
    let mut koff_buf = KOFF.with(|k| std::mem::take(&mut *k.borrow_mut()));
    koff_buf.clear();
    koff_buf.extend((0..kk).map(tap));
    let koff = &koff_buf[..];
    // Row blocks of about BLOCK_BYTES of output (all channels), then, with threads, more
    // blocks or channel ranges so that each thread gets about TASKS_PER_THREAD tasks (was
    // 2; 4 came with the packed drivers' split, measured with it, not alone).
    let mut rows = (BLOCK_BYTES / 4 / (d.m * wq).max(1)).clamp(1, d.oh);
    let mut mchunk = d.m.div_ceil(MR) * MR;
    let threads = rayon::current_num_threads();
    let work = d.m * d.oh * wq * kk;
    let par = threads > 1 && work >= crate::kernels::gemm_calls::GEMM_PAR_FLOPS;
    if par {
        // Blocks of near-equal rows, a multiple of the thread count of them (at least
        // TASKS_PER_THREAD per thread): 55 rows in blocks of 17 (17, 17, 17, 4) left one
        // thread 34 rows and the other 21. Where such blocks would be too short, channel
        // ranges instead.
        let nb =
            d.oh.div_ceil(rows)
                .max(TASKS_PER_THREAD * threads)
                .div_ceil(threads)
                * threads;
        let r = d.oh.div_ceil(nb).max(1);
        if r * wq >= MIN_BLOCK_POS {
            rows = r;
        } else {
            let nrb = d.oh.div_ceil(rows);
            let noc = (TASKS_PER_THREAD * threads)
                .div_ceil(nrb)
                .min(d.m.div_ceil(MR));
            mchunk = d.m.div_ceil(noc).div_ceil(MR) * MR;
        }
    }
    let nrb = d.oh.div_ceil(rows);
    let noc = d.m.div_ceil(mchunk);
    let plane = d.oh * d.ow;
    let groupwise = plane_out * size_of::<f32>() > GROUPWISE_OUT_BYTES;
    let (phases, tmp) = scratch.split_at_mut(d.planes_len());
    for (xi, oi) in x
        .chunks_exact(plane_in)
        .zip(out.chunks_exact_mut(plane_out))
        .take(n)
    {
        fill_phases(xi, d, phases, tmp);
        let dst = Out(oi.as_mut_ptr());
        let src = phases.as_ptr() as usize;
        let task = |t: usize| {
            let (rb, oc) = (t / noc, t % noc);
            let (oy0, oy1) = (rb * rows, ((rb + 1) * rows).min(d.oh));
            let (m0, m1) = (oc * mchunk, ((oc + 1) * mchunk).min(d.m));
            let (q0, q1) = (oy0 * wq, oy1 * wq);
            let src = src as *const f32;
            let dst = &dst;
            // Each tile's stores, computed once (the groupwise order visits a tile once
            // per channel group).
            let sts: Vec<[Stores; NV]> = (q0..q1)
                .step_by(TILE)
                .map(|q| std::array::from_fn(|j| stores(q + 16 * j, q1, wq, d.ow)))
                .collect();
            // Tiles at q of channels mlo..mhi (in tiles of MR, then single channels).
            let step = |q: usize, mlo: usize, mhi: usize| {
                let v = (q1 - q).div_ceil(16).min(NV);
                let i = (q - q0) / TILE;
                let st = sts[i];
                if groupwise {
                    // The lines this group's tile PREFETCH_TILES ahead will store (where
                    // each of its vectors' first run of lanes starts), fetched for writing.
                    for &(off, mask) in sts
                        .get(i + PREFETCH_TILES)
                        .into_iter()
                        .flatten()
                        .map(|s| &s[0])
                    {
                        if mask == 0 {
                            continue;
                        }
                        let at = off + mask.trailing_zeros() as isize;
                        for m in mlo..mhi {
                            let p = dst.0.wrapping_add(m * plane).wrapping_offset(at);
                            // SAFETY: a hint; it never faults.
                            unsafe { _mm_prefetch::<_MM_HINT_ET0>(p.cast()) };
                        }
                    }
                }
                let mut m = mlo;
                // SAFETY: AVX-512F checked above; loads stay inside the phase buffer
                // (`Dims::slack`); weight rows m..m+R of kk values and R bias values (if any) exist
                // (checked above); the stores write positions [q, q1) of channels m..m+R,
                // rows oy0..oy1: this task's alone (tasks split rows and channels).
                unsafe {
                    let mut t = Tile {
                        src: src.add(q),
                        koff,
                        w: w.as_ptr(),
                        kk,
                        bias: std::ptr::null(),
                        clamp,
                        dst: dst.0,
                        plane,
                    };
                    let at = |t: &mut Tile, m: usize| {
                        t.w = w.as_ptr().add(m * kk);
                        t.bias = b.map_or(std::ptr::null(), |b| b.as_ptr().add(m));
                        t.dst = dst.0.add(m * plane);
                    };
                    while m + MR <= mhi {
                        at(&mut t, m);
                        tile_n::<MR>(v, &t, &st);
                        m += MR;
                    }
                    while m < mhi {
                        at(&mut t, m);
                        tile_n::<1>(v, &t, &st);
                        m += 1;
                    }
                }
            };
            // Every tile of a channel group over the block before the next group when
            // groupwise, else all channels of a tile before the next tile.
            let group = if groupwise { MR } else { m1 - m0 };
            for mg in (m0..m1).step_by(group) {
                let mut q = q0;
                while q < q1 {
                    step(q, mg, (mg + group).min(m1));
                    q += TILE;
                }
            }
            for m in m0..m1 {
                // SAFETY: channel m's rows oy0..oy1, this task's alone, written above.
                let seg = unsafe {
                    std::slice::from_raw_parts_mut(
                        dst.0.add(m * plane + oy0 * d.ow),
                        (oy1 - oy0) * d.ow,
                    )
                };
                epi(m, seg);
            }
        };
        let tasks = nrb * noc;
        if par && tasks > 1 {
            use rayon::prelude::*;
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
    }
    KOFF.with(|k| *k.borrow_mut() = koff_buf);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition in f64, for one image.
    fn reference(x: &[f32], w: &[f32], d: &Dims) -> Vec<f64> {
        let mut y = vec![0f64; d.m * d.oh * d.ow];
        for m in 0..d.m {
            for oy in 0..d.oh {
                for ox in 0..d.ow {
                    let mut acc = 0f64;
                    for c in 0..d.c {
                        for ky in 0..d.kh {
                            for kx in 0..d.kw {
                                let iy = (oy * d.s + ky) as isize - d.pt as isize;
                                let ix = (ox * d.s + kx) as isize - d.pl as isize;
                                if iy < 0 || ix < 0 || iy as usize >= d.h || ix as usize >= d.w {
                                    continue;
                                }
                                let xv = x[(c * d.h + iy as usize) * d.w + ix as usize] as f64;
                                acc += w[((m * d.c + c) * d.kh + ky) * d.kw + kx] as f64 * xv;
                            }
                        }
                    }
                    y[(m * d.oh + oy) * d.ow + ox] = acc;
                }
            }
        }
        y
    }

    fn check(
        c: usize,
        h: usize,
        w: usize,
        m: usize,
        k: (usize, usize),
        s: usize,
        pads: (usize, usize, usize, usize),
    ) {
        if !available() {
            return;
        }
        let (kh, kw) = k;
        let (pt, pl, pb, pr) = pads;
        let oh = (h + pt + pb - kh) / s + 1;
        let ow = (w + pl + pr - kw) / s + 1;
        let d = Dims {
            c,
            h,
            w,
            m,
            kh,
            kw,
            s,
            pt,
            pl,
            oh,
            ow,
        };
        let mut state = 0x9e37_79b9u32;
        let mut rnd = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let x: Vec<f32> = (0..c * h * w).map(|_| rnd()).collect();
        let wt: Vec<f32> = (0..m * c * kh * kw).map(|_| rnd()).collect();
        let bias: Vec<f32> = (0..m).map(|_| rnd()).collect();
        let mut out = vec![f32::NAN; m * oh * ow];
        let mut ph = vec![f32::NAN; d.phase_len()];
        let seen = std::sync::Mutex::new(vec![0usize; m]);
        let clamp = Some((-0.25, 0.5));
        assert!(conv(
            1,
            &x,
            &wt,
            Some(&bias),
            clamp,
            &d,
            &mut out,
            &mut ph,
            &|m, seg| {
                seen.lock().unwrap()[m] += seg.len();
            }
        ));
        assert!(
            seen.into_inner().unwrap().iter().all(|&n| n == oh * ow),
            "{d:?}"
        );
        let mut r = reference(&x, &wt, &d);
        for (i, v) in r.iter_mut().enumerate() {
            *v = (*v + bias[i / (oh * ow)] as f64).clamp(-0.25, 0.5);
        }
        let scale = (c * kh * kw) as f64;
        for (i, (&a, &b)) in out.iter().zip(&r).enumerate() {
            assert!(
                (a as f64 - b).abs() <= 1e-6 * scale,
                "{d:?} at {i}: {a} against {b}"
            );
        }
    }

    #[test]
    fn matches_the_definition() {
        check(16, 13, 13, 64, (3, 3), 1, (1, 1, 1, 1));
        check(3, 30, 31, 32, (3, 3), 2, (1, 1, 1, 1));
        check(3, 29, 29, 13, (7, 7), 2, (3, 3, 3, 3));
        check(5, 9, 20, 9, (3, 5), 1, (0, 2, 1, 0));
        check(4, 19, 19, 17, (2, 2), 2, (0, 0, 1, 1));
        check(2, 5, 40, 3, (1, 3), 3, (0, 1, 0, 1));
        check(7, 6, 6, 8, (3, 3), 1, (2, 2, 2, 2));
        check(3, 8, 8, 24, (3, 3), 1, (1, 1, 1, 1));
    }

    /// Outputs above [`GROUPWISE_OUT_BYTES`] take the groupwise order (a 32←3 3×3/2 stem at
    /// 112², MobileNetV2's; 13 channels: a group of 8, then 5 single channels).
    #[test]
    fn large_outputs_match_the_definition() {
        assert!(32 * 112 * 112 * size_of::<f32>() > GROUPWISE_OUT_BYTES);
        assert!(13 * 150 * 150 * size_of::<f32>() > GROUPWISE_OUT_BYTES);
        check(3, 224, 224, 32, (3, 3), 2, (1, 1, 1, 1));
        check(3, 300, 299, 13, (3, 3), 2, (1, 1, 1, 1));
    }
}
