//! Graph-building context shared by all op translators: value table, node helpers
//! (attributes, inputs that must be constants) and `add`, which infers the new node's type
//! and folds it to a constant when all its inputs are constants.

use crate::proto::{attr_type, AttributeProto, NodeProto};
use rlx_ir::infer_shape::infer_output;
use rlx_ir::{DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Result of a translator step; the message is wrapped with the node name by the driver.
pub type R<T> = Result<T, String>;

/// Fold a node whose inputs are all constants only while its output stays small or no
/// larger than its inputs: `ConstantOfShape` → huge weights stays a cheap `Broadcast`.
pub(crate) const FOLD_MAX_GROWTH: usize = 1 << 16;

/// Import state: the graph under construction and the ONNX value name → node map.
pub struct Ctx<'a> {
    pub g: Graph,
    pub values: HashMap<String, NodeId>,
    pub base_dir: Option<&'a Path>,
    /// Sequence values: placeholder node → element nodes (see `ops::seq`).
    pub seqs: HashMap<NodeId, Vec<NodeId>>,
    /// Optional values: placeholder node → element (`None`: empty; see `ops::seq`).
    pub opts: HashMap<NodeId, Option<NodeId>>,
    /// Values of nodes left unfolded because they hold NaN/Inf (see [`Ctx::add`]): still
    /// known at import time, so a translator that needs them (a Pad's fill) reads them.
    pub deferred: HashMap<NodeId, Arc<Tensor>>,
    /// The symbolic import's tracking (`None` for a plain import; see [`crate::sym`]).
    pub sym: Option<crate::sym::SymState>,
}

impl<'a> Ctx<'a> {
    /// Append `op` on `inputs`, typed by `infer_output`; folded into a `Constant` (same
    /// origin) when every input is a constant and the CPU evaluator supports the op.
    pub fn add(&mut self, op: Op, inputs: Vec<NodeId>) -> R<NodeId> {
        self.add_with(op, inputs, true)
    }

    /// [`Ctx::add`] without the import-time fold: the node stays an op even on constant
    /// inputs, for the compiler's fold to decide (`rlx_compile::const_fold` keeps a
    /// weight's `Transpose` that only MatMuls read, for the CPU, which reads it in place).
    pub fn add_unfolded(&mut self, op: Op, inputs: Vec<NodeId>) -> R<NodeId> {
        self.add_with(op, inputs, false)
    }

    fn add_with(&mut self, op: Op, inputs: Vec<NodeId>, fold_consts: bool) -> R<NodeId> {
        if self.sym.is_some() && inputs.iter().any(|&i| self.is_symbolic(i)) {
            return self.add_symbolic(op, inputs, None);
        }
        let shapes: Vec<&Shape> = inputs.iter().map(|&i| &self.g.node(i).shape).collect();
        let shape = infer_output(&op, &shapes).map_err(|e| e.0)?;
        let consts: Option<Vec<Arc<Tensor>>> = if fold_consts {
            inputs.iter().map(|&i| self.const_tensor(i)).collect()
        } else {
            None
        };
        if let Some(consts) = consts {
            let in_numel: usize = consts.iter().map(|t| t.numel()).sum();
            if !inputs.is_empty() && shape.numel() <= in_numel.max(FOLD_MAX_GROWTH) {
                let refs: Vec<&Tensor> = consts.iter().map(|t| t.as_ref()).collect();
                if let Some(t) = fold(&op, &refs, &shape)? {
                    // A float value that folds to NaN/Inf stays an op on its constant inputs,
                    // so the numeric lint (which runs before rlx-compile folds it) sees the
                    // chain and names the op that created the value (`Log` of a zero prior),
                    // not the last op of the chain (a `ReduceSum` that only carried it).
                    let finite = !t.dtype().is_float()
                        || rlx_ir::numeric_check::scan_data(t.data()).is_clean();
                    if finite {
                        return Ok(self.g.constant(t));
                    }
                    let id = self.g.add_node(op, inputs, shape);
                    self.deferred.insert(id, Arc::new(t));
                    return Ok(id);
                }
            }
        }
        Ok(self.g.add_node(op, inputs, shape))
    }

    /// A literal tensor node.
    pub fn constant(&mut self, t: Tensor) -> NodeId {
        self.g.constant(t)
    }

    /// A scalar constant of `dtype` holding `v`.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> NodeId {
        self.g.constant(Tensor::scalar(dtype, v))
    }

    /// An i64 vector constant.
    pub fn i64s(&mut self, v: &[i64]) -> NodeId {
        let t = Tensor::from_i64(&[v.len()], v.to_vec()).expect("len matches");
        self.g.constant(t)
    }

    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.g.node(id).shape
    }

    /// Static dims of a node (graph nodes always have static dims after import). In a
    /// symbolic import these are the probe sizes: reading a symbolic node's dims as numbers
    /// taints the import (a translator that handles symbols uses [`Ctx::sdims`]).
    pub fn dims(&self, id: NodeId) -> Vec<usize> {
        if let Some(s) = &self.sym {
            if s.shapes.contains_key(&id) {
                s.taint(|| {
                    format!(
                        "{} reads the sizes of a symbolic value as numbers",
                        self.here()
                    )
                });
            }
        }
        self.g.node(id).shape.dims_usize().to_vec()
    }

    /// The probe dims of a node without tainting a symbolic import: for a translator that
    /// reads only the rank or dims it checks are constant (it taints the import itself, with
    /// [`Ctx::sym_taint`], before it reads a symbolic one as a number).
    pub fn dims_unchecked(&self, id: NodeId) -> Vec<usize> {
        self.g.node(id).shape.dims_usize().to_vec()
    }

    /// Taint a symbolic import (no-op otherwise): the reason names the node being lowered.
    pub fn sym_taint(&self, why: &str) {
        if let Some(s) = &self.sym {
            s.taint(|| format!("{}: {why}", self.here()));
        }
    }

    /// True when axis `axis` of the node's dims holds a symbol.
    pub fn dim_is_symbolic(&self, id: NodeId, axis: usize) -> bool {
        self.sym
            .as_ref()
            .and_then(|s| s.shapes.get(&id))
            .and_then(|d| d.get(axis))
            .is_some_and(|e| !e.is_const())
    }

    /// The ONNX node being lowered (for taint reasons).
    fn here(&self) -> String {
        match self.g.current_origin() {
            Some(o) => format!("{} \"{}\"", o.op_type.as_deref().unwrap_or("node"), o.label),
            None => "the importer".into(),
        }
    }

    pub fn rank(&self, id: NodeId) -> usize {
        self.g.node(id).shape.rank()
    }

    pub fn dtype(&self, id: NodeId) -> DType {
        self.g.node(id).shape.dtype
    }

    /// The node's value when it is known at import time (a `Constant`, or a constant
    /// expression left unfolded because it holds NaN/Inf).
    pub fn const_tensor(&self, id: NodeId) -> Option<Arc<Tensor>> {
        if let Some(s) = &self.sym {
            if s.consts.contains_key(&id) {
                s.taint(|| {
                    format!(
                        "{} reads a value computed from symbolic sizes as numbers",
                        self.here()
                    )
                });
            }
        }
        match &self.g.node(id).op {
            Op::Constant(t) => Some(t.clone()),
            _ => self.deferred.get(&id).cloned(),
        }
    }

    /// The node's value as i64s; errors (naming `what`) when it is not known at import time.
    pub fn const_i64s(&self, id: NodeId, what: &str) -> R<Vec<i64>> {
        let t = self.const_tensor(id).ok_or_else(|| {
            format!("{what} must be known at import time, but it depends on runtime data")
        })?;
        if !(t.dtype().is_int() || t.dtype() == DType::Bool) {
            return Err(format!(
                "{what} must be an integer tensor, got {}",
                t.dtype()
            ));
        }
        Ok(t.data().to_i64_vec())
    }

    /// The node's value as f64s; errors when it is not known at import time.
    pub fn const_f64s(&self, id: NodeId, what: &str) -> R<Vec<f64>> {
        let t = self.const_tensor(id).ok_or_else(|| {
            format!("{what} must be known at import time, but it depends on runtime data")
        })?;
        Ok(t.data().to_f64_vec())
    }

    // ---- small builders used by many translators ----

    pub fn unary(&mut self, u: rlx_ir::UnaryOp, x: NodeId) -> R<NodeId> {
        self.add(Op::Unary(u), vec![x])
    }

    pub fn binary(&mut self, b: rlx_ir::BinaryOp, x: NodeId, y: NodeId) -> R<NodeId> {
        self.add(Op::Binary(b), vec![x, y])
    }

    pub fn reshape(&mut self, x: NodeId, dims: Vec<usize>) -> R<NodeId> {
        if self.dims(x) == dims {
            return Ok(x);
        }
        self.add(Op::Reshape { dims }, vec![x])
    }

    pub fn cast(&mut self, x: NodeId, to: DType) -> R<NodeId> {
        self.cast_sat(x, to, true)
    }

    /// A Cast with ONNX's `saturate` attribute (it matters for float8 targets only).
    pub fn cast_sat(&mut self, x: NodeId, to: DType, saturate: bool) -> R<NodeId> {
        if self.dtype(x) == to {
            return Ok(x);
        }
        self.add(Op::Cast { to, saturate }, vec![x])
    }
}

/// Evaluate `op` on constant inputs. Reshape and Cast are folded here (pure data moves);
/// everything else goes to `rlx_kernels::eval_op`, and an op it does not support stays a node.
pub(crate) fn fold(op: &Op, ins: &[&Tensor], out: &Shape) -> R<Option<Tensor>> {
    match op {
        Op::Reshape { dims } => {
            return Ok(Some(
                ins[0]
                    .clone()
                    .reshaped(dims.clone())
                    .map_err(|e| e.to_string())?,
            ))
        }
        Op::Cast { to, saturate } => {
            let d: TensorData = ins[0].data().cast_sat(*to, *saturate);
            return Ok(Some(
                Tensor::new(ins[0].dims().to_vec(), d).map_err(|e| e.to_string())?,
            ));
        }
        _ => {}
    }
    match rlx_kernels::eval_op(op, ins, out) {
        Ok(t) => {
            if t.shape() != *out {
                return Err(format!(
                    "constant folding gave {} but the node's type is {out}",
                    t.shape()
                ));
            }
            Ok(Some(t))
        }
        Err(rlx_kernels::KernelError::Unsupported(_)) => Ok(None),
        Err(rlx_kernels::KernelError::Invalid(m)) => Err(format!("constant folding failed: {m}")),
    }
}

/// Normalize a possibly negative `axis` against `rank` (ONNX: `axis in [-rank, rank)`).
pub fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// Normalize, sort and dedupe-check a list of axes.
pub fn norm_axes(axes: &[i64], rank: usize) -> R<Vec<usize>> {
    let mut v = axes
        .iter()
        .map(|&a| norm_axis(a, rank))
        .collect::<R<Vec<_>>>()?;
    v.sort_unstable();
    if v.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    Ok(v)
}

/// Convert i64 values that must be non-negative (dims, repeats, pads) to usize.
pub fn to_usizes(v: &[i64], what: &str) -> R<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| format!("{what} {v:?} has a negative entry")))
        .collect()
}

/// One ONNX node being lowered: inputs resolved to graph nodes, attribute access.
pub struct ONode<'n> {
    pub proto: &'n NodeProto,
    /// Resolved inputs; `None` for an omitted optional input (empty name).
    pub inputs: Vec<Option<NodeId>>,
    /// Default-domain opset version.
    pub opset: i64,
}

impl<'n> ONode<'n> {
    /// Input `i`, or `None` when absent/omitted.
    pub fn opt(&self, i: usize) -> Option<NodeId> {
        self.inputs.get(i).copied().flatten()
    }

    /// Input `i`, required.
    pub fn inp(&self, i: usize) -> R<NodeId> {
        self.opt(i)
            .ok_or_else(|| format!("required input {i} is missing"))
    }

    /// Number of inputs listed (including omitted optional ones).
    pub fn n_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Whether output `i` is requested (listed with a non-empty name).
    pub fn wants_output(&self, i: usize) -> bool {
        self.proto.output.get(i).is_some_and(|s| !s.is_empty())
    }

    pub fn attr(&self, name: &str) -> Option<&'n AttributeProto> {
        self.proto.attribute.iter().find(|a| a.name == name)
    }

    fn typed(&self, name: &str, ty: i32) -> R<Option<&'n AttributeProto>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == ty || a.r#type == 0 => Ok(Some(a)),
            Some(a) => Err(format!(
                "attribute {name} has type {} but {ty} was expected",
                a.r#type
            )),
        }
    }

    pub fn i(&self, name: &str, default: i64) -> R<i64> {
        Ok(self.typed(name, attr_type::INT)?.map_or(default, |a| a.i))
    }

    pub fn f(&self, name: &str, default: f32) -> R<f32> {
        Ok(self.typed(name, attr_type::FLOAT)?.map_or(default, |a| a.f))
    }

    pub fn s(&self, name: &str, default: &str) -> R<String> {
        Ok(self
            .typed(name, attr_type::STRING)?
            .map_or(default.to_string(), |a| {
                String::from_utf8_lossy(&a.s).into_owned()
            }))
    }

    pub fn ints(&self, name: &str) -> R<Option<Vec<i64>>> {
        Ok(self.typed(name, attr_type::INTS)?.map(|a| a.ints.clone()))
    }

    /// A per-spatial-axis attribute (`strides`, `dilations`, `output_padding`): exactly `ns`
    /// non-negative entries, or `default` on every axis when absent.
    pub fn spatial_ints(&self, name: &str, ns: usize, default: usize) -> R<Vec<usize>> {
        match self.ints(name)? {
            Some(v) => {
                let v = to_usizes(&v, name)?;
                if v.len() != ns {
                    return Err(format!("{name} {v:?} needs {ns} entries"));
                }
                Ok(v)
            }
            None => Ok(vec![default; ns]),
        }
    }
}
