//! What planning a new size signature costs while a KV-cache decoder grows its cache: the
//! median of [`rlx_runtime::dynamic::PlanEvent::plan_ms`] (and its specialize part) over
//! 64 decode steps, `past` = 1..=64 with `seq` = 1 and `total` = past + 1.
//!
//! ```text
//! rlx compile fixtures/dynamic/gpt2_kv/model.onnx --dim seq=1..64 --dim past=0..64 \
//!     --dim total=1..128 -o /tmp/gk.rlxpkg
//! cargo run --release -p rlx-runtime --example decode_plan_cost -- /tmp/gk.rlxpkg
//! ```
//!
//! The package must be a dynamic one with the symbols `past`, `seq` and `total` (as
//! fixtures/dynamic/gpt2_kv's are).
use rlx_runtime::{package, Device};
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(p) = std::env::args().nth(1) else {
        return Err("usage: decode_plan_cost PACKAGE.rlxpkg (a dynamic package with the dims past, seq, total)".into());
    };
    let mut m = package::load_dynamic_package(std::path::Path::new(&p), Device::Cpu)?;
    let (mut plan, mut spec) = (vec![], vec![]);
    for past in 1..=64usize {
        let sizes: BTreeMap<String, usize> = [("past", past), ("seq", 1), ("total", past + 1)]
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect();
        m.plan_at(&sizes)?;
        let ev = m.last_plan().ok_or("no plan event")?;
        plan.push(ev.plan_ms);
        spec.push(ev.specialize_ms);
    }
    plan.sort_by(f64::total_cmp);
    spec.sort_by(f64::total_cmp);
    println!(
        "{p}: planning a new past length, median of 64 steps: {:.3} ms (specialize {:.3} ms, compile {:.3} ms)",
        plan[32],
        spec[32],
        plan[32] - spec[32]
    );
    Ok(())
}
