//! ONNX Attention (opset 23-25) lowered onto MatMul / Softmax-steps / Select, following
//! the ONNX reference implementation (`onnx/reference/ops/op_attention.py`):
//!
//! * 3-D `[B, S, H*D]` inputs are split into heads with `q_num_heads` / `kv_num_heads`;
//! * `past_key` / `past_value` are concatenated along the sequence axis (present outputs);
//! * the additive bias combines `attn_mask` (bool: false → -inf; padded with -inf up to the
//!   total KV length), the causal mask (bottom-right aligned by the past length, or per batch
//!   by `nonpad_kv_seqlen - q_len`), the sliding window (`left/right_window_size`) and the
//!   `nonpad_kv_seqlen` padding mask;
//! * GQA repeats each KV head `q_heads / kv_heads` times;
//! * `Q` and `K` are each scaled by `sqrt(scale)`, `softcap` applies `c * tanh(qk / c)`;
//! * the softmax is the reference's masked-row-safe form (a row that is all -inf gives 0);
//! * `qk_matmul_output_mode` 0/1: QK (after softcap), 2: QK + bias, 3: the softmax.

use crate::ctx::{Ctx, ONode, R};
use crate::proto::attr_type;
use crate::tensor::{dtype_of, onnx_type_name};
use rlx_ir::{
    Activation, BinaryOp, DType, NodeId, Op, PadMode, ReduceKind, Tensor, TensorData, UnaryOp,
};

/// `[B, S, H*D]` → `[B, H, S, D]`.
fn split_heads(cx: &mut Ctx, x: NodeId, heads: usize, what: &str) -> R<NodeId> {
    let d = cx.dims(x);
    if heads == 0 || !d[2].is_multiple_of(heads) {
        return Err(format!(
            "{what} hidden size {} is not divisible by {heads} heads",
            d[2]
        ));
    }
    let y = cx.reshape(x, vec![d[0], d[1], heads, d[2] / heads])?;
    cx.add(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![y],
    )
}

/// A `[q, kv]` constant bias: 0 where `allowed(i, j)`, -inf elsewhere.
fn static_bias(
    cx: &mut Ctx,
    dt: DType,
    q: usize,
    kv: usize,
    allowed: impl Fn(i64, i64) -> bool,
) -> R<NodeId> {
    let v: Vec<f64> = (0..q * kv)
        .map(|k| {
            if allowed((k / kv) as i64, (k % kv) as i64) {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let t = Tensor::new(vec![q, kv], TensorData::from_f64(dt, &v)).map_err(|e| e.to_string())?;
    Ok(cx.constant(t))
}

/// Whether query `i` (absolute position `i + offset`) may attend key `j` under the causal
/// and sliding-window rules.
fn allowed(i: i64, j: i64, offset: i64, causal: bool, left: i64, right: i64) -> bool {
    let diff = i + offset - j;
    (!causal || diff >= 0) && (left < 0 || diff <= left) && (right < 0 || -diff <= right)
}

fn add_opt(cx: &mut Ctx, a: Option<NodeId>, b: NodeId) -> R<NodeId> {
    match a {
        Some(a) => cx.binary(BinaryOp::Add, a, b),
        None => Ok(b),
    }
}

/// The reference's masked-row-safe softmax over the last axis.
fn safe_softmax(cx: &mut Ctx, x: NodeId) -> R<NodeId> {
    let r = cx.rank(x);
    let dt = cx.dtype(x);
    let red = |kind| Op::Reduce {
        kind,
        axes: vec![r - 1],
        keepdims: true,
    };
    let m = cx.add(red(ReduceKind::Max), vec![x])?;
    let ninf = cx.unary(
        UnaryOp::IsInf {
            pos: false,
            neg: true,
        },
        m,
    )?;
    let zero = cx.scalar(dt, 0.0);
    let one = cx.scalar(dt, 1.0);
    let m = cx.add(Op::Select, vec![ninf, zero, m])?;
    let d = cx.binary(BinaryOp::Sub, x, m)?;
    let e = cx.unary(UnaryOp::Exp, d)?;
    let s = cx.add(red(ReduceKind::Sum), vec![e])?;
    let s0 = cx.binary(BinaryOp::Eq, s, zero)?;
    let s = cx.add(Op::Select, vec![s0, one, s])?;
    cx.binary(BinaryOp::Div, e, s)
}

/// ONNX Attention; outputs `[Y, present_key, present_value, qk_matmul_output]`.
pub fn attention(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (mut q, mut k, mut v) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let rank = cx.rank(q);
    if cx.rank(k) != rank || cx.rank(v) != rank || !(rank == 3 || rank == 4) {
        return Err(format!(
            "Q {}, K {}, V {} must all be 3-D or all 4-D",
            cx.shape(q),
            cx.shape(k),
            cx.shape(v)
        ));
    }
    let dt = cx.dtype(q);
    if rank == 3 {
        let qh = n.i("q_num_heads", 0)?;
        let kh = n.i("kv_num_heads", 0)?;
        if qh <= 0 || kh <= 0 {
            return Err("3-D inputs need positive q_num_heads and kv_num_heads".into());
        }
        q = split_heads(cx, q, qh as usize, "Q")?;
        k = split_heads(cx, k, kh as usize, "K")?;
        v = split_heads(cx, v, kh as usize, "V")?;
    }
    let (qd, kd) = (cx.dims(q), cx.dims(k));
    let (batch, hq, q_len, head) = (qd[0], qd[1], qd[2], qd[3]);
    let hk = kd[1];
    if cx.dims(v)[1] != hk || kd[3] != head {
        return Err(format!(
            "K {} / V {} do not fit Q {}",
            cx.shape(k),
            cx.shape(v),
            cx.shape(q)
        ));
    }

    // Present KV.
    let (past_k, past_v) = (n.opt(4), n.opt(5));
    if past_k.is_some() != past_v.is_some() {
        return Err("past_key and past_value must be given together".into());
    }
    let past_len = past_k
        .map(|p| cx.dims(p).get(2).copied().unwrap_or(0))
        .unwrap_or(0);
    if let (Some(pk), Some(pv)) = (past_k, past_v) {
        k = cx.add(Op::Concat { axis: 2 }, vec![pk, k])?;
        v = cx.add(Op::Concat { axis: 2 }, vec![pv, v])?;
    }
    let (present_k, present_v) = (k, v);
    let kv_len = cx.dims(k)[2];
    let nonpad = n.opt(6);
    if nonpad.is_some() && past_k.is_some() {
        return Err("nonpad_kv_seqlen cannot be combined with past_key / past_value".into());
    }

    // Additive bias.
    let ninf = cx.scalar(dt, f64::NEG_INFINITY);
    let zero = cx.scalar(dt, 0.0);
    let mut bias: Option<NodeId> = None;
    if let Some(m) = n.opt(3) {
        let mut m = if cx.dtype(m) == DType::Bool {
            cx.add(Op::Select, vec![m, zero, ninf])?
        } else {
            cx.cast(m, dt)?
        };
        let md = cx.dims(m);
        let last = *md.last().ok_or("attn_mask must have rank >= 1")?;
        if last < kv_len {
            let mut pads = vec![(0, 0); md.len()];
            let nl = pads.len();
            pads[nl - 1] = (0, kv_len - last);
            m = cx.add(
                Op::Pad {
                    pads,
                    mode: PadMode::Constant(f64::NEG_INFINITY),
                },
                vec![m],
            )?;
        }
        bias = Some(m);
    }
    let causal = n.i("is_causal", 0)? != 0;
    let left = n.i("left_window_size", -1)?;
    let right = n.i("right_window_size", -1)?;
    let windowed = left >= 0 || right >= 0;
    if causal || windowed {
        match nonpad {
            None => {
                let off = past_len as i64;
                let b = static_bias(cx, dt, q_len, kv_len, |i, j| {
                    allowed(i, j, off, causal, left, right)
                })?;
                bias = Some(add_opt(cx, bias, b)?);
            }
            Some(np) => {
                // Per-batch offset = nonpad_kv_seqlen[b] - q_len; diff = i + offset - j.
                let np = cx.cast(np, DType::I64)?;
                let np = cx.reshape(np, vec![batch, 1, 1])?;
                let ql = cx.scalar(DType::I64, q_len as f64);
                let off = cx.binary(BinaryOp::Sub, np, ql)?;
                let ij: Vec<i64> = (0..q_len * kv_len)
                    .map(|t| (t / kv_len) as i64 - (t % kv_len) as i64)
                    .collect();
                let ij =
                    cx.constant(Tensor::from_i64(&[q_len, kv_len], ij).map_err(|e| e.to_string())?);
                let diff = cx.binary(BinaryOp::Add, ij, off)?;
                let mut ok: Option<NodeId> = None;
                let z = cx.scalar(DType::I64, 0.0);
                let mut and = |cx: &mut Ctx, c: NodeId| -> R<()> {
                    ok = Some(match ok {
                        Some(o) => cx.binary(BinaryOp::And, o, c)?,
                        None => c,
                    });
                    Ok(())
                };
                if causal {
                    let c = cx.binary(BinaryOp::Ge, diff, z)?;
                    and(cx, c)?;
                }
                if left >= 0 {
                    let l = cx.scalar(DType::I64, left as f64);
                    let c = cx.binary(BinaryOp::Le, diff, l)?;
                    and(cx, c)?;
                }
                if right >= 0 {
                    let r = cx.scalar(DType::I64, -right as f64);
                    let c = cx.binary(BinaryOp::Ge, diff, r)?;
                    and(cx, c)?;
                }
                if let Some(ok) = ok {
                    let b = cx.add(Op::Select, vec![ok, zero, ninf])?;
                    let b = cx.reshape(b, vec![batch, 1, q_len, kv_len])?;
                    bias = Some(add_opt(cx, bias, b)?);
                }
            }
        }
    }
    if let Some(np) = nonpad {
        let np = cx.cast(np, DType::I64)?;
        let np = cx.reshape(np, vec![batch, 1, 1, 1])?;
        let j: Vec<i64> = (0..kv_len as i64).collect();
        let j = cx.constant(Tensor::from_i64(&[kv_len], j).map_err(|e| e.to_string())?);
        let ok = cx.binary(BinaryOp::Lt, j, np)?;
        let b = cx.add(Op::Select, vec![ok, zero, ninf])?;
        bias = Some(add_opt(cx, bias, b)?);
    }

    // GQA: repeat each KV head.
    if hq != hk {
        if hk == 0 || hq % hk != 0 {
            return Err(format!("q heads {hq} are not a multiple of kv heads {hk}"));
        }
        let reps = hq / hk;
        k = repeat_heads(cx, k, reps)?;
        v = repeat_heads(cx, v, reps)?;
    }

    // Scores.
    let scale = match n.attr("scale") {
        Some(a) => a.f as f64,
        None => 1.0 / (head as f64).sqrt(),
    };
    let s = cx.scalar(dt, scale.sqrt());
    let qs = cx.binary(BinaryOp::Mul, q, s)?;
    let kt = cx.add(
        Op::Transpose {
            perm: vec![0, 1, 3, 2],
        },
        vec![k],
    )?;
    let ks = cx.binary(BinaryOp::Mul, kt, s)?;
    let mut qk = cx.add(Op::MatMul, vec![qs, ks])?;
    let softcap = n.f("softcap", 0.0)? as f64;
    if softcap > 0.0 {
        let c = cx.scalar(dt, softcap);
        let y = cx.binary(BinaryOp::Div, qk, c)?;
        let y = cx.add(Op::Activation(Activation::Tanh), vec![y])?;
        qk = cx.binary(BinaryOp::Mul, y, c)?;
    }
    let qk_bias = match bias {
        Some(b) => cx.binary(BinaryOp::Add, qk, b)?,
        None => qk,
    };
    let sm_in = match n.attr("softmax_precision") {
        Some(a) if a.r#type == attr_type::INT || a.r#type == 0 => {
            let to = dtype_of(a.i as i32).ok_or_else(|| {
                format!(
                    "softmax_precision {} is not supported",
                    onnx_type_name(a.i as i32)
                )
            })?;
            cx.cast(qk_bias, to)?
        }
        _ => qk_bias,
    };
    let sm = if bias.is_some() {
        safe_softmax(cx, sm_in)?
    } else {
        let r = cx.rank(sm_in);
        cx.add(Op::Softmax { axis: r - 1 }, vec![sm_in])?
    };
    let sm = cx.cast(sm, dt)?;
    let qk_out = match n.i("qk_matmul_output_mode", 0)? {
        0 | 1 => qk,
        2 => qk_bias,
        3 => sm,
        o => return Err(format!("unknown qk_matmul_output_mode {o}")),
    };
    let mut y = cx.add(Op::MatMul, vec![sm, v])?;
    if rank == 3 {
        y = cx.add(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            vec![y],
        )?;
        let d = cx.dims(y);
        y = cx.reshape(y, vec![d[0], d[1], d[2] * d[3]])?;
    }
    Ok(vec![y, present_k, present_v, qk_out])
}

/// Elements `start, start+step, ...` (`size` of them) of the last axis.
fn slice_last(cx: &mut Ctx, x: NodeId, start: usize, step: i64, size: usize) -> R<NodeId> {
    let d = cx.dims(x);
    let r = d.len();
    let mut starts = vec![0; r];
    let mut steps = vec![1; r];
    let mut sizes = d.clone();
    starts[r - 1] = start;
    steps[r - 1] = step;
    sizes[r - 1] = size;
    cx.add(
        Op::Slice {
            starts,
            steps,
            sizes,
        },
        vec![x],
    )
}

/// ONNX RotaryEmbedding (opset 23), as the reference implementation computes it:
/// input `[B, H, S, D]` or `[B, S, H*D]` (`num_heads`), caches `[max_pos, R/2]` gathered by
/// `position_ids [B, S]` (or `[B, S, R/2]` without them), the first `rotary_embedding_dim`
/// features rotated in halves or (`interleaved`) in even/odd pairs.
pub fn rotary_embedding(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (x, cos, sin) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let od = cx.dims(x);
    let xs = match od.len() {
        4 => cx.add(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            vec![x],
        )?,
        3 => {
            let h = n.i("num_heads", 0)?;
            if h <= 0 || !od[2].is_multiple_of(h as usize) {
                return Err(format!(
                    "3-D input {} needs num_heads dividing its hidden size",
                    cx.shape(x)
                ));
            }
            let h = h as usize;
            cx.reshape(x, vec![od[0], od[1], h, od[2] / h])?
        }
        _ => return Err(format!("input must be 3-D or 4-D, got {}", cx.shape(x))),
    };
    let d = cx.dims(xs);
    let head = d[3];
    let rd = match n.i("rotary_embedding_dim", 0)? {
        0 => head,
        r if r > 0 && (r as usize) <= head && r % 2 == 0 => r as usize,
        r => {
            return Err(format!(
                "rotary_embedding_dim {r} does not fit head size {head}"
            ))
        }
    };
    let half = rd / 2;
    let (cos, sin) = match n.opt(3) {
        Some(p) => (
            cx.add(Op::Gather { axis: 0 }, vec![cos, p])?,
            cx.add(Op::Gather { axis: 0 }, vec![sin, p])?,
        ),
        None => (cos, sin),
    };
    let cd = cx.dims(cos);
    if cd.len() != 3 || cd[2] != half || cx.dims(sin) != cd {
        return Err(format!(
            "cos/sin caches {} / {} do not give [batch, seq, {half}]",
            cx.shape(cos),
            cx.shape(sin)
        ));
    }
    let cos = cx.reshape(cos, vec![cd[0], cd[1], 1, half])?;
    let sin = cx.reshape(sin, vec![cd[0], cd[1], 1, half])?;
    let interleaved = n.i("interleaved", 0)? != 0;
    let (x1, x2) = if interleaved {
        (
            slice_last(cx, xs, 0, 2, half)?,
            slice_last(cx, xs, 1, 2, half)?,
        )
    } else {
        (
            slice_last(cx, xs, 0, 1, half)?,
            slice_last(cx, xs, half, 1, half)?,
        )
    };
    let a = cx.binary(BinaryOp::Mul, cos, x1)?;
    let b = cx.binary(BinaryOp::Mul, sin, x2)?;
    let real = cx.binary(BinaryOp::Sub, a, b)?;
    let a = cx.binary(BinaryOp::Mul, sin, x1)?;
    let b = cx.binary(BinaryOp::Mul, cos, x2)?;
    let imag = cx.binary(BinaryOp::Add, a, b)?;
    let rot = if interleaved {
        let rdims = cx.dims(real);
        let mut e = rdims.clone();
        e.push(1);
        let re = cx.reshape(real, e.clone())?;
        let im = cx.reshape(imag, e)?;
        let c = cx.add(Op::Concat { axis: 4 }, vec![re, im])?;
        cx.reshape(c, vec![rdims[0], rdims[1], rdims[2], rd])?
    } else {
        cx.add(Op::Concat { axis: 3 }, vec![real, imag])?
    };
    let y = if rd < head {
        let rest = slice_last(cx, xs, rd, 1, head - rd)?;
        cx.add(Op::Concat { axis: 3 }, vec![rot, rest])?
    } else {
        rot
    };
    let y = if od.len() == 3 {
        cx.reshape(y, od)?
    } else {
        cx.add(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            vec![y],
        )?
    };
    Ok(vec![y])
}

/// Repeat each head of `[B, H, S, D]` `reps` times along axis 1 (`np.repeat`).
fn repeat_heads(cx: &mut Ctx, x: NodeId, reps: usize) -> R<NodeId> {
    if reps == 1 {
        return Ok(x);
    }
    let d = cx.dims(x);
    let y = cx.reshape(x, vec![d[0], d[1], 1, d[2], d[3]])?;
    let y = cx.add(
        Op::Broadcast {
            dims: vec![d[0], d[1], reps, d[2], d[3]],
        },
        vec![y],
    )?;
    cx.reshape(y, vec![d[0], d[1] * reps, d[2], d[3]])
}

/// `ai.onnx.preview` FlexAttention: 4-D Q/K/V (GQA by head repetition), scores scaled by
/// `sqrt(scale)` on each side, the `score_mod` / `prob_mod` subgraphs applied around the
/// softmax (inlined), softmax in `softmax_precision` (f32 for half inputs).
pub fn flex_attention(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let (q, k, v) = (n.inp(0)?, n.inp(1)?, n.inp(2)?);
    let (qd, kd, vd) = (cx.dims(q), cx.dims(k), cx.dims(v));
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err(format!(
            "Q {}, K {}, V {} must be 4-D",
            cx.shape(q),
            cx.shape(k),
            cx.shape(v)
        ));
    }
    let (hq, hk) = (qd[1], kd[1]);
    if vd[1] != hk || vd[2] != kd[2] || kd[3] != qd[3] || hk == 0 || hq % hk != 0 {
        return Err("Q, K and V heads / lengths / sizes do not fit".into());
    }
    let k = repeat_heads(cx, k, hq / hk)?;
    let v = repeat_heads(cx, v, hq / hk)?;
    let dt = cx.dtype(q);
    let scale = match n.attr("scale") {
        Some(a) => a.f,
        None => 1.0 / (qd[3] as f32).sqrt(),
    };
    let s = cx.scalar(dt, scale.sqrt() as f64);
    let qs = cx.binary(BinaryOp::Mul, q, s)?;
    let ks = cx.binary(BinaryOp::Mul, k, s)?;
    let kt = cx.add(
        Op::Transpose {
            perm: vec![0, 1, 3, 2],
        },
        vec![ks],
    )?;
    let scores = cx.add(Op::MatMul, vec![qs, kt])?;
    let cdt = match n.attr("softmax_precision") {
        Some(a) => dtype_of(a.i as i32).ok_or_else(|| {
            format!(
                "softmax_precision {} is not supported",
                onnx_type_name(a.i as i32)
            )
        })?,
        None => match dt {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        },
    };
    let mut scores = cx.cast(scores, cdt)?;
    let apply = |cx: &mut Ctx, name: &str, x: NodeId| -> R<NodeId> {
        let Some(g) = n.attr(name).and_then(|a| a.g.as_ref()) else {
            return Ok(x);
        };
        let outs = super::control::lower_body(cx, n, g, &[x])?;
        let [y] = outs[..] else {
            return Err(format!("{name} must give one output"));
        };
        cx.cast(y, cdt)
    };
    scores = apply(cx, "score_mod", scores)?;
    let p = cx.add(Op::Softmax { axis: 3 }, vec![scores])?;
    let p = apply(cx, "prob_mod", p)?;
    let vf = cx.cast(v, cdt)?;
    let y = cx.add(Op::MatMul, vec![p, vf])?;
    Ok(vec![cx.cast(y, cx.dtype(v))?])
}
