//! Conv epilogue fusion on wgpu (a Conv, its decomposed BatchNormalization and Relu as one
//! conv in runs that read back only the outputs). Its own test binary: it sets
//! `RLX_WGPU_FUSE`, which is process-wide.

mod common;
use common::*;
use rlx_ir::*;

/// Conv + BatchNorm (decomposed: Sub, Div, Mul, Add per channel) + Relu runs as one fused conv
/// in plain runs (folded weights, Relu in the store): values match the CPU (which fuses the
/// same way) within round-off, NaN in the input comes out NaN at exactly the CPU's positions
/// (the Relu keeps NaN), and `RLX_WGPU_FUSE=0` / a full read-back run the chain unfused.
fn conv_batchnorm_relu_fused() {
    let (x, w) = ([2usize, 8, 10, 10], [96usize, 8, 3, 3]);
    let od = [2usize, 96, 10, 10];
    let mut g = Graph::new("cbr");
    let xi = g.input("x", Shape::new(&x, DType::F32));
    let wc = g.constant(rand_tensor(&w, 12));
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let y = g.add_node(Op::Conv(attrs), vec![xi, wc], Shape::new(&od, DType::F32));
    let mut cur = y;
    for (k, op) in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Mul, BinaryOp::Add]
        .into_iter()
        .enumerate()
    {
        let mut v = rand_vec(96, 40 + k as u64, 0.5, 1.5);
        if op == BinaryOp::Sub {
            v.iter_mut().for_each(|x| *x -= 1.0);
        }
        let c = g.constant(Tensor::from_f32(&[96, 1, 1], v).unwrap());
        cur = g.binary(op, cur, c, Shape::new(&od, DType::F32));
    }
    let r = g.activation(Activation::Relu, cur, Shape::new(&od, DType::F32));
    g.set_outputs(vec![r]);
    let mut xv = rand_vec(x.iter().product(), 11, -2.0, 2.0);
    xv[3 * 100 + 45] = f32::NAN;
    let feeds = [Tensor::from_f32(&x, xv).unwrap()];
    let (want, got) = both(&g, &feeds);
    assert_close("conv+bn+relu fused", &got[0], &want[0], 1e-4);
    let mut ex = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    assert_eq!(ex.fused_convs(), 1, "the conv runs fused");
    let all = ex.run_all(&feeds).unwrap();
    assert_close(
        "unfused (run_all)",
        all[r.index()].as_ref().unwrap(),
        &want[0],
        1e-4,
    );
    std::env::set_var("RLX_WGPU_FUSE", "0");
    let ex0 = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    std::env::remove_var("RLX_WGPU_FUSE");
    assert_eq!(ex0.fused_convs(), 0);
    assert_no_uncaptured();
}

/// A ResNet block's end: Conv + BatchNorm, then `Add(y, skip)` with a value computed before
/// the conv, then Relu, all in the fused conv's store (skip bound as a fourth input): values
/// match the CPU, NaN in the skip value comes out NaN where the CPU has it.
fn conv_batchnorm_residual_relu_fused() {
    let (x, w) = ([2usize, 8, 9, 9], [70usize, 8, 1, 1]);
    let od = [2usize, 70, 9, 9];
    let mut g = Graph::new("res");
    let xi = g.input("x", Shape::new(&x, DType::F32));
    let si = g.input("s", Shape::new(&od, DType::F32));
    let skip = g.unary(UnaryOp::Neg, si, Shape::new(&od, DType::F32));
    let wc = g.constant(rand_tensor(&w, 12));
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let y = g.add_node(Op::Conv(attrs), vec![xi, wc], Shape::new(&od, DType::F32));
    let sc = g.constant(Tensor::from_f32(&[70, 1, 1], rand_vec(70, 5, 0.5, 1.5)).unwrap());
    let bc = g.constant(Tensor::from_f32(&[70, 1, 1], rand_vec(70, 6, -1.0, 1.0)).unwrap());
    let m = g.binary(BinaryOp::Mul, y, sc, Shape::new(&od, DType::F32));
    let a = g.binary(BinaryOp::Add, m, bc, Shape::new(&od, DType::F32));
    let r = g.binary(BinaryOp::Add, a, skip, Shape::new(&od, DType::F32));
    let o = g.activation(Activation::Relu, r, Shape::new(&od, DType::F32));
    g.set_outputs(vec![o]);
    let mut sv = rand_vec(od.iter().product(), 21, -2.0, 2.0);
    sv[81 * 5 + 7] = f32::NAN;
    let feeds = [rand_tensor(&x, 11), Tensor::from_f32(&od, sv).unwrap()];
    let (want, got) = both(&g, &feeds);
    assert_close("conv+bn+add+relu fused", &got[0], &want[0], 1e-4);
    let ex = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    assert_eq!(ex.fused_convs(), 1, "the conv runs fused");
    assert_no_uncaptured();
}

/// One test function: the first case sets `RLX_WGPU_FUSE`, which is process-wide.
#[test]
fn fused_conv_epilogues_match_the_cpu() {
    if !gpu_available() {
        return;
    }
    conv_batchnorm_residual_relu_fused();
    elementwise_chains();
    conv_batchnorm_relu_fused();
}

/// A LayerNorm's tail and a GELU as fused elementwise chains: `(x - mean) / std * gamma +
/// beta` with mean/std broadcast per row and gamma/beta per column, then Gelu, then a tree
/// joining two chains (`a * b` of two unary chains). Values match the CPU; NaN in one input
/// row comes out NaN in exactly the CPU's positions; the chains are counted.
fn elementwise_chains() {
    let (r, c) = (37usize, 96usize);
    let mut g = Graph::new("chain");
    let x = g.input("x", Shape::new(&[r, c], DType::F32));
    let mean = g.input("mean", Shape::new(&[r, 1], DType::F32));
    let std = g.input("std", Shape::new(&[r, 1], DType::F32));
    let gamma = g.input("gamma", Shape::new(&[c], DType::F32));
    let beta = g.input("beta", Shape::new(&[c], DType::F32));
    let sh = Shape::new(&[r, c], DType::F32);
    let d = g.binary(BinaryOp::Sub, x, mean, sh.clone());
    let n = g.binary(BinaryOp::Div, d, std, sh.clone());
    let m = g.binary(BinaryOp::Mul, n, gamma, sh.clone());
    let a = g.binary(BinaryOp::Add, m, beta, sh.clone());
    let ge = g.activation(Activation::Gelu, a, sh.clone());
    // a tree: exp(x) and tanh(x) chains joined by a Mul
    let e = g.unary(UnaryOp::Exp, x, sh.clone());
    let e2 = g.unary(UnaryOp::Neg, e, sh.clone());
    let t = g.activation(Activation::Tanh, ge, sh.clone());
    let j = g.binary(BinaryOp::Mul, e2, t, sh.clone());
    g.set_outputs(vec![j]);
    let mut xv = rand_vec(r * c, 1, -2.0, 2.0);
    xv[5 * c + 3] = f32::NAN;
    let feeds = [
        Tensor::from_f32(&[r, c], xv).unwrap(),
        rand_tensor(&[r, 1], 2),
        Tensor::from_f32(&[r, 1], rand_vec(r, 3, 0.5, 2.0)).unwrap(),
        rand_tensor(&[c], 4),
        rand_tensor(&[c], 5),
    ];
    let (want, got) = both(&g, &feeds);
    assert_close("fused elementwise chains", &got[0], &want[0], 1e-5);
    let ex = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    assert!(
        ex.fused_chains() >= 1,
        "chains fused: {}",
        ex.fused_chains()
    );
    assert_no_uncaptured();
}
