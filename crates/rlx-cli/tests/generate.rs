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
    assert!(err.contains("rlx: loaded in "), "{err}");
    let got = json(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(got["prompt_ids"], want["prompt_ids"]);
    assert_eq!(got["generated_ids"], want["generated_ids"]);
    assert!(got["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(got["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(got["load_s"].as_f64().unwrap() > 0.0);
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

// ---- Debugging while generating (issue 31 item 3) ----
// References: fixtures/llm/qwen3-tiny/module_stats.json, written by scripts/gen_tiny_llms.py
// from transformers' forward hooks on the full sequence (never from RLX's output).

/// `rlx generate` on qwen3-tiny, greedy, past EOS, with `env` set.
fn generate(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let prompt = json(&dir.join("generate.json"))["prompt"].clone();
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlx"));
    c.args(["generate", "--model"])
        .arg(dir)
        .args(["--prompt", prompt.as_str().unwrap()])
        .arg("--ignore-eos")
        .args(extra);
    for v in [
        "RLX_DEBUG_NANS",
        "RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER",
        "RLX_FILTERED_OPS_TO_PRINT",
        "RLX_LINT_NUMERICS",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The reference statistics of `module`'s output in run `run` (`prefill`,
/// `decode step 3, position 24`).
fn reference(dir: &std::path::Path, run: &str, module: &str) -> serde_json::Value {
    let s = json(&dir.join("module_stats.json"));
    s["runs"][run][module].clone()
}

/// The run names module_stats.json holds, prefill first.
fn runs(dir: &std::path::Path) -> Vec<String> {
    let s = json(&dir.join("module_stats.json"));
    let mut v: Vec<String> = s["runs"].as_object().unwrap().keys().cloned().collect();
    v.sort_by_key(|k| (k != "prefill", k.clone()));
    v
}

fn close(what: &str, got: f64, want: f64) {
    // printed with 6 significant digits; f32 sums in another order than torch's
    let tol = 2e-5 + 1e-4 * want.abs();
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, transformers {want}"
    );
}

/// `key=value` of a printer line.
fn field(line: &str, key: &str) -> f64 {
    let at = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("{key} in {line}"));
    let rest = &line[at + key.len() + 2..];
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn printer_filter_takes_module_paths_and_names_the_run() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    let t = json(&dir.join("generate.json"))["prompt_ids"]
        .as_array()
        .unwrap()
        .len();
    let o = generate(
        &dir,
        &["--max-new-tokens", "3"],
        &[
            ("RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER", "1"),
            ("RLX_FILTERED_OPS_TO_PRINT", "model.layers.1.mlp"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx print:"))
        .collect();
    assert!(!lines.is_empty(), "{err}");
    for l in &lines {
        let label = l.split('"').nth(1).unwrap();
        assert!(
            label == "model.layers.1.mlp" || label.starts_with("model.layers.1.mlp."),
            "the filter selects the module and what is inside it only: {l}"
        );
    }
    // every run prints, named as NaN reports name it
    let ctx = [
        "(prefill)".to_string(),
        format!("(decode step 1, position {t})"),
        format!("(decode step 2, position {})", t + 1),
    ];
    for c in &ctx {
        for m in [
            "model.layers.1.mlp.gate_proj",
            "model.layers.1.mlp.act_fn",
            "model.layers.1.mlp.down_proj",
        ] {
            assert!(
                lines.iter().any(|l| l.contains(&format!("\"{m}\" {c} "))),
                "{m} {c}: {err}"
            );
        }
    }
    assert!(!err.contains("decode step 3"), "{err}");
    // the values are the module's: down_proj of the prefill against transformers
    let want = reference(&dir, "prefill", "model.layers.1.mlp.down_proj");
    let l = lines
        .iter()
        .find(|l| l.contains("\"model.layers.1.mlp.down_proj\" (prefill) "))
        .unwrap();
    assert!(l.contains(&format!("f32[{t},64]")), "{l}");
    for k in ["min", "max", "mean"] {
        close(
            &format!("prefill down_proj {k}"),
            field(l, k),
            want[k].as_f64().unwrap(),
        );
    }
}

#[test]
fn print_step_prints_one_decode_step_only() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    let run = runs(&dir)
        .into_iter()
        .find(|r| r.starts_with("decode step 3,"))
        .unwrap();
    // the printer variable unset: --print-step prints at level 1; a glob filter
    let o = generate(
        &dir,
        &["--max-new-tokens", "5", "--print-step", "3"],
        &[(
            "RLX_FILTERED_OPS_TO_PRINT",
            "model.layers.?.mlp.down_proj,lm_head",
        )],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx print:"))
        .collect();
    assert_eq!(lines.len(), 3, "two down_proj and lm_head, once: {err}");
    assert!(
        lines.iter().all(|l| l.contains(&format!("({run})"))),
        "{err}"
    );
    for m in ["model.layers.1.mlp.down_proj", "lm_head"] {
        let want = reference(&dir, &run, m);
        let l = lines
            .iter()
            .find(|l| l.contains(&format!("\"{m}\"")))
            .unwrap();
        for k in ["min", "max", "mean"] {
            close(
                &format!("{run} {m} {k}"),
                field(l, k),
                want[k].as_f64().unwrap(),
            );
        }
    }
    // a step the generation does not reach is refused before loading, naming the flag
    let o = generate(&dir, &["--max-new-tokens", "4", "--print-step", "4"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--print-step 4") && err.contains("decode steps 1..3"),
        "{err}"
    );
    let o = generate(&dir, &["--print-step", "first"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--print-step \"first\": expected `prefill`")
    );
}

#[test]
fn trace_records_the_prefill_or_a_decode_step_with_module_paths() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    let base = std::env::temp_dir().join(format!("rlx-gen-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let mut lm_head_max = vec![];
    for run in runs(&dir) {
        let step = if run == "prefill" {
            "prefill".to_string()
        } else {
            run["decode step ".len()..]
                .split(',')
                .next()
                .unwrap()
                .to_string()
        };
        let out = base.join(&step);
        let o = generate(
            &dir,
            &[
                "--max-new-tokens",
                "5",
                "--trace",
                out.to_str().unwrap(),
                "--trace-step",
                &step,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(&format!("ops recorded ({run})")), "{err}");
        let tr = json(&out.join("trace.json"));
        assert_eq!(tr["context"], run.as_str());
        assert!(tr["first_nonfinite"].is_null());
        let html = std::fs::read_to_string(out.join("trace.html")).unwrap();
        assert!(html.contains(&format!("<b id=\"context\">{run}</b>")));
        let ops = tr["ops"].as_array().unwrap();
        // names are module paths (and the decode step's inputs: its KV caches)
        assert!(ops
            .iter()
            .any(|o| o["label"] == "model.layers.0.self_attn.q_norm"));
        assert_eq!(
            ops.iter().any(|o| o["label"] == "past_key.1"),
            run != "prefill",
            "{run}"
        );
        for m in [
            "model.embed_tokens",
            "model.layers.0.self_attn.o_proj",
            "model.layers.1.mlp.down_proj",
            "lm_head",
        ] {
            let want = reference(&dir, &run, m);
            let got = ops
                .iter()
                .find(|o| o["label"] == m && (o["op"] == "MatMul" || o["op"] == "Gather"))
                .unwrap_or_else(|| panic!("{run}: no {m} op"));
            assert_eq!(got["shape"], want["shape"], "{run} {m}");
            for k in ["min", "max", "mean", "max_abs"] {
                close(
                    &format!("{run} {m} {k}"),
                    got[k].as_f64().unwrap(),
                    want[k].as_f64().unwrap(),
                );
            }
            if m == "lm_head" {
                lm_head_max.push(got["max"].as_f64().unwrap());
            }
        }
    }
    assert!(lm_head_max.len() >= 3);
    assert!(
        lm_head_max[0] != lm_head_max[1] && lm_head_max[1] != lm_head_max[2],
        "each run's own logits: {lm_head_max:?}"
    );
    // errors name the flag: a step past the generation, a file for the folder
    let o = generate(
        &dir,
        &[
            "--max-new-tokens",
            "2",
            "--trace",
            base.join("x").to_str().unwrap(),
            "--trace-step",
            "2",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--trace-step 2: a generation of --max-new-tokens 2 has decode steps 1..1"),
        "{err}"
    );
    let file = base.join("file");
    std::fs::write(&file, b"x").unwrap();
    let o = generate(
        &dir,
        &["--max-new-tokens", "2", "--trace", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--trace") && err.contains("is a file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn temperature_zero_is_greedy_and_a_bad_temperature_is_one_error() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    for t in ["-1", "nan", "-0.5", "inf"] {
        let o = generate(&dir, &["--max-new-tokens", "2", "--temperature", t], &[]);
        assert_eq!(o.status.code(), Some(1), "{t}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--temperature") && err.contains("0 is greedy"),
            "{err}"
        );
    }
    // T = 0 never divides: the logits' argmax, transformers' greedy tokens (with NaN
    // reporting on, nothing is reported)
    let want = json(&dir.join("generate.json"));
    let out = std::env::temp_dir().join(format!("rlx-gen-t0-{}.json", std::process::id()));
    let o = generate(
        &dir,
        &[
            "--max-new-tokens",
            "8",
            "--temperature",
            "0",
            "--json",
            out.to_str().unwrap(),
        ],
        &[("RLX_DEBUG_NANS", "abort")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("nan-check"), "{err}");
    let got = json(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        got["generated_ids"].as_array().unwrap()[..],
        want["generated_ids"].as_array().unwrap()[..8]
    );
}

/// Write `src` (a safetensors file) to `dst` with element `k` of f32 tensor `name` set to `v`.
fn plant(src: &std::path::Path, dst: &std::path::Path, name: &str, k: usize, v: f32) {
    let mut b = std::fs::read(src).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    assert_eq!(h[name]["dtype"], "F32");
    let start = h[name]["data_offsets"][0].as_u64().unwrap() as usize + 8 + n + 4 * k;
    b[start..start + 4].copy_from_slice(&v.to_le_bytes());
    std::fs::write(dst, b).unwrap();
}

#[test]
fn lint_and_nan_check_name_a_planted_weight_while_generating() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    // the clean checkpoint: the lint runs on both graphs and finds nothing
    let o = generate(
        &dir,
        &["--max-new-tokens", "2"],
        &[("RLX_LINT_NUMERICS", "1")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("rlx numeric-lint: prefill graph: no constant folds to NaN/Inf"),
        "{err}"
    );
    assert!(
        err.contains("rlx numeric-lint: decode graph: no constant folds to NaN/Inf"),
        "{err}"
    );
    // a NaN planted in one weight of the file
    let d = std::env::temp_dir().join(format!("rlx-gen-plant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["config.json", "tokenizer.json", "generate.json"] {
        std::fs::copy(dir.join(f), d.join(f)).unwrap();
    }
    let w = "model.layers.1.mlp.down_proj.weight";
    plant(
        &dir.join("model.safetensors"),
        &d.join("model.safetensors"),
        w,
        5,
        f32::NAN,
    );
    let o = generate(
        &d,
        &["--max-new-tokens", "3"],
        &[("RLX_LINT_NUMERICS", "1")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    for g in ["prefill", "decode"] {
        assert!(
            err.contains(&format!("rlx numeric-lint: {g} graph: 1 lint(s)")),
            "{err}"
        );
    }
    assert!(
        err.lines()
            .any(|l| l.starts_with("rlx numeric-lint: %") && l.contains(&format!("\"{w}\""))),
        "{err}"
    );
    // the localizer names the tensor too, in the prefill and at each decode step
    let o = generate(&d, &["--max-new-tokens", "3"], &[("RLX_DEBUG_NANS", "1")]);
    let err = String::from_utf8_lossy(&o.stderr);
    let reports: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx nan-check:") && !l.contains("note:"))
        .collect();
    assert!(
        reports
            .iter()
            .any(|l| l.contains(&format!("\"{w}\" (prefill)"))),
        "{err}"
    );
    assert!(
        reports
            .iter()
            .any(|l| l.contains(&format!("\"{w}\" (decode step 1, position "))),
        "{err}"
    );
    // abort stops at the first report (the prefill), exit 3
    let o = generate(
        &d,
        &["--max-new-tokens", "3"],
        &[("RLX_DEBUG_NANS", "abort")],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("generation stopped at prefill"));
    let _ = std::fs::remove_dir_all(&d);
}

/// A request longer than the model's positions is one error line naming the flag, before
/// any allocation (the KV cache is sized for the whole generation up front); a length that
/// overflows usize too.
#[test]
fn max_new_tokens_past_the_models_positions_is_one_error() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-tiny") else {
        return;
    };
    for n in ["100000000", "18446744073709551615"] {
        let o = generate(&dir, &["--max-new-tokens", n], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{n}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--max-new-tokens") && err.contains("max_position_embeddings"),
            "{err}"
        );
    }
}

/// NaN logits (the float16 overflow checkpoint without RLX_DEBUG_NANS) are said on stderr
/// once, pointing at RLX_DEBUG_NANS, instead of silently becoming token 0.
#[test]
fn nan_logits_are_a_warning() {
    let Some(dir) = common::fixture("fixtures/llm/qwen3-f16-overflow") else {
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args([
            "--prompt",
            "the quick brown fox jumps over the lazy dog and",
        ])
        .args(["--dtype", "f16", "--ignore-eos", "--max-new-tokens", "3"])
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let warns: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rlx: warning:"))
        .collect();
    assert_eq!(warns.len(), 1, "{err}");
    assert!(
        warns[0].contains("logits") && warns[0].contains("RLX_DEBUG_NANS=1"),
        "{err}"
    );
}
