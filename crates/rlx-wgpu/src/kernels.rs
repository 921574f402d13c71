//! WGSL sources. Every kernel binds its inputs at 0..k (read-only storage), its output at k
//! (read_write) and a `u32` metadata array `m` at k+1 (dims, strides, attributes), so one
//! shader serves every shape. Sources are generated per op variant and cached by text.
//!
//! NaN rules (see docs/WGPU.md): drivers may fold `x != x` to false and let `max`/`min`/
//! `clamp` return the non-NaN operand, so NaN is tested on the bits (`is_nan`) and
//! NaN-propagating ops select it explicitly. NaN/Inf constants are made at run time from
//! bits (`f32_bits`), never as literals (WGSL rejects non-finite constant expressions).

use rlx_ir::{Activation, BinaryOp, ReduceKind, UnaryOp};

/// Threads per workgroup of the flat (one thread per output element) kernels.
pub const FLAT_WG: u32 = 256;
/// Output tile of the matmul / conv kernels (TILE x TILE; k-tiles of 16).
pub const TILE: u32 = 32;
/// The largest rank the index arithmetic handles.
pub const MAX_RANK: usize = 8;

/// Storage type of a bound array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    U32,
    I32,
}

impl Ty {
    fn wgsl(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::U32 => "u32",
            Ty::I32 => "i32",
        }
    }
}

const PRELUDE: &str = r#"
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn f32_bits(b: u32) -> f32 { return bitcast<f32>(b | (m[0] & 0u)); }
fn nan_max(a: f32, b: f32) -> f32 { return select(select(max(a, b), b, is_nan(b)), a, is_nan(a)); }
fn nan_min(a: f32, b: f32) -> f32 { return select(select(min(a, b), b, is_nan(b)), a, is_nan(a)); }
fn erf_f(x: f32) -> f32 {
  // |x| < 0.5: Maclaurin series through x^13 (truncation < 3e-8); 1 - erfc(x) there loses
  // the low bits (rlx diverge measured 9e-6 absolute error at x ~ 1e-3 on lavapipe).
  if (abs(x) < 0.5) {
    let x2 = x * x;
    let p = 1.0 - x2 * (0.33333333 - x2 * (0.1 - x2 * (0.023809524 - x2 * (0.0046296296
      - x2 * (0.00075757576 - x2 * 0.00010683761)))));
    return 1.1283791671 * x * p;
  }
  let r = erfc_pos(abs(x));
  return select(r - 1.0, 1.0 - r, x >= 0.0);
}
// erfc(z) for z >= 0 (Numerical Recipes' erfcc: fractional error < 1.2e-7), without the
// cancellation of 1 - erf(z): the far tail keeps its digits.
fn erfc_pos(z: f32) -> f32 {
  let t = 1.0 / (1.0 + 0.5 * z);
  return t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
    + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
    + t * (-0.82215223 + t * 0.17087277)))))))));
}
fn sigmoid_f(x: f32) -> f32 {
  let e = exp(-abs(x));
  return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
fn pow_f(a: f32, b: f32) -> f32 {
  if (b == 0.0 && !is_nan(b)) { return 1.0; }
  if (a == 1.0) { return 1.0; }
  if (is_nan(a) || is_nan(b)) { return a + b; }
  if (a == -1.0 && is_inf(b)) { return 1.0; }
  if (b == 1.0) { return a; }
  if (b == 2.0) { return a * a; }
  if (b == 0.5) { return sqrt(a); }
  let odd = floor(b) == b && abs(b) < 16777216.0 && (u32(abs(b)) & 1u) == 1u;
  if (a == 0.0) {
    let r0 = select(0.0, f32_bits(0x7f800000u), b < 0.0);
    return select(r0, -r0, odd && (bitcast<u32>(a) >> 31u) == 1u);
  }
  let r = exp2(b * log2(abs(a)));
  if (a < 0.0) {
    if (floor(b) != b && !is_inf(a)) { return f32_bits(0x7fc00000u); }
    return select(r, -r, odd);
  }
  return r;
}
fn fmod_f(a: f32, b: f32) -> f32 { return a - b * trunc(a / b); }
// WGSL's tanh/sinh/asinh/atanh lose the low bits near 0 (lavapipe: tanh(3e-5) = 3.004e-5,
// asinh(6e-8) = 1.19e-7): odd Taylor series below 0.3 (truncation < 1e-10 relative), the
// built-in above (asinh on |x|, as its log form cancels for negative x).
fn tanh_f(x: f32) -> f32 {
  if (abs(x) < 0.3) {
    let z = x * x;
    return x * (1.0 + z * (-0.33333333 + z * (0.13333333 + z * (-0.053968254 + z * (0.021869489
      + z * (-0.0088632355 + z * 0.0035921280))))));
  }
  return tanh(x);
}
fn sinh_f(x: f32) -> f32 {
  if (abs(x) < 0.3) {
    let z = x * x;
    return x * (1.0 + z * (0.16666667 + z * (0.0083333333 + z * (0.00019841270 + z * 2.7557319e-6))));
  }
  return sinh(x);
}
fn asinh_f(x: f32) -> f32 {
  if (abs(x) < 0.3) {
    let z = x * x;
    return x * (1.0 + z * (-0.16666667 + z * (0.075 + z * (-0.044642857 + z * (0.030381944
      + z * (-0.022372159 + z * (0.017352764 + z * -0.013964844)))))));
  }
  return select(1.0, -1.0, x < 0.0) * asinh(abs(x));
}
fn atanh_f(x: f32) -> f32 {
  if (abs(x) < 0.3) {
    let z = x * x;
    return x * (1.0 + z * (0.33333333 + z * (0.2 + z * (0.14285714 + z * (0.11111111
      + z * (0.090909091 + z * (0.076923077 + z * 0.066666667)))))));
  }
  return atanh(x);
}
// log(1 + u) for u >= 0 without losing u's low bits when u is small (series below 0.1).
fn log1p_pos(u: f32) -> f32 {
  if (u < 0.1) {
    return u * (1.0 + u * (-0.5 + u * (0.33333333 + u * (-0.25 + u * (0.2 + u * (-0.16666667
      + u * (0.14285714 + u * -0.125)))))));
  }
  return log(1.0 + u);
}
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 { return gid.x + gid.y * nwg.x * 256u; }
"#;

fn bindings(inputs: &[Ty], out: Ty) -> String {
    let mut s = String::new();
    let names = ["a", "b", "c", "d"];
    for (k, t) in inputs.iter().enumerate() {
        s += &format!(
            "@group(0) @binding({k}) var<storage, read> {}: array<{}>;\n",
            names[k],
            t.wgsl()
        );
    }
    let k = inputs.len();
    s += &format!(
        "@group(0) @binding({k}) var<storage, read_write> o: array<{}>;\n",
        out.wgsl()
    );
    s += &format!(
        "@group(0) @binding({}) var<storage, read> m: array<u32>;\n",
        k + 1
    );
    s
}

/// The WGSL expression of a unary op on `x` (f32, or u32 for `Not`), and its output type.
pub fn unary_expr(u: UnaryOp) -> Option<(&'static str, Ty, Ty)> {
    use UnaryOp::*;
    let f = Ty::F32;
    Some(match u {
        Neg => ("-x", f, f),
        Abs => ("abs(x)", f, f),
        Exp => ("exp(x)", f, f),
        Log => ("log(x)", f, f),
        Sqrt => ("sqrt(x)", f, f),
        Rsqrt => ("1.0 / sqrt(x)", f, f),
        Reciprocal => ("1.0 / x", f, f),
        Sin => ("sin(x)", f, f),
        Cos => ("cos(x)", f, f),
        Tan => ("tan(x)", f, f),
        Asin => ("asin(x)", f, f),
        Acos => ("acos(x)", f, f),
        Atan => ("atan(x)", f, f),
        Sinh => ("sinh_f(x)", f, f),
        Cosh => ("cosh(x)", f, f),
        Asinh => ("asinh_f(x)", f, f),
        Acosh => ("acosh(x)", f, f),
        Atanh => ("atanh_f(x)", f, f),
        Erf => ("erf_f(x)", f, f),
        Floor => ("floor(x)", f, f),
        Ceil => ("ceil(x)", f, f),
        Round => ("round(x)", f, f),
        Sign => ("select(sign(x), x, is_nan(x))", f, f),
        IsNaN => ("select(0u, 1u, is_nan(x))", f, Ty::U32),
        IsInf {
            pos: true,
            neg: true,
        } => ("select(0u, 1u, is_inf(x))", f, Ty::U32),
        IsInf {
            pos: true,
            neg: false,
        } => ("select(0u, 1u, bitcast<u32>(x) == 0x7f800000u)", f, Ty::U32),
        IsInf {
            pos: false,
            neg: true,
        } => ("select(0u, 1u, bitcast<u32>(x) == 0xff800000u)", f, Ty::U32),
        IsInf { .. } => ("0u * bitcast<u32>(x)", f, Ty::U32),
        Not => ("select(0u, 1u, x == 0u)", Ty::U32, Ty::U32),
        BitNot => return None,
    })
}

/// The WGSL expression of an activation on `x: f32`.
pub fn activation_expr(a: Activation) -> String {
    use Activation::*;
    match a {
        // NaN-propagating: never max(x, 0).
        Relu => "select(x, 0.0, x < 0.0 && !is_nan(x))".into(),
        LeakyRelu { alpha } => format!("select(x, {} * x, x < 0.0)", lit(alpha)),
        Sigmoid => "sigmoid_f(x)".into(),
        Tanh => "tanh_f(x)".into(),
        // Below -1, x/2 erfc(-x/sqrt2): 1 + erf(x/sqrt2) cancels in the negative tail (as the
        // CPU computes it).
        Gelu => "select(0.5 * x * (1.0 + erf_f(x * 0.70710678118654752)), 0.5 * x * erfc_pos(-x * 0.70710678118654752), x < -1.0)".into(),
        GeluTanh => {
            // 0.5 (1 + tanh(u)) = sigmoid(2u), without 1 + tanh's cancellation for negative x
            // (as the CPU computes it).
            "x * sigmoid_f(1.5957691216057308 * (x + 0.044715 * x * x * x))".into()
        }
        Silu => "x * sigmoid_f(x)".into(),
        Elu { alpha } => format!("select(x, {} * (exp(x) - 1.0), x < 0.0)", lit(alpha)),
        Selu { alpha, gamma } => format!(
            "select({g} * x, {g} * ({a} * exp(x) - {a}), x <= 0.0)",
            g = lit(gamma),
            a = lit(alpha)
        ),
        HardSigmoid { alpha, beta } => format!(
            "nan_min(nan_max({} * x + {}, 0.0), 1.0)",
            lit(alpha),
            lit(beta)
        ),
        HardSwish => "x * nan_min(nan_max(x / 6.0 + 0.5, 0.0), 1.0)".into(),
        Softplus => "select(log1p_pos(exp(x)), x, x > 20.0)".into(),
        Softsign => "x / (1.0 + abs(x))".into(),
    }
}

/// An f32 literal that WGSL accepts (finite; `{:?}` keeps a decimal point or exponent).
pub fn lit(v: f32) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        // Never emitted for the attributes above in practice; keep the source valid.
        "0.0".into()
    }
}

/// Binary op on `x`, `y` (f32, or u32 for logic ops): (expression, input type, output type).
pub fn binary_expr(b: BinaryOp) -> Option<(&'static str, Ty, Ty)> {
    use BinaryOp::*;
    let f = Ty::F32;
    let u = Ty::U32;
    Some(match b {
        Add => ("x + y", f, f),
        Sub => ("x - y", f, f),
        Mul => ("x * y", f, f),
        Div => ("x / y", f, f),
        Pow => ("pow_f(x, y)", f, f),
        Max => ("nan_max(x, y)", f, f),
        Min => ("nan_min(x, y)", f, f),
        // Rem/Mod: `x - y * trunc(x / y)` is wrong for infinite or tiny divisors and loses
        // signed zeros (a break test found 7 fmod -1e-30 = -4.8e-7): they run on the CPU.
        Eq => ("select(0u, 1u, x == y && !is_nan(x) && !is_nan(y))", f, u),
        Lt => ("select(0u, 1u, x < y && !is_nan(x) && !is_nan(y))", f, u),
        Le => ("select(0u, 1u, x <= y && !is_nan(x) && !is_nan(y))", f, u),
        Gt => ("select(0u, 1u, x > y && !is_nan(x) && !is_nan(y))", f, u),
        Ge => ("select(0u, 1u, x >= y && !is_nan(x) && !is_nan(y))", f, u),
        And => ("select(0u, 1u, x != 0u && y != 0u)", u, u),
        Or => ("select(0u, 1u, x != 0u || y != 0u)", u, u),
        Xor => ("select(0u, 1u, (x != 0u) != (y != 0u))", u, u),
        _ => return None,
    })
}

/// Elementwise kernel over `inputs` (1..=3) with broadcasting by strides.
/// meta: [n, rank, dims[8], strides of input j [8] for each j].
/// `fast`: every input is contiguous with the output's element count (no index math).
pub fn elementwise(inputs: &[Ty], out: Ty, expr: &str, fast: bool) -> String {
    let vars = ["x", "y", "z"];
    let arrs = ["a", "b", "c"];
    let mut body = String::new();
    if fast {
        for (j, _) in inputs.iter().enumerate() {
            body += &format!("  let {} = {}[i];\n", vars[j], arrs[j]);
        }
    } else {
        body += "  var rem = i;\n";
        for (j, _) in inputs.iter().enumerate() {
            body += &format!("  var i{j} = 0u;\n");
        }
        body += "  let rank = m[1];\n  for (var d = 0u; d < rank; d++) {\n    let ax = rank - 1u - d;\n    let dim = m[2u + ax];\n    let cc = rem % dim;\n    rem = rem / dim;\n";
        for (j, _) in inputs.iter().enumerate() {
            body += &format!("    i{j} += cc * m[{}u + ax];\n", 10 + 8 * j);
        }
        body += "  }\n";
        for (j, _) in inputs.iter().enumerate() {
            body += &format!("  let {} = {}[i{j}];\n", vars[j], arrs[j]);
        }
    }
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
{body}  o[i] = {expr};
}}
",
        bindings(inputs, out)
    )
}

/// In-place rounding of f32 words to float16 (`bf16` false) or bfloat16, round to nearest
/// even, as `half::f16::from_f32` / `half::bf16::from_f32` round (the CPU's conversions):
/// overflow becomes ±inf, float16 subnormals keep their 2^-24 quantum, NaN stays NaN. Integer
/// bit arithmetic only (WGSL's `pack2x16float` leaves overflow undefined). meta: [n].
pub fn round_to(bf16: bool) -> String {
    let f = if bf16 {
        "fn r(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return x; }
  let lsb = (b >> 16u) & 1u;
  return bitcast<f32>((b + 0x7fffu + lsb) & 0xffff0000u);
}"
    } else {
        "fn r(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let s = b & 0x80000000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return x; }
  // 65520 (halfway between 65504 and 2^16) and above round to inf.
  if (a >= 0x477ff000u) { return bitcast<f32>(s | 0x7f800000u); }
  if (a < 0x38800000u) {
    // Below 2^-14: float16 subnormals, multiples of 2^-24 (scaling by 2^24 is exact; WGSL's
    // round() is ties-to-even).
    let q = round(bitcast<f32>(a) * 16777216.0) * 5.9604644775390625e-8;
    return bitcast<f32>(s | bitcast<u32>(q));
  }
  let lsb = (a >> 13u) & 1u;
  return bitcast<f32>(s | ((a + 0xfffu + lsb) & 0xffffe000u));
}"
    };
    format!(
        "{}{PRELUDE}
{f}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
  o[i] = r(o[i]);
}}
",
        bindings(&[], Ty::F32)
    )
}

/// Word copy with an index map per output axis (Transpose, Broadcast, Slice, Tile, Pad,
/// Concat parts, Reshape copies). meta: [n, rank, out_base, mode, pad_bits,
/// then per axis (6 words): out_dim, in_dim, in_stride, start (i32), step (i32), out_stride].
/// mode: 0 plain, 1 pad constant, 2 pad edge, 3 pad reflect, 4 pad wrap, 5 tile.
pub fn index_copy() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
  let rank = m[1];
  let mode = m[3];
  var rem = i;
  var src = 0i;
  var dst = m[2];
  var outside = false;
  for (var d = 0u; d < rank; d++) {{
    let ax = rank - 1u - d;
    let base = 5u + 6u * ax;
    let od = m[base];
    let n = i32(m[base + 1u]);
    let cc = rem % od;
    rem = rem / od;
    dst += cc * m[base + 5u];
    var p = bitcast<i32>(m[base + 3u]) + i32(cc) * bitcast<i32>(m[base + 4u]);
    if (mode == 5u) {{ p = p % n; }}
    if (p < 0 || p >= n) {{
      if (mode == 1u) {{ outside = true; p = 0; }}
      else if (mode == 2u) {{ p = clamp(p, 0, n - 1); }}
      else if (mode == 3u) {{
        if (n == 1) {{ p = 0; }} else {{
          let per = 2 * (n - 1);
          var q = p % per;
          if (q < 0) {{ q += per; }}
          if (q >= n) {{ q = per - q; }}
          p = q;
        }}
      }}
      else if (mode == 4u) {{ var q = p % n; if (q < 0) {{ q += n; }} p = q; }}
    }}
    src += p * bitcast<i32>(m[base + 2u]);
  }}
  o[dst] = select(a[u32(src)], m[4], outside);
}}
",
        bindings(&[Ty::U32], Ty::U32)
    )
}

/// ONNX Gather on words. meta: [n, axis_dim, nidx, inner].
pub fn gather() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
  let ad = m[1];
  let nidx = m[2];
  let inner = m[3];
  let e = i % inner;
  let rest = i / inner;
  let j = rest % nidx;
  let outer = rest / nidx;
  var idx = b[j];
  if (idx < 0) {{ idx += i32(ad); }}
  let k = min(u32(max(idx, 0)), ad - 1u);
  o[i] = a[(outer * ad + k) * inner + e];
}}
",
        bindings(&[Ty::U32, Ty::I32], Ty::U32)
    )
}

/// Reduction. meta: [nout, R, krank, kdims[8], kstrides[8], rrank, rdims[8], rstrides[8]].
/// `tree`: one workgroup of RED_WG threads per output; else one thread per output.
/// `contig`: the reduced axes are the trailing ones (input offset = out * R + r).
/// `skip_last`: the planted bug (Sum/Mean only).
pub fn reduce(kind: ReduceKind, tree: bool, contig: bool, skip_last: bool) -> String {
    let (init, comb) = match kind {
        ReduceKind::Sum | ReduceKind::Mean => ("0.0", "acc + v"),
        ReduceKind::Prod => ("1.0", "acc * v"),
        ReduceKind::Max => ("f32_bits(0xff800000u)", "nan_max(acc, v)"),
        ReduceKind::Min => ("f32_bits(0x7f800000u)", "nan_min(acc, v)"),
    };
    let comb_ab = comb.replace("acc", "sa").replace(" v", " sb");
    let fin = if kind == ReduceKind::Mean {
        "acc / f32(m[1])"
    } else {
        "acc"
    };
    let offset = if contig {
        "fn in_offset(out: u32, r: u32) -> u32 { return out * m[1] + r; }\n".to_string()
    } else {
        "fn in_offset(out: u32, r: u32) -> u32 {
  var off = 0u;
  var rem = out;
  let kr = m[2];
  for (var d = 0u; d < kr; d++) { let ax = kr - 1u - d; let cc = rem % m[3u + ax]; rem = rem / m[3u + ax]; off += cc * m[11u + ax]; }
  var rr = r;
  let rk = m[19];
  for (var d = 0u; d < rk; d++) { let ax = rk - 1u - d; let cc = rr % m[20u + ax]; rr = rr / m[20u + ax]; off += cc * m[28u + ax]; }
  return off;
}
"
        .to_string()
    };
    let sumlike = matches!(kind, ReduceKind::Sum | ReduceKind::Mean);
    if tree {
        let skip = if skip_last && sumlike {
            "if (r % 64u == 63u) { continue; }"
        } else {
            ""
        };
        format!(
            "{}{PRELUDE}{offset}
var<workgroup> part: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let out = wg.x + wg.y * nwg.x;
  let valid = out < m[0];
  var acc = {init};
  if (valid) {{
    for (var r = lid; r < m[1]; r += 64u) {{
      {skip}
      let v = a[in_offset(out, r)];
      acc = {comb};
    }}
  }}
  part[lid] = acc;
  workgroupBarrier();
  for (var s = 32u; s > 0u; s = s >> 1u) {{
    if (lid < s) {{
      let sa = part[lid];
      let sb = part[lid + s];
      part[lid] = {comb_ab};
    }}
    workgroupBarrier();
  }}
  if (lid == 0u && valid) {{
    acc = part[0];
    o[out] = {fin};
  }}
}}
",
            bindings(&[Ty::F32], Ty::F32)
        )
    } else {
        let lim = if skip_last && sumlike {
            "select(m[1], m[1] - 1u, m[1] > 1u)"
        } else {
            "m[1]"
        };
        format!(
            "{}{PRELUDE}{offset}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let out = flat_index(gid, nwg);
  if (out >= m[0]) {{ return; }}
  var acc = {init};
  let lim = {lim};
  for (var r = 0u; r < lim; r++) {{
    let v = a[in_offset(out, r)];
    acc = {comb};
  }}
  o[out] = {fin};
}}
",
            bindings(&[Ty::F32], Ty::F32)
        )
    }
}

/// ArgMax/ArgMin over one axis (output i32). meta: [nout, n, inner, max, last].
/// NaN counts as the extreme value (first NaN wins, or the last with select_last_index),
/// like `np.argmax` and the CPU backend.
pub fn argreduce() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
  let n = m[1];
  let inner = m[2];
  let is_max = m[3] == 1u;
  let last = m[4] == 1u;
  let outer = i / inner;
  let e = i % inner;
  var best = a[outer * n * inner + e];
  var bi = 0u;
  for (var j = 1u; j < n; j++) {{
    let x = a[(outer * n + j) * inner + e];
    let bn = is_nan(best);
    let xn = is_nan(x);
    var better = false;
    if (!bn) {{
      if (xn) {{ better = true; }} else if (is_max) {{ better = x > best; }} else {{ better = x < best; }}
    }}
    let equal = (bn && xn) || (!bn && !xn && x == best);
    if (better || (last && equal)) {{ best = x; bi = j; }}
  }}
  o[i] = i32(bi);
}}
",
        bindings(&[Ty::F32], Ty::I32)
    )
}

/// Tiled matmul / implicit-GEMM convolution: a workgroup of 8x8 threads computes a
/// TILE x TILE output tile, each thread 4x4 outputs, k-tiles of TK staged in workgroup
/// memory. `conv`: B is the im2col of the input, computed while loading.
///
/// matmul meta: [M, N, K, brank, obdims[6], astr[6], bstr[6]] (batch strides in elements).
/// conv meta: [Mg, P, Kc, groups, C, Cg, M, has_bias, in_sp[3], out_sp[3], k[3],
///             stride[3], dil[3], padb[3]] and bindings a = weights, b = input, c = bias.
///
/// `big`: a 64x64 output tile for 16x16 threads (4x4 outputs each, half the global loads per
/// output of the 32x32 tile), for products whose output has at least 64 rows and columns.
pub fn tiled(conv: bool, drop_last_k: bool, big: bool) -> String {
    let (t, w) = if big { (64u32, 16u32) } else { (TILE, 8) };
    let loads = t * 16 / (w * w);
    let (head, setup, load_b, store, ntiles) = gemm_pieces(conv, drop_last_k);
    let store = store.replace("ACC", "acc[i * 4u + j]");
    format!(
        "{head}{PRELUDE}{load_b}
var<workgroup> As: array<f32, {tk}>;
var<workgroup> Bs: array<f32, {tk}>;
@compute @workgroup_size({w}, {w}, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
{setup}
  let row0 = wg.y * {t}u;
  let col0 = wg.x * {t}u;
  let tid = lid.y * {w}u + lid.x;
  var acc: array<f32, 16>;
  for (var q = 0u; q < 16u; q++) {{ acc[q] = 0.0; }}
  let nt = (K + 15u) / 16u;
  let ntiles = {ntiles};
  for (var t = 0u; t < ntiles; t++) {{
    let k0 = t * 16u;
    for (var l = 0u; l < {loads}u; l++) {{
      let e = tid + l * {ww}u;
      let ar = row0 + e / 16u;
      let ak = k0 + e % 16u;
      var av = 0.0;
      if (ar < M && ak < K) {{ av = a[a_off + ar * K + ak]; }}
      As[e] = av;
      let bk = k0 + e / {t}u;
      let bc = col0 + e % {t}u;
      var bv = 0.0;
      if (bk < K && bc < N) {{ bv = load_b(b_off, ch0_or_zero(wg), bk, bc); }}
      Bs[e] = bv;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk++) {{
      var av4: array<f32, 4>;
      for (var i = 0u; i < 4u; i++) {{ av4[i] = As[(lid.y * 4u + i) * 16u + kk]; }}
      for (var j = 0u; j < 4u; j++) {{
        let bv = Bs[kk * {t}u + lid.x * 4u + j];
        for (var i = 0u; i < 4u; i++) {{ acc[i * 4u + j] = acc[i * 4u + j] + av4[i] * bv; }}
      }}
    }}
    workgroupBarrier();
  }}
  for (var i = 0u; i < 4u; i++) {{
    let r = row0 + lid.y * 4u + i;
    if (r >= M) {{ continue; }}
    for (var j = 0u; j < 4u; j++) {{
      let col = col0 + lid.x * 4u + j;
      if (col >= N) {{ continue; }}
{store}
    }}
  }}
}}
",
        tk = t * 16,
        ww = w * w,
    )
    .replace("ch0_or_zero(wg)", if conv { "ch0" } else { "0u" })
}

/// The 128x128-tile form of [`tiled`] for products with at least 128 output rows and
/// columns (same meta and bindings): 16x16 threads, each 8x8 outputs strided by 16 (thread
/// (x, y) owns rows y + 16i and columns x + 16j, so a warp's shared-memory reads broadcast
/// along A and are consecutive along B, and its stores are coalesced), k-tiles of 16; A is
/// staged transposed with a padded row (132) against bank conflicts. 64 accumulators per
/// thread: four times the outputs per shared-memory load of the 4x4 form.
pub fn tiled_128(conv: bool, drop_last_k: bool) -> String {
    let (head, setup, load_b, store, ntiles) = gemm_pieces(conv, drop_last_k);
    let store = store.replace("ACC", "acc[i * 8u + j]");
    format!(
        "{head}{PRELUDE}{load_b}
var<workgroup> As: array<f32, 2112>;
var<workgroup> Bs: array<f32, 2048>;
@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
{setup}
  let row0 = wg.y * 128u;
  let col0 = wg.x * 128u;
  let tid = lid.y * 16u + lid.x;
  var acc: array<f32, 64>;
  for (var q = 0u; q < 64u; q++) {{ acc[q] = 0.0; }}
  let nt = (K + 15u) / 16u;
  let ntiles = {ntiles};
  for (var t = 0u; t < ntiles; t++) {{
    let k0 = t * 16u;
    for (var l = 0u; l < 8u; l++) {{
      let e = tid + l * 256u;
      let ar = e / 16u;
      let ak = e % 16u;
      var av = 0.0;
      if (row0 + ar < M && k0 + ak < K) {{ av = a[a_off + (row0 + ar) * K + k0 + ak]; }}
      As[ak * 132u + ar] = av;
      let bk = e / 128u;
      let bc = e % 128u;
      var bv = 0.0;
      if (k0 + bk < K && col0 + bc < N) {{ bv = load_b(b_off, ch0_or_zero(wg), k0 + bk, col0 + bc); }}
      Bs[e] = bv;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk++) {{
      var av8: array<f32, 8>;
      var bv8: array<f32, 8>;
      for (var i = 0u; i < 8u; i++) {{ av8[i] = As[kk * 132u + lid.y + 16u * i]; }}
      for (var j = 0u; j < 8u; j++) {{ bv8[j] = Bs[kk * 128u + lid.x + 16u * j]; }}
      for (var i = 0u; i < 8u; i++) {{
        for (var j = 0u; j < 8u; j++) {{ acc[i * 8u + j] = fma(av8[i], bv8[j], acc[i * 8u + j]); }}
      }}
    }}
    workgroupBarrier();
  }}
  for (var i = 0u; i < 8u; i++) {{
    let r = row0 + lid.y + 16u * i;
    if (r >= M) {{ continue; }}
    for (var j = 0u; j < 8u; j++) {{
      let col = col0 + lid.x + 16u * j;
      if (col >= N) {{ continue; }}
{store}
    }}
  }}
}}
"
    )
    .replace("ch0_or_zero(wg)", if conv { "ch0" } else { "0u" })
}

/// How the register-tiled GEMM reads its B operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmB {
    /// A matrix product: B is `[K, N]` row-major (batch offsets from the meta).
    MatMul,
    /// A 1x1 convolution with unit strides and no padding: B is the input's `[C, P]` planes.
    Conv1x1,
    /// Any other convolution: B is the im2col of the input, computed while loading.
    Conv,
}

/// Register-tiled matmul / implicit-GEMM convolution (same meta and bindings as [`tiled`];
/// convolutions also read the image count at `m[31]` and, im2col ones, a table at `m[32 + 4k]`
/// ([`conv_k_table`]); their columns span images and the dispatch's z is the group):
/// 16x16 threads, an output tile of `16*tm` rows by `16*tn` columns, each thread `tm` x `tn`
/// outputs held in `vec4` registers (the code is generated unrolled, so every accumulator has
/// a constant name the driver keeps in registers), k-tiles of `bk` staged in workgroup memory
/// as `vec4`s along M and N (a thread's rows are `(i*16 + ty)*4 + 0..3`, its columns
/// `(j*16 + tx)*4 + 0..3`: a warp's workgroup reads are consecutive), the next k-tile's global
/// loads issued into registers before the current tile is multiplied. `tm`, `tn` in {4, 8};
/// `bk` in {8, 16}. Products with fewer than 64 rows or columns keep [`tiled`].
///
/// `split` (matrix products only): split-K. The meta gains `[S, OUT, KC]` at 22..25 (S
/// splits of KC k's each, a multiple of `bk`; OUT = batch x M x N); the dispatch's z is
/// batch x S, and split s writes its partial products at `s * OUT` of an output buffer S
/// times the output's size; [`split_sum`] then adds them into the first OUT.
pub fn reg_tiled(
    b_kind: GemmB,
    drop_last_k: bool,
    tm: u32,
    tn: u32,
    bk: u32,
    split: bool,
) -> String {
    assert!(matches!(tm, 4 | 8) && matches!(tn, 4 | 8) && matches!(bk, 8 | 16));
    let conv = b_kind != GemmB::MatMul;
    assert!(!(split && (conv || drop_last_k)));
    let (head, setup, load_b, store, ntiles) = gemm_pieces(conv, drop_last_k);
    let (setup, store) = if split {
        (
            setup.replace(
                "  var rem = wg.z;",
                "  let split = wg.z % m[22];\n  var rem = wg.z / m[22];\n  let zb = rem;\n  let kb = split * m[24];\n  let ke = min(K, kb + m[24]);",
            ),
            store.replace(
                "o[wg.z * M * N + r * N + col]",
                "o[split * m[23] + zb * M * N + r * N + col]",
            ),
        )
    } else {
        (
            format!("{setup}  let kb = 0u;\n  let ke = K;\n"),
            store.to_string(),
        )
    };
    let (setup, store) = (setup.as_str(), store.as_str());
    // Convolutions: the columns are (image, output position) pairs, N = images x P, so a
    // tile spans images (ResNet's 7x7 planes would otherwise fill 49 of 64 columns); the
    // workgroup's z is the group. B is read per column, below.
    let (setup, load_b, store) = if conv {
        (
            "  let M = m[0]; let P = m[1]; let K = m[2];
  let N = P * m[31];
  let g = wg.z;
  let a_off = g * M * K;
  let ch0 = g * m[5];
  let plane = m[4] * m[8] * m[9] * m[10];
  let kb = 0u;
  let ke = K;
",
            "",
            "        let img = col / P; let pos = col % P;
        let ch = g * M + r;
        var v = ACC;
        if (m[7] == 1u) { v = v + c[ch]; }
        o[(img * m[6] + ch) * P + pos] = v;",
        )
    } else {
        (setup, load_b, store)
    };
    let (bm, bn) = (16 * tm, 16 * tn);
    let (bm4, bn4) = (bm / 4, bn / 4);
    let la = bm * bk / 256; // A elements each thread loads per k-tile
    let lb = bn * bk / 256;
    let mut s = String::new();
    let w = |s: &mut String, l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    w(&mut s, format!("{head}{PRELUDE}{load_b}"));
    w(
        &mut s,
        format!("var<workgroup> As: array<vec4<f32>, {}>;", bk * bm4),
    );
    w(
        &mut s,
        format!("var<workgroup> Bs: array<vec4<f32>, {}>;", bk * bn4),
    );
    w(&mut s, "@compute @workgroup_size(16, 16, 1)".into());
    w(&mut s, "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {".into());
    w(&mut s, setup.into());
    w(&mut s, format!("  let row0 = wg.y * {bm}u;"));
    w(&mut s, format!("  let col0 = wg.x * {bn}u;"));
    w(&mut s, "  let tx = lid.x; let ty = lid.y;".into());
    w(&mut s, "  let tid = ty * 16u + tx;".into());
    w(
        &mut s,
        format!(
            "  let nt = select(0u, (ke - kb + {}u) / {bk}u, ke > kb);",
            bk - 1
        ),
    );
    w(&mut s, format!("  let ntiles = {ntiles};"));
    let ch0 = if conv { "ch0" } else { "0u" };
    // This thread's load positions (fixed over k-tiles except for k0).
    for l in 0..la {
        w(
            &mut s,
            format!("  let ar{l} = row0 + (tid + {}u) / {bk}u;", l * 256),
        );
        w(
            &mut s,
            format!("  let ak{l} = (tid + {}u) % {bk}u;", l * 256),
        );
        w(&mut s, format!("  var pa{l} = 0.0;"));
    }
    for l in 0..lb {
        w(
            &mut s,
            format!("  let bk{l} = (tid + {}u) / {bn}u;", l * 256),
        );
        w(
            &mut s,
            format!("  let bc{l} = col0 + (tid + {}u) % {bn}u;", l * 256),
        );
        w(&mut s, format!("  var pb{l} = 0.0;"));
        if conv {
            // This column's image and output position, fixed over k-tiles.
            w(
                &mut s,
                format!(
                    "  let bo{l} = (bc{l} / P) * plane + ch0 * m[8] * m[9] * m[10]; let pp{l} = bc{l} % P;"
                ),
            );
        }
        if b_kind == GemmB::Conv {
            // The first input position the column's window reads per spatial axis (may be
            // negative: padding), and its offset in the plane (cb).
            w(
                &mut s,
                format!("  let o2_{l} = pp{l} % m[16]; let pr{l} = pp{l} / m[16];"),
            );
            w(
                &mut s,
                format!("  let o1_{l} = pr{l} % m[15]; let o0_{l} = pr{l} / m[15];"),
            );
            for (ax, o) in ["o0", "o1", "o2"].iter().enumerate() {
                w(
                    &mut s,
                    format!(
                        "  let ib{ax}_{l} = i32({o}_{l} * m[{}]) - i32(m[{}]);",
                        21 + ax,
                        27 + ax
                    ),
                );
            }
            w(
                &mut s,
                format!("  let cb{l} = (ib0_{l} * i32(m[9]) + ib1_{l}) * i32(m[10]) + ib2_{l};"),
            );
        }
    }
    let mut fetch = String::new();
    for l in 0..la {
        fetch += &format!(
            "    pa{l} = 0.0; if (ar{l} < M && k0 + ak{l} < ke) {{ pa{l} = a[a_off + ar{l} * K + k0 + ak{l}]; }}\n"
        );
    }
    for l in 0..lb {
        if b_kind == GemmB::Conv {
            // im2col without divisions: the column's window origin is computed once (ib*,
            // cb), and k's channel offset and tap offsets come from the table the host
            // wrote into the meta at 32 + 4k: [channel offset + tap offset in the input,
            // tap offset along axis 0, 1, 2 (dilation included)].
            fetch += &format!(
                "    pb{l} = 0.0; if (k0 + bk{l} < ke && bc{l} < N) {{
      let tb = 32u + 4u * (k0 + bk{l});
      let i0 = ib0_{l} + i32(m[tb + 1u]); let i1 = ib1_{l} + i32(m[tb + 2u]); let i2 = ib2_{l} + i32(m[tb + 3u]);
      if (i0 >= 0 && i1 >= 0 && i2 >= 0 && i0 < i32(m[8]) && i1 < i32(m[9]) && i2 < i32(m[10])) {{
        pb{l} = b[u32(i32(bo{l} + m[tb]) + cb{l})];
      }}
    }}\n"
            );
        } else if b_kind == GemmB::Conv1x1 {
            fetch += &format!(
                "    pb{l} = 0.0; if (k0 + bk{l} < ke && bc{l} < N) {{ pb{l} = b[bo{l} + (k0 + bk{l}) * P + pp{l}]; }}\n"
            );
        } else {
            fetch += &format!(
                "    pb{l} = 0.0; if (k0 + bk{l} < ke && bc{l} < N) {{ pb{l} = load_b(b_off, {ch0}, k0 + bk{l}, bc{l}); }}\n"
            );
        }
    }
    for i in 0..tm {
        for j in 0..tn / 4 {
            w(&mut s, format!("  var c{i}_{j} = vec4<f32>(0.0);"));
        }
    }
    w(&mut s, "  if (ntiles > 0u) {".into());
    w(&mut s, "    let k0 = kb;".into());
    s.push_str(&fetch);
    w(&mut s, "  }".into());
    w(&mut s, "  for (var t = 0u; t < ntiles; t++) {".into());
    for l in 0..la {
        let e = format!("(tid + {}u)", l * 256);
        w(
            &mut s,
            format!("    As[ak{l} * {bm4}u + ({e} / {bk}u) / 4u][({e} / {bk}u) % 4u] = pa{l};"),
        );
    }
    for l in 0..lb {
        w(
            &mut s,
            format!("    Bs[bk{l} * {bn4}u + ((tid + {}u) % {bn}u) / 4u][((tid + {}u) % {bn}u) % 4u] = pb{l};", l * 256, l * 256),
        );
    }
    w(&mut s, "    workgroupBarrier();".into());
    w(&mut s, "    if (t + 1u < ntiles) {".into());
    w(&mut s, format!("      let k0 = kb + (t + 1u) * {bk}u;"));
    s.push_str(
        &fetch
            .replace("    pa", "      pa")
            .replace("    pb", "      pb"),
    );
    w(&mut s, "    }".into());
    for kk in 0..bk {
        for ii in 0..tm / 4 {
            w(
                &mut s,
                format!("    let a{kk}_{ii} = As[{}u + ty];", kk * bm4 + ii * 16),
            );
        }
        for j in 0..tn / 4 {
            w(
                &mut s,
                format!("    let b{kk}_{j} = Bs[{}u + tx];", kk * bn4 + j * 16),
            );
        }
        for ii in 0..tm / 4 {
            for (q, c) in ["x", "y", "z", "w"].iter().enumerate() {
                let i = ii * 4 + q as u32;
                for j in 0..tn / 4 {
                    w(
                        &mut s,
                        format!(
                            "    c{i}_{j} = fma(vec4<f32>(a{kk}_{ii}.{c}), b{kk}_{j}, c{i}_{j});"
                        ),
                    );
                }
            }
        }
    }
    w(&mut s, "    workgroupBarrier();".into());
    w(&mut s, "  }".into());
    for i in 0..tm {
        let (ii, q) = (i / 4, i % 4);
        for j in 0..tn / 4 {
            for (lane, c) in ["x", "y", "z", "w"].iter().enumerate() {
                w(&mut s, "  {".into());
                w(
                    &mut s,
                    format!("    let r = row0 + ({}u + ty) * 4u + {q}u;", ii * 16),
                );
                w(
                    &mut s,
                    format!("    let col = col0 + ({}u + tx) * 4u + {lane}u;", j * 16),
                );
                w(&mut s, "    if (r < M && col < N) {".into());
                w(&mut s, store.replace("ACC", &format!("c{i}_{j}.{c}")));
                w(&mut s, "    }".into());
                w(&mut s, "  }".into());
            }
        }
    }
    w(&mut s, "}".into());
    s.replace("ch0_or_zero(wg)", ch0)
}

/// Adds the partial products of a split-K [`reg_tiled`] product into the first of them, in
/// split order: `o[i] = o[i] + o[OUT + i] + ... + o[(S-1)*OUT + i]`; meta `[OUT, S]`, one
/// thread per element.
pub fn split_sum() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  let out = m[0];
  if (i >= out) {{ return; }}
  var v = o[i];
  for (var s = 1u; s < m[1]; s++) {{ v = v + o[s * out + i]; }}
  o[i] = v;
}}
",
        bindings(&[], Ty::F32)
    )
}

/// The per-k table of the register-tiled im2col convolution (appended to its meta at index
/// 32): for each k = (channel in group, t0, t1, t2) of a `kc`-long reduction over kernel taps
/// `ksp` (3 axes, padded with 1) with dilations `dil`, on input planes `in_sp` (3 axes):
/// `[c * D*H*W + d0 * H*W + d1 * W + d2, d0, d1, d2]` with `d_i = t_i * dil_i`.
pub fn conv_k_table(kc: usize, ksp: [usize; 3], dil: [usize; 3], in_sp: [usize; 3]) -> Vec<u32> {
    let k2 = ksp[0] * ksp[1] * ksp[2];
    let plane = in_sp[0] * in_sp[1] * in_sp[2];
    let mut t = Vec::with_capacity(4 * kc);
    for k in 0..kc {
        let (c, mut r) = (k / k2, k % k2);
        let t2 = r % ksp[2];
        r /= ksp[2];
        let (t1, t0) = (r % ksp[1], r / ksp[1]);
        let (d0, d1, d2) = (t0 * dil[0], t1 * dil[1], t2 * dil[2]);
        let off = c * plane + d0 * in_sp[1] * in_sp[2] + d1 * in_sp[2] + d2;
        t.extend([off as u32, d0 as u32, d1 as u32, d2 as u32]);
    }
    t
}

/// The parts [`tiled`] and [`tiled_128`] share: bindings, the batch/group offsets, B's
/// loader (plain or im2col), the store (with `ACC` for the accumulator) and the k-tile count
/// (one short with the planted bug).
fn gemm_pieces(
    conv: bool,
    drop_last_k: bool,
) -> (
    String,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
) {
    let head = if conv {
        bindings(&[Ty::F32, Ty::F32, Ty::F32], Ty::F32)
    } else {
        bindings(&[Ty::F32, Ty::F32], Ty::F32)
    };
    let setup = if conv {
        "  let M = m[0]; let N = m[1]; let K = m[2];
  let groups = m[3];
  let n_img = wg.z / groups;
  let g = wg.z % groups;
  let a_off = g * M * K;
  let b_off = n_img * m[4] * m[8] * m[9] * m[10];
  let ch0 = g * m[5];
"
    } else {
        "  let M = m[0]; let N = m[1]; let K = m[2];
  let brank = m[3];
  var rem = wg.z;
  var a_off = 0u;
  var b_off = 0u;
  for (var d = 0u; d < brank; d++) {
    let ax = brank - 1u - d;
    let cc = rem % m[4u + ax];
    rem = rem / m[4u + ax];
    a_off += cc * m[10u + ax];
    b_off += cc * m[16u + ax];
  }
"
    };
    let load_b = if conv {
        // k -> (c, t0, t1, t2); p -> (o0, o1, o2); input position per axis.
        "fn load_b(b_off: u32, ch0: u32, k: u32, p: u32) -> f32 {
  let k2 = m[18] * m[19] * m[20];
  let c = ch0 + k / k2;
  var kr = k % k2;
  let t2 = kr % m[20]; kr = kr / m[20];
  let t1 = kr % m[19]; let t0 = kr / m[19];
  let o2 = p % m[16]; let pr = p / m[16];
  let o1 = pr % m[15]; let o0 = pr / m[15];
  let i0 = i32(o0 * m[21] + t0 * m[24]) - i32(m[27]);
  let i1 = i32(o1 * m[22] + t1 * m[25]) - i32(m[28]);
  let i2 = i32(o2 * m[23] + t2 * m[26]) - i32(m[29]);
  if (i0 < 0 || i1 < 0 || i2 < 0 || i0 >= i32(m[8]) || i1 >= i32(m[9]) || i2 >= i32(m[10])) { return 0.0; }
  return b[b_off + ((c * m[8] + u32(i0)) * m[9] + u32(i1)) * m[10] + u32(i2)];
}
"
    } else {
        "fn load_b(b_off: u32, ch0: u32, k: u32, p: u32) -> f32 { return b[b_off + k * m[1] + p]; }\n"
    };
    let store = if conv {
        "        let ch = g * M + r;
        var v = ACC;
        if (m[7] == 1u) { v = v + c[ch]; }
        o[(n_img * m[6] + ch) * N + col] = v;"
    } else {
        "        o[wg.z * M * N + r * N + col] = ACC;"
    };
    let ntiles = if drop_last_k {
        "select(nt, nt - 1u, nt > 1u)"
    } else {
        "nt"
    };
    (head, setup, load_b, store, ntiles)
}

/// Direct convolution, one thread per output (for small per-group output channel counts,
/// e.g. depthwise). Same meta and bindings as the conv form of [`tiled`], plus n_img count
/// in the dispatch: output index i over N*M*P.
pub fn conv_direct() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  let Mg = m[0]; let P = m[1]; let Kc = m[2];
  let Mt = m[6];
  let total = m[30];
  if (i >= total) {{ return; }}
  let p = i % P;
  let ch = (i / P) % Mt;
  let n_img = i / (P * Mt);
  let g = ch / Mg;
  let c0 = g * m[5];
  let o2 = p % m[16]; let pr = p / m[16];
  let o1 = pr % m[15]; let o0 = pr / m[15];
  var acc = 0.0;
  let k2 = m[18] * m[19] * m[20];
  let in_base = n_img * m[4] * m[8] * m[9] * m[10];
  for (var k = 0u; k < Kc; k++) {{
    let cc = c0 + k / k2;
    var kr = k % k2;
    let t2 = kr % m[20]; kr = kr / m[20];
    let t1 = kr % m[19]; let t0 = kr / m[19];
    let i0 = i32(o0 * m[21] + t0 * m[24]) - i32(m[27]);
    let i1 = i32(o1 * m[22] + t1 * m[25]) - i32(m[28]);
    let i2 = i32(o2 * m[23] + t2 * m[26]) - i32(m[29]);
    if (i0 < 0 || i1 < 0 || i2 < 0 || i0 >= i32(m[8]) || i1 >= i32(m[9]) || i2 >= i32(m[10])) {{ continue; }}
    acc = acc + a[ch * Kc + k] * b[in_base + ((cc * m[8] + u32(i0)) * m[9] + u32(i1)) * m[10] + u32(i2)];
  }}
  if (m[7] == 1u) {{ acc = acc + c[ch]; }}
  o[i] = acc;
}}
",
        bindings(&[Ty::F32, Ty::F32, Ty::F32], Ty::F32)
    )
}

/// Max / average pooling, one thread per output. meta: [nout, P_out, in_sp[3], out_sp[3],
/// k[3], stride[3], dil[3], padb[3], pade[3], kind (0 max, 1 avg), count_include_pad].
/// Tap status as the CPU backend: inside the input = valid; inside the declared pads =
/// padding (counted by avg with count_include_pad); further out (ceil_mode) = never counted.
pub fn pool() -> String {
    format!(
        "{}{PRELUDE}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
  let P = m[1];
  let plane = i / P;
  let p = i % P;
  let o2 = p % m[7]; let pr = p / m[7];
  let o1 = pr % m[6]; let o0 = pr / m[6];
  let is_max = m[23] == 0u;
  let inplane = m[2] * m[3] * m[4];
  var mx = f32_bits(0xff800000u);
  var sum = 0.0;
  var nvalid = 0u;
  var counted = 0u;
  for (var t0 = 0u; t0 < m[8]; t0++) {{
  for (var t1 = 0u; t1 < m[9]; t1++) {{
  for (var t2 = 0u; t2 < m[10]; t2++) {{
    let p0 = i32(o0 * m[11] + t0 * m[14]) - i32(m[17]);
    let p1 = i32(o1 * m[12] + t1 * m[15]) - i32(m[18]);
    let p2 = i32(o2 * m[13] + t2 * m[16]) - i32(m[19]);
    let v0 = p0 >= 0 && p0 < i32(m[2]);
    let v1 = p1 >= 0 && p1 < i32(m[3]);
    let v2 = p2 >= 0 && p2 < i32(m[4]);
    let in0 = p0 >= -i32(m[17]) && p0 < i32(m[2] + m[20]);
    let in1 = p1 >= -i32(m[18]) && p1 < i32(m[3] + m[21]);
    let in2 = p2 >= -i32(m[19]) && p2 < i32(m[4] + m[22]);
    if (!(in0 && in1 && in2)) {{ continue; }}
    counted++;
    if (v0 && v1 && v2) {{
      let x = a[plane * inplane + (u32(p0) * m[3] + u32(p1)) * m[4] + u32(p2)];
      mx = nan_max(mx, x);
      sum = sum + x;
      nvalid++;
    }}
  }}
  }}
  }}
  if (is_max) {{ o[i] = mx; }}
  else {{
    let div = select(nvalid, counted, m[24] == 1u);
    o[i] = sum / f32(div);
  }}
}}
",
        bindings(&[Ty::F32], Ty::F32)
    )
}

/// One member of a fused elementwise chain ([`fused_elementwise`]): its WGSL expression in
/// `x` (and `y`), and where each operand comes from.
pub struct ChainOp {
    pub expr: String,
    /// Per operand: `Ok(j)` external input j, `Err(k)` the value of member k.
    pub args: Vec<Result<usize, usize>>,
}

/// A chain or tree of f32 elementwise ops as one kernel (one thread per output element):
/// each member is a function of its operands, in topological order, the last member's value
/// is written. External inputs broadcast by strides as in [`elementwise`]; meta: [n, rank,
/// dims[8], strides of external j [8] for each j]. `fast`: every external is contiguous with
/// the output's element count. Each member computes what its own kernel computes, with the
/// same expression; the values differ from the unfused kernels at most where the driver
/// contracts a product and a sum across members into one FMA.
pub fn fused_elementwise(n_ext: usize, ops: &[ChainOp], fast: bool) -> String {
    let mut funcs = String::new();
    let mut body = String::new();
    let names: Vec<String> = (0..n_ext).map(|j| format!("in{j}")).collect();
    let mut binds = String::new();
    for (j, nm) in names.iter().enumerate() {
        binds += &format!("@group(0) @binding({j}) var<storage, read> {nm}: array<f32>;\n");
    }
    binds += &format!(
        "@group(0) @binding({n_ext}) var<storage, read_write> o: array<f32>;\n@group(0) @binding({}) var<storage, read> m: array<u32>;\n",
        n_ext + 1
    );
    if fast {
        for (j, nm) in names.iter().enumerate() {
            body += &format!("  let e{j} = {nm}[i];\n");
        }
    } else {
        body += "  var rem = i;\n";
        for j in 0..n_ext {
            body += &format!("  var i{j} = 0u;\n");
        }
        body += "  let rank = m[1];\n  for (var d = 0u; d < rank; d++) {\n    let ax = rank - 1u - d;\n    let dim = m[2u + ax];\n    let cc = rem % dim;\n    rem = rem / dim;\n";
        for j in 0..n_ext {
            body += &format!("    i{j} += cc * m[{}u + ax];\n", 10 + 8 * j);
        }
        body += "  }\n";
        for (j, nm) in names.iter().enumerate() {
            body += &format!("  let e{j} = {nm}[i{j}];\n");
        }
    }
    for (k, op) in ops.iter().enumerate() {
        let params = if op.args.len() == 2 {
            "x: f32, y: f32"
        } else {
            "x: f32"
        };
        funcs += &format!("fn f{k}({params}) -> f32 {{ return {}; }}\n", op.expr);
        let args: Vec<String> = op
            .args
            .iter()
            .map(|a| match a {
                Ok(j) => format!("e{j}"),
                Err(k) => format!("v{k}"),
            })
            .collect();
        body += &format!("  let v{k} = f{k}({});\n", args.join(", "));
    }
    let last = ops.len() - 1;
    format!(
        "{binds}{PRELUDE}{funcs}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = flat_index(gid, nwg);
  if (i >= m[0]) {{ return; }}
{body}  o[i] = v{last};
}}
"
    )
}
