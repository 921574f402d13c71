#!/usr/bin/env python3
"""Run the benchmark models on RLX, onnxruntime and tract and print one table (bench/run.sh).

    python3 bench/bench.py [--models a,b] [--threads 1,2] [--runtimes rlx,ort,tract]
                           [--max-time S] [--warmup W] [--smoke] [--results FILE] [--no-pin]

At N threads every process is pinned to the first N CPUs (when the machine has that many;
--no-pin: never), the same CPUs for every runtime. --pin-fastest: before each round of a
(model, thread count), the N CPUs that read fastest on a fixed loop then, for every runtime
of that round (a host whose CPUs run at 0.55-1.0 of each other for minutes at a time,
bench/NOTES.md §35).

Each (model, thread count, runtime) is a separate process, run one after another
(--rounds R: R processes each, the runtimes taking turns, and the ratios paired by round):

  rlx    target/release/rlx bench MODEL --threads N --warmup W --max-time S  (RLX_DEBUG_NANS unset)
  rlx+nan  the same with RLX_DEBUG_NANS=1 (the "nan on/off" column: the lowest median with it
           over the lowest without, from NAN_ROUNDS interleaved pairs of shorter runs, off
           then on, plus the main run: a burst of load on a shared machine then hits both
           sides of the ratio alike)
  ort    bench/ort_bench.py (CPUExecutionProvider, intra_op_num_threads=N, sequential)
  tract  bench/.tools/bin/tract MODEL --input-facts-from-bundle NPZ [--threads N] -O bench
         --input-from-npz NPZ --warmup-loops W --max-time MS (multithread-mm build)

Peak RSS is the whole process's, from /usr/bin/time's %M (wait4's ru_maxrss when it is
missing); onnxruntime's includes the Python interpreter and numpy (its baseline before the
session is printed in the notes). Load time
is what each runtime reports: RLX read+import+compile, ORT InferenceSession(); tract prints
none, so its load is estimated as the process wall time minus (warmup + runs) x its mean.
tract-cli's `bench` prints only a mean per run: its median/min cells show that mean as `~X`
and the RLX/tract ratios use it. RLX's outputs of the timed runs are compared with
onnxruntime's (max abs diff column).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
ALL_MODELS = ["bert", "gpt2", "qwen3", "minilm", "squeezenet", "mobilenet_v2", "efficientnet_b0",
              "resnet18", "resnet50"]
RLX = Path(os.environ.get("RLX_BIN") or ROOT / "target" / "release" / "rlx")
TRACT = BENCH / ".tools" / "bin" / "tract"
VENV_PY = ROOT / ".venv" / "bin" / "python"
TIMEOUT_S = 600


GNU_TIME = Path("/usr/bin/time")


# CPUs each runtime's process is pinned to, per thread count (set by main; empty: no pinning).
PIN: dict[int, list[int]] = {}


def pin_cpus(threads: int) -> list[int] | None:
    """The CPUs a run at `threads` threads is pinned to: the same first `threads` CPUs for
    every runtime, so that a 1-thread table does not compare runtimes that the scheduler
    put on vCPUs of different speed (bench/NOTES.md §24)."""
    return PIN.get(threads)


def run_measured(cmd: list[str], env: dict | None = None, timeout: float = TIMEOUT_S,
                 cpus: list[int] | None = None):
    """Run cmd (pinned to `cpus` when given); return (exit code, stdout, stderr, peak RSS in
    MB of that process, wall s).

    Peak RSS comes from GNU time's `%M` when /usr/bin/time exists, else from wait4. Linux
    carries the forking process's RSS into a child's ru_maxrss (fork copies the high-water
    mark, exec keeps it), so a child forked straight from this Python process (which holds
    numpy and onnx) would report at least this process's size; /usr/bin/time is small.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".rss") as rss_file:
        full = cmd
        if GNU_TIME.is_file():
            full = [str(GNU_TIME), "-o", rss_file.name, "-f", "%M"] + cmd
        t0 = time.perf_counter()
        pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        p = subprocess.Popen(full, stdout=out, stderr=err, env=env, cwd=ROOT, preexec_fn=pre)
        rc, ru = None, None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - t0 > timeout:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                rc = 124
                break
            time.sleep(0.01)
        p.returncode = rc  # reaped by wait4; keep Popen from waiting again
        wall = time.perf_counter() - t0
        rss = ru.ru_maxrss / 1024.0
        if full is not cmd:
            lines = Path(rss_file.name).read_text().split()
            # GNU time writes "Command exited with non-zero status N" before %M on failure
            if lines and lines[-1].isdigit():
                rss = int(lines[-1]) / 1024.0
        out.seek(0)
        err.seek(0)
        return (rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                rss, wall)


def field(text: str, key: str) -> float | None:
    m = re.search(rf"^{re.escape(key)}: ([0-9.eE+-]+)", text, re.M)
    return float(m.group(1)) if m else None


def first_error(err: str, out: str) -> str:
    lines = [ln for ln in (err + "\n" + out).splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() or "panic" in ln.lower():
            return ln.strip()[:200]
    return (lines[-1].strip()[:200] if lines else "no output")


def rlx_run(model_dir: Path, threads: int, a, nan: bool, out_dir: Path | None) -> dict:
    cmd = [str(RLX), "bench", str(model_dir), "--threads", str(threads), "--warmup", str(a.warmup)]
    cmd += ["--runs", str(a.runs)] if a.runs else ["--max-time", str(a.max_time)]
    if out_dir is not None:
        cmd += ["--output-dir", str(out_dir)]
    env = dict(os.environ)
    env.pop("RLX_DEBUG_NANS", None)
    env.pop("RLX_LINT_NUMERICS", None)
    if nan:
        env["RLX_DEBUG_NANS"] = "1"
    return parse(cmd, env, threads=threads)


NAN_ROUNDS = 3


def nan_pair(model_dir: Path, threads: int, a, main: dict | None) -> tuple[dict | None, dict | None]:
    """RLX with and without RLX_DEBUG_NANS=1 in NAN_ROUNDS interleaved rounds (each run a
    third of --max-time, or --runs): the results with the lowest median of each side (the
    main run `main` counts for the side without)."""
    short = argparse.Namespace(**vars(a))
    if not a.runs:
        short.max_time = max(a.max_time / NAN_ROUNDS, 0.3)
    offs = [main] if main and "error" not in main else []
    ons = []
    for _ in range(NAN_ROUNDS):
        offs.append(rlx_run(model_dir, threads, short, False, None))
        ons.append(rlx_run(model_dir, threads, short, True, None))
    def best(rs: list) -> dict | None:
        ok = [r for r in rs if r and "error" not in r and r.get("median") is not None]
        return min(ok, key=lambda r: r["median"]) if ok else (rs[-1] if rs else None)
    return best(ons), best(offs)


def ort_run(model_dir: Path, threads: int, a, out_dir: Path | None) -> dict:
    cmd = [str(VENV_PY), str(BENCH / "ort_bench.py"), str(model_dir), "--threads", str(threads),
           "--warmup", str(a.warmup)]
    cmd += ["--runs", str(a.runs)] if a.runs else ["--max-time", str(a.max_time)]
    if out_dir is not None:
        cmd += ["--output-dir", str(out_dir)]
    r = parse(cmd, dict(os.environ), threads=threads)
    r["baseline_rss"] = field(r.get("stdout", ""), "baseline-rss")
    return r


def tract_inputs(model_dir: Path, scratch: Path) -> list[str]:
    """tract's input flags: an .npz bundle of the model folder's input_<name>.npy files."""
    import numpy as np
    import onnx

    m = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    arrays = {}
    for x in m.graph.input:
        if x.name in inits:
            continue
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in x.name)
        arrays[x.name] = np.load(model_dir / f"input_{safe}.npy")
    bundle = scratch / f"{model_dir.name}_inputs.npz"
    np.savez(bundle, **arrays)
    return ["--input-facts-from-bundle", str(bundle)]


def tract_run(model_dir: Path, threads: int, a, scratch: Path) -> dict:
    # torch exports declare output shapes / value infos tract rejects; these flags are needed.
    cmd = [str(TRACT), str(model_dir / "model.onnx"), "--onnx-ignore-output-shapes",
           "--onnx-ignore-value-info"]
    bundle = tract_inputs(model_dir, scratch)
    cmd += bundle
    if threads > 1:  # multithread-mm pool; without --threads tract runs single-threaded
        cmd += ["--threads", str(threads)]
    cmd += ["-O", "bench", "--input-from-npz", bundle[1], "--warmup-loops", str(a.warmup)]
    if a.runs:
        cmd += ["--max-loops", str(a.runs)]
    else:
        cmd += ["--max-loops", "100000", "--max-time", str(int(a.max_time * 1000))]
    r = parse(cmd, dict(os.environ), tract=True, threads=threads)
    r["warmup"] = a.warmup
    if "mean" in r and r.get("iters"):
        # tract prints no load time: estimate it as the process wall time minus the runs.
        r["load"] = max(0.0, r["wall"] * 1e3 - (r["iters"] + a.warmup) * r["mean"])
    return r


def parse(cmd: list[str], env: dict, tract: bool = False, threads: int = 1) -> dict:
    rc, out, err, rss, wall = run_measured(cmd, env, cpus=pin_cpus(threads))
    r = {"cmd": cmd, "rc": rc, "stdout": out, "stderr": err, "rss": rss, "wall": wall}
    if rc != 0:
        r["error"] = "timeout" if rc == 124 else first_error(err, out)
        return r
    if tract:
        return parse_tract(r, out)
    for k in ("median", "min", "mean", "load"):
        r[k] = field(out, k)
    if r["median"] is None:
        r["error"] = "no median in output"
    return r


def parse_tract(r: dict, text: str) -> dict:
    """tract-cli 0.23.9 `bench` prints only a mean: "Bench ran N times, X ms/i." (bold)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    m = re.search(r"Bench ran (\d+) times, ([0-9.]+) ms/i", text)
    if not m:
        last = text.strip().splitlines()[-1][:150] if text.strip() else "no output"
        r["error"] = f"cannot parse tract output: {last}"
        return r
    r["iters"] = int(m.group(1))
    r["mean"] = float(m.group(2))
    r["median"] = r["min"] = None
    return r


def max_abs_diff(a_dir: Path, b_dir: Path, b_prefix: str = "") -> str:
    try:
        import numpy as np
    except ImportError:
        return "n/a"
    worst, scale, n = 0.0, 0.0, 0
    for p in sorted(a_dir.glob("*.npy")):
        q = b_dir / (b_prefix + p.name)
        if not q.is_file():
            continue
        x, y = np.load(p), np.load(q)
        if x.shape != y.shape:
            return f"shape {x.shape} vs {y.shape}"
        if x.size:
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
            worst = max(worst, float(np.nanmax(d)) if np.isfinite(d).any() else float("inf"))
            scale = max(scale, float(np.nanmax(np.abs(y.astype(np.float64)))))
        n += 1
    if not n:
        return "no common outputs"
    # relative to the largest |reference output| (some random-init CNNs output ~1e-15)
    return f"{worst:.1e} ({worst / scale:.0e})" if scale > 0 else f"{worst:.1e}"


def fmt_ms(r: dict | None, key: str) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return "fail"
    v = r.get(key)
    if v is None and key in ("median", "min") and r.get("mean") is not None:
        return "~" + fmt_ms(r, "mean")  # tract: mean only
    if v is None:
        return "?"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def combine(rs: list[dict | None]) -> dict | None:
    """One runtime's processes of --rounds as one result: the median of their medians,
    means and load times, the lowest minimum, the highest peak RSS; `rounds` keeps each
    (for the paired ratios). The first failure when none succeeded."""
    ok = [r for r in rs if r and "error" not in r]
    if len(rs) == 1 or not ok:
        return rs[0] if rs else None
    out = dict(ok[-1])
    for k in ("median", "mean", "load"):
        vals = [r[k] for r in ok if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    mins = [r["min"] for r in ok if r.get("min") is not None]
    out["min"] = min(mins) if mins else None
    rss = [r["rss"] for r in ok if r.get("rss") is not None]
    out["rss"] = max(rss) if rss else None
    out["rounds"] = rs
    return out


def ratio(x: dict | None, y: dict | None, key: str) -> str:
    if not x or not y or "error" in x or "error" in y or not x.get(key):
        return "-"
    # Rounds of both: the median of each round's ratio (rounds where both succeeded).
    if x.get("rounds") and y.get("rounds") and y.get(key):
        rs = [a[key] / b[key] for a, b in zip(x["rounds"], y["rounds"])
              if a and b and "error" not in a and "error" not in b and a.get(key) and b.get(key)]
        if rs:
            return f"{statistics.median(rs):.2f}"
    if not y.get(key):
        return f"~{x[key] / y['mean']:.2f}" if y.get("mean") else "-"  # tract: by its mean
    return f"{x[key] / y[key]:.2f}"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = re.search(r"^Model name:\s*(.+)$", out, re.M)
        flags = re.search(r"^Flags:\s*(.+)$", out, re.M)
        avx = ""
        if flags:
            f = flags.group(1).split()
            avx = " (AVX-512)" if "avx512f" in f else (" (AVX2)" if "avx2" in f else "")
        return f"{name.group(1).strip() if name else platform.processor()}{avx}, {os.cpu_count()} CPUs"
    except OSError:
        return f"{platform.processor()}, {os.cpu_count()} CPUs"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def cross_core_ns(scratch: Path) -> str:
    """Round trip of one cache line between CPUs 0 and 1 (bench/tools/pingpong.c), in ns, or
    "?" (no C compiler, one CPU). This VM's two vCPUs sit close (about 110 ns) or far apart
    (about 400 ns); in the far state 2-thread runs of models with many small ops lose most
    of their gain, for onnxruntime less than for RLX (bench/NOTES.md section 18)."""
    if (os.cpu_count() or 1) < 2:
        return "?"
    exe = scratch / "pingpong"
    try:
        if not exe.exists():
            subprocess.run(["cc", "-O2", "-pthread", str(BENCH / "tools" / "pingpong.c"), "-o",
                            str(exe)], check=True, capture_output=True, timeout=60)
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=20).stdout
        m = re.search(r"round trip ([\d.]+) ns", out)
        return f"{float(m.group(1)):.0f}" if m else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def loop_times(cpus: list[int], tries: int = 3) -> dict[int, float]:
    """Seconds of a fixed Python loop on each of `cpus` (this process pinned to it, best of
    `tries`); {} where affinity is not available."""
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return {}
    times = {}
    try:
        for c in cpus:
            os.sched_setaffinity(0, {c})
            best = float("inf")
            for _ in range(tries):
                t0 = time.perf_counter()
                x = 0
                for i in range(300_000):
                    x += i * i
                best = min(best, time.perf_counter() - t0)
            times[c] = best
    except OSError:
        return {}
    finally:
        os.sched_setaffinity(0, mine)
    return times


# CPUs chosen by --pin-fastest, per thread count: how often each set was used.
PICKED: dict[int, dict[str, int]] = {}


def pin_fastest(threads: list[int]) -> None:
    """Set PIN to the fastest CPUs now (for --pin-fastest), for every thread count that
    fits; ties keep the lower CPU number."""
    try:
        avail = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return
    times = loop_times(avail, tries=2)
    if not times:
        return
    order = sorted(times, key=lambda c: (round(times[c] / min(times.values()), 2), c))
    for t in threads:
        if 0 < t <= len(order):
            PIN[t] = sorted(order[:t])
            key = ",".join(map(str, PIN[t]))
            counts = PICKED.setdefault(t, {})
            counts[key] = counts.get(key, 0) + 1


def cpu_speeds() -> str:
    """Each CPU's speed on a fixed Python loop (this process pinned to it, best of 3),
    relative to the fastest, e.g. "cpu0 1.00, cpu1 0.55"; "?" where affinity is not
    available. A vCPU whose physical core is busy with another guest reads low, and every
    2-thread run then waits on it (bench/NOTES.md §24)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))[:8]
    except (AttributeError, OSError):
        return "?"
    times = loop_times(cpus)
    if not times:
        return "?"
    fast = min(times.values())
    return ", ".join(f"cpu{c} {fast / t:.2f}" for c, t in times.items())


def versions() -> str:
    parts = []
    try:
        import onnxruntime

        parts.append(f"onnxruntime {onnxruntime.__version__}")
    except ImportError:
        pass
    if TRACT.is_file():
        v = subprocess.run([str(TRACT), "--version"], capture_output=True, text=True).stdout.strip()
        parts.append(v or "tract ?")
    if os.environ.get("RLX_BENCH_REV"):  # a copy without its git history (the device machine)
        parts.append(f"RLX {os.environ['RLX_BENCH_REV']}")
        return ", ".join(parts)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "crates", "Cargo.toml"],
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()
    parts.append(f"RLX {rev or '?'}" + (" + uncommitted edits in crates/ (shared tree)" if dirty else ""))
    return ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--threads", default=None, help="thread counts (default 1,2; smoke: 1)")
    ap.add_argument("--runtimes", default="rlx,ort,tract")
    ap.add_argument("--max-time", type=float, default=2.0, help="seconds of timed runs per process")
    ap.add_argument("--runs", type=int, default=None, help="exact timed runs (instead of --max-time)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-nan", action="store_true", help="skip the RLX_DEBUG_NANS=1 runs")
    ap.add_argument("--smoke", action="store_true",
                    help="bert_tiny fixture, RLX only, 3 runs (no venv, no tract)")
    ap.add_argument("--results", type=Path, default=None, help="write the table here (markdown)")
    ap.add_argument("--command", default=None, help="the command line to record in --results")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin each process to the first N CPUs at N threads")
    ap.add_argument("--pin-fastest", action="store_true",
                    help="pin each round's processes to the N CPUs that read fastest on a "
                         "fixed loop just before the round (every runtime of the round alike)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each runtime's process this many times, the runtimes taking turns "
                         "(rlx, ort, tract, rlx, ...); cells then show the median of the "
                         "processes' medians and the lowest minimum, and RLX/ORT, RLX/tract "
                         "the median of the rounds' ratios (a burst of load on a shared "
                         "machine then hits one round, not one side of the ratio)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: at least 1")

    runtimes = a.runtimes.split(",")
    if a.smoke and a.threads is None:
        a.threads = "1"
    try:
        threads = [int(t) for t in (a.threads or "1,2").split(",")]
    except ValueError:
        ap.error(f"--threads {a.threads}: a comma-separated list of positive integers")
    if any(t < 1 for t in threads):
        ap.error(f"--threads {a.threads}: thread counts must be at least 1")
    if not a.no_pin and hasattr(os, "sched_getaffinity"):
        avail = sorted(os.sched_getaffinity(0))
        PIN.update({t: avail[:t] for t in threads if 0 < t <= len(avail)})
    if a.smoke:
        runtimes, a.runs, a.warmup = ["rlx"], a.runs or 3, min(a.warmup, 1)
        model_dirs = {"bert": ROOT / "fixtures" / "transformers" / "bert_tiny"}
    else:
        model_dirs = {m: BENCH / "models" / m for m in a.models.split(",")}
    for m, d in model_dirs.items():
        if not (d / "model.onnx").is_file():
            print(f"bench: {d}/model.onnx missing (run scripts/gen_bench_models.py {m})", file=sys.stderr)
            return 2
    if "rlx" in runtimes and not RLX.is_file():
        print(f"bench: {RLX} missing (cargo build --release -p rlx-cli)", file=sys.stderr)
        return 2
    if "tract" in runtimes and not TRACT.is_file():
        print(f"bench: {TRACT} missing; skipping tract", file=sys.stderr)
        runtimes.remove("tract")

    out_root = BENCH / "out"
    scratch = Path(tempfile.mkdtemp(prefix="rlx-bench-"))
    load_before = loadavg()
    pp_before = cross_core_ns(scratch)
    speeds_before = cpu_speeds()
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    rows, notes, baselines = [], [], []
    for m, d in model_dirs.items():
        for t in threads:
            res: dict[str, dict | None] = {"rlx": None, "nan": None, "nan_off": None,
                                           "ort": None, "tract": None}
            rdir, odir = out_root / "rlx" / m, out_root / "ort" / m
            for sub in (rdir, odir):
                shutil.rmtree(sub, ignore_errors=True)
            turns: dict[str, list] = {"rlx": [], "ort": [], "tract": []}
            for _ in range(a.rounds):
                if a.pin_fastest and not a.no_pin:
                    pin_fastest([t])
                if "rlx" in runtimes:
                    turns["rlx"].append(rlx_run(d, t, a, False, rdir))
                if "ort" in runtimes:
                    turns["ort"].append(ort_run(d, t, a, odir))
                if "tract" in runtimes:
                    turns["tract"].append(tract_run(d, t, a, scratch))
            for k, rs in turns.items():
                if rs:
                    res[k] = combine(rs)
            if "rlx" in runtimes and not a.no_nan:
                res["nan"], res["nan_off"] = nan_pair(d, t, a, res["rlx"])
            for k, r in res.items():
                if r and "error" in r:
                    notes.append(f"{m} t={t} {k}: {r['error']}")
            diff = "-"
            if res["rlx"] and res["ort"] and "error" not in res["rlx"] and "error" not in res["ort"]:
                diff = max_abs_diff(rdir, odir)
            elif a.smoke and res["rlx"] and "error" not in res["rlx"]:
                diff = max_abs_diff(rdir, d, "expected_")  # the fixture's onnxruntime outputs
            if res["ort"] and res["ort"].get("baseline_rss"):
                baselines.append(res["ort"]["baseline_rss"])
            key = "median" if t == 1 else "min"
            row = [m, str(t)]
            row += [fmt_ms(res[k], "median") for k in ("rlx", "ort", "tract")]
            row += [fmt_ms(res[k], "min") for k in ("rlx", "ort", "tract")]
            row += [ratio(res["rlx"], res["ort"], key), ratio(res["rlx"], res["tract"], key),
                    ratio(res["nan"], res["nan_off"], "median")]
            row.append("/".join(f"{res[k]['rss']:.0f}" if res[k] else "-" for k in ("rlx", "ort", "tract")))
            row.append("/".join(fmt_ms(res[k], "load") for k in ("rlx", "ort", "tract")))
            row.append(diff)
            rows.append(row)
            print(" | ".join(row), flush=True)

    if baselines:
        notes.append(f"onnxruntime's process RSS before creating the session (Python + numpy + "
                     f"onnxruntime imported): {min(baselines):.0f}-{max(baselines):.0f} MB; "
                     "its peak RSS column includes it")
    header = ["model", "thr", "RLX med", "ORT med", "tract med", "RLX min", "ORT min", "tract min",
              "RLX/ORT", "RLX/tract", "nan on/off", "peak RSS MB rlx/ort/tract",
              "load ms rlx/ort/tract", "max abs RLX-ORT (rel)"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(table)
    print()
    print(text)
    for n in notes:
        print("note:", n)
    pp_after = cross_core_ns(scratch)
    speeds_after = cpu_speeds()
    shutil.rmtree(scratch, ignore_errors=True)
    if a.results:
        cmd = a.command or " ".join(shlex.quote(x) for x in sys.argv)
        md = [
            "# Benchmark results",
            "",
            f"- date: {started}",
            f"- CPU: {cpu_model()}",
            f"- load average (1/5/15 min) before: {load_before}; after: {loadavg()}",
            f"- cross-core round trip (CPU 0 and 1, bench/tools/pingpong.c) before: {pp_before} ns;"
            f" after: {pp_after} ns (the AMD EPYC VM of stops 11-20 read 75-110 ns, and near 400 ns"
            " when its vCPUs sat far apart, where 2-thread runs lost most of their gain; the Intel"
            " Xeon VM of stop 21 reads 120-170 ns; bench/README.md)",
            f"- CPU speed (a fixed loop pinned to each CPU, relative to the fastest) before:"
            f" {speeds_before}; after: {speeds_after}",
            "- pinning: " + ("; ".join(
                f"{t} thread(s) on the fastest CPUs before each round ("
                + ", ".join(f"{k}: {n}x" for k, n in sorted(PICKED[t].items(), key=lambda kv: -kv[1]))
                + ")" if t in PICKED else
                f"{t} thread(s) on CPUs {','.join(map(str, PIN[t]))}" if t in PIN
                else f"{t} thread(s) not pinned" + ("" if a.no_pin else " (more than the CPUs)")
                for t in threads) or "none")
            + " (every runtime's process alike)",
            f"- versions: {versions()}",
            f"- command: `{cmd}`",
            f"- per process: warmup {a.warmup}, then "
            + (f"{a.runs} timed runs" if a.runs else f"timed runs for {a.max_time} s (at least 3)")
            + ("" if a.rounds == 1 else
               f"; {a.rounds} rounds, the runtimes' processes taking turns: a cell is the median"
               " of the rounds' medians (min: the lowest), a ratio the median of the rounds'"
               " ratios"),
            "",
            "Times are ms per inference. RLX/ORT and RLX/tract compare medians at 1 thread and "
            "minimums at 2+ threads (medians are noisy there). `nan on/off` is RLX's lowest median "
            f"with RLX_DEBUG_NANS=1 over its lowest without, from {NAN_ROUNDS} interleaved pairs of "
            "shorter runs (and the main run, for the side without). Peak RSS is of each whole process "
            "(ORT's includes the Python interpreter). Load: RLX read+import+compile, ORT "
            "InferenceSession construction; tract: process wall time minus its runs (estimate). "
            "tract-cli `bench` reports only a mean per run: `~X` cells and `~` ratios use it. "
            "`max abs RLX-ORT (rel)` compares the outputs of the timed runs (rel: over the largest "
            "|ORT output|).",
            "",
            text,
            "",
        ]
        busy = max(float(load_before.split()[0]) if load_before != "?" else 0.0,
                   float(loadavg().split()[0]) if loadavg() != "?" else 0.0)
        if busy > (os.cpu_count() or 1) / 2:
            md += [f"**The machine was busy** (1-min load average up to {busy:.1f} on "
                   f"{os.cpu_count()} CPUs, from other processes): medians are noisy, min is the "
                   "steadier figure, and a `nan on/off` below 1 is noise. Re-run on a quiet machine "
                   "before drawing conclusions from small differences.", ""]
        if notes:
            md += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
        a.results.write_text("\n".join(md))
        print(f"bench: wrote {a.results}")
    ok = sum(1 for r in rows if any(c not in ("-", "fail", "") for c in r[2:5]))
    if rows and ok == 0:
        print("bench: every run failed (see the notes above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
