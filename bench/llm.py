#!/usr/bin/env python3
"""LLM generation speed on the CPU: RLX (`rlx generate`) against transformers and llama.cpp
on the same checkpoint, in the same run (issue 31's table in bench/RESULTS.md).

    .venv/bin/python scripts/gen_bench_llm.py          # bench/models/qwen3-0.6b (once)
    .venv/bin/pip install llama-cpp-python             # builds llama.cpp (~10 min, once)
    cargo build --release --bin rlx
    .venv/bin/python bench/llm.py [--threads 1,2] [--dtypes f32,bf16] [--runs 3]

For every dtype and thread count, each engine prefills the same 512 prompt token ids
(prompt.txt under tokenizer.json) and then decodes 128 tokens greedily (end-of-sequence
ignored), `--runs` times; the medians are reported:

* prefill tokens/s = prompt tokens / time of the prompt's forward pass;
* decode tokens/s = decode steps / their time (a generation of N new tokens has N - 1
  decode steps: the first new token comes from the prefill).

Engines, each in its own process with its thread count set:
* rlx: `target/release/rlx` (or $RLX_BIN) `generate --threads T --dtype D --json` (its own timers; a fresh
  process per run, so its load time and peak RSS are measured too);
* transformers: AutoModelForCausalLM (on the GPU with --device cuda, timed with
  torch.cuda.synchronize around each phase) in the dtype, `torch.set_num_threads(T)`, one forward
  over the prompt with a cache, then one forward per token (argmax);
* llama.cpp: llama-cpp-python's `Llama.eval` on a GGUF that llama.cpp's own converter
  (`convert_hf_to_gguf.py`, via bench/llm_gguf.py) made from the same checkpoint in the
  same dtype (bench/models/<name>-<dtype>.gguf, made on first use), n_threads = T.

Writes bench/out/llm.json (every run) and prints a Markdown table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LCPP_SRC = "llama_cpp_python-0.3.36"


def prompt_ids(model_dir, n):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "prompt.txt")) as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids
    if len(ids) < n:
        raise SystemExit(f"prompt.txt has {len(ids)} tokens, fewer than --prompt-tokens {n}")
    return ids[:n]


# ---------------------------------------------------------------- workers (one process each)

def worker_transformers(a, ids):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    dev = a.device
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dt).to(dev).eval()
    x = torch.tensor([ids], device=dev)

    def now():
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    out = []
    with torch.inference_mode():
        model(x[:, :16], use_cache=True)  # warm-up (oneDNN primitive creation, CUDA init)
        for _ in range(a.runs):
            t0 = now()
            o = model(x, use_cache=True)
            t1 = now()
            past, tok = o.past_key_values, o.logits[0, -1].argmax()
            gen = [int(tok)]
            t2 = now()
            for _ in range(a.new_tokens - 1):
                o = model(tok.view(1, 1), past_key_values=past, use_cache=True)
                past, tok = o.past_key_values, o.logits[0, -1].argmax()
                gen.append(int(tok))
            t3 = now()
            out.append({"prefill_tokens_per_s": len(ids) / (t1 - t0),
                        "decode_tokens_per_s": (a.new_tokens - 1) / (t3 - t2),
                        "generated_ids": gen})
    return out


def worker_llamacpp(a, ids):
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=a.gguf, n_ctx=len(ids) + a.new_tokens + 16, n_threads=a.threads,
                n_threads_batch=a.threads, n_batch=len(ids), n_ubatch=len(ids),
                verbose=False)
    nv = llm.n_vocab()

    def last_logits(m):
        # llama-cpp-python keeps logits only with logits_all; read the context's last row.
        return np.ctypeslib.as_array(m._ctx.get_logits(), shape=(nv,))

    out = []
    llm.eval(ids[:16])  # warm-up
    for _ in range(a.runs):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = int(np.argmax(last_logits(llm)))
        gen = [tok]
        t2 = time.perf_counter()
        for _ in range(a.new_tokens - 1):
            llm.eval([tok])
            tok = int(np.argmax(last_logits(llm)))
            gen.append(tok)
        t3 = time.perf_counter()
        out.append({"prefill_tokens_per_s": len(ids) / (t1 - t0),
                    "decode_tokens_per_s": (a.new_tokens - 1) / (t3 - t2),
                    "generated_ids": gen})
    return out


# ---------------------------------------------------------------- driver

def run_rlx(a, dtype, threads, prompt_text, n_prompt):
    rlx = os.environ.get("RLX_BIN") or os.path.join(ROOT, "target", "release", "rlx")
    if not os.path.exists(rlx):
        raise SystemExit(f"{rlx} missing: cargo build --release --bin rlx")
    out = []
    js = os.path.join(os.path.dirname(os.path.abspath(a.out)), "llm_rlx_run.json")
    for _ in range(a.runs):
        cmd = [rlx, "generate", "--model", a.model, "--prompt", prompt_text,
               "--max-new-tokens", str(a.new_tokens), "--ignore-eos", "--threads",
               str(threads), "--dtype", dtype, "--device", a.device, "--json", js]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        err = p.stderr.read().decode()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"rlx failed: {' '.join(cmd[:3])} ...\n{err}")
        with open(js) as f:
            r = json.load(f)
        if len(r["prompt_ids"]) != n_prompt:
            raise SystemExit(f"rlx tokenized the prompt to {len(r['prompt_ids'])} ids, not {n_prompt}")
        out.append({"prefill_tokens_per_s": r["prefill_tokens_per_s"],
                    "decode_tokens_per_s": r["decode_tokens_per_s"],
                    "load_s": r.get("load_s"), "wall_s": wall,
                    "max_rss_mb": ru.ru_maxrss / 1024, "generated_ids": r["generated_ids"]})
    return out


def gguf_for(a, dtype):
    name = os.path.basename(os.path.normpath(a.model))
    path = os.path.join(os.path.dirname(os.path.normpath(a.model)), f"{name}-{dtype}.gguf")
    if not os.path.exists(path):
        lcpp = os.path.join(HERE, ".tools", LCPP_SRC, "vendor", "llama.cpp")
        if not os.path.isdir(lcpp):
            raise SystemExit(
                f"{lcpp} missing: extract llama-cpp-python's sdist there (pip download "
                f"llama-cpp-python==0.3.36 --no-deps --no-binary :all:, then tar xzf)")
        print(f"converting {a.model} to {path} with llama.cpp's converter ...", flush=True)
        subprocess.check_call([sys.executable, os.path.join(HERE, "llm_gguf.py"), lcpp, a.model,
                               "--outtype", dtype, "--outfile", path],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def run_worker(a, engine, dtype, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--model", a.model,
           "--dtype", dtype, "--threads", str(threads), "--runs", str(a.runs), "--device", a.device,
           "--prompt-tokens", str(a.prompt_tokens), "--new-tokens", str(a.new_tokens)]
    if engine == "llama.cpp":
        cmd += ["--gguf", gguf_for(a, dtype)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{engine} {dtype} x{threads} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def med(rs, key):
    v = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(v) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--model", default=os.path.join(ROOT, "bench", "models", "qwen3-0.6b"),
                    help="checkpoint folder with prompt.txt (default: %(default)s)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (%(default)s)")
    ap.add_argument("--dtypes", default="f32,bf16", help="comma-separated: f32, bf16, f16 (%(default)s)")
    ap.add_argument("--engines", default="rlx,transformers,llama.cpp",
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell; medians reported (%(default)s)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: RLX and transformers on the GPU (threads only set the host side)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "llm.json"),
                    help="JSON of every run (default: %(default)s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.model = os.path.abspath(a.model)
    for e in a.engines.split(","):
        if e not in ("rlx", "transformers", "llama.cpp"):
            raise SystemExit(f"--engines {e}: unknown (known: rlx, transformers, llama.cpp)")
    for d in a.dtypes.split(","):
        if d not in ("f32", "bf16", "f16"):
            raise SystemExit(f"--dtypes {d}: unknown (known: f32, bf16, f16)")
    if not os.path.isdir(a.model):
        raise SystemExit(f"{a.model} missing: .venv/bin/python scripts/gen_bench_llm.py")
    ids = prompt_ids(a.model, a.prompt_tokens)
    if a.worker:
        a.threads = int(a.threads)
        fn = {"transformers": worker_transformers, "llama.cpp": worker_llamacpp}[a.worker]
        print(json.dumps(fn(a, ids)))
        return
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json")).decode(ids)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    rows = []
    for dtype in a.dtypes.split(","):
        for threads in [int(t) for t in a.threads.split(",")]:
            for engine in a.engines.split(","):
                print(f"{engine} {dtype} x{threads} ...", file=sys.stderr, flush=True)
                if engine == "rlx":
                    rs = run_rlx(a, dtype, threads, text, len(ids))
                else:
                    rs = run_worker(a, engine, dtype, threads)
                row = {"engine": engine, "dtype": dtype, "threads": threads, "runs": rs,
                       "prefill_tokens_per_s": med(rs, "prefill_tokens_per_s"),
                       "decode_tokens_per_s": med(rs, "decode_tokens_per_s"),
                       "load_s": med(rs, "load_s"), "max_rss_mb": med(rs, "max_rss_mb")}
                rows.append(row)
                print(f"  prefill {row['prefill_tokens_per_s']:.1f} tok/s, decode "
                      f"{row['decode_tokens_per_s']:.2f} tok/s", file=sys.stderr, flush=True)
                with open(a.out, "w") as f:
                    json.dump({"model": a.model, "prompt_tokens": len(ids),
                               "new_tokens": a.new_tokens, "rows": rows}, f, indent=1)
    print(f"\nprompt {len(ids)} tokens, {a.new_tokens} new tokens, median of {a.runs} runs "
          f"(tokens/s; ratio = RLX / best peer, higher is better)\n")
    print("| dtype | threads | engine | prefill | decode | RLX load s | RLX max RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ld = f"{r['load_s']:.2f}" if r["load_s"] is not None else ""
        rss = f"{r['max_rss_mb']:.0f}" if r["max_rss_mb"] is not None else ""
        print(f"| {r['dtype']} | {r['threads']} | {r['engine']} | {r['prefill_tokens_per_s']:.1f} "
              f"| {r['decode_tokens_per_s']:.2f} | {ld} | {rss} |")
    for dtype in a.dtypes.split(","):
        for threads in [int(t) for t in a.threads.split(",")]:
            sel = {r["engine"]: r for r in rows if r["dtype"] == dtype and r["threads"] == threads}
            if "rlx" not in sel or len(sel) < 2:
                continue
            peers = [r for e, r in sel.items() if e != "rlx"]
            bp = max(p["prefill_tokens_per_s"] for p in peers)
            line = (f"{dtype} x{threads}: prefill RLX/best peer "
                    f"{sel['rlx']['prefill_tokens_per_s'] / bp:.2f}")
            if "llama.cpp" in sel:
                ratio = (sel["rlx"]["decode_tokens_per_s"]
                         / sel["llama.cpp"]["decode_tokens_per_s"])
                line += f", decode RLX/llama.cpp {ratio:.2f}"
            print(line)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
