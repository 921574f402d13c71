//! Shared helpers: device gate, random data, run a graph on rlx-cpu and rlx-cuda.
#![allow(dead_code)]

use rlx_cpu::CpuExecutor;
use rlx_cuda::CudaExecutor;
use rlx_ir::{Graph, Tensor, TensorData};

/// True when `rlx_cuda::probe()` finds a device. Without one the test is skipped (a line on
/// stderr), unless `RLX_REQUIRE_CUDA=1`, where it fails.
pub fn cuda_available() -> bool {
    match rlx_cuda::probe() {
        Ok(_) => true,
        Err(e) => {
            if rlx_ir::env::is_on("RLX_REQUIRE_CUDA") {
                panic!("RLX_REQUIRE_CUDA=1 but rlx_cuda::probe() failed: {e}");
            }
            use std::io::Write; // past the harness's capture: the skip shows in logs
            let _ = writeln!(
                std::io::stderr(),
                "skipping {}: no CUDA device ({e})",
                std::thread::current().name().unwrap_or("?")
            );
            false
        }
    }
}

/// Deterministic pseudo-random f32 in [lo, hi) (SplitMix64).
pub fn rand_vec(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_add(0x9E3779B97F4A7C15);
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            z ^= z >> 31;
            lo + (hi - lo) * ((z >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

pub fn rand_tensor(dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_f32(dims, rand_vec(n, seed, -2.0, 2.0)).unwrap()
}

/// Run `g` on both backends; returns (cpu outputs, cuda outputs).
pub fn both(g: &Graph, inputs: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(inputs, None).unwrap();
    let mut w = CudaExecutor::new(g.clone()).unwrap();
    let got = w.run(inputs, None).unwrap();
    (want, got)
}

/// Max error |a-b|/(|b| + 1e-3·max|b| + 1e-6) over elements (relative, with a floor at a
/// thousandth of the output's scale); Err names the first element where NaN does not match
/// NaN or an infinity does not match exactly.
pub fn max_rel(got: &Tensor, want: &Tensor) -> Result<f64, String> {
    if got.dims() != want.dims() || got.dtype() != want.dtype() {
        return Err(format!(
            "type {:?} {} vs cpu {:?} {}",
            got.dims(),
            got.dtype(),
            want.dims(),
            want.dtype()
        ));
    }
    let mut worst = 0.0f64;
    let scale = (0..want.numel())
        .map(|i| want.data().get_f64(i).abs())
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    for i in 0..want.numel() {
        let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
        if a.is_nan() || b.is_nan() || a.is_infinite() || b.is_infinite() {
            if !((a.is_nan() && b.is_nan()) || a == b) {
                return Err(format!("element {i}: cuda {a}, cpu {b}"));
            }
            continue;
        }
        worst = worst.max((a - b).abs() / (b.abs() + 1e-3 * scale + 1e-6));
    }
    Ok(worst)
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    match max_rel(got, want) {
        Ok(r) => {
            eprintln!("{what}: max_rel {r:.3e}");
            assert!(r <= tol, "{what}: max_rel {r:.3e} > {tol:e}");
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    match t.data() {
        TensorData::F32(v) => v.clone(),
        d => d.to_f32_vec(),
    }
}
