//! `rlx env`: every `RLX_*` variable the project reads, from the one registry
//! [`rlx_ir::env::VARS`], with its current value in this process's environment.

use clap::Args;
use rlx_ir::env::{EnvVar, VARS};

/// Print every RLX_* environment variable: when it acts, what it catches, its cost, its value.
#[derive(Args, Debug, Clone)]
pub struct EnvArgs {
    /// Print JSON (one object per variable) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print a Markdown table (for docs).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
}

/// The variable's current value as shown: `(unset)` when unset, `"..."` otherwise.
pub fn current(v: &EnvVar) -> String {
    match rlx_ir::env::get_os(v.name) {
        None => "(unset)".into(),
        Some(s) => format!("{:?}", s.to_string_lossy()),
    }
}

/// The table as text: one block per variable (the columns are too wide for one line each).
pub fn render_text() -> String {
    let mut out = String::new();
    let w = VARS.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut scope = None;
    for v in VARS {
        if scope != Some(v.scope) {
            scope = Some(v.scope);
            out.push_str(&format!("== {} ==\n", v.scope.as_str()));
        }
        out.push_str(&format!(
            "{:<w$}  = {}\n{:<w$}    values: {}\n{:<w$}    acts:   {}\n{:<w$}    does:   {}\n{:<w$}    cost:   {}\n",
            v.name,
            current(v),
            "",
            v.values,
            "",
            v.acts,
            "",
            v.catches,
            "",
            v.cost
        ));
    }
    out
}

/// The table in Markdown.
pub fn render_markdown() -> String {
    let mut out = String::from(
        "| variable | values | when it acts | what it catches | cost when on | current value |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for v in VARS {
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} | {} |\n",
            v.name,
            v.values,
            v.acts,
            v.catches.replace('|', "\\|"),
            v.cost.replace('|', "\\|"),
            current(v).replace('|', "\\|")
        ));
    }
    out
}

/// The table as JSON.
pub fn render_json() -> serde_json::Value {
    serde_json::Value::Array(
        VARS.iter()
            .map(|v| {
                serde_json::json!({
                    "name": v.name,
                    "scope": v.scope.as_str(),
                    "values": v.values,
                    "acts": v.acts,
                    "catches": v.catches,
                    "cost": v.cost,
                    "value": rlx_ir::env::get_os(v.name).map(|s| s.to_string_lossy().into_owned()),
                })
            })
            .collect(),
    )
}

/// Entry point of `rlx env`; returns the exit status.
pub fn main_env(a: EnvArgs) -> i32 {
    if a.json {
        match serde_json::to_string_pretty(&render_json()) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("rlx: error: {e}");
                return 1;
            }
        }
    } else if a.markdown {
        print!("{}", render_markdown());
    } else {
        print!("{}", render_text());
    }
    0
}
