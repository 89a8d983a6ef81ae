"""The tables a tracker (and the sharded publisher) sees in a model, and where this rank holds them.

Each sharded collection of the model contributes its tables, each named by its FQN -- the
state-dict key of its weight without ``.weight``, as torchrec keys its tracker::

    model.sparse_arch.embedding_bag_collection                          (a ShardedEmbeddingBagCollection)
      -> "sparse_arch.embedding_bag_collection.embedding_bags.t0"       table t0
    model.sparse_arch.mc_ebc                                            (a sharded managed-collision EBC)
      -> "sparse_arch.mc_ebc._embedding_module.embedding_bags.t1"       table t1

:class:`TrackedTable` says, for one table, what every rank knows (its shards, sharding type,
optimizer) and what only this rank has (its local shards: the kernel and kernel-table index that
hold each; the managed-collision module that maps ids to this rank's rows). :class:`LookupKeys`
says, for one grouped lookup, which table shard each key of its input KJT reads, so that a
recorded lookup turns into global row ids of tables (``ids + row_offset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from lightrec.distributed.mc_embedding_modules import BaseShardedManagedCollisionEmbeddingCollection
from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection
from lightrec.distributed.planner.plan import ShardingType, ShardMetadata
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.data_parallel import DpEmbeddingSharding
from lightrec.distributed.sharding.lookups import GroupedLookup
from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.ops import EMPTY_ID
from lightrec.optim.fused_spec import FusedOptimizerSpec

# the id map's per-row ids (slot order) and what marks an empty row there
_IDENTITY_KEYS = {"_mch_sorted_raw_ids": EMPTY_ID, "_hash_zch_identities": -1}

__all__ = ["KeySlot", "LocalShard", "LookupKeys", "TrackedTable", "clean_path", "find_tables", "sharded_collections"]


@dataclass(frozen=True)
class LocalShard:
    """One block of a table held on this rank.

    Attributes:
        shard_index: its position in the table's shards.
        row_offset, rows, col_offset, cols: the block of the full table it holds.
        kernel: the batched lookup holding it; ``kernel_table`` its table index there.
    """

    shard_index: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    kernel: BatchedEmbeddingBag | BatchedEmbedding
    kernel_table: int


@dataclass
class TrackedTable:
    """One table of a sharded collection (see the module docstring).

    Attributes:
        fqn: the tracker's key (the weight's state-dict key without ``.weight``).
        name: the table's name; ``collection`` the sharded collection holding it.
        num_embeddings, dim: the full table's shape.
        sharding_type: ``"table_wise"``, ``"row_wise"``, ... (``ShardingType`` values).
        shards: every shard of the table, on every rank (a data-parallel table: one, on this rank).
        local: the shards this rank holds.
        optimizer: the fused optimizer updating its rows inside backward (data-parallel tables: the
            rule their gradient sync applies), or None: a dense-kernel table the dense optimizer steps.
        managed: the table has a managed-collision id map; ``id_map`` is this rank's (None: no rows here).
        pooled: an ``EmbeddingBagCollection`` table (False: an ``EmbeddingCollection`` one).
    """

    fqn: str
    name: str
    collection: ShardedCollectionBase
    num_embeddings: int
    dim: int
    sharding_type: str
    shards: list[ShardMetadata]
    local: list[LocalShard]
    optimizer: FusedOptimizerSpec | None
    managed: bool
    id_map: ManagedCollisionModule | None
    pooled: bool

    @property
    def data_parallel(self) -> bool:
        return self.sharding_type == ShardingType.DATA_PARALLEL.value

    @property
    def updates_touched_rows_only(self) -> bool:
        """Whether only rows a batch looked up can change (fused and data-parallel tables); a
        dense-kernel table's rows move wherever its dense optimizer moves them (e.g. momentum)."""
        return self.optimizer is not None

    def raw_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Managed tables: int64 ``[n]`` the raw id each of ``rows`` (global rows of this rank's
        block) now holds in the id map, -1 for an empty row.

        Raises:
            ValueError: the table is not managed, has no id map on this rank, or its id map keeps
                no per-row ids.
        """
        if self.id_map is None:
            raise ValueError(f"table {self.fqn!r} has no managed-collision id map on this rank "
                             f"(managed={self.managed}); ask the rank that holds its rows")  # fmt: skip
        state = self.id_map.slot_state()
        key = next((k for k in _IDENTITY_KEYS if k in state), None)
        if key is None:
            raise ValueError(f"table {self.fqn!r}: its id map keeps no per-row ids ({list(_IDENTITY_KEYS)})")
        identities = state[key].reshape(-1)
        local = (rows.to(torch.int64) - self.id_map.output_global_offset).to(identities.device)
        raw = identities.index_select(0, local).cpu()
        return torch.where(raw == _IDENTITY_KEYS[key], torch.full_like(raw, -1), raw)


class KeySlot(NamedTuple):
    """The table shard one key of a grouped lookup's input reads."""

    fqn: str
    table: str
    shard_index: int
    row_offset: int  # global row = id read + row_offset
    cols: int  # the shard's columns (a sequence lookup pads its rows to the widest slot)


@dataclass(frozen=True)
class LookupKeys:
    """For each key of a grouped lookup's input, its :class:`KeySlot`, or None for a key whose ids
    are not tracked (an empty shard)."""

    keys: tuple[KeySlot | None, ...]


# What DistributedModelParallel (and DDP inside it) put before the model's own module names.
_WRAPPER_PREFIXES = ("_dmp_wrapped_module.module.", "_dmp_wrapped_module.", "module.")


def clean_path(path: str) -> str:
    """``path`` without the prefix a ``DistributedModelParallel`` / DDP wrapper adds (torchrec's rule):
    names as the wrapped model's state dict has them."""
    for prefix in _WRAPPER_PREFIXES:
        if path.startswith(prefix):
            return path[len(prefix) :]
    return "" if path in ("_dmp_wrapped_module", "module") else path


def _skipped(path: str, fqns_to_skip: list[str]) -> bool:
    parts = path.split(".")
    return any(skip in parts for skip in fqns_to_skip)


def sharded_collections(model: nn.Module) -> list[tuple[str, ShardedCollectionBase]]:
    """``(path, collection)`` of every outermost sharded collection in ``model`` (paths cleaned of wrappers)."""
    found: list[tuple[str, ShardedCollectionBase]] = []
    for path, module in model.named_modules():
        if isinstance(module, ShardedCollectionBase) and not any(path.startswith(f"{p}.") for p, _ in found):
            found.append((path, module))
    return [(clean_path(p), m) for p, m in found]


def find_tables(
    model: nn.Module, fqns_to_skip: list[str] | None = None
) -> tuple[dict[str, TrackedTable], dict[int, tuple[GroupedLookup, LookupKeys]]]:
    """Every table of every sharded collection of ``model`` (by FQN), and every grouped lookup with its key map.

    Args:
        model: a ``DistributedModelParallel`` or a module holding sharded collections.
        fqns_to_skip: path components whose collections are left out.

    Returns:
        ``({fqn: TrackedTable}, {id(lookup): (lookup, LookupKeys)})``.

    Raises:
        ValueError: the model holds no sharded collection (names what to do).
    """
    skip = list(fqns_to_skip or [])
    collections = sharded_collections(model)
    if not collections:
        raise ValueError(f"{type(model).__name__} holds no sharded embedding collection; the delta tracker tracks "
                         "the tables of a DistributedModelParallel (or of RecStrategy's sharded model): wrap the "
                         "model in DistributedModelParallel, or train with RecStrategy (a recipe's "
                         "--trainer.strategy lightrec, also on one device)")  # fmt: skip
    tables: dict[str, TrackedTable] = {}
    lookups: dict[int, tuple[GroupedLookup, LookupKeys]] = {}
    for path, collection in collections:
        if _skipped(path, skip):
            continue
        prefix = f"{path}." if path else ""
        id_maps: dict[str, ManagedCollisionModule] = {}
        managed = isinstance(collection, BaseShardedManagedCollisionEmbeddingCollection)
        if managed:
            mcc = collection._managed_collision_collection
            assert isinstance(mcc, ShardedManagedCollisionCollection)  # what the managed collections hold
            id_maps = mcc.local_modules()
        fqn_of = {name: f"{prefix}{collection._state_prefix}{collection._attr}.{name}" for name in collection._tables}
        for sharding, lookup in zip(collection.shardings, collection._grouped_lookups(), strict=True):
            holders: dict[tuple[str, int], tuple[BatchedEmbeddingBag | BatchedEmbedding, int]] = {}
            for kernel, shards in lookup.kernel_tables():
                for index, key in enumerate(shards):
                    holders[key] = (kernel, index)
            for name in sharding.tables:
                table = collection._tables[name]
                local = [
                    LocalShard(i, s.shard_offsets[0], s.shard_sizes[0], s.shard_offsets[1], s.shard_sizes[1],
                               *holders[(name, i)])
                    for i, s in enumerate(table.shards) if (name, i) in holders
                ]  # fmt: skip
                optimizer = sharding.specs[name] if isinstance(sharding, DpEmbeddingSharding) else table.optimizer
                tables[fqn_of[name]] = TrackedTable(
                    fqn_of[name], name, collection, table.config.num_embeddings, table.config.embedding_dim,
                    sharding.name, list(table.shards), local, optimizer, managed, id_maps.get(name), collection._pooled,
                )  # fmt: skip
            keys = tuple(
                KeySlot(fqn_of[s.table], s.table, s.shard_index, s.row_offset, s.cols) if s.rows > 0 and s.cols > 0
                else None
                for s in lookup.slots
            )  # fmt: skip
            lookups[id(lookup)] = (lookup, LookupKeys(keys))
    return tables, lookups
