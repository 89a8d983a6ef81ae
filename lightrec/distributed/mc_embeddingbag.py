"""torchrec's ``torchrec.distributed.mc_embeddingbag`` path: a re-export of the pooled
(``EmbeddingBagCollection``) sharder and sharded module of :mod:`lightrec.distributed.mc_embedding_modules`,
where their sequence twins live too (docs/managed-collisions.md)."""

from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
)

__all__ = ["ManagedCollisionEmbeddingBagCollectionSharder", "ShardedManagedCollisionEmbeddingBagCollection"]
