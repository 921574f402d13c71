//! CumProd lowered onto Broadcast / Select / Reduce: element `i` of the scan axis is the
//! product over a constant triangular mask `[L, L]` of the axis (`j <= i`, or `<`, `>=`, `>`
//! for `exclusive` / `reverse`). Memory is `L` times the input, so this is meant for the
//! short axes ONNX models use CumProd on.

use crate::ctx::{norm_axis, Ctx, ONode, R};
use rlx_ir::{DType, NodeId, Op, ReduceKind, Tensor, TensorData};

/// ONNX CumProd (opset 26); the axis input must be known at import time.
pub fn cumprod(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let ax = cx.const_i64s(n.inp(1)?, "axis")?;
    let [ax] = ax[..] else {
        return Err("axis must hold one value".into());
    };
    let d = cx.dims(x);
    let axis = norm_axis(ax, d.len())?;
    let exclusive = n.i("exclusive", 0)? != 0;
    let reverse = n.i("reverse", 0)? != 0;
    let l = d[axis];
    // Mask [L(i), L(j), 1, ...]: which j contribute to output i.
    let m: Vec<f64> = (0..l * l)
        .map(|k| {
            let (i, j) = (k / l, k % l);
            let keep = match (reverse, exclusive) {
                (false, false) => j <= i,
                (false, true) => j < i,
                (true, false) => j >= i,
                (true, true) => j > i,
            };
            keep as u8 as f64
        })
        .collect();
    let mut mdims = vec![l, l];
    mdims.extend(std::iter::repeat_n(1, d.len() - axis - 1));
    let mask = cx.constant(
        Tensor::new(mdims, TensorData::from_f64(DType::Bool, &m)).map_err(|e| e.to_string())?,
    );
    let mut xd = d.clone();
    xd.insert(axis, 1);
    let xe = cx.reshape(x, xd.clone())?;
    xd[axis] = l;
    let xe = cx.add(Op::Broadcast { dims: xd }, vec![xe])?;
    let one = cx.scalar(cx.dtype(x), 1.0);
    let sel = cx.add(Op::Select, vec![mask, xe, one])?;
    let y = cx.add(
        Op::Reduce {
            kind: ReduceKind::Prod,
            axes: vec![axis + 1],
            keepdims: false,
        },
        vec![sel],
    )?;
    Ok(vec![y])
}
