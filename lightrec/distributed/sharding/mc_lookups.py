"""Lookup side of sharded managed-collision tables: remap raw ids on their owner, reset evicted rows.

After the input dist a rank holds, for every managed table it serves, the raw ids that fall into
its buckets (row-wise) or all of the table's ids (table-wise). Before the kernels run, each table's
local ``ManagedCollisionModule`` (built for this rank's rows) remaps them to local rows -- one step
per table and forward on every rank that holds rows of it, so steps and eviction rounds stay in
lock-step with the unsharded module -- and the rows it evicted get fresh weights and a zeroed
optimizer state in the kernels (``reset_rows`` of the kernel interface, ``lightrec.kernels.kernel_interface``, with the values
``lightrec.modules.managed_collision.reset.reinit_values`` gives the unsharded module).

``McOutputDist`` optionally sends the remapped rows back to the ranks that own the samples
(``return_remapped_features=True``), next to the embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightrec.distributed.comm import SequenceEmbeddingsAllToAll
from lightrec.distributed.sharding.common import DistContext, OutputDist, ShardedTable, ShardSlot
from lightrec.distributed.sharding.lookups import (
    GroupedEmbeddingsLookup,
    GroupedPooledEmbeddingsLookup,
    _GroupedLookupBase,
)
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.reset import reinit_values
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["McGroupedEmbeddingsLookup", "McGroupedPooledEmbeddingsLookup", "McLookupState", "McOutputDist", "WithIds"]


class McLookupState:
    """What a managed-collision lookup needs besides its kernels.

    Args:
        modules: ``{table: this rank's ManagedCollisionModule}`` (tables it holds rows of).
        reset_seed: seed of the re-initialisation of evicted rows.
        keep_remapped: remember each forward's remapped rows (to send them back).
    """

    def __init__(self, modules: dict[str, ManagedCollisionModule], reset_seed: int, keep_remapped: bool) -> None:
        self.modules = modules
        self.reset_seed = reset_seed
        self.keep_remapped = keep_remapped


class _McLookupMixin(_GroupedLookupBase):
    """Remap, then the kernels of the base lookup (see the module docstring)."""

    _mc: McLookupState
    _keys_of_table: dict[str, list[int]]
    _kernel_of_table: dict[str, tuple[Any, int]]
    last_remapped: torch.Tensor | None

    def _mc_setup(self, slots: Sequence[ShardSlot], tables: dict[str, ShardedTable], state: McLookupState) -> None:
        self._mc = state
        self._configs = {name: t.config for name, t in tables.items()}
        keys: dict[str, list[int]] = {}
        for k, s in enumerate(slots):
            keys.setdefault(s.table, []).append(k)
        missing = sorted(t for t in keys if t not in state.modules)
        if missing:
            raise RuntimeError(f"internal error: no managed-collision module for tables {missing} on this rank")
        self._keys_of_table = keys
        self._kernel_of_table = {}
        for kernel, shards in self.kernel_tables():
            for index, (table, _) in enumerate(shards):
                self._kernel_of_table[table] = (kernel, index)
        self.last_remapped = None

    @torch.no_grad()
    def _remap(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        values = kjt.values()
        offsets = kjt.offset_per_key()
        local = torch.empty_like(values, dtype=torch.int64)
        remapped = torch.empty_like(local) if self._mc.keep_remapped else None
        for table, keys in self._keys_of_table.items():
            module = self._mc.modules[table]
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
        values = reinit_values(self._configs[table], rows, module.current_iteration(), self._mc.reset_seed, bounds, first)
        kernel, index = self._kernel_of_table[table]
        kernel.reset_rows(kernel.table_names[index], rows - module.output_global_offset, values)


class McGroupedPooledEmbeddingsLookup(_McLookupMixin, GroupedPooledEmbeddingsLookup):
    """``GroupedPooledEmbeddingsLookup`` of managed tables (arguments as the base, plus ``state``)."""

    def __init__(
        self,
        slots: Sequence[ShardSlot],
        tables: dict[str, ShardedTable],
        device: torch.device,
        seed: int,
        state: McLookupState,
        attr: str = "embedding_bags",
        grad_scale: float = 1.0,
        mean_keys: list[bool] | None = None,
    ) -> None:
        GroupedPooledEmbeddingsLookup.__init__(self, slots, tables, device, seed, attr, grad_scale, mean_keys)
        self._mc_setup(slots, tables, state)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return GroupedPooledEmbeddingsLookup.forward(self, self._remap(kjt))


class McGroupedEmbeddingsLookup(_McLookupMixin, GroupedEmbeddingsLookup):
    """``GroupedEmbeddingsLookup`` of managed tables (arguments as the base, plus ``state``)."""

    def __init__(
        self,
        slots: Sequence[ShardSlot],
        tables: dict[str, ShardedTable],
        device: torch.device,
        seed: int,
        width: int,
        state: McLookupState,
        attr: str = "embeddings",
        grad_scale: float = 1.0,
    ) -> None:
        GroupedEmbeddingsLookup.__init__(self, slots, tables, device, seed, width, attr, grad_scale)
        self._mc_setup(slots, tables, state)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return GroupedEmbeddingsLookup.forward(self, self._remap(kjt))


@dataclass
class WithIds:
    """An output dist's result plus the awaitable of the remapped rows of the sent ids ``[N_sent, 1]``."""

    embeddings: Any
    ids: Any


class McOutputDist(OutputDist):
    """The sharding's output dist; with ``return_ids``, also the remapped rows back to their senders.

    Args:
        inner: the sharding's own output dist.
        lookup: the sharding's managed-collision lookup (its ``last_remapped``).
        pg: process group.
        return_ids: send the remapped rows back.
    """

    def __init__(self, inner: OutputDist, lookup: _McLookupMixin, pg: torch.distributed.ProcessGroup | None,
                 return_ids: bool) -> None:  # fmt: skip
        super().__init__()
        self.inner = inner
        self._lookup = [lookup]  # a plain list: the lookup is registered (and saved) by the collection
        self._return_ids = return_ids
        self._ids_dist = SequenceEmbeddingsAllToAll(pg) if return_ids else None

    def forward(self, out: torch.Tensor, tensors: Any, ctx: DistContext) -> Any:  # with return_ids: WithIds
        embeddings = self.inner(out, tensors, ctx)
        if self._ids_dist is None:
            return embeddings
        remapped = self._lookup[0].last_remapped
        assert remapped is not None  # McLookupState(keep_remapped=True) with return_ids
        pending = self._ids_dist(remapped.view(-1, 1), tensors)
        perm = ctx.unbucketize
        if perm is None:
            return WithIds(embeddings, pending)
        return WithIds(embeddings, pending.then(lambda r: r.index_select(0, perm.long())))
