//! Per-kernel tests: each WGSL kernel against rlx-cpu's kernel on random data, odd sizes
//! included (partial tiles, broadcasting, strided views).

mod common;
use common::*;
use rlx_ir::*;

fn conv_case(
    x: &[usize],
    w: &[usize],
    strides: &[usize],
    pads: &[(usize, usize)],
    dil: &[usize],
    groups: usize,
    bias: bool,
) {
    let nsp = x.len() - 2;
    let mut od = vec![x[0], w[0]];
    for i in 0..nsp {
        let k = dil[i] * (w[2 + i] - 1) + 1;
        od.push((x[2 + i] + pads[i].0 + pads[i].1 - k) / strides[i] + 1);
    }
    let mut g = Graph::new("conv");
    let xi = g.input("x", Shape::new(x, DType::F32));
    let wi = g.input("w", Shape::new(w, DType::F32));
    let mut ins = vec![xi, wi];
    let mut feeds = vec![rand_tensor(x, 11), rand_tensor(w, 12)];
    if bias {
        ins.push(g.input("b", Shape::new(&[w[0]], DType::F32)));
        feeds.push(rand_tensor(&[w[0]], 13));
    }
    let attrs = ConvAttrs {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        groups,
    };
    let y = g.add_node(Op::Conv(attrs), ins, Shape::new(&od, DType::F32));
    g.set_outputs(vec![y]);
    let (want, got) = both(&g, &feeds);
    let what = format!("conv x{x:?} w{w:?} s{strides:?} p{pads:?} g{groups}");
    eprintln!("{what}: {:e}", max_rel(&what, &got[0], &want[0]));
    assert_close(&what, &got[0], &want[0], 1e-4);
}

#[test]
fn conv_variants() {
    if !gpu_available() {
        return;
    }
    // tiled (>= 16 output channels per group) and direct paths, odd sizes, pads, strides.
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[1, 1],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(1, 1), (1, 1)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 16, 16],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        false,
    );
    conv_case(
        &[1, 3, 15, 15],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        true,
    );
    conv_case(
        &[1, 3, 224, 224],
        &[64, 3, 3, 3],
        &[2, 2],
        &[(0, 0), (0, 0)],
        &[1, 1],
        1,
        true,
    );
    conv_case(
        &[2, 5, 9, 11],
        &[20, 5, 3, 2],
        &[1, 2],
        &[(1, 0), (2, 1)],
        &[1, 2],
        1,
        false,
    );
    conv_case(
        &[1, 8, 7, 7],
        &[8, 1, 3, 3],
        &[1, 1],
        &[(1, 1), (1, 1)],
        &[1, 1],
        8,
        true,
    );
    conv_case(&[2, 6, 10], &[4, 3, 3], &[1], &[(1, 1)], &[1], 2, true);
    conv_case(
        &[1, 32, 9, 9],
        &[64, 16, 1, 1],
        &[1, 1],
        &[(0, 0), (0, 0)],
        &[1, 1],
        2,
        true,
    );
}
