//! Operations. Imported high-level ops keep ONNX names (`Softmax`, `LayerNorm`, ...);
//! primitives follow `jax.lax` vocabulary where one exists.
//!
//! Every op's output type lives on its [`Node`](crate::Node) (`node.shape`), so ops whose
//! output dims are data-dependent in ONNX (`Reshape`, `Expand`, `Slice`) carry them there,
//! resolved at import time. All axes are non-negative and already normalized.

use crate::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Elementwise one-input math. Output dtype = input dtype, except `IsNaN`/`IsInf` (Bool).
/// Definitions: ONNX operator spec of the same name (`Rsqrt` = 1/sqrt(x), `Round` = half to even).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Floor,
    Ceil,
    Round,
    Sign,
    /// Logical not (Bool → Bool).
    Not,
    /// Bool output: x is NaN.
    IsNaN,
    /// Bool output: x is +inf (if `pos`) or -inf (if `neg`).
    IsInf {
        pos: bool,
        neg: bool,
    },
    /// ONNX BitwiseNot: two's-complement `!x` on integers (not defined on floats or Bool).
    BitNot,
}

/// Activation functions (ONNX operator spec of the same name; `Gelu` is erf-based,
/// `GeluTanh` the tanh approximation; `Silu(x) = x * sigmoid(x)`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Activation {
    Relu,
    LeakyRelu {
        #[serde(with = "json_float")]
        alpha: f32,
    },
    Sigmoid,
    Tanh,
    Gelu,
    GeluTanh,
    Silu,
    Elu {
        #[serde(with = "json_float")]
        alpha: f32,
    },
    Selu {
        #[serde(with = "json_float")]
        alpha: f32,
        #[serde(with = "json_float")]
        gamma: f32,
    },
    HardSigmoid {
        #[serde(with = "json_float")]
        alpha: f32,
        #[serde(with = "json_float")]
        beta: f32,
    },
    HardSwish,
    Softplus,
    Softsign,
}

/// Elementwise two-input ops with NumPy broadcasting.
/// Comparison and logic ops output Bool. `Max`/`Min` propagate NaN (ONNX Max/Min, `np.maximum`).
/// `Rem` is C `fmod` (sign of the dividend); `Mod` is Python/NumPy `%` (sign of the divisor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Rem,
    Mod,
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    Xor,
    /// ONNX BitwiseAnd / BitwiseOr / BitwiseXor: integers only, same dtype.
    BitAnd,
    BitOr,
    BitXor,
    /// ONNX BitShift `direction = "LEFT"` / `"RIGHT"`: integers only; the shifted value is
    /// truncated to the dtype's width, a shift amount outside `0..64` gives 0 (right shift
    /// of a negative signed value: -1), matching NumPy's `<<`/`>>` on the widened value.
    ShiftLeft,
    ShiftRight,
}

impl BinaryOp {
    /// True for the integer-only bit ops (`BitAnd`..`ShiftRight`).
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRight
        )
    }

    /// True for ops whose output is Bool.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
        )
    }
}

/// Reduction kinds for [`Op::Reduce`]. `Mean` divides the sum by the reduced element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// Pooling kind for [`Op::Pool`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum PoolKind {
    Max,
    /// Average; `count_include_pad` counts padded positions (within the declared pads) in the divisor.
    Avg {
        count_include_pad: bool,
    },
    /// Lp pooling: (sum |x|^p)^(1/p).
    Lp {
        #[serde(with = "json_float")]
        p: f32,
    },
}

/// Convolution attributes (ONNX Conv, NCHW / NC*spatial layout).
/// `pads[i] = (begin, end)` for spatial axis `i`; `auto_pad` is resolved by the importer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvAttrs {
    pub strides: Vec<usize>,
    pub pads: Vec<(usize, usize)>,
    pub dilations: Vec<usize>,
    pub groups: usize,
}

/// Pooling attributes (ONNX MaxPool / AveragePool / LpPool, NC*spatial).
/// Output spatial dim `i` is `floor_or_ceil((in + pb + pe - dil*(k-1) - 1) / stride) + 1`,
/// rounding up when `ceil_mode` is set; with `ceil_mode` a last window that would start past
/// `in + pb` is dropped (ONNX reference / PyTorch rule). Windows may then run past
/// `pads.end`; such positions are never counted (not even by `count_include_pad`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolAttrs {
    pub kind: PoolKind,
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub pads: Vec<(usize, usize)>,
    pub dilations: Vec<usize>,
    /// ONNX `ceil_mode`: round the output dims up instead of down.
    #[serde(default)]
    pub ceil_mode: bool,
}

/// How [`Op::ScatterElements`] / [`Op::ScatterND`] combine an update with the value already
/// there (ONNX `reduction` attribute: `none`, `add`, `mul`, `max`, `min`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScatterReduction {
    /// Overwrite; with duplicate indices the last update (in index order) wins.
    None,
    Add,
    Mul,
    Max,
    Min,
}

/// Padding mode for [`Op::Pad`] (ONNX Pad `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum PadMode {
    Constant(#[serde(with = "json_float")] f64),
    Reflect,
    Edge,
    Wrap,
}

/// Interpolation of [`Op::GridSample`] (ONNX GridSample `mode`; opset 16's `bilinear` /
/// `bicubic` are `Linear` / `Cubic`). `Cubic` is Keys' cubic convolution with `a = -0.75`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GridMode {
    Nearest,
    Linear,
    Cubic,
}

/// Out-of-range handling of [`Op::GridSample`] (ONNX GridSample `padding_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// An operation. Inputs are listed per variant as `inputs: [..]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ---- leaves ----
    /// A graph input fed at run time. inputs: []
    Input { name: String },
    /// A named weight set once after compiling (`set_param`) or baked from an initializer. inputs: []
    Param { name: String },
    /// A literal tensor. inputs: []
    Constant(#[serde(skip, default = "empty_tensor")] Arc<Tensor>),

    // ---- elementwise ----
    /// inputs: [x]
    Unary(UnaryOp),
    /// inputs: [x]
    Activation(Activation),
    /// inputs: [a, b] (NumPy broadcasting to the node's dims)
    Binary(BinaryOp),
    /// ONNX Where / `lax.select`: inputs: [cond (Bool), on_true, on_false], broadcasting.
    Select,
    /// ONNX Cast / `lax.convert_element_type` (float→int truncates toward zero). `saturate`
    /// is ONNX Cast's attribute (default true): it only changes casts to the float8 types,
    /// where out-of-range values become ±max instead of Inf/NaN. inputs: [x]
    Cast {
        to: DType,
        #[serde(default = "serde_true")]
        saturate: bool,
    },
    /// ONNX BitCast (opset 26) / `lax.bitcast_convert_type`: reinterpret each element's bits
    /// as `to`, which must have the same bit width as the input (Bool counts as 8 bits;
    /// narrow types are refused). Little-endian, shape unchanged. inputs: [x]
    BitCast { to: DType },

    // ---- linear algebra ----
    /// ONNX MatMul (`np.matmul`): batch dims broadcast, 1-D operands promoted. inputs: [a, b]
    MatMul,
    /// ONNX Conv. inputs: [x [N,C,*], w [M, C/groups, *k], optional bias [M]]
    Conv(ConvAttrs),

    // ---- reductions & windows ----
    /// inputs: [x]; `axes` sorted, unique. Empty `axes` reduces nothing (identity).
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keepdims: bool,
    },
    /// ONNX ArgMax/ArgMin; output I64. inputs: [x]
    ArgReduce {
        max: bool,
        axis: usize,
        keepdims: bool,
        select_last_index: bool,
    },
    /// inputs: [x [N,C,*]]
    Pool(PoolAttrs),
    /// ONNX CumSum. inputs: [x]
    CumSum {
        axis: usize,
        exclusive: bool,
        reverse: bool,
    },

    // ---- shape & index ----
    /// Row-major reinterpretation to `dims` (same element count). inputs: [x]
    Reshape { dims: Vec<usize> },
    /// inputs: [x]; output dim i = input dim perm[i].
    Transpose { perm: Vec<usize> },
    /// ONNX Expand / `lax.broadcast_in_dim`: NumPy-aligned broadcast to exactly `dims`. inputs: [x]
    Broadcast { dims: Vec<usize> },
    /// inputs: [x0, x1, ...]
    Concat { axis: usize },
    /// Strided slice over every axis (one entry per input axis): element `j < sizes[i]` of
    /// axis `i` is input index `starts[i] + j*steps[i]` (steps may be negative, never 0). inputs: [x]
    Slice {
        starts: Vec<usize>,
        steps: Vec<i64>,
        sizes: Vec<usize>,
    },
    /// `pads[i] = (begin, end)` per axis, non-negative. inputs: [x]
    Pad {
        pads: Vec<(usize, usize)>,
        mode: PadMode,
    },
    /// inputs: [x]
    Tile { repeats: Vec<usize> },
    /// ONNX Gather: inputs: [data, indices (I64/I32, negative counts from the end)]
    Gather { axis: usize },
    /// ONNX GatherElements: inputs: [data, indices]
    GatherElements { axis: usize },
    /// ONNX Trilu with constant k. inputs: [x]
    Trilu { upper: bool, k: i64 },
    /// ONNX GatherND. inputs: [data, indices (I64/I32, last dim `q` = index depth, negative
    /// counts from the end)]. Output dims = `indices.dims[..-1] ++ data.dims[batch_dims + q..]`;
    /// the first `batch_dims` dims of data and indices are shared batch dims.
    GatherND { batch_dims: usize },
    /// ONNX ScatterElements (and the deprecated Scatter). inputs: [data, indices (same rank
    /// as data), updates (dims of indices)]; output = data with
    /// `out[i with axis coord = indices[i]] (reduction)= updates[i]`.
    ScatterElements {
        axis: usize,
        reduction: ScatterReduction,
    },
    /// ONNX ScatterND. inputs: [data, indices [..., q], updates (indices.dims[..-1] ++
    /// data.dims[q..])]; output = data with each indexed slice combined by `reduction`.
    ScatterND { reduction: ScatterReduction },
    /// ONNX TopK with `k` known at import time, along `axis`. ONNX TopK has two outputs; the
    /// IR is single-output, so one node computes one of them: `indices = false` gives the
    /// values (input dtype), `indices = true` the I64 positions along `axis` (the importer
    /// creates two nodes sharing the attributes when both are used). Output dims = input dims
    /// with `axis` set to `k`. Order: largest (or smallest) first; ties keep the lower index
    /// first; NaN counts as larger than every number. `sorted = false` still returns sorted
    /// order (ONNX allows any order then). inputs: [x]
    TopK {
        k: usize,
        axis: usize,
        largest: bool,
        sorted: bool,
        indices: bool,
    },

    /// ONNX GridSample (opset 16/20/22): samples `x [N, C, *in]` at the normalized
    /// coordinates of `grid [N, *out, nd]` (`grid[..., 0]` indexes the last spatial axis,
    /// values in [-1, 1]; `align_corners` maps -1/1 to the corner pixels' centers, else to
    /// their outer edges). Output `[N, C, *out]`, x's dtype (float). Semantics follow the
    /// onnx reference implementation (PyTorch's `grid_sample`). inputs: [x, grid]
    GridSample {
        mode: GridMode,
        padding: GridPadding,
        align_corners: bool,
    },

    // ---- high-level ops (rewritten into primitives by rlx-compile's decompose pass) ----
    /// inputs: [x]
    Softmax { axis: usize },
    /// inputs: [x]
    LogSoftmax { axis: usize },
    /// ONNX LayerNormalization over axes `axis..rank`. inputs: [x, scale, optional bias]
    LayerNorm {
        axis: usize,
        #[serde(with = "json_float")]
        epsilon: f32,
    },
    /// ONNX BatchNormalization (inference). inputs: [x, scale, bias, mean, var]
    BatchNorm {
        #[serde(with = "json_float")]
        epsilon: f32,
    },
    /// ONNX LRN across channels. inputs: [x]
    Lrn {
        size: usize,
        #[serde(with = "json_float")]
        alpha: f32,
        #[serde(with = "json_float")]
        beta: f32,
        #[serde(with = "json_float")]
        bias: f32,
    },
}

fn empty_tensor() -> Arc<Tensor> {
    Arc::new(Tensor::zeros(&[0], DType::F32))
}

impl Op {
    /// Short op name used in reports: `Rsqrt`, `MatMul`, `Softmax`, `Input`, ...
    pub fn name(&self) -> String {
        match self {
            Op::Input { .. } => "Input".into(),
            Op::Param { .. } => "Param".into(),
            Op::Constant(_) => "Constant".into(),
            Op::Unary(u) => format!("{u:?}")
                .split_whitespace()
                .next()
                .unwrap_or("Unary")
                .into(),
            Op::Activation(a) => format!("{a:?}")
                .split_whitespace()
                .next()
                .unwrap_or("Act")
                .into(),
            Op::Binary(b) => format!("{b:?}"),
            Op::Select => "Select".into(),
            Op::Cast { .. } => "Cast".into(),
            Op::BitCast { .. } => "BitCast".into(),
            Op::MatMul => "MatMul".into(),
            Op::Conv(_) => "Conv".into(),
            Op::Reduce { kind, .. } => format!("Reduce{kind:?}"),
            Op::ArgReduce { max, .. } => if *max { "ArgMax" } else { "ArgMin" }.into(),
            Op::Pool(p) => match p.kind {
                PoolKind::Max => "MaxPool",
                PoolKind::Avg { .. } => "AvgPool",
                PoolKind::Lp { .. } => "LpPool",
            }
            .into(),
            Op::CumSum { .. } => "CumSum".into(),
            Op::Reshape { .. } => "Reshape".into(),
            Op::Transpose { .. } => "Transpose".into(),
            Op::Broadcast { .. } => "Broadcast".into(),
            Op::Concat { .. } => "Concat".into(),
            Op::Slice { .. } => "Slice".into(),
            Op::Pad { .. } => "Pad".into(),
            Op::Tile { .. } => "Tile".into(),
            Op::Gather { .. } => "Gather".into(),
            Op::GatherElements { .. } => "GatherElements".into(),
            Op::Trilu { .. } => "Trilu".into(),
            Op::GatherND { .. } => "GatherND".into(),
            Op::ScatterElements { .. } => "ScatterElements".into(),
            Op::ScatterND { .. } => "ScatterND".into(),
            Op::TopK { indices, .. } => if *indices { "TopKIndices" } else { "TopK" }.into(),
            Op::GridSample { .. } => "GridSample".into(),
            Op::Softmax { .. } => "Softmax".into(),
            Op::LogSoftmax { .. } => "LogSoftmax".into(),
            Op::LayerNorm { .. } => "LayerNorm".into(),
            Op::BatchNorm { .. } => "BatchNorm".into(),
            Op::Lrn { .. } => "LRN".into(),
        }
    }

    /// True for Input, Param and Constant.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input { .. } | Op::Param { .. } | Op::Constant(_))
    }

    /// True for ops the decompose pass rewrites into primitives.
    pub fn is_high_level(&self) -> bool {
        matches!(
            self,
            Op::Softmax { .. }
                | Op::LogSoftmax { .. }
                | Op::LayerNorm { .. }
                | Op::BatchNorm { .. }
                | Op::Lrn { .. }
                | Op::Activation(Activation::Gelu)
                | Op::Activation(Activation::GeluTanh)
        )
    }
}

// ---- scalar semantics, shared by the constant evaluator and the CPU kernels ----

/// Error function in f64: `libm::erf` (musl's, within about 1 ulp of f64 everywhere; odd, so
/// `erf(±0) = ±0` and `erf(x) = 2x/sqrt(pi)` to rounding for tiny `|x|`). The Numerical
/// Recipes fit used before (`1 - erfc`, 1.2e-7 absolute) gave `erf(0) = -3e-8` and lost
/// every digit below |x| ~ 1e-6.
pub fn erf_f64(x: f64) -> f64 {
    libm::erf(x)
}

/// Complementary error function `1 - erf(x)` in f64 without the cancellation (`libm::erfc`):
/// accurate relative to its own value down to its underflow near x = 26.5.
pub fn erfc_f64(x: f64) -> f64 {
    libm::erfc(x)
}

impl UnaryOp {
    /// The op on one f64 value (Bool-valued ops return 0.0/1.0).
    #[inline]
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tan => x.tan(),
            UnaryOp::Asin => x.asin(),
            UnaryOp::Acos => x.acos(),
            UnaryOp::Atan => x.atan(),
            UnaryOp::Sinh => x.sinh(),
            UnaryOp::Cosh => x.cosh(),
            UnaryOp::Asinh => x.asinh(),
            UnaryOp::Acosh => x.acosh(),
            UnaryOp::Atanh => x.atanh(),
            UnaryOp::Erf => erf_f64(x),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Sign => {
                if x.is_nan() {
                    x
                } else if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Not => (x == 0.0) as u8 as f64,
            UnaryOp::IsNaN => x.is_nan() as u8 as f64,
            UnaryOp::IsInf { pos, neg } => {
                ((pos && x == f64::INFINITY) || (neg && x == f64::NEG_INFINITY)) as u8 as f64
            }
            UnaryOp::BitNot => !(x as i64) as f64,
        }
    }

    /// The op on one f32 value, computed in f32 where the result is the same to
    /// within f32 rounding (transcendentals go through f64 only for `Erf`).
    #[inline]
    pub fn apply_f32(self, x: f32) -> f32 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Reciprocal => 1.0 / x,
            other => other.apply_f64(x as f64) as f32,
        }
    }

    /// True when the output dtype is Bool regardless of the input.
    pub fn is_predicate(self) -> bool {
        matches!(self, UnaryOp::IsNaN | UnaryOp::IsInf { .. } | UnaryOp::Not)
    }
}

#[inline]
fn sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

impl Activation {
    /// The activation on one f64 value (ONNX definitions).
    #[inline]
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            // NaN-propagating: `x.max(0)` would drop the NaN.
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x
                } else {
                    x
                }
            }
            Activation::Sigmoid => sigmoid_f64(x),
            Activation::Tanh => x.tanh(),
            // 0.5 x (1 + erf(x/√2)) = 0.5 x erfc(-x/√2): no cancellation of `1 + erf` in the
            // negative tail (x = -5 lost 6% in f32, x <= -6 gave 0).
            Activation::Gelu => 0.5 * x * erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2),
            // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): again
            // without the cancellation of `1 + tanh` for negative x.
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                x * sigmoid_f64(2.0 * c * (x + 0.044715 * x * x * x))
            }
            Activation::Silu => x * sigmoid_f64(x),
            Activation::Elu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x.exp_m1() // expm1: exact near 0 (exp(x) - 1 gives 0 for |x| < 6e-8)
                } else {
                    x
                }
            }
            Activation::Selu { alpha, gamma } => {
                let g = gamma as f64;
                if x <= 0.0 {
                    g * alpha as f64 * x.exp_m1()
                } else {
                    g * x
                }
            }
            Activation::HardSigmoid { alpha, beta } => {
                let y = alpha as f64 * x + beta as f64;
                if y.is_nan() {
                    y
                } else {
                    y.clamp(0.0, 1.0)
                }
            }
            Activation::HardSwish => {
                let y = x / 6.0 + 0.5;
                if y.is_nan() {
                    y
                } else {
                    x * y.clamp(0.0, 1.0)
                }
            }
            Activation::Softplus => {
                if x > 20.0 {
                    x
                } else {
                    x.exp().ln_1p()
                }
            }
            Activation::Softsign => x / (1.0 + x.abs()),
        }
    }

    /// The activation on one f32 value.
    ///
    /// Always inlined: kernels call it per element inside their vector loops with a
    /// constant `self` (a fused conv's Relu: `|x| Activation::Relu.apply_f32(x)`), where
    /// inlining folds the match away. Left to the compiler, one build kept it out of line
    /// and the Winograd path's Relu became a call per element (21% of a 3×3 conv; SqueezeNet
    /// 7.2 -> 7.8 ms at 1 thread).
    #[inline(always)]
    pub fn apply_f32(self, x: f32) -> f32 {
        match self {
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::Sigmoid => {
                if x >= 0.0 {
                    1.0 / (1.0 + (-x).exp())
                } else {
                    let e = x.exp();
                    e / (1.0 + e)
                }
            }
            Activation::Tanh => x.tanh(),
            other => other.apply_f64(x as f64) as f32,
        }
    }
}

impl BinaryOp {
    /// The op on two f64 values (predicates return 0.0/1.0). Max/Min propagate NaN.
    #[inline]
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Max => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            }
            BinaryOp::Min => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.min(b)
                }
            }
            BinaryOp::Rem => a % b,
            BinaryOp::Mod => {
                let r = a % b;
                if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }
            }
            BinaryOp::Eq => (a == b) as u8 as f64,
            BinaryOp::Lt => (a < b) as u8 as f64,
            BinaryOp::Le => (a <= b) as u8 as f64,
            BinaryOp::Gt => (a > b) as u8 as f64,
            BinaryOp::Ge => (a >= b) as u8 as f64,
            BinaryOp::And => (a != 0.0 && b != 0.0) as u8 as f64,
            BinaryOp::Or => (a != 0.0 || b != 0.0) as u8 as f64,
            BinaryOp::Xor => ((a != 0.0) != (b != 0.0)) as u8 as f64,
            // Integer-only ops: the f64 path (never reached by checked graphs) goes via i64.
            op => op.apply_i64(a as i64, b as i64) as f64,
        }
    }

    /// The op on two f32 values.
    #[inline]
    pub fn apply_f32(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.max(b)
                }
            }
            BinaryOp::Min => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.min(b)
                }
            }
            BinaryOp::Pow => a.powf(b),
            other => other.apply_f64(a as f64, b as f64) as f32,
        }
    }

    /// The op on two u64 values (unsigned semantics: `Div`/`Rem`/`Mod` by zero give 0,
    /// wrapping arithmetic, logical shifts; shifting by 64 or more gives 0). Predicates
    /// return 0/1.
    #[inline]
    pub fn apply_u64(self, a: u64, b: u64) -> u64 {
        match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => a.checked_div(b).unwrap_or(0),
            BinaryOp::Rem | BinaryOp::Mod => a.checked_rem(b).unwrap_or(0),
            BinaryOp::Pow => a.wrapping_pow(b.min(u32::MAX as u64) as u32),
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Eq => (a == b) as u64,
            BinaryOp::Lt => (a < b) as u64,
            BinaryOp::Le => (a <= b) as u64,
            BinaryOp::Gt => (a > b) as u64,
            BinaryOp::Ge => (a >= b) as u64,
            BinaryOp::And => (a != 0 && b != 0) as u64,
            BinaryOp::Or => (a != 0 || b != 0) as u64,
            BinaryOp::Xor => ((a != 0) != (b != 0)) as u64,
            BinaryOp::BitAnd => a & b,
            BinaryOp::BitOr => a | b,
            BinaryOp::BitXor => a ^ b,
            BinaryOp::ShiftLeft => a.checked_shl(b.min(64) as u32).unwrap_or(0),
            BinaryOp::ShiftRight => a.checked_shr(b.min(64) as u32).unwrap_or(0),
        }
    }

    /// The op on two i64 values (integer semantics: `Div` truncates toward zero,
    /// division by zero gives 0; `Pow` with a negative exponent gives 0 unless the base is ±1).
    #[inline]
    pub fn apply_i64(self, a: i64, b: i64) -> i64 {
        match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => {
                if b == 0 {
                    0
                } else {
                    a.wrapping_div(b)
                }
            }
            BinaryOp::Pow => {
                if b < 0 {
                    match a {
                        1 => 1,
                        -1 => {
                            if b % 2 == 0 {
                                1
                            } else {
                                -1
                            }
                        }
                        _ => 0,
                    }
                } else {
                    a.wrapping_pow(b.min(u32::MAX as i64) as u32)
                }
            }
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Rem => {
                if b == 0 {
                    0
                } else {
                    a.wrapping_rem(b)
                }
            }
            BinaryOp::Mod => {
                if b == 0 {
                    0
                } else {
                    let r = a.wrapping_rem(b);
                    if r != 0 && ((r < 0) != (b < 0)) {
                        r + b
                    } else {
                        r
                    }
                }
            }
            BinaryOp::Eq => (a == b) as i64,
            BinaryOp::Lt => (a < b) as i64,
            BinaryOp::Le => (a <= b) as i64,
            BinaryOp::Gt => (a > b) as i64,
            BinaryOp::Ge => (a >= b) as i64,
            BinaryOp::And => (a != 0 && b != 0) as i64,
            BinaryOp::Or => (a != 0 || b != 0) as i64,
            BinaryOp::Xor => ((a != 0) != (b != 0)) as i64,
            BinaryOp::BitAnd => a & b,
            BinaryOp::BitOr => a | b,
            BinaryOp::BitXor => a ^ b,
            BinaryOp::ShiftLeft => {
                if (0..64).contains(&b) {
                    a.wrapping_shl(b as u32)
                } else {
                    0
                }
            }
            BinaryOp::ShiftRight => {
                if (0..64).contains(&b) {
                    a >> b
                } else if a < 0 {
                    -1
                } else {
                    0
                }
            }
        }
    }
}

fn serde_true() -> bool {
    true
}

/// Serde for float attributes that JSON cannot hold as numbers: finite values are numbers
/// (shortest round-trip form, exact), NaN and ±Inf are the strings `"nan"`, `"inf"`,
/// `"-inf"` (serde_json would write them as `null` and then fail to read them back). Used by
/// RLX packages' `graph.json` (a Pad with a `-inf` fill value).
mod json_float {
    use serde::{Deserialize, Deserializer, Serializer};

    /// An f32 or f64 attribute.
    pub trait Float: Copy {
        fn to_f64(self) -> f64;
        fn from_f64(x: f64) -> Self;
    }
    impl Float for f32 {
        fn to_f64(self) -> f64 {
            self as f64
        }
        fn from_f64(x: f64) -> Self {
            x as f32
        }
    }
    impl Float for f64 {
        fn to_f64(self) -> f64 {
            self
        }
        fn from_f64(x: f64) -> Self {
            x
        }
    }

    pub fn serialize<T: Float + serde::Serialize, S: Serializer>(
        x: &T,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v = x.to_f64();
        if v.is_nan() {
            s.serialize_str("nan")
        } else if v == f64::INFINITY {
            s.serialize_str("inf")
        } else if v == f64::NEG_INFINITY {
            s.serialize_str("-inf")
        } else {
            x.serialize(s)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Text(String),
    }

    pub fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        match Repr::deserialize(d)? {
            // f64 -> f32 of a value written from an f32 is exact.
            Repr::Num(x) => Ok(T::from_f64(x)),
            Repr::Text(t) => match t.as_str() {
                "nan" => Ok(T::from_f64(f64::NAN)),
                "inf" => Ok(T::from_f64(f64::INFINITY)),
                "-inf" => Ok(T::from_f64(f64::NEG_INFINITY)),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, \"nan\", \"inf\" or \"-inf\", got \"{other}\""
                ))),
            },
        }
    }
}
