"""Enumerate the sharding options of every table and estimate all their shards at once.

An *option* is (table, sharding type, kernel, number of shards, cache load factor -- tiered kernels
only, one option per load factor the table allows). Options are stored as parallel
numpy arrays, table by table, and their shards as one flat array set, so that estimating ~10^5
shards is a handful of vectorised numpy expressions rather than 10^5 Python objects.

Shard counts per sharding type (``W`` world size, ``L`` ranks per host, ``H`` hosts):

* table-wise, data-parallel: 1 (data-parallel's shard stands for the replica every rank holds);
* row-wise: ``W``; table-row-wise: ``L`` (one host);
* column-wise: ``k`` in 2, 4, 8, ... up to the most shards of at least ``min_partition`` columns
  each on at most ``W`` ranks (and that maximum) -- at most ``min(W, D // min_partition)``, fewer
  when 4-column units would leave a shard narrower (``_max_column_shards``);
* table-column-wise: that most on at most ``L`` ranks, on one host.

Options equal to an earlier one on this topology are skipped (row-wise on one rank is table-wise,
table-row-wise on one host is row-wise, ...) unless the earlier one is not allowed.

torchrec's names at this path: ``GUARDED_COMPUTE_KERNELS`` (kernels planned only where a
constraint names them; the set lives in ``constants.py``, the same object, so adding to it here
guards a kernel), ``get_partition_by_type`` (``options.py``) and ``sharder_name`` (``utils.py``).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from lightrec.distributed.planner.constants import GUARDED_COMPUTE_KERNELS
from lightrec.distributed.planner.options import (
    Options,
    finish_options,
    get_partition_by_type,
    to_sharding_options,
)
from lightrec.distributed.planner.plan import ModuleSharder, column_wise_shard_sizes
from lightrec.distributed.planner.shard_estimators import (
    CW,
    DP,
    RW,
    TIERED,
    TW,
    TWCW,
    TWRW,
    TableArrays,
    estimate_shards,
)
from lightrec.distributed.planner.tables import collect_tables, find_shardable_modules
from lightrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Topology,
)
from lightrec.distributed.planner.utils import sharder_name

__all__ = [
    "GUARDED_COMPUTE_KERNELS",
    "EmbeddingEnumerator",
    "enumerate_options",
    "get_partition_by_type",
    "sharder_name",
]


def _max_column_shards(cols: int, min_partition: int, limit: int) -> int:
    """Most column shards (at most ``limit``) whose every width, as ``column_wise_shard_sizes`` deals
    them, is at least ``min_partition`` (>= 1: ``min_partition`` is at most ``cols``).

    ``cols // min_partition`` alone is not enough: 4-column units can leave a shard narrower than a
    ``min_partition`` that is not a multiple of 4 (120 columns, 4 shards: 32, 32, 28, 28). The
    narrowest shard only shrinks as shards are added, so the first count that fits, counting down,
    is the most.
    """
    most = max(1, min(limit, cols // min_partition, cols))
    while most > 1 and min(column_wise_shard_sizes(cols, most)) < min_partition:
        most -= 1
    return most


def _column_counts(cols: int, min_partition: int, limit: int) -> list[int]:
    most = _max_column_shards(cols, min_partition, limit)
    counts, k = [], 2
    while k <= most:
        counts.append(k)
        k *= 2
    if most >= 2 and most not in counts:
        counts.append(most)
    return counts


def _table_options(t: TableArrays, i: int, topo: Topology) -> list[tuple[int, int, int, float]]:
    """``(sharding type, kernel, shards, cache load factor)`` options of table ``i``, in preference order."""
    out = _shardings(t, i, topo)
    choices = t.clf_choices[i] if t.clf_choices else [0.2]
    return [(s, k, n, clf) for s, k, n in out for clf in (choices if k in TIERED else [0.0])]


def _shardings(t: TableArrays, i: int, topo: Topology) -> list[tuple[int, int, int]]:
    """``(sharding type, kernel, shards)`` of table ``i``, in preference order."""
    W, L, H = topo.world_size, topo.local_size, topo.num_hosts
    allowed = dict(t.allowed[i])
    cols, min_part = int(t.cols[i]), int(t.min_partition[i])
    out: list[tuple[int, int, int]] = []
    for stype, kernels in t.allowed[i]:
        for kernel in kernels:

            def has(other: int, kernel: int = kernel) -> bool:
                return kernel in allowed.get(other, [])

            if stype in (TW, DP):
                out.append((stype, kernel, 1))
            elif stype == RW:
                if not (W == 1 and has(TW)):
                    out.append((stype, kernel, W))
            elif stype == TWRW:
                if not ((H == 1 and has(RW)) or (L == 1 and has(TW))):
                    out.append((stype, kernel, L))
            elif stype == CW:
                counts = _column_counts(cols, min_part, W)
                if not counts and not has(TW):
                    counts = [1]
                out += [(stype, kernel, k) for k in counts]
            elif stype == TWCW:
                k = _max_column_shards(cols, min_part, L)
                if k < 2 and has(TW):
                    continue  # one shard is table-wise
                if not (H == 1 and has(CW) and k in _column_counts(cols, min_part, W)):
                    out.append((stype, kernel, k))
    return out


def enumerate_options(t: TableArrays, topo: Topology) -> Options:
    """Enumerate every table's options and estimate all their shards."""
    per_table = [_table_options(t, i, topo) for i in range(len(t))]
    count = np.array([len(o) for o in per_table], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    flat = np.array([opt[:3] for opts in per_table for opt in opts], dtype=np.int64).reshape(-1, 3)
    clf = np.array([opt[3] for opts in per_table for opt in opts], dtype=np.float64)
    table = np.repeat(np.arange(len(t), dtype=np.int64), count)
    stype, kernel, nshards = flat[:, 0], flat[:, 1], flat[:, 2]
    start = np.concatenate([[0], np.cumsum(nshards)[:-1]]).astype(np.int64)

    # ---- expand options into shards -------------------------------------------------------
    sh_opt = np.repeat(np.arange(len(flat), dtype=np.int64), nshards)
    sh_idx = np.arange(int(nshards.sum()), dtype=np.int64) - start[sh_opt]
    sh_table, sh_type, n = table[sh_opt], stype[sh_opt], nshards[sh_opt]
    R, D = t.rows[sh_table], t.cols[sh_table]
    # Row blocks of ceil(R / n); trailing shards may be short or empty (plan.row_wise_shard_sizes).
    block = -(-R // n)
    split_rows = np.clip(R - sh_idx * block, 0, block)
    # Column units of 4 when D % 4 == 0 and there are enough of them (plan.column_wise_shard_sizes).
    unit = np.where((D % 4 == 0) & (D // 4 >= n), 4, 1)
    q, r = np.divmod(D // unit, n)
    split_cols = (q + (sh_idx < r)) * unit
    row_split = (sh_type == RW) | (sh_type == TWRW)
    col_split = (sh_type == CW) | (sh_type == TWCW)
    sh_rows = np.where(row_split, split_rows, R)
    sh_cols = np.where(col_split, split_cols, D)
    est = estimate_shards(t, topo, sh_table, sh_type, kernel[sh_opt], sh_rows, sh_cols, clf[sh_opt])
    return finish_options(
        Options(table=table, stype=stype, kernel=kernel, nshards=nshards, start=start, first=first, count=count,
                sh_idx=sh_idx, sh_rows=sh_rows, sh_cols=sh_cols, sh_storage=est.storage, sh_cost=est.cost,
                footprint=_EMPTY, max_cost=_EMPTY, total_storage=_EMPTY, total_cost=_EMPTY, fits=_EMPTY,
                clf=clf, sh_backing=est.backing, sh_hit=est.hit_rate, module=_module_index(t.keys)),
        topo,
    )  # fmt: skip


_EMPTY = np.zeros(0)


def _module_index(keys: list[tuple[str, str]]) -> np.ndarray:
    """``[T]`` index of each table's module path among the paths in order of first appearance."""
    paths: dict[str, int] = {}
    return np.array([paths.setdefault(path, len(paths)) for path, _ in keys], dtype=np.int64)


class EmbeddingEnumerator(Enumerator):
    """torchrec's enumerator: every sharding option of every table, as ``ShardingOption`` s.

    Given to ``EmbeddingShardingPlanner(enumerator=...)`` it supplies the planner's topology,
    batch size and constraints where the planner has none of its own; its ``estimator`` s (torchrec's
    ``EmbeddingPerfEstimator`` / ``EmbeddingStorageEstimator``, or your own) may rewrite each shard's
    perf and storage, and the planner plans with the rewritten numbers. A subclass that overrides
    :meth:`enumerate` restricts the planner to the options it returns.

    Args:
        topology: the cluster.
        batch_size: per-rank batch size of the cost model.
        constraints: ``{table: ParameterConstraints}``.
        estimator: one ``ShardEstimator`` or a list; lightrec's estimates are filled in first.
        use_exact_enumerate_order: accepted for torchrec's signature (lightrec's order is fixed).
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int = 512,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
        use_exact_enumerate_order: bool = False,
    ) -> None:
        self.topology = topology
        self.batch_size = batch_size
        self.constraints = dict(constraints or {})
        self.estimators = list(estimator) if isinstance(estimator, list) else ([estimator] if estimator else [])

    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder]) -> list[ShardingOption]:
        """Every option of every table of ``module``'s shardable collections, estimated."""
        modules = find_shardable_modules(module, sharders)
        tables = collect_tables(modules, self.topology, self.constraints, self.batch_size)
        opts = enumerate_options(tables, self.topology)
        options = to_sharding_options(tables, opts, modules, self.topology, self.batch_size)
        self.populate_estimates(options)
        return options

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        for estimator in self.estimators:
            estimator.estimate(sharding_options)
