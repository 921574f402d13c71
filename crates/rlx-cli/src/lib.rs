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
/// On glibc, one malloc arena (`mallopt(M_ARENA_MAX, 1)`) unless `MALLOC_ARENA_MAX` is
/// set. The CPU executor's rayon workers allocate and free each other's tensors; with
/// glibc's per-thread arenas those buffers were trimmed and faulted back in on every run:
/// all-MiniLM-L6-v2 at 2 threads took 39.7 ms (1.2 s of system time in 3 s) and 26.6 ms
/// with one arena, peak RSS unchanged (bench/NOTES.md §8). Library users who run many
/// threads can set `MALLOC_ARENA_MAX=1` in the environment for the same effect.
///
/// On Unix, SIGPIPE's default action (end the process) is restored, so `rlx ... | head`
/// stops quietly instead of panicking at the next write to the closed stdout.
pub fn init_process() {
    // `rlx bench ... | head`: a closed stdout ends the process quietly, as for other Unix
    // tools, instead of a panic at the next println.
    #[cfg(unix)]
    // SAFETY: resets one signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called before any
        // thread is started.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}
