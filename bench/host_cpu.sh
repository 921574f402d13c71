#!/usr/bin/env bash
# One call on the device machine's host CPU (issue 34): the CPU table of bench/bench.py (RLX
# against onnxruntime, 1 and 2 threads, pinned), per-node gaps from bench/tools/node_cmp.py,
# and interleaved A/B runs of the opt-in CPU kernels. Results go to $OUT (lscpu.txt,
# RESULTS-host.md, bench.log, node_cmp.txt, ab.txt).
#
# Usage (device machine, repo root, a stripped release rlx in .devbin/ carried; the models
# are generated there by its own python3, which has onnx, onnxruntime, torch, torchvision and
# transformers; MiniLM's weights are not on that machine; tract only where bench/.tools/bin/tract
# is carried, built here by bench/run.sh or `cargo install tract-cli` as run.sh does):
#   bench/host_cpu.sh [MODELS]   # default: every bench model but minilm
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export RLX_BIN=${RLX_BIN:-$PWD/.devbin/rlx}
MODELS=${1:-bert,gpt2,qwen3,squeezenet,mobilenet_v2,efficientnet_b0,resnet18,resnet50}
# Which parts run (comma-separated): table (bench.py), nodecmp (per-node gaps), ab (opt-in
# kernels A/B), abbin (this binary against an earlier one, below). Default: the first three.
STEPS=${HOST_STEPS:-table,nodecmp,ab}
# bench.py runs onnxruntime with .venv/bin/python: where there is none (the device machine),
# the machine's python3 stands in. A wrapper, not a symlink: that python3 is itself a venv's,
# and a symlink to it elsewhere loses the venv (its site-packages: numpy, onnxruntime). A
# working .venv/bin/python (a developer's venv) is left alone.
mkdir -p .venv/bin
if [ ! -x .venv/bin/python ]; then
  rm -f .venv/bin/python
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > .venv/bin/python
  chmod +x .venv/bin/python
fi
# The copy there has no git history: the revision comes from .devbin/REV (written here by
# `git rev-parse --short HEAD > .devbin/REV` when the binary is built).
[ -f .devbin/REV ] && export RLX_BENCH_REV=$(cat .devbin/REV)
{ lscpu; nproc; uptime; } > "$OUT/lscpu.txt" 2>&1
t0=$(date +%s)
python3 scripts/gen_bench_models.py ${MODELS//,/ } > "$OUT/gen.log" 2>&1
echo "models written in $(( $(date +%s) - t0 )) s" >> "$OUT/gen.log"
# HOST_ROUNDS processes per runtime, RLX and onnxruntime taking turns, ratios paired by
# round (default 3): on that shared host one pass swung rows by up to 1.6x (bench/NOTES.md §33).
# Each round pinned to the CPUs that read fastest just before it (--pin-fastest; HOST_PIN=first
# pins to CPUs 0..N-1 as before): that host's CPUs ran at 0.55-1.0 of each other for minutes
# (bench/NOTES.md §35).
PIN_ARG=--pin-fastest
[ "${HOST_PIN:-fastest}" = first ] && PIN_ARG=
# tract joins the table where its binary was carried (HOST_RUNTIMES overrides).
RUNTIMES=rlx,ort
[ -x bench/.tools/bin/tract ] && RUNTIMES=rlx,ort,tract
RUNTIMES=${HOST_RUNTIMES:-$RUNTIMES}
[[ ",$STEPS," == *,table,* ]] && python3 bench/bench.py --models "$MODELS" --threads 1,2 --runtimes "$RUNTIMES" $PIN_ARG \
  --max-time "${HOST_MAX_TIME:-1}" --rounds "${HOST_ROUNDS:-3}" \
  --results "$OUT/RESULTS-host.md" > "$OUT/bench.log" 2>&1
[[ ",$STEPS," == *,nodecmp,* ]] && for m in ${NODECMP_MODELS:-resnet50 mobilenet_v2 efficientnet_b0 squeezenet}; do
  echo "== $m"
  for t in ${NODECMP_THREADS:-1}; do
    # Pinned to the t CPUs that read fastest now (bench.py's loop), both runtimes alike:
    # unpinned, the tenth run's per-node sums read 1.2-1.4x the table's times.
    cpus=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import bench; bench.pin_fastest([$t]); print(','.join(map(str, bench.PIN.get($t, range($t)))))")
    echo "-- pinned to CPUs $cpus"
    timeout 150 taskset -c "$cpus" python3 bench/tools/node_cmp.py "bench/models/$m" --threads "$t" \
      --top "${NODECMP_TOP:-12}" --max-time "${NODECMP_MAX_TIME:-2}" --rlx "$RLX_BIN" 2>&1 | tail -$((18 + ${NODECMP_TOP:-12}))
  done
done > "$OUT/node_cmp.txt"
# A variable's 0 against 1 (default RLX_CPU_MK_ROWS, bench/NOTES.md §27; HOST_AB_VAR picks
# another, HOST_AB_MODELS the models, HOST_AB_THREADS the thread counts), 3 interleaved
# rounds, pinned to the first cores.
AB_VAR=${HOST_AB_VAR:-RLX_CPU_MK_ROWS}
[[ ",$STEPS," == *,ab,* ]] && for r in 1 2 3; do
  for m in ${HOST_AB_MODELS:-squeezenet mobilenet_v2 efficientnet_b0 resnet18 resnet50}; do
    for t in ${HOST_AB_THREADS:-1}; do
      for v in 0 1; do
        res=$(env "$AB_VAR=$v" taskset -c 0-$((t - 1)) "$RLX_BIN" bench "bench/models/$m" --threads "$t" --max-time 1.5 2>&1 | grep -E 'median|min' | tr '\n' ' ')
        echo "$m threads=$t $AB_VAR=$v $res"
      done
    done
  done
done > "$OUT/ab.txt"
# This binary against an earlier build (HOST_AB_BASE, default .devbin/rlx_base), and against
# itself under HOST_ABBIN_ENV (e.g. RLX_CPU_MK_IM=0: the change that variable undoes), in
# HOST_ABBIN_ROUNDS interleaved rounds (default 5) per model and thread count, pinned.
BASE=${HOST_AB_BASE:-$PWD/.devbin/rlx_base}
[[ ",$STEPS," == *,abbin,* ]] && for r in $(seq "${HOST_ABBIN_ROUNDS:-5}"); do
  for m in ${HOST_ABBIN_MODELS:-squeezenet}; do
    for t in ${HOST_ABBIN_THREADS:-1 2}; do
      for v in base env new; do
        case $v in
          base) cmd=("$BASE") ;;
          env) cmd=(env ${HOST_ABBIN_ENV:-RLX_CPU_MK_IM=0} "$RLX_BIN") ;;
          new) cmd=("$RLX_BIN") ;;
        esac
        res=$(taskset -c 0-$((t - 1)) "${cmd[@]}" bench "bench/models/$m" --threads "$t" --max-time 1.5 2>&1 | grep -E 'median|min' | tr '\n' ' ')
        echo "round=$r $m threads=$t $v $res"
      done
    done
  done
done > "$OUT/abbin.txt"
uptime >> "$OUT/lscpu.txt"
