//! MatMul against constant f32 weights packed once into column panels.
//!
//! For `y = a · B` with row-major `y`, gemm computes the transposed product and takes `Bᵀ`
//! as its left operand, which it copies into packed panels of its micro-kernel's rows on
//! every call: for all-MiniLM-L6's weights that copy was 5.3% of the model's profile
//! (`gemm_common::pack_operands::pack_lhs`). Here `B` ([K, N]) is copied once, when the
//! executor is built, into panels of [`panel_width`] columns (panel `p`: columns
//! `[p·w, p·w + w)` as K rows of `w`, the last panel the `N mod w` columns left), which is
//! the layout gemm's packing makes; each panel's product is one gemm call reading it in
//! place (gemm's lhs packing threshold at its largest, `gemm_calls::NO_LHS_PACKING`, while
//! the calls run). The micro-kernel and its sums are gemm's: the values are gemm's to
//! rounding (its block sizes follow the call's shape), bit for bit on the models measured.
//!
//! Taken on AMD CPUs with AVX-512 only, where gemm's f32 micro-kernel has 4 × 16 rows and
//! the panel width is 64 (measured there: all-MiniLM-L6 at 1 thread 89.7 → 85.7 ms on Zen
//! 4; panels of 128 or 192 read 86.4 and 89.3); on the Intel Xeon measured they gained
//! nothing ([`panel_width`]); elsewhere gemm packs as before. Products of few rows
//! (decode: `matvec`) keep the unpacked weights (the executor keeps them).

use super::gemm_calls::{gemm_uninit_ptr, LhsLevel, LhsPacking, View, GEMM_PAR_FLOPS};
use super::matvec::Ptr;
use super::{invalid, make, KResult};
use rayon::prelude::*;
use rlx_ir::{Shape, Tensor, TensorData};

/// Fewest rows of `a` for which [`matmul_packed`] runs (below, `matmul` takes the unpacked
/// weights: `matvec` for decode's few rows).
pub const MIN_ROWS: usize = 64;

/// Weights `B` ([K, N], f32) in panels of `width` columns (see the module).
#[derive(Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    width: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// `B`'s rows (the product's inner dimension).
    pub fn k(&self) -> usize {
        self.k
    }
    /// `B`'s columns (the product's output columns).
    pub fn n(&self) -> usize {
        self.n
    }
    /// Bytes of packed weights held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
    /// Panel `p`: its first column, its width, and its data (K rows of that width).
    fn panel(&self, p: usize) -> (usize, usize, &[f32]) {
        let c0 = p * self.width;
        let w = self.width.min(self.n - c0);
        (c0, w, &self.data[c0 * self.k..(c0 + w) * self.k])
    }
    fn panels(&self) -> usize {
        self.n.div_ceil(self.width)
    }
}

/// The panel width where products against panels beat gemm's own packing: 64 on AMD CPUs
/// with AVX-512 (gemm's f32 micro-kernel rows; within `RLX_CPU_ISA`), else `None`; `None`
/// with `RLX_CPU_MK=0` too (gemm packs the weights each call, for A/B). On the Intel Xeon
/// measured (2 MB of L2 a core) gemm's own packing costs about nothing: a product of
/// MiniLM's linear shapes read 6.39 ms with panels against 6.33 without (median of 5
/// interleaved minimums, 1 thread; equal at 2 threads), so Intel keeps gemm.
pub fn panel_width() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if !rlx_ir::env::is_off("RLX_CPU_MK") {
        use super::simd::{amd, isa_cap, IsaCap};
        if isa_cap() == IsaCap::Avx512 && amd() && std::arch::is_x86_feature_detected!("avx512f") {
            return Some(64);
        }
    }
    None
}

/// `b` ([K, N] f32, N at least one panel wide, K > 0) packed in panels, or `None` where
/// [`panel_width`] is `None` or `b` is not such a tensor.
pub fn pack(b: &Tensor) -> Option<PackedB> {
    let width = panel_width()?;
    let (&[k, n], Some(src)) = (b.dims(), b.as_f32()) else {
        return None;
    };
    if n < width || k == 0 {
        return None;
    }
    let mut data = Vec::with_capacity(k * n);
    for c0 in (0..n).step_by(width) {
        let c1 = (c0 + width).min(n);
        for row in src.chunks_exact(n) {
            data.extend_from_slice(&row[c0..c1]);
        }
    }
    Some(PackedB { k, n, width, data })
}

/// `np.matmul(a, B)` for `a` of dims `[..., M, K]` (f32, contiguous, at least
/// [`MIN_ROWS`] rows over its leading dims) and the packed `B` ([K, N]): dims `[..., M, N]`
/// (`out`'s). `None` where `a` is not such a tensor (the caller takes `matmul`). Errors:
/// `out` not of `a`'s leading dims and N.
pub fn matmul_packed(a: &Tensor, pk: &PackedB, out: &Shape) -> Option<KResult<Tensor>> {
    let (av, dims) = (a.as_f32()?, a.dims());
    if dims.len() < 2 || dims[dims.len() - 1] != pk.k {
        return None;
    }
    let (m, k, n) = (av.len() / pk.k, pk.k, pk.n);
    if m < MIN_ROWS {
        return None;
    }
    let want: Vec<usize> = dims[..dims.len() - 1].iter().copied().chain([n]).collect();
    if out.dims_usize().as_slice() != want.as_slice() {
        return Some(invalid(format!(
            "matmul: output dims {:?}, expected {want:?}",
            out.dims_usize()
        )));
    }
    let mut y: Vec<f32> = crate::buffers::take(m * n);
    // Shared by the panels' products: each writes its own columns.
    let dst = Ptr(y.spare_capacity_mut()[..m * n].as_mut_ptr().cast::<f32>());
    let a_view = View {
        data: av,
        off: 0,
        rs: k,
        cs: 1,
    };
    let _lhs = LhsPacking::set(LhsLevel::Panels);
    let panel = |p: usize| {
        let (c0, w, data) = pk.panel(p);
        let b_view = View {
            data,
            off: 0,
            rs: w,
            cs: 1,
        };
        // SAFETY: y holds m×n; this panel writes rows 0..m, columns c0..c0 + w (row
        // stride n), inside it and apart from the other panels' columns.
        unsafe {
            gemm_uninit_ptr(
                m,
                w,
                k,
                a_view,
                b_view,
                dst.get().add(c0),
                (n, 1),
                false,
                false,
            )
        }
    };
    let par = rayon::current_num_threads() > 1 && m * n * k >= GEMM_PAR_FLOPS;
    let r = if par {
        (0..pk.panels()).into_par_iter().try_for_each(panel)
    } else {
        (0..pk.panels()).try_for_each(panel)
    };
    if let Err(e) = r {
        return Some(Err(e));
    }
    // SAFETY: the panels cover columns 0..n of every row: all m×n elements written.
    unsafe { y.set_len(m * n) };
    Some(make(want, TensorData::F32(y)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::rnd;
    use rlx_ir::DType;

    fn t(dims: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_f32(dims, v).unwrap()
    }

    /// `a · b` in f64, and the sum of `|a||b|` per output (the rounding bound's scale).
    fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
        let (mut y, mut s) = (vec![0f64; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for t in 0..k {
                let x = a[i * k + t] as f64;
                for j in 0..n {
                    y[i * n + j] += x * b[t * n + j] as f64;
                    s[i * n + j] += (x * b[t * n + j] as f64).abs();
                }
            }
        }
        (y, s)
    }

    #[test]
    fn panels_give_the_product_within_gemm_rounding() {
        let Some(w) = panel_width() else {
            // No AVX-512 (or RLX_CPU_MK=0): nothing is packed, MatMul takes gemm.
            assert!(pack(&t(&[8, 128], rnd(1024, 1))).is_none());
            return;
        };
        assert_eq!(w, 64);
        // Odd K, N under one panel (not packed), one panel, a tail of 1, 36 and 8 columns,
        // MiniLM's FFN, rows over leading dims.
        for (lead, k, n) in [
            (vec![64], 1, 64),
            (vec![65], 7, 65),
            (vec![3, 40], 384, 100),
            (vec![100], 33, 200),
            (vec![3, 128], 384, 1536),
            (vec![130], 1000, 72),
            (vec![64], 16, 63),
        ] {
            let m: usize = lead.iter().product();
            let (av, bv) = (rnd(m * k, m as u64), rnd(k * n, k as u64 + 7));
            let mut ad = lead.clone();
            ad.push(k);
            let (a, b) = (t(&ad, av.clone()), t(&[k, n], bv.clone()));
            let Some(pk) = pack(&b) else {
                assert!(n < w, "{k}x{n} not packed");
                continue;
            };
            assert_eq!((pk.k(), pk.n(), pk.bytes()), (k, n, k * n * 4));
            let mut od = lead.clone();
            od.push(n);
            let out = Shape::new(&od, DType::F32);
            let got = matmul_packed(&a, &pk, &out).expect("taken").unwrap();
            assert_eq!(got.dims(), od.as_slice());
            let via_gemm = crate::kernels::matmul::matmul(&a, &b, &out).unwrap();
            let (want, scale) = reference(&av, &bv, m, k, n);
            let (g, r) = (got.as_f32().unwrap(), via_gemm.as_f32().unwrap());
            let eps = f32::EPSILON as f64;
            for i in 0..m * n {
                // gemm's own bound: K products summed in f32.
                let tol = (k as f64 + 2.0) * eps * scale[i];
                let (gi, ri) = (g[i] as f64, r[i] as f64);
                assert!(
                    (gi - want[i]).abs() <= tol,
                    "{m}x{k}x{n} [{i}]: {gi} vs {}",
                    want[i]
                );
                assert!(
                    (gi - ri).abs() <= 2.0 * tol,
                    "{m}x{k}x{n} [{i}]: {gi} vs gemm {ri}"
                );
            }
        }
    }

    #[test]
    fn nan_and_inf_land_where_gemm_puts_them() {
        if panel_width().is_none() {
            return;
        }
        let (m, k, n) = (70, 20, 130);
        let (mut av, mut bv) = (rnd(m * k, 3), rnd(k * n, 4));
        av[5 * k + 3] = f32::NAN; // row 5: NaN across
        bv[7 * n + 129] = f32::INFINITY; // column 129 (the tail panel): ±inf or NaN
        bv[2 * n + 64] = f32::NAN; // column 64 (the second panel's first): NaN down
        av[9 * k + 11] = f32::NEG_INFINITY; // row 9: ±inf or NaN
        let (a, b) = (t(&[m, k], av), t(&[k, n], bv));
        let out = Shape::new(&[m, n], DType::F32);
        let pk = pack(&b).unwrap();
        let got = matmul_packed(&a, &pk, &out).unwrap().unwrap();
        let via_gemm = crate::kernels::matmul::matmul(&a, &b, &out).unwrap();
        let (g, r) = (got.as_f32().unwrap(), via_gemm.as_f32().unwrap());
        for i in 0..m * n {
            let (row, col) = (i / n, i % n);
            assert_eq!(
                g[i].is_nan(),
                r[i].is_nan(),
                "[{row}, {col}]: {} vs {}",
                g[i],
                r[i]
            );
            if !g[i].is_nan() {
                assert_eq!(g[i].is_infinite(), r[i].is_infinite(), "[{row}, {col}]");
            }
            if row == 5 || col == 64 {
                assert!(g[i].is_nan(), "[{row}, {col}] = {}", g[i]);
            }
            if row != 5 && col != 64 && (row == 9 || col == 129) {
                assert!(!g[i].is_finite(), "[{row}, {col}] = {}", g[i]);
            }
        }
    }

    #[test]
    fn few_rows_and_other_operands_are_left_to_matmul() {
        if panel_width().is_none() {
            return;
        }
        let (k, n) = (16, 64);
        let pk = pack(&t(&[k, n], rnd(k * n, 5))).unwrap();
        // Under MIN_ROWS rows (decode), a K that is not B's, f64, 1-D: not taken.
        let f = |dims: &[usize]| t(dims, rnd(dims.iter().product(), 6));
        let out = |d: &[usize]| Shape::new(d, DType::F32);
        assert!(matmul_packed(&f(&[MIN_ROWS - 1, k]), &pk, &out(&[MIN_ROWS - 1, n])).is_none());
        assert!(matmul_packed(&f(&[64, k + 1]), &pk, &out(&[64, n])).is_none());
        assert!(matmul_packed(&f(&[64 * k]), &pk, &out(&[n])).is_none());
        let a64 = Tensor::new(vec![64, k], TensorData::F64(vec![0.5; 64 * k])).unwrap();
        assert!(matmul_packed(&a64, &pk, &out(&[64, n])).is_none());
        // Wrong output dims: an error, not a write out of bounds.
        assert!(matmul_packed(&f(&[64, k]), &pk, &out(&[64, n + 1]))
            .unwrap()
            .is_err());
        // Not packed: a 3-D or f64 B, one narrower than a panel.
        assert!(pack(&f(&[2, k, n])).is_none());
        assert!(pack(&f(&[k, 63])).is_none());
    }
}
