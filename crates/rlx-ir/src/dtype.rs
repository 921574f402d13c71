//! Element types.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
///
/// The set follows the ONNX `TensorProto.DataType` values RLX supports
/// (onnx.proto, `enum DataType`). Floating types are IEEE-754 binary32/64,
/// binary16 (`F16`) and bfloat16 (`BF16`, the upper half of a binary32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I8,
    U8,
    Bool,
}

impl DType {
    /// All dtypes, in declaration order.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];

    /// True for F32, F16, BF16 and F64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// True for the signed and unsigned integer types (not Bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::I8 | DType::U8)
    }

    /// Size of one element in bytes (Bool is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Largest finite value of a float dtype (`None` for non-float types).
    /// F16: 65504, BF16: 3.3895314e38, F32: 3.4028235e38.
    pub fn max_finite(self) -> Option<f64> {
        match self {
            DType::F16 => Some(65504.0),
            DType::BF16 => Some(half::bf16::MAX.to_f64()),
            DType::F32 => Some(f32::MAX as f64),
            DType::F64 => Some(f64::MAX),
            _ => None,
        }
    }

    /// Lower-case name as NumPy spells it (`float32`, `int64`, `bool`, ...).
    pub fn numpy_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Parse the short (`f32`, `i64`) or NumPy (`float32`, `int64`) name.
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.to_string() == s || d.numpy_name() == s)
    }
}

impl fmt::Display for DType {
    /// Short lower-case name: `f32`, `f16`, `bf16`, `f64`, `i64`, `i32`, `i8`, `u8`, `bool`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        };
        f.write_str(s)
    }
}
