//! `rlx run` and `rlx lint`.

use crate::npy::{read_npy, write_npy};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rlx_ir::numeric_check::scan_data;
use rlx_ir::{DType, Shape, Tensor, TensorData};
use rlx_runtime::Session;
use std::path::{Path, PathBuf};

/// Exit status when `RLX_DEBUG_NANS=abort` stopped the run.
pub const EXIT_NAN_ABORT: i32 = 3;

/// Run an ONNX model on the CPU.
///
/// Inputs come from `--input NAME=FILE` (`.npy`, or ONNX `TensorProto` `.pb` as in the ONNX
/// test data); inputs not given are generated deterministically from the declared shapes
/// (floats uniform in [-1, 1), integer ids in [0, 10), `*mask*` inputs all ones; one line
/// on stderr names each), except that a model folder's `input_<name>.npy` files are used
/// when present.
/// Set RLX_DEBUG_NANS=1 (or strict, abort) to localize NaN/Inf to the op that created it.
#[derive(Args, Debug, Clone)]
#[command(name = "rlx-run", version, verbatim_doc_comment)]
pub struct RunArgs {
    /// Model file (.onnx, or .pt2 from torch.export.save), a folder holding model.onnx or
    /// model.pt2, or a package (.rlxpkg, from `rlx compile`).
    pub model: PathBuf,
    /// An input as NAME=FILE (.npy or .pb); FILE alone binds the next unnamed input. Repeatable.
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Write each output to DIR/<output name>.npy.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Bind a symbolic input dimension, e.g. --dim batch=2. Repeatable. Unbound dims take
    /// their size from the input files given, else 1.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// Seed for generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the NaN/Inf reports as JSON (turns scanning on in warn mode unless
    /// RLX_DEBUG_NANS already asks for strict or abort).
    #[arg(long, value_name = "FILE.json")]
    pub nan_report: Option<PathBuf>,
    /// Print the compiled IR graph (after passes) to stderr before running.
    #[arg(long)]
    pub print_graph: bool,
    /// Print only errors and reports, not the output summaries.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Device to run on: cpu (default for models), wgpu (the Vulkan GPU backend) or cuda. A package runs on
    /// the device type it was compiled for (the default for packages); another type is refused.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// CPU worker threads (default: RAYON_NUM_THREADS if set, else one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// Lint an ONNX model's constants.
#[derive(Args, Debug, Clone)]
pub struct LintArgs {
    /// Model file (.onnx or .pt2), or a folder holding model.onnx or model.pt2.
    pub model: PathBuf,
    /// Bind a symbolic input dimension, e.g. --dim batch=2.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
}

/// `model.onnx` (else `model.pt2`) inside a folder, or the path itself.
pub fn model_path(p: &Path) -> PathBuf {
    if p.is_dir() {
        let pt2 = p.join("model.pt2");
        let onnx = p.join("model.onnx");
        if !onnx.exists() && pt2.is_file() {
            return pt2;
        }
        if onnx.exists() && pt2.is_file() {
            static NOTED: std::sync::Once = std::sync::Once::new();
            NOTED.call_once(|| eprintln!(
                "rlx: {} holds both model.onnx and model.pt2; using model.onnx (give the file to pick the other)",
                p.display()
            ));
        }
        onnx
    } else {
        p.to_path_buf()
    }
}

/// Largest file `rlx` reads (model, inputs): 64 GiB, and only regular files, so a FIFO or
/// `/dev/zero` cannot make it read forever.
const MAX_FILE_BYTES: u64 = 64 << 30;

/// Read a regular file of bounded size; errors name the file.
pub fn read_regular_file(path: &Path) -> Result<Vec<u8>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    if meta.len() > MAX_FILE_BYTES {
        bail!(
            "{}: {} bytes is more than rlx reads ({MAX_FILE_BYTES})",
            path.display(),
            meta.len()
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Read an input file: `.npy`, else an ONNX TensorProto `.pb`.
pub fn read_input_file(path: &Path) -> Result<Tensor> {
    if path.extension().and_then(|e| e.to_str()) == Some("pb") {
        let bytes = read_regular_file(path)?;
        match rlx_onnx_import::read_tensor_proto(&bytes) {
            Ok((_, t)) => Ok(t),
            // ONNX test data keeps sequence / optional inputs as SequenceProto / OptionalProto.
            Err(_)
                if rlx_onnx_import::read_value_proto(&bytes, false).is_ok()
                    || rlx_onnx_import::read_value_proto(&bytes, true).is_ok() =>
            {
                bail!(
                    "{}: holds an ONNX sequence or optional value (SequenceProto / OptionalProto), not a tensor: rlx run feeds tensor inputs only (the library takes sequences: rlx_runtime::DynamicModel::set_value_inputs)",
                    path.display()
                )
            }
            Err(e) => Err(anyhow::Error::new(e)
                .context(format!("{}: not a valid ONNX TensorProto", path.display()))),
        }
    } else {
        read_npy(path)
    }
}

/// Deterministic pseudo-random input for `shape` (splitmix64).
pub fn generate_input(name: &str, shape: &Shape, seed: u64) -> Tensor {
    let dims = shape.dims_usize();
    let n: usize = dims.iter().product();
    let mut state = seed
        ^ 0x9E37_79B9_7F4A_7C15
        ^ name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let lname = name.to_ascii_lowercase();
    let data = if lname.contains("mask") {
        TensorData::from_f64(shape.dtype, &vec![1.0; n])
    } else if shape.dtype.is_float() {
        let v: Vec<f64> = (0..n)
            .map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            .collect();
        TensorData::from_f64(shape.dtype, &v)
    } else if shape.dtype == DType::Bool {
        TensorData::Bool((0..n).map(|_| next() & 1 == 1).collect())
    } else if lname.contains("type") || lname.contains("position") {
        TensorData::from_i64(shape.dtype, &vec![0; n])
    } else {
        TensorData::from_i64(
            shape.dtype,
            &(0..n).map(|_| (next() % 10) as i64).collect::<Vec<_>>(),
        )
    };
    Tensor::new(dims, data).expect("element count matches dims")
}

/// Output names made safe for file names: characters outside `[A-Za-z0-9._-]` become `_`;
/// names longer than 200 bytes keep 180 and gain a hash of the full name.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = if s.is_empty() || s == "." || s == ".." {
        format!("output{s}")
    } else {
        s
    };
    // File names are limited to 255 bytes: keep a prefix and a hash of the whole name.
    if s.len() > 200 {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        format!("{}_{h:016x}", &s[..180])
    } else {
        s
    }
}

/// One-line summary of a tensor: min, max, mean and non-finite counts.
pub fn summarize(t: &Tensor) -> String {
    let n = t.numel();
    if n == 0 {
        return "empty".into();
    }
    let c = scan_data(t.data());
    let (mut lo, mut hi, mut sum, mut k) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize);
    for i in 0..n {
        let x = t.data().get_f64(i);
        if x.is_finite() {
            lo = lo.min(x);
            hi = hi.max(x);
            sum += x;
            k += 1;
        }
    }
    let float = t.dtype().is_float();
    let fmt = |x: f64| {
        if float {
            format!("{x:.6}")
        } else {
            format!("{x}")
        }
    };
    // Integers print exactly (through i64/u64, not f64).
    let elem = |i: usize| match t.data() {
        rlx_ir::TensorData::U64(v) => v[i].to_string(),
        d if !float => d.get_i64(i).to_string(),
        d => fmt(d.get_f64(i)),
    };
    let first: Vec<String> = (0..n.min(4)).map(elem).collect();
    let mut s = if k > 0 {
        format!("min={} max={} mean={:.6}", fmt(lo), fmt(hi), sum / k as f64)
    } else {
        "no finite values".into()
    };
    if !c.is_clean() {
        s += &format!(" ({c})");
    }
    s + &format!(
        " first=[{}{}]",
        first.join(", "),
        if n > 4 { ", …" } else { "" }
    )
}

fn run_inner(a: &RunArgs) -> Result<i32> {
    crate::init_threads(a.threads)?;
    if crate::compile::is_package(&a.model) {
        return crate::compile::run_package(a);
    }
    let device = crate::compile::parse_device(a.device.as_deref().unwrap_or("cpu"))?;
    let loaded = match crate::load::load(
        &crate::load::ModelArgs {
            model: a.model.clone(),
            inputs: a.inputs.clone(),
            dims: a.dims.clone(),
            seed: a.seed,
        },
        a.quiet,
    ) {
        Ok(l) => l,
        // A node whose output shape depends on values: run the model in segments.
        Err(e) if crate::compile::is_value_dependent(&format!("{e:#}")) => {
            return crate::compile::run_onnx_segmented(a, device, e);
        }
        Err(e) => return Err(e),
    };
    let mut s = Session::new(device)
        .try_compile(loaded.graph)
        .map_err(|e| anyhow!("{e}"))?;
    run_compiled(a, &mut s, loaded.feeds)
}

/// Run a compiled model (imported, or loaded from a package) on `feeds` (one per input, in
/// input order), then write the NaN/Inf report and the outputs as `rlx run` does.
pub(crate) fn run_compiled(
    a: &RunArgs,
    s: &mut rlx_runtime::CompiledGraph,
    feeds: Vec<(String, Tensor)>,
) -> Result<i32> {
    // Reading the mode once here prints the note for an unrecognized value (one rule for
    // every switch: rlx_ir::env::Switch).
    let _ = rlx_ir::DebugMode::from_env();
    if a.nan_report.is_some() && !rlx_ir::DebugMode::from_env().is_on() {
        std::env::set_var("RLX_DEBUG_NANS", "1");
    }
    if a.print_graph {
        eprint!("{}", s.graph());
    }
    let result = s.run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect());
    if let Some(p) = &a.nan_report {
        let json = serde_json::json!({
            "model": model_path(&a.model).display().to_string(),
            "reports": s.nan_reports(),
            "absorbed_inf_summary": s.nan_summary(),
            "aborted": result.as_ref().err().and_then(|e| e.as_nan_abort()).is_some(),
        });
        crate::npy::write_replacing(p, |mut f| {
            use std::io::Write;
            f.write_all(serde_json::to_string_pretty(&json)?.as_bytes())?;
            Ok(())
        })?;
    }
    let outs = match result {
        Ok(o) => o,
        Err(e) if e.as_nan_abort().is_some() => {
            let ab = e.as_nan_abort().expect("checked");
            eprintln!(
                "rlx: run stopped by RLX_DEBUG_NANS=abort at {}",
                ab.report.at_in_context()
            );
            return Ok(EXIT_NAN_ABORT);
        }
        // The input check prints its own lines, one per problem, without a prefix.
        Err(e @ rlx_runtime::RuntimeError::InputCheck { .. }) => {
            eprintln!("{e}");
            return Ok(1);
        }
        Err(e) => return Err(anyhow!("{e}")),
    };
    let names: Vec<String> = s.outputs().into_iter().map(|o| o.0).collect();
    write_outputs(a, &names, &outs)?;
    Ok(0)
}

/// Print each output's summary (unless `--quiet`) and write it to `--output-dir`.
pub(crate) fn write_outputs(a: &RunArgs, names: &[String], outs: &[Tensor]) -> Result<()> {
    if let Some(dir) = &a.output_dir {
        crate::npy::create_output_dir(dir)?;
    }
    for ((name, file), t) in names.iter().zip(output_files(names)).zip(outs) {
        if !a.quiet {
            println!("{name}: {} {}", t.shape(), summarize(t));
        }
        if let Some(dir) = &a.output_dir {
            let p = dir.join(format!("{file}.npy"));
            write_npy(&p, t)?;
            if file != *name && !a.quiet {
                eprintln!("rlx: output \"{name}\" written to {}", p.display());
            }
        }
    }
    Ok(())
}

/// File stems for outputs named `names`: [`sanitize`]d, and distinct outputs whose sanitized
/// names collide get `_1`, `_2`, ... suffixes.
pub fn output_files(names: &[String]) -> Vec<String> {
    let mut used: Vec<String> = vec![];
    for name in names {
        let base = sanitize(name);
        let mut file = base.clone();
        let mut k = 0;
        while used.contains(&file) {
            k += 1;
            file = format!("{base}_{k}");
        }
        used.push(file);
    }
    used
}

/// Entry point of `rlx run` / `rlx-run`; returns the exit status.
pub fn main_run(a: RunArgs) -> i32 {
    match run_inner(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}

/// Entry point of `rlx lint`; exit 1 when a lint is found.
pub fn main_lint(a: LintArgs) -> i32 {
    let r = (|| -> Result<i32> {
        // As every command loads a model (a folder, a dynamic package's source, the
        // messages for a model that needs run-time values); the generated inputs are unused.
        let args = crate::load::ModelArgs {
            model: a.model.clone(),
            inputs: vec![],
            dims: a.dims.clone(),
            seed: 0,
        };
        let g = crate::load::load(&args, true)?.graph;
        if g.outputs.is_empty() {
            bail!("the graph has no outputs");
        }
        let lints = rlx_compile::numeric_lint(&g);
        for l in &lints {
            println!("{l}");
        }
        if lints.is_empty() {
            println!(
                "rlx numeric-lint: no constant folds to NaN/Inf ({} nodes checked)",
                g.len()
            );
            Ok(0)
        } else {
            Ok(1)
        }
    })();
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            2
        }
    }
}
