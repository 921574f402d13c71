//! What every conv path shares: the geometry ([`Geo`]), the per-thread scratch buffers,
//! the epilogue pieces (bias, [`Clamp`], [`Post`], [`Residual`]) and gemm's packing guard.
//! The algorithm files import from here and not from one another.

use crate::kernels::gemm_calls::GemmElem;
use crate::kernels::wide::map_inplace;
use crate::kernels::{invalid, Elem, KResult};
use rlx_ir::ConvAttrs;
use std::cell::RefCell;
use std::sync::atomic::AtomicU32;

pub(super) struct Geo {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) m: usize,
    pub(super) groups: usize,
    pub(super) sp: Vec<usize>,
    pub(super) ks: Vec<usize>,
    pub(super) osp: Vec<usize>,
    pub(super) strides: Vec<usize>,
    pub(super) pads: Vec<(usize, usize)>,
    pub(super) dil: Vec<usize>,
}

impl Geo {
    /// Every kernel dim 1, stride 1, no padding: the conv is a product of the weights and
    /// the input planes as they are (no im2col).
    pub(super) fn direct(&self) -> bool {
        self.ks.iter().all(|&k| k == 1)
            && self.strides.iter().all(|&s| s == 1)
            && self.pads.iter().all(|&p| p == (0, 0))
    }

    /// 2-D with one filter per channel (groups == C == M > 1).
    pub(super) fn depthwise_2d(&self) -> bool {
        self.sp.len() == 2 && self.groups == self.c && self.m == self.c && self.groups > 1
    }
}

pub(super) fn geometry(x: &[usize], w: &[usize], a: &ConvAttrs, od: &[usize]) -> KResult<Geo> {
    if x.len() < 3 || w.len() != x.len() || od.len() != x.len() {
        return invalid(format!(
            "conv: x {x:?}, w {w:?}, out {od:?} ranks do not fit NC*spatial"
        ));
    }
    let nd = x.len() - 2;
    let g = a.groups.max(1);
    let (n, c, m) = (x[0], x[1], w[0]);
    if c % g != 0 || m % g != 0 || w[1] != c / g {
        return invalid(format!(
            "conv: x {x:?} and w {w:?} do not fit groups={g} (w[1] must be C/groups)"
        ));
    }
    let get = |v: &Vec<usize>, d: usize| if v.is_empty() { vec![d; nd] } else { v.clone() };
    let strides = get(&a.strides, 1);
    let dil = get(&a.dilations, 1);
    let pads = if a.pads.is_empty() {
        vec![(0, 0); nd]
    } else {
        a.pads.clone()
    };
    if strides.len() != nd || dil.len() != nd || pads.len() != nd {
        return invalid("conv: strides/dilations/pads need one entry per spatial axis");
    }
    let sp = x[2..].to_vec();
    let ks = w[2..].to_vec();
    let mut osp = vec![];
    for i in 0..nd {
        let span = dil[i] * (ks[i].max(1) - 1) + 1;
        let padded = sp[i] + pads[i].0 + pads[i].1;
        let o = if padded >= span && strides[i] > 0 {
            (padded - span) / strides[i] + 1
        } else {
            0
        };
        osp.push(o);
    }
    if od[0] != n || od[1] != m || od[2..] != osp[..] {
        return invalid(format!(
            "conv: computed output [{n}, {m}, {osp:?}] but the node declares {od:?}"
        ));
    }
    Ok(Geo {
        n,
        c,
        m,
        groups: g,
        sp,
        ks,
        osp,
        strides,
        pads,
        dil,
    })
}

thread_local! {
    /// im2col's column matrix (and Winograd's transformed input), kept between calls on
    /// each thread (8-byte words, viewed as f32 or f64): no allocation, page faults or
    /// zeroing per conv.
    pub(super) static COL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// A second such buffer, for Winograd's 16 products while COL holds its input.
    pub(super) static PRODUCTS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// A third, for [`im2col_2d`]'s column phases of a strided conv's input rows.
    pub(super) static PHASES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// A fourth, for the product tiles' inputs copied into tile panels
    /// (`packed::fill_panels`).
    pub(super) static PANELS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Scratch buffers above this many bytes are allocated per call instead of kept.
const COL_KEEP_MAX: usize = 64 << 20;

/// Runs `f` on a buffer of `len` elements whose contents are unspecified (left over from
/// earlier calls, but always initialized): the caller overwrites what it reads.
pub(super) fn with_col<T: GemmElem, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    with_scratch(&COL, len, f)
}

/// [`with_col`] on the thread-local buffer `key`.
pub(super) fn with_scratch<T: GemmElem, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<u64>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let bytes = len * std::mem::size_of::<T>();
    if bytes > COL_KEEP_MAX {
        return f(&mut vec![T::ZERO; len]);
    }
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut buf) => {
            // Up to 7 words more, so that the slice can start on a 64-byte boundary (the
            // kernels' zmm loads and stores of it then touch one cache line each).
            let words = bytes.div_ceil(8) + 7;
            if buf.len() < words {
                buf.resize(words, 0);
            }
            let off = buf.as_ptr().align_offset(64).min(7);
            // SAFETY: GemmElem is implemented only for f32 and f64: every bit pattern is
            // a valid value, their alignment (4 or 8) divides u64's, and the `words − off`
            // u64s from `off` hold `len` of them.
            let s = unsafe {
                std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(off).cast::<T>(), len)
            };
            f(s)
        }
        Err(_) => f(&mut vec![T::ZERO; len]),
    })
}

/// Splits `row` (W values) into its `s` column phases, one after another in `out` (W
/// values): phase `q` holds columns `q, q + s, …` and starts at `q·(W/s) + min(q, W mod s)`.
pub(super) fn split_columns<T: Copy>(row: &[T], s: usize, out: &mut [T]) {
    let w = row.len();
    if s == 2 {
        // Even columns then odd ones, in one pass (vectorizes as a deinterleave).
        let (ev, od) = out.split_at_mut(w.div_ceil(2));
        for ((e, o), pair) in ev.iter_mut().zip(od.iter_mut()).zip(row.chunks_exact(2)) {
            *e = pair[0];
            *o = pair[1];
        }
        if w % 2 == 1 {
            ev[w / 2] = row[w - 1];
        }
    } else {
        let mut k = 0;
        for q in 0..s {
            for &v in row.iter().skip(q).step_by(s) {
                out[k] = v;
                k += 1;
            }
        }
    }
}

/// A fused activation that a conv kernel applies to each output value in registers, before
/// its store, in place of a [`Post`] pass: `v ↦ minps(hi, maxps(lo, v))`. With x86's
/// `maxps`/`minps` operand rules that keeps a NaN `v` and a `v` equal to a bound, so it is
/// ONNX Relu for `(0, +inf)` (`if v < 0 {0} else {v}`: -0 stays -0, a NaN keeps its bits),
/// Clip for `(lo, hi)` with `nan_out` (RLX's Max/Min give the canonical `f32::NAN` for a
/// NaN operand), and the identity for `(-inf, +inf)` ([`Clamp::NONE`]). The im2col path
/// applies the same map to any element type `T` in its bias pass ([`bias_clamp`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clamp<T = f32> {
    pub lo: T,
    pub hi: T,
    /// A NaN `v` becomes `f32::NAN` (else it is kept as it is).
    pub nan_out: bool,
    /// The kernel also takes the largest |v| bits before the clamp (for the NaN scan; set
    /// by the kernel's driver when it is given somewhere to put them).
    pub track: bool,
}

impl Clamp {
    /// The identity.
    pub const NONE: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
        nan_out: false,
        track: false,
    };
    /// ONNX Relu.
    pub const RELU: Clamp = Clamp {
        lo: 0.0,
        hi: f32::INFINITY,
        nan_out: false,
        track: false,
    };
    /// ONNX Clip as RLX imports it (Max then Min).
    pub fn clip(lo: f32, hi: f32) -> Clamp {
        Clamp {
            lo,
            hi,
            nan_out: true,
            track: false,
        }
    }
}

/// An elementwise map run in place on output planes (a fused group's activation); it must
/// not depend on the element's position.
pub type Post<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

/// A [`Post`] that adds the run's per-channel bias (its second argument) first: the same
/// values as the bias pass and then `post`, in one pass over the run while it is in cache
/// (`rlx_cpu`'s SiLU: `fastmath::silu_bias_inplace`). Kernels that would add a bias to a run
/// and then call `post` on it (no residual, no clamp) may call this instead.
pub type PostBias<'a, T = f32> = &'a (dyn Fn(&mut [T], T) + Sync);

/// Shortest output plane that the depthwise conv hands to a [`Post`] on its own.
pub(super) const POST_MIN_RUN: usize = 1024;

/// Tasks per thread that the conv drivers cut a conv into when it runs over several threads
/// (`conv_float`'s own split at most this many row blocks per thread, the direct kernel's
/// blocks at least this many, the packed drivers' `Split` about this many): rayon hands
/// them out as threads free up, so a thread that runs slower (another guest on its core)
/// takes fewer. Measured at 2 threads: SqueezeNet's 128←32 at 27² and 16←64 at 55² through
/// conv_float 92-98 → 60-65 and 118 → 87 µs with 4 row blocks per thread against 1 (§34);
/// MobileNetV2's 96←576 at 14² through the packed kernel 263-268 → 199-206 µs (§35; the
/// direct kernel's 2 → 4 came with it, measured together: device host 0.95-1.01).
pub(super) const TASKS_PER_THREAD: usize = 4;

/// The [`Post`] that does nothing.
pub fn no_post(_: &mut [f32]) {}

/// The largest |bias| with which a [`Residual::Into`] accumulates onto `r` before the
/// bias (see [`super::conv_post`]).
pub(super) const BIAS_BEFORE_RESIDUAL: f32 = 18446744073709551616.0; // 2^64

/// A fused conv's residual operand `r` ([`super::conv_post`]). Values differ from the unfused
/// `Add(conv, r)` by rounding only, in the order of the sums.
pub enum Residual<'a, T = f32> {
    /// Read: `(conv + bias) + r`, added in the pass that adds the bias, as the unfused ops
    /// round it.
    Read(&'a [T]),
    /// A buffer (`r`'s values) the conv takes for its output: gemm's products accumulate
    /// onto it as it writes each tile, `(conv + r) + bias`, and no pass reads `r` again.
    /// The direct kernel reads it as [`Residual::Read`] and gives it back to the pool, and
    /// so does a conv with a bias above 2^64 in magnitude (the orders could then overflow
    /// in different places).
    Into(Vec<T>),
}

impl<T> Residual<'_, T> {
    pub(super) fn values(&self) -> &[T] {
        match self {
            Residual::Read(r) => r,
            Residual::Into(v) => v,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.values().len()
    }
}

/// `seg[j] = (seg[j] + b) + r[j]` (the bias, if any, then the residual `r`, in the unfused
/// ops' order: the conv's Add of its bias, then the graph's Add of the residual).
pub(super) fn add_bias_residual<T: Copy + std::ops::Add<Output = T>>(
    seg: &mut [T],
    b: Option<T>,
    r: &[T],
) {
    match b {
        Some(b) => seg.iter_mut().zip(r).for_each(|(v, &r)| *v = (*v + b) + r),
        None => seg.iter_mut().zip(r).for_each(|(v, &r)| *v = *v + r),
    }
}

/// One output row's epilogue before `post`, in the order conv_float applies it: the bias
/// (added with the residual `r`, the row's values of it, where there is one), the clamp,
/// and the largest |y| bits before the clamp folded into `seen` (see [`bias_clamp`]). The
/// row paths of conv_float and the packed drivers (`pack::finish_rows`) share it.
pub(super) fn row_epilogue<T: Elem + PartialOrd + std::ops::Add<Output = T>>(
    seg: &mut [T],
    mut b: Option<T>,
    r: Option<&[T]>,
    clamp: Option<Clamp<T>>,
    seen: Option<&AtomicU32>,
) {
    if let Some(r) = r {
        add_bias_residual(seg, b.take(), r);
    }
    let bits = bias_clamp(seg, b, clamp, seen.is_some());
    if let Some(s) = seen {
        s.fetch_max(bits, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One output row's bias `b` and activation `clamp` (its `lo`, `hi`, `nan_out`; `track` is
/// not read), in one pass: `maxps(lo, ·)` then `minps(hi, ·)` as scalar expressions, a NaN kept or,
/// with `nan_out`, made the canonical NaN. Each case is its own loop of selects with no
/// branch out of it, so each vectorizes.
///
/// With `track` and a clamp, returns the largest |v + b| bits before the clamp (as
/// [`crate::kernels::wide::max_abs_bits`] gives them; `u32::MAX`, which reads as "not finite", for a
/// dtype other than f32); else 0.
pub(super) fn bias_clamp<T: Elem + PartialOrd + std::ops::Add<Output = T>>(
    seg: &mut [T],
    b: Option<T>,
    clamp: Option<Clamp<T>>,
    track: bool,
) -> u32 {
    // The identity (a fused group without an activation) with nothing to track is no
    // clamp: a conv without a bias then needs no pass at all.
    let clamp = clamp.filter(|c| track || !is_identity(c));
    let Some(Clamp {
        lo, hi, nan_out, ..
    }) = clamp
    else {
        if let Some(b) = b {
            map_inplace(seg, |v| v + b);
        }
        return 0;
    };
    if track && crate::kernels::wide::is_f32::<T>() {
        // T is f32: these conversions are exact. No bias adds -0, which changes no value.
        let f = |x: T| x.to_f64() as f32;
        let seg = crate::kernels::wide::as_f32_mut(seg);
        return crate::kernels::wide::bias_clamp_bits(
            seg,
            b.map_or(-0.0, f),
            f(lo),
            f(hi),
            nan_out,
        );
    }
    let clamp = move |v: T| {
        let t = if lo > v { lo } else { v };
        if hi < t {
            hi
        } else {
            t
        }
    };
    match (b, nan_out) {
        (Some(b), false) => map_inplace(seg, |v| clamp(v + b)),
        (None, false) => map_inplace(seg, clamp),
        (b, true) => {
            let nan = T::from_f64(f64::NAN);
            // `move`: captured by reference, `nan` was read through a gather.
            #[allow(clippy::eq_op)] // t != t: NaN
            map_inplace(seg, move |v| {
                let t = match b {
                    Some(b) => v + b,
                    None => v,
                };
                let c = clamp(t);
                if t != t {
                    nan
                } else {
                    c
                }
            })
        }
    }
    if track {
        u32::MAX
    } else {
        0
    }
}

/// A raw output pointer shared by a kernel's tasks (each writes its own ranges: conv's
/// blocks, Winograd's slabs).
pub(super) struct SendPtr<T>(pub(super) *mut T);
// SAFETY: the tasks write disjoint element ranges through it (see conv_float).
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    pub(super) fn get(&self) -> *mut T {
        self.0
    }
}

/// A fused group's activation as a conv takes it ([`super::conv_post`],
/// [`super::pw_dw`](fn@super::pw_dw)): a clamp the kernels apply themselves, or (None) the
/// [`Post`] pass `post` over each output run. `clamp`, when given, must be the same map as
/// `post` (the Winograd path calls `post`). `seen` is for the NaN scan of a fused group,
/// which needs each value before the activation: the kernels that apply `clamp` fold the
/// largest |y| bits before it (as [`crate::kernels::wide::max_abs_bits`] gives them) into
/// `seen` in the same pass; the others call `post`, which must then take that figure itself.
#[derive(Clone, Copy)]
pub struct Act<'a> {
    pub clamp: Option<Clamp>,
    pub post: Post<'a>,
    /// `post` with the bias folded in ([`PostBias`]); only used without a clamp.
    pub post_bias: Option<PostBias<'a>>,
    pub seen: Option<&'a AtomicU32>,
}

impl<'a> Act<'a> {
    /// No activation, no scan.
    pub const NONE: Act<'static> = Act {
        clamp: None,
        post: &no_post,
        post_bias: None,
        seen: None,
    };

    /// `post`, or [`no_post`] where the clamp replaces it.
    pub(super) fn post_unless_clamped(&self) -> Post<'a> {
        if self.clamp.is_none() {
            self.post
        } else {
            &no_post
        }
    }

    /// The conv kernels' [`Epilogue`]: this activation after the per-channel `bias`.
    pub(super) fn with_bias(self, bias: Option<&'a [f32]>) -> Epilogue<'a> {
        Epilogue {
            bias,
            clamp: self.clamp,
            post: self.post,
            post_bias: self.post_bias.filter(|_| self.clamp.is_none()),
            seen: self.seen,
        }
    }
}

/// `c`'s map is the identity on every value: `(-inf, +inf)` without `nan_out`
/// ([`Clamp::NONE`]; `minps(+inf, maxps(-inf, v))` is `v`, a NaN included).
pub(super) fn is_identity<T: Elem + PartialOrd>(c: &Clamp<T>) -> bool {
    !c.nan_out && c.lo == T::from_f64(f64::NEG_INFINITY) && c.hi == T::from_f64(f64::INFINITY)
}

/// What a conv kernel does to each sum of products before it is the output value, in this
/// order: add `bias` (per output channel), add a residual where the path takes one (a
/// separate operand: [`Residual`]), then `clamp` in the kernel's own pass (in registers,
/// or in the bias pass), else `post` over each output run. With `seen` (only with a
/// clamp), the largest |y| bits before the clamp are folded into it.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a, T = f32> {
    pub bias: Option<&'a [T]>,
    pub clamp: Option<Clamp<T>>,
    pub post: &'a (dyn Fn(&mut [T]) + Sync),
    /// `post` after the bias, in one call ([`PostBias`]): `None`, or the same map as `post`
    /// (a site that replaces `post` clears it).
    pub post_bias: Option<PostBias<'a, T>>,
    pub seen: Option<&'a AtomicU32>,
}

impl Epilogue<'_> {
    /// The clamp a SIMD kernel applies in registers: the identity without one, tracking
    /// the largest |y| bits when there is somewhere to put them.
    pub(super) fn in_regs(&self) -> Clamp {
        Clamp {
            track: self.seen.is_some(),
            ..self.clamp.unwrap_or(Clamp::NONE)
        }
    }
}

/// Output columns `ox` in `[lo, hi)` whose input column `ox * sw + off - pl` lies inside
/// `[0, w)`, for a kernel tap at offset `off = kx * dilation`, left padding `pl`, stride `sw`
/// and `ow` output columns.
pub(super) fn inside_cols(off: usize, pl: usize, sw: usize, w: usize, ow: usize) -> (usize, usize) {
    let lo = if off >= pl {
        0
    } else {
        (pl - off).div_ceil(sw)
    };
    let hi = if w + pl > off {
        ((w + pl - off - 1) / sw + 1).min(ow)
    } else {
        0
    };
    (lo.min(hi), hi)
}
