//! Text generation: prefill once, then one decode-step run per token against the
//! preallocated KV cache.

use crate::build::ModelGraphs;
use crate::checkpoint::Checkpoint;
use crate::config::LlmConfig;
use crate::ModelError;
use rlx_ir::numeric_check::{DebugMode, NanReport};
use rlx_ir::{DType, Graph, NodeId, Tensor, TensorData};
use rlx_runtime::printer::PrinterConfig;
use rlx_runtime::{CompiledGraph, Device, RuntimeError, Session};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Sampling settings. `temperature == 0` is greedy (the first index of the largest logit,
/// as `torch.argmax`); otherwise logits are divided by the temperature, cut to the `top_k`
/// largest (0: all), then to the smallest set whose probability reaches `top_p` (1: all),
/// and sampled with a generator seeded by `seed` (same seed, same tokens).
#[derive(Debug, Clone)]
pub struct Sampler {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

/// One run of a generation, named as NaN reports and printer lines name it: the prompt's
/// prefill (`(prefill)`), or decode step `k` (1-based, `(decode step k, position p)`): step
/// `k` feeds the `k`-th generated token at position `p = prompt_len + k - 1` and yields the
/// logits of token `k + 1`. A generation of `n` new tokens runs the prefill and `n - 1`
/// decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Prefill,
    Decode(usize),
}

impl Step {
    /// `prefill` (or `0`), or a decode step `k >= 1`.
    ///
    /// Errors: anything else, in words that name the accepted forms.
    pub fn parse(s: &str) -> Result<Step, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("prefill") || t == "0" {
            return Ok(Step::Prefill);
        }
        match t.parse::<usize>() {
            Ok(k) if k >= 1 => Ok(Step::Decode(k)),
            _ => Err(format!(
                "{s:?}: expected `prefill` or a decode step number k >= 1 (as in `decode step k` of a report)"
            )),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Prefill => f.write_str("prefill"),
            Step::Decode(k) => write!(f, "decode step {k}"),
        }
    }
}

/// A callback that sees every node's value of one run: `(graph, node, value)`, in
/// topological order ([`CompiledGraph::run_tensor_refs_observed`]).
pub type Observer<'a> = &'a mut dyn FnMut(&Graph, NodeId, &Tensor);

/// What to generate: at most `max_new_tokens` tokens, stopping early at an end-of-sequence
/// id from config.json when `stop_at_eos`.
#[derive(Debug, Clone)]
pub struct GenOptions {
    pub max_new_tokens: usize,
    pub sampler: Sampler,
    pub stop_at_eos: bool,
}

/// The result of [`Generator::generate`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<i64>,
    pub generated_ids: Vec<i64>,
    /// The generated tokens decoded (the prompt not included).
    pub text: String,
    /// Prompt tokens per second of the prefill run (compile excluded).
    pub prefill_tokens_per_s: f64,
    /// Decode-step runs per second (compile excluded); 0 when there were none.
    pub decode_tokens_per_s: f64,
}

/// A checkpoint folder ready to generate: its config, weights in the run dtype, tokenizer,
/// and the decode-step graph compiled once for caches of `max_len` positions.
pub struct Generator {
    pub dir: PathBuf,
    pub graphs: ModelGraphs,
    tokenizer: tokenizers::Tokenizer,
    device: Device,
    decode: Option<CompiledGraph>,
    debug: Option<DebugMode>,
    reports: Vec<NanReport>,
    /// `Some(step)`: the value printer prints that run only.
    print_step: Option<Step>,
    /// Per graph compiled (`prefill`, `decode`): nodes, and lints found (`RLX_LINT_NUMERICS`).
    linted: Vec<GraphLints>,
}

/// The numeric lint's result on one graph a generator compiled ([`Generator::lints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphLints {
    /// `prefill` or `decode`.
    pub graph: &'static str,
    /// Nodes of the graph as built (before compiling).
    pub nodes: usize,
    /// Lints printed for it (0 when the lint is off or found nothing).
    pub lints: usize,
}

struct Rng(u64);
impl Rng {
    /// splitmix64, mapped to [0, 1).
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Sampler {
    /// Greedy decoding.
    pub fn greedy() -> Sampler {
        Sampler {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    fn pick(&self, logits: &[f32], rng: &mut Rng) -> usize {
        let argmax = || {
            let mut best = 0;
            for (i, &x) in logits.iter().enumerate() {
                if x > logits[best] || (logits[best].is_nan() && !x.is_nan()) {
                    best = i;
                }
            }
            best
        };
        if self.temperature <= 0.0 || !self.temperature.is_finite() {
            return argmax();
        }
        let mut idx: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        if idx.is_empty() {
            return argmax();
        }
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if self.top_k > 0 && self.top_k < idx.len() {
            idx.truncate(self.top_k);
        }
        let t = self.temperature as f64;
        let m = logits[idx[0]] as f64 / t;
        let mut p: Vec<f64> = idx
            .iter()
            .map(|&i| (logits[i] as f64 / t - m).exp())
            .collect();
        let sum: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= sum);
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = p.len();
            for (k, x) in p.iter().enumerate() {
                acc += x;
                if acc >= self.top_p as f64 {
                    keep = k + 1;
                    break;
                }
            }
            p.truncate(keep);
            idx.truncate(keep);
            let s: f64 = p.iter().sum();
            p.iter_mut().for_each(|x| *x /= s);
        }
        let r = rng.next_f64();
        let mut acc = 0.0;
        for (k, x) in p.iter().enumerate() {
            acc += x;
            if r < acc {
                return idx[k];
            }
        }
        *idx.last().expect("non-empty")
    }
}

/// Print once per generation (`warned`: already printed) that the logits of `run` hold
/// NaN: the sampler's pick among them is meaningless (greedy takes the first index of the
/// largest value, so an all-NaN row gives token 0). Returns whether it has been printed.
fn warn_nan_logits(logits: &[f32], run: &str, warned: bool) -> bool {
    if warned || !logits.iter().any(|x| x.is_nan()) {
        return warned;
    }
    let n = logits.iter().filter(|x| x.is_nan()).count();
    eprintln!(
        "rlx: warning: {n} of {} logits of {run} are NaN, so the tokens picked from them mean nothing; run with RLX_DEBUG_NANS=1 to name the op that created the NaN",
        logits.len()
    );
    true
}

fn rt(context: &str) -> impl FnOnce(rlx_runtime::RuntimeError) -> ModelError + '_ {
    move |source| ModelError::Runtime {
        context: context.to_string(),
        source,
    }
}

/// Copy `src` (row-major, `[kv, a, b]` blocks) into `dst` at the element offsets `at(i)`.
fn scatter(dst: &mut TensorData, src: &TensorData, at: impl Fn(usize) -> usize) {
    macro_rules! go {
        ($d:expr, $s:expr) => {
            for (i, x) in $s.iter().enumerate() {
                $d[at(i)] = *x;
            }
        };
    }
    match (dst, src) {
        (TensorData::F32(d), TensorData::F32(s)) => go!(d, s),
        (TensorData::F16(d), TensorData::F16(s)) => go!(d, s),
        (TensorData::BF16(d), TensorData::BF16(s)) => go!(d, s),
        _ => unreachable!("caches and graph outputs share the run dtype"),
    }
}

fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer, ModelError> {
    let tpath = dir.join("tokenizer.json");
    if !tpath.is_file() {
        return Err(ModelError::Tokenizer {
            path: tpath,
            msg: "missing (a tokenizer.json is needed to turn text into token ids)".into(),
        });
    }
    tokenizers::Tokenizer::from_file(&tpath).map_err(|e| ModelError::Tokenizer {
        path: tpath.clone(),
        msg: format!("does not load: {e}"),
    })
}

/// Token ids of `text` with `dir/tokenizer.json` (no special tokens added), without loading
/// the weights: callers size the KV cache ([`Generator::open`]'s `max_len`) from it.
///
/// Errors: a missing or unloadable tokenizer.json, text that does not encode.
pub fn tokenize(dir: &Path, text: &str) -> Result<Vec<i64>, ModelError> {
    let t = load_tokenizer(dir)?;
    let enc = t.encode(text, false).map_err(|e| ModelError::Tokenizer {
        path: dir.join("tokenizer.json"),
        msg: format!("cannot encode the prompt: {e}"),
    })?;
    Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
}

impl Generator {
    /// Open a checkpoint folder: config.json, the safetensors files, tokenizer.json; weights
    /// converted to `dtype` (the checkpoint's own when `None`), rotary tables for `max_len`
    /// positions (the prompt plus the tokens to generate).
    ///
    /// Errors: every [`ModelError`] of a bad folder, naming the file and tensor.
    pub fn open(
        dir: &Path,
        dtype: Option<DType>,
        device: Device,
        max_len: usize,
    ) -> Result<Generator, ModelError> {
        let cfg = LlmConfig::load(dir)?;
        let tokenizer = load_tokenizer(dir)?;
        let ck = Checkpoint::open(dir)?;
        let dtype = dtype.unwrap_or(cfg.dtype);
        let graphs = ModelGraphs::load(cfg, &ck, dtype, max_len.max(1))?;
        Ok(Generator {
            dir: dir.to_path_buf(),
            graphs,
            tokenizer,
            device,
            decode: None,
            debug: None,
            reports: vec![],
            print_step: None,
            linted: vec![],
        })
    }

    /// Override `RLX_DEBUG_NANS` for this generator's runs (`None`: read the variable at
    /// each run, the default). Reports are printed to stderr either way.
    pub fn set_debug_mode(&mut self, mode: Option<DebugMode>) {
        self.debug = mode;
        if let Some(d) = self.decode.as_mut() {
            d.set_debug_mode(mode);
        }
    }

    /// Print intermediate values (`RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER`, filtered by
    /// `RLX_FILTERED_OPS_TO_PRINT`) on the run `step` only, the other runs silenced;
    /// when the variable is unset or 0, that run prints at level 1. `None` (the default):
    /// every run follows the variables.
    pub fn set_print_step(&mut self, step: Option<Step>) {
        self.print_step = step;
    }

    /// The printer setting of run `step` (`None`: follow the environment).
    fn printer_for(&self, step: Step) -> Option<PrinterConfig> {
        let want = self.print_step?;
        if want != step {
            return Some(PrinterConfig::off());
        }
        let mut p = PrinterConfig::from_env();
        if !p.is_on() {
            p.level = 1;
        }
        Some(p)
    }

    /// The graphs compiled so far with their node and lint counts (lints are printed when
    /// compiling under `RLX_LINT_NUMERICS=1`; each graph once per prompt length).
    pub fn lints(&self) -> &[GraphLints] {
        &self.linted
    }

    fn note_lints(&mut self, graph: &'static str, c: &CompiledGraph) {
        let e = GraphLints {
            graph,
            nodes: c.source_graph().len(),
            lints: c.lints().len(),
        };
        if !self.linted.contains(&e) {
            self.linted.push(e);
        }
    }

    /// The NaN/Inf reports of the last [`Generator::generate`] or
    /// [`Generator::prompt_logits`] call, from every run (prefill and each decode step, told
    /// apart by `NanReport::context`).
    pub fn nan_reports(&self) -> &[NanReport] {
        &self.reports
    }

    /// The config read from config.json.
    pub fn config(&self) -> &LlmConfig {
        &self.graphs.cfg
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, ModelError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| self.tok_err(format!("cannot encode the prompt: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode_text(&self, ids: &[i64]) -> Result<String, ModelError> {
        let u: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.tokenizer
            .decode(&u, true)
            .map_err(|e| self.tok_err(format!("cannot decode: {e}")))
    }

    fn tok_err(&self, msg: String) -> ModelError {
        ModelError::Tokenizer {
            path: self.dir.join("tokenizer.json"),
            msg,
        }
    }

    fn check_ids(&self, ids: &[i64]) -> Result<(), ModelError> {
        let v = self.graphs.cfg.vocab as i64;
        if ids.is_empty() {
            return Err(ModelError::Request(
                "the prompt encodes to no tokens".into(),
            ));
        }
        if let Some(b) = ids.iter().find(|&&i| i < 0 || i >= v) {
            return Err(ModelError::Request(format!(
                "token id {b} is outside config.json's vocab_size {v} (tokenizer.json and the checkpoint disagree)"
            )));
        }
        Ok(())
    }

    fn prefill_graph(&self, t: usize, all: bool) -> Result<CompiledGraph, ModelError> {
        let g = self.graphs.prefill(t, all)?.graph;
        let mut c = Session::new(self.device)
            .try_compile(g)
            .map_err(rt("compiling the prefill graph"))?;
        c.set_debug_mode(self.debug);
        Ok(c)
    }

    /// The logits of every prompt position, f32 `[t, vocab]` (one prefill run).
    pub fn prompt_logits(&mut self, ids: &[i64]) -> Result<Tensor, ModelError> {
        self.check_ids(ids)?;
        let mut c = self.prefill_graph(ids.len(), true)?;
        c.set_report_context(Some("prefill".into()));
        let x = Tensor::from_i64(&[ids.len()], ids.to_vec()).expect("dims");
        self.reports.clear();
        let r = c.run_tensor_refs(&[("input_ids", &x)]);
        self.reports.extend_from_slice(c.nan_reports());
        let out = r.map_err(rt("prefill"))?;
        let l = &out[0];
        Ok(Tensor::new(l.dims().to_vec(), l.data().cast(DType::F32)).expect("dims"))
    }

    /// Generate from `prompt_ids`: prefill, then one decode-step run per new token; `on_token`
    /// sees each token as it is chosen. NaN reports (`RLX_DEBUG_NANS`) carry the step:
    /// `(prefill)` or `(decode step k, position p)`.
    ///
    /// Errors: an empty prompt, ids outside the vocabulary, a prompt plus `max_new_tokens`
    /// longer than the cache, a compile or run error (a NaN abort stops generation there).
    pub fn generate(
        &mut self,
        prompt_ids: &[i64],
        opts: &GenOptions,
        on_token: &mut dyn FnMut(&Generator, i64),
    ) -> Result<Generation, ModelError> {
        self.generate_with(prompt_ids, opts, on_token, None)
    }

    /// [`Generator::generate`], with `observe` called on every node's value of the run
    /// `step` (the prefill, or decode step `k`): its inputs (the token, position, mask and
    /// KV caches of a decode step), weights and every computed op, labelled with module
    /// paths. NaN scanning, the printer and the report context work as in the other runs.
    /// `observe` is never called when the generation ends before `step` (at an
    /// end-of-sequence token, or `max_new_tokens` reached: a generation of `n` tokens has
    /// `n - 1` decode steps).
    ///
    /// Errors: as `generate`.
    pub fn generate_observed(
        &mut self,
        prompt_ids: &[i64],
        opts: &GenOptions,
        on_token: &mut dyn FnMut(&Generator, i64),
        step: Step,
        observe: Observer<'_>,
    ) -> Result<Generation, ModelError> {
        self.generate_with(prompt_ids, opts, on_token, Some((step, observe)))
    }

    /// One run of `c`: observed when `hook` names `step`; printer as [`Self::set_print_step`].
    fn run_step(
        &self,
        c: &mut CompiledGraph,
        step: Step,
        inputs: &[(&str, &Tensor)],
        hook: &mut Option<(Step, Observer<'_>)>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        if self.print_step.is_some() {
            c.set_value_printer(self.printer_for(step));
        }
        match hook {
            Some((s, obs)) if *s == step => c.run_tensor_refs_observed(inputs, &mut **obs),
            _ => c.run_tensor_refs(inputs),
        }
    }

    fn generate_with(
        &mut self,
        prompt_ids: &[i64],
        opts: &GenOptions,
        on_token: &mut dyn FnMut(&Generator, i64),
        mut hook: Option<(Step, Observer<'_>)>,
    ) -> Result<Generation, ModelError> {
        self.check_ids(prompt_ids)?;
        let t = prompt_ids.len();
        let ml = self.graphs.max_len;
        if t + opts.max_new_tokens > ml + 1 {
            return Err(ModelError::Request(format!(
                "the prompt ({t} tokens) plus {} new tokens exceeds the cache of {ml} positions",
                opts.max_new_tokens
            )));
        }
        let cfg = self.graphs.cfg.clone();
        let (nkv, hd, dt) = (cfg.kv_heads, cfg.head_dim, self.graphs.dtype);
        let mut rng = Rng(opts.sampler.seed);
        let mut out = Generation {
            prompt_ids: prompt_ids.to_vec(),
            generated_ids: vec![],
            text: String::new(),
            prefill_tokens_per_s: 0.0,
            decode_tokens_per_s: 0.0,
        };
        if opts.max_new_tokens == 0 {
            return Ok(out);
        }
        // Prefill.
        let mut pre = self.prefill_graph(t, false)?;
        self.note_lints("prefill", &pre);
        pre.set_report_context(Some("prefill".into()));
        let x = Tensor::from_i64(&[t], prompt_ids.to_vec()).expect("dims");
        let t0 = Instant::now();
        self.reports.clear();
        let res = self.run_step(&mut pre, Step::Prefill, &[("input_ids", &x)], &mut hook);
        self.reports.extend_from_slice(pre.nan_reports());
        let res = res.map_err(rt("prefill"))?;
        out.prefill_tokens_per_s = t as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        drop(pre);
        let logits = res[0].data().to_f32_vec();
        let mut warned = warn_nan_logits(&logits, "the prefill", false);
        let mut tok = opts.sampler.pick(&logits, &mut rng) as i64;
        out.generated_ids.push(tok);
        on_token(self, tok);
        let stop = |tok: i64| opts.stop_at_eos && cfg.eos.contains(&tok);
        if stop(tok) || opts.max_new_tokens == 1 {
            out.text = self.decode_text(&out.generated_ids)?;
            return Ok(out);
        }
        // Caches: keys [nkv, hd, ml], values [nkv, ml, hd], filled from the prefill outputs.
        let mut kc: Vec<Tensor> = vec![];
        let mut vc: Vec<Tensor> = vec![];
        for l in 0..cfg.layers {
            let mut k = Tensor::zeros(&[nkv, hd, ml], dt);
            let mut v = Tensor::zeros(&[nkv, ml, hd], dt);
            // present_key [nkv, hd, t] → [kv, j, p]; present_value [nkv, t, hd] → [kv, p, j]
            scatter(k.data_mut(), res[1 + 2 * l].data(), |i| {
                let (kv, j, p) = (i / (hd * t), (i / t) % hd, i % t);
                kv * hd * ml + j * ml + p
            });
            scatter(v.data_mut(), res[2 + 2 * l].data(), |i| {
                let (kv, p, j) = (i / (t * hd), (i / hd) % t, i % hd);
                kv * ml * hd + p * hd + j
            });
            kc.push(k);
            vc.push(v);
        }
        drop(res);
        // Decode, compiled once per generator (for its max_len) and reused for every token.
        if self.decode.is_none() {
            let g = self.graphs.decode()?.graph;
            let mut c = Session::new(self.device)
                .try_compile(g)
                .map_err(rt("compiling the decode-step graph"))?;
            c.set_debug_mode(self.debug);
            self.note_lints("decode", &c);
            self.decode = Some(c);
        }
        let names: Vec<(String, String)> = (0..cfg.layers)
            .map(|l| (format!("past_key.{l}"), format!("past_value.{l}")))
            .collect();
        let mut mask = vec![f32::MIN; ml];
        mask[..t].iter_mut().for_each(|m| *m = 0.0);
        let mut decode_time = 0.0;
        let mut steps = 0usize;
        while out.generated_ids.len() < opts.max_new_tokens {
            let pos = t + steps; // position of the token fed now
            let step = steps + 1;
            let ids = Tensor::from_i64(&[1], vec![tok]).expect("dims");
            let p = Tensor::from_i64(&[1], vec![pos as i64]).expect("dims");
            let mk = Tensor::from_f32(&[1, ml], mask.clone()).expect("dims");
            let mut inputs: Vec<(&str, &Tensor)> =
                vec![("input_ids", &ids), ("position", &p), ("attn_mask", &mk)];
            for (l, (kn, vn)) in names.iter().enumerate() {
                inputs.push((kn, &kc[l]));
                inputs.push((vn, &vc[l]));
            }
            let mut dec = self.decode.take().expect("compiled above");
            dec.set_report_context(Some(format!("decode step {step}, position {pos}")));
            let t1 = Instant::now();
            let r = self.run_step(&mut dec, Step::Decode(step), &inputs, &mut hook);
            self.reports.extend_from_slice(dec.nan_reports());
            self.decode = Some(dec);
            let r = r.map_err(rt(&format!("decode step {step}, position {pos}")))?;
            decode_time += t1.elapsed().as_secs_f64();
            steps += 1;
            for l in 0..cfg.layers {
                // new rows [nkv, 1, hd] into column/row `pos`
                scatter(kc[l].data_mut(), r[1 + 2 * l].data(), |i| {
                    let (kv, j) = (i / hd, i % hd);
                    kv * hd * ml + j * ml + pos
                });
                scatter(vc[l].data_mut(), r[2 + 2 * l].data(), |i| {
                    let (kv, j) = (i / hd, i % hd);
                    kv * ml * hd + pos * hd + j
                });
            }
            if pos < ml {
                mask[pos] = 0.0;
            }
            let logits = r[0].data().to_f32_vec();
            warned = warn_nan_logits(&logits, &format!("decode step {step}"), warned);
            tok = opts.sampler.pick(&logits, &mut rng) as i64;
            out.generated_ids.push(tok);
            on_token(self, tok);
            if stop(tok) {
                break;
            }
        }
        if steps > 0 {
            out.decode_tokens_per_s = steps as f64 / decode_time.max(1e-9);
        }
        out.text = self.decode_text(&out.generated_ids)?;
        Ok(out)
    }
}
