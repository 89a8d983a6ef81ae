"""torchrec's ``torchrec.distributed.mc_embedding`` path: a re-export of the sequence (``EmbeddingCollection``) pair
of :mod:`lightrec.distributed.mc_embedding_modules` (docs/managed-collisions.md)."""

from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingCollection,
)

__all__ = ["ManagedCollisionEmbeddingCollectionSharder", "ShardedManagedCollisionEmbeddingCollection"]
