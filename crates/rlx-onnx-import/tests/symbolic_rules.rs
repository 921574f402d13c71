//! The symbolic import's rules for ops whose output sizes or attributes depend on symbolic
//! sizes (Dropout's mask, Softmax's 2-D coercion before opset 13, ceil_mode pooling, SAME
//! padding) and sizes whose element count overflows: each specialization of the template
//! must be the per-signature import node for node (models built with `common`).

mod common;

use common::*;
use rlx_ir::{DType, Shape};
use rlx_onnx_import::proto::*;
use rlx_onnx_import::{import_onnx_bytes, ImportOptions};
use std::collections::HashMap;

/// A Dropout whose mask output is used (SqueezeNet 1.0's light model has one) keeps a
/// symbolic import symbolic: the mask takes x's symbolic shape (it once read the sizes as
/// numbers, so the model was imported per signature), and the template specialized to a
/// batch is the per-signature import node for node.
#[test]
fn dropout_mask_keeps_the_symbolic_import() {
    let bytes = model(
        12,
        vec![
            node("Relu", "r", &["x"], &["h"], vec![]),
            node("Dropout", "drop", &["h"], &["y", "mask"], vec![]),
        ],
        vec![],
        vec![vi("x", data_type::FLOAT, &[Err("batch"), Ok(4)])],
        vec![out("y"), out("mask")],
    );
    let m = rlx_onnx_import::OnnxModel::from_bytes(&bytes, "dropout.onnx").unwrap();
    let at = |b: usize| ImportOptions {
        input_shapes: HashMap::from([("x".to_string(), vec![b, 4])]),
        ..Default::default()
    };
    let t = m
        .import_symbolic(&at(2))
        .unwrap_or_else(|e| panic!("the symbolic import was refused: {e}"));
    for b in [1, 3, 7] {
        let s = t.specialize(&at(b).input_shapes).unwrap();
        let plain = m.import(&at(b)).unwrap();
        assert_eq!(s.nodes, plain.nodes, "batch {b}");
        let mask = s.node(s.outputs[1]);
        assert_eq!(mask.shape, Shape::new(&[b, 4], DType::Bool), "batch {b}");
    }
}

/// A Softmax before opset 13 coerces its input to 2-D around `axis` (SqueezeNet 1.0's light
/// model, opset 9): with a symbolic batch the coercion is symbolic (it read the sizes as
/// numbers, so the model was imported per signature), and each specialization is the
/// per-signature import node for node.
#[test]
fn opset_11_softmax_keeps_the_symbolic_import() {
    for axis in [0i64, 1, 2] {
        let bytes = model(
            11,
            vec![node(
                "Softmax",
                "sm",
                &["x"],
                &["y"],
                vec![a_int("axis", axis)],
            )],
            vec![],
            vec![vi("x", data_type::FLOAT, &[Err("batch"), Ok(3), Ok(4)])],
            vec![out("y")],
        );
        let m = rlx_onnx_import::OnnxModel::from_bytes(&bytes, "softmax.onnx").unwrap();
        let at = |b: usize| ImportOptions {
            input_shapes: HashMap::from([("x".to_string(), vec![b, 3, 4])]),
            ..Default::default()
        };
        let t = m
            .import_symbolic(&at(2))
            .unwrap_or_else(|e| panic!("axis {axis}: the symbolic import was refused: {e}"));
        for b in [1, 3, 5] {
            let s = t.specialize(&at(b).input_shapes).unwrap();
            let plain = m.import(&at(b)).unwrap();
            assert_eq!(s.nodes, plain.nodes, "axis {axis}, batch {b}");
        }
    }
}

/// MaxPool/AveragePool with `ceil_mode` on symbolic spatial sizes (torchvision's
/// SqueezeNet and GoogLeNet): the output size's rule (rounded up, one window fewer when the
/// last would start past the input) is an expression, so the model stays symbolic, and the
/// specialization at every height and width from 1 to 40 is the per-signature import node
/// for node, or both refuse the size (a window larger than the padded input).
#[test]
fn ceil_mode_pooling_keeps_the_symbolic_import_at_every_size() {
    // (op, kernel, stride, pads [h_begin, w_begin, h_end, w_end], dilation)
    let cases: [(&str, i64, i64, [i64; 4], i64); 6] = [
        ("MaxPool", 3, 2, [0, 0, 0, 0], 1),
        ("MaxPool", 3, 2, [1, 1, 1, 1], 1),
        ("MaxPool", 2, 2, [1, 0, 1, 0], 1),
        ("MaxPool", 3, 3, [0, 2, 2, 0], 1),
        ("MaxPool", 2, 3, [1, 1, 1, 1], 2),
        ("AveragePool", 3, 2, [1, 1, 0, 1], 1),
    ];
    for (op, k, s, pads, d) in cases {
        let mut attrs = vec![
            a_ints("kernel_shape", &[k, k]),
            a_ints("strides", &[s, s]),
            a_ints("pads", &pads),
            a_int("ceil_mode", 1),
        ];
        if op == "MaxPool" {
            attrs.push(a_ints("dilations", &[d, d]));
        }
        let bytes = model(
            17,
            vec![node(op, "pool", &["x"], &["y"], attrs)],
            vec![],
            vec![vi(
                "x",
                data_type::FLOAT,
                &[Ok(1), Ok(2), Err("h"), Err("w")],
            )],
            vec![out("y")],
        );
        let m = rlx_onnx_import::OnnxModel::from_bytes(&bytes, "pool.onnx").unwrap();
        let at = |h: usize, w: usize| ImportOptions {
            input_shapes: HashMap::from([("x".to_string(), vec![1, 2, h, w])]),
            ..Default::default()
        };
        let t = m
            .import_symbolic(&at(17, 23))
            .unwrap_or_else(|e| panic!("{op} k{k} s{s} {pads:?}: refused: {e}"));
        let mut compared = 0;
        for h in 1..=40 {
            for w in [1, 2, 5, 8, 13, 24, 40] {
                let what = format!("{op} k{k} s{s} pads {pads:?} d{d} at {h}x{w}");
                match (t.specialize(&at(h, w).input_shapes), m.import(&at(h, w))) {
                    (Ok(sg), Ok(plain)) => {
                        assert_eq!(sg.nodes, plain.nodes, "{what}");
                        compared += 1;
                    }
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("{what}: template {:?}, import {:?}", a.err(), b.err()),
                }
            }
        }
        assert!(compared > 150, "{op}: only {compared} sizes compared");
    }
}

/// Conv and MaxPool with `auto_pad = SAME_UPPER / SAME_LOWER` and stride 1 on symbolic
/// spatial sizes (TensorFlow exports): the pads are `span - 1` split whatever the size, so
/// the model stays symbolic, and every size from 1 to 30 specializes to the per-signature
/// import node for node. A stride of 2 makes the pads depend on the size: the symbolic
/// import is refused saying so (the runtime then imports per signature).
#[test]
fn same_padding_with_stride_1_keeps_the_symbolic_import() {
    for (op, pad, k) in [
        ("Conv", "SAME_UPPER", 3),
        ("Conv", "SAME_LOWER", 4),
        ("MaxPool", "SAME_UPPER", 2),
        ("MaxPool", "SAME_LOWER", 5),
    ] {
        let mut attrs = vec![
            a_ints("kernel_shape", &[k, k]),
            AttributeProto {
                name: "auto_pad".into(),
                r#type: attr_type::STRING,
                s: pad.as_bytes().to_vec(),
                ..Default::default()
            },
        ];
        let mut ins = vec!["x"];
        let mut inits = vec![];
        if op == "Conv" {
            ins.push("w");
            inits.push(f32_init(
                "w",
                &[3, 2, k as usize, k as usize],
                vec![0.5; 6 * (k * k) as usize],
            ));
        }
        let with_stride = |s: i64| {
            let mut a = attrs.clone();
            a.push(a_ints("strides", &[s, s]));
            model(
                17,
                vec![node(op, "n", &ins, &["y"], a)],
                inits.clone(),
                vec![vi(
                    "x",
                    data_type::FLOAT,
                    &[Ok(1), Ok(2), Err("h"), Err("w")],
                )],
                vec![out("y")],
            )
        };
        let at = |h: usize, w: usize| ImportOptions {
            input_shapes: HashMap::from([("x".to_string(), vec![1, 2, h, w])]),
            ..Default::default()
        };
        let m = rlx_onnx_import::OnnxModel::from_bytes(&with_stride(1), "same.onnx").unwrap();
        let t = m
            .import_symbolic(&at(9, 14))
            .unwrap_or_else(|e| panic!("{op} {pad}: refused: {e}"));
        for h in 1..=30 {
            for w in [1, 2, 7, 16] {
                let sg = t.specialize(&at(h, w).input_shapes).unwrap();
                let plain = m.import(&at(h, w)).unwrap();
                assert_eq!(sg.nodes, plain.nodes, "{op} {pad} k{k} at {h}x{w}");
                assert_eq!(plain.node(plain.outputs[0]).shape.dims_usize()[2..], [h, w]);
            }
        }
        let m2 = rlx_onnx_import::OnnxModel::from_bytes(&with_stride(2), "same2.onnx").unwrap();
        let Err(e) = m2.import_symbolic(&at(9, 14)) else {
            panic!("{op} {pad}: stride 2 was taken as symbolic");
        };
        assert!(e.to_string().contains("stride over 1"), "{e}");
        attrs.clear();
    }
}

/// Sizes whose element count overflows: a Reshape's `-1` and Size refuse with an error
/// (the element count was a plain product: a panic in debug builds, a wrapped count in
/// release ones), with and without the symbolic import.
#[test]
fn reshape_and_size_of_an_overflowing_input_are_errors() {
    for op in ["Reshape", "Size"] {
        let (ins, inits): (Vec<&str>, Vec<TensorProto>) = if op == "Reshape" {
            (vec!["x", "s"], vec![i64_init("s", &[-1])])
        } else {
            (vec!["x"], vec![])
        };
        let bytes = model(
            17,
            vec![node(op, "n", &ins, &["y"], vec![])],
            inits,
            vec![vi("x", data_type::FLOAT, &[Err("a"), Err("b"), Ok(8)])],
            vec![out("y")],
        );
        let huge = ImportOptions {
            dims: HashMap::from([
                ("a".to_string(), 1usize << 40),
                ("b".to_string(), 1usize << 40),
            ]),
            ..Default::default()
        };
        let r = std::panic::catch_unwind(|| import_onnx_bytes(&bytes, None, &huge));
        let e = r
            .unwrap_or_else(|_| panic!("{op}: the import panicked"))
            .err();
        assert!(e.is_some(), "{op}: an overflowing input was accepted");
    }
}
