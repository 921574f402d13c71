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

    /// The cut node's name as import errors give it (`nms`).
    pub fn node_name(&self) -> &str {
        label(&self.graph().node[self.k])
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

    /// For a cut `Loop`: its body as a model of its own, run once per iteration by a runtime
    /// that loops at run time (when the importer cannot unroll it: a condition the body
    /// computes from data, more iterations than it unrolls). The model's inputs are the
    /// body's formal inputs (iteration number, condition, loop-carried values), then the
    /// outer-scope values the body reads (returned, in that order); its outputs are the
    /// body's (condition, carried values, scan outputs). Inputs are typed by `types` (dtype
    /// and rank of this run's values; sizes symbolic, so iterations whose carried values grow
    /// still share the model); the main graph's initializers the body reads come along.
    ///
    /// Errors: the cut node is no Loop, has no body, or a value has no type in `types`.
    pub fn loop_body(
        &self,
        types: &HashMap<String, (DType, usize)>,
    ) -> Result<(OnnxModel, Vec<String>), String> {
        let n = &self.graph().node[self.k];
        if n.op_type != "Loop" {
            return Err(format!("{} is no Loop", self.node_label()));
        }
        let body = n
            .attribute
            .iter()
            .find(|a| a.name == "body")
            .and_then(|a| a.g.as_ref())
            .ok_or("the Loop has no body graph")?;
        let mut defined: HashSet<String> = body.input.iter().map(|v| v.name.clone()).collect();
        defined.extend(body.initializer.iter().map(|t| t.name.clone()));
        let mut outer: Vec<String> = vec![];
        for m in &body.node {
            let mut r = vec![];
            reads(m, &mut r);
            for x in r {
                if !defined.contains(&x) && !outer.contains(&x) {
                    outer.push(x);
                }
            }
            defined.extend(m.output.iter().cloned());
        }
        // Outer values that are main-graph initializers come as initializers; the others
        // are inputs (and subgraph-internal names `reads` over-approximates drop out: they
        // are neither initializers nor values of this run).
        let inits: Vec<_> = self
            .graph()
            .initializer
            .iter()
            .filter(|t| outer.contains(&t.name))
            .cloned()
            .collect();
        let outer: Vec<String> = outer
            .into_iter()
            .filter(|x| !inits.iter().any(|t| &t.name == x) && types.contains_key(x))
            .collect();
        let mut inputs = vec![];
        for name in body.input.iter().map(|v| &v.name).chain(outer.iter()) {
            let &(dt, rank) = types
                .get(name)
                .ok_or_else(|| format!("value \"{name}\" has no type (it was not computed)"))?;
            inputs.push(value_info(name, dt, &symbolic(name, rank, &self.taken)));
        }
        let graph = GraphProto {
            node: body.node.clone(),
            name: format!("{}_body", label(n)),
            initializer: body.initializer.iter().cloned().chain(inits).collect(),
            input: inputs,
            output: body
                .output
                .iter()
                .map(|o| ValueInfoProto {
                    name: o.name.clone(),
                    r#type: None,
                })
                .collect(),
            value_info: vec![],
        };
        let model = ModelProto {
            graph: Some(graph),
            ..self.model.clone()
        };
        Ok((
            OnnxModel::from_proto(
                model,
                &format!("{} (body of {})", self.file, self.node_label()),
            ),
            outer,
        ))
    }

    /// A cut Loop's body's formal input names (iteration number, condition, carried values);
    /// empty for another node.
    pub fn loop_body_inputs(&self) -> Vec<String> {
        let n = &self.graph().node[self.k];
        n.attribute
            .iter()
            .find(|a| a.name == "body")
            .and_then(|a| a.g.as_ref())
            .map(|b| b.input.iter().map(|v| v.name.clone()).collect())
            .unwrap_or_default()
    }

    /// The value of the model's initializer `name` (a Loop's trip count or condition may be
    /// one); `None` when no initializer has that name or it cannot be decoded.
    pub fn initializer(&self, name: &str) -> Option<rlx_ir::Tensor> {
        let t = self.graph().initializer.iter().find(|t| t.name == name)?;
        crate::tensor::tensor_from_proto(t, None).ok()
    }

    /// A cut Loop's body outputs' declared types when fully static (`None` per output
    /// otherwise): a scan output of zero iterations is an empty stack of that type.
    pub fn loop_body_output_types(&self) -> Vec<Option<(DType, Vec<usize>)>> {
        let n = &self.graph().node[self.k];
        n.attribute
            .iter()
            .find(|a| a.name == "body")
            .and_then(|a| a.g.as_ref())
            .map(|b| b.output.iter().map(crate::declared_static).collect())
            .unwrap_or_default()
    }

    /// The cut node's input names as the node lists them (`""` for an absent optional one).
    pub fn op_node_inputs(&self) -> Vec<String> {
        self.graph().node[self.k].input.clone()
    }

    /// The cut node's output names as the node lists them (`""` for an unused one).
    pub fn op_node_outputs(&self) -> Vec<String> {
        self.graph().node[self.k].output.clone()
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
