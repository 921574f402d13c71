//! The steps of the CPU executor's plan (`crate::plan::Plan::steps`): one per node, in node
//! order, each knowing what its node's turn in a run does.
//!
//! * [`Step::Node`]: the node runs op by op (`node::run_op`: in-place takeover of a dying
//!   input, a MatMul reading a Transpose in place, packed and Winograd conv weights);
//! * [`Step::View`]: a Transpose that its MatMul reads in place (`node`), not run;
//! * [`Step::Conv`]: a fused conv group at its conv (`conv`: the folded conv and its
//!   epilogue, a 1×1 + depthwise pair, a scale Mul folded at run time, a residual Add);
//! * [`Step::Rows`]: a decomposed Softmax/LayerNorm/RMSNorm at its first node (`rows`);
//! * [`Step::Chain`]: an elementwise chain at its first node (`chain`);
//! * [`Step::Covered`]: a node whose value the group at another node computes (its
//!   members, a conv group's residual Add/Relu or scale Mul; each group's `covers`).
//!
//! A group's step runs it fused at its turn and says [`Turn::Done`]; a covered node's turn
//! is then Done too (its value was made with the group, finite when scanned). Covered nodes
//! keep their own turns, so scan reports, releases of dead values and the borrowing of
//! constants happen at the same place in the order as op by op. The unfused replay for the
//! NaN scan: a group whose fused value is not clean marks itself [`REPLAY`] for the run and
//! says [`Turn::Op`], so its first node runs op by op at once and each covered node at its
//! own turn (the report names the op that made the value, as with fusion off). Runs
//! without fusion (fusion off, hooks) give every node [`Turn::Op`].

pub(crate) mod chain;
pub(crate) mod conv;
pub(crate) mod node;
pub(crate) mod rows;

use crate::CpuError;
use rlx_ir::provenance::node_label;
use rlx_ir::{Graph, NodeId, Tensor};

/// What one node's turn in a run does ([`crate::plan::Plan::steps`], one per node).
#[derive(Debug)]
pub(crate) enum Step {
    /// Run the node op by op (leaves: borrow their value).
    Node,
    /// A Transpose that a MatMul reads in place (`node::view_turn`).
    View,
    /// A fused conv group, at its conv.
    Conv(Box<conv::ConvStep>),
    /// A row group, at its first node.
    Rows(Box<rows::RowStep>),
    /// An elementwise chain, at its first node.
    Chain(Box<chain::ChainStep>),
    /// A node whose value the group whose step is at node `head` computes.
    Covered { head: NodeId },
}

/// What a node's turn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Its value was computed by its group (here or at the group's step), finite when
    /// scanned: record it clean, do not run it.
    Done,
    /// Run it op by op now (a plain node, or one of a group replayed in this run).
    Op,
}

// A group's flags in one run, at the node of its step ([`Run::group`]).

/// The group replays op by op in this run (its fused value was not clean).
pub(crate) const REPLAY: u8 = 1;
/// A depthwise group whose value its pointwise group's pair computed.
pub(crate) const PAIRED: u8 = 2;
/// The group computed its residual Add (and Relu).
pub(crate) const RESIDUAL: u8 = 4;
/// With a scanner: the group's scale Mul was proven finite and skipped.
pub(crate) const SCALE_PROVEN: u8 = 8;

/// One run's values and what its steps decided (`CpuExecutor::run_inner` makes one).
pub(crate) struct Run<'a> {
    pub slots: Vec<Slot<'a>>,
    /// With a scanner: per node, its output was found (or is known) clean; empty without.
    pub finite: Vec<bool>,
    /// Per node that holds a group's step: the group's flags in this run ([`REPLAY`], ...);
    /// empty in runs without fusion.
    pub group: Vec<u8>,
    /// A NaN scanner is on.
    pub scan: bool,
    /// Winograd convs may run (not in hooked runs).
    pub wino: bool,
    /// RLX's own conv kernel on packed weights may run (not in hooked runs).
    pub fast: bool,
    /// 1×1 + depthwise pairs may run interleaved (`CpuExecutor::set_pairing`).
    pub pairs_on: bool,
    /// Interleaved pair results used in this run.
    pub pairs: u64,
    /// Scaled-conv results used in this run.
    pub scaled: u64,
}

impl Step {
    /// Node `id`'s turn in a fused run (`plan`: the plan whose step this is).
    pub(crate) fn turn(
        &self,
        plan: &crate::plan::Plan,
        g: &Graph,
        id: NodeId,
        run: &mut Run,
    ) -> Result<Turn, CpuError> {
        match self {
            Step::Node => Ok(Turn::Op),
            Step::View => Ok(node::view_turn(g, id, run)),
            Step::Conv(c) => c.turn(plan, g, id, run),
            Step::Rows(r) => r.turn(g, id, run),
            Step::Chain(c) => c.turn(g, id, run),
            Step::Covered { head } => Ok(match &plan.steps[head.index()] {
                Step::Conv(c) => c.covered_turn(id, *head, run),
                _ => replayed_or_done(run, *head),
            }),
        }
    }
}

/// The turn of a node covered by the group at `head` that computes it with the group's
/// value: op by op when the group replays in this run, else done.
fn replayed_or_done(run: &Run, head: NodeId) -> Turn {
    if run.group[head.index()] & REPLAY != 0 {
        Turn::Op
    } else {
        Turn::Done
    }
}

/// A node's value during a run: borrowed (inputs, params, constants) or owned (computed).
pub(crate) enum Slot<'a> {
    Empty,
    Borrowed(&'a Tensor),
    Owned(Tensor),
}

impl Slot<'_> {
    pub(crate) fn get(&self) -> Option<&Tensor> {
        match self {
            Slot::Empty => None,
            Slot::Borrowed(t) => Some(t),
            Slot::Owned(t) => Some(t),
        }
    }

    /// The slot's tensor when it owns one (the slot is then empty); else None, slot kept.
    pub(crate) fn take_owned(&mut self) -> Option<Tensor> {
        match std::mem::replace(self, Slot::Empty) {
            Slot::Owned(t) => Some(t),
            other => {
                *self = other;
                None
            }
        }
    }
}

/// The values of node `id`'s `inputs`, inline for up to 4 (no heap allocation per node per
/// run); an error naming the input when one has no value.
pub(crate) fn input_values<'a>(
    g: &Graph,
    id: NodeId,
    slots: &'a [Slot],
    inputs: &[NodeId],
) -> Result<smallvec::SmallVec<[&'a Tensor; 4]>, CpuError> {
    inputs
        .iter()
        .map(|i| {
            slots[i.index()]
                .get()
                .ok_or_else(|| kernel_err(g, id, format!("input {i} has no value")))
        })
        .collect()
}

/// Node `id`'s input 0, an error when it has no value.
pub(crate) fn input0<'a>(g: &Graph, id: NodeId, slots: &'a [Slot]) -> Result<&'a Tensor, CpuError> {
    slots[g.node(id).inputs[0].index()]
        .get()
        .ok_or_else(|| kernel_err(g, id, "input 0 has no value"))
}

/// Empties a dead value's slot, handing an owned buffer to the active pool.
pub(crate) fn release(slot: &mut Slot) {
    if let Slot::Owned(t) = std::mem::replace(slot, Slot::Empty) {
        rlx_kernels::buffers::give(t.into_data());
    }
}

pub(crate) fn kernel_err(g: &Graph, id: NodeId, msg: impl Into<String>) -> CpuError {
    CpuError::Kernel {
        node: id,
        op: g.node(id).op.name(),
        label: node_label(g, id),
        msg: msg.into(),
    }
}
