//! Sequence and optional values, resolved at import time (the IR has neither).
//!
//! A sequence (ONNX `seq(tensor)`) whose length is known at import time is a *placeholder*
//! node in the value table (an empty constant no kernel reads) that [`Ctx::seqs`] maps to the
//! list of its element nodes; an optional is a placeholder that [`Ctx::opts`] maps to its
//! element (a tensor node or a sequence placeholder) or `None` when empty. Sequence ops
//! rearrange those lists: SequenceConstruct, SequenceEmpty, SequenceAt, SequenceInsert,
//! SequenceErase, SequenceLength, ConcatFromSequence, SplitToSequence; Optional,
//! OptionalHasElement, OptionalGetElement; SequenceMap is unrolled. Positions, `split` and `axis` must be known at
//! import time. A sequence graph output becomes one graph output per element, named
//! `name[i]`; an optional output becomes its element's outputs (none when empty).

use crate::ctx::{norm_axis, Ctx, ONode, R};
use rlx_ir::{DType, NodeId, Op, Tensor};

/// Op types that take or give sequences / optionals (the others must get tensors only).
pub const SEQ_AWARE: &[&str] = &[
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceAt",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "ConcatFromSequence",
    "SplitToSequence",
    "Optional",
    "OptionalHasElement",
    "OptionalGetElement",
    "Identity",
    "If",
    "Loop",
    "SequenceMap",
];

/// Error when an op that takes tensors gets a sequence or optional input.
pub fn check_tensor_inputs(cx: &Ctx, op_type: &str, inputs: &[Option<NodeId>]) -> R<()> {
    if SEQ_AWARE.contains(&op_type) {
        return Ok(());
    }
    for (i, id) in inputs.iter().enumerate() {
        let Some(id) = id else { continue };
        if cx.seqs.contains_key(id) {
            return Err(format!("input {i} is a sequence; {op_type} takes tensors"));
        }
        if cx.opts.contains_key(id) {
            return Err(format!("input {i} is an optional; {op_type} takes tensors"));
        }
    }
    Ok(())
}

fn placeholder(cx: &mut Ctx) -> NodeId {
    cx.g.constant(Tensor::zeros(&[0], DType::F32))
}

/// A new sequence value holding `elems`.
pub fn new_seq(cx: &mut Ctx, elems: Vec<NodeId>) -> NodeId {
    let id = placeholder(cx);
    cx.seqs.insert(id, elems);
    id
}

/// A new optional value holding `elem` (`None`: empty).
pub fn new_opt(cx: &mut Ctx, elem: Option<NodeId>) -> NodeId {
    let id = placeholder(cx);
    cx.opts.insert(id, elem);
    id
}

fn seq_of(cx: &Ctx, id: NodeId, what: &str) -> R<Vec<NodeId>> {
    cx.seqs
        .get(&id)
        .cloned()
        .ok_or_else(|| format!("{what} must be a sequence, got a tensor"))
}

/// A scalar position known at import time, normalized against `len` (`-len..=len` when
/// `insert`, else `-len..len`).
fn position(cx: &Ctx, id: NodeId, len: usize, insert: bool) -> R<usize> {
    let v = cx.const_i64s(id, "position")?;
    let [p] = v[..] else {
        return Err(format!("position must hold one value, got {}", v.len()));
    };
    let l = len as i64;
    let q = if p < 0 { p + l } else { p };
    let hi = if insert { l } else { l - 1 };
    if q < 0 || q > hi {
        return Err(format!("position {p} out of range for a sequence of {len}"));
    }
    Ok(q as usize)
}

/// ONNX SequenceConstruct: the inputs, in order.
pub fn sequence_construct(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let elems = (0..n.n_inputs()).map(|i| n.inp(i)).collect::<R<Vec<_>>>()?;
    Ok(vec![new_seq(cx, elems)])
}

/// ONNX SequenceEmpty: an empty sequence.
pub fn sequence_empty(cx: &mut Ctx, _n: &ONode) -> R<Vec<NodeId>> {
    Ok(vec![new_seq(cx, vec![])])
}

/// ONNX SequenceAt: element `position` (negative counts from the end).
pub fn sequence_at(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    let p = position(cx, n.inp(1)?, s.len(), false)?;
    Ok(vec![s[p]])
}

/// ONNX SequenceInsert: `tensor` inserted at `position` (default: at the end).
pub fn sequence_insert(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let mut s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    let t = n.inp(1)?;
    let p = match n.opt(2) {
        Some(p) => position(cx, p, s.len(), true)?,
        None => s.len(),
    };
    s.insert(p, t);
    Ok(vec![new_seq(cx, s)])
}

/// ONNX SequenceErase: the sequence without element `position` (default: the last).
pub fn sequence_erase(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let mut s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    if s.is_empty() {
        return Err("cannot erase from an empty sequence".into());
    }
    let p = match n.opt(1) {
        Some(p) => position(cx, p, s.len(), false)?,
        None => s.len() - 1,
    };
    s.remove(p);
    Ok(vec![new_seq(cx, s)])
}

/// ONNX SequenceLength: an int64 scalar.
pub fn sequence_length(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    Ok(vec![cx.scalar(DType::I64, s.len() as f64)])
}

/// ONNX ConcatFromSequence: Concat along `axis`, or stack along a new `axis` with
/// `new_axis = 1` (then `axis` may be `rank`).
pub fn concat_from_sequence(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    let Some(&first) = s.first() else {
        return Err("cannot concatenate an empty sequence".into());
    };
    let new_axis = n.i("new_axis", 0)? != 0;
    let rank = cx.rank(first) + new_axis as usize;
    let axis = norm_axis(n.i("axis", 0)?, rank)?;
    let mut parts = Vec::with_capacity(s.len());
    for &x in &s {
        if new_axis {
            let mut d = cx.dims(x);
            if axis > d.len() {
                return Err(format!("axis {axis} out of range for {}", cx.shape(x)));
            }
            d.insert(axis, 1);
            parts.push(cx.reshape(x, d)?);
        } else {
            parts.push(x);
        }
    }
    if parts.len() == 1 {
        return Ok(vec![parts[0]]);
    }
    Ok(vec![cx.add(Op::Concat { axis }, parts)?])
}

/// ONNX SplitToSequence: `split` (input 1) a scalar chunk length (the last chunk may be
/// shorter) or a list of lengths; without it, chunks of 1, squeezed unless `keepdims = 1`
/// (the default).
pub fn split_to_sequence(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    let axis = norm_axis(n.i("axis", 0)?, d.len())?;
    let len = d[axis];
    let (sizes, squeeze) = match n.opt(1) {
        None => (vec![1; len], n.i("keepdims", 1)? == 0),
        Some(sp) => {
            let v = cx.const_i64s(sp, "split")?;
            let sizes: Vec<usize> = if cx.rank(sp) == 0 {
                let c = v[0];
                if c <= 0 {
                    return Err(format!("split {c} must be positive"));
                }
                let c = c as usize;
                (0..len.div_ceil(c)).map(|k| c.min(len - k * c)).collect()
            } else {
                crate::ctx::to_usizes(&v, "split")?
            };
            if sizes.iter().sum::<usize>() != len {
                return Err(format!(
                    "split {sizes:?} does not sum to the axis length {len}"
                ));
            }
            (sizes, false)
        }
    };
    let mut elems = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for sz in sizes {
        let mut e = super::shape::slice_axis(cx, x, axis, start, sz)?;
        start += sz;
        if squeeze {
            let mut dd = cx.dims(e);
            dd.remove(axis);
            e = cx.reshape(e, dd)?;
        }
        elems.push(e);
    }
    Ok(vec![new_seq(cx, elems)])
}

/// ONNX Optional: an optional holding input 0, or empty without it.
pub fn optional(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let e = n.opt(0);
    Ok(vec![new_opt(cx, e)])
}

/// ONNX OptionalHasElement: a bool scalar; true for a tensor or sequence input, false for
/// an empty optional or no input.
pub fn optional_has_element(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let has = match n.opt(0) {
        None => false,
        Some(id) => cx.opts.get(&id).is_none_or(|e| e.is_some()),
    };
    Ok(vec![cx.scalar(DType::Bool, has as u8 as f64)])
}

/// ONNX OptionalGetElement: the optional's element (a tensor or sequence input is
/// returned as is); an empty optional is an error.
pub fn optional_get_element(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let id = n.inp(0)?;
    match cx.opts.get(&id) {
        None => Ok(vec![id]),
        Some(Some(e)) => Ok(vec![*e]),
        Some(None) => Err("the optional input is empty".into()),
    }
}

/// The graph outputs for value `id` named `name`: a tensor is itself, a sequence its
/// elements named `name[i]`, an optional its element's outputs (none when empty).
pub fn flatten_output(cx: &Ctx, id: NodeId, name: &str) -> Vec<(NodeId, String)> {
    if let Some(s) = cx.seqs.get(&id) {
        return s
            .iter()
            .enumerate()
            .flat_map(|(i, &e)| flatten_output(cx, e, &format!("{name}[{i}]")))
            .collect();
    }
    if let Some(o) = cx.opts.get(&id) {
        return o.map_or(vec![], |e| flatten_output(cx, e, name));
    }
    vec![(id, name.to_string())]
}

/// If with a condition known only at run time, for outputs that are sequences or
/// optionals: per element Select when both branches have the same structure.
pub fn select_values(cx: &mut Ctx, c: NodeId, x: NodeId, y: NodeId) -> R<NodeId> {
    let structure_err = || {
        "the branches give sequences/optionals of different lengths or types, so the \
         condition must be known at import time"
            .to_string()
    };
    if let (Some(a), Some(b)) = (cx.seqs.get(&x).cloned(), cx.seqs.get(&y).cloned()) {
        if a.len() != b.len() {
            return Err(structure_err());
        }
        let mut out = Vec::with_capacity(a.len());
        for (p, q) in a.into_iter().zip(b) {
            out.push(select_values(cx, c, p, q)?);
        }
        return Ok(new_seq(cx, out));
    }
    if let (Some(a), Some(b)) = (cx.opts.get(&x).copied(), cx.opts.get(&y).copied()) {
        return match (a, b) {
            (None, None) => Ok(new_opt(cx, None)),
            (Some(p), Some(q)) => {
                let e = select_values(cx, c, p, q)?;
                Ok(new_opt(cx, Some(e)))
            }
            _ => Err(structure_err()),
        };
    }
    let special = |id: NodeId| cx.seqs.contains_key(&id) || cx.opts.contains_key(&id);
    if special(x) || special(y) {
        return Err(structure_err());
    }
    if cx.shape(x) != cx.shape(y) {
        return Err(format!(
            "the condition depends on runtime data and the branches' outputs differ ({} vs {})",
            cx.shape(x),
            cx.shape(y)
        ));
    }
    cx.add(Op::Select, vec![c, x, y])
}

/// ONNX SequenceMap (opset 17): the `body` graph applied to each position `i` of the input
/// sequence, unrolled; a sequence among the additional inputs gives its element `i` (it must
/// have the same length), a tensor is passed whole. Each body output becomes a sequence.
pub fn sequence_map(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let body = n
        .attr("body")
        .and_then(|a| a.g.as_ref())
        .ok_or("graph attribute body is required")?;
    let s = seq_of(cx, n.inp(0)?, "input_sequence")?;
    let extra: Vec<NodeId> = (1..n.n_inputs()).map(|i| n.inp(i)).collect::<R<_>>()?;
    let mut outs: Vec<Vec<NodeId>> = vec![vec![]; body.output.len()];
    for (i, &e) in s.iter().enumerate() {
        let mut ins = vec![e];
        for &x in &extra {
            ins.push(match cx.seqs.get(&x) {
                Some(xs) if xs.len() == s.len() => xs[i],
                Some(xs) => {
                    return Err(format!(
                        "an additional input sequence has {} elements, the input sequence {}",
                        xs.len(),
                        s.len()
                    ))
                }
                None => x,
            });
        }
        let r = super::control::lower_iteration(cx, n, body, &ins, i as u64)?;
        for (k, id) in r.into_iter().enumerate() {
            outs[k].push(id);
        }
    }
    Ok(outs.into_iter().map(|o| new_seq(cx, o)).collect())
}
