#!/usr/bin/env bash
# One call on the GPU machine (issue 30): correctness of every GPU backend on the examples
# (run on CUDA, `rlx diverge` against the CPU, NaN culprits on CUDA and wgpu), then
# bench/gpu.sh. Results go to $OUT (at most 8 files: checks.txt, RESULTS-GPU.md,
# gpu_rlx.tsv, torch.json, logs.tgz).
#
# Usage (device machine, repo root, with a stripped release rlx in .devbin/ and Debian's
# libvulkan1 .deb in .gl/; optional: rlx-cuda's test binaries in .cudabin/ (plain or .gz),
# the zoo, torch and bench models in .devdata/{light,torch,bench}/):
# bench/device_check.sh [bench/gpu.sh options]
# CHECKS_ONLY=1 skips bench/gpu.sh. GEN_DATA=1 first writes .devdata/{light,torch,bench} on
# the device with its own python3 (onnx, torch, torchvision, transformers are there):
# scripts/gen_light_models.py, scripts/gen_torch_models.py, scripts/gen_bench_models.py.
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done
ldconfig 2>/dev/null
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=${RLX_BIN:-.devbin/rlx}
DD=${DEVDATA:-.devdata}
if [ -n "${GEN_DATA:-}" ]; then
  t0=$(date +%s)
  python3 scripts/gen_light_models.py --out "$DD/light" --no-ort > "$OUT/gen_data.log" 2>&1
  python3 scripts/gen_torch_models.py --out "$DD/torch" >> "$OUT/gen_data.log" 2>&1
  python3 scripts/gen_bench_models.py --out "$DD/bench" resnet50 squeezenet bert qwen3 resnet18 \
    mobilenet_v2 efficientnet_b0 gpt2 >> "$OUT/gen_data.log" 2>&1
  echo "data written in $(( $(date +%s) - t0 )) s: $(ls "$DD"/light "$DD"/torch "$DD"/bench 2>/dev/null | grep -vc ':$')" folders
fi
sec() { echo "== [$(date +%T)] $*"; }
{
  sec "rlx run --device cuda"
  RLX_DISPATCH_REPORT=1 $R run examples/healthy_mlp --device cuda 2>&1 | tail -4
  if [ -d .cudabin ]; then
    sec "rlx-cuda's tests on the GPU (RLX_REQUIRE_CUDA=1: a skip is a failure)"
    for t in .cudabin/*; do
      b=$PWD/$t
      case $t in *.gz) b=/tmp/$(basename "$t" .gz); gunzip -c "$t" > "$b"; chmod +x "$b" ;; esac
      printf '%s: ' "$(basename "$b")"
      (cd crates/rlx-cuda && RLX_REQUIRE_CUDA=1 timeout 300 "$b" --test-threads 1 2>&1) \
        | grep -E "^test result|FAILED|panicked" | tr '\n' ' '
      echo
    done
  fi
  sec "rlx diverge (every live backend against the CPU): examples and fixtures"
  for e in examples/*/ fixtures/transformers/*/; do
    echo "-- $e"
    timeout 120 $R diverge -q "$e" 2>&1 | grep -E "vs cpu|error|^    "
  done
  for d in cpu cuda wgpu; do
    sec "RLX_DEBUG_NANS=1 culprits on $d"
    for e in examples/*/ "$DD"/torch/nan_*/; do
      [ -d "$e" ] || continue
      printf '%s: ' "$(basename "$e")"
      RLX_DEBUG_NANS=1 $R run -q --device $d "$e" 2>&1 | grep -m1 -E "nan-check|error" || echo "(none)"
    done
  done
  sec "planted wgpu bug"
  RLX_TEST_PLANTED_BUG=matmul_drop_last_k $R diverge -q --backends wgpu fixtures/transformers/bert_tiny 2>&1 | grep -E "vs cpu|first divergence" | head -3
  sec "planted CUDA bug"
  RLX_TEST_PLANTED_BUG=cuda_matmul_drop_last_k $R diverge -q --backends cuda fixtures/transformers/bert_tiny 2>&1 | grep -E "vs cpu|first divergence" | head -3
  sec "printer level 3 on CUDA (launch-blocking): last lines"
  RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER=3 $R run -q --device cuda examples/healthy_mlp 2>&1 | grep "rlx print" | head -4
  sec "printer level 1 on wgpu: first lines"
  RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER=1 $R run -q --device wgpu examples/healthy_mlp 2>&1 | grep "rlx print" | head -3
  sec "rlx diverge (every live backend against the CPU): zoo, torch and bench models"
  for e in "$DD"/light/*/ "$DD"/torch/*/ "$DD"/bench/*/; do
    [ -d "$e" ] || continue
    echo "-- $e"
    timeout 120 $R diverge -q "$e" 2>&1 | grep -E "vs cpu|error|^    "
  done
  sec "end"
} > "$OUT/checks.txt" 2>&1
cat "$OUT/checks.txt"
[ -n "${CHECKS_ONLY:-}" ] && exit 0
L=/tmp/rlx-gpu-logs
mkdir -p $L
OUT=$L RLX_BIN=$R timeout ${BENCH_TIMEOUT:-460} bench/gpu.sh "$@"
cp $L/RESULTS-GPU.md $L/gpu_rlx.tsv "$OUT/" 2>/dev/null
cp ${GPU_BENCH_DIR:-/tmp/rlx-gpu-bench}/torch.json "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
