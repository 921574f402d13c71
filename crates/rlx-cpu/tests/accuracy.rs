//! Reductions accumulate in f64: a long f32 sum must not drift (a running f32 sum of 0.1
//! stops near 2^21 growth steps and is off by ~9% after 1e7 terms).

use rlx_cpu::eval_op;
use rlx_ir::{DType, Op, ReduceKind, Shape, Tensor};

#[test]
fn long_f32_sum_and_mean_are_accurate() {
    let n = 10_000_000usize;
    let x = Tensor::from_f32(&[n], vec![0.1f32; n]).unwrap();
    let out = Shape::new(&[], DType::F32);
    let sum = eval_op(
        &Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
            keepdims: false,
        },
        &[&x],
        &out,
    )
    .unwrap();
    // Exact: n * f32(0.1) = 1000000.0149..., which rounds to 1e6 in f32.
    let exact = n as f64 * 0.1f32 as f64;
    assert!(
        (sum.as_f32().unwrap()[0] as f64 - exact).abs() < 0.5,
        "{:?}",
        sum.as_f32()
    );
    let mean = eval_op(
        &Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![0],
            keepdims: false,
        },
        &[&x],
        &out,
    )
    .unwrap();
    assert!(
        (mean.as_f32().unwrap()[0] as f64 - 0.1f32 as f64).abs() < 1e-7,
        "{:?}",
        mean.as_f32()
    );
}
