//! What the harness needs to know about a case's `model.onnx` without importing it: the graph
//! inputs and outputs (name, value kind, element type, declared dims) and the top-level nodes.
//!
//! A few hand-written prost messages (field numbers from onnx.proto, onnx 1.23): unknown fields
//! are skipped, so this reads any ModelProto. Sequence, map, optional and sparse types are only
//! detected (their payload is kept as bytes).

use prost::Message;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<OperatorSetIdProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(string, tag = "7")]
    domain: String,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfoProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorTypeProto>,
    #[prost(bytes = "vec", optional, tag = "4")]
    sequence_type: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "5")]
    map_type: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "8")]
    sparse_tensor_type: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "9")]
    optional_type: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
struct Dimension {
    #[prost(int64, optional, tag = "1")]
    dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    dim_param: Option<String>,
}

/// The kind of value a graph input or output carries.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueKind {
    /// A tensor: ONNX `TensorProto.DataType` code and declared dims (`None`: no shape).
    Tensor {
        elem_type: i32,
        dims: Option<Vec<DimSpec>>,
    },
    Sequence,
    Map,
    Optional,
    SparseTensor,
    /// No type given.
    Unknown,
}

impl ValueKind {
    /// `tensor`, `sequence`, `map`, `optional`, `sparse tensor`, `untyped value`.
    pub fn describe(&self) -> &'static str {
        match self {
            ValueKind::Tensor { .. } => "tensor",
            ValueKind::Sequence => "sequence",
            ValueKind::Map => "map",
            ValueKind::Optional => "optional",
            ValueKind::SparseTensor => "sparse tensor",
            ValueKind::Unknown => "untyped value",
        }
    }
}

/// One declared dim.
#[derive(Debug, Clone, PartialEq)]
pub enum DimSpec {
    Fixed(i64),
    Named(String),
    Unknown,
}

/// A graph input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueMeta {
    pub name: String,
    pub kind: ValueKind,
}

/// A top-level node: op type (domain-qualified unless `ai.onnx`), name, input names (in
/// schema order; `""` for an omitted optional input), output names.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeMeta {
    pub op_type: String,
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// The parts of a ModelProto the harness uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMeta {
    pub inputs: Vec<ValueMeta>,
    pub outputs: Vec<ValueMeta>,
    pub nodes: Vec<NodeMeta>,
    /// `ai.onnx` opset version (0 when absent).
    pub opset: i64,
}

impl ModelMeta {
    /// Decode the metadata of a serialized ModelProto.
    pub fn decode(bytes: &[u8]) -> Result<ModelMeta, String> {
        let m = ModelProto::decode(bytes).map_err(|e| format!("not a ModelProto: {e}"))?;
        let g = m.graph.ok_or("the model has no graph")?;
        let opset = m
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map_or(0, |o| o.version);
        Ok(ModelMeta {
            inputs: g.input.iter().map(value_meta).collect(),
            outputs: g.output.iter().map(value_meta).collect(),
            nodes: g
                .node
                .iter()
                .map(|n| NodeMeta {
                    op_type: qualified_op(&n.domain, &n.op_type),
                    name: n.name.clone(),
                    inputs: n.input.clone(),
                    outputs: n.output.clone(),
                })
                .collect(),
            opset,
        })
    }

    /// Distinct op types of the top-level nodes, in order of first appearance.
    pub fn op_types(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![];
        for n in &self.nodes {
            if !v.contains(&n.op_type) {
                v.push(n.op_type.clone());
            }
        }
        v
    }

    /// Whether `label` (a NaN report's node label) names one of the model's nodes (its name,
    /// or one of its output names, which the importer uses for unnamed nodes) or a graph input
    /// (the right culprit when the test data itself holds NaN).
    pub fn names_a_node(&self, label: &str) -> bool {
        self.nodes.iter().any(|n| {
            (!n.name.is_empty() && n.name == label)
                || n.outputs.iter().any(|o| !o.is_empty() && o == label)
        }) || self.inputs.iter().any(|i| i.name == label)
    }
}

/// `Op` for the default domain, `domain::Op` otherwise.
pub fn qualified_op(domain: &str, op: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        op.to_string()
    } else {
        format!("{domain}::{op}")
    }
}

fn value_meta(v: &ValueInfoProto) -> ValueMeta {
    let kind = match &v.r#type {
        None => ValueKind::Unknown,
        Some(t) => {
            if let Some(tt) = &t.tensor_type {
                ValueKind::Tensor {
                    elem_type: tt.elem_type,
                    dims: tt.shape.as_ref().map(|s| {
                        s.dim
                            .iter()
                            .map(|d| match (&d.dim_value, &d.dim_param) {
                                (Some(x), _) => DimSpec::Fixed(*x),
                                (None, Some(p)) if !p.is_empty() => DimSpec::Named(p.clone()),
                                _ => DimSpec::Unknown,
                            })
                            .collect()
                    }),
                }
            } else if t.sequence_type.is_some() {
                ValueKind::Sequence
            } else if t.map_type.is_some() {
                ValueKind::Map
            } else if t.optional_type.is_some() {
                ValueKind::Optional
            } else if t.sparse_tensor_type.is_some() {
                ValueKind::SparseTensor
            } else {
                ValueKind::Unknown
            }
        }
    };
    ValueMeta {
        name: v.name.clone(),
        kind,
    }
}

/// Name of an ONNX `TensorProto.DataType` code (onnx.proto), for messages.
pub fn elem_type_name(t: i32) -> &'static str {
    match t {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17 => "float8e4m3fn",
        18 => "float8e4m3fnuz",
        19 => "float8e5m2",
        20 => "float8e5m2fnuz",
        21 => "uint4",
        22 => "int4",
        23 => "float4e2m1",
        24 => "float8e8m0",
        25 => "uint2",
        26 => "int2",
        _ => "unknown",
    }
}
