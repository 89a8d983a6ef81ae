"""torchrec's ``torchrec.distributed.mc_embedding`` path: the sharded
``ManagedCollisionEmbeddingCollection`` and its sharder.

A re-export only; the code lives in :mod:`lightrec.distributed.mc_embedding_modules`, beside its
pooled twin (see ``docs/managed-collisions.md``).
"""

from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingCollection,
)

__all__ = ["ManagedCollisionEmbeddingCollectionSharder", "ShardedManagedCollisionEmbeddingCollection"]
