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

/// `rlx-run qwen3 --model DIR --prompt TEXT ...`: generation from a checkpoint folder.
#[derive(Parser)]
#[command(
    name = "rlx-run",
    version,
    about = "Generate text from a Hugging Face checkpoint folder"
)]
struct GenCli {
    #[command(flatten)]
    args: rlx_cli::generate::GenerateArgs,
}

/// Tensors on cache lines (`rlx_kernels::alloc`).
#[global_allocator]
static ALLOC: rlx_kernels::alloc::LineAligned = rlx_kernels::alloc::LineAligned;

fn main() {
    rlx_cli::init_process();
    // `rlx-run qwen3 --model DIR ...` (a family name, not a model path, as first argument)
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(first) = argv.get(1).and_then(|a| a.to_str()) {
        let has_model = argv.iter().any(|a| {
            a.to_str()
                .is_some_and(|s| s == "--model" || s.starts_with("--model="))
        });
        if rlx_cli::generate::FAMILIES.contains(&first)
            && (has_model || !std::path::Path::new(first).exists())
        {
            let fam = first.to_string();
            let rest = std::iter::once(std::ffi::OsString::from(format!("rlx-run {fam}")))
                .chain(argv[2..].iter().cloned());
            let g = GenCli::parse_from(rest);
            std::process::exit(rlx_cli::generate::main_generate(g.args, Some(&fam)));
        }
    }
    let cli = Cli::parse();
    std::process::exit(rlx_cli::run::main_run(cli.args));
}
