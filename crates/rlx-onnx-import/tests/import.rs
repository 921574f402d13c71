//! Import tests on small models built by encoding the importer's own prost structs
//! (`common`). Over 1,000 lines, kept as one file on purpose: each test is one op's or
//! feature's import, independent of the others, and they share only `common`'s builders;
//! a split by op family would cut no dependency. The symbolic import's size rules are in
//! symbolic_rules.rs.

use prost::Message;
use rlx_ir::{DType, Dim, Graph, Op, Shape, Tensor, TensorData};
use rlx_onnx_import::proto::*;
use rlx_onnx_import::tensor::tensor_to_proto;
use rlx_onnx_import::{
    import_onnx, import_onnx_bytes, read_tensor_proto, ImportError, ImportOptions,
};
use std::collections::HashMap;

mod common;
use common::*;

fn import(bytes: &[u8]) -> Result<Graph, ImportError> {
    import_onnx_bytes(bytes, None, &ImportOptions::default())
}

fn label(g: &Graph, id: rlx_ir::NodeId) -> String {
    rlx_ir::provenance::node_label(g, id)
}

fn out_node(g: &Graph, i: usize) -> &rlx_ir::Node {
    g.node(g.outputs[i])
}

// ---- tests ----

#[test]
fn mlp_with_symbolic_batch() {
    let w = f32_init("fc.weight", &[3, 4], (0..12).map(|i| i as f32).collect());
    let mut b = TensorProto {
        name: "fc.bias".into(),
        dims: vec![3],
        data_type: data_type::FLOAT,
        float_data: vec![0.5, -0.5, 1.0],
        ..Default::default()
    };
    b.raw_data.clear();
    let bytes = model(
        17,
        vec![
            node(
                "Gemm",
                "layer0.fc",
                &["x", "fc.weight", "fc.bias"],
                &["h"],
                vec![a_int("transB", 1)],
            ),
            node("Relu", "", &["h"], &["h_relu"], vec![]),
            node("Softmax", "head.softmax", &["h_relu"], &["probs"], vec![]),
        ],
        vec![w, b],
        vec![vi("x", data_type::FLOAT, &[Err("batch"), Ok(4)])],
        vec![out("probs")],
    );
    let opts = ImportOptions {
        dims: HashMap::from([("batch".to_string(), 2)]),
        ..Default::default()
    };
    let g = import_onnx_bytes(&bytes, None, &opts).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    let x = g.input_by_name("x").unwrap();
    assert_eq!(g.node(x).shape, Shape::new(&[2, 4], DType::F32));
    assert_eq!(
        g.input_decls,
        vec![(
            "x".to_string(),
            Shape::with_dims(vec![Dim::Sym("batch".into()), Dim::Static(4)], DType::F32)
        )]
    );
    assert_eq!(g.output_names, vec!["probs".to_string()]);
    let y = out_node(&g, 0);
    assert!(matches!(y.op, Op::Softmax { axis: 1 }));
    assert_eq!(y.shape, Shape::new(&[2, 3], DType::F32));
    assert_eq!(label(&g, y.id), "head.softmax");
    // The unnamed Relu is labelled with its first output name.
    let relu = g.node(y.inputs[0]);
    assert_eq!(label(&g, relu.id), "h_relu");
    assert_eq!(
        relu.origin.as_ref().unwrap().op_type.as_deref(),
        Some("Relu")
    );
    // Every node Gemm created carries the Gemm's name; the W^T Transpose too.
    let gemm_nodes: Vec<_> = g
        .nodes
        .iter()
        .filter(|n| n.origin.as_ref().is_some_and(|o| o.label == "layer0.fc"))
        .collect();
    assert!(gemm_nodes.iter().any(|n| matches!(n.op, Op::MatMul)));
    assert!(gemm_nodes
        .iter()
        .any(|n| matches!(n.op, Op::Binary(rlx_ir::BinaryOp::Add))));
    // transB's Transpose of the float weight is not folded into a transposed copy at
    // import: the CPU compile keeps it (its MatMul reads the weight in place, each output's
    // weights one contiguous row), a GPU compile folds it.
    let is_wt = |g: &rlx_ir::Graph, n: &rlx_ir::Node| {
        matches!(n.op, Op::Transpose { .. })
            && matches!(g.node(n.inputs[0]).op, Op::Constant(_))
            && label(g, n.inputs[0]) == "fc.weight"
    };
    assert!(gemm_nodes.iter().any(|n| is_wt(&g, n)));
    let compile = |keep| {
        let o = rlx_compile::compiler::CompileOptions {
            lint: false,
            keep_matmul_transposes: keep,
            ..Default::default()
        };
        rlx_compile::compiler::compile(g.clone(), &o).unwrap().graph
    };
    let cpu = compile(true);
    assert!(cpu.nodes.iter().any(|n| is_wt(&cpu, n)));
    let gpu = compile(false);
    assert!(!gpu
        .nodes
        .iter()
        .any(|n| matches!(n.op, Op::Transpose { .. })));
    // Initializers keep their names as labels.
    assert!(g
        .nodes
        .iter()
        .any(|n| matches!(n.op, Op::Constant(_)) && label(&g, n.id) == "fc.bias"));
}

#[test]
fn shape_chain_folds_to_a_static_reshape() {
    // x [B, 6] → Shape → Gather(0) → Unsqueeze → Concat([b, 2, 3]) → Reshape.
    let bytes = model(
        17,
        vec![
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node(
                "Constant",
                "zero",
                &[],
                &["zero"],
                vec![a_tensor(
                    "value",
                    tensor_to_proto("", &Tensor::new(vec![], TensorData::I64(vec![0])).unwrap()),
                )],
            ),
            node(
                "Gather",
                "gather",
                &["s", "zero"],
                &["b"],
                vec![a_int("axis", 0)],
            ),
            node(
                "Constant",
                "ax",
                &[],
                &["ax"],
                vec![a_tensor("value", i64_init("", &[0]))],
            ),
            node("Unsqueeze", "unsq", &["b", "ax"], &["b1"], vec![]),
            node(
                "Concat",
                "cat",
                &["b1", "rest"],
                &["target"],
                vec![a_int("axis", 0)],
            ),
            node("Reshape", "reshape", &["x", "target"], &["y"], vec![]),
            node(
                "Cast",
                "to_half",
                &["y"],
                &["z"],
                vec![a_int("to", data_type::FLOAT16 as i64)],
            ),
        ],
        vec![i64_init("rest", &[2, 3])],
        vec![vi("x", data_type::FLOAT, &[Err("B"), Ok(6)])],
        vec![out("z")],
    );
    let opts = ImportOptions {
        dims: HashMap::from([("B".to_string(), 5)]),
        ..Default::default()
    };
    let g = import_onnx_bytes(&bytes, None, &opts).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    let z = out_node(&g, 0);
    assert_eq!(z.shape, Shape::new(&[5, 2, 3], DType::F16));
    let y = g.node(z.inputs[0]);
    assert!(matches!(&y.op, Op::Reshape { dims } if dims == &[5, 2, 3]));
    assert_eq!(label(&g, y.id), "reshape");
    // Folded shape arithmetic is pruned: input, reshape, cast.
    assert_eq!(g.nodes.len(), 3, "{g}");
}

/// An opset-13 model of one Slice of f32 input `x` (dims `x_dims`) with constant starts,
/// ends, axes and steps.
fn slice_model(
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
    x_dims: &[i64],
) -> Vec<u8> {
    model(
        13,
        vec![node(
            "Slice",
            "rev",
            &["x", "starts", "ends", "axes", "steps"],
            &["y"],
            vec![],
        )],
        vec![
            i64_init("starts", starts),
            i64_init("ends", ends),
            i64_init("axes", axes),
            i64_init("steps", steps),
        ],
        vec![f32_in("x", x_dims)],
        vec![out("y")],
    )
}

#[test]
fn slice_clamps_and_negative_steps() {
    let bytes = slice_model(&[-1, 1], &[i64::MIN, i64::MAX], &[0, 1], &[-2, 1], &[5, 4]);
    let g = import(&bytes).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    let y = out_node(&g, 0);
    assert_eq!(
        y.op,
        Op::Slice {
            starts: vec![4, 1],
            steps: vec![-2, 1],
            sizes: vec![3, 3]
        }
    );
}

/// A negative step over an empty axis takes nothing (ONNX: onnxruntime gives shape [3, 0]);
/// the start clamp to `[0, dim - 1]` must not run with dim 0.
#[test]
fn slice_negative_step_on_an_empty_axis() {
    let bytes = slice_model(&[-1], &[-10], &[1], &[-1], &[3, 0]);
    let g = import(&bytes).unwrap();
    assert_eq!(out_node(&g, 0).shape, Shape::new(&[3, 0], DType::F32));
}

#[test]
fn opset9_softmax_unsqueeze_and_constant_of_shape() {
    let big = TensorProto {
        dims: vec![1],
        data_type: data_type::FLOAT,
        float_data: vec![0.25],
        ..Default::default()
    };
    let bytes = model(
        9,
        vec![
            node(
                "Unsqueeze",
                "unsq",
                &["x"],
                &["x1"],
                vec![a_ints("axes", &[0, 3])],
            ),
            node("Softmax", "sm", &["x1"], &["p"], vec![]),
            node(
                "ConstantOfShape",
                "w",
                &["wshape"],
                &["w"],
                vec![a_tensor("value", big.clone())],
            ),
            node(
                "ConstantOfShape",
                "small",
                &["sshape"],
                &["s"],
                vec![a_tensor("value", big)],
            ),
            node("Mul", "scale", &["p", "s"], &["y"], vec![]),
        ],
        vec![
            i64_init("wshape", &[1024, 1024]),
            i64_init("sshape", &[1, 1, 1, 1]),
        ],
        vec![f32_in("x", &[2, 3])],
        vec![out("y"), out("w")],
    );
    let g = import(&bytes).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    // Softmax < 13 with axis 1 on [1,2,3,1] coerces to 2-D [1, 6].
    let y = out_node(&g, 0);
    assert_eq!(y.shape, Shape::new(&[1, 2, 3, 1], DType::F32));
    let has_2d_softmax = g.nodes.iter().any(|n| {
        matches!(n.op, Op::Softmax { axis: 1 }) && n.shape.dims_usize().to_vec() == vec![1, 6]
    });
    assert!(has_2d_softmax, "{g}");
    // The small ConstantOfShape folded; the 1M-element one stays a Broadcast of a scalar.
    assert!(matches!(g.node(y.inputs[1]).op, Op::Constant(_)));
    let w = out_node(&g, 1);
    assert!(matches!(&w.op, Op::Broadcast { dims } if dims == &[1024, 1024]));
}

#[test]
fn conv_pool_same_padding_and_ceil_mode() {
    let w = f32_init("w", &[4, 3, 3, 3], vec![0.1; 108]);
    let bytes = model(
        17,
        vec![
            node(
                "Conv",
                "conv",
                &["x", "w"],
                &["c"],
                vec![
                    a_ints("strides", &[2, 2]),
                    AttributeProto {
                        name: "auto_pad".into(),
                        r#type: attr_type::STRING,
                        s: b"SAME_UPPER".to_vec(),
                        ..Default::default()
                    },
                ],
            ),
            node(
                "MaxPool",
                "pool",
                &["c"],
                &["p"],
                vec![
                    a_ints("kernel_shape", &[3, 3]),
                    a_ints("strides", &[2, 2]),
                    a_int("ceil_mode", 1),
                ],
            ),
            node("GlobalAveragePool", "gap", &["p"], &["y"], vec![]),
        ],
        vec![w],
        vec![f32_in("x", &[1, 3, 15, 15])],
        vec![out("y")],
    );
    let g = import(&bytes).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    let conv = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, Op::Conv(_)))
        .unwrap();
    assert_eq!(conv.shape.dims_usize().to_vec(), vec![1, 4, 8, 8]);
    let pool = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, Op::Pool(_)))
        .unwrap();
    assert_eq!(pool.shape.dims_usize().to_vec(), vec![1, 4, 4, 4]);
    assert_eq!(
        out_node(&g, 0).shape.dims_usize().to_vec(),
        vec![1, 4, 1, 1]
    );
}

#[test]
fn clip_lowers_to_max_min_and_split_to_slices() {
    let bytes = model(
        13,
        vec![
            node("Clip", "clip", &["x", "lo", ""], &["c"], vec![]),
            node(
                "Split",
                "split",
                &["c", "sizes"],
                &["a", "b"],
                vec![a_int("axis", 1)],
            ),
        ],
        vec![
            tensor_to_proto("lo", &Tensor::scalar_f32(0.0)),
            i64_init("sizes", &[1, 3]),
        ],
        vec![f32_in("x", &[2, 4])],
        vec![out("a"), out("b")],
    );
    let g = import(&bytes).unwrap();
    rlx_compile::verify::verify(&g).unwrap();
    assert_eq!(out_node(&g, 0).shape.dims_usize().to_vec(), vec![2, 1]);
    assert_eq!(out_node(&g, 1).shape.dims_usize().to_vec(), vec![2, 3]);
    let clip = g.node(out_node(&g, 0).inputs[0]);
    assert_eq!(clip.op, Op::Binary(rlx_ir::BinaryOp::Max));
    assert_eq!(label(&g, clip.id), "clip");
}

#[test]
fn read_tensor_proto_roundtrip() {
    let t = Tensor::from_f32(&[2, 2], vec![1.0, -2.0, f32::NAN, 4.0]).unwrap();
    let bytes = tensor_to_proto("input_0", &t).encode_to_vec();
    let (name, back) = read_tensor_proto(&bytes).unwrap();
    assert_eq!(name, "input_0");
    assert_eq!(back.dims(), &[2, 2]);
    let v = back.as_f32().unwrap();
    assert_eq!(v[1], -2.0);
    assert!(v[2].is_nan());
    // f16 stored in int32_data (bits).
    let p = TensorProto {
        dims: vec![2],
        data_type: data_type::FLOAT16,
        int32_data: vec![0x3c00, 0xc000],
        name: "h".into(),
        ..Default::default()
    };
    let (_, h) = read_tensor_proto(&p.encode_to_vec()).unwrap();
    assert_eq!(h.data().to_f64_vec(), vec![1.0, -2.0]);
}

// ---- errors: clear messages, never a panic ----

#[test]
fn truncated_file_is_a_clear_error() {
    let bytes = model(
        17,
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![f32_init("w", &[16], vec![1.0; 16])],
        vec![f32_in("x", &[2])],
        vec![out("y")],
    );
    let dir = std::env::temp_dir().join(format!("rlx_onnx_trunc_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.onnx");
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let e = import_onnx(&path, &ImportOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ImportError::Decode { .. }), "{msg}");
    assert!(
        msg.contains("cut.onnx") && msg.contains("not a valid ONNX protobuf"),
        "{msg}"
    );
    let e = import_onnx(&dir.join("missing.onnx"), &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bogus_huge_dims_fail_before_allocating() {
    for dims in [
        vec![1i64 << 40, 1 << 40],
        vec![1 << 31, 1 << 31, 4],
        vec![-3, 2],
    ] {
        let t = TensorProto {
            name: "evil".into(),
            dims: dims.clone(),
            data_type: data_type::FLOAT,
            raw_data: vec![0; 16],
            ..Default::default()
        };
        let bytes = model(17, vec![], vec![t], vec![], vec![out("evil")]);
        let e = import(&bytes).unwrap_err().to_string();
        assert!(e.starts_with("tensor \"evil\""), "{dims:?}: {e}");
    }
    // Typed data with a count that does not match dims.
    let t = TensorProto {
        name: "short".into(),
        dims: vec![1_000_000_000],
        data_type: data_type::INT64,
        int64_data: vec![1, 2],
        ..Default::default()
    };
    let e = import(&model(17, vec![], vec![t], vec![], vec![out("short")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"short\"") && e.contains("need 1000000000"),
        "{e}"
    );
}

fn external(loc: &str, offset: &str, length: &str) -> TensorProto {
    TensorProto {
        name: "ext".into(),
        dims: vec![4],
        data_type: data_type::FLOAT,
        data_location: DATA_LOCATION_EXTERNAL,
        external_data: [("location", loc), ("offset", offset), ("length", length)]
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn external_data_is_confined_to_the_model_folder() {
    let dir = std::env::temp_dir().join(format!("rlx_onnx_ext_{}", std::process::id()));
    let sub = dir.join("model");
    std::fs::create_dir_all(&sub).unwrap();
    let mut raw = vec![0u8; 8];
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        raw.extend(x.to_le_bytes());
    }
    std::fs::write(sub.join("weights.bin"), &raw).unwrap();
    std::fs::write(dir.join("secret.bin"), &raw).unwrap();
    let opts = ImportOptions::default();
    let run = |t: TensorProto| {
        let bytes = model(17, vec![], vec![t], vec![], vec![out("ext")]);
        std::fs::write(sub.join("m.onnx"), &bytes).unwrap();
        import_onnx(&sub.join("m.onnx"), &opts)
    };
    // Good: inside the folder.
    let g = run(external("weights.bin", "8", "16")).unwrap();
    match &out_node(&g, 0).op {
        Op::Constant(t) => assert_eq!(t.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0]),
        o => panic!("{o:?}"),
    }
    // Escapes and bad ranges.
    for (t, want) in [
        (external("../secret.bin", "8", "16"), "no \"..\""),
        (external("/etc/passwd", "0", "16"), "no absolute paths"),
        (external("weights.bin", "20", "16"), "runs past the file"),
        (external("weights.bin", "0", "99"), "length 99"),
        (
            external("weights.bin", "18446744073709551615", "16"),
            "runs past the file",
        ),
        (external("nope.bin", "0", "16"), "nope.bin"),
    ] {
        let e = run(t).unwrap_err().to_string();
        assert!(e.starts_with("tensor \"ext\"") && e.contains(want), "{e}");
    }
    // No base folder for in-memory bytes.
    let bytes = model(
        17,
        vec![],
        vec![external("weights.bin", "8", "16")],
        vec![],
        vec![out("ext")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert!(e.contains("needs the model's folder"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unknown_op_names_type_domain_opset_and_node() {
    let bytes = model(
        17,
        vec![node("FancyOp", "blk.fancy", &["x"], &["y"], vec![])],
        vec![],
        vec![f32_in("x", &[2])],
        vec![out("y")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert_eq!(
        e,
        "node \"blk.fancy\": unsupported op ai.onnx::FancyOp (opset 17)"
    );
    let mut n = node("FusedMatMul", "", &["x"], &["y"], vec![]);
    n.domain = "com.microsoft".into();
    let e = import(&model(
        17,
        vec![n],
        vec![],
        vec![f32_in("x", &[2])],
        vec![out("y")],
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("\"y\"") && e.contains("com.microsoft::FusedMatMul"),
        "{e}"
    );
}

#[test]
fn runtime_dependent_shape_and_bad_nodes_name_the_node() {
    let bytes = model(
        17,
        vec![node("Reshape", "blk.reshape", &["x", "s"], &["y"], vec![])],
        vec![],
        vec![f32_in("x", &[4]), vi("s", data_type::INT64, &[Ok(1)])],
        vec![out("y")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert!(
        e.starts_with("node \"blk.reshape\" (Reshape): shape must be known at import time"),
        "{e}"
    );
    let bytes = model(
        17,
        vec![node("MatMul", "mm", &["x", "x"], &["y"], vec![])],
        vec![],
        vec![f32_in("x", &[2, 3])],
        vec![out("y")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert!(
        e.starts_with("node \"mm\" (MatMul): MatMul: inner dims 3 and 2"),
        "{e}"
    );
    let bytes = model(
        17,
        vec![node("Relu", "r", &["nowhere"], &["y"], vec![])],
        vec![],
        vec![],
        vec![out("y")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert!(e.contains("\"r\"") && e.contains("\"nowhere\""), "{e}");
    let e = import(&model(17, vec![], vec![], vec![], vec![out("ghost")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("graph output \"ghost\""), "{e}");
}

/// Every ONNX model under examples/ and fixtures/ that exists in this checkout imports and
/// verifies (skips silently where fixtures were not generated).
#[test]
fn fixture_models_import_and_verify() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = Vec::new();
    for dir in [
        "examples",
        "fixtures/transformers",
        "fixtures/large",
        "fixtures/large/light",
    ] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            for e in rd.flatten() {
                let p = e.path().join("model.onnx");
                if p.exists() {
                    paths.push(p);
                }
            }
        }
    }
    paths.sort();
    let mut failures = Vec::new();
    for p in &paths {
        match import_onnx(p, &ImportOptions::default()) {
            Ok(g) => {
                let mut hist = std::collections::BTreeMap::<String, usize>::new();
                for n in &g.nodes {
                    *hist.entry(n.op.name()).or_default() += 1;
                }
                eprintln!("{}: {} nodes {hist:?}", p.display(), g.nodes.len());
                if let Err(e) = rlx_compile::verify::verify(&g) {
                    failures.push(format!("{}: verify: {e}", p.display()));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", p.display())),
        }
    }
    eprintln!("imported {} models", paths.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn huge_shapes_from_attributes_or_constants_are_errors_not_panics() {
    let cases: Vec<(NodeProto, Vec<TensorProto>)> = vec![
        (
            node("ConstantOfShape", "cos", &["s"], &["y"], vec![]),
            vec![i64_init("s", &[1 << 40, 1 << 40])],
        ),
        (
            node("Tile", "tile", &["x", "r"], &["y"], vec![]),
            vec![i64_init("r", &[i64::MAX, 2])],
        ),
        (
            node("Pad", "pad", &["x", "p"], &["y"], vec![]),
            vec![i64_init("p", &[i64::MAX, 0, i64::MAX, 0])],
        ),
        (
            node("Reshape", "rs", &["x", "s"], &["y"], vec![]),
            vec![i64_init("s", &[i64::MAX, i64::MAX, -1])],
        ),
        (
            node("Expand", "ex", &["x", "s"], &["y"], vec![]),
            vec![i64_init("s", &[1 << 62, 1 << 62, 2, 3])],
        ),
        (
            node(
                "MaxPool",
                "mp",
                &["x4"],
                &["y"],
                vec![
                    a_ints("kernel_shape", &[2]),
                    a_ints("pads", &[i64::MAX, i64::MAX]),
                ],
            ),
            vec![],
        ),
    ];
    for (n, inits) in cases {
        let name = n.name.clone();
        let bytes = model(
            17,
            vec![n],
            inits,
            vec![f32_in("x", &[2, 3]), f32_in("x4", &[1, 1, 4])],
            vec![out("y")],
        );
        let e = import(&bytes).unwrap_err().to_string();
        assert!(e.starts_with(&format!("node \"{name}\"")), "{e}");
    }
}

#[test]
fn input_shapes_bind_symbolic_dims_and_constant_inputs_freeze() {
    let bytes = model(
        17,
        vec![node("Relu", "act", &["x"], &["y"], vec![])],
        vec![],
        vec![vi("x", data_type::FLOAT, &[Err("batch"), Ok(4)])],
        vec![out("y")],
    );
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert("x".into(), vec![3, 4]);
    let g = import_onnx_bytes(&bytes, None, &opts).unwrap();
    let x = g.input_by_name("x").unwrap();
    assert_eq!(g.node(x).shape, Shape::new(&[3, 4], DType::F32));
    // A static dim that disagrees is an error naming the input.
    opts.input_shapes.insert("x".into(), vec![3, 5]);
    let e = import_onnx_bytes(&bytes, None, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"x\"") || e.contains("x"), "{e}");
    assert!(e.contains("declared 4"), "{e}");
    // A frozen input becomes a constant.
    let mut opts = ImportOptions::default();
    opts.constant_inputs.insert(
        "x".into(),
        rlx_ir::Tensor::from_f32(&[1, 4], vec![-1.0, 2.0, -3.0, 4.0]).unwrap(),
    );
    let g = import_onnx_bytes(&bytes, None, &opts).unwrap();
    assert!(g.input_by_name("x").is_none());
}

/// A graph input declared without a shape (rank unknown) takes the shape of the tensor fed
/// for it; without one, the error names the input and says how to give it. `input_names`
/// lists it (`declared_inputs` cannot: it has no shape to give).
#[test]
fn input_without_a_shape_takes_the_fed_tensors() {
    let no_shape = ValueInfoProto {
        name: "x".into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: None,
            }),
            denotation: String::new(),
        }),
    };
    let bytes = model(
        13,
        vec![node("Relu", "act", &["x"], &["y"], vec![])],
        vec![],
        vec![no_shape],
        vec![out("y")],
    );
    let e = import(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("\"x\"") && e.contains("rank unknown") && e.contains("--input"),
        "{e}"
    );
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert("x".into(), vec![2, 3, 5]);
    let g = import_onnx_bytes(&bytes, None, &opts).unwrap();
    let x = g.input_by_name("x").unwrap();
    assert_eq!(g.node(x).shape, Shape::new(&[2, 3, 5], DType::F32));
    let dir = std::env::temp_dir().join(format!("rlx-noshape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let m = rlx_onnx_import::OnnxModel::open(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(m.input_names(), vec!["x".to_string()]);
    assert!(m.declared_inputs().is_empty());
}

/// Cast to FLOAT8E8M0 with each `round_mode`, back to float. Expected values by hand from
/// onnx's `numpy_helper.to_float8e8m0` rule (float32 exponent `e`, mantissa `m`): `up` bumps
/// `e` for any `m != 0`, `down` never, `nearest` when the guard bit 0x400000 is set (and a
/// lower bit or `e > 0`); with `saturate` never past 2^127; NaN stays NaN.
#[test]
fn cast_e8m0_round_modes() {
    let xs = vec![1.5f32, 1.25, 0.75, 3.0, -6.0, f32::MAX, f32::NAN, 0.0];
    let run = |mode: &str, saturate: i64| -> Vec<f32> {
        let mut attrs = vec![
            a_int("to", data_type::FLOAT8E8M0 as i64),
            a_int("saturate", saturate),
        ];
        attrs.push(AttributeProto {
            name: "round_mode".into(),
            r#type: attr_type::STRING,
            s: mode.as_bytes().to_vec(),
            ..Default::default()
        });
        let bytes = model(
            25,
            vec![
                node("Cast", "to_e8m0", &["x"], &["c"], attrs),
                node(
                    "Cast",
                    "back",
                    &["c"],
                    &["y"],
                    vec![a_int("to", data_type::FLOAT as i64)],
                ),
            ],
            vec![f32_init("x", &[xs.len()], xs.clone())],
            vec![],
            vec![out("y")],
        );
        // A value holding NaN stays a node at import (so the numeric lint sees the chain),
        // and rlx-compile does not fold it either (the localizer names the op at run time):
        // evaluate the constant chain with the CPU reference kernels.
        let g = import(&bytes).unwrap();
        let mut vals: Vec<Option<std::sync::Arc<rlx_ir::Tensor>>> = vec![None; g.len()];
        for n in &g.nodes {
            vals[n.id.index()] = Some(match &n.op {
                Op::Constant(t) => t.clone(),
                op => {
                    let ins: Vec<&rlx_ir::Tensor> = n
                        .inputs
                        .iter()
                        .map(|x| vals[x.index()].as_deref().expect("constant chain"))
                        .collect();
                    std::sync::Arc::new(rlx_cpu::eval_op(op, &ins, &n.shape).expect("eval"))
                }
            });
        }
        vals[g.outputs[0].index()]
            .as_ref()
            .unwrap()
            .data()
            .to_f32_vec()
    };
    let p = |e: i32| 2f32.powi(e);
    let max = f32::from_bits(0x7f00_0000); // 2^127
    let check = |got: Vec<f32>, want: &[f32]| {
        for (g, w) in got.iter().zip(want) {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{got:?} vs {want:?}");
        }
    };
    let tiny = p(-127);
    check(
        run("up", 1),
        &[2.0, 2.0, 1.0, 4.0, 8.0, max, f32::NAN, tiny],
    );
    check(
        run("down", 1),
        &[1.0, 1.0, 0.5, 2.0, 4.0, max, f32::NAN, tiny],
    );
    check(
        run("nearest", 1),
        &[2.0, 1.0, 1.0, 4.0, 8.0, max, f32::NAN, tiny],
    );
    // Without saturate, rounding f32::MAX up or to nearest overflows to NaN.
    let up_ns = run("up", 0);
    assert!(up_ns[5].is_nan());
    assert!(run("nearest", 0)[5].is_nan());
    assert_eq!(run("down", 0)[5], max);
}

// ---- loops: the iteration path of unrolled nodes ----

fn a_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::GRAPH,
        g: Some(g),
        ..Default::default()
    }
}

fn body(
    name: &str,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    ins: &[&str],
    outs: &[&str],
) -> GraphProto {
    GraphProto {
        node: nodes,
        name: name.into(),
        initializer: inits,
        input: ins.iter().map(|n| out(n)).collect(),
        output: outs.iter().map(|n| out(n)).collect(),
        value_info: vec![],
    }
}

/// `(loop, op type, iteration)` of every level of a node's path.
fn path(g: &Graph, id: rlx_ir::NodeId) -> Vec<(String, String, u64)> {
    rlx_ir::provenance::node_iteration(g, id)
        .iter()
        .map(|l| (l.node.clone(), l.op_type.clone(), l.iteration))
        .collect()
}

/// The paths of the nodes labelled `l`, in node order.
fn paths_of(g: &Graph, l: &str) -> Vec<Vec<(String, String, u64)>> {
    g.nodes
        .iter()
        .filter(|n| label(g, n.id) == l)
        .map(|n| path(g, n.id))
        .collect()
}

/// A Loop "outer" (2 iterations) whose body runs a Loop "inner" (3 iterations) whose body
/// holds a Mul and an If with a constant condition (its branch's Neg inherits the path):
/// each unrolled copy carries (outer, i), (inner, j) in that order; the loop nodes' own
/// helpers and the nodes outside carry none.
#[test]
fn unrolled_loop_nodes_carry_their_iteration_path() {
    let then_b = body(
        "then",
        vec![node("Neg", "then_neg", &["w2"], &["t"], vec![])],
        vec![],
        &[],
        &["t"],
    );
    let else_b = body(
        "else",
        vec![node("Identity", "else_id", &["w2"], &["e"], vec![])],
        vec![],
        &[],
        &["e"],
    );
    let inner_body = body(
        "inner_body",
        vec![
            node("Identity", "inner_cond", &["c_in"], &["c_out"], vec![]),
            node("Mul", "inner_mul", &["w", "two"], &["w2"], vec![]),
            node(
                "If",
                "inner_if",
                &["yes"],
                &["w_out"],
                vec![
                    a_graph("then_branch", then_b),
                    a_graph("else_branch", else_b),
                ],
            ),
        ],
        vec![
            f32_init("two", &[2], vec![2.0, 2.0]),
            tensor_to_proto(
                "yes",
                &Tensor::new(vec![], TensorData::Bool(vec![true])).unwrap(),
            ),
        ],
        &["j", "c_in", "w"],
        &["c_out", "w_out"],
    );
    let outer_body = body(
        "outer_body",
        vec![
            node("Identity", "outer_cond", &["c_in"], &["c_out"], vec![]),
            node(
                "Loop",
                "inner",
                &["three", "", "v"],
                &["v_out"],
                vec![a_graph("body", inner_body)],
            ),
        ],
        vec![i64_init("three", &[3])],
        &["i", "c_in", "v"],
        &["c_out", "v_out"],
    );
    let bytes = model(
        17,
        vec![
            node(
                "Loop",
                "outer",
                &["two_trips", "", "x"],
                &["y"],
                vec![a_graph("body", outer_body)],
            ),
            node("Relu", "after", &["y"], &["z"], vec![]),
        ],
        vec![i64_init("two_trips", &[2])],
        vec![f32_in("x", &[2])],
        vec![out("z")],
    );
    let g = import(&bytes).unwrap();
    let want: Vec<Vec<(String, String, u64)>> = (0..2u64)
        .flat_map(|i| {
            (0..3u64).map(move |j| {
                vec![
                    ("outer".to_string(), "Loop".to_string(), i),
                    ("inner".to_string(), "Loop".to_string(), j),
                ]
            })
        })
        .collect();
    assert_eq!(paths_of(&g, "inner_mul"), want);
    assert_eq!(
        paths_of(&g, "then_neg"),
        want,
        "an If's branch inherits the path"
    );
    assert!(paths_of(&g, "after").iter().all(|p| p.is_empty()));
    let id = g
        .nodes
        .iter()
        .filter(|n| label(&g, n.id) == "inner_mul")
        .nth(4)
        .unwrap()
        .id;
    assert_eq!(
        rlx_ir::provenance::quoted_label(&g, id),
        "\"inner_mul\" (iteration 1 of Loop \"outer\", 1 of Loop \"inner\")"
    );
}

/// Scan "scan" over axis 0 of x[4, 2] in reverse: the body's Sqrt of step t (t = 0 is the
/// first slice processed, x[3]) carries (scan, Scan, t).
#[test]
fn unrolled_scan_nodes_carry_their_step() {
    let b = body(
        "scan_body",
        vec![
            node("Sqrt", "body_sqrt", &["xt"], &["r"], vec![]),
            node("Add", "body_acc", &["s", "r"], &["s_out"], vec![]),
        ],
        vec![],
        &["s", "xt"],
        &["s_out", "r_out"],
    );
    let mut b = b;
    b.node
        .push(node("Identity", "body_id", &["r"], &["r_out"], vec![]));
    let bytes = model(
        11,
        vec![node(
            "Scan",
            "scan",
            &["s0", "x"],
            &["s", "rs"],
            vec![
                a_graph("body", b),
                a_int("num_scan_inputs", 1),
                a_ints("scan_input_directions", &[1]),
            ],
        )],
        vec![],
        vec![f32_in("s0", &[2]), f32_in("x", &[4, 2])],
        vec![out("s"), out("rs")],
    );
    let g = import(&bytes).unwrap();
    let want: Vec<Vec<(String, String, u64)>> = (0..4u64)
        .map(|t| vec![("scan".to_string(), "Scan".to_string(), t)])
        .collect();
    assert_eq!(paths_of(&g, "body_sqrt"), want);
    assert_eq!(paths_of(&g, "body_acc"), want);
}
