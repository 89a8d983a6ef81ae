"""Row-wise sharding: each table's rows split into contiguous blocks, one block per rank.

Forward, for the tables of this sharding type (``W`` ranks, rank ``s`` holds ``B_s`` samples)::

    input dist   select the features; MEAN tables get per-id weights 1/len(bag) computed HERE,
                 from the whole bag, before its ids are split; bucketize every id to the rank
                 owning its row (rebased to the shard's local row); KJT all-to-all -> rank r holds,
                 for every feature, the ids of all sum(B) samples that fall into its block
    lookup       one batched SUM kernel call per optimizer group -> partial sums [sum B, sum D]
    output dist  reduce-scatter: partial sums added over ranks, rank s keeps its B_s rows (EBC)
                 sequence all-to-all + unbucketize permutation back to the input order (EC)

Because the MEAN factor is the true bag length and travels with each id, the reduced sum of the
partial sums is exactly the mean over the whole bag (a per-shard mean would be wrong).

Shards: at most one per rank and table, spanning all columns; blocks are laid out in rank order
(``rows`` of rank 0 first), so a plan listing shards in another rank order keeps each rank's
block size but re-bases the offsets (:meth:`RwEmbeddingSharding.normalize`). Ranks without a
block (tables smaller than the world size, or ranks outside a host for table-row-wise) receive no
ids for the table and contribute zero partial sums.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightrec.distributed.comm import (
    Awaitable,
    KJTAllToAll,
    PooledEmbeddingsReduceScatter,
    bucketize_kjt_by_rank,
    bucketize_kjt_row_wise,
    row_wise_block_bounds,
    row_wise_block_size,
)
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.planner.plan import ShardMetadata
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
    mean_weights,
    rows_by_feature,
)
from lightrec.distributed.sharding.lookups import GroupedLookup, grouped_lookup
from lightrec.modules.embedding_configs import PoolingType
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["RwEmbeddingSharding", "RwPooledEmbeddingDist", "RwSequenceEmbeddingDist", "RwSparseFeaturesDist"]


class RwSparseFeaturesDist(InputDist[DistContext]):
    """Input dist: select features, add MEAN factors, bucketize by row block, KJT all-to-all.

    Args:
        pg: process group; ``world_size``: number of buckets.
        feature_indices: collection feature index of each row-wise feature (in sharding order).
        num_rows: ``[T]`` rows of each feature's table (ids are checked against it).
        block_bounds: ``[T][W + 1]`` row offsets of each rank's block, or None for the default
            ``ceil(rows / W)`` blocks.
        mean_keys: ``[T]`` MEAN flags.
        keep_weights: the collection is weighted.
        sequence: also compute the unbucketize permutation.
        owner: ``sent KJT -> [N]`` rank of every id, which then travels unchanged (managed-collision
            tables route raw ids by bucket, ``sharding/managed_collision.py``); None: the rank whose
            row block holds the id, rebased to that block (``num_rows`` / ``block_bounds``).
    """

    def __init__(
        self,
        pg: torch.distributed.ProcessGroup | None,
        world_size: int,
        feature_indices: list[int],
        num_rows: list[int],
        block_bounds: list[list[int]] | None,
        mean_keys: list[bool],
        keep_weights: bool,
        sequence: bool,
        owner: Callable[[KeyedJaggedTensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self._select = KeySelector(feature_indices, keep_weights)
        self._owner = owner
        self._world_size = world_size
        self._num_rows = list(num_rows)
        self._block_sizes = [row_wise_block_size(r, world_size) for r in num_rows]
        self._block_bounds = block_bounds
        self._has_mean = any(mean_keys)
        self._mean_mask = None if all(mean_keys) else torch.tensor(mean_keys, dtype=torch.bool)
        self._sequence = sequence
        self._dist = KJTAllToAll(pg, [len(feature_indices)] * world_size)

    def forward(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> DistContext:
        sent = self._select(kjt, positions)
        if self._has_mean:
            lengths, values = sent.lengths(), sent.values()
            mask = None if self._mean_mask is None else self._mean_mask.to(lengths.device)
            w = mean_weights(lengths, values.numel(), mask, sent.stride(), sent.weights_or_none())
            sent = KeyedJaggedTensor(sent.keys(), values, w, lengths=lengths, stride=sent.stride())
        if self._owner is not None:
            bucketized = bucketize_kjt_by_rank(sent, self._owner(sent), self._world_size, self._sequence)
        else:
            bucketized = bucketize_kjt_row_wise(
                sent,
                self._world_size,
                self._block_sizes,
                block_bounds=self._block_bounds,
                num_rows=self._num_rows,
                output_permute=self._sequence,
            )
        return DistContext(sent, self._dist(bucketized.kjt), bucketized.unbucketize_permute)

    def extra_repr(self) -> str:
        return f"features={len(self._num_rows)}, world_size={self._world_size}"


class RwPooledEmbeddingDist(PooledOutputDist):
    """Output dist: reduce-scatter of the partial pooled sums ``[sum B, D] -> [B_s, D]``."""

    def __init__(self, pg: torch.distributed.ProcessGroup | None, codecs: QuantizedCommCodecs | None = None) -> None:
        super().__init__(PooledEmbeddingsReduceScatter(pg, codecs))


class RwSequenceEmbeddingDist(SequenceOutputDist):
    """Output dist: rows back to their senders, then into the pre-bucketization id order."""

    def forward(
        self, embeddings: torch.Tensor, received: Awaitable[KeyedJaggedTensor], ctx: DistContext
    ) -> Awaitable[torch.Tensor]:
        perm = ctx.unbucketize
        if perm is None:
            raise RuntimeError("internal error: a row-wise sequence input dist keeps the unbucketize permutation")
        return super().forward(embeddings, received, ctx).then(lambda r: r.index_select(0, perm.long()))


class RwEmbeddingSharding(KJTEmbeddingSharding):
    """Row-wise sharding over the ranks listed by each table's shards (all ranks for row_wise)."""

    name = "row_wise"

    def __init__(self, tables: list[ShardedTable], context: ShardingContext) -> None:
        super().__init__(tables, context)
        world = self.env.world_size
        self.bounds: dict[str, list[int]] = {t.name: self.normalize(t, world) for t in tables}
        # Features in kernel-group order; each rank's slot of a feature is cut from them below.
        self.rw_slots = self.whole_table_slots(0)
        self.slots_by_rank: list[list[ShardSlot]] = []
        for rank in range(world):
            slots = []
            for p in self.rw_slots:
                table = self.tables[p.table]
                bounds = self.bounds[p.table]
                index = next((i for i, s in enumerate(table.shards) if s.rank == rank), -1)
                rows = bounds[rank + 1] - bounds[rank] if index >= 0 else 0
                slots.append(
                    ShardSlot(p.feature, p.feature_index, p.table, index, rank, bounds[rank], rows, 0, p.cols)
                )
            self.slots_by_rank.append(slots)

    def normalize(self, table: ShardedTable, world_size: int) -> list[int]:
        """Check the shards and lay them out in rank order; return the ``W + 1`` block bounds."""
        rows, cols = table.config.num_embeddings, table.config.embedding_dim
        ranks = [s.rank for s in table.shards]
        problems = []
        if len(set(ranks)) != len(ranks):
            problems.append(f"ranks {ranks} repeat (one block per rank)")
        if any(r >= world_size for r in ranks):
            problems.append(f"ranks {ranks} exceed world size {world_size}")
        if any(s.shard_offsets[1] != 0 or s.shard_sizes[1] != cols for s in table.shards):
            problems.append(f"every shard must span all {cols} columns")
        if sum(s.shard_sizes[0] for s in table.shards) != rows:
            problems.append(f"shard rows {[s.shard_sizes[0] for s in table.shards]} must add up to {rows}")
        if problems:
            raise ValueError(f"{self.name} table {table.name!r}: " + "; ".join(problems) + "; fix the plan")
        size = [0] * world_size
        for s in table.shards:
            size[s.rank] = s.shard_sizes[0]
        bounds = [0]
        for r in range(world_size):
            bounds.append(bounds[-1] + size[r])
        table.shards = [
            ShardMetadata([bounds[s.rank], 0], [s.shard_sizes[0], cols], s.placement)
            for s in sorted(table.shards, key=lambda s: s.rank)
        ]
        return bounds

    def create_input_dist(self) -> InputDist[DistContext]:
        world = self.env.world_size
        rows = [self.tables[s.table].config.num_embeddings for s in self.rw_slots]
        bounds = [self.bounds[s.table] for s in self.rw_slots]
        default = all(b == row_wise_block_bounds(r, world) for b, r in zip(bounds, rows))
        mean = [self.pooled and self.tables[s.table].pooling == PoolingType.MEAN for s in self.rw_slots]
        return RwSparseFeaturesDist(
            self.env.pg, world, [s.feature_index for s in self.rw_slots], rows, None if default else bounds, mean,
            self.is_weighted, not self.pooled,
        )  # fmt: skip

    def create_lookup(self) -> GroupedLookup:
        mine = self.slots_by_rank[self.env.rank]
        # MEAN factors come with the ids: the input dist computes them before a bag is split.
        return grouped_lookup(self, mine, self.width, self.grad_scale, lookup_mean=False)

    def create_output_dist(self) -> KJTOutputDist:
        if self.pooled:
            return RwPooledEmbeddingDist(self.env.pg, self.codecs("pooled_embeddings_reduce_scatter"))
        return RwSequenceEmbeddingDist(self.env.pg, self.codecs("sequence_embeddings_all_to_all"))

    def output_layout(self) -> list[tuple[str, int, int]]:
        return [(s.feature, 0, s.cols) for s in self.rw_slots]

    def feature_rows(self, rows: torch.Tensor, ctx: DistContext) -> dict[str, torch.Tensor]:
        return rows_by_feature(rows, ctx, self.rw_slots)
