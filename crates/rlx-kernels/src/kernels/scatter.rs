//! Index kernels with data-dependent addressing: GatherND, ScatterElements, ScatterND, TopK
//! (ONNX operator spec of the same names). Every index is range-checked; an index out of
//! range is an error naming its position, never a panic.

use super::{invalid, make, map_same, strides, Elem, KResult};
use rlx_ir::{ScatterReduction, Tensor, TensorData};
use std::cmp::Ordering;

/// Raw indices as i64 (I64/I32/other ints).
fn raw_indices(op: &str, idx: &Tensor) -> KResult<Vec<i64>> {
    match idx.data() {
        TensorData::I64(v) => Ok(v.clone()),
        d if d.dtype().is_int() => Ok(d.to_i64_vec()),
        d => invalid(format!("{op}: indices must be integers, got {}", d.dtype())),
    }
}

/// Normalize index `i` (negative counts from the end) against an axis of size `dim`.
#[inline]
fn norm(op: &str, i: i64, dim: usize, pos: usize) -> KResult<usize> {
    let j = if i < 0 { i + dim as i64 } else { i };
    if j < 0 || j >= dim as i64 {
        return invalid(format!(
            "{op}: index {i} (at position {pos} of the indices) is out of range for an axis of size {dim}"
        ));
    }
    Ok(j as usize)
}

/// Combine `old` with `new` per `r` (computed through f64, then rounded to `T`; NaN
/// propagates through Max/Min as in `np.maximum`).
#[inline]
fn combine<T: Elem>(r: ScatterReduction, old: T, new: T) -> T {
    let (a, b) = (old.to_f64(), new.to_f64());
    match r {
        ScatterReduction::None => new,
        ScatterReduction::Add => T::from_f64(a + b),
        ScatterReduction::Mul => T::from_f64(a * b),
        ScatterReduction::Max => {
            if a.is_nan() || b.is_nan() {
                T::from_f64(f64::NAN)
            } else if b > a {
                new
            } else {
                old
            }
        }
        ScatterReduction::Min => {
            if a.is_nan() || b.is_nan() {
                T::from_f64(f64::NAN)
            } else if b < a {
                new
            } else {
                old
            }
        }
    }
}

/// Write `upd` into a copy of `data` at element offsets `offs` (one per update element, in
/// order), combining per `r`.
fn scatter_offsets(
    data: &Tensor,
    upd: &Tensor,
    offs: &[usize],
    r: ScatterReduction,
    op: &str,
) -> KResult<Tensor> {
    if data.dtype() != upd.dtype() {
        return invalid(format!(
            "{op}: updates dtype {} differs from data dtype {}",
            upd.dtype(),
            data.dtype()
        ));
    }
    if data.dtype().is_narrow() && r != ScatterReduction::None {
        return invalid(format!(
            "{op}: reduction {r:?} on {} data is not supported (storage-only type)",
            data.dtype()
        ));
    }
    let out = match (data.data(), upd.data()) {
        (TensorData::I64(d), TensorData::I64(u)) => {
            // Integer reductions in i64 (exact beyond 2^53).
            let mut o = d.clone();
            for (&off, &x) in offs.iter().zip(u) {
                let a = o[off];
                o[off] = match r {
                    ScatterReduction::None => x,
                    ScatterReduction::Add => a.wrapping_add(x),
                    ScatterReduction::Mul => a.wrapping_mul(x),
                    ScatterReduction::Max => a.max(x),
                    ScatterReduction::Min => a.min(x),
                };
            }
            TensorData::I64(o)
        }
        (d, u) => {
            let u = u.clone();
            map_same!(d, v => {
                let mut o = v.clone();
                let uv: &[_] = match_slice(&u, v);
                for (&off, &x) in offs.iter().zip(uv) {
                    o[off] = combine(r, o[off], x);
                }
                o
            })
        }
    };
    make(data.dims().to_vec(), out)
}

/// The slice of `u` with the same element type as `like` (the caller checked the dtypes).
fn match_slice<'a, T: 'static>(u: &'a TensorData, _like: &[T]) -> &'a [T] {
    use std::any::Any;
    let any: &dyn Any = rlx_ir::with_data!(u, v => v);
    any.downcast_ref::<Vec<T>>()
        .map(|v| v.as_slice())
        .unwrap_or(&[])
}

/// `Op::ScatterElements`: `out = data`; for every position `p` of `indices`,
/// `out[p with axis coord = indices[p]] (reduction)= updates[p]`.
pub(crate) fn scatter_elements(
    data: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    axis: usize,
    r: ScatterReduction,
) -> KResult<Tensor> {
    let op = "ScatterElements";
    let (dd, id) = (data.dims(), idx.dims());
    let rank = dd.len();
    if axis >= rank || id.len() != rank || upd.dims() != id {
        return invalid(format!(
            "{op}: data {dd:?}, indices {id:?}, updates {:?}, axis {axis} do not fit",
            upd.dims()
        ));
    }
    if (0..rank).any(|i| i != axis && id[i] > dd[i]) {
        return invalid(format!("{op}: indices dims {id:?} exceed data dims {dd:?}"));
    }
    let raw = raw_indices(op, idx)?;
    let ds = strides(dd);
    let mut offs = Vec::with_capacity(raw.len());
    let mut coord = vec![0usize; rank];
    for (p, &i) in raw.iter().enumerate() {
        let k = norm(op, i, dd[axis], p)?;
        let mut off = 0;
        for a in 0..rank {
            off += if a == axis { k } else { coord[a] } * ds[a];
        }
        offs.push(off);
        for a in (0..rank).rev() {
            coord[a] += 1;
            if coord[a] < id[a] {
                break;
            }
            coord[a] = 0;
        }
    }
    scatter_offsets(data, upd, &offs, r, op)
}

/// Element offset of the first element of each indexed slice: `indices` is `[n, q]` flat,
/// each row indexing the leading `q` dims of `dims`.
fn nd_offsets(op: &str, raw: &[i64], q: usize, dims: &[usize]) -> KResult<Vec<usize>> {
    let st = strides(dims);
    let n = raw.len().checked_div(q).unwrap_or(1);
    let mut offs = Vec::with_capacity(n);
    for row in 0..n {
        let mut off = 0;
        for j in 0..q {
            let pos = row * q + j;
            off += norm(op, raw[pos], dims[j], pos)? * st[j];
        }
        offs.push(off);
    }
    Ok(offs)
}

/// `Op::ScatterND`: `out = data`; `out[indices[i]] (reduction)= updates[i]` for each index
/// tuple `i` (a tuple of `q` coords addresses a slice of `data.dims[q..]`).
pub(crate) fn scatter_nd(
    data: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    r: ScatterReduction,
) -> KResult<Tensor> {
    let op = "ScatterND";
    let (dd, id) = (data.dims(), idx.dims());
    let q = id.last().copied().unwrap_or(usize::MAX);
    if q > dd.len() {
        return invalid(format!("{op}: indices {id:?} do not fit data {dd:?}"));
    }
    let mut want = id[..id.len() - 1].to_vec();
    want.extend_from_slice(&dd[q..]);
    if upd.dims() != want {
        return invalid(format!("{op}: updates {:?} must be {want:?}", upd.dims()));
    }
    let raw = raw_indices(op, idx)?;
    let slice: usize = dd[q..].iter().product();
    let starts = if q == 0 {
        vec![0; id[..id.len() - 1].iter().product()]
    } else {
        nd_offsets(op, &raw, q, dd)?
    };
    let mut offs = Vec::with_capacity(starts.len() * slice);
    for s in starts {
        offs.extend(s..s + slice);
    }
    scatter_offsets(data, upd, &offs, r, op)
}

/// `Op::GatherND` with `batch_dims`.
pub(crate) fn gather_nd(data: &Tensor, idx: &Tensor, batch_dims: usize) -> KResult<Tensor> {
    let op = "GatherND";
    let (dd, id) = (data.dims(), idx.dims());
    let b = batch_dims;
    let q = id.last().copied().unwrap_or(usize::MAX);
    if b >= id.len() || b.saturating_add(q) > dd.len() || dd[..b] != id[..b] {
        return invalid(format!(
            "{op}: data {dd:?}, indices {id:?}, batch_dims {b} do not fit"
        ));
    }
    let raw = raw_indices(op, idx)?;
    let nb: usize = dd[..b].iter().product();
    let per_batch: usize = dd[b..].iter().product();
    let m: usize = id[b..id.len() - 1].iter().product();
    let slice: usize = dd[b + q..].iter().product();
    let mut offs = Vec::with_capacity(nb * m * slice);
    for bi in 0..nb {
        let rows = &raw[bi * m * q..(bi + 1) * m * q];
        let starts = if q == 0 {
            vec![0; m]
        } else {
            nd_offsets(op, rows, q, &dd[b..])?
        };
        for s in starts {
            let base = bi * per_batch + s;
            offs.extend(base..base + slice);
        }
    }
    let mut od = id[..id.len() - 1].to_vec();
    od.extend_from_slice(&dd[b + q..]);
    make(od, data.data().gather(&offs))
}

/// `Op::TopK`: the `k` largest (or smallest) entries along `axis`, values or I64 indices.
pub(crate) fn topk(
    x: &Tensor,
    k: usize,
    axis: usize,
    largest: bool,
    want_indices: bool,
) -> KResult<Tensor> {
    let d = x.dims();
    if axis >= d.len() || k > d[axis] {
        return invalid(format!("TopK: k {k} / axis {axis} do not fit input {d:?}"));
    }
    let n = d[axis];
    let inner: usize = d[axis + 1..].iter().product();
    let outer: usize = d[..axis].iter().product();
    let data = x.data();
    // Integer keys compare exactly (i128 holds i64 and u64); everything else through f64
    // (NaN greatest; narrow floats decoded).
    let is_int = data.dtype().is_int();
    let cmp = |a: usize, b: usize| -> Ordering {
        let o = if is_int {
            data.get_i128(a).cmp(&data.get_i128(b))
        } else {
            let (p, q) = (data.get_f64(a), data.get_f64(b));
            match (p.is_nan(), q.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => p.partial_cmp(&q).unwrap_or(Ordering::Equal),
            }
        };
        if largest {
            o.reverse()
        } else {
            o
        }
    };
    let mut od = d.to_vec();
    od[axis] = k;
    let total = outer * k * inner;
    let mut offs = vec![0usize; total];
    let mut pos = vec![0i64; total];
    let mut cand: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            cand.clear();
            cand.extend(0..n);
            let off = |j: usize| (o * n + j) * inner + i;
            // Stable sort: ties keep the lower index first.
            cand.sort_by(|&a, &b| cmp(off(a), off(b)));
            for (r, &j) in cand.iter().take(k).enumerate() {
                let dst = (o * k + r) * inner + i;
                offs[dst] = off(j);
                pos[dst] = j as i64;
            }
        }
    }
    if want_indices {
        make(od, TensorData::I64(pos))
    } else {
        make(od, data.gather(&offs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(d: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(d, v.to_vec()).unwrap()
    }
    fn i(d: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64(d, v.to_vec()).unwrap()
    }

    // Expected values: the examples in the ONNX operator spec (ScatterElements, ScatterND,
    // GatherND, TopK sections).
    #[test]
    fn scatter_elements_spec_examples() {
        let data = f(&[1, 5], &[1., 2., 3., 4., 5.]);
        let idx = i(&[1, 2], &[1, 3]);
        let upd = f(&[1, 2], &[1.1, 2.1]);
        let o = scatter_elements(&data, &idx, &upd, 1, ScatterReduction::None).unwrap();
        assert_eq!(o.as_f32().unwrap(), &[1., 1.1, 3., 2.1, 5.]);
        let idx = i(&[1, 2], &[1, 1]);
        let o = scatter_elements(&data, &idx, &upd, 1, ScatterReduction::Add).unwrap();
        assert_eq!(o.as_f32().unwrap(), &[1., 5.2, 3., 4., 5.]);
        let bad = i(&[1, 2], &[1, 5]);
        assert!(scatter_elements(&data, &bad, &upd, 1, ScatterReduction::None).is_err());
        let neg = i(&[1, 2], &[1, -3]);
        let o = scatter_elements(&data, &neg, &upd, 1, ScatterReduction::None).unwrap();
        assert_eq!(o.as_f32().unwrap(), &[1., 1.1, 2.1, 4., 5.]);
    }

    #[test]
    fn scatter_nd_spec_example() {
        let data = f(&[8], &[1., 2., 3., 4., 5., 6., 7., 8.]);
        let idx = i(&[4, 1], &[4, 3, 1, 7]);
        let upd = f(&[4], &[9., 10., 11., 12.]);
        let o = scatter_nd(&data, &idx, &upd, ScatterReduction::None).unwrap();
        assert_eq!(o.as_f32().unwrap(), &[1., 11., 3., 10., 9., 6., 7., 12.]);
        let o = scatter_nd(&data, &idx, &upd, ScatterReduction::Mul).unwrap();
        assert_eq!(o.as_f32().unwrap(), &[1., 22., 3., 40., 45., 6., 7., 96.]);
    }

    #[test]
    fn gather_nd_spec_examples() {
        let data = i(&[2, 2], &[0, 1, 2, 3]);
        let o = gather_nd(&data, &i(&[2, 2], &[0, 0, 1, 1]), 0).unwrap();
        assert_eq!(o.data().to_i64_vec(), vec![0, 3]);
        let o = gather_nd(&data, &i(&[2, 1], &[1, 0]), 0).unwrap();
        assert_eq!(o.dims(), &[2, 2]);
        assert_eq!(o.data().to_i64_vec(), vec![2, 3, 0, 1]);
        // batch_dims = 1: data [2,2,2], indices [[1],[0]] → [[2,3],[4,5]].
        let data = i(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
        let o = gather_nd(&data, &i(&[2, 1], &[1, 0]), 1).unwrap();
        assert_eq!(o.data().to_i64_vec(), vec![2, 3, 4, 5]);
        assert!(gather_nd(&data, &i(&[2, 1], &[2, 0]), 1).is_err());
    }

    #[test]
    fn topk_spec_example_and_ties() {
        let x = f(&[3, 4], &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11.]);
        let v = topk(&x, 3, 1, true, false).unwrap();
        assert_eq!(v.as_f32().unwrap(), &[3., 2., 1., 7., 6., 5., 11., 10., 9.]);
        let ix = topk(&x, 3, 1, true, true).unwrap();
        assert_eq!(ix.data().to_i64_vec(), vec![3, 2, 1, 3, 2, 1, 3, 2, 1]);
        let t = f(&[4], &[1., 2., 2., 1.]);
        assert_eq!(
            topk(&t, 2, 0, true, true).unwrap().data().to_i64_vec(),
            vec![1, 2]
        );
        assert_eq!(
            topk(&t, 3, 0, false, true).unwrap().data().to_i64_vec(),
            vec![0, 3, 1]
        );
    }
}
