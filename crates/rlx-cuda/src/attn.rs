//! Attention fusion: scaled-dot-product attention, as the importers and rlx-compile's
//! decompose pass leave it in the graph, runs as one flash-attention kernel (v1 style, SIMT
//! f32 math) instead of about ten launches that write and re-read the score matrix.
//!
//! **What is matched** (backwards from the second MatMul; anything else is left alone):
//!
//! ```text
//! S = MatMul(Q, B)                         B = K^T: any value [.., D, Lk], or a Transpose
//! T = Mul(S, c) | Mul(c, S) | Div(S, c)    optional; c a one-element constant
//! U = Add(T, M) | Add(M, T)                optional; M broadcasts to S's dims
//! x = ReduceMax(U, [last], keepdims)       m = x, or Select(IsInf{neg}(x), 0, x)   (masked-row-safe)
//! E = Exp(Sub(U, m))
//! y = ReduceSum(E, [last], keepdims)       s = y, or Select(Eq(y, 0), 1, y)        (masked-row-safe)
//! O = MatMul(Div(E, s), V)
//! ```
//!
//! BERT from ONNX gives the plain form (Q, K^T and V as Transposes of the head split, a Mul by
//! 1/sqrt(d), the [B,1,Lq,Lk] or [B,1,1,Lk] padding mask, rlx-compile's Softmax); the ONNX
//! Attention lowering (Qwen3 through torch.export) gives the masked-row-safe form with Q and
//! K^T scaled before the MatMul (those Muls stay outside the group) and a causal mask of -inf.
//! Every inner value (S, T, U, the max, E, the sum, P and the Selects) must have no reader
//! outside the group and not be a graph output; a Transpose operand with the MatMul as its
//! only reader is read through strides (not materialized). Batch dims broadcast as MatMul's.
//!
//! **Numerics.** Per query row: `s = Q·K` (f32, fmaf, summation order not cuBLAS's), then the
//! same roundings as the unfused nodes on the score chain (S, T and U rounded to the graph's
//! float16/bfloat16 dtype, so an overflow to ±inf happens where it happens unfused), then the
//! online softmax in f32 (running max and sum, `expf`, no fast math) and `P·V` accumulated in
//! f32; E, the sum and P are not rounded to a 16-bit dtype (PyTorch's SDPA keeps them in f32
//! too); the output is divided by the sum once and rounded to its dtype. f32 results are
//! within about 1e-5 relative of the unfused path (not bit-identical: the summation order
//! differs). IEEE special values as unfused: a NaN or +inf score anywhere in a row makes the
//! whole output row NaN; a row whose scores are all -inf gives NaN (plain softmax: 0/0) or,
//! in the masked-row-safe form, `sum_j 0 * V[j]` (0 unless V holds NaN/inf); a -inf score
//! contributes exactly `0 * V[j]`.
//!
//! **Scanning runs** (`RLX_DEBUG_NANS`) launch the counting variant `rlx_attn_cnt_<tpr>`
//! (`CudaExecutor::set_attention_scan(false)` or `RLX_CUDA_ATTN_SCAN=0`: the unfused steps).
//! It counts NaN, +inf and -inf and their first indices (in each node's own layout) of every
//! inner value the unfused graph materializes ([`Role`]) into the scan's count slots, the
//! same counts as the unfused steps. One pass over the keys as the plain kernel (online
//! softmax), computing S, T and U with the unfused roundings (the same bits) and counting
//! them per element, and U's -inf as the Sub's; per row it keeps the max of U, whether some
//! U is NaN and the least U above -inf. A row is normal when no U is NaN, the max is finite
//! and `U - max` of the least U is finite (so finite wherever U is: the rounded difference is
//! monotonic in U); then the Sub is -inf exactly where U is, E is in [0, 1], the max, the sum
//! (at least 1, at most lk) and P are finite: nothing more to count. A block with a row that
//! is not normal, or with NaN/±inf in V (where the order of the products decides between NaN
//! and inf), drops its counts and takes the two-pass path in the same launch: with the exact
//! max of U from the first pass (NaN when any U is NaN, as ReduceMax; the max does not depend
//! on the order) a second pass computes S, T and U again, `Sub(U, max)` and `Exp` with the unfused roundings, the sum, and
//! `O = sum_j E_j V_j / sum`, counting per element the score-sized values and once per row
//! the max, the sum and their Selects; P from the row's max (NaN everywhere when the max is
//! NaN or +inf, or -inf without both Selects; finite otherwise). The blocks that did are
//! counted in one more slot (`CudaExecutor::attention_scan_fallback_blocks`). Each team's
//! first thread counts its row in shared memory (only when a value is non-finite), warp 0
//! adds the block's rows with one warp-aggregated atomic per non-zero word at the end. The
//! counts equal the unfused steps' except where only the summation order decides: S
//! overflowing to ±inf (finite inputs near the dtype's max), `E_j / sum` underflowing to 0
//! (then `0 * inf` in V is NaN unfused, ±inf here), or `sum_j E_j V_j` overflowing where
//! `sum_j P_j V_j` does not. Absorbed Transposes run their own steps in scanning runs (their
//! values are scanned as unfused).
//!
//! One file over 1,000 lines: the matcher, the CUDA source of the plain and counting kernels
//! it plans for (their metadata layout, flag bits and scan slots are written on both sides)
//! and their host-side tests are read together.

use rlx_ir::{strides_of, BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};

/// Largest head dim (of Q·K and of V) the kernel takes.
pub(crate) const MAX_HEAD: usize = 128;
/// Query rows per block (`RLX_ATT_ROWS` in the kernel).
pub(crate) const ROWS: usize = 32;
/// Most batch dims (before the last two) the kernel's metadata describes.
pub(crate) const MAX_BATCH_DIMS: usize = 6;

/// How one operand is read: the node whose buffer holds it, its strides (in elements) over
/// the output's batch dims (0 where broadcast), and its row and column strides (Q: query,
/// dim; K: key, dim; V: key, dim; mask: query, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub node: NodeId,
    pub batch: Vec<i64>,
    pub row: i64,
    pub col: i64,
}

/// The score's scaling: none, `* c` or `/ c`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scale {
    None,
    Mul(f32),
    Div(f32),
}

/// Inner values of a group counted by the scanning kernel (`rlx_attn_cnt_<tpr>`), each in
/// its own six-word slot of the NaN scan, in this order: score-sized values (one count per
/// element, first index `(batch * lq + i) * lk + j`) and per-row values (one per query row,
/// first index `batch * lq + i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// S = Q K^T.
    S = 0,
    /// T = S * c or S / c.
    T,
    /// U = T + M.
    U,
    /// x = ReduceMax(U) (per row).
    Max,
    /// Select(IsInf{neg}(x), 0, x) (per row).
    SafeMax,
    /// Sub(U, max).
    Sub,
    /// Exp(Sub).
    Exp,
    /// y = ReduceSum(E) (per row).
    Sum,
    /// Select(Eq(y, 0), 1, y) (per row).
    SafeSum,
    /// P = E / sum.
    P,
}

/// Number of [`Role`]s (count slots per group in scanning runs).
pub(crate) const ROLES: usize = 10;

/// One matched attention group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AttnPlan {
    /// Inner nodes and the sink (last), in topological order.
    pub members: Vec<NodeId>,
    pub q: View,
    pub k: View,
    pub v: View,
    pub mask: Option<View>,
    pub scale: Scale,
    /// Masked-row-safe max and sum both: a row of all -inf gives `sum_j 0 * V[j]`, not NaN.
    pub zero_rows: bool,
    /// The max is `Select(IsInf{neg}(x), 0, x)`, the sum `Select(Eq(y, 0), 1, y)`.
    pub safe_max: bool,
    pub safe_sum: bool,
    /// The inner values a scanning run counts, by role (see [`Role`]); `None` where the
    /// pattern has no such node (no scale, no mask, the plain max or sum).
    pub roles: [Option<NodeId>; ROLES],
    pub dt: DType,
    /// The output's batch dims (S's dims without the last two).
    pub batch: Vec<usize>,
    pub lq: usize,
    pub lk: usize,
    pub dqk: usize,
    pub dv: usize,
}

impl AttnPlan {
    /// The sink (the second MatMul), whose buffer the kernel writes.
    pub(crate) fn sink(&self) -> NodeId {
        *self.members.last().expect("never empty")
    }

    /// Threads per query row (32 head dims each): 1, 2 or 4.
    pub(crate) fn tpr(&self) -> usize {
        match self.dqk.max(self.dv) {
            0..=32 => 1,
            33..=64 => 2,
            _ => 4,
        }
    }

    /// Kernel metadata: `[nb, dims[nb]]`, then for Q, K, V, mask, O each `[batch strides[nb],
    /// row stride, col stride]` (O contiguous: `[.., lq, dv]`).
    pub(crate) fn meta(&self) -> Vec<i64> {
        let nb = self.batch.len();
        let mut m = vec![nb as i64];
        m.extend(self.batch.iter().map(|&d| d as i64));
        let zero = View {
            node: NodeId(0),
            batch: vec![0; nb],
            row: 0,
            col: 0,
        };
        let mut od = self.batch.clone();
        od.extend([self.lq, self.dv]);
        let os: Vec<i64> = strides_of(&od).iter().map(|&s| s as i64).collect();
        let o = View {
            node: NodeId(0),
            batch: os[..nb].to_vec(),
            row: os[nb],
            col: os[nb + 1],
        };
        for vw in [
            &self.q,
            &self.k,
            &self.v,
            self.mask.as_ref().unwrap_or(&zero),
            &o,
        ] {
            m.extend(&vw.batch);
            m.extend([vw.row, vw.col]);
        }
        m
    }

    /// The kernel's flag word: bits 0-1 the scale mode (0 none, 1 mul, 2 div), bits 2-3 the
    /// dtype (0 f32, 1 bfloat16, 2 float16), bit 4 masked-row-safe.
    pub(crate) fn flags(&self) -> i32 {
        let s = match self.scale {
            Scale::None => 0,
            Scale::Mul(_) => 1,
            Scale::Div(_) => 2,
        };
        let d = match self.dt {
            DType::BF16 => 1,
            DType::F16 => 2,
            _ => 0,
        };
        s | (d << 2) | ((self.zero_rows as i32) << 4)
    }

    /// The counting kernel's flag word: [`Self::flags`], bit 5 the masked-row-safe max, bit 6
    /// the masked-row-safe sum.
    pub(crate) fn scan_flags(&self) -> i32 {
        self.flags() | ((self.safe_max as i32) << 5) | ((self.safe_sum as i32) << 6)
    }

    pub(crate) fn scale_value(&self) -> f32 {
        match self.scale {
            Scale::None => 1.0,
            Scale::Mul(c) | Scale::Div(c) => c,
        }
    }
}

/// Every attention group of `g` (see the module docs). `gpu(id)` says whether node `id` runs
/// a GPU step (a group is matched only when all its members do); groups never overlap.
pub(crate) fn plan_attention(g: &Graph, gpu: &dyn Fn(NodeId) -> bool) -> Vec<AttnPlan> {
    let mut readers: Vec<Vec<NodeId>> = vec![vec![]; g.len()];
    for n in &g.nodes {
        for &i in &n.inputs {
            readers[i.index()].push(n.id);
        }
    }
    let mut is_out = vec![false; g.len()];
    for o in &g.outputs {
        is_out[o.index()] = true;
    }
    let mut taken = vec![false; g.len()];
    let mut plans = vec![];
    for n in &g.nodes {
        if !matches!(n.op, Op::MatMul) {
            continue;
        }
        if let Some(p) = match_at(g, n.id, &readers, &is_out, gpu) {
            if p.members.iter().any(|m| taken[m.index()]) {
                continue;
            }
            for m in &p.members {
                taken[m.index()] = true;
            }
            plans.push(p);
        }
    }
    plans
}

fn dims(g: &Graph, id: NodeId) -> Vec<usize> {
    g.node(id).shape.dims_usize().to_vec()
}

/// The value of a one-element constant.
fn scalar_const(g: &Graph, id: NodeId) -> Option<f64> {
    match &g.node(id).op {
        Op::Constant(t) if t.numel() == 1 => Some(t.data().get_f64(0)),
        _ => None,
    }
}

/// Whether `op` reduces the last of `rank` axes keeping dims, with `kind`.
fn last_axis(op: &Op, kind: ReduceKind, rank: usize) -> bool {
    matches!(op, Op::Reduce { kind: k, axes, keepdims: true } if *k == kind && axes.as_slice() == [rank - 1])
}

/// The view of operand `id` with dims `[.., r, c]` over the output batch dims `ob`: the node
/// itself (contiguous), or, for a Transpose whose only reader is the MatMul, its input read
/// through permuted strides (the Transpose joins `absorbed`).
fn view_of(
    g: &Graph,
    id: NodeId,
    ob: &[usize],
    readers: &[Vec<NodeId>],
    is_out: &[bool],
    gpu: &dyn Fn(NodeId) -> bool,
    absorbed: &mut Vec<NodeId>,
) -> Option<View> {
    let node = g.node(id);
    let vd = dims(g, id);
    let r = vd.len();
    if r < 2 {
        return None;
    }
    let (buf, vs): (NodeId, Vec<usize>) = match &node.op {
        Op::Transpose { perm }
            if readers[id.index()].len() == 1
                && !is_out[id.index()]
                && gpu(id)
                && node.inputs.len() == 1 =>
        {
            let x = node.inputs[0];
            let xd = dims(g, x);
            if perm.len() != r
                || xd.len() != r
                || (0..r).any(|d| perm[d] >= r || xd[perm[d]] != vd[d])
                || g.node(x).shape.dtype != node.shape.dtype
            {
                return None;
            }
            let xs = strides_of(&xd);
            absorbed.push(id);
            (x, (0..r).map(|d| xs[perm[d]]).collect::<Vec<usize>>())
        }
        _ => (id, strides_of(&vd).to_vec()),
    };
    let vb = &vd[..r - 2];
    if vb.len() > ob.len() {
        return None;
    }
    let off = ob.len() - vb.len();
    let mut batch = Vec::with_capacity(ob.len());
    for (a, &o) in ob.iter().enumerate() {
        let s = if a < off {
            0
        } else {
            let d = vb[a - off];
            if d == 1 {
                0
            } else if d == o {
                vs[a - off] as i64
            } else {
                return None;
            }
        };
        batch.push(s);
    }
    Some(View {
        node: buf,
        batch,
        row: vs[r - 2] as i64,
        col: vs[r - 1] as i64,
    })
}

/// The group whose sink is MatMul `o`, if the pattern matches (see the module docs).
fn match_at(
    g: &Graph,
    o: NodeId,
    readers: &[Vec<NodeId>],
    is_out: &[bool],
    gpu: &dyn Fn(NodeId) -> bool,
) -> Option<AttnPlan> {
    let op_of = |id: NodeId| &g.node(id).op;
    let ins = |id: NodeId| g.node(id).inputs.as_slice();
    let dt = g.node(o).shape.dtype;
    if !matches!(dt, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let &[p, vn] = ins(o) else { return None };
    // P = Div(E, s)
    if *op_of(p) != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let &[e, s2] = ins(p) else { return None };
    if *op_of(e) != Op::Unary(UnaryOp::Exp) {
        return None;
    }
    let &[dn] = ins(e) else { return None };
    if *op_of(dn) != Op::Binary(BinaryOp::Sub) {
        return None;
    }
    let &[u, m2] = ins(dn) else { return None };
    let sd = dims(g, u);
    let rank = sd.len();
    if rank < 2 {
        return None;
    }
    let mut rd = sd.clone();
    rd[rank - 1] = 1;
    let mut members: Vec<NodeId> = vec![o, p, e, dn];
    let is_zero = |id: NodeId| scalar_const(g, id) == Some(0.0);
    // The sum: y, or Select(Eq(y, 0), 1, y).
    let (sum, safe_sum) = match op_of(s2) {
        Op::Select => {
            let &[z, one, y] = ins(s2) else { return None };
            if scalar_const(g, one) != Some(1.0) || *op_of(z) != Op::Binary(BinaryOp::Eq) {
                return None;
            }
            let zi = ins(z);
            let ok =
                zi.len() == 2 && ((zi[0] == y && is_zero(zi[1])) || (zi[1] == y && is_zero(zi[0])));
            if !ok {
                return None;
            }
            members.extend([s2, z]);
            (y, true)
        }
        _ => (s2, false),
    };
    if !last_axis(op_of(sum), ReduceKind::Sum, rank) || ins(sum) != [e].as_slice() {
        return None;
    }
    members.push(sum);
    // The max: x, or Select(IsInf{neg}(x), 0, x).
    let (mx, safe_max) = match op_of(m2) {
        Op::Select => {
            let &[f, zero, x] = ins(m2) else { return None };
            if !is_zero(zero)
                || !matches!(op_of(f), Op::Unary(UnaryOp::IsInf { neg: true, .. }))
                || ins(f) != [x].as_slice()
            {
                return None;
            }
            members.extend([m2, f]);
            (x, true)
        }
        _ => (m2, false),
    };
    if !last_axis(op_of(mx), ReduceKind::Max, rank) || ins(mx) != [u].as_slice() {
        return None;
    }
    members.push(mx);
    // U = Add(T, M) or T; T = Mul/Div by a constant, or S.
    let score_chain = |t: NodeId| -> Option<(NodeId, Scale, Option<NodeId>)> {
        match op_of(t) {
            Op::MatMul => Some((t, Scale::None, None)),
            Op::Binary(BinaryOp::Mul) => {
                let &[a, b] = ins(t) else { return None };
                if matches!(op_of(a), Op::MatMul) {
                    scalar_const(g, b).map(|c| (a, Scale::Mul(c as f32), Some(t)))
                } else if matches!(op_of(b), Op::MatMul) {
                    scalar_const(g, a).map(|c| (b, Scale::Mul(c as f32), Some(t)))
                } else {
                    None
                }
            }
            Op::Binary(BinaryOp::Div) => {
                let &[a, b] = ins(t) else { return None };
                if matches!(op_of(a), Op::MatMul) {
                    scalar_const(g, b).map(|c| (a, Scale::Div(c as f32), Some(t)))
                } else {
                    None
                }
            }
            _ => None,
        }
    };
    let (s, scale, tnode, mask) = match score_chain(u) {
        Some((s, sc, t)) => (s, sc, t, None),
        None => {
            if *op_of(u) != Op::Binary(BinaryOp::Add) {
                return None;
            }
            let &[a, b] = ins(u) else { return None };
            members.push(u);
            match score_chain(a) {
                Some((s, sc, t)) => (s, sc, t, Some(b)),
                None => {
                    let (s, sc, t) = score_chain(b)?;
                    (s, sc, t, Some(a))
                }
            }
        }
    };
    members.push(s);
    if let Some(t) = tnode {
        members.push(t);
    }
    let mut roles = [None; ROLES];
    for (r, x) in [
        (Role::S, Some(s)),
        (Role::T, tnode),
        (Role::U, mask.map(|_| u)),
        (Role::Max, Some(mx)),
        (Role::SafeMax, safe_max.then_some(m2)),
        (Role::Sub, Some(dn)),
        (Role::Exp, Some(e)),
        (Role::Sum, Some(sum)),
        (Role::SafeSum, safe_sum.then_some(s2)),
        (Role::P, Some(p)),
    ] {
        roles[r as usize] = x;
    }
    // Dims: S [.., lq, lk]; every score-sized member has S's dims, the reductions S's with
    // the last set to 1; O [.., lq, dv] over S's batch dims.
    let nb = rank - 2;
    let (lq, lk) = (sd[nb], sd[nb + 1]);
    let ob = sd[..nb].to_vec();
    for &x in [s, u, dn, e, p].iter().chain(tnode.iter()) {
        if dims(g, x) != sd {
            return None;
        }
    }
    for &x in &[mx, m2, sum, s2] {
        if dims(g, x) != rd {
            return None;
        }
    }
    let &[qn, bn] = ins(s) else { return None };
    let (qd, bd, vd) = (dims(g, qn), dims(g, bn), dims(g, vn));
    if qd.len() < 2 || bd.len() < 2 || vd.len() < 2 {
        return None;
    }
    let dqk = qd[qd.len() - 1];
    let dv = vd[vd.len() - 1];
    if qd[qd.len() - 2] != lq
        || bd[bd.len() - 2] != dqk
        || bd[bd.len() - 1] != lk
        || vd[vd.len() - 2] != lk
    {
        return None;
    }
    let mut od = ob.clone();
    od.extend([lq, dv]);
    if dims(g, o) != od {
        return None;
    }
    if lq == 0
        || lk == 0
        || dqk == 0
        || dv == 0
        || dqk > MAX_HEAD
        || dv > MAX_HEAD
        || nb > MAX_BATCH_DIMS
        || lq.div_ceil(ROWS) > 65535
        || lk > i32::MAX as usize
        || ob.iter().product::<usize>() > i32::MAX as usize
        || ob.iter().product::<usize>() == 0
    {
        return None;
    }
    // dtypes: every float member and operand has the output's dtype; IsInf/Eq give Bool.
    let float_members: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|&m| {
            !matches!(
                op_of(m),
                Op::Unary(UnaryOp::IsInf { .. }) | Op::Binary(BinaryOp::Eq)
            )
        })
        .collect();
    let operands = [qn, bn, vn].into_iter().chain(mask);
    if float_members
        .iter()
        .copied()
        .chain(operands)
        .any(|x| g.node(x).shape.dtype != dt)
    {
        return None;
    }
    let mut absorbed = vec![];
    let q = view_of(g, qn, &ob, readers, is_out, gpu, &mut absorbed)?;
    let bview = view_of(g, bn, &ob, readers, is_out, gpu, &mut absorbed)?;
    // B is [.., dqk, lk]: K's (key, dim) strides are B's (col, row).
    let k = View {
        node: bview.node,
        batch: bview.batch,
        row: bview.col,
        col: bview.row,
    };
    let v = view_of(g, vn, &ob, readers, is_out, gpu, &mut absorbed)?;
    let mask = match mask {
        None => None,
        Some(mn) => {
            let md = dims(g, mn);
            if md.len() > rank {
                return None;
            }
            let ms = strides_of(&md);
            let off = rank - md.len();
            let mut st = Vec::with_capacity(rank);
            for a in 0..rank {
                st.push(if a < off || md[a - off] == 1 {
                    0
                } else if md[a - off] == sd[a] {
                    ms[a - off] as i64
                } else {
                    return None;
                });
            }
            Some(View {
                node: mn,
                batch: st[..nb].to_vec(),
                row: st[nb],
                col: st[nb + 1],
            })
        }
    };
    members.extend(absorbed);
    members.sort();
    members.dedup();
    // Inner values: no reader outside the group, not graph outputs; every member on the GPU.
    for &m in &members {
        if !gpu(m) {
            return None;
        }
        if m != o && (is_out[m.index()] || readers[m.index()].iter().any(|r| !members.contains(r)))
        {
            return None;
        }
    }
    // An operand or the mask must not be computed inside the group.
    for x in [q.node, k.node, v.node]
        .into_iter()
        .chain(mask.as_ref().map(|m| m.node))
    {
        if members.contains(&x) {
            return None;
        }
    }
    Some(AttnPlan {
        members,
        q,
        k,
        v,
        mask,
        scale,
        zero_rows: safe_max && safe_sum,
        safe_max,
        safe_sum,
        roles,
        dt,
        batch: ob,
        lq,
        lk,
        dqk,
        dv,
    })
}

/// The kernels' CUDA source (after [`crate::kernels::device_functions`]'s prelude):
/// `rlx_attn_<tpr>(q, k, v, mask, o, meta, lq, lk, dqk, dv, scale, flags)` for 1, 2 and 4
/// threads per query row (head dims up to 32, 64, 128).
///
/// A block of `32 * tpr` threads takes [`ROWS`] query rows of one batch entry (`blockIdx.x`
/// the flattened batch index, `blockIdx.y` the row tile); the `tpr` consecutive threads of a
/// row each hold 32 of its head dims of q and of the output accumulator in registers (dims
/// `4 (c tpr + t) + e`, so a team reads consecutive 16-byte words of shared memory and the
/// other rows' teams read the same words: no bank conflicts). K and V are staged in shared
/// memory 32 keys at a time (zero past lk and the head dim: 2 x 32 x (32 tpr + 4) floats,
/// 33.8 KB at tpr 4); each thread loads its 32 values of the next tile into registers while
/// the current tile is computed on (ptxas for sm_90: 245-254 registers, no spills). Scores
/// are computed 8 keys at a time (partial dots summed across the team by xor shuffles, which
/// give every lane the same bits), then the online softmax.
pub(crate) const KERNEL_SRC: &str = r#"
#define RLX_ATT_ROWS 32
#define RLX_ATT_BK 32
#define RLX_ATT_CH 8
__device__ __forceinline__ float rlx_att_round(float x, int dt) {
  return dt == 1 ? rlx_rbf16(x) : (dt == 2 ? rlx_rf16(x) : x);
}
// One thread's share of a tile of 32 keys x 32*TPR head dims of K or V (element (j, d) at
// x[j * sj + d * sd]; 0 past lk and dlim): 32 values, thread tid taking dim tid of every key
// when sd == 1 (coalesced along the dims), else key tid % 32 of dims tid / 32 + TPR * it
// (coalesced along the keys).
template <int TPR, typename S>
__device__ __forceinline__ void rlx_att_load(float (&t)[RLX_ATT_BK], const S* __restrict__ x,
    i64 sj, i64 sd, int j0, int lk, int dlim, int tid) {
  if (sd == 1) {
    const bool dok = tid < dlim;
    const S* p = x + (i64)j0 * sj + tid;
#pragma unroll
    for (int it = 0; it < RLX_ATT_BK; ++it) {
      t[it] = (dok && j0 + it < lk) ? rlx_f(*p) : 0.0f;
      p += sj;
    }
  } else {
    const int d0 = tid / 32;
    const bool jok = j0 + tid % 32 < lk;
    const S* p = x + (i64)(j0 + tid % 32) * sj + (i64)d0 * sd;
    const i64 step = (i64)TPR * sd;
#pragma unroll
    for (int it = 0; it < RLX_ATT_BK; ++it) {
      t[it] = (jok && d0 + TPR * it < dlim) ? rlx_f(*p) : 0.0f;
      p += step;
    }
  }
}
// Store a share loaded by rlx_att_load into the tile (row stride 32*TPR + 4).
template <int TPR>
__device__ __forceinline__ void rlx_att_store(const float (&t)[RLX_ATT_BK], float* s, i64 sd, int tid) {
#pragma unroll
  for (int it = 0; it < RLX_ATT_BK; ++it) {
    const int jj = sd == 1 ? it : tid % 32;
    const int d = sd == 1 ? tid : tid / 32 + TPR * it;
    s[jj * (32 * TPR + 4) + d] = t[it];
  }
}
template <int TPR, typename S>
__device__ __forceinline__ void rlx_attn_body(
    const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
    const S* __restrict__ msk, S* __restrict__ o, const i64* __restrict__ meta,
    int lq, int lk, int dqk, int dv, float scale, int flags) {
  const int RS = 32 * TPR + 4;
  __shared__ __align__(16) float ks[RLX_ATT_BK * (32 * TPR + 4)];
  __shared__ __align__(16) float vs[RLX_ATT_BK * (32 * TPR + 4)];
  const float NINF = __uint_as_float(0xff800000u);
  const float PINF = __uint_as_float(0x7f800000u);
  const int smode = flags & 3;
  const int dt = (flags >> 2) & 3;
  const bool zero_rows = ((flags >> 4) & 1) != 0;
  const int tid = (int)threadIdx.x;
  const int t = tid % TPR;
  const int r = tid / TPR;
  const int i = (int)blockIdx.y * RLX_ATT_ROWS + r;
  const bool act = i < lq;
  // Offsets of batch entry blockIdx.x in Q, K, V, mask, O.
  const int nb = (int)meta[0];
  i64 off0 = 0, off1 = 0, off2 = 0, off3 = 0, off4 = 0;
  {
    i64 rem = (i64)blockIdx.x;
    const i64* st = meta + 1 + nb;
    for (int a = nb - 1; a >= 0; --a) {
      const i64 dim = meta[1 + a];
      const i64 c = rem % dim;
      rem /= dim;
      off0 += c * st[0 * (nb + 2) + a];
      off1 += c * st[1 * (nb + 2) + a];
      off2 += c * st[2 * (nb + 2) + a];
      off3 += c * st[3 * (nb + 2) + a];
      off4 += c * st[4 * (nb + 2) + a];
    }
  }
  const i64* rc = meta + 1 + 2 * nb;
  const i64 qi = rc[0], qd = rc[1];
  const i64 kj = rc[(nb + 2)], kd = rc[(nb + 2) + 1];
  const i64 vj = rc[2 * (nb + 2)], vd = rc[2 * (nb + 2) + 1];
  const i64 mi = rc[3 * (nb + 2)], mj = rc[3 * (nb + 2) + 1];
  const i64 oi = rc[4 * (nb + 2)], od = rc[4 * (nb + 2) + 1];
  float qr[32];
  float acc[32];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = 4 * (c * TPR + t) + e;
      qr[4 * c + e] = (act && d < dqk) ? rlx_f(q[off0 + (i64)i * qi + (i64)d * qd]) : 0.0f;
      acc[4 * c + e] = 0.0f;
    }
  }
  float m = NINF;
  float l = 0.0f;
  bool bad = false;
  // This thread's share of the next K and V tiles, loaded into registers while the current
  // tile is computed on.
  float tk[RLX_ATT_BK];
  float tv[RLX_ATT_BK];
  rlx_att_load<TPR>(tk, k + off1, kj, kd, 0, lk, dqk, tid);
  rlx_att_load<TPR>(tv, v + off2, vj, vd, 0, lk, dv, tid);
  for (int j0 = 0; j0 < lk; j0 += RLX_ATT_BK) {
    __syncthreads();
    rlx_att_store<TPR>(tk, ks, kd, tid);
    rlx_att_store<TPR>(tv, vs, vd, tid);
    __syncthreads();
    if (j0 + RLX_ATT_BK < lk) {
      rlx_att_load<TPR>(tk, k + off1, kj, kd, j0 + RLX_ATT_BK, lk, dqk, tid);
      rlx_att_load<TPR>(tv, v + off2, vj, vd, j0 + RLX_ATT_BK, lk, dv, tid);
    }
    const int nk = min(RLX_ATT_BK, lk - j0);
    for (int c0 = 0; c0 < nk; c0 += RLX_ATT_CH) {
      float s[RLX_ATT_CH];
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
        const float* kr = ks + (c0 + kk) * RS + 4 * t;
        float a = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float4 w = *reinterpret_cast<const float4*>(kr + 4 * c * TPR);
          a = fmaf(qr[4 * c], w.x, a);
          a = fmaf(qr[4 * c + 1], w.y, a);
          a = fmaf(qr[4 * c + 2], w.z, a);
          a = fmaf(qr[4 * c + 3], w.w, a);
        }
        s[kk] = a;
      }
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
#pragma unroll
        for (int sh = 1; sh < TPR; sh <<= 1) s[kk] += __shfl_xor_sync(0xffffffffu, s[kk], sh);
      }
      float mc = NINF;
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
        const int j = j0 + c0 + kk;
        float u = rlx_att_round(s[kk], dt);
        if (smode == 1) u = rlx_att_round(u * scale, dt);
        else if (smode == 2) u = rlx_att_round(u / scale, dt);
        if (msk != 0 && act && j < lk) u = rlx_att_round(u + rlx_f(msk[off3 + (i64)i * mi + (i64)j * mj]), dt);
        if (j >= lk) {
          u = NINF;
        } else if (rlx_isnan(u) || u == PINF) {
          bad = true;
          u = NINF;
        }
        s[kk] = u;
        mc = fmaxf(mc, u);
      }
      const float mn = fmaxf(m, mc);
      const float base = (mn == NINF) ? 0.0f : mn;
      const float alpha = (m == NINF) ? 1.0f : expf(m - mn);
      m = mn;
      l *= alpha;
#pragma unroll
      for (int x = 0; x < 32; ++x) acc[x] *= alpha;
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
        const float pk = expf(s[kk] - base);
        l += pk;
        const float* vr = vs + (c0 + kk) * RS + 4 * t;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float4 w = *reinterpret_cast<const float4*>(vr + 4 * c * TPR);
          acc[4 * c] = fmaf(pk, w.x, acc[4 * c]);
          acc[4 * c + 1] = fmaf(pk, w.y, acc[4 * c + 1]);
          acc[4 * c + 2] = fmaf(pk, w.z, acc[4 * c + 2]);
          acc[4 * c + 3] = fmaf(pk, w.w, acc[4 * c + 3]);
        }
      }
    }
  }
  if (act) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 4 * (c * TPR + t) + e;
        if (d < dv) {
          float y;
          if (bad) y = RLX_NAN;
          else if (m == NINF) y = zero_rows ? acc[4 * c + e] : RLX_NAN;
          else y = acc[4 * c + e] / l;
          rlx_put(o[off4 + (i64)i * oi + (i64)d * od], rlx_att_round(y, dt));
        }
      }
    }
  }
}
#define RLX_ATT_KERNEL(TPR, S, SFX) \
extern "C" __global__ void __launch_bounds__(32 * TPR) rlx_attn##SFX##_##TPR( \
    const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, \
    const S* __restrict__ msk, S* __restrict__ o, const i64* __restrict__ meta, \
    int lq, int lk, int dqk, int dv, float scale, int flags) { \
  rlx_attn_body<TPR, S>(q, k, v, msk, o, meta, lq, lk, dqk, dv, scale, flags); \
}
RLX_ATT_KERNEL(1, float, )
RLX_ATT_KERNEL(2, float, )
RLX_ATT_KERNEL(4, float, )
RLX_ATT_KERNEL(1, rlx_bf, _bf)
RLX_ATT_KERNEL(2, rlx_bf, _bf)
RLX_ATT_KERNEL(4, rlx_bf, _bf)
// The counting variant (scanning runs, RLX_DEBUG_NANS): the same output as the unfused steps
// would give, up to rounding, and the NaN/+inf/-inf counts and first indices of every inner
// value the unfused graph materializes (roles S, T, U, max, safe max, Sub, Exp, sum, safe
// sum, P: six words each at cnt + 6 * role; word cnt[6 * RLX_ATT_NC] counts the blocks that
// took the two-pass path). One pass over the keys as the plain kernel, counting S, T, U and
// U's -inf as the Sub's; a block with a row that is not normal (see below) or NaN/inf in V
// drops those counts and takes a second pass: with the exact row max of U from the first
// one (NaN when any U is NaN, as ReduceMax), S, T and U again, the same per-element
// operations and roundings as the unfused Sub and Exp nodes, the sum, and
// O = sum_j E_j V_j / sum. Each team's first thread counts its row's non-finite values in
// shared memory (count and first key per role and class); warp 0 adds the block's rows to
// the scan's words at the end (shuffles, then one atomic per non-zero word).
#define RLX_ATT_NC 10
__device__ __forceinline__ void rlx_att_c(unsigned* cn, unsigned* fj, int role, int r, float x, int j) {
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    const int c = (u & 0x007fffffu) ? 0 : ((u >> 31) ? 2 : 1);
    const int at = (role * 3 + c) * RLX_ATT_ROWS + r;
    if (cn[at]++ == 0u) fj[at] = (unsigned)j;
  }
}
// Scores of keys c0 .. c0 + RLX_ATT_CH - 1 of the tile in shared memory (every lane of a
// team gets the same bits).
template <int TPR>
__device__ __forceinline__ void rlx_att_dots(float (&s)[RLX_ATT_CH], const float (&qr)[32],
    const float* ks, int c0, int t) {
  const int RS = 32 * TPR + 4;
#pragma unroll
  for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
    const float* kr = ks + (c0 + kk) * RS + 4 * t;
    float a = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const float4 w = *reinterpret_cast<const float4*>(kr + 4 * c * TPR);
      a = fmaf(qr[4 * c], w.x, a);
      a = fmaf(qr[4 * c + 1], w.y, a);
      a = fmaf(qr[4 * c + 2], w.z, a);
      a = fmaf(qr[4 * c + 3], w.w, a);
    }
    s[kk] = a;
  }
#pragma unroll
  for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
#pragma unroll
    for (int sh = 1; sh < TPR; sh <<= 1) s[kk] += __shfl_xor_sync(0xffffffffu, s[kk], sh);
  }
}
template <int TPR, typename S>
__device__ __forceinline__ void rlx_attn_cnt_body(
    const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
    const S* __restrict__ msk, S* __restrict__ o, const i64* __restrict__ meta,
    int lq, int lk, int dqk, int dv, float scale, int flags, u64* __restrict__ cnt) {
  const int RS = 32 * TPR + 4;
  __shared__ __align__(16) float ks[RLX_ATT_BK * (32 * TPR + 4)];
  __shared__ __align__(16) float vs[RLX_ATT_BK * (32 * TPR + 4)];
  __shared__ unsigned cn[RLX_ATT_NC * 3 * RLX_ATT_ROWS];
  __shared__ unsigned fj[RLX_ATT_NC * 3 * RLX_ATT_ROWS];
  const float NINF = __uint_as_float(0xff800000u);
  const float PINF = __uint_as_float(0x7f800000u);
  const int smode = flags & 3;
  const int dt = (flags >> 2) & 3;
  const bool safe_max = ((flags >> 5) & 1) != 0;
  const bool safe_sum = ((flags >> 6) & 1) != 0;
  const int tid = (int)threadIdx.x;
  const int t = tid % TPR;
  const int r = tid / TPR;
  const int i = (int)blockIdx.y * RLX_ATT_ROWS + r;
  const bool act = i < lq;
  // Counted by the team's first thread, for rows inside lq.
  const bool counter = act && t == 0;
  for (int x = tid; x < RLX_ATT_NC * 3 * RLX_ATT_ROWS; x += 32 * TPR) cn[x] = 0u;
  const int nb = (int)meta[0];
  i64 off0 = 0, off1 = 0, off2 = 0, off3 = 0, off4 = 0;
  {
    i64 rem = (i64)blockIdx.x;
    const i64* st = meta + 1 + nb;
    for (int a = nb - 1; a >= 0; --a) {
      const i64 dim = meta[1 + a];
      const i64 c = rem % dim;
      rem /= dim;
      off0 += c * st[0 * (nb + 2) + a];
      off1 += c * st[1 * (nb + 2) + a];
      off2 += c * st[2 * (nb + 2) + a];
      off3 += c * st[3 * (nb + 2) + a];
      off4 += c * st[4 * (nb + 2) + a];
    }
  }
  const i64* rc = meta + 1 + 2 * nb;
  const i64 qi = rc[0], qd = rc[1];
  const i64 kj = rc[(nb + 2)], kd = rc[(nb + 2) + 1];
  const i64 vj = rc[2 * (nb + 2)], vd = rc[2 * (nb + 2) + 1];
  const i64 mi = rc[3 * (nb + 2)], mj = rc[3 * (nb + 2) + 1];
  const i64 oi = rc[4 * (nb + 2)], od = rc[4 * (nb + 2) + 1];
  const S* mrow = (msk != 0 && act) ? msk + off3 + (i64)i * mi : msk;
  float qr[32];
  float acc[32];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = 4 * (c * TPR + t) + e;
      qr[4 * c + e] = (act && d < dqk) ? rlx_f(q[off0 + (i64)i * qi + (i64)d * qd]) : 0.0f;
      acc[4 * c + e] = 0.0f;
    }
  }
  float tk[RLX_ATT_BK];
  float tv[RLX_ATT_BK];
  // The single pass: S, T and U (the unfused bits, counted per element, and U's -inf as the
  // Sub's: U - max is -inf exactly there when the max is finite), the online softmax and
  // E V as the plain kernel; per row the max of U (NaN ignored, +inf kept), whether some U
  // is NaN and the least U above -inf; per thread whether a V value it loaded is NaN/±inf.
  float m = NINF;
  float l = 0.0f;
  float umin = PINF;
  bool nan = false;
  bool vbad = false;
  rlx_att_load<TPR>(tk, k + off1, kj, kd, 0, lk, dqk, tid);
  rlx_att_load<TPR>(tv, v + off2, vj, vd, 0, lk, dv, tid);
#pragma unroll
  for (int x = 0; x < RLX_ATT_BK; ++x) vbad |= rlx_nf(tv[x]);
  for (int j0 = 0; j0 < lk; j0 += RLX_ATT_BK) {
    __syncthreads();
    rlx_att_store<TPR>(tk, ks, kd, tid);
    rlx_att_store<TPR>(tv, vs, vd, tid);
    __syncthreads();
    if (j0 + RLX_ATT_BK < lk) {
      rlx_att_load<TPR>(tk, k + off1, kj, kd, j0 + RLX_ATT_BK, lk, dqk, tid);
      rlx_att_load<TPR>(tv, v + off2, vj, vd, j0 + RLX_ATT_BK, lk, dv, tid);
#pragma unroll
      for (int x = 0; x < RLX_ATT_BK; ++x) vbad |= rlx_nf(tv[x]);
    }
    const int nk = min(RLX_ATT_BK, lk - j0);
    for (int c0 = 0; c0 < nk; c0 += RLX_ATT_CH) {
      float s[RLX_ATT_CH];
      rlx_att_dots<TPR>(s, qr, ks, c0, t);
      float mc = NINF;
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
        const int j = j0 + c0 + kk;
        const float sv = rlx_att_round(s[kk], dt);
        float tw = sv;
        if (smode == 1) tw = rlx_att_round(sv * scale, dt);
        else if (smode == 2) tw = rlx_att_round(sv / scale, dt);
        float u = tw;
        if (msk != 0 && act && j < lk) u = rlx_att_round(tw + rlx_f(mrow[(i64)j * mj]), dt);
        if (j < lk) {
          if (counter && (rlx_nf(sv) || rlx_nf(tw) || rlx_nf(u))) {
            rlx_att_c(cn, fj, 0, r, sv, j);
            if (smode != 0) rlx_att_c(cn, fj, 1, r, tw, j);
            if (msk != 0) rlx_att_c(cn, fj, 2, r, u, j);
            if (u == NINF) rlx_att_c(cn, fj, 5, r, u, j);
          }
          if (rlx_isnan(u)) nan = true;
          else if (u > NINF) umin = fminf(umin, u);
        } else {
          u = NINF;
        }
        s[kk] = u;
        mc = fmaxf(mc, u);
      }
      const float mn = fmaxf(m, mc);
      const float base = (mn == NINF) ? 0.0f : mn;
      const float alpha = (m == NINF) ? 1.0f : expf(m - mn);
      m = mn;
      l *= alpha;
#pragma unroll
      for (int x = 0; x < 32; ++x) acc[x] *= alpha;
#pragma unroll
      for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
        const float pk = expf(s[kk] - base);
        l += pk;
        const float* vr = vs + (c0 + kk) * RS + 4 * t;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float4 w = *reinterpret_cast<const float4*>(vr + 4 * c * TPR);
          acc[4 * c] = fmaf(pk, w.x, acc[4 * c]);
          acc[4 * c + 1] = fmaf(pk, w.y, acc[4 * c + 1]);
          acc[4 * c + 2] = fmaf(pk, w.z, acc[4 * c + 2]);
          acc[4 * c + 3] = fmaf(pk, w.w, acc[4 * c + 3]);
        }
      }
    }
  }
  // A normal row: no NaN in U, a finite max, U - max finite wherever U is (the least U's
  // Sub is: the rounded difference is monotonic in U). Then the Sub is -inf exactly where U
  // is (counted above) and finite elsewhere, E is in [0, 1], the max, the sum (in [1, lk])
  // and P are finite: nothing more to count. Any other row, or a NaN/±inf in V (where the
  // order of the products decides between NaN and inf), sends the whole block to the
  // two-pass path below.
  const bool normal = !nan && !rlx_nf(m) && !rlx_nf(rlx_att_round(umin - m, dt)) &&
                      !(dt == 2 && lk >= 65504);
  const bool fall = __syncthreads_or((act && !normal) || vbad) != 0;
  float mm = m;
  float y = l;
  bool pnan = false;
  if (fall) {
    // The two-pass path: the counts so far are dropped, then with the exact max of U (NaN
    // when any U is NaN, as ReduceMax; m is it otherwise) S, T, U again (the same bits), Sub,
    // Exp with the unfused roundings, the sum and E V.
    if (nan) m = RLX_NAN;
    for (int x = tid; x < RLX_ATT_NC * 3 * RLX_ATT_ROWS; x += 32 * TPR) cn[x] = 0u;
    if (tid == 0) atomicAdd(cnt + 6 * RLX_ATT_NC, 1ull);
    // The max the Sub reads (the masked-row-safe Select's 0 for a row of -inf).
    mm = (safe_max && m == NINF) ? 0.0f : m;
    y = 0.0f;
#pragma unroll
    for (int x = 0; x < 32; ++x) acc[x] = 0.0f;
    rlx_att_load<TPR>(tk, k + off1, kj, kd, 0, lk, dqk, tid);
    rlx_att_load<TPR>(tv, v + off2, vj, vd, 0, lk, dv, tid);
    for (int j0 = 0; j0 < lk; j0 += RLX_ATT_BK) {
      __syncthreads();
      rlx_att_store<TPR>(tk, ks, kd, tid);
      rlx_att_store<TPR>(tv, vs, vd, tid);
      __syncthreads();
      if (j0 + RLX_ATT_BK < lk) {
        rlx_att_load<TPR>(tk, k + off1, kj, kd, j0 + RLX_ATT_BK, lk, dqk, tid);
        rlx_att_load<TPR>(tv, v + off2, vj, vd, j0 + RLX_ATT_BK, lk, dv, tid);
      }
      const int nk = min(RLX_ATT_BK, lk - j0);
      for (int c0 = 0; c0 < nk; c0 += RLX_ATT_CH) {
        float s[RLX_ATT_CH];
        rlx_att_dots<TPR>(s, qr, ks, c0, t);
#pragma unroll
        for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
          const int j = j0 + c0 + kk;
          const float sv = rlx_att_round(s[kk], dt);
          float tw = sv;
          if (smode == 1) tw = rlx_att_round(sv * scale, dt);
          else if (smode == 2) tw = rlx_att_round(sv / scale, dt);
          float u = tw;
          if (msk != 0 && act && j < lk) u = rlx_att_round(tw + rlx_f(mrow[(i64)j * mj]), dt);
          const float dd = rlx_att_round(u - mm, dt);
          const float e = rlx_att_round(expf(dd), dt);
          if (j < lk) {
            if (counter && (rlx_nf(sv) || rlx_nf(tw) || rlx_nf(u) || rlx_nf(dd) || rlx_nf(e))) {
              rlx_att_c(cn, fj, 0, r, sv, j);
              if (smode != 0) rlx_att_c(cn, fj, 1, r, tw, j);
              if (msk != 0) rlx_att_c(cn, fj, 2, r, u, j);
              rlx_att_c(cn, fj, 5, r, dd, j);
              rlx_att_c(cn, fj, 6, r, e, j);
            }
            y += e;
            s[kk] = e;
          } else {
            s[kk] = 0.0f;
          }
        }
#pragma unroll
        for (int kk = 0; kk < RLX_ATT_CH; ++kk) {
          const float pk = s[kk];
          const float* vr = vs + (c0 + kk) * RS + 4 * t;
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            const float4 w = *reinterpret_cast<const float4*>(vr + 4 * c * TPR);
            acc[4 * c] = fmaf(pk, w.x, acc[4 * c]);
            acc[4 * c + 1] = fmaf(pk, w.y, acc[4 * c + 1]);
            acc[4 * c + 2] = fmaf(pk, w.z, acc[4 * c + 2]);
            acc[4 * c + 3] = fmaf(pk, w.w, acc[4 * c + 3]);
          }
        }
      }
    }
    // P = E / s is NaN everywhere in a row whose max is NaN or +inf (E NaN somewhere: the
    // sum is NaN), or -inf unless both Selects are there (Sub gives NaN, or the sum is 0:
    // 0 / 0); otherwise E is in [0, 1], the sum at least 1 (exp(0) at the max) or, in the
    // masked-row-safe form, 0 made 1: P is finite.
    pnan = rlx_nf(m) && !(m == NINF && safe_max && safe_sum);
    // The sum as the unfused ReduceSum rounds it to the dtype (non-finite exactly where it
    // is).
    y = rlx_att_round(y, dt);
    if (counter) {
      rlx_att_c(cn, fj, 3, r, m, 0);
      if (safe_max) rlx_att_c(cn, fj, 4, r, mm, 0);
      rlx_att_c(cn, fj, 7, r, y, 0);
      if (safe_sum) rlx_att_c(cn, fj, 8, r, y == 0.0f ? 1.0f : y, 0);
      if (pnan) {
        cn[(9 * 3) * RLX_ATT_ROWS + r] = (unsigned)lk;
        fj[(9 * 3) * RLX_ATT_ROWS + r] = 0u;
      }
    }
  }
  if (act) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 4 * (c * TPR + t) + e;
        if (d < dv) {
          float x;
          if (pnan) x = RLX_NAN;
          else if (m == NINF) x = acc[4 * c + e];
          else x = acc[4 * c + e] / y;
          rlx_put(o[off4 + (i64)i * oi + (i64)d * od], rlx_att_round(x, dt));
        }
      }
    }
  }
  __syncthreads();
  if (tid < 32) {
    const u64 row = (u64)blockIdx.x * (u64)lq + (u64)((int)blockIdx.y * RLX_ATT_ROWS + tid);
#pragma unroll 1
    for (int n = 0; n < RLX_ATT_NC; ++n) {
      // Only S, T, U and the Sub are counted on the single-pass path.
      if (!fall && n != 0 && n != 1 && n != 2 && n != 5) continue;
      const bool per_row = n == 3 || n == 4 || n == 7 || n == 8;
      u64 nn[3], ff[3];
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const int at = (n * 3 + c) * RLX_ATT_ROWS + tid;
        nn[c] = cn[at];
        ff[c] = nn[c] == 0ull ? ~0ull : (per_row ? row : row * (u64)lk + fj[at]);
      }
      RlxCnt cc;
      cc.n0 = nn[0]; cc.n1 = nn[1]; cc.n2 = nn[2];
      cc.f0 = ff[0]; cc.f1 = ff[1]; cc.f2 = ff[2];
      rlx_flush(cc, cnt + 6 * n);
    }
  }
}
#define RLX_ATT_CNT_KERNEL(TPR, S, SFX) \
extern "C" __global__ void __launch_bounds__(32 * TPR) rlx_attn_cnt##SFX##_##TPR( \
    const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, \
    const S* __restrict__ msk, S* __restrict__ o, const i64* __restrict__ meta, \
    int lq, int lk, int dqk, int dv, float scale, int flags, u64* __restrict__ cnt) { \
  rlx_attn_cnt_body<TPR, S>(q, k, v, msk, o, meta, lq, lk, dqk, dv, scale, flags, cnt); \
}
RLX_ATT_CNT_KERNEL(1, float, )
RLX_ATT_CNT_KERNEL(2, float, )
RLX_ATT_CNT_KERNEL(4, float, )
RLX_ATT_CNT_KERNEL(1, rlx_bf, _bf)
RLX_ATT_CNT_KERNEL(2, rlx_bf, _bf)
RLX_ATT_CNT_KERNEL(4, rlx_bf, _bf)
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Shape, Tensor};

    fn sh(d: &[usize], dt: DType) -> Shape {
        Shape::new(d, dt)
    }

    fn reduce(g: &mut Graph, kind: ReduceKind, x: NodeId, rd: &[usize], dt: DType) -> NodeId {
        let r = rd.len();
        g.add_node(
            Op::Reduce {
                kind,
                axes: vec![r - 1],
                keepdims: true,
            },
            vec![x],
            sh(rd, dt),
        )
    }

    /// rlx-compile's Softmax over the last axis, or the ONNX Attention lowering's
    /// masked-row-safe form (`safe`).
    pub(crate) fn softmax(g: &mut Graph, u: NodeId, sd: &[usize], dt: DType, safe: bool) -> NodeId {
        let mut rd = sd.to_vec();
        *rd.last_mut().unwrap() = 1;
        let zero = g.constant(Tensor::scalar(dt, 0.0));
        let one = g.constant(Tensor::scalar(dt, 1.0));
        let mut m = reduce(g, ReduceKind::Max, u, &rd, dt);
        if safe {
            let f = g.add_node(
                Op::Unary(UnaryOp::IsInf {
                    pos: false,
                    neg: true,
                }),
                vec![m],
                sh(&rd, DType::Bool),
            );
            m = g.add_node(Op::Select, vec![f, zero, m], sh(&rd, dt));
        }
        let d = g.binary(BinaryOp::Sub, u, m, sh(sd, dt));
        let e = g.unary(UnaryOp::Exp, d, sh(sd, dt));
        let mut s = reduce(g, ReduceKind::Sum, e, &rd, dt);
        if safe {
            let z = g.add_node(
                Op::Binary(BinaryOp::Eq),
                vec![s, zero],
                sh(&rd, DType::Bool),
            );
            s = g.add_node(Op::Select, vec![z, one, s], sh(&rd, dt));
        }
        g.binary(BinaryOp::Div, e, s, sh(sd, dt))
    }

    /// BERT self-attention as the ONNX export gives it: the projections' [b, l, h*d] values
    /// reshaped to [b, l, h, d], Transposes to [b, h, l, d] / [b, h, d, l], Mul by 1/sqrt(d),
    /// Add of the [b, 1, 1, l] padding mask; returns (graph, output, the reshaped Q).
    fn bert(b: usize, l: usize, h: usize, d: usize) -> (Graph, NodeId, NodeId) {
        let dt = DType::F32;
        let mut g = Graph::new("bert");
        let x = |g: &mut Graph, name: &str| {
            let p = g.input(name, sh(&[b, l, h * d], dt));
            g.add_node(
                Op::Reshape {
                    dims: vec![b, l, h, d],
                },
                vec![p],
                sh(&[b, l, h, d], dt),
            )
        };
        let (q, k, v) = (x(&mut g, "q"), x(&mut g, "k"), x(&mut g, "v"));
        let mask = g.input("mask", sh(&[b, 1, 1, l], dt));
        let tr = |g: &mut Graph, x: NodeId, perm: Vec<usize>, od: &[usize]| {
            g.add_node(Op::Transpose { perm }, vec![x], sh(od, dt))
        };
        let qt = tr(&mut g, q, vec![0, 2, 1, 3], &[b, h, l, d]);
        let vt = tr(&mut g, v, vec![0, 2, 1, 3], &[b, h, l, d]);
        let kt = tr(&mut g, k, vec![0, 2, 3, 1], &[b, h, d, l]);
        let sd = [b, h, l, l];
        let s = g.matmul(qt, kt, sh(&sd, dt));
        let c = g.constant(Tensor::scalar(dt, 0.125));
        let t = g.binary(BinaryOp::Mul, s, c, sh(&sd, dt));
        let u = g.binary(BinaryOp::Add, t, mask, sh(&sd, dt));
        let p = softmax(&mut g, u, &sd, dt, false);
        let o = g.matmul(p, vt, sh(&[b, h, l, d], dt));
        g.set_outputs(vec![o]);
        (g, o, q)
    }

    /// Qwen3's attention through torch.export and the ONNX Attention lowering: Q and K^T
    /// scaled by sqrt(1/sqrt(d)) before the MatMul, KV heads repeated (Reshape, Broadcast,
    /// Reshape), a [b, 1, l, l] additive mask from a Select, the masked-row-safe softmax.
    /// Returns (graph, output, the scaled K^T).
    fn qwen(b: usize, l: usize, hq: usize, hkv: usize, d: usize) -> (Graph, NodeId, NodeId) {
        let dt = DType::BF16;
        let rep = hq / hkv;
        let mut g = Graph::new("qwen");
        let q = g.input("q", sh(&[b, hq, l, d], dt));
        let k = g.input("k", sh(&[b, hkv, l, d], dt));
        let v = g.input("v", sh(&[b, hkv, l, d], dt));
        let allowed = g.input("allowed", sh(&[b, 1, l, l], DType::Bool));
        let expand = |g: &mut Graph, x: NodeId| {
            let a = g.add_node(
                Op::Reshape {
                    dims: vec![b, hkv, 1, l, d],
                },
                vec![x],
                sh(&[b, hkv, 1, l, d], dt),
            );
            let e = g.add_node(
                Op::Broadcast {
                    dims: vec![b, hkv, rep, l, d],
                },
                vec![a],
                sh(&[b, hkv, rep, l, d], dt),
            );
            g.add_node(
                Op::Reshape {
                    dims: vec![b, hq, l, d],
                },
                vec![e],
                sh(&[b, hq, l, d], dt),
            )
        };
        let (k, v) = (expand(&mut g, k), expand(&mut g, v));
        let zero = g.constant(Tensor::scalar(dt, 0.0));
        let ninf = g.constant(Tensor::scalar(dt, f64::NEG_INFINITY));
        let bias = g.add_node(Op::Select, vec![allowed, zero, ninf], sh(&[b, 1, l, l], dt));
        let c = g.constant(Tensor::scalar(dt, (1.0 / (d as f64).sqrt()).sqrt()));
        let qs = g.binary(BinaryOp::Mul, q, c, sh(&[b, hq, l, d], dt));
        let kt = g.add_node(
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            vec![k],
            sh(&[b, hq, d, l], dt),
        );
        let ks = g.binary(BinaryOp::Mul, kt, c, sh(&[b, hq, d, l], dt));
        let sd = [b, hq, l, l];
        let s = g.matmul(qs, ks, sh(&sd, dt));
        let u = g.binary(BinaryOp::Add, s, bias, sh(&sd, dt));
        let p = softmax(&mut g, u, &sd, dt, true);
        let o = g.matmul(p, v, sh(&[b, hq, l, d], dt));
        g.set_outputs(vec![o]);
        (g, o, ks)
    }

    fn plans(g: &Graph) -> Vec<AttnPlan> {
        plan_attention(g, &|id| !g.node(id).op.is_leaf())
    }

    /// BERT-base's shapes (batch 8 x 128, 12 heads of 64): one group of 12 nodes (the three
    /// Transposes read through strides, S, the scale, the mask Add, the five Softmax nodes,
    /// the output MatMul), reading the [b, l, h, d] projections in place.
    #[test]
    fn matches_bert_base() {
        let (b, l, h, d) = (8, 128, 12, 64);
        let (g, o, q) = bert(b, l, h, d);
        let p = plans(&g);
        assert_eq!(p.len(), 1);
        let p = &p[0];
        assert_eq!(p.sink(), o);
        assert_eq!(p.members.len(), 12, "{:?}", p.members);
        assert_eq!((p.lq, p.lk, p.dqk, p.dv), (l, l, d, d));
        assert_eq!(p.batch, vec![b, h]);
        assert_eq!(p.scale, Scale::Mul(0.125));
        assert!(!p.zero_rows);
        assert_eq!(p.dt, DType::F32);
        // Q and K read from [b, l, h, d]: batch strides (l h d, d), row h d, dim 1.
        let want = View {
            node: q,
            batch: vec![(l * h * d) as i64, d as i64],
            row: (h * d) as i64,
            col: 1,
        };
        assert_eq!(p.q, want);
        assert_eq!(p.k.batch, want.batch);
        assert_eq!((p.k.row, p.k.col), ((h * d) as i64, 1));
        assert_eq!((p.v.row, p.v.col), ((h * d) as i64, 1));
        // The [b, 1, 1, l] mask: per batch, broadcast over heads and query rows.
        let m = p.mask.as_ref().unwrap();
        assert_eq!((m.batch.clone(), m.row, m.col), (vec![l as i64, 0], 0, 1));
        assert_eq!(p.tpr(), 2);
        let meta = p.meta();
        // [nb, dims, then 5 x (nb + 2)]
        assert_eq!(meta.len(), 1 + 2 + 5 * 4);
        assert_eq!(&meta[..3], &[2, b as i64, h as i64]);
        // O contiguous [b, h, l, d].
        assert_eq!(
            &meta[meta.len() - 4..],
            &[(h * l * d) as i64, (l * d) as i64, d as i64, 1]
        );
        assert_eq!(p.flags(), 1);
        assert_eq!(p.scan_flags(), 1);
        // Counted roles: all but the Selects; each a member, none the output.
        let have: Vec<bool> = p.roles.iter().map(|r| r.is_some()).collect();
        let mut want = vec![true; ROLES];
        want[Role::SafeMax as usize] = false;
        want[Role::SafeSum as usize] = false;
        assert_eq!(have, want);
        for r in p.roles.iter().flatten() {
            assert!(p.members.contains(r) && *r != o);
        }
        assert!(matches!(
            g.node(p.roles[Role::Max as usize].unwrap()).op,
            Op::Reduce { .. }
        ));
    }

    /// Qwen3-0.6B's prefill at 512 tokens (16 query heads, 8 KV heads of 128, bfloat16): one
    /// group with the masked-row-safe softmax; K^T is the scaled [b, h, d, l] value (read
    /// with key stride 1), V the repeated heads' [b, h, l, d] value.
    #[test]
    fn matches_qwen3_prefill() {
        let (b, l, hq, hkv, d) = (1, 512, 16, 8, 128);
        let (g, o, ks) = qwen(b, l, hq, hkv, d);
        let p = plans(&g);
        assert_eq!(p.len(), 1);
        let p = &p[0];
        assert_eq!(p.sink(), o);
        // S, the mask Add, ReduceMax, IsInf, Select, Sub, Exp, ReduceSum, Eq, Select, Div, O.
        assert_eq!(p.members.len(), 12, "{:?}", p.members);
        assert_eq!(p.scale, Scale::None);
        assert!(p.zero_rows);
        assert_eq!(p.dt, DType::BF16);
        assert_eq!(p.k.node, ks);
        assert_eq!((p.k.row, p.k.col), (1, l as i64));
        assert_eq!(p.k.batch, vec![0, (d * l) as i64]);
        assert_eq!((p.v.row, p.v.col), (d as i64, 1));
        let m = p.mask.as_ref().unwrap();
        assert_eq!((m.batch.clone(), m.row, m.col), (vec![0, 0], l as i64, 1));
        assert_eq!(p.tpr(), 4);
        assert_eq!(p.flags(), (1 << 2) | (1 << 4));
        assert_eq!(p.scan_flags(), (1 << 2) | (1 << 4) | (1 << 5) | (1 << 6));
        // No scale node (Q and K^T are scaled outside the group); both Selects counted.
        let have: Vec<bool> = p.roles.iter().map(|r| r.is_some()).collect();
        let mut want = vec![true; ROLES];
        want[Role::T as usize] = false;
        assert_eq!(have, want);
        assert_eq!(
            g.node(p.roles[Role::SafeSum as usize].unwrap()).op,
            Op::Select
        );
        assert_eq!(
            g.node(p.roles[Role::Sub as usize].unwrap()).op,
            Op::Binary(BinaryOp::Sub)
        );
    }

    /// Anything unusual is left to the unfused steps.
    #[test]
    fn unusual_patterns_are_not_matched() {
        // An inner value that is also a graph output.
        let (mut g, o, _) = bert(2, 16, 2, 8);
        let p = g.node(o).inputs[0];
        g.set_outputs(vec![o, p]);
        assert!(plans(&g).is_empty());
        // An inner value with a reader outside the group.
        let (mut g, o, _) = bert(2, 16, 2, 8);
        let s = plans(&g)[0]
            .members
            .iter()
            .copied()
            .find(|&m| matches!(g.node(m).op, Op::MatMul) && m != o)
            .unwrap();
        let sd = g.node(s).shape.clone();
        let extra = g.unary(UnaryOp::Exp, s, sd);
        g.set_outputs(vec![o, extra]);
        assert!(plans(&g).is_empty());
        // A member on the CPU.
        let (g, _, _) = bert(2, 16, 2, 8);
        let red = g
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Reduce { .. }))
            .unwrap()
            .id;
        assert!(plan_attention(&g, &|id| !g.node(id).op.is_leaf() && id != red).is_empty());
        // A head dim over 128.
        let (g, _, _) = bert(1, 8, 1, 160);
        assert!(plans(&g).is_empty());
        // The same patterns at small sizes still match.
        let (g, _, _) = qwen(1, 32, 4, 2, 64);
        assert_eq!(plans(&g).len(), 1);
    }
}
