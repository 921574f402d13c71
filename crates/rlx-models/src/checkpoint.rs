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
    /// already holds that dtype; the bytes are copied out of the map either way).
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
        let bytes = &self.files[e.file].1[e.start..e.end];
        let data = match e.dtype {
            Dtype::F32 => TensorData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::F16 => TensorData::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            Dtype::BF16 => TensorData::BF16(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            other => {
                return Err(ModelError::DType {
                    path: path.clone(),
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let data = if data.dtype() == dtype {
            data
        } else {
            convert(&data, dtype)
        };
        Tensor::new(want.to_vec(), data).map_err(|err| ModelError::Safetensors {
            path: path.clone(),
            msg: format!("tensor \"{name}\": {err}"),
        })
    }
}

/// Float conversion without the f64 round trip of `TensorData::cast` for the common cases.
fn convert(d: &TensorData, to: DType) -> TensorData {
    match (d, to) {
        (TensorData::BF16(v), DType::F32) => {
            TensorData::F32(v.iter().map(|x| x.to_f32()).collect())
        }
        (TensorData::F16(v), DType::F32) => TensorData::F32(v.iter().map(|x| x.to_f32()).collect()),
        (TensorData::F32(v), DType::BF16) => {
            TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect())
        }
        (TensorData::F32(v), DType::F16) => {
            TensorData::F16(v.iter().map(|&x| f16::from_f32(x)).collect())
        }
        _ => d.cast(to),
    }
}
