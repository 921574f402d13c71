//! ONNX Resize (opsets 10–19) and Upsample, lowered at import time: shapes are static, so
//! every output coordinate's source neighbours and weights are known constants.
//!
//! Resize is separable: each resized axis (ascending, as onnx's reference implementation
//! applies them) becomes either a `Gather` with constant indices (`mode = nearest`, exact
//! for every dtype) or a `MatMul` with a constant `[out, in]` weight matrix (`linear`,
//! `cubic`, with `antialias` and `exclude_outside`). `tf_crop_and_resize` positions outside
//! the input become `extrapolation_value` through a `Select` with a constant mask.
//! Coordinates, neighbour choice and coefficients follow `onnx/reference/ops/op_resize.py`
//! (onnx 1.23): `_compute_x_ori`, `_interpolate_1d_along_axis`, `_*_coeffs*`.

use crate::ctx::{norm_axis, Ctx, ONode, R};
use rlx_ir::{DType, NodeId, Op, Tensor, TensorData};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

struct Attrs {
    mode: Mode,
    coord: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    extrapolation: f64,
}

/// One resized axis: for each output position, its (clamped) source indices with weights,
/// and whether it is extrapolated.
struct AxisPlan {
    rows: Vec<Vec<(usize, f64)>>,
    extrapolated: Vec<bool>,
}

fn coeffs(a: &Attrs, ratio: f64, scale: f64) -> Vec<f64> {
    match a.mode {
        Mode::Nearest => {
            let up = if ratio == 1.0 {
                true
            } else {
                match a.nearest.as_str() {
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => false,
                    "ceil" => true,
                    _ => ratio > 0.5,
                }
            };
            if up {
                vec![0.0, 1.0]
            } else {
                vec![1.0, 0.0]
            }
        }
        Mode::Linear if a.antialias => {
            let s = scale.min(1.0);
            let start = (-1.0 / s).floor() as i64 + 1;
            let foot = 2 - 2 * start;
            let c: Vec<f64> = (start..start + foot)
                .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                .collect();
            let sum: f64 = c.iter().sum();
            c.into_iter().map(|v| v / sum).collect()
        }
        Mode::Linear => vec![1.0 - ratio, ratio],
        Mode::Cubic if a.antialias => {
            let s = scale.min(1.0);
            let aa = a.cubic_a;
            let f = |x: f64| {
                let x = x.abs();
                let (x2, x3) = (x * x, x * x * x);
                if x <= 1.0 {
                    (aa + 2.0) * x3 - (aa + 3.0) * x2 + 1.0
                } else if x < 2.0 {
                    aa * x3 - 5.0 * aa * x2 + 8.0 * aa * x - 4.0 * aa
                } else {
                    0.0
                }
            };
            let i_start = (-2.0 / s).floor() as i64 + 1;
            let i_end = 2 - i_start;
            let c: Vec<f64> = (i_start..i_end)
                .map(|i| f(s * (i as f64 - ratio)))
                .collect();
            let sum: f64 = c.iter().sum();
            c.into_iter().map(|v| v / sum).collect()
        }
        Mode::Cubic => {
            let aa = a.cubic_a;
            let r = ratio;
            let q = 1.0 - r;
            vec![
                ((aa * (r + 1.0) - 5.0 * aa) * (r + 1.0) + 8.0 * aa) * (r + 1.0) - 4.0 * aa,
                ((aa + 2.0) * r - (aa + 3.0)) * r * r + 1.0,
                ((aa + 2.0) * q - (aa + 3.0)) * q * q + 1.0,
                ((aa * (q + 1.0) - 5.0 * aa) * (q + 1.0) + 8.0 * aa) * (q + 1.0) - 4.0 * aa,
            ]
        }
    }
}

/// Plan one axis of `input` elements resized to `out` with `scale` and roi `(start, end)`.
fn plan_axis(a: &Attrs, input: usize, out: usize, scale: f64, roi: (f64, f64)) -> R<AxisPlan> {
    let in_f = input as f64;
    let out_w = scale * in_f;
    let mut rows = Vec::with_capacity(out);
    let mut extrapolated = vec![false; out];
    for (y, ex) in extrapolated.iter_mut().enumerate() {
        let yf = y as f64;
        let x = match a.coord.as_str() {
            "align_corners" => {
                if out_w == 1.0 {
                    0.0
                } else {
                    yf * (in_f - 1.0) / (out_w - 1.0)
                }
            }
            "asymmetric" => yf / scale,
            "tf_crop_and_resize" => {
                let x = if out_w == 1.0 {
                    (roi.1 - roi.0) * (in_f - 1.0) / 2.0
                } else {
                    yf * (roi.1 - roi.0) * (in_f - 1.0) / (out_w - 1.0)
                } + roi.0 * (in_f - 1.0);
                *ex = x < 0.0 || x > in_f - 1.0;
                x
            }
            "pytorch_half_pixel" => {
                if out_w == 1.0 {
                    -0.5
                } else {
                    (yf + 0.5) / scale - 0.5
                }
            }
            "half_pixel" => (yf + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let adjustment = out as f64 / out_w;
                let offset = in_f / 2.0 * (1.0 - adjustment);
                offset + (yf + 0.5) / scale - 0.5
            }
            o => return Err(format!("unknown coordinate_transformation_mode \"{o}\"")),
        };
        if !x.is_finite() {
            return Err(format!("source coordinate {x} for output position {y}"));
        }
        let fl = x.floor();
        let ratio = if x == fl { 1.0 } else { x - fl };
        let mut c = coeffs(a, ratio, scale);
        let n = c.len() as i64;
        // n is even for every mode: the n nearest indices, preferring the lower one.
        let start = fl as i64 + if x == fl { -(n / 2) } else { -(n / 2) + 1 };
        let idx: Vec<i64> = (start..start + n).collect();
        if a.exclude_outside {
            for (k, &i) in idx.iter().enumerate() {
                if i < 0 || i >= input as i64 {
                    c[k] = 0.0;
                }
            }
            let s: f64 = c.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            c.iter_mut().for_each(|v| *v /= s);
        }
        let row = idx
            .iter()
            .zip(&c)
            .filter(|(_, &w)| w != 0.0)
            .map(|(&i, &w)| (i.clamp(0, input as i64 - 1) as usize, w))
            .collect();
        rows.push(row);
    }
    Ok(AxisPlan { rows, extrapolated })
}

/// Apply `plan` along `axis` of `x`.
fn apply_axis(cx: &mut Ctx, x: NodeId, axis: usize, plan: &AxisPlan, a: &Attrs) -> R<NodeId> {
    let d = cx.dims(x);
    let dt = cx.dtype(x);
    let (input, out) = (d[axis], plan.rows.len());
    let mut y = if a.mode == Mode::Nearest {
        let idx: Vec<i64> = plan
            .rows
            .iter()
            .map(|r| {
                r.iter()
                    .find(|(_, w)| *w != 0.0)
                    .map_or(0, |(i, _)| *i as i64)
            })
            .collect();
        let idx = cx.i64s(&idx);
        cx.add(Op::Gather { axis }, vec![x, idx])?
    } else {
        if !dt.is_float() {
            return Err(format!(
                "{} resize of a {dt} tensor is not supported (float only)",
                if a.mode == Mode::Linear {
                    "linear"
                } else {
                    "cubic"
                }
            ));
        }
        let mut w = vec![0.0f64; out * input];
        for (o, row) in plan.rows.iter().enumerate() {
            for &(i, c) in row {
                w[o * input + i] += c;
            }
        }
        let before: usize = d[..axis].iter().product();
        let after: usize = d[axis + 1..].iter().product();
        // Negative taps (cubic's lobes) let a partial sum exceed the largest input: a
        // FLT_MAX plateau sums to 1.03 * FLT_MAX = inf in f32 although the result is FLT_MAX
        // (issue 28). Those axes accumulate in f64; convex weights (linear, antialias) bound
        // every partial sum by max |x| and keep the input dtype.
        let wide = dt != DType::F64 && w.iter().any(|&v| v < 0.0);
        let dt_in = dt;
        let (x, dt) = if wide {
            (cx.cast(x, DType::F64)?, DType::F64)
        } else {
            (x, dt)
        };
        let y = if after == 1 {
            // x [.., in] @ W^T [in, out]
            let mut wt = vec![0.0f64; input * out];
            for o in 0..out {
                for i in 0..input {
                    wt[i * out + o] = w[o * input + i];
                }
            }
            let wt = Tensor::new(vec![input, out], TensorData::from_f64(dt, &wt))
                .map_err(|e| e.to_string())?;
            let wt = cx.constant(wt);
            let x2 = cx.reshape(x, vec![before, input])?;
            cx.add(Op::MatMul, vec![x2, wt])?
        } else {
            // W [out, in] @ x [before, in, after]
            let wm = Tensor::new(vec![out, input], TensorData::from_f64(dt, &w))
                .map_err(|e| e.to_string())?;
            let wm = cx.constant(wm);
            let x3 = cx.reshape(x, vec![before, input, after])?;
            cx.add(Op::MatMul, vec![wm, x3])?
        };
        let y = if wide { cx.cast(y, dt_in)? } else { y };
        let mut od = d.clone();
        od[axis] = out;
        cx.reshape(y, od)?
    };
    if plan.extrapolated.iter().any(|&e| e) {
        let mut md = vec![1; d.len()];
        md[axis] = out;
        let mask = Tensor::new(md, TensorData::Bool(plan.extrapolated.clone()))
            .map_err(|e| e.to_string())?;
        let mask = cx.constant(mask);
        let ev = cx.scalar(dt, a.extrapolation);
        y = cx.add(Op::Select, vec![mask, ev, y])?;
    }
    Ok(y)
}

/// Shared driver: `scales`/`sizes` per listed axis (`axes`), `roi` as `[starts.., ends..]`
/// over the same axes.
#[allow(clippy::too_many_arguments)]
fn resize_impl(
    cx: &mut Ctx,
    x: NodeId,
    a: &Attrs,
    axes: Vec<usize>,
    scales: Option<Vec<f64>>,
    sizes: Option<Vec<i64>>,
    roi: Option<Vec<f64>>,
    policy: &str,
) -> R<NodeId> {
    let d = cx.dims(x);
    let r = d.len();
    let na = axes.len();
    let mut scale = vec![1.0f64; r];
    let mut out = d.clone();
    match (scales, sizes) {
        (_, Some(sz)) => {
            if sz.len() != na {
                return Err(format!("sizes {sz:?} needs {na} entries"));
            }
            for (k, &ax) in axes.iter().enumerate() {
                if sz[k] < 0 {
                    return Err(format!("sizes {sz:?} has a negative entry"));
                }
                out[ax] = sz[k] as usize;
                scale[ax] = sz[k] as f64 / d[ax] as f64;
            }
            if policy != "stretch" {
                let it = axes.iter().map(|&ax| scale[ax]);
                let s = match policy {
                    "not_larger" => it.fold(f64::INFINITY, f64::min),
                    "not_smaller" => it.fold(f64::NEG_INFINITY, f64::max),
                    o => return Err(format!("unknown keep_aspect_ratio_policy \"{o}\"")),
                };
                for &ax in &axes {
                    scale[ax] = s;
                    out[ax] = (s * d[ax] as f64 + 0.5) as usize;
                }
            }
        }
        (Some(sc), None) => {
            if sc.len() != na {
                return Err(format!("scales {sc:?} needs {na} entries"));
            }
            for (k, &ax) in axes.iter().enumerate() {
                if !(sc[k] > 0.0 && sc[k].is_finite()) {
                    return Err(format!("scales {sc:?} must be positive"));
                }
                scale[ax] = sc[k];
                out[ax] = (sc[k] * d[ax] as f64) as usize;
            }
        }
        (None, None) => return Err("one of scales and sizes is required".into()),
    }
    let mut roi_ax = vec![(0.0, 1.0); r];
    if let Some(roi) = roi.filter(|v| !v.is_empty()) {
        if roi.len() != 2 * na {
            return Err(format!("roi {roi:?} needs {} entries", 2 * na));
        }
        for (k, &ax) in axes.iter().enumerate() {
            roi_ax[ax] = (roi[k], roi[na + k]);
        }
    }
    let mut y = x;
    let mut sorted = axes.clone();
    sorted.sort_unstable();
    for ax in sorted {
        let trivial = (scale[ax] - 1.0).abs() < 1e-9
            && out[ax] == d[ax]
            && roi_ax[ax].0.abs() < 1e-9
            && (roi_ax[ax].1 - 1.0).abs() < 1e-9;
        if trivial {
            continue;
        }
        if d[ax] == 0 {
            return Err(format!("cannot resize the empty axis {ax}"));
        }
        let plan = plan_axis(a, d[ax], out[ax], scale[ax], roi_ax[ax])?;
        y = apply_axis(cx, y, ax, &plan, a)?;
    }
    Ok(y)
}

fn mode(s: &str) -> R<Mode> {
    Ok(match s {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" | "trilinear" => Mode::Linear,
        "cubic" | "bicubic" => Mode::Cubic,
        o => return Err(format!("unknown mode \"{o}\"")),
    })
}

/// ONNX Resize. Opset 10: inputs `[X, scales]`, `asymmetric` coordinates and `floor`
/// rounding (as Upsample); opset 11+: `[X, roi, scales, sizes]` with the full attribute
/// set (`axes` and `keep_aspect_ratio_policy` from opset 18). `roi`, `scales` and `sizes`
/// must be known at import time.
pub fn resize(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let m = mode(&n.s("mode", "nearest")?)?;
    if n.opset < 11 {
        let scales = cx.const_f64s(n.inp(1)?, "scales")?;
        let a = Attrs {
            mode: m,
            coord: "asymmetric".into(),
            nearest: "floor".into(),
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation: 0.0,
        };
        let y = resize_impl(
            cx,
            x,
            &a,
            (0..r).collect(),
            Some(scales),
            None,
            None,
            "stretch",
        )?;
        return Ok(vec![y]);
    }
    let a = Attrs {
        mode: m,
        coord: n.s("coordinate_transformation_mode", "half_pixel")?,
        nearest: n.s("nearest_mode", "round_prefer_floor")?,
        cubic_a: n.f("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: n.i("exclude_outside", 0)? != 0,
        antialias: n.i("antialias", 0)? != 0,
        extrapolation: n.f("extrapolation_value", 0.0)? as f64,
    };
    if a.antialias && m == Mode::Nearest {
        return Err("antialias is not defined for mode nearest".into());
    }
    let axes = match n.ints("axes")? {
        Some(v) => v
            .iter()
            .map(|&ax| norm_axis(ax, r))
            .collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    let roi = n.opt(1).map(|i| cx.const_f64s(i, "roi")).transpose()?;
    let scales = n
        .opt(2)
        .map(|i| cx.const_f64s(i, "scales"))
        .transpose()?
        .filter(|v| !v.is_empty());
    let sizes = n
        .opt(3)
        .map(|i| cx.const_i64s(i, "sizes"))
        .transpose()?
        .filter(|v| !v.is_empty());
    if scales.is_some() && sizes.is_some() {
        return Err("only one of scales and sizes may be given".into());
    }
    let policy = n.s("keep_aspect_ratio_policy", "stretch")?;
    let y = resize_impl(cx, x, &a, axes, scales, sizes, roi, &policy)?;
    Ok(vec![y])
}

/// ONNX Upsample (deprecated; opset 7–9): Resize with `asymmetric` coordinates and `floor`
/// nearest rounding; `scales` is an attribute (opset 7) or input 1 (opset 9).
pub fn upsample(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x);
    let scales = match n.opt(1) {
        Some(s) => cx.const_f64s(s, "scales")?,
        None => {
            let a = n.attr("scales").ok_or("scales is required")?;
            a.floats.iter().map(|&v| v as f64).collect()
        }
    };
    let a = Attrs {
        mode: mode(&n.s("mode", "nearest")?)?,
        coord: "asymmetric".into(),
        nearest: "floor".into(),
        cubic_a: -0.75,
        exclude_outside: false,
        antialias: false,
        extrapolation: 0.0,
    };
    Ok(vec![resize_impl(
        cx,
        x,
        &a,
        (0..r).collect(),
        Some(scales),
        None,
        None,
        "stretch",
    )?])
}
