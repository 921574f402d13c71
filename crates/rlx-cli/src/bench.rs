//! `rlx bench`: time steady-state runs of one compiled model in-process.
//!
//! The model is read, imported and compiled once; then `--warmup` untimed runs, then timed
//! runs (`--runs R`, or as many as fit in `--max-time S` seconds). Each timed run is one
//! `CompiledGraph::run_tensor_refs` call on the inputs read once (lent, never copied or freed
//! by a run), so the time is the executor's alone. The output is line-oriented so that
//! scripts (bench/run.sh) can read it:
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
//! On a GPU device a `backend:` line follows `device:` (`backend: wgpu (NVIDIA H200, Vulkan),
//! 701/703 nodes on wgpu (2 on the cpu)`). On CUDA a `device median: X ms` line follows
//! `mean:`: the median of the runs' device times (CUDA events around the run's kernels, so the
//! upload of the inputs and the read-back of the outputs are left out, as in PyTorch's
//! CUDA-event timings of a model whose tensors stay on the GPU); `median:` is the wall time of
//! the whole call, transfers included. `real:` is the mean seconds per run and is always the
//! last line.

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
    /// Device to run on: cpu, wgpu (the Vulkan GPU backend, when an adapter is present) or cuda (when a CUDA driver and device are).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
    /// CPU worker threads (default: RAYON_NUM_THREADS if set, else one per core).
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
    /// After the timed runs, time as many runs again with a clock read around every node
    /// (CPU; on CUDA, CUDA events between nodes; on wgpu, timestamp queries around each node's
    /// dispatches, CPU-fallback nodes by the host clock; on GPUs a fused kernel's time goes to
    /// the node it runs at, a Conv or a chain's last node, and the nodes folded into it show 0) and print the source ops (ONNX
    /// node names) that took the most time.
    #[arg(long)]
    pub profile: bool,
    /// How many source ops the --profile table lists (0: all).
    #[arg(long, default_value_t = 25, value_name = "N", requires = "profile")]
    pub profile_top: usize,
    /// Also write every IR node's time to FILE as CSV (node,label,op,shape,mean_us; a shape
    /// reads `f32[1x64x112x112]`), in execution order. pandas.read_csv(FILE) reads it; so
    /// does numpy.genfromtxt(FILE, delimiter=",", names=True, dtype=None, encoding=None,
    /// comments=None) when no node name holds a comma (such names are quoted, as CSV does).
    #[arg(long, value_name = "FILE", requires = "profile")]
    pub profile_csv: Option<PathBuf>,
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
    let threads = rlx_cli::init_threads(a.threads)?;
    let device = rlx_cli::compile::parse_device(&a.device)?;
    // The CSV goes to a temporary file beside FILE, renamed when written: a bad path fails
    // here, before any run, and a failed write leaves no partial FILE.
    let csv_tmp = match &a.profile_csv {
        Some(f) => Some(CsvOut::create(f)?),
        None => None,
    };
    let path = model_path(&a.model.model);
    let t_load = Instant::now();
    let mut planned = None;
    let (mut s, feeds, d_import, d_compile) = if rlx_cli::compile::is_package(&a.model.model) {
        // A package: compiled already; a dynamic one plans this size signature (--dim,
        // --input) once, before the timed runs.
        match rlx_cli::compile::prepare_package(&a.model, Some(&a.device), true)? {
            rlx_cli::compile::Ready::Plan {
                graph,
                feeds,
                planned: p,
            } => {
                planned = p;
                (graph, feeds, t_load.elapsed(), Duration::ZERO)
            }
            rlx_cli::compile::Ready::Segmented { .. } => bail!(
                "{}: runs in segments around nodes whose output shapes depend on values; rlx bench times one plan",
                path.display()
            ),
        }
    } else {
        let loaded = load(&a.model, true)?;
        let d_import = t_load.elapsed();
        let t_compile = Instant::now();
        let s = Session::new(device)
            .try_compile(loaded.graph)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        (s, loaded.feeds, d_import, t_compile.elapsed())
    };
    let mode = DebugMode::from_env();
    println!("model: {}", path.display());
    println!("device: {device}");
    if device != Device::Cpu {
        // The GPU's name and how much of the model its kernels run (the rest falls back).
        let c = s.coverage();
        println!(
            "backend: {}, {}/{} nodes on {device} ({} on the cpu)",
            s.backend_name(),
            c.on_device,
            c.total,
            c.on_cpu()
        );
    }
    println!("threads: {threads}");
    println!(
        "nan-check: {}",
        if mode.is_on() {
            rlx_ir::env::get("RLX_DEBUG_NANS").unwrap_or_default()
        } else {
            "off".to_string()
        }
    );
    match &planned {
        Some(ev) => println!(
            "load: {:.3} ms (read package {:.3} ms, plan for {} {:.3} ms: specialize {:.3} ms{} + compile {:.3} ms of a new size signature)",
            ms(d_import),
            ms(d_import) - ev.plan_ms,
            ev.signature,
            ev.plan_ms,
            ev.specialize_ms,
            if ev.specialized_by.is_empty() {
                String::new()
            } else {
                format!(" by {}", ev.specialized_by)
            },
            ev.plan_ms - ev.specialize_ms
        ),
        None => println!(
            "load: {:.3} ms (read+import {:.3} ms, compile {:.3} ms)",
            ms(d_import + d_compile),
            ms(d_import),
            ms(d_compile)
        ),
    }

    // The inputs are lent to every run (`run_tensor_refs`): no copy before a run and no free
    // inside the timed call, as onnxruntime reads its NumPy inputs in place.
    let inputs: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let one_run = |s: &mut rlx_runtime::CompiledGraph| -> Result<(Duration, Vec<Tensor>)> {
        let t0 = Instant::now();
        let out = s.run_tensor_refs(&inputs);
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
    let device_timing = s.set_device_timing(true);
    let mut dev_times: Vec<f64> = vec![];
    let mut times: Vec<f64> = vec![];
    let budget = a.max_time.unwrap_or(3.0);
    let t_all = Instant::now();
    let outs = loop {
        let (d, o) = one_run(&mut s)?;
        s.set_print_reports(false);
        times.push(d.as_secs_f64());
        if let Some(ms) = s.last_device_ms() {
            dev_times.push(ms);
        }
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
    if device_timing {
        s.set_device_timing(false);
    }
    if a.profile {
        s.set_profiling(true)
            .map_err(|e| anyhow!("--profile: {e}"))?;
        let t0 = Instant::now();
        for _ in 0..times.len() {
            one_run(&mut s)?;
        }
        let per_run = t0.elapsed().as_secs_f64() / times.len() as f64;
        let p = s
            .profile()
            .ok_or_else(|| anyhow!("--profile: no profile was recorded"))?;
        s.set_profiling(false)
            .map_err(|e| anyhow!("--profile: {e}"))?;
        print_profile(&p, per_run, a.profile_top);
        if let Some(out) = csv_tmp {
            let f = out.finish(&profile_csv(&p))?;
            println!("profile-csv: {}", f.display());
        }
    }
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    println!("runs: {} (warmup {})", times.len(), a.warmup);
    println!("median: {} ms", fmt_ms(median(&sorted)));
    println!("min: {} ms", fmt_ms(sorted[0]));
    println!("mean: {} ms", fmt_ms(mean));
    if !dev_times.is_empty() {
        dev_times.sort_by(|x, y| x.total_cmp(y));
        println!(
            "device median: {:.3} ms (kernels only: inputs uploaded before, outputs read back after)",
            median(&dev_times)
        );
    }
    println!("real: {mean:.9}");
    Ok(())
}

/// One source op of the --profile table: its IR nodes' times summed.
struct SourceOp<'a> {
    label: &'a str,
    op: &'a str,
    shape: &'a str,
    us: f64,
    nodes: usize,
}

/// Prints the --profile table: source ops (IR nodes grouped by label) by time, largest first.
fn print_profile(p: &rlx_runtime::Profile, per_run_s: f64, top: usize) {
    let mut ops: Vec<SourceOp> = vec![];
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for n in &p.nodes {
        match at.get(n.label.as_str()) {
            Some(&k) => {
                ops[k].us += n.mean_us;
                ops[k].nodes += 1;
                ops[k].shape = &n.shape;
            }
            None => {
                at.insert(&n.label, ops.len());
                ops.push(SourceOp {
                    label: &n.label,
                    op: &n.op,
                    shape: &n.shape,
                    us: n.mean_us,
                    nodes: 1,
                });
            }
        }
    }
    let total = ops.iter().fold(0.0, |t, o| t + o.us);
    ops.sort_by(|x, y| y.us.total_cmp(&x.us));
    let shown = if top == 0 {
        ops.len()
    } else {
        top.min(ops.len())
    };
    println!(
        "profile: {} run{}; nodes sum to {} ms of a {} ms run (the rest: clock reads, leaves, the run's setup); top {shown} of {} source ops",
        p.runs,
        if p.runs == 1 { "" } else { "s" },
        fmt_ms(total / 1e6),
        fmt_ms(per_run_s),
        ops.len()
    );
    println!(
        "{:>10} {:>6} {:>6}  {:<22} {:<24} node",
        "us/run", "%", "cum%", "op", "output"
    );
    let mut cum = 0.0;
    for o in &ops[..shown] {
        cum += o.us;
        let pct = |x: f64| if total > 0.0 { 100.0 * x / total } else { 0.0 };
        let ir = if o.nodes > 1 {
            format!(" ({} IR nodes)", o.nodes)
        } else {
            String::new()
        };
        println!(
            "{:>10.1} {:>5.1}% {:>5.1}%  {:<22} {:<24} {}{ir}",
            o.us,
            pct(o.us),
            pct(cum),
            o.op,
            o.shape,
            o.label
        );
    }
}

/// Every IR node's time as CSV: node,label,op,shape,mean_us (a field with a comma, quote
/// or line break quoted as CSV does; shapes written `f32[1x64x112x112]`, without commas).
fn profile_csv(p: &rlx_runtime::Profile) -> String {
    fn field(s: &str) -> String {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    }
    let mut out = String::from("node,label,op,shape,mean_us\n");
    for n in &p.nodes {
        out += &format!(
            "{},{},{},{},{:.3}\n",
            n.node.index(),
            field(&n.label),
            field(&n.op),
            field(&n.shape.replace(',', "x")),
            n.mean_us
        );
    }
    out
}

/// `--profile-csv FILE`: a temporary file beside FILE, made before the runs (so a bad path
/// fails first) and renamed to FILE once written (so a failed write leaves no partial FILE).
struct CsvOut {
    tmp: PathBuf,
    dest: PathBuf,
}

impl CsvOut {
    fn create(dest: &std::path::Path) -> Result<CsvOut> {
        if dest.is_dir() {
            bail!("--profile-csv {}: is a directory", dest.display());
        }
        let name = dest
            .file_name()
            .ok_or_else(|| anyhow!("--profile-csv {}: not a file name", dest.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".rlx-tmp-{}", std::process::id()));
        let tmp = dest.with_file_name(tmp_name);
        std::fs::File::create(&tmp)
            .map_err(|e| anyhow!("--profile-csv {}: {e}", dest.display()))?;
        Ok(CsvOut {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    fn finish(self, text: &str) -> Result<PathBuf> {
        let r =
            std::fs::write(&self.tmp, text).and_then(|()| std::fs::rename(&self.tmp, &self.dest));
        if let Err(e) = r {
            std::fs::remove_file(&self.tmp).ok();
            bail!("--profile-csv {}: {e}", self.dest.display());
        }
        Ok(self.dest.clone())
    }
}

impl Drop for CsvOut {
    /// An error before `finish` (a failed run): the temporary file goes.
    fn drop(&mut self) {
        std::fs::remove_file(&self.tmp).ok();
    }
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
