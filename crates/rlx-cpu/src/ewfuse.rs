//! Elementwise chains for the CPU executor: connected f32, float16 or bfloat16 Unary,
//! Activation and Binary ops (and Casts between f32 and float16/bfloat16) of one output
//! shape whose intermediate values are read only inside the chain, run block by block
//! instead of op by op. A 16-bit member computes in f32 with its unfused kernel's element
//! function and rounds its block to its dtype at once (a Cast only rounds), so the next
//! member reads what the unfused op would have stored (tests/ew_fusion_half.rs).
//!
//! BERT's exact GELU as torch exports it is six such ops over the FFN's [tokens, 4·hidden]
//! tensor (`x + b`, `/ √2`, Erf, `+ 1`, `x·`, `· 0.5`): each unfused op is a pass over a
//! tensor larger than L2 (all-MiniLM-L6 at 3×128 tokens: 2.4 MB, six passes per layer).
//! Fused, each block of a few thousand elements goes through every op while it is in L1.
//!
//! Each op runs on a block with the element function of its unfused kernel
//! (`kernels::elementwise::{unary, activation, binary}`: the same `fastmath` slice kernels,
//! the same `p + q`, `p * p` for `Pow(·, 2)`, `max_f32`, ...), so the chain's output is
//! the unfused one bit for bit (tests/ew_fusion.rs), NaN aside: where both operands of an
//! op are NaN, which one's payload and sign survive may differ, as between the unfused
//! kernels themselves (an Add or Mul into its second operand's buffer,
//! `inplace::eval_owned_second`, may keep the other NaN than the out-of-place loop; x86
//! keeps the first source's). NaN positions are the same.
//!
//! Operands from outside the chain: a tensor of the chain's shape, a one-element tensor,
//! or a tensor broadcast along the leading axes (`[n]` or `[1, n]` into `[.., n]`, a bias).
//! Every one of them is computed before the chain's first op (else the chain is not
//! fused), since the chain runs there. As for the other groups (`crate::fuse`,
//! `crate::rowfuse`), the graph is not rewritten and the executor decides per run: fused
//! without hooks; with a NaN/Inf scanner, fused while every member's value is finite
//! (checked per block), else replayed op by op so the report names the op; with hooks,
//! unfused.

use rlx_ir::{Activation, DType, Graph, NodeId, Op, Tensor, TensorData};
use rlx_kernels::kernels::chain::{binary_part, erf_gelu_part, map_part, ErfGelu, Src, StepOp};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// Elements per block (rounded to whole rows of a broadcast operand): 8 KB of f32 per
/// member, so a chain of six fits L1 and L2 with its operands.
const BLOCK: usize = 2048;
/// The longest broadcast row a chain takes (a block holds at least one whole row).
const MAX_ROW: usize = 16384;

/// Where an op of a chain reads an operand.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Arg {
    /// The value of step `j` of the chain.
    Step(usize),
    /// External operand `k`, of the chain's shape.
    Full(usize),
    /// External operand `k`, one element.
    Scalar(usize),
    /// External operand `k`: a row of `row_len` elements repeated along the leading axes.
    Row(usize),
}

#[derive(Debug)]
struct Step {
    op: Op1,
    args: [Arg; 2],
    /// The dtype of the step's value (its f32 result is rounded to it).
    dtype: DType,
}

mod gelu;

/// An op of a chain: an elementwise op, or a Cast (the value rounded to its dtype).
#[derive(Debug, Clone, Copy)]
enum Op1 {
    Ew(StepOp),
    Cast,
    /// GELU's erf form (`gelu`): the value of this step and of the four before it, which
    /// are [`Op1::Inside`], from `args[0]`.
    Gelu(ErfGelu),
    /// A step whose value only a later [`Op1::Gelu`] step reads, which computes it in
    /// registers: not run.
    Inside,
}

impl Step {
    /// The operands the step reads (a unary step's second `args` entry is unused).
    fn args_used(&self) -> &[Arg] {
        match self.op {
            Op1::Ew(StepOp::Bin(_)) => &self.args,
            Op1::Inside => &[],
            _ => &self.args[..1],
        }
    }
}

/// One chain: its nodes in order (the last one's value leaves the chain), the ops, and the
/// external operands they read.
#[derive(Debug)]
pub(crate) struct EwGroup {
    members: Vec<NodeId>,
    steps: Vec<Step>,
    externals: Vec<NodeId>,
    /// Length of the broadcast rows (`Arg::Row`), 1 without any.
    row_len: usize,
    /// An external operand of the chain's shape that nothing reads after the chain's first
    /// op but the chain (and not a graph output): its buffer can take the output.
    reusable: Option<usize>,
    dims: Vec<usize>,
    /// The dtype of each external operand.
    ext_dtypes: Vec<DType>,
}

impl EwGroup {
    /// The chain's ops in node order (the first is where it runs, the last its output).
    pub(crate) fn members(&self) -> &[NodeId] {
        &self.members
    }
    /// The nodes whose values the chain reads, in the order `run` takes them (a Constant's
    /// value is its tensor in the graph: its node may come after the chain's first op).
    pub(crate) fn externals(&self) -> &[NodeId] {
        &self.externals
    }
    /// See the field: the index in `externals` of an operand whose buffer may take the
    /// output.
    pub(crate) fn reusable(&self) -> Option<usize> {
        self.reusable
    }
    /// The node whose value the chain computes (its last op).
    pub(crate) fn output(&self) -> NodeId {
        *self.members.last().expect("a chain has members")
    }
    /// How many runs of GELU's erf form the chain computes in one pass (`gelu`).
    pub(crate) fn gelus(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s.op, Op1::Gelu(_)))
            .count()
    }
}

/// The chains of a graph: `at[i]`, the chain whose first op is node i (run there);
/// `member_of[i]`, the chain that computes node i's value at another node.
#[derive(Debug, Default)]
pub(crate) struct EwFusions {
    pub groups: Vec<EwGroup>,
    pub at: Vec<Option<usize>>,
    pub member_of: Vec<Option<usize>>,
}

/// How an operand broadcasts into a chain's output (`operand_kind`).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Full,
    Scalar,
    /// A row of this many elements along the trailing dims.
    Row(usize),
}

/// How an operand of dims `d` broadcasts into `out`: the same dims, one element, or a row
/// of the trailing dims (leading dims 1); `None` for any other broadcast.
fn operand_kind(d: &[usize], out: &[usize]) -> Option<Kind> {
    if d == out {
        return Some(Kind::Full);
    }
    let n: usize = d.iter().product();
    if n == 1 && d.len() <= out.len() {
        return Some(Kind::Scalar);
    }
    let lead = d.iter().take_while(|&&x| x == 1).count();
    let tail = &d[lead..];
    (d.len() <= out.len() && out.ends_with(tail) && n <= MAX_ROW && n > 0).then_some(Kind::Row(n))
}

/// The dtypes a chain computes in: f32, and float16/bfloat16 (computed in f32, each op's
/// value rounded to its dtype as the unfused kernel rounds it).
fn chain_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether node `id` can be an op of a chain: a Unary (not a predicate), Activation or
/// Binary (not a predicate) of f32, f16 or bf16 with static dims, each operand of the op's
/// dtype and of a kind `operand_kind` takes (a Unary's or Activation's operand of the
/// output's dims), or a Cast between f32 and f16 or bf16 (either way) of such an operand.
fn eligible(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let Some(out) = node.shape.static_dims() else {
        return false;
    };
    let dt = node.shape.dtype;
    if !chain_dtype(dt) || out.iter().product::<usize>() == 0 {
        return false;
    }
    let same_ins = node.inputs.iter().all(|x| g.node(*x).shape.dtype == dt);
    let kinds_ok = |full_only: bool| {
        node.inputs.iter().all(|x| {
            g.node(*x)
                .shape
                .static_dims()
                .and_then(|d| operand_kind(&d, &out))
                .is_some_and(|k| !full_only || k == Kind::Full)
        })
    };
    match &node.op {
        Op::Unary(u) => same_ins && !u.is_predicate() && node.inputs.len() == 1 && kinds_ok(true),
        Op::Activation(_) => same_ins && node.inputs.len() == 1 && kinds_ok(true),
        Op::Binary(b) => same_ins && !b.is_predicate() && node.inputs.len() == 2 && kinds_ok(false),
        Op::Cast { to, .. } => {
            node.inputs.len() == 1 && kinds_ok(true) && {
                let from = g.node(node.inputs[0]).shape.dtype;
                *to == dt && chain_dtype(from) && (from == DType::F32 || dt == DType::F32)
            }
        }
        _ => false,
    }
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// Find the chains of `g`, skipping nodes in `taken` (members of other groups).
/// `consumers[i]` lists the nodes reading node i (one entry per use; the executor adds the
/// MatMuls that read a value through a Transpose they read in place).
pub(crate) fn plan(
    g: &Graph,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
    taken: &[bool],
) -> EwFusions {
    let n = g.len();
    let mut out = EwFusions {
        groups: vec![],
        at: vec![None; n],
        member_of: vec![None; n],
    };
    let ok: Vec<bool> = (0..n)
        .map(|i| !taken[i] && eligible(g, NodeId(i as u32)))
        .collect();
    // A value stays inside a chain when every reader is a chain op of its shape and it is
    // not a graph output; then it is joined to its readers.
    let mut parent: Vec<usize> = (0..n).collect();
    for (i, node) in g.nodes.iter().enumerate() {
        let inner = ok[i]
            && !is_output[i]
            && !consumers[i].is_empty()
            && consumers[i]
                .iter()
                .all(|c| ok[c.index()] && g.node(*c).shape.dims == node.shape.dims);
        if inner {
            for c in &consumers[i] {
                let (a, b) = (find(&mut parent, i), find(&mut parent, c.index()));
                parent[a] = b;
            }
        }
    }
    let mut comps: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for i in (0..n).filter(|&i| ok[i]) {
        let r = find(&mut parent, i);
        comps.entry(r).or_default().push(i);
    }
    // Only chains with a Unary, Activation or Cast: a chain of Add/Mul/... alone is bound by
    // memory either way, and the unfused ops run in place (qwen3's attention scale and mask,
    // [1,4,128,128]: 5.6 µs unfused, 7.5 µs fused, with a copy per block).
    let has_map = |m: &Vec<usize>| {
        m.iter().any(|&i| {
            matches!(
                g.nodes[i].op,
                Op::Unary(_) | Op::Activation(_) | Op::Cast { .. }
            )
        })
    };
    for members in comps.into_values().filter(|m| m.len() >= 2 && has_map(m)) {
        if let Some(grp) = group(g, &members, consumers, is_output) {
            let k = out.groups.len();
            out.at[members[0]] = Some(k);
            for &m in &members[1..] {
                out.member_of[m] = Some(k);
            }
            out.groups.push(grp);
        }
    }
    out
}

/// The chain of `members` (ascending node order), when exactly one of them is read outside
/// (or is an output), it is the last, and every external operand comes before the first.
fn group(
    g: &Graph,
    members: &[usize],
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<EwGroup> {
    let inside = |x: NodeId| members.binary_search(&x.index()).is_ok();
    let leaves = |i: usize| is_output[i] || consumers[i].iter().any(|c| !inside(*c));
    let last = *members.last()?;
    if members[..members.len() - 1].iter().any(|&i| leaves(i)) {
        return None;
    }
    let dims = g.node(NodeId(last as u32)).shape.static_dims()?.to_vec();
    let first = members[0];
    let mut externals: Vec<NodeId> = vec![];
    let mut row_len = 1;
    let mut steps = Vec::with_capacity(members.len());
    for &i in members {
        let node = g.node(NodeId(i as u32));
        let mut args = [Arg::Step(0); 2];
        for (j, &x) in node.inputs.iter().enumerate() {
            args[j] = if inside(x) {
                Arg::Step(members.binary_search(&x.index()).ok()?)
            } else {
                // Constants are read from the graph; any other operand must be computed
                // before the chain's first op, where the chain runs.
                if x.index() >= first && !matches!(g.node(x).op, Op::Constant(_)) {
                    return None;
                }
                let k = externals.iter().position(|&e| e == x).unwrap_or_else(|| {
                    externals.push(x);
                    externals.len() - 1
                });
                match operand_kind(&g.node(x).shape.static_dims()?, &dims)? {
                    Kind::Full => Arg::Full(k),
                    Kind::Scalar => Arg::Scalar(k),
                    Kind::Row(len) => {
                        // One row length per chain (a row operand is read at the element
                        // index modulo it).
                        if row_len != 1 && row_len != len {
                            return None;
                        }
                        row_len = len;
                        Arg::Row(k)
                    }
                }
            };
        }
        let op = match &node.op {
            Op::Unary(u) => Op1::Ew(StepOp::Unary(*u)),
            Op::Activation(a) => Op1::Ew(StepOp::Act(*a)),
            Op::Binary(b) => Op1::Ew(StepOp::Bin(*b)),
            Op::Cast { .. } => Op1::Cast,
            _ => return None,
        };
        steps.push(Step {
            op,
            args,
            dtype: node.shape.dtype,
        });
    }
    gelu::fuse(g, &mut steps, &externals);
    let ext_dtypes: Vec<DType> = externals.iter().map(|&x| g.node(x).shape.dtype).collect();
    let out_dtype = g.node(NodeId(last as u32)).shape.dtype;
    let reusable = (0..externals.len()).find(|&k| {
        let x = externals[k];
        // f32 output and operand only (the buffer's element type is the output's).
        out_dtype == DType::F32
            && ext_dtypes[k] == DType::F32
            && steps.iter().any(|st| st.args.contains(&Arg::Full(k)))
            && !is_output[x.index()]
            && !matches!(g.node(x).op, Op::Constant(_))
            && consumers[x.index()]
                .iter()
                .all(|c| inside(*c) || c.index() < first)
    });
    Some(EwGroup {
        members: members.iter().map(|&i| NodeId(i as u32)).collect(),
        steps,
        externals,
        row_len,
        reusable,
        dims,
        ext_dtypes,
    })
}

/// A Unary or Activation over a block part, with the element function of
/// `kernels::elementwise::{unary, activation}` (their `fastmath` slice kernels where they
/// have one).
fn unary_part(op: StepOp, dst: &mut [f32], x: &[f32]) {
    use rlx_kernels::kernels::fastmath::{act_slice_kernel, slice_kernel};
    let k = match op {
        StepOp::Unary(u) => slice_kernel(u),
        // Relu has its own loop in `activation`, before the slice kernels.
        StepOp::Act(Activation::Relu) => None,
        StepOp::Act(a) => act_slice_kernel(a),
        StepOp::Bin(_) => None,
    };
    match k {
        Some(k) => k(x, dst),
        None => map_part(op, dst, x),
    }
}

/// A Unary, Activation or Binary step over a block part for a float16/bfloat16 value,
/// with the f32 element function of the unfused kernel (`kernels::elementwise::{
/// half_unary_block, half_act_block, half_bin_row}`), before the rounding.
fn half_unary_part(op: StepOp, dst: &mut [f32], x: &[f32]) {
    use rlx_kernels::kernels::elementwise::{half_act_block, half_unary_block};
    match op {
        StepOp::Unary(u) => half_unary_block(u, x, dst),
        StepOp::Act(a) => half_act_block(a, x, dst),
        StepOp::Bin(_) => unreachable!("binary steps go through binary_part"),
    }
}

/// `v` rounded in place to `dt` (f32: unchanged).
fn round_to(dt: DType, v: &mut [f32]) {
    use rlx_kernels::kernels::wide::Half;
    match dt {
        DType::BF16 => half::bf16::round_inplace(v),
        DType::F16 => half::f16::round_inplace(v),
        _ => {}
    }
}

/// An external operand's values: f32 in place, or 16-bit floats widened block by block
/// (full operands) or once (rows and scalars, into `Conv`).
enum ExtData<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
    F16(&'a [half::f16]),
}

impl ExtData<'_> {
    fn len(&self) -> usize {
        match self {
            ExtData::F32(v) => v.len(),
            ExtData::Bf16(v) => v.len(),
            ExtData::F16(v) => v.len(),
        }
    }
    /// Elements `[lo, lo + dst.len())` widened into `dst`.
    fn widen(&self, lo: usize, dst: &mut [f32]) {
        use rlx_kernels::kernels::wide::Half;
        let n = dst.len();
        match self {
            ExtData::F32(v) => dst.copy_from_slice(&v[lo..lo + n]),
            ExtData::Bf16(v) => half::bf16::widen(dst, &v[lo..lo + n]),
            ExtData::F16(v) => half::f16::widen(dst, &v[lo..lo + n]),
        }
    }
}

/// The output buffer of a chain, of its last step's dtype.
trait OutElem: Copy + Default + Send + 'static {
    /// The last step writes its f32 values to `dst` directly (f32), or to scratch then
    /// through [`OutElem::store`].
    const DIRECT: bool;
    fn store(dst: &mut [Self], src: &[f32]);
    fn wrap(v: Vec<Self>) -> TensorData;
}

impl OutElem for f32 {
    const DIRECT: bool = true;
    fn store(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src)
    }
    fn wrap(v: Vec<f32>) -> TensorData {
        TensorData::F32(v)
    }
}

impl OutElem for half::bf16 {
    const DIRECT: bool = false;
    fn store(dst: &mut [Self], src: &[f32]) {
        rlx_kernels::kernels::wide::narrow_bf16(dst, src)
    }
    fn wrap(v: Vec<Self>) -> TensorData {
        TensorData::BF16(v)
    }
}

impl OutElem for half::f16 {
    const DIRECT: bool = false;
    fn store(dst: &mut [Self], src: &[f32]) {
        rlx_kernels::kernels::wide::narrow_f16(dst, src)
    }
    fn wrap(v: Vec<Self>) -> TensorData {
        TensorData::F16(v)
    }
}

thread_local! {
    /// Per-thread block values of a chain's steps (all but the last) and of its 16-bit
    /// full operands.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Run chain `grp` on its external operands `ext` (in `EwGroup::externals` order). With
/// `own`, the operand of that index is handed over (`EwGroup::reusable`): its buffer
/// becomes the output (each block is read by every step, then overwritten), and its entry
/// in `ext` is `None`. With `scan`, `Ok(None)` when some step's value is not finite
/// somewhere (the executor then replays the chain op by op; a handed-over operand's
/// buffer then holds the output of some blocks, so `own` is only given without `scan`).
///
/// float16/bfloat16 steps compute in f32 and round their block to the dtype right after
/// (a Cast only rounds), so every later step reads the value the unfused op would have
/// stored; the output is stored in its dtype.
pub(crate) fn run(
    grp: &EwGroup,
    ext: &[Option<&Tensor>],
    own: Option<(usize, Tensor)>,
    scan: bool,
) -> Result<Option<Tensor>, crate::KernelError> {
    let bad = |m: String| crate::KernelError::Invalid(format!("fused elementwise chain: {m}"));
    let own_k = own.as_ref().map(|o| o.0);
    let data: Vec<ExtData> = ext
        .iter()
        .enumerate()
        .map(|(k, t)| match t {
            Some(t) if Some(k) != own_k => match t.data() {
                TensorData::F32(v) => Ok(ExtData::F32(v)),
                TensorData::BF16(v) => Ok(ExtData::Bf16(v)),
                TensorData::F16(v) => Ok(ExtData::F16(v)),
                _ => Err(bad(format!("operand {k} is not f32, f16 or bf16"))),
            },
            None if Some(k) == own_k => Ok(ExtData::F32(&[])),
            _ => Err(bad(format!("operand {k} given twice or not at all"))),
        })
        .collect::<Result<_, _>>()?;
    for (k, d) in data.iter().enumerate() {
        let want = grp.ext_dtypes.get(k).copied();
        let got = match d {
            ExtData::F32(_) => DType::F32,
            ExtData::Bf16(_) => DType::BF16,
            ExtData::F16(_) => DType::F16,
        };
        if want != Some(got) {
            return Err(bad(format!(
                "operand {k} is {got}, the plan expects {want:?}"
            )));
        }
    }
    match grp.steps.last().map(|s| s.dtype) {
        Some(DType::BF16) => run_typed::<half::bf16>(grp, &data, None, scan),
        Some(DType::F16) => run_typed::<half::f16>(grp, &data, None, scan),
        _ => {
            let own = match own {
                Some((k, t)) => match t.into_data() {
                    TensorData::F32(v) => Some((k, v)),
                    _ => return Err(bad("the reused operand is not f32".into())),
                },
                None => None,
            };
            run_typed::<f32>(grp, &data, own, scan)
        }
    }
}

fn run_typed<O: OutElem>(
    grp: &EwGroup,
    data: &[ExtData],
    own: Option<(usize, Vec<O>)>,
    scan: bool,
) -> Result<Option<Tensor>, crate::KernelError> {
    let bad = |m: String| crate::KernelError::Invalid(format!("fused elementwise chain: {m}"));
    let own_k = own.as_ref().map(|o| o.0);
    let numel: usize = grp.dims.iter().product();
    let rl = grp.row_len;
    // Whole rows per block when they fit, else blocks of BLOCK (a row then spans blocks).
    let block = if rl <= BLOCK {
        rl * (BLOCK / rl)
    } else {
        BLOCK
    };
    // The operands' lengths, as the plan found them (a wrong-sized feed is an error here,
    // not a read out of bounds).
    for st in &grp.steps {
        for a in &st.args {
            let want = match *a {
                Arg::Full(k) if Some(k) != own_k => Some((k, numel)),
                Arg::Scalar(k) => Some((k, 1)),
                Arg::Row(k) => Some((k, rl)),
                _ => None,
            };
            if let Some((k, len)) = want {
                if data[k].len() != len {
                    return Err(bad(format!(
                        "operand {k} holds {} elements, expected {len}",
                        data[k].len()
                    )));
                }
            }
        }
    }
    // 16-bit rows and scalars widened once; 16-bit full operands get a scratch block each
    // (`slot[k]`), widened per block.
    let mut wide_small: Vec<Option<Vec<f32>>> = Vec::with_capacity(data.len());
    let mut slot: Vec<Option<usize>> = vec![None; data.len()];
    let mut nslots = 0;
    for (k, d) in data.iter().enumerate() {
        let full = grp.steps.iter().any(|st| st.args.contains(&Arg::Full(k)));
        match d {
            ExtData::F32(_) => wide_small.push(None),
            _ if full => {
                slot[k] = Some(nslots);
                nslots += 1;
                wide_small.push(None);
            }
            _ => {
                let mut v = vec![0f32; d.len()];
                d.widen(0, &mut v);
                wide_small.push(Some(v));
            }
        }
    }
    // An operand's f32 values when they are held whole (f32 data, or widened above).
    let whole = |k: usize| -> &[f32] {
        match (&wide_small[k], &data[k]) {
            (Some(v), _) => v,
            (None, ExtData::F32(v)) => v,
            _ => &[],
        }
    };
    let mut out: Vec<O> = match own {
        Some((_, v)) if v.len() == numel => v,
        Some(_) => return Err(bad("the reused operand is not of the output's size".into())),
        None => rlx_kernels::buffers::overwritten(numel),
    };
    let max_bits = AtomicU32::new(0);
    let nsteps = grp.steps.len();
    // With a reused operand or a 16-bit output, the last step's block goes to scratch too.
    let last_in_scratch = own_k.is_some() || !O::DIRECT;
    rlx_kernels::kernels::fill_chunks(&mut out, block, |b, dst| {
        let base = b * block;
        let len = dst.len();
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let need = (nsteps - usize::from(!last_in_scratch) + nslots) * block;
            if s.len() < need {
                s.resize(need, 0.0);
            }
            let (s, ext_buf) = s.split_at_mut((nsteps - usize::from(!last_in_scratch)) * block);
            for (k, d) in data.iter().enumerate() {
                if let Some(j) = slot[k] {
                    d.widen(base, &mut ext_buf[j * block..j * block + len]);
                }
            }
            let ext_buf = &*ext_buf;
            let mut bits = 0u32;
            {
                // With a reused operand, its block (read by the steps); else the last step
                // writes the output block directly (f32) or to scratch.
                let (own_block, mut dst_direct): (&[f32], Option<&mut [f32]>) = if last_in_scratch {
                    let ob: &[O] = &*dst;
                    let ob = if own_k.is_some() {
                        rlx_kernels::kernels::wide::as_f32(ob)
                    } else {
                        &[][..]
                    };
                    (ob, None)
                } else {
                    (&[], Some(rlx_kernels::kernels::wide::as_f32_mut(&mut *dst)))
                };
                let (steps_buf, last_buf) = s.split_at_mut((nsteps - 1) * block);
                for (j, st) in grp.steps.iter().enumerate() {
                    let (done, rest) = steps_buf.split_at_mut(j * block);
                    let target: &mut [f32] = if j + 1 < nsteps {
                        &mut rest[..len]
                    } else if let Some(d) = dst_direct.take() {
                        d
                    } else {
                        &mut last_buf[..len]
                    };
                    // Operand `a` over elements [lo, lo + n) of the block.
                    // (A part never crosses a broadcast row's end: see the parts below.)
                    let src = |a: Arg, lo: usize, n: usize| match a {
                        Arg::Step(i) => Src::S(&done[i * block + lo..i * block + lo + n]),
                        Arg::Full(k) if Some(k) == own_k => Src::S(&own_block[lo..lo + n]),
                        Arg::Full(k) => match slot[k] {
                            Some(j) => Src::S(&ext_buf[j * block + lo..j * block + lo + n]),
                            None => Src::S(&whole(k)[base + lo..base + lo + n]),
                        },
                        Arg::Scalar(k) => Src::C(whole(k)[0]),
                        Arg::Row(k) => {
                            let off = (base + lo) % rl;
                            Src::S(&whole(k)[off..off + n])
                        }
                    };
                    let half = st.dtype != DType::F32;
                    match st.op {
                        Op1::Inside => continue,
                        Op1::Gelu(p) => {
                            let Src::S(x) = src(st.args[0], 0, len) else {
                                unreachable!("GELU's operand has the chain's shape")
                            };
                            erf_gelu_part(&p, target, x);
                        }
                        Op1::Ew(StepOp::Bin(op)) => {
                            let q_one = match st.args[1] {
                                Arg::Scalar(k) => Some(whole(k)[0]),
                                _ => None,
                            };
                            // With a broadcast row, parts that end where a row ends;
                            // else the whole block.
                            let rows = st.args.iter().any(|a| matches!(a, Arg::Row(_)));
                            let mut lo = 0;
                            while lo < len {
                                let n = if rows {
                                    (rl - (base + lo) % rl).min(len - lo)
                                } else {
                                    len
                                };
                                let p = src(st.args[0], lo, n);
                                let q = src(st.args[1], lo, n);
                                binary_part(op, &mut target[lo..lo + n], p, q, q_one);
                                lo += n;
                            }
                        }
                        op => {
                            let Src::S(x) = src(st.args[0], 0, len) else {
                                unreachable!("a unary step's operand has the chain's shape")
                            };
                            match op {
                                Op1::Cast => target.copy_from_slice(x),
                                Op1::Ew(op) if half => half_unary_part(op, target, x),
                                Op1::Ew(op) => unary_part(op, target, x),
                                Op1::Gelu(_) | Op1::Inside => unreachable!("matched above"),
                            }
                        }
                    }
                    round_to(st.dtype, target);
                    if scan {
                        bits = bits.max(rlx_kernels::kernels::wide::max_abs_bits(target));
                    }
                }
            }
            if last_in_scratch {
                let off = (nsteps - 1) * block;
                O::store(dst, &s[off..off + len]);
            }
            max_bits.fetch_max(bits, Ordering::Relaxed);
        });
    });
    if scan && max_bits.into_inner() >= 0x7f80_0000 {
        rlx_kernels::buffers::give(O::wrap(out));
        return Ok(None);
    }
    Ok(Some(rlx_kernels::kernels::make(
        grp.dims.clone(),
        O::wrap(out),
    )?))
}
