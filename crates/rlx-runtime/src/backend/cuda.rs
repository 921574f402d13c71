//! The CUDA backend ([`rlx_cuda::CudaExecutor`], feature `cuda`), or its stand-in when the
//! feature is off. Nothing of CUDA is needed to build: the driver, NVRTC and cuBLAS are
//! loaded when a process first asks for the device.

#[cfg(feature = "cuda")]
pub(super) use real::{open, probe};
#[cfg(not(feature = "cuda"))]
pub(super) use stand_in::{open, probe};

#[cfg(feature = "cuda")]
mod real {
    use crate::backend::{Backend, Placement};
    use crate::printer::PrinterConfig;
    use crate::{Device, RuntimeError};
    use rlx_cuda::{CudaError, CudaExecutor};
    use rlx_ir::numeric_check::DebugScanner;
    use rlx_ir::{DType, Graph, NodeId, Tensor};

    pub(in crate::backend) fn probe() -> Result<String, String> {
        rlx_cuda::probe().map(|i| {
            format!(
                "{} (compute capability {}.{}, {} MiB)",
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.total_mem >> 20
            )
        })
    }

    pub(in crate::backend) fn open(g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
        if probe().is_err() {
            return Err(RuntimeError::DeviceUnavailable(Device::Cuda));
        }
        Ok(Box::new(CudaExecutor::new(g).map_err(err)?))
    }

    /// CUDA's errors as the runtime's (as for wgpu).
    fn err(e: CudaError) -> RuntimeError {
        match e {
            CudaError::NanAbort(a) => RuntimeError::NanAbort(a),
            CudaError::Input(m) | CudaError::Param(m) => RuntimeError::Input(m),
            CudaError::NoDevice(_) => RuntimeError::DeviceUnavailable(Device::Cuda),
            e @ (CudaError::Kernel { .. } | CudaError::Cuda(_)) => {
                RuntimeError::Backend(format!("cuda: {e}"))
            }
        }
    }

    impl Backend for CudaExecutor {
        fn device(&self) -> Device {
            Device::Cuda
        }

        fn describe(&self) -> String {
            format!("cuda ({})", self.device_name())
        }

        fn graph(&self) -> &Graph {
            CudaExecutor::graph(self)
        }

        fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError> {
            CudaExecutor::set_param(self, name, t).map_err(err)
        }

        fn run(
            &mut self,
            inputs: &[&Tensor],
            scanner: Option<&mut DebugScanner>,
            printer: &PrinterConfig,
        ) -> Result<Vec<Tensor>, RuntimeError> {
            if printer.level >= 3 {
                // Each node's "running" line before its launch, and a synchronization after
                // it, so the last line printed names the kernel that failed.
                let g = CudaExecutor::graph(self).clone();
                let mut before = |id: NodeId| {
                    if let Some(l) = printer.line_before(&g, id) {
                        use std::io::Write;
                        let mut e = std::io::stderr().lock();
                        let _ = writeln!(e, "{l}");
                        let _ = e.flush();
                    }
                };
                let all = CudaExecutor::run_all_hooked(self, inputs, &mut before).map_err(err)?;
                return crate::backend::report_all(&g, &all, scanner, printer, true);
            }
            if printer.is_on() {
                return crate::backend::run_all_then_report(self, inputs, scanner, printer);
            }
            CudaExecutor::run(self, inputs, scanner).map_err(err)
        }

        fn run_all(&mut self, inputs: &[&Tensor]) -> Result<Vec<Option<Tensor>>, RuntimeError> {
            CudaExecutor::run_all(self, inputs).map_err(err)
        }

        fn set_profiling(&mut self, on: bool) -> Result<(), RuntimeError> {
            CudaExecutor::set_profiling(self, on);
            Ok(())
        }

        fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
            CudaExecutor::profile(self)
        }

        fn set_device_timing(&mut self, on: bool) -> bool {
            CudaExecutor::set_device_timing(self, on);
            true
        }

        fn last_device_ms(&self) -> Option<f64> {
            CudaExecutor::last_device_ms(self)
        }

        fn placements(&self) -> Vec<(NodeId, Placement)> {
            CudaExecutor::placements(self)
                .into_iter()
                .map(|(id, p)| {
                    (
                        id,
                        match p {
                            rlx_cuda::Placement::Gpu => Placement::Device,
                            rlx_cuda::Placement::CpuFallback { reason } => {
                                Placement::CpuFallback { reason }
                            }
                        },
                    )
                })
                .collect()
        }

        fn dtypes(&self) -> &'static [DType] {
            &[
                DType::F32,
                DType::F16,
                DType::BF16,
                DType::I64,
                DType::I32,
                DType::U32,
                DType::Bool,
            ]
        }
    }
}

/// Compiled when the `cuda` feature is off: no CUDA device, and a message that says why.
#[cfg(not(feature = "cuda"))]
mod stand_in {
    use crate::backend::Backend;
    use crate::{Device, RuntimeError};
    use rlx_ir::Graph;

    pub(in crate::backend) fn probe() -> Result<String, String> {
        Err("this build of RLX was made without the CUDA backend (cargo feature `cuda`)".into())
    }

    pub(in crate::backend) fn open(g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
        let _ = g;
        Err(RuntimeError::DeviceUnavailable(Device::Cuda))
    }
}
