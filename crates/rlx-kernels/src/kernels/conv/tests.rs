//! The conv paths against the ONNX definition (a plain f64 loop) and against each other
//! (the depthwise SIMD paths give the generic loop's bits).

use super::common::geometry;
#[cfg(target_arch = "x86_64")]
use super::common::Epilogue;
use super::depthwise::depthwise_2d;
#[cfg(target_arch = "x86_64")]
use super::dw_simd;
use super::*;
use rlx_ir::DType;
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::AtomicU32;

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
                                let xv = x[((ni * c + xc) * h + iy as usize) * wi + ix as usize];
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

/// ONNX pads with zeros, so a depthwise conv's infinite weight makes `inf · 0 = NaN`
/// where its tap falls in the padding, and +inf where it meets an input of 1 (as
/// onnxruntime and RLX's im2col convs give it; the depthwise kernels skip padding taps,
/// so such a conv must not take them). f32 and f64, 3×3 (SIMD kernels) and 3×5.
#[test]
fn depthwise_conv_with_an_infinite_weight_multiplies_the_padding() {
    for (kh, kw) in [(3, 3), (3, 5)] {
        let (c, h, wd) = (2, 4, 6);
        let mut w = vec![0.5f64; c * kh * kw];
        w[0] = f64::INFINITY; // channel 0, tap (0, 0): reads (oy - 1, ox - kw/2)
        let a = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(1, 1), (kw / 2, kw / 2)],
            dilations: vec![1, 1],
            groups: c,
        };
        for dt in [DType::F32, DType::F64] {
            let xt = Tensor::new(
                vec![1, c, h, wd],
                TensorData::from_f64(dt, &vec![1.0; c * h * wd]),
            )
            .unwrap();
            let wt = Tensor::new(vec![c, 1, kh, kw], TensorData::from_f64(dt, &w)).unwrap();
            let out = Shape::new(&[1, c, h, wd], dt);
            let y = conv(&xt, &wt, None, &a, &out).unwrap().data().to_f64_vec();
            for oy in 0..h {
                for ox in 0..wd {
                    let v = y[oy * wd + ox];
                    if oy == 0 || ox < kw / 2 {
                        assert!(v.is_nan(), "{dt:?} {kh}x{kw} ({oy},{ox}): {v}");
                    } else {
                        assert_eq!(v, f64::INFINITY, "{dt:?} {kh}x{kw} ({oy},{ox})");
                    }
                    // Channel 1: 0.5 per tap inside the image.
                    let rows = (oy.max(1) - 1..=(oy + 1).min(h - 1)).count();
                    let cols = (ox.max(kw / 2) - kw / 2..=(ox + kw / 2).min(wd - 1)).count();
                    let v1 = y[h * wd + oy * wd + ox];
                    assert!((v1 - 0.5 * (rows * cols) as f64).abs() < 1e-6, "{v1}");
                }
            }
        }
    }
}

#[test]
fn im2col_conv_matches_definition() {
    check([2, 3, 9, 8], [4, 3, 3, 3], 1, 1, 1, 1);
    check([1, 3, 11, 10], [5, 3, 3, 3], 2, 1, 1, 1);
    check([1, 4, 10, 9], [4, 2, 3, 2], 2, 2, 2, 2);
    check([1, 3, 7, 7], [2, 3, 7, 7], 2, 1, 3, 1);
    // Stride 3 (three column phases) on widths 1 and 2 past a multiple of 3.
    check([1, 3, 13, 13], [4, 3, 3, 3], 3, 1, 1, 1);
    check([1, 2, 11, 14], [3, 2, 5, 5], 3, 1, 2, 1);
}

/// Strided 1×1 convs (ResNet's shortcuts) gather every s-th pixel and run as a product:
/// odd sizes (the last row and column read), two images, groups, stride 3, dilation.
#[test]
fn strided_pointwise_conv_matches_definition() {
    check([2, 5, 9, 8], [6, 5, 1, 1], 2, 1, 0, 1);
    check([1, 4, 10, 11], [6, 2, 1, 1], 3, 2, 0, 2);
    check([1, 16, 7, 7], [24, 16, 1, 1], 2, 1, 0, 1);
}

/// Inputs for a Winograd check: x `[n, c, h, w]`, w `[m, c, 3, 3]`, bias `[m]`.
fn wino_case(n: usize, c: usize, h: usize, w: usize, m: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let x = (0..n * c * h * w)
        .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
        .collect();
    let wv = (0..m * c * 9)
        .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
        .collect();
    let b = (0..m).map(|i| i as f32 * 0.25 - 0.5).collect();
    (x, wv, b)
}

/// Winograd conv of `x` `[n, c, h, w]` with pads (top, left, bottom, right): the
/// transform's own result (None when it declined) and `conv_winograd`'s.
fn wino_run(
    x: &[f32],
    xd: [usize; 4],
    w: &[f32],
    m: usize,
    b: &[f32],
    pads: (usize, usize, usize, usize),
) -> (Option<Vec<f32>>, Tensor, Tensor) {
    let [n, c, h, wi] = xd;
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(pads.0, pads.2), (pads.1, pads.3)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let (oh, ow) = (h + pads.0 + pads.2 - 2, wi + pads.1 + pads.3 - 2);
    let xt = Tensor::new(xd.to_vec(), TensorData::F32(x.to_vec())).unwrap();
    let wt = Tensor::new(vec![m, c, 3, 3], TensorData::F32(w.to_vec())).unwrap();
    let bt = Tensor::new(vec![m], TensorData::F32(b.to_vec())).unwrap();
    let out = Shape::new(&[n, m, oh, ow], DType::F32);
    // The transform itself: whether a model's conv takes this path (`winograd_takes`: channels,
    // plane, the packed kernel first on small work) is the executor's choice, tested there.
    let wg = winograd_transform(&wt).expect("finite 3x3 weights");
    let d = winograd::Dims {
        n,
        h,
        w: wi,
        pt: pads.0,
        pl: pads.1,
        oh,
        ow,
    };
    let ts = n * oh.div_ceil(2) * ow.div_ceil(2);
    let mut v = vec![0.0f32; 16 * c * ts];
    let raw = winograd::conv(x, &wg, Some(b), d, &mut v, &no_post);
    let got = conv_winograd(&xt, &wg, &wt, Some(&bt), &a, &out, &no_post).unwrap();
    let direct = conv(&xt, &wt, Some(&bt), &a, &out).unwrap();
    (raw, got, direct)
}

/// Winograd F(2x2, 3x3) against the ONNX definition in f64 (`naive`), with asymmetric
/// padding applied by padding the input explicitly: odd and even output sizes, a batch,
/// outputs smaller than one tile, pads of 0 to 2.
#[test]
fn winograd_matches_definition() {
    let cases = [
        // (n, c, h, w, m, pads (t, l, b, r))
        (2, 32, 9, 8, 33, (1, 1, 1, 1)),
        (1, 32, 7, 7, 32, (1, 1, 1, 1)),
        (1, 40, 13, 6, 32, (0, 0, 0, 0)),
        (1, 32, 5, 11, 48, (0, 1, 2, 1)),
        (1, 32, 1, 1, 32, (1, 1, 1, 1)),
        (1, 35, 2, 3, 33, (2, 2, 2, 2)),
        (3, 32, 4, 4, 32, (2, 0, 1, 0)),
    ];
    for (ci, &(n, c, h, w, m, p)) in cases.iter().enumerate() {
        let (x, wv, b) = wino_case(n, c, h, w, m);
        let (hp, wp) = (h + p.0 + p.2, w + p.1 + p.3);
        let mut xp = vec![0.0f32; n * c * hp * wp];
        for (pl, src) in x.chunks(h * w).enumerate() {
            for (r, row) in src.chunks(w).enumerate() {
                let o = (pl * hp + r + p.0) * wp + p.1;
                xp[o..o + w].copy_from_slice(row);
            }
        }
        let (want, od) = naive(&xp, [n, c, hp, wp], &wv, [m, c, 3, 3], &b, 1, 1, 0, 1);
        let (raw, got, _) = wino_run(&x, [n, c, h, w], &wv, m, &b, p);
        let raw = raw.expect("finite inputs stay on the Winograd path");
        assert_eq!(got.dims(), od.as_slice());
        assert_eq!(
            got.data().to_f32_vec(),
            raw,
            "case {ci}: conv_winograd is the transform"
        );
        for (i, (g, w)) in raw.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "case {ci} at {i}: {g} vs {w}"
            );
        }
    }
}

/// Winograd on RLX's product tile over several passes of `C` (130, 136 channels: three
/// passes of `WINO_KC`), a last block of channels past M (70: 64 + 6), enough blocks for
/// the tiles' panels (260: nine), more 2×2 tiles
/// than one tile width (64, 49), input rows wider than one AVX-512 split (37 columns), by one call (`winograd::conv`), by slabs (weights under
/// 1 MiB) and split over 3 threads (weights over 1 MiB: parts of output channels, each
/// its own blocks): each within `4·K·ε·Σ|w·x|` (plus the transforms' round-off) of the
/// f64 definition, and, where the tile takes the products (each sum over `c` in order,
/// one FMA per term), the same bits from every split.
#[test]
fn winograd_tile_products_any_split() {
    let cases = [
        (1, 130, 15, 15, 70),
        (1, 136, 14, 14, 136),
        (2, 96, 9, 10, 40),
        // Rows of 2·20 columns: split into even and odd 16 at a time, then a tail.
        (1, 40, 6, 37, 33),
        // Nine blocks of 32 channels: the tiles read `v` from panels (`packed::panels`)
        // in one call, in place in the 3-thread parts.
        (1, 130, 15, 15, 260),
    ];
    for &(n, c, h, w, m) in &cases {
        let (x, wv, b) = wino_case(n, c, h, w, m);
        let (want, _) = naive(&x, [n, c, h, w], &wv, [m, c, 3, 3], &b, 1, 1, 1, 1);
        let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        let wa: Vec<f32> = wv.iter().map(|v| v.abs()).collect();
        let (mag, _) = naive(
            &xa,
            [n, c, h, w],
            &wa,
            [m, c, 3, 3],
            &vec![0.0; m],
            1,
            1,
            1,
            1,
        );
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| wino_run(&x, [n, c, h, w], &wv, m, &b, (1, 1, 1, 1)))
        };
        let (raw, got1, _) = run(1);
        let (_, got3, _) = run(3);
        let raw = raw.expect("finite inputs stay on the Winograd path");
        let k = (9 * c) as f32;
        for (name, got) in [
            ("raw", raw.clone()),
            ("1 thread", got1.data().to_f32_vec()),
            ("3 threads", got3.data().to_f32_vec()),
        ] {
            for (i, ((g, w), s)) in got.iter().zip(&want).zip(&mag).enumerate() {
                // The transforms scale each term by up to 4 (Bᵀ, Aᵀ) and add 16 of them.
                let tol = 64.0 * k * f32::EPSILON * (s + b[i / (got.len() / n / m) % m].abs());
                assert!(
                    (g - w).abs() <= tol,
                    "{n}x{c}x{h}x{w}->{m} {name} at {i}: {g} vs {w} (tol {tol})"
                );
            }
        }
        if winograd_transform(&Tensor::new(vec![m, c, 3, 3], TensorData::F32(wv.clone())).unwrap())
            .unwrap()
            .tiled()
        {
            assert_eq!(got1.data().to_f32_vec(), raw, "{c}->{m}: slabs or one call");
            assert_eq!(got3.data().to_f32_vec(), raw, "{c}->{m}: 3 threads");
        }
    }
}

/// Non-finite inputs (Inf, -Inf, NaN, and finite values whose transform overflows):
/// the transform declines and `conv_winograd` gives exactly the direct conv's values.
#[test]
fn winograd_nonfinite_is_direct_conv() {
    let (n, c, h, w, m) = (1, 32, 8, 8, 32);
    let plants: [&[(usize, f32)]; 4] = [
        &[(8 * 8 + 3 * 8 + 3, f32::INFINITY)],
        &[(0, f32::NEG_INFINITY), (5 * 8 * 8 + 9, f32::INFINITY)],
        &[(2 * 8 * 8 + 7, f32::NAN)],
        &[(27, 3.0e38), (28, -3.0e38)],
    ];
    for (pi, plant) in plants.iter().enumerate() {
        let (mut x, wv, b) = wino_case(n, c, h, w, m);
        for &(i, v) in *plant {
            x[i] = v;
        }
        let (raw, got, direct) = wino_run(&x, [n, c, h, w], &wv, m, &b, (1, 1, 1, 1));
        assert!(raw.is_none(), "plant {pi}: the transform must decline");
        let (g, d) = (got.data().to_f32_vec(), direct.data().to_f32_vec());
        assert!(
            d.iter().any(|v| !v.is_finite()),
            "plant {pi}: direct conv is not finite"
        );
        for (i, (a, e)) in g.iter().zip(&d).enumerate() {
            assert!(
                a.to_bits() == e.to_bits(),
                "plant {pi} at {i}: {a} vs direct {e}"
            );
        }
    }
}

/// Convs large enough to run in several row blocks (CONV_BLOCK_BYTES), in blocks one
/// after another (1 thread) and in parallel (2 threads): 3x3 pad 1, 3x3 stride 2, 1x1
/// direct (no im2col), and a grouped conv.
#[test]
fn blocked_conv_matches_definition() {
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            check([1, 64, 45, 40], [64, 64, 3, 3], 1, 1, 1, 1);
            check([1, 64, 90, 80], [64, 64, 3, 3], 2, 1, 1, 1);
            check([2, 16, 64, 64], [256, 16, 1, 1], 1, 1, 0, 1);
            check([1, 64, 47, 41], [128, 32, 3, 3], 1, 1, 1, 2);
        });
    }
}

/// Finite inputs whose direct partial sums overflow while the transform's cancel:
/// +2e38 on channel 0 and -2e38 on channel 1 under the same taps. The direct conv
/// (im2col + gemm) makes an Inf there; `conv_winograd` must give exactly its values,
/// not the transform's finite ones.
#[test]
fn winograd_overflow_that_cancels_is_direct_conv() {
    let (n, c, h, w, m) = (1, 32, 7, 7, 32);
    let mut x = vec![0.0f32; c * h * w];
    for (ch, v) in [(0, 2e38f32), (1, -2e38)] {
        x[ch * h * w + 3 * w + 2] = v;
        x[ch * h * w + 3 * w + 4] = v;
    }
    let mut wv = vec![0.0f32; m * c * 9];
    for mi in 0..m {
        for ch in 0..2 {
            wv[(mi * c + ch) * 9 + 3] = 1.0; // tap (1, 0)
            wv[(mi * c + ch) * 9 + 5] = 1.0; // tap (1, 2)
        }
    }
    let b = vec![0.1887f32; m];
    let (_, got, direct) = wino_run(&x, [n, c, h, w], &wv, m, &b, (1, 1, 1, 1));
    let (g, d) = (got.data().to_f32_vec(), direct.data().to_f32_vec());
    assert!(
        d.iter().any(|v| v.is_infinite()),
        "the direct sum overflows"
    );
    for (i, (a, e)) in g.iter().zip(&d).enumerate() {
        assert!(a.to_bits() == e.to_bits(), "at {i}: {a} vs direct {e}");
    }
}

#[test]
fn depthwise_conv_matches_definition() {
    check([2, 6, 9, 8], [6, 1, 3, 3], 1, 1, 1, 6);
    check([1, 5, 12, 11], [5, 1, 3, 3], 2, 1, 1, 5);
    check([1, 4, 10, 10], [4, 1, 5, 5], 2, 2, 2, 4);
    check([1, 3, 6, 6], [3, 1, 3, 3], 1, 1, 0, 3);
}

/// The channel-block path (16 channels per register, `dw_simd::cblock`) gives the per-row
/// path's bits: the conv after a 1×1 conv runs on the per-row kernel in a pair
/// (`pw_dw`) and on this one alone, and fusion must not change a value. Blocks of 16
/// and a partial one, batch 2, strides 1 and 2, even and one-sided pads, NaN/Inf in the
/// input, each clamp, 1 and 3 threads; and the scan's figure is exactly the largest |y|.
#[cfg(target_arch = "x86_64")]
#[test]
fn depthwise_channel_blocks_give_the_per_row_bits() {
    use dw_simd::Isa;
    // (channel blocks, per-row path) on each width this CPU has.
    let pairs: &[(Isa, Isa)] = match dw_simd::best_isa() {
        Some(Isa::Avx512) => &[(Isa::Avx512, Isa::Avx512Rows), (Isa::Avx2, Isa::Avx2Rows)],
        Some(Isa::Avx2) => &[(Isa::Avx2, Isa::Avx2Rows)],
        _ => {
            {
                use std::io::Write; // past the test harness's capture: the skip shows in CI logs
                let _ = writeln!(
                    std::io::stderr(),
                    "skipping {}: no AVX-512F/VL or AVX2 on this CPU (two SIMD paths to compare)",
                    std::thread::current().name().unwrap_or("?")
                );
            }
            return;
        }
    };
    // (h, w, k, stride, pads top/left/bottom/right, channels)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        (usize, usize, usize, usize),
        usize,
    );
    let geos: &[Case] = &[
        (7, 7, 5, 1, (2, 2, 2, 2), 37),
        (7, 7, 3, 1, (1, 1, 1, 1), 16),
        (14, 14, 5, 2, (1, 1, 2, 2), 37),
        (14, 13, 3, 2, (1, 1, 1, 1), 20),
        (11, 7, 3, 1, (0, 1, 2, 1), 5),
        (28, 28, 5, 1, (2, 2, 2, 2), 17),
        (9, 9, 7, 1, (3, 3, 3, 3), 18),
        (3, 4, 5, 1, (2, 2, 2, 2), 1),
    ];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for (gi, &(h, wd, k, s, p, c)) in geos.iter().enumerate() {
        let (oh, ow) = ((h + p.0 + p.2 - k) / s + 1, (wd + p.1 + p.3 - k) / s + 1);
        let a = ConvAttrs {
            strides: vec![s, s],
            pads: vec![(p.0, p.2), (p.1, p.3)],
            dilations: vec![1, 1],
            groups: c,
        };
        let g = geometry(&[2, c, h, wd], &[c, 1, k, k], &a, &[2, c, oh, ow]).unwrap();
        assert!(
            dw_simd::cblock_plan(&g, 16).is_some(),
            "geo {gi} takes the channel blocks"
        );
        let mut x: Vec<f32> = (0..2 * c * h * wd)
            .map(|i| ((i * 7919 + gi) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let n = x.len();
        x[n / 2] = f32::NAN;
        x[n / 3] = f32::INFINITY;
        x[n / 5] = f32::NEG_INFINITY;
        let w: Vec<f32> = (0..c * k * k)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 0.5).collect();
        for clamp in [Clamp::NONE, Clamp::RELU, Clamp::clip(-0.25, 0.5)] {
            let run = |isa, seen: Option<&AtomicU32>| {
                let epi = Epilogue {
                    bias: Some(&b),
                    clamp: Some(clamp),
                    post: &no_post,
                    post_bias: None,
                    seen,
                };
                dw_simd::run_with(isa, true, &x, &w, &g, &epi).unwrap()
            };
            for &(fast, rows) in pairs {
                let want = run(rows, None);
                for threads in [1, 3] {
                    let seen = AtomicU32::new(0);
                    let got = if threads == 1 {
                        run(fast, Some(&seen))
                    } else {
                        pool.install(|| run(fast, Some(&seen)))
                    };
                    for (i, (&u, &v)) in got.iter().zip(&want).enumerate() {
                        let nan_ok = u.is_nan() && v.is_nan() && !clamp.nan_out;
                        assert!(
                            u.to_bits() == v.to_bits() || nan_ok,
                            "{fast:?} geo {gi} {clamp:?} {threads} threads at {i}: {u} vs {v}"
                        );
                    }
                    if clamp == Clamp::NONE {
                        let want_bits = crate::kernels::wide::max_abs_bits(&want);
                        assert_eq!(
                            seen.into_inner(),
                            want_bits,
                            "{fast:?} geo {gi} {threads} threads"
                        );
                    }
                }
            }
        }
    }
}

/// Each SIMD width the CPU has (AVX-512 and AVX2 on an AVX-512 machine) against the
/// generic depthwise loop, NaN/Inf included (same NaN positions, values within rounding).
#[cfg(target_arch = "x86_64")]
#[test]
fn depthwise_simd_widths_match_generic() {
    let isas: &[dw_simd::Isa] = match dw_simd::best_isa() {
        Some(dw_simd::Isa::Avx512 | dw_simd::Isa::Avx512Y | dw_simd::Isa::Avx512Rows) => &[
            dw_simd::Isa::Avx512,
            dw_simd::Isa::Avx512Rows,
            dw_simd::Isa::Avx512Y,
            dw_simd::Isa::Avx2,
            dw_simd::Isa::Avx2Rows,
        ],
        Some(dw_simd::Isa::Avx2 | dw_simd::Isa::Avx2Rows) => {
            &[dw_simd::Isa::Avx2, dw_simd::Isa::Avx2Rows]
        }
        None => &[],
    };
    let geos = [
        // (h, w, k, stride, dil, pads (t, l, b, r))
        (9, 9, 3, 1, 1, (1, 1, 1, 1)),
        (7, 7, 3, 2, 1, (0, 0, 1, 1)),
        (1, 1, 3, 1, 1, (1, 1, 1, 1)),
        (2, 3, 5, 2, 1, (2, 2, 2, 2)),
        (20, 37, 5, 2, 2, (3, 4, 2, 1)),
        (17, 33, 3, 3, 1, (1, 1, 1, 1)),
        (14, 14, 7, 1, 1, (3, 3, 3, 3)),
        // 28² at stride 1: the per-row path (four rows at a time), not the flat one
        (28, 28, 3, 1, 1, (1, 1, 1, 1)),
        // the flat path's cases (AVX-512; stride 1 on planes up to 256, stride 2)
        (14, 14, 3, 2, 1, (1, 1, 1, 1)),
        (57, 70, 3, 2, 1, (1, 1, 1, 1)),
        (40, 40, 5, 2, 1, (2, 1, 2, 2)),
        (13, 13, 5, 2, 1, (2, 2, 2, 2)),
        (7, 7, 5, 1, 1, (2, 2, 2, 2)),
        (32, 31, 3, 2, 1, (1, 0, 1, 1)),
        (5, 40, 3, 1, 1, (0, 1, 2, 1)),
    ];
    // With an infinite weight (`inf · 0` in the padding: the flat path must not be
    // taken) and with finite weights (it is, where the geometry allows).
    let mut nan_cases = 0;
    for (gi, &(h, wd, k, s, d, p), inf_w) in geos
        .iter()
        .enumerate()
        .flat_map(|(gi, geo)| [(gi, geo, true), (gi, geo, false)])
    {
        let c = 3;
        let span = d * (k - 1) + 1;
        let (oh, ow) = (
            (h + p.0 + p.2 - span) / s + 1,
            (wd + p.1 + p.3 - span) / s + 1,
        );
        let a = ConvAttrs {
            strides: vec![s, s],
            pads: vec![(p.0, p.2), (p.1, p.3)],
            dilations: vec![d, d],
            groups: c,
        };
        let g = geometry(&[2, c, h, wd], &[c, 1, k, k], &a, &[2, c, oh, ow]).unwrap();
        let mut x: Vec<f32> = (0..2 * c * h * wd)
            .map(|i| ((i * 7919 + gi) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let mut w: Vec<f32> = (0..c * k * k)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let n = x.len();
        x[n / 2] = f32::NAN;
        x[n / 3] = f32::INFINITY;
        x[0] = f32::NEG_INFINITY;
        if inf_w {
            w[k * k] = f32::INFINITY;
        }
        let b: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 0.5).collect();
        // The cases meant for the flat path reach it (the comparison below covers it).
        assert_eq!(
            dw_simd::flat_plan(&g).is_some(),
            d == 1 && (s == 2 || (s == 1 && h * wd <= 256)),
            "geo {gi}"
        );
        let conv = depthwise_2d(&x, &w, Some(&b), &g);
        // The clamps against ONNX's definitions of the activations on the generic
        // path's values: none, Relu (`x < 0 ? 0 : x`), Clip (NaN kept).
        use crate::kernels::elementwise::{max_f32, min_f32};
        let relu = |v: f32| if v < 0.0 { 0.0 } else { v };
        let clip = |v: f32| min_f32(max_f32(v, -0.25), 0.5);
        let acts: [(Clamp, &dyn Fn(f32) -> f32); 3] = [
            (Clamp::NONE, &|v| v),
            (Clamp::RELU, &relu),
            (Clamp::clip(-0.25, 0.5), &clip),
        ];
        // The NaN scan's figure, taken before the clamp: at least the conv's largest |y|
        // bits (lanes past a row's end may only add to it).
        let conv_bits = crate::kernels::wide::max_abs_bits(&conv);
        // (The infinite weight makes a NaN in every case; the input's NaN, Inf and
        // -Inf reach the output in most, counted below.)
        assert!(
            conv_bits > 0x7f80_0000 || !inf_w,
            "the data puts a NaN in the conv (geo {gi})"
        );
        nan_cases += usize::from(!inf_w && conv_bits > 0x7f80_0000);
        for (clamp, act) in acts {
            let want: Vec<f32> = conv.iter().map(|&v| act(v)).collect();
            for &isa in isas {
                let seen = AtomicU32::new(0);
                let epi = Epilogue {
                    bias: Some(&b),
                    clamp: Some(clamp),
                    post: &no_post,
                    post_bias: None,
                    seen: Some(&seen),
                };
                let got = dw_simd::run_with(isa, !inf_w, &x, &w, &g, &epi).unwrap();
                // (Finite: to round-off, as the sums are in another order.)
                let seen = seen.into_inner();
                assert!(
                    seen >= conv_bits
                        || (conv_bits < 0x7f80_0000
                            && f32::from_bits(seen) >= f32::from_bits(conv_bits) * (1.0 - 1e-5)),
                    "{isa:?} {clamp:?} geo {gi}"
                );
                assert_eq!(got.len(), want.len());
                for (i, (&u, &v)) in got.iter().zip(&want).enumerate() {
                    // Clip's NaN is f32::NAN, bit for bit (as RLX's Max/Min give it).
                    let nan_ok = !clamp.nan_out || u.to_bits() == v.to_bits();
                    let same = (u.is_nan() && v.is_nan() && nan_ok)
                        || u == v
                        || (u - v).abs() <= 1e-5 * (1.0 + v.abs());
                    assert!(same, "{isa:?} {clamp:?} geo {gi} at {i}: {u} vs {v}");
                }
            }
        }
        // Finite data: the figure is finite (no false alarm) and at least the conv's
        // largest |y| (to round-off: the sums are in another order), which here is
        // above the Clip's bounds.
        let xf: Vec<f32> = x
            .iter()
            .map(|v| if v.is_finite() { *v } else { 3.0 })
            .collect();
        let wf: Vec<f32> = w
            .iter()
            .map(|v| if v.is_finite() { *v } else { 2.0 })
            .collect();
        let conv_max = crate::kernels::wide::max_abs_bits(&depthwise_2d(&xf, &wf, Some(&b), &g));
        let conv_max = f32::from_bits(conv_max);
        assert!(conv_max > 0.5);
        for &isa in isas {
            let seen = AtomicU32::new(0);
            let clip = Clamp::clip(-0.25, 0.5);
            let epi = Epilogue {
                bias: Some(&b),
                clamp: Some(clip),
                post: &no_post,
                post_bias: None,
                seen: Some(&seen),
            };
            dw_simd::run_with(isa, true, &xf, &wf, &g, &epi).unwrap();
            let got = f32::from_bits(seen.into_inner());
            assert!(
                got.is_finite() && got >= conv_max * (1.0 - 1e-5),
                "{isa:?} geo {gi}: {got} vs {conv_max}"
            );
        }
    }
    assert!(
        nan_cases >= 8,
        "only {nan_cases} finite-weight cases had a NaN output"
    );
}

/// The NaN scan's figure sees an Inf at every output position: f32::MAX at each input
/// position in turn, under a Clip that would hide it, with a centre weight of 2 (so
/// the output centred there overflows) and 1e-30 elsewhere (so no other output does).
/// Every SIMD path says non-finite exactly when the generic conv's output holds an Inf.
#[cfg(target_arch = "x86_64")]
/// The geometry of one `h × wd` plane (one image, one channel) under a `k × k` kernel at
/// stride `s` with `p` padding on every side, and its output height and width.
fn plane_geo(
    h: usize,
    wd: usize,
    k: usize,
    s: usize,
    p: usize,
) -> (super::common::Geo, usize, usize) {
    let (oh, ow) = ((h + 2 * p - k) / s + 1, (wd + 2 * p - k) / s + 1);
    let a = ConvAttrs {
        strides: vec![s, s],
        pads: vec![(p, p), (p, p)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let g = geometry(&[1, 1, h, wd], &[1, 1, k, k], &a, &[1, 1, oh, ow]).unwrap();
    (g, oh, ow)
}

#[test]
fn depthwise_tracking_sees_every_position() {
    let Some(best) = dw_simd::best_isa() else {
        return;
    };
    let isas = if best == dw_simd::Isa::Avx2 {
        vec![best, dw_simd::Isa::Avx2Rows]
    } else {
        vec![
            dw_simd::Isa::Avx512,
            dw_simd::Isa::Avx512Rows,
            dw_simd::Isa::Avx2,
            dw_simd::Isa::Avx2Rows,
        ]
    };
    // (h, w, k, stride, pad): flat-path geometries and one per-row one
    for (h, wd, k, s, p) in [
        (14, 14, 3, 2, 1),
        (7, 7, 5, 1, 2),
        (9, 13, 3, 1, 1),
        (40, 40, 3, 2, 1),
    ] {
        let (g, _, _) = plane_geo(h, wd, k, s, p);
        let mut w = vec![1e-30f32; k * k];
        w[k * k / 2] = 2.0;
        for i in 0..h * wd {
            let mut x = vec![0.1f32; h * wd];
            x[i] = f32::MAX;
            let want =
                crate::kernels::wide::max_abs_bits(&depthwise_2d(&x, &w, None, &g)) >= 0x7f80_0000;
            for &isa in &isas {
                let seen = AtomicU32::new(0);
                let clip = Clamp::clip(0.0, 6.0);
                let epi = Epilogue {
                    bias: None,
                    clamp: Some(clip),
                    post: &no_post,
                    post_bias: None,
                    seen: Some(&seen),
                };
                let y = dw_simd::run_with(isa, true, &x, &w, &g, &epi).unwrap();
                assert!(y.iter().all(|v| (0.0..=6.0).contains(v)));
                let got = seen.into_inner() >= 0x7f80_0000;
                assert_eq!(got, want, "{isa:?} {h}x{wd} k{k} s{s}: inf at {i}");
            }
        }
    }
}

/// 1×1 convs in one row block between 1 M and 32 M multiply-adds (SqueezeNet's squeeze
/// convs, ResNet's 64←64 at 56²) through gemm on every thread count: `conv_float` splits
/// them in up to four row blocks per thread (or gemm splits the larger ones itself: the
/// path depends on the thread count), and every output is bit for bit the 1-thread run's
/// and within rounding of the f64 definition, with a Relu clamp, NaN and ±inf inputs kept
/// where they land.
#[test]
fn gemm_convs_split_over_threads_give_one_threads_bits() {
    // (input channels, output channels, plane)
    let cases = [
        (128, 16, 55),
        (256, 32, 27),
        (32, 128, 27),
        (64, 64, 56),
        (16, 64, 55),
        (16, 128, 27),
        (48, 192, 13),
    ];
    for (ci, (c, m, hw)) in cases.into_iter().enumerate() {
        let a = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(0, 0), (0, 0)],
            dilations: vec![1, 1],
            groups: 1,
        };
        let mut x: Vec<f32> = (0..c * hw * hw)
            .map(|i| ((i * 7919 + ci) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let n = x.len();
        x[n / 2] = f32::NAN;
        x[n / 3 + 5] = f32::INFINITY;
        x[n - 1] = f32::NEG_INFINITY;
        let w: Vec<f32> = (0..m * c)
            .map(|i| ((i * 104729) % 89) as f32 / 440.0 - 0.1)
            .collect();
        let b: Vec<f32> = (0..m).map(|i| i as f32 * 0.01 - 0.2).collect();
        let (want, _) = naive(&x, [1, c, hw, hw], &w, [m, c, 1, 1], &b, 1, 1, 0, 1);
        let xt = Tensor::new(vec![1, c, hw, hw], TensorData::F32(x.clone())).unwrap();
        let wt = Tensor::new(vec![m, c, 1, 1], TensorData::F32(w.clone())).unwrap();
        let bt = Tensor::new(vec![m], TensorData::F32(b.clone())).unwrap();
        let out = Shape::new(&[1, m, hw, hw], DType::F32);
        let act = Act {
            clamp: Some(Clamp::RELU),
            ..Act::NONE
        };
        let mut first: Option<Vec<u32>> = None;
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let y = pool.install(|| conv_post(&xt, &wt, Some(&bt), &a, &out, act, None).unwrap());
            let y = y.as_f32().unwrap();
            for (i, (&g, &r)) in y.iter().zip(&want).enumerate() {
                let r = if r.is_nan() { r } else { r.max(0.0) };
                let ok =
                    (g.is_nan() && r.is_nan()) || g == r || (g - r).abs() <= 1e-5 * (1.0 + r.abs());
                assert!(
                    ok,
                    "case {ci}, {threads} threads, output {i}: {g} against {r}"
                );
            }
            let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(f) => assert!(f == &bits, "case {ci}: {threads} threads differ from 1"),
            }
        }
    }
}

/// The depthwise row kernels run several output rows at once (`rows::plane`: four for
/// 3×3, two for larger kernels, at stride 1; `flat::s2_plane`: two at stride 2) with the
/// sums of one row alone: a plane in one call gives the bits and scan bits of the same
/// plane one output row per call, with NaN, ±inf and ±0 among the inputs, every clamp,
/// row counts that leave 1-3 rows over, widths with masked edge chunks.
#[test]
fn depthwise_row_blocks_give_the_one_row_bits() {
    use super::common::Clamp;
    if dw_simd::best_isa() != Some(dw_simd::Isa::Avx512) {
        return;
    }
    // (h, w, k, stride, pad)
    let geos = [
        (23, 37, 3, 1, 1),
        (14, 40, 5, 1, 2),
        (11, 19, 7, 1, 3),
        (9, 16, 3, 1, 0),
        (23, 37, 3, 2, 1),
        (17, 33, 5, 2, 2),
        (12, 48, 3, 2, 1),
    ];
    let clamps = [
        Clamp {
            track: true,
            ..Clamp::NONE
        },
        Clamp {
            track: true,
            ..Clamp::RELU
        },
        Clamp {
            track: true,
            ..Clamp::clip(0.0, 6.0)
        },
        Clamp::clip(-1.0, 1.0),
    ];
    for (gi, &(h, wd, k, s, p)) in geos.iter().enumerate() {
        let (g, oh, ow) = plane_geo(h, wd, k, s, p);
        let mut x = crate::kernels::rnd(h * wd, 40 + gi as u64);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        for (i, v) in x.iter_mut().enumerate().skip(3).step_by(29) {
            *v = specials[i % specials.len()];
        }
        let wt = crate::kernels::rnd(k * k, 50 + gi as u64);
        for clamp in clamps {
            let run = |rows: &[std::ops::Range<usize>]| {
                let mut out = vec![7f32; oh * ow];
                let mut bits = 0;
                for r in rows {
                    // SAFETY: AVX-512F (checked above); the plane and its rows are whole.
                    bits = bits.max(unsafe {
                        if s == 1 {
                            let pl = dw_simd::plan::<crate::kernels::simd::Avx512>(&g);
                            let f = match k {
                                3 => dw_simd::rows_avx512::<3>,
                                5 => dw_simd::rows_avx512::<5>,
                                _ => dw_simd::rows_avx512::<7>,
                            };
                            f(&pl, x.as_ptr(), &wt, 0.25, clamp, &mut out, r.clone())
                        } else {
                            let fl = dw_simd::flat_plan(&g).expect("a stride-2 plan");
                            let f = if k == 3 {
                                dw_simd::s2_plane::<3>
                            } else {
                                dw_simd::s2_plane::<5>
                            };
                            f(&fl, x.as_ptr(), &wt, 0.25, clamp, &mut out, r.clone())
                        }
                    });
                }
                (out, bits)
            };
            let (whole, wb) = run(std::slice::from_ref(&(0..oh)));
            let one: Vec<_> = (0..oh).map(|r| r..r + 1).collect();
            let (rows, rb) = run(&one);
            let tag = format!("{h}x{wd} k{k} s{s} p{p} {clamp:?}");
            for (i, (a, b)) in whole.iter().zip(&rows).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{tag}: at {i}: {a} vs {b}");
            }
            assert_eq!(wb, rb, "{tag}: scan bits");
        }
    }
}
