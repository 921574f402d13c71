//! `rlx trace`: run a model once on the CPU, record per-op statistics (the intermediate-value
//! printer's: min, max, mean, max|x|, NaN/+inf/-inf counts) in execution order, and write them
//! as `trace.json` and a self-contained `trace.html` (inline SVG, no network): max|x| on a log
//! scale per op, NaN/Inf counts per op, the first non-finite op marked and named, and for
//! float16/bfloat16 models the dtype's overflow line (65504 / ~3.39e38).
//!
//! Recorded nodes: graph inputs and every computed op (parameters and constants are not), in
//! the order the CPU executor runs them.

use crate::diverge_html::{esc, quoted_html};
use crate::load::{load, ModelArgs};
use anyhow::{anyhow, Result};
use clap::Args;
use rlx_ir::provenance::{node_label, source_op_type};
use rlx_ir::{DType, Graph, NodeId, Op, Tensor};
use rlx_runtime::printer::{fmt_f64, Num, PrinterConfig, TensorStats};
use rlx_runtime::{Device, Session};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Record per-op value statistics of one run and write trace.json and trace.html.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Folder for trace.json and trace.html (created if missing).
    #[arg(long, short = 'o', value_name = "DIR", default_value = "rlx-trace")]
    pub output_dir: PathBuf,
}

/// One recorded op.
#[derive(Debug, Clone)]
pub struct TraceOp {
    /// Position in execution order (0-based, over recorded nodes only).
    pub index: usize,
    pub id: NodeId,
    /// The IR op name (`MatMul`, `Sub`, ...).
    pub op: String,
    /// `node_label`: the model's node name.
    pub label: String,
    /// The source (ONNX) op type when the op is a step of a decomposed op.
    pub source_op: Option<String>,
    /// `file.py:LINE  code` of the user's line that created the op (`torch.export`).
    pub at: Option<String>,
    /// The loop iterations the op was unrolled in, outermost first (empty outside loops;
    /// [`rlx_ir::Origin::iteration`]).
    pub iteration: Vec<rlx_ir::LoopIteration>,
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub stats: TensorStats,
}

impl TraceOp {
    /// The label quoted, then its loop iteration when it has one:
    /// `"body/Sqrt" (iteration 3 of Loop "loop")` ([`rlx_ir::provenance::with_iteration`]).
    pub fn quoted(&self) -> String {
        rlx_ir::provenance::with_iteration(&self.label, &self.iteration)
    }

    /// `iteration 3 of Loop "loop"`, or `None` outside loops.
    pub fn iteration_text(&self) -> Option<String> {
        rlx_ir::graph::iteration_text(&self.iteration)
    }
}

/// A run's trace: ops in execution order, plus the error that stopped the run, if any.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub model: String,
    /// Which run of a generation this is (`prefill`, `decode step 3, position 12`;
    /// `rlx generate --trace`), `None` for a model's one run.
    pub context: Option<String>,
    /// The device the run was made on (`cpu` when empty).
    pub device: String,
    pub ops: Vec<TraceOp>,
    pub error: Option<String>,
}

/// The largest finite value of a float dtype whose overflow line the report draws.
pub fn overflow_limit(dt: DType) -> Option<f64> {
    match dt {
        DType::F16 => Some(65504.0),
        DType::BF16 => Some(half::bf16::MAX.to_f64()),
        _ => None,
    }
}

impl Trace {
    /// Record one node's value (skips parameters and constants, except a weight that holds
    /// NaN/Inf as data, [`rlx_ir::numeric_check::is_bad_weight`]: it is recorded as an
    /// `Initializer` op, so the first non-finite value is the weight, as nan-check says).
    pub fn record(&mut self, g: &Graph, id: NodeId, t: &Tensor) {
        let n = g.node(id);
        let bad_weight = rlx_ir::numeric_check::is_bad_weight(g, id);
        if matches!(n.op, Op::Param { .. } | Op::Constant(_)) && !bad_weight {
            return;
        }
        self.ops.push(TraceOp {
            index: self.ops.len(),
            id,
            op: if bad_weight {
                "Initializer".to_string()
            } else {
                n.op.name().to_string()
            },
            label: node_label(g, id),
            source_op: source_op_type(g, id).map(str::to_string),
            at: rlx_ir::provenance::source_location(g, id).map(|l| l.to_string()),
            iteration: rlx_ir::provenance::node_iteration(g, id).to_vec(),
            dims: t.dims().to_vec(),
            dtype: t.dtype(),
            stats: TensorStats::of(t),
        });
    }

    /// [`Trace::device`], `cpu` when empty.
    pub fn device_name(&self) -> &str {
        if self.device.is_empty() {
            "cpu"
        } else {
            &self.device
        }
    }

    /// The first op (in execution order) whose value holds NaN or Inf.
    ///
    /// (An op of an unrolled loop is named with its iteration: [`TraceOp::quoted`].)
    pub fn first_nonfinite(&self) -> Option<&TraceOp> {
        self.ops.iter().find(|o| !o.stats.is_finite())
    }

    /// Half-precision dtypes present, with their overflow limit (f16 first).
    pub fn overflow_lines(&self) -> Vec<(DType, f64)> {
        [DType::F16, DType::BF16]
            .into_iter()
            .filter(|d| self.ops.iter().any(|o| o.dtype == *d))
            .filter_map(|d| overflow_limit(d).map(|l| (d, l)))
            .collect()
    }

    /// The trace as JSON (format documented in docs/DEBUGGING.md).
    pub fn to_json(&self) -> Value {
        let num = |n: Option<Num>| match n {
            Some(Num::Int(i)) => json!(i as i64),
            Some(Num::Float(f)) => json!(f),
            None => Value::Null,
        };
        // An op of an unrolled loop also has `iteration`: its path, outermost first, and
        // `iteration_text` (`iteration 3 of Loop "loop"`).
        let with_iter = |mut v: Value, o: &TraceOp| {
            if let (Some(m), Some(text)) = (v.as_object_mut(), o.iteration_text()) {
                m.insert("iteration".into(), json!(o.iteration));
                m.insert("iteration_text".into(), json!(text));
            }
            v
        };
        let brief = |o: &TraceOp| {
            with_iter(
                json!({"index": o.index, "id": o.id.0, "op": o.op, "label": o.label}),
                o,
            )
        };
        json!({
            "model": self.model,
            "context": self.context,
            "device": self.device_name(),
            "error": self.error,
            "first_nonfinite": self.first_nonfinite().map(brief),
            "overflow_lines": self.overflow_lines().iter().map(|(d, l)| json!({"dtype": d.to_string(), "max": l})).collect::<Vec<_>>(),
            "ops": self.ops.iter().map(|o| with_iter(json!({
                "index": o.index,
                "id": o.id.0,
                "op": o.op,
                "label": o.label,
                "source_op": o.source_op,
                "at": o.at,
                "shape": o.dims,
                "dtype": o.dtype.to_string(),
                "numel": o.stats.numel,
                "min": num(o.stats.min),
                "max": num(o.stats.max),
                "mean": o.stats.mean,
                "max_abs": o.stats.max_abs,
                "nan": o.stats.nan,
                "pos_inf": o.stats.pos_inf,
                "neg_inf": o.stats.neg_inf,
            }), o)).collect::<Vec<_>>(),
        })
    }

    /// The self-contained HTML report.
    pub fn to_html(&self) -> String {
        html_report(self)
    }
}

/// Run `a`'s model once and record every op.
pub fn trace_model(a: &ModelArgs) -> Result<Trace> {
    let loaded = load(a, false)?;
    let mut s = Session::new(Device::Cpu)
        .try_compile(loaded.graph)
        .map_err(|e| anyhow!("{e}"))?;
    let mut trace = Trace {
        model: crate::run::model_path(&a.model).display().to_string(),
        ..Default::default()
    };
    let feeds: Vec<(&str, Tensor)> = loaded
        .feeds
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    s.set_value_printer(Some(PrinterConfig::off()));
    let r = s.run_observed(feeds, &mut |g, id, t| trace.record(g, id, t));
    if let Err(e) = r {
        trace.error = Some(e.to_string());
    }
    Ok(trace)
}

fn inner(a: &TraceArgs) -> Result<i32> {
    let trace = trace_model(&a.model)?;
    write_and_summarize(&trace, &a.output_dir, &mut std::io::stdout())?;
    if let Some(e) = &trace.error {
        eprintln!("rlx: error: the run stopped: {e} (the trace holds the ops before it)");
        return Ok(1);
    }
    Ok(0)
}

/// Write `trace.json` and `trace.html` into `dir` and print the summary lines to `out`:
/// ops recorded, the first non-finite value, the largest max|x|, the files written.
///
/// Errors: the folder or a file cannot be written (named).
pub fn write_and_summarize(trace: &Trace, dir: &Path, out: &mut dyn std::io::Write) -> Result<()> {
    write_trace(trace, dir)?;
    let ctx = trace
        .context
        .as_deref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    writeln!(out, "rlx trace: {} ops recorded{ctx}", trace.ops.len())?;
    match trace.first_nonfinite() {
        Some(o) => writeln!(
            out,
            "rlx trace: first non-finite value at #{} {} {} {} ({} NaN, {} +inf, {} -inf)",
            o.index,
            o.id,
            o.op,
            o.quoted(),
            o.stats.nan,
            o.stats.pos_inf,
            o.stats.neg_inf
        )?,
        None => writeln!(out, "rlx trace: every recorded value is finite")?,
    }
    if let Some(p) = peak(trace) {
        writeln!(
            out,
            "rlx trace: largest max|x| {} at {} {} {}",
            fmt_f64(p.stats.max_abs.unwrap_or(0.0)),
            p.id,
            p.op,
            p.quoted()
        )?;
    }
    writeln!(
        out,
        "rlx trace: wrote {} and {}",
        dir.join("trace.json").display(),
        dir.join("trace.html").display()
    )?;
    Ok(())
}

/// The float op with the largest finite max|x|.
fn peak(t: &Trace) -> Option<&TraceOp> {
    t.ops
        .iter()
        .filter(|o| o.dtype.is_float() && o.stats.max_abs.is_some())
        .max_by(|a, b| {
            a.stats
                .max_abs
                .unwrap_or(0.0)
                .total_cmp(&b.stats.max_abs.unwrap_or(0.0))
        })
}

/// Entry point of `rlx trace`; returns the exit status.
pub fn main_trace(a: TraceArgs) -> i32 {
    match inner(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}

fn shape_str(o: &TraceOp) -> String {
    format!(
        "{}[{}]",
        o.dtype,
        o.dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn stats_str(s: &TensorStats) -> String {
    let f = |n: Option<Num>| n.map_or("-".to_string(), |n| n.to_string());
    format!(
        "min {}  max {}  mean {}  max|x| {}  NaN {}  +inf {}  -inf {}",
        f(s.min),
        f(s.max),
        s.mean.map_or("-".into(), fmt_f64),
        s.max_abs.map_or("-".into(), fmt_f64),
        s.nan,
        s.pos_inf,
        s.neg_inf
    )
}

/// The source op type when this op is one step of a decomposed op (differs from `o.op`).
fn step_of(o: &TraceOp) -> Option<&str> {
    o.source_op.as_deref().filter(|s| *s != o.op)
}

fn tooltip(o: &TraceOp) -> String {
    let src = step_of(o)
        .map(|s| format!(" (step of {s})"))
        .unwrap_or_default();
    format!(
        "#{} {} {}{} {}\n{}\n{}",
        o.index,
        o.id,
        o.op,
        src,
        o.quoted(),
        shape_str(o),
        stats_str(&o.stats)
    )
}

const W: f64 = 1160.0;
const ML: f64 = 70.0; // left margin (axis labels)
const MR: f64 = 20.0;
const PW: f64 = W - ML - MR;

const C_LINE: &str = "#2563eb";
const C_NAN: &str = "#dc2626";
const C_PINF: &str = "#ea580c";
const C_NINF: &str = "#7c3aed";
const C_OVF: &str = "#d97706";

fn html_report(t: &Trace) -> String {
    let n = t.ops.len().max(1);
    let x_of = |i: usize| ML + PW * (i as f64 + 0.5) / n as f64;
    let first = t.first_nonfinite();
    let lines = t.overflow_lines();
    // y range of the max|x| plot, in decades
    let pos: Vec<f64> = t
        .ops
        .iter()
        .filter_map(|o| o.stats.max_abs)
        .filter(|&a| a > 0.0)
        .collect();
    let mut lo = pos.iter().copied().fold(f64::INFINITY, f64::min);
    let mut hi = pos.iter().copied().fold(0.0f64, f64::max);
    for (_, l) in &lines {
        hi = hi.max(*l * 4.0);
    }
    if !lo.is_finite() {
        lo = 1e-3;
        hi = hi.max(1.0);
    }
    let (dlo, mut dhi) = (lo.log10().floor().max(-30.0), hi.log10().ceil());
    if dhi <= dlo {
        dhi = dlo + 1.0;
    }
    // plot 1: max|x|
    let (top1, h1) = (40.0, 300.0);
    let band = 34.0; // the band above the plot where non-finite ops get a marker
    let y_of = |a: f64| {
        let v = a.log10().clamp(dlo, dhi);
        top1 + band + h1 - (v - dlo) / (dhi - dlo) * h1
    };
    let mut svg = String::new();
    let total_h = top1 + band + h1 + 42.0;
    let _ = write!(
        svg,
        r#"<svg id="plot-maxabs" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {total_h}" width="100%" role="img" aria-label="max|x| per op, log scale">"#
    );
    let _ = write!(
        svg,
        r#"<text x="{ML}" y="22" class="ptitle">max|x| per op (log scale), in execution order</text>"#
    );
    // decade grid
    let step = ((dhi - dlo) / 10.0).ceil().max(1.0);
    let mut d = dlo;
    while d <= dhi + 1e-9 {
        let y = y_of(10f64.powf(d));
        let _ = write!(
            svg,
            r#"<line x1="{ML}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" class="ylab">1e{}</text>"#,
            W - MR,
            ML - 6.0,
            y + 4.0,
            d as i64
        );
        d += step;
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{:.1}" class="ylab nf">non-finite</text>"#,
        ML - 6.0,
        top1 + band * 0.5 + 4.0
    );
    // overflow lines
    for (dt, l) in &lines {
        let y = y_of(*l);
        let name = if *dt == DType::F16 {
            "float16 max 65504".to_string()
        } else {
            format!("bfloat16 max {}", fmt_f64(*l))
        };
        let _ = write!(
            svg,
            r#"<g class="overflow" id="overflow-{dt}"><line x1="{ML}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{C_OVF}" stroke-width="2" stroke-dasharray="8 5"/><text x="{}" y="{:.1}" fill="{C_OVF}" class="olab">{name} (overflow to inf above this line)</text><title>{name}: values above overflow to inf</title></g>"#,
            W - MR,
            ML + 8.0,
            y - 6.0
        );
    }
    // first non-finite marker
    if let Some(f) = first {
        let x = x_of(f.index);
        let anchor = if x > W * 0.6 { "end" } else { "start" };
        let tx = if anchor == "end" { x - 6.0 } else { x + 6.0 };
        let _ = write!(
            svg,
            r#"<g id="first-nonfinite-marker"><line x1="{x:.1}" x2="{x:.1}" y1="{top1}" y2="{:.1}" stroke="{C_NAN}" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{:.1}" text-anchor="{anchor}" class="flab">first non-finite: {} {} {}</text></g>"#,
            top1 + band + h1,
            top1 + band + 14.0,
            f.id,
            esc(&f.op),
            quoted_html(&f.label, &f.iteration)
        );
    }
    // the line through finite points
    let pts: Vec<String> = t
        .ops
        .iter()
        .filter_map(|o| {
            o.stats
                .max_abs
                .map(|a| format!("{:.1},{:.1}", x_of(o.index), y_of(a.max(10f64.powf(dlo)))))
        })
        .collect();
    let _ = write!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{C_LINE}" stroke-width="1.5" stroke-opacity="0.6"/>"#,
        pts.join(" ")
    );
    let r = if n > 400 {
        1.8
    } else if n > 120 {
        2.5
    } else {
        4.0
    };
    for o in &t.ops {
        let x = x_of(o.index);
        let tip = esc(&tooltip(o));
        let bad = !o.stats.is_finite();
        let _ = write!(svg, r##"<a href="#op-{}">"##, o.index);
        if let Some(a) = o.stats.max_abs {
            let y = y_of(a.max(10f64.powf(dlo)));
            let col = if bad { C_NAN } else { C_LINE };
            let fill = if a > 0.0 { col } else { "#fff" }; // all zeros: hollow, on the floor
            let _ = write!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{fill}" stroke="{col}" stroke-width="1.5"><title>{tip}</title></circle>"#
            );
        }
        if bad {
            let y = top1 + band * 0.5;
            let _ = write!(
                svg,
                r#"<path d="M{:.1},{:.1} l{r},{} l{r},-{} z" fill="{C_NAN}" transform="translate(-{r},0)"><title>{tip}</title></path>"#,
                x,
                y - r,
                2.0 * r,
                2.0 * r
            );
        }
        svg.push_str("</a>");
    }
    let every = (n as f64 / 20.0).ceil().max(1.0) as usize;
    for i in (0..t.ops.len()).step_by(every) {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" class="xtick" text-anchor="middle">{i}</text>"#,
            x_of(i),
            top1 + band + h1 + 14.0
        );
    }
    let _ = write!(
        svg,
        r#"<line x1="{ML}" x2="{ML}" y1="{top1}" y2="{:.1}" class="axis"/><text x="{:.1}" y="{:.1}" class="xlab" text-anchor="middle">op # (execution order, {} ops)</text></svg>"#,
        top1 + band + h1,
        ML + PW / 2.0,
        top1 + band + h1 + 32.0,
        t.ops.len()
    );
    // plot 2: NaN/Inf counts (stacked bars, log10(1 + count) scale)
    let (top2, h2) = (34.0, 130.0);
    let maxc = t
        .ops
        .iter()
        .map(|o| o.stats.nan + o.stats.pos_inf + o.stats.neg_inf)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let hc = |c: usize| h2 * (1.0 + c as f64).log10() / (1.0 + maxc).log10();
    let mut svg2 = String::new();
    let total2 = top2 + h2 + 30.0;
    let _ = write!(
        svg2,
        r#"<svg id="plot-nonfinite" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {total2}" width="100%" role="img" aria-label="NaN and Inf counts per op">"#
    );
    let _ = write!(
        svg2,
        r#"<text x="{ML}" y="20" class="ptitle">NaN / +inf / -inf count per op (log scale)</text><rect x="{}" y="10" width="10" height="10" fill="{C_NAN}"/><text x="{}" y="19" class="leg">NaN</text><rect x="{}" y="10" width="10" height="10" fill="{C_PINF}"/><text x="{}" y="19" class="leg">+inf</text><rect x="{}" y="10" width="10" height="10" fill="{C_NINF}"/><text x="{}" y="19" class="leg">-inf</text>"#,
        W - MR - 210.0,
        W - MR - 196.0,
        W - MR - 150.0,
        W - MR - 136.0,
        W - MR - 90.0,
        W - MR - 76.0
    );
    let base = top2 + h2;
    let _ = write!(
        svg2,
        r#"<line x1="{ML}" x2="{}" y1="{base}" y2="{base}" class="axis"/><text x="{}" y="{:.1}" class="ylab">{}</text><text x="{}" y="{:.1}" class="ylab">0</text>"#,
        W - MR,
        ML - 6.0,
        top2 + 4.0,
        maxc as u64,
        ML - 6.0,
        base + 4.0
    );
    let bw = (PW / n as f64 * 0.8).clamp(1.0, 24.0);
    for o in &t.ops {
        let s = &o.stats;
        let total = s.nan + s.pos_inf + s.neg_inf;
        if total == 0 {
            continue;
        }
        let x = x_of(o.index) - bw / 2.0;
        let full = hc(total);
        let tip = esc(&tooltip(o));
        let _ = write!(
            svg2,
            r##"<a href="#op-{}"><g><title>{tip}</title>"##,
            o.index
        );
        let mut y = base;
        for (c, col) in [(s.nan, C_NAN), (s.pos_inf, C_PINF), (s.neg_inf, C_NINF)] {
            if c == 0 {
                continue;
            }
            let h = full * c as f64 / total as f64;
            y -= h;
            let _ = write!(
                svg2,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bw:.1}" height="{h:.1}" fill="{col}"/>"#
            );
        }
        svg2.push_str("</g></a>");
    }
    if let Some(f) = first {
        let x = x_of(f.index);
        let _ = write!(
            svg2,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{top2}" y2="{base}" stroke="{C_NAN}" stroke-width="1.5" stroke-dasharray="4 3"/>"#
        );
    }
    svg2.push_str("</svg>");

    // summary
    let mut summary = String::new();
    match first {
        Some(f) => {
            let _ = write!(
                summary,
                r##"<p class="bad" id="first-nonfinite-summary">First non-finite value: op #{} <a href="#op-{}"><b>{} {} {}</b></a>{} — {} NaN, {} +inf, {} -inf in {} elements.{}</p>"##,
                f.index,
                f.index,
                f.id,
                esc(&f.op),
                quoted_html(&f.label, &f.iteration),
                step_of(f)
                    .map(|s| format!(" (a step of {})", esc(s)))
                    .unwrap_or_default(),
                f.stats.nan,
                f.stats.pos_inf,
                f.stats.neg_inf,
                f.stats.numel,
                f.at.as_deref()
                    .map(|a| format!(r#"<br>at <code class="at">{}</code>"#, esc(a)))
                    .unwrap_or_default()
            );
        }
        None => summary.push_str(r#"<p class="good">Every recorded value is finite.</p>"#),
    }
    if let Some(p) = peak(t) {
        let a = p.stats.max_abs.unwrap_or(0.0);
        let _ = write!(
            summary,
            r##"<p>Largest finite max|x|: <b>{}</b> at op #{} <a href="#op-{}">{} {} {}</a>"##,
            fmt_f64(a),
            p.index,
            p.index,
            p.id,
            esc(&p.op),
            quoted_html(&p.label, &p.iteration)
        );
        if let Some(l) = overflow_limit(p.dtype) {
            let _ = write!(
                summary,
                " — {:.0}% of the {} maximum {}",
                100.0 * a / l,
                p.dtype,
                fmt_f64(l)
            );
        }
        summary.push_str("</p>");
    }
    if let Some(e) = &t.error {
        let _ = write!(
            summary,
            r#"<p class="bad">The run stopped with an error (ops after it are missing): {}</p>"#,
            esc(e)
        );
    }
    // table
    let mut rows = String::new();
    for o in &t.ops {
        let s = &o.stats;
        let is_first = first.is_some_and(|f| f.index == o.index);
        let class = if is_first {
            " class=\"first\""
        } else if !s.is_finite() {
            " class=\"nf\""
        } else {
            ""
        };
        let idattr = if is_first {
            " data-first-nonfinite=\"true\""
        } else {
            ""
        };
        let f = |n: Option<Num>| n.map_or("-".to_string(), |n| n.to_string());
        let _ = write!(
            rows,
            r#"<tr id="op-{}"{class}{idattr}><td>{}</td><td>{}</td><td>{}</td><td class="lab">{}{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            o.index,
            o.index,
            o.id,
            esc(&o.op),
            esc(&o.label),
            o.iteration_text()
                .map(|t| format!(r#"<br><span class="it">{}</span>"#, esc(&t)))
                .unwrap_or_default(),
            o.at.as_deref()
                .map(|a| format!(r#"<br><code class="at">{}</code>"#, esc(a)))
                .unwrap_or_default(),
            esc(o.source_op.as_deref().unwrap_or("")),
            esc(&shape_str(o)),
            f(s.min),
            f(s.max),
            s.mean.map_or("-".into(), fmt_f64),
            s.max_abs.map_or("-".into(), fmt_f64),
            s.nan,
            s.pos_inf,
            s.neg_inf
        );
    }
    let dts: Vec<String> = {
        let mut v: Vec<String> = vec![];
        for o in &t.ops {
            let d = o.dtype.to_string();
            if !v.contains(&d) {
                v.push(d);
            }
        }
        v
    };
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rlx trace: {model}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #111827; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
.meta {{ color: #4b5563; margin: 0 0 12px; }}
p.bad {{ color: #b91c1c; background: #fef2f2; border-left: 4px solid #dc2626; padding: 6px 10px; }}
p.good {{ color: #166534; background: #f0fdf4; border-left: 4px solid #16a34a; padding: 6px 10px; }}
.card {{ border: 1px solid #e5e7eb; border-radius: 8px; padding: 8px; margin: 12px 0; max-width: {W}px; }}
svg text {{ font: 12px system-ui, sans-serif; fill: #374151; }}
svg .ptitle {{ font-weight: 600; font-size: 13px; fill: #111827; }}
svg .ylab {{ text-anchor: end; }} svg .nf {{ fill: {C_NAN}; }}
svg .flab {{ fill: {C_NAN}; font-weight: 600; }} svg .olab {{ font-weight: 600; fill: {C_OVF}; }}
svg .xtick {{ fill: #6b7280; font-size: 11px; }} svg .grid {{ stroke: #e5e7eb; }} svg .axis {{ stroke: #9ca3af; }}
table {{ border-collapse: collapse; font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }}
th, td {{ border-bottom: 1px solid #e5e7eb; padding: 2px 8px; text-align: right; white-space: nowrap; }}
th {{ background: #f9fafb; position: sticky; top: 0; }}
td.lab {{ text-align: left; }}
tr.nf td {{ background: #fff7ed; }} tr.first td {{ background: #fee2e2; font-weight: 700; }}
tr:target td {{ outline: 2px solid {C_LINE}; }}
</style></head><body>
<h1>rlx trace</h1>
<p class="meta">{model}{ctx} · {device} · {nops} ops recorded (graph inputs and computed ops; parameters and constants omitted) · dtypes: {dts}</p>
{summary}
<div class="card">{svg}</div>
<div class="card">{svg2}</div>
<p class="meta">Hover a point or bar for the op's label and statistics; click it to jump to its row. Statistics are over finite values; NaN/Inf are counted.</p>
<table id="ops"><thead><tr><th>#</th><th>id</th><th>op</th><th>label</th><th>source op</th><th>shape</th><th>min</th><th>max</th><th>mean</th><th>max|x|</th><th>NaN</th><th>+inf</th><th>-inf</th></tr></thead><tbody>
{rows}</tbody></table>
</body></html>
"#,
        model = esc(&t.model),
        ctx = t
            .context
            .as_deref()
            .map(|c| format!(" · <b id=\"context\">{}</b>", esc(c)))
            .unwrap_or_default(),
        device = esc(t.device_name()),
        nops = t.ops.len(),
        dts = esc(&dts.join(", ")),
    )
}

/// Write `trace.json` and `trace.html` for `t` into `dir` (created if missing).
pub fn write_trace(t: &Trace, dir: &Path) -> Result<()> {
    crate::npy::create_output_dir(dir)?;
    for (name, body) in [
        ("trace.json", serde_json::to_string_pretty(&t.to_json())?),
        ("trace.html", t.to_html()),
    ] {
        crate::npy::write_replacing(&dir.join(name), |mut f| {
            use std::io::Write;
            f.write_all(body.as_bytes())?;
            Ok(())
        })?;
    }
    Ok(())
}
