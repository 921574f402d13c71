"""rlx.debug on torch modules (torch.export -> .pt2 -> rlx).

Needs torch (skipped, naming why, when it is not importable); the `.pt2` importer
(crates/rlx-torch-import) is part of the package.
"""

import os

import numpy as np
import pytest

import rlx

torch = pytest.importorskip("torch")


class LayerNormEps0(torch.nn.Module):
    """LayerNorm with eps=0 on a row of zeros: 0/sqrt(0) = NaN."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8, eps=0.0)

    def forward(self, x):
        return self.norm(x)  # NAN_LINE_LAYERNORM


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        return torch.log(h - h) * 0.0  # NAN_LINE_LOG: log(0) = -inf, then -inf * 0 = NaN


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.out = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.out(torch.relu(self.block(x)))


def _line(tag):
    with open(__file__) as f:
        for k, line in enumerate(f, 1):
            if tag in line and "def _line" not in line and "_line(" not in line:
                return k
    raise AssertionError(tag)


@pytest.fixture
def needs_pt2():
    """The `.pt2` importer is part of the package: these tests never skip for it."""


def test_export_half(tmp_path):
    """The Python side up to the export: a .pt2 written, arrays keyed by forward's parameter names."""
    from rlx import _export_and_save

    p = str(tmp_path / "m.pt2")
    x = torch.randn(3, 8)
    ep, feeds = _export_and_save(Net(), (x,), None, None, None, p)
    assert os.path.getsize(p) > 0
    assert list(feeds) == ["x"] and feeds["x"] is x
    # dtype casts a copy of the module and the float args.
    m = Net()
    ep, feeds = _export_and_save(m, (x,), None, torch.float16, None, str(tmp_path / "h.pt2"))
    assert feeds["x"].dtype == torch.float16
    assert m.out.weight.dtype == torch.float32


def test_debug_rejects_non_module():
    with pytest.raises(rlx.InputError, match="torch.nn.Module"):
        rlx.debug(lambda x: x, (torch.zeros(1),))
    with pytest.raises(rlx.InputError, match="mode"):
        rlx.debug(Net(), (torch.zeros(1, 8),), mode="loud")


def test_debug_names_module_and_line(needs_pt2):
    rep = rlx.debug(Net(), (torch.randn(3, 8),))
    c = rep.culprits
    assert c, repr(rep)
    first = c[0]
    assert first.module == "block", repr(rep)
    assert first.file and os.path.basename(first.file) == os.path.basename(__file__)
    assert first.line == _line("NAN_LINE_LOG")
    assert "torch.log" in (first.code or "")
    # Nothing downstream (the relu, the out projection) is blamed.
    assert all(r.module in ("block", None) or not r.culprit for r in rep)
    assert f"{os.path.basename(__file__)}:{first.line}" in repr(rep)


def test_debug_layernorm_eps0(needs_pt2):
    x = torch.randn(4, 8)
    x[2] = 0.0
    rep = rlx.debug(LayerNormEps0(), (x,))
    c = rep.culprits[0]
    assert c.kind == "NaN" and c.module == "norm"
    assert c.file is not None and c.line is not None
    # The innermost frame may be torch's own LayerNorm.forward; when it is ours, the line is.
    if os.path.basename(c.file) == os.path.basename(__file__):
        assert c.line == _line("NAN_LINE_LAYERNORM")
    assert c.where[0] == 2


def test_debug_raise(needs_pt2):
    with pytest.raises(rlx.NonFiniteError) as ei:
        rlx.debug(Net(), (torch.randn(3, 8),), mode="raise")
    assert ei.value.report[-1].module == "block"


def test_debug_clean_module(needs_pt2):
    rep = rlx.debug(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    assert rep.ok and len(rep) == 0
    assert "no NaN or Inf" in repr(rep)


def test_debug_float16_overflow(needs_pt2):
    class Grow(torch.nn.Module):
        def forward(self, x):
            return x * 60000.0 * 4.0  # overflows float16 (max 65504)

    rep = rlx.debug(Grow(), (torch.ones(2, 2),), dtype=torch.float16, mode="strict")
    assert any(r.kind == "+inf" and r.culprit for r in rep), repr(rep)


def test_dynamic_dims_with_a_minimum(tmp_path):
    """`Dim.AUTO` and `Dim(min=2)` programs load without inputs (their dims start at the
    range's minimum, not 1), run at any size in range, and refuse one outside it."""
    lin = torch.nn.Linear(4, 3)
    rep = rlx.debug(lin, (torch.randn(5, 4),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert rep.ok, repr(rep)
    b = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(lin, (torch.randn(5, 4),), dynamic_shapes=({0: b},))
    p = tmp_path / "dyn.pt2"
    torch.export.save(ep, str(p))
    m = rlx.load(p)
    for n in (2, 10, 64):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        want = lin(torch.from_numpy(x)).detach().numpy()
        got = rlx.run(p, {"input": x})["output_0"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(m.run({"input": x})["output_0"], want, rtol=1e-4, atol=1e-6)
    with pytest.raises(rlx.ModelError, match=r"outside the range \[2, 64\]"):
        rlx.run(p, {"input": np.zeros((65, 4), np.float32)})
