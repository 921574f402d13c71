//! The backend trait through the public API: placements, coverage, the one error for a
//! device that is not live, and the same values from every live backend.

use rlx_ir::{Activation, DType, Graph, Shape, Tensor};
use rlx_runtime::backend::{self, Placement};
use rlx_runtime::{available_devices, Device, Session};

fn tiny() -> Graph {
    let mut g = Graph::new("d");
    let x = g.input("x", Shape::new(&[2, 2], DType::F32));
    let w = g.param("w", Shape::new(&[2, 2], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[2, 2], DType::F32));
    let r = g.activation(Activation::Relu, y, Shape::new(&[2, 2], DType::F32));
    g.set_outputs(vec![r]);
    g
}

#[test]
fn cpu_runs_every_node_itself() {
    let b = backend::open(Device::Cpu, tiny()).unwrap();
    assert_eq!(b.device(), Device::Cpu);
    let p = b.placements();
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|(_, p)| *p == Placement::Device));
    let c = b.coverage();
    assert_eq!((c.on_device, c.total, c.on_cpu()), (2, 2, 0));
    assert!(b.describe().starts_with("cpu ("), "{}", b.describe());
}

/// On a machine without CUDA (CI), compiling for it is one error that says why (the probe's
/// words: the library file that is missing, or the feature that is off) and lists the
/// devices that are live (the CPU at least, wgpu where an adapter exists).
#[test]
fn an_absent_device_says_why_and_lists_the_live_ones() {
    assert!(backend::probe(Device::Cpu).is_ok());
    let Err(why) = backend::probe(Device::Cuda) else {
        eprintln!("skipping an_absent_device_says_why_and_lists_the_live_ones: CUDA is live");
        return;
    };
    let e = Session::new(Device::Cuda)
        .try_compile(tiny())
        .err()
        .expect("no CUDA device");
    let m = e.to_string();
    let live: Vec<String> = available_devices().iter().map(|d| d.to_string()).collect();
    assert_eq!(
        m,
        format!(
            "device cuda is not available on this machine: {why} (available: {})",
            live.join(", ")
        )
    );
    assert!(m.contains("(available: cpu"), "{m}");
    if cfg!(not(feature = "cuda")) {
        assert!(why.contains("feature `cuda`"), "{why}");
    } else {
        assert!(why.contains("libcuda.so.1"), "{why}");
    }
}

/// Every live backend returns the CPU's values through `run`, `run_all` and `run_observed`
/// (exact here: a 2x2 product of small integers), and per-node profiling counts the runs.
#[test]
fn every_live_backend_gives_the_same_values_through_the_trait() {
    let x = Tensor::from_f32(&[2, 2], vec![1.0, -2.0, 3.0, 4.0]).unwrap();
    let w = Tensor::from_f32(&[2, 2], vec![1.0, 2.0, -1.0, 1.0]).unwrap();
    // [[1,-2],[3,4]] @ [[1,2],[-1,1]] = [[3,0],[-1,10]] -> relu -> [[3,0],[0,10]]
    let want = vec![3.0f32, 0.0, 0.0, 10.0];
    for d in available_devices() {
        let mut b = backend::open(d, tiny()).unwrap();
        b.set_param("w", w.clone()).unwrap();
        let out = b
            .run(&[&x], None, &rlx_runtime::printer::PrinterConfig::off())
            .unwrap();
        assert_eq!(out[0].data().to_f32_vec(), want, "{d}");
        let all = b.run_all(&[&x]).unwrap();
        let out_id = b.graph().outputs[0];
        assert_eq!(
            all[out_id.index()].as_ref().unwrap().data().to_f32_vec(),
            want,
            "{d}"
        );
        let mut seen = vec![];
        let out = b.run_observed(&[&x], &mut |id, _| seen.push(id)).unwrap();
        assert_eq!(out[0].data().to_f32_vec(), want, "{d}");
        assert!(seen.contains(&out_id), "{d}: {seen:?}");
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "{d}: topological order"
        );
        // Per-node profiling: the CPU always; CUDA (events) and wgpu (timestamp queries
        // inside compute passes, where the adapter has them: lavapipe and the H200 do).
        match b.set_profiling(true) {
            Ok(()) => {
                b.run(&[&x], None, &rlx_runtime::printer::PrinterConfig::off())
                    .unwrap();
                let p = b.profile().expect("profiling on");
                assert_eq!(p.runs, 1, "{d}");
                assert_eq!(p.ns.len(), b.graph().len(), "{d}");
                b.set_profiling(false).unwrap();
                assert!(b.profile().is_none(), "{d}");
            }
            Err(e) => {
                assert_ne!(d, Device::Cpu, "{e}");
                assert!(e.to_string().contains("TIMESTAMP_QUERY"), "{d}: {e}");
            }
        }
        let e = b.set_param("nope", w.clone()).unwrap_err().to_string();
        assert!(e.contains("nope"), "{d}: {e}");
    }
}
