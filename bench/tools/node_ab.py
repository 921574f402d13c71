#!/usr/bin/env python3
"""Per-node A/B of two RLX builds or settings on one model, in interleaved rounds.

    python3 bench/tools/node_ab.py bench/models/squeezenet [--a-bin BIN] [--b-bin BIN]
        [--a-env K=V ...] [--b-env K=V ...] [--rounds 7] [--threads 2] [--cpus 0-1]
        [--max-time 1] [--top 15] [--nodes 53,60]

Each round runs `rlx bench MODEL --profile --profile-csv` once for A and once for B, pinned
with taskset to `--cpus` (default the first `--threads` CPUs), A first in odd rounds and B
first in even ones: on the VMs of bench/NOTES.md §34-35 the side run second read up to 12%
faster in every round when A always went first. Prints, per node, the median over rounds of
its mean time in A and in B, and the model's per-round sums; the nodes with the largest
|B - A| first. With `--nodes`, also each listed node's ratio B/A divided by that round's
whole-model ratio B/A (median and range over rounds): on a machine whose speed swings from
one second to the next (every round's whole model moves), this isolates what the change did
to the node from what the machine did to the round.

A development tool (stdlib only, no venv needed); nothing in CI runs it. Exit status 2 on a
bad argument or a bench run that fails (its stderr is printed).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics as st
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fail(msg: str) -> None:
    print(f"node_ab: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_env(items: list[str], flag: str) -> dict[str, str]:
    env = {}
    for it in items:
        if "=" not in it:
            fail(f"{flag} takes K=V, got {it!r}")
        k, v = it.split("=", 1)
        env[k] = v
    return env


def run(binary: str, model: str, env: dict[str, str], args, csv_path: Path) -> None:
    cmd = [binary, "bench", model, "--threads", str(args.threads), "--max-time",
           str(args.max_time), "--profile", "--profile-csv", str(csv_path)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", args.cpus] + cmd
    p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if p.returncode != 0 or not csv_path.exists():
        sys.stderr.write(p.stderr)
        print(f"node_ab: `{' '.join(cmd)}` failed (exit {p.returncode})", file=sys.stderr)
        sys.exit(2)


def load(path: Path) -> dict[tuple, float]:
    with open(path) as f:
        return {(int(r["node"]), r["op"], r["shape"]): float(r["mean_us"])
                for r in csv.DictReader(f)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a model folder (model.onnx and its inputs)")
    default_bin = str(ROOT / "target" / "release" / "rlx")
    ap.add_argument("--a-bin", default=default_bin, help="RLX binary for A (default: %(default)s)")
    ap.add_argument("--b-bin", help="RLX binary for B (default: A's)")
    ap.add_argument("--a-env", nargs="*", default=[], help="K=V settings for A")
    ap.add_argument("--b-env", nargs="*", default=[], help="K=V settings for B")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpus", help="taskset CPU list (default: 0..threads-1)")
    ap.add_argument("--max-time", type=float, default=1.0, help="timed seconds per run")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--nodes", default="", help="comma-separated node indices to normalize")
    args = ap.parse_args()
    if args.rounds < 1 or args.threads < 1:
        fail("--rounds and --threads must be at least 1")
    args.cpus = args.cpus or f"0-{args.threads - 1}"
    b_bin = args.b_bin or args.a_bin
    for b in (args.a_bin, b_bin):
        if not os.access(b, os.X_OK):
            print(f"node_ab: {b} is not an executable (cargo build --release -p rlx-cli)",
                  file=sys.stderr)
            sys.exit(2)
    if not Path(args.model, "model.onnx").exists():
        print(f"node_ab: no model.onnx in {args.model}", file=sys.stderr)
        sys.exit(2)
    env_a = parse_env(args.a_env, "--a-env")
    env_b = parse_env(args.b_env, "--b-env")
    try:
        want = [int(n) for n in args.nodes.split(",") if n.strip()]
    except ValueError:
        fail(f"--nodes takes node indices, got {args.nodes!r}")

    a_runs, b_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            pa, pb = Path(tmp, f"a{i}.csv"), Path(tmp, f"b{i}.csv")
            sides = [(args.a_bin, env_a, pa), (b_bin, env_b, pb)]
            for binary, env, path in (sides if i % 2 == 0 else sides[::-1]):
                run(binary, args.model, env, args, path)
            a_runs.append(load(pa))
            b_runs.append(load(pb))
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)

    keys = [k for k in a_runs[0] if all(k in r for r in a_runs + b_runs)]
    if not keys:
        fail("the two sides share no node (different models or fusion?)")
    tot_a = [sum(r[k] for k in keys) for r in a_runs]
    tot_b = [sum(r[k] for k in keys) for r in b_runs]
    print(f"{args.model}, {args.threads} thread(s) on CPUs {args.cpus}, {args.rounds} rounds")
    print(f"A: {args.a_bin} {' '.join(args.a_env)}")
    print(f"B: {b_bin} {' '.join(args.b_env)}")
    print("per-round sums (us)  A: " + " ".join(f"{x:.0f}" for x in tot_a))
    print("                     B: " + " ".join(f"{x:.0f}" for x in tot_b))
    ratios = [b / a for a, b in zip(tot_a, tot_b)]
    print(f"model B/A: median of rounds {st.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    rows = []
    for k in keys:
        ma = st.median(r[k] for r in a_runs)
        mb = st.median(r[k] for r in b_runs)
        rows.append((k, ma, mb))
    print(f"\n{'node':>5} {'op':<12} {'shape':<26} {'A us':>8} {'B us':>8} {'B-A':>7}")
    for k, ma, mb in sorted(rows, key=lambda r: -abs(r[2] - r[1]))[: args.top]:
        print(f"{k[0]:>5} {k[1]:<12} {k[2]:<26} {ma:>8.0f} {mb:>8.0f} {mb - ma:>+7.0f}")
    for n in want:
        ks = [k for k in keys if k[0] == n]
        if not ks:
            print(f"node {n}: not in the profile")
            continue
        k = ks[0]
        norm = [(b[k] / a[k]) / r for a, b, r in zip(a_runs, b_runs, ratios) if a[k] > 0]
        if norm:
            print(f"node {n} ({k[1]} {k[2]}): (B/A) over the round's model B/A, median "
                  f"{st.median(norm):.3f} (range {min(norm):.3f}-{max(norm):.3f})")


if __name__ == "__main__":
    main()
