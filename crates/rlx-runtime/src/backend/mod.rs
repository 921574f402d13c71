//! The backend trait: what a device must provide for RLX to run, scan, print, profile and
//! compare a compiled graph on it, and the one place that knows which backends exist.
//!
//! [`Session`](crate::Session), packages, guards, the value printer, `diverge` and `bench` go
//! through [`Backend`] and [`open`] only; no other code names a backend's executor type.
//! Each backend lives in a module of this one (`cpu`, `wgpu`, `cuda`) and has a stand-in compiled when
//! its cargo feature is off (its [`probe`] says why it is absent, and [`open`] returns
//! [`RuntimeError::DeviceUnavailable`]), so every feature combination builds.
//! docs/DESIGN.md, "How to add a backend", is the checklist.

use crate::printer::PrinterConfig;
use crate::{Device, RuntimeError};
use rlx_ir::numeric_check::DebugScanner;
use rlx_ir::{DType, Graph, NodeId, Op, Tensor};

mod cpu;
mod cuda;
mod wgpu;

/// Where one node of a compiled graph runs on a backend.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// A kernel of the backend's own device.
    Device,
    /// Computed by the CPU kernels on values moved to the host; `reason` says why.
    CpuFallback { reason: String },
}

/// How much of a compiled graph a backend runs on its own device.
///
/// Counts are over the compute nodes (every node but inputs, parameters and constants).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Coverage {
    /// Compute nodes run by the backend's own kernels.
    pub on_device: usize,
    /// All compute nodes of the graph.
    pub total: usize,
}

impl Coverage {
    /// Everything on the device (the CPU backend, for instance).
    pub fn all(g: &Graph) -> Coverage {
        let total = compute_nodes(g).count();
        Coverage {
            on_device: total,
            total,
        }
    }

    /// Counted from per-node placements.
    pub fn from_placements(g: &Graph, p: &[(NodeId, Placement)]) -> Coverage {
        Coverage {
            on_device: p.iter().filter(|(_, p)| *p == Placement::Device).count(),
            total: compute_nodes(g).count(),
        }
    }

    /// Compute nodes that fell back to the CPU.
    pub fn on_cpu(&self) -> usize {
        self.total - self.on_device
    }
}

/// Nodes that compute (neither an input, a parameter nor a constant).
pub(crate) fn compute_nodes(g: &Graph) -> impl Iterator<Item = &rlx_ir::Node> {
    g.nodes
        .iter()
        .filter(|n| !matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::Constant(_)))
}

/// A compiled graph prepared for one device.
///
/// Inputs are host tensors in [`Graph::inputs`] order; outputs come back as host tensors in
/// `graph.outputs` order. Every method reports errors as [`RuntimeError`], naming the node,
/// input or parameter, so callers handle every backend alike.
pub trait Backend: Send {
    /// The device this backend runs on.
    fn device(&self) -> Device;

    /// A name for people: `cpu`, `wgpu (NVIDIA H200, Vulkan)`.
    fn describe(&self) -> String;

    /// The graph the backend runs (after the compiler's passes).
    fn graph(&self) -> &Graph;

    /// Set the parameter named `name` (the tensor has the parameter's dtype and dims).
    fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError>;

    /// One run. With `scanner` on, every node's value is scanned for NaN/Inf in topological
    /// order (abort mode ends the run with the report); with `printer` on, every node's
    /// statistics are printed as [`crate::printer`] describes.
    fn run(
        &mut self,
        inputs: &[&Tensor],
        scanner: Option<&mut DebugScanner>,
        printer: &PrinterConfig,
    ) -> Result<Vec<Tensor>, RuntimeError>;

    /// One run that returns every node's value (index = node index; leaves included, `None`
    /// for a value the backend does not keep): the replay of `rlx diverge` and `rlx trace`.
    fn run_all(&mut self, inputs: &[&Tensor]) -> Result<Vec<Option<Tensor>>, RuntimeError>;

    /// One run calling `observe(node, value)` for every node in topological order. The
    /// default reads every value back after the run ([`Backend::run_all`]).
    fn run_observed(
        &mut self,
        inputs: &[&Tensor],
        observe: &mut dyn FnMut(NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let all = self.run_all(inputs)?;
        for (k, t) in all.iter().enumerate() {
            if let Some(t) = t {
                observe(NodeId(k as u32), t);
            }
        }
        outputs_of(self.graph(), &all)
    }

    /// Where each compute node runs, in topological order.
    fn placements(&self) -> Vec<(NodeId, Placement)>;

    /// How many compute nodes run on the device (from [`Backend::placements`]).
    fn coverage(&self) -> Coverage {
        Coverage::from_placements(self.graph(), &self.placements())
    }

    /// Element types the device's own kernels compute in; nodes of other dtypes fall back.
    fn dtypes(&self) -> &'static [DType];

    /// Time every node of the following runs (`true`) or stop. Backends without per-node
    /// timing return [`RuntimeError::Backend`] naming themselves.
    fn set_profiling(&mut self, on: bool) -> Result<(), RuntimeError> {
        let _ = on;
        Err(RuntimeError::Backend(format!(
            "{}: per-node profiling runs on the CPU, CUDA and wgpu backends",
            self.device()
        )))
    }

    /// Per-node times since profiling was turned on (`None` when off or unsupported).
    fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
        None
    }

    /// Measure the device time of the following runs (GPU backends that can: the run's
    /// kernels alone, host transfers left out). Returns whether the backend measures it.
    fn set_device_timing(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// The last run's device time in milliseconds, when [`Backend::set_device_timing`] is on
    /// and the backend measures it.
    fn last_device_ms(&self) -> Option<f64> {
        None
    }
}

/// The outputs of `g` picked from every node's value.
pub(crate) fn outputs_of(g: &Graph, all: &[Option<Tensor>]) -> Result<Vec<Tensor>, RuntimeError> {
    g.outputs
        .iter()
        .map(|o| {
            all[o.index()].clone().ok_or_else(|| {
                RuntimeError::Backend(format!("output {o} was not read back from the device"))
            })
        })
        .collect()
}

/// A run through [`Backend::run_all`] that then scans and prints in topological order: the
/// scanner and printer of a backend that keeps values on its device. The printer's level-3
/// "running" lines come before each node's statistics, after the run (the device ran the
/// whole graph at once; a crash inside it is named by the backend's own error).
#[cfg_attr(not(any(feature = "gpu", feature = "cuda")), allow(dead_code))]
pub(crate) fn run_all_then_report(
    b: &mut dyn Backend,
    inputs: &[&Tensor],
    scanner: Option<&mut DebugScanner>,
    printer: &PrinterConfig,
) -> Result<Vec<Tensor>, RuntimeError> {
    let all = b.run_all(inputs)?;
    report_all(b.graph(), &all, scanner, printer, false)
}

/// Print (per `printer`; its level-3 "running" lines unless `ran_lines_printed`) and scan
/// every node's value `all` of a finished run, in topological order; returns the outputs.
#[cfg_attr(not(any(feature = "gpu", feature = "cuda")), allow(dead_code))]
pub(crate) fn report_all(
    g: &Graph,
    all: &[Option<Tensor>],
    scanner: Option<&mut DebugScanner>,
    printer: &PrinterConfig,
    ran_lines_printed: bool,
) -> Result<Vec<Tensor>, RuntimeError> {
    crate::printer::print_values(g, all, printer, !ran_lines_printed);
    if let Some(sc) = scanner.filter(|s| s.is_on()) {
        sc.begin_run(g);
        for n in &g.nodes {
            if let Some(t) = &all[n.id.index()] {
                sc.scan_node(g, n.id, t.data())
                    .map_err(RuntimeError::NanAbort)?;
            }
        }
        sc.finish_run(g).map_err(RuntimeError::NanAbort)?;
    }
    outputs_of(g, all)
}

/// Every backend this build knows, in the order [`crate::available_devices`] lists them.
const DEVICES: [Device; 3] = [Device::Cpu, Device::Wgpu, Device::Cuda];

/// Whether `device` can run here: `Ok(description)` (`NVIDIA H200 (Vulkan)`), or `Err` saying
/// why not (no adapter, built without the feature, no backend yet). Probed once per process.
pub fn probe(device: Device) -> Result<String, String> {
    match device {
        Device::Cpu => Ok(cpu::describe()),
        Device::Wgpu => wgpu::probe(),
        Device::Cuda => cuda::probe(),
    }
}

/// Live devices, CPU first (each probed once per process and cached).
pub(crate) fn live_devices() -> Vec<Device> {
    DEVICES.into_iter().filter(|d| probe(*d).is_ok()).collect()
}

/// Prepare `g` (already compiled) for `device`.
///
/// Errors: [`RuntimeError::DeviceUnavailable`] when the device is not live here, else the
/// backend's own error naming the node it could not prepare.
pub fn open(device: Device, g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
    match device {
        Device::Cpu => cpu::open(g),
        Device::Wgpu => wgpu::open(g),
        Device::Cuda => cuda::open(g),
    }
}
