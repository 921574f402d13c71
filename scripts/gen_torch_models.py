#!/usr/bin/env python3
"""Export real architectures with torch.export (random weights, small configs) into
fixtures/torch/<name>/: model.pt2, input_<name>.npy for each user input, and
expected_<i>.npy for each output leaf, computed by PyTorch eager (the reference that
crates/rlx-cli/tests/torch_models.rs compares RLX with, float32 rtol 1e-4).

Planted-NaN modules (fixtures/torch/nan_*/) also write expected_report.json: the module path
and the source line (file, line number, code) of the op that creates the bad value, found
from this file's own text (never from RLX's output).

    .venv/bin/python scripts/gen_torch_models.py [--only NAME ...] [--out DIR]

Needs torch (scripts/setup-venv.sh --torch); torchvision and transformers for those models.
Takes about a minute on 2 cores; the fixtures are a few MB.
"""
import argparse
import inspect
import json
import os
import sys
import warnings
import zipfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
torch.manual_seed(0)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def line_of(marker):
    """(file, line, code) of the line in this file that holds `marker`."""
    src = open(__file__).read().splitlines()
    for i, l in enumerate(src):
        if marker in l and "line_of(" not in l:
            return {"file": os.path.basename(__file__), "line": i + 1, "code": l.strip()}
    raise SystemExit(f"marker {marker!r} not found")


# ---------------------------------------------------------------- small models of our own
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x, mask):
        h = F.gelu(self.fc1(x))
        h = self.ln(h)
        return torch.softmax(self.fc2(h) + mask, dim=-1)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.hardswish(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.log_softmax(self.fc(x), dim=-1)


class Attn(nn.Module):
    """An attention block with RoPE-free SDPA, a causal mask and an RMSNorm."""

    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.norm = nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, s, d))


class Reductions(nn.Module):
    """Reductions in the overloads torch.export leaves (amax/amin/logsumexp.default carry a
    `dim` list; sum/mean.dim_IntList, prod.dim_int, var/std.correction, max.dim), and SDPA
    with a boolean mask."""

    def forward(self, x, mask):
        a = torch.amax(x, dim=(1, 2)) + torch.amin(x, dim=-1, keepdim=True).sum(dim=(1, 2))
        b = torch.logsumexp(x * 30.0, dim=-1) - x.sum(dim=-1)
        c = x.prod(dim=1).mean(dim=-1, keepdim=True) + x.var(dim=-1).std(dim=-1, keepdim=True)
        m, i = x.max(dim=-1)
        q = x.unsqueeze(1)
        y = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return a, b, c, m + i.float(), torch.amax(x), x.abs().mean(), y


# ---------------------------------------------------------------- planted NaN modules
class F16Overflow(nn.Module):
    """A float16 MLP whose up-projection overflows to inf; the next Linear's 0 * inf
    and inf - inf turn it into NaN."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        with torch.no_grad():
            self.up.weight.fill_(300.0)

    def forward(self, x):
        h = self.up(x)  # PLANT:f16_overflow
        h = torch.relu(h)
        return self.down(h)


class LayerNormEps0(nn.Module):
    """LayerNorm with eps 0 on an all-zero row: 0/0."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8, eps=0.0)

    def forward(self, x):
        h = self.proj(x) * 0.0
        return self.norm(h)  # PLANT:ln_eps0


class MaskedSoftmax(nn.Module):
    """Attention scores with a fully masked row: softmax over all -inf gives NaN."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        s = self.q(x) @ x.transpose(-1, -2)
        s = s.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(s, dim=-1)  # PLANT:masked_softmax


class NaNWeight(nn.Module):
    """A checkpoint with one NaN in a Linear's weight (element [1, 2]): the weight is the
    culprit, not the linear that reads it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.fc.weight[1, 2] = float("nan")

    def forward(self, x):
        return self.fc(x)


class InfBuffer(nn.Module):
    """A buffer holding +inf beside finite scales: the buffer is the origin of the +inf that
    reaches the output, not the Mul that reads it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, float("inf"), 2.0]))

    def forward(self, x):
        return self.fc(x) * self.scale


# ---------------------------------------------------------------- writers
def save_layout(ep, path, layout):
    """Write `ep` in one of torch.export's older archive layouts, with this torch's own
    serializer (the JSON and the torch.save'd weights are what older torch wrote too):
    "flat" as torch 2.6 wrote it (serialized_exported_program.json, serialized_state_dict.pt,
    serialized_constants.pt, serialized_example_inputs.pt, version), "pt2_pickled" as torch
    2.7 and 2.8 wrote it (model/archive_format, archive_version, byteorder,
    models/model.json, data/weights/model.pt, data/constants/model.pt). Both stored, not
    deflated, as torch writes them."""
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize
    art = serialize(ep, pickle_protocol=2)
    with zipfile.ZipFile(path, "w") as z:
        if layout == "flat":
            z.writestr("serialized_exported_program.json", art.exported_program)
            z.writestr("serialized_state_dict.pt", art.state_dict)
            z.writestr("serialized_constants.pt", art.constants)
            z.writestr("serialized_example_inputs.pt", art.example_inputs)
            z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        elif layout == "pt2_pickled":
            p = "model/"
            z.writestr(p + "archive_format", "pt2")
            z.writestr(p + "archive_version", "0")
            z.writestr(p + "byteorder", "little")
            z.writestr(p + ".data/version", "6\n")  # torch's zip reader wants a version record
            z.writestr(p + "models/model.json", art.exported_program)
            z.writestr(p + "data/weights/model.pt", art.state_dict)
            z.writestr(p + "data/constants/model.pt", art.constants)
            z.writestr(p + "data/sample_inputs/model.pt", art.example_inputs)
        else:
            raise SystemExit(f"unknown layout {layout}")
    # torch itself must read it back (its loader keeps both older layouts readable; quiet,
    # as it logs a traceback of its first try before reading an older layout).
    import logging
    lg = logging.getLogger("torch.export")
    level, lg.level = lg.level, logging.CRITICAL
    try:
        torch.export.load(path)
    finally:
        lg.setLevel(level)


def save(name, model, args, kwargs=None, out_root=None, dynamic_shapes=None, report=None, layout=None):
    kwargs = kwargs or {}
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    model = model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        if layout:
            save_layout(ep, os.path.join(d, "model.pt2"), layout)
        else:
            torch.export.save(ep, os.path.join(d, "model.pt2"))
        want = model(*args, **kwargs)
    leaves = [t for t in torch.utils._pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    for f in os.listdir(d):
        if f.startswith(("input_", "expected_")):
            os.remove(os.path.join(d, f))
    # user inputs, in the graph signature's order, named as forward's parameters
    from torch.export.graph_signature import TensorArgument
    names = [s.arg.name for s in ep.graph_signature.input_specs
             if s.kind.name == "USER_INPUT" and isinstance(s.arg, TensorArgument)]
    flat = [t for t in torch.utils._pytree.tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor)]
    if len(names) != len(flat):
        raise SystemExit(f"{name}: {len(names)} user inputs but {len(flat)} tensors given")
    for n, t in zip(names, flat):
        np.save(os.path.join(d, f"input_{n}.npy"), t.detach().numpy())
    for i, t in enumerate(leaves):
        np.save(os.path.join(d, f"expected_{i}.npy"), t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy())
    if report:
        with open(os.path.join(d, "expected_report.json"), "w") as f:
            json.dump(report, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"  {name}: {len(names)} inputs, {len(leaves)} outputs, {size / 1e6:.2f} MB")


def own_models(out):
    save("mlp", MLP(), [torch.randn(4, 16), torch.zeros(4, 8)], out_root=out)
    b = torch.export.Dim("batch", min=1, max=64)
    save("mlp_dynamic", MLP(), [torch.randn(3, 16), torch.zeros(3, 8)], out_root=out,
         dynamic_shapes={"x": {0: b}, "mask": {0: b}})
    save("small_cnn", SmallCNN(), [torch.randn(2, 3, 16, 16)], out_root=out)
    save("attn_block", Attn(), [torch.randn(2, 6, 32)], out_root=out)
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True  # no fully masked row
    save("reductions", Reductions(), [torch.randn(2, 5, 6), mask], out_root=out)


def planted(out):
    save("nan_f16_overflow", F16Overflow().half(), [torch.full((2, 8), 30.0).half()], out_root=out,
         report={"module": "up", "kind": "+inf", "source": line_of("# PLANT:f16_overflow")})
    x = torch.randn(3, 8)
    save("nan_layernorm_eps0", LayerNormEps0(), [x], out_root=out,
         report={"module": "norm", "kind": "NaN", "source": line_of("# PLANT:ln_eps0")})
    mask = torch.ones(1, 4, 4)
    mask[0, 2, :] = 0  # row 2 fully masked
    save("nan_masked_softmax", MaskedSoftmax(), [torch.randn(1, 4, 8), mask], out_root=out,
         report={"module": "", "kind": "NaN", "source": line_of("# PLANT:masked_softmax")})


def planted_weights(out):
    """Bad values stored in the checkpoint itself (expected_report.json: the tensor's name,
    the kind and the flat index of the planted element)."""
    save("nan_weight", NaNWeight(), [torch.randn(2, 4)], out_root=out,
         report={"initializer": "fc.weight", "kind": "NaN", "index": 1 * 4 + 2})
    save("inf_buffer", InfBuffer(), [torch.randn(2, 4)], out_root=out,
         report={"initializer": "scale", "kind": "+inf", "index": 1})


def legacy(out):
    """Archives in the layouts older torch wrote (torch 2.6's flat zip, torch 2.7/2.8's pt2
    with torch.save'd weights), made with this torch: the importer must read both."""
    b = torch.export.Dim("batch", min=1, max=64)
    save("legacy_flat_mlp_dynamic", MLP(), [torch.randn(3, 16), torch.zeros(3, 8)], out_root=out,
         dynamic_shapes={"x": {0: b}, "mask": {0: b}}, layout="flat")
    save("legacy_flat_small_cnn", SmallCNN(), [torch.randn(2, 3, 16, 16)], out_root=out, layout="flat")
    save("legacy_pickled_small_cnn", SmallCNN(), [torch.randn(2, 3, 16, 16)], out_root=out, layout="pt2_pickled")
    save("legacy_pickled_attn_block", Attn(), [torch.randn(2, 6, 32)], out_root=out, layout="pt2_pickled")


def randomize(m):
    """Random BatchNorm statistics and affine parameters, and unit-scale Linear layers: with
    torchvision's init (BN mean 0 var 1, Linear std 0.01) random-weight outputs collapse
    towards 0 and would prove little."""
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
            mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            mod.bias.data.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
        elif isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=1.0 / mod.in_features ** 0.5)
    return m


def vision(out):
    import torchvision
    save("resnet18", randomize(torchvision.models.resnet18(num_classes=10)), [torch.randn(1, 3, 64, 64)], out_root=out)
    mnv3 = randomize(torchvision.models.mobilenet_v3_small(num_classes=10))
    save("mobilenet_v3_small", mnv3, [torch.randn(1, 3, 64, 64)], out_root=out)
    from torchvision.models.vision_transformer import VisionTransformer
    vit = VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=10)
    randomize(vit)  # torchvision zero-initializes the head: outputs would be all 0
    save("vit_b16_small", vit, [torch.randn(1, 3, 32, 32)], out_root=out)
    # ViT-B/16 itself (12 layers, width 768, 86M parameters: a 344 MB archive) at a small
    # image size (32x32: 4 patches + the class token), as the issue asks.
    vitb = randomize(torchvision.models.vit_b_16(image_size=32, num_classes=10))
    save("vit_b16", vitb, [torch.randn(1, 3, 32, 32)], out_root=out)


def hf(out):
    import transformers as tf
    common = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    ids = torch.randint(0, 96, (2, 7))
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, 5:] = 0
    cfg = tf.BertConfig(num_hidden_layers=2, max_position_embeddings=32, **common)
    save("bert", tf.BertModel(cfg), [ids], {"attention_mask": am}, out_root=out)
    cfg = tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False)
    save("gpt2", tf.GPT2LMHeadModel(cfg), [ids], {"use_cache": False}, out_root=out)
    cfg = tf.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, max_position_embeddings=32, use_cache=False, **common)
    save("llama", tf.LlamaForCausalLM(cfg), [ids], {"use_cache": False}, out_root=out)
    cfg = tf.Qwen3Config(num_hidden_layers=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=32, use_cache=False, **common)
    save("qwen3", tf.Qwen3ForCausalLM(cfg), [ids], {"use_cache": False}, out_root=out)
    cfg = tf.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, use_cache=False)
    dec = torch.randint(0, 96, (2, 5))
    save("t5", tf.T5Model(cfg), [ids], {"decoder_input_ids": dec, "use_cache": False}, out_root=out)
    cfg = tf.WhisperConfig(vocab_size=96, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                           encoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16, decoder_layers=1,
                           decoder_attention_heads=4, decoder_ffn_dim=64, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    enc = WhisperEncoder(cfg)
    save("whisper_encoder", enc, [torch.randn(1, 16, 32)], out_root=out)


GROUPS = {"own": own_models, "planted": planted, "planted_weights": planted_weights, "legacy": legacy, "vision": vision, "hf": hf}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(GROUPS), help="groups to write (default: all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "fixtures", "torch"))
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"torch {torch.__version__} → {a.out}")
    for g in a.only or list(GROUPS):
        torch.manual_seed(0)
        GROUPS[g](a.out)


if __name__ == "__main__":
    main()
