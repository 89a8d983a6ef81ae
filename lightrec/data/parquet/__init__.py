"""Parquet event logs in, ``Batch`` es with a ``KeyedJaggedTensor`` out: sharded, resumable, following new files.

The DataModule, :class:`ParquetDataModule` (``lightrec.data.ParquetDataModule``), is what most users
need; it is imported lazily (it imports Lightning). The pieces below it work without Lightning:

* :class:`ParquetSource` (``source.py``): a path, folder, glob or URI -> files and footers;
* :func:`build_spec` / :class:`FeatureSpec` (``spec.py``) and :func:`size_tables` (``sizing.py``):
  which columns are label, dense and sparse features, and the tables' sizes;
* :func:`split_slices` (``splits.py``): training, validation and test rows;
* :func:`plan_epoch` (``sharding.py``): ranks and workers -> disjoint rows, equal steps;
* :class:`ParquetLoader` (``loader.py``, with ``reader.py``, ``columns.py``, ``batches.py``,
  ``transport.py``): one rank's batches, read by loader workers, resumable (``state.py``);
* :class:`FollowingParquetLoader` (``follow.py``): an unbounded source over a growing folder, from
  :func:`following_source` (the complete files there at the start, or the first to land);
* ``ranks.py``: every rank reads rank 0's listing of the files (the DataModule's ``setup``), on the
  data's own gloo group;
* the errors (``errors.py``); ``lightrec data convert`` (``convert.py``, reading text with
  ``text_blocks.py`` and ``text_tables.py``) and ``lightrec data inspect`` (``inspection.py``).
"""

from __future__ import annotations

from typing import Any

from lightrec.data.parquet.errors import (
    ParquetDataError,
    ParquetFileChangedError,
    ParquetFileError,
    ParquetSchemaError,
    ParquetValueError,
)
from lightrec.data.parquet.follow import FollowingParquetLoader, FollowOptions, WaitsForData, following_source
from lightrec.data.parquet.loader import ParquetLoader
from lightrec.data.parquet.ranks import RankDataMismatchError
from lightrec.data.parquet.sharding import plan_epoch, slices_of
from lightrec.data.parquet.sizing import id_ranges, size_tables
from lightrec.data.parquet.source import ParquetSource
from lightrec.data.parquet.spec import FeatureSpec, SparseFeature, build_spec
from lightrec.data.parquet.splits import split_slices
from lightrec.data.parquet.state import ResumeMismatchError

__all__ = [
    "FeatureSpec",
    "FollowOptions",
    "FollowingParquetLoader",
    "ParquetDataError",
    "ParquetDataModule",
    "ParquetFileChangedError",
    "ParquetFileError",
    "ParquetLoader",
    "ParquetSchemaError",
    "ParquetSource",
    "ParquetValueError",
    "RankDataMismatchError",
    "ResumeMismatchError",
    "SparseFeature",
    "WaitsForData",
    "build_spec",
    "following_source",
    "id_ranges",
    "plan_epoch",
    "size_tables",
    "slices_of",
    "split_slices",
]


def __getattr__(name: str) -> Any:
    if name == "ParquetDataModule":  # imports Lightning: only when asked for
        from lightrec.data.parquet.datamodule import ParquetDataModule

        return ParquetDataModule
    raise AttributeError(f"module 'lightrec.data.parquet' has no attribute {name!r}")
