//! The step of a row group (`crate::rowfuse`: a decomposed Softmax, LayerNorm or RMSNorm
//! over the last axis), at its first node: one pass per row. It covers the group's other
//! nodes.

use super::{input0, kernel_err, Run, Slot, Turn, REPLAY};
use crate::rowfuse::RowGroup;
use crate::CpuError;
use rlx_ir::{Graph, NodeId};

#[derive(Debug)]
pub(crate) struct RowStep {
    pub grp: RowGroup,
}

impl RowStep {
    /// The nodes after the first, whose values the group computes.
    pub(crate) fn covers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.grp.members().iter().copied()
    }

    /// The first node's turn (`id`): the group fused; with a scanner, replayed op by op
    /// when some member's value would not be finite (`rowfuse::run`).
    pub(crate) fn turn(&self, g: &Graph, id: NodeId, run: &mut Run) -> Result<Turn, CpuError> {
        let x = input0(g, id, &run.slots)?;
        match crate::rowfuse::run(&self.grp, x, run.scan)
            .map_err(|e| kernel_err(g, id, e.to_string()))?
        {
            Some(t) => {
                run.slots[self.grp.output().index()] = Slot::Owned(t);
                Ok(Turn::Done)
            }
            // Not all finite: replay op by op, so the scan names the op.
            None => {
                run.group[id.index()] |= REPLAY;
                Ok(Turn::Op)
            }
        }
    }
}
