use clap::{Parser, Subcommand};

mod bench;

/// RLX: run ML models and find out why their numbers are wrong.
///
/// Debug switches (environment):
///   RLX_DEBUG_NANS=1|strict|abort   name the op that created each NaN/Inf (off when unset)
///   RLX_LINT_NUMERICS=1             report constant subgraphs that fold to NaN/Inf
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
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Run(a) => rlx_cli::run::main_run(a),
        Cmd::Lint(a) => rlx_cli::run::main_lint(a),
        Cmd::Bench(a) => bench::main_bench(a),
    };
    std::process::exit(code);
}
