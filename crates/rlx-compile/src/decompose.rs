//! Rewrite high-level ops (Softmax, LogSoftmax, LayerNorm, BatchNorm, Gelu) into primitives.
//!
//! Every node a rewrite creates keeps the source node's origin (label and source op type),
//! so a NaN inside a decomposed Softmax is reported against the ONNX Softmax node's name.
//! `Lrn` stays high-level (the CPU backend has a kernel for it).

use rlx_ir::{
    Activation, BinaryOp, DType, Dim, Graph, Node, NodeId, Op, ReduceKind, Shape, Tensor, UnaryOp,
};

/// Return a copy of `g` with every high-level op (except `Lrn`) rewritten into primitives.
/// Node ids change; outputs, output names and input declarations are kept.
pub fn decompose(g: &Graph) -> Graph {
    decompose_tagged(g, &mut Vec::new())
}

/// [`decompose`], rewriting `tags` (one entry per node, or empty) to follow the nodes: a
/// rewritten node's tag goes to the node that stands for its value (the last primitive).
pub fn decompose_tagged(g: &Graph, tags: &mut Vec<u32>) -> Graph {
    let mut out = Graph::new(&g.name);
    out.input_decls = g.input_decls.clone();
    let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
    for node in &g.nodes {
        out.set_current_origin_shared(node.origin.clone());
        out.set_current_block(node.block.clone());
        let ins: Vec<NodeId> = node.inputs.iter().map(|i| map[i.index()]).collect();
        let new = lower(&mut out, node, &ins);
        if let Some(nm) = &node.name {
            out.set_name(new, nm);
        }
        map.push(new);
    }
    out.set_current_origin(None);
    out.set_current_block(None);
    out.outputs = g.outputs.iter().map(|o| map[o.index()]).collect();
    out.output_names = g.output_names.clone();
    if !tags.is_empty() {
        let mut t = vec![0; out.len()];
        for (old, m) in map.iter().enumerate() {
            if tags[old] != 0 {
                t[m.index()] = tags[old];
            }
        }
        *tags = t;
    }
    out
}

fn keep_axes(s: &Shape, axes: &[usize]) -> Shape {
    let dims = s
        .dims
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if axes.contains(&i) {
                Dim::Static(1)
            } else {
                d.clone()
            }
        })
        .collect();
    Shape::with_dims(dims, s.dtype)
}

fn scalar(g: &mut Graph, dtype: DType, v: f64) -> NodeId {
    g.constant(Tensor::scalar(dtype, v))
}

fn lower(g: &mut Graph, node: &Node, ins: &[NodeId]) -> NodeId {
    let s = node.shape.clone();
    let dt = s.dtype;
    match &node.op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let x = ins[0];
            let red = keep_axes(&s, &[*axis]);
            let m = reduce(g, ReduceKind::Max, x, *axis, red.clone());
            let d = g.sub(x, m, s.clone());
            let e = g.unary(UnaryOp::Exp, d, s.clone());
            let sum = reduce(g, ReduceKind::Sum, e, *axis, red.clone());
            if matches!(node.op, Op::Softmax { .. }) {
                g.div(e, sum, s)
            } else {
                let l = g.unary(UnaryOp::Log, sum, red);
                g.sub(d, l, s)
            }
        }
        Op::LayerNorm { axis, epsilon } => {
            let x = ins[0];
            let axes: Vec<usize> = (*axis..s.rank()).collect();
            let red = keep_axes(&s, &axes);
            let mean = g.add_node(
                Op::Reduce {
                    kind: ReduceKind::Mean,
                    axes: axes.clone(),
                    keepdims: true,
                },
                vec![x],
                red.clone(),
            );
            let xc = g.sub(x, mean, s.clone());
            let sq = g.mul(xc, xc, s.clone());
            let var = g.add_node(
                Op::Reduce {
                    kind: ReduceKind::Mean,
                    axes,
                    keepdims: true,
                },
                vec![sq],
                red.clone(),
            );
            let eps = scalar(g, dt, *epsilon as f64);
            let ve = g.add(var, eps, red.clone());
            let den = g.unary(UnaryOp::Sqrt, ve, red);
            let nrm = g.div(xc, den, s.clone());
            let y = g.mul(nrm, ins[1], s.clone());
            match ins.get(2) {
                Some(&b) => g.add(y, b, s),
                None => y,
            }
        }
        Op::BatchNorm { epsilon } => {
            // y = (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1).
            let rank = s.rank();
            let c = s.dims.get(1).cloned().unwrap_or(Dim::Static(1));
            let mut pdims = vec![Dim::Static(1); rank.max(2)];
            pdims[1] = c;
            pdims.remove(0);
            let ps = Shape::with_dims(pdims.clone(), dt);
            let rs = |g: &mut Graph, v: NodeId| {
                g.add_node(
                    Op::Reshape {
                        dims: ps.dims_usize().to_vec(),
                    },
                    vec![v],
                    ps.clone(),
                )
            };
            let (scale, bias, mean, var) =
                (rs(g, ins[1]), rs(g, ins[2]), rs(g, ins[3]), rs(g, ins[4]));
            let eps = scalar(g, dt, *epsilon as f64);
            let ve = g.add(var, eps, ps.clone());
            let den = g.unary(UnaryOp::Sqrt, ve, ps.clone());
            let k = g.div(scale, den, ps.clone());
            let xc = g.sub(ins[0], mean, s.clone());
            let y = g.mul(xc, k, s.clone());
            g.add(y, bias, s)
        }
        Op::Activation(a @ (Activation::Gelu | Activation::GeluTanh)) => {
            // float16/bfloat16 run in float32 and round once (`x · gate` overflows f16 at
            // x = 65504 where the result is x, and every rounding between steps costs an ulp).
            let half_type = matches!(dt, DType::F16 | DType::BF16);
            let (x, cs) = if half_type {
                let fs = Shape::with_dims(s.dims.clone(), DType::F32);
                let xc = g.add_node(
                    Op::Cast {
                        to: DType::F32,
                        saturate: true,
                    },
                    vec![ins[0]],
                    fs.clone(),
                );
                (xc, fs)
            } else {
                (ins[0], s.clone())
            };
            let cdt = cs.dtype;
            let y = if matches!(a, Activation::Gelu) {
                // Stays one op: `x/2 (1 + erf(x/√2))` built from primitives cancels in `1 + erf`
                // for negative x (bf16 Gelu(-5) 6% off, Gelu(-6) = 0 where it is -5.9e-9);
                // the kernel uses `x/2 erfc(-x/√2)` there (`rlx_ir::Activation::apply_f64`,
                // the CPU's `fastmath::gelu_slice`).
                g.activation(Activation::Gelu, x, cs.clone())
            } else {
                // 0.5 x (1 + tanh(u)) = x · sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3):
                // `1 + tanh(u)` cancels for negative x (Gelu_tanh(-5) was 30% off); the
                // sigmoid of a very negative argument keeps its digits. x^3 overflowing to
                // ±inf for huge |x| gives sigmoid 1 or 0, the limits (x or -0).
                let x2 = g.mul(x, x, cs.clone());
                let x3 = g.mul(x2, x, cs.clone());
                let k = scalar(g, cdt, 0.044715);
                let kx3 = g.mul(x3, k, cs.clone());
                let inner = g.add(x, kx3, cs.clone());
                let c = scalar(g, cdt, 2.0 * (2.0 / std::f64::consts::PI).sqrt());
                let ci = g.mul(inner, c, cs.clone());
                let sg = g.activation(Activation::Sigmoid, ci, cs.clone());
                g.mul(x, sg, cs.clone())
            };
            if half_type {
                g.add_node(
                    Op::Cast {
                        to: dt,
                        saturate: true,
                    },
                    vec![y],
                    s,
                )
            } else {
                y
            }
        }
        op => g.add_node(op.clone(), ins.to_vec(), s),
    }
}

fn reduce(g: &mut Graph, kind: ReduceKind, x: NodeId, axis: usize, shape: Shape) -> NodeId {
    g.add_node(
        Op::Reduce {
            kind,
            axes: vec![axis],
            keepdims: true,
        },
        vec![x],
        shape,
    )
}

#[allow(dead_code)]
fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId, s: Shape) -> NodeId {
    g.binary(op, a, b, s)
}
