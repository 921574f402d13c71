//! Linear-algebra ops lowered onto primitives: Det (ONNX operator spec, opset 11).

use crate::ctx::{Ctx, ONode, R};
use rlx_ir::{BinaryOp, DType, NodeId, Op, ReduceKind, Tensor, TensorData};

/// Largest matrix order Det expands (n! products of n entries each).
const DET_MAX_N: usize = 6;

/// Every permutation of `0..n` with its sign (+1 / -1), in lexicographic order.
fn permutations(n: usize) -> Vec<(Vec<usize>, f64)> {
    fn go(cur: &mut Vec<usize>, used: &mut [bool], out: &mut Vec<(Vec<usize>, f64)>) {
        let n = used.len();
        if cur.len() == n {
            let mut inv = 0;
            for i in 0..n {
                for j in i + 1..n {
                    inv += (cur[i] > cur[j]) as usize;
                }
            }
            out.push((cur.clone(), if inv % 2 == 0 { 1.0 } else { -1.0 }));
            return;
        }
        for v in 0..n {
            if !used[v] {
                used[v] = true;
                cur.push(v);
                go(cur, used, out);
                cur.pop();
                used[v] = false;
            }
        }
    }
    let mut out = Vec::new();
    go(&mut Vec::new(), &mut vec![false; n], &mut out);
    out
}

/// ONNX Det: determinant of the trailing `[n, n]` matrices of `X [..., n, n]`, output
/// `[...]`. Lowered as the Leibniz expansion `sum_sigma sign(sigma) prod_i x[i, sigma(i)]`:
/// a constant-index Gather of the `n!` diagonals, ReduceProd, a signed ReduceSum, computed
/// in f64 (n at most 6).
pub fn det(cx: &mut Ctx, n: &ONode) -> R<Vec<NodeId>> {
    let x = n.inp(0)?;
    let d = cx.dims(x);
    let r = d.len();
    if r < 2 || d[r - 1] != d[r - 2] {
        return Err(format!("X {} must be [..., n, n]", cx.shape(x)));
    }
    let dt = cx.dtype(x);
    if !dt.is_float() {
        return Err(format!("X must be a float tensor, got {dt}"));
    }
    let m = d[r - 1];
    if m > DET_MAX_N {
        return Err(format!(
            "Det of {m}x{m} matrices is not supported (the expansion handles n <= {DET_MAX_N})"
        ));
    }
    let batch = d[..r - 2].to_vec();
    let mut flat = batch.clone();
    flat.push(m * m);
    let xf = cx.reshape(x, flat)?;
    let xf = cx.cast(xf, DType::F64)?;
    let y = if m == 0 {
        let one = cx.scalar(DType::F64, 1.0);
        cx.add(
            Op::Broadcast {
                dims: batch.clone(),
            },
            vec![one],
        )?
    } else {
        let perms = permutations(m);
        let np = perms.len();
        let idx: Vec<i64> = perms
            .iter()
            .flat_map(|(p, _)| p.iter().enumerate().map(move |(i, &j)| (i * m + j) as i64))
            .collect();
        let idx = cx.constant(Tensor::from_i64(&[np, m], idx).map_err(|e| e.to_string())?);
        let ax = batch.len();
        let g = cx.add(Op::Gather { axis: ax }, vec![xf, idx])?;
        let prod = cx.add(
            Op::Reduce {
                kind: ReduceKind::Prod,
                axes: vec![ax + 1],
                keepdims: false,
            },
            vec![g],
        )?;
        let signs: Vec<f64> = perms.iter().map(|(_, s)| *s).collect();
        let signs = cx.constant(
            Tensor::new(vec![np], TensorData::from_f64(DType::F64, &signs))
                .map_err(|e| e.to_string())?,
        );
        let t = cx.binary(BinaryOp::Mul, prod, signs)?;
        cx.add(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![ax],
                keepdims: false,
            },
            vec![t],
        )?
    };
    Ok(vec![cx.cast(y, dt)?])
}

#[cfg(test)]
mod tests {
    use super::permutations;

    #[test]
    fn permutation_signs() {
        let p = permutations(3);
        assert_eq!(p.len(), 6);
        // Hand-derived: identity +1, one swap -1, 3-cycles +1.
        let sign = |v: &[usize]| p.iter().find(|(q, _)| q == v).unwrap().1;
        assert_eq!(sign(&[0, 1, 2]), 1.0);
        assert_eq!(sign(&[1, 0, 2]), -1.0);
        assert_eq!(sign(&[1, 2, 0]), 1.0);
        assert_eq!(sign(&[2, 1, 0]), -1.0);
    }
}
