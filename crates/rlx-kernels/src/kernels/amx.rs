//! bfloat16 matrix products on Intel AMX tiles (`TDPBF16PS`, Sapphire Rapids and later), for
//! the prefill-sized products of LLM layers: `y[m, n] = Σ_k x[m, k] · w[n, k]` with `x`
//! `[M, K]` activations and `w` `[N, K]` weights in the checkpoint's own (`nn.Linear`)
//! layout, all bfloat16: each output is accumulated in float32 and rounded to bfloat16 once
//! (round to nearest even, NaN kept quiet, as `half::bf16::from_f32`).
//!
//! Numerics (Intel SDM, `TDPBF16PS`; checked by this module's tests): every product of two
//! bfloat16 values is exact in float32 and is accumulated in float32 with round-to-nearest,
//! so the result is the one of the exact path (`matmul`: widen to f32, f32 accumulation, one
//! rounding) up to the order of the sums, except that **subnormal operands and subnormal
//! partial sums are flushed to zero** (the instruction ignores MXCSR and always flushes, as
//! oneDNN's bfloat16 kernels under PyTorch do on the same CPUs). NaN and ±inf propagate
//! (`inf · 0` is NaN). `RLX_CPU_AMX=0` turns the path off (the exact path runs).
//!
//! Layout: the weights are read in place as the A operand of the tile product (16 rows of
//! `w` × 32 values of `k` per tile); the activations are repacked once per call into the B
//! operand's pair-interleaved ("VNNI") form, 16 rows of `x` per block (`O(M·K)` work and
//! memory, against `O(M·N·K)` products). Each output tile comes out transposed (`n` × `m`)
//! and is written into `y` row-major. The product is split over the rayon pool by blocks of
//! 32 weight rows.
//!
//! Requires `K % 32 == 0` and `N % 32 == 0` (every Llama/Qwen projection; [`supported`]);
//! `M` is padded with zero rows internally.

use half::bf16;
use rayon::prelude::*;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of `x` per B tile and rows of `w` per A tile.
const T: usize = 16;
/// Values of `k` per tile step (16 pairs).
const KS: usize = 32;

/// Whether this process may use AMX bfloat16 tiles: the CPU has `amx-bf16` and `amx-tile`,
/// Linux granted the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// asked once), and `RLX_CPU_AMX` is not `0`.
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if rlx_ir::env::is_off("RLX_CPU_AMX") {
            return false;
        }
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (`is_x86_feature_detected!`
        // does not name AMX on stable Rust).
        let l7 = std::arch::x86_64::__cpuid_count(7, 0);
        if l7.edx & (1 << 22) == 0 || l7.edx & (1 << 24) == 0 {
            return false;
        }
        request_tile_permission()
    })
}

/// Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18)`; 0 on success.
fn request_tile_permission() -> bool {
    #[cfg(target_os = "linux")]
    {
        let r: i64;
        // SAFETY: a plain syscall with integer arguments; it only changes this process's
        // permitted xsave features.
        unsafe {
            asm!("syscall", inlateout("rax") 158i64 => r, in("rdi") 0x1023i64,
                 in("rsi") 18i64, lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        r == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether a product of these sizes can take the AMX path (see the module docs).
pub(crate) fn supported(m: usize, n: usize, k: usize) -> bool {
    m > 0 && n > 0 && k > 0 && k.is_multiple_of(KS) && n.is_multiple_of(2 * T) && available()
}

#[repr(C, align(64))]
struct TileCfg {
    palette: u8,
    start_row: u8,
    _reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Load the tile configuration of this module into the calling thread's tile registers:
/// tmm0-7 all 16 rows of 64 bytes (C: 16 × 16 f32; A: 16 rows × 32 bf16; B: 16 pairs × 16
/// columns × 2 bf16).
///
/// # Safety
/// [`available`] must have returned true in this process.
unsafe fn configure() {
    let mut c = TileCfg {
        palette: 1,
        start_row: 0,
        _reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for t in 0..8 {
        c.colsb[t] = 64;
        c.rows[t] = T as u8;
    }
    asm!("ldtilecfg [{0}]", in(reg) &c as *const TileCfg, options(nostack, readonly));
}

/// Pack `x` (`m` rows of `k` bf16 bits, row stride `rs`) into B-tile blocks: block `b`
/// (rows `16b..16b+16`, zero past `m`) holds, for each pair `p < k/2`, 16 rows × 2 values:
/// `out[b·8k + p·32 + j·2 + e] = x[16b + j][2p + e]`.
fn pack_x(m: usize, k: usize, x: &[u16], rs: usize) -> Vec<u16> {
    let blocks = m.div_ceil(T);
    let mut out = vec![0u16; blocks * T * k];
    out.par_chunks_mut(T * k).enumerate().for_each(|(b, blk)| {
        for j in 0..T {
            let r = b * T + j;
            if r >= m {
                break;
            }
            let row = &x[r * rs..r * rs + k];
            for p in 0..k / 2 {
                blk[p * 2 * T + j * 2] = row[2 * p];
                blk[p * 2 * T + j * 2 + 1] = row[2 * p + 1];
            }
        }
    });
    out
}

/// `y[m, n] (row-major, contiguous, overwritten) = bf16(Σ_k x[m, k] · w[n, k])`, `x` with
/// row stride `x_rs`, `w` `[n, k]` contiguous, split over the rayon pool when `parallel`
/// and the product is large. Returns false (and leaves `y` alone) when the sizes or the
/// CPU do not allow the AMX path ([`supported`]).
// A GEMM's usual operands (sizes, strides, buffers, a threading switch), as `gemm::gemm` takes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_bf16_nt(
    m: usize,
    n: usize,
    k: usize,
    x: &[bf16],
    x_rs: usize,
    w: &[bf16],
    y: &mut [std::mem::MaybeUninit<bf16>],
    parallel: bool,
) -> bool {
    if !supported(m, n, k)
        || x.len() < (m - 1) * x_rs + k
        || x_rs < k
        || w.len() < n * k
        || y.len() < m * n
    {
        return false;
    }
    // SAFETY: bf16 is a transparent u16.
    let xb: &[u16] = unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) };
    let wb: &[u16] = unsafe { std::slice::from_raw_parts(w.as_ptr().cast(), w.len()) };
    let xp = pack_x(m, k, xb, x_rs);
    let mblocks = m.div_ceil(T);
    let nblocks = n / (2 * T);
    let yp = SendPtr(y.as_mut_ptr().cast::<u16>());
    let threads = rayon::current_num_threads().max(1);
    // Contiguous runs of 32-row weight blocks per task: each thread streams its share of
    // the weights once, the packed activations stay in its cache.
    let per = nblocks.div_ceil(threads * 4).max(1);
    let tasks: Vec<(usize, usize)> = (0..nblocks)
        .step_by(per)
        .map(|s| (s, (s + per).min(nblocks)))
        .collect();
    // Rebinding `yp` makes the closure capture the `Send` wrapper, not its raw-pointer field.
    #[allow(clippy::redundant_locals)]
    let run = |(s, e): (usize, usize)| {
        let yp = yp;
        // SAFETY: `available()` held (checked by `supported`); each task writes the
        // columns of its own weight blocks only; bounds checked above.
        unsafe { tiles(m, n, k, mblocks, s, e, wb, &xp, yp.0) }
    };
    if parallel && tasks.len() > 1 && (m * n * k) >= super::gemm_calls::GEMM_PAR_FLOPS {
        tasks.into_par_iter().for_each(run);
    } else {
        tasks.into_iter().for_each(run);
    }
    true
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u16);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Weight blocks `s..e` (32 rows each) against every activation block.
///
/// # Safety
/// AMX available and permitted (so AVX-512F too); `w` holds `n·k`, `xp` `mblocks·16·k`
/// values; `y` points at `m·n` bf16 and no other thread writes columns `32s..32e`.
#[allow(clippy::too_many_arguments)]
unsafe fn tiles(
    m: usize,
    n: usize,
    k: usize,
    mblocks: usize,
    s: usize,
    e: usize,
    w: &[u16],
    xp: &[u16],
    y: *mut u16,
) {
    configure();
    let mut tmp = [0f32; 4 * T * T];
    let wstride = k * 2; // bytes per weight row
    let pstride = 2 * T * 2; // bytes per packed pair row (16 rows × 2 bf16)
                             // Activation blocks in chunks whose packed rows (chunk · 16 · k bf16) stay in L2
                             // (~512 KB) while every weight block of the task passes over them.
    let chunk = ((512 * 1024) / (T * k * 2)).clamp(2, mblocks.max(2)) & !1;
    for c0 in (0..mblocks).step_by(chunk) {
        let c1 = (c0 + chunk).min(mblocks);
        for nb in s..e {
            let n0 = nb * 2 * T;
            let a0 = w.as_ptr().add(n0 * k);
            let a1 = w.as_ptr().add((n0 + T) * k);
            let mut mb = c0;
            while mb < c1 {
                let two = mb + 1 < c1;
                let b0 = xp.as_ptr().add(mb * T * k);
                let b1 = if two {
                    xp.as_ptr().add((mb + 1) * T * k)
                } else {
                    b0
                };
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
                let mut kk = 0;
                while kk < k {
                    asm!(
                        "tileloadd tmm4, [{a0} + {ws}*1]",
                        "tileloadd tmm6, [{b0} + {ps}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b1} + {ps}*1]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a1} + {ws}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0.add(kk),
                        a1 = in(reg) a1.add(kk),
                        b0 = in(reg) b0.add(kk * T),
                        b1 = in(reg) b1.add(kk * T),
                        ws = in(reg) wstride,
                        ps = in(reg) pstride,
                        options(nostack, readonly),
                    );
                    if kk + KS < k {
                        // The next step's 64 bytes of each of the 32 weight rows into L1.
                        let nx = kk + KS;
                        for r in 0..T {
                            let p0 = a0.add(nx + r * k) as *const i8;
                            let p1 = a1.add(nx + r * k) as *const i8;
                            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                                p0,
                            );
                            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                                p1,
                            );
                        }
                    }
                    kk += KS;
                }
                let t = tmp.as_mut_ptr();
                asm!(
                    "tilestored [{t0} + {s}*1], tmm0",
                    "tilestored [{t1} + {s}*1], tmm1",
                    "tilestored [{t2} + {s}*1], tmm2",
                    "tilestored [{t3} + {s}*1], tmm3",
                    t0 = in(reg) t,
                    t1 = in(reg) t.add(T * T),
                    t2 = in(reg) t.add(2 * T * T),
                    t3 = in(reg) t.add(3 * T * T),
                    s = in(reg) 64usize,
                    options(nostack),
                );
                // Tile c holds rows n (16) × columns m (16): tiles 0/2 the first m block
                // (n offsets 0/16), tiles 1/3 the second.
                for dmb in 0..1 + two as usize {
                    let mrow0 = (mb + dmb) * T;
                    for j in 0..T.min(m.saturating_sub(mrow0)) {
                        let dst = y.add((mrow0 + j) * n + n0);
                        round_column(tmp.as_ptr().add(dmb * T * T + j), dst);
                        round_column(tmp.as_ptr().add((2 + dmb) * T * T + j), dst.add(T));
                    }
                }
                mb += 2;
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// `dst[i] = bf16(src[16 i])` for i < 16: one column of a stored 16 × 16 f32 tile, rounded
/// to nearest even (NaN: its top bits with the quiet bit set), as `half::bf16::from_f32` and
/// `wide::f32_to_bf16_bits`. Its own copy of that rounding because it gathers a strided
/// column: copying the column out for `wide::narrow_bf16` cost 15-25% of a 512 × 3072 × 1024
/// product (`amx_speed`). The tests check its outputs against float64 sums within one bf16
/// rounding, and NaN/inf positions.
///
/// # Safety
/// AVX-512F present; `src` readable at `16 i`, `dst` writable at `i`, for i < 16.
#[target_feature(enable = "avx512f")]
unsafe fn round_column(src: *const f32, dst: *mut u16) {
    use std::arch::x86_64::*;
    let idx = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    let v = _mm512_i32gather_ps::<4>(idx, src.cast());
    let b = _mm512_castps_si512(v);
    let hi = _mm512_srli_epi32::<16>(b);
    let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        _mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
        lsb,
    ));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(dst.cast(), _mm512_cvtepi32_epi16(r));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: usize, n: usize, k: usize, x: &[bf16], w: &[bf16]) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k)
                    .map(|q| x[i * k + q].to_f64() * w[j * k + q].to_f64())
                    .sum();
            }
        }
        y
    }

    fn run(m: usize, n: usize, k: usize, x: &[bf16], w: &[bf16]) -> Vec<f32> {
        let mut y = vec![std::mem::MaybeUninit::new(bf16::NAN); m * n];
        assert!(matmul_bf16_nt(m, n, k, x, k, w, &mut y, true));
        y.iter()
            .map(|v| unsafe { v.assume_init() }.to_f32())
            .collect()
    }

    fn rand_bf16(len: usize, seed: u64) -> Vec<bf16> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            })
            .collect()
    }

    #[test]
    fn matches_float64_sums_within_f32_accumulation_bound() {
        if !available() {
            eprintln!("skipped: no AMX bf16 on this CPU");
            return;
        }
        for &(m, n, k) in &[
            (1, 32, 32),
            (17, 64, 64),
            (33, 96, 128),
            (64, 32, 1024),
            (5, 160, 96),
        ] {
            let x = rand_bf16(m * k, 7 + m as u64);
            let w = rand_bf16(n * k, 11 + n as u64);
            let y = run(m, n, k, &x, &w);
            let r = reference(m, n, k, &x, &w);
            for i in 0..m * n {
                // f32 accumulation (k·eps·Σ|a·b|), then one bf16 rounding (2^-8 relative).
                let bound: f64 = (0..k)
                    .map(|q| (x[(i / n) * k + q].to_f64() * w[(i % n) * k + q].to_f64()).abs())
                    .sum::<f64>()
                    * k as f64
                    * f32::EPSILON as f64
                    + r[i].abs() / 256.0;
                assert!(
                    (y[i] as f64 - r[i]).abs() <= bound,
                    "{m}x{n}x{k} [{i}]: {} vs {}",
                    y[i],
                    r[i]
                );
            }
        }
    }

    #[test]
    fn nan_and_inf_propagate_and_subnormals_flush() {
        if !available() {
            eprintln!("skipped: no AMX bf16 on this CPU");
            return;
        }
        let (m, n, k) = (4, 32, 32);
        let mut x = vec![bf16::ZERO; m * k];
        let mut w = vec![bf16::ONE; n * k];
        x[0] = bf16::NAN; // row 0: NaN everywhere
        x[k] = bf16::INFINITY; // row 1: +inf · 1 = +inf, +inf · 0 (w row 3) = NaN
        w[3 * k] = bf16::ZERO;
        x[2 * k] = bf16::from_bits(0x0040); // row 2: a subnormal operand, flushed
        x[3 * k + 5] = bf16::from_f32(0.5); // row 3: 0.5 · 1
        let y = run(m, n, k, &x, &w);
        assert!(y[..n].iter().all(|v| v.is_nan()));
        assert_eq!(y[n], f32::INFINITY);
        assert!(y[n + 3].is_nan());
        assert_eq!(y[2 * n], 0.0, "AMX flushes subnormal operands");
        assert_eq!(y[3 * n + 7], 0.5);
    }

    /// `cargo test --release -p rlx-kernels --lib amx_speed -- --ignored --nocapture`: GFLOP/s
    /// of a Qwen3-0.6B MLP-sized product (512 × 3072 × 1024) on the rayon pool.
    #[test]
    #[ignore]
    fn amx_speed() {
        if !available() {
            return;
        }
        for (m, n, k) in [(512, 3072, 1024), (512, 1024, 3072)] {
            let x = rand_bf16(m * k, 1);
            let w = rand_bf16(n * k, 2);
            let mut y = vec![std::mem::MaybeUninit::new(bf16::ZERO); m * n];
            let mut ts = vec![];
            for _ in 0..9 {
                let t = std::time::Instant::now();
                assert!(matmul_bf16_nt(m, n, k, &x, k, &w, &mut y, true));
                ts.push(t.elapsed().as_secs_f64());
            }
            ts.sort_by(f64::total_cmp);
            let med = ts[ts.len() / 2];
            eprintln!(
                "{m}x{n}x{k} on {} threads: median {:.2} ms, {:.0} GFLOP/s",
                rayon::current_num_threads(),
                med * 1e3,
                2.0 * (m * n * k) as f64 / med / 1e9
            );
        }
    }

    #[test]
    fn refuses_unsupported_sizes() {
        let x = vec![bf16::ONE; 3 * 31];
        let w = vec![bf16::ONE; 32 * 31];
        let mut y = vec![std::mem::MaybeUninit::new(bf16::ZERO); 3 * 32];
        assert!(!matmul_bf16_nt(3, 32, 31, &x, 31, &w, &mut y, true));
        assert!(y.iter().all(|v| unsafe { v.assume_init() } == bf16::ZERO));
    }
}
