//! CUDA kernels against rlx-cpu (the reference): MatMul on cuBLAS, elementwise math with
//! broadcasting, NaN propagation, CPU fallback, the NaN scanner.
//!
//! (One file over 1,000 lines: it is one test binary, so the device machine runs it as one
//! gzipped file from `.cudabin/`; the ops, cuDNN and half-precision tests already have their
//! own binaries. Split the scanner and CUDA-graph tests out when it grows further.)
mod common;
use common::*;
use rlx_cpu::CpuExecutor;
use rlx_cuda::{CudaExecutor, Placement};
use rlx_ir::numeric_check::{DebugMode, DebugScanner};
use rlx_ir::{Activation, BinaryOp, DType, Graph, Op, ReduceKind, Shape, Tensor, UnaryOp};

fn f32s_shape(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

fn all_on_gpu(ex: &CudaExecutor) {
    for (id, p) in ex.placements() {
        assert_eq!(p, Placement::Gpu, "{id} {}", ex.graph().node(id).op.name());
    }
}

/// Normalized matmul error `max |c - c64| / (|A| |B|)_ij` of `c` against an f64 reference
/// (rlx-cpu on f64 copies of the inputs; `(|A| |B|)` likewise). Any f32 summation order has
/// `|c - c64| <= K u (|A| |B|)` with `u = 2^-24` (the classic dot-product bound, to first
/// order), so a value above `K u` is a kernel bug, not round-off.
fn mm_error(a: &[usize], b: &[usize], o: &[usize], ins: &[Tensor], c: &Tensor) -> f64 {
    let mut g = Graph::new("mm64");
    let x = g.input("a", Shape::new(a, DType::F64));
    let y = g.input("b", Shape::new(b, DType::F64));
    let z = g.matmul(x, y, Shape::new(o, DType::F64));
    g.set_outputs(vec![z]);
    let to64 = |t: &Tensor, abs: bool| {
        let v: Vec<f64> = t
            .data()
            .to_f64_vec()
            .iter()
            .map(|v| if abs { v.abs() } else { *v })
            .collect();
        Tensor::new(t.dims().to_vec(), rlx_ir::TensorData::F64(v)).unwrap()
    };
    let mut ex = CpuExecutor::new(g).unwrap();
    let exact = ex
        .run(&[to64(&ins[0], false), to64(&ins[1], false)], None)
        .unwrap();
    let mag = ex
        .run(&[to64(&ins[0], true), to64(&ins[1], true)], None)
        .unwrap();
    let (e, m) = (exact[0].data().to_f64_vec(), mag[0].data().to_f64_vec());
    let cv = c.data().to_f64_vec();
    assert_eq!(cv.len(), e.len());
    cv.iter()
        .zip(e)
        .zip(m)
        .map(|((c, e), m)| (c - e).abs() / m.max(f64::MIN_POSITIVE))
        .fold(0.0, f64::max)
}

const U: f64 = 1.0 / (1u64 << 24) as f64;

#[test]
fn matmul_shapes() {
    if !cuda_available() {
        return;
    }
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[64, 128], &[128, 96], &[64, 96]),
        (&[3, 37, 45], &[45, 29], &[3, 37, 29]),
        (&[4, 8, 16], &[4, 16, 8], &[4, 8, 8]),
        (&[7, 13], &[2, 3, 13, 5], &[2, 3, 7, 5]),
        (&[2, 1, 5, 6], &[1, 3, 6, 7], &[2, 3, 5, 7]),
        (&[33], &[33, 17], &[17]),
        (&[5, 33], &[33], &[5]),
        (&[2, 5, 33], &[33], &[2, 5]),
        (&[1, 1], &[1, 1], &[1, 1]),
    ];
    for (k, (a, b, o)) in cases.iter().enumerate() {
        let mut g = Graph::new("mm");
        let x = g.input("a", f32s_shape(a));
        let y = g.input("b", f32s_shape(b));
        let z = g.matmul(x, y, f32s_shape(o));
        g.set_outputs(vec![z]);
        let ins = [rand_tensor(a, 10 + k as u64), rand_tensor(b, 20 + k as u64)];
        let ex = CudaExecutor::new(g.clone()).unwrap();
        all_on_gpu(&ex);
        let (want, got) = both(&g, &ins);
        let kk = a[a.len() - 1] as f64;
        let (eg, ec) = (
            mm_error(a, b, o, &ins, &got[0]),
            mm_error(a, b, o, &ins, &want[0]),
        );
        eprintln!(
            "matmul {a:?} x {b:?}: normalized error cuda {eg:.3e}, cpu {ec:.3e}, bound K*u {:.3e}; max_rel cuda vs cpu {:.3e}",
            kk * U,
            max_rel(&got[0], &want[0]).unwrap()
        );
        assert!(
            eg <= kk.max(2.0) * U,
            "matmul {a:?} x {b:?}: {eg:.3e} > K*u"
        );
    }
}

/// Inputs for the unary ops: a small range with zeros, NaN and tiny values (for accuracy),
/// and a large range with the infinities (checked separately: a large output would make
/// the error floor of the small ones meaningless).
fn unary_inputs() -> [Tensor; 2] {
    let mut a = rand_vec(200, 7, -3.0, 3.0);
    a.extend([
        f32::NAN,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1e-30,
        -1e-30,
        1e-8,
        2.5,
        -2.5,
    ]);
    let mut b = rand_vec(50, 8, -30.0, 30.0);
    b.extend([80.0, -80.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    [
        Tensor::from_f32(&[a.len()], a).unwrap(),
        Tensor::from_f32(&[b.len()], b).unwrap(),
    ]
}

#[test]
fn unary_and_activation_ops() {
    if !cuda_available() {
        return;
    }
    use UnaryOp as U;
    let mut ops: Vec<Op> = [
        U::Neg,
        U::Abs,
        U::Exp,
        U::Log,
        U::Sqrt,
        U::Rsqrt,
        U::Reciprocal,
        U::Sin,
        U::Cos,
        U::Tan,
        U::Asin,
        U::Acos,
        U::Atan,
        U::Sinh,
        U::Cosh,
        U::Asinh,
        U::Acosh,
        U::Atanh,
        U::Erf,
        U::Floor,
        U::Ceil,
        U::Round,
        U::Sign,
    ]
    .into_iter()
    .map(Op::Unary)
    .collect();
    use Activation as A;
    ops.extend(
        [
            A::Relu,
            A::LeakyRelu { alpha: 0.01 },
            A::Sigmoid,
            A::Tanh,
            A::Gelu,
            A::GeluTanh,
            A::Silu,
            A::Elu { alpha: 1.0 },
            A::Selu {
                alpha: 1.6732632,
                gamma: 1.050701,
            },
            A::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            A::HardSwish,
            A::Softplus,
            A::Softsign,
        ]
        .into_iter()
        .map(Op::Activation),
    );
    let mut failures = vec![];
    for x in unary_inputs() {
        let n = x.numel();
        for op in &ops {
            let mut g = Graph::new("u");
            let i = g.input("x", f32s_shape(&[n]));
            let y = g.add_node(op.clone(), vec![i], f32s_shape(&[n]));
            g.set_outputs(vec![y]);
            let ex = CudaExecutor::new(g.clone()).unwrap();
            all_on_gpu(&ex);
            let (want, got) = both(&g, std::slice::from_ref(&x));
            match max_rel(&got[0], &want[0]) {
                Ok(r) => {
                    eprintln!("{} ({n} values): max_rel {r:.3e}", op.name());
                    if r > 2e-6 {
                        failures.push(format!("{} ({n} values): max_rel {r:.3e}", op.name()));
                    }
                }
                Err(e) => failures.push(format!("{} ({n} values): {e}", op.name())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn binary_ops_with_broadcasting() {
    if !cuda_available() {
        return;
    }
    use BinaryOp as B;
    let shapes: &[(&[usize], &[usize], &[usize])] = &[
        (&[4, 5], &[4, 5], &[4, 5]),
        (&[3, 1, 5], &[4, 1], &[3, 4, 5]),
        (&[], &[2, 3], &[2, 3]),
        (&[2, 3], &[3], &[2, 3]),
        (&[1, 6, 1], &[2, 1, 7], &[2, 6, 7]),
    ];
    let mut failures = vec![];
    for op in [
        B::Add,
        B::Sub,
        B::Mul,
        B::Div,
        B::Pow,
        B::Max,
        B::Min,
        B::Rem,
        B::Mod,
    ] {
        for (k, (a, b, o)) in shapes.iter().enumerate() {
            let mut g = Graph::new("b");
            let x = g.input("a", f32s_shape(a));
            let y = g.input("b", f32s_shape(b));
            let z = g.binary(op, x, y, f32s_shape(o));
            g.set_outputs(vec![z]);
            let mut ta = rand_tensor(a, 100 + k as u64);
            let tb = rand_tensor(b, 200 + k as u64);
            if let rlx_ir::TensorData::F32(v) = ta.data_mut() {
                // NaN, infinities and zeros in the first operand.
                let sp = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
                for (j, s) in sp.iter().enumerate() {
                    if j < v.len() && v.len() > 3 {
                        v[j] = *s;
                    }
                }
            }
            let ex = CudaExecutor::new(g.clone()).unwrap();
            all_on_gpu(&ex);
            let (want, got) = both(&g, &[ta, tb]);
            match max_rel(&got[0], &want[0]) {
                Ok(r) => {
                    eprintln!("{op:?} {a:?} {b:?}: max_rel {r:.3e}");
                    if r > 2e-6 {
                        failures.push(format!("{op:?} {a:?} {b:?}: max_rel {r:.3e}"));
                    }
                }
                Err(e) => failures.push(format!("{op:?} {a:?} {b:?}: {e}")),
            }
        }
    }
    // Pow by a scalar 2 and 3 (the CPU's x*x and x*x*x paths).
    for e in [2.0f32, 3.0, 0.5] {
        let mut g = Graph::new("p");
        let x = g.input("a", f32s_shape(&[300]));
        let c = g.constant(Tensor::from_f32(&[], vec![e]).unwrap());
        let z = g.binary(B::Pow, x, c, f32s_shape(&[300]));
        g.set_outputs(vec![z]);
        let (want, got) = both(&g, &[rand_tensor(&[300], 5)]);
        match max_rel(&got[0], &want[0]) {
            Ok(r) if r <= 2e-6 => eprintln!("Pow x^{e}: max_rel {r:.3e}"),
            Ok(r) => failures.push(format!("Pow x^{e}: max_rel {r:.3e}")),
            Err(er) => failures.push(format!("Pow x^{e}: {er}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn nan_propagates_through_relu_max_min_bit_for_bit() {
    if !cuda_available() {
        return;
    }
    let v = vec![
        f32::NAN,
        1.0,
        -1.0,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        2.0,
    ];
    let w = vec![1.0, f32::NAN, f32::NAN, -0.0, 0.0, 3.0, f32::NAN, f32::NAN];
    let mut g = Graph::new("nan");
    let x = g.input("x", f32s_shape(&[8]));
    let y = g.input("y", f32s_shape(&[8]));
    let r = g.activation(Activation::Relu, x, f32s_shape(&[8]));
    let mx = g.binary(BinaryOp::Max, x, y, f32s_shape(&[8]));
    let mn = g.binary(BinaryOp::Min, y, x, f32s_shape(&[8]));
    g.set_outputs(vec![r, mx, mn]);
    let ins = [
        Tensor::from_f32(&[8], v).unwrap(),
        Tensor::from_f32(&[8], w).unwrap(),
    ];
    let (want, got) = both(&g, &ins);
    for k in 0..3 {
        let (a, b) = (f32s(&got[k]), f32s(&want[k]));
        for i in 0..8 {
            assert!(
                (a[i].is_nan() && b[i].is_nan()) || a[i] == b[i],
                "output {k} element {i}: cuda {} cpu {}",
                a[i],
                b[i]
            );
        }
    }
    let relu = f32s(&got[0]);
    assert!(relu[0].is_nan(), "Relu(NaN) must stay NaN");
    let mx = f32s(&got[1]);
    assert!(mx[0].is_nan() && mx[1].is_nan() && mx[6].is_nan());
}

/// A graph mixing GPU nodes, CPU fallbacks (Softmax, Reduce, a Bool comparison, Select,
/// Transpose), a Param, a Constant and a Reshape alias.
fn mixed_graph() -> Graph {
    let mut g = Graph::new("mixed");
    let x = g.input("x", f32s_shape(&[2, 8, 16]));
    let w = g.param("w", f32s_shape(&[16, 12]));
    let bias = g.constant(Tensor::from_f32(&[12], rand_vec(12, 3, -1.0, 1.0)).unwrap());
    let h = g.matmul(x, w, f32s_shape(&[2, 8, 12]));
    let h = g.add(h, bias, f32s_shape(&[2, 8, 12]));
    let h = g.activation(Activation::Gelu, h, f32s_shape(&[2, 8, 12]));
    let s = g.softmax(h, 2, f32s_shape(&[2, 8, 12]));
    let t = g.add_node(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        vec![s],
        f32s_shape(&[2, 12, 8]),
    );
    let r = g.add_node(
        Op::Reshape { dims: vec![2, 96] },
        vec![t],
        f32s_shape(&[2, 96]),
    );
    let e = g.unary(UnaryOp::Exp, r, f32s_shape(&[2, 96]));
    let m = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![1],
            keepdims: true,
        },
        vec![e],
        f32s_shape(&[2, 1]),
    );
    let c = g.binary(BinaryOp::Lt, e, m, Shape::new(&[2, 96], DType::Bool));
    let sel = g.add_node(Op::Select, vec![c, e, m], f32s_shape(&[2, 96]));
    let out = g.mul(sel, e, f32s_shape(&[2, 96]));
    g.set_outputs(vec![out, h]);
    g
}

#[test]
fn cpu_fallback_and_params() {
    if !cuda_available() {
        return;
    }
    let g = mixed_graph();
    let wv = Tensor::from_f32(&[16, 12], rand_vec(192, 9, -0.5, 0.5)).unwrap();
    let x = rand_tensor(&[2, 8, 16], 4);
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    let mut gpu_ops = vec![];
    let mut cpu_ops = vec![];
    for (id, p) in ex.placements() {
        let name = g.node(id).op.name();
        match p {
            Placement::Gpu => gpu_ops.push(name),
            Placement::CpuFallback { reason } => {
                eprintln!("{id} {name}: cpu ({reason})");
                cpu_ops.push(name)
            }
        }
    }
    eprintln!("gpu: {gpu_ops:?}; cpu: {cpu_ops:?}");
    for want in ["MatMul", "Gelu", "Exp", "Mul"] {
        assert!(
            gpu_ops.iter().any(|n| n.contains(want)),
            "{want} not on the GPU: {gpu_ops:?}"
        );
    }
    assert!(cpu_ops.iter().any(|n| n.contains("Softmax")), "{cpu_ops:?}");
    // An unset param is an error, then set it.
    assert!(matches!(
        ex.run(std::slice::from_ref(&x), None),
        Err(rlx_cuda::CudaError::Param(_))
    ));
    assert!(ex.set_param("nope", wv.clone()).is_err());
    ex.set_param("w", wv.clone()).unwrap();
    let got = ex.run(std::slice::from_ref(&x), None).unwrap();
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    c.set_param("w", wv).unwrap();
    let want = c.run(std::slice::from_ref(&x), None).unwrap();
    assert_close("mixed out", &got[0], &want[0], 1e-5);
    assert_close("mixed h", &got[1], &want[1], 1e-5);
    // Twice: buffers are reused.
    let again = ex.run(std::slice::from_ref(&x), None).unwrap();
    assert_eq!(f32s(&again[0]), f32s(&got[0]));
    // Every node's value, for divergence replay.
    let all = ex.run_all(&[x]).unwrap();
    assert_eq!(all.len(), g.len());
    assert!(all.iter().all(|v| v.is_some()));
    // Wrong input count / dims are Input errors.
    assert!(matches!(
        ex.run(&[rand_tensor(&[2, 8, 15], 1)], None),
        Err(rlx_cuda::CudaError::Input(_))
    ));
}

#[test]
fn scanner_finds_the_nan_at_the_log() {
    if !cuda_available() {
        return;
    }
    // y = exp(log(x) * 2) + 1: log of the negative element makes the NaN.
    let mut g = Graph::new("nanlog");
    let x = g.input("x", f32s_shape(&[4, 8]));
    let two = g.constant(Tensor::from_f32(&[], vec![2.0]).unwrap());
    let one = g.constant(Tensor::from_f32(&[1, 8], vec![1.0; 8]).unwrap());
    let l = g.unary(UnaryOp::Log, x, f32s_shape(&[4, 8]));
    g.set_name(l, "the_log");
    let m = g.mul(l, two, f32s_shape(&[4, 8]));
    let e = g.unary(UnaryOp::Exp, m, f32s_shape(&[4, 8]));
    let y = g.add(e, one, f32s_shape(&[4, 8]));
    g.set_outputs(vec![y]);
    let mut v = rand_vec(32, 11, 0.1, 2.0);
    v[13] = -0.5;
    let xt = Tensor::from_f32(&[4, 8], v).unwrap();

    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    all_on_gpu(&ex);
    let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
    let out = ex.run(std::slice::from_ref(&xt), Some(&mut sc)).unwrap();
    assert!(f32s(&out[0])[13].is_nan());
    let reports = sc.reports().to_vec();
    assert!(!reports.is_empty(), "no NaN report");
    assert_eq!(reports[0].node, l, "first report: {:?}", reports[0]);
    assert_eq!(reports[0].index, 13);
    eprintln!(
        "cuda scanner: {} at {} ({})",
        reports[0].op, reports[0].node, reports[0].label
    );

    // The same report as the CPU backend's.
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let mut sc2 = DebugScanner::new(DebugMode::Warn, "cpu");
    c.run(std::slice::from_ref(&xt), Some(&mut sc2)).unwrap();
    assert_eq!(sc2.reports()[0].node, reports[0].node);
    assert_eq!(sc2.reports()[0].cause, reports[0].cause);

    // Abort mode stops with NanAbort.
    let mut sc3 = DebugScanner::new(DebugMode::Abort, "cuda");
    sc3.set_print(false);
    match ex.run(&[xt], Some(&mut sc3)) {
        Err(rlx_cuda::CudaError::NanAbort(a)) => assert_eq!(a.report.node, l),
        other => panic!("expected NanAbort, got {:?}", other.map(|_| ())),
    }
}

/// The device-side scan's counts (NaN, ±inf and first positions) equal the host's count of
/// the same values for every node: odd lengths (the scalar tail after 16-byte groups), a
/// buffer larger than 4096 blocks of 32768 (the grid-stride loop), values that are all NaN,
/// all clean, a NaN only in the last element, and a CPU-fallback node between GPU nodes.
#[test]
fn device_scan_counts_equal_host_counts() {
    if !cuda_available() {
        return;
    }
    use rlx_ir::numeric_check::scan_data;
    for &n in &[1usize, 3, 4, 5, 4099, 32768 * 4096 + 4 * 1000 + 3] {
        let mut g = Graph::new("scan");
        let s = f32s_shape(&[n]);
        let x = g.input("x", s.clone());
        let l = g.unary(UnaryOp::Log, x, s.clone()); // NaN at negatives, -inf at zeros
        let r = g.unary(UnaryOp::Reciprocal, x, s.clone()); // ±inf at ±0
        let a = g.add(l, r, s.clone());
        let q = g.unary(UnaryOp::Sqrt, a, s.clone());
        let nn = g.unary(UnaryOp::Neg, q, s.clone());
        g.set_outputs(vec![nn, r]);
        let mut v = rand_vec(n, n as u64, -2.0, 2.0);
        for i in (0..n).step_by(5) {
            v[i] = 0.0;
        }
        for i in (0..n).step_by(11) {
            v[i] = -0.0;
        }
        v[n - 1] = f32::NAN;
        let xt = Tensor::from_f32(&[n], v).unwrap();
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        all_on_gpu(&ex);
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        ex.run(std::slice::from_ref(&xt), Some(&mut sc)).unwrap();
        let vals = ex.run_all(std::slice::from_ref(&xt)).unwrap();
        for node in &g.nodes {
            let want = scan_data(vals[node.id.index()].as_ref().unwrap().data());
            assert_eq!(
                sc.counts()[node.id.index()],
                want,
                "n={n}: counts of {} {}",
                node.id,
                node.op.name()
            );
        }
        // All clean: no report, zero counts.
        let clean = Tensor::from_f32(&[n], rand_vec(n, 7, 0.5, 2.0)).unwrap();
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        ex.run(&[clean], Some(&mut sc)).unwrap();
        assert!(sc.reports().is_empty(), "n={n}: {:?}", sc.reports());
        assert!(sc.counts().iter().all(|c| c.is_clean() && c.len == n));
        // All NaN.
        let nan = Tensor::from_f32(&[n], vec![f32::NAN; n]).unwrap();
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        ex.run(&[nan], Some(&mut sc)).unwrap();
        for node in &g.nodes {
            let c = sc.counts()[node.id.index()];
            assert_eq!((c.nan, c.first_nan), (n, Some(0)), "n={n}: {}", node.id);
        }
    }
    // A CPU-fallback node (an undecomposed Softmax) between GPU nodes: counted on the host;
    // the counts and the reports equal the CPU backend's.
    let mut g = Graph::new("scan_mixed");
    let s = f32s_shape(&[7]);
    let x = g.input("x", s.clone());
    let y = g.input("y", s.clone());
    let d = g.div(x, y, s.clone());
    let sm = g.softmax(d, 0, s.clone());
    let e = g.unary(UnaryOp::Exp, sm, s.clone());
    g.set_outputs(vec![e]);
    let xt = Tensor::from_f32(&[7], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
    let yt = Tensor::from_f32(&[7], vec![1.0, 0.0, 2.0, 0.0, 3.0, 1.0, 1.0]).unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    assert!(matches!(
        ex.placements()
            .into_iter()
            .find(|(i, _)| *i == sm)
            .unwrap()
            .1,
        Placement::CpuFallback { .. }
    ));
    let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
    sc.set_print(false);
    ex.run(&[xt.clone(), yt.clone()], Some(&mut sc)).unwrap();
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let mut sc2 = DebugScanner::new(DebugMode::Warn, "cpu");
    sc2.set_print(false);
    c.run(&[xt, yt], Some(&mut sc2)).unwrap();
    assert_eq!(sc.counts(), sc2.counts());
    assert!(!sc.reports().is_empty());
    let nodes = |r: &[rlx_ir::numeric_check::NanReport]| -> Vec<_> {
        r.iter()
            .map(|r| (r.node, r.cause.clone(), r.index))
            .collect()
    };
    assert_eq!(nodes(sc.reports()), nodes(sc2.reports()));
}

/// Launch-blocking mode (the printer's level 3): `before` names every computing node in
/// order, and the values equal a plain run's.
#[test]
fn launch_blocking_run_names_each_node_before_it_runs() {
    if !cuda_available() {
        return;
    }
    let g = mixed_graph();
    let wv = Tensor::from_f32(&[16, 12], rand_vec(192, 9, -0.5, 0.5)).unwrap();
    let x = rand_tensor(&[2, 8, 16], 4);
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    ex.set_param("w", wv).unwrap();
    let plain = ex.run_all(std::slice::from_ref(&x)).unwrap();
    let mut seen = vec![];
    let hooked = ex
        .run_all_hooked(std::slice::from_ref(&x), &mut |id| seen.push(id))
        .unwrap();
    let want: Vec<_> = g
        .nodes
        .iter()
        .filter(|n| !n.op.is_leaf())
        .map(|n| n.id)
        .collect();
    assert_eq!(seen, want);
    for (a, b) in plain.iter().zip(&hooked) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!(a.shape(), b.shape());
        assert_eq!(format!("{:?}", a.data()), format!("{:?}", b.data()));
    }
}

/// Fused elementwise kernels give the unfused kernels' bits (same float operations in the
/// same order), with broadcast inputs, NaN/±inf in the data, and a CPU-fallback node and a
/// MatMul between groups; `RLX_CUDA_FUSE=0` turns fusion off with the same values.
#[test]
fn fused_elementwise_groups_are_bit_identical_to_unfused() {
    if !cuda_available() {
        return;
    }
    let (b, t, h) = (3, 5, 33);
    let s3 = f32s_shape(&[b, t, h]);
    let mut g = Graph::new("fused");
    let x = g.input("x", s3.clone());
    let gamma = g.input("gamma", f32s_shape(&[h]));
    let w = g.input("w", f32s_shape(&[h, h]));
    // A LayerNorm-like tail and an erf-GELU: Sub, Mul, Div, Erf, Add, Mul chains.
    let mean = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![2],
            keepdims: true,
        },
        vec![x],
        f32s_shape(&[b, t, 1]),
    );
    let c = g.binary(BinaryOp::Sub, x, mean, s3.clone());
    let sq = g.mul(c, c, s3.clone());
    let scaled = g.mul(sq, gamma, s3.clone());
    let y = g.matmul(scaled, w, s3.clone());
    let two = g.constant(Tensor::from_f32(&[], vec![std::f32::consts::SQRT_2]).unwrap());
    let half = g.constant(Tensor::from_f32(&[], vec![0.5]).unwrap());
    let one = g.constant(Tensor::from_f32(&[], vec![1.0]).unwrap());
    let d = g.div(y, two, s3.clone());
    let e = g.unary(UnaryOp::Erf, d, s3.clone());
    let a = g.add(e, one, s3.clone());
    let m = g.mul(y, a, s3.clone());
    let gl = g.mul(m, half, s3.clone());
    let sm = g.softmax(gl, 2, s3.clone()); // CPU fallback between groups
    let l = g.unary(UnaryOp::Log, sm, s3.clone());
    let out = g.activation(Activation::Tanh, l, s3.clone());
    g.set_outputs(vec![out, gl]);
    let mut xv = rand_vec(b * t * h, 5, -3.0, 3.0);
    xv[7] = f32::NAN;
    xv[40] = f32::INFINITY;
    let ins = [
        Tensor::from_f32(&[b, t, h], xv).unwrap(),
        rand_tensor(&[h], 6),
        rand_tensor(&[h, h], 7),
    ];
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    assert!(ex.fused_groups() >= 2, "{} groups", ex.fused_groups());
    let fused = ex.run(&ins, None).unwrap();
    let all = ex.run_all(&ins).unwrap();
    std::env::set_var("RLX_CUDA_FUSE", "0");
    let mut plain = CudaExecutor::new(g.clone()).unwrap();
    std::env::remove_var("RLX_CUDA_FUSE");
    assert_eq!(plain.fused_groups(), 0);
    let unfused = plain.run(&ins, None).unwrap();
    for (k, o) in g.outputs.iter().enumerate() {
        let bits = |t: &Tensor| -> Vec<u32> { f32s(t).iter().map(|x| x.to_bits()).collect() };
        assert_eq!(
            bits(&fused[k]),
            bits(all[o.index()].as_ref().unwrap()),
            "output {k}"
        );
        assert_eq!(bits(&fused[k]), bits(&unfused[k]), "output {k}");
    }
    // A scanning run stays fused, counting the members inside the fused kernels: the same
    // counts and reports as the unfused executor's scan and as the CPU's.
    let scan = |ex: &mut CudaExecutor| {
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        ex.run(&ins, Some(&mut sc)).unwrap();
        sc
    };
    let (s1, s2) = (scan(&mut ex), scan(&mut plain));
    assert_eq!(s1.counts(), s2.counts());
    assert!(s1.counts().iter().any(|c| c.nan > 0));
    let mut cs = DebugScanner::new(DebugMode::Warn, "cpu");
    cs.set_print(false);
    CpuExecutor::new(g.clone())
        .unwrap()
        .run(&ins, Some(&mut cs))
        .unwrap();
    let key = |r: &[rlx_ir::numeric_check::NanReport]| -> Vec<_> {
        r.iter()
            .map(|r| (r.node, r.cause.clone(), r.index))
            .collect()
    };
    assert_eq!(key(s1.reports()), key(cs.reports()));
    // And the CPU agrees within round-off.
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(&ins, None).unwrap();
    for k in 0..2 {
        let e = max_rel(&fused[k], &want[k]).unwrap();
        assert!(e < 1e-4, "output {k}: {e:.3e}");
    }
}

/// Ordinary runs of a graph without CPU steps are captured as a CUDA graph at their second run
/// and replayed after: every run's outputs equal a graph-less executor's on new inputs, a
/// scanning run in between still scans, and a Gather index out of range is still an error
/// naming the node in a replayed run.
#[test]
fn cuda_graph_replay_matches_ordinary_runs() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("graph_replay");
    let x = g.input("x", f32s_shape(&[6, 16]));
    let ids = g.input("ids", Shape::new(&[3], DType::I64));
    let w = g.param("w", f32s_shape(&[16, 8]));
    let h = g.matmul(x, w, f32s_shape(&[6, 8]));
    let e = g.unary(UnaryOp::Exp, h, f32s_shape(&[6, 8]));
    let t = g.activation(Activation::Tanh, e, f32s_shape(&[6, 8]));
    let s = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: true,
        },
        vec![t],
        f32s_shape(&[6, 1]),
    );
    let q = g.div(t, s, f32s_shape(&[6, 8]));
    let gth = g.add_node(Op::Gather { axis: 0 }, vec![q, ids], f32s_shape(&[3, 8]));
    g.set_outputs(vec![gth, s]);
    let wv = rand_tensor(&[16, 8], 3);
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    ex.set_param("w", wv.clone()).unwrap();
    std::env::set_var("RLX_CUDA_GRAPH", "0");
    let mut plain = CudaExecutor::new(g.clone()).unwrap();
    std::env::remove_var("RLX_CUDA_GRAPH");
    plain.set_param("w", wv).unwrap();
    for r in 0..5u64 {
        let ins = [
            rand_tensor(&[6, 16], 10 + r),
            Tensor::new(
                vec![3],
                rlx_ir::TensorData::I64(vec![(r % 6) as i64, 5, -1]),
            )
            .unwrap(),
        ];
        let got = ex.run(&ins, None).unwrap();
        let want = plain.run(&ins, None).unwrap();
        for k in 0..2 {
            let bits = |t: &Tensor| -> Vec<u32> { f32s(t).iter().map(|x| x.to_bits()).collect() };
            assert_eq!(bits(&got[k]), bits(&want[k]), "run {r} output {k}");
        }
        assert_eq!(ex.uses_cuda_graph(), r >= 1, "run {r}");
        assert!(!plain.uses_cuda_graph());
        if r == 2 {
            let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
            sc.set_print(false);
            ex.run(&ins, Some(&mut sc)).unwrap();
            assert!(sc.counts().iter().all(|c| c.is_clean()));
        }
    }
    let bad = [
        rand_tensor(&[6, 16], 99),
        Tensor::new(vec![3], rlx_ir::TensorData::I64(vec![0, 6, 1])).unwrap(),
    ];
    let err = ex.run(&bad, None).unwrap_err().to_string();
    assert!(err.contains("Gather") && err.contains("index 6"), "{err}");
    // And it recovers.
    let ok = [
        rand_tensor(&[6, 16], 98),
        Tensor::new(vec![3], rlx_ir::TensorData::I64(vec![0, 1, 2])).unwrap(),
    ];
    assert_eq!(
        f32s(&ex.run(&ok, None).unwrap()[0]),
        f32s(&plain.run(&ok, None).unwrap()[0])
    );
}

/// Scanning runs replay their own CUDA graph from the second on: the counts of every node
/// (NaN from Log of the negative inputs, +inf from Exp overflow, inside fused groups and
/// not) match a graph-less executor's and the input's own count, run after run, with the
/// bad values at different places each run (a stale replay would repeat the old counts).
#[test]
fn scanning_runs_replay_a_cuda_graph_with_fresh_counts() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("scan_replay");
    let x = g.input("x", f32s_shape(&[64, 33]));
    let w = g.param("w", f32s_shape(&[33, 33]));
    let l = g.unary(UnaryOp::Log, x, f32s_shape(&[64, 33]));
    let e = g.unary(UnaryOp::Exp, x, f32s_shape(&[64, 33]));
    let t = g.activation(Activation::Tanh, l, f32s_shape(&[64, 33]));
    let s = g.add(t, e, f32s_shape(&[64, 33]));
    let m = g.matmul(s, w, f32s_shape(&[64, 33]));
    g.set_outputs(vec![m]);
    let wv = rand_tensor(&[33, 33], 5);
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    ex.set_param("w", wv.clone()).unwrap();
    std::env::set_var("RLX_CUDA_GRAPH", "0");
    let mut plain = CudaExecutor::new(g.clone()).unwrap();
    std::env::remove_var("RLX_CUDA_GRAPH");
    plain.set_param("w", wv).unwrap();
    for r in 0..6usize {
        let mut v = f32s(&rand_tensor(&[64, 33], 40 + r as u64));
        for x in v.iter_mut() {
            *x = x.abs() + 0.5;
        }
        // r + 1 negatives (Log gives NaN) and r overflowing values (Exp gives +inf).
        let negs: Vec<usize> = (0..=r).map(|k| (k * 97 + r * 13) % v.len()).collect();
        for &i in &negs {
            v[i] = -1.0;
        }
        let n = v.len();
        for k in 0..r {
            v[(k * 31 + 7 + r) % n] = 200.0;
        }
        let expect_nan = v.iter().filter(|&&x| x < 0.0).count();
        let expect_inf = v.iter().filter(|&&x| x > 100.0).count();
        let ins = [Tensor::from_f32(&[64, 33], v).unwrap()];
        let mut a = DebugScanner::new(DebugMode::Warn, "cuda");
        a.set_print(false);
        let mut b = DebugScanner::new(DebugMode::Warn, "cuda");
        b.set_print(false);
        let got = ex.run(&ins, Some(&mut a)).unwrap();
        let want = plain.run(&ins, Some(&mut b)).unwrap();
        assert_eq!(
            a.counts(),
            b.counts(),
            "run {r}: counts differ from the graph-less run"
        );
        assert_eq!(
            a.counts()[l.index()].nan,
            expect_nan,
            "run {r}: Log's NaN count"
        );
        assert_eq!(
            a.counts()[e.index()].pos_inf,
            expect_inf,
            "run {r}: Exp's +inf count"
        );
        let bits = |t: &Tensor| -> Vec<u32> { f32s(t).iter().map(|x| x.to_bits()).collect() };
        assert_eq!(bits(&got[0]), bits(&want[0]), "run {r}");
        assert_eq!(ex.scan_uses_cuda_graph(), r >= 1, "run {r}");
        assert!(!ex.uses_cuda_graph(), "ordinary runs have their own graph");
    }
}

#[test]
fn non_f32_nodes_fall_back_with_a_reason() {
    if !cuda_available() {
        return;
    }
    let mut g = Graph::new("f64");
    let x = g.input("x", Shape::new(&[6], DType::F64));
    let y = g.unary(UnaryOp::Exp, x, Shape::new(&[6], DType::F64));
    let xi = g.input("i", Shape::new(&[6], DType::I64));
    let z = g.binary(BinaryOp::Add, xi, xi, Shape::new(&[6], DType::I64));
    g.set_outputs(vec![y, z]);
    let ex = CudaExecutor::new(g.clone()).unwrap();
    for (id, p) in ex.placements() {
        match p {
            Placement::CpuFallback { reason } => {
                assert!(reason.contains("not f32"), "{id}: {reason}")
            }
            Placement::Gpu => panic!("{id} on the GPU"),
        }
    }
    let xs = Tensor::new(
        vec![6],
        rlx_ir::TensorData::F64(vec![0.0, 1.0, -1.0, 2.0, 3.0, 0.5]),
    )
    .unwrap();
    let is = Tensor::new(vec![6], rlx_ir::TensorData::I64(vec![1, 2, 3, 4, 5, 6])).unwrap();
    let (want, got) = both(&g, &[xs, is]);
    assert_eq!(got[0].data().to_f64_vec(), want[0].data().to_f64_vec());
    assert_eq!(got[1].data().to_i64_vec(), want[1].data().to_i64_vec());
}

#[test]
fn large_matmul_full_f32_by_default_and_tf32_on_request() {
    if !cuda_available() {
        return;
    }
    let (m, k, n) = (512, 2048, 384);
    let mut g = Graph::new("big");
    let x = g.input("a", f32s_shape(&[m, k]));
    let y = g.input("b", f32s_shape(&[k, n]));
    let z = g.matmul(x, y, f32s_shape(&[m, n]));
    g.set_outputs(vec![z]);
    let ins = [rand_tensor(&[m, k], 31), rand_tensor(&[k, n], 32)];
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let want = c.run(&ins, None).unwrap();
    let mut ex = CudaExecutor::new(g.clone()).unwrap();
    assert!(!ex.tf32());
    let got = ex.run(&ins, None).unwrap();
    let (a, b, o) = ([m, k], [k, n], [m, n]);
    let e32 = mm_error(&a, &b, &o, &ins, &got[0]);
    let ecpu = mm_error(&a, &b, &o, &ins, &want[0]);
    eprintln!(
        "matmul {m}x{k}x{n} f32 (default math): normalized error cuda {e32:.3e}, cpu {ecpu:.3e}, bound K*u {:.3e}; max_rel cuda vs cpu {:.3e}",
        k as f64 * U,
        max_rel(&got[0], &want[0]).unwrap()
    );
    assert!(e32 <= k as f64 * U, "{e32:.3e}");
    // Full f32, not TF32: TF32 gave 3.8e-5 on this product, f32 6.1e-8 (CPU 7.5e-8).
    assert!(e32 < 1e-6, "default math looks like TF32: {e32:.3e}");
    // Timing of the whole run (upload, sgemm, read back), after a warm-up.
    let t = std::time::Instant::now();
    for _ in 0..10 {
        ex.run(&ins, None).unwrap();
    }
    eprintln!(
        "matmul {m}x{k}x{n}: {:.3} ms per run (upload + sgemm + read back)",
        t.elapsed().as_secs_f64() * 100.0
    );
    // SAFETY (edition 2021: set_var is safe): tests of this binary run one at a time on the
    // device (--test-threads=1); the variable is read only at executor creation.
    std::env::set_var("RLX_CUDA_TF32", "1");
    let mut ex2 = CudaExecutor::new(g.clone()).unwrap();
    std::env::remove_var("RLX_CUDA_TF32");
    assert!(ex2.tf32());
    let got2 = ex2.run(&ins, None).unwrap();
    let rtf = mm_error(&a, &b, &o, &ins, &got2[0]);
    eprintln!(
        "matmul {m}x{k}x{n} with RLX_CUDA_TF32=1: normalized error {rtf:.3e} (f32 {e32:.3e}); max_rel vs cpu {:.3e}",
        max_rel(&got2[0], &want[0]).unwrap()
    );
    // TF32 rounds each input to a 10-bit mantissa: about 2^-10 per product.
    assert!(rtf < 4e-3, "{rtf:.3e}");
    assert!(
        rtf > 1e-6,
        "RLX_CUDA_TF32=1 gave f32 accuracy ({rtf:.3e}): TF32 was not used"
    );
}

/// The matmul error metric on the CPU reference itself (runs without a GPU): rlx-cpu's f32
/// matmul is within the K·u bound that the CUDA tests assert.
#[test]
fn matmul_error_metric_on_the_cpu() {
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[64, 128], &[128, 96], &[64, 96]),
        (&[2, 1, 5, 6], &[1, 3, 6, 7], &[2, 3, 5, 7]),
        (&[33], &[33, 17], &[17]),
        (&[64, 2048], &[2048, 32], &[64, 32]),
    ];
    for (k, (a, b, o)) in cases.iter().enumerate() {
        let mut g = Graph::new("mm");
        let x = g.input("a", f32s_shape(a));
        let y = g.input("b", f32s_shape(b));
        let z = g.matmul(x, y, f32s_shape(o));
        g.set_outputs(vec![z]);
        let ins = [rand_tensor(a, 10 + k as u64), rand_tensor(b, 20 + k as u64)];
        let want = CpuExecutor::new(g).unwrap().run(&ins, None).unwrap();
        let e = mm_error(a, b, o, &ins, &want[0]);
        let kk = a[a.len() - 1] as f64;
        eprintln!(
            "cpu matmul {a:?} x {b:?}: normalized error {e:.3e}, K*u {:.3e}",
            kk * U
        );
        assert!(e <= kk * U && e > 0.0, "{e:.3e}");
        // A planted error of one ulp-scale unit in one element is seen.
        let mut bad = want[0].clone();
        if let rlx_ir::TensorData::F32(v) = bad.data_mut() {
            v[0] += 0.5;
        }
        assert!(mm_error(a, b, o, &ins, &bad) > kk * U);
    }
}

/// float16/bfloat16 elementwise chains fuse too: each member rounds its value inside the
/// fused kernel with the function the per-node rounding uses, so fused runs give the unfused
/// run's bits (broadcast input, NaN and an f16 overflow to +inf in the data), scanning runs
/// give the unfused run's counts, and the CPU's float16/bfloat16 path agrees within one unit
/// of the dtype's last place.
#[test]
fn half_precision_groups_fuse_bit_identically() {
    if !cuda_available() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let (b, t, h) = (3, 5, 33);
        let s3 = Shape::new(&[b, t, h], dt);
        let mut g = Graph::new("fused_half");
        let x = g.input("x", s3.clone());
        let gamma = g.input("gamma", Shape::new(&[h], dt));
        let m = g.mul(x, gamma, s3.clone());
        let e = g.unary(UnaryOp::Exp, m, s3.clone());
        let a = g.add(e, x, s3.clone());
        let th = g.activation(Activation::Tanh, a, s3.clone());
        let out = g.mul(th, e, s3.clone());
        g.set_outputs(vec![out]);
        let mut xv = rand_vec(b * t * h, 11, -3.0, 3.0);
        xv[7] = f32::NAN;
        xv[40] = 12.0; // exp(12 * gamma) may pass float16's 65504
        let gv = rand_vec(h, 12, 0.5, 1.5);
        let half = |v: Vec<f32>, d: &[usize]| -> Tensor {
            let data = match dt {
                DType::F16 => {
                    rlx_ir::TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect())
                }
                _ => rlx_ir::TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
            };
            Tensor::new(d.to_vec(), data).unwrap()
        };
        let ins = [half(xv, &[b, t, h]), half(gv, &[h])];
        let mut ex = CudaExecutor::new(g.clone()).unwrap();
        assert!(ex.fused_groups() >= 1, "{dt}: {} groups", ex.fused_groups());
        std::env::set_var("RLX_CUDA_FUSE", "0");
        let mut plain = CudaExecutor::new(g.clone()).unwrap();
        std::env::remove_var("RLX_CUDA_FUSE");
        assert_eq!(plain.fused_groups(), 0);
        let fused = ex.run(&ins, None).unwrap();
        let unfused = plain.run(&ins, None).unwrap();
        let vals = |t: &Tensor| -> Vec<f32> { t.data().to_f32_vec() };
        let bits = |t: &Tensor| -> Vec<u32> { vals(t).iter().map(|x| x.to_bits()).collect() };
        assert_eq!(bits(&fused[0]), bits(&unfused[0]), "{dt}");
        let scan = |ex: &mut CudaExecutor| {
            let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
            sc.set_print(false);
            ex.run(&ins, Some(&mut sc)).unwrap();
            sc
        };
        let (s1, s2) = (scan(&mut ex), scan(&mut plain));
        assert_eq!(s1.counts(), s2.counts(), "{dt}");
        assert!(
            s1.counts()[e.index()].nan > 0,
            "{dt}: the NaN input reaches Exp"
        );
        let want = CpuExecutor::new(g.clone())
            .unwrap()
            .run(&ins, None)
            .unwrap();
        let ulp = if dt == DType::F16 {
            2f32.powi(-10)
        } else {
            2f32.powi(-7)
        };
        for (i, (&x, &y)) in vals(&fused[0]).iter().zip(&vals(&want[0])).enumerate() {
            let ok = (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= 2.0 * ulp * y.abs().max(2f32.powi(-14));
            assert!(ok, "{dt} element {i}: cuda {x} cpu {y}");
        }
    }
}
