//! ONNX Conv (NC + 1..=3 spatial dims, groups, dilations, pads, optional bias) as
//! im2col + gemm. A 1×…×1 kernel with stride 1 and no padding is a plain gemm on the input.

use super::matmul::{gemm_into, GemmElem, View};
use super::{fill_chunks, invalid, make, out_dims, values_as, Elem, KResult};
use half::{bf16, f16};
use rlx_ir::{ConvAttrs, Shape, Tensor, TensorData};

struct Geo {
    n: usize,
    c: usize,
    m: usize,
    groups: usize,
    sp: Vec<usize>,
    ks: Vec<usize>,
    osp: Vec<usize>,
    strides: Vec<usize>,
    pads: Vec<(usize, usize)>,
    dil: Vec<usize>,
}

fn geometry(x: &[usize], w: &[usize], a: &ConvAttrs, od: &[usize]) -> KResult<Geo> {
    if x.len() < 3 || w.len() != x.len() || od.len() != x.len() {
        return invalid(format!(
            "conv: x {x:?}, w {w:?}, out {od:?} ranks do not fit NC*spatial"
        ));
    }
    let nd = x.len() - 2;
    let g = a.groups.max(1);
    let (n, c, m) = (x[0], x[1], w[0]);
    if c % g != 0 || m % g != 0 || w[1] != c / g {
        return invalid(format!(
            "conv: x {x:?} and w {w:?} do not fit groups={g} (w[1] must be C/groups)"
        ));
    }
    let get = |v: &Vec<usize>, d: usize| if v.is_empty() { vec![d; nd] } else { v.clone() };
    let strides = get(&a.strides, 1);
    let dil = get(&a.dilations, 1);
    let pads = if a.pads.is_empty() {
        vec![(0, 0); nd]
    } else {
        a.pads.clone()
    };
    if strides.len() != nd || dil.len() != nd || pads.len() != nd {
        return invalid("conv: strides/dilations/pads need one entry per spatial axis");
    }
    let sp = x[2..].to_vec();
    let ks = w[2..].to_vec();
    let mut osp = vec![];
    for i in 0..nd {
        let span = dil[i] * (ks[i].max(1) - 1) + 1;
        let padded = sp[i] + pads[i].0 + pads[i].1;
        let o = if padded >= span && strides[i] > 0 {
            (padded - span) / strides[i] + 1
        } else {
            0
        };
        osp.push(o);
    }
    if od[0] != n || od[1] != m || od[2..] != osp[..] {
        return invalid(format!(
            "conv: computed output [{n}, {m}, {osp:?}] but the node declares {od:?}"
        ));
    }
    Ok(Geo {
        n,
        c,
        m,
        groups: g,
        sp,
        ks,
        osp,
        strides,
        pads,
        dil,
    })
}

/// 2-D [`im2col`]: per (channel, ky, kx) row, each output row `oy` copies the valid span of
/// input row `oy*sh + ky*dh - pt` (stride `sw`, dilation `dw`) and zero-fills the rest.
fn im2col_2d<T: Copy + Default + Send + Sync>(x: &[T], g: &Geo, col: &mut [T]) {
    let (h, w) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = oh * ow;
    if p == 0 {
        return;
    }
    fill_chunks(col, p, |row, dst| {
        let ch = row / (kh * kw);
        let ky = (row / kw) % kh;
        let kx = row % kw;
        let src = &x[ch * h * w..(ch + 1) * h * w];
        let off = kx * dw;
        let (lo, hi) = inside_cols(off, pl, sw, w, ow);
        for (oy, out_row) in dst.chunks_mut(ow).enumerate() {
            let iy = (oy * sh + ky * dh) as isize - pt as isize;
            if iy < 0 || iy as usize >= h {
                out_row.fill(T::default());
                continue;
            }
            let srow = &src[iy as usize * w..(iy as usize + 1) * w];
            out_row[..lo].fill(T::default());
            out_row[hi..].fill(T::default());
            if sw == 1 {
                let ix0 = lo + off - pl;
                out_row[lo..hi].copy_from_slice(&srow[ix0..ix0 + (hi - lo)]);
            } else {
                for (ox, d) in out_row[lo..hi].iter_mut().enumerate() {
                    *d = srow[(ox + lo) * sw + off - pl];
                }
            }
        }
    });
}

/// Fill `col` ([cg*KS, P] row-major) from one group's input planes `x` ([cg, *sp]).
fn im2col<T: Copy + Default + Send + Sync>(x: &[T], g: &Geo, cg: usize, col: &mut [T]) {
    let nd = g.sp.len();
    if nd == 2 {
        return im2col_2d(x, g, col);
    }
    let ksz: usize = g.ks.iter().product();
    let plane: usize = g.sp.iter().product();
    let p: usize = g.osp.iter().product();
    let last_o = g.osp[nd - 1];
    let sst = rlx_ir::strides_of(&g.sp);
    let kst = rlx_ir::strides_of(&g.ks);
    let _ = cg;
    fill_chunks(col, p, |row, dst| {
        let ch = row / ksz;
        let mut kk = row % ksz;
        let src = &x[ch * plane..(ch + 1) * plane];
        // kernel tap per axis
        let mut tap = vec![0usize; nd];
        for i in 0..nd {
            tap[i] = kk / kst[i];
            kk %= kst[i];
        }
        // input index on each axis for each output index (None outside)
        let maps: Vec<Vec<Option<usize>>> = (0..nd)
            .map(|i| {
                (0..g.osp[i])
                    .map(|o| {
                        let pos =
                            (o * g.strides[i] + tap[i] * g.dil[i]) as isize - g.pads[i].0 as isize;
                        if pos >= 0 && (pos as usize) < g.sp[i] {
                            Some(pos as usize)
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .collect();
        let lm = &maps[nd - 1];
        for (r, out_row) in dst.chunks_mut(last_o.max(1)).enumerate() {
            if last_o == 0 {
                break;
            }
            let mut rem = r;
            let mut base = Some(0usize);
            for i in (0..nd - 1).rev() {
                let o = rem % g.osp[i];
                rem /= g.osp[i];
                base = match (base, maps[i][o]) {
                    (Some(b), Some(q)) => Some(b + q * sst[i]),
                    _ => None,
                };
            }
            match base {
                None => out_row.fill(T::default()),
                Some(b) => {
                    for (d, m) in out_row.iter_mut().zip(lm) {
                        *d = match m {
                            Some(q) => src[b + q],
                            None => T::default(),
                        };
                    }
                }
            }
        }
    });
}

/// Depthwise 2-D conv (groups == C == M, one filter per channel) computed directly: per
/// output plane, each kernel tap adds `w * x` over the span of output columns whose input
/// column is inside the image (the same span arithmetic as [`im2col_2d`]). No im2col buffer,
/// no per-channel 1-row gemm.
fn depthwise_2d<T: GemmElem + Elem + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geo,
) -> Vec<T> {
    let (h, wd) = (g.sp[0], g.sp[1]);
    let (kh, kw) = (g.ks[0], g.ks[1]);
    let (oh, ow) = (g.osp[0], g.osp[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    let (pt, pl) = (g.pads[0].0, g.pads[1].0);
    let p = oh * ow;
    let mut out = vec![T::ZERO; g.n * g.m * p];
    if p == 0 {
        return out;
    }
    fill_chunks(&mut out, p, |plane, dst| {
        let c = plane % g.m;
        let src = &x[plane * h * wd..(plane + 1) * h * wd];
        let b = bias.map_or(T::ZERO, |b| b[c]);
        dst.fill(b);
        for ky in 0..kh {
            for kx in 0..kw {
                let wv = w[(c * kh + ky) * kw + kx];
                let off = kx * dw;
                let (lo, hi) = inside_cols(off, pl, sw, wd, ow);
                for (oy, orow) in dst.chunks_mut(ow).enumerate() {
                    let iy = (oy * sh + ky * dh) as isize - pt as isize;
                    if iy < 0 || iy as usize >= h {
                        continue;
                    }
                    let srow = &src[iy as usize * wd..(iy as usize + 1) * wd];
                    if sw == 1 {
                        let ix0 = lo + off - pl;
                        for (o, &xv) in orow[lo..hi].iter_mut().zip(&srow[ix0..ix0 + (hi - lo)]) {
                            *o = *o + wv * xv;
                        }
                    } else {
                        for (j, o) in orow[lo..hi].iter_mut().enumerate() {
                            *o = *o + wv * srow[(j + lo) * sw + off - pl];
                        }
                    }
                }
            }
        }
    });
    out
}

fn conv_float<T: GemmElem + Elem + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    x: &[T],
    w: &[T],
    bias: Option<Vec<T>>,
    g: &Geo,
) -> KResult<Vec<T>> {
    if g.sp.len() == 2 && g.groups == g.c && g.m == g.c && g.groups > 1 {
        return Ok(depthwise_2d(x, w, bias.as_deref(), g));
    }
    let cg = g.c / g.groups;
    let mg = g.m / g.groups;
    let ksz: usize = g.ks.iter().product();
    let kk = cg * ksz;
    let plane: usize = g.sp.iter().product();
    let p: usize = g.osp.iter().product();
    let mut out = vec![T::ZERO; g.n * g.m * p];
    let direct = g.ks.iter().all(|&k| k == 1)
        && g.strides.iter().all(|&s| s == 1)
        && g.pads.iter().all(|&(b, e)| b == 0 && e == 0);
    let mut col = if direct {
        vec![]
    } else {
        vec![T::ZERO; kk * p]
    };
    for ni in 0..g.n {
        for gi in 0..g.groups {
            let xoff = (ni * g.c + gi * cg) * plane;
            let xs = &x[xoff..xoff + cg * plane];
            let bview = if direct {
                View {
                    data: xs,
                    off: 0,
                    rs: p,
                    cs: 1,
                }
            } else {
                im2col(xs, g, cg, &mut col);
                View {
                    data: &col,
                    off: 0,
                    rs: p,
                    cs: 1,
                }
            };
            let ooff = (ni * g.m + gi * mg) * p;
            let wv = View {
                data: w,
                off: gi * mg * kk,
                rs: kk,
                cs: 1,
            };
            gemm_into(mg, p, kk, wv, bview, &mut out[ooff..ooff + mg * p], true)?;
        }
    }
    if let Some(b) = bias {
        for (i, chunk) in out.chunks_mut(p.max(1)).enumerate() {
            if p == 0 {
                break;
            }
            let bv = b[i % g.m];
            for v in chunk {
                *v = *v + bv;
            }
        }
    }
    Ok(out)
}

/// `Op::Conv` (ONNX Conv): x [N, C, *sp], w [M, C/groups, *k], optional bias [M];
/// output [N, M, *osp] with `osp = (sp + pad_b + pad_e - dil*(k-1) - 1) / stride + 1`.
pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvAttrs,
    out: &Shape,
) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let g = geometry(x.dims(), w.dims(), a, &od)?;
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
    let data = match (x.data(), w.data()) {
        (D::F32(xv), D::F32(wv)) => {
            D::F32(conv_float(xv, wv, bias.map(|b| values_as(b.data())), &g)?)
        }
        (D::F64(xv), D::F64(wv)) => {
            D::F64(conv_float(xv, wv, bias.map(|b| values_as(b.data())), &g)?)
        }
        (D::F16(_), D::F16(_)) | (D::BF16(_), D::BF16(_)) => {
            let xv = x.data().to_f32_vec();
            let wv = w.data().to_f32_vec();
            let r = conv_float(&xv, &wv, bias.map(|b| values_as(b.data())), &g)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::DType;

    /// The ONNX Conv definition as a plain loop (2-D, f64): out[n, m, oy, ox] = b[m] +
    /// Σ_{c in group, ky, kx} w[m, c, ky, kx] · x[n, g·cg + c, oy·s + ky·d − p, ...] (zero
    /// outside the image).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        xd: [usize; 4],
        w: &[f32],
        wd: [usize; 4],
        b: &[f32],
        s: usize,
        d: usize,
        p: usize,
        groups: usize,
    ) -> (Vec<f32>, Vec<usize>) {
        let [n, c, h, wi] = xd;
        let [m, cg, kh, kw] = wd;
        let oh = (h + 2 * p - d * (kh - 1) - 1) / s + 1;
        let ow = (wi + 2 * p - d * (kw - 1) - 1) / s + 1;
        let mg = m / groups;
        let mut out = vec![];
        for ni in 0..n {
            for mi in 0..m {
                let gi = mi / mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = b[mi] as f64;
                        for ci in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (oy * s + ky * d) as isize - p as isize;
                                    let ix = (ox * s + kx * d) as isize - p as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                        continue;
                                    }
                                    let xc = gi * cg + ci;
                                    let xv =
                                        x[((ni * c + xc) * h + iy as usize) * wi + ix as usize];
                                    let wv = w[((mi * cg + ci) * kh + ky) * kw + kx];
                                    acc += xv as f64 * wv as f64;
                                }
                            }
                        }
                        out.push(acc as f32);
                    }
                }
            }
        }
        (out, vec![n, m, oh, ow])
    }

    fn check(xd: [usize; 4], wd: [usize; 4], s: usize, d: usize, p: usize, groups: usize) {
        let nx: usize = xd.iter().product();
        let nw: usize = wd.iter().product();
        let x: Vec<f32> = (0..nx)
            .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..nw)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..wd[0]).map(|i| i as f32 * 0.25 - 0.5).collect();
        let (want, od) = naive(&x, xd, &w, wd, &b, s, d, p, groups);
        let xt = Tensor::new(xd.to_vec(), TensorData::F32(x)).unwrap();
        let wt = Tensor::new(wd.to_vec(), TensorData::F32(w)).unwrap();
        let bt = Tensor::new(vec![wd[0]], TensorData::F32(b)).unwrap();
        let a = ConvAttrs {
            strides: vec![s, s],
            pads: vec![(p, p), (p, p)],
            dilations: vec![d, d],
            groups,
        };
        let out = Shape::new(&od, DType::F32);
        let got = conv(&xt, &wt, Some(&bt), &a, &out).unwrap();
        let got = got.data().to_f32_vec();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{i}: {g} vs {w}");
        }
    }

    #[test]
    fn im2col_conv_matches_definition() {
        check([2, 3, 9, 8], [4, 3, 3, 3], 1, 1, 1, 1);
        check([1, 3, 11, 10], [5, 3, 3, 3], 2, 1, 1, 1);
        check([1, 4, 10, 9], [4, 2, 3, 2], 2, 2, 2, 2);
        check([1, 3, 7, 7], [2, 3, 7, 7], 2, 1, 3, 1);
    }

    #[test]
    fn depthwise_conv_matches_definition() {
        check([2, 6, 9, 8], [6, 1, 3, 3], 1, 1, 1, 6);
        check([1, 5, 12, 11], [5, 1, 3, 3], 2, 1, 1, 5);
        check([1, 4, 10, 10], [4, 1, 5, 5], 2, 2, 2, 4);
        check([1, 3, 6, 6], [3, 1, 3, 3], 1, 1, 0, 3);
    }
}

/// Output columns `ox` in `[lo, hi)` whose input column `ox * sw + off - pl` lies inside
/// `[0, w)`, for a kernel tap at offset `off = kx * dilation`, left padding `pl`, stride `sw`
/// and `ow` output columns.
fn inside_cols(off: usize, pl: usize, sw: usize, w: usize, ow: usize) -> (usize, usize) {
    let lo = if off >= pl {
        0
    } else {
        (pl - off).div_ceil(sw)
    };
    let hi = if w + pl > off {
        ((w + pl - off - 1) / sw + 1).min(ow)
    } else {
        0
    };
    (lo.min(hi), hi)
}
