//! Signal-processing ops lowered to constants and MatMul: HannWindow, HammingWindow,
//! BlackmanWindow (ONNX opset 17 definitions), DFT and STFT (MatMul with constant cos / sin
//! matrices).

use crate::ctx::{Ctx, ONode, R};
use crate::tensor::{dtype_of, onnx_type_name};
use rlx_ir::{BinaryOp, DType, NodeId, Op, Tensor, TensorData, UnaryOp};
use std::f64::consts::PI;

/// A window of constant `size` (input 0): `a0 - a1 cos(2πk/N) + a2 cos(4πk/N)`, with
/// `N = size` when `periodic` (default) else `size - 1`.
fn window(cx: &mut Ctx, n: &ONode, a: [f64; 3]) -> R<Vec<NodeId>> {
    let size = cx.const_i64s(n.inp(0)?, "size")?;
    let [size] = size[..] else {
        return Err("size must hold one value".into());
    };
    if !(0..=1 << 24).contains(&size) {
        return Err(format!("size {size} is out of range"));
    }
    let dt = match n.i("output_datatype", 1)? {
        1 => DType::F32,
        t => dtype_of(t as i32).ok_or_else(|| {
            format!(
                "output_datatype {} is not supported",
                onnx_type_name(t as i32)
            )
        })?,
    };
    let periodic = n.i("periodic", 1)? != 0;
    let nn = if periodic { size } else { size - 1 } as f64;
    let v: Vec<f64> = (0..size)
        .map(|k| {
            let t = 2.0 * PI * k as f64 / nn;
            a[0] - a[1] * t.cos() + a[2] * (2.0 * t).cos()
        })
        .collect();
    let t = Tensor::new(vec![size as usize], TensorData::from_f64(dt, &v))
        .map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)])
}

pub fn hann_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [0.5, 0.5, 0.0])
}
pub fn hamming_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [25.0 / 46.0, 21.0 / 46.0, 0.0])
}
pub fn blackman_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [0.42, 0.5, 0.08])
}

/// A constant `[rows, cols]` matrix of `f(n, k)` in `dt`.
fn matrix(
    cx: &mut Ctx,
    dt: DType,
    rows: usize,
    cols: usize,
    f: impl Fn(usize, usize) -> f64,
) -> R<NodeId> {
    let v: Vec<f64> = (0..rows * cols).map(|i| f(i / cols, i % cols)).collect();
    let t =
        Tensor::new(vec![rows, cols], TensorData::from_f64(dt, &v)).map_err(|e| e.to_string())?;
    Ok(cx.constant(t))
}

/// Channel `c` of the trailing complex axis, with that axis removed.
fn channel(cx: &mut Ctx, x: NodeId, c: usize) -> R<NodeId> {
    let d = cx.dims(x);
    let r = d.len();
    let mut starts = vec![0; r];
    let mut sizes = d.clone();
    starts[r - 1] = c;
    sizes[r - 1] = 1;
    let s = cx.add(
        Op::Slice {
            starts,
            steps: vec![1; r],
            sizes,
        },
        vec![x],
    )?;
    cx.reshape(s, d[..r - 1].to_vec())
}

/// The DFT of `x [..., L (at axis), ..., 1|2]` with length `n` (the signal cut or
/// zero-padded), as MatMuls with constant cos / sin matrices along `axis`:
/// forward (`onesided`: bins `0..=n/2`), inverse (`1/n`), or the inverse of a one-sided
/// spectrum (real output `[..., n, 1]`, NumPy `irfft`).
fn dft_core(
    cx: &mut Ctx,
    x: NodeId,
    axis: usize,
    n: usize,
    inverse: bool,
    onesided: bool,
) -> R<NodeId> {
    let d = cx.dims(x);
    let r = d.len();
    if r < 2 || axis >= r - 1 || !(d[r - 1] == 1 || d[r - 1] == 2) || n == 0 {
        return Err(format!(
            "input {} must end in a complex axis of size 1 or 2, with the DFT axis {axis} before it",
            cx.shape(x)
        ));
    }
    // Computed in f64 (as NumPy's FFT does) and cast back.
    let out_dt = cx.dtype(x);
    let dt = DType::F64;
    let x = cx.cast(x, dt)?;
    let l = d[axis];
    // Move the DFT axis last: [..., L].
    let mut perm: Vec<usize> = (0..r - 1).filter(|&a| a != axis).collect();
    perm.push(axis);
    let mv = |cx: &mut Ctx, v: NodeId| -> R<NodeId> {
        if axis == r - 2 {
            Ok(v)
        } else {
            cx.add(Op::Transpose { perm: perm.clone() }, vec![v])
        }
    };
    let xr = channel(cx, x, 0)?;
    let xr = mv(cx, xr)?;
    let xi = if d[r - 1] == 2 {
        let v = channel(cx, x, 1)?;
        Some(mv(cx, v)?)
    } else {
        None
    };
    let nf = n as f64;
    let th = move |a: usize, b: usize| 2.0 * PI * ((a * b) % n) as f64 / nf;
    let irfft = inverse && onesided;
    let k = if irfft {
        n
    } else if onesided {
        n / 2 + 1
    } else {
        n
    };
    let rows_ok = move |a: usize| if irfft { a <= n / 2 } else { a < n };
    let wgt = move |a: usize| {
        if !irfft || a == 0 || (n.is_multiple_of(2) && a == n / 2) {
            1.0
        } else {
            2.0
        }
    };
    let sc = if inverse { 1.0 / nf } else { 1.0 };
    let c = matrix(cx, dt, l, k, |a, b| {
        if rows_ok(a) {
            sc * wgt(a) * th(a, b).cos()
        } else {
            0.0
        }
    })?;
    let s = matrix(cx, dt, l, k, |a, b| {
        if rows_ok(a) {
            sc * wgt(a) * th(a, b).sin()
        } else {
            0.0
        }
    })?;
    // Forward: (xr + i xi)(cos - i sin); inverse: (xr + i xi)(cos + i sin).
    let xr_c = cx.add(Op::MatMul, vec![xr, c])?;
    let xr_s = cx.add(Op::MatMul, vec![xr, s])?;
    let (yr, yi) = match xi {
        Some(xi) => {
            let xi_c = cx.add(Op::MatMul, vec![xi, c])?;
            let xi_s = cx.add(Op::MatMul, vec![xi, s])?;
            if inverse {
                (
                    cx.binary(BinaryOp::Sub, xr_c, xi_s)?,
                    cx.binary(BinaryOp::Add, xr_s, xi_c)?,
                )
            } else {
                (
                    cx.binary(BinaryOp::Add, xr_c, xi_s)?,
                    cx.binary(BinaryOp::Sub, xi_c, xr_s)?,
                )
            }
        }
        None => {
            if inverse {
                (xr_c, xr_s)
            } else {
                (xr_c, cx.unary(UnaryOp::Neg, xr_s)?)
            }
        }
    };
    // Back to [..., K (at axis), ...] and stack the complex axis.
    let mut inv = vec![0; r - 1];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let back = |cx: &mut Ctx, v: NodeId| -> R<NodeId> {
        let v = if axis == r - 2 {
            v
        } else {
            cx.add(Op::Transpose { perm: inv.clone() }, vec![v])?
        };
        let mut dd = cx.dims(v);
        dd.push(1);
        cx.reshape(v, dd)
    };
    let yr = back(cx, yr)?;
    if irfft {
        return cx.cast(yr, out_dt);
    }
    let yi = back(cx, yi)?;
    let y = cx.add(Op::Concat { axis: r - 1 }, vec![yr, yi])?;
    cx.cast(y, out_dt)
}

/// ONNX DFT (opset 17-20): `dft_length` input, `axis` attribute (opset < 20, default 1) or
/// input (opset 20, default -2), `inverse`, `onesided`.
pub fn dft(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let r = cx.rank(x) as i64;
    let axis = if n.opset >= 20 {
        match n.opt(2) {
            Some(a) => *cx.const_i64s(a, "axis")?.first().ok_or("axis is empty")?,
            None => -2,
        }
    } else {
        n.i("axis", 1)?
    };
    let axis = if axis < 0 { axis + r } else { axis };
    if axis < 0 || axis >= r - 1 {
        return Err(format!("axis {axis} out of range for {}", cx.shape(x)));
    }
    let axis = axis as usize;
    let inverse = n.i("inverse", 0)? != 0;
    let onesided = n.i("onesided", 0)? != 0;
    let l = cx.dims(x)[axis];
    let len = match n.opt(1) {
        Some(d) => {
            let v = *cx
                .const_i64s(d, "dft_length")?
                .first()
                .ok_or("dft_length is empty")?;
            usize::try_from(v).map_err(|_| format!("bad dft_length {v}"))?
        }
        None if inverse && onesided => 2 * l.saturating_sub(1),
        None => l,
    };
    Ok(vec![dft_core(cx, x, axis, len, inverse, onesided)?])
}

/// ONNX STFT (opset 17): frames of `signal [B, L, 1|2]` every `frame_step`, times the
/// window, DFT'd (`onesided` default 1); output `[B, frames, bins, 2]`.
pub fn stft(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    if d.len() != 3 {
        return Err(format!(
            "signal must be [batch, length, 1|2], got {}",
            cx.shape(x)
        ));
    }
    let step = *cx
        .const_i64s(n.inp(1)?, "frame_step")?
        .first()
        .ok_or("frame_step is empty")?;
    let window = n.opt(2);
    let fl = match (n.opt(3), window) {
        (Some(f), _) => *cx
            .const_i64s(f, "frame_length")?
            .first()
            .ok_or("frame_length is empty")?,
        (None, Some(w)) => cx.dims(w).first().copied().unwrap_or(0) as i64,
        (None, None) => d[1] as i64,
    };
    if step <= 0 || fl <= 0 || fl as usize > d[1] {
        return Err(format!(
            "frame_step {step} / frame_length {fl} do not fit signal length {}",
            d[1]
        ));
    }
    let (step, fl) = (step as usize, fl as usize);
    let frames = 1 + (d[1] - fl) / step;
    let idx: Vec<i64> = (0..frames * fl)
        .map(|i| ((i / fl) * step + i % fl) as i64)
        .collect();
    let idx = cx.constant(Tensor::from_i64(&[frames, fl], idx).map_err(|e| e.to_string())?);
    let mut fr = cx.add(Op::Gather { axis: 1 }, vec![x, idx])?;
    if let Some(w) = window {
        let w = cx.reshape(w, vec![1, 1, fl, 1])?;
        let w = cx.cast(w, cx.dtype(x))?;
        fr = cx.binary(BinaryOp::Mul, fr, w)?;
    }
    let onesided = n.i("onesided", 1)? != 0;
    Ok(vec![dft_core(cx, fr, 2, fl, false, onesided)?])
}

/// ONNX MelWeightMatrix (opset 17), folded to a constant `[dft_length/2 + 1, num_mel_bins]`
/// (all five inputs must be known at import time). Triangular filters between mel-spaced
/// edges, as onnx's reference (`op_mel_weight_matrix.py`): the edge mels are computed in
/// float32 like the reference, the bin indices `floor((dft_length + 1) * hz / sample_rate)`.
pub fn mel_weight_matrix(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let scalar_i = |cx: &Ctx, i: usize, what: &str| -> R<i64> {
        match cx.const_i64s(n.inp(i)?, what)?[..] {
            [v] => Ok(v),
            _ => Err(format!("{what} must hold one value")),
        }
    };
    let scalar_f = |cx: &Ctx, i: usize, what: &str| -> R<f64> {
        match cx.const_f64s(n.inp(i)?, what)?[..] {
            [v] => Ok(v),
            _ => Err(format!("{what} must hold one value")),
        }
    };
    let mels = scalar_i(cx, 0, "num_mel_bins")?;
    let dft = scalar_i(cx, 1, "dft_length")?;
    let rate = scalar_i(cx, 2, "sample_rate")?;
    let lo = scalar_f(cx, 3, "lower_edge_hertz")? as f32;
    let hi = scalar_f(cx, 4, "upper_edge_hertz")? as f32;
    if !(1..=1 << 16).contains(&mels) || !(1..=1 << 24).contains(&dft) || rate <= 0 {
        return Err(format!(
            "num_mel_bins {mels}, dft_length {dft} or sample_rate {rate} out of range"
        ));
    }
    let dt = match n.i("output_datatype", 1)? {
        1 => DType::F32,
        t => dtype_of(t as i32).ok_or_else(|| {
            format!(
                "output_datatype {} is not supported",
                onnx_type_name(t as i32)
            )
        })?,
    };
    let (m, bins) = (mels as usize, (dft / 2 + 1) as usize);
    let ln10 = std::f32::consts::LN_10;
    let lo_mel = 2595.0 * (lo / 700.0).ln_1p() / ln10;
    let hi_mel = 2595.0 * (hi / 700.0).ln_1p() / ln10;
    let step = (hi_mel - lo_mel) / (m + 2) as f32;
    let edges: Vec<i64> = (0..m + 2)
        .map(|k| {
            let mel = k as f64 * step as f64 + lo_mel as f64;
            let hz = 700.0 * (mel / 2595.0 * std::f64::consts::LN_10).exp_m1();
            ((dft + 1) as f64 * hz / rate as f64).floor() as i64
        })
        .collect();
    let mut out = vec![0f64; bins * m];
    let mut set = |j: i64, i: usize, v: f64| -> R<()> {
        if j < 0 || j as usize >= bins {
            return Err(format!(
                "mel filter {i} reaches spectrogram bin {j}, outside 0..{bins}"
            ));
        }
        out[j as usize * m + i] = v;
        Ok(())
    };
    for i in 0..m {
        let (l, c, h) = (edges[i], edges[i + 1], edges[i + 2]);
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, (j - l) as f64 / (c - l) as f64)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, (h - j) as f64 / (h - c) as f64)?;
            }
        }
    }
    let t =
        Tensor::new(vec![bins, m], TensorData::from_f64(dt, &out)).map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)])
}
