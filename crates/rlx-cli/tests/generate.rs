//! `rlx-run qwen3` / `rlx generate` on the tiny checkpoints of scripts/gen_tiny_llms.py:
//! greedy tokens against transformers' `generate`, NaN reports with the decode step, errors.

mod common;

use std::process::Command;

fn json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn rlx_run_qwen3_greedy_equals_transformers_and_writes_json() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    let want = json(&dir.join("generate.json"));
    let out = std::env::temp_dir().join(format!("rlx-gen-{}.json", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_rlx-run"))
        .args(["qwen3", "--model"])
        .arg(&dir)
        .args(["--prompt", want["prompt"].as_str().unwrap()])
        .args(["--max-new-tokens", "32", "--temperature", "0", "--json"])
        .arg(&out)
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("tokens/s"), "{err}");
    let got = json(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(got["prompt_ids"], want["prompt_ids"]);
    assert_eq!(got["generated_ids"], want["generated_ids"]);
    assert!(got["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(got["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(got["text"].is_string());
}

#[test]
fn rlx_generate_takes_the_family_from_config_and_runs_bf16() {
    let Some(dir) = common::fixture("fixtures/llm/llama-tiny") else {
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args([
            "--prompt",
            "the cat",
            "--max-new-tokens",
            "8",
            "--dtype",
            "bf16",
        ])
        .args([
            "--temperature",
            "0.7",
            "--top-k",
            "20",
            "--top-p",
            "0.9",
            "--seed",
            "5",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // `rlx-run qwen3` on a Llama folder is refused by name
    let o = Command::new(env!("CARGO_BIN_EXE_rlx-run"))
        .args(["qwen3", "--model"])
        .arg(&dir)
        .args(["--prompt", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("config.json") && err.contains("\"llama\""),
        "{err}"
    );
}

#[test]
fn debug_nans_names_the_checkpoint_module_and_the_decode_step() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-f16-overflow") else {
        return;
    };
    let exp = json(&dir.join("expected_report.json"));
    let module = exp["inf_module"].as_str().unwrap();
    let run = |mode: &str| {
        Command::new(env!("CARGO_BIN_EXE_rlx-run"))
            .args(["qwen3", "--model"])
            .arg(&dir)
            .args(["--prompt", exp["prompt"].as_str().unwrap()])
            .args(["--max-new-tokens", "4", "--dtype", "f16", "--ignore-eos"])
            .env("RLX_DEBUG_NANS", mode)
            .output()
            .unwrap()
    };
    let o = run("1");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("\"{module}\" (prefill)")), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("rlx nan-check:")
            && l.contains(&format!("\"{module}\" (decode step"))
            && l.contains(", position ")),
        "{err}"
    );
    // abort stops generation at the first report: exit 3, nothing decoded
    let o = run("abort");
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("generation stopped at prefill"), "{err}");
}

#[test]
fn a_bad_folder_is_one_error_line() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    let d = std::env::temp_dir().join(format!("rlx-gen-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(dir.join(f), d.join(f)).unwrap();
    }
    let b = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &b[..100]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["generate", "--model"])
        .arg(&d)
        .args(["--prompt", "x"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("model.safetensors") && err.contains("not a valid safetensors"),
        "{err}"
    );
}
