//! The channel-block depthwise path: blocks of 16 (AVX-512) or 8 (AVX2) channels of one
//! image transposed into the lanes of a register, for small planes; and the same sums on
//! a 1×1 conv's tiles, whose stripe already holds each position's channels in lanes
//! ([`cblock_stripe`], for [`super::super::pw_dw`](fn@super::super::pw_dw)).

use super::flat::keyed_zeros;
use crate::kernels::conv::common::{Clamp, Epilogue, Geo};
use crate::kernels::simd::{Avx2, Avx512, Lanes};
use std::sync::atomic::Ordering;

/// Geometry of the channel-block path ([`run_cblock`]).
pub(crate) struct CBlock {
    /// Input plane `h × w`, output plane `oh × ow`, stride `s` (both axes).
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    /// Row pitch of the padded scratch plane (in positions of 16 channels).
    pw: usize,
    /// Positions of the padded scratch plane.
    len: usize,
    /// Per input position: its position in the padded scratch plane.
    din: Vec<u32>,
    /// Per output position (padded to a multiple of 16 with position 0's): the scratch
    /// position of its window's top-left tap.
    dout: Vec<u32>,
    /// Kernel size (both axes) and the left and top pads (the scratch's key).
    k: usize,
    pads: (usize, usize),
}

/// Where a block's input planes come from ([`cblock_lanes`]).
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    /// The block's `nc` planes of `h × w` (NCHW), transposed into the scratch.
    Planes(&'a [f32]),
    /// A stripe `[position][stride]` of a 1×1 conv's tiles ([`super::super::packed`]):
    /// position `i`'s `nc` channels at `i·stride`, copied into the scratch as they are.
    Stripe(*const f32, usize),
}

/// Largest output plane the channel-block path takes (larger planes use their lanes
/// fully on the per-position paths, and the transposes then cost more than they save).
const CBLOCK_MAX_PLANE: usize = 1024;

thread_local! {
    /// The channel-block path's scratch plane, and the geometry whose padding it holds
    /// as zeros (blocks of the same geometry write the same positions, so the padding
    /// stays zero from one block and call to the next).
    static CBLK: std::cell::RefCell<([usize; 7], Vec<f32>)> =
        const { std::cell::RefCell::new(([0; 7], Vec::new())) };
}

/// `RLX_CPU_DW_CBLOCK` (read once per process): the channel-block path is on unless it
/// is off.
pub(crate) fn cblock_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_DW_CBLOCK"))
}

/// The channel-block path's geometry for `g`, or `None` where it does not apply (kernel
/// other than 3×3, 5×5, 7×7; dilation; stride other than 1 or 2 on both axes; an output
/// plane over [`CBLOCK_MAX_PLANE`]; for the 16-lane kernel, a 3×3 kernel on a plane
/// wider than 8 outputs). `lanes`: channels per block, 16 ([`cblock`]) or 8
/// ([`cblock8`]).
pub(crate) fn cblock_plan(g: &Geo, lanes: usize) -> Option<CBlock> {
    plan_for(g, lanes, false)
}

/// [`cblock_plan`] for [`cblock_stripe`] (16 lanes): its input is a 1×1 conv's stripe,
/// copied into the scratch with no transpose, so 3×3 stride-1 kernels are taken on planes
/// of any width up to the bound (stride 2 keeps the 8-output bound: not measured).
/// MobileNetV2's 1×1 + 3×3 pairs at 14² (384 and 576 channels) ran about 20 µs faster
/// each than the two convs apart (one-pair models, 1 and 2 threads), the model 1-2%
/// (bench/NOTES.md §45).
pub(crate) fn cblock_plan_stripe(g: &Geo) -> Option<CBlock> {
    plan_for(g, 16, true)
}

/// [`cblock_plan`]; `stripe`: the input comes without the transpose in (3×3 stride 1 at
/// any width).
fn plan_for(g: &Geo, lanes: usize, stripe: bool) -> Option<CBlock> {
    let k = g.ks[0];
    let s = g.strides[0];
    if g.ks[1] != k
        || !matches!(k, 3 | 5 | 7)
        || g.strides[1] != s
        || !(s == 1 || s == 2)
        || g.dil.iter().any(|&d| d != 1)
    {
        return None;
    }
    let (h, w, oh, ow) = (g.sp[0], g.sp[1], g.osp[0], g.osp[1]);
    if h == 0 || w == 0 || oh == 0 || ow == 0 || oh * ow > CBLOCK_MAX_PLANE {
        return None;
    }
    // Where it wins (one-node models, bench/NOTES.md §22): 5×5 and 7×7 kernels up to
    // 32² outputs; 3×3 only on planes at most 8 outputs wide, whose rows leave half the
    // lanes of the per-row paths idle. 3×3 convs with 14 output columns ran 5–25%
    // slower here at stride 2 (28² → 14²), and at stride 1 gained at 1 thread but lost
    // at 2: the transposes, per input position, are not paid back by 9 taps. On AVX2
    // (8 lanes, Zen 2) 3×3 gained at every plane up to the bound, 1 and 2 threads
    // (576 ch at 14²: 0.23 → 0.15 ms; 240 ch 3×3/2 at 28²: 0.155 → 0.088 ms; §23).
    // From a stripe there is no transpose in (`cblock_plan_stripe`).
    if k == 3 && ow > 8 && lanes == 16 && !(stripe && s == 1) {
        return None;
    }
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    // Rows and columns every window reads, and every input row and column.
    let ph = ((oh - 1) * s + k).max(h + pt);
    let pw = ((ow - 1) * s + k).max(w + pl);
    let din = (0..h * w)
        .map(|i| ((i / w + pt) * pw + i % w + pl) as u32)
        .collect();
    let op = oh * ow;
    let dout = (0..op.next_multiple_of(16))
        .map(|i| {
            let i = if i < op { i } else { 0 };
            ((i / ow) * s * pw + (i % ow) * s) as u32
        })
        .collect();
    Some(CBlock {
        h,
        w,
        oh,
        ow,
        pw,
        len: ph * pw,
        din,
        dout,
        k,
        pads: (pt, pl),
    })
}

/// `r[j]` (j < `n`) = element `j` of the `nc` rows at `p + l·stride` (l < `nc`) in lane
/// `l`, 0 in lanes past `nc`: the rows loaded (the first `n` values of each, masked when
/// `n < S::N`) and transposed in registers. Rows of the block's input planes (positions
/// into lanes) and of its weights (taps into lanes).
///
/// # Safety
/// The CPU has `S`'s features; `p + l·stride + j` is readable for l < `nc`, j < `n`.
#[inline(always)]
unsafe fn rows_transposed<S: Lanes>(
    p: *const f32,
    stride: usize,
    nc: usize,
    n: usize,
    r: &mut [S::V; 16],
) {
    let m = S::range(0, n);
    for (l, v) in r.iter_mut().enumerate().take(S::N) {
        // SAFETY: rows l < nc, their first n values (the caller's contract).
        *v = unsafe {
            if l >= nc {
                S::splat(0.0)
            } else if n == S::N {
                S::load(p.add(l * stride))
            } else {
                S::load_m(p.add(l * stride), m)
            }
        };
    }
    // SAFETY: S's features (the caller's contract).
    unsafe { S::transpose(r) };
}

/// One block of up to `S::N` (16 or 8) channels (`nc`) of one image: input `x` ([`Src`]:
/// `nc` planes of `h × w`, or a stripe holding them by position), weights `w` (`nc`
/// filters of `K × K`), output planes `dst` (`nc` planes of `oh × ow`). The input goes
/// into `xp` (the padded plane, `S::N` channels per position, its padding zero; planes
/// transposed, a stripe's rows copied with the lanes past `nc` zero), each output position is then summed
/// with the channels in the lanes of one register (bias, then every tap in (ky, kx)
/// order, each one fused multiply-add), clamped, transposed back `S::N` positions at a
/// time and stored, `G` positions summed at a time: one accumulator per kernel column
/// (the bias in column 0's), each tap one fused multiply-add into its column's, the
/// columns added left to right. Taps in the padding add `w · (+0)`, as ONNX's zero
/// padding defines them (the per-row path skips them: the same bits but for the sign
/// of a zero result, −0 there where every term is −0); `w` must be finite. Returns the largest |y| bits before the clamp over the block's outputs
/// when `clamp.track`. Compiled into [`cblock`] (AVX-512F, 16 lanes) and [`cblock8`]
/// (AVX2 + FMA, 8 lanes).
///
/// # Safety
/// The CPU has `S`'s features, and the caller is compiled with them; a [`Src::Stripe`]
/// holds `S::N` readable values at each of its `h·w` positions.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn cblock_lanes<S: Lanes, const K: usize, const G: usize>(
    p: &CBlock,
    nc: usize,
    x: Src,
    w: &[f32],
    bias: Option<&[f32]>,
    clamp: Clamp,
    xp: &mut [f32],
    dst: &mut [f32],
) -> u32 {
    let n_l = S::N;
    let (hw, op) = (p.h * p.w, p.oh * p.ow);
    if let Src::Planes(x) = x {
        assert!(x.len() >= nc * hw);
    }
    assert!((1..=n_l).contains(&nc) && w.len() >= nc * K * K);
    assert!(dst.len() >= nc * op && xp.len() >= p.len * n_l);
    // SAFETY: the caller has S's features. Loads of `x` are masked to the block's `nc`
    // planes and each plane's `hw` positions (a stripe's: its `hw` rows, the caller's
    // contract); stores to `xp` go to positions
    // `din[i] < len`; loads from `xp` are at `dout[i] + ky·pw + kx < len` (cblock_plan:
    // the padded plane holds every window); stores to `dst` are masked to the `nc`
    // planes and the plane's `op` positions.
    unsafe {
        let chans = S::range(0, nc);
        // Weights by tap, N channels per vector (channels past `nc`: 0): N taps of the
        // block's channels at a time, one channel's per register (masked to the taps
        // left), transposed in registers.
        let mut wt = [S::splat(0.0); 49];
        let mut r = [S::splat(0.0); 16];
        for t0 in (0..K * K).step_by(n_l) {
            let nt = (K * K - t0).min(n_l);
            rows_transposed::<S>(w.as_ptr().add(t0), K * K, nc, nt, &mut r);
            wt[t0..t0 + nt].copy_from_slice(&r[..nt]);
        }
        let mut bl = [0f32; 16];
        if let Some(b) = bias {
            bl[..nc].copy_from_slice(&b[..nc]);
        }
        let bv = S::load(bl.as_ptr());
        let xq = xp.as_mut_ptr();
        match x {
            // Input planes into the padded scratch plane, N positions at a time.
            Src::Planes(x) => {
                for q0 in (0..hw).step_by(n_l) {
                    let n = (hw - q0).min(n_l);
                    rows_transposed::<S>(x.as_ptr().add(q0), hw, nc, n, &mut r);
                    // Every lane index a constant (the loop unrolled), so `r` stays in
                    // registers.
                    for (j, v) in r.iter().enumerate().take(n_l) {
                        if j < n {
                            let d = *p.din.get_unchecked(q0 + j) as usize;
                            S::store(xq.add(d * n_l), *v);
                        }
                    }
                }
            }
            // A stripe's rows are positions already: each one copied (the lanes past
            // `nc` zero, as the transposes leave them).
            Src::Stripe(sp, st) => {
                for (i, &d) in p.din.iter().enumerate() {
                    let v = if nc == n_l {
                        S::load(sp.add(i * st))
                    } else {
                        S::load_m(sp.add(i * st), chans)
                    };
                    S::store(xq.add(d as usize * n_l), v);
                }
            }
        }
        // Output positions, N at a time, in groups of `G`. The sums as the per-row and
        // flat paths make them, for the same bits: one accumulator per kernel column
        // (the bias in column 0's, -0 in the others), each tap's fused multiply-add
        // into its column's, the columns added left to right.
        let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
        let mut seen = S::splat(0.0);
        let xr = xp.as_ptr();
        let pw = p.pw;
        let mut init = [S::splat(-0.0); K];
        init[0] = bv;
        for o0 in (0..op).step_by(n_l) {
            // Groups wholly past the plane's last position are not summed: their lanes
            // of `r` keep earlier values, which the masked stores below leave out.
            for g0 in (0..n_l).step_by(G).take_while(|&g0| o0 + g0 < op) {
                let mut acc = [init; G];
                let mut base = [xr; G];
                for (g, b) in base.iter_mut().enumerate() {
                    *b = xr.add(*p.dout.get_unchecked(o0 + g0 + g) as usize * n_l);
                }
                for ky in 0..K {
                    for kx in 0..K {
                        let wv = wt[ky * K + kx];
                        let off = (ky * pw + kx) * n_l;
                        for g in 0..G {
                            acc[g][kx] = S::fma(wv, S::load(base[g].add(off)), acc[g][kx]);
                        }
                    }
                }
                for g in 0..G {
                    let mut y = acc[g][0];
                    for a in &acc[g][1..] {
                        y = S::add(y, *a);
                    }
                    r[g0 + g] = y;
                }
            }
            let n = (op - o0).min(n_l);
            for (j, v) in r.iter_mut().enumerate().take(n_l) {
                if clamp.track && j < n {
                    seen = S::max_abs_bits(seen, S::zero_off(*v, chans));
                }
                *v = S::clamp(*v, lo, hi);
                if clamp.nan_out {
                    *v = S::nan_out(*v);
                }
            }
            S::transpose(&mut r);
            let m = S::range(0, n);
            for (l, v) in r.iter().enumerate().take(nc) {
                let d = dst.as_mut_ptr().add(l * op + o0);
                if n == n_l {
                    S::store(d, *v);
                } else {
                    S::store_m(d, *v, m);
                }
            }
        }
        S::hmax_bits(seen)
    }
}

/// [`cblock_lanes`] on AVX-512F: blocks of 16 channels.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn cblock<const K: usize, const G: usize>(
    p: &CBlock,
    nc: usize,
    x: Src,
    w: &[f32],
    bias: Option<&[f32]>,
    clamp: Clamp,
    xp: &mut [f32],
    dst: &mut [f32],
) -> u32 {
    // SAFETY: AVX-512F is enabled here; the caller checked the CPU has it.
    unsafe { cblock_lanes::<Avx512, K, G>(p, nc, x, w, bias, clamp, xp, dst) }
}

/// [`cblock_lanes`] on AVX2 + FMA, for CPUs without AVX-512: blocks of 8 channels, fewer
/// positions summed at a time than the AVX-512 kernel (`G`: 16 registers).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cblock8<const K: usize, const G: usize>(
    p: &CBlock,
    nc: usize,
    x: Src,
    w: &[f32],
    bias: Option<&[f32]>,
    clamp: Clamp,
    xp: &mut [f32],
    dst: &mut [f32],
) -> u32 {
    // SAFETY: AVX2 and FMA are enabled here; the caller checked the CPU has them.
    unsafe { cblock_lanes::<Avx2, K, G>(p, nc, x, w, bias, clamp, xp, dst) }
}

/// [`cblock`] (or [`cblock8`]) for one kernel size.
type CBlockFn =
    unsafe fn(&CBlock, usize, Src, &[f32], Option<&[f32]>, Clamp, &mut [f32], &mut [f32]) -> u32;

/// The block kernel for kernel size `k` (3, 5 or 7): [`cblock`] (16 lanes) or, with
/// `avx2`, [`cblock8`]. Positions per group (`G`): 5×5 one at a time on AVX-512, its 25
/// weight vectors and 5 column accumulators in registers (with 4, 20 accumulators spilled
/// the weights: 1152 channels at 7² 136 → 113 µs, 672 at 14² 189 → 184 on Zen 4,
/// bench/NOTES.md §40); 3×3 in eights (four: no faster).
fn block_fn(avx2: bool, k: usize) -> CBlockFn {
    match (avx2, k) {
        (false, 3) => cblock::<3, 8>,
        (false, 5) => cblock::<5, 1>,
        (false, _) => cblock::<7, 4>,
        (true, 3) => cblock8::<3, 4>,
        (true, 5) => cblock8::<5, 2>,
        (true, _) => cblock8::<7, 2>,
    }
}

/// Runs `f` on block `p`'s scratch plane for `lanes` channels per position: its padding
/// zero (kept from the last block of the same geometry), from a 64-byte boundary, so that
/// each position's 16 (or 8) channels lie in one cache line (a misaligned one would split
/// loads across two lines).
fn with_block_scratch<R>(p: &CBlock, lanes: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let key = [p.h, p.w, p.pw, p.len, p.pads.0, p.pads.1, lanes];
    keyed_zeros(&CBLK, key, p.len * lanes + 15, |xp| {
        let a = xp.as_ptr().align_offset(64).min(15);
        f(&mut xp[a..a + p.len * lanes])
    })
}

/// [`cblock`] on a 1×1 conv's stripe (AVX-512, 16 lanes): the depthwise conv planned by
/// `p` ([`cblock_plan`] with 16 lanes) on `nc` ≤ 16 channels whose input, position `i`'s
/// channels, lies at `stripe + i·stride`; weights `w` (`nc` finite filters), `bias`,
/// `clamp` as [`cblock_lanes`] takes them; `dst` the `nc` output planes. Returns the
/// largest |y| bits before the clamp when `clamp.track`. The same sums in the same order
/// as [`run_cblock`] on the planes the stripe holds, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F; `stripe + i·stride` holds 16 readable values for `i < h·w`.
pub(crate) unsafe fn cblock_stripe(
    p: &CBlock,
    nc: usize,
    (stripe, stride): (*const f32, usize),
    w: &[f32],
    bias: Option<&[f32]>,
    clamp: Clamp,
    dst: &mut [f32],
) -> u32 {
    let f = block_fn(false, p.k);
    with_block_scratch(p, 16, |xp| {
        // SAFETY: the caller's contract.
        unsafe { f(p, nc, Src::Stripe(stripe, stride), w, bias, clamp, xp, dst) }
    })
}

/// The channel-block path: every output plane, by blocks of 16 channels of one image
/// ([`cblock`]; with `avx2`, blocks of 8 on AVX2 + FMA, [`cblock8`]), the blocks split
/// over threads when the multiply-adds are many. False where [`cblock_plan`] does not
/// apply (nothing is written). `w` must be finite.
pub(super) fn run_cblock(
    avx2: bool,
    x: &[f32],
    w: &[f32],
    g: &Geo,
    out: &mut [f32],
    epi: &Epilogue,
) -> bool {
    use rayon::prelude::*;
    let lanes = if avx2 { 8 } else { 16 };
    let Some(p) = cblock_plan(g, lanes) else {
        return false;
    };
    let k = g.ks[0];
    let f = block_fn(avx2, k);

    let (c, hw, op, kk) = (g.m, p.h * p.w, p.oh * p.ow, k * k);
    let Epilogue {
        bias, post, seen, ..
    } = *epi;
    let clamp = epi.in_regs();
    // The blocks: (image, first channel, channels), each with its output planes.
    let par = crate::kernels::par_worth(out.len() * kk);
    let mut blocks = Vec::with_capacity(g.n * c.div_ceil(lanes));
    let mut rest = &mut out[..g.n * c * op];
    for n in 0..g.n {
        for c0 in (0..c).step_by(lanes) {
            let nc = (c - c0).min(lanes);
            let (d, r) = rest.split_at_mut(nc * op);
            rest = r;
            blocks.push((n, c0, nc, d));
        }
    }
    let run = |(n, c0, nc, d): (usize, usize, usize, &mut [f32])| {
        let xs = Src::Planes(&x[(n * c + c0) * hw..(n * c + c0 + nc) * hw]);
        let ws = &w[c0 * kk..(c0 + nc) * kk];
        let bs = bias.map(|b| &b[c0..c0 + nc]);
        let bits = with_block_scratch(&p, lanes, |xa| {
            // SAFETY: `run_with` is reached with AVX-512F (or, with `avx2`, AVX2 and
            // FMA); the slices are the block's.
            unsafe { f(&p, nc, xs, ws, bs, clamp, xa, d) }
        });
        for plane in d.chunks_mut(op) {
            post(plane);
        }
        bits
    };
    let bits = if par && blocks.len() > 1 {
        blocks.into_par_iter().map(run).max().unwrap_or(0)
    } else {
        blocks.into_iter().map(run).max().unwrap_or(0)
    };
    if let Some(s) = seen {
        s.fetch_max(bits, Ordering::Relaxed);
    }
    true
}
