//! Matrix products through the `gemm` crate: ONNX MatMul (`np.matmul` semantics).
//!
//! f32 and f64 go to `gemm::gemm`; F16/BF16 compute as if widened exactly to f32 and the
//! f32 result rounded once; integer types use a plain i64 triple loop (wrapping).
//!
//! Products with few rows (decode's matrix·vector) in f32, F16 and BF16 whose B is read
//! with contiguous rows of B or of Bᵀ take `matvec::small_m` instead of gemm; 16-bit
//! products of more rows take `matvec::panels` (B widened a panel of columns at a time).
//! Neither widens a whole 16-bit operand.

pub use super::gemm_calls::GEMM_PAR_FLOPS;
use super::gemm_calls::{fits, gemm_uninit, View};
use super::matvec::{self, MvElem};
use super::{invalid, make, KResult};
use half::{bf16, f16};
use rayon::prelude::*;
use rlx_ir::{broadcast_dims, Shape, Tensor, TensorData};
use std::mem::MaybeUninit;
/// Shapes of one `np.matmul` call, after promoting 1-D operands.
struct MmPlan {
    m: usize,
    k: usize,
    n: usize,
    /// Output batch dims (broadcast of both operands' batch dims).
    batch: Vec<usize>,
    /// Per output batch index: (a matrix offset, b matrix offset) in elements.
    offs: Vec<(usize, usize)>,
    /// Element strides of a's rows and columns, and of b's.
    a_rc: (usize, usize),
    b_rc: (usize, usize),
    out_dims: Vec<usize>,
    /// b has a single matrix and a is contiguous: fold a's batch into M.
    fold: bool,
}

/// One operand of [`matmul_perm`]: its logical dims and the element stride of each (a
/// contiguous tensor, or a transposed view of one).
struct Operand {
    dims: Vec<usize>,
    strides: Vec<usize>,
}

impl Operand {
    /// `t` itself, or `Transpose(t, perm)` read in place: logical axis j is t's axis
    /// `perm[j]`.
    fn new(t: &Tensor, perm: Option<&[usize]>) -> KResult<Operand> {
        let (dims, strides) = match perm {
            None => (t.dims().to_vec(), rlx_ir::strides_of(t.dims()).to_vec()),
            Some(p) => super::shape::permuted(t.dims(), p)?,
        };
        Ok(Operand { dims, strides })
    }

    /// Whether the elements lie in row-major order of `dims` (a plain tensor).
    fn contiguous(&self) -> bool {
        self.strides.as_slice() == rlx_ir::strides_of(&self.dims).as_slice()
    }
}

fn plan(a: &Operand, b: &Operand) -> KResult<MmPlan> {
    let (ad, bd) = (&a.dims, &b.dims);
    if ad.is_empty() || bd.is_empty() {
        return invalid("matmul: scalar operands are not allowed");
    }
    let (mut a2, mut as2) = (ad.clone(), a.strides.clone());
    let (mut b2, mut bs2) = (bd.clone(), b.strides.clone());
    let a_vec = a2.len() == 1;
    let b_vec = b2.len() == 1;
    if a_vec {
        a2.insert(0, 1);
        as2.insert(0, 0);
    }
    if b_vec {
        b2.push(1);
        bs2.push(0);
    }
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return invalid(format!("matmul: inner dims differ: {ad:?} · {bd:?}"));
    }
    let ab = &a2[..a2.len() - 2];
    let bb = &b2[..b2.len() - 2];
    let batch = broadcast_dims(ab, bb).ok_or_else(|| {
        crate::KernelError::Invalid(format!(
            "matmul: batch dims of {ad:?} and {bd:?} do not broadcast"
        ))
    })?;
    let nb: usize = batch.iter().product();
    let r = batch.len();
    // Batch dims and strides right-aligned to the output's; a broadcast axis has stride 0.
    let full = |d: &[usize], s: &[usize]| {
        let mut f = vec![(1usize, 0usize); r - d.len()];
        f.extend(
            d.iter()
                .zip(s)
                .map(|(&d, &s)| (d, if d == 1 { 0 } else { s })),
        );
        f
    };
    let (fa, fb) = (full(ab, &as2[..ab.len()]), full(bb, &bs2[..bb.len()]));
    let mut offs = Vec::with_capacity(nb);
    for bi in 0..nb {
        let (mut rem, mut oa, mut ob) = (bi, 0, 0);
        for i in (0..r).rev() {
            let c = rem % batch[i];
            rem /= batch[i];
            oa += c * fa[i].1;
            ob += c * fb[i].1;
        }
        offs.push((oa, ob));
    }
    let mut out_dims = batch.clone();
    if !a_vec {
        out_dims.push(m);
    }
    if !b_vec {
        out_dims.push(n);
    }
    let b_single = bb.iter().product::<usize>() == 1;
    let a_full = ab.iter().product::<usize>() == nb;
    let (ar, br) = (a2.len(), b2.len());
    Ok(MmPlan {
        m,
        k,
        n,
        batch,
        offs,
        // A promoted 1-D operand's unit axis is never stepped along: any stride does.
        a_rc: (if a_vec { k } else { as2[ar - 2] }, as2[ar - 1]),
        b_rc: (bs2[br - 2], if b_vec { 1 } else { bs2[br - 1] }),
        out_dims,
        fold: b_single && a_full && a.contiguous(),
    })
}

/// Element types of [`matmul_float`]: one `m×k · k×n` product into `dst` (row-major,
/// contiguous, maybe uninitialized; all `m*n` written on success).
trait MmElem: Copy + Send + Sync + 'static {
    fn product(
        m: usize,
        n: usize,
        k: usize,
        a: View<Self>,
        b: View<Self>,
        dst: &mut [MaybeUninit<Self>],
        parallel: bool,
    ) -> KResult<()>;
}

impl MmElem for f64 {
    fn product(
        m: usize,
        n: usize,
        k: usize,
        a: View<f64>,
        b: View<f64>,
        dst: &mut [MaybeUninit<f64>],
        parallel: bool,
    ) -> KResult<()> {
        gemm_uninit(m, n, k, a, b, dst, parallel)
    }
}

/// The checks of [`gemm_uninit_ptr`] for the `matvec` paths, and its k == 0 case.
fn mv_checks<T: MvElem>(
    m: usize,
    n: usize,
    k: usize,
    a: &View<T>,
    b: &View<T>,
    dst: &mut [MaybeUninit<T>],
) -> KResult<bool> {
    if !fits(a, m, k) || !fits(b, k, n) {
        return invalid(format!(
            "gemm: operand buffers too small for {m}x{k} · {k}x{n}"
        ));
    }
    if dst.len() < m * n {
        return invalid(format!("gemm: output buffer too small for {m}x{n}"));
    }
    if k == 0 {
        for d in &mut dst[..m * n] {
            d.write(T::narrow(0.0));
        }
        return Ok(false);
    }
    Ok(m > 0 && n > 0)
}

impl MmElem for f32 {
    fn product(
        m: usize,
        n: usize,
        k: usize,
        a: View<f32>,
        b: View<f32>,
        dst: &mut [MaybeUninit<f32>],
        parallel: bool,
    ) -> KResult<()> {
        match matvec::layout(&b, k, n) {
            Some(lay) if m <= matvec::max_m(lay) => {
                if mv_checks(m, n, k, &a, &b, dst)? {
                    // SAFETY: dst holds m*n (checked), a distinct &mut slice.
                    unsafe {
                        matvec::small_m(m, n, k, a, b, lay, dst.as_mut_ptr().cast(), parallel)
                    };
                }
                Ok(())
            }
            _ => gemm_uninit(m, n, k, a, b, dst, parallel),
        }
    }
}

/// F16 and BF16: `matvec::small_m` for few rows, else `matvec::panels`.
fn product16<T: MvElem>(
    m: usize,
    n: usize,
    k: usize,
    a: View<T>,
    b: View<T>,
    dst: &mut [MaybeUninit<T>],
    parallel: bool,
) -> KResult<()> {
    if !mv_checks(m, n, k, &a, &b, dst)? {
        return Ok(());
    }
    let d = dst.as_mut_ptr().cast::<T>();
    // SAFETY: dst holds m*n (checked), a distinct &mut slice; the views fit (checked).
    unsafe {
        match matvec::layout(&b, k, n) {
            Some(lay) if m <= matvec::max_m(lay) => {
                matvec::small_m(m, n, k, a, b, lay, d, parallel);
                Ok(())
            }
            _ => matvec::panels(m, n, k, a, b, d, parallel),
        }
    }
}

impl MmElem for f16 {
    fn product(
        m: usize,
        n: usize,
        k: usize,
        a: View<f16>,
        b: View<f16>,
        dst: &mut [MaybeUninit<f16>],
        parallel: bool,
    ) -> KResult<()> {
        product16(m, n, k, a, b, dst, parallel)
    }
}

impl MmElem for bf16 {
    fn product(
        m: usize,
        n: usize,
        k: usize,
        a: View<bf16>,
        b: View<bf16>,
        dst: &mut [MaybeUninit<bf16>],
        parallel: bool,
    ) -> KResult<()> {
        #[cfg(target_arch = "x86_64")]
        if m > matvec::max_m(matvec::Layout::Rows)
            && a.cs == 1
            && b.rs == 1
            && b.cs == k
            && dst.len() >= m * n
            && super::amx::supported(m, n, k)
        {
            // Prefill-sized product against [N, K] weights: AMX tiles (module docs of
            // `amx`: exact products, f32 sums, subnormals flushed, one rounding).
            if super::amx::matmul_bf16_nt(
                m,
                n,
                k,
                &a.data[a.off..],
                a.rs,
                &b.data[b.off..],
                &mut dst[..m * n],
                parallel,
            ) {
                return Ok(());
            }
        }
        product16(m, n, k, a, b, dst, parallel)
    }
}

fn matmul_float<T: MmElem>(a: &[T], b: &[T], p: &MmPlan) -> KResult<Vec<T>> {
    let (m, k, n) = (p.m, p.k, p.n);
    let nb: usize = p.batch.iter().product();
    let total = nb * m * n;
    let mut out: Vec<T> = crate::buffers::take(total);
    let dst = &mut out.spare_capacity_mut()[..total];
    let va = |off| View {
        data: a,
        off,
        rs: p.a_rc.0,
        cs: p.a_rc.1,
    };
    let vb = |off| View {
        data: b,
        off,
        rs: p.b_rc.0,
        cs: p.b_rc.1,
    };
    let per = m * n * k;
    if p.fold || nb == 1 {
        let (oa, ob) = p.offs.first().copied().unwrap_or((0, 0));
        T::product(nb * m, n, k, va(oa), vb(ob), dst, true)?;
    } else if per < GEMM_PAR_FLOPS
        && nb * per >= GEMM_PAR_FLOPS
        && m * n > 0
        && rayon::current_num_threads() > 1
    {
        // Many small products (attention heads): one task per batch.
        dst.par_chunks_mut(m * n)
            .zip(p.offs.par_iter())
            .try_for_each(|(d, &(oa, ob))| T::product(m, n, k, va(oa), vb(ob), d, false))?;
    } else if m * n > 0 {
        for (d, &(oa, ob)) in dst.chunks_mut(m * n).zip(&p.offs) {
            T::product(m, n, k, va(oa), vb(ob), d, true)?;
        }
    }
    // SAFETY: the products above wrote all `total` elements: one (nb*m)×n product, or
    // one m×n product per batch index (`offs` has nb entries), or nothing when m*n == 0.
    unsafe { out.set_len(total) };
    Ok(out)
}

fn matmul_int(a: &[i64], b: &[i64], p: &MmPlan) -> Vec<i64> {
    let (m, k, n) = (p.m, p.k, p.n);
    let ((ars, acs), (brs, bcs)) = (p.a_rc, p.b_rc);
    let mut out = Vec::with_capacity(p.offs.len() * m * n);
    for &(oa, ob) in &p.offs {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0i64;
                for t in 0..k {
                    let (x, y) = (a[oa + i * ars + t * acs], b[ob + t * brs + j * bcs]);
                    s = s.wrapping_add(x.wrapping_mul(y));
                }
                out.push(s);
            }
        }
    }
    out
}

/// `Op::MatMul` (ONNX MatMul / `np.matmul`): batch dims broadcast, a 1-D `a` is a row
/// vector and a 1-D `b` a column vector, their unit dims dropped from the output.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, out: &Shape) -> KResult<Tensor> {
    matmul_perm(a, None, b, None, out)
}

/// [`matmul`] of `Transpose(a, a_perm)` and `Transpose(b, b_perm)` (either perm `None`: the
/// tensor itself), with the transposed operands read in place through strides: no copy.
/// The same products as transposing first; gemm may pack and sum a strided operand in
/// another order, so values can differ from the copied layout's by rounding. Errors: a
/// perm that is not a permutation of its tensor's axes, and [`matmul`]'s.
pub fn matmul_perm(
    a: &Tensor,
    a_perm: Option<&[usize]>,
    b: &Tensor,
    b_perm: Option<&[usize]>,
    out: &Shape,
) -> KResult<Tensor> {
    let p = plan(&Operand::new(a, a_perm)?, &Operand::new(b, b_perm)?)?;
    let _ = out;
    use TensorData as D;
    let data = match (a.data(), b.data()) {
        (D::F32(x), D::F32(y)) => D::F32(matmul_float(x, y, &p)?),
        (D::F64(x), D::F64(y)) => D::F64(matmul_float(x, y, &p)?),
        (D::F16(x), D::F16(y)) => D::F16(matmul_float(x, y, &p)?),
        (D::BF16(x), D::BF16(y)) => D::BF16(matmul_float(x, y, &p)?),
        (x, y) if x.dtype() == y.dtype() && x.dtype().is_int() => {
            let r = matmul_int(&x.to_i64_vec(), &y.to_i64_vec(), &p);
            D::from_i64(x.dtype(), &r)
        }
        (x, y) => {
            return invalid(format!(
                "matmul: unsupported dtypes {} · {}",
                x.dtype(),
                y.dtype()
            ))
        }
    };
    make(p.out_dims, data)
}

/// The former F16/BF16 path (both operands widened whole to f32, one gemm, the result
/// rounded), and gemm alone for f32: the reference the `matvec` paths are tested against.
#[cfg(test)]
pub(crate) fn matmul_perm_reference(
    a: &Tensor,
    a_perm: Option<&[usize]>,
    b: &Tensor,
    b_perm: Option<&[usize]>,
) -> KResult<Tensor> {
    use super::elementwise::map_vec;
    fn gemm_only<T: crate::kernels::gemm_calls::GemmElem>(
        a: &[T],
        b: &[T],
        p: &MmPlan,
    ) -> KResult<Vec<T>> {
        let (m, k, n) = (p.m, p.k, p.n);
        let nb: usize = p.batch.iter().product();
        let mut out: Vec<T> = Vec::with_capacity(nb * m * n);
        let dst = &mut out.spare_capacity_mut()[..nb * m * n];
        let v = |data, off, (rs, cs): (usize, usize)| View { data, off, rs, cs };
        if p.fold || nb == 1 {
            let (oa, ob) = p.offs.first().copied().unwrap_or((0, 0));
            gemm_uninit(nb * m, n, k, v(a, oa, p.a_rc), v(b, ob, p.b_rc), dst, true)?;
        } else if m * n > 0 {
            for (d, &(oa, ob)) in dst.chunks_mut(m * n).zip(&p.offs) {
                gemm_uninit(m, n, k, v(a, oa, p.a_rc), v(b, ob, p.b_rc), d, true)?;
            }
        }
        // SAFETY: every element written above.
        unsafe { out.set_len(nb * m * n) };
        Ok(out)
    }
    let p = plan(&Operand::new(a, a_perm)?, &Operand::new(b, b_perm)?)?;
    use TensorData as D;
    let data = match (a.data(), b.data()) {
        (D::F32(x), D::F32(y)) => D::F32(gemm_only(x, y, &p)?),
        (D::F16(x), D::F16(y)) => {
            let (x, y) = (map_vec(x, |v| v.to_f32()), map_vec(y, |v| v.to_f32()));
            D::F16(map_vec(&gemm_only(&x, &y, &p)?, f16::from_f32))
        }
        (D::BF16(x), D::BF16(y)) => {
            let (x, y) = (map_vec(x, |v| v.to_f32()), map_vec(y, |v| v.to_f32()));
            D::BF16(map_vec(&gemm_only(&x, &y, &p)?, bf16::from_f32))
        }
        _ => return invalid("matmul_perm_reference: f32, f16 and bf16 only"),
    };
    make(p.out_dims, data)
}

#[cfg(test)]
#[path = "matvec_tests.rs"]
mod matvec_tests;
