#!/usr/bin/env bash
# A wgpu session on the device machine (issue 30 item 5), one call: rlx-wgpu's test binaries
# on the GPU's Vulkan driver (gzipped in .devbin/wgpu_tests/, run with RLX_REQUIRE_GPU=1), then
# ResNet-50 batch 32, BERT-base 8 x 128 and the Qwen3-0.6B-sized prefill 512 on wgpu with each
# setting in WGPU_VARIANTS (default "default RLX_WGPU_SPLITK=0 RLX_WGPU_GEMM_MIN_WG=132":
# environment assignments, `default` for none), the plain run's outputs against the CPU's
# (`rlx run --output-dir`, numpy), a per-node profile (`rlx bench
# --profile`, timestamp queries; the table's CSV as $OUT/prof_<model>.csv), and `rlx diverge
# --backends wgpu` on BERT-base. With CUDA=1 also `rlx bench --device cuda` (plain and
# RLX_DEBUG_NANS=1) on the models and their _bf16 exports. PyTorch eager's times come from
# bench/gpu_models.py in the same call. Writes $OUT/wgpu_session.txt.
#
# Usage (device machine, repo root; a stripped release rlx in .devbin/, Debian's libvulkan1 and
# GL debs in .gl/, see bench/README.md): bench/wgpu_session.sh [models, default all three]
set -u
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done
ldconfig 2>/dev/null
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=${RLX_BIN:-.devbin/rlx}
DIR=${GPU_BENCH_DIR:-/tmp/rlx-gpu-bench}
MODELS=${1:-resnet50,bert_base,qwen3_0_6b}
{
  echo "== $($R --version 2>&1)"
  for t in .devbin/wgpu_tests/*.gz; do
    [ -e "$t" ] || continue
    b=/tmp/$(basename "$t" .gz); gunzip -c "$t" > "$b"; chmod +x "$b"
    printf '%s: ' "$(basename "$b")"
    (cd crates/rlx-wgpu && RLX_REQUIRE_GPU=1 timeout 300 "$b" --test-threads 1 2>&1) > /tmp/t.log
    grep -E "^test result|FAILED|panicked" /tmp/t.log | tr '\n' ' '; echo
    grep -q "^test result: ok" /tmp/t.log || tail -30 /tmp/t.log
  done
  TM=$MODELS
  [ "${CUDA:-0}" = 1 ] && TM="$MODELS,${MODELS//,/_bf16,}_bf16"
  python3 bench/gpu_models.py "$DIR" --models "$TM" --runs 10 2>&1 | grep -E "eager|Error|error" | tail -8
  for m in ${MODELS//,/ }; do
    for v in ${WGPU_VARIANTS:-default RLX_WGPU_SPLITK=0 RLX_WGPU_GEMM_MIN_WG=132}; do
      printf '%s %s: ' "$m" "$v"
      e=$v; [ "$v" = default ] && e=
      env $e RLX_DISPATCH_REPORT=1 timeout 300 $R bench "$DIR/$m" --device wgpu --warmup 2 --runs 5 > /tmp/w.log 2>&1
      echo "$(grep -E '^median:|^device median:|nodes on wgpu|convs run fused|rror' /tmp/w.log | cut -c1-120 | tr '\n' ' ')"
    done
    # The plain (fused) run's outputs against the CPU backend's.
    rm -rf /tmp/ow /tmp/oc
    timeout 300 $R run "$DIR/$m" --device wgpu --output-dir /tmp/ow > /dev/null 2>&1
    timeout 300 $R run "$DIR/$m" --device cpu --output-dir /tmp/oc > /dev/null 2>&1
    python3 -c "
import numpy as np, glob, os
for f in sorted(glob.glob('/tmp/oc/*.npy')):
    a = np.load(f).astype(np.float64); b = np.load('/tmp/ow/' + os.path.basename(f)).astype(np.float64)
    print('  $m wgpu vs cpu', os.path.basename(f), a.shape, 'max|diff| %.3g' % np.max(np.abs(a - b)), 'max|cpu| %.3g' % np.max(np.abs(a)), 'nan', int(np.isnan(a).sum()), int(np.isnan(b).sum()))
" 2>&1 | head -4
    timeout 300 $R bench "$DIR/$m" --device wgpu --warmup 1 --runs 2 --profile --profile-top 14 --profile-csv "$OUT/prof_$m.csv" 2>&1 | grep -vE "^(runs|min|mean|real|model|device|threads|nan-check):"
  done
  if [ "${CUDA:-0}" = 1 ]; then
    for m in ${TM//,/ }; do
      for v in "" "RLX_DEBUG_NANS=1"; do
        printf 'cuda %s %s: ' "$m" "${v:-plain}"
        env $v RLX_DISPATCH_REPORT=1 timeout 300 $R bench "$DIR/$m" --device cuda --warmup 3 --runs 10 > /tmp/c.log 2>&1
        echo "$(grep -E '^median:|^device median:|fused attention|nodes on cuda' /tmp/c.log | cut -c1-110 | tr '\n' ' ')"
      done
    done
  fi
  case ",$MODELS," in *,bert_base,*)
    echo "== rlx diverge --backends wgpu bert_base"
    timeout 300 $R diverge --backends wgpu "$DIR/bert_base" 2>&1 | tail -8 ;;
  esac
  cat "$DIR/torch.json"; echo
} 2>&1 | tee "$OUT/wgpu_session.txt"
