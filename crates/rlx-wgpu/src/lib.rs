//! RLX wgpu backend: runs a compiled [`rlx_ir::Graph`] with WGSL compute kernels on any
//! adapter wgpu finds (Vulkan here; lavapipe in CI, a real GPU elsewhere).
//!
//! * [`probe`]: is there an adapter? (cached; honours `WGPU_BACKEND`; never panics)
//! * [`WgpuExecutor`]: the same shape of API as `rlx_cpu::CpuExecutor` (`new`, `set_param`,
//!   `run`), plus [`WgpuExecutor::run_all`] (every node's value, for the cross-backend
//!   divergence diagnostic) and [`WgpuExecutor::placements`] (which nodes run on the GPU and
//!   which fall back to the CPU, `RLX_DISPATCH_REPORT=1` prints them).
//!
//! Values live on the GPU as 32-bit words: f32 as f32, Bool as u32 0/1, and integer index
//! tensors (I64/I32) as i32 where a GPU kernel needs them (Gather indices, ArgMax output).
//! Every other dtype, and every op without a WGSL kernel, runs on the CPU per node
//! (`rlx_cpu::eval_op`) with its inputs read back and its output uploaded again.
//!
//! NaN semantics follow ONNX/NumPy like the CPU backend: WGSL lets drivers drop NaN in
//! `max`/`min`/`clamp` and fold `x != x` to false (measured on lavapipe and an H200, see
//! `docs/WGPU.md`), so every NaN-propagating kernel tests the bits
//! (`(bitcast<u32>(x) & 0x7fffffff) > 0x7f800000`) and selects explicitly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod executor;
mod kernels;

pub use executor::{Placement, WgpuExecutor};
pub use wgpu::AdapterInfo;

/// Errors from the wgpu backend, naming the node, input or parameter.
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    /// No wgpu adapter on this machine (or the device request failed).
    #[error("no wgpu adapter available: {0}")]
    NoAdapter(String),
    /// A node could not be prepared or run.
    #[error("{node} {op} \"{label}\": {msg}")]
    Kernel {
        node: rlx_ir::NodeId,
        op: String,
        label: String,
        msg: String,
    },
    /// A run input does not match its Input node (count, dtype or dims).
    #[error("{0}")]
    Input(String),
    /// `set_param` got an unknown name or a value of the wrong type, or a param was not set.
    #[error("{0}")]
    Param(String),
    /// wgpu reported an error (validation, out of memory, a failed map).
    #[error("wgpu: {0}")]
    Gpu(String),
    /// `RLX_DEBUG_NANS=abort` stopped the run (same report as the CPU backend's).
    #[error(transparent)]
    NanAbort(#[from] rlx_ir::numeric_check::NanAbort),
}

/// The device shared by every executor of this process.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: AdapterInfo,
    pub limits: wgpu::Limits,
    pub pipelines: Mutex<std::collections::HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// The device was granted `TIMESTAMP_QUERY` (device timing of runs, `rlx bench`).
    pub timestamps: bool,
    /// The device was granted `TIMESTAMP_QUERY_INSIDE_PASSES` (per-node profiling).
    pub pass_timestamps: bool,
}

static UNCAPTURED: AtomicUsize = AtomicUsize::new(0);

/// Number of wgpu errors raised outside an error scope since the process started (each is
/// also printed to stderr). Tests assert this stays 0: the default handler would panic, and
/// a silent handler would hide validation errors.
pub fn uncaptured_error_count() -> usize {
    UNCAPTURED.load(Ordering::SeqCst)
}

fn instance() -> wgpu::Instance {
    quiet_device_select();
    // `with_env` honours WGPU_BACKEND (and the other WGPU_* variables). An empty WGPU_BACKEND
    // means the default, as for every RLX_* variable (wgpu would read it as "no backend").
    let desc = wgpu::InstanceDescriptor::new_without_display_handle();
    let empty =
        std::env::var_os("WGPU_BACKEND").is_some_and(|v| v.to_string_lossy().trim().is_empty());
    let desc = if empty { desc } else { desc.with_env() };
    wgpu::Instance::new(desc)
}

/// Mesa's implicit Vulkan `device-select` layer prints "error: XDG_RUNTIME_DIR is invalid or
/// not set in the environment." on every instance when that variable does not name a
/// directory (containers, CI, ssh without a session): noise in every user's and test's output
/// (shared/notes/wgpu.md). Where it would print, and the user has not chosen, turn the layer
/// off (`NODEVICE_SELECT=1`): it only reorders devices, and wgpu picks its adapter itself.
/// Set once, before the first instance loads the Vulkan loader.
fn quiet_device_select() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let xdg_ok =
            std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
        if !xdg_ok && std::env::var_os("NODEVICE_SELECT").is_none() {
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    });
}

fn request_adapter(inst: &wgpu::Instance) -> Result<wgpu::Adapter, String> {
    let opts = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    pollster::block_on(inst.request_adapter(&opts)).map_err(|e| e.to_string())
}

/// The adapter wgpu would use, or `None` when there is none (no Vulkan driver, no GPU, a
/// failing loader). Probed once per process and cached; never panics. Honours
/// `WGPU_BACKEND` (e.g. `vulkan`) through `InstanceDescriptor::with_env`.
pub fn probe() -> Option<AdapterInfo> {
    static PROBE: OnceLock<Option<AdapterInfo>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            std::panic::catch_unwind(|| {
                let inst = instance();
                request_adapter(&inst).ok().map(|a| a.get_info())
            })
            .ok()
            .flatten()
        })
        .clone()
}

/// The process-wide device (created on first use with the adapter's own limits: the
/// defaults cap storage bindings at 128 MiB and workgroup storage at 16 KiB).
pub(crate) fn gpu() -> Result<Arc<Gpu>, WgpuError> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        let inst = instance();
        let adapter = request_adapter(&inst)?;
        let limits = adapter.limits();
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let pass_timestamps = timestamps
            && adapter
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
        let mut features = wgpu::Features::empty();
        if timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        if pass_timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("rlx-wgpu"),
            required_limits: limits.clone(),
            required_features: features,
            ..Default::default()
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?;
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            UNCAPTURED.fetch_add(1, Ordering::SeqCst);
            eprintln!("rlx-wgpu: uncaptured wgpu error: {e}");
        }));
        Ok(Arc::new(Gpu {
            device,
            queue,
            info: adapter.get_info(),
            limits,
            pipelines: Mutex::new(Default::default()),
            timestamps,
            pass_timestamps,
        }))
    })
    .clone()
    .map_err(WgpuError::NoAdapter)
}

/// Test-only switches. **Not for production use**: they make kernels deliberately wrong so
/// that the cross-backend divergence classifier can be shown to catch a real kernel bug.
#[doc(hidden)]
pub mod testing {
    use std::sync::atomic::{AtomicU8, Ordering};

    /// A deliberately wrong kernel variant (test-only).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum PlantedBug {
        /// ReduceSum/ReduceMean skip the last element of every 64-element workgroup tile
        /// (and the last element of short rows reduced by one thread). Name:
        /// `reduce_sum_skip_last`.
        ReduceSumSkipLast,
        /// MatMul (not Conv) drops its last k-tile (8 wide; 16 with `RLX_WGPU_GEMM_TILE=reg16` or `32|64|128`) when K is over one k-tile. Name:
        /// `matmul_drop_last_k`.
        MatMulDropLastK,
        /// Relu written the naive WGSL way, `max(x, 0.0)`, which drivers fold so that a NaN
        /// comes out as 0 (measured on lavapipe and the H200). Name: `relu_drops_nan`.
        ReluDropsNan,
    }

    impl PlantedBug {
        /// Parse the name used by `RLX_TEST_PLANTED_BUG`.
        pub fn parse(s: &str) -> Option<PlantedBug> {
            match s.trim() {
                "reduce_sum_skip_last" => Some(PlantedBug::ReduceSumSkipLast),
                "matmul_drop_last_k" => Some(PlantedBug::MatMulDropLastK),
                "relu_drops_nan" => Some(PlantedBug::ReluDropsNan),
                _ => None,
            }
        }
        fn code(b: Option<PlantedBug>) -> u8 {
            match b {
                None => 0,
                Some(PlantedBug::ReduceSumSkipLast) => 1,
                Some(PlantedBug::MatMulDropLastK) => 2,
                Some(PlantedBug::ReluDropsNan) => 3,
            }
        }
    }

    static PLANTED: AtomicU8 = AtomicU8::new(0);

    /// Test-only: plant a kernel bug in executors created from now on (`None` removes it).
    pub fn set_planted_bug(b: Option<PlantedBug>) {
        PLANTED.store(PlantedBug::code(b), Ordering::SeqCst);
    }

    /// The bug an executor created now gets: the global switch, else the test-only
    /// environment variable `RLX_TEST_PLANTED_BUG=<name>` (read at executor creation).
    pub fn planted_bug() -> Option<PlantedBug> {
        match PLANTED.load(Ordering::SeqCst) {
            1 => Some(PlantedBug::ReduceSumSkipLast),
            2 => Some(PlantedBug::MatMulDropLastK),
            3 => Some(PlantedBug::ReluDropsNan),
            _ => rlx_ir::env::get("RLX_TEST_PLANTED_BUG").and_then(|s| PlantedBug::parse(&s)),
        }
    }
}
