#!/usr/bin/env python3
"""Lay out the benchmark models of bench/ (issue 6) in bench/models/<name>/.

    .venv/bin/python scripts/gen_bench_models.py [--out DIR] [--list] [NAME ...]

Each folder holds model.onnx, one input_<graph input>.npy per graph input (what every runtime
is fed) and meta.json (source, input shapes). Existing folders are kept (delete one to
regenerate it). Models (all names by default):

  name          source                                                        needs
  resnet50      onnx package model-zoo light model light_resnet50.onnx         onnx
  squeezenet    onnx package model-zoo light model light_squeezenet.onnx       onnx
  bert          fixtures/transformers/bert_tiny (BertModel, 2 layers, hidden   -
                64, 4 heads, batch 2 x 16 tokens; committed)
  qwen3         fixtures/transformers/qwen3_tiny (Qwen3ForCausalLM, 2 layers,  numpy
                hidden 64; dynamic axes) fed 1 x 128 tokens
  resnet18      torchvision resnet18(weights=None), 1x3x224x224                torch+torchvision
  mobilenet_v2  torchvision mobilenet_v2(weights=None), 1x3x224x224            torch+torchvision
  efficientnet_b0 torchvision efficientnet_b0(weights=None), 1x3x224x224       torch+torchvision
  gpt2          transformers GPT2LMHeadModel, 2 layers, n_embd 64, 4 heads,    torch+transformers
                vocab 1000, 1 x 16 tokens (logits)
  minilm        fixtures/large/minilm_l6 (all-MiniLM-L6-v2, 3 x 128 tokens;    torch (gen_transformers.py)
                made by scripts/gen_transformers.py minilm when missing)

The light models' input is the onnx backend runner's dummy input (see gen_light_models.py).
torch exports: torch.onnx.export(dynamo=False, opset_version=17, do_constant_folding=True),
static shapes, random init after torch.manual_seed(1234). `--list` prints which names need
torch (bench/run.sh uses it to decide on `scripts/setup-venv.sh --torch`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OPSET = 17
SEED = 1234

NEEDS_TORCH = {"resnet18", "mobilenet_v2", "efficientnet_b0", "gpt2", "minilm"}
ALL = ["bert", "gpt2", "qwen3", "minilm", "squeezenet", "mobilenet_v2", "efficientnet_b0",
       "resnet18", "resnet50"]


def sanitize(name: str) -> str:
    """File-name form of a graph input name, as `rlx run` reads input_<name>.npy."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in name)


def write_meta(out: Path, **kw) -> None:
    inputs = {p.name[len("input_"):-len(".npy")]: list(np.load(p).shape)
              for p in sorted(out.glob("input_*.npy"))}
    kw["inputs"] = inputs
    kw["generator"] = "scripts/gen_bench_models.py"
    (out / "meta.json").write_text(json.dumps(kw, indent=2) + "\n")


def light(name: str, out: Path) -> None:
    import onnx

    sys.path.insert(0, str(ROOT / "scripts"))
    from gen_light_models import LIGHT_DIR, dummy_input  # the onnx runner's dummy input

    src = LIGHT_DIR / f"light_{name}.onnx"
    if not src.is_file():
        raise SystemExit(f"gen_bench_models: {src} missing (onnx package without light models?)")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out / "model.onnx")
    m = onnx.load(str(src), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    for x in m.graph.input:
        if x.name not in inits:
            np.save(out / f"input_{sanitize(x.name)}.npy", dummy_input(x))
    write_meta(out, source=f"onnx {onnx.__version__} package: backend/test/data/light/{src.name}")


def copy_fixture(src: Path, out: Path, note: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "model.onnx", out / "model.onnx")
    for p in src.glob("input_*.npy"):
        shutil.copyfile(p, out / p.name)
    write_meta(out, source=str(src.relative_to(ROOT)), notes=note)


def bert(out: Path) -> None:
    copy_fixture(ROOT / "fixtures/transformers/bert_tiny", out,
                 "BertModel 2 layers, hidden 64, 4 heads; batch 2 x 16 tokens (fixture inputs)")


def qwen3(out: Path) -> None:
    src = ROOT / "fixtures/transformers/qwen3_tiny"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "model.onnx", out / "model.onnx")
    rng = np.random.default_rng(SEED)
    np.save(out / "input_input_ids.npy", rng.integers(0, 1000, size=(1, 128), dtype=np.int64))
    np.save(out / "input_attention_mask.npy", np.ones((1, 128), dtype=np.int64))
    write_meta(out, source=str(src.relative_to(ROOT)),
               notes="Qwen3ForCausalLM 2 layers, hidden 64, 4 q / 2 kv heads, vocab 1000; 1 x 128 tokens")


def minilm(out: Path) -> None:
    src = ROOT / "fixtures/large/minilm_l6"
    if not (src / "model.onnx").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts/gen_transformers.py"), "minilm"], check=True)
    copy_fixture(src, out, "all-MiniLM-L6-v2 (real weights) + mean pooling; 3 sentences x 128 tokens")


def _torch_export(module, args: tuple, input_names: list[str], output_names: list[str],
                  out: Path, notes: str) -> None:
    import onnx
    import torch

    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(out / "model.onnx"), input_names=input_names,
                          output_names=output_names, opset_version=OPSET, do_constant_folding=True,
                          dynamo=False)
    onnx.checker.check_model(onnx.load(str(out / "model.onnx")))
    for n, a in zip(input_names, args):
        np.save(out / f"input_{sanitize(n)}.npy", a.numpy())
    write_meta(out, source=f"torch {torch.__version__}", export=f"torch.onnx.export(dynamo=False, "
               f"opset_version={OPSET}, do_constant_folding=True)", notes=notes)


def vision(name: str, out: Path) -> None:
    import torch
    import torchvision

    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.rand((1, 3, 224, 224), generator=torch.Generator().manual_seed(SEED + 3))
    _torch_export(model, (x,), ["input"], ["logits"], out,
                  f"torchvision {torchvision.__version__} {name}(weights=None), random init; "
                  "input 1x3x224x224 uniform [0,1)")


def gpt2(out: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    g = torch.Generator().manual_seed(SEED + 5)
    ids = torch.randint(0, 1000, (1, 16), generator=g)
    mask = torch.ones(1, 16, dtype=torch.long)
    _torch_export(Logits(model), (ids, mask), ["input_ids", "attention_mask"], ["logits"], out,
                  "GPT2LMHeadModel 2 layers, n_embd 64, 4 heads, vocab 1000, eager attention, "
                  "use_cache=False; 1 x 16 tokens")


MAKERS = {
    "resnet50": lambda o: light("resnet50", o),
    "squeezenet": lambda o: light("squeezenet", o),
    "bert": bert,
    "qwen3": qwen3,
    "minilm": minilm,
    "resnet18": lambda o: vision("resnet18", o),
    "mobilenet_v2": lambda o: vision("mobilenet_v2", o),
    "efficientnet_b0": lambda o: vision("efficientnet_b0", o),
    "gpt2": gpt2,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "models")
    ap.add_argument("--list", action="store_true", help="print 'name needs-torch(0/1)' and exit")
    a = ap.parse_args()
    names = a.names or ALL
    for n in names:
        if n not in MAKERS:
            print(f"gen_bench_models: unknown model {n!r} (known: {', '.join(ALL)})", file=sys.stderr)
            return 2
    if a.list:
        for n in names:
            print(n, int(n in NEEDS_TORCH))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for n in names:
        out = a.out / n
        if (out / "model.onnx").is_file() and (out / "meta.json").is_file():
            print(f"{n:<16} kept      {out}")
            continue
        if n in NEEDS_TORCH:
            import torch

            torch.set_num_threads(1)
        MAKERS[n](out)
        size = (out / "model.onnx").stat().st_size
        print(f"{n:<16} generated {out} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
