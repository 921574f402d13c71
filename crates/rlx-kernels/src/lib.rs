//! RLX host kernels: one pure function per op family on host tensors, and [`eval_op`],
//! which dispatches an op to them.
//!
//! This crate sits below `rlx-compile`, the importers and `rlx-cpu`: [`eval_op`] is the
//! constant evaluator of the compiler and importers (folding) and the kernel layer of the CPU
//! executor (`rlx-cpu`, which adds plans, fusion and the per-op NaN scan on top and
//! re-exports [`eval_op`] and [`KernelError`]). Building it pulls in no executor.
//!
//! [`kernels`] and [`buffers`] are public only for `rlx-cpu`'s executor and fusion code
//! (hidden from the docs; not a stable API).

// Their docs link to their crate-private helpers (they were private modules of rlx-cpu).
#![allow(rustdoc::private_intra_doc_links)]

use rlx_ir::{Op, Shape, Tensor};

/// A kernel could not run.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("op {0} is not supported by the CPU backend")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
}

pub mod alloc;
#[doc(hidden)]
pub mod buffers;
#[doc(hidden)]
pub mod kernels;

/// How many images this process has convolved through the direct conv kernel (f32, one
/// group, stride 1 or 2, kernels larger than 1×1, AVX-512; `RLX_CPU_DCONV=0` turns it off):
/// for tests and benchmarks that must know which path a conv took.
pub fn direct_conv_images() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        kernels::conv::dconv::images()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// How many convs this process has run through RLX's own product kernel on packed weights
/// (`kernels::conv::packed`; `RLX_CPU_MK=0` turns it off): for tests that must know which
/// path a conv took.
pub fn packed_conv_runs() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        kernels::conv::packed_runs()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Evaluate `op` on `inputs`, producing a tensor of type `out` (the node's inferred shape).
///
/// Inputs are listed per op in `rlx_ir::Op`'s docs. Numerics: F32 in f32, F64 in f64,
/// F16/BF16 computed in f32 and rounded to the declared dtype; integers with the i64
/// scalar semantics of `rlx_ir` (wrapping). NaN propagates through Relu, Max/Min, MaxPool,
/// Reduce Max/Min (IEEE / ONNX).
///
/// Errors: [`KernelError::Unsupported`] for leaves (Input/Param/Constant have no kernel) and
/// ops without a CPU kernel, [`KernelError::Invalid`] for inputs whose types do not fit the
/// op (an index out of range, wrong arity, dims that do not broadcast, ...). Never panics on
/// bad data.
pub fn eval_op(op: &Op, inputs: &[&Tensor], out: &Shape) -> Result<Tensor, KernelError> {
    use kernels::*;
    // The op's name is formatted only for an error (it is a String; building it per run
    // was a measurable share of small models).
    let name = || op.name();
    let n = |k: usize| arity(op, inputs, k, k);
    let t = match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant(_) => {
            return Err(KernelError::Unsupported(format!(
                "{} (a leaf: its value comes from the graph, not a kernel)",
                name()
            )))
        }
        Op::Unary(u) => {
            n(1)?;
            elementwise::unary(*u, inputs[0], out)?
        }
        Op::Activation(a) => {
            n(1)?;
            elementwise::activation(*a, inputs[0], out)?
        }
        Op::Binary(b) => {
            n(2)?;
            elementwise::binary(*b, inputs[0], inputs[1], out)?
        }
        Op::Select => {
            n(3)?;
            elementwise::select(inputs[0], inputs[1], inputs[2], out)?
        }
        Op::Cast { to, saturate } => {
            n(1)?;
            elementwise::cast(inputs[0], *to, *saturate, out)?
        }
        Op::BitCast { to } => {
            n(1)?;
            elementwise::bitcast(inputs[0], *to)?
        }
        Op::MatMul => {
            n(2)?;
            matmul::matmul(inputs[0], inputs[1], out)?
        }
        Op::Conv(attrs) => {
            arity(op, inputs, 2, 3)?;
            conv::conv(inputs[0], inputs[1], inputs.get(2).copied(), attrs, out)?
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            n(1)?;
            reduce::reduce(inputs[0], *kind, axes, *keepdims)?
        }
        Op::ArgReduce {
            max,
            axis,
            keepdims,
            select_last_index,
        } => {
            n(1)?;
            reduce::argreduce(inputs[0], *max, *axis, *keepdims, *select_last_index)?
        }
        Op::Pool(attrs) => {
            n(1)?;
            pool::pool(inputs[0], attrs, out)?
        }
        Op::CumSum {
            axis,
            exclusive,
            reverse,
        } => {
            n(1)?;
            reduce::cumsum(inputs[0], *axis, *exclusive, *reverse)?
        }
        Op::Reshape { .. } => {
            n(1)?;
            shape::reshape(inputs[0], out)?
        }
        Op::Transpose { perm } => {
            n(1)?;
            shape::transpose(inputs[0], perm)?
        }
        Op::Broadcast { dims } => {
            n(1)?;
            shape::broadcast(inputs[0], dims)?
        }
        Op::Concat { axis } => {
            arity(op, inputs, 1, usize::MAX)?;
            shape::concat(inputs, *axis, out)?
        }
        Op::Slice {
            starts,
            steps,
            sizes,
        } => {
            n(1)?;
            shape::slice(inputs[0], starts, steps, sizes)?
        }
        Op::Pad { pads, mode } => {
            n(1)?;
            shape::pad(inputs[0], pads, *mode)?
        }
        Op::Tile { repeats } => {
            n(1)?;
            shape::tile(inputs[0], repeats)?
        }
        Op::Gather { axis } => {
            n(2)?;
            index::gather(inputs[0], inputs[1], *axis)?
        }
        Op::GatherElements { axis } => {
            n(2)?;
            index::gather_elements(inputs[0], inputs[1], *axis)?
        }
        Op::Trilu { upper, k } => {
            n(1)?;
            index::trilu(inputs[0], *upper, *k)?
        }
        Op::GatherND { batch_dims } => {
            n(2)?;
            scatter::gather_nd(inputs[0], inputs[1], *batch_dims)?
        }
        Op::ScatterElements { axis, reduction } => {
            n(3)?;
            scatter::scatter_elements(inputs[0], inputs[1], inputs[2], *axis, *reduction)?
        }
        Op::ScatterND { reduction } => {
            n(3)?;
            scatter::scatter_nd(inputs[0], inputs[1], inputs[2], *reduction)?
        }
        Op::TopK {
            k,
            axis,
            largest,
            indices,
            ..
        } => {
            n(1)?;
            scatter::topk(inputs[0], *k, *axis, *largest, *indices)?
        }
        Op::GridSample {
            mode,
            padding,
            align_corners,
        } => {
            n(2)?;
            grid::grid_sample(inputs[0], inputs[1], *mode, *padding, *align_corners, out)?
        }
        Op::Softmax { axis } => {
            n(1)?;
            reduce::softmax(inputs[0], *axis, false, out)?
        }
        Op::LogSoftmax { axis } => {
            n(1)?;
            reduce::softmax(inputs[0], *axis, true, out)?
        }
        Op::LayerNorm { axis, epsilon } => {
            arity(op, inputs, 2, 3)?;
            norm::layer_norm(
                inputs[0],
                inputs[1],
                inputs.get(2).copied(),
                *axis,
                *epsilon,
            )?
        }
        Op::BatchNorm { epsilon } => {
            n(5)?;
            norm::batch_norm(inputs, *epsilon)?
        }
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => {
            n(1)?;
            norm::lrn(inputs[0], *size, *alpha, *beta, *bias)?
        }
    };
    check_result(name, &t, out)?;
    Ok(t)
}

/// The kernel's result must match the node's declared type (dims where static, dtype).
#[doc(hidden)]
pub fn check_result(
    name: impl FnOnce() -> String,
    t: &Tensor,
    out: &Shape,
) -> Result<(), KernelError> {
    // Static dims must match; a symbolic dim matches any size (no `Vec` built per run).
    let dims_ok = out.rank() == t.dims().len()
        && out.dims.iter().zip(t.dims()).all(|(d, &n)| match d {
            rlx_ir::Dim::Static(s) => *s == n,
            rlx_ir::Dim::Sym(_) => true,
        });
    if !dims_ok || t.dtype() != out.dtype {
        return Err(KernelError::Invalid(format!(
            "{} computed {} but the node declares {out}",
            name(),
            t.shape()
        )));
    }
    Ok(())
}
