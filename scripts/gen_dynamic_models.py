#!/usr/bin/env python3
"""Models with dynamic input dims and onnxruntime's outputs at several sizes (issue 32).

    .venv/bin/python scripts/gen_dynamic_models.py      # a few seconds; CI runs it
    .venv/bin/python scripts/gen_dynamic_models.py --bench   # only gpt2_kv_6l (not in CI)

Writes fixtures/dynamic/ (gitignored):

  bert_dyn/model.onnx          a BERT-style encoder (transformers BertModel, random weights,
                               seed 1234; hidden 32, 2 layers, 4 heads, 512 positions),
                               torch.onnx.export(dynamo=False, opset 17) with dynamic axes
                               "batch" and "sequence" on every input and output
  bert_dyn/<B>x<S>/input_<name>.npy      inputs at batch B, sequence S: (1, 7), (3, 128),
                                         (16, 512); rows of the mask end in padding
  bert_dyn/<B>x<S>/expected_<output>.npy onnxruntime's outputs (CPU provider), the reference
  bert_dyn/<B>x<S>/torch_<output>.npy    PyTorch eager's, for comparison

  nonzero_mid/model.onnx       x f32[n, m] -> Relu "relu" -> Greater 0.5 -> NonZero "nz" ->
                               Transpose -> GatherND(x) -> Sub 0.6 "shift" -> Log "log" -> y,
                               plus total = ReduceSum(relu): a value-dependent node between
                               a head and a tail; Log of values in [0.5, 0.6) makes NaN in
                               the tail (node "log")
  nonzero_mid/<n>x<m>/input_x.npy, expected_{y,total}.npy   at 4x5 and 7x3, onnxruntime's
  gpt2_kv/model.onnx           a GPT-2-style decoder (transformers GPT2LMHeadModel, random
                               weights, seed 0; 2 layers, 4 heads, 32 wide, 128 positions) with
                               past_key_values as inputs past.<layer>.{key,value} and outputs
                               present.<layer>.{key,value}; dims "seq", "total", "past"
  gpt2_kv/tokens.npy           the prompt (3 tokens) then 32 greedy tokens, onnxruntime's
  gpt2_kv/expected_logits_<step>.npy   onnxruntime's logits at step 0 (prefill, empty past)
                                       to 32, each step fed the previous step's present
  gpt2_kv_6l/model.onnx        (--bench only) the same export of a larger GPT-2 (6 layers, 8
                               heads, 512 wide, vocab 8000, 256 positions; 27M parameters,
                               109 MB): what planning a new past length costs at a size where
                               a decode step takes milliseconds (bench/RESULTS.md); no outputs
  cut_names/model.onnx         NonZero "nz" with output "a" and a second input y whose dim is
                               named "a.1" (the cut's own name for the output's axis 1: the
                               invented symbols must not collide); input_{x,y}.npy, expected_s.npy
  ssdlite/model.onnx           torchvision's SSDlite320-MobileNetV3 detector (random weights,
                               seed 0, He-initialized convs so features and scores differ,
                               5 classes), torch.onnx.export(dynamo=False, opset 17): its graph
                               has NonZero, TopK with a run-time K, GatherND and an If
  ssdlite/input_image.npy      one 3x320x320 image (uniform random)
  ssdlite/expected_{boxes,scores,labels}.npy   onnxruntime's detections, the reference
  cnn_dyn/model.onnx           a small CNN (random weights, seed 0): conv 3x3/2 + BatchNorm +
                               ReLU, MaxPool 3x3/2, a residual block, a depthwise conv, a
                               channel Concat, AvgPool 2x2, GlobalAveragePool, Flatten, Linear;
                               torch.onnx.export(dynamo=False, opset 17) with dynamic axes
                               "batch", "height", "width" on the image (the symbolic import's
                               Conv/Pool/BatchNorm rules); expected_<B>x<H>x<W>.npy and
                               input_<B>x<H>x<W>.npy at (1, 32, 32), (2, 45, 61), (4, 64, 40)

The script asserts that onnxruntime and PyTorch agree at every size (max abs < 1e-4), so the
export's dynamic axes are real.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "dynamic"
SIZES = [(1, 7), (3, 128), (16, 512)]
torch.set_num_threads(1)


def bert_dyn() -> None:
    torch.manual_seed(1234)
    cfg = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=512, type_vocab_size=2,
        attn_implementation="eager",
    )
    model = transformers.BertModel(cfg).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    outs = ["last_hidden_state", "pooler_output"]

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids)
            return o.last_hidden_state, o.pooler_output

    w = Wrapper(model).eval()

    def inputs(b: int, s: int, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 100, (b, s), generator=g)
        mask = torch.ones(b, s, dtype=torch.int64)
        for r in range(b):  # row r keeps its first s - r*s//(2b) positions
            keep = s - (r * s) // (2 * b)
            mask[r, keep:] = 0
        types = torch.zeros(b, s, dtype=torch.int64)
        types[:, s // 2:] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    d = OUT / "bert_dyn"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.onnx"
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    axes["pooler_output"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(w, tuple(inputs(2, 16, 0).values()), str(path), input_names=names,
                          output_names=outs, dynamic_axes=axes, opset_version=17,
                          do_constant_folding=True, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for k, (b, s) in enumerate(SIZES):
        feeds = inputs(b, s, 100 + k)
        cd = d / f"{b}x{s}"
        cd.mkdir(exist_ok=True)
        got = sess.run(None, {n: t.numpy() for n, t in feeds.items()})
        with torch.no_grad():
            ref = w(*feeds.values())
        for n, t in feeds.items():
            np.save(cd / f"input_{n}.npy", t.numpy())
        for n, o, r in zip(outs, got, ref):
            worst = float(np.abs(o - r.numpy()).max())
            assert worst < 1e-4, f"bert_dyn {b}x{s} {n}: onnxruntime vs torch differ by {worst}"
            np.save(cd / f"expected_{n}.npy", o)
            np.save(cd / f"torch_{n}.npy", r.numpy())
    print(f"wrote {d} ({', '.join(f'{b}x{s}' for b, s in SIZES)})")


def nonzero_mid() -> None:
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Greater", ["r", "half"], ["mask"], name="mask"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nz"),
        helper.make_node("Transpose", ["idx"], ["idxT"], name="to_rows", perm=[1, 0]),
        helper.make_node("GatherND", ["x", "idxT"], ["g"], name="pick"),
        helper.make_node("Sub", ["g", "shift_by"], ["gs"], name="shift"),
        helper.make_node("Log", ["gs"], ["y"], name="log"),
        helper.make_node("ReduceSum", ["r"], ["total"], name="total", keepdims=0),
    ]
    inits = [helper.make_tensor("half", f, [], [0.5]), helper.make_tensor("shift_by", f, [], [0.6])]
    g = helper.make_graph(nodes, "nonzero_mid",
                          [helper.make_tensor_value_info("x", f, ["n", "m"])],
                          [helper.make_tensor_value_info("y", f, ["k"]),
                           helper.make_tensor_value_info("total", f, [])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    d = OUT / "nonzero_mid"
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "model.onnx"))
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for n, m in [(4, 5), (7, 3)]:
        x = rng.uniform(-1.0, 1.0, (n, m)).astype(np.float32)
        x[0, 0] = 0.55  # picked (> 0.5), then log(0.55 - 0.6): NaN
        y, total = sess.run(None, {"x": x})
        cd = d / f"{n}x{m}"
        cd.mkdir(exist_ok=True)
        np.save(cd / "input_x.npy", x)
        np.save(cd / "expected_y.npy", y)
        np.save(cd / "expected_total.npy", total)
    print(f"wrote {d}")


def cut_names() -> None:
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["a"], name="nz"),
         helper.make_node("Cast", ["a"], ["af"], to=f, name="c"),
         helper.make_node("ReduceSum", ["af"], ["s1"], keepdims=0, name="rs1"),
         helper.make_node("ReduceSum", ["y"], ["s2"], keepdims=0, name="rs2"),
         helper.make_node("Add", ["s1", "s2"], ["s"], name="add")],
        "cut_names", [vi("x", f, ["n", "m"]), vi("y", f, ["a.1"])], [vi("s", f, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = OUT / "cut_names"
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "model.onnx"))
    x = np.array([[1, 0, 2], [0, 3, 0]], np.float32)
    y = np.ones(7, np.float32)
    (s,) = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "y": y})
    np.save(d / "input_x.npy", x)
    np.save(d / "input_y.npy", y)
    np.save(d / "expected_s.npy", s)
    print(f"wrote {d}")


def export_gpt2_kv(m, layers: int, heads: int, hd: int, path: Path) -> list[str]:
    """Export GPT2LMHeadModel `m` as one decode step with past_key_values as inputs
    past.<layer>.{key,value} and outputs present.<layer>.{key,value} (dims "seq", "total",
    "past"); returns the KV names `<layer>.{key,value}`."""
    from transformers.cache_utils import DynamicCache

    class Step(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       past_key_values=cache, use_cache=True)
            outs = [o.logits]
            for layer in o.past_key_values.layers:
                outs += [layer.keys, layer.values]
            return tuple(outs)

    kv = [f"{i}.{n}" for i in range(layers) for n in ("key", "value")]
    names_in = ["input_ids", "attention_mask"] + [f"past.{x}" for x in kv]
    names_out = ["logits"] + [f"present.{x}" for x in kv]
    axes = {"input_ids": {1: "seq"}, "attention_mask": {1: "total"}, "logits": {1: "seq"}}
    axes.update({f"past.{x}": {2: "past"} for x in kv})
    axes.update({f"present.{x}": {2: "total"} for x in kv})
    ex = (torch.tensor([[5]]), torch.ones(1, 4, dtype=torch.int64),
          *[torch.zeros(1, heads, 3, hd) for _ in kv])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(m).eval(), ex, str(path), input_names=names_in,
                          output_names=names_out, dynamic_axes=axes, opset_version=17,
                          dynamo=False)
    return kv


def gpt2_kv() -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=128, n_embd=32, n_layer=2,
                                  n_head=4, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    m = transformers.GPT2LMHeadModel(cfg).eval()
    layers, heads, hd = 2, 4, 8
    d = OUT / "gpt2_kv"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.onnx"
    kv = export_gpt2_kv(m, layers, heads, hd, path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tokens = [1, 2, 3]
    past = {f"past.{x}": np.zeros((1, heads, 0, hd), np.float32) for x in kv}
    ids = np.array([tokens], np.int64)
    for step in range(33):
        total = len(tokens) if step == 0 else len(tokens)
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
        out = sess.run(None, feeds)
        np.save(d / f"expected_logits_{step}.npy", out[0])
        past = {f"past.{x}": o for x, o in zip(kv, out[1:])}
        nxt = int(out[0][0, -1].argmax())
        if step < 32:
            tokens.append(nxt)
        ids = np.array([[nxt]], np.int64)
    with torch.no_grad():  # the decode loop agrees with transformers' own forward
        full = m(input_ids=torch.tensor([tokens[:-1]])).logits.numpy()
    last = np.load(d / "expected_logits_31.npy")[0, -1]
    assert np.abs(full[0, -1] - last).max() < 1e-4, "the KV-cache export disagrees with transformers"
    np.save(d / "tokens.npy", np.array(tokens, np.int64))
    print(f"wrote {d} (33 steps)")


def gpt2_kv_6l() -> None:
    """A larger gpt2_kv export for timing (no reference outputs)."""
    torch.manual_seed(0)
    layers, heads, emb = 6, 8, 512
    cfg = transformers.GPT2Config(vocab_size=8000, n_positions=256, n_embd=emb, n_layer=layers,
                                  n_head=heads, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    m = transformers.GPT2LMHeadModel(cfg).eval()
    d = OUT / "gpt2_kv_6l"
    d.mkdir(parents=True, exist_ok=True)
    export_gpt2_kv(m, layers, heads, emb // heads, d / "model.onnx")
    print(f"wrote {d}")


def ssdlite() -> None:
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5).eval()
    with torch.no_grad():  # torchvision's init (std 0.03) makes the features vanish: He init
        for mod in m.modules():
            if isinstance(mod, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
                if mod.groups > 1:
                    mod.weight.mul_(0.7)
    x = torch.rand(3, 320, 320, generator=torch.Generator().manual_seed(1))
    d = OUT / "ssdlite"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, ([x],), str(path), opset_version=17, input_names=["image"],
                          output_names=["boxes", "scores", "labels"], dynamo=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    boxes, scores, labels = sess.run(None, {"image": x.numpy()})
    assert len(scores) > 10 and np.unique(scores).size > len(scores) // 2, "scores must differ"
    np.save(d / "input_image.npy", x.numpy())
    for n, v in [("boxes", boxes), ("scores", scores), ("labels", labels)]:
        np.save(d / f"expected_{n}.npy", v)
    print(f"wrote {d} ({len(scores)} detections)")


def cnn_dyn() -> None:
    nn = torch.nn
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            self.res = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU(), nn.Conv2d(8, 8, 1))
            self.dw = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
            self.pool = nn.AvgPool2d(2, 2)
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            y = self.stem(x)
            y = torch.relu(y + self.res(y))
            y = torch.cat([y, self.dw(y)], 1)
            y = self.pool(y)
            y = torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)
            return self.fc(y)

    m = Net().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        bn = m.stem[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    d = OUT / "cnn_dyn"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.onnx"
    x0 = torch.rand(1, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x0,), str(path), opset_version=17, input_names=["image"],
                          output_names=["logits"], dynamo=False,
                          dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"},
                                        "logits": {0: "batch"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(2)
    for b, h, w in [(1, 32, 32), (2, 45, 61), (4, 64, 40)]:
        x = torch.rand(b, 3, h, w, generator=g)
        (y,) = sess.run(None, {"image": x.numpy()})
        with torch.no_grad():
            t = m(x).numpy()
        assert np.abs(y - t).max() < 1e-4, "onnxruntime and PyTorch disagree"
        np.save(d / f"input_{b}x{h}x{w}.npy", x.numpy())
        np.save(d / f"expected_{b}x{h}x{w}.npy", y)
    print(f"wrote {d}")


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        gpt2_kv_6l()
        sys.exit(0)
    bert_dyn()
    nonzero_mid()
    cut_names()
    gpt2_kv()
    ssdlite()
    cnn_dyn()
