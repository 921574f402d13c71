#!/usr/bin/env python3
"""Import time of a .pt2: RLX (archive → IR graph, no Python) against torch.export.load on the
same file, median of N runs each, in one process run. Prints one row per model and the ratio.

    cargo build --release -p rlx-torch-import --example import_time
    .venv/bin/python bench/pt2_import.py [fixtures/torch/resnet18/model.pt2 ...] [--runs 10]
"""
import argparse, glob, logging, os, statistics, subprocess, time
logging.disable(logging.WARNING)
import torch
try:  # registers the pytree types of HF model outputs that torch.export.load needs
    import transformers  # noqa: F401
except ImportError:
    pass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("models", nargs="*")
ap.add_argument("--runs", type=int, default=10)
a = ap.parse_args()
models = a.models or sorted(glob.glob(os.path.join(ROOT, "fixtures/torch/*/model.pt2")))
exe = os.path.join(ROOT, "target/release/examples/import_time")
print(f"{'model':<24} {'MB':>7} {'torch.export.load ms':>21} {'rlx import ms':>14} {'ratio':>7}")
for m in models:
    ts = []
    name = os.path.basename(os.path.dirname(m))
    rlx_ms = float(subprocess.check_output([exe, m, str(a.runs)], text=True).strip())
    try:
        for _ in range(a.runs):
            t = time.perf_counter(); torch.export.load(m); ts.append((time.perf_counter() - t) * 1e3)
    except Exception as e:  # HF output types must be registered with pytree in this process
        print(f"{name:<24} {os.path.getsize(m)/1e6:>7.2f} {'(torch cannot load: ' + type(e).__name__ + ')':>21} {rlx_ms:>14.2f}")
        continue
    torch_ms = statistics.median(ts)
    print(f"{name:<24} {os.path.getsize(m)/1e6:>7.2f} {torch_ms:>21.2f} {rlx_ms:>14.2f} {torch_ms/rlx_ms:>6.1f}x")
