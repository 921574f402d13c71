#!/usr/bin/env python3
"""Float32 models whose float16 versions overflow, with calibration and held-back inputs,
for `rlx precision` (crates/rlx-cli/tests/precision.rs, docs/DEBUGGING.md).

    .venv/bin/python scripts/gen_precision_models.py            # all, into fixtures/precision/
    .venv/bin/python scripts/gen_precision_models.py bert cnn   # a subset

Models (each planted the way real float16 overflow reports look; a few hundred KB each):

  cast_f16_overflow_f32     examples/cast_f16_overflow made float32 (the -1e9 mask fill that
                            becomes -inf in float16; calibration rows include fully masked ones)
  f16_activation_growth_f32 examples/f16_activation_growth made float32 (7 blocks, max|x|
                            grows 5x per block; the last Mul passes 65504)
  bert_overflow             fixtures/transformers/bert_tiny with BERT-style outlier features
                            (the embedding LayerNorm's gain of hidden dim 7 is 300: activations
                            of ~1e3 along the residual stream) and layer 1's FFN output
                            dense scaled 10000x in that dim (its output passes 1e5, then the
                            LayerNorm brings it back), as T5/BERT float16 overflow reports show
  qwen3_overflow            fixtures/transformers/qwen3_tiny with a Llama-style "massive
                            activation": layer 0's down_proj (column 5 scaled 3e5x) writes ~1e3 into hidden dim 5 of
                            the residual stream, so every later RMSNorm's Pow(x, 2) passes 65504
  cnn_overflow              scripts/gen_small_cnn.py's CNN fed unnormalized pixels (0..255) with
                            a first-conv output channel scaled 150x (its output passes 65504;
                            the BatchNormalization brings it back) and a BN gain of 1000 in
                            channel 2 (activations ~1e3 through the next block)

Per model, fixtures/precision/<name>/:

  model.onnx                   float32
  calib/<k>/input_<name>.npy   calibration input sets (the search sees only these)
  heldout/<k>/input_<name>.npy held-back input sets (different seeds; never seen by the search)
  heldout/<k>/expected_<out>.npy  onnxruntime's float32 outputs for them (the reference)
  autocast_rule.json           NVIDIA Model Optimizer AutoCast's documented default rule,
                               applied here with onnxruntime's float32 intermediate values on
                               the calibration sets: keep a node when an output's max |x| >
                               data_max (512) or an initializer it reads has max |x| > init_max
                               (65504); `kept` (node names) and `count`. Constant nodes and
                               shape arithmetic are not counted (nor by rlx precision).
  meta.json                    the largest f32 |x| anywhere (must pass 65504: the overflow is
                               real) and where

Deterministic (numpy seeds), under a few seconds; CI runs it (.ci/run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "precision"
DATA_MAX, INIT_MAX, F16_MAX = 512.0, 65504.0, 65504.0
N_CALIB, N_HELD = 4, 3

sys.path.insert(0, str(ROOT / "scripts"))


def to_float32(m: onnx.ModelProto) -> onnx.ModelProto:
    """The float32 version of a float16 model: float16 initializers, inputs, outputs, value
    infos and Constant values become float32, Cast(to=float16) becomes Cast(to=float)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT16:
            a = numpy_helper.to_array(t).astype(np.float32)
            g.initializer[i].CopyFrom(numpy_helper.from_array(a, t.name))
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT16:
                a.i = TensorProto.FLOAT
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16:
                arr = numpy_helper.to_array(a.t).astype(np.float32)
                a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
    onnx.checker.check_model(m)
    return m


def init(m: onnx.ModelProto, name: str) -> np.ndarray:
    for t in m.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t).copy()
    raise KeyError(name)


def set_init(m: onnx.ModelProto, name: str, a: np.ndarray) -> None:
    for i, t in enumerate(m.graph.initializer):
        if t.name == name:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))
            return
    raise KeyError(name)


def node_input(m: onnx.ModelProto, node: str, i: int) -> str:
    for n in m.graph.node:
        if n.name == node:
            return n.input[i]
    raise KeyError(node)


# --- the models -------------------------------------------------------------------------


def cast_f16_overflow_f32():
    m = to_float32(onnx.load(ROOT / "examples/cast_f16_overflow/model.onnx"))

    def sample(rng, k):
        s = (rng.standard_normal((1, 4, 4)) * 3).astype(np.float32)
        mask = np.tril(np.ones((4, 4), np.int64))[None].copy()
        mask[0, rng.integers(0, 4)] = 0  # one query row fully masked, as in the example
        return {"scores": s, "attention_mask": mask}

    ex = {n: np.load(ROOT / f"examples/cast_f16_overflow/input_{n}.npy")
          for n in ("scores", "attention_mask")}
    return m, sample, ex


def f16_activation_growth_f32():
    m = to_float32(onnx.load(ROOT / "examples/f16_activation_growth/model.onnx"))
    x0 = np.load(ROOT / "examples/f16_activation_growth/input_x.npy").astype(np.float32)

    def sample(rng, k):
        return {"x": np.clip(rng.standard_normal((2, 16)), -2.5, 2.5).astype(np.float32)}

    return m, sample, {"x": x0}


def token_sample(vocab, names, seq=16):
    def sample(rng, k):
        d = {"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64)}
        if "attention_mask" in names:
            d["attention_mask"] = np.ones((1, seq), np.int64)
        if "token_type_ids" in names:
            d["token_type_ids"] = np.zeros((1, seq), np.int64)
        return d
    return sample


def bert_overflow():
    m = onnx.load(ROOT / "fixtures/transformers/bert_tiny/model.onnx")
    dim = 7
    g = init(m, "embeddings.LayerNorm.weight")
    g[dim] = 300.0
    set_init(m, "embeddings.LayerNorm.weight", g)
    w_name = node_input(m, "/encoder/layer.1/output/dense/MatMul", 1)
    w = init(m, w_name)
    w[:, dim] *= 10000.0
    set_init(m, w_name, w)
    return m, token_sample(1000, ["input_ids", "attention_mask", "token_type_ids"]), None


def qwen3_overflow():
    m = onnx.load(ROOT / "fixtures/transformers/qwen3_tiny/model.onnx")
    dim = 5
    w_name = node_input(m, "/model/layers.0/mlp/down_proj/MatMul", 1)
    w = init(m, w_name)
    w[:, dim] *= 300000.0
    set_init(m, w_name, w)
    vocab = init(m, "model.embed_tokens.weight").shape[0]
    return m, token_sample(vocab, ["input_ids", "attention_mask"]), None


def cnn_overflow():
    import gen_small_cnn as cnn
    w, _ = cnn.weights()
    w["w1"] = w["w1"].copy()
    w["w1"][0] *= 150.0  # output channel 0 of the first conv: its output passes 65504
    # A calibrated BatchNormalization: running statistics of relu(conv1) on pixel inputs, so
    # BN1 brings channel 0 back to O(1); a gain of 1000 in channel 2 keeps ~1e3 downstream.
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (8, 3, 16, 16)).astype(np.float64)
    r1 = np.maximum(cnn.conv(x, w["w1"].astype(np.float64), w["b1"].astype(np.float64), pad=1), 0)
    w["m1"] = r1.mean(axis=(0, 2, 3)).astype(np.float32)
    w["v1"] = (r1.var(axis=(0, 2, 3)) + 1e-3).astype(np.float32)
    w["g1"] = w["g1"].copy()
    w["g1"][2] = 1000.0
    m = cnn.model(w)

    def sample(rng, k):
        return {"x": rng.integers(0, 256, (2, 3, 16, 16)).astype(np.float32)}

    return m, sample, None


MODELS = {
    "cast_f16_overflow_f32": cast_f16_overflow_f32,
    "f16_activation_growth_f32": f16_activation_growth_f32,
    "bert_overflow": bert_overflow,
    "qwen3_overflow": qwen3_overflow,
    "cnn_overflow": cnn_overflow,
}

# --- values, the AutoCast rule ----------------------------------------------------------


def all_values(m: onnx.ModelProto, feeds: dict) -> dict:
    """onnxruntime's float32 value of every node output."""
    m2 = onnx.ModelProto.FromString(m.SerializeToString())
    have = {o.name for o in m2.graph.output}
    for n in m2.graph.node:
        for o in n.output:
            if o and o not in have:
                m2.graph.output.append(helper.ValueInfoProto(name=o))
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(m2.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


def autocast_rule(m: onnx.ModelProto, calib: list) -> dict:
    """AutoCast's documented default rule with these calibration sets."""
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for n in m.graph.node:  # Constant nodes are initializers to AutoCast (folded first)
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            inits[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    mx: dict = {}
    dtypes: dict = {}
    for feeds in calib:
        for k, v in all_values(m, feeds).items():
            dtypes[k] = v.dtype
            if v.dtype.kind == "f" and v.size:
                f = np.abs(v[np.isfinite(v)])
                mx[k] = max(mx.get(k, 0.0), float(f.max()) if f.size else 0.0)
    for k, v in calib[0].items():
        dtypes[k] = v.dtype
    for k, v in inits.items():
        dtypes[k] = v.dtype

    def f32(t):
        return t in dtypes and dtypes[t] == np.float32

    kept, reasons = [], {}
    for n in m.graph.node:
        if n.op_type in ("Constant", "Shape", "Size"):
            continue
        if not any(f32(t) for t in list(n.input) + list(n.output) if t):
            continue
        label = n.name or n.output[0]
        out = max((mx.get(o, 0.0) for o in n.output if f32(o)), default=0.0)
        big = [t for t in n.input if t in inits and inits[t].dtype.kind == "f"
               and inits[t].size and float(np.abs(inits[t]).max()) > INIT_MAX]
        if out > DATA_MAX:
            kept.append(label)
            reasons[label] = f"output max |x| {out:.4g} > {DATA_MAX:g}"
        elif big:
            kept.append(label)
            reasons[label] = f"initializer {big[0]} > {INIT_MAX:g}"
    computed = {o for n in m.graph.node if n.op_type != "Constant" for o in n.output}
    biggest = max(((k, v) for k, v in mx.items() if k in computed), key=lambda kv: kv[1])
    # the first computed node (execution order) whose float32 output passes float16's range
    first = next((n.name or n.output[0] for n in m.graph.node if n.op_type != "Constant"
                  and max((mx.get(o, 0.0) for o in n.output), default=0.0) > F16_MAX), None)
    return {"data_max": DATA_MAX, "init_max": INIT_MAX, "kept": kept, "count": len(kept),
            "reasons": reasons, "largest_f32": {"tensor": biggest[0], "max_abs": biggest[1]},
            "first_overflow": first}


def write_sets(d: Path, sets: list, m: onnx.ModelProto | None) -> None:
    s = None
    if m is not None:
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for k, feeds in enumerate(sets):
        sd = d / f"{k}"
        sd.mkdir(parents=True, exist_ok=True)
        for n, v in feeds.items():
            np.save(sd / f"input_{n}.npy", v)
        if s is not None:
            for o, v in zip(s.get_outputs(), s.run(None, feeds)):
                np.save(sd / f"expected_{o.name}.npy", v)


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    for name in names:
        if name not in MODELS:
            print(f"gen_precision_models: unknown model {name} (known: {', '.join(MODELS)})",
                  file=sys.stderr)
            return 2
        m, sample, example = MODELS[name]()
        onnx.checker.check_model(m)
        d = OUT / name
        if d.exists():
            import shutil
            shutil.rmtree(d)
        d.mkdir(parents=True)
        onnx.save(m, d / "model.onnx")
        rng = np.random.default_rng(20261)
        calib = [sample(rng, k) for k in range(N_CALIB)]
        if example is not None:
            calib[0] = example
        held_rng = np.random.default_rng(99991)
        held = [sample(held_rng, k) for k in range(N_HELD)]
        write_sets(d / "calib", calib, None)
        write_sets(d / "heldout", held, m)
        rule = autocast_rule(m, calib)
        big = rule["largest_f32"]
        if big["max_abs"] <= F16_MAX:
            print(f"gen_precision_models: {name}: nothing passes 65504 (largest {big})",
                  file=sys.stderr)
            return 1
        (d / "autocast_rule.json").write_text(json.dumps(rule, indent=1) + "\n")
        meta = {"generator": "scripts/gen_precision_models.py", "largest_f32": big,
                "first_overflow": rule["first_overflow"],
                "calibration_sets": N_CALIB, "heldout_sets": N_HELD,
                "nodes": len(m.graph.node)}
        (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"gen_precision_models: {name}: {len(m.graph.node)} nodes, largest f32 |x| "
              f"{big['max_abs']:.3g} at {big['tensor']}; AutoCast rule keeps {rule['count']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
