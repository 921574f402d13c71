#!/usr/bin/env python3
"""Lay out the nine ONNX model-zoo "light" models shipped inside the onnx pip package.

    .venv/bin/python scripts/gen_light_models.py [--out DIR] [--no-ort] [--reference]

Needs only the `onnx` package (onnxruntime is used for the cross-check when installed).
For each model in onnx/backend/test/data/light/light_<name>.onnx this writes
fixtures/large/light/<name>/ (default --out fixtures/large/light):

  model.onnx     the shipped light_<name>.onnx, byte for byte
  input_0.pb     TensorProto of the input the onnx backend test runner feeds the model
  input_0.npy    the same tensor as .npy
  output_0.pb    the shipped light_<name>_output_0.pb, byte for byte (what the runner compares to)
  output_0.npy   the same tensor as .npy
  meta.json      input/output names and shapes, the runner's rtol/atol, opset, op types,
                 and the onnxruntime-vs-expected max abs/rel diff

How the onnx backend runner makes the input (onnx/backend/test/runner/__init__.py,
Runner._add_model_test.run, the branch for urls starting with "onnx/backend/test/data/light/"):
for every graph input that is not an initializer it calls
Runner.generate_dummy_data(x, seed=0, name=model_name, random=False), i.e.

    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    n = np.prod(shape)
    value = (np.arange(n).reshape(shape) / n).astype(np.float32)

and writes onnx.numpy_helper.from_array(value).SerializeToString() as input_<k>.pb
(k counts non-initializer inputs). The expected output is the shipped light_<name>_output_<i>.pb
copied unchanged. rtol/atol come from onnx/backend/test/data/real/test_<name>/data.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
ONNX_DIR = Path(onnx.__file__).resolve().parent
LIGHT_DIR = ONNX_DIR / "backend" / "test" / "data" / "light"
REAL_DIR = ONNX_DIR / "backend" / "test" / "data" / "real"

NAMES = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


def dummy_input(x: onnx.ValueInfoProto) -> np.ndarray:
    """Re-implementation of onnx's Runner.generate_dummy_data(..., random=False)."""
    assert x.type.tensor_type.elem_type == onnx.TensorProto.FLOAT, x
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
    n = np.prod(shape)
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def runner_dummy_input(x: onnx.ValueInfoProto, name: str) -> np.ndarray | None:
    """The runner's own function, when this onnx version has it (used to check ours)."""
    try:
        from onnx.backend.test.runner import Runner
    except Exception:  # pragma: no cover - onnx without the test runner
        return None
    fn = getattr(Runner, "generate_dummy_data", None)
    if fn is None:
        return None
    return fn(x, seed=0, name=name, random=False)


def diffs(expected: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    e = expected.astype(np.float64)
    g = got.astype(np.float64)
    abs_d = np.abs(e - g)
    rel_d = abs_d / np.maximum(np.abs(e), np.finfo(np.float32).tiny)
    return float(abs_d.max()), float(rel_d.max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", default=str(ROOT / "fixtures" / "large" / "light"))
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime cross-check")
    ap.add_argument("--reference", action="store_true",
                    help="also run onnx.reference.ReferenceEvaluator (slow: minutes per model)")
    args = ap.parse_args()

    ort = None
    if not args.no_ort:
        try:
            import onnxruntime as ort  # noqa: F811
        except ImportError:
            print("onnxruntime not installed: skipping the cross-check", file=sys.stderr)

    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    total = 0
    failures = []
    print(f"{'model':<14} {'in':<16} {'out':<18} {'bytes':>9} {'ort max|abs|':>12} {'ort max|rel|':>12}  rtol/atol")
    for name in NAMES:
        src = LIGHT_DIR / f"light_{name}.onnx"
        model = onnx.load(str(src))
        d = out_root / name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, d / "model.onnx")

        inits = {i.name for i in model.graph.initializer}
        real_inputs = [x for x in model.graph.input if x.name not in inits]
        feeds = {}
        input_meta = []
        for k, x in enumerate(real_inputs):
            value = dummy_input(x)
            theirs = runner_dummy_input(x, name)
            if theirs is not None:
                assert theirs.dtype == value.dtype and np.array_equal(theirs, value), name
            feeds[x.name] = value
            (d / f"input_{k}.pb").write_bytes(numpy_helper.from_array(value).SerializeToString())
            np.save(d / f"input_{k}.npy", value)
            input_meta.append({"index": k, "name": x.name, "dtype": "float32", "shape": list(value.shape)})

        output_meta = []
        expected = []
        for i, o in enumerate(model.graph.output):
            pb = LIGHT_DIR / f"light_{name}_output_{i}.pb"
            shutil.copyfile(pb, d / f"output_{i}.pb")
            t = onnx.TensorProto()
            t.ParseFromString(pb.read_bytes())
            arr = numpy_helper.to_array(t)
            np.save(d / f"output_{i}.npy", arr)
            expected.append(arr)
            output_meta.append({"index": i, "name": o.name, "dtype": str(arr.dtype), "shape": list(arr.shape)})

        tol = json.loads((REAL_DIR / f"test_{name}" / "data.json").read_text())
        meta = {
            "model": name,
            "source": f"onnx/backend/test/data/light/light_{name}.onnx (onnx {onnx.__version__})",
            "ir_version": model.ir_version,
            "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
            "inputs": input_meta,
            "outputs": output_meta,
            "input_recipe": "np.arange(n).reshape(shape) / n, cast to float32 (onnx Runner.generate_dummy_data, random=False)",
            "rtol": tol.get("rtol"),
            "atol": tol.get("atol"),
            # The light models replace every weight by a ConstantOfShape fill, so their outputs are
            # constant across classes (softmax = 0.001 everywhere): a weak numeric check.
            "expected_output_distinct_values": [int(np.unique(e).size) for e in expected],
            "op_types": dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items())),
        }

        ort_abs = ort_rel = float("nan")
        if ort is not None:
            t0 = time.time()
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            sess = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
            got = sess.run(None, feeds)
            ort_abs, ort_rel = diffs(expected[0], got[0])
            ok = all(np.allclose(g, e, rtol=tol["rtol"], atol=tol["atol"]) for g, e in zip(got, expected))
            meta["onnxruntime"] = {
                "version": ort.__version__,
                "max_abs_diff": ort_abs,
                "max_rel_diff": ort_rel,
                "allclose_at_runner_tolerance": bool(ok),
                "seconds": round(time.time() - t0, 2),
            }
            if not ok:
                failures.append(name)
        if args.reference:
            from onnx.reference import ReferenceEvaluator

            t0 = time.time()
            got = ReferenceEvaluator(model).run(None, feeds)
            a, r = diffs(expected[0], got[0])
            meta["reference_evaluator"] = {"max_abs_diff": a, "max_rel_diff": r, "seconds": round(time.time() - t0, 1)}

        (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        size = sum(p.stat().st_size for p in d.iterdir())
        total += size
        print(
            f"{name:<14} {input_meta[0]['name']:<16} {output_meta[0]['name']:<18} {size:>9} "
            f"{ort_abs:>12.3e} {ort_rel:>12.3e}  {tol.get('rtol')}/{tol.get('atol')}"
        )
    print(f"total {total} bytes in {out_root}")
    if failures:
        print(f"onnxruntime disagrees with the expected output beyond the runner tolerance: {failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
