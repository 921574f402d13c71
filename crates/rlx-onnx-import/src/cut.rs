//! Cutting a model at one top-level node, so a runtime can run a node whose output shape
//! depends on values (NonZero, Compress, Unique, NonMaxSuppression, an If whose branches
//! differ, a Loop with a run-time trip count) *between* two plans: the nodes before it (the
//! head) run as one model, the node runs alone once its inputs are known, and the nodes after
//! it (the tail) run as another model whose inputs are the values the first two produced.
//!
//! The three parts are ONNX models built from this one (its opsets, its initializers where a
//! part reads them), so each imports, compiles and reports NaN/Inf with the model's own node
//! names. Types of values computed inside the model are known only once they exist, so
//! [`Cut::op_model`] and [`Cut::tail_model`] take them from the tensors of a run.

use crate::proto::{
    DimValue, Dimension, GraphProto, ModelProto, NodeProto, TensorShapeProto, TypeProto,
    TypeProtoTensor, ValueInfoProto,
};
use crate::OnnxModel;
use rlx_ir::DType;
use std::collections::{HashMap, HashSet};

/// A model cut at one top-level node (see the module docs).
pub struct Cut {
    model: ModelProto,
    k: usize,
    file: String,
    head_inputs: Vec<String>,
    head_outputs: Vec<String>,
    op_inputs: Vec<String>,
    tail_inputs: Vec<String>,
    tail_outputs: Vec<String>,
    /// The `dim_param`s of the model's graph inputs (the invented symbols avoid them).
    taken: HashSet<String>,
}

/// Every value name `n` reads: its inputs, and names read inside its subgraphs (an
/// over-approximation of the outer values they capture).
fn reads(n: &NodeProto, out: &mut Vec<String>) {
    out.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
    for a in &n.attribute {
        for g in a.g.iter().chain(a.graphs.iter()) {
            for m in &g.node {
                reads(m, out);
            }
            out.extend(g.output.iter().map(|o| o.name.clone()));
        }
    }
}

/// The node's name as import errors give it: its name, else its first output's.
fn label(n: &NodeProto) -> &str {
    if n.name.is_empty() {
        n.output.first().map(|s| s.as_str()).unwrap_or("")
    } else {
        &n.name
    }
}

fn value_info(name: &str, dt: DType, dims: &[Dimension]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: crate::tensor::onnx_dtype(dt),
                shape: Some(TensorShapeProto { dim: dims.to_vec() }),
            }),
            denotation: String::new(),
        }),
    }
}

/// Symbolic dims for a value computed inside the model: `<name>.0`, `<name>.1`, ... (prefixed
/// with `_` until no symbol of the model's own inputs has that name), so a tail input's sizes
/// are whatever the run gives.
fn symbolic(name: &str, rank: usize, taken: &HashSet<String>) -> Vec<Dimension> {
    (0..rank)
        .map(|i| Dimension {
            value: Some(DimValue::DimParam(dim_symbol(name, i, taken))),
            denotation: String::new(),
        })
        .collect()
}

fn dim_symbol(name: &str, axis: usize, taken: &HashSet<String>) -> String {
    let mut s = format!("{name}.{axis}");
    while taken.contains(&s) {
        s.insert(0, '_');
    }
    s
}

impl OnnxModel {
    /// Cut the model at the top-level node named `node` (its name, or its first output's
    /// when unnamed, as import errors name nodes). `None` when no top-level node has that
    /// name (a node inside a subgraph cannot be cut at).
    pub fn cut_at(&self, node: &str) -> Option<Cut> {
        let g = self.model.graph.as_ref()?;
        let k = g.node.iter().position(|n| label(n) == node)?;
        let inits: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let graph_inputs: Vec<String> = self.input_names();
        let mut produced: Vec<String> = graph_inputs.clone();
        let mut head_reads = vec![];
        for n in &g.node[..k] {
            reads(n, &mut head_reads);
            produced.extend(n.output.iter().filter(|s| !s.is_empty()).cloned());
        }
        let mut op_reads = vec![];
        reads(&g.node[k], &mut op_reads);
        let mut later = vec![];
        for n in &g.node[k + 1..] {
            reads(n, &mut later);
        }
        later.extend(g.output.iter().map(|o| o.name.clone()));
        let op_outputs: Vec<String> = g.node[k]
            .output
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        let uniq = |v: Vec<String>| -> Vec<String> {
            let mut seen = HashSet::new();
            v.into_iter().filter(|s| seen.insert(s.clone())).collect()
        };
        let is_live = |s: &String| !inits.contains(s.as_str());
        let head_inputs = uniq(
            graph_inputs
                .iter()
                .filter(|i| head_reads.contains(i))
                .cloned()
                .collect(),
        );
        let head_made: HashSet<&String> =
            g.node[..k].iter().flat_map(|n| n.output.iter()).collect();
        let head_outputs = uniq(
            op_reads
                .iter()
                .chain(later.iter())
                .filter(|s| head_made.contains(s) && is_live(s))
                .cloned()
                .collect(),
        );
        let op_inputs = uniq(
            op_reads
                .iter()
                .filter(|s| produced.contains(s) && is_live(s))
                .cloned()
                .collect(),
        );
        let tail_inputs = uniq(
            later
                .iter()
                .filter(|s| (produced.contains(s) || op_outputs.contains(s)) && is_live(s))
                .cloned()
                .collect(),
        );
        let tail_made: HashSet<&String> = g.node[k + 1..]
            .iter()
            .flat_map(|n| n.output.iter())
            .collect();
        let tail_outputs = g
            .output
            .iter()
            .map(|o| o.name.clone())
            .filter(|o| tail_made.contains(o))
            .collect();
        let taken = g
            .input
            .iter()
            .filter_map(|v| v.r#type.as_ref()?.tensor_type.as_ref()?.shape.as_ref())
            .flat_map(|sh| sh.dim.iter())
            .filter_map(|d| match &d.value {
                Some(DimValue::DimParam(p)) => Some(p.clone()),
                _ => None,
            })
            .collect();
        Some(Cut {
            taken,
            model: self.model.clone(),
            k,
            file: self.file.clone(),
            head_inputs,
            head_outputs,
            op_inputs,
            tail_inputs,
            tail_outputs,
        })
    }
}

impl Cut {
    /// The symbol [`Cut::tail_model`] gives axis `axis` of the computed value `value`.
    pub fn dim_symbol(&self, value: &str, axis: usize) -> String {
        dim_symbol(value, axis, &self.taken)
    }

    /// The cut node's name and op type, `"nms" (NonMaxSuppression)`.
    pub fn node_label(&self) -> String {
        let n = &self.graph().node[self.k];
        format!("\"{}\" ({})", label(n), n.op_type)
    }

    fn graph(&self) -> &GraphProto {
        self.model.graph.as_ref().expect("cut_at checked the graph")
    }

    /// Graph inputs the head reads.
    pub fn head_inputs(&self) -> &[String] {
        &self.head_inputs
    }

    /// Values the head produces that the cut node or the tail read (the head's outputs).
    pub fn head_outputs(&self) -> &[String] {
        &self.head_outputs
    }

    /// Values the cut node reads (graph inputs or head outputs; initializers excluded).
    pub fn op_inputs(&self) -> &[String] {
        &self.op_inputs
    }

    /// The cut node's op type (`Loop`, `NonZero`, ...).
    pub fn op_type(&self) -> &str {
        &self.graph().node[self.k].op_type
    }

    /// The cut node's inputs whose values the importer needs to lower it, when that is not
    /// all of them: a `Loop`'s trip count `M` and condition `cond` (then it unrolls the body
    /// over its other inputs, which may stay run-time inputs, so the body's ops run, are
    /// scanned and are named with their iteration), an `If`'s condition. `None` for the
    /// other cut nodes, whose output shapes depend on their data (NonZero, Unique, ...):
    /// they are imported with every input frozen.
    pub fn import_time_inputs(&self) -> Option<Vec<String>> {
        let n = &self.graph().node[self.k];
        let first = match n.op_type.as_str() {
            "Loop" => 2,
            "If" => 1,
            _ => return None,
        };
        Some(
            n.input
                .iter()
                .take(first)
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
        )
    }

    /// The cut node's outputs.
    pub fn op_outputs(&self) -> Vec<String> {
        self.graph().node[self.k]
            .output
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect()
    }

    /// Values the tail reads that were produced before it (graph inputs, head outputs, the
    /// cut node's outputs).
    pub fn tail_inputs(&self) -> &[String] {
        &self.tail_inputs
    }

    /// Graph outputs the tail produces.
    pub fn tail_outputs(&self) -> &[String] {
        &self.tail_outputs
    }

    /// A model of `nodes` with these inputs and outputs, the initializers they read.
    fn part(
        &self,
        nodes: &[NodeProto],
        inputs: Vec<ValueInfoProto>,
        outputs: &[String],
        tag: &str,
    ) -> OnnxModel {
        let g = self.graph();
        let mut read = vec![];
        for n in nodes {
            reads(n, &mut read);
        }
        let read: HashSet<String> = read.into_iter().collect();
        let graph = GraphProto {
            node: nodes.to_vec(),
            name: format!("{}_{tag}", g.name),
            initializer: g
                .initializer
                .iter()
                .filter(|t| read.contains(&t.name))
                .cloned()
                .collect(),
            input: inputs,
            output: outputs
                .iter()
                .map(|o| {
                    g.output
                        .iter()
                        .find(|v| &v.name == o)
                        .cloned()
                        .unwrap_or(ValueInfoProto {
                            name: o.clone(),
                            r#type: None,
                        })
                })
                .collect(),
            value_info: vec![],
        };
        let model = ModelProto {
            graph: Some(graph),
            ..self.model.clone()
        };
        OnnxModel::from_proto(
            model,
            &format!("{} ({tag} of the cut at {})", self.file, self.node_label()),
        )
    }

    /// The declared input `name` of the original model, when it is a graph input.
    fn declared(&self, name: &str) -> Option<ValueInfoProto> {
        self.graph().input.iter().find(|v| v.name == name).cloned()
    }

    /// The nodes before the cut, reading [`Cut::head_inputs`] and giving
    /// [`Cut::head_outputs`]; `None` when the cut node is the first or needs nothing of them.
    pub fn head(&self) -> Option<OnnxModel> {
        if self.k == 0 || self.head_outputs.is_empty() {
            return None;
        }
        let inputs = self
            .head_inputs
            .iter()
            .filter_map(|n| self.declared(n))
            .collect();
        Some(self.part(
            &self.graph().node[..self.k],
            inputs,
            &self.head_outputs,
            "head",
        ))
    }

    /// The cut node alone, its inputs typed as `types` gives them (every name of
    /// [`Cut::op_inputs`]), to be imported with them all frozen (the importer then computes
    /// the node's outputs from the run's values) or only [`Cut::import_time_inputs`] frozen
    /// (the others bound by shape and fed when it runs).
    ///
    /// Errors: a name of [`Cut::op_inputs`] missing from `types`.
    pub fn op_model(&self, types: &HashMap<String, (DType, usize)>) -> Result<OnnxModel, String> {
        let inputs = self.typed(&self.op_inputs, types, false)?;
        Ok(self.part(
            std::slice::from_ref(&self.graph().node[self.k]),
            inputs,
            &self.op_outputs(),
            "node",
        ))
    }

    /// The nodes after the cut, reading [`Cut::tail_inputs`] (graph inputs keep their
    /// declared types; other values get symbolic dims `<name>.<i>` and the dtype and rank in
    /// `types`) and giving [`Cut::tail_outputs`]; `None` when the tail gives no output.
    ///
    /// Errors: a tail input that is not a graph input missing from `types`.
    pub fn tail_model(
        &self,
        types: &HashMap<String, (DType, usize)>,
    ) -> Result<Option<OnnxModel>, String> {
        if self.tail_outputs.is_empty() {
            return Ok(None);
        }
        let inputs = self.typed(&self.tail_inputs, types, true)?;
        Ok(Some(self.part(
            &self.graph().node[self.k + 1..],
            inputs,
            &self.tail_outputs,
            "tail",
        )))
    }

    fn typed(
        &self,
        names: &[String],
        types: &HashMap<String, (DType, usize)>,
        keep_declared: bool,
    ) -> Result<Vec<ValueInfoProto>, String> {
        names
            .iter()
            .map(|n| {
                if keep_declared {
                    if let Some(v) = self.declared(n) {
                        return Ok(v);
                    }
                }
                let Some(&(dt, rank)) = types.get(n) else {
                    // A graph input of sequence or optional type has no tensor type: its
                    // declared type stays.
                    return self
                        .declared(n)
                        .ok_or_else(|| format!("value \"{n}\" has no type (it was not computed)"));
                };
                Ok(value_info(n, dt, &symbolic(n, rank, &self.taken)))
            })
            .collect()
    }

    /// The model as serialized bytes of a part (for a source that keeps bytes).
    pub fn encode(model: &OnnxModel) -> Vec<u8> {
        use prost::Message;
        model.model.encode_to_vec()
    }
}
