#!/usr/bin/env python3
"""Per-node profile sanity benchmark (moved out of crates/rlx-cpu/tests/executor.rs, where a
unit test asserted a time ratio): a 192x192 MatMul followed by a Slice to 1x2 and a Neg.
`rlx bench --profile` should put the time on the MatMul (about 7 M multiply-adds), not on
the 2-element Neg. Prints the MatMul/Neg time ratio and which node took the most time; exits
1 when the MatMul is not the slowest node (a profiler that books time on the wrong node).
Not run by CI (timings depend on the machine).

    .venv/bin/python bench/profile_ratio.py            # uses target/release/rlx, builds it if missing
    RLX_BIN=path/to/rlx .venv/bin/python bench/profile_ratio.py
"""
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
N = 192


def model(path: Path) -> None:
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["a", "b"], ["m"], name="product"),
            helper.make_node("Slice", ["m", "starts", "ends"], ["sl"], name="corner"),
            helper.make_node("Neg", ["sl"], ["y"], name="negate"),
        ],
        "profile_ratio",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [N, N]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [i64("starts", [0, 0]), i64("ends", [1, 2])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def main() -> int:
    rlx = os.environ.get("RLX_BIN") or str(ROOT / "target/release/rlx")
    if not Path(rlx).is_file():
        subprocess.run(["cargo", "build", "--release", "-p", "rlx-cli"], cwd=ROOT, check=True)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        model(d / "model.onnx")
        out = d / "profile.csv"
        subprocess.run(
            [rlx, "bench", str(d / "model.onnx"), "--runs", "50", "--threads", "1",
             "--profile", "--profile-csv", str(out)],
            check=True, stdout=subprocess.DEVNULL,
        )
        rows = list(csv.DictReader(out.open()))
    by_label = {}
    for r in rows:
        by_label[r["label"]] = by_label.get(r["label"], 0.0) + float(r["mean_us"])
    mm, neg = by_label.get("product", 0.0), by_label.get("negate", 0.0)
    top = max(rows, key=lambda r: float(r["mean_us"]))
    ratio = mm / neg if neg > 0 else float("inf")
    print(f"MatMul {mm:.1f} us, Neg {neg:.3f} us, ratio {ratio:.0f}; slowest node: "
          f"{top['op']} \"{top['label']}\"")
    return 0 if top["label"] == "product" else 1


if __name__ == "__main__":
    sys.exit(main())
