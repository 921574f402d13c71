//! Model builders from Hugging Face checkpoints: a folder holding `config.json`,
//! `*.safetensors` (one file, or shards listed by `model.safetensors.index.json`; f32, f16 or
//! bf16) and `tokenizer.json` becomes RLX graphs for the Llama family (Llama 2/3, Qwen2/2.5,
//! Mistral) and Qwen3, every node labelled with the checkpoint's module path
//! (`model.layers.3.mlp.down_proj`), so NaN reports speak the checkpoint's names.
//!
//! Shapes are static in RLX today, so generation uses two graphs: a prefill graph for the
//! prompt's length and a decode-step graph for one token against a fixed-size KV cache
//! (`max_len` positions, masked), compiled once and run for every generated token
//! ([`Generator`]).

mod build;
mod checkpoint;
mod config;
mod generate;

pub use build::{Built, ModelGraphs};
pub use checkpoint::Checkpoint;
pub use config::{Family, LlmConfig};
pub use generate::{
    tokenize, GenOptions, Generation, Generator, GraphLints, Observer, Sampler, Step,
};

use std::path::PathBuf;

/// Everything that can go wrong loading a checkpoint folder or generating from it. Each
/// message names the file (and the tensor) it is about.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be opened or read (missing `config.json`, a shard named by the index
    /// that is not there).
    #[error("{path}: {msg}")]
    Io { path: PathBuf, msg: String },
    /// `config.json` is not valid JSON or lacks a field the architecture needs.
    #[error("{path}: not a usable config.json: {msg}")]
    Config { path: PathBuf, msg: String },
    /// The architecture is not one RLX builds.
    #[error("{path}: unsupported architecture: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    /// A safetensors file (or the index) is corrupt or truncated.
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    /// A tensor the architecture needs is in no file of the checkpoint.
    #[error("{dir}: tensor \"{tensor}\" is missing from the checkpoint ({files})")]
    MissingTensor {
        dir: PathBuf,
        tensor: String,
        files: String,
    },
    /// A tensor has another shape than config.json implies.
    #[error("{path}: tensor \"{tensor}\" has shape {got:?}, config.json implies {want:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    /// A tensor's dtype is not f32, f16 or bf16.
    #[error("{path}: tensor \"{tensor}\" has dtype {dtype}; supported: F32, F16, BF16")]
    DType {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    /// `tokenizer.json` is missing or does not load, or text does not encode/decode.
    #[error("{path}: tokenizer: {msg}")]
    Tokenizer { path: PathBuf, msg: String },
    /// A request that cannot be served (an empty prompt, a prompt longer than the cache).
    #[error("{0}")]
    Request(String),
    /// Compiling or running a graph failed (a NaN abort under `RLX_DEBUG_NANS=abort`, a
    /// device that is not available, ...).
    #[error("{context}: {source}")]
    Runtime {
        context: String,
        #[source]
        source: rlx_runtime::RuntimeError,
    },
}
