"""rlx.reduce and rlx.precision: the CLI's `rlx reduce` / `rlx precision` from Python.

Values are checked against independent references (onnxruntime, NumPy) where one exists.
The precision fixtures are generated (scripts/gen_precision_models.py, run by .ci/run); the
tests that need them skip without them unless RLX_REQUIRE_FIXTURES=1.
"""

import json
import os

import numpy as np
import pytest

import rlx
from conftest import REPO


def _ort():
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _folder_inputs(d):
    return {p.name[len("input_") : -len(".npy")]: np.load(p) for p in sorted(d.glob("input_*.npy"))}


def _culprits(path, inputs=None):
    m = rlx.Model(path)
    m.run(inputs, debug_nans=True, quiet=True)
    return [r.label for r in m.last_report.culprits if r.kind == "NaN"]


# ---------------------------------------------------------------------------------------
# reduce


def test_reduce_reproduces_the_nan_at_the_same_node(masked, tmp_path):
    onnx = pytest.importorskip("onnx")
    out = rlx.reduce(masked, "nan", out=tmp_path / "repro")
    assert out == tmp_path / "repro" and out.is_dir()
    assert (out / "model.onnx").is_file() and (out / "README.md").is_file()
    files = sorted(out.glob("input_*.npy"))
    assert files, "the repro has no input files"

    want = _culprits(masked)
    assert want, "the example no longer makes a NaN"
    got = _culprits(out)
    assert got and got[0] == want[0], (got, want)

    small = onnx.load(str(out / "model.onnx"))
    assert 0 < len(small.graph.node) < len(onnx.load(str(masked / "model.onnx")).graph.node)
    assert want[0] in [n.name for n in small.graph.node]
    # The inputs on disk are what the model's graph inputs declare.
    declared = {i.name for i in small.graph.input} - {t.name for t in small.graph.initializer}
    assert {f"input_{n}.npy" for n in declared} == {f.name for f in files}

    # Independent reference: onnxruntime on the repro's files makes the NaN too.
    ort = _ort()
    if ort is not None:
        s = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.load(out / f"input_{i.name}.npy") for i in s.get_inputs()}
        outs = s.run(None, feeds)
        assert any(np.isnan(o).any() for o in outs if o.dtype.kind == "f")


def test_reduce_with_given_arrays(masked, tmp_path):
    arrays = _folder_inputs(masked)
    assert arrays
    out = rlx.reduce(rlx.load(masked), inputs=arrays, out=str(tmp_path / "r"))
    assert out == tmp_path / "r"
    assert _culprits(out)[0] == _culprits(masked)[0]


def test_reduce_healthy_model_raises_and_writes_nothing(healthy, tmp_path):
    out = tmp_path / "repro"
    with pytest.raises(rlx.RlxError, match=r"does not fail with --until nan on these inputs; nothing written") as e:
        rlx.reduce(healthy, out=out)
    assert not isinstance(e.value, rlx.UsageError)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_reduce_existing_folder_needs_force(masked, tmp_path):
    out = tmp_path / "repro"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(rlx.RlxError, match="already exists; pass --force"):
        rlx.reduce(masked, out=out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    # With force the repro goes in; other files stay.
    rlx.reduce(masked, out=out, force=True)
    assert (out / "model.onnx").is_file() and (out / "keep.txt").read_text() == "mine"


def test_reduce_bad_until_is_a_value_error(masked, tmp_path):
    with pytest.raises(ValueError, match="invalid value 'sometimes' for '--until <KIND>'") as e:
        rlx.reduce(masked, "sometimes", out=tmp_path / "r")
    assert isinstance(e.value, rlx.UsageError) and isinstance(e.value, rlx.InputError)
    assert not str(e.value).startswith("error:") and "--help" not in str(e.value)
    assert not (tmp_path / "r").exists()


def test_reduce_input_errors(masked, tmp_path):
    with pytest.raises(rlx.InputError, match="nosuch"):
        rlx.reduce(masked, inputs={"nosuch": np.zeros(3, np.float32)}, out=tmp_path / "r")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(rlx.InputError, match="bfloat16 arrays cannot be passed"):
        rlx.reduce(masked, inputs={"x": np.zeros(3, ml_dtypes.bfloat16)}, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_reduce_missing_model(tmp_path):
    with pytest.raises(rlx.ModelError):
        rlx.reduce(tmp_path / "nope.onnx", out=tmp_path / "r")


# ---------------------------------------------------------------------------------------
# precision


def precision_fixture(name):
    p = REPO / "fixtures" / "precision" / name
    if not (p / "model.onnx").is_file():
        msg = f"{p}: missing; generate it with .venv/bin/python scripts/gen_precision_models.py (.ci/run does)"
        if os.environ.get("RLX_REQUIRE_FIXTURES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def _sets(d):
    return [_folder_inputs(s) for s in sorted(p for p in d.iterdir() if p.is_dir())]


def _rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def test_precision_keeps_nodes_and_the_model_runs_finite(tmp_path):
    onnx = pytest.importorskip("onnx")
    fx = precision_fixture("f16_activation_growth_f32")
    out = tmp_path / "mixed.onnx"
    res = rlx.precision(fx, "f16", calibration=fx / "calib", verify=fx / "heldout", out=out)
    assert isinstance(res, rlx.PrecisionResult)
    assert res.path == out and out.is_file()
    assert res.ok and res.to == "float16"
    assert res.kept and all(k.reason for k in res.kept)
    names = [n.name for n in onnx.load(str(fx / "model.onnx")).graph.node]
    assert set(res.kept_names) <= set(names)
    assert len(res.kept) < len(names)
    js = json.loads(json.dumps(res.to_json()))
    assert [k["name"] for k in js["kept"]] == res.kept_names
    assert js["output"] == str(out)
    assert "rlx precision: wrote" in str(res) and "kept=" in repr(res)

    # The written model: float32 at its borders, float16 inside.
    m = onnx.load(str(out))
    f32 = onnx.TensorProto.FLOAT
    assert all(v.type.tensor_type.elem_type == f32 for v in list(m.graph.input) + list(m.graph.output))
    to16 = [n for n in m.graph.node if n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)]
    assert to16

    # Held-back inputs: the written model is finite in rlx and within tol_rel of float32 as
    # onnxruntime computes the original (the independent reference).
    ort = _ort()
    held = _sets(fx / "heldout")
    assert held
    ref = ort.InferenceSession(str(fx / "model.onnx"), providers=["CPUExecutionProvider"]) if ort else None
    low = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]) if ort else None
    for feeds in held:
        got = rlx.run(out, feeds)
        for name, v in got.items():
            assert v.dtype == np.float32 and np.isfinite(v).all(), name
        if ort is None:
            continue
        want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
        in_ort = dict(zip([o.name for o in low.get_outputs()], low.run(None, feeds)))
        for name, w in want.items():
            assert _rel(got[name], w) <= 1e-2, name
            assert np.isfinite(in_ort[name]).all(), name
            assert _rel(in_ort[name], w) <= 5e-2, name


def test_precision_arrays_as_input_sets(tmp_path):
    fx = precision_fixture("f16_activation_growth_f32")
    calib = _sets(fx / "calib")
    res = rlx.precision(str(fx), to="float16", calibration=calib, verify=_sets(fx / "heldout"), out=tmp_path / "m.onnx")
    assert res.ok and res.kept
    assert len(res.report["calibration_sets"]) == len(calib)


def test_precision_bad_dtype_is_a_value_error(tmp_path):
    fx = precision_fixture("f16_activation_growth_f32")
    out = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="fp8: RLX cannot simulate this dtype") as e:
        rlx.precision(fx, to="fp8", out=out)
    assert isinstance(e.value, rlx.RlxError)
    assert not out.exists()


def test_precision_existing_output_needs_force(tmp_path):
    fx = precision_fixture("f16_activation_growth_f32")
    out = tmp_path / "m.onnx"
    out.write_bytes(b"mine")
    with pytest.raises(rlx.RlxError, match="exists; pass --force"):
        rlx.precision(fx, out=out, calibration=fx / "calib")
    assert out.read_bytes() == b"mine"


def test_precision_no_search_needs_keep(tmp_path):
    fx = precision_fixture("f16_activation_growth_f32")
    with pytest.raises(rlx.UsageError, match="--keep"):
        rlx.precision(fx, no_search=True, out=tmp_path / "m.onnx")


def test_precision_unverified_model_warns(tmp_path):
    fx = precision_fixture("f16_activation_growth_f32")
    out = tmp_path / "m.onnx"
    # Keeping only the first scale in float32 leaves the later overflowing layers in float16.
    with pytest.warns(RuntimeWarning, match="written but not verified"):
        res = rlx.precision(fx, keep=["block2.scale"], no_search=True, calibration=fx / "calib", out=out)
    assert not res.ok and res.kept_names == ["block2.scale"] and out.is_file()
    # onnxruntime agrees that float16 overflows there: the float32 model's largest value
    # exceeds float16's range.
    ort = _ort()
    if ort is not None:
        s = ort.InferenceSession(str(fx / "model.onnx"), providers=["CPUExecutionProvider"])
        worst = max(float(np.max(np.abs(o))) for f in _sets(fx / "calib") for o in s.run(None, f))
        assert worst > float(np.finfo(np.float16).max)
