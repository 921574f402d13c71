//! `rlx._native`: the Rust side of the `rlx` Python package (`python/rlx`).
//!
//! The boundary, kept thin on purpose (the Python side builds the objects people use):
//! * models load through `rlx_cli::load::load_with`, the function every CLI subcommand uses,
//!   so whatever `rlx run` accepts (`.onnx`, a model folder, `.pt2` once its importer is
//!   hooked in there) `rlx.run` accepts; packages (`.rlxpkg`) through `rlx_runtime::load_package`
//!   as `rlx run` does;
//! * arrays in: one copy of C-contiguous NumPy data into the tensor the runtime owns;
//!   arrays out: the runtime's `Vec` becomes the NumPy array's buffer (no copy);
//! * the GIL is released while importing, compiling and running;
//! * every error is a Python exception whose message is the CLI's one line, and a Rust
//!   panic is caught here and raised as `RlxError` (never unwinding into Python);
//! * `rlx.reduce` and `rlx.precision` parse the CLI's own arguments
//!   (`ReduceArgs::try_parse_from`) and call `rlx_cli::reduce::run` / `precision::run`.
//!
//! (One file over 1,000 lines: the whole Python boundary in one place, conversion helpers,
//! the `Model` class and the two file-writing tools; split when another class is added.)

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyList;
use rlx_cli::load::{load_with, ModelArgs};
use rlx_ir::{DType, Dim, Graph, Op, Shape, Tensor, TensorData};
use rlx_runtime::{CompiledGraph, Device, RuntimeError, Session};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// Tensors on cache lines (`rlx_kernels::alloc`).
#[global_allocator]
static ALLOC: rlx_kernels::alloc::LineAligned = rlx_kernels::alloc::LineAligned;

pyo3::create_exception!(
    rlx,
    RlxError,
    PyException,
    "Base class of every error rlx raises; the message is the CLI's one line."
);
pyo3::create_exception!(
    rlx,
    ModelError,
    RlxError,
    "The model cannot be read, imported or compiled (names the file or node)."
);
pyo3::create_exception!(
    rlx,
    InputError,
    RlxError,
    "An input is wrong: unknown name, wrong dtype or shape, unsupported array type."
);
pyo3::create_exception!(
    rlx,
    DeviceError,
    RlxError,
    "The device asked for is unknown or not available on this machine."
);

/// Which Python exception an error becomes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Model,
    Input,
    Device,
    Other,
}

/// An error on its way to Python: the CLI's message and the exception class.
#[derive(Debug)]
struct Fail {
    kind: Kind,
    msg: String,
}

impl Fail {
    fn new(kind: Kind, msg: impl Into<String>) -> Fail {
        Fail {
            kind,
            msg: msg.into(),
        }
    }

    fn to_py(&self) -> PyErr {
        let m = self.msg.clone();
        match self.kind {
            Kind::Model => ModelError::new_err(m),
            Kind::Input => InputError::new_err(m),
            Kind::Device => DeviceError::new_err(m),
            Kind::Other => RlxError::new_err(m),
        }
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        f.to_py()
    }
}

/// A `--input` / `--dim` flag in the CLI's message is a keyword argument here.
fn pythonize(msg: &str) -> String {
    let m = msg.replace("--input ", "input ");
    m.replace("--dim ", "dims ")
}

/// An error from loading (`rlx_cli::load`): inputs and dims are the caller's, the rest the model's.
fn load_fail(e: anyhow::Error) -> Fail {
    let msg = format!("{e:#}");
    let input = [
        "--input", "input \"", "--dim", "missing input", "unknown input", "rlx input-check",
    ]
    .iter()
    .any(|p| msg.starts_with(p))
        || msg.contains("unnamed --input")
        // The importer refusing an array's shape against the model's declared dims.
        || (msg.contains("graph input \"")
            && (msg.contains("given shape") || msg.contains(" here but ")));
    Fail::new(
        if input { Kind::Input } else { Kind::Model },
        pythonize(&msg),
    )
}

/// An error from compiling or running.
fn runtime_fail(e: &RuntimeError) -> Fail {
    let kind = match e {
        RuntimeError::DeviceUnavailable(_) => Kind::Device,
        RuntimeError::Input(_) | RuntimeError::InputCheck { .. } => Kind::Input,
        RuntimeError::Compile(_) | RuntimeError::Package(_) | RuntimeError::NoOutputs => {
            Kind::Model
        }
        _ => Kind::Other,
    };
    Fail::new(kind, e.to_string())
}

/// Run `f`, turning a panic into `RlxError` so that no unwind reaches Python.
fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(RlxError::new_err(format!(
                "internal error (a bug in rlx, please report it): {what}"
            )))
        }
    }
}

fn parse_device(s: &str) -> Result<Device, Fail> {
    rlx_cli::compile::parse_device(s)
        .map_err(|e| Fail::new(Kind::Device, e.to_string().replace("--device ", "device ")))
}

/// `None` follows `RLX_DEBUG_NANS`; otherwise off, warn, strict or abort.
fn parse_mode(s: Option<&str>) -> Result<Option<rlx_ir::DebugMode>, Fail> {
    use rlx_ir::DebugMode as M;
    Ok(match s.map(|s| s.trim().to_ascii_lowercase()) {
        None => None,
        Some(s) => Some(match s.as_str() {
            "off" | "0" | "false" | "no" => M::Off,
            "warn" | "1" | "true" | "on" | "yes" => M::Warn,
            "strict" => M::Strict,
            "abort" | "raise" => M::Abort,
            other => {
                return Err(Fail::new(
                    Kind::Input,
                    format!(
                        "debug_nans={other:?}: expected None, False, True, \"warn\", \"strict\" or \"abort\"/\"raise\""
                    ),
                ))
            }
        }),
    })
}

// ---------------------------------------------------------------------------------------
// Arrays

/// One NumPy array as a tensor (one copy). `dtype` is the rlx dtype name the Python side
/// chose (`f32`, `bf16`, ...); f16, bf16 and float8 arrays come as their bits (`uint16`,
/// `uint8` views).
fn array_to_tensor(name: &str, dtype: &str, arr: &Bound<'_, PyAny>) -> Result<Tensor, Fail> {
    let bad = |m: String| Fail::new(Kind::Input, format!("input \"{name}\": {m}"));
    let dt = DType::parse(dtype).ok_or_else(|| bad(format!("unsupported dtype {dtype}")))?;
    macro_rules! take {
        ($t:ty) => {{
            let a: PyReadonlyArrayDyn<'_, $t> = arr
                .extract()
                .map_err(|e| bad(format!("expected a NumPy array of {dtype}: {e}")))?;
            let dims = a.shape().to_vec();
            let v = a
                .as_slice()
                .map_err(|_| bad("the array is not C-contiguous".into()))?
                .to_vec();
            (dims, v)
        }};
    }
    use half::vec::HalfBitsVecExt;
    let (dims, data) = match dt {
        DType::F32 => {
            let (d, v) = take!(f32);
            (d, TensorData::F32(v))
        }
        DType::F64 => {
            let (d, v) = take!(f64);
            (d, TensorData::F64(v))
        }
        DType::F16 => {
            let (d, v) = take!(u16);
            (d, TensorData::F16(v.reinterpret_into()))
        }
        DType::BF16 => {
            let (d, v) = take!(u16);
            (d, TensorData::BF16(v.reinterpret_into()))
        }
        DType::I64 => {
            let (d, v) = take!(i64);
            (d, TensorData::I64(v))
        }
        DType::I32 => {
            let (d, v) = take!(i32);
            (d, TensorData::I32(v))
        }
        DType::I16 => {
            let (d, v) = take!(i16);
            (d, TensorData::I16(v))
        }
        DType::I8 => {
            let (d, v) = take!(i8);
            (d, TensorData::I8(v))
        }
        DType::U8 => {
            let (d, v) = take!(u8);
            (d, TensorData::U8(v))
        }
        DType::U16 => {
            let (d, v) = take!(u16);
            (d, TensorData::U16(v))
        }
        DType::U32 => {
            let (d, v) = take!(u32);
            (d, TensorData::U32(v))
        }
        DType::U64 => {
            let (d, v) = take!(u64);
            (d, TensorData::U64(v))
        }
        DType::Bool => {
            let (d, v) = take!(bool);
            (d, TensorData::Bool(v))
        }
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0 => {
            let (d, v) = take!(u8);
            (d, TensorData::narrow(dt, v))
        }
        other => return Err(bad(format!("dtype {other} is not supported for inputs"))),
    };
    Tensor::new(dims, data).map_err(|e| bad(e.to_string()))
}

/// `(name, rlx dtype name, array)` from Python into tensors.
fn arrays_in(arrays: &Bound<'_, PyList>) -> Result<Vec<(String, Tensor)>, Fail> {
    let mut out = vec![];
    for item in arrays.iter() {
        let (name, dtype, arr): (String, String, Bound<'_, PyAny>) = item
            .extract()
            .map_err(|e| Fail::new(Kind::Input, format!("inputs: {e}")))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(Fail::new(
                Kind::Input,
                format!("input \"{name}\": given twice"),
            ));
        }
        let t = array_to_tensor(&name, &dtype, &arr)?;
        out.push((name, t));
    }
    Ok(out)
}

/// A tensor as `(rlx dtype name, NumPy array)`, handing the tensor's buffer to NumPy.
/// f16 and bf16 come back as `uint16` bits (the Python side views them as `float16` /
/// `ml_dtypes.bfloat16`); float8/float4/int4/int2 values come back decoded as `float32` /
/// `int8` / `uint8`.
fn tensor_out<'py>(py: Python<'py>, t: Tensor) -> PyResult<(String, Bound<'py, PyAny>)> {
    use half::vec::HalfFloatVecExt;
    let dims = t.dims().to_vec();
    let dt = t.dtype();
    macro_rules! arr {
        ($v:expr) => {
            PyArray1::from_vec(py, $v).reshape(dims.clone())?.into_any()
        };
    }
    let (name, a) = match t.into_data() {
        TensorData::F32(v) => ("f32", arr!(v)),
        TensorData::F16(v) => ("f16", arr!(v.reinterpret_into())),
        TensorData::BF16(v) => ("bf16", arr!(v.reinterpret_into())),
        TensorData::F64(v) => ("f64", arr!(v)),
        TensorData::I64(v) => ("i64", arr!(v)),
        TensorData::I32(v) => ("i32", arr!(v)),
        TensorData::I16(v) => ("i16", arr!(v)),
        TensorData::I8(v) => ("i8", arr!(v)),
        TensorData::U8(v) => ("u8", arr!(v)),
        TensorData::U16(v) => ("u16", arr!(v)),
        TensorData::U32(v) => ("u32", arr!(v)),
        TensorData::U64(v) => ("u64", arr!(v)),
        TensorData::Bool(v) => ("bool", arr!(v)),
        d @ TensorData::Narrow { .. } => match dt {
            DType::I4 | DType::I2 => (
                "i8",
                arr!(d.to_i64_vec().iter().map(|&x| x as i8).collect::<Vec<_>>()),
            ),
            DType::U4 | DType::U2 => (
                "u8",
                arr!(d.to_i64_vec().iter().map(|&x| x as u8).collect::<Vec<_>>()),
            ),
            _ => ("f32", arr!(d.to_f32_vec())),
        },
    };
    Ok((name.to_string(), a))
}

/// A shape as Python values: static dims as ints, symbolic ones as their names.
fn shape_py(py: Python<'_>, s: &Shape) -> PyResult<Py<PyAny>> {
    let items: Vec<Py<PyAny>> = s
        .dims
        .iter()
        .map(|d| -> PyResult<Py<PyAny>> {
            Ok(match d {
                Dim::Static(n) => n.into_pyobject(py)?.into_any().unbind(),
                Dim::Sym(s) => s.into_pyobject(py)?.into_any().unbind(),
            })
        })
        .collect::<PyResult<_>>()?;
    Ok(PyList::new(py, items)?.into_any().unbind())
}

// ---------------------------------------------------------------------------------------
// Models

/// The compiled graph for one device and one set of given input types.
struct Compiled {
    /// Device, then `(name, dtype, dims)` of each given array, sorted by name.
    key: (Device, Vec<(String, DType, Vec<usize>)>),
    graph: CompiledGraph,
    /// Graph input names in order.
    order: Vec<String>,
    /// Generated tensors for inputs not given.
    generated: HashMap<String, Tensor>,
}

// One per model: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Source {
    /// An importable model (`.onnx`, folder, `.pt2`): the graph imported with no arrays
    /// given (symbolic dims bound by `dims`, else 1), and the inputs generated for it.
    Model {
        args: ModelArgs,
        base: Graph,
        base_feeds: Vec<(String, Tensor)>,
    },
    /// An ONNX model whose import needs values known only at run time (a node whose output
    /// shape depends on values): run through the runtime's dynamic model, in segments.
    Dynamic {
        model: Box<rlx_runtime::DynamicModel>,
        dims: HashMap<String, usize>,
        seed: u64,
    },
    /// A compiled package (`.rlxpkg`): its file, device type (from the manifest) and the
    /// seed of generated inputs.
    Package {
        path: PathBuf,
        device: Device,
        seed: u64,
    },
}

type Key = (Device, Vec<(String, DType, Vec<usize>)>);

fn key_of(device: Device, arrays: &[(String, Tensor)]) -> Key {
    let mut v: Vec<_> = arrays
        .iter()
        .map(|(n, t)| (n.clone(), t.dtype(), t.dims().to_vec()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    (device, v)
}

impl Source {
    fn default_device(&self) -> Device {
        match self {
            Source::Package { device, .. } => *device,
            Source::Model { .. } | Source::Dynamic { .. } => Device::Cpu,
        }
    }

    /// The imported graph and its feeds (arrays bound by name, the rest generated), as the
    /// CLI's `load` makes them. Models only.
    fn loaded(&self, arrays: &[(String, Tensor)]) -> Result<(Graph, Vec<(String, Tensor)>), Fail> {
        match self {
            Source::Model {
                args,
                base,
                base_feeds,
            } => {
                if arrays.is_empty() {
                    Ok((base.clone(), base_feeds.clone()))
                } else {
                    let l = load_with(args, true, arrays.to_vec()).map_err(load_fail)?;
                    Ok((l.graph, l.feeds))
                }
            }
            Source::Dynamic { .. } => Err(Fail::new(
                Kind::Model,
                "this model runs in segments around nodes whose output shapes depend on values; lint, diverge and trace need a model that imports with static shapes".to_string(),
            )),
            Source::Package { path, .. } => Err(Fail::new(
                Kind::Model,
                format!(
                    "{}: a package holds a compiled graph; lint, diverge and trace need the model it was compiled from (.onnx, .pt2)",
                    path.display()
                ),
            )),
        }
    }

    /// Compile for `device` with `arrays` given.
    fn build(&self, device: Device, arrays: &[(String, Tensor)]) -> Result<Compiled, Fail> {
        let key = key_of(device, arrays);
        let given: Vec<&str> = arrays.iter().map(|a| a.0.as_str()).collect();
        match self {
            Source::Model { .. } => {
                let (graph, feeds) = self.loaded(arrays)?;
                let s = Session::new(device)
                    .try_compile(graph)
                    .map_err(|e| runtime_fail(&e))?;
                Ok(Compiled {
                    key,
                    graph: s,
                    order: feeds.iter().map(|f| f.0.clone()).collect(),
                    generated: feeds
                        .into_iter()
                        .filter(|f| !given.contains(&f.0.as_str()))
                        .collect(),
                })
            }
            Source::Dynamic { .. } => Err(Fail::new(
                Kind::Other,
                "internal: a dynamic model is run, not built",
            )),
            Source::Package { path, seed, .. } => {
                let manifest =
                    rlx_runtime::package::read_manifest(path).map_err(|e| runtime_fail(&e))?;
                if manifest.dynamic.is_some() {
                    return build_dynamic(path, device, arrays, *seed, key);
                }
                let s = rlx_runtime::load_package(path, device).map_err(|e| runtime_fail(&e))?;
                let decl = s.inputs();
                // As `rlx run model.rlxpkg`: with the input check on, the guards report.
                let checked = s.check_inputs_enabled();
                for (name, t) in arrays {
                    match decl.iter().find(|d| d.0 == *name) {
                        None if !checked => {
                            let names: Vec<&str> = decl.iter().map(|d| d.0.as_str()).collect();
                            return Err(Fail::new(
                                Kind::Input,
                                format!(
                                    "input {name}: the package has no input named \"{name}\" (its inputs: {})",
                                    names.join(", ")
                                ),
                            ));
                        }
                        Some((_, shape))
                            if !checked
                                && (t.dtype() != shape.dtype
                                    || t.dims() != shape.dims_usize().as_slice()) =>
                        {
                            return Err(Fail::new(
                                Kind::Input,
                                format!(
                                    "input \"{name}\": the package expects {shape}, the array given holds {}",
                                    t.shape()
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
                let generated = decl
                    .iter()
                    .filter(|d| !given.contains(&d.0.as_str()))
                    .map(|(n, sh)| (n.clone(), rlx_cli::run::generate_input(n, sh, *seed)))
                    .collect();
                Ok(Compiled {
                    key,
                    graph: s,
                    order: decl.iter().map(|d| d.0.clone()).collect(),
                    generated,
                })
            }
        }
    }
}

/// A dynamic package (`rlx compile --dim batch=1..16`) planned for the arrays given: symbols
/// sized by the arrays, else by their range's minimum (at least 1); inputs not given are
/// generated at those sizes. A new set of array shapes plans again (see `State::prepare`).
fn build_dynamic(
    path: &std::path::Path,
    device: Device,
    arrays: &[(String, Tensor)],
    seed: u64,
    key: Key,
) -> Result<Compiled, Fail> {
    let mut m = rlx_runtime::load_dynamic_package(path, device).map_err(|e| runtime_fail(&e))?;
    let given: Vec<(&str, &Tensor)> = arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let sizes = m.sizes_for(&given, &HashMap::new());
    let mut generated = HashMap::new();
    for g in m.guards() {
        if arrays.iter().any(|a| a.0 == g.name) {
            continue;
        }
        let shape = g.shape_at(&sizes);
        rlx_runtime::check_input_size(&g.name, &shape).map_err(|e| runtime_fail(&e))?;
        generated.insert(
            g.name.clone(),
            rlx_cli::run::generate_input(&g.name, &shape, seed),
        );
    }
    let mut feeds: Vec<(&str, &Tensor)> = arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
    feeds.extend(generated.iter().map(|(n, t)| (n.as_str(), t)));
    let graph = m.take_plan(&feeds).map_err(|e| runtime_fail(&e))?;
    let order = m.plan_inputs();
    generated.retain(|n, _| order.contains(n));
    Ok(Compiled {
        key,
        graph,
        order,
        generated,
    })
}

/// A model that needs run-time values to import, as a [`Source::Dynamic`] (runs in segments).
fn dynamic_model(p: PathBuf, args: &ModelArgs, seed: u64) -> Result<NativeModel, Fail> {
    let path = rlx_cli::run::model_path(&p);
    let src = rlx_runtime::OnnxSource::open(&path).map_err(|e| runtime_fail(&e))?;
    let outputs = src.declared_outputs();
    let m = rlx_runtime::DynamicModel::new(
        std::sync::Arc::new(src),
        Device::Cpu,
        std::collections::BTreeMap::new(),
    )
    .map_err(|e| runtime_fail(&e))?;
    let dims = rlx_cli::load::parse_dims(&args.dims).map_err(load_fail)?;
    let inputs = m
        .guards()
        .iter()
        .map(|g| (g.name.clone(), g.declared_shape()))
        .collect();
    Ok(NativeModel {
        path: p,
        kind: "model",
        inputs,
        outputs,
        state: Mutex::new(State {
            source: Source::Dynamic {
                model: Box::new(m),
                dims,
                seed,
            },
            compiled: None,
        }),
    })
}

struct State {
    source: Source,
    compiled: Option<Compiled>,
}

/// A compiled graph and its feeds in graph input order.
type Prepared<'a> = (&'a mut CompiledGraph, Vec<(String, Tensor)>);

impl State {
    /// Compile (or reuse) the graph for `device` and `arrays`, and order the feeds.
    fn prepare(
        &mut self,
        device: Option<Device>,
        arrays: Vec<(String, Tensor)>,
    ) -> Result<Prepared<'_>, Fail> {
        let device = device.unwrap_or_else(|| self.source.default_device());
        let key = key_of(device, &arrays);
        if self.compiled.as_ref().map(|c| &c.key) != Some(&key) {
            self.compiled = None;
            self.compiled = Some(self.source.build(device, &arrays)?);
        }
        let c = self.compiled.as_mut().expect("just compiled");
        let mut given: HashMap<String, Tensor> = arrays.into_iter().collect();
        let mut feeds = vec![];
        for n in &c.order {
            let t = match given.remove(n) {
                Some(t) => t,
                None => c.generated.get(n).cloned().ok_or_else(|| {
                    Fail::new(
                        Kind::Other,
                        format!("internal: no tensor for input \"{n}\""),
                    )
                })?,
            };
            feeds.push((n.clone(), t));
        }
        // Under a package's input check, names the graph lacks go to its guards.
        feeds.extend(given);
        Ok((&mut c.graph, feeds))
    }

    fn run(
        &mut self,
        device: Option<Device>,
        arrays: Vec<(String, Tensor)>,
        mode: Option<rlx_ir::DebugMode>,
    ) -> Result<RunOut, Fail> {
        if let Source::Dynamic { model, dims, seed } = &mut self.source {
            if device.is_some_and(|d| d != model.device()) {
                return Err(Fail::new(
                    Kind::Device,
                    "a model that runs in segments runs on the cpu here",
                ));
            }
            let _ = mode; // segments follow RLX_DEBUG_NANS and print their own reports
            let given: Vec<(&str, &Tensor)> = arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let sizes = model.sizes_for(&given, dims);
            let mut made = vec![];
            for g in model.guards() {
                if arrays.iter().any(|a| a.0 == g.name) {
                    continue;
                }
                let shape = g.shape_at(&sizes);
                rlx_runtime::check_input_size(&g.name, &shape).map_err(|e| runtime_fail(&e))?;
                made.push((
                    g.name.clone(),
                    rlx_cli::run::generate_input(&g.name, &shape, *seed),
                ));
            }
            let mut feeds = arrays;
            feeds.extend(made);
            let named: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let outs = model.run_tensors(&named).map_err(|e| runtime_fail(&e))?;
            return Ok(RunOut {
                outputs: model.output_names().into_iter().zip(outs).collect(),
                reports: vec![],
                summary: None,
                aborted: None,
            });
        }
        let (s, feeds) = self.prepare(device, arrays)?;
        s.set_debug_mode(mode);
        s.set_print_reports(false);
        let refs: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let result = s.run_tensor_refs(&refs);
        let g = s.graph();
        let reports = s.nan_reports().iter().map(|r| report_json(g, r)).collect();
        let summary = s.nan_summary().map(str::to_string);
        let names: Vec<String> = s.outputs().into_iter().map(|o| o.0).collect();
        match result {
            Ok(outs) => Ok(RunOut {
                outputs: names.into_iter().zip(outs).collect(),
                reports,
                summary,
                aborted: None,
            }),
            Err(e) => match e.as_nan_abort() {
                Some(ab) => {
                    let mut reports: Vec<(String, String)> = reports;
                    let last = report_json(g, &ab.report);
                    if reports.last() != Some(&last) {
                        reports.push(last);
                    }
                    Ok(RunOut {
                        outputs: vec![],
                        reports,
                        summary,
                        aborted: Some(format!(
                            "run stopped by RLX_DEBUG_NANS=abort at {}",
                            ab.report.at_in_context()
                        )),
                    })
                }
                None => Err(runtime_fail(&e)),
            },
        }
    }
}

/// The result of one run, before conversion to Python.
struct RunOut {
    outputs: Vec<(String, Tensor)>,
    /// `(report JSON, its text)` per NaN/Inf report.
    reports: Vec<(String, String)>,
    summary: Option<String>,
    /// The CLI's line when `abort` stopped the run.
    aborted: Option<String>,
}

/// A NaN/Inf report as JSON: the report's fields plus `module`, `culprit`, `node` (`%12`)
/// and `node_id`, `kind` as printed (`NaN`, `+inf`, `-inf`).
fn report_json(g: &Graph, r: &rlx_ir::numeric_check::NanReport) -> (String, String) {
    let mut v = serde_json::to_value(r).unwrap_or(serde_json::Value::Null);
    if let serde_json::Value::Object(m) = &mut v {
        let origin = g.nodes.get(r.node.index()).and_then(|n| n.origin.as_ref());
        m.insert(
            "module".into(),
            origin
                .and_then(|o| o.module.clone())
                .map_or(serde_json::Value::Null, serde_json::Value::String),
        );
        // The report's own source line, else the node's.
        if r.source.is_none() {
            if let Some(s) = origin.and_then(|o| o.source.as_ref()) {
                m.insert(
                    "source".into(),
                    serde_json::to_value(s).unwrap_or(serde_json::Value::Null),
                );
            }
        }
        m.insert("culprit".into(), r.is_culprit().into());
        m.insert("node".into(), r.node.to_string().into());
        m.insert("node_id".into(), (r.node.index() as u64).into());
        m.insert("kind".into(), r.kind.to_string().into());
    }
    (v.to_string(), r.to_string())
}

/// Attach a graph node's module path and source line to a JSON object.
fn add_origin(g: &Graph, id: rlx_ir::NodeId, m: &mut serde_json::Map<String, serde_json::Value>) {
    let origin = g.nodes.get(id.index()).and_then(|n| n.origin.as_ref());
    m.insert(
        "module".into(),
        origin
            .and_then(|o| o.module.clone())
            .map_or(serde_json::Value::Null, serde_json::Value::String),
    );
    m.insert(
        "source".into(),
        origin
            .and_then(|o| o.source.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(serde_json::Value::Null),
    );
}

/// A device list `(oracle, backend, ...)` as `rlx diverge --backends` takes it.
fn parse_backends(devices: &[String]) -> Result<Vec<Device>, Fail> {
    let Some(first) = devices.first() else {
        return Err(Fail::new(
            Kind::Device,
            "devices: empty; give (\"cpu\", \"wgpu\"): the CPU oracle, then the backends to compare with it",
        ));
    };
    if parse_device(first)? != Device::Cpu {
        return Err(Fail::new(
            Kind::Device,
            format!("devices[0] = {first:?}: the first device is the oracle, and the oracle is the CPU (\"cpu\")"),
        ));
    }
    let mut v = vec![];
    for d in &devices[1..] {
        let dev = parse_device(d)?;
        if !rlx_runtime::device_available(dev) {
            return Err(Fail::new(
                Kind::Device,
                rlx_runtime::RuntimeError::DeviceUnavailable(dev).to_string(),
            ));
        }
        if dev != Device::Cpu && !v.contains(&dev) {
            v.push(dev);
        }
    }
    Ok(v)
}

/// The native model handle behind `rlx.Model` (see `python/rlx/__init__.py`).
#[pyclass(module = "rlx._native", name = "NativeModel")]
struct NativeModel {
    path: PathBuf,
    kind: &'static str,
    inputs: Vec<(String, Shape)>,
    outputs: Vec<(String, Shape)>,
    state: Mutex<State>,
}

impl NativeModel {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn label(&self) -> String {
        let p = rlx_cli::run::model_path(&self.path);
        let stem = if p.file_name().is_some_and(|f| f == "model.onnx") {
            p.parent().and_then(|d| d.file_name())
        } else {
            p.file_stem()
        };
        stem.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
}

type Info<'py> = Vec<(String, Py<PyAny>, String)>;

#[pymethods]
impl NativeModel {
    /// Open a model (`.onnx`, a model folder, `.pt2`, a `.rlxpkg` package); `dims` binds
    /// symbolic input dims by name, `seed` seeds the inputs generated for those not given.
    #[new]
    #[pyo3(signature = (path, dims=None, seed=0))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        dims: Option<HashMap<String, i64>>,
        seed: u64,
    ) -> PyResult<NativeModel> {
        guard(|| {
            rlx_cli::init_threads(None).map_err(|e| Fail::new(Kind::Other, e.to_string()))?;
            let mut dim_specs: Vec<String> = dims
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            dim_specs.sort();
            let p = path.clone();
            py.detach(move || -> Result<NativeModel, Fail> {
                if !p.exists() {
                    return Err(Fail::new(
                        Kind::Model,
                        format!("cannot read {}: no such file or directory", p.display()),
                    ));
                }
                // A `.pt2` is a zip too, but a torch.export archive for the importer.
                let pt2 = rlx_torch_import::is_pt2(&p);
                if !pt2 && rlx_cli::compile::is_package(&p) {
                    let m = rlx_runtime::package::read_manifest(&p)
                        .map_err(|e| runtime_fail(&e))?;
                    if !dim_specs.is_empty() {
                        return Err(Fail::new(Kind::Input, if m.dynamic.is_some() {
                            "dims: a dynamic package takes its sizes from the arrays given to run()"
                        } else {
                            "dims: a package's input dims were fixed when it was compiled; recompile with `rlx compile --dim ...` (a range, NAME=MIN..MAX, makes a package that takes any size in it)"
                        }));
                    }
                    let device = parse_device(&m.device_type)?;
                    let source = Source::Package {
                        path: p.clone(),
                        device,
                        seed,
                    };
                    let c = source.build(device, &[])?;
                    let (mut inputs, outputs) = (c.graph.inputs(), c.graph.outputs());
                    if m.dynamic.is_some() {
                        // The declared signature: symbols (sized by the arrays of each run).
                        inputs = m
                            .inputs
                            .iter()
                            .map(|g| (g.name.clone(), g.declared_shape()))
                            .collect();
                    }
                    Ok(NativeModel {
                        path: p,
                        kind: "package",
                        inputs,
                        outputs,
                        state: Mutex::new(State {
                            source,
                            compiled: Some(c),
                        }),
                    })
                } else {
                    let args = ModelArgs {
                        model: p.clone(),
                        inputs: vec![],
                        dims: dim_specs,
                        seed,
                    };
                    let l = match load_with(&args, true, vec![]) {
                        Ok(l) => l,
                        Err(e)
                            if !pt2
                                && rlx_runtime::dynamic::is_value_dependent(&format!("{e:#}")) =>
                        {
                            return dynamic_model(p, &args, seed).map_err(|_| load_fail(e));
                        }
                        Err(e) => return Err(load_fail(e)),
                    };
                    let g = &l.graph;
                    let inputs = g
                        .nodes
                        .iter()
                        .filter_map(|n| match &n.op {
                            Op::Input { name } => Some((
                                name.clone(),
                                g.input_decls
                                    .iter()
                                    .find(|d| d.0 == *name)
                                    .map(|d| d.1.clone())
                                    .unwrap_or_else(|| n.shape.clone()),
                            )),
                            _ => None,
                        })
                        .collect();
                    let outputs = g
                        .outputs
                        .iter()
                        .enumerate()
                        .map(|(k, o)| {
                            (
                                g.output_names.get(k).cloned().unwrap_or_else(|| o.to_string()),
                                g.node(*o).shape.clone(),
                            )
                        })
                        .collect();
                    Ok(NativeModel {
                        path: p,
                        kind: "model",
                        inputs,
                        outputs,
                        state: Mutex::new(State {
                            source: Source::Model {
                                args,
                                base: l.graph,
                                base_feeds: l.feeds,
                            },
                            compiled: None,
                        }),
                    })
                }
            })
            .map_err(PyErr::from)
        })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// `"model"` (imported: .onnx, folder, .pt2) or `"package"` (.rlxpkg).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// `(name, shape, dtype)` per graph input; symbolic dims are their names.
    fn input_info<'py>(&self, py: Python<'py>) -> PyResult<Info<'py>> {
        self.inputs
            .iter()
            .map(|(n, s)| Ok((n.clone(), shape_py(py, s)?, s.dtype.to_string())))
            .collect()
    }

    /// `(name, shape, dtype)` per graph output (dims as imported with the default dims).
    fn output_info<'py>(&self, py: Python<'py>) -> PyResult<Info<'py>> {
        self.outputs
            .iter()
            .map(|(n, s)| Ok((n.clone(), shape_py(py, s)?, s.dtype.to_string())))
            .collect()
    }

    /// Run once. `arrays`: `[(name, rlx dtype, ndarray)]`. Returns `(outputs, reports,
    /// summary, aborted)`: `[(name, rlx dtype, ndarray)]`, `[(report JSON, text)]`, the
    /// absorbed-Inf summary line, and the CLI's line when `abort` stopped the run.
    #[pyo3(signature = (arrays, device=None, debug_nans=None))]
    #[allow(clippy::type_complexity)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        arrays: &Bound<'py, PyList>,
        device: Option<&str>,
        debug_nans: Option<&str>,
    ) -> PyResult<(
        Vec<(String, String, Bound<'py, PyAny>)>,
        Vec<(String, String)>,
        Option<String>,
        Option<String>,
    )> {
        guard(|| {
            let mode = parse_mode(debug_nans)?;
            let device = device.map(parse_device).transpose()?;
            let arrays = arrays_in(arrays)?;
            let out = py.detach(|| self.lock().run(device, arrays, mode))?;
            let mut outs = vec![];
            for (name, t) in out.outputs {
                let (dt, a) = tensor_out(py, t)?;
                outs.push((name, dt, a));
            }
            Ok((outs, out.reports, out.summary, out.aborted))
        })
    }

    /// Constants that fold to NaN/Inf (`rlx lint`): `[(finding JSON, text)]`.
    fn lint(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        guard(|| {
            let r = py.detach(|| -> Result<Vec<(String, String)>, Fail> {
                let st = self.lock();
                let (g, _) = st.source.loaded(&[])?;
                if g.outputs.is_empty() {
                    return Err(Fail::new(Kind::Model, "the graph has no outputs"));
                }
                Ok(rlx_compile::numeric_lint(&g)
                    .iter()
                    .map(|l| {
                        let mut v = serde_json::to_value(l).unwrap_or_default();
                        if let serde_json::Value::Object(m) = &mut v {
                            add_origin(&g, l.node, m);
                            m.insert("node".into(), l.node.to_string().into());
                            m.insert("node_id".into(), (l.node.index() as u64).into());
                            m.insert("kind".into(), l.kind.to_string().into());
                            m.insert("reaches".into(), l.reaches.to_string().into());
                        }
                        (v.to_string(), l.to_string())
                    })
                    .collect())
            })?;
            Ok(r)
        })
    }

    /// Compare backends with the CPU (`rlx diverge`): `(JSON list, text report)`.
    #[pyo3(signature = (arrays, devices, tol_rel=2e-3, localize=true))]
    fn diverge(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyList>,
        devices: Vec<String>,
        tol_rel: f64,
        localize: bool,
    ) -> PyResult<(Vec<(String, String)>, String)> {
        guard(|| {
            if !(tol_rel > 0.0 && tol_rel.is_finite()) {
                return Err(Fail::new(
                    Kind::Input,
                    format!("tol_rel={tol_rel}: must be a positive number"),
                )
                .into());
            }
            let backends = parse_backends(&devices)?;
            let arrays = arrays_in(arrays)?;
            let label = self.label();
            let r = py.detach(|| -> Result<(Vec<(String, String)>, String), Fail> {
                let (graph, feeds) = self.lock().source.loaded(&arrays)?;
                use rlx_runtime::dist::diagnostics::{
                    backend_divergence_with, format_report, DivergenceOptions,
                };
                let opts = DivergenceOptions {
                    tol_rel,
                    backends: Some(backends),
                    localize,
                    ..Default::default()
                };
                let report = backend_divergence_with(&graph, &[], &feeds, &opts)
                    .map_err(|e| runtime_fail(&e))?;
                // Localized node ids are those of the graph compiled as the comparison did.
                let compiled = if report.iter().any(|d| d.localization.is_some()) {
                    rlx_compile::compiler::compile(graph.clone(), &opts.compile)
                        .ok()
                        .map(|c| c.graph)
                } else {
                    None
                };
                let each = report
                    .iter()
                    .map(|d| {
                        let mut v = serde_json::to_value(d).unwrap_or_default();
                        if let (serde_json::Value::Object(m), Some(l)) = (&mut v, &d.localization) {
                            // The first diverging node's module path and source line.
                            let id = l.node.trim_start_matches('%').parse::<u32>().ok();
                            if let (Some(id), Some(cg), Some(serde_json::Value::Object(lm))) =
                                (id, &compiled, m.get_mut("localization"))
                            {
                                add_origin(cg, rlx_ir::NodeId(id), lm);
                            }
                        }
                        (
                            v.to_string(),
                            format_report(&label, std::slice::from_ref(d)),
                        )
                    })
                    .collect();
                Ok((each, format_report(&label, &report)))
            })?;
            Ok(r)
        })
    }

    /// Run once on the CPU recording per-op statistics (`rlx trace`): `(trace JSON, HTML)`;
    /// the HTML only when `html` is true.
    #[pyo3(signature = (arrays, html=false))]
    fn trace(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyList>,
        html: bool,
    ) -> PyResult<(String, Option<String>)> {
        guard(|| {
            let arrays = arrays_in(arrays)?;
            let model = rlx_cli::run::model_path(&self.path).display().to_string();
            let r = py.detach(|| -> Result<(String, Option<String>), Fail> {
                let (graph, feeds) = self.lock().source.loaded(&arrays)?;
                let mut s = Session::new(Device::Cpu)
                    .try_compile(graph)
                    .map_err(|e| runtime_fail(&e))?;
                let mut trace = rlx_cli::trace::Trace {
                    model,
                    ..Default::default()
                };
                s.set_value_printer(Some(rlx_runtime::printer::PrinterConfig::off()));
                let feeds: Vec<(&str, Tensor)> =
                    feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                let r = s.run_observed(feeds, &mut |g, id, t| trace.record(g, id, t));
                if let Err(e) = r {
                    trace.error = Some(e.to_string());
                }
                let mut json = trace.to_json();
                // Module path and source line per op (torch.export programs).
                let g = s.graph();
                if let Some(serde_json::Value::Array(ops)) = json.get_mut("ops") {
                    for (o, t) in ops.iter_mut().zip(&trace.ops) {
                        if let serde_json::Value::Object(m) = o {
                            add_origin(g, t.id, m);
                        }
                    }
                }
                Ok((json.to_string(), html.then(|| trace.to_html())))
            })?;
            Ok(r)
        })
    }

    fn __repr__(&self) -> String {
        format!("NativeModel({:?})", self.path.display().to_string())
    }
}

// ---------------------------------------------------------------------------------------
// Tools that write files: `rlx reduce`, `rlx precision`

/// `UsageError(InputError, ValueError)`: a bad argument to a tool, with clap's message.
/// Made in the module's init (a class with two bases is one line of Python, not a macro).
static USAGE_ERROR: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();

/// A clap error (what the CLI prints before exiting 2) as `UsageError`: its text without
/// the `error: ` prefix and the `--help` hint.
fn usage_fail(py: Python<'_>, e: &clap::Error) -> PyErr {
    let text = e.render().to_string();
    let text = text.trim().trim_start_matches("error: ");
    let msg = text
        .lines()
        .filter(|l| !l.starts_with("For more information, try"))
        .collect::<Vec<_>>()
        .join("\n");
    match USAGE_ERROR.get(py) {
        Some(t) => PyErr::from_type(t.bind(py).clone(), msg.trim().to_string()),
        None => InputError::new_err(msg.trim().to_string()),
    }
}

/// An error of `rlx reduce` / `rlx precision` (the CLI's `rlx: error:` line, without it):
/// the caller's inputs, the model, or anything else (an existing output, a failed check).
fn tool_fail(e: anyhow::Error, model: &std::path::Path) -> Fail {
    let msg = format!("{e:#}");
    let input = load_fail(anyhow::anyhow!("{msg}")).kind == Kind::Input;
    // The model's errors name it first (`PATH: ...`, `cannot read PATH: ...`).
    let names = [
        rlx_cli::run::model_path(model).display().to_string(),
        model.display().to_string(),
    ];
    let about_model = names
        .iter()
        .any(|p| msg.starts_with(&format!("{p}:")) || msg.starts_with(&format!("cannot read {p}")));
    let kind = if input {
        Kind::Input
    } else if about_model {
        Kind::Model
    } else {
        Kind::Other
    };
    Fail::new(kind, msg)
}

/// `rlx reduce ARGS` (`args`: what follows `rlx reduce`). Returns the lines the CLI prints
/// on stdout; raises `RlxError` with the CLI's line when the model does not fail that way
/// (nothing written), `UsageError` on a bad argument.
#[pyfunction]
fn reduce(py: Python<'_>, args: Vec<String>) -> PyResult<Vec<String>> {
    guard(|| {
        let a =
            rlx_cli::reduce::ReduceArgs::try_parse_from(&args).map_err(|e| usage_fail(py, &e))?;
        rlx_cli::init_threads(None).map_err(|e| Fail::new(Kind::Other, e.to_string()))?;
        let r = py.detach(|| -> Result<Vec<String>, Fail> {
            let mut lines = vec![];
            match rlx_cli::reduce::run(&a, &mut |l| lines.push(l.to_string())) {
                Ok(rlx_cli::reduce::Outcome::Written(_)) => Ok(lines),
                Ok(rlx_cli::reduce::Outcome::NotFailing(line)) => Err(Fail::new(
                    Kind::Other,
                    line.trim_start_matches("rlx reduce: ").to_string(),
                )),
                Err(e) => Err(tool_fail(e, &a.model.model)),
            }
        })?;
        Ok(r)
    })
}

/// `rlx precision ARGS` (`args`: what follows `rlx precision`). Returns `(verified, lines)`:
/// whether the written model was verified (the CLI's exit 0) and the lines it prints on
/// stdout; raises `UsageError` on a bad argument, `RlxError` (or a subclass) on an error
/// (nothing written).
#[pyfunction]
fn precision(py: Python<'_>, args: Vec<String>) -> PyResult<(bool, Vec<String>)> {
    guard(|| {
        let a = rlx_cli::precision::PrecisionArgs::try_parse_from(&args)
            .map_err(|e| usage_fail(py, &e))?;
        rlx_cli::init_threads(None).map_err(|e| Fail::new(Kind::Other, e.to_string()))?;
        let r = py.detach(|| -> Result<(bool, Vec<String>), Fail> {
            let mut lines = vec![];
            let ok = rlx_cli::precision::run(&a, &mut |l| lines.push(l.to_string()))
                .map_err(|e| tool_fail(e, &a.model.model))?;
            Ok((ok, lines))
        })?;
        Ok(r)
    })
}

/// Devices live on this machine (`"cpu"` first, then `"wgpu"` when an adapter exists).
#[pyfunction]
fn available_devices() -> Vec<String> {
    rlx_runtime::available_devices()
        .iter()
        .map(|d| d.to_string())
        .collect()
}

/// The `RLX_DEBUG_NANS` mode the environment asks for: `"off"`, `"warn"`, `"strict"`, `"abort"`.
#[pyfunction]
fn env_debug_mode() -> &'static str {
    match rlx_ir::DebugMode::from_env() {
        rlx_ir::DebugMode::Off => "off",
        rlx_ir::DebugMode::Warn => "warn",
        rlx_ir::DebugMode::Strict => "strict",
        rlx_ir::DebugMode::Abort => "abort",
    }
}

/// Raise a Rust panic inside the guard (tests check it comes out as `RlxError`).
#[pyfunction]
fn _panic_for_test() -> PyResult<()> {
    guard(|| panic!("planted panic for the boundary test"))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RlxError", py.get_type::<RlxError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add_class::<NativeModel>()?;
    m.add_function(wrap_pyfunction!(available_devices, m)?)?;
    m.add_function(wrap_pyfunction!(env_debug_mode, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(reduce, m)?)?;
    m.add_function(wrap_pyfunction!(precision, m)?)?;
    // A bad argument to a tool is both the package's `InputError` and Python's `ValueError`.
    let ns = pyo3::types::PyDict::new(py);
    ns.set_item("InputError", py.get_type::<InputError>())?;
    py.run(
        c"class UsageError(InputError, ValueError):\n    \"\"\"A bad argument to a tool (rlx.reduce, rlx.precision): clap's message, as the CLI prints it before exiting 2.\"\"\"\n    __module__ = 'rlx'\n",
        Some(&ns),
        None,
    )?;
    let usage = ns
        .get_item("UsageError")?
        .ok_or_else(|| RlxError::new_err("UsageError was not defined"))?
        .cast_into::<pyo3::types::PyType>()?;
    m.add("UsageError", &usage)?;
    let _ = USAGE_ERROR.set(py, usage.unbind());
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
