//! `rlx reduce`: shrink an ONNX model to the smallest subgraph that still fails the same way
//! (a NaN or Inf created at the same node, the same first diverging node on a backend, or an
//! error with the same text), and write it as a plain ONNX repro with its inputs.
//!
//! How: run the model once and name the failing node (the culprit: the NaN localizer's first
//! NaN culprit, the first Inf created, the divergence diagnostic's first diverging node, or the
//! node an error names). Keep the culprit and its ancestors; every tensor that enters the kept
//! nodes from a node that is not kept becomes a graph input fed with its value recorded from a
//! run of the full model (or an initializer, for values that depend on no graph input and for
//! small integer tensors, which the importer may need as constants: shapes, axes). Then
//! delta-debug (ddmin) the ancestors, keeping a candidate only when it, run alone, still fails
//! the same way at a node of the same ONNX name. Everything happens on the `ModelProto`, so
//! the repro is an `.onnx` file any tool loads.
//!
//! (One file over 1,000 lines: the pipeline cut → record → shrink → write is read top to
//! bottom, the shrinking loop and the repro writer sharing the culprit's records and the ONNX
//! rewriting; about a third is tests. Split when a second user of its ONNX editing appears.)

use crate::load::{load, ModelArgs};
use crate::npy::write_npy;
use crate::run::{model_path, sanitize};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use prost::Message;
use rlx_ir::numeric_check::{BadKind, DebugMode};
use rlx_ir::{DType, Tensor, TensorData};
use rlx_onnx_import::proto::{
    self, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto,
};
use rlx_onnx_import::tensor::{onnx_dtype, tensor_from_proto, tensor_to_proto};
use rlx_onnx_import::ImportOptions;
use rlx_runtime::dist::diagnostics::{backend_divergence_with, DivergenceOptions};
use rlx_runtime::{Device, Session};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Shrink a model to the smallest subgraph that still fails the same way; write a repro folder.
///
/// The repro is DIR/model.onnx, DIR/input_<name>.npy and DIR/README.md (`rlx run DIR`
/// reproduces it). MODEL is an ONNX model (.onnx, or a folder holding model.onnx).
///
///   --until nan              the first NaN created (the node RLX_DEBUG_NANS names)
///   --until inf              the first +inf/-inf created (as RLX_DEBUG_NANS=strict names it)
///   --until diverge[:BACKEND]  the first node where BACKEND (default: the first live one
///                            of wgpu, cuda) diverges from the CPU (as `rlx diverge` names it)
///   --until error[:TEXT]     an import, compile or run error whose message contains TEXT
///
/// Exit status: 0 when a repro was written; 1 when the model does not fail that way on these
/// inputs (nothing is written), or on an error; 2 for a usage error.
#[derive(Args, Debug, Clone)]
#[command(verbatim_doc_comment, mut_arg("model", |a| a.help(MODEL_HELP)))]
pub struct ReduceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The failure to keep: nan, inf, diverge[:BACKEND] or error[:TEXT].
    #[arg(long, value_name = "KIND", value_parser = parse_until)]
    pub until: Until,
    /// Folder for the repro (model.onnx, input_<name>.npy, README.md).
    #[arg(long, short = 'o', value_name = "DIR", default_value = "repro")]
    pub output_dir: PathBuf,
    /// Replace the repro files in an existing DIR.
    #[arg(long)]
    pub force: bool,
    /// Relative tolerance for --until diverge (as `rlx diverge --tol-rel`).
    #[arg(
        long,
        default_value_t = 2e-3,
        value_name = "TOL",
        allow_negative_numbers = true
    )]
    pub tol_rel: f64,
    /// No notes on stderr (where each input came from, progress).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl ReduceArgs {
    /// Parse what follows `rlx reduce` on a command line (see [`crate::parse_args`]).
    pub fn try_parse_from<I, T>(args: I) -> Result<ReduceArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        crate::parse_args("rlx reduce", args)
    }
}

/// MODEL's help for `rlx reduce` and `rlx precision` (they take ONNX only, not .pt2).
pub(crate) const MODEL_HELP: &str =
    "ONNX model file (.onnx), or a folder holding model.onnx (and optional input_<name>.npy files)";

/// What "fails the same way" means.
#[derive(Debug, Clone, PartialEq)]
pub enum Until {
    Nan,
    Inf,
    Diverge(Option<Device>),
    Error(String),
}

impl std::fmt::Display for Until {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Until::Nan => f.write_str("nan"),
            Until::Inf => f.write_str("inf"),
            Until::Diverge(None) => f.write_str("diverge"),
            Until::Diverge(Some(d)) => write!(f, "diverge:{d}"),
            Until::Error(t) if t.is_empty() => f.write_str("error"),
            Until::Error(t) => write!(f, "error:{t}"),
        }
    }
}

/// Parse `--until`: `nan`, `inf`, `diverge[:BACKEND]`, `error[:TEXT]`.
pub fn parse_until(s: &str) -> Result<Until, String> {
    let (kind, arg) = match s.split_once(':') {
        Some((k, a)) => (k, Some(a)),
        None => (s, None),
    };
    match (kind.trim().to_ascii_lowercase().as_str(), arg) {
        ("nan", None) => Ok(Until::Nan),
        ("inf", None) => Ok(Until::Inf),
        ("diverge", None) => Ok(Until::Diverge(None)),
        ("diverge", Some(b)) => match crate::compile::parse_device(b) {
            Ok(Device::Cpu) => Err(
                "diverge:cpu: the CPU is the oracle; name the backend compared with it (diverge:wgpu)"
                    .into(),
            ),
            Ok(d) => Ok(Until::Diverge(Some(d))),
            Err(_) => Err(format!(
                "diverge:{b}: unknown backend \"{b}\" (known: wgpu, cuda)"
            )),
        },
        ("error", a) => Ok(Until::Error(a.unwrap_or("").to_string())),
        ("nan" | "inf", Some(a)) => Err(format!("{kind}:{a}: {kind} takes no argument")),
        _ => Err(format!(
            "unknown kind \"{s}\" (expected nan, inf, diverge[:BACKEND] or error[:TEXT])"
        )),
    }
}

/// A failure found by one run.
#[derive(Debug, Clone)]
struct Failure {
    /// The ONNX label (node name, else first output name) of the node it happened at, when
    /// known (an error that names no node has none).
    label: Option<String>,
    /// One line for people.
    line: String,
}

/// The original model, decoded, with the bookkeeping the reducer needs.
pub(crate) struct Onnx {
    pub(crate) model: ModelProto,
    /// The model's folder (external data is resolved against it).
    pub(crate) base: PathBuf,
    /// Tensor name → index of the node producing it.
    pub(crate) producer: HashMap<String, usize>,
    /// Initializer name → index.
    pub(crate) inits: HashMap<String, usize>,
    /// Per node: every tensor name it reads (its inputs and outer-scope names its subgraphs use).
    pub(crate) uses: Vec<Vec<String>>,
    /// Tensors whose value depends on a graph input (the others are constants).
    pub(crate) dynamic: HashSet<String>,
    /// Per node: its label (as the importer gives it).
    pub(crate) labels: Vec<String>,
}

pub(crate) fn graph(m: &ModelProto) -> &GraphProto {
    m.graph.as_ref().expect("checked when opened")
}

/// Outer-scope names a subgraph reads (names used by its nodes that it does not define).
fn outer_names(g: &GraphProto, out: &mut Vec<String>) {
    let mut defined: HashSet<&str> = g.input.iter().map(|v| v.name.as_str()).collect();
    defined.extend(g.initializer.iter().map(|t| t.name.as_str()));
    for n in &g.node {
        let mut used = vec![];
        node_uses(n, &mut used);
        for u in used {
            if !u.is_empty() && !defined.contains(u.as_str()) && !out.contains(&u) {
                out.push(u);
            }
        }
        defined.extend(n.output.iter().map(String::as_str));
    }
}

fn node_uses(n: &NodeProto, out: &mut Vec<String>) {
    for i in &n.input {
        if !i.is_empty() && !out.contains(i) {
            out.push(i.clone());
        }
    }
    for a in &n.attribute {
        for g in a.g.iter().chain(a.graphs.iter()) {
            outer_names(g, out);
        }
    }
}

/// The label the importer gives a node: its name, else its first output's name.
pub(crate) fn node_label(n: &NodeProto) -> String {
    if !n.name.is_empty() {
        return n.name.clone();
    }
    n.output
        .iter()
        .find(|o| !o.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("<unnamed {}>", n.op_type))
}

impl Onnx {
    pub(crate) fn open(path: &Path) -> Result<Onnx> {
        let bytes = crate::run::read_regular_file(path)?;
        let model = ModelProto::decode(&bytes[..])
            .map_err(|e| anyhow!("{}: not a valid ONNX model ({e})", path.display()))?;
        let Some(g) = model.graph.as_ref() else {
            bail!("{}: the model has no graph", path.display());
        };
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let inits: HashMap<String, usize> = g
            .initializer
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut producer = HashMap::new();
        let mut uses = vec![];
        let mut dynamic: HashSet<String> = g
            .input
            .iter()
            .filter(|v| !inits.contains_key(&v.name))
            .map(|v| v.name.clone())
            .collect();
        for (k, n) in g.node.iter().enumerate() {
            let mut u = vec![];
            node_uses(n, &mut u);
            let dynamic_here = u.iter().any(|x| dynamic.contains(x));
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                producer.insert(o.clone(), k);
                if dynamic_here {
                    dynamic.insert(o.clone());
                }
            }
            uses.push(u);
        }
        let labels = g.node.iter().map(node_label).collect();
        Ok(Onnx {
            model,
            base,
            producer,
            inits,
            uses,
            dynamic,
            labels,
        })
    }

    pub(crate) fn nodes(&self) -> &[NodeProto] {
        &graph(&self.model).node
    }

    /// Every node the culprit depends on (not the culprit itself).
    fn ancestors(&self, culprit: usize) -> BTreeSet<usize> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![culprit];
        while let Some(k) = stack.pop() {
            for u in &self.uses[k] {
                if let Some(&p) = self.producer.get(u) {
                    if seen.insert(p) {
                        stack.push(p);
                    }
                }
            }
        }
        seen
    }

    /// The nodes of `kept` the culprit still reaches through kept nodes, plus the culprit.
    fn closure(&self, kept: &BTreeSet<usize>, culprit: usize) -> BTreeSet<usize> {
        let mut seen = BTreeSet::from([culprit]);
        let mut stack = vec![culprit];
        while let Some(k) = stack.pop() {
            for u in &self.uses[k] {
                if let Some(&p) = self.producer.get(u) {
                    if kept.contains(&p) && seen.insert(p) {
                        stack.push(p);
                    }
                }
            }
        }
        seen
    }

    /// Tensors the nodes `e` read that no node of `e` produces and that are not initializers
    /// or graph inputs of the original: the cut, fed with recorded values.
    fn cuts(&self, e: &BTreeSet<usize>) -> Vec<String> {
        let mut out: Vec<String> = vec![];
        for &k in e {
            for u in &self.uses[k] {
                if let Some(p) = self.producer.get(u) {
                    if !e.contains(p) && !out.contains(u) {
                        out.push(u.clone());
                    }
                }
            }
        }
        out
    }

    /// The declared type of a tensor (graph input/output or value_info), if any.
    fn declared(&self, name: &str) -> Option<ValueInfoProto> {
        let g = graph(&self.model);
        g.value_info
            .iter()
            .chain(&g.output)
            .chain(&g.input)
            .find(|v| v.name == name && v.r#type.is_some())
            .cloned()
    }

    /// An initializer with its data inline (external data read from the model's folder).
    pub(crate) fn inline_init(&self, t: &TensorProto) -> Result<TensorProto> {
        if t.data_location != proto::DATA_LOCATION_EXTERNAL {
            return Ok(t.clone());
        }
        let v = tensor_from_proto(t, Some(&self.base))
            .map_err(|e| anyhow!("initializer \"{}\": {e}", t.name))?;
        Ok(tensor_to_proto(&t.name, &v))
    }
}

/// A value info with a static tensor type.
pub(crate) fn tensor_vi(name: &str, dtype: DType, dims: &[usize]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TypeProtoTensor {
                elem_type: onnx_dtype(dtype),
                shape: Some(proto::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| proto::Dimension {
                            value: Some(proto::DimValue::DimValue(d as i64)),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            }),
            denotation: String::new(),
        }),
    }
}

/// Where a repro input comes from.
#[derive(Debug, Clone)]
enum Source {
    /// An input of the original model.
    Original,
    /// The value the tensor had in the full run, made a graph input.
    Recorded,
    /// The value the tensor had in the full run, made an initializer.
    Constant,
}

/// One candidate subgraph: the model and its feeds.
struct Candidate {
    model: ModelProto,
    feeds: Vec<(String, Tensor)>,
    sources: Vec<(String, Source)>,
}

/// Can `t` be a graph input (written as .npy and read back with the same dtype)?
fn npy_dtype(t: &Tensor) -> bool {
    !matches!(t.data(), TensorData::BF16(_) | TensorData::Narrow { .. })
}

/// Make the candidate model for the kept nodes `e` (a closure containing `culprit`).
fn build(
    o: &Onnx,
    e: &BTreeSet<usize>,
    culprit: usize,
    values: &HashMap<String, Tensor>,
    feeds: &HashMap<String, Tensor>,
    inline: bool,
) -> Result<Candidate> {
    let g0 = graph(&o.model);
    let mut g = GraphProto {
        name: format!("{}_reduced", g0.name),
        ..Default::default()
    };
    let mut sources = vec![];
    let mut in_feeds = vec![];
    let mut produced: HashSet<&str> = HashSet::new();
    for &k in e {
        g.node.push(o.nodes()[k].clone());
        produced.extend(o.nodes()[k].output.iter().map(String::as_str));
    }
    let mut seen: HashSet<String> = HashSet::new();
    for &k in e {
        for u in &o.uses[k] {
            if produced.contains(u.as_str()) || !seen.insert(u.clone()) {
                continue;
            }
            if let Some(&i) = o.inits.get(u) {
                let t = &g0.initializer[i];
                g.initializer
                    .push(if inline { o.inline_init(t)? } else { t.clone() });
            } else if let Some(t) = feeds.get(u) {
                g.input.push(tensor_vi(u, t.dtype(), t.dims()));
                in_feeds.push((u.clone(), t.clone()));
                sources.push((u.clone(), Source::Original));
            } else if o.producer.contains_key(u) {
                let t = values
                    .get(u)
                    .ok_or_else(|| anyhow!("no recorded value for \"{u}\""))?;
                let small_int = !t.dtype().is_float() && t.numel() <= 64;
                if !o.dynamic.contains(u) || small_int || !npy_dtype(t) {
                    g.initializer.push(tensor_to_proto(u, t));
                    sources.push((u.clone(), Source::Constant));
                } else {
                    g.input.push(tensor_vi(u, t.dtype(), t.dims()));
                    in_feeds.push((u.clone(), t.clone()));
                    sources.push((u.clone(), Source::Recorded));
                }
            } else {
                bail!("tensor \"{u}\" is read by a node but has no producer, initializer or input");
            }
        }
    }
    for out in o.nodes()[culprit].output.iter().filter(|x| !x.is_empty()) {
        let vi = match values.get(out) {
            Some(t) => tensor_vi(out, t.dtype(), t.dims()),
            None => o.declared(out).unwrap_or_else(|| ValueInfoProto {
                name: out.clone(),
                r#type: None,
            }),
        };
        g.output.push(vi);
    }
    let outs: HashSet<&str> = g.output.iter().map(|v| v.name.as_str()).collect();
    g.value_info = g0
        .value_info
        .iter()
        .filter(|v| produced.contains(v.name.as_str()) && !outs.contains(v.name.as_str()))
        .cloned()
        .collect();
    let model = ModelProto {
        graph: Some(g),
        producer_name: "rlx reduce".into(),
        ..o.model.clone()
    };
    Ok(Candidate {
        model,
        feeds: in_feeds,
        sources,
    })
}

/// Import a model from bytes with static input shapes taken from `feeds`.
pub(crate) fn import(
    bytes: &[u8],
    base: &Path,
    feeds: &[(String, Tensor)],
) -> Result<rlx_ir::Graph, anyhow::Error> {
    let opts = ImportOptions {
        input_shapes: feeds
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect(),
        ..Default::default()
    };
    rlx_onnx_import::import_onnx_bytes(bytes, Some(base), &opts).map_err(|e| anyhow!("{e}"))
}

/// Run `model` (restricted to what `names` need) on the CPU and return the values of the
/// tensors `names`, the graph's inputs fed by `feeds`.
pub(crate) fn record(
    o: &Onnx,
    feeds: &[(String, Tensor)],
    names: &[String],
) -> Result<HashMap<String, Tensor>> {
    if names.is_empty() {
        return Ok(HashMap::new());
    }
    let mut keep = BTreeSet::new();
    for n in names {
        if let Some(&p) = o.producer.get(n) {
            keep.insert(p);
            keep.extend(o.ancestors(p));
        }
    }
    let mut m = o.model.clone();
    let g = m.graph.as_mut().expect("has a graph");
    g.node = keep.iter().map(|&k| o.nodes()[k].clone()).collect();
    g.output = names
        .iter()
        .map(|n| ValueInfoProto {
            name: n.clone(),
            r#type: None,
        })
        .collect();
    let graph =
        import(&m.encode_to_vec(), &o.base, feeds).context("recording the values at the cut")?;
    let mut s = Session::new(Device::Cpu)
        .try_compile(graph)
        .map_err(|e| anyhow!("recording the values at the cut: {e}"))?;
    s.set_debug_mode(Some(DebugMode::Off));
    s.set_print_reports(false);
    s.set_value_printer(Some(rlx_runtime::printer::PrinterConfig::off()));
    let outs = s
        .run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
        .map_err(|e| anyhow!("recording the values at the cut: {e}"))?;
    if outs.len() != names.len() {
        bail!(
            "recording the values at the cut: {} outputs for {} tensors",
            outs.len(),
            names.len()
        );
    }
    Ok(names.iter().cloned().zip(outs).collect())
}

/// The ONNX label an error message names (the longest one it quotes, else contains).
pub(crate) fn label_in(msg: &str, labels: &[String]) -> Option<String> {
    let best = |quoted: bool| {
        labels
            .iter()
            .filter(|l| {
                !l.is_empty()
                    && if quoted {
                        msg.contains(&format!("\"{l}\""))
                    } else {
                        msg.contains(l.as_str())
                    }
            })
            .max_by_key(|l| l.len())
            .cloned()
    };
    best(true).or_else(|| best(false))
}

/// How the reducer runs a model and what it looks for.
struct Checker {
    until: Until,
    device: Device,
    tol_rel: f64,
}

impl Checker {
    /// Run the model (`bytes`, or an already imported `graph`) once and say whether and where
    /// it fails the way asked. `Err` means it could not run at all (except for `error`).
    fn probe(
        &self,
        o: &Onnx,
        graph: Result<rlx_ir::Graph>,
        feeds: &[(String, Tensor)],
    ) -> Result<Option<Failure>> {
        if let Until::Error(text) = &self.until {
            let r = (|| -> Result<()> {
                let mut s = Session::new(Device::Cpu)
                    .try_compile(graph?)
                    .map_err(|e| anyhow!("{e}"))?;
                s.set_debug_mode(Some(DebugMode::Off));
                s.set_value_printer(Some(rlx_runtime::printer::PrinterConfig::off()));
                s.run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
                    .map_err(|e| anyhow!("{e}"))?;
                Ok(())
            })();
            return Ok(match r {
                Err(e) if format!("{e:#}").contains(text.as_str()) => {
                    let msg = format!("{e:#}");
                    Some(Failure {
                        label: label_in(&msg, &o.labels),
                        line: format!("error: {msg}"),
                    })
                }
                _ => None,
            });
        }
        let graph = graph?;
        if let Until::Diverge(_) = self.until {
            let opts = DivergenceOptions {
                tol_rel: self.tol_rel,
                backends: Some(vec![self.device]),
                localize: true,
                ..Default::default()
            };
            let rep =
                backend_divergence_with(&graph, &[], feeds, &opts).map_err(|e| anyhow!("{e}"))?;
            let Some(d) = rep.first().filter(|d| d.suspect) else {
                return Ok(None);
            };
            let Some(l) = d.localization.as_ref().filter(|l| l.kind != "accumulated") else {
                return Ok(None);
            };
            return Ok(Some(Failure {
                label: Some(l.label.clone()),
                line: format!("[{}] {}", self.device, l.message),
            }));
        }
        let mut s = Session::new(Device::Cpu)
            .try_compile(graph)
            .map_err(|e| anyhow!("{e}"))?;
        s.set_value_printer(Some(rlx_runtime::printer::PrinterConfig::off()));
        let want_nan = self.until == Until::Nan;
        s.set_debug_mode(Some(if want_nan {
            DebugMode::Warn
        } else {
            DebugMode::Strict
        }));
        s.set_print_reports(false);
        s.run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
            .map_err(|e| anyhow!("{e}"))?;
        let first = s.nan_reports().iter().find(|r| {
            r.is_culprit()
                && if want_nan {
                    r.kind == BadKind::NaN
                } else {
                    r.kind != BadKind::NaN
                }
        });
        Ok(first.map(|r| Failure {
            label: Some(r.label.clone()),
            line: format!(
                "{} at index {} of {} {} \"{}\"",
                r.kind, r.index, r.node, r.op, r.label
            ),
        }))
    }

    /// Does candidate `c` fail the same way, at `label`?
    fn same(&self, o: &Onnx, c: &Candidate, label: &str) -> bool {
        let bytes = c.model.encode_to_vec();
        let g = import(&bytes, &o.base, &c.feeds);
        matches!(self.probe(o, g, &c.feeds), Ok(Some(f)) if f.label.as_deref() == Some(label))
    }
}

/// A progress line on stderr (only when it is a terminal).
struct Progress {
    on: bool,
    total: usize,
    tests: usize,
}

impl Progress {
    fn show(&mut self, left: usize) {
        self.tests += 1;
        if !self.on {
            return;
        }
        let done = self.total.saturating_sub(left);
        let w = 30;
        let fill = (done * w).checked_div(self.total).unwrap_or(w).min(w);
        eprint!(
            "\rrlx reduce: [{}{}] {} tests, {left} of {} nodes left   ",
            "#".repeat(fill),
            "-".repeat(w - fill),
            self.tests,
            self.total
        );
        let _ = std::io::stderr().flush();
    }

    fn done(&self) {
        if self.on {
            eprintln!();
        }
    }
}

/// Zeller's ddmin over `items`: a 1-minimal subset for which `test` holds (`test(items)`
/// must hold). `test` may return a smaller set it really used (the closure), which replaces
/// the subset.
pub fn ddmin(
    items: Vec<usize>,
    test: &mut dyn FnMut(&[usize]) -> Option<Vec<usize>>,
) -> Vec<usize> {
    let mut c = items;
    let mut n = 2usize;
    while c.len() >= 2 {
        let chunk = c.len().div_ceil(n);
        let parts: Vec<Vec<usize>> = c.chunks(chunk).map(<[usize]>::to_vec).collect();
        let mut next = None;
        for p in &parts {
            if let Some(r) = test(p) {
                next = Some((r, 2));
                break;
            }
        }
        if next.is_none() && parts.len() > 2 {
            for p in &parts {
                let comp: Vec<usize> = c.iter().copied().filter(|x| !p.contains(x)).collect();
                if let Some(r) = test(&comp) {
                    next = Some((r, (n - 1).max(2)));
                    break;
                }
            }
        }
        match next {
            Some((r, k)) => {
                c = r;
                n = k;
            }
            None if n >= c.len() => break,
            None => n = (n * 2).min(c.len()),
        }
    }
    c
}

/// What a reduction produced.
pub struct Reduced {
    pub model: ModelProto,
    pub feeds: Vec<(String, Tensor)>,
    pub kept: Vec<(String, String)>,
    pub culprit: String,
    pub failure: String,
    pub tests: usize,
}

pub(crate) fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// What [`run`] did.
pub enum Outcome {
    /// The repro was written to `--output-dir` and checked to reproduce when loaded back.
    Written(Box<Reduced>),
    /// The model does not fail that way on these inputs; nothing was written. The line says
    /// so (the CLI prints it on stdout and exits 1).
    NotFailing(String),
}

/// `rlx reduce` without the process around it (the Python package's `rlx.reduce`): reduce
/// `a.model` and write the repro to `a.output_dir`. The lines the CLI prints on stdout go to
/// `say`, in order; notes on stderr follow `a.quiet`.
///
/// Errors: the CLI's (`rlx: error: ...` there): an existing folder without `a.force`, a
/// model that cannot be read or imported, inputs that do not fit it, a repro that does not
/// reproduce. Nothing is written when the model does not fail the way asked.
pub fn run(a: &ReduceArgs, say: &mut dyn FnMut(&str)) -> Result<Outcome> {
    let t0 = Instant::now();
    let path = model_path(&a.model.model);
    if rlx_torch_import::is_pt2(&path) {
        bail!(
            "{}: rlx reduce does not reduce .pt2 programs yet; export the model to ONNX (torch.onnx.export) and reduce that",
            path.display()
        );
    }
    if crate::compile::is_package(&a.model.model) {
        bail!(
            "{}",
            crate::compile::package_refusal(&a.model.model, "rlx reduce cuts an ONNX model")
        );
    }
    let dir = &a.output_dir;
    if dir.exists() && !a.force {
        bail!(
            "{} already exists; pass --force to replace the repro in it, or -o another folder",
            dir.display()
        );
    }
    if dir.exists() && !dir.is_dir() {
        bail!("{} is a file, not a directory", dir.display());
    }
    let model_dir = path.parent().map(crate::npy::resolved);
    if model_dir.is_some_and(|m| m == crate::npy::resolved(dir)) {
        bail!(
            "-o {}: is the folder of the model being reduced ({}); writing the repro there would replace it: -o another folder",
            dir.display(),
            path.display()
        );
    }
    if !(a.tol_rel > 0.0 && a.tol_rel.is_finite()) {
        bail!("--tol-rel {}: must be a positive number", a.tol_rel);
    }
    let device = match &a.until {
        Until::Diverge(Some(d)) => {
            if !rlx_runtime::device_available(*d) {
                bail!(
                    "--until {}: {}",
                    a.until,
                    rlx_runtime::RuntimeError::DeviceUnavailable(*d)
                );
            }
            *d
        }
        Until::Diverge(None) => [Device::Wgpu, Device::Cuda]
            .into_iter()
            .find(|d| rlx_runtime::device_available(*d))
            .ok_or_else(|| {
                anyhow!(
                    "--until diverge: no backend but the CPU is live here (`rlx devices` says why)"
                )
            })?,
        _ => Device::Cpu,
    };
    let checker = Checker {
        until: a.until.clone(),
        device,
        tol_rel: a.tol_rel,
    };
    let o = Onnx::open(&path)?;
    let n_nodes = o.nodes().len();
    let model_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);

    // The full run: inputs as `rlx run` binds them.
    let (full, feeds) = match (&a.until, load(&a.model, a.quiet)) {
        (_, Ok(l)) => (Ok(l.graph), l.feeds),
        (Until::Error(_), Err(e)) => {
            // The import itself fails: feed the inputs' files or generated values as given.
            let feeds = error_feeds(a)?;
            (Err(e), feeds)
        }
        (_, Err(e)) => return Err(e),
    };
    let Some(failure) = checker.probe(&o, full, &feeds)? else {
        return Ok(Outcome::NotFailing(format!(
            "rlx reduce: {} does not fail with --until {} on these inputs; nothing written",
            path.display(),
            a.until
        )));
    };
    let culprit = match &failure.label {
        Some(l) => o.labels.iter().position(|x| x == l),
        None => None,
    };
    let culprit = match culprit {
        Some(c) => c,
        None if matches!(a.until, Until::Error(_)) => first_failing_prefix(&o, &checker, &feeds)?
            .ok_or_else(|| {
                anyhow!(
                    "{}: the error ({}) names no node of the model, and no prefix of its nodes reproduces it",
                    path.display(),
                    failure.line
                )
            })?,
        None => {
            let g = graph(&o.model);
            let name = failure.label.clone().unwrap_or_default();
            let leaf = g.input.iter().any(|v| v.name == name)
                || g.initializer.iter().any(|t| t.name == name);
            if leaf {
                bail!(
                    "{}: {}: the value is already in the graph input or initializer \"{name}\" (the data, not a node, holds it); nothing to reduce",
                    path.display(),
                    failure.line
                )
            }
            bail!(
                "{}: {}: \"{name}\" is not a node of the main graph (a node inside a subgraph?); rlx reduce cannot cut there yet",
                path.display(),
                failure.line
            )
        }
    };
    let label = o.labels[culprit].clone();
    if !a.quiet {
        eprintln!(
            "rlx reduce: the full model fails: {}\nrlx reduce: culprit {} \"{label}\"; reducing it and its {} ancestor node(s)",
            failure.line,
            o.nodes()[culprit].op_type,
            o.ancestors(culprit).len()
        );
    }
    let feed_map: HashMap<String, Tensor> = feeds.iter().cloned().collect();
    let ancestors: Vec<usize> = o.ancestors(culprit).into_iter().collect();
    let mut progress = Progress {
        on: !a.quiet && std::io::stderr().is_terminal(),
        total: ancestors.len() + 1,
        tests: 0,
    };
    // Values: the culprit's own inputs first (the likeliest repro is the culprit alone).
    let alone = BTreeSet::from([culprit]);
    let mut values = record(&o, &feeds, &o.cuts(&alone))?;
    let outs: Vec<String> = o.nodes()[culprit]
        .output
        .iter()
        .filter(|x| !x.is_empty())
        .cloned()
        .collect();
    if !matches!(a.until, Until::Error(_)) {
        values.extend(record(&o, &feeds, &outs)?);
    }
    let mut test = |kept: &BTreeSet<usize>, values: &HashMap<String, Tensor>| -> bool {
        let e = o.closure(kept, culprit);
        progress.show(e.len());
        match build(&o, &e, culprit, values, &feed_map, false) {
            Ok(c) => checker.same(&o, &c, &label),
            Err(_) => false,
        }
    };
    let kept: BTreeSet<usize> = if test(&alone, &values) {
        alone
    } else {
        // Record every value the ancestors could need, once.
        let all: BTreeSet<usize> = ancestors.iter().copied().chain([culprit]).collect();
        let mut need: Vec<String> = vec![];
        for &k in &all {
            for u in &o.uses[k] {
                if o.producer.contains_key(u) && !values.contains_key(u) && !need.contains(u) {
                    need.push(u.clone());
                }
            }
        }
        values.extend(record(&o, &feeds, &need)?);
        if !test(&all, &values) {
            progress.done();
            bail!(
                "the culprit \"{label}\" with all its ancestors does not fail the same way when run alone (the failure depends on nodes that are not its ancestors); nothing written"
            );
        }
        let mut t = |s: &[usize]| -> Option<Vec<usize>> {
            let kept: BTreeSet<usize> = s.iter().copied().chain([culprit]).collect();
            if test(&kept, &values) {
                Some(
                    o.closure(&kept, culprit)
                        .into_iter()
                        .filter(|&k| k != culprit)
                        .collect(),
                )
            } else {
                None
            }
        };
        let min = ddmin(ancestors.clone(), &mut t);
        o.closure(&min.into_iter().collect(), culprit)
    };
    progress.done();
    let tests = progress.tests;
    let cand = build(&o, &kept, culprit, &values, &feed_map, true)?;

    // Write, then check that the files on disk reproduce it.
    let names: Vec<String> = cand.feeds.iter().map(|(n, _)| n.clone()).collect();
    let files: Vec<String> = names.iter().map(|n| sanitize(n)).collect();
    for (i, f) in files.iter().enumerate() {
        if files[..i].contains(f) {
            bail!(
                "repro inputs \"{}\" and \"{}\" would both be written as input_{f}.npy",
                names[files.iter().position(|x| x == f).unwrap_or(0)],
                names[i]
            );
        }
    }
    crate::npy::create_output_dir(dir)?;
    if a.force {
        for e in std::fs::read_dir(dir)?.flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            if f.starts_with("input_") && f.ends_with(".npy") && e.path().is_file() {
                std::fs::remove_file(e.path())
                    .with_context(|| format!("cannot remove {}", e.path().display()))?;
            }
        }
    }
    let bytes = cand.model.encode_to_vec();
    crate::npy::write_replacing(&dir.join("model.onnx"), |mut f| {
        f.write_all(&bytes)?;
        Ok(())
    })?;
    let mut input_bytes = 0u64;
    for ((_, t), f) in cand.feeds.iter().zip(&files) {
        let p = dir.join(format!("input_{f}.npy"));
        write_npy(&p, t)?;
        input_bytes += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
    }
    let kept_nodes: Vec<(String, String)> = kept
        .iter()
        .map(|&k| (o.labels[k].clone(), o.nodes()[k].op_type.clone()))
        .collect();
    let reduced = Reduced {
        model: cand.model.clone(),
        feeds: cand.feeds.clone(),
        kept: kept_nodes,
        culprit: label.clone(),
        failure: failure.line.clone(),
        tests,
    };
    let readme = readme(a, &path, &reduced, &cand.sources, &files, n_nodes, device);
    crate::npy::write_replacing(&dir.join("README.md"), |mut f| {
        f.write_all(readme.as_bytes())?;
        Ok(())
    })?;
    // The check: the repro as `rlx run DIR` loads it.
    let re = load(
        &ModelArgs {
            model: dir.clone(),
            ..Default::default()
        },
        true,
    );
    let again = match (&a.until, re) {
        (_, Ok(l)) => checker.probe(&o, Ok(l.graph), &l.feeds),
        (Until::Error(_), Err(e)) => checker.probe(&o, Err(e), &[]),
        (_, Err(e)) => Err(e),
    };
    let ok = matches!(&again, Ok(Some(f)) if f.label.as_deref() == Some(label.as_str()));
    let secs = t0.elapsed().as_secs_f64();
    say(&format!(
        "rlx reduce: {} nodes -> {} ({}), model {} -> {} (+ {} of inputs), {tests} trial run(s), {secs:.3} s in all",
        n_nodes,
        reduced.kept.len(),
        reduced
            .kept
            .iter()
            .map(|(l, op)| format!("{op} \"{l}\""))
            .collect::<Vec<_>>()
            .join(", "),
        human_bytes(model_bytes),
        human_bytes(bytes.len() as u64),
        human_bytes(input_bytes),
    ));
    if !ok {
        bail!(
            "the repro written to {} does not reproduce the failure when loaded back ({}); please report this",
            dir.display(),
            match again {
                Ok(Some(f)) => f.line,
                Ok(None) => "no failure".into(),
                Err(e) => format!("{e:#}"),
            }
        );
    }
    say(&format!(
        "rlx reduce: wrote {} (model.onnx, {} input file(s), README.md); reproduce with: {}",
        dir.display(),
        reduced.feeds.len(),
        rlx_command(&a.until, device, dir)
    ));
    Ok(Outcome::Written(Box::new(reduced)))
}

/// Feeds for `--until error` when the model does not import: the files given, the model
/// folder's `input_<name>.npy`, else values generated from the declared shapes (symbolic
/// dims from `--dim`, else 1), as `rlx run` binds them.
fn error_feeds(a: &ReduceArgs) -> Result<Vec<(String, Tensor)>> {
    let mut given: HashMap<String, Tensor> = HashMap::new();
    for spec in &a.model.inputs {
        if let Some((name, file)) = crate::load::split_input_spec(spec)? {
            given.insert(
                name.to_string(),
                crate::run::read_input_file(Path::new(file))
                    .with_context(|| format!("input \"{name}\""))?,
            );
        }
    }
    let dims = crate::load::parse_dims(&a.model.dims)?;
    let m = crate::load::SourceModel::open(&model_path(&a.model.model))?;
    let decls = m.declared_inputs();
    let mut out = vec![];
    for name in m.input_names() {
        if let Some(t) = given.remove(&name) {
            out.push((name, t));
            continue;
        }
        if let Some(p) = crate::load::folder_input(&a.model.model, &name)? {
            out.push((name, crate::npy::read_npy(&p)?));
            continue;
        }
        if let Some((_, decl)) = decls.iter().find(|d| d.0 == name) {
            let d: Vec<usize> = decl
                .dims
                .iter()
                .map(|d| match d {
                    rlx_ir::Dim::Static(v) => *v,
                    rlx_ir::Dim::Sym(s) => dims.get(s).copied().unwrap_or(1),
                })
                .collect();
            let shape = rlx_ir::Shape::new(&d, decl.dtype);
            out.push((
                name.clone(),
                crate::run::generate_input(&name, &shape, a.model.seed),
            ));
        }
    }
    if let Some(name) = given.keys().next() {
        bail!("--input {name}: the model has no input named \"{name}\"");
    }
    Ok(out)
}

/// The first `k` such that the model's first `k` nodes (their unconsumed tensors as outputs)
/// fail the same way: node `k - 1` is the culprit.
fn first_failing_prefix(
    o: &Onnx,
    checker: &Checker,
    feeds: &[(String, Tensor)],
) -> Result<Option<usize>> {
    let fails = |k: usize| -> bool {
        let mut m = o.model.clone();
        let g = m.graph.as_mut().expect("has a graph");
        g.node.truncate(k);
        let used: HashSet<&String> = o.uses[..k].iter().flatten().collect();
        g.output = g
            .node
            .iter()
            .flat_map(|n| n.output.iter())
            .filter(|x| !x.is_empty() && !used.contains(x))
            .map(|x| ValueInfoProto {
                name: x.clone(),
                r#type: None,
            })
            .collect();
        let graph = import(&m.encode_to_vec(), &o.base, feeds);
        matches!(checker.probe(o, graph, feeds), Ok(Some(_)))
    };
    let n = o.nodes().len();
    if n == 0 || !fails(n) {
        return Ok(None);
    }
    let (mut lo, mut hi) = (0usize, n); // fails(hi), !fails(lo) assumed
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fails(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi - 1))
}

fn rlx_command(until: &Until, device: Device, dir: &Path) -> String {
    let d = dir.display();
    let env = env_prefix();
    match until {
        Until::Nan => format!("{env}RLX_DEBUG_NANS=1 rlx run {d}"),
        Until::Inf => format!("{env}RLX_DEBUG_NANS=strict rlx run {d}"),
        Until::Diverge(_) => format!("{env}rlx diverge {d} --backends {device}"),
        Until::Error(_) => format!("{env}rlx run {d}"),
    }
}

/// The `RLX_*` settings of this run that change what a model computes (runtime switches, a
/// planted test bug), as `NAME=value ` words to put before the reproducing command.
fn env_prefix() -> String {
    let mut s = String::new();
    for v in rlx_ir::env::VARS {
        let wanted =
            matches!(v.scope, rlx_ir::env::Scope::Runtime) || v.name == "RLX_TEST_PLANTED_BUG";
        if !wanted || v.name == "RLX_DEBUG_NANS" {
            continue;
        }
        if let Some(val) = rlx_ir::env::get(v.name).filter(|x| !x.is_empty()) {
            let plain = val
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._,:/=-".contains(c));
            if plain {
                s += &format!("{}={val} ", v.name);
            } else {
                s += &format!("{}='{}' ", v.name, val.replace('\'', "'\\''"));
            }
        }
    }
    s
}

fn readme(
    a: &ReduceArgs,
    path: &Path,
    r: &Reduced,
    sources: &[(String, Source)],
    files: &[String],
    n_nodes: usize,
    device: Device,
) -> String {
    use std::fmt::Write as _;
    let dir = &a.output_dir;
    let mut s = String::new();
    let _ = writeln!(s, "# Minimal repro written by `rlx reduce`\n");
    let _ = writeln!(
        s,
        "- original model: `{}` ({} nodes)",
        path.display(),
        n_nodes
    );
    let _ = writeln!(s, "- failure kept (`--until {}`): {}", a.until, r.failure);
    let _ = writeln!(s, "- culprit node: `{}`", r.culprit);
    let _ = writeln!(
        s,
        "- kept: {} node(s), found in {} trial runs\n",
        r.kept.len(),
        r.tests
    );
    let _ = writeln!(s, "## Nodes\n\n| ONNX node | op type |\n| --- | --- |");
    for (l, op) in &r.kept {
        let _ = writeln!(s, "| `{l}` | {op} |");
    }
    let _ = writeln!(
        s,
        "\n## Inputs\n\n| input | file | type | value |\n| --- | --- | --- | --- |"
    );
    for ((name, t), f) in r.feeds.iter().zip(files) {
        let src = match sources.iter().find(|x| &x.0 == name).map(|x| &x.1) {
            Some(Source::Original) => "the original model's input",
            _ => "recorded from the full model's run (this tensor entered the kept nodes)",
        };
        let _ = writeln!(s, "| `{name}` | `input_{f}.npy` | {} | {src} |", t.shape());
    }
    let consts: Vec<&String> = sources
        .iter()
        .filter(|x| matches!(x.1, Source::Constant))
        .map(|x| &x.0)
        .collect();
    if !consts.is_empty() {
        let _ = writeln!(
            s,
            "\nTensors made initializers (their values from the full run): {}",
            consts
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        s,
        "\n## Reproduce\n\nIn RLX:\n\n```sh\n{}\n```\n",
        rlx_command(&a.until, device, dir)
    );
    let _ = writeln!(
        s,
        "In onnxruntime (`pip install onnxruntime numpy`):\n\n```python\nimport numpy as np, onnxruntime as ort\nd = \"{}\"\ns = ort.InferenceSession(d + \"/model.onnx\", providers=[\"CPUExecutionProvider\"])\nfeeds = {{",
        dir.display()
    );
    for ((name, _), f) in r.feeds.iter().zip(files) {
        let _ = writeln!(s, "    {name:?}: np.load(d + \"/input_{f}.npy\"),");
    }
    let _ = writeln!(
        s,
        "}}\nfor o, v in zip(s.get_outputs(), s.run(None, feeds)):\n    bad = np.isnan(v).sum() if v.dtype.kind == \"f\" else 0\n    inf = np.isinf(v).sum() if v.dtype.kind == \"f\" else 0\n    print(o.name, v.dtype, v.shape, \"NaN:\", bad, \"Inf:\", inf)\n```"
    );
    s
}

/// Entry point of `rlx reduce`; returns the exit status.
pub fn main_reduce(a: ReduceArgs) -> i32 {
    match run(&a, &mut |l| println!("{l}")) {
        Ok(Outcome::Written(_)) => 0,
        Ok(Outcome::NotFailing(line)) => {
            println!("{line}");
            1
        }
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_parse_as_on_the_command_line() {
        let a = ReduceArgs::try_parse_from(["m.onnx", "--until=error:bad", "-q"]).unwrap();
        assert_eq!(a.until.to_string(), "error:bad");
        assert_eq!(a.output_dir, PathBuf::from("repro"));
        assert_eq!((a.tol_rel, a.force, a.quiet), (2e-3, false, true));
        assert_eq!(a.model.model, PathBuf::from("m.onnx"));
        let e = ReduceArgs::try_parse_from(["m.onnx", "--until", "sometimes"])
            .unwrap_err()
            .render()
            .to_string();
        assert!(
            e.contains("invalid value 'sometimes' for '--until <KIND>'"),
            "{e}"
        );
        assert!(ReduceArgs::try_parse_from(["m.onnx"]).is_err());
    }
}
