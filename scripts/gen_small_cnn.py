#!/usr/bin/env python3
"""A zoo-style CNN with random weights and non-constant outputs, for value tests.

    .venv/bin/python scripts/gen_small_cnn.py [--out DIR]      # default fixtures/large/small_cnn

The nine model-zoo "light" models (scripts/gen_light_models.py) have constant outputs, so
they say little about values. This model has seeded random weights (numpy default_rng(28))
and a random input, and its outputs vary by sample and class:

  x [2,3,16,16] -> Conv 3->8 3x3 pad 1 (+bias) -> Relu -> BatchNormalization
    -> MaxPool 3x3 stride 2 pad 1                        [2,8,8,8]
    -> Conv 8->16 3x3 stride 1 pad 1 group 2 (+bias) -> BatchNormalization -> Relu
    -> AveragePool 3x3 stride 2 pad 1 (count_include_pad 0)  [2,16,4,4]
    -> Conv 16->16 1x1 -> Add (residual) -> GlobalAveragePool -> Flatten
    -> Gemm 16->10 (transB=1, +bias)                     [2,10]

Writes model.onnx (opset 17, a few KB), input_x.npy, expected_y.npy (onnxruntime's output,
float32), reference_y.npy (a float64 NumPy evaluation of each op's ONNX definition, written
here independently of onnxruntime) and meta.json (the max |onnxruntime - float64| and the
tolerance the Rust test uses). Fails when onnxruntime and the float64 evaluation disagree
beyond that tolerance. Test: crates/rlx-cli/tests/models.rs small_cnn_*.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
RTOL, ATOL = 1e-4, 1e-5  # the Rust test's tolerance (float32 against float64 / onnxruntime)
EPS = 1e-5


def weights():
    r = np.random.default_rng(28)
    f = lambda *s, scale=1.0: (r.standard_normal(s) * scale).astype(np.float32)
    w = {
        "w1": f(8, 3, 3, 3, scale=0.4), "b1": f(8, scale=0.1),
        "g1": (1 + f(8, scale=0.2)), "be1": f(8, scale=0.1),
        "m1": (0.5 + f(8, scale=0.2)), "v1": (0.5 + r.random(8)).astype(np.float32),
        "w2": f(16, 4, 3, 3, scale=0.3), "b2": f(16, scale=0.1),
        "g2": (1 + f(16, scale=0.2)), "be2": f(16, scale=0.1),
        "m2": f(16, scale=0.2), "v2": (0.5 + r.random(16)).astype(np.float32),
        "w3": f(16, 16, 1, 1, scale=0.3),
        "wf": f(10, 16, scale=0.5), "bf": f(10, scale=0.1),
    }
    x = r.standard_normal((2, 3, 16, 16)).astype(np.float32)
    return w, x


def model(w) -> onnx.ModelProto:
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("BatchNormalization", ["r1", "g1", "be1", "m1", "v1"], ["n1"], name="bn1", epsilon=EPS),
        # MaxPool straight into a conv, over BatchNorm outputs that are often negative: a
        # kernel that pads with 0 instead of -inf shows (behind a Relu it would not).
        n("MaxPool", ["n1"], ["p1"], name="pool1", kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1]),
        n("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], group=2),
        n("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"], name="bn2", epsilon=EPS),
        n("Relu", ["n2"], ["r2"], name="relu2"),
        # Padded average that leaves the pad out of the count (count_include_pad=0).
        n("AveragePool", ["r2"], ["p2"], name="pool2", kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1]),
        n("Conv", ["p2", "w3"], ["c3"], name="conv3"),
        n("Add", ["c3", "p2"], ["res"], name="residual"),
        n("GlobalAveragePool", ["res"], ["gap"], name="gap"),
        n("Flatten", ["gap"], ["flat"], name="flatten"),
        n("Gemm", ["flat", "wf", "bf"], ["y"], name="head", transB=1),
    ]
    g = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


# float64 evaluation, each op from its definition in the ONNX operator docs.

def conv(x, w, b=None, pad=0, stride=1, group=1):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for oc in range(m):
        gi = oc // mg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, gi * cg:(gi + 1) * cg, i:i + stride * oh:stride, j:j + stride * ow:stride]
                y[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
        if b is not None:
            y[:, oc] += b[oc]
    return y


def bn(x, g, be, m, v):
    s = lambda a: a.reshape(1, -1, 1, 1)
    return (x - s(m)) / np.sqrt(s(v) + EPS) * s(g) + s(be)


def maxpool(x, k, stride, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    oh = (x.shape[2] + 2 * pad - k) // stride + 1
    ow = (x.shape[3] + 2 * pad - k) // stride + 1
    y = np.full(x.shape[:2] + (oh, ow), -np.inf)
    for i in range(k):
        for j in range(k):
            y = np.maximum(y, xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride])
    return y


def avgpool(x, k, stride, pad):
    # count_include_pad=0: the mean over the window's elements inside the input.
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (x.shape[2] + 2 * pad - k) // stride + 1
    ow = (x.shape[3] + 2 * pad - k) // stride + 1
    y = np.zeros(x.shape[:2] + (oh, ow))
    cnt = np.zeros_like(y)
    for i in range(k):
        for j in range(k):
            y += xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            cnt += ones[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
    return y / cnt


def reference(w, x):
    d = {k: v.astype(np.float64) for k, v in w.items()}
    h = conv(x.astype(np.float64), d["w1"], d["b1"], pad=1)
    h = maxpool(bn(np.maximum(h, 0), d["g1"], d["be1"], d["m1"], d["v1"]), 3, 2, 1)
    h = conv(h, d["w2"], d["b2"], pad=1, group=2)
    p2 = avgpool(np.maximum(bn(h, d["g2"], d["be2"], d["m2"], d["v2"]), 0), 3, 2, 1)
    res = conv(p2, d["w3"]) + p2
    flat = res.mean(axis=(2, 3))
    return flat @ d["wf"].T + d["bf"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures/large/small_cnn")
    a = ap.parse_args(argv)
    w, x = weights()
    m = model(w)
    ref = reference(w, x)
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    diff = float(np.max(np.abs(got - ref)))
    if not np.allclose(got, ref, rtol=RTOL, atol=ATOL):
        print(f"gen_small_cnn: onnxruntime and the float64 evaluation differ by {diff:.3e}",
              file=sys.stderr)
        return 1
    if float(np.std(ref)) < 0.1:
        print("gen_small_cnn: outputs nearly constant", file=sys.stderr)
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    onnx.save(m, a.out / "model.onnx")
    np.save(a.out / "input_x.npy", x)
    np.save(a.out / "expected_y.npy", got)
    np.save(a.out / "reference_y.npy", ref)
    meta = {
        "generator": "scripts/gen_small_cnn.py",
        "seed": 28,
        "rtol": RTOL,
        "atol": ATOL,
        "max_abs_onnxruntime_vs_float64": diff,
        "output_std": float(np.std(ref)),
        "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__,
                     "numpy": np.__version__},
    }
    (a.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"gen_small_cnn: wrote {a.out} (ort vs float64 max abs {diff:.2e}, "
          f"output std {meta['output_std']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
