//! Models whose input dims are known only when they run: one model, any batch or sequence
//! length within declared ranges, each new size signature planned once and cached.
//!
//! A [`DynamicModel`] holds the model's source (an ONNX file's bytes, [`OnnxSource`]) and a
//! range per symbolic input dim (`batch = 1..16`). A run binds every symbol from its inputs'
//! shapes, checks the binding against the ranges and against itself (two inputs that share
//! `sequence` must agree), and runs the plan for that signature: a [`CompiledGraph`] with
//! static shapes, built the first time the signature is seen (import with the symbols bound,
//! then the usual compile) and kept in a small least-recently-used cache
//! ([`DynamicModel::set_plan_cache_size`], default [`DEFAULT_PLAN_CACHE`]). Later runs at a
//! cached signature cost what a static model's runs cost.
//!
//! A plan is built by specializing the source: where the model imports symbolically, from
//! a template imported and compiled once with its dims as symbols and patched to the
//! signature's sizes (`dynamic/templates.rs`, [`rlx_onnx_import::sym`]); else by importing
//! the source again with the dims bound and compiling it. [`DynamicModel::last_plan`] says
//! which and what it cost. The plans share the weights the source decoded once (a conv's
//! packed copy is per plan).
//!
//! Check messages follow [`crate::guards`] (AOTInductor's runtime input checks):
//!
//! ```text
//! rlx input-check: inputs[0] "input_ids": unmatched dim 0 ("batch"), expected: 1..16, but got: 17
//! rlx input-check: inputs[1] "attention_mask": unmatched dim 1 ("sequence"), expected: 7 (as inputs[0] "input_ids" dim 1), but got: 9
//! ```
//!
//! Unlike a static [`CompiledGraph`]'s guards, these checks always run: they are how a
//! dynamic model finds its signature, and cost a few comparisons per run.
//!
//! (One file over 1,000 lines: `DynamicModel`'s one `impl` (binding and checking a signature,
//! the plan cache, the segmented run around value-dependent nodes and its reports) shares the
//! model's state throughout; the Loop runner lives in `dynamic/run_loop.rs`, the symbolic
//! templates in `dynamic/templates.rs`.)

use crate::guards::{device_type, GuardDim, InputGuard};
use crate::{CompiledGraph, Device, RuntimeError, Session};
use rlx_compile::compiler::CompileOptions;
use rlx_ir::{Dim, Graph, Shape, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// True for a specialization (import) error that names a value known only at run time: a
/// parameter input (planned by value) or a node whose output shape or control flow depends
/// on values (run in segments). [`DynamicModel::run_tensors`] gets past both.
pub fn is_value_dependent(msg: &str) -> bool {
    msg.contains("known at import time")
        || msg.contains("depends on runtime data")
        || msg.contains("depends on it)")
        // A Loop with more iterations than the importer unrolls runs at run time too.
        || msg.contains("iterations to unroll")
}

/// Plans a [`DynamicModel`] keeps by default (they share the decoded weights: see the
/// module docs).
pub const DEFAULT_PLAN_CACHE: usize = 4;

/// The sizes one symbolic dim may take: `min..=max` (`max: None` is unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimRange {
    pub min: usize,
    pub max: Option<usize>,
}

impl DimRange {
    /// Exactly `n`.
    pub fn exact(n: usize) -> DimRange {
        DimRange {
            min: n,
            max: Some(n),
        }
    }

    /// Parse `N` (exactly N), `MIN..MAX` or `MIN..=MAX` (both ends included, as in
    /// `torch.export.Dim(min=, max=)`), or `MIN..` (no upper bound).
    ///
    /// Errors: text naming what is wrong (not a number, `MIN > MAX`).
    pub fn parse(s: &str) -> Result<DimRange, String> {
        let num = |t: &str, what: &str| -> Result<usize, String> {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("{what} \"{t}\" is not a non-negative integer"))
        };
        let Some((lo, hi)) = s.split_once("..") else {
            return Ok(DimRange::exact(num(s, "SIZE")?));
        };
        let min = num(lo, "MIN")?;
        let hi = hi.strip_prefix('=').unwrap_or(hi);
        if hi.trim().is_empty() {
            return Ok(DimRange { min, max: None });
        }
        let max = num(hi, "MAX")?;
        if min > max {
            return Err(format!("MIN {min} is larger than MAX {max}"));
        }
        Ok(DimRange {
            min,
            max: Some(max),
        })
    }

    /// True when `n` is in range.
    pub fn accepts(&self, n: usize) -> bool {
        n >= self.min && self.max.is_none_or(|m| n <= m)
    }

    /// True when the range holds one size.
    pub fn is_exact(&self) -> bool {
        self.max == Some(self.min)
    }
}

impl fmt::Display for DimRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            &GuardDim {
                symbol: None,
                min: self.min,
                max: self.max,
            }
            .expected(),
        )
    }
}

/// A model that can be specialized to concrete input shapes.
pub trait GraphSource: Send + Sync {
    /// The source format as packages record it (`"onnx"`).
    fn format(&self) -> &str;
    /// The model's name in messages (its file).
    fn name(&self) -> &str;
    /// Declared inputs, symbolic dims kept (`Dim::Sym("batch")`), in input order.
    fn declared_inputs(&self) -> Vec<(String, Shape)>;
    /// The graph with every input at the given shape (all symbolic dims bound), the inputs
    /// in `constants` frozen to those values (they are then no inputs of the graph), and the
    /// sequence / optional inputs at the layouts in `values` (their tensors are inputs named
    /// as [`rlx_onnx_import::ValueInput`] says).
    fn specialize(
        &self,
        input_shapes: &HashMap<String, Vec<usize>>,
        constants: &HashMap<String, Tensor>,
        values: &HashMap<String, rlx_onnx_import::ValueInput>,
    ) -> Result<Graph, String>;
    /// Inputs that only fix sizes, axes or attributes (a Reshape's `shape`): when the
    /// source cannot be specialized without their values, plans are made per value.
    fn parameter_inputs(&self) -> Vec<String> {
        vec![]
    }
    /// The ONNX model, when the source is one (a model that can be cut at a node whose
    /// output shape depends on values: see [`rlx_onnx_import::cut`]).
    fn as_onnx(&self) -> Option<&rlx_onnx_import::OnnxModel> {
        None
    }
    /// The source's serialized bytes, for packages (`None`: it cannot be saved).
    fn bytes(&self) -> Option<&[u8]>;
    /// How the last [`GraphSource::specialize`] made its graph (see
    /// [`PlanEvent::specialized_by`]); `None` when the source does not say.
    fn last_specialized_by(&self) -> Option<String> {
        None
    }
    /// The compiled form of `g`, a graph this source's [`GraphSource::specialize`] just
    /// made, when the source can give it without running the compiler's passes on it (a
    /// symbolic template compiled once and patched); `None`: compile `g`.
    fn compiled_for(
        &self,
        _g: &Graph,
        _opts: &CompileOptions,
    ) -> Option<Result<rlx_compile::compiler::Compiled, rlx_compile::CompileError>> {
        None
    }
}

/// An ONNX model held as its file's bytes (no external data).
pub struct OnnxSource {
    model: rlx_onnx_import::OnnxModel,
    bytes: Vec<u8>,
    name: String,
    templates: std::sync::Mutex<Templates>,
    last_by: std::sync::Mutex<Option<String>>,
}

mod templates;
use templates::{SpecializedBy, Templates};

impl OnnxSource {
    /// Decode `bytes` (a serialized `ModelProto`); `name` names it in errors.
    ///
    /// Errors: [`RuntimeError::Input`] naming `name` when the bytes are not an ONNX model or
    /// the model keeps weights in external data files (a dynamic model must be one file).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<OnnxSource, RuntimeError> {
        let model = rlx_onnx_import::OnnxModel::from_bytes(&bytes, name)
            .map_err(|e| RuntimeError::Input(e.to_string()))?;
        if model.has_external_data() {
            return Err(RuntimeError::Input(format!(
                "{name}: keeps initializers in external data files; a model with dynamic dims must be one file (save it with onnx.save(model, path, save_as_external_data=False))"
            )));
        }
        Ok(OnnxSource {
            model,
            bytes,
            name: name.to_string(),
            templates: Default::default(),
            last_by: Default::default(),
        })
    }

    /// A model already decoded (a part of a cut model); `name` names it in errors.
    pub fn from_model(model: rlx_onnx_import::OnnxModel, name: &str) -> OnnxSource {
        OnnxSource {
            bytes: rlx_onnx_import::cut::Cut::encode(&model),
            model,
            name: name.to_string(),
            templates: Default::default(),
            last_by: Default::default(),
        }
    }

    /// Declared output names and types (symbolic dims kept), as the model file gives them.
    pub fn declared_outputs(&self) -> Vec<(String, Shape)> {
        self.model.declared_outputs()
    }

    /// Read and decode the ONNX file at `path` (errors as [`OnnxSource::from_bytes`], or an
    /// unreadable file).
    pub fn open(path: &Path) -> Result<OnnxSource, RuntimeError> {
        let bytes = std::fs::read(path)
            .map_err(|e| RuntimeError::Input(format!("{}: cannot read: {e}", path.display())))?;
        OnnxSource::from_bytes(bytes, &path.display().to_string())
    }
}

impl GraphSource for OnnxSource {
    fn format(&self) -> &str {
        "onnx"
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn declared_inputs(&self) -> Vec<(String, Shape)> {
        self.model.declared_inputs()
    }
    fn specialize(
        &self,
        input_shapes: &HashMap<String, Vec<usize>>,
        constants: &HashMap<String, Tensor>,
        values: &HashMap<String, rlx_onnx_import::ValueInput>,
    ) -> Result<Graph, String> {
        let by = if constants.is_empty() && values.is_empty() {
            match self.specialize_template(input_shapes) {
                (Some(g), by) => {
                    self.set_last_by(by);
                    return Ok(g);
                }
                (None, by) => by,
            }
        } else {
            SpecializedBy::Import("inputs planned by value".into())
        };
        self.set_last_by(by);
        let opts = rlx_onnx_import::ImportOptions {
            input_shapes: input_shapes
                .iter()
                .filter(|(n, _)| !constants.contains_key(*n))
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect(),
            constant_inputs: constants.clone(),
            value_inputs: values.clone(),
            ..Default::default()
        };
        self.model.import(&opts).map_err(|e| e.to_string())
    }
    fn parameter_inputs(&self) -> Vec<String> {
        self.model.parameter_inputs()
    }
    fn as_onnx(&self) -> Option<&rlx_onnx_import::OnnxModel> {
        Some(&self.model)
    }
    fn bytes(&self) -> Option<&[u8]> {
        Some(&self.bytes)
    }
    fn last_specialized_by(&self) -> Option<String> {
        self.last_by.lock().ok().and_then(|b| b.clone())
    }
    fn compiled_for(
        &self,
        g: &Graph,
        opts: &CompileOptions,
    ) -> Option<Result<rlx_compile::compiler::Compiled, rlx_compile::CompileError>> {
        self.compile_from_template(g, opts)
    }
}

/// What the last run's plan was ([`DynamicModel::last_plan`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEvent {
    /// The signature, `batch=3, sequence=128` (symbols in name order; `static` when the
    /// model has none).
    pub signature: String,
    /// True when this run built the plan (first run at this signature, or evicted since).
    pub new: bool,
    /// Milliseconds spent building it (specialize + compile); 0 for a cached plan.
    pub plan_ms: f64,
    /// The part of `plan_ms` spent specializing the source (binding the sizes: importing
    /// the ONNX model again, or substituting a symbolic graph's dims).
    pub specialize_ms: f64,
    /// Plans cached after this run.
    pub cached: usize,
    /// How a new plan's graph was made: `symbolic template`, `new symbolic template`, or
    /// `import (REASON)` (an import per signature and why no template served); empty for a
    /// cached plan or a source that does not say.
    pub specialized_by: String,
}

struct Plan {
    key: String,
    graph: CompiledGraph,
    last_used: u64,
}

/// A model compiled once per input-size signature (see the module docs).
pub struct DynamicModel {
    source: Arc<dyn GraphSource>,
    session: Session,
    ranges: BTreeMap<String, DimRange>,
    guards: Vec<InputGuard>,
    plans: Vec<Plan>,
    cap: usize,
    clock: u64,
    last: Option<PlanEvent>,
    /// Appended to every NaN report of this model's plans (segments say which part they are).
    context: Option<String>,
    /// Parameter inputs the source needs the values of (found when specializing without
    /// them failed): plans are keyed by their values too, and the plans do not take them.
    by_value: Vec<String>,
    /// The source's parameter inputs (read once).
    params: Vec<String>,
    /// Set when the source has a node whose output shape depends on values: the model then
    /// runs in segments around it (see [`DynamicModel::run_tensors`]).
    segmented: Option<Box<Segmented>>,
    /// Layouts of the sequence / optional inputs ([`DynamicModel::set_value_inputs`]).
    values: HashMap<String, rlx_onnx_import::ValueInput>,
    /// Reports at graph inputs are not printed ([`DynamicModel::set_quiet_input_reports`]).
    quiet_inputs: bool,
    /// The last run (of a plan, or of every part) found a NaN/Inf to report.
    last_reported: bool,
}

/// A model run in three parts around a node whose output shape depends on values.
struct Segmented {
    cut: rlx_onnx_import::cut::Cut,
    head: Option<DynamicModel>,
    tail: Option<DynamicModel>,
    tail_built: bool,
    /// A cut Loop's body, when it runs at run time ([`run_loop`]).
    body: Option<DynamicModel>,
}

mod run_loop;
use run_loop::{run_loop, LoopEnv};

impl DynamicModel {
    /// A dynamic model of `source` for `device`. `ranges` gives each symbolic dim of the
    /// declared inputs its accepted sizes; a symbol not in it accepts any size (`>= 0`: an
    /// empty KV cache has 0 past positions).
    ///
    /// Errors: a range naming a symbol no declared input has ([`RuntimeError::Input`]
    /// listing the symbols), an unavailable device.
    pub fn new(
        source: Arc<dyn GraphSource>,
        device: Device,
        ranges: BTreeMap<String, DimRange>,
    ) -> Result<DynamicModel, RuntimeError> {
        if !crate::device_available(device) {
            return Err(RuntimeError::DeviceUnavailable(device));
        }
        let decls = source.declared_inputs();
        let mut symbols: Vec<String> = vec![];
        for (_, s) in &decls {
            for d in &s.dims {
                if let Dim::Sym(n) = d {
                    if !symbols.contains(n) {
                        symbols.push(n.clone());
                    }
                }
            }
        }
        for k in ranges.keys() {
            if !symbols.contains(k) {
                let have = if symbols.is_empty() {
                    "none".to_string()
                } else {
                    symbols.join(", ")
                };
                return Err(RuntimeError::Input(format!(
                    "{}: the model's inputs have no symbolic dim named \"{k}\" (they have: {have})",
                    source.name()
                )));
            }
        }
        let mut all = ranges;
        for s in symbols {
            all.entry(s).or_insert(DimRange { min: 0, max: None });
        }
        let dev = device_type(device);
        let guards = decls
            .iter()
            .map(|(name, s)| InputGuard {
                name: name.clone(),
                dtype: s.dtype,
                dims: s
                    .dims
                    .iter()
                    .map(|d| match d {
                        Dim::Static(v) => GuardDim {
                            symbol: None,
                            min: *v,
                            max: Some(*v),
                        },
                        Dim::Sym(n) => {
                            let r = all[n];
                            GuardDim {
                                symbol: Some(n.clone()),
                                min: r.min,
                                max: r.max,
                            }
                        }
                    })
                    .collect(),
                device_type: dev.clone(),
            })
            .collect();
        Ok(DynamicModel {
            session: Session::new(device),
            ranges: all,
            guards,
            plans: vec![],
            cap: DEFAULT_PLAN_CACHE,
            clock: 0,
            last: None,
            by_value: vec![],
            context: None,
            params: source.parameter_inputs(),
            source,
            segmented: None,
            values: HashMap::new(),
            quiet_inputs: false,
            last_reported: false,
        })
    }

    /// Record but do not print NaN reports at this model's graph inputs (cached plans too):
    /// for a part whose inputs carry a value an earlier part of the run already reported.
    pub fn set_quiet_input_reports(&mut self, on: bool) {
        for p in &mut self.plans {
            p.graph.set_quiet_input_reports(on);
        }
        self.quiet_inputs = on;
    }

    /// Whether the last run ([`DynamicModel::run_tensors`]; every part of a run in
    /// segments) found a NaN/Inf to report.
    pub fn last_run_reported(&self) -> bool {
        self.last_reported
    }

    /// Set the context appended to every NaN report of this model's plans (cached ones too).
    pub fn set_context(&mut self, context: Option<String>) {
        for p in &mut self.plans {
            p.graph.set_report_context(context.clone());
        }
        self.context = context;
    }

    /// The names of the declared inputs (every input a run must be given).
    fn plan_inputs_declared(&self) -> Vec<String> {
        self.guards.iter().map(|g| g.name.clone()).collect()
    }

    /// The layouts of the model's sequence / optional inputs for the next runs (a sequence
    /// `s` of `k` tensors is fed as the inputs `s[0]`, ..., `s[k-1]`; an optional tensor `o`
    /// as `o`; see [`rlx_onnx_import::ValueInput`]). A layout is part of the signature: plans
    /// are keyed by it. Models with no such input need none.
    pub fn set_value_inputs(&mut self, layouts: HashMap<String, rlx_onnx_import::ValueInput>) {
        self.values = layouts;
    }

    /// The input names the tensors of the sequence / optional inputs take at their layouts.
    fn value_input_names(&self) -> Vec<String> {
        use rlx_onnx_import::ValueInput as V;
        let mut names: Vec<String> = vec![];
        let mut layouts: Vec<_> = self.values.iter().collect();
        layouts.sort_by(|a, b| a.0.cmp(b.0));
        for (n, l) in layouts {
            match l {
                V::Sequence(ts) | V::OptionalSequence(ts) => {
                    names.extend((0..ts.len()).map(|i| format!("{n}[{i}]")))
                }
                V::OptionalTensor(..) => names.push(n.clone()),
                V::OptionalNone => {}
            }
        }
        names
    }

    /// Compile plans with these options.
    pub fn with_options(mut self, options: CompileOptions) -> DynamicModel {
        self.session = self.session.with_options(options);
        self.plans.clear();
        self
    }

    /// The device plans are compiled for.
    pub fn device(&self) -> Device {
        self.session.device()
    }

    /// The model's source.
    pub fn source(&self) -> &Arc<dyn GraphSource> {
        &self.source
    }

    /// Every symbol with its range (symbols given none accept `>= 0`).
    pub fn ranges(&self) -> &BTreeMap<String, DimRange> {
        &self.ranges
    }

    /// One guard per declared input, symbolic dims with their ranges.
    pub fn guards(&self) -> &[InputGuard] {
        &self.guards
    }

    /// Keep at most `n` plans (at least 1); the least recently used go first.
    pub fn set_plan_cache_size(&mut self, n: usize) {
        self.cap = n.max(1);
        self.evict();
    }

    /// Plans cached now.
    pub fn plans_cached(&self) -> usize {
        self.plans.len()
    }

    /// What the last [`DynamicModel::plan_for`] did.
    pub fn last_plan(&self) -> Option<&PlanEvent> {
        self.last.as_ref()
    }

    /// Sizes for inputs still to be made: every symbol at `dims`' size, else at the size a
    /// given tensor has for it, else at its range's minimum (at least 1), in that order.
    pub fn sizes_for(
        &self,
        given: &[(&str, &Tensor)],
        dims: &HashMap<String, usize>,
    ) -> BTreeMap<String, usize> {
        let mut sizes: BTreeMap<String, usize> =
            dims.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for g in &self.guards {
            if let Some((_, t)) = given.iter().find(|(n, _)| *n == g.name) {
                for (d, &n) in g.dims.iter().zip(t.dims()) {
                    if let Some(s) = &d.symbol {
                        sizes.entry(s.clone()).or_insert(n);
                    }
                }
            }
        }
        for (s, r) in &self.ranges {
            sizes.entry(s.clone()).or_insert(r.min.max(1));
        }
        sizes
    }

    /// The signature of `inputs`: every symbol's size, in name order, after the checks
    /// (dtype, rank, static dims, ranges, symbols shared between inputs agreeing).
    ///
    /// Errors: [`RuntimeError::InputCheck`], one `rlx input-check:` line per problem.
    pub fn signature(
        &self,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Vec<(String, usize)>, RuntimeError> {
        let mut lines = vec![];
        let mut bound: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
        for (k, g) in self.guards.iter().enumerate() {
            // Line prefixes are built only when a line is written (this runs before every run).
            let at = || format!("rlx input-check: inputs[{k}] \"{}\"", g.name);
            let Some((_, t)) = inputs.iter().find(|(n, _)| *n == g.name) else {
                lines.push(format!(
                    "{}: missing input, expected: {}",
                    at(),
                    g.type_string()
                ));
                continue;
            };
            if t.dtype() != g.dtype {
                lines.push(format!(
                    "{}: unmatched dtype, expected: {}, but got: {}",
                    at(),
                    g.dtype,
                    t.dtype()
                ));
            }
            if t.dims().len() != g.dims.len() {
                lines.push(format!(
                    "{}: unmatched rank, expected: {}, but got: {}",
                    at(),
                    g.dims.len(),
                    t.dims().len()
                ));
                continue;
            }
            for (i, (gd, &n)) in g.dims.iter().zip(t.dims()).enumerate() {
                let dim = || {
                    let sym = gd
                        .symbol
                        .as_ref()
                        .map(|s| format!(" (\"{s}\")"))
                        .unwrap_or_default();
                    format!("{}: unmatched dim {i}{sym}", at())
                };
                if !gd.accepts(n) {
                    lines.push(format!(
                        "{}, expected: {}, but got: {n}",
                        dim(),
                        gd.expected()
                    ));
                    continue;
                }
                let Some(s) = &gd.symbol else { continue };
                match bound.get(s) {
                    Some(&(v, j, d)) if v != n => lines.push(format!(
                        "{}, expected: {v} (as inputs[{j}] \"{}\" dim {d}), but got: {n}",
                        dim(),
                        self.guards[j].name
                    )),
                    Some(_) => {}
                    None => {
                        bound.insert(s.clone(), (n, k, i));
                    }
                }
            }
        }
        let elements = self.value_input_names();
        for (name, _) in inputs {
            if !self.guards.iter().any(|g| g.name == *name) && !elements.iter().any(|e| e == name) {
                let names: Vec<&str> = self.guards.iter().map(|g| g.name.as_str()).collect();
                lines.push(format!(
                    "rlx input-check: \"{name}\": unknown input name, expected one of: {}, but got: \"{name}\"",
                    names.join(", ")
                ));
            }
        }
        if !lines.is_empty() {
            return Err(RuntimeError::InputCheck { lines });
        }
        Ok(bound.into_iter().map(|(s, (v, _, _))| (s, v)).collect())
    }

    /// The plan for `inputs`' signature, built now if not cached (checks as
    /// [`DynamicModel::signature`]). Configure it (debug mode, printer) and run it as any
    /// [`CompiledGraph`]; it takes the inputs [`DynamicModel::plan_inputs`] names.
    ///
    /// When the source cannot be specialized without the values of its parameter inputs
    /// (a Reshape's `shape` fed as a graph input), plans are keyed by those values as well
    /// and built with them frozen; data inputs are never frozen.
    ///
    /// Errors: the input check; the source failing to specialize at this signature (an
    /// import error naming the node); compiling (sizes too large for this machine, ...).
    pub fn plan_for(
        &mut self,
        inputs: &[(&str, &Tensor)],
    ) -> Result<&mut CompiledGraph, RuntimeError> {
        let syms = self.signature(inputs)?;
        let shapes = || -> HashMap<String, Vec<usize>> {
            inputs
                .iter()
                .map(|(n, t)| (n.to_string(), t.dims().to_vec()))
                .collect()
        };
        // Only parameter inputs (small: shapes, axes, counts) are copied, for the key.
        let values: HashMap<String, Tensor> = inputs
            .iter()
            .filter(|(n, t)| self.params.iter().any(|p| p == n) && t.numel() <= 4096)
            .map(|(n, t)| (n.to_string(), (*t).clone()))
            .collect();
        self.plan_keyed(syms, shapes, Some(&values))
    }

    /// The plan the last [`DynamicModel::plan_for`] / [`DynamicModel::plan_at`] used.
    pub fn last_plan_graph(&mut self) -> Option<&mut CompiledGraph> {
        let key = self.last.as_ref()?.signature.clone();
        self.plans
            .iter_mut()
            .find(|p| p.key == key)
            .map(|p| &mut p.graph)
    }

    /// The inputs the plan for the last signature takes: every declared input but those
    /// frozen by value (see [`DynamicModel::plan_for`]).
    pub fn plan_inputs(&self) -> Vec<String> {
        self.guards
            .iter()
            .map(|g| g.name.clone())
            .filter(|n| !self.by_value.contains(n))
            .chain(self.value_input_names())
            .collect()
    }

    /// The plan for every symbol at the given size (inputs' shapes follow from the
    /// declared signature). Used to check a range's corners when compiling a package.
    ///
    /// Errors: a symbol missing from `sizes` or outside its range, a source that needs
    /// input values to specialize, and as [`DynamicModel::plan_for`].
    pub fn plan_at(
        &mut self,
        sizes: &BTreeMap<String, usize>,
    ) -> Result<&mut CompiledGraph, RuntimeError> {
        let mut lines = vec![];
        for (s, r) in &self.ranges {
            match sizes.get(s) {
                None => lines.push(format!("dim \"{s}\": no size given (range {r})")),
                Some(&n) if !r.accepts(n) => {
                    lines.push(format!("dim \"{s}\": {n} is outside its range {r}"))
                }
                _ => {}
            }
        }
        if !lines.is_empty() {
            return Err(RuntimeError::Input(lines.join("; ")));
        }
        let shapes = self.shapes_at(sizes);
        let key = self.ranges.keys().map(|s| (s.clone(), sizes[s])).collect();
        self.plan_keyed(key, || shapes, None)
    }

    /// Every declared input's dims with the symbols at `sizes` (symbols not given at their
    /// range's minimum).
    pub fn shapes_at(&self, sizes: &BTreeMap<String, usize>) -> HashMap<String, Vec<usize>> {
        self.guards
            .iter()
            .map(|g| {
                let dims = g
                    .dims
                    .iter()
                    .map(|d| match &d.symbol {
                        Some(s) => sizes.get(s).copied().unwrap_or(d.min),
                        None => d.min,
                    })
                    .collect();
                (g.name.clone(), dims)
            })
            .collect()
    }

    /// The signature text and plan key: symbols, then the values of inputs planned by value.
    fn key_text(
        &self,
        syms: &[(String, usize)],
        values: Option<&HashMap<String, Tensor>>,
    ) -> String {
        let mut parts: Vec<String> = syms.iter().map(|(s, v)| format!("{s}={v}")).collect();
        let mut layouts: Vec<_> = self.values.iter().collect();
        layouts.sort_by(|a, b| a.0.cmp(b.0));
        for (n, l) in layouts {
            parts.push(format!("{n}={l:?}"));
        }
        if let Some(values) = values {
            for n in &self.by_value {
                if let Some(t) = values.get(n) {
                    parts.push(format!("{n}={:?}", t.data().to_f64_vec()));
                }
            }
        }
        if parts.is_empty() {
            "static".to_string()
        } else {
            parts.join(", ")
        }
    }

    fn plan_keyed(
        &mut self,
        syms: Vec<(String, usize)>,
        shapes: impl FnOnce() -> HashMap<String, Vec<usize>>,
        values: Option<&HashMap<String, Tensor>>,
    ) -> Result<&mut CompiledGraph, RuntimeError> {
        self.clock += 1;
        let mut key = self.key_text(&syms, values);
        let mut spec_ms = 0.0;
        let mut compiled_once = false;
        let (k, new, ms) = match self.plans.iter().position(|p| p.key == key) {
            Some(k) => (k, false, 0.0),
            None => {
                let t0 = Instant::now();
                let shapes = &shapes();
                let frozen = |by: &[String]| -> HashMap<String, Tensor> {
                    values
                        .map(|v| {
                            v.iter()
                                .filter(|(n, _)| by.contains(n))
                                .map(|(n, t)| (n.clone(), t.clone()))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mut r = self
                    .source
                    .specialize(shapes, &frozen(&self.by_value), &self.values);
                // The source needs a parameter input's value: plan by value from now on.
                if let Err(e) = &r {
                    let avail: Vec<String> = values
                        .map(|v| v.keys().cloned().collect())
                        .unwrap_or_default();
                    if e.contains("known at import time")
                        && self.by_value.is_empty()
                        && !avail.is_empty()
                    {
                        let mut by: Vec<String> = self.params.clone();
                        by.retain(|n| avail.contains(n));
                        let retry = self.source.specialize(shapes, &frozen(&by), &self.values);
                        if retry.is_ok() {
                            self.by_value = by;
                            self.plans.clear();
                            key = self.key_text(&syms, values);
                        }
                        r = retry.or(r);
                    }
                }
                let g = r.map_err(|e| {
                    RuntimeError::Input(format!(
                        "{}: specializing to {key}: {e}",
                        self.source.name()
                    ))
                })?;
                spec_ms = t0.elapsed().as_secs_f64() * 1e3;
                let source = &self.source;
                let mut once = false;
                let mut graph = self.session.try_compile_with(g, |g, opts| {
                    match source.compiled_for(g, opts) {
                        Some(r) => {
                            once = true;
                            r
                        }
                        None => rlx_compile::compiler::compile(g.clone(), opts),
                    }
                })?;
                compiled_once = once;
                if self.context.is_some() {
                    graph.set_report_context(self.context.clone());
                }
                graph.set_quiet_input_reports(self.quiet_inputs);
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                self.plans.push(Plan {
                    key: key.clone(),
                    graph,
                    last_used: 0,
                });
                (self.plans.len() - 1, true, ms)
            }
        };
        self.plans[k].last_used = self.clock;
        // Evict others first so `k`'s plan (the newest use) stays.
        self.evict();
        let k = self
            .plans
            .iter()
            .position(|p| p.key == key)
            .expect("the plan just used is the most recent and is never evicted");
        self.last = Some(PlanEvent {
            signature: key,
            new,
            plan_ms: ms,
            specialize_ms: spec_ms,
            cached: self.plans.len(),
            specialized_by: match (new, self.source.last_specialized_by()) {
                (true, Some(by)) if compiled_once => format!("{by}, compiled once"),
                (true, Some(by)) => by,
                _ => String::new(),
            },
        });
        Ok(&mut self.plans[k].graph)
    }

    fn evict(&mut self) {
        while self.plans.len() > self.cap {
            let oldest = self
                .plans
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map(|(i, _)| i)
                .expect("plans is not empty");
            self.plans.remove(oldest);
        }
    }

    /// The plan for `inputs`, taken out of the cache (for a caller that runs one signature,
    /// as `rlx run` does). Errors as [`DynamicModel::plan_for`].
    pub fn take_plan(&mut self, inputs: &[(&str, &Tensor)]) -> Result<CompiledGraph, RuntimeError> {
        self.plan_for(inputs)?;
        let key = self
            .last
            .as_ref()
            .map(|e| e.signature.clone())
            .unwrap_or_default();
        let k = self
            .plans
            .iter()
            .position(|p| p.key == key)
            .expect("plan_for cached this signature's plan");
        Ok(self.plans.remove(k).graph)
    }

    /// Run on named host tensors: plan (or reuse the plan) for their signature, then run it.
    /// Returns one tensor per graph output.
    ///
    /// A model with a node whose output shape depends on values (NonZero, Compress, Unique,
    /// NonMaxSuppression; an If whose branches differ; a Loop with a run-time trip count) at
    /// its top level runs in segments: the nodes before it as one dynamic model, then that
    /// node alone on the CPU once its inputs exist (imported with them as constants, so the
    /// kernels of the constant evaluator compute it), then the nodes after it as another
    /// dynamic model fed with the values so far (cut again at the next such node). Each
    /// segment plans, caches, checks NaN and prints reports as a model of its own.
    ///
    /// Errors: as [`DynamicModel::plan_for`] and [`CompiledGraph::run_tensor_refs`]; a
    /// segment's error names the cut node.
    pub fn run_tensors(&mut self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        if self.segmented.is_none() {
            match self.plan_for(inputs) {
                Ok(_) => {}
                Err(e) => match self.cut_for(&e) {
                    Some(seg) => self.segmented = Some(Box::new(seg?)),
                    None => return Err(e),
                },
            }
        }
        if self.segmented.is_some() {
            return self.run_segmented(inputs);
        }
        let keep = self.plan_inputs();
        let fed: Vec<(&str, &Tensor)> = inputs
            .iter()
            .filter(|(n, _)| keep.iter().any(|k| k == n))
            .copied()
            .collect();
        let key = self
            .last
            .as_ref()
            .map(|e| e.signature.clone())
            .unwrap_or_default();
        let plan = self
            .plans
            .iter_mut()
            .find(|p| p.key == key)
            .expect("plan_for cached this signature's plan");
        let out = plan.graph.run_tensor_refs(&fed);
        self.last_reported = !plan.graph.nan_reports().is_empty();
        out
    }

    /// True when the model runs in segments (after a run found a value-dependent node).
    pub fn is_segmented(&self) -> bool {
        self.segmented.is_some()
    }

    /// The source's output names, in order.
    pub fn output_names(&self) -> Vec<String> {
        self.source
            .as_onnx()
            .map(|m| m.output_names())
            .unwrap_or_default()
    }

    /// A cut for a specialization error naming a top-level node whose output shape (or
    /// control flow) depends on run-time values; `None` when `e` is another error.
    fn cut_for(&self, e: &RuntimeError) -> Option<Result<Segmented, RuntimeError>> {
        let RuntimeError::Input(msg) = e else {
            return None;
        };
        if !is_value_dependent(msg) {
            return None;
        }
        let at = msg.find("node \"")? + 6;
        let end = at + msg[at..].find("\" (")?;
        let cut = self.source.as_onnx()?.cut_at(&msg[at..end])?;
        let head = match cut.head() {
            Some(m) => {
                let name = format!("{} (before {})", self.source.name(), cut.node_label());
                match DynamicModel::new(
                    Arc::new(OnnxSource::from_model(m, &name)),
                    self.device(),
                    BTreeMap::new(),
                ) {
                    Ok(mut h) => {
                        h.context = Some(format!(
                            "segment before {} (the model runs in segments around it)",
                            cut.node_label()
                        ));
                        Some(h)
                    }
                    Err(e) => return Some(Err(e)),
                }
            }
            None => None,
        };
        Some(Ok(Segmented {
            cut,
            head,
            tail: None,
            tail_built: false,
            body: None,
        }))
    }

    fn run_segmented(&mut self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        self.signature(inputs)?;
        let device = self.device();
        let outputs = self.output_names();
        let name = self.source.name().to_string();
        let seg = self.segmented.as_mut().expect("checked by the caller");
        let at = seg.cut.node_label();
        let mut vals: HashMap<String, Tensor> = inputs
            .iter()
            .map(|(n, t)| (n.to_string(), (*t).clone()))
            .collect();
        let feed = |m: &DynamicModel, vals: &HashMap<String, Tensor>| -> Vec<(String, Tensor)> {
            m.guards()
                .iter()
                .map(|g| g.name.clone())
                .chain(m.value_input_names())
                .filter_map(|n| vals.get(&n).map(|t| (n, t.clone())))
                .collect()
        };
        // The sequence / optional inputs a part reads keep their layouts.
        let layouts = &self.values;
        let layouts_for = |m: &DynamicModel| -> HashMap<String, rlx_onnx_import::ValueInput> {
            let names = m
                .source
                .as_onnx()
                .map(|o| o.input_names())
                .unwrap_or_default();
            layouts
                .iter()
                .filter(|(n, _)| names.contains(n))
                .map(|(n, l)| (n.clone(), l.clone()))
                .collect()
        };
        // A part's outputs by name (a sequence output would come back as several tensors).
        let take = |names: &[String], outs: Vec<Tensor>, vals: &mut HashMap<String, Tensor>| {
            if outs.len() != names.len() {
                return Err(RuntimeError::Input(format!(
                    "{name}: a sequence or optional value crosses the segments around node {at} (not supported: the values between segments are tensors)"
                )));
            }
            for (n, t) in names.iter().zip(outs) {
                vals.insert(n.clone(), t);
            }
            Ok(())
        };
        // Set once a part of this run reported a NaN/Inf: the later parts then do not print
        // reports at their inputs, which only carry it.
        // A model that is itself a part whose inputs carry a reported value (a Loop body in
        // a later iteration) starts quiet.
        let mut reported = self.quiet_inputs;
        let outer = self.context.clone();
        if let Some(h) = seg.head.as_mut() {
            h.set_quiet_input_reports(reported);
            let l = layouts_for(h);
            h.set_value_inputs(l);
            let fed = feed(h, &vals);
            let named: Vec<(&str, &Tensor)> = fed.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let outs = h.run_tensors(&named)?;
            reported |= h.last_run_reported();
            take(seg.cut.head_outputs(), outs, &mut vals)?;
        }
        // The cut node, on the CPU, with its inputs as constants.
        let types = |names: &[String], vals: &HashMap<String, Tensor>| {
            names
                .iter()
                .filter_map(|n| {
                    vals.get(n)
                        .map(|t| (n.clone(), (t.dtype(), t.dims().len())))
                })
                .collect::<HashMap<_, _>>()
        };
        let node_err =
            |e: String| RuntimeError::Input(format!("{name}: node {at}, run between plans: {e}"));
        let om = seg
            .cut
            .op_model(&types(seg.cut.op_inputs(), &vals))
            .map_err(node_err)?;
        // The node's inputs, sequence / optional ones as their elements (`s[0]`, ...).
        let op_layouts: HashMap<String, rlx_onnx_import::ValueInput> = layouts
            .iter()
            .filter(|(n, _)| seg.cut.op_inputs().contains(n))
            .map(|(n, l)| (n.clone(), l.clone()))
            .collect();
        let consts: HashMap<String, Tensor> = vals
            .iter()
            .filter(|(n, _)| {
                seg.cut.op_inputs().contains(n)
                    || n.split_once('[')
                        .is_some_and(|(b, _)| op_layouts.contains_key(b))
            })
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        // A Loop / If first with only what its lowering needs frozen (trip count,
        // condition): its body's ops then run as ops, so the NaN scan and the printer see
        // them, each named with its iteration. Everything frozen when that import fails.
        let mut fed: Vec<(String, Tensor)> = vec![];
        let partial = seg.cut.import_time_inputs().and_then(|keep| {
            let (frozen, live): (HashMap<String, Tensor>, HashMap<String, Tensor>) = consts
                .clone()
                .into_iter()
                .partition(|(n, _)| keep.contains(n) || !seg.cut.op_inputs().contains(n));
            let input_shapes = live
                .iter()
                .map(|(n, t)| (n.clone(), t.dims().to_vec()))
                .collect();
            let g = om
                .import(&rlx_onnx_import::ImportOptions {
                    constant_inputs: frozen,
                    input_shapes,
                    value_inputs: op_layouts.clone(),
                    ..Default::default()
                })
                .ok()?;
            fed = live.into_iter().collect();
            Some(g)
        });
        // A Loop the importer cannot unroll (a condition its body computes from data, more
        // iterations than it unrolls): its body runs as a model of its own, once per
        // iteration, at run time.
        if partial.is_none() && seg.cut.op_type() == "Loop" {
            let env = LoopEnv {
                device,
                options: self.session.options.clone(),
                name: name.clone(),
                outer: outer.clone(),
            };
            let outs = run_loop(&seg.cut, &mut seg.body, &vals, &env, &mut reported)?;
            for (n, t) in outs {
                vals.insert(n, t);
            }
        }
        let g = match partial {
            _ if seg.cut.op_type() == "Loop"
                && seg.cut.op_outputs().iter().all(|o| vals.contains_key(o)) =>
            {
                None
            }
            Some(g) => Some(g),
            None => Some(
                om.import(&rlx_onnx_import::ImportOptions {
                    constant_inputs: consts,
                    value_inputs: op_layouts,
                    ..Default::default()
                })
                .map_err(|e| node_err(e.to_string()))?,
            ),
        };
        if let Some(g) = g {
            // The rest's compile options (lint); the debug mode and the printer are read from
            // the environment per run, as the segments' plans do.
            let mut c = Session::new(Device::Cpu)
                .with_options(self.session.options.clone())
                .try_compile(g)?;
            c.set_report_context(Some("run alone between segments".into()));
            let names: Vec<String> = c.outputs().into_iter().map(|(n, _)| n).collect();
            let fed: Vec<(&str, &Tensor)> = c
                .inputs()
                .into_iter()
                .filter_map(|(n, _)| {
                    fed.iter()
                        .find(|(f, _)| *f == n)
                        .map(|(f, t)| (f.as_str(), t))
                })
                .collect();
            c.set_quiet_input_reports(reported);
            let outs = c.run_tensor_refs(&fed)?;
            reported |= !c.nan_reports().is_empty();
            // By the names the import gave them: a sequence output is its elements, `s[i]`.
            for (n, t) in names.into_iter().zip(outs) {
                vals.insert(n, t);
            }
        }
        if !seg.tail_built {
            let tm = seg
                .cut
                .tail_model(&types(seg.cut.tail_inputs(), &vals))
                .map_err(node_err)?;
            seg.tail = match tm {
                Some(m) => {
                    // Sizes of values computed inside the model may be 0 (no box kept).
                    let cut = &seg.cut;
                    let ranges: BTreeMap<String, DimRange> = cut
                        .tail_inputs()
                        .iter()
                        .filter(|n| !self.guards.iter().any(|g| &g.name == *n))
                        .filter_map(|n| vals.get(n).map(|t| (n, t.dims().len())))
                        .flat_map(|(n, r)| {
                            (0..r).map(move |i| {
                                (cut.dim_symbol(n, i), DimRange { min: 0, max: None })
                            })
                        })
                        .collect();
                    let tname = format!("{name} (after {at})");
                    let mut t = DynamicModel::new(
                        Arc::new(OnnxSource::from_model(m, &tname)),
                        device,
                        ranges,
                    )?;
                    t.context = Some(format!(
                        "segment after {at}: its Input nodes other than the model's inputs carry values computed before {at}"
                    ));
                    let l = layouts_for(&t);
                    t.set_value_inputs(l);
                    Some(t)
                }
                None => None,
            };
            seg.tail_built = true;
        }
        if let Some(t) = seg.tail.as_mut() {
            let fed = feed(t, &vals);
            let named: Vec<(&str, &Tensor)> = fed.iter().map(|(n, t)| (n.as_str(), t)).collect();
            t.set_quiet_input_reports(reported);
            let outs = t.run_tensors(&named)?;
            reported |= t.last_run_reported();
            take(seg.cut.tail_outputs(), outs, &mut vals)?;
        }
        // A sequence / optional output is returned as its elements (`s[0]`, ...), as a
        // plan returns it; an empty one as nothing.
        let mut out = vec![];
        for n in &outputs {
            if let Some(t) = vals.remove(n) {
                out.push(t);
                continue;
            }
            let mut i = 0;
            while let Some(t) = vals.remove(&format!("{n}[{i}]")) {
                out.push(t);
                i += 1;
            }
            if i == 0 && !seg.cut.op_outputs().contains(n) {
                return Err(RuntimeError::Input(format!(
                    "{name}: output \"{n}\" was not computed"
                )));
            }
        }
        self.last_reported = reported;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ranges() {
        assert_eq!(DimRange::parse("4"), Ok(DimRange::exact(4)));
        assert_eq!(
            DimRange::parse("1..64"),
            Ok(DimRange {
                min: 1,
                max: Some(64)
            })
        );
        assert_eq!(DimRange::parse("1..=64"), DimRange::parse("1..64"));
        assert_eq!(DimRange::parse("2.."), Ok(DimRange { min: 2, max: None }));
        assert!(DimRange::parse("5..4").unwrap_err().contains("larger"));
        assert!(DimRange::parse("a..4").unwrap_err().contains("MIN"));
        assert!(DimRange::parse("-1").is_err());
        let r = DimRange::parse("1..64").unwrap();
        assert!(r.accepts(1) && r.accepts(64) && !r.accepts(0) && !r.accepts(65));
        assert_eq!(r.to_string(), "1..64");
    }
}
