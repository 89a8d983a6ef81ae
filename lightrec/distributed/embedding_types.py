"""torchrec's ``torchrec.distributed.embedding_types`` path: the kernel and sharding enums and the
sharder base of the embedding collections, re-exported.

``BaseEmbeddingSharder`` is lightrec's :class:`~lightrec.distributed.sharding.collection_sharder.CollectionSharder`
(the base of ``EmbeddingBagCollectionSharder`` / ``EmbeddingCollectionSharder``).
"""

from lightrec.distributed.planner.plan import EmbeddingComputeKernel, ShardingType
from lightrec.distributed.sharding.collection_sharder import CollectionSharder as BaseEmbeddingSharder

__all__ = ["BaseEmbeddingSharder", "EmbeddingComputeKernel", "ShardingType"]
