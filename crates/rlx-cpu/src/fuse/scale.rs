//! A per-channel scale Mul before a fused group's 1×1 conv, folded into the conv's weights
//! at run time ([`Scaled`], [`run_scaled`]): split from `fuse.rs` by responsibility (that
//! file plans and runs the groups; this is one of their optional heads).

use super::{constant, pointwise, run_group, weights, ConvGroup, Skip};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor};
use rlx_kernels::kernels::conv::{packed_release, packed_scaled, Packed};

/// `Mul(x, s)` (either order) with `s` of dims `[1, C, 1, 1]`, computed at run time (a
/// Squeeze-and-Excitation block's scale), read only by a 1×1 conv `W` `[O, C, 1, 1]`:
/// `W · (x ⊙ s) = (W ⊙ s) · x`, so the conv runs on `x` with `W'[o, c] = W[o, c] · s[c]`
/// (the folded weights when the group has them), `O·C` products instead of the Mul's pass
/// over `C·H·W` elements. Planned only where `O < H·W` (EfficientNet-B0: every block but
/// the 7×7 ones).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scaled {
    pub mul: NodeId,
    pub x: NodeId,
    pub s: NodeId,
    /// The conv's own weights and bias (f32 constants): `max_o Σ_c |W[o, c]|` and
    /// `max |b|` ([`scale_is_finite`]); None when they are not f32 constants.
    pub sums: Option<(f64, f64)>,
}

/// The scale Mul ([`Scaled`]) that group `grp`'s conv can take into its weights.
pub(super) fn scale_at(
    g: &Graph,
    grp: &ConvGroup,
    consumers: &[Vec<NodeId>],
    is_output: &[bool],
) -> Option<Scaled> {
    let conv = g.node(grp.conv);
    let Op::Conv(a) = &conv.op else { return None };
    let &mul = conv.inputs.first()?;
    let wd = g.node(*conv.inputs.get(1)?).shape.dims_usize();
    let m = g.node(mul);
    let (Op::Binary(BinaryOp::Mul), &[p, q]) = (&m.op, m.inputs.as_slice()) else {
        return None;
    };
    let xd = m.shape.dims_usize();
    let ok = pointwise(a, &wd)
        && m.shape.dtype == DType::F32
        && m.shape.is_static()
        && xd.len() == 4
        && xd[0] == 1
        && wd[1] == xd[1]
        && wd[0] < xd[2] * xd[3]
        && p != q
        && !is_output[mul.index()]
        && consumers[mul.index()].as_slice() == [grp.conv]
        && conv.inputs[1..].iter().all(|&i| i != mul);
    if !ok {
        return None;
    }
    let is = |id: NodeId, d: &[usize]| {
        let n = g.node(id);
        n.shape.is_static() && n.shape.dtype == DType::F32 && n.shape.dims_usize().as_slice() == d
    };
    let per_channel = [1, xd[1], 1, 1];
    let (x, s) = if is(p, &xd) && is(q, &per_channel) {
        (p, q)
    } else if is(q, &xd) && is(p, &per_channel) {
        (q, p)
    } else {
        return None;
    };
    // The conv's partial-sum bound, for a scanned run (`scale_is_finite`).
    let f32_const = |i: NodeId| constant(g, i).and_then(|t| t.as_f32());
    let sums = conv
        .inputs
        .get(1)
        .and_then(|&w| f32_const(w))
        .and_then(|w| {
            let b_max = match conv.inputs.get(2) {
                Some(&b) => {
                    f32::from_bits(rlx_kernels::kernels::wide::max_abs_bits(f32_const(b)?)) as f64
                }
                None => 0.0,
            };
            Some((rlx_kernels::kernels::max_row_abs_sum(w, wd[1]), b_max))
        });
    // A constant scale belongs in the plan-time fold, not here.
    (constant(g, s).is_none()).then_some(Scaled { mul, x, s, sums })
}

/// Group `grp`'s conv on `x` with its weights scaled per input channel by `s`
/// ([`Scaled`]): `W'[o, c] = W[o, c] · s[c]` (one f32 product each), then the conv and the
/// group's activation, when every `s[c]` is at most 1 in magnitude (a Sigmoid's range, as
/// in every SE block). Then neither `W·s` nor `x·s` can overflow, and the result differs
/// from `Mul` then the conv by rounding only (a NaN in `x`, or an Inf times a zero, still
/// gives NaN where it reaches). With the group's `packed` weights (RLX's product kernel),
/// those are scaled in their packed layout (`PackedConv::scaled_inputs`, the same products)
/// and the kernel runs on them. Any other `s` (larger, Inf or NaN; the two orders
/// overflow in different places) runs the `Mul`, then the group.
///
/// With `scan` (a NaN scanner on), the caller has proven the Mul's value finite without
/// making it, and the conv's partial sums bounded in both orders ([`scale_is_finite`]);
/// the first flag says whether the group's value is clean, as [`run_group`]'s does (else
/// the caller makes the Mul's value and replays the group op by op). The second flag: the
/// conv ran on folded weights (false where the Mul was made here). `skip`: the group's
/// [`Residual`] operand, to apply it (see [`run_group`]; not with `scan`).
pub(crate) fn run_scaled(
    g: &Graph,
    grp: &ConvGroup,
    x: &Tensor,
    s: &Tensor,
    packed: Option<&Packed>,
    scan: bool,
    skip: Option<Skip>,
) -> Result<(Tensor, bool, bool), crate::KernelError> {
    let bad = |m: &str| crate::KernelError::Invalid(format!("scaled conv: {m}"));
    if s.as_f32()
        .is_none_or(|v| rlx_kernels::kernels::wide::max_abs_bits(v) > 1f32.to_bits())
    {
        let shape = rlx_ir::Shape::new(x.dims(), DType::F32);
        let xs = rlx_kernels::kernels::elementwise::binary(BinaryOp::Mul, x, s, &shape)
            .map_err(|e| bad(&e.to_string()))?;
        let r = run_group(g, grp, &xs, None, packed, scan, skip, None);
        rlx_kernels::buffers::give(xs.into_data());
        return r.map(|(t, clean)| (t, clean, false));
    }
    // The group's packed weights, scaled in their packed layout (the same products).
    let scaled = packed
        .zip(s.as_f32())
        .and_then(|(pk, sv)| packed_scaled(pk, sv));
    if let Some(ps) = scaled {
        let r = run_group(g, grp, x, None, Some(&ps), scan, skip, None);
        packed_release(ps);
        return r.map(|(t, clean)| (t, clean, true));
    }
    let Some((w, _)) = weights(g, grp) else {
        return Err(bad("not a Conv with constant weights"));
    };
    let (Some(wv), Some(sv)) = (w.as_f32(), s.as_f32()) else {
        return Err(bad("weights or scale not f32"));
    };
    let c = sv.len();
    if c == 0 || w.dims().get(1) != Some(&c) || wv.len() % c != 0 {
        return Err(bad("the scale's length is not the weights' input channels"));
    }
    let mut ws = rlx_kernels::buffers::overwritten::<f32>(wv.len());
    for (o, row) in ws.chunks_mut(c).zip(wv.chunks(c)) {
        for ((o, &w), &s) in o.iter_mut().zip(row).zip(sv) {
            *o = w * s;
        }
    }
    let wt = Tensor::from_f32(w.dims(), ws).map_err(|e| bad(&e.to_string()))?;
    let r = run_group(g, grp, x, None, None, scan, skip, Some(&wt));
    rlx_kernels::buffers::give(wt.into_data());
    r.map(|(t, clean)| (t, clean, true))
}

/// Whether a NaN scan may skip group `grp`'s scale Mul `x ⊙ s` ([`Scaled`]) and run
/// [`run_scaled`]: `x` and `s` were scanned clean (`x_clean`, `s_clean`) and every
/// `|s[c]| ≤ 1`, so `|x·s| ≤ |x|` (no overflow) and no `inf · 0` (no NaN): the Mul's
/// counts are zero. And no partial sum of the conv can reach half of f32::MAX in either
/// order (`max|x| · max_o Σ_c |W[o, c]| + max|b|`, `W` and `b` the conv's own constants,
/// bounded at plan time in [`Scaled::sums`]):
/// `(W·s)·x` and `W·(x·s)` round differently, so near f32::MAX one order could overflow
/// where the other does not, and the folded run would then hide an Inf that the op-by-op
/// run reports at the conv.
pub(crate) fn scale_is_finite(
    sc: &Scaled,
    x: &Tensor,
    s: &Tensor,
    x_clean: bool,
    s_clean: bool,
) -> bool {
    use rlx_kernels::kernels::wide::max_abs_bits;
    let (Some(xv), Some(sv), Some((row_abs, b_max))) = (x.as_f32(), s.as_f32(), sc.sums) else {
        return false;
    };
    x_clean
        && s_clean
        && max_abs_bits(sv) <= 1f32.to_bits()
        && rlx_kernels::kernels::sums_below_half_max(max_abs_bits(xv), row_abs, b_max)
}
