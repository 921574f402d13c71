//! Load a model and bind its inputs, the same way for every subcommand (`run`, `diverge`,
//! `trace`, `bench`): `--input NAME=FILE` (`.npy` or ONNX `TensorProto` `.pb`), `FILE` alone
//! for the next unnamed input, a model folder's `input_<name>.npy`, else deterministic random
//! inputs from the declared shapes (`--seed`). `--dim NAME=SIZE` binds symbolic dims.

use crate::npy::read_npy;
use crate::run::{generate_input, model_path, read_input_file, sanitize};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rlx_ir::{Graph, Op, Shape, Tensor};
use rlx_onnx_import::{ImportOptions, OnnxModel};
use rlx_torch_import::Pt2Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The model-and-inputs arguments shared by the subcommands.
#[derive(Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// Model file (.onnx, or .pt2 from torch.export.save), or a folder holding model.onnx or
    /// model.pt2 (and optional input_<name>.npy files).
    pub model: PathBuf,
    /// An input as NAME=FILE (.npy or .pb); FILE alone binds the next unnamed input. Repeatable.
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Bind a symbolic input dimension, e.g. --dim batch=2. Repeatable.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// Seed for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// A model file decoded once, whatever its format: ONNX (`.onnx`) or a `torch.export`
/// archive (`.pt2`). Its inputs can be read before it is imported.
pub enum SourceModel {
    Onnx(OnnxModel),
    Pt2(Pt2Model),
}

impl SourceModel {
    /// Open `path` (a `.pt2` by extension, else ONNX). Errors name the file.
    pub fn open(path: &Path) -> Result<SourceModel> {
        // A folder without a model: `model_path` gave `<dir>/model.onnx`; name both files.
        if let Some(dir) = path.parent().filter(|d| d.is_dir()) {
            if path.file_name().is_some_and(|n| n == "model.onnx")
                && !path.exists()
                && !dir.join("model.pt2").exists()
            {
                anyhow::bail!(
                    "{}: the folder holds neither model.onnx nor model.pt2 (give the model file, or a folder holding one of them)",
                    dir.display()
                );
            }
        }
        if rlx_torch_import::is_pt2(path) {
            // The importer's messages name the file already.
            Pt2Model::open(path)
                .map(SourceModel::Pt2)
                .map_err(|e| with_file(path, e))
        } else {
            OnnxModel::open(path)
                .map(SourceModel::Onnx)
                .map_err(|e| with_file(path, e))
        }
    }

    /// Names of the inputs a caller may feed, in order.
    pub fn input_names(&self) -> Vec<String> {
        match self {
            SourceModel::Onnx(m) => m.input_names(),
            SourceModel::Pt2(m) => m.input_names(),
        }
    }

    /// Declared input types (symbolic dims kept).
    pub fn declared_inputs(&self) -> Vec<(String, Shape)> {
        match self {
            SourceModel::Onnx(m) => m.declared_inputs(),
            SourceModel::Pt2(m) => m.declared_inputs(),
        }
    }

    /// Lower into a graph; errors name `path`.
    pub fn import(&self, path: &Path, opts: &ImportOptions) -> Result<Graph> {
        match self {
            SourceModel::Onnx(m) => m.import(opts).map_err(|e| with_file(path, e)),
            SourceModel::Pt2(m) => m.import(opts).map_err(|e| with_file(path, e)),
        }
    }
}

/// An imported graph with one tensor per graph input, in graph order.
pub struct Loaded {
    /// The imported (not yet compiled) graph, every input dim static.
    pub graph: Graph,
    /// `(input name, tensor)` in the order of the graph's inputs.
    pub feeds: Vec<(String, Tensor)>,
}

/// Parse `--dim NAME=SIZE` values; errors name the bad value.
pub fn parse_dims(v: &[String]) -> Result<HashMap<String, usize>> {
    let mut m = HashMap::new();
    for s in v {
        let (k, val) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--dim {s}: expected NAME=SIZE"))?;
        if k.is_empty() {
            bail!("--dim {s}: the dim NAME is empty");
        }
        let n: usize = val
            .parse()
            .map_err(|_| anyhow!("--dim {s}: SIZE must be a non-negative integer"))?;
        if m.insert(k.to_string(), n).is_some() {
            bail!("--dim {k}: given twice");
        }
    }
    Ok(m)
}

/// Every `--dim` must name a symbolic dim of the model's inputs.
pub fn check_dims_exist(decls: &[(String, Shape)], dims: &HashMap<String, usize>) -> Result<()> {
    let mut syms: Vec<String> = vec![];
    for (_, decl) in decls {
        for d in &decl.dims {
            if let rlx_ir::Dim::Sym(s) = d {
                if !syms.contains(s) {
                    syms.push(s.clone());
                }
            }
        }
    }
    for k in dims.keys() {
        if !syms.contains(k) {
            let have = if syms.is_empty() {
                "none".to_string()
            } else {
                syms.join(", ")
            };
            bail!("--dim {k}: the model's inputs have no symbolic dim named \"{k}\" (they have: {have})");
        }
    }
    Ok(())
}

/// An error naming `path` once (not twice when the message already names it).
pub fn with_file(path: &Path, e: impl std::fmt::Display) -> anyhow::Error {
    let msg = e.to_string();
    let file = path.display().to_string();
    if msg.contains(&file) {
        anyhow!("{msg}")
    } else {
        anyhow!("{file}: {msg}")
    }
}

/// `msg` followed by one line per given input (name, file) whose name it quotes (`"x"`):
/// `rlx: input "x" was read from FILE`, in name order. Shared by every command that binds
/// input files (an import's refusal here, a dynamic model's input check in `compile`).
pub fn with_input_files<'a>(
    msg: &str,
    sources: impl IntoIterator<Item = (&'a String, &'a PathBuf)>,
) -> String {
    let mut named: Vec<(&String, &PathBuf)> = sources
        .into_iter()
        .filter(|(n, _)| msg.contains(&format!("\"{n}\"")))
        .collect();
    named.sort();
    let mut out = msg.to_string();
    for (n, p) in named {
        out.push_str(&format!(
            "\nrlx: input \"{n}\" was read from {}",
            p.display()
        ));
    }
    out
}

/// `e`, with [`with_input_files`]' lines when it names given inputs.
fn name_input_files(e: anyhow::Error, sources: &HashMap<String, PathBuf>) -> anyhow::Error {
    let msg = format!("{e:#}");
    let out = with_input_files(&msg, sources);
    if out.len() == msg.len() {
        e
    } else {
        anyhow!(out)
    }
}

/// Read the model, bind input files and dims, import once, and produce one tensor per graph
/// input (generated where no file was given). `quiet` silences the notes on stderr: where
/// each input came from, and one line per generated input ([`note_generated_input`]).
///
/// Errors: unreadable or malformed model or input file (naming it), an input file for a
/// name the model does not have, a file whose dtype or shape differs from the model's input.
pub fn load(a: &ModelArgs, quiet: bool) -> Result<Loaded> {
    load_inner(a, quiet, !quiet, vec![])
}

/// [`load`] without the one line per generated input, for a command that says itself
/// which inputs were generated (`rlx precision`); `quiet` silences the other notes.
pub fn load_unnoted(a: &ModelArgs, quiet: bool) -> Result<Loaded> {
    load_inner(a, quiet, false, vec![])
}

/// [`load`] with some inputs given as tensors (the Python package's arrays): each binds by
/// name as `--input NAME=FILE` does, and errors call it "the array given".
pub fn load_with(a: &ModelArgs, quiet: bool, arrays: Vec<(String, Tensor)>) -> Result<Loaded> {
    load_inner(a, quiet, !quiet, arrays)
}

/// `--input SPEC` split into `(NAME, FILE)` at its first '=' (None for a bare FILE, which
/// binds the next unnamed input). An empty NAME, an empty FILE after '=' (`--input x=`) or
/// an empty SPEC is refused with an error saying so.
pub fn split_input_spec(spec: &str) -> Result<Option<(&str, &str)>> {
    match spec.split_once('=') {
        Some(("", _)) => bail!("--input {spec}: the input NAME before '=' is empty"),
        Some((_, "")) => bail!("--input {spec:?}: no file after '='"),
        Some(p) => Ok(Some(p)),
        None if spec.is_empty() => bail!("--input \"\": no file given"),
        None => Ok(None),
    }
}

/// The model folder's `input_<name>.npy` for the input `name` when `model` is a folder
/// holding one; None when it is not a folder or holds no such entry. An entry of that
/// name that is not a regular file (a folder, a FIFO, a link to nothing) is an error
/// naming it, not skipped.
pub fn folder_input(model: &Path, name: &str) -> Result<Option<PathBuf>> {
    if !model.is_dir() {
        return Ok(None);
    }
    let p = model.join(format!("input_{}.npy", sanitize(name)));
    let not_regular = |what: &str| {
        anyhow!(
            "{} is not a regular file{what}: a model folder's input_<name>.npy is read as the input \"{name}\" (remove it, or give the input with --input {name}=FILE)",
            p.display()
        )
    };
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() => Ok(Some(p)),
        Ok(m) if m.is_dir() => Err(not_regular(" (a folder)")),
        Ok(_) => Err(not_regular("")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(&p).is_ok() {
                Err(not_regular(" (a link to nothing)"))
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(anyhow!("cannot read {}: {e}", p.display())),
    }
}

/// One line on stderr for an input generated because no file was given for it:
/// `rlx: input "x" f32[1,3] generated (seed 0): no --input or input_x.npy given`.
pub fn note_generated_input(name: &str, shape: &Shape, seed: u64, model: &Path) {
    let why = if model.is_dir() {
        format!("no --input or input_{}.npy given", sanitize(name))
    } else {
        "no --input given".to_string()
    };
    eprintln!("rlx: input \"{name}\" {shape} generated (seed {seed}): {why}");
}

/// [`load_with`], printing one line per generated input when `note_generated`.
fn load_inner(
    a: &ModelArgs,
    quiet: bool,
    note_generated: bool,
    arrays: Vec<(String, Tensor)>,
) -> Result<Loaded> {
    let mut dims = parse_dims(&a.dims)?;
    // A dynamic package holds its source model: this command imports that at the sizes
    // asked for (checked against the package's ranges). A static one holds only a graph.
    let mut package: Option<rlx_runtime::DynamicModel> = None;
    let mut package_model: Option<OnnxModel> = None;
    if crate::compile::is_package(&a.model) {
        let src = rlx_runtime::read_package_source(&a.model).map_err(|e| anyhow!("{e}"))?;
        let Some((_, ranges, bytes)) = src else {
            bail!(
                "{}: a static RLX package (a compiled graph, no source model); it runs with `rlx run`. Give this command the model it was compiled from (.onnx or .pt2), or compile a package with --dim NAME=MIN..MAX (it keeps the model)",
                a.model.display()
            );
        };
        let name = format!(
            "{}!{}",
            a.model.display(),
            rlx_runtime::package::SOURCE_ENTRY
        );
        let onnx = OnnxModel::from_bytes(&bytes, &name).map_err(|e| anyhow!("{e}"))?;
        let src = rlx_runtime::OnnxSource::from_bytes(bytes, &name).map_err(|e| anyhow!("{e}"))?;
        let dm = rlx_runtime::DynamicModel::new(
            std::sync::Arc::new(src),
            rlx_runtime::Device::Cpu,
            ranges,
        )
        .map_err(|e| anyhow!("{e}"))?;
        // Refused before any input is generated at that size.
        for (k, v) in &dims {
            match dm.ranges().get(k) {
                Some(r) if !r.accepts(*v) => {
                    bail!("--dim {k}={v}: outside the package's range of \"{k}\", {r}")
                }
                _ => {}
            }
        }
        package = Some(dm);
        package_model = Some(onnx);
    }
    let mut given: HashMap<String, Tensor> = HashMap::new();
    let mut sources: HashMap<String, PathBuf> = HashMap::new();
    for (name, t) in arrays {
        sources.insert(name.clone(), PathBuf::from("the array given"));
        if given.insert(name.clone(), t).is_some() {
            bail!("input \"{name}\": given twice");
        }
    }
    let mut positional: Vec<(PathBuf, Tensor)> = vec![];
    for spec in &a.inputs {
        match split_input_spec(spec)? {
            Some((name, file)) => {
                let t = read_input_file(Path::new(file))
                    .with_context(|| format!("input \"{name}\""))?;
                if given.insert(name.to_string(), t).is_some() {
                    bail!("--input {name}: given twice");
                }
                sources.insert(name.to_string(), PathBuf::from(file));
            }
            None => positional.push((
                PathBuf::from(spec),
                read_input_file(Path::new(spec)).with_context(|| format!("--input {spec}"))?,
            )),
        }
    }
    let path = model_path(&a.model);
    let m = match package_model.take() {
        Some(onnx) => SourceModel::Onnx(onnx),
        None => SourceModel::open(&path)?,
    };
    let decls = m.declared_inputs();
    check_dims_exist(&decls, &dims)?;
    // Every input name, with or without a declared shape (one without takes its shape
    // from the file given for it).
    let names = m.input_names();
    let free: Vec<String> = names
        .iter()
        .filter(|n| !given.contains_key(*n))
        .cloned()
        .collect();
    if positional.len() > free.len() {
        bail!(
            "{} unnamed --input files but only {} inputs left to bind ({})",
            positional.len(),
            free.len(),
            free.join(", ")
        );
    }
    let mut free = free.into_iter();
    for ((p, t), name) in positional.into_iter().zip(free.by_ref()) {
        sources.insert(name.clone(), p);
        given.insert(name, t);
    }
    for name in free {
        if let Some(p) = folder_input(&a.model, &name)? {
            if !quiet {
                eprintln!("rlx: input \"{name}\" from {}", p.display());
            }
            given.insert(name.clone(), read_npy(&p)?);
            sources.insert(name, p);
        }
    }
    for name in given.keys() {
        if !names.contains(name) {
            bail!(
                "--input {name}: the model has no input named \"{name}\" (its inputs: {})",
                names.join(", ")
            );
        }
    }
    if let Some(dm) = &package {
        // Every symbol at --dim's size, else an input file's, else its range's minimum.
        let refs: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
        dims = dm.sizes_for(&refs, &dims).into_iter().collect();
    }
    let opts = ImportOptions {
        dims,
        input_shapes: given
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect(),
        ..Default::default()
    };
    let graph = match m.import(&path, &opts) {
        Ok(g) => g,
        Err(e) => {
            // Name the files of the inputs the message names (a rank or size the model
            // refuses, a symbol two inputs disagree on).
            let e = name_input_files(e, &sources);
            // A parameter input (a Reshape's `shape`, a TopK's `K`) fed at run time: import
            // again with the given values frozen, as a dynamic model plans by value.
            let params: Vec<String> = match &m {
                SourceModel::Onnx(o) if e.to_string().contains("known at import time") => o
                    .parameter_inputs()
                    .into_iter()
                    .filter(|n| given.contains_key(n))
                    .collect(),
                _ => vec![],
            };
            if params.is_empty() {
                // `rlx run` gets past this by running the model in segments; say so for the
                // commands that need static shapes.
                if matches!(m, SourceModel::Onnx(_))
                    && rlx_runtime::dynamic::is_value_dependent(&e.to_string())
                {
                    return Err(e.context(
                        "this model needs values known only when it runs: `rlx run` runs it in segments around such nodes; this command needs a model that imports with static shapes",
                    ));
                }
                return Err(e);
            }
            let mut opts = opts;
            for n in &params {
                opts.input_shapes.remove(n);
                opts.constant_inputs.insert(n.clone(), given[n].clone());
            }
            let g = m.import(&path, &opts).map_err(|_| e)?;
            if !quiet {
                eprintln!(
                    "rlx: the model needs the value of {} (parameter input{}: it fixes sizes or axes); compiled for the value{} given",
                    params.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", "),
                    if params.len() > 1 { "s" } else { "" },
                    if params.len() > 1 { "s" } else { "" },
                );
            }
            for n in &params {
                given.remove(n);
            }
            g
        }
    };
    // Before generating any input: a huge --dim must be refused, not allocated.
    rlx_runtime::check_sizes(&graph).map_err(|e| anyhow!("{e}"))?;
    let mut feeds = vec![];
    for n in &graph.nodes {
        let Op::Input { name } = &n.op else { continue };
        let t = match given.remove(name) {
            Some(t) => {
                if t.dtype() != n.shape.dtype || t.dims() != n.shape.dims_usize().as_slice() {
                    let src = sources
                        .get(name)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    bail!(
                        "input \"{name}\": the model expects {}, {src} holds {}",
                        n.shape,
                        t.shape()
                    );
                }
                t
            }
            None => {
                if note_generated {
                    note_generated_input(name, &n.shape, a.seed, &a.model);
                }
                generate_input(name, &n.shape, a.seed)
            }
        };
        feeds.push((name.clone(), t));
    }
    if let Some(dm) = &package {
        // The package's guards: ranges, and symbols shared between inputs.
        let refs: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        dm.signature(&refs).map_err(|e| anyhow!("{e}"))?;
    }
    Ok(Loaded { graph, feeds })
}
