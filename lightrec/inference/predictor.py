"""``load(path)`` and ``Predictor``: score raw feature dicts with an exported artifact.

A request is one sample::

    {"dense": [0.1, 2.0, ...],                  # exactly dense_in_features floats (omit if the model has none)
     "sparse": {"user": [12, 7], "item": [3]},  # ids per feature (a missing feature = no ids, see below)
     "weights": {"user": [1.0, 0.5]}}           # per-id weights, weighted models only

``Predictor.predict(requests)`` validates every request, builds one batch (the artifact's tensor
inputs: dense ``[B, I]``, key-major ``values``/``lengths``) and returns probabilities
(``sigmoid`` of the model's logits), one per request. A malformed request raises
:class:`RequestError` naming the request index, the feature and the offending value (also as its
``index``, ``field`` and ``value`` attributes); nothing is scored when any request is bad. A server
validates each request on its own with :meth:`Predictor.check_request` (one bad request fails
alone) and scores the batch it assembles with :meth:`Predictor.probabilities`.
``missing_features="empty"`` (default) treats an absent feature as an empty id list (the model
pools it to zeros); ``"error"`` rejects such requests.

Dense values and weights must be numbers float32 holds finite (``|x| <= 3.4028235e38``: the
artifact computes in float32, where ``1e39`` is ``inf``); NaN, infinities and larger numbers --
ints too, ``10**400`` -- are refused. An offending value is echoed in the message truncated
(:func:`shown`), so a megabyte-long key or list never comes back in full.

``load(path, device="cuda")`` serves on a GPU: the artifact's tensors are loaded onto the device,
inputs are moved there, ``predict`` returns CPU probabilities and ``__call__`` the raw outputs on
the device.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from torch import nn
from torch.export.passes import move_to_device_pass

import lightrec.quant.pooled_kernels  # noqa: F401  registers lightrec::nbit_pooled_lookup, which exported programs call
from lightrec._fbgemm import fbgemm_available, fbgemm_unavailable_reason
from lightrec.inference.safe_archive import open_checked

if TYPE_CHECKING:
    from lightrec.inference.export import ArtifactMeta

__all__ = ["FLOAT32_MAX", "ArtifactMetaError", "CheckedRequest", "CorruptArtifactError", "Predictor", "RequestError",
           "RequestRules", "finite_float32", "load", "shown"]

_REQUEST_KEYS = ("dense", "sparse", "weights")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # larger dense values or weights are inf in the artifact
_SHOWN_CHARS = 200  # an offending value longer than this (as JSON) is shown truncated


class ArtifactMetaError(ValueError):
    """An artifact's ``<path>.meta.json`` that is not what :func:`lightrec.inference.export` writes (cut short,
    edited, another file's): the message names the file and the field."""


class CorruptArtifactError(RuntimeError):
    """An artifact file that is not what :func:`lightrec.inference.export` wrote (cut short, altered):
    the message names the file; ``path`` holds it."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:  # keep the field across processes
        return (type(self), (str(self), self.path))


class RequestError(ValueError):
    """A request that cannot be scored (unknown/missing feature, bad id, wrong dense width...).

    Args:
        message: what is wrong and how to fix it (starts with ``"request <index>: "``).
        index: the request's position in the list given to ``predict`` (the sample's, in a server's batch).
        field: where in the request: ``"dense"``, ``"dense[3]"``, ``"sparse"``, ``"sparse.user"``,
            ``"sparse.user[2]"``, ``"weights.user"``, or the unknown key; None for the request as a whole.
        value: the offending value as received (a key, an id, a length, a type name); messages and
            ``field`` show it truncated (:func:`shown`), this attribute holds it whole.
    """

    def __init__(self, message: str, index: int | None = None, field: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.value = value

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields across processes (servers pickle errors)
        return (type(self), (str(self), self.index, self.field, self.value))


class CheckedRequest(NamedTuple):
    """One validated request: ``dense`` (``dense_in_features`` floats), ``ids`` and ``weights`` per
    feature present in the request (a weighted model's missing weights are not filled in here)."""

    dense: list[float]
    ids: dict[str, list[int]]
    weights: dict[str, list[float]]


class RequestRules(NamedTuple):
    """What decides whether :meth:`Predictor.check_request` accepts a request: two predictors with
    equal rules accept and refuse exactly the same requests, and build the same input tensors from them
    (what a server that swaps predictors between batches relies on)."""

    feature_names: tuple[str, ...]
    dense_in_features: int
    takes_dense: bool
    is_weighted: bool
    id_spaces: tuple[int, ...]  # rows of each feature's table (its raw id space behind managed collisions)
    managed: frozenset[str]  # features whose table takes raw ids (managed collisions)
    missing_features: str


class Predictor:
    """A loaded artifact plus its metadata.

    Args:
        module: the artifact (``torch.jit.ScriptModule`` or an exported program's module) taking
            ``(dense_features, values, lengths[, weights])``.
        meta: the ``<path>.meta.json`` content.
        missing_features: ``"empty"`` or ``"error"`` (see the module docstring).
        device: where ``module`` runs; inputs are moved there.
    """

    def __init__(
        self, module: nn.Module, meta: ArtifactMeta, missing_features: str = "empty", device: torch.device | str = "cpu"
    ) -> None:
        if missing_features not in ("empty", "error"):
            raise ValueError(f"missing_features must be 'empty' or 'error', got {missing_features!r}")
        self.module = module
        self.device = torch.device(device)
        self.meta = meta
        self.missing_features = missing_features
        self.feature_names: list[str] = list(meta["feature_names"])
        self.dense_in_features: int = int(meta.get("dense_in_features") or 0)
        self.takes_dense: bool = bool(meta.get("takes_dense", True))
        self.is_weighted: bool = bool(meta.get("is_weighted", False))
        # Ids must index a table -- or, for a managed-collision table, lie in its raw id space.
        self._rows = {f: int(t.get("id_space", t["num_embeddings"])) for t in meta["tables"] for f in t["feature_names"]}
        self._managed = {f for t in meta["tables"] if "id_space" in t for f in t["feature_names"]}

    @property
    def rules(self) -> RequestRules:
        """The request rules of this predictor (see :class:`RequestRules`)."""
        return RequestRules(tuple(self.feature_names), self.dense_in_features, self.takes_dense, self.is_weighted,
                            tuple(self._rows[f] for f in self.feature_names), frozenset(self._managed),
                            self.missing_features)

    def __call__(self, dense_features: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
        """Run the artifact on tensors (layout in :mod:`lightrec.inference.export`); returns raw outputs.

        Ids and lengths of any integer dtype (KJTs often carry int32 lengths) are passed on as the
        artifact's int64, dense features and weights as float32, all on the predictor's ``device``.
        """
        device = self.device
        dense_features, values, lengths = dense_features.to(device, torch.float32), values.to(device, torch.int64), lengths.to(device, torch.int64)
        weights = weights.to(device, torch.float32) if weights is not None else None
        batch = dense_features.shape[0]
        if batch == 1 and self.meta.get("format") == "export":
            # exported programs are specialized to B >= 2: score the sample twice, keep one
            dense_features, values, lengths = dense_features.repeat(2, 1), _twice(values, lengths), lengths.repeat_interleave(2)
            weights = _twice(weights, lengths[::2]) if weights is not None else None
            return self(dense_features, values, lengths, weights)[:1]
        with torch.no_grad():
            if self.is_weighted:
                return self.module(dense_features, values, lengths, weights)
            return self.module(dense_features, values, lengths)

    def predict(self, requests: list[dict[str, Any]]) -> torch.Tensor:
        """Probabilities ``[len(requests)]`` (``[len(requests), K]`` for K-logit models).

        Raises:
            RequestError: a request is malformed (the message names its index).
            TypeError: ``requests`` is not a non-empty list of dicts.
        """
        if not isinstance(requests, (list, tuple)) or len(requests) == 0:
            raise TypeError(f"requests must be a non-empty list of dicts, got {type(requests).__name__}")
        checked = [self.check_request(request, index) for index, request in enumerate(requests)]
        features = self.feature_names
        values = torch.tensor([i for f in features for r in checked for i in r.ids.get(f, [])], dtype=torch.int64)
        lengths = torch.tensor([len(r.ids.get(f, [])) for f in features for r in checked], dtype=torch.int64)
        dense = torch.tensor([r.dense for r in checked], dtype=torch.float32).reshape(len(checked), self.dense_in_features)
        weights = None
        if self.is_weighted:
            weights = torch.tensor([x for f in features for r in checked
                                    for x in r.weights.get(f, [1.0] * len(r.ids.get(f, [])))], dtype=torch.float32)
        return self.probabilities(dense, values, lengths, weights)

    def probabilities(self, dense_features: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                      weights: torch.Tensor | None = None) -> torch.Tensor:
        """``sigmoid`` of the artifact's output on CPU: ``[B]`` (``[B, K]`` for K-logit models).

        The inputs are the artifact's (module docstring of :mod:`lightrec.inference.export`); what
        ``predict`` computes once it has built them from requests.
        """
        out = torch.sigmoid(self(dense_features, values, lengths, weights)).cpu()
        return out.squeeze(1) if out.dim() == 2 and out.shape[1] == 1 else out

    # ------------------------------------------------------------------ validation
    def check_request(self, request: object, index: int = 0) -> CheckedRequest:
        """Validate one request (the form in the module docstring) on its own.

        Args:
            request: the decoded JSON object of one sample.
            index: its position, named in the error.

        Raises:
            RequestError: with the index, the field and the offending value.
        """
        where = f"request {index}"
        if not isinstance(request, dict):
            raise RequestError(f"{where}: must be a dict with keys {list(_REQUEST_KEYS)}, got {type(request).__name__}",
                               index, None, type(request).__name__)
        extra = sorted(set(request) - set(_REQUEST_KEYS), key=str)  # a caller's dict may mix key types
        if extra:
            raise RequestError(f"{where}: unknown keys {shown(extra)}; a request has 'dense', 'sparse' and (weighted "
                               "models) 'weights'", index, _field(extra[0]), extra[0])
        dense = self.check_dense(index, request.get("dense"))
        sparse = request.get("sparse", {})
        if not isinstance(sparse, dict):
            raise RequestError(f"{where}: 'sparse' must be a dict feature -> list of ids, got {type(sparse).__name__}",
                               index, "sparse", type(sparse).__name__)
        unknown = sorted(set(sparse) - set(self.feature_names), key=str)
        if unknown:
            raise RequestError(f"{where}: unknown features {shown(unknown)}; the model's features are "
                               f"{self.feature_names}", index, "sparse", unknown[0])
        missing = [f for f in self.feature_names if f not in sparse]
        if missing and self.missing_features == "error":
            raise RequestError(f"{where}: missing features {missing} (missing_features='error'); send [] for no ids",
                               index, "sparse", missing[0])
        checked = {f: self.check_ids(index, f, ids) for f, ids in sparse.items()}
        wts = request.get("weights", {})
        if wts and not self.is_weighted:
            raise RequestError(f"{where}: 'weights' given but the model is not weighted; drop them",
                               index, "weights", None)
        if not isinstance(wts, dict):
            raise RequestError(f"{where}: 'weights' must be a dict feature -> list of floats, got {type(wts).__name__}",
                               index, "weights", type(wts).__name__)
        weights = {f: self._check_weights(index, f, w, checked) for f, w in wts.items()}
        return CheckedRequest(dense, checked, weights)

    def _check_weights(self, index: int, feature: str, weights: object, ids: dict[str, list[int]]) -> list[float]:
        """The weights of ``feature`` in request ``index`` as floats: one finite float32 number per id."""
        where = f"request {index}"
        if feature not in ids:
            raise RequestError(f"{where}: weights for feature {shown(feature)!r}, which has no ids in 'sparse'",
                               index, _field(f"weights.{feature}"), feature)
        count = len(ids[feature])
        if not isinstance(weights, (list, tuple)) or len(weights) != count:
            got = f"{len(weights)} values" if isinstance(weights, (list, tuple)) else type(weights).__name__
            raise RequestError(f"{where}: weights of feature {feature!r} must be {count} numbers (one per id), "
                               f"got {got}", index, f"weights.{feature}", weights)
        floats = [finite_float32(x) for x in weights]
        for k, x in enumerate(floats):
            if x is None:
                raise RequestError(f"{where}: weights.{feature}[{k}]={shown(weights[k])!r} is not a finite number "
                                   f"(weights are float32: |w| <= {FLOAT32_MAX:.7g})", index,
                                   f"weights.{feature}[{k}]", weights[k])
        return cast("list[float]", floats)  # no None left

    def check_dense(self, index: int, dense: object, field: str = "dense") -> list[float]:
        """The dense features of request ``index`` as floats (``[]`` for a model without them).

        ``field`` names them in errors, as the request wrote them (``dense``; a served compact batch's row
        ``batch.dense[b]``); a bad value is ``<field>[k]``.

        Raises:
            RequestError: missing, wrong width, or a value that is not a finite number.
        """
        where = f"request {index}"
        if not self.takes_dense:
            if dense not in (None, []):
                raise RequestError(f"{where}: the model takes no dense features, but '{field}' was given",
                                   index, field, None)
            return []
        if dense is None:
            raise RequestError(f"{where}: '{field}' is missing; give {self.dense_in_features} floats", index, field, None)
        if not isinstance(dense, (list, tuple)) or len(dense) != self.dense_in_features:
            got = len(dense) if isinstance(dense, (list, tuple)) else type(dense).__name__
            raise RequestError(f"{where}: '{field}' must be a list of {self.dense_in_features} floats, got {got}"
                               + (" values" if isinstance(got, int) else ""), index, field, got)
        floats = [finite_float32(x) for x in dense]
        for k, x in enumerate(floats):
            if x is None:
                raise RequestError(f"{where}: {field}[{k}]={shown(dense[k])!r} is not a finite number (dense features "
                                   f"are float32: |x| <= {FLOAT32_MAX:.7g})", index, f"{field}[{k}]", dense[k])
        return cast("list[float]", floats)  # no None left

    def check_ids(self, index: int, feature: str, ids: object) -> list[int]:
        """The ids of ``feature`` in request ``index``: ints in ``[0, rows)`` of its table (of its raw id space
        for a managed-collision table).

        Raises:
            RequestError: not a list, an id that is not an int (bools and floats included), or out of range.
        """
        if self.ids_in_range(feature, ids):  # a list or tuple of in-range ints
            return list(cast("list[int]", ids))
        where = f"request {index}"
        if not isinstance(ids, (list, tuple)):
            raise RequestError(f"{where}: ids of feature {feature!r} must be a list of ints, got {type(ids).__name__}",
                               index, f"sparse.{feature}", type(ids).__name__)
        rows = self._rows[feature]
        for k, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, int):
                raise RequestError(f"{where}: feature {feature!r} has non-integer id {shown(i)!r}; ids are ints in "
                                   f"[0, {rows})", index, f"sparse.{feature}[{k}]", i)
            if not 0 <= i < rows:
                fix = ("its managed-collision table takes raw ids in that range" if feature in self._managed
                       else "hash or take ids modulo the table size")  # fmt: skip
                raise RequestError(f"{where}: feature {feature!r} has id {shown(i)}, outside [0, {rows}) of its table; "
                                   f"{fix}", index, f"sparse.{feature}[{k}]", i)
        return list(ids)

    def ids_in_range(self, feature: str, ids: object) -> bool:
        """Whether ``ids`` is a list of ints in ``feature``'s range: the fast test behind :meth:`check_ids`,
        for callers (a server's columnar batch) that look for the offender only when it fails."""
        if not isinstance(ids, (list, tuple)):
            return False
        rows = self._rows[feature]
        for i in ids:  # one loop, three tests an id: 2.5x (1000 ids) to 8x (1 id) faster than all() + min + max
            if type(i) is not int or i < 0 or i >= rows:  # exact ints: no bools
                return False
        return True

def _twice(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Key-major values of a one-sample batch, each feature's ids repeated for a second sample."""
    return torch.cat([seg.repeat(2) for seg in torch.split(values, lengths.tolist())]) if values.numel() else values


def finite_float32(x: object) -> float | None:
    """``x`` as a float when it is a number (not a bool) that float32 holds finite, else None.

    A JSON int of any size is a number to Python, and ``float(10**400)`` raises ``OverflowError``:
    that is "not a finite number" too, not a crash. ``abs(nan) <= max`` is False, so NaN is refused.
    """
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    try:
        value = float(x)
    except OverflowError:
        return None
    return value if abs(value) <= FLOAT32_MAX else None


def shown(value: object, limit: int = _SHOWN_CHARS) -> object:
    """``value`` as it goes into an error (message, ``field``, a JSON body): itself when its JSON is at most
    ``limit`` characters, else the start of its text and its length -- a 1 MB list is not echoed.

    NaN and infinities are not JSON: they come back as their JSON spellings (``"NaN"``, ``"Infinity"``),
    so an error body stays strict JSON. A value nested too deeply, or an int too long, to print is named, not
    printed.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # NaN, Infinity, -Infinity: how the client wrote them
    if isinstance(value, str):  # a key, a field, a string where a number belongs: its characters, unquoted
        return value if len(value) <= limit else value[:limit] + f"... ({len(value)} characters)"
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    except RecursionError:  # a list nested thousands deep: json and repr both recurse
        return f"(a {type(value).__name__} nested too deeply to show)"
    if text is not None and len(text) <= limit:
        return value
    try:
        whole = text if text is not None else repr(value)
    except RecursionError:
        return f"(a {type(value).__name__} nested too deeply to show)"
    except ValueError:  # an int past the digits Python prints (sys.get_int_max_str_digits): a sum of client numbers
        return f"(an int of {value.bit_length()} bits)" if isinstance(value, int) else f"(a {type(value).__name__} too large to show)"
    return whole if len(whole) <= limit else whole[:limit] + f"... ({len(whole)} characters)"


def _field(field: str) -> str:
    """A ``field`` built from a client's key, truncated like any shown value."""
    return str(shown(str(field)))


def load(path: str | os.PathLike, missing_features: str = "empty", device: torch.device | str = "cpu") -> Predictor:
    """Load an artifact written by :func:`lightrec.inference.export` (reads ``<path>.meta.json``).

    Args:
        path: the artifact.
        missing_features: ``"empty"`` or ``"error"`` (module docstring).
        device: where the artifact runs (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).

    Raises:
        FileNotFoundError: the artifact or its metadata is missing.
        UnsafeArtifactError: a ``torch.export`` artifact asks for pickled or native code
            (:mod:`lightrec.inference.safe_archive`); nothing in it has run.
        ArtifactMetaError: the metadata is not JSON of the shape ``export`` writes.
        CorruptArtifactError: a TorchScript artifact that is not a whole zip archive (cut short, altered).
    """
    path = Path(path)
    meta_path = Path(str(path) + ".meta.json")
    for p in (path, meta_path):
        if not p.exists():
            raise FileNotFoundError(f"{str(p)!r} does not exist; write it with lightrec.inference.export(model, {str(path)!r})")
    meta = _read_meta(meta_path, path)
    if meta.get("uses_fbgemm"):
        if not fbgemm_available():
            raise RuntimeError(f"{str(path)!r} calls fbgemm ops but fbgemm_gpu is unavailable "
                               f"({fbgemm_unavailable_reason()}); re-export on a machine without fbgemm")
    from lightrec.inference.export import EXPORT_ID_FILE  # export imports this module's callers

    stamp = {EXPORT_ID_FILE: ""}  # filled by the loaders from the artifact (empty: exported before ids)
    if meta["format"] == "torchscript":
        try:
            module: nn.Module = torch.jit.load(str(path), map_location=torch.device(device), _extra_files=stamp)
        except RuntimeError as exc:  # torch's message names neither the file nor the fix
            damage = _zip_damage(path)
            if damage is None:
                raise
            raise CorruptArtifactError(f"{str(path)!r} is not a whole TorchScript artifact ({damage}): it was cut "
                                       "short or altered after it was written; export the model again",
                                       str(path)) from exc
    else:
        # An exported program bakes the device it was traced on into its graph (device checks,
        # tensor constructors): moving only the weights (``.module().to(device)``) leaves those
        # pointing at the old device. move_to_device_pass rewrites the graph and the state.
        # torch.export.load unpickles with weights_only=False wherever the archive asks it to; check
        # the archive first and load from the same handle, so the file checked is the file loaded.
        with open_checked(path) as archive:
            program = move_to_device_pass(torch.export.load(archive, extra_files=stamp), torch.device(device))
        module = program.module()
    _check_same_export(meta, stamp[EXPORT_ID_FILE], meta_path, path)
    return Predictor(module, meta, missing_features, device)


def _zip_damage(path: Path) -> str | None:
    """Why ``path`` is not an intact zip archive (what ``torch.jit.save`` writes), or None when it is one."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every entry, checking its CRC
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"not a zip archive: {exc}"
    return None if bad is None else f"entry {bad!r} fails its checksum"


def _check_same_export(meta: ArtifactMeta, artifact_id: str | bytes, meta_path: Path, path: Path) -> None:
    """Raise ``ArtifactMetaError`` unless ``meta`` and the artifact were written by one export: the
    ``export_id`` they both carry (none on either side: written before export ids, not compared)."""
    meta_id = meta.get("export_id")
    if isinstance(artifact_id, bytes):  # torch.jit.load fills bytes, torch.export.load str
        artifact_id = artifact_id.decode("utf-8", "replace")
    if not meta_id or not artifact_id or meta_id == artifact_id:
        return
    raise ArtifactMetaError(
        f"{str(meta_path)!r} belongs to another export than {str(path)!r} (export id {shown(meta_id)} in the "
        f"metadata, {shown(artifact_id)} in the artifact): an export was interrupted between writing the two "
        "files, or another one is writing them now; export the model again (or wait for that export to finish)"
    )


def _read_meta(meta_path: Path, path: Path) -> ArtifactMeta:
    """``<path>.meta.json``, checked for the fields ``load`` and ``Predictor`` read before any is used."""
    from lightrec.inference.export import EXPORT_FORMATS  # export imports this module's callers

    def bad(what: str) -> ArtifactMetaError:
        return ArtifactMetaError(f"{str(meta_path)!r}: {what}; it is not the metadata lightrec.inference.export "
                                 f"writes beside {path.name!r}: export the model again (both files are written together)")

    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise bad(f"a JSON {type(meta).__name__}, not an object")
    if meta.get("format") not in EXPORT_FORMATS:
        raise bad(f"field 'format' is {shown(meta.get('format'))}, not one of {list(EXPORT_FORMATS)}")
    names = meta.get("feature_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad(f"field 'feature_names' is {shown(names)}, not a list of feature names")
    tables = meta.get("tables")
    if not isinstance(tables, list) or not all(
        isinstance(t, dict) and isinstance(t.get("feature_names"), list) and isinstance(t.get("num_embeddings"), int)
        for t in tables
    ):
        raise bad(f"field 'tables' is {shown(tables)}, not a list of tables with 'feature_names' and 'num_embeddings'")
    for k, t in enumerate(tables):  # what Predictor reads of a table: feature names, a positive row count (id space)
        if not all(isinstance(f, str) for f in t["feature_names"]):
            raise bad(f"field 'tables[{k}].feature_names' is {shown(t['feature_names'])}, not a list of feature names")
        for key in ("num_embeddings", "id_space"):
            if key in t and (type(t[key]) is not int or t[key] <= 0):
                raise bad(f"field 'tables[{k}].{key}' is {shown(t[key])}, not a positive int")
    in_tables = [f for t in tables for f in t["feature_names"]]
    if names != in_tables:  # export writes the tables' features in order: the artifact's KJT keys
        raise bad(f"field 'feature_names' is {shown(names)}, not the features of 'tables' in order ({shown(in_tables)})")
    dense = meta.get("dense_in_features")
    if dense is not None and (type(dense) is not int or dense < 0):
        raise bad(f"field 'dense_in_features' is {shown(dense)}, not a width (an int >= 0) or null")
    for key in ("takes_dense", "is_weighted"):
        if key in meta and not isinstance(meta[key], bool):
            raise bad(f"field {key!r} is {shown(meta[key])}, not true or false")
    return cast("ArtifactMeta", meta)
