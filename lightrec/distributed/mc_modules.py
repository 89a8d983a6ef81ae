"""Sharded managed-collision state (torchrec's ``torchrec.distributed.mc_modules`` path).

:class:`ShardedManagedCollisionCollection` holds this rank's managed-collision modules -- one per
table it holds rows of, rebuilt for exactly those rows (``rebuild_with_output_id_range``) and
seeded with the unsharded module's state when it had any -- and presents them in ``state_dict``
under the unsharded keys, like the sharded tables::

    key                                                        value
    ---------------------------------------------------------  ---------------------------------------
    _managed_collision_modules.<t>._mch_sorted_raw_ids          ShardedTableState [zch, 1]: this rank's
    _managed_collision_modules.<t>._mch_remapped_ids_mapping    rows of each per-row buffer (slot order)
    _managed_collision_modules.<t>._mch_counts ...              (every rank has every key)
    _managed_collision_modules.<t>._current_iter_tensor         replicated [1]
    _managed_collision_modules.<t>._output_segments_tensor      replicated [1025]

Loading takes either that form (same plan) or full tensors -- lightrec's ``[zch]`` / ``[zch, 1]``
slot-ordered ones, or torchrec's sorted ones with their mapping -- for any plan; the per-row
buffers are also what sharded checkpoints save and reshard (``row_state_tables``).

The sharded embedding collections that use it are in ``mc_embedding_modules.py``;
``ManagedCollisionCollectionSharder`` and ``InferManagedCollisionCollectionSharder`` are here for
torchrec's import paths (they describe the collections' row-wise sharding; the embedding sharders
build the sharded modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan import ModuleSharder, ParameterSharding, ShardingType, ShardMetadata
from lightrec.distributed.sharding.state_dict import ShardedTableState
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.collection import ManagedCollisionCollection
from lightrec.modules.managed_collision.hash_zch_module import HashZchManagedCollisionModule
from lightrec.modules.managed_collision.mch_module import MCHManagedCollisionModule
from lightrec.modules.managed_collision.mch_state import slot_order

__all__ = [
    "InferManagedCollisionCollectionSharder",
    "ManagedCollisionCollectionSharder",
    "ShardedManagedCollisionCollection",
    "check_state_dict",
]

_REPLICATED = ("_current_iter_tensor", "_output_segments_tensor")


def _replicated_state(module: ManagedCollisionModule) -> dict[str, torch.Tensor]:
    """The module's replicated buffers on CPU; a ``meta`` module's as a fresh module has them (its
    bucket segments, iteration 0) -- without building its per-row state."""
    out = {}
    for name, buf in module.named_buffers(recurse=False):
        if name not in _REPLICATED:
            continue
        if not buf.is_meta:
            out[name] = buf.detach().clone().cpu()
        elif name == "_output_segments_tensor":
            segments = list(module.output_segments)
            out[name] = torch.tensor(segments + [-1] * (buf.numel() - len(segments)), dtype=buf.dtype)
        else:
            out[name] = torch.zeros(buf.shape, dtype=buf.dtype)
    return out


def _copy_state(local: ManagedCollisionModule, module: ManagedCollisionModule) -> None:
    """Copy ``module``'s id map into ``local``, its shard twin (the kinds whose state is one table
    of slots; others start their shard empty)."""
    if isinstance(local, MCHManagedCollisionModule) and isinstance(module, MCHManagedCollisionModule):
        local.copy_state_from(module)
    elif isinstance(local, HashZchManagedCollisionModule) and isinstance(module, HashZchManagedCollisionModule):
        local.copy_state_from(module)


def _block(sharding: ParameterSharding, rank: int) -> ShardMetadata | None:
    """This rank's block of a (row-wise or table-wise) table, if it holds one."""
    return next((s for s in sharding.sharding_spec or [] if s.rank == rank), None)


class ShardedManagedCollisionCollection(nn.Module):
    """This rank's managed-collision modules (see the module docstring).

    Args:
        modules: ``{table: unsharded ManagedCollisionModule}`` (meta, fresh or trained).
        plan: ``{table: ParameterSharding}`` aligned to whole buckets (``align_managed_plan``).
        env: the sharding environment.
        device: where the modules live.
        need_preprocess: the unsharded collection's flag.
    """

    def __init__(
        self,
        modules: dict[str, ManagedCollisionModule],
        plan: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
        need_preprocess: bool = True,
    ) -> None:
        super().__init__()
        self._env = env
        self.need_preprocess = need_preprocess
        self._tables = list(modules)
        self._rows = {t: m.output_size() for t, m in modules.items()}
        self._blocks: dict[str, ShardMetadata | None] = {}
        self._row_names: dict[str, list[str]] = {}
        self._replicated: dict[str, dict[str, torch.Tensor]] = {}
        self._managed_collision_modules = nn.ModuleDict()
        for table, module in modules.items():
            segments = list(module.output_segments)
            block = _block(plan[table], env.rank)
            self._blocks[table] = block
            self._row_names[table] = list(module.slot_state())
            self._replicated[table] = _replicated_state(module)
            if block is None:
                continue
            start = block.shard_offsets[0]
            local = module.rebuild_with_output_id_range((start, start + block.shard_sizes[0]), segments, device)
            local._name = module._name or table
            if next(iter(module.slot_state().values())).device.type != "meta":
                _copy_state(local, module)
            local.train(module.training)
            self._managed_collision_modules[table] = local
        self._register_state_dict_hook(_state_dict_hook)
        self._register_load_state_dict_pre_hook(_load_state_dict_pre_hook, with_module=True)

    def local_modules(self) -> dict[str, ManagedCollisionModule]:
        """``{table: module}`` of the tables this rank holds rows of."""
        return {t: m for t, m in self._managed_collision_modules.items() if isinstance(m, ManagedCollisionModule)}

    def tick(self) -> None:
        """Count a training step for tables without a module here (their iteration stays replicated)."""
        for table in self._tables:
            counter = self._replicated[table].get("_current_iter_tensor")
            if counter is not None and table not in self._managed_collision_modules:
                counter += 1

    def row_state_tables(self, prefix: str) -> list[tuple[str, list[int], list[tuple[ShardMetadata, torch.Tensor]]]]:
        """Every per-row buffer as a ``[rows, 1]`` table: ``(key, global shape, this rank's blocks)``."""
        out = []
        local = self.local_modules()
        for table in self._tables:
            block = self._blocks[table]
            states = local[table].slot_state() if table in local else {}
            for name in self._row_names[table]:
                key = f"{prefix}_managed_collision_modules.{table}.{name}"
                blocks = []
                if block is not None and name in states:
                    meta = ShardMetadata([block.shard_offsets[0], 0], [block.shard_sizes[0], 1], block.placement)
                    blocks.append((meta, states[name].view(-1, 1)))
                out.append((key, [self._rows[table], 1], blocks))
        return out

    def tables(self) -> list[str]:
        """Every table of the collection (this rank holds rows of some of them)."""
        return list(self._tables)

    def stats(self) -> dict[str, dict[str, float]]:
        """``{table: counters}`` of this rank's modules (``ManagedCollisionModule.mc_stats``)."""
        return {t: m.mc_stats() for t, m in self.local_modules().items()}

    def extra_repr(self) -> str:
        return f"tables={self._tables}, rank={self._env.rank}/{self._env.world_size}"


def _state_dict_hook(
    module: ShardedManagedCollisionCollection, state_dict: dict[str, object], prefix: str, local_metadata: object
) -> None:
    rows = module.row_state_tables(prefix)
    for table in module._tables:
        base = f"{prefix}_managed_collision_modules.{table}."
        for key in [k for k in state_dict if k.startswith(base)]:
            del state_dict[key]
        for name, shape, blocks in rows:
            if name.startswith(base):
                dtype = blocks[0][1].dtype if blocks else _dtype_of(name[len(base) :])
                state_dict[name] = ShardedTableState(shape, [(m, t.detach()) for m, t in blocks], dtype)
        local = module.local_modules().get(table)
        for name, value in module._replicated[table].items():
            live = getattr(local, name, None) if local is not None else None
            state_dict[base + name] = (live if isinstance(live, torch.Tensor) else value).detach().clone()


def _dtype_of(name: str) -> torch.dtype:
    """dtype of a per-row buffer on a rank that holds none of its rows (all int64 but the hash's metadata)."""
    return torch.int32 if name == "_hash_zch_metadata" else torch.int64


def _load_state_dict_pre_hook(
    module: ShardedManagedCollisionCollection, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """Turn each table's entries (sharded or full, lightrec's or torchrec's order) into its local module's."""
    _localize(module, state_dict, prefix, keep_replicated=True)


def check_state_dict(module: ShardedManagedCollisionCollection, state_dict: Mapping[str, object], prefix: str) -> None:
    """Raise what loading ``module``'s entries of ``state_dict`` (keys under ``prefix``) would raise,
    changing nothing: the load's conversion to this rank's rows, on a copy, then each local module's
    own check (``ManagedCollisionModule.check_state_dict``: bucket layout, ids in their buckets).

    The sharded managed-collision embedding collections call it before their tables are copied:
    torch loads a module's children in order, and the tables come before the id maps.

    Raises:
        ValueError: naming the table, the key and what does not fit.
    """
    scratch = {k: v for k, v in state_dict.items() if k.startswith(prefix)}
    _localize(module, scratch, prefix, keep_replicated=False)
    for table, local in module.local_modules().items():
        local.check_state_dict(scratch, f"{prefix}_managed_collision_modules.{table}.")


def _localize(
    module: ShardedManagedCollisionCollection, state_dict: dict[str, Any], prefix: str, keep_replicated: bool
) -> None:
    """The load's conversion of ``state_dict`` in place (``_load_state_dict_pre_hook``); with
    ``keep_replicated`` the replicated buffers of tables without a local module are kept by
    ``module`` (a load), else only dropped from ``state_dict`` (a check)."""
    for table in module._tables:
        base = f"{prefix}_managed_collision_modules.{table}."
        names = module._row_names[table]
        full = {n: state_dict[base + n] for n in names if isinstance(state_dict.get(base + n), torch.Tensor)}
        if "_mch_remapped_ids_mapping" in full:  # torchrec's sorted form is converted on the whole table
            scratch = {n: v.detach().cpu() for n, v in full.items()}
            slot_order(scratch, "", list(scratch), module._rows[table], 0, f"managed-collision table {table!r}")
            full = scratch
        block = module._blocks[table]
        local = module.local_modules().get(table)
        for name in names:
            key = base + name
            if key not in state_dict:
                continue
            value = state_dict.pop(key)
            if local is None or block is None:
                continue
            state_dict[key] = _local_rows(full.get(name, value), block, local.slot_state()[name], key)
        for name in _REPLICATED:
            if base + name in state_dict and (local is None or not hasattr(local, name)):
                value = state_dict.pop(base + name)
                if keep_replicated and name in module._replicated[table]:
                    module._replicated[table][name] = value.detach().clone().cpu()


def _local_rows(value: object, block: ShardMetadata, like: torch.Tensor, key: str) -> torch.Tensor:
    """This rank's rows of a per-row buffer, shaped like the local buffer ``like``."""
    start, rows = block.shard_offsets[0], block.shard_sizes[0]
    if isinstance(value, ShardedTableState):
        for meta, tensor in value.shards:
            if meta.shard_offsets[0] == start and meta.shard_sizes[0] == rows:
                return tensor.reshape(like.shape)
        raise ValueError(
            f"state_dict[{key!r}] holds rows {[(m.shard_offsets[0], m.shard_sizes[0]) for m, _ in value.shards]} but this "
            f"rank needs rows [{start}, {start + rows}); a sharded state dict loads into the same plan -- gather it first"
        )
    if not isinstance(value, torch.Tensor) or value.shape[0] < start + rows:
        raise ValueError(f"state_dict[{key!r}] must be a tensor of the whole table's rows, got {type(value).__name__}")
    return value[start : start + rows].reshape(like.shape)


class ManagedCollisionCollectionSharder(ModuleSharder):
    """torchrec's sharder name for ``ManagedCollisionCollection``: row-wise (and table-wise) plans.

    lightrec shards a ``ManagedCollisionCollection`` together with its embedding collection
    (``ManagedCollisionEmbeddingBagCollectionSharder``); this class states the sharding types
    and is accepted where torchrec code passes it (``mc_sharder=``).
    """

    @property
    def module_type(self) -> type[nn.Module]:
        return ManagedCollisionCollection

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [ShardingType.ROW_WISE.value, ShardingType.TABLE_WISE.value]


class InferManagedCollisionCollectionSharder(ManagedCollisionCollectionSharder):
    """torchrec's inference twin of :class:`ManagedCollisionCollectionSharder` (serving: the remapper
    is kept whole, see ``lightrec.distributed.quant_embedding``)."""
