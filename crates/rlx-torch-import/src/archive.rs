//! Reading a `.pt2` archive (the zip that `torch.export.save` writes) without Python:
//! the serialized `ExportedProgram` JSON and the raw storages of its weights and constants.
//!
//! Layout (torch 2.8+, `torch/export/pt2_archive/_package.py`): every entry sits under one
//! folder named after the archive (`<name>/`): `archive_format` ("pt2"), `archive_version`,
//! `byteorder` ("little"), `models/<model>.json` (the program), `data/weights/
//! model_weights_config.json` + `data/weights/<path_name>` (raw little-endian storage bytes),
//! `data/constants/...` likewise, and `data/sample_inputs/<model>.pt` (a pickle, never read).
//! torch 2.6 and 2.7 wrote a flat zip instead ([`Layout::Flat`]): the same program JSON as
//! `serialized_exported_program.json`, its weights `torch.save`d (read by `torchsave`).

use crate::TorchImportError;
use std::io::Read;
use std::path::Path;

/// A `.pt2` archive opened for reading; entry names are checked once at open.
pub(crate) struct Archive {
    z: zip::ZipArchive<std::fs::File>,
    /// Which of torch.export's layouts the archive has.
    pub layout: Layout,
    /// The folder every entry sits under, with its trailing `/` (may be empty).
    pub prefix: String,
    file: String,
    /// The archive's size in bytes: no stored entry can be larger.
    len: u64,
}

/// The layouts `torch.export.save` has written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// torch 2.8 and later: `<name>/archive_format` ("pt2"), `archive_version` ("0"),
    /// `models/<model>.json`; weights as raw storages + `<model>_weights_config.json`
    /// (torch 2.9+), or one `torch.save`d `data/weights/<model>.pt` (torch 2.8).
    Pt2,
    /// torch 2.6 and 2.7: `version` (the schema version: "8.2", "8.7"),
    /// `serialized_exported_program.json`, and `serialized_state_dict.pt`,
    /// `serialized_constants.pt`, `serialized_example_inputs.pt` (each a `torch.save` zip).
    Flat,
}

/// Largest entry `rlx` inflates from a compressed entry, as a multiple of the archive's size.
/// torch stores entries uncompressed, but a user may re-zip an archive with deflate, which
/// inflates at most about 1032:1 (RFC 1951: a 258-byte match in about 2 bits); an entry that
/// declares more cannot be real. Compressed entries are not pre-allocated at their declared
/// size: the buffer grows with what actually inflates, so a bomb costs what it holds.
const MAX_INFLATE_RATIO: u64 = 1032;

impl Archive {
    pub fn open(path: &Path) -> Result<Archive, TorchImportError> {
        let file = path.display().to_string();
        let io = |source| TorchImportError::Io {
            file: file.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let f = std::fs::File::open(path).map_err(io)?;
        let z = zip::ZipArchive::new(f).map_err(|e| TorchImportError::Archive {
            file: file.clone(),
            msg: format!("not a readable zip archive ({e}); a .pt2 from torch.export.save is one (truncated or corrupted?)"),
        })?;
        // A zip found past the file's start is one stored inside a truncated archive (torch
        // stores `data/sample_inputs/model.pt`, itself a zip, uncompressed): the outer
        // archive's directory at the end is missing.
        if z.offset() != 0 {
            return Err(TorchImportError::Archive {
                file,
                msg: "truncated or corrupted: the zip directory at the end of the file is missing (the one found belongs to an entry stored inside it)".into(),
            });
        }
        for name in z.file_names() {
            let bad = name.starts_with('/')
                || name.starts_with('\\')
                || name.contains('\\')
                || name.contains(':')
                || name.split('/').any(|c| c == "..");
            if bad {
                return Err(TorchImportError::Archive {
                    file,
                    msg: format!("entry \"{name}\" is absolute or leaves the archive's folder"),
                });
            }
        }
        // The folder of `archive_format` (or of `models/`) is the archive's prefix.
        let mut prefix = None;
        for name in z.file_names() {
            if let Some(p) = name.strip_suffix("archive_format") {
                if p.is_empty() || p.ends_with('/') {
                    prefix = Some(p.to_string());
                    break;
                }
            }
        }
        let (prefix, layout) = match prefix {
            Some(p) => (p, Layout::Pt2),
            None => {
                let flat = z.file_names().find_map(|n| {
                    n.strip_suffix("serialized_exported_program.json")
                        .filter(|p| p.is_empty() || p.ends_with('/'))
                        .map(str::to_string)
                });
                match flat {
                    Some(p) => (p, Layout::Flat),
                    None => {
                        return Err(TorchImportError::Archive {
                            file,
                            msg: "neither archive_format (torch 2.8+) nor serialized_exported_program.json (torch 2.6, 2.7): not a .pt2 written by torch.export.save".into(),
                        })
                    }
                }
            }
        };
        Ok(Archive {
            z,
            layout,
            prefix,
            file,
            len: meta.len(),
        })
    }

    /// Whether the archive holds `<prefix><name>`.
    pub fn has(&self, name: &str) -> bool {
        let full = format!("{}{name}", self.prefix);
        self.z.file_names().any(|n| n == full)
    }

    /// Names of the entries under `<prefix><dir>`, relative to it.
    pub fn list(&self, dir: &str) -> Vec<String> {
        let full = format!("{}{dir}", self.prefix);
        self.z
            .file_names()
            .filter_map(|n| n.strip_prefix(&full).map(str::to_string))
            .collect()
    }

    /// The declared (uncompressed) size of `<prefix><name>`.
    pub fn size(&mut self, name: &str) -> Result<u64, TorchImportError> {
        let full = format!("{}{name}", self.prefix);
        let f = self
            .z
            .by_name(&full)
            .map_err(|e| TorchImportError::Archive {
                file: self.file.clone(),
                msg: format!("entry \"{full}\" is missing or unreadable ({e})"),
            })?;
        Ok(f.size())
    }

    /// Read `<prefix><name>` in full. Errors: missing, larger than the archive could hold,
    /// shorter than declared, or corrupted (CRC).
    pub fn read(&mut self, name: &str) -> Result<Vec<u8>, TorchImportError> {
        let full = format!("{}{name}", self.prefix);
        let file = self.file.clone();
        let err = |msg: String| TorchImportError::Archive {
            file: file.clone(),
            msg: format!("entry \"{full}\": {msg}"),
        };
        let mut f = self
            .z
            .by_name(&full)
            .map_err(|e| err(format!("missing or unreadable ({e})")))?;
        let declared = f.size();
        let stored = f.compression() == zip::CompressionMethod::Stored;
        let cap = if stored {
            self.len
        } else {
            self.len.saturating_mul(MAX_INFLATE_RATIO)
        };
        if declared > cap {
            return Err(err(format!(
                "declares {declared} bytes, more than the {}-byte archive can hold{}",
                self.len,
                if stored {
                    ""
                } else {
                    " (deflate inflates at most 1032:1)"
                }
            )));
        }
        let prealloc = if stored {
            declared
        } else {
            declared.min(self.len)
        };
        let mut buf = Vec::with_capacity(prealloc as usize);
        (&mut f)
            .take(cap + 1)
            .read_to_end(&mut buf)
            .map_err(|e| err(format!("corrupted ({e})")))?;
        if buf.len() as u64 != declared {
            return Err(err(format!(
                "holds {} bytes but declares {declared}",
                buf.len()
            )));
        }
        Ok(buf)
    }

    /// `<prefix><name>` as UTF-8 text, trimmed.
    pub fn read_text(&mut self, name: &str) -> Result<String, TorchImportError> {
        let b = self.read(name)?;
        String::from_utf8(b)
            .map(|s| s.trim().to_string())
            .map_err(|_| TorchImportError::Archive {
                file: self.file.clone(),
                msg: format!("entry \"{}{name}\" is not UTF-8 text", self.prefix),
            })
    }
}
