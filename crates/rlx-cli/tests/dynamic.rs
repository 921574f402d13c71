//! Dynamic packages and models (issue 32): one package compiled with
//! `--dim batch=1..16 --dim sequence=1..512` runs a BERT-style encoder at (1, 7), (3, 128)
//! and (16, 512) with outputs matching onnxruntime's (fixtures/dynamic, written by
//! scripts/gen_dynamic_models.py); sizes out of range and inputs that disagree on a shared
//! symbol get the guard messages; the library's plan cache reuses and evicts plans.
//! Parameter inputs fed at run time are planned by value; ops whose output shape depends on
//! values (NonZero, Compress, Unique, NonMaxSuppression, a torchvision detector) run between
//! plans and match the ONNX cases' expected outputs and onnxruntime.

mod common;
use common::*;
use rlx_cli::npy::{read_npy, write_npy};
use rlx_ir::Tensor;
use rlx_runtime::{
    load_any_package, load_dynamic_package, load_package, save_dynamic_package, Device, DimRange,
    DynamicModel, LoadedPackage, OnnxSource,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const RLX: &str = env!("CARGO_BIN_EXE_rlx");
const SIZES: [&str; 3] = ["1x7", "3x128", "16x512"];
const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];
const OUTPUTS: [&str; 2] = ["last_hidden_state", "pooler_output"];

fn tmp(name: &str) -> PathBuf {
    common::scratch_dir("rlx-cli-dynamic").join(name)
}

fn rlx(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(RLX);
    c.args(args).current_dir(repo());
    for v in [
        "RLX_DEBUG_NANS",
        "RLX_RUNTIME_CHECK_INPUTS",
        "RLX_LINT_NUMERICS",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run rlx");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn input_args(case: &Path) -> Vec<String> {
    INPUTS
        .iter()
        .map(|n| {
            format!(
                "--input={n}={}",
                case.join(format!("input_{n}.npy")).display()
            )
        })
        .collect()
}

fn inputs(case: &Path) -> Vec<(String, Tensor)> {
    INPUTS
        .iter()
        .map(|n| {
            (
                n.to_string(),
                read_npy(&case.join(format!("input_{n}.npy"))).unwrap(),
            )
        })
        .collect()
}

fn compile_pkg(dir: &Path, tag: &str) -> PathBuf {
    let pkg = tmp(&format!("{tag}.rlxpkg"));
    let model = dir.join("model.onnx");
    let (code, _, err) = rlx(
        &[
            "compile",
            model.to_str().unwrap(),
            "--dim",
            "batch=1..16",
            "--dim",
            "sequence=1..512",
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "rlx compile: {err}");
    assert!(err.contains("dynamic"), "{err}");
    assert!(
        err.contains("batch=1..16") && err.contains("sequence=1..512"),
        "the guards with ranges: {err}"
    );
    assert!(
        err.contains("batch=16, sequence=512"),
        "the largest corner was checked: {err}"
    );
    pkg
}

/// The issue's bar: one package, three sizes, onnxruntime's outputs.
#[test]
fn one_package_runs_every_size_in_range_like_onnxruntime() {
    let Some(dir) = fixture("fixtures/dynamic/bert_dyn") else {
        return;
    };
    let pkg = compile_pkg(&dir, "bert");
    for size in SIZES {
        let case = dir.join(size);
        let out = tmp(&format!("out-{size}"));
        let mut args = vec!["run".to_string(), pkg.display().to_string()];
        args.extend(input_args(&case));
        args.extend(["--output-dir".into(), out.display().to_string()]);
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (code, _, err) = rlx(&a, &[]);
        assert_eq!(code, 0, "rlx run at {size}: {err}");
        let (b, s) = size.split_once('x').unwrap();
        assert!(
            err.contains(&"planned".to_string())
                && err.contains(&format!("batch={b}, sequence={s}")),
            "the plan's signature is reported: {err}"
        );
        for o in OUTPUTS {
            let got = read_npy(&out.join(format!("{o}.npy"))).unwrap();
            let want = read_npy(&case.join(format!("expected_{o}.npy"))).unwrap();
            assert_close(&format!("{size} {o}"), &got, &want, 1e-4, 1e-5);
        }
    }
}

#[test]
fn out_of_range_and_disagreeing_inputs_get_guard_messages() {
    let Some(dir) = fixture("fixtures/dynamic/bert_dyn") else {
        return;
    };
    let pkg = compile_pkg(&dir, "guards");
    let p = pkg.to_str().unwrap();
    // --dim outside its range: refused before any input is generated at that size (a huge
    // one must not allocate)
    for (dim, r) in [
        ("batch=17", "1..16"),
        ("batch=99999999", "1..16"),
        ("sequence=513", "1..512"),
    ] {
        let (code, _, err) = rlx(&["run", p, "--dim", dim, "-q"], &[]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("--dim {dim}: outside the range")) && err.contains(r),
            "{err}"
        );
    }
    // an input file of batch 17: one guard line per problem, AOTInductor's form
    let ids17 = tmp("ids17.npy");
    rlx_cli::npy::write_npy(&ids17, &Tensor::from_i64(&[17, 4], vec![1; 68]).unwrap()).unwrap();
    let (code, _, err) = rlx(
        &[
            "run",
            p,
            "--input",
            &format!("input_ids={}", ids17.display()),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "rlx input-check: inputs[0] \"input_ids\": unmatched dim 0 (\"batch\"), expected: 1..16, but got: 17"
        ),
        "{err}"
    );
    // input_ids at 1x7, attention_mask at 3x128: the shared symbols disagree
    let ids = dir.join("1x7/input_input_ids.npy");
    let mask = dir.join("3x128/input_attention_mask.npy");
    let (code, _, err) = rlx(
        &[
            "run",
            p,
            "--input",
            &format!("input_ids={}", ids.display()),
            "--input",
            &format!("attention_mask={}", mask.display()),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("inputs[1] \"attention_mask\": unmatched dim 1 (\"sequence\"), expected: 7 (as inputs[0] \"input_ids\" dim 1), but got: 128"),
        "{err}"
    );
    // The same files on the .onnx model (no package): the importer names both inputs (the
    // one that bound the symbol first) and the files they came from.
    let (code, _, err) = rlx(
        &[
            "run",
            dir.join("model.onnx").to_str().unwrap(),
            "--input",
            &format!("input_ids={}", ids.display()),
            "--input",
            &format!("attention_mask={}", mask.display()),
            "-q",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains(r#"graph input "attention_mask": dim 0 (batch) is 3 here but 1 in input "input_ids" (its dim 0)"#)
            && err.contains(&format!("rlx: input \"input_ids\" was read from {}", ids.display()))
            && err.contains(&format!("rlx: input \"attention_mask\" was read from {}", mask.display())),
        "{err}"
    );
    // rlx bench plans the signature once, before its timed runs, and says what it cost
    let (code, out, err) = rlx(
        &[
            "bench",
            p,
            "--dim",
            "batch=2",
            "--dim",
            "sequence=8",
            "--runs",
            "2",
            "--warmup",
            "1",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("plan for batch=2, sequence=8") && out.contains("median:"),
        "{out}"
    );
    // --dim naming a symbol the model does not have
    let (code, _, err) = rlx(&["run", p, "--dim", "seq=3"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("no symbolic dim named \"seq\""), "{err}");
    // bad ranges at compile time
    let model = dir.join("model.onnx");
    for (dim, want) in [
        ("batch=5..4", "larger than MAX"),
        ("batch=x..4", "MIN"),
        ("batsh=1..4", "no symbolic dim named \"batsh\""),
    ] {
        let (code, _, err) = rlx(
            &[
                "compile",
                model.to_str().unwrap(),
                "--dim",
                dim,
                "-o",
                "/dev/null",
            ],
            &[],
        );
        assert_eq!(code, 1, "{dim}: {err}");
        assert!(err.contains(want), "{dim}: {err}");
    }
    // the library's static loader refuses a dynamic package and says what to use
    let e = load_package(&pkg, Device::Cpu).err().expect("refused");
    assert!(e.to_string().contains("load_dynamic_package"), "{e}");
}

/// The library: plans are built once per signature, reused, and evicted least recently
/// used first; outputs match onnxruntime's at each size.
#[test]
fn plan_cache_reuses_and_evicts() {
    let Some(dir) = fixture("fixtures/dynamic/bert_dyn") else {
        return;
    };
    let src = OnnxSource::open(&dir.join("model.onnx")).unwrap();
    let mut ranges = BTreeMap::new();
    ranges.insert("batch".to_string(), DimRange::parse("1..16").unwrap());
    ranges.insert("sequence".to_string(), DimRange::parse("1..512").unwrap());
    let mut m = DynamicModel::new(Arc::new(src), Device::Cpu, ranges).unwrap();
    m.set_plan_cache_size(2);
    let cases: Vec<(String, Vec<(String, Tensor)>)> = SIZES
        .iter()
        .map(|s| (s.to_string(), inputs(&dir.join(s))))
        .collect();
    let run = |m: &mut DynamicModel, k: usize| -> bool {
        let (size, feeds) = &cases[k];
        let named: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let outs = m.run_tensors(&named).unwrap();
        for (o, got) in OUTPUTS.iter().zip(&outs) {
            let want = read_npy(&dir.join(size).join(format!("expected_{o}.npy"))).unwrap();
            assert_close(&format!("{size} {o}"), got, &want, 1e-4, 1e-5);
        }
        m.last_plan().unwrap().new
    };
    assert!(run(&mut m, 0), "first run at 1x7 plans");
    assert!(!run(&mut m, 0), "second run at 1x7 reuses the plan");
    assert!(run(&mut m, 1), "3x128 plans");
    assert_eq!(m.plans_cached(), 2);
    assert!(!run(&mut m, 0), "1x7 is still cached");
    assert!(
        run(&mut m, 2),
        "16x512 plans and evicts 3x128 (least recently used)"
    );
    assert_eq!(m.plans_cached(), 2);
    assert!(!run(&mut m, 0), "1x7 was used more recently than 3x128");
    assert!(run(&mut m, 1), "3x128 was evicted");
    assert_eq!(m.last_plan().unwrap().signature, "batch=3, sequence=128");

    // save, load (as a dynamic package and through load_any_package), run again
    let pkg = tmp("lib.rlxpkg");
    save_dynamic_package(&mut m, &pkg).unwrap();
    let mut l = load_dynamic_package(&pkg, Device::Cpu).unwrap();
    assert_eq!(l.guards(), m.guards());
    assert_eq!(l.plans_cached(), 0, "loading builds no plan");
    assert!(run(&mut l, 1));
    assert!(matches!(
        load_any_package(&pkg, Device::Cpu).unwrap(),
        LoadedPackage::Dynamic(_)
    ));
}

/// A package whose manifest lies about the ranges, or whose source is not ONNX, is refused
/// with the entry named.
#[test]
fn corrupted_dynamic_packages_are_refused() {
    let Some(dir) = fixture("fixtures/dynamic/bert_dyn") else {
        return;
    };
    let pkg = compile_pkg(&dir, "corrupt-base");
    let manifest = zip_entry(&pkg, "manifest.json");
    let source = zip_entry(&pkg, "source.onnx");
    let text = String::from_utf8(manifest.clone()).unwrap();
    // edits in the manifest's "dynamic" field only (the guards before it keep theirs)
    let at = text.find("\"dynamic\"").expect("a dynamic field");
    let in_dynamic = |from: &str, to: &str| {
        format!("{}{}", &text[..at], text[at..].replacen(from, to, 1)).into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, Vec<u8>, &str)> = vec![
        (
            "dynamic-in-format-1",
            text.replacen("\"format_version\": 2", "\"format_version\": 1", 1)
                .into_bytes(),
            source.clone(),
            "dynamic packages are version 2",
        ),
        (
            "range-min-over-max",
            in_dynamic("\"min\": 1", "\"min\": 99"),
            source.clone(),
            "larger than max",
        ),
        (
            "guards-disagree",
            in_dynamic("\"max\": 512", "\"max\": 600"),
            source.clone(),
            "do not match",
        ),
        (
            "source-not-onnx",
            manifest.clone(),
            b"not a model".to_vec(),
            "source.onnx",
        ),
    ];
    for (tag, m, s, want) in cases {
        let p = tmp(&format!("{tag}.rlxpkg"));
        write_zip(&p, &[("manifest.json", &m), ("source.onnx", &s)]);
        let e = load_dynamic_package(&p, Device::Cpu)
            .err()
            .unwrap_or_else(|| panic!("{tag}: loaded"));
        let msg = e.to_string();
        assert!(msg.contains(want), "{tag}: {msg}");
        assert!(
            msg.contains(p.to_str().unwrap()),
            "{tag}: names the file: {msg}"
        );
        let (code, _, err) = rlx(&["run", p.to_str().unwrap(), "-q"], &[]);
        assert_eq!(code, 1, "{tag}: {err}");
    }
}

fn zip_entry(p: &Path, name: &str) -> Vec<u8> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(p).unwrap()).unwrap();
    let mut v = vec![];
    z.by_name(name).unwrap().read_to_end(&mut v).unwrap();
    v
}

fn write_zip(p: &Path, entries: &[(&str, &[u8])]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(p).unwrap());
    for (n, b) in entries {
        z.start_file(
            *n,
            zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored),
        )
        .unwrap();
        z.write_all(b).unwrap();
    }
    z.finish().unwrap();
}

fn pb(p: &Path) -> Tensor {
    rlx_onnx_import::read_tensor_proto(&std::fs::read(p).unwrap())
        .unwrap()
        .1
}

/// A parameter input fed at run time (Reshape's `shape`, TopK's `K`, a Reduce's `axes`):
/// the dynamic model plans per value, and `rlx run` with `.pb` inputs runs the case; a data
/// input that decides the output shape (Compress's condition) is never frozen.
#[test]
fn parameter_inputs_are_planned_by_value() {
    let Some(suite) = fixture("fixtures/onnx-node") else {
        return;
    };
    // Library: Reshape with `shape` as a graph input, at two shape values.
    let case = suite.join("test_reshape_extended_dims");
    let src = OnnxSource::open(&case.join("model.onnx")).unwrap();
    let mut m = DynamicModel::new(Arc::new(src), Device::Cpu, BTreeMap::new()).unwrap();
    let data = pb(&case.join("test_data_set_0/input_0.pb"));
    let shape = pb(&case.join("test_data_set_0/input_1.pb"));
    let want = pb(&case.join("test_data_set_0/output_0.pb"));
    let names = ["data", "shape"];
    let out = m
        .run_tensors(&[(names[0], &data), (names[1], &shape)])
        .unwrap();
    assert_eq!(out[0].dims(), want.dims());
    assert_eq!(out[0].data().to_f64_vec(), want.data().to_f64_vec());
    let ev = m.last_plan().unwrap().clone();
    assert!(ev.new && ev.signature.contains("shape="), "{ev:?}");
    assert_eq!(m.plan_inputs(), vec!["data".to_string()]);
    // the same value: cached; another value of the same (declared) shape: a new plan
    m.run_tensors(&[(names[0], &data), (names[1], &shape)])
        .unwrap();
    assert!(!m.last_plan().unwrap().new);
    let n = data.numel();
    let flat = Tensor::from_i64(&[4], vec![1, 1, n as i64, 1]).unwrap();
    let out = m
        .run_tensors(&[(names[0], &data), (names[1], &flat)])
        .unwrap();
    assert!(m.last_plan().unwrap().new);
    assert_eq!(out[0].dims(), &[1, 1, n, 1]);
    assert_eq!(out[0].data().to_f64_vec(), data.data().to_f64_vec());

    // CLI: node cases with a parameter input, their .pb files as a user gives them
    for name in [
        "test_reshape_extended_dims",
        "test_top_k",
        "test_reduce_sum_keepdims_random",
        "test_unsqueeze_axis_1",
    ] {
        let err = node_case(&suite, name);
        assert!(
            err.contains("parameter input"),
            "{name}: the note says why: {err}"
        );
    }
}

/// Runs `rlx run` on an ONNX node case with its `.pb` inputs; checks every `output_<k>.pb`
/// (the case's expected values, from onnx's reference implementation). Returns stderr.
fn node_case(suite: &Path, name: &str) -> String {
    let case = suite.join(name);
    let ds = case.join("test_data_set_0");
    let out = tmp(&format!("node-{name}"));
    let mut args = vec![
        "run".to_string(),
        case.join("model.onnx").display().to_string(),
        "--output-dir".into(),
        out.display().to_string(),
    ];
    let mut k = 0;
    while ds.join(format!("input_{k}.pb")).is_file() {
        args.push(format!(
            "--input={}",
            ds.join(format!("input_{k}.pb")).display()
        ));
        k += 1;
    }
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let (code, _, err) = rlx(&a, &[]);
    assert_eq!(code, 0, "{name}: {err}");
    let mut k = 0;
    while ds.join(format!("output_{k}.pb")).is_file() {
        let (oname, want) = rlx_onnx_import::read_tensor_proto(
            &std::fs::read(ds.join(format!("output_{k}.pb"))).unwrap(),
        )
        .unwrap();
        let got = read_npy(&out.join(format!("{oname}.npy"))).unwrap();
        assert_close(&format!("{name} {oname}"), &got, &want, 1e-5, 1e-6);
        k += 1;
    }
    err
}

/// Ops whose output shape depends on values run between plans: node cases with their data
/// inputs fed at run time (nothing frozen by a harness), a model with such a node between
/// a head and a tail (outputs from both, a NaN localized in the tail), and a torchvision
/// detector (NonZero, TopK with a run-time K, GatherND) against onnxruntime.
#[test]
fn value_dependent_nodes_run_in_segments() {
    if let Some(suite) = fixture("fixtures/onnx-node") {
        for name in [
            "test_nonzero_example",
            "test_compress_0",
            "test_compress_default_axis",
            "test_unique_sorted_with_axis",
            "test_nonmaxsuppression_center_point_box_format",
            "test_nonmaxsuppression_two_batches",
        ] {
            let err = node_case(&suite, name);
            assert!(err.contains("ran in segments"), "{name}: {err}");
        }
    }
    let Some(dir) = fixture("fixtures/dynamic/nonzero_mid") else {
        return;
    };
    for size in ["4x5", "7x3"] {
        let case = dir.join(size);
        let out = tmp(&format!("nzm-{size}"));
        let model = dir.join("model.onnx");
        let x = format!("--input=x={}", case.join("input_x.npy").display());
        let (code, _, err) = rlx(
            &[
                "run",
                model.to_str().unwrap(),
                &x,
                "--output-dir",
                out.to_str().unwrap(),
            ],
            &[("RLX_DEBUG_NANS", "1")],
        );
        assert_eq!(code, 0, "{size}: {err}");
        assert!(
            err.contains("rlx nan-check: NaN at index 0 of")
                && err.contains("Log \"log\"")
                && err.contains("this op produced it"),
            "{size}: the NaN made in the tail is named: {err}"
        );
        for o in ["y", "total"] {
            let got = read_npy(&out.join(format!("{o}.npy"))).unwrap();
            let want = read_npy(&case.join(format!("expected_{o}.npy"))).unwrap();
            assert_close(&format!("nonzero_mid {size} {o}"), &got, &want, 1e-5, 1e-6);
        }
    }
    // An input file of the wrong dtype: the guard's line, then the file it came from.
    let bad = tmp("nzm-bad-x.npy");
    let t = Tensor::new([4usize, 5].as_slice(), rlx_ir::TensorData::I64(vec![0; 20])).unwrap();
    write_npy(&bad, &t).unwrap();
    let model = dir.join("model.onnx");
    let x = format!("--input=x={}", bad.display());
    let (code, _, err) = rlx(&["run", model.to_str().unwrap(), &x], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(r#"inputs[0] "x": unmatched dtype, expected: f32, but got: i64"#)
            && err.contains(&format!("rlx: input \"x\" was read from {}", bad.display())),
        "{err}"
    );
    // A file of the wrong rank: the importer's refusal, then the file.
    let bad3 = tmp("nzm-bad-rank3.npy");
    write_npy(&bad3, &Tensor::from_f32(&[2, 4, 5], vec![0.0; 40]).unwrap()).unwrap();
    let x = format!("--input=x={}", bad3.display());
    let (code, _, err) = rlx(&["run", model.to_str().unwrap(), &x], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(r#"graph input "x": declared rank 2"#)
            && err.contains(&format!(
                "rlx: input \"x\" was read from {}",
                bad3.display()
            )),
        "{err}"
    );
    // The library: one model, two sizes, segmented on the first run.
    let src = OnnxSource::open(&dir.join("model.onnx")).unwrap();
    let mut m = DynamicModel::new(Arc::new(src), Device::Cpu, BTreeMap::new()).unwrap();
    for size in ["7x3", "4x5", "7x3"] {
        let x = read_npy(&dir.join(size).join("input_x.npy")).unwrap();
        let outs = m.run_tensors(&[("x", &x)]).unwrap();
        assert!(m.is_segmented());
        let want = read_npy(&dir.join(size).join("expected_y.npy")).unwrap();
        assert_close(&format!("library {size} y"), &outs[0], &want, 1e-5, 1e-6);
    }

    // A package with ranges of a model that runs in segments: compiled (the corners are
    // not planned: there is no whole-model plan) and run at both sizes.
    let pkg = tmp("nzm.rlxpkg");
    let (code, _, err) = rlx(
        &[
            "compile",
            dir.join("model.onnx").to_str().unwrap(),
            "--dim",
            "n=1..8",
            "--dim",
            "m=1..8",
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("runs in segments around node \"nz\" (NonZero)"),
        "{err}"
    );
    for size in ["4x5", "7x3"] {
        let case = dir.join(size);
        let out = tmp(&format!("nzm-pkg-{size}"));
        let (code, _, err) = rlx(
            &[
                "run",
                pkg.to_str().unwrap(),
                &format!("--input=x={}", case.join("input_x.npy").display()),
                "--output-dir",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{size}: {err}");
        for o in ["y", "total"] {
            let got = read_npy(&out.join(format!("{o}.npy"))).unwrap();
            let want = read_npy(&case.join(format!("expected_{o}.npy"))).unwrap();
            assert_close(&format!("package {size} {o}"), &got, &want, 1e-5, 1e-6);
        }
    }

    // --nan-report on a run in segments says it is not written (and scans)
    let nr = tmp("nzm-report.json");
    let (code, _, err) = rlx(
        &[
            "run",
            dir.join("model.onnx").to_str().unwrap(),
            &format!("--input=x={}", dir.join("4x5/input_x.npy").display()),
            "--nan-report",
            nr.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("--nan-report: not written") && err.contains("Log \"log\""),
        "{err}"
    );
    // abort on a run in segments: exit 3 naming the op, as on a static model
    let (code, _, err) = rlx(
        &[
            "run",
            dir.join("model.onnx").to_str().unwrap(),
            &format!("--input=x={}", dir.join("4x5/input_x.npy").display()),
            "-q",
        ],
        &[("RLX_DEBUG_NANS", "abort")],
    );
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("stopped by RLX_DEBUG_NANS=abort at %7 Log \"log\""),
        "{err}"
    );
    // commands that need static shapes say why and point at rlx run
    let (code, _, err) = rlx(
        &[
            "bench",
            dir.join("model.onnx").to_str().unwrap(),
            "--runs",
            "1",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`rlx run` runs it in segments"), "{err}");
    // A model input whose dim is named like the cut's own symbol for a computed value
    // ("a.1" for NonZero output "a"): the invented names step aside.
    if let Some(cn) = fixture("fixtures/dynamic/cut_names") {
        let out = tmp("cut_names");
        let (code, _, err) = rlx(
            &[
                "run",
                cn.to_str().unwrap(),
                "--output-dir",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{err}");
        let got = read_npy(&out.join("s.npy")).unwrap();
        let want = read_npy(&cn.join("expected_s.npy")).unwrap();
        assert_close("cut_names s", &got, &want, 1e-6, 0.0);
    }

    let Some(det) = fixture("fixtures/dynamic/ssdlite") else {
        return;
    };
    let out = tmp("ssdlite");
    let (code, _, err) = rlx(
        &[
            "run",
            det.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "ssdlite: {err}");
    for (o, rtol, atol) in [
        ("boxes", 1e-4, 1e-3),
        ("scores", 1e-4, 1e-6),
        ("labels", 0.0, 0.0),
    ] {
        let got = read_npy(&out.join(format!("{o}.npy"))).unwrap();
        let want = read_npy(&det.join(format!("expected_{o}.npy"))).unwrap();
        assert_close(&format!("ssdlite {o}"), &got, &want, rtol, atol);
    }
}

/// A GPT-2-style decoder exported with `past_key_values`: one dynamic package runs the
/// prefill (empty past) and 32 decode steps, each fed the previous step's `present` outputs
/// (RLX's own), with logits matching onnxruntime's at every step.
#[test]
fn kv_cache_decode_32_steps_through_one_package() {
    let Some(dir) = fixture("fixtures/dynamic/gpt2_kv") else {
        return;
    };
    let pkg = tmp("gpt2_kv.rlxpkg");
    let model = dir.join("model.onnx");
    let (code, _, err) = rlx(
        &[
            "compile",
            model.to_str().unwrap(),
            "--dim",
            // total = past + seq must fit the 128 positions at the largest corner too
            "seq=1..32",
            "--dim",
            "past=0..96",
            "--dim",
            "total=1..128",
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let mut m = load_dynamic_package(&pkg, Device::Cpu).unwrap();
    let tokens = read_npy(&dir.join("tokens.npy"))
        .unwrap()
        .data()
        .to_i64_vec();
    let kv: Vec<String> = (0..2)
        .flat_map(|i| ["key", "value"].map(|n| format!("{i}.{n}")))
        .collect();
    let mut past: Vec<Tensor> = kv
        .iter()
        .map(|_| Tensor::from_f32(&[1, 4, 0, 8], vec![]).unwrap())
        .collect();
    let mut planned = 0;
    for step in 0..=32usize {
        let (ids, total) = if step == 0 {
            (tokens[..3].to_vec(), 3)
        } else {
            (vec![tokens[2 + step]], 3 + step)
        };
        let ids = Tensor::from_i64(&[1, ids.len()], ids).unwrap();
        let mask = Tensor::from_i64(&[1, total], vec![1; total]).unwrap();
        let names: Vec<String> = kv.iter().map(|x| format!("past.{x}")).collect();
        let mut feeds: Vec<(&str, &Tensor)> = vec![("input_ids", &ids), ("attention_mask", &mask)];
        feeds.extend(names.iter().map(|n| n.as_str()).zip(past.iter()));
        let mut outs = m.run_tensors(&feeds).unwrap();
        let ev = m.last_plan().unwrap();
        planned += ev.new as usize;
        // Item 1: the first plan imports the source once with symbolic dims; every later
        // step substitutes its sizes into that template instead of importing again.
        let want_by = if step == 0 {
            "new symbolic template, compiled once"
        } else {
            "symbolic template, compiled once"
        };
        assert_eq!(ev.specialized_by, want_by, "step {step}");
        let want = read_npy(&dir.join(format!("expected_logits_{step}.npy"))).unwrap();
        assert_close(&format!("step {step} logits"), &outs[0], &want, 1e-4, 1e-5);
        past = outs.split_off(1);
        assert_eq!(
            past[0].dims(),
            &[1, 4, total, 8],
            "step {step}: present grows"
        );
    }
    // Each step is a new (seq, past, total) signature: planned once each, 33 in all.
    assert_eq!(planned, 33);
}

/// Item 6: the tools that import a model (trace, lint, diverge, ...) take a dynamic package
/// and import its source at the sizes asked for, within the package's ranges.
#[test]
fn tools_take_a_dynamic_package() {
    let Some(dir) = fixture("fixtures/dynamic/bert_dyn") else {
        return;
    };
    let pkg = compile_pkg(&dir, "bert-tools");
    let case = dir.join("3x128");
    let out = tmp("bert-trace");
    let mut args = vec!["trace".to_string(), pkg.display().to_string()];
    args.extend(input_args(&case));
    args.extend(["-o".into(), out.display().to_string()]);
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let (code, _, err) = rlx(&a, &[]);
    assert_eq!(code, 0, "rlx trace on the package: {err}");
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("trace.json")).unwrap()).unwrap();
    // The source model's ops were traced (the encoder has a Softmax per layer).
    let ops = trace["ops"].as_array().expect("ops");
    assert!(
        ops.iter().any(|o| o.to_string().contains("Softmax")),
        "trace.json holds the source's ops"
    );
    let (code, out, err) = rlx(&["lint", pkg.to_str().unwrap(), "--dim", "batch=2"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("no constant folds to NaN/Inf"), "{out}");
    // Out of the package's range: refused before anything is generated.
    let (code, _, err) = rlx(&["trace", pkg.to_str().unwrap(), "--dim", "batch=17"], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--dim batch=17: outside the package's range of \"batch\", 1..16"),
        "{err}"
    );
    // A static package has no source to import.
    let stat = tmp("bert-static.rlxpkg");
    let model = dir.join("model.onnx");
    let (code, _, err) = rlx(
        &[
            "compile",
            model.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=4",
            "-o",
            stat.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = rlx(&["lint", stat.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "lint's error status");
    assert!(err.contains("a static RLX package"), "{err}");
    // A truncated package is named as an unreadable one (reduce and precision said "a static
    // RLX package" of it).
    let bytes = std::fs::read(&stat).unwrap();
    let cut = tmp("bert-cut.rlxpkg");
    std::fs::write(&cut, &bytes[..100]).unwrap();
    let c = cut.to_str().unwrap();
    for args in [
        vec!["reduce", "--until", "nan", c],
        vec!["precision", "--to", "float16", c],
    ] {
        let (code, _, err) = rlx(&args, &[]);
        assert_ne!(code, 0, "{args:?}");
        assert!(
            err.contains("not a readable RLX package") && !err.contains("static RLX package"),
            "{args:?}: {err}"
        );
    }
}

/// Item 1 on a CNN: one package with dynamic batch, height and width runs three image sizes
/// like onnxruntime, every plan after the first made from the symbolic template.
/// cnn_dyn compiled to a dynamic package (batch 1..8, height and width 16..96) named `name`.
fn compile_cnn_dyn(dir: &Path, name: &str) -> PathBuf {
    let pkg = tmp(name);
    let model = dir.join("model.onnx");
    let (code, _, err) = rlx(
        &[
            "compile",
            model.to_str().unwrap(),
            "--dim",
            "batch=1..8",
            "--dim",
            "height=16..96",
            "--dim",
            "width=16..96",
            "-o",
            pkg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "rlx compile: {err}");
    pkg
}

#[test]
fn cnn_with_dynamic_batch_and_image_size_runs_from_one_template() {
    let Some(dir) = fixture("fixtures/dynamic/cnn_dyn") else {
        return;
    };
    let pkg = compile_cnn_dyn(&dir, "cnn_dyn.rlxpkg");
    let mut m = load_dynamic_package(&pkg, Device::Cpu).unwrap();
    for (i, size) in ["1x32x32", "2x45x61", "4x64x40"].iter().enumerate() {
        let x = read_npy(&dir.join(format!("input_{size}.npy"))).unwrap();
        let out = m.run_tensors(&[("image", &x)]).unwrap();
        let want = read_npy(&dir.join(format!("expected_{size}.npy"))).unwrap();
        assert_close(&format!("{size} logits"), &out[0], &want, 1e-4, 1e-5);
        let ev = m.last_plan().unwrap();
        assert!(ev.new, "{size}: a new signature");
        let want_by = if i == 0 {
            "new symbolic template, compiled once"
        } else {
            "symbolic template, compiled once"
        };
        assert_eq!(ev.specialized_by, want_by, "{size} (run {i})");
    }
}

/// `rlx run` on a dynamic package: a `--dim` the input file contradicts is refused naming
/// the input, the file and both sizes (it was silently overridden by the file's size; found
/// by QA), and the plan line says the graph came from the symbolic template (it said
/// "import + compile" for every plan).
#[test]
fn run_refuses_a_dim_its_input_file_contradicts_and_says_how_it_planned() {
    let Some(dir) = fixture("fixtures/dynamic/cnn_dyn") else {
        return;
    };
    let pkg = compile_cnn_dyn(&dir, "cnn_dyn_dims.rlxpkg");
    let x = dir.join("input_1x32x32.npy");
    let image = format!("image={}", x.display());
    let (code, _, err) = rlx(
        &[
            "run",
            pkg.to_str().unwrap(),
            "--dim",
            "height=40",
            "-i",
            &image,
        ],
        &[],
    );
    assert_ne!(code, 0, "a contradicted --dim was accepted: {err}");
    assert!(
        err.contains("input \"image\"")
            && err.contains("input_1x32x32.npy")
            && err.contains("dim 2 (height) is 32 here but --dim height=40 was given"),
        "{err}"
    );
    // An agreeing --dim runs, and the plan line names the template.
    let (code, _, err) = rlx(
        &[
            "run",
            pkg.to_str().unwrap(),
            "--dim",
            "height=32",
            "-i",
            &image,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("by new symbolic template, compiled once"),
        "{err}"
    );
}
