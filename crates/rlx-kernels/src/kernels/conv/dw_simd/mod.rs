//! f32 depthwise 2-D conv with SIMD (x86-64: AVX-512F, else AVX2+FMA; picked at run
//! time) for 3×3, 5×5 and 7×7 kernels, in three paths: per output row ([`rows`]), flat
//! over zero-padded phase planes ([`flat`], AVX-512) and by blocks of channels in the
//! lanes of a register ([`cblock`]). [`run_with`] picks the path; each gives the same bits
//! (see each file). The kernels are written over the lane types of
//! [`crate::kernels::simd`].

mod cblock;
mod flat;
mod rows;

use super::common::{Epilogue, Geo};
#[cfg(test)]
pub(super) use cblock::cblock_plan;
use cblock::run_cblock;
pub(super) use cblock::{cblock_on, cblock_plan_stripe, cblock_stripe, CBlock};
use flat::run_flat;
pub(super) use flat::{flat_plan, s2_plane, Flat, S2Fn};
pub(super) use rows::{plan, rows_avx512, Plan, RowsFn};
use rows::{run_avx2, run_avx512, run_avx512y};

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Isa {
    /// AVX-512F and VL: 16 lanes, or 8 ([`Avx512Y`]) for planes at most 8 wide.
    Avx512,
    /// AVX-512F and VL on 8 lanes only (for tests: [`run`] picks it by plane width).
    #[cfg_attr(not(test), allow(dead_code))]
    Avx512Y,
    /// [`Isa::Avx512`] without the flat path (for tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Avx512Rows,
    /// AVX2 + FMA: the channel blocks ([`cblock8`]) where they apply, else 8 lanes per row.
    Avx2,
    /// [`Isa::Avx2`] without the channel blocks (for tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Avx2Rows,
}

pub(super) fn best_isa() -> Option<Isa> {
    use std::sync::OnceLock;
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    // The CPU's best, or less with RLX_CPU_ISA (`crate::kernels::simd::isa_cap`).
    *ISA.get_or_init(|| match crate::kernels::simd::isa_cap() {
        crate::kernels::simd::IsaCap::Avx512 => Some(Isa::Avx512),
        crate::kernels::simd::IsaCap::Avx2 => Some(Isa::Avx2),
        crate::kernels::simd::IsaCap::Portable => None,
    })
}

/// The SIMD path with `isa` (which the CPU must support: [`best_isa`] or weaker).
/// `finite_w`: every weight is finite (the flat path needs it).
/// `epi`: the bias, the clamp applied in registers (the identity without one), the `post`
/// run on each output plane, and where to fold the largest |y| bits before the clamp.
pub(super) fn run_with(
    isa: Isa,
    finite_w: bool,
    x: &[f32],
    w: &[f32],
    g: &Geo,
    epi: &Epilogue,
) -> Option<Vec<f32>> {
    if !matches!((g.ks[0], g.ks[1]), (3, 3) | (5, 5) | (7, 7)) {
        return None;
    }
    let p = g.osp[0] * g.osp[1];
    // Every output element is stored (each row's chunks cover it).
    let mut out = crate::buffers::overwritten(g.n * g.m * p);
    if p == 0 || g.sp[0] == 0 || g.sp[1] == 0 {
        return None;
    }
    // The caller picked an `isa` the CPU supports.
    match isa {
        Isa::Avx512 if finite_w && cblock_on() && run_cblock(false, x, w, g, &mut out, epi) => {}
        Isa::Avx2 if finite_w && cblock_on() && run_cblock(true, x, w, g, &mut out, epi) => {}
        Isa::Avx512 if finite_w && run_flat(x, w, g, &mut out, epi) => {}
        Isa::Avx512 | Isa::Avx512Rows if g.osp[1] <= 8 => run_avx512y(x, w, g, &mut out, epi),
        Isa::Avx512 | Isa::Avx512Rows => run_avx512(x, w, g, &mut out, epi),
        Isa::Avx512Y => run_avx512y(x, w, g, &mut out, epi),
        Isa::Avx2 | Isa::Avx2Rows => run_avx2(x, w, g, &mut out, epi),
    }
    Some(out)
}

/// [`run_with`] at the best ISA, for finite weights only (`conv_post` checks them).
pub(super) fn run(x: &[f32], w: &[f32], g: &Geo, epi: &Epilogue) -> Option<Vec<f32>> {
    run_with(best_isa()?, true, x, w, g, epi)
}
