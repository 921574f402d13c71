"""rlx.load / rlx.run on ONNX models: outputs, dtypes, shapes, generated inputs."""

import os
import numpy as np
import pytest

import rlx
from conftest import example


def test_run_matches_reference(healthy):
    out = rlx.run(healthy)  # the folder's input_x.npy is used
    assert list(out) == ["probs"]
    expected = np.load(healthy / "expected_probs.npy")
    assert out["probs"].dtype == np.float32 and out["probs"].shape == expected.shape
    np.testing.assert_allclose(out["probs"], expected, rtol=1e-4, atol=1e-6)


def test_run_file_path_and_given_input(healthy):
    x = np.load(healthy / "input_x.npy")
    a = rlx.run(str(healthy / "model.onnx"), {"x": x})["probs"]
    b = rlx.run(healthy)["probs"]
    np.testing.assert_array_equal(a, b)


def test_load_info(masked):
    m = rlx.load(masked)
    assert m.kind == "model"
    assert [(i.name, i.shape, i.dtype) for i in m.inputs] == [
        ("hidden_states", (2, 4, 8), "float32"),
        ("attention_mask", (2, 4), "int64"),
    ]
    assert [(o.name, o.dtype) for o in m.outputs] == [("output", "float32")]
    assert "hidden_states: float32[2,4,8]" in repr(m)


def test_outputs_own_runtime_buffer(healthy):
    y = rlx.run(healthy)["probs"]
    # The array wraps the runtime's buffer: NumPy does not own it, and it is writable.
    assert not y.flags.owndata and y.base is not None
    assert y.flags.c_contiguous and y.flags.writeable


def test_symbolic_dims_follow_arrays(add_model):
    m = rlx.load(add_model)
    assert m.inputs[0].shape == ("batch", 4)
    for b in (1, 3, 5):
        x = np.arange(b * 4, dtype=np.float32).reshape(b, 4)
        z = m.run({"x": x, "y": x})["z"]
        np.testing.assert_array_equal(z, 2 * x)


def test_dims_at_load(add_model):
    m = rlx.load(add_model, dims={"batch": 3})
    out = m.run()
    assert out["z"].shape == (3, 4)


def test_generated_inputs_are_deterministic(add_model):
    a = rlx.run(rlx.load(add_model, seed=1))["z"]
    b = rlx.run(rlx.load(add_model, seed=1))["z"]
    c = rlx.run(rlx.load(add_model, seed=2))["z"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all(np.abs(a) <= 2.0)


def test_repeated_runs_reuse_model(add_model):
    m = rlx.load(add_model)
    x = np.ones((2, 4), np.float32)
    for k in range(3):
        np.testing.assert_array_equal(m.run({"x": x * k, "y": x})["z"], x * k + 1)


def test_non_contiguous_and_list_inputs(add_model):
    base = np.arange(32, dtype=np.float32).reshape(4, 8)
    x = base[:, ::2]  # strided view
    assert not x.flags.c_contiguous
    z = rlx.run(add_model, {"x": x, "y": np.zeros((4, 4), np.float32)})["z"]
    np.testing.assert_array_equal(z, x)


@pytest.mark.parametrize(
    "elem,np_dtype",
    [
        ("FLOAT", np.float32),
        ("DOUBLE", np.float64),
        ("FLOAT16", np.float16),
        ("INT64", np.int64),
        ("INT32", np.int32),
        ("INT8", np.int8),
        ("UINT8", np.uint8),
        ("BOOL", np.bool_),
    ],
)
def test_dtype_roundtrip(identity_model, elem, np_dtype):
    from onnx import TensorProto

    path = identity_model(getattr(TensorProto, elem))
    x = (np.arange(6) % 3).reshape(2, 3).astype(np_dtype)
    y = rlx.run(path, {"x": x})["y"]
    assert y.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(y, x)


def test_bfloat16_roundtrip(identity_model):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from onnx import TensorProto

    path = identity_model(TensorProto.BFLOAT16)
    x = np.array([[1.5, -2.0, 3.25], [0.0, 1e30, -1e-3]], dtype=ml_dtypes.bfloat16)
    m = rlx.load(path)
    assert m.inputs[0].dtype == "bfloat16"
    y = m.run({"x": x})["y"]
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


def test_scalar_inputs_keep_rank_zero(identity_model):
    """A 0-d input is a scalar of shape (), not (1,) (np.ascontiguousarray would add a dim)."""
    from onnx import TensorProto

    path = identity_model(TensorProto.FLOAT, shape=())
    assert rlx.load(path).inputs[0].shape == ()
    y = rlx.run(path, {"x": np.float32(2.5)})["y"]
    assert y.shape == () and float(y) == 2.5
    y = rlx.run(path, {"x": np.array(-1.0, dtype=np.float32)})["y"]
    assert y.shape == () and float(y) == -1.0
    torch = pytest.importorskip("torch")
    y = rlx.run(path, {"x": torch.tensor(3.0)})["y"]
    assert y.shape == () and float(y) == 3.0


def test_torch_tensor_inputs(healthy):
    torch = pytest.importorskip("torch")
    x = np.load(healthy / "input_x.npy")
    a = rlx.run(healthy, {"x": torch.from_numpy(x).requires_grad_(True)})["probs"]
    np.testing.assert_array_equal(a, rlx.run(healthy, {"x": x})["probs"])


def test_torch_bfloat16_input(identity_model):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from onnx import TensorProto

    t = torch.tensor([[1.5, -2.0, 3.25], [0.0, 8.0, -1.0]], dtype=torch.bfloat16)
    y = rlx.run(identity_model(TensorProto.BFLOAT16), {"x": t})["y"]
    np.testing.assert_array_equal(y.astype(np.float32), t.float().numpy())


def test_available_devices():
    d = rlx.available_devices()
    assert d[0] == "cpu"
    assert set(d) <= {"cpu", "wgpu", "cuda"}


def test_package_roundtrip(tmp_path, healthy):
    import subprocess

    from conftest import rlx_binary

    rlx_bin = rlx_binary()
    if rlx_bin is None:
        pytest.skip("no rlx binary (cargo build -p rlx-cli) to compile a package with")
    pkg = tmp_path / "m.rlxpkg"
    subprocess.run([rlx_bin, "compile", str(healthy), "-o", str(pkg)], check=True, capture_output=True)
    m = rlx.load(pkg)
    assert m.kind == "package"
    x = np.load(healthy / "input_x.npy")
    np.testing.assert_allclose(m.run({"x": x})["probs"], rlx.run(healthy)["probs"], rtol=1e-5, atol=1e-7)
    with pytest.raises(rlx.InputError, match="no input named"):
        m.run({"nope": x})
    with pytest.raises(rlx.ModelError, match="package"):
        rlx.lint(m)


def test_dynamic_package(tmp_path):
    """A package compiled with dim ranges runs at every size in range, like onnxruntime."""
    import subprocess

    from conftest import REPO, rlx_binary

    d = REPO / "fixtures" / "dynamic" / "bert_dyn"
    if not (d / "model.onnx").is_file():
        if os.environ.get("RLX_REQUIRE_FIXTURES") == "1":
            pytest.fail(f"{d}: missing (scripts/gen_dynamic_models.py)")
        pytest.skip("fixtures/dynamic not generated (scripts/gen_dynamic_models.py)")
    rlx_bin = rlx_binary()
    if rlx_bin is None:
        pytest.skip("no rlx binary (cargo build -p rlx-cli) to compile a package with")
    pkg = tmp_path / "bert.rlxpkg"
    subprocess.run(
        [rlx_bin, "compile", str(d / "model.onnx"), "--dim", "batch=1..16", "--dim", "sequence=1..512", "-o", str(pkg)],
        check=True,
        capture_output=True,
    )
    m = rlx.load(pkg)
    assert m.kind == "package"
    for size in ["1x7", "3x128"]:
        c = d / size
        inputs = {n: np.load(c / f"input_{n}.npy") for n in ["input_ids", "attention_mask", "token_type_ids"]}
        out = m.run(inputs)
        for o in ["last_hidden_state", "pooler_output"]:
            np.testing.assert_allclose(out[o], np.load(c / f"expected_{o}.npy"), rtol=1e-4, atol=1e-5)
    big = {n: np.zeros((17, 4), np.int64) for n in ["input_ids", "attention_mask", "token_type_ids"]}
    with pytest.raises(rlx.InputError, match=r'unmatched dim 0 \("batch"\), expected: 1..16, but got: 17'):
        m.run(big)


def test_value_dependent_model_runs_in_segments():
    """NonZero between a head and a tail: the model runs in segments, outputs as onnxruntime."""
    from conftest import REPO

    d = REPO / "fixtures" / "dynamic" / "nonzero_mid"
    if not (d / "model.onnx").is_file():
        if os.environ.get("RLX_REQUIRE_FIXTURES") == "1":
            pytest.fail(f"{d}: missing (scripts/gen_dynamic_models.py)")
        pytest.skip("fixtures/dynamic not generated (scripts/gen_dynamic_models.py)")
    m = rlx.load(d / "model.onnx")
    assert [i.name for i in m.inputs] == ["x"]
    for size in ["4x5", "7x3"]:
        x = np.load(d / size / "input_x.npy")
        out = m.run({"x": x})
        np.testing.assert_allclose(out["y"], np.load(d / size / "expected_y.npy"), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["total"], np.load(d / size / "expected_total.npy"), rtol=1e-5)
    with pytest.raises(rlx.ModelError, match="segments"):
        rlx.lint(m)
