//! Shared helpers for the cross-crate tests: load fixtures, run models, compare.
#![allow(dead_code)]

pub mod chromium;

use rlx_cli::npy::read_npy;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::{Tensor, TensorData};
use rlx_onnx_import::{import_onnx, ImportOptions};
use rlx_runtime::{CompiledGraph, Device, Session};
use std::path::{Path, PathBuf};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture folder, or `None` (test skipped) when it was not generated. Under
/// `RLX_REQUIRE_FIXTURES=1` (CI) a missing fixture fails the test.
pub fn fixture(rel: &str) -> Option<PathBuf> {
    let p = repo().join(rel);
    if p.exists() {
        return Some(p);
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
        panic!(
            "fixture {} is missing (generate it with the scripts in scripts/)",
            p.display()
        );
    }
    {
        use std::io::Write; // past the test harness's capture: the skip shows in CI logs
        let _ = writeln!(
            std::io::stderr(),
            "skipping {}: fixture {} not generated",
            std::thread::current().name().unwrap_or("?"),
            p.display()
        );
    }
    None
}

/// Import `dir/model.onnx` (symbolic dims bound from `dir/input_<name>.npy` where present),
/// compile for the CPU with scanning forced to `mode`.
pub fn compile(dir: &Path, mode: DebugMode) -> CompiledGraph {
    let mut opts = ImportOptions::default();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let f = e.file_name().to_string_lossy().to_string();
        if let Some(name) = f
            .strip_prefix("input_")
            .and_then(|n| n.strip_suffix(".npy"))
        {
            let t = read_npy(&e.path()).unwrap();
            opts.input_shapes
                .insert(name.to_string(), t.dims().to_vec());
        }
    }
    let g = import_onnx(&dir.join("model.onnx"), &opts)
        .unwrap_or_else(|e| panic!("import {}: {e}", dir.display()));
    let mut s = Session::new(Device::Cpu)
        .try_compile(g)
        .unwrap_or_else(|e| panic!("compile {}: {e}", dir.display()));
    s.set_debug_mode(Some(mode));
    s.set_print_reports(false);
    s
}

/// Feed `dir/<prefix><name>.npy` for every input of `s`.
pub fn feeds(s: &CompiledGraph, dir: &Path, prefix: &str) -> Vec<(String, Tensor)> {
    s.inputs()
        .into_iter()
        .map(|(name, _)| {
            let p = dir.join(format!("{prefix}{}.npy", rlx_cli::run::sanitize(&name)));
            let t = read_npy(&p).unwrap_or_else(|e| panic!("{e:#}"));
            (name, t)
        })
        .collect()
}

pub fn run(s: &mut CompiledGraph, feeds: &[(String, Tensor)]) -> Vec<Tensor> {
    s.run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
        .unwrap_or_else(|e| panic!("run: {e}"))
}

/// NumPy `allclose` with NaN equal to NaN and infinities equal by sign; dims and dtype
/// must match exactly (BF16 outputs compare against float32 files).
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}: dims differ");
    let same_kind = got.dtype() == want.dtype()
        || matches!(
            (got.data(), want.data()),
            (TensorData::BF16(_), TensorData::F32(_))
        );
    assert!(
        same_kind,
        "{what}: dtype {} vs expected {}",
        got.dtype(),
        want.dtype()
    );
    let mut worst = (0.0f64, 0usize);
    for i in 0..want.numel() {
        let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
        if a.is_nan() && b.is_nan() {
            continue;
        }
        if b.is_infinite() || a.is_infinite() || a.is_nan() || b.is_nan() {
            assert_eq!(a, b, "{what}: element {i}: got {a}, expected {b}");
            continue;
        }
        let err = (a - b).abs();
        let excess = err - (atol + rtol * b.abs());
        if excess > worst.0 {
            worst = (excess, i);
        }
    }
    if worst.0 > 0.0 {
        let i = worst.1;
        panic!(
            "{what}: element {i}: got {}, expected {} (rtol {rtol}, atol {atol})",
            got.data().get_f64(i),
            want.data().get_f64(i)
        );
    }
}

/// Max |a - b| over finite pairs.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (0..a.numel())
        .map(|i| (a.data().get_f64(i) - b.data().get_f64(i)).abs())
        .filter(|d| d.is_finite())
        .fold(0.0, f64::max)
}

/// A folder under the temp dir, removed with its contents when dropped (also when a test
/// fails and unwinds), so test runs leave nothing behind.
pub struct TmpDir(pub PathBuf);

impl TmpDir {
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This test binary's scratch folder for files its tests share: `<target>/tmp/<tag>-<pid>`,
/// inside the build folder (so a clone's runs write nothing outside it). Created on the first
/// call; the folders of earlier runs of the same tag whose process has ended are removed then
/// (on Linux, where `/proc` says which processes are alive), so reruns do not pile up.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let me = root.join(format!("{tag}-{}", std::process::id()));
    if !me.is_dir() {
        let proc_fs = Path::new("/proc/self").exists();
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix(tag).and_then(|r| r.strip_prefix('-'));
            if let Some(pid) = pid.filter(|p| p.bytes().all(|b| b.is_ascii_digit())) {
                if proc_fs && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        std::fs::create_dir_all(&me).unwrap();
    }
    me
}

/// Whether a wgpu adapter is live (lavapipe in CI). Without one the test is skipped (a line on
/// stderr), unless `RLX_REQUIRE_GPU=1`, where it fails.
pub fn gpu() -> bool {
    if rlx_runtime::available_devices().contains(&rlx_runtime::Device::Wgpu) {
        return true;
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_GPU") {
        panic!("RLX_REQUIRE_GPU=1 but no wgpu adapter is available (install mesa-vulkan-drivers)");
    }
    {
        use std::io::Write; // past the test harness's capture: the skip shows in CI logs
        let _ = writeln!(
            std::io::stderr(),
            "skipping {}: no wgpu adapter",
            std::thread::current().name().unwrap_or("?")
        );
    }
    false
}
