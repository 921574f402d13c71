//! Host-side tests of the executor's planning (no GPU needed).
use super::*;

/// The scan table covers each non-empty buffer with contiguous blocks, and the kernel's
/// binary search (emulated here) maps every block to its own buffer.
#[test]
fn scan_table_maps_every_block_to_its_buffer() {
    let lens = [0u64, 1, 32768, 32769, 0, 32768 * 4096 * 3 + 5, 17];
    let addrs: Vec<u64> = (0..lens.len() as u64).map(|k| 0x1000 * (k + 1)).collect();
    let (tab, entry, blocks) = scan_table(&addrs, &lens);
    assert_eq!(
        entry,
        [None, Some(0), Some(1), Some(2), None, Some(3), Some(4)]
    );
    let per = |n: u64| n.div_ceil(kernels::SCAN_PER_BLOCK).min(4096);
    assert_eq!(blocks, lens.iter().map(|&n| per(n)).sum::<u64>());
    let nent = (tab.len() / 4) as u64;
    let mut covered = vec![0u64; nent as usize];
    for b in 0..blocks {
        let (mut lo, mut hi) = (0u64, nent);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if tab[4 * mid as usize + 2] <= b {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let e = 4 * lo as usize;
        assert!(tab[e + 2] <= b && b < tab[e + 2] + tab[e + 3], "block {b}");
        covered[lo as usize] += 1;
    }
    for (k, (&a, &n)) in addrs.iter().zip(&lens).enumerate() {
        if let Some(e) = entry[k] {
            assert_eq!((tab[4 * e], tab[4 * e + 1]), (a, n));
            assert_eq!(covered[e], per(n));
            // The blocks' grid stride reaches every element.
            assert!(
                tab[4 * e + 3] * kernels::SCAN_PER_BLOCK >= n.min(kernels::SCAN_PER_BLOCK * 4096)
            );
        }
    }
}

/// Merged broadcast metadata indexes every element as the unmerged one does.
#[test]
fn bcast_meta_merges_axes_without_changing_indices() {
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[1024, 768], &[768], &[1024, 768]),
        (&[8, 128, 768], &[8, 128, 1], &[8, 128, 768]),
        (&[8, 12, 128, 128], &[8, 1, 1, 128], &[8, 12, 128, 128]),
        (&[2, 1, 3], &[1, 4, 1], &[2, 4, 3]),
        (&[1, 1], &[1], &[1, 1]),
        (&[5, 1, 7], &[5, 6, 7], &[5, 6, 7]),
        (&[3], &[2, 3], &[2, 3]),
    ];
    for &(a, b, od) in cases {
        let m = bcast_meta(&[a, b], od);
        let r = m[0] as usize;
        let (sa, sb) = (bcast_strides(a, od), bcast_strides(b, od));
        let n: usize = od.iter().product();
        for i in 0..n {
            // Unmerged.
            let (mut rem, mut ia, mut ib) = (i, 0, 0);
            for d in (0..od.len()).rev() {
                let c = rem % od[d];
                rem /= od[d];
                ia += c * sa[d];
                ib += c * sb[d];
            }
            // Merged, as the kernel does.
            let (mut rem2, mut ja, mut jb) = (i as i64, 0i64, 0i64);
            for d in (0..r).rev() {
                let c = rem2 % m[1 + d];
                rem2 /= m[1 + d];
                ja += c * m[1 + r + d];
                jb += c * m[1 + 2 * r + d];
            }
            assert_eq!(
                (ia as i64, ib as i64),
                (ja, jb),
                "{a:?} {b:?} -> {od:?} at {i}"
            );
        }
    }
    assert_eq!(bcast_meta(&[&[1024, 768], &[768]], &[1024, 768])[0], 2);
    assert_eq!(
        bcast_meta(&[&[8, 128, 768], &[8, 128, 1]], &[8, 128, 768])[0],
        2
    );
}

#[test]
fn scan_counts_decode() {
    let c = counts_of(10, &[2, 0, 1, 3, u64::MAX, 9]);
    assert_eq!((c.nan, c.pos_inf, c.neg_inf), (2, 0, 1));
    assert_eq!(
        (c.first_nan, c.first_pos_inf, c.first_neg_inf),
        (Some(3), None, Some(9))
    );
    assert_eq!(c.len, 10);
}

#[test]
fn matmul_plans() {
    // 2-D: one call, no batch strides.
    let p = matmul_plan(&[3, 4], &[4, 5]).unwrap();
    assert_eq!((p.m, p.n, p.k), (3, 5, 4));
    assert_eq!(p.strided, Some((1, 0, 0)));
    // Batched A with one B: the batch folds into M (one 18x4 by 4x5 GEMM).
    let p = matmul_plan(&[2, 3, 3, 4], &[4, 5]).unwrap();
    assert_eq!((p.m, p.n, p.k), (18, 5, 4));
    assert_eq!(p.strided, Some((1, 0, 0)));
    // One A with a batched B: strided with A's stride 0.
    let p = matmul_plan(&[3, 4], &[6, 4, 5]).unwrap();
    assert_eq!(p.strided, Some((6, 0, 20)));
    // Both batched the same way.
    let p = matmul_plan(&[6, 3, 4], &[6, 4, 5]).unwrap();
    assert_eq!(p.strided, Some((6, 12, 20)));
    // Cross broadcast [2,1] x [1,3]: one sgemm per batch with the right offsets.
    let p = matmul_plan(&[2, 1, 3, 4], &[1, 3, 4, 5]).unwrap();
    assert!(p.strided.is_none());
    assert_eq!(
        p.offsets,
        vec![(0, 0), (0, 20), (0, 40), (12, 0), (12, 20), (12, 40)]
    );
    // 1-D operands.
    let p = matmul_plan(&[4], &[4, 5]).unwrap();
    assert_eq!((p.m, p.n, p.k), (1, 5, 4));
    let p = matmul_plan(&[3, 4], &[4]).unwrap();
    assert_eq!((p.m, p.n, p.k), (3, 1, 4));
    assert!(matmul_plan(&[3, 0], &[0, 4]).is_err());
    assert!(matmul_plan(&[3, 4], &[5, 4]).is_err());
}

/// The `copy_map` kernel's index arithmetic, run on the host (line for line).
fn emulate_copy_map(x: &[u32], o: &mut [u32], n: u64, meta: &[i64]) {
    let r = meta[0] as usize;
    for i in 0..n as i64 {
        let (mut rem, mut ioff, mut ooff) = (i, 0i64, meta[1]);
        let mut fill = false;
        for d in (0..r).rev() {
            let m = &meta[3 + 7 * d..3 + 7 * d + 7];
            let c = rem % m[0];
            rem /= m[0];
            let (mut j, dim) = (m[3] + c * m[4], m[1]);
            match m[5] {
                1 => {
                    j %= dim;
                    if j < 0 {
                        j += dim
                    }
                }
                2 => fill |= j < 0 || j >= dim,
                3 => {
                    if dim == 1 {
                        j = 0
                    } else {
                        let p = 2 * (dim - 1);
                        j %= p;
                        if j < 0 {
                            j += p
                        }
                        if j >= dim {
                            j = p - j
                        }
                    }
                }
                4 => j = j.clamp(0, dim - 1),
                _ => {}
            }
            ioff += j * m[2];
            ooff += c * m[6];
        }
        o[ooff as usize] = if fill {
            meta[2] as u32
        } else {
            x[ioff as usize]
        };
    }
}

fn words_of(t: &Tensor) -> Vec<u32> {
    match t.data() {
        TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::I64(v) => v
            .iter()
            .flat_map(|&x| [x as u32, (x as u64 >> 32) as u32])
            .collect(),
        d => panic!("{d:?}"),
    }
}

#[test]
fn copy_plans_match_eval_op_on_the_host() {
    use rlx_ir::Shape;
    let f = DType::F32;
    let mk = |dims: &[usize], seed: u32, dt: DType| -> Tensor {
        let n: usize = dims.iter().product();
        match dt {
            DType::F32 => Tensor::from_f32(
                dims,
                (0..n)
                    .map(|i| match (i as u32 + seed) % 9 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        k => (i as f32) * 0.37 - k as f32 + seed as f32,
                    })
                    .collect(),
            )
            .unwrap(),
            _ => Tensor::new(
                dims.to_vec(),
                TensorData::I64(
                    (0..n)
                        .map(|i| (i as i64 - 5) * 0x1_0000_0003 + seed as i64)
                        .collect(),
                ),
            )
            .unwrap(),
        }
    };
    type Case = (Op, Vec<Vec<usize>>, Vec<usize>, DType);
    let cases: Vec<Case> = vec![
        (
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            vec![vec![3, 5, 7]],
            vec![7, 3, 5],
            f,
        ),
        (
            Op::Transpose { perm: vec![1, 0] },
            vec![vec![3, 5]],
            vec![5, 3],
            DType::I64,
        ),
        (
            Op::Broadcast {
                dims: vec![3, 5, 4],
            },
            vec![vec![5, 1]],
            vec![3, 5, 4],
            f,
        ),
        (
            Op::Broadcast {
                dims: vec![2, 3, 4],
            },
            vec![vec![3, 1]],
            vec![2, 3, 4],
            DType::I64,
        ),
        (
            Op::Slice {
                starts: vec![6, 1],
                steps: vec![-2, 3],
                sizes: vec![4, 3],
            },
            vec![vec![7, 9]],
            vec![4, 3],
            f,
        ),
        (
            Op::Slice {
                starts: vec![2, 4, 6],
                steps: vec![-1, 1, -3],
                sizes: vec![3, 1, 3],
            },
            vec![vec![3, 5, 7]],
            vec![3, 1, 3],
            f,
        ),
        (
            Op::Tile {
                repeats: vec![2, 3],
            },
            vec![vec![7, 9]],
            vec![14, 27],
            f,
        ),
        (
            Op::Tile {
                repeats: vec![2, 1],
            },
            vec![vec![3, 5]],
            vec![6, 5],
            DType::I64,
        ),
        (
            Op::Pad {
                pads: vec![(1, 2), (2, 1)],
                mode: PadMode::Constant(-1.5),
            },
            vec![vec![7, 9]],
            vec![10, 12],
            f,
        ),
        (
            Op::Pad {
                pads: vec![(1, 2), (2, 1)],
                mode: PadMode::Edge,
            },
            vec![vec![7, 9]],
            vec![10, 12],
            f,
        ),
        (
            Op::Pad {
                pads: vec![(1, 2), (2, 1)],
                mode: PadMode::Reflect,
            },
            vec![vec![7, 9]],
            vec![10, 12],
            f,
        ),
        (
            Op::Pad {
                pads: vec![(1, 2), (2, 1)],
                mode: PadMode::Wrap,
            },
            vec![vec![7, 9]],
            vec![10, 12],
            f,
        ),
        (
            Op::Concat { axis: 1 },
            vec![vec![3, 5, 7], vec![3, 2, 7], vec![3, 1, 7]],
            vec![3, 8, 7],
            f,
        ),
        (
            Op::Concat { axis: 0 },
            vec![vec![3, 5], vec![2, 5]],
            vec![5, 5],
            DType::I64,
        ),
    ];
    for (op, ins, od, dt) in cases {
        let mut g = Graph::new("copy");
        let ids: Vec<NodeId> = ins
            .iter()
            .enumerate()
            .map(|(k, d)| g.input(&format!("x{k}"), Shape::new(d, dt)))
            .collect();
        let o = g.add_node(op.clone(), ids, Shape::new(&od, dt));
        let ts: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(k, d)| mk(d, k as u32 * 3 + 1, dt))
            .collect();
        let want = eval_op(&op, &ts.iter().collect::<Vec<_>>(), &g.node(o).shape).unwrap();
        let w = words_of(&want);
        let mut out = vec![0xdead_beefu32; w.len()];
        for (k, meta, cnt) in copy_plan(&g, o).unwrap() {
            emulate_copy_map(&words_of(&ts[k]), &mut out, cnt, &meta);
        }
        assert_eq!(out, w, "{op:?}");
    }
}

#[test]
fn every_kernel_name_is_in_the_source() {
    let src = kernels::source();
    for b in [
        rlx_ir::BinaryOp::Add,
        rlx_ir::BinaryOp::Max,
        rlx_ir::BinaryOp::Mod,
        rlx_ir::BinaryOp::Pow,
    ] {
        let n = kernels::binary_kernel(b).unwrap();
        assert!(src.contains(&format!("void {n}(")), "{n}");
    }
    for op in [
        Op::Unary(rlx_ir::UnaryOp::Log),
        Op::Unary(rlx_ir::UnaryOp::Sign),
        Op::Activation(rlx_ir::Activation::Relu),
        Op::Activation(rlx_ir::Activation::Selu {
            alpha: 1.5,
            gamma: 1.0,
        }),
    ] {
        let (n, _) = kernels::unary_kernel(&op).unwrap();
        assert!(src.contains(&format!("void {n}(")), "{n}");
    }
    for n in [
        "u_copy",
        "round_f16",
        "round_bf16",
        "nan_scan",
        "copy_map32",
        "reduce_rows",
    ] {
        assert!(src.contains(&format!("void {n}(")), "{n}");
    }
    assert!(kernels::unary_kernel(&Op::Unary(rlx_ir::UnaryOp::IsNaN)).is_none());
    assert!(kernels::binary_kernel(rlx_ir::BinaryOp::Lt).is_none());
}
