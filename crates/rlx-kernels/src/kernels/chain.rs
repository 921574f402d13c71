//! Block loops of the fused elementwise chains (`rlx_cpu::ewfuse`): each op over part of a
//! block with the element function of its unfused kernel, compiled for the widest ISA.

use rlx_ir::{Activation, BinaryOp};

/// An op of a chain.
#[derive(Debug, Clone, Copy)]
pub enum StepOp {
    Unary(rlx_ir::UnaryOp),
    Act(Activation),
    Bin(BinaryOp),
}

/// An operand over part of a block: a slice, or one value for every element.
#[derive(Clone, Copy)]
pub enum Src<'a> {
    S(&'a [f32]),
    C(f32),
}

/// `dst[i] = f(p[i], q[i])`, each loop with `f` inlined (vectorized like `bin_map`'s).
#[inline(always)]
fn zip2(dst: &mut [f32], p: Src, q: Src, f: impl Fn(f32, f32) -> f32) {
    match (p, q) {
        (Src::S(p), Src::S(q)) => {
            for ((d, &p), &q) in dst.iter_mut().zip(p).zip(q) {
                *d = f(p, q);
            }
        }
        (Src::S(p), Src::C(q)) => {
            for (d, &p) in dst.iter_mut().zip(p) {
                *d = f(p, q);
            }
        }
        (Src::C(p), Src::S(q)) => {
            for (d, &q) in dst.iter_mut().zip(q) {
                *d = f(p, q);
            }
        }
        (Src::C(p), Src::C(q)) => dst.fill(f(p, q)),
    }
}

isa_fn!(
    /// `Op::Binary` `b` of f32 over a block part, with the element function of
    /// `kernels::elementwise::binary` (its `Pow(·, 2)` and `Pow(·, 3)` by products when the
    /// exponent is one element), compiled for the widest ISA as the unfused kernels are.
    pub fn binary_part[](b: BinaryOp, dst: &mut [f32], p: Src, q: Src, q_one: Option<f32>) {
        match b {
            BinaryOp::Add => zip2(dst, p, q, |p, q| p + q),
            BinaryOp::Sub => zip2(dst, p, q, |p, q| p - q),
            BinaryOp::Mul => zip2(dst, p, q, |p, q| p * q),
            BinaryOp::Div => zip2(dst, p, q, |p, q| p / q),
            BinaryOp::Pow if q_one == Some(2.0) => zip2(dst, p, q, |p, _| p * p),
            BinaryOp::Pow if q_one == Some(3.0) => zip2(dst, p, q, |p, _| p * p * p),
            BinaryOp::Max => zip2(dst, p, q, max_f32),
            BinaryOp::Min => zip2(dst, p, q, min_f32),
            _ => zip2(dst, p, q, |p, q| b.apply_f32(p, q)),
        }
    }
);

/// [`binary_part`]'s element function on one pair of values.
pub(crate) fn binary_one(b: BinaryOp, p: f32, q: f32, q_one: Option<f32>) -> f32 {
    let mut d = [0f32; 1];
    binary_part(b, &mut d, Src::C(p), Src::C(q), q_one);
    d[0]
}

isa_fn!(
    /// `dst[i] = f(x[i])` for the element functions of the Unary and Activation kernels
    /// that have no slice kernel, compiled for the widest ISA.
    pub fn map_part[](op: StepOp, dst: &mut [f32], x: &[f32]) {
        use rlx_ir::UnaryOp;
        #[inline(always)]
        fn map(dst: &mut [f32], x: &[f32], f: impl Fn(f32) -> f32) {
            for (d, &x) in dst.iter_mut().zip(x) {
                *d = f(x);
            }
        }
        match op {
            StepOp::Unary(UnaryOp::Neg) => map(dst, x, |a| -a),
            StepOp::Unary(UnaryOp::Sqrt) => map(dst, x, |a| a.sqrt()),
            StepOp::Unary(u) => map(dst, x, |a| u.apply_f32(a)),
            StepOp::Act(Activation::Relu) => map(dst, x, |v| if v < 0.0 { 0.0 } else { v }),
            StepOp::Act(a) => map(dst, x, |v| a.apply_f32(v)),
            StepOp::Bin(_) => unreachable!("binary steps go through binary_part"),
        }
    }
);

/// ONNX Max of two f32, as `BinaryOp::apply_f32` computes it: NaN if either is NaN. A plain
/// function (not the op's match) so that the loops calling it vectorize; the Max kernels
/// and the fused Clip (`rlx_cpu::fuse`) all use it, so their bits agree.
#[inline(always)]
pub fn max_f32(p: f32, q: f32) -> f32 {
    if p.is_nan() || q.is_nan() {
        f32::NAN
    } else {
        p.max(q)
    }
}

/// ONNX Min of two f32; see [`max_f32`].
#[inline(always)]
pub fn min_f32(p: f32, q: f32) -> f32 {
    if p.is_nan() || q.is_nan() {
        f32::NAN
    } else {
        p.min(q)
    }
}

/// GELU's erf form as exported from PyTorch (`x * 0.5 * (1 + erf(x / sqrt(2)))`: five ops,
/// `d = x / c0` (or `x * c0`), `e = Erf(d)`, `e1 = e + c1`, `m = x * e1`, `y = m * c2`),
/// computed in one pass over a block part instead of five. Each element goes through the
/// same expressions as the five unfused kernels, in the same order, so the same bits:
/// `p / q` or `p * q` as [`binary_part`], `fastmath::erf_core` with a NaN kept as it came
/// (`fastmath::erf_slice`'s fix-up pass), then `p + q`, `p * q`, `p * q` (f32 sums and
/// products are commutative, so operand order is not recorded; which NaN payload survives
/// a NaN · NaN may differ, as between the unfused kernels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErfGelu {
    /// `d = x / c0` (true) or `x * c0` (false).
    pub div: bool,
    pub c0: f32,
    pub c1: f32,
    pub c2: f32,
}

isa_fn!(
    /// [`ErfGelu`] of `x` into `dst` (lengths must match), compiled for the widest ISA as
    /// the unfused kernels are.
    pub fn erf_gelu_part[](g: &ErfGelu, dst: &mut [f32], x: &[f32]) {
        #[inline(always)]
        fn run(dst: &mut [f32], x: &[f32], c1: f32, c2: f32, d: impl Fn(f32) -> f32) {
            use super::fastmath::erf_core;
            for (y, &x) in dst.iter_mut().zip(x) {
                let d = d(x);
                let e = if d.is_nan() { d } else { erf_core(d) };
                let e1 = e + c1;
                let m = x * e1;
                *y = m * c2;
            }
        }
        let (c0, c1, c2) = (g.c0, g.c1, g.c2);
        if g.div {
            run(dst, x, c1, c2, |x| x / c0)
        } else {
            run(dst, x, c1, c2, |x| x * c0)
        }
    }
);
