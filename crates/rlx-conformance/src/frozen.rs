//! Which frozen inputs are *parameter* inputs and which are *data* inputs.
//!
//! The suite lets a case whose import needs a runtime input as a constant run with that input
//! frozen to its test value ([`crate::case::Outcome::frozen`]). Freezing a parameter input
//! (Reshape's shape, TopK's k) leaves the op's work to the runtime. Freezing a *data* input
//! (NonMaxSuppression's boxes, Unique's X, NonZero's condition, a Loop's trip count) lets the
//! importer compute the result itself: the runtime never runs the op, yet the case counts as
//! a pass. The harness reports the two kinds apart (README's conformance table).
//!
//! The rule, from the ONNX operator schemas (onnx 1.23 `docs/Operators.md`): an input is a
//! **parameter input** when the op's definition uses its value only to fix sizes, axes or
//! attributes of the computation (what older opsets had as attributes): it selects, counts
//! or shapes, and never enters the arithmetic of an output value. Anything else is a **data
//! input**: its values flow into the output's values, or decide them element by element
//! (a condition, a branch, a trip count). An input not in [`PARAMETER_INPUTS`] counts as data,
//! so an op missing from the table errs toward "data" (the stricter count).

use crate::onnx_meta::ModelMeta;
pub use rlx_onnx_import::params::{is_parameter_input, PARAMETER_INPUTS};

/// What freezing did to a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FrozenKind {
    /// No input frozen.
    None,
    /// Only parameter inputs frozen (every consumer reads them as a [`PARAMETER_INPUTS`] entry).
    Parameter,
    /// At least one frozen input is a data input of some node that reads it (or is read by
    /// no top-level node, or the model could not be read).
    Data,
}

/// Classify a frozen graph input `name` by the top-level nodes of `meta` that read it: a
/// parameter input only when every such node reads it at a parameter position.
pub fn input_is_parameter(meta: &ModelMeta, name: &str) -> bool {
    let mut read = false;
    for n in &meta.nodes {
        for (k, i) in n.inputs.iter().enumerate() {
            if i == name {
                read = true;
                if !is_parameter_input(&n.op_type, k) {
                    return false;
                }
            }
        }
    }
    read
}

/// The kind of a case's frozen inputs (`frozen`, graph input names) in model `meta`.
pub fn classify(meta: &ModelMeta, frozen: &[String]) -> FrozenKind {
    if frozen.is_empty() {
        FrozenKind::None
    } else if frozen.iter().all(|f| input_is_parameter(meta, f)) {
        FrozenKind::Parameter
    } else {
        FrozenKind::Data
    }
}
