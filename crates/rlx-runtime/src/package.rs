//! Compiled packages (`.rlxpkg`): one file holding an optimized graph, its weights, the
//! device type it was compiled for, its input guards and a format version.
//!
//! The container is a zip archive (every entry stored uncompressed) that `unzip -l` and any
//! zip library can open; `docs/PACKAGE.md` describes every entry:
//!
//! * `manifest.json`: [`Manifest`] (format name and version, rlx version, device type,
//!   guards, input and output names);
//! * `graph.json`: the optimized [`Graph`] (serde), provenance (origins, blocks, names)
//!   included; constant tensors' data is not in it;
//! * `weights.safetensors`: constants (`const.<node index>`) and parameters that were set
//!   (`param.<name>`), in the safetensors format.
//!
//! Loading trusts nothing in the file: every entry's read is capped at the file's size, the
//! safetensors header is checked against its data (shape × dtype = bytes), the graph goes
//! through `rlx_compile::verify` and the memory check of compiling, entry names with `..` or
//! absolute paths are refused, and the loader writes nothing.

use crate::guards::{device_type, InputGuard};
use crate::{CompiledGraph, Device, RuntimeError};
use half::{bf16, f16};
use rlx_ir::{DType, Graph, NodeId, Op, Tensor, TensorData};
use safetensors::tensor::{Dtype as StDtype, View};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `format` field of every RLX package manifest.
pub const FORMAT_NAME: &str = "rlxpkg";
/// The newest package format version this build reads. Static packages are written as
/// version 1 (so older rlx builds still read them); dynamic ones (a `dynamic` manifest
/// field and a `source.onnx` entry) as version 2.
pub const FORMAT_VERSION: u32 = 2;
/// The version static packages are written with.
pub const STATIC_FORMAT_VERSION: u32 = 1;
/// Entry names inside the archive.
pub const MANIFEST_ENTRY: &str = "manifest.json";
pub const GRAPH_ENTRY: &str = "graph.json";
pub const WEIGHTS_ENTRY: &str = "weights.safetensors";
/// A dynamic package's model source (the ONNX file, weights included).
pub const SOURCE_ENTRY: &str = "source.onnx";

/// `manifest.json`: what a package holds, readable without the graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// The format version ([`FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// The version of rlx that wrote the package (`CARGO_PKG_VERSION` of rlx-runtime).
    pub rlx_version: String,
    /// The device type the graph was compiled for (`cpu`, `wgpu`, `cuda`). A package loads
    /// on any device of this type (the index may differ), never on another type.
    pub device_type: String,
    /// The graph's name.
    pub graph_name: String,
    /// One guard per graph input, in input order (see [`crate::guards`]).
    pub inputs: Vec<InputGuard>,
    /// Output names and types, in output order.
    pub outputs: Vec<OutputInfo>,
    /// Names of the parameters whose values are in `weights.safetensors`.
    pub params: Vec<String>,
    /// Present in dynamic packages (format version 2): the package holds the model source
    /// instead of a compiled graph, and plans each input-size signature when it runs
    /// ([`crate::dynamic`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicInfo>,
}

/// The `dynamic` field of a dynamic package's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DynamicInfo {
    /// The source's format (`onnx`), stored in [`SOURCE_ENTRY`].
    pub source_format: String,
    /// Every symbolic dim with the sizes it accepts (both ends included).
    pub ranges: BTreeMap<String, crate::dynamic::DimRange>,
}

/// One graph output in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputInfo {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<usize>,
}

/// Errors from writing or reading a package; each names the file (and the entry when one
/// is at fault).
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// The file could not be read or written.
    #[error("{path}: {msg}")]
    Io { path: PathBuf, msg: String },
    /// The file is not a readable zip archive (truncated, corrupted, or not a package).
    #[error("{path}: not a readable RLX package (zip archive): {msg}")]
    Container { path: PathBuf, msg: String },
    /// An entry is missing, unreadable, too large or inconsistent.
    #[error("{path}: entry {entry}: {msg}")]
    Entry {
        path: PathBuf,
        entry: String,
        msg: String,
    },
    /// The package was written by a newer rlx.
    #[error("{path}: entry manifest.json: package format version {found} is newer than this rlx reads (up to {supported}); load it with a newer rlx or recompile the model with this one")]
    FutureVersion {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
    /// The package was compiled for another device type.
    #[error("{path}: compiled for device type {package}, cannot load on device type {requested}: the device index may change between compiling and loading, the device type may not (recompile with `rlx compile --device {requested}`)")]
    DeviceType {
        path: PathBuf,
        package: String,
        requested: String,
    },
}

fn entry_err(path: &Path, entry: &str, msg: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Package(PackageError::Entry {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        msg: msg.to_string(),
    })
}

fn io_err(path: &Path, msg: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Package(PackageError::Io {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    })
}

// ---------------------------------------------------------------- tensors <-> safetensors

/// One tensor's bytes for `safetensors::serialize`.
struct Raw {
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// The safetensors dtype holding `dt`'s bytes. Narrow types are stored as their U8 codes,
/// with the RLX dtype in the file's metadata (`dtype.<key>`).
fn st_dtype(dt: DType) -> StDtype {
    match dt {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F64 => StDtype::F64,
        DType::I64 => StDtype::I64,
        DType::I32 => StDtype::I32,
        DType::I16 => StDtype::I16,
        DType::I8 => StDtype::I8,
        DType::U8 => StDtype::U8,
        DType::U16 => StDtype::U16,
        DType::U32 => StDtype::U32,
        DType::U64 => StDtype::U64,
        DType::Bool => StDtype::BOOL,
        _ => StDtype::U8,
    }
}

/// Little-endian bytes of a tensor's elements (narrow: one code per byte; bool: 0/1).
fn to_bytes(d: &TensorData) -> Vec<u8> {
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    match d {
        TensorData::F32(v) => le(v, f32::to_le_bytes),
        TensorData::F16(v) => le(v, f16::to_le_bytes),
        TensorData::BF16(v) => le(v, bf16::to_le_bytes),
        TensorData::F64(v) => le(v, f64::to_le_bytes),
        TensorData::I64(v) => le(v, i64::to_le_bytes),
        TensorData::I32(v) => le(v, i32::to_le_bytes),
        TensorData::I16(v) => le(v, i16::to_le_bytes),
        TensorData::I8(v) => le(v, i8::to_le_bytes),
        TensorData::U8(v) => v.clone(),
        TensorData::U16(v) => le(v, u16::to_le_bytes),
        TensorData::U32(v) => le(v, u32::to_le_bytes),
        TensorData::U64(v) => le(v, u64::to_le_bytes),
        TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        TensorData::Narrow { codes, .. } => codes.clone(),
    }
}

/// Elements of `dt` from little-endian `bytes` (length already checked to be a multiple
/// of the element size by safetensors).
fn from_bytes(dt: DType, b: &[u8]) -> Result<TensorData, String> {
    fn de<T, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect()
    }
    Ok(match dt {
        DType::F32 => TensorData::F32(de(b, f32::from_le_bytes)),
        DType::F16 => TensorData::F16(de(b, f16::from_le_bytes)),
        DType::BF16 => TensorData::BF16(de(b, bf16::from_le_bytes)),
        DType::F64 => TensorData::F64(de(b, f64::from_le_bytes)),
        DType::I64 => TensorData::I64(de(b, i64::from_le_bytes)),
        DType::I32 => TensorData::I32(de(b, i32::from_le_bytes)),
        DType::I16 => TensorData::I16(de(b, i16::from_le_bytes)),
        DType::I8 => TensorData::I8(de(b, i8::from_le_bytes)),
        DType::U8 => TensorData::U8(b.to_vec()),
        DType::U16 => TensorData::U16(de(b, u16::from_le_bytes)),
        DType::U32 => TensorData::U32(de(b, u32::from_le_bytes)),
        DType::U64 => TensorData::U64(de(b, u64::from_le_bytes)),
        DType::Bool => {
            if let Some(x) = b.iter().find(|&&x| x > 1) {
                return Err(format!("a BOOL element holds byte {x}, not 0 or 1"));
            }
            TensorData::Bool(b.iter().map(|&x| x == 1).collect())
        }
        d => {
            let max = if d.bits() < 8 {
                (1u16 << d.bits()) - 1
            } else {
                255
            };
            if let Some(x) = b.iter().find(|&&x| x as u16 > max) {
                return Err(format!("a {d} code is {x}, wider than {} bits", d.bits()));
            }
            TensorData::narrow(d, b.to_vec())
        }
    })
}

fn dtype_name(d: DType) -> String {
    format!("{d:?}")
}

fn dtype_from_name(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| dtype_name(*d) == s)
}

// ---------------------------------------------------------------- save

/// Write `compiled` as a package at `path` (a new file replacing any old one, written to
/// `path` + `.tmp` first and renamed, so a failed save never leaves a half package).
///
/// Holds the graph the backend runs (after passes), its constants, the parameters set so
/// far (unset ones must be set again after loading), the guards and the device type.
///
/// Errors: [`PackageError::Io`] naming the file.
pub fn save_package(compiled: &CompiledGraph, path: &Path) -> Result<(), RuntimeError> {
    let mut g: Graph = compiled.graph().clone();
    // The declared signature of the inputs that survived the passes (symbol names).
    let names: Vec<String> = compiled.inputs().into_iter().map(|(n, _)| n).collect();
    g.input_decls = compiled
        .source_graph()
        .input_decls
        .iter()
        .filter(|(n, _)| names.contains(n))
        .cloned()
        .collect();
    let mut raws: BTreeMap<String, Raw> = BTreeMap::new();
    let mut meta: HashMap<String, String> = HashMap::new();
    let mut add = |key: String, t: &Tensor| {
        if t.dtype().is_narrow() {
            meta.insert(format!("dtype.{key}"), dtype_name(t.dtype()));
        }
        raws.insert(
            key,
            Raw {
                dtype: st_dtype(t.dtype()),
                shape: t.dims().to_vec(),
                bytes: to_bytes(t.data()),
            },
        );
    };
    for n in &g.nodes {
        if let Op::Constant(t) = &n.op {
            add(format!("const.{}", n.id.0), t);
        }
    }
    let mut params = vec![];
    for id in g.params() {
        let n = g.node(id);
        let Op::Param { name } = &n.op else { continue };
        if let Some(t) = compiled.param_values.get(name) {
            let t = t
                .clone()
                .reshaped(n.shape.dims_usize())
                .map_err(|e| io_err(path, format!("parameter \"{name}\": {e}")))?;
            add(format!("param.{name}"), &t);
            params.push(name.clone());
        }
    }
    meta.insert("format".into(), FORMAT_NAME.into());
    let weights = safetensors::serialize(raws.iter().map(|(k, v)| (k.as_str(), v)), Some(meta))
        .map_err(|e| io_err(path, format!("cannot write {WEIGHTS_ENTRY}: {e}")))?;
    drop(raws);
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: STATIC_FORMAT_VERSION,
        rlx_version: env!("CARGO_PKG_VERSION").into(),
        device_type: device_type(compiled.device()),
        graph_name: g.name.clone(),
        inputs: compiled.guards().to_vec(),
        outputs: compiled
            .outputs()
            .into_iter()
            .map(|(name, s)| OutputInfo {
                name,
                dtype: s.dtype,
                dims: s.dims_usize().to_vec(),
            })
            .collect(),
        params,
        dynamic: None,
    };
    let manifest_json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io_err(path, format!("cannot write {MANIFEST_ENTRY}: {e}")))?;
    let graph_json = serde_json::to_vec(&g)
        .map_err(|e| io_err(path, format!("cannot write {GRAPH_ENTRY}: {e}")))?;

    write_archive(
        path,
        &[
            (MANIFEST_ENTRY, &manifest_json),
            (GRAPH_ENTRY, &graph_json),
            (WEIGHTS_ENTRY, &weights),
        ],
    )
}

/// Write `entries` (stored, uncompressed) as a zip archive at `path`, through `path.tmp`
/// and a rename, so a failed save never leaves a half package.
fn write_archive(path: &Path, entries: &[(&str, &[u8])]) -> Result<(), RuntimeError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> Result<(), String> {
        let f = std::fs::File::create(&tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        let mut z = zip::ZipWriter::new(std::io::BufWriter::new(f));
        for &(name, bytes) in entries {
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(bytes.len() as u64 >= u32::MAX as u64);
            z.start_file(name, opts).map_err(|e| e.to_string())?;
            z.write_all(bytes).map_err(|e| e.to_string())?;
        }
        let mut w = z.finish().map_err(|e| e.to_string())?;
        w.flush().map_err(|e| e.to_string())?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, format!("cannot write the package: {e}")));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(
            path,
            format!("cannot move {} into place: {e}", tmp.display()),
        )
    })
}

/// Write `model` as a dynamic package at `path` (format version 2): the manifest (guards
/// with the ranges, the `dynamic` field) and the model source ([`SOURCE_ENTRY`]). Output
/// dims in the manifest are those of the plan at every range's minimum (built here if not
/// cached); `rlx run` plans each signature when the package runs.
///
/// Errors: a source that cannot be saved, the minimum-size plan failing, [`PackageError::Io`].
pub fn save_dynamic_package(
    model: &mut crate::dynamic::DynamicModel,
    path: &Path,
) -> Result<(), RuntimeError> {
    let src = model.source().clone();
    let bytes = src.bytes().ok_or_else(|| {
        io_err(
            path,
            format!(
                "the model source {} cannot be saved in a package",
                src.name()
            ),
        )
    })?;
    if src.format() != "onnx" {
        return Err(io_err(
            path,
            format!(
                "source format {} cannot be packaged (onnx only)",
                src.format()
            ),
        ));
    }
    let mins: BTreeMap<String, usize> = model
        .ranges()
        .iter()
        .map(|(s, r)| (s.clone(), r.min))
        .collect();
    let device = model.device();
    // A symbol whose range starts at 0 may have no plan at 0 (a Reshape to a 0-size dim):
    // the outputs are then described at 1.
    let planned = match model.plan_at(&mins) {
        Ok(_) => Ok(()),
        Err(_) => {
            let ones: BTreeMap<String, usize> =
                mins.iter().map(|(s, &n)| (s.clone(), n.max(1))).collect();
            model.plan_at(&ones).map(|_| ())
        }
    };
    let (outputs, graph_name) = match planned {
        Ok(()) => {
            let plan = model.last_plan_graph().expect("plan_at just cached a plan");
            let outputs = plan
                .outputs()
                .into_iter()
                .map(|(name, s)| OutputInfo {
                    name,
                    dtype: s.dtype,
                    dims: s.dims_usize().to_vec(),
                })
                .collect();
            (outputs, plan.graph().name.clone())
        }
        // A model that runs in segments around a node whose output shape depends on values
        // has no plan for the whole: its outputs are described as declared, a size known only
        // at run time as 0.
        Err(e) if crate::dynamic::is_value_dependent(&e.to_string()) => {
            let onnx = src.as_onnx().ok_or(e)?;
            let outputs = onnx
                .declared_outputs()
                .into_iter()
                .map(|(name, s)| OutputInfo {
                    name,
                    dtype: s.dtype,
                    dims: s
                        .dims
                        .iter()
                        .map(|d| match d {
                            rlx_ir::Dim::Static(n) => *n,
                            rlx_ir::Dim::Sym(_) => 0,
                        })
                        .collect(),
                })
                .collect();
            (outputs, src.name().to_string())
        }
        Err(e) => return Err(e),
    };
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: 2,
        rlx_version: env!("CARGO_PKG_VERSION").into(),
        device_type: device_type(device),
        graph_name,
        inputs: model.guards().to_vec(),
        outputs,
        params: vec![],
        dynamic: Some(DynamicInfo {
            source_format: src.format().to_string(),
            ranges: model.ranges().clone(),
        }),
    };
    let manifest_json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io_err(path, format!("cannot write {MANIFEST_ENTRY}: {e}")))?;
    write_archive(
        path,
        &[(MANIFEST_ENTRY, &manifest_json), (SOURCE_ENTRY, bytes)],
    )
}

/// A package as loaded: a compiled graph, or a dynamic model that plans per signature.
// One value per load or run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum LoadedPackage {
    Static(CompiledGraph),
    Dynamic(crate::dynamic::DynamicModel),
}

/// Load the package at `path` for `device`, whichever kind it is (see [`load_package`] and
/// [`load_dynamic_package`]).
pub fn load_any_package(path: &Path, device: Device) -> Result<LoadedPackage, RuntimeError> {
    if read_manifest(path)?.dynamic.is_some() {
        load_dynamic_package(path, device).map(LoadedPackage::Dynamic)
    } else {
        load_package(path, device).map(LoadedPackage::Static)
    }
}

/// Load a dynamic package (one written by [`save_dynamic_package`]): decode its source and
/// ranges; no plan is built until it runs.
///
/// Errors: as [`load_package`] for the container and manifest; a static package (load it
/// with [`load_package`]); a `source.onnx` that is not an ONNX model; ranges naming symbols
/// the model does not have; guards that differ from what the source and ranges give.
pub fn load_dynamic_package(
    path: &Path,
    device: Device,
) -> Result<crate::dynamic::DynamicModel, RuntimeError> {
    let manifest = read_manifest(path)?;
    check_device_type(path, &manifest, device)?;
    let (_, ranges, bytes) = read_package_source(path)?.ok_or_else(|| {
        entry_err(
            path,
            MANIFEST_ENTRY,
            "a static package (no \"dynamic\" field): load it with load_package",
        )
    })?;
    let name = format!("{}!{SOURCE_ENTRY}", path.display());
    let src = crate::dynamic::OnnxSource::from_bytes(bytes, &name)
        .map_err(|e| entry_err(path, SOURCE_ENTRY, e))?;
    let model =
        crate::dynamic::DynamicModel::new(Arc::new(src), device, ranges).map_err(|e| match e {
            RuntimeError::Input(m) => entry_err(path, MANIFEST_ENTRY, m),
            e => e,
        })?;
    if model.guards() != manifest.inputs.as_slice() {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!("its inputs do not match the inputs of {SOURCE_ENTRY} with its ranges"),
        ));
    }
    Ok(model)
}

/// A dynamic package's manifest, dim ranges and source model bytes ([`read_package_source`]).
pub type PackageSource = (
    Manifest,
    BTreeMap<String, crate::dynamic::DimRange>,
    Vec<u8>,
);

/// The manifest, the ranges and the source model's bytes of a dynamic package (whatever its
/// device type: for tools that import the source themselves, as `rlx trace` does); `None` for
/// a static package, which holds a compiled graph and no source.
///
/// Errors: as [`load_dynamic_package`] for an unreadable file or a bad manifest (a range
/// with min > max, an unknown source format).
pub fn read_package_source(path: &Path) -> Result<Option<PackageSource>, RuntimeError> {
    let (mut z, cap) = open_archive(path)?;
    let manifest = parse_manifest(path, &read_entry(&mut z, path, MANIFEST_ENTRY, cap)?)?;
    let Some(info) = &manifest.dynamic else {
        return Ok(None);
    };
    if info.source_format != "onnx" {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            "a static package (no \"dynamic\" field): load it with load_package",
        ));
    };
    if info.source_format != "onnx" {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!(
                "source_format \"{}\" is not one this rlx reads (onnx)",
                info.source_format
            ),
        ));
    }
    for (s, r) in &info.ranges {
        if r.max.is_some_and(|m| m < r.min) {
            return Err(entry_err(
                path,
                MANIFEST_ENTRY,
                format!("dim \"{s}\": range min {} is larger than max", r.min),
            ));
        }
    }
    let bytes = read_entry(&mut z, path, SOURCE_ENTRY, cap)?;
    let ranges = info.ranges.clone();
    Ok(Some((manifest, ranges, bytes)))
}

fn check_device_type(path: &Path, manifest: &Manifest, device: Device) -> Result<(), RuntimeError> {
    let requested = device_type(device);
    if manifest.device_type != requested {
        return Err(RuntimeError::Package(PackageError::DeviceType {
            path: path.to_path_buf(),
            package: manifest.device_type.clone(),
            requested,
        }));
    }
    if !crate::device_available(device) {
        return Err(RuntimeError::DeviceUnavailable(device));
    }
    Ok(())
}

// ---------------------------------------------------------------- load

/// Read one entry in full, refusing more than `cap` bytes (the package file's size: entries
/// are stored uncompressed, so none can be larger than the file).
fn read_entry<R: Read + std::io::Seek>(
    z: &mut zip::ZipArchive<R>,
    path: &Path,
    name: &str,
    cap: u64,
) -> Result<Vec<u8>, RuntimeError> {
    let mut f = z
        .by_name(name)
        .map_err(|e| entry_err(path, name, format!("missing or unreadable: {e}")))?;
    let declared = f.size();
    if declared > cap {
        return Err(entry_err(
            path,
            name,
            format!("declares {declared} bytes, more than the package file's {cap} bytes"),
        ));
    }
    let mut buf = Vec::with_capacity(declared as usize);
    (&mut f)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| entry_err(path, name, format!("corrupted: {e}")))?;
    if buf.len() as u64 != declared {
        return Err(entry_err(
            path,
            name,
            format!("holds {} bytes but declares {declared}", buf.len()),
        ));
    }
    Ok(buf)
}

/// Only the manifest of the package at `path` (format and version checked).
///
/// Errors: as [`load_package`] for the container and `manifest.json`.
pub fn read_manifest(path: &Path) -> Result<Manifest, RuntimeError> {
    let (mut z, cap) = open_archive(path)?;
    parse_manifest(path, &read_entry(&mut z, path, MANIFEST_ENTRY, cap)?)
}

fn open_archive(path: &Path) -> Result<(zip::ZipArchive<std::fs::File>, u64), RuntimeError> {
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(io_err(path, "not a regular file"));
    }
    let f = std::fs::File::open(path).map_err(|e| io_err(path, format!("cannot read: {e}")))?;
    let z = zip::ZipArchive::new(f).map_err(|e| {
        RuntimeError::Package(PackageError::Container {
            path: path.to_path_buf(),
            msg: format!("{e} (truncated or corrupted?)"),
        })
    })?;
    // Entry names: nothing absolute, nothing with `..` (the loader extracts nothing, but a
    // package that names a path outside its folder is not one rlx wrote).
    for name in z.file_names() {
        let bad = name.starts_with('/')
            || name.starts_with('\\')
            || name.contains('\\')
            || name.contains(':')
            || name.split('/').any(|c| c == "..");
        if bad {
            return Err(entry_err(
                path,
                name,
                "entry name is absolute or leaves the package's folder",
            ));
        }
    }
    Ok((z, meta.len()))
}

fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest, RuntimeError> {
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| entry_err(path, MANIFEST_ENTRY, format!("not valid JSON: {e}")))?;
    let format = v.get("format").and_then(|f| f.as_str());
    if format != Some(FORMAT_NAME) {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!("format is {format:?}, expected \"{FORMAT_NAME}\" (not an RLX package)"),
        ));
    }
    let version = v
        .get("format_version")
        .and_then(|f| f.as_u64())
        .ok_or_else(|| {
            entry_err(
                path,
                MANIFEST_ENTRY,
                "format_version is missing or not a number",
            )
        })?;
    if version > FORMAT_VERSION as u64 {
        return Err(RuntimeError::Package(PackageError::FutureVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        }));
    }
    if version == 0 {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            "format_version 0 does not exist",
        ));
    }
    let m: Manifest = serde_json::from_value(v).map_err(|e| entry_err(path, MANIFEST_ENTRY, e))?;
    if m.dynamic.is_some() && version < 2 {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!("format_version {version} has no \"dynamic\" field (dynamic packages are version 2)"),
        ));
    }
    Ok(m)
}

/// Load the package at `path` for `device`, ready to run (parameters it holds are set).
///
/// Errors, each naming the file (and entry): not a regular file; not a zip archive
/// (truncated, corrupted); an entry missing, larger than the file, failing its CRC, or
/// inconsistent (graph and manifest disagree, a safetensors shape × dtype that does not
/// match its bytes, a constant whose type differs from its node); a format version newer
/// than [`FORMAT_VERSION`]; a device type other than the one compiled for
/// ([`PackageError::DeviceType`], checked before anything else is read); a graph that
/// fails `rlx_compile::verify` or needs more memory than this machine has.
pub fn load_package(path: &Path, device: Device) -> Result<CompiledGraph, RuntimeError> {
    let (mut z, cap) = open_archive(path)?;
    let manifest = parse_manifest(path, &read_entry(&mut z, path, MANIFEST_ENTRY, cap)?)?;
    check_device_type(path, &manifest, device)?;
    if let Some(info) = &manifest.dynamic {
        let r: Vec<String> = info
            .ranges
            .iter()
            .map(|(s, r)| format!("{s}={r}"))
            .collect();
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!(
                "a dynamic package (dims {}): it holds no compiled graph; load it with load_dynamic_package or load_any_package",
                r.join(", ")
            ),
        ));
    }
    let graph_bytes = read_entry(&mut z, path, GRAPH_ENTRY, cap)?;
    let mut g: Graph = serde_json::from_slice(&graph_bytes)
        .map_err(|e| entry_err(path, GRAPH_ENTRY, format!("not a valid graph: {e}")))?;
    drop(graph_bytes);
    let weights = read_entry(&mut z, path, WEIGHTS_ENTRY, cap)?;
    let st = safetensors::SafeTensors::deserialize(&weights)
        .map_err(|e| entry_err(path, WEIGHTS_ENTRY, format!("not valid safetensors: {e}")))?;
    let (_, st_meta) = safetensors::SafeTensors::read_metadata(&weights)
        .map_err(|e| entry_err(path, WEIGHTS_ENTRY, format!("not valid safetensors: {e}")))?;
    let narrow: HashMap<String, String> = st_meta.metadata().clone().unwrap_or_default();
    let tensor = |key: &str, want: &rlx_ir::Shape| -> Result<Tensor, RuntimeError> {
        let v = st
            .tensor(key)
            .map_err(|_| entry_err(path, WEIGHTS_ENTRY, format!("has no tensor \"{key}\"")))?;
        let dt = match narrow.get(&format!("dtype.{key}")) {
            Some(n) => dtype_from_name(n).ok_or_else(|| {
                entry_err(
                    path,
                    WEIGHTS_ENTRY,
                    format!("tensor \"{key}\": unknown dtype \"{n}\""),
                )
            })?,
            None => want.dtype,
        };
        if dt != want.dtype
            || st_dtype(dt) != v.dtype()
            || v.shape() != want.dims_usize().as_slice()
        {
            return Err(entry_err(
                path,
                WEIGHTS_ENTRY,
                format!(
                    "tensor \"{key}\" is {:?}{:?}, but {GRAPH_ENTRY} declares {want}",
                    v.dtype(),
                    v.shape()
                ),
            ));
        }
        let n = v
            .shape()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dt.size_bytes().max(1)));
        if n != Some(v.data().len()) {
            return Err(entry_err(
                path,
                WEIGHTS_ENTRY,
                format!(
                    "tensor \"{key}\": shape {:?} does not match its {} data bytes",
                    v.shape(),
                    v.data().len()
                ),
            ));
        }
        let data = from_bytes(dt, v.data())
            .map_err(|m| entry_err(path, WEIGHTS_ENTRY, format!("tensor \"{key}\": {m}")))?;
        Tensor::new(v.shape().to_vec(), data)
            .map_err(|e| entry_err(path, WEIGHTS_ENTRY, format!("tensor \"{key}\": {e}")))
    };
    // Constants' data back into the graph (checked against each node's declared type).
    for k in 0..g.nodes.len() {
        if matches!(g.nodes[k].op, Op::Constant(_)) {
            if g.nodes[k].id != NodeId(k as u32) {
                return Err(entry_err(
                    path,
                    GRAPH_ENTRY,
                    format!("node {k} has id {}", g.nodes[k].id),
                ));
            }
            let t = tensor(&format!("const.{k}"), &g.nodes[k].shape)?;
            g.nodes[k].op = Op::Constant(Arc::new(t));
        }
    }
    rlx_compile::verify::verify(&g).map_err(|e| entry_err(path, GRAPH_ENTRY, e))?;
    crate::check_sizes(&g)?;
    // Guards: the manifest's, which must describe the graph's inputs exactly.
    let ins: Vec<(String, rlx_ir::Shape)> = g
        .inputs()
        .into_iter()
        .filter_map(|id| match &g.node(id).op {
            Op::Input { name } => Some((name.clone(), g.node(id).shape.clone())),
            _ => None,
        })
        .collect();
    let consistent = ins.len() == manifest.inputs.len()
        && ins.iter().zip(&manifest.inputs).all(|((n, s), gd)| {
            *n == gd.name
                && s.dtype == gd.dtype
                && s.rank() == gd.dims.len()
                && gd.device_type == manifest.device_type
                && s.dims.iter().zip(&gd.dims).all(|(d, gd)| match d {
                    rlx_ir::Dim::Static(v) => gd.accepts(*v),
                    rlx_ir::Dim::Sym(_) => true,
                })
        });
    if !consistent {
        return Err(entry_err(
            path,
            MANIFEST_ENTRY,
            format!("its inputs do not match the inputs of {GRAPH_ENTRY}"),
        ));
    }
    let exec = crate::backend::open(device, g.clone()).map_err(|e| match e {
        RuntimeError::Cpu(e) => entry_err(path, GRAPH_ENTRY, e),
        e => e,
    })?;
    let mut c = CompiledGraph::assemble(device, g, exec, vec![], manifest.inputs.clone());
    for name in &manifest.params {
        let id = c
            .graph()
            .params()
            .into_iter()
            .find(|&p| matches!(&c.graph().node(p).op, Op::Param { name: n } if n == name))
            .ok_or_else(|| {
                entry_err(
                    path,
                    MANIFEST_ENTRY,
                    format!("lists parameter \"{name}\" that the graph does not have"),
                )
            })?;
        let shape = c.graph().node(id).shape.clone();
        let t = tensor(&format!("param.{name}"), &shape)?;
        c.try_set_param(name, t)?;
    }
    Ok(c)
}
