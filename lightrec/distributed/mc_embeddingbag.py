"""Sharded ``ManagedCollisionEmbeddingBagCollection`` and its sharder (torchrec's path and names).

::

    mc_ebc = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(tables, device="meta"), mcc)
    model = DistributedModelParallel(model_with(mc_ebc))   # get_default_sharders() includes this sharder
    pooled, remapped = sharded_mc_ebc(kjt)                 # lazy awaitables; remapped is None unless
                                                           # return_remapped_features=True

See ``mc_embedding_modules.py`` for how raw ids travel and ``docs/managed-collisions.md``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lightrec.distributed.embeddingbag import EmbeddingBagCollectionAwaitable, ShardedEmbeddingBagCollection
from lightrec.distributed.mc_embedding_modules import (
    BaseManagedCollisionEmbeddingCollectionSharder,
    BaseShardedManagedCollisionEmbeddingCollection,
    RemappedFeaturesAwaitable,
)
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.modules.managed_collision.embedding_collections import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionEmbeddingBagCollection,
)

__all__ = ["ManagedCollisionEmbeddingBagCollectionSharder", "ShardedManagedCollisionEmbeddingBagCollection"]


class ShardedManagedCollisionEmbeddingBagCollection(  # type: ignore[misc]  # forward: (embeddings, remapped ids), torchrec's contract
    BaseShardedManagedCollisionEmbeddingCollection, ShardedEmbeddingBagCollection
):
    """A ``ManagedCollisionEmbeddingBagCollection`` sharded row-wise or table-wise.

    ``forward(kjt) -> (awaitable of KeyedTensor [B_local, sum D], awaitable of the remapped KJT or None)``.
    """

    def _assemble(  # type: ignore[override]  # torchrec's contract: (embeddings, remapped ids)
        self, started: StartedInputDist, results: list[Any]
    ) -> tuple[EmbeddingBagCollectionAwaitable, RemappedFeaturesAwaitable | None]:
        embeddings, ids = self._split_results(results)
        pooled = ShardedEmbeddingBagCollection._assemble(self, started, embeddings)
        return pooled, self._remapped(started.contexts, ids, started.bounded, started.positions)

    def _unsharded_class(self) -> type[BaseManagedCollisionEmbeddingCollection]:
        return ManagedCollisionEmbeddingBagCollection

    def _unsharded_embeddings(self) -> nn.Module:
        return EmbeddingBagCollection(self.embedding_bag_configs(), is_weighted=self._is_weighted)


class ManagedCollisionEmbeddingBagCollectionSharder(BaseManagedCollisionEmbeddingCollectionSharder):
    """Builds :class:`ShardedManagedCollisionEmbeddingBagCollection` s.

    Args:
        ebc_sharder: an ``EmbeddingBagCollectionSharder`` whose fused optimizer and kernel backend
            the tables use (torchrec's argument); or give ``fused_params`` / ``kernel_backend``.
        mc_sharder, qcomm_codecs_registry: torchrec's arguments (see the base class).
    """

    _module_class = ManagedCollisionEmbeddingBagCollection
    _sharded_class = ShardedManagedCollisionEmbeddingBagCollection

    def __init__(self, ebc_sharder: Any = None, mc_sharder: Any = None, qcomm_codecs_registry: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(ebc_sharder, mc_sharder, qcomm_codecs_registry, **kwargs)
