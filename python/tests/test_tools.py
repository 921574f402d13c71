"""rlx.lint, rlx.diverge, rlx.trace."""

import json

import numpy as np
import pytest

import rlx
from conftest import example


def test_lint_finds_constant_inf():
    f = rlx.lint(example("const_fold_inf"))
    assert len(f) == 1
    assert f[0].kind == "+inf" and f[0].label == "const.inv_zero" and f[0].op == "Div"
    assert f[0].fix and "division by zero" in f[0].fix
    assert repr(f[0]).startswith("rlx numeric-lint: %")


def test_lint_clean(healthy):
    assert rlx.lint(healthy) == []


def test_diverge_cpu_only_is_empty(healthy):
    assert rlx.diverge(healthy, devices=("cpu",)) == []
    assert rlx.diverge(healthy, devices=("cpu", "cpu")) == []


def test_diverge_default_compares_every_live_device(healthy):
    live = [d for d in rlx.available_devices() if d != "cpu"]
    assert [d.device for d in rlx.diverge(healthy)] == live


def test_absent_cuda_says_why(healthy):
    if "cuda" in rlx.available_devices():
        pytest.skip("CUDA is live here")
    with pytest.raises(rlx.DeviceError, match=r"device cuda is not available on this machine: .*\(available: cpu"):
        rlx.run(healthy, device="cuda")


def test_diverge_cpu_vs_wgpu_or_clear_error(healthy):
    if "wgpu" in rlx.available_devices():
        d = rlx.diverge(healthy, devices=("cpu", "wgpu"))
        assert len(d) == 1 and d[0].device == "wgpu"
        assert d[0].verdict in ("round-off", "suspect")
        assert d[0].verdict == "round-off", repr(d[0])
        assert d[0].max_rel <= d[0].tol_rel
        assert "wgpu vs cpu" in repr(d[0])
        # The line states how much of the model ran on the GPU (issue 30 item 6).
        assert 0 < d[0].nodes_on_device <= d[0].nodes_total, repr(d[0])
        assert f"({d[0].nodes_on_device}/{d[0].nodes_total} nodes on wgpu)" in repr(d[0])
    else:
        with pytest.raises(rlx.DeviceError, match="wgpu is not available on this machine"):
            rlx.diverge(healthy, devices=("cpu", "wgpu"))


def test_diverge_device_errors(healthy):
    with pytest.raises(rlx.DeviceError, match="unknown device type"):
        rlx.diverge(healthy, devices=("cpu", "tpu"))
    with pytest.raises(rlx.DeviceError, match="oracle"):
        rlx.diverge(healthy, devices=("wgpu", "cpu"))
    with pytest.raises(rlx.InputError, match="tol_rel"):
        rlx.diverge(healthy, devices=("cpu",), tol_rel=0.0)


def test_trace(masked, tmp_path):
    t = rlx.trace(masked, html=tmp_path / "t.html")
    assert len(t) > 5 and t[0]["op"] == "Input"
    f = t.first_nonfinite
    assert f is not None and f["label"] == "layer0.attn.mask_fill" and f["neg_inf"] > 0
    assert t.error is None
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") or "<svg" in page
    assert t.html == str(tmp_path / "t.html")
    assert json.loads(json.dumps(t.to_json()))["ops"][0]["index"] == 0
    assert "first non-finite value" in repr(t)


def test_trace_html_into_folder(healthy, tmp_path):
    t = rlx.trace(healthy, html=tmp_path)
    assert (tmp_path / "trace.html").is_file() and t.first_nonfinite is None


def test_trace_to_pandas(healthy):
    pd = pytest.importorskip("pandas")
    df = rlx.trace(healthy).to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert {"op", "label", "max_abs", "nan", "pos_inf", "neg_inf"} <= set(df.columns)
