//! Which models import symbolically: for every ONNX file given (or found under the folders
//! given) whose inputs have named dims, `OnnxModel::import_symbolic` with every symbol at 2
//! (1 would take the size-1 broadcast paths), and the reason when it cannot.
//!
//! ```text
//! cargo run -p rlx-onnx-import --example symbolic_check -- fixtures examples
//! ```
use rlx_ir::Dim;
use std::path::{Path, PathBuf};

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        let mut v: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        v.sort();
        for q in v {
            walk(&q, out);
        }
    } else if p.extension().is_some_and(|e| e == "onnx") {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        walk(Path::new(&a), &mut files);
    }
    let (mut ok, mut refused, mut static_) = (0, 0, 0);
    for f in files {
        let Ok(m) = rlx_onnx_import::OnnxModel::open(&f) else {
            continue;
        };
        let named = m
            .declared_inputs()
            .iter()
            .any(|(_, s)| s.dims.iter().any(|d| matches!(d, Dim::Sym(p) if p != "?")));
        if !named {
            static_ += 1;
            continue;
        }
        let opts = rlx_onnx_import::ImportOptions {
            default_dim: 2,
            ..Default::default()
        };
        match m.import_symbolic(&opts) {
            Ok(t) => {
                ok += 1;
                let (s, a, c) = t.counts();
                println!(
                    "symbolic  {} ({s} shapes, {a} attributes, {c} values, {} guards)",
                    f.display(),
                    t.guards.len()
                );
            }
            Err(e) => {
                refused += 1;
                println!("import    {}: {e}", f.display());
            }
        }
    }
    println!("{ok} symbolic, {refused} imported per signature, {static_} without named dims");
}
