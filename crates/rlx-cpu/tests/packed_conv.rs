//! RLX's own conv kernel on packed weights (`rlx_kernels::kernels::conv::packed`) inside the
//! executor: a 1×1 conv on a 7² plane with a bias, a decomposed BatchNorm (folded into the
//! packed group weights), a residual Add and a Relu, against a float64 definition; with
//! the NaN scan the same bits and no report on clean input, and a NaN input reaches the
//! definition's positions and is reported.

mod common;

use common::{packed_on, rnd, run_scanned, sh};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::{Activation, ConvAttrs, Graph, Op, Tensor};

const C: usize = 160;
const M: usize = 96;
const HW: usize = 49;

struct Params {
    w: Vec<f32>,
    b: Vec<f32>,
    scale: Vec<f32>,
    shift: Vec<f32>,
}

fn graph(p: &Params) -> Graph {
    let mut g = Graph::new("packed");
    let x = g.input("x", sh(&[1, C, 7, 7]));
    let r = g.input("r", sh(&[1, M, 7, 7]));
    let out = sh(&[1, M, 7, 7]);
    let w = g.constant(Tensor::from_f32(&[M, C, 1, 1], p.w.clone()).unwrap());
    let b = g.constant(Tensor::from_f32(&[M], p.b.clone()).unwrap());
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![(0, 0), (0, 0)],
        dilations: vec![1, 1],
        groups: 1,
    };
    let y = g.add_node(Op::Conv(a), vec![x, w, b], out.clone());
    let k = g.constant(Tensor::from_f32(&[M, 1, 1], p.scale.clone()).unwrap());
    let s = g.constant(Tensor::from_f32(&[M, 1, 1], p.shift.clone()).unwrap());
    let y = g.mul(y, k, out.clone());
    let y = g.add(y, s, out.clone());
    let y = g.add(y, r, out.clone());
    let y = g.add_node(Op::Activation(Activation::Relu), vec![y], out);
    g.set_outputs(vec![y]);
    g
}

/// The definition in f64, and Σ|terms| per output (for the bound).
fn reference(p: &Params, x: &[f32], r: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0f64; M * HW];
    let mut mag = vec![0f64; M * HW];
    for m in 0..M {
        for j in 0..HW {
            let mut v = p.b[m] as f64;
            let mut a = (p.b[m] as f64).abs();
            for c in 0..C {
                let t = p.w[m * C + c] as f64 * x[c * HW + j] as f64;
                v += t;
                a += t.abs();
            }
            v = v * p.scale[m] as f64 + p.shift[m] as f64 + r[m * HW + j] as f64;
            out[m * HW + j] = if v < 0.0 { 0.0 } else { v };
            mag[m * HW + j] = a * (p.scale[m] as f64).abs() + 2.0;
        }
    }
    (out, mag)
}

#[test]
fn a_packed_group_matches_the_definition_with_and_without_the_scan() {
    let p = Params {
        w: rnd(M * C, 1),
        b: rnd(M, 2),
        scale: rnd(M, 3).iter().map(|v| 0.5 + v.abs()).collect(),
        shift: rnd(M, 4),
    };
    let mut ex = CpuExecutor::new(graph(&p)).unwrap();
    let mut x = rnd(C * HW, 5);
    let r = rnd(M * HW, 6);
    let run = |ex: &mut CpuExecutor, x: &[f32], scan: bool| {
        let t = [
            Tensor::from_f32(&[1, C, 7, 7], x.to_vec()).unwrap(),
            Tensor::from_f32(&[1, M, 7, 7], r.clone()).unwrap(),
        ];
        if scan {
            run_scanned(ex, &t, DebugMode::Warn)
        } else {
            (
                vec![],
                ex.run(&t, None).unwrap()[0].as_f32().unwrap().to_vec(),
            )
        }
    };
    let before = rlx_cpu::packed_conv_runs();
    let (_, plain) = run(&mut ex, &x, false);
    if packed_on() {
        assert!(
            rlx_cpu::packed_conv_runs() > before,
            "the conv took the packed kernel"
        );
    }
    let (want, mag) = reference(&p, &x, &r);
    for (i, (&g, (&w, &a))) in plain.iter().zip(want.iter().zip(&mag)).enumerate() {
        let bound = 4.0 * (C as f64) * f32::EPSILON as f64 * a;
        assert!(
            (g as f64 - w).abs() <= bound,
            "{i}: {g} vs {w} (bound {bound})"
        );
    }
    // The scan: no report, the same bits (the residual then runs as its own Add, in the
    // order the fused epilogue uses: (conv + b) + r).
    let (rep, scanned) = run(&mut ex, &x, true);
    assert!(rep.is_empty(), "{rep:?}");
    assert_eq!(
        plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        scanned.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // A NaN at (channel 7, position 20) reaches every channel at position 20 (Relu keeps
    // it), and the scan reports it.
    x[7 * HW + 20] = f32::NAN;
    let (want, _) = reference(&p, &x, &r);
    for scan in [false, true] {
        let (rep, y) = run(&mut ex, &x, scan);
        for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
            assert_eq!(
                g.is_nan(),
                w.is_nan(),
                "scan {scan}: NaN at {i}: {g} vs {w}"
            );
        }
        assert_eq!(y.iter().filter(|v| v.is_nan()).count(), M);
        if scan {
            assert!(!rep.is_empty(), "the scan reports the NaN");
        }
    }
}
