//! `TensorProto` → [`Tensor`]: raw little-endian data, typed fields, and external data.
//!
//! Every element count is checked against `dims` before anything is allocated, so a bogus
//! `dims` field fails with an error instead of a huge allocation.

use crate::proto::{data_type as dt, TensorProto, DATA_LOCATION_EXTERNAL};
use half::{bf16, f16};
use rlx_ir::{DType, Tensor, TensorData};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// The RLX dtype of an ONNX `TensorProto.DataType` value, if RLX supports it.
pub fn dtype_of(onnx: i32) -> Option<DType> {
    Some(match onnx {
        dt::FLOAT => DType::F32,
        dt::UINT8 => DType::U8,
        dt::INT8 => DType::I8,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::BOOL => DType::Bool,
        dt::FLOAT16 => DType::F16,
        dt::DOUBLE => DType::F64,
        dt::BFLOAT16 => DType::BF16,
        dt::INT16 => DType::I16,
        dt::UINT16 => DType::U16,
        dt::UINT32 => DType::U32,
        dt::UINT64 => DType::U64,
        dt::FLOAT8E4M3FN => DType::F8E4M3FN,
        dt::FLOAT8E4M3FNUZ => DType::F8E4M3FNUZ,
        dt::FLOAT8E5M2 => DType::F8E5M2,
        dt::FLOAT8E5M2FNUZ => DType::F8E5M2FNUZ,
        dt::FLOAT4E2M1 => DType::F4E2M1,
        dt::FLOAT8E8M0 => DType::F8E8M0,
        dt::INT4 => DType::I4,
        dt::UINT4 => DType::U4,
        dt::INT2 => DType::I2,
        dt::UINT2 => DType::U2,
        _ => return None,
    })
}

/// ONNX name of a `TensorProto.DataType` value, for error messages.
pub fn onnx_type_name(onnx: i32) -> String {
    const NAMES: [&str; 29] = [
        "UNDEFINED",
        "FLOAT",
        "UINT8",
        "INT8",
        "UINT16",
        "INT16",
        "INT32",
        "INT64",
        "STRING",
        "BOOL",
        "FLOAT16",
        "DOUBLE",
        "UINT32",
        "UINT64",
        "COMPLEX64",
        "COMPLEX128",
        "BFLOAT16",
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "UINT4",
        "INT4",
        "FLOAT4E2M1",
        "FLOAT8E8M0",
        "UINT2",
        "INT2",
        "FLOAT6E2M3",
        "FLOAT6E3M2",
    ];
    NAMES
        .get(onnx as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("data type {onnx}"))
}

/// Element count of `dims`, checked: no negative dims, no overflow.
pub fn checked_numel(dims: &[i64]) -> Result<(Vec<usize>, usize), String> {
    let mut n: usize = 1;
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        if d < 0 {
            return Err(format!("negative dim {d} in dims {dims:?}"));
        }
        let d = usize::try_from(d).map_err(|_| format!("dim {d} too large"))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| format!("dims {dims:?} overflow the element count"))?;
        out.push(d);
    }
    Ok((out, n))
}

/// Decode `TensorProto` `t` into a tensor. `base_dir` is the model's folder, needed for
/// external data (`data_location = EXTERNAL`; `location` must be a relative path that stays
/// inside `base_dir`). Errors are messages; callers attach the tensor name.
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, String> {
    let dtype = dtype_of(t.data_type).ok_or_else(|| {
        format!(
            "element type {} is not supported",
            onnx_type_name(t.data_type)
        )
    })?;
    let (dims, n) = checked_numel(&t.dims)?;
    // Bytes of raw data: 4- and 2-bit types are packed (two / four per byte, low bits first).
    let per_byte = 8 / dtype.bits().min(8);
    let nbytes = if per_byte > 1 {
        n.div_ceil(per_byte)
    } else {
        n.checked_mul(dtype.size_bytes())
            .ok_or_else(|| format!("dims {:?} overflow the byte size", t.dims))?
    };

    let data = if t.data_location == DATA_LOCATION_EXTERNAL {
        let raw = read_external(t, base_dir, nbytes)?;
        from_le_bytes(dtype, &raw, n)
    } else if !t.raw_data.is_empty() || n == 0 && typed_len(t, dtype) == 0 {
        if t.raw_data.len() != nbytes {
            return Err(format!(
                "raw_data has {} bytes but dims {:?} of {} need {nbytes}",
                t.raw_data.len(),
                t.dims,
                dtype
            ));
        }
        from_le_bytes(dtype, &t.raw_data, n)
    } else {
        // Packed types hold two (4-bit) or four (2-bit) elements per int32_data entry.
        let got = typed_len(t, dtype);
        let need = n.div_ceil(per_byte);
        if got != need {
            return Err(format!(
                "has {got} typed entries but dims {:?} of {dtype} need {need}",
                t.dims
            ));
        }
        from_typed(t, dtype, n)
    };
    Tensor::new(dims, data).map_err(|e| e.to_string())
}

/// Length of the typed field that holds `dtype` values (ONNX stores int8/uint8/int16/
/// uint16/bool/int32, the bits of float16/bfloat16/float8 and packed 4-/2-bit bytes in
/// `int32_data`, uint32/uint64 in `uint64_data`).
fn typed_len(t: &TensorProto, dtype: DType) -> usize {
    match dtype {
        DType::F32 => t.float_data.len(),
        DType::F64 => t.double_data.len(),
        DType::I64 => t.int64_data.len(),
        DType::U32 | DType::U64 => t.uint64_data.len(),
        _ => t.int32_data.len(),
    }
}

/// Unpack `n` codes of a narrow dtype from packed bytes (`bits` 8, 4 or 2; low bits first).
fn unpack_codes(dtype: DType, bytes: impl Iterator<Item = u8>, n: usize) -> TensorData {
    let bits = dtype.bits();
    let per = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    let codes = bytes
        .flat_map(|b| (0..per).map(move |k| (b >> (k * bits)) & mask))
        .take(n)
        .collect();
    TensorData::narrow(dtype, codes)
}

fn from_typed(t: &TensorProto, dtype: DType, n: usize) -> TensorData {
    let i = &t.int32_data;
    if dtype.is_narrow() {
        return unpack_codes(dtype, i.iter().map(|&v| v as u8), n);
    }
    match dtype {
        DType::I16 => TensorData::I16(i.iter().map(|&v| v as i16).collect()),
        DType::U16 => TensorData::U16(i.iter().map(|&v| v as u16).collect()),
        DType::U32 => TensorData::U32(t.uint64_data.iter().map(|&v| v as u32).collect()),
        DType::U64 => TensorData::U64(t.uint64_data.clone()),
        DType::F32 => TensorData::F32(t.float_data.clone()),
        DType::F64 => TensorData::F64(t.double_data.clone()),
        DType::I64 => TensorData::I64(t.int64_data.clone()),
        DType::I32 => TensorData::I32(i.clone()),
        DType::I8 => TensorData::I8(i.iter().map(|&v| v as i8).collect()),
        DType::U8 => TensorData::U8(i.iter().map(|&v| v as u8).collect()),
        DType::Bool => TensorData::Bool(i.iter().map(|&v| v != 0).collect()),
        DType::F16 => TensorData::F16(i.iter().map(|&v| f16::from_bits(v as u16)).collect()),
        DType::BF16 => TensorData::BF16(i.iter().map(|&v| bf16::from_bits(v as u16)).collect()),
        d => unreachable!("narrow dtype {d} handled above"),
    }
}

/// Decode `n` elements from little-endian bytes (length already checked: a multiple of the
/// element size, or `ceil(n / per_byte)` for the packed 4- and 2-bit types).
fn from_le_bytes(dtype: DType, b: &[u8], n: usize) -> TensorData {
    if dtype.is_narrow() {
        return unpack_codes(dtype, b.iter().copied(), n);
    }
    macro_rules! chunks {
        ($n:expr, $f:expr) => {
            b.chunks_exact($n)
                .map(|c| $f(c.try_into().expect("chunk size")))
                .collect()
        };
    }
    match dtype {
        DType::F32 => TensorData::F32(chunks!(4, f32::from_le_bytes)),
        DType::F64 => TensorData::F64(chunks!(8, f64::from_le_bytes)),
        DType::I64 => TensorData::I64(chunks!(8, i64::from_le_bytes)),
        DType::I32 => TensorData::I32(chunks!(4, i32::from_le_bytes)),
        DType::I8 => TensorData::I8(b.iter().map(|&v| v as i8).collect()),
        DType::U8 => TensorData::U8(b.to_vec()),
        DType::Bool => TensorData::Bool(b.iter().map(|&v| v != 0).collect()),
        DType::F16 => TensorData::F16(chunks!(2, |c| f16::from_bits(u16::from_le_bytes(c)))),
        DType::BF16 => TensorData::BF16(chunks!(2, |c| bf16::from_bits(u16::from_le_bytes(c)))),
        DType::I16 => TensorData::I16(chunks!(2, i16::from_le_bytes)),
        DType::U16 => TensorData::U16(chunks!(2, u16::from_le_bytes)),
        DType::U32 => TensorData::U32(chunks!(4, u32::from_le_bytes)),
        DType::U64 => TensorData::U64(chunks!(8, u64::from_le_bytes)),
        d => unreachable!("narrow dtype {d} handled above"),
    }
}

/// Read `nbytes` of external data for `t`. The `location` key must be a relative path
/// without `..` that resolves (after following links) inside `base_dir`; `offset + length`
/// must lie inside the file; both are checked before any buffer is allocated.
fn read_external(
    t: &TensorProto,
    base_dir: Option<&Path>,
    nbytes: usize,
) -> Result<Vec<u8>, String> {
    let key = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let loc = key("location").ok_or("external data without a \"location\" key")?;
    let num = |k: &str| -> Result<Option<u64>, String> {
        key(k)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("external data {k} \"{v}\" is not a non-negative integer"))
            })
            .transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    let length = num("length")?;
    let rel = Path::new(loc);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "external data location \"{loc}\" must be a relative path inside the model's folder (no absolute paths, no \"..\")"
        ));
    }
    let base = base_dir.ok_or_else(|| {
        format!("external data \"{loc}\" needs the model's folder, but none was given")
    })?;
    let path = base.join(rel);
    let canon_base = base
        .canonicalize()
        .map_err(|e| format!("model folder {}: {e}", base.display()))?;
    let canon = path
        .canonicalize()
        .map_err(|e| format!("external data file {}: {e}", path.display()))?;
    if !canon.starts_with(&canon_base) {
        return Err(format!(
            "external data location \"{loc}\" resolves to {}, outside the model's folder",
            canon.display()
        ));
    }
    // Opening a FIFO would block: only regular files.
    if !std::fs::metadata(&canon).is_ok_and(|m| m.is_file()) {
        return Err(format!(
            "external data file {}: not a regular file",
            path.display()
        ));
    }
    let mut f = std::fs::File::open(&canon)
        .map_err(|e| format!("external data file {}: {e}", path.display()))?;
    let size = f
        .metadata()
        .map_err(|e| format!("external data file {}: {e}", path.display()))?
        .len();
    let want = nbytes as u64;
    if let Some(len) = length {
        if len != want {
            return Err(format!(
                "external data length {len} but dims {:?} need {want} bytes",
                t.dims
            ));
        }
    }
    if offset.checked_add(want).is_none_or(|end| end > size) {
        return Err(format!(
            "external data {}: offset {offset} + {want} bytes runs past the file's {size} bytes",
            path.display()
        ));
    }
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("external data file {}: {e}", path.display()))?;
    let mut buf = vec![0u8; nbytes];
    f.read_exact(&mut buf)
        .map_err(|e| format!("external data file {}: {e}", path.display()))?;
    Ok(buf)
}

/// Encode `t` as a `TensorProto` with `raw_data` (little-endian; 4- and 2-bit types
/// packed low bits first), named `name`.
/// The inverse of [`tensor_from_proto`] for non-external data; used by tests and tools.
pub fn tensor_to_proto(name: &str, t: &Tensor) -> TensorProto {
    let mut raw = Vec::with_capacity(t.numel() * t.dtype().size_bytes());
    match t.data() {
        TensorData::I16(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::U16(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::U32(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::U64(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::Narrow { dtype, codes } => {
            let bits = dtype.bits();
            let per = 8 / bits;
            raw.extend(codes.chunks(per).map(|ch| {
                ch.iter()
                    .enumerate()
                    .fold(0u8, |b, (k, &c)| b | (c << (k * bits)))
            }));
        }
        TensorData::F32(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::F64(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::I64(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::I32(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::I8(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        TensorData::U8(v) => raw.extend_from_slice(v),
        TensorData::Bool(v) => v.iter().for_each(|&x| raw.push(x as u8)),
        TensorData::F16(v) => v.iter().for_each(|x| raw.extend(x.to_bits().to_le_bytes())),
        TensorData::BF16(v) => v.iter().for_each(|x| raw.extend(x.to_bits().to_le_bytes())),
    }
    TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: onnx_dtype(t.dtype()),
        name: name.to_string(),
        raw_data: raw,
        ..Default::default()
    }
}

/// The ONNX `TensorProto.DataType` value of an RLX dtype.
pub fn onnx_dtype(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::U8 => dt::UINT8,
        DType::I8 => dt::INT8,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::Bool => dt::BOOL,
        DType::F16 => dt::FLOAT16,
        DType::F64 => dt::DOUBLE,
        DType::BF16 => dt::BFLOAT16,
        DType::I16 => dt::INT16,
        DType::U16 => dt::UINT16,
        DType::U32 => dt::UINT32,
        DType::U64 => dt::UINT64,
        DType::F8E4M3FN => dt::FLOAT8E4M3FN,
        DType::F8E4M3FNUZ => dt::FLOAT8E4M3FNUZ,
        DType::F8E5M2 => dt::FLOAT8E5M2,
        DType::F8E5M2FNUZ => dt::FLOAT8E5M2FNUZ,
        DType::F4E2M1 => dt::FLOAT4E2M1,
        DType::F8E8M0 => dt::FLOAT8E8M0,
        DType::I4 => dt::INT4,
        DType::U4 => dt::UINT4,
        DType::I2 => dt::INT2,
        DType::U2 => dt::UINT2,
    }
}
