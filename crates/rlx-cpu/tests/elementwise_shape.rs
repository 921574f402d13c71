//! eval_op on elementwise and shape ops; expected values derived by hand / from the
//! ONNX operator definitions.

use half::f16;
use rlx_cpu::eval_op;
use rlx_ir::*;

fn f32t(d: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(d, v.to_vec()).unwrap()
}
fn i64t(d: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(d, v.to_vec()).unwrap()
}
fn ev(op: Op, ins: &[&Tensor], d: &[usize], dt: DType) -> Tensor {
    eval_op(&op, ins, &Shape::new(d, dt)).unwrap()
}
fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().to_vec()
}
fn i64s(t: &Tensor) -> Vec<i64> {
    match t.data() {
        TensorData::I64(v) => v.clone(),
        d => panic!("expected i64, got {d:?}"),
    }
}

#[test]
fn add_broadcasts_numpy_style() {
    // [2,1] + [3] -> [2,3]: out[i][j] = a[i] + b[j]
    let a = f32t(&[2, 1], &[10.0, 20.0]);
    let b = f32t(&[3], &[1.0, 2.0, 3.0]);
    let y = ev(Op::Binary(BinaryOp::Add), &[&a, &b], &[2, 3], DType::F32);
    assert_eq!(y.dims(), &[2, 3]);
    assert_eq!(f32s(&y), vec![11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
}

#[test]
fn large_broadcast_matches_formula() {
    // Exercise the parallel row path: [64,1,512] * [1,8,512]
    let a: Vec<f32> = (0..64 * 512).map(|i| (i % 97) as f32).collect();
    let b: Vec<f32> = (0..8 * 512).map(|i| (i % 13) as f32 - 6.0).collect();
    let ta = f32t(&[64, 1, 512], &a);
    let tb = f32t(&[1, 8, 512], &b);
    let y = ev(
        Op::Binary(BinaryOp::Mul),
        &[&ta, &tb],
        &[64, 8, 512],
        DType::F32,
    );
    let y = f32s(&y);
    for i in 0..64 {
        for j in 0..8 {
            for k in 0..512 {
                assert_eq!(y[(i * 8 + j) * 512 + k], a[i * 512 + k] * b[j * 512 + k]);
            }
        }
    }
}

#[test]
fn integer_shape_arithmetic() {
    let a = i64t(&[3], &[7, -7, 6]);
    let b = i64t(&[], &[2]);
    let d = ev(Op::Binary(BinaryOp::Div), &[&a, &b], &[3], DType::I64);
    assert_eq!(i64s(&d), vec![3, -3, 3]); // truncates toward zero
    let m = ev(Op::Binary(BinaryOp::Mod), &[&a, &b], &[3], DType::I64);
    assert_eq!(i64s(&m), vec![1, 1, 0]); // Python % (sign of divisor)
    let e = ev(Op::Binary(BinaryOp::Eq), &[&a, &b], &[3], DType::Bool);
    assert_eq!(e.data(), &TensorData::Bool(vec![false, false, false]));
    let lt = ev(Op::Binary(BinaryOp::Lt), &[&a, &b], &[3], DType::Bool);
    assert_eq!(lt.data(), &TensorData::Bool(vec![false, true, false]));
}

#[test]
fn bool_logic() {
    let a = Tensor::new(vec![4], TensorData::Bool(vec![false, false, true, true])).unwrap();
    let b = Tensor::new(vec![4], TensorData::Bool(vec![false, true, false, true])).unwrap();
    let and = ev(Op::Binary(BinaryOp::And), &[&a, &b], &[4], DType::Bool);
    let or = ev(Op::Binary(BinaryOp::Or), &[&a, &b], &[4], DType::Bool);
    let xor = ev(Op::Binary(BinaryOp::Xor), &[&a, &b], &[4], DType::Bool);
    let not = ev(Op::Unary(UnaryOp::Not), &[&a], &[4], DType::Bool);
    assert_eq!(
        and.data(),
        &TensorData::Bool(vec![false, false, false, true])
    );
    assert_eq!(or.data(), &TensorData::Bool(vec![false, true, true, true]));
    assert_eq!(
        xor.data(),
        &TensorData::Bool(vec![false, true, true, false])
    );
    assert_eq!(
        not.data(),
        &TensorData::Bool(vec![true, true, false, false])
    );
}

#[test]
fn relu_and_max_propagate_nan() {
    let x = f32t(&[3], &[f32::NAN, -1.0, 2.0]);
    let y = f32s(&ev(
        Op::Activation(Activation::Relu),
        &[&x],
        &[3],
        DType::F32,
    ));
    assert!(y[0].is_nan());
    assert_eq!(&y[1..], &[0.0, 2.0]);
    let z = f32t(&[3], &[0.0, f32::NAN, 1.0]);
    let m = f32s(&ev(Op::Binary(BinaryOp::Max), &[&x, &z], &[3], DType::F32));
    assert!(m[0].is_nan() && m[1].is_nan());
    assert_eq!(m[2], 2.0);
    let mn = f32s(&ev(Op::Binary(BinaryOp::Min), &[&x, &z], &[3], DType::F32));
    assert!(mn[0].is_nan() && mn[1].is_nan());
    assert_eq!(mn[2], 1.0);
}

#[test]
fn f16_mul_overflows_to_inf_at_the_op() {
    let a = Tensor::new(vec![1], TensorData::F16(vec![f16::from_f32(300.0)])).unwrap();
    let y = ev(Op::Binary(BinaryOp::Mul), &[&a, &a], &[1], DType::F16);
    assert_eq!(y.dtype(), DType::F16);
    match y.data() {
        TensorData::F16(v) => assert!(v[0].is_infinite() && v[0].is_sign_positive()),
        _ => unreachable!(),
    }
}

#[test]
fn unary_on_f64_and_predicates() {
    let x = Tensor::new(
        vec![3],
        TensorData::F64(vec![4.0, f64::NAN, f64::NEG_INFINITY]),
    )
    .unwrap();
    let s = ev(Op::Unary(UnaryOp::Sqrt), &[&x], &[3], DType::F64);
    let v = s.data().to_f64_vec();
    assert_eq!(v[0], 2.0);
    assert!(v[1].is_nan() && v[2].is_nan());
    let n = ev(Op::Unary(UnaryOp::IsNaN), &[&x], &[3], DType::Bool);
    assert_eq!(n.data(), &TensorData::Bool(vec![false, true, false]));
    let i = ev(
        Op::Unary(UnaryOp::IsInf {
            pos: false,
            neg: true,
        }),
        &[&x],
        &[3],
        DType::Bool,
    );
    assert_eq!(i.data(), &TensorData::Bool(vec![false, false, true]));
    // Round half to even.
    let r = f32t(&[4], &[0.5, 1.5, 2.5, -0.5]);
    let r = f32s(&ev(Op::Unary(UnaryOp::Round), &[&r], &[4], DType::F32));
    assert_eq!(r, vec![0.0, 2.0, 2.0, -0.0]);
}

#[test]
fn select_and_cast() {
    let c = Tensor::new(vec![2, 1], TensorData::Bool(vec![true, false])).unwrap();
    let t = f32t(&[2], &[1.0, 2.0]);
    let f = f32t(&[], &[-1.0]);
    let y = f32s(&ev(Op::Select, &[&c, &t, &f], &[2, 2], DType::F32));
    assert_eq!(y, vec![1.0, 2.0, -1.0, -1.0]);
    let x = f32t(&[4], &[-1.7, 1.7, 0.0, f32::NAN]);
    let ci = ev(
        Op::Cast {
            to: DType::I64,
            saturate: true,
        },
        &[&x],
        &[4],
        DType::I64,
    );
    assert_eq!(i64s(&ci), vec![-1, 1, 0, 0]);
    let cb = ev(
        Op::Cast {
            to: DType::Bool,
            saturate: true,
        },
        &[&x],
        &[4],
        DType::Bool,
    );
    assert_eq!(cb.data(), &TensorData::Bool(vec![true, true, false, true]));
}

#[test]
fn transpose_reshape_broadcast() {
    let x = i64t(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    let t = ev(
        Op::Transpose { perm: vec![1, 0] },
        &[&x],
        &[3, 2],
        DType::I64,
    );
    assert_eq!(i64s(&t), vec![0, 3, 1, 4, 2, 5]);
    let r = ev(Op::Reshape { dims: vec![3, 2] }, &[&x], &[3, 2], DType::I64);
    assert_eq!(i64s(&r), vec![0, 1, 2, 3, 4, 5]);
    let b = i64t(&[3, 1], &[1, 2, 3]);
    let e = ev(
        Op::Broadcast {
            dims: vec![2, 3, 2],
        },
        &[&b],
        &[2, 3, 2],
        DType::I64,
    );
    assert_eq!(i64s(&e), vec![1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3]);
    // 3-D transpose against index formula
    let v: Vec<i64> = (0..24).collect();
    let x = i64t(&[2, 3, 4], &v);
    let t = i64s(&ev(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[&x],
        &[4, 2, 3],
        DType::I64,
    ));
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                assert_eq!(t[(a * 2 + b) * 3 + c], v[(b * 3 + c) * 4 + a]);
            }
        }
    }
}

#[test]
fn concat_slice_pad_tile() {
    let a = i64t(&[1, 2], &[1, 2]);
    let b = i64t(&[2, 2], &[3, 4, 5, 6]);
    let c = ev(Op::Concat { axis: 0 }, &[&a, &b], &[3, 2], DType::I64);
    assert_eq!(i64s(&c), vec![1, 2, 3, 4, 5, 6]);
    let c1 = ev(Op::Concat { axis: 1 }, &[&b, &b], &[2, 4], DType::I64);
    assert_eq!(i64s(&c1), vec![3, 4, 3, 4, 5, 6, 5, 6]);
    // x[::-2] of [0..5]
    let x = i64t(&[5], &[0, 1, 2, 3, 4]);
    let s = ev(
        Op::Slice {
            starts: vec![4],
            steps: vec![-2],
            sizes: vec![3],
        },
        &[&x],
        &[3],
        DType::I64,
    );
    assert_eq!(i64s(&s), vec![4, 2, 0]);
    let x = i64t(&[3], &[1, 2, 3]);
    let pad = |mode| {
        i64s(&ev(
            Op::Pad {
                pads: vec![(2, 2)],
                mode,
            },
            &[&x],
            &[7],
            DType::I64,
        ))
    };
    assert_eq!(pad(PadMode::Constant(9.0)), vec![9, 9, 1, 2, 3, 9, 9]);
    assert_eq!(pad(PadMode::Edge), vec![1, 1, 1, 2, 3, 3, 3]);
    assert_eq!(pad(PadMode::Reflect), vec![3, 2, 1, 2, 3, 2, 1]);
    assert_eq!(pad(PadMode::Wrap), vec![2, 3, 1, 2, 3, 1, 2]);
    let t = ev(Op::Tile { repeats: vec![2] }, &[&x], &[6], DType::I64);
    assert_eq!(i64s(&t), vec![1, 2, 3, 1, 2, 3]);
}

#[test]
fn gather_and_errors() {
    let data = i64t(&[3, 2], &[1, 2, 3, 4, 5, 6]);
    let idx = i64t(&[2], &[-1, 0]);
    let g = ev(Op::Gather { axis: 0 }, &[&data, &idx], &[2, 2], DType::I64);
    assert_eq!(i64s(&g), vec![5, 6, 1, 2]);
    let sc = i64t(&[], &[1]);
    let g1 = ev(Op::Gather { axis: 1 }, &[&data, &sc], &[3], DType::I64);
    assert_eq!(i64s(&g1), vec![2, 4, 6]);
    let bad = i64t(&[1], &[3]);
    let e = eval_op(
        &Op::Gather { axis: 0 },
        &[&data, &bad],
        &Shape::new(&[1, 2], DType::I64),
    );
    assert!(e.is_err());
    // GatherElements (ONNX spec example 1)
    let d = i64t(&[2, 2], &[1, 2, 3, 4]);
    let ix = i64t(&[2, 2], &[0, 0, 1, 0]);
    let ge = ev(
        Op::GatherElements { axis: 1 },
        &[&d, &ix],
        &[2, 2],
        DType::I64,
    );
    assert_eq!(i64s(&ge), vec![1, 1, 4, 3]);
    // leaves are not kernels
    assert!(eval_op(
        &Op::Input { name: "x".into() },
        &[],
        &Shape::new(&[1], DType::F32)
    )
    .is_err());
}

#[test]
fn reduce_and_cumsum() {
    let x = i64t(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let s = ev(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        },
        &[&x],
        &[2],
        DType::I64,
    );
    assert_eq!(i64s(&s), vec![6, 15]);
    let p = ev(
        Op::Reduce {
            kind: ReduceKind::Prod,
            axes: vec![0, 1],
            keepdims: true,
        },
        &[&x],
        &[1, 1],
        DType::I64,
    );
    assert_eq!(i64s(&p), vec![720]);
    let xf = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, f32::NAN, 6.0]);
    let m = f32s(&ev(
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: vec![1],
            keepdims: false,
        },
        &[&xf],
        &[2],
        DType::F32,
    ));
    assert_eq!(m[0], 3.0);
    assert!(m[1].is_nan());
    let mean = f32s(&ev(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![0],
            keepdims: false,
        },
        &[&xf],
        &[3],
        DType::F32,
    ));
    assert_eq!(mean[0], 2.5);
    assert!(mean[1].is_nan());
    let c = ev(
        Op::CumSum {
            axis: 1,
            exclusive: false,
            reverse: false,
        },
        &[&x],
        &[2, 3],
        DType::I64,
    );
    assert_eq!(i64s(&c), vec![1, 3, 6, 4, 9, 15]);
    let c = ev(
        Op::CumSum {
            axis: 1,
            exclusive: true,
            reverse: true,
        },
        &[&x],
        &[2, 3],
        DType::I64,
    );
    assert_eq!(i64s(&c), vec![5, 3, 0, 11, 6, 0]);
}

#[test]
fn bitcast_reinterprets_bits() {
    // IEEE-754: 1.0f32 = 0x3F800000, -2.0f32 = 0xC0000000, 1.0f64 = 0x3FF0000000000000.
    let x = f32t(&[2], &[1.0, -2.0]);
    let y = ev(Op::BitCast { to: DType::I32 }, &[&x], &[2], DType::I32);
    assert_eq!(
        y.data(),
        &TensorData::I32(vec![0x3F80_0000, 0xC000_0000u32 as i32])
    );
    let back = ev(Op::BitCast { to: DType::F32 }, &[&y], &[2], DType::F32);
    assert_eq!(f32s(&back), vec![1.0, -2.0]);
    let d = Tensor::new(vec![1], TensorData::F64(vec![1.0])).unwrap();
    let u = ev(Op::BitCast { to: DType::U64 }, &[&d], &[1], DType::U64);
    assert_eq!(u.data(), &TensorData::U64(vec![0x3FF0_0000_0000_0000]));
    // u16 0xFFFF is i16 -1; i8 -1 is u8 255; bool true/false are bytes 1/0.
    let h = Tensor::new(vec![2], TensorData::U16(vec![0xFFFF, 7])).unwrap();
    let i = ev(Op::BitCast { to: DType::I16 }, &[&h], &[2], DType::I16);
    assert_eq!(i.data(), &TensorData::I16(vec![-1, 7]));
    let b = Tensor::new(vec![2], TensorData::Bool(vec![true, false])).unwrap();
    let bu = ev(Op::BitCast { to: DType::U8 }, &[&b], &[2], DType::U8);
    assert_eq!(bu.data(), &TensorData::U8(vec![1, 0]));
    // Different widths are an error, not a panic.
    let bad = eval_op(
        &Op::BitCast { to: DType::I64 },
        &[&x],
        &Shape::new(&[2], DType::I64),
    );
    assert!(bad.is_err());
}

/// f32 ReduceMax/ReduceMin over rows long enough for the 16-lane loop (and its remainder),
/// against NumPy's `np.max`/`np.min` rule: NaN if any element is NaN, else the extreme,
/// infinities included. NaN is planted in the vector part, in the remainder, or nowhere.
#[test]
fn reduce_max_min_long_rows_follow_numpy() {
    for len in [16usize, 37, 160] {
        for plant in [None, Some(5), Some(len - 1)] {
            let mut v: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.5)
                .collect();
            if len == 160 {
                v[len / 2] = f32::INFINITY;
                v[len / 3] = f32::NEG_INFINITY;
            } else {
                v[len - 2] = 100.0; // the max sits in the remainder (len 37) or last lane
                v[len / 2] = -100.0;
            }
            if let Some(p) = plant {
                v[p] = f32::NAN;
            }
            let x = f32t(&[1, len], &v);
            let finite_max = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let finite_min = v.iter().fold(f32::INFINITY, |a, &b| a.min(b));
            for (kind, want) in [(ReduceKind::Max, finite_max), (ReduceKind::Min, finite_min)] {
                let got = f32s(&ev(
                    Op::Reduce {
                        kind,
                        axes: vec![1],
                        keepdims: false,
                    },
                    &[&x],
                    &[1],
                    DType::F32,
                ))[0];
                if plant.is_some() {
                    assert!(got.is_nan(), "{kind:?} len {len} NaN at {plant:?}: {got}");
                } else {
                    assert_eq!(got, want, "{kind:?} len {len}");
                }
            }
        }
    }
}

/// Where with each operand either full-size or broadcast along the inner axis (the row
/// loops specialized per stride pattern, and the general one): every element is
/// `c ? t : f` read through NumPy broadcasting, computed here index by index.
#[test]
fn where_broadcast_patterns_match_numpy_indexing() {
    let (r, k) = (3usize, 37usize);
    let full = |seed: usize| -> Vec<f32> { (0..r * k).map(|i| (i * 7 + seed) as f32).collect() };
    let cfull: Vec<bool> = (0..r * k).map(|i| (i * 5) % 3 == 0).collect();
    for mask in 0..8u32 {
        let (c_full, t_full, f_full) = (mask & 1 != 0, mask & 2 != 0, mask & 4 != 0);
        // A broadcast operand is [r, 1]: one value per row.
        let cv: Vec<bool> = if c_full {
            cfull.clone()
        } else {
            (0..r).map(|i| i % 2 == 0).collect()
        };
        let tv: Vec<f32> = if t_full {
            full(1)
        } else {
            (0..r).map(|i| 1000.0 + i as f32).collect()
        };
        let fv: Vec<f32> = if f_full {
            full(2)
        } else {
            (0..r).map(|i| -1000.0 - i as f32).collect()
        };
        let dims = |is_full: bool| if is_full { vec![r, k] } else { vec![r, 1] };
        let c = Tensor::new(dims(c_full), TensorData::Bool(cv.clone())).unwrap();
        let t = f32t(&dims(t_full), &tv);
        let f = f32t(&dims(f_full), &fv);
        let y = f32s(&ev(Op::Select, &[&c, &t, &f], &[r, k], DType::F32));
        for i in 0..r {
            for j in 0..k {
                let at = |is_full: bool| if is_full { i * k + j } else { i };
                let want = if cv[at(c_full)] {
                    tv[at(t_full)]
                } else {
                    fv[at(f_full)]
                };
                assert_eq!(y[i * k + j], want, "pattern {mask} at ({i},{j})");
            }
        }
    }
}

/// Transposes large enough for the tiled gather (a strided inner dim over blocks of at least
/// 32 rows, column tiles of 64), with sizes that are not multiples of the tile, against the
/// index formula: `out[i][j] = in[j][i]`, and a 3-D perm whose inner dim is strided.
#[test]
fn tiled_transposes_match_the_index_formula() {
    for (k, n) in [
        (70usize, 130usize),
        (768, 97),
        (33, 1000),
        (1, 200),
        (200, 1),
    ] {
        let v: Vec<i64> = (0..(k * n) as i64).collect();
        let x = i64t(&[k, n], &v);
        let t = i64s(&ev(
            Op::Transpose { perm: vec![1, 0] },
            &[&x],
            &[n, k],
            DType::I64,
        ));
        for i in 0..n {
            for j in 0..k {
                assert_eq!(t[i * k + j], (j * n + i) as i64, "[{k}, {n}] at ({i}, {j})");
            }
        }
    }
    let (a, b, c) = (5usize, 37usize, 90usize);
    let v: Vec<i64> = (0..(a * b * c) as i64).collect();
    let x = i64t(&[a, b, c], &v);
    // perm [2, 0, 1]: out[z][x][y] = in[x][y][z]
    let t = i64s(&ev(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[&x],
        &[c, a, b],
        DType::I64,
    ));
    for z in 0..c {
        for xx in 0..a {
            for y in 0..b {
                assert_eq!(t[(z * a + xx) * b + y], ((xx * b + y) * c + z) as i64);
            }
        }
    }
}
