//! Signal-processing ops lowered to constants and MatMul: HannWindow, HammingWindow,
//! BlackmanWindow (ONNX opset 17 definitions).

use crate::ctx::{Ctx, ONode, R};
use crate::tensor::{dtype_of, onnx_type_name};
use rlx_ir::{DType, NodeId, Tensor, TensorData};
use std::f64::consts::PI;

/// A window of constant `size` (input 0): `a0 - a1 cos(2πk/N) + a2 cos(4πk/N)`, with
/// `N = size` when `periodic` (default) else `size - 1`.
fn window(cx: &mut Ctx, n: &ONode, a: [f64; 3]) -> R<Vec<NodeId>> {
    let size = cx.const_i64s(n.inp(0)?, "size")?;
    let [size] = size[..] else {
        return Err("size must hold one value".into());
    };
    if !(0..=1 << 24).contains(&size) {
        return Err(format!("size {size} is out of range"));
    }
    let dt = match n.i("output_datatype", 1)? {
        1 => DType::F32,
        t => dtype_of(t as i32).ok_or_else(|| {
            format!(
                "output_datatype {} is not supported",
                onnx_type_name(t as i32)
            )
        })?,
    };
    let periodic = n.i("periodic", 1)? != 0;
    let nn = if periodic { size } else { size - 1 } as f64;
    let v: Vec<f64> = (0..size)
        .map(|k| {
            let t = 2.0 * PI * k as f64 / nn;
            a[0] - a[1] * t.cos() + a[2] * (2.0 * t).cos()
        })
        .collect();
    let t = Tensor::new(vec![size as usize], TensorData::from_f64(dt, &v))
        .map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)])
}

pub fn hann_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [0.5, 0.5, 0.0])
}
pub fn hamming_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [25.0 / 46.0, 21.0 / 46.0, 0.0])
}
pub fn blackman_window(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    window(cx, n, [0.42, 0.5, 0.08])
}
