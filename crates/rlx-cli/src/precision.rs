//! `rlx precision`: find the few nodes of a float32 ONNX model that must stay in float32 when
//! the rest runs in float16 or bfloat16, and write that mixed-precision model.
//!
//! How:
//! 1. Run the float32 model on every calibration input set and record every tensor. Per node:
//!    the largest |x| of its outputs and of its float inputs against the low dtype's largest
//!    finite value (overflow headroom), the fraction of its nonzero outputs that would flush to
//!    zero or become subnormal, and its **own** error: the node alone, fed its recorded inputs
//!    rounded to the low dtype, run in the low dtype by RLX, against its float32 output.
//! 2. Start the kept set from the nodes whose outputs, or inputs once cast down, overflow the
//!    low dtype (and the nodes RLX cannot run in it). Then repeat: write the mixed model, run
//!    it in RLX on every calibration input with the NaN localizer on (`RLX_DEBUG_NANS=1`); if a
//!    NaN/Inf appears, keep the node the localizer names (the Inf's origin first, else the
//!    culprit; a Cast at a region border stands for its low-precision consumers); if an output
//!    is beyond `--tol-rel` of float32, keep the node with the largest own error.
//! 3. Shrink by trial: drop each kept node in turn (latest first) and keep the drop when the
//!    model stays finite and within tolerance on every calibration input. A node whose
//!    float32 output exceeds the dtype's range is tried too: an intended fill (a
//!    `finfo(float32).min` mask) may become -inf and still be absorbed by a softmax.
//! 4. Write the model: low-precision nodes with their float32 initializers converted, a
//!    `Cast` wherever a tensor crosses a region border, graph inputs and outputs stay float32
//!    (a `Cast` after each input, before each output), so callers feed and read what they did.
//!    Load the written file back as `rlx run` does and run it with the localizer on every
//!    calibration input (and every `--verify` input held back from the search).
//!
//! Errors are measured per tensor as `max |low − f32| / max |f32|` (relative to the tensor's
//! largest magnitude: element-wise relative error is meaningless at elements near zero in a
//! 10-bit dtype).
//!
//! (One file over 1,000 lines: the pipeline record → analyse → search → write → verify reads
//! top to bottom and shares one set of per-node records; about half is tests. The ONNX
//! conversion is its only reusable part (`pub`), the first piece to move out when it grows.)

use crate::load::{load, ModelArgs};
use crate::reduce::{graph, import, label_in, node_label, record, tensor_vi, Onnx};
use crate::run::{model_path, sanitize};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use prost::Message;
use rlx_ir::numeric_check::{Cause, DebugMode, NanReport};
use rlx_ir::{DType, Tensor};
use rlx_onnx_import::proto::{
    attr_type, data_type, AttributeProto, GraphProto, ModelProto, NodeProto, ValueInfoProto,
};
use rlx_onnx_import::tensor::{onnx_dtype, tensor_from_proto, tensor_to_proto};
use rlx_runtime::{Device, Session};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Find the few nodes to keep in float32 for a float16/bfloat16 model; write the mixed model.
///
/// The kept set makes the low-precision model finite on every calibration input and within
/// --tol-rel of float32. MODEL is an ONNX model (.onnx, or a folder holding model.onnx); nodes
/// whose op takes no float16/bfloat16 at the model's opset (by onnx's schemas) stay float32.
///
/// Calibration inputs: --calibration DIR (DIR/input_<name>.npy is one input set; subfolders
/// of DIR holding input_<name>.npy are one set each), else --input NAME=FILE and the model
/// folder's input_<name>.npy (one set). --verify DIR takes input sets the same way, held back
/// from the search and checked on the written model only.
///
///   rlx precision model/ --calibration calib/ --to f16 -o model_f16.onnx --verify heldout/
///   rlx precision model.onnx --to bf16 --json report.json --html precision-report/
///
/// The written model keeps float32 graph inputs and outputs (Casts after the inputs and
/// before the outputs); a Cast sits wherever a tensor crosses from float32 nodes to
/// low-precision ones or back.
///
/// Exit status: 0 when the written model was verified finite and within tolerance on every
/// calibration (and --verify) input set; 1 when it was not, or on an error (a model already
/// in low precision, calibration inputs that do not match the model: nothing is written);
/// 2 for a usage error (an unsupported --to).
#[derive(Args, Debug, Clone)]
#[command(verbatim_doc_comment, mut_arg("model", |a| a.help(crate::reduce::MODEL_HELP)))]
pub struct PrecisionArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration input sets: DIR/input_<name>.npy, or subfolders of DIR each holding them.
    #[arg(long, value_name = "DIR")]
    pub calibration: Option<PathBuf>,
    /// The low-precision dtype: f16 (float16) or bf16 (bfloat16).
    #[arg(long, value_name = "DTYPE", value_parser = parse_to)]
    pub to: DType,
    /// The mixed-precision model to write (default: <model name>_<dtype>.onnx here).
    #[arg(long, short = 'o', value_name = "OUT.onnx")]
    pub output: Option<PathBuf>,
    /// Largest error allowed at each graph output, relative to the output's largest |x| in float32.
    #[arg(
        long,
        default_value_t = 1e-2,
        value_name = "R",
        allow_negative_numbers = true
    )]
    pub tol_rel: f64,
    /// Write the report as JSON (every node's statistics, the kept nodes, the verification); - for stdout.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write DIR/precision.html (every node's error in low precision, in execution order) and DIR/precision.json.
    #[arg(long, value_name = "DIR")]
    pub html: Option<PathBuf>,
    /// Held-back input sets (as --calibration) to verify the written model on; not used by the search.
    #[arg(long, value_name = "DIR")]
    pub verify: Vec<PathBuf>,
    /// Nodes (ONNX names, comma-separated) to keep in float32 whatever the search finds.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub keep: Vec<String>,
    /// No search: keep the --keep nodes (and those ONNX requires in float32), then write and verify (to judge another tool's choice).
    #[arg(long, requires = "keep")]
    pub no_search: bool,
    /// Most trial runs of the mixed model (growing and shrinking the kept set).
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub max_trials: usize,
    /// Replace OUT.onnx if it exists.
    #[arg(long)]
    pub force: bool,
    /// No notes or progress on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl PrecisionArgs {
    /// Parse what follows `rlx precision` on a command line (see [`crate::parse_args`]).
    pub fn try_parse_from<I, T>(args: I) -> Result<PrecisionArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        crate::parse_args("rlx precision", args)
    }
}

/// Parse `--to`: the low-precision dtypes the CPU backend runs with rounding at op borders.
pub fn parse_to(s: &str) -> Result<DType, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f32" | "fp32" | "float32" | "float" => Err(format!(
            "{s}: the model is already float32; --to takes a lower precision (f16 or bf16)"
        )),
        other => Err(format!(
            "{other}: RLX cannot simulate this dtype for a whole model here (its CPU backend runs float16 and bfloat16 graphs with rounding at every op); use f16 or bf16"
        )),
    }
}

/// Short name of a low dtype, for tensor names and messages.
fn short(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

/// Smallest positive normal value of a low dtype.
fn min_normal(d: DType) -> f64 {
    match d {
        DType::BF16 => half::bf16::MIN_POSITIVE.to_f64(),
        _ => half::f16::MIN_POSITIVE.to_f64(),
    }
}

/// Values below this magnitude round to zero in the low dtype (half the smallest subnormal).
fn flush_below(d: DType) -> f64 {
    match d {
        DType::BF16 => half::bf16::from_bits(1).to_f64() / 2.0,
        _ => half::f16::from_bits(1).to_f64() / 2.0,
    }
}

/// Significand bits of a low dtype, the implicit one included (f16: 11, bf16: 8).
fn precision_bits(d: DType) -> u32 {
    match d {
        DType::BF16 => 8,
        _ => 11,
    }
}

/// A number for people, one format for every number of a report: exponent form with 2
/// significant digits outside [0.1, 1e5) (`9e-4`, `1e-2`, `2.1e5`), else up to 4 significant
/// digits (`0.5`, `65504`).
pub fn num(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if !(0.1..1e5).contains(&a) {
        let s = format!("{x:.1e}");
        s.replace(".0e", "e")
    } else {
        let digits = a.log10().floor() as i32 + 1;
        let p = (4 - digits).max(0) as usize;
        let s = format!("{x:.p$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

/// Does slot `slot` (an input when `input`, else an output) of the ONNX op `op` admit `low`
/// (float16 or bfloat16) at `opset`, by onnx's own schemas (the generated
/// [`crate::onnx_types::TABLE`])? `None` for an op the table does not have at that opset.
pub fn slot_admits(op: &str, opset: u32, input: bool, slot: usize, low: DType) -> Option<bool> {
    let r = crate::onnx_types::TABLE
        .iter()
        .rev()
        .find(|r| r.0 == op && r.1 <= opset)?;
    let (n, m) = match (input, low) {
        (true, DType::BF16) => (r.2, r.6),
        (false, DType::BF16) => (r.3, r.7),
        (true, _) => (r.2, r.4),
        (false, _) => (r.3, r.5),
    };
    let i = slot.min((n as usize).saturating_sub(1));
    Some(i < 32 && (m >> i) & 1 == 1)
}

/// Why `op` cannot take `low` at `opset` in that slot: "IsInf takes no float16 before opset
/// 20" (the first schema version that admits it), else "Conv takes no bfloat16 in ONNX".
fn no_low_reason(op: &str, opset: u32, input: bool, slot: usize, low: DType) -> String {
    let from = crate::onnx_types::TABLE
        .iter()
        .filter(|r| r.0 == op && r.1 > opset)
        .map(|r| r.1)
        .find(|&v| slot_admits(op, v, input, slot, low) == Some(true));
    let what = if low == DType::BF16 {
        "bfloat16"
    } else {
        "float16"
    };
    match from {
        Some(v) => format!("{op} takes no {what} before opset {v} (the model's opset is {opset})"),
        None => format!(
            "{op} takes no {what} in ONNX (onnx {} schemas)",
            crate::onnx_types::ONNX_VERSION
        ),
    }
}

/// The model's opset of the default ONNX domain.
fn default_opset(m: &ModelProto) -> Option<u32> {
    m.opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version.max(0) as u32)
}

/// Ops whose inputs may be of any type (no Cast is inserted in front of them).
fn any_input_op(op: &str) -> bool {
    matches!(op, "Shape" | "Size" | "Cast")
}

/// Input slots that are float32 by the op's definition whatever the data's type (kept f32).
fn f32_slot(op: &str, i: usize) -> bool {
    matches!((op, i), ("Resize", 1) | ("Resize", 2) | ("Upsample", 1))
}

/// Convert a float32 ONNX model to mixed precision.
///
/// `types`: the element type of every tensor (graph inputs, initializers, node outputs), as
/// recorded from a float32 run. `keep`: indexes of the nodes that stay float32; every other
/// node runs in `low` (F16 or BF16): its float32 inputs are cast down (initializers converted
/// once, `<name>__rlx_<dtype>`), its float32 outputs become `low` (a `Cast` named
/// `rlx.precision/cast_<dtype>/<tensor>` wherever a tensor crosses a border), `Cast(to=float)`
/// and `ConstantOfShape`'s value follow the region. `Constant` nodes stay float32 and are cast
/// where low nodes read them. Graph inputs and outputs keep their float32 type.
///
/// `expose`: also make every float32 node output of the original a graph output (in its
/// region's dtype); the second value maps each to the name it has in the returned model.
///
/// Errors: a tensor that no node, initializer or input provides.
pub fn convert(
    model: &ModelProto,
    types: &HashMap<String, DType>,
    keep: &HashSet<usize>,
    low: DType,
    expose: bool,
) -> Result<(ModelProto, Vec<(String, String)>)> {
    let g0 = graph(model);
    let is_f32 = |t: &str| types.get(t) == Some(&DType::F32);
    let inits: HashMap<&str, usize> = g0
        .initializer
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let outputs: HashSet<&str> = g0.output.iter().map(|v| v.name.as_str()).collect();
    // original name -> (float32 version, low version)
    let mut ver: HashMap<String, (Option<String>, Option<String>)> = HashMap::new();
    for v in &g0.input {
        ver.insert(v.name.clone(), (Some(v.name.clone()), None));
    }
    for t in &g0.initializer {
        ver.insert(t.name.clone(), (Some(t.name.clone()), None));
    }
    let mut nodes: Vec<NodeProto> = vec![];
    let mut new_inits = vec![];
    let lname = short(low);
    // The version of `t` in `want`, creating it (a converted initializer or a Cast) if needed.
    let need = |t: &str,
                want: DType,
                ver: &mut HashMap<String, (Option<String>, Option<String>)>,
                nodes: &mut Vec<NodeProto>,
                new_inits: &mut Vec<rlx_onnx_import::proto::TensorProto>|
     -> Result<String> {
        let entry = ver.get(t).cloned().ok_or_else(|| {
            anyhow!("tensor \"{t}\" is read before any node, input or initializer provides it")
        })?;
        let (have, other) = if want == DType::F32 {
            (entry.0.clone(), entry.1.clone())
        } else {
            (entry.1.clone(), entry.0.clone())
        };
        if let Some(h) = have {
            return Ok(h);
        }
        let src = other.ok_or_else(|| anyhow!("tensor \"{t}\" has no version to cast from"))?;
        let name = format!("{t}__rlx_{}", short(want));
        if let (Some(&i), DType::F16 | DType::BF16) = (inits.get(t), want) {
            let v = tensor_from_proto(&g0.initializer[i], None)
                .map_err(|e| anyhow!("initializer \"{t}\": {e}"))?;
            let conv = Tensor::new(v.dims().to_vec(), v.data().cast(want))
                .map_err(|e| anyhow!("initializer \"{t}\": {e}"))?;
            new_inits.push(tensor_to_proto(&name, &conv));
        } else {
            nodes.push(cast_node(
                &format!("rlx.precision/cast_{}/{t}", short(want)),
                &src,
                &name,
                want,
            ));
        }
        let e = ver.get_mut(t).expect("looked up above");
        if want == DType::F32 {
            e.0 = Some(name.clone());
        } else {
            e.1 = Some(name.clone());
        }
        Ok(name)
    };
    for (k, n0) in g0.node.iter().enumerate() {
        let op = n0.op_type.as_str();
        let region = if op == "Constant" || keep.contains(&k) {
            DType::F32
        } else {
            low
        };
        let mut n = n0.clone();
        for (i, t) in n0.input.iter().enumerate() {
            if t.is_empty() || !is_f32(t) || f32_slot(op, i) {
                if !t.is_empty() && ver.get(t).is_some_and(|e| e.0.is_none()) {
                    // a float32 slot (or a non-float tensor) only the low version has
                    n.input[i] = need(t, DType::F32, &mut ver, &mut nodes, &mut new_inits)?;
                }
                continue;
            }
            if any_input_op(op) {
                let e = ver.get(t).ok_or_else(|| {
                    anyhow!(
                        "tensor \"{t}\" read by \"{}\" has no producer",
                        node_label(n0)
                    )
                })?;
                n.input[i] = e.0.clone().or_else(|| e.1.clone()).unwrap_or_default();
                continue;
            }
            n.input[i] = need(t, region, &mut ver, &mut nodes, &mut new_inits)?;
        }
        let mut after = vec![];
        for (i, o) in n0.output.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            if region == DType::F32 || !is_f32(o) {
                ver.insert(o.clone(), (Some(o.clone()), None));
                continue;
            }
            if outputs.contains(o.as_str()) {
                let lo = format!("{o}__rlx_{lname}");
                n.output[i] = lo.clone();
                after.push(cast_node(
                    &format!("rlx.precision/cast_f32/{o}"),
                    &lo,
                    o,
                    DType::F32,
                ));
                ver.insert(o.clone(), (Some(o.clone()), Some(lo)));
            } else {
                ver.insert(o.clone(), (None, Some(o.clone())));
            }
        }
        if region != DType::F32 {
            retype_attributes(&mut n, n0, types, low);
        }
        nodes.push(n);
        nodes.extend(after);
    }
    let used: HashSet<&str> = nodes
        .iter()
        .flat_map(|n| n.input.iter().map(String::as_str))
        .chain(g0.input.iter().map(|v| v.name.as_str()))
        .chain(g0.output.iter().map(|v| v.name.as_str()))
        .collect();
    let mut initializer: Vec<_> = g0
        .initializer
        .iter()
        .filter(|t| used.contains(t.name.as_str()))
        .cloned()
        .collect();
    initializer.extend(new_inits);
    let mut out = g0.output.clone();
    let mut exposed = vec![];
    if expose {
        let have: HashSet<String> = out.iter().map(|v| v.name.clone()).collect();
        for n0 in &g0.node {
            for o in n0.output.iter().filter(|o| !o.is_empty() && is_f32(o)) {
                let Some(e) = ver.get(o) else { continue };
                let name = e.1.clone().or_else(|| e.0.clone()).unwrap_or_default();
                if !have.contains(&name) {
                    out.push(ValueInfoProto {
                        name: name.clone(),
                        r#type: None,
                    });
                }
                exposed.push((o.clone(), name));
            }
        }
    }
    let value_info = g0
        .value_info
        .iter()
        .filter(|v| !is_f32(&v.name))
        .cloned()
        .collect();
    let g = GraphProto {
        node: nodes,
        initializer,
        output: out,
        value_info,
        ..g0.clone()
    };
    Ok((
        ModelProto {
            graph: Some(g),
            producer_name: "rlx precision".into(),
            ..model.clone()
        },
        exposed,
    ))
}

fn cast_node(name: &str, from: &str, to_name: &str, to: DType) -> NodeProto {
    NodeProto {
        name: name.into(),
        op_type: "Cast".into(),
        input: vec![from.into()],
        output: vec![to_name.into()],
        attribute: vec![AttributeProto {
            name: "to".into(),
            r#type: attr_type::INT,
            i: onnx_dtype(to) as i64,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// In a low-precision node, attributes that fix a float32 output type follow the region.
fn retype_attributes(
    n: &mut NodeProto,
    n0: &NodeProto,
    types: &HashMap<String, DType>,
    low: DType,
) {
    let f32_out = n0
        .output
        .first()
        .is_some_and(|o| types.get(o) == Some(&DType::F32));
    if !f32_out {
        return;
    }
    let lowt = onnx_dtype(low) as i64;
    for a in &mut n.attribute {
        match (n0.op_type.as_str(), a.name.as_str()) {
            ("Cast", "to") if a.i == data_type::FLOAT as i64 => a.i = lowt,
            (
                "EyeLike" | "RandomNormal" | "RandomNormalLike" | "RandomUniform"
                | "RandomUniformLike",
                "dtype",
            ) => a.i = lowt,
            ("ConstantOfShape", "value") => {
                if let Some(t) = a.t.as_ref().filter(|t| t.data_type == data_type::FLOAT) {
                    if let Ok(v) = tensor_from_proto(t, None) {
                        if let Ok(c) = Tensor::new(v.dims().to_vec(), v.data().cast(low)) {
                            a.t = Some(tensor_to_proto(&t.name, &c));
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// One calibration (or verification) input set.
#[derive(Clone)]
struct Sample {
    /// Where it came from (a folder, or "--input").
    name: String,
    feeds: Vec<(String, Tensor)>,
}

/// Input sets from `dir` (its own input_<name>.npy, else one set per subfolder holding them).
fn samples_from_dir(a: &PrecisionArgs, dir: &Path, flag: &str) -> Result<Vec<Sample>> {
    let has_inputs = |d: &Path| -> bool {
        std::fs::read_dir(d).is_ok_and(|r| {
            r.flatten().any(|e| {
                let f = e.file_name().to_string_lossy().to_string();
                f.starts_with("input_") && f.ends_with(".npy")
            })
        })
    };
    if !dir.is_dir() {
        bail!("{flag} {}: not a directory", dir.display());
    }
    let mut sets: Vec<PathBuf> = vec![];
    if has_inputs(dir) {
        sets.push(dir.to_path_buf());
    } else {
        let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("{flag} {}: cannot list", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && has_inputs(p))
            .collect();
        subs.sort();
        sets = subs;
    }
    if sets.is_empty() {
        bail!(
            "{flag} {}: no input_<name>.npy files in it or in its subfolders",
            dir.display()
        );
    }
    let src = crate::load::SourceModel::open(&model_path(&a.model.model))?;
    let names = src.input_names();
    let mut out = vec![];
    for d in sets {
        let mut inputs = vec![];
        for e in std::fs::read_dir(&d)?.flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            let Some(stem) = f
                .strip_prefix("input_")
                .and_then(|s| s.strip_suffix(".npy"))
            else {
                continue;
            };
            match names.iter().find(|n| sanitize(n) == stem) {
                Some(n) => inputs.push(format!("{n}={}", e.path().display())),
                None => bail!(
                    "{flag} {}: the model has no input named \"{stem}\" (its inputs: {})",
                    e.path().display(),
                    names.join(", ")
                ),
            }
        }
        for n in &names {
            if !inputs.iter().any(|s| s.starts_with(&format!("{n}="))) {
                bail!(
                    "{flag} {}: no input_{}.npy for the model's input \"{n}\"",
                    d.display(),
                    sanitize(n)
                );
            }
        }
        let l = load(
            &ModelArgs {
                model: model_path(&a.model.model),
                inputs: inputs.clone(),
                dims: a.model.dims.clone(),
                seed: a.model.seed,
            },
            true,
        )
        .map_err(|e| {
            // Name the file of the input the error is about (a shape or dtype mismatch).
            let msg = format!("{e:#}");
            let file = inputs.iter().find_map(|s| {
                let (n, f) = s.split_once('=')?;
                (msg.contains(&format!("\"{n}\"")) && !msg.contains(f)).then_some(f)
            });
            match file {
                Some(f) => e.context(format!("{flag} {f}")),
                None => e.context(format!("{flag} {}", d.display())),
            }
        })?;
        out.push(Sample {
            name: d.display().to_string(),
            feeds: l.feeds,
        });
    }
    Ok(out)
}

/// Per-node statistics over the calibration inputs.
#[derive(Debug, Clone, Serialize, Default)]
pub struct NodeStats {
    /// Position in the model's node list (execution order).
    pub index: usize,
    /// The node's ONNX name (else its first output's name).
    pub name: String,
    pub op: String,
    /// A float32 compute node (not Constant, Shape or Size; some float32 input or output):
    /// the nodes that can be kept and are counted.
    pub float: bool,
    /// Largest finite |x| of its float32 outputs over every calibration input.
    pub max_abs_out: f64,
    /// Largest finite |x| of its float32 inputs (initializers included).
    pub max_abs_in: f64,
    /// The input holding `max_abs_in`.
    pub max_in_tensor: Option<String>,
    /// Fraction of nonzero outputs that round to zero in the low dtype.
    pub underflow_zero: f64,
    /// Fraction of nonzero outputs that become subnormal in the low dtype.
    pub subnormal: f64,
    /// Terms summed per output (MatMul/Gemm/Conv inner size, reduced elements), when known.
    pub terms: Option<usize>,
    /// The node alone in the low dtype on its rounded inputs (first calibration input):
    /// max |low − f32| / max |f32| over its outputs; `inf` when it made NaN/Inf from finite.
    #[serde(serialize_with = "ser_err")]
    pub own_error: Option<f64>,
    /// Why the node could not be run alone in the low dtype, if it could not.
    pub own_failed: Option<String>,
    /// The all-low-precision model's value at this node against float32 (first calibration
    /// input), same measure; `inf` when it is NaN/Inf where float32 is finite.
    #[serde(serialize_with = "ser_err")]
    pub accumulated_error: Option<f64>,
    /// The written model's value at this node against float32 (first calibration input).
    #[serde(serialize_with = "ser_err")]
    pub final_error: Option<f64>,
    pub kept: bool,
    /// Why it is kept (empty when it is not).
    pub reason: String,
    /// What happened when the shrink step ran the model without it, if tried.
    pub without_it: Option<String>,
}

/// JSON has no infinity: a non-finite error is written as the string "inf" (or "NaN").
fn ser_f64<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else {
        s.serialize_str(&num(*x))
    }
}

fn ser_err<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => ser_f64(v, s),
        None => s.serialize_none(),
    }
}

/// The outcome of running one mixed model on every input set.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub finite: bool,
    /// Largest output error (relative to the output's largest |x|) over the input sets.
    #[serde(serialize_with = "ser_f64")]
    pub max_rel: f64,
    /// Output and input set of `max_rel`.
    pub worst: String,
    /// The first localizer report (culprit) when not finite, or the run's error.
    pub problem: Option<String>,
    #[serde(skip)]
    grow: Vec<String>,
}

impl Verdict {
    fn ok(&self, tol: f64) -> bool {
        self.finite && self.max_rel <= tol
    }
    fn line(&self, tol: f64) -> String {
        if !self.finite {
            self.problem.clone().unwrap_or_else(|| "not finite".into())
        } else if self.max_rel > tol {
            format!(
                "output error {} > {} ({})",
                num(self.max_rel),
                num(tol),
                self.worst
            )
        } else {
            format!(
                "finite, output error {} ({})",
                num(self.max_rel),
                self.worst
            )
        }
    }
}

/// max |a − b| / max |b| over finite `b`; `inf` when `a` is non-finite where `b` is finite.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    if a.numel() != b.numel() {
        return f64::INFINITY;
    }
    let (av, bv) = (a.data().to_f64_vec(), b.data().to_f64_vec());
    let mut scale = 0f64;
    let mut diff = 0f64;
    for (&x, &y) in av.iter().zip(&bv) {
        if !y.is_finite() {
            continue;
        }
        if !x.is_finite() {
            return f64::INFINITY;
        }
        scale = scale.max(y.abs());
        diff = diff.max((x - y).abs());
    }
    if diff == 0.0 {
        0.0
    } else {
        diff / scale.max(f64::MIN_POSITIVE)
    }
}

/// Run `m` on the CPU with the localizer in `mode`; the outputs and the reports.
fn run_model(
    o: &Onnx,
    m: &ModelProto,
    feeds: &[(String, Tensor)],
    mode: DebugMode,
) -> Result<(Vec<Tensor>, Vec<NanReport>)> {
    let g = import(&m.encode_to_vec(), &o.base, feeds)?;
    let mut s = Session::new(Device::Cpu)
        .try_compile(g)
        .map_err(|e| anyhow!("{e}"))?;
    s.set_debug_mode(Some(mode));
    s.set_print_reports(false);
    s.set_value_printer(Some(rlx_runtime::printer::PrinterConfig::off()));
    let outs = s
        .run_tensors(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
        .map_err(|e| anyhow!("{e}"))?;
    Ok((outs, s.nan_reports().to_vec()))
}

/// What the search knows about the model.
struct Ctx<'a> {
    o: &'a Onnx,
    types: HashMap<String, DType>,
    low: DType,
    samples: Vec<Sample>,
    /// Per sample, the float32 graph outputs.
    refs: Vec<Vec<Tensor>>,
    /// Per sample, the name of each graph output.
    out_names: Vec<String>,
    /// Tensor name -> indexes of the nodes reading it.
    consumers: HashMap<String, Vec<usize>>,
    /// Nodes that count (not Constant, some float32 input or output).
    float_nodes: Vec<bool>,
    trials: usize,
}

impl Ctx<'_> {
    /// Run the mixed model keeping `keep` on every input set in `sets` (the calibration ones
    /// when `None`), with the localizer on.
    fn evaluate(
        &mut self,
        keep: &HashSet<usize>,
        sets: Option<(&[Sample], &[Vec<Tensor>])>,
    ) -> Verdict {
        self.trials += 1;
        let (m, _) = match convert(&self.o.model, &self.types, keep, self.low, false) {
            Ok(x) => x,
            Err(e) => {
                return Verdict {
                    finite: false,
                    max_rel: f64::INFINITY,
                    worst: String::new(),
                    problem: Some(format!("cannot convert: {e:#}")),
                    grow: vec![],
                }
            }
        };
        let (samples, refs) = sets.unwrap_or((&self.samples, &self.refs));
        self.judge(&m, samples, refs)
    }

    fn judge(&self, m: &ModelProto, samples: &[Sample], refs: &[Vec<Tensor>]) -> Verdict {
        let mut v = Verdict {
            finite: true,
            max_rel: 0.0,
            worst: String::new(),
            problem: None,
            grow: vec![],
        };
        for (s, r) in samples.iter().zip(refs) {
            let (outs, reports) = match run_model(self.o, m, &s.feeds, DebugMode::Warn) {
                Ok(x) => x,
                Err(e) => {
                    let msg = format!("{e:#}");
                    v.finite = false;
                    v.problem = Some(format!("RLX cannot run it: {msg}"));
                    if let Some(l) = label_in(&msg, &all_labels(self.o, m)) {
                        v.grow.push(l);
                    }
                    return v;
                }
            };
            if let Some(r0) = reports.iter().find(|r| r.is_culprit()) {
                v.finite = false;
                let mut line = format!(
                    "{} at index {} of {} {} \"{}\"",
                    r0.kind, r0.index, r0.node, r0.op, r0.label
                );
                if let Cause::InputsHeldInf {
                    inf_origin_label: Some(l),
                    ..
                } = &r0.cause
                {
                    line += &format!(" (the infinity was created at \"{l}\")");
                    v.grow.push(l.clone());
                }
                v.grow.push(r0.label.clone());
                v.problem = Some(format!("{line} on {}", s.name));
                return v;
            }
            for (k, (a, b)) in outs.iter().zip(r).enumerate() {
                let e = rel_err(a, b);
                if !e.is_finite() {
                    v.finite = false;
                    v.problem = Some(format!(
                        "output \"{}\" holds NaN/Inf on {}",
                        self.out_names[k], s.name
                    ));
                    return v;
                }
                if e > v.max_rel || v.worst.is_empty() {
                    v.max_rel = v.max_rel.max(e);
                    v.worst = format!("output \"{}\" on {}", self.out_names[k], s.name);
                }
            }
        }
        v
    }

    /// The nodes a localizer label stands for: the node of that ONNX name, or, for a Cast or
    /// converted initializer RLX inserted, the low-precision nodes that read the tensor.
    fn nodes_of(&self, label: &str, keep: &HashSet<usize>) -> Vec<usize> {
        let direct: Vec<usize> = (0..self.o.labels.len())
            .filter(|&k| self.o.labels[k] == label && self.float_nodes[k])
            .collect();
        if !direct.is_empty() {
            return direct;
        }
        let tensor = label
            .strip_prefix("rlx.precision/cast_f16/")
            .or_else(|| label.strip_prefix("rlx.precision/cast_bf16/"))
            .or_else(|| label.strip_suffix(&format!("__rlx_{}", short(self.low))))
            .unwrap_or(label);
        self.consumers
            .get(tensor)
            .map(|c| {
                c.iter()
                    .copied()
                    .filter(|k| !keep.contains(k) && self.float_nodes[*k])
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Labels of every node of a converted model (original and inserted).
fn all_labels(o: &Onnx, m: &ModelProto) -> Vec<String> {
    let mut l: Vec<String> = graph(m).node.iter().map(node_label).collect();
    l.extend(o.labels.iter().cloned());
    l
}

/// A progress line on stderr (only when it is a terminal).
struct Progress {
    on: bool,
}

impl Progress {
    fn show(&self, what: &str, done: usize, total: usize) {
        if self.on {
            let w = 30;
            let filled = (done * w).checked_div(total).unwrap_or(w).min(w);
            eprint!(
                "\r\x1b[2Krlx precision: [{}{}] {done}/{total} {what}",
                "#".repeat(filled),
                "-".repeat(w - filled)
            );
            let _ = std::io::stderr().flush();
        }
    }
    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }
}

/// Terms summed per output element, for the ops that reduce.
fn terms(n: &NodeProto, values: &HashMap<String, Tensor>, o: &Onnx) -> Option<usize> {
    let dims = |i: usize| -> Option<Vec<usize>> {
        let t = n.input.get(i)?;
        if let Some(v) = values.get(t) {
            return Some(v.dims().to_vec());
        }
        let g = graph(&o.model);
        g.initializer
            .iter()
            .find(|x| &x.name == t)
            .map(|x| x.dims.iter().map(|&d| d.max(0) as usize).collect())
    };
    let out_numel = || values.get(n.output.first()?).map(|v| v.numel());
    let int_attr = |name: &str| n.attribute.iter().find(|a| a.name == name).map(|a| a.i);
    match n.op_type.as_str() {
        "MatMul" | "Gemm" => {
            let a = dims(0)?;
            let trans = n.op_type == "Gemm" && int_attr("transA") == Some(1);
            if trans {
                a.first().copied()
            } else {
                a.last().copied()
            }
        }
        "Conv" => {
            let w = dims(1)?;
            Some(w.iter().skip(1).product())
        }
        "ReduceSum" | "ReduceMean" | "ReduceSumSquare" | "ReduceL2" | "ReduceL1"
        | "ReduceLogSumExp" | "GlobalAveragePool" => {
            let i: usize = dims(0)?.iter().product();
            Some(i / out_numel()?.max(1))
        }
        "Softmax" | "LogSoftmax" | "LayerNormalization" | "RMSNormalization" => {
            let d = dims(0)?;
            let ax = int_attr("axis").unwrap_or(-1);
            let r = d.len() as i64;
            let ax = if ax < 0 { ax + r } else { ax }.clamp(0, r.max(1) - 1) as usize;
            if n.op_type.ends_with("Normalization") {
                Some(d[ax..].iter().product())
            } else {
                d.get(ax).copied()
            }
        }
        _ => None,
    }
}

/// The default output path: `<model name>_<dtype>.onnx` in the current directory.
fn default_output(model: &Path, low: DType) -> PathBuf {
    let stem = if model.is_dir() {
        model
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "model".into())
    } else {
        model
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "model".into())
    };
    PathBuf::from(format!("{stem}_{}.onnx", short(low)))
}

/// The whole report (`--json`, `--html`'s precision.json).
#[derive(Debug, Serialize)]
pub struct Report {
    pub model: String,
    pub to: String,
    pub max_finite: f64,
    pub tol_rel: f64,
    pub calibration_sets: Vec<String>,
    pub float_nodes: usize,
    pub kept_count: usize,
    /// The kept nodes in execution order, with why.
    pub kept: Vec<KeptNode>,
    pub trials: usize,
    pub seconds: f64,
    /// The all-low-precision model on the calibration inputs (what the search started from).
    pub all_low: Verdict,
    /// The written model, loaded back, on the calibration inputs.
    pub calibration: Verdict,
    /// The written model on the --verify input sets (held back from the search).
    pub held_back: Option<Verdict>,
    pub held_back_sets: Vec<String>,
    pub output: String,
    pub casts_inserted: usize,
    /// The first node of the all-low model (execution order) whose value is NaN/Inf or beyond
    /// tolerance on the first calibration input.
    pub first_failing: Option<String>,
    pub nodes: Vec<NodeStats>,
}

/// One kept node.
#[derive(Debug, Clone, Serialize)]
pub struct KeptNode {
    pub name: String,
    pub op: String,
    pub reason: String,
    pub without_it: Option<String>,
}

/// `rlx precision` without the process around it (the Python package's `rlx.precision`):
/// search, write the mixed-precision model (and `--json`/`--html` if asked) and verify it.
/// The lines the CLI prints on stdout go to `say`, in order; notes on stderr follow
/// `a.quiet`. Returns whether the written model was verified finite and within `--tol-rel`
/// on every calibration and `--verify` input set (the CLI exits 0 then, else 1).
///
/// Errors: the CLI's (`rlx: error: ...` there; nothing written): an existing output without
/// `a.force`, a model already in low precision, input sets that do not fit the model.
pub fn run(a: &PrecisionArgs, say: &mut dyn FnMut(&str)) -> Result<bool> {
    let t0 = Instant::now();
    let low = a.to;
    let max_finite = low.max_finite().unwrap_or(f64::MAX);
    let path = model_path(&a.model.model);
    if rlx_torch_import::is_pt2(&path) {
        bail!(
            "{}: rlx precision works on ONNX models (it writes ONNX); export the program to ONNX first",
            path.display()
        );
    }
    if crate::compile::is_package(&a.model.model) {
        bail!(
            "{}",
            crate::compile::package_refusal(&a.model.model, "rlx precision rewrites an ONNX model")
        );
    }
    if !(a.tol_rel > 0.0 && a.tol_rel.is_finite()) {
        bail!("--tol-rel {}: must be a positive number", a.tol_rel);
    }
    let out_path = a
        .output
        .clone()
        .unwrap_or_else(|| default_output(&a.model.model, low));
    if out_path.is_dir() {
        bail!("-o {}: is a directory", out_path.display());
    }
    if crate::npy::resolved(&out_path) == crate::npy::resolved(&path) {
        bail!(
            "-o {}: is the float32 model itself ({}); write the mixed model to another file",
            out_path.display(),
            path.display()
        );
    }
    if out_path.exists() && !a.force {
        bail!(
            "-o {}: exists; pass --force to replace it",
            out_path.display()
        );
    }
    crate::npy::check_output_file("-o", &out_path, true)?;
    if let Some(j) = a.json.as_ref().filter(|j| j.as_os_str() != "-") {
        crate::npy::check_output_file("--json", j, false)?;
    }
    if let Some(d) = &a.html {
        crate::diverge_html::prepare_dir(d)?;
    }
    let o = Onnx::open(&path)?;
    let g0 = graph(&o.model);
    if let Some(n) = g0.node.iter().find(|n| {
        n.attribute
            .iter()
            .any(|x| x.g.is_some() || !x.graphs.is_empty())
    }) {
        bail!(
            "{}: node \"{}\" ({}) has a subgraph; rlx precision does not convert control flow yet",
            path.display(),
            node_label(n),
            n.op_type
        );
    }
    let low_types = [data_type::FLOAT16, data_type::BFLOAT16];
    let already = |what: &str, name: &str, t: i32| -> anyhow::Error {
        anyhow!(
            "{}: {what} \"{name}\" is already {}: rlx precision converts float32 models (give the float32 version)",
            path.display(),
            if t == data_type::FLOAT16 { "float16" } else { "bfloat16" }
        )
    };
    for t in &g0.initializer {
        if low_types.contains(&t.data_type) {
            return Err(already("initializer", &t.name, t.data_type));
        }
    }
    for v in g0.input.iter().chain(&g0.output) {
        if let Some(t) = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) {
            if low_types.contains(&t.elem_type) {
                return Err(already("graph input/output", &v.name, t.elem_type));
            }
        }
    }
    // Calibration and held-back input sets.
    let samples = match &a.calibration {
        Some(d) => samples_from_dir(a, d, "--calibration")?,
        None => {
            // Without per-input "generated" notes: the line below says how many were.
            let l = crate::load::load_unnoted(&a.model, a.quiet)?;
            // Which inputs came from a file (--input, the folder's input_<name>.npy).
            let from_folder = |n: &str| {
                a.model.model.is_dir()
                    && a.model
                        .model
                        .join(format!("input_{}.npy", sanitize(n)))
                        .is_file()
            };
            let given = l
                .feeds
                .iter()
                .filter(|(n, _)| {
                    from_folder(n)
                        || a.model.inputs.iter().any(|s| {
                            s.split_once('=').is_some_and(|(k, _)| k == n) || !s.contains('=')
                        })
                })
                .count();
            let name = if given == l.feeds.len() {
                if a.model.inputs.is_empty() {
                    "the model folder's inputs".to_string()
                } else {
                    "--input".to_string()
                }
            } else {
                let gen = format!(
                    "generated inputs (deterministic, in [-1, 1), --seed {})",
                    a.model.seed
                );
                if !a.quiet {
                    eprintln!(
                        "rlx precision: {} of {} input(s) generated (deterministic, in [-1, 1)): the kept set fits these values only; give real inputs with --calibration DIR",
                        l.feeds.len() - given,
                        l.feeds.len()
                    );
                }
                if given == 0 {
                    gen
                } else {
                    format!("the given inputs and {gen}")
                }
            };
            vec![Sample {
                name,
                feeds: l.feeds,
            }]
        }
    };
    let mut held = vec![];
    for d in &a.verify {
        held.extend(samples_from_dir(a, d, "--verify")?);
    }
    let progress = Progress {
        on: !a.quiet && std::io::stderr().is_terminal(),
    };
    // 1. The float32 run: every tensor.
    let all_names: Vec<String> = g0
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .filter(|x| !x.is_empty())
        .cloned()
        .collect();
    let mut types: HashMap<String, DType> = HashMap::new();
    for t in &g0.initializer {
        if let Some(d) = rlx_onnx_import::tensor::dtype_of(t.data_type) {
            types.insert(t.name.clone(), d);
        }
    }
    let out_names: Vec<String> = g0.output.iter().map(|v| v.name.clone()).collect();
    let mut first_values: HashMap<String, Tensor> = HashMap::new();
    let mut refs: Vec<Vec<Tensor>> = vec![];
    let mut max_abs: HashMap<String, f64> = HashMap::new();
    let mut under: HashMap<String, (usize, usize, usize)> = HashMap::new(); // zero, sub, nonzero
    let (tiny, normal) = (flush_below(low), min_normal(low));
    let mut stat = |name: &str, t: &Tensor| {
        if !t.dtype().is_float() {
            return;
        }
        let v = t.data().to_f64_vec();
        let m = v
            .iter()
            .filter(|x| x.is_finite())
            .fold(0f64, |m, x| m.max(x.abs()));
        let e = max_abs.entry(name.to_string()).or_insert(0.0);
        *e = e.max(m);
        let u = under.entry(name.to_string()).or_insert((0, 0, 0));
        for x in v
            .iter()
            .map(|x| x.abs())
            .filter(|x| *x > 0.0 && x.is_finite())
        {
            u.2 += 1;
            if x < tiny {
                u.0 += 1;
            } else if x < normal {
                u.1 += 1;
            }
        }
    };
    for t in &g0.initializer {
        if t.data_type == data_type::FLOAT {
            let v = o.inline_init(t).and_then(|p| {
                tensor_from_proto(&p, Some(&o.base))
                    .map_err(|e| anyhow!("initializer \"{}\": {e}", t.name))
            })?;
            stat(&t.name, &v);
        }
    }
    for (si, s) in samples.iter().enumerate() {
        progress.show("float32 run", si, samples.len());
        let vals = record(&o, &s.feeds, &all_names)
            .with_context(|| format!("running the float32 model on {}", s.name))?;
        for (n, t) in &s.feeds {
            types.insert(n.clone(), t.dtype());
            stat(n, t);
        }
        for (n, t) in &vals {
            if matches!(t.dtype(), DType::F16 | DType::BF16) {
                let k = o.producer.get(n).copied().unwrap_or(0);
                bail!(
                    "{}: tensor \"{n}\" (output of {} \"{}\") is already {}: rlx precision converts float32 models (give the float32 version)",
                    path.display(),
                    o.nodes()[k].op_type,
                    o.labels[k],
                    t.dtype().numpy_name()
                );
            }
            types.insert(n.clone(), t.dtype());
            stat(n, t);
        }
        // The reference outputs come from the same kind of run as every trial and the
        // verification (recording every tensor may compile the graph differently: a model
        // with every node kept must measure exactly 0).
        let (r_outs, _) = run_model(&o, &o.model, &s.feeds, DebugMode::Warn)
            .with_context(|| format!("running the float32 model on {}", s.name))?;
        if r_outs.len() != out_names.len() {
            bail!(
                "the float32 model gave {} output(s), its graph declares {}",
                r_outs.len(),
                out_names.len()
            );
        }
        let mut r = vec![];
        for (name, t) in out_names.iter().zip(r_outs) {
            if t.dtype().is_float() && t.data().to_f64_vec().iter().any(|x| !x.is_finite()) {
                bail!(
                    "the float32 model's output \"{name}\" already holds NaN/Inf on {} (find out why first: RLX_DEBUG_NANS=1 rlx run {})",
                    s.name,
                    a.model.model.display()
                );
            }
            r.push(t);
        }
        refs.push(r);
        if si == 0 {
            first_values = vals;
        }
    }
    let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
    for (k, u) in o.uses.iter().enumerate() {
        for t in u {
            consumers.entry(t.clone()).or_default().push(k);
        }
    }
    let is_f32 = |t: &str| types.get(t) == Some(&DType::F32);
    let float_nodes: Vec<bool> = g0
        .node
        .iter()
        .map(|n| {
            !matches!(n.op_type.as_str(), "Constant" | "Shape" | "Size")
                && n.input.iter().chain(&n.output).any(|t| is_f32(t))
        })
        .collect();
    let n_float = float_nodes.iter().filter(|x| **x).count();
    if n_float == 0 {
        bail!(
            "{}: no node computes in float32; nothing to convert",
            path.display()
        );
    }
    if !a.quiet {
        eprintln!(
            "rlx precision: {} → {}: {} float32 node(s) of {}, {} calibration input set(s), tol-rel {}",
            path.display(),
            low.numpy_name(),
            n_float,
            g0.node.len(),
            samples.len(),
            num(a.tol_rel)
        );
    }
    // Per-node statistics.
    let mut stats: Vec<NodeStats> = vec![];
    for (k, n) in g0.node.iter().enumerate() {
        let mut s = NodeStats {
            index: k,
            name: o.labels[k].clone(),
            op: n.op_type.clone(),
            float: float_nodes[k],
            ..Default::default()
        };
        let (mut z, mut sub, mut nz) = (0, 0, 0);
        for t in n.output.iter().filter(|t| is_f32(t)) {
            s.max_abs_out = s.max_abs_out.max(*max_abs.get(t).unwrap_or(&0.0));
            if let Some(u) = under.get(t) {
                z += u.0;
                sub += u.1;
                nz += u.2;
            }
        }
        if nz > 0 {
            s.underflow_zero = z as f64 / nz as f64;
            s.subnormal = sub as f64 / nz as f64;
        }
        for (i, t) in n.input.iter().enumerate() {
            if is_f32(t) && !f32_slot(&n.op_type, i) && !any_input_op(&n.op_type) {
                let m = *max_abs.get(t).unwrap_or(&0.0);
                if m > s.max_abs_in {
                    s.max_abs_in = m;
                    s.max_in_tensor = Some(t.clone());
                }
            }
        }
        s.terms = terms(n, &first_values, &o);
        stats.push(s);
    }
    // Own errors: each float node alone in the low dtype on its rounded inputs (first set).
    let feeds0: HashMap<String, Tensor> = samples[0].feeds.iter().cloned().collect();
    let float_idx: Vec<usize> = (0..g0.node.len()).filter(|&k| float_nodes[k]).collect();
    for (done, &k) in float_idx.iter().enumerate() {
        progress.show("nodes alone in low precision", done, float_idx.len());
        match own_error(&o, &types, k, low, &first_values, &feeds0) {
            Ok(e) => stats[k].own_error = Some(e),
            Err(e) => stats[k].own_failed = Some(format!("{e:#}")),
        }
    }
    progress.done();

    // 2. The search.
    let mut ctx = Ctx {
        o: &o,
        types: types.clone(),
        low,
        samples: samples.clone(),
        refs: refs.clone(),
        out_names: out_names.clone(),
        consumers,
        float_nodes: float_nodes.clone(),
        trials: 0,
    };
    let mut reason: HashMap<usize, String> = HashMap::new();
    let mut order: Vec<usize> = vec![];
    let mut keep: HashSet<usize> = HashSet::new();
    let mut add = |k: usize, why: String, keep: &mut HashSet<usize>, order: &mut Vec<usize>| {
        if keep.insert(k) {
            order.push(k);
            reason.insert(k, why);
        }
    };
    let lname = short(low);
    for name in &a.keep {
        let ks: Vec<usize> = (0..g0.node.len())
            .filter(|&k| &o.labels[k] == name)
            .collect();
        if ks.is_empty() {
            bail!("--keep {name}: the model has no node named \"{name}\"");
        }
        for k in ks {
            add(k, "--keep".into(), &mut keep, &mut order);
        }
    }
    // Always float32 (never dropped by the shrink step, also with --no-search): a node whose
    // op's ONNX type constraints at the model's opset do not admit the low dtype in a slot
    // it would convert (the written model must pass onnx.checker and load in onnxruntime),
    // and a node reading a float32 initializer whose values overflow the low dtype
    // (converted, the initializer would hold inf).
    let opset = default_opset(&o.model);
    if low == DType::BF16 && opset.is_some_and(|v| v < 13) {
        bail!(
            "{}: opset {}: ONNX has bfloat16 Casts from opset 13 on; upgrade the model's opset (onnx.version_converter) or use --to f16",
            path.display(),
            opset.unwrap_or(0)
        );
    }
    let mut fixed: HashSet<usize> = HashSet::new();
    for &k in &float_idx {
        let n = &g0.node[k];
        let op = n.op_type.as_str();
        let converted_in = |i: usize, t: &String| {
            !t.is_empty() && is_f32(t) && !f32_slot(op, i) && !any_input_op(op)
        };
        let mut why = None;
        if let Some(v) = opset.filter(|_| n.domain.is_empty() || n.domain == "ai.onnx") {
            let bad_in = (0..n.input.len()).find(|&i| {
                converted_in(i, &n.input[i]) && slot_admits(op, v, true, i, low) == Some(false)
            });
            let bad_out = (0..n.output.len()).find(|&i| {
                !n.output[i].is_empty()
                    && is_f32(&n.output[i])
                    && slot_admits(op, v, false, i, low) == Some(false)
            });
            why = bad_in
                .map(|i| no_low_reason(op, v, true, i, low))
                .or_else(|| bad_out.map(|i| no_low_reason(op, v, false, i, low)));
        }
        if why.is_none() {
            why = (0..n.input.len())
                .filter(|&i| converted_in(i, &n.input[i]) && o.inits.contains_key(&n.input[i]))
                .map(|i| &n.input[i])
                .find(|t| max_abs.get(*t).is_some_and(|m| *m > max_finite))
                .map(|t| {
                    format!(
                        "initializer \"{t}\" max |x| {} > {}: it would hold inf in {lname}",
                        num(max_abs[t]),
                        num(max_finite)
                    )
                });
        }
        if let Some(w) = why {
            fixed.insert(k);
            add(k, w, &mut keep, &mut order);
        }
    }
    let all_low = ctx.evaluate(&HashSet::new(), None);
    if !a.no_search {
        for &k in &float_idx {
            let s = &stats[k];
            if s.max_abs_out > max_finite {
                add(
                    k,
                    format!("max |x| {} > {}", num(s.max_abs_out), num(max_finite)),
                    &mut keep,
                    &mut order,
                );
            } else if s.max_abs_in > max_finite {
                add(
                    k,
                    format!(
                        "input \"{}\" max |x| {} > {} once cast to {lname}",
                        s.max_in_tensor.as_deref().unwrap_or("?"),
                        num(s.max_abs_in),
                        num(max_finite)
                    ),
                    &mut keep,
                    &mut order,
                );
            } else if let Some(f) = &s.own_failed {
                add(
                    k,
                    format!("RLX cannot run it in {lname}: {f}"),
                    &mut keep,
                    &mut order,
                );
            } else if s.own_error.is_some_and(|e| e.is_infinite()) {
                add(
                    k,
                    format!("alone in {lname} it makes NaN/Inf from finite inputs"),
                    &mut keep,
                    &mut order,
                );
            }
        }
    }
    let mut verdict = ctx.evaluate(&keep, None);
    let mut gave_up = None;
    while !a.no_search && !verdict.ok(a.tol_rel) {
        if ctx.trials >= a.max_trials {
            gave_up = Some(format!(
                "stopped after {} trial runs (--max-trials)",
                ctx.trials
            ));
            break;
        }
        progress.show(
            &format!("growing: {} kept, {}", keep.len(), verdict.line(a.tol_rel)),
            ctx.trials,
            a.max_trials,
        );
        let before = keep.len();
        if !verdict.finite {
            for l in verdict.grow.clone() {
                let ks = ctx.nodes_of(&l, &keep);
                for k in ks {
                    add(
                        k,
                        format!(
                            "in {lname}: {}",
                            verdict.problem.clone().unwrap_or_default()
                        ),
                        &mut keep,
                        &mut order,
                    );
                }
                if keep.len() > before {
                    break;
                }
            }
        }
        if keep.len() == before {
            // Largest own error among the nodes still in low precision (the closest to the
            // dtype's range when none has an error).
            let pick = float_idx
                .iter()
                .copied()
                .filter(|k| !keep.contains(k))
                .max_by(|&x, &y| {
                    let key = |k: usize| (stats[k].own_error.unwrap_or(0.0), stats[k].max_abs_out);
                    key(x)
                        .partial_cmp(&key(y))
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
            let Some(k) = pick else {
                gave_up = Some("every float node is kept and it still fails".into());
                break;
            };
            let s = &stats[k];
            let mut why = format!(
                "{}; its own {lname} error {} is the largest left",
                verdict.line(a.tol_rel),
                num(s.own_error.unwrap_or(0.0))
            );
            if let Some(b) = bits_lost(s.terms, low) {
                why += &format!("; {b}");
            }
            add(k, why, &mut keep, &mut order);
        }
        verdict = ctx.evaluate(&keep, None);
    }
    // 3. Shrink by trial (latest first).
    let mut without: HashMap<usize, String> = HashMap::new();
    if !a.no_search && gave_up.is_none() && ctx.trials >= a.max_trials {
        gave_up = Some(format!(
            "stopped after {} trial runs (--max-trials {}): the kept set was not shrunk",
            ctx.trials, a.max_trials
        ));
    }
    if !a.no_search && verdict.ok(a.tol_rel) {
        let cands: Vec<usize> = order
            .iter()
            .rev()
            .copied()
            .filter(|k| !fixed.contains(k) && reason.get(k).is_some_and(|r| r != "--keep"))
            .collect();
        for (i, k) in cands.iter().copied().enumerate() {
            if ctx.trials >= a.max_trials {
                break;
            }
            progress.show(&format!("shrinking: {} kept", keep.len()), i, cands.len());
            let mut trial = keep.clone();
            trial.remove(&k);
            let v = ctx.evaluate(&trial, None);
            if v.ok(a.tol_rel) {
                keep = trial;
            } else {
                without.insert(k, v.line(a.tol_rel));
            }
        }
    }
    progress.done();

    // 4. Write, load back, verify.
    let (mixed, _) = convert(&o.model, &types, &keep, low, false)?;
    let casts = graph(&mixed)
        .node
        .iter()
        .filter(|n| n.name.starts_with("rlx.precision/cast_"))
        .count();
    // Inline external data of kept float32 initializers: OUT.onnx stands alone.
    let mut mixed = mixed;
    if let Some(g) = mixed.graph.as_mut() {
        for t in g.initializer.iter_mut() {
            *t = o.inline_init(t)?;
        }
    }
    // A written model holds no non-finite initializer the float32 model did not have.
    let non_finite = |t: &Tensor| {
        t.data()
            .to_f64_vec()
            .iter()
            .filter(|x| !x.is_finite())
            .count()
    };
    for t in &graph(&mixed).initializer {
        if !low_types.contains(&t.data_type) {
            continue;
        }
        let v =
            tensor_from_proto(t, None).map_err(|e| anyhow!("initializer \"{}\": {e}", t.name))?;
        let bad = non_finite(&v);
        if bad == 0 {
            continue;
        }
        let src = t
            .name
            .strip_suffix(&format!("__rlx_{lname}"))
            .unwrap_or(&t.name);
        let had = match o.inits.get(src) {
            Some(&i) => non_finite(
                &tensor_from_proto(&o.inline_init(&g0.initializer[i])?, Some(&o.base))
                    .map_err(|e| anyhow!("initializer \"{src}\": {e}"))?,
            ),
            None => 0,
        };
        if bad > had {
            bail!(
                "refusing to write {}: initializer \"{}\" (\"{src}\" in {lname}) holds {bad} non-finite value(s) that the float32 model does not have; nothing written",
                out_path.display(),
                t.name
            );
        }
    }
    let bytes = mixed.encode_to_vec();
    if let Some(parent) = out_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("-o {}: cannot create its folder", out_path.display()))?;
    }
    crate::npy::write_replacing(&out_path, |mut f| {
        f.write_all(&bytes)?;
        Ok(())
    })?;
    let check = |sets: &[Sample], refs: &[Vec<Tensor>]| -> Result<Verdict> {
        let back = Onnx::open(&out_path)?;
        let mut v = Verdict {
            finite: true,
            max_rel: 0.0,
            worst: String::new(),
            problem: None,
            grow: vec![],
        };
        for (s, r) in sets.iter().zip(refs) {
            let one = ctx.judge(
                &back.model,
                std::slice::from_ref(s),
                std::slice::from_ref(r),
            );
            if !one.finite {
                return Ok(one);
            }
            if one.max_rel >= v.max_rel {
                v.max_rel = one.max_rel;
                v.worst = one.worst;
            }
        }
        Ok(v)
    };
    let calib = check(&samples, &refs)?;
    let mut held_refs = vec![];
    for s in &held {
        let (outs, _) = run_model(&o, &o.model, &s.feeds, DebugMode::Warn)
            .with_context(|| format!("running the float32 model on {}", s.name))?;
        held_refs.push(outs);
    }
    let held_v = if held.is_empty() {
        None
    } else {
        Some(check(&held, &held_refs)?)
    };
    // Per-node errors of the all-low and the written model (first set), for the picture.
    let per_node = |keep: &HashSet<usize>| -> Option<HashMap<String, f64>> {
        let (m, exposed) = convert(&o.model, &types, keep, low, true).ok()?;
        let names: Vec<String> = graph(&m).output.iter().map(|v| v.name.clone()).collect();
        let (outs, _) = run_model(&o, &m, &samples[0].feeds, DebugMode::Off).ok()?;
        let by: HashMap<&str, &Tensor> =
            names.iter().map(String::as_str).zip(outs.iter()).collect();
        let mut r = HashMap::new();
        for (orig, name) in exposed {
            if let (Some(a), Some(b)) = (by.get(name.as_str()), first_values.get(&orig)) {
                r.insert(orig, rel_err(a, b));
            }
        }
        Some(r)
    };
    let acc = per_node(&HashSet::new()).unwrap_or_default();
    let fin = per_node(&keep).unwrap_or_default();
    let node_err = |m: &HashMap<String, f64>, n: &NodeProto| -> Option<f64> {
        n.output
            .iter()
            .filter_map(|t| m.get(t).copied())
            .max_by(f64::total_cmp)
    };
    // The first failing node: where the localizer saw the all-low model break (the Inf's
    // origin, else the culprit), else the first node beyond tolerance.
    let mut first_failing = all_low
        .grow
        .first()
        .and_then(|l| ctx.nodes_of(l, &HashSet::new()).into_iter().min())
        .map(|k| o.labels[k].clone());
    for &k in &float_idx {
        let n = &g0.node[k];
        stats[k].accumulated_error = node_err(&acc, n);
        stats[k].final_error = node_err(&fin, n);
        // Beyond tolerance (an infinity the localizer did not report was absorbed: skip it).
        let beyond = stats[k]
            .accumulated_error
            .is_some_and(|e| e > a.tol_rel && (e.is_finite() || !all_low.finite));
        if first_failing.is_none() && !all_low.ok(a.tol_rel) && beyond {
            first_failing = Some(o.labels[k].clone());
        }
    }
    let mut kept = vec![];
    for (k, s) in stats.iter_mut().enumerate() {
        if keep.contains(&k) {
            s.kept = true;
            s.reason = reason.get(&k).cloned().unwrap_or_default();
            s.without_it = without.get(&k).cloned();
            kept.push(KeptNode {
                name: s.name.clone(),
                op: s.op.clone(),
                reason: s.reason.clone(),
                without_it: s.without_it.clone(),
            });
        }
    }
    let report = Report {
        model: path.display().to_string(),
        to: low.numpy_name().into(),
        max_finite,
        tol_rel: a.tol_rel,
        calibration_sets: samples.iter().map(|s| s.name.clone()).collect(),
        float_nodes: n_float,
        kept_count: kept.len(),
        kept,
        trials: ctx.trials,
        seconds: t0.elapsed().as_secs_f64(),
        all_low,
        calibration: calib.clone(),
        held_back: held_v.clone(),
        held_back_sets: held.iter().map(|s| s.name.clone()).collect(),
        output: out_path.display().to_string(),
        casts_inserted: casts,
        first_failing,
        nodes: stats,
    };
    print_table(&report, a.tol_rel, say);
    let json = serde_json::to_value(&report)?;
    if let Some(j) = &a.json {
        let body = serde_json::to_string_pretty(&json)?;
        if j.as_os_str() == "-" {
            say(&body);
        } else {
            crate::npy::write_replacing(j, |mut f| {
                f.write_all(body.as_bytes())?;
                Ok(())
            })?;
        }
    }
    if let Some(d) = &a.html {
        crate::precision_html::write(d, &report, &json)?;
        if !a.quiet {
            eprintln!(
                "rlx precision: wrote {}",
                d.join("precision.html").display()
            );
        }
    }
    let ok = calib.ok(a.tol_rel) && held_v.as_ref().is_none_or(|v| v.ok(a.tol_rel));
    if let Some(g) = gave_up {
        eprintln!("rlx precision: the search gave up: {g}");
    }
    say(&format!(
        "rlx precision: wrote {} ({} node(s) of {} kept in float32, {casts} Cast(s) at region borders; inputs and outputs stay float32)",
        out_path.display(),
        report.kept_count,
        n_float
    ));
    say(&format!(
        "rlx precision: verified in RLX (RLX_DEBUG_NANS=1) on {} calibration input set(s): {}",
        samples.len(),
        verdict_word(&calib, a.tol_rel)
    ));
    if let Some(v) = &held_v {
        say(&format!(
            "rlx precision: verified on {} held-back input set(s): {}",
            held.len(),
            verdict_word(v, a.tol_rel)
        ));
    }
    Ok(ok)
}

fn verdict_word(v: &Verdict, tol: f64) -> String {
    if v.ok(tol) {
        format!(
            "finite, max output error {} <= {} ({})",
            num(v.max_rel),
            num(tol),
            v.worst
        )
    } else {
        format!("FAILED: {}", v.line(tol))
    }
}

/// "sum of N terms loses B bits": accumulating N terms in the low dtype can lose up to
/// log2 N of its significand bits (at most all of them: 11 for float16, 8 for bfloat16).
fn bits_lost(terms: Option<usize>, low: DType) -> Option<String> {
    let n = terms.filter(|&n| n >= 4)?;
    let b = ((n as f64).log2().ceil() as u32).min(precision_bits(low));
    Some(format!("sum of {n} terms loses {b} bits"))
}

fn print_table(r: &Report, tol: f64, say: &mut dyn FnMut(&str)) {
    say(&format!(
        "rlx precision: all {} (nothing kept): {}",
        r.to,
        r.all_low.line(tol)
    ));
    if let Some(f) = &r.first_failing {
        say(&format!(
            "rlx precision: first failing node in all-{}: \"{f}\"",
            r.to
        ));
    }
    say(&format!(
        "rlx precision: keep {} of {} float32 node(s), {} trial run(s), {:.2} s",
        r.kept_count, r.float_nodes, r.trials, r.seconds
    ));
    if r.kept.is_empty() {
        return;
    }
    let wn = r
        .kept
        .iter()
        .map(|k| k.name.len())
        .max()
        .unwrap_or(4)
        .clamp(4, 60);
    let wo = r.kept.iter().map(|k| k.op.len()).max().unwrap_or(2).max(2);
    say(&format!("  {:wn$}  {:wo$}  why kept", "node", "op"));
    for k in &r.kept {
        say(&format!("  {:wn$}  {:wo$}  {}", k.name, k.op, k.reason));
        if let Some(w) = &k.without_it {
            say(&format!("  {:wn$}  {:wo$}    without it: {w}", "", ""));
        }
    }
}

/// The node `k` alone: its recorded inputs rounded to `low`, run in `low`, against its f32
/// outputs. Returns max |low − f32| / max |f32| over its float32 outputs.
fn own_error(
    o: &Onnx,
    types: &HashMap<String, DType>,
    k: usize,
    low: DType,
    values: &HashMap<String, Tensor>,
    feeds: &HashMap<String, Tensor>,
) -> Result<f64> {
    let g0 = graph(&o.model);
    let n = &g0.node[k];
    let mut g = GraphProto {
        name: format!("{}_alone", g0.name),
        node: vec![n.clone()],
        ..Default::default()
    };
    let mut run_feeds = vec![];
    let mut seen = HashSet::new();
    for t in n.input.iter().filter(|t| !t.is_empty()) {
        if !seen.insert(t.clone()) {
            continue;
        }
        if let Some(&i) = o.inits.get(t) {
            g.initializer.push(o.inline_init(&g0.initializer[i])?);
            continue;
        }
        let v = values
            .get(t)
            .or_else(|| feeds.get(t))
            .ok_or_else(|| anyhow!("no recorded value for \"{t}\""))?;
        if v.dtype() == DType::F32 {
            let r = Tensor::new(v.dims().to_vec(), v.data().cast(low).cast(DType::F32))
                .map_err(|e| anyhow!("{e}"))?;
            g.input.push(tensor_vi(t, DType::F32, v.dims()));
            run_feeds.push((t.clone(), r));
        } else {
            g.initializer.push(tensor_to_proto(t, v));
        }
    }
    let outs: Vec<String> = n.output.iter().filter(|x| !x.is_empty()).cloned().collect();
    for x in &outs {
        g.output.push(ValueInfoProto {
            name: x.clone(),
            r#type: None,
        });
    }
    let m = ModelProto {
        graph: Some(g),
        ..o.model.clone()
    };
    let (m, _) = convert(&m, types, &HashSet::new(), low, false)?;
    let (res, _) = run_model(o, &m, &run_feeds, DebugMode::Off)?;
    let mut e = 0f64;
    for (x, r) in outs.iter().zip(&res) {
        if let Some(want) = values.get(x).filter(|v| v.dtype() == DType::F32) {
            let r32 = Tensor::new(r.dims().to_vec(), r.data().cast(DType::F32))
                .map_err(|e| anyhow!("{e}"))?;
            e = e.max(rel_err(&r32, want));
        }
    }
    Ok(e)
}

/// Entry point of `rlx precision`; returns the exit status.
pub fn main_precision(a: PrecisionArgs) -> i32 {
    match run(&a, &mut |l| println!("{l}")) {
        Ok(ok) => i32::from(!ok),
        Err(e) => {
            eprintln!("rlx: error: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_like_the_issue() {
        assert_eq!(num(210000.0), "2.1e5");
        assert_eq!(num(65504.0), "65504");
        assert_eq!(num(0.5), "0.5");
        assert_eq!(num(3.0e-6), "3e-6");
        // one format below 0.1: no "0.01089" beside "8e-4"
        assert_eq!(num(0.01089), "1.1e-2");
        assert_eq!(num(0.002007), "2e-3");
        assert_eq!(num(1e-2), "1e-2");
    }

    #[test]
    fn to_refuses_what_the_cpu_cannot_simulate() {
        assert_eq!(parse_to("f16"), Ok(DType::F16));
        assert_eq!(parse_to("bfloat16"), Ok(DType::BF16));
        assert!(parse_to("fp8").unwrap_err().contains("cannot simulate"));
        assert!(parse_to("f32").unwrap_err().contains("already float32"));
    }

    #[test]
    fn args_parse_as_on_the_command_line() {
        let a = PrecisionArgs::try_parse_from(["m.onnx", "--to=bf16", "--keep", "a,b"]).unwrap();
        assert_eq!(a.to, DType::BF16);
        assert_eq!(a.keep, ["a", "b"]);
        assert_eq!((a.tol_rel, a.max_trials, a.output), (1e-2, 200, None));
        let e = PrecisionArgs::try_parse_from(["m.onnx", "--to", "fp8"])
            .unwrap_err()
            .render()
            .to_string();
        assert!(e.contains("invalid value 'fp8' for '--to <DTYPE>'"), "{e}");
        assert!(e.contains("cannot simulate"), "{e}");
        let e = PrecisionArgs::try_parse_from(["m.onnx", "--to", "f16", "--no-search"])
            .unwrap_err()
            .render()
            .to_string();
        assert!(
            e.contains("--keep") && e.contains("Usage: rlx precision"),
            "{e}"
        );
    }

    #[test]
    fn bits_lost_counts_log2_terms() {
        assert_eq!(
            bits_lost(Some(16000), DType::F16).as_deref(),
            Some("sum of 16000 terms loses 11 bits")
        );
        assert_eq!(bits_lost(Some(1), DType::F16), None);
    }
}
