use clap::{Parser, Subcommand};

mod bench;

/// RLX: run ML models and find out why their numbers are wrong.
///
/// Debug switches (environment):
///   RLX_DEBUG_NANS=1|strict|abort   name the op that created each NaN/Inf (off when unset)
///   RLX_LINT_NUMERICS=1             report constant subgraphs that fold to NaN/Inf
///   RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER=1|2|3  per-op stats (2: values, 3: op name first)
///   `rlx env` lists every RLX_* variable with its current value
///   `rlx devices` lists cpu/wgpu/cuda: live here, or why not
#[derive(Parser)]
#[command(name = "rlx", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a model on inputs and print/write its outputs (also available as `rlx-run`).
    Run(rlx_cli::run::RunArgs),
    /// Report constant subgraphs that provably fold to NaN/Inf (exit 1 if any).
    Lint(rlx_cli::run::LintArgs),
    /// Time steady-state runs of a compiled model: median, min, mean ms per run.
    Bench(bench::BenchArgs),
    /// Compare every live backend with the CPU; tell round-off from a kernel bug (exit 1 if suspect).
    Diverge(rlx_cli::diverge::DivergeArgs),
    /// Compile a model into one package file (graph, weights, device type, input guards).
    Compile(rlx_cli::compile::CompileArgs),
    /// Run once and write per-op value statistics as trace.json and a self-contained trace.html.
    Trace(rlx_cli::trace::TraceArgs),
    /// List every RLX_* environment variable: when it acts, what it catches, its cost, its value.
    Env(rlx_cli::env_cmd::EnvArgs),
    /// Generate text from a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3; the
    /// family from config.json) with a KV cache; also `rlx-run qwen3 --model DIR ...`.
    Generate(rlx_cli::generate::GenerateArgs),
    /// List the device types (cpu, wgpu, cuda): which are live here, and why the others are not.
    Devices(rlx_cli::devices::DevicesArgs),
    // No doc comment here: clap would take it as the whole help (a one-paragraph doc comment
    // sets long_about to none) and hide ReduceArgs' long help; its first paragraph is the about.
    Reduce(rlx_cli::reduce::ReduceArgs),
    // As Reduce: the help is PrecisionArgs' doc comment.
    Precision(rlx_cli::precision::PrecisionArgs),
}

/// Tensors on cache lines (`rlx_kernels::alloc`).
#[global_allocator]
static ALLOC: rlx_kernels::alloc::LineAligned = rlx_kernels::alloc::LineAligned;

fn main() {
    rlx_cli::init_process();
    let cli = Cli::parse();
    // `run` and `bench` size the pool themselves (they take --threads).
    if !matches!(
        cli.cmd,
        Cmd::Run(_) | Cmd::Bench(_) | Cmd::Env(_) | Cmd::Devices(_) | Cmd::Generate(_)
    ) {
        if let Err(e) = rlx_cli::init_threads(None) {
            eprintln!("rlx: error: {e}");
            std::process::exit(1);
        }
    }
    let code = match cli.cmd {
        Cmd::Run(a) => rlx_cli::run::main_run(a),
        Cmd::Lint(a) => rlx_cli::run::main_lint(a),
        Cmd::Bench(a) => bench::main_bench(a),
        Cmd::Diverge(a) => rlx_cli::diverge::main_diverge(a),
        Cmd::Compile(a) => rlx_cli::compile::main_compile(a),
        Cmd::Trace(a) => rlx_cli::trace::main_trace(a),
        Cmd::Env(a) => rlx_cli::env_cmd::main_env(a),
        Cmd::Devices(a) => rlx_cli::devices::main_devices(a),
        Cmd::Reduce(a) => rlx_cli::reduce::main_reduce(a),
        Cmd::Precision(a) => rlx_cli::precision::main_precision(a),
        Cmd::Generate(a) => rlx_cli::generate::main_generate(a, None),
    };
    std::process::exit(code);
}
