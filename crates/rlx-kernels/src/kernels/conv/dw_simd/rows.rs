//! The per-row depthwise path: per output row and chunk of `N` output columns, every tap
//! accumulates in registers (masked at the image's borders) and the chunk is stored once.

use crate::kernels::conv::common::{inside_cols, with_col, Clamp, Epilogue, Geo};
use crate::kernels::fill_chunks;
use crate::kernels::simd::{Avx2, Avx512, Avx512Y, Lanes};
use std::sync::atomic::Ordering;

/// Per-call geometry shared by every plane: input/output sizes, where tap `kx` reads
/// (offset from the row's phase-plane start plus `ox`), and per chunk of `N` output
/// columns the lanes each tap may read.
pub(crate) struct Plan<M> {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    dh: usize,
    pt: usize,
    /// Column stride: 1 reads the input plane, `s > 1` its `s` phase planes.
    s: usize,
    /// Row pitch of the phase planes (`w` for `s == 1`).
    pitch: usize,
    offs: Vec<isize>,
    nch: usize,
    /// `masks[c * kw + kx]`: lanes of chunk `c` whose tap `kx` is inside the image and
    /// whose column is `< ow`.
    masks: Vec<M>,
    /// Chunk `c` has every lane of every tap valid (plain loads, no masks).
    full: Vec<bool>,
    /// Lanes of the last chunk that are `< ow`.
    tail: M,
}

pub(crate) fn plan<S: Lanes>(g: &Geo) -> Plan<S::M> {
    let n = S::N;
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kw, ow) = (g.ks[1], g.osp[1]);
    let (s, dw, pl) = (g.strides[1], g.dil[1], g.pads[1].0);
    let pitch = if s == 1 {
        w
    } else {
        w.div_ceil(s).next_multiple_of(n)
    };
    let offs = (0..kw)
        .map(|kx| {
            let t = (kx * dw) as isize - pl as isize;
            let (r, q) = (t.rem_euclid(s as isize), t.div_euclid(s as isize));
            r * (h * pitch) as isize + q
        })
        .collect();
    let spans: Vec<(usize, usize)> = (0..kw)
        .map(|kx| inside_cols(kx * dw, pl, s, w, ow))
        .collect();
    let nch = ow.div_ceil(n);
    let mut masks = Vec::with_capacity(nch * kw);
    let mut full = Vec::with_capacity(nch);
    for c in 0..nch {
        let ox0 = c * n;
        let mut all = ox0 + n <= ow;
        for &(lo, hi) in &spans {
            let (a, b) = (lo.max(ox0) - ox0, hi.min(ox0 + n).max(ox0) - ox0);
            masks.push(S::range(a, b));
            all &= a == 0 && b == n;
        }
        full.push(all);
    }
    let tail = S::range(0, ow - (nch.max(1) - 1) * n);
    Plan {
        h,
        w,
        oh: g.osp[0],
        ow,
        sh: g.strides[0],
        dh: g.dil[0],
        pt: g.pads[0].0,
        s,
        pitch,
        offs,
        nch,
        masks,
        full,
        tail,
    }
}

/// Output rows `rows` of one output plane (`dst`, `oh * ow`; other rows are left alone)
/// of a `KH × KW` kernel `wt` from `src`: the input plane (`s == 1`) or its phase
/// planes. Only the input rows those output rows read are read.
#[inline(always)]
unsafe fn plane<S: Lanes, const KH: usize, const KW: usize>(
    p: &Plan<S::M>,
    src: *const f32,
    wt: &[f32],
    b: f32,
    clamp: Clamp,
    dst: &mut [f32],
    rows: std::ops::Range<usize>,
) -> u32 {
    let n = S::N;
    let (lo, hi) = (S::splat(clamp.lo), S::splat(clamp.hi));
    // With `clamp.track`: the largest |y| bits before the clamp. Lanes past the plane's
    // last column are folded in too: they hold the bias, or values of real input
    // columns, so the figure can only be larger (which costs the caller a replay, never
    // a miss).
    let mut seen = S::splat(0.0);
    // Plain loops, not `array::from_fn`: its closures are functions of their own,
    // compiled without this one's target features, so `splat` would be a call per tap.
    let mut wv = [[S::splat(0.0); KW]; KH];
    for (ky, row) in wv.iter_mut().enumerate() {
        for (kx, v) in row.iter_mut().enumerate() {
            *v = S::splat(wt[ky * KW + kx]);
        }
    }
    let offs: [isize; KW] = std::array::from_fn(|kx| p.offs[kx]);
    let bv = S::splat(b);
    let ow = p.ow;
    debug_assert_eq!(dst.len(), p.oh * ow);
    let dp = dst.as_mut_ptr();
    // Output row `oy` reads only input rows inside the image.
    let inside = |oy: usize| {
        let iy0 = (oy * p.sh) as isize - p.pt as isize;
        iy0 >= 0 && iy0 as usize + (KH - 1) * p.dh < p.h
    };
    // The sum of a chunk's accumulators, its clamp and store (row `orow`, columns from
    // `ox0`), the scan's bits taken before the clamp. A macro, not a closure: as a
    // closure it was not inlined here (bench/NOTES.md §47: 2030 µs against 167).
    macro_rules! finish {
        ($acc:expr, $orow:expr, $ox0:expr) => {{
            let acc: [S::V; KW] = $acc;
            let (orow, ox0): (*mut f32, usize) = ($orow, $ox0);
            let mut y = acc[0];
            for a in &acc[1..] {
                y = S::add(y, *a);
            }
            if clamp.track {
                seen = S::max_abs_bits(seen, y);
            }
            let mut y = S::clamp(y, lo, hi);
            if clamp.nan_out {
                y = S::nan_out(y);
            }
            if ox0 + n <= ow {
                S::store(orow.add(ox0), y);
            } else {
                S::store_m(orow.add(ox0), y, p.tail);
            }
        }};
    }
    // One accumulator per kernel column (the bias in the first, -0 elsewhere, the sum's
    // identity), added at the end: chains of KH fused multiply-adds instead of one chain
    // of KH*KW, which bound small planes (one chunk per row) on latency.
    let mut init = [S::splat(-0.0); KW];
    init[0] = bv;
    let mut oy = rows.start;
    while oy < rows.end {
        let iy0 = (oy * p.sh) as isize - p.pt as isize;
        // R output rows at once where all read only rows inside the image at stride 1:
        // their KH + R − 1 input rows are loaded once for all (R·KH·KW loads a chunk
        // become (KH + R − 1)·KW), and R times the independent chains. Each output's sums
        // run in the same order as alone. Four rows for 3×3 kernels (12 accumulators and
        // 9 weights in registers), two for larger ones.
        macro_rules! rows_at_once {
            ($r:literal) => {
                if p.sh == 1
                    && p.dh == 1
                    && oy + $r <= rows.end
                    && inside(oy)
                    && inside(oy + $r - 1)
                {
                    for c in 0..p.nch {
                        let ox0 = c * n;
                        let mut acc = [init; $r];
                        let full = p.full[c];
                        let ms: [S::M; KW] = p.masks[c * KW..][..KW].try_into().expect("KW masks");
                        for r in 0..KH + $r - 1 {
                            let rp = src
                                .wrapping_offset((iy0 + r as isize) * p.pitch as isize)
                                .wrapping_add(ox0);
                            for kx in 0..KW {
                                let at = rp.wrapping_offset(offs[kx]);
                                let xv = if full {
                                    S::load(at)
                                } else {
                                    S::load_m(at, ms[kx])
                                };
                                for (q, a) in acc.iter_mut().enumerate() {
                                    if r >= q && r - q < KH {
                                        a[kx] = if full {
                                            S::fma(wv[r - q][kx], xv, a[kx])
                                        } else {
                                            S::fma_m(wv[r - q][kx], xv, a[kx], ms[kx])
                                        };
                                    }
                                }
                            }
                        }
                        for (q, a) in acc.into_iter().enumerate() {
                            finish!(a, dp.add((oy + q) * ow), ox0);
                        }
                    }
                    oy += $r;
                    continue;
                }
            };
        }
        if KW <= 3 {
            rows_at_once!(4);
        }
        rows_at_once!(2);
        let ok: [bool; KH] = std::array::from_fn(|ky| {
            let iy = iy0 + (ky * p.dh) as isize;
            iy >= 0 && (iy as usize) < p.h
        });
        let rows: [*const f32; KH] = std::array::from_fn(|ky| {
            src.wrapping_offset((iy0 + (ky * p.dh) as isize) * p.pitch as isize)
        });
        let orow = dp.add(oy * ow);
        if ok.iter().all(|&v| v) {
            // every kernel row inside the image: fully unrolled taps, plain loads on
            // chunks whose taps are all inside, masked loads on the border chunks
            for c in 0..p.nch {
                let ox0 = c * n;
                let mut acc = init;
                if p.full[c] {
                    for ky in 0..KH {
                        let r = rows[ky].wrapping_add(ox0);
                        for kx in 0..KW {
                            let xv = S::load(r.wrapping_offset(offs[kx]));
                            acc[kx] = S::fma(wv[ky][kx], xv, acc[kx]);
                        }
                    }
                } else {
                    let ms: [S::M; KW] = p.masks[c * KW..][..KW].try_into().expect("KW masks");
                    for ky in 0..KH {
                        let r = rows[ky].wrapping_add(ox0);
                        for kx in 0..KW {
                            let xv = S::load_m(r.wrapping_offset(offs[kx]), ms[kx]);
                            acc[kx] = S::fma_m(wv[ky][kx], xv, acc[kx], ms[kx]);
                        }
                    }
                }
                finish!(acc, orow, ox0);
            }
        } else {
            // top/bottom border rows: kernel rows outside the image are skipped
            for c in 0..p.nch {
                let ox0 = c * n;
                let mut acc = init;
                let ms: [S::M; KW] = p.masks[c * KW..][..KW].try_into().expect("KW masks");
                for ky in 0..KH {
                    if !ok[ky] {
                        continue;
                    }
                    let r = rows[ky].wrapping_add(ox0);
                    for kx in 0..KW {
                        let xv = S::load_m(r.wrapping_offset(offs[kx]), ms[kx]);
                        acc[kx] = S::fma_m(wv[ky][kx], xv, acc[kx], ms[kx]);
                    }
                }
                finish!(acc, orow, ox0);
            }
        }
        oy += 1;
    }
    S::hmax_bits(seen)
}

/// Split input plane `x` (`h × w`) into its `s` column phases: `buf[r*h*pitch +
/// iy*pitch + j] = x[iy*w + j*s + r]`.
#[inline(always)]
fn phases(x: &[f32], h: usize, w: usize, s: usize, pitch: usize, buf: &mut [f32]) {
    for iy in 0..h {
        let row = &x[iy * w..(iy + 1) * w];
        if s == 2 {
            let (e, o) = buf.split_at_mut(h * pitch);
            let e = &mut e[iy * pitch..iy * pitch + w.div_ceil(2)];
            let o = &mut o[iy * pitch..iy * pitch + w / 2];
            for ((pair, de), d_o) in row.chunks_exact(2).zip(e.iter_mut()).zip(o.iter_mut()) {
                *de = pair[0];
                *d_o = pair[1];
            }
            if w % 2 == 1 {
                e[w / 2] = row[w - 1];
            }
        } else {
            for r in 0..s.min(w) {
                let d = &mut buf[r * h * pitch + iy * pitch..];
                for (j, &v) in row[r..].iter().step_by(s).enumerate() {
                    d[j] = v;
                }
            }
        }
    }
}

/// One output plane: `xs` is the input plane; with `scratch` (column stride > 1) it is
/// first split into its phase planes there.
type PlaneFn<M> =
    unsafe fn(&Plan<M>, &[f32], Option<&mut [f32]>, &[f32], f32, Clamp, &mut [f32]) -> u32;

/// Every output plane, split over threads by [`fill_chunks`] as the generic path. `f`
/// (a `#[target_feature]` function: the SIMD code is compiled inside it, not in this
/// closure) does one plane of conv `g`.
fn all_planes<M: Copy + Send + Sync>(
    p: &Plan<M>,
    f: PlaneFn<M>,
    g: &Geo,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    epi: &Epilogue,
) {
    let (h, wd) = (p.h, p.w);
    let (kk, m) = (g.ks[0] * g.ks[1], g.m);
    let Epilogue {
        bias, post, seen, ..
    } = *epi;
    let clamp = epi.in_regs();
    fill_chunks(out, p.oh * p.ow, |pi, dst| {
        let c = pi % m;
        let xs = &x[pi * h * wd..(pi + 1) * h * wd];
        let wt = &w[c * kk..(c + 1) * kk];
        let b = bias.map_or(0.0, |b| b[c]);
        if p.s == 1 {
            // SAFETY: `f` was picked for a CPU that has its features.
            let m = unsafe { f(p, xs, None, wt, b, clamp, dst) };
            if let Some(s) = seen {
                s.fetch_max(m, Ordering::Relaxed);
            }
        } else {
            // The phase planes go in the per-thread column buffer (im2col's; a
            // depthwise conv does not use it otherwise), whose old contents `f`
            // overwrites before reading.
            let m = with_col::<f32, _>(p.s * h * p.pitch, |sc| {
                // SAFETY: as above.
                unsafe { f(p, xs, Some(sc), wt, b, clamp, dst) }
            });
            if let Some(s) = seen {
                s.fetch_max(m, Ordering::Relaxed);
            }
        }
        post(dst);
    });
}

macro_rules! entry {
    ($plane:ident, $run:ident, $s:ty, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $plane<const KH: usize, const KW: usize>(
            p: &Plan<<$s as Lanes>::M>,
            xs: &[f32],
            scratch: Option<&mut [f32]>,
            wt: &[f32],
            b: f32,
            clamp: Clamp,
            dst: &mut [f32],
        ) -> u32 {
            // SAFETY (both): every lane read through `p` lies in `xs` or in the phase
            // planes (the others are masked off); the caller checked the CPU features.
            match scratch {
                None => unsafe { plane::<$s, KH, KW>(p, xs.as_ptr(), wt, b, clamp, dst, 0..p.oh) },
                Some(buf) => {
                    phases(xs, p.h, p.w, p.s, p.pitch, buf);
                    unsafe { plane::<$s, KH, KW>(p, buf.as_ptr(), wt, b, clamp, dst, 0..p.oh) }
                }
            }
        }

        pub(super) fn $run(x: &[f32], w: &[f32], g: &Geo, out: &mut [f32], epi: &Epilogue) {
            let p = plan::<$s>(g);
            let f: PlaneFn<<$s as Lanes>::M> = match (g.ks[0], g.ks[1]) {
                (3, 3) => $plane::<3, 3>,
                (5, 5) => $plane::<5, 5>,
                (7, 7) => $plane::<7, 7>,
                _ => unreachable!(),
            };
            all_planes(&p, f, g, x, w, out, epi);
        }
    };
}
entry!(plane_avx512, run_avx512, Avx512, "avx512f");
entry!(plane_avx512y, run_avx512y, Avx512Y, "avx512f,avx512vl");
entry!(plane_avx2, run_avx2, Avx2, "avx2,fma");

/// [`plane`] on 16 lanes for output rows `rows`, compiled with AVX-512F; `src` is the
/// input plane's row 0, and the rows those output rows read must be readable from it
/// (as for [`s2_plane`]).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn rows_avx512<const K: usize>(
    p: &Plan<u16>,
    src: *const f32,
    wt: &[f32],
    b: f32,
    clamp: Clamp,
    dst: &mut [f32],
    rows: std::ops::Range<usize>,
) -> u32 {
    // SAFETY: the caller checked AVX-512F; `plane` reads the rows the output rows need
    // (inside the image, masked to its columns) and writes rows `rows` of `dst`.
    unsafe { plane::<Avx512, K, K>(p, src, wt, b, clamp, dst, rows) }
}

/// [`rows_avx512`]: output rows `rows` of one plane on the per-row path.
pub(crate) type RowsFn = unsafe fn(
    &Plan<u16>,
    *const f32,
    &[f32],
    f32,
    Clamp,
    &mut [f32],
    std::ops::Range<usize>,
) -> u32;
