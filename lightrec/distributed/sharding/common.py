"""What every sharding type shares: shard slots, deterministic shard init, grouped lookups.

A *slot* is one lookup a rank performs: one feature read through one shard of its table. Table-wise
sharding gives a feature one slot (on the table's rank), column-wise one slot per column shard,
row-wise one slot per rank (every rank holds a row block and sees the ids that fall into it)::

    table T (rows 10, dim 8), feature f, 2 ranks
      table_wise(rank=1)     slots: (f, T shard 0 rows 0-9  cols 0-7, rank 1)
      column_wise([0, 1])    slots: (f, T shard 0 rows 0-9  cols 0-3, rank 0), (f, T shard 1 cols 4-7, rank 1)
      row_wise()             slots: (f, T shard 0 rows 0-4, rank 0), (f, T shard 1 rows 5-9, rank 1)

Each sharding type (``table_wise.py``, ``row_wise.py`` ...) implements
:class:`EmbeddingSharding` -- ``create_input_dist`` / ``create_lookup`` / ``create_output_dist``
-- and the sharded collections chain the three per sharding type.

On each rank the slots of one sharding type are served by :class:`GroupedPooledEmbeddingsLookup`
(or :class:`GroupedEmbeddingsLookup` for sequence embeddings): one batched kernel call per group
of slots sharing an optimizer (and, unpooled, a width). Slots are ordered so that every group is a
contiguous run of keys of the received ``KeyedJaggedTensor``.

Gradient semantics (docs/sharding.md): the loss of each rank is its own; the gradient a row gets is
the gradient of the *mean* of the per-rank losses, as DDP does for dense parameters. Model-parallel
lookups receive the *sum* over ranks from the backward collectives, so their output passes through
:func:`scale_grad` by ``1 / world_size``.
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lightrec._fbgemm import has_fbgemm_op
from lightrec.distributed.types import EmbeddingComputeKernel, ParameterSharding, ShardingEnv, ShardMetadata
from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag, TableSpec
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "EmbeddingSharding",
    "GroupedEmbeddingsLookup",
    "GroupedPooledEmbeddingsLookup",
    "ShardSlot",
    "ShardedTable",
    "complete_cumsum",
    "init_shard_",
    "mean_weights",
    "scale_grad",
]

# Rows per independently seeded init chunk: a row's initial value depends only on (seed, table,
# row), never on how the table is split, so every plan and world size starts from the same table.
INIT_CHUNK_ROWS = 4096


@dataclass
class ShardedTable:
    """One table of a sharded collection and how it is placed.

    Attributes:
        config: the table's ``EmbeddingBagConfig`` / ``EmbeddingConfig``.
        sharding: its :class:`ParameterSharding` from the plan.
        shards: shard metadata actually used (row-wise shards are laid out in rank order).
        optimizer: fused optimizer of the table, or None for a dense (autograd) kernel.
        source: the unsharded weight to copy shards from, or None to initialise them.
        pooling: the table's pooling (``NONE`` for sequence tables).
    """

    config: BaseEmbeddingConfig
    sharding: ParameterSharding
    shards: list[ShardMetadata]
    optimizer: FusedOptimizerSpec | None
    source: torch.Tensor | None
    pooling: PoolingType

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def fused(self) -> bool:
        return self.optimizer is not None


@dataclass(frozen=True)
class ShardSlot:
    """One (feature, shard) lookup performed on ``rank``.

    Attributes:
        feature: feature name; ``feature_index`` its position in the collection's feature order.
        table: table name; ``shard_index`` the shard's position in ``ShardedTable.shards``.
        row_offset/rows, col_offset/cols: the block of the full table the shard holds.
    """

    feature: str
    feature_index: int
    table: str
    shard_index: int
    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[len + 1]`` int64 offsets ``[0, l0, l0 + l1, ...]`` of 1-D ``lengths``."""
    lengths = lengths.long()
    if has_fbgemm_op("asynchronous_complete_cumsum"):
        return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    offsets = lengths.new_zeros(lengths.numel() + 1)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


def mean_weights(
    lengths: torch.Tensor,
    num_values: int,
    is_mean: torch.Tensor | None,
    batch: int,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """Per-id weights that turn a SUM lookup into MEAN pooling for the keys flagged in ``is_mean``.

    Args:
        lengths: ``[T * B]`` bag lengths (key-major).
        num_values: number of ids ``N`` (``lengths.sum()``).
        is_mean: ``[T]`` bool, or None when every key is MEAN.
        batch: ``B``.
        weights: ``[N]`` per-id weights to scale, or None.

    Returns:
        ``[N]`` float weights: ``w / len(bag)`` for MEAN keys (fbgemm's weighted-mean rule), ``w``
        otherwise. Row-wise sharding computes them before splitting the ids, so every partial sum
        is divided by the *true* bag length.
    """
    inv = 1.0 / lengths.clamp(min=1).to(torch.float32)
    if is_mean is not None:
        inv = torch.where(is_mean.repeat_interleave(batch), inv, torch.ones_like(inv))
    per_id = torch.repeat_interleave(inv, lengths.long(), output_size=num_values)
    return per_id if weights is None else weights.to(per_id.dtype) * per_id


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]  # noqa: ANN001
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]  # noqa: ANN001
        if torch.is_grad_enabled():  # create_graph=True: stay differentiable
            return grad * ctx.scale, None
        # The incoming gradient is the fresh output of a backward collective that nothing else
        # reads: scale it in place (one pass over [B, D] instead of a pass plus an allocation).
        return grad.mul_(ctx.scale), None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in forward; multiplies the gradient by ``scale`` in backward."""
    if scale == 1.0 or not x.requires_grad:
        return x
    return _ScaleGrad.apply(x, scale)


def table_seed(base_seed: int, table: str, chunk: int) -> int:
    """Seed of one init chunk: stable across processes, runs and world sizes."""
    return (zlib.crc32(f"{table}:{chunk}".encode()) ^ (base_seed * 0x9E3779B1)) & 0x7FFF_FFFF_FFFF


@torch.no_grad()
def init_shard_(
    out: torch.Tensor,
    config: BaseEmbeddingConfig,
    row_offset: int,
    col_offset: int,
    seed: int,
    source: torch.Tensor | None = None,
) -> None:
    """Fill ``out`` (``[rows, cols]`` block at ``(row_offset, col_offset)``) with the table's values.

    With ``source`` (an already materialised full table) the block is copied from it. Otherwise
    the config's uniform range is sampled in chunks of :data:`INIT_CHUNK_ROWS` rows, each chunk
    from its own generator (:func:`table_seed`), so the values do not depend on the plan. A
    config with ``init_fn`` gets it applied to the block under a seed derived from the block's
    position (deterministic, but dependent on the block shape).
    """
    rows, cols = out.shape
    if rows == 0 or cols == 0:
        return
    if source is not None:
        out.copy_(source[row_offset : row_offset + rows, col_offset : col_offset + cols])
        return
    if config.init_fn is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(table_seed(seed, f"{config.name}@{row_offset},{col_offset}", 0))
            block = torch.empty(rows, cols, dtype=out.dtype)
            config.init_fn(block)
        out.copy_(block)
        return
    lo, hi = config.get_weight_init_min(), config.get_weight_init_max()
    full_cols = config.embedding_dim
    first, last = row_offset // INIT_CHUNK_ROWS, (row_offset + rows - 1) // INIT_CHUNK_ROWS
    for chunk in range(first, last + 1):
        start = chunk * INIT_CHUNK_ROWS
        n = min(INIT_CHUNK_ROWS, config.num_embeddings - start)
        gen = torch.Generator().manual_seed(table_seed(seed, config.name, chunk))
        block = torch.empty(n, full_cols, dtype=torch.float32).uniform_(lo, hi, generator=gen)
        a, b = max(start, row_offset), min(start + n, row_offset + rows)
        out[a - row_offset : b - row_offset].copy_(
            block[a - start : b - start, col_offset : col_offset + cols]
        )


def _group_key(table: ShardedTable, slot: ShardSlot, pooled: bool) -> tuple:
    spec = None if table.optimizer is None else repr(table.optimizer)
    return (spec,) if pooled else (spec, slot.cols)


def order_slots(slots: Sequence[ShardSlot], tables: dict[str, ShardedTable], pooled: bool) -> list[ShardSlot]:
    """Stable sort of slots by kernel group, so each group is a contiguous run of keys."""
    keys = list(dict.fromkeys(_group_key(tables[s.table], s, pooled) for s in slots))
    return sorted(slots, key=lambda s: keys.index(_group_key(tables[s.table], s, pooled)))


@dataclass
class _Group:
    first: int  # first key of the group in the received KJT
    last: int  # one past the last key
    keys: list[int]  # keys served (empty shards excluded)
    width: int  # pooled: sum of the keys' widths; unpooled: the rows' width


class _GroupedLookupBase(nn.Module):
    """Kernels for the slots one rank serves; see the module docstring."""

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
    ) -> nn.Module:
        shards = list(dict.fromkeys((s.table, s.shard_index) for s in slots))
        per_table = self._shards_per_table
        names, specs = [], []
        for t, i in shards:
            meta = tables[t].shards[i]
            names.append(t if per_table[t] == 1 else f"{t}_shard{i}")
            specs.append(TableSpec(meta.shard_sizes[0], meta.shard_sizes[1], names[-1], _no_init))
        ftm = [shards.index((s.table, s.shard_index)) for s in slots]
        table = tables[slots[0].table]
        param_names = [f"{attr}.{t}.weight" + ("" if per_table[t] == 1 else f".shard{i}") for t, i in shards]
        if self._pooled:
            kernel: BatchedEmbeddingBag | BatchedEmbedding = BatchedEmbeddingBag(
                specs, ftm, PoolingType.SUM, table.optimizer, "auto", device, param_names
            )
        else:
            kernel = BatchedEmbedding(specs, ftm, table.optimizer, "auto", device, param_names)
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
        for kernel, group in zip(self._emb_modules, self._groups):
            shards = list(
                dict.fromkeys((self._slots[k].table, self._slots[k].shard_index) for k in group.keys)
            )
            out.append((kernel, shards))  # type: ignore[arg-type]
        return out

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
            return values, complete_cumsum(lengths), weights
        opk = kjt.offset_per_key()
        lo, hi = opk[group.first], opk[group.last]
        if len(group.keys) == group.last - group.first:
            return (
                values[lo:hi],
                complete_cumsum(lengths[group.first * batch : group.last * batch]),
                (weights[lo:hi] if weights is not None else None),
            )
        # Keys of empty shards received no ids (they own no rows): drop their lengths only.
        keep = torch.tensor(group.keys, dtype=torch.long, device=lengths.device)
        sub_lengths = lengths.view(-1, batch).index_select(0, keep).reshape(-1)
        return values[lo:hi], complete_cumsum(sub_lengths), (weights[lo:hi] if weights is not None else None)

    def extra_repr(self) -> str:
        return f"slots={len(self._slots)}, kernels={len(self._emb_modules)}"


def _no_init(weight: torch.Tensor) -> None:
    """Kernel tables are filled by :func:`init_shard_` right after construction."""


class GroupedPooledEmbeddingsLookup(_GroupedLookupBase):
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

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        batch = kjt.stride()
        if not self._groups:
            # Nothing served here; still join the backward collectives (the output needs a graph).
            return torch.zeros(
                batch, self._total_width, device=self._device, requires_grad=torch.is_grad_enabled()
            )
        weights = kjt.weights_or_none()
        if self._has_mean:
            weights = mean_weights(kjt.lengths(), kjt.values().numel(), self._mean_mask, batch, weights)
        outs = []
        for kernel, group in zip(self._emb_modules, self._groups):
            values, offsets, w = self._group_inputs(kjt, group, weights)
            outs.append(kernel(values, offsets, w))
        if self._needs_fill:
            outs.append(outs[0].new_zeros(batch, 1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._fill_index is not None:
            out = out.index_select(1, self._fill_index)
        return scale_grad(out, self._grad_scale)


class GroupedEmbeddingsLookup(_GroupedLookupBase):
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
        return scale_grad(out, self._grad_scale)


class EmbeddingSharding(abc.ABC):
    """One sharding type's part of a sharded collection: input dist, local lookup, output dist.

    Args:
        tables: the tables of this sharding type, in the collection's table order.
        feature_order: the collection's feature names (outputs use this order).
        env: world size, rank and process group.
        device: where this rank's shards live.
        pooled: EmbeddingBagCollection (True) or EmbeddingCollection (False).
        is_weighted: the collection pools with per-id weights.
        seed: base seed of shard initialisation (see :func:`init_shard_`).
    """

    name: str = "abstract"

    def __init__(
        self,
        tables: list[ShardedTable],
        feature_order: list[str],
        env: ShardingEnv,
        device: torch.device,
        pooled: bool,
        is_weighted: bool,
        seed: int,
    ) -> None:
        self.tables = {t.name: t for t in tables}
        self.table_list = list(tables)
        self.env = env
        self.device = device
        self.pooled = pooled
        self.is_weighted = is_weighted
        self.seed = seed
        self.attr = "embedding_bags" if pooled else "embeddings"
        index = {f: i for i, f in enumerate(feature_order)}
        # Features of this sharding in the collection's order, with their tables.
        self.features: list[tuple[str, int, ShardedTable]] = [
            (f, index[f], t) for t in tables for f in t.config.feature_names
        ]
        self.features.sort(key=lambda x: x[1])
        self.grad_scale = 1.0 / env.world_size

    @abc.abstractmethod
    def create_input_dist(self) -> nn.Module:
        """Module ``(kjt, key_positions) -> Awaitable[Awaitable[KJT]]`` routing ids to shards."""

    @abc.abstractmethod
    def create_lookup(self) -> nn.Module:
        """This rank's grouped lookup of the received KJT."""

    @abc.abstractmethod
    def create_output_dist(self) -> nn.Module:
        """Module sending lookup results back to the ranks owning the samples."""

    def output_layout(self) -> list[tuple[str, int, int]]:
        """Pooled: ``(feature, col_offset, cols)`` of each column block of the output dist's result,
        in order; unpooled shardings describe their rows in :meth:`feature_rows` instead."""
        raise TypeError(f"{type(self).__name__} has no pooled output layout")


def is_dense_kernel(sharding: ParameterSharding) -> bool:
    return sharding.compute_kernel == EmbeddingComputeKernel.DENSE.value


def width_of(tables: Sequence[ShardedTable]) -> int:
    """Widest shard over the tables (the padded row width of sequence all-to-alls)."""
    return max((s.shard_sizes[1] for t in tables for s in t.shards), default=0)


def check_blocks(table: ShardedTable, what: str) -> None:
    """Shards must tile the table exactly (typed error naming the table otherwise)."""
    rows, cols = table.config.num_embeddings, table.config.embedding_dim
    area = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in table.shards)
    inside = all(
        s.shard_offsets[0] + s.shard_sizes[0] <= rows and s.shard_offsets[1] + s.shard_sizes[1] <= cols
        for s in table.shards
    )
    if area != rows * cols or not inside:
        raise ValueError(
            f"{what} shards of table {table.name!r} do not tile its [{rows}, {cols}] weight: "
            f"{[(s.shard_offsets, s.shard_sizes) for s in table.shards]}; fix the plan's sharding_spec"
        )


@dataclass
class DistContext:
    """What an input dist started for one forward.

    Attributes:
        sent: the KJT of this sharding's features on this rank (selected, MEAN-weighted for
            row-wise, before bucketization); sequence outputs are split along its keys.
        splits: awaitable of the second stage (``KJTAllToAllTensorsAwaitable``, or a local
            stand-in for data parallel) whose ``wait()`` gives the KJT this rank looks up.
        unbucketize: row-wise sequence sharding: ``[N]`` position of each sent id among the
            bucketized ids (restores the input order of returned rows).
    """

    sent: KeyedJaggedTensor
    splits: object
    unbucketize: torch.Tensor | None = None


class KeySelector:
    """Pick (and order) a sharding's features out of the collection's input KJT.

    Args:
        feature_indices: collection feature index of each output key, in output order.
        keep_weights: keep the KJT's per-id weights (weighted collections) or drop them.
    """

    def __init__(self, feature_indices: list[int], keep_weights: bool) -> None:
        self.feature_indices = list(feature_indices)
        self.keep_weights = keep_weights
        self._cache: dict[tuple[int, ...], torch.Tensor | None] = {}

    def __call__(self, kjt: KeyedJaggedTensor, positions: list[int] | None) -> KeyedJaggedTensor:
        """``positions[i]``: key index in ``kjt`` of collection feature ``i`` (None: same order)."""
        if not self.keep_weights and kjt.weights_or_none() is not None:
            kjt = KeyedJaggedTensor(
                kjt.keys(), kjt.values(), None, lengths=kjt.lengths(), stride=kjt.stride()
            )
        idx = self.feature_indices if positions is None else [positions[i] for i in self.feature_indices]
        key = tuple(idx)
        if key not in self._cache:
            identity = idx == list(range(len(kjt.keys())))
            self._cache[key] = (
                None if identity else torch.tensor(idx, dtype=torch.int32, device=kjt.values().device)
            )
        index = self._cache[key]
        return kjt if index is None else kjt.permute(idx, index)
