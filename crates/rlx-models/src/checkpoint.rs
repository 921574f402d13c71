//! Memory-mapped safetensors files of a checkpoint folder.

use crate::ModelError;
use half::{bf16, f16};
use rlx_ir::{DType, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The tensors of a checkpoint: every `*.safetensors` file memory-mapped, headers checked,
/// tensor data read (and converted) only when asked for.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, memmap2::Mmap)>,
    index: HashMap<String, Entry>,
}

fn io(path: &Path, what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        msg: format!("{what}: {e}"),
    }
}

impl Checkpoint {
    /// Open `dir`: the shards named by `model.safetensors.index.json` when it exists, else
    /// every `*.safetensors` file in the folder.
    ///
    /// Errors: a missing shard or folder ([`ModelError::Io`]), a corrupt index or a truncated
    /// or corrupt file ([`ModelError::Safetensors`], naming the file).
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let idx = dir.join("model.safetensors.index.json");
        let mut names: Vec<String> = vec![];
        let mut listed: HashMap<String, String> = HashMap::new();
        if idx.exists() {
            let text = std::fs::read_to_string(&idx).map_err(|e| io(&idx, "cannot read", e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Safetensors {
                    path: idx.clone(),
                    msg: format!("index is not JSON: {e}"),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Safetensors {
                    path: idx.clone(),
                    msg: "index has no \"weight_map\" object".into(),
                })?;
            for (t, f) in map {
                let f = f.as_str().unwrap_or_default().to_string();
                if f.contains('/') || f.contains('\\') || f.is_empty() {
                    return Err(ModelError::Safetensors {
                        path: idx.clone(),
                        msg: format!("tensor \"{t}\" maps to an invalid file name {f:?}"),
                    });
                }
                if !names.contains(&f) {
                    names.push(f.clone());
                }
                listed.insert(t.clone(), f);
            }
            names.sort();
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| io(dir, "cannot read the folder", e))?;
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if n.ends_with(".safetensors") {
                    names.push(n);
                }
            }
            names.sort();
            if names.is_empty() {
                return Err(io(dir, "no *.safetensors file", "the folder holds none"));
            }
        }
        let mut files = vec![];
        let mut index = HashMap::new();
        for (fi, n) in names.iter().enumerate() {
            let path = dir.join(n);
            if !path.is_file() {
                let which = listed
                    .iter()
                    .find(|(_, f)| *f == n)
                    .map(|(t, _)| {
                        format!(" (holds \"{t}\", listed in model.safetensors.index.json)")
                    })
                    .unwrap_or_default();
                return Err(io(&path, "shard missing", format!("no such file{which}")));
            }
            let file = std::fs::File::open(&path).map_err(|e| io(&path, "cannot open", e))?;
            // SAFETY: the map is read-only; a checkpoint changed on disk while it is mapped
            // is the caller's problem, as with every memory-mapped loader.
            let map =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io(&path, "cannot map", e))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            let (n_header, _) =
                SafeTensors::read_metadata(&map).map_err(|e| ModelError::Safetensors {
                    path: path.clone(),
                    msg: e.to_string(),
                })?;
            let base = 8 + n_header;
            for (name, view) in st.tensors() {
                let data = view.data();
                let start = data.as_ptr() as usize - map.as_ptr() as usize;
                debug_assert!(start >= base);
                index.insert(
                    name,
                    Entry {
                        file: fi,
                        dtype: view.dtype(),
                        shape: view.shape().to_vec(),
                        start,
                        end: start + data.len(),
                    },
                );
            }
            files.push((path, map));
        }
        for (t, f) in &listed {
            if let Some(e) = index.get(t) {
                if files[e.file]
                    .0
                    .file_name()
                    .map(|x| x.to_string_lossy().to_string())
                    != Some(f.clone())
                {
                    // listed in another shard than the one that holds it: harmless, use it
                }
            } else {
                return Err(ModelError::MissingTensor {
                    dir: dir.to_path_buf(),
                    tensor: t.clone(),
                    files: format!("model.safetensors.index.json lists it in {f}, which lacks it"),
                });
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            index,
        })
    }

    /// True when the checkpoint holds a tensor named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Tensor `name` with dims `want`, converted to `dtype` (no conversion when the file
    /// already holds that dtype; the bytes are copied out of the map either way, once, and
    /// the range's mapped pages are then released from the process: a loaded checkpoint
    /// costs one copy of its weights in the run dtype, not that plus the mapped file).
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::Shape`] (dims other than `want`),
    /// [`ModelError::DType`] (not F32/F16/BF16).
    pub fn get(&self, name: &str, want: &[usize], dtype: DType) -> Result<Tensor, ModelError> {
        let e = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                tensor: name.to_string(),
                files: self
                    .files
                    .iter()
                    .map(|(p, _)| {
                        p.file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .to_string()
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let path = &self.files[e.file].0;
        if e.shape != want {
            return Err(ModelError::Shape {
                path: path.clone(),
                tensor: name.to_string(),
                got: e.shape.clone(),
                want: want.to_vec(),
            });
        }
        let map = &self.files[e.file].1;
        let bytes = &map[e.start..e.end];
        let data = match (e.dtype, dtype) {
            (Dtype::F32 | Dtype::F16 | Dtype::BF16, _) => read_as(e.dtype, bytes, dtype),
            (other, _) => {
                return Err(ModelError::DType {
                    path: path.clone(),
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        // The bytes now live in `data`: drop the mapped pages of this range from the
        // process (they stay in the page cache), so the map and the copy are never both
        // resident for the whole checkpoint. A later `get` of the range faults them back in.
        // SAFETY: `Mmap::map` is a shared read-only file mapping and no reference into the
        // range outlives this function, so MADV_DONTNEED only unmaps clean file pages; the
        // next read refaults the file's bytes (nothing is zeroed, nothing is lost).
        unsafe {
            let _ = map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                e.start,
                e.end - e.start,
            );
        }
        Tensor::new(want.to_vec(), data).map_err(|err| ModelError::Safetensors {
            path: path.clone(),
            msg: format!("tensor \"{name}\": {err}"),
        })
    }
}

/// Little-endian `bytes` of float dtype `from` (F32, F16 or BF16) as `to`, in one pass over
/// the bytes (no intermediate vector in the file's dtype; no f64 round trip for floats).
fn read_as(from: Dtype, bytes: &[u8], to: DType) -> TensorData {
    let f32s = || {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    };
    let f16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]))
    };
    let bf16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
    };
    match (from, to) {
        (Dtype::F32, DType::F32) => TensorData::F32(copy_le(bytes)),
        (Dtype::F32, DType::F16) => TensorData::F16(fill(f32s().map(f16::from_f32))),
        (Dtype::F32, DType::BF16) => TensorData::BF16(fill(f32s().map(bf16::from_f32))),
        (Dtype::F16, DType::F16) => TensorData::F16(copy_le(bytes)),
        (Dtype::F16, DType::F32) => TensorData::F32(fill(f16s().map(|x| x.to_f32()))),
        (Dtype::BF16, DType::BF16) => TensorData::BF16(copy_le(bytes)),
        (Dtype::BF16, DType::F32) => TensorData::F32(fill(bf16s().map(|x| x.to_f32()))),
        // f16 <-> bf16 and any other run dtype: through the general cast.
        (Dtype::F16, _) => TensorData::F16(fill(f16s())).cast(to),
        (Dtype::BF16, _) => TensorData::BF16(fill(bf16s())).cast(to),
        (_, _) => TensorData::F32(fill(f32s())).cast(to),
    }
}

/// An empty vector with room for `n` elements. On Linux, a large one (2 MB or more) asks
/// for transparent huge pages (`MADV_HUGEPAGE`): the copy then faults its memory in 2 MB at a
/// time instead of 4 KB (0.6 B of weights: about 1 k faults instead of 300 k, most of the
/// load time otherwise, as `perf` shows). Where THP is off the advice is a no-op.
fn with_capacity<T>(n: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = n * std::mem::size_of::<T>();
        if bytes >= HUGE {
            let start = v.as_ptr() as usize;
            let (lo, hi) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
            if hi > lo {
                // SAFETY: [lo, hi) lies inside `v`'s allocation, which nothing reads yet;
                // MADV_HUGEPAGE only changes how its pages will be backed, not their contents.
                unsafe {
                    libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
                }
            }
        }
    }
    v
}

/// The iterator's values in a vector from [`with_capacity`].
fn fill<T>(it: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let mut v = with_capacity(it.len());
    v.extend(it);
    v
}

/// A float type whose every bit pattern is a valid value, stored little-endian in the files.
trait LeFloat: Copy {}
impl LeFloat for f32 {}
impl LeFloat for f16 {}
impl LeFloat for bf16 {}

/// `bytes` as a vector of `T` by one `memcpy`: the file's bytes are the values' own on a
/// little-endian machine (RLX's targets; a big-endian build fails to compile here).
fn copy_le<T: LeFloat>(bytes: &[u8]) -> Vec<T> {
    #[cfg(target_endian = "big")]
    compile_error!("safetensors holds little-endian values; copy_le copies bytes as they are");
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    let mut v: Vec<T> = with_capacity(n);
    // SAFETY: `v` has room for `n` elements (`n * size <= bytes.len()` bytes are copied into
    // it, byte-wise, so the source's alignment does not matter), the ranges cannot overlap
    // (`v` is fresh), and every bit pattern is a valid f32/f16/bf16 (`LeFloat`), so all `n`
    // elements are initialized values.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * size);
        v.set_len(n);
    }
    v
}
