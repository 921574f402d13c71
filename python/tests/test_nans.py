"""The NaN/Inf localizer from Python: debug_nans modes, RLX_DEBUG_NANS, reports."""

import numpy as np
import pytest

import rlx


def test_warn_names_the_culprit(masked, capsys):
    m = rlx.load(masked)
    out = m.run(debug_nans="warn")
    assert np.isnan(out["output"]).any()
    rep = m.last_report
    assert isinstance(rep, rlx.Report) and len(rep) >= 1
    r = rep.culprits[0]
    assert r.kind == "NaN" and r.culprit
    assert r.label == "layer0.attn.softmax" and r.source_op == "Softmax"
    assert r.fix and "masked" in r.fix
    assert r.counts["nan"] > 0 and r.where[0] == 1  # batch row 1 is fully masked
    assert r.module is None and r.file is None  # an ONNX model has no module path/line
    # Printed as the CLI prints it, and repr is the same text.
    err = capsys.readouterr().err
    assert 'rlx nan-check: NaN at index' in err and '"layer0.attn.softmax"' in err
    assert repr(rep).startswith("rlx nan-check: NaN at index")
    assert repr(r) == r.text


def test_true_is_warn_and_quiet(masked, capsys):
    m = rlx.load(masked)
    m.run(debug_nans=True, quiet=True)
    assert len(m.last_report) >= 1
    assert capsys.readouterr().err == ""


def test_off_reports_nothing(masked, monkeypatch):
    monkeypatch.delenv("RLX_DEBUG_NANS", raising=False)
    m = rlx.load(masked)
    out = m.run()
    assert np.isnan(out["output"]).any()
    assert len(m.last_report) == 0
    m.run(debug_nans=False)
    assert len(m.last_report) == 0


def test_env_switch_as_in_cli(masked, monkeypatch):
    monkeypatch.setenv("RLX_DEBUG_NANS", "1")
    m = rlx.load(masked)
    m.run(quiet=True)
    assert m.last_report.culprits[0].label == "layer0.attn.softmax"
    monkeypatch.setenv("RLX_DEBUG_NANS", "abort")
    with pytest.raises(rlx.NonFiniteError):
        m.run(quiet=True)
    # An explicit argument wins over the environment.
    m.run(debug_nans="off")
    assert len(m.last_report) == 0


def test_raise(masked):
    with pytest.raises(rlx.NonFiniteError) as ei:
        rlx.run(masked, debug_nans="raise", quiet=True)
    e = ei.value
    assert isinstance(e, rlx.RlxError)
    assert str(e).startswith("run stopped by RLX_DEBUG_NANS=abort at %")
    assert '"layer0.attn.softmax"' in str(e)
    assert e.report[-1].label == "layer0.attn.softmax" and e.report[-1].culprit


def test_strict_reports_inf_where_it_appears(masked):
    m = rlx.load(masked)
    m.run(debug_nans="strict", quiet=True)
    labels = [r.label for r in m.last_report]
    assert "layer0.attn.mask_fill" in labels  # the -inf, reported where it first appears


def test_inf_absorbed_gives_no_culprit():
    from conftest import example

    m = rlx.load(example("inf_absorbed"))
    out = m.run(debug_nans="warn", quiet=True)
    assert all(np.isfinite(v).all() for v in out.values())
    assert m.last_report.culprits == []


def test_bad_mode(masked):
    with pytest.raises(rlx.InputError, match="debug_nans"):
        rlx.run(masked, debug_nans="sometimes")
    with pytest.raises(rlx.InputError, match="debug_nans"):
        rlx.run(masked, debug_nans=3)
