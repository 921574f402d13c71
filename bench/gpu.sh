#!/usr/bin/env bash
# GPU benchmark, one call on the GPU machine (issue 30 item 7): ResNet-50 batch 32, BERT-base
# 8 x 128, a Qwen3-0.6B-sized decoder prefill 512 (random weights, torch.export'ed to .pt2 by
# bench/gpu_models.py), each timed with `rlx bench` on every RLX GPU device and on the CPU
# (all cores), against PyTorch eager (and torch.compile with --compile) in the same call.
#
# Usage:  bench/gpu.sh [--compile] [--models a,b] [--runs N]
#         (models: resnet50, bert_base, qwen3_0_6b and their _bf16 exports, all by default)
# Env:    RLX_GPU_DEVICES (GPU backends to time, default "cuda wgpu"), RLX_BENCH_CPU=0 (skip
#         RLX's CPU backend),
#         RLX_BIN (default target/release/rlx), RLX_BASE_BIN (another build, timed on wgpu
#         too as device "wgpu-base", for an A/B in the same call), GPU_BENCH_DIR (models, default
#         /tmp/rlx-gpu-bench), OUT (where RESULTS-GPU.md and the logs go, default bench/out).
# Needs:  python3 with torch, torchvision, transformers and a CUDA GPU; a Vulkan loader and
#         driver for wgpu (the device machine: unpack libvulkan1 first, see bench/README.md).
set -u
RLX=${RLX_BIN:-target/release/rlx}
DIR=${GPU_BENCH_DIR:-/tmp/rlx-gpu-bench}
OUT=${OUT:-bench/out}
MODELS=resnet50,bert_base,qwen3_0_6b,resnet50_bf16,bert_base_bf16,qwen3_0_6b_bf16
RUNS=10
COMPILE=
while [ $# -gt 0 ]; do
  case "$1" in
    --compile) COMPILE=--compile ;;
    --models) MODELS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench/gpu.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$DIR" "$OUT"
THREADS=$(nproc)
echo "== $($RLX --version 2>&1)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
python3 bench/gpu_models.py "$DIR" --models "$MODELS" --runs "$RUNS" $COMPILE 2>&1 | tee "$OUT/gpu_torch.log"
# Devices RLX can use here (cpu unless RLX_BENCH_CPU=0).
DEVS=cpu
[ "${RLX_BENCH_CPU:-1}" = 0 ] && DEVS=""
for d in ${RLX_GPU_DEVICES:-cuda wgpu}; do
  if $RLX bench "$DIR/${MODELS%%,*}" --device $d --runs 1 --warmup 0 >/dev/null 2>"$OUT/probe_$d.log"; then
    DEVS="$DEVS $d"
  else
    echo "rlx --device $d: $(tail -1 "$OUT/probe_$d.log")"
  fi
done
: > "$OUT/gpu_rlx.tsv"
for m in ${MODELS//,/ }; do
  ALL=$DEVS
  case " $DEVS " in *" wgpu "*) [ -n "${RLX_BASE_BIN:-}" ] && ALL="$ALL wgpu-base" ;; esac
  # The cost of RLX_DEBUG_NANS=1 on CUDA (issue 30: at most 1.15x): the same run, scanning.
  case " $DEVS " in *" cuda "*) ALL="$ALL cuda+nans" ;; esac
  # bfloat16 exports (name_bf16) run on CUDA only: its bfloat16 path against torch eager bf16.
  case $m in *_bf16) ALL=""; case " $DEVS " in *" cuda "*) ALL="cuda cuda+nans" ;; esac ;; esac
  for d in $ALL; do
    extra=""
    bin=$RLX
    dev=$d
    [ "$d" = cpu ] && extra="--threads $THREADS"
    nans=
    [ "$d" = wgpu-base ] && { bin=$RLX_BASE_BIN; dev=wgpu; }
    [ "$d" = cuda+nans ] && { dev=cuda; nans=1; }
    log="$OUT/rlx_${m}_$d.log"
    RLX_DEBUG_NANS=$nans RLX_DISPATCH_REPORT=1 timeout 300 $bin bench "$DIR/$m" --device $dev --warmup 3 --runs "$RUNS" $extra >"$log" 2>&1
    rc=$?
    med=$(grep '^median:' "$log" | awk '{print $2}')
    dmed=$(grep '^device median:' "$log" | awk '{print $3}')
    cov=$(grep -E 'dispatch: .*nodes on ' "$log" | tail -1 | sed 's/.*: //')
    echo "$m	$d	${med:-fail(rc=$rc)}	${cov:-}	${dmed:--}" | tee -a "$OUT/gpu_rlx.tsv"
  done
done
python3 - "$DIR/torch.json" "$OUT/gpu_rlx.tsv" "$OUT/RESULTS-GPU.md" "$THREADS" <<'EOF'
import json, sys
torch = json.load(open(sys.argv[1]))
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()]
threads = sys.argv[4]
rlx = {}
for m, d, med, *rest in rows:
    cov = rest[0] if rest else ""
    dev = rest[1] if len(rest) > 1 and rest[1] != "-" else None
    rlx.setdefault(m, {})[d] = (med, cov, dev)
cols = ["eager_f32", "compile_f32", "eager_bf16", "compile_bf16"]
# "RLX ms" is the wall time of a whole run (inputs uploaded, outputs read back); "device ms"
# (CUDA) the run's kernels alone, CUDA events as torch's times, whose tensors stay on the GPU:
# the ratio uses the device time where there is one.
out = ["| model | RLX device | RLX ms | device ms | " + " | ".join(f"torch {c} ms" for c in cols) + " | RLX / torch eager (same dtype) | RLX / torch.compile | placement |",
       "|---" * (8 + len(cols)) + "|"]
for m, devs in rlx.items():
    bf16 = m.endswith("_bf16")
    t = torch.get(m[: -len("_bf16")] if bf16 else m, {})
    peer = "eager_bf16" if bf16 else "eager_f32"
    cpeer = peer.replace("eager", "compile")
    for d, (med, cov, dev) in devs.items():
        try:
            x = float(dev or med)
            ratio = f"{x / t[peer]:.2f} (vs {peer})" if peer in t else "-"
            cratio = f"{x / t[cpeer]:.2f}" if cpeer in t else "-"
        except ValueError:
            ratio = cratio = "-"
        name = d if d != "cpu" else f"cpu ({threads} threads)"
        out.append(f"| {m} | {name} | {med} | {dev or '-'} | " + " | ".join(f"{t[c]:.2f}" if c in t else "-" for c in cols) + f" | {ratio} | {cratio} | {cov} |")
for m, devs in rlx.items():
    try:
        on, off = float(devs["cuda+nans"][0]), float(devs["cuda"][0])
        line = f"\n{m}: RLX_DEBUG_NANS=1 on CUDA costs {on / off:.3f}x wall ({on} vs {off} ms)"
        if devs["cuda+nans"][2] and devs["cuda"][2]:
            don, doff = float(devs["cuda+nans"][2]), float(devs["cuda"][2])
            line += f", {don / doff:.3f}x device time ({don} vs {doff} ms)"
        out.append(line)
    except (KeyError, ValueError):
        pass
open(sys.argv[3], "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
