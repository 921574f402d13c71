#!/usr/bin/env python3
"""ONNX's backend node cases through the CLI, as a user drives it: `rlx run model.onnx
--input input_0.pb --input input_1.pb ... --output-dir D`, then D's .npy files against the
case's output_<k>.pb (rtol 1e-3, bfloat16 1/64, atol 1e-7, NaN equal to NaN, dtype and
shape exact; the conformance harness's rule). No input is frozen by the harness.

    .venv/bin/python scripts/cli_node_suite.py [--rlx target/release/rlx] [--jobs 2] [--json FILE] [CASE_PREFIX...]

Needs fixtures/onnx-node (scripts/onnx-node-suite). Prints the pass count and, per failure
reason, a few cases; --json writes every case's outcome. Cases whose inputs or outputs are
sequences/optionals (not tensor .pb files) count as failures here ("not a tensor").
"""

from __future__ import annotations

import argparse
import json
import re
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "fixtures" / "onnx-node"


def sanitize(name: str) -> str:
    return "".join(c if (c.isalnum() or c in "-_.") else "_" for c in name)


def read_tensor(p: Path):
    t = onnx.TensorProto()
    t.ParseFromString(p.read_bytes())
    if not t.name and t.data_type == 0:
        raise ValueError("not a tensor")
    return numpy_helper.to_array(t)


# NumPy has no bfloat16/float8/float4/int4 dtypes; `rlx run` writes such outputs widened
# (float32, int8/uint8: docs/DEBUGGING.md), so those compare by value after the same widening.
NARROW = {"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
          "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"}


def close(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    rtol = 1e-3
    if want.dtype.name == "bfloat16":
        rtol = 1.0 / 64  # two bf16 ULPs, as onnx's runner and rlx-conformance's compare.rs
    if want.dtype.name in NARROW and got.dtype.name in ("float32", "int8", "uint8"):
        want = want.astype(got.dtype)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} vs {want.dtype}"
    if want.dtype.kind in "fc":
        g = got.astype(np.float64)
        w = want.astype(np.float64)
        nan = np.isnan(w)
        if (np.isnan(g) != nan).any():
            return "NaN positions"
        g, w = g[~nan], w[~nan]
        inf = np.isinf(w)
        if (g[inf] != w[inf]).any():
            return "Inf values"
        bad = np.abs(g[~inf] - w[~inf]) > 1e-7 + rtol * np.abs(w[~inf])
        return "values" if bad.any() else None
    return None if np.array_equal(got, want) else "values"


def run_case(rlx: str, case: Path) -> tuple[str, str]:
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    outs = [o.name for o in model.graph.output]
    for ds in sorted(case.glob("test_data_set_*")):
        ins = sorted(ds.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        with tempfile.TemporaryDirectory() as d:
            cmd = [rlx, "run", str(case / "model.onnx"), "-q", "--output-dir", d]
            for p in ins:
                cmd += ["--input", str(p)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                return "fail", "timeout"
            if r.returncode != 0:
                msg = (r.stderr.strip().splitlines() or ["?"])[-1]
                return "fail", "error: " + msg[:200]
            for k, name in enumerate(outs):
                op = ds / f"output_{k}.pb"
                if not op.exists():
                    continue
                try:
                    want = read_tensor(op)
                except Exception:
                    return "fail", "not a tensor"
                gp = Path(d) / f"{sanitize(name)}.npy"
                if not gp.exists():
                    return "fail", f"no output file for {name}"
                why = close(np.load(gp), want)
                if why:
                    return "fail", f"output {name}: {why}"
    return "pass", ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", default=str(ROOT / "target" / "release" / "rlx"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json")
    ap.add_argument("prefix", nargs="*")
    a = ap.parse_args()
    cases = sorted(p for p in SUITE.iterdir() if (p / "model.onnx").exists())
    if a.prefix:
        cases = [c for c in cases if any(c.name.startswith(x) for x in a.prefix)]
    with ThreadPoolExecutor(a.jobs) as ex:
        res = dict(zip((c.name for c in cases), ex.map(lambda c: run_case(a.rlx, c), cases)))
    passed = sum(1 for v in res.values() if v[0] == "pass")
    print(f"{passed} of {len(cases)} node cases pass through `rlx run` with .pb inputs")
    reasons: dict[str, list[str]] = {}
    for n, (st, why) in res.items():
        if st != "pass":
            key = why.split(":")[0] if not why.startswith("error") else re.sub(
                r"(/[^ :]+)+", "PATH", re.sub(r"\"[^\"]*\"", "\"X\"", why))[:110]
            reasons.setdefault(key, []).append(n)
    for k, v in sorted(reasons.items(), key=lambda kv: -len(kv[1]))[:25]:
        print(f"  {len(v):4d}  {k}  e.g. {', '.join(v[:3])}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
