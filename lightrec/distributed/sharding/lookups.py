"""Grouped lookups: the kernels one rank runs for the slots of one sharding type.

The slots a rank serves (``common.ShardSlot``) are ordered so that each kernel group -- slots
sharing a fused optimizer (and, unpooled, a width) -- is a contiguous run of keys of the received
``KeyedJaggedTensor``; each group is ONE batched kernel call (fbgemm TBE or the torch backend).
Slots of empty shards (a row-wise rank holding no rows of a small table) receive no ids and are
left out of the kernels; their pooled columns are zero.

Trackers (``register_lookup_tracker``; the delta tracker of ``lightrec.distributed.model_tracker``)
are told, after each training lookup, the KJT it read (key ``k`` = slot ``k``, ids local to the
slot's shard) and its output, and which rows a managed-collision eviction reset: what changed is
recorded where the ids already are, at the cost of a call per lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from lightrec.distributed.sharding.common import (
    EmbeddingLookup,
    KJTEmbeddingSharding,
    ShardedTable,
    ShardSlot,
    _group_key,
    init_shard_,
    mean_weights,
    scale_grad,
)
from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag, BatchedTableSpec
from lightrec.kernels.kernel_interface import OutRows
from lightrec.modules.embedding_configs import PoolingType
from lightrec.sparse import KeyedJaggedTensor
from lightrec.sparse._ops import complete_cumsum

__all__ = [
    "GroupedEmbeddingsLookup",
    "GroupedLookup",
    "GroupedPooledEmbeddingsLookup",
    "LookupTracker",
    "grouped_lookup",
]


class LookupTracker(Protocol):
    """What a grouped lookup tells a registered tracker (``GroupedLookup.register_lookup_tracker``)."""

    def on_lookup(self, lookup: GroupedLookup, features: KeyedJaggedTensor, output: torch.Tensor) -> None:
        """A training lookup read ``features`` (key ``k``: ``lookup.slots[k]``, ids local to its shard)
        and returned ``output`` (pooled ``[B, width]``; sequence ``[N, width]``, a row per id)."""

    def on_rows_reset(self, lookup: GroupedLookup, table: str, rows: torch.Tensor) -> None:
        """Rows ``rows`` (``[n]`` local to this rank's shard of ``table``) got fresh values outside a
        lookup (a managed-collision eviction)."""


@dataclass
class _Group:
    first: int  # first key of the group in the received KJT
    last: int  # one past the last key
    keys: list[int]  # keys served (empty shards excluded)
    width: int  # pooled: sum of the keys' widths; unpooled: the rows' width


class GroupedLookup(EmbeddingLookup[KeyedJaggedTensor, torch.Tensor]):
    """Kernels for the slots one rank serves; see the module docstring.

    ``lookup(received KJT) -> torch.Tensor``: pooled ``[B, sum of slot widths]``
    (:class:`GroupedPooledEmbeddingsLookup`) or one row per id (:class:`GroupedEmbeddingsLookup`).
    """

    def __init__(
        self,
        slots: Sequence[ShardSlot],
        tables: dict[str, ShardedTable],
        pooled: bool,
        device: torch.device,
        seed: int,
        attr: str,
        grad_scale: float,
    ) -> None:
        super().__init__()
        self._slots = list(slots)
        self._pooled = pooled
        self._grad_scale = grad_scale
        self._emb_modules = nn.ModuleList()
        self._groups: list[_Group] = []
        self._device = device
        self._trackers: list[LookupTracker] = []
        widths = [s.cols for s in self._slots]
        self._total_width = sum(widths)
        # A rank may hold several shards of one table (column-wise); they get distinct names.
        held = dict.fromkeys((s.table, s.shard_index) for s in self._slots if s.rows > 0 and s.cols > 0)
        self._shards_per_table = {t: sum(1 for tt, _ in held if tt == t) for t, _ in held}
        start = 0
        while start < len(self._slots):
            key = _group_key(tables[self._slots[start].table], self._slots[start], pooled)
            end = start
            while (
                end < len(self._slots)
                and _group_key(tables[self._slots[end].table], self._slots[end], pooled) == key
            ):
                end += 1
            served = [k for k in range(start, end) if self._slots[k].rows > 0 and self._slots[k].cols > 0]
            if served:
                self._emb_modules.append(
                    self._make_kernel([self._slots[k] for k in served], tables, device, seed, attr)
                )
                width = sum(widths[k] for k in served) if pooled else self._slots[start].cols
                self._groups.append(_Group(start, end, served, width))
            start = end
        # Pooled output columns of the served keys, in key order, plus zero columns for empty shards.
        served_keys = [k for g in self._groups for k in g.keys]
        self._needs_fill = pooled and served_keys != list(range(len(self._slots)))
        self._fill_index: torch.Tensor | None = None
        if self._needs_fill:
            col_of: dict[int, int] = {}
            col = 0
            for k in served_keys:
                col_of[k], col = col, col + widths[k]
            zero_col = col  # one extra zero column appended after the served outputs
            index = []
            for k, w in enumerate(widths):
                index += list(range(col_of[k], col_of[k] + w)) if k in col_of else [zero_col] * w
            self._fill_index = torch.tensor(index, dtype=torch.long, device=device)

    def _make_kernel(
        self,
        slots: list[ShardSlot],
        tables: dict[str, ShardedTable],
        device: torch.device,
        seed: int,
        attr: str,
    ) -> BatchedEmbeddingBag | BatchedEmbedding:
        shards = list(dict.fromkeys((s.table, s.shard_index) for s in slots))
        per_table = self._shards_per_table
        names, specs = [], []
        for t, i in shards:
            meta = tables[t].shards[i]
            names.append(t if per_table[t] == 1 else f"{t}_shard{i}")
            specs.append(BatchedTableSpec(meta.shard_sizes[0], meta.shard_sizes[1], names[-1], _no_init))
        ftm = [shards.index((s.table, s.shard_index)) for s in slots]
        table = tables[slots[0].table]
        param_names = [f"{attr}.{t}.weight" + ("" if per_table[t] == 1 else f".shard{i}") for t, i in shards]
        if self._pooled:
            kernel: BatchedEmbeddingBag | BatchedEmbedding = BatchedEmbeddingBag(
                specs, ftm, PoolingType.SUM, table.optimizer, table.kernel_backend, device, param_names,
                tiering=table.tiering,
            )  # fmt: skip
        else:
            kernel = BatchedEmbedding(
                specs, ftm, table.optimizer, table.kernel_backend, device, param_names, tiering=table.tiering
            )
        for (t, i), weight in zip(shards, kernel.split_embedding_weights()):
            meta = tables[t].shards[i]
            init_shard_(
                weight.data,
                tables[t].config,
                meta.shard_offsets[0],
                meta.shard_offsets[1],
                seed,
                tables[t].source,
            )
        return kernel

    @property
    def slots(self) -> list[ShardSlot]:
        return list(self._slots)

    def kernel_tables(self) -> list[tuple[BatchedEmbeddingBag | BatchedEmbedding, list[tuple[str, int]]]]:
        """``(kernel, [(table, shard index) per kernel table])`` for every kernel."""
        out: list[tuple[BatchedEmbeddingBag | BatchedEmbedding, list[tuple[str, int]]]] = []
        for kernel, group in zip(self._kernels(), self._groups):
            shards = list(
                dict.fromkeys((self._slots[k].table, self._slots[k].shard_index) for k in group.keys)
            )
            out.append((kernel, shards))
        return out

    def register_lookup_tracker(self, tracker: LookupTracker) -> Callable[[], None]:
        """Tell ``tracker`` about every training lookup and row reset from now on; returns its remover."""
        self._trackers.append(tracker)

        def remove() -> None:
            if tracker in self._trackers:
                self._trackers.remove(tracker)

        return remove

    def _track(self, kjt: KeyedJaggedTensor, out: torch.Tensor) -> None:
        # Training lookups only: an evaluation forward (eval mode, no grad) changes no row.
        if self._trackers and (self.training or torch.is_grad_enabled()):
            for tracker in self._trackers:
                tracker.on_lookup(self, kjt, out)

    def notify_rows_reset(self, table: str, rows: torch.Tensor) -> None:
        """Rows ``rows`` (local to this rank's shard of ``table``) were reset outside a lookup."""
        for tracker in self._trackers:
            tracker.on_rows_reset(self, table, rows)

    @property
    def prefetches(self) -> bool:
        """Whether a kernel of this lookup wants the ids of a later batch ahead (``prefetch``)."""
        return any(kernel.prefetches for kernel in self._kernels())

    def prefetch(self, kjt: KeyedJaggedTensor) -> None:
        """Hand each kernel that prefetches the ids it will look up for ``kjt`` (a later batch)."""
        for kernel, group in zip(self._kernels(), self._groups):
            if kernel.prefetches:
                values, offsets, _ = self._group_inputs(kjt, group, None)
                kernel.prefetch(values, offsets)

    def _kernels(self) -> list[BatchedEmbeddingBag | BatchedEmbedding]:
        return [k for k in self._emb_modules if isinstance(k, (BatchedEmbeddingBag, BatchedEmbedding))]  # all are

    def _group_inputs(
        self, kjt: KeyedJaggedTensor, group: _Group, weights: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Values, offsets and weights of one group's keys."""
        batch = kjt.stride()
        lengths, values = kjt.lengths(), kjt.values()
        if (
            len(self._groups) == 1
            and group.first == 0
            and group.last == len(self._slots)
            and len(group.keys) == len(self._slots)
        ):
            return values, complete_cumsum(lengths.long()), weights
        opk = kjt.offset_per_key()
        lo, hi = opk[group.first], opk[group.last]
        if len(group.keys) == group.last - group.first:
            return (
                values[lo:hi],
                complete_cumsum(lengths[group.first * batch : group.last * batch].long()),
                (weights[lo:hi] if weights is not None else None),
            )
        # Keys of empty shards received no ids (they own no rows): drop their lengths only.
        keep = torch.tensor(group.keys, dtype=torch.long, device=lengths.device)
        sub_lengths = lengths.view(-1, batch).index_select(0, keep).reshape(-1)
        return (
            values[lo:hi],
            complete_cumsum(sub_lengths.long()),
            (weights[lo:hi] if weights is not None else None),
        )

    def extra_repr(self) -> str:
        return f"slots={len(self._slots)}, kernels={len(self._emb_modules)}"


def _no_init(weight: torch.Tensor) -> None:
    """Kernel tables are filled by :func:`init_shard_` right after construction."""


class GroupedPooledEmbeddingsLookup(GroupedLookup):
    """Pooled lookups of one rank: ``KJT (slot keys, stride B) -> [B, sum of slot widths]``.

    The KJT's weights (per-id weights and/or MEAN factors from the input dist) scale each id; the
    kernels pool with SUM. ``mean_keys`` (``[T]`` bool) makes the lookup compute MEAN factors from
    the received lengths itself (used when bags arrive whole).
    """

    def __init__(
        self,
        slots: Sequence[ShardSlot],
        tables: dict[str, ShardedTable],
        device: torch.device,
        seed: int,
        attr: str = "embedding_bags",
        grad_scale: float = 1.0,
        mean_keys: list[bool] | None = None,
    ) -> None:
        super().__init__(slots, tables, True, device, seed, attr, grad_scale)
        self._mean_all = mean_keys is not None and all(mean_keys)
        self._mean_mask: torch.Tensor | None = None
        if mean_keys is not None and any(mean_keys) and not self._mean_all:
            self._mean_mask = torch.tensor(mean_keys, dtype=torch.bool, device=device)
        self._has_mean = mean_keys is not None and any(mean_keys)

    def placeable(self) -> tuple[torch.dtype, torch.device] | None:
        """The output's dtype and device where :meth:`forward` can hand ``out_rows`` to its one kernel
        (so that the kernel may write the rows in place), else None: several kernels, columns of empty
        shards to fill, trackers that read the output, a gradient scale of its own (a kernel that reads
        its gradient in place bypasses autograd's), or tables not stored in float32 (a kernel may pool
        those into another dtype)."""
        if len(self._emb_modules) != 1 or self._needs_fill or self._trackers or self._grad_scale != 1.0:
            return None
        kernel = self._kernels()[0]
        if not isinstance(kernel, BatchedEmbeddingBag):
            return None
        weight = next(iter(kernel.weights.values()))  # the parameter view; no flush of a tiered cache
        return (weight.dtype, weight.device) if weight.dtype == torch.float32 else None

    def forward(self, kjt: KeyedJaggedTensor, out_rows: OutRows | None = None) -> torch.Tensor:
        """``[B, sum of slot widths]``; with ``out_rows`` its rows are written there too, and the result
        holds values only where ``out_rows.placed`` stays False (``kernel_interface.OutRows``)."""
        batch = kjt.stride()
        if not self._groups:
            # Nothing served here; still join the backward collectives (the output needs a graph).
            empty = torch.zeros(batch, self._total_width, device=self._device, requires_grad=torch.is_grad_enabled())
            if out_rows is not None:
                out_rows.copy_from(empty)
            return empty
        weights = kjt.weights_or_none()
        if self._has_mean:
            weights = mean_weights(kjt.lengths(), kjt.values().numel(), self._mean_mask, batch, weights)
        if out_rows is not None and self.placeable() is not None:
            bag = self._kernels()[0]
            values, offsets, w = self._group_inputs(kjt, self._groups[0], weights)
            assert isinstance(bag, BatchedEmbeddingBag)  # placeable() checked it
            return scale_grad(bag(values, offsets, w, out_rows), self._grad_scale)
        outs = []
        for kernel, group in zip(self._emb_modules, self._groups):
            values, offsets, w = self._group_inputs(kjt, group, weights)
            outs.append(kernel(values, offsets, w))
        if self._needs_fill:
            outs.append(outs[0].new_zeros(batch, 1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._fill_index is not None:
            out = out.index_select(1, self._fill_index)
        self._track(kjt, out)
        if out_rows is not None:
            out_rows.copy_from(out)
        return scale_grad(out, self._grad_scale)

    if TYPE_CHECKING:  # nn.Module.__call__ runs the hooks and forward; declared with forward's types

        def __call__(self, kjt: KeyedJaggedTensor, out_rows: OutRows | None = None) -> torch.Tensor: ...


class GroupedEmbeddingsLookup(GroupedLookup):
    """Unpooled lookups of one rank: ``KJT (slot keys) -> [N, width]`` rows in value order.

    Rows narrower than ``width`` (the widest slot of the sharding, the same on every rank) are
    zero-padded so one sequence all-to-all can carry every slot.
    """

    def __init__(
        self,
        slots: Sequence[ShardSlot],
        tables: dict[str, ShardedTable],
        device: torch.device,
        seed: int,
        width: int,
        attr: str = "embeddings",
        grad_scale: float = 1.0,
    ) -> None:
        super().__init__(slots, tables, False, device, seed, attr, grad_scale)
        self._width = width

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        n = kjt.values().numel()
        if not self._groups:
            return torch.zeros(n, self._width, device=self._device, requires_grad=torch.is_grad_enabled())
        outs = []
        for kernel, group in zip(self._emb_modules, self._groups):
            values, offsets, _ = self._group_inputs(kjt, group, None)
            rows = kernel(values, offsets)
            if group.width < self._width:
                rows = nn.functional.pad(rows, (0, self._width - group.width))
            outs.append(rows)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        self._track(kjt, out)
        return scale_grad(out, self._grad_scale)


def grouped_lookup(
    sharding: KJTEmbeddingSharding, slots: Sequence[ShardSlot], width: int, grad_scale: float, lookup_mean: bool
) -> GroupedLookup:
    """This rank's lookup of ``slots`` for ``sharding``: pooled or sequence, as its collection is.

    The one choice every sharding type's ``create_lookup`` makes; what differs between the types
    is explicit here.

    Args:
        sharding: the sharding the lookup serves (its tables, device, seed, attribute name, pooling).
        slots: the slots this rank serves.
        width: the sharding's widest slot (sequence rows are zero-padded to it).
        grad_scale: gradient scale the lookup applies (1.0 where the output dist scales instead).
        lookup_mean: pooled only: the lookup computes the MEAN tables' factors itself, from the
            received bag lengths (bags arrive whole); False where the input dist sends them.
    """
    if sharding.pooled:
        mean = [sharding.tables[s.table].pooling == PoolingType.MEAN for s in slots] if lookup_mean else None
        return GroupedPooledEmbeddingsLookup(
            slots, sharding.tables, sharding.device, sharding.seed, sharding.attr, grad_scale, mean
        )
    return GroupedEmbeddingsLookup(
        slots, sharding.tables, sharding.device, sharding.seed, width, sharding.attr, grad_scale
    )
