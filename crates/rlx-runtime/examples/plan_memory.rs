//! Resident memory of a dynamic model's plans: one `DynamicModel` planning several size
//! signatures (its plans share the decoded weights), against a fresh source per plan (each
//! plan decoding its own copy, as plans did before they shared).
//!
//! ```sh
//! cargo run --release -p rlx-runtime --example plan_memory -- MODEL.onnx SYMBOL 1,2,4,8
//! ```
//! Prints VmRSS (MiB, from /proc/self/status; Linux only) after each plan.

use rlx_runtime::{Device, DynamicModel, OnnxSource};
use std::collections::BTreeMap;
use std::sync::Arc;

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(f64::NAN, |k| k / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: plan_memory MODEL.onnx SYMBOL SIZES (e.g. 1,2,4,8)");
        std::process::exit(2);
    }
    let bytes = std::fs::read(&args[1]).expect("read the model");
    let sizes: Vec<usize> = args[3].split(',').map(|s| s.parse().unwrap()).collect();
    let shared = std::env::var("PLAN_MEMORY_FRESH").is_err();
    let open = || Arc::new(OnnxSource::from_bytes(bytes.clone(), &args[1]).unwrap());
    let mut one = DynamicModel::new(open(), Device::Cpu, BTreeMap::new()).unwrap();
    one.set_plan_cache_size(sizes.len());
    let mut kept = vec![];
    println!(
        "{} plans, {}: start {:.1} MiB",
        sizes.len(),
        if shared {
            "one model (shared weights)"
        } else {
            "a fresh source per plan"
        },
        rss_mib()
    );
    for &n in &sizes {
        let m = if shared {
            &mut one
        } else {
            kept.push(DynamicModel::new(open(), Device::Cpu, BTreeMap::new()).unwrap());
            kept.last_mut().unwrap()
        };
        let sym = BTreeMap::from([(args[2].clone(), n)]);
        m.plan_at(&sym).expect("plan");
        println!("{}={n}: {:.1} MiB", args[2], rss_mib());
    }
}
