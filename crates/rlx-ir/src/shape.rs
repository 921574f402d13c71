//! Shapes with static and symbolic dimensions.

use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension: a known size, or a named symbol (ONNX `dim_param`, e.g. `"batch"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    Static(usize),
    Sym(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// A tensor type: dimensions (outermost first, row-major) and element dtype.
///
/// Every node output in a graph that has gone through shape inference has only
/// `Dim::Static` dims; symbolic dims survive on graph inputs as the declared
/// signature (used for input guards and for binding `--dim NAME=SIZE`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub dims: Vec<Dim>,
    pub dtype: DType,
}

impl Shape {
    /// A fully static shape. `Shape::new(&[2, 3], DType::F32)` is a 2×3 f32 tensor;
    /// `Shape::new(&[], DType::F32)` is a scalar.
    pub fn new(dims: &[usize], dtype: DType) -> Shape {
        Shape {
            dims: dims.iter().map(|&d| Dim::Static(d)).collect(),
            dtype,
        }
    }

    /// A shape with possibly symbolic dims.
    pub fn with_dims(dims: Vec<Dim>, dtype: DType) -> Shape {
        Shape { dims, dtype }
    }

    /// A scalar (rank 0) of `dtype`.
    pub fn scalar(dtype: DType) -> Shape {
        Shape::new(&[], dtype)
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// True when every dim is static.
    pub fn is_static(&self) -> bool {
        self.dims.iter().all(|d| matches!(d, Dim::Static(_)))
    }

    /// The static dims, or `None` if any dim is symbolic.
    pub fn static_dims(&self) -> Option<crate::Dims> {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Static(n) => Some(*n),
                Dim::Sym(_) => None,
            })
            .collect()
    }

    /// The static dims; symbolic dims count as 0. Use only on inferred shapes.
    pub fn dims_usize(&self) -> crate::Dims {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Static(n) => *n,
                Dim::Sym(_) => 0,
            })
            .collect()
    }

    /// Number of elements (product of static dims; 1 for a scalar; 0 if symbolic).
    pub fn numel(&self) -> usize {
        self.dims_usize().iter().product()
    }

    /// Same dims with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Shape {
        Shape {
            dims: self.dims.clone(),
            dtype,
        }
    }
}

impl fmt::Display for Shape {
    /// `f32[2,3]`, `i64[batch,16]`, `f32[]` for a scalar.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Row-major (C-order) strides of `dims`, in elements.
pub fn strides_of(dims: &[usize]) -> crate::Dims {
    let mut s: crate::Dims = smallvec::smallvec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// NumPy broadcasting of two shapes (ONNX "multidirectional broadcasting").
/// Returns `None` when a pair of dims is neither equal nor 1.
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
    }
    Some(out)
}
