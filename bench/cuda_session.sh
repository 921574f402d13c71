#!/usr/bin/env bash
# A short CUDA session on the device machine (issue 30): rlx-cuda's test binaries from
# .cudabin/ (gzipped, RLX_REQUIRE_CUDA=1), then ResNet-50 and the Qwen3 prefill: `rlx bench`
# on CUDA (cuDNN on and off, RLX_DEBUG_NANS=1, the bf16 exports) and a per-op profile
# (bench/cuda_profile.sh's summary). Writes $OUT/session.txt.
# Usage: bench/cuda_session.sh [models, default resnet50,qwen3_0_6b]
set -u
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=${RLX_BIN:-.devbin/rlx}
DIR=${GPU_BENCH_DIR:-/tmp/rlx-gpu-bench}
MODELS=${1:-resnet50,bert_base,qwen3_0_6b}
{
  for t in .cudabin/*.gz; do
    b=/tmp/$(basename "$t" .gz); gunzip -c "$t" > "$b"; chmod +x "$b"
    printf '%s: ' "$(basename "$b")"
    (cd crates/rlx-cuda && RLX_REQUIRE_CUDA=1 timeout 300 "$b" --test-threads 1 2>&1) > "$OUT/test_$(basename "$b").log"
    grep -E "^test result|FAILED|panicked" "$OUT/test_$(basename "$b").log" | tr '\n' ' '; echo
  done
  grep -hE "conv case|cuDNN .* ms|pool [0-9]" "$OUT"/test_cudnn.log | head -40
  python3 bench/gpu_models.py "$DIR" --models "$MODELS,${MODELS//,/_bf16,}_bf16" --runs 10 2>&1 | tail -4
  for m in ${MODELS//,/ }; do
    for v in "" "RLX_CUDNN=0" "RLX_DEBUG_NANS=1" "RLX_DEBUG_NANS=1 RLX_CUDA_FUSE=0"; do
      case "$m $v" in resnet50*|*DEBUG_NANS=1) ;; *) continue ;; esac
      [ "$v" = "" ] || case "$m" in resnet50) ;; *) [ "$v" = "RLX_DEBUG_NANS=1" ] || continue ;; esac
      log="$OUT/b_${m}_$(echo "$v" | tr ' =' '__').log"
      printf '%s %s: ' "$m" "${v:-default}"
      env $v RLX_DISPATCH_REPORT=1 timeout 300 $R bench "$DIR/$m" --device cuda --warmup 3 --runs 10 > "$log" 2>&1
      echo "$(grep -E '^median:|^device median:' "$log" | tr '\n' ' ') $(grep -E 'convolutions:|nodes on cuda' "$log" | tr '\n' ' ' | cut -c1-200)"
    done
    printf '%s default: ' "$m"; timeout 300 $R bench "$DIR/$m" --device cuda --warmup 3 --runs 10 2>&1 | grep -E '^median:|^device median:' | tr '\n' ' '; echo
    for v in "" "RLX_DEBUG_NANS=1"; do
      printf '%s_bf16 %s: ' "$m" "${v:-default}"
      env $v timeout 300 $R bench "$DIR/${m}_bf16" --device cuda --warmup 3 --runs 10 2>&1 | grep -E '^median:|^device median:' | tr '\n' ' '; echo
    done
  done
  RLX_DEBUG_NANS=1 timeout 300 $R bench "$DIR/resnet50" --device cuda --warmup 2 --runs 5 --profile --profile-top 8 2>&1 | tail -14
  cat "$DIR/torch.json"
} 2>&1 | tee "$OUT/session.txt"
