//! `rlx diverge`: run a model on the CPU (the oracle) and on every other live backend, and
//! tell round-off from a kernel bug (see `rlx_runtime::dist::diagnostics`).

use crate::load::{load, ModelArgs};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use rlx_runtime::dist::diagnostics::{backend_divergence_with, format_report, DivergenceOptions};
use rlx_runtime::Device;
use std::path::PathBuf;

/// Exit status when a backend is suspect.
pub const EXIT_SUSPECT: i32 = 1;

/// Compare every live backend with the CPU on one model and classify each gap.
///
/// Prints one line per backend:
///   [label]   wgpu vs cpu (N/M nodes on wgpu): max_abs=… max_rel=… max_ulps=… (output #k "name") — round-off (explainable)
/// or `— SUSPECT (…)`, then for a suspect backend the first diverging node, found by comparing
/// every intermediate value in execution order:
///   first divergence at %42 MatMul "layer1.attn.qk" (inputs agree to 3e-7, output differs by 4e-2 …): kernel bug candidate
/// A NaN/Inf on one side only is reported by name ("cpu NaN, wgpu 0 at %17 Relu …: the wgpu
/// backend dropped a NaN"). max_rel = |b − cpu| / (|cpu| + 1e-6) over finite output elements.
///
/// With --html DIR, also DIR/diverge.html: every compute node's difference from the CPU in
/// execution order on a log scale (accumulated over the full runs, and the node's own on
/// replay), the first diverging node highlighted; DIR/diverge.json has every node.
///
/// Exit status: 0 when every backend's gap is round-off (or only the CPU is live), 1 when any
/// backend is suspect, 2 on an error (bad model or input, a requested backend not live).
#[derive(Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct DivergeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Relative tolerance on outputs (and the per-node localization threshold). float16 and
    /// bfloat16 values are judged against at least 8 unit roundoffs of their dtype (3.9e-3,
    /// 3.1e-2), whatever smaller TOL is given.
    #[arg(
        long,
        default_value_t = 2e-3,
        value_name = "TOL",
        allow_negative_numbers = true
    )]
    pub tol_rel: f64,
    /// Backends to compare with the CPU, comma-separated (default: every live one).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub backends: Vec<String>,
    /// Write the report as JSON to FILE ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Label printed in brackets at the start of each line (default: the model file name).
    #[arg(long)]
    pub label: Option<String>,
    /// Also write DIR/diverge.html (self-contained: every compute node's difference from the
    /// CPU on a log scale, the first diverging node highlighted) and DIR/diverge.json (the
    /// report with every node). Reads every node back on both sides, whatever the verdict.
    #[arg(long, value_name = "DIR")]
    pub html: Option<PathBuf>,
    /// Skip the per-node localization of a suspect backend.
    #[arg(long)]
    pub no_localize: bool,
    /// No notes on stderr (where each input came from).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

fn parse_device(s: &str) -> Result<Device> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "cpu" => Device::Cpu,
        "wgpu" | "gpu" | "vulkan" => Device::Wgpu,
        "cuda" | "cuda:0" => Device::Cuda,
        other => bail!("--backends: unknown backend \"{other}\" (known: cpu, wgpu, cuda)"),
    })
}

fn inner(a: &DivergeArgs) -> Result<i32> {
    if !(a.tol_rel > 0.0 && a.tol_rel.is_finite()) {
        bail!("--tol-rel {}: must be a positive number", a.tol_rel);
    }
    let backends = if a.backends.is_empty() {
        None
    } else {
        let mut v = vec![];
        for b in &a.backends {
            let d = parse_device(b)?;
            if d == Device::Cpu {
                bail!("--backends cpu: the CPU is the oracle every backend is compared with; name the other backends (e.g. --backends wgpu)");
            }
            if !rlx_runtime::device_available(d) {
                bail!(
                    "--backends: {}",
                    rlx_runtime::RuntimeError::DeviceUnavailable(d)
                );
            }
            if !v.contains(&d) {
                v.push(d);
            }
        }
        Some(v)
    };
    // Both outputs checked before anything runs or is written.
    if let Some(p) = a.json.as_ref().filter(|p| p.as_os_str() != "-") {
        crate::npy::check_output_file("--json", p, false)?;
    }
    if let Some(dir) = &a.html {
        crate::diverge_html::prepare_dir(dir)?;
    }
    let loaded = load(&a.model, a.quiet)?;
    let label = a.label.clone().unwrap_or_else(|| {
        let p = crate::run::model_path(&a.model.model);
        let stem = if p.file_name().is_some_and(|f| f == "model.onnx") {
            p.parent().and_then(|d| d.file_name())
        } else {
            p.file_stem()
        };
        stem.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let opts = DivergenceOptions {
        tol_rel: a.tol_rel,
        backends,
        localize: !a.no_localize,
        node_errors: a.html.is_some(),
        ..Default::default()
    };
    let report = backend_divergence_with(&loaded.graph, &[], &loaded.feeds, &opts)
        .map_err(|e| anyhow!("{e}"))?;
    let text = format_report(&label, &report);
    let model = crate::run::model_path(&a.model.model).display().to_string();
    let json = serde_json::json!({
        "model": model,
        "label": label,
        "tol_rel": a.tol_rel,
        "oracle": "cpu",
        "backends": report,
        "suspect": report.iter().any(|d| d.suspect),
    });
    if let Some(dir) = &a.html {
        crate::diverge_html::write(dir, &model, &label, &report, &json)?;
        if !a.quiet {
            eprintln!("rlx: wrote {}", dir.join("diverge.html").display());
        }
    }
    if let Some(p) = &a.json {
        let s = serde_json::to_string_pretty(&json)?;
        if p.as_os_str() == "-" {
            println!("{s}");
            eprint!("{text}");
        } else {
            crate::npy::write_replacing(p, |mut f| {
                use std::io::Write;
                f.write_all(s.as_bytes())?;
                Ok(())
            })?;
            print!("{text}");
        }
    } else {
        print!("{text}");
    }
    Ok(if report.iter().any(|d| d.suspect) {
        EXIT_SUSPECT
    } else {
        0
    })
}

/// Entry point of `rlx diverge`; returns the exit status.
pub fn main_diverge(a: DivergeArgs) -> i32 {
    match inner(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            2
        }
    }
}
