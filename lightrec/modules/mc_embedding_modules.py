"""torchrec's ``torchrec.modules.mc_embedding_modules`` path: embedding collections behind
managed-collision tables.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision.embedding_collections`.
``DistributedModelParallel`` shards these modules (``lightrec.distributed.mc_embedding_modules``).
"""

from lightrec.modules.managed_collision import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)

__all__ = [
    "BaseManagedCollisionEmbeddingCollection",
    "ManagedCollisionCollection",
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
]
