//! `rlx bench`: time steady-state runs of one compiled model in-process.
//!
//! The model is read, imported and compiled once; then `--warmup` untimed runs, then timed
//! runs (`--runs R`, or as many as fit in `--max-time S` seconds). Each timed run is one
//! `CompiledGraph::run_tensors` call; the inputs are cloned before the clock starts, so the
//! time is the executor's alone. The output is line-oriented so that scripts (bench/run.sh)
//! can read it:
//!
//! ```text
//! model: fixtures/transformers/bert_tiny/model.onnx
//! threads: 2
//! nan-check: off
//! load: 41.210 ms (read+import 30.002 ms, compile 11.208 ms)
//! runs: 3 (warmup 1)
//! median: 0.812 ms
//! min: 0.790 ms
//! mean: 0.835 ms
//! real: 0.000835
//! ```
//!
//! `real:` is the mean seconds per run and is always the last line.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rlx_cli::npy::{read_npy, write_npy};
use rlx_cli::run::{generate_input, model_path, read_input_file, sanitize};
use rlx_ir::{DebugMode, Tensor};
use rlx_onnx_import::{ImportOptions, OnnxModel};
use rlx_runtime::{Device, Session};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Time steady-state runs of one model on the CPU.
///
/// Inputs as for `rlx run`: `--input NAME=FILE` (.npy or .pb), a model folder's
/// `input_<name>.npy`, else deterministic random inputs from the declared shapes (--seed).
/// Prints the load+compile time, then median, min and mean milliseconds per run, and a last
/// line `real: <mean seconds per run>`. RLX_DEBUG_NANS is honoured (reports are printed for
/// the first run only).
#[derive(Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Model file (.onnx), or a folder holding model.onnx.
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
    /// Worker threads of the rayon pool (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 3, value_name = "W")]
    pub warmup: usize,
    /// Exactly this many timed runs.
    #[arg(long, value_name = "R", conflicts_with = "max_time")]
    pub runs: Option<usize>,
    /// Time runs until this many seconds are spent (at least 3 runs, at most 100000).
    /// Default when neither --runs nor --max-time is given: 3 seconds.
    #[arg(long, value_name = "S")]
    pub max_time: Option<f64>,
    /// Write the last run's outputs to DIR/<output name>.npy (to compare with another runtime).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

const MAX_TIMED_RUNS: usize = 100_000;

fn parse_dims(v: &[String]) -> Result<HashMap<String, usize>> {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median of sorted seconds.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Bind input files (named, positional, model-folder `input_<name>.npy`) to declared inputs.
fn bind_inputs(
    a: &BenchArgs,
    decls: &[(String, rlx_ir::Shape)],
) -> Result<(HashMap<String, Tensor>, HashMap<String, PathBuf>)> {
    let mut given: HashMap<String, Tensor> = HashMap::new();
    let mut sources: HashMap<String, PathBuf> = HashMap::new();
    let mut positional: Vec<PathBuf> = vec![];
    for spec in &a.inputs {
        match spec.split_once('=') {
            Some((name, file)) => {
                if name.is_empty() {
                    bail!("--input {spec}: the input NAME before '=' is empty");
                }
                let t = read_input_file(Path::new(file))
                    .with_context(|| format!("input \"{name}\""))?;
                if given.insert(name.to_string(), t).is_some() {
                    bail!("--input {name}: given twice");
                }
                sources.insert(name.to_string(), PathBuf::from(file));
            }
            None => positional.push(PathBuf::from(spec)),
        }
    }
    let free: Vec<String> = decls
        .iter()
        .map(|d| d.0.clone())
        .filter(|n| !given.contains_key(n))
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
    for (p, name) in positional.into_iter().zip(free.by_ref()) {
        let t = read_input_file(&p).with_context(|| format!("--input {}", p.display()))?;
        given.insert(name.clone(), t);
        sources.insert(name, p);
    }
    if a.model.is_dir() {
        for name in free {
            let p = a.model.join(format!("input_{}.npy", sanitize(&name)));
            if p.is_file() {
                given.insert(name.clone(), read_npy(&p)?);
                sources.insert(name, p);
            }
        }
    }
    for name in given.keys() {
        if !decls.iter().any(|d| &d.0 == name) {
            let names: Vec<&str> = decls.iter().map(|d| d.0.as_str()).collect();
            bail!(
                "--input {name}: the model has no input named \"{name}\" (its inputs: {})",
                names.join(", ")
            );
        }
    }
    Ok((given, sources))
}

fn bench_inner(a: &BenchArgs) -> Result<()> {
    if let Some(t) = a.max_time {
        if !(t.is_finite() && t > 0.0) {
            bail!("--max-time {t}: must be a positive number of seconds");
        }
    }
    if a.runs == Some(0) {
        bail!("--runs 0: need at least one timed run");
    }
    let threads = match a.threads {
        Some(0) => bail!("--threads 0: need at least one thread"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| anyhow!("cannot build a rayon pool of {threads} threads: {e}"))?;
    let dims = parse_dims(&a.dims)?;
    let path = model_path(&a.model);

    let t_load = Instant::now();
    let m = OnnxModel::open(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let decls = m.declared_inputs();
    let (mut given, sources) = bind_inputs(a, &decls)?;
    let opts = ImportOptions {
        dims,
        input_shapes: given
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect(),
        ..Default::default()
    };
    let g = m
        .import(&opts)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let d_import = t_load.elapsed();
    let t_compile = Instant::now();
    let mut s = Session::new(Device::Cpu)
        .try_compile(g)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let d_compile = t_compile.elapsed();

    let mut feeds: Vec<(String, Tensor)> = vec![];
    for (name, shape) in s.inputs() {
        let t = match given.remove(&name) {
            Some(t) => {
                if t.dtype() != shape.dtype || t.dims() != shape.dims_usize().as_slice() {
                    let src = sources
                        .get(&name)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    bail!(
                        "input \"{name}\": the model expects {shape}, {src} holds {}",
                        t.shape()
                    );
                }
                t
            }
            None => generate_input(&name, &shape, a.seed),
        };
        feeds.push((name, t));
    }
    let mode = DebugMode::from_env();
    println!("model: {}", path.display());
    println!("threads: {threads}");
    println!(
        "nan-check: {}",
        if mode.is_on() {
            std::env::var("RLX_DEBUG_NANS").unwrap_or_default()
        } else {
            "off".to_string()
        }
    );
    println!(
        "load: {:.3} ms (read+import {:.3} ms, compile {:.3} ms)",
        ms(d_import + d_compile),
        ms(d_import),
        ms(d_compile)
    );

    let one_run = |s: &mut rlx_runtime::CompiledGraph| -> Result<(Duration, Vec<Tensor>)> {
        let inputs: Vec<(&str, Tensor)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let t0 = Instant::now();
        let out = s.run_tensors(inputs);
        let d = t0.elapsed();
        match out {
            Ok(o) => Ok((d, o)),
            Err(e) if e.as_nan_abort().is_some() => {
                bail!("run stopped by RLX_DEBUG_NANS=abort: {e}")
            }
            Err(e) => Err(anyhow!("{e}")),
        }
    };
    // Reports (when scanning) are printed for the first run only.
    for i in 0..a.warmup {
        s.set_print_reports(i == 0);
        one_run(&mut s)?;
    }
    s.set_print_reports(a.warmup == 0);
    let mut times: Vec<f64> = vec![];
    let budget = a.max_time.unwrap_or(3.0);
    let t_all = Instant::now();
    let outs = loop {
        let (d, o) = one_run(&mut s)?;
        s.set_print_reports(false);
        times.push(d.as_secs_f64());
        let done = match a.runs {
            Some(r) => times.len() >= r,
            None => {
                times.len() >= MAX_TIMED_RUNS
                    || (times.len() >= 3 && t_all.elapsed().as_secs_f64() >= budget)
            }
        };
        if done {
            break o;
        }
    };
    if let Some(dir) = &a.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut used: Vec<String> = vec![];
        for ((name, _), t) in s.outputs().iter().zip(&outs) {
            let base = sanitize(name);
            let mut file = base.clone();
            let mut k = 0;
            while used.contains(&file) {
                k += 1;
                file = format!("{base}_{k}");
            }
            used.push(file.clone());
            write_npy(&dir.join(format!("{file}.npy")), t)?;
        }
    }
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    println!("runs: {} (warmup {})", times.len(), a.warmup);
    println!("median: {:.3} ms", median(&sorted) * 1e3);
    println!("min: {:.3} ms", sorted[0] * 1e3);
    println!("mean: {:.3} ms", mean * 1e3);
    println!("real: {mean:.9}");
    Ok(())
}

/// Entry point of `rlx bench`; returns the exit status (0, or 1 on any error).
pub fn main_bench(a: BenchArgs) -> i32 {
    match bench_inner(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}
