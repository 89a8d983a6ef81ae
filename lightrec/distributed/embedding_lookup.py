"""torchrec's ``torchrec.distributed.embedding_lookup`` path: the grouped lookups one rank runs
for the slots of one sharding type, re-exported.

lightrec's :class:`~lightrec.distributed.sharding.lookups.GroupedPooledEmbeddingsLookup` (pooled
``[B, sum of slot widths]``) and :class:`~lightrec.distributed.sharding.lookups.GroupedEmbeddingsLookup`
(a row per id) are built by the shardings (``EmbeddingSharding.create_lookup``) from lightrec's
``ShardSlot`` / ``ShardedTable``, not from torchrec's ``GroupedEmbeddingConfig`` lists.
"""

from lightrec.distributed.sharding.lookups import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup

__all__ = ["GroupedEmbeddingsLookup", "GroupedPooledEmbeddingsLookup"]
