//! Detection ops whose output shape depends on the data: NonMaxSuppression, evaluated at
//! import time when all its inputs are constants (ONNX operator spec and the onnx reference
//! implementation `op_non_max_suppression.py`).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{NodeId, Tensor};

/// True when `a` and `b` overlap with IoU strictly above `thr` (reference
/// `suppress_by_iou`: an empty intersection or a degenerate box never suppresses).
fn suppress(a: &[f64], b: &[f64], center: bool, thr: f64) -> bool {
    // (x_min, x_max, y_min, y_max)
    let corners = |v: &[f64]| -> (f64, f64, f64, f64) {
        if center {
            let (hw, hh) = (v[2] / 2.0, v[3] / 2.0);
            (v[0] - hw, v[0] + hw, v[1] - hh, v[1] + hh)
        } else {
            (
                v[1].min(v[3]),
                v[1].max(v[3]),
                v[0].min(v[2]),
                v[0].max(v[2]),
            )
        }
    };
    let (ax0, ax1, ay0, ay1) = corners(a);
    let (bx0, bx1, by0, by1) = corners(b);
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    if ix1 <= ix0 {
        return false;
    }
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    if inter <= 0.0 {
        return false;
    }
    let (area_a, area_b) = ((ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0));
    let union = area_a + area_b - inter;
    if area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > thr
}

/// Greedy per-(batch, class) selection: `[num_selected, 3]` rows `(batch, class, box)`.
/// `boxes [B, S, 4]`, `scores [B, C, S]` (row-major f64).
#[allow(clippy::too_many_arguments)]
pub(crate) fn nms(
    boxes: &[f64],
    scores: &[f64],
    (b, c, s): (usize, usize, usize),
    max_out: usize,
    iou: f64,
    score_thr: Option<f64>,
    center: bool,
) -> Vec<i64> {
    let mut out = Vec::new();
    for bi in 0..b {
        let bx = &boxes[bi * s * 4..(bi + 1) * s * 4];
        for ci in 0..c {
            let sc = &scores[(bi * c + ci) * s..(bi * c + ci + 1) * s];
            let mut cand: Vec<usize> = (0..s)
                .filter(|&i| score_thr.is_none_or(|t| sc[i] > t))
                .collect();
            // Highest score first; ties: lower box index first.
            cand.sort_by(|&x, &y| sc[y].total_cmp(&sc[x]).then(x.cmp(&y)));
            let mut sel: Vec<usize> = Vec::new();
            for i in cand {
                if sel.len() >= max_out {
                    break;
                }
                let bi4 = &bx[i * 4..i * 4 + 4];
                if sel
                    .iter()
                    .all(|&j| !suppress(bi4, &bx[j * 4..j * 4 + 4], center, iou))
                {
                    sel.push(i);
                    out.extend_from_slice(&[bi as i64, ci as i64, i as i64]);
                }
            }
        }
    }
    out
}

/// ONNX NonMaxSuppression (opset 10/11). The number of selected boxes depends on the data,
/// so every input must be known at import time; the result is an I64 constant
/// `[num_selected, 3]`.
pub fn non_max_suppression(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let boxes_id = n.inp(0)?;
    let scores_id = n.inp(1)?;
    let bd = cx.dims(boxes_id);
    let sd = cx.dims(scores_id);
    if bd.len() != 3 || bd[2] != 4 || sd.len() != 3 || sd[0] != bd[0] || sd[2] != bd[1] {
        return Err(format!(
            "boxes {} and scores {} must be [B, S, 4] and [B, C, S]",
            cx.shape(boxes_id),
            cx.shape(scores_id)
        ));
    }
    let boxes = cx.const_f64s(
        boxes_id,
        "boxes (NonMaxSuppression's output shape depends on it)",
    )?;
    let scores = cx.const_f64s(
        scores_id,
        "scores (NonMaxSuppression's output shape depends on it)",
    )?;
    let max_out = match n.opt(2) {
        Some(m) => cx
            .const_i64s(m, "max_output_boxes_per_class")?
            .first()
            .copied()
            .unwrap_or(0)
            .max(0) as usize,
        None => 0,
    };
    let iou = match n.opt(3) {
        Some(t) => cx
            .const_f64s(t, "iou_threshold")?
            .first()
            .copied()
            .unwrap_or(0.0),
        None => 0.0,
    };
    let score_thr = match n.opt(4) {
        Some(t) => cx.const_f64s(t, "score_threshold")?.first().copied(),
        None => None,
    };
    let center = match n.i("center_point_box", 0)? {
        0 => false,
        1 => true,
        o => return Err(format!("center_point_box {o} must be 0 or 1")),
    };
    let sel = nms(
        &boxes,
        &scores,
        (bd[0], sd[1], bd[1]),
        max_out,
        iou,
        score_thr,
        center,
    );
    let rows = sel.len() / 3;
    let t = Tensor::from_i64(&[rows, 3], sel).map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// onnx's `test_nonmaxsuppression_suppress_by_IOU` (expected output from the suite).
    #[test]
    fn suppress_by_iou_case() {
        let boxes = [
            0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, -0.1, 1.0, 0.9, 0.0, 10.0, 1.0, 11.0, 0.0,
            10.1, 1.0, 11.1, 0.0, 100.0, 1.0, 101.0,
        ];
        let scores = [0.9, 0.75, 0.6, 0.95, 0.5, 0.3];
        let sel = nms(&boxes, &scores, (1, 1, 6), 3, 0.5, Some(0.0), false);
        assert_eq!(sel, vec![0, 0, 3, 0, 0, 0, 0, 0, 5]);
        // center_point_box format of the same boxes.
        let cboxes = [
            0.5, 0.5, 1.0, 1.0, 0.5, 0.6, 1.0, 1.0, 0.5, 0.4, 1.0, 1.0, 0.5, 10.5, 1.0, 1.0, 0.5,
            10.6, 1.0, 1.0, 0.5, 100.5, 1.0, 1.0,
        ];
        let sel = nms(&cboxes, &scores, (1, 1, 6), 3, 0.5, Some(0.0), true);
        assert_eq!(sel, vec![0, 0, 3, 0, 0, 0, 0, 0, 5]);
    }
}
