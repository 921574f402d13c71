//! Rough per-inference overhead check on a tiny attention-like block (run with
//! `cargo test -p rlx-cpu --release --test perf_smoke -- --ignored --nocapture`).

use rlx_cpu::CpuExecutor;
use rlx_ir::*;

#[test]
#[ignore]
fn tiny_block_latency() {
    let s = |d: &[usize]| Shape::new(d, DType::F32);
    let (t, h) = (16, 64);
    let mut g = Graph::new("blk");
    let x = g.input("x", s(&[1, t, h]));
    let w = g.param("w", s(&[h, h]));
    let q = g.matmul(x, w, s(&[1, t, h]));
    let kt = g.add_node(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        vec![q],
        s(&[1, h, t]),
    );
    let a = g.matmul(q, kt, s(&[1, t, t]));
    let p = g.softmax(a, 2, s(&[1, t, t]));
    let o = g.matmul(p, q, s(&[1, t, h]));
    let r = g.add(o, x, s(&[1, t, h]));
    let sc = g.constant(Tensor::from_f32(&[h], vec![1.0; h]).unwrap());
    let ln = g.add_node(
        Op::LayerNorm {
            axis: 2,
            epsilon: 1e-5,
        },
        vec![r, sc],
        s(&[1, t, h]),
    );
    let ge = g.activation(Activation::Gelu, ln, s(&[1, t, h]));
    g.set_outputs(vec![ge]);
    let mut ex = CpuExecutor::new(g).unwrap();
    ex.set_param("w", Tensor::from_f32(&[h, h], vec![0.01; h * h]).unwrap())
        .unwrap();
    let xin = Tensor::from_f32(
        &[1, t, h],
        (0..t * h).map(|i| (i % 7) as f32 * 0.1).collect(),
    )
    .unwrap();
    for _ in 0..10 {
        ex.run(std::slice::from_ref(&xin), None).unwrap();
    }
    let n = 2000;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        ex.run(std::slice::from_ref(&xin), None).unwrap();
    }
    let per = t0.elapsed().as_secs_f64() / n as f64 * 1e6;
    println!("tiny block: {per:.1} us per run (9 ops)");
}
