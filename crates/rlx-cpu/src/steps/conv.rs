//! The step of a fused conv group (`crate::fuse`), at its conv: the conv on folded weights
//! with its epilogue, or interleaved with the depthwise group that alone reads it
//! (`fuse::run_pair`), or on weights scaled by the Mul before it (`fuse::run_scaled`);
//! without a scanner, with the residual Add (and Relu) after it. The nodes it covers: the
//! chain after the conv, the residual's Add and Relu, the scale Mul.

use super::{input0, input_values, kernel_err, Run, Slot, Step, Turn};
use super::{PAIRED, REPLAY, RESIDUAL, SCALE_PROVEN};
use crate::fuse::{ConvGroup, Residual, Scaled, Skip};
use crate::plan::Plan;
use crate::CpuError;
use rlx_ir::{BinaryOp, Graph, NodeId, Tensor};
use rlx_kernels::kernels::conv::{Packed, WinogradWeights};

/// A fused conv group and what its runs use.
#[derive(Debug)]
pub(crate) struct ConvStep {
    pub grp: ConvGroup,
    /// The per-channel scale Mul before the conv, folded into its weights at run time.
    pub scaled: Option<Scaled>,
    /// The conv of the depthwise group that alone reads this pointwise group's output
    /// (`fuse::run_pair` runs the two interleaved).
    pub then_dw: Option<NodeId>,
    /// The residual operand's buffer may become the conv's output (every other reader of
    /// the operand comes before the conv, and the Add is its last reader: `Skip::Owned`).
    pub res_take: bool,
    /// With folded weights: their Winograd transform (else the conv's own, in `Plan::wino`).
    pub wino: Option<std::sync::Arc<WinogradWeights>>,
    /// With folded weights: those packed for RLX's conv kernel (else `Plan::packed`).
    pub packed: Option<std::sync::Arc<Packed>>,
}

impl ConvStep {
    /// The nodes whose values the group computes besides the conv's (each a
    /// [`Step::Covered`]): the chain, the residual's Add and Relu, the scale Mul.
    pub(crate) fn covers(&self) -> impl Iterator<Item = NodeId> + '_ {
        let res = self.grp.residual.iter().flat_map(|r| [Some(r.add), r.relu]);
        let mul = self.scaled.map(|sc| sc.mul);
        self.grp
            .members
            .iter()
            .copied()
            .chain(res.flatten())
            .chain(mul)
    }

    /// The conv's turn (`id`, this step's node).
    pub(crate) fn turn(
        &self,
        plan: &Plan,
        g: &Graph,
        id: NodeId,
        run: &mut Run,
    ) -> Result<Turn, CpuError> {
        let i = id.index();
        let state = run.group[i];
        if state & PAIRED != 0 {
            // Computed with the pointwise group before it (`run_pair`).
            return Ok(Turn::Done);
        }
        if state & REPLAY != 0 {
            return Ok(Turn::Op);
        }
        if let Some(dw) = self
            .then_dw
            .filter(|dw| run.pairs_on && run.group[dw.index()] & REPLAY == 0)
        {
            if let Some(turn) = self.pair(plan, g, id, dw, run)? {
                return Ok(turn);
            }
        }
        if let Some(sc) = self
            .scaled
            .filter(|_| !run.scan || state & SCALE_PROVEN != 0)
        {
            return self.scaled(plan, g, id, sc, run);
        }
        self.group(plan, g, id, run)
    }

    /// The turn of a node this group covers ([`ConvStep::covers`]; the group's step is at
    /// `head`).
    pub(crate) fn covered_turn(&self, id: NodeId, head: NodeId, run: &mut Run) -> Turn {
        let state = run.group[head.index()];
        if let Some(sc) = self.scaled.filter(|sc| sc.mul == id) {
            return scale_turn(&sc, head, run);
        }
        let done = if self
            .grp
            .residual
            .is_some_and(|r| r.add == id || r.relu == Some(id))
        {
            state & RESIDUAL != 0
        } else {
            state & REPLAY == 0
        };
        if done {
            Turn::Done
        } else {
            Turn::Op
        }
    }

    /// This 1×1 group and the depthwise group at `dw` interleaved (`fuse::run_pair`): None
    /// where the kernel does not apply (the groups run on their own).
    fn pair(
        &self,
        plan: &Plan,
        g: &Graph,
        id: NodeId,
        dw: NodeId,
        run: &mut Run,
    ) -> Result<Option<Turn>, CpuError> {
        let Step::Conv(b) = &plan.steps[dw.index()] else {
            return Ok(None);
        };
        let x = input0(g, id, &run.slots)?;
        let pk = self.packed_weights(&plan.packed).filter(|_| run.fast);
        match crate::fuse::run_pair(g, &self.grp, &b.grp, x, pk, run.scan)
            .map_err(|e| kernel_err(g, id, e.to_string()))?
        {
            Some((t, true)) => {
                run.slots[b.grp.output().index()] = Slot::Owned(t);
                run.group[dw.index()] |= PAIRED;
                run.pairs += 1;
                Ok(Some(Turn::Done))
            }
            // Not clean (scanning): both groups op by op, so the scan names the op.
            Some((t, false)) => {
                rlx_kernels::buffers::give(t.into_data());
                run.group[id.index()] |= REPLAY;
                run.group[dw.index()] |= REPLAY;
                Ok(Some(Turn::Op))
            }
            None => Ok(None),
        }
    }

    /// The conv on the weights scaled by the Mul before it (`fuse::run_scaled`), the Mul
    /// not run.
    fn scaled(
        &self,
        plan: &Plan,
        g: &Graph,
        id: NodeId,
        sc: Scaled,
        run: &mut Run,
    ) -> Result<Turn, CpuError> {
        let grp = &self.grp;
        let pk = self.packed_weights(&plan.packed).filter(|_| run.fast);
        // The residual: not while scanning (the report must name the Add).
        let scan = run.scan;
        let res = grp.residual.filter(|_| !scan);
        let owned = res
            .filter(|_| self.res_take)
            .and_then(|r| run.slots[r.skip.index()].take_owned());
        let xs = input_values(g, id, &run.slots, &[sc.x, sc.s])?;
        let skip = skip_operand(g, id, &run.slots, res, owned)?;
        let (t, clean, folded) = crate::fuse::run_scaled(g, grp, xs[0], xs[1], pk, scan, skip)
            .map_err(|e| kernel_err(g, id, e.to_string()))?;
        if clean {
            drop(xs);
            run.slots[res.map_or(grp.output(), |r| r.output()).index()] = Slot::Owned(t);
            if res.is_some() {
                run.group[id.index()] |= RESIDUAL;
            }
            run.scaled += folded as u64;
            return Ok(Turn::Done);
        }
        // Not clean (scanning): make the skipped Mul's value (proven finite, its zero
        // counts already given) and replay the group op by op, so the scan names the op.
        rlx_kernels::buffers::give(t.into_data());
        let shape = &g.node(sc.mul).shape;
        let m = rlx_kernels::kernels::elementwise::binary(BinaryOp::Mul, xs[0], xs[1], shape)
            .map_err(|e| kernel_err(g, sc.mul, e.to_string()))?;
        drop(xs);
        run.slots[sc.mul.index()] = Slot::Owned(m);
        run.group[id.index()] |= REPLAY;
        Ok(Turn::Op)
    }

    /// The conv's weights packed for RLX's product kernel: the folded ones' (this step's),
    /// or the conv's own (`per_node`: the plan's, `Plan::packed`).
    pub(crate) fn packed_weights<'p>(
        &'p self,
        per_node: &'p [Option<std::sync::Arc<Packed>>],
    ) -> Option<&'p Packed> {
        match self.grp.folded {
            Some(_) => self.packed.as_deref(),
            None => per_node[self.grp.conv.index()].as_deref(),
        }
    }

    /// The group on its conv's input (`fuse::run_group`).
    fn group(&self, plan: &Plan, g: &Graph, id: NodeId, run: &mut Run) -> Result<Turn, CpuError> {
        let grp = &self.grp;
        let folded = grp.folded.is_some();
        let conv = grp.conv.index();
        let wg = if folded { &self.wino } else { &plan.wino[conv] };
        let wg = wg.as_deref().filter(|_| run.wino);
        let pk = self.packed_weights(&plan.packed).filter(|_| run.fast);
        // The residual: not while scanning, nor on the Winograd path (whose tiles would
        // read it scattered, slower than the Add's own pass).
        let res = grp.residual.filter(|_| !run.scan && wg.is_none());
        let owned = res
            .filter(|_| self.res_take)
            .and_then(|r| run.slots[r.skip.index()].take_owned());
        let x = input0(g, id, &run.slots)?;
        let skip = skip_operand(g, id, &run.slots, res, owned)?;
        let (t, clean) = crate::fuse::run_group(g, grp, x, wg, pk, run.scan, skip, None)
            .map_err(|e| kernel_err(g, id, e.to_string()))?;
        if clean {
            run.slots[res.map_or(grp.output(), |r| r.output()).index()] = Slot::Owned(t);
            if res.is_some() {
                run.group[id.index()] |= RESIDUAL;
            }
            Ok(Turn::Done)
        } else {
            // Replay this group op by op, so the scan names the op.
            run.group[id.index()] |= REPLAY;
            Ok(Turn::Op)
        }
    }
}

/// The turn of a scale Mul folded into the conv of the group at `head` (`fuse::Scaled`):
/// not run. With a scanner, only where its value is proven finite without it (its counts
/// are then zero); else it runs and is scanned, so a report names it.
fn scale_turn(sc: &Scaled, head: NodeId, run: &mut Run) -> Turn {
    let state = &mut run.group[head.index()];
    if *state & REPLAY != 0 {
        return Turn::Op;
    }
    if !run.scan {
        return Turn::Done;
    }
    let proven = match (run.slots[sc.x.index()].get(), run.slots[sc.s.index()].get()) {
        (Some(x), Some(s)) => crate::fuse::scale_is_finite(
            sc,
            x,
            s,
            run.finite[sc.x.index()],
            run.finite[sc.s.index()],
        ),
        _ => false,
    };
    if proven {
        *state |= SCALE_PROVEN;
        Turn::Done
    } else {
        *state &= !SCALE_PROVEN;
        Turn::Op
    }
}

/// The operand of a fused group's residual `res` for this run: `owned`, its buffer already
/// taken from its slot (`ConvStep::res_take`), or else its value borrowed from there.
fn skip_operand<'a>(
    g: &Graph,
    id: NodeId,
    slots: &'a [Slot],
    res: Option<Residual>,
    owned: Option<Tensor>,
) -> Result<Option<Skip<'a>>, CpuError> {
    Ok(match (res, owned) {
        (_, Some(t)) => Some(Skip::Owned(t)),
        (Some(r), None) => Some(Skip::Borrowed(input_values(g, id, slots, &[r.skip])?[0])),
        (None, None) => None,
    })
}
