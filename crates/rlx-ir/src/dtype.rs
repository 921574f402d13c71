//! Element types.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
///
/// The set follows the ONNX `TensorProto.DataType` values RLX supports
/// (onnx.proto, `enum DataType`). Floating types are IEEE-754 binary32/64,
/// binary16 (`F16`) and bfloat16 (`BF16`, the upper half of a binary32).
///
/// The *narrow* types (`F8*`, `F4E2M1`, `I4`, `U4`, `I2`, `U2`) are storage-only: a tensor
/// holds one bit code per element (`TensorData::Narrow`), and only Cast, the quantization
/// ops and data movement (reshape, transpose, gather, ...) accept them. Their encodings are
/// the ONNX ones (onnx.proto comments, `docs/Float8.md`, `docs/Float4.md` of onnx), equal to
/// `ml_dtypes`' `float8_e4m3fn`, `float8_e4m3fnuz`, `float8_e5m2`, `float8_e5m2fnuz`,
/// `float4_e2m1fn`, `float8_e8m0fnu`, `int4`, `uint4`, `int2`, `uint2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    U16,
    U32,
    U64,
    Bool,
    /// float8 E4M3, finite only: NaN is S.1111.111, no Inf, max 448 (bias 7).
    F8E4M3FN,
    /// float8 E4M3, finite, unsigned zero: NaN is 0x80, no -0, no Inf, max 240 (bias 8).
    F8E4M3FNUZ,
    /// float8 E5M2 (IEEE-like: Inf S.11111.00, NaN S.11111.xx), max 57344 (bias 15).
    F8E5M2,
    /// float8 E5M2, finite, unsigned zero: NaN is 0x80, no Inf, max 57344 (bias 16).
    F8E5M2FNUZ,
    /// float4 E2M1 (no NaN, no Inf), max 6 (bias 1).
    F4E2M1,
    /// float8 E8M0 (OCP MX scale, `ml_dtypes.float8_e8m0fnu`): exponent only, value
    /// `2^(code - 127)`; no sign, no zero, no Inf; 0xFF is NaN; max 2^127.
    F8E8M0,
    /// 4-bit signed integer, -8..=7.
    I4,
    /// 4-bit unsigned integer, 0..=15.
    U4,
    /// 2-bit signed integer, -2..=1.
    I2,
    /// 2-bit unsigned integer, 0..=3.
    U2,
}

impl DType {
    /// All dtypes, in declaration order.
    pub const ALL: [DType; 23] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
        DType::F8E8M0,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    /// True for every floating type: F32, F16, BF16, F64 and the narrow floats.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64) || self.is_narrow_float()
    }

    /// True for the signed and unsigned integer types (not Bool), narrow ones included.
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I64
                | DType::I32
                | DType::I16
                | DType::I8
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
                | DType::I4
                | DType::U4
                | DType::I2
                | DType::U2
        )
    }

    /// True for the unsigned integer types.
    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::U4 | DType::U2
        )
    }

    /// True for the storage-only types held as bit codes (`TensorData::Narrow`).
    pub fn is_narrow(self) -> bool {
        self.is_narrow_float() || matches!(self, DType::I4 | DType::U4 | DType::I2 | DType::U2)
    }

    /// True for the float8 and float4 types.
    pub fn is_narrow_float(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F8E8M0
                | DType::F4E2M1
        )
    }

    /// Bits of one element: 64..1 (Bool counts as 8, it is stored as one byte).
    pub fn bits(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::I8 | DType::U8 | DType::Bool => 8,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ => 8,
            DType::F8E8M0 => 8,
            DType::F4E2M1 | DType::I4 | DType::U4 => 4,
            DType::I2 | DType::U2 => 2,
        }
    }

    /// Size of one element in bytes as RLX stores it (Bool and the narrow types use one
    /// byte per element; ONNX packs the 4- and 2-bit ones, see `bits`).
    pub fn size_bytes(self) -> usize {
        self.bits().div_ceil(8)
    }

    /// Largest finite value of a float dtype (`None` for non-float types).
    /// F16: 65504, BF16: 3.3895314e38, F32: 3.4028235e38, F8E4M3FN: 448, F8E4M3FNUZ: 240,
    /// F8E5M2(FNUZ): 57344, F4E2M1: 6, F8E8M0: 2^127.
    pub fn max_finite(self) -> Option<f64> {
        match self {
            DType::F16 => Some(65504.0),
            DType::BF16 => Some(half::bf16::MAX.to_f64()),
            DType::F32 => Some(f32::MAX as f64),
            DType::F64 => Some(f64::MAX),
            DType::F8E8M0 => Some(2f64.powi(127)),
            d if d.is_narrow_float() => crate::narrow::MiniFloat::of(d).map(|m| m.max()),
            _ => None,
        }
    }

    /// Lower-case name as NumPy / `ml_dtypes` spells it (`float32`, `int64`, `bool`,
    /// `float8_e4m3fn`, `int4`, ...).
    pub fn numpy_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::F4E2M1 => "float4_e2m1fn",
            DType::F8E8M0 => "float8_e8m0fnu",
            DType::I4 => "int4",
            DType::U4 => "uint4",
            DType::I2 => "int2",
            DType::U2 => "uint2",
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
    /// Short lower-case name: `f32`, `f16`, `bf16`, `f64`, `i64`, `i32`, `i16`, `i8`, `u8`,
    /// `u16`, `u32`, `u64`, `bool`, `f8e4m3fn`, `f8e4m3fnuz`, `f8e5m2`, `f8e5m2fnuz`,
    /// `f4e2m1`, `f8e8m0`, `i4`, `u4`, `i2`, `u2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F4E2M1 => "f4e2m1",
            DType::F8E8M0 => "f8e8m0",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
        };
        f.write_str(s)
    }
}
