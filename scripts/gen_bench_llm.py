#!/usr/bin/env python3
"""A Qwen3-0.6B-sized checkpoint with random weights, for the LLM speed benchmark
(bench/llm.py, issue 31's table in bench/RESULTS.md).

Writes bench/models/qwen3-0.6b/ (git-ignored):

* config.json, generation_config.json, model.safetensors: transformers' Qwen3ForCausalLM at
  Qwen3-0.6B's dims (28 layers, hidden 1024, intermediate 3072, 16 query heads, 8 KV heads,
  head_dim 128, vocab 151936, tied embeddings), weights drawn at unit activation scale
  (scripts/gen_tiny_llms.py's `reinit`), saved in bfloat16 (about 1.2 GB);
* tokenizer.json: the small byte-level BPE of scripts/gen_tiny_llms.py (ids past its vocab
  decode to nothing; the benchmark compares token ids and speeds, not text);
* prompt.txt: a generated English-like text of exactly 512 tokens under tokenizer.json.

    .venv/bin/python scripts/gen_bench_llm.py [--out DIR] [--prompt-tokens 512]

Needs torch, transformers, tokenizers (scripts/setup-venv.sh --torch). About 30 s.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from gen_tiny_llms import corpus, reinit, save_common, train_tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "models", "qwen3-0.6b"))
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=28, help="28 as Qwen3-0.6B; fewer for a quick run")
    a = ap.parse_args()
    if a.layers < 1 or a.prompt_tokens < 1:
        raise SystemExit("--layers and --prompt-tokens must be at least 1")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = train_tokenizer()
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=a.layers, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(cfg)
    reinit(model, seed=0, emb=0.05)
    save_common(model, tok, a.out, torch.bfloat16)
    text = " ".join(corpus(seed=7, n=400))
    ids = tok.encode(text).ids
    if len(ids) < a.prompt_tokens:
        raise SystemExit(f"generated text has only {len(ids)} tokens")
    prompt = tok.decode(ids[: a.prompt_tokens])
    n = len(tok.encode(prompt).ids)
    # Decoding and re-encoding can merge at the cut: trim until the count is exact.
    k = a.prompt_tokens
    while n != a.prompt_tokens and k > 0:
        k -= 1
        prompt = tok.decode(ids[:k])
        n = len(tok.encode(prompt).ids)
    with open(os.path.join(a.out, "prompt.txt"), "w") as f:
        f.write(prompt)
    print(f"wrote {a.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"prompt of {n} tokens)")


if __name__ == "__main__":
    main()
