#!/usr/bin/env python3
"""Regenerate every small example model under examples/.

    .venv/bin/python scripts/gen_examples.py            # all examples
    .venv/bin/python scripts/gen_examples.py healthy_mlp attention_masked_nan

Each example directory gets:
  model.onnx              opset 17, IR 8, built with onnx.helper; weights from a fixed numpy seed
  input_<name>.npy        one file per ONNX graph input, named after the input
  expected_<name>.npy     one file per ONNX graph output: onnx.reference.ReferenceEvaluator's
                          result, cross-checked against onnxruntime (NaN == NaN)
  expect.json             what RLX should say: the node that creates the first NaN, the node where
                          +-inf first appears in the data path, plus a per-node summary of
                          non-finite values computed from the reference evaluator's intermediates

The culprits in expect.json are declared by hand below and then re-derived automatically from the
intermediate values; the script fails if the two disagree. Rules used for the derivation:
  * nan_origin: a node whose output holds NaN while none of its inputs does.
  * inf_origin: a node whose output holds +-inf while none of its *activation* inputs (graph
    inputs, outputs of non-Constant nodes) is non-finite; constants (initializers, Constant
    nodes) count as part of the op, so `Where(mask, 0, -inf)` is where -inf enters the data.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; widest reader compatibility

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
I64 = TensorProto.INT64
BOOL = TensorProto.BOOL


# --------------------------------------------------------------------------------------------
# small builder helpers
# --------------------------------------------------------------------------------------------


class G:
    """Accumulates nodes/initializers; every node gets a human-meaningful name.

    The output tensor of node "a.b.c" is called "a.b.c_out" (or "<name>_out<i>")
    unless an explicit output name is given (graph outputs).
    """

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name=name))
        return name

    def op(self, op_type: str, name: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"{name}_out"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def const(self, name: str, arr: np.ndarray) -> str:
        """A Constant node (not an initializer)."""
        return self.op("Constant", name, [], value=numpy_helper.from_array(np.asarray(arr), name=name + "_value"))

    def model(self, graph_name: str, inputs, outputs, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.inits)
        graph.doc_string = doc
        m = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="rlx-scripts/gen_examples.py",
            ir_version=IR_VERSION,
        )
        onnx.checker.check_model(m, full_check=True)
        return m


def vi(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# example definitions
# --------------------------------------------------------------------------------------------


@dataclass
class Example:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    summary: str
    # declared expectations (checked against the automatic derivation)
    nan_origins: list[str] = field(default_factory=list)
    inf_origins: list[str] = field(default_factory=list)
    outputs_finite: bool = True
    rlx_default: str = ""  # what RLX_DEBUG_NANS=warn should report, in words
    notes: str = ""
    tol: float = 1e-5  # max abs diff allowed between the reference evaluator and onnxruntime


def attention_masked_nan() -> Example:
    """Single-head self-attention; batch row 1 is fully padded -> softmax over all -inf -> NaN."""
    rng = np.random.default_rng(1001)
    B, S, D = 2, 4, 8
    g = G()
    wq = g.init("layer0.attn.q_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    wk = g.init("layer0.attn.k_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    wv = g.init("layer0.attn.v_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    wo = g.init("layer0.attn.o_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    bo = g.init("layer0.attn.o_proj.bias", f32(rng.normal(0, 0.1, (D,))))
    scale = g.init("layer0.attn.scale_factor", f32(1.0 / np.sqrt(D)))
    zero = g.init("layer0.attn.mask_zero", f32(0.0))
    neg_inf = g.init("layer0.attn.mask_neg_inf", f32(-np.inf))
    axes1 = g.init("layer0.attn.mask_unsqueeze_axes", np.array([1], dtype=np.int64))

    q = g.op("MatMul", "layer0.attn.q_proj", ["hidden_states", wq])
    k = g.op("MatMul", "layer0.attn.k_proj", ["hidden_states", wk])
    v = g.op("MatMul", "layer0.attn.v_proj", ["hidden_states", wv])
    kt = g.op("Transpose", "layer0.attn.k_transpose", [k], perm=[0, 2, 1])
    scores = g.op("MatMul", "layer0.attn.qk_matmul", [q, kt])
    scaled = g.op("Mul", "layer0.attn.scale", [scores, scale])
    mb = g.op("Cast", "layer0.attn.mask_to_bool", ["attention_mask"], to=BOOL)
    mu = g.op("Unsqueeze", "layer0.attn.mask_unsqueeze", [mb, axes1])  # [B,1,S] broadcasts over queries
    bias = g.op("Where", "layer0.attn.mask_fill", [mu, zero, neg_inf])  # 0 keep, -inf pad
    masked = g.op("Add", "layer0.attn.mask_add", [scaled, bias])
    probs = g.op("Softmax", "layer0.attn.softmax", [masked], axis=-1)
    ctx = g.op("MatMul", "layer0.attn.pv_matmul", [probs, v])
    o = g.op("MatMul", "layer0.attn.o_proj", [ctx, wo])
    ob = g.op("Add", "layer0.attn.o_proj_bias", [o, bo])
    g.op("Add", "layer0.residual_add", ["hidden_states", ob], out="output")

    m = g.model(
        "attention_masked_nan",
        [vi("hidden_states", F32, [B, S, D]), vi("attention_mask", I64, [B, S])],
        [vi("output", F32, [B, S, D])],
        "Single-head self-attention with an additive padding mask built as Where(mask, 0, -inf). "
        "Batch row 1 is fully padded, so every score row of that batch is -inf and Softmax gives NaN.",
    )
    feeds = {
        "hidden_states": f32(rng.normal(0, 1, (B, S, D))),
        # row 0: last token padded (harmless); row 1: all padding (the bug)
        "attention_mask": np.array([[1, 1, 1, 0], [0, 0, 0, 0]], dtype=np.int64),
    }
    return Example(
        "attention_masked_nan", m, feeds,
        summary="Masked self-attention where one batch row is entirely padding.",
        nan_origins=["layer0.attn.softmax"],
        inf_origins=["layer0.attn.mask_fill"],
        outputs_finite=False,
        rlx_default='NaN first appears at Softmax "layer0.attn.softmax" (its input already held -inf, '
        'so the report also names the -inf origin Where "layer0.attn.mask_fill"). '
        "Softmax of a row that is all -inf is exp(-inf - max) with max = -inf, i.e. exp(NaN).",
        notes="Batch row 0 has one padded key too; its softmax rows are finite (the -inf is absorbed). "
        "Typical fix: fill with a large finite negative (finfo.min) or guard fully-masked rows.",
    )


def _rmsnorm_common(rng, g: G, B, S, D):
    gamma = g.init("layer0.rms_norm.weight", f32(rng.normal(1, 0.1, (D,))))
    two = g.init("layer0.rms_norm.pow_exponent", f32(2.0))
    eps = g.init("layer0.rms_norm.eps", f32(0.0))  # the bug: eps = 0
    sq = g.op("Pow", "layer0.rms_norm.pow", ["x", two])
    ms = g.op("ReduceMean", "layer0.rms_norm.reduce_mean", [sq], axes=[-1], keepdims=1)
    var = g.op("Add", "layer0.rms_norm.add_eps", [ms, eps])
    rms = g.op("Sqrt", "layer0.rms_norm.sqrt", [var])
    return gamma, rms


def _rmsnorm_feeds(rng, B, S, D):
    x = f32(rng.normal(0, 1, (B, S, D)))
    x[1, 2, :] = 0.0  # an all-zero row (e.g. a zeroed padding embedding)
    return {"x": x}


def rmsnorm_eps0_nan() -> Example:
    """RMSNorm from primitives with eps = 0; an all-zero row gives 0 / sqrt(0) = 0/0 = NaN at Div."""
    rng = np.random.default_rng(1002)
    B, S, D = 2, 3, 8
    g = G()
    gamma, rms = _rmsnorm_common(rng, g, B, S, D)
    w_up = g.init("layer0.mlp.up_proj.weight", f32(rng.normal(0, 0.3, (D, 2 * D))))
    normed = g.op("Div", "layer0.rms_norm.div", ["x", rms])
    scaled = g.op("Mul", "layer0.rms_norm.mul_weight", [normed, gamma])
    g.op("MatMul", "layer0.mlp.up_proj", [scaled, w_up], out="y")
    m = g.model(
        "rmsnorm_eps0_nan",
        [vi("x", F32, [B, S, D])],
        [vi("y", F32, [B, S, 2 * D])],
        "RMSNorm written as x / Sqrt(ReduceMean(x^2) + eps) with eps = 0, followed by a projection. "
        "Row x[1,2,:] is all zeros, so the Div computes 0/0 = NaN.",
    )
    return Example(
        "rmsnorm_eps0_nan", m, _rmsnorm_feeds(rng, B, S, D),
        summary="RMSNorm with eps = 0 on an input that has an all-zero row.",
        nan_origins=["layer0.rms_norm.div"],
        inf_origins=[],
        outputs_finite=False,
        rlx_default='NaN created by Div "layer0.rms_norm.div" with finite inputs (x = 0, rms = 0): '
        "0/0. Fix: eps > 0 (e.g. 1e-6) in layer0.rms_norm.add_eps.",
        notes="Sqrt(0) = 0 is finite, so Sqrt is not the culprit; MatMul layer0.mlp.up_proj only "
        "propagates the NaN row.",
    )


def rmsnorm_rsqrt_inf_nan() -> Example:
    """Same RMSNorm but with Reciprocal(Sqrt(.)) (rsqrt): +inf at the rsqrt, NaN at the Mul (0*inf)."""
    rng = np.random.default_rng(1003)
    B, S, D = 2, 3, 8
    g = G()
    gamma, rms = _rmsnorm_common(rng, g, B, S, D)
    w_up = g.init("layer0.mlp.up_proj.weight", f32(rng.normal(0, 0.3, (D, 2 * D))))
    inv = g.op("Reciprocal", "layer0.rms_norm.rsqrt", [rms])
    normed = g.op("Mul", "layer0.rms_norm.mul_rsqrt", ["x", inv])
    scaled = g.op("Mul", "layer0.rms_norm.mul_weight", [normed, gamma])
    g.op("MatMul", "layer0.mlp.up_proj", [scaled, w_up], out="y")
    m = g.model(
        "rmsnorm_rsqrt_inf_nan",
        [vi("x", F32, [B, S, D])],
        [vi("y", F32, [B, S, 2 * D])],
        "RMSNorm written as x * Reciprocal(Sqrt(ReduceMean(x^2) + eps)) with eps = 0. Row x[1,2,:] "
        "is all zeros: Reciprocal(0) = +inf, then x * inf = 0 * inf = NaN.",
    )
    return Example(
        "rmsnorm_rsqrt_inf_nan", m, _rmsnorm_feeds(rng, B, S, D),
        summary="RMSNorm via rsqrt with eps = 0: Inf at the Reciprocal, NaN at the following Mul.",
        nan_origins=["layer0.rms_norm.mul_rsqrt"],
        inf_origins=["layer0.rms_norm.rsqrt"],
        outputs_finite=False,
        rlx_default='NaN at Mul "layer0.rms_norm.mul_rsqrt" (0 * inf), input already non-finite; '
        'the Inf origin is Reciprocal "layer0.rms_norm.rsqrt" (1/0 with finite input).',
        notes="The Inf alone would not be reported by default (it is not an output); it is named "
        "because it turns into NaN one node later.",
    )


def const_fold_inf() -> Example:
    """Constant 1.0 / Constant 0.0 = +inf, added to the input: every output is +inf."""
    rng = np.random.default_rng(1004)
    g = G()
    one = g.const("const.one", f32(1.0))
    zero = g.const("const.zero", f32(0.0))
    inv = g.op("Div", "const.inv_zero", [one, zero])  # folds to +inf
    g.op("Add", "add_bias", ["x", inv], out="y")
    m = g.model(
        "const_fold_inf",
        [vi("x", F32, [2, 4])],
        [vi("y", F32, [2, 4])],
        "Constant subgraph 1.0 / 0.0 folds to +inf and is added to the input.",
    )
    return Example(
        "const_fold_inf", m, {"x": f32(rng.normal(0, 1, (2, 4)))},
        summary="A constant subgraph (Constant 1.0 Div Constant 0.0) folds to +inf and reaches the output.",
        nan_origins=[],
        inf_origins=["const.inv_zero"],
        outputs_finite=False,
        rlx_default='Inf reaches output y; origin Div "const.inv_zero". With RLX_LINT_NUMERICS=1 '
        'the lint reports "const.inv_zero": constant subgraph folds to +inf before anything runs.',
    )


def cast_f16_overflow() -> Example:
    """A -1e9 mask fill cast to float16 overflows to -inf; a fully masked row then gives NaN."""
    rng = np.random.default_rng(1005)
    S = 4
    g = G()
    fill32 = g.const("attn.mask_fill_value", f32(-1e9))  # fine in float32 ...
    fill16 = g.op("Cast", "attn.mask_fill_cast_f16", [fill32], to=F16)  # ... -inf in float16
    s16 = g.op("Cast", "attn.scores_to_f16", ["scores"], to=F16)
    mb = g.op("Cast", "attn.mask_to_bool", ["attention_mask"], to=BOOL)
    masked = g.op("Where", "attn.mask_fill", [mb, s16, fill16])
    probs = g.op("Softmax", "attn.softmax", [masked], axis=-1)
    g.op("Cast", "attn.probs_to_f32", [probs], out="probs", to=F32)
    m = g.model(
        "cast_f16_overflow",
        [vi("scores", F32, [1, S, S]), vi("attention_mask", I64, [1, S, S])],
        [vi("probs", F32, [1, S, S])],
        "Attention-score masking done in float16 with a fill value of -1e9 that was chosen for "
        "float32: Cast(-1e9 -> f16) = -inf. Query row 3 masks every key, so its softmax is NaN "
        "(with the intended finite fill it would have been uniform).",
    )
    mask = np.tril(np.ones((S, S), dtype=np.int64))[None]
    mask[0, 3, :] = 0  # a query whose every key is masked
    return Example(
        "cast_f16_overflow", m,
        {"scores": f32(rng.normal(0, 2, (1, S, S))), "attention_mask": mask},
        summary="float32 mask fill -1e9 cast to float16 becomes -inf; a fully masked row then gives NaN.",
        nan_origins=["attn.softmax"],
        inf_origins=["attn.mask_fill_cast_f16"],
        outputs_finite=False,
        rlx_default='NaN at Softmax "attn.softmax" (row 3 all -inf); Inf origin Cast '
        '"attn.mask_fill_cast_f16" (-1e9 is below float16 -65504). RLX_LINT_NUMERICS=1 can flag the '
        "Cast statically: its constant input folds to -inf.",
        notes="Fix: use finfo(float16).min (-65504) as the fill, or do the masking in float32. "
        "The softmax runs in float16, so compare finite values with a float16 tolerance (~1e-3).",
        tol=1e-3,
    )


def healthy_mlp() -> Example:
    rng = np.random.default_rng(1006)
    N, I, H, O = 4, 16, 32, 10
    g = G()
    w1 = g.init("mlp.fc1.weight", f32(rng.normal(0, 1 / np.sqrt(I), (I, H))))
    b1 = g.init("mlp.fc1.bias", f32(rng.normal(0, 0.1, (H,))))
    w2 = g.init("mlp.fc2.weight", f32(rng.normal(0, 1 / np.sqrt(H), (H, O))))
    b2 = g.init("mlp.fc2.bias", f32(rng.normal(0, 0.1, (O,))))
    h = g.op("Gemm", "mlp.fc1", ["x", w1, b1])
    r = g.op("Relu", "mlp.relu", [h])
    lo = g.op("Gemm", "mlp.fc2", [r, w2, b2])
    g.op("Softmax", "mlp.softmax", [lo], out="probs", axis=-1)
    m = g.model(
        "healthy_mlp",
        [vi("x", F32, [N, I])],
        [vi("probs", F32, [N, O])],
        "Gemm -> Relu -> Gemm -> Softmax. Numerically healthy.",
    )
    return Example(
        "healthy_mlp", m, {"x": f32(rng.normal(0, 1, (N, I)))},
        summary="Small healthy MLP (smoke test).",
        rlx_default="Nothing: all values are finite.",
    )


def f16_activation_growth() -> Example:
    """A float16 MLP stack whose activations grow ~5x per block until the last one overflows."""
    rng = np.random.default_rng(1024)
    B, D, L, gain = 2, 16, 7, 5.0
    g = G()
    h = "x"
    for i in range(L):
        w = g.init(f"block{i}.fc.weight", rng.normal(0, 1 / np.sqrt(D), (D, D)).astype(np.float16))
        s = g.init(f"block{i}.gain", np.asarray(gain, dtype=np.float16))
        h = g.op("MatMul", f"block{i}.fc", [h, w])
        h = g.op("Mul", f"block{i}.scale", [h, s], out="y" if i == L - 1 else None)
    m = g.model(
        "f16_activation_growth",
        [vi("x", F16, [B, D])],
        [vi("y", F16, [B, D])],
        "Seven float16 blocks (MatMul then a gain of 5): max|x| climbs from ~10 to ~2e4, and the "
        "last block's Mul pushes a few values past 65504, the float16 maximum, to +-inf.",
    )
    x = rng.normal(0, 1, (B, D)).astype(np.float16)
    # The overflow must be decisive (no value within 5% of the rounding threshold 65520), so
    # that every runtime's float16 rounding agrees on which elements overflow.
    with np.errstate(all="ignore"):
        vals = run_reference(m, {"x": x})
    pre = np.abs(vals["block6.fc_out"].astype(np.float64)) * gain
    assert np.all(np.abs(pre / 65520.0 - 1.0) > 0.05), "f16_activation_growth: overflow not decisive"
    return Example(
        "f16_activation_growth", m, {"x": x},
        summary="float16 activations climb toward 65504 block by block; the last block overflows to +-inf.",
        nan_origins=[],
        inf_origins=["block6.scale"],
        outputs_finite=False,
        rlx_default='Inf reaches output y; origin Mul "block6.scale". `rlx trace` shows max|x| climbing '
        "toward the float16 overflow line 65504 over the blocks before.",
        notes="Fix: normalize between blocks (LayerNorm/RMSNorm), lower the gain, or run the stack in "
        "float32/bfloat16. Compare finite values with a float16 tolerance.",
        # float16 spacing is 32 between 32768 and 65504: allow a few units in the last place
        # (numpy accumulates the float16 MatMul differently from onnxruntime)
        tol=128.0,
    )


def inf_absorbed() -> Example:
    """-inf created on purpose and absorbed: Log(0) then Where(IsInf, 0, .), and a causal softmax."""
    rng = np.random.default_rng(1007)
    S, D = 5, 8
    g = G()
    # (1) T5-style: log of counts that contain zeros, -inf replaced by Where(IsInf(..), 0, ..)
    zero = g.init("feat.zero", f32(0.0))
    lg = g.op("Log", "feat.log", ["counts"])
    isinf = g.op("IsInf", "feat.isinf", [lg])
    g.op("Where", "feat.where_finite", [isinf, zero, lg], out="log_features")
    # (2) causal self-attention: -inf above the diagonal, but no row is fully masked
    wq = g.init("layer0.attn.q_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    wk = g.init("layer0.attn.k_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    wv = g.init("layer0.attn.v_proj.weight", f32(rng.normal(0, 0.3, (D, D))))
    scale = g.init("layer0.attn.scale_factor", f32(1.0 / np.sqrt(D)))
    causal = g.init("layer0.attn.causal_keep", np.tril(np.ones((S, S), dtype=bool)))
    mzero = g.init("layer0.attn.mask_zero", f32(0.0))
    neg_inf = g.init("layer0.attn.mask_neg_inf", f32(-np.inf))
    q = g.op("MatMul", "layer0.attn.q_proj", ["hidden_states", wq])
    k = g.op("MatMul", "layer0.attn.k_proj", ["hidden_states", wk])
    v = g.op("MatMul", "layer0.attn.v_proj", ["hidden_states", wv])
    kt = g.op("Transpose", "layer0.attn.k_transpose", [k], perm=[0, 2, 1])
    sc = g.op("MatMul", "layer0.attn.qk_matmul", [q, kt])
    sc = g.op("Mul", "layer0.attn.scale", [sc, scale])
    bias = g.op("Where", "layer0.attn.causal_mask_fill", [causal, mzero, neg_inf])
    sc = g.op("Add", "layer0.attn.mask_add", [sc, bias])
    p = g.op("Softmax", "layer0.attn.softmax", [sc], axis=-1)
    g.op("MatMul", "layer0.attn.pv_matmul", [p, v], out="attn_output")
    m = g.model(
        "inf_absorbed",
        [vi("counts", F32, [2, 6]), vi("hidden_states", F32, [1, S, D])],
        [vi("log_features", F32, [2, 6]), vi("attn_output", F32, [1, S, D])],
        "Intentional -inf that never reaches an output: Log(0) replaced via Where(IsInf), and a "
        "causal mask whose every row keeps at least the diagonal.",
    )
    counts = f32(rng.integers(0, 4, (2, 6)))
    counts[0, 0] = 0.0
    counts[1, 3] = 0.0
    return Example(
        "inf_absorbed", m,
        {"counts": counts, "hidden_states": f32(rng.normal(0, 1, (1, S, D)))},
        summary="-inf created on purpose (Log of zeros, causal mask fill) and absorbed; outputs finite.",
        nan_origins=[],
        inf_origins=["feat.log", "layer0.attn.causal_mask_fill"],
        outputs_finite=True,
        rlx_default="Nothing under the default mode (no NaN, no Inf reaches an output). Only "
        'RLX_DEBUG_NANS=strict may mention the intended -inf at "feat.log" and '
        '"layer0.attn.causal_mask_fill".',
    )


def sampler_temperature_zero() -> Example:
    """A sampler as graph ops: softmax(logits / temperature) with temperature = 0."""
    rng = np.random.default_rng(1008)
    V = 16
    g = G()
    scaled = g.op("Div", "sampler.temperature_div", ["logits", "temperature"])
    g.op("Softmax", "sampler.softmax", [scaled], out="probs", axis=-1)
    m = g.model(
        "sampler_temperature_zero",
        [vi("logits", F32, [1, V]), vi("temperature", F32, [])],
        [vi("probs", F32, [1, V])],
        "The sampling step of a generation loop written as graph ops: the next token's logits "
        "divided by a temperature input, then Softmax. temperature = 0 (a user asking for greedy "
        "decoding) makes every logit +-inf, and the softmax of a row holding +inf is NaN.",
    )
    logits = f32(rng.normal(0, 3, (1, V)))
    assert (logits != 0).all()  # x / 0 is +-inf everywhere (0 / 0 would be NaN at the Div)
    return Example(
        "sampler_temperature_zero", m,
        {"logits": logits, "temperature": np.array(0.0, dtype=np.float32)},
        summary="softmax(logits / temperature) with temperature = 0: +-inf at the Div, NaN at the Softmax.",
        nan_origins=["sampler.softmax"],
        inf_origins=["sampler.temperature_div"],
        outputs_finite=False,
        rlx_default='NaN at Softmax "sampler.softmax" (its input holds +inf: inf - max = inf - inf); '
        'the Inf origin is Div "sampler.temperature_div" (x / 0). The fix line is the sampler\'s: '
        "take the greedy path (argmax) for T = 0, as transformers' do_sample=False, or clamp T.",
        notes="rlx generate never divides by a temperature of 0: --temperature 0 is greedy.",
    )


ALL = [
    attention_masked_nan,
    rmsnorm_eps0_nan,
    rmsnorm_rsqrt_inf_nan,
    const_fold_inf,
    cast_f16_overflow,
    healthy_mlp,
    inf_absorbed,
    f16_activation_growth,
    sampler_temperature_zero,
]


# --------------------------------------------------------------------------------------------
# evaluation, cross-check, analysis
# --------------------------------------------------------------------------------------------


def _stats(a: np.ndarray) -> dict:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        return {"nan": 0, "posinf": 0, "neginf": 0}
    return {
        "nan": int(np.isnan(a).sum()),
        "posinf": int(np.isposinf(a).sum()),
        "neginf": int(np.isneginf(a).sum()),
    }


def analyse(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> dict:
    graph = model.graph
    const_names = {i.name for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            const_names.update(n.output)

    def nonfinite(name: str) -> bool:
        s = _stats(values[name])
        return s["nan"] + s["posinf"] + s["neginf"] > 0

    def has_nan(name: str) -> bool:
        return _stats(values[name])["nan"] > 0

    def has_inf(name: str) -> bool:
        s = _stats(values[name])
        return s["posinf"] + s["neginf"] > 0

    per_node, nan_origins, inf_origins = [], [], []
    for n in graph.node:
        ins = [i for i in n.input if i]
        out_stats = {o: _stats(values[o]) for o in n.output}
        entry = {"node": n.name, "op": n.op_type, "outputs": out_stats}
        if any(sum(s.values()) for s in out_stats.values()):
            per_node.append(entry)
        if n.op_type == "Constant":
            continue
        if any(has_nan(o) for o in n.output) and not any(has_nan(i) for i in ins):
            nan_origins.append(n.name)
        act_ins = [i for i in ins if i not in const_names]
        if any(has_inf(o) for o in n.output) and not any(nonfinite(i) for i in act_ins):
            inf_origins.append(n.name)
    return {
        "nan_origins": nan_origins,
        "inf_origins": inf_origins,
        "nonfinite_nodes": per_node,
        "nonfinite_initializers": [i.name for i in graph.initializer if nonfinite(i.name)],
        "outputs": {o.name: _stats(values[o.name]) for o in graph.output},
    }


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ReferenceEvaluator(model)
        values = ref.run(None, feeds, intermediate=True)
    values = dict(values)
    for i in model.graph.initializer:
        values.setdefault(i.name, numpy_helper.to_array(i))
    for k, v in feeds.items():
        values.setdefault(k, v)
    return values


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        d = np.where(same, 0.0, np.abs(a - b))
    return float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0


def generate(ex: Example) -> dict:
    out_dir = EXAMPLES / ex.name
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.glob("input_*.npy")) + list(out_dir.glob("expected_*.npy")):
        old.unlink()
    onnx.save(ex.model, out_dir / "model.onnx")

    values = run_reference(ex.model, ex.feeds)
    ort_out = run_ort(ex.model, ex.feeds)
    diffs = {}
    for o in ex.model.graph.output:
        r, q = np.asarray(values[o.name]), ort_out[o.name]
        assert r.shape == q.shape and r.dtype == q.dtype, (ex.name, o.name, r.shape, q.shape, r.dtype, q.dtype)
        # NaN/Inf patterns must match exactly; finite values within round-off
        assert np.array_equal(np.isnan(r), np.isnan(q)), f"{ex.name}/{o.name}: NaN pattern differs from ORT"
        assert np.array_equal(np.isinf(r), np.isinf(q)), f"{ex.name}/{o.name}: Inf pattern differs from ORT"
        diffs[o.name] = max_diff(r, q)
        assert diffs[o.name] <= ex.tol, f"{ex.name}/{o.name}: reference vs ORT max abs diff {diffs[o.name]}"

    for name, arr in ex.feeds.items():
        np.save(out_dir / f"input_{name}.npy", arr)
    for o in ex.model.graph.output:
        np.save(out_dir / f"expected_{o.name}.npy", np.asarray(values[o.name]))

    info = analyse(ex.model, values)
    assert info["nan_origins"] == ex.nan_origins, (ex.name, "nan_origins", info["nan_origins"], ex.nan_origins)
    assert info["inf_origins"] == ex.inf_origins, (ex.name, "inf_origins", info["inf_origins"], ex.inf_origins)
    finite = all(sum(s.values()) == 0 for s in info["outputs"].values())
    assert finite == ex.outputs_finite, (ex.name, "outputs_finite", finite)

    expect = {
        "example": ex.name,
        "summary": ex.summary,
        "opset": OPSET,
        "inputs": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in ex.feeds.items()},
        "outputs_finite": ex.outputs_finite,
        "nan_origin": ex.nan_origins[0] if ex.nan_origins else None,
        "inf_origin": ex.inf_origins[0] if len(ex.inf_origins) == 1 else (ex.inf_origins or None),
        "rlx_default_report": ex.rlx_default,
        "notes": ex.notes,
        "derived": info,
        "reference_vs_onnxruntime_max_abs_diff": diffs,
        "generator": "scripts/gen_examples.py",
        "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__},
    }
    (out_dir / "expect.json").write_text(json.dumps(expect, indent=2) + "\n")
    return {"name": ex.name, "diffs": diffs, "nan": ex.nan_origins, "inf": ex.inf_origins}


def main(argv: list[str]) -> int:
    wanted = set(argv)
    known = {f.__name__ for f in ALL}
    unknown = wanted - known
    if unknown:
        print(f"unknown example(s): {sorted(unknown)}; known: {sorted(known)}", file=sys.stderr)
        return 2
    for fn in ALL:
        if wanted and fn.__name__ not in wanted:
            continue
        r = generate(fn())
        print(
            f"{r['name']:<24} nan_origin={r['nan'] or '-'} inf_origin={r['inf'] or '-'} "
            f"ref-vs-ort max|diff|={max(r['diffs'].values()):.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
