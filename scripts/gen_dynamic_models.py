#!/usr/bin/env python3
"""Models with dynamic input dims and onnxruntime's outputs at several sizes (issue 32).

    .venv/bin/python scripts/gen_dynamic_models.py      # a few seconds; CI runs it

Writes fixtures/dynamic/ (gitignored):

  bert_dyn/model.onnx          a BERT-style encoder (transformers BertModel, random weights,
                               seed 1234; hidden 32, 2 layers, 4 heads, 512 positions),
                               torch.onnx.export(dynamo=False, opset 17) with dynamic axes
                               "batch" and "sequence" on every input and output
  bert_dyn/<B>x<S>/input_<name>.npy      inputs at batch B, sequence S: (1, 7), (3, 128),
                                         (16, 512); rows of the mask end in padding
  bert_dyn/<B>x<S>/expected_<output>.npy onnxruntime's outputs (CPU provider), the reference
  bert_dyn/<B>x<S>/torch_<output>.npy    PyTorch eager's, for comparison

The script asserts that onnxruntime and PyTorch agree at every size (max abs < 1e-4), so the
export's dynamic axes are real.
"""

from __future__ import annotations

import os
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


if __name__ == "__main__":
    bert_dyn()
