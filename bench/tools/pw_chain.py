#!/usr/bin/env python3
"""A chain of 1×1 convolutions (Conv + Clip(0, 6)), to time pointwise convs in and out of cache.

    .venv/bin/python bench/tools/pw_chain.py DIR [--convs N] [--wide C1] [--narrow C2] [--hw P]

Writes DIR/model.onnx and DIR/input_X.npy (the layout `node_cmp.py` and `rlx bench --input`
read). The convs alternate C2 → C1 and C1 → C2 channels on a P×P plane (defaults: 16 convs,
960 and 160 channels, 7×7: MobileNetV2's last stage) and end in GlobalAveragePool. Each conv
has its own weights, so with N × C1 × C2 × 4 bytes beyond the L2 cache each conv reads its
weights from L3 or memory, as in a whole model, while `--convs 1` gives the one-node figure
(weights hot after the first run). Weights are random (seed 0), scaled by 1/sqrt(fan-in).

    .venv/bin/python bench/tools/node_cmp.py DIR --threads 1 --top 20

prints each conv's time in RLX and onnxruntime. A development tool: nothing in CI runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(convs: int, wide: int, narrow: int, hw: int) -> tuple[onnx.ModelProto, np.ndarray]:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6, np.float32), "hi"),
    ]
    nodes = []
    prev, c = "X", narrow
    for i in range(convs):
        m = wide if i % 2 == 0 else narrow
        w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        b = (rng.standard_normal(m) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"W{i}", f"B{i}"], [f"c{i}"], name=f"conv{i}"))
        nodes.append(helper.make_node("Clip", [f"c{i}", "lo", "hi"], [f"r{i}"], name=f"clip{i}"))
        prev, c = f"r{i}", m
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["out"], name="gap"))
    graph = helper.make_graph(
        nodes,
        "pw_chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, narrow, hw, hw])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    x = rng.standard_normal((1, narrow, hw, hw)).astype(np.float32)
    return model, x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="output folder (created)")
    ap.add_argument("--convs", type=int, default=16, help="number of 1x1 convs (default 16)")
    ap.add_argument("--wide", type=int, default=960, help="channels after even convs (960)")
    ap.add_argument("--narrow", type=int, default=160, help="input channels (160)")
    ap.add_argument("--hw", type=int, default=7, help="plane height = width (7)")
    a = ap.parse_args()
    for name in ("convs", "wide", "narrow", "hw"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    # Weights and the input, in bytes; onnx.save keeps a model in one protobuf (< 2 GB).
    size = 4 * (a.convs * a.wide * a.narrow + a.narrow * a.hw * a.hw)
    if size > 1 << 30:
        ap.error(f"the model would hold {size / 1e9:.1f} GB of tensors; at most 1 GB")
    if a.dir.exists() and not a.dir.is_dir():
        ap.error(f"{a.dir} exists and is not a folder")
    try:
        a.dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"cannot create {a.dir}: {e.strerror}")
    model, x = build(a.convs, a.wide, a.narrow, a.hw)
    onnx.save(model, a.dir / "model.onnx")
    np.save(a.dir / "input_X.npy", x)
    mb = sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer) / 1e6
    print(f"{a.dir}: {a.convs} convs at {a.hw}x{a.hw}, {mb:.1f} MB of weights")


if __name__ == "__main__":
    main()
