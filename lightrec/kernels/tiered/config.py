"""How a tiered table is laid out: which tier backs its rows, how big its cache is, what it evicts.

A *tiered* table keeps every row (and its fused-optimizer state) in a backing tier and a cache of
hot rows in the fast tier, where the lookups and the fused update run::

    backing tier                                    fast tier (the kernel's device)
    "host": host memory (pinned when the cache      a cache of ``cache_rows(R)`` rows of every table,
            is on a GPU)                            served by an in-memory kernel (torch, fbgemm,
    "ssd":  one direct row file per table and        Triton) as if it were the table; misses are
            state under ``ssd_storage_directory``   fetched, dirty rows written back on eviction

:class:`TieringConfig` is what ``BatchedEmbeddingBag(..., tiering=...)`` and the sharders take; the
plan-level names (torchrec's ``CacheParams`` / ``KeyValueParams`` / ``CacheAlgorithm``) live in
``lightrec.distributed.planner.plan`` and are translated into it there (this room imports nothing
from ``distributed``). The compute kernels are ``fused_uvm_caching`` (backing ``"host"``) and
``key_value`` (backing ``"ssd"``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "BACKING_TIERS",
    "CACHE_ALGORITHMS",
    "DEFAULT_CACHE_LOAD_FACTOR",
    "TieringConfig",
    "coerce_algorithm",
    "refuse_tiered_export",
]

BACKING_TIERS = ("host", "ssd")
CACHE_ALGORITHMS = ("lru", "lfu")
#: torchrec's default when a cached kernel is asked for without a load factor.
DEFAULT_CACHE_LOAD_FACTOR = 0.2
#: Rows a table's cache holds at least (or the whole table, when smaller): a batch and the one
#: prefetched behind it must fit at once, whatever the load factor says for a small table.
DEFAULT_MIN_CACHE_ROWS = 4096


def refuse_tiered_export(tables: list[str]) -> str:
    """Why a model with tiered tables is not quantized or exported (the message of the ``ValueError``)."""
    return (
        f"tables {tables} are tiered (fused_uvm_caching / key_value: their rows live on SSD or in host memory "
        "behind a cache), and lightrec does not export tiered tables: a serving artifact holds every row in "
        "memory, which these tables were tiered to avoid. Export a model whose tables are in memory (train with "
        "tables_on='memory'), or serve lookups from the trained row store; in the recipes, --recipe.export false"
    )


def coerce_algorithm(value: object) -> str:
    """``"lru"`` or ``"lfu"`` from a string, fbgemm's or torchrec's ``CacheAlgorithm`` (by member name).

    Raises:
        ValueError: anything else.
    """
    key = value.name if isinstance(value, Enum) else value
    if isinstance(key, str) and key.lower() in CACHE_ALGORITHMS:
        return key.lower()
    raise ValueError(f"cache algorithm must be one of {list(CACHE_ALGORITHMS)} (or CacheAlgorithm.LRU/LFU), got {value!r}")


@dataclass(frozen=True)
class TieringConfig:
    """Backing tier and cache of the tables of one tiered kernel (see the module docstring).

    Args:
        backing: ``"host"`` (host memory) or ``"ssd"`` (a row file per table under
            ``ssd_storage_directory``).
        cache_load_factor: share of each table's rows its cache holds (0 < factor <= 1).
        cache_rows: rows of every table's cache, instead of the factor (tests, hand tuning).
        min_cache_rows: no table's cache is smaller than this (or than the table).
        algorithm: what to evict first: ``"lru"`` (least recently used) or ``"lfu"`` (least
            frequently used since the row entered the cache, ties by recency).
        ssd_storage_directory: where ``"ssd"`` row files are created (a local disk with room for
            every row and its optimizer state); default: the system's temporary directory.
        prefetch: take the ids of later batches (``prefetch``) and fetch their rows ahead, off the
            training thread; False fetches at lookup only.
        eviction_headroom: when a table's cache is full, evict at least this share of it at once
            (amortises the eviction scan over many steps).
        inner_kernel: the in-memory kernel class serving the cache (set by
            ``lightrec.kernels.kernel_registry.build_kernel`` from ``kernel_backend``).

    Raises:
        ValueError: a value out of range, named with what to use instead.
    """

    backing: str = "ssd"
    cache_load_factor: float = DEFAULT_CACHE_LOAD_FACTOR
    cache_rows: int | None = None
    min_cache_rows: int = DEFAULT_MIN_CACHE_ROWS
    algorithm: str = "lru"
    ssd_storage_directory: str | None = None
    prefetch: bool = True
    eviction_headroom: float = 1.0 / 32
    # type[EmbeddingKernel] | None, not spelled out: kernel_interface imports this module (no import circle)
    inner_kernel: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.backing not in BACKING_TIERS:
            raise ValueError(f"TieringConfig(backing=...) must be one of {list(BACKING_TIERS)}, got {self.backing!r}")
        factor = self.cache_load_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 < factor <= 1.0:
            raise ValueError(
                f"cache_load_factor must be a share of the table's rows in (0, 1], got {factor!r} "
                "(e.g. 0.05 caches 5% of the rows)"
            )
        object.__setattr__(self, "cache_load_factor", float(factor))
        for name in ("cache_rows", "min_cache_rows"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"TieringConfig({name}=...) must be a positive int, got {value!r}")
        object.__setattr__(self, "algorithm", coerce_algorithm(self.algorithm))
        if not 0.0 <= self.eviction_headroom < 1.0:
            raise ValueError(f"eviction_headroom must be in [0, 1), got {self.eviction_headroom!r}")
        if self.ssd_storage_directory is not None:
            object.__setattr__(self, "ssd_storage_directory", os.fspath(self.ssd_storage_directory))

    def cache_rows_for(self, rows: int) -> int:
        """Rows of the cache of a table of ``rows`` rows (never more than the table)."""
        if rows <= 0:
            return 0
        wanted = self.cache_rows if self.cache_rows is not None else math.ceil(self.cache_load_factor * rows)
        if self.cache_rows is None:
            wanted = max(wanted, self.min_cache_rows)
        return max(1, min(rows, wanted))

    @property
    def directory(self) -> str:
        """Where ``"ssd"`` row files go (the configured directory, or the temporary directory)."""
        import tempfile

        return self.ssd_storage_directory or tempfile.gettempdir()
