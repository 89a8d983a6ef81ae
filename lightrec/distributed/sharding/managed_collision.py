"""Sharding types of managed-collision tables: row-wise (whole buckets per rank) and table-wise.

A managed-collision table splits its raw id space into ``B`` buckets and its rows into ``B``
segments (``lightrec.modules.managed_collision.ops``)::

    row-wise, W ranks, table of B buckets (B a multiple of W)
      rows      | bucket 0 | bucket 1 | ... | bucket B-1 |      rank r holds buckets [r B/W, (r+1) B/W)
      input     raw id -> bucket(id) -> owner rank bucket(id) // (B/W) (McRoutes), sent as it is
      lookup    the owner's module remaps it to one of its rows and resets evicted rows (ManagedIds),
                then the plain row-wise lookup runs on the rows
      output    as plain row-wise sharding (reduce-scatter / sequence all-to-all); with
                ``return_remapped_features`` also the remapped rows back to the senders (McOutputDist)

    table-wise: the table's rank receives all its raw ids (plain table-wise input dist) and remaps them.

Everything but the routing, the remap and the ids sent back is the plain row-wise / table-wise
sharding's -- lookups, gradient scale and MEAN handling are inherited, not restated: table-wise
managed tables use :class:`TwEmbeddingSharding` itself, row-wise ones :class:`McRwEmbeddingSharding`
(its input dist only), and the sharded collection puts a :class:`ManagedIds` in front of each
lookup and a :class:`McOutputDist` around each output dist (:func:`managed_lookups`). Each table's
local ``ManagedCollisionModule`` (built for this rank's rows) takes one step per table and forward
on every rank that holds rows of it, so steps and eviction rounds stay in lock-step with the
unsharded module; the rows it evicts get fresh weights and a zeroed optimizer state in the kernels
(``reset_rows`` of ``lightrec.kernels.kernel_interface``, with the values
``lightrec.modules.managed_collision.reset.reinit_values`` gives the unsharded module).

Row-wise blocks must follow the bucket segments, which :func:`align_managed_plan` enforces on a
plan (the planner calls it through the sharder, a hand-written plan is re-laid by the sharded
collection). Other sharding types are refused: a managed table's rows are only meaningful to the
rank that assigns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from lightrec.distributed.comm import Awaitable, SequenceEmbeddingsAllToAll
from lightrec.distributed.planner.plan import ParameterSharding, ShardingType, ShardMetadata
from lightrec.distributed.sharding.common import (
    DistContext,
    InputDist,
    KJTEmbeddingSharding,
    KJTOutputDist,
    ShardedTable,
    ShardingContext,
    ShardSlot,
    exchanged,
)
from lightrec.distributed.sharding.lookups import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup
from lightrec.distributed.sharding.row_wise import RwEmbeddingSharding, RwSparseFeaturesDist
from lightrec.distributed.sharding.table_wise import TwEmbeddingSharding
from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.ops import int64_ids
from lightrec.modules.managed_collision.reset import reinit_values
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "MANAGED_SHARDING_TYPES",
    "ManagedIds",
    "McLookupState",
    "McOutputDist",
    "McRoutes",
    "McRwEmbeddingSharding",
    "WithIds",
    "align_managed_plan",
    "managed_lookups",
    "managed_sharding",
]

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


# ---------------------------------------------------------------------------------- input side
class McRoutes:
    """Per table: its features and a ``meta`` twin of its module, on every rank -- including ranks
    that hold none of the table's rows: routing needs only the module's id space, buckets and
    ``input_hash_func``, no memory.

    Args:
        modules: ``{table: the unsharded ManagedCollisionModule}``.
        table_features: ``{table: feature names}``.
        need_preprocess: apply each module's ``input_hash_func`` (``ManagedCollisionCollection.need_preprocess``).
    """

    def __init__(
        self, modules: dict[str, ManagedCollisionModule], table_features: dict[str, list[str]], need_preprocess: bool
    ) -> None:
        self.table_features = {t: list(f) for t, f in table_features.items()}
        self.feature_table = {f: t for t, fs in self.table_features.items() for f in fs}
        self.need_preprocess = need_preprocess
        self.twins: dict[str, ManagedCollisionModule] = {}
        for table, module in modules.items():
            segments = list(module.output_segments)
            twin = module.rebuild_with_output_id_range((segments[0], segments[1]), segments, torch.device("meta"))
            twin._name = module._name or table
            self.twins[table] = twin

    def prepare(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Hash (``input_hash_func``) and admit (``ManagedCollisionModule.admit_ids``) the raw ids of
        every managed feature of ``kjt``; a KJT whose ids this changes (or of ``uint64`` ids) comes
        back with int64 ids.

        Raises:
            ManagedCollisionIdError: with the strict checks on, an id outside its table's id space
                (names the table).
        """
        given = kjt.values()
        # The ids travel as int64, as the unsharded collection reads them: a hash (63 bits) written
        # back into an int32 KJT would be truncated, and uint64 ids are their int64 bits.
        values = int64_ids(given)
        offsets = kjt.offset_per_key()
        parts: list[torch.Tensor] = []
        changed = given.dtype == torch.uint64  # (an int32 KJT whose ids stay as they are is sent as it is)
        for i, key in enumerate(kjt.keys()):
            ids = values[offsets[i] : offsets[i + 1]]
            table = self.feature_table.get(key)
            if table is not None:
                twin = self.twins[table]
                if self.need_preprocess:
                    hashed = twin.preprocess_values(ids)
                    changed = changed or hashed is not ids
                    ids = hashed
                admitted = twin.admit_ids(ids, [key])
                changed = changed or admitted is not ids
                ids = admitted
            parts.append(ids)
        if not changed:
            return kjt
        return KeyedJaggedTensor(
            kjt.keys(), torch.cat(parts) if parts else values, kjt.weights_or_none(), lengths=kjt.lengths(),
            stride=kjt.stride(), length_per_key=kjt.length_per_key(), offset_per_key=offsets,
        )  # fmt: skip

    def owner(self, table: str, ids: torch.Tensor, buckets_per_rank: int) -> torch.Tensor:
        """``[N]`` rank owning each raw id of ``table`` (row-wise: whole buckets per rank)."""
        return torch.div(self.twins[table].bucket_of(ids.long()), buckets_per_rank, rounding_mode="floor")

    def owners(self, kjt: KeyedJaggedTensor, tables: list[str], buckets_per_rank: dict[str, int]) -> torch.Tensor:
        """``[N]`` rank owning each id of ``kjt``, whose key ``k`` reads table ``tables[k]`` (the
        ``owner`` of a row-wise input dist)."""
        values, offsets = kjt.values(), kjt.offset_per_key()
        ranks = [
            self.owner(table, values[offsets[k] : offsets[k + 1]], buckets_per_rank[table])
            for k, table in enumerate(tables)
        ]
        return torch.cat(ranks) if ranks else values.new_zeros(0, dtype=torch.int64)


# --------------------------------------------------------------------------------- lookup side
class McLookupState:
    """What the managed-collision side of a rank's lookups needs besides its kernels.

    Args:
        modules: ``{table: this rank's ManagedCollisionModule}`` (tables it holds rows of).
        reset_seed: seed of the re-initialisation of evicted rows.
        keep_remapped: remember each forward's remapped rows (to send them back).
    """

    def __init__(self, modules: dict[str, ManagedCollisionModule], reset_seed: int, keep_remapped: bool) -> None:
        self.modules = modules
        self.reset_seed = reset_seed
        self.keep_remapped = keep_remapped


class ManagedIds:
    """The received raw ids of one sharding's slots as this rank's local rows, evicted rows reset.

    Called on the KJT a lookup is about to read (``ShardedCollectionBase._lookup_input``).

    Args:
        state: the rank's modules, reset seed and whether to keep the remapped rows.
        slots: the slots the lookup serves, in key order of the received KJT.
        configs: ``{table: config}`` (the re-initialisation draws from its init range).
        lookup: the sharding's lookup, whose kernels hold the rows to reset.
    """

    def __init__(
        self,
        state: McLookupState,
        slots: Sequence[ShardSlot],
        configs: dict[str, BaseEmbeddingConfig],
        lookup: GroupedPooledEmbeddingsLookup | GroupedEmbeddingsLookup,
    ) -> None:
        self._state = state
        self._configs = configs
        keys: dict[str, list[int]] = {}
        for k, s in enumerate(slots):
            keys.setdefault(s.table, []).append(k)
        missing = sorted(t for t in keys if t not in state.modules)
        if missing:
            raise RuntimeError(f"internal error: no managed-collision module for tables {missing} on this rank")
        self._keys_of_table = keys
        self._lookup = lookup  # told which rows an eviction resets (its trackers record them)
        self._kernel_of_table: dict[str, tuple[BatchedEmbeddingBag | BatchedEmbedding, int]] = {}
        for kernel, shards in lookup.kernel_tables():
            for index, (table, _) in enumerate(shards):
                self._kernel_of_table[table] = (kernel, index)
        self.last_remapped: torch.Tensor | None = None  # [N] global rows of the last call, if kept

    @torch.no_grad()
    def __call__(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        values = kjt.values()
        offsets = kjt.offset_per_key()
        local = torch.empty_like(values, dtype=torch.int64)
        remapped = torch.empty_like(local) if self._state.keep_remapped else None
        for table, keys in self._keys_of_table.items():
            module = self._state.modules[table]
            slices = [(offsets[k], offsets[k + 1]) for k in keys]
            ids = torch.cat([values[a:b] for a, b in slices]) if len(slices) > 1 else values[slices[0][0] : slices[0][1]]
            rows = module.remap_values(ids.long(), [b - a for a, b in slices])
            self._reset_evicted(table, module)
            start = 0
            for a, b in slices:
                local[a:b] = rows[start : start + b - a] - module.output_global_offset
                if remapped is not None:
                    remapped[a:b] = rows[start : start + b - a]
                start += b - a
        self.last_remapped = remapped
        return KeyedJaggedTensor(
            kjt.keys(), local, kjt.weights_or_none(), lengths=kjt.lengths(), stride=kjt.stride(),
            length_per_key=kjt.length_per_key(), offset_per_key=offsets,
        )  # fmt: skip

    def _reset_evicted(self, table: str, module: ManagedCollisionModule) -> None:
        rows = module.evict()
        if rows is None or rows.numel() == 0:
            return
        bounds, first = module.reset_buckets()
        values = reinit_values(self._configs[table], rows, module.current_iteration(), self._state.reset_seed,
                               bounds, first)  # fmt: skip
        kernel, index = self._kernel_of_table[table]
        local = rows - module.output_global_offset
        kernel.reset_rows(kernel.table_names[index], local, values)
        self._lookup.notify_rows_reset(table, local)


# --------------------------------------------------------------------------------- output side
class WithIds(Awaitable[torch.Tensor]):
    """An output dist's embeddings (what it waits to) plus the awaitable of the remapped rows of
    the sent ids ``[N_sent, 1]`` (``ids``), which the collection's ``_assemble`` takes apart."""

    def __init__(self, embeddings: Awaitable[torch.Tensor], ids: Awaitable[torch.Tensor]) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.ids = ids

    def _wait_impl(self) -> torch.Tensor:
        return self.embeddings.wait()


class McOutputDist(KJTOutputDist):
    """The sharding's output dist; with ``return_ids``, also the remapped rows back to their senders.

    Args:
        inner: the sharding's own output dist.
        ids: the sharding's :class:`ManagedIds` (its ``last_remapped``).
        pg: process group.
        return_ids: send the remapped rows back.
    """

    def __init__(self, inner: KJTOutputDist, ids: ManagedIds, pg: torch.distributed.ProcessGroup | None,
                 return_ids: bool) -> None:  # fmt: skip
        super().__init__()
        self.inner = inner
        self._ids = ids
        self._ids_dist = SequenceEmbeddingsAllToAll(pg) if return_ids else None

    def forward(
        self, out: torch.Tensor, tensors: Awaitable[KeyedJaggedTensor], ctx: DistContext
    ) -> Awaitable[torch.Tensor]:  # with return_ids: WithIds
        embeddings = self.inner(out, tensors, ctx)
        if self._ids_dist is None:
            return embeddings
        remapped = self._ids.last_remapped
        assert remapped is not None  # McLookupState(keep_remapped=True) with return_ids
        pending = self._ids_dist(remapped.view(-1, 1), exchanged(tensors))
        perm = ctx.unbucketize
        if perm is None:
            return WithIds(embeddings, pending)
        return WithIds(embeddings, pending.then(lambda r: r.index_select(0, perm.long())))


# ---------------------------------------------------------------------------------- shardings
class McRwEmbeddingSharding(RwEmbeddingSharding):
    """Row-wise sharding of managed tables: raw ids go to the rank owning their bucket (module docstring).

    Args:
        tables, context: as :class:`RwEmbeddingSharding`.
        routes: the tables' routing twins.
        buckets_per_rank: ``{table: B / W}``.
        return_ids: the remapped rows go back too (``return_remapped_features``): keep the order to
            put them back in.
    """

    def __init__(
        self,
        tables: list[ShardedTable],
        context: ShardingContext,
        routes: McRoutes,
        buckets_per_rank: dict[str, int],
        return_ids: bool,
    ) -> None:
        super().__init__(tables, context)
        self._routes = routes
        self._buckets_per_rank = buckets_per_rank
        self._return_ids = return_ids

    def create_input_dist(self) -> InputDist[DistContext]:
        tables = [s.table for s in self.rw_slots]
        mean = [self.pooled and self.tables[t].pooling == PoolingType.MEAN for t in tables]
        owner = partial(self._routes.owners, tables=tables, buckets_per_rank=self._buckets_per_rank)
        return RwSparseFeaturesDist(
            self.env.pg, self.env.world_size, [s.feature_index for s in self.rw_slots],
            [self.tables[t].config.num_embeddings for t in tables], None, mean, self.is_weighted,
            (not self.pooled) or self._return_ids, owner,
        )  # fmt: skip


def managed_sharding(
    sharding_type: str,
    tables: list[ShardedTable],
    context: ShardingContext,
    routes: McRoutes,
    buckets_per_rank: dict[str, int],
    return_ids: bool,
) -> RwEmbeddingSharding | TwEmbeddingSharding:
    """The sharding of managed tables of ``sharding_type``: row-wise routes raw ids by bucket;
    table-wise is the plain sharding (its rank receives all of a table's ids)."""
    if sharding_type == ShardingType.ROW_WISE.value:
        return McRwEmbeddingSharding(tables, context, routes, buckets_per_rank, return_ids)
    return TwEmbeddingSharding(tables, context)


def managed_lookups(
    shardings: Sequence[KJTEmbeddingSharding], lookups: Sequence[nn.Module], state: McLookupState, rank: int
) -> list[ManagedIds]:
    """One :class:`ManagedIds` per sharding: the remap of what its lookup reads, evicted rows reset
    in that lookup's kernels."""
    out = []
    for sharding, lookup in zip(shardings, lookups, strict=True):
        if not isinstance(sharding, (RwEmbeddingSharding, TwEmbeddingSharding)) or not isinstance(
            lookup, (GroupedPooledEmbeddingsLookup, GroupedEmbeddingsLookup)
        ):
            raise TypeError(f"internal error: managed tables are sharded row-wise or table-wise, got {sharding.name}")
        configs = {name: t.config for name, t in sharding.tables.items()}
        out.append(ManagedIds(state, sharding.slots_by_rank[rank], configs, lookup))
    return out
