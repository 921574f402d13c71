//! The intermediate-value printer (`RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER`) and the per-op
//! statistics it prints, which `rlx trace` also records.
//!
//! Levels (the AOTInductor switch of the same name, issue 5 item 2):
//! * `1`: after each op, one line on stderr:
//!   `rlx print: %12 MatMul "layer0.q" f32[2, 4, 8] min=-1.25 max=3.5 mean=0.125 max|x|=3.5 nan=0 +inf=0 -inf=0`
//! * `2`: the same line followed by the values, NumPy-style: the first and last 3 when there
//!   are more than 6 (`[0.1, 0.2, 0.3, ..., 0.7, 0.8, 0.9]`);
//! * `3`: before each op runs, `rlx print: running %12 MatMul "layer0.q"` (flushed), then the
//!   level-1 line after it, so the last line printed names the op in which a crash happened.
//!
//! What is printed: graph inputs and every computed op. Parameters and constants are not
//! (they are the same on every run; an imported model has thousands), nor a Transpose of one
//! (a linear's `x @ Wᵀ` reads its weight through one, in place: `const_fold` keeps it).
//! `RLX_FILTERED_OPS_TO_PRINT=pat1,pat2` keeps only nodes whose label, op name or `%id`
//! matches one of the glob patterns (`*` any run of characters, `?` one character). A pattern
//! also matches every node inside the module it names ([`label_matches`]): with the module
//! paths of a checkpoint (`rlx generate`), `model.layers.1.mlp` selects
//! `model.layers.1.mlp`, `model.layers.1.mlp.down_proj`, `model.layers.1.mlp.act_fn`, ... and
//! not `model.layers.10.mlp`.
//!
//! A run with a context ([`PrinterConfig::context`], set from
//! `CompiledGraph::set_report_context`: `prefill`, `decode step 3, position 12`) prints it
//! after the label, as NaN reports do: `rlx print: %40 MatMul "lm_head" (decode step 3,
//! position 12) f32[1, 384] ...`.
//!
//! Statistics are computed in f64 over the finite elements; integer min/max are exact (i128).

use rlx_cpu::{CpuError, CpuExecutor};
use rlx_ir::numeric_check::DebugScanner;
use rlx_ir::provenance::node_label;
use rlx_ir::{DType, Graph, NodeId, Op, Tensor, TensorData};
use std::fmt::Write as _;
use std::io::Write as _;

/// The variable holding the printer level.
pub const RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER: &str = "RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER";
/// The variable holding the printer's node filter.
pub const RLX_FILTERED_OPS_TO_PRINT: &str = "RLX_FILTERED_OPS_TO_PRINT";

/// Min, max, mean, max|x| and non-finite counts of one tensor.
///
/// `min`, `max`, `mean`, `max_abs` are over the finite elements (`None` when there are none);
/// for integer dtypes `min`/`max` are exact (held as i128) and `mean` is f64.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorStats {
    pub numel: usize,
    pub min: Option<Num>,
    pub max: Option<Num>,
    pub mean: Option<f64>,
    pub max_abs: Option<f64>,
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
}

/// A min/max value: exact for integer dtypes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => f.write_str(&fmt_f64(*x)),
        }
    }
}

/// Compact float formatting: `%.6g`-like (`0.125`, `-1.5e-07`, `65504`).
pub fn fmt_f64(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if (1e-4..1e6).contains(&a) {
        // 6 significant digits, trailing zeros dropped.
        let digits = a.log10().floor() as i32 + 1;
        let p = (6 - digits).max(0) as usize;
        let s = format!("{x:.p$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        let s = format!("{x:.5e}");
        // 1.50000e-7 -> 1.5e-07
        match s.split_once('e') {
            Some((m, e)) => {
                let m = if m.contains('.') {
                    m.trim_end_matches('0').trim_end_matches('.')
                } else {
                    m
                };
                let e: i32 = e.parse().unwrap_or(0);
                format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
            }
            None => s,
        }
    }
}

impl TensorStats {
    /// The statistics of `t` (any dtype; bool counts as 0/1; narrow types are decoded).
    pub fn of(t: &Tensor) -> TensorStats {
        Self::of_data(t.data())
    }

    /// The statistics of a buffer.
    pub fn of_data(d: &TensorData) -> TensorStats {
        let n = d.len();
        let mut s = TensorStats {
            numel: n,
            min: None,
            max: None,
            mean: None,
            max_abs: None,
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
        };
        if n == 0 {
            return s;
        }
        if d.dtype().is_float() {
            let (mut lo, mut hi, mut sum, mut amax, mut k) =
                (f64::INFINITY, f64::NEG_INFINITY, 0.0f64, 0.0f64, 0usize);
            let mut take = |x: f64| {
                if x.is_finite() {
                    lo = lo.min(x);
                    hi = hi.max(x);
                    sum += x;
                    amax = amax.max(x.abs());
                    k += 1;
                } else if x.is_nan() {
                    s.nan += 1;
                } else if x > 0.0 {
                    s.pos_inf += 1;
                } else {
                    s.neg_inf += 1;
                }
            };
            match d {
                TensorData::F32(v) => v.iter().for_each(|&x| take(x as f64)),
                TensorData::F16(v) => v.iter().for_each(|&x| take(x.to_f64())),
                TensorData::BF16(v) => v.iter().for_each(|&x| take(x.to_f64())),
                TensorData::F64(v) => v.iter().for_each(|&x| take(x)),
                _ => (0..n).for_each(|i| take(d.get_f64(i))),
            }
            if k > 0 {
                s.min = Some(Num::Float(lo));
                s.max = Some(Num::Float(hi));
                s.mean = Some(sum / k as f64);
                s.max_abs = Some(amax);
            }
        } else {
            let (mut lo, mut hi, mut sum) = (i128::MAX, i128::MIN, 0f64);
            for i in 0..n {
                let x = d.get_i128(i);
                lo = lo.min(x);
                hi = hi.max(x);
                sum += x as f64;
            }
            s.min = Some(Num::Int(lo));
            s.max = Some(Num::Int(hi));
            s.mean = Some(sum / n as f64);
            s.max_abs = Some(lo.unsigned_abs().max(hi.unsigned_abs()) as f64);
        }
        s
    }

    /// True when every element is finite.
    pub fn is_finite(&self) -> bool {
        self.nan + self.pos_inf + self.neg_inf == 0
    }
}

impl std::fmt::Display for TensorStats {
    /// `min=.. max=.. mean=.. max|x|=.. nan=N +inf=N -inf=N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.min, self.max, self.mean, self.max_abs) {
            (Some(lo), Some(hi), Some(m), Some(a)) => write!(
                f,
                "min={lo} max={hi} mean={} max|x|={}",
                fmt_f64(m),
                fmt_f64(a)
            )?,
            _ if self.numel == 0 => f.write_str("empty")?,
            _ => f.write_str("no finite values")?,
        }
        write!(
            f,
            " nan={} +inf={} -inf={}",
            self.nan, self.pos_inf, self.neg_inf
        )
    }
}

/// Values NumPy-style: all of them when there are at most `2 * edge`, else the first and
/// last `edge` around `...`. Integers print exactly.
pub fn format_values(d: &TensorData, edge: usize) -> String {
    let n = d.len();
    let float = d.dtype().is_float();
    let elem = |i: usize| {
        if float {
            fmt_f64(d.get_f64(i))
        } else if d.dtype() == DType::Bool {
            (d.get_i64(i) != 0).to_string()
        } else {
            d.get_i128(i).to_string()
        }
    };
    let mut parts: Vec<String> = vec![];
    if n <= 2 * edge {
        parts.extend((0..n).map(elem));
    } else {
        parts.extend((0..edge).map(elem));
        parts.push("...".into());
        parts.extend((n - edge..n).map(elem));
    }
    format!("[{}]", parts.join(", "))
}

/// `*` matches any run of characters (including none), `?` exactly one; everything else
/// literally. Case-sensitive.
pub fn glob_match(pat: &str, s: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = s.chars().collect();
    // Iterative wildcard match with backtracking to the last `*` (linear-ish, no recursion).
    let (mut i, mut j) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == '*' {
        i += 1;
    }
    i == p.len()
}

/// Whether glob `pat` matches the node label `label` or a module that contains it: `label`
/// itself, or any prefix of it that ends just before a `.` or `/` (the module paths
/// `model.layers.1.mlp` and `model.layers.1` of `model.layers.1.mlp.down_proj`; the scopes
/// `/encoder` and `/encoder/layer.0` of an ONNX exporter's `/encoder/layer.0/attention/MatMul`;
/// `layers.0.mlp` of a torch.export label `layers.0.mlp/linear_2`). So `model.layers.1.mlp`
/// selects that module and everything in it but not `model.layers.10.mlp`, and
/// `model.layers.?.mlp` every layer's MLP. Case-sensitive, as [`glob_match`].
pub fn label_matches(pat: &str, label: &str) -> bool {
    if glob_match(pat, label) {
        return true;
    }
    label
        .char_indices()
        .filter(|&(i, c)| i > 0 && (c == '.' || c == '/'))
        .any(|(i, _)| glob_match(pat, &label[..i]))
}

/// What the printer prints (see the module docs for the levels).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrinterConfig {
    /// 0 off, 1 stats, 2 stats and values, 3 op name before it runs plus stats after.
    pub level: u8,
    /// Glob patterns; empty prints every node.
    pub filters: Vec<String>,
    /// Printed after each node's label in parentheses (`decode step 3, position 12`), `None`
    /// for nothing. `CompiledGraph` sets it from its report context for each run.
    pub context: Option<String>,
}

impl PrinterConfig {
    /// A printer at `level` (clamped to 3) with no filter.
    pub fn new(level: u8) -> PrinterConfig {
        PrinterConfig {
            level: level.min(3),
            filters: vec![],
            context: None,
        }
    }

    /// The printer switched off (overrides the environment).
    pub fn off() -> PrinterConfig {
        PrinterConfig::default()
    }

    /// Keep only nodes matching one of `filters` (comma-separated globs accepted).
    pub fn with_filters<S: AsRef<str>>(mut self, filters: &[S]) -> PrinterConfig {
        self.filters = filters
            .iter()
            .flat_map(|f| f.as_ref().split(','))
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect();
        self
    }

    /// Parse the two variables' values (`None` = unset). Levels: unset, empty or `0` off;
    /// `1`, `2`, `3`; any other value (e.g. `true`) means 1; numbers above 3 mean 3.
    pub fn parse(level: Option<&str>, filters: Option<&str>) -> PrinterConfig {
        let level = match level.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "0" | "false" | "off" | "no") => 0,
            Some(v) => match v.parse::<u64>() {
                Ok(n @ 1..=3) => n as u8,
                _ => {
                    eprintln!(
                        "rlx: note: {RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER}={v:?} is not 0, 1, 2 or 3: printing at level {}",
                        if v.parse::<u64>().is_ok() { 3 } else { 1 }
                    );
                    if v.parse::<u64>().is_ok() {
                        3
                    } else {
                        1
                    }
                }
            },
        };
        PrinterConfig::new(level).with_filters(&[filters.unwrap_or("")])
    }

    /// Read `RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER` and `RLX_FILTERED_OPS_TO_PRINT` (once).
    pub fn from_env() -> PrinterConfig {
        PrinterConfig::parse(
            rlx_ir::env::get(RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER).as_deref(),
            rlx_ir::env::get(RLX_FILTERED_OPS_TO_PRINT).as_deref(),
        )
    }

    /// The same printer with `context` printed after every label (`None`: nothing).
    pub fn with_context(mut self, context: Option<String>) -> PrinterConfig {
        self.context = context;
        self
    }

    pub fn is_on(&self) -> bool {
        self.level > 0
    }

    /// `"label"`, then ` (iteration …)` for a node of an unrolled loop
    /// ([`rlx_ir::provenance::quoted_label`]), then ` (context)` when the run has one.
    fn label_str(&self, g: &Graph, id: NodeId) -> String {
        let q = rlx_ir::provenance::quoted_label(g, id);
        match &self.context {
            Some(c) => format!("{q} ({c})"),
            None => q,
        }
    }

    /// Whether node `id` of `g` is printed: graph inputs and computed ops (not params,
    /// constants, or a Transpose of one) whose label (or a module containing it, [`label_matches`]), op name or
    /// `%id` matches a filter (any node when no filter).
    pub fn selects(&self, g: &Graph, id: NodeId) -> bool {
        let node = g.node(id);
        let fixed = |op: &Op| matches!(op, Op::Param { .. } | Op::Constant(_));
        if fixed(&node.op)
            || (matches!(node.op, Op::Transpose { .. }) && fixed(&g.node(node.inputs[0]).op))
        {
            return false;
        }
        if self.filters.is_empty() {
            return true;
        }
        let label = node_label(g, id);
        let op = node.op.name();
        let pid = id.to_string();
        self.filters
            .iter()
            .any(|p| label_matches(p, &label) || glob_match(p, &op) || glob_match(p, &pid))
    }

    /// The line printed before node `id` runs (level 3), or `None`.
    pub fn line_before(&self, g: &Graph, id: NodeId) -> Option<String> {
        (self.level >= 3 && self.selects(g, id)).then(|| {
            format!(
                "rlx print: running {id} {} {}",
                g.node(id).op.name(),
                self.label_str(g, id)
            )
        })
    }

    /// The line(s) printed after node `id` produced `t` (no trailing newline), or `None`.
    pub fn line_after(&self, g: &Graph, id: NodeId, t: &Tensor) -> Option<String> {
        if self.level == 0 || !self.selects(g, id) {
            return None;
        }
        let node = g.node(id);
        let mut s = format!(
            "rlx print: {id} {} {} {} {}",
            node.op.name(),
            self.label_str(g, id),
            t.shape(),
            TensorStats::of(t)
        );
        if let Some(loc) = rlx_ir::provenance::source_location(g, id) {
            let _ = write!(s, "\n  at {loc}");
        }
        if self.level == 2 {
            let _ = write!(s, "\n  values: {}", format_values(t.data(), 3));
        }
        Some(s)
    }
}

/// Run `exec`, printing per `cfg` to stderr (the plain [`CpuExecutor::run`] path when off).
/// Level 3's line is flushed before the op runs.
pub(crate) fn run_cpu<I: std::borrow::Borrow<Tensor> + Sync>(
    exec: &mut CpuExecutor,
    inputs: &[I],
    scanner: Option<&mut DebugScanner>,
    cfg: &PrinterConfig,
) -> Result<Vec<Tensor>, CpuError> {
    if !cfg.is_on() {
        return exec.run_hooked(inputs, scanner, None, None);
    }
    let g = exec.graph().clone();
    let mut before = |id: NodeId| {
        if let Some(l) = cfg.line_before(&g, id) {
            let mut e = std::io::stderr().lock();
            let _ = writeln!(e, "{l}");
            let _ = e.flush();
        }
    };
    let mut printed = 0usize;
    let mut observe = |id: NodeId, t: &Tensor| {
        if let Some(l) = cfg.line_after(&g, id, t) {
            printed += 1;
            let _ = writeln!(std::io::stderr().lock(), "{l}");
        }
    };
    let before: Option<&mut dyn FnMut(NodeId)> = if cfg.level >= 3 {
        Some(&mut before)
    } else {
        None
    };
    let r = exec.run_hooked(inputs, scanner, before, Some(&mut observe));
    if printed == 0 && r.is_ok() {
        eprintln!(
            "rlx: note: {RLX_FILTERED_OPS_TO_PRINT} matched no op (patterns are case-sensitive globs with * and ?, matched against the label or a module containing it, the op name and %id)"
        );
    }
    r
}

/// Print per `cfg` from every node's value after a whole run (`all[k]` is node `k`'s value):
/// the printer of a backend that runs the graph on its device and reads values back. With
/// `running_lines`, level 3's `running` line precedes each node's statistics (the run is over
/// by then; the backend's own error names a node that failed); without, the backend printed
/// them before each launch.
#[cfg_attr(not(any(feature = "gpu", feature = "cuda")), allow(dead_code))]
pub(crate) fn print_values(
    g: &Graph,
    all: &[Option<Tensor>],
    cfg: &PrinterConfig,
    running_lines: bool,
) {
    if !cfg.is_on() {
        return;
    }
    let mut printed = 0usize;
    let mut e = std::io::stderr().lock();
    for n in &g.nodes {
        let Some(t) = &all[n.id.index()] else {
            continue;
        };
        if let Some(l) = cfg.line_after(g, n.id, t) {
            if let Some(b) = cfg.line_before(g, n.id).filter(|_| running_lines) {
                let _ = writeln!(e, "{b}");
            }
            printed += 1;
            let _ = writeln!(e, "{l}");
        }
    }
    if printed == 0 {
        let _ = writeln!(
            e,
            "rlx: note: {RLX_FILTERED_OPS_TO_PRINT} matched no op (patterns are case-sensitive globs with * and ?, matched against the label or a module containing it, the op name and %id)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("*", ""));
        assert!(glob_match("layer?.attn.*", "layer0.attn.softmax"));
        assert!(!glob_match("layer?.attn.*", "layer10.attn.softmax"));
        assert!(glob_match("%1?", "%12"));
        assert!(!glob_match("%1?", "%1"));
        assert!(glob_match("*soft*", "layer0.attn.softmax"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("MatMul", "MatMul"));
    }

    #[test]
    fn module_paths() {
        let l = "model.layers.1.mlp.down_proj";
        assert!(label_matches("model.layers.1.mlp", l));
        assert!(label_matches("model.layers.1.mlp", "model.layers.1.mlp"));
        assert!(label_matches("model.layers.1", l));
        assert!(label_matches("model.layers.1.mlp.*", l));
        assert!(label_matches("model.layers.?.mlp", l));
        assert!(!label_matches(
            "model.layers.1",
            "model.layers.10.mlp.down_proj"
        ));
        assert!(!label_matches("model.layers.1.ml", l));
        assert!(!label_matches("mlp", l), "a prefix, not any segment");
        assert!(label_matches(
            "/encoder/layer.0",
            "/encoder/layer.0/attention/MatMul"
        ));
        assert!(label_matches("layers.0.mlp", "layers.0.mlp/linear_2"));
        assert!(!label_matches("", "/x"));
    }

    #[test]
    fn floats() {
        assert_eq!(fmt_f64(0.125), "0.125");
        assert_eq!(fmt_f64(65504.0), "65504");
        assert_eq!(fmt_f64(-1.5e-7), "-1.5e-07");
        assert_eq!(fmt_f64(1e10), "1e+10");
        assert_eq!(fmt_f64(3.0), "3");
        assert_eq!(fmt_f64(1.0 / 3.0), "0.333333");
        assert_eq!(fmt_f64(123.456789), "123.457");
    }

    #[test]
    fn parse_levels() {
        assert_eq!(PrinterConfig::parse(None, None).level, 0);
        assert_eq!(PrinterConfig::parse(Some(" 0 "), None).level, 0);
        assert_eq!(PrinterConfig::parse(Some("2"), None).level, 2);
        assert_eq!(PrinterConfig::parse(Some("9"), None).level, 3);
        assert_eq!(PrinterConfig::parse(Some("yes"), None).level, 1);
        assert_eq!(
            PrinterConfig::parse(Some("1"), Some("a*, %3,")).filters,
            vec!["a*".to_string(), "%3".to_string()]
        );
    }
}
