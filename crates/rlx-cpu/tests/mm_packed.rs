//! f32 MatMuls against constant weights read those weights packed once in column panels
//! (`CpuExecutor::packed_matmuls`, `kernels::mm_packed`; AMD with AVX-512 only). Checked: the
//! product against the f64 definition within f32 summation's bound, at 1 and 3 threads;
//! which MatMuls take the panels (a [K, N] constant, enough rows); and that the scanner's
//! report of a NaN in the activations names the same MatMul and index as without panels.

mod common;

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

fn data(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + salt) * 7919) % 1013) as f32 / 300.0 - 1.7)
        .collect()
}

/// `y = x · W` with x: [batch, rows, K] an input and W: [K, N] a constant.
fn graph(batch: usize, rows: usize, k: usize, n: usize, w: &[f32]) -> Graph {
    let mut g = Graph::new("linear");
    let x = g.input("x", Shape::new(&[batch, rows, k], DType::F32));
    let w = g.constant(Tensor::from_f32(&[k, n], w.to_vec()).unwrap());
    let y = g.add_node(
        Op::MatMul,
        vec![x, w],
        Shape::new(&[batch, rows, n], DType::F32),
    );
    g.set_name(y, "dense.matmul");
    g.set_outputs(vec![y]);
    g
}

fn panels_on() -> bool {
    rlx_kernels::kernels::mm_packed::panel_width().is_some()
}

#[test]
fn a_matmul_against_constant_weights_reads_them_in_panels() {
    // 120 rows over two leading dims with a 36-column tail; 64 rows and a K of 1; 60 rows
    // (under the bound) and a W narrower than a panel: not taken.
    for (batch, rows, k, n, taken) in [
        (3, 40, 96, 100, 1),
        (2, 32, 1, 64, 1),
        (3, 20, 48, 128, 0),
        (1, 64, 30, 63, 0),
    ] {
        let (w, x) = (data(k * n, 1), data(batch * rows * k, 2));
        let taken = if panels_on() { taken } else { 0 };
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut ex = CpuExecutor::new(graph(batch, rows, k, n, &w)).unwrap();
            assert_eq!(ex.packed_matmuls(), taken, "{batch}x{rows}x{k}x{n}");
            let xt = Tensor::from_f32(&[batch, rows, k], x.clone()).unwrap();
            let y = pool.install(|| ex.run(&[xt], None)).unwrap();
            let y = y[0].as_f32().unwrap();
            for i in 0..batch * rows {
                for j in 0..n {
                    let (mut want, mut scale) = (0f64, 0f64);
                    for t in 0..k {
                        let p = x[i * k + t] as f64 * w[t * n + j] as f64;
                        want += p;
                        scale += p.abs();
                    }
                    let got = y[i * n + j] as f64;
                    let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * scale;
                    assert!(
                        (got - want).abs() <= tol,
                        "{batch}x{rows}x{k}x{n} at {threads} threads [{i}, {j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_transposed_operand_read_in_place_keeps_gemm() {
    // `Transpose(x) · W`: the MatMul reads x through strides (`matmul_perm`), so W is not
    // packed for it; the product is still the definition's.
    let (k, rows, n) = (24, 80, 64);
    let w = data(k * n, 5);
    let x = data(k * rows, 6);
    let mut g = Graph::new("t_linear");
    let xi = g.input("x", Shape::new(&[k, rows], DType::F32));
    let xt = g.add_node(
        Op::Transpose { perm: vec![1, 0] },
        vec![xi],
        Shape::new(&[rows, k], DType::F32),
    );
    let wc = g.constant(Tensor::from_f32(&[k, n], w.clone()).unwrap());
    let y = g.add_node(Op::MatMul, vec![xt, wc], Shape::new(&[rows, n], DType::F32));
    g.set_outputs(vec![y]);
    let mut ex = CpuExecutor::new(g).unwrap();
    assert_eq!((ex.packed_matmuls(), ex.transposes_read_in_place()), (0, 1));
    let y = ex
        .run(&[Tensor::from_f32(&[k, rows], x.clone()).unwrap()], None)
        .unwrap();
    let y = y[0].as_f32().unwrap();
    for i in 0..rows {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|t| x[t * rows + i] as f64 * w[t * n + j] as f64)
                .sum();
            assert!((y[i * n + j] as f64 - want).abs() <= 1e-4, "[{i}, {j}]");
        }
    }
}

#[test]
fn a_nan_made_by_the_matmul_is_reported_there() {
    // Row 47 of x holds +inf twice (columns 5 and 6): output (47, j) is inf·w[5, j] +
    // inf·w[6, j], NaN where the two weights differ in sign (made by the MatMul), ±inf
    // elsewhere; every other output is finite.
    let (batch, rows, k, n) = (2, 40, 24, 70);
    let w = data(k * n, 3);
    let mut x = data(batch * rows * k, 4);
    x[47 * k + 5] = f32::INFINITY;
    x[47 * k + 6] = f32::INFINITY;
    let xt = Tensor::from_f32(&[batch, rows, k], x).unwrap();
    let nan_at: Vec<usize> = (0..n)
        .filter(|&j| (w[5 * n + j] > 0.0) != (w[6 * n + j] > 0.0))
        .map(|j| 47 * n + j)
        .collect();
    assert!(!nan_at.is_empty());
    let mut reports = vec![];
    for fuse in [true, false] {
        let mut ex = CpuExecutor::new(graph(batch, rows, k, n, &w)).unwrap();
        ex.set_fusion(fuse);
        let (r, y) = common::run_scanned(&mut ex, std::slice::from_ref(&xt), DebugMode::Warn);
        let nans: Vec<usize> = (0..y.len()).filter(|&i| y[i].is_nan()).collect();
        assert_eq!(nans, nan_at);
        let bad: Vec<usize> = (0..y.len()).filter(|&i| !y[i].is_finite()).collect();
        assert_eq!(bad, (47 * n..48 * n).collect::<Vec<_>>());
        reports.push(r);
    }
    assert_eq!(reports[0], reports[1]);
    // The MatMul's first NaN (an inf fed in is not a report of its own).
    let at: Vec<(usize, &str)> = reports[0].iter().map(|r| (r.1, r.2.as_str())).collect();
    assert_eq!(at, [(nan_at[0], "dense.matmul")]);
}
