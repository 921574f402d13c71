//! Any bytes as an RLX package (`.rlxpkg`, static or dynamic): loading returns an error or a
//! model, never panics, hangs or allocates more than the file holds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("rlx_fuzz_{}.rlxpkg", std::process::id()));
    std::fs::write(&p, data).unwrap();
    let _ = rlx_runtime::load_any_package(&p, rlx_runtime::Device::Cpu);
});
