#!/usr/bin/env python3
"""ONNX Loop models whose body makes a NaN at a known iteration (issue 32: iterations in
NaN reports, the printer and `rlx trace`).

    .venv/bin/python scripts/gen_loop_models.py      # < 1 s; CI runs it

Writes fixtures/loops/ (gitignored):

  loop_const/model.onnx   x f32[3] -> Add "prep/Add" (+0) -> Loop "decoder_loop" (trip count
                          an initializer, 5; cond an initializer, true) whose body carries v:
                          Cast "loop_body/Cast" (the iteration number i as float) ->
                          Sub "loop_body/Sub" (v - i) -> Sqrt "loop_body/Sqrt" -> v, i.e.
                          v <- sqrt(v - i) -> Neg "post/Neg" -> y
  loop_const/input_x.npy  x = [30, 100, 1000]: v - i first goes negative at iteration 3
                          (0-based, the body's iteration_num), where Sqrt makes the NaN
  loop_dyn/model.onnx     the same with the trip count a graph input "trip" (int64 scalar),
                          so RLX runs the Loop between segments
  loop_dyn/input_{x,trip}.npy   the same x, trip = 5
  loop_while/model.onnx   a while loop: no trip count; the body's condition is
                          `i < 4 and max(v) is not +inf` (computed from data, so the importer
                          cannot unroll it and RLX runs the body once per iteration at run
                          time), and a scan output "v_scan" stacking every iteration's v;
                          outputs y and v_scan; input_x.npy the same x
  loop_long/model.onnx    a Loop of 5000 iterations (a constant trip count, more than the
                          importer unrolls): v <- v + 1, so RLX runs it at run time; y = x + 5000
  loop_zero/model.onnx    loop_while's body (with its scan output) under a trip count fed as
                          input "trip" = 0: no iteration runs; y = -x and v_scan is [0, 3]
  */expected_y.npy        onnxruntime's output (loop_while, loop_zero: also expected_v_scan.npy)
  */expected.json         {"node": "loop_body/Sqrt", "loop": "decoder_loop", "iteration": k}:
                          k is the first iteration whose Sqrt gets a negative argument,
                          computed here with numpy (float32, the model's math) and checked
                          against onnxruntime (the loop run with trip counts 1..5: the first
                          trip count whose output holds NaN is k + 1)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "loops"
X = np.array([30.0, 100.0, 1000.0], dtype=np.float32)
TRIP = 5
LOOP = "decoder_loop"
NODE = "loop_body/Sqrt"


def body() -> onnx.GraphProto:
    nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_body/Cond"),
        helper.make_node("Cast", ["i"], ["fi"], name="loop_body/Cast", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["v", "fi"], ["d"], name="loop_body/Sub"),
        helper.make_node("Sqrt", ["d"], ["v_out"], name=NODE),
    ]
    return helper.make_graph(
        nodes,
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3]),
        ],
    )


def model(trip_is_input: bool, trip: int = TRIP) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.zeros(3, np.float32), "zero"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    if trip_is_input:
        inputs.append(helper.make_tensor_value_info("trip", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trip, dtype=np.int64), "trip"))
    nodes = [
        helper.make_node("Add", ["x", "zero"], ["x0"], name="prep/Add"),
        helper.make_node("Loop", ["trip", "cond", "x0"], ["v_final"], name=LOOP, body=body()),
        helper.make_node("Neg", ["v_final"], ["y"], name="post/Neg"),
    ]
    g = helper.make_graph(
        nodes,
        "loop_nan",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def while_body() -> onnx.GraphProto:
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], name="loop_body/Cast", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["v", "fi"], ["d"], name="loop_body/Sub"),
        helper.make_node("Sqrt", ["d"], ["v_out"], name=NODE),
        helper.make_node("Identity", ["v_out"], ["v_scan"], name="loop_body/Scan"),
        helper.make_node("Less", ["fi", "four"], ["more"], name="loop_body/Less"),
        helper.make_node("ReduceMax", ["v_out"], ["vmax"], name="loop_body/Max", keepdims=0),
        helper.make_node("IsInf", ["vmax"], ["inf"], name="loop_body/IsInf", detect_negative=0),
        helper.make_node("Not", ["inf"], ["finite"], name="loop_body/Not"),
        helper.make_node("And", ["more", "finite"], ["cond_out"], name="loop_body/And"),
    ]
    return helper.make_graph(
        nodes,
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("v_scan", TensorProto.FLOAT, [3]),
        ],
        initializer=[numpy_helper.from_array(np.array(4.0, dtype=np.float32), "four")],
    )


def while_model() -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.zeros(3, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Add", ["x", "zero"], ["x0"], name="prep/Add"),
        helper.make_node(
            "Loop", ["", "cond", "x0"], ["v_final", "v_scan"], name=LOOP, body=while_body()
        ),
        helper.make_node("Neg", ["v_final"], ["y"], name="post/Neg"),
    ]
    g = helper.make_graph(
        nodes,
        "loop_while",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("v_scan", TensorProto.FLOAT, [None, 3]),
        ],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def run_ort(m: onnx.ModelProto, feeds: dict) -> np.ndarray:
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def first_nan_iteration_numpy() -> int:
    v = X.copy()
    with np.errstate(invalid="ignore"):
        for i in range(TRIP):
            d = v - np.float32(i)
            if np.isfinite(v).all() and (d < 0).any():
                return i
            v = np.sqrt(d)
    raise SystemExit("the chosen x never makes a NaN")


def first_nan_iteration_ort() -> int:
    for trip in range(1, TRIP + 1):
        y = run_ort(model(False, trip), {"x": X})
        if np.isnan(y).any():
            return trip - 1
    raise SystemExit("onnxruntime found no NaN")


def main() -> None:
    k = first_nan_iteration_numpy()
    k_ort = first_nan_iteration_ort()
    assert k == k_ort == 3, (k, k_ort)
    expect = {"node": NODE, "loop": LOOP, "iteration": k}
    for name, dyn in [("loop_const", False), ("loop_dyn", True)]:
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        m = model(dyn)
        onnx.save(m, d / "model.onnx")
        feeds = {"x": X}
        np.save(d / "input_x.npy", X)
        if dyn:
            feeds["trip"] = np.array(TRIP, dtype=np.int64)
            np.save(d / "input_trip.npy", feeds["trip"])
        y = run_ort(m, feeds)
        np.save(d / "expected_y.npy", y)
        (d / "expected.json").write_text(json.dumps(expect, indent=2) + "\n")
        print(f"{d}: first NaN made by {NODE} at iteration {k} of {LOOP}; y = {y}")
    # The while loop: 5 iterations (i = 0..4; at i = 4 the condition turns false), the same
    # v as the for loops, so the same first NaN.
    d = OUT / "loop_while"
    d.mkdir(parents=True, exist_ok=True)
    m = while_model()
    onnx.save(m, d / "model.onnx")
    np.save(d / "input_x.npy", X)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    y, scan = s.run(None, {"x": X})
    assert scan.shape == (TRIP, 3), scan.shape
    np.save(d / "expected_y.npy", y)
    np.save(d / "expected_v_scan.npy", scan)
    (d / "expected.json").write_text(json.dumps(expect, indent=2) + "\n")
    print(f"{d}: while loop, {scan.shape[0]} iterations; y = {y}")
    # Zero iterations with a scan output: an empty [0, 3] stack.
    d = OUT / "loop_zero"
    d.mkdir(parents=True, exist_ok=True)
    g = helper.make_graph(
        [
            helper.make_node("Add", ["x", "zero"], ["x0"], name="prep/Add"),
            helper.make_node(
                "Loop", ["trip", "cond", "x0"], ["v_final", "v_scan"], name=LOOP, body=while_body()
            ),
            helper.make_node("Neg", ["v_final"], ["y"], name="post/Neg"),
        ],
        "loop_zero",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("v_scan", TensorProto.FLOAT, [None, 3]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(True), "cond"),
            numpy_helper.from_array(np.zeros(3, np.float32), "zero"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, d / "model.onnx")
    np.save(d / "input_x.npy", X)
    np.save(d / "input_trip.npy", np.array(0, dtype=np.int64))
    s0 = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    y, scan = s0.run(None, {"x": X, "trip": np.array(0, dtype=np.int64)})
    assert scan.shape == (0, 3) and np.array_equal(y, -X), (y, scan.shape)
    np.save(d / "expected_y.npy", y)
    np.save(d / "expected_v_scan.npy", scan)
    print(f"{d}: zero iterations; y = {y}, v_scan {scan.shape}")
    # More iterations than the importer unrolls (4096).
    d = OUT / "loop_long"
    d.mkdir(parents=True, exist_ok=True)
    inc = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="long_body/Cond"),
            helper.make_node("Add", ["v", "one"], ["v_out"], name="long_body/Add"),
        ],
        "long_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3]),
        ],
        initializer=[numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["trip", "cond", "x"], ["y"], name="long_loop", body=inc)],
        "loop_long",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[
            numpy_helper.from_array(np.array(5000, dtype=np.int64), "trip"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, d / "model.onnx")
    np.save(d / "input_x.npy", X)
    y = run_ort(m, {"x": X})
    assert np.allclose(y, X + 5000), y
    np.save(d / "expected_y.npy", y)
    print(f"{d}: 5000 iterations; y = {y}")


if __name__ == "__main__":
    main()
