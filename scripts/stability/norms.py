"""Stability cases for the normalizations (C2), with their stash types, LRN, LpNormalization,
Attention's softmax precision and the losses. Expected values are float64 math of each op's
ONNX definition / function body (stage one in the stash type where the body casts), never
RLX's, onnxruntime's or onnx's reference evaluator's output (the evaluator ignores
stash_type)."""

import numpy as np
from onnx import numpy_helper

from common import Case, single_node_model

F32MAX = float(np.finfo(np.float32).max)


def _spiky_f16(n=8):
    """One row of small values with one spike: (300 - mean)^2 ~ 7e4 overflows f16."""
    x = (np.arange(n, dtype=np.float64) * 0.25 - 1.0)
    x[3] = 300.0
    return x.astype(np.float16)


def _offset_f32(n=8):
    """x = 1e4 + small noise, exactly representable in f32: E[x^2] - E[x]^2 cancels."""
    return (1e4 + np.array([0.5, -0.5, 0.25, -0.25, 0.125, -0.125, 0.0, 0.375][:n])).astype(np.float32)


def _standardize(x64, axes, eps):
    m = x64.mean(axis=axes, keepdims=True)
    v = ((x64 - m) ** 2).mean(axis=axes, keepdims=True)
    return (x64 - m) / np.sqrt(v + eps)


def _layer_norm(name, x, dtype, stash_rounds, rtol, atol, note, opset=17):
    """LayerNormalization over the last axis with scale 0.5..., bias 0.1; the function body:
    Normalized = Cast<T>(standardize(Cast<f32>(X))); Y = Normalized * Scale + B (in T)."""
    n = x.shape[-1]
    scale = (0.5 + 0.125 * np.arange(n)).astype(dtype)
    bias = np.full(n, 0.25, dtype)
    nrm = _standardize(x.astype(np.float64), (-1,), 1e-5)
    if stash_rounds:
        nrm = nrm.astype(dtype).astype(np.float64)  # the body's Cast back to T
    y = nrm * scale.astype(np.float64) + bias.astype(np.float64)
    m = single_node_model("LayerNormalization",
                          [("x", dtype, list(x.shape)), ("scale", dtype, [n]), ("bias", dtype, [n])],
                          [("y", dtype, list(x.shape))], attrs={"axis": -1, "epsilon": 1e-5}, opset=opset)
    return Case("LayerNormalization", name, m, {"x": x, "scale": scale, "bias": bias}, {"y": y},
                rtol=rtol, atol=atol, note=note)


def cases():
    # ---- LayerNormalization ----
    x = np.stack([_spiky_f16(), (np.arange(8) * 0.5).astype(np.float16)])
    yield _layer_norm("spiky_token_f16_stash_f32", x, np.float16, True, 2e-3, 2e-3,
                      "stash_type=1: mean/variance of Cast<f32>(X); in f16 the square overflows, "
                      "var = inf, the row becomes 0")
    x = np.stack([_offset_f32(), -_offset_f32()])
    yield _layer_norm("large_offset_f32", x, np.float32, False, 1e-4, 1e-5,
                      "centered two-pass variance: E[x^2]-E[x]^2 cancels at 1e4 + noise")
    # ---- GroupNormalization (opset 21: stash_type, per-channel scale) ----
    xg = np.concatenate([_spiky_f16(), _spiky_f16()[::-1]]).reshape(1, 4, 4).astype(np.float16)
    sc = np.array([1.0, 0.5, 2.0, 1.5], np.float16)
    bs = np.array([0.0, 0.25, -0.25, 1.0], np.float16)
    g64 = xg.astype(np.float64).reshape(1, 2, 8)
    nrm = _standardize(g64, (-1,), 1e-5).reshape(1, 4, 4).astype(np.float16).astype(np.float64)
    yg = nrm * sc.astype(np.float64)[None, :, None] + bs.astype(np.float64)[None, :, None]
    m = single_node_model("GroupNormalization", [("x", np.float16, [1, 4, 4]), ("scale", np.float16, [4]),
                                                 ("bias", np.float16, [4])],
                          [("y", np.float16, [1, 4, 4])], attrs={"num_groups": 2, "epsilon": 1e-5}, opset=21)
    yield Case("GroupNormalization", "spiky_f16_stash_f32", m, {"x": xg, "scale": sc, "bias": bs}, {"y": yg},
               rtol=2e-3, atol=2e-3, note="stash_type=1 (opset 21): statistics in f32")
    # ---- InstanceNormalization: f16 spike and f32 offset ----
    for name, xi, dt, tol in (("spiky_f16", _spiky_f16().reshape(1, 1, 8), np.float16, 2e-3),
                              ("large_offset_f32", _offset_f32().reshape(1, 1, 8), np.float32, 1e-4)):
        s1 = np.array([1.5], dt)
        b1 = np.array([0.5], dt)
        nrm = _standardize(xi.astype(np.float64), (2,), 1e-5)
        if dt == np.float16:
            nrm = nrm.astype(dt).astype(np.float64)
        yi = nrm * 1.5 + 0.5
        m = single_node_model("InstanceNormalization", [("x", dt, [1, 1, 8]), ("scale", dt, [1]), ("bias", dt, [1])],
                              [("y", dt, [1, 1, 8])], attrs={"epsilon": 1e-5}, opset=6)
        yield Case("InstanceNormalization", name, m, {"x": xi, "scale": s1, "bias": b1}, {"y": yi},
                   rtol=tol, atol=tol, note="statistics in f32, centered variance")
    # ---- RMSNormalization (opset 23, stash_type=1) ----
    xr = np.stack([_spiky_f16(), np.full(8, 200.0, np.float16)])
    sr = np.full(8, 0.5, np.float16)
    x64 = xr.astype(np.float64)
    nrm = (x64 / np.sqrt((x64 ** 2).mean(axis=-1, keepdims=True) + 1e-5)).astype(np.float16).astype(np.float64)
    m = single_node_model("RMSNormalization", [("x", np.float16, [2, 8]), ("scale", np.float16, [8])],
                          [("y", np.float16, [2, 8])], attrs={"axis": -1, "epsilon": 1e-5}, opset=23)
    yield Case("RMSNormalization", "spiky_f16_stash_f32", m, {"x": xr, "scale": sr}, {"y": nrm * 0.5},
               rtol=2e-3, atol=1e-3, note="x^2 in f32: 300^2 and 200^2 overflow f16")
    # ---- MeanVarianceNormalization: centered, not E[x^2] - E[x]^2 ----
    xm = _offset_f32().reshape(1, 1, 2, 4)
    x64 = xm.astype(np.float64)
    mu = x64.mean(axis=(0, 2, 3), keepdims=True)
    ym = (x64 - mu) / (np.sqrt(((x64 - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)) + 1e-9)
    m = single_node_model("MeanVarianceNormalization", [("x", np.float32, [1, 1, 2, 4])],
                          [("y", np.float32, [1, 1, 2, 4])], opset=13)
    yield Case("MeanVarianceNormalization", "large_offset_f32", m, {"x": xm}, {"y": ym}, rtol=1e-4, atol=1e-5,
               note="(x - mean) / (sqrt(mean((x - mean)^2)) + 1e-9); E[x^2]-E[x]^2 loses every bit at 1e4")
    # ---- BatchNormalization: inference with a large mean; training statistics on an offset ----
    xb = _offset_f32().reshape(2, 1, 4)
    sc, bs = np.array([2.0], np.float32), np.array([0.5], np.float32)
    rm, rv = np.array([1e4], np.float32), np.array([0.0625], np.float32)
    yb = (xb.astype(np.float64) - 1e4) / np.sqrt(0.0625 + 1e-5) * 2.0 + 0.5
    ins = [("x", np.float32, [2, 1, 4]), ("scale", np.float32, [1]), ("B", np.float32, [1]),
           ("mean", np.float32, [1]), ("var", np.float32, [1])]
    m = single_node_model("BatchNormalization", ins, [("y", np.float32, [2, 1, 4])], attrs={"epsilon": 1e-5},
                          opset=15)
    feeds = {"x": xb, "scale": sc, "B": bs, "mean": rm, "var": rv}
    yield Case("BatchNormalization", "inference_offset_f32", m, feeds, {"y": yb}, rtol=1e-4, atol=1e-4,
               note="(x - mean) * (scale / sqrt(var + eps)) + B")
    x64 = xb.astype(np.float64)
    mu = x64.mean(axis=(0, 2), keepdims=True)
    var = ((x64 - mu) ** 2).mean(axis=(0, 2), keepdims=True)
    yt = (x64 - mu) / np.sqrt(var + 1e-5) * 2.0 + 0.5
    m = single_node_model("BatchNormalization", ins,
                          [("y", np.float32, [2, 1, 4]), ("rm", np.float32, [1]), ("rv", np.float32, [1])],
                          attrs={"epsilon": 1e-5, "momentum": 0.5, "training_mode": 1}, opset=15)
    yield Case("BatchNormalization", "training_offset_f32", m, feeds,
               {"y": yt, "rm": 0.5 * 1e4 + 0.5 * mu.ravel(), "rv": 0.5 * 0.0625 + 0.5 * var.ravel()},
               rtol=1e-4, atol=1e-4, note="batch statistics: centered two-pass variance")
    # ---- LpNormalization: the norm overflows f32 ----
    xl = np.array([[2e38, 2e38, 0.0], [3e38, -3e38, 1e38], [1e-45, 0.0, 0.0]], np.float32)
    x64 = xl.astype(np.float64)
    for p in (1, 2):
        nr = np.abs(x64).sum(axis=1, keepdims=True) if p == 1 else np.sqrt((x64 ** 2).sum(axis=1, keepdims=True))
        m = single_node_model("LpNormalization", [("x", np.float32, [3, 3])], [("y", np.float32, [3, 3])],
                              attrs={"axis": 1, "p": p}, opset=1)
        yield Case("LpNormalization", f"norm_overflows_p{p}", m, {"x": xl}, {"y": x64 / nr}, rtol=1e-5,
                   note="norm and division in f64 (|x| sums and squares overflow f32)")
    # ---- LRN: squares of 1e20 overflow f32 ----
    xn = np.array([1e20, 1e4, -1e4, 1.0], np.float32).reshape(1, 4, 1, 1)
    x64 = xn.astype(np.float64).ravel()
    size, alpha, beta, bias = 3, 1e-4, 0.75, 1.0
    sq = np.array([sum(x64[j] ** 2 for j in range(max(0, c - 1), min(4, c + 2))) for c in range(4)])
    yn = (x64 / (bias + alpha / size * sq) ** beta).reshape(1, 4, 1, 1)
    m = single_node_model("LRN", [("x", np.float32, [1, 4, 1, 1])], [("y", np.float32, [1, 4, 1, 1])],
                          attrs={"size": size, "alpha": alpha, "beta": beta, "bias": bias}, opset=13)
    yield Case("LRN", "squares_overflow_f32", m, {"x": xn}, {"y": yn}, rtol=1e-4,
               note="x / (bias + alpha/size * sum(x^2))^beta: (1e20)^2 overflows f32")
    # ---- losses ----
    logits = np.array([[1e4, 0.0, -1e4], [95.0, 94.0, -3.0], [F32MAX, 0.0, 1.0]], np.float32)
    labels = np.array([1, 0, 0], np.int64)
    l64 = logits.astype(np.float64)
    mx = l64.max(axis=1, keepdims=True)
    lsm = l64 - (mx + np.log(np.exp(l64 - mx).sum(axis=1, keepdims=True)))
    loss = -lsm[np.arange(3), labels].mean()
    m = single_node_model("SoftmaxCrossEntropyLoss", [("x", np.float32, [3, 3]), ("t", np.int64, [3])],
                          [("y", np.float32, [])], attrs={"reduction": "mean"}, opset=13)
    yield Case("SoftmaxCrossEntropyLoss", "large_logits_f32", m, {"x": logits, "t": labels},
               {"y": np.array(loss)}, rtol=1e-5, note="-mean(log_softmax(x)[label]) with a shifted log_softmax")
    lp = np.array([[-1e4, -F32MAX, -0.0], [-88.8, -89.0, -1e-45]], np.float32)
    w = np.array([1.0, 0.5, 2.0], np.float32)
    lab = np.array([0, 2], np.int64)
    num = -(lp.astype(np.float64)[np.arange(2), lab] * w[lab]).sum()
    m = single_node_model("NegativeLogLikelihoodLoss", [("x", np.float32, [2, 3]), ("t", np.int64, [2]),
                                                        ("w", np.float32, [3])],
                          [("y", np.float32, [])], attrs={"reduction": "mean"}, opset=13)
    yield Case("NegativeLogLikelihoodLoss", "extremes_f32", m, {"x": lp, "t": lab, "w": w},
               {"y": np.array(num / w[lab].astype(np.float64).sum())}, rtol=1e-5,
               note="-sum(w[t] * x[t]) / sum(w[t])")
    # ---- Attention (opset 23): f16 scores beyond 65504 / exp overflow; softmax in f32 ----
    q = np.array([[[[8.0, 8.0], [0.5, -0.5]]]], np.float16)      # [1, 1, 2, 2]
    k = np.array([[[[8.0, 8.0], [-8.0, -8.0], [0.0, 1.0]]]], np.float16)  # [1, 1, 3, 2]
    v = np.array([[[[1.0, 2.0], [3.0, -4.0], [60000.0, 0.5]]]], np.float16)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = (q64 @ k64.transpose(0, 1, 3, 2)) / np.sqrt(2.0)
    s = s - s.max(axis=-1, keepdims=True)
    pr = np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True)
    m = single_node_model("Attention", [("q", np.float16, [1, 1, 2, 2]), ("k", np.float16, [1, 1, 3, 2]),
                                        ("v", np.float16, [1, 1, 3, 2])],
                          [("y", np.float16, [1, 1, 2, 2])], attrs={"softmax_precision": 1}, opset=23)
    yield Case("Attention", "f16_softmax_precision_f32", m, {"q": q, "k": k, "v": v}, {"y": pr @ v64},
               rtol=3e-3, atol=1e-2, note="scores 90.5 -> exp overflows f16; softmax in f32 with the max shift")
