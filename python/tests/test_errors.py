"""Every failure is an rlx exception with the CLI's one-line message; no panic crosses."""

import numpy as np
import pytest

import rlx


def test_missing_model(tmp_path):
    with pytest.raises(rlx.ModelError, match="nope.onnx"):
        rlx.load(tmp_path / "nope.onnx")


def test_garbage_model(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x00\x01 definitely not onnx")
    with pytest.raises(rlx.ModelError) as ei:
        rlx.run(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_unknown_input_name(healthy):
    with pytest.raises(rlx.InputError, match=r'no input named "nope" \(its inputs: x\)'):
        rlx.run(healthy, {"nope": np.zeros((4, 16), np.float32)})


def test_wrong_dtype(healthy):
    with pytest.raises(rlx.InputError, match=r'input "x": the model expects f32\[4,16\], the array given holds f64\[4,16\]'):
        rlx.run(healthy, {"x": np.zeros((4, 16), np.float64)})


def test_wrong_shape(healthy):
    with pytest.raises(rlx.InputError, match='graph input "x"'):
        rlx.run(healthy, {"x": np.zeros((3, 16), np.float32)})
    with pytest.raises(rlx.InputError, match="rank"):
        rlx.run(healthy, {"x": np.zeros((4, 16, 1), np.float32)})


def test_inconsistent_symbolic_dims(add_model):
    with pytest.raises(rlx.InputError, match="batch"):
        rlx.run(add_model, {"x": np.zeros((2, 4), np.float32), "y": np.zeros((3, 4), np.float32)})


def test_unsupported_dtype(healthy):
    with pytest.raises(rlx.InputError, match="complex64 is not supported"):
        rlx.run(healthy, {"x": np.zeros((4, 16), np.complex64)})
    with pytest.raises(rlx.InputError, match="not supported"):
        rlx.run(healthy, {"x": np.array(["a"])})


def test_inputs_not_a_dict(healthy):
    with pytest.raises(rlx.InputError, match="expected a dict"):
        rlx.run(healthy, [np.zeros((4, 16), np.float32)])


def test_bad_dims(add_model):
    with pytest.raises(rlx.InputError, match='no symbolic dim named "seq"'):
        rlx.load(add_model, dims={"seq": 2})
    with pytest.raises(rlx.InputError, match="non-negative"):
        rlx.load(add_model, dims={"batch": -1})


def test_bad_device(healthy):
    with pytest.raises(rlx.DeviceError, match="unknown device type"):
        rlx.run(healthy, device="tpu")


def test_model_argument_type():
    with pytest.raises(rlx.ModelError, match="expected a path"):
        rlx.run(42)


def test_panic_becomes_rlx_error():
    with pytest.raises(rlx.RlxError, match="internal error"):
        rlx._native._panic_for_test()


def test_rayon_limit_as_in_cli(healthy, monkeypatch):
    monkeypatch.setenv("RAYON_NUM_THREADS", "100000")
    with pytest.raises(rlx.RlxError, match="RAYON_NUM_THREADS=100000"):
        rlx.load(healthy)


def test_exception_hierarchy():
    for cls in (rlx.ModelError, rlx.InputError, rlx.DeviceError, rlx.NonFiniteError):
        assert issubclass(cls, rlx.RlxError)
    assert issubclass(rlx.RlxError, Exception)
    # A bad tool argument (rlx.reduce until=..., rlx.precision to=...) is a ValueError too.
    assert issubclass(rlx.UsageError, rlx.InputError) and issubclass(rlx.UsageError, ValueError)
