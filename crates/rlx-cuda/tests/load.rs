//! `load_library` on broken installs: a FIFO of the library's name is never opened (it would
//! block), a library without the CUDA entry point is refused (cudarc would panic on it), and
//! the message says "found but could not be loaded", not "not found". No GPU needed.

use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-cuda-load-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_fifo_named_like_the_driver_is_not_opened() {
    let d = dir("fifo");
    let p = d.join("libcuda.so.1");
    let ok = std::process::Command::new("mkfifo").arg(&p).status();
    if !ok.is_ok_and(|s| s.success()) {
        eprintln!("skipping a_fifo_named_like_the_driver_is_not_opened: no mkfifo");
        return;
    }
    // Would block forever if the FIFO were handed to the dynamic loader.
    let e = rlx_cuda::load_library("libcuda.so.1", std::slice::from_ref(&d)).unwrap_err();
    assert!(e.contains("was found but could not be loaded"), "{e}");
    assert!(e.contains("not a regular file"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_library_without_cuinit_is_refused_by_name_of_the_symbol() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file());
    let Some(libm) = libm else {
        eprintln!(
            "skipping a_library_without_cuinit_is_refused_by_name_of_the_symbol: no libm.so.6"
        );
        return;
    };
    let d = dir("libm");
    std::os::unix::fs::symlink(libm, d.join("libcuda.so.1")).unwrap();
    let e = rlx_cuda::load_library("libcuda.so.1", std::slice::from_ref(&d)).unwrap_err();
    assert!(e.contains("does not export cuInit"), "{e}");
    assert!(!e.contains("not found"), "{e}");
    // A text file of that name: found, not loadable, the path named once.
    std::fs::remove_file(d.join("libcuda.so.1")).unwrap();
    std::fs::write(d.join("libcuda.so.1"), "not a library").unwrap();
    let e = rlx_cuda::load_library("libcuda.so.1", std::slice::from_ref(&d)).unwrap_err();
    assert!(
        e.starts_with("libcuda.so.1 was found but could not be loaded: "),
        "{e}"
    );
    assert_eq!(
        e.matches(&d.join("libcuda.so.1").display().to_string())
            .count(),
        1,
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
