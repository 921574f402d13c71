//! `rlx precision --html DIR`: the precision report as a picture. `DIR/precision.html` is
//! self-contained (inline SVG and CSS, no script, no network); `DIR/precision.json` holds the
//! same report as `--json`.
//!
//! Every float32 node of the model in execution order (named as the model names it), with
//! its error against float32 on the first calibration input on a log scale: the bar is the
//! node's value when the **whole** model runs in the low dtype (what breaks, and where it
//! starts), the dot the node **alone** in the low dtype on its rounded float32 inputs (its
//! own error), the green tick the written mixed model. The first node beyond tolerance in
//! the all-low model is drawn in red and named; NaN/Inf reaches the band above the plot;
//! nodes kept in float32 are marked under the axis. The table lists the kept nodes with why,
//! the first failing node, and the nodes with the largest errors. Styled as
//! `diverge_html` (same page layout, colours and escaping).

use crate::diverge_html::{
    esc, LogAxis, C_BAR, C_FIRST, C_NF, C_OVER, C_OWN, C_TOL, ML, MR, PW, W,
};
use crate::precision::{num, NodeStats, Report};
use anyhow::Result;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// Rows of the table besides the kept nodes and the first failing one.
pub const TABLE_TOP: usize = 40;
const FLOOR_DECADE: f64 = -8.0;
const C_FINAL: &str = "#16a34a";

/// Write `precision.json` (`json`) and `precision.html` into `dir` (created by the caller's
/// `prepare_dir`).
pub fn write(dir: &Path, report: &Report, json: &Value) -> Result<()> {
    for (name, body) in [
        ("precision.json", serde_json::to_string_pretty(json)?),
        ("precision.html", html(report)),
    ] {
        crate::npy::write_replacing(&dir.join(name), |mut f| {
            use std::io::Write;
            f.write_all(body.as_bytes())?;
            Ok(())
        })?;
    }
    Ok(())
}

fn shown(r: &Report) -> Vec<&NodeStats> {
    r.nodes
        .iter()
        .filter(|n| n.accumulated_error.is_some() || n.own_error.is_some() || n.kept)
        .collect()
}

fn err(e: Option<f64>) -> String {
    match e {
        None => "-".into(),
        Some(x) if x.is_infinite() => "NaN/Inf".into(),
        Some(x) => num(x),
    }
}

fn tooltip(n: &NodeStats, first: bool, r: &Report) -> String {
    let mut t = format!(
        "#{} {} \"{}\"\nmax |x| {} (of {}), inputs {}\nall-{} error {}  own {}  written model {}",
        n.index,
        n.op,
        n.name,
        num(n.max_abs_out),
        num(r.max_finite),
        num(n.max_abs_in),
        r.to,
        err(n.accumulated_error),
        err(n.own_error),
        err(n.final_error)
    );
    if n.underflow_zero > 0.0 || n.subnormal > 0.0 {
        let _ = write!(
            t,
            "\nunderflow: {:.1}% to zero, {:.1}% subnormal",
            100.0 * n.underflow_zero,
            100.0 * n.subnormal
        );
    }
    if n.kept {
        let _ = write!(t, "\nKEPT IN FLOAT32: {}", n.reason);
    }
    if first {
        t.push_str("\nFIRST NODE BEYOND TOLERANCE in the all-low model");
    }
    t
}

fn chart(r: &Report, nodes: &[&NodeStats]) -> String {
    let n = nodes.len().max(1);
    let first = r.first_failing.as_deref();
    let finite_max = nodes
        .iter()
        .flat_map(|x| [x.accumulated_error, x.own_error, x.final_error])
        .flatten()
        .filter(|e| e.is_finite())
        .fold(0.0f64, f64::max);
    let ax = LogAxis::new(FLOOR_DECADE, finite_max, r.tol_rel);
    let (dlo, top, band, h) = (ax.dlo, ax.top, ax.band, ax.h);
    let y_of = |e: f64| ax.y(e);
    let bw = PW / n as f64;
    let x_of = |i: usize| ML + bw * i as f64;
    let base = top + band + h;
    let total_h = base + 56.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="plot" viewBox="0 0 {W} {total_h}" width="100%" role="img" aria-label="error against float32 per node, log scale">"#
    );
    let _ = write!(
        s,
        r#"<text x="{ML}" y="22" class="ptitle">error vs float32 per node (log scale, execution order) — bar: all {}, dot: node alone, green: written model</text>"#,
        esc(&r.to)
    );
    ax.draw(&mut s);
    for (i, nd) in nodes.iter().enumerate() {
        let is_first = first == Some(nd.name.as_str());
        let e = nd.accumulated_error.unwrap_or(0.0);
        let nf = e.is_infinite();
        let color = if is_first {
            C_FIRST
        } else if nf {
            C_NF
        } else if e > r.tol_rel {
            C_OVER
        } else {
            C_BAR
        };
        let y = if nf { top + band * 0.5 } else { y_of(e) };
        let hh = (base - y).max(1.0);
        let _ = write!(
            s,
            r#"<rect class="bar" data-node="{}" x="{:.2}" y="{:.1}" width="{:.2}" height="{hh:.1}" fill="{color}"><title>{}</title></rect>"#,
            nd.index,
            x_of(i),
            base - hh,
            (bw * 0.85).max(0.3),
            esc(&tooltip(nd, is_first, r))
        );
        let cx = x_of(i) + bw / 2.0;
        if let Some(o) = nd.own_error {
            if o.is_infinite() || o > 10f64.powf(dlo) {
                let cy = if o.is_infinite() {
                    top + band * 0.5
                } else {
                    y_of(o)
                };
                let _ = write!(
                    s,
                    r#"<circle class="own" cx="{cx:.1}" cy="{cy:.1}" r="2.5" fill="{C_OWN}"/>"#
                );
            }
        }
        if let Some(f) = nd.final_error {
            if f.is_infinite() || f > 10f64.powf(dlo) {
                let fy = if f.is_infinite() {
                    top + band * 0.5
                } else {
                    y_of(f)
                };
                let _ = write!(
                    s,
                    r#"<rect class="final" x="{:.1}" y="{:.1}" width="{:.1}" height="2" fill="{C_FINAL}"/>"#,
                    x_of(i),
                    fy - 1.0,
                    (bw * 0.85).max(1.0)
                );
            }
        }
        if nd.kept {
            let _ = write!(
                s,
                r#"<path class="kept" d="M{cx:.1},{:.1} l5,9 l-10,0 z" fill="{C_FINAL}"><title>{}</title></path>"#,
                base + 22.0,
                esc(&tooltip(nd, is_first, r))
            );
        }
    }
    let yt = y_of(r.tol_rel);
    let _ = write!(
        s,
        r#"<g id="tol"><line x1="{ML}" x2="{}" y1="{yt:.1}" y2="{yt:.1}" stroke="{C_TOL}" stroke-width="1.5" stroke-dasharray="8 5"/><text x="{}" y="{:.1}" class="tlab" text-anchor="end">tol {}</text></g>"#,
        W - MR,
        W - MR - 4.0,
        yt - 5.0,
        num(r.tol_rel)
    );
    if let Some((i, nd)) = nodes
        .iter()
        .enumerate()
        .find(|(_, nd)| first == Some(nd.name.as_str()))
    {
        let x = x_of(i) + bw / 2.0;
        let anchor = if x > W * 0.6 { "end" } else { "start" };
        let tx = if anchor == "end" { x - 6.0 } else { x + 6.0 };
        let _ = write!(
            s,
            r#"<g id="first-failure-marker" class="first-marker"><line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{base:.1}" stroke="{C_FIRST}" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{:.1}" text-anchor="{anchor}" class="flab">first failure in all-{}: #{} {} "{}"</text></g>"#,
            top + 12.0,
            esc(&r.to),
            nd.index,
            esc(&nd.op),
            esc(&nd.name)
        );
    }
    let _ = write!(
        s,
        r#"<line x1="{ML}" x2="{}" y1="{base:.1}" y2="{base:.1}" class="axis"/><text x="{ML}" y="{:.1}" class="xtick">first node</text><text x="{}" y="{:.1}" class="xtick" text-anchor="end">(execution order; {} float32 nodes; ▲ kept in float32)</text></svg>"#,
        W - MR,
        base + 48.0,
        W - MR,
        base + 48.0,
        nodes.len()
    );
    s
}

fn table(r: &Report, nodes: &[&NodeStats]) -> String {
    let first = r.first_failing.as_deref();
    let mut pick: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].kept || first == Some(nodes[i].name.as_str()))
        .collect();
    let mut by: Vec<usize> = (0..nodes.len()).collect();
    let key = |i: &usize| nodes[*i].accumulated_error.unwrap_or(0.0);
    by.sort_by(|a, b| key(b).total_cmp(&key(a)));
    pick.extend(by.into_iter().take(TABLE_TOP));
    pick.sort_unstable();
    pick.dedup();
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<p class="meta">{} of {} nodes: the kept ones, the first failing one and the {TABLE_TOP} largest all-{} errors (every node is in precision.json).</p><table id="nodes"><thead><tr><th>#</th><th>op</th><th>node</th><th>max |x|</th><th>headroom</th><th>underflow</th><th>terms</th><th>own err</th><th>all-{} err</th><th>written err</th><th>kept: why</th></tr></thead><tbody>"#,
        pick.len(),
        nodes.len(),
        esc(&r.to),
        esc(&r.to)
    );
    for i in pick {
        let n = nodes[i];
        let is_first = first == Some(n.name.as_str());
        let (class, attr) = if is_first {
            (r#" class="first""#, r#" data-first-failure="true""#)
        } else if n.kept {
            (r#" class="kept""#, "")
        } else if n.accumulated_error.is_some_and(|e| e > r.tol_rel) {
            (r#" class="over""#, "")
        } else {
            ("", "")
        };
        let headroom = if n.max_abs_out > 0.0 {
            format!("{}×", num(r.max_finite / n.max_abs_out))
        } else {
            "-".into()
        };
        let under = if n.underflow_zero + n.subnormal > 0.0 {
            format!(
                "{:.1}% / {:.1}%",
                100.0 * n.underflow_zero,
                100.0 * n.subnormal
            )
        } else {
            "-".into()
        };
        let why = if n.kept {
            let mut w = esc(&n.reason);
            if let Some(x) = &n.without_it {
                let _ = write!(w, "<br><span class=\"meta\">without it: {}</span>", esc(x));
            }
            w
        } else {
            String::new()
        };
        let _ = write!(
            s,
            r#"<tr id="n{}"{class}{attr}><td>{}</td><td>{}</td><td class="lab">{}{}</td><td>{}</td><td>{headroom}</td><td>{under}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="lab">{why}</td></tr>"#,
            n.index,
            n.index,
            esc(&n.op),
            esc(&n.name),
            if is_first {
                r#" <span class="tag">first failure</span>"#
            } else {
                ""
            },
            num(n.max_abs_out),
            n.terms.map_or("-".into(), |t| t.to_string()),
            err(n.own_error),
            err(n.accumulated_error),
            err(n.final_error),
        );
    }
    s.push_str("</tbody></table>");
    s
}

/// The self-contained HTML report.
pub fn html(r: &Report) -> String {
    let nodes = shown(r);
    let ok = |v: &crate::precision::Verdict| v.finite && v.max_rel <= r.tol_rel;
    let mut summary = String::new();
    let _ = write!(
        summary,
        r#"<ul class="verdicts"><li class="{}" id="all-low">all {} (nothing kept): {}</li><li class="{}" id="written">written model <code>{}</code>, {} of {} nodes kept in float32, on {} calibration input set(s): {}</li>"#,
        if ok(&r.all_low) { "good" } else { "bad" },
        esc(&r.to),
        esc(&verdict(&r.all_low, r.tol_rel)),
        if ok(&r.calibration) { "good" } else { "bad" },
        esc(&r.output),
        r.kept_count,
        r.float_nodes,
        r.calibration_sets.len(),
        esc(&verdict(&r.calibration, r.tol_rel))
    );
    if let Some(h) = &r.held_back {
        let _ = write!(
            summary,
            r#"<li class="{}" id="held-back">held-back input sets ({}): {}</li>"#,
            if ok(h) { "good" } else { "bad" },
            r.held_back_sets.len(),
            esc(&verdict(h, r.tol_rel))
        );
    }
    summary.push_str("</ul>");
    let body = if nodes.is_empty() {
        r#"<p class="meta">No per-node values.</p>"#.to_string()
    } else {
        format!(
            r#"<div class="card">{}<p class="legend"><span style="color:{C_FIRST}">■</span> first node beyond tolerance · <span style="color:{C_OVER}">■</span> beyond tol · <span style="color:{C_BAR}">■</span> within tol · <span style="color:{C_NF}">■</span> NaN/Inf · <span style="color:{C_OWN}">●</span> node alone · <span style="color:{C_FINAL}">▬</span> written model · <span style="color:{C_FINAL}">▲</span> kept in float32 · <span style="color:{C_TOL}">- -</span> tolerance. Hover a bar for the node.</p></div>{}"#,
            chart(r, &nodes),
            table(r, &nodes)
        )
    };
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rlx precision: {model}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #111827; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
.meta {{ color: #4b5563; margin: 0 0 12px; }}
li.bad {{ color: #b91c1c; font-weight: 600; }} li.good {{ color: #166534; }}
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
td.lab {{ text-align: left; white-space: normal; max-width: 520px; }}
tr.over td {{ background: #fff7ed; }} tr.kept td {{ background: #f0fdf4; }} tr.first td {{ background: #fee2e2; font-weight: 700; }}
.tag {{ color: #fff; background: {C_FIRST}; border-radius: 4px; padding: 0 4px; font-size: 11px; }}
</style></head><body>
<h1>rlx precision: {model} → {to}</h1>
<p class="meta">largest finite {to}: {maxf} · tolerance {tol} (max |low − f32| / max |f32| per output) · {trials} trial runs, {secs:.2} s</p>
{summary}
{body}
</body></html>
"#,
        model = esc(&r.model),
        to = esc(&r.to),
        maxf = num(r.max_finite),
        tol = num(r.tol_rel),
        trials = r.trials,
        secs = r.seconds,
    )
}

fn verdict(v: &crate::precision::Verdict, tol: f64) -> String {
    if !v.finite {
        format!("FAILS: {}", v.problem.clone().unwrap_or_default())
    } else if v.max_rel > tol {
        format!(
            "FAILS: output error {} > {} ({})",
            num(v.max_rel),
            num(tol),
            v.worst
        )
    } else {
        format!("finite, output error {} ({})", num(v.max_rel), v.worst)
    }
}
