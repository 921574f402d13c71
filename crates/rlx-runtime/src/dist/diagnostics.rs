//! Cross-backend divergence: tell bounded f32 round-off from a kernel bug.
//!
//! The same graph gives slightly different results on different backends. RLX runs it on the
//! CPU backend (the oracle) and on every other backend live on this machine, and classifies
//! each backend's gap:
//!
//! - **Outputs** (the contract of `docs/DESIGN.md`): per backend, `max_abs = max |b − cpu|`,
//!   `max_rel = max |b − cpu| / (|cpu| + 1e-6)` over every finite element of every output,
//!   `worst_output` (the output that carried `max_rel`) and `suspect`.
//! - **ULPs** of the output dtype, since a relative error means little near zero.
//! - **Non-finite mismatches** (NaN or Inf on one side, a finite value or another kind of
//!   non-finite on the other) are a divergence of their own kind, reported by name ("cpu NaN,
//!   wgpu 0 at %17 Relu: the wgpu backend dropped a NaN") and never folded into `max_rel`.
//!   Both sides NaN, or both the same infinity, count as agreement.
//! - **Localization**: when a backend is suspect, every node of the compiled graph is read
//!   back on both backends and compared in topological order. A node whose values differ is
//!   replayed: its op runs on the CPU with the other backend's own inputs. The first node whose
//!   kernel still differs on the same inputs is named ("kernel bug candidate"), with the input
//!   and output errors side by side; a node that merely carries a difference from its inputs
//!   (Erf or Sub can make a small one large) is passed over. Intermediate values use a
//!   scale-aware relative error, `|b − cpu| / (|cpu| + max(1e-6, 1e-3 · max|cpu|))`, so a
//!   value that is near zero only by cancellation does not pose as the culprit.
//!
//! `suspect`: the seed contract is `max_rel > tol_rel`. Measured on lavapipe, that alone
//! calls plain round-off a bug: Qwen3-tiny's logits differ by at most 2.4e-7, but one logit
//! is 1.5e-5 on the CPU, so `max_rel` is 1.5e-2. So `max_rel > tol_rel` is the cheap first
//! check, and when it trips, localization decides: a node whose kernel differs from the
//! CPU's on the same inputs (a kernel bug candidate) keeps the backend suspect; when none does,
//! the gap is accumulated round-off amplified near zero, `suspect` is false and
//! `amplified_near_zero` says why. With localization off, `suspect = max_rel > tol_rel`.
//! Any non-finite mismatch or integer/bool mismatch in an output is always suspect.
//!
//! Tolerance: about `2e-3` for f32 forward graphs. CPU reductions accumulate in f64, GPU
//! ones in f32, so a long reduction legitimately differs by a few ULPs times its length.
//! (One file over 1,000 lines: the divergence report, its localization by replay and its
//! tests form one contract (`rlx diverge`, `--html`, the Python binding read it); the tests are
//! about half of it.)

use crate::backend::Backend;
use crate::printer::PrinterConfig;
use crate::{available_devices, Device, RuntimeError};
use rlx_compile::compiler::{compile, CompileOptions};
use rlx_cpu::CpuExecutor;
use rlx_ir::provenance::{node_iteration, node_label, quoted_label, source_op_type};
use rlx_ir::{DType, Graph, NodeId, Op, Tensor};
use serde::Serialize;
use std::fmt;

/// Floor of the output relative error, as in the contract: `|b − cpu| / (|cpu| + 1e-6)`.
pub const REL_FLOOR: f64 = 1e-6;
/// Scale factor of the intermediate-value floor: `max(1e-6, NODE_SCALE · max|cpu|)`.
pub const NODE_SCALE: f64 = 1e-3;

/// The tolerance for values of dtype `dt`: `tol_rel`, raised for the narrow floats to 8 unit
/// roundoffs of the dtype (float16: 8·2^-11 = 3.9e-3, bfloat16: 8·2^-8 = 3.1e-2), since two
/// correct kernels that accumulate in f32 in different orders can round one op's result to
/// neighbouring values (1 ulp = 2 unit roundoffs), and an op reads inputs that already differ
/// by that much. f32 and wider keep `tol_rel`.
pub fn dtype_tol(dt: DType, tol_rel: f64) -> f64 {
    let u = match dt {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F8E4M3FN | DType::F8E4M3FNUZ => 2f64.powi(-4),
        DType::F8E5M2 | DType::F8E5M2FNUZ => 2f64.powi(-3),
        _ => 0.0,
    };
    tol_rel.max(8.0 * u)
}

/// One backend's divergence from the CPU oracle for one run of a graph.
#[derive(Clone, Debug, Serialize)]
pub struct BackendDivergence {
    /// The backend compared with the CPU.
    pub device: Device,
    /// Compute nodes that ran on `device`'s own kernels (the rest fell back to the CPU).
    pub nodes_on_device: usize,
    /// Compute nodes of the compiled graph.
    pub nodes_total: usize,
    /// False when no node ran on `device` (everything fell back to the CPU): its outputs are
    /// the CPU's own, so there is nothing to judge; `suspect` is false and no verdict is given.
    pub compared: bool,
    /// `"round-off"`, `"suspect"` or `"not compared"`.
    pub verdict: String,
    /// Largest `|backend − cpu|` over every finite output element.
    pub max_abs: f64,
    /// Largest `|backend − cpu| / (|cpu| + 1e-6)` over every finite output element.
    pub max_rel: f64,
    /// Index of the graph output that carried `max_rel`.
    pub worst_output: usize,
    /// Name of that output (`Graph::output_names`, else `%id`).
    pub worst_output_name: String,
    /// Largest distance in units in the last place of the output dtype (float outputs only).
    pub max_ulps: u64,
    /// Element of `worst_output` (flat index) where `max_rel` was reached.
    pub worst_index: usize,
    /// The CPU's and the backend's value at that element.
    pub worst_values: (f64, f64),
    /// Output elements where one side is NaN/Inf and the other is not the same value.
    pub nonfinite: Vec<NonFiniteMismatch>,
    /// Integer/bool output elements that differ.
    pub int_mismatches: usize,
    /// The backend looks wrong: a kernel bug candidate was localized (or, without
    /// localization, `max_rel > tol_rel`), or an output has a non-finite or integer mismatch.
    pub suspect: bool,
    /// `max_rel > tol_rel`, but no single node exceeds the tolerance on its own: round-off
    /// accumulated and amplified at an output element near zero (not suspect).
    pub amplified_near_zero: bool,
    /// The tolerance it was judged against: the requested `tol_rel`, or for a float16/bfloat16
    /// worst output the dtype's ([`dtype_tol`]).
    pub tol_rel: f64,
    /// When suspect: where the divergence starts (see [`Localization`]).
    pub localization: Option<Localization>,
    /// Every compute node in execution order with its difference from the CPU, when
    /// [`DivergenceOptions::node_errors`] asked for it and the backend was compared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeDiff>,
}

/// One compute node's difference between a backend and the CPU (see
/// [`DivergenceOptions::node_errors`]).
#[derive(Clone, Debug, Serialize)]
pub struct NodeDiff {
    /// `%id` of the node in the compiled graph.
    pub node: String,
    /// Its op (`MatMul`, ...).
    pub op: String,
    /// Its label (the source model's name for the op).
    pub label: String,
    /// The source op type when the node is a step of a decomposed op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_op: Option<String>,
    /// The loop iterations the node was unrolled in, outermost first (empty outside loops;
    /// [`rlx_ir::Origin::iteration`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub iteration: Vec<rlx_ir::LoopIteration>,
    /// The node's dtype.
    pub dtype: String,
    /// The tolerance its values are judged against ([`dtype_tol`]).
    pub tol: f64,
    /// Ran on the backend's own kernels (false: a CPU fallback).
    pub on_device: bool,
    /// Accumulated: the node's value in the backend's full run against the CPU's full run
    /// (scale-aware relative error). `None` when either run kept no value for it.
    pub accumulated: Option<NodeError>,
    /// Own: the backend's value against the node's op replayed on the CPU with the backend's
    /// own inputs (the node's kernel alone). `None` when it could not be replayed.
    pub own: Option<NodeError>,
}

/// A NaN/Inf on one side and something else on the other.
#[derive(Clone, Debug, Serialize)]
pub struct NonFiniteMismatch {
    /// Output index (for output mismatches) or `None` for a node mismatch.
    pub output: Option<usize>,
    /// `%id` of the node holding the value.
    pub node: String,
    /// The output's name (`Graph::output_names`, else `%id`) for an output mismatch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_name: Option<String>,
    /// Flat element index.
    pub index: usize,
    /// The CPU value, as text (`NaN`, `inf`, `-inf`, or the number).
    pub cpu: String,
    /// The other backend's value, as text.
    pub other: String,
    /// What happened, in words ("the wgpu backend dropped a NaN").
    pub what: String,
}

/// How one node's value compares between the two backends.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeError {
    /// Scale-aware relative error (see the module docs); `inf` for integer mismatches.
    pub rel: f64,
    /// Largest absolute error over finite elements.
    pub abs: f64,
    /// Largest ULP distance in the node's dtype.
    pub ulps: u64,
    /// Flat index of the worst element.
    pub index: usize,
    /// First non-finite mismatch, if any.
    pub nonfinite: Option<NonFiniteMismatch>,
}

/// The first node where two backends part ways.
#[derive(Clone, Debug, Serialize)]
pub struct Localization {
    /// `%id` of the node.
    pub node: String,
    /// Its op (`MatMul`, `Reduce(sum)`, ...).
    pub op: String,
    /// Its label (the source model's name for the op).
    pub label: String,
    /// The source op type when the node is a step of a decomposed op (`Softmax`).
    pub source_op: Option<String>,
    /// Largest error over the node's inputs (scale-aware relative).
    pub inputs_rel: f64,
    /// The node's own error.
    pub error: NodeError,
    /// `kernel_bug_candidate` (inputs within tolerance, output beyond it),
    /// `nonfinite` (a NaN/Inf appears or vanishes at this node), or `accumulated`
    /// (no single node exceeds the tolerance: the output gap grew from round-off).
    pub kind: String,
    /// One line for people.
    pub message: String,
    /// The line of the user's code that created the node's source op (`torch.export`
    /// programs), printed after the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<rlx_ir::SourceLoc>,
    /// The loop iterations the node was unrolled in, outermost first (empty outside loops;
    /// [`rlx_ir::Origin::iteration`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub iteration: Vec<rlx_ir::LoopIteration>,
}

/// Options for [`backend_divergence_with`].
#[derive(Clone, Debug)]
pub struct DivergenceOptions {
    /// Relative tolerance on outputs (and the localization threshold on nodes).
    pub tol_rel: f64,
    /// Backends to compare with the CPU; `None` means every live one but the CPU.
    pub backends: Option<Vec<Device>>,
    /// Localize the first diverging node when a backend is suspect.
    pub localize: bool,
    /// Compile options for both backends (the same compiled graph runs on each).
    pub compile: CompileOptions,
    /// Read every node back on both sides (whatever the verdict) and fill
    /// [`BackendDivergence::nodes`]: one more run per side plus a CPU replay of every op.
    pub node_errors: bool,
}

impl Default for DivergenceOptions {
    fn default() -> Self {
        DivergenceOptions {
            tol_rel: 2e-3,
            backends: None,
            localize: true,
            compile: CompileOptions {
                lint: false,
                ..CompileOptions::default()
            },
            node_errors: false,
        }
    }
}

/// Run `graph` on the CPU oracle and on every other backend live on this machine, and report
/// each one's worst divergence from the CPU (the seed contract).
///
/// `params` are the graph's weights (as `set_param` takes them), `inputs` the run's feeds
/// (f32 values converted to each input's dtype), `tol_rel` the relative tolerance (≈`2e-3` for
/// f32 forward graphs). Returns one entry per non-CPU backend: empty on a CPU-only machine,
/// never CPU against itself. A backend that fails to compile or run is skipped with a line
/// on stderr; use [`backend_divergence_with`] for typed inputs and errors.
pub fn backend_divergence(
    graph: &Graph,
    params: &[(&str, &[f32])],
    inputs: &[(&str, &[f32])],
    tol_rel: f32,
) -> Vec<BackendDivergence> {
    let to_tensors = |list: &[(&str, &[f32])], leaves: &[(String, rlx_ir::Shape)]| {
        list.iter()
            .map(|(n, v)| {
                let shape = leaves
                    .iter()
                    .find(|l| l.0 == *n)
                    .map(|l| l.1.clone())
                    .ok_or_else(|| RuntimeError::Input(format!("unknown name \"{n}\"")))?;
                let t = crate::f32_tensor(&shape, v)
                    .map_err(|e| RuntimeError::Input(format!("\"{n}\": {e}")))?;
                Ok((n.to_string(), t))
            })
            .collect::<Result<Vec<_>, RuntimeError>>()
    };
    let leaves = |param: bool| -> Vec<(String, rlx_ir::Shape)> {
        graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Param { name } if param => Some((name.clone(), n.shape.clone())),
                Op::Input { name } if !param => Some((name.clone(), n.shape.clone())),
                _ => None,
            })
            .collect()
    };
    let run = || -> Result<Vec<BackendDivergence>, RuntimeError> {
        let p = to_tensors(params, &leaves(true))?;
        let i = to_tensors(inputs, &leaves(false))?;
        let opts = DivergenceOptions {
            tol_rel: tol_rel as f64,
            ..Default::default()
        };
        backend_divergence_with(graph, &p, &i, &opts)
    };
    match run() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rlx diverge: {e}");
            vec![]
        }
    }
}

/// Print a [`backend_divergence`] report, one line per backend, and return `true` if ANY
/// backend is suspect (a one-line gate for CI on each machine of a cluster).
///
/// Line form: `[label]   wgpu vs cpu (18/19 nodes on wgpu): max_abs=1.2e-6 max_rel=3.4e-5 (output #0) — round-off
/// (explainable)` or `— SUSPECT (...)`, then the first diverging node when one was found.
pub fn report_backend_divergence(
    label: &str,
    graph: &Graph,
    params: &[(&str, &[f32])],
    inputs: &[(&str, &[f32])],
    tol_rel: f32,
) -> bool {
    let report = backend_divergence(graph, params, inputs, tol_rel);
    eprint!("{}", format_report(label, &report));
    report.iter().any(|d| d.suspect)
}

/// The text report of [`report_backend_divergence`] (one line per backend, then details).
pub fn format_report(label: &str, report: &[BackendDivergence]) -> String {
    if report.is_empty() {
        return format!(
            "[{label}] backend divergence: no backend but the CPU is live here — nothing to compare\n"
        );
    }
    let mut s = String::new();
    for d in report {
        s.push_str(&format!("[{label}] {d}\n"));
        for m in d.nonfinite.iter().take(3) {
            s.push_str(&format!(
                "    output #{} \"{}\" [{}]: cpu {}, {} {}: {}\n",
                m.output.unwrap_or(0),
                m.output_name.as_deref().unwrap_or(&m.node),
                m.index,
                m.cpu,
                d.device,
                m.other,
                m.what
            ));
        }
        if d.nonfinite.len() > 3 {
            s.push_str(&format!(
                "    ... {} more non-finite mismatches\n",
                d.nonfinite.len() - 3
            ));
        }
        if let Some(l) = &d.localization {
            s.push_str(&format!("    {}\n", l.message));
            if let Some(loc) = &l.source {
                s.push_str(&format!("    at {loc}\n"));
            }
        }
    }
    s
}

impl BackendDivergence {
    fn set_verdict(&mut self) {
        self.verdict = if !self.compared {
            "not compared"
        } else if self.suspect {
            "suspect"
        } else {
            "round-off"
        }
        .into();
    }
}

impl fmt::Display for BackendDivergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dev = self.device.to_string();
        if !self.compared {
            if self.nodes_total == 0 {
                return write!(
                    f,
                    "{dev:>6} vs cpu: not compared — the graph has no op to run (its outputs are inputs or constants)"
                );
            }
            return write!(
                f,
                "{dev:>6} vs cpu: not compared — 0 of {} nodes ran on {dev} (every node fell back to the CPU, so its outputs are the CPU's own; RLX_DISPATCH_REPORT=1 says why)",
                self.nodes_total
            );
        }
        write!(
            f,
            "{dev:>6} vs cpu ({}/{} nodes on {dev}): max_abs={:.3e} max_rel={:.3e} max_ulps={} (output #{} \"{}\") — ",
            self.nodes_on_device,
            self.nodes_total,
            self.max_abs,
            self.max_rel,
            self.max_ulps,
            self.worst_output,
            self.worst_output_name
        )?;
        if !self.suspect {
            if self.amplified_near_zero {
                return write!(
                    f,
                    "round-off (explainable: max_rel is reached at [{}] where cpu {:.3e}, {} {:.3e}, near zero; every op agrees with the CPU on the same inputs to tol {:.1e})",
                    self.worst_index,
                    self.worst_values.0,
                    self.device,
                    self.worst_values.1,
                    self.tol_rel
                );
            }
            return f.write_str("round-off (explainable)");
        }
        let mut why = vec![];
        if self.max_rel > self.tol_rel {
            why.push(format!(
                "relative error {:.1e} > tol {:.1e}: too large for round-off, likely a kernel bug",
                self.max_rel, self.tol_rel
            ));
        } else if self.nonfinite.is_empty() && self.int_mismatches == 0 {
            why.push(
                "an output is beyond its dtype's tolerance: too large for round-off, likely a kernel bug"
                    .into(),
            );
        }
        if !self.nonfinite.is_empty() {
            why.push(format!(
                "{} output element(s) non-finite on one side only",
                self.nonfinite.len()
            ));
        }
        if self.int_mismatches > 0 {
            why.push(format!(
                "{} integer/bool output element(s) differ",
                self.int_mismatches
            ));
        }
        write!(f, "SUSPECT ({})", why.join("; "))
    }
}

/// [`backend_divergence`] with typed tensors, options and errors.
///
/// The graph is compiled once; the same compiled graph runs on the CPU and on each backend, so
/// node ids match between them. Errors: the graph fails to compile, a param or input is
/// missing or mis-shaped, the CPU run fails. A backend that fails is an error too (naming
/// it): a diagnostic must not silently drop the backend it was asked about.
pub fn backend_divergence_with(
    graph: &Graph,
    params: &[(String, Tensor)],
    inputs: &[(String, Tensor)],
    opts: &DivergenceOptions,
) -> Result<Vec<BackendDivergence>, RuntimeError> {
    if graph.outputs.is_empty() {
        return Err(RuntimeError::NoOutputs);
    }
    let backends: Vec<Device> = match &opts.backends {
        Some(b) => {
            let mut v: Vec<Device> = vec![];
            for d in b {
                if !crate::device_available(*d) {
                    return Err(RuntimeError::DeviceUnavailable(*d));
                }
                if *d != Device::Cpu && !v.contains(d) {
                    v.push(*d);
                }
            }
            v
        }
        None => available_devices()
            .into_iter()
            .filter(|d| *d != Device::Cpu)
            .collect(),
    };
    crate::check_sizes(graph)?;
    let compiled = compile(graph.clone(), &opts.compile)?.graph;
    let feeds = order_inputs(&compiled, inputs)?;
    let mut cpu = CpuExecutor::new(compiled.clone())?;
    for (n, t) in params {
        cpu.set_param(n, t.clone())?;
    }
    let cpu_out = cpu.run(&feeds, None)?;
    let mut report = vec![];
    for dev in backends {
        let mut be = open_backend(dev, &compiled, params)?;
        report.push(judge(
            &compiled,
            dev,
            &mut cpu,
            &cpu_out,
            &feeds,
            be.as_mut(),
            opts,
        )?);
    }
    Ok(report)
}

/// One backend's verdict: compare its outputs with the CPU's; when that trips, localize
/// by replay, and a gap that no kernel explains (accumulated round-off) is not suspect.
fn judge(
    compiled: &Graph,
    dev: Device,
    cpu: &mut CpuExecutor,
    cpu_out: &[Tensor],
    feeds: &[Tensor],
    be: &mut dyn Backend,
    opts: &DivergenceOptions,
) -> Result<BackendDivergence, RuntimeError> {
    let refs: Vec<&Tensor> = feeds.iter().collect();
    let out = be
        .run(&refs, None, &PrinterConfig::off())
        .map_err(|e| named(dev, e))?;
    let mut d = compare_outputs(compiled, dev, cpu_out, &out, opts.tol_rel);
    let cov = be.coverage();
    d.nodes_on_device = cov.on_device;
    d.nodes_total = cov.total;
    if cov.on_device == 0 {
        // Every node ran on the CPU (or there is none): comparing would be the CPU against
        // itself.
        d.compared = false;
        d.suspect = false;
        d.set_verdict();
        return Ok(d);
    }
    let localizing = d.suspect && opts.localize;
    if !localizing && !opts.node_errors {
        return Ok(d);
    }
    let mut cpu_nodes: Vec<Option<Tensor>> = vec![None; compiled.len()];
    cpu.run_observed(feeds, None, &mut |id, t| {
        cpu_nodes[id.index()] = Some(t.clone())
    })?;
    let other_nodes = be.run_all(&refs).map_err(|e| named(dev, e))?;
    if opts.node_errors {
        let placed = be.placements();
        d.nodes = node_diffs(
            compiled,
            dev,
            &cpu_nodes,
            &other_nodes,
            opts.tol_rel,
            &placed,
        );
    }
    if localizing {
        let l = localize(compiled, dev, &cpu_nodes, &other_nodes, opts.tol_rel);
        if l.kind == "accumulated" && d.nonfinite.is_empty() && d.int_mismatches == 0 {
            d.suspect = false;
            d.amplified_near_zero = true;
        }
        d.localization = Some(l);
        d.set_verdict();
    }
    Ok(d)
}

/// Feeds ordered as the compiled graph's inputs; errors name the missing or unknown input.
fn order_inputs(g: &Graph, inputs: &[(String, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
    let decl: Vec<&str> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Input { name } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    for (n, _) in inputs {
        if !decl.contains(&n.as_str()) {
            return Err(RuntimeError::Input(format!(
                "unknown input \"{n}\" (the graph's inputs: {})",
                decl.join(", ")
            )));
        }
    }
    decl.iter()
        .map(|d| {
            inputs
                .iter()
                .find(|(n, _)| n == d)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| RuntimeError::Input(format!("missing input \"{d}\"")))
        })
        .collect()
}

/// A backend's error with the backend named (a diagnostic must say which side failed).
fn named(dev: Device, e: RuntimeError) -> RuntimeError {
    match e {
        e @ (RuntimeError::DeviceUnavailable(_) | RuntimeError::Backend(_)) => e,
        e => RuntimeError::Backend(format!("{dev}: {e}")),
    }
}

/// One non-CPU backend prepared for the compiled graph, with the parameters set.
fn open_backend(
    dev: Device,
    g: &Graph,
    params: &[(String, Tensor)],
) -> Result<Box<dyn Backend>, RuntimeError> {
    let mut be = crate::backend::open(dev, g.clone()).map_err(|e| named(dev, e))?;
    for (n, t) in params {
        be.set_param(n, t.clone()).map_err(|e| named(dev, e))?;
    }
    Ok(be)
}

/// The CPU graph run node by node with a chosen [`Fault`]: the stand-in backend of this
/// module's unit tests (it proves the classifier, the replay and the thresholds without a
/// GPU). With `on_device` false it reports every node as a CPU fallback.
#[cfg(test)]
struct StandIn {
    g: Graph,
    params: Vec<(String, Tensor)>,
    fault: Fault,
    on_device: bool,
}

#[cfg(test)]
impl StandIn {
    fn new(g: Graph, params: Vec<(String, Tensor)>, fault: Fault) -> StandIn {
        StandIn {
            g,
            params,
            fault,
            on_device: true,
        }
    }

    /// Run on owned feeds (tests).
    fn run_feeds(&mut self, feeds: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        let refs: Vec<&Tensor> = feeds.iter().collect();
        Backend::run(self, &refs, None, &PrinterConfig::off())
    }
}

#[cfg(test)]
impl Backend for StandIn {
    fn device(&self) -> Device {
        Device::Wgpu
    }
    fn describe(&self) -> String {
        "stand-in".into()
    }
    fn graph(&self) -> &Graph {
        &self.g
    }
    fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError> {
        self.params.retain(|p| p.0 != name);
        self.params.push((name.to_string(), t));
        Ok(())
    }
    fn run(
        &mut self,
        inputs: &[&Tensor],
        _: Option<&mut rlx_ir::numeric_check::DebugScanner>,
        _: &PrinterConfig,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let all = self.run_all(inputs)?;
        crate::backend::outputs_of(&self.g, &all)
    }
    fn run_all(&mut self, inputs: &[&Tensor]) -> Result<Vec<Option<Tensor>>, RuntimeError> {
        let feeds: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        stand_in_run(&self.g, &self.params, &feeds, &self.fault)
    }
    fn placements(&self) -> Vec<(NodeId, crate::backend::Placement)> {
        use crate::backend::Placement;
        crate::backend::compute_nodes(&self.g)
            .map(|n| {
                let p = if self.on_device {
                    Placement::Device
                } else {
                    Placement::CpuFallback {
                        reason: "test".into(),
                    }
                };
                (n.id, p)
            })
            .collect()
    }
    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }
}

/// What the stand-in backend of the tests does differently from the CPU.
#[cfg(test)]
#[derive(Clone, Debug)]
enum Fault {
    /// A planted kernel bug: node `.0`'s output is scaled by `.1` (downstream nodes are
    /// recomputed from the wrong value, so they only carry it).
    Scale(NodeId, f32),
    /// Round-off: every float op's output element `i` of node `n` is multiplied by
    /// `1 + rel * s` with `s = ((i + n) % 3) - 1` in {-1, 0, 1}, a deterministic pattern.
    Noise(f64),
    /// Element `.1` of node `.0`'s output is replaced by `.2` (a NaN or an Inf).
    NonFinite(NodeId, usize, f32),
}

/// Run the CPU graph node by node with `fault` applied to op outputs (values downstream are
/// recomputed from the faulty values, as a real backend's would be). Test stand-in for a
/// second backend.
#[cfg(test)]
fn stand_in_run(
    g: &Graph,
    params: &[(String, Tensor)],
    feeds: &[Tensor],
    fault: &Fault,
) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let mut vals: Vec<Option<Tensor>> = vec![None; g.len()];
    let mut next = 0;
    for n in &g.nodes {
        let leaf = matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::Constant(_));
        let v = match &n.op {
            Op::Input { .. } => {
                next += 1;
                feeds[next - 1].clone()
            }
            Op::Constant(t) => Tensor::clone(t),
            Op::Param { name } => params
                .iter()
                .find(|p| &p.0 == name)
                .map(|p| p.1.clone())
                .ok_or_else(|| RuntimeError::Input(format!("param {name} not set")))?,
            op => {
                let ins = n
                    .inputs
                    .iter()
                    .map(|i| {
                        vals[i.index()]
                            .as_ref()
                            .ok_or_else(|| RuntimeError::Input(format!("{i}: no value")))
                    })
                    .collect::<Result<Vec<&Tensor>, _>>()?;
                rlx_cpu::eval_op(op, &ins, &n.shape)
                    .map_err(|k| RuntimeError::Input(format!("{}: {k}", n.id)))?
            }
        };
        let map = |v: &Tensor, f: &dyn Fn(usize, f32) -> f32| -> Result<Tensor, RuntimeError> {
            let d = v.data().to_f32_vec();
            let d = d.iter().enumerate().map(|(i, &x)| f(i, x)).collect();
            Tensor::from_f32(v.dims(), d).map_err(|e| RuntimeError::Input(e.to_string()))
        };
        let v = match fault {
            Fault::Scale(at, by) if n.id == *at => map(&v, &|_, x| x * by)?,
            Fault::Noise(rel) if !leaf && v.dtype() == DType::F32 => {
                let k = n.id.index();
                map(&v, &|i, x| {
                    let s = ((i + k) % 3) as f64 - 1.0;
                    (x as f64 * (1.0 + rel * s)) as f32
                })?
            }
            Fault::NonFinite(at, j, bad) if n.id == *at => {
                map(&v, &|i, x| if i == *j { *bad } else { x })?
            }
            _ => v,
        };
        vals[n.id.index()] = Some(v);
    }
    Ok(vals)
}

fn is_float(dt: DType) -> bool {
    dt.is_float()
}

/// Ordered integer image of a float's bits in its dtype (adjacent floats differ by 1).
fn ordered(dt: DType, x: f64) -> i128 {
    let (bits, sign_bit): (u64, u64) = match dt {
        DType::F64 => (x.to_bits(), 1 << 63),
        DType::F16 => (half::f16::from_f64(x).to_bits() as u64, 1 << 15),
        DType::BF16 => (half::bf16::from_f64(x).to_bits() as u64, 1 << 15),
        _ => ((x as f32).to_bits() as u64, 1 << 31),
    };
    let mag = (bits & (sign_bit - 1)) as i128;
    if bits & sign_bit != 0 {
        -mag
    } else {
        mag
    }
}

/// Distance in units in the last place of `dt` between two finite values.
pub fn ulp_distance(dt: DType, a: f64, b: f64) -> u64 {
    let d = (ordered(dt, a) - ordered(dt, b)).unsigned_abs();
    d.min(u64::MAX as u128) as u64
}

fn fmt_val(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:e}")
    }
}

/// Words for a non-finite mismatch, `None` when the two values agree (same NaN-ness/Inf).
fn nonfinite_what(dev: Device, cpu: f64, other: f64) -> Option<String> {
    let kind = |x: f64| {
        if x.is_nan() {
            0
        } else if x == f64::INFINITY {
            1
        } else if x == f64::NEG_INFINITY {
            2
        } else {
            3
        }
    };
    let (a, b) = (kind(cpu), kind(other));
    if a == b {
        return None;
    }
    Some(match (a, b) {
        (0, 3) => format!("the {dev} backend dropped a NaN"),
        (3, 0) => format!("the {dev} backend produced a NaN the CPU did not"),
        (1 | 2, 3) => format!("the {dev} backend lost an Inf (saturated or folded it)"),
        (3, 1 | 2) => format!("the {dev} backend overflowed where the CPU did not"),
        (0, _) => format!("the {dev} backend turned a NaN into an Inf"),
        (_, 0) => format!("the {dev} backend turned an Inf into a NaN"),
        _ => format!("the {dev} backend flipped the sign of an Inf"),
    })
}

/// Compare two values of one node. `scaled`: use the scale-aware floor (intermediates) rather
/// than the contract's fixed 1e-6 (outputs).
fn compare_tensors(
    g: &Graph,
    id: NodeId,
    dev: Device,
    cpu: &Tensor,
    other: &Tensor,
    scaled: bool,
) -> NodeError {
    let mut e = NodeError::default();
    if cpu.dims() != other.dims() || cpu.dtype() != other.dtype() {
        e.rel = f64::INFINITY;
        e.abs = f64::INFINITY;
        return e;
    }
    let dt = cpu.dtype();
    let (a, b) = (cpu.data(), other.data());
    if !is_float(dt) {
        for i in 0..a.len() {
            if a.get_i128(i) != b.get_i128(i) {
                if e.rel == 0.0 {
                    e.index = i;
                }
                e.rel = f64::INFINITY;
                e.ulps += 1; // counts differing elements for integers
            }
        }
        return e;
    }
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let floor = if scaled {
        let m = av
            .iter()
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        (NODE_SCALE * m).max(REL_FLOOR)
    } else {
        REL_FLOOR
    };
    for (i, (&x, &y)) in av.iter().zip(&bv).enumerate() {
        if x.is_finite() && y.is_finite() {
            let d = (x - y).abs();
            let r = d / (x.abs() + floor);
            e.abs = e.abs.max(d);
            if r > e.rel {
                e.rel = r;
                e.index = i;
            }
            e.ulps = e.ulps.max(ulp_distance(dt, x, y));
        } else if e.nonfinite.is_none() {
            if let Some(what) = nonfinite_what(dev, x, y) {
                e.nonfinite = Some(NonFiniteMismatch {
                    output: None,
                    node: id.to_string(),
                    output_name: None,
                    index: i,
                    cpu: fmt_val(x),
                    other: fmt_val(y),
                    what,
                });
            }
        }
    }
    let _ = g;
    e
}

/// Classify one backend's outputs against the CPU's (outputs in `g.outputs` order).
pub fn compare_outputs(
    g: &Graph,
    dev: Device,
    cpu: &[Tensor],
    other: &[Tensor],
    tol_rel: f64,
) -> BackendDivergence {
    let mut d = BackendDivergence {
        device: dev,
        nodes_on_device: 0,
        nodes_total: 0,
        compared: true,
        verdict: String::new(),
        max_abs: 0.0,
        max_rel: 0.0,
        worst_output: 0,
        worst_output_name: String::new(),
        max_ulps: 0,
        worst_index: 0,
        worst_values: (0.0, 0.0),
        nonfinite: vec![],
        int_mismatches: 0,
        suspect: false,
        amplified_near_zero: false,
        tol_rel,
        localization: None,
        nodes: vec![],
    };
    let mut over_tol = false;
    for (k, (a, b)) in cpu.iter().zip(other).enumerate() {
        let id = g.outputs[k];
        let dt = a.dtype();
        if a.dims() != b.dims() || dt != b.dtype() {
            d.int_mismatches += a.numel().max(1);
            continue;
        }
        if !is_float(dt) {
            let (x, y) = (a.data(), b.data());
            d.int_mismatches += (0..x.len())
                .filter(|&i| x.get_i128(i) != y.get_i128(i))
                .count();
            continue;
        }
        let (av, bv) = (a.data().to_f64_vec(), b.data().to_f64_vec());
        let tol = dtype_tol(dt, tol_rel);
        for (i, (&x, &y)) in av.iter().zip(&bv).enumerate() {
            if x.is_finite() && y.is_finite() {
                let abs = (x - y).abs();
                let rel = abs / (x.abs() + REL_FLOOR);
                d.max_abs = d.max_abs.max(abs);
                d.max_ulps = d.max_ulps.max(ulp_distance(dt, x, y));
                over_tol |= rel > tol;
                if rel > d.max_rel {
                    d.max_rel = rel;
                    d.worst_output = k;
                    d.worst_index = i;
                    d.worst_values = (x, y);
                    d.tol_rel = tol;
                }
            } else if let Some(what) = nonfinite_what(dev, x, y) {
                d.nonfinite.push(NonFiniteMismatch {
                    output: Some(k),
                    node: id.to_string(),
                    output_name: Some(output_name(g, k)),
                    index: i,
                    cpu: fmt_val(x),
                    other: fmt_val(y),
                    what,
                });
            }
        }
    }
    d.worst_output_name = output_name(g, d.worst_output);
    d.suspect = over_tol || !d.nonfinite.is_empty() || d.int_mismatches > 0;
    d.set_verdict();
    d
}

fn output_name(g: &Graph, k: usize) -> String {
    g.output_names
        .get(k)
        .cloned()
        .unwrap_or_else(|| g.outputs.get(k).map(|o| o.to_string()).unwrap_or_default())
}

fn describe(g: &Graph, id: NodeId) -> (String, String, Option<String>) {
    let op = g.node(id).op.name();
    let label = node_label(g, id);
    let src = source_op_type(g, id)
        .filter(|s| *s != op)
        .map(str::to_string);
    (op.to_string(), label, src)
}

/// Every compute node of `g` in execution order with its accumulated difference (the two
/// full runs' values) and its own difference (the op replayed on the CPU with `other`'s
/// inputs, against `other`'s value).
pub fn node_diffs(
    g: &Graph,
    dev: Device,
    cpu: &[Option<Tensor>],
    other: &[Option<Tensor>],
    tol_rel: f64,
    placements: &[(NodeId, crate::backend::Placement)],
) -> Vec<NodeDiff> {
    fn val(v: &[Option<Tensor>], id: NodeId) -> Option<&Tensor> {
        v.get(id.index()).and_then(|t| t.as_ref())
    }
    let on_device: std::collections::HashSet<NodeId> = placements
        .iter()
        .filter(|(_, p)| *p == crate::backend::Placement::Device)
        .map(|(id, _)| *id)
        .collect();
    crate::backend::compute_nodes(g)
        .map(|n| {
            let (op, label, source_op) = describe(g, n.id);
            let b = val(other, n.id);
            let accumulated = match (val(cpu, n.id), b) {
                (Some(a), Some(b)) => Some(compare_tensors(g, n.id, dev, a, b, true)),
                _ => None,
            };
            let ins: Option<Vec<&Tensor>> = n.inputs.iter().map(|i| val(other, *i)).collect();
            let own = match (ins, b) {
                (Some(ins), Some(b)) => rlx_cpu::eval_op(&n.op, &ins, &n.shape)
                    .ok()
                    .map(|r| compare_tensors(g, n.id, dev, &r, b, true)),
                _ => None,
            };
            NodeDiff {
                node: n.id.to_string(),
                op,
                label,
                source_op,
                iteration: node_iteration(g, n.id).to_vec(),
                dtype: n.shape.dtype.to_string(),
                tol: dtype_tol(n.shape.dtype, tol_rel),
                on_device: on_device.contains(&n.id),
                accumulated,
                own,
            }
        })
        .collect()
}

/// Find the first node where `other` parts from `cpu` (both indexed by node). Nodes without
/// a value on either side are skipped.
///
/// A node whose values differ beyond `tol_rel` (scale-aware) is **replayed**: its op runs on
/// the CPU with the other backend's own input values, and that result is compared with the
/// other backend's output. If they still differ, the kernel itself is wrong (a kernel bug
/// candidate, or a non-finite divergence such as a dropped NaN); if they agree, the node only
/// carried a difference that came in through its inputs (an op such as Erf or Sub can turn a
/// small input difference into a large relative one), and the search goes on. When no kernel
/// differs on replay, the output gap is accumulated round-off (`kind = "accumulated"`).
pub fn localize(
    g: &Graph,
    dev: Device,
    cpu: &[Option<Tensor>],
    other: &[Option<Tensor>],
    tol_rel: f64,
) -> Localization {
    let mut errs: Vec<Option<NodeError>> = vec![None; g.len()];
    let mut worst: Option<(NodeId, f64)> = None;
    for n in &g.nodes {
        let (Some(Some(a)), Some(Some(b))) = (cpu.get(n.id.index()), other.get(n.id.index()))
        else {
            continue;
        };
        let e = compare_tensors(g, n.id, dev, a, b, true);
        let inputs_rel = n
            .inputs
            .iter()
            .filter_map(|i| errs[i.index()].as_ref().map(|e| e.rel))
            .fold(0.0f64, f64::max);
        let tol = dtype_tol(n.shape.dtype, tol_rel);
        let diverges = e.rel > tol || e.nonfinite.is_some();
        if diverges {
            let leaf = matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::Constant(_));
            // Replay the op on the CPU with the other backend's inputs.
            let replay = if leaf {
                None
            } else {
                let ins: Option<Vec<&Tensor>> = n
                    .inputs
                    .iter()
                    .map(|i| other.get(i.index()).and_then(|v| v.as_ref()))
                    .collect();
                ins.and_then(|ins| rlx_cpu::eval_op(&n.op, &ins, &n.shape).ok())
            };
            let (k, replayed) = match &replay {
                Some(r) => (compare_tensors(g, n.id, dev, r, b, true), true),
                None => (e.clone(), false),
            };
            let kernel_wrong = if replayed {
                k.rel > tol || k.nonfinite.is_some()
            } else {
                inputs_rel <= tol
            };
            if kernel_wrong {
                return candidate(g, n.id, dev, inputs_rel, k, replayed, leaf);
            }
        }
        if worst.is_none_or(|w| e.rel > w.1) {
            worst = Some((n.id, e.rel));
        }
        errs[n.id.index()] = Some(e);
    }
    let (id, _) = worst.unwrap_or((g.outputs[0], 0.0));
    let e = errs[id.index()].clone().unwrap_or_default();
    let (op, label, source_op) = describe(g, id);
    let q = quoted_label(g, id);
    let inputs_rel = g
        .node(id)
        .inputs
        .iter()
        .filter_map(|i| errs[i.index()].as_ref().map(|e| e.rel))
        .fold(0.0f64, f64::max);
    // Say where the largest difference came from: its inputs, or the op itself (under tol).
    let whence = if inputs_rel > 0.0 {
        format!("its inputs already differ by {inputs_rel:.1e}")
    } else {
        format!("on identical inputs: that op's own difference, under tol {tol_rel:.1e}")
    };
    let message = format!(
        "no op differs from the CPU by more than tol when replayed on the {dev} backend's own inputs (largest node difference {:.1e} at {id} {op} {q}, {whence}): the output gap is accumulated round-off, amplified where an output element is near zero",
        e.rel
    );
    Localization {
        node: id.to_string(),
        op,
        label,
        source_op,
        inputs_rel,
        error: e,
        kind: "accumulated".into(),
        message,
        source: g.node(id).origin.as_ref().and_then(|o| o.source.clone()),
        iteration: node_iteration(g, id).to_vec(),
    }
}

/// The localization of a node whose kernel differs from the CPU's on the same inputs.
fn candidate(
    g: &Graph,
    id: NodeId,
    dev: Device,
    inputs_rel: f64,
    e: NodeError,
    replayed: bool,
    leaf: bool,
) -> Localization {
    let (op, label, source_op) = describe(g, id);
    let q = quoted_label(g, id);
    let step = source_op
        .as_ref()
        .map(|s| format!(" (a step of {s})"))
        .unwrap_or_default();
    let how = if replayed {
        format!("; replayed on the CPU with the {dev} inputs it still")
    } else if leaf {
        format!("; the value uploaded to and read back from {dev}")
    } else {
        String::new()
    };
    if let Some(m) = &e.nonfinite {
        let message = format!(
            "cpu {}, {dev} {} at {id} {op} {q}{step} [{}]: {} (inputs agree to {:.1e}{}): kernel bug candidate",
            m.cpu,
            m.other,
            m.index,
            m.what,
            inputs_rel,
            if replayed { format!("; the CPU replayed on the {dev} inputs gives {}", m.cpu) } else { String::new() }
        );
        return Localization {
            node: id.to_string(),
            op,
            label,
            source_op,
            inputs_rel,
            error: e,
            kind: "nonfinite".into(),
            message,
            source: g.node(id).origin.as_ref().and_then(|o| o.source.clone()),
            iteration: node_iteration(g, id).to_vec(),
        };
    }
    let ulps = if !is_float(g.node(id).shape.dtype) {
        format!("{} elements differ", e.ulps)
    } else {
        format!("{} ULPs of {}", e.ulps, g.node(id).shape.dtype)
    };
    let message = format!(
        "first divergence at {id} {op} {q}{step} (inputs agree to {:.1e}{how} differs by {:.1e} rel, {:.1e} abs, {ulps} at [{}]): kernel bug candidate",
        inputs_rel,
        e.rel,
        e.abs,
        e.index
    );
    let message = if how.is_empty() {
        message.replace(" differs by", ", output differs by")
    } else {
        message
    };
    Localization {
        node: id.to_string(),
        op,
        label,
        source_op,
        inputs_rel,
        error: e,
        kind: "kernel_bug_candidate".into(),
        message,
        source: g.node(id).origin.as_ref().and_then(|o| o.source.clone()),
        iteration: node_iteration(g, id).to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, Shape, UnaryOp};

    /// A graph, its inputs and its parameters.
    type Fixture = (Graph, Vec<(String, Tensor)>, Vec<(String, Tensor)>);

    fn mlp() -> Fixture {
        // y = relu(x @ w) summed over the last axis; values chosen by hand.
        let mut g = Graph::new("mlp");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let w = g.param("w", Shape::new(&[3, 2], DType::F32));
        let m = g.matmul(x, w, Shape::new(&[2, 2], DType::F32));
        let r = g.activation(Activation::Relu, m, Shape::new(&[2, 2], DType::F32));
        g.set_outputs(vec![r]);
        let w = Tensor::from_f32(&[3, 2], vec![1.0, -1.0, 0.5, 2.0, -0.25, 1.0]).unwrap();
        let x = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        (g, vec![("w".into(), w)], vec![("x".into(), x)])
    }

    #[test]
    fn cpu_only_machine_gives_empty_report_and_never_compares_cpu_with_itself() {
        let (g, p, i) = mlp();
        let r = backend_divergence_with(&g, &p, &i, &DivergenceOptions::default()).unwrap();
        assert!(r.iter().all(|d| d.device != Device::Cpu));
        if !available_devices().contains(&Device::Wgpu) {
            assert!(r.is_empty());
        }
        // The seed form too.
        let r = backend_divergence(
            &g,
            &[("w", &[1.0, -1.0, 0.5, 2.0, -0.25, 1.0])],
            &[("x", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
            2e-3,
        );
        assert!(r.iter().all(|d| d.device != Device::Cpu));
    }

    #[test]
    fn output_stats_follow_the_contract() {
        let g = {
            let mut g = Graph::new("two");
            let a = g.input("a", Shape::new(&[2], DType::F32));
            let b = g.activation(Activation::Relu, a, Shape::new(&[2], DType::F32));
            g.set_outputs(vec![a, b]);
            g
        };
        let t = |v: Vec<f32>| Tensor::from_f32(&[2], v).unwrap();
        // Output 1 has one element off by 0.5 on 2.0: rel = 0.5 / (2 + 1e-6).
        let cpu = vec![t(vec![1.0, 2.0]), t(vec![2.0, 4.0])];
        let got = vec![t(vec![1.0, 2.0]), t(vec![2.5, 4.0])];
        let d = compare_outputs(&g, Device::Wgpu, &cpu, &got, 2e-3);
        assert!((d.max_abs - 0.5).abs() < 1e-12);
        assert!((d.max_rel - 0.5 / (2.0 + 1e-6)).abs() < 1e-12);
        assert_eq!(d.worst_output, 1);
        assert!(d.suspect);
        // 2.5 is 0.5 / 2^-22 = 2^21 f32 ULPs above 2.0 (the f32 step in [2, 4) is 2^-22).
        assert_eq!(d.max_ulps, 1 << 21);
        // One ULP apart: round-off.
        let near = vec![
            t(vec![1.0, 2.0]),
            t(vec![2.0, f32::from_bits(4.0f32.to_bits() + 1)]),
        ];
        let d = compare_outputs(&g, Device::Wgpu, &cpu, &near, 2e-3);
        assert!(!d.suspect);
        assert_eq!(d.max_ulps, 1);
        assert!(d.to_string().contains("round-off (explainable)"));
    }

    #[test]
    fn nonfinite_mismatch_is_named_not_folded_into_max_rel() {
        let mut g = Graph::new("r");
        let a = g.input("a", Shape::new(&[3], DType::F32));
        let r = g.activation(Activation::Relu, a, Shape::new(&[3], DType::F32));
        g.set_outputs(vec![r]);
        let t = |v: Vec<f32>| Tensor::from_f32(&[3], v).unwrap();
        let cpu = vec![t(vec![f32::NAN, 1.0, f32::NAN])];
        // Element 2 NaN on both sides: agreement. Element 0: the GPU dropped the NaN.
        let got = vec![t(vec![0.0, 1.0, f32::NAN])];
        let d = compare_outputs(&g, Device::Wgpu, &cpu, &got, 2e-3);
        assert_eq!(d.max_rel, 0.0);
        assert_eq!(d.nonfinite.len(), 1);
        assert_eq!(d.nonfinite[0].index, 0);
        assert_eq!(d.nonfinite[0].what, "the wgpu backend dropped a NaN");
        assert!(d.suspect);
        let s = format_report("r", &[d]);
        assert!(s.contains("cpu NaN, wgpu 0e0"), "{s}");
    }

    #[test]
    fn ulps_in_half_precision() {
        // 1.0 and the next f16 (1 + 2^-10) are one f16 ULP apart.
        assert_eq!(ulp_distance(DType::F16, 1.0, 1.0 + 1.0 / 1024.0), 1);
        assert_eq!(ulp_distance(DType::F32, -0.0, 0.0), 0);
        assert_eq!(ulp_distance(DType::F32, -1.0, 1.0), 2 * 0x3f80_0000);
    }

    /// `y = (x · w) - c`, with `c` chosen so that `x · w - c` is near zero for the first
    /// element: a difference of 1e-4 relative in the product (under the 2e-3 tolerance)
    /// becomes a large relative difference of the output element near zero.
    fn near_zero_chain() -> Fixture {
        let mut g = Graph::new("near_zero");
        let x = g.input("x", Shape::new(&[1, 2], DType::F32));
        let w = g.param("w", Shape::new(&[2, 2], DType::F32));
        let m = g.matmul(x, w, Shape::new(&[1, 2], DType::F32));
        g.set_name(m, "proj");
        let c = g.constant(Tensor::from_f32(&[1, 2], vec![2.999, 1.0]).unwrap());
        let y = g.sub(m, c, Shape::new(&[1, 2], DType::F32));
        g.set_name(y, "center");
        g.set_outputs(vec![y]);
        // x · w = [1·1 + 2·1, 1·0 + 2·1] = [3, 2]; y = [0.001, 1].
        let w = Tensor::from_f32(&[2, 2], vec![1.0, 0.0, 1.0, 1.0]).unwrap();
        let x = Tensor::from_f32(&[1, 2], vec![1.0, 2.0]).unwrap();
        (g, vec![("w".into(), w)], vec![("x".into(), x)])
    }

    /// The verdict (through [`judge`], the code `backend_divergence_with` runs per backend) of
    /// a stand-in backend with the [`Fault`] that `fault` builds for the compiled graph.
    fn verdict(
        g: &Graph,
        p: &[(String, Tensor)],
        i: &[(String, Tensor)],
        fault: impl Fn(&Graph) -> Fault,
        tol_rel: f64,
    ) -> BackendDivergence {
        verdict_on(g, p, i, fault, tol_rel, true)
    }

    /// [`verdict`] with the stand-in's nodes on its device (`on_device`) or all on the CPU.
    fn verdict_on(
        g: &Graph,
        p: &[(String, Tensor)],
        i: &[(String, Tensor)],
        fault: impl Fn(&Graph) -> Fault,
        tol_rel: f64,
        on_device: bool,
    ) -> BackendDivergence {
        let opts = DivergenceOptions {
            tol_rel,
            ..DivergenceOptions::default()
        };
        verdict_with(g, p, i, fault, &opts, on_device)
    }

    fn verdict_with(
        g: &Graph,
        p: &[(String, Tensor)],
        i: &[(String, Tensor)],
        fault: impl Fn(&Graph) -> Fault,
        opts: &DivergenceOptions,
        on_device: bool,
    ) -> BackendDivergence {
        let compiled = compile(g.clone(), &opts.compile).unwrap().graph;
        let feeds = order_inputs(&compiled, i).unwrap();
        let mut cpu = CpuExecutor::new(compiled.clone()).unwrap();
        for (n, t) in p {
            cpu.set_param(n, t.clone()).unwrap();
        }
        let cpu_out = cpu.run(&feeds, None).unwrap();
        let fault = fault(&compiled);
        let mut be = StandIn::new(compiled.clone(), p.to_vec(), fault);
        be.on_device = on_device;
        judge(
            &compiled,
            Device::Wgpu,
            &mut cpu,
            &cpu_out,
            &feeds,
            &mut be,
            opts,
        )
        .unwrap()
    }

    fn find(g: &Graph, f: impl Fn(&Op) -> bool) -> NodeId {
        g.nodes.iter().find(|n| f(&n.op)).unwrap().id
    }

    /// Round-off in a product (1e-4 relative, under tolerance) that a Sub near zero
    /// amplifies past the tolerance at the output: the output check trips, but replay finds
    /// no kernel that differs on its own inputs, so the verdict is accumulated round-off, not
    /// suspect. The Sub only carried the difference and is not blamed.
    #[test]
    fn amplified_round_off_is_accumulated_not_a_kernel_bug() {
        let (g, p, i) = near_zero_chain();
        let d = verdict(
            &g,
            &p,
            &i,
            |g| Fault::Scale(find(g, |o| matches!(o, Op::MatMul)), 1.0 + 1e-4),
            2e-3,
        );
        // Output element 0: cpu 0.001, other 3.0003 - 2.999 = 0.0013: rel ~0.3 > 2e-3.
        assert!(d.max_rel > 0.1, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "accumulated", "{}", l.message);
        assert!(!d.suspect, "{d}");
        assert!(d.amplified_near_zero);
    }

    /// The same graph with the Sub's own kernel wrong (its output scaled by 1.01): replay on
    /// identical inputs differs, so the Sub is named and the backend is suspect.
    #[test]
    fn a_kernel_that_differs_on_replay_is_suspect_and_named() {
        let (g, p, i) = near_zero_chain();
        let d = verdict(
            &g,
            &p,
            &i,
            |g| {
                Fault::Scale(
                    find(g, |o| matches!(o, Op::Binary(rlx_ir::BinaryOp::Sub))),
                    1.01,
                )
            },
            2e-3,
        );
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "kernel_bug_candidate", "{}", l.message);
        assert!(l.label == "center", "{}", l.message);
        assert!(d.suspect, "{d}");
        assert!(!d.amplified_near_zero);
    }

    /// A backend that ran no node itself (every node fell back to the CPU) is not judged:
    /// its outputs are the CPU's, so "round-off" would be a claim about nothing (issue 30
    /// item 6). The same fault on a backend that ran the nodes is suspect, and every line
    /// states how many nodes ran there.
    #[test]
    fn a_backend_that_ran_no_node_is_not_compared() {
        let (g, p, i) = near_zero_chain();
        let sub = |g: &Graph| {
            Fault::Scale(
                find(g, |o| matches!(o, Op::Binary(rlx_ir::BinaryOp::Sub))),
                1.01,
            )
        };
        let d = verdict_on(&g, &p, &i, sub, 2e-3, false);
        assert!(!d.compared && !d.suspect, "{d}");
        assert_eq!(d.verdict, "not compared");
        assert_eq!(d.nodes_on_device, 0);
        assert!(d.nodes_total > 0);
        let line = d.to_string();
        assert!(
            line.contains(&format!(
                "not compared — 0 of {} nodes ran on wgpu",
                d.nodes_total
            )),
            "{line}"
        );
        assert!(!line.contains("round-off"), "{line}");
        let d = verdict_on(&g, &p, &i, sub, 2e-3, true);
        assert!(d.compared && d.suspect, "{d}");
        assert_eq!(d.verdict, "suspect");
        assert_eq!(d.nodes_on_device, d.nodes_total);
        assert!(
            d.to_string().contains(&format!(
                "({}/{} nodes on wgpu)",
                d.nodes_total, d.nodes_total
            )),
            "{d}"
        );
    }

    /// float16/bfloat16 outputs are judged against their dtype's round-off: 3 float16 ulps
    /// at 1.0 (2.9e-3) would be a bug in f32 but is round-off in float16 (tol 3.9e-3); one
    /// bfloat16 ulp at 1.0 (7.8e-3) likewise; 5 float16 ulps (4.9e-3) is beyond it.
    #[test]
    fn narrow_float_outputs_get_their_dtype_tolerance() {
        assert_eq!(dtype_tol(DType::F32, 2e-3), 2e-3);
        assert!((dtype_tol(DType::F16, 2e-3) - 3.90625e-3).abs() < 1e-12);
        assert!((dtype_tol(DType::BF16, 2e-3) - 3.125e-2).abs() < 1e-12);
        assert_eq!(dtype_tol(DType::F16, 1e-2), 1e-2, "a looser request stands");
        let mut g = Graph::new("o");
        let x = g.input("x", rlx_ir::Shape::new(&[2], DType::F16));
        g.set_outputs(vec![x]);
        let t = |dt: DType, v: &[f64]| {
            Tensor::new(vec![2], rlx_ir::TensorData::from_f64(dt, v)).unwrap()
        };
        let ulp16 = 2f64.powi(-10);
        for (dt, off, suspect) in [
            (DType::F16, 3.0 * ulp16, false),
            (DType::F16, 5.0 * ulp16, true),
            (DType::BF16, 2f64.powi(-7), false),
            (DType::F32, 3.0 * ulp16, true),
        ] {
            let cpu = [t(dt, &[1.0, 0.5])];
            let other = [t(dt, &[1.0 + off, 0.5])];
            let d = compare_outputs(&g, Device::Wgpu, &cpu, &other, 2e-3);
            assert_eq!(d.suspect, suspect, "{dt} off {off:e}: {d}");
            assert_eq!(d.tol_rel, dtype_tol(dt, 2e-3), "{d}");
        }
    }

    /// The output threshold is `tol_rel` itself: an output 5·tol off (the MatMul scaled by
    /// 1 + 5·tol, in the element 1 far from zero) is suspect; 0.2·tol is not.
    #[test]
    fn output_threshold_is_tol_rel() {
        let (g, p, i) = near_zero_chain();
        // Perturb the Sub's output directly (a kernel bug of known size): element 1 is 1.0,
        // element 0 is 0.001 (both scaled by the same factor, so rel = by - 1 everywhere).
        let sub = |g: &Graph| find(g, |o| matches!(o, Op::Binary(rlx_ir::BinaryOp::Sub)));
        let tol = 2e-3;
        let d = verdict(
            &g,
            &p,
            &i,
            |g| Fault::Scale(sub(g), 1.0 + 5.0 * tol as f32),
            tol,
        );
        assert!(d.suspect, "{d}");
        assert!(
            d.max_rel > 4.0 * tol && d.max_rel < 6.0 * tol,
            "{}",
            d.max_rel
        );
        let d = verdict(
            &g,
            &p,
            &i,
            |g| Fault::Scale(sub(g), 1.0 + 0.2 * tol as f32),
            tol,
        );
        assert!(!d.suspect, "{d}");
        assert!(d.localization.is_none());
    }

    /// `gain = ((x · w) - c) · 3`, elementwise on 8 values, all exact in f32 by construction:
    /// `x_i = 1 + i/8`, `w = 1.5`, so `m_i = 1.5 + 0.1875·i`; `c_i = m_i - (i+1)·2^-14`, so
    /// `cancel_i = (i+1)·2^-14` (6.1e-5 .. 4.9e-4, near zero against `m` ≈ 2) and
    /// `gain_i = 3·(i+1)·2^-14`. Nodes named `scale`, `cancel`, `gain`.
    fn cancel_chain() -> Fixture {
        let sh = || Shape::new(&[8], DType::F32);
        let mut g = Graph::new("cancel");
        let x = g.input("x", sh());
        let w = g.param("w", sh());
        let m = g.mul(x, w, sh());
        g.set_name(m, "scale");
        let cv: Vec<f32> = (0..8)
            .map(|i| (1.5 + 0.1875 * i as f64 - (i + 1) as f64 / 16384.0) as f32)
            .collect();
        let c = g.constant(Tensor::from_f32(&[8], cv).unwrap());
        let y = g.sub(m, c, sh());
        g.set_name(y, "cancel");
        let three = g.constant(Tensor::scalar_f32(3.0));
        let o = g.mul(y, three, sh());
        g.set_name(o, "gain");
        g.set_outputs(vec![o]);
        let x = Tensor::from_f32(&[8], (0..8).map(|i| 1.0 + i as f32 / 8.0).collect()).unwrap();
        let w = Tensor::from_f32(&[8], vec![1.5; 8]).unwrap();
        (g, vec![("w".into(), w)], vec![("x".into(), x)])
    }

    fn named(g: &Graph, label: &str) -> NodeId {
        g.nodes
            .iter()
            .find(|n| node_label(g, n.id) == label)
            .unwrap()
            .id
    }

    /// The CPU's value of every node and the stand-in's, for checking the construction.
    fn node_values(
        g: &Graph,
        p: &[(String, Tensor)],
        i: &[(String, Tensor)],
        fault: &Fault,
    ) -> (Graph, Vec<Option<Tensor>>, Vec<Option<Tensor>>) {
        let compiled = compile(g.clone(), &DivergenceOptions::default().compile)
            .unwrap()
            .graph;
        let feeds = order_inputs(&compiled, i).unwrap();
        let none = Fault::Noise(0.0);
        let cpu = stand_in_run(&compiled, p, &feeds, &none).unwrap();
        let other = stand_in_run(&compiled, p, &feeds, fault).unwrap();
        (compiled, cpu, other)
    }

    #[test]
    fn cancel_chain_is_what_it_claims_on_the_cpu() {
        // The construction, checked against the f64 values it was built from.
        let (g, p, i) = cancel_chain();
        let (c, cpu, _) = node_values(&g, &p, &i, &Fault::Noise(0.0));
        let gain = cpu[named(&c, "gain").index()].as_ref().unwrap();
        let want: Vec<f32> = (0..8).map(|i| (3 * (i + 1)) as f32 / 16384.0).collect();
        assert_eq!(gain.data().to_f32_vec(), want);
    }

    /// (a) Round-off of 1e-6 relative on every op's output (far under tol 2e-3): the output
    /// near zero amplifies it past tol (element 0 or 1 carries noise: 1.5e-6 · 1.5 / 2^-13
    /// is > 5e-3), but every op agrees with the CPU on its own inputs: accumulated, not
    /// suspect.
    #[test]
    fn round_off_noise_on_every_op_is_accumulated_not_suspect() {
        let (g, p, i) = cancel_chain();
        let d = verdict(&g, &p, &i, |_| Fault::Noise(1e-6), 2e-3);
        assert!(d.max_rel > 5e-3, "the output check must trip: {d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "accumulated", "{}", l.message);
        assert!(!d.suspect, "{d}");
        assert!(d.amplified_near_zero);
        assert!(
            d.to_string()
                .contains("round-off (explainable: max_rel is reached"),
            "{d}"
        );
    }

    /// Noise of 1e-2 per op is beyond tol at the first op itself: the first op (`scale`) is
    /// named, not the ops after it.
    #[test]
    fn noise_beyond_tol_is_named_at_the_first_op() {
        let (g, p, i) = cancel_chain();
        let d = verdict(&g, &p, &i, |_| Fault::Noise(1e-2), 2e-3);
        assert!(d.suspect, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "kernel_bug_candidate", "{}", l.message);
        assert_eq!(l.label, "scale", "{}", l.message);
    }

    /// (b) A planted bug in the middle op (`cancel` scaled by 1.5): suspect, and exactly that
    /// node is named (its input agrees exactly), not `scale` before it or `gain` after it.
    #[test]
    fn planted_bug_names_exactly_its_node() {
        let (g, p, i) = cancel_chain();
        let d = verdict(&g, &p, &i, |g| Fault::Scale(named(g, "cancel"), 1.5), 2e-3);
        assert!(d.suspect, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "kernel_bug_candidate", "{}", l.message);
        assert_eq!(l.label, "cancel");
        assert_eq!(l.inputs_rel, 0.0);
        // 1.5x is 0.5 relative (the scale-aware floor lowers it a little).
        assert!(l.error.rel > 0.4 && l.error.rel <= 0.5, "{}", l.error.rel);
    }

    /// `node_errors`: one entry per compute node in execution order; the planted node's own
    /// (replayed) error is its fault, the nodes after it carry the difference (accumulated
    /// beyond tol) with no own error, the nodes before it agree; asked for, it is filled for a
    /// backend that is not suspect too.
    #[test]
    fn node_errors_give_every_compute_node_accumulated_and_own() {
        let (g, p, i) = cancel_chain();
        let opts = DivergenceOptions {
            node_errors: true,
            ..DivergenceOptions::default()
        };
        let d = verdict_with(
            &g,
            &p,
            &i,
            |g| Fault::Scale(named(g, "scale"), 1.01),
            &opts,
            true,
        );
        assert!(d.suspect, "{d}");
        let labels: Vec<&str> = d.nodes.iter().map(|n| n.label.as_str()).collect();
        assert_eq!(labels, ["scale", "cancel", "gain"]);
        assert_eq!(d.nodes.len(), d.nodes_total);
        let acc = |k: usize| d.nodes[k].accumulated.as_ref().unwrap().rel;
        let own = |k: usize| d.nodes[k].own.as_ref().unwrap().rel;
        assert!(own(0) > 5e-3, "{}", own(0));
        assert!(acc(0) > 5e-3 && acc(1) > 2e-3 && acc(2) > 2e-3);
        assert!(own(1) < 1e-6 && own(2) < 1e-6, "{} {}", own(1), own(2));
        assert!(d.nodes.iter().all(|n| n.on_device && n.tol == 2e-3));
        let quiet = verdict_with(&g, &p, &i, |_| Fault::Noise(0.0), &opts, true);
        assert!(!quiet.suspect);
        assert_eq!(quiet.nodes.len(), 3);
        assert!(quiet
            .nodes
            .iter()
            .all(|n| n.accumulated.as_ref().unwrap().rel == 0.0));
        // without the option nothing is read back for a backend that agrees
        let off = verdict(&g, &p, &i, |_| Fault::Noise(0.0), 2e-3);
        assert!(off.nodes.is_empty());
    }

    /// (c) A difference made at `scale` (1%) and carried: `cancel` and `gain` differ from the
    /// CPU far beyond tol, yet each agrees with the CPU replayed on the stand-in's own inputs;
    /// only `scale` is blamed.
    #[test]
    fn carried_differences_are_not_blamed_only_the_origin() {
        let (g, p, i) = cancel_chain();
        let fault = |g: &Graph| Fault::Scale(named(g, "scale"), 1.01);
        let (c, cpu, other) = node_values(&g, &p, &i, &fault(&g));
        for label in ["cancel", "gain"] {
            let n = c.node(named(&c, label));
            let (a, b) = (cpu[n.id.index()].as_ref(), other[n.id.index()].as_ref());
            let e = compare_tensors(&c, n.id, Device::Wgpu, a.unwrap(), b.unwrap(), true);
            assert!(e.rel > 1.0, "{label} must differ: {}", e.rel);
            let ins: Vec<&Tensor> = n
                .inputs
                .iter()
                .map(|i| other[i.index()].as_ref().unwrap())
                .collect();
            let r = rlx_cpu::eval_op(&n.op, &ins, &n.shape).unwrap();
            let k = compare_tensors(&c, n.id, Device::Wgpu, &r, b.unwrap(), true);
            assert!(k.rel < 1e-6, "{label} must agree on replay: {}", k.rel);
        }
        let d = verdict(&g, &p, &i, fault, 2e-3);
        assert!(d.suspect, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "kernel_bug_candidate", "{}", l.message);
        assert_eq!(l.label, "scale", "{}", l.message);
        // The origin within tol (5e-4) but amplified downstream: nobody is blamed.
        let d = verdict(
            &g,
            &p,
            &i,
            |g| Fault::Scale(named(g, "scale"), 1.0 + 5e-4),
            2e-3,
        );
        assert!(d.max_rel > 2e-3, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.kind, "accumulated", "{}", l.message);
        assert!(!d.suspect, "{d}");
    }

    /// (d) A NaN or an Inf on one side only is always suspect, whatever the tolerance, and
    /// named at the node that made it.
    #[test]
    fn nonfinite_on_one_side_is_always_suspect_and_named() {
        let (g, p, i) = cancel_chain();
        for (label, bad) in [("cancel", f32::NAN), ("scale", f32::INFINITY)] {
            let d = verdict(
                &g,
                &p,
                &i,
                |g| Fault::NonFinite(named(g, label), 2, bad),
                1e30,
            );
            assert!(d.suspect, "{d}");
            assert_eq!(d.nonfinite.len(), 1, "{d}");
            assert_eq!(d.nonfinite[0].index, 2);
            let l = d.localization.as_ref().expect("localized");
            assert_eq!(l.kind, "nonfinite", "{}", l.message);
            assert_eq!(l.label, label, "{}", l.message);
        }
    }

    /// Just under tol_rel at the output is round-off; just over is suspect and named. The
    /// output threshold is `max_rel > tol_rel` with the contract's floor, `|cpu| + 1e-6`:
    /// `gain` scaled by `1 + f·tol` gives max_rel = f·tol·|g|/(|g| + 1e-6), |g| ≤ 1.5e-3.
    #[test]
    fn just_under_tol_is_not_flagged_just_over_is() {
        let (g, p, i) = cancel_chain();
        let tol = 2e-3;
        let gain = |f: f64| move |g: &Graph| Fault::Scale(named(g, "gain"), (1.0 + f * tol) as f32);
        let d = verdict(&g, &p, &i, gain(0.9), tol);
        assert!(d.max_rel > 0.85 * tol && d.max_rel < tol, "{}", d.max_rel);
        assert!(!d.suspect, "{d}");
        assert!(d.localization.is_none());
        let d = verdict(&g, &p, &i, gain(1.1), tol);
        assert!(d.max_rel > tol && d.max_rel < 1.15 * tol, "{}", d.max_rel);
        assert!(d.suspect, "{d}");
        let l = d.localization.as_ref().expect("localized");
        assert_eq!(l.label, "gain", "{}", l.message);
        // The output floor is the fixed 1e-6, not scale-aware: element 0 of `gain` is
        // 3·2^-14 = 1.83e-4, so its rel is (f·tol)·1.83e-4/(1.83e-4 + 1e-6), 0.5% under f·tol.
        let want = 1.1 * tol * (3.0 / 16384.0) / (3.0 / 16384.0 + 1e-6);
        let got = {
            let (c, cpu, other) = node_values(&g, &p, &i, &gain(1.1)(&g));
            let id = named(&c, "gain").index();
            let (a, b) = (cpu[id].as_ref().unwrap(), other[id].as_ref().unwrap());
            let (a, b) = (a.data().to_f64_vec()[0], b.data().to_f64_vec()[0]);
            (a - b).abs() / (a.abs() + REL_FLOOR)
        };
        assert!((got - want).abs() < 1e-3 * want, "{got} vs {want}");
    }

    #[test]
    fn perturbed_backend_is_flagged_and_localized_to_its_node() {
        // A graph with a chain after the perturbed node, so downstream nodes diverge too and
        // the localizer must pick the first one.
        let mut g = Graph::new("chain");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let w = g.param("w", Shape::new(&[3, 2], DType::F32));
        let m = g.matmul(x, w, Shape::new(&[2, 2], DType::F32));
        g.set_name(m, "layer1.attn.qk");
        let e = g.unary(UnaryOp::Exp, m, Shape::new(&[2, 2], DType::F32));
        let r = g.activation(Activation::Relu, e, Shape::new(&[2, 2], DType::F32));
        g.set_outputs(vec![r]);
        let (_, p, i) = mlp();
        let compiled = compile(g.clone(), &DivergenceOptions::default().compile)
            .unwrap()
            .graph;
        let feeds = order_inputs(&compiled, &i).unwrap();
        let mut cpu = CpuExecutor::new(compiled.clone()).unwrap();
        cpu.set_param("w", p[0].1.clone()).unwrap();
        let cpu_out = cpu.run(&feeds, None).unwrap();
        let mm = compiled
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::MatMul))
            .unwrap()
            .id;
        let mut be = StandIn::new(compiled.clone(), p.clone(), Fault::Scale(mm, 1.01));
        let out = be.run_feeds(&feeds).unwrap();
        let d = compare_outputs(&compiled, Device::Wgpu, &cpu_out, &out, 2e-3);
        assert!(d.suspect, "{d}");
        let mut cpu_nodes = vec![None; compiled.len()];
        cpu.run_observed(&feeds, None, &mut |id, t| {
            cpu_nodes[id.index()] = Some(t.clone())
        })
        .unwrap();
        let refs: Vec<&Tensor> = feeds.iter().collect();
        let other = be.run_all(&refs).unwrap();
        let l = localize(&compiled, Device::Wgpu, &cpu_nodes, &other, 2e-3);
        assert_eq!(l.kind, "kernel_bug_candidate");
        assert_eq!(l.node, mm.to_string());
        assert!(
            l.message.contains("MatMul \"layer1.attn.qk\""),
            "{}",
            l.message
        );
        assert_eq!(l.inputs_rel, 0.0);
        // Scaling by 1.01 is a relative error of 1e-2 (scale-aware floor only lowers it).
        assert!(
            l.error.rel > 5e-3 && l.error.rel <= 1e-2 + 1e-9,
            "{}",
            l.error.rel
        );
        // An unperturbed "backend" localizes nothing and is round-off.
        let out = StandIn::new(compiled.clone(), p.clone(), Fault::Scale(mm, 1.0))
            .run_feeds(&feeds)
            .unwrap();
        assert!(!compare_outputs(&compiled, Device::Wgpu, &cpu_out, &out, 2e-3).suspect);
    }
}
