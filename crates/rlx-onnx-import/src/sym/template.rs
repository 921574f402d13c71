//! The template a symbolic import makes ([`SymbolicGraph`]): binding its symbols, checking
//! its guards, and specializing it (or its compiled form) to one size signature (split from
//! sym.rs, which tracks the symbols during the import).

use super::*;

/// A graph imported once with symbolic dims: the graph at the probe sizes plus what to
/// re-evaluate for another binding ([`SymbolicGraph::specialize`]).
#[derive(Debug, Clone)]
pub struct SymbolicGraph {
    /// The graph at the probe sizes.
    pub graph: Graph,
    /// Each graph input's dims (symbols where the model declares named dims).
    pub inputs: Vec<(String, Vec<DimExpr>)>,
    /// The probe binding.
    pub probe: Bindings,
    /// Decisions the import took; the graph is valid where all hold.
    pub guards: Vec<Guard>,
    shapes: Vec<(NodeId, Vec<DimExpr>)>,
    consts: Vec<(NodeId, SymConst)>,
    attrs: Vec<(NodeId, SymAttr)>,
}

/// Fold what the importer would have folded at these sizes: every node whose inputs are
/// all known (constants, or values left unfolded because they hold NaN/Inf), by the
/// importer's own rules ([`crate::ctx::Ctx::add`]: the same kernels, the same growth limit,
/// a non-finite float result kept as an op with its value known, a Gemm's operand Transpose
/// left as [`crate::ops::math::gemm_keeps_transpose`] says), then drop dead nodes. In
/// a template these are the nodes computed from symbolic values (masks from `Range`s), so
/// the specialized graph is the one a per-signature import builds, node for node.
fn fold_like_import(mut g: Graph) -> Graph {
    let mut known: Vec<Option<std::sync::Arc<Tensor>>> = vec![None; g.len()];
    let mut changed = false;
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        match &n.op {
            Op::Constant(t) => {
                known[i] = Some(t.clone());
                continue;
            }
            Op::Input { .. } | Op::Param { .. } => continue,
            _ => {}
        }
        if n.inputs.is_empty()
            || !n.inputs.iter().all(|x| known[x.index()].is_some())
            || crate::ops::math::gemm_keeps_transpose(n)
        {
            continue;
        }
        let ins: Vec<&Tensor> = n
            .inputs
            .iter()
            .map(|x| known[x.index()].as_deref().expect("checked"))
            .collect();
        let in_numel: usize = ins.iter().map(|t| t.numel()).sum();
        if n.shape.numel() > in_numel.max(crate::ctx::FOLD_MAX_GROWTH) {
            continue;
        }
        let Ok(Some(t)) = crate::ctx::fold(&n.op, &ins, &n.shape) else {
            continue;
        };
        let finite = !t.dtype().is_float() || rlx_ir::numeric_check::scan_data(t.data()).is_clean();
        let t = std::sync::Arc::new(t);
        known[i] = Some(t.clone());
        if finite {
            let n = &mut g.nodes[i];
            n.op = Op::Constant(t);
            n.inputs.clear();
            changed = true;
        }
    }
    if changed {
        crate::prune(g).0
    } else {
        g
    }
}

fn size_of(e: &DimExpr, b: &Bindings) -> Result<usize, SpecializeError> {
    e.eval(b)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| SpecializeError::Size(format!("size {e} is negative or overflows")))
}

fn sizes_of(d: &[DimExpr], b: &Bindings) -> Result<Vec<usize>, SpecializeError> {
    d.iter().map(|e| size_of(e, b)).collect()
}

/// Set `op`'s size attribute to `a` under `b`.
fn patch_attr(op: &mut Op, a: &SymAttr, b: &Bindings) -> Result<(), SpecializeError> {
    match (op, a) {
        (Op::Reshape { dims }, SymAttr::Reshape(d))
        | (Op::Broadcast { dims }, SymAttr::Broadcast(d)) => *dims = sizes_of(d, b)?,
        (
            Op::Slice {
                starts: s,
                sizes: z,
                ..
            },
            SymAttr::Slice { starts, sizes },
        ) => {
            *s = sizes_of(starts, b)?;
            *z = sizes_of(sizes, b)?;
        }
        (op, _) => {
            return Err(SpecializeError::Size(format!(
                "internal: a size attribute recorded for {}",
                op.name()
            )))
        }
    }
    Ok(())
}

/// The value of `c` under `b`.
fn const_value(c: &SymConst, b: &Bindings) -> Result<Tensor, SpecializeError> {
    match c {
        SymConst::Elems { dims, dtype, exprs } => {
            let v = exprs
                .iter()
                .map(|e| {
                    e.eval(b)
                        .ok_or_else(|| SpecializeError::Size(format!("{e} overflows")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::new(dims.clone(), TensorData::from_i64(*dtype, &v))
        }
        SymConst::Range {
            start,
            delta,
            len,
            dtype,
        } => {
            let s = start
                .eval(b)
                .ok_or_else(|| SpecializeError::Size(format!("{start} overflows")))?;
            let n = size_of(len, b)?;
            let v: Vec<i64> = (0..n as i64).map(|i| s + i * delta).collect();
            Tensor::new(vec![n], TensorData::from_i64(*dtype, &v))
        }
    }
    .map_err(|e| SpecializeError::Size(e.to_string()))
}

/// Why a binding cannot use a template.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecializeError {
    /// The input shapes do not fit the template's inputs (rank, a static dim, two inputs
    /// sharing a symbol with different sizes).
    Inputs(String),
    /// A guard fails: the model takes another path at these sizes (import it there).
    Guard(String),
    /// A size evaluates to a negative number or overflows.
    Size(String),
}

impl std::fmt::Display for SpecializeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecializeError::Inputs(m) | SpecializeError::Size(m) => f.write_str(m),
            SpecializeError::Guard(g) => write!(f, "guard {g} does not hold"),
        }
    }
}

impl SymbolicGraph {
    pub(crate) fn new(graph: Graph, state: SymState, remap: &[Option<NodeId>]) -> SymbolicGraph {
        let live = |id: &NodeId| remap.get(id.index()).copied().flatten();
        let mut shapes: Vec<_> = state
            .shapes
            .into_iter()
            .filter_map(|(k, v)| Some((live(&k)?, v)))
            .collect();
        let mut consts: Vec<_> = state
            .consts
            .into_iter()
            .filter_map(|(k, v)| Some((live(&k)?, v)))
            .collect();
        let mut attrs: Vec<_> = state
            .attrs
            .into_iter()
            .filter_map(|(k, v)| Some((live(&k)?, v)))
            .collect();
        shapes.sort_by_key(|x| x.0);
        consts.sort_by_key(|x| x.0);
        attrs.sort_by_key(|x| x.0);
        let inputs = graph
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Input { name } => Some((
                    name.clone(),
                    shapes
                        .iter()
                        .find(|(k, _)| *k == n.id)
                        .map(|(_, d)| d.clone())
                        .unwrap_or_else(|| self::consts(&n.shape.dims_usize())),
                )),
                _ => None,
            })
            .collect();
        SymbolicGraph {
            graph,
            inputs,
            probe: state.probe,
            guards: state.guards,
            shapes,
            consts,
            attrs,
        }
    }

    /// The symbols the inputs bind, from their shapes.
    pub fn bind(
        &self,
        input_shapes: &HashMap<String, Vec<usize>>,
    ) -> Result<Bindings, SpecializeError> {
        let mut b = Bindings::new();
        for (name, dims) in &self.inputs {
            let given = input_shapes.get(name).ok_or_else(|| {
                SpecializeError::Inputs(format!("no shape given for input \"{name}\""))
            })?;
            if given.len() != dims.len() {
                return Err(SpecializeError::Inputs(format!(
                    "input \"{name}\": rank {} given, the model's is {}",
                    given.len(),
                    dims.len()
                )));
            }
            for (k, (e, &n)) in dims.iter().zip(given).enumerate() {
                let n = n as i64;
                match (e.as_const(), e.as_sym()) {
                    (Some(c), _) if c == n => {}
                    (Some(c), _) => {
                        return Err(SpecializeError::Inputs(format!(
                            "input \"{name}\" dim {k} is {c} in this template, {n} given"
                        )))
                    }
                    (None, Some(s)) => {
                        if let Some(&prev) = b.get(s) {
                            if prev != n {
                                return Err(SpecializeError::Inputs(format!(
                                    "input \"{name}\" dim {k} ({s}) is {n}, but {s} = {prev} elsewhere"
                                )));
                            }
                        }
                        b.insert(s.to_string(), n);
                    }
                    (None, None) => {
                        return Err(SpecializeError::Inputs(format!(
                            "input \"{name}\" dim {k} is the expression {e}"
                        )))
                    }
                }
            }
        }
        Ok(b)
    }

    /// The graph at the sizes `input_shapes` gives (every graph input's shape): the probe
    /// graph with every symbolic shape, attribute and constant re-evaluated.
    ///
    /// Errors: the shapes do not fit the inputs, a guard fails (the model would be
    /// imported differently at these sizes), or a size is negative.
    pub fn specialize(
        &self,
        input_shapes: &HashMap<String, Vec<usize>>,
    ) -> Result<Graph, SpecializeError> {
        let b = self.bind(input_shapes)?;
        self.check_guards(&b)?;
        let mut g = self.graph.clone();
        for (id, d) in &self.shapes {
            let s = sizes_of(d, &b)?;
            let n = g.node_mut(*id);
            n.shape = Shape::new(&s, n.shape.dtype);
        }
        for (id, a) in &self.attrs {
            patch_attr(&mut g.node_mut(*id).op, a, &b)?;
        }
        for (id, c) in &self.consts {
            g.node_mut(*id).op = Op::Constant(std::sync::Arc::new(const_value(c, &b)?));
        }
        Ok(fold_like_import(g))
    }

    /// One tag per node of [`SymbolicGraph::graph`] for `rlx_compile::compiler::
    /// compile_tagged`: non-zero on the nodes [`SymbolicGraph::patch_compiled`] patches (the
    /// inputs with symbolic dims, the symbolic attributes and values), so the compile holds
    /// them and what depends on them unfolded.
    pub fn tags(&self) -> Vec<u32> {
        let mut t = vec![0; self.graph.len()];
        for (k, id) in self.patch_nodes().into_iter().enumerate() {
            t[id.index()] = k as u32 + 1;
        }
        t
    }

    /// Whether compiling this graph once with [`SymbolicGraph::tags`] and patching it
    /// (`patch_compiled`) gives what compiling each specialization gives. Not when a
    /// high-level op (Softmax, LayerNorm, ...) computes a value from constants and symbolic
    /// values only: the per-signature compile folds it with its own kernel before
    /// decomposition, the held compile after, primitive by primitive (other roundings).
    pub fn compiles_once(&self) -> bool {
        let tags = self.tags();
        let mut const_only = vec![false; self.graph.len()];
        let mut held = vec![false; self.graph.len()];
        for n in &self.graph.nodes {
            let i = n.id.index();
            held[i] = tags[i] != 0 || n.inputs.iter().any(|x| held[x.index()]);
            const_only[i] = match n.op {
                Op::Constant(_) => true,
                Op::Input { .. } | Op::Param { .. } => false,
                _ => n.inputs.iter().all(|x| const_only[x.index()]),
            };
            if held[i] && const_only[i] && n.op.is_high_level() {
                return false;
            }
        }
        true
    }

    /// The patched nodes in tag order: symbolic inputs, then attributes, then values.
    fn patch_nodes(&self) -> Vec<NodeId> {
        let inputs = self.graph.nodes.iter().filter(|n| {
            matches!(n.op, Op::Input { .. }) && self.shapes.iter().any(|(k, _)| *k == n.id)
        });
        inputs
            .map(|n| n.id)
            .chain(self.attrs.iter().map(|(k, _)| *k))
            .chain(self.consts.iter().map(|(k, _)| *k))
            .collect()
    }

    /// Specialize a graph compiled from [`SymbolicGraph::graph`] with
    /// [`SymbolicGraph::tags`] (`tags`: what the compile returned, one per node of `g`) to
    /// the sizes `input_shapes` gives: the tagged inputs, attributes and values are set for
    /// these sizes, every node's type is inferred again from its inputs, and what the
    /// importer would fold is folded (ids change). The compiler's own folding of the held
    /// nodes is left to `rlx_compile::compiler::finish_held`.
    ///
    /// Errors: as [`SymbolicGraph::specialize`]; a node whose type no longer infers.
    pub fn patch_compiled(
        &self,
        g: &mut Graph,
        tags: &[u32],
        input_shapes: &HashMap<String, Vec<usize>>,
    ) -> Result<(), SpecializeError> {
        let b = self.bind(input_shapes)?;
        self.check_guards(&b)?;
        let nodes = self.patch_nodes();
        for (i, &t) in tags.iter().enumerate() {
            if t == 0 {
                continue;
            }
            let src = *nodes
                .get(t as usize - 1)
                .ok_or_else(|| SpecializeError::Size(format!("tag {t} out of range")))?;
            let n = g.node_mut(NodeId(i as u32));
            if let Op::Input { name } = &n.op {
                let d = input_shapes.get(name).ok_or_else(|| {
                    SpecializeError::Inputs(format!("no shape given for input \"{name}\""))
                })?;
                n.shape = Shape::new(d, n.shape.dtype);
            } else if let Some((_, a)) = self.attrs.iter().find(|(k, _)| *k == src) {
                patch_attr(&mut n.op, a, &b)?;
            } else if let Some((_, c)) = self.consts.iter().find(|(k, _)| *k == src) {
                n.op = Op::Constant(std::sync::Arc::new(const_value(c, &b)?));
            }
        }
        for i in 0..g.nodes.len() {
            let n = &g.nodes[i];
            let shape = match &n.op {
                Op::Input { .. } | Op::Param { .. } => continue,
                Op::Constant(t) => t.shape(),
                op => {
                    let ins: Vec<&Shape> =
                        n.inputs.iter().map(|x| &g.nodes[x.index()].shape).collect();
                    rlx_ir::infer_shape::infer_output(op, &ins).map_err(|e| {
                        SpecializeError::Size(format!("{} {}: {}", n.id, op.name(), e.0))
                    })?
                }
            };
            g.nodes[i].shape = shape;
        }
        let folded = fold_like_import(std::mem::take(g));
        *g = folded;
        Ok(())
    }

    fn check_guards(&self, b: &Bindings) -> Result<(), SpecializeError> {
        for g in &self.guards {
            if g.holds(b) != Some(true) {
                return Err(SpecializeError::Guard(g.to_string()));
            }
        }
        Ok(())
    }

    /// How many nodes carry symbolic dims, attributes and values (for reports).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.shapes.len(), self.attrs.len(), self.consts.len())
    }
}
