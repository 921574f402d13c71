"""Stability cases for the reductions (C2): Reduce*, Softmax/LogSoftmax/Hardmax, CumSum/CumProd,
pools. Every expected value is float64 math of the op's ONNX definition (numpy in float64),
never RLX's or onnxruntime's output."""

import numpy as np
from onnx import numpy_helper

from common import Case, single_node_model

F32MAX = float(np.finfo(np.float32).max)
F16MAX = 65504.0
INF = np.inf


def _with_axes(model, node_input_name="axes", axes=(1,)):
    """Append a constant `axes` input (opset 18 Reduce*, opset 13 ReduceSum, CumSum)."""
    model.graph.node[0].input.append(node_input_name)
    model.graph.initializer.append(
        numpy_helper.from_array(np.array(axes, np.int64), node_input_name)
    )
    return model


def _reduce_case(op, name, x, fn, dtype=np.float32, rtol=1e-5, atol=0.0, note="", keepdims=1):
    """A [rows, n] input reduced over axis 1 at opset 18 (keepdims 1 -> [rows, 1])."""
    x = np.asarray(x, dtype)
    x64 = x.astype(np.float64)
    y = np.array([fn(r) for r in x64], np.float64)
    oshape = [x.shape[0], 1] if keepdims else [x.shape[0]]
    m = single_node_model(
        op, [("x", dtype, list(x.shape))], [("y", dtype, oshape)],
        attrs={"keepdims": keepdims}, opset=18)
    _with_axes(m)
    return Case(op, name, m, {"x": x}, {"y": y.reshape(oshape)}, rtol=rtol, atol=atol, note=note)


def _lse(r):
    with np.errstate(all="ignore"):
        return float(np.logaddexp.reduce(r))


def _logsum(r):
    with np.errstate(all="ignore"):
        return float(np.log(np.sum(r)))


def _l2(r):
    return float(np.hypot.reduce(r)) if r.size else 0.0


def cases():
    # ---- ReduceLogSumExp: m + log(sum(exp(x - m))) ----
    note = "m + log(sum(exp(x - m))), m = row max (0 where m is +-inf); Exp(95) overflows f32"
    yield _reduce_case("ReduceLogSumExp", "row_max_95", [[95.0, 93.0, 80.0, -3.0]], _lse, note=note)
    yield _reduce_case(
        "ReduceLogSumExp", "extremes_f32",
        [[88.8, -88.8, 89.0, -89.0], [1e4, 0.0, -1e4, 1e-45], [F32MAX, 0.0, -F32MAX, 1.0],
         [-1e4, -1e4, -1e4, -1e4]], _lse, note=note)
    yield _reduce_case(
        "ReduceLogSumExp", "nonfinite_rows",
        [[-INF, -INF, -INF], [INF, 0.0, 1.0], [np.nan, 1.0, 2.0], [-INF, 3.0, -INF]], _lse,
        note="all -inf -> -inf, +inf -> +inf, NaN -> NaN, -inf entries add 0")
    yield _reduce_case("ReduceLogSumExp", "f16_exp_overflows", [[11.0, 12.0, 0.0], [F16MAX, 0.0, -F16MAX]],
                       _lse, dtype=np.float16, rtol=1e-3, note="exp(12) = 162755 > 65504 in f16")
    yield _reduce_case("ReduceLogSumExp", "no_keepdims", [[95.0, 94.0], [-95.0, -96.0]], _lse, keepdims=0,
                       note=note)
    # ---- ReduceLogSum: log(sum(x)), summed in a wider dtype ----
    yield _reduce_case("ReduceLogSum", "sum_overflows_f32", [[3e38, 3e38, 1.0], [1e-45, 1e-45, 0.0]],
                       _logsum, note="log of a sum formed in f64: 6e38 overflows f32, its log is 89.3")
    yield _reduce_case("ReduceLogSum", "sum_overflows_f16", [[60000.0, 60000.0], [6e-8, 0.0]], _logsum,
                       dtype=np.float16, rtol=1e-3, note="sum formed in f32: 120000 overflows f16")
    # ---- ReduceL2 / ReduceSumSquare / ReduceL1 ----
    yield _reduce_case("ReduceL2", "squares_overflow_f32", [[2e38, 2e38], [3e19, 4e19], [1e-45, 0.0]], _l2,
                       note="sqrt(sum(x^2)) in f64: (2e38)^2 overflows f32")
    yield _reduce_case("ReduceL2", "squares_overflow_f16", [[300.0, 400.0], [-F16MAX, 0.0]], _l2,
                       dtype=np.float16, rtol=1e-3, note="sqrt(sum(x^2)) in f32: 300^2 overflows f16")
    yield _reduce_case("ReduceSumSquare", "f16_accumulates_f32", [[100.0, 200.0, 3.0], [255.9, 1.0, 0.1]],
                       lambda r: float(np.sum(r * r)), dtype=np.float16, rtol=1e-3,
                       note="x*x and the sum in f32, rounded once to f16")
    yield _reduce_case("ReduceSumSquare", "large_f32", [[1e19, 1e19, -1e19], [1e-23, 0.0, 1.0]],
                       lambda r: float(np.sum(r * r)), note="3e38 fits f32")
    yield _reduce_case("ReduceL1", "extremes_f32", [[1e38, -1e38, 1e38], [1e-45, -1e-45, 0.0]],
                       lambda r: float(np.sum(np.abs(r))), note="sum(|x|) accumulated in f64")
    # ---- ReduceSum / ReduceMean / ReduceProd / ReduceMax / ReduceMin ----
    yield _reduce_case("ReduceSum", "partial_overflow_f32", [[F32MAX, F32MAX, -F32MAX], [1e4, -1e4, 1e-45]],
                       lambda r: float(np.sum(r)), note="accumulated in f64: the running f32 sum overflows")
    yield _reduce_case("ReduceSum", "partial_overflow_f16", [[60000.0, 10000.0, -20000.0], [F16MAX, -F16MAX, 6e-8]],
                       lambda r: float(np.sum(r)), dtype=np.float16, rtol=1e-3,
                       note="accumulated wide: 70000 overflows f16 midway")
    yield _reduce_case("ReduceMean", "max_values_f32", [[F32MAX, F32MAX], [-F32MAX, -F32MAX], [1e4 + 0.5, 1e4 - 0.5]],
                       lambda r: float(np.mean(r)), note="mean of FLT_MAX twice is FLT_MAX (sum in f64)")
    yield _reduce_case("ReduceMean", "max_values_f16", [[F16MAX, F16MAX, F16MAX], [-F16MAX, F16MAX, 6e-8]],
                       lambda r: float(np.mean(r)), dtype=np.float16, rtol=1e-3,
                       note="sum 196512 overflows f16; accumulated wide")
    yield _reduce_case("ReduceProd", "partial_overflow_f32", [[1e20, 1e20, 1e-30], [1e-30, 1e-30, 1e30]],
                       lambda r: float(np.prod(r)), note="running f32 product overflows/underflows; f64")
    for op, f in (("ReduceMax", np.max), ("ReduceMin", np.min)):
        yield _reduce_case(op, "extremes_f32",
                           [[88.8, -89.0, F32MAX, -F32MAX], [1e-45, -1e-45, 0.0, -0.0], [-INF, -INF, -1e4, -INF],
                            [np.nan, 1.0, 2.0, 3.0]],
                           lambda r, f=f: float(np.nan if np.isnan(r).any() else f(r)), note="NaN propagates")
    # ---- Softmax / LogSoftmax / Hardmax along the last axis ----
    rows = np.array([[1e4, 0.0, -1e4, 1.0], [F32MAX, -F32MAX, 0.0, 1.0], [88.8, 89.0, -89.0, -88.8],
                     [-INF, 1.0, 2.0, -INF], [95.0, 95.0, 95.0, 95.0]], np.float32)
    r64 = rows.astype(np.float64)
    with np.errstate(all="ignore"):
        m = r64.max(axis=1, keepdims=True)
        lsm = r64 - (m + np.log(np.exp(r64 - m).sum(axis=1, keepdims=True)))
    for op, exp in (("Softmax", np.exp(lsm)), ("LogSoftmax", lsm)):
        yield Case(op, "extremes_f32",
                   single_node_model(op, [("x", np.float32, [5, 4])], [("y", np.float32, [5, 4])],
                                     attrs={"axis": -1}, opset=13),
                   {"x": rows}, {"y": exp}, rtol=1e-5, atol=1e-7,
                   note="exp(x - max) / sum; log: (x - max) - log(sum(exp(x - max)))")
    h16 = np.array([[F16MAX, 0.0, -F16MAX], [11.0, 12.0, 10.0]], np.float16)
    h64 = h16.astype(np.float64)
    mm = h64.max(axis=1, keepdims=True)
    hl = h64 - (mm + np.log(np.exp(h64 - mm).sum(axis=1, keepdims=True)))
    for op, exp in (("Softmax", np.exp(hl)), ("LogSoftmax", hl)):
        yield Case(op, "extremes_f16",
                   single_node_model(op, [("x", np.float16, [2, 3])], [("y", np.float16, [2, 3])],
                                     attrs={"axis": -1}, opset=13),
                   {"x": h16}, {"y": exp}, rtol=2e-3, atol=1e-4, note="exp(12) overflows f16 unshifted")
    hm = np.zeros_like(r64)
    hm[np.arange(5), np.argmax(np.nan_to_num(r64, neginf=-np.inf), axis=1)] = 1.0
    yield Case("Hardmax", "extremes_f32",
               single_node_model("Hardmax", [("x", np.float32, [5, 4])], [("y", np.float32, [5, 4])],
                                 attrs={"axis": -1}, opset=13),
               {"x": rows}, {"y": hm}, note="one-hot of the first max")
    # ---- CumSum (CumProd from opset 26) ----
    cs = np.array([[F32MAX, F32MAX, -F32MAX, 1.0], [1e4, 1e-45, -1e4, 0.5]], np.float32)
    m = single_node_model("CumSum", [("x", np.float32, [2, 4])], [("y", np.float32, [2, 4])], opset=14)
    _with_axes(m, "axis", axes=1)
    m.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    yield Case("CumSum", "partial_overflow_f32", m, {"x": cs}, {"y": np.cumsum(cs.astype(np.float64), axis=1)},
               note="prefix sums in f64: the 2nd prefix of row 0 is 2*FLT_MAX (inf), the 3rd FLT_MAX again")
    cp = np.array([[1e20, 1e20, 1e-30, 2.0], [-1e-30, 1e-30, 1e30, 1e30]], np.float32)
    m = single_node_model("CumProd", [("x", np.float32, [2, 4])], [("y", np.float32, [2, 4])], opset=26)
    m.graph.node[0].input.append("axis")
    m.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    yield Case("CumProd", "partial_overflow_f32", m, {"x": cp}, {"y": np.cumprod(cp.astype(np.float64), axis=1)},
               rtol=1e-5, note="prefix products in f64")
    # ---- pools: [1, 1, 2, 2] windows of a [1, 1, 2, 4] input ----
    p = np.array([[[[F32MAX, F32MAX, 1e4, -1e4], [F32MAX, F32MAX, 1e-45, -0.0]]]], np.float32)
    wins = [p.astype(np.float64)[0, 0, :, 2 * j:2 * j + 2].ravel() for j in range(2)]
    pool = lambda op, a: single_node_model(op, [("x", np.float32, [1, 1, 2, 4])], [("y", np.float32, [1, 1, 1, 2])],
                                           attrs=a, opset=18)
    yield Case("AveragePool", "max_values_f32", pool("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
               {"x": p}, {"y": np.array([w.mean() for w in wins]).reshape(1, 1, 1, 2)},
               note="window sum in f64: 4*FLT_MAX/4 = FLT_MAX")
    whole = single_node_model("AveragePool", [("x", np.float32, [1, 1, 2, 4])], [("y", np.float32, [1, 1, 1, 1])],
                              attrs={"kernel_shape": [2, 4]}, opset=18)
    yield Case("AveragePool", "whole_plane_f32", whole, {"x": p},
               {"y": np.array(p.astype(np.float64).mean()).reshape(1, 1, 1, 1)},
               note="one window over the plane: sum of 4*FLT_MAX + ... in f64")
    x1 = np.array([[[F32MAX, F32MAX, -F32MAX, 1e4, -1e4, 1.0]]], np.float32)
    one_d = single_node_model("AveragePool", [("x", np.float32, [1, 1, 6])], [("y", np.float32, [1, 1, 3])],
                              attrs={"kernel_shape": [2], "strides": [2]}, opset=18)
    yield Case("AveragePool", "one_d_f32", one_d, {"x": x1},
               {"y": x1.astype(np.float64).reshape(1, 1, 3, 2).mean(axis=-1)},
               note="1-D windows (the generic path): FLT_MAX + FLT_MAX overflows f32")
    yield Case("MaxPool", "extremes_f32", pool("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
               {"x": p}, {"y": np.array([w.max() for w in wins]).reshape(1, 1, 1, 2)}, note="max of extremes")
    yield Case("LpPool", "squares_overflow_f32", pool("LpPool", {"kernel_shape": [2, 2], "strides": [2, 2], "p": 2}),
               {"x": np.array([[[[2e38, 2e38, 1e4, -1e4], [1e19, 0.0, 1e-45, -0.0]]]], np.float32)},
               {"y": np.array([np.hypot.reduce([2e38, 2e38, 1e19, 0.0]), np.hypot.reduce([1e4, -1e4, 1e-45, 0.0])],
                              dtype=np.float64).reshape(1, 1, 1, 2)},
               note="sqrt(sum(x^2)): (2e38)^2 overflows f32")
    g = single_node_model("GlobalAveragePool", [("x", np.float32, [1, 1, 2, 4])], [("y", np.float32, [1, 1, 1, 1])])
    yield Case("GlobalAveragePool", "max_values_f32", g, {"x": np.full((1, 1, 2, 4), F32MAX, np.float32)},
               {"y": np.full((1, 1, 1, 1), F32MAX)}, note="mean of FLT_MAX is FLT_MAX (sum in f64)")
    g = single_node_model("GlobalMaxPool", [("x", np.float32, [1, 1, 2, 4])], [("y", np.float32, [1, 1, 1, 1])])
    yield Case("GlobalMaxPool", "extremes_f32", g, {"x": p}, {"y": np.full((1, 1, 1, 1), F32MAX)},
               note="max of extremes")
