//! Where a `.pt2` import spends its time: archive read + lowering (`Pt2Model::open`) and the
//! ONNX import (`Pt2Model::import`), median ms of N runs each.
//!
//!     cargo run --release -p rlx-torch-import --example import_stages -- model.pt2 [runs]
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: import_stages MODEL.pt2 [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let (mut open_ms, mut import_ms) = (vec![], vec![]);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let m = rlx_torch_import::Pt2Model::open(std::path::Path::new(&path)).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
        open_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let g = m
            .import(&rlx_onnx_import::ImportOptions::default())
            .unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(1)
            });
        import_ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(g);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "open (archive + lowering) {:.1} ms, import (ONNX importer) {:.1} ms",
        med(&mut open_ms),
        med(&mut import_ms)
    );
}
