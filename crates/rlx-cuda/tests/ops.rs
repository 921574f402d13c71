//! Reduce, data movement (index-map copies), Gather, Bool comparisons, Select and Casts on
//! CUDA against rlx-cpu (the reference), on odd sizes with NaN/±inf/±0 in the data.
mod common;
use common::*;
use rlx_cuda::{CudaError, CudaExecutor, Placement};
use rlx_ir::{
    BinaryOp, DType, Graph, NodeId, Op, PadMode, ReduceKind, Shape, Tensor, TensorData, UnaryOp,
};

fn sh(d: &[usize], t: DType) -> Shape {
    Shape::new(d, t)
}

/// Random values in [-3, 3) with NaN, +inf, -inf, +0, -0 and a payload NaN sprinkled in.
fn specials(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut v = rand_vec(n, seed, -3.0, 3.0);
    let sp = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        f32::from_bits(0x7fc0_1234),
    ];
    for (k, i) in (0..n).step_by(7).enumerate() {
        v[(i + seed as usize) % n] = sp[k % sp.len()];
    }
    Tensor::from_f32(dims, v).unwrap()
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

/// Bit-exact equality (f32 by bits, NaN payloads included unless `any_nan`), other dtypes
/// by value; dims and dtypes must match.
fn assert_same(what: &str, got: &Tensor, want: &Tensor, any_nan: bool) {
    assert_eq!(got.dims(), want.dims(), "{what}: dims");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    match (got.data(), want.data()) {
        (TensorData::F32(a), TensorData::F32(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let ok = if any_nan {
                    (x.is_nan() && y.is_nan()) || x == y
                } else {
                    x.to_bits() == y.to_bits()
                };
                assert!(
                    ok,
                    "{what}: element {i}: cuda {x:?} ({:#x}) cpu {y:?} ({:#x})",
                    x.to_bits(),
                    y.to_bits()
                );
            }
        }
        (a, b) => assert_eq!(a, b, "{what}"),
    }
}

fn run_both(g: &Graph, ins: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>, CudaExecutor) {
    let mut c = rlx_cpu::CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(ins, None).unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    let got = ex.run(ins, None).unwrap();
    // run_all gives the same values, typed as on the CPU.
    let all = ex.run_all(ins).unwrap();
    for (o, w) in g.outputs.iter().zip(&want) {
        assert_eq!(all[o.index()].as_ref().unwrap().dtype(), w.dtype());
    }
    (want, got, ex)
}

fn reduce_dims(d: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    let mut o = vec![];
    for (i, &x) in d.iter().enumerate() {
        if axes.contains(&i) {
            if keep {
                o.push(1);
            }
        } else {
            o.push(x);
        }
    }
    o
}

#[test]
fn reduce_all_kinds_axes_and_nan() {
    if !cuda_available() {
        return;
    }
    let cases: &[(&[usize], &[usize])] = &[
        (&[5, 7, 3], &[0]),
        (&[5, 7, 3], &[1]),
        (&[5, 7, 3], &[2]),
        (&[5, 7, 3], &[0, 2]),
        (&[5, 7, 3], &[0, 1, 2]),
        (&[5, 7, 3], &[]),
        (&[3, 1001], &[1]),
        (&[2, 0, 3], &[1]),
        (&[16, 769], &[1]),
    ];
    let kinds = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
    ];
    let mut n = 0;
    for (ci, &(d, axes)) in cases.iter().enumerate() {
        for keep in [true, false] {
            let mut g = Graph::new("reduce");
            let x = g.input("x", sh(d, DType::F32));
            let mut outs = vec![];
            for k in kinds {
                outs.push(g.add_node(
                    Op::Reduce {
                        kind: k,
                        axes: axes.to_vec(),
                        keepdims: keep,
                    },
                    vec![x],
                    sh(&reduce_dims(d, axes, keep), DType::F32),
                ));
            }
            g.set_outputs(outs);
            // Clean data (sums to round-off) and data with specials (NaN placement).
            for (si, xt) in [
                Tensor::from_f32(d, rand_vec(d.iter().product(), ci as u64, 0.5, 1.5)).unwrap(),
                specials(d, ci as u64 + 3),
            ]
            .into_iter()
            .enumerate()
            {
                let (want, got, ex) = run_both(&g, &[xt]);
                all_gpu(&ex);
                for (k, (w, c)) in kinds.iter().zip(want.iter().zip(&got)) {
                    let what = format!("Reduce{k:?} {d:?} axes {axes:?} keep {keep} set {si}");
                    match k {
                        // Max/Min are exact (±0 compared as equal values, NaN as NaN).
                        ReduceKind::Max | ReduceKind::Min => assert_same(&what, c, w, true),
                        _ => assert_close(&what, c, w, 2e-7),
                    }
                    n += 1;
                }
            }
        }
    }
    eprintln!("{n} reduce cases match rlx-cpu");
}

#[test]
#[allow(clippy::vec_init_then_push)] // one push per case reads better than one long vec![]
fn data_movement_is_bit_exact() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("move");
    let f = DType::F32;
    let x = g.input("x", sh(&[3, 5, 7], f));
    let y = g.input("y", sh(&[7, 9], f));
    let z = g.input("z", sh(&[5, 1], f));
    let b = g.input("b", sh(&[3, 1, 4], DType::Bool));
    let l = g.input("l", sh(&[3, 5], DType::I64));
    let mut outs = vec![];
    outs.push(g.add_node(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        vec![x],
        sh(&[7, 3, 5], f),
    ));
    outs.push(g.add_node(
        Op::Transpose { perm: vec![1, 0] },
        vec![l],
        sh(&[5, 3], DType::I64),
    ));
    outs.push(g.add_node(
        Op::Broadcast {
            dims: vec![3, 5, 4],
        },
        vec![z],
        sh(&[3, 5, 4], f),
    ));
    outs.push(g.add_node(
        Op::Broadcast {
            dims: vec![3, 6, 4],
        },
        vec![b],
        sh(&[3, 6, 4], DType::Bool),
    ));
    outs.push(g.add_node(
        Op::Slice {
            starts: vec![6, 1],
            steps: vec![-2, 3],
            sizes: vec![4, 3],
        },
        vec![y],
        sh(&[4, 3], f),
    ));
    outs.push(g.add_node(
        Op::Slice {
            starts: vec![2, 4, 6],
            steps: vec![-1, 1, -3],
            sizes: vec![3, 1, 3],
        },
        vec![x],
        sh(&[3, 1, 3], f),
    ));
    outs.push(g.add_node(
        Op::Tile {
            repeats: vec![2, 3],
        },
        vec![y],
        sh(&[14, 27], f),
    ));
    outs.push(g.add_node(
        Op::Tile {
            repeats: vec![2, 1],
        },
        vec![l],
        sh(&[6, 5], DType::I64),
    ));
    for mode in [
        PadMode::Constant(-1.5),
        PadMode::Constant(f64::NEG_INFINITY),
        PadMode::Edge,
        PadMode::Reflect,
        PadMode::Wrap,
    ] {
        outs.push(g.add_node(
            Op::Pad {
                pads: vec![(1, 2), (2, 1)],
                mode,
            },
            vec![y],
            sh(&[10, 12], f),
        ));
    }
    let x2 = g.input("x2", sh(&[3, 2, 7], f));
    let x3 = g.input("x3", sh(&[3, 1, 7], f));
    outs.push(g.add_node(Op::Concat { axis: 1 }, vec![x, x2, x3], sh(&[3, 8, 7], f)));
    outs.push(g.add_node(Op::Concat { axis: 0 }, vec![l, l], sh(&[6, 5], DType::I64)));
    g.set_outputs(outs);
    let lv: Vec<i64> = (0..15).map(|i| (i as i64 - 7) * 0x1_0000_0001).collect();
    let ins = vec![
        specials(&[3, 5, 7], 1),
        specials(&[7, 9], 2),
        specials(&[5, 1], 3),
        Tensor::new(
            vec![3, 1, 4],
            TensorData::Bool((0..12).map(|i| i % 3 == 0).collect()),
        )
        .unwrap(),
        Tensor::new(vec![3, 5], TensorData::I64(lv)).unwrap(),
        specials(&[3, 2, 7], 4),
        specials(&[3, 1, 7], 5),
    ];
    let (want, got, ex) = run_both(&g, &ins);
    all_gpu(&ex);
    for (i, (w, c)) in want.iter().zip(&got).enumerate() {
        let o = g.outputs[i];
        assert_same(&format!("{o} {}", g.node(o).op.name()), c, w, false);
    }
    eprintln!(
        "{} data-movement outputs bit-identical to rlx-cpu",
        got.len()
    );
}

fn gather_graph(dd: &[usize], axis: usize, idt: DType, nidx: &[usize]) -> (Graph, NodeId) {
    let mut g = Graph::new("gather");
    let x = g.input("x", sh(dd, DType::F32));
    let i = g.input("i", sh(nidx, idt));
    let mut od = dd[..axis].to_vec();
    od.extend_from_slice(nidx);
    od.extend_from_slice(&dd[axis + 1..]);
    let o = g.add_node(Op::Gather { axis }, vec![x, i], sh(&od, DType::F32));
    let e = g.unary(UnaryOp::Neg, o, sh(&od, DType::F32));
    g.set_outputs(vec![o, e]);
    (g, o)
}

#[test]
fn gather_i64_i32_negative_and_out_of_range() {
    if !cuda_available() {
        return;
    }
    let dd = [7, 5, 3];
    for axis in 0..3 {
        let dim = dd[axis] as i64;
        let idx: Vec<i64> = vec![0, dim - 1, -1, -dim, 1, 2 % dim];
        for idt in [DType::I64, DType::I32] {
            let (g, _) = gather_graph(&dd, axis, idt, &[2, 3]);
            let it = match idt {
                DType::I64 => Tensor::new(vec![2, 3], TensorData::I64(idx.clone())).unwrap(),
                _ => Tensor::new(
                    vec![2, 3],
                    TensorData::I32(idx.iter().map(|&v| v as i32).collect()),
                )
                .unwrap(),
            };
            let ins = vec![specials(&dd, 9), it];
            let (want, got, ex) = run_both(&g, &ins);
            all_gpu(&ex);
            assert_same(
                &format!("gather axis {axis} {idt}"),
                &got[0],
                &want[0],
                false,
            );
            assert_same(
                &format!("gather+neg axis {axis} {idt}"),
                &got[1],
                &want[1],
                false,
            );
        }
    }
    // Out of range (either side): an error naming the Gather node, on both backends.
    for bad in [5i64, -6] {
        let (g, o) = gather_graph(&[4, 5], 1, DType::I64, &[3]);
        let ins = vec![
            specials(&[4, 5], 1),
            Tensor::new(vec![3], TensorData::I64(vec![0, bad, 1])).unwrap(),
        ];
        let mut c = rlx_cpu::CpuExecutor::new(g.clone()).unwrap();
        assert!(c.run(&ins, None).is_err(), "cpu accepted index {bad}");
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        all_gpu(&ex);
        match ex.run(&ins, None) {
            Err(CudaError::Kernel { node, msg, .. }) => {
                assert_eq!(node, o);
                assert!(msg.contains("out of range"), "{msg}");
                eprintln!("index {bad}: {}", ex.run(&ins, None).unwrap_err());
            }
            other => panic!(
                "index {bad}: expected an error naming {o}, got {:?}",
                other.map(|_| ())
            ),
        }
        // The executor recovers: a valid run afterwards succeeds.
        let ok = vec![
            ins[0].clone(),
            Tensor::new(vec![3], TensorData::I64(vec![0, 4, -5])).unwrap(),
        ];
        let got = ex.run(&ok, None).unwrap();
        let want = c.run(&ok, None).unwrap();
        assert_same("gather after error", &got[0], &want[0], false);
    }
}

#[test]
fn comparisons_select_and_casts() {
    if !cuda_available() {
        return;
    }
    let f = DType::F32;
    let bo = DType::Bool;
    let mut g = Graph::new("cmp");
    let a = g.input("a", sh(&[4, 3, 5], f));
    let b = g.input("b", sh(&[3, 1], f));
    let i32v = g.input("i", sh(&[4, 3, 5], DType::I32));
    let i64v = g.input("l", sh(&[4, 3, 5], DType::I64));
    let d = [4, 3, 5];
    let mut outs = vec![];
    let mut bools = vec![];
    for op in [
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Eq,
    ] {
        let c = g.binary(op, a, b, sh(&d, bo));
        bools.push(c);
        outs.push(c);
    }
    let aa = g.binary(BinaryOp::Eq, a, a, sh(&d, bo));
    outs.push(aa);
    for op in [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor] {
        outs.push(g.binary(op, bools[0], bools[4], sh(&d, bo)));
    }
    outs.push(g.unary(UnaryOp::Not, bools[1], sh(&d, bo)));
    outs.push(g.unary(UnaryOp::IsNaN, a, sh(&d, bo)));
    for (pos, neg) in [(true, true), (true, false), (false, true)] {
        outs.push(g.unary(UnaryOp::IsInf { pos, neg }, a, sh(&d, bo)));
    }
    outs.push(g.add_node(Op::Select, vec![bools[0], a, b], sh(&d, f)));
    let cb = g.add_node(
        Op::Cast {
            to: bo,
            saturate: true,
        },
        vec![a],
        sh(&d, bo),
    );
    outs.push(cb);
    outs.push(g.add_node(
        Op::Cast {
            to: f,
            saturate: true,
        },
        vec![cb],
        sh(&d, f),
    ));
    outs.push(g.add_node(
        Op::Cast {
            to: DType::I32,
            saturate: true,
        },
        vec![cb],
        sh(&d, DType::I32),
    ));
    outs.push(g.add_node(
        Op::Cast {
            to: DType::I64,
            saturate: true,
        },
        vec![cb],
        sh(&d, DType::I64),
    ));
    outs.push(g.add_node(
        Op::Cast {
            to: f,
            saturate: true,
        },
        vec![i32v],
        sh(&d, f),
    ));
    outs.push(g.add_node(
        Op::Cast {
            to: DType::I64,
            saturate: true,
        },
        vec![i32v],
        sh(&d, DType::I64),
    ));
    outs.push(g.add_node(
        Op::Cast {
            to: f,
            saturate: true,
        },
        vec![i64v],
        sh(&d, f),
    ));
    g.set_outputs(outs);
    let n = 60;
    let iv: Vec<i32> = (0..n)
        .map(|k| (k as i32 - 30).wrapping_mul(71_582_791))
        .collect();
    // i64 values near 2^53..2^62 where f64 then f32 rounding differs from direct rounding.
    let lv: Vec<i64> = (0..n)
        .map(|k| {
            let base = [
                0x2000_0010_0000_0001i64,
                (1 << 53) + 1,
                -(1 << 40) - 3,
                12345,
                -7,
            ][k % 5];
            base.wrapping_add(k as i64 * 0x1000_0001)
        })
        .collect();
    let mut bt = specials(&[3, 1], 2);
    if let TensorData::F32(v) = bt.data_mut() {
        v[0] = 0.0;
    }
    let ins = vec![
        specials(&d, 1),
        bt,
        Tensor::new(d.to_vec(), TensorData::I32(iv)).unwrap(),
        Tensor::new(d.to_vec(), TensorData::I64(lv)).unwrap(),
    ];
    let (want, got, ex) = run_both(&g, &ins);
    all_gpu(&ex);
    for (i, (w, c)) in want.iter().zip(&got).enumerate() {
        let o = g.outputs[i];
        assert_same(&format!("{o} {}", g.node(o).op.name()), c, w, false);
    }
    eprintln!(
        "{} comparison/select/cast outputs identical to rlx-cpu",
        got.len()
    );
}

#[test]
fn conv_groups_dilation_pads_bias() {
    if !cuda_available() {
        return;
    }
    use rlx_ir::ConvAttrs;
    // (x dims, w dims, groups, strides, pads, dilations, bias)
    type Case = (
        Vec<usize>,
        Vec<usize>,
        usize,
        Vec<usize>,
        Vec<(usize, usize)>,
        Vec<usize>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            vec![2, 6, 9, 11],
            vec![4, 3, 3, 3],
            2,
            vec![2, 1],
            vec![(1, 0), (2, 1)],
            vec![1, 2],
            true,
        ),
        (
            vec![1, 5, 13],
            vec![7, 5, 4],
            1,
            vec![3],
            vec![(2, 2)],
            vec![1],
            false,
        ),
        (
            vec![2, 8, 7, 7],
            vec![8, 1, 3, 3],
            8,
            vec![1, 1],
            vec![(1, 1), (1, 1)],
            vec![1, 1],
            true,
        ),
        (
            vec![1, 16, 10, 10],
            vec![12, 16, 1, 1],
            1,
            vec![2, 2],
            vec![(0, 0), (0, 0)],
            vec![1, 1],
            true,
        ),
        (
            vec![1, 3, 17, 17],
            vec![5, 3, 7, 7],
            1,
            vec![2, 2],
            vec![(3, 3), (3, 3)],
            vec![1, 1],
            true,
        ),
        // The GEMM paths (2-D, groups 1): pointwise (no im2col) and 3x3 pad 1 over a batch,
        // with asymmetric pads and dilation through im2col.
        (
            vec![3, 16, 7, 9],
            vec![24, 16, 1, 1],
            1,
            vec![1, 1],
            vec![(0, 0), (0, 0)],
            vec![1, 1],
            true,
        ),
        (
            vec![2, 8, 14, 14],
            vec![16, 8, 3, 3],
            1,
            vec![1, 1],
            vec![(1, 1), (1, 1)],
            vec![1, 1],
            false,
        ),
        (
            vec![2, 5, 12, 10],
            vec![6, 5, 3, 2],
            1,
            vec![2, 1],
            vec![(2, 0), (0, 1)],
            vec![2, 3],
            true,
        ),
        (
            vec![1, 2, 4, 5, 6],
            vec![3, 2, 2, 3, 2],
            1,
            vec![1, 2, 1],
            vec![(1, 0), (0, 1), (1, 1)],
            vec![2, 1, 1],
            true,
        ),
    ];
    for (ci, (xd, wd, groups, strides, pads, dilations, bias)) in cases.into_iter().enumerate() {
        let ns = xd.len() - 2;
        let mut od = vec![xd[0], wd[0]];
        for d in 0..ns {
            let span = dilations[d] * (wd[2 + d] - 1) + 1;
            od.push((xd[2 + d] + pads[d].0 + pads[d].1 - span) / strides[d] + 1);
        }
        let a = ConvAttrs {
            strides,
            pads,
            dilations,
            groups,
        };
        let mut g = Graph::new("conv");
        let x = g.input("x", sh(&xd, DType::F32));
        let w = g.input("w", sh(&wd, DType::F32));
        let mut ins_ids = vec![x, w];
        if bias {
            ins_ids.push(g.input("b", sh(&[wd[0]], DType::F32)));
        }
        let o = g.add_node(Op::Conv(a.clone()), ins_ids, sh(&od, DType::F32));
        g.set_outputs(vec![o]);
        let nx: usize = xd.iter().product();
        let mut xv = rand_vec(nx, ci as u64, -1.0, 1.0);
        xv[nx / 3] = f32::NAN;
        xv[nx / 2] = f32::INFINITY;
        let mut ins = vec![
            Tensor::from_f32(&xd, xv).unwrap(),
            Tensor::from_f32(
                &wd,
                rand_vec(wd.iter().product(), ci as u64 + 50, -1.0, 1.0),
            )
            .unwrap(),
        ];
        if bias {
            ins.push(
                Tensor::from_f32(&[wd[0]], rand_vec(wd[0], ci as u64 + 70, -1.0, 1.0)).unwrap(),
            );
        }
        let want = rlx_cpu::eval_op(
            &Op::Conv(a),
            &ins.iter().collect::<Vec<_>>(),
            &g.node(o).shape,
        )
        .unwrap();
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        all_gpu(&ex);
        let got = ex.run(&ins, None).unwrap();
        assert_close(
            &format!("conv case {ci} {xd:?} * {wd:?}"),
            &got[0],
            &want,
            1e-4,
        );
    }
}

/// MaxPool and AveragePool (2-D) on CUDA against rlx-cpu: ResNet's 3x3 stride 2 pad 1 max,
/// average with and without count_include_pad, dilation, a ceil-mode window past the end
/// pad, a global 7x7 average; NaN and ±inf in the data (Max: NaN wins; bit-exact).
#[test]
fn pool_max_avg_with_nan() {
    if !cuda_available() {
        return;
    }
    use rlx_ir::{PoolAttrs, PoolKind};
    // (x dims, kind, kernel, strides, pads, dilations, ceil_mode)
    type Case = (
        [usize; 4],
        PoolKind,
        [usize; 2],
        [usize; 2],
        [(usize, usize); 2],
        [usize; 2],
        bool,
    );
    let avg = |c| PoolKind::Avg {
        count_include_pad: c,
    };
    let cases: Vec<Case> = vec![
        (
            [2, 3, 15, 15],
            PoolKind::Max,
            [3, 3],
            [2, 2],
            [(1, 1), (1, 1)],
            [1, 1],
            false,
        ),
        (
            [1, 4, 9, 8],
            avg(true),
            [3, 3],
            [1, 1],
            [(1, 1), (1, 1)],
            [1, 1],
            false,
        ),
        (
            [1, 4, 9, 8],
            avg(false),
            [3, 3],
            [1, 1],
            [(1, 1), (1, 1)],
            [1, 1],
            false,
        ),
        (
            [1, 2, 11, 10],
            PoolKind::Max,
            [2, 3],
            [1, 2],
            [(0, 1), (2, 0)],
            [2, 1],
            false,
        ),
        (
            [1, 3, 8, 8],
            avg(true),
            [3, 3],
            [2, 2],
            [(0, 0), (0, 0)],
            [1, 1],
            true,
        ),
        (
            [2, 5, 7, 7],
            avg(false),
            [7, 7],
            [1, 1],
            [(0, 0), (0, 0)],
            [1, 1],
            false,
        ),
    ];
    for (ci, (xd, kind, kernel, strides, pads, dilations, ceil_mode)) in
        cases.into_iter().enumerate()
    {
        let a = PoolAttrs {
            kind,
            kernel: kernel.to_vec(),
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
            ceil_mode,
        };
        let mut od = vec![xd[0], xd[1]];
        for d in 0..2 {
            let span = dilations[d] * (kernel[d] - 1) + 1;
            let num = xd[2 + d] + pads[d].0 + pads[d].1 - span;
            let mut o = if ceil_mode {
                num.div_ceil(strides[d]) + 1
            } else {
                num / strides[d] + 1
            };
            if ceil_mode && (o - 1) * strides[d] >= xd[2 + d] + pads[d].0 {
                o -= 1;
            }
            od.push(o);
        }
        let mut g = Graph::new("pool");
        let x = g.input("x", sh(&xd, DType::F32));
        let o = g.add_node(Op::Pool(a.clone()), vec![x], sh(&od, DType::F32));
        g.set_outputs(vec![o]);
        let xt = specials(&xd, ci as u64 + 3);
        let want = rlx_cpu::eval_op(&Op::Pool(a), &[&xt], &g.node(o).shape).unwrap();
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        all_gpu(&ex);
        let got = ex.run(&[xt], None).unwrap();
        let what = format!("pool case {ci} {kind:?} {xd:?} -> {od:?}");
        if matches!(kind, PoolKind::Max) {
            assert_same(&what, &got[0], &want, true);
        } else {
            assert_close(&what, &got[0], &want, 1e-6);
        }
    }
}

/// GatherND (ONNX: batch_dims 0 and 1, index depth 1 and 2, negative indices, i32 and i64
/// indices) and Cast i64/i32 → Bool run on CUDA and equal rlx-cpu bit for bit (which follows
/// the ONNX spec examples, `rlx-cpu`'s `gather_nd_spec_examples`); an index out of range is
/// an error naming the GatherND node.
#[test]
fn gather_nd_and_casts_to_bool_on_cuda() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("gnd");
    let f = DType::F32;
    let x = g.input("x", sh(&[4, 5, 6], f));
    let i1 = g.input("i1", sh(&[3, 1], DType::I64));
    let i2 = g.input("i2", sh(&[2, 3, 2], DType::I32));
    let ib = g.input("ib", sh(&[4, 2, 1], DType::I64));
    let l = g.input("l", sh(&[7], DType::I64));
    let k = g.input("k", sh(&[5], DType::I32));
    let o1 = g.add_node(
        Op::GatherND { batch_dims: 0 },
        vec![x, i1],
        sh(&[3, 5, 6], f),
    );
    let o2 = g.add_node(
        Op::GatherND { batch_dims: 0 },
        vec![x, i2],
        sh(&[2, 3, 6], f),
    );
    let o3 = g.add_node(
        Op::GatherND { batch_dims: 1 },
        vec![x, ib],
        sh(&[4, 2, 6], f),
    );
    let c1 = g.add_node(
        Op::Cast {
            to: DType::Bool,
            saturate: true,
        },
        vec![l],
        sh(&[7], DType::Bool),
    );
    let c2 = g.add_node(
        Op::Cast {
            to: DType::Bool,
            saturate: true,
        },
        vec![k],
        sh(&[5], DType::Bool),
    );
    g.set_outputs(vec![o1, o2, o3, c1, c2]);
    let ins = |bad: i64| {
        vec![
            rand_tensor(&[4, 5, 6], 3),
            Tensor::new(vec![3, 1], TensorData::I64(vec![2, -1, 0])).unwrap(),
            Tensor::new(
                vec![2, 3, 2],
                TensorData::I32(vec![0, 4, 3, -5, 1, 2, -4, 0, 2, 2, 3, 1]),
            )
            .unwrap(),
            Tensor::new(
                vec![4, 2, 1],
                TensorData::I64(vec![4, 0, -1, 2, 3, bad, 1, 1]),
            )
            .unwrap(),
            // 1 << 40 has a zero low word: true all the same.
            Tensor::new(
                vec![7],
                TensorData::I64(vec![0, 1, -1, 1 << 40, i64::MIN, 7, 0]),
            )
            .unwrap(),
            Tensor::new(vec![5], TensorData::I32(vec![0, -3, 0, i32::MIN, 9])).unwrap(),
        ]
    };
    let good = ins(-5);
    let (want, got) = both(&g, &good);
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.dims(), b.dims(), "output {k}");
        assert_eq!(a.data(), b.data(), "output {k}");
    }
    let want_bool: Vec<bool> = [0i64, 1, -1, 1 << 40, i64::MIN, 7, 0]
        .iter()
        .map(|&v| v != 0)
        .collect();
    assert_eq!(got[3].data(), &TensorData::Bool(want_bool));
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    for (id, p) in ex.placements() {
        assert_eq!(p, Placement::Gpu, "{id} {}", g.node(id).op.name());
    }
    let err = ex.run(&ins(5), None).unwrap_err().to_string();
    assert!(
        err.contains("GatherND") && err.contains("out of range"),
        "{err}"
    );
    // And it recovers.
    let again = ex.run(&good, None).unwrap();
    assert_eq!(again[2].data(), want[2].data());
}
