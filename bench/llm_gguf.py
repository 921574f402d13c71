#!/usr/bin/env python3
"""Convert a checkpoint folder to GGUF with llama.cpp's own converter (the
`convert_hf_to_gguf.py` vendored in llama-cpp-python's source distribution), for
bench/llm.py's llama.cpp rows.

    .venv/bin/python bench/llm_gguf.py LLAMA_CPP_DIR CHECKPOINT_DIR --outtype bf16 --outfile F

The benchmark checkpoints carry a small BPE tokenizer that llama.cpp's table of known
pre-tokenizers does not list; the converter refuses unknown ones, so this wrapper names it
"qwen2" (the tokenizer only matters for text: the benchmark feeds token ids). Everything
else (tensor names, shapes, dtype conversion) is the converter's.
"""
import os
import sys


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    lcpp = os.path.abspath(sys.argv[1])
    sys.path[:0] = [os.path.join(lcpp, "gguf-py"), lcpp]
    import conversion.base as base  # noqa: E402

    for cls in vars(base).values():
        if isinstance(cls, type) and hasattr(cls, "get_vocab_base_pre"):
            cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    sys.argv = [os.path.join(lcpp, "convert_hf_to_gguf.py")] + sys.argv[2:]
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
