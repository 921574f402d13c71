//! `rlx generate` and `rlx-run qwen3`: text generation from a Hugging Face checkpoint
//! folder (config.json, *.safetensors, tokenizer.json) through `rlx_models`.
//!
//! Every debugging switch works while generating (docs/DEBUGGING.md, "While generating"):
//! `RLX_DEBUG_NANS` reports carry the run (`(prefill)`, `(decode step k, position p)`) and
//! `abort` stops generation there (exit 3); the printer's lines carry it too, its filter takes
//! module paths, and `--print-step` limits it to one run; `--trace DIR --trace-step S` writes
//! `rlx trace`'s report of one run; `RLX_LINT_NUMERICS=1` lints both graphs when compiled.

use anyhow::{bail, Result};
use clap::Args;
use rlx_ir::DType;
use rlx_models::{GenOptions, Generator, ModelError, Sampler, Step};
use std::io::Write;
use std::path::PathBuf;

/// Families `rlx-run <family>` accepts (`rlx generate` takes the one config.json names).
pub const FAMILIES: &[&str] = &["qwen3", "qwen2", "llama", "mistral"];

/// Options of `rlx generate` / `rlx-run qwen3`.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Checkpoint folder: config.json, model.safetensors (or shards with
    /// model.safetensors.index.json; f32, f16 or bf16) and tokenizer.json.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// The prompt text (tokenized with tokenizer.json, no special tokens added).
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate at most (stops earlier at config.json's eos_token_id).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature: logits are divided by it before top-k/top-p sampling. 0 is
    /// greedy: the argmax of the logits (transformers' do_sample=False), never a division by
    /// 0. A negative or NaN value is an error.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the K most likely tokens before sampling (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler's random generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run dtype: f32, f16 or bf16 (default: the checkpoint's dtype).
    #[arg(long)]
    pub dtype: Option<String>,
    /// cpu (default), wgpu or cuda.
    #[arg(long)]
    pub device: Option<String>,
    /// Keep generating past config.json's eos_token_id (llama.cpp's --ignore-eos).
    #[arg(long)]
    pub ignore_eos: bool,
    /// CPU worker threads (default: RAYON_NUM_THREADS if set, else one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write {"prompt_ids", "generated_ids", "text", "prefill_tokens_per_s",
    /// "decode_tokens_per_s", "load_s"} to FILE ("load_s": seconds to open the checkpoint
    /// and load its weights, graph compiles excluded).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print intermediate values of one run only: `prefill`, or decode step K (K >= 1, the
    /// `decode step K` of reports and printer lines). Uses
    /// RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER's level (1 when unset) and
    /// RLX_FILTERED_OPS_TO_PRINT's filter (module paths: `model.layers.1.mlp`).
    #[arg(long, value_name = "prefill|K")]
    pub print_step: Option<String>,
    /// Write `rlx trace`'s report (trace.json, trace.html: per-op statistics, labelled with
    /// the checkpoint's module paths) of the run --trace-step names into DIR.
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
    /// The run --trace records: `prefill` (default), or decode step K (K >= 1: it feeds the
    /// K-th generated token, at position prompt_len + K - 1). A generation of N new tokens
    /// has decode steps 1..N-1.
    #[arg(long, value_name = "prefill|K", requires = "trace")]
    pub trace_step: Option<String>,
}

/// Parse `--print-step` / `--trace-step`, checking that the generation will reach it.
fn parse_step(flag: &str, v: &str, max_new_tokens: usize) -> Result<Step> {
    let s = Step::parse(v).map_err(|e| anyhow::anyhow!("{flag} {e}"))?;
    match s {
        _ if max_new_tokens == 0 => {
            bail!("{flag} {v}: --max-new-tokens 0 runs nothing (not even the prefill)")
        }
        Step::Decode(k) if k >= max_new_tokens => bail!(
            "{flag} {v}: a generation of --max-new-tokens {max_new_tokens} has {}",
            if max_new_tokens == 1 {
                "no decode step (only the prefill)".to_string()
            } else {
                format!("decode steps 1..{}", max_new_tokens - 1)
            }
        ),
        s => Ok(s),
    }
}

fn parse_dtype(s: &str) -> Result<DType> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => DType::F32,
        "f16" | "float16" => DType::F16,
        "bf16" | "bfloat16" => DType::BF16,
        o => bail!("--dtype {o}: unknown (known: f32, f16, bf16)"),
    })
}

fn inner(a: &GenerateArgs, family: Option<&str>) -> Result<i32> {
    crate::init_threads(a.threads)?;
    let device = crate::compile::parse_device(a.device.as_deref().unwrap_or("cpu"))?;
    let dtype = a.dtype.as_deref().map(parse_dtype).transpose()?;
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        bail!(
            "--temperature {}: must be finite and >= 0 (0 is greedy)",
            a.temperature
        );
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!("--top-p {}: must be in (0, 1]", a.top_p);
    }
    let print_step = (a.print_step.as_deref())
        .map(|v| parse_step("--print-step", v, a.max_new_tokens))
        .transpose()?;
    let trace_step = match (&a.trace, a.trace_step.as_deref()) {
        (Some(dir), v) => {
            // Refuse an unusable folder before the model is loaded.
            crate::npy::create_output_dir(dir).map_err(|e| anyhow::anyhow!("--trace: {e:#}"))?;
            Some(parse_step(
                "--trace-step",
                v.unwrap_or("prefill"),
                a.max_new_tokens,
            )?)
        }
        (None, _) => None,
    };
    let cfg = rlx_models::LlmConfig::load(&a.model)?;
    if let Some(f) = family {
        let fam_ok = match f {
            "qwen3" => cfg.family == rlx_models::Family::Qwen3,
            "qwen2" => cfg.family == rlx_models::Family::Qwen2,
            _ => cfg.family == rlx_models::Family::Llama,
        };
        if !fam_ok {
            bail!(
                "{}: config.json's model_type is {:?}, not {f} (`rlx generate` takes the family from config.json)",
                a.model.join("config.json").display(),
                cfg.model_type
            );
        }
    }
    // The cache holds the prompt and the new tokens; the prompt is tokenized first.
    let ids = rlx_models::tokenize(&a.model, &a.prompt)?;
    // The KV cache is sized for the whole generation up front (a fixed-size cache until
    // run-time shapes exist), so a length past the model's positions is refused here, before
    // an allocation that size.
    let max_len = match ids.len().checked_add(a.max_new_tokens) {
        Some(n) if n <= cfg.max_positions => n.max(1),
        _ => bail!(
            "--max-new-tokens {}: the prompt ({} tokens) plus the new tokens exceeds the model's {} positions (config.json's max_position_embeddings); the KV cache is allocated for all of them up front",
            a.max_new_tokens,
            ids.len(),
            cfg.max_positions
        ),
    };
    // Load: config, tokenizer, checkpoint map, weights copied out in the run dtype.
    let t_load = std::time::Instant::now();
    let mut g = Generator::open(&a.model, dtype, device, max_len)?;
    let load_s = t_load.elapsed().as_secs_f64();
    g.set_print_step(print_step);
    let opts = GenOptions {
        max_new_tokens: a.max_new_tokens,
        sampler: Sampler {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop_at_eos: !a.ignore_eos,
    };
    // Stream: decode everything so far and print what is new (byte-level BPE pieces can
    // complete a character only with the next token).
    let mut so_far: Vec<i64> = vec![];
    let mut printed = 0usize;
    let mut out = std::io::stdout();
    let mut on_token = |g: &Generator, tok: i64| {
        so_far.push(tok);
        if let Ok(t) = g.decode_text(&so_far) {
            if t.len() > printed && t.is_char_boundary(printed) {
                let _ = write!(out, "{}", &t[printed..]);
                let _ = out.flush();
                printed = t.len();
            }
        }
    };
    let mut trace = crate::trace::Trace {
        model: a.model.display().to_string(),
        device: device.to_string(),
        ..Default::default()
    };
    let res = match trace_step {
        Some(step) => g.generate_observed(&ids, &opts, &mut on_token, step, &mut |gr, id, t| {
            trace.record(gr, id, t)
        }),
        None => g.generate(&ids, &opts, &mut on_token),
    };
    println!();
    if rlx_compile::numeric_lint::lint_enabled_from_env() {
        for l in g.lints() {
            if l.lints == 0 {
                eprintln!(
                    "rlx numeric-lint: {} graph: no constant folds to NaN/Inf ({} nodes checked)",
                    l.graph, l.nodes
                );
            } else {
                eprintln!(
                    "rlx numeric-lint: {} graph: {} lint(s), printed above",
                    l.graph, l.lints
                );
            }
        }
    }
    // The traced run's report is written even when a NaN abort stopped generation after it.
    let mut trace_missing = None;
    if let (Some(dir), Some(step)) = (&a.trace, trace_step) {
        if trace.ops.is_empty() {
            trace_missing = Some(step);
        } else {
            trace.context = trace_context(step, ids.len());
            crate::trace::write_and_summarize(&trace, dir, &mut std::io::stderr())?;
        }
    }
    let res = match res {
        Ok(r) => r,
        Err(ModelError::Runtime { context, source }) if source.as_nan_abort().is_some() => {
            eprintln!("rlx: generation stopped at {context} (RLX_DEBUG_NANS=abort)");
            return Ok(3);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(step) = trace_missing {
        bail!(
            "--trace-step: the generation ended after {} decode step(s) (an end-of-sequence token; --ignore-eos goes on), before {step}: nothing traced",
            res.generated_ids.len().saturating_sub(1)
        );
    }
    eprintln!(
        "rlx: loaded in {load_s:.2} s; prefill {} tokens at {:.1} tokens/s; decode {} tokens at {:.1} tokens/s ({}, {:?})",
        res.prompt_ids.len(),
        res.prefill_tokens_per_s,
        res.generated_ids.len().saturating_sub(1),
        res.decode_tokens_per_s,
        device,
        g.graphs.dtype
    );
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "prompt_ids": res.prompt_ids,
            "generated_ids": res.generated_ids,
            "text": res.text,
            "prefill_tokens_per_s": res.prefill_tokens_per_s,
            "decode_tokens_per_s": res.decode_tokens_per_s,
            "load_s": load_s,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")
            .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", p.display()))?;
    }
    Ok(0)
}

/// The report context of run `step` for a prompt of `t` tokens, as the generator names it.
fn trace_context(step: Step, t: usize) -> Option<String> {
    Some(match step {
        Step::Prefill => "prefill".to_string(),
        Step::Decode(k) => format!("decode step {k}, position {}", t + k - 1),
    })
}

/// Entry point of `rlx generate` (`family` = `None`) and `rlx-run <family>` (the family
/// must match config.json). Exit 0, 1 on an error (one line naming the file and tensor),
/// 3 when `RLX_DEBUG_NANS=abort` stopped generation.
pub fn main_generate(a: GenerateArgs, family: Option<&str>) -> i32 {
    match inner(&a, family) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}
