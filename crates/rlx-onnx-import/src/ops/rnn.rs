//! Recurrent ops (ONNX RNN, GRU, LSTM) unrolled over the static sequence length into
//! MatMul / Add / activations / Slice / Concat, and ReverseSequence as a constant-index
//! GatherElements. Definitions: ONNX operator spec of the same name (opset 22).
//!
//! Gate layouts: RNN `[i]`, GRU `[z, r, h]`, LSTM `[i, o, f, c]` (peepholes `[i, o, f]`).
//! `sequence_lens` (when given; a constant or a runtime value): steps past a batch entry's
//! length leave its state unchanged and write zeros to `Y` (onnxruntime's convention);
//! the reverse direction then runs over each entry's own first `len` steps.

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{Activation, BinaryOp, DType, NodeId, Op, Tensor, TensorData};

use super::shape::slice_axis;

fn transpose(cx: &mut Ctx, x: NodeId, perm: Vec<usize>) -> R<NodeId> {
    cx.add(Op::Transpose { perm }, vec![x])
}

/// One activation of the `activations` attribute, with its alpha/beta (ONNX defaults
/// when not given).
#[derive(Clone)]
struct Act {
    name: String,
    alpha: Option<f32>,
    beta: Option<f32>,
}

fn apply_act(cx: &mut Ctx, a: &Act, x: NodeId) -> R<NodeId> {
    let dt = cx.dtype(x);
    let act = |cx: &mut Ctx, v: Activation| cx.add(Op::Activation(v), vec![x]);
    match a.name.to_ascii_lowercase().as_str() {
        "sigmoid" => act(cx, Activation::Sigmoid),
        "tanh" => act(cx, Activation::Tanh),
        "relu" => act(cx, Activation::Relu),
        "leakyrelu" => act(
            cx,
            Activation::LeakyRelu {
                alpha: a.alpha.unwrap_or(0.01),
            },
        ),
        "hardsigmoid" => act(
            cx,
            Activation::HardSigmoid {
                alpha: a.alpha.unwrap_or(0.2),
                beta: a.beta.unwrap_or(0.5),
            },
        ),
        "elu" => act(
            cx,
            Activation::Elu {
                alpha: a.alpha.unwrap_or(1.0),
            },
        ),
        "softsign" => act(cx, Activation::Softsign),
        "softplus" => act(cx, Activation::Softplus),
        "affine" => {
            let al = cx.scalar(dt, a.alpha.unwrap_or(1.0) as f64);
            let be = cx.scalar(dt, a.beta.unwrap_or(0.0) as f64);
            let y = cx.binary(BinaryOp::Mul, x, al)?;
            cx.binary(BinaryOp::Add, y, be)
        }
        "scaledtanh" => {
            let al = cx.scalar(dt, a.alpha.unwrap_or(1.0) as f64);
            let be = cx.scalar(dt, a.beta.unwrap_or(1.0) as f64);
            let y = cx.binary(BinaryOp::Mul, x, be)?;
            let y = cx.add(Op::Activation(Activation::Tanh), vec![y])?;
            cx.binary(BinaryOp::Mul, y, al)
        }
        "thresholdedrelu" => {
            let al = cx.scalar(dt, a.alpha.unwrap_or(1.0) as f64);
            let zero = cx.scalar(dt, 0.0);
            let gt = cx.binary(BinaryOp::Gt, x, al)?;
            cx.add(Op::Select, vec![gt, x, zero])
        }
        o => Err(format!("activation \"{o}\" is not supported")),
    }
}

/// Which activations take alpha / beta (for consuming `activation_alpha/beta` in order).
fn takes(name: &str) -> (bool, bool) {
    match name.to_ascii_lowercase().as_str() {
        "leakyrelu" | "elu" | "thresholdedrelu" => (true, false),
        "hardsigmoid" | "affine" | "scaledtanh" => (true, true),
        _ => (false, false),
    }
}

/// Shared attributes and inputs of RNN / GRU / LSTM, normalized to layout 0.
struct Common {
    /// `[seq, batch, input]`
    x: NodeId,
    seq: usize,
    batch: usize,
    hidden: usize,
    dirs: usize,
    reverse_only: bool,
    layout: i64,
    lens: Option<Lens>,
    clip: Option<f32>,
    /// Activations per direction (`per_dir` each).
    acts: Vec<Vec<Act>>,
    dt: DType,
}

fn common(cx: &mut Ctx, n: &ONode, gates: usize, default_acts: &[&str]) -> R<Common> {
    let mut x = n.inp(0)?;
    let layout = n.i("layout", 0)?;
    if cx.rank(x) != 3 {
        return Err(format!("X {} must be 3-D", cx.shape(x)));
    }
    if layout == 1 {
        x = transpose(cx, x, vec![1, 0, 2])?;
    } else if layout != 0 {
        return Err(format!("layout {layout} must be 0 or 1"));
    }
    let [seq, batch, _] = cx.dims(x)[..] else {
        unreachable!("rank checked")
    };
    let direction = n.s("direction", "forward")?;
    let (dirs, reverse_only) = match direction.as_str() {
        "forward" => (1, false),
        "reverse" => (1, true),
        "bidirectional" => (2, false),
        o => return Err(format!("unknown direction \"{o}\"")),
    };
    let w = cx.dims(n.inp(1)?);
    let hidden = match n.attr("hidden_size") {
        Some(a) => a.i as usize,
        None => w.get(1).copied().unwrap_or(0) / gates,
    };
    if hidden == 0 || w.len() != 3 || w[0] != dirs || w[1] != gates * hidden {
        return Err(format!(
            "W {w:?} does not match {dirs} direction(s) of {gates} gates x hidden_size {hidden}"
        ));
    }
    let lens = match n.opt(4) {
        Some(l) if cx.const_tensor(l).is_some() => {
            let v = crate::ctx::to_usizes(&cx.const_i64s(l, "sequence_lens")?, "sequence_lens")?;
            if v.len() != batch || v.iter().any(|&l| l > seq) {
                return Err(format!(
                    "sequence_lens {v:?} must have {batch} entries of at most {seq}"
                ));
            }
            if v.iter().all(|&l| l == seq) {
                None
            } else {
                Some(Lens::Const(v))
            }
        }
        Some(l) => Some(Lens::node(cx, l, batch)?),
        None => None,
    };
    let clip = n.attr("clip").map(|a| a.f);
    let names: Vec<String> = match n.attr("activations") {
        Some(a) => a
            .strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        None => (0..dirs)
            .flat_map(|_| default_acts.iter().map(|s| s.to_string()))
            .collect(),
    };
    let per = default_acts.len();
    if names.len() != per * dirs {
        return Err(format!(
            "activations {names:?} must list {} functions",
            per * dirs
        ));
    }
    let alphas = n.attr("activation_alpha").map(|a| a.floats.clone());
    let betas = n.attr("activation_beta").map(|a| a.floats.clone());
    let (mut ai, mut bi) = (0, 0);
    let mut all = Vec::new();
    for name in names {
        let (ta, tb) = takes(&name);
        let mut act = Act {
            name,
            alpha: None,
            beta: None,
        };
        if ta {
            act.alpha = alphas.as_ref().and_then(|v| v.get(ai).copied());
            ai += 1;
        }
        if tb {
            act.beta = betas.as_ref().and_then(|v| v.get(bi).copied());
            bi += 1;
        }
        all.push(act);
    }
    let acts = all.chunks(per).map(|c| c.to_vec()).collect();
    Ok(Common {
        x,
        seq,
        batch,
        hidden,
        dirs,
        reverse_only,
        layout,
        lens,
        clip,
        acts,
        dt: cx.dtype(x),
    })
}

/// Per-direction weights: `W^T [I, G*H]`, `R^T [H, G*H]`, bias `Wb + Rb [G*H]` and the
/// recurrent bias `Rb [G*H]` alone (GRU's `linear_before_reset` needs it separately).
struct DirWeights {
    wt: NodeId,
    rt: NodeId,
    wb: Option<NodeId>,
    rb: Option<NodeId>,
}

fn dir_weights(cx: &mut Ctx, n: &ONode, c: &Common, d: usize, gates: usize) -> R<DirWeights> {
    let gh = gates * c.hidden;
    // W [num_directions, G*hidden, input_size], R [num_directions, G*hidden, hidden].
    let (w0, r0) = (n.inp(1)?, n.inp(2)?);
    let wd = cx.dims(w0);
    if wd.len() != 3 || wd[0] != c.dirs || wd[1] != gh {
        return Err(format!(
            "W {} has the wrong shape: expected [{}, {gh}, input_size]",
            cx.shape(w0),
            c.dirs
        ));
    }
    if cx.dims(r0) != [c.dirs, gh, c.hidden] {
        return Err(format!(
            "R {} has the wrong shape: expected [{}, {gh}, {}]",
            cx.shape(r0),
            c.dirs,
            c.hidden
        ));
    }
    let w = slice_axis(cx, w0, 0, d, 1)?;
    let wi = cx.dims(w)[2];
    let w = cx.reshape(w, vec![gh, wi])?;
    let wt = transpose(cx, w, vec![1, 0])?;
    let r = slice_axis(cx, n.inp(2)?, 0, d, 1)?;
    if cx.dims(r) != [1, gh, c.hidden] {
        return Err(format!("R {} has the wrong shape", cx.shape(n.inp(2)?)));
    }
    let r = cx.reshape(r, vec![gh, c.hidden])?;
    let rt = transpose(cx, r, vec![1, 0])?;
    let (wb, rb) = match n.opt(3) {
        Some(b) => {
            if cx.dims(b) != [c.dirs, 2 * gh] {
                return Err(format!("B {} has the wrong shape", cx.shape(b)));
            }
            let b = slice_axis(cx, b, 0, d, 1)?;
            let b = cx.reshape(b, vec![2 * gh])?;
            (
                Some(slice_axis(cx, b, 0, 0, gh)?),
                Some(slice_axis(cx, b, 0, gh, gh)?),
            )
        }
        None => (None, None),
    };
    Ok(DirWeights { wt, rt, wb, rb })
}

/// Initial state `[batch, H]` of direction `d` from input `idx` (`[dirs, batch, H]`, or
/// `[batch, dirs, H]` for layout 1), zeros when absent.
fn initial(cx: &mut Ctx, n: &ONode, c: &Common, idx: usize, d: usize) -> R<NodeId> {
    match n.opt(idx) {
        Some(h) => {
            let axis = if c.layout == 1 { 1 } else { 0 };
            let h = slice_axis(cx, h, axis, d, 1)?;
            if cx.dims(h).iter().product::<usize>() != c.batch * c.hidden {
                return Err(format!("initial state {} has the wrong shape", cx.shape(h)));
            }
            cx.reshape(h, vec![c.batch, c.hidden])
        }
        None => {
            let z = cx.scalar(c.dt, 0.0);
            cx.add(
                Op::Broadcast {
                    dims: vec![c.batch, c.hidden],
                },
                vec![z],
            )
        }
    }
}

fn clip(cx: &mut Ctx, c: &Common, x: NodeId) -> R<NodeId> {
    match c.clip {
        Some(t) => {
            let hi = cx.scalar(c.dt, t as f64);
            let lo = cx.scalar(c.dt, -(t as f64));
            let y = cx.binary(BinaryOp::Min, x, hi)?;
            cx.binary(BinaryOp::Max, y, lo)
        }
        None => Ok(x),
    }
}

/// Constant GatherElements indices (dims of `x`) reversing, for each batch entry `b`, the
/// first `lens[b]` entries along `time` (the rest stay in place): ONNX ReverseSequence.
fn reverse_index(dims: &[usize], time: usize, batch: usize, lens: &[usize]) -> Vec<i64> {
    let numel: usize = dims.iter().product();
    let mut out = Vec::with_capacity(numel);
    for flat in 0..numel {
        let mut rem = flat;
        let mut coord = vec![0; dims.len()];
        for a in (0..dims.len()).rev() {
            coord[a] = rem % dims[a];
            rem /= dims[a];
        }
        let (t, l) = (coord[time], lens[coord[batch]]);
        out.push(if t < l { (l - 1 - t) as i64 } else { t as i64 });
    }
    out
}

fn reverse_seq(cx: &mut Ctx, x: NodeId, time: usize, batch: usize, lens: &Lens) -> R<NodeId> {
    let d = cx.dims(x);
    let idx = match lens {
        Lens::Const(lens) => {
            let idx = reverse_index(&d, time, batch, lens);
            cx.constant(Tensor::from_i64(&d, idx).map_err(|e| e.to_string())?)
        }
        Lens::Node(l) => {
            // idx = t < len ? len - 1 - t : t, with t along `time` and len along `batch`.
            let mut td = vec![1; d.len()];
            td[time] = d[time];
            let t: Vec<i64> = (0..d[time] as i64).collect();
            let t = cx.constant(Tensor::from_i64(&td, t).map_err(|e| e.to_string())?);
            let mut ld = vec![1; d.len()];
            ld[batch] = d[batch];
            let l = cx.reshape(*l, ld)?;
            let inside = cx.binary(BinaryOp::Lt, t, l)?;
            let one = cx.scalar(DType::I64, 1.0);
            let last = cx.binary(BinaryOp::Sub, l, one)?;
            let rev = cx.binary(BinaryOp::Sub, last, t)?;
            let idx = cx.add(Op::Select, vec![inside, rev, t])?;
            cx.add(Op::Broadcast { dims: d.clone() }, vec![idx])?
        }
    };
    cx.add(Op::GatherElements { axis: time }, vec![x, idx])
}

/// Per-batch sequence lengths: known at import time, or an I64 `[batch]` runtime value.
enum Lens {
    Const(Vec<usize>),
    Node(NodeId),
}

impl Lens {
    fn node(cx: &mut Ctx, l: NodeId, batch: usize) -> R<Lens> {
        if cx.dims(l) != [batch] || !cx.dtype(l).is_int() {
            return Err(format!(
                "sequence_lens {} must be an integer [{batch}] tensor",
                cx.shape(l)
            ));
        }
        Ok(Lens::Node(cx.cast(l, DType::I64)?))
    }
}

/// The cell of one recurrent op: `(h, c)` at step `t` from `(h_prev, c_prev)` and the
/// projected input `xw [batch, G*H]` (input bias already added).
type Cell<'a> =
    dyn FnMut(&mut Ctx, NodeId, NodeId, Option<NodeId>) -> R<(NodeId, Option<NodeId>)> + 'a;

/// Run one direction: returns per-step outputs in time order and the final (h, c).
fn run_dir(
    cx: &mut Ctx,
    c: &Common,
    reverse: bool,
    xw: NodeId,
    h0: NodeId,
    c0: Option<NodeId>,
    cell: &mut Cell,
) -> R<(Vec<NodeId>, NodeId, Option<NodeId>)> {
    // Reverse with ragged lengths: reverse each entry's valid prefix, run forward, and
    // reverse the outputs back (the reversal is an involution).
    let ragged_rev = reverse && c.lens.is_some();
    let xw = if ragged_rev {
        reverse_seq(
            cx,
            xw,
            0,
            1,
            c.lens.as_ref().expect("ragged_rev implies lens"),
        )?
    } else {
        xw
    };
    let gh = cx.dims(xw)[2];
    let mask_of = |cx: &mut Ctx, t: usize| -> R<Option<NodeId>> {
        match &c.lens {
            None => Ok(None),
            Some(Lens::Const(lens)) => {
                let m: Vec<f64> = lens.iter().map(|&l| (t < l) as u8 as f64).collect();
                let t = Tensor::new(vec![c.batch, 1], TensorData::from_f64(c.dt, &m))
                    .map_err(|e| e.to_string())?;
                Ok(Some(cx.constant(t)))
            }
            Some(Lens::Node(l)) => {
                let tt = cx.scalar(DType::I64, t as f64);
                let m = cx.binary(BinaryOp::Lt, tt, *l)?;
                let m = cx.cast(m, c.dt)?;
                Ok(Some(cx.reshape(m, vec![c.batch, 1])?))
            }
        }
    };
    let (mut h, mut cs) = (h0, c0);
    let mut ys = vec![None; c.seq];
    for k in 0..c.seq {
        let t = if reverse && !ragged_rev {
            c.seq - 1 - k
        } else {
            k
        };
        let xt = slice_axis(cx, xw, 0, t, 1)?;
        let xt = cx.reshape(xt, vec![c.batch, gh])?;
        let (hn, cn) = cell(cx, xt, h, cs)?;
        let (hn, cn, y) = match mask_of(cx, t)? {
            None => (hn, cn, hn),
            Some(m) => {
                let one = cx.scalar(c.dt, 1.0);
                let inv = cx.binary(BinaryOp::Sub, one, m)?;
                let keep = |cx: &mut Ctx, new: NodeId, old: NodeId| -> R<NodeId> {
                    let a = cx.binary(BinaryOp::Mul, new, m)?;
                    let b = cx.binary(BinaryOp::Mul, old, inv)?;
                    cx.binary(BinaryOp::Add, a, b)
                };
                let y = cx.binary(BinaryOp::Mul, hn, m)?;
                let h2 = keep(cx, hn, h)?;
                let c2 = match (cn, cs) {
                    (Some(a), Some(b)) => Some(keep(cx, a, b)?),
                    _ => cn,
                };
                (h2, c2, y)
            }
        };
        h = hn;
        cs = cn;
        ys[t] = Some(y);
    }
    let ys: Vec<NodeId> = ys.into_iter().map(|y| y.expect("every step ran")).collect();
    let ys = if ragged_rev {
        let parts: Vec<NodeId> = ys
            .iter()
            .map(|&y| cx.reshape(y, vec![1, c.batch, c.hidden]))
            .collect::<R<_>>()?;
        let all = cx.add(Op::Concat { axis: 0 }, parts)?;
        let all = reverse_seq(
            cx,
            all,
            0,
            1,
            c.lens.as_ref().expect("ragged_rev implies lens"),
        )?;
        (0..c.seq)
            .map(|t| slice_axis(cx, all, 0, t, 1))
            .collect::<R<_>>()?
    } else {
        ys
    };
    Ok((ys, h, cs))
}

/// `X · W^T (+ Wb + Rb)` for all steps: `[seq, batch, G*H]`.
fn project(cx: &mut Ctx, c: &Common, w: &DirWeights, add_rb: bool) -> R<NodeId> {
    let mut xw = cx.add(Op::MatMul, vec![c.x, w.wt])?;
    if let Some(wb) = w.wb {
        xw = cx.binary(BinaryOp::Add, xw, wb)?;
    }
    if add_rb {
        if let Some(rb) = w.rb {
            xw = cx.binary(BinaryOp::Add, xw, rb)?;
        }
    }
    Ok(xw)
}

/// Assemble `Y`, `Y_h` (and `Y_c`) from the per-direction results, in the node's layout.
fn outputs(
    cx: &mut Ctx,
    c: &Common,
    per_dir: Vec<(Vec<NodeId>, NodeId, Option<NodeId>)>,
) -> R<Vec<NodeId>> {
    let (b, hd) = (c.batch, c.hidden);
    let mut ydirs = Vec::new();
    let mut hs = Vec::new();
    let mut cs = Vec::new();
    for (ys, h, cc) in per_dir {
        let steps: Vec<NodeId> = ys
            .iter()
            .map(|&y| cx.reshape(y, vec![1, 1, b, hd]))
            .collect::<R<_>>()?;
        ydirs.push(cx.add(Op::Concat { axis: 0 }, steps)?);
        hs.push(cx.reshape(h, vec![1, b, hd])?);
        if let Some(cc) = cc {
            cs.push(cx.reshape(cc, vec![1, b, hd])?);
        }
    }
    let cat = |cx: &mut Ctx, v: Vec<NodeId>, axis: usize| -> R<NodeId> {
        if v.len() == 1 {
            Ok(v[0])
        } else {
            cx.add(Op::Concat { axis }, v)
        }
    };
    let mut y = cat(cx, ydirs, 1)?;
    let mut yh = cat(cx, hs, 0)?;
    let mut yc = if cs.is_empty() {
        None
    } else {
        Some(cat(cx, cs, 0)?)
    };
    if c.layout == 1 {
        y = transpose(cx, y, vec![2, 0, 1, 3])?;
        yh = transpose(cx, yh, vec![1, 0, 2])?;
        if let Some(v) = yc {
            yc = Some(transpose(cx, v, vec![1, 0, 2])?);
        }
    }
    let mut out = vec![y, yh];
    out.extend(yc);
    Ok(out)
}

fn directions(c: &Common) -> Vec<(usize, bool)> {
    if c.dirs == 2 {
        vec![(0, false), (1, true)]
    } else {
        vec![(0, c.reverse_only)]
    }
}

/// ONNX RNN: `H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`, f default Tanh.
pub fn rnn(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let c = common(cx, n, 1, &["Tanh"])?;
    let mut per_dir = Vec::new();
    for (d, rev) in directions(&c) {
        let w = dir_weights(cx, n, &c, d, 1)?;
        let xw = project(cx, &c, &w, true)?;
        let h0 = initial(cx, n, &c, 5, d)?;
        let f = c.acts[d][0].clone();
        let rt = w.rt;
        let cref = &c;
        let mut cell = |cx: &mut Ctx, xt: NodeId, h: NodeId, _c: Option<NodeId>| {
            let hr = cx.add(Op::MatMul, vec![h, rt])?;
            let s = cx.binary(BinaryOp::Add, xt, hr)?;
            let s = clip(cx, cref, s)?;
            Ok((apply_act(cx, &f, s)?, None))
        };
        per_dir.push(run_dir(cx, &c, rev, xw, h0, None, &mut cell)?);
    }
    outputs(cx, &c, per_dir)
}

/// ONNX GRU (gates z, r, h; `linear_before_reset`), f default Sigmoid, g default Tanh.
pub fn gru(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let c = common(cx, n, 3, &["Sigmoid", "Tanh"])?;
    let lbr = n.i("linear_before_reset", 0)? != 0;
    let hd = c.hidden;
    let mut per_dir = Vec::new();
    for (d, rev) in directions(&c) {
        let w = dir_weights(cx, n, &c, d, 3)?;
        // Input projection with Wb for all gates, plus Rb for z and r only.
        let mut xw = project(cx, &c, &w, false)?;
        let rb_h = match w.rb {
            Some(rb) => {
                let zr = slice_axis(cx, rb, 0, 0, 2 * hd)?;
                let zero = cx.scalar(c.dt, 0.0);
                let z = cx.add(Op::Broadcast { dims: vec![hd] }, vec![zero])?;
                let full = cx.add(Op::Concat { axis: 0 }, vec![zr, z])?;
                xw = cx.binary(BinaryOp::Add, xw, full)?;
                Some(slice_axis(cx, rb, 0, 2 * hd, hd)?)
            }
            None => None,
        };
        let h0 = initial(cx, n, &c, 5, d)?;
        let (f, g) = (c.acts[d][0].clone(), c.acts[d][1].clone());
        let rt_zr = slice_axis(cx, w.rt, 1, 0, 2 * hd)?;
        let rt_h = slice_axis(cx, w.rt, 1, 2 * hd, hd)?;
        let cref = &c;
        let mut cell = |cx: &mut Ctx, xt: NodeId, h: NodeId, _c: Option<NodeId>| {
            let hr = cx.add(Op::MatMul, vec![h, rt_zr])?;
            let xzr = slice_axis(cx, xt, 1, 0, 2 * hd)?;
            let s = cx.binary(BinaryOp::Add, xzr, hr)?;
            let s = clip(cx, cref, s)?;
            let zr = apply_act(cx, &f, s)?;
            let z = slice_axis(cx, zr, 1, 0, hd)?;
            let r = slice_axis(cx, zr, 1, hd, hd)?;
            let xh = slice_axis(cx, xt, 1, 2 * hd, hd)?;
            let rec = if lbr {
                let mut hr = cx.add(Op::MatMul, vec![h, rt_h])?;
                if let Some(rb) = rb_h {
                    hr = cx.binary(BinaryOp::Add, hr, rb)?;
                }
                cx.binary(BinaryOp::Mul, r, hr)?
            } else {
                let rh = cx.binary(BinaryOp::Mul, r, h)?;
                let mut v = cx.add(Op::MatMul, vec![rh, rt_h])?;
                if let Some(rb) = rb_h {
                    v = cx.binary(BinaryOp::Add, v, rb)?;
                }
                v
            };
            let s = cx.binary(BinaryOp::Add, xh, rec)?;
            let s = clip(cx, cref, s)?;
            let hh = apply_act(cx, &g, s)?;
            // H = (1 - z) * hh + z * h = hh + z * (h - hh)
            let diff = cx.binary(BinaryOp::Sub, h, hh)?;
            let zd = cx.binary(BinaryOp::Mul, z, diff)?;
            Ok((cx.binary(BinaryOp::Add, hh, zd)?, None))
        };
        per_dir.push(run_dir(cx, &c, rev, xw, h0, None, &mut cell)?);
    }
    outputs(cx, &c, per_dir)
}

/// ONNX LSTM (gates i, o, f, c; peepholes `P = [Pi, Po, Pf]`; `input_forget`), f default
/// Sigmoid, g and h default Tanh.
pub fn lstm(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let c = common(cx, n, 4, &["Sigmoid", "Tanh", "Tanh"])?;
    let input_forget = n.i("input_forget", 0)? != 0;
    let hd = c.hidden;
    let mut per_dir = Vec::new();
    for (d, rev) in directions(&c) {
        let w = dir_weights(cx, n, &c, d, 4)?;
        let xw = project(cx, &c, &w, true)?;
        let h0 = initial(cx, n, &c, 5, d)?;
        let c0 = initial(cx, n, &c, 6, d)?;
        let peep = match n.opt(7) {
            Some(p) => {
                if cx.dims(p) != [c.dirs, 3 * hd] {
                    return Err(format!("P {} has the wrong shape", cx.shape(p)));
                }
                let p = slice_axis(cx, p, 0, d, 1)?;
                let p = cx.reshape(p, vec![3 * hd])?;
                Some([
                    slice_axis(cx, p, 0, 0, hd)?,
                    slice_axis(cx, p, 0, hd, hd)?,
                    slice_axis(cx, p, 0, 2 * hd, hd)?,
                ])
            }
            None => None,
        };
        let (f, g, hact) = (
            c.acts[d][0].clone(),
            c.acts[d][1].clone(),
            c.acts[d][2].clone(),
        );
        let rt = w.rt;
        let cref = &c;
        let mut cell = |cx: &mut Ctx, xt: NodeId, h: NodeId, cp: Option<NodeId>| {
            let cp = cp.ok_or("LSTM cell state missing")?;
            let hr = cx.add(Op::MatMul, vec![h, rt])?;
            let s = cx.binary(BinaryOp::Add, xt, hr)?;
            let gate = |cx: &mut Ctx, k: usize| slice_axis(cx, s, 1, k * hd, hd);
            let (si, so, sf, sc) = (gate(cx, 0)?, gate(cx, 1)?, gate(cx, 2)?, gate(cx, 3)?);
            let with_peep = |cx: &mut Ctx, s: NodeId, k: usize, cv: NodeId| -> R<NodeId> {
                match &peep {
                    Some(p) => {
                        let pc = cx.binary(BinaryOp::Mul, p[k], cv)?;
                        cx.binary(BinaryOp::Add, s, pc)
                    }
                    None => Ok(s),
                }
            };
            let si = with_peep(cx, si, 0, cp)?;
            let si = clip(cx, cref, si)?;
            let i = apply_act(cx, &f, si)?;
            let fg = if input_forget {
                let one = cx.scalar(cref.dt, 1.0);
                cx.binary(BinaryOp::Sub, one, i)?
            } else {
                let sf = with_peep(cx, sf, 2, cp)?;
                let sf = clip(cx, cref, sf)?;
                apply_act(cx, &f, sf)?
            };
            let sc = clip(cx, cref, sc)?;
            let cc = apply_act(cx, &g, sc)?;
            let a = cx.binary(BinaryOp::Mul, fg, cp)?;
            let b = cx.binary(BinaryOp::Mul, i, cc)?;
            let cn = cx.binary(BinaryOp::Add, a, b)?;
            let so = with_peep(cx, so, 1, cn)?;
            let so = clip(cx, cref, so)?;
            let o = apply_act(cx, &f, so)?;
            let hc = apply_act(cx, &hact, cn)?;
            Ok((cx.binary(BinaryOp::Mul, o, hc)?, Some(cn)))
        };
        per_dir.push(run_dir(cx, &c, rev, xw, h0, Some(c0), &mut cell)?);
    }
    outputs(cx, &c, per_dir)
}

/// ONNX ReverseSequence: a GatherElements on `time_axis` reversing each batch entry's
/// first `len` steps; constant indices when `sequence_lens` is known at import time, else
/// indices computed from it at run time (`t < len ? len - 1 - t : t`).
pub fn reverse_sequence(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let l = n.inp(1)?;
    let r = cx.rank(x);
    if r < 2 {
        return Err(format!("input {} must have rank >= 2", cx.shape(x)));
    }
    let time = crate::ctx::norm_axis(n.i("time_axis", 0)?, r)?;
    let batch = crate::ctx::norm_axis(n.i("batch_axis", 1)?, r)?;
    if time == batch || time > 1 || batch > 1 {
        return Err(format!(
            "time_axis {time} and batch_axis {batch} must be 0 and 1 in some order"
        ));
    }
    let d = cx.dims(x);
    let lens = if cx.const_tensor(l).is_some() {
        let lens = crate::ctx::to_usizes(&cx.const_i64s(l, "sequence_lens")?, "sequence_lens")?;
        if lens.len() != d[batch] || lens.iter().any(|&l| l > d[time]) {
            return Err(format!(
                "sequence_lens {lens:?} must have {} entries of at most {}",
                d[batch], d[time]
            ));
        }
        Lens::Const(lens)
    } else {
        Lens::node(cx, l, d[batch])?
    };
    Ok(vec![reverse_seq(cx, x, time, batch, &lens)?])
}
