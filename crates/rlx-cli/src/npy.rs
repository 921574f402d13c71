//! `.npy` reading and writing (NumPy format 1.0–3.0) through the `npyz` crate.

use anyhow::{bail, Context, Result};
use half::f16;
use npyz::WriterBuilder;
use rlx_ir::{Tensor, TensorData};
use std::path::Path;

/// Read a C-order `.npy` file into a tensor. Supported dtypes: float32/64/16, int64/32/8,
/// uint8, bool. Errors name the file; the header is checked against the file size before
/// anything is allocated.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let bytes = crate::run::read_regular_file(path)?;
    parse_npy(&bytes, &path.display().to_string())
}

/// Parse the bytes of a `.npy` file (as [`read_npy`]); `name` names the file in errors.
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<Tensor> {
    let path = std::path::Path::new(name);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("{}: not a .npy file (bad magic)", path.display());
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => bail!("{}: unsupported .npy format version {v}", path.display()),
    };
    let data_start = hstart + hlen;
    if data_start > bytes.len() {
        bail!(
            "{}: header length {hlen} runs past the end of the file ({} bytes)",
            path.display(),
            bytes.len()
        );
    }
    // The header's shape, checked before npyz reads it (npyz multiplies it out unchecked: a
    // lying header would overflow).
    let header = String::from_utf8_lossy(&bytes[hstart..data_start]);
    // A NumPy header is a flat dict holding a tuple (nesting depth 2, 3 for a structured
    // dtype's list of tuples); npyz's expression parser takes exponential time on deeply
    // nested brackets (a 71-byte file of `{{{{...` ran for seconds).
    let mut depth = 0usize;
    let mut deepest = 0usize;
    for c in header.chars() {
        match c {
            '{' | '(' | '[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            '}' | ')' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > 4 {
        bail!(
            "{}: not a valid .npy file (its header nests brackets {deepest} deep; a NumPy header is a dict holding a shape tuple)",
            path.display()
        );
    }
    if let Some(dims) = header_shape(&header) {
        let fits = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(8))
            .is_some_and(|b| b <= bytes.len() as u64 * 8);
        if !fits {
            bail!(
                "{}: header shape {dims:?} needs more data than the file holds",
                path.display()
            );
        }
    }
    let npy = npyz::NpyFile::new(bytes).map_err(|e| {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or("").trim().to_string();
        anyhow::anyhow!("{}: not a valid .npy file ({first})", path.display())
    })?;
    if npy.order() != npyz::Order::C {
        bail!(
            "{}: Fortran-order arrays are not supported; save with np.ascontiguousarray",
            path.display()
        );
    }
    let dims: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        _ => bail!(
            "{}: structured or sub-array dtypes are not supported; save a plain numeric array",
            path.display()
        ),
    };
    // The dtype first: an object or unicode array would otherwise fail the size check
    // below with a byte count that says nothing about the real problem.
    const SUPPORTED: [&str; 12] = [
        "<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u4", "<u8", "|b1",
    ];
    if !SUPPORTED.contains(&descr.as_str()) {
        bail!(
            "{}: unsupported .npy dtype {descr} (supported: {})",
            path.display(),
            SUPPORTED.join(" ")
        );
    }
    // Never allocate more than the file holds; refuse trailing bytes too.
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let item = descr
        .get(2..)
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1);
    match n.and_then(|n| n.checked_mul(item)) {
        Some(b) if data_start + b == bytes.len() => {}
        Some(b) if data_start + b < bytes.len() => bail!(
            "{}: {} bytes after the data that shape {dims:?} needs",
            path.display(),
            bytes.len() - data_start - b
        ),
        _ => bail!(
            "{}: header shape {dims:?} needs more data than the file holds",
            path.display()
        ),
    }
    let ctx = || format!("{}: truncated or unreadable data", path.display());
    let data = match descr.as_str() {
        "<f4" => TensorData::F32(npy.into_vec::<f32>().with_context(ctx)?),
        "<f8" => TensorData::F64(npy.into_vec::<f64>().with_context(ctx)?),
        "<f2" => TensorData::F16(npy.into_vec::<f16>().with_context(ctx)?),
        "<i8" => TensorData::I64(npy.into_vec::<i64>().with_context(ctx)?),
        "<i4" => TensorData::I32(npy.into_vec::<i32>().with_context(ctx)?),
        "|i1" => TensorData::I8(npy.into_vec::<i8>().with_context(ctx)?),
        "|u1" => TensorData::U8(npy.into_vec::<u8>().with_context(ctx)?),
        "|b1" => TensorData::Bool(npy.into_vec::<bool>().with_context(ctx)?),
        "<i2" => TensorData::I16(npy.into_vec::<i16>().with_context(ctx)?),
        "<u2" => TensorData::U16(npy.into_vec::<u16>().with_context(ctx)?),
        "<u4" => TensorData::U32(npy.into_vec::<u32>().with_context(ctx)?),
        "<u8" => TensorData::U64(npy.into_vec::<u64>().with_context(ctx)?),
        d => bail!("{}: unsupported .npy dtype {d}", path.display()),
    };
    Tensor::new(dims, data).with_context(|| path.display().to_string())
}

fn write_vec<T: npyz::AutoSerialize + Copy>(path: &Path, dims: &[u64], v: &[T]) -> Result<()> {
    write_replacing(path, |f| {
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(dims)
            .writer(std::io::BufWriter::new(f))
            .begin_nd()?;
        w.extend(v.iter().copied())?;
        w.finish()?;
        Ok(())
    })
}

/// Write `path` by writing a new file beside it and renaming it into place, so whatever was
/// at `path` (a symlink, a hard link to another file, a FIFO) is replaced, never written
/// through, and a reader never sees a half-written file.
pub fn write_replacing(path: &Path, write: impl FnOnce(std::fs::File) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.rlx-tmp-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let r = write(f).and_then(|()| {
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Write `t` as a C-order `.npy` file loadable with `np.load`. BF16, float8 and int4 types
/// (which NumPy lacks) are written as float32.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<()> {
    let dims: Vec<u64> = t.dims().iter().map(|&d| d as u64).collect();
    match t.data() {
        TensorData::F32(v) => write_vec(path, &dims, v),
        TensorData::F64(v) => write_vec(path, &dims, v),
        TensorData::F16(v) => write_vec(path, &dims, v),
        TensorData::BF16(v) => write_vec(
            path,
            &dims,
            &v.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
        ),
        TensorData::I64(v) => write_vec(path, &dims, v),
        TensorData::I32(v) => write_vec(path, &dims, v),
        TensorData::I8(v) => write_vec(path, &dims, v),
        TensorData::U8(v) => write_vec(path, &dims, v),
        TensorData::Bool(v) => write_vec(path, &dims, v),
        TensorData::I16(v) => write_vec(path, &dims, v),
        TensorData::U16(v) => write_vec(path, &dims, v),
        TensorData::U32(v) => write_vec(path, &dims, v),
        TensorData::U64(v) => write_vec(path, &dims, v),
        // NumPy has no float8/int4 types: write the values as float32.
        d @ TensorData::Narrow { .. } => write_vec(path, &dims, &d.to_f32_vec()),
    }
}

/// Create the output folder `dir` (and its parents); a clear error when `dir` is a file.
pub fn create_output_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("{} is a file, not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// Check before any work that an output file `path` given as `flag` (`--json`, `-o`) can be
/// written: not a directory, its folder exists (unless `create_parent`: then only a folder
/// that exists must be writable) and a file can be created in it. Writes nothing that stays.
pub fn check_output_file(flag: &str, path: &Path, create_parent: bool) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: is a directory", path.display());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.is_dir() {
        if create_parent && !dir.exists() {
            return Ok(());
        }
        bail!(
            "{flag} {}: no such directory {}",
            path.display(),
            dir.display()
        );
    }
    let probe = dir.join(format!(".rlx-write-test-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| {
            format!(
                "{flag} {}: cannot write in {}",
                path.display(),
                dir.display()
            )
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `path` made absolute with symlinks resolved, also when it does not exist yet (its
/// existing ancestor resolved, the rest appended): to tell whether two paths name one place.
pub fn resolved(path: &Path) -> std::path::PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut rest = vec![];
    let mut cur = abs.as_path();
    loop {
        if let Ok(p) = cur.canonicalize() {
            let mut out = p;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return abs,
        }
    }
}

/// The `'shape': (a, b, ...)` of a `.npy` header, when it can be read (else `None`: npyz then
/// reports the header).
fn header_shape(header: &str) -> Option<Vec<u64>> {
    let at = header.find("'shape'")?;
    let rest = &header[at..];
    let open = rest.find('(')?;
    let close = rest[open..].find(')')? + open;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.trim_end_matches('L').parse::<u64>().ok())
        .collect()
}

#[cfg(test)]
mod fuzz_regressions {
    /// Inputs kept in `fuzz/regressions/npy/` (crashers of the `npy` fuzz target and of QA):
    /// each is an error, never a panic.
    #[test]
    fn npy_crashers_are_errors() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/npy");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let bytes = std::fs::read(e.path()).unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = std::panic::catch_unwind(|| super::parse_npy(&bytes, &name).is_err());
            assert_eq!(
                r.ok(),
                Some(true),
                "{name}: an error, not a panic or a tensor"
            );
            n += 1;
        }
        assert!(n > 0, "{} holds the crashers", dir.display());
    }
}
