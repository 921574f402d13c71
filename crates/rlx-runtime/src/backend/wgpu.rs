//! The wgpu backend ([`rlx_wgpu::WgpuExecutor`], feature `gpu`), or its stand-in when the
//! feature is off.

#[cfg(feature = "gpu")]
pub(super) use real::{open, probe};
#[cfg(not(feature = "gpu"))]
pub(super) use stand_in::{open, probe};

#[cfg(feature = "gpu")]
mod real {
    use crate::backend::{Backend, Placement};
    use crate::printer::PrinterConfig;
    use crate::{Device, RuntimeError};
    use rlx_ir::numeric_check::DebugScanner;
    use rlx_ir::{DType, Graph, NodeId, Tensor};
    use rlx_wgpu::{WgpuError, WgpuExecutor};

    pub(in crate::backend) fn probe() -> Result<String, String> {
        rlx_wgpu::probe()
            .map(|a| format!("{} ({:?})", a.name, a.backend))
            .ok_or_else(|| match std::env::var("WGPU_BACKEND") {
                // This build has Vulkan only: another backend name finds nothing.
                Ok(b) if !b.trim().is_empty() && !b.trim().eq_ignore_ascii_case("vulkan") => format!(
                    "wgpu found no adapter with WGPU_BACKEND={b:?} (this build has the Vulkan backend only)"
                ),
                _ => "wgpu found no adapter (no Vulkan driver or GPU)".to_string(),
            })
    }

    pub(in crate::backend) fn open(g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
        if probe().is_err() {
            return Err(RuntimeError::DeviceUnavailable(Device::Wgpu));
        }
        Ok(Box::new(WgpuExecutor::new(g).map_err(err)?))
    }

    /// wgpu's errors as the runtime's: inputs and parameters as [`RuntimeError::Input`], a
    /// NaN abort as [`RuntimeError::NanAbort`], the rest as [`RuntimeError::Backend`].
    fn err(e: WgpuError) -> RuntimeError {
        match e {
            WgpuError::NanAbort(a) => RuntimeError::NanAbort(a),
            WgpuError::Input(m) | WgpuError::Param(m) => RuntimeError::Input(m),
            WgpuError::NoAdapter(_) => RuntimeError::DeviceUnavailable(Device::Wgpu),
            e @ (WgpuError::Kernel { .. } | WgpuError::Gpu(_)) => {
                RuntimeError::Backend(format!("wgpu: {e}"))
            }
        }
    }

    impl Backend for WgpuExecutor {
        fn device(&self) -> Device {
            Device::Wgpu
        }

        fn describe(&self) -> String {
            let a = self.adapter_info();
            format!("wgpu ({}, {:?})", a.name, a.backend)
        }

        fn graph(&self) -> &Graph {
            WgpuExecutor::graph(self)
        }

        fn set_param(&mut self, name: &str, t: Tensor) -> Result<(), RuntimeError> {
            WgpuExecutor::set_param(self, name, t).map_err(err)
        }

        fn run(
            &mut self,
            inputs: &[&Tensor],
            scanner: Option<&mut DebugScanner>,
            printer: &PrinterConfig,
        ) -> Result<Vec<Tensor>, RuntimeError> {
            if printer.is_on() {
                return crate::backend::run_all_then_report(self, inputs, scanner, printer);
            }
            WgpuExecutor::run(self, inputs, scanner).map_err(err)
        }

        fn run_all(&mut self, inputs: &[&Tensor]) -> Result<Vec<Option<Tensor>>, RuntimeError> {
            WgpuExecutor::run_all(self, inputs).map_err(err)
        }

        fn placements(&self) -> Vec<(NodeId, Placement)> {
            WgpuExecutor::placements(self)
                .into_iter()
                .map(|(id, p)| {
                    (
                        id,
                        match p {
                            rlx_wgpu::Placement::Gpu => Placement::Device,
                            rlx_wgpu::Placement::CpuFallback { reason } => {
                                Placement::CpuFallback { reason }
                            }
                        },
                    )
                })
                .collect()
        }

        fn set_device_timing(&mut self, on: bool) -> bool {
            WgpuExecutor::set_device_timing(self, on)
        }

        fn set_profiling(&mut self, on: bool) -> Result<(), RuntimeError> {
            WgpuExecutor::set_profiling(self, on).map_err(err)
        }

        fn profile(&self) -> Option<&rlx_cpu::NodeTimes> {
            WgpuExecutor::profile(self)
        }

        fn last_device_ms(&self) -> Option<f64> {
            WgpuExecutor::last_device_ms(self)
        }

        fn dtypes(&self) -> &'static [DType] {
            &[
                DType::F32,
                DType::F16,
                DType::BF16,
                DType::I64,
                DType::I32,
                DType::Bool,
            ]
        }
    }
}

/// Compiled when the `gpu` feature is off: no wgpu device, and a message that says why.
#[cfg(not(feature = "gpu"))]
mod stand_in {
    use crate::backend::Backend;
    use crate::{Device, RuntimeError};
    use rlx_ir::Graph;

    pub(in crate::backend) fn probe() -> Result<String, String> {
        Err("this build of RLX was made without the wgpu backend (cargo feature `gpu`)".into())
    }

    pub(in crate::backend) fn open(g: Graph) -> Result<Box<dyn Backend>, RuntimeError> {
        let _ = g;
        Err(RuntimeError::DeviceUnavailable(Device::Wgpu))
    }
}
