#!/usr/bin/env bash
# RLX vs onnxruntime vs tract on the benchmark models: one command on a fresh clone.
#
#   bench/run.sh                       # all models, 1 and 2 threads, RLX + ORT + tract
#   bench/run.sh --smoke               # bert_tiny fixture, RLX only, 3 runs (no venv, no tract)
#   bench/run.sh --threads 1 --models bert,resnet50 --max-time 1
#
# Options: --smoke, --threads LIST, --models LIST, --runtimes LIST (rlx,ort,tract),
#          --max-time S (timed seconds per process, default 2), --warmup W (default 3),
#          --no-nan (skip the RLX_DEBUG_NANS=1 runs), --no-pin (do not pin each process to the
#          first N CPUs at N threads), --no-results (don't write bench/RESULTS.md).
# Steps: venv (scripts/setup-venv.sh, --torch only when a torch-made model is missing),
# models (scripts/gen_bench_models.py -> bench/models/), tract-cli 0.23.9 with multithread-mm
# (cargo install -> bench/.tools, built once), rlx (cargo build --release -p rlx-cli), then
# bench/bench.py, which prints the table and writes bench/RESULTS.md. See bench/README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TRACT_VERSION=0.23.9

SMOKE=0
RESULTS=1
MODELS="bert,gpt2,qwen3,minilm,squeezenet,mobilenet_v2,efficientnet_b0,resnet18,resnet50"
RUNTIMES="rlx,ort,tract"
PASS=()
CMDLINE="bench/run.sh${*:+ $*}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --models) MODELS="$2"; shift ;;
    --runtimes) RUNTIMES="$2"; shift ;;
    --threads|--max-time|--warmup|--runs|--rounds) PASS+=("$1" "$2"); shift ;;
    --no-nan|--no-pin) PASS+=("$1") ;;
    --no-results) RESULTS=0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench/run.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "bench: $*" >&2; }

if [[ "$SMOKE" == 1 ]]; then
  log "smoke: cargo build --release -p rlx-cli"
  cargo build --release -p rlx-cli
  PY="$(command -v python3)"
  [[ -x .venv/bin/python ]] && PY=.venv/bin/python
  exec "$PY" bench/bench.py --smoke "${PASS[@]}"
fi

# tract: start its (long) build first, in the background, at low priority.
TRACT_PID=""
if [[ ",$RUNTIMES," == *",tract,"* ]] && ! bench/.tools/bin/tract --version 2>/dev/null | grep -q "$TRACT_VERSION"; then
  log "building tract-cli $TRACT_VERSION in the background (log: bench/.tools/build.log)"
  mkdir -p bench/.tools
  nice -n 19 cargo install tract-cli --version "$TRACT_VERSION" --features multithread-mm \
    --locked --root bench/.tools --target-dir bench/.tools/target >bench/.tools/build.log 2>&1 &
  TRACT_PID=$!
fi

# venv: torch only when a model that needs it is missing.
NEED_TORCH=0
if ! { [[ -x .venv/bin/python ]] && .venv/bin/python -c "import onnx, onnxruntime, numpy" 2>/dev/null; }; then
  scripts/setup-venv.sh
fi
LIST="$(.venv/bin/python scripts/gen_bench_models.py --list ${MODELS//,/ })"
while read -r name torch; do
  if [[ "$torch" == 1 && ! -f "bench/models/$name/model.onnx" ]]; then NEED_TORCH=1; fi
done <<<"$LIST"
if [[ "$NEED_TORCH" == 1 ]] && ! .venv/bin/python -c "import torch, torchvision, transformers" 2>/dev/null; then
  log "models need torch: scripts/setup-venv.sh --torch"
  scripts/setup-venv.sh --torch
fi
log "models -> bench/models/"
.venv/bin/python scripts/gen_bench_models.py ${MODELS//,/ }

log "cargo build --release -p rlx-cli"
cargo build --release -p rlx-cli

if [[ -n "$TRACT_PID" ]]; then
  log "waiting for the tract-cli build (pid $TRACT_PID)"
  if ! wait "$TRACT_PID"; then
    log "tract-cli build failed (see bench/.tools/build.log); running without tract"
    RUNTIMES="${RUNTIMES//tract/}"
  fi
fi

ARGS=(--models "$MODELS" --runtimes "$RUNTIMES" --command "$CMDLINE")
[[ "$RESULTS" == 1 ]] && ARGS+=(--results bench/RESULTS.md)
log "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
exec .venv/bin/python bench/bench.py "${ARGS[@]}" "${PASS[@]}"
