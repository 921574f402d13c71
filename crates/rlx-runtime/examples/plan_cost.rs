use rlx_runtime::*;
use std::collections::BTreeMap;
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let mut m = package::load_dynamic_package(std::path::Path::new(&p), Device::Cpu).unwrap();
    let mut ms = vec![];
    let mut sp = vec![];
    for past in 1..=64usize {
        let mut s = BTreeMap::new();
        s.insert("past".to_string(), past);
        s.insert("seq".to_string(), 1);
        s.insert("total".to_string(), past + 1);
        m.plan_at(&s).unwrap();
        let ev = m.last_plan().unwrap();
        ms.push(ev.plan_ms);
        sp.push(ev.specialize_ms);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    sp.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("plan median {:.3} ms (specialize {:.3})", ms[32], sp[32]);
}
