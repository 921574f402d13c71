//! Any bytes as a `.npy` file (what `rlx run --input x.npy` reads): an error or a tensor,
//! never a panic or an allocation the size of a bogus header shape.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rlx_cli::npy::parse_npy(data, "fuzz.npy");
});
