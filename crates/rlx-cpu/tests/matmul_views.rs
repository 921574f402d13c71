//! A MatMul whose operand is a Transpose used by nothing else reads the Transpose's input in
//! place, through strides (`CpuExecutor::transposes_read_in_place`): attention's `q·kᵀ` as
//! torch exports it. Checked against the f64 definition of `np.matmul` over the transposed
//! operands (computed here by index arithmetic), against the unfused run (Transpose, then
//! MatMul), and the scanner's reports with a NaN in the transposed tensor.

mod common;

use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

/// An operand: an input of `dims`, optionally transposed by `perm`.
struct Arg {
    dims: Vec<usize>,
    perm: Option<Vec<usize>>,
}

fn arg(dims: &[usize], perm: Option<&[usize]>) -> Arg {
    Arg {
        dims: dims.to_vec(),
        perm: perm.map(|p| p.to_vec()),
    }
}

impl Arg {
    fn logical(&self) -> Vec<usize> {
        match &self.perm {
            Some(p) => p.iter().map(|&a| self.dims[a]).collect(),
            None => self.dims.clone(),
        }
    }
    /// Element `idx` (logical index) of the (transposed) operand.
    fn at(&self, data: &[f32], idx: &[usize]) -> f64 {
        let mut src = vec![0; self.dims.len()];
        for (j, &i) in idx.iter().enumerate() {
            src[self.perm.as_ref().map_or(j, |p| p[j])] = i;
        }
        let off = src.iter().zip(&self.dims).fold(0, |o, (&i, &d)| o * d + i);
        data[off] as f64
    }
}

fn data(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + salt) * 7919) % 1013) as f32 / 300.0 - 1.7)
        .collect()
}

/// `np.matmul(A, B)` in f64 for operands of rank >= 2 with broadcast batch dims.
fn reference(a: &Arg, xa: &[f32], b: &Arg, xb: &[f32]) -> (Vec<usize>, Vec<f64>) {
    let (la, lb) = (a.logical(), b.logical());
    let (ra, rb) = (la.len(), lb.len());
    let (m, k, n) = (la[ra - 2], la[ra - 1], lb[rb - 1]);
    let batch = broadcast_dims(&la[..ra - 2], &lb[..rb - 2]).unwrap();
    let nb: usize = batch.iter().product();
    let mut out = vec![];
    for bi in 0..nb {
        let mut bidx = vec![0; batch.len()];
        let mut rem = bi;
        for i in (0..batch.len()).rev() {
            bidx[i] = rem % batch[i];
            rem /= batch[i];
        }
        // Each operand's batch index, right-aligned, 0 on its broadcast (size-1) dims.
        let sub = |l: &[usize]| -> Vec<usize> {
            let nbd = l.len() - 2;
            (0..nbd)
                .map(|i| {
                    let j = batch.len() - nbd + i;
                    if l[i] == 1 {
                        0
                    } else {
                        bidx[j]
                    }
                })
                .collect()
        };
        let (ba, bb) = (sub(&la), sub(&lb));
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for t in 0..k {
                    let ia: Vec<usize> = ba.iter().copied().chain([i, t]).collect();
                    let ib: Vec<usize> = bb.iter().copied().chain([t, j]).collect();
                    s += a.at(xa, &ia) * b.at(xb, &ib);
                }
                out.push(s);
            }
        }
    }
    let mut dims = batch;
    dims.extend([m, n]);
    (dims, out)
}

/// The graph `MatMul(T(a), T(b))`; `extra_use` also makes `T(a)` a graph output.
fn graph(a: &Arg, b: &Arg, extra_use: bool) -> Graph {
    let mut g = Graph::new("mm");
    let mut operand = |name: &str, x: &Arg| {
        let id = g.input(name, Shape::new(&x.dims, DType::F32));
        match &x.perm {
            Some(p) => {
                let t = g.add_node(
                    Op::Transpose { perm: p.clone() },
                    vec![id],
                    Shape::new(&x.logical(), DType::F32),
                );
                g.set_name(t, &format!("{name}.transpose"));
                t
            }
            None => id,
        }
    };
    let ta = operand("a", a);
    let tb = operand("b", b);
    let (dims, _) = reference(
        a,
        &vec![0.0; a.dims.iter().product()],
        b,
        &vec![0.0; b.dims.iter().product()],
    );
    let y = g.matmul(ta, tb, Shape::new(&dims, DType::F32));
    g.set_name(y, "scores");
    g.set_outputs(if extra_use { vec![y, ta] } else { vec![y] });
    g
}

type Reports = Vec<common::Report>;

fn run(
    g: Graph,
    xa: &[f32],
    a: &Arg,
    xb: &[f32],
    b: &Arg,
    fuse: bool,
    mode: DebugMode,
) -> (usize, Reports, Vec<f32>) {
    let mut ex = CpuExecutor::new(g).unwrap();
    let views = ex.transposes_read_in_place();
    ex.set_fusion(fuse);
    let ins = [
        Tensor::from_f32(&a.dims, xa.to_vec()).unwrap(),
        Tensor::from_f32(&b.dims, xb.to_vec()).unwrap(),
    ];
    let (r, y) = common::run_scanned(&mut ex, &ins, mode);
    (views, r, y)
}

fn cases() -> Vec<(Arg, Arg, usize)> {
    vec![
        // Attention as torch exports it: q [B, S, H, D] -> [B, H, S, D], k -> [B, H, D, S].
        (
            arg(&[2, 5, 3, 4], Some(&[0, 2, 1, 3])),
            arg(&[2, 5, 3, 4], Some(&[0, 2, 3, 1])),
            2,
        ),
        // Plain 2-D transposes on either side.
        (arg(&[6, 4], Some(&[1, 0])), arg(&[6, 7], None), 1),
        (arg(&[4, 6], None), arg(&[7, 6], Some(&[1, 0])), 1),
        // A batched a against one transposed b (broadcast), and a batch axis moved last.
        (arg(&[2, 3, 4, 6], None), arg(&[5, 6], Some(&[1, 0])), 1),
        (arg(&[4, 6, 3], Some(&[2, 0, 1])), arg(&[3, 6, 5], None), 1),
        // Both operands transposed, a batch of 1 against a batch of 3.
        (
            arg(&[1, 6, 4], Some(&[0, 2, 1])),
            arg(&[3, 5, 6], Some(&[0, 2, 1])),
            2,
        ),
    ]
}

#[test]
fn matmul_reads_transposed_operands_in_place() {
    for (a, b, want_views) in cases() {
        let xa = data(a.dims.iter().product(), 1);
        let xb = data(b.dims.iter().product(), 2);
        let (_, want) = reference(&a, &xa, &b, &xb);
        let (views, r, got) = run(graph(&a, &b, false), &xa, &a, &xb, &b, true, DebugMode::Off);
        assert_eq!(views, want_views, "{:?} {:?}", a.dims, b.dims);
        assert!(r.is_empty());
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{:?}: {g} vs {w}",
                a.dims
            );
        }
        let (_, _, unfused) = run(
            graph(&a, &b, false),
            &xa,
            &a,
            &xb,
            &b,
            false,
            DebugMode::Off,
        );
        for (g, u) in got.iter().zip(&unfused) {
            assert!(
                (g - u).abs() <= 1e-6 * (1.0 + u.abs()),
                "{:?}: {g} vs {u}",
                a.dims
            );
        }
    }
}

#[test]
fn a_transpose_with_another_use_still_runs() {
    let (a, b, _) = cases().remove(0);
    let xa = data(a.dims.iter().product(), 1);
    let xb = data(b.dims.iter().product(), 2);
    let (views, _, got) = run(graph(&a, &b, true), &xa, &a, &xb, &b, true, DebugMode::Off);
    assert_eq!(views, 1, "only b's Transpose is read in place");
    let (_, want) = reference(&a, &xa, &b, &xb);
    for (g, w) in got.iter().zip(&want) {
        assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()));
    }
}

#[test]
fn a_nan_in_a_transposed_operand_is_reported_as_unfused() {
    let (a, b, _) = cases().remove(0);
    let xa = data(a.dims.iter().product(), 1);
    let mut xb = data(b.dims.iter().product(), 2);
    // k[0, 1, 2, 3]: in the transposed [2, 3, 4, 5] tensor it is element [0, 2, 3, 1].
    let src = (3 + 2) * 4 + 3;
    xb[src] = f32::NAN;
    for mode in [DebugMode::Warn, DebugMode::Strict] {
        let (_, rf, yf) = run(graph(&a, &b, false), &xa, &a, &xb, &b, true, mode);
        let (_, rp, yp) = run(graph(&a, &b, false), &xa, &a, &xb, &b, false, mode);
        // Only the input is named, at the NaN's place in its own layout: the Transpose and
        // the MatMul carried it.
        assert_eq!(rp, vec![(NodeId(2), src, "b".to_string())], "{mode:?}");
        assert_eq!(rf, rp, "{mode:?}");
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&yf), bits(&yp), "{mode:?}");
    }
    // Without a scanner the product reads the NaN in place: the scores that use k[.., 1]
    // in batch 0, head 2 (column 1 of each of its 5 rows) are NaN, and only those.
    let (_, _, y) = run(graph(&a, &b, false), &xa, &a, &xb, &b, true, DebugMode::Off);
    let nan: Vec<usize> = (0..y.len()).filter(|&i| y[i].is_nan()).collect();
    let want: Vec<usize> = (0..5).map(|row| (2 * 5 + row) * 5 + 1).collect();
    assert_eq!(nan, want);
}
