//! The opt-in 128x128-tile matmul/conv kernel (`RLX_WGPU_GEMM_TILE=128`) against rlx-cpu, at
//! sizes that take it (>= 128 output rows and columns), with partial tiles and K not a multiple
//! of 16. Its own test binary: the variable is process-wide.

mod common;
use common::*;
use rlx_ir::*;

#[test]
fn the_128_tile_kernel_matches_the_cpu() {
    if !gpu_available() {
        return;
    }
    std::env::set_var("RLX_WGPU_GEMM_TILE", "128");
    for (a, b, o) in [
        (vec![130usize, 70], vec![70usize, 200], vec![130usize, 200]),
        (vec![2, 1, 128, 33], vec![3, 33, 128], vec![2, 3, 128, 128]),
    ] {
        let mut g = Graph::new("mm");
        let x = g.input("a", Shape::new(&a, DType::F32));
        let y = g.input("b", Shape::new(&b, DType::F32));
        let z = g.matmul(x, y, Shape::new(&o, DType::F32));
        g.set_outputs(vec![z]);
        let (want, got) = both(&g, &[rand_tensor(&a, 31), rand_tensor(&b, 32)]);
        assert_close(&format!("matmul {a:?} x {b:?}"), &got[0], &want[0], 1e-4);
    }
    // implicit GEMM: 130 output channels, 13x13 = 169 positions, bias, pads
    let (x, w) = ([2usize, 5, 13, 13], [130usize, 5, 3, 3]);
    let mut g = Graph::new("conv");
    let xi = g.input("x", Shape::new(&x, DType::F32));
    let wi = g.input("w", Shape::new(&w, DType::F32));
    let bi = g.input("b", Shape::new(&[130], DType::F32));
    let attrs = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let y = g.add_node(
        Op::Conv(attrs),
        vec![xi, wi, bi],
        Shape::new(&[2, 130, 13, 13], DType::F32),
    );
    g.set_outputs(vec![y]);
    let feeds = [
        rand_tensor(&x, 11),
        rand_tensor(&w, 12),
        rand_tensor(&[130], 13),
    ];
    let (want, got) = both(&g, &feeds);
    assert_close("conv 128-tile", &got[0], &want[0], 1e-4);
}
