//! ONNX Conv (NC + 1..=3 spatial dims, groups, dilations, pads, optional bias), by
//! algorithm family, one file each:
//! * [`common`]: the geometry, scratch buffers and epilogue pieces every path shares;
//! * [`im2col`]: im2col + gemm, the general path (any dtype, rank and group count);
//! * [`depthwise`] and [`dw_simd`]: depthwise 2-D convs, generic and SIMD;
//! * [`direct`] and [`dconv`]: the direct f32 kernel (AVX-512) and its driver;
//! * [`winograd`]: Winograd F(2×2, 3×3);
//! * [`pack`] and [`packed`]: RLX's own product kernel on weights packed at build
//!   ([`PackedConv`], in `pack` with what its drivers share), driven by `packed` (tiles,
//!   and the dispatch), `packed_rows` (positions on the vector side) and `packed_im`
//!   (kernels larger than 1×1, the input read in place through zero-padded planes);
//! * [`pw_dw`](fn@pw_dw): a pointwise conv and the depthwise conv after it, interleaved.
//! * [`banded`]: a conv and the MaxPool that alone reads it, in bands of rows that stay in L2.
//!
//! This file dispatches a conv to one of them ([`conv_post`], [`conv_winograd`]). The
//! algorithm files import from `common` and not from one another (the pointwise-depthwise
//! pair uses `dw_simd`'s row kernels; `packed`, `packed_rows` and `packed_im` use `pack`'s
//! weights, task split, epilogue and transposition, `packed` calls the other two and
//! `winograd` asks `pack` which convs are packed), so no two files import each other.

pub mod banded;
mod common;
#[cfg(target_arch = "x86_64")]
pub(crate) mod dconv;
mod depthwise;
mod direct;
#[cfg(target_arch = "x86_64")]
mod dw_simd;
mod im2col;
#[cfg(target_arch = "x86_64")]
mod pack;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_im;
#[cfg(target_arch = "x86_64")]
mod packed_rows;
#[cfg(all(test, target_arch = "x86_64"))]
mod packed_rows_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod packed_tests;
mod pw_dw;
#[cfg(test)]
mod tests;
pub(crate) mod winograd;

use crate::kernels::{fill_chunks, invalid, make, out_dims, values_as, KResult};
use common::{geometry, with_col, Epilogue, BIAS_BEFORE_RESIDUAL, POST_MIN_RUN};
pub use common::{no_post, Act, Clamp, Post, PostBias, Residual};
use depthwise::depthwise_2d_f32;
use direct::conv_direct_f32;
use half::{bf16, f16};
use im2col::conv_float;
pub use im2col::CONV_SPLIT_FLOPS;
#[cfg(target_arch = "x86_64")]
pub use pack::{pack_form, packed_runs, packed_weights, MkIsa, PackForm, PackedConv};
pub use pw_dw::{pair_blocks_take, pw_dw, PAIR_BLOCKS_MAX_PLANE};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};
pub use winograd::{winograd_takes, winograd_transform, winograd_weights, WinogradWeights};

/// `Op::Conv` (ONNX Conv): x [N, C, *sp], w [M, C/groups, *k], optional bias [M];
/// output [N, M, *osp] with `osp = (sp + pad_b + pad_e - dil*(k-1) - 1) / stride + 1`.
pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
) -> KResult<Tensor> {
    conv_post(x, w, bias, a, out, Act::NONE, None)
}

/// [`conv`], then the fused group's activation `act` on each f32 output plane while it is
/// in cache (see `rlx_cpu::fuse`, and [`Act`] for its clamp, `post` and NaN scan). Other
/// dtypes ignore it. With a clamp the f32 kernels apply it instead of calling `post` (the
/// depthwise kernel in registers before each store, the im2col/gemm path in the same pass
/// as the bias).
///
/// `res`: a residual (f32, as many values as the output, laid out as it) added to each
/// output value before the activation ([`Residual`]; a ResNet shortcut fused into the
/// conv, see `rlx_cpu::fuse::Residual`). Not with `act.seen`. Error: `res` of another
/// length, or an input that is not f32.
pub fn conv_post(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    act: Act,
    res: Option<Residual>,
) -> KResult<Tensor> {
    conv_with(x, W::Tensor(w), bias, a, out, act, res)
}

/// Weights packed for RLX's own product kernel ([`PackedConv`]; a stand-in type where
/// there is none).
#[cfg(target_arch = "x86_64")]
pub type Packed = PackedConv;
#[cfg(not(target_arch = "x86_64"))]
pub enum Packed {}

/// A 1×1 conv's packed weights with input channel `c` scaled by `s[c]`
/// ([`PackedConv::scaled_inputs`]; hand it back with [`packed_release`]); None where that
/// does not apply.
pub fn packed_scaled(pk: &Packed, s: &[f32]) -> Option<Packed> {
    #[cfg(target_arch = "x86_64")]
    return pk.scaled_inputs(s);
    #[cfg(not(target_arch = "x86_64"))]
    match *pk {}
}

/// Hands a [`packed_scaled`] copy's buffer back to the pool.
pub fn packed_release(pk: Packed) {
    #[cfg(target_arch = "x86_64")]
    pk.release();
    #[cfg(not(target_arch = "x86_64"))]
    match pk {}
}

/// [`conv_post`] through RLX's product kernel on `pk`, a conv's `[M, C, KH, KW]` f32
/// weights packed by [`packed_weights`] when the executor was built. Where `pk` does not
/// fit the conv, [`conv_post`]'s own paths on the weights unpacked from `pk` (the same
/// values: an executor keeps no unpacked copy for this); the same epilogue semantics
/// either way. Errors as [`conv_post`] (an input that is not f32 is one).
pub fn conv_packed(
    x: &Tensor,
    pk: &Packed,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    act: Act,
    res: Option<Residual>,
) -> KResult<Tensor> {
    conv_with(x, W::Packed(pk), bias, a, out, act, res)
}

/// A conv's weights as [`conv_with`] gets them: a tensor, or only their packed form
/// (unpacked where a path needs them in their own layout).
#[derive(Clone, Copy)]
enum W<'a> {
    Tensor(&'a Tensor),
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Packed(&'a Packed),
}

impl W<'_> {
    fn dims(&self) -> &[usize] {
        match self {
            W::Tensor(t) => t.dims(),
            #[cfg(target_arch = "x86_64")]
            W::Packed(pk) => pk.wdims(),
            #[cfg(not(target_arch = "x86_64"))]
            W::Packed(pk) => match **pk {},
        }
    }

    fn dtype(&self) -> rlx_ir::DType {
        match self {
            W::Tensor(t) => t.dtype(),
            W::Packed(_) => rlx_ir::DType::F32,
        }
    }

    fn packed(&self) -> Option<&Packed> {
        match self {
            W::Tensor(_) => None,
            W::Packed(pk) => Some(pk),
        }
    }

    /// The f32 values in `[M, C, KH, KW]` order (None for a tensor of another dtype).
    fn f32_values(&self) -> Option<std::borrow::Cow<'_, [f32]>> {
        match self {
            W::Tensor(t) => match t.data() {
                TensorData::F32(v) => Some(std::borrow::Cow::Borrowed(v.as_slice())),
                _ => None,
            },
            #[cfg(target_arch = "x86_64")]
            W::Packed(pk) => Some(std::borrow::Cow::Owned(pk.unpack())),
            #[cfg(not(target_arch = "x86_64"))]
            W::Packed(pk) => match **pk {},
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn conv_with(
    x: &Tensor,
    w: W,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    act: Act,
    res: Option<Residual>,
) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let g = geometry(x.dims(), w.dims(), a, &od)?;
    if let Some(r) = &res {
        if r.len() != od.iter().product::<usize>() || x.dtype() != rlx_ir::DType::F32 {
            return invalid(format!(
                "conv: a residual of {} f32 values does not fit the output {od:?} ({})",
                r.len(),
                x.dtype()
            ));
        }
    }
    if let Some(b) = bias {
        if b.numel() != g.m {
            return invalid(format!(
                "conv: bias has {} elements, expected {}",
                b.numel(),
                g.m
            ));
        }
    }
    if x.dtype() != w.dtype() {
        return invalid(format!("conv: x is {} but w is {}", x.dtype(), w.dtype()));
    }
    use TensorData as D;
    let pk = w.packed();
    // Weights known only packed are unpacked where a path reads them in their own layout.
    let w = match (w, x.data()) {
        (W::Tensor(t), _) => t,
        (W::Packed(_), D::F32(xv)) => {
            let wv = std::cell::OnceCell::new();
            let wv = || -> &[f32] { wv.get_or_init(|| w.f32_values().unwrap_or_default()) };
            return conv_f32(xv, w.dims(), &wv, pk, bias, &g, &od, act, res);
        }
        (W::Packed(_), d) => return invalid(format!("conv: packed weights, x is {}", d.dtype())),
    };
    let data = match (x.data(), w.data()) {
        (D::F32(xv), D::F32(wv)) => {
            return conv_f32(xv, w.dims(), &|| wv, pk, bias, &g, &od, act, res);
        }
        (D::F64(xv), D::F64(wv)) => {
            let b: Option<Vec<f64>> = bias.map(|b| values_as(b.data()));
            let epi = Epilogue {
                bias: b.as_deref(),
                clamp: None,
                post: &|_: &mut [f64]| {},
                post_bias: None,
                seen: None,
            };
            D::F64(conv_float(xv, wv, &g, &epi, None)?)
        }
        (D::F16(_), D::F16(_)) | (D::BF16(_), D::BF16(_)) => {
            let xv = x.data().to_f32_vec();
            let wv = w.data().to_f32_vec();
            let b: Option<Vec<f32>> = bias.map(|b| values_as(b.data()));
            let r = conv_float(&xv, &wv, &g, &Act::NONE.with_bias(b.as_deref()), None)?;
            if x.dtype() == rlx_ir::DType::F16 {
                D::F16(r.into_iter().map(f16::from_f32).collect())
            } else {
                D::BF16(r.into_iter().map(bf16::from_f32).collect())
            }
        }
        (d, _) => return invalid(format!("conv: unsupported dtype {}", d.dtype())),
    };
    make(od, data)
}

/// [`conv_with`]'s f32 paths: `wv` gives the weights (dims `wdims`) in their own layout,
/// called only where a path reads them so (`pk`'s kernel does not).
#[allow(clippy::too_many_arguments)]
fn conv_f32<'w>(
    xv: &[f32],
    wdims: &[usize],
    wv: &dyn Fn() -> &'w [f32],
    pk: Option<&Packed>,
    bias: Option<&Tensor>,
    g: &common::Geo,
    od: &[usize],
    act: Act,
    res: Option<Residual>,
) -> KResult<Tensor> {
    use TensorData as D;
    let b: Option<Vec<f32>> = bias.map(|b| values_as(b.data()));
    // `(conv + r) + b` against the unfused `(conv + b) + r`: with every |b| at most
    // 2^64, far below half a unit in the last place at f32::MAX (2^103), the two can
    // overflow differently only by a last-place rounding there. A larger (or
    // non-finite) bias goes first, the unfused order: `r` is then read.
    let spare;
    let res = match res {
        Some(Residual::Into(v))
            if b.iter()
                .flatten()
                .any(|x| x.is_nan() || x.abs() > BIAS_BEFORE_RESIDUAL) =>
        {
            spare = v;
            Some(Residual::Read(&spare))
        }
        r => r,
    };
    // The depthwise kernels skip taps in the padding; with a non-finite weight the
    // definition's `inf · 0 = NaN` there matters, so such a conv takes im2col.
    let dw =
        g.depthwise_2d() && res.is_none() && crate::kernels::wide::max_abs_bits(wv()) < 0x7f80_0000;
    // Planes below POST_MIN_RUN elements take `post` in one pass after the conv
    // (per-plane calls cost more than the cache they save there).
    let p: usize = g.osp.iter().product();
    let per_plane = p >= POST_MIN_RUN;
    // The kernels take the largest |y| bits only where they apply a clamp.
    let epi = Epilogue {
        seen: act.seen.filter(|_| act.clamp.is_some()),
        ..act.with_bias(b.as_deref())
    };
    let dw_epi = Epilogue {
        post: if per_plane {
            act.post_unless_clamped()
        } else {
            &no_post
        },
        post_bias: epi.post_bias.filter(|_| per_plane),
        ..epi
    };
    match dw.then(|| depthwise_2d_f32(xv, wv(), g, &dw_epi)).flatten() {
        Some(mut o) => {
            if !per_plane && act.clamp.is_none() {
                fill_chunks(&mut o, 8192, |_, c| (act.post)(c));
            }
            make(od.to_vec(), D::F32(o))
        }
        None => {
            // A residual buffer the pointwise kernel on positions can take as its
            // output (`(conv + r) + bias`, as gemm's accumulation onto it).
            #[cfg(target_arch = "x86_64")]
            let res = match (pk, res) {
                (Some(pk), Some(Residual::Into(v))) => {
                    match packed::conv_packed_into(xv, pk, wdims, g, &epi, v) {
                        Ok(o) => return make(od.to_vec(), D::F32(o)),
                        Err(v) => Some(Residual::Into(v)),
                    }
                }
                (_, r) => r,
            };
            let read = res.as_ref().map(|r| r.values());
            #[cfg(target_arch = "x86_64")]
            let o = pk.and_then(|pk| packed::conv_packed_f32(xv, pk, wdims, g, &epi, read));
            #[cfg(not(target_arch = "x86_64"))]
            let o = pk.and(None);
            if let Some(o) = o.or_else(|| conv_direct_f32(xv, wv(), g, &epi, read)) {
                if let Some(Residual::Into(v)) = res {
                    crate::buffers::give(D::F32(v));
                }
                return make(od.to_vec(), D::F32(o));
            }
            make(od.to_vec(), D::F32(conv_float(xv, wv(), g, &epi, res)?))
        }
    }
}

/// [`conv_post`] through the Winograd transform `wg` of `w` (made by [`winograd_weights`]).
/// Falls back to [`conv_post`] when the shapes do not fit `wg`, when the input holds a
/// NaN/Inf or values large enough that a direct partial sum could overflow
/// ([`WinogradWeights::direct_stays_finite`]), or when an output (before `post`) is not
/// finite; so the result's NaN/Inf are always the direct conv's. Errors as [`conv`].
pub fn conv_winograd(
    x: &Tensor,
    wg: &WinogradWeights,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
    post: Post,
) -> KResult<Tensor> {
    let plain = Act {
        clamp: None,
        post,
        post_bias: None,
        seen: None,
    };
    let od = out_dims(out)?;
    let g = geometry(x.dims(), w.dims(), a, &od)?;
    let fits = g.sp.len() == 2
        && g.groups == 1
        && g.ks == [3, 3]
        && g.strides == [1, 1]
        && g.dil == [1, 1]
        && g.m == wg.m()
        && g.c == wg.c()
        && bias.is_none_or(|b| b.numel() == g.m && b.dtype() == rlx_ir::DType::F32);
    if let (true, TensorData::F32(xv)) = (fits, x.data()) {
        let b: Option<Vec<f32>> = bias.map(|b| values_as(b.data()));
        let b_max = b.iter().flatten().fold(0f64, |m, v| m.max(v.abs() as f64));
        if !wg.direct_stays_finite(crate::kernels::wide::max_abs_bits(xv), b_max) {
            return conv_post(x, w, bias, a, out, plain, None);
        }
        let d = winograd::Dims {
            n: g.n,
            h: g.sp[0],
            w: g.sp[1],
            pt: g.pads[0].0,
            pl: g.pads[1].0,
            oh: g.osp[0],
            ow: g.osp[1],
        };
        let ts = g.n * g.osp[0].div_ceil(2) * g.osp[1].div_ceil(2);
        let o = if winograd::slabs_on(g.m, g.c) {
            winograd::conv_slabs(xv, wg, b.as_deref(), d, post)
        } else {
            with_col(16 * g.c * ts, |v: &mut [f32]| {
                winograd::conv(xv, wg, b.as_deref(), d, v, post)
            })
        };
        if let Some(o) = o {
            return make(od, TensorData::F32(o));
        }
    }
    conv_post(x, w, bias, a, out, plain, None)
}
