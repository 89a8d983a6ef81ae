"""torchrec's ``torchrec.distributed.embedding_types`` path: the kernel and sharding enums, the
sharder base of the embedding collections and the grouping vocabulary, re-exported.

``BaseEmbeddingSharder`` is lightrec's :class:`~lightrec.distributed.sharding.collection_sharder.CollectionSharder`
(the base of ``EmbeddingBagCollectionSharder`` / ``EmbeddingCollectionSharder``).
``ShardedEmbeddingTable`` is lightrec's :class:`~lightrec.distributed.sharding.common.ShardedTable`
(a table, its plan entry and all its shards; torchrec's holds one shard's local sizes and metadata).
``GroupedEmbeddingConfig`` and ``KJTList`` live in ``sharding/embedding_groups.py``.
"""

from lightrec.distributed.planner.plan import EmbeddingComputeKernel, ShardingType
from lightrec.distributed.sharding.collection_sharder import CollectionSharder as BaseEmbeddingSharder
from lightrec.distributed.sharding.common import ShardedTable
from lightrec.distributed.sharding.embedding_groups import GroupedEmbeddingConfig, KJTList

ShardedEmbeddingTable = ShardedTable

__all__ = [
    "BaseEmbeddingSharder",
    "EmbeddingComputeKernel",
    "GroupedEmbeddingConfig",
    "KJTList",
    "ShardedEmbeddingTable",
    "ShardingType",
]
