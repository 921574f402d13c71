//! Host tensors: constants in the graph, typed inputs and outputs of the runtime.

use crate::{DType, Shape};
use half::{bf16, f16};
use std::fmt;

/// `x` rounded to f32 toward zero with the lowest bit set when inexact ("round to odd"):
/// rounding that to nearest in a format with at least two fewer significant bits (f16,
/// bf16) gives the correctly rounded value of `x`, with no double rounding.
fn f32_round_to_odd(x: f64) -> f32 {
    let f = x as f32;
    if f.is_nan() || f as f64 == x {
        return f;
    }
    // `f` is the nearest f32 (±inf above f32's range); step its magnitude down by one
    // where it rounded away from zero, then mark the discarded bits in the last bit.
    let t = if (f as f64).abs() > x.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(t.to_bits() | 1)
}

/// `x` correctly rounded to f16 (nearest, ties to even). `half::f16::from_f64` looks only at
/// the top 32 bits of the f64, so a value just above a halfway point (its excess in the low
/// bits, e.g. the f32 `1 + 2^-11 + 2^-23`) is rounded as a tie, to even: one ulp low.
pub fn f16_from_f64(x: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(x))
}

/// `x` correctly rounded to bfloat16 (nearest, ties to even); see [`f16_from_f64`]
/// (`half::bf16::from_f64` rounds the f32 `1 + 2^-8 + 2^-23` to 1 instead of `1 + 2^-7`).
pub fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(x))
}

/// Typed element storage, one variant per full [`DType`]. Bool is stored as `bool`.
/// The storage-only narrow dtypes ([`DType::is_narrow`]) share [`TensorData::Narrow`].
#[derive(Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    /// float8 / float4 / int4 / uint4 / int2 / uint2: one bit code per element in the low
    /// bits of a byte (unpacked), decoded by [`crate::narrow`]. Invariant: `dtype.is_narrow()`
    /// (construct with [`TensorData::narrow`]).
    Narrow {
        dtype: DType,
        codes: Vec<u8>,
    },
}

/// Apply `$body` to the inner vector of a [`TensorData`], whatever its type (for
/// `Narrow`, the `Vec<u8>` of codes).
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::F64($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::I16($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::U16($v) => $body,
            $crate::TensorData::U32($v) => $body,
            $crate::TensorData::U64($v) => $body,
            $crate::TensorData::Bool($v) => $body,
            $crate::TensorData::Narrow { codes: $v, .. } => $body,
        }
    };
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::F64(_) => DType::F64,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::I16(_) => DType::I16,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::U16(_) => DType::U16,
            TensorData::U32(_) => DType::U32,
            TensorData::U64(_) => DType::U64,
            TensorData::Bool(_) => DType::Bool,
            TensorData::Narrow { dtype, .. } => *dtype,
        }
    }

    /// Narrow storage of `dtype` holding `codes` (each masked to the dtype's width).
    /// Panics if `dtype` is not narrow (a programming error, not a data error).
    pub fn narrow(dtype: DType, mut codes: Vec<u8>) -> TensorData {
        assert!(
            dtype.is_narrow(),
            "TensorData::narrow: {dtype} is not a narrow dtype"
        );
        if dtype.bits() < 8 {
            let mask = (1u8 << dtype.bits()) - 1;
            codes.iter_mut().for_each(|c| *c &= mask);
        }
        TensorData::Narrow { dtype, codes }
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (false for Bool) of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(vec![0.0; n]),
            DType::F16 => TensorData::F16(vec![f16::ZERO; n]),
            DType::BF16 => TensorData::BF16(vec![bf16::ZERO; n]),
            DType::F64 => TensorData::F64(vec![0.0; n]),
            DType::I64 => TensorData::I64(vec![0; n]),
            DType::I32 => TensorData::I32(vec![0; n]),
            DType::I16 => TensorData::I16(vec![0; n]),
            DType::I8 => TensorData::I8(vec![0; n]),
            DType::U8 => TensorData::U8(vec![0; n]),
            DType::U16 => TensorData::U16(vec![0; n]),
            DType::U32 => TensorData::U32(vec![0; n]),
            DType::U64 => TensorData::U64(vec![0; n]),
            DType::Bool => TensorData::Bool(vec![false; n]),
            // Code 0 is +0 in every narrow format.
            d => TensorData::narrow(d, vec![0; n]),
        }
    }

    /// Element `i` widened to f64 (bool → 0/1; u64 above 2^53 rounds). Panics if `i` is
    /// out of range.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            TensorData::F32(v) => v[i] as f64,
            TensorData::F16(v) => v[i].to_f64(),
            TensorData::BF16(v) => v[i].to_f64(),
            TensorData::F64(v) => v[i],
            TensorData::I64(v) => v[i] as f64,
            TensorData::I32(v) => v[i] as f64,
            TensorData::I16(v) => v[i] as f64,
            TensorData::I8(v) => v[i] as f64,
            TensorData::U8(v) => v[i] as f64,
            TensorData::U16(v) => v[i] as f64,
            TensorData::U32(v) => v[i] as f64,
            TensorData::U64(v) => v[i] as f64,
            TensorData::Bool(v) => v[i] as u8 as f64,
            TensorData::Narrow { dtype, codes } => crate::narrow::decode_f64(*dtype, codes[i]),
        }
    }

    /// Element `i` as i64 (floats truncated toward zero, saturating; NaN → 0; u64 above
    /// `i64::MAX` keeps its bit pattern, i.e. wraps negative, so that a cast back or to a
    /// narrower integer is exact).
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            TensorData::I64(v) => v[i],
            TensorData::I32(v) => v[i] as i64,
            TensorData::I16(v) => v[i] as i64,
            TensorData::I8(v) => v[i] as i64,
            TensorData::U8(v) => v[i] as i64,
            TensorData::U16(v) => v[i] as i64,
            TensorData::U32(v) => v[i] as i64,
            TensorData::U64(v) => v[i] as i64,
            TensorData::Bool(v) => v[i] as i64,
            TensorData::Narrow { dtype, codes } => crate::narrow::decode_i64(*dtype, codes[i]),
            other => other.get_f64(i) as i64,
        }
    }

    /// Element `i` as i128: exact for every integer type (u64 included); floats truncated
    /// toward zero, saturating, NaN → 0.
    pub fn get_i128(&self, i: usize) -> i128 {
        match self {
            TensorData::U64(v) => v[i] as i128,
            d if d.dtype().is_float() => d.get_f64(i) as i128,
            d => d.get_i64(i) as i128,
        }
    }

    /// All elements widened to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get_f64(i)).collect()
    }

    /// All elements as i64 (see [`TensorData::get_i64`]).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.len()).map(|i| self.get_i64(i)).collect()
    }

    /// All elements as f32 (f64 rounded, integers converted).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            TensorData::F32(v) => v.clone(),
            _ => (0..self.len()).map(|i| self.get_f64(i) as f32).collect(),
        }
    }

    /// Build storage of `dtype` from f64 values, rounding to the dtype
    /// (ONNX `Cast` semantics: float→int truncates toward zero, saturating in Rust's `as`,
    /// negative → unsigned wraps like C via i64; float→bool is `x != 0`; NaN→bool is true;
    /// narrow types as [`crate::narrow::encode_f64`] with `saturate`).
    pub fn from_f64(dtype: DType, v: &[f64]) -> TensorData {
        TensorData::from_f64_sat(dtype, v, true)
    }

    /// [`TensorData::from_f64`] with ONNX Cast's `saturate` attribute (it matters only for
    /// the float8 types).
    pub fn from_f64_sat(dtype: DType, v: &[f64], saturate: bool) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F16 => TensorData::F16(v.iter().map(|&x| f16_from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16_from_f64(x)).collect()),
            DType::F64 => TensorData::F64(v.to_vec()),
            DType::I64 => TensorData::I64(v.iter().map(|&x| x as i64).collect()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i64 as i32).collect()),
            DType::I16 => TensorData::I16(v.iter().map(|&x| x as i64 as i16).collect()),
            DType::I8 => TensorData::I8(v.iter().map(|&x| x as i64 as i8).collect()),
            DType::U8 => TensorData::U8(v.iter().map(|&x| x as i64 as u8).collect()),
            DType::U16 => TensorData::U16(v.iter().map(|&x| x as i64 as u16).collect()),
            DType::U32 => TensorData::U32(v.iter().map(|&x| x as i64 as u32).collect()),
            DType::U64 => TensorData::U64(
                v.iter()
                    .map(|&x| if x < 0.0 { x as i64 as u64 } else { x as u64 })
                    .collect(),
            ),
            DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0.0).collect()),
            d => TensorData::Narrow {
                dtype: d,
                codes: v
                    .iter()
                    .map(|&x| crate::narrow::encode_f64(d, x, saturate))
                    .collect(),
            },
        }
    }

    /// Build storage of `dtype` from i64 values (wrapping for narrower ints, u64 keeps the
    /// bit pattern).
    pub fn from_i64(dtype: DType, v: &[i64]) -> TensorData {
        match dtype {
            DType::I64 => TensorData::I64(v.to_vec()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I16 => TensorData::I16(v.iter().map(|&x| x as i16).collect()),
            DType::I8 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
            DType::U8 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
            DType::U16 => TensorData::U16(v.iter().map(|&x| x as u16).collect()),
            DType::U32 => TensorData::U32(v.iter().map(|&x| x as u32).collect()),
            DType::U64 => TensorData::U64(v.iter().map(|&x| x as u64).collect()),
            DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0).collect()),
            d if d.is_narrow() && !d.is_float() => TensorData::Narrow {
                dtype: d,
                codes: v.iter().map(|&x| crate::narrow::encode_i64(d, x)).collect(),
            },
            f => TensorData::from_f64(f, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        }
    }

    /// Convert to another dtype with ONNX `Cast` semantics (`saturate = 1`).
    pub fn cast(&self, to: DType) -> TensorData {
        self.cast_sat(to, true)
    }

    /// Convert to another dtype with ONNX `Cast` semantics and its `saturate` attribute:
    /// floats (narrow ones decoded exactly) go through f64, integers through i64 (wrapping
    /// like C), u64 → float through u64.
    pub fn cast_sat(&self, to: DType, saturate: bool) -> TensorData {
        let from = self.dtype();
        if from == to {
            return self.clone();
        }
        if from.is_float() || to.is_float() {
            TensorData::from_f64_sat(to, &self.to_f64_vec(), saturate)
        } else {
            TensorData::from_i64(to, &self.to_i64_vec())
        }
    }

    /// Select elements by index (`out[k] = self[idx[k]]`), keeping the dtype.
    pub fn gather(&self, idx: &[usize]) -> TensorData {
        match self {
            TensorData::F32(v) => TensorData::F32(idx.iter().map(|&i| v[i]).collect()),
            TensorData::F16(v) => TensorData::F16(idx.iter().map(|&i| v[i]).collect()),
            TensorData::BF16(v) => TensorData::BF16(idx.iter().map(|&i| v[i]).collect()),
            TensorData::F64(v) => TensorData::F64(idx.iter().map(|&i| v[i]).collect()),
            TensorData::I64(v) => TensorData::I64(idx.iter().map(|&i| v[i]).collect()),
            TensorData::I32(v) => TensorData::I32(idx.iter().map(|&i| v[i]).collect()),
            TensorData::I16(v) => TensorData::I16(idx.iter().map(|&i| v[i]).collect()),
            TensorData::I8(v) => TensorData::I8(idx.iter().map(|&i| v[i]).collect()),
            TensorData::U8(v) => TensorData::U8(idx.iter().map(|&i| v[i]).collect()),
            TensorData::U16(v) => TensorData::U16(idx.iter().map(|&i| v[i]).collect()),
            TensorData::U32(v) => TensorData::U32(idx.iter().map(|&i| v[i]).collect()),
            TensorData::U64(v) => TensorData::U64(idx.iter().map(|&i| v[i]).collect()),
            TensorData::Bool(v) => TensorData::Bool(idx.iter().map(|&i| v[i]).collect()),
            TensorData::Narrow { dtype, codes } => TensorData::Narrow {
                dtype: *dtype,
                codes: idx.iter().map(|&i| codes[i]).collect(),
            },
        }
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.dtype(), self.len())
    }
}

/// A tensor's dims: up to 6 are held inline, without a heap allocation (kernels build one
/// per output, so a `Vec` here was an allocation and a free per op per run); more spill to
/// the heap.
pub type Dims = smallvec::SmallVec<[usize; 6]>;

/// A dense row-major host tensor.
///
/// Invariant: `data.len() == dims.iter().product()` (1 for a scalar).
/// Construct with [`Tensor::new`], which checks it.
#[derive(Clone, PartialEq, Debug)]
pub struct Tensor {
    dims: Dims,
    data: TensorData,
}

/// Error for a tensor whose element count does not match its dims.
#[derive(Debug, thiserror::Error)]
#[error("tensor data has {got} elements but shape {dims:?} needs {expected}")]
pub struct ElementCountError {
    pub dims: Vec<usize>,
    pub expected: usize,
    pub got: usize,
}

impl Tensor {
    /// A tensor with `dims` and `data`; errors if the element count does not match.
    ///
    /// `dims` is anything that converts into [`Dims`] (a `Vec<usize>`, a `&[usize]`, or
    /// `Dims` itself, which kernels build without a heap allocation).
    pub fn new(dims: impl Into<Dims>, data: TensorData) -> Result<Tensor, ElementCountError> {
        let dims: Dims = dims.into();
        let expected: usize = dims.iter().product();
        if expected != data.len() {
            return Err(ElementCountError {
                dims: dims.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor { dims, data })
    }

    /// An f32 tensor (errors like [`Tensor::new`]).
    pub fn from_f32(dims: &[usize], v: Vec<f32>) -> Result<Tensor, ElementCountError> {
        Tensor::new(dims, TensorData::F32(v))
    }

    /// An i64 tensor (errors like [`Tensor::new`]).
    pub fn from_i64(dims: &[usize], v: Vec<i64>) -> Result<Tensor, ElementCountError> {
        Tensor::new(dims, TensorData::I64(v))
    }

    /// A scalar f32.
    pub fn scalar_f32(x: f32) -> Tensor {
        Tensor {
            dims: Dims::new(),
            data: TensorData::F32(vec![x]),
        }
    }

    /// A scalar of `dtype` holding `x` (rounded/converted to the dtype).
    pub fn scalar(dtype: DType, x: f64) -> Tensor {
        Tensor {
            dims: Dims::new(),
            data: TensorData::from_f64(dtype, &[x]),
        }
    }

    /// Zeros of `dtype` with `dims`.
    pub fn zeros(dims: &[usize], dtype: DType) -> Tensor {
        let n = dims.iter().product();
        Tensor {
            dims: Dims::from_slice(dims),
            data: TensorData::zeros(dtype, n),
        }
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
    pub fn data(&self) -> &TensorData {
        &self.data
    }
    pub fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }
    pub fn into_data(self) -> TensorData {
        self.data
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// The tensor's type as a static [`Shape`].
    pub fn shape(&self) -> Shape {
        Shape::new(&self.dims, self.dtype())
    }

    /// Same data, new dims (errors if the element count differs).
    pub fn reshaped(self, dims: impl Into<Dims>) -> Result<Tensor, ElementCountError> {
        Tensor::new(dims, self.data)
    }

    /// The f32 slice when the dtype is F32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn f64_to_half_types_round_correctly_past_the_top_32_bits() {
        // just above a halfway point, the excess only in the f64's low 32 bits
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-23);
        assert_eq!(super::bf16_from_f64(x).to_f64(), 1.0 + 2f64.powi(-7));
        assert_eq!(super::bf16_from_f64(1.0 + 2f64.powi(-8)).to_f64(), 1.0); // a tie: even
        let y = 1.0 + 2f64.powi(-11) + 2f64.powi(-23);
        assert_eq!(super::f16_from_f64(y).to_f64(), 1.0 + 2f64.powi(-10));
        assert_eq!(super::f16_from_f64(-y).to_f64(), -(1.0 + 2f64.powi(-10)));
        assert_eq!(super::f16_from_f64(65520.0).to_f64(), f64::INFINITY);
        assert_eq!(super::f16_from_f64(65519.99).to_f64(), 65504.0);
        assert_eq!(super::bf16_from_f64(f64::MAX).to_f64(), f64::INFINITY);
        assert_eq!(super::bf16_from_f64(-1e-300).to_bits(), 0x8000); // -0
        assert_eq!(
            super::bf16_from_f64(2f64.powi(-134) * 1.01).to_f64(),
            2f64.powi(-133)
        );
        assert!(super::bf16_from_f64(f64::NAN).is_nan());
    }

    use super::*;

    #[test]
    fn u64_above_i64_max_round_trips() {
        let big = u64::MAX - 5;
        let d = TensorData::U64(vec![big, 7]);
        assert_eq!(d.get_i128(0), big as i128);
        // Through i64 (bit pattern) and back is exact.
        assert_eq!(d.cast(DType::I64).cast(DType::U64), d);
        // To float through u64, not i64.
        assert_eq!(d.cast(DType::F64).get_f64(0), big as f64);
        // Narrowing wraps like C: (2^64 - 6) mod 2^16 = 65530.
        assert_eq!(d.cast(DType::U16), TensorData::U16(vec![65530, 7]));
        assert_eq!(d.cast(DType::I16), TensorData::I16(vec![-6, 7]));
    }

    #[test]
    fn int_casts_wrap_like_c() {
        let d = TensorData::I32(vec![-1, 70000, 40000]);
        assert_eq!(
            d.cast(DType::U16),
            TensorData::U16(vec![65535, 4464, 40000])
        );
        assert_eq!(d.cast(DType::I16), TensorData::I16(vec![-1, 4464, -25536]));
        assert_eq!(
            d.cast(DType::U32),
            TensorData::U32(vec![u32::MAX, 70000, 40000])
        );
        assert_eq!(d.cast(DType::U64).get_i128(0), u64::MAX as i128);
        // float → unsigned: truncate toward zero; negative wraps through i64 (x86 NumPy).
        let f = TensorData::F32(vec![2.9, -1.0]);
        assert_eq!(f.cast(DType::U32), TensorData::U32(vec![2, u32::MAX]));
    }

    #[test]
    fn narrow_casts() {
        // ONNX Cast float → float8 E4M3FN with and without saturate.
        let f = TensorData::F32(vec![0.1, 1e6, f32::INFINITY, f32::NAN]);
        let sat = f.cast(DType::F8E4M3FN);
        assert_eq!(
            sat,
            TensorData::narrow(DType::F8E4M3FN, vec![0x1d, 0x7e, 0x7e, 0x7f])
        );
        let nosat = f.cast_sat(DType::F8E4M3FN, false);
        assert_eq!(
            nosat,
            TensorData::narrow(DType::F8E4M3FN, vec![0x1d, 0x7f, 0x7f, 0x7f])
        );
        let back = sat.cast(DType::F32).to_f64_vec();
        assert_eq!(&back[..3], &[0.1015625, 448.0, 448.0]);
        assert!(back[3].is_nan());
        // int4: codes are the low 4 bits, decoded sign-extended; ints wrap.
        let i = TensorData::I64(vec![-9, -8, 7, 8, 15]);
        let q = i.cast(DType::I4);
        assert_eq!(q.to_i64_vec(), vec![7, -8, 7, -8, -1]);
        assert_eq!(i.cast(DType::U4).to_i64_vec(), vec![7, 8, 7, 8, 15]);
        assert_eq!(q.cast(DType::I8), TensorData::I8(vec![7, -8, 7, -8, -1]));
        // narrow → narrow goes through the value.
        let u2 = TensorData::narrow(DType::U2, vec![3, 2]);
        assert_eq!(u2.cast(DType::F4E2M1).to_f64_vec(), vec![3.0, 2.0]);
    }
}
