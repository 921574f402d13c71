//! Convolutions on cuDNN (and the direct kernel, its fallback) and pooling on CUDA, against
//! rlx-cpu: ResNet-50-like conv shapes, grouped/depthwise/dilated/1-D/3-D convs, asymmetric
//! pads, NaN/Inf in the input; MaxPool/AveragePool with NaN, pads, ceil_mode.
//!
//! GPU-only (skipped without a device; `RLX_REQUIRE_CUDA=1` fails instead). Run on the
//! device one test at a time (`--test-threads=1`): some set `RLX_CUDNN`/`RLX_CUDA_TF32`,
//! read at executor creation.
mod common;
use common::*;
use rlx_cuda::{CudaExecutor, Placement};
use rlx_ir::{ConvAttrs, DType, Graph, NodeId, Op, PoolAttrs, PoolKind, Shape, Tensor, TensorData};

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn sh(d: &[usize], t: DType) -> Shape {
    Shape::new(d, t)
}

fn to64(t: &Tensor, abs: bool) -> Tensor {
    let v: Vec<f64> = t
        .data()
        .to_f64_vec()
        .iter()
        .map(|v| if abs { v.abs() } else { *v })
        .collect();
    Tensor::new(t.dims().to_vec(), TensorData::F64(v)).unwrap()
}

/// Normalized error of an f32 conv output `c`: max over finite reference elements of
/// `|c - c64| / (|x| * |w| + |b|)`, both sides computed by rlx-cpu in f64. Any f32
/// summation order of K terms stays within about `K u` of it (the dot-product bound), with
/// or without FMA; TF32 inputs (10-bit mantissas) give far more. Also checks that `c` is
/// NaN exactly where rlx-cpu's f32 output `cpu` is, and infinite (same sign) where it is.
fn conv_error(refs: &(Vec<f64>, Vec<f64>), c: &Tensor, cpu: &Tensor) -> f64 {
    let (exact, mag) = refs;
    let (cv, pv) = (c.data().to_f64_vec(), cpu.data().to_f64_vec());
    assert_eq!(cv.len(), exact.len());
    let mut worst = 0f64;
    for i in 0..cv.len() {
        let (g, p) = (cv[i], pv[i]);
        if p.is_nan() || g.is_nan() {
            assert!(
                p.is_nan() && g.is_nan(),
                "element {i}: cuda {g}, cpu {p} (NaN positions differ)"
            );
            continue;
        }
        if p.is_infinite() || g.is_infinite() {
            assert_eq!(g, p, "element {i}: infinities differ");
            continue;
        }
        if !exact[i].is_finite() || !mag[i].is_finite() {
            continue;
        }
        worst = worst.max((g - exact[i]).abs() / mag[i].max(f64::MIN_POSITIVE));
    }
    worst
}

/// The f64 references of [`conv_error`]: the conv of the inputs and of their magnitudes.
fn conv_refs(a: &ConvAttrs, ins: &[Tensor], od: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let op = Op::Conv(a.clone());
    let s64 = sh(od, DType::F64);
    let e: Vec<Tensor> = ins.iter().map(|t| to64(t, false)).collect();
    let m: Vec<Tensor> = ins.iter().map(|t| to64(t, true)).collect();
    let exact = rlx_cpu::eval_op(&op, &e.iter().collect::<Vec<_>>(), &s64)
        .unwrap()
        .data()
        .to_f64_vec();
    let mag = rlx_cpu::eval_op(&op, &m.iter().collect::<Vec<_>>(), &s64)
        .unwrap()
        .data()
        .to_f64_vec();
    (exact, mag)
}

struct ConvCase {
    x: Vec<usize>,
    w: Vec<usize>,
    groups: usize,
    strides: Vec<usize>,
    pads: Vec<(usize, usize)>,
    dilations: Vec<usize>,
    bias: bool,
    /// Where it runs when cuDNN is available.
    cudnn: Want,
}

/// Where a conv case is expected to run when cuDNN loads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// On cuDNN.
    Cudnn,
    /// On cuDNN, or on the direct kernel because cuDNN offers no deterministic window
    /// algorithm for it (3-D with dilation, 1-D: cuDNN's support varies by version).
    Either,
    /// On the direct kernel (pads cuDNN cannot express).
    Direct,
}

type Pads = &'static [(usize, usize)];

/// (x dims, w dims, groups, strides, pads, dilations, bias, where it runs)
type Row = (
    &'static [usize],
    &'static [usize],
    usize,
    &'static [usize],
    Pads,
    &'static [usize],
    bool,
    Want,
);

fn case(r: Row) -> ConvCase {
    ConvCase {
        x: r.0.to_vec(),
        w: r.1.to_vec(),
        groups: r.2,
        strides: r.3.to_vec(),
        pads: r.4.to_vec(),
        dilations: r.5.to_vec(),
        bias: r.6,
        cudnn: r.7,
    }
}

const P1: Pads = &[(1, 1), (1, 1)];
const P0: Pads = &[(0, 0), (0, 0)];
const S1: &[usize] = &[1, 1];
const S2: &[usize] = &[2, 2];
use Want::{Cudnn, Direct, Either};

#[rustfmt::skip]
const CONV_CASES: &[Row] = &[
    // ResNet-50: stem 7x7 stride 2 pad 3 on 3 channels; bottleneck 1x1, 3x3 pad 1,
    // 3x3 stride 2 (v1.5 downsampling), 1x1 stride 2 projection.
    (&[2, 3, 64, 64], &[64, 3, 7, 7], 1, S2, &[(3, 3), (3, 3)], S1, true, Cudnn),
    (&[2, 64, 28, 28], &[256, 64, 1, 1], 1, S1, P0, S1, false, Cudnn),
    (&[2, 64, 28, 28], &[64, 64, 3, 3], 1, S1, P1, S1, true, Cudnn),
    (&[2, 128, 28, 28], &[128, 128, 3, 3], 1, S2, P1, S1, false, Cudnn),
    (&[2, 256, 14, 14], &[512, 256, 1, 1], 1, S2, P0, S1, true, Cudnn),
    // Depthwise, grouped with stride and dilation, dilated 3x3.
    (&[2, 32, 17, 17], &[32, 1, 3, 3], 32, S1, P1, S1, true, Cudnn),
    (&[2, 16, 15, 13], &[8, 4, 3, 3], 4, &[2, 1], &[(1, 1), (2, 2)], &[1, 2], false, Cudnn),
    (&[1, 8, 20, 20], &[12, 8, 3, 3], 1, S1, &[(2, 2), (2, 2)], &[2, 2], true, Cudnn),
    // 1-D and 3-D (with a dilation).
    (&[2, 5, 31], &[7, 5, 4], 1, &[3], &[(2, 2)], &[1], true, Either),
    (&[1, 2, 6, 7, 8], &[3, 2, 2, 3, 2], 1, &[1, 2, 1], &[(1, 1), (0, 0), (1, 1)], &[2, 1, 1], false, Either),
    // Asymmetric pads: (1, 0) at stride 2 on an even length reads no end padding, so pad 1
    // on both sides gives the same outputs (cuDNN); TF-"SAME"-like (0, 1) and the mixed
    // case below change the output length (direct kernel).
    (&[2, 16, 16, 16], &[16, 16, 3, 3], 1, S2, &[(1, 0), (1, 0)], S1, true, Cudnn),
    (&[2, 16, 16, 16], &[16, 16, 3, 3], 1, S2, &[(0, 1), (0, 1)], S1, true, Direct),
    (&[2, 6, 9, 11], &[4, 3, 3, 3], 2, &[2, 1], &[(1, 0), (2, 1)], &[1, 2], false, Direct),
];

fn conv_cases() -> Vec<ConvCase> {
    CONV_CASES.iter().copied().map(case).collect()
}

/// The conv graph of a case and its inputs (NaN, +inf, -inf planted in x).
fn conv_graph(c: &ConvCase, seed: u64) -> (Graph, NodeId, ConvAttrs, Vec<Tensor>, Vec<usize>) {
    let ns = c.x.len() - 2;
    let mut od = vec![c.x[0], c.w[0]];
    for d in 0..ns {
        let span = c.dilations[d] * (c.w[2 + d] - 1) + 1;
        od.push((c.x[2 + d] + c.pads[d].0 + c.pads[d].1 - span) / c.strides[d] + 1);
    }
    let a = ConvAttrs {
        strides: c.strides.clone(),
        pads: c.pads.clone(),
        dilations: c.dilations.clone(),
        groups: c.groups,
    };
    let mut g = Graph::new("conv");
    let x = g.input("x", sh(&c.x, DType::F32));
    let w = g.input("w", sh(&c.w, DType::F32));
    let mut ids = vec![x, w];
    if c.bias {
        ids.push(g.input("b", sh(&[c.w[0]], DType::F32)));
    }
    let o = g.add_node(Op::Conv(a.clone()), ids, sh(&od, DType::F32));
    g.set_outputs(vec![o]);
    let nx: usize = c.x.iter().product();
    let mut xv = rand_vec(nx, seed, -1.0, 1.0);
    xv[nx / 3] = f32::NAN;
    xv[nx / 2] = f32::INFINITY;
    xv[nx - 1 - nx / 5] = f32::NEG_INFINITY;
    let mut ins = vec![
        Tensor::from_f32(&c.x, xv).unwrap(),
        Tensor::from_f32(&c.w, rand_vec(c.w.iter().product(), seed + 50, -1.0, 1.0)).unwrap(),
    ];
    if c.bias {
        ins.push(Tensor::from_f32(&[c.w[0]], rand_vec(c.w[0], seed + 70, -1.0, 1.0)).unwrap());
    }
    (g, o, a, ins, od)
}

fn all_gpu(ex: &CudaExecutor) {
    for (id, p) in ex.placements() {
        assert_eq!(
            p,
            Placement::Gpu,
            "{id} {} not on CUDA",
            ex.graph().node(id).op.name()
        );
    }
}

/// Run every case with cuDNN on (when it loads) and with `RLX_CUDNN=0` (the direct kernel).
#[test]
fn conv_on_cudnn_and_direct_matches_cpu() {
    if !cuda_available() {
        return;
    }
    let cudnn = rlx_cuda::cudnn_info();
    eprintln!("cuDNN: {cudnn:?}");
    for (ci, c) in conv_cases().iter().enumerate() {
        let (g, o, a, ins, od) = conv_graph(c, ci as u64);
        let want = rlx_cpu::CpuExecutor::new(g.clone())
            .unwrap()
            .run(&ins, None)
            .unwrap();
        let k = (c.x[1] / c.groups) * c.w[2..].iter().product::<usize>() + c.bias as usize;
        let bound = (k as f64).max(2.0) * U;
        let refs = conv_refs(&a, &ins, &od);
        let ecpu = conv_error(&refs, &want[0], &want[0]);
        for direct in [false, true] {
            if direct {
                // SAFETY (edition 2021: set_var is safe): tests run one at a time on the
                // device (--test-threads=1); the variable is read at executor creation.
                std::env::set_var("RLX_CUDNN", "0");
            }
            let ex = CudaExecutor::new(g.clone());
            std::env::remove_var("RLX_CUDNN");
            let mut ex = ex.unwrap();
            all_gpu(&ex);
            let note = ex.kernel_note(o).unwrap_or("").to_string();
            let on_cudnn = note.starts_with("cuDNN");
            if direct {
                assert!(!on_cudnn, "case {ci}: {note}");
            } else if cudnn.is_ok() {
                let ok = match c.cudnn {
                    Want::Cudnn => on_cudnn,
                    Want::Either => on_cudnn || note.contains("no deterministic window algorithm"),
                    Want::Direct => !on_cudnn,
                };
                assert!(ok, "case {ci} (expected {:?}): {note}", c.cudnn);
            } else {
                assert!(!on_cudnn, "case {ci}: {note}");
            }
            let got = ex.run(&ins, None).unwrap();
            let err = conv_error(&refs, &got[0], &want[0]);
            eprintln!(
                "conv case {ci} {:?} * {:?} (groups {}, strides {:?}, pads {:?}, dil {:?}, bias {}): {note}: normalized error {err:.3e} (cpu {ecpu:.3e}, bound K*u {bound:.3e}, K {k})",
                c.x, c.w, c.groups, c.strides, c.pads, c.dilations, c.bias
            );
            assert!(
                err <= bound,
                "case {ci} ({note}): {err:.3e} > K*u {bound:.3e}"
            );
        }
    }
}

/// `RLX_CUDA_TF32=1` lets cuDNN pick tensor-op (TF32) algorithms: larger errors, still
/// sane; the default (checked above against `K u`) does not.
#[test]
fn conv_tf32_switch() {
    if !cuda_available() || rlx_cuda::cudnn_info().is_err() {
        return;
    }
    let c = case((
        &[2, 64, 28, 28],
        &[64, 64, 3, 3],
        1,
        S1,
        P1,
        S1,
        true,
        Cudnn,
    ));
    let (g, o, a, ins, od) = conv_graph(&c, 3);
    let want = rlx_cpu::CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, None)
        .unwrap();
    std::env::set_var("RLX_CUDA_TF32", "1");
    let ex = CudaExecutor::new(g.clone());
    std::env::remove_var("RLX_CUDA_TF32");
    let mut ex = ex.unwrap();
    assert!(ex.tf32());
    let note = ex.kernel_note(o).unwrap_or("").to_string();
    let got = ex.run(&ins, None).unwrap();
    let err = conv_error(&conv_refs(&a, &ins, &od), &got[0], &want[0]);
    eprintln!(
        "conv 3x3 64->64 with RLX_CUDA_TF32=1: {note}: normalized error {err:.3e} (K*u {:.3e})",
        577.0 * U
    );
    assert!(err < 1e-2, "{err:.3e}");
}

/// A ResNet-50 stage-1 chain at batch 32 (3x3 64->64 pad 1, three times, with Relu):
/// cuDNN against im2col + cuBLAS (`RLX_CUDNN=0`) on the same values (within f32 round-off of
/// each other); the time per run is printed for information only (speed is measured by
/// `bench/gpu.sh`, not asserted in tests).
#[test]
fn conv_speed_resnet_layer() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("resnet_chain");
    let xd = [32, 64, 56, 56];
    let mut h = g.input("x", sh(&xd, DType::F32));
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let mut ins = vec![rand_tensor(&xd, 1)];
    for l in 0..3 {
        let w = g.input(&format!("w{l}"), sh(&[64, 64, 3, 3], DType::F32));
        let b = g.input(&format!("b{l}"), sh(&[64], DType::F32));
        let c = g.add_node(Op::Conv(a.clone()), vec![h, w, b], sh(&xd, DType::F32));
        h = g.add_node(
            Op::Activation(rlx_ir::Activation::Relu),
            vec![c],
            sh(&xd, DType::F32),
        );
        ins.push(
            Tensor::from_f32(&[64, 64, 3, 3], rand_vec(64 * 576, 10 + l, -0.06, 0.06)).unwrap(),
        );
        ins.push(Tensor::from_f32(&[64], rand_vec(64, 20 + l, -0.1, 0.1)).unwrap());
    }
    g.set_outputs(vec![h]);
    let mut times = vec![];
    let mut outs = vec![];
    for direct in [false, true] {
        if direct {
            std::env::set_var("RLX_CUDNN", "0");
        }
        let ex = CudaExecutor::new(g.clone());
        std::env::remove_var("RLX_CUDNN");
        let mut ex = ex.unwrap();
        outs.push(ex.run(&ins, None).unwrap().remove(0));
        let t = std::time::Instant::now();
        let reps = 5;
        for _ in 0..reps {
            ex.run(&ins, None).unwrap();
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        eprintln!(
            "3 x conv 3x3 64->64 + relu at [32,64,56,56] ({}): {ms:.2} ms per run (upload 25.7 MB + read back)",
            if direct { "im2col + cuBLAS" } else { "cuDNN if present" }
        );
        times.push(ms);
    }
    let rel = max_rel(&outs[0], &outs[1]).unwrap();
    eprintln!(
        "cuDNN {:.2} ms vs im2col + cuBLAS {:.2} ms per run; max_rel between them {rel:.3e}",
        times[0], times[1]
    );
    // Three 576-term dot products deep, relu between: f32 round-off, far from a wrong kernel.
    assert!(rel < 1e-4, "{rel:.3e}");
}

/// ONNX pooling output length (ceil_mode drops a last window starting past in + pad_begin).
fn pool_len(i: usize, k: usize, s: usize, p: (usize, usize), d: usize, ceil: bool) -> usize {
    let span = d * (k - 1) + 1;
    let num = i + p.0 + p.1 - span;
    let mut o = if ceil { num.div_ceil(s) } else { num / s } + 1;
    if ceil && (o - 1) * s >= i + p.0 {
        o -= 1;
    }
    o
}

#[test]
fn pooling_matches_cpu_with_nan() {
    if !cuda_available() {
        return;
    }
    let max = PoolKind::Max;
    let avg = |c| PoolKind::Avg {
        count_include_pad: c,
    };
    // (input dims, kind, kernel, strides, pads, dilations, ceil_mode)
    type Case = (
        Vec<usize>,
        PoolKind,
        Vec<usize>,
        Vec<usize>,
        Vec<(usize, usize)>,
        Vec<usize>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            vec![4, 64, 56, 56],
            max,
            vec![3, 3],
            vec![2, 2],
            vec![(1, 1); 2],
            vec![1, 1],
            false,
        ),
        (
            vec![2, 3, 9, 11],
            max,
            vec![3, 3],
            vec![2, 2],
            vec![(1, 1); 2],
            vec![1, 1],
            false,
        ),
        (
            vec![1, 2, 7, 8],
            max,
            vec![2, 3],
            vec![2, 2],
            vec![(0, 0), (1, 0)],
            vec![1, 1],
            true,
        ),
        (
            vec![1, 2, 11, 10],
            max,
            vec![3, 2],
            vec![1, 2],
            vec![(2, 1), (0, 2)],
            vec![2, 1],
            false,
        ),
        (
            vec![2, 3, 8, 8],
            avg(true),
            vec![3, 3],
            vec![1, 1],
            vec![(1, 1); 2],
            vec![1, 1],
            false,
        ),
        (
            vec![2, 3, 8, 8],
            avg(false),
            vec![3, 3],
            vec![1, 1],
            vec![(1, 1); 2],
            vec![1, 1],
            false,
        ),
        (
            vec![1, 2, 9, 7],
            avg(true),
            vec![2, 3],
            vec![2, 2],
            vec![(1, 0), (1, 1)],
            vec![1, 1],
            true,
        ),
        (
            vec![1, 2, 9, 7],
            avg(false),
            vec![2, 3],
            vec![2, 2],
            vec![(1, 0), (1, 1)],
            vec![1, 1],
            true,
        ),
        (
            vec![8, 32, 7, 7],
            avg(false),
            vec![7, 7],
            vec![1, 1],
            vec![(0, 0); 2],
            vec![1, 1],
            false,
        ),
        (
            vec![2, 3, 17],
            max,
            vec![4],
            vec![3],
            vec![(2, 1)],
            vec![1],
            false,
        ),
        (
            vec![1, 2, 4, 5, 6],
            max,
            vec![2, 3, 2],
            vec![1, 2, 2],
            vec![(1, 0), (1, 1), (0, 1)],
            vec![1, 1, 2],
            true,
        ),
        (
            vec![1, 2, 4, 5, 6],
            avg(true),
            vec![2, 3, 2],
            vec![2, 1, 2],
            vec![(1, 1), (0, 1), (1, 0)],
            vec![1, 1, 1],
            false,
        ),
    ];
    let mut g = Graph::new("pool");
    let mut ins = vec![];
    let mut outs = vec![];
    let mut kinds = vec![];
    for (ci, (xd, kind, kernel, strides, pads, dilations, ceil_mode)) in
        cases.into_iter().enumerate()
    {
        let ns = xd.len() - 2;
        let mut od = xd[..2].to_vec();
        for d in 0..ns {
            od.push(pool_len(
                xd[2 + d],
                kernel[d],
                strides[d],
                pads[d],
                dilations[d],
                ceil_mode,
            ));
        }
        let x = g.input(&format!("x{ci}"), sh(&xd, DType::F32));
        let a = PoolAttrs {
            kind,
            kernel,
            strides,
            pads,
            dilations,
            ceil_mode,
        };
        outs.push(g.add_node(Op::Pool(a), vec![x], sh(&od, DType::F32)));
        kinds.push(kind);
        let n: usize = xd.iter().product();
        let mut v = rand_vec(n, ci as u64, -3.0, 3.0);
        let sp = [
            f32::NAN,
            f32::from_bits(0x7fc0_1234),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ];
        for (k, i) in (0..n).step_by(29).enumerate() {
            v[(i + ci) % n] = sp[k % sp.len()];
        }
        ins.push(Tensor::from_f32(&xd, v).unwrap());
    }
    g.set_outputs(outs.clone());
    let want = rlx_cpu::CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, None)
        .unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    // 2-D pools run `pool2d_f32`; 1-D and 3-D ones may fall back to the CPU.
    for (id, p) in ex.placements() {
        if g.node(id).shape.dims_usize().len() == 4 {
            assert_eq!(p, Placement::Gpu, "{id} not on CUDA");
        }
    }
    let got = ex.run(&ins, None).unwrap();
    for (k, ((gt, w), kind)) in got.iter().zip(&want).zip(&kinds).enumerate() {
        let (a, b) = (f32s(gt), f32s(w));
        assert_eq!(gt.dims(), w.dims());
        let mut nans = 0;
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            nans += y.is_nan() as usize;
            // Max keeps the CPU's NaN payloads; an average with a NaN tap is NaN with the
            // device's payload.
            let ok = if matches!(kind, PoolKind::Max) || !y.is_nan() {
                x.to_bits() == y.to_bits()
            } else {
                x.is_nan()
            };
            assert!(
                ok,
                "pool {k} {kind:?}: element {i}: cuda {x:?} ({:#x}) cpu {y:?} ({:#x})",
                x.to_bits(),
                y.to_bits()
            );
        }
        eprintln!(
            "pool {k} {kind:?} {:?}: identical to rlx-cpu ({nans} NaN outputs)",
            gt.dims()
        );
    }
}

#[test]
fn lp_pool_falls_back_with_a_reason() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("lp");
    let x = g.input("x", sh(&[1, 2, 6], DType::F32));
    let a = PoolAttrs {
        kind: PoolKind::Lp { p: 2.0 },
        kernel: vec![2],
        strides: vec![1],
        pads: vec![(0, 0)],
        dilations: vec![1],
        ceil_mode: false,
    };
    let o = g.add_node(Op::Pool(a), vec![x], sh(&[1, 2, 5], DType::F32));
    g.set_outputs(vec![o]);
    let ins = [rand_tensor(&[1, 2, 6], 4)];
    let (want, got) = both(&g, &ins);
    assert_close("LpPool (cpu fallback)", &got[0], &want[0], 0.0);
    let ex = CudaExecutor::new(g).unwrap();
    match &ex.placements()[0].1 {
        Placement::CpuFallback { reason } => assert!(reason.contains("LpPool"), "{reason}"),
        p => panic!("{p:?}"),
    }
}

/// A bfloat16 convolution without bias runs on cuDNN's bfloat16 tensor-op kernels (f32
/// accumulation, the output rounded once to bfloat16, as the CPU's bfloat16 path rounds its
/// f32 result once): every output is a bfloat16 value, within one bfloat16 unit of the CPU's
/// (the f32 sums' order differs, which can move a rounding by one unit), NaN/±inf at the CPU's
/// positions; with a bias, or `RLX_CUDNN_BF16=0`, it stays on the f32-word path.
#[test]
fn bf16_conv_on_tensor_cores() {
    if !cuda_available() || rlx_cuda::cudnn_info().is_err() {
        return;
    }
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let (xd, wd, od) = (
        [2usize, 16, 14, 14],
        [32usize, 16, 3, 3],
        [2usize, 32, 14, 14],
    );
    let bf = DType::BF16;
    let mut g = Graph::new("conv_bf16");
    let x = g.input("x", sh(&xd, bf));
    let w = g.input("w", sh(&wd, bf));
    let o = g.add_node(Op::Conv(a.clone()), vec![x, w], sh(&od, bf));
    g.set_outputs(vec![o]);
    let nx: usize = xd.iter().product();
    let mut xv = rand_vec(nx, 31, -2.0, 2.0);
    xv[nx / 3] = f32::NAN;
    xv[nx / 2] = f32::INFINITY;
    let to_bf = |v: Vec<f32>, d: &[usize]| {
        Tensor::new(
            d.to_vec(),
            TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        )
        .unwrap()
    };
    let ins = vec![
        to_bf(xv, &xd),
        to_bf(rand_vec(wd.iter().product(), 32, -0.5, 0.5), &wd),
    ];
    let want = rlx_cpu::CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, None)
        .unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    let note = ex.kernel_note(o).unwrap_or("").to_string();
    assert!(note.contains("bfloat16 tensor-op"), "{note}");
    let got = ex.run(&ins, None).unwrap();
    let (gv, wv) = (got[0].data().to_f32_vec(), want[0].data().to_f32_vec());
    let scale = wv
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    let mut nan = 0;
    for (i, (&c, &r)) in gv.iter().zip(&wv).enumerate() {
        assert_eq!(
            c.to_bits() & 0xffff,
            0,
            "element {i}: {c} is not a bfloat16 value"
        );
        if r.is_nan() || r.is_infinite() {
            nan += 1;
            assert!(
                (r.is_nan() && c.is_nan()) || c == r,
                "element {i}: cuda {c} cpu {r}"
            );
            continue;
        }
        let tol = r.abs() * 2f32.powi(-7) + scale * 1e-3;
        assert!(
            (c - r).abs() <= tol,
            "element {i}: cuda {c} cpu {r} (tol {tol})"
        );
    }
    assert!(nan > 0, "the NaN/inf inputs reach outputs");
    eprintln!("bf16 conv on cuDNN ({note}): {nan} non-finite outputs at the CPU's positions");
    // RLX_CUDNN_BF16=0: the f32-word path, same values within the same bound.
    std::env::set_var("RLX_CUDNN_BF16", "0");
    let ex2 = CudaExecutor::new(g.clone());
    std::env::remove_var("RLX_CUDNN_BF16");
    let ex2 = ex2.unwrap();
    let note2 = ex2.kernel_note(o).unwrap_or("").to_string();
    assert!(!note2.contains("bfloat16"), "{note2}");
}
