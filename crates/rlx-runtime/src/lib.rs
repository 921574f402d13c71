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
use rlx_cpu::{CpuError, CpuExecutor};
use rlx_ir::numeric_check::{DebugMode, DebugScanner, NanReport};
use rlx_ir::{DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use std::fmt;

/// A device a graph can run on. Only `Cpu` has a backend today; the others are reserved
/// for the wgpu and CUDA backends and are never listed by [`available_devices`] until then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// Devices live on this machine. `Device::Cpu` is always first.
pub fn available_devices() -> Vec<Device> {
    vec![Device::Cpu]
}

/// Errors from compiling or running, naming the input or node.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("device {0} is not available on this machine (available: cpu)")]
    DeviceUnavailable(Device),
    #[error(transparent)]
    Compile(#[from] rlx_compile::CompileError),
    #[error(transparent)]
    Cpu(#[from] CpuError),
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
}

impl RuntimeError {
    /// The NaN/Inf report when `RLX_DEBUG_NANS=abort` stopped the run.
    pub fn as_nan_abort(&self) -> Option<&rlx_ir::numeric_check::NanAbort> {
        match self {
            RuntimeError::Cpu(CpuError::NanAbort(a)) => Some(a),
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
        if self.device != Device::Cpu {
            return Err(RuntimeError::DeviceUnavailable(self.device));
        }
        if g.outputs.is_empty() {
            return Err(RuntimeError::NoOutputs);
        }
        check_sizes(&g)?;
        let source = g.clone();
        let c = compile(g, &self.options)?;
        let exec = CpuExecutor::new(c.graph)?;
        Ok(CompiledGraph {
            device: self.device,
            source,
            exec,
            lints: c.lints,
            reports: vec![],
            nan_summary: None,
            debug_override: None,
            print_reports: true,
        })
    }
}

/// A graph compiled for a device: set parameters, then run.
pub struct CompiledGraph {
    device: Device,
    source: Graph,
    exec: CpuExecutor,
    lints: Vec<NumericLint>,
    reports: Vec<NanReport>,
    nan_summary: Option<String>,
    debug_override: Option<DebugMode>,
    print_reports: bool,
}

impl CompiledGraph {
    /// Override `RLX_DEBUG_NANS` for this graph (`None` returns to reading the variable at
    /// each run). Useful in tests and tools that run several graphs in one process.
    pub fn set_debug_mode(&mut self, mode: Option<DebugMode>) {
        self.debug_override = mode;
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
        Ok(self.exec.set_param(name, t)?)
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
        let ordered = self.order_inputs(inputs)?;
        let mode = self.debug_override.unwrap_or_else(DebugMode::from_env); // read once per run
        self.reports.clear();
        self.nan_summary = None;
        if mode.is_on() {
            let mut sc = DebugScanner::new(mode, "cpu");
            sc.set_print(self.print_reports);
            let r = self.exec.run(&ordered, Some(&mut sc));
            self.reports = sc.reports().to_vec();
            self.nan_summary = sc.summary().map(str::to_string);
            Ok(r?)
        } else {
            Ok(self.exec.run(&ordered, None)?)
        }
    }

    /// Run with a callback after every node (for value printers and traces).
    pub fn run_observed(
        &mut self,
        inputs: Vec<(&str, Tensor)>,
        observe: &mut dyn FnMut(&Graph, NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let ordered = self.order_inputs(inputs)?;
        let g = self.exec.graph().clone();
        let mut f = |id: NodeId, t: &Tensor| observe(&g, id, t);
        Ok(self.exec.run_observed(&ordered, None, &mut f)?)
    }

    fn order_inputs(&self, inputs: Vec<(&str, Tensor)>) -> Result<Vec<Tensor>, RuntimeError> {
        let decl = self.inputs();
        let mut slots: Vec<Option<Tensor>> = vec![None; decl.len()];
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

/// Refuse a graph with a tensor bigger than the machine's memory before anything allocates.
fn check_sizes(g: &Graph) -> Result<(), RuntimeError> {
    let limit = memory_limit();
    for n in &g.nodes {
        let bytes = n
            .shape
            .dims_usize()
            .iter()
            .fold(n.shape.dtype.size_bytes() as u128, |a, &d| {
                a.saturating_mul(d as u128)
            });
        if bytes > limit {
            return Err(RuntimeError::TooLarge {
                node: format!(
                    "{} {} \"{}\"",
                    n.id,
                    n.op.name(),
                    rlx_ir::provenance::node_label(g, n.id)
                ),
                shape: n.shape.to_string(),
                bytes,
                limit,
            });
        }
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
