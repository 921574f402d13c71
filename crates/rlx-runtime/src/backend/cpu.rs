//! The CPU backend: [`rlx_cpu::CpuExecutor`], always present.

use super::{Backend, Coverage, Placement};
use crate::printer::PrinterConfig;
use crate::{Device, RuntimeError};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugScanner;
use rlx_ir::{DType, Graph, NodeId, Tensor};

pub(super) fn describe() -> String {
    // The machine's cores (the pool's size is set per run: --threads, RAYON_NUM_THREADS).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("cpu ({cores} cores)")
}

pub(super) fn open(g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
    Ok(Box::new(CpuExecutor::new(g)?))
}

impl Backend for CpuExecutor {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn describe(&self) -> String {
        describe()
    }

    fn graph(&self) -> &Graph {
        CpuExecutor::graph(self)
    }

    fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError> {
        Ok(CpuExecutor::set_param(self, name, t)?)
    }

    fn run(
        &mut self,
        inputs: &[&Tensor],
        scanner: Option<&mut DebugScanner>,
        printer: &PrinterConfig,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        Ok(crate::printer::run_cpu(self, inputs, scanner, printer)?)
    }

    fn run_all(&mut self, inputs: &[&Tensor]) -> Result<Vec<Option<Tensor>>, RuntimeError> {
        let mut all: Vec<Option<Tensor>> = vec![None; CpuExecutor::graph(self).len()];
        self.run_hooked(
            inputs,
            None,
            None,
            Some(&mut |id: NodeId, t: &Tensor| all[id.index()] = Some(t.clone())),
        )?;
        Ok(all)
    }

    fn run_observed(
        &mut self,
        inputs: &[&Tensor],
        observe: &mut dyn FnMut(NodeId, &Tensor),
    ) -> Result<Vec<Tensor>, RuntimeError> {
        Ok(self.run_hooked(inputs, None, None, Some(observe))?)
    }

    fn placements(&self) -> Vec<(NodeId, Placement)> {
        super::compute_nodes(CpuExecutor::graph(self))
            .map(|n| (n.id, Placement::Device))
            .collect()
    }

    fn coverage(&self) -> Coverage {
        Coverage::all(CpuExecutor::graph(self))
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn set_profiling(&mut self, on: bool) -> Result<(), RuntimeError> {
        CpuExecutor::set_profiling(self, on);
        Ok(())
    }

    fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
        CpuExecutor::profile(self)
    }
}
