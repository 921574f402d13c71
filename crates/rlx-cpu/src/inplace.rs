//! Buffer reuse for the executor: when a node's first input dies at the node, Reshape moves
//! its data, f32/f64 elementwise ops overwrite it in place, and a Concat whose output is its
//! inputs one after another (batch 1 on the channel axis) extends it with the others
//! (`shape::concat_onto`; the pool gave that buffer room for it: `Plan::reserve`). Results
//! are identical to [`crate::eval_op`] (same scalar functions, the same copies); anything
//! not handled here falls back to it.

use crate::{eval_op, KernelError};
use rayon::prelude::*;
use rlx_ir::{BinaryOp, Op, Shape, Tensor, TensorData};
use rlx_kernels::check_result;
use rlx_kernels::kernels::elementwise::{max_f32, min_f32, relu_f32};
use rlx_kernels::kernels::{fill_chunks, par_worth, wide, Bcast};

/// Ops for which [`eval_owned`] may reuse the first input's buffer.
pub(crate) fn can_reuse(op: &Op) -> bool {
    match op {
        Op::Reshape { .. } | Op::Activation(_) | Op::Concat { .. } => true,
        Op::Unary(u) => !u.is_predicate(),
        Op::Binary(b) => !b.is_predicate(),
        _ => false,
    }
}

/// `v[i] = f(v[i])`, split over rayon above the threshold, each chunk through [`wide`].
pub(crate) fn for_each_chunk<T: Copy + Send + 'static>(
    v: &mut [T],
    f: impl Fn(T) -> T + Sync + Send + Copy,
) {
    if par_worth(v.len()) {
        v.par_chunks_mut(8192).for_each(|c| wide::map_inplace(c, f));
    } else {
        wide::map_inplace(v, f);
    }
}

/// `a[i] = f(a[i], b[broadcast i])` with `a` already of the output dims. Contiguous and
/// scalar rows run through [`wide`] (AVX-512/AVX2 copies for f32).
fn binary_into<T: Copy + Send + Sync + 'static>(
    a: &mut [T],
    od: &[usize],
    b: &[T],
    bd: &[usize],
    f: impl Fn(T, T) -> T + Sync + Send + Copy,
) -> Result<(), KernelError> {
    if bd == od {
        if par_worth(a.len()) {
            a.par_chunks_mut(8192)
                .zip(b.par_chunks(8192))
                .for_each(|(x, y)| wide::zip_inplace(x, y, f));
        } else {
            wide::zip_inplace(a, b, f);
        }
        return Ok(());
    }
    if let [y] = b {
        if bd.len() <= od.len() && a.len() == od.iter().product::<usize>() {
            let y = *y;
            for_each_chunk(a, move |x| f(x, y));
            return Ok(());
        }
    }
    let plan = Bcast::new(&[bd], od)?;
    let sb = plan.inner_strides[0];
    fill_chunks(a, plan.inner, |row, dst| {
        let ob = plan.row_offset(0, row);
        if sb == 0 {
            let y = b[ob];
            wide::map_inplace(dst, move |x| f(x, y));
        } else {
            let m = dst.len();
            wide::zip_inplace(dst, &b[ob..ob + m], f);
        }
    });
    Ok(())
}

/// Evaluate `op` with ownership of its first input.
pub(crate) fn eval_owned(
    op: &Op,
    mut first: Tensor,
    rest: &[&Tensor],
    out: &Shape,
) -> Result<Tensor, KernelError> {
    if let Op::Concat { axis } = op {
        // The first input's values stay in place; the others are copied after them.
        let t = rlx_kernels::kernels::shape::concat_onto(first, rest, *axis, out)?;
        check_result(|| op.name(), &t, out)?;
        return Ok(t);
    }
    let od = out.dims_usize();
    let handled = match (op, first.data_mut()) {
        (Op::Reshape { .. }, _) if rest.is_empty() => {
            let t = first
                .reshaped(od)
                .map_err(|e| KernelError::Invalid(e.to_string()))?;
            check_result(|| "Reshape".into(), &t, out)?;
            return Ok(t);
        }
        (Op::Unary(u), TensorData::F32(v)) if rest.is_empty() && !u.is_predicate() => {
            let u = *u;
            match rlx_kernels::kernels::fastmath::slice_kernel(u) {
                Some(k) => rlx_kernels::kernels::fastmath::map_inplace_par(v, k),
                None => for_each_chunk(v, move |x| u.apply_f32(x)),
            }
            true
        }
        (Op::Unary(u), TensorData::F64(v)) if rest.is_empty() && !u.is_predicate() => {
            let u = *u;
            for_each_chunk(v, move |x| u.apply_f64(x));
            true
        }
        (Op::Activation(a), TensorData::F32(v)) if rest.is_empty() => {
            let a = *a;
            match rlx_kernels::kernels::fastmath::act_slice_kernel(a) {
                Some(k) => rlx_kernels::kernels::fastmath::map_inplace_par(v, k),
                // As `activation` does out of place (ResNet-50's Relus after the residual
                // Adds, run op by op under RLX_DEBUG_NANS: 8.8 ms a run on an Ice Lake VM
                // through `apply_f32`, bench/NOTES.md §48).
                None if a == rlx_ir::Activation::Relu => for_each_chunk(v, relu_f32),
                None => for_each_chunk(v, move |x| a.apply_f32(x)),
            }
            true
        }
        (Op::Activation(a), TensorData::F64(v)) if rest.is_empty() => {
            let a = *a;
            for_each_chunk(v, move |x| a.apply_f64(x));
            true
        }
        _ => false,
    };
    if handled {
        check_result(|| op.name(), &first, out)?;
        return Ok(first);
    }
    if let (Op::Binary(b), [rhs]) = (op, rest) {
        if !b.is_predicate() && first.dims() == od.as_slice() && first.dtype() == rhs.dtype() {
            let b = *b;
            let bd = rhs.dims();
            let done = match (first.data_mut(), rhs.data()) {
                (TensorData::F32(x), TensorData::F32(y)) => {
                    match b {
                        rlx_ir::BinaryOp::Add => binary_into(x, &od, y, bd, |p, q| p + q)?,
                        rlx_ir::BinaryOp::Sub => binary_into(x, &od, y, bd, |p, q| p - q)?,
                        rlx_ir::BinaryOp::Mul => binary_into(x, &od, y, bd, |p, q| p * q)?,
                        rlx_ir::BinaryOp::Div => binary_into(x, &od, y, bd, |p, q| p / q)?,
                        rlx_ir::BinaryOp::Pow if y.len() == 1 && y[0] == 2.0 => {
                            binary_into(x, &od, y, bd, |p, _| p * p)?
                        }
                        rlx_ir::BinaryOp::Pow if y.len() == 1 && y[0] == 3.0 => {
                            binary_into(x, &od, y, bd, |p, _| p * p * p)?
                        }
                        // Max/Min monomorphized so the loop vectorizes (Clip's two halves).
                        rlx_ir::BinaryOp::Max => binary_into(x, &od, y, bd, max_f32)?,
                        rlx_ir::BinaryOp::Min => binary_into(x, &od, y, bd, min_f32)?,
                        _ => binary_into(x, &od, y, bd, |p, q| b.apply_f32(p, q))?,
                    }
                    true
                }
                (TensorData::F64(x), TensorData::F64(y)) => {
                    binary_into(x, &od, y, bd, |p, q| b.apply_f64(p, q))?;
                    true
                }
                _ => false,
            };
            if done {
                check_result(|| op.name(), &first, out)?;
                return Ok(first);
            }
        }
    }
    let mut ins: smallvec::SmallVec<[&Tensor; 4]> = smallvec::smallvec![&first];
    ins.extend_from_slice(rest);
    eval_op(op, &ins, out)
}

/// `first op second` for an Add or Mul into `second`'s buffer (input 1 dies at this node and
/// has the output's dims; `first` is broadcast). The closures keep `first` as the left
/// operand, as the out-of-place kernel has it (IEEE addition and multiplication commute;
/// only which of two NaN payloads survives could differ, as LLVM may commute either).
/// Other ops, dtypes or dims: the out-of-place kernel.
pub(crate) fn eval_owned_second(
    op: &Op,
    first: &Tensor,
    mut second: Tensor,
    out: &Shape,
) -> Result<Tensor, KernelError> {
    let od = out.dims_usize();
    if let Op::Binary(b @ (BinaryOp::Add | BinaryOp::Mul)) = op {
        if second.dims() == od.as_slice() && first.dtype() == second.dtype() {
            let fd = first.dims();
            let done = match (second.data_mut(), first.data()) {
                (TensorData::F32(x), TensorData::F32(y)) => add_mul_into(*b, x, &od, y, fd)?,
                (TensorData::F64(x), TensorData::F64(y)) => add_mul_into(*b, x, &od, y, fd)?,
                _ => false,
            };
            if done {
                check_result(|| op.name(), &second, out)?;
                return Ok(second);
            }
        }
    }
    eval_op(op, &[first, &second], out)
}

/// `x[i] = y[broadcast i] op x[i]` for `op` Add or Mul ([`binary_into`] with `y` kept as the
/// left operand); false for other ops.
fn add_mul_into<T>(
    op: BinaryOp,
    x: &mut [T],
    od: &[usize],
    y: &[T],
    yd: &[usize],
) -> Result<bool, KernelError>
where
    T: Copy + Send + Sync + 'static + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    match op {
        BinaryOp::Add => binary_into(x, od, y, yd, |q, p| p + q)?,
        BinaryOp::Mul => binary_into(x, od, y, yd, |q, p| p * q)?,
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, DType};

    /// The in-place Relu gives `Activation::Relu.apply_f32`'s bits (the ONNX definition
    /// `max(0, x)` with NaN kept and −0 passed through as `apply_f32` does), over the
    /// vector loop and its tail: NaN, ±inf, ±0, negatives, positives, subnormals.
    #[test]
    fn relu_in_place_gives_apply_f32_bits() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            -1.5,
            2.25,
            f32::MIN_POSITIVE / 2.0,
            -f32::MIN_POSITIVE / 2.0,
        ];
        for n in [1, 7, 16, 37, 100_003] {
            let v: Vec<f32> = (0..n)
                .map(|i| specials[i % specials.len()] * if i % 3 == 0 { 1.0 } else { 0.5 })
                .collect();
            let shape = Shape::new(&[n], DType::F32);
            let t = Tensor::from_f32(&[n], v.clone()).unwrap();
            let op = Op::Activation(Activation::Relu);
            let got = eval_owned(&op, t, &[], &shape).unwrap();
            let got = got.as_f32().unwrap();
            for (i, (&g, &x)) in got.iter().zip(&v).enumerate() {
                let want = Activation::Relu.apply_f32(x);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "n {n}, at {i}: relu({x}) = {g}"
                );
            }
        }
    }
}
