//! The test-only planted kernel bugs make wgpu diverge from the CPU, and the divergence is
//! localized to the planted kernel's node (first node whose value differs, in topological
//! order, while its inputs agree). Its own process: the switch is global.

mod common;
use common::*;
use rlx_cpu::CpuExecutor;
use rlx_ir::*;
use rlx_wgpu::testing::{set_planted_bug, PlantedBug};
use rlx_wgpu::WgpuExecutor;

fn first_divergence(g: &Graph, inputs: &[Tensor], tol: f64) -> Option<NodeId> {
    let mut c = CpuExecutor::new(g.clone()).unwrap();
    let mut cpu: Vec<Option<Tensor>> = vec![None; g.len()];
    let mut f = |id: NodeId, t: &Tensor| cpu[id.index()] = Some(t.clone());
    c.run_observed(inputs, None, &mut f).unwrap();
    let gpu = WgpuExecutor::new(g.clone())
        .unwrap()
        .run_all(inputs)
        .unwrap();
    assert_no_uncaptured();
    g.nodes.iter().map(|n| n.id).find(|id| {
        let (a, b) = (
            gpu[id.index()].as_ref().unwrap(),
            cpu[id.index()].as_ref().unwrap(),
        );
        a.dtype() == DType::F32 && max_rel("node", a, b) > tol
    })
}

#[test]
fn planted_bugs_are_caught_and_localized() {
    if !gpu_available() {
        return;
    }
    let mut g = Graph::new("layer");
    let x = g.input("x", Shape::new(&[4, 100], DType::F32));
    let w = g.input("w", Shape::new(&[100, 40], DType::F32));
    let h = g.matmul(x, w, Shape::new(&[4, 40], DType::F32));
    let r = g.activation(Activation::Tanh, h, Shape::new(&[4, 40], DType::F32));
    let s = g.add_node(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        },
        vec![x],
        Shape::new(&[4], DType::F32),
    );
    g.set_outputs(vec![r, s]);
    let inputs = [rand_tensor(&[4, 100], 1), rand_tensor(&[100, 40], 2)];

    set_planted_bug(None);
    assert_eq!(
        first_divergence(&g, &inputs, 1e-3),
        None,
        "correct kernels agree with the CPU"
    );

    set_planted_bug(Some(PlantedBug::MatMulDropLastK));
    assert_eq!(
        first_divergence(&g, &inputs, 1e-3),
        Some(h),
        "dropped k-tile is localized to the MatMul"
    );

    set_planted_bug(Some(PlantedBug::ReduceSumSkipLast));
    assert_eq!(
        first_divergence(&g, &inputs, 1e-3),
        Some(s),
        "skipped element is localized to the ReduceSum"
    );

    set_planted_bug(None);
    std::env::set_var("RLX_TEST_PLANTED_BUG", "matmul_drop_last_k");
    let ex = WgpuExecutor::new(g.clone()).unwrap();
    assert_eq!(
        ex.planted_bug(),
        Some(PlantedBug::MatMulDropLastK),
        "env switch read at creation"
    );
    std::env::remove_var("RLX_TEST_PLANTED_BUG");
}
