//! The CUDA C source of the elementwise kernels (one NVRTC program, compiled once per
//! process) and the mapping from IR ops to kernel names.
//!
//! Numerics follow rlx-cpu's scalar definitions (`rlx_ir::op`'s `apply_f32`/`apply_f64`):
//! ops the CPU computes in f32 are computed in f32 here (IEEE division and square root;
//! NVRTC runs with `--fmad=false --ftz=false --prec-div=true --prec-sqrt=true`, never fast
//! math), ops it computes through f64 (trigonometry, Erf, Gelu, Elu, ...) go through
//! double here. NaN rules: `Relu` is `x < 0 ? 0 : x` (NaN stays NaN), `Max`/`Min` return
//! NaN when either side is NaN, `Sign(NaN)` is NaN.

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use rlx_ir::{Activation, BinaryOp, UnaryOp};
use std::sync::Arc;

/// Unary kernels: (name, body of `float f(float x, float p0, float p1)`).
const UNARY: &[(&str, &str)] = &[
    ("neg", "return -x;"),
    ("abs", "return fabsf(x);"),
    ("exp", "return expf(x);"),
    ("log", "return logf(x);"),
    ("sqrt", "return sqrtf(x);"),
    ("rsqrt", "return 1.0f / sqrtf(x);"),
    ("reciprocal", "return 1.0f / x;"),
    ("sin", "return (float)sin((double)x);"),
    ("cos", "return (float)cos((double)x);"),
    ("tan", "return (float)tan((double)x);"),
    ("asin", "return (float)asin((double)x);"),
    ("acos", "return (float)acos((double)x);"),
    ("atan", "return (float)atan((double)x);"),
    ("sinh", "return (float)sinh((double)x);"),
    ("cosh", "return (float)cosh((double)x);"),
    ("asinh", "return (float)asinh((double)x);"),
    ("acosh", "return (float)acosh((double)x);"),
    ("atanh", "return (float)atanh((double)x);"),
    ("erf", "return (float)erf((double)x);"),
    ("floor", "return floorf(x);"),
    ("ceil", "return ceilf(x);"),
    ("round", "return rintf(x);"),
    (
        "sign",
        "if (rlx_isnan(x)) return x; return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);",
    ),
    // Activations (p0, p1: alpha, beta/gamma).
    ("relu", "return x < 0.0f ? 0.0f : x;"),
    ("leaky_relu", "return x < 0.0f ? (float)((double)p0 * (double)x) : x;"),
    (
        "sigmoid",
        "if (x >= 0.0f) return 1.0f / (1.0f + expf(-x)); float e = expf(x); return e / (1.0f + e);",
    ),
    ("tanh", "return tanhf(x);"),
    (
        "gelu",
        "double d = x; return (float)(0.5 * d * erfc(-d * 0.70710678118654752440));",
    ),
    (
        "gelu_tanh",
        "double d = x; double c = 0.79788456080286535588; return (float)(d * rlx_sigmoid(2.0 * c * (d + 0.044715 * d * d * d)));",
    ),
    ("silu", "double d = x; return (float)(d * rlx_sigmoid(d));"),
    (
        "elu",
        "return x < 0.0f ? (float)((double)p0 * expm1((double)x)) : x;",
    ),
    (
        "selu",
        "double g = p1; if (x <= 0.0f) return (float)(g * (double)p0 * expm1((double)x)); return (float)(g * (double)x);",
    ),
    (
        "hard_sigmoid",
        "double y = (double)p0 * (double)x + (double)p1; if (y != y) return (float)y; return (float)fmin(fmax(y, 0.0), 1.0);",
    ),
    (
        "hard_swish",
        "double d = x; double y = d / 6.0 + 0.5; if (y != y) return (float)y; return (float)(d * fmin(fmax(y, 0.0), 1.0));",
    ),
    (
        "softplus",
        "double d = x; if (d > 20.0) return x; return (float)log1p(exp(d));",
    ),
    ("softsign", "double d = x; return (float)(d / (1.0 + fabs(d)));"),
];

/// Binary kernels: (name, body of `float f(float x, float y)`).
const BINARY: &[(&str, &str)] = &[
    ("add", "return x + y;"),
    ("sub", "return x - y;"),
    ("mul", "return x * y;"),
    ("div", "return x / y;"),
    (
        "pow",
        "if (y == 2.0f) return x * x; if (y == 3.0f) return x * x * x; return (float)pow((double)x, (double)y);",
    ),
    (
        "max",
        "if (rlx_isnan(x) || rlx_isnan(y)) return RLX_NAN; return fmaxf(x, y);",
    ),
    (
        "min",
        "if (rlx_isnan(x) || rlx_isnan(y)) return RLX_NAN; return fminf(x, y);",
    ),
    ("rem", "return (float)fmod((double)x, (double)y);"),
    (
        "mod",
        "double b = y; double r = fmod((double)x, b); if (r != 0.0 && ((r < 0.0) != (b < 0.0))) r += b; return (float)r;",
    ),
];

/// The kernel (by name, `u_<name>`) and its two float parameters for a unary op on f32, or
/// `None` when there is no CUDA kernel for it (predicates with a Bool output, bit ops).
pub fn unary_kernel(op: &rlx_ir::Op) -> Option<(String, [f32; 2])> {
    use Activation as A;
    use UnaryOp as U;
    let (name, p) = match op {
        rlx_ir::Op::Unary(u) => (
            match u {
                U::Neg => "neg",
                U::Abs => "abs",
                U::Exp => "exp",
                U::Log => "log",
                U::Sqrt => "sqrt",
                U::Rsqrt => "rsqrt",
                U::Reciprocal => "reciprocal",
                U::Sin => "sin",
                U::Cos => "cos",
                U::Tan => "tan",
                U::Asin => "asin",
                U::Acos => "acos",
                U::Atan => "atan",
                U::Sinh => "sinh",
                U::Cosh => "cosh",
                U::Asinh => "asinh",
                U::Acosh => "acosh",
                U::Atanh => "atanh",
                U::Erf => "erf",
                U::Floor => "floor",
                U::Ceil => "ceil",
                U::Round => "round",
                U::Sign => "sign",
                U::Not | U::IsNaN | U::IsInf { .. } | U::BitNot => return None,
            },
            [0.0, 0.0],
        ),
        rlx_ir::Op::Activation(a) => match *a {
            A::Relu => ("relu", [0.0, 0.0]),
            A::LeakyRelu { alpha } => ("leaky_relu", [alpha, 0.0]),
            A::Sigmoid => ("sigmoid", [0.0, 0.0]),
            A::Tanh => ("tanh", [0.0, 0.0]),
            A::Gelu => ("gelu", [0.0, 0.0]),
            A::GeluTanh => ("gelu_tanh", [0.0, 0.0]),
            A::Silu => ("silu", [0.0, 0.0]),
            A::Elu { alpha } => ("elu", [alpha, 0.0]),
            A::Selu { alpha, gamma } => ("selu", [alpha, gamma]),
            A::HardSigmoid { alpha, beta } => ("hard_sigmoid", [alpha, beta]),
            A::HardSwish => ("hard_swish", [0.0, 0.0]),
            A::Softplus => ("softplus", [0.0, 0.0]),
            A::Softsign => ("softsign", [0.0, 0.0]),
        },
        _ => return None,
    };
    Some((format!("u_{name}"), p))
}

/// The kernel name (`b_<name>`) for a binary op on f32 -> f32, or `None` (predicates with
/// a Bool output, integer bit ops).
pub fn binary_kernel(b: BinaryOp) -> Option<String> {
    use BinaryOp as B;
    let name = match b {
        B::Add => "add",
        B::Sub => "sub",
        B::Mul => "mul",
        B::Div => "div",
        B::Pow => "pow",
        B::Max => "max",
        B::Min => "min",
        B::Rem => "rem",
        B::Mod => "mod",
        _ => return None,
    };
    Some(format!("b_{name}"))
}

/// The whole program's source.
pub fn source() -> String {
    let mut s = String::from(
        r#"// rlx-cuda elementwise kernels (generated; see crates/rlx-cuda/src/kernels.rs)
#define RLX_NAN __int_as_float(0x7fc00000)
__device__ __forceinline__ bool rlx_isnan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ double rlx_sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x); return e / (1.0 + e);
}
typedef unsigned long long u64;
typedef long long i64;
"#,
    );
    for (name, body) in UNARY {
        s += &format!(
            "__device__ __forceinline__ float f_{name}(float x, float p0, float p1) {{ {body} }}
extern \"C\" __global__ void u_{name}(const float* __restrict__ a, float* __restrict__ o, u64 n, float p0, float p1) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) o[i] = f_{name}(a[i], p0, p1);
}}
"
        );
    }
    // meta == 0: both inputs have the output's dims. Else meta = [rank, dims[rank],
    // strides of a[rank], strides of b[rank]] (stride 0 on a broadcast axis).
    for (name, body) in BINARY {
        s += &format!(
            "__device__ __forceinline__ float g_{name}(float x, float y) {{ {body} }}
extern \"C\" __global__ void b_{name}(const float* a, const float* b, float* __restrict__ o, u64 n, const i64* __restrict__ meta) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
    i64 ia = (i64)i, ib = (i64)i;
    if (meta) {{
      int r = (int)meta[0]; i64 rem = (i64)i; ia = 0; ib = 0;
      for (int d = r - 1; d >= 0; --d) {{
        i64 dim = meta[1 + d]; i64 c = rem % dim; rem /= dim;
        ia += c * meta[1 + r + d]; ib += c * meta[1 + 2 * r + d];
      }}
    }}
    o[i] = g_{name}(a[ia], b[ib]);
  }}
}}
"
        );
    }
    s
}

/// Compile [`source`] with NVRTC for compute capability `maj.min` and load it.
pub fn compile(ctx: &Arc<CudaContext>, maj: i32, min: i32) -> Result<Arc<CudaModule>, String> {
    let opts = |arch: bool| CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: None,
        options: if arch {
            vec![format!("--gpu-architecture=compute_{maj}{min}")]
        } else {
            vec![]
        },
        name: Some("rlx_elementwise.cu".into()),
        ..Default::default()
    };
    let src = source();
    let ptx = match compile_ptx_with_opts(&src, opts(true)) {
        Ok(p) => p,
        // An NVRTC older than the device: its default virtual architecture, JIT-compiled up.
        Err(first) => compile_ptx_with_opts(&src, opts(false))
            .map_err(|e| format!("NVRTC: {first:?}; without --gpu-architecture: {e:?}"))?,
    };
    ctx.load_module(ptx)
        .map_err(|e| format!("loading the NVRTC module: {e}"))
}
