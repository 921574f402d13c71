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
    conv_batchnorm_relu_fused();
}
