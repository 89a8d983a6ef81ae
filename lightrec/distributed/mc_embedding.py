"""Sharded ``ManagedCollisionEmbeddingCollection`` and its sharder (torchrec's path and names).

``forward(kjt) -> (awaitable of {feature: JaggedTensor}, awaitable of the remapped KJT or None)``;
see ``mc_embedding_modules.py`` and ``docs/managed-collisions.md``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lightrec.distributed.embedding import EmbeddingCollectionAwaitable, ShardedEmbeddingCollection
from lightrec.distributed.mc_embedding_modules import (
    BaseManagedCollisionEmbeddingCollectionSharder,
    BaseShardedManagedCollisionEmbeddingCollection,
    RemappedFeaturesAwaitable,
)
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_modules import EmbeddingCollection
from lightrec.modules.managed_collision.embedding_collections import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionEmbeddingCollection,
)

__all__ = ["ManagedCollisionEmbeddingCollectionSharder", "ShardedManagedCollisionEmbeddingCollection"]


class ShardedManagedCollisionEmbeddingCollection(  # type: ignore[misc]  # forward: (embeddings, remapped ids), torchrec's contract
    BaseShardedManagedCollisionEmbeddingCollection, ShardedEmbeddingCollection
):
    """A ``ManagedCollisionEmbeddingCollection`` sharded row-wise or table-wise."""

    def _assemble(  # type: ignore[override]  # torchrec's contract: (embeddings, remapped ids)
        self, started: StartedInputDist, results: list[Any]
    ) -> tuple[EmbeddingCollectionAwaitable, RemappedFeaturesAwaitable | None]:
        embeddings, ids = self._split_results(results)
        rows = ShardedEmbeddingCollection._assemble(self, started, embeddings)
        return rows, self._remapped(started.contexts, ids, started.bounded, started.positions)

    def _unsharded_class(self) -> type[BaseManagedCollisionEmbeddingCollection]:
        return ManagedCollisionEmbeddingCollection

    def _unsharded_embeddings(self) -> nn.Module:
        return EmbeddingCollection(self.embedding_configs())


class ManagedCollisionEmbeddingCollectionSharder(BaseManagedCollisionEmbeddingCollectionSharder):
    """Builds :class:`ShardedManagedCollisionEmbeddingCollection` s.

    Args:
        ec_sharder: an ``EmbeddingCollectionSharder`` whose fused optimizer and kernel backend the
            tables use (torchrec's argument); or give ``fused_params`` / ``kernel_backend``.
        mc_sharder, qcomm_codecs_registry: torchrec's arguments.
    """

    _module_class = ManagedCollisionEmbeddingCollection
    _sharded_class = ShardedManagedCollisionEmbeddingCollection

    def __init__(self, ec_sharder: Any = None, mc_sharder: Any = None, qcomm_codecs_registry: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(ec_sharder, mc_sharder, qcomm_codecs_registry, **kwargs)
