//! A fused conv group's per-channel map folded into its conv's weights and bias
//! (`W'[m] = W[m]·a[m]`, `B'[m] = B[m]·a[m] + b[m]`, in f64, rounded once to f32), and
//! the folded copy a group holds ([`Folded`]).

use rlx_ir::Tensor;
use std::borrow::Cow;
use std::sync::Arc;

/// A group's conv weights and bias with its per-channel map folded in, shared by the
/// executors holding the same constants (`crate::prepared`).
#[derive(Debug)]
pub(crate) struct Folded {
    /// The folded weights (the conv's weight dims), set by the executor's plan
    /// (`crate::plan`) where a path of the group reads them unpacked. None where the plan
    /// holds them only packed for RLX's product kernel (folded, packed and let go one
    /// group at a time, so no second copy of those convs' weights is kept, nor made all at
    /// once: ResNet-50's peak RSS 318 → 250 MB). A path that still needs them folds them
    /// again ([`Folded::weights`]).
    pub w: Option<Arc<Tensor>>,
    /// The folded bias, `[M]`.
    pub bias: Arc<Tensor>,
    /// What they are folded from.
    pub src: crate::prepared::FoldSrc,
}

impl Folded {
    /// The folded weights: the kept copy, else folded again from `src` for this call (the
    /// same bits: the same f64 products of the same values). None where they cannot be
    /// (the fold failed when the group was made, so no group holds such a source).
    pub(super) fn weights(&self) -> Option<Cow<'_, Tensor>> {
        match &self.w {
            Some(w) => Some(Cow::Borrowed(&**w)),
            None => fold_src(&self.src).map(|(w, _)| Cow::Owned(w)),
        }
    }

    /// The folded weights, shared with the executors holding the same constants
    /// (`crate::prepared`): the kept copy, else the cache's, else folded now.
    pub(crate) fn shared(&self) -> Option<Arc<Tensor>> {
        if let Some(w) = &self.w {
            return Some(w.clone());
        }
        crate::prepared::folded(&self.src, || fold_src(&self.src)).map(|(w, _)| w)
    }
}

/// The folded weights and bias of what `s` names ([`fold`]).
pub(crate) fn fold_src(s: &crate::prepared::FoldSrc) -> Option<(Tensor, Tensor)> {
    let bias = match &s.bias {
        Some(b) => Some(b.as_f32()?),
        None => None,
    };
    fold(&s.w, s.w.as_f32()?, bias, &s.a, &s.b)
}

/// `W'[m] = W[m]·a[m]`, `B'[m] = B[m]·a[m] + b[m]` in f64, rounded once to f32; None when a
/// scale is zero or a folded value is not finite.
fn fold(
    w: &Tensor,
    wv: &[f32],
    bias: Option<&[f32]>,
    a: &[f64],
    b: &[f64],
) -> Option<(Tensor, Tensor)> {
    let bf = fold_bias(bias, a, b)?;
    let wf: Vec<f32> = folded_weights(wv, a).collect();
    if wf.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some((Tensor::from_f32(w.dims(), wf).ok()?, bf))
}

/// [`fold`]'s bias, where the fold succeeds (its conditions checked on every folded
/// weight, none kept).
pub(super) fn fold_checked(
    wv: &[f32],
    bias: Option<&[f32]>,
    a: &[f64],
    b: &[f64],
) -> Option<Tensor> {
    let bf = fold_bias(bias, a, b)?;
    folded_weights(wv, a).all(f32::is_finite).then_some(bf)
}

/// The folded bias, where every scale is finite and non-zero and every shift and folded
/// bias value finite.
fn fold_bias(bias: Option<&[f32]>, a: &[f64], b: &[f64]) -> Option<Tensor> {
    let m = a.len();
    if m == 0 || a.iter().chain(b).any(|x| !x.is_finite()) || a.contains(&0.0) {
        return None;
    }
    let bf: Vec<f32> = (0..m)
        .map(|i| (bias.map_or(0.0, |bb| bb[i] as f64) * a[i] + b[i]) as f32)
        .collect();
    if bf.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Tensor::from_f32(&[m], bf).ok()
}

/// The folded weights' values (`wv`'s rows of `wv.len() / a.len()` scaled by `a`).
fn folded_weights<'a>(wv: &'a [f32], a: &'a [f64]) -> impl Iterator<Item = f32> + 'a {
    let per = wv.len() / a.len().max(1);
    wv.iter()
        .enumerate()
        .map(move |(i, &x)| (x as f64 * a[i / per]) as f32)
}
