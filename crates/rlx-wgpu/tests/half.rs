//! float16 and bfloat16 on the GPU (issue 30 item 6): values live as f32 words, kernels
//! compute in f32, and each node's output is rounded to its dtype. Expected values come from
//! the `half` crate's IEEE conversions and from f64 math, not from RLX's CPU backend.

mod common;
use common::*;
use half::{bf16, f16};
use rlx_ir::{BinaryOp, DType, Graph, Op, Shape, Tensor, TensorData, UnaryOp};
use rlx_wgpu::{Placement, WgpuExecutor};

fn run_gpu(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut w = WgpuExecutor::new(g.clone()).unwrap();
    let fallbacks: Vec<_> = w
        .placements()
        .into_iter()
        .filter(|(_, p)| matches!(p, Placement::CpuFallback { .. }))
        .collect();
    assert!(fallbacks.is_empty(), "{} fell back: {fallbacks:?}", g.name);
    let out = w.run(inputs, None).unwrap();
    assert_no_uncaptured();
    out
}

fn cast(g: &mut Graph, x: rlx_ir::NodeId, dims: &[usize], to: DType) -> rlx_ir::NodeId {
    g.add_node(
        Op::Cast {
            to,
            saturate: false,
        },
        vec![x],
        Shape::new(dims, to),
    )
}

/// Values at every rounding edge of float16 and bfloat16: the overflow threshold (65520
/// rounds to inf, 65519.99 to 65504), ties to even, subnormals and their underflow, signed
/// zeros, NaN and the infinities.
fn edges() -> Vec<f32> {
    let mut v = vec![
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e6,
        f32::MAX,
        1.0 + 1.0 / 2048.0, // tie between 1 and 1 + 2^-10: to even (1)
        1.0 + 3.0 / 2048.0, // tie: to even (1 + 2^-9)
        1.0 + 1.0 / 256.0,  // a bfloat16 tie (1 + 2^-8): to even (1)
        1.0 + 3.0 / 256.0,  // a bfloat16 tie: to even (1 + 2^-6)
        5.960_464_5e-8,     // 2^-24, the smallest f16 subnormal
        2.980_232_2e-8,     // 2^-25: a tie to 0
        4.470_348_4e-8,     // 1.5 * 2^-25: rounds up to 2^-24
        1e-5,               // an f16 subnormal
        6.103_515_6e-5,     // 2^-14, the smallest f16 normal
        6.097_555e-5,       // just below it: rounds to it or to the largest subnormal
        -0.0,
        0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.1,
        -3.25,
        1e-40, // an f32 subnormal: 0 in f16; bf16 keeps f32's exponent range
    ];
    v.extend(rand_vec(64, 7, -70000.0, 70000.0));
    v.extend(rand_vec(64, 8, -1e-4, 1e-4));
    v
}

fn same(what: &str, got: f32, want: f32) {
    let ok = if want.is_nan() {
        got.is_nan()
    } else {
        got.to_bits() == want.to_bits()
            // a GPU may flush an f32 subnormal input to zero; f16 of it is ±0 either way
            || (want == 0.0 && got == 0.0)
    };
    assert!(
        ok,
        "{what}: got {got:e} ({:#x}), want {want:e} ({:#x})",
        got.to_bits(),
        want.to_bits()
    );
}

#[test]
fn cast_to_f16_and_bf16_rounds_like_ieee() {
    if !gpu_available() {
        return;
    }
    let v = edges();
    let n = v.len();
    let mut g = Graph::new("round");
    let x = g.input("x", Shape::new(&[n], DType::F32));
    let h = cast(&mut g, x, &[n], DType::F16);
    let b = cast(&mut g, x, &[n], DType::BF16);
    g.set_outputs(vec![h, b]);
    let out = run_gpu(&g, &[Tensor::from_f32(&[n], v.clone()).unwrap()]);
    let (TensorData::F16(h), TensorData::BF16(b)) = (out[0].data(), out[1].data()) else {
        panic!("dtypes: {} {}", out[0].dtype(), out[1].dtype());
    };
    for (k, &x) in v.iter().enumerate() {
        same(
            &format!("f16({x:e})"),
            h[k].to_f32(),
            f16::from_f32(x).to_f32(),
        );
        same(
            &format!("bf16({x:e})"),
            b[k].to_f32(),
            bf16::from_f32(x).to_f32(),
        );
    }
}

/// a*b, a+b, a-b of float16 values are exact in f32 (11-bit significands), so rounding once to
/// float16 is IEEE float16 arithmetic: bit-exact against `half`, overflow to inf included.
#[test]
fn f16_and_bf16_arithmetic_is_ieee_per_op() {
    if !gpu_available() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let n = 256;
        let a: Vec<f32> = rand_vec(n, 11, -400.0, 400.0);
        let b: Vec<f32> = rand_vec(n, 12, -400.0, 400.0);
        let q =
            |v: &[f32]| TensorData::from_f64(dt, &v.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let (ta, tb) = (
            Tensor::new(vec![n], q(&a)).unwrap(),
            Tensor::new(vec![n], q(&b)).unwrap(),
        );
        let (av, bv) = (ta.data().to_f32_vec(), tb.data().to_f32_vec());
        let mut g = Graph::new("arith");
        let x = g.input("a", Shape::new(&[n], dt));
        let y = g.input("b", Shape::new(&[n], dt));
        let ops = [BinaryOp::Mul, BinaryOp::Add, BinaryOp::Sub];
        let outs: Vec<_> = ops
            .iter()
            .map(|&o| g.binary(o, x, y, Shape::new(&[n], dt)))
            .collect();
        // (a*b)*(a*b) overflows float16 for |ab| > 256: inf where f32 would not.
        let sq = g.binary(BinaryOp::Mul, outs[0], outs[0], Shape::new(&[n], dt));
        let mut all = outs.clone();
        all.push(sq);
        g.set_outputs(all);
        let got = run_gpu(&g, &[ta, tb]);
        let round = |x: f32| match dt {
            DType::F16 => f16::from_f32(x).to_f32(),
            _ => bf16::from_f32(x).to_f32(),
        };
        for k in 0..n {
            let p = round(av[k] * bv[k]);
            let want = [p, round(av[k] + bv[k]), round(av[k] - bv[k]), round(p * p)];
            for (j, w) in want.iter().enumerate() {
                let o = got[j].data().to_f32_vec()[k];
                same(
                    &format!("{dt} op {j} at {k} ({} , {})", av[k], bv[k]),
                    o,
                    *w,
                );
            }
        }
        if dt == DType::F16 {
            let inf = got[3]
                .data()
                .to_f32_vec()
                .iter()
                .filter(|x| x.is_infinite())
                .count();
            assert!(inf > 0, "some (a*b)^2 must overflow float16");
        }
    }
}

/// MatMul, ReduceSum and Exp in float16: against f64 math rounded once to float16, within the
/// float16 round-off of an f32-accumulated sum (2 ulps of the result's scale).
#[test]
fn f16_matmul_reduce_exp_match_f64_within_f16_roundoff() {
    if !gpu_available() {
        return;
    }
    let (m, k, n) = (5, 37, 6);
    let q = |v: Vec<f32>| {
        v.iter()
            .map(|&x| f16::from_f32(x).to_f32())
            .collect::<Vec<_>>()
    };
    let a = q(rand_vec(m * k, 21, -1.0, 1.0));
    let b = q(rand_vec(k * n, 22, -1.0, 1.0));
    let t = |d: &[usize], v: &[f32]| {
        Tensor::new(
            d.to_vec(),
            TensorData::from_f64(DType::F16, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        )
        .unwrap()
    };
    let mut g = Graph::new("mm16");
    let x = g.input("a", Shape::new(&[m, k], DType::F16));
    let w = g.input("b", Shape::new(&[k, n], DType::F16));
    let y = g.matmul(x, w, Shape::new(&[m, n], DType::F16));
    let s = g.add_node(
        Op::Reduce {
            kind: rlx_ir::ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        },
        vec![x],
        Shape::new(&[m], DType::F16),
    );
    let e = g.unary(UnaryOp::Exp, x, Shape::new(&[m, k], DType::F16));
    g.set_outputs(vec![y, s, e]);
    let got = run_gpu(&g, &[t(&[m, k], &a), t(&[k, n], &b)]);
    let ulp = |x: f64| {
        let h = f16::from_f64(x.abs());
        (f16::from_bits(h.to_bits() + 1).to_f64() - h.to_f64()).max(6e-8)
    };
    let gy = got[0].data().to_f32_vec();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            let d = (gy[i * n + j] as f64 - want).abs();
            assert!(
                d <= 2.0 * ulp(want),
                "matmul [{i},{j}]: {} vs {want}",
                gy[i * n + j]
            );
        }
        let want: f64 = (0..k).map(|p| a[i * k + p] as f64).sum();
        let gs = got[1].data().to_f32_vec()[i] as f64;
        assert!(
            (gs - want).abs() <= 2.0 * ulp(want),
            "sum [{i}]: {gs} vs {want}"
        );
    }
    let ge = got[2].data().to_f32_vec();
    for (p, &x) in a.iter().enumerate() {
        let want = (x as f64).exp();
        assert!(
            (ge[p] as f64 - want).abs() <= ulp(want),
            "exp({x}): {} vs {want}",
            ge[p]
        );
    }
}
