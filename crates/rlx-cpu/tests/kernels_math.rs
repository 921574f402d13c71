//! MatMul, Conv, Pool, Softmax and the normalizations against naive reference loops and
//! formulas written here from the ONNX definitions.

mod common;

use common::rnd;
use rlx_cpu::eval_op;
use rlx_ir::*;

fn f32t(d: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32(d, v).unwrap()
}
fn ev(op: Op, ins: &[&Tensor], d: &[usize], dt: DType) -> Tensor {
    eval_op(&op, ins, &Shape::new(d, dt)).unwrap()
}
fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().to_vec()
}
fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
    }
}

fn naive_mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut o = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for t in 0..k {
                s += a[i * k + t] as f64 * b[t * n + j] as f64;
            }
            o[i * n + j] = s as f32;
        }
    }
    o
}

#[test]
fn matmul_2d_and_large() {
    for &(m, k, n) in &[(2, 3, 4), (1, 1, 1), (70, 130, 90), (128, 256, 64)] {
        let a = rnd(m * k, 1);
        let b = rnd(k * n, 2);
        let y = ev(
            Op::MatMul,
            &[&f32t(&[m, k], a.clone()), &f32t(&[k, n], b.clone())],
            &[m, n],
            DType::F32,
        );
        close(&f32s(&y), &naive_mm(&a, &b, m, k, n), 1e-4);
    }
}

#[test]
fn matmul_batch_broadcast_and_vectors() {
    // a [2,1,3,4] · b [3,4,5] -> [2,3,3,5]
    let a = rnd(2 * 3 * 4, 3);
    let b = rnd(3 * 4 * 5, 4);
    let y = f32s(&ev(
        Op::MatMul,
        &[
            &f32t(&[2, 1, 3, 4], a.clone()),
            &f32t(&[3, 4, 5], b.clone()),
        ],
        &[2, 3, 3, 5],
        DType::F32,
    ));
    for i in 0..2 {
        for j in 0..3 {
            let r = naive_mm(&a[i * 12..(i + 1) * 12], &b[j * 20..(j + 1) * 20], 3, 4, 5);
            close(&y[(i * 3 + j) * 15..(i * 3 + j + 1) * 15], &r, 1e-5);
        }
    }
    // [3,4] · b [3,4] batched a with 2-D b folded: a [2,3,4] · [4,5]
    let y2 = f32s(&ev(
        Op::MatMul,
        &[
            &f32t(&[2, 3, 4], a.clone()),
            &f32t(&[4, 5], b[..20].to_vec()),
        ],
        &[2, 3, 5],
        DType::F32,
    ));
    close(&y2, &naive_mm(&a, &b[..20], 6, 4, 5), 1e-5);
    // 1-D · 2-D and 2-D · 1-D
    let v = rnd(4, 5);
    let y3 = f32s(&ev(
        Op::MatMul,
        &[&f32t(&[4], v.clone()), &f32t(&[4, 5], b[..20].to_vec())],
        &[5],
        DType::F32,
    ));
    close(&y3, &naive_mm(&v, &b[..20], 1, 4, 5), 1e-5);
    let y4 = f32s(&ev(
        Op::MatMul,
        &[&f32t(&[3, 4], a[..12].to_vec()), &f32t(&[4], v.clone())],
        &[3],
        DType::F32,
    ));
    close(&y4, &naive_mm(&a[..12], &v, 3, 4, 1), 1e-5);
    // many small batches (parallel path): [64, 16, 32] · [64, 32, 16]
    let a = rnd(64 * 16 * 32, 6);
    let b = rnd(64 * 32 * 16, 7);
    let y5 = f32s(&ev(
        Op::MatMul,
        &[
            &f32t(&[64, 16, 32], a.clone()),
            &f32t(&[64, 32, 16], b.clone()),
        ],
        &[64, 16, 16],
        DType::F32,
    ));
    for i in 0..64 {
        close(
            &y5[i * 256..(i + 1) * 256],
            &naive_mm(
                &a[i * 512..(i + 1) * 512],
                &b[i * 512..(i + 1) * 512],
                16,
                32,
                16,
            ),
            1e-4,
        );
    }
}

#[test]
fn matmul_f64_and_int() {
    let a = Tensor::new(vec![2, 2], TensorData::F64(vec![1.0, 2.0, 3.0, 4.0])).unwrap();
    let y = ev(Op::MatMul, &[&a, &a], &[2, 2], DType::F64);
    assert_eq!(y.data().to_f64_vec(), vec![7.0, 10.0, 15.0, 22.0]);
    let ai = Tensor::from_i64(&[2, 2], vec![1, 2, 3, 4]).unwrap();
    let yi = ev(Op::MatMul, &[&ai, &ai], &[2, 2], DType::I64);
    assert_eq!(yi.data().to_i64_vec(), vec![7, 10, 15, 22]);
}

/// Direct convolution straight from the ONNX Conv definition (2-D).
#[allow(clippy::too_many_arguments)]
fn naive_conv2d(
    x: &[f32],
    xd: [usize; 4],
    w: &[f32],
    wd: [usize; 4],
    b: Option<&[f32]>,
    s: [usize; 2],
    p: [usize; 4],
    dil: [usize; 2],
    g: usize,
) -> (Vec<f32>, [usize; 4]) {
    let [n, c, h, wi] = xd;
    let [m, cg, kh, kw] = wd;
    let oh = (h + p[0] + p[2] - dil[0] * (kh - 1) - 1) / s[0] + 1;
    let ow = (wi + p[1] + p[3] - dil[1] * (kw - 1) - 1) / s[1] + 1;
    let mg = m / g;
    let mut o = vec![0.0f32; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            let gi = mi / mg;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = b.map(|b| b[mi] as f64).unwrap_or(0.0);
                    for ci in 0..cg {
                        let cin = gi * cg + ci;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * s[0] + ky * dil[0]) as isize - p[0] as isize;
                                let ix = (xo * s[1] + kx * dil[1]) as isize - p[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                    continue;
                                }
                                acc += x[((ni * c + cin) * h + iy as usize) * wi + ix as usize]
                                    as f64
                                    * w[((mi * cg + ci) * kh + ky) * kw + kx] as f64;
                            }
                        }
                    }
                    o[((ni * m + mi) * oh + y) * ow + xo] = acc as f32;
                }
            }
        }
    }
    let _ = c;
    (o, [n, m, oh, ow])
}

#[test]
#[allow(clippy::type_complexity)]
fn conv2d_against_direct_loop() {
    // (x dims, w dims, strides, pads [t,l,b,r], dilations, groups, bias)
    let cases: Vec<(
        [usize; 4],
        [usize; 4],
        [usize; 2],
        [usize; 4],
        [usize; 2],
        usize,
        bool,
    )> = vec![
        (
            [1, 1, 5, 5],
            [1, 1, 3, 3],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            false,
        ),
        (
            [2, 3, 7, 6],
            [4, 3, 3, 3],
            [2, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            [1, 4, 8, 8],
            [4, 1, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            4,
            true,
        ), // depthwise
        (
            [1, 4, 9, 9],
            [6, 2, 3, 2],
            [2, 2],
            [0, 1, 2, 0],
            [2, 1],
            2,
            false,
        ), // groups+dilation+asym pads
        (
            [2, 8, 5, 5],
            [16, 8, 1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            true,
        ), // 1x1 = gemm
    ];
    for (k, (xd, wd, s, p, dil, g, has_b)) in cases.into_iter().enumerate() {
        let x = rnd(xd.iter().product(), 10 + k as u64);
        let w = rnd(wd.iter().product(), 20 + k as u64);
        let b = rnd(wd[0], 30 + k as u64);
        let (want, od) = naive_conv2d(&x, xd, &w, wd, has_b.then_some(&b[..]), s, p, dil, g);
        let attrs = ConvAttrs {
            strides: s.to_vec(),
            pads: vec![(p[0], p[2]), (p[1], p[3])],
            dilations: dil.to_vec(),
            groups: g,
        };
        let xt = f32t(&xd, x);
        let wt = f32t(&wd, w);
        let bt = f32t(&[wd[0]], b);
        let mut ins = vec![&xt, &wt];
        if has_b {
            ins.push(&bt);
        }
        let y = ev(Op::Conv(attrs), &ins, &od, DType::F32);
        close(&f32s(&y), &want, 1e-4);
    }
}

#[test]
fn conv1d_matches_hand_values() {
    // x = [1,2,3,4], w = [1,0,-1], pad 1 each side: y[i] = x[i-1] - x[i+1]
    let x = f32t(&[1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let w = f32t(&[1, 1, 3], vec![1.0, 0.0, -1.0]);
    let a = ConvAttrs {
        strides: vec![1],
        pads: vec![(1, 1)],
        dilations: vec![1],
        groups: 1,
    };
    let y = ev(Op::Conv(a), &[&x, &w], &[1, 1, 4], DType::F32);
    assert_eq!(f32s(&y), vec![-2.0, -2.0, -2.0, 3.0]);
}

#[test]
fn pools() {
    let x = f32t(&[1, 1, 3, 3], (1..=9).map(|v| v as f32).collect());
    let attrs = |kind| PoolAttrs {
        kind,
        kernel: vec![2, 2],
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    // Max with pad 1, kernel 2, stride 1 → 4x4
    let y = f32s(&ev(
        Op::Pool(attrs(PoolKind::Max)),
        &[&x],
        &[1, 1, 4, 4],
        DType::F32,
    ));
    assert_eq!(
        y,
        vec![1., 2., 3., 3., 4., 5., 6., 6., 7., 8., 9., 9., 7., 8., 9., 9.]
    );
    // Avg excluding pads: corner = 1/1, include pads: corner = 1/4
    let ex = f32s(&ev(
        Op::Pool(attrs(PoolKind::Avg {
            count_include_pad: false,
        })),
        &[&x],
        &[1, 1, 4, 4],
        DType::F32,
    ));
    let inc = f32s(&ev(
        Op::Pool(attrs(PoolKind::Avg {
            count_include_pad: true,
        })),
        &[&x],
        &[1, 1, 4, 4],
        DType::F32,
    ));
    assert_eq!(ex[0], 1.0);
    assert_eq!(inc[0], 0.25);
    assert_eq!(ex[1], 1.5); // (1+2)/2
    assert_eq!(inc[5], 3.0); // (1+2+4+5)/4
                             // Lp p=2 over 2x2 windows without padding
    let lp = PoolAttrs {
        kind: PoolKind::Lp { p: 2.0 },
        kernel: vec![2, 2],
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    let l = f32s(&ev(Op::Pool(lp), &[&x], &[1, 1, 2, 2], DType::F32));
    close(
        &l,
        &[
            (1f32 + 4. + 16. + 25.).sqrt(),
            (4f32 + 9. + 25. + 36.).sqrt(),
            (16f32 + 25. + 49. + 64.).sqrt(),
            (25f32 + 36. + 64. + 81.).sqrt(),
        ],
        1e-6,
    );
    // MaxPool propagates NaN
    let mut v: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    v[4] = f32::NAN;
    let xn = f32t(&[1, 1, 3, 3], v);
    let mp = PoolAttrs {
        kind: PoolKind::Max,
        kernel: vec![2, 2],
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    let y = f32s(&ev(Op::Pool(mp), &[&xn], &[1, 1, 2, 2], DType::F32));
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn max_pool_integers() {
    // u8 values up to 255 (no f32 round trip) and i64 beyond 2^53, pad 1, kernel 2, stride 1
    // (the same windows as `pools`: the max of each 2x2 window over the valid taps).
    let vals: Vec<u8> = vec![1, 200, 3, 4, 255, 6, 7, 8, 9];
    let x = Tensor::new(vec![1, 1, 3, 3], TensorData::U8(vals)).unwrap();
    let attrs = PoolAttrs {
        kind: PoolKind::Max,
        kernel: vec![2, 2],
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    let y = ev(Op::Pool(attrs.clone()), &[&x], &[1, 1, 4, 4], DType::U8);
    let want: Vec<u8> = vec![1, 200, 200, 3, 4, 255, 255, 6, 7, 255, 255, 9, 7, 8, 9, 9];
    assert_eq!(y.data(), &TensorData::U8(want));
    let big = (1i64 << 60) + 1;
    let xi = Tensor::new(vec![1, 1, 1, 2], TensorData::I64(vec![big, big - 1])).unwrap();
    let a1 = PoolAttrs {
        kernel: vec![1, 2],
        pads: vec![(0, 0), (0, 0)],
        ..attrs
    };
    let yi = ev(Op::Pool(a1), &[&xi], &[1, 1, 1, 1], DType::I64);
    assert_eq!(yi.data(), &TensorData::I64(vec![big]));
}

#[test]
fn softmax_and_logsoftmax_from_formula() {
    let x = f32t(&[1, 3], vec![1.0, 2.0, 3.0]);
    let s: f32 = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).sum();
    let want: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp() / s).collect();
    let y = f32s(&ev(Op::Softmax { axis: 1 }, &[&x], &[1, 3], DType::F32));
    close(&y, &want, 1e-6);
    let ly = f32s(&ev(Op::LogSoftmax { axis: 1 }, &[&x], &[1, 3], DType::F32));
    close(&ly, &want.iter().map(|v| v.ln()).collect::<Vec<_>>(), 1e-6);
    // axis 0 of a [3,2] tensor (strided lanes)
    let x = f32t(&[3, 2], vec![1.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
    let y = f32s(&ev(Op::Softmax { axis: 0 }, &[&x], &[3, 2], DType::F32));
    close(&[y[0], y[2], y[4]], &want, 1e-6);
    close(&[y[1], y[3], y[5]], &[1.0 / 3.0; 3], 1e-6);
    // an all -inf row gives NaN (max subtraction: -inf - -inf)
    let x = f32t(
        &[2, 2],
        vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY],
    );
    let y = f32s(&ev(Op::Softmax { axis: 1 }, &[&x], &[2, 2], DType::F32));
    assert!(y[0].is_nan() && y[1].is_nan());
    assert_eq!(&y[2..], &[1.0, 0.0]);
}

#[test]
fn layer_norm_batch_norm_lrn() {
    let x = f32t(&[2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 4.0]);
    let sc = f32t(&[3], vec![1.0, 2.0, 0.5]);
    let bi = f32t(&[3], vec![0.0, 1.0, -1.0]);
    let y = f32s(&ev(
        Op::LayerNorm {
            axis: 1,
            epsilon: 1e-5,
        },
        &[&x, &sc, &bi],
        &[2, 3],
        DType::F32,
    ));
    let mut want = vec![];
    for r in 0..2 {
        let row = &[[1.0f32, 2.0, 3.0], [-1.0, 0.0, 4.0]][r];
        let mean = row.iter().sum::<f32>() / 3.0;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 3.0;
        for j in 0..3 {
            want.push(
                (row[j] - mean) / (var + 1e-5).sqrt() * [1.0, 2.0, 0.5][j] + [0.0, 1.0, -1.0][j],
            );
        }
    }
    close(&y, &want, 1e-5);

    // BatchNorm on [1,2,2]
    let x = f32t(&[1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let s = f32t(&[2], vec![1.0, 2.0]);
    let b = f32t(&[2], vec![0.5, -0.5]);
    let m = f32t(&[2], vec![1.5, 3.0]);
    let v = f32t(&[2], vec![0.25, 4.0]);
    let y = f32s(&ev(
        Op::BatchNorm { epsilon: 0.0 },
        &[&x, &s, &b, &m, &v],
        &[1, 2, 2],
        DType::F32,
    ));
    close(
        &y,
        &[
            (1.0 - 1.5) / 0.5 + 0.5,
            (2.0 - 1.5) / 0.5 + 0.5,
            0.0 * 2.0 - 0.5,
            (4.0 - 3.0) / 2.0 * 2.0 - 0.5,
        ],
        1e-6,
    );

    // LRN size 3 on C = 3, one pixel: square sums over neighbour channels
    let x = f32t(&[1, 3, 1, 1], vec![1.0, 2.0, 3.0]);
    let (alpha, beta, bias) = (0.3f32, 0.75f32, 2.0f32);
    let y = f32s(&ev(
        Op::Lrn {
            size: 3,
            alpha,
            beta,
            bias,
        },
        &[&x],
        &[1, 3, 1, 1],
        DType::F32,
    ));
    let sq = [1.0f32 + 4.0, 1.0 + 4.0 + 9.0, 4.0 + 9.0];
    let want: Vec<f32> = (0..3)
        .map(|c| [1.0f32, 2.0, 3.0][c] / (bias + alpha / 3.0 * sq[c]).powf(beta))
        .collect();
    close(&y, &want, 1e-6);
}

#[test]
fn argmax_trilu() {
    let x = f32t(&[2, 3], vec![1.0, 5.0, 5.0, f32::NAN, 0.0, 9.0]);
    let a = ev(
        Op::ArgReduce {
            max: true,
            axis: 1,
            keepdims: false,
            select_last_index: false,
        },
        &[&x],
        &[2],
        DType::I64,
    );
    assert_eq!(a.data().to_i64_vec(), vec![1, 0]);
    let a = ev(
        Op::ArgReduce {
            max: true,
            axis: 1,
            keepdims: true,
            select_last_index: true,
        },
        &[&x],
        &[2, 1],
        DType::I64,
    );
    assert_eq!(a.data().to_i64_vec(), vec![2, 0]);
    let a = ev(
        Op::ArgReduce {
            max: false,
            axis: 0,
            keepdims: false,
            select_last_index: false,
        },
        &[&x],
        &[3],
        DType::I64,
    );
    assert_eq!(a.data().to_i64_vec(), vec![1, 1, 0]);
    let m = f32t(&[3, 3], (1..=9).map(|v| v as f32).collect());
    let u = f32s(&ev(
        Op::Trilu { upper: true, k: 0 },
        &[&m],
        &[3, 3],
        DType::F32,
    ));
    assert_eq!(u, vec![1., 2., 3., 0., 5., 6., 0., 0., 9.]);
    let l = f32s(&ev(
        Op::Trilu {
            upper: false,
            k: -1,
        },
        &[&m],
        &[3, 3],
        DType::F32,
    ));
    assert_eq!(l, vec![0., 0., 0., 4., 0., 0., 7., 8., 0.]);
}

#[test]
fn f16_matmul_rounds_and_overflows() {
    use half::f16;
    let a = Tensor::new(vec![1, 1], TensorData::F16(vec![f16::from_f32(300.0)])).unwrap();
    let y = ev(Op::MatMul, &[&a, &a], &[1, 1], DType::F16);
    match y.data() {
        TensorData::F16(v) => assert!(v[0].is_infinite()),
        _ => unreachable!(),
    }
}

#[test]
fn half_types_keep_their_dtype() {
    use half::{bf16, f16};
    let x = Tensor::new(
        vec![1, 3],
        TensorData::F16(
            [1.0f32, 2.0, 3.0]
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect(),
        ),
    )
    .unwrap();
    let y = ev(Op::Softmax { axis: 1 }, &[&x], &[1, 3], DType::F16);
    let s: f32 = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).sum();
    match y.data() {
        TensorData::F16(v) => {
            for (j, e) in v.iter().enumerate() {
                assert_eq!(*e, f16::from_f32((j as f32 + 1.0).exp() / s));
            }
        }
        d => panic!("dtype changed to {}", d.dtype()),
    }
    let b = Tensor::new(
        vec![2],
        TensorData::BF16(vec![bf16::from_f32(1.0), bf16::from_f32(3.0e38)]),
    )
    .unwrap();
    let y = ev(Op::Binary(BinaryOp::Add), &[&b, &b], &[2], DType::BF16);
    match y.data() {
        TensorData::BF16(v) => {
            assert_eq!(v[0].to_f32(), 2.0);
            assert!(v[1].is_infinite());
        }
        d => panic!("dtype changed to {}", d.dtype()),
    }
    let r = ev(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        },
        &[&x],
        &[1],
        DType::F16,
    );
    assert_eq!(r.data(), &TensorData::F16(vec![f16::from_f32(6.0)]));
}

#[test]
fn conv3d_1x1x1_matches_channel_mix() {
    // 1x1x1 kernel: y[m, p] = sum_c w[m, c] * x[c, p] + b[m]
    let x = rnd(2 * 2 * 3 * 2, 40);
    let w = rnd(3 * 2, 41);
    let b = rnd(3, 42);
    let a = ConvAttrs {
        strides: vec![1, 1, 1],
        pads: vec![(0, 0); 3],
        dilations: vec![1, 1, 1],
        groups: 1,
    };
    let y = f32s(&ev(
        Op::Conv(a),
        &[
            &f32t(&[1, 2, 2, 3, 2], x.clone()),
            &f32t(&[3, 2, 1, 1, 1], w.clone()),
            &f32t(&[3], b.clone()),
        ],
        &[1, 3, 2, 3, 2],
        DType::F32,
    ));
    let mut want = naive_mm(&w, &x, 3, 2, 12);
    for m in 0..3 {
        for p in 0..12 {
            want[m * 12 + p] += b[m];
        }
    }
    close(&y, &want, 1e-5);
    // 3-D with a 2x2x2 kernel, stride 2, pad 1 on depth only: compare against a direct sum.
    let x = rnd(3 * 4 * 4, 43);
    let w = rnd(8, 44);
    let a = ConvAttrs {
        strides: vec![2, 2, 2],
        pads: vec![(1, 1), (0, 0), (0, 0)],
        dilations: vec![1, 1, 1],
        groups: 1,
    };
    let y = f32s(&ev(
        Op::Conv(a),
        &[
            &f32t(&[1, 1, 3, 4, 4], x.clone()),
            &f32t(&[1, 1, 2, 2, 2], w.clone()),
        ],
        &[1, 1, 2, 2, 2],
        DType::F32,
    ));
    let mut want = vec![];
    for od in 0..2usize {
        for oh in 0..2usize {
            for ow in 0..2usize {
                let mut acc = 0.0f32;
                for kd in 0..2usize {
                    for kh in 0..2usize {
                        for kw in 0..2usize {
                            let id = (od * 2 + kd) as isize - 1;
                            if !(0..3).contains(&id) {
                                continue;
                            }
                            let (ih, iw) = (oh * 2 + kh, ow * 2 + kw);
                            acc += x[(id as usize * 4 + ih) * 4 + iw] * w[(kd * 2 + kh) * 2 + kw];
                        }
                    }
                }
                want.push(acc);
            }
        }
    }
    close(&y, &want, 1e-5);
}

/// `Pow(x, 3)` is `x*x*x` (two roundings), which is what onnxruntime 1.32's CPU Pow returns
/// bit for bit (measured on 1e6 N(0, 9) samples: 100% equal to x*x*x, 74% equal to the
/// correctly rounded cube); both the allocating and the in-place paths, NaN/inf included.
#[test]
fn pow_three_is_x_times_x_times_x() {
    use rlx_cpu::CpuExecutor;
    use rlx_ir::{BinaryOp, Graph};
    let xs: Vec<f32> = (0..4099)
        .map(|i| ((i as f32) * 0.618_034).sin() * 3.7 + (i % 7) as f32)
        .chain([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            1e13,
            -1e13,
        ])
        .collect();
    let n = xs.len();
    let want: Vec<f32> = xs.iter().map(|&x| x * x * x).collect();
    let x = Tensor::from_f32(&[n], xs.clone()).unwrap();
    let three = Tensor::from_f32(&[], vec![3.0]).unwrap();
    let out = Shape::new(&[n], DType::F32);
    let got = eval_op(&Op::Binary(BinaryOp::Pow), &[&x, &three], &out).unwrap();
    // In place: the Pow's first input is an intermediate that dies at the Pow.
    let mut g = Graph::new("t");
    let xi = g.input("x", Shape::new(&[n], DType::F32));
    let neg = g.unary(rlx_ir::UnaryOp::Neg, xi, Shape::new(&[n], DType::F32));
    let c = g.constant(three.clone());
    let p = g.binary(BinaryOp::Pow, neg, c, Shape::new(&[n], DType::F32));
    g.set_outputs(vec![p]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let got2 = ex.run(&[x], None).unwrap();
    for (i, &w) in want.iter().enumerate() {
        let a = got.as_f32().unwrap()[i];
        let b = -got2[0].as_f32().unwrap()[i];
        assert!(
            a.to_bits() == w.to_bits() || (a.is_nan() && w.is_nan()),
            "pow({}, 3) = {a}, want {w}",
            xs[i]
        );
        assert!(
            b.to_bits() == w.to_bits() || (b.is_nan() && w.is_nan()),
            "in place: pow({}, 3) = {b}, want {w}",
            -xs[i]
        );
    }
}

/// Max/Avg pooling with strides 2 and 3, dilation, asymmetric pads and NaN/±inf inputs,
/// against the ONNX definition written out directly (each output: the taps of its window
/// inside the image; Max is NaN when any tap is NaN; Avg divides by the valid or the padded
/// tap count). Widths past 16 outputs take the 16-lane path (with its overlapping last
/// block); a 7x7 window over a 7x7 image is a global pool; a 20-wide image with dilation
/// 15 has no output column whose window is wholly inside.
#[test]
fn strided_pools_match_the_definition() {
    for (h, w, specials) in [
        (11usize, 13usize, true),
        (9, 71, true),
        (7, 7, true),
        (7, 7, false),
        (7, 20, true),
    ] {
        strided_pools_case(h, w, specials);
    }
}

/// `specials`: plant a NaN, +inf and -inf (on a 7x7 image they make every global output NaN).
fn strided_pools_case(h: usize, w: usize, specials: bool) {
    let mut xs: Vec<f32> = (0..2 * h * w)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
        .collect();
    if specials {
        xs[17] = f32::NAN;
        xs[60] = f32::INFINITY;
        xs[h * w + 5] = f32::NEG_INFINITY;
    }
    let x = f32t(&[1, 2, h, w], xs.clone());
    for (k, s, d, pads) in [
        (3, 2, 1, [(0, 0), (0, 0)]),
        (3, 2, 1, [(1, 1), (1, 0)]),
        (2, 3, 2, [(1, 0), (0, 2)]),
        (5, 2, 1, [(2, 2), (2, 2)]),
        (3, 1, 1, [(1, 1), (1, 1)]),
        (7, 1, 1, [(0, 0), (0, 0)]),
        // Dilation 15 with pads 15: on a 20-wide row no output column has all three
        // kernel columns inside (an empty interior).
        (3, 1, 15, [(15, 15), (15, 15)]),
    ] {
        let out_len =
            |n: usize, (pb, pe): (usize, usize)| (n + pb + pe - (d * (k - 1) + 1)) / s + 1;
        let (oh, ow) = (out_len(h, pads[0]), out_len(w, pads[1]));
        for kind in [
            PoolKind::Max,
            PoolKind::Avg {
                count_include_pad: false,
            },
            PoolKind::Avg {
                count_include_pad: true,
            },
        ] {
            let attrs = PoolAttrs {
                kind,
                kernel: vec![k, k],
                strides: vec![s, s],
                pads: pads.to_vec(),
                dilations: vec![d, d],
                ceil_mode: false,
            };
            let y = f32s(&ev(Op::Pool(attrs), &[&x], &[1, 2, oh, ow], DType::F32));
            for c in 0..2 {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut taps = vec![];
                        let mut counted = 0usize;
                        for ky in 0..k {
                            for kx in 0..k {
                                let iy = (oy * s + ky * d) as isize - pads[0].0 as isize;
                                let ix = (ox * s + kx * d) as isize - pads[1].0 as isize;
                                let in_pad = iy >= -(pads[0].0 as isize)
                                    && iy < (h + pads[0].1) as isize
                                    && ix >= -(pads[1].0 as isize)
                                    && ix < (w + pads[1].1) as isize;
                                if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                                    taps.push(xs[c * h * w + iy as usize * w + ix as usize] as f64);
                                }
                                counted += in_pad as usize;
                            }
                        }
                        let want = match kind {
                            PoolKind::Max if taps.iter().any(|t| t.is_nan()) => f64::NAN,
                            PoolKind::Max => taps.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                            PoolKind::Avg { count_include_pad } => {
                                let n = if count_include_pad {
                                    counted
                                } else {
                                    taps.len()
                                };
                                taps.iter().sum::<f64>() / n as f64
                            }
                            _ => unreachable!(),
                        };
                        let got = y[(c * oh + oy) * ow + ox] as f64;
                        let ok = (got.is_nan() && want.is_nan())
                            || got == want
                            || (got - want).abs() <= 1e-5 * want.abs().max(1.0);
                        assert!(
                            ok,
                            "{h}x{w} {kind:?} k{k} s{s} d{d} {pads:?} at {c},{oy},{ox}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Transpose against the definition `out[i] = x[perm-permuted i]`, for perms whose adjacent
/// dims merge (attention heads), unit dims, rows longer than a block, and a full reversal.
#[test]
fn transpose_matches_index_definition() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[2, 16, 4, 8], &[0, 2, 1, 3]),
        (&[2, 4, 16, 8], &[0, 1, 3, 2]),
        (&[1, 3, 1, 5, 2], &[4, 2, 0, 3, 1]),
        (&[3, 5, 7, 2, 4], &[4, 3, 2, 1, 0]),
        (&[3, 9000], &[1, 0]),
        (&[2, 3, 4], &[0, 1, 2]),
        (&[1, 1], &[1, 0]),
    ];
    for &(dims, perm) in cases {
        let n: usize = dims.iter().product();
        let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let x = f32t(dims, xs.clone());
        let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let y = f32s(&ev(
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[&x],
            &od,
            DType::F32,
        ));
        let mut ist = vec![1usize; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            ist[i] = ist[i + 1] * dims[i + 1];
        }
        for (o, &got) in y.iter().enumerate() {
            let (mut rem, mut src) = (o, 0);
            for k in (0..od.len()).rev() {
                src += (rem % od[k]) * ist[perm[k]];
                rem /= od[k];
            }
            assert_eq!(got, xs[src], "{dims:?} perm {perm:?} at {o}");
        }
    }
}

/// ONNX Clip as imported (`Min(Max(x, 0), 6)`, ReLU6) on buffers the executor updates in
/// place through the scalar-operand loop: NaN propagates, ±inf clip to the bounds, and every
/// other value equals min(max(x, 0), 6) computed here in f64.
#[test]
fn in_place_clip_with_scalar_bounds_matches_definition() {
    use rlx_cpu::CpuExecutor;
    use rlx_ir::{BinaryOp, Graph, UnaryOp};
    let mut xs: Vec<f32> = (0..70001).map(|i| (i as f32 - 35000.0) * 0.00031).collect();
    xs[3] = f32::NAN;
    xs[40000] = f32::NAN;
    xs[5] = f32::INFINITY;
    xs[6] = f32::NEG_INFINITY;
    xs[7] = -0.0;
    let n = xs.len();
    let s = Shape::new(&[1, n], DType::F32);
    let mut g = Graph::new("t");
    let xi = g.input("x", s.clone());
    let neg = g.unary(UnaryOp::Neg, xi, s.clone());
    let lo = g.constant(Tensor::from_f32(&[], vec![0.0]).unwrap());
    let hi = g.constant(Tensor::from_f32(&[1, 1], vec![6.0]).unwrap());
    let mx = g.binary(BinaryOp::Max, neg, lo, s.clone());
    let mn = g.binary(BinaryOp::Min, mx, hi, s.clone());
    g.set_outputs(vec![mn]);
    let mut ex = CpuExecutor::new(g).unwrap();
    let y = ex
        .run(&[Tensor::from_f32(&[1, n], xs.clone()).unwrap()], None)
        .unwrap();
    for (i, (&x, &got)) in xs.iter().zip(y[0].as_f32().unwrap()).enumerate() {
        let v = -(x as f64);
        if v.is_nan() {
            assert!(got.is_nan(), "at {i}: clip(NaN) = {got}");
        } else {
            assert_eq!(got as f64, v.clamp(0.0, 6.0), "at {i}: clip({v})");
        }
    }
}

/// Broadcasting Sub (not commutative, so a swapped operand shows) against the NumPy rule
/// written out per output index: each input reads index `o_i` on a dim equal to the
/// output's and 0 on a dim of 1, right-aligned. The shapes cover merged runs of dims
/// (`[N,C,H,W] - [N,C,1,1]`), broadcasts in the middle and at the end, size-1 output dims
/// and rank differences.
#[test]
fn broadcast_binary_matches_the_numpy_rule() {
    let cases: [(&[usize], &[usize]); 8] = [
        (&[2, 3, 4, 5], &[2, 3, 1, 1]),
        (&[2, 3, 4, 5], &[1, 3, 1, 5]),
        (&[2, 1, 4, 5], &[3, 1, 5]),
        (&[4, 1], &[1, 6]),
        (&[1, 1, 7], &[2, 3, 1]),
        (&[2, 3, 4], &[4]),
        (&[5, 1, 1], &[5, 2, 3]),
        (&[1], &[2, 1, 3]),
    ];
    for (ad, bd) in cases {
        let r = ad.len().max(bd.len());
        let pad = |d: &[usize]| [vec![1; r - d.len()], d.to_vec()].concat();
        let (pa, pb) = (pad(ad), pad(bd));
        let od: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
        let av = rnd(ad.iter().product(), 5);
        let bv = rnd(bd.iter().product(), 6);
        let y = f32s(&ev(
            Op::Binary(BinaryOp::Sub),
            &[&f32t(ad, av.clone()), &f32t(bd, bv.clone())],
            &od,
            DType::F32,
        ));
        let n: usize = od.iter().product();
        // `o` is the flat output index the reference decomposes, not just `y`'s index.
        #[allow(clippy::needless_range_loop)]
        for o in 0..n {
            let (mut rem, mut ia, mut ib, mut sa, mut sb) = (o, 0, 0, 1, 1);
            for i in (0..r).rev() {
                let oi = rem % od[i];
                rem /= od[i];
                ia += if pa[i] == 1 { 0 } else { oi } * sa;
                ib += if pb[i] == 1 { 0 } else { oi } * sb;
                sa *= pa[i];
                sb *= pb[i];
            }
            assert_eq!(y[o], av[ia] - bv[ib], "{ad:?} - {bd:?} at {o}");
        }
    }
}

/// MaxPool over planes with and without a NaN (the NaN-free fast path and the NaN-aware
/// one), wide rows (the 16-lane fold) and signed zeros and -inf: every output equals the
/// window's max taken tap by tap in window order (a tap replaces the max when larger, or
/// NaN; a NaN max stays), bit for bit.
#[test]
fn max_pool_fast_path_matches_definition_with_and_without_nan() {
    let (h, w) = (37usize, 41usize);
    let mut v: Vec<f32> = (0..2 * h * w)
        .map(|i| match i % 11 {
            0 => -0.0,
            1 => 0.0,
            2 => f32::NEG_INFINITY,
            _ => ((i * 7919) % 1000) as f32 / 37.0 - 13.0,
        })
        .collect();
    v[h * w + 5 * w + 17] = f32::NAN; // plane 1 only
    let x = f32t(&[1, 2, h, w], v.clone());
    // (kernel, stride, pad, ceil_mode): ceil_mode windows run past the input's end.
    let cases = [
        (3, 2, 0, false),
        (3, 2, 1, false),
        (2, 1, 0, false),
        (3, 1, 1, false),
        (2, 2, 0, true),
        (3, 2, 1, true),
        (5, 1, 2, false),
    ];
    for (k, s, p, ceil) in cases {
        let out = |n: usize| {
            let span = n + 2 * p - k;
            if ceil {
                span.div_ceil(s) + 1
            } else {
                span / s + 1
            }
        };
        let (oh, ow) = (out(h), out(w));
        let attrs = PoolAttrs {
            kind: PoolKind::Max,
            kernel: vec![k, k],
            strides: vec![s, s],
            pads: vec![(p, p), (p, p)],
            dilations: vec![1, 1],
            ceil_mode: ceil,
        };
        let y = f32s(&ev(Op::Pool(attrs), &[&x], &[1, 2, oh, ow], DType::F32));
        let mut nans = 0;
        for pl in 0..2 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut m = f32::NEG_INFINITY;
                    for ky in 0..k {
                        for kx in 0..k {
                            let (iy, ix) = (
                                (oy * s + ky) as isize - p as isize,
                                (ox * s + kx) as isize - p as isize,
                            );
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            let e = v[pl * h * w + iy as usize * w + ix as usize];
                            if !m.is_nan() && (e > m || e.is_nan()) {
                                m = e;
                            }
                        }
                    }
                    let got = y[(pl * oh + oy) * ow + ox];
                    nans += m.is_nan() as usize;
                    assert!(
                        got.to_bits() == m.to_bits() || (got.is_nan() && m.is_nan()),
                        "k{k} s{s} p{p} plane {pl} ({oy},{ox}): got {got:?}, want {m:?}"
                    );
                }
            }
        }
        assert!(nans > 0, "the NaN reached some window");
    }
}

/// MaxPool 3×3 stride 2 (the AVX-512 or AVX2 row-fold path on CPUs that have one) with one
/// NaN at each column of the first and last rows in turn, on widths around multiples of 16
/// and 32 (output widths that fill their last 8- or 16-lane strip, where the last window's
/// third column is read past the strip), pads 0 and 1, ceil_mode off and on: every window
/// that holds the NaN
/// gives NaN, and every other output is the window's max.
#[test]
fn max_pool_3x3_stride_2_sees_a_nan_in_every_column() {
    for w in [15usize, 16, 17, 18, 19, 31, 32, 33, 34, 35, 63, 64, 65, 66] {
        for (p, ceil) in [(0usize, false), (1, false), (0, true), (1, true)] {
            let h = 5usize;
            let out = |n: usize| {
                let span = n + 2 * p - 3;
                if ceil {
                    span.div_ceil(2) + 1
                } else {
                    span / 2 + 1
                }
            };
            let (oh, ow) = (out(h), out(w));
            let attrs = PoolAttrs {
                kind: PoolKind::Max,
                kernel: vec![3, 3],
                strides: vec![2, 2],
                pads: vec![(p, p), (p, p)],
                dilations: vec![1, 1],
                ceil_mode: ceil,
            };
            for row in [0, h - 1] {
                for col in 0..w {
                    let mut v: Vec<f32> = (0..h * w).map(|i| (i % 7) as f32 - 3.0).collect();
                    v[row * w + col] = f32::NAN;
                    let x = f32t(&[1, 1, h, w], v.clone());
                    let y = f32s(&ev(
                        Op::Pool(attrs.clone()),
                        &[&x],
                        &[1, 1, oh, ow],
                        DType::F32,
                    ));
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut m = f32::NEG_INFINITY;
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let iy = (oy * 2 + ky) as isize - p as isize;
                                    let ix = (ox * 2 + kx) as isize - p as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let e = v[iy as usize * w + ix as usize];
                                    if !m.is_nan() && (e > m || e.is_nan()) {
                                        m = e;
                                    }
                                }
                            }
                            let got = y[oy * ow + ox];
                            assert!(
                                got.to_bits() == m.to_bits() || (got.is_nan() && m.is_nan()),
                                "w{w} p{p} ceil {ceil}, NaN at ({row},{col}): ({oy},{ox}) got {got}, want {m}"
                            );
                        }
                    }
                }
            }
        }
    }
}
