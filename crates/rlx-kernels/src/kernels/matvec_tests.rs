//! `matvec` paths (small-M kernels, 16-bit panels) against `matmul_perm_reference` (the
//! former path: whole operands widened to f32, one gemm, rounded once).
//!
//! Bounds, with u = 2⁻²⁴, γ = K·u and S = Σₜ|a·b| (in f64) for an output:
//! * f32: |new − ref| ≤ 2·γ·S (each is within γ·S of the exact sum, in any order);
//! * f16/bf16: equal, or adjacent 16-bit values whose midpoint (the rounding boundary)
//!   lies within 2·γ·S of the exact sum (the f32 sums straddle it by round-off), or,
//!   where cancellation makes 2·γ·S exceed an ulp, |new − ref| ≤ 2·γ·S + one ulp;
//! * NaN exactly where the reference has NaN, ±Inf exactly where it has the same Inf.

use super::matvec::{Simd, FORCE_SIMD, MV_MAX_M_COLS, MV_MAX_M_ROWS};
use super::*;
use rlx_ir::DType;
use std::sync::atomic::Ordering;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn tensor(dt: DType, dims: &[usize], v: &[f32]) -> Tensor {
    let data = match dt {
        DType::F32 => TensorData::F32(v.to_vec()),
        DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        _ => unreachable!(),
    };
    Tensor::new(dims.to_vec(), data).unwrap()
}

/// A product case: A is `[m, k]` (or stored `[k, m]` and transposed), B is `[k, n]`
/// (layout N) or stored `[n, k]` and transposed (layout T, the checkpoint layout).
struct Case {
    dt: DType,
    m: usize,
    k: usize,
    n: usize,
    bt: bool,
    at: bool,
}

impl Case {
    fn operands(&self, xa: &[f32], xb: &[f32]) -> (Tensor, Tensor) {
        let a = if self.at {
            tensor(self.dt, &[self.k, self.m], xa)
        } else {
            tensor(self.dt, &[self.m, self.k], xa)
        };
        let b = if self.bt {
            tensor(self.dt, &[self.n, self.k], xb)
        } else {
            tensor(self.dt, &[self.k, self.n], xb)
        };
        (a, b)
    }
    fn perms(&self) -> (Option<&'static [usize]>, Option<&'static [usize]>) {
        let t: &'static [usize] = &[1, 0];
        (self.at.then_some(t), self.bt.then_some(t))
    }
    /// Exact sum and Σ|a·b| (f64) of output (i, j), from the dtype's values.
    fn exact(&self, a: &[f64], b: &[f64], i: usize, j: usize) -> (f64, f64) {
        let (mut s, mut abs) = (0.0, 0.0);
        for t in 0..self.k {
            let x = if self.at {
                a[t * self.m + i]
            } else {
                a[i * self.k + t]
            };
            let w = if self.bt {
                b[j * self.k + t]
            } else {
                b[t * self.n + j]
            };
            s += x * w;
            abs += (x * w).abs();
        }
        (s, abs)
    }
    fn run(&self, xa: &[f32], xb: &[f32]) -> (Tensor, Tensor) {
        let (a, b) = self.operands(xa, xb);
        let (pa, pb) = self.perms();
        let shape = Shape::new(&[self.m, self.n], self.dt);
        let new = matmul_perm(&a, pa, &b, pb, &shape).unwrap();
        let old = matmul_perm_reference(&a, pa, &b, pb).unwrap();
        (new, old)
    }
}

/// The next 16-bit value above `v` in magnitude order (both finite, same sign assumed by
/// the caller's adjacency test).
fn adjacent(dt: DType, x: f64, y: f64) -> bool {
    let bits = |v: f64| -> i32 {
        let b = match dt {
            DType::F16 => f16::from_f64(v).to_bits(),
            _ => bf16::from_f64(v).to_bits(),
        } as i32;
        // Sign-magnitude to a monotone integer line.
        if b & 0x8000 != 0 {
            -(b & 0x7fff)
        } else {
            b
        }
    };
    (bits(x) - bits(y)).abs() == 1
}

/// The spacing of 16-bit values at magnitude `v`.
fn ulp16(dt: DType, v: f64) -> f64 {
    let (mant, emin) = match dt {
        DType::F16 => (10, -14),
        _ => (7, -126),
    };
    let e = if v > 0.0 {
        v.log2().floor() as i32
    } else {
        emin
    };
    2f64.powi(e.max(emin) - mant)
}

/// Checks `new` against `old` for a case; returns a description of the first failure.
fn check(c: &Case, xa: &[f32], xb: &[f32], new: &Tensor, old: &Tensor) -> Result<(), String> {
    if new.dims() != old.dims() || new.dtype() != old.dtype() {
        return Err(format!("shape/dtype {:?} vs {:?}", new.dims(), old.dims()));
    }
    let (a, b) = c.operands(xa, xb);
    let (a, b) = (a.data().to_f64_vec(), b.data().to_f64_vec());
    let (nv, ov) = (new.data().to_f64_vec(), old.data().to_f64_vec());
    let u = (f32::EPSILON / 2.0) as f64;
    for i in 0..c.m {
        for j in 0..c.n {
            let (y, o) = (nv[i * c.n + j], ov[i * c.n + j]);
            let at = || {
                format!(
                    "{:?} m={} k={} n={} bt={} at={} ({i},{j}): new {y} ref {o}",
                    c.dt, c.m, c.k, c.n, c.bt, c.at
                )
            };
            if o.is_nan() || y.is_nan() {
                if !(o.is_nan() && y.is_nan()) {
                    return Err(format!("NaN mismatch {}", at()));
                }
                continue;
            }
            if o.is_infinite() || y.is_infinite() {
                if o != y {
                    return Err(format!("Inf mismatch {}", at()));
                }
                continue;
            }
            if y == o {
                continue;
            }
            let (exact, abs) = c.exact(&a, &b, i, j);
            let tol = 2.0 * c.k as f64 * u * abs * 1.000_001 + 1e-44;
            let ok = match c.dt {
                DType::F32 => (y - o).abs() <= tol,
                // Adjacent values straddling the rounding boundary by round-off, or (with
                // cancellation, when 2γS exceeds an ulp) within 2γS plus one ulp.
                _ => {
                    (adjacent(c.dt, y, o) && (exact - (y + o) / 2.0).abs() <= tol)
                        || (y - o).abs() <= tol + ulp16(c.dt, y.abs().max(o.abs()))
                }
            };
            if !ok {
                return Err(format!("value {} exact {exact} tol {tol}", at()));
            }
        }
    }
    Ok(())
}

/// Held by the tests that pin an ISA through `FORCE_SIMD` (a global), so each runs its
/// ISA copies in turn.
static ISA_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn isas() -> Vec<u8> {
    let mut v = vec![3];
    if matvec::simd() != Simd::Plain {
        v.push(2);
    }
    if matvec::simd() == Simd::Avx512 {
        v.push(1);
    }
    v
}

const DTS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Every path (small M, panels; both B layouts; all ISA copies) against the reference on
/// shapes with odd K and N tails.
#[test]
fn matvec_matches_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    let _lock = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for isa in isas() {
        FORCE_SIMD.store(isa, Ordering::Relaxed);
        for dt in DTS {
            for &m in &[1, 2, 3, 7, 32, 64, 300] {
                for &k in &[1, 7, 17, 100, 1023] {
                    for &n in &[1, 3, 33, 257] {
                        for bt in [true, false] {
                            // The strided-A case only where it is cheap.
                            for at in [false, m <= 7 && n == 33] {
                                let c = Case {
                                    dt,
                                    m,
                                    k,
                                    n,
                                    bt,
                                    at,
                                };
                                let xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                                let xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
                                let (new, old) = c.run(&xa, &xb);
                                if let Err(e) = check(&c, &xa, &xb, &new, &old) {
                                    FORCE_SIMD.store(0, Ordering::Relaxed);
                                    panic!("isa {isa}: {e}");
                                }
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    FORCE_SIMD.store(0, Ordering::Relaxed);
    eprintln!("{cases} cases");
}

/// Large N (several threads' chunks, the parallel split) and the M threshold's edges.
#[test]
fn matvec_parallel_split_matches_reference() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut rng = Rng(7);
    pool.install(|| {
        for dt in DTS {
            for &(m, k, n) in &[
                (1, 256, 4099),
                (MV_MAX_M_COLS, 129, 2050),
                (MV_MAX_M_COLS + 1, 64, 600),
                (MV_MAX_M_ROWS, 100, 700),
                (MV_MAX_M_ROWS + 1, 64, 300),
                (5, 512, 1031),
            ] {
                for bt in [true, false] {
                    let c = Case {
                        dt,
                        m,
                        k,
                        n,
                        bt,
                        at: false,
                    };
                    let xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                    let xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
                    let (new, old) = c.run(&xa, &xb);
                    check(&c, &xa, &xb, &new, &old).unwrap();
                }
            }
        }
    });
}

/// NaN and Inf in x or W reach exactly the outputs where the widened f32 product has them;
/// bf16/f16 denormal weights are not flushed.
#[test]
fn matvec_nan_inf_denormal_positions() {
    let _lock = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for isa in isas() {
        FORCE_SIMD.store(isa, Ordering::Relaxed);
        for dt in DTS {
            for &(m, k, n) in &[(1, 37, 21), (3, 40, 19), (2, 16, 16), (20, 33, 300)] {
                for bt in [true, false] {
                    let c = Case {
                        dt,
                        m,
                        k,
                        n,
                        bt,
                        at: false,
                    };
                    let mut rng = Rng(11);
                    let mut xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                    let mut xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
                    let wi = |t: usize, j: usize| if bt { j * k + t } else { t * n + j };
                    // NaN in x[m-1, 5]: row m-1 all NaN.
                    xa[(m - 1) * k + 5] = f32::NAN;
                    // Column k1 of x: 1 except row 0 where it is 0; W[k1, 2] = Inf:
                    // output (0, 2) is Inf·0 = NaN, the others Inf.
                    let k1 = k - 1;
                    for i in 0..m {
                        xa[i * k + k1] = if i == 0 { 0.0 } else { 1.0 };
                    }
                    xb[wi(k1, 2)] = f32::INFINITY;
                    // Output column 4: +Inf and −Inf terms: NaN.
                    xa.iter_mut().skip(3).step_by(k).for_each(|v| *v = 2.0);
                    xa.iter_mut().skip(4).step_by(k).for_each(|v| *v = 2.0);
                    xb[wi(3, 4)] = f32::INFINITY;
                    xb[wi(4, 4)] = f32::NEG_INFINITY;
                    // Column 6: a −Inf weight alone (−Inf where x is finite, nonzero).
                    xb[wi(3, 6)] = f32::NEG_INFINITY;
                    // Column 7: denormal weights times a large x (no flush to zero).
                    let tiny = match dt {
                        DType::F16 => 3e-6,
                        DType::BF16 => 1e-39,
                        _ => 1e-40,
                    };
                    for t in 0..k {
                        xb[wi(t, 7)] = tiny;
                    }
                    let (new, old) = c.run(&xa, &xb);
                    if let Err(e) = check(&c, &xa, &xb, &new, &old) {
                        FORCE_SIMD.store(0, Ordering::Relaxed);
                        panic!("isa {isa}: {e}");
                    }
                    let nv = new.data().to_f64_vec();
                    assert!((0..n).all(|j| nv[(m - 1) * n + j].is_nan()));
                    assert!(nv[2].is_nan());
                    assert!(m < 3 || nv[n + 2] == f64::INFINITY);
                    // Row 0 is the NaN row when m == 1.
                    assert!(m < 2 || (nv[4].is_nan() && nv[6] == f64::NEG_INFINITY));
                    assert!(m < 2 || nv[7] != 0.0, "denormal weights flushed");
                }
            }
        }
    }
    FORCE_SIMD.store(0, Ordering::Relaxed);
}

/// Batched and broadcast 16-bit products (per-batch `matvec` products) against the
/// reference.
#[test]
fn matvec_batched_matches_reference() {
    let mut rng = Rng(3);
    for dt in DTS {
        for &(ad, bd, bperm) in &[
            (&[2usize, 3, 20][..], &[2usize, 20, 9][..], None),
            (&[4, 1, 64][..], &[4, 33, 64][..], Some(&[0usize, 2, 1][..])),
            (&[2, 40, 16][..], &[16, 70][..], None),
            (&[3, 300, 8][..], &[3, 8, 5][..], None),
        ] {
            let xa: Vec<f32> = (0..ad.iter().product::<usize>())
                .map(|_| rng.next())
                .collect();
            let xb: Vec<f32> = (0..bd.iter().product::<usize>())
                .map(|_| rng.next())
                .collect();
            let (a, b) = (tensor(dt, ad, &xa), tensor(dt, bd, &xb));
            let old = matmul_perm_reference(&a, None, &b, bperm).unwrap();
            let new = matmul_perm(&a, None, &b, bperm, &Shape::new(old.dims(), dt)).unwrap();
            assert_eq!(new.dims(), old.dims());
            let (nv, ov) = (new.data().to_f64_vec(), old.data().to_f64_vec());
            for (y, o) in nv.iter().zip(&ov) {
                let ok = y == o
                    || match dt {
                        DType::F32 => (y - o).abs() <= 1e-5 * (1.0 + o.abs()),
                        _ => adjacent(dt, *y, *o),
                    };
                assert!(ok, "{dt:?} {ad:?}·{bd:?}: {y} vs {o}");
            }
        }
    }
}

/// Median seconds of `f` over `reps` runs (after one warm-up).
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

/// Decode-shaped products, new path against the former (gemm, 16-bit widened whole):
/// `cargo test --release -p rlx-kernels --lib matvec_bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn matvec_bench() {
    let mut rng = Rng(5);
    let shapes = [
        (1usize, 1024usize, 3072usize),
        (1, 3072, 1024),
        (1, 1024, 151936),
    ];
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for dt in [DType::F32, DType::BF16] {
            for &(m, k, n) in &shapes {
                for bt in [true, false] {
                    let c = Case {
                        dt,
                        m,
                        k,
                        n,
                        bt,
                        at: false,
                    };
                    let xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                    let xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
                    let (a, b) = c.operands(&xa, &xb);
                    let (pa, pb) = c.perms();
                    let shape = Shape::new(&[m, n], dt);
                    let bytes = (k * n * dt.size_bytes()) as f64;
                    let reps = if n > 100_000 { 7 } else { 31 };
                    let (tn, to) = pool.install(|| {
                        let tn = median(reps, || {
                            std::hint::black_box(matmul_perm(&a, pa, &b, pb, &shape).unwrap());
                        });
                        let to = median(
                            if n > 100_000 && dt != DType::F32 {
                                3
                            } else {
                                reps
                            },
                            || {
                                std::hint::black_box(
                                    matmul_perm_reference(&a, pa, &b, pb).unwrap(),
                                );
                            },
                        );
                        (tn, to)
                    });
                    println!(
                        "threads {threads} {:>4} {m}x{k}·{k}x{n} B{}: new {:8.3} ms {:6.1} GB/s | old {:8.3} ms {:6.1} GB/s | {:5.1}x",
                        format!("{dt:?}"),
                        if bt { "ᵀ[N,K]" } else { " [K,N]" },
                        tn * 1e3,
                        bytes / tn / 1e9,
                        to * 1e3,
                        bytes / to / 1e9,
                        to / tn
                    );
                }
            }
        }
    }
}

/// Rows per product around the small-M threshold and prefill:
/// `cargo test --release -p rlx-kernels --lib matvec_m_sweep -- --ignored --nocapture`.
#[test]
#[ignore]
fn matvec_m_sweep() {
    let mut rng = Rng(9);
    let (k, n) = (1024, 3072);
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for dt in [DType::F32, DType::BF16] {
            for &m in &[1usize, 2, 4, 8, 12, 16, 32, 512] {
                let c = Case {
                    dt,
                    m,
                    k,
                    n,
                    bt: true,
                    at: false,
                };
                let xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
                let xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
                let (a, b) = c.operands(&xa, &xb);
                let (pa, pb) = c.perms();
                let shape = Shape::new(&[m, n], dt);
                let (ta, tb, tr) = pool.install(|| {
                    let mut out = vec![0f32; m * n];
                    fn av<T>(d: &[T], k: usize) -> View<'_, T> {
                        View {
                            data: d,
                            off: 0,
                            rs: k,
                            cs: 1,
                        }
                    }
                    fn bv<T>(d: &[T], k: usize) -> View<'_, T> {
                        View {
                            data: d,
                            off: 0,
                            rs: 1,
                            cs: k,
                        }
                    }
                    let (ta, tb) = match (a.data(), b.data()) {
                        (TensorData::F32(x), TensorData::F32(y)) => (
                            median(15, || unsafe {
                                matvec::small_m(
                                    m,
                                    n,
                                    k,
                                    av(x, k),
                                    bv(y, k),
                                    matvec::Layout::Rows,
                                    out.as_mut_ptr(),
                                    true,
                                )
                            }),
                            median(15, || {
                                let d = unsafe {
                                    &mut *(out.as_mut_slice() as *mut [f32]
                                        as *mut [std::mem::MaybeUninit<f32>])
                                };
                                gemm_uninit(m, n, k, av(x, k), bv(y, k), d, true).unwrap()
                            }),
                        ),
                        (TensorData::BF16(x), TensorData::BF16(y)) => {
                            let mut o16 = vec![bf16::ZERO; m * n];
                            (
                                median(15, || unsafe {
                                    matvec::small_m(
                                        m,
                                        n,
                                        k,
                                        av(x, k),
                                        bv(y, k),
                                        matvec::Layout::Rows,
                                        o16.as_mut_ptr(),
                                        true,
                                    )
                                }),
                                median(15, || unsafe {
                                    matvec::panels(
                                        m,
                                        n,
                                        k,
                                        av(x, k),
                                        bv(y, k),
                                        o16.as_mut_ptr(),
                                        true,
                                    )
                                    .unwrap()
                                }),
                            )
                        }
                        _ => unreachable!(),
                    };
                    let tr = median(7, || {
                        std::hint::black_box(matmul_perm_reference(&a, pa, &b, pb).unwrap());
                    });
                    let _ = &shape;
                    (ta, tb, tr)
                });
                println!(
                    "threads {threads} {:>4} m={m:3} {k}x{n}: small_m {:8.3} ms | {} {:8.3} ms | old {:8.3} ms",
                    format!("{dt:?}"),
                    ta * 1e3,
                    if dt == DType::F32 { "gemm  " } else { "panels" },
                    tb * 1e3,
                    tr * 1e3
                );
            }
        }
    }
}

/// bfloat16 products of more than `MV_MAX_M_ROWS` rows against `[N, K]` weights with
/// `K % 32 == 0` and `N % 32 == 0` take the AMX path where the CPU has it
/// (`kernels::amx`); the same bound as every other path holds (random operands are normal
/// numbers, so AMX's subnormal flush does not show). Also checks that a product the AMX
/// path refuses (`K % 32 != 0`) still matches.
#[test]
fn bf16_prefill_products_match_reference() {
    let mut rng = Rng(0x5eed_a3c5);
    let dt = DType::BF16;
    for &(m, k, n, bt) in &[
        (33, 32, 32, true),
        (64, 96, 128, true),
        (300, 128, 64, true),
        (65, 100, 64, true),
        (64, 96, 128, false),
    ] {
        let c = Case {
            dt,
            m,
            k,
            n,
            bt,
            at: false,
        };
        let xa: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
        let xb: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
        let (new, old) = c.run(&xa, &xb);
        if let Err(e) = check(&c, &xa, &xb, &new, &old) {
            panic!(
                "amx={} {m}x{k}x{n} bt={bt}: {e}",
                crate::kernels::amx::available()
            );
        }
    }
}
