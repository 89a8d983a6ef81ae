"""The planner's cost model, in one home: what every shard of every option needs and costs
(vectorised over shards), how a tiered table's cache is priced, and torchrec's estimator classes.

Every formula is written once here and documented in docs/planner.md. Inputs are numpy arrays
with one entry per shard (table index, sharding type code, kernel code, shard rows, shard cols,
cache load factor); outputs are bytes of the table memory (HBM on cuda, DDR on cpu), bytes of the
backing tiers (host memory, SSD) and seconds per training step on the rank that holds the shard.

Tiered kernels (``fused_uvm_caching``, ``key_value``) hold ``C = max(ceil(clf * r), min(r,
min_cache_rows))`` rows in fast memory plus a 4-byte slot index per row, and every row with its
optimizer state in the backing tier; they cost what the fused kernel costs on the cache, plus,
for the distinct rows missed per step (:func:`cache_model`, below), one read and one write-back
of the row's pages (``key_value``: whole 4 KiB pages at ``ssd_mem_bw``; ``fused_uvm_caching``: the
row at ``hbm_to_ddr_mem_bw``). Symbols (per table):

=====  ==================================================================
W, L   world size, ranks per host
N      ids looked up per rank per step (sum over features of batch x pooling factor)
Bf     bags per rank per step (sum over features of batch)
E      bytes per weight element (4 for FP32, 2 for FP16/BF16, 1 INT8 ...)
r, c   rows and columns of the shard; R the table's rows
=====  ==================================================================

**Pricing a cache.** When tables do not fit in fast memory, the planner offers ``key_value`` (SSD) and
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

**torchrec's estimators** (its ``torchrec.distributed.planner.shard_estimators``):
:class:`EmbeddingPerfEstimator` and :class:`EmbeddingStorageEstimator` do not estimate again --
lightrec estimates every shard while it enumerates -- they (re)write lightrec's numbers into the
``ShardingOption`` s that lightrec's ``EmbeddingEnumerator`` built: ``shard.perf`` (seconds per
step, as ``fwd_compute``) and ``shard.storage`` (bytes in HBM on ``cuda``, DDR on ``cpu``).
Subclass ``ShardEstimator`` (``types.py``) to plan with numbers of your own: the planner reads
them back. torchrec's storage formulas (``calculate_shard_storages``, ``calculate_pipeline_io_cost``,
``get_num_poolings``) live in ``storage_formulas.py`` and are re-exported here.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from lightrec.distributed.planner.plan import (
    CacheStatistics,
    EmbeddingComputeKernel,
    ModuleSharder,
    ShardingType,
)
from lightrec.distributed.planner.storage_formulas import (
    _calculate_shard_io_sizes,
    _calculate_storage_specific_sizes,
    _get_optimizer_multipler,
    calculate_pipeline_io_cost,
    calculate_shard_storages,
    get_num_poolings,
)
from lightrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption, Topology

__all__ = [
    "DEFAULT_ZIPF_ALPHA",
    "EmbeddingPerfEstimator",
    "EmbeddingStorageEstimator",
    "KERNELS",
    "SHARDING_TYPES",
    "ShardEstimates",
    "TableArrays",
    "ZipfCacheStatistics",
    "_calculate_shard_io_sizes",
    "_calculate_storage_specific_sizes",
    "_get_optimizer_multipler",
    "cache_model",
    "calculate_pipeline_io_cost",
    "calculate_shard_storages",
    "estimate_shards",
    "get_num_poolings",
]

# Integer codes used in the numpy arrays; the order of SHARDING_TYPES is also the tie-break order
# of equally cheap options (table-wise first: the simplest plan wins ties).
SHARDING_TYPES: list[str] = [
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.DATA_PARALLEL.value,
]
TW, CW, RW, TWRW, TWCW, DP = range(6)
KERNELS: list[str] = [
    k.value
    for k in (
        EmbeddingComputeKernel.FUSED,
        EmbeddingComputeKernel.DENSE,
        EmbeddingComputeKernel.QUANT,
        EmbeddingComputeKernel.FUSED_UVM_CACHING,
        EmbeddingComputeKernel.KEY_VALUE,
    )
]
FUSED, DENSE, QUANT, UVM_CACHING, KEY_VALUE = range(5)
TIERED = (UVM_CACHING, KEY_VALUE)

ID_BYTES = 8  # int64 ids on the wire and in the lookup input
WEIGHT_BYTES = 4  # the float32 weight of every id of a weighted table, sent and read with it
LENGTH_BYTES = 4  # int32 lengths
GRAD_BYTES = 4  # activations, gradients and optimizer state are fp32
SLOT_INDEX_BYTES = 4  # a tiered table's int32 slot of every row, in fast memory
# per cache slot (CacheIndex's per-slot arrays): its row 8, last use 8, use count 8, pins 4, dirty flag 1,
# free ring 8 (tests/kernels/tiered/test_cache_consistency.py derives it from a real cache)
SLOT_META_BYTES = 37
PAGE_BYTES = 4096  # an SSD row read or write moves whole pages


@dataclass
class TableArrays:
    """Per-table planner inputs as parallel arrays (index = table position in ``keys``).

    Attributes:
        keys: ``(module path, table name)`` per table.
        rows, cols: table shape ``[R, D]``.
        elem_bytes: bytes per weight element (E).
        row_overhead: extra bytes per row under the quant kernel (INT scale + bias).
        ids, bags: N and Bf above (per rank per step).
        pooled: whether lookups are pooled (EmbeddingBag) or return one row per id.
        opt_elem, opt_row: fp32 optimizer values per weight element / per row.
        allowed: per table, ``[(sharding type code, [kernel codes])]`` in preference order.
        min_partition: narrowest column shard per table.
        clf_choices: per table, the cache load factors a tiered option may take.
        min_cache_rows: per table, the smallest cache of a tiered shard (the sharder's
            ``fused_params["cache_min_rows"]``).
        stats: per table, what is known of its id stream (None: a Zipf law).
        row_state: bytes per row of other per-row state (a managed-collision id map and its
            eviction metadata), or None for none.
        weighted: per table, whether every id comes with a float32 weight (a weighted collection,
            or ``ParameterConstraints(is_weighted=True)``), or None for none.
    """

    keys: list[tuple[str, str]]
    rows: np.ndarray
    cols: np.ndarray
    elem_bytes: np.ndarray
    row_overhead: np.ndarray
    ids: np.ndarray
    bags: np.ndarray
    pooled: np.ndarray
    opt_elem: np.ndarray
    opt_row: np.ndarray
    allowed: list[list[tuple[int, list[int]]]]
    min_partition: np.ndarray
    clf_choices: list[list[float]] = field(default_factory=list)
    min_cache_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    stats: list[CacheStatistics | None] = field(default_factory=list)
    row_state: np.ndarray | None = None
    weighted: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class ShardEstimates:
    """What :func:`estimate_shards` says of each of ``S`` shards.

    Attributes:
        storage: ``[S]`` bytes of fast memory (the table memory: HBM on cuda, DDR on cpu).
        cost: ``[S]`` seconds per training step.
        backing: ``[S, 2]`` bytes of host memory and SSD (tiered kernels' backing tiers).
        hit_rate: ``[S]`` expected share of ids the cache serves (NaN: not tiered).
        cache_rows: ``[S]`` rows of the cache (0: not tiered).
    """

    storage: np.ndarray
    cost: np.ndarray
    backing: np.ndarray
    hit_rate: np.ndarray
    cache_rows: np.ndarray


# ---- pricing a tiered table's cache ------------------------------------------------------------
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


# ---- the shards' storage, cost and cache hit rate -------------------------------------------------
def estimate_shards(
    t: TableArrays,
    topo: Topology,
    table: np.ndarray,
    stype: np.ndarray,
    kernel: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    clf: np.ndarray | None = None,
) -> ShardEstimates:
    """Storage (bytes per tier), cost (seconds per step) and cache hit rate of each shard.

    Args:
        t: the tables.
        topo: the cluster.
        table, stype, kernel: ``[S]`` int arrays (table index, sharding type code, kernel code).
        rows, cols: ``[S]`` shard shape; a data-parallel entry stands for one replica.
        clf: ``[S]`` cache load factor of tiered shards (ignored for the others).
    """
    W = float(topo.world_size)
    L = float(topo.local_size)
    rows = rows.astype(np.float64)
    cols = cols.astype(np.float64)
    R = t.rows[table].astype(np.float64)
    N = t.ids[table]
    Bf = t.bags[table]
    E = t.elem_bytes[table]
    is_dp = stype == DP
    row_split = (stype == RW) | (stype == TWRW)
    training = kernel != QUANT
    # bytes every id brings: the id, and a weighted table's per-id weight
    weight_bytes = np.where(t.weighted[table], float(WEIGHT_BYTES), 0.0) if t.weighted is not None else 0.0
    id_bytes = ID_BYTES + weight_bytes

    # Ids this shard looks up per step: data parallel serves its local batch; the other types
    # serve the global batch (W * N ids), row-split ones only the ids that fall in their rows.
    frac = np.where(row_split, rows / np.maximum(R, 1.0), 1.0)
    looked_up = np.where(is_dp, N, W * N * frac)
    bags_in = np.where(is_dp, 0.0, W * Bf)
    ids_in = np.where(is_dp, 0.0, looked_up)
    # Output rows produced: one per bag (pooled; row-wise shards emit partial sums for every bag)
    # or one per id (unpooled).
    out_rows = np.where(t.pooled[table], np.where(is_dp, Bf, W * Bf), looked_up)
    out_elems = out_rows * cols

    # ---- tiered shards: the cache in fast memory, every row in the backing tier ---------------
    tiered = np.isin(kernel, TIERED)
    clf = np.zeros(len(table)) if clf is None else clf.astype(np.float64)
    min_rows = t.min_cache_rows[table].astype(np.float64) if len(t.min_cache_rows) else np.zeros(len(table))
    cache_rows = np.minimum(rows, np.maximum(np.ceil(clf * rows), np.minimum(rows, min_rows)))
    resident = np.where(tiered, cache_rows, rows)  # rows held in fast memory
    row_bytes = cols * E + GRAD_BYTES * (cols * t.opt_elem[table] + t.opt_row[table])  # a row and its state

    # ---- storage -------------------------------------------------------------------------
    weights = resident * cols * E + np.where(kernel == QUANT, rows * t.row_overhead[table], 0.0)
    if t.row_state is not None:
        # e.g. the id map of a managed-collision table: every row's, in fast memory even when tiered
        weights = weights + rows * t.row_state[table]
    opt_state = np.where(
        training, GRAD_BYTES * (resident * cols * t.opt_elem[table] + resident * t.opt_row[table]), 0.0
    )
    dense_grad = np.where(kernel == DENSE, rows * cols * GRAD_BYTES, 0.0)
    index = np.where(tiered, rows * SLOT_INDEX_BYTES + cache_rows * SLOT_META_BYTES, 0.0)
    passes = np.where(training, 2.0, 1.0)  # forward output, plus its gradient when training
    buffers = ids_in * id_bytes + bags_in * LENGTH_BYTES + out_elems * GRAD_BYTES * passes
    buffers = np.where(is_dp, N * id_bytes + Bf * LENGTH_BYTES + out_elems * GRAD_BYTES * passes, buffers)
    storage = weights + opt_state + dense_grad + index + buffers
    backing = np.zeros((len(table), 2))
    backing[:, 0] = np.where(kernel == UVM_CACHING, rows * row_bytes, 0.0)
    backing[:, 1] = np.where(kernel == KEY_VALUE, rows * row_bytes, 0.0)

    # ---- cost: lookup kernels ------------------------------------------------------------
    bw_m = topo.device_mem_bw
    fwd = (looked_up * (cols * E + weight_bytes) + out_elems * GRAD_BYTES) / bw_m
    # fused: read the output gradient, read-modify-write every touched row and its optimizer state.
    bwd_fused = (
        out_elems * GRAD_BYTES
        + looked_up * cols * (2 * E + 2 * GRAD_BYTES * t.opt_elem[table])
        + looked_up * 2 * GRAD_BYTES * t.opt_row[table]
    ) / bw_m
    # dense: scatter into a dense gradient, then an optimizer step that sweeps the whole shard
    # (read+write weights and state, read and zero the gradient).
    bwd_dense = (
        out_elems * GRAD_BYTES
        + looked_up * cols * GRAD_BYTES
        + rows * cols * (2 * E + 2 * GRAD_BYTES + 2 * GRAD_BYTES * t.opt_elem[table])
        + rows * 2 * GRAD_BYTES * t.opt_row[table]
    ) / bw_m
    bwd = np.select([(kernel == FUSED) | tiered, kernel == DENSE], [bwd_fused, bwd_dense], 0.0)

    # ---- cost: a tiered shard's misses (each fetched, and written back when evicted) ---------
    hit_rate = np.full(len(table), np.nan)
    fetch = np.zeros(len(table))
    for s in np.flatnonzero(tiered).tolist():
        i = int(table[s])
        hit_rate[s], fetched = cache_model(
            t.stats[i] if t.stats else None, cache_rows[s] / max(rows[s], 1.0), int(rows[s]), int(t.rows[i]), looked_up[s]
        )
        moved = max(row_bytes[s], PAGE_BYTES) if kernel[s] == KEY_VALUE else row_bytes[s]
        bandwidth = topo.ssd_mem_bw if kernel[s] == KEY_VALUE else topo.hbm_to_ddr_mem_bw
        fetch[s] = 2.0 * fetched * moved / float(bandwidth or math.inf) + 2.0 * fetched * row_bytes[s] / bw_m

    # ---- cost: communication -------------------------------------------------------------
    off_rank = (W - 1.0) / W  # share of the traffic that leaves the rank
    bw_c = topo.comm_bw
    input_dist = (ids_in * id_bytes + bags_in * LENGTH_BYTES) * off_rank / bw_c
    output_dist = out_elems * GRAD_BYTES * passes * off_rank / bw_c
    if topo.num_hosts > 1:
        # table-row-wise: reduce-scatter inside the host, then 1/L of the output crosses hosts.
        twrw_out = (
            out_elems
            * GRAD_BYTES
            * passes
            * (
                (L - 1.0) / L / float(topo.intra_host_bw or 0.0)
                + (W - L) / W / L / float(topo.inter_host_bw or 0.0)
            )
        )
        output_dist = np.where(stype == TWRW, twrw_out, output_dist)
    # data parallel: ring all-reduce of the dense gradient of the whole table every step.
    allreduce = np.where(training, 2.0 * off_rank * rows * cols * GRAD_BYTES / bw_c, 0.0)
    comm = np.where(is_dp, allreduce, input_dist + output_dist)

    cost = fwd + bwd + comm + fetch + float(topo.kernel_overhead_s or 0.0)
    return ShardEstimates(storage, cost, backing, hit_rate, np.where(tiered, cache_rows, 0.0))


# ---- torchrec's estimator classes -----------------------------------------------------------
def _write_estimates(options: list[ShardingOption], estimator: ShardEstimator, perf: bool) -> None:
    """Copy lightrec's estimates of each shard of ``options`` into ``shard.perf`` (``perf``) or ``shard.storage``."""
    for option in options:
        if option._estimates is None or len(option._estimates) != len(option.shards):
            raise ValueError(
                f"{type(estimator).__name__} estimates the ShardingOptions lightrec's EmbeddingEnumerator builds; "
                f"option {option.fqn!r} ({option.sharding_type}) was built elsewhere"
            )
        for shard, (storage, cost) in zip(option.shards, option._estimates):
            if perf:
                shard.perf = copy.copy(cost)
            else:
                shard.storage = copy.copy(storage)


class EmbeddingPerfEstimator(ShardEstimator):
    """Writes lightrec's cost (seconds per step) into ``shard.perf``.

    Args:
        topology: the cluster (accepted for torchrec's signature; the costs were computed for the
            enumerator's topology).
        constraints: accepted for torchrec's signature.
        is_inference: accepted for torchrec's signature (the quant kernel's options are costed as inference).
    """

    def __init__(
        self, topology: Topology, constraints: dict[str, ParameterConstraints] | None = None, is_inference: bool = False
    ) -> None:
        super().__init__(topology, constraints)

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict[str, ModuleSharder] | None = None) -> None:
        _write_estimates(sharding_options, self, perf=True)


class EmbeddingStorageEstimator(ShardEstimator):
    """Writes lightrec's storage (bytes) into ``shard.storage`` (arguments as :class:`EmbeddingPerfEstimator`)."""

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        pipeline_type: object = None,
        run_embedding_at_peak_memory: bool = False,
        is_inference: bool = False,
    ) -> None:
        super().__init__(topology, constraints)

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict[str, ModuleSharder] | None = None) -> None:
        _write_estimates(sharding_options, self, perf=False)
