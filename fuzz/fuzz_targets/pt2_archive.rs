//! Any bytes as a `.pt2` file: open and import must return an error or a graph, never panic,
//! hang or allocate what a bogus header asks for.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("rlx_fuzz_{}.pt2", std::process::id()));
    std::fs::write(&p, data).unwrap();
    if let Ok(m) = rlx_torch_import::Pt2Model::open(&p) {
        let _ = m.import(&rlx_onnx_import::ImportOptions::default());
    }
});
