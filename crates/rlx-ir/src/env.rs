//! The one registry of every `RLX_*` environment variable the project reads.
//!
//! Every reader goes through [`get`], [`get_os`] or [`is_on`] with a name listed in [`VARS`];
//! `rlx env` prints [`VARS`] as a table with each variable's current value, so the table
//! cannot drift from the code (`crates/rlx-cli/tests/env.rs` greps the source tree for
//! `"RLX_..."` string literals and fails on any name missing here).
//!
//! ```
//! assert!(rlx_ir::env::lookup("RLX_DEBUG_NANS").is_some());
//! let on = rlx_ir::env::is_on("RLX_LINT_NUMERICS"); // unset, empty, 0, false, off, no: off
//! # let _ = on;
//! ```

use std::ffi::OsString;

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The library and the `rlx` tools: changes what a run does or prints.
    Runtime,
    /// The test suite and CI: skip-or-fail switches, fixture locations, manifest updates.
    Tests,
    /// The ONNX conformance harness (`rlx-conformance`).
    Conformance,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Runtime => "runtime",
            Scope::Tests => "tests",
            Scope::Conformance => "conformance",
        }
    }
}

/// One `RLX_*` variable: its name and what a user needs to know before setting it.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// The variable's name, e.g. `RLX_DEBUG_NANS`.
    pub name: &'static str,
    /// The values it accepts, e.g. `0|1|strict|abort`.
    pub values: &'static str,
    /// When it acts (compile time, each run, a test run, ...).
    pub acts: &'static str,
    /// What it catches or changes.
    pub catches: &'static str,
    /// Its cost when on (off costs nothing unless said otherwise).
    pub cost: &'static str,
    /// Who reads it.
    pub scope: Scope,
}

/// Every `RLX_*` variable the project reads, runtime switches first.
pub const VARS: &[EnvVar] = &[
    EnvVar {
        name: "RLX_DEBUG_NANS",
        values: "0|1|strict|abort (off: unset, 0, false, off, no)",
        acts: "each run (read once per run)",
        catches: "names the op that created each NaN (and each Inf that reaches an output or becomes NaN); strict: every non-finite value; abort: stop at the first (exit 3)",
        cost: "one finiteness pass per op output",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_LINT_NUMERICS",
        values: "0|1 (1, true, on, yes: on)",
        acts: "compile time",
        catches: "constant subgraphs that provably fold to NaN/Inf (1/0, log(0), -1e9 cast to f16, literal -inf masks)",
        cost: "one evaluation of the constant subgraphs",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_FUSION",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built",
        catches: "nothing: 0 turns off every fusion of the CPU executor (default on), so each op runs on its own: (1) an f32 Conv with constant weights and the per-channel Add/Sub/Mul/Div after it (a decomposed BatchNorm, a bias) folded into its weights, with a Relu, SiLU or Clip after them applied in its epilogue; (2) a residual Add (and its Relu) after such a conv, in the conv's epilogue (RLX_CPU_RESIDUAL=0 turns off only this), or a MaxPool that alone reads it, in bands with the conv (RLX_CPU_CONV_POOL=0: only this); (3) a 1x1 conv interleaved with the depthwise conv that alone reads its output (RLX_CPU_PWDW=0: only this); (4) a per-channel scale Mul (a Squeeze-and-Excitation block's) folded into the weights of the 1x1 conv that alone reads its output; (5) the decomposed Softmax, LayerNorm and RMSNorm over the last axis, run one row at a time; (6) chains of elementwise ops (f32, float16, bfloat16; a GELU) run block by block; (7) a Transpose read only by a MatMul, read in place instead of run. Not fusions, so left on: in-place reuse of a dying input's buffer, the Winograd and packed conv kernels (RLX_CPU_WINOGRAD, RLX_CPU_MK). To rule a fusion out or to time its effect. NaN reports name the same op either way (a fused group with a non-finite value is replayed op by op)",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_DW_CBLOCK",
        values: "1|0 (0, false, off, no: off)",
        acts: "at the process's first f32 depthwise conv on the CPU (read once)",
        catches: "nothing: 0 sends f32 3x3/5x5/7x7 depthwise convs with output planes of at most 1024 positions (on AVX-512, 3x3 ones only at most 8 outputs wide) to the per-plane paths instead of the channel-block kernel (16 channels per register on AVX-512, 8 on AVX2; default on); for timing one against the other",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_DW_S2",
        values: "1|0 (0, false, off, no: off)",
        acts: "at the process's first stride-2 depthwise conv on the CPU (read once)",
        catches: "nothing: 0 makes f32 stride-2 3x3/5x5 depthwise convs copy each input plane into phase planes first (the older flat path) instead of reading it in place (default on); both give the same bits, so it is only for timing one against the other",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_PWDW",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built",
        catches: "nothing: 0 runs a 1x1 conv and the depthwise conv that alone reads its output one after the other instead of interleaved by bands of rows through a per-thread window that stays in L2 (default on; MobileNet/EfficientNet blocks). Both give the same bits, and with a NaN scanner on they always run apart; only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_SYMBOLIC_COMPILE",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a dynamic model plans a new size signature from a symbolic template",
        catches: "nothing: 0 runs the compiler's passes (verify, lint, folding, decomposition) on each signature's graph instead of patching the template's graph compiled once (default on; the nodes whose sizes or values depend on the symbols are held unfolded in that compile and folded per signature). Same graphs and values; for timing and to rule it out",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_SYMBOLIC_IMPORT",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a dynamic model (a model with symbolic dims, a dynamic package) plans a new size signature",
        catches: "nothing: 0 imports the ONNX source again at every new size signature instead of specializing a graph imported once with its dims as symbols (default on; models whose import reads a symbolic size as a number are imported per signature either way). Same graphs and values; for timing and to rule the symbolic import out",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_CONV_POOL",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built",
        catches: "nothing: 0 runs a MaxPool that alone reads a fused conv's output as its own op instead of in bands with the conv (default on; at one thread, the stems of SqueezeNet and ResNet: each band of conv rows is pooled while it is in L2; with more threads the two run whole). Values differ by rounding only (a band's conv may sum in another order); with a NaN scanner on, the band is scanned and a group with a non-finite value replays op by op; only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_RESIDUAL",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built",
        catches: "nothing: 0 runs a residual Add (and its Relu) after a fused conv as separate ops instead of in the conv's epilogue (default on; ResNet shortcuts). Values differ by rounding only (the shortcut can be summed before the bias), and with a NaN scanner on the Add always runs apart; only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_DCONV",
        values: "1|0 (0, false, off, no: off)",
        acts: "at the first f32 conv of the process",
        catches: "nothing: 0 runs 2-D convs larger than 1x1 with one group and stride 1 or 2 through im2col and gemm instead of the direct kernel (default on where the CPU has AVX-512). Values differ by rounding only (another summation order); only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_MK",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built (its convs' and MatMuls' weights are packed then)",
        catches: "nothing: 0 runs the f32 convs that RLX's own micro-kernel takes (weights packed at build, `kernels::conv::packed`) through the gemm crate instead (default: on with AVX-512F; on an AVX2-only CPU, or under RLX_CPU_ISA=avx2, only with 1), and the f32 MatMuls against constant weights that are packed once into column panels (`kernels::mm_packed`, AMD CPUs with AVX-512 only) through gemm packing the weights each call. Values differ by rounding only (another summation order); only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_MK_IM",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built, and per conv run (read once per process)",
        catches: "nothing: 0 sends convs larger than 1x1 (stride 1 or 2, at least 32 input channels) back from RLX's micro-kernel reading their input in place (`kernels::conv::packed_im`) to the earlier paths (Winograd, the direct kernel, im2col + gemm; stride 2 on planes up to 7² through im2col and the micro-kernel). Values differ by rounding only; only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_MK_ROWS",
        values: "0|1 (default 0)",
        acts: "when a CPU executor is built (its convs' and MatMuls' weights are packed then)",
        catches: "nothing: 1 runs stride-1 1x1 f32 convs on planes larger than 14x14 through RLX's pointwise kernel with positions on the vector side (`kernels::conv::packed_rows`, AVX-512F, weights packed at build, a residual buffer taken as the output) instead of the gemm crate; off by default (measured at gemm's speed, not faster, bench/NOTES.md §27). Values differ by rounding only; only for timing",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_ISA",
        values: "avx512|avx2|portable",
        acts: "at the first use of each SIMD kernel family of the process",
        catches: "nothing: avx2 keeps the AVX-512 kernels off (the direct conv off; the depthwise kernels, MaxPool and the elementwise, Softmax and reduction loops run their AVX2 versions, and so does the conv micro-kernel with RLX_CPU_MK=1), to test and time the AVX2 paths on an AVX-512 machine (the gemm crate keeps its own choice); portable turns the conv micro-kernel and the depthwise and MaxPool SIMD kernels off and runs the plain copies of the elementwise loops (gemm and the generic loops; the same bits, slower). Unset: the best the CPU has",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_AMX",
        values: "0|1 (default 1: used where the CPU has AMX-BF16, Intel Sapphire Rapids and later)",
        acts: "at the first bfloat16 MatMul of the process",
        catches: "0: bfloat16 MatMuls of more than 32 rows against [N, K] weights (LLM prefill) run on the exact widen-to-f32 path instead of AMX tiles, which flush subnormal operands and sums to zero (as oneDNN's bfloat16 kernels do); to rule AMX in or out of a divergence or an underflow",
        cost: "0: bfloat16 prefill at f32 FMA speed (Qwen3-0.6B: about half the tokens/s)",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_WINOGRAD",
        values: "1|0 (0, false, off, no: off)",
        acts: "when a CPU executor is built",
        catches: "nothing: 0 turns off the Winograd F(2x2,3x3) path of f32 3x3 stride-1 convs with >= 32 channels on the CPU (default on; values differ from im2col by round-off, about 1e-6 relative), to rule it out or to time it; NaN/Inf values and reports are the same either way (a conv whose input holds NaN/Inf or could overflow a direct partial sum runs directly, and one with a non-finite output is recomputed directly)",
        cost: "none; on, the transformed weights take 16/9 of those convs' weight memory",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_WINO_MK",
        values: "1|0 (0, false, off, no: off)",
        acts: "when an executor transforms its first Winograd conv's weights",
        catches: "nothing: 0 runs the Winograd convs' 16 products on gemm instead of RLX's product tile (weights packed at build, the next slice prefetched), to time it; values differ by round-off only",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_WINO_SLABS",
        values: "1|0 (0, false, off, no: off)",
        acts: "at the first Winograd conv of the process",
        catches: "nothing: 0 turns off the Winograd convs' slab layout (each slab of tile rows runs the input transform, the 16 products and the output transform in its own core's cache; with weights above 1 MiB and several threads, one part of output channels per thread), to time it; values differ by round-off only",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CPU_PANELS",
        values: "1|0 (0, false, off, no: off)",
        acts: "at the first packed-tile product of the process",
        catches: "nothing: 0 has the packed conv tiles read their input in place instead of from tile panels copied first (where 8 or more channel blocks read it: stride-1 1×1 convs, the 1×1 of a 1×1 + depthwise pair, Winograd's products), to time it; the same bits either way",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_RUNTIME_CHECK_INPUTS",
        values: "0|1 (1, true, on, yes: on)",
        acts: "each run, before any kernel",
        catches: "inputs whose dtype, rank, dims, name or device type do not match the compiled guards",
        cost: "a few comparisons per input",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER",
        values: "0|1|2|3",
        acts: "each run on the CPU (read once per run)",
        catches: "1: per-op stats line (min, max, mean, max|x|, NaN/Inf counts) on stderr; 2: also the values; 3: the op's name before it runs (flushed), so a crash names its op",
        cost: "one pass over every printed op's output, plus stderr writes",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_FILTERED_OPS_TO_PRINT",
        values: "glob,glob,...",
        acts: "with RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER",
        catches: "limits the printer to nodes whose label, op name or %id matches a glob (* and ?)",
        cost: "a glob match per node",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_DISPATCH_REPORT",
        values: "0|1 (1, true, on, yes: on)",
        acts: "when a wgpu or CUDA executor is created",
        catches: "prints which ops run on the GPU and which fall back to the CPU",
        cost: "one report on stderr per compiled graph",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDA_TF32",
        values: "0|1 (default 0)",
        acts: "when a CUDA executor is created",
        catches: "1: cuBLAS f32 matmuls and cuDNN f32 convolutions may use TF32 tensor cores (10-bit mantissa inputs); default full f32 math (cuBLAS default math without TF32, cuDNN FMA math)",
        cost: "1: faster matmuls and convolutions, errors near 1e-3 relative against the CPU",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDNN",
        values: "0|1 (default 1: used when libcudnn.so.9 loads)",
        acts: "when a CUDA executor is created",
        catches: "0: CUDA convolutions run on im2col + cuBLAS (2-D, groups 1) or the direct conv_f32 kernel instead of cuDNN (to rule cuDNN in or out of a divergence)",
        cost: "0: slower convolutions",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDNN_BF16",
        values: "0|1 (default 1)",
        acts: "when a CUDA executor is created",
        catches: "0: bfloat16 convolutions without a bias compute on f32 words (FMA math, then rounded) instead of cuDNN's bfloat16 tensor-op kernels (to rule those in or out of a divergence)",
        cost: "0: bfloat16 convolutions at f32 speed",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDA_GRAPH",
        values: "0|1 (default 1)",
        acts: "when a CUDA executor is created",
        catches: "0: no CUDA graph (every run launches its kernels one by one; runs that scan, profile or read every value back never use the graph)",
        cost: "0: more launch overhead per run",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDA_FUSE",
        values: "0|1 (default 1)",
        acts: "when a CUDA executor is created",
        catches: "0: every elementwise node runs its own kernel (fused groups give bit-identical values and count their inner values' NaN/Inf when RLX_DEBUG_NANS is on; runs that read every value back never fuse)",
        cost: "0: slower runs (one kernel and one buffer write per elementwise node)",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDA_ATTN",
        values: "0|1 (default 1)",
        acts: "when a CUDA executor is created",
        catches: "0: scaled-dot-product attention (MatMul, scale, mask Add, the decomposed Softmax, MatMul) runs node by node instead of as one fused flash-attention kernel (results within about 1e-5 relative in f32; runs that scan for NaN/Inf or read every value back never use the fused kernel)",
        cost: "0: slower attention (the score matrix is written and read several times)",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_CUDA_ATTN_SCAN",
        values: "0|1 (default 1)",
        acts: "when a CUDA executor is created",
        catches: "0: runs that scan for NaN/Inf (RLX_DEBUG_NANS) run each fused attention group's nodes one by one instead of the counting variant of its kernel (one pass over the keys; a block with a NaN or infinite row max, an overflowing U - max or NaN/Inf in V counts in a second pass); the per-node counts are the same either way",
        cost: "0: slower scanning runs (the score matrix is written, read and scanned several times)",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_WGPU_GEMM_TILE",
        values: "reg|reg16|32|64|128 (default reg)",
        acts: "when a wgpu executor is created",
        catches: "nothing: picks the wgpu matmul/conv kernel, to time one against another or rule one out: reg (register-tiled, up to 128x128 outputs per workgroup, k-tiles of 8), reg16 (k-tiles of 16), or 32/64/128 for the earlier shared-memory tiles capped at that size",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_WGPU_SPLITK",
        values: "0|1 (default 1)",
        acts: "when a wgpu executor is created",
        catches: "0: no split-K (a matrix product whose smallest output tile gives fewer than half the wanted workgroups, such as a classifier's few rows, and whose K is at least 512 otherwise runs as up to 16 partial products over slices of K, summed in order by a second pass; values differ by rounding only)",
        cost: "0: slower products with few output tiles and a long K",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_WGPU_GEMM_MIN_WG",
        values: "a number (default 256)",
        acts: "when a wgpu executor is created",
        catches: "nothing: the workgroup count below which the wgpu matmul/conv kernel takes a smaller output tile or splits K, to tune it for a GPU",
        cost: "none",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_WGPU_FUSE",
        values: "0|1 (default 1)",
        acts: "when a wgpu executor is created",
        catches: "0: every node runs its own kernel (otherwise, in runs that read back only the outputs, a Conv followed by per-channel affine ops, a residual Add and a Relu runs as one conv with the affine map folded into its weights, and chains of f32 elementwise ops run as one kernel each; values differ by rounding only; runs that scan for NaN/Inf or read every value never fuse)",
        cost: "0: slower runs (a pass over memory per BatchNorm step, Relu and elementwise op)",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_WGPU_NAN_TRACE",
        values: "0|1 (1, true, on, yes: on)",
        acts: "each wgpu run (legacy name)",
        catches: "the same as RLX_DEBUG_NANS=1 on the wgpu backend: every node's buffer is read back after the run and scanned",
        cost: "a device-to-host copy of every intermediate",
        scope: Scope::Runtime,
    },
    EnvVar {
        name: "RLX_TEST_PLANTED_BUG",
        values: "unset|bug name",
        acts: "tests only",
        catches: "plants a known kernel bug so tests can check that the divergence tools find it",
        cost: "wrong numbers by design: never set it outside tests",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_REQUIRE_FIXTURES",
        values: "0|1 (1, true, on, yes: on)",
        acts: "test runs",
        catches: "tests on generated fixtures fail instead of skipping when the fixtures are missing (CI sets it)",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_REQUIRE_GPU",
        values: "0|1 (1, true, on, yes: on)",
        acts: "test runs",
        catches: "GPU tests fail instead of skipping when no GPU adapter is found",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_REQUIRE_CUDA",
        values: "0|1 (1, true, on, yes: on)",
        acts: "test runs",
        catches: "CUDA tests fail instead of skipping when rlx_cuda::probe() finds no driver or device",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_REQUIRE_CHROMIUM",
        values: "0|1 (1, true, on, yes: on)",
        acts: "test runs",
        catches: "the headless-Chromium test of the `rlx trace` HTML report fails instead of skipping when chromium is missing",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_INNER_NO_VULKAN",
        values: "unset|1",
        acts: "tests only (set on a child test process)",
        catches: "marks the child run of rlx-runtime's wgpu_devices test that hides every Vulkan driver",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_BIN",
        values: "path",
        acts: "bench/bench.py",
        catches: "which rlx binary the benchmark harness times (default target/release/rlx)",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_BENCH_REV",
        values: "text",
        acts: "bench/bench.py",
        catches: "the RLX revision the results header records, for a copy without its git history (bench/host_cpu.sh on the device machine sets it from .devbin/REV)",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_REQUIRE_NUMPY",
        values: "0|1",
        acts: "test runs",
        catches: "tests whose value check runs through Python's numpy (the bench harness smoke test) fail instead of skipping it when numpy is missing (CI sets it)",
        cost: "none",
        scope: Scope::Tests,
    },
    EnvVar {
        name: "RLX_ONNX_NODE_DIR",
        values: "folder",
        acts: "conformance runs",
        catches: "where the ONNX backend node test cases live (default fixtures/onnx-node)",
        cost: "none",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_UPDATE_MANIFEST",
        values: "0|1 (1, true, on, yes: on)",
        acts: "conformance test run",
        catches: "rewrites passing.txt with the cases that pass now (only additions)",
        cost: "none",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_UPDATE_MANIFEST_ALLOW_REMOVALS",
        values: "0|1 (1, true, on, yes: on)",
        acts: "with RLX_UPDATE_MANIFEST=1",
        catches: "lets the manifest update drop cases that stopped passing",
        cost: "none",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_CONFORMANCE_JOBS",
        values: "N (default 2)",
        acts: "conformance runs",
        catches: "how many cases run at once",
        cost: "N processes",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_CONFORMANCE_TIMEOUT_S",
        values: "seconds (default 10)",
        acts: "conformance runs",
        catches: "per-case time limit (a hang fails the case)",
        cost: "none",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_CONFORMANCE_FILTER",
        values: "substring",
        acts: "conformance runs",
        catches: "runs only the cases whose name contains it",
        cost: "none",
        scope: Scope::Conformance,
    },
    EnvVar {
        name: "RLX_CONFORMANCE_DEBUG_NANS",
        values: "0|1 (default 1)",
        acts: "conformance runs",
        catches: "0: skip the rerun of each case with RLX_DEBUG_NANS=1 (which checks the localizer never changes an output)",
        cost: "a second run of every case",
        scope: Scope::Conformance,
    },
];

/// The registry entry for `name`, if registered.
pub fn lookup(name: &str) -> Option<&'static EnvVar> {
    VARS.iter().find(|v| v.name == name)
}

fn check(name: &str) {
    debug_assert!(
        lookup(name).is_some(),
        "{name} is not in rlx_ir::env::VARS: register it there (rlx env prints that table)"
    );
}

/// The value of a registered variable (`None` when unset or not UTF-8).
///
/// Debug builds panic when `name` is not in [`VARS`] (a programming error: register it).
pub fn get(name: &str) -> Option<String> {
    check(name);
    std::env::var(name).ok()
}

/// The raw value of a registered variable (for paths); `None` when unset.
pub fn get_os(name: &str) -> Option<OsString> {
    check(name);
    std::env::var_os(name)
}

/// How a switch's value reads. One rule for every `RLX_*` switch: unset or empty is the
/// switch's default; `0`, `false`, `off`, `no` are off; `1`, `true`, `on`, `yes` are on (case
/// and surrounding whitespace ignored); anything else is [`Switch::Unrecognized`], which
/// the readers treat as on (the variable was set, so the user asked for something) after
/// one note on stderr naming the variable and the values it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// Unset or empty: the switch's default.
    Default,
    Off,
    On,
    Unrecognized,
}

/// Read a switch value (`None`: unset) by the one rule of [`Switch`].
pub fn parse_switch(v: Option<&str>) -> Switch {
    let Some(v) = v else { return Switch::Default };
    match v.trim().to_ascii_lowercase().as_str() {
        "" => Switch::Default,
        "0" | "false" | "off" | "no" => Switch::Off,
        "1" | "true" | "on" | "yes" => Switch::On,
        _ => Switch::Unrecognized,
    }
}

/// Print, once per variable per process, that `name=value` is not a value it accepts and
/// what it is taken as.
pub fn note_unrecognized(name: &str, value: &str, taken_as: &str) {
    use std::sync::Mutex;
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.iter().any(|s| s == name) {
        return;
    }
    seen.push(name.to_string());
    let accepts = lookup(name).map_or("0|1", |v| v.values);
    eprintln!(
        "rlx: note: {name}={value:?} is not a value it accepts ({accepts}); taken as {taken_as}"
    );
}

fn read_switch(name: &str) -> Switch {
    let v = get(name);
    let s = parse_switch(v.as_deref());
    if s == Switch::Unrecognized {
        note_unrecognized(name, v.as_deref().unwrap_or(""), "on (1)");
    }
    s
}

/// True when a registered switch is explicitly off (`0`, `false`, `off`, `no`): for a switch
/// that defaults to on (`RLX_CPU_FUSION`). Unset or empty keeps the default (not off); an
/// unrecognized value is taken as on, with one note (see [`Switch`]).
pub fn is_off(name: &str) -> bool {
    read_switch(name) == Switch::Off
}

/// True when a registered switch is on (`1`, `true`, `on`, `yes`, or an unrecognized value,
/// with one note); unset, empty, `0`, `false`, `off`, `no` are off (see [`Switch`]).
pub fn is_on(name: &str) -> bool {
    matches!(read_switch(name), Switch::On | Switch::Unrecognized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_switch() {
        for v in ["0", "false", "OFF", " no ", "False"] {
            assert_eq!(parse_switch(Some(v)), Switch::Off, "{v}");
        }
        for v in ["1", "true", "On", "YES "] {
            assert_eq!(parse_switch(Some(v)), Switch::On, "{v}");
        }
        for v in [None, Some(""), Some("  ")] {
            assert_eq!(parse_switch(v), Switch::Default, "{v:?}");
        }
        for v in ["garbage", "maybe", "2", "enable"] {
            assert_eq!(parse_switch(Some(v)), Switch::Unrecognized, "{v}");
        }
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, v) in VARS.iter().enumerate() {
            assert!(v.name.starts_with("RLX_"), "{}", v.name);
            assert!(
                !VARS[..i].iter().any(|w| w.name == v.name),
                "{} listed twice",
                v.name
            );
        }
    }
}
