"""Sharded ``EmbeddingBagCollection`` and its sharder (torchrec's names and call shapes).

::

    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                          "learning_rate": 0.02})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).collective_plan(
        ebc, [sharder], pg)
    sharded = sharder.shard(ebc, plan.plan[""], ShardingEnv.from_process_group(pg), torch.device("cpu"))
    kt = sharded(kjt).wait()          # KeyedTensor [B_local, sum D], keys = ebc.feature_names()

The forward returns an :class:`EmbeddingBagCollectionAwaitable` (a ``LazyAwaitable``): the output
all-to-alls / reduce-scatters are in flight until it is waited -- or used, since a lazy awaitable
resolves itself on first use.
"""

from __future__ import annotations

import torch

from lightrec.distributed.comm import Awaitable, LazyAwaitable
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.mean_pooling import _apply_mean_pooling, _create_mean_pooling_divisor
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = [
    "_apply_mean_pooling",
    "_create_mean_pooling_divisor",
    "EmbeddingBagCollectionAwaitable",
    "EmbeddingBagCollectionSharder",
    "ShardedEmbeddingBagCollection",
]


class EmbeddingBagCollectionAwaitable(LazyAwaitable[KeyedTensor]):
    """Pending pooled embeddings of this rank's samples; ``wait()`` gives the ``KeyedTensor``.

    Args:
        awaitables: one per sharding type, each ``[B_local, width of that type]``.
        column_index: ``[sum D]`` columns of the concatenated results in feature order, or None
            when they already are in feature order.
        keys, length_per_key: the output ``KeyedTensor``'s keys and widths.
    """

    def __init__(
        self,
        awaitables: list[Awaitable[torch.Tensor]],
        column_index: torch.Tensor | None,
        keys: list[str],
        length_per_key: list[int],
    ) -> None:
        super().__init__()
        self._awaitables = awaitables
        self._column_index = column_index
        self._keys = keys
        self._length_per_key = length_per_key

    def _wait_impl(self) -> KeyedTensor:
        parts = [a.wait() for a in self._awaitables]
        values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if self._column_index is not None:
            values = values.index_select(1, self._column_index)
        return KeyedTensor(keys=self._keys, length_per_key=self._length_per_key, values=values, key_dim=1)


class ShardedEmbeddingBagCollection(ShardedCollectionBase[LazyAwaitable[KeyedTensor]]):
    """An ``EmbeddingBagCollection`` whose tables are spread over ranks by a plan.

    Same input and output as the unsharded module (a KJT of this rank's samples in, a
    ``KeyedTensor`` ``[B_local, sum D]`` out, as a lazy awaitable); every sharding type of
    ``lightrec.distributed.types.ShardingType`` may appear, mixed. Tables are updated inside
    backward by ``fused_optimizer``. Build it with :class:`EmbeddingBagCollectionSharder`
    (constructor arguments: :class:`~lightrec.distributed.sharding.collection.ShardedCollectionBase`).
    """

    _attr = "embedding_bags"
    _pooled = True

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        # All are: these are the unsharded collection's configs (the filter tells the type checker).
        return [c for c in self._configs if isinstance(c, EmbeddingBagConfig)]

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> LazyAwaitable[KeyedTensor]:
        """Start the lookups of this rank's samples ``features`` (stride ``B_local``).

        A variable-batch KJT (``stride_per_key_per_rank`` + ``inverse_indices``) is expanded to its
        full batch first (``KeyedJaggedTensor.to_fixed_batch``), so every sharding type takes it and
        the result equals the unsharded collection's; torchrec's VBE saving of all-to-all volume is
        not reproduced (the expanded bags travel).

        Returns:
            awaitable of ``KeyedTensor(keys=feature_names(), values=[B_local, sum D])``.
        """
        return super().forward(features)

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return features.to_fixed_batch() if features.variable_stride_per_key() else features

    def _assemble(
        self, started: StartedInputDist, results: list[Awaitable[torch.Tensor]]
    ) -> LazyAwaitable[KeyedTensor]:
        return EmbeddingBagCollectionAwaitable(
            results, self._column_index, self._feature_order, self._length_per_key
        )


class EmbeddingBagCollectionSharder(CollectionSharder):
    """Builds :class:`ShardedEmbeddingBagCollection` s (arguments: :class:`CollectionSharder`)."""

    _module_class = EmbeddingBagCollection
    _sharded_class = ShardedEmbeddingBagCollection
