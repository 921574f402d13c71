//! Helpers shared by the rlx-cpu integration tests.

#[allow(unused_imports)]
use rlx_ir::{Activation, BinaryOp, Graph, NodeId, Op, Shape, Tensor};

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG, top 24 bits).
#[allow(dead_code)] // not every test file that includes `common` uses it
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A scanner report as the fusion tests compare them: node, element index, label.
#[allow(dead_code)] // not every test file that includes `common` scans
pub type Report = (rlx_ir::NodeId, usize, String);

/// Run `ex` on `ins` with a NaN/Inf scanner in `mode` (not printing): its reports and the
/// first output as f32.
#[allow(dead_code)]
pub fn run_scanned(
    ex: &mut rlx_cpu::CpuExecutor,
    ins: &[rlx_ir::Tensor],
    mode: rlx_ir::numeric_check::DebugMode,
) -> (Vec<Report>, Vec<f32>) {
    let mut sc = rlx_ir::DebugScanner::new(mode, "cpu");
    sc.set_print(false);
    let y = ex.run(ins, Some(&mut sc)).unwrap();
    let r = sc
        .reports()
        .iter()
        .map(|r| (r.node, r.index, r.label.clone()))
        .collect();
    (r, y[0].as_f32().unwrap().to_vec())
}

/// A fused conv group's activation, as the fusion tests build it.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    None,
    Relu,
    /// Max(·, 0) then Min(·, 6), as ONNX Clip imports (MobileNetV2's ReLU6).
    Relu6,
    /// x · Sigmoid(x), as exported (EfficientNet).
    Silu,
}

#[allow(dead_code)]
pub fn sh(d: &[usize]) -> rlx_ir::Shape {
    rlx_ir::Shape::new(d, rlx_ir::DType::F32)
}

/// `a` applied to `x` in `g` (as ONNX exports it), output `shape`.
#[allow(dead_code)]
pub fn act(g: &mut Graph, x: NodeId, a: Act, shape: &Shape) -> NodeId {
    match a {
        Act::None => x,
        Act::Relu => g.add_node(Op::Activation(Activation::Relu), vec![x], shape.clone()),
        Act::Relu6 => {
            let lo = g.constant(Tensor::from_f32(&[], vec![0.0]).unwrap());
            let hi = g.constant(Tensor::from_f32(&[], vec![6.0]).unwrap());
            let mx = g.add_node(Op::Binary(BinaryOp::Max), vec![x, lo], shape.clone());
            g.add_node(Op::Binary(BinaryOp::Min), vec![mx, hi], shape.clone())
        }
        Act::Silu => {
            let sig = g.add_node(Op::Activation(Activation::Sigmoid), vec![x], shape.clone());
            g.mul(x, sig, shape.clone())
        }
    }
}

#[allow(dead_code)]
pub fn act_ref(a: Act, v: f64) -> f64 {
    match a {
        Act::None => v,
        Act::Relu => v.max(0.0),
        Act::Relu6 => v.clamp(0.0, 6.0),
        Act::Silu => v / (1.0 + (-v).exp()),
    }
}

/// Bit patterns of `v`, for exact comparisons.
#[allow(dead_code)]
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The graph `make` builds, run with a scanner in `mode` on `ins`, fusion on then off: the
/// node `make` names with each run's reports and first output, as (fusion, node, reports,
/// output).
#[allow(dead_code)]
pub fn scanned_fusion_on_off(
    make: impl Fn() -> (rlx_ir::Graph, rlx_ir::NodeId),
    ins: &[rlx_ir::Tensor],
    mode: rlx_ir::numeric_check::DebugMode,
) -> Vec<(bool, rlx_ir::NodeId, Vec<Report>, Vec<f32>)> {
    [true, false]
        .into_iter()
        .map(|fuse| {
            let (g, node) = make();
            let mut ex = rlx_cpu::CpuExecutor::new(g).unwrap();
            ex.set_fusion(fuse);
            let (r, y) = run_scanned(&mut ex, ins, mode);
            (fuse, node, r, y)
        })
        .collect()
}

/// A rayon pool of `threads` threads, one per count for the whole test binary: the kernels'
/// per-thread scratch buffers then carry values from earlier cases (other geometries), so
/// a padding column or output element left unwritten shows.
#[allow(dead_code)]
pub fn pool(threads: usize) -> &'static rayon::ThreadPool {
    use std::sync::OnceLock;
    static POOLS: [OnceLock<rayon::ThreadPool>; 4] = [const { OnceLock::new() }; 4];
    POOLS[threads].get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    })
}

/// True where RLX's AVX-512 kernels run: AVX-512F and AVX-512VL, not capped by
/// `RLX_CPU_ISA=avx2|portable`, and the kernel's own switch `off` (if any) not `0`.
#[allow(dead_code)]
pub fn avx512_kernels(off: Option<&str>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let capped = matches!(
            rlx_ir::env::get("RLX_CPU_ISA").as_deref().map(str::trim),
            Some("avx2" | "portable")
        );
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && !capped
            && !off.is_some_and(rlx_ir::env::is_off)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = off;
        false
    }
}

/// True where RLX's packed conv kernel takes the convs it packs ([`avx512_kernels`],
/// not switched off by `RLX_CPU_MK=0`).
#[allow(dead_code)]
pub fn packed_on() -> bool {
    avx512_kernels(Some("RLX_CPU_MK"))
}
