//! The pass pipeline: verify → numeric lint → constant folding → decomposition → folding.

use crate::numeric_lint::{lint_enabled_from_env, numeric_lint, NumericLint};
use crate::{const_fold::const_fold_owned, decompose::decompose};
use rlx_ir::Graph;

/// Which passes run.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// Rewrite high-level ops into primitives (default true).
    pub decompose: bool,
    /// Fold constant subgraphs (default true).
    pub fold: bool,
    /// Run the numeric lint (default: when `RLX_LINT_NUMERICS` is set).
    pub lint: bool,
    /// Print lints to stderr as they are found (default true).
    pub print_lints: bool,
    /// Keep a Transpose of a constant that only MatMuls read (default true: the CPU reads
    /// it in place, so folding would only add a transposed copy of a weight); false folds
    /// it (GPU backends, which would otherwise copy it every run). See
    /// [`crate::const_fold::const_fold`].
    pub keep_matmul_transposes: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            decompose: true,
            fold: true,
            lint: lint_enabled_from_env(),
            print_lints: true,
            keep_matmul_transposes: true,
        }
    }
}

/// A graph after the pipeline, ready for a backend.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub graph: Graph,
    /// Lints found (empty unless `CompileOptions::lint`).
    pub lints: Vec<NumericLint>,
}

/// Run the pipeline on `g`.
///
/// Errors: a [`crate::CompileError`] naming the first node that fails verification.
pub fn compile(g: Graph, opts: &CompileOptions) -> Result<Compiled, crate::CompileError> {
    crate::verify::verify(&g)?;
    let lints = if opts.lint { numeric_lint(&g) } else { vec![] };
    if opts.print_lints {
        for l in &lints {
            eprintln!("{l}");
        }
    }
    let fold = |g: Graph| const_fold_owned(g, opts.keep_matmul_transposes);
    let mut g = if opts.fold { fold(g) } else { g };
    if opts.decompose {
        g = decompose(&g);
        if opts.fold {
            g = fold(g);
        }
    }
    crate::verify::verify(&g)?;
    Ok(Compiled { graph: g, lints })
}
