//! The serialized `ExportedProgram` (`models/<model>.json`), read into plain structs.
//! Field names follow `torch/_export/serde/schema.py` (schema 8.x).

use crate::archive::{Archive, Layout};
use crate::torchsave;
use crate::{TorchImportError, SCHEMA_MAJOR};
use serde_json::Value;
use std::collections::HashMap;

/// One dim of a tensor's size: a number, or a symbol of the shape environment.
#[derive(Debug, Clone, PartialEq)]
pub enum SymDim {
    Int(i64),
    /// The symbol's name (`s77`) and its example value (`hint`).
    Sym(String, Option<i64>),
    /// An expression of symbols (`2*s77`): not bound at import.
    Expr(String),
}

/// `TensorMeta`: dtype code (`ScalarType`) and sizes.
#[derive(Debug, Clone)]
pub struct Meta {
    pub dtype: i64,
    pub sizes: Vec<SymDim>,
}

/// One FX node.
#[derive(Debug, Clone)]
pub struct FxNode {
    pub name: String,
    /// `aten.linear.default`, `operator.getitem`, ...
    pub target: String,
    /// Named arguments in schema order.
    pub inputs: Vec<(String, Value)>,
    /// Output `Argument`s.
    pub outputs: Vec<Value>,
    pub stack_trace: Option<String>,
    pub nn_module_stack: Option<String>,
}

/// How a graph placeholder is fed.
#[derive(Debug, Clone)]
pub enum InputKind {
    /// A `forward` argument.
    User,
    /// A parameter, buffer or lifted constant, read from the archive under this state-dict
    /// (or constant) name.
    State { fqn: String, constant: bool },
    /// A constant argument (an int, a float, None) folded into the program.
    ConstantArg(Value),
}

pub struct Program {
    pub nodes: Vec<FxNode>,
    pub metas: HashMap<String, Meta>,
    /// Graph placeholders in order: (name, how fed).
    pub inputs: Vec<(String, InputKind)>,
    /// User outputs (tensor names, or `None` for a non-tensor output).
    pub outputs: Vec<Value>,
    /// `model_weights_config.json` and `model_constants_config.json` `config` maps.
    pub weights: serde_json::Map<String, Value>,
    pub constants: serde_json::Map<String, Value>,
    /// Storages read from a `torch.save`d state dict (older archives), by the entry path
    /// their config's `path_name` stands for (`data/weights/<key>`).
    pub storages: HashMap<String, Vec<u8>>,
    /// `range_constraints`: symbol (`s31`) → (min, max) the program was exported for
    /// (`torch.export.Dim("batch", min=1, max=64)`); `None` for an unbounded side.
    pub ranges: HashMap<String, (Option<i64>, Option<i64>)>,
}

pub(crate) fn bad(file: &str, msg: impl Into<String>) -> TorchImportError {
    TorchImportError::Program {
        file: file.to_string(),
        msg: msg.into(),
    }
}

/// A `SymInt` / size entry: `{"as_int": 3}` or `{"as_expr": {"expr_str": ..., "hint": ...}}`.
pub fn sym_dim(v: &Value) -> Option<SymDim> {
    if let Some(i) = v.get("as_int").and_then(Value::as_i64) {
        return Some(SymDim::Int(i));
    }
    let e = v.get("as_expr")?;
    let s = e.get("expr_str")?.as_str()?;
    let hint = e
        .get("hint")
        .and_then(|h| h.get("as_int").or(Some(h)))
        .and_then(Value::as_i64);
    // `Symbol('s77', positive=True, integer=True)` (newer torch) or `s77`.
    let name = match s.strip_prefix("Symbol('") {
        Some(r) => r.split('\'').next().unwrap_or(r).to_string(),
        None => s.to_string(),
    };
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Some(SymDim::Sym(name, hint))
    } else {
        Some(SymDim::Expr(s.to_string()))
    }
}

impl Program {
    pub fn read(ar: &mut Archive, file: &str) -> Result<Program, TorchImportError> {
        let (v, model, version) = match ar.layout {
            Layout::Pt2 => Self::read_pt2_json(ar, file)?,
            Layout::Flat => Self::read_flat_json(ar, file)?,
        };
        let torch = v
            .get("torch_version")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        let sv = v.get("schema_version");
        let major = sv.and_then(|s| s.get("major")).and_then(Value::as_i64);
        let minor = sv.and_then(|s| s.get("minor")).and_then(Value::as_i64);
        match major {
            Some(SCHEMA_MAJOR) => {}
            Some(m) => {
                return Err(bad(
                    file,
                    format!(
                        "schema version {m}.{} ({version}, written by torch {torch}): RLX reads schema {SCHEMA_MAJOR}.x (torch 2.6 to 2.15); re-export with a torch whose schema major is {SCHEMA_MAJOR}",
                        minor.unwrap_or(0)
                    ),
                ))
            }
            None => return Err(bad(file, format!("the program has no schema_version ({version}): not a torch.export program"))),
        }
        let gm = v
            .get("graph_module")
            .ok_or_else(|| bad(file, "the program has no graph_module"))?;
        let graph = gm
            .get("graph")
            .ok_or_else(|| bad(file, "graph_module has no graph"))?;

        let mut metas = HashMap::new();
        if let Some(tv) = graph.get("tensor_values").and_then(Value::as_object) {
            for (k, m) in tv {
                let dtype = m.get("dtype").and_then(Value::as_i64).unwrap_or(0);
                let sizes = m
                    .get("sizes")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(file, format!("tensor value \"{k}\" has no sizes")))?
                    .iter()
                    .map(|s| {
                        sym_dim(s).ok_or_else(|| {
                            bad(file, format!("tensor value \"{k}\": unreadable size {s}"))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                metas.insert(k.clone(), Meta { dtype, sizes });
            }
        }
        let mut nodes = vec![];
        for (i, n) in graph
            .get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(file, "graph has no nodes list"))?
            .iter()
            .enumerate()
        {
            let target = n
                .get("target")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(file, format!("node #{i} has no target")))?;
            let target = target
                .strip_prefix("torch.ops.")
                .unwrap_or(target)
                .to_string();
            let outputs = n
                .get("outputs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let name = n
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| first_output_name(&outputs))
                .unwrap_or_else(|| format!("node_{i}"));
            let inputs = n
                .get("inputs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|na| {
                            (
                                na.get("name")
                                    .and_then(Value::as_str)
                                    .unwrap_or("")
                                    .to_string(),
                                na.get("arg").cloned().unwrap_or(Value::Null),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let md = n.get("metadata");
            let get = |k: &str| {
                md.and_then(|m| m.get(k))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            nodes.push(FxNode {
                name,
                target,
                inputs,
                outputs,
                stack_trace: get("stack_trace"),
                nn_module_stack: get("nn_module_stack"),
            });
        }

        let sig = gm
            .get("signature")
            .ok_or_else(|| bad(file, "graph_module has no signature"))?;
        let mut inputs = vec![];
        let placeholders: Vec<&Value> = graph
            .get("inputs")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let specs = sig
            .get("input_specs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(file, "signature has no input_specs"))?;
        if specs.len() != placeholders.len() {
            return Err(bad(
                file,
                format!(
                    "{} graph inputs but {} input specs",
                    placeholders.len(),
                    specs.len()
                ),
            ));
        }
        for spec in specs {
            let (kind, body) = spec
                .as_object()
                .and_then(|o| o.iter().next())
                .ok_or_else(|| bad(file, format!("unreadable input spec {spec}")))?;
            let arg_name = |b: &Value| -> Option<String> {
                let a = b.get("arg")?;
                a.get("name")
                    .or_else(|| a.get("as_tensor").and_then(|t| t.get("name")))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let entry = match kind.as_str() {
                "user_input" => {
                    let a = body.get("arg").unwrap_or(&Value::Null);
                    match a.get("as_tensor").and_then(|t| t.get("name")).and_then(Value::as_str) {
                        Some(n) => (n.to_string(), InputKind::User),
                        None => {
                            return Err(bad(
                                file,
                                format!("a user input that is not a tensor ({a}): RLX feeds tensors only; export with that argument as a constant"),
                            ))
                        }
                    }
                }
                "parameter" | "buffer" | "tensor_constant" => {
                    let name = arg_name(body).ok_or_else(|| {
                        bad(
                            file,
                            format!("{kind} spec without an argument name: {body}"),
                        )
                    })?;
                    let fqn = ["parameter_name", "buffer_name", "tensor_constant_name"]
                        .iter()
                        .find_map(|k| body.get(*k).and_then(Value::as_str))
                        .unwrap_or(&name)
                        .to_string();
                    (
                        name,
                        InputKind::State {
                            fqn,
                            constant: kind == "tensor_constant",
                        },
                    )
                }
                "constant_input" => {
                    let name = body
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    (
                        name,
                        InputKind::ConstantArg(body.get("value").cloned().unwrap_or(Value::Null)),
                    )
                }
                other => {
                    return Err(bad(
                        file,
                        format!(
                        "input spec kind \"{other}\" (a custom object or a token): not supported"
                    ),
                    ))
                }
            };
            inputs.push(entry);
        }
        let mut outputs = vec![];
        for spec in sig
            .get("output_specs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(file, "signature has no output_specs"))?
        {
            if let Some(u) = spec.get("user_output") {
                outputs.push(u.get("arg").cloned().unwrap_or(Value::Null));
            }
        }
        let read_cfg = |ar: &mut Archive,
                        name: &str|
         -> Result<serde_json::Map<String, Value>, TorchImportError> {
            if !ar.has(name) {
                return Ok(Default::default());
            }
            let b = ar.read(name)?;
            let v: Value = serde_json::from_slice(&b)
                .map_err(|e| bad(file, format!("{name} is not valid JSON ({e})")))?;
            Ok(v.get("config")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default())
        };
        let mut storages = HashMap::new();
        let mut state = |ar: &mut Archive,
                         cfg: &str,
                         pt: &str,
                         dir: &str|
         -> Result<serde_json::Map<String, Value>, TorchImportError> {
            if ar.has(cfg) || !ar.has(pt) {
                return read_cfg(ar, cfg);
            }
            // A `torch.save`d dict of tensors: its views become config entries, its
            // storages are kept under the entry paths their `path_name`s stand for.
            let b = ar.read(pt)?;
            let sd =
                torchsave::read_state_dict(&b, &format!("{}{pt}", ar.prefix)).map_err(|m| {
                    TorchImportError::Archive {
                        file: file.into(),
                        msg: m,
                    }
                })?;
            for (k, bytes) in sd.storages {
                storages.insert(format!("{dir}{k}"), bytes);
            }
            let as_ints = |v: &[i64]| {
                Value::Array(
                    v.iter()
                        .map(|&i| serde_json::json!({ "as_int": i }))
                        .collect(),
                )
            };
            Ok(sd
                .tensors
                .into_iter()
                .map(|(name, t)| {
                    let e = serde_json::json!({
                        "path_name": t.key,
                        "tensor_meta": {
                            "dtype": t.dtype,
                            "sizes": as_ints(&t.sizes),
                            "strides": as_ints(&t.strides),
                            "storage_offset": { "as_int": t.offset },
                        }
                    });
                    (name, e)
                })
                .collect())
        };
        let (weights, constants) = match ar.layout {
            Layout::Pt2 => (
                state(
                    ar,
                    &format!("data/weights/{model}_weights_config.json"),
                    &format!("data/weights/{model}.pt"),
                    "data/weights/",
                )?,
                state(
                    ar,
                    &format!("data/constants/{model}_constants_config.json"),
                    &format!("data/constants/{model}.pt"),
                    "data/constants/",
                )?,
            ),
            Layout::Flat => (
                state(ar, "", "serialized_state_dict.pt", "data/weights/")?,
                state(ar, "", "serialized_constants.pt", "data/constants/")?,
            ),
        };
        let mut ranges = HashMap::new();
        if let Some(rc) = v.get("range_constraints").and_then(Value::as_object) {
            for (sym, r) in rc {
                // Bounds past i64 (torch's int_oo) read as unbounded.
                let b = |k: &str| r.get(k).and_then(Value::as_i64);
                ranges.insert(sym.clone(), (b("min_val"), b("max_val")));
            }
        }
        Ok(Program {
            ranges,
            nodes,
            metas,
            inputs,
            outputs,
            weights,
            constants,
            storages,
        })
    }
}

impl Program {
    /// torch 2.8+: `archive_format` "pt2", `archive_version`, `byteorder`, `models/<m>.json`.
    /// Returns the program JSON, the model's name and the archive version as errors say it.
    fn read_pt2_json(
        ar: &mut Archive,
        file: &str,
    ) -> Result<(Value, String, String), TorchImportError> {
        let fmt = ar.read_text("archive_format")?;
        if fmt != "pt2" {
            return Err(bad(
                file,
                format!("archive_format is \"{fmt}\", not \"pt2\": not a torch.export archive"),
            ));
        }
        let version = if ar.has("archive_version") {
            let av = ar.read_text("archive_version")?;
            // torch 2.8 to 2.15 write "0"; a later layout may change what it means.
            match av.parse::<i64>() {
                Ok(0) => {}
                _ => {
                    return Err(bad(
                        file,
                        format!(
                        "archive_version \"{av}\": RLX reads archive version 0 (torch 2.8 to 2.15)"
                    ),
                    ))
                }
            }
            format!("archive version {av}")
        } else {
            "no archive_version".to_string()
        };
        if ar.has("byteorder") {
            let bo = ar.read_text("byteorder")?;
            if bo != "little" {
                return Err(bad(
                    file,
                    format!("byteorder \"{bo}\": only little-endian archives are read"),
                ));
            }
        }
        let models: Vec<String> = ar
            .list("models/")
            .into_iter()
            .filter(|n| n.ends_with(".json") && !n.contains('/'))
            .collect();
        let model = if models.iter().any(|m| m == "model.json") {
            "model".to_string()
        } else if models.len() == 1 {
            models[0].trim_end_matches(".json").to_string()
        } else if models.is_empty() {
            return Err(bad(file, format!("no models/<name>.json entry ({version}): the archive holds no program (an AOTInductor package of compiled code only?)")));
        } else {
            return Err(bad(
                file,
                format!(
                    "several programs ({}) and none named model",
                    models.join(", ")
                ),
            ));
        };
        let bytes = ar.read(&format!("models/{model}.json"))?;
        let v: Value = parse_json(&bytes)
            .map_err(|e| bad(file, format!("models/{model}.json is not valid JSON ({e})")))?;
        Ok((v, model, version))
    }

    /// torch 2.6 and 2.7: `version` (the schema version, "8.2", "8.7") and
    /// `serialized_exported_program.json`, checked before the JSON is parsed.
    fn read_flat_json(
        ar: &mut Archive,
        file: &str,
    ) -> Result<(Value, String, String), TorchImportError> {
        if !ar.has("version") {
            return Err(bad(file, "serialized_exported_program.json without a version entry: not written by torch.export.save"));
        }
        let ver = ar.read_text("version")?;
        let major = ver.split('.').next().and_then(|m| m.parse::<i64>().ok());
        if major != Some(SCHEMA_MAJOR) {
            return Err(bad(
                file,
                format!("version \"{ver}\" (torch.export's flat archive, torch 2.7 and earlier): RLX reads schema {SCHEMA_MAJOR}.x; re-export with torch 2.6 or later"),
            ));
        }
        let bytes = ar.read("serialized_exported_program.json")?;
        let v: Value = parse_json(&bytes).map_err(|e| {
            bad(
                file,
                format!("serialized_exported_program.json is not valid JSON ({e})"),
            )
        })?;
        Ok((v, "model".into(), format!("flat archive, version {ver}")))
    }
}

/// Parse the program JSON. torch 2.6 wrote non-finite floats as Python's bare `Infinity`,
/// `-Infinity` and `NaN` (not JSON); later torch writes them as strings, which the lowering
/// reads: bare ones outside strings are quoted the same way.
fn parse_json(b: &[u8]) -> serde_json::Result<Value> {
    match serde_json::from_slice(b) {
        Ok(v) => Ok(v),
        Err(e) => {
            let mut out = Vec::with_capacity(b.len() + 64);
            let (mut i, mut in_str, mut changed) = (0, false, false);
            while i < b.len() {
                let c = b[i];
                if in_str {
                    out.push(c);
                    if c == b'\\' && i + 1 < b.len() {
                        out.push(b[i + 1]);
                        i += 1;
                    } else if c == b'"' {
                        in_str = false;
                    }
                } else if c == b'"' {
                    in_str = true;
                    out.push(c);
                } else if let Some(t) = ["-Infinity", "Infinity", "NaN"]
                    .iter()
                    .find(|t| b[i..].starts_with(t.as_bytes()))
                {
                    out.push(b'"');
                    out.extend_from_slice(t.as_bytes());
                    out.push(b'"');
                    i += t.len();
                    changed = true;
                    continue;
                } else {
                    out.push(c);
                }
                i += 1;
            }
            if changed {
                serde_json::from_slice(&out)
            } else {
                Err(e)
            }
        }
    }
}

fn first_output_name(outs: &[Value]) -> Option<String> {
    let o = outs.first()?;
    o.get("as_tensor")
        .and_then(|t| t.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bare_non_finite_floats_of_torch_2_6_are_read() {
        let v = super::parse_json(
            br#"{"a": {"as_float": -Infinity}, "b": [NaN, Infinity], "s": "NaN \" -Infinity"}"#,
        )
        .unwrap();
        assert_eq!(v["a"]["as_float"], "-Infinity");
        assert_eq!(v["b"][0], "NaN");
        assert_eq!(v["b"][1], "Infinity");
        assert_eq!(v["s"], "NaN \" -Infinity");
        assert!(super::parse_json(b"{\"a\": Inf}").is_err());
    }
}
