//! Fused attention on CUDA (`crate::attn`): small attention graphs in the patterns BERT's ONNX
//! export and the ONNX Attention lowering (Qwen3 through torch.export) give, run fused and
//! compared with the CPU backend and with the unfused CUDA steps (`RLX_CUDA_ATTN=0`).
//!
//! Tolerances (inputs in [-2, 2), so outputs within [-2, 2]): float32 within 2e-5 + 1e-5 of
//! the reference's magnitude (the summation order differs from cuBLAS's and the CPU's);
//! bfloat16 within max|V| / 32 + |reference| / 128 (the unfused path rounds E, the sum and P
//! to bfloat16, the fused kernel keeps them in f32: a few bfloat16 roundings of the output's
//! scale). NaN and infinities must sit at the same elements.
//!
//! Scanning runs (`RLX_DEBUG_NANS`) run the fused counting kernel (the default; the tests
//! turn it on explicitly and off to check the unfused steps count the same): their per-node
//! counts are compared with the unfused executor's, node by node.
//!
//! Like the other CUDA tests: skipped without a device, failing with `RLX_REQUIRE_CUDA=1`;
//! run one at a time on the device (`--test-threads=1`: some set `RLX_CUDA_ATTN`).

mod common;
use common::*;
use rlx_cpu::CpuExecutor;
use rlx_cuda::{CudaExecutor, Placement};
use rlx_ir::numeric_check::{DebugMode, DebugScanner};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, Shape, Tensor, TensorData, UnaryOp};

fn sh(d: &[usize], dt: DType) -> Shape {
    Shape::new(d, dt)
}

fn tensor(dims: &[usize], v: &[f32], dt: DType) -> Tensor {
    let w: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    Tensor::new(dims.to_vec(), TensorData::from_f64(dt, &w)).unwrap()
}

fn rand_t(dims: &[usize], seed: u64, dt: DType) -> Tensor {
    let n = dims.iter().product();
    tensor(dims, &rand_vec(n, seed, -2.0, 2.0), dt)
}

fn reduce(g: &mut Graph, kind: ReduceKind, x: NodeId, rd: &[usize], dt: DType) -> NodeId {
    g.add_node(
        Op::Reduce {
            kind,
            axes: vec![rd.len() - 1],
            keepdims: true,
        },
        vec![x],
        sh(rd, dt),
    )
}

/// rlx-compile's decomposed Softmax over the last axis, or (`safe`) the ONNX Attention
/// lowering's masked-row-safe form (a row of all -inf gives 0).
fn softmax(g: &mut Graph, u: NodeId, sd: &[usize], dt: DType, safe: bool) -> NodeId {
    let mut rd = sd.to_vec();
    *rd.last_mut().unwrap() = 1;
    let zero = g.constant(Tensor::scalar(dt, 0.0));
    let one = g.constant(Tensor::scalar(dt, 1.0));
    let mut m = reduce(g, ReduceKind::Max, u, &rd, dt);
    if safe {
        let f = g.add_node(
            Op::Unary(UnaryOp::IsInf {
                pos: false,
                neg: true,
            }),
            vec![m],
            sh(&rd, DType::Bool),
        );
        m = g.add_node(Op::Select, vec![f, zero, m], sh(&rd, dt));
    }
    let d = g.binary(BinaryOp::Sub, u, m, sh(sd, dt));
    let e = g.unary(UnaryOp::Exp, d, sh(sd, dt));
    let mut s = reduce(g, ReduceKind::Sum, e, &rd, dt);
    if safe {
        let z = g.add_node(
            Op::Binary(BinaryOp::Eq),
            vec![s, zero],
            sh(&rd, DType::Bool),
        );
        s = g.add_node(Op::Select, vec![z, one, s], sh(&rd, dt));
    }
    g.binary(BinaryOp::Div, e, s, sh(sd, dt))
}

/// BERT's self-attention as exported to ONNX: inputs q [b, lq, h, d], k and v [b, lk, h, d]
/// (the projections after the head split), Transposes to [b, h, l, d] and (K) [b, h, d, lk],
/// Mul by 1/sqrt(d), Add of the padding mask [b, 1, 1, lk], Softmax, MatMul; output
/// [b, h, lq, d]. Inputs: q, k, v, mask.
fn bert_like(b: usize, h: usize, lq: usize, lk: usize, d: usize, dt: DType) -> Graph {
    let mut g = Graph::new("bert_like");
    let q = g.input("q", sh(&[b, lq, h, d], dt));
    let k = g.input("k", sh(&[b, lk, h, d], dt));
    let v = g.input("v", sh(&[b, lk, h, d], dt));
    let mask = g.input("mask", sh(&[b, 1, 1, lk], dt));
    let qt = g.add_node(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![q],
        sh(&[b, h, lq, d], dt),
    );
    let kt = g.add_node(
        Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        vec![k],
        sh(&[b, h, d, lk], dt),
    );
    let vt = g.add_node(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![v],
        sh(&[b, h, lk, d], dt),
    );
    let sd = [b, h, lq, lk];
    let s = g.matmul(qt, kt, sh(&sd, dt));
    let c = g.constant(Tensor::scalar(dt, 1.0 / (d as f64).sqrt()));
    let t = g.binary(BinaryOp::Mul, s, c, sh(&sd, dt));
    let u = g.binary(BinaryOp::Add, t, mask, sh(&sd, dt));
    let p = softmax(&mut g, u, &sd, dt, false);
    let o = g.matmul(p, vt, sh(&[b, h, lq, d], dt));
    g.set_outputs(vec![o]);
    g
}

/// The ONNX Attention lowering (Qwen3 through torch.export): q [b, hq, lq, d], k and v
/// [b, hkv, lk, d] with the KV heads repeated (Reshape, Broadcast, Reshape), Q and K^T each
/// scaled by sqrt(1/sqrt(d)) before the MatMul, an additive [lq, lk] mask, the masked-row-safe
/// softmax. Inputs: q, k, v, mask.
fn qwen_like(b: usize, hq: usize, hkv: usize, lq: usize, lk: usize, d: usize, dt: DType) -> Graph {
    let rep = hq / hkv;
    let mut g = Graph::new("qwen_like");
    let q = g.input("q", sh(&[b, hq, lq, d], dt));
    let k = g.input("k", sh(&[b, hkv, lk, d], dt));
    let v = g.input("v", sh(&[b, hkv, lk, d], dt));
    let mask = g.input("mask", sh(&[lq, lk], dt));
    let expand = |g: &mut Graph, x: NodeId| {
        let a = g.add_node(
            Op::Reshape {
                dims: vec![b, hkv, 1, lk, d],
            },
            vec![x],
            sh(&[b, hkv, 1, lk, d], dt),
        );
        let e = g.add_node(
            Op::Broadcast {
                dims: vec![b, hkv, rep, lk, d],
            },
            vec![a],
            sh(&[b, hkv, rep, lk, d], dt),
        );
        g.add_node(
            Op::Reshape {
                dims: vec![b, hq, lk, d],
            },
            vec![e],
            sh(&[b, hq, lk, d], dt),
        )
    };
    let (k, v) = (expand(&mut g, k), expand(&mut g, v));
    let c = g.constant(Tensor::scalar(dt, (1.0 / (d as f64).sqrt()).sqrt()));
    let qs = g.binary(BinaryOp::Mul, q, c, sh(&[b, hq, lq, d], dt));
    let kt = g.add_node(
        Op::Transpose {
            perm: vec![0, 1, 3, 2],
        },
        vec![k],
        sh(&[b, hq, d, lk], dt),
    );
    let ks = g.binary(BinaryOp::Mul, kt, c, sh(&[b, hq, d, lk], dt));
    let sd = [b, hq, lq, lk];
    let s = g.matmul(qs, ks, sh(&sd, dt));
    let u = g.binary(BinaryOp::Add, s, mask, sh(&sd, dt));
    let p = softmax(&mut g, u, &sd, dt, true);
    let o = g.matmul(p, v, sh(&[b, hq, lq, d], dt));
    g.set_outputs(vec![o]);
    g
}

/// Plain attention over batch dims `z`: q [z.., lq, d], K^T given as [z.., d, lk] (no
/// Transpose), v [z.., lk, dv], Div by sqrt(d), an optional [lq, lk] mask, the plain or the
/// masked-row-safe softmax. Inputs: q, kt, v (, mask).
#[allow(clippy::too_many_arguments)]
fn plain(
    z: &[usize],
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    dt: DType,
    masked: bool,
    safe: bool,
) -> Graph {
    let dims = |a: usize, b: usize| -> Vec<usize> {
        let mut v = z.to_vec();
        v.extend([a, b]);
        v
    };
    let mut g = Graph::new("plain");
    let q = g.input("q", sh(&dims(lq, d), dt));
    let kt = g.input("kt", sh(&dims(d, lk), dt));
    let v = g.input("v", sh(&dims(lk, dv), dt));
    let sd = dims(lq, lk);
    let s = g.matmul(q, kt, sh(&sd, dt));
    let c = g.constant(Tensor::scalar(dt, (d as f64).sqrt()));
    let mut u = g.binary(BinaryOp::Div, s, c, sh(&sd, dt));
    if masked {
        let mask = g.input("mask", sh(&[lq, lk], dt));
        u = g.binary(BinaryOp::Add, mask, u, sh(&sd, dt));
    }
    let p = softmax(&mut g, u, &sd, dt, safe);
    let o = g.matmul(p, v, sh(&dims(lq, dv), dt));
    g.set_outputs(vec![o]);
    g
}

/// A causal [lq, lk] mask (bottom-right aligned: query i sees keys j <= i + lk - lq), 0 or
/// -inf, with the rows in `full` all -inf.
fn causal(lq: usize, lk: usize, full: &[usize]) -> Vec<f32> {
    let mut m = vec![0.0f32; lq * lk];
    for i in 0..lq {
        for j in 0..lk {
            if j > i + (lk - lq) || full.contains(&i) {
                m[i * lk + j] = f32::NEG_INFINITY;
            }
        }
    }
    m
}

/// The fused executor (asserting its attention group was planned and nothing fell back).
fn fused(g: &Graph, groups: usize) -> CudaExecutor {
    let ex = CudaExecutor::new(g.clone()).unwrap();
    let cpu: Vec<_> = ex
        .placements()
        .into_iter()
        .filter(|(_, p)| matches!(p, Placement::CpuFallback { .. }))
        .collect();
    assert!(cpu.is_empty(), "{}: CPU fallbacks {cpu:?}", g.name);
    assert_eq!(
        ex.attention_groups(),
        groups,
        "{}: attention groups (note: {:?})",
        g.name,
        ex.attention_note()
    );
    ex
}

/// The executor with attention fusion off.
fn unfused(g: &Graph) -> CudaExecutor {
    // SAFETY (edition 2021: set_var is safe): the tests of this binary run one at a time on
    // the device (--test-threads=1); the variable is read only at executor creation.
    std::env::set_var("RLX_CUDA_ATTN", "0");
    let ex = CudaExecutor::new(g.clone());
    std::env::remove_var("RLX_CUDA_ATTN");
    let ex = ex.unwrap();
    assert_eq!(ex.attention_groups(), 0);
    assert_eq!(ex.attention_note(), Some("RLX_CUDA_ATTN=0"));
    ex
}

fn cpu_run(g: &Graph, ins: &[Tensor]) -> Tensor {
    CpuExecutor::new(g.clone())
        .unwrap()
        .run(ins, None)
        .unwrap()
        .remove(0)
}

/// (atol, rtol) for a dtype (see the module docs); `vmax` = max |V|.
fn tol(dt: DType, vmax: f64) -> (f64, f64) {
    match dt {
        DType::BF16 => (vmax / 32.0, 1.0 / 128.0),
        _ => (2e-5, 1e-5),
    }
}

/// Asserts `|got - want| <= atol + rtol |want|` elementwise, NaN where `want` is NaN and
/// only there, infinities equal; returns the number of NaN elements.
fn assert_close_attn(what: &str, got: &Tensor, want: &Tensor, (atol, rtol): (f64, f64)) -> usize {
    assert_eq!(got.dims(), want.dims(), "{what}: dims");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (mut worst, mut nans) = (0.0f64, 0usize);
    for i in 0..want.numel() {
        let (a, b) = (got.data().get_f64(i), want.data().get_f64(i));
        if a.is_nan() || b.is_nan() {
            assert!(
                a.is_nan() && b.is_nan(),
                "{what}: element {i}: fused {a}, reference {b}"
            );
            nans += 1;
            continue;
        }
        if a.is_infinite() || b.is_infinite() {
            assert_eq!(a, b, "{what}: element {i}");
            continue;
        }
        let lim = atol + rtol * b.abs();
        let err = (a - b).abs();
        assert!(
            err <= lim,
            "{what}: element {i}: fused {a}, reference {b}, |diff| {err:e} > {lim:e}"
        );
        worst = worst.max(err / lim);
    }
    eprintln!("{what}: worst error {worst:.3} of the tolerance, {nans} NaN");
    nans
}

fn vmax(t: &Tensor) -> f64 {
    (0..t.numel())
        .map(|i| t.data().get_f64(i).abs())
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max)
}

/// Fused vs the CPU and vs the unfused CUDA steps.
fn check(g: &Graph, ins: &[Tensor], v_index: usize) -> (Tensor, usize) {
    let dt = g.node(g.outputs[0]).shape.dtype;
    let t = tol(dt, vmax(&ins[v_index]));
    let mut ex = fused(g, 1);
    let got = ex.run(ins, None).unwrap().remove(0);
    let want = cpu_run(g, ins);
    let nans = assert_close_attn(&format!("{} {dt} vs cpu", g.name), &got, &want, t);
    let plain = unfused(g).run(ins, None).unwrap().remove(0);
    let n2 = assert_close_attn(&format!("{} {dt} vs unfused cuda", g.name), &got, &plain, t);
    assert_eq!(nans, n2);
    (got, nans)
}

/// BERT's pattern with a padding mask (-10000 on the last 5 keys of batch 1, -inf on the
/// last 3 of batch 0), odd lengths (37 queries, 53 keys), head dim 64, 2 x 3 heads.
#[test]
fn bert_pattern_with_padding_mask() {
    if !cuda_available() {
        return;
    }
    let (b, h, lq, lk, d) = (2, 3, 37, 53, 64);
    for dt in [DType::F32, DType::BF16] {
        let g = bert_like(b, h, lq, lk, d, dt);
        let mut m = vec![0.0f32; b * lk];
        m[lk - 3..lk].fill(f32::NEG_INFINITY);
        for j in lk - 5..lk {
            m[lk + j] = -10000.0;
        }
        let ins = [
            rand_t(&[b, lq, h, d], 1, dt),
            rand_t(&[b, lk, h, d], 2, dt),
            rand_t(&[b, lk, h, d], 3, dt),
            tensor(&[b, 1, 1, lk], &m, dt),
        ];
        let (_, nans) = check(&g, &ins, 2);
        assert_eq!(nans, 0);
    }
}

/// The ONNX Attention lowering's pattern (GQA, pre-scaled Q and K^T, masked-row-safe
/// softmax) with a causal -inf mask and two fully masked rows (their output is 0), head dim
/// 128, 37 queries over 53 keys.
#[test]
fn qwen_pattern_causal_with_fully_masked_rows() {
    if !cuda_available() {
        return;
    }
    let (b, hq, hkv, lq, lk, d) = (2, 4, 2, 37, 53, 128);
    for dt in [DType::F32, DType::BF16] {
        let g = qwen_like(b, hq, hkv, lq, lk, d, dt);
        let ins = [
            rand_t(&[b, hq, lq, d], 4, dt),
            rand_t(&[b, hkv, lk, d], 5, dt),
            rand_t(&[b, hkv, lk, d], 6, dt),
            tensor(&[lq, lk], &causal(lq, lk, &[0, 20]), dt),
        ];
        let (got, nans) = check(&g, &ins, 2);
        assert_eq!(nans, 0);
        // Rows 0 and 20 of every head are 0.
        for bh in 0..b * hq {
            for i in [0, 20] {
                for x in 0..d {
                    let at = (bh * lq + i) * d + x;
                    assert_eq!(got.data().get_f64(at), 0.0, "row {i} of head {bh}");
                }
            }
        }
    }
}

/// No mask, K^T given directly, Div by the scale, batch dims [2, 2], head dims 40 (Q, K) and
/// 24 (V), one thread per 32 dims at 1 and 2 threads per row; then a mask with a fully -inf
/// row under the plain softmax: NaN in that row (0/0), as on the CPU.
#[test]
fn plain_pattern_odd_head_dims_and_nan_rows() {
    if !cuda_available() {
        return;
    }
    let z = [2usize, 2];
    let (lq, lk) = (37, 53);
    for (d, dv) in [(40, 24), (16, 32), (128, 7)] {
        for dt in [DType::F32, DType::BF16] {
            let g = plain(&z, lq, lk, d, dv, dt, false, false);
            let ins = [
                rand_t(&[2, 2, lq, d], 7, dt),
                rand_t(&[2, 2, d, lk], 8, dt),
                rand_t(&[2, 2, lk, dv], 9, dt),
            ];
            let (_, nans) = check(&g, &ins, 2);
            assert_eq!(nans, 0);
        }
    }
    let (d, dv) = (40, 24);
    let g = plain(&z, lq, lk, d, dv, DType::F32, true, false);
    let mut m = causal(lq, lk, &[3]);
    m[5 * lk + 2] = -1e30; // a large finite mask entry: contributes 0, no NaN
    let ins = [
        rand_t(&[2, 2, lq, d], 10, DType::F32),
        rand_t(&[2, 2, d, lk], 11, DType::F32),
        rand_t(&[2, 2, lk, dv], 12, DType::F32),
        tensor(&[lq, lk], &m, DType::F32),
    ];
    let (_, nans) = check(&g, &ins, 2);
    assert_eq!(nans, 4 * dv, "row 3 of each of the 4 batch entries is NaN");
}

/// A NaN in one Q element makes exactly that query row NaN (every head dim), as on the CPU;
/// a NaN in one V element makes that column NaN in every row (masked or not: 0 * NaN).
#[test]
fn nan_inputs_give_nan_rows_as_on_the_cpu() {
    if !cuda_available() {
        return;
    }
    let (b, h, lq, lk, d) = (2, 3, 37, 53, 64);
    let g = bert_like(b, h, lq, lk, d, DType::F32);
    let mut qv = rand_vec(b * lq * h * d, 13, -2.0, 2.0);
    // q [b, lq, h, d]: batch 0, query 5, head 1, dim 3.
    qv[((5 * h) + 1) * d + 3] = f32::NAN;
    let mut mask = vec![0.0f32; b * lk];
    mask[lk + 7] = f32::NEG_INFINITY;
    let ins = [
        Tensor::from_f32(&[b, lq, h, d], qv).unwrap(),
        rand_t(&[b, lk, h, d], 14, DType::F32),
        rand_t(&[b, lk, h, d], 15, DType::F32),
        tensor(&[b, 1, 1, lk], &mask, DType::F32),
    ];
    let (got, nans) = check(&g, &ins, 2);
    assert_eq!(nans, d);
    for x in 0..d {
        // o [b, h, lq, d]: batch 0, head 1, query 5.
        assert!(got.data().get_f64((lq + 5) * d + x).is_nan());
    }
    // V NaN at batch 1, key 7 (masked with -inf there), head 2, dim 9.
    let mut vv = rand_vec(b * lk * h * d, 16, -2.0, 2.0);
    vv[((lk + 7) * h + 2) * d + 9] = f32::NAN;
    let ins = [
        rand_t(&[b, lq, h, d], 13, DType::F32),
        rand_t(&[b, lk, h, d], 14, DType::F32),
        Tensor::from_f32(&[b, lk, h, d], vv).unwrap(),
        tensor(&[b, 1, 1, lk], &mask, DType::F32),
    ];
    let (_, nans) = check(&g, &ins, 2);
    assert_eq!(nans, lq);
}

/// A scanning run (RLX_DEBUG_NANS) of the fused executor with the counting attention kernel
/// (`set_attention_scan(true)`) against the executor with attention fusion off, three times
/// each (the scanning CUDA graph is captured at the second run and replayed at the third):
/// every node's counts (NaN, +inf, -inf and their first indices, inner nodes included)
/// equal, the fused counting kernel ran every time, the outputs close (NaN and infinities at
/// the same elements); the fused executor's scanning runs with the counting kernel off (the
/// unfused steps) count the same. `fallback`: whether some block of the counting kernel must
/// take its two-pass path (a row with a NaN or infinite max, NaN/±inf in V) or none (every
/// block counts in its single pass). Returns the counting run's scanner.
fn scan_matches_unfused(
    what: &str,
    g: &Graph,
    ins: &[Tensor],
    v_index: usize,
    fallback: bool,
) -> DebugScanner {
    let dt = g.node(g.outputs[0]).shape.dtype;
    let t = tol(dt, vmax(&ins[v_index]));
    let mut ex = fused(g, 1);
    ex.set_attention_scan(true);
    let mut plain = unfused(g);
    let scan = |ex: &mut CudaExecutor| {
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        let out = ex.run(ins, Some(&mut sc)).unwrap().remove(0);
        (sc, out)
    };
    let before = ex.attention_scan_runs();
    let mut last = None;
    for rep in 0..3 {
        let (s1, o1) = scan(&mut ex);
        let (s2, o2) = scan(&mut plain);
        assert_eq!(s1.counts().len(), g.len());
        for (k, (a, b)) in s1.counts().iter().zip(s2.counts()).enumerate() {
            assert_eq!(
                a, b,
                "{what} {dt}, scanning run {rep}: counts of node {k} ({:?})",
                g.nodes[k].op
            );
        }
        assert_close_attn(&format!("{what} {dt} scanning run {rep}"), &o1, &o2, t);
        let fb = ex.attention_scan_fallback_blocks();
        assert_eq!(
            fb > 0,
            fallback,
            "{what} {dt}, scanning run {rep}: {fb} blocks took the two-pass path"
        );
        last = Some(s1);
    }
    assert_eq!(
        ex.attention_scan_runs(),
        before + 3,
        "{what}: counting kernel used"
    );
    assert_eq!(plain.attention_scan_runs(), 0);
    assert!(
        ex.scan_uses_cuda_graph(),
        "{what}: scanning CUDA graph replayed"
    );
    let last = last.unwrap();
    // The counting kernel off: scanning runs run the unfused steps (switching replans the
    // scan).
    ex.set_attention_scan(false);
    for _ in 0..2 {
        let (s3, _) = scan(&mut ex);
        assert_eq!(
            s3.counts(),
            last.counts(),
            "{what} {dt}: default scanning run"
        );
    }
    assert_eq!(ex.attention_scan_runs(), before + 3);
    last
}

/// Scanning runs count the inner values in the fused counting kernel (its single pass where
/// every row is normal, its two-pass path in blocks with a NaN or infinite row max, an
/// overflowing U - max, or NaN/±inf in V; each case asserted), with the same counts
/// as the executor with attention fusion off, in every special-value case, float32 and
/// bfloat16: the ONNX Attention pattern with a causal -inf mask (U mostly -inf), a fully
/// masked row and a NaN in Q (also matching the CPU's reports); BERT's pattern with a
/// padding mask of -inf and -10000, a NaN in Q, a NaN in V at a masked key, +inf in V at a
/// masked key (0 * inf), -inf in V at an open key and +inf in K (S, T and U ±inf, a row max
/// of +inf); the plain softmax with a fully -inf row (NaN from the Sub on). Ordinary runs
/// before and after stay fused, through the CUDA graph's capture and replay, with the same
/// bits every time; `run_all` gives every inner value.
#[test]
fn scanning_and_replay_keep_counts_and_values() {
    if !cuda_available() {
        return;
    }
    for dt in [DType::F32, DType::BF16] {
        // The ONNX Attention lowering's pattern.
        let (b, hq, hkv, lq, lk, d) = (1, 4, 2, 37, 53, 128);
        let g = qwen_like(b, hq, hkv, lq, lk, d, dt);
        let mut qv = rand_vec(b * hq * lq * d, 17, -2.0, 2.0);
        qv[(2 * lq + 9) * d + 100] = f32::NAN;
        let ins = [
            tensor(&[b, hq, lq, d], &qv, dt),
            rand_t(&[b, hkv, lk, d], 18, dt),
            rand_t(&[b, hkv, lk, d], 19, dt),
            tensor(&[lq, lk], &causal(lq, lk, &[4]), dt),
        ];
        let mut ex = fused(&g, 1);
        ex.set_attention_scan(true);
        let bits = |t: &Tensor| -> Vec<u32> { f32s(t).iter().map(|x| x.to_bits()).collect() };
        let first = ex.run(&ins, None).unwrap().remove(0);
        let s1 = scan_matches_unfused("qwen_like", &g, &ins, 2, true);
        assert!(s1.counts().iter().any(|c| c.nan > 0));
        assert!(s1.counts().iter().any(|c| c.neg_inf > 0));
        if dt == DType::F32 {
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
        }
        // The same executor: scanning runs between ordinary ones.
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        for _ in 0..3 {
            ex.run(&ins, Some(&mut sc)).unwrap();
        }
        assert_eq!(sc.counts(), s1.counts());
        assert_eq!(ex.attention_scan_runs(), 3);
        for c in 0..4 {
            let again = ex.run(&ins, None).unwrap().remove(0);
            assert_eq!(
                bits(&again),
                bits(&first),
                "ordinary run {c} after the scan"
            );
        }
        assert!(ex.uses_cuda_graph());
        let all = ex.run_all(&ins).unwrap();
        let members = &ex.attention_members()[0];
        for m in members {
            assert!(all[m.index()].is_some(), "run_all gives inner value {m}");
        }
        assert_eq!(
            ex.attention_scan_runs(),
            3,
            "run_all runs the unfused steps"
        );
        let o = g.outputs[0];
        let t = tol(dt, 2.0);
        assert_close_attn(
            "run_all vs fused",
            all[o.index()].as_ref().unwrap(),
            &first,
            t,
        );

        // BERT's pattern: padding mask of -inf (batch 0, last 3 keys) and -10000 (batch 1,
        // last 5 keys); inputs q [b, lq, h, d], k and v [b, lk, h, d].
        let (b, h, lq, lk, d) = (2, 3, 37, 53, 64);
        let g = bert_like(b, h, lq, lk, d, dt);
        let mut m = vec![0.0f32; b * lk];
        m[lk - 3..lk].fill(f32::NEG_INFINITY);
        for j in lk - 5..lk {
            m[lk + j] = -10000.0;
        }
        let at = |bi: usize, l: usize, hi: usize, x: usize, len: usize| {
            ((bi * len + l) * h + hi) * d + x
        };
        let mut qv = rand_vec(b * lq * h * d, 30, -2.0, 2.0);
        qv[at(0, 5, 1, 3, lq)] = f32::NAN;
        let mut kv = rand_vec(b * lk * h * d, 31, -2.0, 2.0);
        kv[at(1, 11, 2, 2, lk)] = f32::INFINITY;
        let mut vv = rand_vec(b * lk * h * d, 32, -2.0, 2.0);
        vv[at(0, lk - 1, 0, 9, lk)] = f32::NAN;
        vv[at(1, lk - 2, 0, 5, lk)] = f32::INFINITY;
        vv[at(0, 0, 2, 1, lk)] = f32::NEG_INFINITY;
        let ins = [
            tensor(&[b, lq, h, d], &qv, dt),
            tensor(&[b, lk, h, d], &kv, dt),
            tensor(&[b, lk, h, d], &vv, dt),
            tensor(&[b, 1, 1, lk], &m, dt),
        ];
        let s1 = scan_matches_unfused("bert_like", &g, &ins, 2, true);
        for (what, f) in [
            (
                "NaN",
                (|c: &rlx_ir::numeric_check::NonFiniteCounts| c.nan) as fn(&_) -> usize,
            ),
            ("+inf", |c| c.pos_inf),
            ("-inf", |c| c.neg_inf),
        ] {
            assert!(
                s1.counts().iter().any(|c| f(c) > 0),
                "bert_like {dt}: some {what}"
            );
        }
        // Clean inputs: nothing counted but the mask's -inf and U's, the Sub's.
        let ins = [
            rand_t(&[b, lq, h, d], 33, dt),
            rand_t(&[b, lk, h, d], 34, dt),
            rand_t(&[b, lk, h, d], 35, dt),
            tensor(&[b, 1, 1, lk], &m, dt),
        ];
        let s1 = scan_matches_unfused("bert_like clean", &g, &ins, 2, false);
        assert!(s1.counts().iter().all(|c| c.nan == 0 && c.pos_inf == 0));

        // The ONNX Attention pattern, a causal mask with no fully masked row, clean inputs:
        // U's and the Sub's -inf above the diagonal, counted in the single pass.
        let (b, hq, hkv, lq, lk, d) = (1, 4, 2, 37, 53, 128);
        let g = qwen_like(b, hq, hkv, lq, lk, d, dt);
        let ins = [
            rand_t(&[b, hq, lq, d], 40, dt),
            rand_t(&[b, hkv, lk, d], 41, dt),
            rand_t(&[b, hkv, lk, d], 42, dt),
            tensor(&[lq, lk], &causal(lq, lk, &[]), dt),
        ];
        let s1 = scan_matches_unfused("qwen_like causal", &g, &ins, 2, false);
        assert!(s1.counts().iter().any(|c| c.neg_inf > 0));
        assert!(s1.counts().iter().all(|c| c.nan == 0 && c.pos_inf == 0));

        // U - max overflowing with U finite (mask +3e38 and -3e38 in row 6): the Sub's -inf
        // there is counted on the two-pass path.
        let z = [2usize, 2];
        let (lq, lk, d, dv) = (37, 53, 40, 24);
        let g = plain(&z, lq, lk, d, dv, dt, true, false);
        let mut m = vec![0.0f32; lq * lk];
        m[6 * lk + 1] = 3e38;
        m[6 * lk + 2] = -3e38;
        let ins = [
            rand_t(&[2, 2, lq, d], 43, dt),
            rand_t(&[2, 2, d, lk], 44, dt),
            rand_t(&[2, 2, lk, dv], 45, dt),
            tensor(&[lq, lk], &m, dt),
        ];
        let s1 = scan_matches_unfused("plain overflow", &g, &ins, 2, true);
        assert!(s1.counts().iter().any(|c| c.neg_inf == 4));

        // The plain softmax with a fully -inf row: NaN from the Sub on.
        let z = [2usize, 2];
        let (lq, lk, d, dv) = (37, 53, 40, 24);
        let g = plain(&z, lq, lk, d, dv, dt, true, false);
        let ins = [
            rand_t(&[2, 2, lq, d], 36, dt),
            rand_t(&[2, 2, d, lk], 37, dt),
            rand_t(&[2, 2, lk, dv], 38, dt),
            tensor(&[lq, lk], &causal(lq, lk, &[3]), dt),
        ];
        let s1 = scan_matches_unfused("plain", &g, &ins, 2, true);
        let o = g.outputs[0].index();
        assert_eq!(s1.counts()[o].nan, 4 * dv);
    }
}

/// The two benchmark shapes (BERT-base batch 8 x 128, 12 heads of 64; a Qwen3-0.6B-sized
/// prefill of 512: 16 query heads, 8 KV heads of 128), float32 and bfloat16: fused vs the
/// unfused CUDA steps, and the device time of each (printed).
#[test]
fn benchmark_shapes_match_unfused() {
    if !cuda_available() {
        return;
    }
    for dt in [DType::F32, DType::BF16] {
        let (b, h, l, d) = (8, 12, 128, 64);
        let g = bert_like(b, h, l, l, d, dt);
        let mut m = vec![0.0f32; b * l];
        for (bi, pad) in [(1usize, 30usize), (5, 100)] {
            for j in l - pad..l {
                m[bi * l + j] = -10000.0;
            }
        }
        let ins = vec![
            rand_t(&[b, l, h, d], 20, dt),
            rand_t(&[b, l, h, d], 21, dt),
            rand_t(&[b, l, h, d], 22, dt),
            tensor(&[b, 1, 1, l], &m, dt),
        ];
        compare_and_time(&g, &ins, dt);
        let (b, hq, hkv, l, d) = (1, 16, 8, 512, 128);
        let g = qwen_like(b, hq, hkv, l, l, d, dt);
        let ins = vec![
            rand_t(&[b, hq, l, d], 23, dt),
            rand_t(&[b, hkv, l, d], 24, dt),
            rand_t(&[b, hkv, l, d], 25, dt),
            tensor(&[l, l], &causal(l, l, &[]), dt),
        ];
        compare_and_time(&g, &ins, dt);
    }
}

fn compare_and_time(g: &Graph, ins: &[Tensor], dt: DType) {
    let t = tol(dt, 2.0);
    let mut ex = fused(g, 1);
    ex.set_attention_scan(true);
    let mut plain = unfused(g);
    let time = |ex: &mut CudaExecutor| -> (Tensor, f64) {
        let out = ex.run(ins, None).unwrap().remove(0);
        for _ in 0..3 {
            ex.run(ins, None).unwrap();
        }
        ex.set_device_timing(true);
        let mut best = f64::MAX;
        for _ in 0..10 {
            ex.run(ins, None).unwrap();
            best = best.min(ex.last_device_ms().unwrap());
        }
        ex.set_device_timing(false);
        (out, best)
    };
    let (got, tf) = time(&mut ex);
    let (want, tu) = time(&mut plain);
    assert_close_attn(&format!("{} {dt} vs unfused", g.name), &got, &want, t);
    eprintln!(
        "{} {dt} {:?}: fused {tf:.4} ms, unfused {tu:.4} ms (device, best of 10)",
        g.name,
        g.node(g.outputs[0]).shape.dims_usize()
    );
    // Scanning runs (RLX_DEBUG_NANS): the fused counting kernel vs the unfused steps.
    let scan_time = |ex: &mut CudaExecutor| -> (Tensor, f64) {
        let mut sc = DebugScanner::new(DebugMode::Warn, "cuda");
        sc.set_print(false);
        let out = ex.run(ins, Some(&mut sc)).unwrap().remove(0);
        for _ in 0..3 {
            ex.run(ins, Some(&mut sc)).unwrap();
        }
        ex.set_device_timing(true);
        let mut best = f64::MAX;
        for _ in 0..10 {
            ex.run(ins, Some(&mut sc)).unwrap();
            best = best.min(ex.last_device_ms().unwrap());
        }
        ex.set_device_timing(false);
        (out, best)
    };
    let (sgot, sf) = scan_time(&mut ex);
    let (swant, su) = scan_time(&mut plain);
    assert!(ex.attention_scan_runs() > 0);
    assert_eq!(
        ex.attention_scan_fallback_blocks(),
        0,
        "{} {dt}: every block counted in its single pass",
        g.name
    );
    assert_close_attn(
        &format!("{} {dt} scanning vs unfused", g.name),
        &sgot,
        &swant,
        t,
    );
    eprintln!(
        "{} {dt}: scanning fused {sf:.4} ms ({:.2}x its ordinary run), scanning unfused {su:.4} ms",
        g.name,
        sf / tf
    );
}
