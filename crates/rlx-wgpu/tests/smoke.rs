mod common;
use common::*;
use rlx_ir::{DType, Graph, Shape};

#[test]
fn matmul_add_relu_reduce() {
    if !gpu_available() {
        return;
    }
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[3, 37, 45], DType::F32));
    let w = g.input("w", Shape::new(&[45, 29], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[3, 37, 29], DType::F32));
    let r = g.activation(
        rlx_ir::Activation::Relu,
        y,
        Shape::new(&[3, 37, 29], DType::F32),
    );
    let s = g.add_node(
        rlx_ir::Op::Reduce {
            kind: rlx_ir::ReduceKind::Sum,
            axes: vec![2],
            keepdims: false,
        },
        vec![r],
        Shape::new(&[3, 37], DType::F32),
    );
    g.set_outputs(vec![y, r, s]);
    let (want, got) = both(
        &g,
        &[rand_tensor(&[3, 37, 45], 1), rand_tensor(&[45, 29], 2)],
    );
    for k in 0..3 {
        assert_close(&format!("out {k}"), &got[k], &want[k], 1e-4);
    }
}

/// Device timing and per-node profiling (timestamp queries): a run's device time is positive
/// and no larger than its wall time; the profile counts the runs and gives the GPU nodes and
/// the CPU-fallback node a time, the leaves none; results are unchanged while timing.
#[test]
fn device_timing_and_profile() {
    if !gpu_available() {
        return;
    }
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[64, 96], DType::F32));
    let w = g.input("w", Shape::new(&[96, 80], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[64, 80], DType::F32));
    let r0 = g.activation(
        rlx_ir::Activation::Relu,
        y,
        Shape::new(&[64, 80], DType::F32),
    );
    // CumSum has no WGSL kernel: a CPU-fallback node, timed by the host clock.
    let r = g.add_node(
        rlx_ir::Op::CumSum {
            axis: 1,
            exclusive: false,
            reverse: false,
        },
        vec![r0],
        Shape::new(&[64, 80], DType::F32),
    );
    g.set_outputs(vec![r]);
    let feeds = [rand_tensor(&[64, 96], 1), rand_tensor(&[96, 80], 2)];
    let (want, _) = both(&g, &feeds);
    let mut ex = rlx_wgpu::WgpuExecutor::new(g.clone()).unwrap();
    if !ex.set_device_timing(true) {
        eprintln!("no TIMESTAMP_QUERY on this adapter: device timing not tested");
        return;
    }
    let t0 = std::time::Instant::now();
    let got = ex.run(&feeds, None).unwrap();
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert_close("timed run", &got[0], &want[0], 1e-4);
    let dev = ex.last_device_ms().expect("device time recorded");
    assert!(
        dev > 0.0 && dev <= wall_ms,
        "device {dev} ms, wall {wall_ms} ms"
    );
    ex.set_device_timing(false);
    assert_eq!(ex.last_device_ms(), None);
    if ex.set_profiling(true).is_err() {
        eprintln!("no TIMESTAMP_QUERY_INSIDE_PASSES: profiling not tested");
        return;
    }
    for _ in 0..2 {
        let got = ex.run(&feeds, None).unwrap();
        assert_close("profiled run", &got[0], &want[0], 1e-4);
    }
    let p = ex.profile().expect("profiling is on");
    assert_eq!(p.runs, 2);
    assert_eq!(p.ns[x.index()], 0, "inputs are not timed");
    assert!(p.ns[y.index()] > 0, "the matmul has a time");
    assert!(p.ns[r.index()] > 0, "the CPU-fallback CumSum has a time");
    ex.set_profiling(false).unwrap();
    assert!(ex.profile().is_none());
    assert_no_uncaptured();
}

/// Outputs are moved out of the run's values, not cloned: an output listed twice and a graph
/// input listed as an output still come back, equal to the CPU's.
#[test]
fn repeated_and_input_outputs() {
    if !gpu_available() {
        return;
    }
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(&[3, 5], DType::F32));
    let r = g.activation(rlx_ir::Activation::Relu, x, Shape::new(&[3, 5], DType::F32));
    g.set_outputs(vec![r, x, r]);
    let (want, got) = both(&g, &[rand_tensor(&[3, 5], 7)]);
    assert_eq!(got.len(), 3);
    for k in 0..3 {
        assert_close(&format!("out {k}"), &got[k], &want[k], 0.0);
    }
}
