//! The pass pipeline: verify → numeric lint → constant folding → decomposition → folding.

use crate::const_fold::{const_fold_owned, fold_held};
use crate::decompose::decompose_tagged;
use crate::numeric_lint::{lint_enabled_from_env, numeric_lint, NumericLint};
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
    compile_tagged(g, opts, &mut Vec::new())
}

/// [`compile`] with nodes tagged (one entry per node of `g`; 0 = untagged): a tagged node
/// and every node depending on one are never folded, and `tags` comes back with one entry
/// per node of the compiled graph, each tagged node's tag on the node that carries it on.
/// A symbolic template (`rlx_onnx_import::sym`) compiles once this way, holding what
/// depends on its symbols, and is then specialized per signature by patching the tagged
/// nodes, re-inferring shapes and folding what was held ([`finish_held`]).
pub fn compile_tagged(
    g: Graph,
    opts: &CompileOptions,
    tags: &mut Vec<u32>,
) -> Result<Compiled, crate::CompileError> {
    crate::verify::verify(&g)?;
    let lints = if opts.lint { numeric_lint(&g) } else { vec![] };
    if opts.print_lints {
        for l in &lints {
            eprintln!("{l}");
        }
    }
    let fold = |g: Graph, tags: &mut Vec<u32>| fold_held(g, opts.keep_matmul_transposes, tags);
    let mut g = if opts.fold { fold(g, tags) } else { g };
    if opts.decompose {
        g = decompose_tagged(&g, tags);
        if opts.fold {
            g = fold(g, tags);
        }
    }
    crate::verify::verify(&g)?;
    Ok(Compiled { graph: g, lints })
}

/// The end of [`compile_tagged`]'s pipeline for a graph whose held nodes have their final
/// sizes and values: folds them like [`compile`] would have (nothing is held any more).
pub fn finish_held(g: Graph, opts: &CompileOptions) -> Graph {
    if opts.fold {
        const_fold_owned(g, opts.keep_matmul_transposes)
    } else {
        g
    }
}
