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

from lightrec.data.parquet.errors import ParquetFileError
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


def _scan(source: ParquetSource, info: ParquetFileInfo, row_group: int, column: str) -> tuple[int | None, int | None]:
    """Smallest and largest value of ``column`` in a row group, read from its pages (positioned reads, never a
    memory map: :func:`~lightrec.data.parquet.source.open_parquet`)."""
    info.check_unchanged(source.filesystem)  # the row group read must be the one the kept footer describes
    handle = open_parquet(source.filesystem, info.path)  # ParquetFileError: the footer does not read any more
    try:
        array = handle.read_row_group(row_group, columns=[column]).column(0)
    except (pa.ArrowException, OSError, ValueError) as exc:
        info.check_unchanged(source.filesystem)  # a file cut short or replaced meanwhile explains it better
        raise ParquetFileError(
            f"cannot read the row group to find the column's id range ({exc}); the file is truncated or corrupt: "
            "write or copy it again, or declare num_embeddings for its features",
            path=info.path, row_group=row_group, column=column,
        ) from exc  # fmt: skip
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

    Raises:
        ParquetFileError: a file's footer is damaged where it describes the column
            (:meth:`~lightrec.data.parquet.source.ParquetFileInfo.column_stats`), or a row group scanned cannot
            be read.
        ParquetFileChangedError: a file scanned changed since the source listed it.
    """
    low: int | None = None
    high: int | None = None
    nulls: int | None = 0
    scanned, unknown = 0, False
    for info in source.files:
        for g in range(len(info.row_groups)):
            stats = info.column_stats(g, column)
            lo: int | None
            hi: int | None
            if stats is not None and isinstance(stats.min, int) and isinstance(stats.max, int):
                lo, hi = int(stats.min), int(stats.max)
            elif scan:
                lo, hi = _scan(source, info, g, column)
                scanned += 1
            else:
                unknown = True
                continue
            # a list's leaf counts empty lists as nulls: the statistic says nothing here
            if stats is None or stats.null_count is None or stats.nested:
                nulls = None
            elif nulls is not None:
                nulls += stats.null_count
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

