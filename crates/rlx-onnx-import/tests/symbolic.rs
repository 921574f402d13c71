//! Symbolic import (issue 32 item 1): a model imported once with symbolic dims and then
//! specialized by substitution must give the graph the per-signature import gives. The
//! reference is the per-signature import at the same sizes (tested against onnxruntime
//! elsewhere): both graphs run through the CPU reference kernels (`eval_op`, node by node)
//! on the same inputs and their outputs must be equal bit for bit; every node's shape in
//! the specialized graph must be what static shape inference gives for its inputs.

use rlx_ir::infer_shape::infer_output;
use rlx_ir::{Graph, Op, Tensor, TensorData};
use rlx_onnx_import::{ImportOptions, OnnxModel};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Deterministic inputs: integer inputs all 1 (token ids, attention masks), floats from a
/// fixed sequence in [-1, 1).
fn inputs(g: &Graph) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for n in &g.nodes {
        if let Op::Input { name } = &n.op {
            let d = n.shape.dims_usize().to_vec();
            let len: usize = d.iter().product();
            let dt = n.shape.dtype;
            let data = if dt.is_float() {
                let v: Vec<f64> = (0..len)
                    .map(|i| ((i * 7919 + 13) % 2000) as f64 / 1000.0 - 1.0)
                    .collect();
                TensorData::from_f64(dt, &v)
            } else {
                TensorData::from_i64(dt, &vec![1; len])
            };
            out.insert(name.clone(), Tensor::new(d, data).unwrap());
        }
    }
    out
}

/// Run `g` node by node through the CPU reference kernels.
fn run(g: &Graph, feeds: &HashMap<String, Tensor>) -> Vec<Arc<Tensor>> {
    let mut vals: Vec<Option<Arc<Tensor>>> = vec![None; g.len()];
    for n in &g.nodes {
        let v = match &n.op {
            Op::Constant(t) => t.clone(),
            Op::Input { name } => Arc::new(feeds[name].clone()),
            op => {
                let ins: Vec<&Tensor> = n
                    .inputs
                    .iter()
                    .map(|x| vals[x.index()].as_deref().expect("topological order"))
                    .collect();
                Arc::new(
                    rlx_cpu::eval_op(op, &ins, &n.shape)
                        .unwrap_or_else(|e| panic!("node {} {}: {e:?}", n.id, op.name())),
                )
            }
        };
        vals[n.id.index()] = Some(v);
    }
    g.outputs
        .iter()
        .map(|o| vals[o.index()].clone().unwrap())
        .collect()
}

fn shapes_of(sizes: &[(&str, Vec<usize>)]) -> HashMap<String, Vec<usize>> {
    sizes
        .iter()
        .map(|(n, d)| (n.to_string(), d.clone()))
        .collect()
}

fn opts(shapes: &HashMap<String, Vec<usize>>) -> ImportOptions {
    ImportOptions {
        input_shapes: shapes.clone(),
        ..Default::default()
    }
}

/// Import symbolically at `probe`, then at each of `at`: the specialized graph's shapes
/// are consistent and it computes what the per-signature import computes.
fn check_model(
    path: PathBuf,
    probe: HashMap<String, Vec<usize>>,
    at: &[HashMap<String, Vec<usize>>],
) {
    if !path.exists() {
        eprintln!("skipped: {} (run its fixture script)", path.display());
        return;
    }
    let model = OnnxModel::open(&path).unwrap();
    let t = model
        .import_symbolic(&opts(&probe))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (shapes, attrs, consts) = t.counts();
    assert!(shapes > 0, "nothing symbolic was tracked");
    eprintln!(
        "{}: {shapes} symbolic shapes, {attrs} attributes, {consts} values, guards: {}",
        path.display(),
        t.guards
            .iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    );
    // Compile once (held nodes unfolded), to be patched per binding below.
    assert!(t.compiles_once(), "{}", path.display());
    let copts = rlx_compile::compiler::CompileOptions {
        lint: false,
        ..Default::default()
    };
    let mut tags = t.tags();
    let once = rlx_compile::compiler::compile_tagged(t.graph.clone(), &copts, &mut tags).unwrap();
    for sizes in std::iter::once(&probe).chain(at) {
        let g = t
            .specialize(sizes)
            .unwrap_or_else(|e| panic!("{sizes:?}: {e}"));
        // The compiled template patched to these sizes computes what compiling the
        // per-signature import computes.
        let mut c = once.graph.clone();
        t.patch_compiled(&mut c, &tags, sizes)
            .unwrap_or_else(|e| panic!("{sizes:?}: patch: {e}"));
        let c = rlx_compile::compiler::finish_held(c, &copts);
        rlx_compile::verify::verify(&c).unwrap_or_else(|e| panic!("{sizes:?}: {e}"));
        for n in &g.nodes {
            if n.op.is_leaf() {
                continue;
            }
            let ins: Vec<&rlx_ir::Shape> = n.inputs.iter().map(|i| &g.node(*i).shape).collect();
            let want = infer_output(&n.op, &ins)
                .unwrap_or_else(|e| panic!("{sizes:?}: {} {}: {}", n.id, n.op.name(), e.0));
            assert_eq!(n.shape, want, "{sizes:?}: node {} {}", n.id, n.op.name());
        }
        let plain = model.import(&opts(sizes)).unwrap();
        // Node for node the graph the per-signature import builds (ops, constants' values,
        // inputs, types, origins).
        assert_eq!(g.len(), plain.len(), "{sizes:?}: node counts");
        for (x, y) in g.nodes.iter().zip(&plain.nodes) {
            assert_eq!(x, y, "{sizes:?}: node {}", x.id);
        }
        assert_eq!(g.outputs, plain.outputs);
        let feeds = inputs(&plain);
        let (a, b) = (run(&g, &feeds), run(&plain, &feeds));
        let plain_c = rlx_compile::compiler::compile(plain.clone(), &copts)
            .unwrap()
            .graph;
        let (ca, cb) = (run(&c, &feeds), run(&plain_c, &feeds));
        if c.len() != plain_c.len() {
            let hist = |g: &Graph| {
                let mut h: std::collections::BTreeMap<String, i64> = Default::default();
                for n in &g.nodes {
                    *h.entry(n.op.name()).or_default() += 1;
                }
                h
            };
            let (ha, hb) = (hist(&c), hist(&plain_c));
            let diff: Vec<_> = ha
                .iter()
                .filter(|(k, v)| hb.get(*k) != Some(v))
                .map(|(k, v)| (k.clone(), *v, hb.get(k).copied().unwrap_or(0)))
                .collect();
            panic!(
                "{sizes:?}: compiled node counts {} vs {}: {diff:?}",
                c.len(),
                plain_c.len()
            );
        }
        for (i, (x, y)) in ca.iter().zip(&cb).enumerate() {
            assert_eq!(x.dims(), y.dims(), "{sizes:?}: compiled output {i}");
            let (xv, yv) = (x.data().to_f64_vec(), y.data().to_f64_vec());
            assert!(
                xv.iter()
                    .zip(&yv)
                    .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan())),
                "{sizes:?}: compiled output {i} differs"
            );
        }
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.dims(), y.dims(), "{sizes:?}: output {i}");
            let (xv, yv) = (x.data().to_f64_vec(), y.data().to_f64_vec());
            for (j, (p, q)) in xv.iter().zip(&yv).enumerate() {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{sizes:?}: output {i} element {j}: {p} vs {q}"
                );
            }
        }
    }
}

fn gpt2_sizes(
    layers: usize,
    heads: usize,
    hd: usize,
    seq: usize,
    past: usize,
) -> HashMap<String, Vec<usize>> {
    let mut v = vec![
        ("input_ids", vec![1, seq]),
        ("attention_mask", vec![1, seq + past]),
    ];
    let names: Vec<String> = (0..layers)
        .flat_map(|l| [format!("past.{l}.key"), format!("past.{l}.value")])
        .collect();
    let mut m = shapes_of(&std::mem::take(&mut v));
    for n in names {
        m.insert(n, vec![1, heads, past, hd]);
    }
    m
}

#[test]
fn gpt2_decoder_with_kv_cache_specializes_to_every_past_length() {
    let path = repo().join("fixtures/dynamic/gpt2_kv/model.onnx");
    // Decode steps (seq 1) at growing past lengths, from one template made at past 3.
    let at: Vec<_> = [1, 2, 5, 17, 40]
        .iter()
        .map(|&p| gpt2_sizes(2, 4, 8, 1, p))
        .collect();
    check_model(path.clone(), gpt2_sizes(2, 4, 8, 1, 3), &at);
    // Prefill (past 0) at several prompt lengths, from a template made at seq 5.
    let at: Vec<_> = [2, 9, 31]
        .iter()
        .map(|&s| gpt2_sizes(2, 4, 8, s, 0))
        .collect();
    check_model(path, gpt2_sizes(2, 4, 8, 5, 0), &at);
}

#[test]
fn bert_encoder_specializes_to_every_batch_and_sequence() {
    let path = repo().join("fixtures/dynamic/bert_dyn/model.onnx");
    let bs = |b: usize, s: usize| {
        shapes_of(&[
            ("input_ids", vec![b, s]),
            ("attention_mask", vec![b, s]),
            ("token_type_ids", vec![b, s]),
        ])
    };
    check_model(path, bs(2, 5), &[bs(1, 7), bs(3, 128), bs(4, 2)]);
}

/// Input shapes with every named dim at its size in `sizes` (unnamed ones 1).
fn shapes_at(model: &OnnxModel, sizes: &HashMap<&str, usize>) -> HashMap<String, Vec<usize>> {
    model
        .declared_inputs()
        .into_iter()
        .map(|(name, s)| {
            let d = s
                .dims
                .iter()
                .map(|d| match d {
                    rlx_ir::Dim::Static(n) => *n,
                    rlx_ir::Dim::Sym(p) => sizes.get(p.as_str()).copied().unwrap_or(1),
                })
                .collect();
            (name, d)
        })
        .collect()
}

/// Every generated fixture with named input dims (transformers, a CNN with dynamic batch,
/// height and width): symbolic at a probe where each symbol has its own size, then at three
/// other bindings, against the
/// per-signature import. A model the symbolic import refuses is listed, not failed (it
/// runs per signature); the fixtures named in `must` have to be symbolic.
#[test]
fn fixtures_with_named_dims_specialize_like_per_signature_imports() {
    let must = [
        "bert_tiny",
        "qwen3_tiny",
        "t5_tiny",
        "gpt2_kv",
        "bert_dyn",
        "qwen3_overflow",
    ];
    let mut seen = 0;
    for dir in [
        "fixtures/transformers",
        "fixtures/dynamic",
        "fixtures/precision",
    ] {
        let Ok(rd) = std::fs::read_dir(repo().join(dir)) else {
            continue;
        };
        let mut cases: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        cases.sort();
        for case in cases {
            let path = case.join("model.onnx");
            let Ok(model) = OnnxModel::open(&path) else {
                continue;
            };
            let mut syms: Vec<String> = model
                .declared_inputs()
                .iter()
                .flat_map(|(_, s)| s.dims.clone())
                .filter_map(|d| match d {
                    rlx_ir::Dim::Sym(p) if p != "?" => Some(p),
                    _ => None,
                })
                .collect();
            syms.sort();
            syms.dedup();
            if syms.is_empty() {
                continue;
            }
            let name = case.file_name().unwrap().to_string_lossy().to_string();
            // gpt2_kv's `total` is `past + seq`: give it that relation.
            let at = |base: usize| -> HashMap<&str, usize> {
                // Image sides large enough for the CNN's strides, odd for floor rounding.
                let mut m: HashMap<&str, usize> = syms
                    .iter()
                    .enumerate()
                    .map(|(i, s)| match s.as_str() {
                        "height" | "width" => (s.as_str(), 8 * (base + i) + 1),
                        _ => (s.as_str(), base + i),
                    })
                    .collect();
                if let (Some(&p), Some(&q)) = (m.get("past"), m.get("seq")) {
                    m.insert("total", p + q);
                }
                m
            };
            let probe = shapes_at(&model, &at(2));
            match model.import_symbolic(&opts(&probe)) {
                Ok(_) => {
                    seen += 1;
                    let others: Vec<_> = [5, 9, 17]
                        .iter()
                        .map(|&b| shapes_at(&model, &at(b)))
                        .collect();
                    check_model(path.clone(), probe, &others);
                }
                Err(e) => {
                    assert!(!must.contains(&name.as_str()), "{name}: {e}");
                    eprintln!("{name}: imported per signature: {e}");
                }
            }
        }
    }
    if rlx_ir::env::is_on("RLX_REQUIRE_FIXTURES") {
        assert!(seen >= must.len(), "only {seen} symbolic fixtures found");
    }
}

#[test]
fn a_template_refuses_sizes_its_guards_exclude() {
    let path = repo().join("fixtures/dynamic/gpt2_kv/model.onnx");
    if !path.exists() {
        return;
    }
    let model = OnnxModel::open(&path).unwrap();
    let t = model
        .import_symbolic(&opts(&gpt2_sizes(2, 4, 8, 1, 3)))
        .unwrap();
    // The graph was built for a prompt of at least one token (`seq >= 1` is a guard):
    // an empty prompt fails the guard instead of running a graph made for another path.
    let e = match t.specialize(&gpt2_sizes(2, 4, 8, 0, 3)) {
        Ok(_) => panic!("a binding outside the guards was accepted"),
        Err(e) => e,
    };
    assert!(
        matches!(e, rlx_onnx_import::sym::SpecializeError::Guard(ref g) if g.contains("seq")),
        "{e}"
    );
    // A static dim that differs is an input error naming the input.
    let mut bad = gpt2_sizes(2, 4, 8, 1, 3);
    bad.insert("past.0.key".into(), vec![1, 5, 3, 8]);
    let e = match t.specialize(&bad) {
        Ok(_) => panic!("a wrong static dim was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("past.0.key"), "{e}");
    // Two inputs sharing a symbol must agree.
    let mut bad = gpt2_sizes(2, 4, 8, 1, 3);
    bad.insert("past.1.value".into(), vec![1, 4, 4, 8]);
    let e = match t.specialize(&bad) {
        Ok(_) => panic!("disagreeing inputs were accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("past"), "{e}");
}
