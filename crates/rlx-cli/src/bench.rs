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
//! device: cpu
//! threads: 2
//! nan-check: off
//! load: 41.210 ms (read+import 30.002 ms, compile 11.208 ms)
//! runs: 3 (warmup 1)
//! median: 0.8120 ms
//! min: 0.7901 ms
//! mean: 0.8354 ms
//! real: 0.000835412
//! ```
//!
//! `real:` is the mean seconds per run and is always the last line.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use rlx_cli::load::{load, ModelArgs};
use rlx_cli::npy::write_npy;
use rlx_cli::run::{model_path, output_files};
use rlx_ir::{DebugMode, Tensor};
use rlx_runtime::{Device, Session};
use std::path::PathBuf;
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
    #[command(flatten)]
    pub model: ModelArgs,
    /// Device to run on: cpu, or wgpu (the GPU backend, when an adapter is present).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
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
        Some(n) if n > 1024 => bail!(
            "--threads {n}: at most 1024 (this machine has {} cores)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        ),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| anyhow!("cannot build a rayon pool of {threads} threads: {e}"))?;
    let device = match a.device.trim().to_ascii_lowercase().as_str() {
        "cpu" => Device::Cpu,
        "wgpu" | "gpu" => Device::Wgpu,
        other => bail!("--device {other}: unknown device (known: cpu, wgpu)"),
    };
    let path = model_path(&a.model.model);
    let t_load = Instant::now();
    let loaded = load(&a.model, true)?;
    let d_import = t_load.elapsed();
    let t_compile = Instant::now();
    let mut s = Session::new(device)
        .try_compile(loaded.graph)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let d_compile = t_compile.elapsed();
    let feeds = loaded.feeds;
    let mode = DebugMode::from_env();
    println!("model: {}", path.display());
    println!("device: {device}");
    println!("threads: {threads}");
    println!(
        "nan-check: {}",
        if mode.is_on() {
            rlx_ir::env::get("RLX_DEBUG_NANS").unwrap_or_default()
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
        rlx_cli::npy::create_output_dir(dir)?;
        let names: Vec<String> = s.outputs().into_iter().map(|o| o.0).collect();
        for (file, t) in output_files(&names).iter().zip(&outs) {
            write_npy(&dir.join(format!("{file}.npy")), t)?;
        }
    }
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    println!("runs: {} (warmup {})", times.len(), a.warmup);
    println!("median: {} ms", fmt_ms(median(&sorted)));
    println!("min: {} ms", fmt_ms(sorted[0]));
    println!("mean: {} ms", fmt_ms(mean));
    println!("real: {mean:.9}");
    Ok(())
}

/// Seconds as milliseconds: 4 decimals under 1 ms, else 3 (a 0.065 ms run printed with 3
/// decimals would carry ±0.8% of rounding into any ratio taken from it; with 4, ±0.08%).
/// Use `real:` (seconds, 9 decimals) for runs of a few microseconds.
fn fmt_ms(s: f64) -> String {
    let ms = s * 1e3;
    if ms < 1.0 {
        format!("{ms:.4}")
    } else {
        format!("{ms:.3}")
    }
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
