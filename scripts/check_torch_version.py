#!/usr/bin/env python3
"""Check RLX against archives written by another torch (a venv with that torch from PyPI):
export this repository's own and planted modules with it (scripts/gen_torch_models.py
--only own planted planted_weights), then run each with the `rlx` CLI and compare with that
torch's eager outputs (rtol 1e-4), and check the planted reports' source lines.

    python3 -m venv /tmp/t26 && /tmp/t26/bin/pip install torch==2.6.0 "numpy<2.3"
    cargo build -p rlx-cli
    /tmp/t26/bin/python scripts/check_torch_version.py [--out /tmp/t26fx]

Exit status 1 when a model does not import, differs, or a planted report is wrong.
"""
import argparse, json, os, subprocess, sys, tempfile
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"rlx_torch_{torch.__version__.split('+')[0]}"))
ap.add_argument("--rlx", default=os.path.join(ROOT, "target/debug/rlx"))
a = ap.parse_args()
subprocess.run([sys.executable, os.path.join(ROOT, "scripts/gen_torch_models.py"), "--only", "own", "planted",
                "planted_weights", "--out", a.out], check=True)
bad = 0
for name in sorted(os.listdir(a.out)):
    d = os.path.join(a.out, name)
    rep = os.path.join(d, "expected_report.json")
    if os.path.exists(rep):
        want = json.load(open(rep))
        r = subprocess.run([a.rlx, "run", "-q", d, "--nan-report", os.path.join(d, "r.json")],
                           env={**os.environ, "RLX_DEBUG_NANS": "1"}, capture_output=True, text=True)
        got = json.load(open(os.path.join(d, "r.json")))["reports"] if os.path.exists(os.path.join(d, "r.json")) else []
        culprits = [x for x in got if x["cause"]["kind"] != "propagated"]
        if "initializer" in want:
            ok = any(x["label"] == want["initializer"] and x["index"] == want["index"] for x in culprits)
        else:
            line = want["source"]["line"]
            ok = any((x.get("source") or {}).get("line") == line or
                     (x.get("inf_origin_source") or {}).get("line") == line for x in culprits)
        print(f"{name:28} planted: {'ok' if ok else 'WRONG'}" + ("" if ok else f"\n{r.stderr}"))
        bad += not ok
        continue
    out = os.path.join(d, "rlx_out")
    r = subprocess.run([a.rlx, "run", "-q", d, "-o", out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name:28} ERROR {r.stderr.strip()}")
        bad += 1
        continue
    worst = 0.0
    i = 0
    while os.path.exists(os.path.join(d, f"expected_{i}.npy")):
        e = np.load(os.path.join(d, f"expected_{i}.npy"))
        g = np.load(os.path.join(out, f"output_{i}.npy"))
        scale = max(float(np.abs(e).max()), 1e-3)
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - e) / (1e-4 * np.abs(e) + 1e-5 * scale))))
        i += 1
    ok = worst <= 1.0
    print(f"{name:28} {i} output(s), worst error / tolerance {worst:.3f}: {'ok' if ok else 'DIFFERS'}")
    bad += not ok
print(f"torch {torch.__version__}: {'all ok' if not bad else f'{bad} problem(s)'}")
sys.exit(1 if bad else 0)
