"""torchrec's ``torchrec.distributed.mc_embeddingbag`` path: the sharded
``ManagedCollisionEmbeddingBagCollection`` and its sharder.

A re-export only; the code lives in :mod:`lightrec.distributed.mc_embedding_modules`, beside its
sequence twin (see ``docs/managed-collisions.md``).
"""

from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
)

__all__ = ["ManagedCollisionEmbeddingBagCollectionSharder", "ShardedManagedCollisionEmbeddingBagCollection"]
