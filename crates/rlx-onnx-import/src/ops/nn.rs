//! Neural-network ops: activations, Softmax, Conv, pooling, normalizations, Dropout.

use crate::ctx::{norm_axis, to_usizes, Ctx, ONode, R};
use rlx_ir::{
    Activation, BinaryOp, ConvAttrs, DType, NodeId, Op, PoolAttrs, PoolKind, ReduceKind, Tensor,
};

fn act(cx: &mut Ctx, n: &ONode, a: Activation) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![cx.add(Op::Activation(a), vec![x])?])
}

pub fn relu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::Relu)
}
pub fn leaky_relu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let alpha = n.f("alpha", 0.01)?;
    act(cx, n, Activation::LeakyRelu { alpha })
}
pub fn sigmoid(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::Sigmoid)
}
pub fn tanh(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::Tanh)
}
/// ONNX Gelu (opset 20): `approximate = "none"` (erf) or `"tanh"`.
pub fn gelu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let a = match n.s("approximate", "none")?.as_str() {
        "none" => Activation::Gelu,
        "tanh" => Activation::GeluTanh,
        o => return Err(format!("unknown approximate \"{o}\"")),
    };
    act(cx, n, a)
}
pub fn elu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let alpha = n.f("alpha", 1.0)?;
    act(cx, n, Activation::Elu { alpha })
}
pub fn selu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let alpha = n.f("alpha", 1.673_263_2)?;
    let gamma = n.f("gamma", 1.050_701)?;
    act(cx, n, Activation::Selu { alpha, gamma })
}
pub fn hard_sigmoid(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let alpha = n.f("alpha", 0.2)?;
    let beta = n.f("beta", 0.5)?;
    act(cx, n, Activation::HardSigmoid { alpha, beta })
}
pub fn hard_swish(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::HardSwish)
}
pub fn softplus(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::Softplus)
}
pub fn softsign(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    act(cx, n, Activation::Softsign)
}

/// ONNX PRelu: `x < 0 ? slope * x : x` with `slope` broadcast to x.
pub fn prelu(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, slope) = (n.inp(0)?, n.inp(1)?);
    let zero = cx.scalar(cx.dtype(x), 0.0);
    let neg = cx.binary(BinaryOp::Lt, x, zero)?;
    let scaled = cx.binary(BinaryOp::Mul, x, slope)?;
    Ok(vec![cx.add(Op::Select, vec![neg, scaled, x])?])
}

fn softmax_like(cx: &mut Ctx, n: &ONode, log: bool) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let mk = |axis| {
        if log {
            Op::LogSoftmax { axis }
        } else {
            Op::Softmax { axis }
        }
    };
    if n.opset >= 13 {
        let axis = norm_axis(n.i("axis", -1)?, r)?;
        return Ok(vec![cx.add(mk(axis), vec![x])?]);
    }
    // Opset < 13: input coerced to 2-D [prod(dims[..axis]), prod(dims[axis..])].
    let axis = if r == 0 {
        0
    } else {
        norm_axis(n.i("axis", 1)?, r)?
    };
    if r > 0 && axis == r - 1 {
        return Ok(vec![cx.add(mk(axis), vec![x])?]);
    }
    if cx.is_symbolic(x) {
        let sd = cx.sdims(x);
        let flat = super::shape::flatten_sym(cx, x, axis)?;
        let y = cx.add(mk(1), vec![flat])?;
        return Ok(vec![cx.reshape_sym(y, sd)?]);
    }
    let d = cx.dims(x);
    let flat = cx.reshape(
        x,
        vec![d[..axis].iter().product(), d[axis..].iter().product()],
    )?;
    let y = cx.add(mk(1), vec![flat])?;
    Ok(vec![cx.reshape(y, d)?])
}

/// ONNX Softmax; opset < 13 coerces the input to 2-D around `axis` (default 1).
pub fn softmax(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    softmax_like(cx, n, false)
}
pub fn log_softmax(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    softmax_like(cx, n, true)
}

/// Spatial window attributes shared by Conv and pooling, with `auto_pad` resolved.
struct Window {
    strides: Vec<usize>,
    pads: Vec<(usize, usize)>,
    dilations: Vec<usize>,
}

fn window(n: &ONode, in_spatial: &[usize], kernel: &[usize], dilations_attr: bool) -> R<Window> {
    let ns = in_spatial.len();
    let get = |name: &str, def: usize| n.spatial_ints(name, ns, def);
    let strides = get("strides", 1)?;
    let dilations = if dilations_attr {
        get("dilations", 1)?
    } else {
        vec![1; ns]
    };
    let auto_pad = n.s("auto_pad", "NOTSET")?;
    let pads = match auto_pad.as_str() {
        "NOTSET" => match n.ints("pads")? {
            Some(p) => {
                let p = to_usizes(&p, "pads")?;
                if p.len() != 2 * ns {
                    return Err(format!("pads {p:?} needs {} entries", 2 * ns));
                }
                (0..ns).map(|i| (p[i], p[i + ns])).collect()
            }
            None => vec![(0, 0); ns],
        },
        "VALID" => vec![(0, 0); ns],
        "SAME_UPPER" | "SAME_LOWER" => (0..ns)
            .map(|i| {
                let out = in_spatial[i].div_ceil(strides[i].max(1));
                let span = dilations[i]
                    .saturating_mul(kernel[i].max(1) - 1)
                    .saturating_add(1);
                let total = out
                    .saturating_sub(1)
                    .saturating_mul(strides[i])
                    .saturating_add(span)
                    .saturating_sub(in_spatial[i]);
                if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .collect(),
        o => return Err(format!("unknown auto_pad \"{o}\"")),
    };
    Ok(Window {
        strides,
        pads,
        dilations,
    })
}

/// `auto_pad = SAME_*` computes pads from the input's spatial sizes: in a symbolic import
/// with a symbolic spatial size and a stride over 1 that taints the import (the pads would
/// be the probe's). With stride 1 the pads are `span - 1` split, whatever the size (at
/// least 1: a guard), so the import stays symbolic.
fn same_pads_read(cx: &mut Ctx, n: &ONode, x: NodeId) -> R<()> {
    if n.s("auto_pad", "NOTSET")?.starts_with("SAME") {
        let r = cx.rank(x);
        let strides = n.spatial_ints("strides", r.saturating_sub(2), 1)?;
        for a in 2..r {
            if !cx.dim_is_symbolic(x, a) {
                continue;
            }
            if strides.get(a - 2) != Some(&1) {
                cx.sym_taint("auto_pad SAME with a stride over 1 on a symbolic spatial size");
                return Ok(());
            }
            let d = cx.sdims(x)[a].clone();
            let empty = match cx.sym.as_mut() {
                Some(s) => s.decide_lt(&d, &rlx_ir::sym::DimExpr::from(1))?,
                None => false,
            };
            if empty {
                cx.sym_taint("auto_pad SAME on an empty symbolic spatial size");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// ONNX Conv (any spatial rank), `auto_pad` resolved to explicit pads.
pub fn conv(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, w) = (n.inp(0)?, n.inp(1)?);
    Ok(vec![conv_on(cx, n, x, w, n.opt(2))?])
}

/// A Conv node on `x`, `w` (and `bias`) with the node's attributes.
pub(crate) fn conv_on(
    cx: &mut Ctx,
    n: &ONode,
    x: NodeId,
    w: NodeId,
    bias: Option<NodeId>,
) -> R<NodeId> {
    // Batch and spatial sizes are read only for SAME padding (`same_pads_read`).
    let (xd, wd) = (cx.dims_unchecked(x), cx.dims(w));
    same_pads_read(cx, n, x)?;
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(format!(
            "X {} and W {} must have the same rank >= 3",
            cx.shape(x),
            cx.shape(w)
        ));
    }
    let kernel = match n.ints("kernel_shape")? {
        Some(k) => to_usizes(&k, "kernel_shape")?,
        None => wd[2..].to_vec(),
    };
    if kernel != wd[2..] {
        return Err(format!(
            "kernel_shape {kernel:?} does not match W {}",
            cx.shape(w)
        ));
    }
    let win = window(n, &xd[2..], &kernel, true)?;
    let groups = n.i("group", 1)?;
    let attrs = ConvAttrs {
        strides: win.strides,
        pads: win.pads,
        dilations: win.dilations,
        groups: usize::try_from(groups).map_err(|_| format!("bad group {groups}"))?,
    };
    let mut ins = vec![x, w];
    ins.extend(bias);
    cx.add(Op::Conv(attrs), ins)
}

fn pool(cx: &mut Ctx, n: &ONode, kind: PoolKind, dilations: bool) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    Ok(vec![pool_on(cx, n, x, kind, dilations)?])
}

/// A pooling node of `kind` on `x` with the node's window attributes.
pub(crate) fn pool_on(
    cx: &mut Ctx,
    n: &ONode,
    x: NodeId,
    kind: PoolKind,
    dilations: bool,
) -> R<NodeId> {
    let attrs = pool_attrs(cx, n, x, kind, dilations)?;
    cx.add(Op::Pool(attrs), vec![x])
}

/// The node's pooling attributes for `x` (kernel, strides, resolved pads, dilations).
pub(crate) fn pool_attrs(
    cx: &mut Ctx,
    n: &ONode,
    x: NodeId,
    kind: PoolKind,
    dilations: bool,
) -> R<PoolAttrs> {
    // Batch and spatial sizes are read only for SAME padding (`same_pads_read`).
    let xd = cx.dims_unchecked(x);
    same_pads_read(cx, n, x)?;
    if xd.len() < 3 {
        return Err(format!("X {} must have rank >= 3", cx.shape(x)));
    }
    let kernel = to_usizes(
        &n.ints("kernel_shape")?
            .ok_or("kernel_shape attribute is required")?,
        "kernel_shape",
    )?;
    if kernel.len() != xd.len() - 2 {
        return Err(format!(
            "kernel_shape {kernel:?} needs {} entries",
            xd.len() - 2
        ));
    }
    let win = window(n, &xd[2..], &kernel, dilations)?;
    let attrs = PoolAttrs {
        kind,
        kernel,
        strides: win.strides,
        pads: win.pads,
        dilations: win.dilations,
        ceil_mode: n.i("ceil_mode", 0)? != 0,
    };
    Ok(attrs)
}

/// ONNX MaxPool (dilations from opset 10, ceil_mode; the Indices output, with
/// `storage_order`, is lowered by `pool_index::max_pool_indices`).
pub fn max_pool(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let y = pool_on(cx, n, x, PoolKind::Max, true)?;
    if !n.wants_output(1) {
        return Ok(vec![y]);
    }
    let attrs = pool_attrs(cx, n, x, PoolKind::Max, true)?;
    let col_major = match n.i("storage_order", 0)? {
        0 => false,
        1 => true,
        o => return Err(format!("storage_order {o} must be 0 or 1")),
    };
    let z = super::pool_index::max_pool_indices(cx, x, &attrs, col_major)?;
    Ok(vec![y, z])
}

/// ONNX AveragePool (count_include_pad; dilations from opset 19).
pub fn average_pool(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let count_include_pad = n.i("count_include_pad", 0)? != 0;
    pool(cx, n, PoolKind::Avg { count_include_pad }, true)
}

fn global_pool(cx: &mut Ctx, n: &ONode, kind: ReduceKind) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    if r < 3 {
        return Err(format!("X {} must have rank >= 3", cx.shape(x)));
    }
    let op = Op::Reduce {
        kind,
        axes: (2..r).collect(),
        keepdims: true,
    };
    Ok(vec![cx.add(op, vec![x])?])
}

/// ONNX GlobalAveragePool → ReduceMean over the spatial axes, keepdims.
pub fn global_average_pool(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    global_pool(cx, n, ReduceKind::Mean)
}
/// ONNX GlobalMaxPool → ReduceMax over the spatial axes, keepdims.
pub fn global_max_pool(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    global_pool(cx, n, ReduceKind::Max)
}

/// ONNX BatchNormalization (inference form; the training-mode outputs are not supported).
pub fn batch_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    if (1..5).any(|i| n.wants_output(i)) || n.i("training_mode", 0)? != 0 {
        return Err("training mode (running mean/var outputs) is not supported".into());
    }
    let ins = (0..5).map(|i| n.inp(i)).collect::<R<Vec<_>>>()?;
    let epsilon = n.f("epsilon", 1e-5)?;
    Ok(vec![cx.add(Op::BatchNorm { epsilon }, ins)?])
}

/// ONNX LayerNormalization (opset 17) over axes `axis..rank`; the Mean / InvStdDev
/// outputs are not supported.
pub fn layer_norm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    if n.wants_output(1) || n.wants_output(2) {
        return Err("the Mean / InvStdDev outputs are not supported".into());
    }
    let x = n.inp(0)?;
    let axis = norm_axis(n.i("axis", -1)?, cx.rank(x))?;
    let epsilon = n.f("epsilon", 1e-5)?;
    let dt = cx.dtype(x);
    // stash_type (default 1 = float32): the function body casts X to float32 for the mean,
    // the variance and the normalized value ("stage one"), so a float16 row whose squares
    // overflow float16 is still normalized correctly. Scale and bias are applied in float32
    // too and the result cast back once (within one rounding of the body's f16 Mul/Add).
    let stash = matches!(dt, DType::F16 | DType::BF16) && n.i("stash_type", 1)? == 1;
    if stash {
        let xs = cx.cast(x, DType::F32)?;
        let mut ins = vec![xs, cx.cast(n.inp(1)?, DType::F32)?];
        if let Some(b) = n.opt(2) {
            ins.push(cx.cast(b, DType::F32)?);
        }
        let y = cx.add(Op::LayerNorm { axis, epsilon }, ins)?;
        return Ok(vec![cx.cast(y, dt)?]);
    }
    let mut ins = vec![x, n.inp(1)?];
    ins.extend(n.opt(2));
    Ok(vec![cx.add(Op::LayerNorm { axis, epsilon }, ins)?])
}

/// ONNX LRN across channels.
pub fn lrn(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let size = n.i("size", 0)?;
    if size <= 0 {
        return Err("size attribute must be a positive integer".into());
    }
    let op = Op::Lrn {
        size: size as usize,
        alpha: n.f("alpha", 1e-4)?,
        beta: n.f("beta", 0.75)?,
        bias: n.f("bias", 1.0)?,
    };
    Ok(vec![cx.add(op, vec![x])?])
}

/// ONNX Dropout at inference: the identity. A requested mask output is all-true.
pub fn dropout(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let mut outs = vec![x];
    if n.wants_output(1) {
        let t = cx.constant(Tensor::scalar(DType::Bool, 1.0));
        // The mask has x's shape, symbolic sizes included (a symbolic import).
        if cx.is_symbolic(x) {
            let sd = cx.sdims(x);
            outs.push(cx.broadcast_sym(t, sd)?);
        } else {
            outs.push(cx.add(Op::Broadcast { dims: cx.dims(x) }, vec![t])?);
        }
    }
    Ok(outs)
}
