"""Sharding types of managed-collision tables: row-wise (whole buckets per rank) and table-wise.

::

    row-wise, W ranks, table of B buckets (B a multiple of W)
      rows      | bucket 0 | bucket 1 | ... | bucket B-1 |      rank r holds buckets [r B/W, (r+1) B/W)
      input     raw id -> bucket(id) -> owner rank (mc_dist.McRwSparseFeaturesDist), sent as it is
      lookup    the owner's module remaps it to one of its rows, resets evicted rows (mc_lookups)
      output    as plain row-wise sharding (reduce-scatter / sequence all-to-all)

    table-wise: the table's rank receives all its raw ids (plain table-wise input dist) and remaps them.

Row-wise blocks must follow the bucket segments, which ``align_managed_plan`` enforces on a plan
(the planner calls it through the sharder, a hand-written plan is re-laid here). Other sharding
types are refused: a managed table's rows are only meaningful to the rank that assigns them.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from lightrec.distributed.planner.plan import ParameterSharding, ShardingType, ShardMetadata
from lightrec.distributed.sharding.common import EmbeddingSharding, OutputDist, ShardedTable, ShardingContext
from lightrec.distributed.sharding.mc_dist import McRoutes, McRwSparseFeaturesDist
from lightrec.distributed.sharding.mc_lookups import (
    McGroupedEmbeddingsLookup,
    McGroupedPooledEmbeddingsLookup,
    McLookupState,
    McOutputDist,
)
from lightrec.distributed.sharding.row_wise import RwEmbeddingSharding
from lightrec.distributed.sharding.table_wise import TwEmbeddingSharding
from lightrec.modules.embedding_configs import PoolingType

__all__ = ["MANAGED_SHARDING_TYPES", "McRwEmbeddingSharding", "McTwEmbeddingSharding", "align_managed_plan"]

MANAGED_SHARDING_TYPES = (ShardingType.ROW_WISE.value, ShardingType.TABLE_WISE.value)


def align_managed_plan(
    table: str, sharding: ParameterSharding, segments: list[int], world_size: int
) -> ParameterSharding:
    """``sharding`` with row-wise blocks laid on whole bucket segments (other types: checked, as is).

    Args:
        table: the table (for messages).
        sharding: its plan entry.
        segments: ``B + 1`` row offsets of its buckets.
        world_size: ranks of the sharding group.

    Raises:
        ValueError: a sharding type other than row-wise / table-wise, or a bucket count the ranks
            of a row-wise plan do not divide (the message says how to fix it).
    """
    stype = sharding.sharding_type
    if stype not in MANAGED_SHARDING_TYPES:
        raise ValueError(
            f"managed-collision table {table!r} is planned {stype}; only {list(MANAGED_SHARDING_TYPES)} are supported "
            "(constrain it with ParameterConstraints(sharding_types=['row_wise', 'table_wise']))"
        )
    if stype != ShardingType.ROW_WISE.value:
        return sharding
    shards = sorted(sharding.sharding_spec or [], key=lambda s: s.rank)
    n, buckets = len(shards), len(segments) - 1
    if n == 0:
        raise ValueError(f"row_wise plan of managed-collision table {table!r} has no shards")
    if buckets % n:
        raise ValueError(
            f"managed-collision table {table!r} has {buckets} buckets, which {n} row-wise shards cannot split "
            f"into whole buckets; build its module with buckets (MCH) / total_num_buckets (hash) a multiple of "
            f"{n} -- e.g. {n * max(1, buckets // n + 1)}, or 6 to serve 1, 2, 3 and 6 ranks"
        )
    per = buckets // n
    cols = shards[0].shard_sizes[1]
    aligned = [
        ShardMetadata([segments[i * per], 0], [segments[(i + 1) * per] - segments[i * per], cols], s.placement)
        for i, s in enumerate(shards)
    ]
    if [s.rank for s in shards] != sorted({s.rank for s in shards}) or any(s.rank >= world_size for s in shards):
        raise ValueError(f"row_wise plan of managed-collision table {table!r} repeats or exceeds ranks: "
                         f"{[s.rank for s in shards]}")  # fmt: skip
    return replace(sharding, sharding_spec=aligned)


class McRwEmbeddingSharding(RwEmbeddingSharding):
    """Row-wise sharding of managed tables (see the module docstring).

    Args:
        tables, context: as :class:`RwEmbeddingSharding`.
        routes: the tables' routing twins.
        state: this rank's modules and the reset seed.
        buckets_per_rank: ``{table: B / W}``.
        return_ids: send the remapped rows back (``return_remapped_features``).
    """

    name = "row_wise"

    def __init__(
        self,
        tables: list[ShardedTable],
        context: ShardingContext,
        routes: McRoutes,
        state: McLookupState,
        buckets_per_rank: dict[str, int],
        return_ids: bool,
    ) -> None:
        super().__init__(tables, context)
        self._routes, self._state = routes, state
        self._buckets_per_rank = buckets_per_rank
        self._return_ids = return_ids
        self._lookup: McGroupedPooledEmbeddingsLookup | McGroupedEmbeddingsLookup | None = None

    def create_input_dist(self) -> nn.Module:
        mean = [self.pooled and self.tables[s.table].pooling == PoolingType.MEAN for s in self.rw_slots]
        return McRwSparseFeaturesDist(
            self.env.pg, self.env.world_size, [s.feature_index for s in self.rw_slots], [s.table for s in self.rw_slots],
            self._routes, self._buckets_per_rank, mean, self.is_weighted, (not self.pooled) or self._return_ids,
        )  # fmt: skip

    def create_lookup(self) -> nn.Module:
        mine = self.slots_by_rank[self.env.rank]
        lookup: McGroupedPooledEmbeddingsLookup | McGroupedEmbeddingsLookup
        if self.pooled:
            lookup = McGroupedPooledEmbeddingsLookup(
                mine, self.tables, self.device, self.seed, self._state, self.attr, self.grad_scale
            )
        else:
            lookup = McGroupedEmbeddingsLookup(
                mine, self.tables, self.device, self.seed, self.width, self._state, self.attr, self.grad_scale
            )
        self._lookup = lookup
        return lookup

    def create_output_dist(self) -> OutputDist:
        assert self._lookup is not None  # the collection builds lookups before output dists
        return McOutputDist(super().create_output_dist(), self._lookup, self.env.pg, self._return_ids)


class McTwEmbeddingSharding(TwEmbeddingSharding):
    """Table-wise sharding of managed tables (arguments as :class:`McRwEmbeddingSharding`)."""

    name = "table_wise"

    def __init__(
        self,
        tables: list[ShardedTable],
        context: ShardingContext,
        routes: McRoutes,
        state: McLookupState,
        buckets_per_rank: dict[str, int],
        return_ids: bool,
    ) -> None:
        super().__init__(tables, context)
        self._state = state
        self._return_ids = return_ids
        self._lookup: McGroupedPooledEmbeddingsLookup | McGroupedEmbeddingsLookup | None = None

    def create_lookup(self) -> nn.Module:
        mine = self.slots_by_rank[self.env.rank]
        lookup: McGroupedPooledEmbeddingsLookup | McGroupedEmbeddingsLookup
        if self.pooled:
            mean = [self.tables[s.table].pooling == PoolingType.MEAN for s in mine]
            lookup = McGroupedPooledEmbeddingsLookup(
                mine, self.tables, self.device, self.seed, self._state, self.attr, 1.0, mean
            )
        else:
            lookup = McGroupedEmbeddingsLookup(
                mine, self.tables, self.device, self.seed, self.width, self._state, self.attr, self.grad_scale
            )
        self._lookup = lookup
        return lookup

    def create_output_dist(self) -> OutputDist:
        assert self._lookup is not None  # the collection builds lookups before output dists
        return McOutputDist(super().create_output_dist(), self._lookup, self.env.pg, self._return_ids)


def managed_sharding(
    sharding_type: str,
    tables: list[ShardedTable],
    context: ShardingContext,
    routes: McRoutes,
    state: McLookupState,
    buckets_per_rank: dict[str, int],
    return_ids: bool,
) -> EmbeddingSharding:
    """The managed-collision sharding of ``sharding_type`` (row-wise or table-wise)."""
    cls = McRwEmbeddingSharding if sharding_type == ShardingType.ROW_WISE.value else McTwEmbeddingSharding
    return cls(tables, context, routes, state, buckets_per_rank, return_ids)
