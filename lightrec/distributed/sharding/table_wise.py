"""Table-wise sharding: each table lives whole on one rank.

Forward, for the tables of this sharding type (``W`` ranks, rank ``s`` holds ``B_s`` samples)::

    input dist   select this sharding's features, ordered rank by rank (the slots of rank 0, then
                 rank 1, ...); KJT all-to-all -> rank r holds its slots' ids for all B_0+...+B_{W-1}
                 samples
    lookup       one batched kernel call per optimizer group -> [sum B, sum of rank r's widths]
    output dist  pooled all-to-all -> [B_s, sum of all widths]  (EBC)
                 sequence all-to-all -> one row per id, in the sent KJT's value order  (EC)

Column-wise and table-column-wise sharding reuse this machinery unchanged: a column shard is a
table of ``[rows, cols_i]`` on its rank, and the feature is sent once per shard
(``column_wise.py``, which only validates the shards). MEAN pooling is exact here because every bag arrives whole at its rank: the
lookup divides by the received bag lengths.
"""

from __future__ import annotations

import torch

from lightrec.distributed.comm import KJTAllToAll, PooledEmbeddingsAllToAll
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.sharding.common import (
    DistContext,
    InputDist,
    KeySelector,
    KJTEmbeddingSharding,
    KJTOutputDist,
    PooledOutputDist,
    SequenceOutputDist,
    ShardedTable,
    ShardingContext,
    ShardSlot,
    check_blocks,
    order_slots,
)
from lightrec.distributed.sharding.lookups import GroupedLookup, grouped_lookup
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "TwEmbeddingSharding",
    "TwPooledEmbeddingDist",
    "TwSequenceEmbeddingDist",
    "TwSparseFeaturesDist",
]


class TwSparseFeaturesDist(InputDist[DistContext]):
    """Input dist: select and order the slot keys, then start the KJT all-to-all.

    Args:
        pg: process group.
        feature_indices: collection feature index of every slot, rank-major.
        key_splits: ``[W]`` number of slots of each rank.
        keep_weights: send per-id weights (weighted collections).
    """

    def __init__(
        self,
        pg: torch.distributed.ProcessGroup | None,
        feature_indices: list[int],
        key_splits: list[int],
        keep_weights: bool,
    ) -> None:
        super().__init__()
        self._select = KeySelector(feature_indices, keep_weights)
        self._dist = KJTAllToAll(pg, key_splits)
        self._key_splits = list(key_splits)

    def forward(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> DistContext:
        sent = self._select(kjt, positions)
        return DistContext(sent, self._dist(sent))

    def extra_repr(self) -> str:
        return f"key_splits={self._key_splits}"


class TwPooledEmbeddingDist(PooledOutputDist):
    """Output dist: pooled all-to-all of ``[sum B, D_r]`` back to ``[B_s, sum D]``.

    The result comes out in ``column_order`` (the collection's feature order when this is its only
    sharding type), the gradient is scaled by ``grad_scale`` on its way back, and the lookup's
    backward runs after the rest of the backward pass (``PooledEmbeddingsAllToAll``).
    """

    def __init__(
        self,
        pg: torch.distributed.ProcessGroup | None,
        dim_sum_per_rank: list[int],
        column_order: list[int] | None = None,
        grad_scale: float = 1.0,
        codecs: QuantizedCommCodecs | None = None,
    ) -> None:
        super().__init__(
            PooledEmbeddingsAllToAll(pg, dim_sum_per_rank, column_order, grad_scale, defer_input_grad=True,
                                     codecs=codecs)  # fmt: skip
        )
        self._dims = list(dim_sum_per_rank)

    def extra_repr(self) -> str:
        return f"dim_sum_per_rank={self._dims}"


class TwSequenceEmbeddingDist(SequenceOutputDist):
    """Output dist: every looked-up row goes back to the rank that sent its id."""


class TwEmbeddingSharding(KJTEmbeddingSharding):
    """Table-wise sharding (one shard per table); base of the column-wise variants."""

    name = "table_wise"

    def __init__(self, tables: list[ShardedTable], context: ShardingContext) -> None:
        super().__init__(tables, context)
        for t in tables:
            self.check_table(t)
        by_rank: list[list[ShardSlot]] = [[] for _ in range(self.env.world_size)]
        for feature, index, table in self.features:
            for i, s in enumerate(table.shards):
                by_rank[s.rank].append(
                    ShardSlot(feature, index, table.name, i, s.rank, s.shard_offsets[0], s.shard_sizes[0],
                              s.shard_offsets[1], s.shard_sizes[1])
                )  # fmt: skip
        self.slots_by_rank = [order_slots(slots, self.tables, self.pooled) for slots in by_rank]
        self.sent_slots = [s for slots in self.slots_by_rank for s in slots]
        self.column_order: list[int] | None = None

    def set_column_order(self, column_order: list[int]) -> None:
        """Have the output dist emit its columns in this order (``column_order[j]``: output
        column of column ``j`` of :meth:`output_layout`); called before ``create_output_dist``."""
        self.column_order = list(column_order)

    def check_table(self, table: ShardedTable) -> None:
        """Table-wise: exactly one shard holding the whole table."""
        if len(table.shards) != 1:
            raise ValueError(
                f"table_wise table {table.name!r} must have exactly one shard, got {len(table.shards)}; "
                "use column_wise for several column shards"
            )
        check_blocks(table, self.name)

    def create_input_dist(self) -> InputDist[DistContext]:
        return TwSparseFeaturesDist(
            self.env.pg,
            [s.feature_index for s in self.sent_slots],
            [len(slots) for slots in self.slots_by_rank],
            self.is_weighted,
        )

    def create_lookup(self) -> GroupedLookup:
        mine = self.slots_by_rank[self.env.rank]
        # Pooled: the gradient scale is applied by the output dist while it packs the gradient.
        return grouped_lookup(self, mine, self.width, 1.0 if self.pooled else self.grad_scale, lookup_mean=True)

    def create_output_dist(self) -> KJTOutputDist:
        if self.pooled:
            dims = [sum(s.cols for s in slots) for slots in self.slots_by_rank]
            return TwPooledEmbeddingDist(self.env.pg, dims, self.column_order, self.grad_scale,
                                         self.codecs("pooled_embeddings_all_to_all"))  # fmt: skip
        return TwSequenceEmbeddingDist(self.env.pg, self.codecs("sequence_embeddings_all_to_all"))

    def output_layout(self) -> list[tuple[str, int, int]]:
        return [(s.feature, s.col_offset, s.cols) for s in self.sent_slots]

    def feature_rows(self, rows: torch.Tensor, ctx: DistContext) -> dict[str, torch.Tensor]:
        """Sequence output: ``{feature: [N_f, D]}`` from the returned ``[N_sent, width]`` rows."""
        opk = ctx.sent.offset_per_key()
        pieces: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for k, s in enumerate(self.sent_slots):
            pieces.setdefault(s.feature, []).append((s.col_offset, rows[opk[k] : opk[k + 1], : s.cols]))
        out = {}
        for feature, blocks in pieces.items():
            blocks.sort(key=lambda b: b[0])
            out[feature] = blocks[0][1] if len(blocks) == 1 else torch.cat([b for _, b in blocks], dim=1)
        return out
