//! One case, in this process: import `model.onnx`, compile it for the CPU, run every
//! `test_data_set_<i>`, compare the outputs with `output_<j>.pb`; optionally run again with the
//! NaN/Inf localizer on ([`DebugMode::Warn`], what `RLX_DEBUG_NANS=1` selects) and check that
//! it changes nothing.
//!
//! Nothing is frozen: every graph input is fed at run time. A model whose import needs a value
//! known only when it runs goes through the runtime's own way with such models,
//! [`rlx_runtime::DynamicModel`], as `rlx run` does: a parameter input (a Reshape's `shape`, a
//! TopK's `k`) plans the graph by its value, a value-dependent node (NonZero, Unique, a Loop
//! with a run-time trip count) splits the model into segments run around it. [`Outcome::run_path`]
//! records which.
//!
//! The suite runs each case in a child process (`rlx-conformance case DIR`), so a hang, a stack
//! overflow or an abort costs that case only; panics are caught here and reported as
//! [`Stage::Panic`].

use crate::compare::{self, ATOL, RTOL};
use crate::onnx_meta::{elem_type_name, ModelMeta, ValueKind};
use rlx_ir::numeric_check::{BadKind, DebugMode};
use rlx_ir::Tensor;
use rlx_onnx_import::{
    import_onnx, read_tensor_proto, read_value_input, read_value_proto, ImportOptions, ValueInput,
};
use rlx_runtime::{CompiledGraph, Device, Session};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// Where a case stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The harness could not read the case (a broken fixture, not an RLX failure).
    Load,
    /// `import_onnx` returned an error (unsupported op, bad attribute, ...).
    Import,
    /// `Session::try_compile` returned an error.
    Compile,
    /// A test input is not representable as an RLX tensor (sequence, string, uint16, ...).
    Input,
    /// `run_tensors` returned an error.
    Run,
    /// An expected output is not representable (sequence, string, ...), or the output count differs.
    Output,
    /// An output has the wrong dtype, dims or values.
    Compare,
    /// A panic (caught) in the importer, compiler or executor.
    Panic,
    /// The child process ran past the per-case time limit (set by the suite).
    Timeout,
    /// The child process died (signal, abort, stack overflow; set by the suite).
    Crash,
    /// Every output of every data set matched.
    Pass,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Load => "load",
            Stage::Import => "import",
            Stage::Compile => "compile",
            Stage::Input => "input",
            Stage::Run => "run",
            Stage::Output => "output",
            Stage::Compare => "compare",
            Stage::Panic => "panic",
            Stage::Timeout => "timeout",
            Stage::Crash => "crash",
            Stage::Pass => "pass",
        }
    }
}

/// How a case's model ran (over all its data sets, the furthest from [`RunPath::Static`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RunPath {
    /// Imported and compiled as it is (the input shapes bound from the data).
    #[default]
    Static,
    /// The import needs the value of a parameter input (a Reshape's `shape`, a TopK's `k`):
    /// [`rlx_runtime::DynamicModel`] planned the graph by that value.
    ByValue,
    /// A node's output shape or control flow depends on values (NonZero, Unique, an If or Loop
    /// deciding on a run-time value): [`rlx_runtime::DynamicModel`] ran the model in segments
    /// around it (no localizer run then: each segment is a plan of its own).
    Segments,
}

/// The result of the plain run (localizer off).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub stage: Stage,
    /// Empty on a pass; else one line naming the data set / output and what went wrong.
    pub detail: String,
    /// Wall time of import + compile + runs + compares, milliseconds.
    pub ms: f64,
    /// Whether an expected output holds NaN or an infinity.
    pub expected_nonfinite: bool,
    /// How the model ran: as it is, or through the runtime's dynamic path (as far as the
    /// case got; `rlx_results.json`'s `"run_path"`: `static`, `by_value`, `segments`).
    #[serde(default)]
    pub run_path: RunPath,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.stage == Stage::Pass
    }
}

/// A NaN/Inf report of the localizer, as recorded by the suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportBrief {
    pub label: String,
    pub op: String,
    pub source_op: Option<String>,
    /// `NaN`, `PosInf` or `NegInf`.
    pub kind: String,
    pub culprit: bool,
    /// Whether `label` names one of the ONNX model's nodes (its name or an output name) or a
    /// graph input.
    pub names_onnx_node: bool,
}

/// The result of the second run with the localizer on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DebugOutcome {
    /// True when every data set gave bit-identical outputs (or the same error) with the
    /// localizer on and off.
    pub same: bool,
    /// What differed (empty when `same`).
    pub detail: String,
    pub reports: Vec<ReportBrief>,
    pub summary: Option<String>,
}

/// One line the child prints on stdout, prefixed with [`LINE_PREFIX`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase")]
pub enum Line {
    Normal(Outcome),
    Debug(DebugOutcome),
}

/// Prefix of the child's result lines (anything else on stdout is ignored).
pub const LINE_PREFIX: &str = "@@rlx-conformance ";

/// Exit status of `rlx-conformance case DIR` when the case ran but did not pass (or the
/// localizer run changed something); 0 on a pass. The suite takes it, with a result line, as
/// a normal end of the child rather than a crash.
pub const EXIT_NOT_PASSED: u8 = 1;

/// The `test_data_set_<i>` folders of a case, in numeric order.
pub fn data_sets(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let i = name.strip_prefix("test_data_set_")?.parse().ok()?;
            Some((i, e.path()))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// Read a fixture file, refusing anything but a regular file (following symlinks): reading a
/// FIFO or a device would block or never end. Errors name the path.
pub fn read_regular(path: &Path) -> Result<Vec<u8>, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !md.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Read the model's metadata.
pub fn load_meta(dir: &Path) -> Result<ModelMeta, String> {
    let path = dir.join("model.onnx");
    let bytes = read_regular(&path)?;
    ModelMeta::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The `j` of every `output_<j>.pb` in a data set folder, sorted.
fn output_file_indices(ds: &Path) -> Vec<usize> {
    let mut v: Vec<usize> = std::fs::read_dir(ds)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("output_")?
                .strip_suffix(".pb")?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v
}

struct Fail(Stage, String);

fn fail<T>(stage: Stage, msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(stage, msg.into()))
}

static PANIC_MSG: Mutex<Option<String>> = Mutex::new(None);

/// Replace the panic hook with one that records the message (with its location) for
/// [`guarded`] instead of printing it.
pub fn install_quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "(non-string panic payload)".to_string()
        };
        let loc = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut m) = PANIC_MSG.lock() {
            *m = Some(format!("{msg}{loc}"));
        }
    }));
}

/// Run `f`, turning a panic into `Fail(Panic, "<what> panicked: <message>")`.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Fail> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Ok(v),
        Err(_) => {
            let msg = PANIC_MSG
                .lock()
                .ok()
                .and_then(|mut m| m.take())
                .unwrap_or_default();
            fail(Stage::Panic, format!("{what} panicked: {msg}"))
        }
    }
}

/// A data set's inputs (by graph input name) and raw expected outputs.
struct DataSet {
    name: String,
    inputs: Vec<(String, Tensor)>,
    /// Layouts of the sequence / optional inputs (their tensors are in `inputs` as
    /// `name[i]`, or `name` for an optional tensor).
    values: HashMap<String, ValueInput>,
    outputs: Vec<PathBuf>,
}

fn read_inputs(meta: &ModelMeta, ds: &Path) -> Result<DataSet, Fail> {
    let name = ds
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut inputs = vec![];
    let mut values = HashMap::new();
    for (j, vi) in meta.inputs.iter().enumerate() {
        let f = ds.join(format!("input_{j}.pb"));
        if !f.exists() {
            continue;
        }
        if matches!(vi.kind, ValueKind::Sequence | ValueKind::Optional) {
            let bytes = read_regular(&f).map_err(|e| Fail(Stage::Load, e))?;
            let (layout, ts) = read_value_input(&bytes, matches!(vi.kind, ValueKind::Optional))
                .map_err(|e| {
                    Fail(
                        Stage::Input,
                        format!("{name}: input {j} \"{}\": {e}", vi.name),
                    )
                })?;
            let named = matches!(layout, ValueInput::OptionalTensor(..));
            for (i, t) in ts.into_iter().enumerate() {
                let n = if named {
                    vi.name.clone()
                } else {
                    format!("{}[{i}]", vi.name)
                };
                inputs.push((n, t));
            }
            values.insert(vi.name.clone(), layout);
            continue;
        }
        if !matches!(vi.kind, ValueKind::Tensor { .. }) {
            return fail(
                Stage::Input,
                format!(
                    "{name}: input {j} \"{}\" is a {} (RLX runs tensors only)",
                    vi.name,
                    vi.kind.describe()
                ),
            );
        }
        let bytes = read_regular(&f).map_err(|e| Fail(Stage::Load, e))?;
        match read_tensor_proto(&bytes) {
            Ok((_, t)) => inputs.push((vi.name.clone(), t)),
            Err(e) => {
                return fail(
                    Stage::Input,
                    format!("{name}: input {j} \"{}\": {e}", vi.name),
                )
            }
        }
    }
    let mut outputs = vec![];
    for j in 0..meta.outputs.len() {
        let f = ds.join(format!("output_{j}.pb"));
        if !f.exists() {
            return fail(Stage::Load, format!("{name}: missing output_{j}.pb"));
        }
        outputs.push(f);
    }
    // The output count is exact: an expected output the model does not produce is a failure.
    let extra: Vec<String> = output_file_indices(ds)
        .into_iter()
        .filter(|&j| j >= meta.outputs.len())
        .map(|j| format!("output_{j}.pb"))
        .collect();
    if !extra.is_empty() {
        return fail(
            Stage::Output,
            format!(
                "{name}: the model has {} outputs, the data set has more expected outputs ({})",
                meta.outputs.len(),
                extra.join(", ")
            ),
        );
    }
    Ok(DataSet {
        name,
        inputs,
        values,
        outputs,
    })
}

/// The expected outputs of a data set, each as a named tensor, or the reason one is not
/// representable. A sequence or optional output counts as its tensors in order (`name[i]`),
/// which is how the importer exposes such a graph output.
fn read_expected(meta: &ModelMeta, ds: &DataSet) -> Result<Vec<(String, Tensor)>, Fail> {
    let mut v = vec![];
    for (j, f) in ds.outputs.iter().enumerate() {
        let vi = &meta.outputs[j];
        match &vi.kind {
            ValueKind::Tensor { elem_type, .. } => {
                let bytes = read_regular(f).map_err(|e| Fail(Stage::Load, e))?;
                match read_tensor_proto(&bytes) {
                    Ok((_, t)) => v.push((vi.name.clone(), t)),
                    Err(e) => {
                        return fail(
                            Stage::Output,
                            format!(
                                "{}: expected output {j} \"{}\" ({}) is not an RLX tensor: {e}",
                                ds.name,
                                vi.name,
                                elem_type_name(*elem_type)
                            ),
                        )
                    }
                }
            }
            k @ (ValueKind::Sequence | ValueKind::Optional) => {
                let bytes = read_regular(f).map_err(|e| Fail(Stage::Load, e))?;
                match read_value_proto(&bytes, matches!(k, ValueKind::Optional)) {
                    Ok(ts) => {
                        let seq = matches!(k, ValueKind::Sequence) || ts.len() > 1;
                        for (i, t) in ts.into_iter().enumerate() {
                            let name = if seq {
                                format!("{}[{i}]", vi.name)
                            } else {
                                vi.name.clone()
                            };
                            v.push((name, t));
                        }
                    }
                    Err(e) => {
                        return fail(
                            Stage::Output,
                            format!(
                                "{}: expected output {j} \"{}\" ({}) is not readable: {e}",
                                ds.name,
                                vi.name,
                                k.describe()
                            ),
                        )
                    }
                }
            }
            k => {
                return fail(
                    Stage::Output,
                    format!(
                        "{}: expected output {j} \"{}\" is a {} (RLX runs tensors only)",
                        ds.name,
                        vi.name,
                        k.describe()
                    ),
                )
            }
        }
    }
    Ok(v)
}

/// Whether an expected tensor output of the data set in `ds` holds NaN or an infinity
/// (outputs RLX cannot read count as finite).
fn expected_has_nonfinite(meta: &ModelMeta, ds: &Path) -> bool {
    (0..meta.outputs.len()).any(|j| {
        matches!(meta.outputs[j].kind, ValueKind::Tensor { .. })
            && read_regular(&ds.join(format!("output_{j}.pb")))
                .ok()
                .and_then(|b| read_tensor_proto(&b).ok())
                .is_some_and(|(_, t)| compare::has_nonfinite(&t))
    })
}

fn feed<'a>(c: &CompiledGraph, inputs: &'a [(String, Tensor)]) -> Vec<(&'a str, Tensor)> {
    let declared: Vec<String> = c.inputs().into_iter().map(|(n, _)| n).collect();
    inputs
        .iter()
        .filter(|(n, _)| declared.contains(n))
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect()
}

/// What a plain run of one data set gave (kept for the debug comparison).
type RunResult = Result<Vec<Tensor>, String>;

/// One data set, compiled (each data set is imported with its own input shapes, or planned
/// by its own parameter values).
struct Prepared {
    compiled: CompiledGraph,
    ds: DataSet,
    plain: RunResult,
}

/// Import the model for one data set, graph input shapes from the data (every input stays an
/// input: nothing is frozen).
fn import_for(dir: &Path, ds: &DataSet) -> Result<rlx_ir::Graph, Fail> {
    let model = dir.join("model.onnx");
    let opts = ImportOptions {
        input_shapes: ds
            .inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.dims().to_vec()))
            .collect(),
        value_inputs: ds.values.clone(),
        ..ImportOptions::default()
    };
    match guarded("import", || import_onnx(&model, &opts))? {
        Ok(g) => Ok(g),
        Err(e) => fail(Stage::Import, e.to_string()),
    }
}

fn run_plain(
    dir: &Path,
    meta: &ModelMeta,
    expected_nonfinite: &mut bool,
    run_path: &mut RunPath,
) -> (Result<(), Fail>, Vec<Prepared>) {
    let dss = data_sets(dir);
    if dss.is_empty() {
        return (fail(Stage::Load, "no test_data_set_* folder"), vec![]);
    }
    *expected_nonfinite = dss.iter().any(|ds| expected_has_nonfinite(meta, ds));
    let mut prepared = vec![];
    let mut first_fail: Option<Fail> = None;
    for dsp in &dss {
        let ds = match read_inputs(meta, dsp) {
            Ok(d) => d,
            Err(f) if f.0 == Stage::Input => {
                // Prefer the importer's own verdict on the model (an unsupported op or input
                // type) over "this input is not a tensor".
                let bare = DataSet {
                    name: String::new(),
                    inputs: vec![],
                    values: HashMap::new(),
                    outputs: vec![],
                };
                return match import_for(dir, &bare) {
                    Err(fi) if fi.0 == Stage::Import || fi.0 == Stage::Panic => (Err(fi), prepared),
                    _ => (Err(f), prepared),
                };
            }
            Err(f) => return (Err(f), prepared),
        };
        let g = match import_for(dir, &ds) {
            Ok(g) => Some(g),
            // A value known only when the model runs: the runtime's own way with it
            // (`rlx_runtime::dynamic`: parameter inputs planned by value, value-dependent
            // nodes run between plans), as `rlx run` does it.
            Err(f) if f.0 == Stage::Import && rlx_runtime::dynamic::is_value_dependent(&f.1) => {
                None
            }
            Err(f) => return (Err(f), prepared),
        };
        let built = match g {
            Some(g) => guarded("compile", || Session::new(Device::Cpu).try_compile(g))
                .map(|r| r.map_err(|e| Fail(Stage::Compile, e.to_string()))),
            None => match run_dynamic(dir, &ds) {
                Dynamic::Plan(c) => {
                    *run_path = (*run_path).max(RunPath::ByValue);
                    Ok(Ok(c))
                }
                Dynamic::Segmented(plain) => {
                    *run_path = RunPath::Segments;
                    // Ran in segments: compared, but no localizer comparison (the segments
                    // are plans of their own).
                    let plain: RunResult = plain.map_err(|f| {
                        first_fail.get_or_insert(Fail(f.0, format!("{}: {}", ds.name, f.1)));
                        f.1
                    });
                    if let Ok(out) = &plain {
                        if first_fail.is_none() {
                            match read_expected(meta, &ds) {
                                Err(f) => first_fail = Some(f),
                                Ok(exp) => {
                                    if let Err(f) = check_outputs(&ds.name, &exp, out) {
                                        first_fail = Some(f);
                                    }
                                }
                            }
                        }
                    }
                    continue;
                }
                Dynamic::Fail(f) => Err(f),
            },
        };
        let mut compiled = match built {
            Ok(Ok(c)) => c,
            Ok(Err(f)) => return (Err(f), prepared),
            Err(f) => return (Err(f), prepared),
        };
        compiled.set_debug_mode(Some(DebugMode::Off));
        compiled.set_print_reports(false);
        let inputs = feed(&compiled, &ds.inputs);
        let plain: RunResult = match guarded("run", || compiled.run_tensors(inputs)) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => {
                first_fail.get_or_insert(Fail(Stage::Run, format!("{}: {e}", ds.name)));
                Err(e.to_string())
            }
            Err(f) => {
                first_fail.get_or_insert(Fail(f.0, format!("{}: {}", ds.name, f.1)));
                Err(f.1)
            }
        };
        if let Ok(out) = &plain {
            if first_fail.is_none() {
                match read_expected(meta, &ds) {
                    Err(f) => first_fail = Some(f),
                    Ok(exp) => {
                        if let Err(f) = check_outputs(&ds.name, &exp, out) {
                            first_fail = Some(f);
                        }
                    }
                }
            }
        }
        prepared.push(Prepared {
            compiled,
            ds,
            plain,
        });
    }
    let r = match first_fail {
        Some(f) => Err(f),
        None => Ok(()),
    };
    (r, prepared)
}

/// A data set through the runtime's dynamic model ([`rlx_runtime::DynamicModel`]).
// One value per load or run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Dynamic {
    /// One plan (parameter inputs planned by value): compared and localizer-checked as usual.
    Plan(CompiledGraph),
    /// The model ran in segments around a value-dependent node: its outputs (or the failure).
    Segmented(Result<Vec<Tensor>, Fail>),
    Fail(Fail),
}

fn run_dynamic(dir: &Path, ds: &DataSet) -> Dynamic {
    use rlx_runtime::{DynamicModel, OnnxSource};
    let made = guarded("dynamic model", || {
        OnnxSource::open(&dir.join("model.onnx")).and_then(|s| {
            DynamicModel::new(
                std::sync::Arc::new(s),
                Device::Cpu,
                std::collections::BTreeMap::new(),
            )
        })
    });
    let mut m = match made {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Dynamic::Fail(Fail(Stage::Import, e.to_string())),
        Err(f) => return Dynamic::Fail(f),
    };
    m.set_value_inputs(ds.values.clone());
    let named: Vec<(&str, &Tensor)> = ds.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    match guarded("plan", || m.take_plan(&named)) {
        Ok(Ok(c)) => Dynamic::Plan(c),
        Ok(Err(e)) if rlx_runtime::dynamic::is_value_dependent(&e.to_string()) => {
            Dynamic::Segmented(match guarded("run in segments", || m.run_tensors(&named)) {
                Ok(Ok(o)) => Ok(o),
                Ok(Err(e)) => Err(Fail(Stage::Run, e.to_string())),
                Err(f) => Err(f),
            })
        }
        Ok(Err(e)) => Dynamic::Fail(Fail(Stage::Import, e.to_string())),
        Err(f) => Dynamic::Fail(f),
    }
}

fn check_outputs(ds: &str, expected: &[(String, Tensor)], got: &[Tensor]) -> Result<(), Fail> {
    if expected.len() != got.len() {
        return fail(
            Stage::Output,
            format!("{ds}: {} outputs, expected {}", got.len(), expected.len()),
        );
    }
    for (j, ((name, e), g)) in expected.iter().zip(got).enumerate() {
        if let Err(m) = compare::compare(e, g, RTOL, ATOL) {
            return fail(Stage::Compare, format!("{ds}: output {j} \"{name}\": {m}"));
        }
    }
    Ok(())
}

fn run_debug(meta: &ModelMeta, prepared: &mut [Prepared]) -> DebugOutcome {
    let mut diffs = vec![];
    let mut reports = vec![];
    let mut summary = None;
    for p in prepared.iter_mut() {
        p.compiled.set_debug_mode(Some(DebugMode::Warn));
        p.compiled.set_print_reports(false);
        let (ds, plain) = (&p.ds, &p.plain);
        let inputs = feed(&p.compiled, &ds.inputs);
        let dbg: RunResult = match guarded("run with RLX_DEBUG_NANS=1", || {
            p.compiled.run_tensors(inputs)
        }) {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => Err(e.to_string()),
            Err(f) => Err(f.1),
        };
        match (plain, &dbg) {
            (Ok(a), Ok(b)) => {
                if a.len() != b.len() {
                    diffs.push(format!(
                        "{}: {} outputs with the localizer, {} without",
                        ds.name,
                        b.len(),
                        a.len()
                    ));
                } else if let Some(j) = (0..a.len()).find(|&j| !compare::identical(&a[j], &b[j])) {
                    diffs.push(format!(
                        "{}: output {j} differs with the localizer on",
                        ds.name
                    ));
                }
            }
            (Err(a), Err(b)) if a == b => {}
            (Err(a), Err(b)) => diffs.push(format!("{}: error changed: {a} → {b}", ds.name)),
            (Ok(_), Err(b)) => diffs.push(format!(
                "{}: fails only with the localizer on: {b}",
                ds.name
            )),
            (Err(a), Ok(_)) => diffs.push(format!(
                "{}: runs only with the localizer on (without: {a})",
                ds.name
            )),
        }
        for r in p.compiled.nan_reports() {
            reports.push(ReportBrief {
                label: r.label.clone(),
                op: r.op.clone(),
                source_op: r.source_op.clone(),
                kind: match r.kind {
                    BadKind::NaN => "NaN".into(),
                    k => format!("{k:?}"),
                },
                culprit: r.is_culprit(),
                names_onnx_node: meta.names_a_node(&r.label),
            });
        }
        if summary.is_none() {
            summary = p.compiled.nan_summary().map(str::to_string);
        }
    }
    DebugOutcome {
        same: diffs.is_empty(),
        detail: diffs.join("; "),
        reports,
        summary,
    }
}

/// Run the case in `dir` and hand each result line to `emit` as soon as it is known: first
/// [`Line::Normal`], then (with `debug_nans`, when the model compiled) [`Line::Debug`].
///
/// A model whose import needs a run-time value runs through [`rlx_runtime::DynamicModel`]
/// ([`Outcome::run_path`]).
pub fn run_case(dir: &Path, debug_nans: bool, emit: &mut dyn FnMut(&Line)) {
    let t0 = Instant::now();
    let meta = match load_meta(dir) {
        Ok(m) => m,
        Err(e) => {
            emit(&Line::Normal(Outcome {
                stage: Stage::Load,
                detail: e,
                ms: 0.0,
                expected_nonfinite: false,
                run_path: RunPath::Static,
            }));
            return;
        }
    };
    let mut expected_nonfinite = false;
    let mut run_path = RunPath::Static;
    let (r, mut prepared) = run_plain(dir, &meta, &mut expected_nonfinite, &mut run_path);
    let (stage, detail) = match r {
        Ok(()) => (Stage::Pass, String::new()),
        Err(Fail(s, d)) => (s, d),
    };
    emit(&Line::Normal(Outcome {
        stage,
        detail,
        ms: t0.elapsed().as_secs_f64() * 1e3,
        expected_nonfinite,
        run_path,
    }));
    if debug_nans && !prepared.is_empty() {
        let d = run_debug(&meta, &mut prepared);
        emit(&Line::Debug(d));
    }
}
