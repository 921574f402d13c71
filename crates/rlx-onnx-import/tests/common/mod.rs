//! ONNX models built in tests by encoding the importer's own prost structs (shared by
//! import.rs and symbolic_rules.rs).
#![allow(dead_code)] // each test file uses some of them

use prost::Message;
use rlx_ir::Tensor;
use rlx_onnx_import::proto::*;
use rlx_onnx_import::tensor::tensor_to_proto;

pub fn vi(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                Ok(v) => DimValue::DimValue(*v),
                                Err(p) => DimValue::DimParam(p.to_string()),
                            }),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            }),
            denotation: String::new(),
        }),
    }
}

pub fn f32_in(name: &str, dims: &[i64]) -> ValueInfoProto {
    vi(
        name,
        data_type::FLOAT,
        &dims.iter().map(|&d| Ok(d)).collect::<Vec<_>>(),
    )
}

pub fn out(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: None,
    }
}

pub fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        domain: String::new(),
        attribute: attrs,
    }
}

pub fn a_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INT,
        i: v,
        ..Default::default()
    }
}
pub fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}
pub fn a_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::TENSOR,
        t: Some(t),
        ..Default::default()
    }
}

pub fn f32_init(name: &str, dims: &[usize], v: Vec<f32>) -> TensorProto {
    tensor_to_proto(name, &Tensor::from_f32(dims, v).unwrap())
}
pub fn i64_init(name: &str, v: &[i64]) -> TensorProto {
    tensor_to_proto(name, &Tensor::from_i64(&[v.len()], v.to_vec()).unwrap())
}

pub fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "test".into(),
            initializer: inits,
            input: inputs,
            output: outputs,
            value_info: vec![],
        }),
        ..Default::default()
    }
    .encode_to_vec()
}
