//! [`WgpuExecutor`]: plans a compiled graph once (placement per node, one storage buffer per
//! value, pipelines and bind groups), then runs it with one command encoder per run,
//! reading back only the outputs (every node's value when scanning or for
//! [`WgpuExecutor::run_all`]).

use crate::kernels::{self, GemmB, Ty, MAX_RANK, TILE};
use crate::testing::PlantedBug;
use crate::{gpu, Gpu, WgpuError};
use rlx_cpu::eval_op;
use rlx_ir::numeric_check::DebugScanner;
use rlx_ir::provenance::node_label;
use rlx_ir::{strides_of, DType, Graph, NodeId, Op, PadMode, PoolKind, Tensor, TensorData};
use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A WGSL kernel (or a buffer alias, for Reshape).
    Gpu,
    /// `rlx_cpu::eval_op` on values read back from the GPU; `reason` says why.
    CpuFallback { reason: String },
}

/// How a graph value is held in a GPU buffer (32-bit words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    F32,
    Bool,
    /// I64/I32 values narrowed to i32 (index tensors; checked on upload).
    I32,
}

fn enc_of(dt: DType) -> Option<Enc> {
    match dt {
        // float16/bfloat16 values live as f32 words: kernels compute in f32 and every GPU
        // node with such an output rounds it to its dtype (`round_spec`), as the CPU rounds
        // at op boundaries.
        DType::F32 | DType::F16 | DType::BF16 => Some(Enc::F32),
        DType::Bool => Some(Enc::Bool),
        DType::I64 | DType::I32 => Some(Enc::I32),
        _ => None,
    }
}

/// One input binding of a dispatch: the node whose buffer is bound.
struct Spec {
    src: String,
    inputs: Vec<NodeId>,
    meta: Vec<u32>,
    groups: [u32; 3],
    /// f32 words the node's output buffer needs when more than its elements (split-K
    /// partial products); 0 otherwise.
    out_words: usize,
}

struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    groups: [u32; 3],
    _meta: wgpu::Buffer,
}

enum Step {
    Leaf,
    Gpu(Vec<Dispatch>),
    Alias,
    Cpu(String),
}

/// Runs a compiled graph on the wgpu device. API parallel to `rlx_cpu::CpuExecutor`.
pub struct WgpuExecutor {
    gpu: Arc<Gpu>,
    graph: Graph,
    steps: Vec<Step>,
    /// Buffer index per node (aliases share one).
    buf: Vec<Option<usize>>,
    buffers: Vec<wgpu::Buffer>,
    /// Host-produced values (leaves, CPU nodes) that GPU kernels read: uploaded.
    upload: Vec<bool>,
    /// Gather index checks: (indices node, axis size, gather node).
    index_checks: Vec<(NodeId, usize, NodeId)>,
    /// Per Conv node: its fused dispatch (folded affine chain and Relu, writing the chain's
    /// last value), used by runs that read back only the outputs.
    fused: Vec<Option<Vec<Dispatch>>>,
    /// Nodes of a fused conv's chain or of a fused elementwise chain (all but its last):
    /// skipped by those runs.
    fused_skip: Vec<bool>,
    /// Elementwise chains run as one kernel (their dispatch sits at the chain's last node).
    fused_chains: usize,
    params: Vec<Option<Tensor>>,
    param_ids: HashMap<String, NodeId>,
    inputs: Vec<NodeId>,
    bug: Option<PlantedBug>,
    /// Device timing of runs (timestamp queries around each compute pass), when on.
    timing: Option<Timing>,
    last_device_ms: std::sync::Mutex<Option<f64>>,
    /// Per-node profiling (timestamps before and after each GPU node's dispatches), when on.
    prof: Option<Prof>,
    /// Per-node times summed since profiling was turned on.
    prof_times: Option<rlx_cpu::NodeTimes>,
    /// The last run's (node index, ns), moved into `prof_times` by `run`.
    prof_last: std::sync::Mutex<Vec<(usize, u64)>>,
}

/// Query sets for per-node profiling: two timestamps per GPU node, in sets of
/// [`QUERIES_PER_SET`].
struct Prof {
    sets: Vec<wgpu::QuerySet>,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
}

/// Queries per profiling query set (wgpu's limit per set is 4096).
const QUERIES_PER_SET: u32 = 4096;

impl Prof {
    /// Write timestamp query `q` (across the sets) into `pass`.
    fn stamp(&self, pass: &mut wgpu::ComputePass<'static>, q: u32) {
        let set = &self.sets[(q / QUERIES_PER_SET) as usize];
        pass.write_timestamp(set, q % QUERIES_PER_SET);
    }
}

/// Timestamp queries written at the start and end of each compute pass of a run (at most
/// `passes` passes are timed; a run with CPU fallbacks has one pass per GPU stretch).
struct Timing {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    passes: u32,
}

fn kernel_err(g: &Graph, id: NodeId, msg: impl Into<String>) -> WgpuError {
    WgpuError::Kernel {
        node: id,
        op: g.node(id).op.name(),
        label: node_label(g, id),
        msg: msg.into(),
    }
}

fn flat_groups(n: usize, per: u32, max: u32) -> Result<[u32; 3], String> {
    let groups = n.div_ceil(per as usize).max(1);
    let x = groups.min(max as usize);
    let y = groups.div_ceil(x);
    if y > max as usize {
        return Err(format!("{n} elements exceed the dispatch limits"));
    }
    Ok([x as u32, y as u32, 1])
}

fn u(v: usize) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("size {v} does not fit in u32"))
}

/// Strides (in elements) of `ind` broadcast right-aligned to `out` (0 where broadcast).
/// The copy kernel's per-axis rows for an output of dims `od`: `[out dim, in dim, in stride,
/// start, step, out stride]`, where `row(i)` gives the middle four for output axis `i`.
fn axis_rows(od: &[usize], row: impl Fn(usize) -> [i64; 4]) -> Vec<[i64; 6]> {
    let ost = strides_of(od);
    (0..od.len())
        .map(|i| {
            let [d, st, start, step] = row(i);
            [od[i] as i64, d, st, start, step, ost[i] as i64]
        })
        .collect()
}

fn bcast_strides(ind: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides_of(ind);
    let off = out.len() - ind.len();
    (0..out.len())
        .map(|i| {
            if i < off || ind[i - off] == 1 {
                0
            } else {
                st[i - off]
            }
        })
        .collect()
}

impl WgpuExecutor {
    /// Plan `graph` (the compiled, decomposed graph from `rlx_compile::compiler::compile`,
    /// nodes in topological order) for the process's wgpu device: decide each node's
    /// placement, allocate one storage buffer per value, build pipelines and bind groups,
    /// upload constants. Reads `RLX_DISPATCH_REPORT` (print placements) and the test-only
    /// planted-bug switch ([`crate::testing`]) once, here.
    ///
    /// Errors: [`WgpuError::NoAdapter`] when there is no adapter; [`WgpuError::Kernel`]
    /// naming the node for a graph that is not in topological order or has symbolic dims
    /// on a computed node; [`WgpuError::Gpu`] when wgpu fails to allocate.
    pub fn new(graph: Graph) -> Result<WgpuExecutor, WgpuError> {
        let gpu = gpu()?;
        let bug = crate::testing::planted_bug();
        let n = graph.len();
        let mut param_ids = HashMap::new();
        for node in &graph.nodes {
            if let Some(bad) = node.inputs.iter().find(|i| i.index() >= node.id.index()) {
                return Err(kernel_err(
                    &graph,
                    node.id,
                    format!("input {bad} is not an earlier node (graph not in topological order)"),
                ));
            }
            match &node.op {
                Op::Param { name } => {
                    param_ids.insert(name.clone(), node.id);
                }
                Op::Input { .. } => {}
                Op::Constant(t) => {
                    if t.shape() != node.shape {
                        return Err(kernel_err(
                            &graph,
                            node.id,
                            format!(
                                "constant holds {} but the node declares {}",
                                t.shape(),
                                node.shape
                            ),
                        ));
                    }
                }
                _ => {
                    if !node.shape.is_static() {
                        return Err(kernel_err(
                            &graph,
                            node.id,
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
            return Err(WgpuError::Input(format!("graph output {o} is not a node")));
        }
        let limit = gpu
            .limits
            .max_storage_buffer_binding_size
            .min(gpu.limits.max_buffer_size.min(u32::MAX as u64)) as usize;
        let fits = |id: NodeId| -> bool {
            let s = &graph.node(id).shape;
            s.is_static() && enc_of(s.dtype).is_some() && s.numel() * 4 <= limit
        };

        // 1. Placement and kernel specs.
        let mut specs: Vec<Option<Vec<Spec>>> = Vec::with_capacity(n);
        let mut steps: Vec<Step> = Vec::with_capacity(n);
        let mut index_checks = vec![];
        for node in &graph.nodes {
            if node.op.is_leaf() {
                specs.push(None);
                steps.push(Step::Leaf);
                continue;
            }
            let r = if !fits(node.id) {
                Err(format!(
                    "output {} is not a 32-bit GPU type or exceeds the adapter's {limit}-byte binding limit",
                    node.shape
                ))
            } else if let Some(&bad) = node.inputs.iter().find(|&&i| !fits(i)) {
                Err(format!(
                    "input {bad} ({}) is not a 32-bit GPU type or exceeds the adapter's binding limit",
                    graph.node(bad).shape
                ))
            } else {
                build_spec(&graph, node.id, &gpu.limits, bug).and_then(|s| match s {
                    Some(mut s) => {
                        let maxg = gpu.limits.max_compute_workgroups_per_dimension;
                        s.extend(round_spec(&graph, node.id, maxg)?);
                        Ok(Some(s))
                    }
                    None => Ok(None),
                })
            };
            match r {
                Ok(Some(s)) => {
                    if let Op::Gather { axis } = node.op {
                        let d = graph.node(node.inputs[0]).shape.dims_usize();
                        index_checks.push((node.inputs[1], d[axis], node.id));
                    }
                    specs.push(Some(s));
                    steps.push(Step::Gpu(vec![]));
                }
                Ok(None) => {
                    specs.push(None);
                    steps.push(Step::Alias);
                }
                Err(reason) => {
                    specs.push(None);
                    steps.push(Step::Cpu(reason));
                }
            }
        }

        // 2. Buffers: every GPU-produced value, and every host value a GPU node reads.
        let mut buf: Vec<Option<usize>> = vec![None; n];
        let mut buffers: Vec<wgpu::Buffer> = vec![];
        let mut upload = vec![false; n];
        // Words per node's buffer: its elements, or more for split-K partial products.
        let words: Vec<usize> = (0..n)
            .map(|k| {
                let extra = specs[k]
                    .iter()
                    .flatten()
                    .map(|s| s.out_words)
                    .max()
                    .unwrap_or(0);
                graph.nodes[k].shape.numel().max(extra)
            })
            .collect();
        let new_buf = |buffers: &mut Vec<wgpu::Buffer>, id: NodeId| -> usize {
            let bytes = (words[id.index()] * 4).max(4) as u64;
            buffers.push(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
            buffers.len() - 1
        };
        for node in &graph.nodes {
            let id = node.id;
            let on_gpu = matches!(steps[id.index()], Step::Gpu(_) | Step::Alias);
            if !on_gpu {
                continue;
            }
            for &i in &node.inputs {
                if buf[i.index()].is_none() {
                    // A host value (leaf or CPU node) read by a GPU kernel.
                    buf[i.index()] = Some(new_buf(&mut buffers, i));
                    upload[i.index()] = true;
                }
            }
            buf[id.index()] = match steps[id.index()] {
                Step::Alias => buf[node.inputs[0].index()],
                _ => Some(new_buf(&mut buffers, id)),
            };
        }

        // 3. Pipelines and bind groups (a shader wgpu rejects sends its node to the CPU).
        for (k, spec) in specs.into_iter().enumerate() {
            let Some(spec) = spec else { continue };
            let id = NodeId(k as u32);
            match make_dispatches(
                &gpu,
                &spec,
                &buf,
                None,
                &buffers,
                buf[k].expect("gpu node has a buffer"),
            ) {
                Ok(d) => steps[k] = Step::Gpu(d),
                Err(e) => {
                    // Its inputs keep their buffers; its consumers read its value after upload.
                    steps[k] = Step::Cpu(format!("shader rejected by wgpu: {e}"));
                    let _ = id;
                    upload[k] = true;
                }
            }
        }

        // 4. Conv epilogue fusion for runs that read back only the outputs: a Conv on the
        //    register-tiled kernel followed by per-channel affine ops (a decomposed
        //    BatchNormalization) and optionally a Relu runs as one conv with the affine map
        //    folded into its weights and bias (rlx_cpu::conv_affine_groups, as the CPU does),
        //    the Relu in its store; the chain's nodes are skipped. Runs that read every value
        //    (NaN scanning, the printer, divergence replay) run the nodes unfused.
        let mut fused: Vec<Option<Vec<Dispatch>>> = (0..n).map(|_| None).collect();
        let mut fused_skip = vec![false; n];
        if !rlx_ir::env::is_off("RLX_WGPU_FUSE") {
            for grp in rlx_cpu::conv_affine_groups(&graph) {
                let c = grp.conv.index();
                let all_gpu = std::iter::once(&grp.conv)
                    .chain(&grp.members)
                    .all(|m| matches!(steps[m.index()], Step::Gpu(_)));
                let out = grp.members.last().and_then(|m| buf[m.index()]);
                let (true, Some(out)) = (all_gpu, out) else {
                    continue;
                };
                let Ok(Some(mut spec)) = build_spec(&graph, grp.conv, &gpu.limits, bug) else {
                    continue;
                };
                let [one] = spec.as_mut_slice() else { continue };
                const STORE: &str = "o[(img * m[6] + ch) * P + pos] = v;";
                if !one.src.contains(STORE) {
                    continue; // not the register-tiled conv
                }
                let mut store = String::from("let at = (img * m[6] + ch) * P + pos; ");
                if grp.residual_skip.is_some() {
                    // The residual input d, bound after c; the output and meta move up one.
                    one.src = one
                        .src
                        .replace(
                            "@group(0) @binding(4) var<storage, read> m",
                            "@group(0) @binding(5) var<storage, read> m",
                        )
                        .replace(
                            "@group(0) @binding(3) var<storage, read_write> o",
                            "@group(0) @binding(3) var<storage, read> d: array<f32>;\n@group(0) @binding(4) var<storage, read_write> o",
                        );
                    store += "v = v + d[at]; ";
                }
                if grp.relu {
                    // NaN-propagating Relu (docs/WGPU.md: `max` drops NaN on GPUs).
                    store += "v = select(max(v, 0.0), v, is_nan(v)); ";
                }
                store += "o[at] = v;";
                one.src = one.src.replace(STORE, &store);
                let node = graph.node(grp.conv);
                let mut over = vec![buf[node.inputs[1].index()], buf[node.inputs[0].index()]];
                over.push(node.inputs.get(2).and_then(|b| buf[b.index()]).or(over[0]));
                if let Some(r) = grp.residual_skip {
                    if !matches!(steps[r.index()], Step::Gpu(_) | Step::Alias) {
                        continue; // the skip value is not on the GPU (host-made)
                    }
                    over.push(buf[r.index()]);
                    one.inputs.push(r);
                }
                if let Some((w, b)) = &grp.folded {
                    let mut up = |t: &Tensor| -> Option<usize> {
                        let v = t.as_f32()?;
                        let b = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                            label: None,
                            size: (v.len().max(1) * 4) as u64,
                            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        });
                        gpu.queue.write_buffer(&b, 0, bytemuck::cast_slice(v));
                        buffers.push(b);
                        Some(buffers.len() - 1)
                    };
                    over[0] = up(w);
                    over[2] = up(b);
                    one.meta[7] = 1; // has_bias: the folded bias
                }
                let Some(over) = over.into_iter().collect::<Option<Vec<usize>>>() else {
                    continue;
                };
                if let Ok(d) = make_dispatches(&gpu, &spec, &buf, Some(&over), &buffers, out) {
                    fused[c] = Some(d);
                    for m in &grp.members {
                        fused_skip[m.index()] = true;
                    }
                }
            }
        }

        // 5. Elementwise chains (f32 Unary/Activation/Binary nodes of one output size whose
        //    inner values have one reader and are not graph outputs) as one kernel, in the
        //    same runs: a LayerNorm's tail, RMSNorm, GELU, RoPE's products and sums.
        let mut fused_chains = 0;
        if !rlx_ir::env::is_off("RLX_WGPU_FUSE") && bug.is_none() {
            let maxg = gpu.limits.max_compute_workgroups_per_dimension;
            let max_ext = (gpu.limits.max_storage_buffers_per_shader_stage as usize)
                .saturating_sub(2)
                .min(8);
            for grp in plan_chains(&graph, &steps, &fused_skip, &fused) {
                let Some(spec) = chain_spec(&graph, &grp, maxg, max_ext) else {
                    continue;
                };
                let last = *grp.last().expect("groups have members");
                let Some(out) = buf[last.index()] else {
                    continue;
                };
                if let Ok(d) = make_dispatches(&gpu, &[spec], &buf, None, &buffers, out) {
                    fused[last.index()] = Some(d);
                    for m in &grp[..grp.len() - 1] {
                        fused_skip[m.index()] = true;
                    }
                    fused_chains += 1;
                }
            }
        }

        let ex = WgpuExecutor {
            fused_chains,
            fused,
            fused_skip,
            params: vec![None; n],
            param_ids,
            inputs: graph.inputs(),
            gpu,
            steps,
            buf,
            buffers,
            upload,
            index_checks,
            bug,
            graph,
            timing: None,
            last_device_ms: std::sync::Mutex::new(None),
            prof: None,
            prof_times: None,
            prof_last: std::sync::Mutex::new(vec![]),
        };
        // Constants are uploaded once.
        for node in &ex.graph.nodes {
            if let Op::Constant(t) = &node.op {
                if ex.upload[node.id.index()] {
                    ex.write_value(node.id, t)?;
                }
            }
        }
        if rlx_ir::env::is_on("RLX_DISPATCH_REPORT") {
            ex.print_dispatch_report();
        }
        Ok(ex)
    }

    /// The graph this executor runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// How many Conv nodes run fused with their affine chain (and Relu) in runs that read
    /// back only the outputs (`RLX_WGPU_FUSE=0`: none).
    pub fn fused_convs(&self) -> usize {
        self.fused.iter().filter(|f| f.is_some()).count() - self.fused_chains
    }

    /// How many elementwise chains run as one kernel in runs that read back only the
    /// outputs (`RLX_WGPU_FUSE=0`: none).
    pub fn fused_chains(&self) -> usize {
        self.fused_chains
    }

    /// The adapter the kernels run on.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.gpu.info
    }

    /// The planted kernel bug this executor was created with (test-only; `None` normally).
    #[doc(hidden)]
    pub fn planted_bug(&self) -> Option<PlantedBug> {
        self.bug
    }

    /// Placement of every non-leaf node, in topological order.
    pub fn placements(&self) -> Vec<(NodeId, Placement)> {
        self.graph
            .nodes
            .iter()
            .filter_map(|n| match &self.steps[n.id.index()] {
                Step::Leaf => None,
                Step::Gpu(_) | Step::Alias => Some((n.id, Placement::Gpu)),
                Step::Cpu(r) => Some((n.id, Placement::CpuFallback { reason: r.clone() })),
            })
            .collect()
    }

    fn print_dispatch_report(&self) {
        let g = &self.graph;
        let (mut ng, mut nc) = (0, 0);
        for (id, p) in self.placements() {
            let what = format!("{id} {} \"{}\"", g.node(id).op.name(), node_label(g, id));
            match p {
                Placement::Gpu => {
                    ng += 1;
                    eprintln!("rlx-wgpu dispatch: {what}: gpu");
                }
                Placement::CpuFallback { reason } => {
                    nc += 1;
                    eprintln!("rlx-wgpu dispatch: {what}: cpu fallback ({reason})");
                }
            }
        }
        let (nf, nch) = (self.fused_convs(), self.fused_chains());
        if nf + nch > 0 {
            let skipped = self.fused_skip.iter().filter(|&&x| x).count();
            eprintln!(
                "rlx-wgpu dispatch: fusion: {nf} convs with the BatchNorm/residual/Relu nodes after them and {nch} elementwise chains run as one kernel each, {skipped} nodes computed inside those kernels (runs that scan for NaN/Inf or read every value back run every node on its own; RLX_WGPU_FUSE=0 turns fusion off)"
            );
        }
        eprintln!(
            "rlx-wgpu dispatch: {} on {} ({:?}): {ng} nodes on the gpu, {nc} on the cpu",
            g.name, self.gpu.info.name, self.gpu.info.backend
        );
    }

    /// Set the Param node named `name` to `t` (uploaded now if a GPU kernel reads it).
    ///
    /// The tensor must have the node's dtype and element count (a flat vector is
    /// accepted). Errors: [`WgpuError::Param`] for an unknown name, a wrong dtype or count.
    pub fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), WgpuError> {
        let id = *self.param_ids.get(name).ok_or_else(|| {
            WgpuError::Param(format!(
                "no param named \"{name}\" in graph {}",
                self.graph.name
            ))
        })?;
        let shape = self.graph.node(id).shape.clone();
        if t.dtype() != shape.dtype {
            return Err(WgpuError::Param(format!(
                "param \"{name}\" is {shape} but the value is {}",
                t.shape()
            )));
        }
        let dims = shape.dims_usize();
        let n: usize = dims.iter().product();
        if t.numel() != n || !shape.is_static() {
            return Err(WgpuError::Param(format!(
                "param \"{name}\" is {shape} ({n} elements) but the value has {} elements",
                t.numel()
            )));
        }
        let t = t
            .reshaped(dims)
            .map_err(|e| WgpuError::Param(format!("param \"{name}\": {e}")))?;
        if self.upload[id.index()] {
            self.write_value(id, &t)?;
        }
        self.params[id.index()] = Some(t);
        Ok(())
    }

    /// Encode a host value into its buffer (queued before the next submit).
    fn write_value(&self, id: NodeId, t: &Tensor) -> Result<(), WgpuError> {
        let Some(b) = self.buf[id.index()] else {
            return Ok(());
        };
        let g = &self.graph;
        let words: Vec<u32> = match t.data() {
            TensorData::F32(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::F16(_) | TensorData::BF16(_) => {
                t.data().to_f32_vec().iter().map(|x| x.to_bits()).collect()
            }
            TensorData::Bool(v) => v.iter().map(|&x| x as u32).collect(),
            TensorData::I64(v) => {
                let mut w = Vec::with_capacity(v.len());
                for &x in v {
                    let y = i32::try_from(x).map_err(|_| {
                        kernel_err(
                            g,
                            id,
                            format!("index value {x} does not fit the GPU's i32 indices"),
                        )
                    })?;
                    w.push(y as u32);
                }
                w
            }
            TensorData::I32(v) => v.iter().map(|&x| x as u32).collect(),
            other => {
                return Err(kernel_err(
                    g,
                    id,
                    format!("{} values cannot be uploaded to the GPU", other.dtype()),
                ))
            }
        };
        // Gather indices must be in range, as on the CPU.
        for &(idx, bound, gather) in &self.index_checks {
            if idx == id {
                let b = bound as i64;
                if let Some(&x) = t.data().to_i64_vec().iter().find(|&&x| x < -b || x >= b) {
                    return Err(kernel_err(
                        g,
                        gather,
                        format!("gather: index {x} out of range for axis of size {bound}"),
                    ));
                }
            }
        }
        if !words.is_empty() {
            self.gpu
                .queue
                .write_buffer(&self.buffers[b], 0, bytemuck::cast_slice(&words));
        }
        Ok(())
    }

    fn check_inputs<I: Borrow<Tensor>>(&self, inputs: &[I]) -> Result<(), WgpuError> {
        rlx_cpu::check_feeds(&self.graph, &self.inputs, inputs, false).map_err(WgpuError::Input)
    }

    /// Run with `inputs` (owned tensors or references to them) in `graph.inputs()` order;
    /// returns the outputs in `graph.outputs` order. With `scanner` on, every node's value is
    /// read back after the run and scanned in topological order (same report as the CPU
    /// backend; abort mode returns [`WgpuError::NanAbort`]).
    ///
    /// Errors: [`WgpuError::Input`] naming a mismatched input, [`WgpuError::Param`] for an
    /// unset param, [`WgpuError::Kernel`] for a CPU-fallback kernel failure, [`WgpuError::Gpu`]
    /// when wgpu reported an error during the run.
    pub fn run<I: Borrow<Tensor>>(
        &mut self,
        inputs: &[I],
        scanner: Option<&mut DebugScanner>,
    ) -> Result<Vec<Tensor>, WgpuError> {
        let scanner = scanner.filter(|s| s.is_on());
        if let Some(sc) = scanner {
            let all = self.execute(inputs, true)?;
            self.take_node_times();
            let g = &self.graph;
            sc.begin_run(g);
            for node in &g.nodes {
                if let Some(t) = &all[node.id.index()] {
                    sc.scan_node(g, node.id, t.data())?;
                }
            }
            sc.finish_run(g)?;
            return Ok(g
                .outputs
                .iter()
                .map(|o| all[o.index()].clone().expect("outputs are read"))
                .collect());
        }
        let all = self.execute(inputs, false)?;
        self.take_node_times();
        Ok(take_outputs(&self.graph.outputs, all))
    }

    /// Run and read back every node's value (index = node index), leaves included: for the
    /// cross-backend divergence diagnostic. Errors as [`WgpuExecutor::run`].
    pub fn run_all<I: Borrow<Tensor>>(
        &mut self,
        inputs: &[I],
    ) -> Result<Vec<Option<Tensor>>, WgpuError> {
        let all = self.execute(inputs, true)?;
        self.take_node_times();
        Ok(all)
    }

    fn execute<I: Borrow<Tensor>>(
        &self,
        inputs: &[I],
        all: bool,
    ) -> Result<Vec<Option<Tensor>>, WgpuError> {
        self.check_inputs(inputs)?;
        let errors_before = crate::uncaptured_error_count();
        let g = &self.graph;
        let n = g.len();
        let mut host: Vec<Option<Cow<Tensor>>> = (0..n).map(|_| None).collect();
        let mut next_input = 0;
        let mut enc: Option<wgpu::CommandEncoder> = None;
        // One compute pass for each run of consecutive GPU nodes (wgpu orders the dispatches
        // of a pass by their buffer use); it ends where the host needs a value.
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        let mut passes = 0u32;
        // GPU nodes given profiling timestamps, in order (queries 2i and 2i + 1).
        let mut stamped: Vec<usize> = vec![];
        // CPU-fallback nodes' host times when profiling.
        let mut cpu_times: Vec<(usize, u64)> = vec![];
        for node in &g.nodes {
            let id = node.id;
            let k = id.index();
            match &self.steps[k] {
                Step::Leaf => {
                    let t: &Tensor = match &node.op {
                        Op::Input { .. } => {
                            let t: &Tensor = inputs[next_input].borrow();
                            next_input += 1;
                            if self.upload[k] {
                                self.write_value(id, t)?;
                            }
                            t
                        }
                        Op::Param { name } => self.params[k].as_ref().ok_or_else(|| {
                            WgpuError::Param(format!(
                                "param \"{name}\" ({}) was not set before run",
                                node.shape
                            ))
                        })?,
                        Op::Constant(t) => t.as_ref(),
                        _ => unreachable!("leaf"),
                    };
                    host[k] = Some(Cow::Borrowed(t));
                }
                Step::Alias => {}
                Step::Gpu(ds) => {
                    if !all && self.fused_skip[k] {
                        continue;
                    }
                    let ds = match (&self.fused[k], all) {
                        (Some(f), false) => f,
                        _ => ds,
                    };
                    let pass = pass.get_or_insert_with(|| {
                        let stamps = self.timing.as_ref().and_then(|t| {
                            (passes < t.passes).then(|| wgpu::ComputePassTimestampWrites {
                                query_set: &t.set,
                                beginning_of_pass_write_index: Some(2 * passes),
                                end_of_pass_write_index: Some(2 * passes + 1),
                            })
                        });
                        passes += 1;
                        enc.get_or_insert_with(|| {
                            self.gpu.device.create_command_encoder(
                                &wgpu::CommandEncoderDescriptor { label: None },
                            )
                        })
                        .begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: None,
                            timestamp_writes: stamps,
                        })
                        .forget_lifetime()
                    });
                    let q = self.prof.as_ref().map(|p| {
                        let q = 2 * stamped.len() as u32;
                        p.stamp(pass, q);
                        q
                    });
                    for d in ds {
                        pass.set_pipeline(&d.pipeline);
                        pass.set_bind_group(0, &d.bind, &[]);
                        pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
                    }
                    if let (Some(p), Some(q)) = (&self.prof, q) {
                        p.stamp(pass, q + 1);
                        stamped.push(k);
                    }
                }
                Step::Cpu(_) => {
                    // Profiling: a CPU node's time is its host time (read-back of its GPU
                    // inputs, the kernel, the upload of its value).
                    let t_cpu = self.prof.as_ref().map(|_| std::time::Instant::now());
                    let missing: Vec<NodeId> = node
                        .inputs
                        .iter()
                        .copied()
                        .filter(|i| host[i.index()].is_none())
                        .collect();
                    if !missing.is_empty() {
                        pass = None; // ends the pass: the encoder is needed for the copies
                        let got = self.read_back(&mut enc, &missing)?;
                        for (i, t) in missing.iter().zip(got) {
                            host[i.index()] = Some(Cow::Owned(t));
                        }
                    }
                    let ins: Vec<&Tensor> = node
                        .inputs
                        .iter()
                        .map(|i| host[i.index()].as_deref().expect("read back above"))
                        .collect();
                    let t = eval_op(&node.op, &ins, &node.shape)
                        .map_err(|e| kernel_err(g, id, e.to_string()))?;
                    if self.upload[k] {
                        self.write_value(id, &t)?;
                    }
                    host[k] = Some(Cow::Owned(t));
                    if let Some(t0) = t_cpu {
                        cpu_times.push((k, t0.elapsed().as_nanos() as u64));
                    }
                }
            }
        }
        // Read back what was asked for.
        let want: Vec<NodeId> = if all {
            (0..n as u32).map(NodeId).collect()
        } else {
            g.outputs.clone()
        };
        let mut todo: Vec<NodeId> = want
            .iter()
            .copied()
            .filter(|i| host[i.index()].is_none())
            .collect();
        todo.dedup();
        drop(pass);
        let got = self.read_back(&mut enc, &todo)?;
        for (i, t) in todo.iter().zip(got) {
            host[i.index()] = Some(Cow::Owned(t));
        }
        if let Some(e) = enc.take() {
            self.gpu.queue.submit([e.finish()]);
        }
        if let Some(t) = &self.timing {
            let ms = self.read_timestamps(t, passes.min(t.passes))?;
            *self.last_device_ms.lock().expect("not poisoned") = Some(ms);
        }
        if let Some(p) = &self.prof {
            let mut ns = self.read_node_times(p, &stamped)?;
            ns.extend(cpu_times);
            *self.prof_last.lock().expect("not poisoned") = ns;
        }
        let errs = crate::uncaptured_error_count() - errors_before;
        if errs > 0 {
            return Err(WgpuError::Gpu(format!(
                "{errs} uncaptured wgpu error(s) during the run of {} (printed above)",
                g.name
            )));
        }
        let mut out: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        for i in want {
            if out[i.index()].is_none() {
                out[i.index()] = host[i.index()].take().map(Cow::into_owned);
            }
        }
        Ok(out)
    }

    /// Measure the device time of the following runs with timestamp queries around each
    /// compute pass (inputs are uploaded before the first pass and outputs copied out after
    /// the last, so neither is counted). Returns false when the device has no
    /// `TIMESTAMP_QUERY` (then nothing is measured).
    pub fn set_device_timing(&mut self, on: bool) -> bool {
        *self.last_device_ms.lock().expect("not poisoned") = None;
        if !on {
            self.timing = None;
            return true;
        }
        if !self.gpu.timestamps {
            return false;
        }
        if self.timing.is_none() {
            let passes = 64u32;
            let dev = &self.gpu.device;
            let bytes = 16 * passes as u64;
            self.timing = Some(Timing {
                set: dev.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("rlx-wgpu timing"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2 * passes,
                }),
                resolve: dev.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                read: dev.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                passes,
            });
        }
        true
    }

    /// Time every node of the following runs (`true`: GPU nodes by timestamps written inside
    /// the compute pass before and after their dispatches, CPU-fallback nodes by the host
    /// clock around their read-back, kernel and upload) or stop (`false`). In runs that fuse,
    /// a fused kernel's time goes to the node it is dispatched at (the Conv of a fused conv
    /// group, the last node of an elementwise chain); the other nodes inside it show 0. Errors ([`WgpuError::Gpu`]) when the device lacks
    /// `TIMESTAMP_QUERY_INSIDE_PASSES`.
    pub fn set_profiling(&mut self, on: bool) -> Result<(), WgpuError> {
        if !on {
            self.prof = None;
            self.prof_times = None;
            return Ok(());
        }
        if !self.gpu.pass_timestamps {
            return Err(WgpuError::Gpu(format!(
                "{}: this wgpu device has no timestamp queries inside compute passes (TIMESTAMP_QUERY_INSIDE_PASSES), so it cannot time nodes",
                self.gpu.info.name
            )));
        }
        let gpu_nodes = self
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Gpu(_)))
            .count() as u32;
        let queries = (2 * gpu_nodes).max(2);
        let dev = &self.gpu.device;
        let sets = (0..queries.div_ceil(QUERIES_PER_SET))
            .map(|i| {
                dev.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("rlx-wgpu profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (queries - i * QUERIES_PER_SET).min(QUERIES_PER_SET),
                })
            })
            .collect();
        let bytes = 8 * queries as u64;
        self.prof = Some(Prof {
            sets,
            resolve: dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            read: dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        });
        self.prof_times = Some(rlx_cpu::NodeTimes {
            runs: 0,
            ns: vec![0; self.graph.len()],
        });
        Ok(())
    }

    /// Per-node times summed over the runs since profiling was turned on (`None` when off).
    pub fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
        self.prof_times.as_ref()
    }

    /// Add the last run's node times to the profile.
    fn take_node_times(&mut self) {
        let last = std::mem::take(&mut *self.prof_last.lock().expect("not poisoned"));
        if let Some(t) = &mut self.prof_times {
            t.runs += 1;
            for (k, ns) in last {
                t.ns[k] += ns;
            }
        }
    }

    /// Resolve the profiling timestamps of `stamped` (GPU nodes in run order) and return each
    /// node's (index, ns).
    fn read_node_times(&self, p: &Prof, stamped: &[usize]) -> Result<Vec<(usize, u64)>, WgpuError> {
        let sets: Vec<&wgpu::QuerySet> = p.sets.iter().collect();
        let ticks = self.read_ticks(&sets, &p.resolve, &p.read, 2 * stamped.len() as u32)?;
        let period = self.gpu.queue.get_timestamp_period() as f64;
        Ok(stamped
            .iter()
            .zip(ticks.chunks(2))
            .map(|(&k, t)| (k, (t[1].saturating_sub(t[0]) as f64 * period) as u64))
            .collect())
    }

    /// Resolve the first `queries` timestamps of `sets` (each [`QUERIES_PER_SET`] long, in
    /// order) into `resolve`, copy them to the mappable `read`, wait, and return them.
    fn read_ticks(
        &self,
        sets: &[&wgpu::QuerySet],
        resolve: &wgpu::Buffer,
        read: &wgpu::Buffer,
        queries: u32,
    ) -> Result<Vec<u64>, WgpuError> {
        if queries == 0 {
            return Ok(vec![]);
        }
        let err = |e: String| WgpuError::Gpu(format!("timestamps: {e}"));
        let dev = &self.gpu.device;
        let mut e = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for (i, set) in sets.iter().enumerate() {
            let first = i as u32 * QUERIES_PER_SET;
            if first >= queries {
                break;
            }
            let n = (queries - first).min(QUERIES_PER_SET);
            e.resolve_query_set(set, 0..n, resolve, 8 * first as u64);
        }
        e.copy_buffer_to_buffer(resolve, 0, read, 0, 8 * queries as u64);
        self.gpu.queue.submit([e.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        read.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| err(format!("poll: {e}")))?;
        rx.recv()
            .map_err(|e| err(e.to_string()))?
            .map_err(|e| err(e.to_string()))?;
        let ticks = {
            let view = read.get_mapped_range(..).map_err(|e| err(e.to_string()))?;
            bytemuck::cast_slice::<u8, u64>(&view)[..queries as usize].to_vec()
        };
        read.unmap();
        Ok(ticks)
    }

    /// The last run's device time in milliseconds (the sum of its timed compute passes),
    /// when [`WgpuExecutor::set_device_timing`] is on.
    pub fn last_device_ms(&self) -> Option<f64> {
        *self.last_device_ms.lock().expect("not poisoned")
    }

    /// Resolve the first `n` passes' timestamps, read them back and sum end - start.
    fn read_timestamps(&self, t: &Timing, n: u32) -> Result<f64, WgpuError> {
        let ticks = self.read_ticks(&[&t.set], &t.resolve, &t.read, 2 * n)?;
        let period = self.gpu.queue.get_timestamp_period() as f64;
        let ns: f64 = ticks
            .chunks(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period)
            .sum();
        Ok(ns / 1e6)
    }

    /// Submit pending work plus copies of `ids`' buffers into staging buffers, wait, decode.
    fn read_back(
        &self,
        enc: &mut Option<wgpu::CommandEncoder>,
        ids: &[NodeId],
    ) -> Result<Vec<Tensor>, WgpuError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let g = &self.graph;
        let dev = &self.gpu.device;
        let mut e = enc.take().unwrap_or_else(|| {
            dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        let mut staging = Vec::with_capacity(ids.len());
        for &id in ids {
            let b = self.buf[id.index()].ok_or_else(|| {
                kernel_err(g, id, "value has neither a host copy nor a GPU buffer")
            })?;
            let bytes = (g.node(id).shape.numel() * 4) as u64;
            let s = dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            if bytes > 0 {
                e.copy_buffer_to_buffer(&self.buffers[b], 0, &s, 0, bytes);
            }
            staging.push(s);
        }
        self.gpu.queue.submit([e.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        for (k, s) in staging.iter().enumerate() {
            let tx = tx.clone();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((k, r));
            });
        }
        drop(tx);
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| WgpuError::Gpu(format!("poll: {e}")))?;
        for (k, r) in rx.iter() {
            r.map_err(|e| kernel_err(g, ids[k], format!("read back failed: {e}")))?;
        }
        let mut out = Vec::with_capacity(ids.len());
        for (&id, s) in ids.iter().zip(&staging) {
            let shape = &g.node(id).shape;
            let dims = shape.dims_usize();
            let n = shape.numel();
            let view = s
                .get_mapped_range(..)
                .map_err(|e| kernel_err(g, id, format!("map: {e}")))?;
            // Decoded straight from the mapped staging buffer (one copy; a Qwen3 prefill's
            // logits are 311 MB).
            let words: &[u32] = &bytemuck::cast_slice::<u8, u32>(&view)[..n];
            let data = match shape.dtype {
                DType::F32 => TensorData::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
                // Exact: the GPU value was rounded to the dtype by its node.
                DType::F16 | DType::BF16 => TensorData::from_f64(
                    shape.dtype,
                    &words
                        .iter()
                        .map(|&w| f32::from_bits(w) as f64)
                        .collect::<Vec<_>>(),
                ),
                DType::Bool => TensorData::Bool(words.iter().map(|&w| w != 0).collect()),
                DType::I64 => TensorData::I64(words.iter().map(|&w| w as i32 as i64).collect()),
                DType::I32 => TensorData::I32(words.iter().map(|&w| w as i32).collect()),
                dt => {
                    return Err(kernel_err(
                        g,
                        id,
                        format!("{dt} values are never on the GPU"),
                    ))
                }
            };
            drop(view);
            s.unmap();
            out.push(Tensor::new(dims, data).map_err(|e| kernel_err(g, id, e.to_string()))?);
        }
        Ok(out)
    }
}

/// The values of `outputs` from a run's per-node values, moved out (cloned only for an
/// output listed more than once).
fn take_outputs(outputs: &[NodeId], mut all: Vec<Option<Tensor>>) -> Vec<Tensor> {
    let mut left = vec![0usize; all.len()];
    for o in outputs {
        left[o.index()] += 1;
    }
    outputs
        .iter()
        .map(|o| {
            let k = o.index();
            left[k] -= 1;
            let t = if left[k] == 0 {
                all[k].take()
            } else {
                all[k].clone()
            };
            t.expect("outputs are read")
        })
        .collect()
}

/// `over`: buffer indices to bind as the inputs (by position) instead of the input nodes'
/// buffers (a fused conv's folded weights and bias).
fn make_dispatches(
    gpu: &Gpu,
    specs: &[Spec],
    buf: &[Option<usize>],
    over: Option<&[usize]>,
    buffers: &[wgpu::Buffer],
    out: usize,
) -> Result<Vec<Dispatch>, String> {
    let dev = &gpu.device;
    let mut ds = Vec::with_capacity(specs.len());
    for s in specs {
        let pipeline = pipeline(gpu, &s.src)?;
        let meta = dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (s.meta.len().max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if !s.meta.is_empty() {
            gpu.queue
                .write_buffer(&meta, 0, bytemuck::cast_slice(&s.meta));
        }
        let mut entries = vec![];
        for (k, i) in s.inputs.iter().enumerate() {
            let b = match over {
                Some(o) => o[k],
                None => buf[i.index()].ok_or("input has no buffer")?,
            };
            entries.push(wgpu::BindGroupEntry {
                binding: k as u32,
                resource: buffers[b].as_entire_binding(),
            });
        }
        let k = s.inputs.len() as u32;
        entries.push(wgpu::BindGroupEntry {
            binding: k,
            resource: buffers[out].as_entire_binding(),
        });
        entries.push(wgpu::BindGroupEntry {
            binding: k + 1,
            resource: meta.as_entire_binding(),
        });
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("bind group: {e}"));
        }
        ds.push(Dispatch {
            pipeline,
            bind,
            groups: s.groups,
            _meta: meta,
        });
    }
    Ok(ds)
}

/// The compute pipeline for `src` (cached by source text); a shader wgpu rejects is an Err.
fn pipeline(gpu: &Gpu, src: &str) -> Result<Arc<wgpu::ComputePipeline>, String> {
    if let Some(p) = gpu.pipelines.lock().map_err(|e| e.to_string())?.get(src) {
        return Ok(p.clone());
    }
    let dev = &gpu.device;
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let p = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(e.to_string());
    }
    let p = Arc::new(p);
    gpu.pipelines
        .lock()
        .map_err(|e| e.to_string())?
        .insert(src.to_string(), p.clone());
    Ok(p)
}

/// The matmul/conv kernel for an `m` x `n` output (per batch item, or per group for a
/// convolution, whose columns are images x positions) and its output tile (rows, columns);
/// the flag says it is the register-tiled kernel (whose convolution columns span images).
/// By default the register-tiled kernel ([`kernels::reg_tiled`]) with k-tiles of 8: a
/// 128x128 output tile (8x8 outputs per thread in registers) where the output has at least
/// 128 rows and columns and `batch` times its tiles number at least 256, else 64x128, 128x64
/// or 64x64. `RLX_WGPU_GEMM_TILE` picks another kernel, to time one against another or rule
/// one out: `reg16` (k-tiles of 16), or `32` / `64` / `128` for the earlier shared-memory
/// tiles capped at that size. On the H200 (Vulkan) the register-tiled kernel ran ResNet-50
/// batch 32 in 36 ms (k-tiles of 16) and 34 ms (of 8) against 297 ms with the 64x64
/// shared-memory tile, BERT-base 8 x 128 in 16.2 / 15.3 against 196 ms (bench/RESULTS-GPU.md).
fn gemm_kernel(
    b_kind: GemmB,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    drop_last_k: bool,
) -> Gemm {
    let conv = b_kind != GemmB::MatMul;
    let mut choice = rlx_ir::env::get("RLX_WGPU_GEMM_TILE").map(|v| v.trim().to_ascii_lowercase());
    if let Some(v) = choice.as_deref() {
        if !matches!(v, "" | "reg" | "reg16" | "32" | "64" | "128") {
            rlx_ir::env::note_unrecognized("RLX_WGPU_GEMM_TILE", v, "reg (the default)");
            choice = None;
        }
    }
    let old_cap = choice.as_deref().and_then(|v| v.parse::<usize>().ok());
    let bk = if choice.as_deref() == Some("reg16") {
        16
    } else {
        8
    };
    let plain = |rows, cols, src| Gemm {
        rows,
        cols,
        src,
        reg: false,
        splits: 1,
        kc: k,
    };
    if let Some(cap) = old_cap {
        let fits = |t: usize| m >= t && n >= t && cap >= t;
        return if fits(128) {
            plain(128, 128, kernels::tiled_128(conv, drop_last_k))
        } else if fits(64) {
            plain(64, 64, kernels::tiled(conv, drop_last_k, true))
        } else {
            plain(
                TILE as usize,
                TILE as usize,
                kernels::tiled(conv, drop_last_k, false),
            )
        };
    }
    // The largest tile that still gives the GPU enough workgroups to fill it (a discrete GPU
    // has on the order of 100 multiprocessors; the H200 132): 128x128 for large outputs,
    // smaller tiles when the output (times the batch) has fewer tiles than that. Small
    // products (a classifier's 32 x 1000, decode's single row) take the 64x64 tile: the rows
    // or columns it computes in vain cost arithmetic, not memory traffic.
    let min_wg = match rlx_ir::env::get("RLX_WGPU_GEMM_MIN_WG") {
        None => 256,
        Some(v) if v.trim().is_empty() => 256,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                rlx_ir::env::note_unrecognized("RLX_WGPU_GEMM_MIN_WG", &v, "256 (the default)");
                256
            }
        },
    };
    let tiles = |tm: usize, tn: usize| m.div_ceil(16 * tm) * n.div_ceil(16 * tn) * batch;
    let fits = |tm: usize, tn: usize| (tm == 4 || m >= 128) && (tn == 4 || n >= 128);
    let cands = [(8, 8), (4, 8), (8, 4), (4, 4)];
    let (tm, tn) = cands
        .into_iter()
        .filter(|&(a, b)| fits(a, b))
        .find(|&(a, b)| tiles(a, b) >= min_wg)
        .unwrap_or((4, 4));
    // Split-K (matrix products): when even that tile gives fewer than half the wanted
    // workgroups (a classifier's 32 x 1000 over K = 2048: 16) and K is long, S slices of
    // at least 256 k's each run as their own workgroups, then one pass adds them. Splitting
    // products that smaller tiles already spread (BERT-base's 1024 x 768 layers) measured
    // slower on the H200 (bench/RESULTS-GPU.md).
    let mut splits = 1;
    let mut kc = k;
    if b_kind == GemmB::MatMul && !drop_last_k && !rlx_ir::env::is_off("RLX_WGPU_SPLITK") {
        let t = tiles(tm, tn);
        if 2 * t < min_wg {
            let s = min_wg.div_ceil(t).min(k / 256).min(16);
            if s > 1 {
                kc = k.div_ceil(s).div_ceil(bk as usize) * bk as usize;
                splits = k.div_ceil(kc);
            }
        }
    }
    if splits < 2 {
        kc = k;
        splits = 1;
    }
    Gemm {
        rows: 16 * tm,
        cols: 16 * tn,
        src: kernels::reg_tiled(b_kind, drop_last_k, tm as u32, tn as u32, bk, splits > 1),
        reg: true,
        splits,
        kc,
    }
}

/// The f32 elementwise op of `id` as a fused-chain member: its expression and operand count
/// (None: not fusable).
fn chain_expr(g: &Graph, id: NodeId) -> Option<(String, usize)> {
    let node = g.node(id);
    let f32_only = node.shape.dtype == DType::F32
        && node.shape.rank() <= MAX_RANK
        && node
            .inputs
            .iter()
            .all(|&i| g.node(i).shape.dtype == DType::F32 && g.node(i).shape.rank() <= MAX_RANK);
    if !f32_only {
        return None;
    }
    match &node.op {
        Op::Unary(op) => match kernels::unary_expr(*op)? {
            (e, Ty::F32, Ty::F32) => Some((e.to_string(), 1)),
            _ => None,
        },
        Op::Activation(a) => Some((kernels::activation_expr(*a), 1)),
        Op::Binary(b) => match kernels::binary_expr(*b)? {
            (e, Ty::F32, Ty::F32) => Some((e.to_string(), 2)),
            _ => None,
        },
        _ => None,
    }
}

/// Elementwise chains/trees to fuse: GPU nodes with a [`chain_expr`], not already in a fused
/// conv; a node joins the group of an input when that input is the group's last member, has
/// no other reader, is not a graph output and has the node's dims. Groups of two or more.
fn plan_chains(
    g: &Graph,
    steps: &[Step],
    taken: &[bool],
    fused: &[Option<Vec<Dispatch>>],
) -> Vec<Vec<NodeId>> {
    let uses = g.use_counts();
    let mut is_output = vec![false; g.len()];
    for o in &g.outputs {
        is_output[o.index()] = true;
    }
    let mut group_of: Vec<Option<usize>> = vec![None; g.len()];
    let mut groups: Vec<Vec<NodeId>> = vec![];
    for node in &g.nodes {
        let k = node.id.index();
        if !matches!(steps[k], Step::Gpu(_))
            || taken[k]
            || fused[k].is_some()
            || chain_expr(g, node.id).is_none()
        {
            continue;
        }
        let mut joined: Vec<usize> = vec![];
        for &i in &node.inputs {
            let Some(gi) = group_of[i.index()] else {
                continue;
            };
            if groups[gi].last() == Some(&i)
                && uses[i.index()] == 1
                && !is_output[i.index()]
                && g.node(i).shape.dims_usize() == node.shape.dims_usize()
                && !joined.contains(&gi)
            {
                joined.push(gi);
            }
        }
        let gi = match joined.split_first() {
            None => {
                groups.push(vec![]);
                groups.len() - 1
            }
            Some((&first, rest)) => {
                for &o in rest {
                    let moved = std::mem::take(&mut groups[o]);
                    for m in &moved {
                        group_of[m.index()] = Some(first);
                    }
                    groups[first].extend(moved);
                }
                groups[first].sort();
                first
            }
        };
        groups[gi].push(node.id);
        group_of[k] = Some(gi);
    }
    groups.retain(|gr| gr.len() >= 2);
    groups
}

/// The fused kernel of an elementwise group (members in topological order), or None when it
/// has more external inputs than `max_ext` or a size the dispatch cannot take.
fn chain_spec(g: &Graph, grp: &[NodeId], maxg: u32, max_ext: usize) -> Option<Spec> {
    let last = *grp.last()?;
    let od = g.node(last).shape.dims_usize();
    let nout = g.node(last).shape.numel();
    let mut ext: Vec<NodeId> = vec![];
    let mut ops = vec![];
    for &id in grp {
        let (expr, arity) = chain_expr(g, id)?;
        let node = g.node(id);
        if node.inputs.len() != arity {
            return None;
        }
        let args = node
            .inputs
            .iter()
            .map(|&i| match grp.iter().position(|&m| m == i) {
                Some(k) => Err(k),
                None => Ok(match ext.iter().position(|&e| e == i) {
                    Some(j) => j,
                    None => {
                        ext.push(i);
                        ext.len() - 1
                    }
                }),
            })
            .collect();
        ops.push(kernels::ChainOp { expr, args });
    }
    if ext.is_empty() || ext.len() > max_ext {
        return None;
    }
    let ind = |i: NodeId| g.node(i).shape.dims_usize();
    let fast = ext.iter().all(|&i| ind(i) == od);
    let mut meta = vec![u(nout).ok()?, od.len() as u32];
    let mut dims = od.iter().map(|&d| d as u32).collect::<Vec<_>>();
    dims.resize(8, 1);
    meta.extend(dims);
    for &i in &ext {
        let mut st = bcast_strides(&ind(i), &od)
            .iter()
            .map(|&s| u(s))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        st.resize(8, 0);
        meta.extend(st);
    }
    Some(Spec {
        out_words: 0,
        src: kernels::fused_elementwise(ext.len(), &ops, fast),
        inputs: ext,
        meta,
        groups: flat_groups(nout, kernels::FLAT_WG, maxg).ok()?,
    })
}

/// A matmul/conv kernel choice ([`gemm_kernel`]).
struct Gemm {
    /// Output tile rows and columns.
    rows: usize,
    cols: usize,
    src: String,
    /// The register-tiled kernel (whose convolution columns span images).
    reg: bool,
    /// Split-K: splits, and k's per split.
    splits: usize,
    kc: usize,
}

/// Float dtypes held as f32 words on the GPU (float16/bfloat16 rounded at each node's output).
fn float_word(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F16 | DType::BF16)
}

/// The in-place rounding of a float16/bfloat16 node's f32 output to its dtype, appended after
/// its kernels (none for f32 outputs and for ops that only move values already rounded).
fn round_spec(g: &Graph, id: NodeId, maxg: u32) -> Result<Option<Spec>, String> {
    let node = g.node(id);
    let dt = node.shape.dtype;
    if !matches!(dt, DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let moves = matches!(
        node.op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Broadcast { .. }
            | Op::Slice { .. }
            | Op::Tile { .. }
            | Op::Pad { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::Select
    ) || matches!(&node.op, Op::Cast { .. } if g.node(node.inputs[0]).shape.dtype == dt);
    if moves {
        return Ok(None);
    }
    let n = node.shape.numel();
    Ok(Some(Spec {
        out_words: 0,
        src: kernels::round_to(dt == DType::BF16),
        inputs: vec![],
        meta: vec![u(n)?],
        groups: flat_groups(n, kernels::FLAT_WG, maxg)?,
    }))
}

fn build_spec(
    g: &Graph,
    id: NodeId,
    limits: &wgpu::Limits,
    bug: Option<PlantedBug>,
) -> Result<Option<Vec<Spec>>, String> {
    let node = g.node(id);
    let maxg = limits.max_compute_workgroups_per_dimension;
    let od = node.shape.dims_usize();
    let nout = od.iter().product::<usize>();
    let odt = node.shape.dtype;
    let ind = |k: usize| g.node(node.inputs[k]).shape.dims_usize();
    let idt = |k: usize| g.node(node.inputs[k]).shape.dtype;
    let ty_of = |dt: DType| match dt {
        DType::F32 | DType::F16 | DType::BF16 => Some(Ty::F32),
        DType::Bool => Some(Ty::U32),
        _ => None,
    };
    if od.len() > MAX_RANK
        || node
            .inputs
            .iter()
            .any(|&i| g.node(i).shape.rank() > MAX_RANK)
    {
        return Err(format!("rank above {MAX_RANK}"));
    }
    let flat = |src: String, meta: Vec<u32>| -> Result<Option<Vec<Spec>>, String> {
        Ok(Some(vec![Spec {
            out_words: 0,
            src,
            inputs: node.inputs.clone(),
            meta,
            groups: flat_groups(nout, kernels::FLAT_WG, maxg)?,
        }]))
    };
    let elementwise = |tys: &[Ty], out: Ty, expr: &str| -> Result<Option<Vec<Spec>>, String> {
        for (k, t) in tys.iter().enumerate() {
            if ty_of(idt(k)) != Some(*t) {
                return Err(format!("input {k} is {}, the kernel takes {t:?}", idt(k)));
            }
        }
        if ty_of(odt) != Some(out) {
            return Err(format!("output is {odt}, the kernel writes {out:?}"));
        }
        let fast = (0..tys.len()).all(|k| ind(k) == od);
        let mut meta = vec![u(nout)?, od.len() as u32];
        let mut dims = od.iter().map(|&d| d as u32).collect::<Vec<_>>();
        dims.resize(8, 1);
        meta.extend(dims);
        for k in 0..tys.len() {
            let mut st = bcast_strides(&ind(k), &od)
                .iter()
                .map(|&s| u(s))
                .collect::<Result<Vec<_>, _>>()?;
            st.resize(8, 0);
            meta.extend(st);
        }
        flat(kernels::elementwise(tys, out, expr, fast), meta)
    };
    let words = |dt: DType| matches!(dt, DType::F32 | DType::F16 | DType::BF16 | DType::Bool);
    match &node.op {
        Op::Unary(op) => {
            let (e, ti, to) = kernels::unary_expr(*op).ok_or("integer-only op")?;
            elementwise(&[ti], to, e)
        }
        Op::Activation(rlx_ir::Activation::Relu) if bug == Some(PlantedBug::ReluDropsNan) => {
            elementwise(&[Ty::F32], Ty::F32, "max(x, 0.0)")
        }
        Op::Activation(a) => elementwise(&[Ty::F32], Ty::F32, &kernels::activation_expr(*a)),
        Op::Binary(b) => {
            let (e, ti, to) = kernels::binary_expr(*b)
                .ok_or("no exact GPU kernel (integer-only op, or Rem/Mod)")?;
            elementwise(&[ti, ti], to, e)
        }
        Op::Select => {
            if idt(0) != DType::Bool || !words(idt(1)) || idt(1) != idt(2) || idt(1) != odt {
                return Err("select on non-32-bit values".into());
            }
            // Bit-exact word select works for f32 and bool alike.
            word_elementwise(g, id, &od, nout, maxg)
        }
        Op::Cast { to, .. } => match (float_word(idt(0)), float_word(*to)) {
            // Between float dtypes: a copy, then the output's rounding.
            (true, true) => elementwise(&[Ty::F32], Ty::F32, "x"),
            _ => match (idt(0), *to) {
                (DType::Bool, DType::Bool) => elementwise(&[Ty::U32], Ty::U32, "x"),
                (a, DType::Bool) if float_word(a) => elementwise(
                    &[Ty::F32],
                    Ty::U32,
                    "select(0u, 1u, (bitcast<u32>(x) & 0x7fffffffu) != 0u)",
                ),
                (DType::Bool, b) if float_word(b) => elementwise(&[Ty::U32], Ty::F32, "f32(x)"),
                (a, b) => Err(format!("cast {a} -> {b} has no GPU kernel")),
            },
        },
        Op::Reshape { .. } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            Ok(None)
        }
        Op::Transpose { perm } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            let id0 = ind(0);
            let ist = strides_of(&id0);
            let axes = axis_rows(&od, |i| [id0[perm[i]] as i64, ist[perm[i]] as i64, 0, 1]);
            copy_spec(node.inputs[0], nout, 0, 0, 0, &axes, maxg)
        }
        Op::Broadcast { .. } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            let id0 = ind(0);
            let bst = bcast_strides(&id0, &od);
            let axes = axis_rows(&od, |i| [od[i] as i64, bst[i] as i64, 0, 1]);
            copy_spec(node.inputs[0], nout, 0, 0, 0, &axes, maxg)
        }
        Op::Slice { starts, steps, .. } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            let id0 = ind(0);
            let ist = strides_of(&id0);
            let axes = axis_rows(&od, |i| {
                [id0[i] as i64, ist[i] as i64, starts[i] as i64, steps[i]]
            });
            copy_spec(node.inputs[0], nout, 0, 0, 0, &axes, maxg)
        }
        Op::Tile { .. } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            let id0 = ind(0);
            let ist = strides_of(&id0);
            let axes = axis_rows(&od, |i| [id0[i] as i64, ist[i] as i64, 0, 1]);
            copy_spec(node.inputs[0], nout, 0, 5, 0, &axes, maxg)
        }
        Op::Pad { pads, mode } => {
            if !words(idt(0)) {
                return Err(format!("{} values stay on the CPU", idt(0)));
            }
            let id0 = ind(0);
            if id0.contains(&0) {
                return Err("padding an empty tensor".into());
            }
            let (m, bits) = match mode {
                PadMode::Constant(v) => (
                    1,
                    if idt(0) == DType::Bool {
                        (*v != 0.0) as u32
                    } else {
                        // rounded to the value's dtype (float16/bfloat16), as the CPU pads
                        TensorData::from_f64(idt(0), &[*v]).to_f32_vec()[0].to_bits()
                    },
                ),
                PadMode::Edge => (2, 0),
                PadMode::Reflect => (3, 0),
                PadMode::Wrap => (4, 0),
            };
            let ist = strides_of(&id0);
            let axes = axis_rows(&od, |i| {
                [id0[i] as i64, ist[i] as i64, -(pads[i].0 as i64), 1]
            });
            copy_spec(node.inputs[0], nout, 0, m, bits, &axes, maxg)
        }
        Op::Concat { axis } => {
            if !words(odt) {
                return Err(format!("{odt} values stay on the CPU"));
            }
            let ost = strides_of(&od);
            let mut specs = vec![];
            let mut off = 0usize;
            for (k, &i) in node.inputs.iter().enumerate() {
                let d = ind(k);
                let n: usize = d.iter().product();
                if n > 0 {
                    let ist = strides_of(&d);
                    let axes: Vec<[i64; 6]> = (0..d.len())
                        .map(|a| [d[a] as i64, d[a] as i64, ist[a] as i64, 0, 1, ost[a] as i64])
                        .collect();
                    let base = u(off * ost[*axis])?;
                    if let Some(mut s) = copy_spec(i, n, base, 0, 0, &axes, maxg)? {
                        specs.append(&mut s);
                    }
                }
                off += d[*axis];
            }
            Ok(Some(specs))
        }
        Op::Gather { axis } => {
            if !words(idt(0)) || !matches!(idt(1), DType::I64 | DType::I32) {
                return Err(format!("gather of {} by {} indices", idt(0), idt(1)));
            }
            let d = ind(0);
            if d[*axis] == 0 {
                return Err("gather from an empty axis".into());
            }
            let inner: usize = d[axis + 1..].iter().product();
            let nidx: usize = ind(1).iter().product();
            if inner == 0 || nidx == 0 {
                return Err("empty gather".into());
            }
            flat(
                kernels::gather(),
                vec![u(nout)?, u(d[*axis])?, u(nidx)?, u(inner)?],
            )
        }
        Op::Reduce { kind, axes, .. } => {
            if !float_word(idt(0)) || odt != idt(0) {
                return Err(format!("reduce of {} to {odt}", idt(0)));
            }
            let d = ind(0);
            let st = strides_of(&d);
            let r: usize = axes.iter().map(|&a| d[a]).product();
            if r == 0 {
                return Err("reduction over an empty axis".into());
            }
            let kept: Vec<usize> = (0..d.len()).filter(|a| !axes.contains(a)).collect();
            let contig = axes
                .iter()
                .enumerate()
                .all(|(j, &a)| a == d.len() - axes.len() + j);
            let mut meta = vec![u(nout)?, u(r)?, kept.len() as u32];
            let mut kd: Vec<u32> = kept.iter().map(|&a| d[a] as u32).collect();
            kd.resize(8, 1);
            let mut ks: Vec<u32> = kept.iter().map(|&a| st[a] as u32).collect();
            ks.resize(8, 0);
            meta.extend(kd);
            meta.extend(ks);
            meta.push(axes.len() as u32);
            let mut rd: Vec<u32> = axes.iter().map(|&a| d[a] as u32).collect();
            rd.resize(8, 1);
            let mut rs: Vec<u32> = axes.iter().map(|&a| st[a] as u32).collect();
            rs.resize(8, 0);
            meta.extend(rd);
            meta.extend(rs);
            let skip = bug == Some(PlantedBug::ReduceSumSkipLast);
            let tree = r >= 64;
            let src = kernels::reduce(*kind, tree, contig, skip);
            let groups = if tree {
                flat_groups(nout, 1, maxg)?
            } else {
                flat_groups(nout, kernels::FLAT_WG, maxg)?
            };
            Ok(Some(vec![Spec {
                out_words: 0,
                src,
                inputs: node.inputs.clone(),
                meta,
                groups,
            }]))
        }
        Op::ArgReduce {
            max,
            axis,
            select_last_index,
            ..
        } => {
            if !float_word(idt(0)) || odt != DType::I64 {
                return Err(format!("argreduce of {}", idt(0)));
            }
            let d = ind(0);
            if d[*axis] == 0 {
                return Err("argreduce over an empty axis".into());
            }
            let inner: usize = d[axis + 1..].iter().product();
            flat(
                kernels::argreduce(),
                vec![
                    u(nout)?,
                    u(d[*axis])?,
                    u(inner.max(1))?,
                    *max as u32,
                    *select_last_index as u32,
                ],
            )
        }
        Op::MatMul => {
            if !float_word(odt) || idt(0) != odt || idt(1) != odt {
                return Err("matmul on non-f32".into());
            }
            let (a, b) = (ind(0), ind(1));
            let (m, k, ab) = if a.len() == 1 {
                (1, a[0], vec![])
            } else {
                (a[a.len() - 2], a[a.len() - 1], a[..a.len() - 2].to_vec())
            };
            let (kb, n, bb) = if b.len() == 1 {
                (b[0], 1, vec![])
            } else {
                (b[b.len() - 2], b[b.len() - 1], b[..b.len() - 2].to_vec())
            };
            if k != kb {
                return Err(format!("matmul: K {k} vs {kb}"));
            }
            let ob =
                rlx_ir::broadcast_dims(&ab, &bb).ok_or("matmul: batch dims do not broadcast")?;
            if ob.len() > 6 {
                return Err("matmul batch rank above 6".into());
            }
            let nb: usize = ob.iter().product();
            if nb == 0 || m == 0 || n == 0 {
                return Err("empty matmul".into());
            }
            let mut meta = vec![u(m)?, u(n)?, u(k)?, ob.len() as u32];
            let mut obd: Vec<u32> = ob.iter().map(|&x| x as u32).collect();
            obd.resize(6, 1);
            meta.extend(obd);
            for (bd, mat) in [(&ab, m * k), (&bb, k * n)] {
                let mut s: Vec<u32> = bcast_strides(bd, &ob)
                    .iter()
                    .map(|&x| u(x * mat))
                    .collect::<Result<_, _>>()?;
                s.resize(6, 0);
                meta.extend(s);
            }
            let gm = gemm_kernel(
                GemmB::MatMul,
                m,
                n,
                k,
                nb,
                bug == Some(PlantedBug::MatMulDropLastK),
            );
            let out = nb * m * n;
            // Split-K needs its partial products in the output buffer: S times the output.
            let limit = limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size.min(u32::MAX as u64)) as usize;
            let gm = if gm.splits > 1 && gm.splits * out * 4 > limit {
                gemm_kernel(GemmB::MatMul, m, n, k, nb, true)
            } else {
                gm
            };
            let groups = [
                n.div_ceil(gm.cols) as u32,
                m.div_ceil(gm.rows) as u32,
                u(nb * gm.splits)?,
            ];
            if groups.iter().any(|&x| x > maxg) {
                return Err("matmul exceeds the dispatch limits".into());
            }
            let mut specs = vec![];
            if gm.splits > 1 {
                meta.extend([u(gm.splits)?, u(out)?, u(gm.kc)?]);
            }
            specs.push(Spec {
                out_words: gm.splits * out,
                src: gm.src,
                inputs: node.inputs.clone(),
                meta,
                groups,
            });
            if gm.splits > 1 {
                specs.push(Spec {
                    out_words: gm.splits * out,
                    src: kernels::split_sum(),
                    inputs: vec![],
                    meta: vec![u(out)?, u(gm.splits)?],
                    groups: flat_groups(out, kernels::FLAT_WG, maxg)?,
                });
            }
            Ok(Some(specs))
        }
        Op::Conv(a) => {
            if node.inputs.iter().any(|&i| g.node(i).shape.dtype != odt) || !float_word(odt) {
                return Err("conv with mixed or non-float dtypes".into());
            }
            let (x, w) = (ind(0), ind(1));
            let nsp = x.len() - 2;
            if !(1..=3).contains(&nsp) || w.len() != x.len() {
                return Err(format!("conv with {nsp} spatial dims"));
            }
            let pad3 = |v: &[usize], fill: usize| -> Vec<u32> {
                let mut r = vec![fill as u32; 3 - v.len()];
                r.extend(v.iter().map(|&x| x as u32));
                r
            };
            let (nimg, c, m) = (x[0], x[1], w[0]);
            let groups = a.groups.max(1);
            let cg = c / groups;
            let mg = m / groups;
            let ksp = &w[2..];
            let osp = &od[2..];
            let kc = cg * ksp.iter().product::<usize>();
            let p: usize = osp.iter().product();
            if nimg == 0 || p == 0 || mg == 0 || kc == 0 {
                return Err("empty conv".into());
            }
            let mut meta = vec![
                u(mg)?,
                u(p)?,
                u(kc)?,
                u(groups)?,
                u(c)?,
                u(cg)?,
                u(m)?,
                (node.inputs.len() == 3) as u32,
            ];
            meta.extend(pad3(&x[2..], 1));
            meta.extend([1, 1, 1]);
            meta.extend(pad3(osp, 1));
            meta.push(1);
            meta.extend(pad3(ksp, 1));
            meta.extend(pad3(&a.strides, 1));
            meta.extend(pad3(&a.dilations, 1));
            let pb: Vec<usize> = a.pads.iter().map(|p| p.0).collect();
            meta.extend(pad3(&pb, 0));
            meta.push(u(nout)?);
            meta.push(u(nimg)?);
            // Shader bindings: a = weights, b = input, c = bias (the weights again when
            // there is no bias; has_bias = 0 then).
            let mut inputs = vec![node.inputs[1], node.inputs[0]];
            inputs.push(*node.inputs.get(2).unwrap_or(&node.inputs[1]));
            if mg >= 16 {
                let pointwise = ksp.iter().all(|&k| k == 1)
                    && a.strides.iter().all(|&s| s == 1)
                    && a.pads.iter().all(|&(b, e)| b == 0 && e == 0);
                let kind = if pointwise {
                    GemmB::Conv1x1
                } else {
                    GemmB::Conv
                };
                let gm = gemm_kernel(kind, mg, nimg * p, kc, groups, false);
                let (tr, tc, src, reg) = (gm.rows, gm.cols, gm.src, gm.reg);
                if reg && kind == GemmB::Conv {
                    let p3 = |v: &[u32]| [v[0] as usize, v[1] as usize, v[2] as usize];
                    let table = kernels::conv_k_table(
                        kc,
                        p3(&pad3(ksp, 1)),
                        p3(&pad3(&a.dilations, 1)),
                        p3(&pad3(&x[2..], 1)),
                    );
                    if table.iter().any(|&v| v > i32::MAX as u32) {
                        return Err("conv input too large for 32-bit offsets".into());
                    }
                    meta.extend(table);
                }
                // The register-tiled kernel's columns span images; the earlier kernels'
                // dispatch has one z per image and group.
                let groups3 = if reg {
                    [
                        (nimg * p).div_ceil(tc) as u32,
                        mg.div_ceil(tr) as u32,
                        u(groups)?,
                    ]
                } else {
                    [
                        p.div_ceil(tc) as u32,
                        mg.div_ceil(tr) as u32,
                        u(nimg * groups)?,
                    ]
                };
                if groups3.iter().any(|&x| x > maxg) {
                    return Err("conv exceeds the dispatch limits".into());
                }
                Ok(Some(vec![Spec {
                    out_words: 0,
                    src,
                    inputs,
                    meta,
                    groups: groups3,
                }]))
            } else {
                Ok(Some(vec![Spec {
                    out_words: 0,
                    src: kernels::conv_direct(),
                    inputs,
                    meta,
                    groups: flat_groups(nout, kernels::FLAT_WG, maxg)?,
                }]))
            }
        }
        Op::Pool(a) => {
            let kind = match a.kind {
                PoolKind::Max => 0u32,
                PoolKind::Avg { .. } => 1,
                PoolKind::Lp { .. } => return Err("LpPool has no GPU kernel".into()),
            };
            if !float_word(idt(0)) {
                return Err(format!("pool of {}", idt(0)));
            }
            let x = ind(0);
            let nsp = x.len() - 2;
            if !(1..=3).contains(&nsp) {
                return Err(format!("pool with {nsp} spatial dims"));
            }
            let pad3 = |v: &[usize], fill: usize| -> Vec<u32> {
                let mut r = vec![fill as u32; 3 - v.len()];
                r.extend(v.iter().map(|&x| x as u32));
                r
            };
            let p: usize = od[2..].iter().product();
            let mut meta = vec![u(nout)?, u(p.max(1))?];
            meta.extend(pad3(&x[2..], 1));
            meta.extend(pad3(&od[2..], 1));
            meta.extend(pad3(&a.kernel, 1));
            meta.extend(pad3(&a.strides, 1));
            meta.extend(pad3(&a.dilations, 1));
            let pb: Vec<usize> = a.pads.iter().map(|p| p.0).collect();
            let pe: Vec<usize> = a.pads.iter().map(|p| p.1).collect();
            meta.extend(pad3(&pb, 0));
            meta.extend(pad3(&pe, 0));
            meta.push(kind);
            meta.push(matches!(
                a.kind,
                PoolKind::Avg {
                    count_include_pad: true
                }
            ) as u32);
            flat(kernels::pool(), meta)
        }
        other => Err(format!("no WGSL kernel for {}", other.name())),
    }
}

/// Select on words (cond u32, branches any 32-bit type).
fn word_elementwise(
    g: &Graph,
    id: NodeId,
    od: &[usize],
    nout: usize,
    maxg: u32,
) -> Result<Option<Vec<Spec>>, String> {
    let node = g.node(id);
    let ind = |k: usize| g.node(node.inputs[k]).shape.dims_usize();
    let fast = (0..3).all(|k| ind(k).as_slice() == od);
    let mut meta = vec![u(nout)?, od.len() as u32];
    let mut dims = od.iter().map(|&d| d as u32).collect::<Vec<_>>();
    dims.resize(8, 1);
    meta.extend(dims);
    for k in 0..3 {
        let mut st = bcast_strides(&ind(k), od)
            .iter()
            .map(|&s| u(s))
            .collect::<Result<Vec<_>, _>>()?;
        st.resize(8, 0);
        meta.extend(st);
    }
    Ok(Some(vec![Spec {
        out_words: 0,
        src: kernels::elementwise(
            &[Ty::U32, Ty::U32, Ty::U32],
            Ty::U32,
            "select(z, y, x != 0u)",
            fast,
        ),
        inputs: node.inputs.clone(),
        meta,
        groups: flat_groups(nout, kernels::FLAT_WG, maxg)?,
    }]))
}

/// One index-copy dispatch: `axes[i] = [out_dim, in_dim, in_stride, start, step, out_stride]`.
fn copy_spec(
    input: NodeId,
    n: usize,
    out_base: u32,
    mode: u32,
    pad_bits: u32,
    axes: &[[i64; 6]],
    maxg: u32,
) -> Result<Option<Vec<Spec>>, String> {
    let mut meta = vec![u(n)?, axes.len() as u32, out_base, mode, pad_bits];
    for a in axes {
        for &v in a {
            let w = i32::try_from(v).map_err(|_| format!("index {v} does not fit in i32"))?;
            meta.push(w as u32);
        }
    }
    if axes.is_empty() {
        meta.extend([1, 1, 0, 0, 1, 0]);
        meta[1] = 1;
    }
    Ok(Some(vec![Spec {
        out_words: 0,
        src: kernels::index_copy(),
        inputs: vec![input],
        meta,
        groups: flat_groups(n, kernels::FLAT_WG, maxg)?,
    }]))
}
