//! CPU kernels, grouped by op family. Each family file exposes one small `pub(crate) fn`
//! per op taking host tensors and the node's output type; [`crate::eval_op`] dispatches.
//!
//! Conventions shared by every kernel:
//! * F32 computes in f32, F64 in f64; F16/BF16 compute in f32 and round the output back to
//!   the declared dtype (so an f16 overflow appears at the op where a GPU would produce it);
//! * integer math goes through the i64 scalar semantics of `rlx_ir`;
//! * data-parallel loops use rayon only above [`PAR_THRESHOLD`] elements.

/// Defines `$vis fn $name<generics>(args) -> ret` whose `$body` is compiled three times,
/// for AVX-512 (with AVX2 and FMA), for AVX2+FMA and for the baseline, inside
/// `#[target_feature]` functions; the copy for the CPU's widest ISA is picked at run time
/// ([`fastmath::isa`], checked once). Loops in `$body`, and the closures passed in, inline
/// into each copy and vectorize 16, 8 or 4 lanes wide. Rust never contracts `a * b + c` into
/// an FMA on its own, so the copies compute the same values.
macro_rules! isa_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident[$($g:tt)*]($($a:ident : $t:ty),*) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name<$($g)*>($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn plain<$($g)*>($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::kernels::fastmath::{isa, Isa};
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn wide<$($g)*>($($a: $t),*) $(-> $r)? {
                    plain($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<$($g)*>($($a: $t),*) $(-> $r)? {
                    plain($($a),*)
                }
                match isa() {
                    // SAFETY: the CPU has these features (checked at run time by `isa`).
                    Isa::Avx512 => unsafe { wide($($a),*) },
                    Isa::Avx2 => unsafe { avx2($($a),*) },
                    Isa::Plain => plain($($a),*),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            plain($($a),*)
        }
    };
}

/// xorshift values in [-1, 1) (the kernels' unit tests' random operands).
#[cfg(test)]
pub(crate) fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod chain;
pub mod conv;
pub mod elementwise;
pub mod fastmath;
mod gemm_calls;
pub mod grid;
pub mod index;
pub mod matmul;
pub mod matvec;
pub mod mm_packed;
pub mod norm;
pub mod pool;
pub mod reduce;
pub mod scatter;
pub mod shape;
#[cfg(target_arch = "x86_64")]
pub mod simd;
pub mod wide;

use crate::KernelError;
use half::{bf16, f16};
use rlx_ir::{Dims, Shape, Tensor, TensorData};
use smallvec::SmallVec;

/// The largest sum of magnitudes over the rows of `w` (`row` values each), in f64: with
/// every |x| ≤ X, no partial sum of a row's dot product with `x` exceeds X times this.
pub fn max_row_abs_sum(w: &[f32], row: usize) -> f64 {
    w.chunks(row.max(1))
        .map(|r| r.iter().map(|v| v.abs() as f64).sum::<f64>())
        .fold(0.0, f64::max)
}

/// Whether every partial sum of a linear op (rows with [`max_row_abs_sum`] `row_abs_sum`,
/// biases up to `b_max` in magnitude) on an input whose largest magnitude has the bits
/// `x_bits` (`wide::max_abs_bits`) provably stays below half of f32::MAX; false for NaN
/// and Inf inputs.
pub fn sums_below_half_max(x_bits: u32, row_abs_sum: f64, b_max: f64) -> bool {
    x_bits < 0x7f80_0000
        && f32::from_bits(x_bits) as f64 * row_abs_sum + b_max < f32::MAX as f64 / 2.0
}

/// Below this many output elements a kernel runs on the calling thread.
pub const PAR_THRESHOLD: usize = 1 << 15;

/// True when a loop over `work` elements should be split over rayon: at least
/// [`PAR_THRESHOLD`] and more than one thread in the current pool. With one thread every
/// loop runs inline: a rayon call made outside the pool hands the work to a pool thread and
/// blocks on it, a thread switch per op for no parallelism.
#[inline]
pub fn par_worth(work: usize) -> bool {
    work >= PAR_THRESHOLD && rayon::current_num_threads() > 1
}

pub(crate) type KResult<T> = Result<T, KernelError>;

pub(crate) fn invalid<T>(msg: impl Into<String>) -> KResult<T> {
    Err(KernelError::Invalid(msg.into()))
}

/// One element type of [`TensorData`], convertible through f64 (ONNX Cast semantics).
pub(crate) trait Elem: Copy + Send + Sync + PartialEq + 'static {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! elem_prim {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline]
            fn from_f64(x: f64) -> Self { x as $t }
            #[inline]
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
elem_prim!(f32, f64);
macro_rules! elem_int {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline]
            fn from_f64(x: f64) -> Self { x as i64 as $t }
            #[inline]
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
elem_int!(i64, i32, i16, i8, u8, u16, u32);
impl Elem for u64 {
    #[inline]
    fn from_f64(x: f64) -> Self {
        if x < 0.0 {
            x as i64 as u64
        } else {
            x as u64
        }
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Elem for f16 {
    fn from_f64(x: f64) -> Self {
        rlx_ir::tensor::f16_from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}
impl Elem for bf16 {
    fn from_f64(x: f64) -> Self {
        rlx_ir::tensor::bf16_from_f64(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}
impl Elem for bool {
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
}

/// Apply a generic body to the inner slice of a [`TensorData`] and rewrap the resulting
/// `Vec` in the same variant: `map_same!(data, v => transpose(v, ..))`. Narrow data moves
/// its `u8` codes (so a body must not make new values from numbers for it).
macro_rules! map_same {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            rlx_ir::TensorData::F32($v) => rlx_ir::TensorData::F32($body),
            rlx_ir::TensorData::F16($v) => rlx_ir::TensorData::F16($body),
            rlx_ir::TensorData::BF16($v) => rlx_ir::TensorData::BF16($body),
            rlx_ir::TensorData::F64($v) => rlx_ir::TensorData::F64($body),
            rlx_ir::TensorData::I64($v) => rlx_ir::TensorData::I64($body),
            rlx_ir::TensorData::I32($v) => rlx_ir::TensorData::I32($body),
            rlx_ir::TensorData::I16($v) => rlx_ir::TensorData::I16($body),
            rlx_ir::TensorData::I8($v) => rlx_ir::TensorData::I8($body),
            rlx_ir::TensorData::U8($v) => rlx_ir::TensorData::U8($body),
            rlx_ir::TensorData::U16($v) => rlx_ir::TensorData::U16($body),
            rlx_ir::TensorData::U32($v) => rlx_ir::TensorData::U32($body),
            rlx_ir::TensorData::U64($v) => rlx_ir::TensorData::U64($body),
            rlx_ir::TensorData::Bool($v) => rlx_ir::TensorData::Bool($body),
            rlx_ir::TensorData::Narrow { dtype, codes: $v } => rlx_ir::TensorData::Narrow {
                dtype: rlx_ir::DType::clone(&dtype),
                codes: $body,
            },
        }
    };
}
pub(crate) use map_same;

/// Apply a body generic over `T: num_traits::Float` to a float tensor's data: F32 and F64
/// directly, F16/BF16 widened to f32 and the resulting `Vec<f32>` rounded back.
/// Non-float data returns `Err(Invalid)` from the enclosing function.
macro_rules! map_float {
    ($data:expr, $what:expr, $v:ident => $body:expr) => {
        match $data {
            rlx_ir::TensorData::F32($v) => rlx_ir::TensorData::F32($body),
            rlx_ir::TensorData::F64($v) => rlx_ir::TensorData::F64($body),
            rlx_ir::TensorData::F16(h) => {
                let tmp: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
                let $v = &tmp[..];
                rlx_ir::TensorData::F16($crate::kernels::round_f16($body))
            }
            rlx_ir::TensorData::BF16(h) => {
                let tmp: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
                let $v = &tmp[..];
                rlx_ir::TensorData::BF16($crate::kernels::round_bf16($body))
            }
            other => {
                return Err($crate::KernelError::Invalid(format!(
                    "{} expects a float tensor, got {}",
                    $what,
                    other.dtype()
                )))
            }
        }
    };
}
pub(crate) use map_float;

pub(crate) fn round_f16(v: Vec<f32>) -> Vec<f16> {
    v.into_iter().map(f16::from_f32).collect()
}
pub(crate) fn round_bf16(v: Vec<f32>) -> Vec<bf16> {
    v.into_iter().map(bf16::from_f32).collect()
}

/// The tensor's values converted to `T` (used for small side inputs: scales, biases).
pub(crate) fn values_as<T: Elem>(d: &TensorData) -> Vec<T> {
    with_elem(d, |x| T::from_f64(x))
}

fn with_elem<T>(d: &TensorData, f: impl Fn(f64) -> T) -> Vec<T> {
    match d {
        TensorData::F32(v) => v.iter().map(|&x| f(x as f64)).collect(),
        TensorData::F64(v) => v.iter().map(|&x| f(x)).collect(),
        _ => (0..d.len()).map(|i| f(d.get_f64(i))).collect(),
    }
}

/// The output dims of a node's inferred type (errors on symbolic dims).
pub(crate) fn out_dims(out: &Shape) -> KResult<Dims> {
    out.dims
        .iter()
        .map(|d| match d {
            rlx_ir::Dim::Static(n) => Some(*n),
            rlx_ir::Dim::Sym(_) => None,
        })
        .collect::<Option<Dims>>()
        .ok_or_else(|| KernelError::Invalid(format!("output type {out} has symbolic dims")))
}

/// Wrap data into a tensor with `dims`, checking the element count.
pub fn make(dims: impl Into<Dims>, data: TensorData) -> KResult<Tensor> {
    Tensor::new(dims, data).map_err(|e| KernelError::Invalid(e.to_string()))
}

/// Check the number of inputs.
pub(crate) fn arity(op: &rlx_ir::Op, inputs: &[&Tensor], min: usize, max: usize) -> KResult<()> {
    if inputs.len() < min || inputs.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min}..={max}")
        };
        let op = op.name();
        return invalid(format!("{op} takes {want} inputs, got {}", inputs.len()));
    }
    Ok(())
}

/// Row-major strides.
pub(crate) fn strides(dims: &[usize]) -> Dims {
    rlx_ir::strides_of(dims)
}

/// Fill `out` (chunks of `chunk` elements) in parallel when `total` is large.
pub fn fill_chunks<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    use rayon::prelude::*;
    let chunk = chunk.max(1);
    if par_worth(out.len()) && out.len() / chunk > 1 {
        // Group rows so each task has at least ~PAR_THRESHOLD/4 elements.
        let rows_per_task = ((PAR_THRESHOLD / 4) / chunk).max(1);
        out.par_chunks_mut(chunk * rows_per_task)
            .enumerate()
            .for_each(|(t, block)| {
                for (r, row) in block.chunks_mut(chunk).enumerate() {
                    f(t * rows_per_task + r, row);
                }
            });
    } else {
        for (r, row) in out.chunks_mut(chunk).enumerate() {
            f(r, row);
        }
    }
}

/// Row-broadcast plan: the output is walked as rows of `inner` elements (its trailing dims
/// that every input walks contiguously or broadcasts as a whole, merged); for each input,
/// the offset of a row's first element and the stride along the row (0 or 1).
pub struct Bcast {
    pub inner: usize,
    outer_dims: Dims,
    /// Per input: strides of the outer (merged, all but the row) dims (0 where broadcast).
    outer_strides: SmallVec<[Dims; 3]>,
    /// Per input: stride along the row (0 or 1).
    pub inner_strides: SmallVec<[usize; 3]>,
}

impl Bcast {
    /// Plan a broadcast of every `ins` dims to `out` (NumPy rules). Errors when a dim is
    /// neither equal to the output's nor 1.
    pub fn new(ins: &[&[usize]], out: &[usize]) -> KResult<Bcast> {
        let r = out.len();
        // Per input, its stride along each output dim (0 where broadcast).
        let mut fulls: SmallVec<[Dims; 3]> = SmallVec::new();
        for d in ins {
            if d.len() > r {
                return invalid(format!("cannot broadcast {d:?} to {out:?}"));
            }
            let st = strides(d);
            let mut full: Dims = smallvec::smallvec![0usize; r];
            for (i, &od) in out.iter().enumerate() {
                if i + d.len() < r {
                    continue;
                }
                let j = i + d.len() - r;
                if d[j] == od {
                    full[i] = if od == 1 { 0 } else { st[j] };
                } else if d[j] == 1 {
                    full[i] = 0;
                } else {
                    return invalid(format!("cannot broadcast {d:?} to {out:?}"));
                }
            }
            fulls.push(full);
        }
        // Merge adjacent output dims that every input walks as one (outer stride = inner
        // stride * inner size, broadcast in both included) and drop size-1 dims, so that
        // e.g. [N,C,H,W] * [N,C,1,1] is N*C rows of H*W, not N*C*H rows of W.
        let mut dims = Dims::new();
        let mut sts: SmallVec<[Dims; 3]> = smallvec::smallvec![Dims::new(); ins.len()];
        for i in 0..r {
            if out[i] == 1 {
                continue;
            }
            let merge = !dims.is_empty()
                && sts
                    .iter()
                    .zip(&fulls)
                    .all(|(s, f)| s.last() == Some(&(f[i] * out[i])));
            if merge {
                *dims.last_mut().unwrap() *= out[i];
                for (s, f) in sts.iter_mut().zip(&fulls) {
                    *s.last_mut().unwrap() = f[i];
                }
            } else {
                dims.push(out[i]);
                for (s, f) in sts.iter_mut().zip(&fulls) {
                    s.push(f[i]);
                }
            }
        }
        // The last kept dim is the row: each input's stride along it is 0 or 1 (every
        // output dim after it has size 1, so the input's dims there are 1 too).
        let inner = dims.pop().unwrap_or(1);
        let inner_strides = sts.iter_mut().map(|s| s.pop().unwrap_or(0)).collect();
        Ok(Bcast {
            inner,
            outer_dims: dims,
            outer_strides: sts,
            inner_strides,
        })
    }

    /// Offset of row `row`'s first element in input `k`.
    #[inline]
    pub fn row_offset(&self, k: usize, mut row: usize) -> usize {
        let st = &self.outer_strides[k];
        // One outer dim ([N,C,H,W] against [1,C,1,1]: C rows of H·W): no division (a row
        // of a few dozen elements took about as long as its two divisions).
        if let [s] = st.as_slice() {
            return row * s;
        }
        let mut off = 0;
        for i in (0..self.outer_dims.len()).rev() {
            let d = self.outer_dims[i];
            off += (row % d) * st[i];
            row /= d;
        }
        off
    }
}
