//! ATen → ONNX-semantics nodes. Each FX node becomes one or a few `NodeProto`s named after
//! the FX node, so the ONNX importer's origin labels map back to it ([`Prov`]).
//!
//! Values: every FX tensor maps to an ONNX value name; its dtype and sizes come from the
//! program's `tensor_values` (the exporter's fake-tensor propagation), which also settles
//! `-1` sizes and type promotion (inputs are cast to the output dtype where torch's
//! promotion rules would). Symbolic sizes are read from the user input that holds the
//! symbol (`Shape(x)[i]`), and fold once the importer binds dims.

use crate::archive::Archive;
use crate::program::{bad, FxNode, InputKind, Meta, Program, SymDim};
use crate::TorchImportError;
use rlx_ir::SourceLoc;
use rlx_onnx_import::proto::{
    attr_type, data_type as dt, AttributeProto, DimValue, Dimension, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor,
    ValueInfoProto,
};
use serde_json::Value;
use std::collections::HashMap;

/// The ONNX opset the lowered nodes follow (Attention, RMSNormalization, Swish).
const OPSET: i64 = 24;

/// What reports say about an FX node.
#[derive(Debug, Clone)]
pub struct Prov {
    pub fx_name: String,
    /// `aten.mul.Tensor`.
    pub target: String,
    pub module: Option<String>,
    pub source: Option<SourceLoc>,
}

impl Prov {
    /// ` at model.py:42  y = self.proj(x)`, or empty.
    pub fn at(&self) -> String {
        self.source
            .as_ref()
            .map(|s| format!(" at {s}"))
            .unwrap_or_default()
    }
}

/// torch `ScalarType` code → ONNX `TensorProto.DataType` and element size in bytes.
fn onnx_dtype(code: i64) -> Option<(i32, usize)> {
    Some(match code {
        1 => (dt::UINT8, 1),
        2 => (dt::INT8, 1),
        3 => (dt::INT16, 2),
        4 => (dt::INT32, 4),
        5 => (dt::INT64, 8),
        6 => (dt::FLOAT16, 2),
        7 => (dt::FLOAT, 4),
        8 => (dt::DOUBLE, 8),
        12 => (dt::BOOL, 1),
        13 => (dt::BFLOAT16, 2),
        28 => (dt::UINT16, 2),
        29 => (dt::FLOAT8E4M3FN, 1),
        30 => (dt::FLOAT8E5M2, 1),
        31 => (dt::FLOAT8E4M3FNUZ, 1),
        32 => (dt::FLOAT8E5M2FNUZ, 1),
        34 => (dt::UINT32, 4),
        35 => (dt::UINT64, 8),
        _ => return None,
    })
}

/// An ONNX element type as torch names it (`float32`), for messages.
fn onnx_dtype_name(d: i32) -> String {
    match d {
        dt::UINT8 => "uint8",
        dt::INT8 => "int8",
        dt::INT16 => "int16",
        dt::INT32 => "int32",
        dt::INT64 => "int64",
        dt::FLOAT16 => "float16",
        dt::FLOAT => "float32",
        dt::DOUBLE => "float64",
        dt::BOOL => "bool",
        dt::BFLOAT16 => "bfloat16",
        _ => return format!("ONNX type {d}"),
    }
    .into()
}

fn dtype_name(code: i64) -> String {
    match code {
        9..=11 => "a complex dtype".into(),
        0 => "an unknown dtype".into(),
        c => format!("ScalarType {c}"),
    }
}

fn is_float(d: i32) -> bool {
    matches!(
        d,
        dt::FLOAT | dt::FLOAT16 | dt::BFLOAT16 | dt::DOUBLE | 17..=20
    )
}

/// Rank of floating dtypes for promotion (wider wins).
fn float_rank(d: i32) -> i32 {
    match d {
        dt::DOUBLE => 4,
        dt::FLOAT => 3,
        dt::FLOAT16 | dt::BFLOAT16 => 2,
        _ => 1,
    }
}

/// The innermost module path of an `nn_module_stack` (`key,path,class;...`).
fn module_path(stack: &str) -> Option<String> {
    let last = stack.split(';').rfind(|e| !e.trim().is_empty())?;
    let mut f = last.splitn(3, ',');
    let _key = f.next()?;
    let path = f.next()?.trim();
    let path = path
        .trim_start_matches("L['self']")
        .trim_start_matches("L__self__")
        .trim_start_matches('.');
    Some(path.to_string())
}

/// Whether a frame's file is torch's own code (skipped when naming the user's line).
fn is_torch_frame(file: &str) -> bool {
    let f = file.replace('\\', "/");
    [
        "site-packages/torch/",
        "dist-packages/torch/",
        "/torch/nn/",
        "/torch/_",
        "/torch/functional.py",
        "/torch/export/",
        "/torch/fx/",
    ]
    .iter()
    .any(|p| f.contains(p))
}

/// The innermost frame of a `stack_trace` that is not torch's own code (else the innermost
/// one), with its code line (from the trace, else read from the file when it is readable).
pub fn source_of(trace: &str) -> Option<SourceLoc> {
    let lines: Vec<&str> = trace.lines().collect();
    let mut frames: Vec<SourceLoc> = vec![];
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let Some(rest) = t.strip_prefix("File \"") else {
            continue;
        };
        let Some((file, rest)) = rest.split_once('"') else {
            continue;
        };
        let Some(num) = rest
            .trim_start_matches(", line ")
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let code = lines
            .get(i + 1)
            .map(|c| c.trim())
            .filter(|c| !c.is_empty() && !c.starts_with("File \""))
            .map(str::to_string);
        frames.push(SourceLoc {
            file: file.to_string(),
            line: num,
            code,
        });
    }
    let pick = frames
        .iter()
        .rev()
        .find(|f| !is_torch_frame(&f.file))
        .or(frames.last())?
        .clone();
    let mut pick = pick;
    if pick.code.is_none() {
        pick.code = read_line(&pick.file, pick.line);
    }
    Some(pick)
}

fn read_line(file: &str, line: u32) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() || meta.len() > 16 << 20 || line == 0 {
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .nth(line as usize - 1)
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
}

/// An FX tensor's ONNX value: name, dtype and sizes.
#[derive(Debug, Clone)]
struct V {
    name: String,
    dt: i32,
    dims: Vec<SymDim>,
}

impl V {
    fn rank(&self) -> usize {
        self.dims.len()
    }
}

/// A scalar argument.
#[derive(Debug, Clone, Copy)]
enum Scalar {
    I(i64),
    F(f64),
    B(bool),
}

impl Scalar {
    fn f(self) -> f64 {
        match self {
            Scalar::I(i) => i as f64,
            Scalar::F(f) => f,
            Scalar::B(b) => b as i64 as f64,
        }
    }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INT,
        i,
        ..Default::default()
    }
}
fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::FLOAT,
        f,
        ..Default::default()
    }
}
fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}
fn attr_s(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::STRING,
        s: s.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// A scalar of ONNX dtype `d` as little-endian bytes.
fn scalar_bytes(v: f64, d: i32) -> Vec<u8> {
    match d {
        dt::FLOAT => (v as f32).to_le_bytes().to_vec(),
        dt::DOUBLE => v.to_le_bytes().to_vec(),
        dt::FLOAT16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
        dt::BFLOAT16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
        dt::INT64 => (v as i64).to_le_bytes().to_vec(),
        dt::INT32 => (v as i32).to_le_bytes().to_vec(),
        dt::INT16 => (v as i16).to_le_bytes().to_vec(),
        dt::INT8 => (v as i8).to_le_bytes().to_vec(),
        dt::UINT8 => (v as u8).to_le_bytes().to_vec(),
        dt::UINT16 => (v as u16).to_le_bytes().to_vec(),
        dt::UINT32 => (v as u32).to_le_bytes().to_vec(),
        dt::UINT64 => (v as u64).to_le_bytes().to_vec(),
        dt::BOOL => vec![(v != 0.0) as u8],
        _ => (v as f32).to_le_bytes().to_vec(),
    }
}

struct Lower<'p> {
    p: &'p Program,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    vals: HashMap<String, V>,
    /// sym-int value name → ONNX value (1-D int64 of one element).
    syms: HashMap<String, String>,
    /// symbol → (user input's ONNX value, dim index): where its size can be read.
    sym_src: HashMap<String, (String, usize)>,
    /// Non-tensor constants folded into the program (constant_input specs).
    consts: HashMap<String, Value>,
    cur: String,
    k: usize,
}

type R<T> = Result<T, String>;

impl<'p> Lower<'p> {
    fn fresh(&mut self) -> String {
        self.k += 1;
        format!("{}#{}", self.cur, self.k)
    }

    fn emit_n(
        &mut self,
        op: &str,
        inputs: &[&str],
        n: usize,
        attrs: Vec<AttributeProto>,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..n).map(|_| self.fresh()).collect();
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.clone(),
            name: self.cur.clone(),
            op_type: op.into(),
            domain: String::new(),
            attribute: attrs,
        });
        outs
    }

    fn emit(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.emit_n(op, inputs, 1, attrs).remove(0)
    }

    fn constant(&mut self, d: i32, dims: &[i64], raw: Vec<u8>) -> String {
        let t = TensorProto {
            dims: dims.to_vec(),
            data_type: d,
            raw_data: raw,
            ..Default::default()
        };
        self.emit(
            "Constant",
            &[],
            vec![AttributeProto {
                name: "value".into(),
                r#type: attr_type::TENSOR,
                t: Some(t),
                ..Default::default()
            }],
        )
    }

    fn ints(&mut self, v: &[i64]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.constant(dt::INT64, &[v.len() as i64], raw)
    }

    fn scalar(&mut self, v: f64, d: i32) -> String {
        let raw = scalar_bytes(v, d);
        self.constant(d, &[], raw)
    }

    fn cast(&mut self, x: &V, to: i32) -> V {
        if x.dt == to {
            return x.clone();
        }
        let name = self.emit("Cast", &[&x.name], vec![attr_i("to", to as i64)]);
        V {
            name,
            dt: to,
            dims: x.dims.clone(),
        }
    }

    /// A 1-D int64 value holding `dims` (symbols read from the inputs that hold them).
    fn shape_value(&mut self, dims: &[SymDim]) -> R<String> {
        if dims.iter().all(|d| matches!(d, SymDim::Int(_))) {
            let v: Vec<i64> = dims
                .iter()
                .map(|d| if let SymDim::Int(i) = d { *i } else { 0 })
                .collect();
            return Ok(self.ints(&v));
        }
        let mut parts = vec![];
        for d in dims {
            parts.push(self.dim_value(d)?);
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        Ok(self.emit("Concat", &refs, vec![attr_i("axis", 0)]))
    }

    fn dim_value(&mut self, d: &SymDim) -> R<String> {
        match d {
            SymDim::Int(i) => Ok(self.ints(&[*i])),
            SymDim::Sym(s, _) => {
                let (src, i) = self
                    .sym_src
                    .get(s)
                    .cloned()
                    .ok_or_else(|| format!("the size {s} is not a dim of any input"))?;
                Ok(self.emit(
                    "Shape",
                    &[&src],
                    vec![attr_i("start", i as i64), attr_i("end", i as i64 + 1)],
                ))
            }
            SymDim::Expr(e) => Err(format!(
                "the size {e} (an expression of symbolic dims) is not supported yet"
            )),
        }
    }

    fn meta(&self, name: &str) -> R<&'p Meta> {
        self.p
            .metas
            .get(name)
            .ok_or_else(|| format!("no tensor_values entry for \"{name}\""))
    }
}

/// Accessors for one node's arguments.
struct Args<'n> {
    n: &'n FxNode,
}

impl<'n> Args<'n> {
    fn get(&self, name: &str, pos: usize) -> Option<&'n Value> {
        self.n
            .inputs
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| self.n.inputs.get(pos).filter(|(k, _)| k.is_empty()))
            .map(|(_, v)| v)
            .filter(|v| v.get("as_none").is_none())
    }
    fn has(&self, name: &str, pos: usize) -> bool {
        self.get(name, pos).is_some()
    }
    fn tensor_name(&self, name: &str, pos: usize) -> Option<String> {
        let v = self.get(name, pos)?;
        let t = v
            .get("as_tensor")
            .or_else(|| v.get("as_optional_tensor").and_then(|o| o.get("as_tensor")))?;
        t.get("name").and_then(Value::as_str).map(str::to_string)
    }
    fn int(&self, name: &str, pos: usize) -> Option<i64> {
        let v = self.get(name, pos)?;
        v.get("as_int")
            .and_then(Value::as_i64)
            .or_else(|| v.get("as_bool").and_then(Value::as_bool).map(|b| b as i64))
            .or_else(|| {
                v.get("as_sym_int")
                    .and_then(|s| s.get("as_int"))
                    .and_then(Value::as_i64)
            })
    }
    fn float(&self, name: &str, pos: usize) -> Option<f64> {
        let v = self.get(name, pos)?;
        v.get("as_float")
            .and_then(Value::as_f64)
            .or_else(|| v.get("as_int").and_then(Value::as_i64).map(|i| i as f64))
            .or_else(|| {
                v.get("as_float")
                    .and_then(Value::as_str)
                    .and_then(|s| match s {
                        "inf" | "Infinity" => Some(f64::INFINITY),
                        "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
                        "nan" | "NaN" => Some(f64::NAN),
                        _ => s.parse().ok(),
                    })
            })
    }
    fn scalar(&self, name: &str, pos: usize) -> Option<Scalar> {
        let v = self.get(name, pos)?;
        if let Some(b) = v.get("as_bool").and_then(Value::as_bool) {
            return Some(Scalar::B(b));
        }
        if let Some(i) = v.get("as_int").and_then(Value::as_i64) {
            return Some(Scalar::I(i));
        }
        self.float(name, pos).map(Scalar::F)
    }
    fn bool(&self, name: &str, pos: usize) -> Option<bool> {
        let v = self.get(name, pos)?;
        v.get("as_bool").and_then(Value::as_bool)
    }
    fn string(&self, name: &str, pos: usize) -> Option<String> {
        let v = self.get(name, pos)?;
        v.get("as_string")
            .and_then(Value::as_str)
            .map(str::to_string)
    }
    fn ints(&self, name: &str, pos: usize) -> Option<Vec<i64>> {
        let v = self.get(name, pos)?;
        if let Some(a) = v.get("as_ints").and_then(Value::as_array) {
            return a.iter().map(Value::as_i64).collect();
        }
        if let Some(i) = v.get("as_int").and_then(Value::as_i64) {
            return Some(vec![i]);
        }
        if let Some(a) = v.get("as_sym_ints").and_then(Value::as_array) {
            return a
                .iter()
                .map(|s| s.get("as_int").and_then(Value::as_i64))
                .collect();
        }
        None
    }
    /// A list of tensors (`as_tensors`, or optional tensors with `None`s kept).
    fn tensors(&self, name: &str, pos: usize) -> Option<Vec<Option<String>>> {
        let v = self.get(name, pos)?;
        let a = v
            .get("as_tensors")
            .or_else(|| v.get("as_optional_tensors"))
            .and_then(Value::as_array)?;
        Some(
            a.iter()
                .map(|t| {
                    t.get("name")
                        .or_else(|| t.get("as_tensor").and_then(|x| x.get("name")))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .collect(),
        )
    }
    fn dtype(&self, name: &str, pos: usize) -> Option<i64> {
        self.get(name, pos)?
            .get("as_scalar_type")
            .and_then(Value::as_i64)
    }
}

fn norm_axis(d: i64, rank: usize) -> i64 {
    if d < 0 {
        d + rank.max(1) as i64
    } else {
        d
    }
}

/// Lower the program into an ONNX model, with the provenance of each FX node.
pub fn lower(
    p: &Program,
    ar: &mut Archive,
    file: &str,
) -> Result<(ModelProto, HashMap<String, Prov>), TorchImportError> {
    let mut lw = Lower {
        p,
        nodes: vec![],
        inits: vec![],
        vals: HashMap::new(),
        syms: HashMap::new(),
        sym_src: HashMap::new(),
        consts: HashMap::new(),
        cur: String::new(),
        k: 0,
    };
    let mut inputs = vec![];
    for (name, kind) in &p.inputs {
        match kind {
            InputKind::User => {
                let m = p.metas.get(name).ok_or_else(|| {
                    bad(
                        file,
                        format!("user input \"{name}\" has no tensor_values entry"),
                    )
                })?;
                let (d, _) = onnx_dtype(m.dtype).ok_or_else(|| {
                    bad(
                        file,
                        format!(
                            "user input \"{name}\" has {}, which RLX does not run",
                            dtype_name(m.dtype)
                        ),
                    )
                })?;
                let mut dims = vec![];
                for (i, s) in m.sizes.iter().enumerate() {
                    dims.push(Dimension {
                        value: Some(match s {
                            SymDim::Int(v) => DimValue::DimValue(*v),
                            SymDim::Sym(sym, _) => {
                                lw.sym_src
                                    .entry(sym.clone())
                                    .or_insert_with(|| (name.clone(), i));
                                DimValue::DimParam(sym.clone())
                            }
                            SymDim::Expr(e) => DimValue::DimParam(e.clone()),
                        }),
                        denotation: String::new(),
                    });
                }
                inputs.push(ValueInfoProto {
                    name: name.clone(),
                    r#type: Some(TypeProto {
                        tensor_type: Some(TypeProtoTensor {
                            elem_type: d,
                            shape: Some(TensorShapeProto { dim: dims }),
                        }),
                        denotation: String::new(),
                    }),
                });
                lw.vals.insert(
                    name.clone(),
                    V {
                        name: name.clone(),
                        dt: d,
                        dims: m.sizes.clone(),
                    },
                );
            }
            InputKind::State { fqn, constant } => {
                let _ = constant;
                let (entry, dir) = p
                    .weights
                    .get(fqn)
                    .map(|e| (e, "data/weights/"))
                    .or_else(|| p.constants.get(fqn).map(|e| (e, "data/constants/")))
                    .ok_or_else(|| TorchImportError::Tensor {
                        file: file.into(),
                        name: fqn.clone(),
                        msg: "listed by the program but missing from the archive's weights and constants".into(),
                    })?;
                let t = read_state(ar, &p.storages, file, fqn, dir, entry)?;
                // The stored tensor must be what the graph computes with: a dtype or shape
                // other than the placeholder's would run the graph on wrong data.
                if let Some(m) = p.metas.get(name) {
                    let (gd, _) = onnx_dtype(m.dtype).unwrap_or((t.data_type, 0));
                    let same_dims = m.sizes.len() == t.dims.len()
                        && m.sizes
                            .iter()
                            .zip(&t.dims)
                            .all(|(a, &b)| !matches!(a, SymDim::Int(x) if *x != b));
                    if gd != t.data_type || !same_dims {
                        return Err(TorchImportError::Tensor {
                            file: file.into(),
                            name: fqn.clone(),
                            msg: format!(
                                "the archive stores {} {:?} but the program's graph uses it as {} {:?} (placeholder \"{name}\"): the weights do not belong to this program",
                                onnx_dtype_name(t.data_type),
                                t.dims,
                                onnx_dtype_name(gd),
                                m.sizes.iter().map(|d| match d { SymDim::Int(i) => i.to_string(), _ => "?".into() }).collect::<Vec<_>>()
                            ),
                        });
                    }
                }
                let v = V {
                    name: fqn.clone(),
                    dt: t.data_type,
                    dims: t.dims.iter().map(|&d| SymDim::Int(d)).collect(),
                };
                let mut t = t;
                t.name = fqn.clone();
                lw.inits.push(t);
                lw.vals.insert(name.clone(), v);
            }
            InputKind::ConstantArg(v) => {
                lw.consts.insert(name.clone(), v.clone());
            }
        }
    }

    let mut prov = HashMap::new();
    for n in &p.nodes {
        let pv = Prov {
            fx_name: n.name.clone(),
            target: n.target.clone(),
            module: n.nn_module_stack.as_deref().and_then(module_path),
            source: n.stack_trace.as_deref().and_then(source_of),
        };
        lw.cur = n.name.clone();
        lw.k = 0;
        if let Err(msg) = lower_node(&mut lw, n) {
            return Err(TorchImportError::Node {
                file: file.into(),
                node: n.name.clone(),
                target: n.target.clone(),
                at: pv.at(),
                msg,
            });
        }
        prov.insert(n.name.clone(), pv);
    }

    let mut outputs = vec![];
    for (i, o) in p.outputs.iter().enumerate() {
        let Some(tn) = o
            .get("as_tensor")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
        else {
            return Err(bad(
                file,
                format!("output #{i} is not a tensor ({o}): RLX returns tensors only"),
            ));
        };
        let v = lw.vals.get(tn).cloned().ok_or_else(|| {
            bad(
                file,
                format!("output #{i} \"{tn}\" is not computed by the graph"),
            )
        })?;
        let out_name = format!("output_{i}");
        lw.cur = format!("output_{i}");
        lw.nodes.push(NodeProto {
            input: vec![v.name.clone()],
            output: vec![out_name.clone()],
            name: tn.to_string(),
            op_type: "Identity".into(),
            ..Default::default()
        });
        outputs.push(ValueInfoProto {
            name: out_name,
            r#type: None,
        });
    }

    let graph = GraphProto {
        node: lw.nodes,
        name: "torch.export".into(),
        initializer: lw.inits,
        input: inputs,
        output: outputs,
        value_info: vec![],
    };
    let model = ModelProto {
        ir_version: 10,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: OPSET,
        }],
        producer_name: "rlx-torch-import".into(),
        graph: Some(graph),
        ..Default::default()
    };
    Ok((model, prov))
}

/// Read one parameter/buffer/constant: its storage entry, gathered through its strides
/// and storage offset into a contiguous tensor.
fn read_state(
    ar: &mut Archive,
    mem: &HashMap<String, Vec<u8>>,
    file: &str,
    fqn: &str,
    dir: &str,
    entry: &Value,
) -> Result<TensorProto, TorchImportError> {
    let err = |msg: String| TorchImportError::Tensor {
        file: file.into(),
        name: fqn.into(),
        msg,
    };
    if entry.get("use_pickle").and_then(Value::as_bool) == Some(true) {
        return Err(err("stored pickled (a tensor subclass or a non-tensor constant): RLX reads plain tensors only".into()));
    }
    let path = entry
        .get("path_name")
        .and_then(Value::as_str)
        .ok_or_else(|| err("no path_name in the weights config".into()))?;
    if path.contains('/') || path.contains("..") {
        return Err(err(format!(
            "path_name \"{path}\" leaves the archive's weights folder"
        )));
    }
    let meta = entry
        .get("tensor_meta")
        .ok_or_else(|| err("no tensor_meta in the weights config".into()))?;
    let code = meta.get("dtype").and_then(Value::as_i64).unwrap_or(0);
    let (d, es) = onnx_dtype(code)
        .ok_or_else(|| err(format!("{}, which RLX does not read", dtype_name(code))))?;
    let ints = |k: &str| -> Result<Vec<i64>, TorchImportError> {
        meta.get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| err(format!("tensor_meta has no {k}")))?
            .iter()
            .map(|s| match crate::program::sym_dim(s) {
                Some(SymDim::Int(i)) => Ok(i),
                _ => Err(err(format!("tensor_meta {k} entry {s} is not an integer"))),
            })
            .collect()
    };
    let sizes = ints("sizes")?;
    let strides = ints("strides")?;
    let offset = meta
        .get("storage_offset")
        .and_then(crate::program::sym_dim)
        .map(|s| if let SymDim::Int(i) = s { i } else { -1 })
        .unwrap_or(0);
    if sizes.iter().any(|&s| s < 0)
        || strides.iter().any(|&s| s < 0)
        || offset < 0
        || strides.len() != sizes.len()
    {
        return Err(err(format!(
            "bad tensor_meta: sizes {sizes:?}, strides {strides:?}, storage offset {offset}"
        )));
    }
    let numel = sizes
        .iter()
        .try_fold(1u64, |a, &s| a.checked_mul(s as u64))
        .ok_or_else(|| err(format!("sizes {sizes:?} overflow")))?;
    let key = format!("{dir}{path}");
    let storage_len = match mem.get(&key) {
        Some(b) => b.len() as u64,
        None => ar.size(&key)?,
    };
    // Last element's offset (in elements) must lie in the storage: checked before any
    // allocation, so a bogus 10^12-element header is refused here.
    let span = if numel == 0 {
        0
    } else {
        sizes
            .iter()
            .zip(&strides)
            .try_fold(offset as u64, |a, (&s, &st)| {
                (s as u64 - 1)
                    .checked_mul(st as u64)
                    .and_then(|x| a.checked_add(x))
            })
            .and_then(|x| x.checked_add(1))
            .ok_or_else(|| err("strides overflow".into()))?
    };
    if span.checked_mul(es as u64).is_none_or(|b| b > storage_len) {
        return Err(err(format!(
            "{numel} elements of {es} bytes (sizes {sizes:?}, strides {strides:?}, offset {offset}) need {span} storage elements, but {} holds {storage_len} bytes",
            if mem.contains_key(&key) { format!("its torch.save'd storage \"{path}\"") } else { format!("\"{dir}{path}\"") }
        )));
    }
    let read;
    let storage: &[u8] = match mem.get(&key) {
        Some(b) => b,
        None => {
            read = ar.read(&key)?;
            &read
        }
    };
    let contiguous = {
        let mut exp = 1i64;
        let mut ok = true;
        for (&s, &st) in sizes.iter().zip(&strides).rev() {
            if s != 1 && st != exp {
                ok = false;
            }
            exp *= s;
        }
        ok
    };
    let raw = if contiguous {
        let start = offset as usize * es;
        storage[start..start + numel as usize * es].to_vec()
    } else {
        let mut out = Vec::with_capacity(numel as usize * es);
        let mut idx = vec![0i64; sizes.len()];
        for _ in 0..numel {
            let off = offset + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>();
            let o = off as usize * es;
            out.extend_from_slice(&storage[o..o + es]);
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < sizes[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    };
    Ok(TensorProto {
        dims: sizes,
        data_type: d,
        raw_data: raw,
        ..Default::default()
    })
}

/// The names of a node's tensor outputs (`None` for an unused or non-tensor slot).
fn out_names(n: &FxNode) -> Vec<Option<String>> {
    let mut v = vec![];
    for o in &n.outputs {
        if let Some(t) = o.get("as_tensor") {
            v.push(t.get("name").and_then(Value::as_str).map(str::to_string));
        } else if let Some(ts) = o.get("as_tensors").and_then(Value::as_array) {
            for t in ts {
                v.push(t.get("name").and_then(Value::as_str).map(str::to_string));
            }
        } else {
            v.push(None);
        }
    }
    v
}

fn lower_node(lw: &mut Lower, n: &FxNode) -> R<()> {
    let a = Args { n };
    let outs = out_names(n);
    // sym-int producers
    if let Some(o) = n.outputs.first().and_then(|o| o.get("as_sym_int")) {
        let name = o
            .get("as_name")
            .and_then(Value::as_str)
            .ok_or("a sym-int output without a name")?
            .to_string();
        let v = lower_sym(lw, n, &a)?;
        lw.syms.insert(name, v);
        return Ok(());
    }
    // A symbolic-size predicate (`_operator.eq` of two sym sizes, torch 2.8): only the
    // runtime asserts read it, and those are dropped below.
    if !n.target.starts_with("aten.")
        && n.outputs
            .first()
            .is_some_and(|o| o.get("as_sym_bool").is_some())
    {
        return Ok(());
    }
    let full = n.target.as_str();
    // Asserts and no-output nodes.
    if full.starts_with("aten._assert")
        || full.starts_with("aten.sym_constrain_range")
        || full == "aten._functional_assert_async.msg"
    {
        return Ok(());
    }
    let (ns, rest) = full.split_once('.').unwrap_or(("", full));
    if ns != "aten" && !(full.ends_with("getitem")) {
        return Err(format!("unsupported op {full} (only ATen ops are lowered)"));
    }
    let op = rest.split('.').next().unwrap_or(rest);
    // In-place ops (`relu_`, `add_`, `masked_fill_`) of the non-functional export IR: lowered
    // as their functional form, and the mutated argument then names the result too, so
    // later uses of it see the new value.
    let inplace = op.len() > 1 && op.ends_with('_') && !op.ends_with("__");
    let op = if inplace { &op[..op.len() - 1] } else { op };
    let op = match op {
        "__and__" => "bitwise_and",
        "__or__" => "bitwise_or",
        "__xor__" => "bitwise_xor",
        "__iand__" => "bitwise_and",
        "__ior__" => "bitwise_or",
        o => o,
    };
    let overload = rest.split_once('.').map_or("default", |(_, o)| o);
    let out0 = outs.first().cloned().flatten();
    let ometa = match &out0 {
        Some(o) => Some(lw.meta(o)?.clone()),
        None => None,
    };
    let odt = match &ometa {
        Some(m) => Some(
            onnx_dtype(m.dtype)
                .ok_or_else(|| {
                    format!("output has {}, which RLX does not run", dtype_name(m.dtype))
                })?
                .0,
        ),
        None => None,
    };
    let t = |lw: &Lower, name: &str, pos: usize| -> R<V> {
        let tn = a
            .tensor_name(name, pos)
            .ok_or_else(|| format!("argument {name} is not a tensor"))?;
        lw.vals.get(&tn).cloned().ok_or_else(|| {
            format!("argument {name} refers to \"{tn}\", which is not computed before this node")
        })
    };
    let opt_t = |lw: &Lower, name: &str, pos: usize| -> R<Option<V>> {
        match a.tensor_name(name, pos) {
            Some(tn) => lw.vals.get(&tn).cloned().map(Some).ok_or_else(|| {
                format!(
                    "argument {name} refers to \"{tn}\", which is not computed before this node"
                )
            }),
            None => Ok(None),
        }
    };
    // Define the output(s).
    let set = |lw: &mut Lower, idx: usize, name: String| -> R<()> {
        if let Some(Some(o)) = outs.get(idx) {
            let m = lw.meta(o)?;
            let d = onnx_dtype(m.dtype)
                .ok_or_else(|| format!("output has {}", dtype_name(m.dtype)))?
                .0;
            let dims = m.sizes.clone();
            lw.vals.insert(o.clone(), V { name, dt: d, dims });
        }
        Ok(())
    };
    let odt_v = odt.unwrap_or(dt::FLOAT);
    let orank = ometa.as_ref().map_or(0, |m| m.sizes.len());

    // Operand of a binary op: a tensor (cast to `to`), or a scalar constant of dtype `to`.
    let operand = |lw: &mut Lower, name: &str, pos: usize, to: i32| -> R<String> {
        if let Some(v) = opt_t(lw, name, pos)? {
            return Ok(lw.cast(&v, to).name);
        }
        let s = a
            .scalar(name, pos)
            .ok_or_else(|| format!("argument {name} is neither a tensor nor a number"))?;
        Ok(lw.scalar(s.f(), to))
    };

    let simple_unary = match op {
        "exp" => Some("Exp"),
        "log" => Some("Log"),
        "sqrt" => Some("Sqrt"),
        "neg" => Some("Neg"),
        "abs" => Some("Abs"),
        "sin" => Some("Sin"),
        "cos" => Some("Cos"),
        "tan" => Some("Tan"),
        "tanh" => Some("Tanh"),
        "sigmoid" => Some("Sigmoid"),
        "relu" => Some("Relu"),
        "erf" => Some("Erf"),
        "floor" => Some("Floor"),
        "ceil" => Some("Ceil"),
        "round" if !a.has("decimals", 1) => Some("Round"),
        "sign" => Some("Sign"),
        "reciprocal" => Some("Reciprocal"),
        "asin" => Some("Asin"),
        "acos" => Some("Acos"),
        "atan" => Some("Atan"),
        "sinh" => Some("Sinh"),
        "cosh" => Some("Cosh"),
        "asinh" => Some("Asinh"),
        "acosh" => Some("Acosh"),
        "atanh" => Some("Atanh"),
        "logical_not" => Some("Not"),
        "bitwise_not" => Some(if odt == Some(dt::BOOL) {
            "Not"
        } else {
            "BitwiseNot"
        }),
        "isnan" => Some("IsNaN"),
        "isinf" => Some("IsInf"),
        "hardswish" => Some("HardSwish"),
        "mish" => Some("Mish"),
        "softsign" => Some("Softsign"),
        _ => None,
    };
    if let Some(onnx) = simple_unary {
        let x = t(lw, "self", 0)?;
        let x = if matches!(onnx, "IsNaN" | "IsInf" | "Not" | "BitwiseNot") {
            x
        } else {
            lw.cast(&x, odt_v)
        };
        let y = lw.emit(onnx, &[&x.name], vec![]);
        return set(lw, 0, y);
    }

    let y: String = match op {
        "getitem" => {
            // Serialization lists a multi-output node's outputs by name; a getitem that
            // survives it indexes something RLX does not model.
            return Err("operator.getitem on a value RLX cannot index".into());
        }
        "rsqrt" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let s = lw.emit("Sqrt", &[&x.name], vec![]);
            lw.emit("Reciprocal", &[&s], vec![])
        }
        "log1p" | "expm1" | "log2" | "log10" | "exp2" | "square" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            match op {
                "square" => lw.emit("Mul", &[&x.name, &x.name], vec![]),
                "log1p" => {
                    let one = lw.scalar(1.0, odt_v);
                    let s = lw.emit("Add", &[&x.name, &one], vec![]);
                    lw.emit("Log", &[&s], vec![])
                }
                "expm1" => {
                    let one = lw.scalar(1.0, odt_v);
                    let e = lw.emit("Exp", &[&x.name], vec![]);
                    lw.emit("Sub", &[&e, &one], vec![])
                }
                "exp2" => {
                    let two = lw.scalar(2.0, odt_v);
                    lw.emit("Pow", &[&two, &x.name], vec![])
                }
                _ => {
                    let base = if op == "log2" { 2f64.ln() } else { 10f64.ln() };
                    let l = lw.emit("Log", &[&x.name], vec![]);
                    let c = lw.scalar(base, odt_v);
                    lw.emit("Div", &[&l, &c], vec![])
                }
            }
        }
        "silu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            lw.emit("Swish", &[&x.name], vec![])
        }
        "gelu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let approx = a.string("approximate", 1).unwrap_or_else(|| "none".into());
            lw.emit("Gelu", &[&x.name], vec![attr_s("approximate", &approx)])
        }
        "leaky_relu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let s = a.float("negative_slope", 1).unwrap_or(0.01);
            lw.emit("LeakyRelu", &[&x.name], vec![attr_f("alpha", s as f32)])
        }
        "elu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let alpha = a.float("alpha", 1).unwrap_or(1.0);
            let scale = a.float("scale", 2).unwrap_or(1.0);
            let iscale = a.float("input_scale", 3).unwrap_or(1.0);
            if iscale != 1.0 {
                return Err("elu with input_scale != 1 is not supported".into());
            }
            let e = lw.emit("Elu", &[&x.name], vec![attr_f("alpha", alpha as f32)]);
            if scale != 1.0 {
                let c = lw.scalar(scale, odt_v);
                lw.emit("Mul", &[&e, &c], vec![])
            } else {
                e
            }
        }
        "celu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let alpha = a.float("alpha", 1).unwrap_or(1.0);
            lw.emit("Celu", &[&x.name], vec![attr_f("alpha", alpha as f32)])
        }
        "selu" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            lw.emit("Selu", &[&x.name], vec![])
        }
        "hardsigmoid" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            lw.emit(
                "HardSigmoid",
                &[&x.name],
                vec![attr_f("alpha", 1.0 / 6.0), attr_f("beta", 0.5)],
            )
        }
        "softplus" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let beta = a.float("beta", 1).unwrap_or(1.0);
            if beta == 1.0 {
                lw.emit("Softplus", &[&x.name], vec![])
            } else {
                // softplus(beta x) / beta
                let b = lw.scalar(beta, odt_v);
                let bx = lw.emit("Mul", &[&x.name, &b], vec![]);
                let s = lw.emit("Softplus", &[&bx], vec![]);
                lw.emit("Div", &[&s, &b], vec![])
            }
        }
        "hardtanh" | "clamp" | "clamp_min" | "clamp_max" | "relu6" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let (lo, hi) = match op {
                "hardtanh" => (Some(a.float("min_val", 1).unwrap_or(-1.0)), Some(a.float("max_val", 2).unwrap_or(1.0))),
                "relu6" => (Some(0.0), Some(6.0)),
                _ => (None, None),
            };
            let mut cur = x.name.clone();
            let lo_v = match (op, lo) {
                (_, Some(l)) => Some(lw.scalar(l, odt_v)),
                ("clamp" | "clamp_min", _) => {
                    let nm = "min";
                    if a.has(nm, 1) {
                        Some(operand(lw, nm, 1, odt_v)?)
                    } else {
                        None
                    }
                }
                _ => None,
            };
            let hi_v = match (op, hi) {
                (_, Some(h)) => Some(lw.scalar(h, odt_v)),
                ("clamp", _) if a.has("max", 2) => Some(operand(lw, "max", 2, odt_v)?),
                ("clamp_max", _) => Some(operand(lw, "max", 1, odt_v)?),
                _ => None,
            };
            if let Some(l) = lo_v {
                cur = lw.emit("Max", &[&cur, &l], vec![]);
            }
            if let Some(h) = hi_v {
                cur = lw.emit("Min", &[&cur, &h], vec![]);
            }
            if cur == x.name {
                lw.emit("Identity", &[&cur], vec![])
            } else {
                cur
            }
        }
        "add" | "sub" | "rsub" => {
            let (xa, xb) = if op == "rsub" { ("other", "self") } else { ("self", "other") };
            let (pa, pb) = if op == "rsub" { (1, 0) } else { (0, 1) };
            let x = operand(lw, xa, pa, odt_v)?;
            let mut yv = operand(lw, xb, pb, odt_v)?;
            if let Some(al) = a.scalar("alpha", 2) {
                if al.f() != 1.0 {
                    let c = lw.scalar(al.f(), odt_v);
                    yv = lw.emit("Mul", &[&yv, &c], vec![]);
                }
            }
            let onnx = if op == "add" { "Add" } else { "Sub" };
            lw.emit(onnx, &[&x, &yv], vec![])
        }
        "mul" | "maximum" | "minimum" | "fmax" | "fmin" => {
            let x = operand(lw, "self", 0, odt_v)?;
            let yv = operand(lw, "other", 1, odt_v)?;
            let onnx = match op {
                "mul" => "Mul",
                "maximum" | "fmax" => "Max",
                _ => "Min",
            };
            lw.emit(onnx, &[&x, &yv], vec![])
        }
        "div" => {
            let mode = a.string("rounding_mode", 2);
            match mode.as_deref() {
                None => {
                    let x = operand(lw, "self", 0, odt_v)?;
                    let yv = operand(lw, "other", 1, odt_v)?;
                    lw.emit("Div", &[&x, &yv], vec![])
                }
                Some(m) => {
                    if is_float(odt_v) {
                        let x = operand(lw, "self", 0, odt_v)?;
                        let yv = operand(lw, "other", 1, odt_v)?;
                        let q = lw.emit("Div", &[&x, &yv], vec![]);
                        if m == "floor" {
                            lw.emit("Floor", &[&q], vec![])
                        } else {
                            // trunc: sign(q) * floor(|q|)
                            let s = lw.emit("Sign", &[&q], vec![]);
                            let ab = lw.emit("Abs", &[&q], vec![]);
                            let f = lw.emit("Floor", &[&ab], vec![]);
                            lw.emit("Mul", &[&s, &f], vec![])
                        }
                    } else {
                        // Integers: compute in f64 (exact for |x| < 2^53), round, cast back.
                        let x = operand(lw, "self", 0, dt::DOUBLE)?;
                        let yv = operand(lw, "other", 1, dt::DOUBLE)?;
                        let q = lw.emit("Div", &[&x, &yv], vec![]);
                        let r = if m == "floor" {
                            lw.emit("Floor", &[&q], vec![])
                        } else {
                            let s = lw.emit("Sign", &[&q], vec![]);
                            let ab = lw.emit("Abs", &[&q], vec![]);
                            let f = lw.emit("Floor", &[&ab], vec![]);
                            lw.emit("Mul", &[&s, &f], vec![])
                        };
                        lw.emit("Cast", &[&r], vec![attr_i("to", odt_v as i64)])
                    }
                }
            }
        }
        "remainder" | "fmod" => {
            let x = operand(lw, "self", 0, odt_v)?;
            let yv = operand(lw, "other", 1, odt_v)?;
            let fmod = if op == "fmod" { 1 } else { 0 };
            // torch.remainder follows the divisor's sign (Python %): ONNX Mod fmod=0 does for
            // integers; for floats, fmod=1 and a sign fix.
            if is_float(odt_v) {
                let r = lw.emit("Mod", &[&x, &yv], vec![attr_i("fmod", 1)]);
                if fmod == 1 {
                    r
                } else {
                    // r + y where r != 0 and sign(r) != sign(y)
                    let zero = lw.scalar(0.0, odt_v);
                    let rz = lw.emit("Equal", &[&r, &zero], vec![]);
                    let rn = lw.emit("Less", &[&r, &zero], vec![]);
                    let yn = lw.emit("Less", &[&yv, &zero], vec![]);
                    let diff = lw.emit("Xor", &[&rn, &yn], vec![]);
                    let nz = lw.emit("Not", &[&rz], vec![]);
                    let fix = lw.emit("And", &[&diff, &nz], vec![]);
                    let ry = lw.emit("Add", &[&r, &yv], vec![]);
                    lw.emit("Where", &[&fix, &ry, &r], vec![])
                }
            } else {
                lw.emit("Mod", &[&x, &yv], vec![attr_i("fmod", fmod)])
            }
        }
        "pow" => {
            // pow.Tensor_Scalar(self, exponent), pow.Tensor_Tensor, pow.Scalar(self: scalar, exponent)
            let base = operand(lw, "self", 0, odt_v)?;
            let e = operand(lw, "exponent", 1, odt_v)?;
            lw.emit("Pow", &[&base, &e], vec![])
        }
        "eq" | "ne" | "lt" | "le" | "gt" | "ge" | "logical_and" | "logical_or" | "logical_xor"
        | "bitwise_and" | "bitwise_or" | "bitwise_xor" => {
            let x = opt_t(lw, "self", 0)?;
            let yv = opt_t(lw, "other", 1)?;
            let logical = op.starts_with("logical");
            let bitwise = op.starts_with("bitwise");
            let common = if logical {
                dt::BOOL
            } else if bitwise {
                odt_v
            } else {
                let ds: Vec<i32> = [&x, &yv].iter().filter_map(|v| v.as_ref().map(|v| v.dt)).collect();
                let scalar_float = a
                    .scalar("other", 1)
                    .is_some_and(|s| matches!(s, Scalar::F(_)));
                let fl = ds.iter().copied().filter(|d| is_float(*d)).max_by_key(|d| float_rank(*d));
                match fl {
                    Some(f) => f,
                    None if scalar_float => dt::FLOAT,
                    None => {
                        if ds.contains(&dt::INT64) {
                            dt::INT64
                        } else {
                            *ds.first().unwrap_or(&dt::INT64)
                        }
                    }
                }
            };
            let xa = operand(lw, "self", 0, common)?;
            let xb = operand(lw, "other", 1, common)?;
            match op {
                "eq" => lw.emit("Equal", &[&xa, &xb], vec![]),
                "ne" => {
                    let e = lw.emit("Equal", &[&xa, &xb], vec![]);
                    lw.emit("Not", &[&e], vec![])
                }
                "lt" => lw.emit("Less", &[&xa, &xb], vec![]),
                "le" => lw.emit("LessOrEqual", &[&xa, &xb], vec![]),
                "gt" => lw.emit("Greater", &[&xa, &xb], vec![]),
                "ge" => lw.emit("GreaterOrEqual", &[&xa, &xb], vec![]),
                "logical_and" => lw.emit("And", &[&xa, &xb], vec![]),
                "logical_or" => lw.emit("Or", &[&xa, &xb], vec![]),
                "logical_xor" => lw.emit("Xor", &[&xa, &xb], vec![]),
                "bitwise_and" if common == dt::BOOL => lw.emit("And", &[&xa, &xb], vec![]),
                "bitwise_or" if common == dt::BOOL => lw.emit("Or", &[&xa, &xb], vec![]),
                "bitwise_xor" if common == dt::BOOL => lw.emit("Xor", &[&xa, &xb], vec![]),
                "bitwise_and" => lw.emit("BitwiseAnd", &[&xa, &xb], vec![]),
                "bitwise_or" => lw.emit("BitwiseOr", &[&xa, &xb], vec![]),
                _ => lw.emit("BitwiseXor", &[&xa, &xb], vec![]),
            }
        }
        "where" => {
            let c = t(lw, "condition", 0)?;
            let c = lw.cast(&c, dt::BOOL);
            let x = operand(lw, "self", 1, odt_v)?;
            let yv = operand(lw, "other", 2, odt_v)?;
            lw.emit("Where", &[&c.name, &x, &yv], vec![])
        }
        "masked_fill" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let m = t(lw, "mask", 1)?;
            let m = lw.cast(&m, dt::BOOL);
            let v = operand(lw, "value", 2, odt_v)?;
            lw.emit("Where", &[&m.name, &v, &x.name], vec![])
        }
        "linear" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let w = lw.cast(&t(lw, "weight", 1)?, odt_v);
            let wt = lw.emit("Transpose", &[&w.name], vec![attr_ints("perm", &[1, 0])]);
            let mm = lw.emit("MatMul", &[&x.name, &wt], vec![]);
            match opt_t(lw, "bias", 2)? {
                Some(b) => {
                    let b = lw.cast(&b, odt_v);
                    lw.emit("Add", &[&mm, &b.name], vec![])
                }
                None => mm,
            }
        }
        "matmul" | "mm" | "bmm" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let w = lw.cast(&t(lw, if op == "matmul" { "other" } else { "mat2" }, 1)?, odt_v);
            lw.emit("MatMul", &[&x.name, &w.name], vec![])
        }
        "addmm" | "baddbmm" | "addbmm" => {
            if op == "addbmm" {
                return Err("addbmm is not supported".into());
            }
            let bias = lw.cast(&t(lw, "self", 0)?, odt_v);
            let (n1, n2) = if op == "addmm" { ("mat1", "mat2") } else { ("batch1", "batch2") };
            let m1 = lw.cast(&t(lw, n1, 1)?, odt_v);
            let m2 = lw.cast(&t(lw, n2, 2)?, odt_v);
            let mut mm = lw.emit("MatMul", &[&m1.name, &m2.name], vec![]);
            let alpha = a.scalar("alpha", 4).map_or(1.0, Scalar::f);
            let beta = a.scalar("beta", 3).map_or(1.0, Scalar::f);
            if alpha != 1.0 {
                let c = lw.scalar(alpha, odt_v);
                mm = lw.emit("Mul", &[&mm, &c], vec![]);
            }
            if beta == 0.0 {
                lw.emit("Identity", &[&mm], vec![])
            } else {
                let mut b = bias.name.clone();
                if beta != 1.0 {
                    let c = lw.scalar(beta, odt_v);
                    b = lw.emit("Mul", &[&b, &c], vec![]);
                }
                lw.emit("Add", &[&mm, &b], vec![])
            }
        }
        "einsum" => {
            let eq = a.string("equation", 0).ok_or("einsum without an equation")?;
            let ts = a.tensors("tensors", 1).ok_or("einsum without tensors")?;
            let mut names = vec![];
            for tn in ts {
                let tn = tn.ok_or("einsum with a None operand")?;
                let v = lw.vals.get(&tn).cloned().ok_or_else(|| format!("operand \"{tn}\" is not computed"))?;
                names.push(lw.cast(&v, odt_v).name);
            }
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            lw.emit("Einsum", &refs, vec![attr_s("equation", &eq.replace(' ', ""))])
        }
        "softmax" | "_softmax" | "log_softmax" | "_log_softmax" | "_safe_softmax" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).ok_or("softmax without dim")?, x.rank());
            let x = lw.cast(&x, odt_v);
            let onnx = if op.contains("log") { "LogSoftmax" } else { "Softmax" };
            let s = lw.emit(onnx, &[&x.name], vec![attr_i("axis", axis)]);
            if op == "_safe_softmax" {
                // Rows that are all -inf give 0 instead of NaN.
                let isn = lw.emit("IsNaN", &[&s], vec![]);
                let z = lw.scalar(0.0, odt_v);
                lw.emit("Where", &[&isn, &z, &s], vec![])
            } else {
                s
            }
        }
        "layer_norm" | "native_layer_norm" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let ns = a.ints("normalized_shape", 1).ok_or("layer_norm without normalized_shape")?;
            let eps = a.float("eps", 4).unwrap_or(1e-5);
            let c = ns.iter().product::<i64>();
            let w = match opt_t(lw, "weight", 2)? {
                Some(w) => lw.cast(&w, odt_v).name,
                None => {
                    let raw = (0..c).flat_map(|_| scalar_bytes(1.0, odt_v)).collect();
                    lw.constant(odt_v, &ns, raw)
                }
            };
            let mut ins = vec![x.name.clone(), w];
            if let Some(b) = opt_t(lw, "bias", 3)? {
                ins.push(lw.cast(&b, odt_v).name);
            }
            let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
            lw.emit(
                "LayerNormalization",
                &refs,
                vec![attr_i("axis", -(ns.len() as i64)), attr_f("epsilon", eps as f32)],
            )
        }
        "rms_norm" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let ns = a.ints("normalized_shape", 1).ok_or("rms_norm without normalized_shape")?;
            let eps = a.float("eps", 3).unwrap_or(match odt_v {
                dt::FLOAT16 => 0.0009765625,
                dt::BFLOAT16 => 0.0078125,
                dt::DOUBLE => f64::EPSILON,
                _ => f32::EPSILON as f64,
            });
            let c = ns.iter().product::<i64>();
            let w = match opt_t(lw, "weight", 2)? {
                Some(w) => lw.cast(&w, odt_v).name,
                None => {
                    let raw = (0..c).flat_map(|_| scalar_bytes(1.0, odt_v)).collect();
                    lw.constant(odt_v, &ns, raw)
                }
            };
            lw.emit(
                "RMSNormalization",
                &[&x.name, &w],
                vec![attr_i("axis", -(ns.len() as i64)), attr_f("epsilon", eps as f32)],
            )
        }
        "group_norm" | "native_group_norm" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let c = match x.dims.get(1) {
                Some(SymDim::Int(c)) => *c,
                _ => return Err("group_norm needs a static channel dim".into()),
            };
            let (groups, eps) = if op == "group_norm" {
                (a.int("num_groups", 1).ok_or("no num_groups")?, a.float("eps", 4).unwrap_or(1e-5))
            } else {
                (a.int("group", 6).ok_or("no group")?, a.float("eps", 7).unwrap_or(1e-5))
            };
            let ones = |lw: &mut Lower, v: f64| {
                let raw = (0..c).flat_map(|_| scalar_bytes(v, odt_v)).collect();
                lw.constant(odt_v, &[c], raw)
            };
            let w = match opt_t(lw, "weight", if op == "group_norm" { 2 } else { 1 })? {
                Some(w) => lw.cast(&w, odt_v).name,
                None => ones(lw, 1.0),
            };
            let b = match opt_t(lw, "bias", if op == "group_norm" { 3 } else { 2 })? {
                Some(b) => lw.cast(&b, odt_v).name,
                None => ones(lw, 0.0),
            };
            lw.emit(
                "GroupNormalization",
                &[&x.name, &w, &b],
                vec![attr_i("num_groups", groups), attr_f("epsilon", eps as f32)],
            )
        }
        "batch_norm" | "_native_batch_norm_legit_no_training" | "_native_batch_norm_legit" | "native_batch_norm" | "instance_norm" => {
            if op == "instance_norm" {
                let x = lw.cast(&t(lw, "input", 0)?, odt_v);
                let c = match x.dims.get(1) {
                    Some(SymDim::Int(c)) => *c,
                    _ => return Err("instance_norm needs a static channel dim".into()),
                };
                if a.bool("use_input_stats", 5) == Some(false) {
                    return Err("instance_norm with running stats is not supported".into());
                }
                let eps = a.float("eps", 7).unwrap_or(1e-5);
                let fill = |lw: &mut Lower, v: f64| {
                    let raw = (0..c).flat_map(|_| scalar_bytes(v, odt_v)).collect();
                    lw.constant(odt_v, &[c], raw)
                };
                let w = match opt_t(lw, "weight", 1)? {
                    Some(w) => lw.cast(&w, odt_v).name,
                    None => fill(lw, 1.0),
                };
                let b = match opt_t(lw, "bias", 2)? {
                    Some(b) => lw.cast(&b, odt_v).name,
                    None => fill(lw, 0.0),
                };
                lw.emit("InstanceNormalization", &[&x.name, &w, &b], vec![attr_f("epsilon", eps as f32)])
            } else {
                let training = match op {
                    "batch_norm" => a.bool("training", 5).unwrap_or(false),
                    "_native_batch_norm_legit" | "native_batch_norm" => a.bool("training", 5).unwrap_or(true),
                    _ => false,
                };
                if training {
                    return Err("batch_norm in training mode (batch statistics): call model.eval() before torch.export".into());
                }
                let x = lw.cast(&t(lw, "input", 0)?, odt_v);
                let c = match x.dims.get(1) {
                    Some(SymDim::Int(c)) => *c,
                    _ => return Err("batch_norm needs a static channel dim".into()),
                };
                let eps = a
                    .float("eps", if op == "batch_norm" { 7 } else { 6 })
                    .unwrap_or(1e-5);
                let fill = |lw: &mut Lower, v: f64| {
                    let raw = (0..c).flat_map(|_| scalar_bytes(v, odt_v)).collect();
                    lw.constant(odt_v, &[c], raw)
                };
                let w = match opt_t(lw, "weight", 1)? {
                    Some(w) => lw.cast(&w, odt_v).name,
                    None => fill(lw, 1.0),
                };
                let b = match opt_t(lw, "bias", 2)? {
                    Some(b) => lw.cast(&b, odt_v).name,
                    None => fill(lw, 0.0),
                };
                let rm = opt_t(lw, "running_mean", 3)?.ok_or("batch_norm without running_mean")?;
                let rv = opt_t(lw, "running_var", 4)?.ok_or("batch_norm without running_var")?;
                let rm = lw.cast(&rm, odt_v).name;
                let rv = lw.cast(&rv, odt_v).name;
                lw.emit(
                    "BatchNormalization",
                    &[&x.name, &w, &b, &rm, &rv],
                    vec![attr_f("epsilon", eps as f32)],
                )
            }
        }
        "embedding" => {
            let w = t(lw, "weight", 0)?;
            let idx = t(lw, "indices", 1)?;
            let w = lw.cast(&w, odt_v);
            lw.emit("Gather", &[&w.name, &idx.name], vec![attr_i("axis", 0)])
        }
        "scaled_dot_product_attention" => {
            let q = lw.cast(&t(lw, "query", 0)?, odt_v);
            let k = lw.cast(&t(lw, "key", 1)?, odt_v);
            let v = lw.cast(&t(lw, "value", 2)?, odt_v);
            if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
                return Err("scaled_dot_product_attention on tensors that are not 4-D (batch, heads, seq, dim)".into());
            }
            if a.float("dropout_p", 4).unwrap_or(0.0) != 0.0 {
                return Err("scaled_dot_product_attention with dropout_p > 0 (training): export in eval mode".into());
            }
            let mut attrs = vec![];
            if a.bool("is_causal", 5) == Some(true) {
                attrs.push(attr_i("is_causal", 1));
            }
            if let Some(s) = a.float("scale", 6) {
                attrs.push(attr_f("scale", s as f32));
            }
            let mut ins = vec![q.name.clone(), k.name.clone(), v.name.clone()];
            if let Some(m) = opt_t(lw, "attn_mask", 3)? {
                let m = if m.dt == dt::BOOL { m } else { lw.cast(&m, odt_v) };
                ins.push(m.name);
            }
            let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
            lw.emit("Attention", &refs, attrs)
        }
        "convolution" | "conv2d" | "conv1d" | "conv3d" | "conv_transpose2d" | "conv_transpose1d" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let w = lw.cast(&t(lw, "weight", 1)?, odt_v);
            let b = opt_t(lw, "bias", 2)?.map(|b| lw.cast(&b, odt_v));
            let sp = x.rank().saturating_sub(2);
            let rep = |v: Option<Vec<i64>>, d: i64| -> Vec<i64> {
                match v {
                    Some(v) if v.len() == sp => v,
                    Some(v) if v.len() == 1 => vec![v[0]; sp],
                    _ => vec![d; sp],
                }
            };
            let transposed = match op {
                "convolution" => a.bool("transposed", 6).unwrap_or(false),
                "conv_transpose2d" | "conv_transpose1d" => true,
                _ => false,
            };
            let stride = rep(a.ints("stride", 3), 1);
            let (pad_str, padding) = match a.string("padding", 4) {
                Some(s) => (Some(s), vec![0; sp]),
                None => (None, rep(a.ints("padding", 4), 0)),
            };
            let (dil_pos, groups_pos) = match op {
                "convolution" => (5, 8),
                "conv_transpose2d" | "conv_transpose1d" => (7, 6),
                _ => (5, 6),
            };
            let dilation = rep(a.ints("dilation", dil_pos), 1);
            let groups = a.int("groups", groups_pos).unwrap_or(1);
            let mut attrs = vec![
                attr_ints("strides", &stride),
                attr_ints("dilations", &dilation),
                attr_i("group", groups),
            ];
            match pad_str.as_deref() {
                Some("same") => attrs.push(attr_s("auto_pad", "SAME_UPPER")),
                Some("valid") => attrs.push(attr_s("auto_pad", "VALID")),
                Some(o) => return Err(format!("padding \"{o}\"")),
                None => {
                    let mut pads = padding.clone();
                    pads.extend_from_slice(&padding);
                    attrs.push(attr_ints("pads", &pads));
                }
            }
            if transposed {
                let op_pos = if op == "convolution" { 7 } else { 5 };
                let opad = rep(a.ints("output_padding", op_pos), 0);
                attrs.push(attr_ints("output_padding", &opad));
            }
            let mut ins = vec![x.name.clone(), w.name.clone()];
            if let Some(b) = b {
                ins.push(b.name);
            }
            let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
            lw.emit(if transposed { "ConvTranspose" } else { "Conv" }, &refs, attrs)
        }
        "max_pool2d" | "max_pool2d_with_indices" | "max_pool1d" | "avg_pool2d" | "avg_pool1d" => {
            if op == "max_pool2d_with_indices" && outs.get(1).is_some_and(|o| o.is_some()) && outs.len() > 1 {
                // indices output named: only fine when unused; we cannot tell here, so the
                // importer drops it (a use of it fails as "not computed").
            }
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let sp = x.rank().saturating_sub(2);
            let ks = a.ints("kernel_size", 1).ok_or("pool without kernel_size")?;
            let ks = if ks.len() == 1 { vec![ks[0]; sp] } else { ks };
            let st = match a.ints("stride", 2) {
                Some(s) if !s.is_empty() => {
                    if s.len() == 1 {
                        vec![s[0]; sp]
                    } else {
                        s
                    }
                }
                _ => ks.clone(),
            };
            let pd = a.ints("padding", 3).unwrap_or_else(|| vec![0]);
            let pd = if pd.len() == 1 { vec![pd[0]; sp] } else { pd };
            let mut pads = pd.clone();
            pads.extend_from_slice(&pd);
            let mut attrs = vec![
                attr_ints("kernel_shape", &ks),
                attr_ints("strides", &st),
                attr_ints("pads", &pads),
            ];
            if op.starts_with("max") {
                let dl = a.ints("dilation", 4).unwrap_or_else(|| vec![1]);
                let dl = if dl.len() == 1 { vec![dl[0]; sp] } else { dl };
                attrs.push(attr_ints("dilations", &dl));
                attrs.push(attr_i("ceil_mode", a.bool("ceil_mode", 5).unwrap_or(false) as i64));
                lw.emit("MaxPool", &[&x.name], attrs)
            } else {
                attrs.push(attr_i("ceil_mode", a.bool("ceil_mode", 4).unwrap_or(false) as i64));
                attrs.push(attr_i(
                    "count_include_pad",
                    a.bool("count_include_pad", 5).unwrap_or(true) as i64,
                ));
                if a.has("divisor_override", 6) {
                    return Err("avg_pool2d with divisor_override is not supported".into());
                }
                lw.emit("AveragePool", &[&x.name], attrs)
            }
        }
        "adaptive_avg_pool2d" | "_adaptive_avg_pool2d" | "adaptive_avg_pool1d" | "mean_global" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let osz = a.ints("output_size", 1).ok_or("no output_size")?;
            if osz.iter().all(|&o| o == 1) {
                lw.emit("GlobalAveragePool", &[&x.name], vec![])
            } else {
                let sp = x.rank() - 2;
                let mut ks = vec![];
                for i in 0..sp {
                    let SymDim::Int(n) = x.dims[2 + i] else {
                        return Err("adaptive pooling of a symbolic size".into());
                    };
                    let o = osz[i.min(osz.len() - 1)];
                    if o == 0 || n % o != 0 {
                        return Err(format!("adaptive average pooling {n} → {o} (not a divisor) is not supported"));
                    }
                    ks.push(n / o);
                }
                lw.emit(
                    "AveragePool",
                    &[&x.name],
                    vec![attr_ints("kernel_shape", &ks), attr_ints("strides", &ks)],
                )
            }
        }
        "upsample_nearest2d" | "upsample_bilinear2d" | "upsample_nearest1d" | "_upsample_nearest_exact2d" | "upsample_bicubic2d" => {
            let x = lw.cast(&t(lw, "input", 0)?, odt_v);
            let m = ometa.as_ref().ok_or("no output")?;
            let sizes = lw.shape_value(&m.sizes)?;
            let mode = if op.contains("bilinear") {
                "linear"
            } else if op.contains("bicubic") {
                "cubic"
            } else {
                "nearest"
            };
            let mut attrs = vec![attr_s("mode", mode)];
            if mode == "nearest" {
                attrs.push(attr_s("nearest_mode", if op.contains("exact") { "round_prefer_ceil" } else { "floor" }));
                attrs.push(attr_s(
                    "coordinate_transformation_mode",
                    if op.contains("exact") { "half_pixel" } else { "asymmetric" },
                ));
            } else {
                let ac = a.bool("align_corners", 2).unwrap_or(false);
                attrs.push(attr_s(
                    "coordinate_transformation_mode",
                    if ac { "align_corners" } else { "pytorch_half_pixel" },
                ));
                if mode == "cubic" {
                    attrs.push(attr_f("cubic_coeff_a", -0.75));
                }
            }
            lw.emit("Resize", &[&x.name, "", "", &sizes], attrs)
        }
        "sum" | "mean" | "amax" | "amin" | "prod" | "logsumexp" | "any" | "all" => {
            let x = t(lw, "self", 0)?;
            let r = x.rank();
            // `dim` is read by name wherever the overload has one: `amax.default`,
            // `amin.default` and `logsumexp.default` take a `dim` list (empty = all), while
            // `sum.default`/`mean.default`/`prod.default`/`any.default` have none.
            let _ = overload;
            let dims: Option<Vec<i64>> = a.ints("dim", 1);
            let keep = a.bool("keepdim", 2).unwrap_or(false);
            let axes: Vec<i64> = match dims {
                Some(d) if !d.is_empty() => d.iter().map(|&d| norm_axis(d, r)).collect(),
                _ => (0..r as i64).collect(),
            };
            let in_dt = match op {
                "any" | "all" => dt::BOOL,
                "mean" | "logsumexp" => odt_v,
                _ if a.dtype("dtype", 3).is_some() => odt_v,
                _ => {
                    if x.dt == dt::BOOL { odt_v } else { x.dt }
                }
            };
            let xc = lw.cast(&x, in_dt);
            let ax = lw.ints(&axes);
            let onnx = match op {
                "sum" => "ReduceSum",
                "mean" => "ReduceMean",
                "amax" => "ReduceMax",
                "amin" => "ReduceMin",
                "prod" => "ReduceProd",
                "logsumexp" => "ReduceLogSumExp",
                "any" => "ReduceMax",
                _ => "ReduceMin",
            };
            let xin = if matches!(op, "any" | "all") {
                lw.cast(&xc, dt::INT32).name
            } else {
                xc.name
            };
            let red = lw.emit(onnx, &[&xin, &ax], vec![attr_i("keepdims", keep as i64)]);
            if matches!(op, "any" | "all") {
                lw.emit("Cast", &[&red], vec![attr_i("to", dt::BOOL as i64)])
            } else if in_dt != odt_v {
                lw.emit("Cast", &[&red], vec![attr_i("to", odt_v as i64)])
            } else {
                red
            }
        }
        "var" | "std" | "var_mean" | "std_mean" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let r = x.rank();
            let dims = a.ints("dim", 1);
            let keep = a.bool("keepdim", 3).unwrap_or(false);
            let correction = a
                .scalar("correction", 2)
                .map(Scalar::f)
                .or_else(|| a.bool("unbiased", 1).map(|u| u as i64 as f64))
                .unwrap_or(1.0);
            let axes: Vec<i64> = match dims {
                Some(d) if !d.is_empty() => d.iter().map(|&d| norm_axis(d, r)).collect(),
                _ => (0..r as i64).collect(),
            };
            let mut count = 1i64;
            for &ax_i in &axes {
                match x.dims.get(ax_i as usize) {
                    Some(SymDim::Int(n)) => count *= n,
                    _ => return Err("var over a symbolic dim".into()),
                }
            }
            let ax = lw.ints(&axes);
            let mean = lw.emit("ReduceMean", &[&x.name, &ax], vec![attr_i("keepdims", 1)]);
            let d = lw.emit("Sub", &[&x.name, &mean], vec![]);
            let sq = lw.emit("Mul", &[&d, &d], vec![]);
            let s = lw.emit("ReduceSum", &[&sq, &ax], vec![attr_i("keepdims", keep as i64)]);
            let denom = lw.scalar((count as f64 - correction).max(0.0), odt_v);
            let var = lw.emit("Div", &[&s, &denom], vec![]);
            let res = if op.starts_with("std") { lw.emit("Sqrt", &[&var], vec![]) } else { var };
            if op.ends_with("_mean") {
                let m = if keep { mean } else { lw.emit("ReduceMean", &[&x.name, &ax], vec![attr_i("keepdims", 0)]) };
                set(lw, 1, m)?;
            }
            res
        }
        "linalg_vector_norm" | "norm" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let ord = a.float("ord", 1).or_else(|| a.float("p", 1)).unwrap_or(2.0);
            let r = x.rank();
            let dims = a.ints("dim", 2);
            let keep = a.bool("keepdim", 3).unwrap_or(false);
            let axes: Vec<i64> = match dims {
                Some(d) if !d.is_empty() => d.iter().map(|&d| norm_axis(d, r)).collect(),
                _ => (0..r as i64).collect(),
            };
            let ax = lw.ints(&axes);
            let onnx = match ord {
                2.0 => "ReduceL2",
                1.0 => "ReduceL1",
                o if o.is_infinite() && o > 0.0 => {
                    let ab = lw.emit("Abs", &[&x.name], vec![]);
                    let y = lw.emit("ReduceMax", &[&ab, &ax], vec![attr_i("keepdims", keep as i64)]);
                    return set(lw, 0, y);
                }
                o => return Err(format!("vector norm of order {o}")),
            };
            lw.emit(onnx, &[&x.name, &ax], vec![attr_i("keepdims", keep as i64)])
        }
        "max" | "min" if overload == "dim" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).ok_or("no dim")?, x.rank());
            let keep = a.bool("keepdim", 2).unwrap_or(false) as i64;
            let ax = lw.ints(&[axis]);
            let (red, arg) = if op == "max" { ("ReduceMax", "ArgMax") } else { ("ReduceMin", "ArgMin") };
            let v = lw.emit(red, &[&x.name, &ax], vec![attr_i("keepdims", keep)]);
            if outs.get(1).is_some_and(|o| o.is_some()) {
                let i = lw.emit(arg, &[&x.name], vec![attr_i("axis", axis), attr_i("keepdims", keep), attr_i("select_last_index", 0)]);
                set(lw, 1, i)?;
            }
            v
        }
        "max" | "min" if overload == "default" => {
            let x = t(lw, "self", 0)?;
            let ax = lw.ints(&(0..x.rank() as i64).collect::<Vec<_>>());
            lw.emit(if op == "max" { "ReduceMax" } else { "ReduceMin" }, &[&x.name, &ax], vec![attr_i("keepdims", 0)])
        }
        "max" | "min" => {
            // max.other / min.other: elementwise
            let x = operand(lw, "self", 0, odt_v)?;
            let yv = operand(lw, "other", 1, odt_v)?;
            lw.emit(if op == "max" { "Max" } else { "Min" }, &[&x, &yv], vec![])
        }
        "argmax" | "argmin" => {
            let x = t(lw, "self", 0)?;
            let keep = a.bool("keepdim", 2).unwrap_or(false) as i64;
            let onnx = if op == "argmax" { "ArgMax" } else { "ArgMin" };
            match a.int("dim", 1) {
                Some(d) => {
                    let axis = norm_axis(d, x.rank());
                    lw.emit(onnx, &[&x.name], vec![attr_i("axis", axis), attr_i("keepdims", keep)])
                }
                None => {
                    let flat = lw.ints(&[-1]);
                    let f = lw.emit("Reshape", &[&x.name, &flat], vec![]);
                    lw.emit(onnx, &[&f], vec![attr_i("axis", 0), attr_i("keepdims", keep)])
                }
            }
        }
        "cumsum" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let axis = norm_axis(a.int("dim", 1).ok_or("no dim")?, x.rank());
            let ax = lw.scalar(axis as f64, dt::INT64);
            lw.emit("CumSum", &[&x.name, &ax], vec![])
        }
        "topk" | "sort" => {
            let x = t(lw, "self", 0)?;
            let (k, dpos, lpos) = if op == "topk" { (a.int("k", 1), 2, 3) } else { (None, 1, 2) };
            let axis = norm_axis(a.int("dim", dpos).unwrap_or(-1), x.rank());
            let largest = if op == "topk" {
                a.bool("largest", lpos).unwrap_or(true)
            } else {
                a.bool("descending", lpos).unwrap_or(false)
            };
            let k = match k {
                Some(k) => k,
                None => match x.dims.get(axis as usize) {
                    Some(SymDim::Int(n)) => *n,
                    _ => return Err("sort over a symbolic dim".into()),
                },
            };
            let kv = lw.ints(&[k]);
            let o = lw.emit_n(
                "TopK",
                &[&x.name, &kv],
                2,
                vec![attr_i("axis", axis), attr_i("largest", largest as i64), attr_i("sorted", 1)],
            );
            set(lw, 1, o[1].clone())?;
            o[0].clone()
        }
        "view" | "_unsafe_view" | "reshape" | "view_copy" => {
            let x = t(lw, "self", 0)?;
            let m = ometa.as_ref().ok_or("no output")?;
            let shape = match lw.shape_value(&m.sizes) {
                Ok(s) => s,
                Err(_) => sym_list(lw, &a, "size", 1)?,
            };
            lw.emit("Reshape", &[&x.name, &shape], vec![])
        }
        "flatten" => {
            let x = t(lw, "self", 0)?;
            let m = ometa.as_ref().ok_or("no output")?;
            let shape = lw.shape_value(&m.sizes)?;
            lw.emit("Reshape", &[&x.name, &shape], vec![])
        }
        "unflatten" => {
            let x = t(lw, "self", 0)?;
            let m = ometa.as_ref().ok_or("no output")?;
            let shape = lw.shape_value(&m.sizes)?;
            lw.emit("Reshape", &[&x.name, &shape], vec![])
        }
        "permute" => {
            let x = t(lw, "self", 0)?;
            let d = a.ints("dims", 1).ok_or("permute without dims")?;
            let perm: Vec<i64> = d.iter().map(|&v| norm_axis(v, x.rank())).collect();
            lw.emit("Transpose", &[&x.name], vec![attr_ints("perm", &perm)])
        }
        "transpose" | "t" | "numpy_T" => {
            let x = t(lw, "self", 0)?;
            let r = x.rank();
            if r < 2 {
                lw.emit("Identity", &[&x.name], vec![])
            } else {
                let (d0, d1) = if op == "transpose" {
                    (norm_axis(a.int("dim0", 1).ok_or("no dim0")?, r), norm_axis(a.int("dim1", 2).ok_or("no dim1")?, r))
                } else {
                    (r as i64 - 2, r as i64 - 1)
                };
                let mut perm: Vec<i64> = (0..r as i64).collect();
                perm.swap(d0 as usize, d1 as usize);
                lw.emit("Transpose", &[&x.name], vec![attr_ints("perm", &perm)])
            }
        }
        "expand" | "expand_as" | "broadcast_to" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            let m = ometa.as_ref().ok_or("no output")?;
            let shape = lw.shape_value(&m.sizes)?;
            lw.emit("Expand", &[&x.name, &shape], vec![])
        }
        "unsqueeze" => {
            let x = t(lw, "self", 0)?;
            let d = a.int("dim", 1).ok_or("no dim")?;
            let d = if d < 0 { d + x.rank() as i64 + 1 } else { d };
            let ax = lw.ints(&[d]);
            lw.emit("Unsqueeze", &[&x.name, &ax], vec![])
        }
        "squeeze" => {
            let x = t(lw, "self", 0)?;
            let m = ometa.as_ref().ok_or("no output")?;
            let shape = lw.shape_value(&m.sizes)?;
            lw.emit("Reshape", &[&x.name, &shape], vec![])
        }
        "clone" | "contiguous" | "alias" | "detach" | "lift_fresh_copy" | "dropout" | "feature_dropout" | "alpha_dropout" | "native_dropout" | "_to_copy" | "to" | "type_as" | "_to_dim_order_copy" | "copy" => {
            if op == "copy" {
                let src = t(lw, "src", 1)?;
                let y = lw.cast(&src, odt_v).name;
                let m = ometa.as_ref().ok_or("no output")?;
                let shape = lw.shape_value(&m.sizes)?;
                lw.emit("Expand", &[&y, &shape], vec![])
            } else {
            if matches!(op, "dropout" | "native_dropout" | "feature_dropout" | "alpha_dropout")
                && a.bool("train", 2).unwrap_or(false)
            {
                return Err("dropout in training mode: call model.eval() before torch.export".into());
            }
            let x = t(lw, if op == "type_as" || a.has("self", 0) { "self" } else { "input" }, 0)?;
            let y = lw.cast(&x, odt_v);
            let y = if y.name == x.name {
                lw.emit("Identity", &[&x.name], vec![])
            } else {
                y.name
            };
            if op == "native_dropout" && outs.get(1).is_some_and(|o| o.is_some()) {
                let m = ometa.as_ref().ok_or("no output")?;
                let shape = lw.shape_value(&m.sizes)?;
                let mask = lw.emit(
                    "ConstantOfShape",
                    &[&shape],
                    vec![AttributeProto {
                        name: "value".into(),
                        r#type: attr_type::TENSOR,
                        t: Some(TensorProto { dims: vec![1], data_type: dt::BOOL, raw_data: vec![1], ..Default::default() }),
                        ..Default::default()
                    }],
                );
                set(lw, 1, mask)?;
            }
            y
            }
        }
        "diff" => {
            let x = lw.cast(&t(lw, "self", 0)?, odt_v);
            if a.int("n", 1).unwrap_or(1) != 1 {
                return Err("diff with n != 1 is not supported".into());
            }
            let axis = norm_axis(a.int("dim", 2).unwrap_or(-1), x.rank());
            let mut parts = vec![];
            if let Some(pv) = opt_t(lw, "prepend", 3)? {
                parts.push(lw.cast(&pv, odt_v).name);
            }
            parts.push(x.name.clone());
            if let Some(av) = opt_t(lw, "append", 4)? {
                parts.push(lw.cast(&av, odt_v).name);
            }
            let x = if parts.len() > 1 {
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let c = lw.emit("Concat", &refs, vec![attr_i("axis", axis)]);
                V { name: c, ..x }
            } else {
                x
            };
            let ax = lw.ints(&[axis]);
            let one = lw.ints(&[1]);
            let zero = lw.ints(&[0]);
            let end = lw.ints(&[i64::MAX]);
            let m1 = lw.ints(&[-1]);
            let hi = lw.emit("Slice", &[&x.name, &one, &end, &ax], vec![]);
            let lo = lw.emit("Slice", &[&x.name, &zero, &m1, &ax], vec![]);
            if x.dt == dt::BOOL {
                lw.emit("Xor", &[&hi, &lo], vec![])
            } else {
                lw.emit("Sub", &[&hi, &lo], vec![])
            }
        }
        "fill" | "zero" => {
            let m = ometa.as_ref().ok_or("no output")?;
            let value = if op == "zero" { 0.0 } else { a.float("value", 1).ok_or("fill with a tensor value is not supported")? };
            let shape = lw.shape_value(&m.sizes)?;
            let one = TensorProto {
                dims: vec![1],
                data_type: odt_v,
                raw_data: scalar_bytes(value, odt_v),
                ..Default::default()
            };
            lw.emit(
                "ConstantOfShape",
                &[&shape],
                vec![AttributeProto { name: "value".into(), r#type: attr_type::TENSOR, t: Some(one), ..Default::default() }],
            )
        }
        "cat" | "concat" | "concatenate" | "stack" => {
            let ts = a.tensors("tensors", 0).ok_or("no tensors")?;
            let mut names = vec![];
            let mut rank = 0;
            for tn in ts {
                let tn = tn.ok_or("a None tensor")?;
                let v = lw.vals.get(&tn).cloned().ok_or_else(|| format!("\"{tn}\" is not computed"))?;
                rank = rank.max(v.rank());
                names.push(v);
            }
            let d = a.int("dim", 1).unwrap_or(0);
            if op == "stack" {
                let axis = if d < 0 { d + rank as i64 + 1 } else { d };
                let ax = lw.ints(&[axis]);
                let mut us = vec![];
                for v in &names {
                    let c = lw.cast(v, odt_v);
                    us.push(lw.emit("Unsqueeze", &[&c.name, &ax], vec![]));
                }
                let refs: Vec<&str> = us.iter().map(String::as_str).collect();
                lw.emit("Concat", &refs, vec![attr_i("axis", axis)])
            } else {
                // torch.cat skips 1-D empty tensors (legacy behaviour).
                let mut cs = vec![];
                for v in &names {
                    if v.rank() == 1 && v.dims[0] == SymDim::Int(0) && rank > 1 {
                        continue;
                    }
                    cs.push(lw.cast(v, odt_v).name);
                }
                let axis = norm_axis(d, rank);
                let refs: Vec<&str> = cs.iter().map(String::as_str).collect();
                lw.emit("Concat", &refs, vec![attr_i("axis", axis)])
            }
        }
        "split" | "split_with_sizes" | "chunk" | "unbind" | "tensor_split" => {
            let x = t(lw, "self", 0)?;
            let dpos = if op == "unbind" { 1 } else { 2 };
            let axis = norm_axis(a.int("dim", dpos).unwrap_or(0), x.rank());
            let k = outs.len();
            // Each output's size along the axis, from the output metas.
            let mut sizes = vec![];
            for o in &outs {
                let Some(o) = o else { return Err("a split output without a name".into()) };
                let m = lw.meta(o)?;
                let s = if op == "unbind" {
                    1
                } else {
                    match m.sizes.get(axis as usize) {
                        Some(SymDim::Int(s)) => *s,
                        _ => return Err("split along a symbolic dim".into()),
                    }
                };
                sizes.push(s);
            }
            let sv = lw.ints(&sizes);
            let parts = lw.emit_n("Split", &[&x.name, &sv], k, vec![attr_i("axis", axis)]);
            for (i, pn) in parts.into_iter().enumerate() {
                let pn = if op == "unbind" {
                    let ax = lw.ints(&[axis]);
                    lw.emit("Squeeze", &[&pn, &ax], vec![])
                } else {
                    pn
                };
                set(lw, i, pn)?;
            }
            return Ok(());
        }
        "slice" | "narrow" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).unwrap_or(0), x.rank());
            let (start, end, step) = if op == "narrow" {
                let s = a.int("start", 2).ok_or("no start")?;
                let l = a.int("length", 3).ok_or("no length")?;
                (s, s + l, 1)
            } else {
                (
                    a.int("start", 2).unwrap_or(0),
                    a.int("end", 3).unwrap_or(i64::MAX),
                    a.int("step", 4).unwrap_or(1),
                )
            };
            if a.has("start", 2) && a.int("start", 2).is_none() || a.has("end", 3) && a.int("end", 3).is_none() {
                return Err("slice bounds given as symbolic values are not supported yet".into());
            }
            let s = lw.ints(&[start]);
            let e = lw.ints(&[end]);
            let ax = lw.ints(&[axis]);
            let st = lw.ints(&[step]);
            lw.emit("Slice", &[&x.name, &s, &e, &ax, &st], vec![])
        }
        "select" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).ok_or("no dim")?, x.rank());
            let i = a.int("index", 2).ok_or("select with a symbolic index is not supported")?;
            let iv = lw.scalar(i as f64, dt::INT64);
            lw.emit("Gather", &[&x.name, &iv], vec![attr_i("axis", axis)])
        }
        "index_select" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).ok_or("no dim")?, x.rank());
            let idx = t(lw, "index", 2)?;
            lw.emit("Gather", &[&x.name, &idx.name], vec![attr_i("axis", axis)])
        }
        "index" => {
            let x = t(lw, "self", 0)?;
            let idx = a.tensors("indices", 1).ok_or("index without indices")?;
            let given: Vec<(usize, String)> = idx
                .iter()
                .enumerate()
                .filter_map(|(i, t)| t.clone().map(|t| (i, t)))
                .collect();
            let mut ivs = vec![];
            for (_, tn) in &given {
                let iv = lw.vals.get(tn).cloned().ok_or_else(|| format!("\"{tn}\" is not computed"))?;
                if iv.dt == dt::BOOL {
                    return Err("boolean-mask indexing (a data-dependent output shape) is not supported".into());
                }
                ivs.push(iv);
            }
            if given.len() == 1 {
                let axis = given[0].0;
                lw.emit("Gather", &[&x.name, &ivs[0].name], vec![attr_i("axis", axis as i64)])
            } else {
                // NumPy advanced indexing: the index tensors broadcast to B; the indexed dims
                // are moved to the front and gathered with GatherND (B + other dims); when
                // the indexed dims were adjacent, B goes back to the first one's place.
                let r = x.rank();
                let axes: Vec<usize> = given.iter().map(|(i, _)| *i).collect();
                let mut bshape: Vec<SymDim> = vec![];
                for iv in &ivs {
                    let (long, short) = if iv.dims.len() > bshape.len() { (iv.dims.clone(), bshape.clone()) } else { (bshape.clone(), iv.dims.clone()) };
                    let off = long.len() - short.len();
                    let mut out = long.clone();
                    for (k, d) in short.iter().enumerate() {
                        if out[off + k] == SymDim::Int(1) {
                            out[off + k] = d.clone();
                        }
                    }
                    bshape = out;
                }
                let bv = lw.shape_value(&bshape)?;
                let lastax = lw.ints(&[-1]);
                let mut cols = vec![];
                for iv in &ivs {
                    let c = lw.cast(iv, dt::INT64);
                    let e = lw.emit("Expand", &[&c.name, &bv], vec![]);
                    cols.push(lw.emit("Unsqueeze", &[&e, &lastax], vec![]));
                }
                let refs: Vec<&str> = cols.iter().map(String::as_str).collect();
                let idx = lw.emit("Concat", &refs, vec![attr_i("axis", -1)]);
                let others: Vec<usize> = (0..r).filter(|d| !axes.contains(d)).collect();
                let mut perm: Vec<i64> = axes.iter().map(|&d| d as i64).collect();
                perm.extend(others.iter().map(|&d| d as i64));
                let moved = if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
                    x.name.clone()
                } else {
                    lw.emit("Transpose", &[&x.name], vec![attr_ints("perm", &perm)])
                };
                let g = lw.emit("GatherND", &[&moved, &idx], vec![]);
                let adjacent = axes.windows(2).all(|w| w[1] == w[0] + 1);
                let first = axes[0];
                if adjacent && first > 0 {
                    // g: B (nb dims) + others; put others[..first] before B.
                    let nb = bshape.len();
                    let no = others.len();
                    let mut p2: Vec<i64> = (nb..nb + first).map(|d| d as i64).collect();
                    p2.extend((0..nb).map(|d| d as i64));
                    p2.extend((nb + first..nb + no).map(|d| d as i64));
                    lw.emit("Transpose", &[&g], vec![attr_ints("perm", &p2)])
                } else {
                    g
                }
            }
        }
        "gather" => {
            let x = t(lw, "self", 0)?;
            let axis = norm_axis(a.int("dim", 1).ok_or("no dim")?, x.rank());
            let idx = t(lw, "index", 2)?;
            lw.emit("GatherElements", &[&x.name, &idx.name], vec![attr_i("axis", axis)])
        }
        "repeat" => {
            let x = t(lw, "self", 0)?;
            let reps = a.ints("repeats", 1).ok_or("repeat without repeats")?;
            let mut xin = x.name.clone();
            if reps.len() > x.rank() {
                let mut shape: Vec<i64> = vec![1; reps.len() - x.rank()];
                for d in &x.dims {
                    match d {
                        SymDim::Int(v) => shape.push(*v),
                        _ => return Err("repeat of a symbolic shape".into()),
                    }
                }
                let s = lw.ints(&shape);
                xin = lw.emit("Reshape", &[&xin, &s], vec![]);
            }
            let r = lw.ints(&reps);
            lw.emit("Tile", &[&xin, &r], vec![])
        }
        "tril" | "triu" => {
            let x = t(lw, "self", 0)?;
            let k = a.int("diagonal", 1).unwrap_or(0);
            let kv = lw.scalar(k as f64, dt::INT64);
            lw.emit("Trilu", &[&x.name, &kv], vec![attr_i("upper", (op == "triu") as i64)])
        }
        "constant_pad_nd" | "pad" => {
            let x = lw.cast(&t(lw, if a.has("self", 0) { "self" } else { "input" }, 0)?, odt_v);
            let pad = a.ints("pad", 1).ok_or("pad without pad")?;
            let mode = a.string("mode", 2).unwrap_or_else(|| "constant".into());
            let value = a.float("value", if op == "pad" { 3 } else { 2 }).unwrap_or(0.0);
            let r = x.rank();
            // torch: (last_begin, last_end, prev_begin, prev_end, ...) → ONNX begins..., ends...
            let mut begins = vec![0i64; r];
            let mut ends = vec![0i64; r];
            for (i, pair) in pad.chunks(2).enumerate() {
                let d = r - 1 - i;
                begins[d] = pair[0];
                ends[d] = *pair.get(1).unwrap_or(&0);
            }
            begins.extend_from_slice(&ends);
            let pv = lw.ints(&begins);
            let onnx_mode = match mode.as_str() {
                "constant" => "constant",
                "reflect" => "reflect",
                "replicate" => "edge",
                "circular" => "wrap",
                m => return Err(format!("pad mode {m}")),
            };
            let cv = lw.scalar(value, odt_v);
            lw.emit("Pad", &[&x.name, &pv, &cv], vec![attr_s("mode", onnx_mode)])
        }
        "flip" => {
            let x = t(lw, "self", 0)?;
            let dims = a.ints("dims", 1).ok_or("flip without dims")?;
            let axes: Vec<i64> = dims.iter().map(|&d| norm_axis(d, x.rank())).collect();
            let n = axes.len();
            let s = lw.ints(&vec![-1; n]);
            let e = lw.ints(&vec![i64::MIN; n]);
            let ax = lw.ints(&axes);
            let st = lw.ints(&vec![-1; n]);
            lw.emit("Slice", &[&x.name, &s, &e, &ax, &st], vec![])
        }
        "full" | "zeros" | "ones" | "empty" | "new_zeros" | "new_ones" | "new_full" | "new_empty"
        | "full_like" | "zeros_like" | "ones_like" | "empty_like" | "scalar_tensor" | "empty_strided" => {
            let m = ometa.as_ref().ok_or("no output")?;
            let value = match op {
                "ones" | "new_ones" | "ones_like" => 1.0,
                "full" => a.float("fill_value", 1).ok_or("full without fill_value")?,
                "new_full" => a.float("fill_value", 2).ok_or("new_full without fill_value")?,
                "full_like" => a.float("fill_value", 1).ok_or("full_like without fill_value")?,
                "scalar_tensor" => a.float("s", 0).ok_or("scalar_tensor without s")?,
                _ => 0.0,
            };
            let shape = lw.shape_value(&m.sizes)?;
            let one = TensorProto {
                dims: vec![1],
                data_type: odt_v,
                raw_data: scalar_bytes(value, odt_v),
                ..Default::default()
            };
            lw.emit(
                "ConstantOfShape",
                &[&shape],
                vec![AttributeProto { name: "value".into(), r#type: attr_type::TENSOR, t: Some(one), ..Default::default() }],
            )
        }
        "arange" => {
            let (start, end, step) = match overload {
                "default" => (Scalar::I(0), a.scalar("end", 0).ok_or("arange without end")?, Scalar::I(1)),
                "start" => (a.scalar("start", 0).ok_or("no start")?, a.scalar("end", 1).ok_or("no end")?, Scalar::I(1)),
                _ => (
                    a.scalar("start", 0).ok_or("no start")?,
                    a.scalar("end", 1).ok_or("arange with a symbolic end is not supported yet")?,
                    a.scalar("step", 2).unwrap_or(Scalar::I(1)),
                ),
            };
            let s = lw.scalar(start.f(), odt_v);
            let e = lw.scalar(end.f(), odt_v);
            let st = lw.scalar(step.f(), odt_v);
            lw.emit("Range", &[&s, &e, &st], vec![])
        }
        "sym_size" | "sym_numel" | "sym_stride" => unreachable!("handled as sym-int producers"),
        _ => {
            return Err(format!(
                "unsupported ATen op {full}: RLX lowers most of the Core ATen opset and the common ops torch.export keeps (linear, conv2d, layer_norm, scaled_dot_product_attention, ...), but not this one; if it is not a Core ATen op (torch.Tag.core not in the op overload's tags), ep.run_decompositions() before torch.export.save rewrites it into ops that may be lowered; a Core ATen op needs a lowering in rlx-torch-import (please report it)"
            ))
        }
    };
    let _ = orank;
    set(lw, 0, y)?;
    if inplace {
        if let (Some(o), Some(selfname)) = (&out0, a.tensor_name("self", 0)) {
            if let Some(v) = lw.vals.get(o).cloned() {
                lw.vals.insert(selfname, v);
            }
        }
    }
    Ok(())
}

/// A `size` argument as a 1-D int64 value: ints, sym-int names, `-1`.
fn sym_list(lw: &mut Lower, a: &Args, name: &str, pos: usize) -> R<String> {
    let v = a.get(name, pos).ok_or_else(|| format!("no {name}"))?;
    let items = v
        .get("as_sym_ints")
        .or_else(|| v.get("as_ints"))
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{name} is not a list of sizes"))?;
    let mut parts = vec![];
    for it in items {
        if let Some(i) = it
            .as_i64()
            .or_else(|| it.get("as_int").and_then(Value::as_i64))
        {
            parts.push(lw.ints(&[i]));
        } else if let Some(n) = it.get("as_name").and_then(Value::as_str) {
            let s = lw
                .syms
                .get(n)
                .cloned()
                .ok_or_else(|| format!("size {n} is not computed before this node"))?;
            parts.push(s);
        } else {
            return Err(format!("unreadable size {it}"));
        }
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    Ok(lw.emit("Concat", &refs, vec![attr_i("axis", 0)]))
}

/// A sym-int producing node (`aten.sym_size.int`, `operator.mul`, ...): its value as a 1-D
/// int64 ONNX value of one element.
fn lower_sym(lw: &mut Lower, n: &FxNode, a: &Args) -> R<String> {
    let target = n.target.as_str();
    if target.starts_with("aten.sym_size") {
        let tn = a.tensor_name("self", 0).ok_or("sym_size of a non-tensor")?;
        let x = lw
            .vals
            .get(&tn)
            .cloned()
            .ok_or_else(|| format!("\"{tn}\" is not computed"))?;
        let d = norm_axis(a.int("dim", 1).ok_or("sym_size without dim")?, x.rank());
        return Ok(lw.emit(
            "Shape",
            &[&x.name],
            vec![attr_i("start", d), attr_i("end", d + 1)],
        ));
    }
    if target.starts_with("aten.sym_numel") {
        let tn = a
            .tensor_name("self", 0)
            .ok_or("sym_numel of a non-tensor")?;
        let x = lw
            .vals
            .get(&tn)
            .cloned()
            .ok_or_else(|| format!("\"{tn}\" is not computed"))?;
        return Ok(lw.emit("Size", &[&x.name], vec![]));
    }
    let op = target.rsplit('.').next().unwrap_or(target);
    let operand = |lw: &mut Lower, i: usize| -> R<String> {
        let v = n.inputs.get(i).map(|(_, v)| v).ok_or("missing operand")?;
        if let Some(k) = v.get("as_int").and_then(Value::as_i64) {
            return Ok(lw.ints(&[k]));
        }
        let nm = v
            .get("as_sym_int")
            .and_then(|s| s.get("as_name"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("unreadable operand {v}"))?;
        lw.syms
            .get(nm)
            .cloned()
            .ok_or_else(|| format!("size {nm} is not computed before this node"))
    };
    let x = operand(lw, 0)?;
    let y = operand(lw, 1)?;
    Ok(match op {
        "mul" => lw.emit("Mul", &[&x, &y], vec![]),
        "add" => lw.emit("Add", &[&x, &y], vec![]),
        "sub" => lw.emit("Sub", &[&x, &y], vec![]),
        "floordiv" => lw.emit("Div", &[&x, &y], vec![]),
        "mod" => lw.emit("Mod", &[&x, &y], vec![]),
        o => return Err(format!("symbolic-size arithmetic {o} is not supported")),
    })
}
