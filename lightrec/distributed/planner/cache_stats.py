"""How the planner prices a tiered table's cache: the expected hit rate and rows fetched per step.

When tables do not fit in fast memory, the planner offers ``key_value`` (SSD) and
``fused_uvm_caching`` (host memory) options at several cache load factors and prices each with
:func:`cache_model`: the share of id lookups the cache serves (``hit rate``, what the kernels
report at run time) and the distinct rows it misses per step (each is fetched, and later written
back). Without better knowledge the ids are taken to follow a Zipf law over the table's rows,
``p(i) ~ i^-alpha`` (``alpha`` 1.05 by default: recommendation id streams measure between 0.9
and 1.2), and the cache to hold the hottest rows (what LFU converges to; LRU does a little worse)::

    hit rate(k)         = H(k) / H(R)                       H(n) = sum_{i<=n} i^-alpha
    distinct rows(N)    = sum_i 1 - exp(-N p(i))            (N ids per step)
    fetched rows(k, N)  = sum_{i>k} 1 - exp(-N p(i))        (the distinct rows outside the cache)

Sums over up to billions of rows run over ~600 geometric bins (exact below 4096). A torchrec
``CacheStatistics`` given in ``ParameterConstraints(cache_params=CacheParams(stats=...))`` is used
as torchrec uses it instead: ``expected_miss_rate(clf) * expected_lookups`` rows fetched per step,
spread over row-wise shards by their rows.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from lightrec.distributed.planner.cache_params import CacheStatistics

__all__ = ["DEFAULT_ZIPF_ALPHA", "ZipfCacheStatistics", "cache_model"]

DEFAULT_ZIPF_ALPHA = 1.05
_EXACT = 4096


@functools.lru_cache(maxsize=4096)
def _ranks(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(representative rank, rows in the bin)``: every rank up to 4096, then geometric bins."""
    exact = np.arange(1, min(rows, _EXACT) + 1, dtype=np.float64)
    if rows <= _EXACT:
        return exact, np.ones_like(exact)
    edges = np.unique(np.geomspace(_EXACT + 1, rows + 1, num=600).astype(np.int64))
    edges[-1] = rows + 1
    edges = np.concatenate([[_EXACT + 1], edges[edges > _EXACT + 1]])
    lo, hi = edges[:-1].astype(np.float64), edges[1:].astype(np.float64)
    mid = np.sqrt(lo * (hi - 1.0))  # geometric middle of [lo, hi)
    return np.concatenate([exact, mid]), np.concatenate([np.ones_like(exact), hi - lo])


class ZipfCacheStatistics(CacheStatistics):
    """Ids drawn from a Zipf law over a table's rows (see the module docstring).

    Args:
        alpha: the law's exponent (larger: more concentrated on few rows, more cacheable).
        rows, ids_per_step: the table and the ids one global batch looks up in it (what torchrec's
            ``expected_lookups`` and ``expected_miss_rate`` need; the planner passes per-shard
            values to :meth:`model` itself).
    """

    def __init__(self, alpha: float = DEFAULT_ZIPF_ALPHA, rows: int = 1, ids_per_step: float = 1.0) -> None:
        if not isinstance(alpha, (int, float)) or not 0.0 < alpha < 10.0:
            raise ValueError(f"ZipfCacheStatistics(alpha=...) must be in (0, 10), got {alpha!r}")
        self.alpha, self.rows, self.ids_per_step = float(alpha), int(rows), float(ids_per_step)

    def model(self, clf: float, rows: int, ids_per_step: float) -> tuple[float, float]:
        """``(hit rate of ids, distinct rows fetched per step)`` of a cache of ``clf`` of ``rows``."""
        if rows <= 0 or ids_per_step <= 0:
            return 1.0, 0.0
        rank, count = _ranks(int(rows))
        weight = rank**-self.alpha
        cached = max(0, min(rows, math.ceil(clf * rows)))
        inside = np.cumsum(count) <= cached
        total = float((weight * count).sum())
        hit = float((weight * count)[inside].sum()) / total
        seen = -np.expm1(-ids_per_step * weight / total) * count
        return hit, float(seen[~inside].sum())

    @property
    def expected_lookups(self) -> float:
        rank, count = _ranks(max(self.rows, 1))
        weight = rank**-self.alpha
        return float((-np.expm1(-self.ids_per_step * weight / (weight * count).sum()) * count).sum())

    def expected_miss_rate(self, clf: float) -> float:
        return 1.0 - self.model(clf, self.rows, self.ids_per_step)[0]

    @property
    def cacheability(self) -> float:
        """Miss rate of a cache of 1% of the rows (0: a few rows take every lookup)."""
        return self.expected_miss_rate(0.01)

    def __repr__(self) -> str:
        return f"ZipfCacheStatistics(alpha={self.alpha})"


def cache_model(
    stats: CacheStatistics | None, clf: float, shard_rows: int, table_rows: int, shard_ids: float
) -> tuple[float, float]:
    """``(expected hit rate, distinct rows fetched per step)`` of one shard's cache.

    Args:
        stats: the table's statistics (None: ``ZipfCacheStatistics()``).
        clf: the cache load factor.
        shard_rows / table_rows: rows of the shard and of its table.
        shard_ids: ids the shard looks up per step.
    """
    if stats is None or isinstance(stats, ZipfCacheStatistics):
        zipf = stats if isinstance(stats, ZipfCacheStatistics) else _DEFAULT
        return zipf.model(clf, shard_rows, shard_ids)
    miss = float(stats.expected_miss_rate(clf))
    return 1.0 - miss, miss * float(stats.expected_lookups) * shard_rows / max(table_rows, 1)


_DEFAULT = ZipfCacheStatistics()
