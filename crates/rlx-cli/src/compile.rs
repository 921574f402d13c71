//! `rlx compile MODEL --device cpu -o model.rlxpkg`, and running a package with `rlx run`.
//!
//! A package (`docs/PACKAGE.md`) is one zip file holding the optimized graph with
//! provenance, the weights (safetensors), the device type, the input guards and a format
//! version; `rlx run model.rlxpkg` loads it and runs it without the ONNX file.

use crate::load::{load, ModelArgs};
use crate::run::{generate_input, read_input_file, RunArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rlx_ir::Tensor;
use rlx_runtime::{load_package, save_package, CompiledGraph, Device, Session};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Compile a model into a package file: the optimized graph, its weights, the device type,
/// the input guards and a format version, in one zip archive (`docs/PACKAGE.md`).
///
/// Symbolic input dims are bound as `rlx run` binds them (`--dim`, the shapes of `--input`
/// files, a model folder's `input_<name>.npy` files, else 1); the package accepts exactly
/// those shapes, and `RLX_RUNTIME_CHECK_INPUTS=1 rlx run model.rlxpkg` names the symbol of a
/// dim that differs.
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

fn compile_inner(a: &CompileArgs) -> Result<()> {
    let device = parse_device(&a.device)?;
    if !rlx_runtime::device_available(device) {
        bail!(
            "--device {device}: {}",
            rlx_runtime::RuntimeError::DeviceUnavailable(device)
        );
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

/// Load the package `a.model` for the CPU and bind `--input` files (named or positional)
/// to its inputs; inputs not given are generated from the compiled shapes (`--seed`).
///
/// With the input check on (`RLX_RUNTIME_CHECK_INPUTS=1`) a file whose type differs from
/// the package's input is left for the guards to report (one `rlx input-check:` line per
/// problem); otherwise it is refused here with one line naming the file.
pub fn load_package_for_run(a: &RunArgs) -> Result<(CompiledGraph, Vec<(String, Tensor)>)> {
    if !a.dims.is_empty() {
        bail!(
            "--dim: a package's input dims were fixed when it was compiled; recompile with `rlx compile --dim ...`"
        );
    }
    let device = match &a.device {
        Some(d) => parse_device(d)?,
        None => {
            let m = rlx_runtime::package::read_manifest(&a.model).map_err(|e| anyhow!("{e}"))?;
            parse_device(&m.device_type)?
        }
    };
    let s = load_package(&a.model, device).map_err(|e| anyhow!("{e}"))?;
    let decl = s.inputs();
    let mut given: HashMap<String, (Tensor, PathBuf)> = HashMap::new();
    let mut free = decl.iter().map(|d| d.0.clone());
    let named: Vec<&str> = a
        .inputs
        .iter()
        .filter_map(|s| s.split_once('=').map(|p| p.0))
        .collect();
    let mut free_names = vec![];
    for n in free.by_ref() {
        if !named.contains(&n.as_str()) {
            free_names.push(n);
        }
    }
    let mut free_names = free_names.into_iter();
    for spec in &a.inputs {
        let (name, file) = match spec.split_once('=') {
            Some((name, file)) => {
                if name.is_empty() {
                    bail!("--input {spec}: the input NAME before '=' is empty");
                }
                (name.to_string(), file)
            }
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
    let checked = s.check_inputs_enabled();
    let mut feeds = vec![];
    for (name, shape) in &decl {
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
            None => generate_input(name, shape, a.seed),
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
    Ok((s, feeds))
}
