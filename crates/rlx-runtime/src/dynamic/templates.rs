//! A source's symbolic templates (issue 32 item 1): graphs imported once with symbolic dims,
//! specialized per size signature by substitution, and compiled once per compile options
//! (split from dynamic.rs, which plans and runs dynamic models).

use super::*;

/// Graphs imported once with symbolic dims ([`rlx_onnx_import::sym`]), each valid where its
/// guards hold; a signature none fits gets a new one (at most [`MAX_TEMPLATES`]).
#[derive(Default)]
pub(super) struct Templates {
    graphs: Vec<Arc<Template>>,
    /// Why the model cannot be imported symbolically (then every signature imports).
    refused: Option<String>,
}

/// A symbolic template and, per compile options, its graph compiled once
/// (`rlx_compile::compiler::compile_tagged`) with its tags; `None` where it cannot be
/// compiled once (`SymbolicGraph::compiles_once`) or the compile failed.
struct Template {
    sym: rlx_onnx_import::sym::SymbolicGraph,
    compiled: std::sync::Mutex<Vec<(CompileKey, Option<CompiledTemplate>)>>,
}

/// A template's graph compiled once, and its tags.
type CompiledTemplate = Arc<(rlx_compile::compiler::Compiled, Vec<u32>)>;

/// The compile options a compiled template depends on.
type CompileKey = (bool, bool, bool, bool);

fn compile_key(o: &CompileOptions) -> CompileKey {
    (o.decompose, o.fold, o.lint, o.keep_matmul_transposes)
}

impl Template {
    /// The template compiled once under `opts` (compiled on first use).
    fn compiled(&self, opts: &CompileOptions) -> Option<CompiledTemplate> {
        let key = compile_key(opts);
        let mut c = self.compiled.lock().ok()?;
        if let Some((_, v)) = c.iter().find(|(k, _)| *k == key) {
            return v.clone();
        }
        let v = if self.sym.compiles_once() {
            let mut tags = self.sym.tags();
            rlx_compile::compiler::compile_tagged(self.sym.graph.clone(), opts, &mut tags)
                .ok()
                .map(|c| Arc::new((c, tags)))
        } else {
            None
        };
        c.push((key, v.clone()));
        v
    }
}

/// Templates kept per source: a model whose guards split the sizes into a few regions
/// (a prompt of one token and of several) needs one per region.
const MAX_TEMPLATES: usize = 4;

/// How the last graph of an [`OnnxSource`] was made (for `rlx bench`'s plan line).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum SpecializedBy {
    /// A template imported with symbolic dims, substituted.
    Template,
    /// A new template imported at these sizes, then substituted.
    NewTemplate,
    /// The source imported at these sizes (the reason it was not a template).
    Import(String),
}

impl OnnxSource {
    /// A graph from a template that fits `input_shapes`, a new template, or `None` (the
    /// reason in the returned [`SpecializedBy::Import`]).
    pub(super) fn specialize_template(
        &self,
        input_shapes: &HashMap<String, Vec<usize>>,
    ) -> (Option<Graph>, SpecializedBy) {
        if rlx_ir::env::is_off("RLX_SYMBOLIC_IMPORT") {
            return (None, SpecializedBy::Import("RLX_SYMBOLIC_IMPORT=0".into()));
        }
        let Ok(mut t) = self.templates.lock() else {
            return (
                None,
                SpecializedBy::Import("template cache poisoned".into()),
            );
        };
        let mut last_err = String::new();
        for g in &t.graphs {
            match g.sym.specialize(input_shapes) {
                Ok(g) => return (Some(g), SpecializedBy::Template),
                Err(e) => last_err = e.to_string(),
            }
        }
        if let Some(why) = &t.refused {
            return (None, SpecializedBy::Import(why.clone()));
        }
        if t.graphs.len() >= MAX_TEMPLATES {
            return (
                None,
                SpecializedBy::Import(format!("no template fits ({last_err})")),
            );
        }
        let opts = rlx_onnx_import::ImportOptions {
            input_shapes: input_shapes.clone(),
            ..Default::default()
        };
        // A symbolic import must not take down a run the plain import would serve: a panic
        // in it (a bug) is reported on stderr by the panic hook and the model imports per
        // signature from then on.
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.model.import_symbolic(&opts)
        }));
        let attempt = match attempt {
            Ok(r) => r,
            Err(_) => {
                let why = "the symbolic import failed with an internal error".to_string();
                t.refused = Some(why.clone());
                return (None, SpecializedBy::Import(why));
            }
        };
        match attempt {
            Ok(tg) => match tg.specialize(input_shapes) {
                Ok(g) => {
                    t.graphs.push(Arc::new(Template {
                        sym: tg,
                        compiled: Default::default(),
                    }));
                    (Some(g), SpecializedBy::NewTemplate)
                }
                Err(e) => (None, SpecializedBy::Import(e.to_string())),
            },
            Err(e) => {
                let why = e.to_string();
                t.refused = Some(why.clone());
                (None, SpecializedBy::Import(why))
            }
        }
    }

    pub(super) fn set_last_by(&self, by: SpecializedBy) {
        let text = match by {
            SpecializedBy::Template => "symbolic template".to_string(),
            SpecializedBy::NewTemplate => "new symbolic template".to_string(),
            SpecializedBy::Import(why) => format!("import ({why})"),
        };
        if let Ok(mut b) = self.last_by.lock() {
            *b = Some(text);
        }
    }

    /// The compiled graph of `g` (a graph [`GraphSource::specialize`] made from a template)
    /// from that template compiled once, patched to `g`'s input sizes; `None` when no
    /// template fits or it cannot be compiled once (`RLX_SYMBOLIC_COMPILE=0`: never).
    pub(super) fn compile_from_template(
        &self,
        g: &Graph,
        opts: &CompileOptions,
    ) -> Option<Result<rlx_compile::compiler::Compiled, rlx_compile::CompileError>> {
        if rlx_ir::env::is_off("RLX_SYMBOLIC_IMPORT") || rlx_ir::env::is_off("RLX_SYMBOLIC_COMPILE")
        {
            return None;
        }
        let shapes: HashMap<String, Vec<usize>> = g
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                rlx_ir::Op::Input { name } => Some((name.clone(), n.shape.dims_usize().to_vec())),
                _ => None,
            })
            .collect();
        let graphs = self.templates.lock().ok()?.graphs.clone();
        for t in graphs {
            if t.sym.bind(&shapes).is_err() {
                continue;
            }
            let Some(c) = t.compiled(opts) else {
                continue;
            };
            let (compiled, tags) = &*c;
            let mut graph = compiled.graph.clone();
            if t.sym.patch_compiled(&mut graph, tags, &shapes).is_err() {
                continue;
            }
            let graph = rlx_compile::compiler::finish_held(graph, opts);
            return Some(Ok(rlx_compile::compiler::Compiled {
                graph,
                lints: compiled.lints.clone(),
            }));
        }
        None
    }

    /// How many symbolic templates the source holds, and why it has none when it cannot be
    /// imported symbolically.
    pub fn templates(&self) -> (usize, Option<String>) {
        match self.templates.lock() {
            Ok(t) => (t.graphs.len(), t.refused.clone()),
            Err(_) => (0, None),
        }
    }
}
