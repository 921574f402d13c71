//! `RLX_LINT_NUMERICS`: prove, before anything runs, that a constant subgraph folds to
//! NaN/Inf.
//!
//! Only what is provably non-finite is reported (zero false positives): the value that a
//! constant subgraph hands to the rest of the graph (its frontier: a constant consumed by a
//! runtime node, or a graph output) holds NaN/±inf. The report names the op inside the
//! subgraph that created the value (a folded `1/0`, `log(0)`, `sqrt(-1)`, a literal NaN/Inf
//! constant, a float constant that overflows when cast to F16/BF16). A non-finite value that
//! the subgraph itself discards (T5's `log(0)` under a `Where`) is not reported.

use rlx_ir::numeric_check::{
    check_node, fix_hint, is_literal_constant, scan_data, BadKind, Cause, NodeState,
    NonFiniteCounts,
};
use rlx_ir::provenance::{node_iteration, node_label, source_op_type, with_iteration};
use rlx_ir::{Graph, NodeId, Op, Tensor};
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// The environment variable that prints lints when compiling.
pub const RLX_LINT_NUMERICS: &str = "RLX_LINT_NUMERICS";

/// Largest constant subgraph value the linter evaluates (elements).
const MAX_EVAL_ELEMENTS: usize = 1 << 24;

/// One provably non-finite constant, printed as
/// `rlx numeric-lint: %2 +inf "%2": constant subgraph folds to a non-finite value` + `fix: …`.
///
/// Named by the runtime localizer's rules: the op that *created* the value (its inputs were
/// finite: `log(0)`, `1/0`, a literal `-inf`), and, where an Inf turns into NaN later in the
/// chain, that op too (with `inf_origin` naming the Inf's creator). Ops that only carried a
/// value are not named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NumericLint {
    /// The op that created the non-finite value.
    pub node: NodeId,
    pub label: String,
    pub op: String,
    pub kind: BadKind,
    /// Flat index of the first bad element in that node's value.
    pub index: usize,
    pub counts: NonFiniteCounts,
    /// The frontier node whose value carries it into the runtime graph.
    pub reaches: NodeId,
    /// For a NaN made from an Inf: the op that created that Inf (`Log` for `0 × log(0)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inf_origin: Option<(NodeId, String)>,
    pub fix: Option<String>,
    /// The line of the user's code that created the op (`torch.export` programs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<rlx_ir::SourceLoc>,
    /// The loop iterations the op was unrolled in, outermost first (empty outside loops;
    /// printed after the label as the NaN report does).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub iteration: Vec<rlx_ir::LoopIteration>,
    /// The loop iterations of `inf_origin`'s op, when it has any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inf_origin_iteration: Vec<rlx_ir::LoopIteration>,
}

impl fmt::Display for NumericLint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rlx numeric-lint: {} {} {}: constant subgraph folds to a non-finite value",
            self.node,
            self.kind,
            with_iteration(&self.label, &self.iteration)
        )?;
        if let Some(loc) = &self.source {
            writeln!(f, "  at {loc}")?;
        }
        write!(
            f,
            "  op {}; {} (first at index {})",
            self.op, self.counts, self.index
        )?;
        if let Some((o, l)) = &self.inf_origin {
            write!(
                f,
                "; made from the infinity created at {o} {}",
                with_iteration(l, &self.inf_origin_iteration)
            )?;
        }
        if self.reaches != self.node {
            write!(f, "; reaches the graph through {}", self.reaches)?;
        }
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

/// True when `RLX_LINT_NUMERICS` is on (see [`rlx_ir::env::is_on`]).
pub fn lint_enabled_from_env() -> bool {
    rlx_ir::env::is_on(RLX_LINT_NUMERICS)
}

/// Evaluate every constant subgraph of `g` (with the CPU reference kernels) and report
/// each op that provably creates a NaN/Inf reaching the runtime part of the graph (and, for
/// a NaN made from an Inf, the op that created the Inf).
pub fn numeric_lint(g: &Graph) -> Vec<NumericLint> {
    let n = g.len();
    let mut values: Vec<Option<Arc<Tensor>>> = vec![None; n];
    let mut counts: Vec<NonFiniteCounts> = vec![NonFiniteCounts::default(); n];
    let mut states: Vec<NodeState> = vec![NodeState::default(); n];
    let mut causes: Vec<Option<Cause>> = vec![None; n];
    // blame[i]: the ops that created the non-finite values node i holds (culprits only).
    let mut blame: Vec<Vec<NodeId>> = vec![vec![]; n];
    for node in &g.nodes {
        let i = node.id.index();
        let v = match &node.op {
            Op::Constant(t) => Some(t.clone()),
            Op::Input { .. } | Op::Param { .. } => None,
            op => {
                if node.shape.numel() > MAX_EVAL_ELEMENTS
                    || node.inputs.iter().any(|x| values[x.index()].is_none())
                {
                    None
                } else {
                    let ins: Vec<&Tensor> = node
                        .inputs
                        .iter()
                        .map(|x| values[x.index()].as_deref().expect("checked above"))
                        .collect();
                    rlx_kernels::eval_op(op, &ins, &node.shape)
                        .ok()
                        .map(Arc::new)
                }
            }
        };
        if let Some(t) = &v {
            let c = scan_data(t.data());
            counts[i] = c;
            if !c.is_clean() {
                let cause = check_node(g, node.id, &c, &states);
                // Bad inputs' culprits, for what this node carried.
                let mut carried: Vec<NodeId> = vec![];
                for x in &node.inputs {
                    let s = states[x.index()];
                    if s.nan || s.inf {
                        for b in &blame[x.index()] {
                            if !carried.contains(b) {
                                carried.push(*b);
                            }
                        }
                    }
                }
                blame[i] = match &cause {
                    Cause::Propagated { .. } => carried,
                    Cause::InputsFinite | Cause::FillEntered { .. } | Cause::Leaf => vec![node.id],
                    Cause::InputsHeldInf { .. } | Cause::CreatedBesideInputNaN { .. } => {
                        carried.push(node.id);
                        carried
                    }
                };
                let inf_origin = if c.has_inf() {
                    if is_literal_constant(g, node.id) {
                        None
                    } else {
                        node.inputs
                            .iter()
                            .find_map(|x| {
                                let s = states[x.index()];
                                if s.inf {
                                    s.inf_origin.or(Some(*x))
                                } else {
                                    None
                                }
                            })
                            .or(Some(node.id))
                    }
                } else {
                    None
                };
                states[i] = NodeState {
                    scanned: true,
                    nan: c.has_nan(),
                    inf: c.has_inf(),
                    inf_kind: c.first_inf().map(|x| x.1),
                    inf_origin,
                    nan_count: c.nan,
                    len: c.len,
                };
                causes[i] = Some(cause);
            } else {
                states[i] = NodeState {
                    scanned: true,
                    len: c.len,
                    ..Default::default()
                };
            }
        }
        values[i] = v;
    }
    // Frontier: known values consumed by unknown nodes, or graph outputs.
    let mut frontier: Vec<NodeId> = vec![];
    for node in &g.nodes {
        if values[node.id.index()].is_some() {
            continue;
        }
        for x in &node.inputs {
            if values[x.index()].is_some() && !frontier.contains(x) {
                frontier.push(*x);
            }
        }
    }
    for o in &g.outputs {
        if values[o.index()].is_some() && !frontier.contains(o) {
            frontier.push(*o);
        }
    }
    frontier.sort();
    // The source op (origin label) of every runtime node that reads each frontier value;
    // `None` in the list for a graph output or a node without an origin.
    let origin_label = |id: NodeId| g.node(id).origin.as_ref().map(|o| o.label.as_str());
    let readers = |f: NodeId| -> Vec<Option<&str>> {
        let mut r: Vec<Option<&str>> = g
            .nodes
            .iter()
            .filter(|n| values[n.id.index()].is_none() && n.inputs.contains(&f))
            .map(|n| origin_label(n.id))
            .collect();
        if g.outputs.contains(&f) {
            r.push(None);
        }
        r
    };
    let mut out: Vec<NumericLint> = vec![];
    for f in frontier {
        let mut culprits = blame[f.index()].clone();
        culprits.sort();
        let f_readers = readers(f);
        for o in culprits {
            if out.iter().any(|l| l.node == o) {
                continue;
            }
            // A constant that an importer made while lowering one source op (the -inf bias
            // of ONNX `Attention`'s causal or boolean mask, which its function body defines
            // with -inf too) and that only that same op reads is the op's own definition,
            // not something the user wrote: what it computes at run time is the runtime
            // localizer's to judge.
            if matches!(g.node(o).op, Op::Constant(_))
                && !is_literal_constant(g, o)
                && origin_label(o).is_some()
                && !f_readers.is_empty()
                && f_readers.iter().all(|r| *r == origin_label(o))
            {
                continue;
            }
            let c = counts[o.index()];
            let node = g.node(o);
            let cause = causes[o.index()].clone().unwrap_or(Cause::Leaf);
            // A NaN maker is reported as NaN; an Inf creator by its Inf.
            let made_nan = matches!(
                cause,
                Cause::InputsHeldInf { .. } | Cause::CreatedBesideInputNaN { .. }
            ) || (c.has_nan() && !matches!(cause, Cause::Propagated { .. }));
            let first = if made_nan {
                c.first_nan.map(|i| (i, BadKind::NaN))
            } else {
                c.first()
            };
            let Some((index, kind)) = first else { continue };
            let op = if rlx_ir::numeric_check::is_bad_weight(g, o) {
                "Initializer".to_string()
            } else {
                node.op.name()
            };
            let src = source_op_type(g, o);
            let inf_origin = match &cause {
                Cause::InputsHeldInf {
                    inf_origin: Some(io),
                    ..
                } => Some((*io, node_label(g, *io))),
                _ => None,
            };
            let fix = fix_hint(&op, src, &cause, kind, node.shape.dtype).or_else(|| {
                Some(format!(
                    "a {kind} constant reaches the model's computation: if it is a mask fill, use a large finite value (torch.finfo(dtype).min) so a fully masked row cannot turn into NaN"
                ))
            });
            out.push(NumericLint {
                node: o,
                label: node_label(g, o),
                op: src.map(str::to_string).unwrap_or(op),
                kind,
                index,
                counts: c,
                reaches: f,
                fix,
                source: node.origin.as_ref().and_then(|x| x.source.clone()),
                iteration: node_iteration(g, o).to_vec(),
                inf_origin_iteration: inf_origin
                    .as_ref()
                    .map(|(io, _)| node_iteration(g, *io).to_vec())
                    .unwrap_or_default(),
                inf_origin,
            });
        }
    }
    out
}
