//! Normalizations (ONNX definitions): LayerNormalization, BatchNormalization (inference),
//! LRN.

use super::{fill_chunks, invalid, make, map_float, values_as, Elem, KResult};
use num_traits::Float;
use rlx_ir::Tensor;

/// `t`'s values broadcast (NumPy rules) to `dims`, as `T`.
fn side_input<T: Elem + Default>(t: &Tensor, dims: &[usize], what: &str) -> KResult<Vec<T>> {
    let n: usize = dims.iter().product();
    if t.numel() == n && t.dims().iter().product::<usize>() == n {
        let ok = t
            .dims()
            .iter()
            .filter(|&&d| d != 1)
            .eq(dims.iter().filter(|&&d| d != 1));
        if ok {
            return Ok(values_as(t.data()));
        }
    }
    let b = super::shape::broadcast(t, dims).map_err(|_| {
        crate::KernelError::Invalid(format!(
            "{what} {:?} does not broadcast to {dims:?}",
            t.dims()
        ))
    })?;
    Ok(values_as(b.data()))
}

fn layer_norm_impl<T: Float + Elem + Default>(
    v: &[T],
    d: usize,
    scale: &[T],
    bias: Option<&[T]>,
    eps: f32,
) -> Vec<T> {
    let mut out = crate::buffers::filled(v.len(), T::zero());
    if d == 0 {
        return out;
    }
    let nd = T::from(d).unwrap_or_else(T::nan);
    let eps = T::from(eps).unwrap_or_else(T::zero);
    fill_chunks(&mut out, d, |r, dst| {
        let x = &v[r * d..(r + 1) * d];
        let mean = x.iter().fold(T::zero(), |a, &b| a + b) / nd;
        let var = x
            .iter()
            .fold(T::zero(), |a, &b| a + (b - mean) * (b - mean))
            / nd;
        let inv = T::one() / (var + eps).sqrt();
        for j in 0..d {
            let y = (x[j] - mean) * inv * scale[j];
            dst[j] = match bias {
                Some(b) => y + b[j],
                None => y,
            };
        }
    });
    out
}

/// `Op::LayerNorm` (ONNX LayerNormalization, first output): normalize over `axis..rank`
/// with population variance, `y = (x - mean) / sqrt(var + eps) * scale + bias`.
pub(crate) fn layer_norm(
    x: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    axis: usize,
    eps: f32,
) -> KResult<Tensor> {
    let dims = x.dims();
    if axis > dims.len() {
        return invalid(format!(
            "layer_norm: axis {axis} out of range for rank {}",
            dims.len()
        ));
    }
    let nd = &dims[axis..];
    let d: usize = nd.iter().product();
    let data = map_float!(x.data(), "layer_norm", v => {
        let s = side_input(scale, nd, "layer_norm scale")?;
        let b = match bias { Some(b) => Some(side_input(b, nd, "layer_norm bias")?), None => None };
        layer_norm_impl(v, d, &s, b.as_deref(), eps)
    });
    make(dims.to_vec(), data)
}

fn batch_norm_impl<T: Float + Elem + Default>(
    v: &[T],
    c: usize,
    inner: usize,
    p: [&[T]; 4],
    eps: f32,
) -> Vec<T> {
    let [scale, bias, mean, var] = p;
    let eps = T::from(eps).unwrap_or_else(T::zero);
    let den: Vec<T> = var.iter().map(|&s| (s + eps).sqrt()).collect();
    let mut out = crate::buffers::filled(v.len(), T::zero());
    fill_chunks(&mut out, inner.max(1), |r, dst| {
        if inner == 0 {
            return;
        }
        let ch = r % c;
        let x = &v[r * inner..(r + 1) * inner];
        for (o, &xi) in dst.iter_mut().zip(x) {
            *o = (xi - mean[ch]) / den[ch] * scale[ch] + bias[ch];
        }
    });
    out
}

/// `Op::BatchNorm` (ONNX BatchNormalization, inference): inputs [x [N,C,*], scale [C],
/// bias [C], mean [C], var [C]]; `y = (x - mean) / sqrt(var + eps) * scale + bias`.
pub(crate) fn batch_norm(inputs: &[&Tensor], eps: f32) -> KResult<Tensor> {
    let x = inputs[0];
    let dims = x.dims();
    if dims.len() < 2 {
        return invalid("batch_norm: x must be [N, C, ...]");
    }
    let c = dims[1];
    for (k, t) in inputs[1..].iter().enumerate() {
        if t.numel() != c {
            return invalid(format!(
                "batch_norm: input {} has {} elements, expected C = {c}",
                k + 1,
                t.numel()
            ));
        }
    }
    let inner: usize = dims[2..].iter().product();
    let data = map_float!(x.data(), "batch_norm", v => {
        let ps: Vec<Vec<_>> = inputs[1..].iter().map(|t| values_as(t.data())).collect();
        batch_norm_impl(v, c, inner, [&ps[0], &ps[1], &ps[2], &ps[3]], eps)
    });
    make(dims.to_vec(), data)
}

fn lrn_impl<T: Float + Send + Sync + 'static>(
    v: &[T],
    c: usize,
    inner: usize,
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
) -> Vec<T> {
    let lo = (size.saturating_sub(1)) / 2;
    let hi = size.saturating_sub(1).div_ceil(2);
    // The window's sum of squares, the power and the division in f64, rounded once: (1e20)^2
    // overflows f32 where the exact output is finite.
    let a = alpha as f64 / size.max(1) as f64;
    let (b, k) = (beta as f64, bias as f64);
    let wide = |x: T| x.to_f64().unwrap_or(f64::NAN);
    let mut out = crate::buffers::filled(v.len(), T::zero());
    fill_chunks(&mut out, (c * inner).max(1), |n, dst| {
        if c * inner == 0 {
            return;
        }
        let x = &v[n * c * inner..(n + 1) * c * inner];
        for ch in 0..c {
            let from = ch.saturating_sub(lo);
            let to = (ch + hi).min(c - 1);
            for p in 0..inner {
                let mut s = 0f64;
                for q in from..=to {
                    let e = wide(x[q * inner + p]);
                    s += e * e;
                }
                let y = wide(x[ch * inner + p]) / (k + a * s).powf(b);
                dst[ch * inner + p] = T::from(y).unwrap_or_else(T::nan);
            }
        }
    });
    out
}

/// `Op::Lrn` (ONNX LRN): `y = x / (bias + alpha/size * Σ x²)^beta`, the sum over channels
/// `[c - floor((size-1)/2), c + ceil((size-1)/2)]` clipped to the valid range.
pub(crate) fn lrn(x: &Tensor, size: usize, alpha: f32, beta: f32, bias: f32) -> KResult<Tensor> {
    let dims = x.dims();
    if dims.len() < 2 {
        return invalid("lrn: x must be [N, C, ...]");
    }
    let c = dims[1];
    let inner: usize = dims[2..].iter().product();
    let data = map_float!(x.data(), "lrn", v => lrn_impl(v, c, inner, size, alpha, beta, bias));
    make(dims.to_vec(), data)
}
