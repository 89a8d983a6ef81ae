"""Arrow columns of one unit -> checked numpy arrays, column by column (no Python per row).

Per feature kind, from the Arrow buffers:

=================  ===========================================================================
label              ``[r]`` float32 (bools 0./1.); nulls, and labels outside {0, 1} under
                   ``binary_label``, are bad rows
dense (each)       ``[r]`` float32; nulls and NaN -> ``dense_fill``; infinities are bad rows;
                   ``dense_transform="log1p"``: ``log(1 + max(x, 0))``
scalar ids         ``values [r]`` int64 (a zero-copy view of an int64 column without nulls);
                   with ``nulls="empty"`` and nulls present: jagged, a null is a bag of length 0
list ids           ``offsets [r + 1]`` (the list offsets, rebased), ``values [V]`` int64: the list's
                   flat child buffer; null lists are empty bags (``nulls="empty"``) or bad rows
weights            ``[V]`` float32, the flat child of a ``list<float>`` column parallel to the ids; a
                   null list holds no weights (a bad row with ``nulls="error"``)
=================  ===========================================================================

Id checks (negative ids; ids ``>= num_embeddings`` for ``id_mapping="none"``) are skipped for a
unit whose row groups' column statistics already prove the range, which writers such as pyarrow,
Spark and DuckDB store by default. Problems are collected as :class:`BadRows` (a row mask per
check); :func:`raise_first` turns the first into a
:class:`~lightrec.data.parquet.errors.ParquetValueError`, or :meth:`UnitColumns.keep` drops them all
(``on_error="skip"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from lightrec.data.hashing import mix64
from lightrec.data.parquet.errors import ParquetValueError
from lightrec.data.parquet.reader import UnitRows
from lightrec.data.parquet.spec import FeatureSpec, SparseFeature

__all__ = ["BadRows", "SparseColumn", "UnitColumns", "read_columns", "raise_first"]


@dataclass
class SparseColumn:
    """One sparse feature's ids: ``values [r]`` (one per row, ``offsets`` None) or jagged."""

    values: np.ndarray
    offsets: np.ndarray | None = None
    weights: np.ndarray | None = None

    def lengths(self, rows: int) -> np.ndarray | None:
        """Ids per row (int32), or None when every row has exactly one."""
        return None if self.offsets is None else np.diff(self.offsets).astype(np.int32, copy=False)


@dataclass
class BadRows:
    """Rows of a unit that fail one check: a mask, the column, and the message of a row."""

    mask: np.ndarray
    column: str
    describe: Callable[[int], tuple[str, object]]


@dataclass
class UnitColumns:
    """A unit's columns as numpy arrays (module docstring)."""

    rows: int
    labels: np.ndarray
    dense: list[np.ndarray]
    sparse: list[SparseColumn]
    bad: list[BadRows] = field(default_factory=list)

    def rows_between(self, lo: int, hi: int) -> UnitColumns:
        """Rows ``[lo, hi)`` (views of the arrays; jagged offsets rebased to 0). ``bad`` is not carried."""
        sparse = []
        for col in self.sparse:
            if col.offsets is None:
                sparse.append(SparseColumn(col.values[lo:hi]))
                continue
            a, b = int(col.offsets[lo]), int(col.offsets[hi])
            weights = None if col.weights is None else col.weights[a:b]
            sparse.append(SparseColumn(col.values[a:b], col.offsets[lo : hi + 1] - a, weights))
        return UnitColumns(hi - lo, self.labels[lo:hi], [d[lo:hi] for d in self.dense], sparse)

    def keep(self, mask: np.ndarray) -> UnitColumns:
        """The rows where ``mask`` is True (bad rows dropped)."""
        sparse = []
        for col in self.sparse:
            if col.offsets is None:
                sparse.append(SparseColumn(col.values[mask]))
                continue
            lengths = np.diff(col.offsets)
            elements = np.repeat(mask, lengths)
            offsets = np.zeros(int(mask.sum()) + 1, dtype=np.int64)
            np.cumsum(lengths[mask], out=offsets[1:])
            weights = None if col.weights is None else col.weights[elements]
            sparse.append(SparseColumn(col.values[elements], offsets, weights))
        return UnitColumns(int(mask.sum()), self.labels[mask], [d[mask] for d in self.dense], sparse)


def _array(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)


def _int64(array: pa.Array) -> np.ndarray:
    values = (array.fill_null(0) if array.null_count else array).to_numpy()
    return values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)


def _rows_of(elements: np.ndarray, offsets: np.ndarray | None, rows: int) -> np.ndarray:
    """Row mask of the rows holding the given element indices."""
    if offsets is None:
        mask = np.zeros(rows, dtype=bool)
        mask[elements] = True
        return mask
    mask = np.zeros(rows, dtype=bool)
    mask[np.searchsorted(offsets, elements, side="right") - 1] = True
    return mask


def _labels(rows: UnitRows, spec: FeatureSpec, bad: list[BadRows]) -> np.ndarray:
    array = _array(rows.table, spec.label)
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        bad.append(BadRows(nulls, spec.label, lambda i: ("null label: every row needs one; fill or drop it when writing", None)))
    if pa.types.is_boolean(array.type):
        return array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.float32)
    labels = (array.fill_null(0) if array.null_count else array).to_numpy().astype(np.float32)
    if spec.binary_label and not (pa.types.is_integer(array.type) and _stats_within(rows, spec.label, 0, 1)):
        odd = (labels != 0) & (labels != 1)
        if odd.any():
            bad.append(BadRows(odd, spec.label, lambda i: (
                f"label {labels[i]:g} is not 0 or 1, which binary cross-entropy needs; pass binary_label=False "
                "for other targets, or fix the labels", labels[i])))  # fmt: skip
    elif not spec.binary_label:
        odd = ~np.isfinite(labels)
        if odd.any():
            bad.append(BadRows(odd, spec.label, lambda i: (f"label {labels[i]} is not a finite number", labels[i])))
    return labels


def _infinite(values: np.ndarray) -> Callable[[int], tuple[str, object]]:
    def describe(i: int) -> tuple[str, object]:
        return f"dense value {values[i]} is infinite; clip it when writing", float(values[i])

    return describe


def _dense(rows: UnitRows, spec: FeatureSpec, bad: list[BadRows]) -> list[np.ndarray]:
    out = []
    for name in spec.dense:
        array = _array(rows.table, name)
        if array.null_count:
            array = array.cast(pa.float64()).fill_null(spec.dense_fill)
        values = array.to_numpy().astype(np.float32, copy=False)
        if pa.types.is_floating(array.type):
            odd = ~np.isfinite(values)
            if odd.any():
                infinite = np.isinf(values)
                if infinite.any():
                    bad.append(BadRows(infinite, name, _infinite(values)))
                values = np.where(np.isnan(values), np.float32(spec.dense_fill), values)
        if spec.dense_transform == "log1p":
            values = np.log1p(np.maximum(values, 0, dtype=np.float32))
        out.append(np.ascontiguousarray(values, dtype=np.float32))
    return out


def _stats_within(rows: UnitRows, column: str, low: int, high: int) -> bool:
    """Whether every row group of the unit has statistics proving ``low <= value <= high`` for ``column``."""
    for s in rows.unit.block.slices:
        stats = rows.files[s.file].column_stats(s.row_group, column)  # ParquetFileError: a damaged footer
        if stats is None or not isinstance(stats.min, int) or not isinstance(stats.max, int):
            return False
        if stats.min < low or stats.max > high:
            return False
    return True


def _list_ids(array: pa.Array, feature: SparseFeature, bad: list[BadRows]) -> tuple[np.ndarray, pa.Array]:
    """``(offsets [r + 1] int64, flat child)`` of a list column; null lists are empty (or bad rows)."""
    offsets = array.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(offsets)
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        if feature.nulls == "error":
            bad.append(BadRows(nulls, feature.column, lambda i: (
                f"null list of ids in feature {feature.name!r}: set nulls='empty' for it to read a null as an empty "
                "bag, or write empty lists", None)))  # fmt: skip
        lengths[nulls] = 0
        child = array.flatten()
    else:
        child = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    rebased = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(lengths, out=rebased[1:])
    return rebased, child


def _sparse(rows: UnitRows, feature: SparseFeature, bad: list[BadRows]) -> SparseColumn:
    array = _array(rows.table, feature.column)
    r = rows.table.num_rows
    offsets: np.ndarray | None = None
    if pa.types.is_integer(array.type):
        if array.null_count and feature.nulls == "empty":
            offsets = np.zeros(r + 1, dtype=np.int64)
            np.cumsum(array.is_valid().to_numpy(zero_copy_only=False), out=offsets[1:])
            child = array.drop_null()
        else:
            if array.null_count:
                bad.append(BadRows(array.is_null().to_numpy(zero_copy_only=False), feature.column, lambda i: (
                    f"null id in feature {feature.name!r}: set nulls='empty' for it to read a null as an empty bag, or "
                    "fill the nulls when writing", None)))  # fmt: skip
            child = array
    else:
        offsets, child = _list_ids(array, feature, bad)
        if child.null_count:
            at = np.flatnonzero(child.is_null().to_numpy(zero_copy_only=False))
            bad.append(BadRows(_rows_of(at, offsets, r), feature.column, lambda i: (
                f"null id inside the list of feature {feature.name!r}: drop nulls from the lists when writing", None)))
    values = _int64(child)
    _check_ids(rows, feature, values, offsets, r, bad, unsigned=pa.types.is_uint64(child.type))
    weights = None
    if feature.weights is not None and offsets is not None:
        weights = _weights(rows, feature, offsets, bad)
    return SparseColumn(values, offsets, weights)


def _check_ids(
    rows: UnitRows, feature: SparseFeature, values: np.ndarray, offsets: np.ndarray | None, r: int, bad: list[BadRows],
    unsigned: bool = False,
) -> None:  # fmt: skip
    """Collect negative ids and, for ``id_mapping="none"``, ids past the table; ``unsigned``: ``values`` are a
    ``uint64`` column's bits, where a negative value is an id above ``2**63 - 1``."""
    if feature.id_mapping == "hash":
        return  # any int64 is a raw id
    n = feature.num_embeddings if feature.id_mapping == "none" else None
    # Never past 2**63 - 1, even for a declared table larger than that: a uint64 id above it is read as negative
    # int64 bits, so statistics up to the table's end would let it through unchecked.
    if _stats_within(rows, feature.column, 0, min(n - 1, 2**63 - 1) if n is not None else 2**63 - 1):
        return
    negative = np.flatnonzero(values < 0)
    if negative.size:
        bad.append(BadRows(_rows_of(negative, offsets, r), feature.column, _first_value(values, offsets, negative, lambda v: (
            f"id {v + 2**64} in feature {feature.name!r} is above 2**63 - 1, the largest id lightrec holds (ids are "
            "int64); map raw 64-bit ids with id_mapping='hash' and num_embeddings" if unsigned else
            f"negative id {v} in feature {feature.name!r}: ids index embedding rows and must be >= 0; fix the writer, "
            "or map raw ids with id_mapping='hash' and num_embeddings"))))  # fmt: skip
    if n is not None:
        high = np.flatnonzero(values >= n)
        if high.size:
            bad.append(BadRows(_rows_of(high, offsets, r), feature.column, _first_value(values, offsets, high, lambda v: (
                f"id {v} of feature {feature.name!r} is out of range for its table of {n} rows (num_embeddings); "
                "declare a larger num_embeddings, or map raw ids with id_mapping='modulo' or 'hash'"))))  # fmt: skip


def _first_value(
    values: np.ndarray, offsets: np.ndarray | None, elements: np.ndarray, text: Callable[[int], str]
) -> Callable[[int], tuple[str, object]]:
    """The message of a row: the first of ``elements`` that lies in it."""

    def describe(i: int) -> tuple[str, object]:
        if offsets is None:
            value = int(values[i])
        else:
            inside = elements[(elements >= offsets[i]) & (elements < offsets[i + 1])]
            value = int(values[inside[0]])
        return text(value), value

    return describe


def _weights(rows: UnitRows, feature: SparseFeature, ids_offsets: np.ndarray, bad: list[BadRows]) -> np.ndarray:
    """``[V]`` float32 weights parallel to the ids (``ids_offsets [r + 1]``); mismatched rows are bad rows."""
    assert feature.weights is not None
    array = _array(rows.table, feature.weights)
    # A null weights list holds no weights: parallel to a null (nulls="empty") or empty ids list, an empty bag;
    # beside ids, a row whose lengths differ (below). Under nulls="error" it is a bad row of its own.
    offsets, child = _list_ids(array, replace(feature, column=feature.weights, nulls="empty"), bad)
    if array.null_count and feature.nulls == "error":
        bad.append(BadRows(array.is_null().to_numpy(zero_copy_only=False), feature.weights, lambda i: (
            f"null list of weights of feature {feature.name!r}: write an empty list where a row has no ids, or set "
            "nulls='empty' for the feature to read null ids with null weights as an empty bag", None)))  # fmt: skip
    r = len(ids_offsets) - 1
    if child.null_count:
        at = np.flatnonzero(child.is_null().to_numpy(zero_copy_only=False))
        bad.append(BadRows(_rows_of(at, offsets, r), feature.weights, lambda i: ("null weight", None)))
        child = child.fill_null(0)
    values = child.to_numpy().astype(np.float32, copy=False)
    mismatch = np.diff(offsets) != np.diff(ids_offsets)
    if not mismatch.any():
        return values
    counts = np.diff(ids_offsets), np.diff(offsets)
    bad.append(BadRows(mismatch, feature.weights, lambda i: (
        f"the row has {counts[0][i]} ids but {counts[1][i]} weights; the weights of feature {feature.name!r} must "
        "be parallel to its ids", int(counts[1][i]))))  # fmt: skip
    return _align_weights(values, offsets, ids_offsets, mismatch)


def _align_weights(values: np.ndarray, offsets: np.ndarray, ids_offsets: np.ndarray, mismatch: np.ndarray) -> np.ndarray:
    """``[V]`` weights laid out on the ids' offsets: each good row's own weights, 1.0 for a mismatched row's ids.

    ``values [W]`` / ``offsets [r + 1]`` are the weights column, ``ids_offsets [r + 1]`` the ids', and
    ``mismatch [r]`` the rows whose lengths differ. The mismatched rows are dropped (``on_error="skip"``)
    or raised, so their filler never reaches a batch; the good rows of the unit keep their weights.
    """
    ids_lengths = np.diff(ids_offsets)
    row = np.repeat(np.arange(len(ids_lengths)), ids_lengths)  # [V]: the row of each id
    good = ~mismatch[row]
    at = offsets[row[good]] + (np.flatnonzero(good) - ids_offsets[row[good]])  # the id's weight in ``values``
    out = np.ones(int(ids_offsets[-1]), dtype=np.float32)
    out[good] = values[at]
    return out


def mapped_ids(feature: SparseFeature, values: np.ndarray) -> np.ndarray:
    """Ids after the feature's ``id_mapping`` (``"modulo"``, ``"hash"``; the others unchanged)."""
    n = feature.num_embeddings
    if feature.id_mapping == "modulo" and n is not None:
        return values % np.int64(n)
    if feature.id_mapping == "hash" and n is not None:
        mixed = mix64(values.view(np.uint64))
        return (mixed % np.uint64(n)).astype(np.int64)
    return values


def read_columns(rows: UnitRows, spec: FeatureSpec) -> UnitColumns:
    """The unit's label, dense and sparse columns, checked (problems in ``UnitColumns.bad``)."""
    bad: list[BadRows] = []
    labels = _labels(rows, spec, bad)
    dense = _dense(rows, spec, bad)
    sparse = [_sparse(rows, f, bad) for f in spec.sparse]
    return UnitColumns(rows.table.num_rows, labels, dense, sparse, bad)


def raise_first(rows: UnitRows, bad: list[BadRows]) -> None:
    """Raise :class:`ParquetValueError` for the earliest bad row (the first check that failed on it)."""
    first = min(bad, key=lambda b: int(np.argmax(b.mask)))
    i = int(np.argmax(first.mask))
    message, value = first.describe(i)
    where = rows.locate(i)
    raise ParquetValueError(
        message + " (or pass on_error='skip' to leave bad rows out, counted)",
        path=where.path, row_group=where.row_group, column=first.column, row=where.row, file_row=where.file_row,
        value=value,
    )  # fmt: skip


def skip_messages(rows: UnitRows, bad: list[BadRows], keep: int) -> list[str]:
    """Messages for the first ``keep`` bad rows (with their location), for the skip log."""
    out: list[str] = []
    for b in bad:
        for i in np.flatnonzero(b.mask)[: max(keep - len(out), 0)]:
            where = rows.locate(int(i))
            message, _ = b.describe(int(i))
            out.append(f"{where.path}, row group {where.row_group}, column {b.column!r}, row {where.row}: {message}")
    return out
