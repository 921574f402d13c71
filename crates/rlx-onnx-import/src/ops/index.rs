//! Index ops: TopK, Scatter/ScatterElements/ScatterND, GatherND (IR ops with CPU kernels),
//! and lowerings onto primitives: OneHot, Hardmax, Compress and NonZero (constant inputs),
//! the bitwise ops and BitShift.

use crate::ctx::{norm_axis, Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ScatterReduction, Tensor, UnaryOp};

/// ONNX TopK. `k` is input 1 (opset 10+) or the `k` attribute (opset 1), and must be known
/// at import time. Output 0 (values) and output 1 (I64 indices) are two `Op::TopK` nodes.
pub fn top_k(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let axis = norm_axis(n.i("axis", -1)?, cx.rank(x))?;
    let k = if n.opset >= 10 {
        let v = cx.const_i64s(n.inp(1)?, "K")?;
        match v.as_slice() {
            [k] => *k,
            _ => return Err(format!("K must hold one value, got {v:?}")),
        }
    } else {
        n.i("k", -1)?
    };
    let k = usize::try_from(k).map_err(|_| format!("k = {k} must be non-negative"))?;
    let largest = n.i("largest", 1)? != 0;
    let sorted = n.i("sorted", 1)? != 0;
    let mk = |indices| Op::TopK {
        k,
        axis,
        largest,
        sorted,
        indices,
    };
    let values = cx.add(mk(false), vec![x])?;
    let idx = if n.wants_output(1) {
        cx.add(mk(true), vec![x])?
    } else {
        values
    };
    Ok(vec![values, idx])
}

fn reduction(n: &ONode) -> R<ScatterReduction> {
    Ok(match n.s("reduction", "none")?.as_str() {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        o => return Err(format!("unknown reduction \"{o}\"")),
    })
}

/// ONNX ScatterElements (and the deprecated Scatter, which has no `reduction`).
pub fn scatter_elements(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx, upd) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let axis = norm_axis(n.i("axis", 0)?, cx.rank(x))?;
    let reduction = reduction(n)?;
    Ok(vec![cx.add(
        Op::ScatterElements { axis, reduction },
        vec![x, idx, upd],
    )?])
}

/// ONNX ScatterND.
pub fn scatter_nd(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx, upd) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let reduction = reduction(n)?;
    Ok(vec![cx.add(Op::ScatterND { reduction }, vec![x, idx, upd])?])
}

/// ONNX GatherND.
pub fn gather_nd(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, idx) = (n.inp(0)?, n.inp(1)?);
    let b = n.i("batch_dims", 0)?;
    let batch_dims = usize::try_from(b).map_err(|_| format!("batch_dims {b} is negative"))?;
    Ok(vec![cx.add(Op::GatherND { batch_dims }, vec![x, idx])?])
}

/// `[0, 1, .., len)` as a constant of `dtype`, shaped `[1, .., len, .., 1]` (rank `rank`,
/// `len` at `axis`), for comparisons against an index broadcast along `axis`.
fn iota(cx: &mut Ctx, dtype: DType, len: usize, rank: usize, axis: usize) -> R<NodeId> {
    let mut dims = vec![1; rank];
    dims[axis] = len;
    let v: Vec<f64> = (0..len).map(|i| i as f64).collect();
    let t =
        Tensor::new(dims, rlx_ir::TensorData::from_f64(dtype, &v)).map_err(|e| e.to_string())?;
    Ok(cx.constant(t))
}

/// ONNX OneHot: `out[.., j (at axis), ..] = j == indices[..] ? on : off`; a negative index
/// counts from the end, one outside `[-depth, depth)` gives an all-`off` row (the node
/// suite's `onehot_out_of_range_indices`). `depth` must be known at import time.
pub fn one_hot(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (idx, depth, values) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let dv = cx.const_f64s(depth, "depth")?;
    let depth = match dv.as_slice() {
        [d] if *d >= 1.0 && d.is_finite() => *d as usize,
        _ => return Err(format!("depth must be one positive value, got {dv:?}")),
    };
    if cx.dims(values) != [2] {
        return Err(format!(
            "values must be [off, on] (2 elements), got {:?}",
            cx.dims(values)
        ));
    }
    let r = cx.rank(idx) + 1;
    let axis = norm_axis(n.i("axis", -1)?, r)?;
    let it = cx.dtype(idx);
    let d = cx.scalar(it, depth as f64);
    let zero = cx.scalar(it, 0.0);
    let neg = cx.binary(BinaryOp::Lt, idx, zero)?;
    let shifted = cx.binary(BinaryOp::Add, idx, d)?;
    let wrapped = cx.add(Op::Select, vec![neg, shifted, idx])?;
    let mut ud = cx.dims(idx);
    ud.insert(axis, 1);
    let wrapped = cx.reshape(wrapped, ud)?;
    let ramp = iota(cx, it, depth, r, axis)?;
    let hot = cx.binary(BinaryOp::Eq, wrapped, ramp)?;
    let i0 = cx.constant(Tensor::scalar(DType::I64, 0.0));
    let i1 = cx.constant(Tensor::scalar(DType::I64, 1.0));
    let off = cx.add(Op::Gather { axis: 0 }, vec![values, i0])?;
    let on = cx.add(Op::Gather { axis: 0 }, vec![values, i1])?;
    Ok(vec![cx.add(Op::Select, vec![hot, on, off])?])
}

/// ONNX Hardmax: 1 at the first maximum along `axis`, 0 elsewhere. Opset < 13 coerces the
/// input to 2-D around `axis` (default 1), as Softmax does.
pub fn hardmax(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    let r = d.len();
    let (src, axis) = if n.opset >= 13 {
        (x, norm_axis(n.i("axis", -1)?, r)?)
    } else {
        let axis = norm_axis(n.i("axis", 1)?, r)?;
        let flat = cx.reshape(
            x,
            vec![d[..axis].iter().product(), d[axis..].iter().product()],
        )?;
        (flat, 1)
    };
    let sd = cx.dims(src);
    let am = cx.add(
        Op::ArgReduce {
            max: true,
            axis,
            keepdims: true,
            select_last_index: false,
        },
        vec![src],
    )?;
    let ramp = iota(cx, DType::I64, sd[axis], sd.len(), axis)?;
    let hot = cx.binary(BinaryOp::Eq, am, ramp)?;
    let y = cx.cast(hot, cx.dtype(x))?;
    Ok(vec![cx.reshape(y, d)?])
}

/// ONNX Compress with a condition known at import time: a Gather of the selected positions
/// (along `axis`, or of the flattened input when `axis` is absent).
pub fn compress(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, c) = (n.inp(0)?, n.inp(1)?);
    let cond = cx.const_i64s(c, "condition")?;
    let (src, axis) = match n.attr("axis") {
        Some(_) => (x, norm_axis(n.i("axis", 0)?, cx.rank(x))?),
        None => {
            let numel = cx.dims(x).iter().product();
            (cx.reshape(x, vec![numel])?, 0)
        }
    };
    let len = cx.dims(src)[axis];
    if cond.len() > len {
        return Err(format!(
            "condition has {} entries but the axis has {len}",
            cond.len()
        ));
    }
    let pick: Vec<i64> = (0..cond.len() as i64)
        .filter(|&i| cond[i as usize] != 0)
        .collect();
    let idx = cx.i64s(&pick);
    Ok(vec![cx.add(Op::Gather { axis }, vec![src, idx])?])
}

/// ONNX NonZero of a constant input: folded to the I64 `[rank, nnz]` coordinates
/// (row-major order). A runtime input has a data-dependent output shape: an error.
pub fn non_zero(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let t = cx.const_tensor(x).ok_or(
        "NonZero has a data-dependent output shape: its input must be known at import time",
    )?;
    let d = t.dims().to_vec();
    let st = rlx_ir::strides_of(&d);
    let nz: Vec<usize> = (0..t.numel())
        .filter(|&i| t.data().get_f64(i) != 0.0)
        .collect();
    let mut v = Vec::with_capacity(d.len() * nz.len());
    for a in 0..d.len() {
        v.extend(nz.iter().map(|&i| ((i / st[a]) % d[a]) as i64));
    }
    let out = Tensor::from_i64(&[d.len(), nz.len()], v).map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(out)])
}

fn bin(cx: &mut Ctx, n: &ONode, b: BinaryOp) -> R<Vec<NodeId>> {
    let (x, y) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![cx.binary(b, x, y)?])
}
pub fn bitwise_and(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::BitAnd)
}
pub fn bitwise_or(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::BitOr)
}
pub fn bitwise_xor(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    bin(cx, n, BinaryOp::BitXor)
}
pub fn bitwise_not(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![cx.unary(UnaryOp::BitNot, x)?])
}
/// ONNX BitShift (`direction` = `LEFT` or `RIGHT`).
pub fn bit_shift(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    match n.s("direction", "")?.as_str() {
        "LEFT" => bin(cx, n, BinaryOp::ShiftLeft),
        "RIGHT" => bin(cx, n, BinaryOp::ShiftRight),
        o => Err(format!("direction must be LEFT or RIGHT, got \"{o}\"")),
    }
}

/// ONNX Unique of a constant input, folded at import time (its output length depends on the
/// data). Outputs: `Y` (input dtype), `indices` (first occurrence), `inverse_indices` and
/// `counts` (all I64). Without `axis` the input is flattened; with it, slices along `axis`
/// are compared (lexicographically when `sorted`, the default; else first-occurrence order).
pub fn unique(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let t = cx.const_tensor(x).ok_or(
        "Unique has a data-dependent output shape: its input must be known at import time",
    )?;
    let sorted = n.i("sorted", 1)? != 0;
    let d = t.dims().to_vec();
    let (outer, len, inner, axis) = match n.attr("axis") {
        Some(_) => {
            let a = norm_axis(n.i("axis", 0)?, d.len())?;
            (
                d[..a].iter().product::<usize>(),
                d[a],
                d[a + 1..].iter().product::<usize>(),
                Some(a),
            )
        }
        None => (1, t.numel(), 1, None),
    };
    // offsets of the elements of slice j, in row-major order of the remaining dims
    let offs = |j: usize| -> Vec<usize> {
        (0..outer)
            .flat_map(|o| (0..inner).map(move |i| (o * len + j) * inner + i))
            .collect()
    };
    let key = |j: usize| -> Vec<f64> { offs(j).iter().map(|&o| t.data().get_f64(o)).collect() };
    let keys: Vec<Vec<f64>> = (0..len).map(key).collect();
    let mut firsts: Vec<usize> = vec![];
    let mut inverse_first = vec![0usize; len];
    for j in 0..len {
        match firsts.iter().position(|&f| keys[f] == keys[j]) {
            Some(p) => inverse_first[j] = p,
            None => {
                inverse_first[j] = firsts.len();
                firsts.push(j);
            }
        }
    }
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    if sorted {
        order.sort_by(|&a, &b| {
            keys[firsts[a]]
                .partial_cmp(&keys[firsts[b]])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    }
    let mut rank = vec![0usize; order.len()];
    for (r, &u) in order.iter().enumerate() {
        rank[u] = r;
    }
    let uniq = order.len();
    let mut counts = vec![0i64; uniq];
    for &u in &inverse_first {
        counts[rank[u]] += 1;
    }
    let indices: Vec<i64> = order.iter().map(|&u| firsts[u] as i64).collect();
    let inverse: Vec<i64> = inverse_first.iter().map(|&u| rank[u] as i64).collect();
    // Y: the chosen slices, in order, re-laid along the axis.
    let mut ydims = d.clone();
    let y = match axis {
        Some(a) => {
            ydims[a] = uniq;
            let mut o = Vec::with_capacity(outer * uniq * inner);
            for oo in 0..outer {
                for &u in &order {
                    let j = firsts[u];
                    o.extend((0..inner).map(|i| (oo * len + j) * inner + i));
                }
            }
            Tensor::new(ydims, t.data().gather(&o))
        }
        None => {
            let o: Vec<usize> = order.iter().map(|&u| firsts[u]).collect();
            Tensor::new(vec![uniq], t.data().gather(&o))
        }
    }
    .map_err(|e| e.to_string())?;
    let mk = |v: Vec<i64>| Tensor::from_i64(&[v.len()], v).map_err(|e| e.to_string());
    Ok(vec![
        cx.constant(y),
        cx.constant(mk(indices)?),
        cx.constant(mk(inverse)?),
        cx.constant(mk(counts)?),
    ])
}
