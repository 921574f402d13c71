//! RLX runtime: pick a [`Device`], compile a [`Graph`] in a [`Session`], run it.
//!
//! ```
//! use rlx_ir::{DType, Graph, Shape};
//! use rlx_runtime::{Device, Session};
//! let mut g = Graph::new("d");
//! let x = g.input("x", Shape::new(&[2, 2], DType::F32));
//! let w = g.param("w", Shape::new(&[2, 2], DType::F32));
//! let y = g.matmul(x, w, Shape::new(&[2, 2], DType::F32));
//! g.set_outputs(vec![y]);
//! let mut s = Session::new(Device::Cpu).compile(g);
//! s.set_param("w", &[1.0, 0.0, 0.0, 1.0]);
//! let out: Vec<Vec<f32>> = s.run(&[("x", &[1.0, 2.0, 3.0, 4.0])]);
//! assert_eq!(out[0], vec![1.0, 2.0, 3.0, 4.0]);
//! ```

use rlx_compile::compiler::{compile, CompileOptions};
use rlx_compile::NumericLint;
use rlx_cpu::CpuError;
use rlx_ir::numeric_check::{DebugMode, DebugScanner, NanReport};
use rlx_ir::{DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

pub mod backend;
pub mod dynamic;
pub mod guards;
pub mod printer;
pub use backend::{Backend, Coverage, Placement};
/// Cross-backend diagnostics (`dist::diagnostics::backend_divergence`).
pub mod dist {
    pub mod diagnostics;
}
pub use dynamic::{DimRange, DynamicModel, GraphSource, OnnxSource};
pub use guards::{GuardDim, InputGuard};
pub mod package;
pub use package::{
    load_any_package, load_dynamic_package, load_package, read_package_source,
    save_dynamic_package, save_package, LoadedPackage, PackageError,
};

/// A device a graph can run on: `Cpu` always, `Wgpu` with the `gpu` feature and an adapter.
/// `Cuda` is reserved for the CUDA backend and never listed by [`available_devices`] until it
/// exists ([`backend::probe`] says why a device is absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Device {
    Cpu,
    Wgpu,
    Cuda,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Wgpu => "wgpu",
            Device::Cuda => "cuda",
        })
    }
}

/// True when `d` can run here. Only `d` is probed (once per process): `Device::Cpu` is answered
/// without probing any GPU, so CPU-only work never loads a Vulkan or CUDA driver.
pub fn device_available(d: Device) -> bool {
    // Only `d` is probed: a broken CUDA install must not touch a wgpu run, nor the reverse.
    d == Device::Cpu || backend::probe(d).is_ok()
}

/// Devices live on this machine. `Device::Cpu` is always first; `Device::Wgpu` follows when
/// the `gpu` feature is on and wgpu finds an adapter (probed once per process and cached;
/// a machine without a Vulkan driver simply has no Wgpu).
pub fn available_devices() -> Vec<Device> {
    static DEVICES: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(backend::live_devices).clone()
}

/// The backend of a compiled graph.
pub(crate) type Exec = Box<dyn Backend>;

/// "device cuda is not available on this machine: <why> (available: cpu, wgpu)".
fn unavailable(d: Device) -> String {
    let why = backend::probe(d)
        .err()
        .unwrap_or_else(|| "it failed to start".into());
    let live: Vec<String> = available_devices().iter().map(|d| d.to_string()).collect();
    format!(
        "device {d} is not available on this machine: {why} (available: {})",
        live.join(", ")
    )
}

/// Errors from compiling or running, naming the input or node.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The device is not live here; the message says why and lists the live ones.
    #[error("{}", unavailable(*.0))]
    DeviceUnavailable(Device),
    #[error(transparent)]
    Compile(#[from] rlx_compile::CompileError),
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// `RLX_DEBUG_NANS=abort` stopped a run on a backend other than the CPU (same report).
    #[error(transparent)]
    NanAbort(rlx_ir::numeric_check::NanAbort),
    #[error("{0}")]
    Input(String),
    /// A node's output would not fit in this machine's memory (bogus dims, a huge `--dim`).
    #[error("{node}: its output {shape} needs {bytes} bytes, more than the memory this process may use ({limit} bytes); check the input dims")]
    TooLarge {
        node: String,
        shape: String,
        bytes: u128,
        limit: u128,
    },
    /// The graph has nothing to compute.
    #[error("the graph has no outputs")]
    NoOutputs,
    /// A non-CPU backend failed (its message names the backend and the node).
    #[error("{0}")]
    Backend(String),
    /// Inputs that do not match the compiled guards (with `RLX_RUNTIME_CHECK_INPUTS=1` or
    /// [`CompiledGraph::set_check_inputs`]): one `rlx input-check: ...` line per problem,
    /// found before any kernel ran (format in [`guards::check_inputs`]).
    #[error("{}", lines.join("\n"))]
    InputCheck { lines: Vec<String> },
    /// A package could not be written or loaded (names the file and entry).
    #[error(transparent)]
    Package(#[from] PackageError),
}

impl RuntimeError {
    /// The NaN/Inf report when `RLX_DEBUG_NANS=abort` stopped the run.
    pub fn as_nan_abort(&self) -> Option<&rlx_ir::numeric_check::NanAbort> {
        match self {
            RuntimeError::Cpu(CpuError::NanAbort(a)) | RuntimeError::NanAbort(a) => Some(a),
            _ => None,
        }
    }
}

/// Compiles graphs for one device.
#[derive(Debug, Clone)]
pub struct Session {
    device: Device,
    options: CompileOptions,
}

impl Session {
    /// A session for `device` with default compile options (lint per `RLX_LINT_NUMERICS`).
    pub fn new(device: Device) -> Session {
        Session {
            device,
            options: CompileOptions::default(),
        }
    }

    /// Replace the compile options.
    pub fn with_options(mut self, options: CompileOptions) -> Session {
        self.options = options;
        self
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Compile `g`; panics with the error message if it fails (see [`Session::try_compile`]).
    pub fn compile(&self, g: Graph) -> CompiledGraph {
        match self.try_compile(g) {
            Ok(c) => c,
            Err(e) => panic!("rlx: compile failed: {e}"),
        }
    }

    /// Compile `g`: verify, lint, fold, decompose, then prepare the device's executor.
    pub fn try_compile(&self, g: Graph) -> Result<CompiledGraph, RuntimeError> {
        self.try_compile_with(g, |g, opts| compile(g.clone(), opts))
    }

    /// [`Session::try_compile`] with the compiler's passes given by `passes` (called with
    /// the graph and this session's options for its device): a dynamic model's symbolic
    /// template gives a graph it compiled once and patched to these sizes.
    pub fn try_compile_with(
        &self,
        g: Graph,
        passes: impl FnOnce(
            &Graph,
            &CompileOptions,
        )
            -> Result<rlx_compile::compiler::Compiled, rlx_compile::CompileError>,
    ) -> Result<CompiledGraph, RuntimeError> {
        if !device_available(self.device) {
            return Err(RuntimeError::DeviceUnavailable(self.device));
        }
        if g.outputs.is_empty() {
            return Err(RuntimeError::NoOutputs);
        }
        check_sizes(&g)?;
        let mut opts = self.options.clone();
        // Only the CPU reads a MatMul's transposed constant operand in place.
        opts.keep_matmul_transposes &= self.device == Device::Cpu;
        let c = passes(&g, &opts)?;
        let source = g;
        let exec = backend::open(self.device, c.graph)?;
        let guards = guards::record_guards(exec.graph(), &source.input_decls, self.device);
        Ok(CompiledGraph::assemble(
            self.device,
            source,
            exec,
            c.lints,
            guards,
        ))
    }
}

/// One node's share of a per-node profile ([`CompiledGraph::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeProfile {
    /// The node in [`CompiledGraph::graph`] (after the compiler's passes).
    pub node: NodeId,
    /// The source op's name in the user's model (ONNX node name, FX name, ...), as NaN
    /// reports name it ([`rlx_ir::provenance::node_label`]); several IR nodes share it when
    /// the importer decomposed one source op.
    pub label: String,
    /// The source op type (ONNX `op_type`) when the importer recorded it, else the IR op.
    pub op: String,
    /// The node's output type, e.g. `f32[1,64,112,112]`.
    pub shape: String,
    /// Mean wall time per run, in microseconds (a fused group's time is on the node that
    /// runs it; see [`rlx_cpu::NodeTimes`]).
    pub mean_us: f64,
}

/// Per-node wall times of the runs made since [`CompiledGraph::set_profiling`].
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Runs averaged.
    pub runs: u64,
    /// Every non-leaf node, in graph (execution) order.
    pub nodes: Vec<NodeProfile>,
}

/// A graph compiled for a device: set parameters, then run.
pub struct CompiledGraph {
    device: Device,
    source: Graph,
    exec: Exec,
    lints: Vec<NumericLint>,
    reports: Vec<NanReport>,
    nan_summary: Option<String>,
    debug_override: Option<DebugMode>,
    print_reports: bool,
    /// One per graph input, recorded when compiling (or read from a package).
    guards: Vec<InputGuard>,
    /// `None`: follow `RLX_RUNTIME_CHECK_INPUTS` at each run.
    check_inputs: Option<bool>,
    /// Parameter values set so far (kept so [`package::save_package`] can write them).
    param_values: BTreeMap<String, Tensor>,
    /// `None`: follow `RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER` at each run.
    value_printer: Option<printer::PrinterConfig>,
    /// Appended to every NaN report of the next runs (`decode step 3, position 12`).
    report_context: Option<String>,
    /// Reports at graph inputs are recorded but not printed ([`CompiledGraph::set_quiet_input_reports`]).
    quiet_input_reports: bool,
}

impl CompiledGraph {
    fn assemble(
        device: Device,
        source: Graph,
        exec: Exec,
        lints: Vec<NumericLint>,
        guards: Vec<InputGuard>,
    ) -> CompiledGraph {
        CompiledGraph {
            device,
            source,
            exec,
            lints,
            reports: vec![],
            nan_summary: None,
            debug_override: None,
            print_reports: true,
            guards,
            check_inputs: None,
            param_values: BTreeMap::new(),
            value_printer: None,
            report_context: None,
            quiet_input_reports: false,
        }
    }

    /// Override `RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER` / `RLX_FILTERED_OPS_TO_PRINT` for this
    /// graph's CPU runs (`None` returns to reading them at each run; `Some(PrinterConfig::off())`
    /// silences the printer whatever the environment says). See [`printer`] for the format.
    pub fn set_value_printer(&mut self, cfg: Option<printer::PrinterConfig>) {
        self.value_printer = cfg;
    }

    /// The input guards recorded when compiling: one per graph input, in input order.
    pub fn guards(&self) -> &[InputGuard] {
        &self.guards
    }

    /// Check every run's inputs against [`CompiledGraph::guards`] before any kernel runs
    /// (`Some(true)`), never (`Some(false)`), or as `RLX_RUNTIME_CHECK_INPUTS` says at each
    /// run (`None`, the default). A failed check is [`RuntimeError::InputCheck`].
    ///
    /// Unchecked runs still refuse a tensor whose dtype or dims differ from the input's
    /// (with a shorter message) and never read out of bounds.
    pub fn set_check_inputs(&mut self, on: Option<bool>) {
        self.check_inputs = on;
    }

    /// Whether the next run checks its inputs against the guards.
    pub fn check_inputs_enabled(&self) -> bool {
        self.check_inputs
            .unwrap_or_else(guards::check_inputs_from_env)
    }

    /// Run the input check when it is on; `device` is where the inputs are resident.
    fn guard_inputs<I: Borrow<Tensor>>(
        &self,
        inputs: &[(&str, I)],
        device: Device,
    ) -> Result<(), RuntimeError> {
        if !self.check_inputs_enabled() {
            return Ok(());
        }
        let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (*n, t.borrow())).collect();
        let lines = guards::check_inputs(&self.guards, &named, device);
        if lines.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::InputCheck { lines })
        }
    }

    /// Time every node of the following runs (`true`, resetting earlier sums) or stop
    /// (`false`, the default). CPU only: on another device this returns
    /// [`RuntimeError::Backend`]. Profiled runs read the clock once per node (tens of
    /// nanoseconds each), so time the model with profiling off and profile separately.
    pub fn set_profiling(&mut self, on: bool) -> Result<(), RuntimeError> {
        self.exec.set_profiling(on)
    }

    /// Measure the device time of the following runs where the backend can (CUDA: CUDA
    /// events around the run's kernels, host-to-device and device-to-host copies left out).
    /// Returns whether this backend measures it.
    pub fn set_device_timing(&mut self, on: bool) -> bool {
        self.exec.set_device_timing(on)
    }

    /// The last run's device time in milliseconds (see [`CompiledGraph::set_device_timing`]).
    pub fn last_device_ms(&self) -> Option<f64> {
        self.exec.last_device_ms()
    }

    /// The per-node times since profiling was turned on: None when it is off or no run
    /// was made since.
    pub fn profile(&self) -> Option<Profile> {
        let t = self.exec.profile().filter(|t| t.runs > 0)?;
        let g = self.exec.graph();
        let nodes = g
            .nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::Constant(_)))
            .map(|n| NodeProfile {
                node: n.id,
                label: rlx_ir::provenance::node_label(g, n.id),
                op: rlx_ir::provenance::source_op_type(g, n.id)
                    .map_or_else(|| n.op.name(), str::to_string),
                shape: n.shape.to_string(),
                mean_us: t.ns[n.id.index()] as f64 / 1e3 / t.runs as f64,
            })
            .collect();
        Some(Profile {
            runs: t.runs,
            nodes,
        })
    }

    /// Override `RLX_DEBUG_NANS` for this graph (`None` returns to reading the variable at
    /// each run). Useful in tests and tools that run several graphs in one process.
    pub fn set_debug_mode(&mut self, mode: Option<DebugMode>) {
        self.debug_override = mode;
    }

    /// Record but do not print NaN reports whose node is a graph input ("the graph input
    /// already holds it"): for a part of a model run in parts, whose inputs carry a value
    /// that an earlier part already reported.
    pub fn set_quiet_input_reports(&mut self, on: bool) {
        self.quiet_input_reports = on;
    }

    /// Tag the NaN reports and printer lines of the following runs with `context`, printed
    /// after the node's label: `rlx nan-check: NaN at ... "model.layers.1.mlp.down_proj"
    /// (decode step 37, position 52)` (also `NanReport::context`), `rlx print: %40 MatMul
    /// "lm_head" (decode step 37, position 52) f32[1, 384] ...`. `None` (the default) adds
    /// nothing. For callers that run one graph many times (a generation loop).
    pub fn set_report_context(&mut self, context: Option<String>) {
        self.report_context = context;
    }

    /// Print NaN/Inf reports to stderr as they are found (default true).
    pub fn set_print_reports(&mut self, on: bool) {
        self.print_reports = on;
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The graph as given to the session (before passes).
    pub fn source_graph(&self) -> &Graph {
        &self.source
    }

    /// The graph the backend runs (after passes).
    pub fn graph(&self) -> &Graph {
        self.exec.graph()
    }

    /// The backend running this graph, named for people (`wgpu (NVIDIA H200, Vulkan)`).
    pub fn backend_name(&self) -> String {
        self.exec.describe()
    }

    /// Where each compute node runs: on the device, or on the CPU and why.
    pub fn placements(&self) -> Vec<(NodeId, Placement)> {
        self.exec.placements()
    }

    /// How many compute nodes run on the compiled device (the rest fall back to the CPU).
    pub fn coverage(&self) -> Coverage {
        self.exec.coverage()
    }

    /// Numeric lints found while compiling.
    pub fn lints(&self) -> &[NumericLint] {
        &self.lints
    }

    /// NaN/Inf reports of the last run (empty unless `RLX_DEBUG_NANS` was on).
    pub fn nan_reports(&self) -> &[NanReport] {
        &self.reports
    }

    /// The last run's summary line about Inf absorbed downstream, if any.
    pub fn nan_summary(&self) -> Option<&str> {
        self.nan_summary.as_deref()
    }

    /// Graph input names and declared types, in order.
    pub fn inputs(&self) -> Vec<(String, Shape)> {
        let g = self.exec.graph();
        g.inputs()
            .into_iter()
            .map(|id| match &g.node(id).op {
                Op::Input { name } => (name.clone(), g.node(id).shape.clone()),
                _ => unreachable!("inputs() returns Input nodes"),
            })
            .collect()
    }

    /// Graph output names and types, in order.
    pub fn outputs(&self) -> Vec<(String, Shape)> {
        let g = self.exec.graph();
        g.outputs
            .iter()
            .enumerate()
            .map(|(k, o)| {
                (
                    g.output_names
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| o.to_string()),
                    g.node(*o).shape.clone(),
                )
            })
            .collect()
    }

    /// Set parameter `name` from f32 values (converted to the parameter's dtype).
    /// Panics with a message naming the parameter on error (see [`CompiledGraph::try_set_param`]).
    pub fn set_param(&mut self, name: &str, values: &[f32]) {
        if let Err(e) = self.set_param_f32(name, values) {
            panic!("rlx: set_param: {e}");
        }
    }

    fn set_param_f32(&mut self, name: &str, values: &[f32]) -> Result<(), RuntimeError> {
        let g = self.exec.graph();
        let id = g
            .params()
            .into_iter()
            .find(|&p| matches!(&g.node(p).op, Op::Param { name: n } if n == name))
            .ok_or_else(|| RuntimeError::Input(format!("no parameter named \"{name}\"")))?;
        let shape = g.node(id).shape.clone();
        let t = f32_tensor(&shape, values)
            .map_err(|m| RuntimeError::Input(format!("parameter \"{name}\": {m}")))?;
        self.try_set_param(name, t)
    }

    /// Set parameter `name` to a typed tensor.
    pub fn try_set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError> {
        self.exec.set_param(name, t.clone())?;
        self.param_values.insert(name.to_string(), t);
        Ok(())
    }

    /// Run with named f32 inputs (converted to each input's dtype); one `Vec<f32>` per graph
    /// output. Panics with a message naming the input or node on error (see [`CompiledGraph::try_run`]).
    pub fn run(&mut self, inputs: &[(&str, &[f32])]) -> Vec<Vec<f32>> {
        match self.try_run(inputs) {
            Ok(o) => o,
            Err(e) => panic!("rlx: run failed: {e}"),
        }
    }

    /// Like [`CompiledGraph::run`], returning errors.
    pub fn try_run(&mut self, inputs: &[(&str, &[f32])]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let decl = self.inputs();
        let mut feeds: Vec<(&str, Tensor)> = Vec::with_capacity(inputs.len());
        for &(name, data) in inputs {
            let Some((_, shape)) = decl.iter().find(|(n, _)| n == name) else {
                return Err(unknown_input(name, &decl));
            };
            let t = f32_tensor(shape, data)
                .map_err(|m| RuntimeError::Input(format!("input \"{name}\": {m}")))?;
            feeds.push((name, t));
        }
        let out = self.run_tensors(feeds)?;
        Ok(out.iter().map(|t| t.data().to_f32_vec()).collect())
    }

    /// Run with named typed tensors; returns one tensor per graph output.
    ///
    /// Errors: a missing, unknown or duplicate input name; a tensor whose dtype or dims do not
    /// match the input's; a kernel error naming the node; `RLX_DEBUG_NANS=abort` stopping the run.
    pub fn run_tensors(
        &mut self,
        inputs: Vec<(&str, Tensor)>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_tensors_on(inputs, self.device)
    }

    /// [`CompiledGraph::run_tensors`] with inputs declared resident on `device`.
    ///
    /// `run_tensors` takes host tensors that the runtime moves to the compiled device, so
    /// their device never mismatches; here the caller states where the inputs live (a host
    /// tensor is on [`Device::Cpu`]), and the input check (when on) fails with
    /// `unmatched device type, expected: <compiled type>, but got: <device's type>` when the
    /// types differ. With the check off, the tensors are used as the host data they are.
    pub fn run_tensors_on(
        &mut self,
        inputs: Vec<(&str, Tensor)>,
        device: Device,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_fed(inputs, device)
    }

    /// [`CompiledGraph::run_tensors`] on borrowed tensors: the caller keeps them, and the run
    /// neither copies nor frees them (on the CPU the kernels read them in place, as
    /// onnxruntime reads a NumPy input; the wgpu backend uploads them). For repeated runs
    /// on the same inputs (`rlx bench`) and inputs too large to clone per run. Errors as
    /// `run_tensors`.
    pub fn run_tensor_refs(
        &mut self,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_fed(inputs.to_vec(), self.device)
    }

    /// The body of [`CompiledGraph::run_tensors_on`] and [`CompiledGraph::run_tensor_refs`],
    /// for owned or borrowed inputs.
    fn run_fed<I: Borrow<Tensor> + Sync>(
        &mut self,
        inputs: Vec<(&str, I)>,
        device: Device,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.guard_inputs(&inputs, device)?;
        let ordered = self.order_inputs(inputs)?;
        let mode = self.debug_override.unwrap_or_else(|| {
            let m = DebugMode::from_env(); // read once per run
                                           // Legacy switch of the wgpu backend: RLX_WGPU_NAN_TRACE=1 is RLX_DEBUG_NANS=1.
            if !m.is_on() && self.device == Device::Wgpu && rlx_ir::env::is_on("RLX_WGPU_NAN_TRACE")
            {
                DebugMode::Warn
            } else {
                m
            }
        });
        let pcfg = (self.value_printer.clone())
            .unwrap_or_else(printer::PrinterConfig::from_env)
            .with_context(self.report_context.clone());
        self.reports.clear();
        self.nan_summary = None;
        if mode.is_on() {
            let mut sc = DebugScanner::new(mode, &self.device.to_string());
            sc.set_print(self.print_reports);
            sc.set_context(self.report_context.clone());
            sc.set_quiet_inputs(self.quiet_input_reports);
            let r = Self::run_exec(&mut self.exec, &ordered, Some(&mut sc), &pcfg);
            self.reports = sc.reports().to_vec();
            self.nan_summary = sc.summary().map(str::to_string);
            r
        } else {
            Self::run_exec(&mut self.exec, &ordered, None, &pcfg)
        }
    }

    /// One run on the backend.
    fn run_exec<I: Borrow<Tensor> + Sync>(
        exec: &mut Exec,
        ordered: &[I],
        sc: Option<&mut DebugScanner>,
        pcfg: &printer::PrinterConfig,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let refs: Vec<&Tensor> = ordered.iter().map(|t| t.borrow()).collect();
        exec.run(&refs, sc, pcfg)
    }

    /// Run with a callback after every node (for value printers and traces).
    pub fn run_observed(
        &mut self,
        inputs: Vec<(&str, Tensor)>,
        observe: &mut dyn FnMut(&Graph, NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.guard_inputs(&inputs, self.device)?;
        let ordered = self.order_inputs(inputs)?;
        let g = self.exec.graph().clone();
        let refs: Vec<&Tensor> = ordered.iter().collect();
        self.exec
            .run_observed(&refs, &mut |id: NodeId, t: &Tensor| observe(&g, id, t))
    }

    /// [`CompiledGraph::run_tensor_refs`] that also calls `observe(graph, node, value)` for
    /// every node in topological order (graph inputs, parameters, constants and computed
    /// ops), as [`CompiledGraph::run_observed`], while the NaN scan (`RLX_DEBUG_NANS` or
    /// [`CompiledGraph::set_debug_mode`]), the value printer and the report context work as
    /// in a plain run: `rlx generate --trace` records one step of a generation this way.
    ///
    /// The run is never fused (every node's value is handed out). Printer lines come after
    /// the run's nodes have run, level 3's `running` line included. An abort
    /// (`RLX_DEBUG_NANS=abort`) is returned after the run, with the values observed up to
    /// the end of the graph.
    ///
    /// Errors: as `run_tensors`.
    pub fn run_tensor_refs_observed(
        &mut self,
        inputs: &[(&str, &Tensor)],
        observe: &mut dyn FnMut(&Graph, NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, RuntimeError> {
        use std::io::Write as _;
        self.guard_inputs(inputs, self.device)?;
        let ordered = self.order_inputs(inputs.to_vec())?;
        let mode = self.debug_override.unwrap_or_else(DebugMode::from_env);
        let pcfg = (self.value_printer.clone())
            .unwrap_or_else(printer::PrinterConfig::from_env)
            .with_context(self.report_context.clone());
        self.reports.clear();
        self.nan_summary = None;
        let g = self.exec.graph().clone();
        let mut sc = mode.is_on().then(|| {
            let mut sc = DebugScanner::new(mode, &self.device.to_string());
            sc.set_print(self.print_reports);
            sc.set_context(self.report_context.clone());
            sc.set_quiet_inputs(self.quiet_input_reports);
            sc.begin_run(&g);
            sc
        });
        let mut abort: Option<rlx_ir::numeric_check::NanAbort> = None;
        let mut printed = 0usize;
        let r = self
            .exec
            .run_observed(&ordered, &mut |id: NodeId, t: &Tensor| {
                observe(&g, id, t);
                if let Some(l) = pcfg.line_after(&g, id, t) {
                    let mut e = std::io::stderr().lock();
                    if let Some(b) = pcfg.line_before(&g, id) {
                        let _ = writeln!(e, "{b}");
                    }
                    printed += 1;
                    let _ = writeln!(e, "{l}");
                }
                if let (Some(sc), None) = (sc.as_mut(), &abort) {
                    if let Err(a) = sc.scan_node(&g, id, t.data()) {
                        abort = Some(a);
                    }
                }
            });
        if pcfg.is_on() && printed == 0 && r.is_ok() {
            eprintln!(
                "rlx: note: {} matched no op",
                printer::RLX_FILTERED_OPS_TO_PRINT
            );
        }
        if let Some(mut sc) = sc {
            if abort.is_none() && r.is_ok() {
                if let Err(a) = sc.finish_run(&g) {
                    abort = Some(a);
                }
            }
            self.reports = sc.reports().to_vec();
            self.nan_summary = sc.summary().map(str::to_string);
        }
        let out = r?;
        match abort {
            Some(a) => Err(RuntimeError::NanAbort(a)),
            None => Ok(out),
        }
    }

    fn order_inputs<I>(&self, inputs: Vec<(&str, I)>) -> Result<Vec<I>, RuntimeError> {
        let decl = self.inputs();
        let mut slots: Vec<Option<I>> = (0..decl.len()).map(|_| None).collect();
        for (name, t) in inputs {
            let Some(k) = decl.iter().position(|(n, _)| n == name) else {
                return Err(unknown_input(name, &decl));
            };
            if slots[k].is_some() {
                return Err(RuntimeError::Input(format!("input \"{name}\" given twice")));
            }
            slots[k] = Some(t);
        }
        slots
            .into_iter()
            .enumerate()
            .map(|(k, s)| {
                s.ok_or_else(|| {
                    RuntimeError::Input(format!(
                        "missing input \"{}\" (expected {})",
                        decl[k].0, decl[k].1
                    ))
                })
            })
            .collect()
    }
}

/// The memory this process may use, in bytes: the smallest of physical memory
/// (`/proc/meminfo` MemTotal), the cgroup limit (`/sys/fs/cgroup/memory.max`) and the
/// address-space rlimit (`ulimit -v`, from `/proc/self/limits`); 64 GiB where none is known.
fn memory_limit() -> u128 {
    let mut limit: Option<u128> = None;
    let mut take = |v: Option<u128>| {
        if let Some(v) = v {
            limit = Some(limit.map_or(v, |l| l.min(v)));
        }
    };
    take(std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|k| k.parse::<u128>().ok())
            })
            .map(|kib| kib * 1024)
    }));
    take(
        std::fs::read_to_string("/sys/fs/cgroup/memory.max")
            .ok()
            .and_then(|s| s.trim().parse::<u128>().ok()),
    );
    take(
        std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("Max address space"))
                    .and_then(|l| {
                        l.split_whitespace()
                            .nth(3)
                            .and_then(|v| v.parse::<u128>().ok())
                    })
            }),
    );
    limit.unwrap_or(64 << 30)
}

/// Refuse a graph with a tensor bigger than the memory this process may use, before anything
/// allocates (`RuntimeError::TooLarge`, naming the node and its shape). Compiling calls it;
/// tools that build input tensors from a graph's shapes call it first.
pub fn check_sizes(g: &Graph) -> Result<(), RuntimeError> {
    // Read the limit once (three small files), not per node.
    let limit = memory_limit();
    for n in &g.nodes {
        check_size_within(&n.shape, limit, || {
            format!(
                "{} {} \"{}\"",
                n.id,
                n.op.name(),
                rlx_ir::provenance::node_label(g, n.id)
            )
        })?;
    }
    Ok(())
}

/// [`check_sizes`] for one input about to be generated or read: `input "name"` needing more
/// memory than this process may use is [`RuntimeError::TooLarge`].
pub fn check_input_size(name: &str, shape: &Shape) -> Result<(), RuntimeError> {
    check_size_within(shape, memory_limit(), || format!("input \"{name}\""))
}

fn check_size_within(
    shape: &Shape,
    limit: u128,
    what: impl FnOnce() -> String,
) -> Result<(), RuntimeError> {
    let bytes = shape
        .dims_usize()
        .iter()
        .fold(shape.dtype.size_bytes() as u128, |a, &d| {
            a.saturating_mul(d as u128)
        });
    if bytes > limit {
        return Err(RuntimeError::TooLarge {
            node: what(),
            shape: shape.to_string(),
            bytes,
            limit,
        });
    }
    Ok(())
}

fn unknown_input(name: &str, decl: &[(String, Shape)]) -> RuntimeError {
    let names: Vec<&str> = decl.iter().map(|d| d.0.as_str()).collect();
    RuntimeError::Input(format!(
        "unknown input \"{name}\" (the graph's inputs: {})",
        names.join(", ")
    ))
}

/// An f32 slice as a tensor of `shape` (converted to its dtype).
fn f32_tensor(shape: &Shape, values: &[f32]) -> Result<Tensor, String> {
    let dims = shape.dims_usize();
    let n: usize = dims.iter().product();
    if n != values.len() {
        return Err(format!(
            "expected {n} elements for {shape}, got {}",
            values.len()
        ));
    }
    let data = match shape.dtype {
        DType::F32 => TensorData::F32(values.to_vec()),
        dt => TensorData::from_f64(dt, &values.iter().map(|&x| x as f64).collect::<Vec<_>>()),
    };
    Tensor::new(dims, data).map_err(|e| e.to_string())
}
