#!/usr/bin/env bash
# One call on the device machine's host CPU (issue 34): the CPU table of bench/bench.py (RLX
# against onnxruntime, 1 and 2 threads, pinned), per-node gaps from bench/tools/node_cmp.py,
# and interleaved A/B runs of the opt-in CPU kernels. Results go to $OUT (lscpu.txt,
# RESULTS-host.md, bench.log, node_cmp.txt, ab.txt).
#
# Usage (device machine, repo root, a stripped release rlx in .devbin/ carried; the models
# are generated there by its own python3, which has onnx, onnxruntime, torch, torchvision and
# transformers; no tract there, and MiniLM's weights are not on that machine):
#   bench/host_cpu.sh [MODELS]   # default: every bench model but minilm
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export RLX_BIN=${RLX_BIN:-$PWD/.devbin/rlx}
MODELS=${1:-bert,gpt2,qwen3,squeezenet,mobilenet_v2,efficientnet_b0,resnet18,resnet50}
# bench.py runs onnxruntime with .venv/bin/python: the machine's python3 stands in.
mkdir -p .venv/bin
[ -x .venv/bin/python ] || ln -sf "$(command -v python3)" .venv/bin/python
{ lscpu; nproc; uptime; } > "$OUT/lscpu.txt" 2>&1
t0=$(date +%s)
python3 scripts/gen_bench_models.py ${MODELS//,/ } > "$OUT/gen.log" 2>&1
echo "models written in $(( $(date +%s) - t0 )) s" >> "$OUT/gen.log"
python3 bench/bench.py --models "$MODELS" --threads 1,2 --runtimes rlx,ort --max-time 2 \
  --results "$OUT/RESULTS-host.md" > "$OUT/bench.log" 2>&1
for m in resnet50 mobilenet_v2 efficientnet_b0 squeezenet; do
  echo "== $m"
  timeout 120 python3 bench/tools/node_cmp.py "bench/models/$m" --threads 1 --top 12 --rlx "$RLX_BIN" 2>&1 | tail -30
done > "$OUT/node_cmp.txt"
# RLX_CPU_MK_ROWS=1 (bench/NOTES.md §27) against the default, 3 interleaved rounds, 1 thread.
for r in 1 2 3; do
  for m in squeezenet mobilenet_v2 efficientnet_b0 resnet18 resnet50; do
    for v in 0 1; do
      t=$(RLX_CPU_MK_ROWS=$v taskset -c 0 "$RLX_BIN" bench "bench/models/$m" --threads 1 --max-time 1.5 2>&1 | grep median)
      echo "$m rows=$v $t"
    done
  done
done > "$OUT/ab.txt"
uptime >> "$OUT/lscpu.txt"
