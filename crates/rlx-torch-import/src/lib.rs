//! Import `torch.export` programs (`.pt2` archives written by `torch.export.save`, torch 2.6
//! and later: schema major version 8) into RLX's IR, without Python. Three layouts are read:
//! torch 2.6/2.7's flat zip (`version`, `serialized_exported_program.json`, `torch.save`d
//! weights), torch 2.8's `pt2` archive with `torch.save`d weights (`data/weights/model.pt`),
//! and torch 2.9+'s `pt2` archive with raw storages. `torch.save`d weights are read by a
//! restricted unpickler that accepts only tensors and executes nothing.
//!
//! Every ATen node is lowered onto one or a few ONNX-semantics nodes, which the ONNX
//! importer (conformance-tested op by op) turns into IR; each IR node then carries the FX
//! node's name ([`rlx_ir::Origin::label`]), its ATen target (`op_type`, e.g.
//! `aten.mul.Tensor`), the module path from `nn_module_stack` (`module`, e.g.
//! `layers.3.mlp`) and the innermost user frame of `stack_trace` (`source`, file, line and
//! code). Graph inputs are the program's user inputs, named as `forward`'s parameters;
//! graph outputs are `output_0`, `output_1`, ... in the program's order. Symbolic dims
//! (`torch.export.Dim`) become named dims of the inputs (`s0`, `s77`: the names the
//! program's shape environment gave them), bound at import like ONNX `dim_param`s.
//!
//! ```no_run
//! let m = rlx_torch_import::Pt2Model::open(std::path::Path::new("model.pt2"))?;
//! let g = m.import(&rlx_onnx_import::ImportOptions::default())?;
//! # Ok::<(), rlx_torch_import::TorchImportError>(())
//! ```

mod archive;
mod lower;
mod program;
mod torchsave;

use rlx_ir::{Graph, Shape};
use rlx_onnx_import::{ImportOptions, OnnxModel};
use std::path::Path;

/// The schema major version RLX reads (`torch/_export/serde/schema.py`, `SCHEMA_VERSION`):
/// torch 2.6 through 2.15 write 8.
pub const SCHEMA_MAJOR: i64 = 8;

/// A `.pt2` could not be imported. Every variant names the file, the archive entry, the
/// tensor, or the FX node (with its ATen target and source line) it is about.
#[derive(Debug, thiserror::Error)]
pub enum TorchImportError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The zip container, an entry, or the archive's layout is malformed.
    #[error("{file}: {msg}")]
    Archive { file: String, msg: String },
    /// The program JSON is malformed, or of a schema version RLX does not read.
    #[error("{file}: {msg}")]
    Program { file: String, msg: String },
    /// A weight or constant could not be read.
    #[error("{file}: tensor \"{name}\": {msg}")]
    Tensor {
        file: String,
        name: String,
        msg: String,
    },
    /// An FX node has no lowering (unsupported ATen op or argument) or could not be lowered.
    #[error("{file}: FX node \"{node}\" ({target}){at}: {msg}")]
    Node {
        file: String,
        node: String,
        target: String,
        /// ` at model.py:42  y = self.proj(x)`, or empty.
        at: String,
        msg: String,
    },
    /// The lowered graph could not be imported (the error names the FX node when it can).
    #[error("{0}")]
    Lowered(String),
}

/// A `.pt2` program, decoded once: its user inputs can be read before importing it (so a
/// caller can bind symbolic dims from its input files), then [`Pt2Model::import`] lowers
/// it.
pub struct Pt2Model {
    onnx: OnnxModel,
    /// Symbol → the range `torch.export.Dim` gave it (`range_constraints`).
    ranges: std::collections::HashMap<String, (Option<i64>, Option<i64>)>,
    /// FX node name → what reports say about it.
    prov: std::collections::HashMap<String, lower::Prov>,
    file: String,
}

impl Pt2Model {
    /// Read the archive at `path` and lower its program.
    ///
    /// Errors: unreadable or malformed archive, a schema version other than
    /// [`SCHEMA_MAJOR`] (naming the version found and the torch that wrote it), weights
    /// shorter than their declared storage, and unsupported ATen ops (naming the op, the
    /// FX node and its source line).
    pub fn open(path: &Path) -> Result<Pt2Model, TorchImportError> {
        let file = path.display().to_string();
        let mut ar = archive::Archive::open(path)?;
        let prog = program::Program::read(&mut ar, &file)?;
        let (model, prov) = lower::lower(&prog, &mut ar, &file)?;
        Ok(Pt2Model {
            ranges: prog.ranges.clone(),
            onnx: OnnxModel::from_proto(model, &file),
            prov,
            file,
        })
    }

    /// The program's user inputs (`forward`'s tensor parameters), in order.
    pub fn input_names(&self) -> Vec<String> {
        self.onnx.input_names()
    }

    /// Names and declared types of the user inputs (symbolic dims kept, named `s0`, ...).
    pub fn declared_inputs(&self) -> Vec<(String, Shape)> {
        self.onnx.declared_inputs()
    }

    /// Lower the program into a [`Graph`], dims bound as `opts` says. A symbolic dim that
    /// neither `opts.dims` nor an input shape binds takes `opts.default_dim` moved into the
    /// range the program was exported for (`Dim.AUTO` and `Dim(min=2)` start at 2), so
    /// opening a program without inputs works.
    pub fn import(&self, opts: &ImportOptions) -> Result<Graph, TorchImportError> {
        let mut bound = opts.clone();
        for (input, shape) in self.onnx.declared_inputs() {
            if opts.input_shapes.contains_key(&input) {
                continue;
            }
            for d in &shape.dims {
                let rlx_ir::Dim::Sym(sym) = d else { continue };
                let Some(&(lo, hi)) = self.ranges.get(sym) else {
                    continue;
                };
                if bound.dims.contains_key(sym) {
                    continue;
                }
                let mut v = opts.default_dim as i64;
                if let Some(lo) = lo {
                    v = v.max(lo);
                }
                if let Some(hi) = hi {
                    v = v.min(hi);
                }
                if v != opts.default_dim as i64 && v >= 0 {
                    bound.dims.insert(sym.clone(), v as usize);
                }
            }
        }
        let opts = &bound;
        let mut g = self
            .onnx
            .import(opts)
            .map_err(|e| TorchImportError::Lowered(self.explain(&e.to_string())))?;
        g.name = "torch.export".into();
        self.check_ranges(&g)?;
        for n in &mut g.nodes {
            let Some(o) = n.origin.as_mut().map(std::sync::Arc::make_mut) else {
                continue;
            };
            if let Some(p) = self.prov.get(&o.label) {
                o.label = p.fx_name.clone();
                // A literal the lowering wrote for an argument (a scalar, a fill value)
                // stays a `Constant`, so the localizer calls an inf in it a fill; every
                // other node, folded constants included, takes the ATen target.
                if o.op_type.as_deref() != Some("Constant") {
                    o.op_type = Some(p.target.clone());
                }
                o.module = p.module.clone();
                o.source = p.source.clone();
            }
        }
        Ok(g)
    }

    /// Each symbolic dim, as bound, lies in the range the program was exported for: outside
    /// it torch.export made no promise (a branch specialized on the size, a guard such as
    /// `max=64`), so the run is refused rather than computed on a graph that may not hold.
    fn check_ranges(&self, g: &Graph) -> Result<(), TorchImportError> {
        for (name, decl) in &g.input_decls {
            let Some(node) = g
                .nodes
                .iter()
                .find(|n| matches!(&n.op, rlx_ir::Op::Input { name: n2 } if n2 == name))
            else {
                continue;
            };
            for (axis, d) in decl.dims.iter().enumerate() {
                let rlx_ir::Dim::Sym(sym) = d else { continue };
                let Some(&(lo, hi)) = self.ranges.get(sym) else {
                    continue;
                };
                let Some(rlx_ir::Dim::Static(v)) = node.shape.dims.get(axis).cloned() else {
                    continue;
                };
                let v = v as i64;
                if lo.is_some_and(|lo| v < lo) || hi.is_some_and(|hi| v > hi) {
                    let show =
                        |b: Option<i64>, inf: &str| b.map_or(inf.to_string(), |b| b.to_string());
                    return Err(TorchImportError::Tensor {
                        file: self.file.clone(),
                        name: name.clone(),
                        msg: format!(
                            "dim {axis} ({sym}) is {v}, outside the range [{}, {}] the program was exported for (torch.export.Dim min/max); re-export with a wider range",
                            show(lo, "0"),
                            show(hi, "inf")
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// An ONNX-importer message about node "N" restated in the program's terms.
    fn explain(&self, msg: &str) -> String {
        let named = msg
            .strip_prefix("node \"")
            .and_then(|r| r.split_once('"'))
            .and_then(|(n, rest)| self.prov.get(n).map(|p| (p, rest)));
        match named {
            Some((p, rest)) => {
                let rest = rest.trim_start();
                // Drop the ONNX op type in parentheses: the ATen target replaces it.
                let rest = match rest.strip_prefix('(') {
                    Some(r) => r.split_once("):").map_or(rest, |(_, t)| t.trim_start()),
                    None => rest.trim_start_matches(':').trim_start(),
                };
                format!(
                    "{}: FX node \"{}\" ({}){}: {rest}",
                    self.file,
                    p.fx_name,
                    p.target,
                    p.at()
                )
            }
            None => format!("{}: {msg}", self.file),
        }
    }
}

/// Import the program at `path` with `opts` (see [`Pt2Model`]).
pub fn import_pt2(path: &Path, opts: &ImportOptions) -> Result<Graph, TorchImportError> {
    Pt2Model::open(path)?.import(opts)
}

/// Whether `path` should be read as a `.pt2` archive, by its content first and its
/// extension second:
/// - a readable zip is a `.pt2` when it holds `archive_format` (torch 2.8+) or
///   `serialized_exported_program.json` (torch 2.6, 2.7), whatever its name (a renamed
///   archive still imports; a zip without them, an `rlx compile` package, is not);
/// - an unreadable zip (truncated, corrupted) named `.pt2` is one, so its error says so;
/// - a file that is not a zip is not, unless it is named `.pt2` and does not start like an
///   ONNX model (protobuf field 1, `ir_version`: byte 0x08), so a renamed ONNX file still
///   imports as ONNX and other bytes get the archive reader's "not a zip" error.
pub fn is_pt2(path: &Path) -> bool {
    use std::io::Read;
    let by_name = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("pt2"));
    let Ok(mut f) = std::fs::File::open(path) else {
        return by_name;
    };
    if !path.is_file() {
        return by_name;
    }
    let mut head = [0u8; 4];
    let n = f.read(&mut head).unwrap_or(0);
    if n == 4 && head == *b"PK\x03\x04" {
        return match zip::ZipArchive::new(f) {
            // A zip found past the start: a truncated archive's inner entry (see
            // `Archive::open`); the name decides.
            Ok(z) if z.offset() != 0 => by_name,
            Ok(z) => z.file_names().any(|name| {
                let base = name.rsplit('/').next().unwrap_or(name);
                base == "archive_format" || base == "serialized_exported_program.json"
            }),
            Err(_) => by_name,
        };
    }
    by_name && !(n > 0 && head[0] == 0x08)
}
