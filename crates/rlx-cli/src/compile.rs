//! `rlx compile MODEL --device cpu -o model.rlxpkg`, and running a package with `rlx run`.
//!
//! A package (`docs/PACKAGE.md`) is one zip file holding the optimized graph with
//! provenance, the weights (safetensors), the device type, the input guards and a format
//! version; `rlx run model.rlxpkg` loads it and runs it without the ONNX file.

use crate::load::{load, split_input_spec, ModelArgs};
use crate::run::{generate_input, read_input_file, RunArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rlx_ir::Tensor;
use rlx_runtime::CompiledGraph;
use rlx_runtime::{
    load_package, save_dynamic_package, save_package, Device, DimRange, DynamicModel, OnnxSource,
    Session,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Compile a model into a package file: the optimized graph, its weights, the device type,
/// the input guards and a format version, in one zip archive (`docs/PACKAGE.md`).
///
/// Symbolic input dims are bound as `rlx run` binds them (`--dim`, the shapes of `--input`
/// files, a model folder's `input_<name>.npy` files, else 1); the package accepts exactly
/// those shapes, and `RLX_RUNTIME_CHECK_INPUTS=1 rlx run model.rlxpkg` names the symbol of a
/// dim that differs.
///
/// Dynamic packages: give a range, `--dim batch=1..16 --dim sequence=1..512` (both ends
/// included; `MIN..` has no upper bound), and the package accepts every size in range. It
/// holds the ONNX model and plans each new size signature when it runs (import + compile,
/// a few ms to a few hundred; later runs at that signature reuse the plan). Symbols not
/// given a --dim accept any size >= 0. `rlx compile` builds the plans at the ranges' smallest
/// and largest sizes to check them. ONNX models only, without external data.
#[derive(Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The device type to compile for (cpu, wgpu, cuda). A package loads only on this type.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The package file to write (conventionally `*.rlxpkg`).
    #[arg(long, short = 'o', value_name = "FILE.rlxpkg")]
    pub output: PathBuf,
}

/// A device type name as the CLI accepts it (`cpu`, `wgpu` or its aliases `gpu`/`vulkan`,
/// `cuda` or `cuda:0`), case-insensitive.
pub fn parse_device(s: &str) -> Result<Device> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "cpu" => Device::Cpu,
        "wgpu" | "gpu" | "vulkan" => Device::Wgpu,
        "cuda" | "cuda:0" => Device::Cuda,
        other => bail!("--device {other}: unknown device type (known: cpu, wgpu, cuda)"),
    })
}

/// True when `p` names a package: a file ending in `.rlxpkg`, or any regular file that
/// starts with the zip signature `PK\x03\x04` (an ONNX file never does) and is not a
/// `.pt2` (a torch.export archive, also a zip).
pub fn is_package(p: &Path) -> bool {
    if !p.is_file() || rlx_torch_import::is_pt2(p) {
        return false;
    }
    if p.extension().and_then(|e| e.to_str()) == Some("rlxpkg") {
        return true;
    }
    use std::io::Read;
    let mut sig = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut sig))
        .is_ok()
        && sig == *b"PK\x03\x04"
}

/// Why a command that rewrites or cuts an ONNX model refuses a package, and what to give it.
pub fn package_refusal(pkg: &Path, what: &str) -> String {
    let source = match rlx_runtime::read_package_source(pkg) {
        Ok(s) => s,
        // A truncated or corrupted archive: say so, as every other command does.
        Err(e) => return format!("{e}"),
    };
    if source.is_some() {
        format!(
            "{}: a dynamic RLX package; {what}: give it the ONNX model (this package holds it: unzip -p {} source.onnx > model.onnx)",
            pkg.display(),
            pkg.display()
        )
    } else {
        format!(
            "{}: a static RLX package (a compiled graph, no source model); {what}: give it the ONNX model it was compiled from",
            pkg.display()
        )
    }
}

fn compile_inner(a: &CompileArgs) -> Result<()> {
    let device = parse_device(&a.device)?;
    if !rlx_runtime::device_available(device) {
        bail!(
            "--device {device}: {}",
            rlx_runtime::RuntimeError::DeviceUnavailable(device)
        );
    }
    if a.model.dims.iter().any(|d| d.contains("..")) {
        return compile_dynamic(a, device);
    }
    let loaded = load(&a.model, true)?;
    let s = Session::new(device)
        .try_compile(loaded.graph)
        .map_err(|e| anyhow!("{e}"))?;
    save_package(&s, &a.output).map_err(|e| anyhow!("{e}"))?;
    let guards: Vec<String> = s.guards().iter().map(|g| g.to_string()).collect();
    eprintln!(
        "rlx: wrote {} ({} nodes, device type {}; inputs {})",
        a.output.display(),
        s.graph().len(),
        s.device(),
        guards.join(", ")
    );
    Ok(())
}

/// Parse `--dim NAME=SIZE` / `NAME=MIN..MAX` / `NAME=MIN..` values.
pub fn parse_dim_ranges(v: &[String]) -> Result<BTreeMap<String, DimRange>> {
    let mut m = BTreeMap::new();
    for s in v {
        let (k, val) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--dim {s}: expected NAME=SIZE or NAME=MIN..MAX"))?;
        if k.is_empty() {
            bail!("--dim {s}: the dim NAME is empty");
        }
        let r = DimRange::parse(val).map_err(|e| anyhow!("--dim {s}: {e}"))?;
        if m.insert(k.to_string(), r).is_some() {
            bail!("--dim {k}: given twice");
        }
    }
    Ok(m)
}

/// `rlx compile` with ranges: a dynamic package (format version 2).
fn compile_dynamic(a: &CompileArgs, device: Device) -> Result<()> {
    let path = crate::run::model_path(&a.model.model);
    if rlx_torch_import::is_pt2(&path) {
        bail!(
            "{}: dims with ranges (--dim NAME=MIN..MAX) need an ONNX model for now; export it with torch.onnx.export(..., dynamic_axes=...) or give each dim one size",
            path.display()
        );
    }
    if !a.model.inputs.is_empty() {
        bail!("--input: a package with dim ranges is compiled for the ranges, not for input files; give sizes with --dim NAME=MIN..MAX");
    }
    let ranges = parse_dim_ranges(&a.model.dims)?;
    let given: Vec<String> = ranges.keys().cloned().collect();
    let src = OnnxSource::open(&path).map_err(|e| anyhow!("{e}"))?;
    let mut m = DynamicModel::new(Arc::new(src), device, ranges).map_err(|e| anyhow!("{e}"))?;
    // Check the plans at the corners: every range's smallest size (1 for a symbol given no
    // --dim, as generated inputs use), then every largest (unbounded ones at their smallest).
    let lo: BTreeMap<String, usize> = m
        .ranges()
        .iter()
        .map(|(s, r)| {
            let n = if given.contains(s) {
                r.min
            } else {
                r.min.max(1)
            };
            (s.clone(), n)
        })
        .collect();
    let hi: BTreeMap<String, usize> = m
        .ranges()
        .iter()
        .map(|(s, r)| {
            let n = r.max.unwrap_or(r.min);
            (s.clone(), if given.contains(s) { n } else { n.max(1) })
        })
        .collect();
    let mut checked = vec![];
    let mut segmented = None;
    for sizes in [lo, hi] {
        match m.plan_at(&sizes) {
            Ok(_) => {}
            // Runs in segments around a node whose output shape depends on values: there is
            // no plan for the whole model to check; the segments are planned when it runs.
            Err(e) if is_value_dependent(&e.to_string()) => {
                segmented = Some(e.to_string());
                break;
            }
            Err(e) => bail!("the plan at the corner of the ranges fails: {e} (give every symbolic dim a range the model supports with --dim NAME=MIN..MAX)"),
        }
        if let Some(ev) = m.last_plan() {
            if ev.new {
                checked.push(format!("{} ({:.0} ms)", ev.signature, ev.plan_ms));
            }
        }
    }
    save_dynamic_package(&mut m, &a.output).map_err(|e| anyhow!("{e}"))?;
    let guards: Vec<String> = m.guards().iter().map(|g| g.to_string()).collect();
    let checked = match &segmented {
        None => format!("plans checked at {}", checked.join(" and ")),
        Some(why) => {
            // "...: node "nz" (NonZero): ..." -> the node's part of the message.
            let at = why.find("node \"").map(|k| &why[k..]).unwrap_or(why);
            let at = at.split(": ").next().unwrap_or(at);
            format!("runs in segments around {at} (a value-dependent output shape): its parts are planned when it runs, not checked here")
        }
    };
    eprintln!(
        "rlx: wrote {} (dynamic, device type {}; inputs {}); {checked}",
        a.output.display(),
        rlx_runtime::guards::device_type(device),
        guards.join(", "),
    );
    Ok(())
}

/// Entry point of `rlx compile`; returns the exit status (0 ok, 1 error).
pub fn main_compile(a: CompileArgs) -> i32 {
    match compile_inner(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}

/// A package (or a model that needs run-time values) ready for one run.
// One value per load or run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Ready {
    /// One compiled plan and its feeds in input order; `planned` when a dynamic model
    /// planned it for this run.
    Plan {
        graph: CompiledGraph,
        feeds: Vec<(String, Tensor)>,
        planned: Option<rlx_runtime::dynamic::PlanEvent>,
    },
    /// A model that runs in segments around value-dependent nodes, and its feeds, with the
    /// file each given input came from (named when the run's input check refuses it).
    Segmented {
        model: DynamicModel,
        feeds: Vec<(String, Tensor)>,
        sources: Vec<(String, PathBuf)>,
    },
}

/// The model-and-inputs arguments of a `rlx run` invocation.
fn model_args(a: &RunArgs) -> ModelArgs {
    ModelArgs {
        model: a.model.clone(),
        inputs: a.inputs.clone(),
        dims: a.dims.clone(),
        seed: a.seed,
    }
}

/// Run the package `a.model` (`rlx run model.rlxpkg`): a static package on the device type it
/// was compiled for (or `--device`), binding `--input` files (named or positional) to its
/// inputs and generating the others from the compiled shapes (`--seed`); a dynamic package
/// at the sizes its inputs give (see [`prepare_dynamic`]).
///
/// With the input check on (`RLX_RUNTIME_CHECK_INPUTS=1`) a file whose type differs from
/// the package's input is left for the guards to report (one `rlx input-check:` line per
/// problem); otherwise it is refused here with one line naming the file.
pub fn run_package(a: &RunArgs) -> Result<i32> {
    let ready = prepare_package(&model_args(a), a.device.as_deref(), a.quiet)?;
    run_ready(a, ready)
}

/// Load the package `m.model` for `device` (default: the type it was compiled for) and bind
/// its inputs, as `rlx run` does; a dynamic package is planned for those inputs.
pub fn prepare_package(m: &ModelArgs, device: Option<&str>, quiet: bool) -> Result<Ready> {
    let manifest = rlx_runtime::package::read_manifest(&m.model).map_err(|e| anyhow!("{e}"))?;
    let device = match device {
        Some(d) => parse_device(d)?,
        None => parse_device(&manifest.device_type)?,
    };
    if manifest.dynamic.is_some() {
        let dm = rlx_runtime::load_dynamic_package(&m.model, device).map_err(|e| anyhow!("{e}"))?;
        return prepare_dynamic(m, dm, quiet, !quiet);
    }
    if !m.dims.is_empty() {
        bail!(
            "--dim: a package's input dims were fixed when it was compiled; recompile with `rlx compile --dim ...` (a range, NAME=MIN..MAX, makes a package that takes any size in it)"
        );
    }
    let s = load_package(&m.model, device).map_err(|e| anyhow!("{e}"))?;
    let decl = s.inputs();
    let given = bind_input_files(m, &decl)?;
    let checked = s.check_inputs_enabled();
    let feeds = order_feeds(m, &decl, given, checked, !quiet, |_, shape| {
        Ok(shape.clone())
    })?;
    Ok(Ready::Plan {
        graph: s,
        feeds,
        planned: None,
    })
}

/// Run what [`prepare_package`] or [`prepare_dynamic`] made, as `rlx run` does.
fn run_ready(a: &RunArgs, ready: Ready) -> Result<i32> {
    match ready {
        Ready::Plan {
            mut graph,
            feeds,
            planned,
        } => {
            if let (Some(ev), false) = (planned, a.quiet) {
                // How the plan's graph was made: from the symbolic template, or imported
                // again at these sizes (and why).
                let how = if ev.specialized_by.is_empty() {
                    "import + compile".to_string()
                } else {
                    format!("by {}", ev.specialized_by)
                };
                eprintln!(
                    "rlx: planned {} for {} in {:.1} ms ({how}; each new size signature is planned once)",
                    a.model.display(),
                    ev.signature,
                    ev.plan_ms
                );
            }
            crate::run::run_compiled(a, &mut graph, feeds)
        }
        Ready::Segmented {
            mut model,
            feeds,
            sources,
        } => {
            if a.nan_report.is_some() {
                if !rlx_ir::DebugMode::from_env().is_on() {
                    std::env::set_var("RLX_DEBUG_NANS", "1");
                }
                eprintln!(
                    "rlx: --nan-report: not written for a model that runs in segments; each segment prints its NaN/Inf reports to stderr"
                );
            }
            let named: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let outs = match model.run_tensors(&named) {
                Ok(o) => o,
                Err(e @ rlx_runtime::RuntimeError::InputCheck { .. }) => {
                    eprintln!(
                        "{}",
                        crate::load::with_input_files(
                            &e.to_string(),
                            sources.iter().map(|(n, p)| (n, p))
                        )
                    );
                    return Ok(1);
                }
                Err(e) if e.as_nan_abort().is_some() => {
                    let ab = e.as_nan_abort().expect("checked");
                    eprintln!(
                        "rlx: run stopped by RLX_DEBUG_NANS=abort at {}",
                        ab.report.at_in_context()
                    );
                    return Ok(crate::run::EXIT_NAN_ABORT);
                }
                Err(e) => return Err(anyhow!("{e}")),
            };
            if !a.quiet {
                eprintln!(
                    "rlx: {} has nodes whose output shapes depend on values; it ran in segments around them",
                    a.model.display()
                );
            }
            crate::run::write_outputs(a, &model.output_names(), &outs)?;
            Ok(0)
        }
    }
}

/// True for an import error that a run in segments can get past: a node whose output shape
/// or control flow depends on values known only when the model runs.
pub fn is_value_dependent(msg: &str) -> bool {
    rlx_runtime::dynamic::is_value_dependent(msg)
}

/// `rlx run model.onnx` for a model the importer cannot lower with static shapes because it
/// needs values known only at run time (a parameter input, NonZero, NonMaxSuppression, ...):
/// run it as a dynamic model. `first` is the import error, returned for a `.pt2`.
pub fn run_onnx_segmented(a: &RunArgs, device: Device, first: anyhow::Error) -> Result<i32> {
    let path = crate::run::model_path(&a.model);
    if rlx_torch_import::is_pt2(&path) {
        return Err(first);
    }
    let src = OnnxSource::open(&path).map_err(|e| anyhow!("{e}"))?;
    let m =
        DynamicModel::new(Arc::new(src), device, BTreeMap::new()).map_err(|e| anyhow!("{e}"))?;
    // Quiet: the first attempt already said where each input comes from (it stopped
    // before generating any, so those notes are made here).
    let ready = prepare_dynamic(&model_args(a), m, true, !a.quiet)?;
    run_ready(a, ready)
}

/// Bind a dynamic model's inputs (files, a model folder's `input_<name>.npy`), generate the
/// others at the sizes the files, `--dim NAME=SIZE` or the ranges' minimum give, then plan
/// this signature; a model with a value-dependent node is left to run in segments (outputs
/// and NaN reports per segment; no `--nan-report` file). `quiet` silences the notes of
/// where each input came from; `note_generated` prints one line per generated input.
pub fn prepare_dynamic(
    a: &ModelArgs,
    mut m: DynamicModel,
    quiet: bool,
    note_generated: bool,
) -> Result<Ready> {
    let dims = crate::load::parse_dims(&a.dims)?;
    // Refused before any input is generated at that size.
    for (k, v) in &dims {
        if let Some(r) = m.ranges().get(k) {
            if !r.accepts(*v) {
                bail!("--dim {k}={v}: outside the range of \"{k}\", {r}");
            }
        }
    }
    for k in dims.keys() {
        if !m.ranges().contains_key(k) {
            let have: Vec<&str> = m.ranges().keys().map(|s| s.as_str()).collect();
            bail!(
                "--dim {k}: the model's inputs have no symbolic dim named \"{k}\" (they have: {})",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            );
        }
    }
    let guards = m.guards().to_vec();
    let decl: Vec<(String, rlx_ir::Shape)> = guards
        .iter()
        .map(|g| (g.name.clone(), g.declared_shape()))
        .collect();
    let mut given = bind_input_files(a, &decl)?;
    for (name, _) in &decl {
        if given.contains_key(name) {
            continue;
        }
        if let Some(p) = crate::load::folder_input(&a.model, name)? {
            if !quiet {
                eprintln!("rlx: input \"{name}\" from {}", p.display());
            }
            given.insert(name.clone(), (crate::npy::read_npy(&p)?, p));
        }
    }
    // A --dim the input files contradict is refused (as the .onnx path refuses it), not
    // overridden by the files' sizes.
    for g in &guards {
        let Some((t, path)) = given.get(&g.name) else {
            continue;
        };
        for (i, gd) in g.dims.iter().enumerate() {
            let (Some(sym), Some(&have)) = (&gd.symbol, t.dims().get(i)) else {
                continue;
            };
            if let Some(&want) = dims.get(sym) {
                if have != want {
                    bail!(
                        "input \"{}\" ({}): dim {i} ({sym}) is {have} here but --dim {sym}={want} was given",
                        g.name,
                        path.display()
                    );
                }
            }
        }
    }
    let given_refs: Vec<(&str, &Tensor)> =
        given.iter().map(|(n, (t, _))| (n.as_str(), t)).collect();
    let mut sources: Vec<(String, PathBuf)> = given
        .iter()
        .map(|(n, (_, p))| (n.clone(), p.clone()))
        .collect();
    sources.sort();
    let sizes = m.sizes_for(&given_refs, &dims);
    let feeds = order_feeds(a, &decl, given, true, note_generated, |name, _| {
        let g = guards
            .iter()
            .find(|g| g.name == name)
            .expect("a declared input");
        let s = g.shape_at(&sizes);
        rlx_runtime::check_input_size(name, &s).map_err(|e| anyhow!("{e}"))?;
        Ok(s)
    })?;
    let named: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    match m.plan_for(&named) {
        Ok(_) => {}
        Err(e) if is_value_dependent(&e.to_string()) => {
            return Ok(Ready::Segmented {
                model: m,
                feeds,
                sources,
            });
        }
        Err(e @ rlx_runtime::RuntimeError::InputCheck { .. }) => {
            return Err(anyhow!(
                "{}",
                crate::load::with_input_files(&e.to_string(), sources.iter().map(|(n, p)| (n, p)))
            ));
        }
        Err(e) => return Err(anyhow!("{e}")),
    }
    let planned = m.last_plan().cloned();
    let graph = m.take_plan(&named).map_err(|e| anyhow!("{e}"))?;
    // Inputs the plan was specialized on by value are no inputs of it.
    let keep = m.plan_inputs();
    let feeds = feeds
        .into_iter()
        .filter(|(n, _)| keep.contains(n) || !m.guards().iter().any(|g| &g.name == n))
        .collect();
    Ok(Ready::Plan {
        graph,
        feeds,
        planned,
    })
}

/// `--input NAME=FILE` / `--input FILE` for a package whose inputs are `decl`.
fn bind_input_files(
    a: &ModelArgs,
    decl: &[(String, rlx_ir::Shape)],
) -> Result<HashMap<String, (Tensor, PathBuf)>> {
    let mut given: HashMap<String, (Tensor, PathBuf)> = HashMap::new();
    let mut free = decl.iter().map(|d| d.0.clone());
    let mut named: Vec<&str> = vec![];
    for spec in &a.inputs {
        if let Some((name, _)) = split_input_spec(spec)? {
            named.push(name);
        }
    }
    let mut free_names = vec![];
    for n in free.by_ref() {
        if !named.contains(&n.as_str()) {
            free_names.push(n);
        }
    }
    let mut free_names = free_names.into_iter();
    for spec in &a.inputs {
        let (name, file) = match split_input_spec(spec)? {
            Some((name, file)) => (name.to_string(), file),
            None => match free_names.next() {
                Some(n) => (n, spec.as_str()),
                None => bail!("--input {spec}: every input of the package is already bound"),
            },
        };
        let t = read_input_file(Path::new(file)).with_context(|| format!("input \"{name}\""))?;
        if given
            .insert(name.clone(), (t, PathBuf::from(file)))
            .is_some()
        {
            bail!("--input {name}: given twice");
        }
    }
    Ok(given)
}

/// One tensor per declared input, in order: the bound file, else generated at the shape
/// `shape_of` gives (one line on stderr each when `note_generated`). Unchecked, a file of
/// the wrong type or an unknown name is refused here; checked, they are left for the guards
/// to report.
fn order_feeds(
    a: &ModelArgs,
    decl: &[(String, rlx_ir::Shape)],
    mut given: HashMap<String, (Tensor, PathBuf)>,
    checked: bool,
    note_generated: bool,
    shape_of: impl Fn(&str, &rlx_ir::Shape) -> Result<rlx_ir::Shape>,
) -> Result<Vec<(String, Tensor)>> {
    let mut feeds = vec![];
    for (name, shape) in decl {
        let t = match given.remove(name) {
            Some((t, src)) => {
                if !checked
                    && (t.dtype() != shape.dtype || t.dims() != shape.dims_usize().as_slice())
                {
                    bail!(
                        "input \"{name}\": the package expects {shape}, {} holds {}",
                        src.display(),
                        t.shape()
                    );
                }
                t
            }
            None => {
                let s = shape_of(name, shape)?;
                if note_generated {
                    crate::load::note_generated_input(name, &s, a.seed, &a.model);
                }
                generate_input(name, &s, a.seed)
            }
        };
        feeds.push((name.clone(), t));
    }
    if let Some(name) = given.keys().next() {
        if !checked {
            let names: Vec<&str> = decl.iter().map(|d| d.0.as_str()).collect();
            bail!(
                "--input {name}: the package has no input named \"{name}\" (its inputs: {})",
                names.join(", ")
            );
        }
    }
    // Under the check, unknown names go to the guards too.
    feeds.extend(given.into_iter().map(|(n, (t, _))| (n, t)));
    Ok(feeds)
}
