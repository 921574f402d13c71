//! The step of an elementwise chain (`crate::ewfuse`), at its first op: the chain block by
//! block. It covers the chain's other ops.

use super::{input_values, kernel_err, Run, Slot, Turn, REPLAY};
use crate::ewfuse::EwGroup;
use crate::CpuError;
use rlx_ir::{Graph, NodeId, Op, Tensor};

#[derive(Debug)]
pub(crate) struct ChainStep {
    pub grp: EwGroup,
}

impl ChainStep {
    /// The ops after the first, whose values the chain computes.
    pub(crate) fn covers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.grp.members()[1..].iter().copied()
    }

    /// The first op's turn (`id`): the chain fused; with a scanner, replayed op by op when
    /// some block is not finite (`ewfuse::run`).
    pub(crate) fn turn(&self, g: &Graph, id: NodeId, run: &mut Run) -> Result<Turn, CpuError> {
        let grp = &self.grp;
        // Without a scanner (no replay), an operand that dies in the chain gives its
        // buffer for the output.
        let own = grp
            .reusable()
            .filter(|_| !run.scan)
            .and_then(|k| Some((k, run.slots[grp.externals()[k].index()].take_owned()?)));
        let own_k = own.as_ref().map(|o| o.0);
        let slots = &run.slots;
        let ext = grp
            .externals()
            .iter()
            .enumerate()
            .map(|(k, &x)| match &g.node(x).op {
                _ if Some(k) == own_k => Ok(None),
                Op::Constant(t) => Ok(Some(t.as_ref())),
                _ => input_values(g, id, slots, &[x]).map(|v| Some(v[0])),
            })
            .collect::<Result<smallvec::SmallVec<[Option<&Tensor>; 4]>, _>>()?;
        let r = crate::ewfuse::run(grp, &ext, own, run.scan)
            .map_err(|e| kernel_err(g, id, e.to_string()))?;
        drop(ext);
        match r {
            Some(t) => {
                run.slots[grp.output().index()] = Slot::Owned(t);
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
