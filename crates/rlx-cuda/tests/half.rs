//! float16 and bfloat16 on CUDA (issue 30 items 2 and 4): values live as f32 words, kernels
//! compute in f32, and each computing node's output is rounded to its dtype. Expected values
//! come from the `half` crate's IEEE conversions and from f64 math, not from RLX's CPU
//! backend; the NaN/Inf report on a float16 overflow is the CPU backend's.

mod common;
use common::*;
use half::{bf16, f16};
use rlx_cuda::{CudaExecutor, Placement};
use rlx_ir::{BinaryOp, DType, Graph, Op, Shape, Tensor, TensorData, UnaryOp};

fn run_gpu(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut w = CudaExecutor::new(g.clone()).unwrap();
    let fallbacks: Vec<_> = w
        .placements()
        .into_iter()
        .filter(|(_, p)| matches!(p, Placement::CpuFallback { .. }))
        .collect();
    assert!(fallbacks.is_empty(), "{} fell back: {fallbacks:?}", g.name);
    w.run(inputs, None).unwrap()
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
    if !cuda_available() {
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
    if !cuda_available() {
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
    if !cuda_available() {
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

/// A float16 overflow localized on CUDA as on the CPU: (a*b) overflows to +inf at the Mul
/// (65520 and up), inf - inf gives NaN at the Sub; the device-side scan counts both and the
/// reports (node, cause, first index) equal the CPU backend's.
#[test]
fn f16_overflow_is_reported_at_the_same_node_as_on_the_cpu() {
    if !cuda_available() {
        return;
    }
    use rlx_ir::numeric_check::{DebugMode, DebugScanner};
    let n = 9;
    let dt = DType::F16;
    let mut g = Graph::new("f16_overflow");
    let a = g.input("a", Shape::new(&[n], dt));
    let b = g.input("b", Shape::new(&[n], dt));
    let p = g.binary(BinaryOp::Mul, a, b, Shape::new(&[n], dt));
    g.set_name(p, "mlp.up");
    let d = g.binary(BinaryOp::Sub, p, p, Shape::new(&[n], dt));
    g.set_name(d, "mlp.diff");
    g.set_outputs(vec![d]);
    let av: Vec<f64> = (0..n).map(|i| 100.0 + 60.0 * i as f64).collect();
    let bv: Vec<f64> = vec![300.0; n];
    let t = |v: &[f64]| Tensor::new(vec![n], TensorData::from_f64(dt, v)).unwrap();
    let ins = [t(&av), t(&bv)];
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    assert!(ex.placements().iter().all(|(_, p)| *p == Placement::Gpu));
    let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
    sc.set_print(false);
    let out = ex.run(&ins, Some(&mut sc)).unwrap();
    // f16(a*b) is +inf from a*b >= 65520, i.e. a >= 218.4: elements 2.. (a = 220, 280, ...).
    let want_inf: Vec<bool> = av.iter().map(|&x| x * 300.0 >= 65520.0).collect();
    let got = out[0].data().to_f32_vec();
    for (k, &w) in want_inf.iter().enumerate() {
        assert_eq!(got[k].is_nan(), w, "element {k}: {}", got[k]);
    }
    let c = sc.counts()[p.index()];
    assert_eq!(c.pos_inf, want_inf.iter().filter(|&&x| x).count());
    assert_eq!(c.first_pos_inf, want_inf.iter().position(|&x| x));
    let mut cpu = rlx_cpu::CpuExecutor::new(g.clone()).unwrap();
    let mut sc2 = DebugScanner::new(DebugMode::Warn, "cpu");
    sc2.set_print(false);
    cpu.run(&ins, Some(&mut sc2)).unwrap();
    assert_eq!(sc.counts(), sc2.counts());
    let key = |r: &[rlx_ir::numeric_check::NanReport]| -> Vec<_> {
        r.iter()
            .map(|r| (r.node, r.cause.clone(), r.index))
            .collect()
    };
    assert_eq!(key(sc.reports()), key(sc2.reports()));
    assert!(sc
        .reports()
        .iter()
        .any(|r| r.node == d && r.label == "mlp.diff"));
}

/// float16/bfloat16 MatMuls run on tensor cores from 16-bit copies of the operands: A times
/// the identity gives A back exactly (the conversion keeps every finite value of the dtype:
/// the largest, subnormals, ties), and a 64x96x80 product matches f64 math rounded to the
/// dtype within the dtype's round-off of an f32-accumulated sum.
#[test]
fn f16_and_bf16_matmul_on_tensor_cores() {
    if !cuda_available() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let q = |v: &[f32]| -> Vec<f32> {
            v.iter()
                .map(|&x| match dt {
                    DType::F16 => f16::from_f32(x).to_f32(),
                    _ => bf16::from_f32(x).to_f32(),
                })
                .collect()
        };
        let t = |d: &[usize], v: &[f32]| {
            Tensor::new(
                d.to_vec(),
                TensorData::from_f64(dt, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
            )
            .unwrap()
        };
        // Finite values of the dtype; f32-subnormal magnitudes (bfloat16 subnormals) left
        // out: a GPU may flush them.
        let mut av: Vec<f32> = q(&edges())
            .into_iter()
            .filter(|x| x.is_finite() && (*x == 0.0 || x.abs() >= f32::MIN_POSITIVE))
            .collect();
        let rows = (av.len() / 8).min(16);
        av.truncate(rows * 8);
        let mut eye = vec![0f32; 64];
        for i in 0..8 {
            eye[i * 8 + i] = 1.0;
        }
        let mut g = Graph::new("mm_eye");
        let x = g.input("a", Shape::new(&[rows, 8], dt));
        let e = g.input("i", Shape::new(&[8, 8], dt));
        let y = g.matmul(x, e, Shape::new(&[rows, 8], dt));
        g.set_outputs(vec![y]);
        let got = run_gpu(&g, &[t(&[rows, 8], &av), t(&[8, 8], &eye)]);
        let gv = got[0].data().to_f32_vec();
        for (k, (&w, &o)) in av.iter().zip(&gv).enumerate() {
            assert!(w == o, "{dt} A*I at {k}: {o:e}, want {w:e}");
        }
        // A larger product against f64.
        let (m, k, n) = (64, 96, 80);
        let a = q(&rand_vec(m * k, 41, -2.0, 2.0));
        let b = q(&rand_vec(k * n, 42, -2.0, 2.0));
        let mut g = Graph::new("mm_big");
        let x = g.input("a", Shape::new(&[m, k], dt));
        let w = g.input("b", Shape::new(&[k, n], dt));
        let y = g.matmul(x, w, Shape::new(&[m, n], dt));
        g.set_outputs(vec![y]);
        let got = run_gpu(&g, &[t(&[m, k], &a), t(&[k, n], &b)]);
        let gy = got[0].data().to_f32_vec();
        let eps = if dt == DType::F16 { 9.8e-4 } else { 7.8e-3 };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
                let scale: f64 = (0..k)
                    .map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs())
                    .sum();
                let d = (gy[i * n + j] as f64 - want).abs();
                // One rounding of the result plus f32 accumulation (far smaller).
                assert!(
                    d <= eps * want.abs() + 1e-5 * scale,
                    "{dt} [{i},{j}]: {} vs {want}",
                    gy[i * n + j]
                );
            }
        }
    }
}
