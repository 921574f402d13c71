#!/usr/bin/env bash
# Where CUDA time goes: `rlx bench --profile --device cuda` (CUDA events between nodes) on the
# GPU bench models (made by bench/gpu_models.py), then the time per IR op kind from the CSV.
#
# Usage (device machine, repo root): bench/cuda_profile.sh [models, default bert_base,qwen3_0_6b]
# Env: RLX_BIN (default target/release/rlx), GPU_BENCH_DIR (default /tmp/rlx-gpu-bench), OUT
# (default bench/out: prof_<model>.csv, prof_<model>.txt).
set -u
R=${RLX_BIN:-target/release/rlx}
DIR=${GPU_BENCH_DIR:-/tmp/rlx-gpu-bench}
OUT=${OUT:-bench/out}
MODELS=${1:-bert_base,qwen3_0_6b}
mkdir -p "$DIR" "$OUT"
python3 bench/gpu_models.py "$DIR" --models "$MODELS" --runs 5 >"$OUT/prof_torch.log" 2>&1 || tail -5 "$OUT/prof_torch.log"
for m in ${MODELS//,/ }; do
  {
    $R bench "$DIR/$m" --device cuda --warmup 2 --runs 5 --profile --profile-top 12 --profile-csv "$OUT/prof_$m.csv" 2>&1
    python3 - "$OUT/prof_$m.csv" <<'PY'
import csv, sys, collections
t, c = collections.Counter(), collections.Counter()
for r in csv.DictReader(open(sys.argv[1])):
    t[r["op"]] += float(r["mean_us"]); c[r["op"]] += 1
tot = sum(t.values())
print(f"per IR op kind (us/run, share of {tot:.0f} us, nodes):")
for op, us in t.most_common(15):
    print(f"  {op:<16} {us:10.1f} {100 * us / tot:5.1f}% {c[op]:5d}")
PY
  } >"$OUT/prof_$m.txt" 2>&1
  cat "$OUT/prof_$m.txt"
done
