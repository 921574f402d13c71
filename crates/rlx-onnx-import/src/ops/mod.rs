//! The ONNX op registry: one table from op type to translator, translators grouped by
//! family (tract style). A translator gets the node's resolved inputs and attributes and
//! returns one graph node per ONNX output (aliases return an existing node).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::NodeId;

mod logic;
mod math;
mod nn;
mod reduce;
mod shape;

/// A translator: lowers one ONNX node, returning its outputs in order.
pub type Lower = fn(&mut Ctx, &ONode) -> R<Vec<NodeId>>;

/// The registry, `"Gemm" => math::gemm`. Only the default domain (`ai.onnx`).
const TABLE: &[(&str, Lower)] = &[
    // math
    ("Add", math::add),
    ("Sub", math::sub),
    ("Mul", math::mul),
    ("Div", math::div),
    ("Pow", math::pow),
    ("Mod", math::modulo),
    ("Sqrt", math::sqrt),
    ("Reciprocal", math::reciprocal),
    ("Exp", math::exp),
    ("Log", math::log),
    ("Neg", math::neg),
    ("Abs", math::abs),
    ("Floor", math::floor),
    ("Ceil", math::ceil),
    ("Round", math::round),
    ("Sign", math::sign),
    ("Sin", math::sin),
    ("Cos", math::cos),
    ("Tan", math::tan),
    ("Asin", math::asin),
    ("Acos", math::acos),
    ("Atan", math::atan),
    ("Sinh", math::sinh),
    ("Cosh", math::cosh),
    ("Asinh", math::asinh),
    ("Acosh", math::acosh),
    ("Atanh", math::atanh),
    ("Erf", math::erf),
    ("Max", math::max),
    ("Min", math::min),
    ("Sum", math::sum),
    ("Mean", math::mean),
    ("MatMul", math::matmul),
    ("Gemm", math::gemm),
    ("Clip", math::clip),
    ("CumSum", math::cumsum),
    // nn
    ("Relu", nn::relu),
    ("LeakyRelu", nn::leaky_relu),
    ("PRelu", nn::prelu),
    ("Sigmoid", nn::sigmoid),
    ("Tanh", nn::tanh),
    ("Gelu", nn::gelu),
    ("Elu", nn::elu),
    ("Selu", nn::selu),
    ("HardSigmoid", nn::hard_sigmoid),
    ("HardSwish", nn::hard_swish),
    ("Softplus", nn::softplus),
    ("Softsign", nn::softsign),
    ("Softmax", nn::softmax),
    ("LogSoftmax", nn::log_softmax),
    ("Conv", nn::conv),
    ("BatchNormalization", nn::batch_norm),
    ("LayerNormalization", nn::layer_norm),
    ("LRN", nn::lrn),
    ("MaxPool", nn::max_pool),
    ("AveragePool", nn::average_pool),
    ("GlobalAveragePool", nn::global_average_pool),
    ("GlobalMaxPool", nn::global_max_pool),
    ("Dropout", nn::dropout),
    // reductions
    ("ReduceMean", reduce::reduce_mean),
    ("ReduceSum", reduce::reduce_sum),
    ("ReduceMax", reduce::reduce_max),
    ("ReduceMin", reduce::reduce_min),
    ("ReduceProd", reduce::reduce_prod),
    ("ReduceL1", reduce::reduce_l1),
    ("ReduceL2", reduce::reduce_l2),
    ("ReduceSumSquare", reduce::reduce_sum_square),
    ("ReduceLogSumExp", reduce::reduce_log_sum_exp),
    ("ArgMax", reduce::arg_max),
    ("ArgMin", reduce::arg_min),
    // logic
    ("Equal", logic::equal),
    ("Less", logic::less),
    ("LessOrEqual", logic::less_or_equal),
    ("Greater", logic::greater),
    ("GreaterOrEqual", logic::greater_or_equal),
    ("And", logic::and),
    ("Or", logic::or),
    ("Xor", logic::xor),
    ("Not", logic::not),
    ("Where", logic::where_),
    ("IsNaN", logic::is_nan),
    ("IsInf", logic::is_inf),
    // shape & index
    ("Identity", shape::identity),
    ("Cast", shape::cast),
    ("CastLike", shape::cast_like),
    ("Reshape", shape::reshape),
    ("Transpose", shape::transpose),
    ("Concat", shape::concat),
    ("Split", shape::split),
    ("Slice", shape::slice),
    ("Gather", shape::gather),
    ("GatherElements", shape::gather_elements),
    ("Unsqueeze", shape::unsqueeze),
    ("Squeeze", shape::squeeze),
    ("Flatten", shape::flatten),
    ("Expand", shape::expand),
    ("Shape", shape::shape),
    ("Size", shape::size),
    ("ConstantOfShape", shape::constant_of_shape),
    ("Constant", shape::constant),
    ("Range", shape::range),
    ("Tile", shape::tile),
    ("Pad", shape::pad),
    ("Trilu", shape::trilu),
];

/// The translator for `op_type` (default domain), if the importer supports it.
pub fn lookup(op_type: &str) -> Option<Lower> {
    TABLE.iter().find(|(n, _)| *n == op_type).map(|(_, f)| *f)
}

/// Op types (default domain `ai.onnx`) the importer lowers, in registry order.
pub fn supported_ops() -> Vec<&'static str> {
    TABLE.iter().map(|(n, _)| *n).collect()
}
