//! `config.json` of a Hugging Face causal LM, read with serde.

use crate::ModelError;
use rlx_ir::DType;
use serde::Deserialize;
use std::path::Path;

/// The architecture families RLX builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (Llama 2/3), `MistralForCausalLM`: no q/k norms.
    Llama,
    /// `Qwen2ForCausalLM` (Qwen2/2.5): Llama with q/k/v biases.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm per head on q and k (`self_attn.q_norm`, `k_norm`).
    Qwen3,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub(crate) struct RopeParams {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    type_: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Ids {
    One(i64),
    Many(Vec<i64>),
}

#[derive(Debug, Clone, Deserialize)]
struct Raw {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParams>,
    rope_scaling: Option<RopeParams>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    eos_token_id: Option<Ids>,
}

/// The fields of `config.json` the builders use. Dimensions: `hidden` = `hidden_size`,
/// `heads` × `head_dim` is the query width, `kv_heads` × `head_dim` the key/value width.
#[derive(Debug, Clone)]
pub struct LlmConfig {
    pub family: Family,
    /// `model_type` as written (`"qwen3"`, `"llama"`, ...).
    pub model_type: String,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    /// Llama 3 frequency scaling: (factor, low_freq_factor, high_freq_factor, original max
    /// positions), when `rope_type` is `"llama3"`.
    pub llama3_scaling: Option<(f64, f64, f64, f64)>,
    pub tie_embeddings: bool,
    pub max_positions: usize,
    /// q/k/v projections carry biases (Qwen2, `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (`attention_bias`).
    pub o_bias: bool,
    /// The checkpoint's dtype (`dtype` / `torch_dtype`), f32 when absent.
    pub dtype: DType,
    /// Token ids that end generation.
    pub eos: Vec<i64>,
}

impl LlmConfig {
    /// Read and check `dir/config.json`.
    ///
    /// Errors: [`ModelError::Io`] (missing), [`ModelError::Config`] (bad JSON, a missing or
    /// inconsistent field), [`ModelError::Unsupported`] (another architecture, an activation
    /// other than SiLU, a rope scaling other than Llama 3's, MLP biases).
    pub fn load(dir: &Path) -> Result<LlmConfig, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io {
            path: path.clone(),
            msg: format!("cannot read config.json: {e}"),
        })?;
        let raw: Raw = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let cfg_err = |msg: String| ModelError::Config {
            path: path.clone(),
            msg,
        };
        let unsup = |msg: String| ModelError::Unsupported {
            path: path.clone(),
            msg,
        };
        let model_type = raw.model_type.clone().unwrap_or_default();
        let arch = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .unwrap_or_default();
        let family = match (model_type.as_str(), arch.as_str()) {
            ("qwen3", _) | (_, "Qwen3ForCausalLM") => Family::Qwen3,
            ("qwen2", _) | (_, "Qwen2ForCausalLM") => Family::Qwen2,
            ("llama" | "mistral", _) | (_, "LlamaForCausalLM" | "MistralForCausalLM") => {
                Family::Llama
            }
            _ => {
                return Err(unsup(format!(
                    "model_type {model_type:?} (architectures {arch:?}); supported: llama, mistral, qwen2, qwen3"
                )))
            }
        };
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(unsup(format!("hidden_act {act:?}; supported: silu")));
            }
        }
        if raw.mlp_bias == Some(true) {
            return Err(unsup("mlp_bias true".into()));
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || raw.num_hidden_layers == 0
        {
            return Err(cfg_err(format!(
                "num_attention_heads {heads} must be a positive multiple of num_key_value_heads {kv_heads}, and num_hidden_layers positive"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if head_dim == 0
            || !head_dim.is_multiple_of(2)
            || raw.hidden_size == 0
            || raw.vocab_size == 0
        {
            return Err(cfg_err(format!(
                "head_dim {head_dim} must be even and positive, hidden_size and vocab_size positive"
            )));
        }
        let rope = raw
            .rope_parameters
            .clone()
            .or(raw.rope_scaling.clone())
            .unwrap_or_default();
        let rope_theta = raw.rope_theta.or(rope.rope_theta).unwrap_or(10000.0);
        let rtype = rope
            .rope_type
            .clone()
            .or(rope.type_.clone())
            .unwrap_or_else(|| "default".into());
        let llama3_scaling = match rtype.as_str() {
            "default" => None,
            "llama3" => Some((
                rope.factor.unwrap_or(8.0),
                rope.low_freq_factor.unwrap_or(1.0),
                rope.high_freq_factor.unwrap_or(4.0),
                rope.original_max_position_embeddings.unwrap_or(8192.0),
            )),
            other => {
                return Err(unsup(format!(
                    "rope type {other:?}; supported: default, llama3"
                )))
            }
        };
        let dt = raw
            .dtype
            .or(raw.torch_dtype)
            .unwrap_or_else(|| "float32".into());
        let dtype = match dt.as_str() {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "bfloat16" => DType::BF16,
            other => return Err(unsup(format!("dtype {other:?}"))),
        };
        let ab = raw.attention_bias.unwrap_or(false);
        Ok(LlmConfig {
            family,
            model_type,
            hidden: raw.hidden_size,
            intermediate: raw.intermediate_size,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            vocab: raw.vocab_size,
            rms_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            llama3_scaling,
            tie_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_positions: raw.max_position_embeddings.unwrap_or(4096),
            qkv_bias: ab || family == Family::Qwen2,
            o_bias: ab,
            dtype,
            eos: match raw.eos_token_id {
                Some(Ids::One(i)) => vec![i],
                Some(Ids::Many(v)) => v,
                None => vec![],
            },
        })
    }

    /// The rotary inverse frequencies (`head_dim / 2` of them) as transformers computes them
    /// (`1 / theta^(2i/d)`, then Llama 3's smoothing between the low- and high-frequency
    /// wavelengths when configured).
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim;
        let base: Vec<f64> = (0..d / 2)
            .map(|i| {
                // transformers computes this in float32
                let e = ((2 * i) as f32 / d as f32) as f64;
                (1.0f32 / (self.rope_theta as f32).powf(e as f32)) as f64
            })
            .collect();
        let Some((factor, low, high, orig)) = self.llama3_scaling else {
            return base;
        };
        let low_wl = orig / low;
        let high_wl = orig / high;
        base.iter()
            .map(|&f| {
                let wl = 2.0 * std::f64::consts::PI / f;
                if wl < high_wl {
                    f
                } else if wl > low_wl {
                    f / factor
                } else {
                    let s = (orig / wl - low) / (high - low);
                    (1.0 - s) * f / factor + s * f
                }
            })
            .collect()
    }
}
