//! probe(): never panics, names the missing library; executors without a device say why.
mod common;
use common::*;
use rlx_cuda::{CudaError, CudaExecutor};
use rlx_ir::{DType, Graph, Shape};

#[test]
fn probe_reports_a_device_or_names_what_is_missing() {
    match rlx_cuda::probe() {
        Ok(info) => {
            eprintln!(
                "rlx_cuda::probe(): {} sm_{}{}, {:.1} GiB, {} device(s), libraries {:?}",
                info.name,
                info.compute_capability.0,
                info.compute_capability.1,
                info.total_mem as f64 / (1u64 << 30) as f64,
                info.device_count,
                info.libraries
            );
            assert!(!info.name.is_empty());
            assert!(info.compute_capability.0 >= 3);
            assert!(info.total_mem > 0);
            assert_eq!(info.libraries.len(), 3);
        }
        Err(e) => {
            eprintln!("rlx_cuda::probe(): Err({e})");
            assert!(
                !rlx_ir::env::is_on("RLX_REQUIRE_CUDA"),
                "RLX_REQUIRE_CUDA=1 but probe failed: {e}"
            );
            // Either a library file is named, or the driver loaded and said why.
            let names_lib = ["libcuda.so.1", "libnvrtc.so.13", "libcublas.so.13"]
                .iter()
                .any(|l| e.contains(&format!("{l} not found")));
            assert!(
                names_lib || e.contains("device") || e.contains("cu"),
                "unhelpful probe error: {e}"
            );
            if names_lib {
                assert!(
                    e.contains("searched") && e.contains("/usr/local/nvidia/lib64"),
                    "{e}"
                );
            }
            // Cached: the same answer again, still no panic.
            assert_eq!(rlx_cuda::probe().unwrap_err(), e);
        }
    }
}

#[test]
fn a_missing_library_is_an_error_naming_the_file() {
    let dirs = rlx_cuda::search_dirs();
    let e = rlx_cuda::load_library("librlx-no-such-driver.so.1", &dirs).unwrap_err();
    eprintln!("{e}");
    assert!(
        e.starts_with("librlx-no-such-driver.so.1 not found (searched "),
        "{e}"
    );
    assert!(e.contains("/usr/local/nvidia/lib64"), "{e}");
    assert!(e.contains("/usr/lib/x86_64-linux-gnu"), "{e}");
}

#[test]
fn executor_without_a_device_is_no_device() {
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[2], DType::F32));
    let y = g.unary(rlx_ir::UnaryOp::Exp, x, Shape::new(&[2], DType::F32));
    g.set_outputs(vec![y]);
    match rlx_cuda::probe() {
        Ok(_) => {
            let ex = CudaExecutor::new(g).unwrap();
            assert!(!ex.device_name().is_empty());
        }
        Err(e) => match CudaExecutor::new(g) {
            Err(CudaError::NoDevice(m)) => assert_eq!(m, e),
            Err(other) => panic!("expected NoDevice, got {other}"),
            Ok(_) => panic!("an executor without a device"),
        },
    }
    let _ = cuda_available();
}
