//! A 2-thread run must not hang when a pool worker runs its spinning job
//! (`run_with_spinning_workers`) nested inside a part of the graph's parallel work.
//!
//! Found at 2 threads on a one-node depthwise model (960 channels, 7×7, 3×3): within
//! seconds of back-to-back runs a worker stole half of the conv's block loop, waited in a
//! nested join, ran its spinning job there, and spun until the run ended, which waited for
//! that half. The test runs that model for five seconds on a 2-thread global pool (as
//! `rlx bench --threads 2` does) and fails if the runs stop making progress. The hang is
//! timing-dependent: with the fix taken out, this test hung 3 of 3 times under
//! `cargo test --release` (after 22–63 k runs) but not in the debug build CI runs, whose
//! slower kernels did not hit the window in 5 s. A pass is evidence, not proof.

mod common;

use common::{rnd, sh};
use rlx_cpu::CpuExecutor;
use rlx_ir::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn two_thread_runs_of_a_small_depthwise_model_do_not_hang() {
    let (c, h) = (960, 7);
    let mut g = Graph::new("dw_nested");
    let x = g.input("x", sh(&[1, c, h, h]));
    let w = g.constant(Tensor::from_f32(&[c, 1, 3, 3], rnd(c * 9, 1)).unwrap());
    let b = g.constant(Tensor::from_f32(&[c], rnd(c, 2)).unwrap());
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(1, 1), (1, 1)],
        dilations: vec![1, 1],
        groups: c,
    };
    let y = g.add_node(Op::Conv(a), vec![x, w, b], sh(&[1, c, h, h]));
    // GlobalAveragePool, as the model had it.
    let r = Op::Reduce {
        kind: ReduceKind::Mean,
        axes: vec![2, 3],
        keepdims: true,
    };
    let z = g.add_node(r, vec![y], sh(&[1, c, 1, 1]));
    g.set_outputs(vec![z]);
    let input = Tensor::from_f32(&[1, c, h, h], rnd(c * h * h, 3)).unwrap();

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut ex = CpuExecutor::new(g).unwrap();
        // As `rlx bench --threads 2` runs it: the global pool, runs called from outside it.
        // (This file holds one test, so its binary may set the global pool.)
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build_global()
            .unwrap();
        let t0 = Instant::now();
        let mut runs = 0u64;
        while t0.elapsed() < Duration::from_secs(5) {
            ex.run(std::slice::from_ref(&input), None).unwrap();
            runs += 1;
            // A heartbeat per run: the receiver fails on a gap, not on a slow machine.
            if tx.send(runs).is_err() {
                return;
            }
        }
    });
    let mut last = 0;
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(n) => last = n,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("a 2-thread run made no progress for 30 s after {last} runs (hung)")
            }
        }
    }
    assert!(last > 0);
}
