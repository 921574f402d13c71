"""Stability cases for the long tail (helper C3 of issue 28).

Recurrent ops (RNN, GRU, LSTM) with saturating gate pre-activations, the signal ops (DFT,
STFT, the three windows, MelWeightMatrix), resampling (Resize, Upsample, GridSample,
AffineGrid, DeformConv, Col2Im, CenterCropPad), Det, RotaryEmbedding, the opset-27
streaming ops (CausalConvWithState, LinearAttention), the quantization family and
TfIdfVectorizer, plus Range and NonMaxSuppression (float arithmetic outside C1's and C2's
lists).

Every expected value is computed here in numpy float64 from the ONNX operator text (the
spec's formulas and function bodies), never from onnxruntime, onnx's reference evaluator or
RLX. Inputs are the issue's extremes where the op's exact result stays finite: +-88.8/+-89
and +-1e4 gate pre-activations, +-FLT_MAX samples that a naive `a + (b - a) * t` or a
running sum overflows, one large value among small ones, subnormals and signed zeros.
"""

import numpy as np

try:  # the generator puts scripts/stability on sys.path
    from common import Case, single_node_model
except ImportError:  # pragma: no cover - imported as a package
    from .common import Case, single_node_model

F32 = np.float32
F64 = np.float64
FMAX = float(np.finfo(np.float32).max)
TINY = float(np.finfo(np.float32).smallest_subnormal)


def _freeze(case, *names):
    """Move inputs `names` of a case into initializers (attributes-like parameters such as a
    window size, Resize's scales or NMS boxes that RLX needs at import time); returns case."""
    from onnx import numpy_helper

    g = case.model.graph
    keep = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(keep)
    for n in names:
        g.initializer.append(numpy_helper.from_array(case.inputs.pop(n), n))
    return case


def _sig(x):
    x = np.asarray(x, F64)
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


# ---------------------------------------------------------------- recurrent ops


def _gate_inputs(rng, seq, batch, inp, hidden, gates):
    """X, W, R, B whose gate pre-activations reach +-89 and +-1e4 (exact in f32)."""
    x = np.array(
        [[[1.0, -1.0, 0.5][: inp] for _ in range(batch)] for _ in range(seq)], F32
    )
    # weights picked so X.W lands on the extremes
    vals = [88.8, -89.0, 1e4, -1e4, 89.0, -88.8, 3.0, -0.0]
    w = np.array(
        [[[vals[(g * hidden + h + i) % len(vals)] * (1 if i == 0 else 0) for i in range(inp)]
          for g in range(gates) for h in range(hidden)]], F32)
    r = (rng.standard_normal((1, gates * hidden, hidden)) * 50).astype(F32)
    b = np.zeros((1, 2 * gates * hidden), F32)
    b[0, 0] = 1e4
    b[0, gates * hidden + 1] = -1e4
    return x, w, r, b


def _rnn_ref(x, w, r, b, act=np.tanh):
    seq, batch, _ = x.shape
    hid = r.shape[2]
    x, w, r, b = (a.astype(F64) for a in (x, w, r, b))
    h = np.zeros((batch, hid))
    ys = []
    for t in range(seq):
        h = act(x[t] @ w[0].T + h @ r[0].T + b[0, :hid] + b[0, hid:])
        ys.append(h)
    return np.stack(ys)[:, None], h[None]


def _gru_ref(x, w, r, b, lbr=0):
    seq, batch, _ = x.shape
    H = r.shape[2]
    x, w, r, b = (a.astype(F64) for a in (x, w, r, b))
    W = {g: w[0, i * H:(i + 1) * H] for i, g in enumerate("zrh")}
    R = {g: r[0, i * H:(i + 1) * H] for i, g in enumerate("zrh")}
    Wb = {g: b[0, i * H:(i + 1) * H] for i, g in enumerate("zrh")}
    Rb = {g: b[0, 3 * H + i * H:3 * H + (i + 1) * H] for i, g in enumerate("zrh")}
    h = np.zeros((batch, H))
    ys = []
    for t in range(seq):
        z = _sig(x[t] @ W["z"].T + h @ R["z"].T + Wb["z"] + Rb["z"])
        rr = _sig(x[t] @ W["r"].T + h @ R["r"].T + Wb["r"] + Rb["r"])
        if lbr:
            hh = np.tanh(x[t] @ W["h"].T + rr * (h @ R["h"].T + Rb["h"]) + Wb["h"])
        else:
            hh = np.tanh(x[t] @ W["h"].T + (rr * h) @ R["h"].T + Rb["h"] + Wb["h"])
        h = (1 - z) * hh + z * h
        ys.append(h)
    return np.stack(ys)[:, None], h[None]


def _lstm_ref(x, w, r, b):
    seq, batch, _ = x.shape
    H = r.shape[2]
    x, w, r, b = (a.astype(F64) for a in (x, w, r, b))
    W = {g: w[0, i * H:(i + 1) * H] for i, g in enumerate("iofc")}
    R = {g: r[0, i * H:(i + 1) * H] for i, g in enumerate("iofc")}
    Wb = {g: b[0, i * H:(i + 1) * H] for i, g in enumerate("iofc")}
    Rb = {g: b[0, 4 * H + i * H:4 * H + (i + 1) * H] for i, g in enumerate("iofc")}
    h = np.zeros((batch, H))
    c = np.zeros((batch, H))
    ys = []
    for t in range(seq):
        pre = {g: x[t] @ W[g].T + h @ R[g].T + Wb[g] + Rb[g] for g in "iofc"}
        i, o, f = _sig(pre["i"]), _sig(pre["o"]), _sig(pre["f"])
        c = f * c + i * np.tanh(pre["c"])
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)[:, None], h[None], c[None]


def _recurrent_cases():
    rng = np.random.default_rng(28)
    seq, batch, inp, H = 3, 2, 2, 4
    note = ("gates as 1/(1+exp(-x)) and tanh at pre-activations +-88.8, +-89, +-1e4: "
            "a tanh written (e^2x-1)/(e^2x+1) gives inf/inf = NaN")
    for op, gates, ref in (("RNN", 1, _rnn_ref), ("GRU", 3, _gru_ref), ("LSTM", 4, _lstm_ref)):
        x, w, r, b = _gate_inputs(rng, seq, batch, inp, H, gates)
        outs = ref(x, w, r, b)
        names = ["Y", "Y_h", "Y_c"][: len(outs)]
        oshapes = [(seq, 1, batch, H), (1, batch, H), (1, batch, H)]
        m = single_node_model(
            op,
            [("X", F32, x.shape), ("W", F32, w.shape), ("R", F32, r.shape), ("B", F32, b.shape)],
            [(n, F32, s) for n, s in zip(names, oshapes)],
            {"hidden_size": H},
            opset=14,
        )
        yield Case(op, "saturated_gates", m, dict(X=x, W=w, R=r, B=b),
                   dict(zip(names, outs)), rtol=1e-4, atol=1e-5, note=note)
    # GRU with linear_before_reset=1 (the other formulation of the candidate gate)
    x, w, r, b = _gate_inputs(rng, seq, batch, inp, H, 3)
    y, yh = _gru_ref(x, w, r, b, lbr=1)
    m = single_node_model(
        "GRU",
        [("X", F32, x.shape), ("W", F32, w.shape), ("R", F32, r.shape), ("B", F32, b.shape)],
        [("Y", F32, y.shape), ("Y_h", F32, yh.shape)],
        {"hidden_size": H, "linear_before_reset": 1}, opset=14)
    yield Case("GRU", "saturated_gates_lbr", m, dict(X=x, W=w, R=r, B=b), dict(Y=y, Y_h=yh),
               rtol=1e-4, atol=1e-5, note="linear_before_reset=1: r * (H R_h^T + Rb_h)")


# ---------------------------------------------------------------- signal ops


def _window(kind, n, periodic):
    N = n if periodic else n - 1
    k = np.arange(n, dtype=F64)
    a = 2 * np.pi * k / N
    if kind == "HannWindow":
        return np.sin(np.pi * k / N) ** 2
    if kind == "HammingWindow":
        return 25.0 / 46.0 - (1 - 25.0 / 46.0) * np.cos(a)
    return 0.42 - 0.5 * np.cos(a) + 0.08 * np.cos(2 * a)


def _signal_cases():
    from onnx import TensorProto  # noqa: F401

    for op in ("HannWindow", "HammingWindow", "BlackmanWindow"):
        for periodic in (1, 0):
            n = 4097
            m = single_node_model(op, [("size", np.int64, [])], [("y", F32, [n])],
                                  {"periodic": periodic}, opset=17)
            yield Case(op, f"n4097_periodic{periodic}", m, dict(size=np.array(n, np.int64)),
                       dict(y=_window(op, n, periodic)), rtol=1e-5, atol=2e-6,
                       note="cos(2 pi k / N) with k/N formed in float64 or exactly: "
                            "f32 2*pi*k loses the phase for large k")
    # DFT: one huge sample among small ones, mixed signs; real and complex input
    n = 16
    x = np.linspace(-1, 1, n).astype(F32)
    x[3] = 1e30
    x[7] = -3e37
    xin = x.reshape(1, n, 1)
    ex = np.fft.fft(x.astype(F64))
    exp = np.stack([ex.real, ex.imag], -1).reshape(1, n, 2)
    m = single_node_model("DFT", [("x", F32, [1, n, 1])], [("y", F32, [1, n, 2])],
                          {"axis": 1}, opset=17)
    yield Case("DFT", "huge_sample_real", m, dict(x=xin), dict(y=exp), rtol=1e-5,
               atol=1e-6 * 3e37,
               note="X[k] = sum_n x[n] exp(-2 pi i k n / N), twiddles from k*n mod N")
    # onesided, inverse on complex input holding FLT_MAX/2 components
    xc = np.zeros((1, 8, 2), F32)
    xc[0, 0] = [FMAX / 4, 0]
    xc[0, 1] = [-FMAX / 4, 1.0]
    xc[0, 5] = [1.0, FMAX / 8]
    z = xc[..., 0].astype(F64) + 1j * xc[..., 1].astype(F64)
    iz = np.fft.ifft(z[0])
    m = single_node_model("DFT", [("x", F32, [1, 8, 2])], [("y", F32, [1, 8, 2])],
                          {"axis": 1, "inverse": 1}, opset=17)
    yield Case("DFT", "inverse_near_max", m, dict(x=xc),
               dict(y=np.stack([iz.real, iz.imag], -1)[None]), rtol=1e-5, atol=1e-6 * FMAX / 4,
               note="inverse: (1/N) sum ..., the 1/N scale applied so partial sums of "
                    "FLT_MAX/4 terms stay finite")
    x = np.array([1e4, -1e4, 88.8, -89.0, 0.0, -0.0, TINY, 5.0], F32)
    ex = np.fft.rfft(x.astype(F64))
    m = single_node_model("DFT", [("x", F32, [1, 8, 1])], [("y", F32, [1, 5, 2])],
                          {"axis": 1, "onesided": 1}, opset=17)
    yield Case("DFT", "onesided_extremes", m, dict(x=x.reshape(1, 8, 1)),
               dict(y=np.stack([ex.real, ex.imag], -1)[None]), rtol=1e-5, atol=1e-2,
               note="onesided: the first N/2+1 bins")
    # STFT: frames of a signal with one large value
    sig = np.sin(np.arange(32) * 0.3).astype(F32)
    sig[10] = 1e20
    fl, step = 8, 4
    win = _window("HannWindow", fl, 1).astype(F32)
    nfr = 1 + (32 - fl) // step
    fr = np.stack([sig[i * step:i * step + fl].astype(F64) * win.astype(F64) for i in range(nfr)])
    sp = np.fft.rfft(fr, axis=-1)
    exp = np.stack([sp.real, sp.imag], -1)[None]
    m = single_node_model(
        "STFT", [("signal", F32, [1, 32, 1]), ("frame_step", np.int64, []),
                 ("window", F32, [fl])],
        [("y", F32, list(exp.shape))], {"onesided": 1}, opset=17)
    yield Case("STFT", "large_sample", m,
               dict(signal=sig.reshape(1, 32, 1), frame_step=np.array(step, np.int64), window=win),
               dict(y=exp), rtol=1e-5, atol=1e-6 * 1e20,
               note="frame * window then a onesided DFT per frame")
    # MelWeightMatrix (spec formula): integer bins, float64 hz<->mel
    nmel, dftl, sr, lo, hi = 8, 64, 16000, 0.0, 8000.0
    m = single_node_model(
        "MelWeightMatrix",
        [("num_mel_bins", np.int64, []), ("dft_length", np.int64, []),
         ("sample_rate", np.int64, []), ("lower_edge_hertz", F32, []),
         ("upper_edge_hertz", F32, [])],
        [("y", F32, [dftl // 2 + 1, nmel])], {}, opset=17)
    yield Case("MelWeightMatrix", "speech", m,
               dict(num_mel_bins=np.array(nmel, np.int64), dft_length=np.array(dftl, np.int64),
                    sample_rate=np.array(sr, np.int64), lower_edge_hertz=np.array(lo, F32),
                    upper_edge_hertz=np.array(hi, F32)),
               dict(y=_mel_ref(nmel, dftl, sr, lo, hi)), rtol=1e-5, atol=1e-6,
               note="triangles between mel points mapped to integer DFT bins (spec text)")


def _mel_ref(nmel, dftl, sr, lo, hi):
    """ONNX MelWeightMatrix (opset 17) operator text, in float64."""
    nspec = dftl // 2 + 1
    lo_mel = 2595 * np.log10(1 + lo / 700)
    hi_mel = 2595 * np.log10(1 + hi / 700)
    step = (hi_mel - lo_mel) / (nmel + 2)
    pts = lo_mel + np.arange(nmel + 2) * step
    hz = 700 * (10 ** (pts / 2595) - 1)
    bins = np.floor((dftl + 1) * hz / sr).astype(np.int64)
    out = np.zeros((nspec, nmel))
    for i in range(nmel):
        lo_b, c, hi_b = bins[i], bins[i + 1], bins[i + 2]
        lw = c - lo_b
        for j in range(lo_b, c + 1):
            if 0 <= j < nspec:
                out[j, i] = (j - lo_b) / lw if lw else 1.0
        rw = hi_b - c
        for j in range(c, hi_b):
            if 0 <= j < nspec:
                out[j, i] = (hi_b - j) / rw if rw else 1.0
    return out


# ---------------------------------------------------------------- resampling


def _lin_weights(out_n, in_n, scale):
    """half_pixel source coordinates and 2-tap linear weights (Resize opset 11+ text)."""
    res = []
    for o in range(out_n):
        xo = (o + 0.5) / scale - 0.5
        xo = min(max(xo, 0.0), in_n - 1)
        x0 = int(np.floor(xo))
        x1 = min(x0 + 1, in_n - 1)
        t = xo - x0
        res.append(((x0, 1 - t), (x1, t)))
    return res


def _resize_linear_1d(x, out_n, scale):
    x = x.astype(F64)
    return np.array([sum(x[i] * w for i, w in ws) for ws in _lin_weights(out_n, len(x), scale)])


def _cubic_coeffs(t, a=-0.75):
    def k(s):
        s = abs(s)
        if s <= 1:
            return (a + 2) * s ** 3 - (a + 3) * s ** 2 + 1
        if s < 2:
            return a * s ** 3 - 5 * a * s ** 2 + 8 * a * s - 4 * a
        return 0.0
    return [k(t + 1), k(t), k(1 - t), k(2 - t)]


def _resize_cubic_1d(x, out_n, scale):
    x = x.astype(F64)
    n = len(x)
    out = []
    for o in range(out_n):
        xo = (o + 0.5) / scale - 0.5
        x0 = int(np.floor(xo))
        cs = _cubic_coeffs(xo - x0)
        out.append(sum(c * x[min(max(x0 - 1 + j, 0), n - 1)] for j, c in enumerate(cs)))
    return np.array(out)


def _resample_cases():
    # linear between -FLT_MAX and FLT_MAX: exact midpoints finite, b - a overflows
    row = np.array([-FMAX, FMAX, FMAX, -1e4, 1e4, TINY, -0.0, 89.0], F32)
    x = row.reshape(1, 1, 1, 8)
    exp = _resize_linear_1d(row, 16, 2.0).reshape(1, 1, 1, 16)
    scales = np.array([1, 1, 1, 2], F32)
    m = single_node_model("Resize", [("X", F32, [1, 1, 1, 8]), ("roi", F32, [0]),
                                     ("scales", F32, [4])], [("Y", F32, [1, 1, 1, 16])],
                          {"mode": "linear"}, opset=13)
    yield Case("Resize", "linear_max_opposite", m,
               dict(X=x, roi=np.zeros(0, F32), scales=scales), dict(Y=exp), rtol=1e-6, atol=1e-30,
               note="x0*(1-t) + x1*t: the form x0 + (x1-x0)*t overflows on -FLT_MAX..FLT_MAX")
    row2 = np.array([FMAX, FMAX, FMAX, FMAX, -1e4, 1e4, 88.8, -89.0], F32)
    exp = _resize_cubic_1d(row2, 16, 2.0).reshape(1, 1, 1, 16)
    m = single_node_model("Resize", [("X", F32, [1, 1, 1, 8]), ("roi", F32, [0]),
                                     ("scales", F32, [4])], [("Y", F32, [1, 1, 1, 16])],
                          {"mode": "cubic"}, opset=13)
    yield Case("Resize", "cubic_flt_max_plateau", m,
               dict(X=row2.reshape(1, 1, 1, 8), roi=np.zeros(0, F32), scales=scales), dict(Y=exp),
               rtol=1e-5, atol=1e-2,
               note="cubic weights (a=-0.75) sum to 1; on a FLT_MAX plateau partial sums "
                    "exceed FLT_MAX unless the negative taps are added first or the sum is wider")
    row3 = np.array([-FMAX, FMAX, 1.0, -1.0], F32)
    m = single_node_model("Upsample", [("X", F32, [1, 1, 1, 4]), ("scales", F32, [4])],
                          [("Y", F32, [1, 1, 1, 8])], {"mode": "linear"}, opset=9)
    # Upsample-9 linear uses asymmetric coordinates: x_in = x_out / scale
    xs = np.arange(8) / 2.0
    x0 = np.floor(xs).astype(int)
    x1 = np.minimum(x0 + 1, 3)
    t = xs - x0
    r64 = row3.astype(F64)
    exp = (r64[x0] * (1 - t) + r64[x1] * t).reshape(1, 1, 1, 8)
    yield Case("Upsample", "linear_max_opposite", m,
               dict(X=row3.reshape(1, 1, 1, 4), scales=scales), dict(Y=exp), rtol=1e-6,
               note="asymmetric coordinates; x0*(1-t) + x1*t")
    # GridSample bilinear: sampling between -FLT_MAX and FLT_MAX
    img = np.array([[-FMAX, FMAX], [FMAX / 2, -1e4]], F32).reshape(1, 1, 2, 2)
    grid = np.array([[0.0, 0.0], [-0.5, -1.0], [1.0, 1.0], [0.25, -0.25]], F32).reshape(1, 1, 4, 2)
    exp = _grid_sample_bilinear(img[0, 0].astype(F64), grid[0, 0].astype(F64)).reshape(1, 1, 1, 4)
    m = single_node_model("GridSample", [("X", F32, [1, 1, 2, 2]), ("grid", F32, [1, 1, 4, 2])],
                          [("Y", F32, [1, 1, 1, 4])], {"mode": "linear", "align_corners": 0},
                          opset=20)
    yield Case("GridSample", "bilinear_max_opposite", m, dict(X=img, grid=grid), dict(Y=exp),
               rtol=1e-5, atol=1e-30, note="sum of w_ij * x_ij with zero padding outside")
    # AffineGrid: theta with large entries
    theta = np.array([[[1e4, -1e4, 88.8], [-89.0, 3e30, -3e30]]], F32)
    H, W = 3, 4
    ys = (2 * np.arange(H) + 1) / H - 1
    xs = (2 * np.arange(W) + 1) / W - 1
    base = np.stack(np.meshgrid(xs, ys), -1)  # [H, W, 2] (x, y)
    base = np.concatenate([base, np.ones((H, W, 1))], -1)
    exp = (base @ theta[0].astype(F64).T)[None]
    m = single_node_model("AffineGrid", [("theta", F32, [1, 2, 3]), ("size", np.int64, [4])],
                          [("grid", F32, [1, H, W, 2])], {"align_corners": 0}, opset=20)
    yield Case("AffineGrid", "large_theta", m,
               dict(theta=theta, size=np.array([1, 1, H, W], np.int64)), dict(grid=exp),
               rtol=1e-5, atol=1e-6 * 3e30,
               note="[x, y, 1] . theta^T with the base grid of align_corners=0")
    # Col2Im: overlapping patches that sum FLT_MAX/2 twice (exact = FLT_MAX), and +-1e4
    cols = np.zeros((1, 2, 3), F32)  # C*kh*kw=1*1*2, L=3 blocks of a 1x4 image, kernel 1x2
    cols[0, 0] = [1e4, FMAX / 2, -1e4]
    cols[0, 1] = [FMAX / 2, 88.8, 3.0]
    img = np.zeros(4)
    for l_ in range(3):
        for k in range(2):
            img[l_ + k] += cols[0, k, l_]
    m = single_node_model("Col2Im", [("input", F32, [1, 2, 3]), ("image_shape", np.int64, [2]),
                                     ("block_shape", np.int64, [2])],
                          [("output", F32, [1, 1, 1, 4])], {}, opset=18)
    yield Case("Col2Im", "overlap_sum", m,
               dict(input=cols, image_shape=np.array([1, 4], np.int64),
                    block_shape=np.array([1, 2], np.int64)),
               dict(output=img.reshape(1, 1, 1, 4)), rtol=1e-6,
               note="sum of overlapping blocks; FLT_MAX/2 + FLT_MAX/2 is finite")
    # CenterCropPad keeps values bit for bit, extremes included
    x = np.array([[-FMAX, FMAX, TINY], [-0.0, 1e4, -89.0]], F32)
    exp = np.zeros((4, 2))
    exp[1:3, :] = x.astype(F64)[:, 0:2]  # pad rows 1 before; crop cols from 0
    m = single_node_model("CenterCropPad", [("x", F32, [2, 3]), ("shape", np.int64, [2])],
                          [("y", F32, [4, 2])], {}, opset=18)
    yield Case("CenterCropPad", "extremes_kept", m,
               dict(x=x, shape=np.array([4, 2], np.int64)), dict(y=exp), rtol=0.0,
               note="crop/pad moves values; no arithmetic may touch them")
    # DeformConv with zero offsets and a 1x2 kernel: a plain conv over extreme inputs
    x = np.array([[-FMAX / 2, FMAX / 2, 1e4, -1e4, 89.0]], F32).reshape(1, 1, 1, 5)
    w = np.array([1.0, 1.0], F32).reshape(1, 1, 1, 2)
    off = np.zeros((1, 4, 1, 4), F32)
    xv = x.reshape(5).astype(F64)
    exp = (xv[:-1] + xv[1:]).reshape(1, 1, 1, 4)
    m = single_node_model("DeformConv", [("X", F32, [1, 1, 1, 5]), ("W", F32, [1, 1, 1, 2]),
                                         ("offset", F32, [1, 4, 1, 4])],
                          [("Y", F32, [1, 1, 1, 4])], {}, opset=19)
    yield Case("DeformConv", "zero_offsets_extremes", m, dict(X=x, W=w, offset=off),
               dict(Y=exp), rtol=1e-6, atol=1e-3,
               note="bilinear taps at integer positions weigh 1 and 0; 0 * FLT_MAX/2 stays 0")


def _grid_sample_bilinear(img, grid):
    H, W = img.shape
    out = []
    for gx, gy in grid:
        x = ((gx + 1) * W - 1) / 2
        y = ((gy + 1) * H - 1) / 2
        x0, y0 = int(np.floor(x)), int(np.floor(y))
        acc = 0.0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
                if 0 <= yy < H and 0 <= xx < W and wy * wx != 0:
                    acc += wy * wx * img[yy, xx]
        out.append(acc)
    return np.array(out)


# ---------------------------------------------------------------- linear algebra, rotary


def _det_cases():
    a = np.array([[[FMAX, FMAX], [1.0, 2.0]],
                  [[3e38, 1.0], [1.0, 0.0]],
                  [[1e20, 1e20], [1e-20, 2e-20]]], F32)
    exp = np.array([np.linalg.det(m.astype(F64)) for m in a])
    exp[0] = FMAX  # exact: FMAX*2 - FMAX*1
    exp[1] = -1.0
    exp[2] = float(F64(F32(1e20)) * F64(F32(2e-20)) - F64(F32(1e20)) * F64(F32(1e-20)))
    m = single_node_model("Det", [("X", F32, [3, 2, 2])], [("Y", F32, [3])], {}, opset=11)
    yield Case("Det", "huge_pivots", m, dict(X=a), dict(Y=exp), rtol=1e-5,
               note="LU with partial pivoting: a*d - b*c overflows on [[FMAX,FMAX],[1,2]]")
    b = np.array([[1e20, 0, 0], [0, 1e-20, 0], [0, 0, -89.0]], F32)
    eb = float(F64(F32(1e20)) * F64(F32(1e-20)) * -89.0)
    m = single_node_model("Det", [("X", F32, [3, 3])], [("Y", F32, [])], {}, opset=11)
    yield Case("Det", "scaled_diagonal", m, dict(X=b), dict(Y=np.array(eb)), rtol=1e-5,
               note="product of pivots 1e20 * 1e-20 * -89")


def _rotary_cases():
    B, Hh, S, D = 1, 1, 3, 4
    x = np.array([FMAX / 2, 1e4, -FMAX / 2, -89.0,
                  FMAX, FMAX, 88.8, TINY,
                  -1e4, 0.0, -0.0, 1e4], F32).reshape(B, Hh, S, D)
    ang = np.array([[0.0, 0.0], [np.pi / 4, 1.0], [3.0, -2.0]])
    cos = np.cos(ang).astype(F32)
    sin = np.sin(ang).astype(F32)
    pos = np.arange(S, dtype=np.int64).reshape(B, S)
    xf = x.astype(F64)
    c = cos.astype(F64)[pos][:, None]
    s = sin.astype(F64)[pos][:, None]
    x1, x2 = xf[..., :D // 2], xf[..., D // 2:]
    exp = np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)
    m = single_node_model("RotaryEmbedding",
                          [("X", F32, [B, Hh, S, D]), ("cos_cache", F32, [S, D // 2]),
                           ("sin_cache", F32, [S, D // 2]), ("position_ids", np.int64, [B, S])],
                          [("Y", F32, [B, Hh, S, D])], {}, opset=23)
    yield Case("RotaryEmbedding", "near_max_pairs", m,
               dict(X=x, cos_cache=cos, sin_cache=sin, position_ids=pos), dict(Y=exp),
               rtol=1e-5, atol=1e-6 * FMAX,
               note="x1*cos - x2*sin, x1*sin + x2*cos; a FLT_MAX pair rotated by pi/4 stays "
                    "finite only when each product is rounded before the sum (exact: sqrt(2)*FMAX "
                    "overflows for the + lane, which the case expects as +inf)")


# ---------------------------------------------------------------- streaming (opset 27)


def _ssm_cases():
    x = np.array([[[1e4, -1e4, 89.0, -89.0, FMAX / 2, FMAX / 2]]], F32)  # [1, 1, 6]
    w = np.array([[[1.0, 1.0]]], F32)  # [C=1, 1, k=2]
    xp = np.concatenate([[0.0], x[0, 0].astype(F64)])
    y = xp[:-1] + xp[1:]
    m = single_node_model("CausalConvWithState", [("X", F32, [1, 1, 6]), ("W", F32, [1, 1, 2])],
                          [("Y", F32, [1, 1, 6]), ("present_state", F32, [1, 1, 1])], {},
                          opset=27)
    yield Case("CausalConvWithState", "extremes", m, dict(X=x, W=w),
               dict(Y=y.reshape(1, 1, 6), present_state=np.array([[[FMAX / 2]]])), rtol=1e-6,
               note="causal depthwise conv over [zeros(k-1), x]; FMAX/2 + FMAX/2 is finite")
    ys = y * _sig(y)
    m = single_node_model("CausalConvWithState", [("X", F32, [1, 1, 6]), ("W", F32, [1, 1, 2])],
                          [("Y", F32, [1, 1, 6]), ("present_state", F32, [1, 1, 1])],
                          {"activation": "silu"}, opset=27)
    yield Case("CausalConvWithState", "silu_extremes", m, dict(X=x, W=w),
               dict(Y=ys.reshape(1, 1, 6), present_state=np.array([[[FMAX / 2]]])), rtol=1e-5,
               note="silu(y) = y * sigmoid(y) at y = +-1e4, +-89, FMAX: never y/(1+exp(-y)) "
                    "with exp(-y) = inf times y")
    # LinearAttention, update_rule linear: S_t = S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t
    T, dk, dv = 2, 2, 2
    q = np.array([[[1e-18, -1e-18], [1e-18, 88.8e-20]]], F32)
    k = np.array([[[1e18, -1e4], [89.0, 1e18]]], F32)
    v = np.array([[[1e18, -89.0], [-1e4, 1e18]]], F32)
    S = np.zeros((dk, dv))
    outs = []
    scale = 1 / np.sqrt(dk)
    for t in range(T):
        S = S + np.outer(k[0, t].astype(F64), v[0, t].astype(F64))
        outs.append(scale * (q[0, t].astype(F64) @ S))
    m = single_node_model("LinearAttention",
                          [("Q", F32, [1, T, dk]), ("K", F32, [1, T, dk]), ("V", F32, [1, T, dv])],
                          [("Y", F32, [1, T, dv]), ("present_state", F32, [1, 1, dk, dv])],
                          {"update_rule": "linear", "q_num_heads": 1, "kv_num_heads": 1}, opset=27)
    yield Case("LinearAttention", "linear_large_state", m, dict(Q=q, K=k, V=v),
               dict(Y=np.array(outs)[None], present_state=S[None, None]), rtol=1e-5,
               atol=1e-6 * 1e36 * 1e-18,
               note="outer products of 1e18 keys and values (state 1e36) read by 1e-18 queries")


# ---------------------------------------------------------------- quantization


def _rne(v):
    return np.round(np.asarray(v, F64))  # numpy rounds half to even


def _quant_cases():
    x = np.array([FMAX, -FMAX, 1e4, -1e4, 2.5, -2.5, 0.5, TINY, 0.0, -0.0, 88.8, -89.0], F32)
    sc = np.array(0.5, F32)
    zp = np.array(-3, np.int8)
    y = np.clip(_rne(x.astype(F64) / 0.5) - 3, -128, 127)
    m = single_node_model("QuantizeLinear", [("x", F32, [12]), ("s", F32, []), ("zp", np.int8, [])],
                          [("y", np.int8, [12])], {}, opset=19)
    yield Case("QuantizeLinear", "saturate_extremes", m, dict(x=x, s=sc, zp=zp), dict(y=y),
               rtol=0.0, note="clamp(round_half_even(x / s) + zp): FLT_MAX saturates, 2.5 -> 2")
    sub = np.array(1e-40, F32)  # subnormal scale: x * (1/s) is 0 * inf = NaN at x = 0
    xs = np.array([0.0, -0.0, 1e-44, -1e-44, 1.0], F32)
    ys = np.clip(_rne(xs.astype(F64) / F64(sub)), 0, 255)
    m = single_node_model("QuantizeLinear", [("x", F32, [5]), ("s", F32, []),
                                             ("zp", np.uint8, [])],
                          [("y", np.uint8, [5])], {}, opset=19)
    yield Case("QuantizeLinear", "subnormal_scale", m,
               dict(x=xs, s=sub, zp=np.array(0, np.uint8)), dict(y=ys), rtol=0.0,
               note="divide by the scale; 1/1e-40 overflows f32, so x * (1/s) gives 0*inf = NaN")
    xq = np.array([127, -128, 0, 1, -1], np.int8)
    dq = (xq.astype(F64) - (-128)) * F64(F32(1e36))
    m = single_node_model("DequantizeLinear", [("x", np.int8, [5]), ("s", F32, []),
                                               ("zp", np.int8, [])],
                          [("y", F32, [5])], {}, opset=19)
    yield Case("DequantizeLinear", "wide_difference", m,
               dict(x=xq, s=np.array(1e36, F32), zp=np.array(-128, np.int8)), dict(y=dq),
               rtol=1e-6, note="(x - zp) * s with x - zp in int32/float: 127 - (-128) = 255 "
                               "wraps in int8; 255e36 is finite in f32")
    xd = np.array([FMAX, -FMAX, 0.0, 1e37, -3e38, TINY], F32)
    lo = min(0.0, float(xd.astype(F64).min()))
    hi = max(0.0, float(xd.astype(F64).max()))
    scale = (hi - lo) / 255.0
    zpd = np.clip(_rne(0 - lo / scale), 0, 255)
    yd = np.clip(_rne(xd.astype(F64) / scale) + zpd, 0, 255)
    m = single_node_model("DynamicQuantizeLinear", [("x", F32, [6])],
                          [("y", np.uint8, [6]), ("y_scale", F32, []),
                           ("y_zero_point", np.uint8, [])], {}, opset=11)
    yield Case("DynamicQuantizeLinear", "full_f32_range", m, dict(x=xd),
               dict(y=yd, y_scale=np.array(scale), y_zero_point=np.array(zpd)), rtol=1e-6,
               atol=1.0,
               note="scale = (max(0,max x) - min(0,min x)) / 255: FMAX - (-FMAX) overflows f32, "
                    "the exact scale 2*FMAX/255 does not (one quantum of slack for the f32 scale "
                    "at the +-127.5 ties)")
    # MatMulInteger: integer only, extremes of uint8 x int8 with zero points
    a = np.array([[255, 0, 255], [0, 255, 128]], np.uint8)
    b = np.array([[-128, 127], [-128, -128], [-128, 127]], np.int8)
    azp, bzp = np.array(3, np.uint8), np.array(-1, np.int8)
    ref = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 1)
    m = single_node_model("MatMulInteger", [("A", np.uint8, [2, 3]), ("B", np.int8, [3, 2]),
                                            ("a_zero_point", np.uint8, []),
                                            ("b_zero_point", np.int8, [])],
                          [("Y", np.int32, [2, 2])], {}, opset=10)
    yield Case("MatMulInteger", "extremes", m,
               dict(A=a, B=b, a_zero_point=azp, b_zero_point=bzp), dict(Y=ref.astype(F64)),
               rtol=0.0, note="int32 accumulation of (a - azp)(b - bzp)")
    # QLinearMatMul: a_scale * b_scale overflows f32, the combined multiplier does not
    a = np.array([[1, 2], [3, 0]], np.uint8)
    b = np.array([[1, 0], [1, 1]], np.int8)
    sa, sb, sy = F32(1e20), F32(1e20), F32(3e38)
    acc = a.astype(F64) @ b.astype(F64)
    mult = F64(sa) * F64(sb) / F64(sy)
    yq = np.clip(_rne(acc * mult) + 10, 0, 255)
    m = single_node_model("QLinearMatMul",
                          [("a", np.uint8, [2, 2]), ("a_scale", F32, []), ("a_zp", np.uint8, []),
                           ("b", np.int8, [2, 2]), ("b_scale", F32, []), ("b_zp", np.int8, []),
                           ("y_scale", F32, []), ("y_zp", np.uint8, [])],
                          [("y", np.uint8, [2, 2])], {}, opset=10)
    yield Case("QLinearMatMul", "scale_product_overflow", m,
               dict(a=a, a_scale=np.array(sa), a_zp=np.array(0, np.uint8), b=b,
                    b_scale=np.array(sb), b_zp=np.array(0, np.int8), y_scale=np.array(sy),
                    y_zp=np.array(10, np.uint8)), dict(y=yq), rtol=0.0,
               note="round(acc * (sa*sb/sy)) + zp: sa*sb = 1e40 is inf in f32, the ratio is 0.33")
    # ConvInteger: 1x1 input channel, kernel 2, extremes of the ranges
    xc = np.array([255, 0, 255, 128], np.uint8).reshape(1, 1, 1, 4)
    wc = np.array([-128, 127], np.int8).reshape(1, 1, 1, 2)
    xv = xc.reshape(4).astype(np.int64) - 1
    wv = wc.reshape(2).astype(np.int64)
    yc = np.array([xv[i] * wv[0] + xv[i + 1] * wv[1] for i in range(3)], F64).reshape(1, 1, 1, 3)
    m = single_node_model("ConvInteger", [("x", np.uint8, [1, 1, 1, 4]), ("w", np.int8, [1, 1, 1, 2]),
                                          ("x_zero_point", np.uint8, [])],
                          [("y", np.int32, [1, 1, 1, 3])], {}, opset=10)
    yield Case("ConvInteger", "extremes", m,
               dict(x=xc, w=wc, x_zero_point=np.array(1, np.uint8)), dict(y=yc), rtol=0.0,
               note="int32 accumulation of (x - xzp) * w")
    # QLinearConv with the same scale-product overflow
    xq = np.array([1, 2, 3, 0], np.uint8).reshape(1, 1, 1, 4)
    wq = np.array([1, 1], np.int8).reshape(1, 1, 1, 2)
    accc = np.array([1 + 2, 2 + 3, 3 + 0], F64)
    yqc = np.clip(_rne(accc * mult) + 10, 0, 255).reshape(1, 1, 1, 3)
    m = single_node_model("QLinearConv",
                          [("x", np.uint8, [1, 1, 1, 4]), ("x_scale", F32, []), ("x_zp", np.uint8, []),
                           ("w", np.int8, [1, 1, 1, 2]), ("w_scale", F32, []), ("w_zp", np.int8, []),
                           ("y_scale", F32, []), ("y_zp", np.uint8, [])],
                          [("y", np.uint8, [1, 1, 1, 3])], {}, opset=10)
    yield Case("QLinearConv", "scale_product_overflow", m,
               dict(x=xq, x_scale=np.array(sa), x_zp=np.array(0, np.uint8), w=wq,
                    w_scale=np.array(sb), w_zp=np.array(0, np.int8), y_scale=np.array(sy),
                    y_zp=np.array(10, np.uint8)), dict(y=yqc), rtol=0.0,
               note="round(acc * (xs*ws/ys)) + zp with xs*ws = 1e40 beyond f32")


# ---------------------------------------------------------------- text, range, detection


def _misc_cases():
    X = np.array([2, 3, 3, 2, 3, 7], np.int64)
    m = single_node_model("TfIdfVectorizer", [("X", np.int64, [6])], [("Y", F32, [2])],
                          dict(max_gram_length=1, min_gram_length=1, max_skip_count=0,
                               mode="TFIDF", ngram_counts=[0], ngram_indexes=[0, 1],
                               pool_int64s=[2, 3], weights=[1e38, 3.0]), opset=9)
    yield Case("TfIdfVectorizer", "large_weight", m, dict(X=X),
               dict(Y=np.array([2 * F64(F32(1e38)), 3 * 3.0])), rtol=1e-6,
               note="count * weight: 2 * 1e38 is finite in f32")
    m = single_node_model("Range", [("start", F32, []), ("limit", F32, []), ("delta", F32, [])],
                          [("y", F32, [4])], {}, opset=11)
    st, dl = F32(-FMAX), F32(FMAX / 2)
    yield Case("Range", "full_span", m,
               dict(start=np.array(st), limit=np.array(F32(FMAX)), delta=np.array(dl)),
               dict(y=F64(st) + np.arange(4) * F64(dl)), rtol=1e-6, atol=1e-6 * FMAX,
               note="n = ceil((limit - start) / delta): limit - start overflows f32; "
                    "y_i = start + i * delta")
    boxes = np.array([[[-FMAX / 2, -FMAX / 2, FMAX / 2, FMAX / 2],
                       [-FMAX / 2, -FMAX / 2, FMAX / 2, FMAX / 2],
                       [0.0, 0.0, 1.0, 1.0]]], F32)
    scores = np.array([[[0.9, 0.8, 0.7]]], F32)
    m = single_node_model("NonMaxSuppression",
                          [("boxes", F32, [1, 3, 4]), ("scores", F32, [1, 1, 3]),
                           ("max_output_boxes_per_class", np.int64, [1]),
                           ("iou_threshold", F32, [1])],
                          [("selected_indices", np.int64, [2, 3])], {}, opset=11)
    yield Case("NonMaxSuppression", "huge_boxes", m,
               dict(boxes=boxes, scores=scores, max_output_boxes_per_class=np.array([10], np.int64),
                    iou_threshold=np.array([0.5], F32)),
               dict(selected_indices=np.array([[0, 0, 0], [0, 0, 2]], F64)), rtol=0.0,
               note="IoU = inter / (area_a + area_b - inter): areas of FMAX-wide boxes are inf in "
                    "f32 and inf/inf = NaN keeps a duplicate; exact IoU is 1")


def _scatter_cases():
    """ScatterElements / ScatterND with reduction add and mul: float arithmetic on data."""
    data = np.array([FMAX / 2, 1e20, -1e4, TINY], F32)
    idx = np.array([0, 1, 1, 3], np.int64)
    upd = np.array([FMAX / 2, 1e-20, 3.0, TINY], F32)
    d64, u64 = data.astype(F64), upd.astype(F64)
    for red in ("add", "mul"):
        e = d64.copy()
        for i, u in zip(idx, u64):
            e[i] = e[i] + u if red == "add" else e[i] * u
        for op, ishape in (("ScatterElements", [4]), ("ScatterND", [4, 1])):
            m = single_node_model(op, [("data", F32, [4]), ("indices", np.int64, ishape),
                                       ("updates", F32, [4])], [("y", F32, [4])],
                                  {"reduction": red} if op == "ScatterND" else
                                  {"reduction": red, "axis": 0}, opset=18)
            yield Case(op, f"reduction_{red}", m,
                       dict(data=data, indices=idx.reshape(ishape), updates=upd), dict(y=e),
                       rtol=1e-6, note=f"data[i] {'+' if red == 'add' else '*'}= update, in "
                       "order; FMAX/2 + FMAX/2 is finite, 1e20 * 1e-20 * 3 is 3")


def _f16_cases():
    """float16 inputs at +-65504 / +-65520 (rounds to inf in f16, so not used as a value)."""
    F16 = np.float16
    row = np.array([-65504, 65504, 65504, -1e4, 1e4, 6e-8, -0.0, 89.0], F16)
    x = row.reshape(1, 1, 1, 8)
    scales = np.array([1, 1, 1, 2], F32)
    for mode, ref in (("linear", _resize_linear_1d), ("cubic", _resize_cubic_1d)):
        m = single_node_model("Resize", [("X", F16, [1, 1, 1, 8]), ("roi", F32, [0]),
                                         ("scales", F32, [4])], [("Y", F16, [1, 1, 1, 16])],
                              {"mode": mode}, opset=13)
        exp = ref(row, 16, 2.0).reshape(1, 1, 1, 16)
        # f16 output: where the exact value exceeds 65504 by less than half an ulp it rounds
        # to 65504, the runner rounds `exp` to f16 first
        yield Case("Resize", f"{mode}_f16_max_opposite", m,
                   dict(X=x, roi=np.zeros(0, F32), scales=scales), dict(Y=exp),
                   rtol=1e-3, atol=1e-7,
                   note="f16 +-65504 neighbours: x0*(1-t) + x1*t; cubic accumulates wider")
    x, w, r, b = _gate_inputs(np.random.default_rng(16), 2, 1, 2, 2, 4)
    x, w, r, b = (a.astype(F16) for a in (x, w, r, b))
    y, yh, yc = _lstm_ref(x, w, r, b)
    m = single_node_model(
        "LSTM", [("X", F16, x.shape), ("W", F16, w.shape), ("R", F16, r.shape),
                 ("B", F16, b.shape)],
        [("Y", F16, y.shape), ("Y_h", F16, yh.shape), ("Y_c", F16, yc.shape)],
        {"hidden_size": 2}, opset=14)
    yield Case("LSTM", "saturated_gates_f16", m, dict(X=x, W=w, R=r, B=b),
               dict(Y=y, Y_h=yh, Y_c=yc), rtol=2e-3, atol=1e-3,
               note="f16 gates at +-1e4 pre-activation: sigmoid/tanh saturate, no inf/inf")


# Inputs RLX must know at import time (it sizes outputs or plans the op from them): they go
# into the model as initializers. NonMaxSuppression's boxes and scores are data, frozen because
# RLX evaluates NMS at import time; its IoU arithmetic is still RLX's.
FROZEN = {
    "HannWindow": ("size",),
    "HammingWindow": ("size",),
    "BlackmanWindow": ("size",),
    "STFT": ("frame_step",),
    "MelWeightMatrix": ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                        "upper_edge_hertz"),
    "Resize": ("roi", "scales"),
    "Upsample": ("scales",),
    "AffineGrid": ("size",),
    "Col2Im": ("image_shape", "block_shape"),
    "CenterCropPad": ("shape",),
    "Range": ("start", "limit", "delta"),
    "NonMaxSuppression": ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold"),
}


def cases():
    """All C3 cases (see the module doc)."""
    for gen in (_recurrent_cases, _signal_cases, _resample_cases, _det_cases, _rotary_cases,
                _ssm_cases, _quant_cases, _misc_cases, _scatter_cases, _f16_cases):
        for c in gen():
            yield _freeze(c, *FROZEN.get(c.op, ()))
