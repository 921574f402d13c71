//! `ai.onnx.preview.training` optimizers (Adagrad, Adam, Momentum), lowered onto
//! elementwise ops as the ONNX reference implementation computes them. Inputs are
//! `R, T, X_1..X_n, G_1..G_n, (V_1..V_n,) (H_1..H_n)`; outputs the new `X`s then the new
//! state tensors.

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, UnaryOp};

/// All inputs after `R, T`, split into `groups` equal lists.
fn groups(n: &ONode, groups: usize) -> R<Vec<Vec<NodeId>>> {
    let k = n.n_inputs().saturating_sub(2);
    if k == 0 || !k.is_multiple_of(groups) {
        return Err(format!(
            "{} inputs do not hold R, T and {groups} equal groups of tensors",
            n.n_inputs()
        ));
    }
    let m = k / groups;
    (0..groups)
        .map(|g| (0..m).map(|i| n.inp(2 + g * m + i)).collect())
        .collect()
}

fn scal(cx: &mut Ctx, like: NodeId, v: f64) -> NodeId {
    cx.scalar(cx.dtype(like), v)
}

/// `a * x + b * y` with scalar constants (terms with a 0 coefficient skipped).
fn lin(cx: &mut Ctx, a: f64, x: NodeId, b: f64, y: NodeId) -> R<NodeId> {
    let ka = scal(cx, x, a);
    let ax = cx.binary(BinaryOp::Mul, ka, x)?;
    let kb = scal(cx, y, b);
    let by = cx.binary(BinaryOp::Mul, kb, y)?;
    cx.binary(BinaryOp::Add, ax, by)
}

/// `R` and `T` cast to the tensors' type (scalars).
fn rt(cx: &mut Ctx, n: &ONode, dt: DType) -> R<(NodeId, NodeId)> {
    let r = cx.cast(n.inp(0)?, dt)?;
    let t = cx.cast(n.inp(1)?, dt)?;
    Ok((r, t))
}

/// Adagrad: `r' = r / (1 + t * decay)`, `g' = norm * x + g`, `h' = h + g'^2`,
/// `x' = x - r' * g' / (sqrt(h') + eps)`.
pub fn adagrad(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let gs = groups(n, 3)?;
    let decay = n.f("decay_factor", 0.0)? as f64;
    let eps = n.f("epsilon", 0.0)? as f64;
    let norm = n.f("norm_coefficient", 0.0)? as f64;
    let dt = cx.dtype(gs[0][0]);
    let (r, t) = rt(cx, n, dt)?;
    let one = cx.scalar(dt, 1.0);
    let den = lin(cx, 1.0, one, decay, t)?;
    let r = cx.binary(BinaryOp::Div, r, den)?;
    let (mut xs, mut hs) = (Vec::new(), Vec::new());
    // `i` walks the parallel input groups (X, G, H, ...) together.
    #[allow(clippy::needless_range_loop)]
    for i in 0..gs[0].len() {
        let (x, g, h) = (gs[0][i], gs[1][i], gs[2][i]);
        let gr = lin(cx, norm, x, 1.0, g)?;
        let g2 = cx.binary(BinaryOp::Mul, gr, gr)?;
        let hn = cx.binary(BinaryOp::Add, h, g2)?;
        let sq = cx.unary(UnaryOp::Sqrt, hn)?;
        let e = scal(cx, sq, eps);
        let sq = cx.binary(BinaryOp::Add, sq, e)?;
        let step = cx.binary(BinaryOp::Mul, r, gr)?;
        let step = cx.binary(BinaryOp::Div, step, sq)?;
        xs.push(cx.binary(BinaryOp::Sub, x, step)?);
        hs.push(hn);
    }
    xs.extend(hs);
    Ok(xs)
}

/// Adam: `v' = alpha v + (1-alpha) g'`, `h' = beta h + (1-beta) g'^2`,
/// `r' = t > 0 ? r sqrt(1 - beta^t) / (1 - alpha^t) : r`,
/// `x' = (1 - norm_post) (x - r' v' / (sqrt(h') + eps))`.
pub fn adam(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let gs = groups(n, 4)?;
    let alpha = n.f("alpha", 0.9)? as f64;
    let beta = n.f("beta", 0.999)? as f64;
    let eps = n.f("epsilon", 0.0)? as f64;
    let norm = n.f("norm_coefficient", 0.0)? as f64;
    let post = n.f("norm_coefficient_post", 0.0)? as f64;
    let dt = cx.dtype(gs[0][0]);
    let (r, t) = rt(cx, n, dt)?;
    let one = cx.scalar(dt, 1.0);
    let zero = cx.scalar(dt, 0.0);
    let pow = |cx: &mut Ctx, b: f64| -> R<NodeId> {
        let bb = cx.scalar(dt, b);
        let p = cx.binary(BinaryOp::Pow, bb, t)?;
        cx.binary(BinaryOp::Sub, one, p)
    };
    let bt = pow(cx, beta)?;
    let at = pow(cx, alpha)?;
    let sb = cx.unary(UnaryOp::Sqrt, bt)?;
    let ra = cx.binary(BinaryOp::Mul, r, sb)?;
    let ra = cx.binary(BinaryOp::Div, ra, at)?;
    let pos = cx.binary(BinaryOp::Gt, t, zero)?;
    let r = cx.add(Op::Select, vec![pos, ra, r])?;
    let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    // `i` walks the parallel input groups (X, G, H, ...) together.
    #[allow(clippy::needless_range_loop)]
    for i in 0..gs[0].len() {
        let (x, g, v, h) = (gs[0][i], gs[1][i], gs[2][i], gs[3][i]);
        let gr = lin(cx, norm, x, 1.0, g)?;
        let vn = lin(cx, alpha, v, 1.0 - alpha, gr)?;
        let g2 = cx.binary(BinaryOp::Mul, gr, gr)?;
        let hn = lin(cx, beta, h, 1.0 - beta, g2)?;
        let sq = cx.unary(UnaryOp::Sqrt, hn)?;
        let e = scal(cx, sq, eps);
        let sq = cx.binary(BinaryOp::Add, sq, e)?;
        let q = cx.binary(BinaryOp::Div, vn, sq)?;
        let step = cx.binary(BinaryOp::Mul, r, q)?;
        let xn = cx.binary(BinaryOp::Sub, x, step)?;
        let k = scal(cx, xn, 1.0 - post);
        xs.push(cx.binary(BinaryOp::Mul, k, xn)?);
        vs.push(vn);
        hs.push(hn);
    }
    xs.extend(vs);
    xs.extend(hs);
    Ok(xs)
}

/// Momentum (`mode` "standard" or "nesterov"): `v' = alpha v + (t > 0 ? beta : 1) g'`,
/// `x' = x - r v'` (standard) or `x - r (g' + alpha v')` (nesterov).
pub fn momentum(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let gs = groups(n, 3)?;
    let alpha = n.f("alpha", 0.0)? as f64;
    let beta = n.f("beta", 0.0)? as f64;
    let norm = n.f("norm_coefficient", 0.0)? as f64;
    let nesterov = match n.s("mode", "standard")?.as_str() {
        "standard" => false,
        "nesterov" => true,
        o => return Err(format!("unknown mode \"{o}\"")),
    };
    let dt = cx.dtype(gs[0][0]);
    let (r, t) = rt(cx, n, dt)?;
    let zero = cx.scalar(dt, 0.0);
    let one = cx.scalar(dt, 1.0);
    let b = cx.scalar(dt, beta);
    let pos = cx.binary(BinaryOp::Gt, t, zero)?;
    let badj = cx.add(Op::Select, vec![pos, b, one])?;
    let (mut xs, mut vs) = (Vec::new(), Vec::new());
    // `i` walks the parallel input groups (X, G, H, ...) together.
    #[allow(clippy::needless_range_loop)]
    for i in 0..gs[0].len() {
        let (x, g, v) = (gs[0][i], gs[1][i], gs[2][i]);
        let gr = lin(cx, norm, x, 1.0, g)?;
        let a = scal(cx, v, alpha);
        let av = cx.binary(BinaryOp::Mul, a, v)?;
        let bg = cx.binary(BinaryOp::Mul, badj, gr)?;
        let vn = cx.binary(BinaryOp::Add, av, bg)?;
        let dir = if nesterov {
            let a = scal(cx, vn, alpha);
            let avn = cx.binary(BinaryOp::Mul, a, vn)?;
            cx.binary(BinaryOp::Add, gr, avn)?
        } else {
            vn
        };
        let step = cx.binary(BinaryOp::Mul, r, dir)?;
        xs.push(cx.binary(BinaryOp::Sub, x, step)?);
        vs.push(vn);
    }
    xs.extend(vs);
    Ok(xs)
}
