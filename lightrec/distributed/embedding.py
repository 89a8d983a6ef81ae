"""Sharded ``EmbeddingCollection`` (sequence / unpooled embeddings) and its sharder.

Every id gets its own row back, in the order of the input KJT's values:
``sharded_ec(kjt).wait()`` is ``{feature: JaggedTensor(values [N_f, D], lengths [B_local])}``,
equal to the unsharded module's output. Row-wise sharding restores the id order with the
bucketization's unbucketize permutation; column-wise sharding concatenates each row's column
pieces. Rows of one sharding type travel in one all-to-all, zero-padded to its widest shard.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from lightrec.distributed.comm import Awaitable, LazyAwaitable
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.common import KJTEmbeddingSharding
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_configs import EmbeddingConfig
from lightrec.modules.embedding_modules import EmbeddingCollection
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionSharder",
    "FeatureRowsAwaitable",
    "ShardedEmbeddingCollection",
]

W = TypeVar("W")


class FeatureRowsAwaitable(LazyAwaitable[W]):
    """Base of the awaitables whose value is rows per id of one forward's input, by feature.

    Args:
        started: the forward's input dist; its ``bounded`` KJT gives each feature's lengths (what the
            lookup saw: under ``bounds_check="skip"`` dropped ids shorten the bags) and ``positions``
            where each collection feature sits in it.
        feature_order: the collection's features, the output order.
    """

    def __init__(self, started: StartedInputDist, feature_order: list[str]) -> None:
        super().__init__()
        self._features: KeyedJaggedTensor | None = started.bounded
        self._positions = started.positions
        self._feature_order = feature_order

    def _jagged(self, rows: dict[str, torch.Tensor]) -> dict[str, JaggedTensor]:
        """``{feature: JaggedTensor(values=rows[feature] [N_f, ...], lengths [B])}`` in output order;
        releases the input (an awaitable resolves once)."""
        features = self._features
        if features is None:
            raise RuntimeError(f"internal error: a {type(self).__name__} resolved twice")
        batch = features.stride()
        lengths = features.lengths().view(-1, batch) if batch > 0 else None
        out = {}
        for i, f in enumerate(self._feature_order):
            k = i if self._positions is None else self._positions[i]
            f_lengths = lengths[k] if lengths is not None else features.lengths()[:0]
            out[f] = JaggedTensor(values=rows[f], lengths=f_lengths)
        self._features = None
        return out


class EmbeddingCollectionAwaitable(FeatureRowsAwaitable[dict[str, JaggedTensor]]):
    """Pending rows of this rank's ids; ``wait()`` gives ``{feature: JaggedTensor}``.

    Args:
        shardings: the collection's shardings, one per type.
        started / feature_order: see :class:`FeatureRowsAwaitable` (``started.contexts``: one per sharding).
        awaitables: each sharding's pending output rows.
    """

    def __init__(
        self,
        shardings: list[KJTEmbeddingSharding],
        started: StartedInputDist,
        awaitables: list[Awaitable[torch.Tensor]],
        feature_order: list[str],
    ) -> None:
        super().__init__(started, feature_order)
        self._parts = list(zip(shardings, started.contexts, awaitables))

    def _wait_impl(self) -> dict[str, JaggedTensor]:
        rows: dict[str, torch.Tensor] = {}
        for sharding, ctx, awaitable in self._parts:
            rows.update(sharding.feature_rows(awaitable.wait(), ctx))
        self._parts = []  # release the inputs once resolved
        return self._jagged(rows)


class ShardedEmbeddingCollection(ShardedCollectionBase[EmbeddingCollectionAwaitable]):
    """An ``EmbeddingCollection`` whose tables are spread over ranks by a plan (any sharding type).

    Same contract as the unsharded module, returned as a lazy awaitable; ``state_dict`` keys
    are ``embeddings.<table>.weight``. Build it with :class:`EmbeddingCollectionSharder`
    (constructor arguments: :class:`~lightrec.distributed.sharding.collection.ShardedCollectionBase`).
    """

    _attr = "embeddings"
    _pooled = False

    def embedding_configs(self) -> list[EmbeddingConfig]:
        # All are: these are the unsharded collection's configs (the filter tells the type checker).
        return [c for c in self._configs if isinstance(c, EmbeddingConfig)]

    def forward(self, features: KeyedJaggedTensor) -> EmbeddingCollectionAwaitable:
        """Start the lookups of this rank's ids; returns an awaitable of ``{feature: JaggedTensor}``.

        Raises:
            ValueError: for a variable-batch KJT (only the pooled sharded collection takes them).
        """
        return super().forward(features)

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if features.variable_stride_per_key():
            raise ValueError(
                "ShardedEmbeddingCollection takes fixed-batch KeyedJaggedTensors; got a variable-batch one "
                f"(stride_per_key_per_rank={features.stride_per_key_per_rank()}). Expand it with "
                "features.to_fixed_batch() or use an unsharded EmbeddingCollection"
            )
        return features

    def _assemble(
        self, started: StartedInputDist, results: list[Awaitable[torch.Tensor]]
    ) -> EmbeddingCollectionAwaitable:
        return EmbeddingCollectionAwaitable(self._shardings, started, results, self._feature_order)


class EmbeddingCollectionSharder(CollectionSharder):
    """Builds :class:`ShardedEmbeddingCollection` s (arguments: :class:`CollectionSharder`)."""

    _module_class = EmbeddingCollection
    _sharded_class = ShardedEmbeddingCollection
