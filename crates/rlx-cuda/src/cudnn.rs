//! Convolutions on cuDNN (legacy descriptor API, f32, NCHW / NCDHW).
//!
//! Planned once per Conv node at executor creation: [`conv_geometry`] (pure, tested on the
//! host) decides whether cuDNN can run the node and with which descriptor dims; [`ConvPlan::new`]
//! makes the descriptors and picks the algorithm with `cudnnGetConvolutionForwardAlgorithm_v7`
//! ([`choose_algo`], pure). What cuDNN cannot take (asymmetric pads that change the output,
//! more than 3 spatial dims, empty dims, sizes past 32 bits) runs on the direct `conv_f32`
//! kernel, which is also the fallback when `libcudnn.so.9` is absent.
//!
//! Numerics: math type `CUDNN_FMA_MATH` (FMA kernels only: no TF32, which cuDNN's
//! `CUDNN_DEFAULT_MATH` permits on Ampere and later) unless `RLX_CUDA_TF32=1`; only the
//! GEMM-like algorithms (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT), whose outputs
//! each read their own window only: FFT and Winograd transform whole tiles, so a NaN or an
//! infinity in one input element would reach outputs whose window does not hold it (and the
//! CPU's NaN positions would not be kept). Deterministic algorithms only.

use cudarc::cudnn::{result, sys};
use cudarc::driver::CudaStream;
use rlx_ir::ConvAttrs;
use std::ffi::c_void;
use std::sync::Arc;

/// The cuDNN view of one ONNX Conv: descriptor dims (a 1-D conv gets a leading spatial
/// axis of 1), one pad per spatial axis, strides, dilations, group count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConvGeom {
    /// Input `[N, C, spatial...]`.
    pub x: Vec<i32>,
    /// Filter `[M, C/groups, k...]`.
    pub w: Vec<i32>,
    /// Output `[N, M, spatial...]`.
    pub y: Vec<i32>,
    pub pads: Vec<i32>,
    pub strides: Vec<i32>,
    pub dilations: Vec<i32>,
    pub groups: i32,
}

fn to_i32(v: usize, what: &str) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what} {v} exceeds cuDNN's 32-bit sizes"))
}

/// Whether cuDNN can run the Conv with input dims `xd`, filter dims `wd`, output dims `od`
/// and attributes `a`, and with which descriptors; `Err(reason)` sends it to the direct
/// kernel. cuDNN takes one pad per axis: an axis with pads `(b, e)`, `b != e`, still runs on
/// cuDNN with pad `b` on both sides when that gives the same output length (the windows then
/// start at the same places and read the same input, the extra padding being zeros either
/// way); otherwise it does not.
pub(crate) fn conv_geometry(
    xd: &[usize],
    wd: &[usize],
    od: &[usize],
    a: &ConvAttrs,
) -> Result<ConvGeom, String> {
    let r = xd.len();
    if !(3..=5).contains(&r) || wd.len() != r || od.len() != r {
        return Err(format!(
            "cuDNN takes 1 to 3 spatial dims (input {xd:?}, filter {wd:?})"
        ));
    }
    let ns = r - 2;
    if a.pads.len() != ns || a.strides.len() != ns || a.dilations.len() != ns {
        return Err("conv attributes do not match the spatial rank".into());
    }
    if [xd, wd, od].iter().any(|d| d.contains(&0)) {
        return Err("an empty dimension".into());
    }
    let groups = a.groups.max(1);
    if xd[1] != wd[1] * groups || !wd[0].is_multiple_of(groups) || od[1] != wd[0] || od[0] != xd[0]
    {
        return Err(format!(
            "conv of {xd:?} by {wd:?} (groups {groups}) does not give {od:?}"
        ));
    }
    for d in [xd, wd, od] {
        let n: usize = d.iter().product();
        to_i32(n, "a tensor of")?;
    }
    let (mut pads, mut strides, mut dils) = (vec![], vec![], vec![]);
    for d in 0..ns {
        let (i, k, o) = (xd[2 + d], wd[2 + d], od[2 + d]);
        let (s, dl, (pb, pe)) = (a.strides[d], a.dilations[d], a.pads[d]);
        if s == 0 || dl == 0 {
            return Err("a zero stride or dilation".into());
        }
        let span = dl * (k - 1) + 1;
        // cuDNN's output length with pad `pb` on both sides.
        let sym = if i + 2 * pb >= span {
            (i + 2 * pb - span) / s + 1
        } else {
            0
        };
        if sym != o {
            return Err(format!(
                "pads ({pb}, {pe}) on spatial axis {d}: cuDNN takes one pad per axis, and pad {pb} on both sides gives {sym} outputs, not {o}"
            ));
        }
        pads.push(to_i32(pb, "pad")?);
        strides.push(to_i32(s, "stride")?);
        dils.push(to_i32(dl, "dilation")?);
    }
    let mut x: Vec<i32> = xd
        .iter()
        .map(|&v| to_i32(v, "dim"))
        .collect::<Result<_, _>>()?;
    let mut w: Vec<i32> = wd
        .iter()
        .map(|&v| to_i32(v, "dim"))
        .collect::<Result<_, _>>()?;
    let mut y: Vec<i32> = od
        .iter()
        .map(|&v| to_i32(v, "dim"))
        .collect::<Result<_, _>>()?;
    if ns == 1 {
        // cuDNN's descriptors start at 4-D: a leading spatial axis of length 1.
        x.insert(2, 1);
        w.insert(2, 1);
        y.insert(2, 1);
        pads.insert(0, 0);
        strides.insert(0, 1);
        dils.insert(0, 1);
    }
    Ok(ConvGeom {
        x,
        w,
        y,
        pads,
        strides,
        dilations: dils,
        groups: to_i32(groups, "groups")?,
    })
}

/// Packed (NCHW-contiguous) strides of `dims`.
pub(crate) fn packed_strides(dims: &[i32]) -> Vec<i32> {
    let mut s = vec![1i32; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// One row of `cudnnGetConvolutionForwardAlgorithm_v7`'s answer, as [`choose_algo`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// `cudnnConvolutionFwdAlgo_t` as a number.
    pub algo: u32,
    pub ok: bool,
    pub deterministic: bool,
    /// Its math type allows tensor cores (TF32 for f32 data).
    pub tensor_op: bool,
    pub memory: usize,
}

/// Algorithms whose every output reads only its own window (see the module doc):
/// IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT.
pub(crate) const WINDOW_ALGOS: [u32; 4] = [0, 1, 2, 3];

/// Largest workspace one convolution may ask for (the executor allocates one buffer of the
/// largest chosen need).
pub(crate) const WORKSPACE_CAP: usize = 1 << 30;

/// The candidates worth trying, best first (cuDNN's order kept): status success,
/// deterministic, a window algorithm, no tensor-op math unless `tf32`, workspace within
/// [`WORKSPACE_CAP`].
pub(crate) fn choose_algo(rows: &[Candidate], tf32: bool) -> Vec<usize> {
    rows.iter()
        .enumerate()
        .filter(|(_, c)| {
            c.ok && c.deterministic
                && WINDOW_ALGOS.contains(&c.algo)
                && (tf32 || !c.tensor_op)
                && c.memory <= WORKSPACE_CAP
        })
        .map(|(i, _)| i)
        .collect()
}

pub(crate) fn algo_name(a: u32) -> &'static str {
    match a {
        0 => "IMPLICIT_GEMM",
        1 => "IMPLICIT_PRECOMP_GEMM",
        2 => "GEMM",
        3 => "DIRECT",
        4 => "FFT",
        5 => "FFT_TILING",
        6 => "WINOGRAD",
        7 => "WINOGRAD_NONFUSED",
        _ => "?",
    }
}

fn algo_of(a: u32) -> sys::cudnnConvolutionFwdAlgo_t {
    use sys::cudnnConvolutionFwdAlgo_t as A;
    match a {
        0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        _ => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
    }
}

fn err(what: &str, e: result::CudnnError) -> String {
    format!("{what}: {e}")
}

/// A cuDNN handle bound to the executor's stream.
pub(crate) struct Handle {
    h: sys::cudnnHandle_t,
    /// Kept alive while the handle refers to it.
    _stream: Arc<CudaStream>,
}

// SAFETY: a cuDNN handle may be used from any thread, one thread at a time; the executor
// owning it is Send but not shared (its runs take `&mut self`).
unsafe impl Send for Handle {}

impl Handle {
    /// `cudnnCreate` + `cudnnSetStream` (the context must be current on this thread).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Handle, String> {
        let h = result::create_handle().map_err(|e| err("cudnnCreate", e))?;
        let handle = Handle {
            h,
            _stream: stream.clone(),
        };
        // SAFETY: a live handle (above) and the executor's live stream; both driver-API and
        // runtime streams are the same CUstream objects.
        unsafe { result::set_stream(h, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(|e| err("cudnnSetStream", e))?;
        Ok(handle)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate and destroyed once, here; errors are ignored (the
        // context may already be shutting down).
        let _ = unsafe { result::destroy_handle(self.h) };
    }
}

/// The descriptors and chosen algorithm of one Conv node on cuDNN.
pub(crate) struct ConvPlan {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    pub algo: u32,
    pub workspace: usize,
    pub tensor_op: bool,
}

// SAFETY: descriptors are plain host objects, used by one thread at a time (as Handle).
unsafe impl Send for ConvPlan {}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once by this plan (null when its creation
        // failed) and is destroyed once, here.
        unsafe {
            if !self.x.is_null() {
                let _ = result::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = result::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = result::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = result::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

impl ConvPlan {
    /// Descriptors for `g`, cuDNN's output dims checked against ours, and the first
    /// algorithm of [`choose_algo`] whose workspace query succeeds under the math type
    /// (FMA, or the candidate's own when `tf32`). `Err` names the call that failed or says
    /// that no algorithm qualified.
    ///
    /// `bf16`: input, filter and output in bfloat16 (the executor converts the f32 words to
    /// 16-bit encodings and back), f32 accumulation (compute type FLOAT), tensor-op math (what
    /// bfloat16 convolutions run on), the output rounded once to bfloat16 by cuDNN.
    pub(crate) fn new(
        h: &Handle,
        g: &ConvGeom,
        tf32: bool,
        bf16: bool,
    ) -> Result<ConvPlan, String> {
        let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let dt = if bf16 {
            sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16
        } else {
            f32t
        };
        // bfloat16 data runs on tensor cores only.
        let tf32 = tf32 || bf16;
        let mut p = ConvPlan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: 0,
            workspace: 0,
            tensor_op: false,
        };
        let nd = g.x.len() as i32;
        p.x = result::create_tensor_descriptor()
            .map_err(|e| err("cudnnCreateTensorDescriptor", e))?;
        p.y = result::create_tensor_descriptor()
            .map_err(|e| err("cudnnCreateTensorDescriptor", e))?;
        p.w = result::create_filter_descriptor()
            .map_err(|e| err("cudnnCreateFilterDescriptor", e))?;
        p.conv = result::create_convolution_descriptor()
            .map_err(|e| err("cudnnCreateConvolutionDescriptor", e))?;
        let (xs, ys) = (packed_strides(&g.x), packed_strides(&g.y));
        // SAFETY: live descriptors (above); every dims/strides array holds `nd` (or `nd - 2`
        // for the convolution's) ints and outlives the call.
        unsafe {
            result::set_tensornd_descriptor(p.x, dt, nd, g.x.as_ptr(), xs.as_ptr())
                .map_err(|e| err("cudnnSetTensorNdDescriptor (input)", e))?;
            result::set_tensornd_descriptor(p.y, dt, nd, g.y.as_ptr(), ys.as_ptr())
                .map_err(|e| err("cudnnSetTensorNdDescriptor (output)", e))?;
            result::set_filternd_descriptor(
                p.w,
                dt,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                nd,
                g.w.as_ptr(),
            )
            .map_err(|e| err("cudnnSetFilterNdDescriptor", e))?;
            result::set_convolutionnd_descriptor(
                p.conv,
                nd - 2,
                g.pads.as_ptr(),
                g.strides.as_ptr(),
                g.dilations.as_ptr(),
                // Cross-correlation, as ONNX Conv (CUDNN_CONVOLUTION flips the filter).
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                f32t,
            )
            .map_err(|e| err("cudnnSetConvolutionNdDescriptor", e))?;
            result::set_convolution_group_count(p.conv, g.groups)
                .map_err(|e| err("cudnnSetConvolutionGroupCount", e))?;
        }
        let base_math = if tf32 {
            sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            sys::cudnnMathType_t::CUDNN_FMA_MATH
        };
        // SAFETY: a live convolution descriptor.
        unsafe { result::set_convolution_math_type(p.conv, base_math) }
            .map_err(|e| err("cudnnSetConvolutionMathType", e))?;
        let mut ydims = vec![0i32; g.y.len()];
        // SAFETY: live descriptors; `ydims` holds `nd` ints.
        unsafe {
            sys::cudnnGetConvolutionNdForwardOutputDim(p.conv, p.x, p.w, nd, ydims.as_mut_ptr())
        }
        .result()
        .map_err(|e| err("cudnnGetConvolutionNdForwardOutputDim", e))?;
        if ydims != g.y {
            return Err(format!(
                "cuDNN computes output dims {ydims:?} where the graph has {:?}",
                g.y
            ));
        }
        const N: usize = 8;
        // SAFETY: a plain C struct of enums (each with a 0 variant), numbers and ints: all
        // zeros is a valid value.
        let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; N] =
            unsafe { std::mem::MaybeUninit::zeroed().assume_init() };
        let mut count = 0i32;
        // SAFETY: live handle and descriptors; `perf` holds N entries, `count` one int.
        unsafe {
            result::get_convolution_forward_algorithm(
                h.h,
                p.x,
                p.w,
                p.conv,
                p.y,
                N as i32,
                &mut count,
                perf.as_mut_ptr(),
            )
        }
        .map_err(|e| err("cudnnGetConvolutionForwardAlgorithm_v7", e))?;
        let rows: Vec<Candidate> = perf[..(count.clamp(0, N as i32) as usize)]
            .iter()
            .map(|r| Candidate {
                algo: r.algo as u32,
                ok: r.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
                deterministic: r.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
                tensor_op: matches!(
                    r.mathType,
                    sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                        | sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                ),
                memory: r.memory,
            })
            .collect();
        let mut tried = vec![];
        for i in choose_algo(&rows, tf32) {
            let c = rows[i];
            let math = if tf32 { perf[i].mathType } else { base_math };
            // SAFETY: live descriptors and handle.
            let ws = unsafe {
                result::set_convolution_math_type(p.conv, math).and_then(|()| {
                    result::get_convolution_forward_workspace_size(
                        h.h,
                        p.x,
                        p.w,
                        p.conv,
                        p.y,
                        algo_of(c.algo),
                    )
                })
            };
            match ws {
                Ok(ws) if ws <= WORKSPACE_CAP => {
                    p.algo = c.algo;
                    p.workspace = ws;
                    p.tensor_op = tf32 && c.tensor_op;
                    return Ok(p);
                }
                Ok(ws) => tried.push(format!("{} needs {ws} bytes", algo_name(c.algo))),
                Err(e) => tried.push(format!("{}: {e}", algo_name(c.algo))),
            }
        }
        let listed: Vec<String> = rows
            .iter()
            .map(|c| {
                format!(
                    "{}{}{}",
                    algo_name(c.algo),
                    if c.ok { "" } else { " (unsupported)" },
                    if c.tensor_op { " (tensor op)" } else { "" }
                )
            })
            .collect();
        Err(format!(
            "no deterministic window algorithm (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT) among cuDNN's [{}]{}",
            listed.join(", "),
            if tried.is_empty() {
                String::new()
            } else {
                format!("; tried: {}", tried.join("; "))
            }
        ))
    }

    /// `y = conv(x, w)` on the handle's stream, with `ws` (`ws_bytes` long, or null when 0).
    ///
    /// # Safety
    /// `x`, `w`, `y` are device addresses of f32 buffers of at least the descriptors' sizes,
    /// `ws` of at least `self.workspace` bytes; all stay alive until the stream has run it.
    pub(crate) unsafe fn forward(
        &self,
        h: &Handle,
        x: u64,
        w: u64,
        y: u64,
        ws: u64,
        ws_bytes: usize,
    ) -> Result<(), String> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        result::convolution_forward(
            h.h,
            &alpha as *const f32 as *const c_void,
            self.x,
            x as *const c_void,
            self.w,
            w as *const c_void,
            self.conv,
            algo_of(self.algo),
            ws as *mut c_void,
            ws_bytes,
            &beta as *const f32 as *const c_void,
            self.y,
            y as *mut c_void,
        )
        .map_err(|e| err("cudnnConvolutionForward", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(s: &[usize], p: &[(usize, usize)], d: &[usize], g: usize) -> ConvAttrs {
        ConvAttrs {
            strides: s.to_vec(),
            pads: p.to_vec(),
            dilations: d.to_vec(),
            groups: g,
        }
    }

    #[test]
    fn geometry_of_resnet_and_odd_convs() {
        // ResNet-50 stem: 7x7 stride 2 pad 3 on 3 channels.
        let g = conv_geometry(
            &[32, 3, 224, 224],
            &[64, 3, 7, 7],
            &[32, 64, 112, 112],
            &attrs(&[2, 2], &[(3, 3), (3, 3)], &[1, 1], 1),
        )
        .unwrap();
        assert_eq!(g.x, vec![32, 3, 224, 224]);
        assert_eq!(g.w, vec![64, 3, 7, 7]);
        assert_eq!(g.y, vec![32, 64, 112, 112]);
        assert_eq!(
            (g.pads.clone(), g.strides.clone()),
            (vec![3, 3], vec![2, 2])
        );
        assert_eq!(g.groups, 1);
        assert_eq!(packed_strides(&g.x), vec![3 * 224 * 224, 224 * 224, 224, 1]);
        // Depthwise 3x3 with dilation 2.
        let g = conv_geometry(
            &[2, 8, 9, 9],
            &[8, 1, 3, 3],
            &[2, 8, 9, 9],
            &attrs(&[1, 1], &[(2, 2), (2, 2)], &[2, 2], 8),
        )
        .unwrap();
        assert_eq!((g.groups, g.dilations.clone()), (8, vec![2, 2]));
        // 1-D: a leading spatial axis of 1.
        let g = conv_geometry(
            &[1, 5, 13],
            &[7, 5, 4],
            &[1, 7, 5],
            &attrs(&[3], &[(2, 2)], &[1], 1),
        )
        .unwrap();
        assert_eq!(g.x, vec![1, 5, 1, 13]);
        assert_eq!(g.w, vec![7, 5, 1, 4]);
        assert_eq!(g.y, vec![1, 7, 1, 5]);
        assert_eq!(
            (g.pads, g.strides, g.dilations),
            (vec![0, 2], vec![1, 3], vec![1, 1])
        );
        // 3-D stays 5-D.
        let g = conv_geometry(
            &[1, 2, 4, 5, 6],
            &[3, 2, 2, 3, 2],
            &[1, 3, 3, 3, 7],
            &attrs(&[1, 1, 1], &[(0, 0), (0, 0), (1, 1)], &[1, 1, 1], 1),
        )
        .unwrap();
        assert_eq!(g.y, vec![1, 3, 3, 3, 7]);
    }

    #[test]
    fn pad_symmetry_decision() {
        // (1, 0) on a 3x3 stride 2 conv of 8: ONNX gives (8+1-3)/2+1 = 4; pad 1 on both
        // sides gives (8+2-3)/2+1 = 4: the end pad is never read, cuDNN runs it.
        let a = attrs(&[2, 2], &[(1, 0), (1, 0)], &[1, 1], 1);
        assert!(conv_geometry(&[1, 4, 8, 8], &[4, 4, 3, 3], &[1, 4, 4, 4], &a).is_ok());
        // (0, 1) on the same: ONNX 4 outputs, pad 0 both sides gives 3: direct kernel.
        let a = attrs(&[2, 2], &[(0, 1), (0, 1)], &[1, 1], 1);
        let e = conv_geometry(&[1, 4, 8, 8], &[4, 4, 3, 3], &[1, 4, 4, 4], &a).unwrap_err();
        assert!(e.contains("one pad per axis"), "{e}");
        // (1, 0) at stride 1: ONNX 7 outputs, symmetric 8: direct kernel.
        let a = attrs(&[1, 1], &[(1, 1), (1, 0)], &[1, 1], 1);
        assert!(conv_geometry(&[1, 4, 7, 7], &[4, 4, 3, 3], &[1, 4, 7, 6], &a).is_err());
        // (2, 1) with stride 1 on the test suite's first case: direct.
        let a = attrs(&[2, 1], &[(1, 0), (2, 1)], &[1, 2], 2);
        assert!(conv_geometry(&[2, 6, 9, 11], &[4, 3, 3, 3], &[2, 4, 4, 10], &a).is_err());
    }

    #[test]
    fn geometry_rejects_what_cudnn_cannot_take() {
        let a = attrs(&[1, 1], &[(0, 0), (0, 0)], &[1, 1], 1);
        assert!(conv_geometry(&[0, 4, 8, 8], &[4, 4, 1, 1], &[0, 4, 8, 8], &a).is_err());
        assert!(conv_geometry(&[1, 4, 8, 8], &[4, 4, 1, 1], &[1, 5, 8, 8], &a).is_err());
        let a4 = attrs(&[1; 4], &[(0, 0); 4], &[1; 4], 1);
        let e = conv_geometry(
            &[1, 1, 2, 2, 2, 2],
            &[1, 1, 1, 1, 1, 1],
            &[1, 1, 2, 2, 2, 2],
            &a4,
        )
        .unwrap_err();
        assert!(e.contains("1 to 3 spatial dims"), "{e}");
        // Past 2^31 elements.
        let e = conv_geometry(
            &[1 << 16, 1, 1 << 8, 1 << 8],
            &[1, 1, 1, 1],
            &[1 << 16, 1, 1 << 8, 1 << 8],
            &a,
        )
        .unwrap_err();
        assert!(e.contains("32-bit"), "{e}");
    }

    #[test]
    fn algorithm_choice() {
        let c = |algo, ok, det, tensor_op, memory| Candidate {
            algo,
            ok,
            deterministic: det,
            tensor_op,
            memory,
        };
        let rows = [
            c(6, true, true, false, 100), // Winograd: never
            c(1, true, true, true, 0),    // tensor op: only with TF32
            c(4, true, true, false, 0),   // FFT: never
            c(0, false, true, false, 0),  // unsupported
            c(2, true, false, false, 0),  // non-deterministic
            c(1, true, true, false, 4096),
            c(0, true, true, false, WORKSPACE_CAP + 1),
            c(0, true, true, false, 0),
        ];
        assert_eq!(choose_algo(&rows, false), vec![5, 7]);
        assert_eq!(choose_algo(&rows, true), vec![1, 5, 7]);
        assert!(choose_algo(&rows[..3], false).is_empty());
        assert_eq!(algo_name(1), "IMPLICIT_PRECOMP_GEMM");
    }
}
