//! RLX CUDA backend: runs a compiled [`rlx_ir::Graph`] on an NVIDIA GPU through the CUDA
//! driver API, with cuBLAS for MatMul, cuDNN (when present) for Conv and NVRTC-compiled
//! kernels for elementwise math, reductions, pooling and the rest.
//!
//! * [`probe`]: is there a CUDA driver, NVRTC, cuBLAS and a device? (cached; never panics;
//!   the error names the library file that is missing)
//! * [`CudaExecutor`]: the same shape of API as `rlx_wgpu::WgpuExecutor` (`new`, `set_param`,
//!   `run`, `run_all`, `placements`; `RLX_DISPATCH_REPORT=1` prints the placements).
//!
//! Nothing CUDA is needed to build: `cudarc` loads `libcuda.so.1`, `libnvrtc.so.13` and
//! `libcublas.so.13` at run time, and `libcudnn.so.9` (optional: Conv on cuDNN, see
//! [`cudnn_info`]) when a graph has a convolution. [`probe`] first looks for each file itself (in
//! `LD_LIBRARY_PATH`, `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, `/usr/local/nvidia/lib64`,
//! the system library directories) and loads it by path, so that cudarc's own loading by
//! name finds the already-loaded library and never panics on a missing one.
//!
//! Values on the GPU are f32, i32, u32, i64 and Bool (as u32 0/1); every other dtype, and
//! every op without a CUDA kernel (see docs/CUDA.md for the list), runs on the CPU per node
//! (`rlx_cpu::eval_op`) with its inputs read back and its output uploaded again. Kernels keep IEEE semantics (no fast math, no
//! FMA contraction, no flush to zero) and NaN propagates through Max/Min/Relu as on the CPU.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaModule};

mod attn;
mod cudnn;
mod executor;
mod fuse;
mod kernels;

pub use executor::{CudaExecutor, Placement};

/// Errors from the CUDA backend, naming the node, input or parameter.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA driver, library or device on this machine.
    #[error("no CUDA device available: {0}")]
    NoDevice(String),
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
    /// The CUDA driver, NVRTC or cuBLAS reported an error (allocation, copy, launch).
    #[error("cuda: {0}")]
    Cuda(String),
    /// `RLX_DEBUG_NANS=abort` stopped the run (same report as the CPU backend's).
    #[error(transparent)]
    NanAbort(#[from] rlx_ir::numeric_check::NanAbort),
}

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Device 0's name (`NVIDIA H200`).
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_mem: usize,
    /// Number of CUDA devices (the backend uses device 0).
    pub device_count: i32,
    /// The library files loaded (driver, NVRTC, cuBLAS), as found.
    pub libraries: Vec<String>,
}

/// The libraries the backend needs, each with optional companions loaded first/after
/// from the same directory (cuBLAS needs cuBLASLt; NVRTC loads its builtins library).
const LIBS: [(&str, &[&str], &[&str]); 3] = [
    ("libcuda.so.1", &[], &[]),
    ("libnvrtc.so.13", &[], &["libnvrtc-builtins.so.13.0"]),
    ("libcublas.so.13", &["libcublasLt.so.13"], &[]),
];

/// The directories searched for the CUDA libraries, in order: `LD_LIBRARY_PATH`, then
/// `$CUDA_HOME`/`$CUDA_PATH` `lib64`, the usual CUDA and driver install directories, and
/// the system library directories.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![];
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = std::env::var_os(var) {
            let h = PathBuf::from(h);
            dirs.push(h.join("lib64"));
            dirs.push(h.join("targets/x86_64-linux/lib"));
        }
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The symbol each library must export (a file of that name without it is not the library:
/// cudarc would panic resolving it).
fn key_symbol(name: &str) -> Option<&'static [u8]> {
    if name.starts_with("libcuda.") {
        Some(b"cuInit\0")
    } else if name.starts_with("libnvrtc.") {
        Some(b"nvrtcVersion\0")
    } else if name.starts_with("libcublas.") {
        Some(b"cublasCreate_v2\0")
    } else if name.starts_with("libcudnn.") {
        Some(b"cudnnCreate\0")
    } else {
        None
    }
}

fn dlopen(path: &std::ffi::OsStr, symbol: Option<&[u8]>) -> Result<(), String> {
    // SAFETY: loading a shared library runs its initializers; these are the vendor's CUDA
    // libraries, loaded once per process and never unloaded (the handle is leaked so the
    // symbols cudarc resolves later stay valid).
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            if let Some(sym) = symbol {
                // SAFETY: only the symbol's presence is checked; it is not called.
                if unsafe { lib.get::<*const ()>(sym) }.is_err() {
                    let s = String::from_utf8_lossy(&sym[..sym.len() - 1]).into_owned();
                    return Err(format!("it does not export {s}"));
                }
            }
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Load the shared library `name` (a file name such as `libcuda.so.1`): the first file of
/// that name in `dirs`, else by name through the dynamic loader's default paths (ld.so
/// cache). Returns where it was found, or an error naming the file and the places searched.
/// Never panics. Once loaded, a library stays loaded for the life of the process.
pub fn load_library(name: &str, dirs: &[PathBuf]) -> Result<String, String> {
    let sym = key_symbol(name);
    let mut failures = vec![];
    let mut odd = false;
    for d in dirs {
        let p = d.join(name);
        if p.is_file() {
            match dlopen(p.as_os_str(), sym) {
                Ok(()) => return Ok(p.display().to_string()),
                Err(e) if e.contains(&p.display().to_string()) => failures.push(e),
                Err(e) => failures.push(format!("{}: {e}", p.display())),
            }
        } else if p.symlink_metadata().is_ok() {
            // A FIFO, socket or directory of that name: never handed to the loader (opening
            // a FIFO blocks), and the by-name lookup below would find it first.
            odd = true;
            failures.push(format!("{}: not a regular file", p.display()));
        }
    }
    if failures.is_empty() && !odd && dlopen(std::ffi::OsStr::new(name), sym).is_ok() {
        return Ok(format!("{name} (dynamic loader's default paths)"));
    }
    if !failures.is_empty() {
        return Err(format!(
            "{name} was found but could not be loaded: {}",
            failures.join("; ")
        ));
    }
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(format!(
        "{name} not found (searched {}, and the dynamic loader's default paths)",
        searched.join(", ")
    ))
}

/// Load the driver, NVRTC and cuBLAS (with their companions), in that order.
fn load_libraries() -> Result<Vec<String>, String> {
    let dirs = search_dirs();
    let mut found = vec![];
    for (name, before, after) in LIBS {
        for b in before {
            let _ = load_library(b, &dirs);
        }
        found.push(load_library(name, &dirs)?);
        // Companions are loaded from the directory the library came from, when there.
        for a in after {
            let _ = load_library(a, &dirs);
        }
    }
    Ok(found)
}

/// The cuDNN library file (cuDNN 9; optional: without it Conv runs on the direct kernel).
pub const CUDNN_LIB: &str = "libcudnn.so.9";

/// Every cuDNN entry point the backend calls. cudarc resolves each lazily and panics on a
/// missing one, so all of them are checked present when the library is loaded.
const CUDNN_SYMBOLS: &[&str] = &[
    "cudnnGetVersion",
    "cudnnGetErrorString",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensorNdDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilterNdDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolutionNdDescriptor",
    "cudnnSetConvolutionMathType",
    "cudnnSetConvolutionGroupCount",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolutionNdForwardOutputDim",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnConvolutionForward",
];

/// Load cuDNN 9 (by path, from the same directories as the other libraries), check that
/// it exports every entry point the backend calls and that cudarc's own by-name loading
/// sees a 9.x library. `Err` says why not (the file missing, with the directories searched;
/// a missing symbol; another major version). Never panics.
fn load_cudnn() -> Result<String, String> {
    let dirs = search_dirs();
    let path = load_library(CUDNN_LIB, &dirs)?;
    let file = path
        .strip_suffix(" (dynamic loader's default paths)")
        .unwrap_or(&path)
        .to_string();
    // SAFETY: the library is already loaded (above); this only takes another reference to
    // it to look the symbols up, none is called.
    let lib = unsafe { libloading::Library::new(&file) }
        .map_err(|e| format!("{CUDNN_LIB}: reopening {file}: {e}"))?;
    for sym in CUDNN_SYMBOLS {
        let mut z = sym.as_bytes().to_vec();
        z.push(0);
        // SAFETY: presence check only; the symbol is not called.
        if unsafe { lib.get::<*const ()>(&z) }.is_err() {
            return Err(format!("{file} does not export {sym}"));
        }
    }
    std::mem::forget(lib);
    let v = std::panic::catch_unwind(cudarc::cudnn::result::get_version)
        .map_err(|p| format!("cudnnGetVersion panicked: {}", panic_msg(p)))?;
    // cuDNN 9 numbers its versions major*10000 + minor*100 + patch.
    if !(90000..100000).contains(&v) {
        return Err(format!(
            "{file} loaded, but the cuDNN that cudarc resolves by name reports version {v}, not 9.x"
        ));
    }
    Ok(format!(
        "cuDNN {}.{}.{} ({path})",
        v / 10000,
        v / 100 % 100,
        v % 100
    ))
}

/// The process-wide CUDA state: the primary context of device 0 and the kernel module
/// (compiled once by NVRTC, on first use).
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub info: CudaInfo,
    pub module: Mutex<Option<Result<Arc<CudaModule>, String>>>,
    /// cuDNN, loaded on first use: its version and file, or why it is not used.
    pub cudnn: OnceLock<Result<String, String>>,
    /// The fused attention kernels ([`attn::KERNEL_SRC`]), compiled on first use.
    pub attn: OnceLock<Result<Arc<CudaModule>, String>>,
}

fn panic_msg(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "panic without a message".into()
    }
}

fn init() -> Result<Arc<Gpu>, String> {
    let libraries = load_libraries()?;
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<Arc<Gpu>, String> {
        let count =
            CudaContext::device_count().map_err(|e| format!("cuInit/cuDeviceGetCount: {e}"))?;
        if count < 1 {
            return Err("the CUDA driver loaded but reports no device".into());
        }
        let ctx =
            CudaContext::new(0).map_err(|e| format!("creating a context on device 0: {e}"))?;
        // One stream per executor and no cross-stream sharing of buffers: cudarc's event
        // tracking (a record per use of a buffer) is not needed.
        unsafe { ctx.disable_event_tracking() };
        let info = CudaInfo {
            name: ctx.name().map_err(|e| format!("device name: {e}"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(|e| format!("compute capability: {e}"))?,
            total_mem: ctx.total_mem().map_err(|e| format!("total memory: {e}"))?,
            device_count: count,
            libraries,
        };
        Ok(Arc::new(Gpu {
            ctx,
            info,
            module: Mutex::new(None),
            cudnn: OnceLock::new(),
            attn: OnceLock::new(),
        }))
    }));
    match r {
        Ok(r) => r,
        Err(p) => Err(format!("CUDA initialization panicked: {}", panic_msg(p))),
    }
}

pub(crate) fn gpu() -> Result<Arc<Gpu>, String> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(init).clone()
}

/// The CUDA device the backend would use, or why there is none: a missing library file
/// (`"libcuda.so.1 not found (searched ...)"`), no device, a failing driver. Probed once per
/// process and cached; never panics.
pub fn probe() -> Result<CudaInfo, String> {
    static PROBE: OnceLock<Result<CudaInfo, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            std::panic::catch_unwind(|| gpu().map(|g| g.info.clone()))
                .unwrap_or_else(|p| Err(format!("CUDA probe panicked: {}", panic_msg(p))))
        })
        .clone()
}

/// cuDNN as the CUDA backend would use it: `Ok("cuDNN 9.14.0 (/usr/lib/.../libcudnn.so.9)")`,
/// or why Conv runs on the direct kernel instead (no device, the library file missing with
/// the directories searched, a missing entry point, another major version). Loaded once per
/// process and cached; never panics. `RLX_CUDNN=0` turns cuDNN off per executor, not here.
pub fn cudnn_info() -> Result<String, String> {
    gpu()?.cudnn()
}

impl Gpu {
    /// cuDNN, loaded on first use (cached, errors too).
    pub(crate) fn cudnn(&self) -> Result<String, String> {
        self.cudnn
            .get_or_init(|| {
                std::panic::catch_unwind(load_cudnn)
                    .unwrap_or_else(|p| Err(format!("loading cuDNN panicked: {}", panic_msg(p))))
            })
            .clone()
    }

    /// The fused attention kernels, compiled by NVRTC on first use (cached, errors too).
    pub(crate) fn attn_module(&self) -> Result<Arc<CudaModule>, String> {
        self.attn
            .get_or_init(|| {
                let (maj, min) = self.info.compute_capability;
                let src = kernels::device_functions() + attn::KERNEL_SRC;
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    kernels::compile_source(&self.ctx, maj, min, &src, "rlx_attention.cu")
                }))
                .unwrap_or_else(|p| Err(format!("NVRTC panicked: {}", panic_msg(p))))
            })
            .clone()
    }

    /// The elementwise kernel module, compiled by NVRTC on first use (cached, errors too).
    pub(crate) fn module(&self) -> Result<Arc<CudaModule>, String> {
        let mut m = self.module.lock().unwrap_or_else(|e| e.into_inner());
        if m.is_none() {
            let (maj, min) = self.info.compute_capability;
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                kernels::compile(&self.ctx, maj, min)
            }))
            .unwrap_or_else(|p| Err(format!("NVRTC panicked: {}", panic_msg(p))));
            *m = Some(r);
        }
        m.clone().expect("set above")
    }
}

/// The CUDA C source of the elementwise kernels (as given to NVRTC), for debugging.
#[doc(hidden)]
pub fn kernel_source() -> String {
    kernels::source()
}

/// The CUDA C source of the fused attention kernels (as given to NVRTC), for debugging.
#[doc(hidden)]
pub fn attention_kernel_source() -> String {
    kernels::device_functions() + attn::KERNEL_SRC
}

#[cfg(test)]
mod tests {
    /// Without cuDNN the error names the file and the directories searched; with it (the
    /// device machine) the version is 9.x and cudarc's by-name lookup found the same library.
    #[test]
    fn cudnn_loads_or_says_why() {
        match super::load_cudnn() {
            Ok(v) => {
                eprintln!("{v}");
                assert!(v.starts_with("cuDNN 9."), "{v}");
            }
            Err(e) => {
                eprintln!("{e}");
                assert!(e.contains(super::CUDNN_LIB), "{e}");
                if e.contains("not found") {
                    assert!(e.contains("searched"), "{e}");
                }
            }
        }
    }
}
