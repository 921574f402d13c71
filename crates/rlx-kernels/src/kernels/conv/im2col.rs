//! The general conv: im2col (the input unrolled into a column matrix, a block of output
//! rows at a time) and gemm, with the bias, residual and activation applied per output
//! row as gemm leaves it. Any dtype, rank, group count, stride, dilation and padding.

use super::common::{
    inside_cols, row_epilogue, split_columns, with_col, with_scratch, Epilogue, Geo, Residual,
    SendPtr, PHASES, TASKS_PER_THREAD,
};
use super::depthwise::depthwise_2d;
use crate::kernels::gemm_calls::{
    gemm_uninit_ptr, GemmElem, LhsLevel, LhsPacking, View, GEMM_PAR_FLOPS,
};
use crate::kernels::{fill_chunks, invalid, Elem, KResult};

/// 2-D [`im2col`] of output rows `oy0..oy1` only: `col` is `[cg*KH*KW, (oy1-oy0)*OW]`. Per
/// (channel, ky, kx) row, each output row `oy` copies the valid span of input row
/// `oy*sh + ky*dh - pt` (stride `sw`, dilation `dw`) and zero-fills the rest. With a column
/// stride `sw > 1` the input rows those output rows read are first split into their `sw`
/// column phases (phase `q` holds columns `q, q + sw, …`), so every span is a contiguous
/// copy.
pub(super) fn im2col_2d<T: GemmElem>(x: &[T], g: &Geo, col: &mut [T], (oy0, oy1): (usize, usize)) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let dh = g.dil[0];
    let pt = g.pads[0].0;
    let p = (oy1 - oy0) * g.osp[1];
    if p == 0 {
        return;
    }
    let nch = col.len() / (p * kh * kw);
    // Input rows [r0, r1) are the ones these output rows read.
    let r0 = (oy0 * sh).saturating_sub(pt).min(h);
    let r1 = ((oy1 - 1) * sh + (kh - 1) * dh + 1)
        .saturating_sub(pt)
        .min(h)
        .max(r0);
    let nr = r1 - r0;
    if sw == 1 {
        return im2col_rows(x, g, col, (oy0, oy1), (r0, nr), &[]);
    }
    // Phase-split rows: row r0 + y of channel c at [(c*nr + y)*w, +w), phase q first at
    // offset q*(w/sw) + min(q, w%sw), holding ceil((w - q)/sw) columns.
    with_scratch(&PHASES, nch * nr * w, |phased: &mut [T]| {
        let rows_in = (0..nch).flat_map(|c| x[(c * h + r0) * w..(c * h + r1) * w].chunks_exact(w));
        for (row, out) in rows_in.zip(phased.chunks_exact_mut(w)) {
            split_columns(row, sw, out);
        }
        im2col_rows(x, g, col, (oy0, oy1), (r0, nr), phased)
    })
}

/// [`im2col_2d`]'s copy, from `x` (stride 1) or from `phased`, its input rows `r0..r0+nr`
/// split into column phases (stride > 1).
fn im2col_rows<T: GemmElem>(
    x: &[T],
    g: &Geo,
    col: &mut [T],
    (oy0, oy1): (usize, usize),
    (r0, nr): (usize, usize),
    phased: &[T],
) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let ow = g.osp[1];
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = (oy1 - oy0) * ow;
    let r1 = r0 + nr;
    let phase_off = |q: usize| q * (w / sw) + q.min(w % sw);
    fill_chunks(col, p, |row, dst| {
        let ch = row / (kh * kw);
        let ky = (row / kw) % kh;
        let kx = row % kw;
        let src = if sw > 1 {
            &phased[ch * nr * w..(ch + 1) * nr * w]
        } else {
            &x[(ch * h + r0) * w..(ch * h + r1) * w]
        };
        let off = kx * dw;
        let (lo, hi) = inside_cols(off, pl, sw, w, ow);
        // First valid input column, its phase and index within the phase.
        let c0 = lo * sw + off - pl.min(lo * sw + off);
        let (q, j0) = (c0 % sw, c0 / sw);
        for (oy, out_row) in (oy0..oy1).zip(dst.chunks_mut(ow)) {
            let iy = (oy * sh + ky * dh) as isize - pt as isize;
            if iy < 0 || iy as usize >= h || lo >= hi {
                out_row.fill(T::default());
                continue;
            }
            let y = iy as usize - r0;
            let srow = &src[y * w..(y + 1) * w];
            out_row[..lo].fill(T::default());
            out_row[hi..].fill(T::default());
            let s0 = phase_off(q) + j0;
            out_row[lo..hi].copy_from_slice(&srow[s0..s0 + (hi - lo)]);
        }
    });
}

/// Fill `col` ([cg*KS, P] row-major) from one group's input planes `x` ([cg, *sp]).
fn im2col<T: GemmElem>(x: &[T], g: &Geo, cg: usize, col: &mut [T]) {
    let nd = g.sp.len();
    if nd == 2 {
        return im2col_2d(x, g, col, (0, g.osp[0]));
    }
    let ksz: usize = g.ks.iter().product();
    let plane: usize = g.sp.iter().product();
    let p: usize = g.osp.iter().product();
    let last_o = g.osp[nd - 1];
    let sst = rlx_ir::strides_of(&g.sp);
    let kst = rlx_ir::strides_of(&g.ks);
    let _ = cg;
    fill_chunks(col, p, |row, dst| {
        let ch = row / ksz;
        let mut kk = row % ksz;
        let src = &x[ch * plane..(ch + 1) * plane];
        // kernel tap per axis
        let mut tap = vec![0usize; nd];
        for i in 0..nd {
            tap[i] = kk / kst[i];
            kk %= kst[i];
        }
        // input index on each axis for each output index (None outside)
        let maps: Vec<Vec<Option<usize>>> = (0..nd)
            .map(|i| {
                (0..g.osp[i])
                    .map(|o| {
                        let pos =
                            (o * g.strides[i] + tap[i] * g.dil[i]) as isize - g.pads[i].0 as isize;
                        if pos >= 0 && (pos as usize) < g.sp[i] {
                            Some(pos as usize)
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .collect();
        let lm = &maps[nd - 1];
        for (r, out_row) in dst.chunks_mut(last_o.max(1)).enumerate() {
            if last_o == 0 {
                break;
            }
            let mut rem = r;
            let mut base = Some(0usize);
            for i in (0..nd - 1).rev() {
                let o = rem % g.osp[i];
                rem /= g.osp[i];
                base = match (base, maps[i][o]) {
                    (Some(b), Some(q)) => Some(b + q * sst[i]),
                    _ => None,
                };
            }
            match base {
                None => out_row.fill(T::default()),
                Some(b) => {
                    for (d, m) in out_row.iter_mut().zip(lm) {
                        *d = match m {
                            Some(q) => src[b + q],
                            None => T::default(),
                        };
                    }
                }
            }
        }
    });
}

/// The conv `g` of input `x` and weights `w` by im2col + gemm (a 2-D depthwise conv with
/// finite weights directly, a strided 1×1 conv on its gathered pixels), with `epi` applied
/// per output row as gemm leaves it, after the residual `res` where there is one.
pub(super) fn conv_float<
    T: GemmElem + Elem + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
>(
    x: &[T],
    w: &[T],
    g: &Geo,
    epi: &Epilogue<T>,
    res: Option<Residual<T>>,
) -> KResult<Vec<T>> {
    let Epilogue {
        bias,
        clamp,
        post,
        post_bias,
        seen,
    } = *epi;
    let p: usize = g.osp.iter().product();
    // Depthwise directly only with finite weights: it skips the taps in the padding, where
    // ONNX's zero padding gives `inf · 0 = NaN` (onnxruntime does; im2col below does too).
    // (Checked last: only depthwise convs read their weights for it.)
    if g.depthwise_2d() && res.is_none() && w.iter().all(|&v| v * T::ZERO == T::ZERO) {
        let mut out = depthwise_2d(x, w, bias, g);
        if p > 0 {
            fill_chunks(&mut out, p, |_, plane| post(plane));
        }
        return Ok(out);
    }
    // A 2-D 1×1 kernel with a stride above 1 and no padding reads every s-th pixel only:
    // those are gathered once into [N, C, OH, OW] and the conv runs as a plain product on
    // them. (im2col copied the same values per row block, and gemm packed the weights
    // again for each block: ResNet's strided 1×1 shortcuts ran at 70% of the speed of
    // their stride-1 siblings.) The same products, so the same values.
    if g.sp.len() == 2 && g.ks == [1, 1] && g.pads == [(0, 0); 2] && !g.direct() {
        let (h, w_in) = (g.sp[0], g.sp[1]);
        let (oh, ow) = (g.osp[0], g.osp[1]);
        let (sh, sw) = (g.strides[0], g.strides[1]);
        let planes = g.n * g.c;
        return with_scratch(&PHASES, planes * oh * ow, |xs: &mut [T]| {
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
            conv_float(xs, w, &g1, epi, res)
        });
    }
    let cg = g.c / g.groups;
    let mg = g.m / g.groups;
    let ksz: usize = g.ks.iter().product();
    let kk = cg * ksz;
    let plane: usize = g.sp.iter().product();
    let total = g.n * g.m * p;
    if let Some(r) = res.as_ref().filter(|r| r.len() != total) {
        return invalid(format!(
            "conv: a residual of {} values for an output of {total}",
            r.len()
        ));
    }
    // A residual whose buffer the conv takes: the products accumulate onto it (gemm reads
    // each tile of it as it writes the tile). A read residual: added in the bias pass.
    let acc = matches!(res, Some(Residual::Into(_)));
    let (mut out, read): (Vec<T>, Option<&[T]>) = match res {
        Some(Residual::Into(v)) => (v, None),
        Some(Residual::Read(r)) => (crate::buffers::take(total), Some(r)),
        None => (crate::buffers::take(total), None),
    };
    if total == 0 {
        return Ok(out);
    }
    let direct = g.direct();
    // 2-D convs run in blocks of whole output rows (CONV_BLOCK_BYTES of column matrix and
    // output): the column matrix is a block, not the whole image, and bias and `post` run
    // on each block as gemm leaves it.
    let (oh, ow) = if g.sp.len() == 2 {
        (g.osp[0], g.osp[1])
    } else {
        (1, p)
    };
    let per_col = (mg + if direct { 0 } else { kk }) * std::mem::size_of::<T>();
    let mut rows = if g.sp.len() == 2 {
        (CONV_BLOCK_BYTES / per_col.max(1) / ow.max(1)).clamp(1, oh)
    } else {
        1
    };
    let threads = rayon::current_num_threads();
    let flops = g.n * g.m * p * kk;
    let images = g.n * g.groups;
    // With several threads, a 2-D conv that runs in several blocks gets blocks of near-equal
    // rows, about a multiple of the thread count of them (`rows = ceil(oh / nb)` for `nb`
    // the block count rounded up to that multiple; the rounding can leave fewer blocks and
    // a shorter last one), so that the threads get near-equal rows: 5 blocks of 22 rows and
    // one of 2 (ResNet's stem, 112 rows) left one thread 66 rows and the other 46; now 5 of
    // 19 and one of 17 (57/55). Not when a block would drop under PAR_MIN_COLS pixels (the
    // blocks stay as they were). A conv in one block stays one: gemm splits it, and a row
    // block's `post` runs per output channel.
    let nb0 = oh.div_ceil(rows);
    if threads > 1 && g.sp.len() == 2 && flops >= GEMM_PAR_FLOPS && nb0 > 1 {
        let nb = nb0.div_ceil(threads) * threads;
        let r = oh.div_ceil(nb).max(1);
        if r * ow >= PAR_MIN_COLS {
            rows = r;
        }
    }
    // A conv in one block below SPLIT_MAX_FLOPS gets blocks of rows over the threads instead
    // of gemm's own split (below GEMM_PAR_FLOPS gemm would run it on one thread; above, its
    // split lost to running on one thread for SqueezeNet's 16←128 at 55² and 32←256 at
    // 27², bench/NOTES.md §34): up to TASKS_PER_THREAD blocks per thread, each of at least
    // PAR_MIN_COLS pixels, so a thread that runs slower (another guest on its core) takes
    // fewer; a 1×1 conv whose rows would be too short for two, a range of output channels
    // per thread; a 1×1 conv with fewer inputs than outputs per position (an expand conv),
    // EXPAND_PER_THREAD ranges of output channels per thread: each task then reads the
    // whole (smaller) input and writes whole output rows, where blocks of rows had both
    // threads write parts of every output row (a cache line shared at each row's cut).
    let small = (CONV_SPLIT_FLOPS..SPLIT_MAX_FLOPS).contains(&flops);
    let mut mparts = 1;
    if threads > 1 && g.sp.len() == 2 && small && nb0 == 1 {
        let per = (oh * ow / PAR_MIN_COLS / threads).clamp(1, TASKS_PER_THREAD);
        let r = oh.div_ceil(threads * per);
        if direct && mg >= 16 && kk < mg {
            mparts = (EXPAND_PER_THREAD * threads).min(mg / 8);
        } else if r * ow >= PAR_MIN_COLS {
            rows = r;
        } else if direct && mg >= 16 {
            mparts = threads.min(mg / 8);
        }
    }
    // Output channels per part, a multiple of 8 (gemm's vector side).
    let mc = mg.div_ceil(mparts).div_ceil(8) * 8;
    let mparts = mg.div_ceil(mc);
    let nblk = oh.div_ceil(rows);
    let tasks = images * nblk * mparts;
    // Blocks in parallel (each product on one thread) when there are enough of them and
    // enough work; else blocks in order, each product free to use the pool.
    let par_blocks = threads > 1 && tasks >= threads && (flops >= GEMM_PAR_FLOPS || small);
    // `out` has `total` elements of capacity (initialized with `acc`, else length 0).
    let dst = SendPtr(out.as_mut_ptr());
    let task = |t: usize| -> KResult<()> {
        let (t, mp) = (t / mparts, t % mparts);
        let (m0, m1) = (mp * mc, ((mp + 1) * mc).min(mg));
        let (ni, gi, b) = (t / (g.groups * nblk), (t / nblk) % g.groups, t % nblk);
        let (oy0, oy1) = (b * rows, ((b + 1) * rows).min(oh));
        let (j0, pb) = (oy0 * ow, (oy1 - oy0) * ow);
        let xoff = (ni * g.c + gi * cg) * plane;
        let xs = &x[xoff..xoff + cg * plane];
        let wv = View {
            data: w,
            off: (gi * mg + m0) * kk,
            rs: kk,
            cs: 1,
        };
        let ooff = (ni * g.m + gi * mg + m0) * p + j0;
        let dst = &dst;
        // `post` per output-channel row (a block of part planes, or planes large enough to
        // be worth a call each), else once over the block's whole planes.
        let post_rows = clamp.is_none() && (pb < p || p >= POST_ROW_MIN);
        let post_block = clamp.is_none() && !post_rows;
        let run = |bview: View<T>| -> KResult<()> {
            // SAFETY: task t writes rows (ni*m + gi*mg + i)*p + [j0, j0 + pb) for i in
            // m0..m1, inside [0, total); distinct tasks write distinct (row, column) ranges.
            unsafe {
                gemm_uninit_ptr(
                    m1 - m0,
                    pb,
                    kk,
                    wv,
                    bview,
                    dst.0.add(ooff),
                    (p, 1),
                    !par_blocks,
                    acc,
                )?;
            }
            let row = |i: usize| {
                // SAFETY: this task's row segment, written just above (now initialized).
                let seg = unsafe { std::slice::from_raw_parts_mut(dst.0.add(ooff + i * p), pb) };
                let b = bias.map(|b| b[gi * mg + m0 + i]);
                // Bias and `post` in one pass over the row (no residual, no clamp).
                if let (true, None, Some(pb_f), Some(bv)) = (post_rows, read, post_bias, b) {
                    pb_f(seg, bv);
                    return;
                }
                let at = ooff + i * p;
                row_epilogue(seg, b, read.map(|r| &r[at..at + pb]), clamp, seen);
                if post_rows {
                    post(seg);
                }
            };
            // Blocks run one after another: split this block's rows over the pool.
            let nm = m1 - m0;
            let split = !par_blocks && crate::kernels::par_worth(nm * pb);
            if split {
                use rayon::prelude::*;
                (0..nm).into_par_iter().for_each(row);
            } else {
                (0..nm).for_each(row);
            }
            if post_block {
                // Whole planes: the task's rows are one run (short rows cost `post` calls).
                // SAFETY: rows ooff + [0, nm*p) are this task's, written above.
                let run = unsafe { std::slice::from_raw_parts_mut(dst.0.add(ooff), nm * p) };
                if split {
                    fill_chunks(run, 8192, |_, c| post(c));
                } else {
                    post(run);
                }
            }
            Ok(())
        };
        if direct {
            run(View {
                data: xs,
                off: j0,
                rs: p,
                cs: 1,
            })
        } else {
            with_col(kk * pb, |col: &mut [T]| {
                if g.sp.len() == 2 {
                    im2col_2d(xs, g, col, (oy0, oy1));
                } else {
                    im2col(xs, g, cg, col);
                }
                run(View {
                    data: &*col,
                    off: 0,
                    rs: pb,
                    cs: 1,
                })
            })
        }
    };
    let _pack = (!direct).then(|| LhsPacking::set(LhsLevel::Conv));
    if par_blocks {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().try_for_each(task)?;
    } else {
        (0..tasks).try_for_each(task)?;
    }
    // SAFETY: the tasks wrote every (image, group, block) range: rows (ni*m + gi*mg + i)*p
    // + [oy0*ow, oy1*ow) over all blocks tile [0, total).
    unsafe { out.set_len(total) };
    Ok(out)
}

/// Target bytes of one conv block's column matrix plus output. Smaller blocks lost more to
/// gemm's per-call setup than they gained in cache (1 thread, best of 3: efficientnet_b0
/// 10.3 / 9.0 / 8.5 / 8.5 ms at 128 KB / 512 KB / 2 MB / unblocked; resnet50 42.2 / 40.5 /
/// 40.9 ms at 512 KB / 2 MB / unblocked).
const CONV_BLOCK_BYTES: usize = 2 << 20;

/// Plane size from which a conv's `post` (an activation that is not a clamp: SiLU, GELU)
/// runs on each output channel's row right after its bias, while the row is in cache,
/// instead of over the whole block after every row's bias.
const POST_ROW_MIN: usize = 1024;

/// Fewest output pixels per row block when [`conv_float`] evens out a conv's row blocks for
/// several threads: below this, gemm's product over a block's few columns loses more than
/// the balance gains, and the conv keeps its [`CONV_BLOCK_BYTES`] blocks.
const PAR_MIN_COLS: usize = 192;

/// Fewest multiply-adds for which [`conv_float`] splits a conv in one row block over the
/// threads (below [`GEMM_PAR_FLOPS`], gemm runs its product on one thread).
pub const CONV_SPLIT_FLOPS: usize = 1 << 20;

/// Most multiply-adds for which [`conv_float`] splits a conv in one row block itself rather
/// than through gemm's split (8 × [`GEMM_PAR_FLOPS`]).
const SPLIT_MAX_FLOPS: usize = 8 * GEMM_PAR_FLOPS;

/// Ranges of output channels per thread in [`conv_float`]'s own split of a 1×1 conv with
/// `K < M` (2 threads against two row blocks: SqueezeNet's 128←16 at 27² 94-99 → 66-67
/// µs, MobileNetV2's 192←32 at 28² 105-109 → 87-88, EfficientNet-B0's 240←40 at 28²
/// 218-230 → 171-173; 4 per thread: 73-75 µs on the first, and SqueezeNet's 192←48 at
/// 13² lost; bench/NOTES.md §35).
const EXPAND_PER_THREAD: usize = 2;
