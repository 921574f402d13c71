#!/usr/bin/env python3
"""Per-node time of RLX against onnxruntime on one model (1 process each, same machine).

    .venv/bin/python bench/tools/node_cmp.py bench/models/squeezenet [--threads N]
        [--max-time S] [--top K] [--rlx target/release/rlx] [--keep DIR]

Both runtimes must name the same ONNX nodes, so the model is first copied with every node
renamed `k<i>` (its index in the graph) into a temporary folder beside the inputs. RLX's
times come from `rlx bench --profile --profile-csv` (a fused group's time is on the node that
runs it, e.g. the Conv of Conv+BatchNormalization+Relu); onnxruntime's from its profiler
(`enable_profiling`, CPUExecutionProvider, intra-op threads N, sequential, default graph
optimizations). onnxruntime's fused and NCHWc nodes are named after an output value or
carry suffixes; each is mapped back to the ONNX node that made that value, then walked back
through BatchNormalization/Relu/Clip/Add/Sigmoid/Mul (single producer) to the Conv or
MatMul it was fused into, so a fused group is compared with RLX's group. Layout reorders
(`ReorderInput`/`ReorderOutput`) are listed as their own row.

Prints: per ONNX op type, summed microseconds per run in each runtime; then the K nodes with
the largest RLX − ORT gap (node, op, output shape, RLX µs, ORT µs). Means over the profiled
runs. A development tool: nothing in CI runs it.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

WALK = {"BatchNormalization", "Relu", "Clip", "Add", "Sigmoid", "Mul", "LeakyRelu", "HardSigmoid"}


def renamed(src: Path, dst: Path) -> onnx.ModelProto:
    m = onnx.load(str(src))
    for i, n in enumerate(m.graph.node):
        n.name = f"k{i}"
    onnx.save(m, str(dst))
    return m


def ort_times(model: Path, feeds: dict, threads: int, max_time: float, tmp: Path) -> dict:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / "ortprof")
    s = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, feeds)
    n = 0
    t0 = time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < max_time:
        s.run(None, feeds)
        n += 1
    prof = s.end_profiling()
    ev = json.load(open(prof))
    sums: dict = defaultdict(float)
    ops: dict = {}
    for e in ev:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        sums[name] += e["dur"]
        ops[name] = e.get("args", {}).get("op_name", "?")
    runs = n + 3  # the warm-up runs are profiled too
    return {k: (v / runs, ops[k]) for k, v in sums.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-time", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--rlx", default="target/release/rlx")
    ap.add_argument("--keep", type=Path, help="keep the renamed model and profiles in DIR")
    a = ap.parse_args()

    src = a.model_dir / "model.onnx"
    tmp = Path(tempfile.mkdtemp(prefix="node_cmp_")) if a.keep is None else a.keep
    tmp.mkdir(parents=True, exist_ok=True)
    for f in a.model_dir.glob("input_*.npy"):
        shutil.copy(f, tmp / f.name)
    m = renamed(src, tmp / "model.onnx")
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    byname = {n.name: n for n in g.node}
    inits = {i.name for i in g.initializer}

    sess_inputs = [i.name for i in g.input if i.name not in inits]
    feeds = {}
    for name in sess_inputs:
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in name)
        feeds[name] = np.load(tmp / f"input_{safe}.npy")

    def source(ort_name: str):
        """The ONNX node an onnxruntime node stands for (None: a layout reorder)."""
        if ort_name.split("/")[0] in byname:  # `k75/QuickGeluFusion/`: Sigmoid+Mul as one
            ort_name = ort_name.split("/")[0]
        if ort_name in byname:
            n = byname[ort_name]
        else:
            base = ort_name
            for suf in ("_nchwc", "_token", "_fused"):
                if suf in base:
                    base = base[: base.index(suf)]
            n = producer.get(base) or byname.get(base)
            if n is None:
                return None
        while n.op_type in WALK:
            ups = [producer[i] for i in n.input if i in producer]
            if len(ups) == 0:
                break
            convs = [u for u in ups if u.op_type in ("Conv", "MatMul", "Gemm") or u.op_type in WALK]
            if not convs:
                break
            n = convs[0]
        return n

    o = ort_times(tmp / "model.onnx", feeds, a.threads, a.max_time, tmp)
    ort_by_node: dict = defaultdict(float)
    reorder = 0.0
    for name, (us, op) in o.items():
        if op.startswith("Reorder"):
            reorder += us
            continue
        n = source(name)
        if n is None:
            reorder += us
            continue
        ort_by_node[n.name] += us

    csvp = tmp / "rlx.csv"
    subprocess.run(
        [a.rlx, "bench", str(tmp), "--threads", str(a.threads), "--max-time", str(a.max_time),
         "--profile", "--profile-top", "1", "--profile-csv", str(csvp)],
        check=True, stdout=subprocess.DEVNULL)
    rlx_by_node: dict = defaultdict(float)
    shapes: dict = {}
    for row in csv.DictReader(open(csvp)):
        lab = row["label"]
        if lab in byname:
            n = source(lab) if byname[lab].op_type in WALK else byname[lab]
            rlx_by_node[n.name] += float(row["mean_us"])
            shapes.setdefault(n.name, row["shape"])
        else:
            rlx_by_node["(other)"] += float(row["mean_us"])

    # RLX runs a 1×1 conv and its depthwise reader as one pair, timed on the 1×1 conv:
    # move onnxruntime's time of such a depthwise conv onto its producer too.
    for k in list(ort_by_node):
        n = byname[k]
        if n.op_type == "Conv" and rlx_by_node.get(k, 0.0) < 1.0 and n.input[0] in producer:
            up = source(producer[n.input[0]].name)
            if up is not None and up.op_type == "Conv" and rlx_by_node.get(up.name, 0.0) > 0:
                ort_by_node[up.name] += ort_by_node.pop(k)
    by_op: dict = defaultdict(lambda: [0.0, 0.0])
    for k, v in rlx_by_node.items():
        by_op[byname[k].op_type if k in byname else k][0] += v
    for k, v in ort_by_node.items():
        by_op[byname[k].op_type][1] += v
    by_op["(reorder)"][1] += reorder
    print(f"{a.model_dir.name}, {a.threads} thread(s): µs per run, RLX / onnxruntime")
    print(f"{'op':<22}{'RLX':>10}{'ORT':>10}{'gap':>10}")
    tr = to = 0.0
    for k, (r, t) in sorted(by_op.items(), key=lambda kv: -(kv[1][0] - kv[1][1])):
        print(f"{k:<22}{r:>10.0f}{t:>10.0f}{r - t:>10.0f}")
        tr += r
        to += t
    print(f"{'total':<22}{tr:>10.0f}{to:>10.0f}{tr - to:>10.0f}")
    print()
    keys = set(rlx_by_node) | set(ort_by_node)
    rows = sorted(keys, key=lambda k: -(rlx_by_node.get(k, 0) - ort_by_node.get(k, 0)))
    print(f"{'node':<8}{'op':<20}{'shape':<24}{'RLX':>8}{'ORT':>8}  inputs")
    for k in rows[: a.top]:
        n = byname.get(k)
        op = n.op_type if n else k
        desc = ""
        if n is not None and n.op_type == "Conv":
            w = next((i for i in g.initializer if i.name == n.input[1]), None)
            at = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            desc = f"w{list(w.dims) if w is not None else '?'} s{at.get('strides', [1])} g{at.get('group', 1)}"
        print(f"{k:<8}{op:<20}{shapes.get(k, ''):<24}{rlx_by_node.get(k, 0):>8.0f}"
              f"{ort_by_node.get(k, 0):>8.0f}  {desc}")
    if a.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
