//! Shared helpers: adapter gate, random data, run a graph on rlx-cpu and rlx-wgpu.
#![allow(dead_code)]

use rlx_cpu::CpuExecutor;
use rlx_ir::{Graph, Tensor, TensorData};
use rlx_wgpu::WgpuExecutor;

/// True when a wgpu adapter exists. Without one the test is skipped, unless
/// `RLX_REQUIRE_GPU=1` (CI, with lavapipe installed), where it fails.
pub fn gpu_available() -> bool {
    if rlx_wgpu::probe().is_some() {
        return true;
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_GPU") {
        panic!(
            "RLX_REQUIRE_GPU=1 but wgpu finds no adapter (install mesa-vulkan-drivers libvulkan1)"
        );
    }
    {
        use std::io::Write; // past the test harness's capture: the skip shows in CI logs
        let _ = writeln!(
            std::io::stderr(),
            "skipping {}: no wgpu adapter on this machine",
            std::thread::current().name().unwrap_or("?")
        );
    }
    false
}

/// Fail on any wgpu error raised outside an error scope.
pub fn assert_no_uncaptured() {
    assert_eq!(
        rlx_wgpu::uncaptured_error_count(),
        0,
        "uncaptured wgpu errors (see stderr)"
    );
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

/// Run `g` on both backends; returns (cpu outputs, wgpu outputs).
pub fn both(g: &Graph, inputs: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(inputs, None).unwrap();
    let mut w = WgpuExecutor::new(g.clone()).unwrap();
    let got = w.run(inputs, None).unwrap();
    assert_no_uncaptured();
    (want, got)
}

/// Max error |a-b|/(|b| + 1e-3·max|b| + 1e-6) over elements (relative, with a floor at a
/// thousandth of the output's scale so cancellation near zero is not counted as error); NaN must match NaN, ±inf must match
/// exactly (panics otherwise, naming the element).
pub fn max_rel(what: &str, got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims(), "{what}: dims");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let mut worst = 0.0f64;
    let scale = (0..want.numel())
        .map(|i| want.data().get_f64(i).abs())
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    for i in 0..want.numel() {
        let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
        if a.is_nan() || b.is_nan() || a.is_infinite() || b.is_infinite() {
            assert!(
                (a.is_nan() && b.is_nan()) || a == b,
                "{what}: element {i}: wgpu {a}, cpu {b}"
            );
            continue;
        }
        worst = worst.max((a - b).abs() / (b.abs() + 1e-3 * scale + 1e-6));
    }
    worst
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let r = max_rel(what, got, want);
    assert!(r <= tol, "{what}: max_rel {r:.3e} > {tol:e}");
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    match t.data() {
        TensorData::F32(v) => v.clone(),
        d => d.to_f32_vec(),
    }
}
