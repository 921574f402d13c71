//! A 2-D f32 conv whose output only a MaxPool reads (the stem of SqueezeNet and of
//! ResNet: Conv → Relu → MaxPool 3×3/2), run in bands of output rows: each band of the
//! conv's output is computed into a buffer that stays in L2 and max-pooled at once, so the
//! conv's whole output (3 MB for a 64×112×112 stem) is never written to memory and read
//! back. onnxruntime runs the two as separate nodes. With several threads the bands run in
//! parallel, a multiple of the thread count of them (bench/NOTES.md §34: the two ops whole
//! did not scale at 2 threads on the Xeon host, 586 → 582 µs for SqueezeNet's stem; §30
//! found bands on all threads no faster than whole on AMD Zen 4).
//!
//! **Same values as the two nodes, up to the conv's summation order.** Band `[p0, p1)` of
//! the pool's output rows reads the conv's output rows `[p0·s − pt, (p1 − 1)·s − pt + k)`
//! (clipped to the conv's rows), and those read the input rows their own windows cover.
//! The band's conv is the same conv on those input rows with its top/bottom padding moved
//! to the band's edges, so each output is a sum of the same terms; the conv dispatch picks
//! its kernel for the band's size, which may not be the whole plane's (a band of a few rows
//! may go through im2col + gemm where the whole plane takes the direct kernel), so a sum
//! may round differently. The band's pool is the same pool with its top/bottom padding
//! moved to the band's edges (padding never wins a max), so each window holds the same
//! values in the same order: NaN and Inf land where the two ops put them. Rows of the
//! conv's output where two bands meet are computed once per band (`k − s` rows per band for
//! a k×k/s pool).

use super::{invalid, out_dims, KResult};
use crate::kernels::make;
use rlx_ir::{ConvAttrs, PoolAttrs, PoolKind, Shape, Tensor, TensorData};

/// Bytes of conv output per band: a band and its pooled rows stay in a core's L2 (1 MB on
/// AMD Zen 4, 2 MB on Intel Sapphire Rapids).
pub const BAND_BYTES: usize = 768 << 10;

/// Whether [`conv_max_pool`] applies: a 2-D f32 conv (any kernel, stride, padding,
/// dilation, groups: the band's conv is the conv itself) and a 2-D f32 MaxPool with
/// dilation 1 along rows, output dims as declared.
pub fn fits(conv_out: &Shape, pa: &PoolAttrs, pool_out: &Shape) -> bool {
    let (Some(c), Some(p)) = (conv_out.static_dims(), pool_out.static_dims()) else {
        return false;
    };
    c.len() == 4
        && p.len() == 4
        && c[..2] == p[..2]
        && conv_out.dtype == rlx_ir::DType::F32
        && pool_out.dtype == rlx_ir::DType::F32
        && pa.kind == PoolKind::Max
        && pa.kernel.len() == 2
        && pa.dilations.first().is_none_or(|&d| d == 1)
}

/// Row geometry along axis 0 (rows) of a window op: `k` taps with dilation `dil`, stride
/// `s`, `pt` rows of padding before.
#[derive(Clone, Copy)]
struct Rows {
    span: usize,
    s: usize,
    pt: usize,
}

impl Rows {
    /// The input rows `[lo, hi)` (unclipped, may be negative or past the end) that output
    /// rows `[o0, o1)` read.
    fn input(&self, o0: usize, o1: usize) -> (isize, isize) {
        let lo = (o0 * self.s) as isize - self.pt as isize;
        let hi = ((o1 - 1) * self.s + self.span) as isize - self.pt as isize;
        (lo, hi)
    }
}

/// The conv `conv` (x `[N, C, H, W]` → `conv_out` `[N, M, OH, OW]`, run by the caller's
/// closure on any rows of x with any top/bottom padding: `conv(x_band, attrs, out_band)`),
/// then the MaxPool `pa` → `pool_out` `[N, M, PH, PW]`, in bands of about `band_bytes` of
/// conv output: the values of the two nodes run one after the other (module docs). A band
/// covering the whole output (small planes) runs the two whole. Errors: what `conv`
/// returns; a pool that does not [`fits`] or dims that do not fit the attributes.
#[allow(clippy::too_many_arguments)]
pub fn conv_max_pool(
    x: &Tensor,
    ca: &ConvAttrs,
    kh: usize,
    conv_out: &Shape,
    pa: &PoolAttrs,
    pool_out: &Shape,
    band_bytes: usize,
    conv: &(dyn Fn(&Tensor, &ConvAttrs, &Shape) -> KResult<Tensor> + Sync),
) -> KResult<Tensor> {
    if !fits(conv_out, pa, pool_out) {
        return invalid("conv+MaxPool bands: not a 2-D f32 MaxPool after a 2-D conv");
    }
    let (cd, pd) = (out_dims(conv_out)?, out_dims(pool_out)?);
    let xd = x.dims().to_vec();
    let Some(xv) = x.as_f32().filter(|_| xd.len() == 4 && xd[0] == cd[0]) else {
        return invalid(format!(
            "conv+MaxPool bands: input {xd:?} is not f32 [N, C, H, W]"
        ));
    };
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let (m, oh, ow) = (cd[1], cd[2], cd[3]);
    let (ph, pw) = (pd[2], pd[3]);
    let at = |v: &[usize], d: usize| v.first().copied().unwrap_or(d);
    let conv_rows = Rows {
        span: at(&ca.dilations, 1) * (kh.max(1) - 1) + 1,
        s: at(&ca.strides, 1),
        pt: ca.pads.first().map_or(0, |p| p.0),
    };
    let pool_rows = Rows {
        span: pa.kernel[0],
        s: at(&pa.strides, 1),
        pt: pa.pads.first().map_or(0, |p| p.0),
    };
    if conv_rows.s == 0 || pool_rows.s == 0 || pool_rows.span == 0 {
        return invalid("conv+MaxPool bands: a stride or window of 0");
    }
    // Pool output rows per band: the conv rows they read fill about `band_bytes`. With
    // several threads, a multiple of the thread count of near-equal bands (5 bands of 13
    // rows at 2 threads left one thread 3 of them: 6 of 9-10 instead).
    let row_bytes = (m * ow * 4).max(1);
    let conv_rows_per_band = (band_bytes / row_bytes).max(pool_rows.span);
    let mut per_band = ((conv_rows_per_band - pool_rows.span) / pool_rows.s + 1).max(1);
    let threads = rayon::current_num_threads();
    if threads > 1 && per_band < ph {
        let nb = ph.div_ceil(per_band).div_ceil(threads) * threads;
        per_band = ph.div_ceil(nb).max(1);
    }
    if n == 0 || m == 0 || ph == 0 || pw == 0 {
        return make(pd, TensorData::F32(Vec::new()));
    }
    // One band: the two ops whole.
    if per_band >= ph && n == 1 {
        let y = conv(x, ca, conv_out)?;
        let p = crate::kernels::pool::pool(&y, pa, pool_out)?;
        crate::buffers::give(y.into_data());
        return Ok(p);
    }
    // The pool's attributes with every default spelled out (its top padding is set per band).
    let pool_attrs = crate::kernels::pool::with_defaults(pa, 2);
    let plane_out = ph * pw;
    // Band `[p0, p1)` of image `img`'s pool output: its rows of every plane written into
    // `dst` (planes `stride` apart, from `off`).
    let band = |img: usize, p0: usize, dst: &mut [f32], stride: usize, off: usize| -> KResult<()> {
        let ximg = &xv[img * c * h * w..(img + 1) * c * h * w];
        let p1 = (p0 + per_band).min(ph);
        // The conv rows this band's windows read, clipped to the conv's output.
        let (lo, hi) = pool_rows.input(p0, p1);
        let (r0, r1) = (lo.max(0) as usize, (hi.min(oh as isize)).max(0) as usize);
        if r0 >= r1 {
            // Windows wholly in the padding: no tap, -inf (the pool's own rule).
            for plane in dst.chunks_mut(stride).take(m) {
                plane[off..off + (p1 - p0) * pw].fill(f32::NEG_INFINITY);
            }
            return Ok(());
        }
        // The input rows those conv rows read, and the padding left at the band's edges.
        let (ilo, ihi) = conv_rows.input(r0, r1);
        let (i0, i1) = (ilo.max(0) as usize, (ihi.min(h as isize)).max(0) as usize);
        let mut sub_ca = ca.clone();
        if sub_ca.pads.is_empty() {
            sub_ca.pads = vec![(0, 0); 2];
        }
        sub_ca.pads[0] = ((-ilo).max(0) as usize, (ihi - h as isize).max(0) as usize);
        let rows_in = i1.saturating_sub(i0);
        let mut xb = crate::buffers::overwritten::<f32>(c * rows_in * w);
        for (ch, rows) in xb.chunks_mut(rows_in * w).enumerate() {
            rows.copy_from_slice(&ximg[ch * h * w + i0 * w..][..rows_in * w]);
        }
        let xb = make(&[1, c, rows_in, w][..], TensorData::F32(xb))?;
        let band_shape = Shape::new(&[1, m, r1 - r0, ow], rlx_ir::DType::F32);
        let y = conv(&xb, &sub_ca, &band_shape)?;
        crate::buffers::give(xb.into_data());
        let mut sub_pa = pool_attrs.clone();
        sub_pa.pads[0] = ((-lo).max(0) as usize, (hi - oh as isize).max(0) as usize);
        crate::kernels::pool::pool_2d_into(&y, &sub_pa, [p1 - p0, pw], dst, stride, off)?;
        crate::buffers::give(y.into_data());
        Ok(())
    };
    let mut out = crate::buffers::overwritten::<f32>(n * m * plane_out);
    if threads > 1 {
        // Bands over the threads, each band's conv rows in its own core's cache: each
        // writes its pooled rows `[m][p1 − p0][pw]` into a buffer of its own, copied into
        // the planes after (the pool output is a quarter of the conv's).
        use rayon::prelude::*;
        let starts: Vec<(usize, usize)> = (0..n)
            .flat_map(|img| (0..ph).step_by(per_band).map(move |p0| (img, p0)))
            .collect();
        let parts: Vec<Vec<f32>> = starts
            .par_iter()
            .map(|&(img, p0)| {
                let rows = (p0 + per_band).min(ph) - p0;
                let mut part = crate::buffers::overwritten::<f32>(m * rows * pw);
                band(img, p0, &mut part, rows * pw, 0)?;
                Ok(part)
            })
            .collect::<KResult<_>>()?;
        // The parts into the planes, planes over the threads (each plane gathers its rows
        // from every band's part): copied on the calling thread, SqueezeNet's 774 KB of
        // pool output was a serial tail (the stem 6% faster in parallel at 2 threads, 8
        // interleaved profiles, bench/NOTES.md §35).
        out.par_chunks_mut(plane_out)
            .enumerate()
            .for_each(|(q, plane)| {
                let (img, ch) = (q / m.max(1), q % m.max(1));
                for (&(pi, p0), part) in starts.iter().zip(&parts) {
                    if pi == img {
                        let rows = part.len() / m.max(1);
                        plane[p0 * pw..p0 * pw + rows].copy_from_slice(&part[ch * rows..][..rows]);
                    }
                }
            });
        for part in parts {
            crate::buffers::give(TensorData::F32(part));
        }
    } else {
        for (img, dst) in out.chunks_mut(m * plane_out).enumerate() {
            for p0 in (0..ph).step_by(per_band) {
                band(img, p0, dst, plane_out, p0 * pw)?;
            }
        }
    }
    make(pd, TensorData::F32(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::{conv_post, Act};

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn out_len(i: usize, pads: (usize, usize), span: usize, s: usize, ceil: bool) -> usize {
        let p = i + pads.0 + pads.1 - span;
        if ceil {
            let o = p.div_ceil(s) + 1;
            // ONNX: drop a last window starting past the input and the begin padding.
            if (o - 1) * s >= i + pads.0 {
                o - 1
            } else {
                o
            }
        } else {
            p / s + 1
        }
    }

    struct Case {
        n: usize,
        c: usize,
        m: usize,
        hw: (usize, usize),
        k: usize,
        cs: usize,
        cpads: [(usize, usize); 2],
        dil: usize,
        pk: usize,
        ps: usize,
        ppads: [(usize, usize); 2],
        ceil: bool,
    }

    /// Banded against the conv then the pool, whole, with bands of one to a few rows (where
    /// a band's conv may take another kernel than the whole plane's: the same sums in
    /// another order) and one band (bit for bit).
    fn check(cs: &Case) {
        let (h, w) = cs.hw;
        let x = Tensor::from_f32(&[cs.n, cs.c, h, w], rnd(cs.n * cs.c * h * w, 1)).unwrap();
        let wt =
            Tensor::from_f32(&[cs.m, cs.c, cs.k, cs.k], rnd(cs.m * cs.c * cs.k * cs.k, 2)).unwrap();
        let bias = Tensor::from_f32(&[cs.m], rnd(cs.m, 3)).unwrap();
        let ca = ConvAttrs {
            strides: vec![cs.cs; 2],
            pads: cs.cpads.to_vec(),
            dilations: vec![cs.dil; 2],
            groups: 1,
        };
        let span = cs.dil * (cs.k - 1) + 1;
        let (oh, ow) = (
            out_len(h, cs.cpads[0], span, cs.cs, false),
            out_len(w, cs.cpads[1], span, cs.cs, false),
        );
        let pa = PoolAttrs {
            kind: PoolKind::Max,
            kernel: vec![cs.pk; 2],
            strides: vec![cs.ps; 2],
            pads: cs.ppads.to_vec(),
            dilations: vec![1; 2],
            ceil_mode: cs.ceil,
        };
        let (ph, pw) = (
            out_len(oh, cs.ppads[0], cs.pk, cs.ps, cs.ceil),
            out_len(ow, cs.ppads[1], cs.pk, cs.ps, cs.ceil),
        );
        let f32s = |d: &[usize]| Shape::new(d, rlx_ir::DType::F32);
        let (co, po) = (f32s(&[cs.n, cs.m, oh, ow]), f32s(&[cs.n, cs.m, ph, pw]));
        let act = Act {
            clamp: Some(crate::kernels::conv::Clamp::RELU),
            ..Act::NONE
        };
        let run =
            |x: &Tensor, a: &ConvAttrs, o: &Shape| conv_post(x, &wt, Some(&bias), a, o, act, None);
        let y = run(&x, &ca, &co).unwrap();
        let want = crate::kernels::pool::pool(&y, &pa, &po).unwrap();
        let want = want.as_f32().unwrap();
        for band_bytes in [1, cs.m * ow * 4 * 3, cs.m * ow * 4 * 7, 1 << 30] {
            let got = conv_max_pool(&x, &ca, cs.k, &co, &pa, &po, band_bytes, &run).unwrap();
            assert_eq!(got.dims(), &[cs.n, cs.m, ph, pw][..]);
            let got = got.as_f32().unwrap();
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                // Sums of up to 5·7·7 terms of magnitude below 1 in f32: a few ulps of
                // the largest partial sum.
                let ok = if band_bytes == 1 << 30 {
                    a.to_bits() == b.to_bits()
                } else {
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
                };
                assert!(ok, "band {band_bytes} B at {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn bands_give_the_values_of_the_conv_then_the_pool() {
        // One thread (bands in turn) and three (bands in parallel, 3 or 6 of them).
        for threads in [1, 3] {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(all_cases);
        }
    }

    fn all_cases() {
        let base = Case {
            n: 1,
            c: 3,
            m: 16,
            hw: (37, 29),
            k: 3,
            cs: 2,
            cpads: [(0, 0); 2],
            dil: 1,
            pk: 3,
            ps: 2,
            ppads: [(0, 0); 2],
            ceil: false,
        };
        // SqueezeNet's stem (3×3/2, no padding; MaxPool 3×3/2, ceil_mode).
        check(&Case { ceil: true, ..base });
        check(&base);
        // ResNet's stem (7×7/2 pad 3; MaxPool 3×3/2 pad 1), two images.
        check(&Case {
            n: 2,
            k: 7,
            cpads: [(3, 3); 2],
            ppads: [(1, 1); 2],
            ..base
        });
        // Asymmetric padding, stride 1, dilation 2, a 2×2/2 pool with padding at the end.
        check(&Case {
            c: 5,
            m: 8,
            hw: (31, 23),
            cs: 1,
            cpads: [(2, 0), (1, 2)],
            dil: 2,
            pk: 2,
            ppads: [(0, 1), (1, 0)],
            ..base
        });
        // Overlapping 5×5 windows at stride 1 (4 rows computed twice per band).
        check(&Case {
            m: 24,
            cs: 1,
            cpads: [(1, 1); 2],
            pk: 5,
            ps: 1,
            ppads: [(2, 2); 2],
            ..base
        });
    }

    #[test]
    fn a_nan_in_the_input_reaches_the_same_outputs() {
        // NaN rows at a band's edge: the band recomputes the shared row and pools it the
        // same way (NaN-aware path) as the whole run.
        let (c, m, h, w) = (3, 16, 41, 33);
        let mut xv = rnd(c * h * w, 9);
        xv[20 * w + 5] = f32::NAN;
        xv[2 * h * w + 33 * w + 17] = f32::INFINITY;
        let x = Tensor::from_f32(&[1, c, h, w], xv).unwrap();
        let wt = Tensor::from_f32(&[m, c, 3, 3], rnd(m * c * 9, 4)).unwrap();
        let ca = ConvAttrs {
            strides: vec![2; 2],
            pads: vec![(1, 1); 2],
            dilations: vec![1; 2],
            groups: 1,
        };
        let pa = PoolAttrs {
            kind: PoolKind::Max,
            kernel: vec![3; 2],
            strides: vec![2; 2],
            pads: vec![(1, 1); 2],
            dilations: vec![1; 2],
            ceil_mode: false,
        };
        let f32s = |d: &[usize]| Shape::new(d, rlx_ir::DType::F32);
        let (co, po) = (f32s(&[1, m, 21, 17]), f32s(&[1, m, 11, 9]));
        let run =
            |x: &Tensor, a: &ConvAttrs, o: &Shape| conv_post(x, &wt, None, a, o, Act::NONE, None);
        let y = run(&x, &ca, &co).unwrap();
        let want = crate::kernels::pool::pool(&y, &pa, &po).unwrap();
        let got = conv_max_pool(&x, &ca, 3, &co, &pa, &po, 1, &run).unwrap();
        let (g, wv) = (got.as_f32().unwrap(), want.as_f32().unwrap());
        assert!(wv.iter().any(|v| v.is_nan()));
        for (i, (a, b)) in g.iter().zip(wv).enumerate() {
            let same = a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(same || (a.is_nan() && b.is_nan()), "at {i}: {a} vs {b}");
        }
    }
}
