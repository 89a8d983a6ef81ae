"""The parameters of tiered compute kernels, with torchrec's names: ``CacheParams``, ``KeyValueParams``,
``CacheAlgorithm``, ``CacheStatistics``.

A tiered table keeps every row in a backing tier and a cache of hot rows in the fast tier
(docs/tiered-tables.md): ``fused_uvm_caching`` over host memory, ``key_value`` over SSD. A plan's
``ParameterSharding`` carries these (``cache_params=``, ``key_value_params=``; saved in its JSON,
except ``CacheParams.stats``); the sharding code turns them into the kernels'
``lightrec.kernels.TieringConfig``. Pure data: nothing of lightrec's is imported here.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, cast

__all__ = ["CacheAlgorithm", "CacheParams", "CacheStatistics", "KeyValueParams"]


class CacheAlgorithm(IntEnum):
    """What a tiered table's cache evicts first (fbgemm's ``CacheAlgorithm``, which torchrec uses)."""

    LRU = 0
    LFU = 1


class CacheStatistics(abc.ABC):
    """What the planner knows of a table's id stream, to price a cache (torchrec's interface).

    ``lightrec.distributed.planner.ZipfCacheStatistics`` is one (ids drawn from a Zipf law).
    """

    @property
    @abc.abstractmethod
    def expected_lookups(self) -> float:
        """Distinct ids of one global training batch."""

    @abc.abstractmethod
    def expected_miss_rate(self, clf: float) -> float:
        """Share of id lookups that miss a cache holding ``clf`` of the rows (1.0 at 0, 0.0 at 1)."""

    @property
    @abc.abstractmethod
    def cacheability(self) -> float:
        """0: very cacheable (accesses concentrate on few rows) ... 1: not at all."""


@dataclass
class CacheParams:
    """The cache of a tiered table (``fused_uvm_caching`` / ``key_value``), torchrec's fields.

    Args:
        algorithm: ``CacheAlgorithm.LRU`` (default) or ``LFU`` (fbgemm's or torchrec's enum, or
            ``"lru"`` / ``"lfu"``).
        load_factor: share of the table's rows the cache holds (default: the sharder's
            ``fused_params["cache_load_factor"]``, else 0.2).
        reserved_memory: torchrec's HBM reservation hint; the planner reserves memory with
            ``storage_reservation`` instead, so it is kept but not used.
        precision: the cache's data type; lightrec caches rows in the table's own type (must be
            None or equal to it).
        prefetch_pipeline: fetch later batches' rows ahead (default True when a pipeline runs).
        stats: what the planner knows of the id stream (not saved in a plan's JSON).
    """

    algorithm: object = None  # a CacheAlgorithm or its name
    load_factor: float | None = None
    reserved_memory: float | None = None
    precision: object = None  # a DataType or its name
    prefetch_pipeline: bool | None = None
    stats: CacheStatistics | None = None

    def __post_init__(self) -> None:
        if self.algorithm is not None:
            name = self.algorithm.name if isinstance(self.algorithm, Enum) else str(self.algorithm).upper()
            if name not in CacheAlgorithm.__members__:
                raise ValueError(f"CacheParams(algorithm=...) must be CacheAlgorithm.LRU or LFU, got {self.algorithm!r}")
            self.algorithm = CacheAlgorithm[name]
        lf = self.load_factor
        if lf is not None and (isinstance(lf, bool) or not isinstance(lf, (int, float)) or not 0.0 < lf <= 1.0):
            raise ValueError(f"CacheParams(load_factor=...) must be a share of the rows in (0, 1], got {lf!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": None if self.algorithm is None else cast(CacheAlgorithm, self.algorithm).name,  # __post_init__
            "load_factor": self.load_factor,
            "reserved_memory": self.reserved_memory,
            "precision": None if self.precision is None else str(getattr(self.precision, "name", self.precision)),
            "prefetch_pipeline": self.prefetch_pipeline,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CacheParams:
        return cls(**{k: data.get(k) for k in ("algorithm", "load_factor", "reserved_memory", "precision",
                                               "prefetch_pipeline")})  # fmt: skip

    def __hash__(self) -> int:
        return hash((self.algorithm, self.load_factor, self.reserved_memory, str(self.precision), self.prefetch_pipeline))


@dataclass
class KeyValueParams:
    """Where a ``key_value`` table's rows live on SSD (torchrec's fields).

    Args:
        ssd_storage_directory: the directory of the row files (a local SSD); ``"@local_rank"`` in
            it is replaced by the rank's local rank, ``"@rank"`` by its global rank (torchrec's
            convention). Default: the sharder's ``fused_params["ssd_storage_directory"]``, else the
            system's temporary directory.
        ssd_rocksdb_write_buffer_size, ssd_rocksdb_shards, gather_ssd_cache_stats: torchrec's
            RocksDB settings, accepted so torchrec code runs unchanged; lightrec's SSD tier is a
            direct row file (docs/tiered-tables.md says why), so they change nothing -- its cache
            statistics are always gathered.
    """

    ssd_storage_directory: str | None = None
    ssd_rocksdb_write_buffer_size: int | None = None
    ssd_rocksdb_shards: int | None = None
    gather_ssd_cache_stats: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyValueParams:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().values()))
