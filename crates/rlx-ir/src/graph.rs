//! The graph: nodes in topological order, with a builder API.

use crate::{Activation, BinaryOp, Op, Shape, Tensor, UnaryOp};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Index of a node in its graph; printed `%N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a node came from in the user's model: the source op's name (ONNX node name,
/// else its first output name; PyTorch FX name; checkpoint layer name) and its op type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Origin {
    /// The source op's name, e.g. `"/encoder/layer.0/attention/Softmax"`.
    pub label: String,
    /// The source op type, e.g. `"Softmax"` (ONNX op_type), `"aten.mul.Tensor"` (a
    /// `torch.export` node's target), when known.
    pub op_type: Option<String>,
    /// The module path of the source op in the user's model, e.g. `"layers.3.mlp"` (from a
    /// `torch.export` node's `nn_module_stack`; empty for the root module), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Where the user's code created the source op (the innermost frame of a `torch.export`
    /// node's `stack_trace`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceLoc>,
    /// The loop iterations the node was lowered in, outermost first: an importer that
    /// unrolls a loop (ONNX `Loop`, `Scan`) stamps every node it lowers in iteration `i` of
    /// a loop with `(that loop's node, i)`, so the unrolled copies of one body node tell
    /// apart. Empty outside loops (and in packages written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iteration: Vec<LoopIteration>,
}

/// One level of a node's loop-iteration path ([`Origin::iteration`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoopIteration {
    /// The loop node's label (its ONNX name), e.g. `"decoder_loop"`.
    pub node: String,
    /// The loop's op type (`Loop`, `Scan`).
    pub op_type: String,
    /// The 0-based iteration: a `Loop` body's `iteration_num` input, a `Scan`'s step (0 =
    /// the first slice the body processed, whatever the scan direction).
    pub iteration: u64,
}

/// `iteration 3 of Loop "decoder_loop"`; nested loops outermost first:
/// `iteration 3 of Loop "outer", 5 of Scan "inner"`. `None` for an empty path.
pub fn iteration_text(path: &[LoopIteration]) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let parts: Vec<String> = path
        .iter()
        .map(|l| format!("{} of {} \"{}\"", l.iteration, l.op_type, l.node))
        .collect();
    Some(format!("iteration {}", parts.join(", ")))
}

/// A line of the user's source code: the file, the 1-based line number and, when known, the
/// line's code (stripped of surrounding whitespace).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SourceLoc {
    /// The file as the stack trace names it (usually an absolute path).
    pub file: String,
    /// 1-based line number.
    pub line: u32,
    /// The line's code, e.g. `"y = self.proj(x)"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl fmt::Display for SourceLoc {
    /// `model.py:42  y = self.proj(x)`: the file's base name, the line, and its code.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = self.file.rsplit(['/', '\\']).next().unwrap_or(&self.file);
        write!(f, "{base}:{}", self.line)?;
        if let Some(c) = &self.code {
            write!(f, "  {c}")?;
        }
        Ok(())
    }
}

/// One operation in the graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: NodeId,
    pub op: Op,
    pub inputs: Vec<NodeId>,
    /// Output type (static dims once the graph is built by an importer or the builder).
    pub shape: Shape,
    /// The source op this node was created for (stamped by importers; kept by passes).
    /// Shared: the IR nodes lowered from one source op, and the copies a compile makes
    /// (the kept source graph, the passes), point at one `Origin`.
    pub origin: Option<std::sync::Arc<Origin>>,
    /// An enclosing block or layer name (e.g. `"layer3.attn"`), when the builder knows one.
    pub block: Option<String>,
    /// A free-form name given through the builder.
    pub name: Option<String>,
}

/// A dataflow graph. Nodes are stored in topological order: every input of a node has a
/// smaller id. Outputs are listed in `outputs` with names in `output_names`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Graph {
    pub name: String,
    pub nodes: Vec<Node>,
    pub outputs: Vec<NodeId>,
    pub output_names: Vec<String>,
    /// Declared input signatures (may hold symbolic dims), as the source model states them.
    /// Input nodes themselves carry the bound static shape.
    pub input_decls: Vec<(String, Shape)>,
    #[serde(skip)]
    current_origin: Option<std::sync::Arc<Origin>>,
    #[serde(skip)]
    current_block: Option<String>,
}

impl Graph {
    /// An empty graph named `name`.
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// Stamp `origin` on every node added until it is changed again (importers call this
    /// once per source op; the decompose pass once per rewritten node).
    pub fn set_current_origin(&mut self, origin: Option<Origin>) {
        self.current_origin = origin.map(std::sync::Arc::new);
    }

    /// [`Graph::set_current_origin`] with an origin already shared (a pass copying a node's).
    pub fn set_current_origin_shared(&mut self, origin: Option<std::sync::Arc<Origin>>) {
        self.current_origin = origin;
    }

    /// The origin stamped on new nodes.
    pub fn current_origin(&self) -> Option<&Origin> {
        self.current_origin.as_deref()
    }

    /// Stamp `block` on every node added until it is changed again.
    pub fn set_current_block(&mut self, block: Option<String>) {
        self.current_block = block;
    }

    /// Append a node; returns its id. Inputs must already exist (checked by
    /// `rlx_compile::verify`, not here, so importers can report errors with context).
    pub fn add_node(&mut self, op: Op, inputs: Vec<NodeId>, shape: Shape) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            id,
            op,
            inputs,
            shape,
            origin: self.current_origin.clone(),
            block: self.current_block.clone(),
            name: None,
        });
        id
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Give a node a free-form name (shown by `node_label` when it has no origin).
    pub fn set_name(&mut self, id: NodeId, name: &str) {
        self.nodes[id.index()].name = Some(name.to_string());
    }

    /// Ids of `Input` nodes, in graph order.
    pub fn inputs(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Input { .. }))
            .map(|n| n.id)
            .collect()
    }

    /// Ids of `Param` nodes, in graph order.
    pub fn params(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Param { .. }))
            .map(|n| n.id)
            .collect()
    }

    /// Find an input node by name.
    pub fn input_by_name(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().find_map(|n| match &n.op {
            Op::Input { name: nm } if nm == name => Some(n.id),
            _ => None,
        })
    }

    /// Set the graph outputs (names default to the output node labels).
    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.output_names = outputs
            .iter()
            .map(|&o| crate::provenance::node_label(self, o))
            .collect();
        self.outputs = outputs;
    }

    /// Set the graph outputs with explicit names (e.g. ONNX graph output names).
    pub fn set_outputs_named(&mut self, outputs: Vec<(NodeId, String)>) {
        self.outputs = outputs.iter().map(|o| o.0).collect();
        self.output_names = outputs.into_iter().map(|o| o.1).collect();
    }

    /// Number of consumers of each node (graph outputs count as consumers).
    pub fn use_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.nodes.len()];
        for n in &self.nodes {
            for i in &n.inputs {
                c[i.index()] += 1;
            }
        }
        for o in &self.outputs {
            c[o.index()] += 1;
        }
        c
    }

    // ---- builder API ----

    /// A graph input named `name` with type `shape`.
    pub fn input(&mut self, name: &str, shape: Shape) -> NodeId {
        self.input_decls.push((name.to_string(), shape.clone()));
        self.add_node(
            Op::Input {
                name: name.to_string(),
            },
            vec![],
            shape,
        )
    }

    /// A named parameter (weight) with type `shape`, set after compiling.
    pub fn param(&mut self, name: &str, shape: Shape) -> NodeId {
        self.add_node(
            Op::Param {
                name: name.to_string(),
            },
            vec![],
            shape,
        )
    }

    /// A literal tensor.
    pub fn constant(&mut self, t: Tensor) -> NodeId {
        self.constant_shared(Arc::new(t))
    }

    /// A constant holding a tensor shared with other graphs (the plans of one dynamic model
    /// share their weights this way).
    pub fn constant_shared(&mut self, t: Arc<Tensor>) -> NodeId {
        let shape = t.shape();
        self.add_node(Op::Constant(t), vec![], shape)
    }

    /// `np.matmul(a, b)` with output type `shape`.
    pub fn matmul(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::MatMul, vec![a, b], shape)
    }

    /// An activation function applied elementwise.
    pub fn activation(&mut self, kind: Activation, x: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::Activation(kind), vec![x], shape)
    }

    /// A unary math op applied elementwise.
    pub fn unary(&mut self, op: UnaryOp, x: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::Unary(op), vec![x], shape)
    }

    /// A binary op with NumPy broadcasting.
    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::Binary(op), vec![a, b], shape)
    }

    pub fn add(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.binary(BinaryOp::Add, a, b, shape)
    }
    pub fn sub(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.binary(BinaryOp::Sub, a, b, shape)
    }
    pub fn mul(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.binary(BinaryOp::Mul, a, b, shape)
    }
    pub fn div(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.binary(BinaryOp::Div, a, b, shape)
    }
    /// Softmax over `axis`.
    pub fn softmax(&mut self, x: NodeId, axis: usize, shape: Shape) -> NodeId {
        self.add_node(Op::Softmax { axis }, vec![x], shape)
    }
}

impl fmt::Display for Graph {
    /// One line per node: `%3 = MatMul(%1, %2) : f32[2,2] "label"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {} ({} nodes)", self.name, self.nodes.len())?;
        for n in &self.nodes {
            let ins: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
            writeln!(
                f,
                "  {} = {}({}) : {} \"{}\"",
                n.id,
                n.op.name(),
                ins.join(", "),
                n.shape,
                crate::provenance::node_label(self, n.id)
            )?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        writeln!(f, "  outputs: {}", outs.join(", "))
    }
}
