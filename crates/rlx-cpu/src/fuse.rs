//! Conv epilogue fusion for the CPU executor: a 2-D f32 `Conv` with constant weights,
//! followed by a chain of per-channel affine ops with constant operands (`Add`, `Sub`,
//! `Mul`, `Div`: a decomposed BatchNormalization, or a separate bias) and an optional
//! `Relu`, runs as one conv with the affine map folded into its weights and bias
//! (`W'[m] = W[m]·a[m]`, `B'[m] = B[m]·a[m] + b[m]`, folded in f64 at plan time) and the
//! Relu applied in place on its output. Instead of a Relu the chain may end in a SiLU as
//! exported (`Sigmoid(y)` and `Mul(y, Sigmoid(y))`, EfficientNet's activation), applied in
//! place with the same sigmoid kernel and product as the unfused ops, so the same bits, or
//! in a Clip (`Max(y, lo)` then `Min(·, hi)` with scalar constants, as ONNX Clip imports:
//! MobileNetV2's ReLU6), applied in place with the unfused Max/Min expression. This is what
//! onnxruntime does to Conv+BatchNorm at session creation; the result differs from the
//! unfused chain only by rounding.
//!
//! The graph is not rewritten: the group's nodes keep their ids and names, and the executor
//! decides per run (see `CpuExecutor::run_hooked`):
//! * no scanner, no hooks: the fused conv; the chain's nodes are skipped;
//! * a NaN/Inf scanner on: the fused conv, whose value `y` before the activation is
//!   scanned in one
//!   pass that also finds max|y|. Every value the unfused chain would compute (the conv's
//!   output and each step's) is an affine map of `y` per channel, so it is bounded by
//!   `r·max|y| + o` (`ConvGroup::bound`, from the folded constants). If `y` is finite and
//!   that bound is below half of f32::MAX, no unfused step could have overflowed and every
//!   node of the chain is reported finite; otherwise the group is replayed unfused from the
//!   same inputs and every node scanned, so the report names the op that created the value,
//!   exactly as with fusion off (the approach of JAX's `jax_debug_nans`, which re-runs the
//!   failing jitted function op by op). With no scanner, the fused result is returned as
//!   is: like onnxruntime's folding, it can stay finite where the unfused chain overflows
//!   (a huge scale then its inverse, or a conv sum that a small BatchNorm scale brings back
//!   into range);
//! * hooks (observers, the value printer, the trace): the unfused nodes, every value seen.

use rlx_ir::{Activation, BinaryOp, DType, Graph, NodeId, Op, Tensor};
use rlx_kernels::kernels::conv::{Packed, WinogradWeights};
use std::sync::Arc;

mod fold;
mod scale;
use fold::fold_checked;
pub(crate) use fold::{fold_src, Folded};
use scale::scale_at;
pub(crate) use scale::{run_scaled, scale_is_finite, Scaled};

/// One fused Conv group.
#[derive(Debug)]
pub(crate) struct ConvGroup {
    /// The Conv node (its input 0 is the activation).
    pub conv: NodeId,
    /// The chain after the conv, in order; the last one's value is the group's output (the
    /// conv's own when the chain is empty).
    pub members: Vec<NodeId>,
    /// Folded weights and bias; None when the chain is only a Relu (the conv's own
    /// constants are used, not copied).
    pub folded: Option<Folded>,
    /// A trailing activation, applied in place.
    pub act: Epilogue,
    /// `(r, o)`: every value the unfused chain computes (the conv's output and each step's)
    /// is at most `r·max|y| + o` in magnitude, where `y` is the fused value before the Relu
    /// (each step is `a_k·c + b_k` of the conv output `c = (y - b)/a`).
    pub bound: (f64, f64),
    /// A residual Add (and Relu) after a chain that ends without an activation, applied
    /// in the conv's epilogue on runs without a scanner or hooks.
    pub residual: Option<Residual>,
    /// A 2-D f32 MaxPool that alone reads the chain's value (a stem's Conv → Relu →
    /// MaxPool): the group's last member, computed with the conv, in bands of rows at one
    /// thread (`rlx_kernels::kernels::conv::banded`; `RLX_CPU_CONV_POOL=0`: none). Never
    /// with a residual.
    pub pool: Option<NodeId>,
}

/// `Add(y, r)` (either order) that reads a group's value `y` and a value `r` of the same
/// shape made before the conv (a ResNet shortcut), then optionally `Relu`: run without a
/// scanner, the conv adds `r` to its outputs before the activation, and the Add's pass
/// over the output is gone (`rlx_kernels::kernels::conv::Residual`: when the Add is `r`'s last
/// reader, gemm accumulates the products onto `r`'s buffer, `(conv + r) + bias`, unless a
/// |bias| exceeds 2^64, where that order could overflow elsewhere; else the bias pass
/// reads `r`, `(conv + bias) + r`, the unfused order; values differ from the unfused Add
/// by rounding only). With a scanner the group stops before the Add and the Add runs as a
/// node, so its report is the unfused one; on the Winograd path too (its 2×2 tiles would
/// read `r` scattered, slower than the Add's own pass).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Residual {
    pub add: NodeId,
    pub skip: NodeId,
    pub relu: Option<NodeId>,
}

impl Residual {
    /// The node whose value the group computes with its residual.
    pub(crate) fn output(&self) -> NodeId {
        self.relu.unwrap_or(self.add)
    }

    /// The group's activation with the residual: the Relu, if any.
    fn act(&self) -> Epilogue {
        if self.relu.is_some() {
            Epilogue::Relu
        } else {
            Epilogue::None
        }
    }
}

/// The activation that ends a fused group. Each keeps a finite value finite (|SiLU(y)| <=
/// |y|; the Clip bounds are finite), so a finite `y` before it means every member's value
/// is finite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Epilogue {
    None,
    /// `Relu(y)`.
    Relu,
    /// `Mul(y, Sigmoid(y))`: members are the Sigmoid, then the Mul.
    Silu,
    /// `Min(Max(y, lo), hi)` (a missing half is ∓inf): members are the Max and/or the Min.
    Clip {
        lo: f32,
        hi: f32,
    },
}

impl ConvGroup {
    /// Whether a fused run whose largest |y| before the activation has bits `max_bits` is
    /// clean: finite (NaN's bits are above +inf's), and every value of the unfused chain
    /// provably below half of f32::MAX ([`ConvGroup::bound`]), so the unfused run cannot
    /// overflow where the fused one did not (else the caller replays it op by op).
    pub(crate) fn clean(&self, max_bits: u32) -> bool {
        max_bits < 0x7f80_0000
            && self.bound.0 * f32::from_bits(max_bits) as f64 + self.bound.1 < f32::MAX as f64 / 2.0
    }

    /// The node whose value the group computes: its chain's last, or the conv's own.
    pub(crate) fn output(&self) -> NodeId {
        self.members.last().copied().unwrap_or(self.conv)
    }
}

/// A 1×1 conv with stride 1, dilation 1, no padding and one group (`a` its attributes,
/// `wd` its weight dims): a product over channels per pixel.
fn pointwise(a: &rlx_ir::ConvAttrs, wd: &[usize]) -> bool {
    a.groups <= 1
        && wd.len() == 4
        && wd[2..] == [1, 1]
        && a.strides.iter().all(|&s| s == 1)
        && a.dilations.iter().all(|&d| d == 1)
        && a.pads.iter().all(|&p| p == (0, 0))
}

impl Epilogue {
    /// The same map as [`Epilogue::apply`], as a conv kernel's clamp (not for SiLU).
    fn clamp(self) -> Option<rlx_kernels::kernels::conv::Clamp> {
        use rlx_kernels::kernels::conv::Clamp;
        match self {
            Epilogue::None => Some(Clamp::NONE),
            Epilogue::Relu => Some(Clamp::RELU),
            Epilogue::Clip { lo, hi } => Some(Clamp::clip(lo, hi)),
            Epilogue::Silu => None,
        }
    }

    /// Applies the activation in place to `v`, any part of the group's output (each kind
    /// maps every element on its own), with the unfused ops' kernels and expressions.
    fn apply(self, v: &mut [f32]) {
        use rlx_kernels::kernels::elementwise::{max_f32, min_f32};
        use rlx_kernels::kernels::wide::map_inplace;
        match self {
            Epilogue::None => {}
            Epilogue::Relu => map_inplace(v, |x: f32| Activation::Relu.apply_f32(x)),
            Epilogue::Silu => rlx_kernels::kernels::fastmath::silu_inplace(v),
            Epilogue::Clip { lo, hi } => map_inplace(v, |x: f32| min_f32(max_f32(x, lo), hi)),
        }
    }
}

/// The fusion plan of one graph.
#[derive(Debug, Default)]
pub(crate) struct Fusions {
    pub groups: Vec<ConvGroup>,
    /// Per node: the group whose conv it is.
    pub at_conv: Vec<Option<usize>>,
    /// Per node: the group whose chain it belongs to (not set for the conv itself).
    pub member_of: Vec<Option<usize>>,
    /// Per group: the depthwise group whose conv alone reads this pointwise group's output
    /// ([`run_pair`] runs the two interleaved).
    pub then_dw: Vec<Option<usize>>,
    /// Per group: the per-channel scale Mul before its 1×1 conv, folded into the weights
    /// at run time ([`run_scaled`]).
    pub scaled: Vec<Option<Scaled>>,
    /// Per node: the group whose conv a scale Mul is folded into (`scaled`).
    pub scale_mul: Vec<Option<usize>>,
    /// Per node: the group whose [`Residual`] (the Add or its Relu) it is.
    pub residual_of: Vec<Option<usize>>,
}

fn constant(g: &Graph, id: NodeId) -> Option<&Tensor> {
    constant_arc(g, id).map(|t| &**t)
}

/// A constant's shared tensor (its identity for `crate::prepared`).
fn constant_arc(g: &Graph, id: NodeId) -> Option<&Arc<Tensor>> {
    match &g.node(id).op {
        Op::Constant(t) => Some(t),
        _ => None,
    }
}

/// The per-output-channel values of a constant that broadcasts against `[N, M, ...]` along
/// axis 1 only (or is a scalar), as f64; None otherwise.
fn per_channel(t: &Tensor, out_rank: usize, m: usize) -> Option<Vec<f64>> {
    let v = t.as_f32()?;
    if v.len() == 1 {
        return Some(vec![v[0] as f64; m]);
    }
    let d = t.dims();
    if v.len() != m || d.len() > out_rank {
        return None;
    }
    let off = out_rank - d.len();
    let ok = d
        .iter()
        .enumerate()
        .all(|(i, &n)| if i + off == 1 { n == m } else { n == 1 });
    ok.then(|| v.iter().map(|&x| x as f64).collect())
}

/// Find the fusable Conv groups of `g`. `consumers[i]` lists the nodes reading node i (one
/// entry per use), `is_output[i]` marks graph outputs.
pub(crate) fn plan(g: &Graph, consumers: &[Vec<NodeId>], is_output: &[bool]) -> Fusions {
    let n = g.len();
    let mut f = Fusions {
        groups: vec![],
        at_conv: vec![None; n],
        member_of: vec![None; n],
        then_dw: vec![],
        scaled: vec![],
        scale_mul: vec![None; n],
        residual_of: vec![None; n],
    };
    let residual_on = !rlx_ir::env::is_off("RLX_CPU_RESIDUAL");
    let pool_on = !rlx_ir::env::is_off("RLX_CPU_CONV_POOL");
    for node in &g.nodes {
        let Op::Conv(_) = &node.op else { continue };
        if node.shape.dtype != DType::F32 || node.shape.rank() < 3 || !node.shape.is_static() {
            continue;
        }
        let Some(w_arc) = node.inputs.get(1).and_then(|&i| constant_arc(g, i)) else {
            continue;
        };
        let w = &**w_arc;
        let bias_arc = match node.inputs.get(2) {
            Some(&i) => match constant_arc(g, i) {
                Some(b) => Some(b),
                None => continue,
            },
            None => None,
        };
        let bias = match bias_arc.map(|t| t.as_f32()) {
            Some(Some(b)) => Some(b),
            Some(None) => continue,
            None => None,
        };
        let od = node.shape.dims_usize();
        let (rank, m) = (od.len(), od[1]);
        let Some(wv) = w.as_f32() else { continue };
        if w.dims().first() != Some(&m) || bias.is_some_and(|b| b.len() != m) {
            continue;
        }
        // y = a * conv + b, per channel.
        let (mut a, mut b) = (vec![1f64; m], vec![0f64; m]);
        let mut members = vec![];
        let mut steps: Vec<(Vec<f64>, Vec<f64>)> = vec![(a.clone(), b.clone())];
        let mut act = Epilogue::None;
        let mut cur = node.id;
        while !is_output[cur.index()] {
            if let Some((sig, mul)) = silu_at(g, cur, consumers, is_output) {
                act = Epilogue::Silu;
                members.extend([sig, mul]);
                break;
            }
            if consumers[cur.index()].len() != 1 {
                break;
            }
            let next = g.node(consumers[cur.index()][0]);
            if next.shape != node.shape {
                break;
            }
            if let Some((lo, hi, ids)) = clip_at(g, cur, consumers, is_output) {
                act = Epilogue::Clip { lo, hi };
                members.extend(ids);
                break;
            }
            match (&next.op, next.inputs.as_slice()) {
                (Op::Activation(Activation::Relu), [x]) if *x == cur => {
                    act = Epilogue::Relu;
                    members.push(next.id);
                    break;
                }
                (Op::Binary(op), &[x, y]) if x != y && (x == cur || y == cur) => {
                    let other = if x == cur { y } else { x };
                    let Some(c) = constant(g, other).and_then(|t| per_channel(t, rank, m)) else {
                        break;
                    };
                    let cur_left = x == cur;
                    match (op, cur_left) {
                        (BinaryOp::Add, _) => b.iter_mut().zip(&c).for_each(|(b, c)| *b += c),
                        (BinaryOp::Sub, true) => b.iter_mut().zip(&c).for_each(|(b, c)| *b -= c),
                        (BinaryOp::Sub, false) => {
                            // c - y
                            a.iter_mut().for_each(|a| *a = -*a);
                            b.iter_mut().zip(&c).for_each(|(b, c)| *b = c - *b);
                        }
                        (BinaryOp::Mul, _) => {
                            for ((a, b), c) in a.iter_mut().zip(b.iter_mut()).zip(&c) {
                                *a *= c;
                                *b *= c;
                            }
                        }
                        (BinaryOp::Div, true) => {
                            for ((a, b), c) in a.iter_mut().zip(b.iter_mut()).zip(&c) {
                                *a /= c;
                                *b /= c;
                            }
                        }
                        _ => break,
                    }
                    steps.push((a.clone(), b.clone()));
                    members.push(next.id);
                    cur = next.id;
                }
                _ => break,
            }
        }
        // A conv with no chain after it is a group of its own (no members): it computes
        // the same, but a scanner's check of its output happens inside the conv, block by
        // block, instead of in a second pass.
        // Fold (unless the chain is only a Relu); keep the group only if every folded value
        // is finite and no scale is zero (a zero scale would turn an Inf into NaN in the
        // chain but not in the fold).
        let identity = a.iter().all(|&x| x == 1.0) && b.iter().all(|&x| x == 0.0);
        let folded = if identity {
            None
        } else {
            let src = crate::prepared::FoldSrc {
                w: w_arc.clone(),
                bias: bias_arc.cloned(),
                a: a.clone(),
                b: b.clone(),
            };
            // Only checked here: the plan makes the folded weights one group at a time,
            // and keeps them only where a path reads them unpacked (`Folded::w`).
            match fold_checked(wv, bias, &a, &b) {
                Some(bias) => Some(Folded {
                    w: None,
                    bias: Arc::new(bias),
                    src,
                }),
                None => continue,
            }
        };
        let mut bound = (0f64, 0f64);
        for (ak, bk) in &steps {
            for i in 0..m {
                let r = (ak[i] / a[i]).abs();
                bound.0 = bound.0.max(r);
                bound.1 = bound.1.max(r * b[i].abs() + bk[i].abs());
            }
        }
        let gi = f.groups.len();
        f.at_conv[node.id.index()] = Some(gi);
        for &x in &members {
            f.member_of[x.index()] = Some(gi);
        }
        let residual = if act == Epilogue::None && residual_on {
            residual_at(g, node.id, cur, consumers, is_output)
        } else {
            None
        };
        if let Some(r) = residual {
            for x in [Some(r.add), r.relu].into_iter().flatten() {
                f.residual_of[x.index()] = Some(gi);
            }
        }
        let pool = if residual.is_none() && pool_on {
            pool_at(g, *members.last().unwrap_or(&node.id), consumers, is_output)
        } else {
            None
        };
        if let Some(p) = pool {
            members.push(p);
            f.member_of[p.index()] = Some(gi);
        }
        f.groups.push(ConvGroup {
            conv: node.id,
            members,
            folded,
            act,
            bound,
            residual,
            pool,
        });
    }
    f.scaled = f
        .groups
        .iter()
        .map(|a| scale_at(g, a, consumers, is_output))
        .collect();
    for (k, sc) in f.scaled.iter().enumerate() {
        if let Some(sc) = sc {
            f.scale_mul[sc.mul.index()] = Some(k);
        }
    }
    f.then_dw = f
        .groups
        .iter()
        .zip(&f.scaled)
        .map(|(a, sc)| pair_at(g, &f, a, consumers, is_output).filter(|_| sc.is_none()))
        .collect();
    f
}

/// The MaxPool that alone reads `y`, the value a group computes (not a graph output), where
/// the conv's output is large enough for bands to matter (over twice
/// `rlx_kernels::kernels::conv::banded::BAND_BYTES`) and the pool fits the banded kernel
/// (2-D f32 MaxPool, dilation 1 along rows).
fn pool_at(g: &Graph, y: NodeId, consumers: &[Vec<NodeId>], is_output: &[bool]) -> Option<NodeId> {
    use rlx_kernels::kernels::conv::banded;
    let [p] = consumers[y.index()].as_slice() else {
        return None;
    };
    let (yn, pn) = (g.node(y), g.node(*p));
    let Op::Pool(pa) = &pn.op else {
        return None;
    };
    let bytes = yn.shape.numel() * 4;
    (!is_output[y.index()]
        && pn.inputs.as_slice() == [y]
        && bytes > 2 * banded::BAND_BYTES
        && banded::fits(&yn.shape, pa, &pn.shape))
    .then_some(*p)
}

/// The [`Residual`] after the value `y` that a group of `conv` (one group, f32) computes:
/// `y` (not a graph output) is read only by an `Add` with another value `r` of `y`'s shape
/// whose node comes before the conv (the executor runs nodes in order, so `r` is there when
/// the conv runs, and stays until the Add reads it), then by a `Relu` if that is the Add's
/// only reader and not a graph output.
fn residual_at(
    g: &Graph,
    conv: NodeId,
    y: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<Residual> {
    let Op::Conv(a) = &g.node(conv).op else {
        return None;
    };
    if a.groups > 1 || is_output[y.index()] || consumers[y.index()].len() != 1 {
        return None;
    }
    let add = g.node(consumers[y.index()][0]);
    let skip = match (&add.op, add.inputs.as_slice()) {
        (Op::Binary(BinaryOp::Add), &[p, q]) if p != q && (p == y || q == y) => {
            if p == y {
                q
            } else {
                p
            }
        }
        _ => return None,
    };
    let shape = &g.node(y).shape;
    if add.shape != *shape || g.node(skip).shape != *shape || skip.index() >= conv.index() {
        return None;
    }
    let relu = match consumers[add.id.index()].as_slice() {
        [r] if !is_output[add.id.index()] => {
            let r = g.node(*r);
            matches!(r.op, Op::Activation(Activation::Relu)).then_some(r.id)
        }
        _ => None,
    };
    Some(Residual {
        add: add.id,
        skip,
        relu,
    })
}

/// The depthwise group that [`run_pair`] can run with pointwise group `a`: `a`'s conv is
/// 1×1 with stride 1, no padding and one group, on one image, and its output (not a graph
/// output) is read only, as input 0, by the conv of a group with one filter per channel.
/// On planes of 1024 pixels or fewer the plan keeps the pair only where the blocks take it
/// (`crate::plan`, `rlx_kernels::kernels::conv::pair_blocks_take`);
/// `rlx_kernels::kernels::conv::pw_dw` checks the rest (kernel size, stride, finite
/// weights, the CPU) each run.
fn pair_at(
    g: &Graph,
    f: &Fusions,
    a: &ConvGroup,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<usize> {
    let last = a.output();
    let [reader] = consumers[last.index()].as_slice() else {
        return None;
    };
    let kb = f.at_conv[reader.index()]?;
    if a.pool.is_some() || f.groups[kb].pool.is_some() {
        return None;
    }
    let (na, nb) = (g.node(a.conv), g.node(*reader));
    let (Op::Conv(aa), Op::Conv(ab)) = (&na.op, &nb.op) else {
        return None;
    };
    let od = na.shape.dims_usize();
    let wd = na.inputs.get(1).map(|&w| g.node(w).shape.dims_usize())?;
    let pointwise = od.len() == 4 && od[0] == 1 && pointwise(aa, &wd);
    let depthwise = od.len() == 4 && od[1] > 1 && ab.groups == od[1];
    (!is_output[last.index()]
        && nb.inputs.iter().position(|&i| i == last) == Some(0)
        && !nb.inputs[1..].contains(&last)
        && pointwise
        && depthwise)
        .then_some(kb)
}

/// True when the pair whose 1×1 conv outputs `shape` runs by bands of rows, on the
/// weights as they are (planes over `PAIR_BLOCKS_MAX_PLANE` pixels); else by blocks of
/// channels on the packed weights (`rlx_kernels::kernels::conv::pw_dw`).
pub(crate) fn pair_by_bands(shape: &rlx_ir::Shape) -> bool {
    let d = shape.dims_usize();
    d.len() == 4 && d[2] * d[3] > rlx_kernels::kernels::conv::PAIR_BLOCKS_MAX_PLANE
}

/// The weights and bias a group's conv runs with: the folded ones (folded again where the
/// plan kept them only packed: [`Folded::w`]), or the conv's constants.
fn weights<'g>(
    g: &'g Graph,
    grp: &'g ConvGroup,
) -> Option<(std::borrow::Cow<'g, Tensor>, Option<&'g Tensor>)> {
    match &grp.folded {
        Some(f) => Some((f.weights()?, Some(&*f.bias))),
        None => {
            let node = g.node(grp.conv);
            let w = constant(g, *node.inputs.get(1)?)?;
            let b = match node.inputs.get(2) {
                Some(&i) => Some(constant(g, i)?),
                None => None,
            };
            Some((std::borrow::Cow::Borrowed(w), b))
        }
    }
}

/// Pointwise group `a` and depthwise group `b` (`Fusions::then_dw`) on `x`, interleaved
/// (`rlx_kernels::kernels::conv::pw_dw`: by bands of rows on large planes, by blocks of
/// channels on `packed`, `a`'s packed weights, on small ones, [`pair_by_bands`]): `b`'s
/// output, the same bits as [`run_group`] on each in turn, and whether both groups are
/// clean as [`run_group`] judges it (always true without `scan`); None where the
/// interleaved kernel does not apply (then nothing was computed and the groups run on
/// their own). With `scan`, each
/// conv's largest |y| before its activation is taken as the kernels write it (the
/// pointwise output is never whole, so it could not be scanned after); a group that is not
/// clean makes the caller replay both groups op by op, so the report names the op.
pub(crate) fn run_pair(
    g: &Graph,
    a: &ConvGroup,
    b: &ConvGroup,
    x: &Tensor,
    packed: Option<&Packed>,
    scan: bool,
) -> Result<Option<(Tensor, bool)>, crate::KernelError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    let (na, nb) = (g.node(a.conv), g.node(b.conv));
    let bands = pair_by_bands(&na.shape);
    if !bands && packed.is_none() {
        return Ok(None);
    }
    // By blocks only the packed weights are read (the plan may keep no unpacked copy of
    // folded ones: `Folded::w`).
    let wa = match (&a.folded, bands) {
        (Some(f), false) => Some((None, Some(&*f.bias))),
        _ => weights(g, a).map(|(w, b)| (Some(w), b)),
    };
    let (Op::Conv(aa), Op::Conv(ab), Some((wa, ba)), Some((wb, bb))) =
        (&na.op, &nb.op, wa, weights(g, b))
    else {
        return Ok(None);
    };
    let packed = packed.filter(|_| !bands);
    let (act_a, act_b) = (a.act, b.act);
    // Largest |y| bits before each activation (NaN's bits are above +inf's): the kernels
    // take them with a clamp; without one, `post` does (as in `run_group`).
    let bits = [AtomicU32::new(0), AtomicU32::new(0)];
    let post_a = |v: &mut [f32]| {
        if scan {
            bits[0].fetch_max(
                rlx_kernels::kernels::wide::max_abs_bits(v),
                Ordering::Relaxed,
            );
        }
        act_a.apply(v)
    };
    let post_b = |v: &mut [f32]| {
        if scan {
            bits[1].fetch_max(
                rlx_kernels::kernels::wide::max_abs_bits(v),
                Ordering::Relaxed,
            );
        }
        act_b.apply(v)
    };
    use rlx_kernels::kernels::conv::Act;
    let act_a = Act {
        clamp: act_a.clamp(),
        post: &post_a,
        post_bias: None,
        seen: scan.then_some(&bits[0]),
    };
    let act_b = Act {
        clamp: act_b.clamp(),
        post: &post_b,
        post_bias: None,
        seen: scan.then_some(&bits[1]),
    };
    let t = rlx_kernels::kernels::conv::pw_dw(
        x,
        (wa.as_deref(), packed, ba, aa, &na.shape, act_a),
        (&wb, bb, ab, &nb.shape, act_b),
    )?;
    Ok(t.map(|t| {
        let [ba, bb] = bits.map(AtomicU32::into_inner);
        let ok = !scan || (a.clean(ba) && b.clean(bb));
        (t, ok)
    }))
}

/// The SiLU read from `cur`: its only consumers are a `Sigmoid(cur)` (itself read only by
/// the Mul, and not a graph output) and a `Mul(cur, that Sigmoid)` (either order), all of
/// `cur`'s shape. Returns (Sigmoid, Mul).
fn silu_at(
    g: &Graph,
    cur: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<(NodeId, NodeId)> {
    let [c0, c1] = consumers[cur.index()].as_slice() else {
        return None;
    };
    let shape = &g.node(cur).shape;
    let is_sig = |id: NodeId| {
        let n = g.node(id);
        matches!(&n.op, Op::Activation(Activation::Sigmoid))
            && n.inputs.as_slice() == [cur]
            && &n.shape == shape
    };
    let (sig, mul) = if is_sig(*c0) { (*c0, *c1) } else { (*c1, *c0) };
    if !is_sig(sig) || is_output[sig.index()] || consumers[sig.index()].as_slice() != [mul] {
        return None;
    }
    let m = g.node(mul);
    let operands_ok = m.inputs.as_slice() == [cur, sig] || m.inputs.as_slice() == [sig, cur];
    (matches!(&m.op, Op::Binary(BinaryOp::Mul)) && operands_ok && &m.shape == shape)
        .then_some((sig, mul))
}

/// A scalar f32 constant that is finite (a bound of ±inf could turn a finite value into an
/// Inf, which the group's scan of the value before the activation would not see).
fn scalar_bound(g: &Graph, id: NodeId) -> Option<f32> {
    let v = constant(g, id)?.as_f32()?;
    match v {
        [x] if x.is_finite() => Some(*x),
        _ => None,
    }
}

/// The Clip read from `cur`: its only consumer is `Max(cur, lo)` or `Min(cur, hi)` with a
/// finite scalar constant second (the operand order ONNX Clip imports with; the other order
/// can give the other sign of a zero), of `cur`'s shape; a Max whose only consumer is such
/// a Min (and which is not a graph output) takes it too. Returns (lo, hi, members) with a
/// missing bound as -inf or +inf.
fn clip_at(
    g: &Graph,
    cur: NodeId,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<(f32, f32, Vec<NodeId>)> {
    let shape = &g.node(cur).shape;
    // (Max or Min, its bound) when `id` is that op on `from` and a scalar constant.
    let step = |from: NodeId, id: NodeId| {
        let n = g.node(id);
        let (Op::Binary(op @ (BinaryOp::Max | BinaryOp::Min)), &[x, y]) =
            (&n.op, n.inputs.as_slice())
        else {
            return None;
        };
        (x == from && y != from && &n.shape == shape).then_some(())?;
        Some((*op, scalar_bound(g, y)?))
    };
    let [first] = consumers[cur.index()].as_slice() else {
        return None;
    };
    match step(cur, *first)? {
        (BinaryOp::Min, hi) => Some((f32::NEG_INFINITY, hi, vec![*first])),
        (_, lo) => {
            if let (false, [second]) = (
                is_output[first.index()],
                consumers[first.index()].as_slice(),
            ) {
                if let Some((BinaryOp::Min, hi)) = step(*first, *second) {
                    return Some((lo, hi, vec![*first, *second]));
                }
            }
            Some((lo, f32::INFINITY, vec![*first]))
        }
    }
}

/// The value of a group's [`Residual`] operand, as the executor hands it over: borrowed
/// (read), or owned when the Add was its last reader (the conv then takes its buffer for
/// the output; see `rlx_kernels::kernels::conv::Residual`).
pub(crate) enum Skip<'a> {
    Borrowed(&'a Tensor),
    Owned(Tensor),
}

/// The activation and residual with which group `grp` runs: its own activation and none,
/// or with `skip` (its [`Residual`]'s operand) the residual's activation and `skip`.
fn with_residual<'a>(
    grp: &ConvGroup,
    skip: Option<Skip<'a>>,
) -> Result<(Epilogue, Option<rlx_kernels::kernels::conv::Residual<'a>>), crate::KernelError> {
    use rlx_kernels::kernels::conv::Residual as R;
    let Some(skip) = skip else {
        return Ok((grp.act, None));
    };
    let bad = || {
        crate::KernelError::Invalid(
            "fused group: a residual operand for a group without one, or not f32".into(),
        )
    };
    let r = grp.residual.ok_or_else(bad)?;
    let res = match skip {
        Skip::Borrowed(t) => R::Read(t.as_f32().ok_or_else(bad)?),
        Skip::Owned(t) => match t.into_data() {
            rlx_ir::TensorData::F32(v) => R::Into(v),
            d => {
                rlx_kernels::buffers::give(d);
                return Err(bad());
            }
        },
    };
    Ok((r.act(), Some(res)))
}

/// Run group `grp` fused on the activation `x`: the conv with folded weights and bias, and
/// its activation in place, on each block of output as the conv finishes it (while it is
/// in cache). With `scan`, the same visit first takes the block's largest magnitude, and
/// the flag says whether the value before the activation was finite and every unfused step
/// provably in range (a Relu maps -inf to 0, so its output alone would hide an Inf made
/// inside the group); else the flag is true.
///
/// `skip`: the value of the group's [`Residual`] operand, to compute the residual's output
/// instead of the group's own (then the activation is the residual's Relu, if any). Not with
/// `scan`. `w_over`: weights to run the conv with instead of the group's (its bias kept;
/// [`run_scaled`]). Error: a `skip` for a group without a residual, or not f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_group(
    g: &Graph,
    grp: &ConvGroup,
    x: &Tensor,
    wino: Option<&WinogradWeights>,
    packed: Option<&Packed>,
    scan: bool,
    skip: Option<Skip>,
    w_over: Option<&Tensor>,
) -> Result<(Tensor, bool), crate::KernelError> {
    use rlx_kernels::kernels::conv::{conv_packed, conv_post, conv_winograd, Act};
    use std::sync::atomic::{AtomicU32, Ordering};
    let node = g.node(grp.conv);
    if scan && skip.is_some() {
        return Err(crate::KernelError::Invalid(
            "fused group: a residual is not applied while scanning".into(),
        ));
    }
    let (act, res) = with_residual(grp, skip)?;
    // Largest |y| bits seen before the activation (NaN's bits are above +inf's).
    let max_bits = AtomicU32::new(0);
    let post = |v: &mut [f32]| {
        if scan {
            max_bits.fetch_max(
                rlx_kernels::kernels::wide::max_abs_bits(v),
                Ordering::Relaxed,
            );
        }
        act.apply(v)
    };
    // A SiLU takes the bias in its own pass (the same values, one pass fewer over the run).
    let silu_bias = |v: &mut [f32], b: f32| {
        rlx_kernels::kernels::fastmath::silu_bias_inplace(v, b, scan.then_some(&max_bits))
    };
    let bad = |what: &str| crate::KernelError::Invalid(format!("fused group: {what}"));
    let Op::Conv(a) = &node.op else {
        return Err(bad("not a Conv"));
    };
    // RLX's own kernel on the packed weights (not with `w_over`: other weights). Then the
    // unpacked weights are not read (the plan may not keep them: `Folded::w`).
    let packed = packed.filter(|_| w_over.is_none());
    let (w, bias) = match (&grp.folded, packed) {
        (Some(f), Some(_)) => (None, Some(&*f.bias)),
        _ => {
            let (w, b) = weights(g, grp).ok_or_else(|| bad("not a Conv with constant weights"))?;
            (Some(w), b)
        }
    };
    let w = w_over.map(std::borrow::Cow::Borrowed).or(w);
    let w = w.as_deref();
    let no_w = || bad("its weights are not at hand");
    // The conv (on the whole input, or on a band of its rows for a MaxPool tail).
    let conv = |x: &Tensor,
                a: &rlx_ir::ConvAttrs,
                out: &rlx_ir::Shape,
                res: Option<rlx_kernels::kernels::conv::Residual>|
     -> Result<Tensor, crate::KernelError> {
        Ok(match wino {
            Some(_) if res.is_some() => {
                return Err(crate::KernelError::Invalid(
                    "fused group: a residual is not applied on the Winograd path".into(),
                ))
            }
            Some(wg) => conv_winograd(x, wg, w.ok_or_else(no_w)?, bias, a, out, &post)?,
            // The conv kernels apply a Relu/Clip themselves; when scanning they also take
            // the largest |y| before it in the same pass (else `post` does both).
            None => {
                let act = Act {
                    clamp: act.clamp(),
                    post: &post,
                    post_bias: (act == Epilogue::Silu).then_some(&silu_bias as _),
                    seen: scan.then_some(&max_bits),
                };
                match packed {
                    Some(pk) => conv_packed(x, pk, bias, a, out, act, res)?,
                    None => conv_post(x, w.ok_or_else(no_w)?, bias, a, out, act, res)?,
                }
            }
        })
    };
    let t = match grp.pool.map(|p| g.node(p)) {
        Some(pn) => {
            let Op::Pool(pa) = &pn.op else {
                return Err(crate::KernelError::Invalid(
                    "fused group: its pool tail is not a Pool".into(),
                ));
            };
            if res.is_some() {
                return Err(crate::KernelError::Invalid(
                    "fused group: a residual with a pool tail".into(),
                ));
            }
            use rlx_kernels::kernels::conv::banded;
            let kh = (node.inputs.get(1))
                .and_then(|&i| g.node(i).shape.dims_usize().get(2).copied())
                .unwrap_or(1);
            banded::conv_max_pool(
                x,
                a,
                kh,
                &node.shape,
                pa,
                &pn.shape,
                banded::BAND_BYTES,
                &|x, a, out| conv(x, a, out, None),
            )?
        }
        None => conv(x, a, &node.shape, res)?,
    };
    // Finite, and every value of the unfused chain provably below half of f32::MAX (so the
    // unfused run cannot overflow where the fused one did not; else the caller replays).
    // A Winograd attempt that fell back to the direct conv may have counted a non-finite
    // value the direct conv does not have: that only costs a replay.
    let bits = max_bits.into_inner();
    let clean = !scan || (t.dtype() == DType::F32 && grp.clean(bits));
    Ok((t, clean))
}

/// A Conv followed by per-channel affine ops with constant operands (a decomposed
/// BatchNormalization, a separate bias) and optionally a Relu, with the affine map folded
/// into the conv's weights and bias: what a GPU backend runs as one conv whose epilogue
/// adds the folded bias and applies the Relu. Same conditions and folding as the CPU's own
/// conv groups (f32, constant weights/bias, inner values with one reader and not graph
/// outputs; folded in f64; a group whose fold is not finite or has a zero scale is not
/// formed). The result differs from the unfused chain by rounding only.
#[derive(Debug, Clone)]
pub struct ConvAffineGroup {
    /// The Conv node.
    pub conv: NodeId,
    /// The chain after it, in order; the last one's value is the group's output.
    pub members: Vec<NodeId>,
    /// Folded weights (the conv's weight dims) and bias (`[M]`); `None` when the chain is a
    /// Relu alone (the conv's own weights and bias apply). Shared with the CPU executors
    /// that hold the same constants.
    pub folded: Option<(Arc<Tensor>, Arc<Tensor>)>,
    /// The chain ends in a Relu (after the residual Add when there is one).
    pub relu: bool,
    /// A residual `Add(y, skip)` after the affine chain (a ResNet shortcut; `skip` is
    /// computed before the conv), its node being the last member or the one before the Relu.
    pub residual_skip: Option<NodeId>,
}

/// The [`ConvAffineGroup`]s of `g` with at least one member, with the residual Add (and
/// Relu) after a chain that ends without an activation when `RLX_CPU_RESIDUAL` is not off
/// (chains ending in a SiLU or a Clip are left out; the CPU fuses those too).
pub fn conv_affine_groups(g: &Graph) -> Vec<ConvAffineGroup> {
    let n = g.len();
    let mut is_output = vec![false; n];
    for o in &g.outputs {
        if o.index() < n {
            is_output[o.index()] = true;
        }
    }
    let mut consumers = vec![vec![]; n];
    for node in &g.nodes {
        for i in &node.inputs {
            if i.index() < n {
                consumers[i.index()].push(node.id);
            }
        }
    }
    plan(g, &consumers, &is_output)
        .groups
        .into_iter()
        .filter(|grp| grp.members.len() > usize::from(grp.pool.is_some()))
        .filter_map(|mut grp| {
            // A MaxPool tail is the CPU's own (bands of rows); GPUs run the pool apart.
            if grp.pool.is_some() {
                grp.members.pop();
            }
            let mut relu = match grp.act {
                Epilogue::None => false,
                Epilogue::Relu => true,
                _ => return None,
            };
            let mut members = grp.members;
            let mut residual_skip = None;
            if let Some(r) = grp.residual {
                members.push(r.add);
                members.extend(r.relu);
                relu = r.relu.is_some();
                residual_skip = Some(r.skip);
            }
            let folded = match &grp.folded {
                Some(f) => Some((f.shared()?, f.bias.clone())),
                None => None,
            };
            Some(ConvAffineGroup {
                conv: grp.conv,
                members,
                folded,
                relu,
                residual_skip,
            })
        })
        .collect()
}
