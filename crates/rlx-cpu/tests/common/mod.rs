//! Helpers shared by the rlx-cpu integration tests.

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG, top 24 bits).
#[allow(dead_code)] // not every test file that includes `common` uses it
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A scanner report as the fusion tests compare them: node, element index, label.
#[allow(dead_code)] // not every test file that includes `common` scans
pub type Report = (rlx_ir::NodeId, usize, String);

/// Run `ex` on `ins` with a NaN/Inf scanner in `mode` (not printing): its reports and the
/// first output as f32.
#[allow(dead_code)]
pub fn run_scanned(
    ex: &mut rlx_cpu::CpuExecutor,
    ins: &[rlx_ir::Tensor],
    mode: rlx_ir::numeric_check::DebugMode,
) -> (Vec<Report>, Vec<f32>) {
    let mut sc = rlx_ir::DebugScanner::new(mode, "cpu");
    sc.set_print(false);
    let y = ex.run(ins, Some(&mut sc)).unwrap();
    let r = sc
        .reports()
        .iter()
        .map(|r| (r.node, r.index, r.label.clone()))
        .collect();
    (r, y[0].as_f32().unwrap().to_vec())
}
