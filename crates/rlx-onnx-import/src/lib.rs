//! ONNX importer: an `.onnx` file (protobuf `ModelProto`) → an RLX [`Graph`] whose every
//! node carries the ONNX node's name (or, when unnamed, its first output name) and op type
//! as its [`Origin`], so NaN/Inf reports speak the model's own language.
//!
//! * [`import_onnx`] / [`import_onnx_bytes`]: the whole model;
//! * [`read_tensor_proto`]: one `TensorProto` (ONNX test data `input_0.pb`, `output_0.pb`);
//! * [`supported_ops`]: the op types the importer lowers.
//!
//! Graph inputs get static shapes (symbolic dims bound by [`ImportOptions`]); the declared
//! signature is kept in `Graph::input_decls`. Initializers become `Constant` nodes labelled
//! with their name. Each ONNX op is lowered by a small translator (`src/ops/`, one file per op
//! family); nodes whose inputs are all constants are folded at import time, which makes
//! `Shape → Gather → Concat → Reshape` chains static.

mod ctx;
pub mod cut;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod ops;
pub mod params;
pub mod proto;
pub mod sym;
pub mod tensor;

pub use error::ImportError;
pub use ops::supported_ops;

use ctx::{Ctx, ONode};
use prost::Message;
use proto::{DimValue, ModelProto};
use rlx_ir::{Dim, Graph, NodeId, Op, Origin, Shape, Tensor};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// How to bind symbolic dims of graph inputs.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Sizes for named symbolic dims (ONNX `dim_param`), e.g. `batch = 2`.
    pub dims: HashMap<String, usize>,
    /// Size for symbolic dims not in `dims`, and for dims with neither value nor name.
    pub default_dim: usize,
    /// Exact shapes of named graph inputs (e.g. taken from the input files). Symbolic dims
    /// are bound from them; a static dim that disagrees is an error naming the input.
    pub input_shapes: HashMap<String, Vec<usize>>,
    /// Graph inputs to freeze as constants (their values known at import time), so that
    /// shape-defining inputs (a Reshape's `shape`, a Slice's `starts`) fold. The tensor's
    /// dtype must match the declared one.
    pub constant_inputs: HashMap<String, rlx_ir::Tensor>,
    /// Graph inputs of sequence or optional type, with their layout for this run: RLX takes
    /// them as tensor inputs (see [`ValueInput`]; an element named in `constant_inputs`,
    /// `s[0]` or `o`, is frozen instead). Such an input not listed is an error.
    pub value_inputs: HashMap<String, ValueInput>,
}

/// The layout of a graph input of sequence or optional type. RLX has no sequence values at
/// run time: a sequence `s` of `k` tensors becomes the graph inputs `s[0]`, ..., `s[k-1]`
/// (an empty one none), an optional tensor `o` the input `o` (an empty optional none).
#[derive(Debug, Clone, PartialEq)]
pub enum ValueInput {
    /// A sequence of tensors with these shapes and dtypes.
    Sequence(Vec<(Vec<usize>, rlx_ir::DType)>),
    /// An optional holding a tensor of this shape and dtype.
    OptionalTensor(Vec<usize>, rlx_ir::DType),
    /// An optional holding a sequence.
    OptionalSequence(Vec<(Vec<usize>, rlx_ir::DType)>),
    /// An empty optional.
    OptionalNone,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dims: HashMap::new(),
            default_dim: 1,
            input_shapes: HashMap::new(),
            constant_inputs: HashMap::new(),
            value_inputs: HashMap::new(),
        }
    }
}

/// An ONNX model file, decoded once: its declared inputs can be read before importing it
/// (so a caller can bind symbolic dims from its input files), then [`OnnxModel::import`]
/// lowers it with those options.
pub struct OnnxModel {
    model: ModelProto,
    file: String,
    base: Option<std::path::PathBuf>,
    /// The top-level initializers as decoded by the first import: later imports (a dynamic
    /// model's plan per size signature) share these tensors instead of decoding copies.
    inits: std::sync::Mutex<HashMap<String, std::sync::Arc<rlx_ir::Tensor>>>,
}

impl OnnxModel {
    /// Read and decode the model at `path` (a regular file; a FIFO or `/dev/zero` would be
    /// read forever). External data files are resolved relative to its folder.
    pub fn open(path: &Path) -> Result<OnnxModel, ImportError> {
        let io = |source| ImportError::Io {
            file: path.display().to_string(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        OnnxModel::decode(&bytes, &path.display().to_string(), Some(base))
    }

    fn decode(
        bytes: &[u8],
        file: &str,
        base: Option<std::path::PathBuf>,
    ) -> Result<OnnxModel, ImportError> {
        let model = ModelProto::decode(bytes).map_err(|e| ImportError::Decode {
            file: file.to_string(),
            msg: e.to_string(),
        })?;
        Ok(OnnxModel {
            model,
            file: file.to_string(),
            base,
            inits: Default::default(),
        })
    }

    /// Decode a serialized `ModelProto` held in memory (e.g. the `source.onnx` entry of a
    /// dynamic package); `file` names it in errors. External data is not allowed (its
    /// tensors would have no folder to be read from).
    ///
    /// Errors: [`ImportError::Decode`] naming `file` for bytes that are not a `ModelProto`.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<OnnxModel, ImportError> {
        OnnxModel::decode(bytes, file, None)
    }

    /// True when an initializer keeps its data in an external file.
    pub fn has_external_data(&self) -> bool {
        self.model.graph.as_ref().is_some_and(|g| {
            g.initializer
                .iter()
                .any(|t| t.data_location == proto::DATA_LOCATION_EXTERNAL)
        })
    }

    /// A model built in memory (e.g. by another front end that lowers its ops onto ONNX
    /// nodes); `file` names it in errors. External data is not allowed.
    pub fn from_proto(model: ModelProto, file: &str) -> OnnxModel {
        OnnxModel {
            model,
            file: file.to_string(),
            base: None,
            inits: Default::default(),
        }
    }

    /// The graph inputs that are not initializers, in order.
    fn fed_inputs(&self) -> Vec<&proto::ValueInfoProto> {
        let Some(graph) = self.model.graph.as_ref() else {
            return vec![];
        };
        let inits: std::collections::HashSet<&str> =
            graph.initializer.iter().map(|t| t.name.as_str()).collect();
        graph
            .input
            .iter()
            .filter(|vi| !inits.contains(vi.name.as_str()))
            .collect()
    }

    /// Names of the graph inputs that are not initializers, in order: every input a caller
    /// may feed, including those [`OnnxModel::declared_inputs`] leaves out (no shape, or
    /// not a tensor).
    pub fn input_names(&self) -> Vec<String> {
        self.fed_inputs().iter().map(|vi| vi.name.clone()).collect()
    }

    /// Names and declared types (symbolic dims kept) of the graph outputs, in order; outputs
    /// declared without a tensor type or shape are left out.
    pub fn declared_outputs(&self) -> Vec<(String, rlx_ir::Shape)> {
        self.model
            .graph
            .as_ref()
            .map(|g| {
                g.output
                    .iter()
                    .filter_map(|vi| {
                        input_shape(vi, &ImportOptions::default())
                            .ok()
                            .map(|(d, _)| (vi.name.clone(), d))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Names of the graph outputs, in order.
    pub fn output_names(&self) -> Vec<String> {
        self.model
            .graph
            .as_ref()
            .map(|g| g.output.iter().map(|o| o.name.clone()).collect())
            .unwrap_or_default()
    }

    /// Names and declared types (symbolic dims kept) of the graph inputs that are not
    /// initializers, in order. Inputs without a shape or not tensors are left out.
    pub fn declared_inputs(&self) -> Vec<(String, rlx_ir::Shape)> {
        self.fed_inputs()
            .into_iter()
            .filter_map(|vi| {
                input_shape(vi, &ImportOptions::default())
                    .ok()
                    .map(|(d, _)| (vi.name.clone(), d))
            })
            .collect()
    }

    /// Graph inputs that only fix sizes, axes or attributes ([`params::PARAMETER_INPUTS`]):
    /// every top-level node that reads one reads it at a parameter position (a Reshape's
    /// `shape`, a TopK's `K`, a Reduce's `axes`). A runtime that is given their values may
    /// import with them frozen as constants ([`ImportOptions::constant_inputs`]) and still
    /// run the op itself; in input order.
    pub fn parameter_inputs(&self) -> Vec<String> {
        let Some(graph) = self.model.graph.as_ref() else {
            return vec![];
        };
        self.input_names()
            .into_iter()
            .filter(|name| {
                let mut read = false;
                for n in &graph.node {
                    for (k, i) in n.input.iter().enumerate() {
                        if i == name {
                            read = true;
                            if !params::is_parameter_input(&n.op_type, k) {
                                return false;
                            }
                        }
                    }
                }
                read
            })
            .collect()
    }

    /// Lower the model once with its named input dims kept as symbols (see [`sym`]): the
    /// graph at the sizes `opts` binds (the probe) and what to re-evaluate for others.
    ///
    /// Errors: every error [`OnnxModel::import`] gives, and [`ImportError::Model`] saying
    /// why the model cannot be imported symbolically (the first op or translator that reads
    /// a symbolic size as a number, or has no symbolic shape rule yet): import it per size
    /// signature then.
    pub fn import_symbolic(&self, opts: &ImportOptions) -> Result<sym::SymbolicGraph, ImportError> {
        if !opts.constant_inputs.is_empty() || !opts.value_inputs.is_empty() {
            return Err(ImportError::Model(
                "a symbolic import takes no frozen or sequence inputs".into(),
            ));
        }
        let (g, state, remap) = import_model_as(
            &self.model,
            &self.file,
            self.base.as_deref(),
            opts,
            Some(&self.inits),
            true,
        )?;
        let state = state.expect("symbolic import keeps its state");
        if let Some(why) = state.tainted.borrow_mut().take() {
            return Err(ImportError::Model(format!(
                "{}: not symbolic: {why}",
                self.file
            )));
        }
        Ok(sym::SymbolicGraph::new(g, state, &remap))
    }

    /// Lower the model into a [`Graph`] (see [`import_onnx`]).
    pub fn import(&self, opts: &ImportOptions) -> Result<Graph, ImportError> {
        import_model(
            &self.model,
            &self.file,
            self.base.as_deref(),
            opts,
            Some(&self.inits),
        )
    }
}

/// Import the ONNX model at `path`. External data files are resolved relative to the
/// model's folder and must stay inside it.
///
/// Errors: unreadable file, malformed protobuf (naming the file), unsupported op (naming op
/// type, domain, opset and node), and any lowering problem (naming the node).
pub fn import_onnx(path: &Path, opts: &ImportOptions) -> Result<Graph, ImportError> {
    OnnxModel::open(path)?.import(opts)
}

/// Import a model from its serialized bytes. `base_dir` is the folder external data paths
/// are relative to (`None`: a model with external data is an error).
pub fn import_onnx_bytes(
    bytes: &[u8],
    base_dir: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Graph, ImportError> {
    OnnxModel::decode(bytes, "<model bytes>", base_dir.map(Path::to_path_buf))?.import(opts)
}

/// Decode one serialized `TensorProto` (e.g. ONNX test data `input_0.pb`) into its name and
/// tensor. External data is not allowed here.
pub fn read_tensor_proto(bytes: &[u8]) -> Result<(String, Tensor), ImportError> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| ImportError::Decode {
        file: "<tensor bytes>".into(),
        msg: e.to_string(),
    })?;
    let tensor = tensor::tensor_from_proto(&t, None).map_err(|msg| ImportError::Tensor {
        name: t.name.clone(),
        msg,
    })?;
    Ok((t.name, tensor))
}

/// Decode a serialized `SequenceProto` (`optional = false`) or `OptionalProto` (`true`),
/// as ONNX test data holds sequence / optional values, into its tensors in order, nested
/// sequences and optionals flattened (an empty optional gives none): the order in which the
/// importer exposes such a graph output as tensor outputs (`name[i]`).
pub fn read_value_proto(bytes: &[u8], optional: bool) -> Result<Vec<Tensor>, ImportError> {
    Ok(read_value_input(bytes, optional)?.1)
}

/// [`read_value_proto`], with the value's layout as a graph input ([`ValueInput`]); nested
/// sequences and optionals inside a sequence are an error here.
pub fn read_value_input(
    bytes: &[u8],
    optional: bool,
) -> Result<(ValueInput, Vec<Tensor>), ImportError> {
    let dec = |e: prost::DecodeError| ImportError::Decode {
        file: "<value bytes>".into(),
        msg: e.to_string(),
    };
    let mut out = vec![];
    let layout = |ts: &[Tensor]| -> Vec<(Vec<usize>, rlx_ir::DType)> {
        ts.iter().map(|t| (t.dims().to_vec(), t.dtype())).collect()
    };
    let flat_seq =
        |s: &proto::SequenceProto| s.sequence_values.is_empty() && s.optional_values.is_empty();
    if optional {
        let o = proto::OptionalProto::decode(bytes).map_err(dec)?;
        flatten_opt(&o, &mut out)?;
        let v = match (&o.tensor_value, &o.sequence_value) {
            (Some(t), None) if o.optional_value.is_none() => ValueInput::OptionalTensor(
                t.dims.iter().map(|&d| d.max(0) as usize).collect(),
                out[0].dtype(),
            ),
            (None, Some(s)) if o.optional_value.is_none() && flat_seq(s) => {
                ValueInput::OptionalSequence(layout(&out))
            }
            (None, None) if o.optional_value.is_none() => ValueInput::OptionalNone,
            _ => {
                return Err(ImportError::Tensor {
                    name: o.name.clone(),
                    msg: "nested optional values are not supported".into(),
                })
            }
        };
        Ok((v, out))
    } else {
        let s = proto::SequenceProto::decode(bytes).map_err(dec)?;
        if !flat_seq(&s) {
            return Err(ImportError::Tensor {
                name: s.name.clone(),
                msg: "sequences of sequences / optionals are not supported".into(),
            });
        }
        flatten_seq(&s, &mut out)?;
        Ok((ValueInput::Sequence(layout(&out)), out))
    }
}

fn tensor_value(t: &proto::TensorProto) -> Result<Tensor, ImportError> {
    tensor::tensor_from_proto(t, None).map_err(|msg| ImportError::Tensor {
        name: t.name.clone(),
        msg,
    })
}

fn flatten_seq(s: &proto::SequenceProto, out: &mut Vec<Tensor>) -> Result<(), ImportError> {
    for t in &s.tensor_values {
        out.push(tensor_value(t)?);
    }
    for q in &s.sequence_values {
        flatten_seq(q, out)?;
    }
    for o in &s.optional_values {
        flatten_opt(o, out)?;
    }
    Ok(())
}

fn flatten_opt(o: &proto::OptionalProto, out: &mut Vec<Tensor>) -> Result<(), ImportError> {
    if let Some(t) = &o.tensor_value {
        out.push(tensor_value(t)?);
    }
    if let Some(s) = &o.sequence_value {
        flatten_seq(s, out)?;
    }
    if let Some(q) = &o.optional_value {
        flatten_opt(q, out)?;
    }
    Ok(())
}

/// The newest default-domain (ai.onnx) opset RLX knows: onnx 1.23's.
pub const MAX_OPSET: i64 = 28;

fn import_model(
    model: &ModelProto,
    file: &str,
    base_dir: Option<&Path>,
    opts: &ImportOptions,
    inits: Option<&std::sync::Mutex<HashMap<String, std::sync::Arc<rlx_ir::Tensor>>>>,
) -> Result<Graph, ImportError> {
    import_model_as(model, file, base_dir, opts, inits, false).map(|(g, _, _)| g)
}

/// The imported graph; with `symbolic`, also the symbolic tracking and the map from the
/// tracking's node ids to the pruned graph's.
type Imported = (Graph, Option<sym::SymState>, Vec<Option<NodeId>>);

fn import_model_as(
    model: &ModelProto,
    file: &str,
    base_dir: Option<&Path>,
    opts: &ImportOptions,
    inits: Option<&std::sync::Mutex<HashMap<String, std::sync::Arc<rlx_ir::Tensor>>>>,
    symbolic: bool,
) -> Result<Imported, ImportError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Model(format!("{file}: the model has no graph")))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version);
    // A model of other domains only (ai.onnx.preview.training, ...) needs no default opset.
    let uses_default = graph
        .node
        .iter()
        .any(|n| n.domain.is_empty() || n.domain == "ai.onnx");
    let opset = match opset {
        Some(v) => v,
        None if !uses_default => 0,
        None => {
            return Err(ImportError::Model(format!(
                "{file}: no opset_import for the default domain (ai.onnx)"
            )))
        }
    };
    if opset > MAX_OPSET {
        return Err(ImportError::Model(format!(
            "{file}: default-domain opset {opset} is newer than RLX knows (up to {MAX_OPSET}, onnx 1.23)"
        )));
    }
    let other_opsets: HashMap<&str, i64> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.as_str(), o.version))
        .collect();

    let name = if graph.name.is_empty() {
        "onnx"
    } else {
        &graph.name
    };
    let mut cx = Ctx {
        g: Graph::new(name),
        values: HashMap::new(),
        base_dir,
        seqs: HashMap::new(),
        opts: HashMap::new(),
        deferred: HashMap::new(),
        sym: None,
    };

    // Initializers → constants labelled with their name.
    let mut init_names = HashSet::new();
    for t in &graph.initializer {
        // Decoded once per model: a poisoned lock (a panic elsewhere) only loses the sharing.
        let cached = inits
            .and_then(|c| c.lock().ok())
            .and_then(|c| c.get(&t.name).cloned());
        let tensor = match cached {
            Some(x) => x,
            None => {
                let x =
                    std::sync::Arc::new(tensor::tensor_from_proto(t, base_dir).map_err(|msg| {
                        ImportError::Tensor {
                            name: t.name.clone(),
                            msg,
                        }
                    })?);
                if let Some(mut c) = inits.and_then(|c| c.lock().ok()) {
                    c.insert(t.name.clone(), x.clone());
                }
                x
            }
        };
        cx.g.set_current_origin(Some(Origin {
            label: t.name.clone(),
            op_type: None,
            ..Default::default()
        }));
        let id = cx.g.constant_shared(tensor);
        cx.values.insert(t.name.clone(), id);
        init_names.insert(t.name.as_str());
    }

    // Graph inputs (those that are not initializers).
    cx.g.set_current_origin(None);
    let opts = &bind_input_dims(&graph.input, &init_names, opts)?;
    if symbolic {
        cx.sym = Some(sym::SymState {
            probe: opts
                .dims
                .iter()
                .map(|(k, &v)| (k.clone(), v as i64))
                .collect(),
            ..Default::default()
        });
    }
    for vi in &graph.input {
        if init_names.contains(vi.name.as_str()) {
            continue;
        }
        if let Some(v) = opts.value_inputs.get(&vi.name) {
            // An element given in `constant_inputs` (by its input name) is frozen.
            let element = |cx: &mut Ctx, name: &str, d: &[usize], t: rlx_ir::DType| match opts
                .constant_inputs
                .get(name)
            {
                Some(c) => cx.constant(c.clone()),
                None => cx.g.input(name, Shape::new(d, t)),
            };
            let seq_inputs = |cx: &mut Ctx, elems: &[(Vec<usize>, rlx_ir::DType)]| {
                let ids: Vec<NodeId> = elems
                    .iter()
                    .enumerate()
                    .map(|(i, (d, t))| element(cx, &format!("{}[{i}]", vi.name), d, *t))
                    .collect();
                ops::new_seq(cx, ids)
            };
            let id = match v {
                ValueInput::Sequence(e) => seq_inputs(&mut cx, e),
                ValueInput::OptionalSequence(e) => {
                    let s = seq_inputs(&mut cx, e);
                    ops::new_opt(&mut cx, Some(s))
                }
                ValueInput::OptionalTensor(d, t) => {
                    let x = element(&mut cx, &vi.name, d, *t);
                    ops::new_opt(&mut cx, Some(x))
                }
                ValueInput::OptionalNone => ops::new_opt(&mut cx, None),
            };
            cx.values.insert(vi.name.clone(), id);
            continue;
        }
        let (decl, bound) = input_shape(vi, opts)?;
        if let Some(t) = opts.constant_inputs.get(&vi.name) {
            if t.dtype() != bound.dtype || t.dims().len() != decl.rank() {
                return Err(ImportError::Input {
                    name: vi.name.clone(),
                    msg: format!(
                        "declared {decl}, the constant given for it is {}",
                        t.shape()
                    ),
                });
            }
            cx.g.set_current_origin(Some(Origin {
                label: vi.name.clone(),
                op_type: None,
                ..Default::default()
            }));
            let id = cx.constant(t.clone());
            cx.g.set_current_origin(None);
            cx.values.insert(vi.name.clone(), id);
            continue;
        }
        let id = cx.g.input(&vi.name, bound);
        if let Some(s) = &mut cx.sym {
            // Named dims are the symbols (unnamed ones stay at their bound size).
            let d: Vec<rlx_ir::sym::DimExpr> = decl
                .dims
                .iter()
                .zip(cx.g.nodes[id.index()].shape.dims_usize().iter())
                .map(|(d, &n)| match d {
                    // A symbol bound by default (no size given) is probed at that size.
                    Dim::Sym(p)
                        if p != "?"
                            && *s.probe.entry(p.clone()).or_insert(n as i64) == n as i64 =>
                    {
                        rlx_ir::sym::DimExpr::sym(p)
                    }
                    _ => rlx_ir::sym::DimExpr::from(n as i64),
                })
                .collect();
            if d.iter().any(|e| !e.is_const()) {
                s.shapes.insert(id, d);
            }
        }
        if let Some(last) = cx.g.input_decls.last_mut() {
            last.1 = decl;
        }
        cx.values.insert(vi.name.clone(), id);
    }

    // Nodes, in file order (ONNX requires topological order).
    for node in &graph.node {
        let label = onnx_node_label(node);
        let node_err = |msg: String| ImportError::Node {
            node: label.clone(),
            op_type: node.op_type.clone(),
            msg,
        };
        let domain_is_default = node.domain.is_empty() || node.domain == "ai.onnx";
        let lower = if domain_is_default {
            ops::lookup(&node.op_type)
        } else {
            ops::lookup_in(&node.domain, &node.op_type)
        };
        let Some(lower) = lower else {
            let domain = if domain_is_default {
                "ai.onnx"
            } else {
                &node.domain
            };
            return Err(ImportError::UnsupportedOp {
                node: label,
                op_type: node.op_type.clone(),
                domain: domain.to_string(),
                opset: other_opsets
                    .get(node.domain.as_str())
                    .copied()
                    .unwrap_or(opset),
            });
        };
        let mut inputs = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            let id = cx.values.get(name).copied().ok_or_else(|| {
                node_err(format!(
                    "input \"{name}\" is not produced by an earlier node, an initializer or a graph input"
                ))
            })?;
            inputs.push(Some(id));
        }
        ops::check_tensor_inputs(&cx, &node.op_type, &inputs).map_err(node_err)?;
        cx.g.set_current_origin(Some(Origin {
            label: label.clone(),
            op_type: Some(node.op_type.clone()),
            ..Default::default()
        }));
        let onode = ONode {
            proto: node,
            inputs,
            opset,
        };
        let outs = lower(&mut cx, &onode).map_err(node_err)?;
        for (i, out_name) in node.output.iter().enumerate() {
            if out_name.is_empty() {
                continue;
            }
            let id = outs.get(i).copied().ok_or_else(|| {
                node_err(format!(
                    "output {i} (\"{out_name}\") is not supported by the importer"
                ))
            })?;
            // ONNX graphs are in SSA form: every tensor name has one producer.
            if cx.values.insert(out_name.clone(), id).is_some() {
                return Err(node_err(format!(
                    "output \"{out_name}\" is already produced by an earlier node, input or initializer (ONNX names must be unique)"
                )));
            }
        }
    }
    cx.g.set_current_origin(None);

    let mut outputs = Vec::new();
    for vi in &graph.output {
        let id = cx
            .values
            .get(&vi.name)
            .copied()
            .ok_or_else(|| ImportError::Output {
                name: vi.name.clone(),
                msg: "not produced by any node, initializer or input".into(),
            })?;
        // A sequence / optional output becomes its elements' outputs (`name[i]`).
        outputs.extend(ops::flatten_output(&cx, id, &vi.name));
    }
    cx.g.set_outputs_named(outputs);
    let (g, remap) = prune(cx.g);
    Ok((g, cx.sym, remap))
}

/// Declared and bound type of a graph input.
/// Fold `opts.input_shapes` (and the dims of `opts.constant_inputs`) into `opts.dims`,
/// checking them against each input's declared dims.
/// The label RLX gives an ONNX node: its name, else its first output's name.
pub(crate) fn onnx_node_label(node: &proto::NodeProto) -> String {
    if !node.name.is_empty() {
        return node.name.clone();
    }
    node.output
        .iter()
        .find(|o| !o.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("<unnamed {}>", node.op_type))
}

fn bind_input_dims(
    inputs: &[proto::ValueInfoProto],
    init_names: &std::collections::HashSet<&str>,
    opts: &ImportOptions,
) -> Result<ImportOptions, ImportError> {
    let mut out = opts.clone();
    // Which input (and dim) bound each symbol first, for the message when another disagrees.
    let mut bound_by: HashMap<String, (String, usize)> = HashMap::new();
    for vi in inputs {
        if init_names.contains(vi.name.as_str()) || opts.value_inputs.contains_key(&vi.name) {
            continue;
        }
        let given = opts.input_shapes.get(&vi.name).cloned().or_else(|| {
            opts.constant_inputs
                .get(&vi.name)
                .map(|t| t.dims().to_vec())
        });
        let Some(given) = given else { continue };
        let (decl, _) = input_shape(vi, opts)?;
        let err = |msg: String| ImportError::Input {
            name: vi.name.clone(),
            msg,
        };
        if decl.rank() != given.len() {
            return Err(err(format!(
                "declared rank {} ({decl}), given shape {given:?}",
                decl.rank()
            )));
        }
        for (k, (d, &n)) in decl.dims.iter().zip(&given).enumerate() {
            match d {
                Dim::Static(v) if *v != n => {
                    return Err(err(format!(
                        "dim {k} is declared {v}, the given shape {given:?} has {n}"
                    )))
                }
                Dim::Sym(p) if p != "?" => {
                    if let Some(&prev) = out.dims.get(p) {
                        if prev != n {
                            let other = if opts.dims.contains_key(p) {
                                format!("the requested {p}={prev}")
                            } else if let Some((by, at)) = bound_by.get(p) {
                                format!("{prev} in input \"{by}\" (its dim {at})")
                            } else {
                                format!("{prev} in another input")
                            };
                            return Err(err(format!("dim {k} ({p}) is {n} here but {other}")));
                        }
                    } else {
                        out.dims.insert(p.clone(), n);
                        bound_by.insert(p.clone(), (vi.name.clone(), k));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// A value's declared tensor type when every dim is a number (a Loop body's output, for a
/// scan output of zero iterations: `[0, dims...]`).
pub(crate) fn declared_static(vi: &proto::ValueInfoProto) -> Option<(rlx_ir::DType, Vec<usize>)> {
    let tt = vi.r#type.as_ref()?.tensor_type.as_ref()?;
    let dt = tensor::dtype_of(tt.elem_type)?;
    let dims = tt
        .shape
        .as_ref()?
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(proto::DimValue::DimValue(v)) if *v >= 0 => Some(*v as usize),
            _ => None,
        })
        .collect::<Option<Vec<usize>>>()?;
    Some((dt, dims))
}

/// The scan output of a Loop that ran zero times: an empty `[0, dims...]` tensor of the
/// body's declared element type `dt` and shape `dims` (what onnxruntime gives; the ONNX Loop
/// spec leaves a zero-iteration stack's element shape to the body's declared output). Used
/// by the importer's unrolling and by the run-time loop (rlx-runtime's `run_loop`).
pub fn empty_scan_output(dt: rlx_ir::DType, dims: &[usize]) -> Result<rlx_ir::Tensor, String> {
    let mut d = vec![0];
    d.extend_from_slice(dims);
    rlx_ir::Tensor::new(d, rlx_ir::TensorData::from_f64(dt, &[])).map_err(|e| e.to_string())
}

fn input_shape(
    vi: &proto::ValueInfoProto,
    opts: &ImportOptions,
) -> Result<(Shape, Shape), ImportError> {
    let err = |msg: String| ImportError::Input {
        name: vi.name.clone(),
        msg,
    };
    let tt = vi
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| err("is not a tensor (or has no type)".into()))?;
    let dtype = tensor::dtype_of(tt.elem_type).ok_or_else(|| {
        err(format!(
            "element type {} is not supported",
            tensor::onnx_type_name(tt.elem_type)
        ))
    })?;
    let given = opts.input_shapes.get(&vi.name).cloned().or_else(|| {
        opts.constant_inputs
            .get(&vi.name)
            .map(|t| t.dims().to_vec())
    });
    let Some(sp) = tt.shape.as_ref() else {
        // No declared shape (rank unknown): the shape of the tensor fed for it, if any.
        return match given {
            Some(g) => Ok((
                Shape::with_dims(g.iter().map(|_| Dim::Sym("?".into())).collect(), dtype),
                Shape::new(&g, dtype),
            )),
            None => Err(err(
                "has no shape (rank unknown): feed it a tensor (rlx: --input NAME=FILE) to take that tensor's shape"
                    .into(),
            )),
        };
    };
    let mut decl = Vec::new();
    let mut bound = Vec::new();
    for d in &sp.dim {
        match &d.value {
            Some(DimValue::DimValue(v)) => {
                let v = usize::try_from(*v).map_err(|_| err(format!("negative dim {v}")))?;
                decl.push(Dim::Static(v));
                bound.push(v);
            }
            Some(DimValue::DimParam(p)) if !p.is_empty() => {
                decl.push(Dim::Sym(p.clone()));
                bound.push(opts.dims.get(p).copied().unwrap_or(opts.default_dim));
            }
            _ => {
                decl.push(Dim::Sym("?".into()));
                bound.push(opts.default_dim);
            }
        }
    }
    if let Some(g) = given.filter(|g| g.len() == bound.len()) {
        bound = g;
    }
    Ok((Shape::with_dims(decl, dtype), Shape::new(&bound, dtype)))
}

/// Drop nodes no output depends on (folded shape arithmetic, unused initializers),
/// keeping every graph input. Ids are renumbered; order is preserved.
pub(crate) fn prune(mut g: Graph) -> (Graph, Vec<Option<NodeId>>) {
    let mut live = vec![false; g.nodes.len()];
    for o in &g.outputs {
        live[o.index()] = true;
    }
    for n in g.nodes.iter().rev() {
        if matches!(n.op, Op::Input { .. }) {
            live[n.id.index()] = true;
        }
        if live[n.id.index()] {
            for i in &n.inputs {
                live[i.index()] = true;
            }
        }
    }
    let nodes = std::mem::take(&mut g.nodes);
    let mut remap = vec![None; nodes.len()];
    for mut n in nodes {
        if !live[n.id.index()] {
            continue;
        }
        let new_id = NodeId(g.nodes.len() as u32);
        remap[n.id.index()] = Some(new_id);
        n.id = new_id;
        for i in n.inputs.iter_mut() {
            *i = remap[i.index()].expect("inputs of a live node are live");
        }
        g.nodes.push(n);
    }
    g.outputs = g
        .outputs
        .iter()
        .map(|o| remap[o.index()].expect("outputs are live"))
        .collect();
    (g, remap)
}
