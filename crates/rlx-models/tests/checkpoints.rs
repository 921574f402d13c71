//! The tiny checkpoints of scripts/gen_tiny_llms.py against transformers' own results
//! (logits.npy, generate.json); bad folders against the errors they must give.

use rlx_ir::DType;
use rlx_models::{GenOptions, Generator, ModelError, Sampler};
use rlx_runtime::Device;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture folder, or `None` (skipped, one line on stderr) when it was not generated;
/// a failure under `RLX_REQUIRE_FIXTURES=1`.
fn fixture(name: &str) -> Option<PathBuf> {
    let p = repo().join("fixtures/llm").join(name);
    if p.join("config.json").exists() {
        return Some(p);
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
        panic!(
            "fixture {} is missing (run scripts/gen_tiny_llms.py)",
            p.display()
        );
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipping {}: fixture {} not generated (scripts/gen_tiny_llms.py)",
        std::thread::current().name().unwrap_or("?"),
        p.display()
    );
    None
}

fn npy_f32(p: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(p).unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let dims = npy.shape().iter().map(|&d| d as usize).collect();
    (dims, npy.into_vec::<f32>().unwrap())
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn check_logits(name: &str, dtype: DType, file: &str, rtol: f32, atol_frac: f32) {
    let Some(dir) = fixture(name) else { return };
    let g = Generator::open(&dir, Some(dtype), Device::Cpu, 64).unwrap();
    let gen = json(&dir.join("generate.json"));
    let prompt = ids(&gen["prompt_ids"]);
    // the Rust tokenizer gives transformers' (Python tokenizers') ids
    assert_eq!(g.encode(gen["prompt"].as_str().unwrap()).unwrap(), prompt);
    let got = g.prompt_logits(&prompt).unwrap();
    let (dims, want) = npy_f32(&dir.join(file));
    assert_eq!(got.dims(), dims.as_slice());
    let got = got.data().to_f32_vec();
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut worst = 0f32;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let err = (a - b).abs();
        let tol = rtol * b.abs() + atol_frac * scale;
        assert!(
            err <= tol,
            "{name} {dtype:?}: logit {i}: rlx {a} vs transformers {b}"
        );
        worst = worst.max(err / scale);
    }
    eprintln!("{name} {dtype:?}: worst |diff| / max|logit| = {worst:.2e}");
}

#[test]
fn qwen3_logits_match_transformers_f32() {
    check_logits("qwen3-tiny", DType::F32, "logits.npy", 1e-4, 1e-6);
}

#[test]
fn llama_bf16_sharded_logits_match_transformers_f32() {
    check_logits("llama-tiny", DType::F32, "logits.npy", 1e-4, 1e-6);
}

#[test]
fn llama_bf16_run_matches_transformers_bf16() {
    // bfloat16 has 8 bits of mantissa: each op rounds; compare at bf16's scale.
    check_logits("llama-tiny", DType::BF16, "logits_bf16.npy", 0.0, 3e-2);
}

fn greedy(name: &str, dtype: DType) -> Option<(Vec<i64>, Vec<i64>)> {
    let dir = fixture(name)?;
    let gen = json(&dir.join("generate.json"));
    let prompt = ids(&gen["prompt_ids"]);
    let want = ids(&gen["generated_ids"]);
    let mut g = Generator::open(&dir, Some(dtype), Device::Cpu, prompt.len() + want.len()).unwrap();
    let opts = GenOptions {
        max_new_tokens: want.len(),
        sampler: Sampler::greedy(),
        stop_at_eos: true,
    };
    let mut streamed = vec![];
    let out = g
        .generate(&prompt, &opts, &mut |_, t| streamed.push(t))
        .unwrap();
    assert_eq!(streamed, out.generated_ids);
    Some((out.generated_ids, want))
}

#[test]
fn qwen3_greedy_32_tokens_equal_transformers_generate() {
    if let Some((got, want)) = greedy("qwen3-tiny", DType::F32) {
        assert_eq!(want.len(), 32);
        assert_eq!(got, want);
    }
}

#[test]
fn llama_greedy_32_tokens_equal_transformers_generate() {
    if let Some((got, want)) = greedy("llama-tiny", DType::F32) {
        assert_eq!(want.len(), 32);
        assert_eq!(got, want);
    }
}

#[test]
fn bf16_generation_runs() {
    if let Some((got, want)) = greedy("llama-tiny", DType::BF16) {
        assert_eq!(got.len(), want.len());
        // bf16 round-off may change a later token; the first ones agree with f32's.
        assert_eq!(got[0], want[0]);
    }
}

#[test]
fn sampling_is_seeded() {
    let Some(dir) = fixture("qwen3-tiny") else {
        return;
    };
    let mut g = Generator::open(&dir, Some(DType::F32), Device::Cpu, 40).unwrap();
    let p = g.encode("the cat sat").unwrap();
    let opts = |seed| GenOptions {
        max_new_tokens: 12,
        sampler: Sampler {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            seed,
        },
        stop_at_eos: false,
    };
    let a = g.generate(&p, &opts(7), &mut |_, _| {}).unwrap();
    let b = g.generate(&p, &opts(7), &mut |_, _| {}).unwrap();
    assert_eq!(a.generated_ids, b.generated_ids);
    assert_eq!(a.generated_ids.len(), 12);
}
