use clap::Parser;

/// Run an ONNX model on the CPU (the short form of `rlx run`).
///
/// Debug switches (environment):
///   RLX_DEBUG_NANS=1|strict|abort   name the op that created each NaN/Inf (off when unset)
///   RLX_LINT_NUMERICS=1             report constant subgraphs that fold to NaN/Inf
#[derive(Parser)]
#[command(name = "rlx-run", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    args: rlx_cli::run::RunArgs,
}

fn main() {
    rlx_cli::init_process();
    let cli = Cli::parse();
    std::process::exit(rlx_cli::run::main_run(cli.args));
}
