//! [`CpuExecutor`]: runs a whole graph in topological order on host tensors, with the
//! per-op NaN/Inf scan epilogue (`DebugScanner::scan_node`) when a scanner is on.
//!
//! Memory: every intermediate buffer is released right after its last consumer ran
//! (liveness from `Graph::use_counts`); an f32 one goes to the executor's pool, where the
//! kernels of later nodes and runs take their outputs from (`crate::buffers`). Inputs,
//! params and constants are borrowed, never
//! copied. Shape-only ops (Reshape) and in-place-capable elementwise ops take over their
//! input's buffer when that input dies at the node.
//!
//! The plan (`crate::plan`) gives each node a step (`crate::steps`); a run is a loop over
//! them: a plain node runs op by op, a fused group runs at its first node and its other
//! nodes' turns record them, or the group replays op by op when its value is not clean.

use crate::plan::Plan;
use crate::steps::{kernel_err, release, Run, Slot, Step, Turn};
use crate::CpuError;
use rlx_ir::numeric_check::{scan_data, NonFiniteCounts};
use rlx_ir::provenance::node_label;
use rlx_ir::{DebugScanner, Dim, Graph, NodeId, Op, Tensor};
use std::borrow::Borrow;
use std::collections::HashMap;

/// The per-node value hook of [`CpuExecutor::run_hooked`].
pub type Observer<'a> = &'a mut dyn FnMut(NodeId, &Tensor);

/// A prepared graph for the CPU. Plain owned data: `Send`, no interior mutability.
#[derive(Debug)]
pub struct CpuExecutor {
    graph: Graph,
    /// Param values by node index (None until set).
    params: Vec<Option<Tensor>>,
    param_ids: HashMap<String, NodeId>,
    inputs: Vec<NodeId>,
    /// The steps, liveness and prepared weights (`crate::plan`).
    pub(crate) plan: Plan,
    /// Per leaf whose value does not change between runs (Constant, Param once set): its
    /// NaN/Inf counts, computed at the first scanned run, so the scanner does not re-read
    /// weights every run, and building an executor (a dynamic model's plan per size
    /// signature) does not read them at all.
    leaf_counts: Vec<Option<std::sync::OnceLock<NonFiniteCounts>>>,
    /// Per node: its op only moves values (`numeric_check::only_moves_values`); the scanner
    /// records its output clean without reading it when every input was clean.
    moves: Vec<bool>,
    /// Some node is large enough for a kernel to split it over threads (see `parallel_work`).
    parallel_work: bool,
    /// Fused steps (`crate::steps`) run; else every node runs op by op.
    fuse_on: bool,
    /// 1×1 convs interleaved with their depthwise reader (`ConvStep::then_dw`), with fusion.
    pairs_on: bool,
    wino_on: bool,
    /// Free f32 buffers of dead values, reused by the kernels of later nodes and runs
    /// (`crate::buffers`).
    pool: rlx_kernels::buffers::Pool,
    /// Per-node wall time of the runs since [`CpuExecutor::set_profiling`] (None: off).
    profile: Option<NodeTimes>,
    /// Interleaved pair results used so far ([`CpuExecutor::paired_runs`]).
    pair_runs: u64,
    /// Scaled-conv results used so far ([`CpuExecutor::scaled_runs`]).
    scaled_runs: u64,
}

/// What one run records beyond its outputs, added to the executor's totals only when the
/// run succeeds ([`CpuExecutor::run_hooked`]).
struct RunStats<'a> {
    /// Per-node nanoseconds of this run are added here (profiling on).
    times: Option<&'a mut NodeTimes>,
    /// Interleaved pair results used.
    pairs: u64,
    /// Scaled-conv results used.
    scaled: u64,
}

/// Wall time per node, summed over the runs made while profiling was on
/// ([`CpuExecutor::set_profiling`], [`CpuExecutor::profile`]).
///
/// A node's time is the wall time from the start of its turn in the run loop to the start
/// of the next node's: its kernel, the release of the values that die there, and (with a
/// scanner) its scan. A fused group's time is on the node that runs it (the conv of a conv
/// epilogue group, the first node of a row group or elementwise chain, the 1×1 conv of a
/// 1×1 + depthwise pair, which carries the depthwise conv's time too); the group's other
/// nodes read about zero. Leaves (inputs, params, constants) cost only the loop's step. A
/// run that fails adds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTimes {
    /// Runs summed.
    pub runs: u64,
    /// Nanoseconds per node, indexed by [`NodeId::index`] of [`CpuExecutor::graph`].
    pub ns: Vec<u64>,
}

/// How long a spinning worker of [`run_with_spinning_workers`] polls without finding work
/// before it stops spinning. Longer than the serial stretches between parallel kernels of
/// the benchmark CNNs (tens of µs); short enough that the nested case it ends costs
/// little. Before it existed, that case hung a 2-thread run of a one-node depthwise model
/// within seconds (bench/NOTES.md §22).
const SPIN_IDLE: std::time::Duration = std::time::Duration::from_millis(1);

/// Runs `f` on a thread of the current rayon pool while the pool's other threads stay
/// awake: each polls for work (`rayon::yield_now`) in a loop until `f` returns, so a kernel
/// that splits work over the pool does not wait for a sleeping thread to be woken. Idle
/// rayon workers fall asleep within microseconds; waking one took a large share of a
/// multi-thread run of a CNN with many small parallel ops (mobilenet_v2 at 2 threads: ~17%
/// of the profile in the scheduler). The cost: the other threads busy-wait for the length
/// of the run, as onnxruntime's spinning pool does, or until they find no work for
/// [`SPIN_IDLE`].
fn run_with_spinning_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let main = rayon::current_thread_index();
        let done = &done;
        s.spawn_broadcast(move |_, ctx| {
            if Some(ctx.index()) == main {
                return;
            }
            // Give up after SPIN_IDLE without work: a worker can run this job nested,
            // while it waits inside a part of `f`'s parallel work that it took before this
            // job (a join whose other half was stolen back). Spinning there until `f`
            // returns would never end: `f` waits for that part. Leaving returns the worker
            // to the wait, and to rayon's sleep for the rest of the run.
            let mut idle_since: Option<std::time::Instant> = None;
            let mut polls = 0u32;
            while !done.load(Ordering::Acquire) {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    idle_since = None;
                    continue;
                }
                std::hint::spin_loop();
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(64) {
                    let t = *idle_since.get_or_insert_with(std::time::Instant::now);
                    if t.elapsed() >= SPIN_IDLE {
                        return;
                    }
                }
            }
        });
        // Set `done` when `f` returns or unwinds (a panic must not leave the workers
        // spinning and the scope waiting for them).
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _done = Done(done);
        f()
    })
}

/// True when some node of `g` is big enough that a kernel may split it over rayon: an output
/// of at least `PAR_THRESHOLD` elements, a MatMul of at least `GEMM_PAR_FLOPS` (2^22) or a
/// Conv of at least `CONV_SPLIT_FLOPS` (2^20) multiply-adds (output elements × reduction
/// length). Graphs below that (small transformers) run on the
/// calling thread even in a multi-thread pool: a hand-off costs more than they gain.
fn parallel_work(g: &Graph) -> bool {
    g.nodes.iter().any(|node| {
        if matches!(
            node.op,
            Op::Input { .. } | Op::Param { .. } | Op::Constant(_)
        ) {
            return false;
        }
        let numel: usize = node.shape.dims_usize().iter().product();
        let k = match &node.op {
            Op::MatMul => node
                .inputs
                .first()
                .and_then(|&i| g.node(i).shape.dims_usize().last().copied())
                .unwrap_or(1),
            Op::Conv(_) => node
                .inputs
                .get(1)
                .map(|&w| g.node(w).shape.dims_usize().iter().skip(1).product())
                .unwrap_or(1),
            _ => 1,
        };
        // A conv from CONV_SPLIT_FLOPS is split over the threads (`conv_float`).
        let flops = if matches!(node.op, Op::Conv(_)) {
            rlx_kernels::kernels::conv::CONV_SPLIT_FLOPS
        } else {
            rlx_kernels::kernels::matmul::GEMM_PAR_FLOPS
        };
        numel >= rlx_kernels::kernels::PAR_THRESHOLD || numel.saturating_mul(k) >= flops
    })
}

/// The counts of a finite value of node `node`'s type.
fn clean_counts(node: &rlx_ir::Node) -> NonFiniteCounts {
    NonFiniteCounts {
        len: node.shape.numel(),
        ..Default::default()
    }
}

/// Check run inputs against a graph's Input nodes `ids` (in order): their count, and each
/// tensor's dtype and dims. A symbolic dim matches any size when `symbolic_matches` (the CPU
/// sizes buffers per run), else it never matches (a backend that planned static buffers).
/// The error names the input: `input "x" expects f32[2,2], got f32[2,3]`.
pub fn check_feeds<I: Borrow<Tensor>>(
    g: &Graph,
    ids: &[NodeId],
    inputs: &[I],
    symbolic_matches: bool,
) -> Result<(), String> {
    if inputs.len() != ids.len() {
        let names: Vec<String> = ids.iter().map(|&i| node_label(g, i)).collect();
        return Err(format!(
            "graph {} takes {} inputs ({}), got {}",
            g.name,
            ids.len(),
            names.join(", "),
            inputs.len()
        ));
    }
    for (t, &id) in inputs.iter().zip(ids) {
        let t: &Tensor = t.borrow();
        let shape = &g.node(id).shape;
        let dims_ok = t.dims().len() == shape.rank()
            && t.dims().iter().zip(&shape.dims).all(|(&d, sd)| match sd {
                Dim::Static(s) => *s == d,
                Dim::Sym(_) => symbolic_matches,
            });
        if t.dtype() != shape.dtype || !dims_ok {
            return Err(format!(
                "input \"{}\" expects {shape}, got {}",
                node_label(g, id),
                t.shape()
            ));
        }
    }
    Ok(())
}

/// True when the CPU backend has a kernel for `op` (every non-leaf op today). Written as an
/// exhaustive match so a new `Op` variant must be considered here.
pub fn cpu_supports(op: &Op) -> bool {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant(_) => true,
        Op::Unary(_)
        | Op::Activation(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::BitCast { .. }
        | Op::MatMul
        | Op::Conv(_)
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::Pool(_)
        | Op::CumSum { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Broadcast { .. }
        | Op::Concat { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Tile { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::Trilu { .. }
        | Op::GatherND { .. }
        | Op::ScatterElements { .. }
        | Op::ScatterND { .. }
        | Op::TopK { .. }
        | Op::GridSample { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::BatchNorm { .. }
        | Op::Lrn { .. } => true,
    }
}

impl CpuExecutor {
    /// Prepare a plan for `graph` (nodes in topological order).
    ///
    /// Errors ([`CpuError::Kernel`], naming node id, op and label): an op without a CPU
    /// kernel, an input that refers to a later or missing node, a non-leaf node whose output
    /// dims are not static, a Constant whose tensor does not match its node type, a graph
    /// output that is not a node.
    pub fn new(graph: Graph) -> Result<CpuExecutor, CpuError> {
        let n = graph.len();
        let mut param_ids = HashMap::new();
        for node in &graph.nodes {
            let id = node.id;
            if !cpu_supports(&node.op) {
                return Err(kernel_err(&graph, id, "no CPU kernel for this op"));
            }
            if let Some(bad) = node.inputs.iter().find(|i| i.index() >= id.index()) {
                return Err(kernel_err(
                    &graph,
                    id,
                    format!("input {bad} is not an earlier node (graph not in topological order)"),
                ));
            }
            match &node.op {
                Op::Param { name } => {
                    param_ids.insert(name.clone(), id);
                }
                Op::Constant(t) => {
                    if t.shape() != node.shape {
                        return Err(kernel_err(
                            &graph,
                            id,
                            format!(
                                "constant holds {} but the node declares {}",
                                t.shape(),
                                node.shape
                            ),
                        ));
                    }
                }
                Op::Input { .. } => {}
                _ => {
                    if !node.shape.is_static() {
                        return Err(kernel_err(
                            &graph,
                            id,
                            format!(
                                "output type {} has symbolic dims (run shape inference first)",
                                node.shape
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(o) = graph.outputs.iter().find(|o| o.index() >= n) {
            return Err(CpuError::Input(format!("graph output {o} is not a node")));
        }
        let plan = Plan::new(&graph);
        let inputs = graph.inputs();
        let leaf_counts = graph
            .nodes
            .iter()
            .map(|node| match &node.op {
                Op::Constant(_) => Some(std::sync::OnceLock::new()),
                _ => None,
            })
            .collect();
        Ok(CpuExecutor {
            pool: rlx_kernels::buffers::Pool::with_limit(plan.pool_limit_bytes(&graph)),
            profile: None,
            pair_runs: 0,
            scaled_runs: 0,
            plan,
            wino_on: !rlx_ir::env::is_off("RLX_CPU_WINOGRAD"),
            fuse_on: !rlx_ir::env::is_off("RLX_CPU_FUSION"),
            pairs_on: !rlx_ir::env::is_off("RLX_CPU_PWDW"),
            parallel_work: parallel_work(&graph),
            leaf_counts,
            moves: graph
                .nodes
                .iter()
                .map(|node| rlx_ir::numeric_check::only_moves_values(&node.op, node.shape.dtype))
                .collect(),
            params: vec![None; n],
            param_ids,
            inputs,
            graph,
        })
    }

    /// How many times the runs of this executor used the interleaved result of a 1×1 conv
    /// and its depthwise reader ([`CpuExecutor::paired_convs`] plans them), with or without
    /// a NaN scan; a scanned pair whose values were not all finite is replayed op by op
    /// and not counted.
    pub fn paired_runs(&self) -> u64 {
        self.pair_runs
    }

    /// How many times the runs of this executor used a conv on scale-folded weights
    /// ([`CpuExecutor::scaled_convs`] plans them), skipping the scale Mul. With a NaN scan,
    /// only where the Mul's value is proven finite without making it (its operands scanned
    /// clean, the scale at most 1 in magnitude); a scanned result that was not clean is
    /// replayed op by op and not counted.
    pub fn scaled_runs(&self) -> u64 {
        self.scaled_runs
    }

    /// Turn per-node timing on (resetting the sums) or off (the default). While on, each run
    /// reads the clock once per node (about 20-40 ns each) and adds to [`NodeTimes`]; off,
    /// runs read no clock. Hooked runs ([`CpuExecutor::run_hooked`] with hooks) are timed
    /// too, hooks included.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| NodeTimes {
            runs: 0,
            ns: vec![0; self.graph.len()],
        });
    }

    /// The per-node times summed since profiling was turned on (None when off).
    pub fn profile(&self) -> Option<&NodeTimes> {
        self.profile.as_ref()
    }

    /// Turn fusion on or off (default: on, unless `RLX_CPU_FUSION=0`). Fused, a Conv
    /// followed by per-channel Add/Sub/Mul/Div with constants (a decomposed
    /// BatchNormalization) and an optional Relu runs as one conv with the affine map folded
    /// into its weights; results differ from the unfused chain by rounding only. Decomposed
    /// Softmax, LayerNorm and RMSNorm over the last axis run one row at a time
    /// (`crate::rowfuse`), with the unfused bits. Hooked
    /// runs always run unfused; with a NaN scanner on, a group whose output is not finite
    /// is replayed unfused, so reports name the same op either way.
    pub fn set_fusion(&mut self, on: bool) {
        self.fuse_on = on;
    }

    /// Turn the interleaving of a 1×1 conv and its depthwise reader on or off (default: on,
    /// unless `RLX_CPU_PWDW=0`; see [`CpuExecutor::paired_convs`]). It applies only while
    /// fusion is on; either way the values are the same bits, so this is for timing.
    pub fn set_pairing(&mut self, on: bool) {
        self.pairs_on = on;
    }

    /// Turn the Winograd convolution on or off (default: on, unless `RLX_CPU_WINOGRAD=0`).
    /// On, an f32 2-D Conv with a constant 3×3 kernel, stride 1, dilation 1, one group and
    /// at least 32 input and output channels runs as Winograd F(2×2, 3×3) (16 gemm products
    /// of transformed tiles instead of im2col + one product; Lavin & Gray 2016), whose values
    /// differ from the direct sum by round-off only (about 1e-6 relative). An output that is
    /// not finite is recomputed directly, so NaN/Inf values and reports are the same either
    /// way. Off, every conv runs as im2col + gemm, as in hooked runs (printer, trace, `rlx
    /// diverge`'s oracle). A conv whose fused group folds other weights in keeps the
    /// Winograd path only while fusion is on. Not taken (at build) on a plane of few tiles
    /// with large weights (`kernels::conv::winograd_pays`: images × 2×2 tiles under 32 and
    /// over 1 MiB of transformed weights).
    pub fn set_winograd(&mut self, on: bool) {
        self.wino_on = on;
    }

    /// The number of Conv nodes and fused groups prepared for the Winograd path (whether or
    /// not it is on; none when `RLX_CPU_WINOGRAD=0` at build, so `set_winograd(true)` then
    /// changes nothing).
    pub fn winograd_convs(&self) -> usize {
        let convs = self.plan.wino.iter().flatten().count();
        convs + self.plan.convs().filter(|c| c.wino.is_some()).count()
    }

    /// The number of fused Conv groups (0 when fusion found nothing to fuse).
    pub fn fused_groups(&self) -> usize {
        self.plan
            .convs()
            .filter(|c| !c.grp.members.is_empty())
            .count()
    }

    /// How many fused Conv groups take the residual Add after them (and its Relu) into the
    /// conv's epilogue on runs without a scanner or hooks (`RLX_CPU_RESIDUAL=0`: none); a
    /// group on the Winograd path still runs its Add apart.
    pub fn fused_residuals(&self) -> usize {
        self.plan
            .convs()
            .filter(|c| c.grp.residual.is_some())
            .count()
    }

    /// How many fused Conv groups end in the MaxPool that alone reads them, run with the
    /// conv in bands of rows (`rlx_kernels::kernels::conv::banded`; `RLX_CPU_CONV_POOL=0`:
    /// none).
    pub fn fused_pools(&self) -> usize {
        self.plan.convs().filter(|c| c.grp.pool.is_some()).count()
    }

    /// How many decomposed Softmaxes, LayerNorms and RMSNorms run fused, one row at a time
    /// (`crate::rowfuse`; on and off with the conv groups).
    pub fn fused_row_groups(&self) -> usize {
        (self.plan.steps.iter())
            .filter(|s| matches!(s, Step::Rows(_)))
            .count()
    }

    /// How many 1×1 convs run interleaved with the depthwise conv that alone reads their
    /// output (`crate::fuse::run_pair`: bands of rows, or blocks of channels on small
    /// planes, so the depthwise conv reads the 1×1 conv's output from cache; on and off with the other fusions; with a scanner too, each
    /// conv's largest |y| taken in the kernels, the pair replayed op by op when not finite;
    /// [`CpuExecutor::set_pairing`]). On planes over 1024 pixels a pair whose kernels do
    /// not apply at run time (no AVX-512, another kernel size) runs apart; on smaller ones
    /// only the pairs that run by blocks of channels are planned (the 1×1 conv on
    /// AVX-512 packed weights, a depthwise conv the channel-block kernel takes:
    /// `kernels::conv::pair_blocks_take`).
    pub fn paired_convs(&self) -> usize {
        self.plan.convs().filter(|c| c.then_dw.is_some()).count() * self.pairs_on as usize
    }

    /// How many 1×1 convs take the per-channel scale Mul before them into their weights
    /// at run time (`crate::fuse::Scaled`: a Squeeze-and-Excitation block's `x · s`, `s`
    /// of dims `[1, C, 1, 1]`, read only by the conv, where the conv has fewer output
    /// channels than pixels). The Mul is not run; on and off with the other fusions. With
    /// a scanner, only where the Mul's value is proven finite (see
    /// [`CpuExecutor::scaled_runs`]); else the Mul runs, so reports name it.
    pub fn scaled_convs(&self) -> usize {
        self.plan.convs().filter(|c| c.scaled.is_some()).count()
    }

    /// How many elementwise chains run block by block (`crate::ewfuse`: connected f32
    /// Unary/Activation/Binary ops with a Unary or Activation among them, such as GELU;
    /// on and off with the other fusions).
    pub fn fused_chains(&self) -> usize {
        (self.plan.steps.iter())
            .filter(|s| matches!(s, Step::Chain(_)))
            .count()
    }

    /// How many f32 MatMuls read their constant weights packed once in column panels
    /// (`kernels::mm_packed`: AMD with AVX-512, at least `mm_packed::MIN_ROWS` output rows,
    /// not with `RLX_CPU_MK=0`); gemm's micro-kernel, without its per-call copy of the
    /// weights.
    pub fn packed_matmuls(&self) -> usize {
        self.plan.mm_packed.iter().filter(|p| p.is_some()).count()
    }

    /// How many runs of GELU's erf form (`x / c0`, Erf, `+ c1`, `x ·`, `· c2`) inside those
    /// chains run as one pass (`ewfuse::gelu`; the same bits as the five ops).
    pub fn fused_gelus(&self) -> usize {
        (self.plan.steps.iter())
            .map(|s| match s {
                Step::Chain(c) => c.grp.gelus(),
                _ => 0,
            })
            .sum()
    }

    /// How many Transposes a MatMul reads in place, through strides, instead of running
    /// them (a float Transpose whose only use is a MatMul operand, and not a graph
    /// output; on and off with the other fusions). With a scanner, such a Transpose still
    /// runs when its input is not all finite, so reports give the transposed positions.
    pub fn transposes_read_in_place(&self) -> usize {
        (self.plan.steps.iter())
            .filter(|s| matches!(s, Step::View))
            .count()
    }

    /// The graph this executor runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Names of the Param nodes that have no value yet.
    pub fn missing_params(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .param_ids
            .iter()
            .filter(|(_, id)| self.params[id.index()].is_none())
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// Set the Param node named `name` to `t`.
    ///
    /// The tensor must have the node's dtype and element count (its dims are replaced by
    /// the node's, so a flat vector is accepted). Errors: [`CpuError::Param`] for an
    /// unknown name, a wrong dtype or element count.
    pub fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), CpuError> {
        let id = *self.param_ids.get(name).ok_or_else(|| {
            CpuError::Param(format!(
                "no param named \"{name}\" in graph {}",
                self.graph.name
            ))
        })?;
        let shape = &self.graph.node(id).shape;
        let dims = shape.dims_usize();
        if t.dtype() != shape.dtype {
            return Err(CpuError::Param(format!(
                "param \"{name}\" is {shape} but the value is {}",
                t.shape()
            )));
        }
        let n: usize = dims.iter().product();
        if t.numel() != n || !shape.is_static() {
            return Err(CpuError::Param(format!(
                "param \"{name}\" is {shape} ({n} elements) but the value has {} elements",
                t.numel()
            )));
        }
        let t = t
            .reshaped(dims)
            .map_err(|e| CpuError::Param(format!("param \"{name}\": {e}")))?;
        self.leaf_counts[id.index()] = Some(std::sync::OnceLock::new());
        self.params[id.index()] = Some(t);
        Ok(())
    }

    /// Run with `inputs` in `graph.inputs()` order; returns the outputs in `graph.outputs`
    /// order.
    ///
    /// Each input's dtype and dims are checked against its Input node (a symbolic dim
    /// matches any size): [`CpuError::Input`] names the input. A kernel failure is a
    /// [`CpuError::Kernel`] naming the node. With `scanner` on, every node's output (leaves
    /// included) is scanned right after it is produced; in abort mode the first NaN created
    /// ends the run with [`CpuError::NanAbort`]. With `scanner` None or off, no scan work.
    pub fn run(
        &mut self,
        inputs: &[Tensor],
        scanner: Option<&mut DebugScanner>,
    ) -> Result<Vec<Tensor>, CpuError> {
        self.run_hooked(inputs, scanner, None, None)
    }

    /// [`CpuExecutor::run`] on borrowed inputs: the caller keeps its tensors (nothing is
    /// copied or freed for them), as onnxruntime reads a NumPy input in place. Same checks
    /// and errors as `run`.
    pub fn run_refs(
        &mut self,
        inputs: &[&Tensor],
        scanner: Option<&mut DebugScanner>,
    ) -> Result<Vec<Tensor>, CpuError> {
        self.run_hooked(inputs, scanner, None, None)
    }

    /// [`CpuExecutor::run`], calling `observe(node, &value)` after each node (leaves
    /// included) has produced its value, before it is scanned.
    pub fn run_observed(
        &mut self,
        inputs: &[Tensor],
        scanner: Option<&mut DebugScanner>,
        observe: &mut dyn FnMut(NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, CpuError> {
        self.run_hooked(inputs, scanner, None, Some(observe))
    }

    /// The general form: `before(node)` is called before each node runs and
    /// `observe(node, &value)` after.
    pub fn run_hooked<I: Borrow<Tensor> + Sync>(
        &mut self,
        inputs: &[I],
        scanner: Option<&mut DebugScanner>,
        before: Option<&mut dyn FnMut(NodeId)>,
        observe: Option<Observer<'_>>,
    ) -> Result<Vec<Tensor>, CpuError> {
        // Called from outside a multi-thread pool: run the whole graph on a pool thread, so
        // the parallel kernels split work among the pool's threads without one hand-off
        // from this thread per op. (Hooks are not `Send`; hooked runs stay here.)
        let mut pool = std::mem::take(&mut self.pool);
        let mut prof = self.profile.take();
        // A failed run adds nothing to the profile (its partial times are undone).
        let prof_before = prof.as_ref().map(|p| p.ns.clone());
        let mut stats = RunStats {
            times: prof.as_mut(),
            pairs: 0,
            scaled: 0,
        };
        let r = if before.is_none()
            && observe.is_none()
            && rayon::current_thread_index().is_none()
            && self.parallel_work
            && rayon::current_num_threads() > 1
        {
            let (pool, stats) = (&mut pool, &mut stats);
            run_with_spinning_workers(|| self.run_inner(inputs, scanner, None, None, pool, stats))
        } else {
            self.run_inner(inputs, scanner, before, observe, &mut pool, &mut stats)
        };
        let (pairs, scaled) = (stats.pairs, stats.scaled);
        self.pool = pool;
        match (&r, prof.as_mut(), prof_before) {
            (Ok(_), Some(p), _) => p.runs += 1,
            (Err(_), Some(p), Some(ns)) => p.ns = ns,
            _ => {}
        }
        self.profile = prof;
        if r.is_ok() {
            self.pair_runs += pairs;
            self.scaled_runs += scaled;
        }
        r
    }

    fn run_inner<I: Borrow<Tensor>>(
        &self,
        inputs: &[I],
        scanner: Option<&mut DebugScanner>,
        mut before: Option<&mut dyn FnMut(NodeId)>,
        mut observe: Option<Observer<'_>>,
        pool: &mut rlx_kernels::buffers::Pool,
        stats: &mut RunStats,
    ) -> Result<Vec<Tensor>, CpuError> {
        // Kernels on this thread take their output buffers from `pool`; dead values'
        // buffers go back to it (`release`).
        let _pool = rlx_kernels::buffers::Active::install(pool);
        let g = &self.graph;
        self.check_inputs(inputs)?;
        let mut scanner = scanner.filter(|s| s.is_on());
        if let Some(s) = scanner.as_deref_mut() {
            s.begin_run(g);
        }
        let mut next_input = 0;
        // Fused steps (crate::steps): off with hooks (hooked runs show every value).
        let hooked = before.is_some() || observe.is_some();
        let fuse = self.fuse_on && !hooked;
        let mut run = Run {
            slots: (0..g.len()).map(|_| Slot::Empty).collect(),
            // With a scanner: per node, its output was found (or is known) clean.
            finite: vec![false; if scanner.is_some() { g.len() } else { 0 }],
            group: vec![0; if fuse { g.len() } else { 0 }],
            scan: scanner.is_some(),
            // Winograd convs and RLX's own conv kernel: off with hooks too (hooked runs
            // show plain op-by-op values).
            wino: self.wino_on && !hooked,
            fast: !hooked,
            pairs_on: self.pairs_on,
            pairs: 0,
            scaled: 0,
        };
        // Profiling: the node whose turn started at `clock.1` (its time is added when the
        // next node's turn starts, so no `continue` below needs to stop the clock).
        let mut clock = (stats.times.is_some() && !g.nodes.is_empty())
            .then(|| (0usize, std::time::Instant::now()));
        for (node, step) in g.nodes.iter().zip(&self.plan.steps) {
            let id = node.id;
            let i = id.index();
            if let (Some((last, t0)), Some(p)) = (clock.as_mut(), stats.times.as_deref_mut()) {
                let now = std::time::Instant::now();
                p.ns[*last] += (now - *t0).as_nanos() as u64;
                (*last, *t0) = (i, now);
            }
            // The buffer a Concat will extend in place gets room for it (`Plan::reserve`).
            if fuse {
                match self.plan.reserve[i] {
                    Some((n, cap)) => rlx_kernels::buffers::reserve_next(n, cap),
                    None => rlx_kernels::buffers::reserve_clear(),
                }
            }
            let turn = if fuse && !matches!(step, Step::Node) {
                step.turn(&self.plan, g, id, &mut run)?
            } else {
                Turn::Op
            };
            if turn == Turn::Done {
                // Computed with its group; finite when scanned (else it was replayed).
                if let Some(s) = scanner.as_deref_mut() {
                    run.finite[i] = true;
                    s.scan_counts(g, id, clean_counts(node))?;
                }
                for dead in &self.plan.free_after[i] {
                    release(&mut run.slots[dead.index()]);
                }
                continue;
            }
            if let Some(b) = before.as_deref_mut() {
                b(id);
            }
            let slot = match &node.op {
                Op::Input { .. } => {
                    let t = inputs[next_input].borrow();
                    next_input += 1;
                    Slot::Borrowed(t)
                }
                Op::Param { name } => match &self.params[i] {
                    Some(t) => Slot::Borrowed(t),
                    None => {
                        return Err(CpuError::Param(format!(
                            "param \"{name}\" ({}) was not set before run",
                            node.shape
                        )))
                    }
                },
                Op::Constant(t) => Slot::Borrowed(t.as_ref()),
                op => Slot::Owned(crate::steps::node::run_op(
                    &self.plan,
                    g,
                    id,
                    op,
                    &mut run.slots,
                    run.wino,
                    run.fast,
                )?),
            };
            run.slots[i] = slot;
            if observe.is_some() || scanner.is_some() {
                let t = run.slots[i].get().expect("slot just set");
                if let Some(o) = observe.as_deref_mut() {
                    o(id, t);
                }
                if let Some(s) = scanner.as_deref_mut() {
                    let c = match &self.leaf_counts[i] {
                        Some(c) => *c.get_or_init(|| scan_data(t.data())),
                        // Only moved values, all of them finite: not read again.
                        None if self.moves[i]
                            && node.inputs.iter().all(|x| run.finite[x.index()]) =>
                        {
                            NonFiniteCounts {
                                len: t.data().len(),
                                ..Default::default()
                            }
                        }
                        None => rlx_kernels::kernels::wide::scan_counts(t.data()),
                    };
                    run.finite[i] = c.is_clean();
                    if c.has_nan() {
                        // Where, so an elementwise op's new NaN beside carried ones is seen.
                        s.note_nan_positions(g, id, t.data());
                    }
                    s.scan_counts(g, id, c)?;
                }
            }
            for dead in &self.plan.free_after[i] {
                release(&mut run.slots[dead.index()]);
            }
        }
        rlx_kernels::buffers::reserve_clear();
        if let (Some((last, t0)), Some(p)) = (clock, stats.times.as_deref_mut()) {
            p.ns[last] += t0.elapsed().as_nanos() as u64;
        }
        (stats.pairs, stats.scaled) = (run.pairs, run.scaled);
        if let Some(s) = scanner {
            s.finish_run(g)?;
        }
        let mut slots = run.slots;
        // Move owned outputs out (cloning only when an output is listed twice or borrowed).
        let mut remaining: HashMap<usize, usize> = HashMap::new();
        for o in &g.outputs {
            *remaining.entry(o.index()).or_default() += 1;
        }
        let mut outs = Vec::with_capacity(g.outputs.len());
        for o in &g.outputs {
            let k = o.index();
            let r = remaining.get_mut(&k).expect("counted");
            *r -= 1;
            let t = if *r == 0 {
                match std::mem::replace(&mut slots[k], Slot::Empty) {
                    Slot::Owned(t) => t,
                    Slot::Borrowed(t) => t.clone(),
                    Slot::Empty => return Err(kernel_err(g, *o, "output was never computed")),
                }
            } else {
                slots[k]
                    .get()
                    .cloned()
                    .ok_or_else(|| kernel_err(g, *o, "output was never computed"))?
            };
            // A buffer from the pool may have spare capacity: the caller gets a tight one.
            let mut t = t;
            if let rlx_ir::TensorData::F32(v) = t.data_mut() {
                v.shrink_to_fit();
            }
            outs.push(t);
        }
        Ok(outs)
    }

    fn check_inputs<I: Borrow<Tensor>>(&self, inputs: &[I]) -> Result<(), CpuError> {
        check_feeds(&self.graph, &self.inputs, inputs, true).map_err(CpuError::Input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, BinaryOp, DType, ReduceKind, Shape, UnaryOp};

    /// A graph whose largest intermediate is most of its peak (a 1 M-element Relu, reduced
    /// at once) followed by smaller values that die later: the pool keeps the large buffer
    /// between runs (the peak alone as the bound pushed it out, oldest first, every run).
    #[test]
    fn the_pool_keeps_a_dominant_buffer_between_runs() {
        let big = 1 << 20;
        let mut g = Graph::new("pool");
        let e = g.input("e", Shape::new(&[big], DType::F32));
        let x = g.input("x", Shape::new(&[64, 1024], DType::F32));
        let r = g.add_node(
            Op::Activation(Activation::Relu),
            vec![e],
            Shape::new(&[big], DType::F32),
        );
        let m = g.add_node(
            Op::Reduce {
                kind: ReduceKind::Max,
                axes: vec![0],
                keepdims: false,
            },
            vec![r],
            Shape::new(&[], DType::F32),
        );
        // Eight values of x's size alive at once, then summed: seven of their buffers go
        // back to the pool after the large one.
        let sx = Shape::new(&[64, 1024], DType::F32);
        let vs: Vec<NodeId> = (0..8)
            .map(|_| g.add_node(Op::Unary(UnaryOp::Neg), vec![x], sx.clone()))
            .collect();
        let mut y = vs[0];
        for &v in &vs[1..] {
            y = g.add_node(Op::Binary(BinaryOp::Add), vec![y, v], sx.clone());
        }
        g.set_outputs(vec![m, y]);
        let mut ex = CpuExecutor::new(g).unwrap();
        // Op by op (a fused chain would make one buffer of the eight).
        ex.set_fusion(false);
        let ins = [
            Tensor::from_f32(&[big], vec![0.5; big]).unwrap(),
            Tensor::from_f32(&[64, 1024], vec![1.0; 64 * 1024]).unwrap(),
        ];
        for _ in 0..3 {
            let out = ex.run(&ins, None).unwrap();
            assert_eq!(out[0].as_f32().unwrap(), &[0.5]);
            assert!(out[1].as_f32().unwrap().iter().all(|&v| v == -8.0));
            assert!(
                ex.pool.capacities().iter().any(|&c| c >= big),
                "the 1 M-element buffer was dropped: {:?}",
                ex.pool.capacities()
            );
        }
    }
}
