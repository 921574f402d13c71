//! The CPU executor's plan of a graph: one [`Step`] per node (`crate::steps`), the liveness
//! of values (`free_after`), which inputs' buffers a node may take over, the MatMuls that
//! read a Transpose in place, and the conv weights prepared for the packed and Winograd
//! kernels (shared with other executors holding the same weights: `crate::prepared`). Made
//! once per executor (`CpuExecutor::new`); runs only read it.

use crate::steps::chain::ChainStep;
use crate::steps::conv::ConvStep;
use crate::steps::node::{plan_mm_views, MmView};
use crate::steps::rows::RowStep;
use crate::steps::Step;
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor};
use rlx_kernels::kernels::conv::{Packed, WinogradWeights};
use rlx_kernels::kernels::mm_packed::PackedB;
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct Plan {
    /// Per node, in node order: what its turn in a fused run does.
    pub steps: Vec<Step>,
    /// Per node: the inputs whose last reader is this node (buffers freed after it runs).
    pub free_after: Vec<Vec<NodeId>>,
    /// Per node: input 0 dies here and is used once by this node (its buffer may be reused).
    pub can_take0: Vec<bool>,
    /// Per node: an f32/f64 Add or Mul whose input 1 has the output's dims and dies here,
    /// used once (torch exports `bias + x`: the big operand second).
    pub can_take1: Vec<bool>,
    /// Per MatMul node: for each operand that is a Transpose read by nothing else, that
    /// Transpose's node, its input and perm; with fusion on, the Transpose is not run and
    /// the MatMul reads its input in place (`matmul::matmul_perm`).
    pub mm_views: Vec<[Option<MmView>; 2]>,
    /// Per Conv node with constant weights the Winograd path takes: their transform
    /// (`rlx_kernels::kernels::conv::winograd`), shared by the executors holding the same
    /// weights (`crate::prepared`; so are `packed` and the groups' own). Not made for a
    /// conv whose fused group folds other weights in (the group's step has its own).
    pub wino: Vec<Option<Arc<WinogradWeights>>>,
    /// Per Conv node with constant weights that RLX's own product kernel takes and the
    /// Winograd path does not: the weights packed for it (`kernels::conv::packed`), made
    /// once per weight and shared. As for `wino`, a folded group's step has its own. None with
    /// `RLX_CPU_MK=0` (the gemm path, for A/B).
    pub packed: Vec<Option<Arc<Packed>>>,
    /// Per f32 MatMul whose second operand is a 2-D constant, whose first is not a Transpose
    /// read in place and whose output has at least `mm_packed::MIN_ROWS` rows: the
    /// constant packed in column panels
    /// (`kernels::mm_packed`, AMD with AVX-512 only), made once per weight and shared.
    pub mm_packed: Vec<Option<Arc<PackedB>>>,
    /// Per node whose turn makes the first input of a Concat that extends it in place
    /// (`shape::concat_onto`: batch-1 channel concats, the input dying there): `(its
    /// elements, the Concat's)`, asked of the buffer pool before the turn
    /// (`buffers::reserve_next`) so the Concat copies only its other inputs. The node is
    /// the input's own or, for a group's value, the group's step.
    pub reserve: Vec<Option<(usize, usize)>>,
}

impl Plan {
    /// The plan of `graph`, a graph that `CpuExecutor::new` checked (topological order,
    /// static non-leaf dims, outputs that are nodes).
    pub(crate) fn new(graph: &Graph) -> Plan {
        crate::prepared::release_unused();
        let n = graph.len();
        let mut is_output = vec![false; n];
        for o in &graph.outputs {
            is_output[o.index()] = true;
        }
        let mut consumers = vec![vec![]; n];
        for node in &graph.nodes {
            for i in &node.inputs {
                consumers[i.index()].push(node.id);
            }
        }
        // A Transpose that a MatMul reads in place: the MatMul reads the Transpose's input.
        let mm_views = plan_mm_views(graph, &consumers, &is_output);
        let mut viewed = vec![false; n];
        let mut fusions = crate::fuse::plan(graph, &consumers, &is_output);
        let rows = crate::rowfuse::plan(graph, &consumers, &is_output);
        // A Mul that a row group computes (an RMSNorm's `x * inv` on `[1, C, 1, W]`, whose
        // `inv` is `[1, C, 1, 1]`) stays the row group's: a conv may not also take it as its
        // scale Mul, whose operand `inv` the fused row never stores.
        for sc in fusions.scaled.iter_mut() {
            let m = sc.as_ref().map(|s| s.mul.index());
            if let Some(m) = m {
                if rows.at[m].is_some() || rows.member_of[m].is_some() {
                    fusions.scale_mul[m] = None;
                    *sc = None;
                }
            }
        }
        // Per value, the nodes that read it when fused: its consumers, a MatMul that reads
        // it through a Transpose (`mm_views`), and a conv that takes a scale Mul's operands
        // (`fuse::Scaled`); those are not graph edges.
        let mut readers = consumers.clone();
        for (i, v) in mm_views.iter().enumerate() {
            for v in v.iter().flatten() {
                viewed[v.transpose.index()] = true;
                readers[v.src.index()].push(NodeId(i as u32));
            }
        }
        for (grp, sc) in fusions.groups.iter().zip(&fusions.scaled) {
            if let Some(sc) = sc {
                readers[sc.x.index()].push(grp.conv);
                readers[sc.s.index()].push(grp.conv);
            }
        }
        // Liveness: a value's buffer dies after its last reader, unless it is an output.
        let last_use: Vec<Option<usize>> = readers
            .iter()
            .map(|r| r.iter().map(|x| x.index()).max())
            .collect();
        let mut free_after = vec![vec![]; n];
        for (v, lu) in last_use.iter().enumerate() {
            if let (Some(u), false) = (lu, is_output[v]) {
                free_after[*u].push(NodeId(v as u32));
            }
        }
        let res_take: Vec<bool> = fusions
            .groups
            .iter()
            .map(|grp| {
                grp.residual.is_some_and(|r| {
                    let s = r.skip.index();
                    !is_output[s]
                        && last_use[s] == Some(r.add.index())
                        && readers[s]
                            .iter()
                            .all(|u| *u == r.add || u.index() < grp.conv.index())
                })
            })
            .collect();
        let can_take0: Vec<bool> = graph
            .nodes
            .iter()
            .map(|node| match node.inputs.first() {
                Some(&i0) => {
                    free_after[node.id.index()].contains(&i0)
                        && node.inputs.iter().filter(|&&x| x == i0).count() == 1
                }
                None => false,
            })
            .collect();
        let can_take1 = graph
            .nodes
            .iter()
            .map(|node| match (&node.op, node.inputs.as_slice()) {
                (Op::Binary(BinaryOp::Add | BinaryOp::Mul), &[i0, i1]) => {
                    i0 != i1
                        && free_after[node.id.index()].contains(&i1)
                        && graph.node(i1).shape == node.shape
                        && matches!(node.shape.dtype, DType::F32 | DType::F64)
                }
                _ => false,
            })
            .collect();
        let taken: Vec<bool> = (0..n)
            .map(|i| {
                fusions.at_conv[i].is_some()
                    || fusions.member_of[i].is_some()
                    || fusions.scale_mul[i].is_some()
                    || fusions.residual_of[i].is_some()
                    || rows.at[i].is_some()
                    || rows.member_of[i].is_some()
            })
            .collect();
        // Chains see the in-place MatMul reads too: an operand such a MatMul reads later
        // does not give its buffer to a chain's output.
        let ew = crate::ewfuse::plan(graph, &readers, &is_output, &taken);
        // RLX_CPU_WINOGRAD=0 at build: no transforms made (no memory or time spent).
        let wino_on = !rlx_ir::env::is_off("RLX_CPU_WINOGRAD");
        let mut folded_conv = vec![false; n];
        // A group's folded weights, made one group at a time: kept where a path reads them
        // unpacked (Winograd, gemm, the direct and depthwise kernels, a scale Mul folded in
        // at run time, a depthwise pair); where RLX's product kernel alone reads them, only
        // packed (folded, packed and let go: `fuse::Folded::w`).
        let mut group_wino: Vec<Option<Arc<WinogradWeights>>> = Vec::new();
        let mut group_packed: Vec<Option<Arc<Packed>>> = Vec::new();
        for (k, grp) in fusions.groups.iter_mut().enumerate() {
            let conv = graph.node(grp.conv);
            let (Some(f), Op::Conv(a)) = (grp.folded.as_mut(), &conv.op) else {
                group_wino.push(None);
                group_packed.push(None);
                continue;
            };
            folded_conv[grp.conv.index()] = true;
            // The decisions read the weights' dims and dtype: the conv's own serve.
            let takes_wino =
                wino_on && rlx_kernels::kernels::conv::winograd_takes(&f.src.w, a, &conv.shape);
            // Paths that read the folded weights unpacked: Winograd (and its direct
            // fallback), a scale Mul folded in per run, a depthwise pair by bands (by
            // blocks it reads the packed weights).
            let bands = fusions.then_dw[k].is_some() && crate::fuse::pair_by_bands(&conv.shape);
            if takes_wino || fusions.scaled[k].is_some() || bands {
                f.w = f.shared();
            }
            let wg = (f.w.as_ref())
                .filter(|_| takes_wino)
                .and_then(crate::prepared::winograd);
            let pk = match wg {
                None => pack_conv(&f.src.w, a, &conv.shape, Some(&f.src)),
                Some(_) => None,
            };
            // Nothing packed: gemm, the direct or depthwise kernels read them.
            if f.w.is_none() && pk.is_none() {
                f.w = f.shared();
            }
            group_wino.push(wg);
            group_packed.push(pk);
        }
        let wino: Vec<Option<Arc<WinogradWeights>>> = graph
            .nodes
            .iter()
            .map(|node| match (&node.op, node.inputs.get(1)) {
                (Op::Conv(a), Some(w)) if wino_on && !folded_conv[node.id.index()] => {
                    match &graph.node(*w).op {
                        Op::Constant(t) => winograd(t, a, &node.shape),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect();
        // Weights for RLX's own conv kernel, where the Winograd path has none.
        let conv_packed: Vec<Option<Arc<Packed>>> = graph
            .nodes
            .iter()
            .zip(&wino)
            .map(|(node, wg)| match (&node.op, node.inputs.get(1)) {
                (Op::Conv(a), Some(w)) if wg.is_none() && !folded_conv[node.id.index()] => {
                    match &graph.node(*w).op {
                        Op::Constant(t) => pack_conv(t, a, &node.shape, None),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect();

        // Not where `a` is a Transpose read in place: that MatMul reads both through strides.
        let mm_packed: Vec<Option<Arc<PackedB>>> = (graph.nodes.iter())
            .zip(&mm_views)
            .map(|(node, [va, _])| {
                let (Op::MatMul, &[a, b], None) = (&node.op, node.inputs.as_slice(), va) else {
                    return None;
                };
                let Op::Constant(w) = &graph.node(b).op else {
                    return None;
                };
                let dims = node.shape.static_dims()?;
                let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
                let f32s = graph.node(a).shape.dtype == DType::F32 && w.dtype() == DType::F32;
                (f32s && rows >= rlx_kernels::kernels::mm_packed::MIN_ROWS)
                    .then(|| crate::prepared::panels(w))
                    .flatten()
            })
            .collect();

        // The steps: a node runs op by op unless a group runs it.
        let mut steps: Vec<Step> = viewed
            .iter()
            .map(|&v| if v { Step::View } else { Step::Node })
            .collect();
        let mut place = |head: NodeId, step: Step, covers: Vec<NodeId>| {
            for c in covers {
                steps[c.index()] = Step::Covered { head };
            }
            steps[head.index()] = step;
        };
        let dw_conv: Vec<Option<NodeId>> = (fusions.then_dw.iter())
            .map(|kb| kb.map(|kb| fusions.groups[kb].conv))
            .collect();
        let conv_parts = fusions.groups.into_iter().zip(fusions.scaled).zip(dw_conv);
        let conv_parts = conv_parts.zip(res_take).zip(group_wino).zip(group_packed);
        for (((((grp, scaled), then_dw), res_take), wino), packed) in conv_parts {
            let mut step = ConvStep {
                grp,
                scaled,
                then_dw,
                res_take,
                wino,
                packed,
            };
            // A pair on a small plane runs by blocks on the 1×1 conv's packed weights:
            // kept only where the blocks take it (else the two convs run apart, untried
            // each run).
            let conv = graph.node(step.grp.conv);
            if let Some(dw) = step
                .then_dw
                .filter(|_| !crate::fuse::pair_by_bands(&conv.shape))
            {
                let dw = graph.node(dw);
                let pk = step.packed_weights(&conv_packed);
                let takes = match (pk, &conv.op, &dw.op, dw.inputs.get(1)) {
                    (Some(pk), Op::Conv(a), Op::Conv(b), Some(&wb)) => {
                        let wb = graph.node(wb).shape.dims_usize();
                        rlx_kernels::kernels::conv::pair_blocks_take(
                            pk,
                            a,
                            &conv.shape,
                            &wb,
                            b,
                            &dw.shape,
                        )
                    }
                    _ => false,
                };
                if !takes {
                    step.then_dw = None;
                }
            }
            let head = step.grp.conv;
            let covers = step.covers().collect();
            place(head, Step::Conv(Box::new(step)), covers);
        }
        let mut row_heads = vec![NodeId(0); rows.groups.len()];
        for (i, k) in rows.at.iter().enumerate() {
            if let Some(k) = k {
                row_heads[*k] = NodeId(i as u32);
            }
        }
        for (grp, head) in rows.groups.into_iter().zip(row_heads) {
            let step = RowStep { grp };
            let covers = step.covers().collect();
            place(head, Step::Rows(Box::new(step)), covers);
        }
        for grp in ew.groups {
            let step = ChainStep { grp };
            let head = step.grp.members()[0];
            let covers = step.covers().collect();
            place(head, Step::Chain(Box::new(step)), covers);
        }
        let reserve = plan_reserve(graph, &steps, &can_take0);
        // The cache's folded weights that no step kept go now, not at the next build.
        crate::prepared::release_unused();
        Plan {
            steps,
            free_after,
            can_take0,
            can_take1,
            mm_views,
            wino,
            packed: conv_packed,
            mm_packed,
            reserve,
        }
    }

    /// The fused conv groups' steps.
    pub(crate) fn convs(&self) -> impl Iterator<Item = &ConvStep> {
        self.steps.iter().filter_map(|s| match s {
            Step::Conv(c) => Some(&**c),
            _ => None,
        })
    }

    /// The bound of the executor's buffer pool: the most bytes of f32 intermediates
    /// (non-leaf values) alive at once when `g` runs in order and each value dies after the
    /// node listing it in `free_after`, plus the largest of them.
    pub(crate) fn pool_limit_bytes(&self, g: &Graph) -> usize {
        let f32_bytes = |v: usize| {
            let node = &g.nodes[v];
            let leaf = matches!(
                node.op,
                Op::Input { .. } | Op::Param { .. } | Op::Constant(_)
            );
            if leaf || node.shape.dtype != DType::F32 {
                0
            } else {
                node.shape.numel().saturating_mul(4)
            }
        };
        let (mut live, mut peak, mut largest) = (0usize, 0usize, 0usize);
        for (i, dead) in self.free_after.iter().enumerate() {
            live = live.saturating_add(f32_bytes(i));
            peak = peak.max(live);
            largest = largest.max(f32_bytes(i));
            for d in dead {
                live = live.saturating_sub(f32_bytes(d.index()));
            }
        }
        // Plus the largest intermediate: the pool drops its oldest buffers first, and with
        // the peak alone a buffer as large as most of it (a 48 MB Relu output in a graph of
        // 3 MB convs) was pushed out by the later, smaller ones every run and allocated
        // again next run (12 k page faults, 29 ms for a 6.7 ms op in onnxruntime).
        peak.saturating_add(largest)
    }
}

/// [`Plan::reserve`]: for each Concat whose output is its inputs one after another (every
/// dim before the axis 1) and whose first input, made by a non-leaf node, dies there.
fn plan_reserve(graph: &Graph, steps: &[Step], can_take0: &[bool]) -> Vec<Option<(usize, usize)>> {
    let mut reserve = vec![None; graph.len()];
    for node in &graph.nodes {
        let (Op::Concat { axis }, [i0, _, ..]) = (&node.op, node.inputs.as_slice()) else {
            continue;
        };
        let Some(od) = node.shape.static_dims() else {
            continue;
        };
        let src = graph.node(*i0);
        let leaf = matches!(
            src.op,
            Op::Input { .. } | Op::Param { .. } | Op::Constant(_)
        );
        if !can_take0[node.id.index()]
            || leaf
            || *axis >= od.len()
            || od[..*axis].iter().any(|&d| d != 1)
        {
            continue;
        }
        let at = match steps[i0.index()] {
            Step::Covered { head } => head,
            _ => *i0,
        };
        reserve[at.index()].get_or_insert((src.shape.numel(), node.shape.numel()));
    }
    reserve
}

/// The Winograd transform of `w` where that path takes the conv, shared
/// (`crate::prepared`).
fn winograd(
    w: &Arc<Tensor>,
    a: &rlx_ir::ConvAttrs,
    out: &rlx_ir::Shape,
) -> Option<Arc<WinogradWeights>> {
    if !rlx_kernels::kernels::conv::winograd_takes(w, a, out) {
        return None;
    }
    crate::prepared::winograd(w)
}

/// Weights packed for RLX's own conv kernel, where it takes the conv (x86-64), shared
/// (`crate::prepared`): the constant `w`, or with `src` the weights a group folds from it
/// (`w` is then `src.w`, whose dims and dtype decide).
fn pack_conv(
    w: &Arc<Tensor>,
    a: &rlx_ir::ConvAttrs,
    out: &rlx_ir::Shape,
    src: Option<&crate::prepared::FoldSrc>,
) -> Option<Arc<Packed>> {
    #[cfg(target_arch = "x86_64")]
    {
        let form = rlx_kernels::kernels::conv::pack_form(w, a, out)?;
        crate::prepared::packed(w, form, src)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, a, out, src);
        None
    }
}

impl Drop for Plan {
    /// Lets go of the shared prepared weights this plan held, then drops the cache's
    /// entries nothing holds any more (the weights of a model dropped with its plans).
    fn drop(&mut self) {
        self.wino.clear();
        self.packed.clear();
        self.mm_packed.clear();
        self.steps.clear();
        crate::prepared::release_unused();
    }
}
