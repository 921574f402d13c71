//! NaN/Inf localization: scan each op's output, decide whether the op created a bad value
//! (culprit) or carried it (propagator), and say how to fix it.
//!
//! Policy (DESIGN.md contract, `RLX_DEBUG_NANS`):
//! * a NaN is reported at the op that creates it (its inputs held no NaN);
//! * an Inf is reported only when it reaches a graph output or an op turns it into NaN;
//!   then both the NaN's op and the op where the Inf was created are named. Inf that is
//!   absorbed downstream (a `-inf` mask that softmax turns into 0, T5's `log(0)` discarded
//!   by a `Where`) gets at most one summary line;
//! * `strict` reports every non-finite value where it first appears (first-trip rule);
//! * `abort` stops at the first NaN created, or at the end of the run when an Inf reached an output.
//!
//! (One file over 1,000 lines: the scanner's rules (culprit vs propagator, Inf origins, fixes)
//! share `NodeState` and are one contract; the tests live beside it. A split is due when a
//! second scanner needs only part of it.)

use crate::provenance::{node_iteration, node_label, quoted_label, source_op_type};
use crate::{DType, Graph, NodeId, TensorData};
use half::{bf16, f16};
use serde::Serialize;
use std::fmt;

/// The environment variable that switches scanning on.
pub const RLX_DEBUG_NANS: &str = "RLX_DEBUG_NANS";

/// What the scanner does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DebugMode {
    /// No scanning (variable unset, empty, `0`, `false`, `off` or `no`).
    Off,
    /// Report and continue (any other value, e.g. `1`).
    Warn,
    /// Report every non-finite value where it first appears, Inf included (`strict`).
    Strict,
    /// Report and stop at the first NaN created, or at the end of the run when an Inf
    /// reached an output (`abort`).
    Abort,
}

impl DebugMode {
    /// Parse a value of `RLX_DEBUG_NANS` (`None` = unset).
    /// Parse a value of `RLX_DEBUG_NANS` (`None` = unset) by the one switch rule of
    /// [`crate::env::Switch`] plus its own values: unset, empty, `0`, `false`, `off`, `no`
    /// are off; `strict` and `abort` (any case) are those modes; `1`, `true`, `on`, `yes` and
    /// any other value are `Warn` (an unrecognized one with a note, from [`Self::from_env`]).
    pub fn parse(v: Option<&str>) -> DebugMode {
        use crate::env::{parse_switch, Switch};
        match v.map(str::trim) {
            Some(s) if s.eq_ignore_ascii_case("abort") => DebugMode::Abort,
            Some(s) if s.eq_ignore_ascii_case("strict") => DebugMode::Strict,
            v => match parse_switch(v) {
                Switch::Default | Switch::Off => DebugMode::Off,
                Switch::On | Switch::Unrecognized => DebugMode::Warn,
            },
        }
    }

    /// Read `RLX_DEBUG_NANS` once (an unrecognized value gets one note on stderr).
    pub fn from_env() -> DebugMode {
        let v = crate::env::get(RLX_DEBUG_NANS);
        let m = DebugMode::parse(v.as_deref());
        if let Some(v) = &v {
            let t = v.trim();
            if m == DebugMode::Warn
                && crate::env::parse_switch(Some(t)) == crate::env::Switch::Unrecognized
            {
                crate::env::note_unrecognized(RLX_DEBUG_NANS, v, "1 (report and go on)");
            }
        }
        m
    }

    pub fn is_on(self) -> bool {
        self != DebugMode::Off
    }
}

/// Kind of a non-finite value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BadKind {
    NaN,
    PosInf,
    NegInf,
}

impl fmt::Display for BadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadKind::NaN => "NaN",
            BadKind::PosInf => "+inf",
            BadKind::NegInf => "-inf",
        })
    }
}

/// An element type the scanner can classify.
pub trait ScanElem: Copy {
    /// `None` when finite.
    fn classify(self) -> Option<BadKind>;
    /// Fast test: true when finite.
    fn finite(self) -> bool;
    /// True when every element of `v` is finite (the scan's fast path over a clean buffer).
    fn all_finite(v: &[Self]) -> bool {
        v.chunks(64)
            .all(|ch| ch.iter().fold(true, |a, x| a & x.finite()))
    }
}

macro_rules! impl_scan {
    ($t:ty, $exp:expr) => {
        impl ScanElem for $t {
            /// Exponent bits all ones (IEEE 754 NaN or Inf), tested on the raw bits with
            /// an OR-reduction that vectorizes (one compare and one OR per element).
            #[inline]
            fn all_finite(v: &[Self]) -> bool {
                v.chunks(256).all(|ch| {
                    !ch.iter()
                        .fold(false, |a, x| a | ((x.to_bits() & $exp) == $exp))
                })
            }
            #[inline]
            fn classify(self) -> Option<BadKind> {
                if self.is_nan() {
                    Some(BadKind::NaN)
                } else if self.is_infinite() {
                    Some(if self.is_sign_positive() {
                        BadKind::PosInf
                    } else {
                        BadKind::NegInf
                    })
                } else {
                    None
                }
            }
            #[inline]
            fn finite(self) -> bool {
                self.is_finite()
            }
        }
    };
}
impl_scan!(f32, 0x7f80_0000u32);
impl_scan!(f64, 0x7ff0_0000_0000_0000u64);
impl_scan!(f16, 0x7c00u16);
impl_scan!(bf16, 0x7f80u16);

/// Counts of non-finite elements in one buffer and where each kind first occurs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NonFiniteCounts {
    pub len: usize,
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
    pub first_nan: Option<usize>,
    pub first_pos_inf: Option<usize>,
    pub first_neg_inf: Option<usize>,
}

impl NonFiniteCounts {
    pub fn is_clean(&self) -> bool {
        self.nan == 0 && self.pos_inf == 0 && self.neg_inf == 0
    }
    pub fn has_nan(&self) -> bool {
        self.nan > 0
    }
    pub fn has_inf(&self) -> bool {
        self.pos_inf > 0 || self.neg_inf > 0
    }
    /// The Inf kind that occurs first.
    pub fn first_inf(&self) -> Option<(usize, BadKind)> {
        match (self.first_pos_inf, self.first_neg_inf) {
            (Some(p), Some(n)) if n < p => Some((n, BadKind::NegInf)),
            (Some(p), _) => Some((p, BadKind::PosInf)),
            (None, Some(n)) => Some((n, BadKind::NegInf)),
            (None, None) => None,
        }
    }
    /// NaN first (if any), else the first Inf.
    pub fn first(&self) -> Option<(usize, BadKind)> {
        self.first_nan
            .map(|i| (i, BadKind::NaN))
            .or_else(|| self.first_inf())
    }
}

impl fmt::Display for NonFiniteCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} NaN, {} +inf, {} -inf in {} elements",
            self.nan, self.pos_inf, self.neg_inf, self.len
        )
    }
}

/// Index and kind of the first non-finite element of `v` (NaN or ±inf, whichever comes first).
pub fn first_bad<T: ScanElem>(v: &[T]) -> Option<(usize, BadKind)> {
    v.iter()
        .enumerate()
        .find_map(|(i, x)| x.classify().map(|k| (i, k)))
}

/// Count non-finite elements of `v`. A clean buffer costs one vectorizable pass.
pub fn count_nonfinite<T: ScanElem>(v: &[T]) -> NonFiniteCounts {
    let mut c = NonFiniteCounts {
        len: v.len(),
        ..Default::default()
    };
    // Fast path: chunked all-finite test.
    if T::all_finite(v) {
        return c;
    }
    for (i, x) in v.iter().enumerate() {
        match x.classify() {
            None => {}
            Some(BadKind::NaN) => {
                c.nan += 1;
                c.first_nan.get_or_insert(i);
            }
            Some(BadKind::PosInf) => {
                c.pos_inf += 1;
                c.first_pos_inf.get_or_insert(i);
            }
            Some(BadKind::NegInf) => {
                c.neg_inf += 1;
                c.first_neg_inf.get_or_insert(i);
            }
        }
    }
    c
}

/// Count non-finite elements of any buffer (integer and bool buffers are always clean;
/// narrow floats are decoded).
pub fn scan_data(d: &TensorData) -> NonFiniteCounts {
    match d {
        TensorData::F32(v) => count_nonfinite(v),
        TensorData::F64(v) => count_nonfinite(v),
        TensorData::F16(v) => count_nonfinite(v),
        TensorData::BF16(v) => count_nonfinite(v),
        // float8 NaN/Inf codes (E4M3FN: NaN only; FNUZ: NaN 0x80; E5M2: Inf and NaN).
        TensorData::Narrow { dtype, .. } if dtype.is_float() => count_nonfinite(&d.to_f64_vec()),
        other => NonFiniteCounts {
            len: other.len(),
            ..Default::default()
        },
    }
}

/// How the op at an Inf's origin made it, from the origin's op and inputs. The fix line of
/// a NaN made from that Inf, and whether its absorption destroyed data, follow from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InfSource {
    /// A literal non-finite constant entered the data here (`Where(mask, 0, -inf)`, an
    /// `Add` of a `-inf` mask constant): an intended fill.
    Fill,
    /// `log(0)`: a value that was (or underflowed to) zero reached a logarithm.
    LogOfZero,
    /// A division by zero (`x / 0`, `1 / 0`, `rsqrt(0)`, `0` to a negative power).
    DivisionByZero,
    /// Finite inputs gave a result beyond the dtype's range (`exp(100)`, `300²` in float16,
    /// an accumulation, a cast to a narrower type).
    Overflow,
    /// A graph input or parameter already held it.
    InputData,
}

impl InfSource {
    /// Classify the origin node `o` of an Inf, given the per-node scan states (a literal
    /// constant input holding ±inf makes the origin a fill).
    pub fn classify(g: &Graph, o: NodeId, states: &[NodeState]) -> InfSource {
        use crate::op::{BinaryOp as B, UnaryOp as U};
        use crate::Op;
        let node = g.node(o);
        let literal_inf = node
            .inputs
            .iter()
            .any(|i| is_literal_constant(g, *i) && states.get(i.index()).is_some_and(|s| s.inf));
        if literal_inf {
            return InfSource::Fill;
        }
        match &node.op {
            Op::Input { .. } | Op::Param { .. } => InfSource::InputData,
            Op::Constant(_) if is_literal_constant(g, o) => InfSource::Fill,
            Op::Constant(_) if is_bad_weight(g, o) => InfSource::InputData,
            Op::Select | Op::Pad { .. } => InfSource::Fill,
            Op::Unary(U::Log) => InfSource::LogOfZero,
            Op::Unary(U::Reciprocal | U::Rsqrt) | Op::Binary(B::Div) => InfSource::DivisionByZero,
            Op::Binary(B::Pow) => {
                // 0 to a negative power is a division by zero; a positive power overflows.
                let neg_exp = node.inputs.get(1).and_then(|e| match &g.node(*e).op {
                    Op::Constant(t) => {
                        let v = t.data().to_f64_vec();
                        Some(!v.is_empty() && v.iter().all(|&p| p < 0.0))
                    }
                    _ => None,
                });
                if neg_exp == Some(true) {
                    InfSource::DivisionByZero
                } else {
                    InfSource::Overflow
                }
            }
            Op::Constant(_) => match source_op_type(g, o).map(fix_key).as_deref() {
                // A constant folded from an op (ONNX `Log`, ATen `aten.log.default`):
                // classify by that op's type.
                Some("log") => InfSource::LogOfZero,
                Some("div") | Some("reciprocal") | Some("rsqrt") => InfSource::DivisionByZero,
                _ => InfSource::Overflow,
            },
            _ => InfSource::Overflow,
        }
    }

    /// A few words for reports: `log of zero`, `an overflow`, ...
    pub fn describe(self) -> &'static str {
        match self {
            InfSource::Fill => "a fill constant",
            InfSource::LogOfZero => "log of zero",
            InfSource::DivisionByZero => "a division by zero",
            InfSource::Overflow => "an overflow of finite values",
            InfSource::InputData => "the input data",
        }
    }
}

/// Why a node's output holds a bad value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// Culprit: every input was finite and this op produced the value.
    InputsFinite,
    /// Culprit: an input held ±inf (no NaN) and this op turned it into NaN.
    InputsHeldInf {
        input: NodeId,
        input_kind: BadKind,
        /// Where that Inf was first created, when known.
        inf_origin: Option<NodeId>,
        inf_origin_label: Option<String>,
        /// The op type of the origin node (`Where`, `Log`, ...).
        inf_origin_op: Option<String>,
        /// The sign of the Inf at the origin, when it differs from `input_kind` (an op on
        /// the way flipped it, e.g. a Conv with a negative weight): the report then says
        /// the infinity entered as that sign.
        #[serde(skip_serializing_if = "Option::is_none")]
        inf_origin_kind: Option<BadKind>,
        /// How the origin made the infinity (a fill constant, log of 0, a division by 0,
        /// an overflow of finite values, the input data), when known: the fix follows it.
        #[serde(skip_serializing_if = "Option::is_none")]
        inf_source: Option<InfSource>,
    },
    /// Culprit: a literal constant input holding ±inf (a fill: a `-inf` scalar, a 0/-inf
    /// mask) entered the data here (`scores + mask`, `Where(m, x, -inf)`).
    FillEntered { input: NodeId, input_label: String },
    /// Culprit: a graph input, parameter or constant already holds the value.
    Leaf,
    /// Propagator: input `input` was already non-finite.
    Propagated { input: NodeId },
    /// Culprit: input `input` held NaN too, but this elementwise op's output holds more NaN
    /// than its inputs could carry (at most `carried_at_most`), so it created some itself.
    CreatedBesideInputNaN {
        input: NodeId,
        carried_at_most: usize,
    },
}

/// One localized NaN/Inf, printed in the seed format:
/// ```text
/// rlx nan-check: NaN at index 0 of %137 Rsqrt "layer3.attn.rms_norm"
///   → inputs finite, this op produced it
///   fix: ...
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NanReport {
    pub backend: String,
    pub node: NodeId,
    pub label: String,
    /// The IR op that produced the value (`Div`, `Rsqrt`, ...).
    pub op: String,
    /// The source op type (`Softmax`, ...) when it differs from `op`.
    pub source_op: Option<String>,
    pub kind: BadKind,
    /// Flat row-major index of the first bad element of `kind`.
    pub index: usize,
    /// Output dims of the node.
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub counts: NonFiniteCounts,
    pub cause: Cause,
    /// A one-line suggestion (culprits only).
    pub fix: Option<String>,
    /// Extra context, e.g. `+inf reached graph output #0 "logits"`.
    pub note: Option<String>,
    /// The line of the user's code that created the source op (`torch.export` programs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<crate::SourceLoc>,
    /// The line of the user's code that created the infinity this op turned into NaN
    /// (`Cause::InputsHeldInf`'s origin), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inf_origin_source: Option<crate::SourceLoc>,
    /// Where in a sequence of runs this one was (`prefill`, `decode step 37, position 52`),
    /// set by the caller through [`DebugScanner::set_context`]; printed after the label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The loop iterations the node was lowered in, outermost first (an unrolled ONNX
    /// `Loop`/`Scan` body node; [`crate::Origin::iteration`]); printed after the label:
    /// `"body/Sqrt" (iteration 3 of Loop "loop")`. Empty outside loops.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub iteration: Vec<crate::LoopIteration>,
    /// The loop iterations of `Cause::InputsHeldInf`'s origin node, when it has any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inf_origin_iteration: Vec<crate::LoopIteration>,
}

impl NanReport {
    /// True unless the node only carried a value from upstream.
    pub fn is_culprit(&self) -> bool {
        !matches!(self.cause, Cause::Propagated { .. })
    }

    /// The node as the report's header names it: `%12 Sqrt "body/Sqrt"`, followed by its
    /// loop iteration when it has one (`(iteration 3 of Loop "loop")`). The CLI's and the
    /// Python package's `RLX_DEBUG_NANS=abort` lines use it.
    pub fn at(&self) -> String {
        format!(
            "{} {} {}",
            self.node,
            self.op,
            crate::provenance::with_iteration(&self.label, &self.iteration)
        )
    }

    /// [`NanReport::at`] and the run's context in parentheses when there is one (a loop body
    /// run at run time: `(iteration 3 of Loop "decoder_loop", its body run at run time)`), as
    /// the report's first line and the `RLX_DEBUG_NANS=abort` line print it.
    pub fn at_in_context(&self) -> String {
        match &self.context {
            Some(c) => format!("{} ({c})", self.at()),
            None => self.at(),
        }
    }
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut out = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        if dims[k] > 0 {
            out[k] = i % dims[k];
            i /= dims[k];
        }
    }
    out
}

impl fmt::Display for NanReport {
    /// The report's lines, without a trailing newline (a report without a fix line ends at
    /// its last line, so `println!("{report}")` prints no blank line).
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.write_lines(&mut text)?;
        out.write_str(text.trim_end_matches('\n'))
    }
}

impl NanReport {
    fn write_lines(&self, f: &mut String) -> fmt::Result {
        use std::fmt::Write as _;
        writeln!(
            f,
            "rlx nan-check: {} at index {} of {}",
            self.kind,
            self.index,
            self.at_in_context(),
        )?;
        if let Some(loc) = &self.source {
            writeln!(f, "  at {loc}")?;
        }
        match &self.cause {
            Cause::InputsFinite => writeln!(f, "  → inputs finite, this op produced it")?,
            Cause::FillEntered { input, input_label } => writeln!(
                f,
                "  → constant input {input} \"{input_label}\" holds {}: a fill value enters the data here",
                self.kind
            )?,
            Cause::InputsHeldInf {
                input,
                input_kind,
                inf_origin,
                inf_origin_label,
                inf_origin_op,
                inf_origin_kind,
                ..
            } => {
                write!(f, "  → inputs held {input_kind} (input {input}")?;
                if let (Some(o), Some(l)) = (inf_origin, inf_origin_label) {
                    let op = inf_origin_op.as_deref().unwrap_or("");
                    match inf_origin_kind {
                        Some(k) => write!(
                            f,
                            "; the infinity entered as {k} at {o} {op} {} and changed sign on the way",
                            crate::provenance::with_iteration(l, &self.inf_origin_iteration)
                        )?,
                        None => write!(
                            f,
                            "; the {input_kind} was created at {o} {op} {}",
                            crate::provenance::with_iteration(l, &self.inf_origin_iteration)
                        )?,
                    }
                }
                writeln!(f, "), this op produced {}", self.kind)?;
                if let Some(loc) = &self.inf_origin_source {
                    writeln!(f, "    the {input_kind} was created at {loc}")?;
                }
            }
            Cause::Leaf => match self.op.as_str() {
                "Input" => writeln!(f, "  → the graph input already holds it (nothing upstream)")?,
                "Param" => writeln!(f, "  → the parameter already holds it (nothing upstream)")?,
                "Constant" => writeln!(f, "  → a literal constant of the model holds it")?,
                "Initializer" => writeln!(
                    f,
                    "  → the model's weights already hold it: initializer \"{}\" (read from the model file; nothing upstream)",
                    self.label
                )?,
                _ => writeln!(
                    f,
                    "  → computed from constants when the model was loaded: this op produced it"
                )?,
            },
            Cause::CreatedBesideInputNaN { input, carried_at_most } => writeln!(
                f,
                "  → input {input} held NaN too, but the output has {} NaN where at most {carried_at_most} can come from the inputs: this op created the rest",
                self.counts.nan
            )?,
            Cause::Propagated { input } => writeln!(
                f,
                "  → propagated: input {input} was already non-finite (look upstream)"
            )?,
        }
        if let Some(src) = &self.source_op {
            writeln!(f, "  source op: {src} (this is its {} step)", self.op)?;
        }
        if self.dims.is_empty() {
            writeln!(
                f,
                "  where: the scalar {} output; {} [{}]",
                self.dtype, self.counts, self.backend
            )?;
        } else {
            writeln!(
                f,
                "  where: element {:?} of {}{:?}; {} [{}]",
                unravel(self.index, &self.dims),
                self.dtype,
                self.dims,
                self.counts,
                self.backend
            )?;
        }
        if let Some(n) = &self.note {
            writeln!(f, "  note: {n}")?;
        }
        if let Some(fix) = &self.fix {
            write!(f, "  fix: {fix}")?;
        }
        Ok(())
    }
}

/// The op name fix lines are keyed on: ONNX op types lowercased (`softmax`), and ATen targets
/// of `torch.export` programs (`aten._log_softmax.default`, `aten.native_layer_norm.default`)
/// mapped onto the same keys (`logsoftmax`, `layernorm`).
fn fix_key(op: &str) -> String {
    let lower = op.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("aten.") else {
        return lower;
    };
    let name = rest
        .split('.')
        .next()
        .unwrap_or(rest)
        .trim_start_matches('_');
    // In-place forms (`div_`, `add_`) advise as their functional op.
    let name = if name.len() > 1 && name.ends_with('_') {
        &name[..name.len() - 1]
    } else {
        name
    };
    match name {
        "log_softmax" => "logsoftmax",
        "safe_softmax" | "softmax" => "softmax",
        "native_layer_norm" | "layer_norm" => "layernorm",
        "native_batch_norm" | "batch_norm" | "native_batch_norm_legit_no_training" => "batchnorm",
        "native_group_norm" | "group_norm" => "groupnorm",
        "rms_norm" => "rmsnormalization",
        "instance_norm" => "instancenormalization",
        "addmm" | "mm" | "bmm" | "linear" => "gemm",
        "convolution" | "conv2d" | "conv1d" => "conv",
        "sum" => "reducesum",
        "mean" => "reducemean",
        "to_copy" | "to" => "cast",
        other => other,
    }
    .to_string()
}

/// A one-line fix for a culprit, keyed on the source op type (e.g. ONNX `Softmax`) and
/// else on the IR op. `None` for propagators and for ops with no known failure mode.
pub fn fix_hint(
    op: &str,
    source_op: Option<&str>,
    cause: &Cause,
    kind: BadKind,
    dtype: DType,
) -> Option<String> {
    if matches!(cause, Cause::Propagated { .. }) {
        return None;
    }
    // The source op's advice first (`aten.var` → the variance's N - 1), else the advice for
    // the IR step that produced the value (its `Div`), so a culprit always gets a line when
    // its step has one.
    hint_for_key(&fix_key(source_op.unwrap_or(op)), op, cause, kind, dtype)
        .or_else(|| source_op.and_then(|_| hint_for_key(&fix_key(op), op, cause, kind, dtype)))
}

fn hint_for_key(key: &str, op: &str, cause: &Cause, kind: BadKind, dtype: DType) -> Option<String> {
    let from_inf = matches!(cause, Cause::InputsHeldInf { .. });
    let from_pos_inf = matches!(
        cause,
        Cause::InputsHeldInf {
            input_kind: BadKind::PosInf,
            ..
        }
    );
    let inf_source = match cause {
        Cause::InputsHeldInf { inf_source, .. } => *inf_source,
        _ => None,
    };
    if matches!(cause, Cause::FillEntered { .. }) {
        return Some(format!("a {kind} fill constant reaches this op's output: if it is a mask, use a large finite value such as torch.finfo(dtype).min instead of inf, so a fully masked row cannot turn into NaN"));
    }
    let key = key.to_string();
    let ir = op.to_ascii_lowercase();
    // What turned the Inf into NaN here, in words.
    let meeting = match ir.as_str() {
        "mul" | "matmul" | "gemm" | "conv" => "0 × inf",
        "add" | "sub" | "reducesum" | "reducemean" => "inf - inf",
        "div" => "inf / inf",
        _ => "an infinite value turned into NaN",
    };
    let narrow = matches!(dtype, DType::F16 | DType::BF16);
    let norm = matches!(
        key.as_str(),
        "layernormalization"
            | "layernorm"
            | "batchnormalization"
            | "batchnorm"
            | "instancenormalization"
            | "rmsnormalization"
            | "simplifiedlayernormalization"
    );
    let s = match key.as_str() {
        "kvcache" => "the KV cache already holds this value: an earlier step (the prefill or an earlier decode step) wrote it; its report names the op that created it".into(),
        "input" => "the input data already holds this value: check the data pipeline or tokenizer output".into(),
        "param" | "initializer" => "the weights hold a non-finite value: check the checkpoint (and the training run that wrote it), or the tensor constant your code builds (torch.tensor([...]) in forward is stored as lifted_tensor_N)".into(),
        "constant" => "a constant in the model is non-finite: if it is a mask fill, use a large finite value such as torch.finfo(dtype).min instead of inf".into(),
        "softmax" | "logsoftmax" if from_pos_inf => "the softmax input holds +inf, so x - max(x) is inf - inf = NaN in that row: find where the +inf comes from (the origin above: an op upstream, or the input data) and keep it finite there (clamp it, or compute that op in f32)".into(),
        "softmax" | "logsoftmax" if from_inf && inf_source == Some(InfSource::LogOfZero) => "the softmax input holds -inf from a log of zero (the origin above): every position of a row is -inf, so x - max(x) is NaN; clamp the log's input (log(max(x, 1e-12))) or keep those scores finite".into(),
        "softmax" | "logsoftmax" if from_inf && inf_source == Some(InfSource::Overflow) => format!("the softmax input overflowed to -inf (the origin above: a large negative value, e.g. a finfo.min mask added to a negative score, passed {dtype}'s range), so a row is all -inf and x - max(x) is NaN; compute the scores and the mask addition in f32, or clamp them to finfo.min"),
        "softmax" | "logsoftmax" if from_inf => "every position of a softmax row is masked (-inf): fill masks with a large finite negative (torch.finfo(dtype).min) instead of -inf, or zero fully masked rows after the softmax".into(),
        "softmax" | "logsoftmax" => "softmax input overflowed: subtract the row max first and keep the softmax in f32".into(),
        "rsqrt" | "sqrt" => format!("{} of a {} input: add an epsilon inside the root (e.g. rsqrt(mean(x^2) + 1e-6)) and make sure the value cannot go negative", key, if kind == BadKind::NaN { "negative (or 0/0)" } else { "zero" }),
        "log" => "log of zero or a negative value: clamp the input (log(max(x, 1e-12))) or use log_softmax / log1p".into(),
        "acos" | "asin" | "arccos" | "arcsin" => format!("{key} of a value outside [-1, 1] (rounding can push a cosine similarity or a normalized dot product to 1.0000001): clamp the input to [-1, 1] first"),
        "acosh" => "acosh of a value below 1: clamp the input to >= 1".into(),
        "atanh" if kind == BadKind::NaN => "atanh of a value outside [-1, 1]: clamp the input to (-1, 1)".into(),
        "var" | "std" | "var_mean" | "std_mean" if kind == BadKind::NaN => "variance with Bessel's correction over a single element divides 0 by N - 1 = 0: pass correction=0 (unbiased=False), or reduce over more than one element".into(),
        _ if from_inf && inf_source == Some(InfSource::LogOfZero) => format!("{meeting}: the -inf comes from log of zero at the origin above (a probability that underflowed to 0, as in onehot * log(softmax(x))): compute in log space (LogSoftmax, log-sum-exp, a cross-entropy op) instead of log(softmax(x)), or clamp before the log (log(max(p, 1e-12)))"),
        _ if from_inf && inf_source == Some(InfSource::DivisionByZero) && norm => format!("{meeting}: the inf comes from a division by zero at the origin above (a zero-variance or all-zero row with epsilon 0): set epsilon > 0 (1e-5 or 1e-6 is usual)"),
        _ if from_inf && inf_source == Some(InfSource::DivisionByZero) => format!("{meeting}: the inf comes from a division by zero at the origin above: add an epsilon to that denominator (x / (d + 1e-6); for an RMSNorm/LayerNorm written by hand, rsqrt(mean(x^2) + eps) with eps > 0) or mask the rows whose denominator is 0"),
        _ if from_inf && inf_source == Some(InfSource::Overflow) => format!("{meeting}: the inf comes from an overflow of finite values at the origin above (a result beyond the dtype's range): keep that op in f32 (or accumulate in a wider dtype), or scale its inputs down"),
        _ if from_inf && inf_source == Some(InfSource::InputData) => format!("{meeting}: the inf is already in the input data or weights (the origin above): check the data pipeline or the checkpoint"),
        "exp" => format!("exp overflowed (input above {} for {}): subtract the max before exp, as softmax does, or clamp the input", if narrow { "11" } else { "88" }, dtype),
        "div" | "reciprocal" if from_inf => "inf / inf (or 0 × inf): a non-finite value reached a division; use a finite fill value instead of inf".into(),
        "div" | "reciprocal" => "division by zero (0/0 gives NaN, x/0 gives inf): add an epsilon to the denominator (x / (d + 1e-6)) or mask the rows whose denominator is 0".into(),
        "pow" if kind != BadKind::NaN => format!("pow overflowed: |x|^p passed {dtype}'s range (max {}) with finite inputs (or 0 was raised to a negative power): compute it in f32, or scale x down before the power (e.g. mean((x/s)^2) * s^2)", dtype.max_finite().unwrap_or(f64::MAX)),
        "pow" => "pow of a negative base with a fractional exponent gives NaN, and 0 to a negative power gives inf: clamp the base (e.g. pow(max(x, 0), p))".into(),
        "mul" if from_inf => "0 × inf: an infinite value met a zero; use a large finite fill value instead of inf".into(),
        "add" | "sub" if from_inf => "inf - inf: two infinities of opposite sign met; use finite fill values for masks".into(),
        "cast" => format!("the value exceeds the range of {dtype}: clamp before the cast (f16 max is 65504) or keep this op in f32"),
        "batchnorm" | "batchnormalization" if kind == BadKind::NaN && !from_inf =>
            "an eval-mode batch norm divides by sqrt(running_var + epsilon): a negative running_var in the checkpoint (a corrupted or badly merged state dict) gives the square root of a negative number; check bn.running_var >= 0 for every BatchNorm (with epsilon 0, a zero variance divides 0 by 0)".into(),
        _ if norm && kind != BadKind::NaN =>
            "the normalization's result overflowed: a very large input, scale or bias (x² in the variance, or the scaled output, passed the dtype's range); check those weights and the input's magnitude, and keep the norm in f32 (epsilon 0 on a constant row gives NaN, not inf)".into(),
        _ if norm =>
            "normalizing a constant or zero row with epsilon 0 divides by zero: set epsilon > 0 (1e-5 is usual); if epsilon is already > 0, the variance overflowed (a very large input)".into(),
        "lrn" => "LRN's denominator went to zero or overflowed: check bias > 0".into(),
        _ if from_inf => "a non-finite input met an operation that turns it into NaN: replace inf fills upstream by large finite values".into(),
        _ if narrow && kind != BadKind::NaN => format!("the result exceeds {dtype}'s range (max {}): compute this op in f32, or scale its inputs down", dtype.max_finite().unwrap_or(0.0)),
        "matmul" | "gemm" | "conv" | "reducesum" | "reducemean" => "accumulation overflowed: scale the inputs down or accumulate in a wider dtype".into(),
        _ => return None,
    };
    Some(s)
}

/// The op name a report shows for node `id`: the source op type for folded constants
/// (a `Constant` folded from an ONNX `Div` shows as `Div`), else the IR op name.
pub fn display_op(g: &Graph, id: NodeId) -> String {
    let n = g.node(id);
    if is_bad_weight(g, id) {
        return "Initializer".into();
    }
    match (&n.op, source_op_type(g, id)) {
        (crate::Op::Constant(_), Some(src)) => src.to_string(),
        (op, _) => op.name(),
    }
}

/// True for a constant written literally in the model (an ONNX `Constant` node, a scalar the
/// importer wrote for an argument, an initializer that is a fill such as a `-inf` scalar or
/// a 0/-inf mask), as opposed to one folded from an op or a weight holding bad data. A
/// literal non-finite constant counts as part of the op that consumes it:
/// `Where(mask, 0, -inf)` is where the -inf enters the data.
pub fn is_literal_constant(g: &Graph, id: NodeId) -> bool {
    matches!(g.node(id).op, crate::Op::Constant(_))
        && matches!(source_op_type(g, id), None | Some("Constant"))
        && !is_bad_weight(g, id)
}

/// True for a named tensor of the model (an ONNX initializer; a `torch.export` parameter,
/// buffer or tensor constant: a `Constant` whose origin has the tensor's name and no op
/// type) that holds NaN/Inf as data rather than as a fill: a NaN anywhere, or an infinity
/// beside finite non-zero values (`scale = [1, inf, 2]`, a corrupted weight). The model
/// file already holds that value, so the initializer is the culprit (its own origin), not
/// the op that reads it. A scalar, or a tensor of only 0 and one-signed infinities (a
/// causal mask), is a fill.
pub fn is_bad_weight(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    let crate::Op::Constant(t) = &n.op else {
        return false;
    };
    let named = n
        .origin
        .as_ref()
        .is_some_and(|o| o.op_type.is_none() && !o.label.is_empty());
    if !named || !t.dtype().is_float() {
        return false;
    }
    let c = scan_data(t.data());
    if c.is_clean() {
        return false;
    }
    if c.has_nan() {
        return true;
    }
    if c.len == 1 || (c.pos_inf > 0 && c.neg_inf > 0) {
        return c.len > 1;
    }
    // Any finite non-zero value beside the infinities: data, not a mask. Read in place with
    // an early exit (a large 0/-inf causal mask is read once per call, without a copy).
    use crate::TensorData as D;
    match t.data() {
        D::F32(v) => v.iter().any(|x| x.is_finite() && *x != 0.0),
        D::F64(v) => v.iter().any(|x| x.is_finite() && *x != 0.0),
        D::F16(v) => v.iter().any(|x| x.is_finite() && x.to_f32() != 0.0),
        D::BF16(v) => v.iter().any(|x| x.is_finite() && x.to_f32() != 0.0),
        d => d.to_f64_vec().iter().any(|x| x.is_finite() && *x != 0.0),
    }
}

/// Why `origin` created the Inf it holds, for a report made at the origin: a leaf holds it,
/// a literal fill constant among its inputs entered the data there, or its inputs were
/// finite.
fn creation_cause(g: &Graph, origin: NodeId, states: &[NodeState]) -> Cause {
    let node = g.node(origin);
    if node.op.is_leaf() {
        return Cause::Leaf;
    }
    if let Some(i) = node
        .inputs
        .iter()
        .find(|i| is_literal_constant(g, **i) && states.get(i.index()).is_some_and(|s| s.inf))
    {
        return Cause::FillEntered {
            input: *i,
            input_label: node_label(g, *i),
        };
    }
    Cause::InputsFinite
}

/// Per-node scan state kept during one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeState {
    pub scanned: bool,
    pub nan: bool,
    pub inf: bool,
    /// The kind of the first Inf element (+inf or -inf).
    pub inf_kind: Option<BadKind>,
    /// Where the Inf this node holds was first created.
    pub inf_origin: Option<NodeId>,
    /// Number of NaN elements and of all elements in the node's output.
    pub nan_count: usize,
    pub len: usize,
}

/// True when `op`, with output dtype `dtype`, only moves or selects its inputs' values
/// (Reshape, Transpose, Broadcast, Concat, Slice, Tile, the Gathers, Trilu's zeros, Select,
/// and Pad with a fill that is finite in `dtype`: 1e5 is +inf in f16): every output element
/// is an input element or a finite constant, so when every input is finite the output is
/// too, and a scanner may record it as clean without reading it (the CPU executor does).
/// Ops that compute anything, even ones finite on finite inputs (Relu, Max, Sigmoid), are
/// not listed: their outputs are always read.
pub fn only_moves_values(op: &crate::Op, dtype: DType) -> bool {
    use crate::op::PadMode;
    use crate::Op;
    match op {
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Broadcast { .. }
        | Op::Concat { .. }
        | Op::Slice { .. }
        | Op::Tile { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherND { .. }
        | Op::Trilu { .. }
        | Op::Select => true,
        Op::Pad { mode, .. } => match mode {
            // The fill as the kernel stores it, in the tensor's own type.
            PadMode::Constant(v) => match dtype {
                DType::F64 => v.is_finite(),
                DType::F32 => (*v as f32).is_finite(),
                DType::F16 => f16::from_f64(*v).is_finite(),
                DType::BF16 => bf16::from_f64(*v).is_finite(),
                // The float8/float4 types: always read (their conversions saturate or
                // make a NaN, type by type).
                _ if dtype.is_float() => false,
                // Integers and bools hold no NaN or Inf.
                _ => true,
            },
            _ => true,
        },
        _ => false,
    }
}

/// Classify a node whose output holds bad values, given the states of its inputs:
/// culprit (and why) or propagator. `states` is indexed by node id.
pub fn check_node(g: &Graph, id: NodeId, out: &NonFiniteCounts, states: &[NodeState]) -> Cause {
    check_node_at(g, id, out, states, &[])
}

/// [`check_node`] with the NaN positions of nodes (indexed by node id; `None` or missing:
/// unknown). An elementwise op whose NaN inputs have the output's length and known positions
/// carries at most as many NaN as the union of those positions, not their sum: NaN at the
/// same place of both operands counts once.
pub fn check_node_at(
    g: &Graph,
    id: NodeId,
    out: &NonFiniteCounts,
    states: &[NodeState],
    nan_pos: &[Option<Vec<u32>>],
) -> Cause {
    let node = g.node(id);
    if node.op.is_leaf() {
        return Cause::Leaf;
    }
    let st = |i: &NodeId| states.get(i.index()).copied().unwrap_or_default();
    if out.has_nan() {
        if let Some(i) = node.inputs.iter().find(|i| st(i).nan) {
            // An elementwise op maps each input NaN to at most out.len / in.len outputs
            // (broadcasting); more NaN than that means this op created some itself.
            let elementwise = matches!(
                node.op,
                crate::Op::Unary(_)
                    | crate::Op::Activation(_)
                    | crate::Op::Binary(_)
                    | crate::Op::Select
                    | crate::Op::Cast { .. }
            );
            let mut uniq = node.inputs.clone();
            uniq.sort();
            uniq.dedup();
            let carried: usize = uniq
                .iter()
                .map(|x| {
                    let s = st(x);
                    out.len
                        .checked_div(s.len)
                        .map_or(0, |r| s.nan_count * r.max(1))
                })
                .sum();
            // Same-length NaN inputs with known positions: the union bounds what is carried.
            let carried = if elementwise && out.nan <= carried {
                carried_nan_positions(g, id, out.len, states, nan_pos).map_or(carried, |u| u.len())
            } else {
                carried
            };
            if !elementwise || out.nan <= carried {
                return Cause::Propagated { input: *i };
            }
            return Cause::CreatedBesideInputNaN {
                input: *i,
                carried_at_most: carried,
            };
        }
    } else if let Some(i) = node.inputs.iter().find(|i| st(i).inf || st(i).nan) {
        // An Inf output from a non-finite input is carried, not created.
        return Cause::Propagated { input: *i };
    }
    let with_origin = node
        .inputs
        .iter()
        .find(|i| st(i).inf && st(i).inf_origin.is_some());
    if let Some(i) = with_origin.or_else(|| node.inputs.iter().find(|i| st(i).inf)) {
        // A literal constant holding inf is its own origin here.
        let origin = st(i).inf_origin.or(Some(*i));
        let input_kind = st(i).inf_kind.unwrap_or(BadKind::PosInf);
        let inf_origin_kind = origin
            .and_then(|o| st(&o).inf_kind)
            .filter(|&k| k != input_kind);
        return Cause::InputsHeldInf {
            input: *i,
            input_kind,
            inf_origin_kind,
            inf_source: origin.map(|o| {
                if o == *i && is_literal_constant(g, o) {
                    InfSource::Fill
                } else {
                    InfSource::classify(g, o, states)
                }
            }),
            inf_origin: origin,
            inf_origin_label: origin.map(|o| node_label(g, o)),
            inf_origin_op: origin
                .map(|o| source_op_type(g, o).map_or_else(|| display_op(g, o), str::to_string)),
        };
    }
    Cause::InputsFinite
}

/// Scanning ended the run early (`RLX_DEBUG_NANS=abort`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{report}\nrlx nan-check: aborting (RLX_DEBUG_NANS=abort)")]
pub struct NanAbort {
    pub report: Box<NanReport>,
}

/// The per-run NaN/Inf localizer that backends call after every op.
///
/// Usage by a backend's run loop:
/// ```ignore
/// let mut sc = DebugScanner::from_env("cpu");   // reads RLX_DEBUG_NANS once
/// if sc.is_on() { sc.begin_run(&graph); }
/// for node in plan { run(node); if sc.is_on() { sc.scan_node(&graph, id, &buf)?; } }
/// if sc.is_on() { sc.finish_run(&graph)?; }
/// ```
#[derive(Debug, Clone)]
pub struct DebugScanner {
    mode: DebugMode,
    backend: String,
    print: bool,
    states: Vec<NodeState>,
    counts: Vec<NonFiniteCounts>,
    reports: Vec<NanReport>,
    inf_origins: Vec<NodeId>,
    inf_into_nan: Vec<NodeId>,
    /// Inf origins whose Inf was absorbed destructively (reported by `check_destroyed`).
    destroyed: Vec<NodeId>,
    propagators: usize,
    summary: Option<String>,
    context: Option<String>,
    /// Do not print reports whose node is a graph input ([`DebugScanner::set_quiet_inputs`]).
    quiet_inputs: bool,
    /// Per node holding NaN, where (flat indices, ascending), when the backend gave the data
    /// ([`DebugScanner::note_nan_positions`]) and there are at most [`NAN_POSITIONS_MAX`].
    nan_pos: Vec<Option<Vec<u32>>>,
}

/// Most NaN positions a scanner keeps per node (4 M: 16 MB) to tell a NaN an elementwise op
/// created from one it carried, when its inputs hold NaN at the same places.
pub const NAN_POSITIONS_MAX: usize = 1 << 22;

/// The flat indices of `d`'s NaN elements, ascending (float types; `None` for others, for
/// more than [`NAN_POSITIONS_MAX`] of them, or for tensors over `u32::MAX` elements).
pub fn nan_positions(d: &TensorData) -> Option<Vec<u32>> {
    fn pos<T: Copy>(v: &[T], is_nan: impl Fn(T) -> bool) -> Option<Vec<u32>> {
        if v.len() > u32::MAX as usize {
            return None;
        }
        let mut out = vec![];
        for (i, &x) in v.iter().enumerate() {
            if is_nan(x) {
                if out.len() == NAN_POSITIONS_MAX {
                    return None;
                }
                out.push(i as u32);
            }
        }
        Some(out)
    }
    match d {
        TensorData::F32(v) => pos(v, f32::is_nan),
        TensorData::F64(v) => pos(v, f64::is_nan),
        TensorData::F16(v) => pos(v, |x: f16| x.is_nan()),
        TensorData::BF16(v) => pos(v, |x: bf16| x.is_nan()),
        _ => None,
    }
}

/// The NaN positions node `id`'s NaN-holding inputs carry (their union, ascending), when
/// every such input has the output's length `len` and known positions; `None` otherwise.
fn carried_nan_positions(
    g: &Graph,
    id: NodeId,
    len: usize,
    states: &[NodeState],
    nan_pos: &[Option<Vec<u32>>],
) -> Option<Vec<u32>> {
    let mut inputs = g.node(id).inputs.clone();
    inputs.sort();
    inputs.dedup();
    let mut all = vec![];
    for x in inputs {
        let st = states.get(x.index())?;
        if !st.nan {
            continue;
        }
        if st.len != len {
            return None;
        }
        all.extend_from_slice(nan_pos.get(x.index())?.as_deref()?);
    }
    all.sort_unstable();
    all.dedup();
    Some(all)
}

impl DebugScanner {
    /// A scanner in `mode` for `backend` (`"cpu"`, `"wgpu"`, ...). Reports are printed to
    /// stderr as they are found unless [`DebugScanner::set_print`] turns that off.
    pub fn new(mode: DebugMode, backend: &str) -> DebugScanner {
        DebugScanner {
            mode,
            backend: backend.to_string(),
            print: true,
            states: vec![],
            counts: vec![],
            reports: vec![],
            inf_origins: vec![],
            inf_into_nan: vec![],
            nan_pos: vec![],
            destroyed: vec![],
            propagators: 0,
            summary: None,
            context: None,
            quiet_inputs: false,
        }
    }

    /// Record but do not print reports whose node is a graph input ("the graph input already
    /// holds it"): for a part of a model run in parts whose inputs carry a value an earlier
    /// part already reported (a segment's tail, a Loop body's next iteration).
    pub fn set_quiet_inputs(&mut self, on: bool) {
        self.quiet_inputs = on;
    }

    /// Tag every report of the following runs with `context` (e.g. `decode step 37,
    /// position 52`), printed in parentheses after the node's label; `None` removes it.
    pub fn set_context(&mut self, context: Option<String>) {
        self.context = context;
    }

    /// A scanner configured by `RLX_DEBUG_NANS` (read once, here).
    pub fn from_env(backend: &str) -> DebugScanner {
        DebugScanner::new(DebugMode::from_env(), backend)
    }

    /// Every node's NaN/Inf counts from the last run (index = node index; default counts for
    /// a node not scanned).
    pub fn counts(&self) -> &[NonFiniteCounts] {
        &self.counts
    }

    pub fn mode(&self) -> DebugMode {
        self.mode
    }
    pub fn is_on(&self) -> bool {
        self.mode.is_on()
    }
    /// Print reports to stderr as they are found (default true).
    pub fn set_print(&mut self, on: bool) {
        self.print = on;
    }

    /// Reset per-run state for `g`.
    pub fn begin_run(&mut self, g: &Graph) {
        self.states = vec![NodeState::default(); g.len()];
        self.counts = vec![NonFiniteCounts::default(); g.len()];
        self.nan_pos = vec![None; g.len()];
        self.reports.clear();
        self.inf_origins.clear();
        self.inf_into_nan.clear();
        self.destroyed.clear();
        self.propagators = 0;
        self.summary = None;
    }

    /// Reports of the last run (culprits; propagators are only counted).
    pub fn reports(&self) -> &[NanReport] {
        &self.reports
    }

    /// The one summary line about absorbed Inf of the last run, if any.
    pub fn summary(&self) -> Option<&str> {
        self.summary.as_deref()
    }

    /// Nodes that created an Inf that was absorbed downstream (neither reached an output
    /// nor turned into NaN).
    pub fn absorbed_inf_origins(&self, g: &Graph) -> Vec<NodeId> {
        let reached: Vec<NodeId> = g
            .outputs
            .iter()
            .filter_map(|o| self.states.get(o.index()).and_then(|s| s.inf_origin))
            .collect();
        self.inf_origins
            .iter()
            .copied()
            .filter(|o| {
                !reached.contains(o)
                    && !self.inf_into_nan.contains(o)
                    && !self.destroyed.contains(o)
            })
            .collect()
    }

    /// The first NaN of elementwise node `id` at a place where none of its same-length inputs
    /// holds NaN, when every position list involved is known.
    fn first_new_nan(&self, g: &Graph, id: NodeId) -> Option<usize> {
        let out = self.nan_pos.get(id.index())?.as_deref()?;
        let len = self.states.get(id.index())?.len;
        let carried = carried_nan_positions(g, id, len, &self.states, &self.nan_pos)?;
        out.iter()
            .find(|p| carried.binary_search(p).is_err())
            .map(|&p| p as usize)
    }

    fn make_report(
        &self,
        g: &Graph,
        id: NodeId,
        kind: BadKind,
        cause: Cause,
        note: Option<String>,
    ) -> NanReport {
        let node = g.node(id);
        let c = self.counts[id.index()];
        let index = match kind {
            // A NaN made beside carried ones: the first the op made, where positions are known.
            BadKind::NaN if matches!(cause, Cause::CreatedBesideInputNaN { .. }) => {
                self.first_new_nan(g, id).or(c.first_nan)
            }
            BadKind::NaN => c.first_nan,
            BadKind::PosInf => c.first_pos_inf,
            BadKind::NegInf => c.first_neg_inf,
        }
        .unwrap_or(0);
        let op = display_op(g, id);
        let src = source_op_type(g, id).map(str::to_string);
        // A sampler's temperature division gets its own line before the op's generic one.
        let fix = crate::sampling::sampler_fix(g, id, &cause)
            .or_else(|| fix_hint(&op, src.as_deref(), &cause, kind, node.shape.dtype));
        let r_cause_origin = match &cause {
            Cause::InputsHeldInf { inf_origin, .. } => *inf_origin,
            _ => None,
        };
        NanReport {
            backend: self.backend.clone(),
            node: id,
            label: node_label(g, id),
            source_op: src.filter(|s| !s.eq_ignore_ascii_case(&op)),
            op,
            kind,
            index,
            dims: node.shape.dims_usize().to_vec(),
            dtype: node.shape.dtype,
            counts: c,
            cause,
            fix,
            note,
            source: node.origin.as_ref().and_then(|o| o.source.clone()),
            inf_origin_source: match &r_cause_origin {
                Some(o) => g.node(*o).origin.as_ref().and_then(|x| x.source.clone()),
                None => None,
            },
            context: self.context.clone(),
            iteration: node_iteration(g, id).to_vec(),
            inf_origin_iteration: r_cause_origin
                .map(|o| node_iteration(g, o).to_vec())
                .unwrap_or_default(),
        }
    }

    fn emit(&mut self, r: NanReport) {
        if self.print && !(self.quiet_inputs && r.op == "Input") {
            eprintln!("{r}");
        }
        self.reports.push(r);
    }

    /// Scan node `id`'s output buffer `data` (call right after the op ran).
    /// Errors only in abort mode, at the first NaN created.
    pub fn scan_node(&mut self, g: &Graph, id: NodeId, data: &TensorData) -> Result<(), NanAbort> {
        let c = scan_data(data);
        if c.has_nan() {
            self.note_nan_positions(g, id, data);
        }
        self.scan_counts(g, id, c)
    }

    /// Record where node `id`'s output `data` holds NaN (call before
    /// [`DebugScanner::scan_counts`], only for outputs with NaN; [`DebugScanner::scan_node`]
    /// does). With the positions of an elementwise op's inputs, a NaN it makes where an input
    /// already holds one elsewhere is told apart from the carried ones: `x · sigmoid(x)` with
    /// NaN at one place of `x` (so of both operands) and `-inf · 0` at another.
    pub fn note_nan_positions(&mut self, g: &Graph, id: NodeId, data: &TensorData) {
        if self.states.len() != g.len() {
            self.begin_run(g);
        }
        if let Some(slot) = self.nan_pos.get_mut(id.index()) {
            *slot = nan_positions(data);
        }
    }

    /// Like [`DebugScanner::scan_node`] for backends that counted on the device.
    pub fn scan_counts(
        &mut self,
        g: &Graph,
        id: NodeId,
        c: NonFiniteCounts,
    ) -> Result<(), NanAbort> {
        if self.states.len() != g.len() {
            self.begin_run(g);
        }
        let i = id.index();
        self.counts[i] = c;
        self.states[i].scanned = true;
        if c.is_clean() {
            return self.check_destroyed(g, id, &c);
        }
        let cause = check_node_at(g, id, &c, &self.states, &self.nan_pos);
        let node_inputs = g.node(id).inputs.clone();
        let mut st = NodeState {
            scanned: true,
            nan: c.has_nan(),
            inf: c.has_inf(),
            inf_kind: c.first_inf().map(|x| x.1),
            inf_origin: None,
            nan_count: c.nan,
            len: c.len,
        };
        if c.has_inf() {
            // Inherit the origin of an Inf-carrying input, else this node creates it.
            st.inf_origin = if is_literal_constant(g, id) {
                None // counts as part of the op that consumes it
            } else {
                node_inputs
                    .iter()
                    .find_map(|x| {
                        let s = self.states[x.index()];
                        if s.inf {
                            s.inf_origin
                        } else {
                            None
                        }
                    })
                    .or(Some(id))
            };
            if st.inf_origin == Some(id) {
                self.inf_origins.push(id);
            }
        }
        self.states[i] = st;
        let mut result = Ok(());
        if c.has_nan() {
            match &cause {
                Cause::Propagated { .. } => self.propagators += 1,
                _ => {
                    if let Cause::InputsHeldInf {
                        inf_origin: Some(o),
                        ..
                    } = &cause
                    {
                        self.inf_into_nan.push(*o);
                    }
                    let r = self.make_report(g, id, BadKind::NaN, cause.clone(), None);
                    if self.mode == DebugMode::Abort {
                        result = Err(NanAbort {
                            report: Box::new(r.clone()),
                        });
                    }
                    self.emit(r);
                }
            }
        }
        if self.mode == DebugMode::Strict && st.inf_origin == Some(id) {
            let kind = c.first_inf().map(|x| x.1).unwrap_or(BadKind::PosInf);
            let cause = creation_cause(g, id, &self.states);
            let r = self.make_report(
                g,
                id,
                kind,
                cause,
                Some("strict mode: reported where it first appears".into()),
            );
            self.emit(r);
        }
        result
    }

    /// A clean output of an op that divides by an input holding ±inf made by an overflow of
    /// finite values (`x / inf`, `1 / inf`, `rsqrt(inf)`, `inf ^ -p`): the quotient is 0 where
    /// the math's value is finite, so data was silently zeroed (a spiky token whose square
    /// overflows in an RMSNorm: the whole row becomes 0). Reported at the op that overflowed,
    /// naming the op that zeroed the data. Intended infinities (fills, `log(0)`) and Inf
    /// absorbed by ops that keep data (`exp(-inf) = 0` in a softmax, `Where`, `Min`/`Max`)
    /// are not reported here.
    fn check_destroyed(
        &mut self,
        g: &Graph,
        id: NodeId,
        out: &NonFiniteCounts,
    ) -> Result<(), NanAbort> {
        use crate::op::{BinaryOp as B, UnaryOp as U};
        use crate::Op;
        let node = g.node(id);
        let divisor = match &node.op {
            Op::Binary(B::Div) => node.inputs.get(1),
            Op::Unary(U::Reciprocal | U::Rsqrt) => node.inputs.first(),
            Op::Binary(B::Pow) => {
                let neg = node.inputs.get(1).is_some_and(|e| match &g.node(*e).op {
                    Op::Constant(t) => {
                        let v = t.data().to_f64_vec();
                        !v.is_empty() && v.iter().all(|&p| p < 0.0)
                    }
                    _ => false,
                });
                if neg {
                    node.inputs.first()
                } else {
                    None
                }
            }
            _ => None,
        };
        let Some(&d) = divisor else { return Ok(()) };
        let st = self.states[d.index()];
        let Some(origin) = st.inf_origin.filter(|_| st.inf) else {
            return Ok(());
        };
        if self.destroyed.contains(&origin)
            || InfSource::classify(g, origin, &self.states) != InfSource::Overflow
        {
            return Ok(());
        }
        self.destroyed.push(origin);
        let dc = self.counts[d.index()];
        let infs = dc.pos_inf + dc.neg_inf;
        let zeroed = out
            .len
            .checked_div(dc.len)
            .map_or(infs, |r| (infs * r.max(1)).min(out.len));
        let kind = self.states[origin.index()]
            .inf_kind
            .unwrap_or(BadKind::PosInf);
        let cause = creation_cause(g, origin, &self.states);
        let dims = node.shape.dims_usize();
        let per_row = dims.last().copied().unwrap_or(1).max(1);
        let rows = if zeroed >= per_row && zeroed.is_multiple_of(per_row) {
            format!(" ({} row(s) of {per_row})", zeroed / per_row)
        } else {
            String::new()
        };
        let note = format!(
            "this {kind} (an overflow of finite values) was absorbed destructively at {id} {} {}: dividing by it gave 0 in {zeroed} of {} element(s){rows} where the values are finite in exact math; the output looks finite but those values are lost",
            display_op(g, id),
            quoted_label(g, id),
            out.len
        );
        let mut r = self.make_report(g, origin, kind, cause, Some(note));
        if r.fix.is_none() {
            r.fix = Some(format!(
                "the op overflowed {}'s range with finite inputs: compute it in a wider dtype (f32, or f64 for the statistics) or scale its inputs down (e.g. mean((x/s)^2) * s^2 with s = max|x|)",
                r.dtype
            ));
        }
        let res = if self.mode == DebugMode::Abort {
            Err(NanAbort {
                report: Box::new(r.clone()),
            })
        } else {
            Ok(())
        };
        self.emit(r);
        res
    }

    /// End-of-run checks: report the origin of every Inf that reached a graph output,
    /// and print one summary line for Inf absorbed downstream. In abort mode, errors when
    /// an Inf reached an output.
    pub fn finish_run(&mut self, g: &Graph) -> Result<(), NanAbort> {
        let mut first_err = None;
        let mut reported = vec![];
        for (k, o) in g.outputs.iter().enumerate() {
            let s = self.states.get(o.index()).copied().unwrap_or_default();
            let Some(origin) = s.inf_origin else { continue };
            // Skipped when a NaN report already named this origin (its Inf became NaN, or it
            // made NaN itself: log of [0, -1]); an output that also carries an unrelated NaN
            // (an input's) still gets its Inf named.
            let named = self.inf_into_nan.contains(&origin)
                || self.reports.iter().any(|r| r.node == origin);
            // The origin is the first Inf-carrying input's; with several, the Inf that reached
            // the output may be another's. Beside a NaN, report only an origin holding an Inf
            // of the sign that reached the output (else the attribution is a guess).
            let oc = self.counts[origin.index()];
            let sign_held = match s.inf_kind {
                Some(BadKind::PosInf) => oc.pos_inf > 0,
                Some(BadKind::NegInf) => oc.neg_inf > 0,
                _ => false,
            };
            if reported.contains(&origin) || (s.nan && (named || !sign_held)) {
                continue;
            }
            reported.push(origin);
            let oname = g
                .output_names
                .get(k)
                .cloned()
                .unwrap_or_else(|| o.to_string());
            // The sign that reached the output, when the origin holds an Inf of that sign
            // (a Relu after it can clamp the origin's first -inf and keep a +inf).
            let kind = match s.inf_kind {
                Some(BadKind::PosInf) if oc.pos_inf > 0 => BadKind::PosInf,
                Some(BadKind::NegInf) if oc.neg_inf > 0 => BadKind::NegInf,
                _ => self.states[origin.index()]
                    .inf_kind
                    .unwrap_or(BadKind::PosInf),
            };
            if self.mode == DebugMode::Strict {
                continue; // already reported at creation
            }
            let cause = creation_cause(g, origin, &self.states);
            let r = self.make_report(
                g,
                origin,
                kind,
                cause,
                Some(format!("this {kind} reached graph output #{k} \"{oname}\"")),
            );
            if self.mode == DebugMode::Abort && first_err.is_none() {
                first_err = Some(NanAbort {
                    report: Box::new(r.clone()),
                });
            }
            self.emit(r);
        }
        let absorbed = self.absorbed_inf_origins(g);
        if let Some(first) = absorbed.first() {
            // Strict mode reported each of them where it appeared; the other modes did not.
            let tail = if self.mode == DebugMode::Strict {
                "each reported above where it appeared"
            } else {
                "not reported (RLX_DEBUG_NANS=strict reports it)"
            };
            let line = format!(
                "rlx nan-check: note: {} op(s) created ±inf that was absorbed downstream (first: {} {} {}); {tail}",
                absorbed.len(),
                first,
                g.node(*first).op.name(),
                quoted_label(g, *first)
            );
            if self.print && self.mode == DebugMode::Warn {
                eprintln!("{line}");
            }
            self.summary = Some(line);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Number of nodes that only carried a NaN from upstream in the last run.
    pub fn propagator_count(&self) -> usize {
        self.propagators
    }
}
