//! Pooling (ONNX MaxPool / AveragePool / LpPool) over NC + any number of spatial dims.
//!
//! Window tap `t` of output `o` on axis `i` reads input position `o*stride + t*dil - pad_begin`.
//! A position inside the input is *valid*; one in `[-pad_begin, in + pad_end)` but outside
//! the input is *padding*; anything further (ONNX `ceil_mode` windows) is never counted.
//! Max ignores padding and propagates NaN; Avg divides by the valid count, or by
//! valid + padding with `count_include_pad`; Lp is `(Σ|x|^p)^(1/p)` over valid positions.
//! MaxPool also takes the integer types (ONNX opset 12+: int8, uint8), computed exactly.

use super::wide::fold_taps;
use super::{fill_chunks, invalid, make, map_float, out_dims, KResult};
use num_traits::Float;
use rlx_ir::{PoolAttrs, PoolKind, Shape, Tensor, TensorData};

#[derive(Clone, Copy)]
enum Tap {
    Valid(usize),
    Pad,
    Outside,
}

/// The windows of one pooling: per-axis tap status and the strides to walk them.
struct Windows {
    /// taps[i][o] = per-tap status on axis i for output index o
    taps: Vec<Vec<Vec<Tap>>>,
    kst: rlx_ir::Dims,
    sst: rlx_ir::Dims,
    ktot: usize,
    osp: Vec<usize>,
}

impl Windows {
    fn new(sp: &[usize], osp: &[usize], a: &PoolAttrs) -> Windows {
        let nd = sp.len();
        let taps = (0..nd)
            .map(|i| {
                (0..osp[i])
                    .map(|o| {
                        (0..a.kernel[i])
                            .map(|t| {
                                let pos = (o * a.strides[i] + t * a.dilations[i]) as isize
                                    - a.pads[i].0 as isize;
                                if pos >= 0 && (pos as usize) < sp[i] {
                                    Tap::Valid(pos as usize)
                                } else if pos >= -(a.pads[i].0 as isize)
                                    && pos < (sp[i] + a.pads[i].1) as isize
                                {
                                    Tap::Pad
                                } else {
                                    Tap::Outside
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Windows {
            taps,
            kst: rlx_ir::strides_of(&a.kernel),
            sst: rlx_ir::strides_of(sp),
            ktot: a.kernel.iter().product(),
            osp: osp.to_vec(),
        }
    }

    /// The in-plane offsets of output `q`'s valid taps (into `valid`, cleared first);
    /// returns the number of valid + padding taps.
    fn gather(&self, q: usize, oidx: &mut [usize], valid: &mut Vec<usize>) -> usize {
        let nd = self.osp.len();
        let mut rem = q;
        for i in (0..nd).rev() {
            oidx[i] = rem % self.osp[i];
            rem /= self.osp[i];
        }
        valid.clear();
        let mut counted = 0usize;
        for k in 0..self.ktot {
            let mut off = 0usize;
            let mut status = 0u8; // 0 valid, 1 pad, 2 outside
            let mut kr = k;
            // `i` indexes four per-axis tables at once.
            #[allow(clippy::needless_range_loop)]
            for i in 0..nd {
                let t = kr / self.kst[i];
                kr %= self.kst[i];
                match self.taps[i][oidx[i]][t] {
                    Tap::Valid(pos) => off += pos * self.sst[i],
                    Tap::Pad => status = status.max(1),
                    Tap::Outside => status = 2,
                }
            }
            if status == 2 {
                continue;
            }
            counted += 1;
            if status == 0 {
                valid.push(off);
            }
        }
        counted
    }

    /// Fill `planes` output planes, `f(src plane, valid offsets, counted)` per output.
    fn run<T: Copy + Send + Sync, U: Copy + Send + Default>(
        &self,
        v: &[T],
        plane: usize,
        planes: usize,
        f: impl Fn(&[T], &[usize], usize) -> U + Sync + Send,
    ) -> Vec<U> {
        let p: usize = self.osp.iter().product();
        let mut out = vec![U::default(); planes * p];
        fill_chunks(&mut out, p.max(1), |pl, dst| {
            if p == 0 {
                return;
            }
            let src = &v[pl * plane..(pl + 1) * plane];
            let mut oidx = vec![0usize; self.osp.len()];
            let mut valid = Vec::with_capacity(self.ktot);
            for (q, d) in dst.iter_mut().enumerate() {
                let counted = self.gather(q, &mut oidx, &mut valid);
                *d = f(src, &valid, counted);
            }
        });
        out
    }
}

/// Per output index on one axis: the valid input positions and the valid + padding count.
fn axis_taps(
    n: usize,
    on: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
) -> Vec<(Vec<usize>, usize)> {
    (0..on)
        .map(|o| {
            let mut valid = vec![];
            let mut counted = 0;
            for t in 0..k {
                let pos = (o * s + t * d) as isize - pb as isize;
                if pos >= 0 && (pos as usize) < n {
                    valid.push(pos as usize);
                    counted += 1;
                } else if pos >= -(pb as isize) && pos < (n + pe) as isize {
                    counted += 1;
                }
            }
            (valid, counted)
        })
        .collect()
}

/// 2-D Max/Avg pooling, one output row at a time: for each kernel column, the output
/// columns whose input column is inside the image form one contiguous span (computed once).
/// Where every kernel column is inside (the interior), all taps of the row's window are
/// folded 16 outputs at a time in registers ([`fold_taps`]); the padded border columns go
/// tap by tap. With stride > 1 each input row is first split into its stride phases, so a
/// tap's columns are contiguous. Each output combines its taps in window order (rows, then
/// columns), so Avg sums in the same order as the definition. Max propagates NaN (a NaN tap
/// wins and stays); a window with no valid tap is -inf (Max) or 0/count (Avg).
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(e <= acc)`: true for a NaN tap, on purpose
fn pool_2d<T: Float + Send + Sync + Default + 'static>(
    v: &[T],
    sp: &[usize],
    osp: &[usize],
    a: &PoolAttrs,
    planes: usize,
    into: Option<Into<'_, T>>,
) -> Vec<T> {
    let (h, w) = (sp[0], sp[1]);
    let (oh, ow) = (osp[0], osp[1]);
    let ty = axis_taps(
        h,
        oh,
        a.kernel[0],
        a.strides[0],
        a.dilations[0],
        a.pads[0].0,
        a.pads[0].1,
    );
    let tx = axis_taps(
        w,
        ow,
        a.kernel[1],
        a.strides[1],
        a.dilations[1],
        a.pads[1].0,
        a.pads[1].1,
    );
    let (kw, sw, dw, pl) = (a.kernel[1], a.strides[1], a.dilations[1], a.pads[1].0);
    // Per kernel column: the output columns [lo, hi) whose input column is inside, and the
    // input column of `lo`.
    let inside = |ox: usize, kx: usize| {
        let c = (ox * sw + kx * dw) as isize - pl as isize;
        c >= 0 && (c as usize) < w
    };
    let spans: Vec<(usize, usize, usize)> = (0..kw)
        .filter_map(|kx| {
            let lo = (0..ow).find(|&ox| inside(ox, kx))?;
            let hi = (lo..ow).find(|&ox| !inside(ox, kx)).unwrap_or(ow);
            Some((lo, hi, lo * sw + kx * dw - pl))
        })
        .collect();
    let p = oh * ow;
    if p == 1 && ty.len() == 1 && ty[0].0.len() == h && tx[0].0.len() == w && into.is_none() {
        // One window over the whole plane (GlobalAveragePool/GlobalMaxPool): the taps in
        // window order are the plane in memory order.
        return global_pool(v, h * w, ty[0].1 * tx[0].1, a, planes);
    }
    // Every path below writes every output (no fill first).
    let mut own = Vec::new();
    let Into { out, stride, off } = match into {
        Some(i) => i,
        None => {
            own = crate::buffers::overwritten(planes * p);
            Into {
                out: &mut own,
                stride: p,
                off: 0,
            }
        }
    };
    if p == 0 || out.len() < planes.saturating_sub(1) * stride + off + p {
        return own;
    }
    // With stride sw > 1, each input row is first split into its sw phases (columns
    // r, r+sw, r+2sw, ... laid out one after another), so a tap's columns are contiguous.
    let phase_len = w.div_ceil(sw);
    let phase_of = |c: usize| (c % sw) * phase_len + c / sw;
    let row_len = if sw > 1 { sw * phase_len } else { w };
    let slack = if ow < 16 { 16 } else { 0 };
    let copy = sw > 1 || slack > 0;
    let pitch = row_len + slack;
    // Output columns [in_lo, in_hi) have every kernel column inside the image: there each
    // output folds the same tap list (one slice per (row, kernel column)) in one pass.
    // The columns outside it (padding) go tap by tap.
    let (in_lo, in_hi) = if spans.len() == kw {
        let lo = spans.iter().map(|s| s.0).max().unwrap_or(0);
        let hi = spans.iter().map(|s| s.1).min().unwrap_or(0);
        (lo, hi.max(lo))
    } else {
        (ow, ow)
    };
    // Max takes the tap when it is larger or NaN, unless the accumulator already holds a
    // NaN (then it stays). Both are closures (not fn pointers) so that they inline into
    // the vector loop.
    let max = |acc: T, e: T| {
        if !(e <= acc) && !acc.is_nan() {
            e
        } else {
            acc
        }
    };
    // Without a NaN in the plane, `max` is `e > acc ? e : acc` (one vmaxps per tap); it
    // keeps the same operand as `max` for every pair of non-NaN values, ±0 included.
    let max_no_nan = |acc: T, e: T| if e > acc { e } else { acc };
    let add = |acc: T, e: T| acc + e;
    let is_max = matches!(a.kind, PoolKind::Max);
    let init = if is_max { T::neg_infinity() } else { T::zero() };
    let f = |acc: T, e: T| if is_max { max(acc, e) } else { add(acc, e) };
    if let PoolKind::Lp { .. } = a.kind {
        out.fill(T::nan()); // not routed here
        return own;
    }
    // Per kernel column: where its taps start in an input row for output column `in_lo`.
    let tap_cols: Vec<usize> = spans
        .iter()
        .map(|&(lo, _, c0)| phase_of(c0) + in_lo - lo)
        .collect();
    let kh = a.kernel[0];
    // f32 MaxPool on AVX-512 (stride 1 or 2 along columns, no dilation): its geometry and
    // load masks, made once for every plane.
    #[cfg(target_arch = "x86_64")]
    let simd_ok = is_max
        && super::wide::is_f32::<T>()
        && a.dilations.iter().all(|&d| d == 1)
        && (1..=2).contains(&sw);
    // Within `RLX_CPU_ISA` (`avx2`: the AVX2 kernel on an AVX-512 CPU; `portable`: none).
    #[cfg(target_arch = "x86_64")]
    let cap = super::simd::isa_cap();
    #[cfg(target_arch = "x86_64")]
    let avx512 = cap == super::simd::IsaCap::Avx512 && std::is_x86_feature_detected!("avx512f");
    // Without AVX-512: 3×3 stride 2 on AVX2 (`max2d::k3s2_avx2`), the rest generic.
    #[cfg(target_arch = "x86_64")]
    let avx2 = !avx512
        && cap >= super::simd::IsaCap::Avx2
        && (kh, kw, a.strides[0], sw) == (3, 3, 2, 2)
        && std::is_x86_feature_detected!("avx2");
    #[cfg(target_arch = "x86_64")]
    let simd = (simd_ok && (avx512 || avx2)).then(|| {
        let geo = max2d::Geo {
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh: a.strides[0],
            sw,
            pt: a.pads[0].0,
            pl: a.pads[1].0,
        };
        // The load masks of `max2d::plane` (AVX-512 only).
        let masks = if avx512 {
            max2d::masks(&geo)
        } else {
            Vec::new()
        };
        (geo, masks)
    });
    fill_chunks(&mut out[..planes * stride], stride, |pl, chunk| {
        let dst = &mut chunk[off..off + p];
        let src = &v[pl * h * w..(pl + 1) * h * w];
        // 3×3 stride 2 watches for NaN in the taps it reads; a plane where it saw one is
        // redone below.
        #[cfg(target_arch = "x86_64")]
        if let Some((geo, _)) = simd.as_ref().filter(|(g, _)| max2d::is_k3s2(g)) {
            let (s32, d32) = (super::wide::as_f32(src), super::wide::as_f32_mut(dst));
            // SAFETY: AVX-512F (or, without it, AVX2) was detected above; the geometry is
            // the one it takes.
            let clean = unsafe {
                if avx512 {
                    max2d::k3s2_avx512(s32, d32, geo)
                } else {
                    max2d::k3s2_avx2(s32, d32, geo)
                }
            };
            if clean {
                return;
            }
        }
        let no_nan = is_max
            && if super::wide::is_f32::<T>() {
                // Above 0x7f80_0000 (|inf|) only for a NaN: one vector integer-max pass.
                super::wide::max_abs_bits(super::wide::as_f32(src)) <= 0x7f80_0000
            } else {
                !src.iter().any(|x| x.is_nan())
            };
        // A plane with a NaN takes the NaN-aware path below.
        #[cfg(target_arch = "x86_64")]
        if let (Some((geo, masks)), true, true) = (&simd, no_nan, avx512) {
            let (s32, d32) = (super::wide::as_f32(src), super::wide::as_f32_mut(dst));
            // SAFETY: AVX-512F was detected above.
            unsafe { max2d::plane(s32, d32, geo, masks) };
            return;
        }
        // With sw > 1, every input row split into its stride phases, once per plane. Rows
        // narrower than a 16-lane block are copied too, with 16 elements of slack after
        // each, so that `fold_taps` may read a whole block past a row's valid outputs.
        let mut split = vec![T::zero(); if copy { h * pitch } else { 0 }];
        if copy {
            for (y, buf) in split.chunks_mut(pitch).enumerate() {
                split_phases(&src[y * w..(y + 1) * w], sw, &mut buf[..row_len]);
            }
        }
        // Input row y (phase-split when sw > 1, with its slack).
        let row = |y: usize| -> &[T] {
            if copy {
                &split[y * pitch..(y + 1) * pitch]
            } else {
                &src[y * w..(y + 1) * w]
            }
        };
        let mut taps: Vec<&[T]> = Vec::with_capacity(kh * spans.len());
        for ((ys, cy), orow) in ty.iter().zip(dst.chunks_mut(ow)) {
            if in_lo < in_hi {
                // Inside every span here, so each tap slice starts within its row.
                taps.clear();
                for &y in ys {
                    for &c in &tap_cols {
                        taps.push(&row(y)[c..]);
                    }
                }
                if no_nan {
                    fold_taps(&mut orow[in_lo..in_hi], &taps, init, max_no_nan);
                } else if is_max {
                    fold_taps(&mut orow[in_lo..in_hi], &taps, init, max);
                } else {
                    fold_taps(&mut orow[in_lo..in_hi], &taps, init, add);
                }
            }
            for ox in (0..in_lo).chain(in_hi..ow) {
                let mut acc = init;
                for &y in ys {
                    for &(lo, hi, c0) in &spans {
                        if (lo..hi).contains(&ox) {
                            acc = f(acc, row(y)[phase_of(c0) + ox - lo]);
                        }
                    }
                }
                orow[ox] = acc;
            }
            if let PoolKind::Avg { count_include_pad } = a.kind {
                for (ox, (acc, (xs, cx))) in orow.iter_mut().zip(&tx).enumerate() {
                    let n = if count_include_pad {
                        cy * cx
                    } else {
                        ys.len() * xs.len()
                    };
                    if acc.is_finite() {
                        *acc = *acc / T::from(n).unwrap_or_else(T::zero);
                        continue;
                    }
                    // The window's sum overflowed (or a tap is not finite): sum it again in
                    // f64, where a sum of finite taps cannot overflow, and divide there. The
                    // mean of taps up to f32::MAX is finite.
                    let mut s64 = 0f64;
                    for &y in ys {
                        for &(lo, hi, c0) in &spans {
                            if (lo..hi).contains(&ox) {
                                s64 += row(y)[phase_of(c0) + ox - lo].to_f64().unwrap_or(f64::NAN);
                            }
                        }
                    }
                    *acc = T::from(s64 / n as f64).unwrap_or_else(T::nan);
                }
            }
        }
    });
    own
}

/// Where [`pool_2d`] writes: plane `i`'s `oh·ow` outputs at `out[i·stride + off..]`.
pub(crate) struct Into<'a, T> {
    pub out: &'a mut [T],
    pub stride: usize,
    pub off: usize,
}

/// A 2-D MaxPool/AveragePool of `x` `[1, C, H, W]` (f32) to output dims `osp` =
/// `[OH, OW]`, plane `i` written at `out[i·stride + off..][..OH·OW]` (rows of a larger
/// output: `conv::banded`). Errors: not f32 `[1, C, H, W]`, an Lp pool, or `out` too short.
pub(crate) fn pool_2d_into(
    x: &Tensor,
    a: &PoolAttrs,
    osp: [usize; 2],
    out: &mut [f32],
    stride: usize,
    off: usize,
) -> KResult<()> {
    let d = x.dims();
    let Some(v) = x.as_f32().filter(|_| d.len() == 4 && d[0] == 1) else {
        return invalid("pool: not an f32 [1, C, H, W] input");
    };
    if matches!(a.kind, PoolKind::Lp { .. })
        || [
            &a.kernel,
            &a.strides,
            &a.pads.iter().map(|p| p.0).collect(),
            &a.dilations,
        ]
        .iter()
        .any(|v| v.len() != 2)
    {
        return invalid("pool: not a 2-D Max/Average pool with every attribute given");
    }
    let planes = d[1];
    if out.len() < planes.saturating_sub(1) * stride + off + osp[0] * osp[1] {
        return invalid("pool: output slice too short");
    }
    pool_2d(v, &d[2..], &osp, a, planes, Some(Into { out, stride, off }));
    Ok(())
}

/// One output per plane from every element of the plane, in memory order (the window
/// order of a window covering the plane). Max: NaN wins and stays; Avg divides by
/// `count` (the window size; the caller passes the padded size for count_include_pad).
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(e <= acc)`: true for a NaN tap, on purpose
fn global_pool<T: Float + Send + Sync + Default + 'static>(
    v: &[T],
    plane: usize,
    count: usize,
    a: &PoolAttrs,
    planes: usize,
) -> Vec<T> {
    let mut out = crate::buffers::filled(planes, T::default());
    fill_chunks(&mut out, 1, |pl, dst| {
        let src = &v[pl * plane..(pl + 1) * plane];
        dst[0] = match a.kind {
            PoolKind::Max => src.iter().fold(T::neg_infinity(), |acc, &e| {
                if !(e <= acc) && !acc.is_nan() {
                    e
                } else {
                    acc
                }
            }),
            PoolKind::Avg { count_include_pad } => {
                let n = if count_include_pad { count } else { plane };
                let s = src.iter().fold(T::zero(), |acc, &e| acc + e);
                if s.is_finite() {
                    s / T::from(n).unwrap_or_else(T::zero)
                } else {
                    // Overflowed (or a non-finite tap): the sum in f64, then the mean.
                    let s64: f64 = src.iter().map(|e| e.to_f64().unwrap_or(f64::NAN)).sum();
                    T::from(s64 / n as f64).unwrap_or_else(T::nan)
                }
            }
            PoolKind::Lp { .. } => T::nan(), // not routed here
        };
    });
    out
}

/// `row` split into its `sw` phases in `split` (phase r holds columns r, r+sw, ...; each
/// phase `split.len() / sw` long).
fn split_phases<T: Copy>(row: &[T], sw: usize, split: &mut [T]) {
    let phase_len = split.len() / sw;
    if sw == 2 {
        let (even, odd) = split.split_at_mut(phase_len);
        for ((pair, e), o) in row.chunks_exact(2).zip(even.iter_mut()).zip(odd.iter_mut()) {
            *e = pair[0];
            *o = pair[1];
        }
        if row.len() % 2 == 1 {
            even[row.len() / 2] = row[row.len() - 1];
        }
        return;
    }
    for (r, dst) in split.chunks_mut(phase_len).enumerate() {
        let n = dst.len().min((row.len() + sw - 1 - r) / sw);
        for (i, d) in dst[..n].iter_mut().enumerate() {
            *d = row[i * sw + r];
        }
    }
}

fn pool_impl<T: Float + Send + Sync + Default + 'static>(
    v: &[T],
    sp: &[usize],
    osp: &[usize],
    a: &PoolAttrs,
    planes: usize,
) -> Vec<T> {
    if sp.len() == 2 && !matches!(a.kind, PoolKind::Lp { .. }) {
        return pool_2d(v, sp, osp, a, planes, None);
    }
    let w = Windows::new(sp, osp, a);
    let plane: usize = sp.iter().product();
    w.run(v, plane, planes, |src, valid, counted| match a.kind {
        PoolKind::Max => {
            let mut acc = T::neg_infinity();
            for &off in valid {
                let x = src[off];
                if x.is_nan() {
                    return T::nan();
                }
                if x > acc {
                    acc = x;
                }
            }
            acc
        }
        PoolKind::Avg { count_include_pad } => {
            let acc = valid.iter().fold(T::zero(), |acc, &off| acc + src[off]);
            let n = if count_include_pad {
                counted
            } else {
                valid.len()
            };
            if acc.is_finite() {
                acc / T::from(n).unwrap_or_else(T::zero)
            } else {
                // Overflowed (or a non-finite tap): the sum in f64, then the mean.
                let s64: f64 = valid
                    .iter()
                    .map(|&off| src[off].to_f64().unwrap_or(f64::NAN))
                    .sum();
                T::from(s64 / n as f64).unwrap_or_else(T::nan)
            }
        }
        PoolKind::Lp { p } => {
            let pf = T::from(p).unwrap_or_else(T::nan);
            let acc = valid
                .iter()
                .fold(T::zero(), |acc, &off| acc + src[off].abs().powf(pf));
            acc.powf(T::one() / pf)
        }
    })
}

/// Max pooling of an integer type: the largest valid tap, `lowest` for a window with none.
fn max_pool_ord<T: Copy + PartialOrd + Send + Sync + Default>(
    v: &[T],
    sp: &[usize],
    osp: &[usize],
    a: &PoolAttrs,
    planes: usize,
    lowest: T,
) -> Vec<T> {
    let w = Windows::new(sp, osp, a);
    let plane: usize = sp.iter().product();
    w.run(v, plane, planes, |src, valid, _| {
        valid
            .iter()
            .map(|&off| src[off])
            .fold(lowest, |m, x| if x > m { x } else { m })
    })
}

/// `a` with ONNX's defaults spelled out for `nd` spatial axes where a list is empty:
/// strides and dilations 1, pads 0.
pub(crate) fn with_defaults(a: &PoolAttrs, nd: usize) -> PoolAttrs {
    let mut a = a.clone();
    if a.strides.is_empty() {
        a.strides = vec![1; nd];
    }
    if a.dilations.is_empty() {
        a.dilations = vec![1; nd];
    }
    if a.pads.is_empty() {
        a.pads = vec![(0, 0); nd];
    }
    a
}

/// `Op::Pool`: x [N, C, *sp] → the node's [N, C, *osp].
pub(crate) fn pool(x: &Tensor, a: &PoolAttrs, out: &Shape) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let d = x.dims();
    if d.len() < 3 || od.len() != d.len() || od[0] != d[0] || od[1] != d[1] {
        return invalid(format!(
            "pool: input {d:?} and output {od:?} do not fit NC*spatial"
        ));
    }
    let nd = d.len() - 2;
    let a = with_defaults(a, nd);
    if a.kernel.len() != nd
        || a.strides.len() != nd
        || a.dilations.len() != nd
        || a.pads.len() != nd
    {
        return invalid("pool: kernel/strides/dilations/pads need one entry per spatial axis");
    }
    let sp = &d[2..];
    let osp = &od[2..];
    let planes = d[0] * d[1];
    if a.kind == PoolKind::Max && x.dtype().is_int() && !x.dtype().is_narrow() {
        macro_rules! int_max {
            ($($var:ident $t:ty),*) => {
                match x.data() {
                    $(TensorData::$var(v) => {
                        TensorData::$var(max_pool_ord(v, sp, osp, &a, planes, <$t>::MIN))
                    })*
                    other => return invalid(format!("MaxPool: unsupported dtype {}", other.dtype())),
                }
            };
        }
        let data = int_max!(I64 i64, I32 i32, I16 i16, I8 i8, U8 u8, U16 u16, U32 u32, U64 u64);
        return make(od.clone(), data);
    }
    let data = map_float!(x.data(), "pool", v => pool_impl(v, sp, osp, &a, planes));
    make(od.clone(), data)
}

/// f32 MaxPool on AVX-512 for 2-D windows with stride 1 or 2 along rows' columns and no
/// dilation: per output row, 16 output columns at a time in one register. Each tap loads
/// the 16 input columns it reads (two loads and an even-lane permute for stride 2), with
/// columns outside the image read as -inf (masked loads: never accessed), and folds them
/// with `maxps(e, acc)` (`e > acc ? e : acc`) in window order: the same operand as the
/// generic path's NaN-free max for every pair, ±0 included. A window with no valid tap is
/// -inf, as there. Stride 2 takes two taps (kx, kx + 1) from one pair of loads (even and
/// odd lanes). NaN is not handled here: the caller sends a plane holding one to the
/// NaN-aware path. 3×3 windows with stride 2 take [`max2d::k3s2_avx512`] (or, without
/// AVX-512, `k3s2_avx2`): one kernel written over [`Lanes`](super::simd::Lanes), which
/// watches for NaN itself.
#[cfg(target_arch = "x86_64")]
mod max2d {
    use crate::kernels::simd::{Avx2, Avx512, Lanes};
    use std::arch::x86_64::*;

    /// One plane's geometry: input `h × w`, output `oh × ow`, kernel `kh × kw`, strides,
    /// and the top/left pads.
    pub(super) struct Geo {
        pub h: usize,
        pub w: usize,
        pub oh: usize,
        pub ow: usize,
        pub kh: usize,
        pub kw: usize,
        pub sh: usize,
        pub sw: usize,
        pub pt: usize,
        pub pl: usize,
    }

    /// Per chunk of 16 output columns and tap column: the masks of its one (stride 1) or
    /// two (stride 2) loads, the same for every row and plane.
    pub(super) fn masks(g: &Geo) -> Vec<(u16, u16)> {
        (0..g.ow.div_ceil(16) * g.kw)
            .map(|i| {
                let c = ((i / g.kw) * 16 * g.sw + i % g.kw) as isize - g.pl as isize;
                (
                    lanes_inside::<Avx512>(c, g.w),
                    lanes_inside::<Avx512>(c + 16, g.w),
                )
            })
            .collect()
    }

    /// The pooled plane `dst` (`oh*ow`) from `src` (`h*w`, without NaN), with `masks` from
    /// [`masks`].
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `g.sw` is 1 or 2.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn plane(src: &[f32], dst: &mut [f32], g: &Geo, masks: &[(u16, u16)]) {
        assert!(src.len() >= g.h * g.w && dst.len() >= g.oh * g.ow);
        assert!(masks.len() == g.ow.div_ceil(16) * g.kw);
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        for oy in 0..g.oh {
            let iy0 = (oy * g.sh) as isize - g.pt as isize;
            for (ch, ms) in masks.chunks_exact(g.kw).enumerate() {
                let ox0 = ch * 16;
                let mut acc = ninf;
                for ky in 0..g.kh {
                    let iy = iy0 + ky as isize;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    let row = src.as_ptr().wrapping_add(iy as usize * g.w);
                    let at =
                        |kx: usize| row.wrapping_offset((ox0 * g.sw + kx) as isize - g.pl as isize);
                    if g.sw == 1 {
                        for (kx, &(m0, _)) in ms.iter().enumerate() {
                            // SAFETY: only lanes inside the row are read.
                            let e = unsafe { _mm512_mask_loadu_ps(ninf, m0, at(kx)) };
                            acc = _mm512_max_ps(e, acc);
                        }
                    } else {
                        // Stride 2: columns c..c+32 from two loads give tap kx (even lanes)
                        // and tap kx + 1 (odd lanes): the same columns, the same masks.
                        for kx in (0..g.kw).step_by(2) {
                            let (m0, m1) = ms[kx];
                            // SAFETY: only lanes inside the row are read.
                            let lo = unsafe { _mm512_mask_loadu_ps(ninf, m0, at(kx)) };
                            let hi =
                                unsafe { _mm512_mask_loadu_ps(ninf, m1, at(kx).wrapping_add(16)) };
                            acc = _mm512_max_ps(_mm512_permutex2var_ps(lo, even, hi), acc);
                            if kx + 1 < g.kw {
                                acc = _mm512_max_ps(_mm512_permutex2var_ps(lo, odd, hi), acc);
                            }
                        }
                    }
                }
                let n = (g.ow - ox0).min(16);
                let out_m = if n == 16 {
                    0xffff
                } else {
                    ((1u32 << n) - 1) as u16
                };
                // SAFETY: columns ox0..ox0+n of output row oy, inside `dst` (checked).
                unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add(oy * g.ow + ox0), out_m, acc) };
            }
        }
    }

    /// Where input row `iy` (inside the image) of `src` reads column `c` (possibly outside
    /// the row: only lanes inside it are loaded).
    #[inline(always)]
    fn row_at(src: &[f32], g: &Geo, iy: isize, c: isize) -> *const f32 {
        src.as_ptr()
            .wrapping_add(iy as usize * g.w)
            .wrapping_offset(c)
    }

    /// Whether [`k3s2`] takes `g`.
    pub(super) fn is_k3s2(g: &Geo) -> bool {
        (g.kh, g.kw, g.sh, g.sw) == (3, 3, 2, 2)
    }

    /// Lanes `l` of an `S::N`-lane load at input column `c` with `0 <= c + l < w`.
    #[inline(always)]
    fn lanes_inside<S: Lanes>(c: isize, w: usize) -> S::M {
        let n = S::N as isize;
        S::range(
            (-c).clamp(0, n) as usize,
            (w as isize - c).clamp(0, n) as usize,
        )
    }

    /// Stride-2 3×3 MaxPool ([`plane`]'s values for that geometry), written once over
    /// [`Lanes`] and compiled for AVX-512 (16 output columns per register; ResNet's and
    /// SqueezeNet's MaxPool) and AVX2 (8; for CPUs without AVX-512), row by row: for `N`
    /// output columns, each input row's three taps are folded first, left to right
    /// (`maxps(new, acc)`), then the window's three rows, top to bottom. That is the window
    /// order of [`plane`] (a later tap replaces the max only when larger), so the same tap
    /// wins every tie, ±0 included. Output rows share their top and bottom input rows: each
    /// row's fold is made once, and the output rows are walked down one `N`-column strip at
    /// a time. Tap columns `c + 2l` and `c + 2l + 1` are the even and odd lanes of two loads
    /// at `c` and `c + N`, column `c + 2l + 2` the first tap's lanes shifted down by one
    /// with column `c + 2N` shifted in; columns outside the image read as -inf (masked
    /// loads touch only the lanes inside the row; whole loads where the strip's columns are
    /// all inside).
    ///
    /// Returns false when a tap it read was NaN: `dst` is then not the definition's (a NaN
    /// tap may have been dropped) and the caller redoes the plane on the NaN-aware path.
    /// Every column a row fold reads is checked: its first two taps' (one compare), and the
    /// third tap's extra column `c + 2N`, which is the next strip's first column, or, in the
    /// last strip, checked on its own. (A NaN in columns past the last output column is
    /// seen too; that only costs a redo.)
    ///
    /// # Safety
    /// The CPU must have `S`'s features; `g` is 3×3 with strides 2 ([`is_k3s2`]).
    #[inline(always)]
    unsafe fn k3s2<S: Lanes>(src: &[f32], dst: &mut [f32], g: &Geo) -> bool {
        assert!(src.len() >= g.h * g.w && dst.len() >= g.oh * g.ow);
        assert!(is_k3s2(g));
        let n = S::N;
        // (No closures here: a closure does not take the `#[target_feature]` of the entry
        // point this is inlined into, and one left out of line calls every intrinsic.)
        let pt = g.pt as isize;
        // SAFETY (the whole body): register operations, and stores inside `dst` (checked).
        unsafe {
            let mut nan = S::range(0, 0);
            for ox0 in (0..g.ow).step_by(n) {
                // Output column ox0 + l reads input columns c + 2l + {0, 1, 2}.
                let c = (ox0 * 2) as isize - g.pl as isize;
                let next = c + 2 * n as isize;
                let st = Strip::<S> {
                    c,
                    // Whole loads (no masks) when columns c..=c + 2N are all inside.
                    whole: c >= 0 && next < g.w as isize,
                    masks: [
                        lanes_inside::<S>(c, g.w),
                        lanes_inside::<S>(c + n as isize, g.w),
                        S::range(0, usize::from((0..g.w as isize).contains(&next))),
                    ],
                    // No strip after this one reads column c + 2N as its first even lane.
                    last: ox0 + n >= g.ow,
                };
                let cols = (g.ow - ox0).min(n);
                let out_m = S::range(0, cols);
                let mut top = fold_row(src, g, &st, -pt, &mut nan);
                for oy in 0..g.oh {
                    let iy = (oy * 2) as isize - pt;
                    let bottom = fold_row(src, g, &st, iy + 2, &mut nan);
                    let mid = fold_row(src, g, &st, iy + 1, &mut nan);
                    let acc = S::max(bottom, S::max(mid, top));
                    // Columns ox0..ox0 + cols of output row oy, inside `dst` (checked).
                    let d = dst.as_mut_ptr().add(oy * g.ow + ox0);
                    if cols == n {
                        S::store(d, acc);
                    } else {
                        S::store_m(d, acc, out_m);
                    }
                    top = bottom;
                }
            }
            !S::any(nan)
        }
    }

    /// One strip of [`k3s2`]: `N` output columns from input column `c`.
    struct Strip<S: Lanes> {
        c: isize,
        /// Columns `c..=c + 2N` are all inside the rows.
        whole: bool,
        /// The lanes inside the rows of the loads at `c` and `c + N`, and lane 0 of the
        /// load at `c + 2N` where that column is inside.
        masks: [S::M; 3],
        last: bool,
    }

    /// Input row `iy`'s taps for strip `st`, folded left to right (-inf outside the image);
    /// a NaN among them sets lanes of `nan`.
    ///
    /// # Safety
    /// The CPU must have `S`'s features; `st` is a strip of `g`, `src` holds `g`'s plane.
    #[inline(always)]
    unsafe fn fold_row<S: Lanes>(
        src: &[f32],
        g: &Geo,
        st: &Strip<S>,
        iy: isize,
        nan: &mut S::M,
    ) -> S::V {
        // SAFETY: register operations, and loads of the lanes inside row `iy` of `src`
        // (masked, or whole where all are inside).
        unsafe {
            let ninf = S::splat(f32::NEG_INFINITY);
            if iy < 0 || iy >= g.h as isize {
                return ninf;
            }
            let p = row_at(src, g, iy, st.c);
            let n = S::N;
            let (a, b, next) = if st.whole {
                (S::load(p), S::load(p.add(n)), S::splat(*p.add(2 * n)))
            } else {
                (
                    S::load_or(p, st.masks[0], ninf),
                    S::load_or(p.wrapping_add(n), st.masks[1], ninf),
                    S::load_or(p.wrapping_add(2 * n), st.masks[2], ninf),
                )
            };
            let (t0, t1) = (S::even(a, b), S::odd(a, b));
            let t2 = S::shift_in(t0, next);
            *nan = S::or_m(*nan, S::cmp::<_CMP_UNORD_Q>(t0, t1));
            if st.last {
                *nan = S::or_m(*nan, S::cmp::<_CMP_UNORD_Q>(t2, t2));
            }
            S::max(t2, S::max(t1, t0))
        }
    }

    /// [`k3s2`] on AVX-512F.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `g` is 3×3 with strides 2 ([`is_k3s2`]).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn k3s2_avx512(src: &[f32], dst: &mut [f32], g: &Geo) -> bool {
        // SAFETY: the caller's contract.
        unsafe { k3s2::<Avx512>(src, dst, g) }
    }

    /// [`k3s2`] on AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2; `g` is 3×3 with strides 2 ([`is_k3s2`]).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn k3s2_avx2(src: &[f32], dst: &mut [f32], g: &Geo) -> bool {
        // SAFETY: the caller's contract.
        unsafe { k3s2::<Avx2>(src, dst, g) }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
