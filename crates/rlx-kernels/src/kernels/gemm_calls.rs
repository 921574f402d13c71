//! The `gemm` crate's product as RLX's kernels call it: strided views ([`View`]), the
//! element types it takes here ([`GemmElem`]), products into uninitialized memory
//! ([`gemm_uninit`], [`gemm_uninit_strided`], [`gemm_uninit_ptr`]) and the size from which
//! a product uses every thread ([`GEMM_PAR_FLOPS`]). Its own file so that `matmul` (which
//! dispatches to `matvec` and `amx`), `matvec`, `amx` and the conv paths all import it and
//! none of them imports another in a loop.

use super::{invalid, KResult};
use gemm::Parallelism;
use std::mem::MaybeUninit;

/// Element types `gemm::gemm` handles natively here: f32 and f64 only (conv's column
/// buffer relies on every bit pattern of a GemmElem being a valid value).
pub(crate) trait GemmElem: Copy + Send + Sync + Default + 'static {
    const ZERO: Self;
    const ONE: Self;
}
impl GemmElem for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}
impl GemmElem for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// Products with at least this many multiply-adds let gemm use all rayon threads (about
/// 35 µs of work at one AVX-512 core). Smaller products ran slower split: waking a sleeping
/// worker costs several µs (gpt2-tiny's 1M-MAC LM head at 2 threads: 0.133 → 0.077 ms per
/// run with the graph kept on the calling thread). The executor uses the same bound to
/// decide whether a graph has parallel work at all.
pub const GEMM_PAR_FLOPS: usize = 1 << 22;

/// A strided matrix view: element (i, j) is `data[off + i*rs + j*cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

pub(crate) fn fits<T>(v: &View<T>, rows: usize, cols: usize) -> bool {
    rows == 0 || cols == 0 || v.off + (rows - 1) * v.rs + (cols - 1) * v.cs < v.data.len()
}

/// `dst[m×n] (row-major, contiguous) = a[m×k] · b[k×n]`, into memory that may be
/// uninitialized: on success the first `m*n` elements of `dst` are written (never read),
/// so the caller may then treat them as initialized; this saves zeroing an output that
/// the product overwrites anyway. `parallel` lets gemm spread a large product over the
/// rayon pool.
pub(crate) fn gemm_uninit<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    dst: &mut [MaybeUninit<T>],
    parallel: bool,
) -> KResult<()> {
    gemm_uninit_strided(m, n, k, a, b, dst, (n, 1), parallel)
}

/// [`gemm_uninit`] with the output element (i, j) at `dst[i*rs + j*cs]` for
/// `(rs, cs) = dst_strides`: the `m*n` elements at those places are written, no other.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_uninit_strided<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    dst: &mut [MaybeUninit<T>],
    dst_strides: (usize, usize),
    parallel: bool,
) -> KResult<()> {
    let (drs, dcs) = dst_strides;
    let dst_fits = m == 0 || n == 0 || (m - 1) * drs + (n - 1) * dcs < dst.len();
    if !dst_fits {
        return invalid(format!("gemm: output buffer too small for {m}x{n}"));
    }
    // SAFETY: the m*n places lie inside `dst` (checked above), a distinct &mut slice.
    unsafe {
        gemm_uninit_ptr(
            m,
            n,
            k,
            a,
            b,
            dst.as_mut_ptr().cast::<T>(),
            dst_strides,
            parallel,
            false,
        )
    }
}

/// [`gemm_uninit_strided`] through a raw output pointer (for callers whose threads write
/// disjoint but interleaved ranges of one buffer). Checks the operand views.
///
/// With `accumulate`, the products are added to the values already there (`dst += a·b`,
/// as gemm writes each tile), which must then be initialized.
///
/// # Safety
/// `dst + i*rs + j*cs` for i < m, j < n must be valid for writes (and initialized reads
/// with `accumulate`), not read or written by anyone else during the call, and not alias
/// `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_uninit_ptr<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    dst: *mut T,
    dst_strides: (usize, usize),
    parallel: bool,
    accumulate: bool,
) -> KResult<()> {
    let (drs, dcs) = dst_strides;
    if !fits(&a, m, k) || !fits(&b, k, n) {
        return invalid(format!(
            "gemm: operand buffers too small for {m}x{k} · {k}x{n}"
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if accumulate {
            return Ok(());
        }
        for i in 0..m {
            for j in 0..n {
                // SAFETY: a place the caller vouched for.
                unsafe { dst.add(i * drs + j * dcs).write(T::ZERO) };
            }
        }
        return Ok(());
    }
    let threads = rayon::current_num_threads();
    let par = if parallel && threads > 1 && m * n * k >= GEMM_PAR_FLOPS {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: a and b: checked by `fits`; dst: the caller's contract. With read_dst false
    // (the 7th argument) gemm writes dst without reading it; true: dst = 1·dst + a·b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dcs as isize,
            drs as isize,
            accumulate,
            a.data.as_ptr().add(a.off),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.off),
            b.cs as isize,
            b.rs as isize,
            if accumulate { T::ONE } else { T::ZERO },
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// gemm's packing threshold for its left operand on one thread, while an im2col conv's or
/// a Winograd conv's products run (`gemm::set_lhs_packing_threshold_single_thread`, in
/// units of its micro-kernel's column count, 6). gemm computes an im2col conv's product
/// transposed, its left operand the im2col matrix, and copies that into packed panels once
/// the output has more than 8 × 6 = 48 channels; 16 leaves up to 96 output channels
/// unpacked. Against gemm's default (8), interleaved, best of 3 medians, 1 thread:
/// resnet50 -3.9%, resnet18 -4.0%, squeezenet -4.4%, efficientnet_b0 -2.1%, mobilenet_v2
/// +-0 (2 threads: -0.6 to -3%). Setting it for the Winograd products alone, or for 1×1
/// convs too, read within 2% of this. MatMul keeps the default: bert and gpt2 ran 2-3%
/// slower at 16 (its products against weights packed in panels set their own:
/// [`NO_LHS_PACKING`]).
pub(crate) const CONV_LHS_PACKING: usize = 16;

/// gemm's single-thread lhs packing threshold while products against weights packed in
/// panels run (`mm_packed`): its largest (256 × 6 columns of the other operand), so the
/// panels are read in place.
pub(crate) const NO_LHS_PACKING: usize = 256;
// gemm clamps the threshold at 256: a larger value would read as 256 anyway.
const _: () = assert!(NO_LHS_PACKING <= 256);

/// Who asks for a gemm lhs packing threshold (`LhsPacking`), in order of precedence.
#[derive(Clone, Copy)]
pub(crate) enum LhsLevel {
    /// [`CONV_LHS_PACKING`].
    Conv = 0,
    /// Products against weights already in packed panels ([`NO_LHS_PACKING`]).
    Panels = 1,
}

/// Sets gemm's single-thread lhs packing threshold for a level until dropped. The setting
/// is process-wide, so guards on several threads (several executors) share it: while any
/// `Panels` guard lives the threshold is [`NO_LHS_PACKING`], else while any
/// `Conv` guard lives [`CONV_LHS_PACKING`], else the value saved when the first guard
/// started. A product running meanwhile under another level's threshold changes its
/// speed, not its values (packing copies the operand; the sums are the same).
pub(crate) struct LhsPacking(LhsLevel);

/// Guards alive per level, and the threshold saved by the first guard.
static LHS_ACTIVE: std::sync::Mutex<([usize; 2], usize)> = std::sync::Mutex::new(([0, 0], 0));

impl LhsPacking {
    pub(crate) fn set(level: LhsLevel) -> LhsPacking {
        let mut a = LHS_ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        if a.0 == [0, 0] {
            a.1 = gemm::get_lhs_packing_threshold_single_thread();
        }
        a.0[level as usize] += 1;
        Self::apply(&a);
        LhsPacking(level)
    }

    /// The threshold for `counts` guards alive per level, `saved` the value before them.
    fn threshold(counts: [usize; 2], saved: usize) -> usize {
        if counts[LhsLevel::Panels as usize] > 0 {
            NO_LHS_PACKING
        } else if counts[LhsLevel::Conv as usize] > 0 {
            CONV_LHS_PACKING
        } else {
            saved
        }
    }

    fn apply(a: &([usize; 2], usize)) {
        let t = Self::threshold(a.0, a.1);
        if gemm::get_lhs_packing_threshold_single_thread() != t {
            gemm::set_lhs_packing_threshold_single_thread(t);
        }
    }
}

impl Drop for LhsPacking {
    fn drop(&mut self) {
        let mut a = LHS_ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        a.0[self.0 as usize] -= 1;
        Self::apply(&a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_panels_threshold_wins_and_the_saved_value_comes_back() {
        let t = LhsPacking::threshold;
        assert_eq!(t([0, 0], 8), 8);
        assert_eq!(t([1, 0], 8), CONV_LHS_PACKING);
        assert_eq!(t([3, 0], 8), CONV_LHS_PACKING);
        assert_eq!(t([0, 1], 8), NO_LHS_PACKING);
        assert_eq!(t([2, 1], 8), NO_LHS_PACKING);
    }
}
