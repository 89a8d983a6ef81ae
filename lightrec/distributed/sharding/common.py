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
-- and the sharded collections chain the three per sharding type. What flows between them is
declared here, for every sharding type alike::

    InputDist   (kjt: KeyedJaggedTensor, positions) -> DistContext  (splits: Awaitable[Awaitable[KJT]])
    lookup      (received: KeyedJaggedTensor) -> torch.Tensor       (lookups.GroupedLookup)
    OutputDist  (embeddings: Tensor, received: Awaitable[KJT], ctx) -> Awaitable[torch.Tensor]

On each rank the slots of one sharding type are served by ``lookups.GroupedPooledEmbeddingsLookup``
(or ``lookups.GroupedEmbeddingsLookup`` for sequence embeddings): one batched kernel call per group
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.awaitable import Awaitable
from lightrec.distributed.comm.kjt_all_to_all import KJTAllToAllTensorsAwaitable
from lightrec.distributed.comm.pooled_all_to_all import PlacedExchange, PooledEmbeddingsAllToAll
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sequence_all_to_all import SequenceEmbeddingsAllToAll
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan import ParameterSharding, ShardMetadata
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "DistContext",
    "EmbeddingLookup",
    "EmbeddingSharding",
    "InputDist",
    "KJTEmbeddingSharding",
    "KJTInputDist",
    "KJTOutputDist",
    "OutputDist",
    "PooledOutputDist",
    "SequenceOutputDist",
    "ShardSlot",
    "ShardedTable",
    "ShardingContext",
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
        kernel_backend: kernel of its shards: ``"auto"`` (fbgemm where it supports the table,
            else Triton on CUDA, else pure torch), ``"fbgemm"``, ``"triton"`` or ``"torch"``.
        tiering: for a tiered compute kernel (``fused_uvm_caching`` / ``key_value``), where the
            shards' rows live and their cache (``sharding/tiering.py``); None: in memory.
    """

    config: BaseEmbeddingConfig
    sharding: ParameterSharding
    shards: list[ShardMetadata]
    optimizer: FusedOptimizerSpec | None
    source: torch.Tensor | None
    pooling: PoolingType
    kernel_backend: str = "auto"
    tiering: TieringConfig | None = None

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
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # noqa: ANN001
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
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
    tiering = None if table.tiering is None else repr(table.tiering)  # one cache and store per kernel
    return (spec, tiering) if pooled else (spec, tiering, slot.cols)


def order_slots(slots: Sequence[ShardSlot], tables: dict[str, ShardedTable], pooled: bool) -> list[ShardSlot]:
    """Stable sort of slots by kernel group, so each group is a contiguous run of keys."""
    keys = list(dict.fromkeys(_group_key(tables[s.table], s, pooled) for s in slots))
    return sorted(slots, key=lambda s: keys.index(_group_key(tables[s.table], s, pooled)))


@dataclass(frozen=True)
class ShardingContext:
    """What the sharding types of one sharded collection share (the collection builds one).

    Attributes:
        feature_order: the collection's feature names (outputs use this order).
        env: world size, rank and process group.
        device: where this rank's shards live.
        pooled: EmbeddingBagCollection (True) or EmbeddingCollection (False).
        is_weighted: the collection pools with per-id weights.
        seed: base seed of shard initialisation (see :func:`init_shard_`).
        qcomm_codecs_registry: ``{comm op: QuantizedCommCodecs}`` of the output dists
            (``lightrec.distributed.fbgemm_qcomm_codec``), or None for float rows.
    """

    feature_order: list[str]
    env: ShardingEnv
    device: torch.device
    pooled: bool
    is_weighted: bool
    seed: int
    qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None


def width_of(tables: Sequence[ShardedTable]) -> int:
    """Widest shard over the tables (the padded row width of sequence all-to-alls)."""
    return max((s.shard_sizes[1] for t in tables for s in t.shards), default=0)


def _overlap(a: ShardMetadata, b: ShardMetadata) -> bool:
    """Whether two non-empty blocks share a cell."""
    return all(
        a.shard_offsets[d] < b.shard_offsets[d] + b.shard_sizes[d]
        and b.shard_offsets[d] < a.shard_offsets[d] + a.shard_sizes[d]
        for d in (0, 1)
    )


def check_blocks(table: ShardedTable, what: str) -> None:
    """Shards must tile the table exactly (typed error naming the table otherwise): inside it, not
    overlapping, and covering it (the same area: two shards over the same columns would otherwise
    serve those columns twice and the rest never)."""
    rows, cols = table.config.num_embeddings, table.config.embedding_dim
    area = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in table.shards)
    inside = all(
        min(*s.shard_offsets, *s.shard_sizes) >= 0
        and s.shard_offsets[0] + s.shard_sizes[0] <= rows
        and s.shard_offsets[1] + s.shard_sizes[1] <= cols
        for s in table.shards
    )
    blocks = [s for s in table.shards if s.shard_sizes[0] > 0 and s.shard_sizes[1] > 0]
    overlap = any(_overlap(a, b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    if area != rows * cols or not inside or overlap:
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
    splits: Awaitable[Awaitable[KeyedJaggedTensor]]
    unbucketize: torch.Tensor | None = None


C = TypeVar("C", bound=DistContext)
"""What a sharding's input dist starts for one forward (:class:`DistContext` or a subclass)."""
F = TypeVar("F")
"""The features one rank looks up (``KeyedJaggedTensor``)."""
T = TypeVar("T")
"""What the lookup returns and the output dist sends (``torch.Tensor``)."""
W = TypeVar("W")
"""What the output dist's awaitable gives (``torch.Tensor``: pooled ``[B_local, width]`` or rows)."""


class InputDist(nn.Module, abc.ABC, Generic[C]):
    """A sharding type's input dist: select its features of the collection's KJT and start sending
    their ids to the ranks holding their shards (stage 1: the splits exchange)."""

    @abc.abstractmethod
    def forward(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> C:
        """Start the input dist of ``kjt``; ``positions[i]``: key index in ``kjt`` of collection
        feature ``i`` (None: the collection's order)."""

    if TYPE_CHECKING:  # nn.Module.__call__ runs the hooks and forward; declared with forward's types

        def __call__(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> C: ...


class EmbeddingLookup(nn.Module, abc.ABC, Generic[F, T]):
    """A sharding type's lookup on one rank: the features it received -> their embeddings
    (``lookups.GroupedLookup``: ``KeyedJaggedTensor`` -> ``torch.Tensor``)."""

    @abc.abstractmethod
    def forward(self, features: F) -> T:
        """This rank's embeddings of the received ``features``."""

    if TYPE_CHECKING:  # nn.Module.__call__ runs the hooks and forward; declared with forward's types

        def __call__(self, features: F) -> T: ...


def exchanged(received: Awaitable[KeyedJaggedTensor]) -> KJTAllToAllTensorsAwaitable:
    """The KJT all-to-all behind a model-parallel sharding's received features (its batch sizes
    and value counts are what the output dist sends back by)."""
    if not isinstance(received, KJTAllToAllTensorsAwaitable):
        raise TypeError(
            f"a model-parallel output dist needs the KJT all-to-all of its input dist, got {type(received).__name__}"
        )
    return received


class OutputDist(nn.Module, abc.ABC, Generic[C, F, T, W]):
    """A sharding type's output dist: this rank's lookup results -> its samples' embeddings."""

    @abc.abstractmethod
    def forward(self, embeddings: T, received: Awaitable[F], ctx: C) -> Awaitable[W]:
        """Start sending ``embeddings`` (the lookup of ``received.wait()``) back to the ranks owning
        the samples (pooled: ``[B_local, width]``; sequence: one row per input id)."""

    if TYPE_CHECKING:  # nn.Module.__call__ runs the hooks and forward; declared with forward's types

        def __call__(self, embeddings: T, received: Awaitable[F], ctx: C) -> Awaitable[W]: ...


KJTInputDist = InputDist[DistContext]
"""The input dist of every sharding type here."""

KJTOutputDist = OutputDist[DistContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor]
"""The output dist of every sharding type here: tensors back for the KJT it received."""


class PooledOutputDist(KJTOutputDist):
    """Pooled embeddings back by the source ranks' batch sizes, through ``collective(embeddings,
    batch_size_per_rank)`` (the pooled all-to-all, or the reduce-scatter of row-wise partial sums)."""

    def __init__(self, collective: Callable[[torch.Tensor, list[int]], Awaitable[torch.Tensor]]) -> None:
        super().__init__()
        self._dist = collective

    def forward(
        self, embeddings: torch.Tensor, received: Awaitable[KeyedJaggedTensor], ctx: DistContext
    ) -> Awaitable[torch.Tensor]:
        return self._dist(embeddings, exchanged(received).batch_size_per_rank)

    def prepare(
        self, received: Awaitable[KeyedJaggedTensor], dtype: torch.dtype, device: torch.device
    ) -> PlacedExchange | None:
        """Start the exchange before the lookup of ``received.wait()`` runs, so that the lookup writes its
        rows where they go (``PooledEmbeddingsAllToAll.prepare``); None where that does not apply.
        A prepared exchange goes on with :meth:`send_placed`, before any other collective starts."""
        if not isinstance(self._dist, PooledEmbeddingsAllToAll):
            return None
        return self._dist.prepare(exchanged(received).batch_size_per_rank, dtype, device)

    def send_placed(
        self, embeddings: torch.Tensor, received: Awaitable[KeyedJaggedTensor], placed: PlacedExchange
    ) -> Awaitable[torch.Tensor]:
        """:meth:`forward` for a lookup that wrote its rows into ``placed.out_rows``."""
        if not isinstance(self._dist, PooledEmbeddingsAllToAll):
            raise TypeError(f"send_placed needs a PooledEmbeddingsAllToAll, this output dist has {type(self._dist).__name__}")
        return self._dist(embeddings, exchanged(received).batch_size_per_rank, placed=placed)


class SequenceOutputDist(KJTOutputDist):
    """Every looked-up row back to the rank that sent its id (``SequenceEmbeddingsAllToAll``)."""

    def __init__(self, pg: dist.ProcessGroup | None, codecs: QuantizedCommCodecs | None = None) -> None:
        super().__init__()
        self._dist = SequenceEmbeddingsAllToAll(pg, codecs)

    def forward(
        self, embeddings: torch.Tensor, received: Awaitable[KeyedJaggedTensor], ctx: DistContext
    ) -> Awaitable[torch.Tensor]:
        return self._dist(embeddings, exchanged(received))


class EmbeddingSharding(abc.ABC, Generic[C, F, T, W]):
    """One sharding type's part of a sharded collection: input dist, local lookup, output dist.

    Generic as torchrec's ``EmbeddingSharding[C, F, T, W]``: ``C`` the context its input dist
    starts (:class:`DistContext`), ``F`` the features a rank looks up, ``T`` what the lookup
    returns and the output dist sends, ``W`` what the output dist's awaitable gives. Every
    sharding type here is a :data:`KJTEmbeddingSharding` (KJT in, tensors out).

    Args:
        tables: the tables of this sharding type, in the collection's table order.
        context: what every sharding type of the collection shares (:class:`ShardingContext`).
    """

    name: str = "abstract"

    def __init__(self, tables: list[ShardedTable], context: ShardingContext) -> None:
        self.tables = {t.name: t for t in tables}
        self.table_list = list(tables)
        self.env = context.env
        self.device = context.device
        self.pooled = context.pooled
        self.is_weighted = context.is_weighted
        self.seed = context.seed
        self.attr = "embedding_bags" if context.pooled else "embeddings"
        index = {f: i for i, f in enumerate(context.feature_order)}
        # Features of this sharding in the collection's order, with their tables.
        self.features: list[tuple[str, int, ShardedTable]] = [
            (f, index[f], t) for t in tables for f in t.config.feature_names
        ]
        self.features.sort(key=lambda x: x[1])
        self.grad_scale = 1.0 / context.env.world_size
        self.qcomm_codecs_registry = dict(context.qcomm_codecs_registry or {})
        self.width = width_of(tables)

    def whole_table_slots(self, rank: int) -> list[ShardSlot]:
        """One slot per feature covering its whole table on ``rank``, in kernel-group order (the
        same on every rank, so each group is a contiguous run of keys)."""
        slots = [
            ShardSlot(f, i, t.name, 0, rank, 0, t.config.num_embeddings, 0, t.config.embedding_dim)
            for f, i, t in self.features
        ]
        return order_slots(slots, self.tables, self.pooled)

    def codecs(self, comm_op: str) -> QuantizedCommCodecs | None:
        """The codecs of ``comm_op`` (``"pooled_embeddings_all_to_all"``, ``"pooled_embeddings_reduce_scatter"``,
        ``"sequence_embeddings_all_to_all"``), or None."""
        return self.qcomm_codecs_registry.get(comm_op)

    @abc.abstractmethod
    def create_input_dist(self) -> InputDist[C]:
        """Module ``(kjt, key_positions) -> DistContext`` routing ids to shards."""

    @abc.abstractmethod
    def create_lookup(self) -> EmbeddingLookup[F, T]:
        """This rank's grouped lookup of the received KJT."""

    @abc.abstractmethod
    def create_output_dist(self) -> OutputDist[C, F, T, W]:
        """Module sending lookup results back to the ranks owning the samples."""

    def output_layout(self) -> list[tuple[str, int, int]]:
        """Pooled: ``(feature, col_offset, cols)`` of each column block of the output dist's result,
        in order; unpooled shardings describe their rows in :meth:`feature_rows` instead."""
        raise TypeError(f"{type(self).__name__} has no pooled output layout")

    def feature_rows(self, rows: W, ctx: C) -> dict[str, torch.Tensor]:
        """Sequence output: ``{feature: [N_f, D]}`` out of the rows the output dist returned."""
        raise TypeError(f"{type(self).__name__} has no sequence output")


KJTEmbeddingSharding = EmbeddingSharding[DistContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor]
"""Every sharding type here: KJT in (input dist and lookup), tensors out (lookup and output dist)."""


def rows_by_feature(rows: torch.Tensor, ctx: DistContext, slots: Sequence[ShardSlot]) -> dict[str, torch.Tensor]:
    """Sequence output of a sharding that sends each feature once, whole: ``{feature: [N_f, D]}``
    cut from the returned ``[N_sent, width]`` rows, which are in the sent KJT's value order."""
    opk = ctx.sent.offset_per_key()
    return {s.feature: rows[opk[k] : opk[k + 1], : s.cols] for k, s in enumerate(slots)}


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
            # Keep the host-side sizes: without them the next length_per_key() reads the device.
            kjt = KeyedJaggedTensor(
                kjt.keys(),
                kjt.values(),
                None,
                lengths=kjt.lengths(),
                stride=kjt.stride(),
                length_per_key=kjt.length_per_key_or_none(),
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
