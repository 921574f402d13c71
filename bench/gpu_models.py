"""The GPU benchmark's models and PyTorch's times (run on the GPU machine by bench/gpu.sh).

For each model: build it with random weights (seed 0) at the benchmark's shape, write
`DIR/<name>/model.pt2` (torch.export.save: what `rlx bench` reads) and one `input_<name>.npy`
per graph input, then time PyTorch on the same inputs: eager f32 (TF32 off), eager bf16
and, with --compile, torch.compile of both. Times are CUDA-event medians in ms, written to
DIR/torch.json as {model: {"eager_f32": ms, "eager_bf16": ms, "compile_f32": ms, ...}}.

Models (issue 30 item 7):
  resnet50   torchvision ResNet-50, batch 32, 3x224x224
  bert_base  transformers BertModel with BertConfig() (BERT-base), batch 8 x 128 tokens
  qwen3_0_6b transformers Qwen3ForCausalLM at Qwen3-0.6B's dims (28 layers, hidden 1024,
             16 heads / 8 KV heads, head_dim 128, MLP 3072, vocab 151936), prefill 1 x 512

A name with the suffix `_bf16` (`bert_base_bf16`) exports the same model with bfloat16
weights and activations (an f32 image input is cast to bfloat16 inside the program; token ids
stay int64) for RLX's bfloat16 path; it is not timed here (torch's eager_bf16 of the base
model is its peer).

Usage: python3 bench/gpu_models.py DIR [--models a,b] [--compile] [--runs N]
"""
import argparse
import json
import os
import time

import numpy as np
import torch


def build(name):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision
        m = torchvision.models.resnet50()
        return m, (torch.randn(32, 3, 224, 224, generator=g),), {}
    import transformers as tf
    if name == "bert_base":
        cfg = tf.BertConfig()
        m = tf.BertModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (8, 128), generator=g)
        return m, (ids,), {"attention_mask": torch.ones(8, 128, dtype=torch.long)}
    if name == "qwen3_0_6b":
        cfg = tf.Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=4096, tie_word_embeddings=True, use_cache=False)
        m = tf.Qwen3ForCausalLM(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, 512), generator=g)
        return m, (ids,), {"use_cache": False}
    raise SystemExit(f"unknown model {name}")


class CastInput(torch.nn.Module):
    """Runs `m` on its float32 input cast to bfloat16 (NumPy has no bfloat16 for the .npy)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x.to(torch.bfloat16))


def export(name, m, args, kwargs, d):
    os.makedirs(d, exist_ok=True)
    with torch.no_grad():
        ep = torch.export.export(m, args, kwargs, strict=False)
    torch.export.save(ep, os.path.join(d, "model.pt2"))
    from torch.export.graph_signature import InputKind, TensorArgument
    flat = list(args) + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    names = [s.arg.name for s in ep.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT and isinstance(s.arg, TensorArgument)]
    for n, t in zip(names, flat):
        np.save(os.path.join(d, f"input_{n}.npy"), t.numpy())
    return names


def time_cuda(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--models", default="resnet50,bert_base,qwen3_0_6b")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (minutes)")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    for name in a.models.split(","):
        t0 = time.time()
        if name.endswith("_bf16"):
            m, args, kwargs = build(name[: -len("_bf16")])
            m = m.eval().to(torch.bfloat16)
            if name.startswith("resnet50"):
                m = CastInput(m)
            names = export(name, m, args, kwargs, os.path.join(a.dir, name))
            print(f"{name}: exported bfloat16 ({', '.join(names)}) in {time.time() - t0:.1f} s", flush=True)
            continue
        m, args, kwargs = build(name)
        m = m.eval()
        names = export(name, m, args, kwargs, os.path.join(a.dir, name))
        print(f"{name}: exported ({', '.join(names)}) in {time.time() - t0:.1f} s", flush=True)
        r = {}
        if torch.cuda.is_available():
            dev = torch.device("cuda")
            for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
                md = m.to(dev, dt)
                a_ = tuple(x.to(dev) for x in args)
                kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
                if tag == "bf16" and name == "resnet50":
                    a_ = (a_[0].to(dt),)
                with torch.inference_mode():
                    r[f"eager_{tag}"] = time_cuda(lambda: md(*a_, **kw), a.runs)
                    if a.compile:
                        # Module.to() works in place, so md is the f32 module of the loop
                        # before: without a reset, dynamo reuses the f32 graph's guards.
                        torch._dynamo.reset()
                        mc = torch.compile(md)
                        r[f"compile_{tag}"] = time_cuda(lambda: mc(*a_, **kw), a.runs, warmup=5)
                print(f"{name} {tag}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in r.items() if k.endswith(tag)), flush=True)
            m.to("cpu", torch.float32)
            torch.cuda.empty_cache()
        out[name] = r
    path = os.path.join(a.dir, "torch.json")
    if os.path.exists(path):  # keep the times of models not run now
        with open(path) as f:
            old = json.load(f)
        old.update({k: v for k, v in out.items() if v})
        out = old
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
