#!/usr/bin/env python3
"""Check a model written by `rlx precision` in onnxruntime on held-back inputs, and compare
its kept-node count with NVIDIA Model Optimizer AutoCast's documented rule.

    .venv/bin/python scripts/check_precision.py fixtures/precision/bert_overflow OUT.onnx [--tol-rel 1e-2]
    .venv/bin/python scripts/check_precision.py --table [--rlx target/debug/rlx]   # every model, the docs table
    .venv/bin/python scripts/check_precision.py --table --modelopt /tmp/modelopt-venv/bin/python

Per held-back set (DIR/heldout/<k>/input_<name>.npy, expected_<out>.npy = onnxruntime's
float32 outputs from scripts/gen_precision_models.py): run OUT.onnx in onnxruntime (CPU),
check every output is finite and max |out - expected| / max |expected| <= tol. Prints one
JSON object; exit 1 when a check fails.

Known deviation: onnxruntime's CPU provider runs many float16 ops in float32 internally
(MatMul, Softmax, LayerNormalization upcast; values are rounded to float16 only where a
kernel writes its float16 output), so it is more forgiving than a GPU would be; RLX rounds
every op's output to float16 (docs/DEBUGGING.md "Half precision"). A model onnxruntime finds
finite is therefore not proof; RLX's own check (RLX_DEBUG_NANS=1) is the stricter one.

`--table` runs `rlx precision` on every model under fixtures/precision/ (calibration sets
only), then `rlx precision --keep <AutoCast's nodes> --no-search` to verify AutoCast's
choice with the same converter, checks both written models here in onnxruntime, and prints
the Markdown table of docs/DEBUGGING.md. With `--modelopt PYTHON` (a separate venv with
`pip install "nvidia-modelopt[onnx]"`; never needed by CI) it also runs the real AutoCast,
`PYTHON -m modelopt.onnx.autocast -t fp16 --keep_io_types --providers cpu` with its default
thresholds on the same calibration sets (one .npz per set), counts the float nodes it keeps
in FP32 (its "Skipping node" log lines; Constant and shape ops not counted), verifies that
choice with `rlx precision --keep ... --no-search`, and runs AutoCast's own model in
onnxruntime on the held-back sets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent


def sets(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_dir())


def check(model_dir: Path, out: Path, tol: float) -> dict:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    res = {"model": str(model_dir), "checked": str(out), "sets": 0, "finite": True,
           "max_rel": 0.0, "ok": True}
    for sd in sets(model_dir / "heldout"):
        feeds = {n: np.load(sd / f"input_{n}.npy") for n in names}
        for o, v in zip(s.get_outputs(), s.run(None, feeds)):
            want = np.load(sd / f"expected_{o.name}.npy").astype(np.float64)
            got = v.astype(np.float64)
            if not np.isfinite(got).all():
                res["finite"] = False
                continue
            scale = max(float(np.abs(want).max()), np.finfo(np.float64).tiny)
            res["max_rel"] = max(res["max_rel"], float(np.abs(got - want).max()) / scale)
        res["sets"] += 1
    res["ok"] = res["finite"] and res["max_rel"] <= tol
    return res


def rlx(binary: str, args: list[str]) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    p = subprocess.run([binary, "precision", *args, "-q"], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    js = {}
    for a, b in zip(args, args[1:]):
        if a == "--json":
            try:
                js = json.loads(Path(b).read_text())
            except (OSError, ValueError):
                pass
    if p.returncode not in (0, 1):
        sys.stderr.write(p.stderr)
    return p.returncode, js, secs


def modelopt(py: str, d: Path, out: Path, float_nodes: set) -> tuple[list, Path, float]:
    """Run the real AutoCast; the float nodes it keeps in FP32 and its model."""
    cal = out / f"{d.name}.calib_npz"
    cal.mkdir(parents=True, exist_ok=True)
    for sd in sets(d / "calib"):
        np.savez(cal / f"{sd.name}.npz", **{f.name[6:-4]: np.load(f) for f in sd.glob("input_*.npy")})
    path = out / f"{d.name}.modelopt.onnx"
    t0 = time.perf_counter()
    p = subprocess.run([py, "-m", "modelopt.onnx.autocast", "--onnx_path", str(d / "model.onnx"),
                        "--output_path", str(path), "-t", "fp16", "-d", str(cal),
                        "--keep_io_types", "--providers", "cpu", "--log_level", "INFO"],
                       capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"modelopt failed on {d.name}: {p.stderr[-2000:]}")
    kept = []
    for line in (p.stdout + p.stderr).splitlines():
        if "Skipping node " in line:
            name = line.split("Skipping node ", 1)[1].split(":", 1)[0]
            if name in float_nodes and name not in kept:
                kept.append(name)
    return kept, path, secs


def table_modelopt(binary: str, tol: float, py: str) -> int:
    out = ROOT / "out" / "precision"
    out.mkdir(parents=True, exist_ok=True)
    print("| model | float32 nodes | RLX keeps | AutoCast (modelopt) keeps | AutoCast's choice in RLX "
          "(held-back) | AutoCast's own model in onnxruntime (held-back) | AutoCast time |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    bad = False
    for d in sorted((ROOT / "fixtures" / "precision").iterdir()):
        if not (d / "model.onnx").is_file():
            continue
        common = [str(d), "--calibration", str(d / "calib"), "--verify", str(d / "heldout"),
                  "--to", "f16", "--force", "--tol-rel", str(tol)]
        rc, js, _ = rlx(binary, common + ["-o", str(out / f"{d.name}.rlx.onnx"),
                                          "--json", str(out / f"{d.name}.rlx.json")])
        floats = {n["name"] for n in js.get("nodes", []) if n.get("float")}
        kept, mpath, secs = modelopt(py, d, out, floats)
        rc2, js2, _ = rlx(binary, common + ["-o", str(out / f"{d.name}.modelopt-choice.onnx"),
                                            "--json", str(out / f"{d.name}.modelopt-choice.json"),
                                            "--no-search", "--keep", ",".join(kept)])
        h = js2.get("held_back") or {}
        c = js2.get("calibration") or {}
        in_rlx = ("finite, %.1e" % h["max_rel"]) if (c.get("finite") and h.get("finite")) \
            else "NOT finite: " + str((c.get("problem") or h.get("problem") or "")[:90])
        o = check(d, mpath, tol)
        in_ort = ("finite, %.1e" % o["max_rel"]) if o["ok"] else \
            ("NOT finite" if not o["finite"] else "beyond tol %.1e" % o["max_rel"])
        if js.get("kept_count", 10**9) > len(kept) and c.get("finite") and h.get("finite"):
            bad = True
        print(f"| {d.name} | {js.get('float_nodes')} | {js.get('kept_count')} | {len(kept)} "
              f"| {in_rlx} | {in_ort} | {secs:.1f} s |")
    return 1 if bad else 0


def table(binary: str, tol: float) -> int:
    out = ROOT / "out" / "precision"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    bad = False
    for d in sorted((ROOT / "fixtures" / "precision").iterdir()):
        if not (d / "model.onnx").is_file():
            continue
        rule = json.loads((d / "autocast_rule.json").read_text())
        common = [str(d), "--calibration", str(d / "calib"), "--verify", str(d / "heldout"),
                  "--to", "f16", "--force", "--tol-rel", str(tol)]
        rc, js, secs = rlx(binary, common + ["-o", str(out / f"{d.name}.rlx.onnx"),
                                             "--json", str(out / f"{d.name}.rlx.json")])
        rc2, js2, _ = rlx(binary, common + ["-o", str(out / f"{d.name}.autocast.onnx"),
                                            "--json", str(out / f"{d.name}.autocast.json"),
                                            "--no-search", "--keep", ",".join(rule["kept"])])
        ort_rlx = check(d, out / f"{d.name}.rlx.onnx", tol)
        ort_ac = check(d, out / f"{d.name}.autocast.onnx", tol)

        def verdict(j, o):
            c, h = j.get("calibration", {}), j.get("held_back") or {}
            ok_r = c.get("finite") and c.get("max_rel", 1) <= tol and h.get("finite") \
                and h.get("max_rel", 1) <= tol
            r = "finite, %.1e" % h.get("max_rel", float("nan")) if ok_r else \
                ("NOT finite" if not h.get("finite", c.get("finite")) or not c.get("finite")
                 else "beyond tol")
            o_ = "finite, %.1e" % o["max_rel"] if o["ok"] else \
                ("NOT finite" if not o["finite"] else "beyond tol %.1e" % o["max_rel"])
            return ok_r, r, o_

        ok_r, r_rlx, o_rlx = verdict(js, ort_rlx)
        ok_a, r_ac, o_ac = verdict(js2, ort_ac)
        kept = js.get("kept_count", -1)
        if not ok_r or not ort_rlx["ok"] or (ok_a and kept > rule["count"]):
            bad = True
        rows.append((d.name, js.get("float_nodes", 0), kept, r_rlx, o_rlx, rule["count"],
                     r_ac, o_ac, js.get("trials", 0), secs))
    print("| model | float32 nodes | RLX keeps | RLX model on held-back: RLX | onnxruntime "
          "| AutoCast rule keeps | its model on held-back: RLX | onnxruntime | trials | time |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]} "
              f"| {r[8]} | {r[9]:.2f} s |")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?", type=Path)
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--tol-rel", type=float, default=1e-2)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--rlx", default=str(ROOT / "target" / "debug" / "rlx"))
    ap.add_argument("--modelopt", metavar="PYTHON", help="a python with nvidia-modelopt[onnx]")
    a = ap.parse_args(argv)
    if a.table and a.modelopt:
        return table_modelopt(a.rlx, a.tol_rel, a.modelopt)
    if a.table:
        return table(a.rlx, a.tol_rel)
    if a.model_dir is None or a.out is None:
        ap.error("give MODEL_DIR OUT.onnx, or --table")
    res = check(a.model_dir, a.out, a.tol_rel)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
