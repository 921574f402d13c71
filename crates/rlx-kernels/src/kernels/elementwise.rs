//! Elementwise kernels: Unary, Activation, Binary (NumPy broadcasting), Select, Cast.
//! Scalar semantics come from `rlx_ir::op` (`apply_f32` / `apply_f64` / `apply_i64`).

pub use super::chain::{max_f32, min_f32};
use super::wide::Half;
use super::{fill_chunks, invalid, make, out_dims, par_worth, wide, Bcast, KResult};
use half::{bf16, f16};
use rayon::prelude::*;
use rlx_ir::{Activation, BinaryOp, DType, Shape, Tensor, TensorData, UnaryOp};

/// `v.map(f)`, in parallel above the threshold (f32 loops through [`wide`]).
#[inline]
pub(crate) fn map_vec<A: Copy + Sync + 'static, O: Copy + Default + Send + 'static>(
    v: &[A],
    f: impl Fn(A) -> O + Sync + Send + Copy,
) -> Vec<O> {
    // Every element is written below.
    let mut out = crate::buffers::overwritten(v.len());
    if par_worth(v.len()) {
        out.par_chunks_mut(8192)
            .zip(v.par_chunks(8192))
            .for_each(|(d, s)| wide::map_into(d, s, f));
    } else {
        wide::map_into(&mut out, v, f);
    }
    out
}

/// Broadcasting binary map: `out[i] = f(a[ia], b[ib])` over `od`. Contiguous and
/// broadcast-scalar rows run through [`wide`] (AVX-512/AVX2 copies for f32).
pub(crate) fn bin_map<A, B, O>(
    a: &[A],
    ad: &[usize],
    b: &[B],
    bd: &[usize],
    od: &[usize],
    f: impl Fn(A, B) -> O + Sync + Send + Copy,
) -> KResult<Vec<O>>
where
    A: Copy + Send + Sync + 'static,
    B: Copy + Send + Sync + 'static,
    O: Copy + Default + Send + 'static,
{
    let n: usize = od.iter().product();
    if ad == od && bd == od {
        // Every element is written below (a and b have n elements).
        let mut out = crate::buffers::overwritten(n);
        if par_worth(n) {
            out.par_chunks_mut(8192)
                .zip(a.par_chunks(8192).zip(b.par_chunks(8192)))
                .for_each(|(d, (x, y))| wide::zip_into(d, x, y, f));
        } else {
            wide::zip_into(&mut out, a, b, f);
        }
        return Ok(out);
    }
    if bd.iter().product::<usize>() == 1 && ad == od && !b.is_empty() {
        let y = b[0];
        return Ok(map_vec(a, move |x| f(x, y)));
    }
    if ad.iter().product::<usize>() == 1 && bd == od && !a.is_empty() {
        let x = a[0];
        return Ok(map_vec(b, move |y| f(x, y)));
    }
    let plan = Bcast::new(&[ad, bd], od)?;
    // Every element is written below (the rows of `inner` elements tile the output).
    let mut out = crate::buffers::overwritten(n);
    let (sa, sb) = (plan.inner_strides[0], plan.inner_strides[1]);
    fill_chunks(&mut out, plan.inner, |row, dst| {
        let oa = plan.row_offset(0, row);
        let ob = plan.row_offset(1, row);
        let m = dst.len();
        // Unit/zero inner strides get their own loops so they vectorize.
        match (sa, sb) {
            (1, 1) => wide::zip_into(dst, &a[oa..oa + m], &b[ob..ob + m], f),
            (1, 0) => {
                let y = b[ob];
                wide::map_into(dst, &a[oa..oa + m], move |x| f(x, y));
            }
            (0, 1) => {
                let x = a[oa];
                wide::map_into(dst, &b[ob..ob + m], move |y| f(x, y));
            }
            _ => {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = f(a[oa + j * sa], b[ob + j * sb]);
                }
            }
        }
    });
    Ok(out)
}

/// A float16/bfloat16 tensor's values widened to f32 (`half`'s bits), vectorized.
pub(crate) fn half_widen_vec<H: Half>(v: &[H]) -> Vec<f32> {
    // Every element is written below.
    let mut out = crate::buffers::overwritten(v.len());
    if par_worth(v.len()) {
        out.par_chunks_mut(8192)
            .zip(v.par_chunks(8192))
            .for_each(|(d, s)| H::widen(d, s));
    } else {
        H::widen(&mut out, v);
    }
    out
}

/// f32 values rounded to float16/bfloat16 (`half`'s `from_f32` bits), vectorized.
pub(crate) fn half_narrow_vec<H: Half>(v: &[f32]) -> Vec<H> {
    // Every element is written below.
    let mut out = crate::buffers::overwritten(v.len());
    if par_worth(v.len()) {
        out.par_chunks_mut(8192)
            .zip(v.par_chunks(8192))
            .for_each(|(d, s)| H::narrow(d, s));
    } else {
        H::narrow(&mut out, v);
    }
    out
}

/// The f32 element function of `Op::Unary` `op` for float16/bfloat16 data, over a block
/// (the values widened; the caller rounds `dst` back): the f32 kernel's (`-a`, `sqrt`,
/// `fastmath::exp_slice`, `apply_f32`), except Erf, which stays `apply_f32` (libm erf in
/// f64, docs/DESIGN.md "Stable formulations"). Shared by the unfused kernel and the fused
/// chains (`rlx_cpu::ewfuse`), so their bits agree.
pub fn half_unary_block(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    match op {
        UnaryOp::Neg => wide::map1_into(dst, src, |a| -a),
        UnaryOp::Exp => super::fastmath::exp_slice(src, dst),
        UnaryOp::Sqrt => wide::map1_into(dst, src, |a| a.sqrt()),
        UnaryOp::Abs => wide::map1_into(dst, src, |a| a.abs()),
        _ => wide::map1_into(dst, src, |a| op.apply_f32(a)),
    }
}

/// The f32 element function of `Op::Activation` `act` for float16/bfloat16 data, over a
/// block (see [`half_unary_block`]): Relu's compare, SiLU as `x · sigmoid(x)` with
/// `fastmath::sigmoid_slice` and one f32 product, the f32 slice kernels of Sigmoid, Tanh
/// and Gelu, `apply_f32` for the rest.
pub fn half_act_block(act: Activation, src: &[f32], dst: &mut [f32]) {
    match act {
        Activation::Relu => wide::map1_into(dst, src, |a| if a < 0.0 { 0.0 } else { a }),
        Activation::Silu => {
            super::fastmath::sigmoid_slice(src, dst);
            wide::map2_inplace(dst, src, |s, x| x * s);
        }
        _ => match super::fastmath::act_slice_kernel(act) {
            Some(k) => k(src, dst),
            None => wide::map1_into(dst, src, |a| act.apply_f32(a)),
        },
    }
}

/// An operand of [`half_bin_row`]: 16-bit floats along the row, or one f32 value.
#[derive(Clone, Copy)]
enum HSrc<'a, H> {
    S(&'a [H]),
    C(f32),
}

/// `dst[i] = H::from_f32(op(p[i], q[i]))` in f32 blocks with `chain::binary_part` (the
/// f32 kernel's element functions).
fn half_bin_row<H: Half>(op: BinaryOp, dst: &mut [H], p: HSrc<H>, q: HSrc<H>, q_one: Option<f32>) {
    use super::chain::{binary_part, Src};
    const B: usize = wide::HBLOCK;
    let (mut ta, mut tb, mut tc) = ([0f32; B], [0f32; B], [0f32; B]);
    let m = dst.len();
    let mut lo = 0;
    while lo < m {
        let n = B.min(m - lo);
        let ps = match p {
            HSrc::S(s) => {
                H::widen(&mut ta[..n], &s[lo..lo + n]);
                Src::S(&ta[..n])
            }
            HSrc::C(c) => Src::C(c),
        };
        let qs = match q {
            HSrc::S(s) => {
                H::widen(&mut tb[..n], &s[lo..lo + n]);
                Src::S(&tb[..n])
            }
            HSrc::C(c) => Src::C(c),
        };
        binary_part(op, &mut tc[..n], ps, qs, q_one);
        H::narrow(&mut dst[lo..lo + n], &tc[..n]);
        lo += n;
    }
}

/// `Op::Binary` (not a predicate) on float16/bfloat16 with broadcasting, as [`bin_map`]
/// walks it, each row through [`half_bin_row`].
fn half_bin_map<H: Half>(
    op: BinaryOp,
    a: &[H],
    ad: &[usize],
    b: &[H],
    bd: &[usize],
    od: &[usize],
) -> KResult<Vec<H>> {
    let n: usize = od.iter().product();
    let q_one = (b.len() == 1).then(|| b[0].to_f32());
    let mut out: Vec<H> = crate::buffers::overwritten(n);
    let whole = |out: &mut [H], p: Option<&[H]>, q: Option<&[H]>| {
        let (pc, qc) = (a.first().map(|x| x.to_f32()), b.first().map(|x| x.to_f32()));
        let run = |lo: usize, d: &mut [H]| {
            let m = d.len();
            let ps = p.map_or(HSrc::C(pc.unwrap_or(0.0)), |s| HSrc::S(&s[lo..lo + m]));
            let qs = q.map_or(HSrc::C(qc.unwrap_or(0.0)), |s| HSrc::S(&s[lo..lo + m]));
            half_bin_row(op, d, ps, qs, q_one);
        };
        if par_worth(n) {
            out.par_chunks_mut(8192)
                .enumerate()
                .for_each(|(i, d)| run(i * 8192, d));
        } else {
            run(0, out);
        }
    };
    if ad == od && bd == od {
        whole(&mut out, Some(a), Some(b));
        return Ok(out);
    }
    if bd.iter().product::<usize>() == 1 && ad == od && !b.is_empty() {
        whole(&mut out, Some(a), None);
        return Ok(out);
    }
    if ad.iter().product::<usize>() == 1 && bd == od && !a.is_empty() {
        whole(&mut out, None, Some(b));
        return Ok(out);
    }
    let plan = Bcast::new(&[ad, bd], od)?;
    let (sa, sb) = (plan.inner_strides[0], plan.inner_strides[1]);
    fill_chunks(&mut out, plan.inner, |row, dst| {
        let oa = plan.row_offset(0, row);
        let ob = plan.row_offset(1, row);
        let m = dst.len();
        match (sa, sb) {
            (1, 1) => half_bin_row(
                op,
                dst,
                HSrc::S(&a[oa..oa + m]),
                HSrc::S(&b[ob..ob + m]),
                q_one,
            ),
            (1, 0) => half_bin_row(
                op,
                dst,
                HSrc::S(&a[oa..oa + m]),
                HSrc::C(b[ob].to_f32()),
                q_one,
            ),
            (0, 1) => half_bin_row(
                op,
                dst,
                HSrc::C(a[oa].to_f32()),
                HSrc::S(&b[ob..ob + m]),
                q_one,
            ),
            _ => {
                for (j, d) in dst.iter_mut().enumerate() {
                    let (p, q) = (a[oa + j * sa].to_f32(), b[ob + j * sb].to_f32());
                    *d = H::from_f32(super::chain::binary_one(op, p, q, q_one));
                }
            }
        }
    });
    Ok(out)
}

/// The kernel's dtype must be the node's. `op` is formatted only for the error.
fn check_out(op: impl FnOnce() -> String, got: DType, out: &Shape) -> KResult<()> {
    if got != out.dtype {
        return invalid(format!(
            "{} produces {got} here but the node declares {}",
            op(),
            out.dtype
        ));
    }
    Ok(())
}

fn int_unary(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Sign => x.signum(),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => x,
        UnaryOp::BitNot => !x,
        other => other.apply_f64(x as f64) as i64,
    }
}

/// `Op::Unary`: output dtype = input dtype, Bool for `IsNaN`/`IsInf`/`Not`.
pub(crate) fn unary(op: UnaryOp, x: &Tensor, out: &Shape) -> KResult<Tensor> {
    let pred = op.is_predicate();
    let data = match x.data() {
        TensorData::F32(v) => {
            if pred {
                TensorData::Bool(map_vec(v, |a| op.apply_f32(a) != 0.0))
            } else {
                TensorData::F32(match op {
                    UnaryOp::Neg => map_vec(v, |a| -a),
                    UnaryOp::Exp => super::fastmath::map_new(v, super::fastmath::exp_slice),
                    UnaryOp::Erf => super::fastmath::map_new(v, super::fastmath::erf_slice),
                    UnaryOp::Sqrt => map_vec(v, |a| a.sqrt()),
                    _ => map_vec(v, |a| op.apply_f32(a)),
                })
            }
        }
        TensorData::F64(v) => {
            if pred {
                TensorData::Bool(map_vec(v, |a| op.apply_f64(a) != 0.0))
            } else {
                TensorData::F64(map_vec(v, |a| op.apply_f64(a)))
            }
        }
        TensorData::F16(v) => {
            if pred {
                TensorData::Bool(map_vec(v, |a| op.apply_f32(a.to_f32()) != 0.0))
            } else {
                TensorData::F16(wide::half_map(v, move |s, d| half_unary_block(op, s, d)))
            }
        }
        TensorData::BF16(v) => {
            if pred {
                TensorData::Bool(map_vec(v, |a| op.apply_f32(a.to_f32()) != 0.0))
            } else {
                TensorData::BF16(wide::half_map(v, move |s, d| half_unary_block(op, s, d)))
            }
        }
        TensorData::Bool(v) => match op {
            UnaryOp::Not => TensorData::Bool(map_vec(v, |a| !a)),
            UnaryOp::IsNaN | UnaryOp::IsInf { .. } => TensorData::Bool(vec![false; v.len()]),
            _ => return invalid(format!("{op:?} is not defined on bool")),
        },
        TensorData::Narrow { dtype, .. } => {
            return invalid(format!(
                "{op:?} on {dtype} is not supported: it is a storage-only type (Cast it first)"
            ))
        }
        // Unsigned: Abs is the identity and Sign is 0/1 (u64 above i64::MAX included).
        int if int.dtype().is_unsigned() && matches!(op, UnaryOp::Abs | UnaryOp::Sign) => {
            match op {
                UnaryOp::Abs => int.clone(),
                _ => {
                    let nz: Vec<i64> = (0..int.len())
                        .map(|i| (int.get_i128(i) != 0) as i64)
                        .collect();
                    TensorData::from_i64(int.dtype(), &nz)
                }
            }
        }
        int => {
            let vals = int.to_i64_vec();
            if pred {
                TensorData::Bool(map_vec(&vals, |a| match op {
                    UnaryOp::Not => a == 0,
                    _ => false,
                }))
            } else {
                TensorData::from_i64(int.dtype(), &map_vec(&vals, |a| int_unary(op, a)))
            }
        }
    };
    check_out(|| format!("{op:?}"), data.dtype(), out)?;
    make(x.dims().to_vec(), data)
}

/// ONNX Relu on f32: `x < 0 ? 0 : x`, `Activation::Relu.apply_f32`'s arm (a NaN stays NaN,
/// −0 stays −0). Its own small function so that vector loops inline it: through
/// `apply_f32`'s whole match each element was a call (bench/NOTES.md §48).
#[inline]
pub fn relu_f32(a: f32) -> f32 {
    if a < 0.0 {
        0.0
    } else {
        a
    }
}

/// `Op::Activation`: floats (F16/BF16 via f32); integers go through f64 and truncate back.
pub(crate) fn activation(act: Activation, x: &Tensor, out: &Shape) -> KResult<Tensor> {
    let data = match x.data() {
        TensorData::F32(v) => TensorData::F32(match act {
            Activation::Relu => map_vec(v, relu_f32),
            _ => match super::fastmath::act_slice_kernel(act) {
                Some(k) => super::fastmath::map_new(v, k),
                None => map_vec(v, |a| act.apply_f32(a)),
            },
        }),
        TensorData::F64(v) => TensorData::F64(map_vec(v, |a| act.apply_f64(a))),
        TensorData::F16(v) => {
            TensorData::F16(wide::half_map(v, move |s, d| half_act_block(act, s, d)))
        }
        TensorData::BF16(v) => {
            TensorData::BF16(wide::half_map(v, move |s, d| half_act_block(act, s, d)))
        }
        TensorData::Bool(_) => return invalid("activation on a bool tensor"),
        TensorData::Narrow { dtype, .. } => {
            return invalid(format!(
                "activation on {dtype} is not supported: it is a storage-only type (Cast it first)"
            ))
        }
        int => {
            let vals = int.to_f64_vec();
            TensorData::from_f64(int.dtype(), &map_vec(&vals, |a| act.apply_f64(a)))
        }
    };
    check_out(|| "activation".into(), data.dtype(), out)?;
    make(x.dims().to_vec(), data)
}

macro_rules! int_bin {
    ($op:expr, $pred:expr, $x:expr, $y:expr, $ad:expr, $bd:expr, $od:expr, $t:ty, $variant:ident) => {{
        let op = $op;
        if $pred {
            TensorData::Bool(bin_map($x, $ad, $y, $bd, $od, |p: $t, q: $t| {
                op.apply_i64(p as i64, q as i64) != 0
            })?)
        } else {
            TensorData::$variant(bin_map($x, $ad, $y, $bd, $od, |p: $t, q: $t| {
                op.apply_i64(p as i64, q as i64) as $t
            })?)
        }
    }};
}

/// `Op::Binary` with NumPy broadcasting. Predicates output Bool. When the two dtypes differ
/// (ONNX `Pow` with an integer exponent), `b` is cast to `a`'s dtype first.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: &Shape) -> KResult<Tensor> {
    let od = out_dims(out)?;
    if a.dtype() != b.dtype() {
        let bc = Tensor::new(b.dims().to_vec(), b.data().cast(a.dtype()))
            .map_err(|e| crate::KernelError::Invalid(e.to_string()))?;
        return binary(op, a, &bc, out);
    }
    let (ad, bd) = (a.dims(), b.dims());
    let pred = op.is_predicate();
    use TensorData as D;
    let data = match (a.data(), b.data()) {
        (D::F32(x), D::F32(y)) => {
            if pred {
                D::Bool(bin_map(x, ad, y, bd, &od, |p, q| {
                    op.apply_f32(p, q) != 0.0
                })?)
            } else {
                D::F32(match op {
                    BinaryOp::Add => bin_map(x, ad, y, bd, &od, |p, q| p + q)?,
                    BinaryOp::Sub => bin_map(x, ad, y, bd, &od, |p, q| p - q)?,
                    BinaryOp::Mul => bin_map(x, ad, y, bd, &od, |p, q| p * q)?,
                    BinaryOp::Div => bin_map(x, ad, y, bd, &od, |p, q| p / q)?,
                    // x^2 (RMSNorm's square): pow(x, 2) is x*x exactly (both correctly rounded).
                    BinaryOp::Pow if y.len() == 1 && y[0] == 2.0 => {
                        bin_map(x, ad, y, bd, &od, |p, _| p * p)?
                    }
                    // x^3 (GPT-2's tanh GELU): x*x*x, as onnxruntime computes it (bit for bit).
                    BinaryOp::Pow if y.len() == 1 && y[0] == 3.0 => {
                        bin_map(x, ad, y, bd, &od, |p, _| p * p * p)?
                    }
                    // Max/Min monomorphized (the op's match hoisted out of the loop, which
                    // then vectorizes).
                    BinaryOp::Max => bin_map(x, ad, y, bd, &od, max_f32)?,
                    BinaryOp::Min => bin_map(x, ad, y, bd, &od, min_f32)?,
                    _ => bin_map(x, ad, y, bd, &od, |p, q| op.apply_f32(p, q))?,
                })
            }
        }
        (D::F64(x), D::F64(y)) => {
            if pred {
                D::Bool(bin_map(x, ad, y, bd, &od, |p, q| {
                    op.apply_f64(p, q) != 0.0
                })?)
            } else {
                D::F64(bin_map(x, ad, y, bd, &od, |p, q| op.apply_f64(p, q))?)
            }
        }
        (D::F16(x), D::F16(y)) => {
            if pred {
                D::Bool(bin_map(x, ad, y, bd, &od, |p, q| {
                    op.apply_f32(p.to_f32(), q.to_f32()) != 0.0
                })?)
            } else {
                D::F16(half_bin_map(op, x, ad, y, bd, &od)?)
            }
        }
        (D::BF16(x), D::BF16(y)) => {
            if pred {
                D::Bool(bin_map(x, ad, y, bd, &od, |p, q| {
                    op.apply_f32(p.to_f32(), q.to_f32()) != 0.0
                })?)
            } else {
                D::BF16(half_bin_map(op, x, ad, y, bd, &od)?)
            }
        }
        (D::I64(x), D::I64(y)) => int_bin!(op, pred, x, y, ad, bd, &od, i64, I64),
        (D::I32(x), D::I32(y)) => int_bin!(op, pred, x, y, ad, bd, &od, i32, I32),
        (D::I16(x), D::I16(y)) => int_bin!(op, pred, x, y, ad, bd, &od, i16, I16),
        (D::I8(x), D::I8(y)) => int_bin!(op, pred, x, y, ad, bd, &od, i8, I8),
        (D::U8(x), D::U8(y)) => int_bin!(op, pred, x, y, ad, bd, &od, u8, U8),
        (D::U16(x), D::U16(y)) => int_bin!(op, pred, x, y, ad, bd, &od, u16, U16),
        (D::U32(x), D::U32(y)) => int_bin!(op, pred, x, y, ad, bd, &od, u32, U32),
        // u64 in unsigned arithmetic (values above i64::MAX compare and divide right).
        (D::U64(x), D::U64(y)) => {
            if pred {
                D::Bool(bin_map(x, ad, y, bd, &od, |p, q| op.apply_u64(p, q) != 0)?)
            } else {
                D::U64(bin_map(x, ad, y, bd, &od, |p, q| op.apply_u64(p, q))?)
            }
        }
        (D::Narrow { .. }, _) => {
            return invalid(format!(
                "{op:?} on {} is not supported: it is a storage-only type (Cast it first)",
                a.dtype()
            ))
        }
        (D::Bool(x), D::Bool(y)) => D::Bool(match op {
            BinaryOp::And => bin_map(x, ad, y, bd, &od, |p: bool, q: bool| p & q)?,
            BinaryOp::Or => bin_map(x, ad, y, bd, &od, |p: bool, q: bool| p | q)?,
            BinaryOp::Xor => bin_map(x, ad, y, bd, &od, |p: bool, q: bool| p ^ q)?,
            _ => bin_map(x, ad, y, bd, &od, |p, q| {
                op.apply_i64(p as i64, q as i64) != 0
            })?,
        }),
        _ => return invalid("binary: mismatched dtypes"),
    };
    check_out(|| format!("{op:?}"), data.dtype(), out)?;
    make(od, data)
}

fn select_impl<T: Copy + Default + Send + Sync + 'static>(
    c: &[bool],
    cd: &[usize],
    t: &[T],
    td: &[usize],
    f: &[T],
    fd: &[usize],
    od: &[usize],
) -> KResult<Vec<T>> {
    let n: usize = od.iter().product();
    if cd == od && td == od && fd == od {
        return Ok((0..n).map(|i| if c[i] { t[i] } else { f[i] }).collect());
    }
    let plan = Bcast::new(&[cd, td, fd], od)?;
    let mut out = crate::buffers::filled(n, T::default());
    let (sc, st, sf) = (
        plan.inner_strides[0],
        plan.inner_strides[1],
        plan.inner_strides[2],
    );
    fill_chunks(&mut out, plan.inner, |row, dst| {
        let (oc, ot, of) = (
            plan.row_offset(0, row),
            plan.row_offset(1, row),
            plan.row_offset(2, row),
        );
        // Unit or zero inner strides (a broadcast mask, a scalar fill, a mask turned into
        // an additive bias: attention masks) get loops with the strides as constants,
        // which vectorize. `select_row` bounds each operand to the row itself.
        let (cs, ts, fs) = (&c[oc..], &t[ot..], &f[of..]);
        match (sc, st, sf) {
            (1, 0, 0) => select_row::<T, true, false, false>(dst, cs, ts, fs),
            (1, 1, 0) => select_row::<T, true, true, false>(dst, cs, ts, fs),
            (1, 0, 1) => select_row::<T, true, false, true>(dst, cs, ts, fs),
            (0, 1, 0) => select_row::<T, false, true, false>(dst, cs, ts, fs),
            (0, 0, 1) => select_row::<T, false, false, true>(dst, cs, ts, fs),
            (1, 1, 1) => select_row::<T, true, true, true>(dst, cs, ts, fs),
            (0, 1, 1) => select_row::<T, false, true, true>(dst, cs, ts, fs),
            _ => {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = if c[oc + j * sc] {
                        t[ot + j * st]
                    } else {
                        f[of + j * sf]
                    };
                }
            }
        }
    });
    Ok(out)
}

/// One output row of [`select_impl`] whose inner strides are 1 (`true`) or 0 (`false`) for
/// the condition, the true and the false input: `dst[j] = c[j·C] ? t[j·T] : f[j·F]`. A
/// stride-1 operand holds at least `dst.len()` elements, a stride-0 one at least one.
#[inline(always)]
fn select_row<T: Copy, const C: bool, const TS: bool, const FS: bool>(
    dst: &mut [T],
    c: &[bool],
    t: &[T],
    f: &[T],
) {
    let m = dst.len();
    let (c, t, f) = (
        &c[..if C { m } else { 1 }],
        &t[..if TS { m } else { 1 }],
        &f[..if FS { m } else { 1 }],
    );
    for (j, d) in dst.iter_mut().enumerate() {
        let cj = c[if C { j } else { 0 }];
        let tj = t[if TS { j } else { 0 }];
        let fj = f[if FS { j } else { 0 }];
        *d = if cj { tj } else { fj };
    }
}

/// `Op::Select` (ONNX Where): inputs [cond (Bool), on_true, on_false], broadcasting.
pub(crate) fn select(c: &Tensor, t: &Tensor, f: &Tensor, out: &Shape) -> KResult<Tensor> {
    let od = out_dims(out)?;
    let cond: Vec<bool>;
    let cv: &[bool] = match c.data() {
        TensorData::Bool(v) => v,
        other => {
            cond = other.to_f64_vec().iter().map(|&x| x != 0.0).collect();
            &cond
        }
    };
    let fc;
    let f = if f.dtype() != t.dtype() {
        fc = Tensor::new(f.dims().to_vec(), f.data().cast(t.dtype()))
            .map_err(|e| crate::KernelError::Invalid(e.to_string()))?;
        &fc
    } else {
        f
    };
    let (cd, td, fd) = (c.dims(), t.dims(), f.dims());
    use TensorData as D;
    let data = match (t.data(), f.data()) {
        (D::F32(x), D::F32(y)) => D::F32(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::F16(x), D::F16(y)) => D::F16(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::BF16(x), D::BF16(y)) => D::BF16(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::F64(x), D::F64(y)) => D::F64(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::I64(x), D::I64(y)) => D::I64(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::I32(x), D::I32(y)) => D::I32(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::I16(x), D::I16(y)) => D::I16(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::I8(x), D::I8(y)) => D::I8(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::U8(x), D::U8(y)) => D::U8(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::U16(x), D::U16(y)) => D::U16(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::U32(x), D::U32(y)) => D::U32(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::U64(x), D::U64(y)) => D::U64(select_impl(cv, cd, x, td, y, fd, &od)?),
        (D::Narrow { dtype, codes: x }, D::Narrow { codes: y, .. }) => {
            D::narrow(*dtype, select_impl(cv, cd, x, td, y, fd, &od)?)
        }
        (D::Bool(x), D::Bool(y)) => D::Bool(select_impl(cv, cd, x, td, y, fd, &od)?),
        _ => return invalid("select: mismatched dtypes"),
    };
    check_out(|| "Select".into(), data.dtype(), out)?;
    make(od, data)
}

/// `Op::Cast` (ONNX Cast: float→int truncates toward zero, NaN→bool is true; `saturate`
/// as [`TensorData::cast_sat`], it matters for the float8 types only).
pub(crate) fn cast(x: &Tensor, to: DType, saturate: bool, out: &Shape) -> KResult<Tensor> {
    use TensorData as D;
    let data = match (x.data(), to) {
        (D::F32(v), DType::F16) => D::F16(half_narrow_vec(v)),
        (D::F32(v), DType::BF16) => D::BF16(half_narrow_vec(v)),
        (D::F16(v), DType::F32) => D::F32(half_widen_vec(v)),
        (D::BF16(v), DType::F32) => D::F32(half_widen_vec(v)),
        (D::F32(v), DType::F64) => D::F64(map_vec(v, |a| a as f64)),
        (D::F64(v), DType::F32) => D::F32(map_vec(v, |a| a as f32)),
        (d, to) => d.cast_sat(to, saturate),
    };
    check_out(|| "Cast".into(), data.dtype(), out)?;
    make(x.dims().to_vec(), data)
}

/// `Op::BitCast` (ONNX BitCast, opset 26): each element's little-endian bytes read back as
/// `to`, which must have the same width (Bool is one byte: 0 → false, anything else → true,
/// and false/true write 0/1). Narrow types are refused.
pub(crate) fn bitcast(x: &Tensor, to: DType) -> KResult<Tensor> {
    use TensorData as D;
    let from = x.dtype();
    if from.is_narrow() || to.is_narrow() || from.bits() != to.bits() {
        return invalid(format!(
            "BitCast: cannot reinterpret {from} ({} bits) as {to} ({} bits)",
            from.bits(),
            to.bits()
        ));
    }
    macro_rules! bytes {
        ($($var:ident),*) => {
            match x.data() {
                $(D::$var(v) => v.iter().flat_map(|e| e.to_le_bytes()).collect::<Vec<u8>>(),)*
                D::F16(v) => v.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
                D::BF16(v) => v.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
                D::Bool(v) => v.iter().map(|&b| b as u8).collect(),
                D::Narrow { .. } => return invalid("BitCast: narrow types are not supported"),
            }
        };
    }
    let b = bytes!(F32, F64, I64, I32, I16, I8, U8, U16, U32, U64);
    macro_rules! chunks {
        ($n:expr, $f:expr) => {
            b.chunks_exact($n)
                .map(|c| $f(c.try_into().expect("chunk of the element size")))
                .collect()
        };
    }
    let data = match to {
        DType::F32 => D::F32(chunks!(4, f32::from_le_bytes)),
        DType::F64 => D::F64(chunks!(8, f64::from_le_bytes)),
        DType::I64 => D::I64(chunks!(8, i64::from_le_bytes)),
        DType::U64 => D::U64(chunks!(8, u64::from_le_bytes)),
        DType::I32 => D::I32(chunks!(4, i32::from_le_bytes)),
        DType::U32 => D::U32(chunks!(4, u32::from_le_bytes)),
        DType::I16 => D::I16(chunks!(2, i16::from_le_bytes)),
        DType::U16 => D::U16(chunks!(2, u16::from_le_bytes)),
        DType::F16 => D::F16(chunks!(2, |c| f16::from_bits(u16::from_le_bytes(c)))),
        DType::BF16 => D::BF16(chunks!(2, |c| bf16::from_bits(u16::from_le_bytes(c)))),
        DType::I8 => D::I8(b.iter().map(|&v| v as i8).collect()),
        DType::U8 => D::U8(b),
        DType::Bool => D::Bool(b.iter().map(|&v| v != 0).collect()),
        d => return invalid(format!("BitCast: cannot produce {d}")),
    };
    make(x.dims().to_vec(), data)
}
