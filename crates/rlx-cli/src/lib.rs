//! The `rlx` command-line tool. `rlx run` runs a model and localizes NaN/Inf; `rlx lint`
//! proves constants non-finite before anything runs. `rlx-run` is `rlx run`.

pub mod compile;
pub mod devices;
pub mod diverge;
pub mod diverge_html;
pub mod env_cmd;
pub mod generate;
pub mod load;
pub mod npy;
#[rustfmt::skip]
pub mod onnx_types;
pub mod precision;
pub mod precision_html;
pub mod reduce;
pub mod run;
pub mod trace;

/// Most CPU worker threads `--threads` or `RAYON_NUM_THREADS` may ask for.
pub const MAX_THREADS: usize = 1024;

/// Size rayon's global pool, which the CPU backend's kernels run on: `Some(n)` gives `n`
/// worker threads, `None` leaves rayon's default (`RAYON_NUM_THREADS` if set, else one per
/// core). Returns the pool's thread count.
///
/// Errors: `Some(0)`, more than [`MAX_THREADS`] threads from either source (100 000
/// threads made a 1-second run take minutes), or a pool that cannot be built.
pub fn init_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads.is_none() {
        let env = std::env::var("RAYON_NUM_THREADS").ok();
        if let Some(n) = env.as_deref().and_then(|v| v.trim().parse::<usize>().ok()) {
            if n > MAX_THREADS {
                anyhow::bail!(
                    "RAYON_NUM_THREADS={n}: at most {MAX_THREADS} threads (this machine has \
                     {cores} cores); lower it, unset it, or pass --threads"
                );
            }
        }
    }
    match threads {
        Some(0) => anyhow::bail!("--threads 0: need at least one thread"),
        Some(n) if n > MAX_THREADS => {
            anyhow::bail!("--threads {n}: at most {MAX_THREADS} (this machine has {cores} cores)")
        }
        Some(n) => {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global()
                .map_err(|e| anyhow::anyhow!("cannot build a rayon pool of {n} threads: {e}"))?;
            Ok(n)
        }
        None => Ok(rayon::current_num_threads()),
    }
}

/// Process setup shared by the `rlx` and `rlx-run` binaries, called first in `main`.
///
/// On Unix, SIGPIPE's default action (end the process) is restored, so `rlx ... | head`
/// stops quietly instead of panicking at the next write to the closed stdout.
///
/// glibc's malloc keeps its default arenas (one per thread, up to 8 per core). One shared
/// arena (`mallopt(M_ARENA_MAX, 1)`, which this function used to set) made both workers
/// queue on its lock for gemm's per-call packing buffers: SqueezeNet at 2 threads took
/// 5.0 ms median with it and 4.1 without; MiniLM, the model it was set for, reads 28 ms
/// either way now that the executor pools its buffers (bench/NOTES.md §21).
/// `MALLOC_ARENA_MAX` in the environment still applies.
pub fn init_process() {
    // `rlx bench ... | head`: a closed stdout ends the process quietly, as for other Unix
    // tools, instead of a panic at the next println.
    #[cfg(unix)]
    // SAFETY: resets one signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parse a subcommand's arguments (`args`: what follows `rlx <name>` on a command line) with
/// the CLI's own definitions, so the same validation, defaults and messages apply: how the
/// Python package (`rlx.reduce`, `rlx.precision`) builds [`reduce::ReduceArgs`] and
/// [`precision::PrecisionArgs`]. `name` is the command as usage lines show it
/// (`"rlx reduce"`).
///
/// Errors: clap's (an unknown flag, a bad value, a missing argument; the CLI exits 2 on
/// them); `Error::render` gives the text the CLI prints.
pub fn parse_args<A, I, T>(name: &'static str, args: I) -> Result<A, clap::Error>
where
    A: clap::Args + clap::FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = A::augment_args(clap::Command::new(name).no_binary_name(true));
    let m = cmd.try_get_matches_from_mut(args)?;
    A::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))
}
