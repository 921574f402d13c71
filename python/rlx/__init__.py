"""RLX from Python: run a model on NumPy arrays and find out why its numbers are wrong.

* :func:`run` runs an ONNX model, a ``torch.export`` archive (``.pt2``), a model folder or
  an ``.rlxpkg`` package on NumPy arrays (or ``torch.Tensor``), optionally with the NaN/Inf
  localizer on (``debug_nans``, as ``RLX_DEBUG_NANS`` in the CLI).
* :func:`debug` exports a ``torch.nn.Module`` with ``torch.export``, runs it with the localizer
  on and returns a :class:`Report`: the op that created each NaN/Inf, its module path and the
  line of your code.
* :func:`lint` (constants that fold to NaN/Inf), :func:`diverge` (every backend against the
  CPU, first diverging node) and :func:`trace` (per-op statistics, HTML report).
* :func:`reduce` (``rlx reduce``: cut a model down to the smallest repro that still fails the
  same way) and :func:`precision` (``rlx precision``: the few nodes to keep in float32 for a
  float16/bfloat16 model; writes that model).

Every error is an :class:`RlxError` (:class:`ModelError`, :class:`InputError`,
:class:`DeviceError`, :class:`NonFiniteError`; :class:`UsageError`, also a ``ValueError``,
for a bad argument to :func:`reduce` / :func:`precision`) whose message is the CLI's one line.
The environment switches of the CLI (``RLX_DEBUG_NANS``, ``RLX_LINT_NUMERICS``,
``RLX_RUNTIME_CHECK_INPUTS``, ``RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER``, ``RAYON_NUM_THREADS``,
...) work the same here; ``rlx env`` lists them.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import DeviceError, InputError, ModelError, RlxError, UsageError

__version__: str = _native.__version__

__all__ = [
    "run",
    "load",
    "lint",
    "diverge",
    "trace",
    "reduce",
    "precision",
    "debug",
    "available_devices",
    "Model",
    "TensorInfo",
    "Report",
    "NanReport",
    "Finding",
    "Divergence",
    "Trace",
    "PrecisionResult",
    "KeptNode",
    "RlxError",
    "ModelError",
    "InputError",
    "DeviceError",
    "NonFiniteError",
    "UsageError",
]

PathLike = Union[str, "os.PathLike[str]"]


class NonFiniteError(RlxError):
    """A run with ``debug_nans="abort"`` (``mode="raise"`` in :func:`debug`) stopped at the
    first op that created a NaN (or, at the end, an Inf that reached an output).

    The message is the CLI's line (``run stopped by RLX_DEBUG_NANS=abort at %12 Div "..."``);
    ``.report`` is the :class:`Report`, whose last entry names that op.
    """

    def __init__(self, message: str, report: "Report"):
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------------------
# dtypes

# NumPy dtype name -> rlx dtype name, and the plain NumPy dtype the data crosses as.
_TO_RLX: Dict[str, Tuple[str, Optional[str]]] = {
    "float32": ("f32", None),
    "float64": ("f64", None),
    "float16": ("f16", "uint16"),
    "bfloat16": ("bf16", "uint16"),
    "int64": ("i64", None),
    "int32": ("i32", None),
    "int16": ("i16", None),
    "int8": ("i8", None),
    "uint8": ("u8", None),
    "uint16": ("u16", None),
    "uint32": ("u32", None),
    "uint64": ("u64", None),
    "bool": ("bool", None),
    "float8_e4m3fn": ("f8e4m3fn", "uint8"),
    "float8_e4m3fnuz": ("f8e4m3fnuz", "uint8"),
    "float8_e5m2": ("f8e5m2", "uint8"),
    "float8_e5m2fnuz": ("f8e5m2fnuz", "uint8"),
    "float8_e8m0fnu": ("f8e8m0", "uint8"),
}

# rlx dtype name -> NumPy dtype name (what Model.inputs / outputs report).
_TO_NUMPY: Dict[str, str] = {v[0]: k for k, v in _TO_RLX.items()}
_TO_NUMPY.update({"f4e2m1": "float4_e2m1fn", "i4": "int4", "u4": "uint4", "i2": "int2", "u2": "uint2"})


def _ml_dtype(name: str) -> Any:
    import ml_dtypes  # a dependency of the package

    return getattr(ml_dtypes, name)


def _is_torch_tensor(x: Any) -> bool:
    # torch is never imported here: a tensor exists only if its module already is.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping the rank (np.ascontiguousarray turns a 0-d array into shape (1,))."""
    return x if x.flags.c_contiguous else x.copy(order="C")


def _as_numpy(name: str, x: Any) -> Tuple[str, np.ndarray]:
    """One input as (rlx dtype name, C-contiguous array of a plain NumPy dtype)."""
    if _is_torch_tensor(x):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return "bf16", _contiguous(t.view(torch.int16).numpy().view(np.uint16))
        x = t.numpy()
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as e:  # noqa: BLE001 - any conversion failure is the input's
            raise InputError(f'input "{name}": cannot convert {type(x).__name__} to a NumPy array: {e}') from None
    dt = x.dtype
    spec = _TO_RLX.get(dt.name)
    if spec is None:
        raise InputError(
            f'input "{name}": dtype {dt} is not supported (supported: {", ".join(_TO_RLX)})'
        )
    rlx_dt, carrier = spec
    if not dt.isnative:
        x = x.astype(dt.newbyteorder("="))
    x = _contiguous(x)
    if carrier is not None:
        x = x.view(np.dtype(carrier))
    return rlx_dt, x


def _arrays(inputs: Optional[Mapping[str, Any]]) -> List[Tuple[str, str, np.ndarray]]:
    if inputs is None:
        return []
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs: expected a dict of input name -> array, got {type(inputs).__name__}"
        )
    out = []
    for name, x in inputs.items():
        if not isinstance(name, str):
            raise InputError(f"inputs: input names are strings, got {name!r}")
        dt, a = _as_numpy(name, x)
        out.append((name, dt, a))
    return out


def _from_native(rlx_dt: str, a: np.ndarray) -> np.ndarray:
    if rlx_dt == "f16":
        return a.view(np.float16)
    if rlx_dt == "bf16":
        return a.view(_ml_dtype("bfloat16"))
    return a


def _debug_mode(debug_nans: Union[None, bool, str]) -> Optional[str]:
    if debug_nans is None:
        return None
    if debug_nans is True:
        return "warn"
    if debug_nans is False:
        return "off"
    if isinstance(debug_nans, str):
        return debug_nans
    raise InputError(
        f'debug_nans={debug_nans!r}: expected None, False, True, "warn", "strict" or "abort"/"raise"'
    )


# ---------------------------------------------------------------------------------------
# Result objects


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: its name, shape and NumPy dtype name.

    ``shape`` holds ints, and the names of symbolic dims (``("batch", 3, 224, 224)``) for
    inputs whose size is bound at run time (by the arrays given, or ``dims=`` of :func:`load`).
    """

    name: str
    shape: Tuple[Union[int, str], ...]
    dtype: str

    def __repr__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True)
class NanReport:
    """One NaN/Inf found by the localizer (one ``rlx nan-check:`` block of the CLI).

    Fields:
        kind: ``"NaN"``, ``"+inf"`` or ``"-inf"``.
        culprit: True when this op created the value (its inputs were finite, or it turned
            an Inf into NaN); False when it only carried it from upstream (a propagator).
        op: the IR op (``"Div"``, ``"Rsqrt"``, ...).
        source_op: the model's op type when it differs (``"Softmax"``, ``"aten.layer_norm.default"``).
        label: the node's name in the model (``"layers.3.mlp/mul_2"``, ``"/model/Mul"``).
        module: the module path (``"layers.3.mlp"``) for ``torch.export`` programs, else None.
        file, line, code: where your code created the op (``torch.export`` programs), else None.
        fix: a one-line suggestion (culprits only), or None.
        counts: ``{"nan": n, "pos_inf": n, "neg_inf": n, "len": n, ...}`` over the op's output.
        index: flat (row-major) index of the first bad element; ``where`` unravels it.
        shape, dtype: the op's output shape and dtype name.
        note: extra context (``"+inf reached graph output #0"``), or None.
        node: the node id as printed (``"%12"``).
        cause: the localizer's cause, as a dict (``{"kind": "inputs_finite"}``, ...).
        text: the report as the CLI prints it.
    """

    kind: str
    culprit: bool
    op: str
    source_op: Optional[str]
    label: str
    module: Optional[str]
    file: Optional[str]
    line: Optional[int]
    code: Optional[str]
    fix: Optional[str]
    counts: Dict[str, Any]
    index: int
    note: Optional[str]
    node: str
    shape: Tuple[int, ...]
    dtype: str
    backend: str
    cause: Dict[str, Any]
    text: str = field(repr=False)

    @property
    def where(self) -> Tuple[int, ...]:
        """The first bad element's index in ``shape``."""
        if not self.shape:
            return ()
        return tuple(int(i) for i in np.unravel_index(self.index, self.shape))

    @classmethod
    def _from_native(cls, js: str, text: str) -> "NanReport":
        d = json.loads(js)
        src = d.get("source") or {}
        return cls(
            kind=d["kind"],
            culprit=bool(d["culprit"]),
            op=d["op"],
            source_op=d.get("source_op"),
            label=d["label"],
            module=d.get("module"),
            file=src.get("file"),
            line=src.get("line"),
            code=src.get("code"),
            fix=d.get("fix"),
            counts=d.get("counts", {}),
            index=int(d["index"]),
            note=d.get("note"),
            node=d["node"],
            shape=tuple(d.get("dims", ())),
            dtype=d.get("dtype", ""),
            backend=d.get("backend", ""),
            cause=d.get("cause", {}),
            text=text,
        )

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


class Report(list):
    """The NaN/Inf reports of one run: a list of :class:`NanReport`, in the order found.

    ``repr`` prints them as the CLI does. ``culprits`` keeps the ops that created a value;
    ``summary`` is the CLI's line about Inf absorbed downstream (or None); ``aborted`` the
    line of a run that ``abort`` stopped (or None); ``mode`` the localizer mode used.
    """

    def __init__(
        self,
        reports: Sequence[NanReport] = (),
        *,
        summary: Optional[str] = None,
        aborted: Optional[str] = None,
        mode: Optional[str] = None,
    ):
        super().__init__(reports)
        self.summary = summary
        self.aborted = aborted
        self.mode = mode

    @property
    def culprits(self) -> List[NanReport]:
        """The reports whose op created the value (not only carried it)."""
        return [r for r in self if r.culprit]

    @property
    def ok(self) -> bool:
        """True when the run produced no reported NaN/Inf."""
        return len(self) == 0 and self.aborted is None

    def __repr__(self) -> str:
        if self.mode == "off":
            return "rlx nan-check: off (pass debug_nans=... or set RLX_DEBUG_NANS)"
        parts = [r.text for r in self]
        if self.summary:
            parts.append(self.summary)
        if self.aborted:
            parts.append(f"rlx: {self.aborted}")
        if not parts:
            return "rlx nan-check: no NaN or Inf created"
        return "\n".join(parts)

    __str__ = __repr__


@dataclass(frozen=True)
class Finding:
    """A constant subgraph that folds to NaN/Inf (one ``rlx numeric-lint:`` block).

    Fields: ``node`` (``"%7"``), ``kind`` (``"NaN"``/``"+inf"``/``"-inf"``), ``op``, ``label``,
    ``index`` (first bad element), ``counts``, ``reaches`` (the node that carries it into the
    runtime graph), ``fix`` (or None), ``module``/``file``/``line``/``code`` (``torch.export``
    programs), ``text`` (the CLI's lines).
    """

    node: str
    kind: str
    op: str
    label: str
    index: int
    counts: Dict[str, Any]
    reaches: str
    fix: Optional[str]
    module: Optional[str]
    file: Optional[str]
    line: Optional[int]
    code: Optional[str]
    text: str = field(repr=False)

    @classmethod
    def _from_native(cls, js: str, text: str) -> "Finding":
        d = json.loads(js)
        src = d.get("source") or {}
        return cls(
            node=d["node"],
            kind=d["kind"],
            op=d["op"],
            label=d["label"],
            index=int(d["index"]),
            counts=d.get("counts", {}),
            reaches=d["reaches"],
            fix=d.get("fix"),
            module=d.get("module"),
            file=src.get("file"),
            line=src.get("line"),
            code=src.get("code"),
            text=text,
        )

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


@dataclass(frozen=True)
class Divergence:
    """One backend compared with the CPU oracle (one line of ``rlx diverge``).

    Fields:
        device: the backend (``"wgpu"``, ``"cuda"``).
        suspect: True when the gap is not round-off (a kernel bug candidate, a NaN/Inf on
            one side only, differing integers).
        verdict: ``"round-off"``, ``"suspect"``, or ``"not compared"`` when no node ran on
            the backend (everything fell back to the CPU, so there was nothing to judge).
        compared: False when no node ran on the backend (then ``verdict`` is
            ``"not compared"`` and ``suspect`` is False).
        nodes_on_device, nodes_total: compute nodes that ran on the backend's own kernels,
            and all compute nodes of the compiled graph.
        max_abs, max_rel, max_ulps: the worst output gap (max_rel = |b - cpu| / (|cpu| + 1e-6)).
        worst_output, worst_output_name, worst_index, worst_values: where it was reached.
        tol_rel: the tolerance it was judged against.
        first_divergence: for a suspect backend, the first diverging node as a dict (``node``,
            ``op``, ``label``, ``kind``, ``message``, ``module``, ``source``, ...), else None.
        nonfinite: outputs NaN/Inf on one side only, as dicts.
        text: the CLI's lines for this backend.
    """

    device: str
    suspect: bool
    verdict: str
    compared: bool
    nodes_on_device: int
    nodes_total: int
    max_abs: float
    max_rel: float
    max_ulps: int
    worst_output: int
    worst_output_name: str
    worst_index: int
    worst_values: Tuple[float, float]
    tol_rel: float
    first_divergence: Optional[Dict[str, Any]]
    nonfinite: List[Dict[str, Any]]
    text: str = field(repr=False)

    @classmethod
    def _from_native(cls, js: str, text: str) -> "Divergence":
        d = json.loads(js)
        return cls(
            device=d["device"],
            suspect=bool(d["suspect"]),
            verdict=d["verdict"],
            compared=bool(d["compared"]),
            nodes_on_device=d["nodes_on_device"],
            nodes_total=d["nodes_total"],
            max_abs=d["max_abs"],
            max_rel=d["max_rel"],
            max_ulps=d["max_ulps"],
            worst_output=d["worst_output"],
            worst_output_name=d["worst_output_name"],
            worst_index=d["worst_index"],
            worst_values=tuple(d["worst_values"]),
            tol_rel=d["tol_rel"],
            first_divergence=d.get("localization"),
            nonfinite=d.get("nonfinite", []),
            text=text,
        )

    def __repr__(self) -> str:
        return self.text.rstrip("\n")

    __str__ = __repr__


class Trace:
    """Per-op statistics of one CPU run, in execution order (``rlx trace``).

    Behaves as a list of dicts, one per recorded op (graph inputs and computed ops), with
    keys ``index``, ``id``, ``op``, ``label``, ``source_op``, ``shape``, ``dtype``, ``numel``,
    ``min``, ``max``, ``mean``, ``max_abs``, ``nan``, ``pos_inf``, ``neg_inf``, ``module``,
    ``source``. ``to_pandas()`` gives a DataFrame; ``first_nonfinite`` the first op whose value
    holds NaN/Inf; ``error`` the error that stopped the run (the ops before it are kept);
    ``html`` the path of the HTML report when one was written.
    """

    def __init__(self, data: Dict[str, Any], html: Optional[str] = None):
        self.data = data
        self.ops: List[Dict[str, Any]] = data.get("ops", [])
        self.model: str = data.get("model", "")
        self.error: Optional[str] = data.get("error")
        self.html = html

    @property
    def first_nonfinite(self) -> Optional[Dict[str, Any]]:
        f = self.data.get("first_nonfinite")
        return None if f is None else self.ops[f["index"]]

    def to_json(self) -> Dict[str, Any]:
        """The trace as ``rlx trace`` writes ``trace.json``."""
        return self.data

    def to_pandas(self) -> Any:
        """The ops as a ``pandas.DataFrame`` (one row per op). Needs pandas."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Trace.to_pandas() needs pandas: pip install pandas") from e
        return pd.DataFrame(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self.ops)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return self.ops[i]

    def __repr__(self) -> str:
        lines = [f"rlx trace: {len(self.ops)} ops recorded"]
        f = self.first_nonfinite
        if f is None:
            lines.append("rlx trace: every recorded value is finite")
        else:
            lines.append(
                f'rlx trace: first non-finite value at #{f["index"]} %{f["id"]} {f["op"]} "{f["label"]}" '
                f'({f["nan"]} NaN, {f["pos_inf"]} +inf, {f["neg_inf"]} -inf)'
            )
        if self.error:
            lines.append(f"rlx: error: the run stopped: {self.error}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Models


class Model:
    """A loaded model: an ONNX file, a model folder (``model.onnx`` with optional
    ``input_<name>.npy``), a ``torch.export`` archive (``.pt2``) or an ``.rlxpkg`` package.

    Make one with :func:`load`. ``inputs`` and ``outputs`` list :class:`TensorInfo`.
    The model keeps the graph compiled for the last device and input shapes, so repeated
    :meth:`run` calls with arrays of the same shapes and dtypes do not import again.
    """

    def __init__(self, path: PathLike, *, dims: Optional[Mapping[str, int]] = None, seed: int = 0):
        if dims is not None and not isinstance(dims, Mapping):
            raise InputError(f"dims: expected a dict of dim name -> size, got {type(dims).__name__}")
        self._native = _native.NativeModel(os.fspath(path), dict(dims) if dims else None, int(seed))
        self.path: str = os.fspath(path)
        self.last_report: Optional[Report] = None

    @property
    def kind(self) -> str:
        """``"model"`` (imported) or ``"package"`` (``.rlxpkg``)."""
        return self._native.kind

    @property
    def inputs(self) -> List[TensorInfo]:
        """Graph inputs in order: name, shape (symbolic dims by name), NumPy dtype name."""
        return [TensorInfo(n, tuple(s), _TO_NUMPY.get(d, d)) for n, s, d in self._native.input_info()]

    @property
    def outputs(self) -> List[TensorInfo]:
        """Graph outputs in order (shapes as imported with the default dims)."""
        return [TensorInfo(n, tuple(s), _TO_NUMPY.get(d, d)) for n, s, d in self._native.output_info()]

    def run(
        self,
        inputs: Optional[Mapping[str, Any]] = None,
        *,
        device: Optional[str] = None,
        debug_nans: Union[None, bool, str] = None,
        quiet: bool = False,
    ) -> Dict[str, np.ndarray]:
        """Run once; see :func:`run`. The NaN/Inf reports land in ``self.last_report``."""
        mode = _debug_mode(debug_nans)
        outs, reports, summary, aborted = self._native.run(_arrays(inputs), device, mode)
        eff = mode if mode is not None else _native.env_debug_mode()
        rep = Report(
            [NanReport._from_native(j, t) for j, t in reports],
            summary=summary,
            aborted=aborted,
            mode={"1": "warn", "true": "warn", "raise": "abort"}.get(str(eff).lower(), str(eff).lower()),
        )
        self.last_report = rep
        if not quiet and (len(rep) or summary):
            for r in rep:
                sys.stderr.write(r.text + "\n")
            if summary:
                sys.stderr.write(summary + "\n")
        if aborted is not None:
            raise NonFiniteError(aborted, rep)
        return {name: _from_native(dt, a) for name, dt, a in outs}

    def lint(self) -> List[Finding]:
        """See :func:`lint`."""
        return [Finding._from_native(j, t) for j, t in self._native.lint()]

    def diverge(
        self,
        inputs: Optional[Mapping[str, Any]] = None,
        *,
        devices: Optional[Sequence[str]] = None,
        tol_rel: float = 2e-3,
        localize: bool = True,
    ) -> List[Divergence]:
        """See :func:`diverge`."""
        if devices is None:
            devices = ["cpu"] + [d for d in available_devices() if d != "cpu"]
        if isinstance(devices, str):
            devices = (devices,)
        each, _text = self._native.diverge(_arrays(inputs), list(devices), float(tol_rel), bool(localize))
        return [Divergence._from_native(j, t) for j, t in each]

    def trace(self, inputs: Optional[Mapping[str, Any]] = None, *, html: Optional[PathLike] = None) -> Trace:
        """See :func:`trace`."""
        js, page = self._native.trace(_arrays(inputs), html is not None)
        path = None
        if html is not None:
            path = os.fspath(html)
            if os.path.isdir(path):
                path = os.path.join(path, "trace.html")
            with open(path, "w", encoding="utf-8") as f:
                f.write(page)
        return Trace(json.loads(js), path)

    def __repr__(self) -> str:
        ins = ", ".join(repr(i) for i in self.inputs)
        outs = ", ".join(repr(o) for o in self.outputs)
        return f"rlx.Model({self.path!r}, inputs=[{ins}], outputs=[{outs}])"


ModelLike = Union[Model, PathLike]


def _model(model: ModelLike) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return Model(model)
    raise ModelError(f"model: expected a path or an rlx.Model, got {type(model).__name__}")


def load(path: PathLike, *, dims: Optional[Mapping[str, int]] = None, seed: int = 0) -> Model:
    """Load a model: ``.onnx``, a model folder, ``.pt2`` (``torch.export.save``) or ``.rlxpkg``.

    Args:
        path: the model file or folder.
        dims: sizes of symbolic input dims by name (``{"batch": 2}``), as ``--dim`` in the CLI;
            dims not bound take their size from the arrays given at run time, else 1.
        seed: seed of the deterministic inputs generated for inputs not given.

    Returns:
        a :class:`Model` with ``.inputs`` / ``.outputs``.

    Raises:
        ModelError: the file cannot be read, decoded, imported or compiled.
        InputError: a ``dims`` entry names no symbolic dim of the model, or is negative.
    """
    return Model(path, dims=dims, seed=seed)


def run(
    model: ModelLike,
    inputs: Optional[Mapping[str, Any]] = None,
    *,
    device: Optional[str] = None,
    debug_nans: Union[None, bool, str] = None,
    quiet: bool = False,
) -> Dict[str, np.ndarray]:
    """Run a model once and return its outputs by name.

    Args:
        model: a path (``.onnx``, model folder, ``.pt2``, ``.rlxpkg``) or an :class:`Model`.
        inputs: arrays by input name: NumPy arrays (float32, float16, bfloat16 (ml_dtypes),
            float64, int64, int32, int16, int8, uint8..uint64, bool, float8 (ml_dtypes)), or
            ``torch.Tensor`` (detached and copied to the CPU). Each must have the model's
            dtype and a shape matching its declared shape (symbolic dims take the array's
            size). Inputs not given are generated as ``rlx run`` does: floats uniform in
            [-1, 1), integer ids in [0, 10), ``*mask*`` inputs all ones; a model folder's
            ``input_<name>.npy`` files are used first.
        device: ``"cpu"``, ``"wgpu"`` or ``"cuda"``; None is the CPU for models and the compiled device
            type for packages.
        debug_nans: the NaN/Inf localizer: None follows ``RLX_DEBUG_NANS``; ``False``/``"off"``;
            ``True``/``"warn"`` reports the op that created each NaN (and Inf reaching an
            output) and goes on; ``"strict"`` reports every non-finite value where it first
            appears; ``"abort"``/``"raise"`` raises :class:`NonFiniteError` at the first NaN
            created. Reports are printed to ``sys.stderr`` as the CLI prints them (unless
            ``quiet``) and kept in ``model.last_report`` when ``model`` is a :class:`Model`.
        quiet: do not print the reports.

    Returns:
        ``{output name: np.ndarray}`` in the model's output order, each with the output's
        dtype (float16 as ``np.float16``, bfloat16 as ``ml_dtypes.bfloat16``; float8/4 and
        int4/2 decoded to float32 / int8 / uint8). The arrays own the runtime's buffers
        (no copy).

    Raises:
        ModelError: the model cannot be read, imported or compiled.
        InputError: an unknown input name, a wrong dtype or shape, an unsupported array type.
        DeviceError: an unknown device, or one not available here.
        NonFiniteError: ``debug_nans="abort"`` stopped the run.
        RlxError: any other failure (a kernel error naming the node).
    """
    return _model(model).run(inputs, device=device, debug_nans=debug_nans, quiet=quiet)


def lint(model: ModelLike) -> List[Finding]:
    """Constant subgraphs that provably fold to NaN/Inf, found before anything runs
    (``rlx lint``). Returns one :class:`Finding` per bad constant; ``[]`` when clean.

    Raises:
        ModelError: the model cannot be read or imported, or is a package (lint the model
            it was compiled from).
    """
    return _model(model).lint()


def diverge(
    model: ModelLike,
    inputs: Optional[Mapping[str, Any]] = None,
    *,
    devices: Optional[Sequence[str]] = None,
    tol_rel: float = 2e-3,
    localize: bool = True,
) -> List[Divergence]:
    """Run the model on the CPU (the oracle, ``devices[0]``) and on each other device, and
    tell round-off from a kernel bug (``rlx diverge``).

    Args:
        model: a path or :class:`Model` (not a package).
        inputs: as for :func:`run`; the same inputs feed every device.
        devices: ``("cpu", backend, ...)``; the first must be ``"cpu"``. None (the default):
            the CPU and every other device live here (``available_devices()``), as
            ``rlx diverge`` compares them.
        tol_rel: relative tolerance on outputs and the per-node localization threshold.
        localize: find the first diverging node of a suspect backend.

    Returns:
        one :class:`Divergence` per backend after the oracle (``[]`` for ``("cpu",)``).

    Raises:
        DeviceError: a device is unknown or not available on this machine (e.g. ``"wgpu"``
            without a Vulkan driver, ``"cuda"`` without a driver and device; the message
            says which library is missing and lists the live devices), or ``devices[0]`` is
            not ``"cpu"``.
        ModelError, InputError: as for :func:`run`.
    """
    return _model(model).diverge(inputs, devices=devices, tol_rel=tol_rel, localize=localize)


def trace(
    model: ModelLike,
    inputs: Optional[Mapping[str, Any]] = None,
    *,
    html: Optional[PathLike] = None,
) -> Trace:
    """Run once on the CPU recording per-op statistics (``rlx trace``).

    Args:
        model: a path or :class:`Model` (not a package).
        inputs: as for :func:`run`.
        html: write the self-contained HTML report there (a folder gets ``trace.html``).

    Returns:
        a :class:`Trace` (a list of per-op dicts; ``.to_pandas()``). A run that fails part
        way keeps the ops before the failure and sets ``.error``.

    Raises:
        ModelError, InputError: as for :func:`run`.
    """
    return _model(model).trace(inputs, html=html)


def available_devices() -> List[str]:
    """Devices live on this machine: ``["cpu"]``, plus ``"wgpu"`` when a Vulkan adapter exists
    and ``"cuda"`` when a CUDA driver, its libraries and a device do."""
    return list(_native.available_devices())


# ---------------------------------------------------------------------------------------
# Tools that write files: reduce, precision (the CLI's commands, parsed by its own definitions)

# rlx dtypes a .npy file carries to the CLI's --input (its reader: crates/rlx-cli/src/npy.rs).
_NPY_DTYPES = {"f32", "f64", "f16", "i64", "i32", "i16", "i8", "u8", "u16", "u32", "u64", "bool"}


def _model_arg(model: ModelLike) -> str:
    if isinstance(model, Model):
        return model.path
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise ModelError(f"model: expected a path or an rlx.Model, got {type(model).__name__}")


def _sanitize(name: str) -> str:
    """The CLI's file-name form of a tensor name (``input_<name>.npy``; run.rs ``sanitize``)."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return f"output{s}" if s in ("", ".", "..") else s


def _save_npy(name: str, x: Any, path: str) -> None:
    dt, a = _as_numpy(name, x)
    if dt not in _NPY_DTYPES:
        raise InputError(
            f'input "{name}": {_TO_NUMPY.get(dt, dt)} arrays cannot be passed to the CLI as .npy '
            f"(it reads {', '.join(_TO_NUMPY[d] for d in sorted(_NPY_DTYPES))})"
        )
    if dt == "f16":
        a = a.view(np.float16)
    np.save(path, a, allow_pickle=False)


def _input_flags(inputs: Optional[Mapping[str, Any]], tmp: str) -> List[str]:
    """``--input NAME=FILE`` per array, each saved as a .npy in ``tmp``."""
    if inputs is None:
        return []
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs: expected a dict of input name -> array, got {type(inputs).__name__}")
    flags = []
    for k, (name, x) in enumerate(inputs.items()):
        if not isinstance(name, str):
            raise InputError(f"inputs: input names are strings, got {name!r}")
        f = os.path.join(tmp, f"arg{k}.npy")
        _save_npy(name, x, f)
        flags.append(f"--input={name}={f}")
    return flags


def _input_sets(what: str, sets: Any, tmp: str) -> str:
    """A folder of input sets for --calibration / --verify: a path as given, or a sequence of
    ``{name: array}`` dicts written as ``tmp/<what>/<k>/input_<name>.npy``."""
    if isinstance(sets, (str, os.PathLike)):
        return os.fspath(sets)
    if isinstance(sets, Mapping):
        sets = [sets]
    if not isinstance(sets, Sequence) or not all(isinstance(d, Mapping) for d in sets) or not sets:
        raise InputError(
            f"{what}: expected a folder of input_<name>.npy files (or of subfolders holding them), "
            f"or a non-empty list of dicts of input name -> array; got {type(sets).__name__}"
        )
    root = os.path.join(tmp, what)
    for k, d in enumerate(sets):
        sub = os.path.join(root, f"{k:04d}")
        os.makedirs(sub)
        for name, x in d.items():
            if not isinstance(name, str):
                raise InputError(f"{what}[{k}]: input names are strings, got {name!r}")
            _save_npy(name, x, os.path.join(sub, f"input_{_sanitize(name)}.npy"))
    return root


def reduce(
    model: ModelLike,
    until: str = "nan",
    *,
    inputs: Optional[Mapping[str, Any]] = None,
    out: PathLike = "repro",
    force: bool = False,
    tol_rel: float = 2e-3,
) -> pathlib.Path:
    """Shrink an ONNX model to the smallest subgraph that still fails the same way and write
    it as a repro folder (``rlx reduce``).

    The folder holds ``model.onnx`` (the kept nodes; every tensor entering them from a cut-off
    node is a graph input or initializer holding the value it had in the full run),
    ``input_<name>.npy`` per graph input, and ``README.md`` (what failed, how to reproduce it
    with ``rlx run`` and onnxruntime). ``rlx.run(folder, debug_nans=True)`` reproduces it. The
    written folder is checked to reproduce the failure at the same node before this returns.

    Args:
        model: an ONNX file, a model folder (``model.onnx`` and optional ``input_<name>.npy``)
            or an :class:`Model` loaded from one (``.pt2`` and packages are refused).
        until: what "fails the same way" means, as ``--until``: ``"nan"`` (the first NaN
            created: the culprit the localizer names), ``"inf"`` (the first +inf/-inf
            created), ``"diverge"`` / ``"diverge:BACKEND"`` (the first node where ``wgpu`` or
            ``cuda`` diverges from the CPU beyond ``tol_rel``), ``"error"`` / ``"error:TEXT"``
            (an import, compile or run error whose message contains TEXT).
        inputs: arrays by input name (NumPy arrays or ``torch.Tensor``, as for :func:`run`;
            dtypes the CLI's ``.npy`` reader takes: float32/64/16, int8..64, uint8..64, bool).
            They are saved to temporary ``.npy`` files (deleted afterwards) and passed as
            ``--input NAME=FILE``. Inputs not given: the model folder's ``input_<name>.npy``,
            else generated as ``rlx run`` does.
        out: the repro folder (``-o``); created if missing.
        force: replace the repro files in an existing ``out`` (``--force``); without it an
            existing ``out`` is an error and is left untouched.
        tol_rel: relative tolerance for ``until="diverge"`` (``--tol-rel``).

    Returns:
        the folder written, as a ``pathlib.Path``.

    Raises:
        RlxError: the model does not fail that way on these inputs (the CLI's line; nothing is
            written), ``out`` exists and ``force`` is False, or the repro did not reproduce.
        UsageError: an ``until`` the CLI does not take (a ``ValueError`` too; clap's message).
        ModelError: the model cannot be read or imported.
        InputError: an input name, dtype or shape the model does not take.
    """
    if not isinstance(until, str):
        raise UsageError(f"until={until!r}: expected nan, inf, diverge[:BACKEND] or error[:TEXT]")
    path = _model_arg(model)
    with tempfile.TemporaryDirectory(prefix="rlx-reduce-") as tmp:
        argv = [f"--until={until}", f"--output-dir={os.fspath(out)}", f"--tol-rel={float(tol_rel)!r}", "-q"]
        argv += _input_flags(inputs, tmp)
        if force:
            argv.append("--force")
        _native.reduce(argv + ["--", path])
    return pathlib.Path(out)


@dataclass(frozen=True)
class KeptNode:
    """One node :func:`precision` kept in float32: its ONNX ``name``, ``op`` type, ``reason``
    (``"output 2.1e5 > float16 max 65504"``, ...) and ``without_it`` (what went wrong when
    it was dropped, or None)."""

    name: str
    op: str
    reason: str
    without_it: Optional[str] = None


class PrecisionResult:
    """What :func:`precision` found and wrote.

    Attributes:
        path: the mixed-precision ONNX model written (``pathlib.Path``). Its graph inputs and
            outputs stay float32.
        kept: the nodes kept in float32 (:class:`KeptNode`), in execution order.
        ok: True when the written model was verified finite and within ``tol_rel`` of float32
            on every calibration and held-back input set (the CLI's exit status 0).
        to: ``"float16"`` or ``"bfloat16"``.
        report: the CLI's ``--json`` report as a dict (every node's statistics, the
            verifications ``calibration`` / ``held_back`` / ``all_low``, ``first_failing``,
            ``casts_inserted``, ...).
        text: the lines ``rlx precision`` prints (``str(result)``).
    """

    def __init__(self, report: Dict[str, Any], ok: bool, text: str):
        self.report = report
        self.ok = ok
        self.text = text
        self.path = pathlib.Path(report["output"])
        self.to: str = report["to"]
        self.kept: List[KeptNode] = [
            KeptNode(k["name"], k["op"], k["reason"], k.get("without_it")) for k in report["kept"]
        ]

    @property
    def kept_names(self) -> List[str]:
        """The kept nodes' ONNX names."""
        return [k.name for k in self.kept]

    def to_json(self) -> Dict[str, Any]:
        """The report as the CLI writes it with ``--json`` (a dict of JSON values)."""
        return self.report

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return (
            f"PrecisionResult(path={str(self.path)!r}, to={self.to!r}, ok={self.ok}, "
            f"kept={self.kept_names!r})"
        )


def precision(
    model: ModelLike,
    to: str = "f16",
    *,
    inputs: Optional[Mapping[str, Any]] = None,
    calibration: Any = None,
    out: Optional[PathLike] = None,
    tol_rel: Optional[float] = None,
    verify: Any = None,
    keep: Union[None, str, Sequence[str]] = None,
    no_search: bool = False,
    max_trials: Optional[int] = None,
    html: Optional[PathLike] = None,
    force: bool = False,
) -> PrecisionResult:
    """Find the few nodes of a float32 ONNX model that must stay float32 when the rest runs
    in float16 or bfloat16, and write that mixed-precision model (``rlx precision``).

    The search runs the model in RLX on every calibration input set; the written model is
    loaded back and verified with the NaN localizer on every calibration and ``verify`` set.

    Args:
        model: a float32 ONNX file, a model folder, or an :class:`Model` loaded from one.
        to: the low dtype (``--to``): ``"f16"``/``"float16"`` or ``"bf16"``/``"bfloat16"``.
        inputs: one input set as arrays by name (``--input``; as for :func:`reduce`), used
            when ``calibration`` is None. Neither: the model folder's ``input_<name>.npy``.
        calibration: input sets for the search (``--calibration``): a folder holding
            ``input_<name>.npy`` or subfolders that each hold them; or a list of
            ``{name: array}`` dicts (written to temporary files).
        out: the model to write (``-o``); None: ``<model name>_<f16|bf16>.onnx`` in the current
            directory, as the CLI does.
        tol_rel: largest error allowed at each output relative to its largest float32 |x|
            (``--tol-rel``; None: the CLI's default, 0.01).
        verify: held-back input sets checked on the written model only (``--verify``): a
            folder, a list of folders, or a list of ``{name: array}`` dicts.
        keep: node names to keep in float32 whatever the search finds (``--keep``).
        no_search: keep exactly ``keep`` (``--no-search``).
        max_trials: most trial runs of the search (``--max-trials``; None: the CLI's 200).
        html: also write ``html/precision.html`` and ``html/precision.json`` (``--html``).
        force: replace ``out`` if it exists (``--force``).

    Returns:
        a :class:`PrecisionResult` (``.path``, ``.kept``, ``.ok``, ``.report``, ``.to_json()``).
        When the written model failed its verification (``.ok`` False; the CLI exits 1) a
        ``RuntimeWarning`` says why; the model is written all the same.

    Raises:
        UsageError: a ``to`` the CLI does not take (``"fp8"``, ``"f32"``), ``no_search``
            without ``keep`` (a ``ValueError`` too; clap's message).
        RlxError: ``out`` exists and ``force`` is False (nothing written).
        ModelError: the model cannot be read, is already float16/bfloat16, or has control flow.
        InputError: input sets that do not fit the model.
    """
    path = _model_arg(model)
    with tempfile.TemporaryDirectory(prefix="rlx-precision-") as tmp:
        report_file = os.path.join(tmp, "report.json")
        argv = [f"--to={to}", f"--json={report_file}", "-q"]
        argv += _input_flags(inputs, tmp)
        if calibration is not None:
            argv.append(f"--calibration={_input_sets('calibration', calibration, tmp)}")
        if out is not None:
            argv.append(f"--output={os.fspath(out)}")
        if tol_rel is not None:
            argv.append(f"--tol-rel={float(tol_rel)!r}")
        if verify is not None:
            if isinstance(verify, (str, os.PathLike, Mapping)):
                verify = [verify]
            dicts = [v for v in verify if isinstance(v, Mapping)]
            dirs = [os.fspath(v) for v in verify if not isinstance(v, Mapping)]
            if dicts:
                dirs.append(_input_sets("verify", dicts, tmp))
            for d in dirs:
                argv.append(f"--verify={d}")
        if keep is not None:
            names = [keep] if isinstance(keep, str) else list(keep)
            if names:
                argv.append(f"--keep={','.join(names)}")
        if no_search:
            argv.append("--no-search")
        if max_trials is not None:
            argv.append(f"--max-trials={int(max_trials)}")
        if html is not None:
            argv.append(f"--html={os.fspath(html)}")
        if force:
            argv.append("--force")
        ok, lines = _native.precision(argv + ["--", path])
        with open(report_file, encoding="utf-8") as f:
            report = json.load(f)
    res = PrecisionResult(report, bool(ok), "\n".join(lines))
    if not res.ok:
        bad = [ln for ln in lines if "FAILED" in ln]
        warnings.warn(
            f"rlx.precision: {res.path} was written but not verified: "
            + ("; ".join(bad) if bad else "see result.report"),
            RuntimeWarning,
            stacklevel=2,
        )
    return res


# ---------------------------------------------------------------------------------------
# torch


def _export_and_save(module: Any, args: Any, kwargs: Any, dtype: Any, dynamic_shapes: Any, path: str):
    """Export ``module`` with ``torch.export`` and save it to ``path``; returns the arrays
    to feed by graph input name."""
    import copy

    import torch
    from torch.utils import _pytree as pytree

    if not isinstance(module, torch.nn.Module):
        raise InputError(f"debug: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    kwargs = dict(kwargs or {})
    if dtype is not None:
        module = copy.deepcopy(module).to(dtype)

        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.to(dtype)
            return x

        args = pytree.tree_map(cast, args)
        kwargs = pytree.tree_map(cast, kwargs)
    ep = torch.export.export(module, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
    torch.export.save(ep, path)
    names = list(ep.graph_signature.user_inputs)
    leaves = pytree.tree_leaves((args, kwargs))
    feeds = {}
    for name, leaf in zip(names, leaves):
        if isinstance(leaf, torch.Tensor):
            feeds[name] = leaf
    return ep, feeds


def debug(
    module: Any,
    args: Any,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    dtype: Any = None,
    dynamic_shapes: Any = None,
    mode: str = "warn",
) -> Report:
    """Find the op of a PyTorch module that creates a NaN or Inf, with its module path and
    the line of your code.

    Exports ``module`` with ``torch.export.export(module, args, kwargs,
    dynamic_shapes=dynamic_shapes)``, saves the program to a temporary ``.pt2``, imports it
    and runs it on ``args`` (as NumPy) with the localizer on.

    Args:
        module: a ``torch.nn.Module``.
        args: the example positional arguments (a tuple, or one tensor).
        kwargs: the example keyword arguments.
        dtype: cast the module (a copy) and the floating-point args to this ``torch.dtype``
            first (``torch.float16`` to find half-precision overflows).
        dynamic_shapes: as for ``torch.export.export``.
        mode: ``"warn"`` (report and go on), ``"strict"`` (every non-finite value where it
            first appears, Inf included) or ``"raise"`` (raise :class:`NonFiniteError` at the
            first op that created a NaN; the analogue of ``RLX_DEBUG_NANS=abort``).

    Returns:
        a :class:`Report`: a list of :class:`NanReport` (``kind``, ``culprit``, ``op``,
        ``module``, ``file``, ``line``, ``code``, ``fix``, ``counts``, ...) whose ``repr`` is
        the CLI's report. Empty when every value stayed finite.

    Raises:
        ImportError: torch is not installed.
        NonFiniteError: ``mode="raise"`` and an op created a NaN.
        ModelError: the exported program cannot be imported (an unsupported ATen op names
            the op, the FX node and its source line).
        InputError: ``module`` is not a ``torch.nn.Module`` or ``mode`` is unknown.
    """
    modes = {"warn": "warn", "strict": "strict", "raise": "abort", "abort": "abort"}
    if mode not in modes:
        raise InputError(f'mode={mode!r}: expected "warn", "strict" or "raise"')
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError("rlx.debug needs PyTorch: pip install torch") from e
    with tempfile.TemporaryDirectory(prefix="rlx-debug-") as tmp:
        path = os.path.join(tmp, "model.pt2")
        _ep, feeds = _export_and_save(module, args, kwargs, dtype, dynamic_shapes, path)
        m = Model(path)
        try:
            m.run(feeds, debug_nans=modes[mode], quiet=True)
        except NonFiniteError:
            raise
        rep = m.last_report
        assert rep is not None
        return rep
