//! Per-kernel tests: each WGSL kernel against rlx-cpu's kernel on random data, odd sizes
//! included (partial tiles, broadcasting, strided views).

mod common;
use common::*;
use rlx_ir::*;

fn conv_case(
    x: &[usize],
    w: &[usize],
    strides: &[usize],
    pads: &[(usize, usize)],
    dil: &[usize],
    groups: usize,
    bias: bool,
) {
    let nsp = x.len() - 2;
    let mut od = vec![x[0], w[0]];
    for i in 0..nsp {
        let k = dil[i] * (w[2 + i] - 1) + 1;
        od.push((x[2 + i] + pads[i].0 + pads[i].1 - k) / strides[i] + 1);
    }
    let mut g = Graph::new("conv");
    let xi = g.input("x", Shape::new(x, DType::F32));
    let wi = g.input("w", Shape::new(w, DType::F32));
    let mut ins = vec![xi, wi];
    let mut feeds = vec![rand_tensor(x, 11), rand_tensor(w, 12)];
    if bias {
        ins.push(g.input("b", Shape::new(&[w[0]], DType::F32)));
        feeds.push(rand_tensor(&[w[0]], 13));
    }
    let attrs = ConvAttrs {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        groups,
    };
    let y = g.add_node(Op::Conv(attrs), ins, Shape::new(&od, DType::F32));
    g.set_outputs(vec![y]);
    let (want, got) = both(&g, &feeds);
    let what = format!("conv x{x:?} w{w:?} s{strides:?} p{pads:?} g{groups}");
    eprintln!("{what}: {:e}", max_rel(&what, &got[0], &want[0]));
    assert_close(&what, &got[0], &want[0], 1e-4);
}

#[test]
fn conv_variants() {
    if !gpu_available() {
        return;
    }
    // The 128x128-tile implicit GEMM (>= 128 output channels and positions), with bias.
    conv_case(
        &[2, 5, 13, 13],
        &[130, 5, 3, 3],
        &[1, 1],
        &[(1, 1), (1, 1)],
        &[1, 1],
        1,
        true,
    );
    // tiled (>= 16 output channels per group) and direct paths, odd sizes, pads, strides.
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[1, 1],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(1, 1), (1, 1)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 16, 16],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        true,
    );
    conv_case(
        &[1, 3, 224, 224],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        true,
    );
    conv_case(
        &[2, 5, 9, 11],
        &[20, 5, 3, 2],
        &[1, 2],
        &[(1, 0), (2, 1)],
        &[1, 2],
        1,
        false,
    );
    conv_case(
        &[1, 8, 7, 7],
        &[8, 1, 3, 3],
        &[1, 1],
        &[(1, 1), (1, 1)],
        &[1, 1],
        8,
        true,
    );
    conv_case(&[2, 6, 10], &[4, 3, 3], &[1], &[(1, 1)], &[1], 2, true);
    conv_case(
        &[1, 32, 9, 9],
        &[64, 16, 1, 1],
        &[1, 1],
        &[(0, 0), (0, 0)],
        &[1, 1],
        2,
        true,
    );
}

fn unary_graph(op: Op, dims: &[usize], out: DType) -> Graph {
    let mut g = Graph::new("u");
    let x = g.input("x", Shape::new(dims, DType::F32));
    let y = g.add_node(op, vec![x], Shape::new(dims, out));
    g.set_outputs(vec![y]);
    g
}

/// NaN, ±inf, ±0 and ordinary values, the special values scattered among finite ones.
fn specials() -> Vec<f32> {
    vec![
        f32::NAN,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        3.5,
        -2.25,
        f32::NAN,
        100.0,
        -100.0,
    ]
}

#[test]
fn nan_inf_propagation_matches_cpu() {
    if !gpu_available() {
        return;
    }
    let v = specials();
    let n = v.len();
    let x = Tensor::from_f32(&[n], v.clone()).unwrap();
    // Activations and unaries, including the NaN-propagating Relu / HardSigmoid / Sign.
    let mut ops: Vec<Op> = [
        Activation::Relu,
        Activation::LeakyRelu { alpha: 0.1 },
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Silu,
        Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Activation::Softplus,
    ]
    .into_iter()
    .map(Op::Activation)
    .collect();
    ops.extend(
        [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Sign,
            UnaryOp::Floor,
        ]
        .map(Op::Unary),
    );
    for op in ops {
        let g = unary_graph(op.clone(), &[n], DType::F32);
        let (want, got) = both(&g, std::slice::from_ref(&x));
        // max_rel panics unless NaN ↔ NaN and ±inf ↔ same inf, element by element.
        let r = max_rel(&format!("{op:?}"), &got[0], &want[0]);
        assert!(r < 1e-5, "{op:?}: {r:e}");
    }
    // Predicates: IsNaN / IsInf must see the bits.
    for op in [
        UnaryOp::IsNaN,
        UnaryOp::IsInf {
            pos: true,
            neg: true,
        },
        UnaryOp::IsInf {
            pos: false,
            neg: true,
        },
    ] {
        let g = unary_graph(Op::Unary(op), &[n], DType::Bool);
        let (want, got) = both(&g, std::slice::from_ref(&x));
        assert_eq!(got[0].data(), want[0].data(), "{op:?}");
    }
    // Relu keeps NaN (a max(x, 0) kernel would give 0): the ONNX/NumPy semantics.
    let g = unary_graph(Op::Activation(Activation::Relu), &[n], DType::F32);
    let (_, got) = both(&g, std::slice::from_ref(&x));
    assert!(f32s(&got[0])[0].is_nan() && f32s(&got[0])[9].is_nan());
}

#[test]
fn binary_nan_semantics_match_cpu() {
    if !gpu_available() {
        return;
    }
    let v = specials();
    let n = v.len();
    // Every pair (a, b) of special values.
    let a: Vec<f32> = (0..n * n).map(|i| v[i / n]).collect();
    let b: Vec<f32> = (0..n * n).map(|i| v[i % n]).collect();
    let ta = Tensor::from_f32(&[n * n], a).unwrap();
    let tb = Tensor::from_f32(&[n * n], b).unwrap();
    for op in [
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Add,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Sub,
        BinaryOp::Pow,
    ] {
        let mut g = Graph::new("b");
        let x = g.input("a", Shape::new(&[n * n], DType::F32));
        let y = g.input("b", Shape::new(&[n * n], DType::F32));
        let z = g.binary(op, x, y, Shape::new(&[n * n], DType::F32));
        g.set_outputs(vec![z]);
        let (want, got) = both(&g, &[ta.clone(), tb.clone()]);
        let r = max_rel(&format!("{op:?}"), &got[0], &want[0]);
        assert!(r < 1e-5, "{op:?}: {r:e}");
    }
    for op in [
        BinaryOp::Eq,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ] {
        let mut g = Graph::new("c");
        let x = g.input("a", Shape::new(&[n * n], DType::F32));
        let y = g.input("b", Shape::new(&[n * n], DType::F32));
        let z = g.binary(op, x, y, Shape::new(&[n * n], DType::Bool));
        g.set_outputs(vec![z]);
        let (want, got) = both(&g, &[ta.clone(), tb.clone()]);
        assert_eq!(got[0].data(), want[0].data(), "{op:?}");
    }
}

#[test]
fn reductions_argmax_pool_propagate_nan() {
    if !gpu_available() {
        return;
    }
    // Rows: clean, NaN in the middle, +inf, -inf only, NaN first; 70 wide (tree path) and 5 wide (serial).
    for width in [5usize, 70] {
        let mut v = rand_vec(5 * width, 3, -1.0, 1.0);
        v[width + width / 2] = f32::NAN;
        v[2 * width + 1] = f32::INFINITY;
        for k in 0..width {
            v[3 * width + k] = f32::NEG_INFINITY;
        }
        v[4 * width] = f32::NAN;
        let x = Tensor::from_f32(&[5, width], v).unwrap();
        for kind in [
            ReduceKind::Max,
            ReduceKind::Min,
            ReduceKind::Sum,
            ReduceKind::Mean,
        ] {
            let mut g = Graph::new("r");
            let i = g.input("x", Shape::new(&[5, width], DType::F32));
            let r = g.add_node(
                Op::Reduce {
                    kind,
                    axes: vec![1],
                    keepdims: false,
                },
                vec![i],
                Shape::new(&[5], DType::F32),
            );
            g.set_outputs(vec![r]);
            let (want, got) = both(&g, std::slice::from_ref(&x));
            let e = max_rel(&format!("{kind:?} width {width}"), &got[0], &want[0]);
            assert!(e < 1e-5, "{kind:?}: {e:e}");
        }
        for (max, last) in [(true, false), (false, false), (true, true)] {
            let mut g = Graph::new("a");
            let i = g.input("x", Shape::new(&[5, width], DType::F32));
            let r = g.add_node(
                Op::ArgReduce {
                    max,
                    axis: 1,
                    keepdims: false,
                    select_last_index: last,
                },
                vec![i],
                Shape::new(&[5], DType::I64),
            );
            g.set_outputs(vec![r]);
            let (want, got) = both(&g, std::slice::from_ref(&x));
            assert_eq!(
                got[0].data(),
                want[0].data(),
                "argreduce max={max} last={last}"
            );
        }
    }
    // Max pooling keeps a NaN inside its window; avg with and without count_include_pad.
    let mut v = rand_vec(2 * 3 * 9 * 7, 5, -1.0, 1.0);
    v[10] = f32::NAN;
    v[70] = f32::INFINITY;
    let x = Tensor::from_f32(&[2, 3, 9, 7], v).unwrap();
    for kind in [
        PoolKind::Max,
        PoolKind::Avg {
            count_include_pad: false,
        },
        PoolKind::Avg {
            count_include_pad: true,
        },
    ] {
        for ceil_mode in [false, true] {
            let a = PoolAttrs {
                kind,
                kernel: vec![3, 2],
                strides: vec![2, 2],
                pads: vec![(1, 1), (0, 1)],
                dilations: vec![1, 1],
                ceil_mode,
            };
            let od = |i: usize, k: usize, s: usize, p: usize| {
                let span = i + p - k;
                if ceil_mode {
                    span.div_ceil(s) + 1
                } else {
                    span / s + 1
                }
            };
            let (oh, ow) = (od(9, 3, 2, 2), od(7, 2, 2, 1));
            let mut g = Graph::new("p");
            let i = g.input("x", Shape::new(&[2, 3, 9, 7], DType::F32));
            let r = g.add_node(
                Op::Pool(a),
                vec![i],
                Shape::new(&[2, 3, oh, ow], DType::F32),
            );
            g.set_outputs(vec![r]);
            let (want, got) = both(&g, std::slice::from_ref(&x));
            let e = max_rel(&format!("{kind:?} ceil {ceil_mode}"), &got[0], &want[0]);
            assert!(e < 1e-5, "{kind:?}: {e:e}");
        }
    }
}

#[test]
fn shape_ops_and_broadcasting() {
    if !gpu_available() {
        return;
    }
    let x = rand_tensor(&[2, 3, 5], 21);
    let cases: Vec<(Op, Vec<usize>)> = vec![
        (
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            vec![5, 2, 3],
        ),
        (
            Op::Broadcast {
                dims: vec![4, 2, 3, 5],
            },
            vec![4, 2, 3, 5],
        ),
        (
            Op::Slice {
                starts: vec![1, 2, 4],
                steps: vec![1, -1, -2],
                sizes: vec![1, 3, 3],
            },
            vec![1, 3, 3],
        ),
        (
            Op::Tile {
                repeats: vec![2, 1, 3],
            },
            vec![4, 3, 15],
        ),
        (
            Op::Pad {
                pads: vec![(1, 0), (0, 2), (3, 1)],
                mode: PadMode::Constant(-7.0),
            },
            vec![3, 5, 9],
        ),
        (
            Op::Pad {
                pads: vec![(0, 0), (2, 2), (3, 1)],
                mode: PadMode::Reflect,
            },
            vec![2, 7, 9],
        ),
        (
            Op::Pad {
                pads: vec![(1, 1), (1, 0), (2, 2)],
                mode: PadMode::Edge,
            },
            vec![4, 4, 9],
        ),
        (
            Op::Pad {
                pads: vec![(0, 1), (1, 0), (2, 6)],
                mode: PadMode::Wrap,
            },
            vec![3, 4, 13],
        ),
        (Op::Reshape { dims: vec![6, 5] }, vec![6, 5]),
        (
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![0, 2],
                keepdims: true,
            },
            vec![1, 3, 1],
        ),
        (
            Op::Reduce {
                kind: ReduceKind::Prod,
                axes: vec![1],
                keepdims: false,
            },
            vec![2, 5],
        ),
    ];
    for (op, od) in cases {
        let mut g = Graph::new("s");
        let i = g.input("x", Shape::new(&[2, 3, 5], DType::F32));
        let y = g.add_node(op.clone(), vec![i], Shape::new(&od, DType::F32));
        let z = g.activation(Activation::Relu, y, Shape::new(&od, DType::F32));
        g.set_outputs(vec![y, z]);
        let (want, got) = both(&g, std::slice::from_ref(&x));
        assert_close(&format!("{op:?}"), &got[0], &want[0], 1e-5);
        assert_close(&format!("{op:?} relu"), &got[1], &want[1], 1e-5);
    }
    // Concat of three parts along the middle axis; Gather with negative indices; Select
    // with a broadcast condition; binary broadcasting [2,1,5] x [3,1].
    let mut g = Graph::new("m");
    let a = g.input("a", Shape::new(&[2, 3, 5], DType::F32));
    let b = g.input("b", Shape::new(&[2, 1, 5], DType::F32));
    let c = g.input("c", Shape::new(&[3, 1], DType::F32));
    let idx = g.input("i", Shape::new(&[4], DType::I64));
    let cat = g.add_node(
        Op::Concat { axis: 1 },
        vec![a, b, a],
        Shape::new(&[2, 7, 5], DType::F32),
    );
    let ga = g.add_node(
        Op::Gather { axis: 1 },
        vec![cat, idx],
        Shape::new(&[2, 4, 5], DType::F32),
    );
    let bc = g.binary(BinaryOp::Mul, b, c, Shape::new(&[2, 3, 5], DType::F32));
    let gt = g.binary(BinaryOp::Gt, bc, a, Shape::new(&[2, 3, 5], DType::Bool));
    let sel = g.add_node(
        Op::Select,
        vec![gt, bc, a],
        Shape::new(&[2, 3, 5], DType::F32),
    );
    g.set_outputs(vec![cat, ga, bc, gt, sel]);
    let feeds = [
        x.clone(),
        rand_tensor(&[2, 1, 5], 22),
        rand_tensor(&[3, 1], 23),
        Tensor::from_i64(&[4], vec![0, -1, 3, -7]).unwrap(),
    ];
    let (want, got) = both(&g, &feeds);
    for k in 0..want.len() {
        if want[k].dtype() == DType::Bool {
            assert_eq!(got[k].data(), want[k].data(), "output {k}");
        } else {
            assert_close(&format!("output {k}"), &got[k], &want[k], 1e-5);
        }
    }
}

#[test]
fn matmul_odd_sizes_and_batch_broadcast() {
    if !gpu_available() {
        return;
    }
    for (a, b, o) in [
        (vec![1usize, 1], vec![1usize, 1], vec![1usize, 1]),
        (vec![33, 17], vec![17, 65], vec![33, 65]),
        (vec![2, 1, 7, 40], vec![3, 40, 9], vec![2, 3, 7, 9]),
        (vec![40], vec![40, 3], vec![3]),
        (vec![4, 5, 40], vec![40], vec![4, 5]),
        // the 64x64-tile kernel (>= 64 rows and columns): partial tiles, batch broadcast
        (vec![2, 130, 70], vec![70, 97], vec![2, 130, 97]),
        (vec![64, 16], vec![16, 64], vec![64, 64]),
        // the 128x128-tile kernel (>= 128 rows and columns): partial tiles, K not a multiple
        // of 16, batch broadcast
        (vec![130, 70], vec![70, 200], vec![130, 200]),
        (vec![2, 1, 128, 33], vec![3, 33, 128], vec![2, 3, 128, 128]),
    ] {
        let mut g = Graph::new("mm");
        let x = g.input("a", Shape::new(&a, DType::F32));
        let y = g.input("b", Shape::new(&b, DType::F32));
        let z = g.matmul(x, y, Shape::new(&o, DType::F32));
        g.set_outputs(vec![z]);
        let (want, got) = both(&g, &[rand_tensor(&a, 31), rand_tensor(&b, 32)]);
        assert_close(&format!("matmul {a:?} x {b:?}"), &got[0], &want[0], 1e-4);
    }
}

#[test]
fn unsupported_dtypes_fall_back_to_cpu() {
    if !gpu_available() {
        return;
    }
    // i64 arithmetic and a CumSum have no WGSL kernel: they run on the CPU per node, with
    // the GPU values read back and the results uploaded again for the Relu after them.
    let mut g = Graph::new("fb");
    let x = g.input("x", Shape::new(&[3, 4], DType::F32));
    let n = g.input("n", Shape::new(&[3, 4], DType::I64));
    let e = g.unary(UnaryOp::Exp, x, Shape::new(&[3, 4], DType::F32));
    let cs = g.add_node(
        Op::CumSum {
            axis: 1,
            exclusive: false,
            reverse: false,
        },
        vec![e],
        Shape::new(&[3, 4], DType::F32),
    );
    let n2 = g.binary(BinaryOp::Add, n, n, Shape::new(&[3, 4], DType::I64));
    let nf = g.add_node(
        Op::Cast {
            to: DType::F32,
            saturate: true,
        },
        vec![n2],
        Shape::new(&[3, 4], DType::F32),
    );
    let s = g.add(cs, nf, Shape::new(&[3, 4], DType::F32));
    let r = g.activation(Activation::Relu, s, Shape::new(&[3, 4], DType::F32));
    g.set_outputs(vec![r, n2]);
    let feeds = [
        rand_tensor(&[3, 4], 41),
        Tensor::from_i64(&[3, 4], (0..12).map(|i| i - 6).collect()).unwrap(),
    ];
    let (want, got) = both(&g, &feeds);
    assert_close("fallback", &got[0], &want[0], 1e-5);
    assert_eq!(got[1].data(), want[1].data());
    let w = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    let cpu: Vec<_> = w
        .placements()
        .into_iter()
        .filter(|(_, p)| matches!(p, rlx_wgpu::Placement::CpuFallback { .. }))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(cpu, vec![cs, n2, nf]);
}

/// Tanh, Sinh, Asinh, Atanh, Softplus and the tanh-form Gelu near 0 and in Softplus's far
/// negative tail, against f64 math (the WGSL built-ins lost the low bits there: tanh(3e-5)
/// came out 3.004e-5, asinh(6e-8) 1.19e-7, softplus(-25) 0). Within 4 f32 ulps of the f64
/// value (Softplus: plus exp's own 2|x| ulps).
#[test]
fn small_arguments_keep_full_precision() {
    if !gpu_available() {
        return;
    }
    let v: Vec<f32> = vec![
        6e-8, -6e-8, 3e-5, -3e-5, 1e-3, 0.05, -0.1, 0.29, 0.299, 0.301, -0.31, 0.5, -2.0, 3.0,
        1e-20, -17.0, -25.0, -60.0, -1.5, -3.5, -5.0, -8.0,
    ];
    let n = v.len();
    let x = Tensor::from_f32(&[n], v.clone()).unwrap();
    type Reference = (Op, fn(f64) -> f64);
    let f64s: [Reference; 7] = [
        (Op::Activation(Activation::Gelu), |x: f64| {
            0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
        }),
        (Op::Activation(Activation::Tanh), f64::tanh),
        (Op::Unary(UnaryOp::Sinh), f64::sinh),
        (Op::Unary(UnaryOp::Asinh), f64::asinh),
        (Op::Activation(Activation::Softplus), |x: f64| {
            x.exp().ln_1p()
        }),
        (Op::Activation(Activation::GeluTanh), |x: f64| {
            x / (1.0 + (-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)).exp())
        }),
        (Op::Unary(UnaryOp::Atanh), f64::atanh),
    ];
    for (op, f) in f64s {
        let g = unary_graph(op.clone(), &[n], DType::F32);
        let mut w = rlx_wgpu::WgpuExecutor::new(g).unwrap();
        let got = w.run(std::slice::from_ref(&x), None).unwrap()[0]
            .data()
            .to_f32_vec();
        for (k, &xi) in v.iter().enumerate() {
            if matches!(op, Op::Unary(UnaryOp::Atanh)) && xi.abs() >= 1.0 {
                continue;
            }
            if matches!(op, Op::Unary(UnaryOp::Sinh)) && xi.abs() > 10.0 {
                continue;
            }
            let want = f(xi as f64);
            let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE) as f64 * f32::EPSILON as f64;
            let d = (got[k] as f64 - want).abs();
            // WGSL's exp is accurate to 3 + 2|x| ulps (its spec): Softplus's tail carries that.
            let tol = match op {
                Op::Activation(Activation::Softplus) => 4.0 + 2.0 * xi.abs() as f64,
                // erfc_pos: 1.2e-7 fractional (2 ulps) plus exp's 3 + 2|arg| ulps, arg = x^2/2
                Op::Activation(Activation::Gelu) => 8.0 + (xi as f64).powi(2),
                // sigmoid(2u) through exp(-|2u|): exp's 3 + 2|2u| ulps
                Op::Activation(Activation::GeluTanh) => {
                    let x = xi.abs() as f64;
                    4.0 + 2.0 * 1.5957691216057308 * (x + 0.044715 * x * x * x)
                }
                _ => 4.0,
            };
            assert!(
                d <= tol * ulp,
                "{op:?}({xi:e}): {:e} vs {want:e} ({:.1} ulps)",
                got[k],
                d / ulp
            );
        }
    }
    assert_no_uncaptured();
}
