"""Data for recommendation models: the ``Batch`` type, synthetic Criteo-like data, Criteo and
MovieLens readers, and rank-aware LightningDataModules.

Everything yields whole :class:`Batch` objects (dense ``[B, D]``, sparse ``KeyedJaggedTensor``,
labels ``[B]``). The LightningDataModules (``SyntheticCriteo``, ``SyntheticStream``, ``CriteoDataModule``,
``MovieLensDataModule``, ``ParquetDataModule``) are imported lazily, so ``from lightrec.data import Batch`` does not
import Lightning (layers below ``lightrec.lightning`` may use ``Batch``).

One home per source::

    batch.py           Batch, collate_samples, concat_batches
    rank_sampling.py   which batches each rank reads (RankBatchSampler, rank_dataloader)
    datamodules.py     the LightningDataModules over the sources below
    errors.py          DataFormatError, DatasetNotFoundError, the raise-or-skip policy of bad lines
    csv_readers.py     torchrec's small file readers (safe_cast, LoadFiles, ReadLinesFromCSV)
    hashing.py         splitmix64 hashes, power-law draws, exact AUC (synthetic data, id hashing)
    criteo/            schema, TSV parsers, preprocessing, memory-mapped dataset, torchrec's readers
    movielens/         reader, batches, torchrec's row readers
    synthetic/         planted Criteo (host, device, drifting ids, an unbounded stream), planted MovieLens,
                       random batches
"""

from __future__ import annotations

from typing import Any

from lightrec.data.batch import Batch, collate_samples, concat_batches
from lightrec.data.criteo.memmap_dataset import CriteoMemmapDataset, load_criteo_meta
from lightrec.data.criteo.parse import parse_criteo_lines
from lightrec.data.criteo.preprocess import preprocess_criteo
from lightrec.data.criteo.spec import (
    CRITEO_1TB_CARDINALITIES,
    CRITEO_KAGGLE_CARDINALITIES,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    resolve_cardinalities,
    table_configs,
)
from lightrec.data.errors import DataFormatError, ResumeMismatchError
from lightrec.data.movielens.dataset import MovieLensDataset
from lightrec.data.movielens.reader import MovieLensData, read_movielens
from lightrec.data.rank_sampling import RankBatchSampler, RankDataLoader, rank_dataloader, resolve_rank
from lightrec.data.synthetic.criteo import SyntheticCriteoDataset
from lightrec.data.synthetic.planted import PlantedCriteoModel
from lightrec.data.synthetic.stream import SyntheticStreamLoader

_LAZY = {"SyntheticCriteo", "SyntheticCriteoDataModule", "CriteoDataModule", "MovieLensDataModule"}

__all__ = [
    "Batch",
    "CRITEO_1TB_CARDINALITIES",
    "CRITEO_KAGGLE_CARDINALITIES",
    "CriteoDataModule",
    "CriteoMemmapDataset",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_INT_NAMES",
    "DataFormatError",
    "MovieLensData",
    "MovieLensDataModule",
    "MovieLensDataset",
    "ParquetDataModule",
    "PlantedCriteoModel",
    "RankBatchSampler",
    "RankDataLoader",
    "ResumeMismatchError",
    "SyntheticCriteo",
    "SyntheticCriteoDataModule",
    "SyntheticCriteoDataset",
    "SyntheticStream",
    "SyntheticStreamLoader",
    "collate_samples",
    "concat_batches",
    "load_criteo_meta",
    "parse_criteo_lines",
    "preprocess_criteo",
    "rank_dataloader",
    "read_movielens",
    "resolve_cardinalities",
    "resolve_rank",
    "table_configs",
]


def __getattr__(name: str) -> Any:
    if name == "ParquetDataModule":  # Parquet event logs (lightrec.data.parquet)
        from lightrec.data.parquet.datamodule import ParquetDataModule

        return ParquetDataModule
    if name == "SyntheticStream":  # the drifting synthetic clicks as an unbounded stream (online training)
        from lightrec.data.synthetic.stream_datamodule import SyntheticStream

        return SyntheticStream
    if name in _LAZY:
        from lightrec.data import datamodules

        return (
            datamodules.SyntheticCriteo if name == "SyntheticCriteoDataModule" else getattr(datamodules, name)
        )
    raise AttributeError(f"module 'lightrec.data' has no attribute {name!r}")
