//! Index kernels on any data dtype: Gather, GatherElements, Trilu.

use super::{invalid, make, map_same, strides, Elem, KResult};
use rlx_ir::{Tensor, TensorData};

/// Indices as i64, normalized against `dim` (negative counts from the end); errors name
/// the first index out of range.
fn norm_indices(op: &str, idx: &Tensor, dim: usize) -> KResult<Vec<usize>> {
    let raw: Vec<i64> = match idx.data() {
        TensorData::I64(v) => v.clone(),
        TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
        d if d.dtype().is_int() => d.to_i64_vec(),
        d => return invalid(format!("{op}: indices must be integers, got {}", d.dtype())),
    };
    let mut out = Vec::with_capacity(raw.len());
    for (k, &i) in raw.iter().enumerate() {
        let j = if i < 0 { i + dim as i64 } else { i };
        if j < 0 || j >= dim as i64 {
            return invalid(format!(
                "{op}: index {i} (at position {k} of the indices) is out of range for an axis of size {dim}"
            ));
        }
        out.push(j as usize);
    }
    Ok(out)
}

/// `Op::Gather` (ONNX Gather): output dims = data[..axis] ++ indices.dims ++ data[axis+1..].
pub(crate) fn gather(data: &Tensor, idx: &Tensor, axis: usize) -> KResult<Tensor> {
    let dd = data.dims();
    if axis >= dd.len() {
        return invalid(format!(
            "gather: axis {axis} out of range for rank {}",
            dd.len()
        ));
    }
    let ix = norm_indices("gather", idx, dd[axis])?;
    let outer: usize = dd[..axis].iter().product();
    let inner: usize = dd[axis + 1..].iter().product();
    let dim = dd[axis];
    let mut od = dd[..axis].to_vec();
    od.extend_from_slice(idx.dims());
    od.extend_from_slice(&dd[axis + 1..]);
    let out = map_same!(data.data(), v => {
        let mut o = crate::buffers::take(outer * ix.len() * inner);
        for b in 0..outer {
            for &i in &ix {
                let s = (b * dim + i) * inner;
                o.extend_from_slice(&v[s..s + inner]);
            }
        }
        o
    });
    make(od, out)
}

/// `Op::GatherElements` (ONNX GatherElements): output dims = indices dims,
/// `out[i] = data[i with axis coordinate replaced by indices[i]]`.
pub(crate) fn gather_elements(data: &Tensor, idx: &Tensor, axis: usize) -> KResult<Tensor> {
    let dd = data.dims();
    let id = idx.dims();
    let r = dd.len();
    if axis >= r || id.len() != r {
        return invalid(format!(
            "gather_elements: data rank {r}, indices rank {}, axis {axis}",
            id.len()
        ));
    }
    if (0..r).any(|i| i != axis && id[i] > dd[i]) {
        return invalid(format!(
            "gather_elements: indices dims {id:?} exceed data dims {dd:?}"
        ));
    }
    let ix = norm_indices("gather_elements", idx, dd[axis])?;
    let ds = strides(dd);
    let n = ix.len();
    let mut offs = Vec::with_capacity(n);
    let mut coord = vec![0usize; r];
    for &k in ix.iter() {
        let mut off = 0;
        for i in 0..r {
            let c = if i == axis { k } else { coord[i] };
            off += c * ds[i];
        }
        offs.push(off);
        // advance coordinate
        for i in (0..r).rev() {
            coord[i] += 1;
            if coord[i] < id[i] {
                break;
            }
            coord[i] = 0;
        }
    }
    let out = data.data().gather(&offs);
    make(id.to_vec(), out)
}

/// `Op::Trilu`: keep the upper (`j - i >= k`) or lower (`j - i <= k`) triangle of the last
/// two dims, zero elsewhere.
pub(crate) fn trilu(x: &Tensor, upper: bool, k: i64) -> KResult<Tensor> {
    let d = x.dims();
    if d.len() < 2 {
        return invalid("trilu needs rank >= 2");
    }
    let (rows, cols) = (d[d.len() - 2], d[d.len() - 1]);
    let out = map_same!(x.data(), v => {
        let mut o = v.clone();
        let zero = Elem::from_f64(0.0);
        if rows * cols > 0 {
            for (p, e) in o.iter_mut().enumerate() {
                let j = (p % cols) as i64;
                let i = ((p / cols) % rows) as i64;
                let keep = if upper { j - i >= k } else { j - i <= k };
                if !keep {
                    *e = zero;
                }
            }
        }
        o
    });
    make(d.to_vec(), out)
}
