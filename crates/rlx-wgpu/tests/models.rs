//! Whole models on wgpu against rlx-cpu: the examples/ NaN models (same culprit report), the
//! committed transformer fixtures, and the generated model-zoo light models (skipped when not
//! generated, unless RLX_REQUIRE_FIXTURES=1). Skipped without an adapter unless RLX_REQUIRE_GPU=1.

mod common;
use common::*;
use rlx_compile::compiler::{compile, CompileOptions};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::{DebugMode, DebugScanner};
use rlx_ir::{Graph, Op, Tensor, TensorData};
use rlx_onnx_import::{import_onnx, ImportOptions};
use rlx_wgpu::{Placement, WgpuExecutor};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(rel: &str) -> Option<PathBuf> {
    let p = repo().join(rel);
    if p.exists() {
        return Some(p);
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
        panic!(
            "fixture {} is missing (generate it with the scripts in scripts/)",
            p.display()
        );
    }
    {
        use std::io::Write; // past the test harness's capture: the skip shows in CI logs
        let _ = writeln!(
            std::io::stderr(),
            "skipping {}: fixture {} not generated",
            std::thread::current().name().unwrap_or("?"),
            p.display()
        );
    }
    None
}

fn read_npy(p: &Path) -> Tensor {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let dims: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        _ => panic!("{}: structured dtype", p.display()),
    };
    let data = match descr.as_str() {
        "<f4" => TensorData::F32(npy.into_vec::<f32>().unwrap()),
        "<i8" => TensorData::I64(npy.into_vec::<i64>().unwrap()),
        "<i4" => TensorData::I32(npy.into_vec::<i32>().unwrap()),
        "|b1" => TensorData::Bool(npy.into_vec::<bool>().unwrap()),
        d => panic!("{}: dtype {d} not handled by this test", p.display()),
    };
    Tensor::new(dims, data).unwrap()
}

/// Import `dir/model.onnx` with dims bound from the `<prefix><name>.npy` files, compile,
/// and load the inputs in graph order.
fn load(dir: &Path, prefix: &str) -> (Graph, Vec<Tensor>) {
    let mut opts = ImportOptions::default();
    let mut files = std::collections::HashMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let f = e.file_name().to_string_lossy().to_string();
        if let Some(name) = f.strip_prefix(prefix).and_then(|n| n.strip_suffix(".npy")) {
            let t = read_npy(&e.path());
            opts.input_shapes
                .insert(name.to_string(), t.dims().to_vec());
            files.insert(name.to_string(), t);
        }
    }
    let g = import_onnx(&dir.join("model.onnx"), &opts).unwrap();
    let c = compile(g, &CompileOptions::default()).unwrap().graph;
    let inputs = c
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let Op::Input { name } = &c.node(id).op else {
                unreachable!()
            };
            files
                .get(name)
                .or_else(|| {
                    if files.len() == 1 && k == 0 {
                        files.values().next()
                    } else {
                        None
                    }
                })
                .unwrap_or_else(|| panic!("{}: no input file for {name}", dir.display()))
                .clone()
        })
        .collect();
    (c, inputs)
}

/// Run on both backends and compare every output (max_rel with an output-scale floor).
fn compare(what: &str, g: &Graph, inputs: &[Tensor], tol: f64) {
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(inputs, None).unwrap();
    let t0 = std::time::Instant::now();
    let mut w = WgpuExecutor::new(g.clone()).unwrap();
    let got = w.run(inputs, None).unwrap();
    assert_no_uncaptured();
    let fallbacks: Vec<String> = w
        .placements()
        .into_iter()
        .filter_map(|(id, p)| match p {
            Placement::CpuFallback { reason } => {
                Some(format!("{id} {}: {reason}", g.node(id).op.name()))
            }
            Placement::Gpu => None,
        })
        .collect();
    eprintln!(
        "{what}: {} nodes, {} on the cpu, wgpu plan+run {:.2}s",
        g.len(),
        fallbacks.len(),
        t0.elapsed().as_secs_f64()
    );
    for f in fallbacks.iter().take(8) {
        eprintln!("  fallback {f}");
    }
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        let r = max_rel(&format!("{what} output {k}"), a, b);
        eprintln!("{what} output {k}: max_rel {r:.2e}");
        assert!(r <= tol, "{what} output {k}: max_rel {r:.3e} > {tol:e}");
    }
}

fn scan_reports(g: &Graph, inputs: &[Tensor], wgpu: bool) -> Vec<(u32, String, bool)> {
    let mut sc = DebugScanner::new(DebugMode::Warn, if wgpu { "wgpu" } else { "cpu" });
    sc.set_print(false);
    if wgpu {
        let mut w = WgpuExecutor::new(g.clone()).unwrap();
        w.run(inputs, Some(&mut sc)).unwrap();
    } else {
        let mut c = CpuExecutor::new(g.clone()).unwrap();
        c.run(inputs, Some(&mut sc)).unwrap();
    }
    sc.reports()
        .iter()
        .map(|r| (r.node.0, format!("{:?}", r.kind), r.is_culprit()))
        .collect()
}

const EXAMPLES: [&str; 7] = [
    "attention_masked_nan",
    "cast_f16_overflow",
    "const_fold_inf",
    "healthy_mlp",
    "inf_absorbed",
    "rmsnorm_eps0_nan",
    "rmsnorm_rsqrt_inf_nan",
];

#[test]
fn examples_same_outputs_and_same_nan_culprits() {
    if !gpu_available() {
        return;
    }
    for ex in EXAMPLES {
        let dir = repo().join("examples").join(ex);
        let (g, inputs) = load(&dir, "input_");
        compare(ex, &g, &inputs, 1e-3);
        let cpu = scan_reports(&g, &inputs, false);
        let gpu = scan_reports(&g, &inputs, true);
        assert_eq!(
            gpu, cpu,
            "{ex}: NaN/Inf reports differ between wgpu and cpu"
        );
        eprintln!("{ex}: {} reports, same on both", cpu.len());
    }
}

#[test]
fn examples_abort_mode_same_error() {
    if !gpu_available() {
        return;
    }
    let dir = repo().join("examples/attention_masked_nan");
    let (g, inputs) = load(&dir, "input_");
    let mut sc = DebugScanner::new(DebugMode::Abort, "cpu");
    sc.set_print(false);
    let ce = CpuExecutor::new(g.clone())
        .unwrap()
        .run(&inputs, Some(&mut sc))
        .unwrap_err();
    let mut sw = DebugScanner::new(DebugMode::Abort, "wgpu");
    sw.set_print(false);
    let we = WgpuExecutor::new(g.clone())
        .unwrap()
        .run(&inputs, Some(&mut sw))
        .unwrap_err();
    let (rlx_cpu::CpuError::NanAbort(a), rlx_wgpu::WgpuError::NanAbort(b)) = (ce, we) else {
        panic!("both backends must stop with NanAbort");
    };
    assert_eq!(a.report.node, b.report.node);
    assert_eq!(b.report.backend, "wgpu");
}

fn transformer(rel: &str) {
    if !gpu_available() {
        return;
    }
    let Some(dir) = fixture(rel) else { return };
    let (g, inputs) = load(&dir, "input_");
    compare(rel, &g, &inputs, 1e-3);
}

#[test]
fn bert_tiny() {
    transformer("fixtures/transformers/bert_tiny");
}
#[test]
fn qwen3_tiny() {
    transformer("fixtures/transformers/qwen3_tiny");
}
#[test]
fn t5_tiny() {
    transformer("fixtures/transformers/t5_tiny");
}

fn light(name: &str) {
    if !gpu_available() {
        return;
    }
    let Some(dir) = fixture(&format!("fixtures/large/light/{name}")) else {
        return;
    };
    let (g, inputs) = load(&dir, "input_");
    compare(name, &g, &inputs, 1e-3);
}

#[test]
fn light_bvlc_alexnet() {
    light("bvlc_alexnet");
}
#[test]
fn light_densenet121() {
    light("densenet121");
}
#[test]
fn light_inception_v1() {
    light("inception_v1");
}
#[test]
fn light_inception_v2() {
    light("inception_v2");
}
#[test]
fn light_resnet50() {
    light("resnet50");
}
#[test]
fn light_shufflenet() {
    light("shufflenet");
}
#[test]
fn light_squeezenet() {
    light("squeezenet");
}
#[test]
fn light_vgg19() {
    light("vgg19");
}
#[test]
fn light_zfnet512() {
    light("zfnet512");
}

/// Debug helper (ignored): first node whose wgpu value differs from the CPU's.
#[test]
#[ignore]
fn localize_light() {
    let name = std::env::var("LIGHT").unwrap_or("squeezenet".into());
    let dir = repo().join("fixtures/large/light").join(&name);
    let (g, inputs) = load(&dir, "input_");
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let mut vals: Vec<Option<Tensor>> = vec![None; g.len()];
    let mut f = |id: rlx_ir::NodeId, t: &Tensor| vals[id.index()] = Some(t.clone());
    c.run_observed(&inputs, None, &mut f).unwrap();
    let mut w = WgpuExecutor::new(g.clone()).unwrap();
    let all = w.run_all(&inputs).unwrap();
    for n in &g.nodes {
        let (Some(a), Some(b)) = (&all[n.id.index()], &vals[n.id.index()]) else {
            continue;
        };
        if a.dtype() != rlx_ir::DType::F32 {
            continue;
        }
        let r = max_rel("x", a, b);
        if r > 1e-3 {
            let ins: Vec<String> = n
                .inputs
                .iter()
                .map(|i| format!("{i}:{:?}", g.node(*i).shape.dims_usize()))
                .collect();
            panic!(
                "first divergence at {} {:?} out {:?} ins {ins:?}: {r:e}",
                n.id,
                n.op,
                n.shape.dims_usize()
            );
        }
    }
}

/// Debug helper (ignored): both backends against the model-zoo's shipped output.
#[test]
#[ignore]
fn light_vs_shipped() {
    let name = std::env::var("LIGHT").unwrap_or("squeezenet".into());
    let dir = repo().join("fixtures/large/light").join(&name);
    let (g, inputs) = load(&dir, "input_");
    let want = read_npy(&dir.join("output_0.npy"));
    let cpu = CpuExecutor::new(g.clone())
        .unwrap()
        .run(&inputs, None)
        .unwrap();
    let gpu = WgpuExecutor::new(g.clone())
        .unwrap()
        .run(&inputs, None)
        .unwrap();
    eprintln!("cpu vs shipped {:e}", max_rel("c", &cpu[0], &want));
    eprintln!("wgpu vs shipped {:e}", max_rel("w", &gpu[0], &want));
}
