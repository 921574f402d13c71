"""RLX from Python: run a model on NumPy arrays and find out why its numbers are wrong.

* :func:`run` runs an ONNX model, a ``torch.export`` archive (``.pt2``), a model folder or
  an ``.rlxpkg`` package on NumPy arrays (or ``torch.Tensor``), optionally with the NaN/Inf
  localizer on (``debug_nans``, as ``RLX_DEBUG_NANS`` in the CLI).
* :func:`debug` exports a ``torch.nn.Module`` with ``torch.export``, runs it with the localizer
  on and returns a :class:`Report`: the op that created each NaN/Inf, its module path and the
  line of your code.
* :func:`lint` (constants that fold to NaN/Inf), :func:`diverge` (every backend against the
  CPU, first diverging node) and :func:`trace` (per-op statistics, HTML report).

Every error is an :class:`RlxError` (:class:`ModelError`, :class:`InputError`,
:class:`DeviceError`, :class:`NonFiniteError`) whose message is the CLI's one line.
The environment switches of the CLI (``RLX_DEBUG_NANS``, ``RLX_LINT_NUMERICS``,
``RLX_RUNTIME_CHECK_INPUTS``, ``RLX_DEBUG_INTERMEDIATE_VALUE_PRINTER``, ``RAYON_NUM_THREADS``,
...) work the same here; ``rlx env`` lists them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import DeviceError, InputError, ModelError, RlxError

__version__: str = _native.__version__

__all__ = [
    "run",
    "load",
    "lint",
    "diverge",
    "trace",
    "debug",
    "available_devices",
    "Model",
    "TensorInfo",
    "Report",
    "NanReport",
    "Finding",
    "Divergence",
    "Trace",
    "RlxError",
    "ModelError",
    "InputError",
    "DeviceError",
    "NonFiniteError",
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
