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

/// Storage instances of the float kernels: (kernel name suffix, C storage type). f32 values
/// are stored as `float`; bfloat16 values as 16-bit `rlx_bf` (`_bf` kernels load 16 bits,
/// compute in f32 as the f32 kernel does, and store the result rounded to bfloat16 once).
const STORAGE: &[(&str, &str)] = &[("", "float"), ("_bf", "rlx_bf")];

/// Unary kernels: (name, body of `float f(float x, float p0, float p1)`).
const UNARY: &[(&str, &str)] = &[
    // A copy (Cast between float dtypes, before the output's rounding).
    ("copy", "return x;"),
    // Sign-bit operations, as Rust's `-x` / `x.abs()` on the CPU: a NaN keeps its payload
    // and gets its sign flipped/cleared (the H200's `neg.f32` returned 0x7fffffff for the
    // NaN 0x7fc00000, where the CPU gives 0xffc00000).
    ("neg", "return __uint_as_float(__float_as_uint(x) ^ 0x80000000u);"),
    ("abs", "return __uint_as_float(__float_as_uint(x) & 0x7fffffffu);"),
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

/// f32 bodies of unary ops that the f32 kernels compute through double (as rlx-cpu), used
/// for bfloat16 values (`fb_<name>`; the `_bf` kernels and bfloat16 members of fused groups):
/// a result rounded to bfloat16's 8 significant bits does not need double's accuracy (f32's
/// erfcf/expf are within a few f32 ulps, 2^-16 of a bfloat16 ulp), and double arithmetic made
/// BERT's bfloat16 Gelu compute-bound. IEEE cases as the double forms: NaN stays NaN,
/// gelu(-inf) and silu(-inf) are NaN (-inf * 0), +inf stays +inf.
const BF16_F32_BODIES: &[(&str, &str)] = &[
    ("gelu", "return 0.5f * x * erfcf(-x * 0.70710678118654752440f);"),
    (
        "silu",
        "if (x >= 0.0f) return x / (1.0f + expf(-x)); float e = expf(x); return x * e / (1.0f + e);",
    ),
    ("erf", "return erff(x);"),
];

/// The device function a bfloat16 op calls: `fb_<name>` (see [`BF16_F32_BODIES`]).
fn fb_functions() -> String {
    UNARY.iter().map(|(name, _)| fb_def(name)).collect()
}

fn fb_def(name: &str) -> String {
    let body = BF16_F32_BODIES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or_else(
            || format!("return f_{name}(x, p0, p1);"),
            |(_, b)| b.to_string(),
        );
    format!(
        "__device__ __forceinline__ float fb_{name}(float x, float p0, float p1) {{ {body} }}\n"
    )
}

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

/// Definitions every program starts with: NaN helpers, integer types, broadcast indexing.
const PRELUDE: &str = r#"// rlx-cuda elementwise kernels (generated; see crates/rlx-cuda/src/kernels.rs)
#define RLX_NAN __int_as_float(0x7fc00000)
__device__ __forceinline__ bool rlx_isnan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ double rlx_sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x); return e / (1.0 + e);
}
typedef unsigned long long u64;
typedef long long i64;
// An f32 value rounded to bfloat16 / float16 (round to nearest, ties to even; float16
// overflows to ±inf from 65520 up and keeps subnormals down to 2^-24; NaN unchanged): what
// round_bf16/round_f16 do in place after a node, and fused half-precision kernels after each
// member.
__device__ __forceinline__ float rlx_rbf16(float v) {
  unsigned b = __float_as_uint(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) return v;
  unsigned lsb = (b >> 16) & 1u;
  return __uint_as_float((b + 0x7fffu + lsb) & 0xffff0000u);
}
__device__ __forceinline__ float rlx_rf16(float v) {
  unsigned b = __float_as_uint(v);
  unsigned s = b & 0x80000000u, a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return v;
  if (a >= 0x477ff000u) return __uint_as_float(s | 0x7f800000u);
  if (a < 0x38800000u) {
    // Below 2^-14: multiples of 2^-24 (both scalings are exact; rintf ties to even).
    float q = rintf(__uint_as_float(a) * 16777216.0f) * 5.9604644775390625e-8f;
    return __uint_as_float(s | __float_as_uint(q));
  }
  unsigned lsb = (a >> 13) & 1u;
  return __uint_as_float(s | ((a + 0xfffu + lsb) & 0xffffe000u));
}
// bfloat16 storage (2 bytes per value on the device): rlx_f widens a stored value to f32
// (exact), rlx_put stores an f32 result (bfloat16: round to nearest, ties to even; a NaN keeps
// its sign and top payload bits with the quiet bit set, as half::bf16::from_f32). Kernels
// are written once over the storage type S (float or rlx_bf) with these, so the f32
// instantiation is the f32 kernel as before.
struct rlx_bf { unsigned short b; };
__device__ __forceinline__ float rlx_f(float x) { return x; }
__device__ __forceinline__ float rlx_f(rlx_bf x) { return __uint_as_float((unsigned)x.b << 16); }
__device__ __forceinline__ unsigned short rlx_bf16_bits(float v) {
  unsigned b = __float_as_uint(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b >> 16) | 0x40u);
  return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void rlx_put(float& d, float v) { d = v; }
__device__ __forceinline__ void rlx_put(rlx_bf& d, float v) { d.b = rlx_bf16_bits(v); }
// Broadcast indices of output element i (meta = [rank, dims, strides of a, strides of b]).
// 32-bit division when the output has fewer than 2^31 elements (inputs are never larger):
// 64-bit division is emulated on the GPU and made elementwise kernels several times slower.
__device__ __forceinline__ void rlx_bidx(u64 i, u64 n, const i64* __restrict__ meta, i64* ia, i64* ib) {
  int r = (int)meta[0];
  if (n <= 0x7fffffffull) {
    unsigned rem = (unsigned)i, ua = 0u, ub = 0u;
    for (int d = r - 1; d >= 0; --d) {
      unsigned dim = (unsigned)meta[1 + d]; unsigned c = rem % dim; rem /= dim;
      ua += c * (unsigned)meta[1 + r + d]; ub += c * (unsigned)meta[1 + 2 * r + d];
    }
    *ia = (i64)ua; *ib = (i64)ub;
    return;
  }
  i64 rem = (i64)i, xa = 0, xb = 0;
  for (int d = r - 1; d >= 0; --d) {
    i64 dim = meta[1 + d]; i64 c = rem % dim; rem /= dim;
    xa += c * meta[1 + r + d]; xb += c * meta[1 + 2 * r + d];
  }
  *ia = xa; *ib = xb;
}
// NaN/Inf counts of one thread: n0..n2 = NaN, +inf, -inf counts, f0..f2 their first indices
// (a struct of scalars, so it stays in registers; arrays indexed at run time would go to
// local memory).
struct RlxCnt { u64 n0, n1, n2, f0, f1, f2; };
__device__ __forceinline__ void rlx_cnt_init(RlxCnt& c) { c.n0 = c.n1 = c.n2 = 0ull; c.f0 = c.f1 = c.f2 = ~0ull; }
__device__ __forceinline__ void rlx_scan1(unsigned u, u64 i, RlxCnt& c) {
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu) { c.n0 += 1ull; if (i < c.f0) c.f0 = i; }
    else if (u >> 31) { c.n2 += 1ull; if (i < c.f2) c.f2 = i; }
    else { c.n1 += 1ull; if (i < c.f1) c.f1 = i; }
  }
}
// Whether a value is NaN or ±inf (all-ones exponent).
__device__ __forceinline__ bool rlx_nf(float t) { return (__float_as_uint(t) & 0x7f800000u) == 0x7f800000u; }
__device__ __forceinline__ bool rlx_cnt_any(const RlxCnt& c) { return (c.n0 | c.n1 | c.n2) != 0ull; }
// Add a warp's counts into out[0..6] = [nan, +inf, -inf, first nan, first +inf, first -inf].
// Every lane of the warp calls it (after the kernel's loop); the lanes' counts are combined
// by shuffles and lane 0 makes the atomic operations, only when some lane saw a non-finite
// value (a masked attention row of -inf otherwise sent millions of atomics to one address).
__device__ __forceinline__ u64 rlx_min64(u64 a, u64 b) { return a < b ? a : b; }
__device__ __forceinline__ void rlx_flush(RlxCnt c, u64* out) {
  if (!__any_sync(0xffffffffu, rlx_cnt_any(c))) return;
  for (int s = 16; s > 0; s >>= 1) {
    c.n0 += __shfl_down_sync(0xffffffffu, c.n0, s);
    c.n1 += __shfl_down_sync(0xffffffffu, c.n1, s);
    c.n2 += __shfl_down_sync(0xffffffffu, c.n2, s);
    c.f0 = rlx_min64(c.f0, __shfl_down_sync(0xffffffffu, c.f0, s));
    c.f1 = rlx_min64(c.f1, __shfl_down_sync(0xffffffffu, c.f1, s));
    c.f2 = rlx_min64(c.f2, __shfl_down_sync(0xffffffffu, c.f2, s));
  }
  if ((threadIdx.x & 31u) != 0u) return;
  if (c.n0) { atomicAdd(out, c.n0); atomicMin(out + 3, c.f0); }
  if (c.n1) { atomicAdd(out + 1, c.n1); atomicMin(out + 4, c.f1); }
  if (c.n2) { atomicAdd(out + 2, c.n2); atomicMin(out + 5, c.f2); }
}
"#;

/// The device functions `f_<unary>(x, p0, p1)` and `g_<binary>(x, y)` after [`PRELUDE`]:
/// what fused elementwise kernels ([`crate::fuse`]) are written in.
pub fn device_functions() -> String {
    let mut s = String::from(PRELUDE);
    for (name, body) in UNARY {
        s += &format!(
            "__device__ __forceinline__ float f_{name}(float x, float p0, float p1) {{ {body} }}\n"
        );
    }
    for (name, body) in BINARY {
        s += &format!("__device__ __forceinline__ float g_{name}(float x, float y) {{ {body} }}\n");
    }
    s + &fb_functions()
}

/// The whole program's source.
pub fn source() -> String {
    let mut s = String::from(PRELUDE);
    for (name, body) in UNARY {
        s += &format!(
            "__device__ __forceinline__ float f_{name}(float x, float p0, float p1) {{ {body} }}
"
        );
        s += &fb_def(name);
        for (sfx, ty) in STORAGE {
            let f = if sfx.is_empty() { "f" } else { "fb" };
            s += &format!(
                "extern \"C\" __global__ void u_{name}{sfx}(const {ty}* __restrict__ a, {ty}* __restrict__ o, u64 n, float p0, float p1) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) rlx_put(o[i], {f}_{name}(rlx_f(a[i]), p0, p1));
}}
"
            );
        }
    }
    // meta == 0: both inputs have the output's dims. Else meta = [rank, dims[rank],
    // strides of a[rank], strides of b[rank]] (stride 0 on a broadcast axis).
    for (name, body) in BINARY {
        s += &format!(
            "__device__ __forceinline__ float g_{name}(float x, float y) {{ {body} }}
"
        );
        for (sfx, ty) in STORAGE {
            s += &format!(
                "extern \"C\" __global__ void b_{name}{sfx}(const {ty}* a, const {ty}* b, {ty}* __restrict__ o, u64 n, const i64* __restrict__ meta) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
    i64 ia = (i64)i, ib = (i64)i;
    if (meta) rlx_bidx(i, n, meta, &ia, &ib);
    rlx_put(o[i], g_{name}(rlx_f(a[ia]), rlx_f(b[ib])));
  }}
}}
"
            );
        }
    }
    for (name, ty, body) in PRED2 {
        s += &format!(
            "__device__ __forceinline__ bool q_{name}({ty} x, {ty} y) {{ {body} }}
extern \"C\" __global__ void p_{name}(const {ty}* a, const {ty}* b, unsigned* __restrict__ o, u64 n, const i64* __restrict__ meta) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
    i64 ia = (i64)i, ib = (i64)i;
    if (meta) rlx_bidx(i, n, meta, &ia, &ib);
    o[i] = q_{name}(a[ia], b[ib]) ? 1u : 0u;
  }}
}}
"
        );
    }
    s += MOVE;
    for (sfx, ty) in [("", "u32"), ("_h", "unsigned short")] {
        s += &WORDS.replace("_WSFX", sfx).replace("WORD", ty);
    }
    s += SCAN;
    s += ROUND;
    s
}

/// Comparison / logic kernels producing Bool (stored as u32 0/1 on the device):
/// (name, input C type, body of `bool f(T x, T y)`). Comparisons on f32 are IEEE (any NaN
/// operand: false), as Rust's `<`/`==` on the CPU.
const PRED2: &[(&str, &str, &str)] = &[
    ("eq", "float", "return x == y;"),
    ("lt", "float", "return x < y;"),
    ("le", "float", "return x <= y;"),
    ("gt", "float", "return x > y;"),
    ("ge", "float", "return x >= y;"),
    ("and", "unsigned", "return (x != 0u) && (y != 0u);"),
    ("or", "unsigned", "return (x != 0u) || (y != 0u);"),
    ("xor", "unsigned", "return (x != 0u) != (y != 0u);"),
];

/// The kernel (`p_<name>`) for a Bool-producing binary op and the input dtype it takes.
pub fn pred_kernel(b: BinaryOp) -> Option<(String, rlx_ir::DType)> {
    use rlx_ir::DType as D;
    use BinaryOp as B;
    let (name, dt) = match b {
        B::Eq => ("eq", D::F32),
        B::Lt => ("lt", D::F32),
        B::Le => ("le", D::F32),
        B::Gt => ("gt", D::F32),
        B::Ge => ("ge", D::F32),
        B::And => ("and", D::Bool),
        B::Or => ("or", D::Bool),
        B::Xor => ("xor", D::Bool),
        _ => return None,
    };
    Some((format!("p_{name}"), dt))
}

/// Kernels on 32-bit words (f32, i32, u32, Bool as u32) and index maps: reductions,
/// the index-map copy (Transpose/Broadcast/Slice/Tile/Pad/Concat), Gather, Select,
/// unary predicates and casts.
const MOVE: &str = r#"
typedef unsigned int u32;
// Reduce over a row of R elements per output, one block (256 threads) per output.
// meta = [nk, kept dims[nk], kept strides[nk], nr, red dims[nr], red strides[nr]].
// kind: 0 Sum, 1 Mean, 2 Max, 3 Min, 4 Prod. Sum/Mean/Prod accumulate in double and round
// once (as rlx-cpu); Max/Min return NaN when any element is NaN.
template <typename S>
__device__ __forceinline__ void reduce_t(const S* __restrict__ x, S* __restrict__ o, u64 nout, const i64* __restrict__ meta, int kind) {
  __shared__ double sh[256];
  __shared__ int shn[256];
  int nk = (int)meta[0];
  const i64* kd = meta + 1; const i64* ks = meta + 1 + nk;
  int nr = (int)meta[1 + 2 * nk];
  const i64* rd = meta + 2 + 2 * nk; const i64* rs = meta + 2 + 2 * nk + nr;
  i64 R = 1; for (int d = 0; d < nr; ++d) R *= rd[d];
  for (u64 ob = blockIdx.x; ob < nout; ob += gridDim.x) {
    i64 rem = (i64)ob, base = 0;
    for (int d = nk - 1; d >= 0; --d) { i64 c = rem % kd[d]; rem /= kd[d]; base += c * ks[d]; }
    double acc = (kind == 4) ? 1.0 : 0.0;
    float m = __int_as_float((kind == 2) ? (int)0xff800000u : 0x7f800000);
    int nan = 0;
    for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
      i64 q = r, off = base;
      for (int d = nr - 1; d >= 0; --d) { i64 c = q % rd[d]; q /= rd[d]; off += c * rs[d]; }
      float v = rlx_f(x[off]);
      if (kind <= 1) acc += (double)v;
      else if (kind == 4) acc *= (double)v;
      else if (rlx_isnan(v)) nan = 1;
      else if (kind == 2) { if (v > m) m = v; }
      else { if (v < m) m = v; }
    }
    if (kind >= 2 && kind <= 3) acc = (double)m;
    sh[threadIdx.x] = acc; shn[threadIdx.x] = nan;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if ((int)threadIdx.x < s) {
        double a = sh[threadIdx.x], b = sh[threadIdx.x + s];
        if (kind <= 1) a = a + b;
        else if (kind == 4) a = a * b;
        else if (kind == 2) { if (b > a) a = b; }
        else { if (b < a) a = b; }
        sh[threadIdx.x] = a; shn[threadIdx.x] |= shn[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      double a = sh[0];
      if (kind == 1) a = a / (double)R;
      float r = (float)a;
      if ((kind == 2 || kind == 3) && shn[0]) r = RLX_NAN;
      rlx_put(o[ob], r);
    }
    __syncthreads();
  }
}
extern "C" __global__ void reduce_f32(const float* __restrict__ x, float* __restrict__ o, u64 nout, const i64* __restrict__ meta, int kind) { reduce_t<float>(x, o, nout, meta, kind); }
extern "C" __global__ void reduce_f32_bf(const rlx_bf* __restrict__ x, rlx_bf* __restrict__ o, u64 nout, const i64* __restrict__ meta, int kind) { reduce_t<rlx_bf>(x, o, nout, meta, kind); }


// Reduce over the trailing axes (each output's R inputs contiguous at ob*R): one warp per
// output, lanes stride the row, accumulation in double (Sum/Mean/Prod) or f32 (Max/Min with
// a NaN flag), combined by warp shuffles: the same values as reduce_f32, without its index
// arithmetic and with 8 rows per 256-thread block instead of one.
template <typename S>
__device__ __forceinline__ void reduce_rows_t(const S* __restrict__ x, S* __restrict__ o, u64 nout, u64 R, int kind) {
  unsigned lane = threadIdx.x & 31u;
  u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  u64 nw = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 ob = w; ob < nout; ob += nw) {
    const S* row = x + ob * R;
    double acc = (kind == 4) ? 1.0 : 0.0;
    float m = __int_as_float((kind == 2) ? (int)0xff800000u : 0x7f800000);
    int nan = 0;
    for (u64 r = lane; r < R; r += 32) {
      float v = rlx_f(row[r]);
      if (kind <= 1) acc += (double)v;
      else if (kind == 4) acc *= (double)v;
      else if (rlx_isnan(v)) nan = 1;
      else if (kind == 2) { if (v > m) m = v; }
      else { if (v < m) m = v; }
    }
    for (int s = 16; s > 0; s >>= 1) {
      double b = __shfl_down_sync(0xffffffffu, acc, s);
      float mb = __shfl_down_sync(0xffffffffu, m, s);
      if (kind <= 1) acc += b;
      else if (kind == 4) acc *= b;
      else if (kind == 2) { if (mb > m) m = mb; }
      else { if (mb < m) m = mb; }
    }
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) {
      float res;
      if (kind == 2 || kind == 3) res = nan ? RLX_NAN : m;
      else if (kind == 1) res = (float)(acc / (double)R);
      else res = (float)acc;
      rlx_put(o[ob], res);
    }
  }
}
extern "C" __global__ void reduce_rows(const float* __restrict__ x, float* __restrict__ o, u64 nout, u64 R, int kind) { reduce_rows_t<float>(x, o, nout, R, kind); }
extern "C" __global__ void reduce_rows_bf(const rlx_bf* __restrict__ x, rlx_bf* __restrict__ o, u64 nout, u64 R, int kind) { reduce_rows_t<rlx_bf>(x, o, nout, R, kind); }

// im2col for a 2-D convolution (groups 1): col[b][(c*KH + ky)*KW + kx][oy*OW + ox] =
// x[b][c][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw], 0 outside the input (a padded position then
// adds 0*w in the GEMM, as rlx-cpu's im2col does: an inf or NaN weight still gives NaN).
// meta = [C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw]; n = N*C*KH*KW*OH*OW < 2^31.
extern "C" __global__ void im2col_f32(const float* __restrict__ x, float* __restrict__ col, u64 n, const i64* __restrict__ meta) {
  unsigned C = (unsigned)meta[0], H = (unsigned)meta[1], W = (unsigned)meta[2];
  unsigned KH = (unsigned)meta[3], KW = (unsigned)meta[4], OH = (unsigned)meta[5], OW = (unsigned)meta[6];
  int sh = (int)meta[7], sw = (int)meta[8], ph = (int)meta[9], pw = (int)meta[10];
  int dh = (int)meta[11], dw = (int)meta[12];
  unsigned OHW = OH * OW, K = C * KH * KW;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    unsigned q = (unsigned)i;
    unsigned p = q % OHW; q /= OHW;
    unsigned kk = q % K; unsigned b = q / K;
    unsigned ox = p % OW, oy = p / OW;
    unsigned kx = kk % KW; unsigned t = kk / KW; unsigned ky = t % KH; unsigned c = t / KH;
    int iy = (int)oy * sh - ph + (int)ky * dh;
    int ix = (int)ox * sw - pw + (int)kx * dw;
    float v = 0.0f;
    if (iy >= 0 && iy < (int)H && ix >= 0 && ix < (int)W)
      v = x[((u64)(b * C + c) * H + (unsigned)iy) * W + (unsigned)ix];
    col[i] = v;
  }
}

// o[i] += bias[(i / hw) % m]: a convolution's bias over NCHW output.
extern "C" __global__ void bias_nchw(float* __restrict__ o, const float* __restrict__ bias, u64 n, u64 hw, u64 m) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 c = (n <= 0x7fffffffull) ? (u64)(((unsigned)i / (unsigned)hw) % (unsigned)m) : (i / hw) % m;
    o[i] = o[i] + bias[c];
  }
}

// 2-D MaxPool / AveragePool, one thread per output. meta = [H, W, OH, OW, kh, kw, sh, sw,
// ph, pw, pe_h, pe_w, dh, dw, kind (0 max, 1 avg), count_include_pad]. Taps in window order
// (rows, then columns), as rlx-cpu. Max: a NaN tap gives NaN, no valid tap -inf. Avg: the f32
// sum of the valid taps over their count, or over the taps inside the declared pads with
// count_include_pad; a sum that is not finite is redone in double, as rlx-cpu does.
template <typename S>
__device__ __forceinline__ void pool2d_t(const S* __restrict__ x, S* __restrict__ o, u64 n, const i64* __restrict__ meta) {
  int H = (int)meta[0], W = (int)meta[1], OH = (int)meta[2], OW = (int)meta[3];
  int kh = (int)meta[4], kw = (int)meta[5], sh = (int)meta[6], sw = (int)meta[7];
  int ph = (int)meta[8], pw = (int)meta[9], peh = (int)meta[10], pew = (int)meta[11];
  int dh = (int)meta[12], dw = (int)meta[13], kind = (int)meta[14], cip = (int)meta[15];
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    // 32-bit division below 2^31 outputs (64-bit division is emulated: ResNet-50's MaxPool
    // took 134 us in bfloat16).
    int ox, oy; u64 plane;
    if (n <= 0x7fffffffull) {
      unsigned q = (unsigned)i; ox = (int)(q % (unsigned)OW); q /= (unsigned)OW;
      oy = (int)(q % (unsigned)OH); plane = (u64)(q / (unsigned)OH);
    } else {
      u64 q = i; ox = (int)(q % OW); q /= OW; oy = (int)(q % OH); plane = q / OH;
    }
    const S* xp = x + plane * (u64)H * W;
    float acc = kind == 0 ? __int_as_float(0xff800000) : 0.0f;
    bool nan = false;
    float nanv = 0.0f;
    int valid = 0, counted = 0;
    for (int ky = 0; ky < kh; ++ky) {
      int iy = oy * sh - ph + ky * dh;
      bool yin = iy >= 0 && iy < H, ycount = iy >= -ph && iy < H + peh;
      for (int kx = 0; kx < kw; ++kx) {
        int ix = ox * sw - pw + kx * dw;
        if (ycount && ix >= -pw && ix < W + pew) counted++;
        if (!yin || ix < 0 || ix >= W) continue;
        float v = rlx_f(xp[(u64)iy * W + ix]);
        valid++;
        // Max: the first NaN tap wins with its payload (as rlx-cpu's 2-D pool).
        if (kind == 0) { if (rlx_isnan(v)) { if (!nan) { nan = true; nanv = v; } } else if (v > acc) acc = v; }
        else acc = __fadd_rn(acc, v);
      }
    }
    float r;
    if (kind == 0) r = nan ? nanv : acc;
    else {
      int cnt = cip ? counted : valid;
      if (isfinite(acc)) r = __fdiv_rn(acc, (float)cnt);
      else {
        double s = 0.0;
        for (int ky = 0; ky < kh; ++ky) {
          int iy = oy * sh - ph + ky * dh;
          if (iy < 0 || iy >= H) continue;
          for (int kx = 0; kx < kw; ++kx) {
            int ix = ox * sw - pw + kx * dw;
            if (ix < 0 || ix >= W) continue;
            s += (double)rlx_f(xp[(u64)iy * W + ix]);
          }
        }
        r = (float)(s / (double)cnt);
      }
    }
    rlx_put(o[i], r);
  }
}
extern "C" __global__ void pool2d_f32(const float* __restrict__ x, float* __restrict__ o, u64 n, const i64* __restrict__ meta) { pool2d_t<float>(x, o, n, meta); }
extern "C" __global__ void pool2d_bf(const rlx_bf* __restrict__ x, rlx_bf* __restrict__ o, u64 n, const i64* __restrict__ meta) { pool2d_t<rlx_bf>(x, o, n, meta); }


// Unary word maps: predicates to Bool (u32 0/1) and simple casts. kind:
// 0 IsNaN, 1 IsInf(pos p0, neg p1), 2 Not, 3 f32->Bool (x != 0: NaN is true),
// 4 Bool->f32, 5 i32->f32, 6 Bool->i32 (0/1), 7 i64->f32 (through double, as the CPU),
// 8 Bool->i64, 9 i32->i64 (the output has 2 words per element).
extern "C" __global__ void umap_u32(const u32* __restrict__ x, u32* __restrict__ o, u64 n, int kind, int p0, int p1) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u32 r = 0;
    if (kind == 0) { r = rlx_isnan(__uint_as_float(x[i])) ? 1u : 0u; }
    else if (kind == 1) { u32 b = x[i]; r = ((b == 0x7f800000u && p0) || (b == 0xff800000u && p1)) ? 1u : 0u; }
    else if (kind == 2) { r = x[i] ? 0u : 1u; }
    else if (kind == 3) { r = (__uint_as_float(x[i]) != 0.0f) ? 1u : 0u; }
    else if (kind == 4) { r = __float_as_uint(x[i] ? 1.0f : 0.0f); }
    else if (kind == 5) { r = __float_as_uint((float)(double)(int)x[i]); }
    else if (kind == 6) { r = x[i] ? 1u : 0u; }
    else if (kind == 7) { long long v = ((const long long*)x)[i]; r = __float_as_uint((float)(double)v); }
    else if (kind == 8) { ((long long*)o)[i] = x[i] ? 1 : 0; continue; }
    else if (kind == 9) { ((long long*)o)[i] = (long long)(int)x[i]; continue; }
    else if (kind == 10) { r = ((const long long*)x)[i] != 0 ? 1u : 0u; }
    else if (kind == 11) { r = x[i] != 0u ? 1u : 0u; }
    o[i] = r;
  }
}

// Direct convolution (ONNX Conv, NC*spatial), one thread per output element, f32
// products summed in f32 (no FMA) in (channel, kernel position) order. Padded positions
// contribute 0*w (as an im2col GEMM does: an infinite or NaN weight still gives NaN).
// meta = [ns, N, C, M, G, has_bias, then per spatial dim: (in, k, out, stride, pad_begin, dil)].
extern "C" __global__ void conv_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ o, u64 n, const i64* __restrict__ meta) {
  int ns = (int)meta[0];
  i64 C = meta[2], M = meta[3], G = meta[4];
  const i64* sp = meta + 6;
  i64 Cg = C / G, Mg = M / G;
  i64 insz = 1, ksz = 1, osz = 1;
  for (int d = 0; d < ns; ++d) { insz *= sp[6 * d]; ksz *= sp[6 * d + 1]; osz *= sp[6 * d + 2]; }
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 op = (i64)i % osz; i64 q = (i64)i / osz; i64 m = q % M; i64 b = q / M;
    i64 g = m / Mg;
    float acc = 0.0f;
    for (i64 c = 0; c < Cg; ++c) {
      const float* xc = x + (b * C + g * Cg + c) * insz;
      const float* wc = w + (m * Cg + c) * ksz;
      for (i64 kp = 0; kp < ksz; ++kp) {
        i64 kr = kp, orr = op, off = 0, mul = 1; bool inside = true;
        for (int d = ns - 1; d >= 0; --d) {
          const i64* s = sp + 6 * d;
          i64 kc = kr % s[1]; kr /= s[1];
          i64 oc = orr % s[2]; orr /= s[2];
          i64 p = oc * s[3] - s[4] + kc * s[5];
          if (p < 0 || p >= s[0]) inside = false;
          off += p * mul; mul *= s[0];
        }
        float v = inside ? xc[off] : 0.0f;
        acc = __fadd_rn(acc, __fmul_rn(v, wc[kp]));
      }
    }
    if (meta[5]) acc = __fadd_rn(acc, bias[m]);
    o[i] = acc;
  }
}
"#;

/// Word kernels, instantiated for 32-bit words (f32, i32, u32, Bool; names as written
/// without `_WSFX`) and for 16-bit words (bfloat16 storage; names ending `_h`): the
/// index-map copy (Transpose/Broadcast/Slice/Tile/Pad/Concat), Gather, GatherND, Select.
const WORDS: &str = r#"
// Index-map copy of 32-bit words. meta = [r, obase, fill bits, then per iteration dim d:
// (n_d, in_dim, in_stride, start, step, mode, out_stride)]. Input coordinate
// j = start + c*step; mode 0: as is, 1: wrap (mod in_dim), 2: constant (outside: fill),
// 3: reflect, 4: edge (clamp).
extern "C" __global__ void copy_map_WSFX(const WORD* __restrict__ x, WORD* __restrict__ o, u64 n, const i64* __restrict__ meta) {
  int r = (int)meta[0];
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 rem = (i64)i, ioff = 0, ooff = meta[1];
    bool fill = false;
    for (int d = r - 1; d >= 0; --d) {
      const i64* m = meta + 3 + 7 * d;
      i64 c = rem % m[0]; rem /= m[0];
      i64 j = m[3] + c * m[4], dim = m[1];
      int mode = (int)m[5];
      if (mode == 1) { j %= dim; if (j < 0) j += dim; }
      else if (mode == 2) { if (j < 0 || j >= dim) fill = true; }
      else if (mode == 3) {
        if (dim == 1) j = 0;
        else { i64 p = 2 * (dim - 1); j %= p; if (j < 0) j += p; if (j >= dim) j = p - j; }
      } else if (mode == 4) { if (j < 0) j = 0; if (j >= dim) j = dim - 1; }
      ioff += j * m[2];
      ooff += c * m[6];
    }
    o[ooff] = fill ? (WORD)meta[2] : x[ioff];
  }
}

// copy_map with 32-bitcoordinates (same metadata), for values of fewer than 2^31 elements
// on both sides: 32-bit division instead of emulated 64-bit division.
extern "C" __global__ void copy_map32_WSFX(const WORD* __restrict__ x, WORD* __restrict__ o, u64 n, const i64* __restrict__ meta) {
  int r = (int)meta[0];
  int obase = (int)meta[1];
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    int rem = (int)i, ioff = 0, ooff = obase;
    bool fill = false;
    for (int d = r - 1; d >= 0; --d) {
      const i64* m = meta + 3 + 7 * d;
      int nd = (int)m[0];
      int c = rem % nd; rem /= nd;
      int j = (int)m[3] + c * (int)m[4], dim = (int)m[1];
      int mode = (int)m[5];
      if (mode == 1) { j %= dim; if (j < 0) j += dim; }
      else if (mode == 2) { if (j < 0 || j >= dim) fill = true; }
      else if (mode == 3) {
        if (dim == 1) j = 0;
        else { int p = 2 * (dim - 1); j %= p; if (j < 0) j += p; if (j >= dim) j = p - j; }
      } else if (mode == 4) { if (j < 0) j = 0; if (j >= dim) j = dim - 1; }
      ioff += j * (int)m[2];
      ooff += c * (int)m[6];
    }
    o[ooff] = fill ? (WORD)meta[2] : x[ioff];
  }
}

// ONNX Gather of 32-bit words: out[(b*nidx + j)*inner + t] = x[(b*dim + k)*inner + t],
// k = idx[j] (+dim when negative). An index outside [-dim, dim) writes 0 and records the
// node in *err (atomicMin: the first such node in topological order).
extern "C" __global__ void gather_u32_WSFX(const WORD* __restrict__ x, const void* __restrict__ idx, WORD* __restrict__ o, u64 n, i64 nidx, i64 dim, i64 inner, int idx64, int* err, int node) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 t = (i64)i % inner; i64 q = (i64)i / inner; i64 j = q % nidx; i64 b = q / nidx;
    i64 k = idx64 ? ((const i64*)idx)[j] : (i64)((const int*)idx)[j];
    if (k < 0) k += dim;
    if (k < 0 || k >= dim) { atomicMin(err, node); o[i] = (WORD)0; continue; }
    o[i] = x[(b * dim + k) * inner + t];
  }
}

// ONNX GatherND of 32-bit words: output element i = (batch bi, index row j, slice position t);
// the row's q indices (negative counts from the end, each checked against its data dim; an
// index out of range sets *err to the lowest such node and writes 0) pick the slice.
// meta = [q, m (rows per batch), slice, per_batch, then q data dims, then q strides].
extern "C" __global__ void gather_nd_u32_WSFX(const WORD* __restrict__ x, const void* __restrict__ idx, WORD* __restrict__ o, u64 n, const i64* __restrict__ meta, int idx64, int* err, int node) {
  int q = (int)meta[0];
  i64 m = meta[1], slice = meta[2], per_batch = meta[3];
  const i64* dims = meta + 4; const i64* strides = meta + 4 + q;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 t = (i64)i % slice; i64 rest = (i64)i / slice; i64 j = rest % m; i64 bi = rest / m;
    i64 row = (bi * m + j) * q, off = 0; bool bad = false;
    for (int k = 0; k < q; ++k) {
      i64 v = idx64 ? ((const i64*)idx)[row + k] : (i64)((const int*)idx)[row + k];
      if (v < 0) v += dims[k];
      if (v < 0 || v >= dims[k]) { bad = true; break; }
      off += v * strides[k];
    }
    if (bad) { atomicMin(err, node); o[i] = (WORD)0; continue; }
    o[i] = x[bi * per_batch + off + t];
  }
}

// Select: o = c ? a : b on words, three inputs broadcast; meta = [r, dims, sc, sa, sb].
extern "C" __global__ void select_u32_WSFX(const u32* c, const WORD* a, const WORD* b, WORD* __restrict__ o, u64 n, const i64* __restrict__ meta) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 ic = (i64)i, ia = (i64)i, ib = (i64)i;
    if (meta) {
      int r = (int)meta[0]; i64 rem = (i64)i; ic = 0; ia = 0; ib = 0;
      for (int d = r - 1; d >= 0; --d) {
        i64 dim = meta[1 + d]; i64 k = rem % dim; rem /= dim;
        ic += k * meta[1 + r + d]; ia += k * meta[1 + 2 * r + d]; ib += k * meta[1 + 3 * r + d];
      }
    }
    o[i] = c[ic] ? a[ia] : b[ib];
  }
}
"#;

/// The NaN/Inf scan of `RLX_DEBUG_NANS` (launched once per run, after the run's last
/// kernel): counts NaN, +inf and -inf in every scanned f32 buffer and the first index of
/// each, so the host reads back 48 bytes per buffer instead of the buffer.
///
/// `tab` = [address, element count, first block, block count] per buffer, sorted by first
/// block; block `b` finds its buffer by binary search and scans it with a stride of the
/// buffer's blocks (16-byte loads; device allocations are 256-byte aligned). `out` = [nan,
/// +inf, -inf, first nan, first +inf, first -inf] per buffer, preset by the host to 0
/// (counts) and u64::MAX (firsts). A thread that saw only finite values makes no atomic
/// operation.
pub const SCAN_BLOCK: u64 = 256;
/// float16 values live on the device as f32 words; after a node that computes in float16, its
/// output is rounded in place to the dtype (round to nearest, ties to even; overflow to ±inf
/// from 65520 up, subnormals down to 2^-24; NaN kept), so every op rounds once, as IEEE
/// arithmetic in that dtype would. bfloat16 values are stored as 16 bits (kernels round when
/// they store); the conversions here serve steps without a bfloat16 kernel and cuBLAS/cuDNN.
const ROUND: &str = r#"
// The 16-bit encoding of f32 words that hold float16 (bf == 0) or bfloat16 (bf == 1) values
// exactly (rounded by round_f16/round_bf16 or uploaded from half values): the operands of a
// tensor-core GEMM. NaN becomes the dtype's quiet NaN with its sign.
extern "C" __global__ void to_half_bits(const unsigned* __restrict__ x, unsigned short* __restrict__ o, u64 n, int bf) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    unsigned b = x[i];
    unsigned s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu, h;
    if (bf) {
      h = (a > 0x7f800000u) ? 0x7fc0u : (a >> 16);
    } else if (a > 0x7f800000u) {
      h = 0x7e00u;
    } else if (a >= 0x47800000u) {
      h = 0x7c00u;
    } else if (a >= 0x38800000u) {
      h = (a - 0x38000000u) >> 13;
    } else {
      h = (unsigned)(__uint_as_float(a) * 16777216.0f);
    }
    o[i] = (unsigned short)(s | h);
  }
}
// bfloat16 encodings back to f32 words (exact).
extern "C" __global__ void bf16_bits_to_f32(const unsigned short* __restrict__ x, float* __restrict__ o, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    o[i] = __uint_as_float((unsigned)x[i] << 16);
}
// f32 words to bfloat16 storage (round to nearest even, rlx_put's rule): the output of a step
// that runs its f32-word kernel on a bfloat16 node (inputs widened by bf16_bits_to_f32).
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, rlx_bf* __restrict__ o, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    rlx_put(o[i], x[i]);
}
extern "C" __global__ void round_bf16(float* o, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    o[i] = rlx_rbf16(o[i]);
}
extern "C" __global__ void round_f16(float* o, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    o[i] = rlx_rf16(o[i]);
}
"#;
/// Elements one block scans (256 threads, 4 words each, 32 iterations): fewer, longer blocks
/// spend less of the scan on finding their buffer.
pub const SCAN_PER_BLOCK: u64 = 32768;
const SCAN: &str = r#"
extern "C" __global__ void nan_scan(const u64* __restrict__ tab, u64 nent, u64* __restrict__ out) {
  u64 b = blockIdx.x, lo = 0, hi = nent;
  while (hi - lo > 1) { u64 mid = (lo + hi) / 2; if (tab[4 * mid + 2] <= b) lo = mid; else hi = mid; }
  const unsigned* x = (const unsigned*)tab[4 * lo];
  u64 n = tab[4 * lo + 1];
  u64 stride = tab[4 * lo + 3] * blockDim.x;
  u64 t = (b - tab[4 * lo + 2]) * blockDim.x + threadIdx.x;
  RlxCnt c; rlx_cnt_init(c);
  if (n >> 63) {
    // A bfloat16 buffer (bit 63 of the count): 16-bit values, eight per 16-byte load; a
    // value's f32 widening (bits << 16) is NaN/±inf exactly when the value is.
    n &= 0x7fffffffffffffffull;
    const unsigned short* h = (const unsigned short*)x;
    u64 n8 = n / 8;
    const uint4* h8 = (const uint4*)h;
    for (u64 j = t; j < n8; j += stride) {
      uint4 v = h8[j];
      unsigned w[4] = {v.x, v.y, v.z, v.w};
      if ((((v.x & 0x7f80u) == 0x7f80u) | ((v.x & 0x7f800000u) == 0x7f800000u) |
           ((v.y & 0x7f80u) == 0x7f80u) | ((v.y & 0x7f800000u) == 0x7f800000u) |
           ((v.z & 0x7f80u) == 0x7f80u) | ((v.z & 0x7f800000u) == 0x7f800000u) |
           ((v.w & 0x7f80u) == 0x7f80u) | ((v.w & 0x7f800000u) == 0x7f800000u))) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          rlx_scan1(w[q] << 16, 8 * j + 2 * q, c);
          rlx_scan1(w[q] & 0xffff0000u, 8 * j + 2 * q + 1, c);
        }
      }
    }
    for (u64 i = 8 * n8 + t; i < n; i += stride) rlx_scan1((unsigned)h[i] << 16, i, c);
    rlx_flush(c, out + 6 * lo);
    return;
  }
  u64 n4 = n / 4;
  const uint4* x4 = (const uint4*)x;
  for (u64 j = t; j < n4; j += stride) {
    uint4 v = x4[j];
    // A clean group (no word with an all-ones exponent) costs four tests.
    if (((v.x & 0x7f800000u) == 0x7f800000u) || ((v.y & 0x7f800000u) == 0x7f800000u) ||
        ((v.z & 0x7f800000u) == 0x7f800000u) || ((v.w & 0x7f800000u) == 0x7f800000u)) {
      rlx_scan1(v.x, 4 * j, c); rlx_scan1(v.y, 4 * j + 1, c);
      rlx_scan1(v.z, 4 * j + 2, c); rlx_scan1(v.w, 4 * j + 3, c);
    }
  }
  for (u64 i = 4 * n4 + t; i < n; i += stride) rlx_scan1(x[i], i, c);
  rlx_flush(c, out + 6 * lo);
}
"#;

/// Compile [`source`] with NVRTC for compute capability `maj.min` and load it.
pub fn compile(ctx: &Arc<CudaContext>, maj: i32, min: i32) -> Result<Arc<CudaModule>, String> {
    compile_source(ctx, maj, min, &source(), "rlx_elementwise.cu")
}

/// Compile `src` with NVRTC (the same options as [`compile`]) and load it.
pub fn compile_source(
    ctx: &Arc<CudaContext>,
    maj: i32,
    min: i32,
    src: &str,
    name: &str,
) -> Result<Arc<CudaModule>, String> {
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
        name: Some(name.into()),
        ..Default::default()
    };
    let ptx = match compile_ptx_with_opts(src, opts(true)) {
        Ok(p) => p,
        // An NVRTC older than the device: its default virtual architecture, JIT-compiled up.
        Err(first) => compile_ptx_with_opts(src, opts(false))
            .map_err(|e| format!("NVRTC: {first:?}; without --gpu-architecture: {e:?}"))?,
    };
    ctx.load_module(ptx)
        .map_err(|e| format!("loading the NVRTC module: {e}"))
}
