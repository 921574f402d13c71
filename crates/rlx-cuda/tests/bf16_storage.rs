//! bfloat16 storage on the device (two bytes per value; kernels load 16 bits, compute in
//! f32, store rounded to nearest even): every kind of step against an independent reference
//! (f32 arithmetic rounded once by `half::bf16::from_f32`, f64 products) or the CPU's
//! bfloat16 path, the device buffers' sizes, and the NaN/Inf scan over 16-bit buffers
//! against the CPU's scanner (counts, first indices, culprits). Skipped without a GPU
//! (`RLX_REQUIRE_CUDA=1`: fails instead). Some cases set `RLX_CUDA_FUSE`: run with
//! `--test-threads=1`.

mod common;

use common::*;
use half::bf16;
use rlx_cpu::CpuExecutor;
use rlx_cuda::{CudaExecutor, Placement};
use rlx_ir::numeric_check::{DebugMode, DebugScanner, NanReport};
use rlx_ir::{
    Activation, BinaryOp, ConvAttrs, DType, Graph, NodeId, Op, PoolAttrs, PoolKind, ReduceKind,
    Shape, Tensor, TensorData, UnaryOp,
};

const BF: DType = DType::BF16;

fn sh(d: &[usize], dt: DType) -> Shape {
    Shape::new(d, dt)
}

fn bft(d: &[usize], v: &[f32]) -> Tensor {
    Tensor::new(
        d.to_vec(),
        TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
    )
    .unwrap()
}

/// f32 → bfloat16 → f32 (round to nearest even, NaN kept): the reference rounding.
fn rb(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn all_gpu(ex: &CudaExecutor) {
    for (id, p) in ex.placements() {
        assert_eq!(p, Placement::Gpu, "{id}: {p:?}");
    }
}

/// Every bfloat16 value on the device takes 2 bytes (4-byte words), every f32 value 4.
fn check_storage(g: &Graph, ex: &CudaExecutor) {
    let mut seen = 0;
    for node in &g.nodes {
        let Some(bytes) = ex.value_bytes(node.id) else {
            continue;
        };
        let n = node.shape.numel();
        let want = match node.shape.dtype {
            DType::BF16 => 4 * n.div_ceil(2).max(1),
            DType::F32 | DType::Bool | DType::I32 => 4 * n.max(1),
            DType::I64 => 8 * n.max(1),
            _ => continue,
        };
        if matches!(node.op, Op::Reshape { .. }) {
            continue;
        }
        assert_eq!(
            bytes,
            want,
            "{} {} {}: {bytes} bytes on the device",
            node.id,
            node.op.name(),
            node.shape
        );
        seen += (node.shape.dtype == BF) as usize;
    }
    assert!(seen > 0, "no bfloat16 buffer checked");
}

/// Element-wise comparison: NaN where the reference has NaN, infinities equal, and finite
/// values bit-equal (`tol == 0`) or within `tol * |want| + floor`.
fn close(what: &str, got: &[f32], want: &[f32], tol: f32, floor: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&c, &r)) in got.iter().zip(want).enumerate() {
        if r.is_nan() || c.is_nan() {
            assert!(
                r.is_nan() && c.is_nan(),
                "{what} [{i}]: cuda {c}, reference {r}"
            );
            continue;
        }
        if tol == 0.0 || r.is_infinite() || c.is_infinite() {
            assert_eq!(
                c.to_bits(),
                r.to_bits(),
                "{what} [{i}]: cuda {c}, reference {r}"
            );
            continue;
        }
        assert!(
            (c - r).abs() <= tol * r.abs() + floor,
            "{what} [{i}]: cuda {c}, reference {r}"
        );
    }
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.data().to_f32_vec()
}

fn bools(t: &Tensor) -> Vec<bool> {
    match t.data() {
        TensorData::Bool(v) => v.clone(),
        d => panic!("not Bool: {:?}", d.dtype()),
    }
}

fn key(r: &[NanReport]) -> Vec<(NodeId, String, usize)> {
    r.iter()
        .map(|r| (r.node, format!("{:?}", r.cause), r.index))
        .collect()
}

/// Elementwise (fused and not), reductions, copies, Gather, Select, comparisons, casts and a
/// MatMul on bfloat16 values: exact ops bit-equal to f32 arithmetic rounded once, the rest
/// within bfloat16 round-off of the CPU (or an f64 product); 2 bytes per stored value; the
/// scan's counts and reports equal the CPU's.
#[test]
fn bf16_ops_are_stored_in_16_bits_and_match_the_reference() {
    if !cuda_available() {
        return;
    }
    let (a0, a1, h, o) = (3usize, 7usize, 33usize, 17usize);
    let d3 = [a0, a1, h];
    let n = a0 * a1 * h; // 693: odd
    let mut xv = rand_vec(n, 1, -3.0, 3.0);
    let mut yv = rand_vec(n, 2, -3.0, 3.0);
    xv[5] = f32::NAN;
    xv[100] = f32::INFINITY;
    xv[200] = f32::NEG_INFINITY;
    xv[250] = 0.0;
    yv[300] = 0.0; // x / 0: ±inf
    yv[301] = -0.0;
    let bv = rand_vec(h, 3, -1.0, 1.0);
    let tv = rand_vec(50 * h, 4, -4.0, 4.0);
    let wv = rand_vec(h * o, 5, -0.5, 0.5);
    let idx = vec![3i64, 0, 49, -1, 17];
    // The inputs as bfloat16 values (what the reference computes from).
    let q = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| rb(x)).collect() };
    let (xq, yq, bq, tq, wq) = (q(&xv), q(&yv), q(&bv), q(&tv), q(&wv));

    let mut g = Graph::new("bf16_storage");
    let x = g.input("x", sh(&d3, BF));
    let y = g.input("y", sh(&d3, BF));
    let b = g.input("b", sh(&[h], BF));
    let table = g.input("table", sh(&[50, h], BF));
    let ix = g.input("idx", sh(&[5], DType::I64));
    let w = g.input("w", sh(&[h, o], BF));
    let s3 = sh(&d3, BF);
    // Exact ops (single outputs: not fused).
    let add = g.add(x, b, s3.clone());
    let mul = g.mul(x, y, s3.clone());
    let div = g.div(x, y, s3.clone());
    let max = g.binary(BinaryOp::Max, x, y, s3.clone());
    let relu = g.activation(Activation::Relu, x, s3.clone());
    let neg = g.unary(UnaryOp::Neg, x, s3.clone());
    // A fused chain with a broadcast input: (x + b) * y -> abs -> sqrt -> tanh.
    let c1 = g.add(x, b, s3.clone());
    let c2 = g.mul(c1, y, s3.clone());
    let c3 = g.unary(UnaryOp::Abs, c2, s3.clone());
    let c4 = g.unary(UnaryOp::Sqrt, c3, s3.clone());
    let chain = g.activation(Activation::Tanh, c4, s3.clone());
    let exp = g.unary(UnaryOp::Exp, y, s3.clone());
    let rmean = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![2],
            keepdims: false,
        },
        vec![y],
        sh(&[a0, a1], BF),
    );
    let rmax = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: vec![1],
            keepdims: false,
        },
        vec![x],
        sh(&[a0, h], BF),
    );
    let tr = g.add_node(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        vec![x],
        sh(&[h, a0, a1], BF),
    );
    let sl = g.add_node(
        Op::Slice {
            starts: vec![1, 0, 32],
            steps: vec![1, 3, -2],
            sizes: vec![2, 3, 16],
        },
        vec![x],
        sh(&[2, 3, 16], BF),
    );
    let cc = g.add_node(Op::Concat { axis: 2 }, vec![x, y], sh(&[a0, a1, 2 * h], BF));
    let gt = g.add_node(Op::Gather { axis: 0 }, vec![table, ix], sh(&[5, h], BF));
    let lt = g.binary(BinaryOp::Lt, x, y, sh(&d3, DType::Bool));
    let sel = g.add_node(Op::Select, vec![lt, x, y], s3.clone());
    let cast = |g: &mut Graph, v: NodeId, to: DType| {
        let d = g.node(v).shape.dims_usize().to_vec();
        g.add_node(Op::Cast { to, saturate: true }, vec![v], sh(&d, to))
    };
    let up = cast(&mut g, x, DType::F32);
    let sq = g.mul(up, up, sh(&d3, DType::F32));
    let down = cast(&mut g, sq, BF);
    let isnan = g.add_node(Op::Unary(UnaryOp::IsNaN), vec![x], sh(&d3, DType::Bool));
    let nz = cast(&mut g, x, DType::Bool);
    let mm = g.matmul(x, w, sh(&[a0, a1, o], BF));
    let outs = vec![
        add, mul, div, max, relu, neg, chain, exp, rmean, rmax, tr, sl, cc, gt, lt, sel, up, down,
        isnan, nz, mm,
    ];
    g.set_outputs(outs.clone());
    let ins = vec![
        bft(&d3, &xv),
        bft(&d3, &yv),
        bft(&[h], &bv),
        bft(&[50, h], &tv),
        Tensor::new(vec![5], TensorData::I64(idx.clone())).unwrap(),
        bft(&[h, o], &wv),
    ];
    let cpu = CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, None)
        .unwrap();

    // Independent references for the exact ops.
    let at3 = |i: usize| (i / (a1 * h), (i / h) % a1, i % h);
    let r_add: Vec<f32> = (0..n).map(|i| rb(xq[i] + bq[i % h])).collect();
    let r_mul: Vec<f32> = (0..n).map(|i| rb(xq[i] * yq[i])).collect();
    let r_div: Vec<f32> = (0..n).map(|i| rb(xq[i] / yq[i])).collect();
    let r_max: Vec<f32> = (0..n)
        .map(|i| {
            if xq[i].is_nan() || yq[i].is_nan() {
                f32::NAN
            } else {
                xq[i].max(yq[i])
            }
        })
        .collect();
    let r_relu: Vec<f32> = xq.iter().map(|&v| if v < 0.0 { 0.0 } else { v }).collect();
    let r_neg: Vec<f32> = xq.iter().map(|&v| -v).collect();
    let r_rmax: Vec<f32> = (0..a0 * h)
        .map(|k| {
            let (p, c) = (k / h, k % h);
            let col: Vec<f32> = (0..a1).map(|j| xq[(p * a1 + j) * h + c]).collect();
            if col.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else {
                col.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            }
        })
        .collect();
    let r_tr: Vec<f32> = (0..n)
        .map(|k| {
            let (c, p, j) = (k / (a0 * a1), (k / a1) % a0, k % a1);
            xq[(p * a1 + j) * h + c]
        })
        .collect();
    let r_sl: Vec<f32> = (0..2 * 3 * 16)
        .map(|k| {
            let (p, j, c) = (k / 48, (k / 16) % 3, k % 16);
            xq[((1 + p) * a1 + 3 * j) * h + (32 - 2 * c)]
        })
        .collect();
    let r_cc: Vec<f32> = (0..2 * n)
        .map(|k| {
            let (row, c) = (k / (2 * h), k % (2 * h));
            if c < h {
                xq[row * h + c]
            } else {
                yq[row * h + c - h]
            }
        })
        .collect();
    let r_gt: Vec<f32> = (0..5 * h)
        .map(|k| {
            let r = idx[k / h].rem_euclid(50) as usize;
            tq[r * h + k % h]
        })
        .collect();
    let r_lt: Vec<bool> = (0..n).map(|i| xq[i] < yq[i]).collect();
    let r_sel: Vec<f32> = (0..n)
        .map(|i| if r_lt[i] { xq[i] } else { yq[i] })
        .collect();
    let r_down: Vec<f32> = xq.iter().map(|&v| rb(v * v)).collect();
    let r_isnan: Vec<bool> = xq.iter().map(|v| v.is_nan()).collect();
    let r_nz: Vec<bool> = xq.iter().map(|&v| v != 0.0).collect();
    let _ = at3;

    for fuse in [true, false] {
        if !fuse {
            std::env::set_var("RLX_CUDA_FUSE", "0");
        }
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        std::env::remove_var("RLX_CUDA_FUSE");
        all_gpu(&ex);
        check_storage(&g, &ex);
        if fuse {
            assert!(ex.fused_groups() >= 1, "the chain fuses");
        }
        let got = ex.run(&ins, None).unwrap();
        let tag = |s: &str| format!("{s} (fused {fuse})");
        let exact = [
            (add, &r_add),
            (mul, &r_mul),
            (div, &r_div),
            (max, &r_max),
            (relu, &r_relu),
            (neg, &r_neg),
            (rmax, &r_rmax),
            (tr, &r_tr),
            (sl, &r_sl),
            (cc, &r_cc),
            (gt, &r_gt),
            (sel, &r_sel),
            (up, &xq),
            (down, &r_down),
        ];
        for (node, want) in exact {
            let k = outs.iter().position(|&o| o == node).unwrap();
            let name = tag(&format!("{} {}", node, g.node(node).op.name()));
            close(&name, &f32s(&got[k]), want, 0.0, 0.0);
        }
        let pos = |node: NodeId| outs.iter().position(|&o| o == node).unwrap();
        assert_eq!(bools(&got[pos(lt)]), r_lt, "{}", tag("Lt"));
        assert_eq!(bools(&got[pos(isnan)]), r_isnan, "{}", tag("IsNaN"));
        assert_eq!(bools(&got[pos(nz)]), r_nz, "{}", tag("Cast to Bool"));
        // Ops the CPU computes with its own f32 kernels: within two bfloat16 ulps.
        for node in [chain, exp, rmean] {
            let k = pos(node);
            let name = tag(&format!("{} {}", node, g.node(node).op.name()));
            close(&name, &f32s(&got[k]), &f32s(&cpu[k]), 2f32.powi(-7), 1e-30);
        }
        // MatMul against an f64 product: bfloat16 rounding of the f32 accumulation.
        let mm_got = f32s(&got[pos(mm)]);
        for r in 0..a0 * a1 {
            for c in 0..o {
                let (mut s, mut sa) = (0f64, 0f64);
                for k in 0..h {
                    let p = xq[r * h + k] as f64 * wq[k * o + c] as f64;
                    s += p;
                    sa += p.abs();
                }
                let v = mm_got[r * o + c];
                if !s.is_finite() {
                    assert!(
                        (s.is_nan() && v.is_nan()) || v as f64 == s,
                        "MatMul [{r},{c}]: cuda {v}, f64 {s}"
                    );
                    continue;
                }
                let tol = 2f64.powi(-8) * s.abs() * 1.01 + (h as f64) * 2f64.powi(-23) * sa;
                assert!(
                    (v as f64 - s).abs() <= tol,
                    "{}: [{r},{c}] cuda {v}, f64 {s} (tol {tol})",
                    tag("MatMul")
                );
            }
        }
        // The scan: every node's NaN/Inf counts and the reports equal the CPU's.
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        ex.run(&ins, Some(&mut sc)).unwrap();
        let mut cs = DebugScanner::new(DebugMode::Warn, "cpu");
        cs.set_print(false);
        CpuExecutor::new(g.clone())
            .unwrap()
            .run(&ins, Some(&mut cs))
            .unwrap();
        for node in &g.nodes {
            assert_eq!(
                sc.counts()[node.id.index()],
                cs.counts()[node.id.index()],
                "{}",
                tag(&format!("counts of {} {}", node.id, node.op.name()))
            );
        }
        assert!(!sc.reports().is_empty());
        assert_eq!(key(sc.reports()), key(cs.reports()), "{}", tag("reports"));
    }
}

/// Convolutions (cuDNN's bfloat16 path without a bias; with a bias the f32-word step between
/// conversions) and 2-D pools on bfloat16 storage, against the CPU's bfloat16 path.
#[test]
fn bf16_conv_and_pool_match_the_cpu() {
    if !cuda_available() {
        return;
    }
    let (xd, wd, od) = (
        [2usize, 8, 11, 11],
        [16usize, 8, 3, 3],
        [2usize, 16, 11, 11],
    );
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let mut g = Graph::new("bf16_conv");
    let x = g.input("x", sh(&xd, BF));
    let w = g.input("w", sh(&wd, BF));
    let bias = g.input("bias", sh(&[16], BF));
    let c = g.add_node(Op::Conv(a.clone()), vec![x, w], sh(&od, BF));
    let cb = g.add_node(Op::Conv(a), vec![x, w, bias], sh(&od, BF));
    let pool = |kind| PoolAttrs {
        kind,
        kernel: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    let mp = g.add_node(
        Op::Pool(pool(PoolKind::Max)),
        vec![c],
        sh(&[2, 16, 6, 6], BF),
    );
    let ap = g.add_node(
        Op::Pool(pool(PoolKind::Avg {
            count_include_pad: false,
        })),
        vec![cb],
        sh(&[2, 16, 6, 6], BF),
    );
    g.set_outputs(vec![c, cb, mp, ap]);
    let nx: usize = xd.iter().product();
    let mut xv = rand_vec(nx, 41, -2.0, 2.0);
    xv[nx / 3] = f32::NAN;
    xv[nx / 2] = f32::INFINITY;
    let ins = vec![
        bft(&xd, &xv),
        bft(&wd, &rand_vec(wd.iter().product(), 42, -0.5, 0.5)),
        bft(&[16], &rand_vec(16, 43, -1.0, 1.0)),
    ];
    let want = CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, None)
        .unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    all_gpu(&ex);
    check_storage(&g, &ex);
    eprintln!(
        "conv: {:?}; with bias: {:?}; steps between bfloat16 conversions: {:?}",
        ex.kernel_note(c),
        ex.kernel_note(cb),
        ex.bf16_wrapped()
    );
    let got = ex.run(&ins, None).unwrap();
    for (k, name) in ["Conv", "Conv+bias", "MaxPool", "AvgPool"]
        .iter()
        .enumerate()
    {
        let wv = f32s(&want[k]);
        let scale = wv
            .iter()
            .filter(|v| v.is_finite())
            .fold(0f32, |m, v| m.max(v.abs()));
        // One bfloat16 rounding apart (the bias: two), plus f32 summation-order differences.
        close(name, &f32s(&got[k]), &wv, 2f32.powi(-7), scale * 1e-3);
    }
    let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
    sc.set_print(false);
    ex.run(&ins, Some(&mut sc)).unwrap();
    let mut cs = DebugScanner::new(DebugMode::Warn, "cpu");
    cs.set_print(false);
    CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, Some(&mut cs))
        .unwrap();
    assert_eq!(sc.counts(), cs.counts());
    assert_eq!(key(sc.reports()), key(cs.reports()));
}

/// The NaN/Inf scan over 16-bit buffers: odd lengths (the 8-values-per-load body and its
/// tail), a buffer over many blocks, every node's counts and first indices equal to the
/// CPU's scanner on the same bfloat16 graph, fused and unfused, and the same culprit.
#[test]
fn bf16_nan_scan_counts_match_the_cpu() {
    if !cuda_available() {
        return;
    }
    for &n in &[1usize, 3, 8, 9, 4099, 3 * 32768 + 5] {
        let s = sh(&[n], BF);
        let mut g = Graph::new("bf16_scan");
        let x = g.input("x", s.clone());
        let l = g.unary(UnaryOp::Log, x, s.clone()); // NaN at negatives, -inf at zeros
        let r = g.unary(UnaryOp::Reciprocal, x, s.clone()); // ±inf at ±0
        let a = g.add(l, r, s.clone());
        let q = g.unary(UnaryOp::Sqrt, a, s.clone());
        let nn = g.unary(UnaryOp::Neg, q, s.clone());
        g.set_outputs(vec![nn, r]);
        let mut v = rand_vec(n, n as u64, -2.0, 2.0);
        for i in (0..n).step_by(7) {
            v[i] = 0.0;
        }
        for i in (3..n).step_by(13) {
            v[i] = -0.0;
        }
        for i in (5..n).step_by(17) {
            v[i] = f32::INFINITY;
        }
        v[n - 1] = f32::NAN;
        let xt = bft(&[n], &v);
        let mut cs = DebugScanner::new(DebugMode::Warn, "cpu");
        cs.set_print(false);
        CpuExecutor::new(g.clone())
            .unwrap()
            .run(std::slice::from_ref(&xt), Some(&mut cs))
            .unwrap();
        for fuse in [true, false] {
            if !fuse {
                std::env::set_var("RLX_CUDA_FUSE", "0");
            }
            let mut ex = CudaExecutor::new(g.clone()).unwrap();
            std::env::remove_var("RLX_CUDA_FUSE");
            all_gpu(&ex);
            check_storage(&g, &ex);
            // Twice: the second scanning run is the one captured as a CUDA graph.
            for run in 0..3 {
                let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
                sc.set_print(false);
                ex.run(std::slice::from_ref(&xt), Some(&mut sc)).unwrap();
                for node in &g.nodes {
                    assert_eq!(
                        sc.counts()[node.id.index()],
                        cs.counts()[node.id.index()],
                        "n={n} fused {fuse} run {run}: counts of {} {}",
                        node.id,
                        node.op.name()
                    );
                }
                assert_eq!(key(sc.reports()), key(cs.reports()), "n={n} fused {fuse}");
            }
        }
    }
}
