//! Shape kernels on any dtype: Reshape, Transpose, Broadcast, Concat, Slice, Pad, Tile.
//!
//! Slice, Pad, Tile and Broadcast share one gather: for each output axis a map from output
//! index to input index (or "fill" for constant padding).

use super::{fill_chunks, invalid, make, map_same, out_dims, strides, Elem, KResult};
use rlx_ir::{PadMode, Shape, Tensor, TensorData};

/// Longest output row (elements) that [`axis_gather`] makes by merging trailing axes.
const MERGE_MAX: usize = 1 << 14;

/// Marks an output position that takes the fill value.
const FILL: usize = usize::MAX;

/// `out[o] = src[sum_i maps[i][o_i] * stride_i]`, or `fill` where any map entry is FILL.
///
/// Trailing axes that are mapped whole and in order (`maps[i] == 0..in_dims[i]`) are taken
/// as one block of contiguous elements, so an Expand or a Slice of an outer axis copies
/// long runs instead of one short row at a time (qwen3's KV-head Expand: 512 copies of 16
/// elements before, 4 of 2048 after).
fn axis_gather<T: Copy + Default + Send + Sync + 'static>(
    src: &[T],
    in_dims: &[usize],
    maps: &[Vec<usize>],
    fill: T,
) -> Vec<T> {
    let od: rlx_ir::Dims = maps.iter().map(|m| m.len()).collect();
    let n: usize = od.iter().product();
    if od.is_empty() {
        return src.to_vec();
    }
    // `r` axes stay; the trailing ones, mapped whole and in order, form a block of `blk`.
    // Merging stops at rows of MERGE_MAX elements, so that a large tensor keeps rows to
    // split over threads.
    let mut r = od.len();
    let mut blk = 1;
    while r > 1
        && maps[r - 1].len() == in_dims[r - 1]
        && maps[r - 1].iter().enumerate().all(|(j, &m)| m == j)
        && od[r - 2] * blk * in_dims[r - 1] <= MERGE_MAX
    {
        blk *= in_dims[r - 1];
        r -= 1;
    }
    let st = strides(in_dims);
    let last = &maps[r - 1];
    let sl = st[r - 1];
    // The last kept axis' map as a run: `src[base + first*sl ..]` for its whole row (in
    // order, no padding, and its elements contiguous: stride `blk`, or one element), or
    // one block repeated (broadcast along it).
    let first = last.first().copied().unwrap_or(0);
    let contiguous = first != FILL
        && last.iter().enumerate().all(|(j, &m)| m == first + j)
        && (sl == blk || last.len() <= 1);
    let repeated = first != FILL && last.iter().all(|&m| m == first);
    let padded = maps.iter().any(|m| m.contains(&FILL));
    // Without padding every element is written below (each row is copied whole).
    let mut out = if padded {
        crate::buffers::filled(n, T::default())
    } else {
        crate::buffers::overwritten(n)
    };
    if n == 0 {
        return out;
    }
    // Each output row's source offset (FILL where an outer map pads), walked once with an
    // odometer over the outer axes.
    let row_len = od[r - 1] * blk;
    let rows = n / row_len;
    let mut bases = Vec::with_capacity(rows);
    let mut idx: rlx_ir::Dims = smallvec::smallvec![0usize; r - 1];
    for _ in 0..rows {
        let mut b = 0usize;
        for (i, &o) in idx.iter().enumerate() {
            let m = maps[i][o];
            if m == FILL {
                b = FILL;
                break;
            }
            b += m * st[i];
        }
        bases.push(b);
        for i in (0..r - 1).rev() {
            idx[i] += 1;
            if idx[i] < od[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    fill_chunks(&mut out, row_len, |row, dst| {
        let base = bases[row];
        if base == FILL {
            dst.fill(fill);
            return;
        }
        if contiguous {
            let b = base + first * sl;
            dst.copy_from_slice(&src[b..b + dst.len()]);
        } else if repeated && blk == 1 {
            dst.fill(src[base + first * sl]);
        } else if repeated {
            let b = base + first * sl;
            for d in dst.chunks_mut(blk) {
                d.copy_from_slice(&src[b..b + blk]);
            }
        } else if blk == 1 {
            for (d, &m) in dst.iter_mut().zip(last) {
                *d = if m == FILL { fill } else { src[base + m * sl] };
            }
        } else {
            for (d, &m) in dst.chunks_mut(blk).zip(last) {
                if m == FILL {
                    d.fill(fill);
                } else {
                    d.copy_from_slice(&src[base + m * sl..base + m * sl + blk]);
                }
            }
        }
    });
    out
}

/// `Op::Reshape`: same data, the node's dims.
pub(crate) fn reshape(x: &Tensor, out: &Shape) -> KResult<Tensor> {
    let od = out_dims(out)?;
    make(od, x.data().clone())
}

/// The dims and element strides of `Transpose(x, perm)` read in place from a row-major `x`
/// of dims `dims`: axis j is x's axis `perm[j]`. Errors: `perm` not a permutation of
/// `0..dims.len()`.
pub(crate) fn permuted(dims: &[usize], perm: &[usize]) -> KResult<(Vec<usize>, Vec<usize>)> {
    let r = dims.len();
    let mut seen = vec![false; r];
    if perm.len() != r
        || perm
            .iter()
            .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
    {
        return invalid(format!(
            "transpose: perm {perm:?} is not a permutation of rank {r}"
        ));
    }
    let st = strides(dims);
    Ok((
        perm.iter().map(|&p| dims[p]).collect(),
        perm.iter().map(|&p| st[p]).collect(),
    ))
}

/// `Op::Transpose`: output dim i = input dim perm[i].
pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> KResult<Tensor> {
    let (od, pst) = permuted(x.dims(), perm)?;
    let data = map_same!(x.data(), v => transpose_impl(v, &od, &pst));
    make(od, data)
}

fn transpose_impl<T: Copy + Default + Send + Sync + 'static>(
    src: &[T],
    od: &[usize],
    pst: &[usize],
) -> Vec<T> {
    let n: usize = od.iter().product();
    if od.is_empty() {
        return src.to_vec();
    }
    let mut out = crate::buffers::filled(n, T::default());
    if n == 0 {
        return out;
    }
    // Drop unit dims and merge output dims that stay adjacent in the source (the
    // attention-head perm [0, 2, 1, 3] becomes a copy of contiguous rows of head_dim).
    let (mut d, mut st): (Vec<usize>, Vec<usize>) = (vec![], vec![]);
    for (&n_i, &s_i) in od.iter().zip(pst).filter(|(&n_i, _)| n_i != 1) {
        match (d.last_mut(), st.last_mut()) {
            (Some(dl), Some(sl)) if *sl == s_i * n_i => {
                *dl *= n_i;
                *sl = s_i;
            }
            _ => {
                d.push(n_i);
                st.push(s_i);
            }
        }
    }
    if d.is_empty() {
        d.push(1);
        st.push(1);
    }
    let r = d.len();
    let (inner, sl) = (d[r - 1], st[r - 1]);
    // Blocks of whole rows: the first row's source offset is decoded once per block, the
    // next ones follow by an odometer over the outer dims. A strided inner dim (a real
    // transpose, `[k, n] -> [n, k]`) is gathered in column tiles of `TILE` across at least
    // 32 rows, so each source cache line, shared by neighbouring output rows, is read while
    // it is still in L1 (row by row, a 768-wide weight read every line once per row: 46 % of
    // a ViT-B/16 import). Every element is a copy, so the result is the same.
    const TILE: usize = 64;
    let rows_per_block = if sl == 1 {
        (8192 / inner).max(1)
    } else {
        (8192 / inner).max(32)
    };
    fill_chunks(&mut out, rows_per_block * inner, |b, dst| {
        let mut idx = vec![0usize; r - 1];
        let mut rem = b * rows_per_block;
        let mut base = 0;
        for i in (0..r - 1).rev() {
            idx[i] = rem % d[i];
            base += idx[i] * st[i];
            rem /= d[i];
        }
        let mut bases = Vec::with_capacity(dst.len() / inner);
        for _ in 0..dst.len() / inner {
            bases.push(base);
            for i in (0..r - 1).rev() {
                idx[i] += 1;
                base += st[i];
                if idx[i] < d[i] {
                    break;
                }
                base -= d[i] * st[i];
                idx[i] = 0;
            }
        }
        if sl == 1 {
            for (row, &b0) in dst.chunks_mut(inner).zip(&bases) {
                row.copy_from_slice(&src[b0..b0 + inner]);
            }
        } else {
            for jt in (0..inner).step_by(TILE) {
                let je = (jt + TILE).min(inner);
                for (row, &b0) in dst.chunks_mut(inner).zip(&bases) {
                    for (j, o) in row[jt..je].iter_mut().enumerate() {
                        *o = src[b0 + (jt + j) * sl];
                    }
                }
            }
        }
    });
    out
}

/// `Op::Broadcast` (ONNX Expand): NumPy-aligned broadcast to exactly `dims`.
pub(crate) fn broadcast(x: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let id = x.dims();
    if id.len() > dims.len() {
        return invalid(format!("broadcast: cannot broadcast {id:?} to {dims:?}"));
    }
    let off = dims.len() - id.len();
    let mut in_full = vec![1usize; dims.len()];
    in_full[off..].copy_from_slice(id);
    let mut maps = vec![];
    for (i, &d) in dims.iter().enumerate() {
        let s = in_full[i];
        if s == d {
            maps.push((0..d).collect());
        } else if s == 1 {
            maps.push(vec![0; d]);
        } else {
            return invalid(format!("broadcast: cannot broadcast {id:?} to {dims:?}"));
        }
    }
    let data = map_same!(x.data(), v => axis_gather(v, &in_full, &maps, Default::default()));
    make(dims.to_vec(), data)
}

/// `Op::Concat` along `axis`; every input has the same rank and dims off the axis.
pub(crate) fn concat(xs: &[&Tensor], axis: usize, out: &Shape) -> KResult<Tensor> {
    let od = concat_dims(xs, axis, out)?;
    let outer: usize = od[..axis].iter().product();
    let first = xs[0].data();
    let data = map_same!(first, _v => {
        let slices: Vec<&[_]> = xs.iter().map(|x| slice_like(_v, x.data())).collect();
        let blocks: Vec<usize> = xs.iter().map(|x| x.dims()[axis..].iter().product()).collect();
        concat_copy(Vec::new(), &slices, &blocks, outer, od.iter().product())
    });
    make(od, data)
}

/// The output dims of [`concat`] of `xs` along `axis`, after checking that the inputs fit
/// them (one dtype, the output's rank and dims off the axis, sizes summing to its size on
/// the axis).
fn concat_dims(xs: &[&Tensor], axis: usize, out: &Shape) -> KResult<rlx_ir::Dims> {
    let od = out_dims(out)?;
    if xs.is_empty() {
        return invalid("concat of no inputs");
    }
    let dt = xs[0].dtype();
    let r = od.len();
    if axis >= r {
        return invalid(format!("concat: axis {axis} out of range for rank {r}"));
    }
    let mut total = 0;
    for x in xs {
        let d = x.dims();
        if x.dtype() != dt || d.len() != r || (0..r).any(|i| i != axis && d[i] != od[i]) {
            return invalid(format!(
                "concat: input {}{:?} does not fit output {od:?} on axis {axis}",
                x.dtype(),
                d
            ));
        }
        total += d[axis];
    }
    if total != od[axis] {
        return invalid(format!(
            "concat: inputs sum to {total} on axis {axis}, output has {}",
            od[axis]
        ));
    }
    Ok(od)
}

/// [`concat`] of `first` and `rest` (in that order) that takes `first`'s buffer: where the
/// output is the inputs' blocks one after another (every dim before `axis` is 1: a channel
/// concat at batch 1), `first`'s values stay where they are and only `rest` is copied
/// after them (into the buffer's spare room when it has enough: the executor asks the pool
/// for it, `crate::buffers::reserve_next`). The same values as [`concat`]; other layouts
/// run [`concat`] itself. Errors as [`concat`].
pub fn concat_onto(first: Tensor, rest: &[&Tensor], axis: usize, out: &Shape) -> KResult<Tensor> {
    let mut all: Vec<&Tensor> = Vec::with_capacity(1 + rest.len());
    all.push(&first);
    all.extend_from_slice(rest);
    let od = concat_dims(&all, axis, out)?;
    if od[..axis].iter().any(|&d| d != 1) {
        return concat(&all, axis, out);
    }
    drop(all);
    let n: usize = od.iter().product();
    let blocks: Vec<usize> = rest.iter().map(|x| x.numel()).collect();
    let room = rlx_ir::with_data!(first.data(), v => v.capacity() >= n);
    let data = map_same!(first.into_data(), v => {
        let slices: Vec<&[_]> = rest.iter().map(|x| slice_like(v.as_slice(), x.data())).collect();
        concat_copy(v, &slices, &blocks, 1, n)
    });
    ONTO.with(|c| c.set((c.get().0 + 1, c.get().1 + u64::from(room))));
    make(od, data)
}

thread_local! {
    static ONTO: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// How many concats [`concat_onto`] ran on this thread extending their first input's
/// buffer, and how many of those found room in it (no reallocation); for tests.
#[doc(hidden)]
pub fn concats_onto() -> (u64, u64) {
    ONTO.with(|c| c.get())
}

/// Bytes each thread copies at least in [`concat_copy`]'s split.
const CONCAT_PIECE_BYTES: usize = 64 << 10;

/// The output of a concat: for each of `outer` rows, block `k` of every input in turn
/// (`blocks[i]` elements of `slices[i]` per row), `n` elements in all. Above
/// [`CONCAT_PIECE_BYTES`] × 2 and with several threads, the copies are split over rayon in
/// tasks of about that size (pieces of long rows, groups of short ones): a channel concat
/// of two conv outputs made by two threads (SqueezeNet's fire modules) read half its input
/// from the other core's cache on one thread (168 against 34 µs in onnxruntime at 2
/// threads, slower than at 1).
///
/// `o`: empty, or (with `outer` 1) the output's first `o.len()` elements already in place,
/// the slices then following them.
fn concat_copy<T: Copy + Send + Sync + 'static>(
    mut o: Vec<T>,
    slices: &[&[T]],
    blocks: &[usize],
    outer: usize,
    n: usize,
) -> Vec<T> {
    let pre = o.len();
    assert!(pre == 0 || outer == 1, "concat: a prefix only with one row");
    if pre == 0 {
        o = crate::buffers::take(n);
    }
    let piece = (CONCAT_PIECE_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    if n - pre < 2 * piece || rayon::current_num_threads() < 2 {
        o.reserve_exact(n - pre);
        for k in 0..outer {
            for (s, &b) in slices.iter().zip(blocks) {
                o.extend_from_slice(&s[k * b..(k + 1) * b]);
            }
        }
        return o;
    }
    o.reserve_exact(n - pre);
    // Tasks write disjoint ranges of the output (see each use).
    let dst = super::matvec::Ptr(o.as_mut_ptr());
    use rayon::prelude::*;
    let row: usize = blocks.iter().sum();
    assert_eq!(pre + row * outer, n, "concat: blocks cover the output");
    if row >= piece || pre > 0 {
        // Long rows (a channel concat at batch 1): each row's blocks cut into pieces of
        // at most `piece` elements (fewer than n / piece + outer · inputs of them).
        let mut pieces: Vec<(&[T], usize)> = Vec::new();
        let mut at = pre;
        for k in 0..outer {
            for (s, &b) in slices.iter().zip(blocks) {
                for c in s[k * b..(k + 1) * b].chunks(piece) {
                    pieces.push((c, at));
                    at += c.len();
                }
            }
        }
        pieces.par_iter().for_each(|&(src, off)| {
            // SAFETY: [off, off + src.len()) lies inside the n reserved elements, past the
            // `pre` kept ones, and no other piece writes it (offsets advance by each
            // piece's length); `src` is another tensor's, not this buffer.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.get().add(off), src.len()) };
        });
    } else {
        // Short rows (a concat on a late axis): whole rows, about `piece` elements a task.
        let per = piece.div_ceil(row.max(1));
        (0..outer.div_ceil(per)).into_par_iter().for_each(|t| {
            for k in t * per..((t + 1) * per).min(outer) {
                let mut off = k * row;
                for (s, &b) in slices.iter().zip(blocks) {
                    let src = &s[k * b..(k + 1) * b];
                    // SAFETY: row k's range [k·row, (k+1)·row) is inside the n reserved
                    // elements and written by this task alone; blocks fill it in turn.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.get().add(off), b) };
                    off += b;
                }
            }
        });
    }
    // SAFETY: every element of [pre, n) was written by exactly one task (the blocks of
    // each row tile it: checked above), and [0, pre) held values already.
    unsafe { o.set_len(n) };
    o
}

/// The slice of `d` typed like `_like` (dtypes were checked equal by the caller).
fn slice_like<'a, T: 'static>(_like: &[T], d: &'a rlx_ir::TensorData) -> &'a [T] {
    use std::any::Any;
    let any: &dyn Any = rlx_ir::with_data!(d, v => v);
    any.downcast_ref::<Vec<T>>()
        .map(|v| v.as_slice())
        .unwrap_or(&[])
}

/// `Op::Slice`: element j of axis i is input index `starts[i] + j*steps[i]`.
pub(crate) fn slice(
    x: &Tensor,
    starts: &[usize],
    steps: &[i64],
    sizes: &[usize],
) -> KResult<Tensor> {
    let id = x.dims();
    let r = id.len();
    if starts.len() != r || steps.len() != r || sizes.len() != r {
        return invalid(format!(
            "slice: starts/steps/sizes need one entry per axis of rank {r}"
        ));
    }
    let mut maps = vec![];
    for i in 0..r {
        let mut m = Vec::with_capacity(sizes[i]);
        for j in 0..sizes[i] {
            let p = starts[i] as i64 + j as i64 * steps[i];
            if steps[i] == 0 || p < 0 || p as usize >= id[i] {
                return invalid(format!(
                    "slice: axis {i} index {p} out of range 0..{} (start {}, step {}, size {})",
                    id[i], starts[i], steps[i], sizes[i]
                ));
            }
            m.push(p as usize);
        }
        maps.push(m);
    }
    let data = map_same!(x.data(), v => axis_gather(v, id, &maps, Default::default()));
    make(sizes.to_vec(), data)
}

/// `Op::Pad` with ONNX modes (constant, reflect, edge, wrap).
pub(crate) fn pad(x: &Tensor, pads: &[(usize, usize)], mode: PadMode) -> KResult<Tensor> {
    let id = x.dims();
    let r = id.len();
    if pads.len() != r {
        return invalid(format!("pad: {} pad pairs for rank {r}", pads.len()));
    }
    let mut maps = vec![];
    let mut od = vec![];
    for i in 0..r {
        let (b, e) = pads[i];
        let d = id[i] as i64;
        let n = id[i] + b + e;
        let mut m = Vec::with_capacity(n);
        for o in 0..n {
            let p = o as i64 - b as i64;
            let src = if (0..d).contains(&p) {
                p as usize
            } else if d == 0 {
                if matches!(mode, PadMode::Constant(_)) {
                    FILL
                } else {
                    return invalid(format!("pad: cannot {mode:?}-pad an empty axis {i}"));
                }
            } else {
                match mode {
                    PadMode::Constant(_) => FILL,
                    PadMode::Edge => p.clamp(0, d - 1) as usize,
                    PadMode::Wrap => p.rem_euclid(d) as usize,
                    PadMode::Reflect => {
                        if d == 1 {
                            0
                        } else {
                            let period = 2 * (d - 1);
                            let q = p.rem_euclid(period);
                            (if q < d { q } else { period - q }) as usize
                        }
                    }
                }
            };
            m.push(src);
        }
        od.push(n);
        maps.push(m);
    }
    let cv = match mode {
        PadMode::Constant(c) => c,
        _ => 0.0,
    };
    let data = match x.data() {
        // The pad value as a code of the narrow type.
        TensorData::Narrow { dtype, codes } => TensorData::narrow(
            *dtype,
            axis_gather(
                codes,
                id,
                &maps,
                rlx_ir::narrow::encode_f64(*dtype, cv, true),
            ),
        ),
        d => map_same!(d, v => axis_gather(v, id, &maps, Elem::from_f64(cv))),
    };
    make(od, data)
}

/// `Op::Tile`: output dim i = input dim i * repeats[i].
pub(crate) fn tile(x: &Tensor, repeats: &[usize]) -> KResult<Tensor> {
    let id = x.dims();
    if repeats.len() != id.len() {
        return invalid(format!(
            "tile: {} repeats for rank {}",
            repeats.len(),
            id.len()
        ));
    }
    let maps: Vec<Vec<usize>> = id
        .iter()
        .zip(repeats)
        .map(|(&d, &rp)| (0..d * rp).map(|o| o % d.max(1)).collect())
        .collect();
    let od: Vec<usize> = maps.iter().map(|m| m.len()).collect();
    let data = map_same!(x.data(), v => axis_gather(v, id, &maps, Default::default()));
    make(od, data)
}

#[cfg(test)]
mod tests {
    use super::{axis_gather, FILL};

    /// Concat on 1 and 3 threads (the 3-thread run splits the copies into pieces: outputs
    /// of 2-12 MB) against the definition, element by element: output index `[.., j, ..]`
    /// on the axis reads input `i` at `j - (sizes of inputs before i)`. Axes 0 (one block per
    /// input), 1 (SqueezeNet's channel concat) and the last (many small blocks), f32 and i64,
    /// inputs of uneven sizes so that pieces end mid-block.
    #[test]
    fn concat_matches_the_definition_on_one_and_several_threads() {
        use rlx_ir::{DType, Shape, Tensor};
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            ins: &[(Vec<usize>, Vec<T>)],
            axis: usize,
            got: &[T],
        ) {
            let mut od = ins[0].0.clone();
            od[axis] = ins.iter().map(|(d, _)| d[axis]).sum();
            let n: usize = od.iter().product();
            assert_eq!(got.len(), n);
            let ost = rlx_ir::strides_of(&od);
            for (o, g) in got.iter().enumerate() {
                let idx: Vec<usize> = (0..od.len()).map(|i| o / ost[i] % od[i]).collect();
                let (mut j, mut k) = (idx[axis], 0);
                while j >= ins[k].0[axis] {
                    j -= ins[k].0[axis];
                    k += 1;
                }
                let mut at = idx.clone();
                at[axis] = j;
                let ist = rlx_ir::strides_of(&ins[k].0);
                let off: usize = at.iter().zip(&ist).map(|(a, s)| a * s).sum();
                assert_eq!(*g, ins[k].1[off], "output {o} (index {idx:?})");
            }
        }
        let cases: [(usize, Vec<Vec<usize>>); 5] = [
            (0, vec![vec![37, 64, 55], vec![91, 64, 55], vec![5, 64, 55]]),
            (
                1,
                vec![vec![2, 64, 3025], vec![2, 128, 3025], vec![2, 7, 3025]],
            ),
            // Batch 1: `concat_onto` extends the first input's buffer.
            (
                1,
                vec![vec![1, 64, 3025], vec![1, 128, 3025], vec![1, 7, 3025]],
            ),
            (1, vec![vec![1, 3, 5], vec![1, 2, 5]]),
            (
                2,
                vec![vec![300, 7, 129], vec![300, 7, 1000], vec![300, 7, 3]],
            ),
        ];
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (axis, dims) in cases.iter().cloned() {
                let f: Vec<(Vec<usize>, Vec<f32>)> = dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let n: usize = d.iter().product();
                        (
                            d.clone(),
                            (0..n).map(|e| (e * 3 + i) as f32 * 0.5).collect(),
                        )
                    })
                    .collect();
                let l: Vec<(Vec<usize>, Vec<i64>)> = f
                    .iter()
                    .map(|(d, v)| (d.clone(), v.iter().map(|&x| (x * 4.0) as i64 - 7).collect()))
                    .collect();
                let mut od = dims[0].clone();
                od[axis] = dims.iter().map(|d| d[axis]).sum();
                let tf: Vec<Tensor> = f
                    .iter()
                    .map(|(d, v)| Tensor::from_f32(d, v.clone()).unwrap())
                    .collect();
                let tl: Vec<Tensor> = l
                    .iter()
                    .map(|(d, v)| Tensor::from_i64(d, v.clone()).unwrap())
                    .collect();
                let (gf, gl) = pool.install(|| {
                    let rf: Vec<&Tensor> = tf.iter().collect();
                    let rl: Vec<&Tensor> = tl.iter().collect();
                    (
                        super::concat(&rf, axis, &Shape::new(&od, DType::F32)).unwrap(),
                        super::concat(&rl, axis, &Shape::new(&od, DType::I64)).unwrap(),
                    )
                });
                check(&f, axis, gf.as_f32().unwrap());
                let rlx_ir::TensorData::I64(gl) = gl.data() else {
                    panic!("concat of i64 gave {}", gl.dtype())
                };
                check(&l, axis, gl);
                // `concat_onto`: the first input's buffer taken, exactly as long (the
                // copy grows it) or with room for the output (it stays where it is).
                let lead = dims[0][..axis].iter().all(|&d| d == 1);
                let n: usize = od.iter().product();
                for room in [false, true] {
                    let mut v = Vec::with_capacity(if room { n } else { 0 });
                    v.extend_from_slice(&f[0].1);
                    let first = Tensor::from_f32(&dims[0], v).unwrap();
                    let at = first.as_f32().unwrap().as_ptr();
                    let rest: Vec<&Tensor> = tf[1..].iter().collect();
                    let out = Shape::new(&od, DType::F32);
                    // The count is the running thread's.
                    let (got, onto) = pool.install(|| {
                        let (b0, b1) = super::concats_onto();
                        let t = super::concat_onto(first, &rest, axis, &out).unwrap();
                        let (a0, a1) = super::concats_onto();
                        (t, (a0 - b0, a1 - b1))
                    });
                    check(&f, axis, got.as_f32().unwrap());
                    assert_eq!(onto, (u64::from(lead), u64::from(lead && room)), "{dims:?}");
                    if lead && room {
                        assert_eq!(got.as_f32().unwrap().as_ptr(), at, "moved: {dims:?}");
                    }
                    let first = Tensor::from_i64(&dims[0], l[0].1.clone()).unwrap();
                    let rest: Vec<&Tensor> = tl[1..].iter().collect();
                    let out = Shape::new(&od, DType::I64);
                    let got =
                        pool.install(|| super::concat_onto(first, &rest, axis, &out).unwrap());
                    let rlx_ir::TensorData::I64(gl) = got.data() else {
                        panic!("concat_onto of i64 gave {}", got.dtype())
                    };
                    check(&l, axis, gl);
                }
            }
        }
    }

    /// `concat_onto` refuses what `concat` refuses, with the same message, whether or not
    /// the layout would let it extend the first input.
    #[test]
    fn concat_onto_errors_as_concat() {
        use rlx_ir::{DType, Shape, Tensor};
        let a = Tensor::from_f32(&[1, 2, 3], vec![1.0; 6]).unwrap();
        let b = Tensor::from_f32(&[1, 2, 4], vec![2.0; 8]).unwrap();
        let c = Tensor::from_i64(&[1, 2, 3], vec![3; 6]).unwrap();
        for (rest, od) in [(&b, [1, 4, 3]), (&c, [1, 4, 3]), (&a, [1, 5, 3])] {
            let out = Shape::new(&od, DType::F32);
            let want = super::concat(&[&a, rest], 1, &out).unwrap_err().to_string();
            let got = super::concat_onto(a.clone(), &[rest], 1, &out)
                .unwrap_err()
                .to_string();
            assert_eq!(got, want);
        }
    }

    /// The definition, element by element: `out[o] = src[sum_i maps[i][o_i] * stride_i]`,
    /// or `fill` where a map entry is FILL.
    fn naive(src: &[i64], dims: &[usize], maps: &[Vec<usize>], fill: i64) -> Vec<i64> {
        let st = rlx_ir::strides_of(dims);
        let od: Vec<usize> = maps.iter().map(|m| m.len()).collect();
        let n: usize = od.iter().product();
        (0..n)
            .map(|mut o| {
                let mut off = 0;
                for i in (0..od.len()).rev() {
                    let m = maps[i][o % od[i]];
                    o /= od[i];
                    if m == FILL {
                        return fill;
                    }
                    off += m * st[i];
                }
                src[off]
            })
            .collect()
    }

    /// Maps whose trailing axes are whole and in order (merged into blocks), before an
    /// axis that is sliced, repeated (Expand), reordered or padded: every branch of the
    /// block copy, against the definition.
    #[test]
    fn merged_trailing_axes_match_the_definition() {
        let dims = [2, 3, 4, 5];
        let src: Vec<i64> = (0..120).collect();
        let whole = |d: usize| (0..d).collect::<Vec<_>>();
        let cases: Vec<(&str, Vec<Vec<usize>>)> = vec![
            ("copy", vec![whole(2), whole(3), whole(4), whole(5)]),
            (
                "slice axis 1",
                vec![whole(2), vec![1, 2], whole(4), whole(5)],
            ),
            (
                "expand axis 1",
                vec![whole(2), vec![0; 3], whole(4), whole(5)],
            ),
            (
                "repeat axis 1",
                vec![whole(2), vec![2, 2, 2, 2], whole(4), whole(5)],
            ),
            (
                "reorder axis 1",
                vec![whole(2), vec![2, 0, 1], whole(4), whole(5)],
            ),
            (
                "pad axis 1",
                vec![whole(2), vec![FILL, 0, 1, 2, FILL], whole(4), whole(5)],
            ),
            (
                "pad axis 0",
                vec![vec![FILL, 0, 1], whole(3), whole(4), whole(5)],
            ),
            (
                "slice last",
                vec![whole(2), whole(3), whole(4), vec![1, 2, 3]],
            ),
            (
                "step axis 2",
                vec![whole(2), whole(3), vec![0, 2], whole(5)],
            ),
        ];
        for (name, maps) in cases {
            let got = axis_gather(&src, &dims, &maps, -7);
            assert_eq!(got, naive(&src, &dims, &maps, -7), "{name}");
        }
    }
}
