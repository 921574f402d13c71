#!/usr/bin/env bash
# Issue 31 on the device machine (NVIDIA H200): the Qwen3-0.6B-sized checkpoint (random
# weights, scripts/gen_bench_llm.py) generated there, then bench/llm.py --device cuda:
# `rlx generate --device cuda` (binary .devbin/rlx, built on the CPU machine) against
# transformers on CUDA, f32 and bf16, prefill 512 + decode 128. Writes $OUT/llm_cuda.txt.
# Usage (repo root on the device machine): bench/llm_cuda.sh [runs, default 3]
set -u
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RLX_BIN=${RLX_BIN:-$PWD/.devbin/rlx}
M=${LLM_DIR:-/tmp/rlx-llm/qwen3-0.6b}
{
  [ -d "$M" ] || python3 scripts/gen_bench_llm.py --out "$M" 2>&1 | tail -1
  python3 bench/llm.py --model "$M" --device cuda --engines rlx,transformers --threads 1 \
    --runs "${1:-3}" --out "$OUT/llm_cuda.json" 2>&1 | tail -16
} 2>&1 | tee "$OUT/llm_cuda.txt"
