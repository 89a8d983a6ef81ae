"""The bodies ``POST /predict`` takes, decoded and validated one request at a time.

Three forms (``I`` dense features, features ``F`` in the artifact's order)::

    one sample (Predictor's form)   {"dense": [I floats], "sparse": {"f": [ids]}, "weights": {"f": [floats]}}
    several samples                 [sample, sample, ...]          (Predictor.predict's list)
    compact batch                   {"batch": {"dense": [[I floats], ...],          B rows
                                               "lengths": {"f": [B ints]},          ids per sample
                                               "ids": {"f": [sum(lengths) ints]},   sample after sample
                                               "weights": {"f": [floats, one per id]},
                                               "size": B}}                          optional

In the compact form a feature left out of ``ids`` and ``lengths`` has no ids in any sample, and
``size`` is needed only by a model without dense features that gets no ``lengths`` either. Samples
are validated by :class:`~lightrec.inference.Predictor` (``check_request``, ``check_dense``,
``check_ids``: the rules of ``docs/serving.md``), so the server accepts exactly what ``Predictor``
accepts, and an error names the sample's index in the body, the field and the value. A compact batch's
bad dense row, id or weight is named where the client wrote it: ``batch.dense[b]``, ``batch.dense[b][j]``,
``batch.ids.f[k]``, ``batch.weights.f[k]`` (``k`` its position in the flat list) with the sample it belongs to; a
batch too large, or of no size, names the key its size came from (``batch.size``, ``batch.dense`` or
``batch.lengths.f``). A JSON integer longer than Python converts (4300
digits) gets a 400 naming its line, column and character offset.

A decoded request is :class:`SampleColumns` -- the samples as columns, ready to join others in a
batch (:mod:`lightrec.serving.batching`) -- or :class:`Rejected`, which the API answers with a 4xx
without letting the request reach a batch (one bad request never fails the others).
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from lightrec.inference.predictor import (
    FLOAT32_MAX,
    CheckedRequest,
    Predictor,
    RequestError,
    finite_float32,
    shown,
)

__all__ = ["Rejected", "SampleColumns", "decode_body", "reject"]

_BATCH_KEYS = ("dense", "lengths", "ids", "weights", "size")


@dataclass
class SampleColumns:
    """The samples of one request as columns (what batching joins).

    Attributes:
        size: number of samples ``B``.
        dense: ``B * I`` floats, sample after sample.
        lengths: per feature (artifact order), ``B`` id counts.
        ids: per feature, the ids of sample 0, then of sample 1, ...
        weights: per feature, one float per id (weighted models; ones where the request gave none), else None.
    """

    size: int
    dense: list[float]
    lengths: list[list[int]]
    ids: list[list[int]]
    weights: list[list[float]] | None


class RejectedBody(TypedDict):
    """The JSON error body of a rejected request."""

    error: str
    index: int | None
    field: str | None
    value: object


@dataclass
class Rejected:
    """A request answered with ``status`` and the error body ``{"error", "index", "field", "value"}``."""

    status: int
    message: str
    index: int | None = None
    field: str | None = None
    value: object = None

    def body(self) -> RejectedBody:
        return {"error": self.message, "index": self.index, "field": self.field, "value": _shown(self.value)}


def reject(error: RequestError, status: int = 422) -> Rejected:
    """The :class:`Rejected` of a :class:`~lightrec.inference.RequestError` (its index, field and value)."""
    return Rejected(status, str(error), error.index, error.field, error.value)


_shown = shown  # the truncation of Predictor's messages: one rule for every value the server echoes


def _json(value: object, limit: int = 200) -> str:
    """``value`` as JSON text for a message (``[NaN]``, ``[true]``, ``null``: as the client wrote it, not Python's
    repr), truncated as :func:`_shown` truncates: the start of the text and its length (a string's: its characters)."""
    if isinstance(value, str):
        return json.dumps(_shown(value, limit))
    try:
        text = json.dumps(value)  # NaN and infinities in their JSON spellings
    except (TypeError, ValueError, RecursionError):  # no JSON text (an int past Python's digits, nested too deeply)
        return str(_shown(value, limit))
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def decode_body(predictor: Predictor, body: object, max_samples: int) -> SampleColumns | Rejected:
    """Decode and validate one HTTP body (any of the three forms).

    Args:
        predictor: validates the samples (the served artifact's features, tables and dense width).
        body: the parsed JSON (bytes or text when the client sent no JSON content type).
        max_samples: most samples one request may carry (more: 413).

    Returns:
        The samples, or the error to answer with (400 malformed body, 413 too many samples, 422 invalid sample).
    """
    if isinstance(body, (bytes, bytearray, str)):
        text = body
        if not text.strip():
            return Rejected(400, "the body is empty; send a JSON object (one sample or {'batch': ...}) or a list",
                            None, "body", "")
        try:
            body = json.loads(text)
        except ValueError as exc:
            return _too_long_number(text, exc) or Rejected(400, f"the body is not JSON ({exc}); send a JSON object", None,
                                                      "body", _excerpt(text))
        except RecursionError:  # json.loads recurses per nesting level: "[[[[...]]]]" thousands deep
            return Rejected(400, "the body's JSON is nested too deeply to parse; a request nests 4 levels at "
                            "most (see docs/serving.md for its forms)", None, "body", _excerpt(text))
    try:
        if isinstance(body, list):
            if not body:
                return Rejected(400, "the body is an empty list; send at least one sample", None, "body", [])
            if len(body) > max_samples:
                return _too_many(len(body), max_samples)
            return _columns(predictor, [predictor.check_request(sample, i) for i, sample in enumerate(body)])
        if isinstance(body, dict) and "batch" in body:
            if len(body) != 1:
                extra = sorted(set(body) - {"batch"})
                return Rejected(400, f"a compact batch body holds only 'batch'; unknown keys {_shown(extra)}", None,
                                _key(extra[0]), extra[0])
            return _compact(predictor, body["batch"], max_samples)
        if isinstance(body, dict):
            return _columns(predictor, [predictor.check_request(body, 0)])
    except RequestError as exc:
        return reject(exc)
    return Rejected(400, f"the body must be a JSON object (one sample or {{'batch': ...}}) or a list of samples, "
                    f"got {type(body).__name__}", None, "body", type(body).__name__)


def _key(key: str) -> str:
    """A ``field`` that is a client's key, truncated like a shown value."""
    return str(_shown(str(key)))


def _excerpt(body: bytes | bytearray | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    return text[:80] + ("..." if len(text) > 80 else "")


def _too_long_number(body: bytes | bytearray | str, error: ValueError) -> Rejected | None:
    """The 400 of a JSON integer longer than Python converts (``sys.get_int_max_str_digits()``, 4300 digits), which
    ``json.loads`` refuses (``error``) without saying where; None for its other errors.

    ``json.loads`` stops at the first such integer, so the body before it is valid JSON: a run of digits is in a
    string when an odd number of (unescaped) quotes precede it. A number with a fraction or an exponent is a float,
    which has no limit. One pass of C-level scans, however many strings and numbers the body holds.
    """
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0  # 3.10.7+, 3.11
    if type(error) is not ValueError or not limit:  # JSONDecodeError, UnicodeDecodeError: the body's syntax
        return None
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    quotes, seen = 0, 0
    # an integer: digits (after a '-') that neither follow nor precede a float's; (?=) first: 2.5x faster a character
    for match in re.finditer(r"(?=[-\d])(?<![\d.eE+-])-?\d{" + str(limit + 1) + r",}(?![\d.eE])", text):
        start = match.start()
        quotes += re.sub(r"\\.", "", text[seen:start]).count('"')  # the quotes that open or close a string
        seen = start
        if quotes % 2:
            continue  # digits in a string
        number, line, column = match.group(), text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
        return Rejected(400, f"the body holds a number of {len(number.lstrip('-'))} digits at line {line} column "
                        f"{column} (char {start}); JSON integers here have {limit} digits at most: ids are 64-bit "
                        "ints and values float32, send them in range", None, "body", number)
    return None


def _too_many(size: int, max_samples: int, field: str = "size") -> Rejected:
    # a client's 'batch.size' may have thousands of digits: shown truncated, as every value the server echoes
    return Rejected(413, f"the request holds {_shown(size)} samples, more than the server's limit of {max_samples}; "
                    "split it", None, field, size)


def _columns(predictor: Predictor, samples: list[CheckedRequest]) -> SampleColumns:
    """Columns of checked samples (``Predictor.check_request``'s results), in the artifact's feature order."""
    features = predictor.feature_names
    dense = [x for s in samples for x in s.dense]
    if len(samples) == 1:  # the common request: no comprehension per (feature, sample)
        one = samples[0].ids
        ids = [one.get(f, []) for f in features]  # check_request's lists: fresh, owned by this request
        lengths = [[len(x)] for x in ids]
    else:
        lengths = [[len(s.ids.get(f, ())) for s in samples] for f in features]
        ids = [[i for s in samples for i in s.ids.get(f, ())] for f in features]
    weights = None
    if predictor.is_weighted:
        weights = [[w for s in samples for w in s.weights.get(f, [1.0] * len(s.ids.get(f, ())))] for f in features]
    return SampleColumns(len(samples), dense, lengths, ids, weights)


def _compact(predictor: Predictor, batch: object, max_samples: int) -> SampleColumns | Rejected:
    if not isinstance(batch, dict):
        return Rejected(400, f"'batch' must be an object with keys {list(_BATCH_KEYS)}, got {type(batch).__name__}",
                        None, "batch", type(batch).__name__)
    unknown = sorted(set(batch) - set(_BATCH_KEYS))
    if unknown:
        return Rejected(400, f"unknown keys {_shown(unknown)} in 'batch'; it takes {list(_BATCH_KEYS)}", None,
                        _key(f"batch.{unknown[0]}"), unknown[0])
    per_feature: dict[str, Any] = {}
    for key in ("lengths", "ids", "weights"):
        part = batch.get(key, {})
        if not isinstance(part, dict):
            return Rejected(400, f"'batch.{key}' must be an object feature -> list, got {type(part).__name__}",
                            None, f"batch.{key}", type(part).__name__)
        unknown = sorted(set(part) - set(predictor.feature_names))
        if unknown:
            return Rejected(422, f"unknown features {_shown(unknown)} in 'batch.{key}'; the model's features are "
                            f"{predictor.feature_names}", None, f"batch.{key}", unknown[0])
        per_feature[key] = part
    sized = _batch_size(predictor, batch, per_feature["lengths"])
    if isinstance(sized, Rejected):
        return sized
    size, source = sized
    if size > max_samples:
        return _too_many(size, max_samples, source)
    dense = batch.get("dense")
    if not predictor.takes_dense and dense not in (None, []):
        return Rejected(422, "the model takes no dense features, but 'batch.dense' was given", None, "batch.dense", None)
    if predictor.takes_dense and (not isinstance(dense, list) or len(dense) != size):
        got = len(dense) if isinstance(dense, list) else type(dense).__name__
        return Rejected(422, f"'batch.dense' must be a list of {size} rows of {predictor.dense_in_features} floats, "
                        f"got {got}", None, "batch.dense", got)
    given = cast("list[object]", dense) if predictor.takes_dense else []  # a list of `size` rows (checked above)
    rows = [predictor.check_dense(b, given[b], f"batch.dense[{b}]") for b in range(size)] if given else []
    columns = SampleColumns(size, [x for row in rows for x in row], [], [], [] if predictor.is_weighted else None)
    for f in predictor.feature_names:
        problem = _add_feature(predictor, columns, f, per_feature)
        if problem is not None:
            return problem
    return columns


def _batch_size(predictor: Predictor, batch: dict[str, Any], lengths: dict[str, Any]) -> tuple[int, str] | Rejected:
    """The batch's size and the key it came from (``batch.size``, ``batch.dense``, ``batch.lengths.<f>``)."""
    size, source = batch.get("size"), "batch.size"
    if size is None:
        if predictor.takes_dense and isinstance(batch.get("dense"), list):
            size, source = len(batch["dense"]), "batch.dense"
        elif lengths:
            feature, first = next(iter(lengths.items()))
            source = _key(f"batch.lengths.{feature}")
            if not isinstance(first, list):
                return Rejected(422, f"the batch's size is unknown: {source!r} is {type(first).__name__}, not a list; "
                                "give 'batch.size' (a positive int), or 'batch.dense' rows", None, source,
                                type(first).__name__)
            size = len(first)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        # any JSON value (a 40000-character string, a long list): shown truncated, never echoed whole
        return Rejected(422, f"the batch's size is {_json(size)}" + ("" if source == "batch.size" else f" (from "
                        f"{source!r})") + ": give 'batch.size' (a positive int), or 'batch.dense' rows", None, source,
                        size)
    return size, source


def _add_feature(predictor: Predictor, columns: SampleColumns, feature: str, parts: dict[str, Any]) -> Rejected | None:
    """Check feature ``feature``'s lengths, ids and weights and append them to ``columns``."""
    size = columns.size
    lengths, ids, weights = (parts[k].get(feature) for k in ("lengths", "ids", "weights"))
    if lengths is None and ids is None:
        if predictor.missing_features == "error":
            return Rejected(422, f"feature {feature!r} is missing (missing_features='error'); send zero lengths for "
                            "no ids", None, f"batch.lengths.{feature}", None)
        lengths, ids = [0] * size, []
    if (not isinstance(lengths, list) or len(lengths) != size
            or not all(type(n) is int and n >= 0 for n in lengths)):  # fmt: skip
        return Rejected(422, f"'batch.lengths.{feature}' must be {size} non-negative ints (ids per sample), got "
                        f"{_json(lengths, 80)}", None, f"batch.lengths.{feature}", lengths)
    total = sum(lengths)
    if not isinstance(ids, list) or len(ids) != total:
        got = len(ids) if isinstance(ids, list) else type(ids).__name__
        return Rejected(422, f"'batch.ids.{feature}' must hold sum(lengths) = {_shown(total)} ids, got {got}",
                        None, f"batch.ids.{feature}", got)
    if not predictor.ids_in_range(feature, ids):
        return _bad_id(predictor, feature, ids, lengths)
    columns.lengths.append(lengths)
    columns.ids.append(ids)
    if columns.weights is not None:
        if weights is None:
            weights = [1.0] * len(ids)
        if not isinstance(weights, list) or len(weights) != len(ids):
            got = len(weights) if isinstance(weights, list) else type(weights).__name__
            return Rejected(422, f"'batch.weights.{feature}' must be {len(ids)} numbers (one per id), got {got}", None,
                            f"batch.weights.{feature}", got)
        floats = [finite_float32(w) for w in weights]
        if None in floats:
            return _bad_weight(feature, weights, floats.index(None), lengths)
        columns.weights.append(cast("list[float]", floats))  # no None left
    elif weights is not None:
        return Rejected(422, "'batch.weights' given but the model is not weighted; drop them", None,
                        f"batch.weights.{feature}", None)
    return None


def _bad_id(predictor: Predictor, feature: str, ids: list[object], lengths: list[int]) -> Rejected:
    """The 422 of the first id of ``feature`` that is not an int in its table's range, named as the compact form
    names it (``batch.ids.<feature>[k]``, ``k`` its position in the flat list) with the sample it belongs to."""
    rules = predictor.rules
    rows = rules.id_spaces[rules.feature_names.index(feature)]
    k = next(k for k, i in enumerate(ids) if not predictor.ids_in_range(feature, [i]))
    value = ids[k]
    sample = bisect.bisect_right(list(itertools.accumulate(lengths)), k)  # the first sample whose ids end past k
    where = f"request {sample}: batch.ids.{feature}[{k}]"
    if isinstance(value, bool) or not isinstance(value, int):
        message = f"{where}={_shown(value)!r} is not an integer id; ids of feature {feature!r} are ints in [0, {rows})"
    else:
        fix = ("its managed-collision table takes raw ids in that range" if feature in rules.managed
               else "hash or take ids modulo the table size")  # fmt: skip
        message = f"{where}={_shown(value)} is outside [0, {rows}), the ids of the table of feature {feature!r}; {fix}"
    return Rejected(422, message, sample, f"batch.ids.{feature}[{k}]", value)


def _bad_weight(feature: str, weights: list[object], k: int, lengths: list[int]) -> Rejected:
    """The 422 of weight ``k`` of ``feature`` (not a finite float32 number), naming the sample it belongs to."""
    sample = bisect.bisect_right(list(itertools.accumulate(lengths)), k)  # the first sample whose ids end past k
    return Rejected(422, f"request {sample}: batch.weights.{feature}[{k}]={_shown(weights[k])!r} is not a finite "
                    f"number (weights are float32: |w| <= {FLOAT32_MAX:.7g})", sample, f"batch.weights.{feature}[{k}]",
                    weights[k])
