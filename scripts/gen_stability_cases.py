#!/usr/bin/env python3
"""Generate the numerical stability cases (issue 28) into fixtures/stability/.

    .venv/bin/python scripts/gen_stability_cases.py      # rewrites fixtures/stability/ (seconds)

Each case is a one-node ONNX model fed extreme inputs (+-88.8, +-89, +-1e4, +-FLT_MAX,
+-65504/+-65520 in float16, subnormals, +-0, mixed signs, rows of one large value among small
ones) with the EXACT expected output computed in float64 from the op's mathematical definition
(the ONNX operator text or function body), never from onnxruntime or the reference evaluator.
crates/rlx-cli/tests/stability.rs runs every case on RLX's CPU backend: wherever the exact
result rounded to the output dtype is finite, RLX's value must be finite and within the case's
tolerance; where it is not finite, RLX must give the same NaN/+inf/-inf.

Per case folder `fixtures/stability/<Op>__<name>/`: model.onnx, input_<name>.npy (the model's
dtype), expected_<name>.npy (float64), case.json {op, name, rtol, atol, note}.
"""
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "stability"

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)

# The values the issue lists, as float32 and float16 inputs.
EXTREMES_F32 = np.array(
    [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 20.0, -20.0, 88.7, -88.7, 88.8, -88.8,
     89.0, -89.0, 100.0, -100.0, 1e4, -1e4, 1e30, -1e30, F32_MAX, -F32_MAX,
     1e-30, -1e-30, F32_TINY, -F32_TINY, 1e-40, -1e-40, 65504.0, -65504.0],
    dtype=np.float32,
)
EXTREMES_F16 = np.array(
    [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 8.0, -8.0, 11.0, -11.0, 12.0, -12.0,
     100.0, -100.0, 1000.0, -1000.0, 65504.0, -65504.0, 6e-8, -6e-8, 1e-5, -1e-5, 0.1, -0.1],
    dtype=np.float16,
)
ONNX_DT = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
           np.float64: TensorProto.DOUBLE}
# Relative tolerance by output dtype for correctly rounded / libm-accurate ops (a few units
# in the last place), and the absolute floor (the dtype's smallest subnormal scale).
RTOL = {np.float32: 4e-6, np.float16: 2e-3}
ATOL = {np.float32: 1e-38, np.float16: 1e-7}


class Case:
    def __init__(self, op, name, model, inputs, expected, rtol, atol, note=""):
        self.op, self.name, self.model = op, name, model
        self.inputs, self.expected = inputs, expected
        self.rtol, self.atol, self.note = rtol, atol, note


def single_node(op, ins, outs, attrs=None, opset=18, inits=None):
    """ins/outs: list of (name, np dtype, shape); inits: {name: np array} (constants)."""
    inits = inits or {}
    node = helper.make_node(op, [n for n, _, _ in ins], [n for n, _, _ in outs],
                            name=f"stab.{op.lower()}", **(attrs or {}))
    graph = helper.make_graph(
        [node], f"stability_{op}",
        [helper.make_tensor_value_info(n, ONNX_DT[d], s) for n, d, s in ins if n not in inits],
        [helper.make_tensor_value_info(n, ONNX_DT[d], s) for n, d, s in outs],
        initializer=[onnx.numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def f64(x):
    return np.asarray(x, dtype=np.float64)


def sigmoid(x):
    # exact in float64 for every float32 input: exp(-|x|) never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def erf(x):
    return np.vectorize(math.erf)(x)


def gelu_tanh(x):
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + np.tanh(inner))


def elu(x, a=1.0):
    return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0)))


def domain(lo=-np.inf, hi=np.inf, open_lo=False, open_hi=False):
    def keep(v):
        ok = (v > lo if open_lo else v >= lo) & (v < hi if open_hi else v <= hi)
        return ok
    return keep


SELU_A, SELU_G = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

# op: (definition on float64, attrs, opset, domain filter or None, tolerance scale, note)
UNARY = {
    "Abs": (np.abs, {}, 18, None, 0, "|x|"),
    "Neg": (np.negative, {}, 18, None, 0, "-x"),
    "Floor": (np.floor, {}, 18, None, 0, "floor(x)"),
    "Ceil": (np.ceil, {}, 18, None, 0, "ceil(x)"),
    "Round": (np.round, {}, 18, None, 0, "round half to even"),
    "Sign": (np.sign, {}, 18, None, 0, "sign(x)"),
    "Relu": (lambda x: np.maximum(x, 0.0), {}, 18, None, 0, "max(x, 0)"),
    "Sqrt": (np.sqrt, {}, 18, None, 1, "sqrt(x); NaN below 0"),
    "Reciprocal": (lambda x: 1.0 / x, {}, 18, None, 1, "1/x"),
    "Exp": (np.exp, {}, 18, None, 4, "exp(x): overflows above ln(max)"),
    "Log": (np.log, {}, 18, None, 4, "log(x): -inf at 0, NaN below"),
    "Sin": (np.sin, {}, 18, domain(-1e4, 1e4), 4, "sin(x) (|x| <= 1e4)"),
    "Cos": (np.cos, {}, 18, domain(-1e4, 1e4), 4, "cos(x) (|x| <= 1e4)"),
    "Tan": (np.tan, {}, 18, domain(-100, 100), 8, "tan(x) (|x| <= 100)"),
    "Asin": (np.arcsin, {}, 18, None, 4, "asin(x); NaN outside [-1, 1]"),
    "Acos": (np.arccos, {}, 18, None, 4, "acos(x); NaN outside [-1, 1]"),
    "Atan": (np.arctan, {}, 18, None, 4, "atan(x)"),
    "Sinh": (np.sinh, {}, 18, None, 4, "sinh(x): finite up to ~89.4 in f32"),
    "Cosh": (np.cosh, {}, 18, None, 4, "cosh(x): finite up to ~89.4 in f32"),
    "Asinh": (np.arcsinh, {}, 18, None, 4, "asinh(x) = sign(x) log(|x| + sqrt(x^2 + 1)), finite for every finite x"),
    "Acosh": (np.arccosh, {}, 18, None, 4, "acosh(x) = log(x + sqrt(x^2 - 1)), finite for every x >= 1"),
    "Atanh": (np.arctanh, {}, 18, None, 4, "atanh(x); +-inf at +-1, NaN outside"),
    "Erf": (erf, {}, 18, None, 4, "erf(x)"),
    "Sigmoid": (sigmoid, {}, 18, None, 4, "1/(1+exp(-x)) without overflow: e = exp(-|x|)"),
    "Tanh": (np.tanh, {}, 18, None, 4, "tanh(x), +-1 for large |x|"),
    "Softplus": (softplus, {}, 18, None, 4, "max(x,0) + log1p(exp(-|x|))"),
    "Softsign": (lambda x: x / (1.0 + np.abs(x)), {}, 18, None, 2, "x / (1 + |x|)"),
    "Elu": (elu, {}, 18, None, 4, "x > 0 ? x : expm1(x)"),
    "Selu": (lambda x: SELU_G * elu(x, SELU_A), {}, 18, None, 4, "gamma * (x > 0 ? x : alpha expm1(x))"),
    "Celu": (lambda x: np.maximum(0.0, x) + np.minimum(0.0, np.expm1(np.minimum(x, 0.0))), {}, 18, None, 4, "max(0,x) + min(0, expm1(x))"),
    "HardSigmoid": (lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0), {}, 18, None, 2, "clip(0.2 x + 0.5, 0, 1)"),
    "HardSwish": (lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), {}, 18, None, 2, "x clip(x/6 + 1/2, 0, 1)"),
    "LeakyRelu": (lambda x: np.where(x >= 0, x, 0.01 * x), {}, 18, None, 1, "x < 0 ? 0.01 x : x"),
    "ThresholdedRelu": (lambda x: np.where(x > 1.0, x, 0.0), {}, 18, None, 0, "x > 1 ? x : 0"),
    "Shrink": (lambda x: np.where(x < -0.5, x, np.where(x > 0.5, x, 0.0)), {"lambd": 0.5}, 18, None, 0, "|x| > 0.5 ? x : 0 (bias 0)"),
    "Mish": (lambda x: x * np.tanh(softplus(x)), {}, 18, None, 8, "x tanh(softplus(x)), softplus stable"),
    "Swish": (lambda x: x * sigmoid(x), {}, 24, None, 8, "x sigmoid(x) (alpha 1)"),
    "Gelu": (lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))), {}, 20, None, 8, "0.5 x (1 + erf(x / sqrt 2))"),
}
UNARY_EXTRA = {
    ("Gelu", "tanh"): (gelu_tanh, {"approximate": "tanh"}, 20, None, 8,
                       "0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))): x^3 overflows f32 above ~7e12, the limit is x (or 0)"),
}


def unary_cases():
    items = [((op, ""), v) for op, v in UNARY.items()] + list(UNARY_EXTRA.items())
    for (op, tag), (fn, attrs, opset, keep, tol, note) in items:
        for dt, xs in ((np.float32, EXTREMES_F32), (np.float16, EXTREMES_F16)):
            x = xs if keep is None else xs[keep(f64(xs))]
            with np.errstate(all="ignore"):
                want = fn(f64(x))
            m = single_node(op, [("x", dt, [len(x)])], [("y", dt, [len(x)])], attrs, opset)
            scale = max(tol, 1)
            name = f"{tag + '_' if tag else ''}{np.dtype(dt).name}_extremes"
            yield Case(op, name, m, {"x": x}, {"y": want},
                       RTOL[dt] * scale if tol else 0.0, ATOL[dt] if tol else 0.0, note)


BINARY = {
    "Add": (np.add, "x + y"),
    "Sub": (np.subtract, "x - y"),
    "Mul": (np.multiply, "x * y"),
    "Div": (np.divide, "x / y"),
    "Max": (np.maximum, "max(x, y), NaN-propagating"),
    "Min": (np.minimum, "min(x, y), NaN-propagating"),
    "Sum": (np.add, "x + y (variadic)"),
    "Mean": (lambda a, b: a / 2.0 + b / 2.0, "(x + y) / 2: exact mean, finite even where x + y overflows"),
    "Pow": (np.power, "x ^ y"),
    "Mod": (np.fmod, "fmod(x, y) (fmod = 1)"),
    "PRelu": (lambda x, s: np.where(x < 0, s * x, x), "x < 0 ? slope x : x"),
}


def binary_cases():
    for op, (fn, note) in BINARY.items():
        for dt, xs in ((np.float32, EXTREMES_F32), (np.float16, EXTREMES_F16)):
            small = xs[::3]
            a = np.repeat(xs, len(small)).astype(dt)
            b = np.tile(small, len(xs)).astype(dt)
            if op == "Pow":
                # integer and fractional exponents, including the ones that overflow
                b = np.tile(np.array([2.0, 3.0, 0.5, -1.0, -2.0, 0.0], dtype=dt), len(xs))
                a = np.repeat(xs, 6).astype(dt)
            attrs = {"fmod": 1} if op == "Mod" else {}
            with np.errstate(all="ignore"):
                want = fn(f64(a), f64(b))
            n = len(a)
            m = single_node(op, [("x", dt, [n]), ("y", dt, [n])], [("z", dt, [n])], attrs)
            tol = 1 if op in ("Add", "Sub", "Mul", "Div", "Mean", "Sum") else 4
            if op in ("Max", "Min", "PRelu", "Mod"):
                tol = 1
            yield Case(op, f"{np.dtype(dt).name}_pairs", m, {"x": a, "y": b}, {"z": want},
                       RTOL[dt] * tol, ATOL[dt], note)


def clip_cases():
    for dt, xs in ((np.float32, EXTREMES_F32), (np.float16, EXTREMES_F16)):
        lo, hi = np.array(-6.0, dtype=dt), np.array(6.0, dtype=dt)
        m = single_node("Clip", [("x", dt, [len(xs)]), ("lo", dt, []), ("hi", dt, [])],
                        [("y", dt, [len(xs)])], inits={"lo": lo, "hi": hi})
        yield Case("Clip", f"{np.dtype(dt).name}_extremes", m, {"x": xs},
                   {"y": np.clip(f64(xs), -6.0, 6.0)}, 0.0, 0.0, "min(max(x, lo), hi)")


def rows_with_a_spike(dt, n=8, spike=95.0):
    """Rows of small values, one row with a large value among them, one of large offsets."""
    rng = np.random.default_rng(7)
    small = rng.uniform(-2, 2, size=(4, n))
    small[1, 3] = spike                       # one large value among small ones
    small[2] += 1e4                           # a large common offset
    small[3, :] = -small[3, :]                # mixed signs
    return small.astype(dt)


def reduce_cases():
    def lse(x):
        m = np.max(x, axis=-1, keepdims=True)
        return (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))
    defs = {
        "ReduceSum": (lambda x: np.sum(x, -1, keepdims=True), 2, "sum (f64 accumulation)"),
        "ReduceMean": (lambda x: np.mean(x, -1, keepdims=True), 2, "mean (f64 accumulation)"),
        "ReduceMax": (lambda x: np.max(x, -1, keepdims=True), 0, "max"),
        "ReduceMin": (lambda x: np.min(x, -1, keepdims=True), 0, "min"),
        "ReduceProd": (lambda x: np.prod(x, -1, keepdims=True), 8, "product"),
        "ReduceL1": (lambda x: np.sum(np.abs(x), -1, keepdims=True), 2, "sum |x|"),
        "ReduceL2": (lambda x: np.sqrt(np.sum(x * x, -1, keepdims=True)), 4, "sqrt(sum x^2)"),
        "ReduceSumSquare": (lambda x: np.sum(x * x, -1, keepdims=True), 4, "sum x^2"),
        "ReduceLogSumExp": (lse, 4, "m + log(sum(exp(x - m))), m = max"),
        "ReduceLogSum": (lambda x: np.log(np.sum(x, -1, keepdims=True)), 4, "log(sum x)"),
    }
    for op, (fn, tol, note) in defs.items():
        for dt, spike in ((np.float32, 95.0), (np.float16, 300.0)):
            x = rows_with_a_spike(dt, spike=spike)
            if op in ("ReduceLogSum",):
                x = np.abs(x).astype(dt)
            if dt == np.float16 and op in ("ReduceSum", "ReduceMean", "ReduceL1", "ReduceLogSumExp", "ReduceMax", "ReduceMin"):
                x[2] -= np.float16(1e4) - np.float16(100)  # keep the f16 offset row representable
            axes = np.array([-1], dtype=np.int64)
            m = single_node(op, [("x", dt, list(x.shape)), ("axes", np.int64, [1])],
                            [("y", dt, [x.shape[0], 1])], {"keepdims": 1}, 18,
                            inits={"axes": axes})
            with np.errstate(all="ignore"):
                want = fn(f64(x))
            yield Case(op, f"{np.dtype(dt).name}_rows", m, {"x": x}, {"y": want},
                       RTOL[dt] * max(tol, 1) if tol else 0.0, ATOL[dt] if tol else 0.0, note)


def softmax_cases():
    for op in ("Softmax", "LogSoftmax"):
        for dt, spike in ((np.float32, 95.0), (np.float16, 300.0)):
            x = rows_with_a_spike(dt, spike=spike)
            if dt == np.float16:
                x[2] = x[2] - np.float16(1e4) + np.float16(60000)
            xf = f64(x)
            m_ = xf.max(-1, keepdims=True)
            lse = m_ + np.log(np.exp(xf - m_).sum(-1, keepdims=True))
            want = np.exp(xf - lse) if op == "Softmax" else xf - lse
            m = single_node(op, [("x", dt, list(x.shape))], [("y", dt, list(x.shape))], {"axis": -1})
            # Softmax: absolute error against a value in [0, 1]; LogSoftmax: relative to
            # the row's magnitude (x - lse is computed from values up to 1e4).
            atol = 2 * RTOL[dt] if op == "Softmax" else RTOL[dt] * 4 * np.abs(xf).max()
            yield Case(op, f"{np.dtype(dt).name}_rows", m, {"x": x}, {"y": want},
                       RTOL[dt] * 8, float(atol), "exp(x - m) / sum; x - m - log(sum exp(x - m))")


def norm_cases():
    rng = np.random.default_rng(11)
    # LayerNormalization over the last axis, f32 with a large offset and f16 with a spike.
    for dt, offset, spike in ((np.float32, 1e4, 1e4), (np.float16, 0.0, 300.0)):
        x = rng.uniform(-1, 1, size=(3, 16)) + offset
        x[1, 5] = spike + offset
        x = x.astype(dt)
        s = rng.uniform(0.5, 1.5, 16).astype(dt)
        b = rng.uniform(-0.5, 0.5, 16).astype(dt)
        xf = f64(x)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        nrm = (xf - mu) / np.sqrt(var + 1e-5)
        want = nrm * f64(s) + f64(b)
        m = single_node("LayerNormalization", [("x", dt, [3, 16]), ("s", dt, [16]), ("b", dt, [16])],
                        [("y", dt, [3, 16])], {"axis": -1, "epsilon": 1e-5}, 17, inits={"s": s, "b": b})
        # The mean of values near `offset` rounds to the dtype (half a unit at max|x|), which
        # moves every normalized value by up to that over the row's spread: that is the
        # conditioning of the problem, not an error of the formulation.
        std_min = float(np.sqrt(var).min())
        ulp = float(np.spacing(np.abs(x).max().astype(dt)))
        atol = 2 * ulp / std_min + 8 * RTOL[dt] * (1 + np.abs(want).max())
        yield Case("LayerNormalization", f"{np.dtype(dt).name}_offset_spike", m, {"x": x}, {"y": want},
                   RTOL[dt] * 8, float(atol), "stash_type 1: mean and centered variance in f32")
    # RMSNormalization (opset 23), f16 spike: mean of squares in f32.
    for dt in (np.float32, np.float16):
        x = rng.uniform(-1, 1, size=(3, 16))
        x[1, 2] = 300.0 if dt == np.float16 else 1e19
        x = x.astype(dt)
        s = rng.uniform(0.5, 1.5, 16).astype(dt)
        xf = f64(x)
        want = xf / np.sqrt((xf ** 2).mean(-1, keepdims=True) + 1e-5) * f64(s)
        m = single_node("RMSNormalization", [("x", dt, [3, 16]), ("s", dt, [16])], [("y", dt, [3, 16])],
                        {"axis": -1, "epsilon": 1e-5}, 23, inits={"s": s})
        yield Case("RMSNormalization", f"{np.dtype(dt).name}_spike", m, {"x": x}, {"y": want},
                   RTOL[dt] * 8, float(8 * RTOL[dt] * (1 + np.abs(want).max())),
                   "x / sqrt(mean(x^2) + eps) * scale, stage one in f32 (stash_type 1)")
    # InstanceNormalization / GroupNormalization / BatchNormalization / MVN on large offsets.
    x = (rng.uniform(-1, 1, size=(2, 4, 3, 3)) + 1e4).astype(np.float32)
    xf = f64(x)
    s = np.array([1.0, 0.5, 2.0, 1.5], np.float32)
    b = np.array([0.0, 0.1, -0.1, 0.2], np.float32)
    mu = xf.mean((2, 3), keepdims=True)
    var = ((xf - mu) ** 2).mean((2, 3), keepdims=True)
    want = (xf - mu) / np.sqrt(var + 1e-5) * s.reshape(1, 4, 1, 1) + b.reshape(1, 4, 1, 1)
    m = single_node("InstanceNormalization", [("x", np.float32, [2, 4, 3, 3]), ("s", np.float32, [4]), ("b", np.float32, [4])],
                    [("y", np.float32, [2, 4, 3, 3])], {"epsilon": 1e-5}, 18, inits={"s": s, "b": b})
    yield Case("InstanceNormalization", "float32_offset", m, {"x": x}, {"y": want}, 1e-3, 1e-3,
               "centered variance (two passes), never E[x^2] - E[x]^2")
    g = xf.reshape(2, 2, -1)
    gm = g.mean(-1, keepdims=True)
    gv = ((g - gm) ** 2).mean(-1, keepdims=True)
    gn = ((g - gm) / np.sqrt(gv + 1e-5)).reshape(xf.shape)
    want = gn * s.reshape(1, 4, 1, 1) + b.reshape(1, 4, 1, 1)
    m = single_node("GroupNormalization", [("x", np.float32, [2, 4, 3, 3]), ("s", np.float32, [4]), ("b", np.float32, [4])],
                    [("y", np.float32, [2, 4, 3, 3])], {"epsilon": 1e-5, "num_groups": 2}, 21, inits={"s": s, "b": b})
    yield Case("GroupNormalization", "float32_offset", m, {"x": x}, {"y": want}, 1e-3, 1e-3,
               "centered variance per group, stash f32")
    mean = np.full(4, 1e4, np.float32)
    vr = np.array([1e-3, 1.0, 1e8, 0.25], np.float32)
    want = (xf - 1e4) / np.sqrt(f64(vr).reshape(1, 4, 1, 1) + 1e-5) * s.reshape(1, 4, 1, 1) + b.reshape(1, 4, 1, 1)
    m = single_node("BatchNormalization", [("x", np.float32, [2, 4, 3, 3]), ("s", np.float32, [4]), ("b", np.float32, [4]),
                                           ("m", np.float32, [4]), ("v", np.float32, [4])],
                    [("y", np.float32, [2, 4, 3, 3])], {"epsilon": 1e-5}, 15,
                    inits={"s": s, "b": b, "m": mean, "v": vr})
    yield Case("BatchNormalization", "float32_offset", m, {"x": x}, {"y": want}, 1e-4, 2e-2,
               "(x - mean) * (scale / sqrt(var + eps)) + bias; x - mean of 1e4-sized values is exact to f32 rounding of x")
    mu = xf.mean((0, 2, 3), keepdims=True)
    sd = np.sqrt(((xf - mu) ** 2).mean((0, 2, 3), keepdims=True))
    want = (xf - mu) / (sd + 1e-9)
    m = single_node("MeanVarianceNormalization", [("x", np.float32, [2, 4, 3, 3])], [("y", np.float32, [2, 4, 3, 3])], {}, 18)
    yield Case("MeanVarianceNormalization", "float32_offset", m, {"x": x}, {"y": want}, 1e-3, 1e-3,
               "ONNX's body is E[x^2] - E[x]^2 (cancels at a 1e4 offset); the definition is the centered variance")
    # LpNormalization: p = 2 with values whose squares overflow f32.
    x = np.array([[3e20, 4e20, 0.0], [1e-30, 2e-30, 2e-30], [1.0, -2.0, 2.0]], np.float32)
    xf = f64(x)
    want = xf / np.sqrt((xf ** 2).sum(-1, keepdims=True))
    m = single_node("LpNormalization", [("x", np.float32, [3, 3])], [("y", np.float32, [3, 3])], {"axis": -1, "p": 2}, 18)
    yield Case("LpNormalization", "float32_overflowing_squares", m, {"x": x}, {"y": want}, 1e-5, 1e-7,
               "x / ||x||_2 with the norm scaled by max|x| (x^2 overflows above 1.8e19)")


def exact_matmul(a, b):
    """a @ b summed exactly (fractions), rounded to float64 once."""
    from fractions import Fraction
    A = [[Fraction(float(v)) for v in r] for r in a]
    B = [[Fraction(float(v)) for v in r] for r in b]
    return np.array([[float(sum(A[i][k] * B[k][j] for k in range(len(B))))
                      for j in range(len(B[0]))] for i in range(len(A))])


def linalg_cases():
    # MatMul/Gemm: a row whose products reach 1e38 and cancel; any float32 summation order
    # is allowed, so the tolerance is the standard dot-product bound n·eps·sum|a_k b_k|, and
    # the result must be finite (no partial sum may overflow: 2e38 < f32 max).
    eps = float(np.finfo(np.float32).eps)
    a = np.array([[1e19, 1e19, -1e19, 1.0]], np.float32)
    b = np.array([[1e19, 1.0], [1.0, 1.0], [1e19, 1.0], [1.0, 1.0]], np.float32)
    want = exact_matmul(a, b)
    bound = 6 * eps * float((np.abs(f64(a)) @ np.abs(f64(b))).max())
    m = single_node("MatMul", [("a", np.float32, [1, 4]), ("b", np.float32, [4, 2])], [("y", np.float32, [1, 2])])
    yield Case("MatMul", "float32_cancelling_large_terms", m, {"a": a, "b": b}, {"y": want}, 0.0, bound,
               "sum of products in any order: |error| <= n eps sum|a_k b_k|, finite")
    a2 = np.array([[1.0, 2.0, 3.0, 4.0], [-0.5, 0.25, 1e-3, 7.0]], np.float32)
    m = single_node("MatMul", [("a", np.float32, [2, 4]), ("b", np.float32, [4, 2])], [("y", np.float32, [2, 2])])
    yield Case("MatMul", "float32_ordinary", m, {"a": a2, "b": b[:, :1].repeat(2, 1) * 0 + np.float32(0.5)},
               {"y": exact_matmul(a2, np.full((4, 2), 0.5, np.float32))}, 1e-6, 1e-7, "sum of products")
    c = np.array([1.0, -1.0], np.float32)
    want = 0.5 * exact_matmul(a, b) + 2.0 * f64(c)
    m = single_node("Gemm", [("a", np.float32, [1, 4]), ("b", np.float32, [4, 2]), ("c", np.float32, [2])],
                    [("y", np.float32, [1, 2])], {"alpha": 0.5, "beta": 2.0}, 18, inits={"c": c})
    yield Case("Gemm", "float32_cancelling_large_terms", m, {"a": a, "b": b}, {"y": want}, 0.0, bound,
               "alpha A B + beta C, the dot-product bound")
    # Conv with a kernel summing large and small values.
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0] = [[1e30, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [-1e30, 1.0, 1.0, 1.0], [0.0, 1e-40, 65504.0, 1.0]]
    w = np.array([[[[1.0, 1.0], [1.0, 1.0]]]], np.float32)
    xf = f64(x)
    want = np.zeros((1, 1, 3, 3))
    for i in range(3):
        for j in range(3):
            want[0, 0, i, j] = xf[0, 0, i:i + 2, j:j + 2].sum()
    m = single_node("Conv", [("x", np.float32, [1, 1, 4, 4]), ("w", np.float32, [1, 1, 2, 2])],
                    [("y", np.float32, [1, 1, 3, 3])], {}, 18, inits={"w": w})
    yield Case("Conv", "float32_large_window", m, {"x": x}, {"y": want}, 1e-6, 1e-6,
               "window sums; 1e30 - 1e30 in one window (f32 rounding of each partial sum allowed)")


def cast_cases():
    x = EXTREMES_F32
    m = single_node("Cast", [("x", np.float32, [len(x)])], [("y", np.float16, [len(x)])], {"to": TensorProto.FLOAT16})
    yield Case("Cast", "float32_to_float16", m, {"x": x}, {"y": f64(x)}, 0.0, 0.0,
               "round to nearest f16 (inf above 65520)")


def cumsum_cases():
    x = np.array([[1e38, 1e38, -1e38, 1.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    m = single_node("CumSum", [("x", np.float32, [2, 4]), ("axis", np.int64, [])], [("y", np.float32, [2, 4])],
                    {}, 18, inits={"axis": np.array(1, np.int64)})
    yield Case("CumSum", "float32_overflowing_prefix", m, {"x": x}, {"y": np.cumsum(f64(x), axis=1)}, 1e-6, 1e-6,
               "prefix sums; 2e38 is finite in f32 (max 3.4e38)")


def pool_cases():
    x = (np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4) * 1e37).astype(np.float32)
    xf = f64(x)
    want = np.zeros((1, 1, 2, 2))
    for i in range(2):
        for j in range(2):
            want[0, 0, i, j] = xf[0, 0, 2 * i:2 * i + 2, 2 * j:2 * j + 2].mean()
    m = single_node("AveragePool", [("x", np.float32, [1, 1, 4, 4])], [("y", np.float32, [1, 1, 2, 2])],
                    {"kernel_shape": [2, 2], "strides": [2, 2]})
    yield Case("AveragePool", "float32_large", m, {"x": x}, {"y": want}, 1e-6, 0.0,
               "mean of the window; its sum (up to 5.4e38) overflows f32, the mean does not")
    m = single_node("GlobalAveragePool", [("x", np.float32, [1, 1, 4, 4])], [("y", np.float32, [1, 1, 1, 1])])
    yield Case("GlobalAveragePool", "float32_large", m, {"x": x}, {"y": xf.mean((2, 3), keepdims=True)}, 1e-6, 0.0,
               "mean over the plane; the sum (1.2e39) overflows f32")


def misc_cases():
    # SwiGLU (opset 28): Swish(A) * B, with the gate at the extremes.
    for dt, xs in ((np.float32, EXTREMES_F32), (np.float16, EXTREMES_F16)):
        a = xs
        b = np.resize(np.array([1.0, -0.5, 2.0, 1e-3], dtype=dt), len(xs)).astype(dt)
        with np.errstate(all="ignore"):
            want = f64(a) * sigmoid(f64(a)) * f64(b)
        m = single_node("SwiGLU", [("A", dt, [len(a)]), ("B", dt, [len(a)])], [("Y", dt, [len(a)])], {}, 28)
        yield Case("SwiGLU", f"{np.dtype(dt).name}_extremes", m, {"A": a, "B": b}, {"Y": want},
                   RTOL[dt] * 8, ATOL[dt], "a sigmoid(a) b, sigmoid without overflow")
    # Einsum as a matrix product with terms that cancel near f32 max (the dot-product bound).
    eps = float(np.finfo(np.float32).eps)
    a = np.array([[1e19, 1e19, -1e19, 1.0]], np.float32)
    b = np.array([[1e19, 1.0], [1.0, 1.0], [1e19, 1.0], [1.0, 1.0]], np.float32)
    m = single_node("Einsum", [("a", np.float32, [1, 4]), ("b", np.float32, [4, 2])], [("y", np.float32, [1, 2])],
                    {"equation": "ij,jk->ik"}, 18)
    yield Case("Einsum", "float32_cancelling_large_terms", m, {"a": a, "b": b}, {"y": exact_matmul(a, b)},
               0.0, 6 * eps * float((np.abs(f64(a)) @ np.abs(f64(b))).max()), "sum of products, dot-product bound")
    # ConvTranspose 1-D, stride 2: every output is one input times one weight plus overlaps.
    x = np.array([[[1e30, -1e30, 3.0, 2e38]]], np.float32)
    w = np.array([[[1.0, 0.5, -1.0]]], np.float32)
    n, k, st = 4, 3, 2
    out = np.zeros((1, 1, (n - 1) * st + k))
    for i in range(n):
        for j in range(k):
            out[0, 0, i * st + j] += float(x[0, 0, i]) * float(w[0, 0, j])
    m = single_node("ConvTranspose", [("x", np.float32, [1, 1, n]), ("w", np.float32, [1, 1, k])],
                    [("y", np.float32, [1, 1, out.shape[2]])], {"strides": [st]}, 18, inits={"w": w})
    yield Case("ConvTranspose", "float32_large", m, {"x": x}, {"y": out}, 1e-6, 0.0,
               "scatter of x_i w_j; overlaps 1e30*-1 + -1e30*1 = -2e30, 2e38*-1 finite")


GENERATORS = [misc_cases, unary_cases, binary_cases, clip_cases, reduce_cases, softmax_cases, norm_cases,
              linalg_cases, cast_cases, cumsum_cases, pool_cases]


def module_generators():
    """`cases` of every module in scripts/stability/ (their API: scripts/stability/common.py)."""
    import importlib
    here = Path(__file__).resolve().parent / "stability"
    sys.path.insert(0, str(here))
    gens = []
    for f in sorted(here.glob("*.py")):
        if f.stem != "common":
            gens.append(importlib.import_module(f.stem).cases)
    return gens


def write(case):
    d = OUT / f"{case.op}__{case.name}"
    d.mkdir(parents=True)
    onnx.checker.check_model(case.model)
    onnx.save(case.model, d / "model.onnx")
    for k, v in case.inputs.items():
        np.save(d / f"input_{k}.npy", v)
    for k, v in case.expected.items():
        np.save(d / f"expected_{k}.npy", np.asarray(v, np.float64))
    (d / "case.json").write_text(json.dumps(
        {"op": case.op, "name": case.name, "rtol": float(case.rtol), "atol": float(case.atol),
         "note": case.note}, indent=1))


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    n, ops = 0, set()
    for gen in GENERATORS + module_generators():
        for c in gen():
            write(c)
            n += 1
            ops.add(c.op)
    print(f"stability: wrote {n} cases for {len(ops)} ops to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
