//! The register-tiled matmul/conv kernel (`kernels::reg_tiled`, wgpu's matmul/conv kernel)
//! against rlx-cpu: every tile shape it picks (128 or 64 rows by 128 or 64 columns), partial
//! tiles on both axes, products smaller than a tile (one row, a classifier's few rows),
//! split-K (partial products in the output buffer, then summed), K
//! shorter than a k-tile and not a multiple of it, batch broadcast, 1x1 convolutions (read as
//! plain GEMMs), strided/padded/grouped/dilated im2col convolutions with columns spanning
//! images, and NaN/Inf in the inputs (NaN in -> NaN at exactly the CPU's positions). Then the
//! same with k-tiles of 16 (`RLX_WGPU_GEMM_TILE=reg16`) and with the earlier shared-memory
//! kernel (`64`, whose convolution dispatch differs). Its own test binary: the variable is
//! process-wide, so everything runs in one test function.

mod common;
use common::*;
use rlx_ir::*;

fn matmul(a: &[usize], b: &[usize], o: &[usize], nan: bool) {
    let mut g = Graph::new("mm");
    let x = g.input("a", Shape::new(a, DType::F32));
    let y = g.input("b", Shape::new(b, DType::F32));
    let z = g.matmul(x, y, Shape::new(o, DType::F32));
    g.set_outputs(vec![z]);
    let mut ta = rand_tensor(a, 31);
    let mut tb = rand_tensor(b, 32);
    if nan {
        // A NaN in one row of A, an Inf in one column of B: the CPU says which outputs
        // become NaN/Inf; the GPU must agree element by element (max_rel panics otherwise).
        let mut va = f32s(&ta);
        va[a[a.len() - 1] * 3 + 1] = f32::NAN;
        ta = Tensor::from_f32(a, va).unwrap();
        let mut vb = f32s(&tb);
        let n = b[b.len() - 1];
        vb[2 * n + n - 1] = f32::INFINITY;
        tb = Tensor::from_f32(b, vb).unwrap();
    }
    let (want, got) = both(&g, &[ta, tb]);
    // f32 round-off grows with K (both sides sum K products in different orders; the
    // elements near zero are measured against a thousandth of the output's scale).
    let k = a[a.len() - 1];
    let tol = 1e-4 * (k as f64 / 256.0).max(1.0);
    assert_close(&format!("matmul {a:?} x {b:?}"), &got[0], &want[0], tol);
}

fn conv(
    x: &[usize],
    w: &[usize],
    strides: &[usize],
    pads: &[(usize, usize)],
    dil: &[usize],
    groups: usize,
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
    let bi = g.input("b", Shape::new(&[w[0]], DType::F32));
    let attrs = ConvAttrs {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        groups,
    };
    let y = g.add_node(
        Op::Conv(attrs),
        vec![xi, wi, bi],
        Shape::new(&od, DType::F32),
    );
    g.set_outputs(vec![y]);
    let feeds = [
        rand_tensor(x, 11),
        rand_tensor(w, 12),
        rand_tensor(&[w[0]], 13),
    ];
    let (want, got) = both(&g, &feeds);
    let what = format!("conv x{x:?} w{w:?} s{strides:?} p{pads:?} d{dil:?} g{groups}");
    assert_close(&what, &got[0], &want[0], 1e-4);
}

fn all_cases() {
    // Tiles of 128x128, 64x128 and 128x64 rows x columns (picked when the batch gives at least
    // 256 workgroups), partial on both axes.
    matmul(&[64, 130, 33], &[33, 200], &[64, 130, 200], false);
    matmul(&[64, 100, 33], &[33, 150], &[64, 100, 150], false);
    matmul(&[64, 130, 20], &[20, 70], &[64, 130, 70], true);
    conv(
        &[64, 16, 12, 12],
        &[130, 16, 1, 1],
        &[1, 1],
        &[(0, 0); 2],
        &[1, 1],
        1,
    );
    conv(
        &[64, 8, 16, 16],
        &[130, 8, 3, 3],
        &[1, 1],
        &[(1, 1); 2],
        &[1, 1],
        1,
    );
    // 64x64 tiles (few workgroups); K = 5 (shorter than a k-tile), 33, 70 (not multiples),
    // 256; outputs of 48..63 rows or columns.
    matmul(&[130, 70], &[70, 200], &[130, 200], false);
    matmul(&[100, 33], &[33, 150], &[100, 150], false);
    matmul(&[200, 5], &[5, 70], &[200, 70], false);
    matmul(&[64, 256], &[256, 64], &[64, 64], false);
    matmul(&[2, 1, 128, 33], &[3, 33, 128], &[2, 3, 128, 128], false);
    matmul(&[3, 129, 40], &[40, 131], &[3, 129, 131], false);
    matmul(&[130, 70], &[70, 200], &[130, 200], true);
    matmul(&[2, 70, 48], &[2, 48, 90], &[2, 70, 90], true);
    matmul(&[50, 40], &[40, 49], &[50, 49], false);
    matmul(&[1, 300], &[300, 77], &[1, 77], false);
    matmul(&[32, 300], &[300, 100], &[32, 100], true);
    matmul(&[5, 3], &[3, 2], &[5, 2], false);
    // split-K (few workgroups, K of at least 512): 2 and 4 splits, the last one short;
    // batch broadcast; NaN/Inf rows and columns through the partial sums.
    matmul(&[64, 600], &[600, 70], &[64, 70], false);
    matmul(&[2, 70, 1030], &[1030, 90], &[2, 70, 90], true);
    matmul(&[3, 1, 40, 777], &[2, 777, 130], &[3, 2, 40, 130], false);
    // 1x1 convolutions (B read as the input's planes): 130 and 70 output channels, 9x9 and
    // 12x12 planes, two images.
    conv(
        &[2, 40, 9, 9],
        &[130, 40, 1, 1],
        &[1, 1],
        &[(0, 0); 2],
        &[1, 1],
        1,
    );
    conv(
        &[2, 24, 12, 12],
        &[70, 24, 1, 1],
        &[1, 1],
        &[(0, 0); 2],
        &[1, 1],
        1,
    );
    // 1x1 with stride 2 takes the im2col path
    conv(
        &[1, 16, 20, 20],
        &[64, 16, 1, 1],
        &[2, 2],
        &[(0, 0); 2],
        &[1, 1],
        1,
    );
    // 3x3 pad 1, 3x3 stride 2, grouped (two groups of 64 output channels), dilated, 1-D, 3-D
    conv(
        &[2, 5, 13, 13],
        &[130, 5, 3, 3],
        &[1, 1],
        &[(1, 1); 2],
        &[1, 1],
        1,
    );
    conv(
        &[1, 8, 23, 23],
        &[96, 8, 3, 3],
        &[2, 2],
        &[(1, 1); 2],
        &[1, 1],
        1,
    );
    conv(
        &[1, 12, 11, 11],
        &[128, 6, 3, 3],
        &[1, 1],
        &[(1, 1); 2],
        &[1, 1],
        2,
    );
    conv(
        &[1, 4, 14, 14],
        &[64, 4, 3, 3],
        &[1, 1],
        &[(2, 2); 2],
        &[2, 2],
        1,
    );
    conv(&[2, 6, 150], &[80, 6, 5], &[1], &[(2, 2)], &[1], 1);
    conv(
        &[1, 3, 6, 6, 6],
        &[64, 3, 3, 3, 3],
        &[1, 1, 1],
        &[(1, 1); 3],
        &[1, 1, 1],
        1,
    );
}

#[test]
fn register_tiled_kernel_matches_the_cpu() {
    if !gpu_available() {
        return;
    }
    std::env::remove_var("RLX_WGPU_GEMM_TILE");
    all_cases();
    std::env::set_var("RLX_WGPU_GEMM_TILE", "reg16");
    all_cases();
    std::env::set_var("RLX_WGPU_GEMM_TILE", "64");
    all_cases();
}
