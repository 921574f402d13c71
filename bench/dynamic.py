#!/usr/bin/env python3
"""Steady-state latency of bench/run.sh's models through a dynamic package against the
static path (issue 32: "within 3% of the static path at 1 thread").

    .venv/bin/python bench/dynamic.py [--models bert,resnet18] [--rounds 3] [--max-time 2]

Needs bench/models/ (scripts/gen_bench_models.py) and target/release/rlx (or $RLX_BIN).
For each model:
a copy of model.onnx whose inputs' batch dim is the symbol `batch` (and a rank-2 integer
input's second dim `sequence`; dims already symbolic stay), compiled with
`rlx compile --dim batch=1..8 [--dim sequence=1..512]` (a model whose graph bakes its batch
size in, e.g. a Reshape to a constant shape, gets the one-size range its sizes allow), then
`rlx bench` at 1 thread pinned to CPU 0 alternately on the static model and on the package
at the model's own sizes, `--rounds` times each. Prints the medians, the median over rounds
of dynamic/static (each round's pair run back to back) and the ratio of the minimums, and
how the package planned the signature (RLX's `load:` line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
RLX = Path(os.environ.get("RLX_BIN", ROOT / "target" / "release" / "rlx"))
MODELS = "bert,gpt2,qwen3,minilm,squeezenet,mobilenet_v2,efficientnet_b0,resnet18,resnet50"


def make_dynamic(src: Path, dst: Path, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Writes `src` with symbolic batch (and sequence) dims to `dst`; returns the sizes the
    bench inputs bind them to."""
    m = onnx.load(str(src))
    inits = {i.name for i in m.graph.initializer}
    sizes: dict[str, int] = {}
    for inp in m.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        arr = inputs.get(inp.name)
        for k, d in enumerate(dims):
            name = None
            if d.dim_param:
                name = d.dim_param
            elif k == 0:
                name = "batch"
            elif k == 1 and len(dims) == 2 and arr is not None and arr.dtype.kind in "iu":
                name = "sequence"
            if name is None:
                continue
            if arr is not None:
                sizes[name] = int(arr.shape[k])
            d.ClearField("dim_value")
            d.dim_param = name
    # Outputs and intermediate types follow from the inputs.
    for out in m.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.ClearField("dim_value")
            d.ClearField("dim_param")
    del m.graph.value_info[:]
    onnx.save(m, str(dst))
    return sizes


def bench(args: list[str], max_time: float) -> tuple[float, float, str]:
    cmd = ["taskset", "-c", "0", str(RLX), "bench", *args, "--threads", "1",
           "--max-time", str(max_time)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[-400:]}")
    med = float(re.search(r"^median: ([0-9.]+) ms", p.stdout, re.M).group(1))
    low = float(re.search(r"^min: ([0-9.]+) ms", p.stdout, re.M).group(1))
    load = re.search(r"^load: (.*)$", p.stdout, re.M)
    return med, low, load.group(1) if load else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-time", type=float, default=2.0)
    a = ap.parse_args()
    if not RLX.exists():
        print(f"bench/dynamic.py: {RLX} is missing (cargo build --release -p rlx-cli)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="rlx-dyn-bench-"))
    rows = []
    for name in a.models.split(","):
        d = ROOT / "bench" / "models" / name
        if not (d / "model.onnx").exists():
            print(f"{name}: bench/models/{name}/model.onnx missing (scripts/gen_bench_models.py)", file=sys.stderr)
            continue
        # input_<name>.npy, the name with characters outside [A-Za-z0-9_] as "_".
        names = [i.name for i in onnx.load(str(d / "model.onnx"), load_external_data=False).graph.input]
        files = {}
        for n in names:
            f = d / f"input_{re.sub(r'[^A-Za-z0-9_]', '_', n)}.npy"
            if f.exists():
                files[n] = f
        arrays = {k: np.load(v) for k, v in files.items()}
        dyn = tmp / f"{name}.onnx"
        sizes = make_dynamic(d / "model.onnx", dyn, arrays)
        pkg = tmp / f"{name}.rlxpkg"
        ranges = {"batch": "1..8", "sequence": "1..512"}
        dims = [f"--dim={s}={ranges.get(s, f'1..{max(n, 1) * 2}')}" for s, n in sizes.items()]
        p = subprocess.run([str(RLX), "compile", str(dyn), *dims, "-o", str(pkg)],
                           capture_output=True, text=True)
        how = "ranges"
        if p.returncode != 0:
            # The graph bakes a size in: a package for exactly the bench sizes.
            dims = [f"--dim={s}={n}..{n}" for s, n in sizes.items()]
            p = subprocess.run([str(RLX), "compile", str(dyn), *dims, "-o", str(pkg)],
                               capture_output=True, text=True)
            how = "one size"
            if p.returncode != 0:
                print(f"{name}: rlx compile failed: {p.stderr.strip()[-300:]}", file=sys.stderr)
                continue
        ins = [f"--input={k}={v}" for k, v in files.items()]
        at = [f"--dim={s}={n}" for s, n in sizes.items()]
        st, dy, st_min, dy_min, load = [], [], [], [], ""
        for _ in range(a.rounds):
            m, low, _ = bench([str(d / "model.onnx"), *ins], a.max_time)
            st.append(m)
            st_min.append(low)
            m, low, load = bench([str(pkg), *ins, *at], a.max_time)
            dy.append(m)
            dy_min.append(low)
        # Each round's dynamic run right after its static one: the ratio per round is
        # robust to the machine's speed changing between rounds (a VM's CPU shifting by
        # 20-30% for minutes), which a ratio of medians is not.
        paired = statistics.median(y / x for x, y in zip(st, dy))
        r_min = min(dy_min) / min(st_min)
        rows.append((name, how, " ".join(dims), st, dy, paired, r_min, load))
        print(f"{name}: static {st} dynamic {dy} paired {paired:.3f} (min {r_min:.3f})", file=sys.stderr)
    print("| model | package dims | static medians (ms) | dynamic medians (ms) | dynamic / static, median of the rounds' ratios | by min | plan of the signature |")
    print("|---|---|---|---|---|---|---|")
    for name, how, dims, st, dy, paired, r_min, load in rows:
        plan = re.search(r"plan for [^:]*: (.*)", load)
        f = lambda v: ", ".join(f"{x:.3f}" for x in v)
        dims = dims.replace("--dim=", "")
        print(f"| {name} | {dims}{' (one size)' if how == 'one size' else ''} | {f(st)} | {f(dy)} | "
              f"**{paired:.3f}** | {r_min:.3f} | {plan.group(1) if plan else load} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
