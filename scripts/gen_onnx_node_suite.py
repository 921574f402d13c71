#!/usr/bin/env python3
"""Write the ONNX backend node test suite (every case of onnx's own node tests) to disk.

    .venv/bin/python scripts/gen_onnx_node_suite.py [--out DIR] [--no-ort] [--only SUBSTR]
    scripts/onnx-node-suite [same arguments]        # the same, after scripts/setup-venv.sh

Needs the pinned `onnx` (1.23.2, see scripts/setup-venv.sh); onnxruntime for the cross-check.
Cases come from `onnx.backend.test.case.node.collect_testcases(None)`, which includes the
`*_expanded*` variants (the op's function body inlined). For onnx 1.23.2 that is 1884 cases.
Layout, as onnx's own `backend-test-tools generate-data` writes it (onnx/backend/test/cmd_tools.py):

  DIR/<case>/model.onnx
  DIR/<case>/test_data_set_<i>/input_<j>.pb    TensorProto (SequenceProto / OptionalProto /
  DIR/<case>/test_data_set_<i>/output_<j>.pb   MapProto when the graph's value has that type),
                                               named after the graph input / output
  DIR/index.json        {"onnx": version, "cases": {case: {"op_type", "domain", "opset",
                         "data_sets", "inputs", "outputs"}}}, op type of the (first) node of the
                         non-expanded case; expanded cases get the op type of their base case
  DIR/ort_results.json  {"onnxruntime": version, "rtol", "atol", "passed": n, "cases":
                         {case: {"status": "pass"|"fail"|"error"|"crash"|"timeout", "detail"}}}
                         whether onnxruntime's CPU provider reproduces the expected outputs
                         under the comparison rules of crates/rlx-conformance (below)

Comparison rules (the same as crates/rlx-conformance/src/compare.rs): output count, dtype and
shape exact; floats |a-b| <= atol + rtol*|b| with rtol 1e-3, atol 1e-7 (the node tests' own
values), NaN equal to NaN, inf equal to inf of the same sign; bfloat16 with rtol max(rtol, 2**-6)
as onnx's runner does; integers, bools and strings exact; sequences element by element; an
empty optional equal only to an empty optional.

onnxruntime runs in a worker subprocess (one thread), so a crash or a hang in one case costs
that case only (status "crash"/"timeout", 60 s limit per case).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-3
ATOL = 1e-7
ORT_CASE_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- generation


def _write_value(path: Path, value, vi) -> None:
    from onnx import TensorProto, numpy_helper

    t = vi.type
    if t.HasField("map_type"):
        proto = numpy_helper.from_dict(value, vi.name)
    elif t.HasField("sequence_type"):
        proto = numpy_helper.from_list(value, vi.name)
    elif t.HasField("optional_type"):
        proto = numpy_helper.from_optional(value, vi.name)
    else:
        assert t.HasField("tensor_type"), f"{vi.name}: unexpected type {t}"
        if isinstance(value, TensorProto):
            proto = value
        else:
            proto = numpy_helper.from_array(value, vi.name)
    path.write_bytes(proto.SerializeToString())


def _base_name(name: str) -> str:
    k = name.find("_expanded")
    return name[:k] if k >= 0 else name


def generate(out: Path, only: str | None):
    import warnings

    import onnx
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():
        # numpy overflow/divide warnings from cases that make inf/NaN on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        cases = node_cases.collect_testcases(None)
    if only:
        cases = [c for c in cases if only in c.name]
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SystemExit(f"duplicate case names: {dup[:10]}")

    out.mkdir(parents=True, exist_ok=True)
    # Remove case folders of an earlier run that are no longer generated (e.g. after --only).
    keep = set(names)
    for p in out.iterdir():
        if p.is_dir() and p.name.startswith("test_") and p.name not in keep:
            shutil.rmtree(p)

    first_op = {}
    for c in cases:
        nodes = c.model.graph.node
        if nodes and "_expanded" not in c.name:
            first_op[c.name] = (nodes[0].op_type, nodes[0].domain)
    index = {}
    for c in cases:
        d = out / c.name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        (d / "model.onnx").write_bytes(c.model.SerializeToString())
        g = c.model.graph
        for i, (inputs, outputs) in enumerate(c.data_sets):
            ds = d / f"test_data_set_{i}"
            ds.mkdir()
            for j, v in enumerate(inputs):
                _write_value(ds / f"input_{j}.pb", v, g.input[j])
            for j, v in enumerate(outputs):
                _write_value(ds / f"output_{j}.pb", v, g.output[j])
        op, dom = first_op.get(_base_name(c.name), (None, None))
        if op is None:  # expanded case without its base, or an empty graph
            op, dom = (g.node[0].op_type, g.node[0].domain) if g.node else ("(none)", "")
        opset = {o.domain or "ai.onnx": o.version for o in c.model.opset_import}
        index[c.name] = {
            "op_type": op,
            "domain": dom or "ai.onnx",
            "opset": opset,
            "expanded": "_expanded" in c.name,
            "data_sets": len(c.data_sets),
            "inputs": [vi.name for vi in g.input],
            "outputs": [vi.name for vi in g.output],
        }
    (out / "index.json").write_text(
        json.dumps({"onnx": onnx.__version__, "count": len(index), "cases": index}, indent=1, sort_keys=True)
    )
    return cases


# --------------------------------------------------------------------------- comparison


def compare(expected, got, path: str = "output") -> str | None:
    """None when `got` matches `expected` under the rules in the module doc, else why not."""
    import numpy as np

    if expected is None or got is None:
        if expected is None and got is None:
            return None
        return f"{path}: expected {'empty optional' if expected is None else 'a value'}, got {'empty optional' if got is None else 'a value'}"
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(expected) != set(got):
            return f"{path}: map keys differ"
        for k in expected:
            r = compare(expected[k], got[k], f"{path}[{k!r}]")
            if r:
                return r
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{path}: expected a sequence, got {type(got).__name__}"
        if len(expected) != len(got):
            return f"{path}: sequence length {len(got)} != expected {len(expected)}"
        for k, (e, g) in enumerate(zip(expected, got)):
            r = compare(e, g, f"{path}[{k}]")
            if r:
                return r
        return None
    e = np.asarray(expected)
    g = np.asarray(got)
    if e.dtype != g.dtype:
        return f"{path}: dtype {g.dtype} != expected {e.dtype}"
    if e.shape != g.shape:
        return f"{path}: shape {g.shape} != expected {e.shape}"
    if e.dtype == object or e.dtype.kind in "USbiu" or e.dtype == np.bool_:
        if not np.array_equal(e, g):
            bad = np.flatnonzero(e.reshape(-1) != g.reshape(-1))
            k = int(bad[0]) if bad.size else 0
            return f"{path}: {bad.size} of {e.size} elements differ (first at {k}: {g.reshape(-1)[k]!r} vs {e.reshape(-1)[k]!r})"
        return None
    rtol = RTOL
    if e.dtype.name == "bfloat16":
        rtol = max(RTOL, 2.0**-6)
    try:
        ef = e.astype(np.float64)
        gf = g.astype(np.float64)
    except (TypeError, ValueError):
        # dtypes numpy cannot widen (e.g. int4 packed as void): compare the bytes
        return None if e.tobytes() == g.tobytes() else f"{path}: bytes differ ({e.dtype})"
    ok = np.isclose(gf, ef, rtol=rtol, atol=ATOL, equal_nan=True)
    # isclose treats inf == inf of the same sign; make the rule explicit anyway
    inf = np.isinf(ef) | np.isinf(gf)
    ok = np.where(inf, ef == gf, ok)
    if not ok.all():
        bad = np.flatnonzero(~ok.reshape(-1))
        k = int(bad[0])
        return f"{path}: {bad.size} of {e.size} elements differ (first at {k}: {gf.reshape(-1)[k]!r} vs {ef.reshape(-1)[k]!r})"
    return None


# --------------------------------------------------------------------------- onnxruntime


def _ort_check_one(case_dir: Path) -> dict:
    """Run one written case through onnxruntime, reading the files back (so the files are checked too)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(str(case_dir / "model.onnx"))
    g = model.graph
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return {"status": "error", "detail": "load: " + _short(e)}

    def read(path: Path, vi):
        t = vi.type
        if t.HasField("sequence_type"):
            p = onnx.SequenceProto()
            p.ParseFromString(path.read_bytes())
            return numpy_helper.to_list(p)
        if t.HasField("optional_type"):
            p = onnx.OptionalProto()
            p.ParseFromString(path.read_bytes())
            return numpy_helper.to_optional(p)
        if t.HasField("map_type"):
            p = onnx.MapProto()
            p.ParseFromString(path.read_bytes())
            return numpy_helper.to_dict(p)
        p = onnx.TensorProto()
        p.ParseFromString(path.read_bytes())
        return numpy_helper.to_array(p)

    n_ds = 0
    for ds in sorted(case_dir.glob("test_data_set_*"), key=lambda p: int(p.name.rsplit("_", 1)[1])):
        n_ds += 1
        feeds = {}
        for j, vi in enumerate(g.input):
            f = ds / f"input_{j}.pb"
            if f.exists():
                feeds[vi.name] = read(f, vi)
        expected = []
        for j, vi in enumerate(g.output):
            expected.append(read(ds / f"output_{j}.pb", vi))
        try:
            if any(not _is_numpy_native(v) for v in feeds.values() if hasattr(v, "dtype")) or any(
                _exotic(vi) for vi in g.output
            ):
                # through OrtValues: numpy cannot hand bfloat16 / float8 / int4 to onnxruntime
                ort_feeds = {k: _to_ortvalue(v) for k, v in feeds.items()}
                outs = sess.run_with_ort_values(None, ort_feeds)
                got = [_from_ortvalue(o, vi) for o, vi in zip(outs, g.output)]
            else:
                got = sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            return {"status": "error", "detail": f"{ds.name}: run: " + _short(e)}
        if len(got) != len(expected):
            return {"status": "fail", "detail": f"{ds.name}: {len(got)} outputs, expected {len(expected)}"}
        for j, (e, o) in enumerate(zip(expected, got)):
            r = compare(e, o, f"output {j} ({g.output[j].name})")
            if r:
                return {"status": "fail", "detail": f"{ds.name}: {r}"}
    return {"status": "pass", "detail": f"{n_ds} data set(s)"}


def _is_numpy_native(a) -> bool:
    """False for ml_dtypes' bfloat16, float8, int4, ... (which onnxruntime's numpy bridge lacks)."""
    return a.dtype.type.__module__ == "numpy"


def _exotic(vi) -> bool:
    """A tensor value whose element type numpy lacks (bfloat16, float8, int4, ...)."""
    from onnx import helper

    if not vi.type.HasField("tensor_type"):
        return False
    try:
        return not _is_numpy_native(np_empty(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)))
    except (KeyError, ValueError, TypeError):
        return False


def np_empty(dt):
    import numpy as np

    return np.empty(0, dt)


def _to_ortvalue(a):
    """A numpy (or ml_dtypes) array as an OrtValue of the matching ONNX element type."""
    import ctypes

    import onnxruntime as ort
    from onnx import numpy_helper

    if _is_numpy_native(a):
        return ort.OrtValue.ortvalue_from_numpy(a)
    t = numpy_helper.from_array(a)  # raw_data in ONNX's layout (4-bit and 2-bit types packed)
    C = ort.capi._pybind_state
    dev = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    v = ort.OrtValue(C.OrtValue.ortvalue_from_shape_and_onnx_type(list(a.shape), t.data_type, dev))
    if v.tensor_size_in_bytes() != len(t.raw_data):
        raise ValueError(f"{a.dtype}: {len(t.raw_data)} bytes, onnxruntime wants {v.tensor_size_in_bytes()}")
    ctypes.memmove(v.data_ptr(), t.raw_data, len(t.raw_data))
    return v


def _from_ortvalue(v, vi):
    """An output OrtValue as numpy; through a TensorProto for types numpy lacks."""
    import ctypes

    from onnx import helper, numpy_helper

    if not _exotic(vi):
        return v.numpy()
    raw = ctypes.string_at(v.data_ptr(), v.tensor_size_in_bytes())
    t = helper.make_tensor("y", vi.type.tensor_type.elem_type, v.shape(), raw, raw=True)
    return numpy_helper.to_array(t)


def _short(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s[:400]


def ort_worker() -> None:
    """Read case folders on stdin, one per line; answer one JSON line each on stdout."""
    for line in sys.stdin:
        d = Path(line.strip())
        try:
            r = _ort_check_one(d)
        except Exception as e:  # noqa: BLE001
            r = {"status": "error", "detail": "harness: " + _short(e)}
        sys.stdout.write(json.dumps(r) + "\n")
        sys.stdout.flush()


def ort_check_all(out: Path, names: list[str]) -> dict:
    """Check every case with onnxruntime in a worker process, restarting it after a crash or hang."""
    import selectors

    results: dict[str, dict] = {}
    todo = list(names)
    worker = None

    def start():
        env = dict(os.environ, OMP_NUM_THREADS="1")
        return subprocess.Popen(
            [sys.executable, __file__, "--ort-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )

    while todo:
        name = todo.pop(0)
        if worker is None or worker.poll() is not None:
            worker = start()
        worker.stdin.write(str(out / name) + "\n")
        worker.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(worker.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=ORT_CASE_TIMEOUT_S)
        sel.close()
        if not ready:
            worker.kill()
            worker.wait()
            worker = None
            results[name] = {"status": "timeout", "detail": f"no answer in {ORT_CASE_TIMEOUT_S:.0f} s"}
            continue
        line = worker.stdout.readline()
        if not line:
            rc = worker.wait()
            worker = None
            results[name] = {"status": "crash", "detail": f"onnxruntime worker died (exit {rc})"}
            continue
        results[name] = json.loads(line)
    if worker is not None:
        worker.stdin.close()
        worker.wait()
    return results


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "fixtures" / "onnx-node"), help="output folder (default fixtures/onnx-node)")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime cross-check")
    ap.add_argument("--only", help="only cases whose name contains this string (for debugging)")
    ap.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ort_worker:
        ort_worker()
        return

    import onnx

    if onnx.__version__ != "1.23.2":
        print(f"warning: onnx {onnx.__version__} (the suite is pinned to 1.23.2: scripts/setup-venv.sh)", file=sys.stderr)
    out = Path(args.out)
    t0 = time.time()
    cases = generate(out, args.only)
    t1 = time.time()
    n_ds = sum(len(c.data_sets) for c in cases)
    print(f"onnx {onnx.__version__}: wrote {len(cases)} cases ({n_ds} data sets) to {out} in {t1 - t0:.1f} s")

    if args.no_ort:
        return
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime not installed: no ort_results.json", file=sys.stderr)
        return
    res = ort_check_all(out, [c.name for c in cases])
    t2 = time.time()
    counts: dict[str, int] = {}
    for r in res.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    (out / "ort_results.json").write_text(
        json.dumps(
            {
                "onnxruntime": onnxruntime.__version__,
                "onnx": onnx.__version__,
                "rtol": RTOL,
                "atol": ATOL,
                "passed": counts.get("pass", 0),
                "count": len(res),
                "cases": res,
            },
            indent=1,
            sort_keys=True,
        )
    )
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"onnxruntime {onnxruntime.__version__}: {counts.get('pass', 0)} of {len(res)} pass ({summary}) in {t2 - t1:.1f} s")


if __name__ == "__main__":
    main()
