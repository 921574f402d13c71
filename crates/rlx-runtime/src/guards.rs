//! Input guards: what a compiled graph expects of each input, checked before any kernel runs.
//!
//! Compiling records one [`InputGuard`] per graph input: its name, dtype, every dim (a static
//! size, or a named symbol from the model's declared signature with the sizes it may take)
//! and the device type the graph was compiled for. With `RLX_RUNTIME_CHECK_INPUTS=1` or
//! [`crate::CompiledGraph::set_check_inputs`], every run checks its inputs against them and
//! fails with [`crate::RuntimeError::InputCheck`], one line per problem, in the form of
//! PyTorch AOTInductor's runtime input checks:
//!
//! ```text
//! rlx input-check: inputs[0] "input_ids": unmatched dtype, expected: i64, but got: f32
//! rlx input-check: inputs[0] "input_ids": unmatched dim 1 ("seq"), expected: 16, but got: 17
//! ```
//!
//! The importer binds symbolic dims to static sizes before compiling, so a symbolic dim's
//! guard accepts exactly the size it was compiled for (`min == max`); the symbol's name comes
//! from `Graph::input_decls`, the model's declared signature.

use crate::Device;
use rlx_ir::{DType, Dim, Graph, Op, Shape, Tensor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The environment variable that turns the input check on for every run (`1`; unset, empty
/// or `0` is off). Read once per run.
pub const CHECK_INPUTS_VAR: &str = "RLX_RUNTIME_CHECK_INPUTS";

/// True when `RLX_RUNTIME_CHECK_INPUTS` asks for input checks (set and not empty or `0`;
/// read through the `rlx_ir::env` registry).
pub fn check_inputs_from_env() -> bool {
    rlx_ir::env::is_on(CHECK_INPUTS_VAR)
}

/// One dim of an input guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardDim {
    /// The symbol the model declares for this dim (ONNX `dim_param`, e.g. `"batch"`), or
    /// `None` for a dim the model declares static.
    pub symbol: Option<String>,
    /// Smallest size accepted.
    pub min: usize,
    /// Largest size accepted; `None` is unbounded. A compiled graph has static shapes, so
    /// its guards have `max == Some(min)`; a [`crate::dynamic::DynamicModel`]'s have ranges.
    pub max: Option<usize>,
}

impl GuardDim {
    /// True when `n` is within `min..=max`.
    pub fn accepts(&self, n: usize) -> bool {
        n >= self.min && self.max.is_none_or(|m| n <= m)
    }

    /// The accepted sizes as text: `16`, `1..8` (both ends included, as `rlx compile --dim
    /// batch=1..8` writes it), `>=1`.
    pub fn expected(&self) -> String {
        match self.max {
            Some(m) if m == self.min => m.to_string(),
            Some(m) => format!("{}..{m}", self.min),
            None => format!(">={}", self.min),
        }
    }
}

/// What a compiled graph expects of one input (recorded by compiling, stored in packages).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputGuard {
    /// The input's name (the ONNX graph input name).
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// One entry per dim, outermost first; the rank is `dims.len()`.
    pub dims: Vec<GuardDim>,
    /// The device type the graph was compiled for (`"cpu"`, `"wgpu"`, `"cuda"`): an input
    /// must be resident on a device of this type (any index).
    pub device_type: String,
}

impl InputGuard {
    /// The guard as a type string: `i64[batch=1,16]` (symbols with their accepted sizes).
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| match &d.symbol {
                Some(s) => format!("{s}={}", d.expected()),
                None => d.expected(),
            })
            .collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }
}

impl InputGuard {
    /// The guard as a declared type: symbolic dims as `Dim::Sym`, static ones at their size.
    pub fn declared_shape(&self) -> Shape {
        Shape {
            dims: self
                .dims
                .iter()
                .map(|d| match &d.symbol {
                    Some(s) => Dim::Sym(s.clone()),
                    None => Dim::Static(d.min),
                })
                .collect(),
            dtype: self.dtype,
        }
    }

    /// The shape this input takes when each symbol has the size in `sizes` (a symbol missing
    /// there at its smallest accepted size, at least 1).
    pub fn shape_at(&self, sizes: &std::collections::BTreeMap<String, usize>) -> Shape {
        let dims: Vec<usize> = self
            .dims
            .iter()
            .map(|d| match &d.symbol {
                Some(s) => sizes.get(s).copied().unwrap_or(d.min.max(1)),
                None => d.min,
            })
            .collect();
        Shape::new(&dims, self.dtype)
    }
}

impl fmt::Display for InputGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\": {} on {}",
            self.name,
            self.type_string(),
            self.device_type
        )
    }
}

/// The device type of `d` as recorded in guards and packages: its name without an index
/// (`cpu`, `wgpu`, `cuda`).
pub fn device_type(d: Device) -> String {
    let s = d.to_string();
    match s.split_once(':') {
        Some((t, _)) => t.to_string(),
        None => s,
    }
}

/// The guards of `compiled` (the graph a backend runs, inputs with bound static dims), with
/// dim symbols taken from `declared` (`Graph::input_decls` of the graph before passes, the
/// model's own signature). One guard per `Input` node, in graph order.
pub fn record_guards(
    compiled: &Graph,
    declared: &[(String, Shape)],
    device: Device,
) -> Vec<InputGuard> {
    let dev = device_type(device);
    compiled
        .inputs()
        .into_iter()
        .filter_map(|id| {
            let n = compiled.node(id);
            let Op::Input { name } = &n.op else {
                return None;
            };
            let decl = declared
                .iter()
                .find(|(dn, s)| dn == name && s.rank() == n.shape.rank())
                .map(|(_, s)| s);
            let dims = n
                .shape
                .dims
                .iter()
                .enumerate()
                .map(|(k, d)| {
                    let declared_sym = decl.and_then(|s| match &s.dims[k] {
                        Dim::Sym(sym) => Some(sym.clone()),
                        Dim::Static(_) => None,
                    });
                    match d {
                        Dim::Static(v) => GuardDim {
                            symbol: declared_sym,
                            min: *v,
                            max: Some(*v),
                        },
                        Dim::Sym(sym) => GuardDim {
                            symbol: Some(declared_sym.unwrap_or_else(|| sym.clone())),
                            min: 0,
                            max: None,
                        },
                    }
                })
                .collect();
            Some(InputGuard {
                name: name.clone(),
                dtype: n.shape.dtype,
                dims,
                device_type: dev.clone(),
            })
        })
        .collect()
}

/// Check named inputs against `guards`; returns one line per problem (empty when all pass).
///
/// `device` is where the inputs are resident (host tensors are `cpu`). Lines, each prefixed
/// `rlx input-check: `: `inputs[k] "name": unmatched dtype|rank|dim i ("sym")|device type,
/// expected: E, but got: G`; `inputs[k] "name": missing input, expected: TYPE`;
/// `"name": unknown input name, expected one of: a, b, but got: "name"`;
/// `inputs[k] "name": given twice`. `k` is the input's position in the compiled graph.
pub fn check_inputs(
    guards: &[InputGuard],
    inputs: &[(&str, &Tensor)],
    device: Device,
) -> Vec<String> {
    let mut lines = vec![];
    let got_dev = device_type(device);
    let mut seen = vec![false; guards.len()];
    for &(name, t) in inputs {
        let Some(k) = guards.iter().position(|g| g.name == name) else {
            let names: Vec<&str> = guards.iter().map(|g| g.name.as_str()).collect();
            lines.push(format!(
                "rlx input-check: \"{name}\": unknown input name, expected one of: {}, but got: \"{name}\"",
                if names.is_empty() { "(no inputs)".to_string() } else { names.join(", ") }
            ));
            continue;
        };
        let g = &guards[k];
        let at = format!("rlx input-check: inputs[{k}] \"{name}\"");
        if seen[k] {
            lines.push(format!("{at}: given twice"));
            continue;
        }
        seen[k] = true;
        if t.dtype() != g.dtype {
            lines.push(format!(
                "{at}: unmatched dtype, expected: {}, but got: {}",
                g.dtype,
                t.dtype()
            ));
        }
        if t.dims().len() != g.dims.len() {
            lines.push(format!(
                "{at}: unmatched rank, expected: {}, but got: {}",
                g.dims.len(),
                t.dims().len()
            ));
        } else {
            for (i, (gd, &n)) in g.dims.iter().zip(t.dims()).enumerate() {
                if !gd.accepts(n) {
                    let sym = gd
                        .symbol
                        .as_ref()
                        .map(|s| format!(" (\"{s}\")"))
                        .unwrap_or_default();
                    lines.push(format!(
                        "{at}: unmatched dim {i}{sym}, expected: {}, but got: {n}",
                        gd.expected()
                    ));
                }
            }
        }
        if got_dev != g.device_type {
            lines.push(format!(
                "{at}: unmatched device type, expected: {}, but got: {got_dev}",
                g.device_type
            ));
        }
    }
    for (k, g) in guards.iter().enumerate() {
        if !seen[k] {
            lines.push(format!(
                "rlx input-check: inputs[{k}] \"{}\": missing input, expected: {}",
                g.name,
                g.type_string()
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim_ranges() {
        let d = GuardDim {
            symbol: None,
            min: 1,
            max: Some(8),
        };
        assert!(d.accepts(1) && d.accepts(8) && !d.accepts(0) && !d.accepts(9));
        assert_eq!(d.expected(), "1..8");
        let u = GuardDim {
            symbol: Some("n".into()),
            min: 0,
            max: None,
        };
        assert!(u.accepts(1 << 40));
        assert_eq!(u.expected(), ">=0");
    }
}
