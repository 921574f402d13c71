"""Shared fixtures: the repository's examples and small ONNX models built here."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def example(name: str) -> Path:
    p = EXAMPLES / name
    assert (p / "model.onnx").is_file(), f"{p}: missing (the examples are committed)"
    return p


@pytest.fixture
def healthy() -> Path:
    return example("healthy_mlp")


@pytest.fixture
def masked() -> Path:
    return example("attention_masked_nan")


def make_model(path: Path, nodes, inputs, outputs, initializers=()) -> Path:
    """Write an ONNX model (opset 17) from (name, elem_type, shape) tuples."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(initializers),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture
def identity_model(tmp_path):
    """identity_model(elem_type, shape=("batch", 3)) -> path of y = Identity(x)."""

    def build(elem_type, shape=("batch", 3)):
        from onnx import helper

        return make_model(
            tmp_path / f"identity_{elem_type}.onnx",
            [helper.make_node("Identity", ["x"], ["y"], name="id")],
            [("x", elem_type, list(shape))],
            [("y", elem_type, list(shape))],
        )

    return build


@pytest.fixture
def add_model(tmp_path):
    """z = x + y over float32 [batch, 4]."""
    from onnx import TensorProto, helper

    return make_model(
        tmp_path / "add.onnx",
        [helper.make_node("Add", ["x", "y"], ["z"], name="add")],
        [("x", TensorProto.FLOAT, ["batch", 4]), ("y", TensorProto.FLOAT, ["batch", 4])],
        [("z", TensorProto.FLOAT, ["batch", 4])],
    )


def rlx_binary():
    """The `rlx` CLI built by `cargo test`/`cargo build`, if any (for packages)."""
    env = os.environ.get("RLX_BIN")
    if env:
        return env
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for prof in ("debug", "release"):
        p = target / prof / "rlx"
        if p.is_file():
            return str(p)
    return shutil.which("rlx")
