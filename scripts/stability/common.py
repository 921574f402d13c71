"""The shared API of the stability case modules (scripts/stability/*.py).

Each module has `def cases():` yielding `Case` objects; scripts/gen_stability_cases.py
imports every module here (except this one) and writes their cases beside its own.
"""
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

F32_MAX = float(np.finfo(np.float32).max)
EXTREMES_F32 = np.array([0.0, -0.0, 88.8, -88.8, 89.0, -89.0, 1e4, -1e4, F32_MAX, -F32_MAX,
                         1e-40, -1e-40, 1.0, -1.0], np.float32)
EXTREMES_F16 = np.array([0.0, -0.0, 65504.0, -65504.0, 11.0, -11.0, 6e-8, -6e-8, 1.0, -1.0],
                        np.float16)
# bfloat16's largest finite values, as float32 (numpy has no bfloat16).
EXTREMES_BF16 = np.array([3.3895314e38, -3.3895314e38, 1.0, -1.0, 0.0], np.float32)


@dataclass
class Case:
    op: str                 # ONNX op type covered
    name: str               # [a-z0-9_], unique per op
    model: onnx.ModelProto  # usually one node
    inputs: dict            # graph input name -> np.ndarray
    expected: dict          # graph output name -> float64 exact result
    rtol: float = 1e-5      # |got - exp| <= atol + rtol * |exp|, exp rounded to the output dtype
    atol: float = 0.0
    note: str = ""          # the formulation RLX must use / why the input is extreme
    extra: dict = field(default_factory=dict)


def single_node_model(op, inputs, outputs, attrs=None, opset=17, domain=""):
    """A one-node model: inputs/outputs are lists of (name, numpy dtype, shape)."""
    vi = lambda n, d, s: helper.make_tensor_value_info(  # noqa: E731
        n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
    node = helper.make_node(op, [n for n, _, _ in inputs], [n for n, _, _ in outputs],
                            name=f"stab.{op.lower()}", domain=domain, **(attrs or {}))
    g = helper.make_graph([node], f"stability_{op}", [vi(*i) for i in inputs],
                          [vi(*o) for o in outputs])
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 10
    return m


__all__ = ["Case", "single_node_model", "EXTREMES_F32", "EXTREMES_F16", "EXTREMES_BF16",
           "numpy_helper"]
