"""bfloat16 stability cases (issue 28: "bfloat16's largest values" among the extreme inputs).

The float ops where bfloat16 is a plausible dtype (activations, Exp/Log/Sqrt, Erf, Gelu,
Softmax/LogSoftmax, LayerNormalization, the sum-like reductions, MatMul, elementwise
arithmetic, Pow, Cast) get one case each with bfloat16 inputs and outputs.

Inputs are stored as float32 `.npy` files (numpy has no bfloat16 and RLX's `.npy` reader
takes none) holding values that are exactly representable in bfloat16 (rounded here with
ml_dtypes); crates/rlx-cli/tests/stability.rs casts an f32 file to the model input's
bfloat16 and fails the case if that cast changes a value. Expected values are float64
evaluations of the op's definition on those bfloat16 values; the runner rounds them to
bfloat16 before comparing.

Tolerances count bfloat16 units in the last place (8 significant bits: one ulp is at most
2^-7 of the value): ops that are exact in the definition (Relu, Abs, Max, Floor, Cast...)
must match exactly; single ops and activations computed in a wider type and rounded once
get 1 ulp (the rounding of a value already a few float32 ulps off may land on the other
neighbour); composites whose ONNX function body rounds to bfloat16 between steps (Mish,
HardSwish, Softmax's division, LayerNormalization's scale and bias) get 2 ulp. The absolute
floor is bfloat16's smallest subnormal, 2^-133.
"""
import math

import numpy as np
from ml_dtypes import bfloat16
from onnx import TensorProto, helper, numpy_helper

try:  # the generator puts scripts/stability on sys.path; its own folder holds the base cases
    from common import Case
except ImportError:  # pragma: no cover - imported as a package
    from .common import Case

import gen_stability_cases as base  # UNARY / BINARY definitions shared with f32 and f16

BF = TensorProto.BFLOAT16
ULP = 2.0 ** -7                     # one bfloat16 ulp, relative (at most)
SUB = float(2.0 ** -133)            # bfloat16's smallest subnormal
BF_MAX = float(np.float32(3.3895314e38))


def bf(x):
    """Round to bfloat16, held as float32 (the form the `.npy` files store)."""
    return np.asarray(x, np.float32).astype(bfloat16).astype(np.float32)


def f64(x):
    return np.asarray(x, np.float64)


# The extremes as bfloat16 values: its largest finite values, the neighbourhood of
# exp's overflow (ln(max) = 88.72; bf16 spacing there is 0.5, so 88.5 and 89), +-1e4 (9984),
# 1e30, float16's range end (65504 rounds to 65536), the smallest normal, subnormals down to
# the smallest one (2^-133), tiny values where erf(x) ~ 2x/sqrt(pi), +-0, mixed signs.
EXTREMES = bf([
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 5.0, -5.0, 20.0, -20.0,
    88.5, -88.5, 89.0, -89.0, 100.0, -100.0, 1e4, -1e4, 65504.0, -65504.0, 1e30, -1e30,
    BF_MAX, -BF_MAX, 3e38, -3e38, 1e-7, -1e-7, 1e-30, -1e-30,
    float(np.finfo(np.float32).tiny), -float(np.finfo(np.float32).tiny),
    1e-39, -1e-39, SUB, -SUB,
])


def model(op, ins, outs, attrs=None, opset=18, inits=None):
    """One node; ins/outs: (name, TensorProto type, shape); inits: {name: np array}."""
    inits = inits or {}
    node = helper.make_node(op, [n for n, _, _ in ins], [n for n, _, _ in outs],
                            name=f"stab.{op.lower()}", **(attrs or {}))
    g = helper.make_graph(
        [node], f"stability_{op}_bf16",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in ins if n not in inits],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outs],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def bf_init(name, values):
    """A bfloat16 initializer from float32 values (exact in bfloat16), as raw little-endian
    bfloat16 bytes."""
    v = bf(values)
    return helper.make_tensor(name, BF, list(v.shape), v.astype(bfloat16).tobytes(), raw=True)


# Ops whose definition is exact on bfloat16 values (any correct kernel matches bit for bit).
EXACT = {"Abs", "Neg", "Floor", "Ceil", "Round", "Sign", "Relu", "ThresholdedRelu", "Shrink",
         "Max", "Min", "Mod"}
# Composites whose function body rounds between steps: 2 ulp.
TWO_ULP = {"Mish", "HardSwish", "Selu", "Celu", "HardSigmoid"}
# Unary ops given a bfloat16 case (float math where bfloat16 is a plausible dtype; the
# trigonometric/hyperbolic inverses stay float32/float16-only).
UNARY = ["Abs", "Neg", "Floor", "Ceil", "Round", "Sign", "Relu", "Sqrt", "Reciprocal", "Exp",
         "Log", "Sin", "Cos", "Tanh", "Sigmoid", "Softplus", "Softsign", "Erf", "Elu", "Selu",
         "Celu", "HardSigmoid", "HardSwish", "LeakyRelu", "ThresholdedRelu", "Shrink", "Mish",
         "Swish", "Gelu", "Sinh", "Cosh", "Atan"]


def tol_for(op):
    if op in EXACT:
        return 0.0, 0.0
    return (2 * ULP if op in TWO_ULP else ULP), SUB


def unary_cases():
    items = [((op, ""), base.UNARY[op]) for op in UNARY] + list(base.UNARY_EXTRA.items())
    for (op, tag), (fn, attrs, opset, keep, _tol, note) in items:
        x = EXTREMES if keep is None else EXTREMES[keep(f64(EXTREMES))]
        with np.errstate(all="ignore"):
            want = fn(f64(x))
        rtol, atol = tol_for(op)
        if op == "Gelu" and tag == "tanh":
            rtol = 2 * ULP  # 0.5 x (1 + tanh(...)) rounds between steps in its function body
        m = model(op, [("x", BF, [len(x)])], [("y", BF, [len(x)])], attrs, opset)
        name = f"{tag + '_' if tag else ''}bfloat16_extremes"
        yield Case(op, name, m, {"x": x}, {"y": want}, rtol, atol, note + " (bfloat16)")


def tiny_erf_cases():
    """Erf and Gelu where the result is far below 1: tiny |x| (erf(x) = 2x/sqrt(pi) to
    bfloat16 precision) and Gelu's negative tail (x/2 erfc(-x/sqrt 2)), where `1 + erf`
    cancels: every value must keep its 8 significant bits."""
    xs = bf([1e-3, -1e-3, 1e-5, -1e-5, 3e-7, -3e-7, 1e-20, -1e-20, 1e-38, -1e-38,
             0.25, -0.25, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0, -5.0, -6.0, -7.0, -8.0,
             -9.0, -10.0, -12.0, -13.0, -14.0])
    for op, fn, opset in (("Erf", base.erf, 18), ("Gelu", lambda x: 0.5 * x * erfc(-x / math.sqrt(2.0)), 20)):
        x = xs if op == "Gelu" else xs[np.abs(xs) < 1]
        want = fn(f64(x))
        m = model(op, [("x", BF, [len(x)])], [("y", BF, [len(x)])], {}, opset)
        note = ("erf(x) ~ 2x/sqrt(pi) for tiny |x|, exactly 0 at 0" if op == "Erf" else
                "x/2 erfc(-x/sqrt 2): the negative tail without the cancellation of 1 + erf")
        yield Case(op, "bfloat16_tiny_and_tail", m, {"x": x}, {"y": want}, ULP, SUB, note)


def tiny_erf_cases_f32():
    """The same in float32, at a few float32 ulp (2^-24 relative each): erf of tiny and
    subnormal |x| is 2x/sqrt(pi) rounded once; Gelu's negative tail keeps its digits down to
    its underflow near x = -14."""
    tiny = np.array([1e-3, -1e-3, 1e-7, -1e-7, 1e-20, -1e-20, 1.1754944e-38, -1.1754944e-38,
                     1e-40, -1e-40, 1e-45, -1e-45, 0.0, -0.0, 0.25, -0.25], np.float32)
    m = base.single_node("Erf", [("x", np.float32, [len(tiny)])], [("y", np.float32, [len(tiny)])])
    yield Case("Erf", "float32_tiny", m, {"x": tiny}, {"y": base.erf(f64(tiny))}, 4 * 2.0 ** -24, 1e-45,
               "erf(x) = 2x/sqrt(pi) in one product for |x| < 2^-12; exactly +-0 at +-0")
    tail = np.array([-0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -5.0, -6.0, -8.0, -10.0, -12.0, -13.0,
                     -13.5, 0.5, 2.0], np.float32)
    want = 0.5 * f64(tail) * erfc(-f64(tail) / math.sqrt(2.0))
    m = base.single_node("Gelu", [("x", np.float32, [len(tail)])], [("y", np.float32, [len(tail)])], opset=20)
    yield Case("Gelu", "float32_negative_tail", m, {"x": tail}, {"y": want}, 16 * 2.0 ** -24, 1e-45,
               "x/2 erfc(-x/sqrt 2) below x = -1 (1 + erf cancels), the f32 erf above")
    for dt in (np.float32, np.float16):
        t = tail.astype(dt) if dt == np.float32 else np.array([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0], dt)
        u = math.sqrt(2.0 / math.pi) * (f64(t) + 0.044715 * f64(t) ** 3)
        want = f64(t) / (1.0 + np.exp(-2.0 * u))
        m = base.single_node("Gelu", [("x", dt, [len(t)])], [("y", dt, [len(t)])], {"approximate": "tanh"}, 20)
        # The argument 2u is computed in the input's float type (a few roundings), and
        # exp(-|2u|) turns its absolute error into a relative error |2u| times larger: the
        # conditioning, not the formulation. 8 ulp times the largest |2u| with a normal result
        # (49 at x = -8 in f32; the cancelling 1 + tanh u was 30% off at x = -5).
        # float16 runs in float32 (one final rounding: 1 ulp of float16 on top).
        big = np.abs(2 * u)[np.abs(want) > np.finfo(dt).tiny].max()
        rtol = 8 * 2.0 ** -24 * max(big, 1.0) + (0.0 if dt == np.float32 else 2.0 ** -10)
        yield Case("Gelu", f"tanh_{np.dtype(dt).name}_negative_tail", m, {"x": t}, {"y": want},
                   float(rtol), 1e-45 if dt == np.float32 else 6e-8,
                   "x sigmoid(2u) = 0.5 x (1 + tanh u) without the cancellation of 1 + tanh u")


def erfc(x):
    return np.vectorize(math.erfc)(x)


def binary_cases():
    ops = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Mod"]
    for op in ops:
        fn, note = base.BINARY[op]
        small = EXTREMES[::3]
        a = np.repeat(EXTREMES, len(small))
        b = np.tile(small, len(EXTREMES))
        if op == "Pow":
            b = np.tile(bf([2.0, 3.0, 0.5, -1.0, -2.0, 0.0]), len(EXTREMES))
            a = np.repeat(EXTREMES, 6)
        attrs = {"fmod": 1} if op == "Mod" else {}
        with np.errstate(all="ignore"):
            want = fn(f64(a), f64(b))
        n = len(a)
        rtol, atol = tol_for(op)
        m = model(op, [("x", BF, [n]), ("y", BF, [n])], [("z", BF, [n])], attrs)
        yield Case(op, "bfloat16_pairs", m, {"x": a, "y": b}, {"z": want}, rtol, atol,
                   note + " (bfloat16)")


def rows():
    """Rows of small values; one large value among small ones; a large common offset; values
    near bfloat16's max; mixed signs."""
    rng = np.random.default_rng(17)
    x = rng.uniform(-2, 2, size=(5, 8))
    x[1, 3] = 95.0                 # exp(95) overflows float32 too
    x[2] += 1e4                    # spacing 64 in bfloat16 at 1e4
    x[3, :] = -x[3, :]
    x[4] = [3e38, -3e38, 1e38, 1.0, -2.0, 3e38, 0.5, 2e38]
    return bf(x)


def softmax_cases():
    x = rows()
    xf = f64(x)
    m_ = xf.max(-1, keepdims=True)
    e = np.exp(xf - m_)
    s = e.sum(-1, keepdims=True)
    for op in ("Softmax", "LogSoftmax"):
        # not exp(x - lse): with two maxima at 3e38, lse = m + log 2 rounds to m in float64
        want = e / s if op == "Softmax" else (xf - m_) - np.log(s)
        m = model(op, [("x", BF, list(x.shape))], [("y", BF, list(x.shape))], {"axis": -1}, 18)
        # Softmax: 2 ulp of each probability plus a floor of 2 ulp of 2^-8 (exp(x - m) is
        # rounded before the sum); LogSoftmax: 2 ulp of (x - m) - log(sum), exact x - m.
        atol = 2 * ULP * 2.0 ** -8 if op == "Softmax" else SUB
        yield Case(op, "bfloat16_rows", m, {"x": x}, {"y": want}, 2 * ULP, float(atol),
                   "exp(x - m) / sum; x - m - log(sum exp(x - m)), m the row max (bfloat16)")


def reduce_cases():
    x = rows()
    xf = f64(x)
    axes = np.array([-1], np.int64)

    def lse(v):
        m = v.max(-1, keepdims=True)
        return m + np.log(np.exp(v - m).sum(-1, keepdims=True))

    defs = {
        "ReduceSum": (lambda v: v.sum(-1, keepdims=True), "sum (wide accumulation)"),
        "ReduceMean": (lambda v: v.mean(-1, keepdims=True), "mean (wide accumulation)"),
        "ReduceLogSumExp": (lse, "m + log(sum(exp(x - m))), m = max"),
        "ReduceMax": (lambda v: v.max(-1, keepdims=True), "max"),
        "ReduceL2": (lambda v: np.sqrt((v * v).sum(-1, keepdims=True)), "sqrt(sum x^2), scaled"),
    }
    for op, (fn, note) in defs.items():
        v = x
        if op == "ReduceL2":
            v = x[[0, 1, 2, 3]]  # a row near max would have an infinite norm in bfloat16
        with np.errstate(all="ignore"):
            want = fn(f64(v))
        m = model(op, [("x", BF, list(v.shape)), ("axes", TensorProto.INT64, [1])],
                  [("y", BF, [v.shape[0], 1])], {"keepdims": 1}, 18, inits={"axes": axes})
        rtol = 0.0 if op == "ReduceMax" else ULP
        atol = 0.0 if op == "ReduceMax" else SUB
        if op in ("ReduceSum", "ReduceMean"):
            # the last row's exact sum is a difference of values near max that cancels: a
            # wide accumulator is exact to its own rounding there, far below 1 bfloat16 ulp
            # of the row's largest magnitude.
            atol = float(2.0 ** -24 * 8 * np.abs(xf).max())
        yield Case(op, "bfloat16_rows", m, {"x": v}, {"y": want}, rtol, atol, note + " (bfloat16)")


def norm_cases():
    rng = np.random.default_rng(23)
    x = rng.uniform(-1, 1, size=(3, 16))
    x[1, 5] = 3e4                   # one spike: its square overflows nothing in f32, but
    x[2] += 1e3                     # a large offset (spacing 4 in bfloat16 at 1e3)
    x = bf(x)
    s = bf(rng.uniform(0.5, 1.5, 16))
    b = bf(rng.uniform(-0.5, 0.5, 16))
    xf = f64(x)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    want = (xf - mu) / np.sqrt(var + 1e-5) * f64(s) + f64(b)
    m = model("LayerNormalization", [("x", BF, [3, 16]), ("s", BF, [16]), ("b", BF, [16])],
              [("y", BF, [3, 16])], {"axis": -1, "epsilon": 1e-5}, 17)
    m.graph.initializer.extend([bf_init("s", s), bf_init("b", b)])
    del m.graph.input[1:]
    # stage one in f32 (stash_type 1), then `* scale + bias` in bfloat16 (two roundings):
    # 2 ulp of each value, plus 2 ulp of the largest |bias| for the last addition's rounding.
    yield Case("LayerNormalization", "bfloat16_offset_spike", m, {"x": x}, {"y": want},
               2 * ULP, float(2 * ULP * np.abs(f64(b)).max()),
               "stash_type 1: mean and centered variance in f32 (bfloat16)")


def matmul_cases():
    # Products near 1e38 that cancel (a bfloat16 partial sum may not overflow: 2e38 < max),
    # and an ordinary product whose exact result must be kept to 1 ulp (wide accumulation).
    a = bf([[1e19, 1e19, -1e19, 1.0]])
    b = bf([[1e19, 1.0], [1.0, 1.0], [1e19, 1.0], [1.0, 1.0]])
    want = base.exact_matmul(a, b)
    bound = 6 * 2.0 ** -24 * float((np.abs(f64(a)) @ np.abs(f64(b))).max())
    m = model("MatMul", [("a", BF, [1, 4]), ("b", BF, [4, 2])], [("y", BF, [1, 2])])
    yield Case("MatMul", "bfloat16_cancelling_large_terms", m, {"a": a, "b": b}, {"y": want}, ULP, bound,
               "sum of products accumulated in f32 (dot-product bound), finite (bfloat16)")
    rng = np.random.default_rng(29)
    a = bf(rng.uniform(-2, 2, size=(3, 32)))
    b = bf(rng.uniform(-2, 2, size=(32, 4)))
    want = base.exact_matmul(a, b)
    atol = 64 * 2.0 ** -24 * float((np.abs(f64(a)) @ np.abs(f64(b))).max())
    m = model("MatMul", [("a", BF, [3, 32]), ("b", BF, [32, 4])], [("y", BF, [3, 4])])
    yield Case("MatMul", "bfloat16_ordinary", m, {"a": a, "b": b}, {"y": want}, ULP, atol,
               "32-term dot products, accumulated in f32 and rounded once (bfloat16)")


def cast_cases():
    # 1 + 2^-8 is a tie (to even: 1); 1 + 2^-8 + 2^-23 is just above it (1 + 2^-7), which a
    # conversion that looks only at the top half of the f64 rounds as a tie.
    x = np.concatenate([base.EXTREMES_F32, np.array([3.3961e38, -3.3963e38, 1.00390625, 1.01171875,
                                                     1.0 + 2.0 ** -8 + 2.0 ** -23], np.float32)])
    m = model("Cast", [("x", TensorProto.FLOAT, [len(x)])], [("y", BF, [len(x)])], {"to": BF})
    yield Case("Cast", "float32_to_bfloat16", m, {"x": x}, {"y": f64(x)}, 0.0, 0.0,
               "round to nearest even bfloat16; +-inf from 3.3962e38 (max + half ulp) up")
    y = EXTREMES
    m = model("Cast", [("x", BF, [len(y)])], [("y", TensorProto.FLOAT, [len(y)])], {"to": TensorProto.FLOAT})
    yield Case("Cast", "bfloat16_to_float32", m, {"x": y}, {"y": f64(y)}, 0.0, 0.0, "exact widening")


def cases():
    for gen in (unary_cases, tiny_erf_cases, tiny_erf_cases_f32, binary_cases, softmax_cases, reduce_cases,
                norm_cases, matmul_cases, cast_cases):
        yield from gen()
