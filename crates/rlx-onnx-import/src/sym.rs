//! Symbolic import (issue 32, build item 1): import a model once with its named input dims
//! (`batch`, `seq`, `past`) kept as symbols, then make the graph of any size signature by
//! substitution instead of importing again.
//!
//! The importer runs as usual at a *probe* binding (the sizes of the first signature seen),
//! so every translator sees concrete sizes, and beside it tracks:
//! - the symbolic dims of every node whose shape involves a symbol ([`SymState::shapes`]);
//! - the symbolic values of the small integer tensors shape arithmetic computes
//!   (`Shape` → `Gather` → `Concat` → a Reshape's `shape`): one [`DimExpr`] per element
//!   ([`SymState::elems`]), and `Range` constants with symbolic bounds;
//! - the size attributes built from those values (a Reshape's dims, an Expand's, a Slice's
//!   starts and sizes: [`SymAttr`]);
//! - the guards: every decision taken on a symbolic value (a comparison, a broadcast of a
//!   symbolic dim against 1) is recorded as a [`Guard`] that holds at the probe.
//!
//! Values that depend on sizes but are not shape arithmetic (a causal mask from `Range`s)
//! are not folded: they stay ops on constants, folded by rlx-compile after specialization.
//! Anything the tracking does not cover (a translator that reads a symbolic dim as a
//! number, an op without a symbolic shape rule) *taints* the import: [`OnnxModel::
//! import_symbolic`](crate::OnnxModel::import_symbolic) then fails and the caller imports
//! per signature, as before. So the template is either exact or absent: specializing it at
//! a binding where its guards hold gives the graph the per-signature import gives (up to
//! folding that rlx-compile does), which the tests check by running both.

use crate::ctx::{Ctx, R};
use rlx_ir::sym::{Bindings, DimExpr, Guard};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op, Shape, Tensor, TensorData, UnaryOp};
use std::cell::RefCell;
use std::collections::HashMap;

/// A size attribute to re-evaluate at specialization.
#[derive(Debug, Clone, PartialEq)]
pub enum SymAttr {
    /// `Op::Reshape { dims }`.
    Reshape(Vec<DimExpr>),
    /// `Op::Broadcast { dims }`.
    Broadcast(Vec<DimExpr>),
    /// `Op::Slice { starts, sizes }` (steps are constants).
    Slice {
        starts: Vec<DimExpr>,
        sizes: Vec<DimExpr>,
    },
}

/// A constant whose value depends on the symbols.
#[derive(Debug, Clone, PartialEq)]
pub enum SymConst {
    /// An integer tensor of fixed shape, one expression per element (row-major).
    Elems {
        dims: Vec<usize>,
        dtype: DType,
        exprs: Vec<DimExpr>,
    },
    /// ONNX `Range(start, start + len*delta, delta)` of an integer dtype: `len` elements.
    Range {
        start: DimExpr,
        delta: i64,
        len: DimExpr,
        dtype: DType,
    },
}

/// The tracking state of a symbolic import (in [`Ctx::sym`]).
#[derive(Debug, Default)]
pub struct SymState {
    /// The probe binding: the sizes the graph is built at.
    pub probe: Bindings,
    /// Symbolic dims of nodes whose shape holds a symbol.
    pub shapes: HashMap<NodeId, Vec<DimExpr>>,
    /// Constants whose values depend on the symbols.
    pub consts: HashMap<NodeId, SymConst>,
    /// Size attributes of ops.
    pub attrs: HashMap<NodeId, SymAttr>,
    /// Decisions taken at the probe.
    pub guards: Vec<Guard>,
    /// Why the import cannot be symbolic (the first reason).
    pub tainted: RefCell<Option<String>>,
}

impl SymState {
    /// Record `why` as the reason the import is not symbolic (the first one is kept).
    pub fn taint(&self, why: impl FnOnce() -> String) {
        let mut t = self.tainted.borrow_mut();
        if t.is_none() {
            *t = Some(why());
        }
    }

    fn eval(&self, e: &DimExpr) -> R<i64> {
        e.eval(&self.probe)
            .ok_or_else(|| format!("size {e} cannot be evaluated at the probe sizes"))
    }

    /// Record `g` unless it holds for every binding; it must hold at the probe.
    pub fn guard(&mut self, g: Guard) {
        if g.is_trivial() || self.guards.contains(&g) {
            return;
        }
        if g.holds(&self.probe) != Some(true) {
            self.taint(|| format!("internal: guard {g} does not hold at the probe"));
            return;
        }
        self.guards.push(g);
    }

    /// `a == b` decided at the probe, the decision recorded.
    pub fn decide_eq(&mut self, a: &DimExpr, b: &DimExpr) -> R<bool> {
        if a == b {
            return Ok(true);
        }
        let eq = self.eval(a)? == self.eval(b)?;
        self.guard(if eq {
            Guard::Eq(a.clone(), b.clone())
        } else {
            Guard::Ne(a.clone(), b.clone())
        });
        Ok(eq)
    }

    /// `a < b` decided at the probe, the decision recorded.
    pub fn decide_lt(&mut self, a: &DimExpr, b: &DimExpr) -> R<bool> {
        let lt = self.eval(a)? < self.eval(b)?;
        self.guard(if lt {
            Guard::Lt(a.clone(), b.clone())
        } else {
            Guard::Ge(a.clone(), b.clone())
        });
        Ok(lt)
    }

    /// NumPy broadcasting of two symbolic shapes, deciding `d` vs `1` at the probe.
    pub fn broadcast(&mut self, a: &[DimExpr], b: &[DimExpr]) -> R<Vec<DimExpr>> {
        let r = a.len().max(b.len());
        let one = DimExpr::from(1);
        let mut out = Vec::with_capacity(r);
        for i in 0..r {
            let da = (i + a.len() >= r).then(|| &a[i + a.len() - r]);
            let db = (i + b.len() >= r).then(|| &b[i + b.len() - r]);
            out.push(match (da, db) {
                (Some(x), None) | (None, Some(x)) => x.clone(),
                (Some(x), Some(y)) if x == y => x.clone(),
                // A constant 1 broadcasts to the other dim whatever its size.
                (Some(x), Some(y)) if *y == one => x.clone(),
                (Some(x), Some(y)) if *x == one => y.clone(),
                (Some(x), Some(y)) => {
                    if self.decide_eq(y, &one)? {
                        x.clone()
                    } else if self.decide_eq(x, &one)? {
                        y.clone()
                    } else if self.decide_eq(x, y)? {
                        if x.is_const() {
                            x.clone()
                        } else {
                            y.clone()
                        }
                    } else {
                        return Err(format!(
                            "dims {x} and {y} do not broadcast (at the probe sizes)"
                        ));
                    }
                }
                (None, None) => unreachable!("i < max rank"),
            });
        }
        Ok(out)
    }
}

/// Symbolic dims of a static shape.
pub fn consts(d: &[usize]) -> Vec<DimExpr> {
    d.iter().map(|&v| DimExpr::from(v as i64)).collect()
}

fn product(d: &[DimExpr]) -> R<DimExpr> {
    d.iter().try_fold(DimExpr::from(1), |a, x| {
        a.mul(x).ok_or_else(|| "size product overflows".to_string())
    })
}

impl Ctx<'_> {
    /// True when the node's shape or value depends on the symbols.
    pub fn is_symbolic(&self, id: NodeId) -> bool {
        self.sym
            .as_ref()
            .is_some_and(|s| s.shapes.contains_key(&id) || s.consts.contains_key(&id))
    }

    /// The node's dims as expressions (constants when its shape is static).
    pub fn sdims(&self, id: NodeId) -> Vec<DimExpr> {
        match self.sym.as_ref().and_then(|s| s.shapes.get(&id)) {
            Some(d) => d.clone(),
            None => consts(&self.g.node(id).shape.dims_usize()),
        }
    }

    /// The node's value as size expressions when it is known at import time: a constant
    /// integer tensor, or shape arithmetic on the symbols. `what` names it in errors.
    pub fn const_dims(&self, id: NodeId, what: &str) -> R<Vec<DimExpr>> {
        if let Some(SymConst::Elems { exprs, .. }) =
            self.sym.as_ref().and_then(|s| s.consts.get(&id))
        {
            return Ok(exprs.clone());
        }
        Ok(self
            .const_i64s(id, what)?
            .into_iter()
            .map(DimExpr::from)
            .collect())
    }

    /// Record a size attribute for `id` when the import is symbolic and it holds a symbol.
    fn set_attr(&mut self, id: NodeId, attr: SymAttr) {
        if let Some(s) = &mut self.sym {
            let symbolic = match &attr {
                SymAttr::Reshape(d) | SymAttr::Broadcast(d) => d.iter().any(|e| !e.is_const()),
                SymAttr::Slice { starts, sizes } => {
                    starts.iter().chain(sizes).any(|e| !e.is_const())
                }
            };
            if symbolic {
                s.attrs.insert(id, attr);
            }
        }
    }

    /// Evaluate size expressions at the probe as usizes.
    pub fn probe_sizes(&self, d: &[DimExpr], what: &str) -> R<Vec<usize>> {
        let probe = self.sym.as_ref().map(|s| &s.probe);
        d.iter()
            .map(|e| {
                let v = match (e.as_const(), probe) {
                    (Some(c), _) => c,
                    (None, Some(p)) => e.eval(p).ok_or_else(|| format!("{what}: {e} overflows"))?,
                    (None, None) => return Err(format!("{what}: {e} is symbolic")),
                };
                usize::try_from(v).map_err(|_| format!("{what} has a negative entry ({e} = {v})"))
            })
            .collect()
    }

    /// A Reshape to symbolic dims (an alias when they equal the input's).
    pub fn reshape_sym(&mut self, x: NodeId, dims: Vec<DimExpr>) -> R<NodeId> {
        if self.sdims(x) == dims {
            return Ok(x);
        }
        let d = self.probe_sizes(&dims, "reshape dims")?;
        self.add_attr(Op::Reshape { dims: d }, vec![x], SymAttr::Reshape(dims))
    }

    /// A Broadcast to symbolic dims.
    pub fn broadcast_sym(&mut self, x: NodeId, dims: Vec<DimExpr>) -> R<NodeId> {
        let d = self.probe_sizes(&dims, "broadcast dims")?;
        self.add_attr(Op::Broadcast { dims: d }, vec![x], SymAttr::Broadcast(dims))
    }

    /// A Slice with symbolic starts and sizes.
    pub fn slice_sym(
        &mut self,
        x: NodeId,
        starts: Vec<DimExpr>,
        steps: Vec<i64>,
        sizes: Vec<DimExpr>,
    ) -> R<NodeId> {
        let st = self.probe_sizes(&starts, "slice starts")?;
        let sz = self.probe_sizes(&sizes, "slice sizes")?;
        self.add_attr(
            Op::Slice {
                starts: st,
                steps,
                sizes: sz,
            },
            vec![x],
            SymAttr::Slice { starts, sizes },
        )
    }

    /// `add` with the symbolic form of a size attribute the op carries at its probe value.
    pub fn add_attr(&mut self, op: Op, inputs: Vec<NodeId>, attr: SymAttr) -> R<NodeId> {
        if self.sym.is_none() {
            return self.add(op, inputs);
        }
        self.add_symbolic(op, inputs, Some(attr))
    }

    /// A constant integer tensor of `dtype` whose elements are `exprs` (a plain constant
    /// when they hold no symbol).
    pub fn const_exprs(
        &mut self,
        dims: Vec<usize>,
        dtype: DType,
        exprs: Vec<DimExpr>,
    ) -> R<NodeId> {
        let vals: Vec<i64> = exprs
            .iter()
            .map(|e| match e.as_const() {
                Some(c) => Ok(c),
                None => self
                    .sym
                    .as_ref()
                    .ok_or_else(|| format!("{e} is symbolic"))?
                    .eval(e),
            })
            .collect::<R<_>>()?;
        let t = Tensor::new(dims.clone(), TensorData::from_i64(dtype, &vals))
            .map_err(|e| e.to_string())?;
        let id = self.g.constant(t);
        if exprs.iter().any(|e| !e.is_const()) {
            if let Some(s) = &mut self.sym {
                s.consts.insert(id, SymConst::Elems { dims, dtype, exprs });
            }
        }
        Ok(id)
    }

    /// The symbolic path of [`Ctx::add`]: taken when an input is symbolic or the op has a
    /// symbolic attribute.
    pub(crate) fn add_symbolic(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        attr: Option<SymAttr>,
    ) -> R<NodeId> {
        let shapes: Vec<&Shape> = inputs.iter().map(|&i| &self.g.node(i).shape).collect();
        let probe_shape = rlx_ir::infer_shape::infer_output(&op, &shapes).map_err(|e| e.0)?;
        let in_dims: Vec<Vec<DimExpr>> = inputs.iter().map(|&i| self.sdims(i)).collect();
        let sym = self.sym.as_mut().expect("symbolic import");
        let out_dims = match infer_sym(sym, &op, attr.as_ref(), &in_dims, &probe_shape) {
            Ok(d) => d,
            Err(e) => {
                sym.taint(|| format!("{}: {e}", op.name()));
                consts(&probe_shape.dims_usize())
            }
        };
        // Shape arithmetic on constants: fold symbolically.
        let all_const = inputs
            .iter()
            .all(|&i| matches!(self.g.node(i).op, Op::Constant(_)));
        // Only a value of fixed shape can be one expression per element.
        let fixed = out_dims.iter().all(DimExpr::is_const);
        if all_const && fixed && (probe_shape.dtype.is_int() || probe_shape.dtype == DType::Bool) {
            if let Some(exprs) = self.fold_exprs(&op, &inputs, &probe_shape)? {
                return self.const_exprs(
                    probe_shape.dims_usize().to_vec(),
                    probe_shape.dtype,
                    exprs,
                );
            }
        }
        let id = self.g.add_node(op, inputs, probe_shape);
        let sym = self.sym.as_mut().expect("symbolic import");
        if out_dims.iter().any(|e| !e.is_const()) {
            sym.shapes.insert(id, out_dims);
        }
        if let Some(a) = attr {
            self.set_attr(id, a);
        }
        Ok(id)
    }

    /// The value of `op` on constant inputs as expressions, when `op` is shape arithmetic
    /// on fixed-length integer tensors; `None` when it is not (the op stays a node).
    fn fold_exprs(&mut self, op: &Op, inputs: &[NodeId], out: &Shape) -> R<Option<Vec<DimExpr>>> {
        let mut vals = Vec::with_capacity(inputs.len());
        for &i in inputs {
            match self.sym.as_ref().and_then(|s| s.consts.get(&i)) {
                Some(SymConst::Elems { exprs, .. }) => vals.push(exprs.clone()),
                Some(SymConst::Range { .. }) => return Ok(None),
                None => {
                    let Op::Constant(t) = &self.g.node(i).op else {
                        return Ok(None);
                    };
                    if !(t.dtype().is_int() || t.dtype() == DType::Bool) || t.numel() > 64 {
                        return Ok(None);
                    }
                    vals.push(
                        t.data()
                            .to_i64_vec()
                            .into_iter()
                            .map(DimExpr::from)
                            .collect(),
                    );
                }
            }
        }
        let in_dims: Vec<Vec<usize>> = inputs
            .iter()
            .map(|&i| self.g.node(i).shape.dims_usize().to_vec())
            .collect();
        let n_out = out.numel();
        if n_out > 64 {
            return Ok(None);
        }
        let sym = self.sym.as_mut().expect("symbolic import");
        let ov = |e: Option<DimExpr>| e.ok_or_else(|| "size arithmetic overflows".to_string());
        // Element `j` of a broadcast input for output index `o` (rank <= 1 inputs only).
        let bget = |v: &Vec<DimExpr>, o: usize| -> Option<DimExpr> {
            if v.len() == 1 {
                Some(v[0].clone())
            } else {
                v.get(o).cloned()
            }
        };
        let r = match op {
            // A cast narrower than i64 would wrap a large size: only i64 passes values through.
            Op::Reshape { .. } if out.dtype.is_int() => Some(vals[0].clone()),
            Op::Cast { to: DType::I64, .. } => Some(vals[0].clone()),
            Op::Concat { axis: 0 } if in_dims.iter().all(|d| d.len() == 1) => Some(vals.concat()),
            Op::Gather { axis: 0 } if in_dims[0].len() == 1 => {
                let n = vals[0].len() as i64;
                let mut o = Vec::new();
                for e in &vals[1] {
                    let Some(k) = e.as_const() else {
                        return Ok(None);
                    };
                    let k = if k < 0 { k + n } else { k };
                    let Some(v) = usize::try_from(k).ok().and_then(|k| vals[0].get(k)) else {
                        return Err(format!("Gather: index {k} out of range for {n} elements"));
                    };
                    o.push(v.clone());
                }
                Some(o)
            }
            Op::Slice {
                starts,
                steps,
                sizes,
            } if in_dims[0].len() == 1 => Some(
                (0..sizes[0])
                    .map(|j| {
                        let i = starts[0] as i64 + j as i64 * steps[0];
                        vals[0][i as usize].clone()
                    })
                    .collect(),
            ),
            Op::Broadcast { .. } if vals[0].len() == 1 => Some(vec![vals[0][0].clone(); n_out]),
            Op::Unary(UnaryOp::Neg) => {
                Some(vals[0].iter().map(|e| ov(e.neg())).collect::<R<Vec<_>>>()?)
            }
            Op::Binary(b) if in_dims.iter().all(|d| d.len() <= 1) => {
                let mut o = Vec::with_capacity(n_out);
                for j in 0..n_out {
                    let (Some(x), Some(y)) = (bget(&vals[0], j), bget(&vals[1], j)) else {
                        return Ok(None);
                    };
                    let bool_of = |v: bool| DimExpr::from(v as i64);
                    let nonneg = |sym: &mut SymState, e: &DimExpr| -> R<()> {
                        if !e.is_nonneg() && sym.decide_lt(e, &DimExpr::from(0))? {
                            return Err(format!("negative size value {e}"));
                        }
                        Ok(())
                    };
                    let v = match b {
                        BinaryOp::Add => ov(x.add(&y))?,
                        BinaryOp::Sub => ov(x.sub(&y))?,
                        BinaryOp::Mul => ov(x.mul(&y))?,
                        BinaryOp::Div => {
                            // Integer Div truncates; on non-negative values that is floor.
                            nonneg(sym, &x)?;
                            let Some(d) = y.as_const().filter(|&d| d > 0) else {
                                return Ok(None);
                            };
                            ov(x.floor_div(d))?
                        }
                        BinaryOp::Max => x.maximum(&y),
                        BinaryOp::Min => x.minimum(&y),
                        BinaryOp::Eq => bool_of(sym.decide_eq(&x, &y)?),
                        BinaryOp::Lt => bool_of(sym.decide_lt(&x, &y)?),
                        BinaryOp::Ge => bool_of(!sym.decide_lt(&x, &y)?),
                        BinaryOp::Gt => bool_of(sym.decide_lt(&y, &x)?),
                        BinaryOp::Le => bool_of(!sym.decide_lt(&y, &x)?),
                        BinaryOp::And | BinaryOp::Or if x.is_const() && y.is_const() => {
                            let (p, q) = (x.as_const() != Some(0), y.as_const() != Some(0));
                            bool_of(if *b == BinaryOp::And { p && q } else { p || q })
                        }
                        _ => return Ok(None),
                    };
                    o.push(v);
                }
                Some(o)
            }
            Op::Select if in_dims.iter().all(|d| d.len() <= 1) => {
                let mut o = Vec::with_capacity(n_out);
                for j in 0..n_out {
                    let (Some(c), Some(x), Some(y)) =
                        (bget(&vals[0], j), bget(&vals[1], j), bget(&vals[2], j))
                    else {
                        return Ok(None);
                    };
                    let Some(c) = c.as_const() else {
                        return Ok(None);
                    };
                    o.push(if c != 0 { x } else { y });
                }
                Some(o)
            }
            Op::Reduce { kind, .. } if in_dims[0].len() <= 1 && n_out == 1 => match kind {
                rlx_ir::ReduceKind::Sum => Some(vec![vals[0]
                    .iter()
                    .try_fold(DimExpr::from(0), |a, x| ov(a.add(x)))?]),
                rlx_ir::ReduceKind::Prod => Some(vec![product(&vals[0])?]),
                _ => None,
            },
            _ => None,
        };
        Ok(r.filter(|v| v.len() == n_out))
    }
}

/// The symbolic output dims of `op`, or why they cannot be stated.
fn infer_sym(
    sym: &mut SymState,
    op: &Op,
    attr: Option<&SymAttr>,
    ins: &[Vec<DimExpr>],
    probe: &Shape,
) -> R<Vec<DimExpr>> {
    let all_static = ins.iter().all(|d| d.iter().all(DimExpr::is_const));
    let x = || ins[0].clone();
    Ok(match (op, attr) {
        (Op::Reshape { .. }, Some(SymAttr::Reshape(d)))
        | (Op::Broadcast { .. }, Some(SymAttr::Broadcast(d))) => {
            if let Op::Reshape { .. } = op {
                let (a, b) = (product(&ins[0])?, product(d)?);
                if !sym.decide_eq(&a, &b)? {
                    return Err(format!("reshape of {a} elements to {b}"));
                }
            }
            d.clone()
        }
        (Op::Slice { .. }, Some(SymAttr::Slice { sizes, .. })) => sizes.clone(),
        (_, Some(_)) => return Err("a symbolic attribute of another op".into()),
        _ if all_static => consts(&probe.dims_usize()),
        (Op::Reshape { .. } | Op::Broadcast { .. } | Op::Slice { .. }, None) => {
            return Err("its sizes were given as numbers, not expressions".into())
        }
        (
            Op::Unary(_)
            | Op::Activation(_)
            | Op::Cast { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::CumSum { .. }
            | Op::Trilu { .. },
            None,
        ) => x(),
        (Op::BitCast { to }, None) if to.size_bytes() == probe.dtype.size_bytes() => x(),
        (Op::Binary(_), None) => sym.broadcast(&ins[0], &ins[1])?,
        (Op::Select, None) => {
            let ab = sym.broadcast(&ins[1], &ins[2])?;
            sym.broadcast(&ins[0], &ab)?
        }
        (Op::Transpose { perm }, None) => perm.iter().map(|&p| ins[0][p].clone()).collect(),
        (Op::Concat { axis }, None) => {
            let mut o = x();
            for d in &ins[1..] {
                for (k, (a, b)) in o.iter().zip(d).enumerate() {
                    if k != *axis && !sym.decide_eq(a, b)? {
                        return Err(format!("concat of dims {a} and {b} on axis {k}"));
                    }
                }
                o[*axis] = o[*axis].add(&d[*axis]).ok_or("concat size overflows")?;
            }
            o
        }
        (Op::Gather { axis }, None) => {
            let mut o = ins[0][..*axis].to_vec();
            o.extend(ins[1].iter().cloned());
            o.extend(ins[0][*axis + 1..].iter().cloned());
            o
        }
        (Op::Reduce { axes, keepdims, .. }, None) => reduce_dims(&ins[0], axes, *keepdims),
        (Op::ArgReduce { axis, keepdims, .. }, None) => reduce_dims(&ins[0], &[*axis], *keepdims),
        (Op::BatchNorm { .. } | Op::Lrn { .. }, None) => x(),
        (Op::Conv(a), None) => {
            let (xd, wd) = (&ins[0], &ins[1]);
            let mut o = vec![xd[0].clone(), wd[0].clone()];
            for i in 0..xd.len() - 2 {
                let k = wd[i + 2].as_const().ok_or("a symbolic kernel size")?;
                o.push(window_dim(
                    sym,
                    &xd[i + 2],
                    k,
                    a.strides[i],
                    a.pads[i],
                    a.dilations[i],
                    false,
                    &probe.dims_usize()[i + 2],
                )?);
            }
            o
        }
        (Op::Pool(a), None) => {
            let xd = &ins[0];
            let mut o = vec![xd[0].clone(), xd[1].clone()];
            for i in 0..xd.len() - 2 {
                o.push(window_dim(
                    sym,
                    &xd[i + 2],
                    a.kernel[i] as i64,
                    a.strides[i],
                    a.pads[i],
                    a.dilations[i],
                    a.ceil_mode,
                    &probe.dims_usize()[i + 2],
                )?);
            }
            o
        }
        (Op::Pad { pads, .. }, None) => ins[0]
            .iter()
            .zip(pads)
            .map(|(d, &(b, e))| d.add(&DimExpr::from((b + e) as i64)).ok_or("pad overflows"))
            .collect::<Result<_, _>>()?,
        (Op::Tile { repeats }, None) => ins[0]
            .iter()
            .zip(repeats)
            .map(|(d, &r)| d.mul(&DimExpr::from(r as i64)).ok_or("tile overflows"))
            .collect::<Result<_, _>>()?,
        (Op::TopK { k, axis, .. }, None) => {
            let mut o = x();
            if sym.decide_lt(&o[*axis], &DimExpr::from(*k as i64))? {
                return Err(format!("TopK k {k} exceeds {}", o[*axis]));
            }
            o[*axis] = DimExpr::from(*k as i64);
            o
        }
        (Op::GatherElements { .. }, None) => ins[1].clone(),
        (Op::ScatterElements { .. } | Op::ScatterND { .. }, None) => x(),
        (Op::MatMul, None) => {
            let (a, b) = (&ins[0], &ins[1]);
            if a.len() < 2 || b.len() < 2 {
                return Err("a 1-D MatMul operand".into());
            }
            let (ra, rb) = (a.len(), b.len());
            if !sym.decide_eq(&a[ra - 1], &b[rb - 2])? {
                return Err(format!("MatMul inner dims {} and {}", a[ra - 1], b[rb - 2]));
            }
            let mut o = sym.broadcast(&a[..ra - 2], &b[..rb - 2])?;
            o.push(a[ra - 2].clone());
            o.push(b[rb - 1].clone());
            o
        }
        _ => return Err("has no symbolic shape rule yet".into()),
    })
}

/// An output size of a Conv/Pool window along one axis (`rlx_ir::infer_shape::
/// window_out_dim`): `floor((in + pb + pe - dil*(k-1) - 1) / stride) + 1`. A constant input
/// size gives the probe's output size; a symbolic one is an expression for floor rounding
/// and for `ceil_mode` (with its last-window rule), with the numerator's sign as a guard.
#[allow(clippy::too_many_arguments)]
fn window_dim(
    sym: &mut SymState,
    input: &DimExpr,
    k: i64,
    stride: usize,
    pads: (usize, usize),
    dil: usize,
    ceil_mode: bool,
    probe_out: &usize,
) -> R<DimExpr> {
    if input.is_const() {
        return Ok(DimExpr::from(*probe_out as i64));
    }
    let span = (dil as i64) * (k - 1) + 1;
    let num = input
        .add(&DimExpr::from(pads.0 as i64 + pads.1 as i64 - span))
        .ok_or("window size overflows")?;
    if sym.decide_lt(&num, &DimExpr::from(0))? {
        return Err(format!("window larger than the input ({num} < 0)"));
    }
    let s = stride.max(1) as i64;
    let overflow = || "window size overflows".to_string();
    let one = DimExpr::from(1);
    if !ceil_mode {
        return num
            .floor_div(s)
            .and_then(|q| q.add(&one))
            .ok_or_else(overflow);
    }
    // Rounded up, then one window fewer when the last would start at or past `in + pb`
    // (`window_out_dim`): with `a = ceil(num / s) + 1` and `b = ceil((in + pb) / s)` (the
    // windows starting before `in + pb`), `max(1, max(a - 1, min(a, b)))`; equal to the
    // rule for every input size (checked against it for in < 60, pads < 6, k < 7, s < 6,
    // dilation < 4).
    let q = num.ceil_div(s).ok_or_else(overflow)?;
    let a = q.add(&one).ok_or_else(overflow)?;
    let b = input
        .add(&DimExpr::from(pads.0 as i64))
        .and_then(|v| v.ceil_div(s))
        .ok_or_else(overflow)?;
    Ok(one.maximum(&q.maximum(&a.minimum(&b))))
}

fn reduce_dims(x: &[DimExpr], axes: &[usize], keepdims: bool) -> Vec<DimExpr> {
    let mut o = Vec::new();
    for (i, d) in x.iter().enumerate() {
        if axes.contains(&i) {
            if keepdims {
                o.push(DimExpr::from(1));
            }
        } else {
            o.push(d.clone());
        }
    }
    o
}

mod template;
pub use template::{SpecializeError, SymbolicGraph};
