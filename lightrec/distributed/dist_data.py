"""torchrec's ``torchrec.distributed.dist_data`` path: the awaitable collectives of the sharded
collections, re-exported from :mod:`lightrec.distributed.comm`."""

from lightrec.distributed.comm import (
    KJTAllToAll,
    PooledEmbeddingsAllGather,
    PooledEmbeddingsAllToAll,
    PooledEmbeddingsReduceScatter,
    SequenceEmbeddingsAllToAll,
)

__all__ = [
    "KJTAllToAll",
    "PooledEmbeddingsAllGather",
    "PooledEmbeddingsAllToAll",
    "PooledEmbeddingsReduceScatter",
    "SequenceEmbeddingsAllToAll",
]
