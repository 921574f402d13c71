//! Median time to import a `.pt2` into an IR graph (archive read + lowering + ONNX import),
//! for bench/pt2_import.py, which compares it with `torch.export.load` on the same file.
//!
//!     cargo run --release -p rlx-torch-import --example import_time -- model.pt2 [runs]
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: import_time MODEL.pt2 [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(10);
    let mut ms = vec![];
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let g = rlx_torch_import::import_pt2(
            std::path::Path::new(&path),
            &rlx_onnx_import::ImportOptions::default(),
        )
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(g);
    }
    ms.sort_by(f64::total_cmp);
    println!("{:.3}", ms[ms.len() / 2]);
}
