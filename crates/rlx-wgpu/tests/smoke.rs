mod common;
use common::*;
use rlx_ir::{DType, Graph, Shape};

#[test]
fn matmul_add_relu_reduce() {
    if !gpu_available() {
        return;
    }
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[3, 37, 45], DType::F32));
    let w = g.input("w", Shape::new(&[45, 29], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[3, 37, 29], DType::F32));
    let r = g.activation(
        rlx_ir::Activation::Relu,
        y,
        Shape::new(&[3, 37, 29], DType::F32),
    );
    let s = g.add_node(
        rlx_ir::Op::Reduce {
            kind: rlx_ir::ReduceKind::Sum,
            axes: vec![2],
            keepdims: false,
        },
        vec![r],
        Shape::new(&[3, 37], DType::F32),
    );
    g.set_outputs(vec![y, r, s]);
    let (want, got) = both(
        &g,
        &[rand_tensor(&[3, 37, 45], 1), rand_tensor(&[45, 29], 2)],
    );
    for k in 0..3 {
        assert_close(&format!("out {k}"), &got[k], &want[k], 1e-4);
    }
}
