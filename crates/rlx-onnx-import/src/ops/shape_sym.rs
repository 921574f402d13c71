//! The shape ops of `shape.rs` on symbolic sizes (a symbolic import: see `crate::sym`).
//! Each follows its plain counterpart's ONNX semantics with sizes as [`DimExpr`]s; a
//! decision on a symbolic size is taken at the probe and recorded as a guard.

use crate::ctx::{norm_axes, norm_axis, Ctx, ONode, R};
use crate::sym::SymConst;
use rlx_ir::sym::DimExpr;
use rlx_ir::{DType, NodeId};

/// Constants this large stand for "to the end" (exporters write `INT64_MAX`).
const TO_END: i64 = 1 << 40;

pub(crate) fn product(d: &[DimExpr]) -> R<DimExpr> {
    d.iter().try_fold(DimExpr::from(1), |a, x| {
        a.mul(x).ok_or_else(|| "size product overflows".to_string())
    })
}

fn ov(e: Option<DimExpr>) -> R<DimExpr> {
    e.ok_or_else(|| "size arithmetic overflows".to_string())
}

fn sym<'c>(cx: &'c mut Ctx<'_>) -> &'c mut crate::sym::SymState {
    cx.sym.as_mut().expect("symbolic import")
}

/// `total / known` for a Reshape's `-1`: exact, or the import is not symbolic.
fn exact_div(total: &DimExpr, known: &DimExpr) -> R<DimExpr> {
    total
        .div_exact(known)
        .ok_or_else(|| format!("cannot infer -1: {total} elements by {known}"))
}

/// ONNX Reshape with a symbolic input or `shape`.
pub(crate) fn reshape(cx: &mut Ctx, n: &ONode, x: NodeId) -> R<Vec<NodeId>> {
    let spec = cx.const_dims(n.inp(1)?, "shape")?;
    let allowzero = n.i("allowzero", 0)? != 0;
    let xd = cx.sdims(x);
    let total = product(&xd)?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, s) in spec.iter().enumerate() {
        match s.as_const() {
            Some(-1) if infer.is_none() => {
                infer = Some(i);
                out.push(DimExpr::from(1));
            }
            Some(0) if !allowzero => out.push(
                xd.get(i)
                    .cloned()
                    .ok_or_else(|| format!("shape: 0 at {i} has no input dim to copy"))?,
            ),
            Some(c) if c >= 0 => out.push(s.clone()),
            Some(_) => return Err("invalid shape".into()),
            None => {
                // A computed entry: -1 or 0 at the probe would change its meaning.
                let st = sym(cx);
                if st.decide_lt(s, &DimExpr::from(1))? {
                    return Err(format!("shape entry {s} is not positive at the probe"));
                }
                out.push(s.clone());
            }
        }
    }
    if let Some(i) = infer {
        let known = product(&out)?;
        out[i] = exact_div(&total, &known)?;
    }
    Ok(vec![cx.reshape_sym(x, out)?])
}

/// Elements `start..start+size` of `axis` (static start and size).
pub(crate) fn slice_axis(
    cx: &mut Ctx,
    x: NodeId,
    axis: usize,
    start: usize,
    size: usize,
) -> R<NodeId> {
    let d = cx.sdims(x);
    if axis >= d.len() {
        return Err(format!("axis {axis} out of range"));
    }
    let end = DimExpr::from((start + size) as i64);
    if sym(cx).decide_lt(&d[axis], &end)? {
        return Err(format!(
            "cannot take elements {start}..{end} of axis {axis}"
        ));
    }
    if start == 0 && d[axis] == end {
        return Ok(x);
    }
    let mut starts = vec![DimExpr::from(0); d.len()];
    let mut sizes = d.clone();
    starts[axis] = DimExpr::from(start as i64);
    sizes[axis] = DimExpr::from(size as i64);
    cx.slice_sym(x, starts, vec![1; d.len()], sizes)
}

/// ONNX Slice with symbolic sizes or bounds (steps must be constants).
pub(crate) fn slice(cx: &mut Ctx, n: &ONode, x: NodeId) -> R<Vec<NodeId>> {
    let d = cx.sdims(x);
    let r = d.len();
    let consts = |v: Vec<i64>| v.into_iter().map(DimExpr::from).collect::<Vec<_>>();
    let (starts, ends, axes, steps) = if n.opset >= 10 {
        let get = |i: usize, what: &str| -> R<Option<Vec<DimExpr>>> {
            n.opt(i).map(|id| cx.const_dims(id, what)).transpose()
        };
        let axes = match n.opt(3) {
            Some(id) => Some(cx.const_i64s(id, "axes")?),
            None => None,
        };
        let steps = match n.opt(4) {
            Some(id) => Some(cx.const_i64s(id, "steps")?),
            None => None,
        };
        (
            get(1, "starts")?.ok_or("starts input is required")?,
            get(2, "ends")?.ok_or("ends input is required")?,
            axes,
            steps,
        )
    } else {
        (
            consts(n.ints("starts")?.ok_or("starts attribute is required")?),
            consts(n.ints("ends")?.ok_or("ends attribute is required")?),
            n.ints("axes")?,
            None,
        )
    };
    let k = starts.len();
    let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; k]);
    if ends.len() != k || axes.len() != k || steps.len() != k {
        return Err("starts/ends/axes/steps lengths differ".into());
    }
    let zero = DimExpr::from(0);
    let mut st = vec![zero.clone(); r];
    let mut sp = vec![1i64; r];
    let mut sz = d.clone();
    let mut seen = vec![false; r];
    for i in 0..k {
        let a = norm_axis(axes[i], r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(format!("axis {} repeats", axes[i]));
        }
        if steps[i] != 1 {
            return Err("a step other than 1 on symbolic sizes".into());
        }
        let dim = d[a].clone();
        // ONNX: a negative bound counts from the end; then clamp to [0, dim].
        let norm = |cx: &mut Ctx, v: &DimExpr| -> R<DimExpr> {
            if v.as_const().is_some_and(|c| c >= TO_END) {
                let st = sym(cx);
                st.guard(rlx_ir::sym::Guard::Lt(dim.clone(), DimExpr::from(TO_END)));
                return Ok(dim.clone());
            }
            let neg = if v.is_nonneg() {
                false
            } else {
                sym(cx).decide_lt(v, &zero)?
            };
            let v = if neg { ov(v.add(&dim))? } else { v.clone() };
            Ok(v.maximum(&zero).minimum(&dim))
        };
        let s = norm(cx, &starts[i])?;
        let e = norm(cx, &ends[i])?;
        let size = ov(e.sub(&s))?.maximum(&zero);
        // The plain import writes start 0 for an empty slice: decide emptiness.
        let empty = sym(cx).decide_eq(&size, &zero)?;
        st[a] = if empty { zero.clone() } else { s };
        sz[a] = if empty { zero.clone() } else { size };
    }
    if st.iter().all(|s| *s == zero) && sz == d {
        return Ok(vec![x]);
    }
    Ok(vec![cx.slice_sym(x, st, sp.split_off(0), sz)?])
}

/// Output dims of Unsqueeze at the (normalized, sorted) `axes`.
pub(crate) fn unsqueezed(d: Vec<DimExpr>, axes: &[usize]) -> Vec<DimExpr> {
    let out_rank = d.len() + axes.len();
    let mut it = d.into_iter();
    (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                DimExpr::from(1)
            } else {
                it.next().unwrap_or(DimExpr::from(1))
            }
        })
        .collect()
}

/// ONNX Squeeze of a symbolic input.
pub(crate) fn squeeze(cx: &mut Ctx, x: NodeId, axes: Option<Vec<i64>>) -> R<Vec<NodeId>> {
    let d = cx.sdims(x);
    let one = DimExpr::from(1);
    let axes = match axes {
        Some(a) => norm_axes(&a, d.len())?,
        None => {
            let mut v = Vec::new();
            for (i, e) in d.iter().enumerate() {
                if sym(cx).decide_eq(e, &one)? {
                    v.push(i);
                }
            }
            v
        }
    };
    for &a in &axes {
        if !sym(cx).decide_eq(&d[a], &one)? {
            return Err(format!("cannot squeeze axis {a} of size {}", d[a]));
        }
    }
    let out = (0..d.len())
        .filter(|i| !axes.contains(i))
        .map(|i| d[i].clone())
        .collect();
    Ok(vec![cx.reshape_sym(x, out)?])
}

/// ONNX Flatten of a symbolic input.
pub(crate) fn flatten(cx: &mut Ctx, x: NodeId, axis: i64) -> R<Vec<NodeId>> {
    let d = cx.sdims(x);
    let r = d.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a > r {
        return Err(format!("axis {a} out of range for rank {r}"));
    }
    let a = a as usize;
    let out = vec![product(&d[..a])?, product(&d[a..])?];
    Ok(vec![cx.reshape_sym(x, out)?])
}

/// ONNX Expand with symbolic sizes.
pub(crate) fn expand(cx: &mut Ctx, x: NodeId, s: Vec<DimExpr>) -> R<Vec<NodeId>> {
    let d = cx.sdims(x);
    let out = sym(cx).broadcast(&d, &s)?;
    if out == d {
        return Ok(vec![x]);
    }
    Ok(vec![cx.broadcast_sym(x, out)?])
}

/// ONNX Range with a symbolic bound: an integer range regenerated per binding.
pub(crate) fn range(cx: &mut Ctx, s: NodeId, l: NodeId, d: NodeId, dt: DType) -> R<Vec<NodeId>> {
    if !dt.is_int() {
        return Err("a float Range with symbolic bounds".into());
    }
    let one = |cx: &Ctx, id: NodeId, what: &str| -> R<DimExpr> {
        let v = cx.const_dims(id, what)?;
        match &v[..] {
            [x] => Ok(x.clone()),
            _ => Err(format!("{what} must be a scalar")),
        }
    };
    let (start, limit) = (one(cx, s, "start")?, one(cx, l, "limit")?);
    let delta = one(cx, d, "delta")?
        .as_const()
        .filter(|&d| d != 0)
        .ok_or("Range delta must be a non-zero constant")?;
    let len = ov(ov(limit.sub(&start))?.ceil_div(delta))?.maximum(&DimExpr::from(0));
    let n = cx.probe_sizes(std::slice::from_ref(&len), "range length")?[0];
    if n > super::RANGE_MAX {
        return Err(format!("range of {n} elements is too large"));
    }
    let s0 = cx.probe_sizes(std::slice::from_ref(&start), "range start");
    let s0 = match (s0, start.as_const()) {
        (Ok(v), _) => v[0] as i64,
        (Err(_), Some(c)) => c,
        (Err(e), None) => return Err(e),
    };
    let vals: Vec<i64> = (0..n as i64).map(|i| s0 + i * delta).collect();
    let t = rlx_ir::Tensor::new(vec![n], rlx_ir::TensorData::from_i64(dt, &vals))
        .map_err(|e| e.to_string())?;
    let id = cx.g.constant(t);
    let st = sym(cx);
    if !(len.is_const() && start.is_const()) {
        st.consts.insert(
            id,
            SymConst::Range {
                start,
                delta,
                len: len.clone(),
                dtype: dt,
            },
        );
        if !len.is_const() {
            st.shapes.insert(id, vec![len]);
        }
    }
    Ok(vec![id])
}
