//! [`CudaExecutor`]: plans a compiled graph once (placement per node, one device buffer per
//! value a GPU node produces or reads, kernel handles, cuBLAS plans, fused groups), then runs
//! it on one stream (replaying a CUDA graph when it can), reading back only the outputs
//! (every node's value for [`CudaExecutor::run_all`]) and the inputs of CPU-fallback nodes.
//!
//! Split by responsibility: `plan.rs` (which kernel runs each node), `scan.rs` (the NaN/Inf
//! counts of `RLX_DEBUG_NANS`), `tests.rs` (host-side tests). What stays here (about 1,900
//! lines) is the executor's state, its construction and the run loop, which is one `match`
//! over the step kinds with the launch code of each; splitting that match across files would
//! scatter the one place where every step's launch and its safety comment are read together.

mod plan;
mod scan;
#[cfg(test)]
use plan::copy_plan;
use plan::plan_node;
use scan::ScanPlan;
#[cfg(test)]
use scan::{counts_of, scan_table};

use crate::kernels;
use crate::{gpu, CudaError, Gpu};
use cudarc::cublas::sys::{cublasMath_t, cublasOperation_t};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use rlx_cpu::eval_op;
use rlx_ir::numeric_check::{scan_data, DebugScanner, NonFiniteCounts};
use rlx_ir::provenance::node_label;
use rlx_ir::{
    strides_of, DType, Graph, NodeId, Op, PadMode, ReduceKind, Tensor, TensorData, UnaryOp,
};
use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a node runs (the same shape as `rlx_wgpu::Placement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A CUDA kernel or cuBLAS call (or a buffer alias, for Reshape).
    Gpu,
    /// `rlx_cpu::eval_op` on values read back from the GPU; `reason` says why.
    CpuFallback { reason: String },
}

/// A MatMul on cuBLAS: row-major `C[m,n] = A[m,k] B[k,n]` per batch, run as the
/// column-major `C^T = B^T A^T` (no transposes needed).
struct MatMulPlan {
    m: i32,
    n: i32,
    k: i32,
    /// One strided-batched call: (batches, A batch stride, B batch stride) in elements
    /// (a stride is 0 for an operand broadcast over the batch).
    strided: Option<(i32, i64, i64)>,
    /// Otherwise one sgemm per output batch: (A offset, B offset) in elements.
    offsets: Vec<(usize, usize)>,
}

enum Step {
    Leaf,
    /// Shares its input's buffer (Reshape).
    Alias,
    Unary {
        f: CudaFunction,
        p: [f32; 2],
    },
    Binary {
        f: CudaFunction,
        /// Index into `metas` for broadcasting, `None` when both inputs have the output's dims.
        meta: Option<usize>,
    },
    MatMul(MatMulPlan),
    /// Reduce over axes (`reduce_f32`): metadata index, kind code, output count; over the
    /// trailing axes (`reduce_rows`, a warp per output) `rows` is the row length.
    Reduce {
        f: CudaFunction,
        meta: usize,
        kind: i32,
        nout: u64,
        rows: Option<u64>,
    },
    /// Index-map copies (`copy_map`): (input position, metadata index, element count) per
    /// launch (one for Transpose/Broadcast/Slice/Tile/Pad, one per input for Concat).
    Copy {
        f: CudaFunction,
        parts: Vec<(usize, usize, u64)>,
    },
    /// ONNX Gather of 32-bit words (`gather_u32`), indices i64 or i32, bounds-checked.
    Gather {
        f: CudaFunction,
        nidx: i64,
        dim: i64,
        inner: i64,
        idx64: i32,
    },
    /// ONNX GatherND of 32-bit words (`gather_nd_u32`), metadata index, indices i64 or i32,
    /// bounds-checked like Gather.
    GatherNd {
        f: CudaFunction,
        meta: usize,
        idx64: i32,
    },
    /// `select_u32`: cond (Bool as u32), on_true, on_false, broadcast by metadata.
    Select {
        f: CudaFunction,
        meta: Option<usize>,
    },
    /// `umap_u32`: IsNaN, IsInf, Not, simple casts (kind code, two int parameters).
    UMap {
        f: CudaFunction,
        kind: i32,
        p: [i32; 2],
    },
    /// A 2-D convolution with groups 1 as a GEMM per batch (cuBLAS): `W[M, C*KH*KW]` times
    /// the input (1x1, stride 1, no pads) or its im2col columns (`im2col_f32` into the
    /// executor's shared column buffer; `im2col` = (kernel, metadata index, column count));
    /// then `bias_nchw` when there is a bias (`bias` = (kernel, HW, M)).
    ConvGemm {
        plan: MatMulPlan,
        im2col: Option<(CudaFunction, usize, u64)>,
        bias: Option<(CudaFunction, u64, u64)>,
    },
    /// 2-D MaxPool/AveragePool (`pool2d_f32`), metadata index.
    Pool {
        f: CudaFunction,
        meta: usize,
    },
    /// A convolution on cuDNN (`crate::cudnn`): index into `convs`; then `bias_nchw` when
    /// there is a bias (`bias` = (kernel, spatial size, M)).
    CudnnConv {
        plan: usize,
        bias: Option<(CudaFunction, u64, u64)>,
        /// bfloat16 on tensor cores: cuDNN reads the 16-bit input and filter buffers and writes
        /// the 16-bit output (rounded once from its f32 accumulation).
        half: bool,
    },
    /// Direct convolution (`conv_f32`), metadata index; bias is input 2 when present.
    Conv {
        f: CudaFunction,
        meta: usize,
    },
    Cpu(String),
}

/// Float dtypes of the float kernels: f32 and float16 as f32 words (float16 rounded at each
/// node's output), bfloat16 as 16-bit values ([`half_store`]).
pub(crate) fn float_word(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether a dtype is stored as 16 bits on the device (bfloat16: two bytes per value; its
/// kernels load 16 bits, compute in f32 and store the result rounded to bfloat16).
pub(crate) fn half_store(dt: DType) -> bool {
    dt == DType::BF16
}

/// f32 words a value of `numel` elements of `dt` takes on the device (bfloat16: two values
/// per word).
pub(crate) fn dev_len(dt: DType, numel: usize) -> usize {
    if half_store(dt) {
        numel.div_ceil(2)
    } else {
        numel * dev_words(dt).unwrap_or(1)
    }
}

/// Kernel elements per element of a dtype held on the device (Bool as a u32 0/1), or `None`
/// for a dtype with no device storage (its nodes run on the CPU).
pub(crate) fn dev_words(dt: DType) -> Option<usize> {
    match dt {
        // float16 as f32 words holding float16 values; bfloat16 as one 16-bit element.
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::U32 | DType::Bool => Some(1),
        DType::I64 => Some(2),
        _ => None,
    }
}

/// Runs a compiled graph on CUDA device 0. API parallel to `rlx_wgpu::WgpuExecutor`.
pub struct CudaExecutor {
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    tf32: bool,
    graph: Graph,
    steps: Vec<Step>,
    /// Buffer index per node (aliases share one).
    buf: Vec<Option<usize>>,
    buffers: Vec<CudaSlice<f32>>,
    /// Raw device address of each buffer (kernel and cuBLAS arguments).
    ptrs: Vec<u64>,
    /// Broadcast metadata of binary kernels (kept alive; raw addresses in `meta_ptrs`).
    _metas: Vec<CudaSlice<i64>>,
    meta_ptrs: Vec<u64>,
    /// Host-produced values (leaves, CPU nodes) that GPU nodes read: uploaded.
    upload: Vec<bool>,
    /// Gather's out-of-range flag (lowest offending node index; i32::MAX when none).
    err: Option<CudaSlice<i32>>,
    params: Vec<Option<Tensor>>,
    param_ids: HashMap<String, NodeId>,
    inputs: Vec<NodeId>,
    /// The device-side NaN/Inf scan, planned at the first scanning run.
    scan: Option<ScanPlan>,
    /// The in-place rounding of a float16/bfloat16 node's output (`round_f16`/`round_bf16`),
    /// for nodes that compute; `None` for f32 and for ops that only move rounded values.
    rounds: Vec<Option<CudaFunction>>,
    /// Elementwise fusion: each node's part, and the groups' kernels (runs that read every
    /// value back, `run_all` and launch-blocking, run the unfused steps).
    fz: Vec<Fz>,
    groups: Vec<FusedGroup>,
    /// Attention fusion ([`crate::attn`]): each node's part, the elementwise-fusion parts
    /// for runs that use it (a fused elementwise group with a node inside an attention
    /// group runs unfused there), the groups, and why there are none when planning failed.
    /// Ordinary runs use the plain kernel. Scanning runs run the counting variant, or
    /// without `attn_scan` ([`CudaExecutor::set_attention_scan`]) the unfused steps (the same
    /// per-node NaN/Inf counts as the unfused steps; absorbed Transposes run their own steps
    /// there, so their values are scanned as unfused); `run_all` and launch-blocking runs run
    /// the unfused steps (every value is read back).
    afz: Vec<Afz>,
    fz_attn: Vec<Fz>,
    attn: Vec<AttnGroup>,
    attn_note: Option<String>,
    attn_scan: bool,
    /// Scanning runs that ran (launched or replayed) the counting attention kernels.
    attn_scan_runs: std::sync::atomic::AtomicU64,
    /// Blocks of the counting attention kernels that took their two-pass path, summed over
    /// the groups, in the last scanning run that ran them.
    attn_scan_fallbacks: std::sync::atomic::AtomicU64,
    /// bfloat16 nodes whose step has no bfloat16 kernel: their bfloat16 inputs widened into
    /// f32 scratch before the step, the f32 result packed to bfloat16 after it
    /// ([`CudaExecutor::plan_wraps`]); the scratch buffers (kept alive) and the two kernels.
    wraps: Vec<Option<Wrap>>,
    _scratch: Vec<CudaSlice<f32>>,
    widen: Option<CudaFunction>,
    pack: Option<CudaFunction>,
    /// Per-node times (CUDA events around each node) while profiling is on.
    times: Option<rlx_cpu::NodeTimes>,
    /// float16/bfloat16 MatMuls on tensor cores: per node, the conversion kernel and the
    /// 16-bit copies of A and B (cuBLAS GemmEx, f32 accumulation, output rounded after).
    half_mm: Vec<Option<HalfMm>>,
    /// The im2col column buffer shared by every convolution (sized to the largest; they run
    /// one after another on the stream) and its raw address.
    _cols: Option<CudaSlice<f32>>,
    cols_ptr: u64,
    /// `err`'s raw address (0 without gathers).
    err_ptr: u64,
    /// cuDNN's plans, then its handle (dropped after the plans, before the stream).
    convs: Vec<crate::cudnn::ConvPlan>,
    cudnn: Option<crate::cudnn::Handle>,
    /// The one cuDNN workspace (sized to the largest chosen need) and its raw address.
    _workspace: Option<CudaSlice<u8>>,
    workspace_ptr: u64,
    workspace_bytes: usize,
    /// How each Conv runs (cuDNN and its algorithm, or the GEMM/direct path and why).
    notes: Vec<Option<String>>,
    /// cuDNN's version and file, or why Conv nodes do not use it (dispatch report).
    cudnn_status: Result<String, String>,
    /// Whether ordinary runs can be one CUDA graph (no CPU step), and the graph's state.
    graphable: bool,
    /// Index 0: ordinary runs; 1: scanning runs (their kernels count NaN/Inf, and the
    /// `nan_scan` launch is part of the graph).
    cuda_graph: std::sync::Mutex<[CudaGraphState; 2]>,
    /// Test-only planted bug (`RLX_TEST_PLANTED_BUG=cuda_matmul_drop_last_k`): every MatMul
    /// with K > 1 leaves out its last k, so the divergence tools' tests have a CUDA kernel
    /// bug to find.
    drop_last_k: bool,
    /// NaN/Inf counts of params (at `set_param`) and constants (at the first scanning run).
    leaf_counts: Vec<Option<NonFiniteCounts>>,
    /// Device-time measurement (see [`CudaExecutor::set_device_timing`]) and the last run's.
    device_timing: bool,
    last_device_ms: std::sync::Mutex<Option<f64>>,
}

/// A node's part in elementwise fusion ([`crate::fuse`]), for runs that use it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fz {
    /// Runs its own step.
    No,
    /// Computed inside its group's kernel (its value is not written).
    Member,
    /// The group's last node: the group's kernel runs here (index into `groups`).
    Sink(usize),
}

/// A node's part in attention fusion, for ordinary runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Afz {
    No,
    /// Computed inside its group's kernel (its value is not written).
    Member,
    /// The group's output (the second MatMul): the kernel runs here (index into `attn`).
    Sink(usize),
}

/// One fused attention kernel ([`crate::attn::KERNEL_SRC`]).
struct AttnGroup {
    f: CudaFunction,
    /// The counting variant (`rlx_attn_cnt_<tpr>`) for scanning runs.
    f_cnt: CudaFunction,
    plan: crate::attn::AttnPlan,
    /// Index into `meta_ptrs`.
    meta: usize,
    cfg: LaunchConfig,
}

/// One fused elementwise kernel: `f(out, n, meta)`.
struct FusedGroup {
    f: CudaFunction,
    /// The same kernel flagging a non-finite inner value (scanning runs), and the kernel
    /// launched after it that counts the members' NaN/Inf when the flag is set.
    f_scan: CudaFunction,
    f_cnt: CudaFunction,
    /// Members in topological order (the last is the sink).
    members: Vec<NodeId>,
    /// Index into `meta_ptrs`: input addresses, then broadcast metadata.
    meta: usize,
    n: u64,
}

/// A bfloat16 node run by its f32-word step: (input, scratch address, elements) per
/// bfloat16 input, and the output's scratch address when the output is bfloat16.
struct Wrap {
    ins: Vec<(NodeId, u64, u64)>,
    out: Option<u64>,
}

/// A float16/bfloat16 MatMul's operands converted to 16 bits for cuBLAS GemmEx.
struct HalfMm {
    conv: CudaFunction,
    /// The 16-bit copies (kept alive) and their raw addresses (no event recording, so the
    /// calls can be captured in a CUDA graph).
    _a16: CudaSlice<u16>,
    _b16: CudaSlice<u16>,
    a16: u64,
    b16: u64,
    bf: bool,
}

/// A captured CUDA graph. cudarc's `CudaGraph` is not `Send` (graph objects are not internally
/// synchronized); the executor only touches it under its mutex.
struct SendGraph(cudarc::driver::CudaGraph);
// SAFETY: every access goes through `CudaExecutor::cuda_graph`'s mutex, one thread at a time.
unsafe impl Send for SendGraph {}

/// Where an executor's CUDA graph stands.
enum CudaGraphState {
    /// Ordinary runs without a graph so far (the count): the second one is captured.
    Warmup(u32),
    Ready(SendGraph),
    /// Not used (why: off by `RLX_CUDA_GRAPH=0`, or a capture failed).
    Off(String),
}

/// What one run gives back (see [`CudaExecutor::execute`]).
struct RunOut {
    /// Node values asked for (index = node index).
    vals: Vec<Option<Tensor>>,
    /// Every node's NaN/Inf counts, when scanning.
    counts: Option<Vec<NonFiniteCounts>>,
    /// (node index, nanoseconds) per computing node, when profiling: CUDA event to event.
    times: Option<Vec<(usize, u64)>>,
}

/// Whether scanning runs count attention groups in the fused counting kernel when no
/// `RLX_CUDA_ATTN_SCAN` is set (see [`CudaExecutor::set_attention_scan`]).
const ATTN_SCAN_DEFAULT: bool = true;

/// `RLX_CUDA_ATTN_SCAN=0|1`, else [`ATTN_SCAN_DEFAULT`].
fn attn_scan_default() -> bool {
    use rlx_ir::env::{get, note_unrecognized, parse_switch, Switch};
    let v = get("RLX_CUDA_ATTN_SCAN");
    match parse_switch(v.as_deref()) {
        Switch::On => true,
        Switch::Off => false,
        Switch::Default => ATTN_SCAN_DEFAULT,
        Switch::Unrecognized => {
            let taken = if ATTN_SCAN_DEFAULT { "1" } else { "0" };
            note_unrecognized("RLX_CUDA_ATTN_SCAN", v.as_deref().unwrap_or(""), taken);
            ATTN_SCAN_DEFAULT
        }
    }
}

fn kernel_err(g: &Graph, id: NodeId, msg: impl Into<String>) -> CudaError {
    CudaError::Kernel {
        node: id,
        op: g.node(id).op.name(),
        label: node_label(g, id),
        msg: msg.into(),
    }
}

fn cuda_err(what: &str, e: impl std::fmt::Display) -> CudaError {
    CudaError::Cuda(format!("{what}: {e}"))
}

/// Strides (in elements) of `ind` broadcast right-aligned to `out` (0 where broadcast).
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

/// Broadcast metadata of a binary kernel: `[rank, dims[rank], strides of each input[rank]]`
/// over the output dims `od`, with adjacent axes merged where every input's strides allow
/// (a bias add over [1024, 768] stays rank 2; [8, 128, 768] - [8, 128, 1] becomes rank 2),
/// so the kernel divides once per remaining axis.
pub(crate) fn bcast_meta(inputs: &[&[usize]], od: &[usize]) -> Vec<i64> {
    let st: Vec<Vec<usize>> = inputs.iter().map(|d| bcast_strides(d, od)).collect();
    // Axes kept after merging (outermost first): (dim, stride per input).
    let mut axes: Vec<(usize, Vec<usize>)> = vec![];
    for (d, &dim) in od.iter().enumerate() {
        if dim == 1 {
            continue; // contributes nothing to any index
        }
        let cur: Vec<usize> = st.iter().map(|s| s[d]).collect();
        if let Some((pd, ps)) = axes.last_mut() {
            // Merge when each input's previous stride is this stride times this dim.
            if ps.iter().zip(&cur).all(|(&p, &c)| p == c * dim) {
                *pd *= dim;
                *ps = cur;
                continue;
            }
        }
        axes.push((dim, cur));
    }
    if axes.is_empty() {
        axes.push((1, vec![0; inputs.len()]));
    }
    let mut m = vec![axes.len() as i64];
    m.extend(axes.iter().map(|(d, _)| *d as i64));
    for k in 0..inputs.len() {
        m.extend(axes.iter().map(|(_, s)| s[k] as i64));
    }
    m
}

fn i32_of(v: usize, what: &str) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what} {v} exceeds cuBLAS's 32-bit sizes"))
}

/// The cuBLAS plan for a MatMul with input dims `a`, `b` (ONNX/NumPy matmul: 1-D operands
/// are promoted and the added axis removed; batch dims broadcast).
fn matmul_plan(a: &[usize], b: &[usize]) -> Result<MatMulPlan, String> {
    if a.is_empty() || b.is_empty() {
        return Err("matmul of a scalar".into());
    }
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
    let ob = rlx_ir::broadcast_dims(&ab, &bb).ok_or("matmul: batch dims do not broadcast")?;
    let nb: usize = ob.iter().product();
    if nb == 0 || m == 0 || n == 0 || k == 0 {
        return Err("empty matmul".into());
    }
    let sa = bcast_strides(&ab, &ob);
    let sb = bcast_strides(&bb, &ob);
    let full = strides_of(&ob);
    // An operand is "batched contiguously" when its broadcast strides are the output batch
    // strides, "broadcast" when they are all 0.
    let kind = |s: &[usize]| -> Option<i64> {
        if s.iter().all(|&x| x == 0) {
            Some(0)
        } else if s == full.as_slice() {
            Some(1)
        } else {
            None
        }
    };
    let (m32, n32, k32) = (i32_of(m, "M")?, i32_of(n, "N")?, i32_of(k, "K")?);
    i32_of(m * k, "A's size")?;
    i32_of(k * n, "B's size")?;
    let plan = match (kind(&sa), kind(&sb)) {
        // A batched contiguously times one B (a linear layer on [batch, seq, hidden]): the
        // batch folds into M, one GEMM of (batch*M) x K by K x N (C is contiguous too).
        (Some(1), Some(0)) if nb > 1 => MatMulPlan {
            m: i32_of(nb * m, "batch*M")?,
            n: n32,
            k: k32,
            strided: Some((1, 0, 0)),
            offsets: vec![],
        },
        (Some(ka), Some(kb)) => MatMulPlan {
            m: m32,
            n: n32,
            k: k32,
            strided: Some((
                i32_of(nb, "batch count")?,
                ka * (m * k) as i64,
                kb * (k * n) as i64,
            )),
            offsets: vec![],
        },
        _ => {
            let mut offsets = Vec::with_capacity(nb);
            for bi in 0..nb {
                let (mut rem, mut oa, mut obo) = (bi, 0usize, 0usize);
                for d in (0..ob.len()).rev() {
                    let c = rem % ob[d];
                    rem /= ob[d];
                    oa += c * sa[d];
                    obo += c * sb[d];
                }
                offsets.push((oa * m * k, obo * k * n));
            }
            MatMulPlan {
                m: m32,
                n: n32,
                k: k32,
                strided: None,
                offsets,
            }
        }
    };
    Ok(plan)
}

impl CudaExecutor {
    /// Plan `graph` (the compiled, decomposed graph from `rlx_compile::compiler::compile`,
    /// nodes in topological order) for CUDA device 0: decide each node's placement, allocate
    /// one device buffer per f32 value on the GPU, load kernels (NVRTC-compiled once per
    /// process), upload constants. Reads `RLX_DISPATCH_REPORT` (print placements) and
    /// `RLX_CUDA_TF32` (allow TF32 in cuBLAS matmuls; off by default) once, here.
    ///
    /// Errors: [`CudaError::NoDevice`] when [`crate::probe`] fails; [`CudaError::Kernel`]
    /// naming the node for a graph not in topological order or with symbolic dims on a
    /// computed node; [`CudaError::Cuda`] when an allocation or cuBLAS setup fails.
    pub fn new(graph: Graph) -> Result<CudaExecutor, CudaError> {
        let gpu = gpu().map_err(CudaError::NoDevice)?;
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the context", e))?;
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
            return Err(CudaError::Input(format!("graph output {o} is not a node")));
        }
        let stream = gpu
            .ctx
            .new_stream()
            .map_err(|e| cuda_err("creating a stream", e))?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| cuda_err("cublasCreate", e))?;
        let tf32 = rlx_ir::env::is_on("RLX_CUDA_TF32");
        let mode = if tf32 {
            cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            // Full f32 (cuBLAS uses TF32 only when asked): not PEDANTIC, which also rules
            // out faster f32 kernels and is meant for debugging cuBLAS itself.
            cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: a valid handle created above.
        unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }
            .result()
            .map_err(|e| cuda_err("cublasSetMathMode", e))?;
        // The kernel module is compiled (once per process) only when a node needs it.
        let mut module_cache: Option<Result<Arc<CudaModule>, String>> = None;
        let mut module = || module_cache.get_or_insert_with(|| gpu.module()).clone();
        let dev_value = |id: NodeId| -> bool {
            let s = &graph.node(id).shape;
            s.is_static() && dev_words(s.dtype).is_some()
        };

        // 1. Placement.
        let mut steps: Vec<Step> = Vec::with_capacity(n);
        let mut metas_host: Vec<Vec<i64>> = vec![];
        for node in &graph.nodes {
            if node.op.is_leaf() {
                steps.push(Step::Leaf);
                continue;
            }
            let r: Result<Step, String> = if !dev_value(node.id) {
                Err(format!(
                    "output {} is not f32/f16/bf16/i32/u32/i64/bool (no CUDA storage for it)",
                    node.shape
                ))
            } else if let Some(&bad) = node.inputs.iter().find(|&&i| !dev_value(i)) {
                Err(format!(
                    "input {bad} ({}) is not f32/f16/bf16/i32/u32/i64/bool (no CUDA storage for it)",
                    graph.node(bad).shape
                ))
            } else {
                plan_node(&graph, node.id, &mut module, &mut metas_host)
            };
            steps.push(r.unwrap_or_else(Step::Cpu));
        }

        // 1b. Convolutions on cuDNN where it can run them (RLX_CUDNN=0: im2col + cuBLAS or
        // the direct kernel, as planned above).
        let (convs, cudnn, notes, cudnn_status, direct_steps) =
            plan_cudnn(&graph, &mut steps, &gpu, &stream, tf32, &mut module)?;
        let workspace_bytes = convs.iter().map(|c| c.workspace).max().unwrap_or(0);
        let workspace = if workspace_bytes > 0 {
            Some(stream.alloc_zeros::<u8>(workspace_bytes).map_err(|e| {
                cuda_err(
                    &format!("allocating the cuDNN workspace ({workspace_bytes} bytes)"),
                    e,
                )
            })?)
        } else {
            None
        };
        let workspace_ptr = workspace.as_ref().map_or(0, |w| w.device_ptr(&stream).0);

        // float16/bfloat16 outputs of computing GPU nodes are rounded to their dtype.
        let mut rounds: Vec<Option<CudaFunction>> = Vec::with_capacity(n);
        for node in &graph.nodes {
            let dt = node.shape.dtype;
            let computes = !matches!(
                steps[node.id.index()],
                Step::Leaf
                    | Step::Cpu(_)
                    | Step::Alias
                    | Step::Copy { .. }
                    | Step::Gather { .. }
                    | Step::GatherNd { .. }
                    | Step::Select { .. }
            );
            // bfloat16 is stored as 16 bits: kernels round when they store.
            let name = match dt {
                DType::F16 => "round_f16",
                _ => "",
            };
            let f = if computes && !name.is_empty() {
                let m = module().map_err(|e| kernel_err(&graph, node.id, e))?;
                Some(
                    m.load_function(name)
                        .map_err(|e| kernel_err(&graph, node.id, format!("kernel {name}: {e}")))?,
                )
            } else {
                None
            };
            rounds.push(f);
        }

        // Elementwise fusion (RLX_CUDA_FUSE=0 turns it off): groups of Unary/Binary nodes
        // computing in f32, or in float16/bfloat16 (each member rounds its value inside the
        // fused kernel, so the group needs no rounding pass).
        let eligible: Vec<bool> = graph
            .nodes
            .iter()
            .map(|node| {
                let k = node.id.index();
                let dt = node.shape.dtype;
                let half = dt == DType::F16;
                matches!(steps[k], Step::Unary { .. } | Step::Binary { .. })
                    && !matches!(node.op, Op::Cast { .. })
                    && (dt == DType::F32 || half || dt == DType::BF16)
                    && rounds[k].is_some() == half
                    && node.shape.numel() > 0
                    && node.shape.numel() < (1 << 31)
                    && node.inputs.iter().all(|&i| graph.node(i).shape.dtype == dt)
            })
            .collect();
        let fuse_on = !matches!(
            rlx_ir::env::parse_switch(rlx_ir::env::get("RLX_CUDA_FUSE").as_deref()),
            rlx_ir::env::Switch::Off
        );
        let planned = if fuse_on {
            crate::fuse::plan_groups(&graph, &eligible)
        } else {
            vec![]
        };

        // 2. Buffers: every GPU-produced value, and every host value a GPU node reads.
        let mut buf: Vec<Option<usize>> = vec![None; n];
        let mut sizes: Vec<usize> = vec![];
        let mut upload = vec![false; n];
        for node in &graph.nodes {
            let id = node.id;
            if matches!(steps[id.index()], Step::Leaf | Step::Cpu(_)) {
                continue;
            }
            let words = |i: NodeId| {
                let s = &graph.node(i).shape;
                dev_len(s.dtype, s.numel())
            };
            for &i in &node.inputs {
                if buf[i.index()].is_none() {
                    sizes.push(words(i));
                    buf[i.index()] = Some(sizes.len() - 1);
                    upload[i.index()] = true;
                }
            }
            buf[id.index()] = match steps[id.index()] {
                Step::Alias => buf[node.inputs[0].index()],
                _ => {
                    sizes.push(words(id));
                    Some(sizes.len() - 1)
                }
            };
        }
        let mut buffers = Vec::with_capacity(sizes.len());
        let mut ptrs = Vec::with_capacity(sizes.len());
        for &s in &sizes {
            let b = stream
                .alloc_zeros::<f32>(s.max(1))
                .map_err(|e| cuda_err(&format!("allocating {} bytes", s * 4), e))?;
            ptrs.push(b.device_ptr(&stream).0);
            buffers.push(b);
        }
        // Fused kernels: one NVRTC program for the executor's groups; if it fails to build,
        // every node runs its own step (noted under RLX_DISPATCH_REPORT).
        let mut fz = vec![Fz::No; n];
        let mut groups: Vec<FusedGroup> = vec![];
        if !planned.is_empty() {
            let mut src = kernels::device_functions();
            let mut exts = vec![];
            let mut ok = Ok(());
            // Identical groups (the same ops in every layer) share one kernel: NVRTC compiles
            // each distinct source once (Qwen3-0.6B: 338 groups).
            let mut sources = Vec::with_capacity(planned.len());
            for members in &planned {
                let ext = crate::fuse::external_inputs(&graph, members);
                let od = graph
                    .node(*members.last().expect("non-empty"))
                    .shape
                    .dims_usize();
                let full: Vec<bool> = ext
                    .iter()
                    .map(|&e| graph.node(e).shape.dims_usize() == od)
                    .collect();
                match crate::fuse::kernel_source(&graph, members, &ext, &full, "FZ_NAME") {
                    Ok(k) => sources.push(k),
                    Err(e) => ok = Err(e),
                }
                exts.push((ext, od));
            }
            let (kernels_src, kernel_of) = crate::fuse::dedupe(&sources);
            src += &kernels_src;
            let (maj, min) = gpu.info.compute_capability;
            let module =
                ok.and_then(|_| kernels::compile_source(&gpu.ctx, maj, min, &src, "rlx_fused.cu"));
            match module {
                Ok(m) => {
                    for (gi, (members, (ext, od))) in planned.iter().zip(exts).enumerate() {
                        let k = kernel_of[gi];
                        let f = m
                            .load_function(&format!("fz_{k}"))
                            .map_err(|e| cuda_err("loading a fused kernel", e))?;
                        let f_scan = m
                            .load_function(&format!("fz_{k}_scan"))
                            .map_err(|e| cuda_err("loading a fused kernel", e))?;
                        let f_cnt = m
                            .load_function(&format!("fz_{k}_cnt"))
                            .map_err(|e| cuda_err("loading a fused kernel", e))?;
                        let dims: Vec<Vec<usize>> = ext
                            .iter()
                            .map(|&e| graph.node(e).shape.dims_usize().to_vec())
                            .collect();
                        let refs: Vec<&[usize]> = dims.iter().map(|d| d.as_slice()).collect();
                        let mut meta: Vec<i64> = ext
                            .iter()
                            .map(|&e| ptrs[buf[e.index()].expect("GPU inputs have buffers")] as i64)
                            .collect();
                        meta.extend(bcast_meta(&refs, &od));
                        metas_host.push(meta);
                        for &mb in members {
                            fz[mb.index()] = Fz::Member;
                        }
                        let sink = *members.last().expect("non-empty");
                        fz[sink.index()] = Fz::Sink(groups.len());
                        groups.push(FusedGroup {
                            f,
                            f_scan,
                            f_cnt,
                            members: members.clone(),
                            meta: metas_host.len() - 1,
                            n: od.iter().product::<usize>() as u64,
                        });
                    }
                }
                Err(e) => {
                    if rlx_ir::env::is_on("RLX_DISPATCH_REPORT") {
                        eprintln!(
                            "rlx-cuda: elementwise fusion is off for {}: {e}",
                            graph.name
                        );
                    }
                }
            }
        }
        // Attention fusion (RLX_CUDA_ATTN=0 turns it off): one kernel per matched group.
        let mut afz = vec![Afz::No; n];
        let mut fz_attn = fz.clone();
        let mut attn: Vec<AttnGroup> = vec![];
        let mut attn_note = None;
        let attn_on = !matches!(
            rlx_ir::env::parse_switch(rlx_ir::env::get("RLX_CUDA_ATTN").as_deref()),
            rlx_ir::env::Switch::Off
        );
        if attn_on {
            let on_gpu = |id: NodeId| {
                !matches!(steps[id.index()], Step::Leaf | Step::Cpu(_)) && buf[id.index()].is_some()
            };
            let plans = crate::attn::plan_attention(&graph, &on_gpu);
            if !plans.is_empty() {
                match gpu.attn_module() {
                    Ok(m) => {
                        for plan in plans {
                            let tpr = plan.tpr();
                            // bfloat16: the instance over 16-bit storage.
                            let sfx = if half_store(plan.dt) { "_bf" } else { "" };
                            let name = format!("rlx_attn{sfx}_{tpr}");
                            let f = m
                                .load_function(&name)
                                .map_err(|e| cuda_err(&format!("loading kernel {name}"), e))?;
                            let name = format!("rlx_attn_cnt{sfx}_{tpr}");
                            let f_cnt = m
                                .load_function(&name)
                                .map_err(|e| cuda_err(&format!("loading kernel {name}"), e))?;
                            metas_host.push(plan.meta());
                            let cfg = LaunchConfig {
                                grid_dim: (
                                    plan.batch.iter().product::<usize>() as u32,
                                    plan.lq.div_ceil(crate::attn::ROWS) as u32,
                                    1,
                                ),
                                block_dim: (32 * tpr as u32, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            let ai = attn.len();
                            for &mb in &plan.members {
                                afz[mb.index()] = Afz::Member;
                            }
                            afz[plan.sink().index()] = Afz::Sink(ai);
                            attn.push(AttnGroup {
                                f,
                                f_cnt,
                                plan,
                                meta: metas_host.len() - 1,
                                cfg,
                            });
                        }
                        // An elementwise group with a node inside an attention group runs
                        // unfused in runs that use attention fusion.
                        for fg in &groups {
                            if fg.members.iter().any(|m| afz[m.index()] != Afz::No) {
                                for m in &fg.members {
                                    fz_attn[m.index()] = Fz::No;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if rlx_ir::env::is_on("RLX_DISPATCH_REPORT") {
                            eprintln!("rlx-cuda: attention fusion is off for {}: {e}", graph.name);
                        }
                        attn_note = Some(format!("the attention kernels did not build: {e}"));
                    }
                }
            }
        } else {
            attn_note = Some("RLX_CUDA_ATTN=0".into());
        }
        let mut metas = Vec::with_capacity(metas_host.len());
        let mut meta_ptrs = Vec::with_capacity(metas_host.len());
        for m in &metas_host {
            let b = stream
                .clone_htod(m.as_slice())
                .map_err(|e| cuda_err("uploading kernel metadata", e))?;
            meta_ptrs.push(b.device_ptr(&stream).0);
            metas.push(b);
        }

        let err = if steps
            .iter()
            .any(|s| matches!(s, Step::Gather { .. } | Step::GatherNd { .. }))
        {
            Some(
                stream
                    .alloc_zeros::<i32>(1)
                    .map_err(|e| cuda_err("allocating the gather error flag", e))?,
            )
        } else {
            None
        };
        let mut half_mm: Vec<Option<HalfMm>> = Vec::with_capacity(n);
        for node in &graph.nodes {
            let dt = node.shape.dtype;
            let h = if matches!(steps[node.id.index()], Step::MatMul(_))
                && matches!(dt, DType::F16 | DType::BF16)
            {
                let m = module().map_err(|e| kernel_err(&graph, node.id, e))?;
                let conv = m.load_function("to_half_bits").map_err(|e| {
                    kernel_err(&graph, node.id, format!("kernel to_half_bits: {e}"))
                })?;
                // bfloat16 operands are already 16-bit buffers (no copies).
                let len = |i: NodeId| {
                    if dt == DType::BF16 {
                        1
                    } else {
                        graph.node(i).shape.numel().max(1)
                    }
                };
                let a16 = stream
                    .alloc_zeros::<u16>(len(node.inputs[0]))
                    .map_err(|e| cuda_err("allocating a 16-bit matmul operand", e))?;
                let b16 = stream
                    .alloc_zeros::<u16>(len(node.inputs[1]))
                    .map_err(|e| cuda_err("allocating a 16-bit matmul operand", e))?;
                let (ap, bp) = (a16.device_ptr(&stream).0, b16.device_ptr(&stream).0);
                Some(HalfMm {
                    conv,
                    a16: ap,
                    b16: bp,
                    _a16: a16,
                    _b16: b16,
                    bf: dt == DType::BF16,
                })
            } else {
                None
            };
            half_mm.push(h);
        }
        let graphable = !steps.iter().any(|s| matches!(s, Step::Cpu(_)));
        let graph_off = matches!(
            rlx_ir::env::parse_switch(rlx_ir::env::get("RLX_CUDA_GRAPH").as_deref()),
            rlx_ir::env::Switch::Off
        );
        let graph_state = || {
            if graph_off {
                CudaGraphState::Off("RLX_CUDA_GRAPH=0".into())
            } else {
                CudaGraphState::Warmup(0)
            }
        };
        let ncols = steps
            .iter()
            .filter_map(|s| match s {
                Step::ConvGemm {
                    im2col: Some((_, _, c)),
                    ..
                } => Some(*c as usize),
                _ => None,
            })
            .max();
        let cols = match ncols {
            Some(c) => Some(stream.alloc_zeros::<f32>(c.max(1)).map_err(|e| {
                cuda_err(&format!("allocating {} bytes of im2col columns", c * 4), e)
            })?),
            None => None,
        };
        let cols_ptr = match &cols {
            Some(c) => c.device_ptr(&stream).0,
            None => 0,
        };
        let err_ptr = match &err {
            Some(e) => e.device_ptr(&stream).0,
            None => 0,
        };
        let mut ex = CudaExecutor {
            convs,
            cudnn,
            _workspace: workspace,
            workspace_ptr,
            workspace_bytes,
            notes,
            cudnn_status,
            _cols: cols,
            cols_ptr,
            err_ptr,
            graphable,
            cuda_graph: std::sync::Mutex::new([graph_state(), graph_state()]),
            half_mm,
            wraps: vec![],
            _scratch: vec![],
            widen: None,
            pack: None,
            err,
            scan: None,
            times: None,
            fz,
            groups,
            afz,
            fz_attn,
            attn,
            attn_note,
            attn_scan: attn_scan_default(),
            attn_scan_runs: std::sync::atomic::AtomicU64::new(0),
            attn_scan_fallbacks: std::sync::atomic::AtomicU64::new(0),
            leaf_counts: vec![None; n],
            device_timing: false,
            last_device_ms: std::sync::Mutex::new(None),
            rounds,
            drop_last_k: rlx_ir::env::get("RLX_TEST_PLANTED_BUG")
                .as_deref()
                .map(str::trim)
                == Some("cuda_matmul_drop_last_k"),
            params: vec![None; n],
            param_ids,
            inputs: graph.inputs(),
            gpu,
            stream,
            blas,
            tf32,
            steps,
            buf,
            buffers,
            ptrs,
            _metas: metas,
            meta_ptrs,
            upload,
            graph,
        };
        // One trial run of each cuDNN convolution on its (zeroed) buffers: a plan that cuDNN
        // ranked but cannot run goes back to the step planned before cuDNN, with the reason,
        // instead of failing every run.
        for (k, before) in direct_steps {
            if let Err(e) = ex.trial_conv(k) {
                let id = NodeId(k as u32);
                ex.notes[k] = Some(format!(
                    "{} (cuDNN failed a trial run: {e})",
                    step_kind(&before)
                ));
                ex.steps[k] = before;
                if rlx_ir::env::is_on("RLX_DISPATCH_REPORT") {
                    eprintln!(
                        "rlx-cuda dispatch: {id} Conv \"{}\": cuDNN trial run failed: {e}",
                        node_label(&ex.graph, id)
                    );
                }
            }
        }
        ex.plan_wraps()?;
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

    /// The device the kernels run on (`NVIDIA H200`).
    pub fn device_name(&self) -> String {
        self.gpu.info.name.clone()
    }

    /// Whether cuBLAS may use TF32 for f32 matmuls (`RLX_CUDA_TF32=1` at creation).
    pub fn tf32(&self) -> bool {
        self.tf32
    }

    /// Placement of every non-leaf node, in topological order.
    pub fn placements(&self) -> Vec<(NodeId, Placement)> {
        self.graph
            .nodes
            .iter()
            .filter_map(|n| match &self.steps[n.id.index()] {
                Step::Leaf => None,
                Step::Cpu(r) => Some((n.id, Placement::CpuFallback { reason: r.clone() })),
                _ => Some((n.id, Placement::Gpu)),
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
                    eprintln!("rlx-cuda dispatch: {what}: cuda");
                }
                Placement::CpuFallback { reason } => {
                    nc += 1;
                    eprintln!("rlx-cuda dispatch: {what}: cpu fallback ({reason})");
                }
            }
        }
        let on_cudnn = self
            .steps
            .iter()
            .filter(|s| matches!(s, Step::CudnnConv { .. }))
            .count();
        let other = self
            .steps
            .iter()
            .filter(|s| matches!(s, Step::ConvGemm { .. } | Step::Conv { .. }))
            .count();
        if on_cudnn + other > 0 {
            match &self.cudnn_status {
                Ok(v) => eprintln!(
                    "rlx-cuda dispatch: {} convolutions: {on_cudnn} on {v}, {other} on im2col + cuBLAS or the direct kernel; cuDNN workspace {} bytes",
                    g.name, self.workspace_bytes
                ),
                Err(e) => eprintln!(
                    "rlx-cuda dispatch: {} convolutions: {other} on im2col + cuBLAS or the direct kernel (cuDNN not used: {e})",
                    g.name
                ),
            }
        }
        if !self.groups.is_empty() {
            let members = self.fz.iter().filter(|f| **f != Fz::No).count();
            eprintln!(
                "rlx-cuda dispatch: {} fused elementwise kernels run {members} nodes (a run that reads every value back runs them one by one)",
                self.groups.len()
            );
        }
        if !self.attn.is_empty() {
            let members = self.afz.iter().filter(|f| **f != Afz::No).count();
            eprintln!(
                "rlx-cuda dispatch: {} fused attention kernels run {members} nodes (runs that scan for NaN/Inf {}; runs that read every value back run them one by one)",
                self.attn.len(),
                if self.attn_scan {
                    "run a counting variant"
                } else {
                    "run them one by one"
                }
            );
        } else if let Some(why) = &self.attn_note {
            eprintln!("rlx-cuda dispatch: attention fusion off ({why})");
        }
        let wrapped = self.bf16_wrapped();
        if !wrapped.is_empty() {
            let mut kinds: Vec<String> = wrapped
                .iter()
                .map(|&i| g.node(i).op.name().to_string())
                .collect();
            kinds.sort();
            kinds.dedup();
            eprintln!(
                "rlx-cuda dispatch: {} bfloat16 nodes run an f32-word kernel between conversions (no bfloat16 kernel: {})",
                wrapped.len(),
                kinds.join(", ")
            );
        }
        match (&self.lock_graph()[0], self.graphable) {
            (CudaGraphState::Off(why), _) => eprintln!("rlx-cuda dispatch: CUDA graph off ({why})"),
            (_, false) => eprintln!(
                "rlx-cuda dispatch: CUDA graph off (a CPU-fallback node needs the host inside the run)"
            ),
            _ => eprintln!(
                "rlx-cuda dispatch: ordinary runs are captured as a CUDA graph at their second run and replayed"
            ),
        }
        eprintln!(
            "rlx-cuda dispatch: {} on {} (sm_{}{}{}): {ng} nodes on cuda, {nc} on the cpu",
            g.name,
            self.gpu.info.name,
            self.gpu.info.compute_capability.0,
            self.gpu.info.compute_capability.1,
            if self.tf32 { ", TF32 matmuls" } else { "" }
        );
    }

    fn lock_graph(&self) -> std::sync::MutexGuard<'_, [CudaGraphState; 2]> {
        self.cuda_graph.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run the cuDNN convolution of node `k` once and wait for it (at creation, on the
    /// zeroed buffers).
    fn trial_conv(&self, k: usize) -> Result<(), String> {
        let Step::CudnnConv { plan, half, .. } = &self.steps[k] else {
            return Ok(());
        };
        let node = self.graph.node(NodeId(k as u32));
        let h = self.cudnn.as_ref().ok_or("no cuDNN handle")?;
        // An f32 conv of bfloat16 values runs on f32 scratch in real runs; the trial only
        // needs buffers of the right sizes, and a bfloat16 node's buffers are half as large.
        if !*half && half_store(node.shape.dtype) {
            return Ok(());
        }
        let (x, w, o) = (
            self.ptr(node.inputs[0]),
            self.ptr(node.inputs[1]),
            self.ptr(node.id),
        );
        // SAFETY: the node's operand and output buffers and the workspace of the largest
        // chosen need, all owned by `self`.
        unsafe { self.convs[*plan].forward(h, x, w, o, self.workspace_ptr, self.workspace_bytes) }?;
        self.stream
            .synchronize()
            .map_err(|e| format!("synchronizing: {e}"))
    }

    /// Bytes of the device buffer holding node `id`'s value (`None` when it has none): a
    /// bfloat16 value of n elements takes 2n bytes (rounded up to whole 4-byte words), an
    /// f32 value 4n.
    pub fn value_bytes(&self, id: NodeId) -> Option<usize> {
        let b = self.buf.get(id.index()).copied().flatten()?;
        Some(self.buffers[b].len() * 4)
    }

    /// Nodes whose step runs its f32-word kernel between bfloat16 conversions (no bfloat16
    /// kernel for it: casts, comparisons, IsNaN/IsInf, convolutions off cuDNN's bfloat16
    /// path).
    pub fn bf16_wrapped(&self) -> Vec<NodeId> {
        (0..self.wraps.len())
            .filter(|&k| self.wraps[k].is_some())
            .map(|k| NodeId(k as u32))
            .collect()
    }

    /// How a Conv node runs (`"cuDNN IMPLICIT_PRECOMP_GEMM, FMA math, workspace 0 bytes"`,
    /// or `"im2col + cuBLAS (cuDNN not used: RLX_CUDNN=0)"`, ...); `None` for other nodes.
    pub fn kernel_note(&self, id: NodeId) -> Option<&str> {
        self.notes.get(id.index()).and_then(|n| n.as_deref())
    }

    /// cuDNN as this executor uses it: its version and file, or why Conv nodes do not use
    /// it (`RLX_CUDNN=0`, the library missing, no convolution on the GPU).
    pub fn cudnn_status(&self) -> Result<&str, &str> {
        self.cudnn_status.as_deref().map_err(|e| e.as_str())
    }

    /// Measure each run's device time: CUDA events on the stream just before the run's
    /// first kernel (after the inputs' uploads when the run replays a CUDA graph) and after
    /// its last (the NaN scan included), so the host-to-device and device-to-host copies are
    /// left out, as PyTorch's CUDA-event timings of a model whose inputs and outputs stay on
    /// the GPU leave them out. Read with [`CudaExecutor::last_device_ms`].
    pub fn set_device_timing(&mut self, on: bool) {
        self.device_timing = on;
        *self
            .last_device_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The last run's device time in milliseconds (with [`CudaExecutor::set_device_timing`]
    /// on; `None` before such a run).
    pub fn last_device_ms(&self) -> Option<f64> {
        *self
            .last_device_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether scanning runs (`RLX_DEBUG_NANS`) replay their own captured CUDA graph now
    /// (after their second run; never with a CPU-fallback node or `RLX_CUDA_GRAPH=0`).
    pub fn scan_uses_cuda_graph(&self) -> bool {
        matches!(&self.lock_graph()[1], CudaGraphState::Ready(_))
    }

    /// Whether ordinary runs replay a captured CUDA graph now (after their second run; never
    /// with a CPU-fallback node or `RLX_CUDA_GRAPH=0`).
    pub fn uses_cuda_graph(&self) -> bool {
        matches!(&self.lock_graph()[0], CudaGraphState::Ready(_))
    }

    /// How many fused elementwise kernels ordinary runs launch (0 with `RLX_CUDA_FUSE=0`).
    pub fn fused_groups(&self) -> usize {
        self.groups.len()
    }

    /// How many fused attention kernels ordinary runs launch (0 with `RLX_CUDA_ATTN=0`;
    /// scanning runs run the counting variant unless [`Self::set_attention_scan`] is off,
    /// `run_all` and launch-blocking runs always do).
    pub fn attention_groups(&self) -> usize {
        self.attn.len()
    }

    /// Whether scanning runs (`RLX_DEBUG_NANS`) run the fused attention groups as the
    /// counting variant of their kernel (`true`, the default; `RLX_CUDA_ATTN_SCAN=0` makes it
    /// `false` at creation) or as the unfused steps (`false`); the per-node NaN/Inf counts
    /// are the same (see [`crate::attn`]). On the H200 the single-pass counting kernel's
    /// scanning runs take less device time than the unfused steps with their scan (the
    /// attention subgraph alone: BERT-base 8x128 f32 0.111 vs 0.124 ms, bfloat16 0.122 vs
    /// 0.153; Qwen3-0.6B prefill 512 f32 0.404 vs 0.479, bfloat16 0.420 vs 0.437). Changing it
    /// replans the scan (and its CUDA graph) at the next scanning run.
    pub fn set_attention_scan(&mut self, on: bool) {
        if on == self.attn_scan {
            return;
        }
        self.attn_scan = on;
        {
            let mut st = self.lock_graph();
            if !matches!(st[1], CudaGraphState::Off(_)) {
                st[1] = CudaGraphState::Warmup(0);
            }
        }
        self.scan = None;
    }

    /// How many scanning runs (`RLX_DEBUG_NANS`) so far ran the counting variants of the
    /// fused attention kernels (launched or replayed in their CUDA graph).
    pub fn attention_scan_runs(&self) -> u64 {
        self.attn_scan_runs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many blocks (of [`crate::attn::ROWS`] query rows of one batch entry) of the
    /// counting attention kernels took their two-pass path in the last scanning run that ran
    /// them (a row with a NaN or infinite max of U, an overflowing `U - max`, or a NaN/±inf
    /// in V's keys); the others counted in their single pass.
    pub fn attention_scan_fallback_blocks(&self) -> u64 {
        self.attn_scan_fallbacks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The nodes each fused attention kernel computes (members in topological order, the
    /// output last).
    pub fn attention_members(&self) -> Vec<Vec<NodeId>> {
        self.attn.iter().map(|a| a.plan.members.clone()).collect()
    }

    /// Why attention fusion is off (`RLX_CUDA_ATTN=0`, or the kernels did not build), when
    /// it is; `None` when it is on (whether or not a group matched).
    pub fn attention_note(&self) -> Option<&str> {
        self.attn_note.as_deref()
    }

    /// Set the Param node named `name` to `t` (uploaded now if a GPU node reads it).
    ///
    /// The tensor must have the node's dtype and element count (a flat vector is
    /// accepted). Errors: [`CudaError::Param`] for an unknown name, a wrong dtype or count.
    pub fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), CudaError> {
        let id = *self.param_ids.get(name).ok_or_else(|| {
            CudaError::Param(format!(
                "no param named \"{name}\" in graph {}",
                self.graph.name
            ))
        })?;
        let shape = self.graph.node(id).shape.clone();
        if t.dtype() != shape.dtype {
            return Err(CudaError::Param(format!(
                "param \"{name}\" is {shape} but the value is {}",
                t.shape()
            )));
        }
        if !shape.is_static() {
            return Err(CudaError::Param(format!(
                "param \"{name}\" is {shape}: symbolic dims"
            )));
        }
        let dims = shape.dims_usize();
        let n: usize = dims.iter().product();
        if t.numel() != n {
            return Err(CudaError::Param(format!(
                "param \"{name}\" is {shape} ({n} elements) but the value has {} elements",
                t.numel()
            )));
        }
        let t = t
            .reshaped(dims)
            .map_err(|e| CudaError::Param(format!("param \"{name}\": {e}")))?;
        if self.upload[id.index()] {
            self.write_value(id, &t)?;
        }
        self.leaf_counts[id.index()] = self.scan.as_ref().map(|_| scan_data(t.data()));
        self.params[id.index()] = Some(t);
        Ok(())
    }

    /// Copy a host f32 value into its buffer (on the stream; the host copy may be dropped
    /// when this returns: a copy from pageable memory is staged before the call returns).
    fn write_value(&self, id: NodeId, t: &Tensor) -> Result<(), CudaError> {
        let Some(b) = self.buf[id.index()] else {
            return Ok(());
        };
        let g = &self.graph;
        let bools: Vec<u32>;
        let wide: Vec<f32>;
        let packed: Vec<u16>;
        let (src, words): (&[u8], usize) = match t.data() {
            TensorData::F32(v) => (as_bytes(v), v.len()),
            // Widened on all cores (a decode step uploads every layer's 16-bit KV cache:
            // 37M values for a Qwen3-0.6B-sized model at 640 positions).
            TensorData::F16(v) => {
                use rayon::prelude::*;
                wide = v.par_iter().map(|x| x.to_f32()).collect();
                (as_bytes(&wide), wide.len())
            }
            // bfloat16: stored as 16 bits (an odd count is padded to a whole word).
            TensorData::BF16(v) => {
                packed = v
                    .iter()
                    .map(|x| x.to_bits())
                    .chain((v.len() % 2 == 1).then_some(0))
                    .collect();
                (as_bytes(&packed), packed.len() / 2)
            }
            TensorData::I32(v) => (as_bytes(v), v.len()),
            TensorData::U32(v) => (as_bytes(v), v.len()),
            TensorData::I64(v) => (as_bytes(v), 2 * v.len()),
            TensorData::Bool(v) => {
                bools = v.iter().map(|&x| x as u32).collect();
                (as_bytes(&bools), bools.len())
            }
            _ => {
                return Err(kernel_err(
                    g,
                    id,
                    format!("{} values cannot be uploaded to the GPU", t.dtype()),
                ))
            }
        };
        if words == 0 {
            return Ok(());
        }
        if words > self.buffers[b].len() {
            return Err(kernel_err(g, id, "value larger than its device buffer"));
        }
        // SAFETY: the destination buffer holds at least `words` 32-bit words (checked above)
        // and lives as long as the executor; the stream is this executor's.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(self.ptrs[b], src, self.stream.cu_stream())
        }
        .map_err(|e| kernel_err(g, id, format!("upload: {e}")))
    }

    fn check_inputs<I: Borrow<Tensor>>(&self, inputs: &[I]) -> Result<(), CudaError> {
        rlx_cpu::check_feeds(&self.graph, &self.inputs, inputs, false).map_err(CudaError::Input)
    }

    /// Run with `inputs` (owned tensors or references to them) in `graph.inputs()` order;
    /// returns the outputs in `graph.outputs` order. With `scanner` on, a scan kernel counts
    /// NaN/±inf in every f32 value a GPU node wrote (one launch after the run; 48 bytes per
    /// value read back), host values (inputs, params, constants, CPU-fallback nodes) are
    /// counted on the host, and the counts go to the scanner in topological order: the same
    /// report as the CPU backend; abort mode returns [`CudaError::NanAbort`] after the run
    /// that created the first NaN, naming its node.
    ///
    /// Errors: [`CudaError::Input`] naming a mismatched input, [`CudaError::Param`] for an
    /// unset param, [`CudaError::Kernel`] naming the node for a failed launch, cuBLAS call or
    /// CPU-fallback kernel, [`CudaError::Cuda`] for a failed synchronization.
    pub fn run<I: Borrow<Tensor>>(
        &mut self,
        inputs: &[I],
        scanner: Option<&mut DebugScanner>,
    ) -> Result<Vec<Tensor>, CudaError> {
        let scanner = scanner.filter(|s| s.is_on());
        if scanner.is_some() && self.scan.is_none() {
            self.scan = Some(self.plan_scan()?);
        }
        let RunOut {
            vals: mut all,
            counts,
            times,
        } = self.execute(inputs, false, scanner.is_some(), None)?;
        if let (Some(p), Some(t)) = (self.times.as_mut(), times) {
            p.runs += 1;
            for (k, ns) in t {
                p.ns[k] += ns;
            }
        }
        let g = &self.graph;
        if let (Some(sc), Some(counts)) = (scanner, counts) {
            sc.begin_run(g);
            for (k, c) in counts.into_iter().enumerate() {
                sc.scan_counts(g, NodeId(k as u32), c)?;
            }
            sc.finish_run(g)?;
        }
        // Moved, not copied (a 512 x 151936 f32 logits tensor is 311 MB); a node listed twice
        // as an output is cloned from its first place.
        let mut outs: Vec<Tensor> = Vec::with_capacity(g.outputs.len());
        for (j, o) in g.outputs.iter().enumerate() {
            let t = match all[o.index()].take() {
                Some(t) => t,
                None => {
                    let k = g.outputs[..j]
                        .iter()
                        .position(|p| p == o)
                        .expect("outputs are read");
                    outs[k].clone()
                }
            };
            outs.push(t);
        }
        Ok(outs)
    }

    /// Run and read back every node's value (index = node index), leaves included: for the
    /// cross-backend divergence diagnostic. Errors as [`CudaExecutor::run`].
    pub fn run_all<I: Borrow<Tensor>>(
        &mut self,
        inputs: &[I],
    ) -> Result<Vec<Option<Tensor>>, CudaError> {
        Ok(self.execute(inputs, true, false, None)?.vals)
    }

    /// [`CudaExecutor::run_all`] in launch-blocking mode (as `CUDA_LAUNCH_BLOCKING=1`):
    /// `before(node)` is called before each computing node runs, and the stream is
    /// synchronized after each GPU node, so a failing kernel is reported as that node's
    /// error and the last `before` call named it. Slow: for crash localization (the printer's
    /// level 3).
    pub fn run_all_hooked<I: Borrow<Tensor>>(
        &mut self,
        inputs: &[I],
        before: &mut dyn FnMut(NodeId),
    ) -> Result<Vec<Option<Tensor>>, CudaError> {
        Ok(self.execute(inputs, true, false, Some(before))?.vals)
    }

    /// Time every computing node of the following [`CudaExecutor::run`]s with CUDA events
    /// (`true`; resets the times) or stop (`false`). A node's time is from the event before
    /// it to the event before the next node on the stream: its kernels (and, for a CPU
    /// fallback, the read-back, the CPU's work and the upload).
    pub fn set_profiling(&mut self, on: bool) {
        self.times = on.then(|| rlx_cpu::NodeTimes {
            runs: 0,
            ns: vec![0; self.graph.len()],
        });
    }

    /// Per-node times summed over the runs since profiling was turned on (`None` when off).
    pub fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
        self.times.as_ref()
    }

    /// One run: every node's value when `all`, else the outputs (index = node index), and
    /// with `scan` every node's NaN/Inf counts (the scan must be planned).
    #[allow(clippy::type_complexity)]
    fn execute<'a, I: Borrow<Tensor>>(
        &'a self,
        inputs: &'a [I],
        all: bool,
        scan: bool,
        mut before: Option<&mut dyn FnMut(NodeId)>,
    ) -> Result<RunOut, CudaError> {
        self.check_inputs(inputs)?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the context", e))?;
        let n = self.graph.len();
        if let Some(e) = &self.err {
            let flag = [i32::MAX];
            // SAFETY: the flag buffer holds one i32.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    e.device_ptr(&self.stream).0,
                    &flag[..],
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| cuda_err("resetting the gather error flag", e))?;
        }
        let mut host: Vec<Option<Cow<'a, Tensor>>> = (0..n).map(|_| None).collect();
        let mut next_input = 0;
        let timed = |stream: &CudaStream| {
            stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("recording a profiling event", e))
        };
        // Fused groups replace their members unless every value is read back or the run is
        // launch-blocking (a scanning run counts the members inside the fused kernels).
        let fuse = !all && before.is_none();
        // Attention groups run fused in ordinary runs, and in scanning runs with `attn_scan`
        // (the counting kernel; absorbed Transposes run their own steps there).
        let attn_run = fuse && !self.attn.is_empty() && (!scan || self.attn_scan);
        if scan {
            self.preset_scan()?;
        }
        let cnt_base: u64 = match (&self.scan, scan) {
            (Some(sp), true) => sp.out.device_ptr(&self.stream).0,
            _ => 0,
        };
        let mut events: Option<Vec<(usize, cudarc::driver::CudaEvent)>> =
            self.times.as_ref().map(|_| Vec::new());
        // CUDA graph: an ordinary run of a graph with no CPU step is captured once (at its
        // second such run: the first one warms cuBLAS up) and replayed after; inputs are
        // uploaded before the replay, outputs read after it. Scanning runs have their own
        // graph (slot 1: the counting kernels and the NaN scan; the counts are preset before
        // the replay and read after it).
        let slot = scan as usize;
        let graph_mode = fuse
            && events.is_none()
            && self.graphable
            && !matches!(&self.lock_graph()[slot], CudaGraphState::Off(_));
        if graph_mode {
            for (k, step) in self.steps.iter().enumerate() {
                if !matches!(step, Step::Leaf) {
                    continue;
                }
                let node = self.graph.node(NodeId(k as u32));
                let t: &Tensor = match &node.op {
                    Op::Input { .. } => {
                        let t: &Tensor = inputs[next_input].borrow();
                        next_input += 1;
                        if self.upload[k] {
                            self.write_value(node.id, t)?;
                        }
                        t
                    }
                    Op::Param { name } => self.params[k].as_ref().ok_or_else(|| {
                        CudaError::Param(format!(
                            "param \"{name}\" ({}) was not set before run",
                            node.shape
                        ))
                    })?,
                    Op::Constant(t) => t.as_ref(),
                    _ => unreachable!("leaf"),
                };
                host[k] = Some(Cow::Borrowed(t));
            }
        }
        let (replay, capture) = if graph_mode {
            let st = self.lock_graph();
            match &st[slot] {
                CudaGraphState::Ready(_) => (true, false),
                CudaGraphState::Warmup(r) => (false, *r >= 1),
                CudaGraphState::Off(_) => (false, false),
            }
        } else {
            (false, false)
        };
        if capture {
            self.stream
                .begin_capture(
                    cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
                .map_err(|e| cuda_err("starting a CUDA graph capture", e))?;
        }
        let mut launch_all = || -> Result<(), CudaError> {
            for k in 0..n {
                let id = NodeId(k as u32);
                let g = &self.graph;
                let node = g.node(id);
                if attn_run
                    && self.afz[k] == Afz::Member
                    && !(scan && matches!(node.op, Op::Transpose { .. }))
                {
                    continue;
                }
                let fzk = if attn_run {
                    self.fz_attn[k]
                } else {
                    self.fz[k]
                };
                if fuse && fzk == Fz::Member {
                    continue;
                }
                if let (Some(ev), false) = (events.as_mut(), matches!(self.steps[k], Step::Leaf)) {
                    ev.push((k, timed(&self.stream)?));
                }
                if let (true, Afz::Sink(ai)) = (attn_run, self.afz[k]) {
                    let a = &self.attn[ai];
                    let p = &a.plan;
                    let (q, kp, v) = (self.ptr(p.q.node), self.ptr(p.k.node), self.ptr(p.v.node));
                    let msk: u64 = p.mask.as_ref().map_or(0, |m| self.ptr(m.node));
                    let (o, m) = (self.ptr(id), self.meta_ptrs[a.meta]);
                    let (lq, lk, dqk, dv) = (p.lq as i32, p.lk as i32, p.dqk as i32, p.dv as i32);
                    let scale = p.scale_value();
                    // Scanning runs: the counting kernel, its counts at the group's slots.
                    let cnt: u64 = match (&self.scan, cnt_base) {
                        (Some(sp), b) if b != 0 => b + 48 * sp.attn_slot[ai] as u64,
                        _ => 0,
                    };
                    let flags = if cnt != 0 { p.scan_flags() } else { p.flags() };
                    let mut l = self
                        .stream
                        .launch_builder(if cnt != 0 { &a.f_cnt } else { &a.f });
                    l.arg(&q).arg(&kp).arg(&v).arg(&msk).arg(&o).arg(&m);
                    l.arg(&lq)
                        .arg(&lk)
                        .arg(&dqk)
                        .arg(&dv)
                        .arg(&scale)
                        .arg(&flags);
                    if cnt != 0 {
                        l.arg(&cnt);
                    }
                    // SAFETY: signature (const float* x4, float*, const i64*, int x4, float,
                    // int), the counting kernel's with a u64* more; the metadata's strides
                    // (planned from the operands' dims) keep every read inside the Q, K, V and
                    // mask buffers and every write inside the output's ([.., lq, dv]
                    // contiguous); the mask pointer is null without one; `cnt` points at
                    // `ROLES` six-word slots inside the scan's counts.
                    unsafe { l.launch(a.cfg) }
                        .map_err(|e| kernel_err(g, id, format!("launch (fused attention): {e}")))?;
                    continue;
                }
                if let (true, Fz::Sink(gi)) = (fuse, fzk) {
                    let fg = &self.groups[gi];
                    let (o, m) = (self.ptr(id), self.meta_ptrs[fg.meta]);
                    let cnt: u64 = match (&self.scan, cnt_base) {
                        (Some(sp), b) if b != 0 => b + 48 * sp.group_slot[gi] as u64,
                        _ => 0,
                    };
                    let mut l =
                        self.stream
                            .launch_builder(if cnt != 0 { &fg.f_scan } else { &fg.f });
                    l.arg(&o).arg(&fg.n).arg(&m).arg(&cnt);
                    // SAFETY: signature (float*, u64, const i64*, u64*); the metadata holds the
                    // group's input addresses (live buffers) and broadcast strides within them;
                    // `cnt` is null or 6 words per counted member, then the flag word, inside
                    // the scan's counts.
                    unsafe { l.launch(launch_cfg(fg.n)) }
                        .map_err(|e| kernel_err(g, id, format!("launch (fused group): {e}")))?;
                    if cnt != 0 {
                        // The counting kernel: returns at once unless a value was flagged; it
                        // runs on fewer threads, each over several elements, so its per-warp
                        // flush happens less often.
                        let mut l = self.stream.launch_builder(&fg.f_cnt);
                        l.arg(&o).arg(&fg.n).arg(&m).arg(&cnt);
                        // Two blocks per SM of an H200: a clean run's launch (every block
                        // reads the flag and returns) costs the scheduling of its blocks,
                        // once per fused group; a flagged one counts with fewer threads.
                        let mut c = launch_cfg(fg.n);
                        c.grid_dim.0 = c.grid_dim.0.min(264);
                        // SAFETY: as above (the same signature and arguments; it writes only
                        // the counts).
                        unsafe { l.launch(c) }.map_err(|e| {
                            kernel_err(g, id, format!("launch (fused group count): {e}"))
                        })?;
                    }
                    continue;
                }
                let blocking = before.is_some() && !matches!(self.steps[k], Step::Leaf);
                if let (Some(b), true) = (before.as_deref_mut(), blocking) {
                    b(id);
                }
                // A bfloat16 node without a bfloat16 kernel: its bfloat16 inputs widened into
                // f32 scratch, the step reading them there (and writing its output there).
                let wrap = self.wraps[k].as_ref();
                if let Some(w) = wrap {
                    let f = self.widen.as_ref().expect("loaded with the wraps");
                    for (i, dst, nel) in &w.ins {
                        let src = self.ptr(*i);
                        let mut l = self.stream.launch_builder(f);
                        l.arg(&src).arg(dst).arg(nel);
                        // SAFETY: signature (const unsigned short*, float*, u64); the input's
                        // buffer holds `nel` 16-bit values, the scratch `nel` f32 words.
                        unsafe { l.launch(launch_cfg((*nel).max(1))) }.map_err(|e| {
                            kernel_err(g, id, format!("launch (from bfloat16): {e}"))
                        })?;
                    }
                }
                let ptr = |x: NodeId| -> u64 {
                    if let Some(w) = wrap {
                        if let Some(&(_, p, _)) = w.ins.iter().find(|e| e.0 == x) {
                            return p;
                        }
                        if let (true, Some(p)) = (x == id, w.out) {
                            return p;
                        }
                    }
                    self.ptr(x)
                };
                match &self.steps[k] {
                    Step::Leaf if graph_mode => {}
                    Step::Leaf => {
                        let t: &Tensor = match &node.op {
                            Op::Input { .. } => {
                                let t: &Tensor = inputs[next_input].borrow();
                                next_input += 1;
                                t
                            }
                            Op::Param { name } => self.params[k].as_ref().ok_or_else(|| {
                                CudaError::Param(format!(
                                    "param \"{name}\" ({}) was not set before run",
                                    node.shape
                                ))
                            })?,
                            Op::Constant(t) => t.as_ref(),
                            _ => unreachable!("leaf"),
                        };
                        if matches!(node.op, Op::Input { .. }) && self.upload[k] {
                            self.write_value(id, t)?;
                        }
                        host[k] = Some(Cow::Borrowed(t));
                    }
                    Step::Alias => {}
                    Step::Unary { f, p } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let a = ptr(node.inputs[0]);
                            let o = ptr(id);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&a).arg(&o).arg(&nel).arg(&p[0]).arg(&p[1]);
                            // SAFETY: the kernel's signature is (const float*, float*, u64, float,
                            // float); both buffers hold at least `nel` f32.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Binary { f, meta } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let a = ptr(node.inputs[0]);
                            let b = ptr(node.inputs[1]);
                            let o = ptr(id);
                            let m: u64 = meta.map_or(0, |i| self.meta_ptrs[i]);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&a).arg(&b).arg(&o).arg(&nel).arg(&m);
                            // SAFETY: signature (const float*, const float*, float*, u64, const
                            // i64*); the metadata's strides stay inside each input's buffer.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::MatMul(p) => {
                        let (a, b, c) = (ptr(node.inputs[0]), ptr(node.inputs[1]), ptr(id));
                        match &self.half_mm[k] {
                            Some(h) => self
                                .half_gemm(p, h, (node.inputs[0], a), (node.inputs[1], b), c)
                                .map_err(|e| kernel_err(g, id, format!("cuBLAS: {e}")))?,
                            None => self
                                .sgemm(p, a, b, c)
                                .map_err(|e| kernel_err(g, id, format!("cuBLAS: {e}")))?,
                        }
                    }
                    Step::Reduce {
                        f,
                        kind,
                        nout,
                        rows: Some(r),
                        ..
                    } => {
                        if *nout > 0 {
                            let (x, o) = (ptr(node.inputs[0]), ptr(id));
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&o).arg(nout).arg(r).arg(kind);
                            let cfg = LaunchConfig {
                                grid_dim: ((*nout).div_ceil(8).clamp(1, 1 << 20) as u32, 1, 1),
                                block_dim: (256, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            // SAFETY: signature (const float*, float*, u64, u64, int); the input
                            // holds nout * r contiguous values, the output nout.
                            unsafe { l.launch(cfg) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Reduce {
                        f,
                        meta,
                        kind,
                        nout,
                        rows: None,
                    } => {
                        if *nout > 0 {
                            let (x, o, m) = (ptr(node.inputs[0]), ptr(id), self.meta_ptrs[*meta]);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&o).arg(nout).arg(&m).arg(kind);
                            let cfg = LaunchConfig {
                                grid_dim: ((*nout).min(1 << 20) as u32, 1, 1),
                                block_dim: (256, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            // SAFETY: signature (const float*, float*, u64, const i64*, int); the
                            // metadata's offsets stay inside the input, `nout` outputs.
                            unsafe { l.launch(cfg) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Copy { f, parts } => {
                        let o = ptr(id);
                        for &(k, meta, cnt) in parts {
                            if cnt == 0 {
                                continue;
                            }
                            let x = ptr(node.inputs[k]);
                            let m = self.meta_ptrs[meta];
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&o).arg(&cnt).arg(&m);
                            // SAFETY: signature (const u32*, u32*, u64, const i64*); the planned
                            // index map stays inside both buffers.
                            unsafe { l.launch(launch_cfg(cnt)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Gather {
                        f,
                        nidx,
                        dim,
                        inner,
                        idx64,
                    } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let (x, ix, o) = (ptr(node.inputs[0]), ptr(node.inputs[1]), ptr(id));
                            let ep = self.err_ptr;
                            let nid = id.index() as i32;
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x)
                                .arg(&ix)
                                .arg(&o)
                                .arg(&nel)
                                .arg(nidx)
                                .arg(dim)
                                .arg(inner);
                            l.arg(idx64).arg(&ep).arg(&nid);
                            // SAFETY: signature (const u32*, const void*, u32*, u64, i64, i64, i64,
                            // int, int*, int); indices are checked against `dim` in the kernel.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::GatherNd { f, meta, idx64 } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let (x, ix, o) = (ptr(node.inputs[0]), ptr(node.inputs[1]), ptr(id));
                            let (ep, nid, m) =
                                (self.err_ptr, id.index() as i32, self.meta_ptrs[*meta]);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&ix).arg(&o).arg(&nel).arg(&m);
                            l.arg(idx64).arg(&ep).arg(&nid);
                            // SAFETY: signature (const u32*, const void*, u32*, u64, const i64*,
                            // int, int*, int); every index is checked against its data dim in
                            // the kernel, the metadata describes the node's own dims.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::ConvGemm { plan, im2col, bias } => {
                        let x = ptr(node.inputs[0]);
                        let w = ptr(node.inputs[1]);
                        let o = ptr(id);
                        let cols = match im2col {
                            Some((f, meta, cnt)) => {
                                let m = self.meta_ptrs[*meta];
                                let cp = self.cols_ptr;
                                let mut l = self.stream.launch_builder(f);
                                l.arg(&x).arg(&cp).arg(cnt).arg(&m);
                                // SAFETY: signature (const float*, float*, u64, const i64*); the
                                // column buffer holds the largest conv's `cnt` columns, input
                                // positions are checked against the input dims in the kernel.
                                unsafe { l.launch(launch_cfg(*cnt)) }.map_err(|e| {
                                    kernel_err(g, id, format!("launch (im2col): {e}"))
                                })?;
                                cp
                            }
                            None => x,
                        };
                        self.sgemm(plan, w, cols, o)
                            .map_err(|e| kernel_err(g, id, format!("cuBLAS: {e}")))?;
                        if let Some((f, hw, m)) = bias {
                            let b = ptr(node.inputs[2]);
                            let nel = node.shape.numel() as u64;
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&o).arg(&b).arg(&nel).arg(hw).arg(m);
                            // SAFETY: signature (float*, const float*, u64, u64, u64); the bias
                            // holds m values, the output nel.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch (bias): {e}")))?;
                        }
                    }
                    Step::CudnnConv { plan, bias, half } => {
                        let (x, w, o) = (ptr(node.inputs[0]), ptr(node.inputs[1]), ptr(id));
                        let h = self
                            .cudnn
                            .as_ref()
                            .ok_or_else(|| kernel_err(g, id, "no cuDNN handle".to_string()))?;
                        // bfloat16 (`half`): the node's buffers are 16-bit, as cuDNN's
                        // bfloat16 descriptors say.
                        let _ = half;
                        let (cx, cw, cy) = (x, w, o);
                        // SAFETY: cx, cw, cy are this executor's buffers of the node's operand
                        // and output sizes in the plan's data type (the descriptors were made
                        // from those dims); the workspace holds the largest chosen need; all
                        // live as long as `self`.
                        unsafe {
                            self.convs[*plan].forward(
                                h,
                                cx,
                                cw,
                                cy,
                                self.workspace_ptr,
                                self.workspace_bytes,
                            )
                        }
                        .map_err(|e| kernel_err(g, id, format!("cuDNN: {e}")))?;
                        if let Some((f, hw, m)) = bias {
                            let b = ptr(node.inputs[2]);
                            let nel = node.shape.numel() as u64;
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&o).arg(&b).arg(&nel).arg(hw).arg(m);
                            // SAFETY: signature (float*, const float*, u64, u64, u64); the bias
                            // holds m values, the output nel.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch (bias): {e}")))?;
                        }
                    }
                    Step::Pool { f, meta } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let (x, o, m) = (ptr(node.inputs[0]), ptr(id), self.meta_ptrs[*meta]);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&o).arg(&nel).arg(&m);
                            // SAFETY: signature (const float*, float*, u64, const i64*); input
                            // positions are checked against the input dims in the kernel.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Conv { f, meta } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let x = ptr(node.inputs[0]);
                            let w = ptr(node.inputs[1]);
                            let b = if node.inputs.len() == 3 {
                                ptr(node.inputs[2])
                            } else {
                                0u64
                            };
                            let o = ptr(id);
                            let m = self.meta_ptrs[*meta];
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&w).arg(&b).arg(&o).arg(&nel).arg(&m);
                            // SAFETY: signature (const float* x3, float*, u64, const i64*); input
                            // positions are checked against the input dims in the kernel.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Select { f, meta } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let c = ptr(node.inputs[0]);
                            let a = ptr(node.inputs[1]);
                            let b = ptr(node.inputs[2]);
                            let o = ptr(id);
                            let m: u64 = meta.map_or(0, |i| self.meta_ptrs[i]);
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&c).arg(&a).arg(&b).arg(&o).arg(&nel).arg(&m);
                            // SAFETY: signature (const u32* x3, u32*, u64, const i64*).
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::UMap { f, kind, p } => {
                        let nel = node.shape.numel() as u64;
                        if nel > 0 {
                            let (x, o) = (ptr(node.inputs[0]), ptr(id));
                            let mut l = self.stream.launch_builder(f);
                            l.arg(&x).arg(&o).arg(&nel).arg(kind).arg(&p[0]).arg(&p[1]);
                            // SAFETY: signature (const u32*, u32*, u64, int, int, int); the buffers
                            // hold `nel` elements of the planned dtypes.
                            unsafe { l.launch(launch_cfg(nel)) }
                                .map_err(|e| kernel_err(g, id, format!("launch: {e}")))?;
                        }
                    }
                    Step::Cpu(_) => {
                        let missing: Vec<NodeId> = node
                            .inputs
                            .iter()
                            .copied()
                            .filter(|i| host[i.index()].is_none())
                            .collect();
                        if !missing.is_empty() {
                            let got = self.read_back(&missing)?;
                            for (i, t) in missing.iter().zip(got) {
                                host[i.index()] = Some(Cow::Owned(t));
                            }
                        }
                        let g = &self.graph;
                        let node = g.node(id);
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
                    }
                }
                // A step run on f32 scratch for a bfloat16 output: pack (rounds once).
                if let Some(Wrap { out: Some(src), .. }) = self.wraps[k].as_ref() {
                    let nel = node.shape.numel() as u64;
                    let f = self.pack.as_ref().expect("loaded with the wraps");
                    let dst = self.ptr(id);
                    let mut l = self.stream.launch_builder(f);
                    l.arg(src).arg(&dst).arg(&nel);
                    // SAFETY: signature (const float*, rlx_bf*, u64); the scratch holds `nel`
                    // f32 words, the node's buffer `nel` 16-bit values.
                    unsafe { l.launch(launch_cfg(nel.max(1))) }
                        .map_err(|e| kernel_err(g, id, format!("launch (to bfloat16): {e}")))?;
                }
                if let Some(f) = &self.rounds[k] {
                    let nel = node.shape.numel() as u64;
                    if nel > 0 {
                        let o = self.ptr(id);
                        let mut l = self.stream.launch_builder(f);
                        l.arg(&o).arg(&nel);
                        // SAFETY: signature (float*, u64); the node's buffer holds `nel` words.
                        unsafe { l.launch(launch_cfg(nel)) }
                            .map_err(|e| kernel_err(g, id, format!("launch (rounding): {e}")))?;
                    }
                }
                if blocking {
                    self.stream.synchronize().map_err(|e| {
                        kernel_err(
                            &self.graph,
                            id,
                            format!("the kernel failed (synchronized after its launch): {e}"),
                        )
                    })?;
                }
            }
            Ok(())
        };
        let dev_start = if self.device_timing {
            Some(timed(&self.stream)?)
        } else {
            None
        };
        // The NaN scan runs after the last kernel (inside the graph when there is one).
        let launched = if replay {
            Ok(())
        } else {
            launch_all().and_then(|()| if scan { self.launch_scan() } else { Ok(()) })
        };
        if capture {
            let graph = self
                .stream
                .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            let mut st = self.lock_graph();
            match (launched, graph) {
                (Ok(()), Ok(Some(gr))) => st[slot] = CudaGraphState::Ready(SendGraph(gr)),
                (Err(e), _) => {
                    st[slot] = CudaGraphState::Off(format!("capture failed: {e}"));
                    return Err(e);
                }
                (Ok(()), other) => {
                    let why = match other {
                        Err(e) => format!("capture failed: {e}"),
                        _ => "capture gave no graph".into(),
                    };
                    if rlx_ir::env::is_on("RLX_DISPATCH_REPORT") {
                        eprintln!(
                            "rlx-cuda dispatch: CUDA graph off for {} ({why})",
                            self.graph.name
                        );
                    }
                    st[slot] = CudaGraphState::Off(why);
                    drop(st);
                    // Nothing ran (the kernels were only recorded): run again without a graph.
                    return self.execute(inputs, all, scan, None);
                }
            }
        } else {
            launched?;
            if graph_mode && !replay {
                let mut st = self.lock_graph();
                if let CudaGraphState::Warmup(r) = &mut st[slot] {
                    *r += 1;
                }
            }
        }
        if graph_mode {
            if let CudaGraphState::Ready(gr) = &self.lock_graph()[slot] {
                if replay || capture {
                    gr.0.launch()
                        .map_err(|e| cuda_err("launching the CUDA graph", e))?;
                }
            }
        }
        let dev_end = match &dev_start {
            Some(_) => Some(timed(&self.stream)?),
            None => None,
        };
        let end = match &events {
            Some(_) => Some(timed(&self.stream)?),
            None => None,
        };
        // The scan's counts (its kernel ran last, above), before the read-backs.
        let scan_words = if scan { Some(self.read_scan()?) } else { None };
        if scan && attn_run {
            self.attn_scan_runs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let (Some(w), Some(sp)) = (&scan_words, &self.scan) {
                let blocks: u64 = sp
                    .attn_slot
                    .iter()
                    .map(|&s| w[6 * (s + crate::attn::ROLES)])
                    .sum();
                self.attn_scan_fallbacks
                    .store(blocks, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // Read back what was asked for.
        let want: Vec<NodeId> = if all {
            (0..n as u32).map(NodeId).collect()
        } else {
            self.graph.outputs.clone()
        };
        let mut todo: Vec<NodeId> = want
            .iter()
            .copied()
            .filter(|i| host[i.index()].is_none())
            .collect();
        todo.sort();
        todo.dedup();
        let got = self.read_back(&todo)?;
        for (i, t) in todo.iter().zip(got) {
            host[i.index()] = Some(Cow::Owned(t));
        }
        self.stream.synchronize().map_err(|e| {
            cuda_err(
                &format!("synchronizing after the run of {}", self.graph.name),
                e,
            )
        })?;
        if let Some(e) = &self.err {
            let v = self
                .stream
                .clone_dtoh(e)
                .map_err(|e| cuda_err("reading the gather error flag", e))?;
            self.stream
                .synchronize()
                .map_err(|e| cuda_err("synchronizing the gather error flag", e))?;
            if v[0] != i32::MAX && (v[0] as usize) < n {
                let id = NodeId(v[0] as u32);
                let g = &self.graph;
                let node = g.node(id);
                let dd = g.node(node.inputs[0]).shape.dims_usize();
                let axis = match node.op {
                    Op::Gather { axis } => axis,
                    _ => 0,
                };
                if let Op::GatherND { batch_dims } = node.op {
                    return Err(kernel_err(
                        g,
                        id,
                        format!(
                            "GatherND: an index is out of range for data dims {dd:?} (batch_dims {batch_dims})"
                        ),
                    ));
                }
                let size = dd.get(axis).copied().unwrap_or(0) as i64;
                // Name the first offending index as the CPU does (the indices are read back
                // only on this error path).
                let first_bad = self.read_back(&[node.inputs[1]]).ok().and_then(|t| {
                    t[0].data()
                        .to_i64_vec()
                        .iter()
                        .enumerate()
                        .find(|(_, &k)| k < -size || k >= size)
                        .map(|(p, &k)| (p, k))
                });
                let msg = match first_bad {
                    Some((p, k)) => format!(
                        "gather: index {k} (at position {p} of the indices) is out of range for an axis of size {size}"
                    ),
                    None => format!("gather: an index is out of range for data dims {dd:?}"),
                };
                return Err(kernel_err(g, id, msg));
            }
        }
        if let (Some(a), Some(b)) = (&dev_start, &dev_end) {
            let ms = a
                .elapsed_ms(b)
                .map_err(|e| cuda_err("reading the device-time events", e))?;
            *self
                .last_device_ms
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(ms as f64);
        }
        let counts = scan_words.map(|w| self.node_counts(&host, &w));
        let times = match (events, end) {
            (Some(ev), Some(end)) => {
                let mut t = Vec::with_capacity(ev.len());
                for (j, (k, e)) in ev.iter().enumerate() {
                    let next = ev.get(j + 1).map_or(&end, |x| &x.1);
                    let ms = e
                        .elapsed_ms(next)
                        .map_err(|e| cuda_err("reading a profiling event", e))?;
                    t.push((*k, (ms as f64 * 1e6) as u64));
                }
                Some(t)
            }
            _ => None,
        };
        let mut out: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        for i in want {
            if out[i.index()].is_none() {
                // Read-back values move; host leaves (inputs, params) are copied.
                out[i.index()] = host[i.index()].take().map(Cow::into_owned);
            }
        }
        Ok(RunOut {
            vals: out,
            counts,
            times,
        })
    }

    /// Plan the bfloat16 nodes whose step has no bfloat16 kernel (casts, comparisons,
    /// IsNaN/IsInf, direct and im2col convolutions, cuDNN convolutions with a bias): each
    /// bfloat16 input is widened into f32 scratch before the step and a bfloat16 output is
    /// written to f32 scratch and packed after it (`f32_to_bf16`, one rounding), so the step
    /// runs its f32-word kernel unchanged. Scratch is shared: one buffer per operand position
    /// (and one for outputs), sized to the largest such operand.
    fn plan_wraps(&mut self) -> Result<(), CudaError> {
        let g = &self.graph;
        let n = g.len();
        // Per node: (bfloat16 inputs as (node, operand position, elements), output is bf16).
        type Planned = Option<(Vec<(NodeId, usize, u64)>, bool)>;
        let mut wraps: Vec<Planned> = (0..n).map(|_| None).collect();
        let mut need: Vec<usize> = vec![];
        for node in &g.nodes {
            let k = node.id.index();
            let bf = |i: NodeId| half_store(g.node(i).shape.dtype);
            let native = match &self.steps[k] {
                Step::Leaf | Step::Alias | Step::Cpu(_) => true,
                // `_bf` kernels: float ops whose inputs all have the output's dtype.
                Step::Unary { .. } | Step::Binary { .. } => {
                    !matches!(node.op, Op::Cast { .. })
                        && node
                            .inputs
                            .iter()
                            .all(|&i| g.node(i).shape.dtype == node.shape.dtype)
                }
                Step::MatMul(_)
                | Step::Reduce { .. }
                | Step::Copy { .. }
                | Step::Gather { .. }
                | Step::GatherNd { .. }
                | Step::Select { .. }
                | Step::Pool { .. } => true,
                Step::CudnnConv { half, .. } => *half,
                Step::UMap { .. } | Step::ConvGemm { .. } | Step::Conv { .. } => false,
            };
            if native || !(bf(node.id) || node.inputs.iter().any(|&i| bf(i))) {
                continue;
            }
            let mut ins = vec![];
            for (pos, &i) in node.inputs.iter().enumerate() {
                if bf(i) && !ins.iter().any(|e: &(NodeId, usize, u64)| e.0 == i) {
                    ins.push((i, pos, g.node(i).shape.numel() as u64));
                }
            }
            let out = bf(node.id);
            let slots = node.inputs.len() + 1;
            if need.len() < slots {
                need.resize(slots, 0);
            }
            for &(_, pos, nel) in &ins {
                need[pos] = need[pos].max(nel as usize);
            }
            wraps[k] = Some((ins, out));
        }
        if wraps.iter().all(|w| w.is_none()) {
            self.wraps = (0..n).map(|_| None).collect();
            return Ok(());
        }
        // Output scratch: its own buffer after the input slots.
        let out_need = g
            .nodes
            .iter()
            .filter(|nd| matches!(wraps[nd.id.index()], Some((_, true))))
            .map(|nd| nd.shape.numel())
            .max()
            .unwrap_or(0);
        need.push(out_need);
        let mut scratch = Vec::with_capacity(need.len());
        let mut addr = Vec::with_capacity(need.len());
        for &c in &need {
            let b = self.stream.alloc_zeros::<f32>(c.max(1)).map_err(|e| {
                cuda_err(
                    &format!("allocating {} bytes of bfloat16 scratch", c * 4),
                    e,
                )
            })?;
            addr.push(b.device_ptr(&self.stream).0);
            scratch.push(b);
        }
        let out_addr = *addr.last().expect("pushed above");
        self.wraps = wraps
            .into_iter()
            .map(|w| {
                w.map(|(ins, out)| Wrap {
                    ins: ins
                        .into_iter()
                        .map(|(i, pos, nel)| (i, addr[pos], nel))
                        .collect(),
                    out: out.then_some(out_addr),
                })
            })
            .collect();
        self._scratch = scratch;
        let m = self.gpu.module().map_err(CudaError::Cuda)?;
        let load = |name: &str| {
            m.load_function(name)
                .map_err(|e| CudaError::Cuda(format!("kernel {name}: {e}")))
        };
        self.widen = Some(load("bf16_bits_to_f32")?);
        self.pack = Some(load("f32_to_bf16")?);
        Ok(())
    }

    fn ptr(&self, id: NodeId) -> u64 {
        self.ptrs[self.buf[id.index()].expect("GPU node operands have buffers")]
    }

    fn sgemm(&self, p: &MatMulPlan, a: u64, b: u64, c: u64) -> Result<(), String> {
        let h = *self.blas.handle();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op = cublasOperation_t::CUBLAS_OP_N;
        // The planted test bug: the product leaves out its last k (leading dims unchanged).
        let kk = if self.drop_last_k && p.k > 1 {
            p.k - 1
        } else {
            p.k
        };
        // Row-major C[m,n] = A[m,k] B[k,n]  <=>  column-major C^T[n,m] = B^T[n,k] A^T[k,m].
        if let Some((nb, sa, sb)) = p.strided {
            // SAFETY: the buffers hold nb (or 1, stride 0) matrices of the planned sizes.
            unsafe {
                cudarc::cublas::result::sgemm_strided_batched(
                    h,
                    op,
                    op,
                    p.n,
                    p.m,
                    kk,
                    &alpha,
                    b as *const f32,
                    p.n,
                    sb,
                    a as *const f32,
                    p.k,
                    sa,
                    &beta,
                    c as *mut f32,
                    p.n,
                    (p.m as i64) * (p.n as i64),
                    nb,
                )
            }
            .map_err(|e| e.to_string())?;
        } else {
            let mn = p.m as usize * p.n as usize;
            for (bi, &(oa, ob)) in p.offsets.iter().enumerate() {
                // SAFETY: offsets index whole matrices inside the operands' buffers.
                unsafe {
                    cudarc::cublas::result::sgemm(
                        h,
                        op,
                        op,
                        p.n,
                        p.m,
                        kk,
                        &alpha,
                        (b as *const f32).add(ob),
                        p.n,
                        (a as *const f32).add(oa),
                        p.k,
                        &beta,
                        (c as *mut f32).add(bi * mn),
                        p.n,
                    )
                }
                .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// A float16/bfloat16 MatMul on tensor cores, cuBLAS GemmEx with f32 accumulation.
    /// float16: A and B (f32 words holding float16 values) are converted to their 16-bit
    /// encoding (exact), C is written as f32 and the node's rounding rounds it. bfloat16: A,
    /// B and C are the nodes' 16-bit buffers (cuBLAS rounds the f32 accumulation once).
    fn half_gemm(
        &self,
        p: &MatMulPlan,
        h: &HalfMm,
        (ia, a): (NodeId, u64),
        (ib, b): (NodeId, u64),
        c: u64,
    ) -> Result<(), String> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        let bf = h.bf as i32;
        for (x, d, id) in [(a, h.a16, ia), (b, h.b16, ib)] {
            if h.bf {
                break;
            }
            let nel = self.graph.node(id).shape.numel() as u64;
            if nel == 0 {
                continue;
            }
            let mut l = self.stream.launch_builder(&h.conv);
            l.arg(&x).arg(&d).arg(&nel).arg(&bf);
            // SAFETY: signature (const u32*, u16*, u64, int); both buffers hold `nel` values.
            unsafe { l.launch(launch_cfg(nel)) }.map_err(|e| format!("to_half_bits: {e}"))?;
        }
        let (a16, b16) = if h.bf { (a, b) } else { (h.a16, h.b16) };
        let hh = *self.blas.handle();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op = cublasOperation_t::CUBLAS_OP_N;
        let ty = if h.bf {
            cudaDataType::CUDA_R_16BF
        } else {
            cudaDataType::CUDA_R_16F
        };
        let kk = if self.drop_last_k && p.k > 1 {
            p.k - 1
        } else {
            p.k
        };
        let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let ct = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let f32t = if h.bf {
            cudaDataType::CUDA_R_16BF
        } else {
            cudaDataType::CUDA_R_32F
        };
        if let Some((nb, sa, sb)) = p.strided {
            // SAFETY: the 16-bit copies hold the operands' values in the planned layout; C
            // holds nb matrices of m x n f32.
            unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    hh,
                    op,
                    op,
                    p.n,
                    p.m,
                    kk,
                    (&alpha as *const f32).cast(),
                    b16 as *const std::ffi::c_void,
                    ty,
                    p.n,
                    sb,
                    a16 as *const std::ffi::c_void,
                    ty,
                    p.k,
                    sa,
                    (&beta as *const f32).cast(),
                    c as *mut std::ffi::c_void,
                    f32t,
                    p.n,
                    (p.m as i64) * (p.n as i64),
                    nb,
                    ct,
                    algo,
                )
            }
            .map_err(|e| e.to_string())?;
        } else {
            let mn = p.m as usize * p.n as usize;
            for (bi, &(oa, ob)) in p.offsets.iter().enumerate() {
                // SAFETY: offsets index whole matrices inside the 16-bit copies and C.
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        hh,
                        op,
                        op,
                        p.n,
                        p.m,
                        kk,
                        (&alpha as *const f32).cast(),
                        (b16 as *const u16).add(ob).cast(),
                        ty,
                        p.n,
                        (a16 as *const u16).add(oa).cast(),
                        ty,
                        p.k,
                        (&beta as *const f32).cast(),
                        if h.bf {
                            (c as *mut u16).add(bi * mn).cast()
                        } else {
                            (c as *mut f32).add(bi * mn).cast()
                        },
                        f32t,
                        p.n,
                        ct,
                        algo,
                    )
                }
                .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Copy `ids`' buffers back to the host (waits for the stream).
    fn read_back(&self, ids: &[NodeId]) -> Result<Vec<Tensor>, CudaError> {
        let g = &self.graph;
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let b = self.buf[id.index()].ok_or_else(|| {
                kernel_err(g, id, "value has neither a host copy nor a device buffer")
            })?;
            let shape = &g.node(id).shape;
            let nel = shape.numel();
            let words = dev_len(shape.dtype, nel);
            let v: Vec<f32> = if nel == 0 {
                vec![]
            } else {
                self.stream
                    .clone_dtoh(&self.buffers[b].slice(0..words))
                    .map_err(|e| kernel_err(g, id, format!("read back: {e}")))?
            };
            let data = match shape.dtype {
                DType::F32 => TensorData::F32(v),
                // Exact: the words hold values of the dtype (NaN payloads kept as `half` does).
                // In parallel: a 78M-value bfloat16 logits tensor took ~80 ms on one thread.
                DType::F16 => {
                    use rayon::prelude::*;
                    TensorData::F16(v.par_iter().map(|&x| half::f16::from_f32(x)).collect())
                }
                // 16-bit storage: two values per word, the first in the low half.
                DType::BF16 => TensorData::BF16(
                    v.iter()
                        .flat_map(|w| {
                            let b = w.to_bits();
                            [b as u16, (b >> 16) as u16]
                        })
                        .take(nel)
                        .map(half::bf16::from_bits)
                        .collect(),
                ),
                DType::I32 => TensorData::I32(v.iter().map(|x| x.to_bits() as i32).collect()),
                DType::U32 => TensorData::U32(v.iter().map(|x| x.to_bits()).collect()),
                DType::Bool => TensorData::Bool(v.iter().map(|x| x.to_bits() != 0).collect()),
                DType::I64 => TensorData::I64(
                    v.chunks_exact(2)
                        .map(|w| (w[0].to_bits() as u64 | (w[1].to_bits() as u64) << 32) as i64)
                        .collect(),
                ),
                d => return Err(kernel_err(g, id, format!("{d} has no device storage"))),
            };
            out.push(
                Tensor::new(shape.dims_usize(), data)
                    .map_err(|e| kernel_err(g, id, e.to_string()))?,
            );
        }
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronizing a read back", e))?;
        Ok(out)
    }
}

/// The bytes of a slice of plain numbers (for uploads).
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a plain number type (f32, i32, u32, i64): no padding, any bytes valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn launch_cfg(n: u64) -> LaunchConfig {
    let threads = 256u32;
    let blocks = n.div_ceil(threads as u64).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What a planned Conv step is, in words (dispatch notes).
fn step_kind(s: &Step) -> &'static str {
    match s {
        Step::CudnnConv { .. } => "cuDNN",
        Step::ConvGemm { im2col: None, .. } => "cuBLAS GEMM (pointwise)",
        Step::ConvGemm { .. } => "im2col + cuBLAS",
        Step::Conv { .. } => "direct conv_f32",
        _ => "other",
    }
}

/// cuDNN plans, its handle, per-node notes, cuDNN's status, and the steps they replaced.
type CudnnPlanning = (
    Vec<crate::cudnn::ConvPlan>,
    Option<crate::cudnn::Handle>,
    Vec<Option<String>>,
    Result<String, String>,
    Vec<(usize, Step)>,
);

/// Move every Conv step (im2col GEMM or direct) that cuDNN can run onto cuDNN; each Conv's
/// note says where it runs and, when not on cuDNN, why. The replaced steps are returned so
/// that a plan failing its trial run goes back to them.
fn plan_cudnn(
    graph: &Graph,
    steps: &mut [Step],
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    tf32: bool,
    module: &mut dyn FnMut() -> Result<Arc<CudaModule>, String>,
) -> Result<CudnnPlanning, CudaError> {
    use crate::cudnn;
    let n = graph.len();
    let mut notes: Vec<Option<String>> = vec![None; n];
    let is_conv = |s: &Step| matches!(s, Step::Conv { .. } | Step::ConvGemm { .. });
    let status = if !steps.iter().any(is_conv) {
        Err("no convolution on the GPU".to_string())
    } else if matches!(
        rlx_ir::env::parse_switch(rlx_ir::env::get("RLX_CUDNN").as_deref()),
        rlx_ir::env::Switch::Off
    ) {
        Err("RLX_CUDNN=0".to_string())
    } else {
        gpu.cudnn()
    };
    let mut handle: Option<Result<cudnn::Handle, String>> = None;
    let mut convs = vec![];
    let mut replaced = vec![];
    for node in &graph.nodes {
        let k = node.id.index();
        if !is_conv(&steps[k]) {
            continue;
        }
        let Op::Conv(a) = &node.op else { continue };
        let r: Result<Step, String> = (|| {
            let lib = status
                .as_ref()
                .map_err(|e| format!("cuDNN not used: {e}"))?;
            let dims = |i: NodeId| graph.node(i).shape.dims_usize();
            let geom = cudnn::conv_geometry(
                &dims(node.inputs[0]),
                &dims(node.inputs[1]),
                &node.shape.dims_usize(),
                a,
            )?;
            let h = handle
                .get_or_insert_with(|| cudnn::Handle::new(stream))
                .as_ref()
                .map_err(|e| format!("{lib}: {e}"))?;
            // bfloat16 without a bias on tensor cores: cuDNN rounds its f32 accumulation once
            // to bfloat16, as the CPU's bfloat16 path rounds the f32 result once (a bias
            // would be a second rounding: those stay on the f32-word path).
            let bf16 = node.shape.dtype == DType::BF16
                && node.inputs.len() == 2
                && node
                    .inputs
                    .iter()
                    .all(|&i| graph.node(i).shape.dtype == DType::BF16)
                && !rlx_ir::env::is_off("RLX_CUDNN_BF16");
            let plan = cudnn::ConvPlan::new(h, &geom, tf32, bf16)?;
            let half = bf16;
            let bias = if node.inputs.len() == 3 {
                let m = geom.y[1] as u64;
                let inner: u64 = geom.y[2..].iter().map(|&d| d as u64).product();
                let f = module()
                    .and_then(|md| {
                        md.load_function("bias_nchw")
                            .map_err(|e| format!("kernel bias_nchw: {e}"))
                    })
                    .map_err(|e| format!("bias kernel: {e}"))?;
                Some((f, inner, m))
            } else {
                None
            };
            notes[k] = Some(format!(
                "cuDNN {}, {} math, workspace {} bytes",
                cudnn::algo_name(plan.algo),
                if half {
                    "bfloat16 tensor-op"
                } else if plan.tensor_op {
                    "TF32 tensor-op"
                } else {
                    "FMA"
                },
                plan.workspace
            ));
            convs.push(plan);
            Ok(Step::CudnnConv {
                plan: convs.len() - 1,
                bias,
                half,
            })
        })();
        match r {
            Ok(st) => replaced.push((k, std::mem::replace(&mut steps[k], st))),
            Err(why) => notes[k] = Some(format!("{} ({why})", step_kind(&steps[k]))),
        }
    }
    let handle = match handle {
        Some(Ok(h)) => Some(h),
        _ => None,
    };
    Ok((convs, handle, notes, status, replaced))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod send_check {
    fn is_send<T: Send>() {}
    #[test]
    fn executor_is_send() {
        is_send::<super::CudaExecutor>();
    }
}
