//! `rlx diverge --html DIR`: the divergence report as a picture. `DIR/diverge.html` is
//! self-contained (inline SVG and CSS, no script, no network); `DIR/diverge.json` holds the
//! same report with every node.
//!
//! Per compared backend: every compute node of the compiled graph in execution order, with
//! its difference from the CPU oracle on a log scale: the bar is the **accumulated**
//! difference (the node's value in the backend's full run against the CPU's full run, the
//! scale-aware relative error of the localizer), the dot its **own** difference (the op
//! replayed on the CPU with the backend's own inputs: the kernel alone). The first diverging
//! node the localizer named is drawn in red with its label; a NaN/Inf on one side only is
//! marked in the band above the plot. The table lists the nodes with the largest accumulated
//! difference plus the first diverging one and every non-finite mismatch; diverge.json has
//! them all.

use anyhow::{bail, Context, Result};
use rlx_runtime::dist::diagnostics::{BackendDivergence, NodeDiff, NodeError};
use rlx_runtime::printer::fmt_f64;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// Rows of the per-backend table (by accumulated difference) besides the first diverging
/// node and the non-finite mismatches.
pub const TABLE_TOP: usize = 40;
/// Non-finite mismatch rows at most per table.
const TABLE_NONFINITE: usize = 20;
/// The lowest decade drawn; smaller differences (and exact agreement) sit on this floor.
const FLOOR_DECADE: f64 = -12.0;

/// Check that `dir` can hold the report (create it if missing), before any run.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("--html {}: is a file, not a directory", dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--html {}: cannot create the directory", dir.display()))?;
    let probe = dir.join(".rlx-diverge-write-test");
    std::fs::write(&probe, b"")
        .with_context(|| format!("--html {}: cannot write in the directory", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Write `diverge.json` (`json`, the report with every node) and `diverge.html` into `dir`.
pub fn write(
    dir: &Path,
    model: &str,
    label: &str,
    report: &[BackendDivergence],
    json: &Value,
) -> Result<()> {
    for (name, body) in [
        ("diverge.json", serde_json::to_string_pretty(json)?),
        ("diverge.html", html(model, label, report)),
    ] {
        crate::npy::write_replacing(&dir.join(name), |mut f| {
            use std::io::Write;
            f.write_all(body.as_bytes())?;
            Ok(())
        })?;
    }
    Ok(())
}

/// `"label"` for HTML (the label escaped, the quotes kept), then ` (iteration …)` escaped
/// for a node of an unrolled loop ([`rlx_ir::provenance::with_iteration`]'s form).
pub(crate) fn quoted_html(label: &str, iteration: &[rlx_ir::LoopIteration]) -> String {
    let it = rlx_ir::graph::iteration_text(iteration)
        .map(|t| format!(" ({})", esc(&t)))
        .unwrap_or_default();
    format!("\"{}\"{it}", esc(label))
}

pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

// Chart geometry and colors, shared with the precision report (`precision_html`).
pub(crate) const W: f64 = 1160.0;
pub(crate) const ML: f64 = 70.0;
pub(crate) const MR: f64 = 20.0;
pub(crate) const PW: f64 = W - ML - MR;

pub(crate) const C_BAR: &str = "#2563eb";
pub(crate) const C_OVER: &str = "#ea580c";
pub(crate) const C_FIRST: &str = "#dc2626";
pub(crate) const C_NF: &str = "#7c3aed";
const C_FALLBACK: &str = "#9ca3af";
pub(crate) const C_OWN: &str = "#111827";
pub(crate) const C_TOL: &str = "#d97706";

/// The y axis of both HTML charts: relative error on a log scale from `1e{dlo}` up to the
/// decade above the largest finite value (at least ten times the tolerance, at least 1), a
/// band above it for NaN/Inf, plot area `h` high starting at `top`.
pub(crate) struct LogAxis {
    pub dlo: f64,
    pub dhi: f64,
    pub top: f64,
    pub band: f64,
    pub h: f64,
}

impl LogAxis {
    pub(crate) fn new(floor_decade: f64, finite_max: f64, tol_rel: f64) -> LogAxis {
        let dlo = floor_decade;
        let dhi = (finite_max.max(tol_rel * 10.0).max(1.0))
            .log10()
            .ceil()
            .max(dlo + 1.0);
        LogAxis {
            dlo,
            dhi,
            top: 40.0,
            band: 30.0,
            h: 300.0,
        }
    }

    /// The y coordinate of relative error `r` (0 and below sit on the floor).
    pub(crate) fn y(&self, r: f64) -> f64 {
        let (dlo, dhi) = (self.dlo, self.dhi);
        let v = if r > 0.0 { r.log10() } else { dlo };
        self.top + self.band + self.h - (v.clamp(dlo, dhi) - dlo) / (dhi - dlo) * self.h
    }

    /// Gridlines with their decade labels, and the NaN/Inf band's label.
    pub(crate) fn draw(&self, s: &mut String) {
        let (dlo, dhi, top, band) = (self.dlo, self.dhi, self.top, self.band);
        let y_of = |r: f64| self.y(r);
        let stepd = ((dhi - dlo) / 8.0).ceil().max(1.0);
        let mut k = dlo;
        while k <= dhi + 1e-9 {
            let y = y_of(10f64.powf(k));
            let _ = write!(
                s,
                r#"<line x1="{ML}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" class="ylab">1e{}</text>"#,
                W - MR,
                ML - 6.0,
                y + 4.0,
                k as i64
            );
            k += stepd;
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" class="ylab nfl">NaN/Inf</text>"#,
            ML - 6.0,
            top + band * 0.5 + 4.0
        );
    }
}

/// The first diverging node the localizer named (a kernel bug candidate or a non-finite
/// divergence), as its `%id`.
fn first_node(d: &BackendDivergence) -> Option<&str> {
    d.localization
        .as_ref()
        .filter(|l| l.kind != "accumulated")
        .map(|l| l.node.as_str())
}

fn rel(e: &Option<NodeError>) -> Option<f64> {
    e.as_ref().map(|e| e.rel)
}

fn nonfinite(n: &NodeDiff) -> bool {
    n.accumulated
        .as_ref()
        .is_some_and(|e| e.nonfinite.is_some())
}

fn err_str(e: &Option<NodeError>) -> String {
    match e {
        None => "-".into(),
        Some(e) if e.nonfinite.is_some() => format!("NaN/Inf (finite: {})", fmt_f64(e.rel)),
        Some(e) => fmt_f64(e.rel),
    }
}

fn step(n: &NodeDiff) -> String {
    n.source_op
        .as_deref()
        .map(|s| format!(" (step of {s})"))
        .unwrap_or_default()
}

fn tooltip(i: usize, n: &NodeDiff, first: bool) -> String {
    let mut t = format!(
        "#{i} {} {}{} {} {}{}\naccumulated rel {}  abs {}\nown (replayed) rel {}",
        n.node,
        n.op,
        step(n),
        rlx_ir::provenance::with_iteration(&n.label, &n.iteration),
        n.dtype,
        if n.on_device { "" } else { " (CPU fallback)" },
        err_str(&n.accumulated),
        n.accumulated
            .as_ref()
            .map_or("-".into(), |e| fmt_f64(e.abs)),
        err_str(&n.own)
    );
    if let Some(m) = n.accumulated.as_ref().and_then(|e| e.nonfinite.as_ref()) {
        let _ = write!(
            t,
            "\n[{}] cpu {}, other {}: {}",
            m.index, m.cpu, m.other, m.what
        );
    }
    if first {
        t.push_str("\nFIRST DIVERGING NODE (kernel bug candidate)");
    }
    t
}

fn chart(d: &BackendDivergence, dev: &str) -> String {
    let nodes = &d.nodes;
    let n = nodes.len().max(1);
    let first = first_node(d);
    let finite_max = nodes
        .iter()
        .filter_map(|x| {
            rel(&x.accumulated)
                .into_iter()
                .chain(rel(&x.own))
                .max_by(f64::total_cmp)
        })
        .filter(|r| r.is_finite())
        .fold(0.0f64, f64::max);
    let ax = LogAxis::new(FLOOR_DECADE, finite_max, d.tol_rel);
    let (dlo, top, band, h) = (ax.dlo, ax.top, ax.band, ax.h);
    let y_of = |r: f64| ax.y(r);
    let bw = PW / n as f64;
    let x_of = |i: usize| ML + bw * i as f64;
    let base = top + band + h;
    let total_h = base + 42.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="plot-{dev}" viewBox="0 0 {W} {total_h}" width="100%" role="img" aria-label="{dev}: difference from the CPU per node, log scale">"#
    );
    let _ = write!(
        s,
        r#"<text x="{ML}" y="22" class="ptitle">{dev} vs cpu: relative difference per node (log scale), in execution order — bar: accumulated (full runs), dot: own (replayed on the same inputs)</text>"#
    );
    ax.draw(&mut s);
    // bars: one per compute node
    for (i, nd) in nodes.iter().enumerate() {
        let is_first = first == Some(nd.node.as_str());
        let r = rel(&nd.accumulated).unwrap_or(0.0);
        let nf = nonfinite(nd);
        let color = if is_first {
            C_FIRST
        } else if nf {
            C_NF
        } else if !nd.on_device {
            C_FALLBACK
        } else if r > nd.tol {
            C_OVER
        } else {
            C_BAR
        };
        // a NaN/Inf on one side only (or an integer mismatch) reaches the band at the top
        let y = if r.is_finite() && !nf {
            y_of(r)
        } else {
            top + band * 0.5
        };
        let hh = (base - y).max(1.0);
        let _ = write!(
            s,
            r#"<rect class="bar" data-node="{}" x="{:.2}" y="{:.1}" width="{:.2}" height="{hh:.1}" fill="{color}"><title>{}</title></rect>"#,
            nd.node,
            x_of(i),
            base - hh,
            (bw * 0.85).max(0.3),
            esc(&tooltip(i, nd, is_first))
        );
        if nf {
            let cx = x_of(i) + bw / 2.0;
            let _ = write!(
                s,
                r#"<path class="nfmark" d="M{:.1},{:.1} l5,-9 l-10,0 z" fill="{C_NF}"><title>{}</title></path>"#,
                cx,
                top + band * 0.5 + 5.0,
                esc(&tooltip(i, nd, is_first))
            );
        }
    }
    // own (replayed) differences as dots, where above the floor
    let rdot = if n > 400 {
        1.2
    } else if n > 120 {
        2.0
    } else {
        3.0
    };
    for (i, nd) in nodes.iter().enumerate() {
        let Some(own) = &nd.own else { continue };
        let y = if own.nonfinite.is_some() || !own.rel.is_finite() {
            top + band * 0.5
        } else if own.rel > 10f64.powf(dlo) {
            y_of(own.rel)
        } else {
            continue;
        };
        let _ = write!(
            s,
            r#"<circle class="own" cx="{:.1}" cy="{y:.1}" r="{rdot}" fill="{C_OWN}"/>"#,
            x_of(i) + bw / 2.0,
        );
    }
    // tolerance line
    let yt = y_of(d.tol_rel);
    let _ = write!(
        s,
        r#"<g id="tol-{dev}"><line x1="{ML}" x2="{}" y1="{yt:.1}" y2="{yt:.1}" stroke="{C_TOL}" stroke-width="1.5" stroke-dasharray="8 5"/><text x="{}" y="{:.1}" class="tlab" text-anchor="end">tol {}</text></g>"#,
        W - MR,
        W - MR - 4.0,
        yt - 5.0,
        fmt_f64(d.tol_rel)
    );
    // the first diverging node's marker
    if let Some((i, nd)) = nodes
        .iter()
        .enumerate()
        .find(|(_, nd)| first == Some(nd.node.as_str()))
    {
        let x = x_of(i) + bw / 2.0;
        let anchor = if x > W * 0.6 { "end" } else { "start" };
        let tx = if anchor == "end" { x - 6.0 } else { x + 6.0 };
        let _ = write!(
            s,
            r#"<g id="first-divergence-marker-{dev}" class="first-marker"><line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{base:.1}" stroke="{C_FIRST}" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{:.1}" text-anchor="{anchor}" class="flab">first divergence: {} {} {}</text></g>"#,
            top + 12.0,
            nd.node,
            esc(&nd.op),
            quoted_html(&nd.label, &nd.iteration)
        );
    }
    let _ = write!(
        s,
        r#"<line x1="{ML}" x2="{}" y1="{base:.1}" y2="{base:.1}" class="axis"/><text x="{ML}" y="{:.1}" class="xtick">node #0</text><text x="{}" y="{:.1}" class="xtick" text-anchor="end">#{} (execution order; {} compute nodes)</text></svg>"#,
        W - MR,
        base + 16.0,
        W - MR,
        base + 16.0,
        nodes.len().saturating_sub(1),
        nodes.len()
    );
    s
}

/// Indexes of the table's rows: the first diverging node, the non-finite mismatches and the
/// top [`TABLE_TOP`] by accumulated difference, in execution order.
fn table_rows(d: &BackendDivergence) -> Vec<usize> {
    let first = first_node(d);
    let mut pick: Vec<usize> = vec![];
    if let Some(i) = d.nodes.iter().position(|n| first == Some(n.node.as_str())) {
        pick.push(i);
    }
    pick.extend(
        d.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| nonfinite(n))
            .map(|(i, _)| i)
            .take(TABLE_NONFINITE),
    );
    let mut by: Vec<usize> = (0..d.nodes.len()).collect();
    let key = |i: &usize| rel(&d.nodes[*i].accumulated).unwrap_or(0.0);
    by.sort_by(|a, b| key(b).total_cmp(&key(a)));
    pick.extend(by.into_iter().take(TABLE_TOP));
    pick.sort_unstable();
    pick.dedup();
    pick
}

fn table(d: &BackendDivergence, dev: &str) -> String {
    let first = first_node(d);
    let rows = table_rows(d);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<p class="meta">{} of {} nodes: the first diverging node, NaN/Inf mismatches and the {} largest accumulated differences (every node is in diverge.json).</p><table id="nodes-{dev}"><thead><tr><th>#</th><th>id</th><th>op</th><th>label</th><th>dtype</th><th>ran on</th><th>accumulated rel</th><th>accumulated abs</th><th>own rel (replayed)</th><th>tol</th><th>NaN/Inf</th></tr></thead><tbody>"#,
        rows.len(),
        d.nodes.len(),
        TABLE_TOP
    );
    for i in rows {
        let n = &d.nodes[i];
        let is_first = first == Some(n.node.as_str());
        let (class, attr) = if is_first {
            (r#" class="first""#, r#" data-first-divergence="true""#)
        } else if nonfinite(n) {
            (r#" class="nf""#, "")
        } else if rel(&n.accumulated).is_some_and(|r| r > n.tol) {
            (r#" class="over""#, "")
        } else {
            ("", "")
        };
        let nf = n
            .accumulated
            .as_ref()
            .and_then(|e| e.nonfinite.as_ref())
            .map(|m| format!("[{}] cpu {}, {dev} {}: {}", m.index, m.cpu, m.other, m.what))
            .unwrap_or_default();
        let _ = write!(
            s,
            r#"<tr id="{dev}-n{i}"{class}{attr}><td>{i}</td><td>{}</td><td>{}{}</td><td class="lab">{}{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="lab">{}</td></tr>"#,
            n.node,
            esc(&n.op),
            esc(&step(n)),
            esc(&n.label),
            rlx_ir::graph::iteration_text(&n.iteration)
                .map(|t| format!(" <span class=\"it\">({})</span>", esc(&t)))
                .unwrap_or_default(),
            if is_first {
                r#" <span class="tag">first divergence</span>"#
            } else {
                ""
            },
            esc(&n.dtype),
            if n.on_device { dev } else { "cpu (fallback)" },
            err_str(&n.accumulated),
            n.accumulated
                .as_ref()
                .map_or("-".into(), |e| fmt_f64(e.abs)),
            err_str(&n.own),
            fmt_f64(n.tol),
            esc(&nf)
        );
    }
    s.push_str("</tbody></table>");
    s
}

fn section(d: &BackendDivergence) -> String {
    let dev = d.device.to_string();
    let mut s = String::new();
    let (class, verdict) = if !d.compared {
        ("meta", "NOT COMPARED")
    } else if d.suspect {
        ("bad", "SUSPECT")
    } else {
        ("good", "round-off")
    };
    let _ = write!(
        s,
        r#"<section id="backend-{dev}" data-verdict="{}"><h2>{dev} vs cpu: <span class="v-{class}">{verdict}</span></h2><p class="{class} verdict">{}</p>"#,
        esc(&d.verdict),
        esc(d.to_string().trim())
    );
    if let Some(l) = &d.localization {
        let cls = if l.kind == "accumulated" {
            "meta"
        } else {
            "bad"
        };
        let _ = write!(
            s,
            r#"<p class="{cls}" id="localization-{dev}">{}{}</p>"#,
            esc(&l.message),
            l.source
                .as_ref()
                .map(|loc| format!(r#"<br>at <code>{}</code>"#, esc(&loc.to_string())))
                .unwrap_or_default()
        );
    }
    if !d.compared {
        let _ = write!(
            s,
            r#"<p class="meta" id="not-compared-{dev}">{dev} ran none of the {} compute nodes (every node fell back to the CPU), so there is nothing to compare and no per-node chart.</p></section>"#,
            d.nodes_total
        );
        return s;
    }
    if d.nodes.is_empty() {
        s.push_str(r#"<p class="meta">No per-node values were read back.</p></section>"#);
        return s;
    }
    let over = d
        .nodes
        .iter()
        .filter(|n| rel(&n.accumulated).is_some_and(|r| r > n.tol))
        .count();
    let nf = d.nodes.iter().filter(|n| nonfinite(n)).count();
    let _ = write!(
        s,
        r#"<p class="meta">{} compute nodes ({} on {dev}, {} CPU fallback(s)); {over} beyond tolerance in the full runs; {nf} with NaN/Inf on one side only.</p>"#,
        d.nodes.len(),
        d.nodes.iter().filter(|n| n.on_device).count(),
        d.nodes.iter().filter(|n| !n.on_device).count(),
    );
    let _ = write!(
        s,
        r#"<div class="card">{}<p class="legend"><span style="color:{C_FIRST}">■</span> first diverging node · <span style="color:{C_OVER}">■</span> beyond tol · <span style="color:{C_BAR}">■</span> within tol · <span style="color:{C_FALLBACK}">■</span> CPU fallback · <span style="color:{C_NF}">▼</span> NaN/Inf on one side only · <span style="color:{C_OWN}">●</span> own difference (replayed) · <span style="color:{C_TOL}">- -</span> tolerance. Hover a bar for the node.</p></div>"#,
        chart(d, &dev)
    );
    s.push_str(&table(d, &dev));
    s.push_str("</section>");
    s
}

/// The self-contained HTML report.
pub fn html(model: &str, label: &str, report: &[BackendDivergence]) -> String {
    let mut summary = String::new();
    if report.is_empty() {
        summary.push_str(
            r#"<p class="meta" id="nothing">No backend but the CPU is live here: nothing to compare.</p>"#,
        );
    }
    summary.push_str(r#"<ul class="verdicts">"#);
    for d in report {
        let dev = d.device.to_string();
        let (class, v) = if !d.compared {
            ("meta", "not compared (ran no node)".to_string())
        } else if d.suspect {
            let at = d
                .localization
                .as_ref()
                .filter(|l| l.kind != "accumulated")
                .map(|l| {
                    format!(
                        " — first divergence at {} {} {}",
                        l.node,
                        l.op,
                        rlx_ir::provenance::with_iteration(&l.label, &l.iteration)
                    )
                })
                .unwrap_or_default();
            ("bad", format!("SUSPECT{at}"))
        } else {
            ("good", "round-off (explainable)".to_string())
        };
        let _ = write!(
            summary,
            r##"<li class="{class}"><a href="#backend-{dev}"><b>{dev}</b></a>: {}</li>"##,
            esc(&v)
        );
    }
    summary.push_str("</ul>");
    let sections: String = report.iter().map(section).collect();
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rlx diverge: {label}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #111827; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 18px 0 4px; }}
.meta {{ color: #4b5563; margin: 0 0 12px; }}
p.bad {{ color: #b91c1c; background: #fef2f2; border-left: 4px solid #dc2626; padding: 6px 10px; }}
p.good {{ color: #166534; background: #f0fdf4; border-left: 4px solid #16a34a; padding: 6px 10px; }}
li.bad {{ color: #b91c1c; font-weight: 600; }} li.good {{ color: #166534; }} li.meta {{ color: #4b5563; }}
.v-bad {{ color: #b91c1c; }} .v-good {{ color: #166534; }} .v-meta {{ color: #4b5563; }}
.card {{ border: 1px solid #e5e7eb; border-radius: 8px; padding: 8px; margin: 12px 0; max-width: {W}px; }}
.legend {{ color: #4b5563; font-size: 12px; margin: 4px 0 0; }}
svg text {{ font: 12px system-ui, sans-serif; fill: #374151; }}
svg .ptitle {{ font-weight: 600; font-size: 13px; fill: #111827; }}
svg .ylab {{ text-anchor: end; }} svg .nfl {{ fill: {C_NF}; }}
svg .flab {{ fill: {C_FIRST}; font-weight: 700; paint-order: stroke; stroke: #fff; stroke-width: 3px; }} svg .tlab {{ fill: {C_TOL}; font-weight: 600; paint-order: stroke; stroke: #fff; stroke-width: 3px; }}
svg .xtick {{ fill: #6b7280; font-size: 11px; }} svg .grid {{ stroke: #e5e7eb; }} svg .axis {{ stroke: #9ca3af; }}
table {{ border-collapse: collapse; font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }}
th, td {{ border-bottom: 1px solid #e5e7eb; padding: 2px 8px; text-align: right; white-space: nowrap; }}
th {{ background: #f9fafb; position: sticky; top: 0; }}
td.lab {{ text-align: left; }}
tr.over td {{ background: #fff7ed; }} tr.nf td {{ background: #f5f3ff; }} tr.first td {{ background: #fee2e2; font-weight: 700; }}
.tag {{ color: #fff; background: {C_FIRST}; border-radius: 4px; padding: 0 4px; font-size: 11px; }}
</style></head><body>
<h1>rlx diverge: {label}</h1>
<p class="meta">{model} · every backend against the CPU oracle, on the same compiled graph and inputs</p>
{summary}
{sections}
</body></html>
"#,
        label = esc(label),
        model = esc(model),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_runtime::dist::diagnostics::{Localization, NonFiniteMismatch};
    use rlx_runtime::Device;

    fn err(rel: f64) -> NodeError {
        NodeError {
            rel,
            abs: rel,
            ..Default::default()
        }
    }

    fn report(n: usize, first: Option<usize>, nan_at: Option<usize>) -> BackendDivergence {
        let nodes = (0..n)
            .map(|i| {
                let mut acc = err(1e-7 * (1 + i % 97) as f64);
                if nan_at == Some(i) {
                    acc.nonfinite = Some(NonFiniteMismatch {
                        output: None,
                        node: format!("%{i}"),
                        output_name: None,
                        index: 3,
                        cpu: "NaN".into(),
                        other: "0".into(),
                        what: "the wgpu backend dropped a NaN".into(),
                    });
                }
                NodeDiff {
                    node: format!("%{i}"),
                    op: "Add".into(),
                    label: format!("layer{i}/add<&>"),
                    source_op: None,
                    iteration: vec![],
                    dtype: "f32".into(),
                    tol: 2e-3,
                    on_device: i % 50 != 7,
                    accumulated: Some(acc),
                    own: Some(err(0.0)),
                }
            })
            .collect();
        BackendDivergence {
            device: Device::Wgpu,
            nodes_on_device: n,
            nodes_total: n,
            compared: true,
            verdict: "suspect".into(),
            max_abs: 1.0,
            max_rel: 1.0,
            worst_output: 0,
            worst_output_name: "y".into(),
            max_ulps: 1,
            worst_index: 0,
            worst_values: (0.0, 1.0),
            nonfinite: vec![],
            int_mismatches: 0,
            suspect: first.is_some(),
            amplified_near_zero: false,
            tol_rel: 2e-3,
            localization: first.map(|i| Localization {
                node: format!("%{i}"),
                op: "Add".into(),
                label: format!("layer{i}/add<&>"),
                source_op: None,
                inputs_rel: 0.0,
                error: err(1e-6),
                kind: "kernel_bug_candidate".into(),
                message: "first divergence".into(),
                source: None,
                iteration: vec![],
            }),
            nodes,
        }
    }

    #[test]
    fn thousands_of_nodes_chart_all_and_table_the_top_plus_the_first() {
        let n = 5000;
        // the first diverging node has a small accumulated error: not in the top 40
        let h = html("m.onnx", "m", &[report(n, Some(10), Some(4000))]);
        assert_eq!(h.matches(r#"<rect class="bar""#).count(), n);
        let rows = h.matches("<tr id=\"wgpu-n").count();
        assert!(rows <= TABLE_TOP + 2, "{rows}");
        assert!(h.contains(r#"<tr id="wgpu-n10" class="first" data-first-divergence="true">"#));
        assert!(h.contains(r#"<tr id="wgpu-n4000" class="nf">"#));
        assert_eq!(h.matches(r#"class="nfmark""#).count(), 1);
        // labels are escaped
        assert!(h.contains("layer10/add&lt;&amp;&gt;") && !h.contains("add<&>"));
        assert!(h.len() < 8 << 20, "{} bytes", h.len());
    }

    #[test]
    fn a_backend_that_ran_no_node_says_so_and_draws_nothing() {
        let mut d = report(5, None, None);
        d.compared = false;
        d.nodes.clear();
        d.verdict = "not compared".into();
        let h = html("m.onnx", "m", &[d]);
        assert!(h.contains(r#"id="not-compared-wgpu""#));
        assert!(h.contains("not compared (ran no node)"));
        assert!(!h.contains("<svg"));
    }
}
