//! Resident memory of a dynamic model's plans: one `DynamicModel` planning several size
//! signatures (its plans share the decoded weights), against a fresh source per plan (each
//! plan decoding its own copy, as plans did before they shared).
//!
//! ```sh
//! cargo run --release -p rlx-runtime --example plan_memory -- MODEL.onnx SYMBOL 1,2,4,8
//! cargo run --release -p rlx-runtime --example plan_memory -- MODEL.onnx n=1,h,w 224,160,128
//! ```
//! Prints VmRSS (MiB, from /proc/self/status; Linux only) and the time taken after each
//! plan. SYMBOL may name several symbols (comma-separated), each bound to the size, or
//! fix one (`n=1,h,w`).

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
        let sym: BTreeMap<String, usize> = (args[2].split(','))
            .map(|s| match s.split_once('=') {
                Some((name, v)) => (name.to_string(), v.parse().expect("SYMBOL=SIZE")),
                None => (s.to_string(), n),
            })
            .collect();
        let t0 = std::time::Instant::now();
        m.plan_at(&sym).expect("plan");
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "{}={n}: {:.1} MiB, planned in {ms:.1} ms",
            args[2],
            rss_mib()
        );
    }
}
