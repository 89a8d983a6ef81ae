"""Table sizes of a Parquet source's sparse features, and the id ranges behind them.

A feature's table has ``num_embeddings`` rows, chosen in one of three documented ways:

1. **declared**: ``num_embeddings`` given for the feature (a dict entry of ``sparse``) or for all
   (``ParquetDataModule(num_embeddings=...)``); with ``id_mapping="none"`` every id must be below it
   (a larger one is a :class:`~lightrec.data.parquet.errors.ParquetValueError`);
2. **from the data**: ``id_mapping="none"`` without a declared size -> largest id + 1, over every file
   of the source (train, validation and test alike, so no split has an id its table lacks). The
   largest id comes from the row groups' column statistics (min/max, which Parquet writers store;
   free to read); a row group without statistics is scanned (its column only, once, logged);
3. **for raw ids**: ``id_mapping="modulo"`` / ``"hash"`` fold raw ids into ``num_embeddings`` rows,
   ``"managed"`` hands raw 64-bit ids to tables behind managed collisions of ``num_embeddings`` rows;
   the size is declared (required).

A ``uint64`` column whose largest id is above ``2**63 - 1`` cannot size a table (ids are int64): a
``ValueError`` says to hash the ids or declare the size.

:func:`id_ranges` gives each feature's ``(min, max, nulls)`` -- what ``lightrec data inspect`` prints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from lightrec.data.parquet.source import ParquetFileInfo, ParquetSource, open_parquet
from lightrec.data.parquet.spec import FeatureSpec

__all__ = ["IdRange", "column_range", "id_ranges", "size_tables"]

logger = logging.getLogger(__name__)

_INT64_MAX = 2**63 - 1  # the largest id a table row can have: ids are int64


@dataclass(frozen=True)
class IdRange:
    """Smallest and largest id of a column over a source, and how many were null (None: unknown)."""

    min: int | None
    max: int | None
    nulls: int | None
    scanned_row_groups: int = 0


def _leaf(meta: object, column: str) -> int | None:
    group = meta.row_group(0)  # type: ignore[attr-defined]
    for j in range(group.num_columns):
        path = group.column(j).path_in_schema
        if path == column or path.startswith(column + "."):
            return j
    return None


def _scan(source: ParquetSource, info: ParquetFileInfo, row_group: int, column: str) -> tuple[int | None, int | None]:
    array = open_parquet(source.filesystem, info.path).read_row_group(row_group, columns=[column]).column(0)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        array = pc.list_flatten(array)
    bounds = pc.min_max(array)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return (int(low) if low is not None else None), (int(high) if high is not None else None)


def column_range(source: ParquetSource, column: str, scan: bool = True) -> IdRange:
    """:class:`IdRange` of an integer or list-of-integer column over every file of ``source``.

    Args:
        source: the files.
        column: the column.
        scan: read row groups without statistics (else their range stays unknown: min/max None).
    """
    low: int | None = None
    high: int | None = None
    nulls: int | None = 0
    scanned, unknown = 0, False
    for info in source.files:
        meta = info.metadata
        leaf = _leaf(meta, column) if meta is not None and meta.num_row_groups else None
        if meta is not None and leaf is not None and meta.row_group(0).column(leaf).path_in_schema != column:
            nulls = None  # a list's leaf counts empty lists as nulls: the statistic says nothing here
        for g in range(len(info.row_groups)):
            stats = meta.row_group(g).column(leaf).statistics if meta is not None and leaf is not None else None
            lo: int | None
            hi: int | None
            if stats is not None and stats.has_min_max and isinstance(stats.min, int):
                lo, hi = int(stats.min), int(stats.max)
            elif scan:
                lo, hi = _scan(source, info, g, column)
                scanned += 1
            else:
                unknown = True
                continue
            if stats is None or not stats.has_null_count:
                nulls = None
            elif nulls is not None:
                nulls += int(stats.null_count)
            low = lo if low is None or (lo is not None and lo < low) else low
            high = hi if high is None or (hi is not None and hi > high) else high
    if unknown:
        return IdRange(None, None, None, scanned)
    return IdRange(low, high, nulls, scanned)


def id_ranges(source: ParquetSource, spec: FeatureSpec, scan: bool = True) -> dict[str, IdRange]:
    """``{feature: IdRange}`` for every sparse feature of ``spec``."""
    return {f.name: column_range(source, f.column, scan) for f in spec.sparse}


def size_tables(source: ParquetSource, spec: FeatureSpec) -> FeatureSpec:
    """``spec`` with every feature's ``num_embeddings`` set (module docstring: declared or from the data).

    Raises:
        ValueError: a feature without a declared size has no ids at all, or only negative ones. (A few
            negative ids among others are bad rows, named when they are read.)
    """
    sizes: list[int] = []
    for feature in spec.sparse:
        if feature.num_embeddings is not None:
            sizes.append(feature.num_embeddings)
            continue
        found = column_range(source, feature.column)
        if found.scanned_row_groups:
            logger.info(
                "feature %r: %d row group(s) without column statistics were scanned for the largest id",
                feature.name, found.scanned_row_groups,
            )  # fmt: skip
        if found.max is None:
            raise ValueError(
                f"feature {feature.name!r}: column {feature.column!r} holds no ids at all, so its table cannot be sized "
                "from the data; declare num_embeddings for it"
            )
        if found.max < 0:  # a few negative ids are bad rows (named when read); all negative: raw ids
            raise ValueError(
                f"feature {feature.name!r}: column {feature.column!r} holds only negative ids (largest {found.max}), so "
                "they are not row indices: map them with id_mapping='hash' and declare num_embeddings"
            )
        if found.max > _INT64_MAX:
            # A uint64 column's ids past int64: a table of found.max + 1 rows cannot exist, and the ids are read
            # as int64 bits (negative), which a table sized to hold them would not check any more.
            raise ValueError(
                f"feature {feature.name!r}: column {feature.column!r} holds uint64 ids up to the largest id "
                f"{found.max}, above 2**63 - 1 (ids are int64), so its table cannot be sized from the data: map raw "
                "64-bit ids with id_mapping='hash' and num_embeddings, or declare num_embeddings (larger ids are then "
                "bad rows, which on_error='skip' leaves out)"
            )
        sizes.append(int(found.max) + 1)
    return spec.with_sizes(sizes)

