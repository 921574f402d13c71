//! The `rlx` command-line tool. `rlx run` runs a model and localizes NaN/Inf; `rlx lint`
//! proves constants non-finite before anything runs. `rlx-run` is `rlx run`.

pub mod compile;
pub mod diverge;
pub mod env_cmd;
pub mod load;
pub mod npy;
pub mod run;
pub mod trace;

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
