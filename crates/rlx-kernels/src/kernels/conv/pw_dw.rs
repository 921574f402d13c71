//! A pointwise conv and the depthwise conv that reads its output, interleaved so that the
//! pointwise output never goes out whole (MobileNet's and EfficientNet's expansion then
//! depthwise): the entry that checks the pair ([`pw_dw`]); on planes over 1024 pixels, bands
//! of rows that stay in L2 ([`pw_dw_bands`], AVX-512); on smaller ones, blocks of 32
//! channels whose packed tiles hand their `[position][channel]` stripe straight to the
//! channel-block depthwise kernel ([`pw_dw_blocks`], AVX-512), with none of the two
//! layout transposes the convs apart make (the 1×1 conv's tiles to NCHW, NCHW to the
//! depthwise kernel's lanes).

#[cfg(target_arch = "x86_64")]
use super::common::Epilogue;
#[cfg(target_arch = "x86_64")]
use super::common::{bias_clamp, with_col, Geo};
use super::common::{geometry, Act};
#[cfg(target_arch = "x86_64")]
use super::dw_simd::{
    best_isa, cblock_on, cblock_plan_stripe, cblock_stripe, flat_plan, plan, rows_avx512, s2_plane,
    Flat, Isa, Plan, RowsFn, S2Fn,
};
#[cfg(target_arch = "x86_64")]
use super::pack::{block_product, near_equal_tiles, MkIsa, PackedConv};
#[cfg(target_arch = "x86_64")]
use super::packed::Xs;
use super::Packed;
#[cfg(target_arch = "x86_64")]
use crate::kernels::gemm_calls::{gemm_uninit_ptr, View};
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::Avx512;
use crate::kernels::{make, out_dims, KResult};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::Ordering;

#[cfg(target_arch = "x86_64")]
/// Target bytes of one band of the pointwise output in [`pw_dw`] (all of a thread's
/// channels, a few rows): with the rows kept for later outputs, inside Zen 4's 1 MB
/// L2. MobileNetV2's first pair (16→96 at 112², then stride 2), 1 thread, per-node
/// profile, two runs each: 400–404 / 382–388 / 379–396 / 366–371 / 375–381 µs at 128 /
/// 256 / 384 / 512 / 768 KB bands (the two convs apart: 638–846).
const BAND_BYTES: usize = 512 << 10;

#[cfg(target_arch = "x86_64")]
/// The depthwise kernel of [`pw_dw_bands`]: output rows of one plane.
enum RowKernel {
    /// Stride 1, planes over 1024 pixels (where the unfused conv takes the per-row path too).
    Rows(Plan<u16>, RowsFn),
    /// Stride 2, 3×3 or 5×5 ([`s2_plane`], as the unfused conv).
    S2(Flat, S2Fn),
}

#[cfg(target_arch = "x86_64")]
/// A pointwise conv and the depthwise conv that reads its output, interleaved by bands
/// of rows (MobileNet's and EfficientNet's expansion then depthwise): per band, the
/// pointwise conv's product (gemm), bias and activation for those rows of every
/// channel, then every depthwise output row whose window rows are all computed. The
/// pointwise output lives only in a window of rows per thread (the band and the few
/// rows later outputs still read), which stays in L2: the depthwise conv reads it
/// there, and the whole tensor (4.8 MB in MobileNetV2's first block) is never written
/// out to L3 or memory.
///
/// `x`: one image `[c, h, w]`; `(wa, c)`: the pointwise weights `[m, c]`; `epi_a`: the
/// pointwise conv's epilogue as its group applies it (its `post` is called on every row
/// segment: [`super::no_post`] where the clamp replaces it). `g`: the depthwise conv (`m`
/// channels of `h × w`, finite weights `wb`); `epi_b` likewise.
/// `out` (`m·oh·ow`) receives the depthwise output.
/// Each value is computed by the same kernels, in the same order, as the two convs
/// unfused ([`super::im2col::conv_float`]'s per-row bias and clamp after gemm, [`plane`] or
/// [`s2_plane`] per output row). Channels are split over threads, each thread
/// banding its own. Returns false (nothing written) where no row kernel applies:
/// not AVX-512, other kernel sizes, dilation, small planes.
fn pw_dw_bands(
    x: &[f32],
    (wa, c): (&[f32], usize),
    epi_a: &Epilogue,
    g: &Geo,
    wb: &[f32],
    epi_b: &Epilogue,
    out: &mut [f32],
) -> KResult<bool> {
    use rayon::prelude::*;
    // The dw kernels take the largest |y| before the clamp when asked to.
    let clamp_b = epi_b.in_regs();
    let (h, w, m) = (g.sp[0], g.sp[1], g.m);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let (k, s) = (g.ks[0], g.strides[0]);
    let square = g.ks[1] == k && g.strides[1] == s && g.dil.iter().all(|&d| d == 1);
    if best_isa() != Some(Isa::Avx512) || !square || ow <= 8 || h * w <= PAIR_BLOCKS_MAX_PLANE {
        return Ok(false);
    }
    let kern = match (s, k) {
        (1, 3) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<3>),
        (1, 5) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<5>),
        (1, 7) => RowKernel::Rows(plan::<Avx512>(g), rows_avx512::<7>),
        (2, 3 | 5) => match flat_plan(g) {
            Some(f) => RowKernel::S2(f, if k == 3 { s2_plane::<3> } else { s2_plane::<5> }),
            None => return Ok(false),
        },
        _ => return Ok(false),
    };
    let (hw, op, kk) = (h * w, oh * ow, k * k);
    debug_assert!(x.len() == c * hw && out.len() == m * op);
    let pt = g.pads[0].0;
    // Output rows whose window rows are all below `r1` (all rows at the bottom).
    let ready = |r1: usize| {
        if r1 == h {
            oh
        } else if r1 + pt >= k {
            ((r1 + pt - k) / s + 1).min(oh)
        } else {
            0
        }
    };
    let nt = if crate::kernels::par_worth(m * hw) {
        rayon::current_num_threads().min(m)
    } else {
        1
    };
    let per = m.div_ceil(nt);
    let chunk = |(t, out): (usize, &mut [f32])| -> KResult<()> {
        let (m0, mc) = (t * per, out.len() / op);
        // A window of `cap` rows per channel holds the pointwise output from image row
        // `base` on: each band is computed below the rows kept, and after the depthwise
        // rows it completes, the rows later outputs still read (fewer than `k`) move to
        // the top. The window stays in this thread's L2 and is never written out whole.
        let band = (BAND_BYTES / (mc * w * 4)).max(k + s);
        let cap = band + k;
        with_col::<f32, _>(mc * cap * w, |win| -> KResult<()> {
            let (mut done, mut base) = (0, 0);
            for r0 in (0..h).step_by(band) {
                let r1 = (r0 + band).min(h);
                debug_assert!(base <= r0 && r1 - base <= cap);
                let a = View {
                    data: wa,
                    off: m0 * c,
                    rs: c,
                    cs: 1,
                };
                let b = View {
                    data: x,
                    off: r0 * w,
                    rs: hw,
                    cs: 1,
                };
                // SAFETY: rows i < mc, columns [(r0 - base)·w, (r1 - base)·w) of the
                // window's `cap·w` per channel, inside `win`.
                unsafe {
                    gemm_uninit_ptr(
                        mc,
                        (r1 - r0) * w,
                        c,
                        a,
                        b,
                        win.as_mut_ptr().add((r0 - base) * w),
                        (cap * w, 1),
                        false,
                        false,
                    )?;
                }
                for i in 0..mc {
                    let at = i * cap * w;
                    let seg = &mut win[at + (r0 - base) * w..at + (r1 - base) * w];
                    let b = epi_a.bias.map(|b| b[m0 + i]);
                    let bits = bias_clamp(seg, b, epi_a.clamp, epi_a.seen.is_some());
                    if let Some(sa) = epi_a.seen {
                        sa.fetch_max(bits, Ordering::Relaxed);
                    }
                    (epi_a.post)(seg);
                }
                let hi = ready(r1);
                for i in 0..mc {
                    if hi == done {
                        break;
                    }
                    // Image row 0 of channel i's window (outside it for base > 0: only
                    // the rows in [base, r1) are read, by the readiness rule).
                    let src = win[i * cap * w..].as_ptr().wrapping_sub(base * w);
                    let dst = &mut out[i * op..(i + 1) * op];
                    let wt = &wb[(m0 + i) * kk..(m0 + i + 1) * kk];
                    let b = epi_b.bias.map_or(0.0, |b| b[m0 + i]);
                    // SAFETY: AVX-512F checked above; output rows done..hi read image
                    // rows in [done·s − pt, hi·s − pt + k) ∩ [0, h), all in [base, r1)
                    // (`ready`, and `base` below), so inside the window; they write
                    // rows done..hi of `dst`.
                    let bits = unsafe {
                        match &kern {
                            RowKernel::Rows(p, f) => f(p, src, wt, b, clamp_b, dst, done..hi),
                            RowKernel::S2(f, k) => k(f, src, wt, b, clamp_b, dst, done..hi),
                        }
                    };
                    if let Some(sb) = epi_b.seen {
                        sb.fetch_max(bits, Ordering::Relaxed);
                    }
                    (epi_b.post)(&mut dst[done * ow..hi * ow]);
                }
                done = hi;
                // Keep the rows from the next output row's window on.
                let keep = (done * s).saturating_sub(pt).clamp(base, r1);
                if keep > base {
                    for i in 0..mc {
                        let at = i * cap * w;
                        win.copy_within(at + (keep - base) * w..at + (r1 - base) * w, at);
                    }
                    base = keep;
                }
            }
            Ok(())
        })
    };
    if nt > 1 {
        out.par_chunks_mut(per * op)
            .enumerate()
            .try_for_each(chunk)?;
    } else {
        out.chunks_mut(per * op).enumerate().try_for_each(chunk)?;
    }
    Ok(true)
}

#[cfg(target_arch = "x86_64")]
/// The pair on a small plane, by blocks of 32 channels (AVX-512): per block, the 1×1
/// conv's packed tiles ([`super::packed::tile`], the sums of [`super::packed`]'s stride-1
/// path) write the block's stripe `[position][32]` for every position of the plane; its
/// bias and activation go on there (the same arithmetic per value as `finish_rows` on the
/// NCHW rows: bias, then the clamp with the largest |y| bits, or `post`); then each half
/// of 16 channels is the channel-block depthwise kernel's input as it lies
/// ([`cblock_stripe`]), which writes the depthwise output planes. Blocks are split over
/// threads where the 1×1 conv's products are many ([`super::CONV_SPLIT_FLOPS`], as the
/// 1×1 conv alone). False (nothing written) where this does not apply: weights not
/// packed for the AVX-512 tiles, a depthwise conv [`cblock_plan_stripe`] does not take,
/// the channel-block path off. A 3×3 stride-1 conv more than 8 outputs wide runs here
/// (the stripe needs no transpose in) where alone it takes the per-row path: the same
/// values, but for the sign of a zero (the per-row path skips the padding taps, this one
/// adds `w · (+0)` for them, docs/DESIGN.md).
///
/// `x`: one image `[c, h, w]`; `ga`, `gb` the two convs; `wb` the depthwise weights
/// (finite); `out` (`m·oh·ow`) receives the depthwise output.
fn pw_dw_blocks(
    x: &[f32],
    (pk, ga, epi_a): (&PackedConv, &Geo, &Epilogue),
    (gb, wb, epi_b): (&Geo, &[f32], &Epilogue),
    out: &mut [f32],
) -> bool {
    use super::common::{with_scratch, PRODUCTS};
    use rayon::prelude::*;
    let Some(p) = blocks_plan(pk, ga, gb) else {
        return false;
    };
    let (m, k, mb, np_max) = (ga.m, pk.k, MkIsa::Avx512.mb(), MkIsa::Avx512.np_max());
    let (hw, op, kk) = (p.h * p.w, p.oh * p.ow, gb.ks[0] * gb.ks[1]);
    debug_assert!(x.len() == ga.c * hw && out.len() == m * op && mb == 32);
    let (nt, tiles) = near_equal_tiles(hw, np_max);
    let kc_max = k.clamp(1, super::packed::KC);
    let (clamp_a, clamp_b) = (epi_a.in_regs(), epi_b.in_regs());
    // The product's `X`: the input planes, or their copy in tile panels where several
    // channel blocks read it (`packed::panels`).
    let panel = super::packed::panels(m.div_ceil(mb)).then(|| {
        let mut v = crate::buffers::overwritten::<f32>(k * hw);
        super::packed::fill_panels(x, hw, k, tiles.clone(), &mut v);
        v
    });
    let (xp, xs) = match &panel {
        Some(v) => (&v[..], Xs::Panel(k)),
        None => (x, Xs::Rows(hw)),
    };
    // One block: 32 channels (fewer in the last), their output planes `d`.
    let block = |(b, d): (usize, &mut [f32])| -> (u32, u32) {
        let (m0, nc) = (b * mb, d.len() / op);
        with_scratch(&PRODUCTS, hw * mb, |stripe: &mut [f32]| {
            // The next slice of weights prefetched as `packed`'s tasks do (the next
            // block's first after the last).
            let mut ahead = (b * k + kc_max.min(k)) * mb;
            let sched = (nt, tiles.clone());
            block_product(pk, b, kc_max, sched, (&mut ahead, pk.data().len()), |s| {
                // SAFETY: AVX-512F (checked above); `xp` holds X rows k0..k0+kc of the
                // tile as `xs` says (p0 + np ≤ hw); the stripe holds hw·mb values.
                unsafe { super::packed::slice_tile(MkIsa::Avx512, &s, xp, xs, stripe) }
            });
            // SAFETY: AVX-512F (checked above); the stripe holds hw·32 values.
            let bits_a = unsafe {
                stripe_epilogue(
                    stripe,
                    nc,
                    epi_a.bias.map(|b| &b[m0..]),
                    clamp_a,
                    epi_a.clamp.is_some(),
                )
            };
            if epi_a.clamp.is_none() {
                // `post` maps each value on its own: the channels of the block only.
                if nc == mb {
                    (epi_a.post)(stripe);
                } else {
                    for row in stripe.chunks_exact_mut(mb) {
                        (epi_a.post)(&mut row[..nc]);
                    }
                }
            }
            let mut bits_b = 0;
            for h in 0..nc.div_ceil(16) {
                let (c0, n) = (m0 + 16 * h, (nc - 16 * h).min(16));
                let dst = &mut d[16 * h * op..(16 * h + n) * op];
                // SAFETY: AVX-512F; the stripe's rows hold 32 values, from 16·h 16 of them.
                let bits = unsafe {
                    cblock_stripe(
                        &p,
                        n,
                        (stripe[16 * h..].as_ptr(), mb),
                        &wb[c0 * kk..(c0 + n) * kk],
                        epi_b.bias.map(|b| &b[c0..c0 + n]),
                        clamp_b,
                        dst,
                    )
                };
                bits_b = bits_b.max(bits);
            }
            // The block's planes in one call (per-plane calls on planes this small cost
            // more than the cache they save, as `conv_post` finds).
            (epi_b.post)(d);
            (bits_a, bits_b)
        })
    };
    let threads = rayon::current_num_threads();
    let par = threads > 1 && m * hw * k >= super::CONV_SPLIT_FLOPS;
    let (bits_a, bits_b) = if par {
        out.par_chunks_mut(mb * op)
            .enumerate()
            .map(block)
            .reduce(|| (0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
    } else {
        out.chunks_mut(mb * op)
            .enumerate()
            .map(block)
            .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
    };
    if let Some(v) = panel {
        crate::buffers::give(TensorData::F32(v));
    }
    if let Some(s) = epi_a.seen {
        s.fetch_max(bits_a, Ordering::Relaxed);
    }
    if let Some(s) = epi_b.seen {
        s.fetch_max(bits_b, Ordering::Relaxed);
    }
    true
}

#[cfg(target_arch = "x86_64")]
/// The channel-block plan of the depthwise conv `gb` where [`pw_dw_blocks`] runs the pair
/// with the 1×1 conv `ga` on its packed weights `pk`: weights packed for the AVX-512
/// tiles that fit `ga`, a stride-1 1×1 conv on one image of at most
/// [`PAIR_BLOCKS_MAX_PLANE`] pixels, `gb` depthwise and taken by the channel-block kernel
/// on a stripe ([`cblock_plan_stripe`]), the channel-block path on. The one list of these
/// conditions, for the run ([`pw_dw_blocks`]) and the plan ([`pair_blocks_take`]).
fn blocks_plan(pk: &PackedConv, ga: &Geo, gb: &Geo) -> Option<super::dw_simd::CBlock> {
    let mut wd = vec![ga.m, ga.c];
    wd.extend(&ga.ks);
    let takes = pk.isa == MkIsa::Avx512
        && !pk.rows
        && super::packed::fits(pk, &wd, ga)
        && ga.n == 1
        && ga.direct()
        && ga.sp[0] * ga.sp[1] <= PAIR_BLOCKS_MAX_PLANE
        && gb.depthwise_2d()
        && best_isa() == Some(Isa::Avx512)
        && cblock_on();
    if takes {
        cblock_plan_stripe(gb)
    } else {
        None
    }
}

#[cfg(target_arch = "x86_64")]
/// The 1×1 conv's epilogue on its stripe `s` (`[position][32]`, channels `0..nc` of the
/// block; `bias` from the block's first channel): per value `y + b`, then with `clamp`
/// (`has_clamp`) `min(hi, max(lo, ·))` (a NaN kept, or made the canonical NaN with
/// `nan_out`) and, with `clamp.track`, the largest |y + b| bits returned. The same
/// arithmetic per value as `finish_rows` on the NCHW rows ([`bias_clamp`]: the sum, then
/// `maxps(lo, ·)`, `minps(hi, ·)`); without a clamp only the bias (its `post` is the
/// caller's). Lanes past `nc` are left as they are and not counted.
///
/// # Safety
/// The CPU has AVX-512F; `s.len()` is a multiple of 32.
#[target_feature(enable = "avx512f")]
unsafe fn stripe_epilogue(
    s: &mut [f32],
    nc: usize,
    bias: Option<&[f32]>,
    clamp: super::common::Clamp,
    has_clamp: bool,
) -> u32 {
    use crate::kernels::simd::{Avx512, Lanes};
    let mut bl = [-0.0f32; 32];
    if let Some(b) = bias {
        bl[..nc].copy_from_slice(&b[..nc]);
    }
    if bias.is_none() && !has_clamp {
        return 0;
    }
    // SAFETY: AVX-512F (the caller's); every load and store is inside a row of 32.
    unsafe {
        // The block's channels in each half of a row.
        let halves = [
            Avx512::range(0, nc.min(16)),
            Avx512::range(0, nc.saturating_sub(16)),
        ];
        let b = [Avx512::load(bl.as_ptr()), Avx512::load(bl.as_ptr().add(16))];
        let (lo, hi) = (Avx512::splat(clamp.lo), Avx512::splat(clamp.hi));
        let mut seen = Avx512::splat(0.0);
        for row in s.chunks_exact_mut(32) {
            for h in 0..2 {
                let at = row.as_mut_ptr().add(16 * h);
                // -0 where there is no bias: `y + -0` is `y`, bit for bit.
                let mut v = Avx512::add(Avx512::load(at), b[h]);
                if has_clamp {
                    if clamp.track {
                        seen = Avx512::max_abs_bits(seen, Avx512::zero_off(v, halves[h]));
                    }
                    v = Avx512::clamp(v, lo, hi);
                    if clamp.nan_out {
                        v = Avx512::nan_out(v);
                    }
                }
                Avx512::store(at, v);
            }
        }
        Avx512::hmax_bits(seen)
    }
}

/// The pointwise conv `a` (1×1, stride 1, no padding, one group, dilation 1; weights
/// `[M, C, 1, 1]` as the tensor `wa` or packed as `pka` ([`super::packed_weights`]), bias `ba`
/// `[M]`) on one f32 image `x` `[1, C, H, W]`, then the depthwise conv `b` (`M` groups;
/// weights `wb` `[M, 1, k, k]`, all finite, bias `bb`) on its output, interleaved so that
/// the pointwise output is never whole: on planes over 1024 pixels by bands of rows
/// ([`pw_dw_bands`], on `wa`), on smaller ones by blocks of 32 channels whose tiles feed
/// the channel-block depthwise kernel directly ([`pw_dw_blocks`], on `pka`). `act_a`,
/// `act_b`: each conv's activation and scan, as [`super::conv_post`] applies it. Returns
/// the depthwise conv's output `[1, M, OH, OW]` (`out_b`), the same bits as the two convs
/// run one after the other (the 1×1 conv on `pka` where the blocks run: its packed
/// kernel's sums; a zero's sign may differ where the blocks take a 3×3 conv the
/// depthwise kernel alone would not, see [`pw_dw_blocks`]); None, with nothing computed,
/// where neither applies (another shape, dtype or kernel; no AVX-512; the weights the
/// path needs not given).
///
/// # Errors
/// A shape that does not fit its conv (as [`super::conv`]).
#[allow(clippy::type_complexity)]
pub fn pw_dw(
    x: &Tensor,
    (wa, pka, ba, attrs_a, out_a, act_a): (
        Option<&Tensor>,
        Option<&Packed>,
        Option<&Tensor>,
        &ConvAttrs,
        &Shape,
        Act,
    ),
    (wb, bb, attrs_b, out_b, act_b): (&Tensor, Option<&Tensor>, &ConvAttrs, &Shape, Act),
) -> KResult<Option<Tensor>> {
    #[cfg(target_arch = "x86_64")]
    {
        use TensorData as D;
        let Some(wdims) = wa.map(|w| w.dims()).or(pka.map(|p| p.wdims())) else {
            return Ok(None);
        };
        let od_a = out_dims(out_a)?;
        let od_b = out_dims(out_b)?;
        let ga = geometry(x.dims(), wdims, attrs_a, &od_a)?;
        let gb = geometry(&od_a, wb.dims(), attrs_b, &od_b)?;
        let pointwise = ga.n == 1 && ga.sp.len() == 2 && ga.groups == 1 && ga.direct();
        let depthwise = gb.depthwise_2d();
        fn f32s(b: Option<&Tensor>, n: usize) -> Option<Option<&[f32]>> {
            match b.map(|b| b.data()) {
                None => Some(None),
                Some(TensorData::F32(v)) if v.len() == n => Some(Some(v.as_slice())),
                _ => None,
            }
        }
        let (D::F32(xv), D::F32(wbv), Some(bav), Some(bbv)) =
            (x.data(), wb.data(), f32s(ba, ga.m), f32s(bb, gb.m))
        else {
            return Ok(None);
        };
        if !pointwise || !depthwise || crate::kernels::wide::max_abs_bits(wbv) >= 0x7f80_0000 {
            return Ok(None);
        }
        let op = gb.osp[0] * gb.osp[1];
        let mut out = crate::buffers::overwritten::<f32>(gb.m * op);
        // Each side's `post` runs only where its clamp does not replace it.
        let epi_a = Epilogue {
            post: act_a.post_unless_clamped(),
            ..act_a.with_bias(bav)
        };
        let epi_b = Epilogue {
            post: act_b.post_unless_clamped(),
            ..act_b.with_bias(bbv)
        };
        let small = ga.sp[0] * ga.sp[1] <= PAIR_BLOCKS_MAX_PLANE;
        let ok = match (small, wa.map(|w| w.data()), pka) {
            (true, _, Some(pk)) => {
                pw_dw_blocks(xv, (pk, &ga, &epi_a), (&gb, wbv, &epi_b), &mut out)
            }
            (false, Some(D::F32(wav)), _) => {
                pw_dw_bands(xv, (wav, ga.c), &epi_a, &gb, wbv, &epi_b, &mut out)?
            }
            _ => false,
        };
        if !ok {
            crate::buffers::give(D::F32(out));
            return Ok(None);
        }
        make(od_b, D::F32(out)).map(Some)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (
            x, wa, pka, ba, attrs_a, out_a, act_a, wb, bb, attrs_b, out_b, act_b,
        );
        Ok(None)
    }
}

/// True when [`pw_dw`] runs the pair by blocks of channels ([`pw_dw_blocks`]) on `pk`, the
/// packed weights of the 1×1 conv `a` (output `out_a`), with the depthwise conv `b`
/// (weights of dims `wb`, output `out_b`): weights packed for the AVX-512 tiles, a stride-1
/// 1×1 conv on one image of at most [`PAIR_BLOCKS_MAX_PLANE`] pixels, a depthwise conv the
/// channel-block kernel takes, the channel-block path on. The executor asks once, when it
/// plans, so that a pair the blocks never take is not tried on every run; [`pw_dw`] still
/// checks the values (dtype, finite weights) each run.
pub fn pair_blocks_take(
    pk: &Packed,
    a: &ConvAttrs,
    out_a: &Shape,
    wb: &[usize],
    b: &ConvAttrs,
    out_b: &Shape,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (Some(od_a), Some(od_b)) = (out_a.static_dims(), out_b.static_dims()) else {
            return false;
        };
        let wd = pk.wdims();
        if od_a.len() != 4 || wd.len() != 4 {
            return false;
        }
        let xd = [od_a[0], wd[1], od_a[2], od_a[3]];
        let (Ok(ga), Ok(gb)) = (geometry(&xd, wd, a, &od_a), geometry(&od_a, wb, b, &od_b)) else {
            return false;
        };
        blocks_plan(pk, &ga, &gb).is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pk, a, out_a, wb, b, out_b);
        false
    }
}

/// The largest 1×1 conv output plane (pixels) whose pair [`pw_dw`] runs by blocks of
/// channels on packed weights; larger planes run by bands of rows on the weights as they
/// are. At and below it a plane's channels stay in L2 anyway (bands gain nothing), and
/// the channel-block depthwise kernel takes output planes up to the same size.
pub const PAIR_BLOCKS_MAX_PLANE: usize = 1024;
