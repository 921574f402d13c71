//! Conv weights prepared once and shared by every executor that holds the same constant:
//! a conv group's folded weights and bias (`fuse`), their Winograd transform and their
//! packed form for RLX's product kernel (`plan`). The plans of one dynamic model at
//! several sizes hold the same constants (`rlx_ir::Graph::constant_shared`, and a symbolic
//! template's graph compiled once), so a new size no longer folds, transforms and packs
//! the weights again, and N plans keep one copy instead of N (issue 32: "pre-packed
//! weights are shared by all plans").
//!
//! What is prepared depends on the weights alone; *whether* a conv takes a form depends on
//! its output size too (`winograd_takes`, `pack_form`) and stays each plan's decision.
//!
//! A constant is known by the address of its `Arc<Tensor>`. An entry holds that `Arc` (and
//! the bias's), so the address cannot be reused by another tensor while the entry exists,
//! and a constant's value cannot change under it (`Arc::get_mut` fails while shared). An
//! entry lives while an executor uses its value: each new plan and each dropped plan first
//! removes the entries nothing else holds, so the cache holds no weights of dropped models
//! beyond the next executor's build or drop.

use rlx_ir::Tensor;
use rlx_kernels::kernels::conv::{Packed, WinogradWeights};
use rlx_kernels::kernels::mm_packed::PackedB;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

#[cfg(target_arch = "x86_64")]
pub(crate) use rlx_kernels::kernels::conv::PackForm;
/// A stand-in where RLX's product kernel does not exist (no packed weights are made).
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PackForm {}

/// A constant's identity: the address of its shared tensor.
fn id(t: &Arc<Tensor>) -> usize {
    Arc::as_ptr(t) as usize
}

/// What a conv group's folded weights are made from: the conv's weights and bias (the
/// graph's constants) and the per-channel map `y = a·conv + b` after it (`fuse`).
#[derive(Debug, Clone)]
pub(crate) struct FoldSrc {
    pub w: Arc<Tensor>,
    pub bias: Option<Arc<Tensor>>,
    pub a: Vec<f64>,
    pub b: Vec<f64>,
}

impl FoldSrc {
    /// The cache's name for the weights folded from this source.
    fn key(&self) -> FoldKey {
        FoldKey {
            w: id(&self.w),
            bias: self.bias.as_ref().map(id),
            a: self.a.iter().map(|x| x.to_bits()).collect(),
            b: self.b.iter().map(|x| x.to_bits()).collect(),
        }
    }

    /// The constants the key names (kept alive with the entry: see the module's text).
    fn sources(&self) -> Vec<Arc<Tensor>> {
        [Some(&self.w), self.bias.as_ref()]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// Folded weights and bias by what they are made of: the conv's weights, its bias, and the
/// bits of the per-channel map `y = a·conv + b` folded in.
#[derive(PartialEq, Eq, Hash)]
struct FoldKey {
    w: usize,
    bias: Option<usize>,
    a: Vec<u64>,
    b: Vec<u64>,
}

/// Weights packed for the product kernel: a constant's, or a group's folded weights (known
/// by their [`FoldSrc`], so the packed copy outlives the unpacked folded one, which the
/// executor does not keep where the packed kernel alone reads it).
#[derive(PartialEq, Eq, Hash)]
enum PackSrc {
    Const(usize),
    Folded(FoldKey),
}

#[derive(PartialEq, Eq, Hash)]
enum Key {
    Folded(FoldKey),
    Winograd(usize),
    Packed(PackSrc, PackForm),
    Panels(usize),
}

#[derive(Clone)]
enum Value {
    Folded(Arc<Tensor>, Arc<Tensor>),
    Winograd(Arc<WinogradWeights>),
    Packed(Arc<Packed>),
    Panels(Arc<PackedB>),
}

impl Value {
    /// Whether anything but the cache holds the value.
    fn in_use(&self) -> bool {
        match self {
            // The weights decide: an executor may keep a group's folded bias but not its
            // weights (`fuse::Folded::w`), and the entry must not keep them for it.
            Value::Folded(w, _) => Arc::strong_count(w) > 1,
            Value::Winograd(v) => Arc::strong_count(v) > 1,
            Value::Packed(v) => Arc::strong_count(v) > 1,
            Value::Panels(v) => Arc::strong_count(v) > 1,
        }
    }
}

struct Entry {
    /// The constants the key names (kept alive: see the module's text).
    _sources: Vec<Arc<Tensor>>,
    value: Value,
}

fn cache() -> MutexGuard<'static, HashMap<Key, Entry>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Entry>>> = OnceLock::new();
    let m = CACHE.get_or_init(Default::default);
    // A panic while the lock was held left the map consistent (inserts are single calls).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the entries nothing else holds, until none is left to remove (a folded weight
/// is held by the Winograd or packed entry made from it until that entry goes).
pub(crate) fn release_unused() {
    let mut c = cache();
    loop {
        let before = c.len();
        c.retain(|_, e| e.value.in_use());
        if c.len() == before {
            break;
        }
    }
}

/// Looks `key` up; on a miss, makes the value outside the lock (two plans built at once
/// may both make it; the first one stored is kept and given to both).
fn get_or_make(
    key: Key,
    sources: impl FnOnce() -> Vec<Arc<Tensor>>,
    make: impl FnOnce() -> Option<Value>,
) -> Option<Value> {
    if let Some(e) = cache().get(&key) {
        return Some(e.value.clone());
    }
    let value = make()?;
    let mut c = cache();
    let e = c.entry(key).or_insert(Entry {
        _sources: sources(),
        value,
    });
    Some(e.value.clone())
}

/// The folded weights and bias of a conv group made from `src`: from the cache, else
/// `fold()`.
pub(crate) fn folded(
    src: &FoldSrc,
    fold: impl FnOnce() -> Option<(Tensor, Tensor)>,
) -> Option<(Arc<Tensor>, Arc<Tensor>)> {
    let make = || fold().map(|(w, b)| Value::Folded(Arc::new(w), Arc::new(b)));
    match get_or_make(Key::Folded(src.key()), || src.sources(), make)? {
        Value::Folded(w, b) => Some((w, b)),
        _ => None,
    }
}

/// The Winograd transform of the 3×3 weights `w` (`winograd_transform`), shared.
pub(crate) fn winograd(w: &Arc<Tensor>) -> Option<Arc<WinogradWeights>> {
    let make =
        || rlx_kernels::kernels::conv::winograd_transform(w).map(|v| Value::Winograd(Arc::new(v)));
    match get_or_make(Key::Winograd(id(w)), || vec![w.clone()], make)? {
        Value::Winograd(v) => Some(v),
        _ => None,
    }
}

/// A MatMul's constant weights `w` ([K, N] f32) packed in column panels
/// (`kernels::mm_packed`), shared; `None` where that path is not taken.
pub(crate) fn panels(w: &Arc<Tensor>) -> Option<Arc<PackedB>> {
    let make = || rlx_kernels::kernels::mm_packed::pack(w).map(|v| Value::Panels(Arc::new(v)));
    match get_or_make(Key::Panels(id(w)), || vec![w.clone()], make)? {
        Value::Panels(v) => Some(v),
        _ => None,
    }
}

/// Weights packed in `form` for RLX's product kernel, shared: the constant `w` of the
/// graph, or (with `src`) the weights a conv group folds from `src`. Folded weights are
/// folded for the packing where the cache holds no such packed copy (or takes the cache's
/// folded copy), and are not kept for it: the entry is known by `src`, not by them.
pub(crate) fn packed(
    w: &Arc<Tensor>,
    form: PackForm,
    src: Option<&FoldSrc>,
) -> Option<Arc<Packed>> {
    #[cfg(target_arch = "x86_64")]
    {
        let make = || {
            let w = match src {
                None => w.clone(),
                Some(src) => match cache().get(&Key::Folded(src.key())) {
                    Some(Entry {
                        value: Value::Folded(w, _),
                        ..
                    }) => w.clone(),
                    _ => Arc::new(crate::fuse::fold_src(src)?.0),
                },
            };
            form.pack(&w).map(|v| Value::Packed(Arc::new(v)))
        };
        let (key, sources) = match src {
            Some(s) => (PackSrc::Folded(s.key()), s.sources()),
            None => (PackSrc::Const(id(w)), vec![w.clone()]),
        };
        match get_or_make(Key::Packed(key, form), || sources, make)? {
            Value::Packed(v) => Some(v),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, src);
        match form {}
    }
}

#[cfg(test)]
mod tests {
    use crate::CpuExecutor;
    use rlx_ir::{Activation, ConvAttrs, DType, Graph, Op, Shape, Tensor};
    use std::sync::{Arc, Weak};

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn t(dims: &[usize], seed: u64) -> Arc<Tensor> {
        let n = dims.iter().product();
        Arc::new(Tensor::from_f32(dims, rnd(n, seed)).unwrap())
    }

    fn sh(d: &[usize]) -> Shape {
        Shape::new(d, DType::F32)
    }

    /// The model's constants: a 1×1 conv 128 -> 256 (packed where RLX's product kernel
    /// runs), a 3×3 conv 256 -> 32 with bias (Winograd), and the per-channel scale and
    /// shift after it (folded into the 3×3 conv's weights).
    struct Consts {
        w0: Arc<Tensor>,
        w1: Arc<Tensor>,
        b1: Arc<Tensor>,
        scale: Arc<Tensor>,
        shift: Arc<Tensor>,
    }

    /// `relu(conv3x3(conv1x1(x)) * scale + shift)` on `x: [1, 128, hw, hw]`.
    fn graph(c: &Consts, hw: usize) -> Graph {
        let mut g = Graph::new("prepared");
        let x = g.input("x", sh(&[1, 128, hw, hw]));
        let mid = sh(&[1, 256, hw, hw]);
        let out = sh(&[1, 32, hw, hw]);
        let attrs = |k: usize| ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(k / 2, k / 2); 2],
            dilations: vec![1, 1],
            groups: 1,
        };
        let w0 = g.constant_shared(c.w0.clone());
        let y = g.add_node(Op::Conv(attrs(1)), vec![x, w0], mid);
        let w1 = g.constant_shared(c.w1.clone());
        let b1 = g.constant_shared(c.b1.clone());
        let y = g.add_node(Op::Conv(attrs(3)), vec![y, w1, b1], out.clone());
        let k = g.constant_shared(c.scale.clone());
        let s = g.constant_shared(c.shift.clone());
        let y = g.mul(y, k, out.clone());
        let y = g.add(y, s, out.clone());
        let y = g.add_node(Op::Activation(Activation::Relu), vec![y], out);
        g.set_outputs(vec![y]);
        g
    }

    /// The same constants, copied (other addresses: nothing shared with `c`).
    fn copied(c: &Consts) -> Consts {
        let cp = |t: &Arc<Tensor>| Arc::new((**t).clone());
        Consts {
            w0: cp(&c.w0),
            w1: cp(&c.w1),
            b1: cp(&c.b1),
            scale: cp(&c.scale),
            shift: cp(&c.shift),
        }
    }

    fn run(e: &mut CpuExecutor, hw: usize) -> Vec<u32> {
        let x = Tensor::from_f32(&[1, 128, hw, hw], rnd(128 * hw * hw, 9)).unwrap();
        let y = e.run(&[x], None).unwrap();
        y[0].as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The 3×3 group's folded weights and Winograd transform, the 1×1 conv's packed
    /// weights (None where RLX's product kernel does not run).
    type Held = (
        Arc<Tensor>,
        Option<Arc<super::WinogradWeights>>,
        Option<Arc<super::Packed>>,
    );

    fn held(e: &CpuExecutor) -> Held {
        let grp = e
            .plan
            .convs()
            .find(|c| c.grp.folded.is_some())
            .expect("a folded group");
        let folded = (grp.grp.folded.as_ref().unwrap().w.clone())
            .expect("a Winograd group keeps its folded weights");
        let packed = e
            .plan
            .packed
            .iter()
            .flatten()
            .next()
            .cloned()
            .or_else(|| e.plan.convs().find_map(|c| c.packed.clone()));
        (folded, grp.wino.clone(), packed)
    }

    #[test]
    fn plans_at_two_sizes_share_prepared_weights_and_compute_as_unshared_ones() {
        let c = Consts {
            w0: t(&[256, 128, 1, 1], 1),
            w1: t(&[32, 256, 3, 3], 2),
            b1: t(&[32], 3),
            scale: Arc::new(
                Tensor::from_f32(
                    &[32, 1, 1],
                    rnd(32, 4).iter().map(|v| 0.5 + v.abs()).collect(),
                )
                .unwrap(),
            ),
            shift: t(&[32, 1, 1], 5),
        };
        let mut e8 = CpuExecutor::new(graph(&c, 8)).unwrap();
        let mut e7 = CpuExecutor::new(graph(&c, 7)).unwrap();
        let (f8, w8, p8) = held(&e8);
        let (f7, w7, p7) = held(&e7);
        assert!(Arc::ptr_eq(&f8, &f7), "one folded copy for both plans");
        let (w8, w7) = (w8.expect("Winograd at 8x8"), w7.expect("Winograd at 7x7"));
        assert!(
            Arc::ptr_eq(&w8, &w7),
            "one Winograd transform for both plans"
        );
        assert_eq!(p8.is_some(), p7.is_some());
        if let (Some(p8), Some(p7)) = (&p8, &p7) {
            assert!(Arc::ptr_eq(p8, p7), "one packed copy for both plans");
        }
        // The shared values compute what values prepared apart do, bit for bit.
        let other = copied(&c);
        for (e, hw) in [(&mut e8, 8), (&mut e7, 7)] {
            let mut apart = CpuExecutor::new(graph(&other, hw)).unwrap();
            assert!(
                !Arc::ptr_eq(&held(&apart).0, &f8),
                "copied weights share nothing"
            );
            assert_eq!(run(e, hw), run(&mut apart, hw), "{hw}x{hw}");
        }
        // Another scale folds anew: the key holds the folded map, not only the weights.
        let c2 = Consts {
            scale: Arc::new(Tensor::from_f32(&[32, 1, 1], vec![2.0; 32]).unwrap()),
            ..copied(&c)
        };
        let c2 = Consts {
            w1: c.w1.clone(),
            b1: c.b1.clone(),
            ..c2
        };
        let e2 = CpuExecutor::new(graph(&c2, 8)).unwrap();
        assert!(
            !Arc::ptr_eq(&held(&e2).0, &f8),
            "a different scale is a different fold"
        );
        // Dropping the plans lets the cache go of what they prepared.
        let weak: (
            Weak<Tensor>,
            Weak<super::WinogradWeights>,
            Option<Weak<super::Packed>>,
        ) = (
            Arc::downgrade(&f8),
            Arc::downgrade(&w8),
            p8.as_ref().map(Arc::downgrade),
        );
        drop((f8, f7, w8, w7, p8, p7, e8, e7, e2));
        assert!(weak.0.upgrade().is_none(), "folded weights released");
        assert!(weak.1.upgrade().is_none(), "Winograd transform released");
        assert!(
            weak.2.and_then(|w| w.upgrade()).is_none(),
            "packed weights released"
        );
    }

    /// `y = conv1x1(x, w) * scale + shift` on `x: [1, 128, 7, 7]` (64 output channels, a
    /// conv RLX's product kernel takes where it runs), with `w`, `scale`, `shift` given.
    fn pointwise_graph(
        w: Arc<Tensor>,
        bias: Option<Arc<Tensor>>,
        chain: Option<(Arc<Tensor>, Arc<Tensor>)>,
    ) -> Graph {
        let mut g = Graph::new("pointwise");
        let x = g.input("x", sh(&[1, 128, 7, 7]));
        let out = sh(&[1, 64, 7, 7]);
        let attrs = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![(0, 0); 2],
            dilations: vec![1, 1],
            groups: 1,
        };
        let mut ins = vec![x, g.constant_shared(w)];
        ins.extend(bias.map(|b| g.constant_shared(b)));
        let mut y = g.add_node(Op::Conv(attrs), ins, out.clone());
        if let Some((scale, shift)) = chain {
            let k = g.constant_shared(scale);
            let s = g.constant_shared(shift);
            y = g.mul(y, k, out.clone());
            y = g.add(y, s, out.clone());
        }
        g.set_outputs(vec![y]);
        g
    }

    #[test]
    fn packed_folded_groups_keep_no_unpacked_copy_and_compute_as_prefolded_weights() {
        let w = t(&[64, 128, 1, 1], 11);
        let scale: Vec<f32> = rnd(64, 12).iter().map(|v| 0.25 + v.abs()).collect();
        let shift = t(&[64, 1, 1], 13);
        let chain = || {
            Some((
                Arc::new(Tensor::from_f32(&[64, 1, 1], scale.clone()).unwrap()),
                shift.clone(),
            ))
        };
        let e1 = CpuExecutor::new(pointwise_graph(w.clone(), None, chain())).unwrap();
        let step = e1.plan.convs().next().expect("a fused group");
        let f = step.grp.folded.as_ref().expect("folded");
        let Some(p1) = step.packed.clone() else {
            // No product kernel on this CPU: the weights stay unpacked and are kept.
            assert!(
                f.w.is_some(),
                "unpacked weights kept where nothing is packed"
            );
            return;
        };
        assert!(f.w.is_none(), "no unpacked copy of packed folded weights");
        // The folded weights are not left in the cache either.
        assert!(
            super::cache().values().all(|e| match &e.value {
                super::Value::Folded(w, _) => !Arc::ptr_eq(w, &f.src.w),
                _ => true,
            }) && !super::cache().values().any(
                |e| matches!(&e.value, super::Value::Folded(w, _) if w.dims() == [64, 128, 1, 1])
            ),
            "folded weights released after packing"
        );
        // A second plan of the same constants shares the packed copy.
        let e2 = CpuExecutor::new(pointwise_graph(w.clone(), None, chain())).unwrap();
        let p2 = e2.plan.convs().next().and_then(|c| c.packed.clone());
        assert!(
            p2.is_some_and(|p2| Arc::ptr_eq(&p1, &p2)),
            "one packed copy"
        );
        // The same bits as the conv on weights folded by hand (`W·a`, `a·0 + b` in f64,
        // the fold's definition), which runs as a lone conv on the graph's constants.
        let wv = w.as_f32().unwrap();
        let sv = shift.as_f32().unwrap();
        let wf: Vec<f32> = (wv.iter().enumerate())
            .map(|(i, &x)| (x as f64 * scale[i / 128] as f64) as f32)
            .collect();
        let bf: Vec<f32> = (0..64)
            .map(|i| (0.0 * scale[i] as f64 + sv[i] as f64) as f32)
            .collect();
        let wf = Arc::new(Tensor::from_f32(&[64, 128, 1, 1], wf).unwrap());
        let bf = Arc::new(Tensor::from_f32(&[64], bf).unwrap());
        let mut by_hand = CpuExecutor::new(pointwise_graph(wf, Some(bf), None)).unwrap();
        let x = Tensor::from_f32(&[1, 128, 7, 7], rnd(128 * 49, 14)).unwrap();
        let bits = |e: &mut CpuExecutor| -> Vec<u32> {
            let y = e.run(std::slice::from_ref(&x), None).unwrap();
            y[0].as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        let mut e1 = e1;
        assert_eq!(bits(&mut e1), bits(&mut by_hand));
    }
}
