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
    let mut g = Generator::open(&dir, Some(dtype), Device::Cpu, 64).unwrap();
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

/// Weights stay in the checkpoint's layout and storage: a tied lm_head is the embedding's
/// own tensor (no transposed copy), linear weights stay `[out, in]`, and the compiled
/// prefill and decode graphs read every weight constant (each linear through a Transpose
/// that only its MatMul reads) from the loaded `Arc`, no folded copy.
#[test]
fn weights_are_shared_not_transposed_or_folded_into_copies() {
    use rlx_ir::Op;
    use rlx_runtime::Session;
    use std::sync::Arc;
    let Some(dir) = fixture("qwen3-tiny") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let g = Generator::open(&dir, Some(dtype), Device::Cpu, 16).unwrap();
        let (m, c) = (&g.graphs, g.config().clone());
        assert!(c.tie_embeddings);
        let emb = m.weight("model.embed_tokens.weight").unwrap();
        assert!(Arc::ptr_eq(m.weight("lm_head.weight").unwrap(), emb));
        assert_eq!(emb.dims(), [c.vocab, c.hidden]);
        let q = m.weight("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!(q.dims(), [c.heads * c.head_dim, c.hidden]);
        let down = m.weight("model.layers.0.mlp.down_proj.weight").unwrap();
        assert_eq!(down.dims(), [c.hidden, c.intermediate]);
        for (what, graph) in [
            ("prefill", m.prefill(5, false).unwrap().graph),
            ("decode", m.decode().unwrap().graph),
        ] {
            let cg = Session::new(Device::Cpu).try_compile(graph).unwrap();
            let gr = cg.graph();
            let mut readers = vec![vec![]; gr.len()];
            for n in &gr.nodes {
                for x in &n.inputs {
                    readers[x.index()].push(&n.op);
                }
            }
            let mut transposed = 0;
            for n in &gr.nodes {
                let Op::Constant(t) = &n.op else { continue };
                let label = n.origin.as_ref().map(|o| o.label.as_str()).unwrap_or("");
                // Every 2-D constant with both dims >= 32 (the tiny model's weights and their
                // transposes; the rope tables and the mask are 16 wide at most) is a
                // loaded weight itself.
                if t.dims().len() == 2 && t.dims().iter().all(|&d| d >= 32) {
                    let w = m.weight(label);
                    assert!(
                        w.is_some_and(|w| Arc::ptr_eq(w, t)),
                        "{what} {dtype}: constant {label:?} {:?} is a copy",
                        t.dims()
                    );
                }
                for r in &readers[n.id.index()] {
                    if matches!(r, Op::Transpose { .. }) {
                        transposed += 1;
                    }
                }
            }
            // q, k, v, o, gate, up, down per layer, and the lm_head
            assert_eq!(transposed, 7 * c.layers + 1, "{what} {dtype}");
            for n in &gr.nodes {
                if matches!(n.op, Op::Transpose { .. })
                    && matches!(gr.node(n.inputs[0]).op, Op::Constant(_))
                {
                    assert!(
                        readers[n.id.index()].iter().all(|r| **r == Op::MatMul),
                        "{what} {dtype}: a weight Transpose read by another op"
                    );
                }
            }
        }
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

#[test]
fn f16_mlp_overflow_is_reported_at_the_checkpoint_module_with_its_step() {
    let Some(dir) = fixture("qwen3-f16-overflow") else {
        return;
    };
    let exp = json(&dir.join("expected_report.json"));
    let module = exp["inf_module"].as_str().unwrap(); // from torch's forward hooks
    let prompt = ids(&exp["prompt_ids"]);
    let mut g = Generator::open(&dir, Some(DType::F16), Device::Cpu, prompt.len() + 3).unwrap();
    g.set_debug_mode(Some(rlx_ir::numeric_check::DebugMode::Warn));
    let opts = GenOptions {
        max_new_tokens: 3,
        sampler: Sampler::greedy(),
        stop_at_eos: false,
    };
    g.generate(&prompt, &opts, &mut |_, _| {}).unwrap();
    let reps = g.nan_reports();
    let text: Vec<String> = reps.iter().map(|r| r.to_string()).collect();
    let all = text.join("\n");
    // Prefill: the +inf is created at down_proj (named as the culprit or as the Inf origin
    // of the NaN it turns into), tagged "(prefill)".
    let pre: Vec<&String> = text.iter().filter(|t| t.contains("(prefill)")).collect();
    assert!(!pre.is_empty(), "no prefill report:\n{all}");
    assert!(
        pre.iter().any(|t| t.contains(&format!("\"{module}\""))),
        "prefill reports do not name {module}:\n{all}"
    );
    // A decode step k feeds the token at position len(prompt) + k - 1; the overflow
    // recurs there at down_proj, named as the op that produced the +inf.
    let n = prompt.len();
    let ok = reps.iter().any(|r| {
        r.label == module
            && r.is_culprit()
            && (1..=2).any(|k| {
                r.context.as_deref() == Some(&format!("decode step {k}, position {}", n + k - 1))
            })
    });
    assert!(
        ok,
        "no decode-step report naming {module} with its step and position:\n{all}"
    );
    // A NaN the cache carries from an earlier step is told apart from bad input data.
    for r in reps.iter().filter(|r| r.label.starts_with("past_")) {
        assert!(r.to_string().contains("KV cache"), "{r}");
    }
}

fn copy_dir(src: &Path, name: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("rlx-models-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn open_err(dir: &Path) -> String {
    match Generator::open(dir, None, Device::Cpu, 16) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => {
            let _: &ModelError = &e;
            e.to_string()
        }
    }
}

fn edit_config(dir: &Path, key: &str, v: serde_json::Value) {
    let p = dir.join("config.json");
    let mut c = json(&p);
    c[key] = v;
    std::fs::write(&p, serde_json::to_string(&c).unwrap()).unwrap();
}

#[test]
fn bad_folders_give_one_clear_error_naming_file_and_tensor() {
    let (Some(q), Some(l)) = (fixture("qwen3-tiny"), fixture("llama-tiny")) else {
        return;
    };
    // missing config.json
    let d = copy_dir(&q, "noconfig");
    std::fs::remove_file(d.join("config.json")).unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("config.json") && e.contains("cannot read"),
        "{e}"
    );
    // corrupt config.json
    std::fs::write(d.join("config.json"), "{\"hidden_size\": 64,").unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("config.json") && e.contains("not a usable config.json"),
        "{e}"
    );
    // a truncated safetensors file
    let d = copy_dir(&q, "truncated");
    let f = d.join("model.safetensors");
    let b = std::fs::read(&f).unwrap();
    std::fs::write(&f, &b[..b.len() / 2]).unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );
    // a shard missing from a sharded checkpoint
    let d = copy_dir(&l, "noshard");
    std::fs::remove_file(d.join("model-00002-of-00003.safetensors")).unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("model-00002-of-00003.safetensors") && e.contains("shard missing"),
        "{e}"
    );
    // a tensor whose shape is not what config.json implies
    let d = copy_dir(&q, "shape");
    edit_config(&d, "intermediate_size", serde_json::json!(96));
    let e = open_err(&d);
    assert!(
        e.contains("model.safetensors")
            && e.contains("\"model.layers.0.mlp.gate_proj.weight\" has shape [128, 64]")
            && e.contains("[96, 64]"),
        "{e}"
    );
    // a tensor missing (config asks for a third layer)
    let d = copy_dir(&q, "missing");
    edit_config(&d, "num_hidden_layers", serde_json::json!(3));
    let e = open_err(&d);
    assert!(
        e.contains("\"model.layers.2.input_layernorm.weight\" is missing"),
        "{e}"
    );
    // a tokenizer that does not load
    let d = copy_dir(&q, "tokenizer");
    std::fs::write(d.join("tokenizer.json"), "{\"version\": \"1.0\"}").unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("tokenizer.json") && e.contains("does not load"),
        "{e}"
    );
    // an unsupported architecture
    let d = copy_dir(&q, "arch");
    edit_config(&d, "model_type", serde_json::json!("gpt2"));
    edit_config(&d, "architectures", serde_json::json!(["GPT2LMHeadModel"]));
    let e = open_err(&d);
    assert!(
        e.contains("unsupported architecture") && e.contains("gpt2"),
        "{e}"
    );
    for n in [
        "noconfig",
        "truncated",
        "noshard",
        "shape",
        "missing",
        "tokenizer",
        "arch",
    ] {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("rlx-models-{}-{n}", std::process::id())),
        );
    }
}
