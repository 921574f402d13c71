//! Elementwise chains (`rlx_cpu`'s ewfuse) in float16 and bfloat16: every member computes
//! in f32 and rounds to its dtype where the unfused op rounds (kernels/mod.rs), so the fused
//! output is the unfused one bit for bit, on NaN, ±inf, subnormal and overflowing inputs
//! too; with a scanner, the report names the same op either way.

mod common;

use half::{bf16, f16};
use rlx_cpu::CpuExecutor;
use rlx_ir::numeric_check::DebugMode;
use rlx_ir::*;

const ROWS: usize = 7;
const N: usize = 613; // blocks of whole rows, a row not a multiple of the vector width

/// Inputs with special values: NaN, ±inf, f32/f16/bf16 subnormals, values that overflow
/// f16 on the Cast, values whose Exp overflows, ties of the 16-bit roundings.
fn x_values() -> Vec<f32> {
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,  // f32 subnormal
        -3e-39, // bf16 subnormal
        6e-8,   // f16 subnormal
        -2e-5,  // f16 subnormal
        7e4,    // f16 overflow on the Cast
        -1e5,
        3.3e38, // bf16 overflow on the Cast (rounds to inf)
        1e30,
        88.5,                        // Exp overflows f32
        12.0,                        // Exp overflows f16
        -104.0,                      // Exp underflows
        f32::from_bits(0x3f80_8000), // a bf16 tie
        f32::from_bits(0x3f80_1000), // an f16 tie
        f32::from_bits(0x7fa0_0001), // a signalling NaN
    ];
    (0..ROWS * N)
        .map(|i| {
            if i % 5 == 0 {
                special[(i / 5) % special.len()]
            } else {
                ((i * 7919) % 2003) as f32 / 97.0 - 10.3 + (i % 3) as f32 * 1e-3
            }
        })
        .collect()
}

fn row_values() -> Vec<f32> {
    (0..N)
        .map(|i| match i % 97 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => 1e-41,
            _ => ((i * 31) % 113) as f32 / 17.0 - 3.0,
        })
        .collect()
}

fn den_values() -> Vec<f32> {
    (0..ROWS * N)
        .map(|i| match i % 53 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::INFINITY,
            3 => 1e-39,
            _ => ((i * 17) % 211) as f32 / 23.0 - 4.5,
        })
        .collect()
}

/// `x` (f32) → Cast(dt) → Sigmoid·x → + row → / den → Exp → Neg → − 3 → Silu → · den →
/// Cast(f32) → Sqrt·… → Cast(dt) (the output, in `dt`); `den` and `row` are `dt` inputs.
fn chain_graph(dt: DType) -> (Graph, NodeId) {
    let mut g = Graph::new("half_chain");
    let dims = [ROWS, N];
    let s = Shape::new(&dims, dt);
    let s32 = Shape::new(&dims, DType::F32);
    let x = g.input("x", s32.clone());
    let row = g.input("row", Shape::new(&[N], dt));
    let den = g.input("den", s.clone());
    let xc = g.add_node(
        Op::Cast {
            to: dt,
            saturate: true,
        },
        vec![x],
        s.clone(),
    );
    let sg = g.activation(Activation::Sigmoid, xc, s.clone());
    let sl = g.mul(xc, sg, s.clone());
    let a = g.add(sl, row, s.clone());
    let d = g.div(a, den, s.clone());
    let e = g.unary(UnaryOp::Exp, d, s.clone());
    g.set_name(e, "chain.exp");
    let ng = g.unary(UnaryOp::Neg, e, s.clone());
    let three = g.constant(Tensor::scalar(dt, 3.0));
    let sb = g.sub(ng, three, s.clone());
    let si = g.activation(Activation::Silu, sb, s.clone());
    let m = g.mul(si, den, s.clone());
    let up = g.add_node(
        Op::Cast {
            to: DType::F32,
            saturate: true,
        },
        vec![m],
        s32.clone(),
    );
    let big = g.constant(Tensor::scalar(DType::F32, 1e36));
    let sq = g.mul(up, big, s32.clone());
    let t = g.activation(Activation::Tanh, sq, s32.clone());
    let q = g.add(t, up, s32.clone());
    let y = g.add_node(
        Op::Cast {
            to: dt,
            saturate: true,
        },
        vec![q],
        s.clone(),
    );
    g.set_outputs(vec![y]);
    (g, e)
}

fn inputs(dt: DType) -> Vec<Tensor> {
    let cast = |dims: &[usize], v: Vec<f32>| {
        let t = Tensor::from_f32(dims, v).unwrap();
        Tensor::new(dims.to_vec(), t.data().cast(dt)).unwrap()
    };
    vec![
        Tensor::from_f32(&[ROWS, N], x_values()).unwrap(),
        cast(&[N], row_values()),
        cast(&[ROWS, N], den_values()),
    ]
}

fn out_bits(t: &Tensor) -> Vec<u16> {
    match t.data() {
        TensorData::BF16(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F16(v) => v.iter().map(|x| x.to_bits()).collect(),
        d => panic!("unexpected output {}", d.dtype()),
    }
}

fn run(dt: DType, fuse: bool, scan: bool) -> (usize, Vec<common::Report>, Vec<u16>) {
    let (g, _) = chain_graph(dt);
    let mut ex = CpuExecutor::new(g).unwrap();
    let chains = ex.fused_chains();
    ex.set_fusion(fuse);
    let ins = inputs(dt);
    let mut sc = DebugScanner::new(DebugMode::Warn, "cpu");
    sc.set_print(false);
    let y = ex.run(&ins, scan.then_some(&mut sc)).unwrap();
    let r = sc
        .reports()
        .iter()
        .map(|r| (r.node, r.index, r.label.clone()))
        .collect();
    (chains, r, out_bits(&y[0]))
}

/// NaN positions equal; elsewhere equal bits (two NaN operands may keep either payload,
/// as between the unfused kernels: ewfuse's docs).
fn assert_same(fused: &[u16], plain: &[u16], nan_mask: u16, what: &str) {
    assert_eq!(fused.len(), plain.len());
    let is_nan = |b: u16| b & 0x7fff > nan_mask;
    for (i, (&f, &p)) in fused.iter().zip(plain).enumerate() {
        if is_nan(f) || is_nan(p) {
            assert!(
                is_nan(f) && is_nan(p),
                "{what}: element {i}: {f:#06x} vs {p:#06x}"
            );
        } else {
            assert_eq!(
                f, p,
                "{what}: element {i}: fused {f:#06x}, unfused {p:#06x}"
            );
        }
    }
}

fn check(dt: DType, nan_mask: u16) {
    let (chains, _, fused) = run(dt, true, false);
    assert!(chains >= 1, "{dt}: the chain is fused ({chains} chains)");
    let (_, _, plain) = run(dt, false, false);
    assert_same(&fused, &plain, nan_mask, &format!("{dt}"));
    // Some of every kind of output value.
    let nans = plain.iter().filter(|&&b| b & 0x7fff > nan_mask).count();
    let infs = plain.iter().filter(|&&b| b & 0x7fff == nan_mask).count();
    let subs = plain
        .iter()
        .filter(|&&b| b & 0x7fff != 0 && b & nan_mask == 0)
        .count();
    assert!(
        nans > 0 && infs > 0,
        "{dt}: {nans} NaN, {infs} inf, {subs} subnormal outputs"
    );
    // With a scanner: the same reports (the op that made the first NaN is named), the same
    // output.
    let (_, rf, yf) = run(dt, true, true);
    let (_, ru, yu) = run(dt, false, true);
    assert!(!ru.is_empty(), "{dt}: the NaNs are reported");
    assert_eq!(rf, ru, "{dt}: scanner reports, fused vs unfused");
    assert_same(&yf, &yu, nan_mask, &format!("{dt} scanned"));
    assert_same(&yf, &plain, nan_mask, &format!("{dt} scanned vs plain"));
}

#[test]
fn bf16_chain_fused_matches_unfused_bits() {
    check(DType::BF16, 0x7f80);
}

#[test]
fn f16_chain_fused_matches_unfused_bits() {
    check(DType::F16, 0x7c00);
}

/// The vectorized 16-bit conversions give `half`'s bits on every bfloat16 and float16 and
/// on f32 values around every rounding boundary.
#[test]
fn half_casts_match_half_crate() {
    // Every 16-bit pattern widened, and rounded back.
    for dt in [DType::BF16, DType::F16] {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let t = match dt {
            DType::BF16 => TensorData::BF16(all.iter().map(|&b| bf16::from_bits(b)).collect()),
            _ => TensorData::F16(all.iter().map(|&b| f16::from_bits(b)).collect()),
        };
        let mut g = Graph::new("casts");
        let x = g.input("x", Shape::new(&[all.len()], dt));
        let w = g.add_node(
            Op::Cast {
                to: DType::F32,
                saturate: true,
            },
            vec![x],
            Shape::new(&[all.len()], DType::F32),
        );
        g.set_outputs(vec![w]);
        let mut ex = CpuExecutor::new(g).unwrap();
        let y = ex
            .run(&[Tensor::new(vec![all.len()], t).unwrap()], None)
            .unwrap();
        let got = y[0].as_f32().unwrap();
        for (&b, &v) in all.iter().zip(got) {
            let want = match dt {
                DType::BF16 => bf16::from_bits(b).to_f32(),
                _ => f16::from_bits(b).to_f32(),
            };
            assert_eq!(v.to_bits(), want.to_bits(), "{dt} {b:#06x}");
        }
    }
    // f32 → 16 bits near every bf16 value's boundaries (and a spread of f32 patterns).
    let mut xs: Vec<f32> = vec![];
    for b in (0..=u16::MAX).step_by(7) {
        let base = (b as u32) << 16;
        for d in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
            xs.push(f32::from_bits(base | d));
        }
    }
    for i in 0..200_000u32 {
        xs.push(f32::from_bits(i.wrapping_mul(2_654_435_761)));
    }
    for dt in [DType::BF16, DType::F16] {
        let mut g = Graph::new("casts");
        let x = g.input("x", Shape::new(&[xs.len()], DType::F32));
        let w = g.add_node(
            Op::Cast {
                to: dt,
                saturate: true,
            },
            vec![x],
            Shape::new(&[xs.len()], dt),
        );
        g.set_outputs(vec![w]);
        let mut ex = CpuExecutor::new(g).unwrap();
        let y = ex
            .run(&[Tensor::from_f32(&[xs.len()], xs.clone()).unwrap()], None)
            .unwrap();
        let got = out_bits(&y[0]);
        for (&x, &b) in xs.iter().zip(&got) {
            let want = match dt {
                DType::BF16 => bf16::from_f32(x).to_bits(),
                _ => f16::from_f32(x).to_bits(),
            };
            assert_eq!(b, want, "{dt} of {:#010x}", x.to_bits());
        }
    }
}

/// The 16-bit Unary/Activation kernels compute in f32 (the f32 slice kernels), where they
/// used to evaluate `apply_f32` (f64 inside for Sigmoid, SiLU, Gelu; libm `expf`): on every
/// finite bfloat16 and float16 input, the result is within one 16-bit ulp of that
/// evaluation rounded once, and NaN exactly where it is NaN. Prints how many differ.
#[test]
fn half_maps_within_one_ulp_of_the_scalar_definition() {
    enum M {
        U(UnaryOp),
        A(Activation),
    }
    let ops = [
        ("Exp", M::U(UnaryOp::Exp)),
        ("Sigmoid", M::A(Activation::Sigmoid)),
        ("Silu", M::A(Activation::Silu)),
        ("Tanh", M::A(Activation::Tanh)),
        ("Gelu", M::A(Activation::Gelu)),
    ];
    for dt in [DType::BF16, DType::F16] {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let n = all.len();
        for (name, op) in &ops {
            let mut g = Graph::new("map");
            let s = Shape::new(&[n], dt);
            let x = g.input("x", s.clone());
            let y = match op {
                M::U(u) => g.unary(*u, x, s),
                M::A(a) => g.activation(*a, x, s),
            };
            g.set_outputs(vec![y]);
            let data = match dt {
                DType::BF16 => TensorData::BF16(all.iter().map(|&b| bf16::from_bits(b)).collect()),
                _ => TensorData::F16(all.iter().map(|&b| f16::from_bits(b)).collect()),
            };
            let mut ex = CpuExecutor::new(g).unwrap();
            let got = out_bits(
                &ex.run(&[Tensor::new(vec![n], data).unwrap()], None)
                    .unwrap()[0],
            );
            let mut differ = 0;
            for (&b, &o) in all.iter().zip(&got) {
                let xf = match dt {
                    DType::BF16 => bf16::from_bits(b).to_f32(),
                    _ => f16::from_bits(b).to_f32(),
                };
                let r = match op {
                    M::U(u) => u.apply_f32(xf),
                    M::A(a) => a.apply_f32(xf),
                };
                let want = match dt {
                    DType::BF16 => bf16::from_f32(r).to_bits(),
                    _ => f16::from_f32(r).to_bits(),
                };
                let nan = |v: u16| match dt {
                    DType::BF16 => v & 0x7fff > 0x7f80,
                    _ => v & 0x7fff > 0x7c00,
                };
                if nan(want) || nan(o) {
                    assert!(
                        nan(want) && nan(o),
                        "{dt} {name}({b:#06x}): {o:#06x} vs {want:#06x}"
                    );
                    continue;
                }
                if o != want {
                    differ += 1;
                    // Same sign, adjacent codes (a 16-bit ulp), or ±0.
                    let d = (o as i32 - want as i32).abs();
                    assert!(
                        d <= 1 || (o & 0x7fff == 0 && want & 0x7fff == 0),
                        "{dt} {name}({b:#06x}): {o:#06x} vs {want:#06x}"
                    );
                }
            }
            eprintln!("{dt} {name}: {differ} of {n} inputs one ulp from the scalar evaluation");
        }
    }
}
