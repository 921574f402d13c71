//! `rlx env` and the registry behind it (`rlx_ir::env::VARS`): every `"RLX_..."` string
//! literal in the source tree must be registered, every registered name must be read
//! somewhere, and no reader may bypass the registry, so the table cannot drift from the code.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Source files: every .rs under crates/, the Python and shell scripts, .ci/run, bench/.
fn sources() -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![
        repo().join("crates"),
        repo().join("scripts"),
        repo().join("bench"),
        repo().join(".ci"),
    ];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if !["target", ".venv", "node_modules", "__pycache__"].contains(&name.as_str())
                    && !name.starts_with('.')
                {
                    stack.push(p);
                }
            } else if p
                .extension()
                .is_some_and(|x| x == "rs" || x == "py" || x == "sh")
                || name == "run"
                || p.parent().is_some_and(|d| d.ends_with("scripts"))
            {
                out.push(p);
            }
        }
    }
    out
}

/// `"RLX_[A-Z0-9_]+"` string literals in `text` (quoted by " or ').
fn literals(text: &str) -> Vec<String> {
    let mut v = vec![];
    let b = text.as_bytes();
    for (i, _) in text.match_indices("RLX_") {
        if i == 0 || !(b[i - 1] == b'"' || b[i - 1] == b'\'') {
            continue;
        }
        let end = text[i..]
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .map_or(text.len(), |k| i + k);
        if end < text.len() && b[end] == b[i - 1] && end > i + 4 {
            v.push(text[i..end].to_string());
        }
    }
    v
}

fn is_env_rs(p: &Path) -> bool {
    p.ends_with("crates/rlx-ir/src/env.rs")
}

#[test]
fn every_rlx_variable_literal_is_registered() {
    let mut missing = vec![];
    let files = sources();
    assert!(
        files.len() > 50,
        "source scan found only {} files",
        files.len()
    );
    for p in &files {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for name in literals(&text) {
            if rlx_ir::env::lookup(&name).is_none() {
                missing.push(format!("{name} ({})", p.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "RLX_* variables read in the code but missing from rlx_ir::env::VARS (add them there):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_registered_variable_is_used_somewhere() {
    let mut all = String::new();
    for p in sources().iter().filter(|p| !is_env_rs(p)) {
        if let Ok(t) = std::fs::read_to_string(p) {
            all.push_str(&t);
        }
    }
    for v in rlx_ir::env::VARS {
        assert!(
            all.contains(v.name),
            "{} is in rlx_ir::env::VARS but nothing reads it: remove it from the registry",
            v.name
        );
    }
}

#[test]
fn no_reader_bypasses_the_registry() {
    let mut bad = vec![];
    for p in sources()
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "rs") && !is_env_rs(p))
    {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for (k, line) in text.lines().enumerate() {
            let l = line.replace(' ', "");
            if l.contains("env::var(\"RLX_") || l.contains("env::var_os(\"RLX_") {
                bad.push(format!("{}:{}: {}", p.display(), k + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "read RLX_* variables through rlx_ir::env::get/get_os/is_on:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn rlx_env_prints_every_variable_with_its_current_value() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .arg("env")
        .env("RLX_FILTERED_OPS_TO_PRINT", "layer?.attn.*")
        .env_remove("RLX_DEBUG_NANS")
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for v in rlx_ir::env::VARS {
        assert!(out.contains(v.name), "rlx env lacks {}", v.name);
    }
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no line for {name}"))
            .to_string()
    };
    assert!(line("RLX_FILTERED_OPS_TO_PRINT").ends_with("= \"layer?.attn.*\""));
    assert!(line("RLX_DEBUG_NANS").ends_with("= (unset)"));
    // JSON form: one object per variable with name, acts, catches, cost, value
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["env", "--json"])
        .env("RLX_DEBUG_NANS", "strict")
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let arr = j.as_array().unwrap();
    assert_eq!(arr.len(), rlx_ir::env::VARS.len());
    let d = arr.iter().find(|v| v["name"] == "RLX_DEBUG_NANS").unwrap();
    assert_eq!(d["value"], "strict");
    for k in ["acts", "catches", "cost", "values", "scope"] {
        assert!(d[k].as_str().is_some_and(|s| !s.is_empty()), "{k}");
    }
}

/// `rlx env`'s RLX_CPU_FUSION text names every fusion that `RLX_CPU_FUSION=0` turns off:
/// each kind of fused step of the CPU executor's plan (`rlx_cpu` `steps::Step`: conv
/// groups with their residual Add, 1x1 + depthwise pairs and scale Muls, row groups,
/// elementwise chains, Transposes read in place; counted by `CpuExecutor::fused_row_groups`,
/// `paired_convs`, `scaled_convs`, `fused_chains`, `transposes_read_in_place`). It named
/// only the conv epilogue and the row groups.
#[test]
fn cpu_fusion_text_names_every_fusion_it_turns_off() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["env", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let v = j
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "RLX_CPU_FUSION")
        .expect("RLX_CPU_FUSION in rlx env");
    let text = v["catches"].as_str().unwrap();
    for what in [
        "BatchNorm",
        "Relu, SiLU or Clip",
        "residual Add",
        "RLX_CPU_RESIDUAL",
        "MaxPool",
        "RLX_CPU_CONV_POOL",
        "depthwise",
        "RLX_CPU_PWDW",
        "scale Mul",
        "Softmax",
        "LayerNorm",
        "RMSNorm",
        "elementwise",
        "Transpose",
        "MatMul",
    ] {
        assert!(
            text.contains(what),
            "RLX_CPU_FUSION's text lacks {what:?}: {text}"
        );
    }
}
