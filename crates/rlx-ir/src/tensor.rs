//! Host tensors: constants in the graph, typed inputs and outputs of the runtime.

use crate::{DType, Shape};
use half::{bf16, f16};
use std::fmt;

/// Typed element storage, one variant per [`DType`]. Bool is stored as `bool`.
#[derive(Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Apply `$body` to the inner vector of a [`TensorData`], whatever its type.
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
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::Bool($v) => $body,
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
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::Bool(_) => DType::Bool,
        }
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
            DType::I8 => TensorData::I8(vec![0; n]),
            DType::U8 => TensorData::U8(vec![0; n]),
            DType::Bool => TensorData::Bool(vec![false; n]),
        }
    }

    /// Element `i` widened to f64 (bool → 0/1). Panics if `i` is out of range.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            TensorData::F32(v) => v[i] as f64,
            TensorData::F16(v) => v[i].to_f64(),
            TensorData::BF16(v) => v[i].to_f64(),
            TensorData::F64(v) => v[i],
            TensorData::I64(v) => v[i] as f64,
            TensorData::I32(v) => v[i] as f64,
            TensorData::I8(v) => v[i] as f64,
            TensorData::U8(v) => v[i] as f64,
            TensorData::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// Element `i` as i64 (floats truncated toward zero, saturating; NaN → 0).
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            TensorData::I64(v) => v[i],
            TensorData::I32(v) => v[i] as i64,
            TensorData::I8(v) => v[i] as i64,
            TensorData::U8(v) => v[i] as i64,
            TensorData::Bool(v) => v[i] as i64,
            other => other.get_f64(i) as i64,
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
    /// (ONNX `Cast` semantics: float→int truncates toward zero, saturating in Rust's `as`;
    /// float→bool is `x != 0`; NaN→bool is true).
    pub fn from_f64(dtype: DType, v: &[f64]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::F64 => TensorData::F64(v.to_vec()),
            DType::I64 => TensorData::I64(v.iter().map(|&x| x as i64).collect()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i64 as i32).collect()),
            DType::I8 => TensorData::I8(v.iter().map(|&x| x as i64 as i8).collect()),
            DType::U8 => TensorData::U8(v.iter().map(|&x| x as i64 as u8).collect()),
            DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0.0).collect()),
        }
    }

    /// Build storage of `dtype` from i64 values (wrapping for narrower ints).
    pub fn from_i64(dtype: DType, v: &[i64]) -> TensorData {
        match dtype {
            DType::I64 => TensorData::I64(v.to_vec()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I8 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
            DType::U8 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
            DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0).collect()),
            f => TensorData::from_f64(f, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        }
    }

    /// Convert to another dtype with ONNX `Cast` semantics.
    pub fn cast(&self, to: DType) -> TensorData {
        if self.dtype() == to {
            return self.clone();
        }
        if self.dtype().is_float() {
            TensorData::from_f64(to, &self.to_f64_vec())
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
            TensorData::I8(v) => TensorData::I8(idx.iter().map(|&i| v[i]).collect()),
            TensorData::U8(v) => TensorData::U8(idx.iter().map(|&i| v[i]).collect()),
            TensorData::Bool(v) => TensorData::Bool(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.dtype(), self.len())
    }
}

/// A dense row-major host tensor.
///
/// Invariant: `data.len() == dims.iter().product()` (1 for a scalar).
/// Construct with [`Tensor::new`], which checks it.
#[derive(Clone, PartialEq, Debug)]
pub struct Tensor {
    dims: Vec<usize>,
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
    pub fn new(dims: Vec<usize>, data: TensorData) -> Result<Tensor, ElementCountError> {
        let expected: usize = dims.iter().product();
        if expected != data.len() {
            return Err(ElementCountError {
                dims,
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor { dims, data })
    }

    /// An f32 tensor (errors like [`Tensor::new`]).
    pub fn from_f32(dims: &[usize], v: Vec<f32>) -> Result<Tensor, ElementCountError> {
        Tensor::new(dims.to_vec(), TensorData::F32(v))
    }

    /// An i64 tensor (errors like [`Tensor::new`]).
    pub fn from_i64(dims: &[usize], v: Vec<i64>) -> Result<Tensor, ElementCountError> {
        Tensor::new(dims.to_vec(), TensorData::I64(v))
    }

    /// A scalar f32.
    pub fn scalar_f32(x: f32) -> Tensor {
        Tensor {
            dims: vec![],
            data: TensorData::F32(vec![x]),
        }
    }

    /// A scalar of `dtype` holding `x` (rounded/converted to the dtype).
    pub fn scalar(dtype: DType, x: f64) -> Tensor {
        Tensor {
            dims: vec![],
            data: TensorData::from_f64(dtype, &[x]),
        }
    }

    /// Zeros of `dtype` with `dims`.
    pub fn zeros(dims: &[usize], dtype: DType) -> Tensor {
        let n = dims.iter().product();
        Tensor {
            dims: dims.to_vec(),
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
    pub fn reshaped(self, dims: Vec<usize>) -> Result<Tensor, ElementCountError> {
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
