//! Streaming sequence-mixing ops of opset 27, lowered onto primitives as the ONNX reference
//! implementation computes them:
//!
//! * `CausalConvWithState`: depthwise causal Conv1d over `concat(past_state | zeros, input)`,
//!   optional SiLU, and the last `k - 1` steps as the present state;
//! * `LinearAttention`: the recurrent state `[B, H_kv, d_k, d_v]` unrolled over the
//!   (static) sequence, with the `linear`, `gated`, `delta` and `gated_delta` update rules
//!   and GQA reads; computed in f32.

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{Activation, BinaryOp, ConvAttrs, DType, NodeId, Op, Tensor, UnaryOp};

/// ONNX CausalConvWithState: outputs `[output, present_state]`.
pub fn causal_conv_with_state(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, w) = (n.inp(0)?, n.inp(1)?);
    let (xd, wd) = (cx.dims(x), cx.dims(w));
    if xd.len() != 3 || wd.len() != 3 || wd[0] != xd[1] || wd[1] != 1 || wd[2] == 0 {
        return Err(format!(
            "input {} must be [B, C, L] and weight {} [C, 1, k]",
            cx.shape(x),
            cx.shape(w)
        ));
    }
    let (b, c, k) = (xd[0], xd[1], wd[2]);
    let act = n.s("activation", "none")?;
    if !matches!(act.as_str(), "none" | "silu" | "swish") {
        return Err(format!("unknown activation \"{act}\""));
    }
    let dt = cx.dtype(x);
    let past = match n.opt(3) {
        Some(p) => p,
        None => {
            let z = cx.constant(Tensor::scalar(dt, 0.0));
            cx.add(
                Op::Broadcast {
                    dims: vec![b, c, k - 1],
                },
                vec![z],
            )?
        }
    };
    let padded = if k > 1 {
        cx.add(Op::Concat { axis: 2 }, vec![past, x])?
    } else {
        x
    };
    let attrs = ConvAttrs {
        strides: vec![1],
        pads: vec![(0, 0)],
        dilations: vec![1],
        groups: c,
    };
    let mut ins = vec![padded, w];
    ins.extend(n.opt(2));
    let mut y = cx.add(Op::Conv(attrs), ins)?;
    if act != "none" {
        let yf = cx.cast(y, DType::F32)?;
        let s = cx.add(Op::Activation(Activation::Silu), vec![yf])?;
        y = cx.cast(s, dt)?;
    }
    let pl = cx.dims(padded)[2];
    let state = cx.add(
        Op::Slice {
            starts: vec![0, 0, pl - (k - 1)],
            steps: vec![1, 1, 1],
            sizes: vec![b, c, k - 1],
        },
        vec![padded],
    )?;
    Ok(vec![y, state])
}

/// `[B, T, H*D]` → `[B, H, T, D]`.
fn heads(cx: &mut Ctx, x: NodeId, h: usize, what: &str) -> R<NodeId> {
    let d = cx.dims(x);
    if d.len() != 3 || h == 0 || !d[2].is_multiple_of(h) {
        return Err(format!("{what} {} is not [B, T, {h} * D]", cx.shape(x)));
    }
    let y = cx.reshape(x, vec![d[0], d[1], h, d[2] / h])?;
    cx.add(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![y],
    )
}

/// Step `t` of axis 2 (kept, size 1).
fn step(cx: &mut Ctx, x: NodeId, t: usize) -> R<NodeId> {
    super::shape::slice_axis(cx, x, 2, t, 1)
}

/// ONNX LinearAttention (opset 27): outputs `[output [B, T, H_q * d_v], present_state]`.
pub fn linear_attention(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (q, k, v) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let (past, decay, beta) = (n.opt(3), n.opt(4), n.opt(5));
    let rule = n.s("update_rule", "gated_delta")?;
    let (gating, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        o => return Err(format!("unknown update_rule \"{o}\"")),
    };
    if gating != decay.is_some() || delta != beta.is_some() {
        return Err(format!(
            "update_rule \"{rule}\" needs decay: {gating}, beta: {delta}"
        ));
    }
    let hq = n.i("q_num_heads", 0)?;
    let hk = n.i("kv_num_heads", 0)?;
    if hq <= 0 || hk <= 0 || hq % hk != 0 {
        return Err(format!(
            "q_num_heads {hq} must be a positive multiple of kv_num_heads {hk}"
        ));
    }
    let (hq, hk) = (hq as usize, hk as usize);
    let out_dt = cx.dtype(q);
    let f = DType::F32;
    let q4 = heads(cx, q, hq, "query")?;
    let q4 = cx.cast(q4, f)?;
    let k4 = heads(cx, k, hk, "key")?;
    let k4 = cx.cast(k4, f)?;
    let v4 = heads(cx, v, hk, "value")?;
    let v4 = cx.cast(v4, f)?;
    let qd = cx.dims(q4);
    let (b, t_len, dk) = (qd[0], qd[2], qd[3]);
    let dv = cx.dims(v4)[3];
    if cx.dims(k4)[3] != dk || cx.dims(k4)[2] != t_len || cx.dims(v4)[2] != t_len {
        return Err("query, key and value do not agree on length / head size".into());
    }
    let decay4 = match decay {
        Some(g) => {
            let gd = cx.dims(g);
            let last = *gd.last().unwrap_or(&0);
            let g4 = if gd.len() == 3 && last == hk {
                let y = cx.reshape(g, vec![b, t_len, hk, 1])?;
                cx.add(
                    Op::Transpose {
                        perm: vec![0, 2, 1, 3],
                    },
                    vec![y],
                )?
            } else if gd.len() == 3 && last == hk * dk {
                heads(cx, g, hk, "decay")?
            } else {
                return Err(format!("decay {} does not fit the heads", cx.shape(g)));
            };
            Some(cx.cast(g4, f)?)
        }
        None => None,
    };
    let beta4 = match beta {
        Some(be) => {
            let bd = cx.dims(be);
            let last = *bd.last().unwrap_or(&0);
            if bd.len() != 3 || !(last == hk || last == 1) {
                return Err(format!("beta {} does not fit the heads", cx.shape(be)));
            }
            let y = cx.reshape(be, vec![b, t_len, last, 1])?;
            let y = cx.add(
                Op::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                vec![y],
            )?;
            Some(cx.cast(y, f)?)
        }
        None => None,
    };
    let state_dt = past.map(|p| cx.dtype(p)).unwrap_or(out_dt);
    let mut state = match past {
        Some(p) => {
            if cx.dims(p) != [b, hk, dk, dv] {
                return Err(format!(
                    "past_state {} is not [{b}, {hk}, {dk}, {dv}]",
                    cx.shape(p)
                ));
            }
            cx.cast(p, f)?
        }
        None => {
            let z = cx.constant(Tensor::scalar(f, 0.0));
            cx.add(
                Op::Broadcast {
                    dims: vec![b, hk, dk, dv],
                },
                vec![z],
            )?
        }
    };
    let scale = match n.attr("scale") {
        Some(a) if a.f != 0.0 => a.f as f64,
        _ => 1.0 / (dk as f64).sqrt(),
    };
    let scale = cx.scalar(f, scale);
    let group = hq / hk;
    let mut outs = Vec::with_capacity(t_len);
    for t in 0..t_len {
        let qt = step(cx, q4, t)?; // [B, Hq, 1, dk]
        let kt = step(cx, k4, t)?; // [B, Hk, 1, dk]
        let mut vt = step(cx, v4, t)?; // [B, Hk, 1, dv]
        if let Some(g) = decay4 {
            let gt = step(cx, g, t)?; // [B, Hk, 1, 1|dk]
            let gl = cx.dims(gt)[3];
            let gt = cx.reshape(gt, vec![b, hk, gl, 1])?;
            let e = cx.unary(UnaryOp::Exp, gt)?;
            state = cx.binary(BinaryOp::Mul, state, e)?;
        }
        if let Some(be) = beta4 {
            let ret = cx.add(Op::MatMul, vec![kt, state])?; // [B, Hk, 1, dv]
            let d = cx.binary(BinaryOp::Sub, vt, ret)?;
            let bt = step(cx, be, t)?; // [B, Hk|1, 1, 1]
            vt = cx.binary(BinaryOp::Mul, bt, d)?;
        }
        let kc = cx.reshape(kt, vec![b, hk, dk, 1])?;
        let kv = cx.add(Op::MatMul, vec![kc, vt])?; // [B, Hk, dk, dv]
        state = cx.binary(BinaryOp::Add, state, kv)?;
        let read = if group == 1 {
            state
        } else {
            let y = cx.reshape(state, vec![b, hk, 1, dk, dv])?;
            let y = cx.add(
                Op::Broadcast {
                    dims: vec![b, hk, group, dk, dv],
                },
                vec![y],
            )?;
            cx.reshape(y, vec![b, hq, dk, dv])?
        };
        let o = cx.add(Op::MatMul, vec![qt, read])?; // [B, Hq, 1, dv]
        outs.push(cx.binary(BinaryOp::Mul, o, scale)?);
    }
    let y = if outs.len() == 1 {
        outs[0]
    } else {
        cx.add(Op::Concat { axis: 2 }, outs)?
    };
    let y = cx.add(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![y],
    )?;
    let y = cx.reshape(y, vec![b, t_len, hq * dv])?;
    Ok(vec![cx.cast(y, out_dt)?, cx.cast(state, state_dt)?])
}
