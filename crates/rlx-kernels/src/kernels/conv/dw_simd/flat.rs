//! The flat depthwise path (AVX-512, stride 1 or 2, no dilation): each input plane copied
//! once into zero-padded phase planes, every tap one unmasked load; and its stride-2
//! variant that reads the input plane directly ([`s2_plane`]).

use crate::kernels::conv::common::{Clamp, Epilogue, Geo};
use crate::kernels::simd::{Avx512, Lanes};
use std::arch::x86_64::*;
use std::sync::atomic::Ordering;

/// The flat path (AVX-512, column and row stride 1 or 2, no dilation): each input plane
/// is copied once into a zero-padded scratch buffer, as `s × s` phase planes of `r`
/// rows and `pitch` columns (phase `(py, px)` holds padded rows `py, py + s, …` and
/// columns `px, px + s, …`). Output `(oy, ox)`'s tap `(ky, kx)` is then phase
/// `(ky % s, kx % s)` at row `oy + ky / s`, column `ox + kx / s`: with the outputs
/// numbered `j = oy * pitch + ox`, every tap is one unmasked 16-lane load at `j` plus a
/// fixed offset, whatever the plane's width. The `pitch - ow` lanes per output row
/// that are not outputs are dropped by a compress before the store. Small planes (a
/// 7×7 plane is 4 vectors here, 7 masked 8-lane rows on the per-row path) and strided
/// convs (no per-row phase split) gain most. The sums are the per-row path's: one
/// accumulator per kernel column, the bias first; a tap in the padding adds `w · 0`
/// where the per-row path skips it, so the path is taken only when every weight is
/// finite (then `w · 0` adds a zero; `conv_post` sends a conv with a non-finite weight
/// to im2col, whose `inf · 0 = NaN` is ONNX's zero padding).
pub(crate) struct Flat {
    h: usize,
    w: usize,
    s: usize,
    pt: usize,
    pl: usize,
    /// Rows and columns of each phase plane.
    r: usize,
    pitch: usize,
    oh: usize,
    ow: usize,
    /// Scratch length: the phase planes, and room for the last vector's loads.
    len: usize,
    /// Offset of tap `ky * kw + kx` from `j`.
    offs: Vec<usize>,
    /// Per vector of 16 `j`s: the lanes that are outputs, the first one's index in the
    /// output plane, and the lanes it stores (the outputs, compressed to the front).
    masks: Vec<u16>,
    outs: Vec<usize>,
    stores: Vec<u16>,
    /// Input rows that land in the phase planes (`0..rows_in`).
    rows_in: usize,
    /// Per input row, the column segments [`flat_fill`] copies.
    segs: Vec<FillSeg>,
}

/// One segment of an input row: 16 input columns from `ix0` (stride 1) to offset `ca`
/// of the row's phase-plane row, or 32 (stride 2: lanes `lo`, then `hi` from `ix0 +
/// 16`) split into the even ones (to `ca`, phase `pl % 2`) and the odd ones (to `cb`,
/// the other phase). Offsets count from the row of phase `(py, 0)`; masks keep the
/// columns inside the image and the phase planes.
struct FillSeg {
    ix0: usize,
    lo: u16,
    hi: u16,
    ca: usize,
    ma: u16,
    cb: usize,
    mb: u16,
}

/// The flat path's geometry, or `None` where it does not apply.
pub(crate) fn flat_plan(g: &Geo) -> Option<Flat> {
    let s = g.strides[0];
    if g.strides[1] != s || !(s == 1 || s == 2) || g.dil.iter().any(|&d| d != 1) {
        return None;
    }
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    if oh == 0 || ow == 0 || g.sp[0] == 0 || g.sp[1] == 0 {
        return None;
    }
    let (r, pitch) = (oh + (kh - 1) / s, ow + (kw - 1) / s);
    let phase = r * pitch;
    let j = (oh - 1) * pitch + ow;
    let nch = j.div_ceil(16);
    let offs: Vec<usize> = (0..kh * kw)
        .map(|t| {
            let (ky, kx) = (t / kw, t % kw);
            ((ky % s) * s + kx % s) * phase + (ky / s) * pitch + kx / s
        })
        .collect();
    // With stride 1, larger input planes run faster on the per-row path (bench/NOTES.md
    // §13): there the copy into the padded plane costs more than the masks it saves. Over
    // 256 positions since that path runs four rows at a time (§47: MobileNetV2's
    // 192-channel 3×3 at 28², 76-83 → 58-62 µs). With stride 2 the per-row path splits
    // phases too, and this one is faster at every size measured (up to 112×112).
    if s == 1 && g.sp[0] * g.sp[1] > 256 {
        return None;
    }
    let len = (s * s * phase).max(nch * 16 + offs.iter().max()?);
    // The two scratch planes stay under 2 MB.
    if len > 1 << 18 {
        return None;
    }
    let mut masks = Vec::with_capacity(nch);
    let mut outs = Vec::with_capacity(nch);
    let mut stores = Vec::with_capacity(nch);
    let mut o = 0;
    for c in 0..nch {
        let m = (0..16)
            .filter(|l| {
                let jj = c * 16 + l;
                jj < j && jj % pitch < ow
            })
            .fold(0u16, |m, l| m | 1 << l);
        masks.push(m);
        outs.push(o);
        stores.push(first(m.count_ones() as usize));
        o += m.count_ones() as usize;
    }
    debug_assert_eq!(o, oh * ow);
    let (h, w, pt, pl) = (g.sp[0], g.sp[1], g.pads[0].0, g.pads[1].0);
    let rows_in = h.min((s * r).saturating_sub(pt));
    let mut segs = Vec::new();
    if s == 1 {
        // Columns `ix` with `pl + ix < pitch`.
        let n = w.min(pitch.saturating_sub(pl));
        for ix0 in (0..n).step_by(16) {
            let m = first(n - ix0);
            segs.push(FillSeg {
                ix0,
                lo: m,
                hi: 0,
                ca: pl + ix0,
                ma: m,
                cb: 0,
                mb: 0,
            });
        }
    } else {
        // Input column `ix` is padded column `ix + pl`: phase `(ix + pl) % 2`, column
        // `(ix + pl) / 2`. From an even `ix0`, lane `k` of the even columns goes to
        // column `(ix0 + pl) / 2 + k`, of the odd ones to `(ix0 + 1 + pl) / 2 + k`.
        for ix0 in (0..w).step_by(32) {
            let left = w - ix0;
            let (ce, co) = ((ix0 + pl) / 2, (ix0 + 1 + pl) / 2);
            let ne = left.div_ceil(2).min(pitch.saturating_sub(ce));
            let no = (left / 2).min(pitch.saturating_sub(co));
            segs.push(FillSeg {
                ix0,
                lo: first(left),
                hi: first(left.saturating_sub(16)),
                ca: (pl % 2) * phase + ce,
                ma: first(ne),
                cb: ((pl + 1) % 2) * phase + co,
                mb: first(no),
            });
        }
    }
    Some(Flat {
        h: g.sp[0],
        w: g.sp[1],
        s,
        pt: g.pads[0].0,
        pl: g.pads[1].0,
        r,
        pitch,
        oh,
        ow,
        len,
        offs,
        masks,
        outs,
        stores,
        rows_in,
        segs,
    })
}

/// Runs `f` on `len` floats of a thread's scratch buffer `cell` whose positions that `f`
/// does not write are zero: the buffer is zeroed when `key` (the geometry that decides
/// which positions are written) differs from the last call's or is too short, else
/// reused as it is. Re-entered on the same thread (a `post` that waited on rayon), `f`
/// gets fresh zeros.
pub(super) fn keyed_zeros<const N: usize, R>(
    cell: &'static std::thread::LocalKey<std::cell::RefCell<([usize; N], Vec<f32>)>>,
    key: [usize; N],
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    cell.with(|cell| match cell.try_borrow_mut() {
        Ok(mut guard) => {
            let (k, buf) = &mut *guard;
            if *k != key || buf.len() < len {
                buf.clear();
                buf.resize(len, 0.0);
                *k = key;
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

thread_local! {
    /// The flat path's scratch planes, and the geometry whose padding they hold as
    /// zeros (planes of the same geometry write the same positions, so the padding
    /// stays zero from one call to the next).
    static FLAT: std::cell::RefCell<([usize; 8], Vec<f32>)> =
        const { std::cell::RefCell::new(([0; 8], Vec::new())) };
}

/// Lanes `0..n` (all for `n ≥ 16`).
#[inline(always)]
fn first(n: usize) -> u16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// Copy input plane `x` (`h × w`) into the phase planes in `buf`, row by row with the
/// column segments of [`Flat::segs`]. The padding positions are never written (the same
/// for every plane of a geometry): they hold the zeros the buffer was created with.
#[target_feature(enable = "avx512f")]
unsafe fn flat_fill(f: &Flat, x: &[f32], buf: &mut [f32]) {
    let (s, p) = (f.s, f.pitch);
    let phase = f.r * p;
    debug_assert!(x.len() >= f.h * f.w && buf.len() >= f.len);
    let bp = buf.as_mut_ptr();
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    for iy in 0..f.rows_in {
        let prow = iy + f.pt;
        let (py, r) = (prow % s, prow / s);
        // SAFETY (all pointer arithmetic below): reads stay in row `iy` of `x` (lanes
        // past `w` are masked off); writes stay in row `r < f.r` of a phase plane
        // (columns `< p`, masked: `flat_plan`), inside `buf`.
        unsafe {
            let src = x.as_ptr().add(iy * f.w);
            let row = bp.add(py * s * phase + r * p);
            for g in &f.segs {
                let a = _mm512_maskz_loadu_ps(g.lo, src.add(g.ix0));
                if s == 1 {
                    _mm512_mask_storeu_ps(row.add(g.ca), g.ma, a);
                } else {
                    let b = _mm512_maskz_loadu_ps(g.hi, src.add(g.ix0 + 16));
                    let v = _mm512_permutex2var_ps(a, even, b);
                    _mm512_mask_storeu_ps(row.add(g.ca), g.ma, v);
                    let v = _mm512_permutex2var_ps(a, odd, b);
                    _mm512_mask_storeu_ps(row.add(g.cb), g.mb, v);
                }
            }
        }
    }
}

/// One output plane (`dst`, `oh * ow`) of a `KH × KW` kernel `wt` from the phase planes
/// in `buf` ([`flat_fill`]). Returns the largest |y| bits before the clamp over the
/// plane's outputs when `clamp.track`.
#[target_feature(enable = "avx512f")]
unsafe fn flat_plane<const KH: usize, const KW: usize>(
    f: &Flat,
    buf: &[f32],
    wt: &[f32],
    b: f32,
    clamp: Clamp,
    dst: &mut [f32],
) -> u32 {
    type S = Avx512;
    debug_assert!(buf.len() >= f.len && dst.len() == f.oh * f.ow && wt.len() == KH * KW);
    // SAFETY: AVX-512F is enabled on this function; loads are at `j0 + off <
    // nch * 16 + max(off) ≤ f.len` (flat_plan); stores write the compressed outputs
    // at `outs[c]..outs[c] + popcount(masks[c])`, inside `dst`.
    unsafe {
        let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
        let mut seen = S::splat(0.0);
        let mut wv = [[S::splat(0.0); KW]; KH];
        let mut offs = [[0usize; KW]; KH];
        for ky in 0..KH {
            for kx in 0..KW {
                wv[ky][kx] = S::splat(wt[ky * KW + kx]);
                offs[ky][kx] = f.offs[ky * KW + kx];
            }
        }
        let mut init = [S::splat(-0.0); KW];
        init[0] = S::splat(b);
        let (bp, dp) = (buf.as_ptr(), dst.as_mut_ptr());
        for (c, ((&m, &o), &st)) in f.masks.iter().zip(&f.outs).zip(&f.stores).enumerate() {
            let j0 = c * 16;
            let mut acc = init;
            for ky in 0..KH {
                for kx in 0..KW {
                    let xv = S::load(bp.add(j0 + offs[ky][kx]));
                    acc[kx] = S::fma(wv[ky][kx], xv, acc[kx]);
                }
            }
            let mut y = acc[0];
            for a in &acc[1..] {
                y = S::add(y, *a);
            }
            if clamp.track {
                seen = S::max_abs_bits(seen, _mm512_maskz_mov_ps(m, y));
            }
            let mut v = S::clamp(y, lo, hi);
            if clamp.nan_out {
                v = S::nan_out(v);
            }
            // The register form of compress (the memory form is slow on Zen 4), then a
            // store of the first popcount lanes.
            let v = _mm512_maskz_compress_ps(m, v);
            S::store_m(dp.add(o), v, st);
        }
        S::hmax_bits(seen)
    }
}

type FlatFn = unsafe fn(&Flat, &[f32], &[f32], f32, Clamp, &mut [f32]) -> u32;
/// [`s2_plane`]: a [`FlatFn`] for output rows `rows` of the plane.
pub(crate) type S2Fn =
    unsafe fn(&Flat, *const f32, &[f32], f32, Clamp, &mut [f32], std::ops::Range<usize>) -> u32;

/// [`flat_plane`] for stride 2 read straight from input plane `x` (`h × w`), without
/// the copy into phase planes: per output row and 16 outputs, each input row of the
/// window is loaded once (32 columns and the next few, masked to the image, zeros
/// outside it) and split into its even and odd columns by two permutes; tap `kx` is the
/// even (`kx` even) or odd columns shifted by `kx / 2` lanes. The same multiply-adds in
/// the same order as [`flat_plane`] (a tap outside the image adds `w · 0` there too, the
/// bias first in column 0's accumulator, the columns' sums added left to right), so the
/// same bits. The flat path's copy was where the input plane was first read: as much
/// time as the product (96 ch 112→56: 100 µs each).
///
/// # Safety
/// The CPU must have AVX-512F; `f` is a stride-2 plan of `K × K` taps, `K` 3 or 5;
/// `x + iy·w` must be readable for `w` floats for every image row `iy` in `[0, h)` that
/// output rows `rows` read (`x` is the plane's row 0, which need not itself exist: a
/// window of rows is enough).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn s2_plane<const K: usize>(
    f: &Flat,
    x: *const f32,
    wt: &[f32],
    b: f32,
    clamp: Clamp,
    dst: &mut [f32],
    rows: std::ops::Range<usize>,
) -> u32 {
    type S = Avx512;
    assert!(f.s == 2 && (K == 3 || K == 5) && rows.end <= f.oh);
    assert!(dst.len() == f.oh * f.ow && wt.len() == K * K);
    let (h, w) = (f.h as isize, f.w as isize);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // SAFETY: AVX-512F is enabled here; every load is masked to columns [0, w) of a
    // row in [0, h) that output rows `rows` read (lanes outside are not read; those
    // rows are readable: the caller's contract), every store to the `n` outputs of its
    // row inside `dst`.
    unsafe {
        let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
        let mut seen = S::splat(0.0);
        let mut wv = [[S::splat(0.0); K]; K];
        for (ky, row) in wv.iter_mut().enumerate() {
            for (kx, v) in row.iter_mut().enumerate() {
                *v = S::splat(wt[ky * K + kx]);
            }
        }
        let zero = _mm512_setzero_ps();
        // Lanes l with 0 <= c + l < w.
        let inside = |c: isize| {
            let l = _mm512_add_epi32(lane, _mm512_set1_epi32(c as i32));
            _mm512_cmpge_epi32_mask(l, _mm512_setzero_si512())
                & _mm512_cmplt_epi32_mask(l, _mm512_set1_epi32(w as i32))
        };
        // Input row `iy`'s even and odd columns from `c0` (and the next 16 of each), zeros
        // for a row outside the image.
        let taps = |iy: isize, c0: isize| {
            if iy < 0 || iy >= h {
                (zero, zero, zero, zero)
            } else {
                let row = x.wrapping_offset(iy * w);
                let ld = |c: isize| _mm512_maskz_loadu_ps(inside(c), row.wrapping_offset(c));
                let (v0, v1, v2) = (ld(c0), ld(c0 + 16), ld(c0 + 32));
                (
                    _mm512_permutex2var_ps(v0, even, v1),
                    _mm512_permutex2var_ps(v0, odd, v1),
                    _mm512_permutexvar_ps(even, v2),
                    _mm512_permutexvar_ps(odd, v2),
                )
            }
        };
        let shift = |next: __m512, cur: __m512, by: usize| {
            let (a, c) = (_mm512_castps_si512(next), _mm512_castps_si512(cur));
            _mm512_castsi512_ps(match by {
                1 => _mm512_alignr_epi32::<1>(a, c),
                _ => _mm512_alignr_epi32::<2>(a, c),
            })
        };
        // A chunk's sum, scan bits, clamp and store (a macro: see `rows::plane`).
        macro_rules! finish {
            ($acc:expr, $oy:expr, $ox0:expr, $n:expr) => {{
                let acc: [__m512; K] = $acc;
                let mut y = acc[0];
                for a in &acc[1..] {
                    y = S::add(y, *a);
                }
                let m = first($n);
                if clamp.track {
                    seen = S::max_abs_bits(seen, _mm512_maskz_mov_ps(m, y));
                }
                let mut v = S::clamp(y, lo, hi);
                if clamp.nan_out {
                    v = S::nan_out(v);
                }
                S::store_m(dst.as_mut_ptr().add($oy * f.ow + $ox0), v, m);
            }};
        }
        let mut init = [S::splat(-0.0); K];
        init[0] = S::splat(b);
        let mut oy = rows.start;
        while oy < rows.end {
            // Two output rows at once: they share input row 2·oy + 2 − pt (K + 2 rows
            // loaded and split into phases for both, not 2·K) and run twice the
            // independent chains; each output's sums in the same order as alone.
            let two = oy + 1 < rows.end;
            for ox0 in (0..f.ow).step_by(16) {
                let n = (f.ow - ox0).min(16);
                let c0 = (2 * ox0) as isize - f.pl as isize;
                let (mut a, mut bb) = (init, init);
                for r in 0..K + if two { 2 } else { 0 } {
                    let iy = (2 * oy + r) as isize - f.pt as isize;
                    let (e, o, e2, o2) = taps(iy, c0);
                    for kx in 0..K {
                        let t = match kx {
                            0 => e,
                            1 => o,
                            2 => shift(e2, e, 1),
                            3 => shift(o2, o, 1),
                            _ => shift(e2, e, 2),
                        };
                        if r < K {
                            a[kx] = S::fma(wv[r][kx], t, a[kx]);
                        }
                        if two && r >= 2 {
                            bb[kx] = S::fma(wv[r - 2][kx], t, bb[kx]);
                        }
                    }
                }
                finish!(a, oy, ox0, n);
                if two {
                    finish!(bb, oy + 1, ox0, n);
                }
            }
            oy += if two { 2 } else { 1 };
        }
        S::hmax_bits(seen)
    }
}

/// How [`flat_planes`] makes a plane: [`flat_plane`] on the plane copied into phase
/// planes, or [`s2_plane`] straight from the input plane.
#[derive(Clone, Copy)]
enum FlatKind {
    Copy(FlatFn),
    Direct(S2Fn),
}

/// Every output plane on the flat path, in groups of planes of about 4096 outputs (two
/// scratch planes per thread, `FLAT`, zeroed when the geometry changes), split over
/// threads when the multiply-adds are many: a depthwise output element costs `kh * kw` of them, so the elementwise
/// bound of [`fill_chunks`] would leave a 576-channel 7×7 layer on one thread.
fn flat_planes(
    f: &Flat,
    plane: FlatKind,
    g: &Geo,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    epi: &Epilogue,
) {
    use rayon::prelude::*;
    let (hw, op) = (f.h * f.w, f.oh * f.ow);
    let (kk, m) = (g.ks[0] * g.ks[1], g.m);
    let group = (4096 / op).max(1);
    let Epilogue {
        bias, post, seen, ..
    } = *epi;
    let clamp = epi.in_regs();
    let run = |t: usize, dst: &mut [f32]| {
        let plane = match plane {
            FlatKind::Copy(p) => p,
            FlatKind::Direct(p) => {
                let mut bits = 0;
                for (k, d) in dst.chunks_mut(op).enumerate() {
                    let i = t * group + k;
                    let c = i % m;
                    let b = bias.map_or(0.0, |b| b[c]);
                    let (xi, wt) = (&x[i * hw..(i + 1) * hw], &w[c * kk..(c + 1) * kk]);
                    // SAFETY: the caller checked AVX-512F; `p` reads the input plane
                    // and writes `d`.
                    bits = bits.max(unsafe { p(f, xi.as_ptr(), wt, b, clamp, d, 0..f.oh) });
                    post(d);
                }
                if let Some(s) = seen {
                    s.fetch_max(bits, Ordering::Relaxed);
                }
                return;
            }
        };
        // Two scratch planes: the next input plane is copied into one while the other
        // is read, so the reads do not wait on the copy's stores (which they could not
        // take forwarded: the loads are unaligned, the stores masked).
        let mut planes = |cur: &mut [f32], next: &mut [f32]| {
            let (mut cur, mut next) = (cur, next);
            let src = |k: usize| &x[(t * group + k) * hw..(t * group + k + 1) * hw];
            let planes = dst.len() / op;
            // SAFETY: the caller checked AVX-512F; `flat_fill` writes only inside its
            // buffer (`f.len` long), `plane` reads its buffer and writes `d`.
            unsafe { flat_fill(f, src(0), cur) };
            let mut bits = 0;
            for (k, d) in dst.chunks_mut(op).enumerate() {
                if k + 1 < planes {
                    unsafe { flat_fill(f, src(k + 1), next) };
                }
                let c = (t * group + k) % m;
                let b = bias.map_or(0.0, |b| b[c]);
                let wt = &w[c * kk..(c + 1) * kk];
                bits = bits.max(unsafe { plane(f, cur, wt, b, clamp, d) });
                post(d);
                std::mem::swap(&mut cur, &mut next);
            }
            if let Some(s) = seen {
                s.fetch_max(bits, Ordering::Relaxed);
            }
        };
        let key = [f.h, f.w, f.s, f.pt, f.pl, f.r, f.pitch, f.len];
        keyed_zeros(&FLAT, key, 2 * f.len, |buf| {
            let (cur, next) = buf.split_at_mut(f.len);
            planes(cur, next)
        })
    };
    if crate::kernels::par_worth(out.len() * kk) && out.len() > op * group {
        out.par_chunks_mut(op * group)
            .enumerate()
            .for_each(|(t, d)| run(t, d));
    } else {
        for (t, d) in out.chunks_mut(op * group).enumerate() {
            run(t, d);
        }
    }
}

/// The flat path for `g`, or false where it does not apply (then nothing is written).
/// `w` must be finite: a tap in the padding computes `w · 0`, which the per-row path
/// skips (the same values only with finite weights).
pub(super) fn run_flat(x: &[f32], w: &[f32], g: &Geo, out: &mut [f32], epi: &Epilogue) -> bool {
    let Some(f) = flat_plan(g) else {
        return false;
    };
    // Stride 2: straight from the input planes (`RLX_CPU_DW_S2=0`: the phase copy).
    // Read once per process (this runs per depthwise conv call).
    static DIRECT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let direct = f.s == 2 && *DIRECT.get_or_init(|| !rlx_ir::env::is_off("RLX_CPU_DW_S2"));
    let plane = match (g.ks[0], g.ks[1]) {
        (3, 3) if direct => FlatKind::Direct(s2_plane::<3>),
        (5, 5) if direct => FlatKind::Direct(s2_plane::<5>),
        (3, 3) => FlatKind::Copy(flat_plane::<3, 3>),
        (5, 5) => FlatKind::Copy(flat_plane::<5, 5>),
        (7, 7) => FlatKind::Copy(flat_plane::<7, 7>),
        _ => return false,
    };
    flat_planes(&f, plane, g, x, w, out, epi);
    true
}
