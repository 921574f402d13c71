//! No two kernel files import each other, directly or round a longer loop (issue 34: the
//! kernels are read one family at a time, and a loop means neither side can be read, moved
//! or tested alone).
//!
//! Reads `src/kernels/**/*.rs` as text: a file's imports are the sibling modules it names
//! as `super::X::` / `super::X;` (`super` of a file other than `mod.rs` is its folder), or
//! by the whole path `crate::kernels::...::X::`. Comment lines are skipped; a file's own
//! folder (`mod.rs`, the parent) and test files (`tests.rs`, `*_tests.rs`) are left out.
//! Fails naming the loop's files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("kernels folder") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `conv/packed.rs` -> `conv/packed`; `simd/mod.rs` -> `simd`.
fn module_of(rel: &Path) -> String {
    let s = rel.with_extension("").to_string_lossy().replace('\\', "/");
    s.strip_suffix("/mod").unwrap_or(&s).to_string()
}

/// The identifier at the start of `s` (letters, digits, `_`).
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules `text` (the file of module `m`) names, among `known`.
fn imports(m: &str, is_mod_rs: bool, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    // The folder `super::` names from this file (from a `mod.rs`, the folder above: its
    // parent, skipped below).
    let folder = m.rsplit_once('/').map_or("", |(d, _)| d).to_string();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("//") {
            continue;
        }
        let mut add = |path: String| {
            // The longest known module the path starts with.
            let mut best = None;
            let mut cur = String::new();
            for part in path.split("::") {
                if !cur.is_empty() {
                    cur.push('/');
                }
                cur.push_str(part);
                if known.contains(&cur) {
                    best = Some(cur.clone());
                }
            }
            if let Some(b) = best {
                if b != m {
                    out.insert(b);
                }
            }
        };
        for (i, _) in l.match_indices("super::") {
            if is_mod_rs {
                continue;
            }
            let rest = &l[i + "super::".len()..];
            let name = ident(rest);
            if !name.is_empty() && name != "super" {
                let p = if folder.is_empty() {
                    name.to_string()
                } else {
                    format!("{folder}::{name}")
                };
                add(p.replace('/', "::"));
            }
        }
        for (i, _) in l.match_indices("crate::kernels::") {
            let rest = &l[i + "crate::kernels::".len()..];
            let mut parts = Vec::new();
            let mut r = rest;
            loop {
                let name = ident(r);
                if name.is_empty() {
                    break;
                }
                parts.push(name);
                match r[name.len()..].strip_prefix("::") {
                    Some(next) => r = next,
                    None => break,
                }
            }
            if !parts.is_empty() {
                add(parts.join("::"));
            }
        }
    }
    out
}

#[test]
fn no_two_kernel_files_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let mut text = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy().to_string();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let m = module_of(rel);
        text.insert(m, (name == "mod.rs", std::fs::read_to_string(f).unwrap()));
    }
    assert!(
        text.len() > 30,
        "read only {} kernel files under {root:?}",
        text.len()
    );
    let known: BTreeSet<String> = text.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, (is_mod, t)) in &text {
        // A module's own folder (its parent `mod.rs`) and its children are not loops.
        let deps = imports(m, *is_mod, t, &known)
            .into_iter()
            .filter(|d| !m.starts_with(&format!("{d}/")) && !d.starts_with(&format!("{m}/")))
            .collect();
        edges.insert(m.clone(), deps);
    }
    // The importer-side check itself: conv/packed.rs imports conv/pack.rs.
    assert!(
        edges["conv/packed"].contains("conv/pack"),
        "the scan missed conv/packed -> conv/pack: {:?}",
        edges["conv/packed"]
    );
    // Depth-first search for a cycle.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(2) => return None,
            Some(1) => {
                let at = stack.iter().position(|s| s == m).unwrap();
                let mut cyc = stack[at..].to_vec();
                cyc.push(m.to_string());
                return Some(cyc);
            }
            _ => {}
        }
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, edges, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        let mut stack = Vec::new();
        if let Some(c) = visit(m, &edges, &mut state, &mut stack) {
            panic!(
                "kernel files import each other in a loop: {}",
                c.join(" -> ")
            );
        }
    }
}
