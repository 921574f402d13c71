#!/usr/bin/env python3
"""Time steady-state onnxruntime runs of one model, printing the same lines as `rlx bench`.

    .venv/bin/python bench/ort_bench.py MODEL_DIR [--threads N] [--warmup W]
                                        [--runs R | --max-time S] [--output-dir DIR]

MODEL_DIR holds model.onnx and one input_<name>.npy per graph input (bench/models/<name>/,
made by scripts/gen_bench_models.py). The session uses CPUExecutionProvider,
intra_op_num_threads=N, inter_op_num_threads=1 and sequential execution; graph optimizations
stay at onnxruntime's default (ORT_ENABLE_ALL), as a user would run it. "load" is the
InferenceSession construction time; each timed run is one `sess.run(None, feeds)` call.
Output (the last line is `real: <mean seconds per run>`):

    model: ...
    threads: N
    load: X ms
    baseline-rss: X MB      (peak RSS after importing onnxruntime, before the session)
    runs: R (warmup W)
    median: X ms
    min: X ms
    mean: X ms
    real: X
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--runs", type=int)
    g.add_argument("--max-time", type=float)
    ap.add_argument("--output-dir", type=Path)
    a = ap.parse_args()

    model = a.model_dir / "model.onnx" if a.model_dir.is_dir() else a.model_dir
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - t0
    feeds = {}
    for i in sess.get_inputs():
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in i.name)
        p = model.parent / f"input_{safe}.npy"
        if not p.is_file():
            print(f"ort_bench: {p}: missing input file for input {i.name!r}", file=sys.stderr)
            return 1
        feeds[i.name] = np.load(p)
    print(f"model: {model}")
    print(f"threads: {a.threads}")
    print(f"load: {load * 1e3:.3f} ms")
    print(f"baseline-rss: {base_rss:.1f} MB")
    for _ in range(a.warmup):
        sess.run(None, feeds)
    times = []
    budget = a.max_time if a.max_time is not None else 3.0
    start = time.perf_counter()
    out = None
    while True:
        t = time.perf_counter()
        out = sess.run(None, feeds)
        times.append(time.perf_counter() - t)
        if a.runs is not None:
            if len(times) >= a.runs:
                break
        elif len(times) >= 100_000 or (len(times) >= 3 and time.perf_counter() - start >= budget):
            break
    if a.output_dir is not None:
        a.output_dir.mkdir(parents=True, exist_ok=True)
        for o, v in zip(sess.get_outputs(), out):
            name = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in o.name)
            np.save(a.output_dir / f"{name}.npy", v)
    ts = np.array(times)
    print(f"runs: {len(times)} (warmup {a.warmup})")
    print(f"median: {np.median(ts) * 1e3:.3f} ms")
    print(f"min: {ts.min() * 1e3:.3f} ms")
    print(f"mean: {ts.mean() * 1e3:.3f} ms")
    print(f"real: {ts.mean():.9f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
