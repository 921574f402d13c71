//! `Op::GridSample` (ONNX GridSample, any number of spatial dims), following the onnx
//! reference implementation `op_grid_sample.py` (itself PyTorch's `GridSampler.h`):
//! denormalize, clamp/reflect out-of-range coordinates, then nearest / separable linear /
//! separable cubic (Keys, a = -0.75) interpolation whose taps are fetched with the padding
//! rule. Computed in f64, rounded to the output dtype.

use super::{invalid, KResult};
use rlx_ir::{GridMode, GridPadding, Shape, Tensor, TensorData};

fn denorm(n: f64, len: usize, align: bool) -> f64 {
    if align {
        (n + 1.0) / 2.0 * (len as f64 - 1.0)
    } else {
        ((n + 1.0) * len as f64 - 1.0) / 2.0
    }
}

/// Reflect `x` by the nearer border until it lies in `[lo, hi]`.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    let x1 = x + 1.0;
    let x2 = 1.0 - x;
    let x3 = 2.0 - x;
    [
        ((a * x1 - 5.0 * a) * x1 + 8.0 * a) * x1 - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * x2 - (a + 3.0)) * x2 * x2 + 1.0,
        ((a * x3 - 5.0 * a) * x3 + 8.0 * a) * x3 - 4.0 * a,
    ]
}

/// Index along one axis after the padding rule, `None` for a zero (padding = zeros).
fn tap_index(i: i64, len: usize, padding: GridPadding, lo: f64, hi: f64) -> Option<usize> {
    match padding {
        GridPadding::Zeros => (i >= 0 && (i as usize) < len).then_some(i as usize),
        GridPadding::Border => Some(i.clamp(0, len as i64 - 1) as usize),
        GridPadding::Reflection => {
            let r = reflect(i as f64, lo, hi) as i64;
            Some(r.clamp(0, len as i64 - 1) as usize)
        }
    }
}

pub(crate) fn grid_sample(
    x: &Tensor,
    grid: &Tensor,
    mode: GridMode,
    padding: GridPadding,
    align: bool,
    out: &Shape,
) -> KResult<Tensor> {
    let xd = x.dims();
    let gd = grid.dims();
    let nd = xd.len().saturating_sub(2);
    if nd == 0 || gd.len() != nd + 2 || gd[0] != xd[0] || gd[nd + 1] != nd {
        return invalid(format!(
            "GridSample: x {xd:?} and grid {gd:?} must be [N, C, *in] and [N, *out, {nd}]"
        ));
    }
    let (nb, ch) = (xd[0], xd[1]);
    let sp = &xd[2..];
    let in_numel: usize = sp.iter().product();
    let out_pts: usize = gd[1..=nd].iter().product();
    let xv = x.data().to_f64_vec();
    let gv = grid.data().to_f64_vec();
    let (lo, hi): (Vec<f64>, Vec<f64>) = sp
        .iter()
        .map(|&l| {
            if align {
                (0.0, l as f64 - 1.0)
            } else {
                (-0.5, l as f64 - 0.5)
            }
        })
        .unzip();
    let mut y = vec![0.0f64; nb * ch * out_pts];
    // Per-axis taps (index or zero, weight) of one output point.
    let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![Vec::new(); nd];
    for b in 0..nb {
        for p in 0..out_pts {
            let g = &gv[(b * out_pts + p) * nd..(b * out_pts + p + 1) * nd];
            for a in 0..nd {
                // grid component 0 is the last spatial axis.
                let mut c = denorm(g[nd - 1 - a], sp[a], align);
                if mode == GridMode::Nearest {
                    c = c.round_ties_even();
                }
                if c < lo[a] || c > hi[a] {
                    match padding {
                        GridPadding::Border => c = c.clamp(0.0, sp[a] as f64 - 1.0),
                        GridPadding::Reflection => c = reflect(c, lo[a], hi[a]),
                        GridPadding::Zeros => {}
                    }
                }
                let t = &mut taps[a];
                t.clear();
                let tap = |i: i64| tap_index(i, sp[a], padding, lo[a], hi[a]);
                if c.is_nan() {
                    t.push((None, f64::NAN));
                    continue;
                }
                match mode {
                    GridMode::Nearest => t.push((tap(c.trunc() as i64), 1.0)),
                    GridMode::Linear => {
                        let f = c.floor();
                        let w = c - f;
                        t.push((tap(f as i64), 1.0 - w));
                        t.push((tap(f as i64 + 1), w));
                    }
                    GridMode::Cubic => {
                        let f = c.floor();
                        let w = cubic_coeffs(c - f);
                        for (k, wk) in w.iter().enumerate() {
                            t.push((tap(f as i64 - 1 + k as i64), *wk));
                        }
                    }
                }
            }
            // Cartesian product of the taps.
            let counts: Vec<usize> = taps.iter().map(|t| t.len()).collect();
            let total: usize = counts.iter().product();
            for c in 0..ch {
                let base = (b * ch + c) * in_numel;
                let mut acc = 0.0;
                for combo in 0..total {
                    let mut rem = combo;
                    let mut w = 1.0;
                    let mut flat = Some(0usize);
                    for a in (0..nd).rev() {
                        let (idx, wa) = taps[a][rem % counts[a]];
                        rem /= counts[a];
                        w *= wa;
                        flat = match (flat, idx) {
                            (Some(_), None) | (None, _) => None,
                            (Some(f), Some(i)) => {
                                Some(f + i * sp[a + 1..].iter().product::<usize>())
                            }
                        };
                    }
                    let v = match flat {
                        Some(f) => xv[base + f],
                        None => 0.0,
                    };
                    acc += w * v;
                }
                y[(b * ch + c) * out_pts + p] = acc;
            }
        }
    }
    Tensor::new(out.dims_usize(), TensorData::from_f64(out.dtype, &y))
        .map_err(|e| super::super::KernelError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::DType;

    fn run(
        x: (&[usize], Vec<f32>),
        g: (&[usize], Vec<f32>),
        out: &[usize],
        mode: GridMode,
        padding: GridPadding,
    ) -> Vec<f32> {
        let x = Tensor::from_f32(x.0, x.1).unwrap();
        let g = Tensor::from_f32(g.0, g.1).unwrap();
        let s = Shape::new(out, DType::F32);
        let y = grid_sample(&x, &g, mode, padding, false, &s).unwrap();
        y.data().to_f32_vec()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-3 * y.abs() + 1e-4, "{a:?} vs {b:?}");
        }
    }

    // Inputs and expected outputs: onnx 1.23.2 node tests `test_gridsample_bicubic`,
    // `test_gridsample_reflection_padding`, `test_gridsample_volumetric_nearest_align_corners_0`.
    #[test]
    fn suite_cases() {
        let x = || (&[1, 1, 3, 2][..], (0..6).map(|v| v as f32).collect());
        let y = run(
            x(),
            (
                &[1, 2, 4, 2],
                vec![
                    -1.0, -1.0, -0.5, -0.5, -0.2, -0.2, 0.0, 0.0, 0.0, 0.0, -0.2, -0.2, 0.5, 0.5,
                    1.0, 1.0,
                ],
            ),
            &[1, 1, 2, 4],
            GridMode::Cubic,
            GridPadding::Zeros,
        );
        close(
            &y,
            &[
                -0.1406, 0.3828, 1.7556, 2.9688, 2.9688, 1.7556, 5.1445, 1.3906,
            ],
        );
        let y = run(
            x(),
            (
                &[1, 2, 4, 2],
                vec![
                    -10.0, -10.0, -5.0, -5.0, -0.2, -0.2, 10.0, 10.0, 10.0, 10.0, -0.2, -0.2, 5.0,
                    5.0, 10.0, 10.0,
                ],
            ),
            &[1, 1, 2, 4],
            GridMode::Linear,
            GridPadding::Reflection,
        );
        close(&y, &[2.5, 0.0, 1.7, 2.5, 2.5, 1.7, 5.0, 2.5]);
        let y = run(
            (&[1, 1, 3, 2, 2], (1..=12).map(|v| v as f32).collect()),
            (
                &[1, 2, 4, 2, 3],
                vec![
                    -1.0, -1.0, -1.0, -1.0, -0.5, 0.3, -0.5, -0.5, -0.5, 1.0, -0.6, -1.0, -0.2,
                    -0.2, -0.2, 0.4, 0.2, 0.6, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0,
                    1.0, 0.0, -0.2, -0.2, -0.2, 1.0, 0.4, -0.2, 0.5, 0.5, 0.5, -1.0, -0.8, 0.8,
                    1.0, 1.0, 1.0, 0.4, 0.6, -0.3,
                ],
            ),
            &[1, 1, 2, 4, 2],
            GridMode::Nearest,
            GridPadding::Zeros,
        );
        close(
            &y,
            &[
                1.0, 5.0, 1.0, 0.0, 5.0, 12.0, 5.0, 5.0, 5.0, 0.0, 5.0, 0.0, 12.0, 9.0, 0.0, 8.0,
            ],
        );
    }
}
