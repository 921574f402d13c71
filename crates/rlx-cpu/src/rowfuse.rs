//! Row fusion for the CPU executor: Softmax, RMSNorm and LayerNorm over the last axis, each
//! run as one pass per row.
//!
//! **Softmax.** rlx-compile lowers an ONNX Softmax over the
//! last axis into five primitives (`rlx_compile::decompose`), each a pass over the whole
//! tensor with its own buffer:
//!
//! ```text
//! m = ReduceMax(x, [last], keepdims)   d = Sub(x, m)   e = Exp(d)
//! s = ReduceSum(e, [last], keepdims)   y = Div(e, s)
//! ```
//!
//! Here the five run as one pass per row, on the row while it is in L1, with the same row
//! kernels and the same f32 expressions as the unfused ops (the max of
//! `reduce::extreme_f32`, `x - m`, `fastmath::exp_slice`, the f64 row sum of
//! `reduce::sum_f32` rounded to f32, `e / s`): the same bits (tests/row_fusion.rs checks them;
//! NaN aside: with two different NaN payloads in a row, which one survives may differ,
//! since LLVM may commute an `fadd` or `fmul` in either copy).
//! Attention layers spend a large share of a small transformer's time in them (qwen3 at 128
//! tokens: ~14% of the profile).
//!
//! **RMSNorm** as torch exports it (Qwen3, Llama): `Pow(x, 2)`, `ReduceMean(·, [last],
//! keepdims)`, `Add(·, eps)`, `Sqrt`, `Div(c, ·)` (c = 1), `Mul(x, ·)`, then optionally
//! `Mul(w, ·)` with a constant weight `w` along the last axis: seven ops per norm, nine norms
//! in a 2-layer Qwen3. Fused: the row's sum of `x*x` in f64 (`reduce::sum_f32`'s lanes),
//! then the same f32 expressions per row and per element (`reduce::rms_rows_f32`), so the
//! same bits (tests/row_fusion.rs).
//!
//! **LayerNorm** as rlx-compile lowers ONNX LayerNormalization over the last axis:
//! `ReduceMean(x)`, `xc = Sub(x, ·)`, `Mul(xc, xc)`, `ReduceMean`, `Add(·, eps)`, `Sqrt`,
//! `Div(xc, ·)`, `Mul(·, scale)` and optionally `Add(·, bias)`, with constant scale and bias
//! along the last axis (`reduce::layer_norm_rows_f32`, same bits).
//!
//! As for conv groups (`crate::fuse`), the graph is not rewritten and the executor decides
//! per run: fused without hooks; with a NaN/Inf scanner, a Softmax is fused when `max(x) -
//! min(x)` is finite (then every `d` is finite, `e` lies in [0, 1], `s` in [1, n] and `y` in
//! [0, 1]: every member's value is finite) and a norm when its kernel saw every value
//! finite, else the group is replayed op by op so that the report names the op that made
//! the value; with hooks, unfused.

use rlx_ir::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceKind, Tensor, TensorData, UnaryOp};
use std::sync::atomic::{AtomicU32, Ordering};

/// One fused row group; it runs at the place of its first node (whose input 0 is `x`), and
/// its last member's value is its output.
#[derive(Debug)]
pub(crate) enum RowGroup {
    /// A decomposed Softmax: the ReduceMax, then Sub, Exp, ReduceSum, Div.
    Softmax { members: [NodeId; 4] },
    /// A decomposed RMSNorm: the `Pow(x, 2)`, then ReduceMean, Add, Sqrt, Div, Mul and
    /// maybe the weight's Mul (`weight`, one value per element of a row).
    RmsNorm {
        members: Vec<NodeId>,
        eps: f32,
        num: f32,
        weight: Option<Vec<f32>>,
    },
    /// A decomposed LayerNorm: the ReduceMean of `x`, then Sub, Mul, ReduceMean, Add, Sqrt,
    /// Div, the scale's Mul and maybe the bias's Add.
    LayerNorm {
        members: Vec<NodeId>,
        eps: f32,
        scale: Vec<f32>,
        bias: Option<Vec<f32>>,
    },
}

impl RowGroup {
    /// The nodes after the first one.
    pub fn members(&self) -> &[NodeId] {
        match self {
            RowGroup::Softmax { members } => members,
            RowGroup::RmsNorm { members, .. } => members,
            RowGroup::LayerNorm { members, .. } => members,
        }
    }

    /// The node whose value the group computes.
    pub fn output(&self) -> NodeId {
        *self.members().last().expect("a group has members")
    }
}

/// The row fusion plan of one graph.
#[derive(Debug, Default)]
pub(crate) struct RowFusions {
    pub groups: Vec<RowGroup>,
    /// Per node: the group whose ReduceMax it is.
    pub at: Vec<Option<usize>>,
    /// Per node: the group whose other members it belongs to.
    pub member_of: Vec<Option<usize>>,
}

/// Find the decomposed Softmaxes of `g` over the last axis of a static f32 tensor whose
/// intermediates are read by nothing else and are not graph outputs. `consumers[i]` lists
/// the nodes reading node i (one entry per use).
pub(crate) fn plan(g: &Graph, consumers: &[Vec<NodeId>], is_output: &[bool]) -> RowFusions {
    let n = g.len();
    let mut out = RowFusions {
        groups: vec![],
        at: vec![None; n],
        member_of: vec![None; n],
    };
    for node in &g.nodes {
        let grp = softmax_at(g, node.id, consumers, is_output)
            .map(|members| RowGroup::Softmax { members })
            .or_else(|| rms_norm_at(g, node.id, consumers, is_output))
            .or_else(|| layer_norm_at(g, node.id, consumers, is_output));
        if let Some(grp) = grp {
            let k = out.groups.len();
            out.at[node.id.index()] = Some(k);
            for m in grp.members() {
                out.member_of[m.index()] = Some(k);
            }
            out.groups.push(grp);
        }
    }
    out
}

/// Whether `x` can feed a row group: f32 of static dims, rank at least 1, and rows that are
/// not empty (a reduction over an empty row gives its identity, -inf for ReduceMax and NaN
/// for ReduceMean, which the fused kernels would neither compute nor report).
fn row_input(x: &rlx_ir::Shape) -> bool {
    x.dtype == DType::F32
        && x.rank() > 0
        && x.dims.iter().all(|d| matches!(d, Dim::Static(_)))
        && x.dims.last() != Some(&Dim::Static(0))
}

/// The Sub, Exp, ReduceSum and Div of a decomposed Softmax whose ReduceMax is `max`.
fn softmax_at(
    g: &Graph,
    max: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<[NodeId; 4]> {
    let node = g.node(max);
    let &[x] = node.inputs.as_slice() else {
        return None;
    };
    let xs = &g.node(x).shape;
    let rank = xs.rank();
    let last_axis = |op: &Op, want: ReduceKind| {
        matches!(op, Op::Reduce { kind, axes, keepdims: true }
            if *kind == want && axes.as_slice() == [rank - 1])
    };
    if !row_input(xs) || !last_axis(&node.op, ReduceKind::Max) {
        return None;
    }
    // Each intermediate has exactly the consumers named, and is not a graph output.
    let only = |id: NodeId, want: &[NodeId]| {
        !is_output[id.index()] && {
            let mut c = consumers[id.index()].clone();
            c.sort();
            let mut w = want.to_vec();
            w.sort();
            c == w
        }
    };
    let &[sub] = consumers[max.index()].as_slice() else {
        return None;
    };
    let is = |id: NodeId, op: &Op, ins: &[NodeId]| {
        let n = g.node(id);
        &n.op == op && n.inputs.as_slice() == ins && n.shape == *xs
    };
    if !is(sub, &Op::Binary(BinaryOp::Sub), &[x, max]) || !only(max, &[sub]) {
        return None;
    }
    let &[exp] = consumers[sub.index()].as_slice() else {
        return None;
    };
    if !is(exp, &Op::Unary(UnaryOp::Exp), &[sub]) || !only(sub, &[exp]) {
        return None;
    }
    let [c0, c1] = consumers[exp.index()].as_slice() else {
        return None;
    };
    let (sum, div) = if matches!(g.node(*c0).op, Op::Reduce { .. }) {
        (*c0, *c1)
    } else {
        (*c1, *c0)
    };
    let sum_node = g.node(sum);
    if !last_axis(&sum_node.op, ReduceKind::Sum)
        || sum_node.inputs.as_slice() != [exp]
        || sum_node.shape != node.shape
        || !only(exp, &[sum, div])
        || !only(sum, &[div])
        || !is(div, &Op::Binary(BinaryOp::Div), &[exp, sum])
    {
        return None;
    }
    Some([sub, exp, sum, div])
}

/// The scalar value of constant node `id` when it is an f32 of one element.
fn scalar_f32(g: &Graph, id: NodeId) -> Option<f32> {
    match &g.node(id).op {
        Op::Constant(t) if t.numel() == 1 => t.as_f32().map(|v| v[0]),
        _ => None,
    }
}

/// The members of a decomposed RMSNorm whose `Pow(x, 2)` is `pow` (see the module docs).
fn rms_norm_at(
    g: &Graph,
    pow: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<RowGroup> {
    let node = g.node(pow);
    let &[x, two] = node.inputs.as_slice() else {
        return None;
    };
    let xs = &g.node(x).shape;
    let rank = xs.rank();
    if node.op != Op::Binary(BinaryOp::Pow)
        || scalar_f32(g, two) != Some(2.0)
        || !row_input(xs)
        || node.shape != *xs
    {
        return None;
    }
    let n = *xs.dims_usize().last()?;
    // `id`'s single consumer, when `id` is not a graph output.
    let next = |id: NodeId| match consumers[id.index()].as_slice() {
        [c] if !is_output[id.index()] => Some(*c),
        _ => None,
    };
    let row = g.node(pow).shape.clone();
    let mean = next(pow)?;
    let mn = g.node(mean);
    let mean_ok = matches!(&mn.op, Op::Reduce { kind: ReduceKind::Mean, axes, keepdims: true }
        if axes.as_slice() == [rank - 1]);
    if !mean_ok || mn.inputs.as_slice() != [pow] {
        return None;
    }
    let rs = mn.shape.clone();
    let add = next(mean)?;
    let an = g.node(add);
    let eps = match an.inputs.as_slice() {
        [m, e] if *m == mean && an.op == Op::Binary(BinaryOp::Add) && an.shape == rs => {
            scalar_f32(g, *e)?
        }
        _ => return None,
    };
    let sqrt = next(add)?;
    let sn = g.node(sqrt);
    if sn.op != Op::Unary(UnaryOp::Sqrt) || sn.inputs.as_slice() != [add] || sn.shape != rs {
        return None;
    }
    let div = next(sqrt)?;
    let dn = g.node(div);
    let num = match dn.inputs.as_slice() {
        [c, s] if *s == sqrt && dn.op == Op::Binary(BinaryOp::Div) && dn.shape == rs => {
            scalar_f32(g, *c)?
        }
        _ => return None,
    };
    let mul = next(div)?;
    let mu = g.node(mul);
    if mu.op != Op::Binary(BinaryOp::Mul) || mu.inputs.as_slice() != [x, div] || mu.shape != row {
        return None;
    }
    let mut members = vec![mean, add, sqrt, div, mul];
    // The weight: `Mul(w, y)` with a constant `w` of one value per row element.
    let mut weight = None;
    if let Some(wm) = next(mul) {
        let wn = g.node(wm);
        if let (Op::Binary(BinaryOp::Mul), [w, y]) = (&wn.op, wn.inputs.as_slice()) {
            if *y == mul && wn.shape == row {
                weight = row_constant(g, *w, n, rank);
                if weight.is_some() {
                    members.push(wm);
                }
            }
        }
    }
    Some(RowGroup::RmsNorm {
        members,
        eps,
        num,
        weight,
    })
}

/// The values of constant node `id` when it is f32 with `n` elements along the last of
/// `rank` axes (its other dims 1).
fn row_constant(g: &Graph, id: NodeId, n: usize, rank: usize) -> Option<Vec<f32>> {
    let Op::Constant(t) = &g.node(id).op else {
        return None;
    };
    let d = t.dims();
    let along_last =
        d.last() == Some(&n) && d.len() <= rank && d[..d.len() - 1].iter().all(|&k| k == 1);
    along_last
        .then(|| t.as_f32().map(<[f32]>::to_vec))
        .flatten()
}

/// The members of a decomposed LayerNorm whose first ReduceMean is `mean` (see the module
/// docs).
fn layer_norm_at(
    g: &Graph,
    mean: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<RowGroup> {
    let node = g.node(mean);
    let &[x] = node.inputs.as_slice() else {
        return None;
    };
    let xs = &g.node(x).shape;
    let rank = xs.rank();
    let last_mean = |op: &Op| {
        matches!(op, Op::Reduce { kind: ReduceKind::Mean, axes, keepdims: true }
            if axes.as_slice() == [rank - 1])
    };
    if !row_input(xs) || !last_mean(&node.op) {
        return None;
    }
    let n = *xs.dims_usize().last()?;
    let rs = node.shape.clone();
    let users = |id: NodeId| (!is_output[id.index()]).then(|| consumers[id.index()].as_slice());
    let is = |id: NodeId, op: Op, ins: &[NodeId], shape: &rlx_ir::Shape| {
        let nd = g.node(id);
        nd.op == op && nd.inputs.as_slice() == ins && nd.shape == *shape
    };
    let &[sub] = users(mean)? else {
        return None;
    };
    if !is(sub, Op::Binary(BinaryOp::Sub), &[x, mean], xs) {
        return None;
    }
    // xc is read twice by its square and once by the Div.
    let [a, b, c] = users(sub)? else {
        return None;
    };
    let (sq, div) = match (a == b, b == c) {
        (true, false) => (*a, *c),
        (false, true) => (*b, *a),
        _ if a == c => (*a, *b),
        _ => return None,
    };
    if !is(sq, Op::Binary(BinaryOp::Mul), &[sub, sub], xs) {
        return None;
    }
    let &[var] = users(sq)? else {
        return None;
    };
    if !last_mean(&g.node(var).op) || !is(var, g.node(var).op.clone(), &[sq], &rs) {
        return None;
    }
    let &[add] = users(var)? else {
        return None;
    };
    let eps = match g.node(add).inputs.as_slice() {
        [v, e] if *v == var && is(add, Op::Binary(BinaryOp::Add), &[var, *e], &rs) => {
            scalar_f32(g, *e)?
        }
        _ => return None,
    };
    let &[sqrt] = users(add)? else {
        return None;
    };
    let &[d] = users(sqrt)? else {
        return None;
    };
    if !is(sqrt, Op::Unary(UnaryOp::Sqrt), &[add], &rs)
        || d != div
        || !is(div, Op::Binary(BinaryOp::Div), &[sub, sqrt], xs)
    {
        return None;
    }
    let &[mul] = users(div)? else {
        return None;
    };
    let scale = match g.node(mul).inputs.as_slice() {
        [v, w] if *v == div && is(mul, Op::Binary(BinaryOp::Mul), &[div, *w], xs) => {
            row_constant(g, *w, n, rank)?
        }
        _ => return None,
    };
    let mut members = vec![sub, sq, var, add, sqrt, div, mul];
    let mut bias = None;
    if let Some(&[ba]) = users(mul) {
        if let [v, b] = g.node(ba).inputs.as_slice() {
            if *v == mul && is(ba, Op::Binary(BinaryOp::Add), &[mul, *b], xs) {
                if let Some(bv) = row_constant(g, *b, n, rank) {
                    bias = Some(bv);
                    members.push(ba);
                }
            }
        }
    }
    Some(RowGroup::LayerNorm {
        members,
        eps,
        scale,
        bias,
    })
}

/// The value of group `grp` (found by [`plan`]) on input `x`; with `scan`, None unless every
/// member's value is finite (the caller then replays the group op by op).
///
/// Errors: `x` not f32 (the plan admits only f32 groups).
pub(crate) fn run(
    grp: &RowGroup,
    x: &Tensor,
    scan: bool,
) -> Result<Option<Tensor>, crate::KernelError> {
    let TensorData::F32(v) = x.data() else {
        return Err(crate::KernelError::Invalid(
            "fused row group: input is not f32".into(),
        ));
    };
    let n = x.dims().last().copied().unwrap_or(1);
    // A Softmax is checked on its input: when `max(x) - min(x)` is finite in f32, every
    // `x - max_row` is (its magnitude is at most that spread), and then so is every
    // member's value; a NaN or an inf in `x` makes the spread non-finite. One vector pass
    // over the tensor (a per-row check cost 30% of the kernel on rows of 16), and masks of
    // -3.4e38 (torch's finfo.min) stay fused.
    if scan
        && matches!(grp, RowGroup::Softmax { .. })
        && !rlx_kernels::kernels::reduce::spread_f32(v).is_finite()
    {
        return Ok(None);
    }
    // Every element is written below (the rows cover it).
    let mut out: Vec<f32> = rlx_kernels::buffers::overwritten(v.len());
    // The norms' figure: below 0x7f80_0000 when every value is finite.
    let max_bits = AtomicU32::new(0);
    if n > 0 {
        // Blocks of whole rows, about 4096 elements each (one ISA dispatch per block).
        let block = n * (4096 / n).max(1);
        rlx_kernels::kernels::fill_chunks(&mut out, block, |b, dst| {
            let src = &v[b * block..b * block + dst.len()];
            use rlx_kernels::kernels::reduce::{layer_norm_rows_f32, rms_rows_f32, softmax_rows};
            let bits = match grp {
                RowGroup::Softmax { .. } => {
                    softmax_rows(src, dst, n);
                    0
                }
                RowGroup::RmsNorm {
                    eps, num, weight, ..
                } => rms_rows_f32(src, dst, n, *eps, *num, weight.as_deref(), scan),
                RowGroup::LayerNorm {
                    eps, scale, bias, ..
                } => layer_norm_rows_f32(src, dst, n, *eps, scale, bias.as_deref(), scan),
            };
            max_bits.fetch_max(bits, Ordering::Relaxed);
        });
    }
    if scan && max_bits.into_inner() >= 0x7f80_0000 {
        rlx_kernels::buffers::give(TensorData::F32(out));
        return Ok(None);
    }
    Ok(Some(rlx_kernels::kernels::make(
        x.dims(),
        TensorData::F32(out),
    )?))
}
