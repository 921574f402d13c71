//! The checkpoint → graph mapping: one prefill graph (the prompt) and one decode-step graph
//! (one token against the fixed-size KV cache), both labelled with module paths.

use crate::checkpoint::Checkpoint;
use crate::config::{Family, LlmConfig};
use crate::ModelError;
use rlx_ir::infer_shape::infer_output;
use rlx_ir::{
    Activation, BinaryOp, DType, Graph, NodeId, Op, Origin, ReduceKind, Shape, Tensor, UnaryOp,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The weights of a checkpoint in the run dtype, shared (`Arc`) by the prefill and decode
/// graphs, under the checkpoint's names (`model.layers.0.mlp.down_proj.weight`) and in its
/// layouts: a linear weight stays `[out, in]` and the graph reads it as
/// `MatMul(x, Transpose(W, [1, 0]))`, which the CPU executor runs as one product reading `W`
/// in place through strides (no transposed copy, at load or per run). A tied `lm_head.weight`
/// is the embedding's own `Arc`.
pub struct ModelGraphs {
    pub cfg: LlmConfig,
    /// The run dtype (f32, f16 or bf16).
    pub dtype: DType,
    weights: HashMap<String, Arc<Tensor>>,
    /// cos and sin tables `[max_len, head_dim]` (f32 math, then the run dtype).
    rope: (Arc<Tensor>, Arc<Tensor>),
    /// Cache length of the decode graph.
    pub max_len: usize,
}

/// A graph and the names of its outputs: `logits`, then `present_key.{l}`,
/// `present_value.{l}` per layer.
pub struct Built {
    pub graph: Graph,
}

impl ModelGraphs {
    /// Read every tensor the architecture needs from `ck` in `dtype` and prepare the rotary
    /// tables for `max_len` positions.
    ///
    /// Errors: a missing tensor, a tensor of the wrong shape or dtype (each naming the file
    /// and tensor).
    pub fn load(
        cfg: LlmConfig,
        ck: &Checkpoint,
        dtype: DType,
        max_len: usize,
    ) -> Result<ModelGraphs, ModelError> {
        let c = &cfg;
        let (d, hd) = (c.hidden, c.head_dim);
        let (qw, kvw) = (c.heads * hd, c.kv_heads * hd);
        let mut w = HashMap::new();
        let mut put = |name: String, dims: &[usize]| -> Result<(), ModelError> {
            let t = ck.get(&name, dims, dtype)?;
            w.insert(name, Arc::new(t));
            Ok(())
        };
        put("model.embed_tokens.weight".into(), &[c.vocab, d])?;
        put("model.norm.weight".into(), &[d])?;
        for l in 0..c.layers {
            let p = format!("model.layers.{l}");
            put(format!("{p}.input_layernorm.weight"), &[d])?;
            put(format!("{p}.post_attention_layernorm.weight"), &[d])?;
            put(format!("{p}.self_attn.q_proj.weight"), &[qw, d])?;
            put(format!("{p}.self_attn.k_proj.weight"), &[kvw, d])?;
            put(format!("{p}.self_attn.v_proj.weight"), &[kvw, d])?;
            put(format!("{p}.self_attn.o_proj.weight"), &[d, qw])?;
            if c.qkv_bias {
                put(format!("{p}.self_attn.q_proj.bias"), &[qw])?;
                put(format!("{p}.self_attn.k_proj.bias"), &[kvw])?;
                put(format!("{p}.self_attn.v_proj.bias"), &[kvw])?;
            }
            if c.o_bias {
                put(format!("{p}.self_attn.o_proj.bias"), &[d])?;
            }
            if c.family == Family::Qwen3 {
                put(format!("{p}.self_attn.q_norm.weight"), &[hd])?;
                put(format!("{p}.self_attn.k_norm.weight"), &[hd])?;
            }
            put(format!("{p}.mlp.gate_proj.weight"), &[c.intermediate, d])?;
            put(format!("{p}.mlp.up_proj.weight"), &[c.intermediate, d])?;
            put(format!("{p}.mlp.down_proj.weight"), &[d, c.intermediate])?;
        }
        if c.tie_embeddings && !ck.has("lm_head.weight") {
            // The same storage: `[vocab, hidden]` is already lm_head's `[out, in]`.
            let e = w["model.embed_tokens.weight"].clone();
            w.insert("lm_head.weight".into(), e);
        } else {
            put("lm_head.weight".into(), &[c.vocab, d])?;
        }
        let inv = c.inv_freq();
        let half = hd / 2;
        let mut cos = Vec::with_capacity(max_len * hd);
        let mut sin = Vec::with_capacity(max_len * hd);
        for p in 0..max_len {
            for j in 0..hd {
                // float32 as transformers: freqs = pos * inv_freq, emb = cat(freqs, freqs)
                let f = (p as f32) * (inv[j % half] as f32);
                cos.push(f.cos());
                sin.push(f.sin());
            }
        }
        let tab = |v: Vec<f32>| {
            let t = Tensor::from_f32(&[max_len, hd], v).expect("dims");
            Arc::new(if dtype == DType::F32 {
                t
            } else {
                Tensor::new(vec![max_len, hd], t.data().cast(dtype)).expect("dims")
            })
        };
        Ok(ModelGraphs {
            rope: (tab(cos), tab(sin)),
            cfg,
            dtype,
            weights: w,
            max_len,
        })
    }

    /// The weight stored under checkpoint name `name` (`lm_head.weight` too when tied), in the
    /// run dtype and the checkpoint's layout.
    pub fn weight(&self, name: &str) -> Option<&Arc<Tensor>> {
        self.weights.get(name)
    }

    /// The prefill graph for a prompt of `t` tokens (positions `0..t`).
    ///
    /// Input `input_ids` I64 `[t]`. Outputs: `logits` (run dtype) `[t, vocab]` when
    /// `all_logits`, else `[1, vocab]` for the last position; then per layer `l`
    /// `present_key.{l}` `[kv_heads, head_dim, t]` (rotated keys, transposed) and
    /// `present_value.{l}` `[kv_heads, t, head_dim]`.
    pub fn prefill(&self, t: usize, all_logits: bool) -> Result<Built, ModelError> {
        let mut b = B::new(self, "prefill");
        let ids = b.g.input("input_ids", Shape::new(&[t], DType::I64));
        b.at("model.embed_tokens", "Embedding");
        let emb = b.w("model.embed_tokens.weight");
        let mut h = b.op(Op::Gather { axis: 0 }, vec![emb, ids]);
        let (cos, sin) = b.rope_consts(Some(t), None);
        // causal mask [t, t]: 0 on and below the diagonal, f32::MIN above (finite, as HF)
        b.at("model", "CausalMask");
        let mask: Vec<f32> = (0..t * t)
            .map(|k| if k % t <= k / t { 0.0 } else { f32::MIN })
            .collect();
        let mask = b.g.constant(Tensor::from_f32(&[t, t], mask).expect("dims"));
        let mut outs = vec![];
        for l in 0..self.cfg.layers {
            let (h2, k, v) = b.layer(l, h, t, cos, sin, Attn::Prefill { mask });
            h = h2;
            outs.push((k, format!("present_key.{l}")));
            outs.push((v, format!("present_value.{l}")));
        }
        if !all_logits && t > 1 {
            b.at("model", "Slice");
            let d = self.cfg.hidden;
            h = b.op(
                Op::Slice {
                    starts: vec![t - 1, 0],
                    steps: vec![1, 1],
                    sizes: vec![1, d],
                },
                vec![h],
            );
        }
        let logits = b.head(h);
        outs.insert(0, (logits, "logits".to_string()));
        b.g.set_outputs_named(outs);
        Ok(Built { graph: b.g })
    }

    /// The decode-step graph: one token at a run-time position against caches of
    /// `max_len` positions.
    ///
    /// Inputs: `input_ids` I64 `[1]`; `position` I64 `[1]` (0-based, below `max_len`);
    /// `attn_mask` f32 `[1, max_len]` (0 for cache positions already written, `f32::MIN`
    /// for the others); per layer `past_key.{l}` `[kv_heads, head_dim, max_len]` (keys
    /// stored transposed, so `q·Kᵀ` reads the cache in place) and `past_value.{l}`
    /// `[kv_heads, max_len, head_dim]`, both in the run dtype. Outputs: `logits` `[1, vocab]`
    /// and per layer `present_key.{l}` / `present_value.{l}` `[kv_heads, 1, head_dim]`, the
    /// new token's rows, which the caller writes into the caches at `position`.
    pub fn decode(&self) -> Result<Built, ModelError> {
        let (m, dt) = (self.max_len, self.dtype);
        debug_assert!(m > 0);
        let c = &self.cfg;
        let mut b = B::new(self, "decode");
        let ids = b.g.input("input_ids", Shape::new(&[1], DType::I64));
        let pos = b.g.input("position", Shape::new(&[1], DType::I64));
        let mask = b.g.input("attn_mask", Shape::new(&[1, m], DType::F32));
        // The caches: a NaN they hold was written by an earlier step (reported there).
        b.at("past_key_values", "KVCache");
        let mut past = vec![];
        for l in 0..c.layers {
            let k = b.g.input(
                &format!("past_key.{l}"),
                Shape::new(&[c.kv_heads, c.head_dim, m], dt),
            );
            let v = b.g.input(
                &format!("past_value.{l}"),
                Shape::new(&[c.kv_heads, m, c.head_dim], dt),
            );
            past.push((k, v));
        }
        b.at("model.embed_tokens", "Embedding");
        let emb = b.w("model.embed_tokens.weight");
        let mut h = b.op(Op::Gather { axis: 0 }, vec![emb, ids]);
        let (cos, sin) = b.rope_consts(None, Some(pos));
        let mut outs = vec![];
        for (l, &(pk, pv)) in past.iter().enumerate() {
            let (h2, k, v) = b.layer(l, h, 1, cos, sin, Attn::Decode { mask, pk, pv });
            h = h2;
            outs.push((k, format!("present_key.{l}")));
            outs.push((v, format!("present_value.{l}")));
        }
        let logits = b.head(h);
        outs.insert(0, (logits, "logits".to_string()));
        b.g.set_outputs_named(outs);
        Ok(Built { graph: b.g })
    }
}

enum Attn {
    Prefill {
        mask: NodeId,
    },
    Decode {
        mask: NodeId,
        pk: NodeId,
        pv: NodeId,
    },
}

struct B<'a> {
    m: &'a ModelGraphs,
    g: Graph,
    dt: DType,
}

impl<'a> B<'a> {
    fn new(m: &'a ModelGraphs, name: &str) -> B<'a> {
        B {
            m,
            g: Graph::new(&format!("{}-{name}", m.cfg.model_type)),
            dt: m.dtype,
        }
    }

    /// Stamp `path` (a checkpoint module path) on the nodes that follow.
    fn at(&mut self, path: &str, op_type: &str) {
        self.g.set_current_origin(Some(Origin {
            label: path.to_string(),
            op_type: Some(op_type.to_string()),
            ..Default::default()
        }));
    }

    fn op(&mut self, op: Op, inputs: Vec<NodeId>) -> NodeId {
        let shapes: Vec<&Shape> = inputs.iter().map(|i| &self.g.node(*i).shape).collect();
        let s = infer_output(&op, &shapes).unwrap_or_else(|e| {
            panic!("rlx-models builds a well-typed graph: {}: {e:?}", op.name())
        });
        self.g.add_node(op, inputs, s)
    }

    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary(op), vec![a, b])
    }

    fn scalar(&mut self, dt: DType, x: f64) -> NodeId {
        self.g.constant(Tensor::scalar(dt, x))
    }

    fn cast(&mut self, x: NodeId, to: DType) -> NodeId {
        if self.g.node(x).shape.dtype == to {
            return x;
        }
        self.op(Op::Cast { to, saturate: true }, vec![x])
    }

    fn reshape(&mut self, x: NodeId, dims: &[usize]) -> NodeId {
        self.op(
            Op::Reshape {
                dims: dims.to_vec(),
            },
            vec![x],
        )
    }

    fn transpose(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.op(
            Op::Transpose {
                perm: perm.to_vec(),
            },
            vec![x],
        )
    }

    /// A weight constant, labelled with its checkpoint name.
    fn w(&mut self, name: &str) -> NodeId {
        let t = self.m.weights[name].clone();
        let saved = self.g.current_origin().cloned();
        self.g.set_current_origin(Some(Origin {
            label: name.to_string(),
            ..Default::default()
        }));
        let s = t.shape();
        let id = self.g.add_node(Op::Constant(t), vec![], s);
        self.g.set_current_origin(saved);
        id
    }

    /// `x @ Wᵀ (+ b)` for the module at `path` (`x` `[rows, in]`, `W` `[out, in]` as the
    /// checkpoint holds it): `MatMul(x, Transpose(W, [1, 0]))`. The Transpose is read in
    /// place by the MatMul on the CPU and never folded into a copy (`const_fold` keeps a
    /// Transpose that only MatMuls read).
    fn linear(&mut self, path: &str, x: NodeId, bias: bool) -> NodeId {
        let w = self.w(&format!("{path}.weight"));
        self.at(path, "Linear");
        let wt = self.transpose(w, &[1, 0]);
        let mut y = self.op(Op::MatMul, vec![x, wt]);
        if bias {
            let b = self.w(&format!("{path}.bias"));
            self.at(path, "Linear");
            y = self.bin(BinaryOp::Add, y, b);
        }
        y
    }

    /// transformers' RMSNorm over the last axis: in f32, `x * 1/sqrt(mean(x²) + eps)`, back
    /// to the run dtype, times the weight (the op sequence the CPU backend fuses per row).
    fn rms(&mut self, path: &str, x: NodeId) -> NodeId {
        let w = self.w(&format!("{path}.weight"));
        self.at(path, "RMSNormalization");
        let rank = self.g.node(x).shape.rank();
        let xs = self.cast(x, DType::F32);
        let two = self.scalar(DType::F32, 2.0);
        let sq = self.bin(BinaryOp::Pow, xs, two);
        let ms = self.op(
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes: vec![rank - 1],
                keepdims: true,
            },
            vec![sq],
        );
        let eps = self.scalar(DType::F32, self.m.cfg.rms_eps);
        let ms = self.bin(BinaryOp::Add, ms, eps);
        let r = self.op(Op::Unary(UnaryOp::Sqrt), vec![ms]);
        let one = self.scalar(DType::F32, 1.0);
        let inv = self.bin(BinaryOp::Div, one, r);
        let y = self.bin(BinaryOp::Mul, xs, inv);
        let y = self.cast(y, self.dt);
        self.bin(BinaryOp::Mul, w, y)
    }

    /// cos/sin rows `[rows, head_dim]`: constants for positions `0..t`, or gathered at the
    /// `position` input.
    fn rope_consts(&mut self, t: Option<usize>, pos: Option<NodeId>) -> (NodeId, NodeId) {
        self.at("model.rotary_emb", "RotaryEmbedding");
        let (c, s) = (self.m.rope.0.clone(), self.m.rope.1.clone());
        let (sc, ss) = (c.shape(), s.shape());
        let cn = self.g.add_node(Op::Constant(c), vec![], sc);
        let sn = self.g.add_node(Op::Constant(s), vec![], ss);
        let hd = self.m.cfg.head_dim;
        match (t, pos) {
            (Some(t), _) => {
                let sl = |b: &mut Self, x| {
                    b.op(
                        Op::Slice {
                            starts: vec![0, 0],
                            steps: vec![1, 1],
                            sizes: vec![t, hd],
                        },
                        vec![x],
                    )
                };
                (sl(self, cn), sl(self, sn))
            }
            (None, Some(p)) => (
                self.op(Op::Gather { axis: 0 }, vec![cn, p]),
                self.op(Op::Gather { axis: 0 }, vec![sn, p]),
            ),
            _ => unreachable!(),
        }
    }

    /// `x * cos + rotate_half(x) * sin` on the last axis; cos/sin broadcast from `cs_dims`.
    fn rotary(&mut self, path: &str, x: NodeId, cos: NodeId, sin: NodeId) -> NodeId {
        self.at(path, "RotaryEmbedding");
        let dims = self.g.node(x).shape.dims_usize().to_vec();
        let r = dims.len();
        let hd = dims[r - 1];
        let half = hd / 2;
        let part = |b: &mut Self, start: usize| {
            let mut starts = vec![0; r];
            starts[r - 1] = start;
            let mut sizes = dims.clone();
            sizes[r - 1] = half;
            b.op(
                Op::Slice {
                    starts,
                    steps: vec![1; r],
                    sizes,
                },
                vec![x],
            )
        };
        let x1 = part(self, 0);
        let x2 = part(self, half);
        let nx2 = self.op(Op::Unary(UnaryOp::Neg), vec![x2]);
        let rot = self.op(Op::Concat { axis: r - 1 }, vec![nx2, x1]);
        let a = self.bin(BinaryOp::Mul, x, cos);
        let bb = self.bin(BinaryOp::Mul, rot, sin);
        self.bin(BinaryOp::Add, a, bb)
    }

    /// One decoder layer on `h` `[t, hidden]`; returns the new hidden state and the
    /// present key/value outputs.
    fn layer(
        &mut self,
        l: usize,
        h: NodeId,
        t: usize,
        cos: NodeId,
        sin: NodeId,
        attn: Attn,
    ) -> (NodeId, NodeId, NodeId) {
        let c = self.m.cfg.clone();
        let (hd, nh, nkv) = (c.head_dim, c.heads, c.kv_heads);
        let grp = nh / nkv;
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        let x = self.rms(&format!("{p}.input_layernorm"), h);
        let q = self.linear(&format!("{a}.q_proj"), x, c.qkv_bias);
        let k = self.linear(&format!("{a}.k_proj"), x, c.qkv_bias);
        let v = self.linear(&format!("{a}.v_proj"), x, c.qkv_bias);
        self.at(&a, "Reshape");
        let q = self.reshape(q, &[t, nh, hd]);
        let k = self.reshape(k, &[t, nkv, hd]);
        let v = self.reshape(v, &[t, nkv, hd]);
        let (q, k) = if c.family == Family::Qwen3 {
            (
                self.rms(&format!("{a}.q_norm"), q),
                self.rms(&format!("{a}.k_norm"), k),
            )
        } else {
            (q, k)
        };
        // cos/sin [t, hd] → [t, 1, hd] to broadcast over heads
        self.at(&a, "RotaryEmbedding");
        let cos3 = self.reshape(cos, &[t, 1, hd]);
        let sin3 = self.reshape(sin, &[t, 1, hd]);
        let q = self.rotary(&a, q, cos3, sin3);
        let k = self.rotary(&a, k, cos3, sin3);
        self.at(&a, "Attention");
        let scale = self.scalar(self.dt, 1.0 / (hd as f64).sqrt());
        let (ctx, pk_out, pv_out) = match attn {
            Attn::Prefill { mask } => {
                // q [t, nh, hd] → [nh, t, hd] → [nkv, grp*t, hd] (head h = kv*grp + g)
                let qt = self.transpose(q, &[1, 0, 2]);
                let qg = self.reshape(qt, &[nkv, grp * t, hd]);
                let kt = self.transpose(k, &[1, 2, 0]); // [nkv, hd, t]
                let vt = self.transpose(v, &[1, 0, 2]); // [nkv, t, hd]
                let s = self.op(Op::MatMul, vec![qg, kt]); // [nkv, grp*t, t]
                let s = self.bin(BinaryOp::Mul, s, scale);
                let s = self.cast(s, DType::F32);
                let s = self.reshape(s, &[nkv, grp, t, t]);
                let s = self.bin(BinaryOp::Add, s, mask);
                self.at(&a, "Softmax");
                let pr = self.op(Op::Softmax { axis: 3 }, vec![s]);
                self.at(&a, "Attention");
                let pr = self.cast(pr, self.dt);
                let pr = self.reshape(pr, &[nkv, grp * t, t]);
                let o = self.op(Op::MatMul, vec![pr, vt]); // [nkv, grp*t, hd]
                let o = self.reshape(o, &[nh, t, hd]);
                let o = self.transpose(o, &[1, 0, 2]);
                (self.reshape(o, &[t, nh * hd]), kt, vt)
            }
            Attn::Decode { mask, pk, pv } => {
                let ml = self.m.max_len;
                let qg = self.reshape(q, &[nkv, grp, hd]);
                let kn = self.reshape(k, &[nkv, hd, 1]); // t = 1: a reshape, no copy
                let vn = self.reshape(v, &[nkv, 1, hd]);
                let sp = self.op(Op::MatMul, vec![qg, pk]); // [nkv, grp, ml]
                let sn = self.op(Op::MatMul, vec![qg, kn]); // [nkv, grp, 1]
                let s = self.op(Op::Concat { axis: 2 }, vec![sp, sn]);
                let s = self.bin(BinaryOp::Mul, s, scale);
                let s = self.cast(s, DType::F32);
                // the mask [1, ml] plus a 0 for the new token
                let zero = self
                    .g
                    .constant(Tensor::from_f32(&[1, 1], vec![0.0]).expect("dims"));
                let mk = self.op(Op::Concat { axis: 1 }, vec![mask, zero]);
                let s = self.bin(BinaryOp::Add, s, mk);
                self.at(&a, "Softmax");
                let pr = self.op(Op::Softmax { axis: 2 }, vec![s]);
                self.at(&a, "Attention");
                let pr = self.cast(pr, self.dt);
                let pp = self.op(
                    Op::Slice {
                        starts: vec![0, 0, 0],
                        steps: vec![1, 1, 1],
                        sizes: vec![nkv, grp, ml],
                    },
                    vec![pr],
                );
                let pn = self.op(
                    Op::Slice {
                        starts: vec![0, 0, ml],
                        steps: vec![1, 1, 1],
                        sizes: vec![nkv, grp, 1],
                    },
                    vec![pr],
                );
                let op = self.op(Op::MatMul, vec![pp, pv]); // [nkv, grp, hd]
                let on = self.bin(BinaryOp::Mul, pn, vn); // [nkv, grp, hd]
                let o = self.bin(BinaryOp::Add, op, on);
                let kn_out = self.reshape(k, &[nkv, 1, hd]);
                (self.reshape(o, &[1, nh * hd]), kn_out, vn)
            }
        };
        let o = self.linear(&format!("{a}.o_proj"), ctx, c.o_bias);
        self.at(&p, "Add");
        let h = self.bin(BinaryOp::Add, h, o);
        let x = self.rms(&format!("{p}.post_attention_layernorm"), h);
        let m = format!("{p}.mlp");
        let gt = self.linear(&format!("{m}.gate_proj"), x, false);
        let up = self.linear(&format!("{m}.up_proj"), x, false);
        self.at(&format!("{m}.act_fn"), "SiLU");
        let gs = self.op(Op::Activation(Activation::Silu), vec![gt]);
        self.at(&m, "Mul");
        let gu = self.bin(BinaryOp::Mul, gs, up);
        let dn = self.linear(&format!("{m}.down_proj"), gu, false);
        self.at(&p, "Add");
        let h = self.bin(BinaryOp::Add, h, dn);
        (h, pk_out, pv_out)
    }

    /// Final norm and lm_head: `[rows, hidden]` → `[rows, vocab]`.
    fn head(&mut self, h: NodeId) -> NodeId {
        let x = self.rms("model.norm", h);
        self.linear("lm_head", x, false)
    }
}
