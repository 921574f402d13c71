//! Output comparison with the rules of onnx's backend test runner
//! (`onnx/backend/test/runner/__init__.py`, `Runner.assert_similar_outputs`), tightened where
//! the runner is loose:
//!
//! * dtype and dims exact;
//! * floats: `|got - expected| <= atol + rtol * |expected|` (NumPy's `isclose`), NaN equal to
//!   NaN, an infinity equal only to the infinity of the same sign; bf16 uses
//!   `rtol = max(rtol, 2^-6)` (two bf16 ULPs, as the runner does);
//! * integers and bools exact (the runner would use `assert_allclose` on them too).
//!
//! The node test cases all use rtol 1e-3, atol 1e-7 ([`RTOL`], [`ATOL`]).
//! `scripts/gen_onnx_node_suite.py` applies the same rules to onnxruntime.

use rlx_ir::{DType, Tensor, TensorData};

/// Relative tolerance of every onnx node test case (`onnx/backend/test/case/node/__init__.py`).
pub const RTOL: f64 = 1e-3;
/// Absolute tolerance of every onnx node test case.
pub const ATOL: f64 = 1e-7;
/// Relative tolerance floor for bfloat16 outputs (onnx's runner: two bf16 ULPs).
pub const BF16_RTOL: f64 = 1.0 / 64.0;

/// Whether `got` matches `expected`: `Ok(())`, or a one-line description of the first
/// difference (dtype, dims, or how many elements differ, the first one and the largest
/// absolute difference).
pub fn compare(expected: &Tensor, got: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if expected.dtype() != got.dtype() {
        return Err(format!(
            "dtype {} != expected {}",
            got.dtype(),
            expected.dtype()
        ));
    }
    if expected.dims() != got.dims() {
        return Err(format!(
            "dims {:?} != expected {:?}",
            got.dims(),
            expected.dims()
        ));
    }
    let (e, g) = (expected.data(), got.data());
    let n = e.len();
    let mut bad = 0usize;
    let mut first: Option<usize> = None;
    let mut max_abs = 0f64;
    if expected.dtype().is_float() {
        let rtol = if expected.dtype() == DType::BF16 {
            rtol.max(BF16_RTOL)
        } else {
            rtol
        };
        for i in 0..n {
            let (b, a) = (e.get_f64(i), g.get_f64(i));
            if !close(a, b, rtol, atol) {
                bad += 1;
                first.get_or_insert(i);
                if a.is_finite() && b.is_finite() {
                    max_abs = max_abs.max((a - b).abs());
                }
            }
        }
    } else {
        for i in 0..n {
            if !int_eq(e, g, i) {
                bad += 1;
                first.get_or_insert(i);
            }
        }
    }
    match first {
        None => Ok(()),
        Some(i) => {
            let mut s = format!(
                "{bad} of {n} elements differ (first at {i}: got {}, expected {})",
                fmt_elem(g, i),
                fmt_elem(e, i)
            );
            if expected.dtype().is_float() && max_abs > 0.0 {
                s.push_str(&format!(", max |diff| {max_abs:.3e}"));
            }
            Err(s)
        }
    }
}

/// `|a - b| <= atol + rtol * |b|`, NaN equal to NaN, infinities equal only to themselves.
pub fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= atol + rtol * b.abs()
}

fn int_eq(e: &TensorData, g: &TensorData, i: usize) -> bool {
    match (e, g) {
        (TensorData::Bool(x), TensorData::Bool(y)) => x[i] == y[i],
        _ => e.get_i64(i) == g.get_i64(i),
    }
}

fn fmt_elem(d: &TensorData, i: usize) -> String {
    match d {
        TensorData::Bool(v) => v[i].to_string(),
        d if d.dtype().is_float() => format!("{:?}", d.get_f64(i)),
        d => d.get_i128(i).to_string(),
    }
}

/// True when a float tensor holds a NaN or an infinity.
pub fn has_nonfinite(t: &Tensor) -> bool {
    let d = t.data();
    d.dtype().is_float() && (0..d.len()).any(|i| !d.get_f64(i).is_finite())
}

/// Bit-for-bit equality (NaN payloads and the sign of zero included): what a debug switch must
/// not change.
pub fn identical(a: &Tensor, b: &Tensor) -> bool {
    if a.dims() != b.dims() || a.dtype() != b.dtype() {
        return false;
    }
    match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => {
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (TensorData::F64(x), TensorData::F64(y)) => {
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (TensorData::F16(x), TensorData::F16(y)) => {
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (TensorData::BF16(x), TensorData::BF16(y)) => {
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (x, y) => x == y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn f32t(v: &[f32]) -> Tensor {
        Tensor::from_f32(&[v.len()], v.to_vec()).unwrap()
    }

    #[test]
    fn float_rules() {
        assert!(compare(
            &f32t(&[1.0, f32::NAN, f32::INFINITY]),
            &f32t(&[1.0005, f32::NAN, f32::INFINITY]),
            RTOL,
            ATOL
        )
        .is_ok());
        // beyond rtol
        assert!(compare(&f32t(&[1.0]), &f32t(&[1.002]), RTOL, ATOL).is_err());
        // NaN vs number, inf vs -inf, inf vs max
        assert!(compare(&f32t(&[f32::NAN]), &f32t(&[0.0]), RTOL, ATOL).is_err());
        assert!(compare(
            &f32t(&[f32::INFINITY]),
            &f32t(&[f32::NEG_INFINITY]),
            RTOL,
            ATOL
        )
        .is_err());
        assert!(compare(&f32t(&[f32::NEG_INFINITY]), &f32t(&[f32::MIN]), RTOL, ATOL).is_err());
        // atol near zero: 5e-8 passes, 1e-6 does not
        assert!(compare(&f32t(&[0.0]), &f32t(&[5e-8]), RTOL, ATOL).is_ok());
        assert!(compare(&f32t(&[0.0]), &f32t(&[1e-6]), RTOL, ATOL).is_err());
    }

    #[test]
    fn dtype_and_dims_exact() {
        let a = f32t(&[1.0, 2.0]);
        let b = Tensor::new(vec![2], TensorData::F64(vec![1.0, 2.0])).unwrap();
        assert!(compare(&a, &b, RTOL, ATOL).unwrap_err().contains("dtype"));
        let c = Tensor::from_f32(&[1, 2], vec![1.0, 2.0]).unwrap();
        assert!(compare(&a, &c, RTOL, ATOL).unwrap_err().contains("dims"));
        // scalar vs [1]
        let s = Tensor::scalar_f32(1.0);
        assert!(compare(&s, &f32t(&[1.0]), RTOL, ATOL).is_err());
    }

    #[test]
    fn ints_exact_bf16_wider() {
        let a = Tensor::from_i64(&[2], vec![1_000_000, 5]).unwrap();
        let b = Tensor::from_i64(&[2], vec![1_000_001, 5]).unwrap();
        assert!(compare(&a, &b, RTOL, ATOL).is_err());
        let x = Tensor::new(vec![1], TensorData::BF16(vec![bf16::from_f32(1.0)])).unwrap();
        let y = Tensor::new(vec![1], TensorData::BF16(vec![bf16::from_f32(1.0078125)])).unwrap();
        assert!(compare(&x, &y, RTOL, ATOL).is_ok());
        let z = Tensor::new(vec![1], TensorData::BF16(vec![bf16::from_f32(1.03125)])).unwrap();
        assert!(compare(&x, &z, RTOL, ATOL).is_err());
    }

    #[test]
    fn identical_is_bitwise() {
        assert!(identical(&f32t(&[f32::NAN, 1.0]), &f32t(&[f32::NAN, 1.0])));
        assert!(!identical(&f32t(&[0.0]), &f32t(&[-0.0])));
        assert!(has_nonfinite(&f32t(&[1.0, f32::NEG_INFINITY])));
        assert!(!has_nonfinite(&Tensor::from_i64(&[1], vec![3]).unwrap()));
    }
}
