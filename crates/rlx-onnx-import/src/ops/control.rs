//! Control flow, lowered at import time (the IR has no control flow):
//!
//! * `If` with a condition known at import time inlines the taken branch; otherwise both
//!   branches are lowered and each output is a `Select` on the condition (the branches'
//!   outputs must then have the same types);
//! * `Loop` with a trip count and condition known at import time (and a body whose
//!   `cond_out` folds) is unrolled; scan outputs are stacked along a new axis 0;
//! * `Scan` (opset 9+) is unrolled over the scan axis.
//!
//! Subgraphs see every outer-scope value; their nodes keep their own ONNX names as origin.
//! A node lowered in iteration `i` of an unrolled Loop / Scan (or SequenceMap) also gets
//! `(loop node, i)` appended to its origin's iteration path (`Origin::iteration`, outermost
//! first), so reports tell the unrolled copies of one body node apart; an If's branches
//! inherit the path of the If.

use crate::ctx::{norm_axis, Ctx, ONode, R};
use crate::proto::GraphProto;
use rlx_ir::{DType, LoopIteration, NodeId, Op, Origin, Tensor, TensorData};

/// Most iterations an unrolled Loop / Scan may have.
const MAX_UNROLL: i64 = 4096;

fn graph_attr<'n>(n: &ONode<'n>, name: &str) -> R<&'n GraphProto> {
    n.attr(name)
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| format!("graph attribute {name} is required"))
}

/// Lower subgraph `g` with its formal inputs bound to `inputs`; returns its outputs.
/// Outer-scope values stay visible; names the subgraph defines are dropped afterwards.
/// The subgraph's nodes inherit the iteration path of `n` (an If's branch, a function-like
/// attribute); a loop's body goes through [`lower_iteration`].
pub(crate) fn lower_body(
    cx: &mut Ctx,
    n: &ONode,
    g: &GraphProto,
    inputs: &[NodeId],
) -> R<Vec<NodeId>> {
    lower_body_at(cx, n, g, inputs, None)
}

/// [`lower_body`] for iteration `i` (0-based) of the loop `n` (Loop, Scan, SequenceMap):
/// every node lowered from `g` has `(n's label, n's op type, i)` appended to its origin's
/// iteration path.
pub(crate) fn lower_iteration(
    cx: &mut Ctx,
    n: &ONode,
    g: &GraphProto,
    inputs: &[NodeId],
    i: u64,
) -> R<Vec<NodeId>> {
    lower_body_at(cx, n, g, inputs, Some(i))
}

fn lower_body_at(
    cx: &mut Ctx,
    n: &ONode,
    g: &GraphProto,
    inputs: &[NodeId],
    iteration: Option<u64>,
) -> R<Vec<NodeId>> {
    if g.input.len() != inputs.len() {
        return Err(format!(
            "subgraph {} takes {} inputs, {} given",
            g.name,
            g.input.len(),
            inputs.len()
        ));
    }
    let saved_values = cx.values.clone();
    let saved_origin = cx.g.current_origin().cloned();
    // The enclosing node's path (it is the current origin while it lowers), plus this loop.
    let mut path = saved_origin
        .as_ref()
        .map(|o| o.iteration.clone())
        .unwrap_or_default();
    if let Some(i) = iteration {
        path.push(LoopIteration {
            node: crate::onnx_node_label(n.proto),
            op_type: n.proto.op_type.clone(),
            iteration: i,
        });
    }
    let r = lower_body_inner(cx, n, g, inputs, &path);
    cx.values = saved_values;
    cx.g.set_current_origin(saved_origin);
    r
}

fn lower_body_inner(
    cx: &mut Ctx,
    n: &ONode,
    g: &GraphProto,
    inputs: &[NodeId],
    path: &[LoopIteration],
) -> R<Vec<NodeId>> {
    for (vi, &id) in g.input.iter().zip(inputs) {
        cx.values.insert(vi.name.clone(), id);
    }
    for t in &g.initializer {
        let tensor = crate::tensor::tensor_from_proto(t, cx.base_dir)
            .map_err(|e| format!("subgraph initializer \"{}\": {e}", t.name))?;
        let id = cx.constant(tensor);
        cx.values.insert(t.name.clone(), id);
    }
    for node in &g.node {
        let label = crate::onnx_node_label(node);
        let err = |m: String| format!("in subgraph node \"{label}\" ({}): {m}", node.op_type);
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let lower = if default_domain {
            super::lookup(&node.op_type)
        } else {
            super::lookup_in(&node.domain, &node.op_type)
        };
        let Some(lower) = lower else {
            return Err(err(format!("unsupported op {}", node.op_type)));
        };
        let mut ins = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                ins.push(None);
                continue;
            }
            let id = cx
                .values
                .get(name)
                .copied()
                .ok_or_else(|| err(format!("input \"{name}\" is not defined")))?;
            ins.push(Some(id));
        }
        super::check_tensor_inputs(cx, &node.op_type, &ins).map_err(err)?;
        cx.g.set_current_origin(Some(Origin {
            label: label.clone(),
            op_type: Some(node.op_type.clone()),
            iteration: path.to_vec(),
            ..Default::default()
        }));
        let on = ONode {
            proto: node,
            inputs: ins,
            opset: n.opset,
        };
        let outs = lower(cx, &on).map_err(err)?;
        for (i, out) in node.output.iter().enumerate() {
            if out.is_empty() {
                continue;
            }
            let id = outs
                .get(i)
                .copied()
                .ok_or_else(|| err(format!("output {i} (\"{out}\") is not supported")))?;
            cx.values.insert(out.clone(), id);
        }
    }
    g.output
        .iter()
        .map(|o| {
            cx.values
                .get(&o.name)
                .copied()
                .ok_or_else(|| format!("subgraph output \"{}\" is not produced", o.name))
        })
        .collect()
}

/// The truth value of a constant condition.
fn const_bool(cx: &Ctx, id: NodeId) -> Option<bool> {
    let t = cx.const_tensor(id)?;
    if t.numel() != 1 {
        return None;
    }
    Some(t.data().get_f64(0) != 0.0)
}

/// ONNX If.
pub fn if_(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let c = n.inp(0)?;
    let then_g = graph_attr(n, "then_branch")?;
    let else_g = graph_attr(n, "else_branch")?;
    if let Some(v) = const_bool(cx, c) {
        return lower_body(cx, n, if v { then_g } else { else_g }, &[]);
    }
    if cx.dims(c).iter().product::<usize>() != 1 {
        return Err(format!("cond must hold one value, got {}", cx.shape(c)));
    }
    let a = lower_body(cx, n, then_g, &[])?;
    let b = lower_body(cx, n, else_g, &[])?;
    if a.len() != b.len() {
        return Err(format!(
            "then_branch gives {} outputs, else_branch {}",
            a.len(),
            b.len()
        ));
    }
    let c = cx.reshape(c, vec![])?;
    let c = cx.cast(c, DType::Bool)?;
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| super::seq::select_values(cx, c, x, y))
        .collect()
}

/// Stack same-typed tensors along a new axis `axis`.
fn stack(cx: &mut Ctx, xs: &[NodeId], axis: usize) -> R<NodeId> {
    let mut parts = Vec::with_capacity(xs.len());
    for &x in xs {
        let mut d = cx.dims(x);
        if axis > d.len() {
            return Err(format!(
                "scan output axis {axis} out of range for {}",
                cx.shape(x)
            ));
        }
        d.insert(axis, 1);
        parts.push(cx.reshape(x, d)?);
    }
    if parts.len() == 1 {
        return Ok(parts[0]);
    }
    cx.add(Op::Concat { axis }, parts)
}

/// ONNX Loop, unrolled: the trip count `M` and `cond` (when given) must be known at import
/// time, and so must the body's `cond_out` when `cond` is given.
pub fn loop_(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let body = graph_attr(n, "body")?;
    let trip = match n.opt(0) {
        Some(m) => Some(
            *cx.const_i64s(m, "trip count M")?
                .first()
                .ok_or("trip count M is empty")?,
        ),
        None => None,
    };
    let mut cond = match n.opt(1) {
        Some(c) => Some(
            const_bool(cx, c).ok_or("cond must be known at import time (the loop is unrolled)")?,
        ),
        None => None,
    };
    if trip.is_none() && cond.is_none() {
        return Err("a Loop with neither trip count nor condition never ends".into());
    }
    let mut vs: Vec<NodeId> = (2..n.n_inputs()).map(|i| n.inp(i)).collect::<R<_>>()?;
    let nv = vs.len();
    let n_scan = body.output.len().saturating_sub(1 + nv);
    let mut scans: Vec<Vec<NodeId>> = vec![Vec::new(); n_scan];
    let mut i = 0i64;
    while cond.unwrap_or(true) && trip.is_none_or(|t| i < t) {
        if i >= MAX_UNROLL {
            return Err(format!("more than {MAX_UNROLL} iterations to unroll"));
        }
        let it =
            cx.constant(Tensor::new(vec![], TensorData::I64(vec![i])).map_err(|e| e.to_string())?);
        let cv = cx.scalar(DType::Bool, cond.unwrap_or(true) as u8 as f64);
        let mut ins = vec![it, cv];
        ins.extend(&vs);
        let outs = lower_iteration(cx, n, body, &ins, i as u64)?;
        if outs.len() != 1 + nv + n_scan {
            return Err(format!(
                "body gives {} outputs, expected {}",
                outs.len(),
                1 + nv + n_scan
            ));
        }
        if cond.is_some() {
            cond = Some(const_bool(cx, outs[0]).ok_or(
                "the body's cond_out depends on runtime data; the loop cannot be unrolled",
            )?);
        }
        vs = outs[1..1 + nv].to_vec();
        for (k, s) in scans.iter_mut().enumerate() {
            s.push(outs[1 + nv + k]);
        }
        i += 1;
    }
    let mut res = vs;
    for (k, s) in scans.into_iter().enumerate() {
        if s.is_empty() {
            // Zero iterations: an empty stack of the body's declared element type.
            let (dt, dims) = body
                .output
                .get(1 + nv + k)
                .and_then(crate::declared_static)
                .ok_or("a scan output of a Loop that runs zero times needs the body to declare its element shape")?;
            res.push(cx.constant(crate::empty_scan_output(dt, &dims)?));
            continue;
        }
        res.push(stack(cx, &s, 0)?);
    }
    Ok(res)
}

/// Element `idx` of axis `axis`, with the axis removed.
fn take(cx: &mut Ctx, x: NodeId, axis: usize, idx: usize) -> R<NodeId> {
    let d = cx.dims(x);
    let mut starts = vec![0; d.len()];
    let mut sizes = d.clone();
    starts[axis] = idx;
    sizes[axis] = 1;
    let s = cx.add(
        Op::Slice {
            starts,
            steps: vec![1; d.len()],
            sizes,
        },
        vec![x],
    )?;
    let mut out = d;
    out.remove(axis);
    cx.reshape(s, out)
}

/// Scan attributes resolved for one (unbatched) run.
struct ScanSpec {
    in_axes: Vec<usize>,
    in_dirs: Vec<i64>,
    out_axes: Vec<i64>,
    out_dirs: Vec<i64>,
}

/// Run the Scan body over the scan axis of `xs`, carrying `states`; returns the final
/// states then the stacked scan outputs.
fn scan_run(
    cx: &mut Ctx,
    n: &ONode,
    body: &GraphProto,
    mut states: Vec<NodeId>,
    xs: &[NodeId],
    sp: &ScanSpec,
) -> R<Vec<NodeId>> {
    let ns = states.len();
    let k = sp.out_axes.len();
    if xs.is_empty() || sp.in_axes.len() != xs.len() {
        return Err(format!(
            "a Scan needs num_scan_inputs >= 1 scan inputs, each with an axis ({} inputs, {} axes)",
            xs.len(),
            sp.in_axes.len()
        ));
    }
    if let Some((x, a)) = xs
        .iter()
        .zip(&sp.in_axes)
        .find(|(&x, &a)| a >= cx.dims(x).len())
    {
        return Err(format!(
            "scan axis {a} is out of range for scan input {}",
            cx.shape(*x)
        ));
    }
    let len = cx.dims(xs[0])[sp.in_axes[0]];
    if xs
        .iter()
        .zip(&sp.in_axes)
        .any(|(&x, &a)| cx.dims(x)[a] != len)
    {
        return Err("scan inputs have different sequence lengths".into());
    }
    if len as i64 > MAX_UNROLL {
        return Err(format!("more than {MAX_UNROLL} iterations to unroll"));
    }
    let mut scans: Vec<Vec<NodeId>> = vec![Vec::new(); k];
    for t in 0..len {
        let mut b_in = states.clone();
        for (j, &x) in xs.iter().enumerate() {
            let idx = if sp.in_dirs[j] != 0 { len - 1 - t } else { t };
            b_in.push(take(cx, x, sp.in_axes[j], idx)?);
        }
        let outs = lower_iteration(cx, n, body, &b_in, t as u64)?;
        if outs.len() != ns + k {
            return Err(format!(
                "body gives {} outputs, expected {}",
                outs.len(),
                ns + k
            ));
        }
        states = outs[..ns].to_vec();
        for (j, s) in scans.iter_mut().enumerate() {
            s.push(outs[ns + j]);
        }
    }
    let mut res = states;
    for (j, mut s) in scans.into_iter().enumerate() {
        if s.is_empty() {
            return Err("a Scan over an empty sequence is not supported".into());
        }
        if sp.out_dirs[j] != 0 {
            s.reverse();
        }
        let r = cx.rank(s[0]) + 1;
        let a = norm_axis(sp.out_axes[j], r)?;
        res.push(stack(cx, &s, a)?);
    }
    Ok(res)
}

/// ONNX Scan, unrolled over the scan axis. Opset 8's batched form runs each batch entry
/// on its own (`sequence_lens`, when given, must be the full length everywhere).
pub fn scan(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let body = graph_attr(n, "body")?;
    let m = n.i("num_scan_inputs", 0)?;
    let first = if n.opset < 9 { 1 } else { 0 };
    let ins: Vec<NodeId> = (first..n.n_inputs()).map(|i| n.inp(i)).collect::<R<_>>()?;
    if m <= 0 || m as usize > ins.len() {
        return Err(format!(
            "num_scan_inputs {m} does not fit {} inputs",
            ins.len()
        ));
    }
    let m = m as usize;
    let ns = ins.len() - m;
    let (states, xs) = (ins[..ns].to_vec(), ins[ns..].to_vec());
    if xs.is_empty() {
        return Err("a Scan needs at least one scan input (num_scan_inputs >= 1)".into());
    }
    let k = body.output.len().saturating_sub(ns);
    let list = |name: &str, len: usize| -> R<Vec<i64>> {
        let v = n.ints(name)?.unwrap_or(vec![0; len]);
        if v.len() != len {
            return Err(format!("{name} needs {len} entries, got {v:?}"));
        }
        Ok(v)
    };
    if n.opset < 9 {
        let dirs = list("directions", m)?;
        let b = cx.dims(xs[0]).first().copied().ok_or_else(|| {
            format!(
                "scan input {} needs a batch axis (opset < 9)",
                cx.shape(xs[0])
            )
        })?;
        if let Some(sl) = n.opt(0) {
            let v = cx.const_i64s(sl, "sequence_lens")?;
            let full = cx.dims(xs[0]).get(1).copied().unwrap_or(0) as i64;
            if v.iter().any(|&l| l != full) {
                return Err("sequence_lens shorter than the sequence are not supported".into());
            }
        }
        let sp = ScanSpec {
            in_axes: vec![0; m],
            in_dirs: dirs,
            out_axes: vec![0; k],
            out_dirs: vec![0; k],
        };
        let mut per: Vec<Vec<NodeId>> = Vec::with_capacity(b);
        for bi in 0..b {
            let st = states
                .iter()
                .map(|&s| take(cx, s, 0, bi))
                .collect::<R<Vec<_>>>()?;
            let x = xs
                .iter()
                .map(|&x| take(cx, x, 0, bi))
                .collect::<R<Vec<_>>>()?;
            per.push(scan_run(cx, n, body, st, &x, &sp)?);
        }
        return (0..ns + k)
            .map(|j| {
                let col: Vec<NodeId> = per.iter().map(|o| o[j]).collect();
                stack(cx, &col, 0)
            })
            .collect();
    }
    let in_axes = list("scan_input_axes", m)?;
    let sp = ScanSpec {
        in_axes: xs
            .iter()
            .zip(&in_axes)
            .map(|(&x, &a)| norm_axis(a, cx.rank(x)))
            .collect::<R<_>>()?,
        in_dirs: list("scan_input_directions", m)?,
        out_axes: list("scan_output_axes", k)?,
        out_dirs: list("scan_output_directions", k)?,
    };
    scan_run(cx, n, body, states, &xs, &sp)
}
