"""Table-column-wise sharding: column shards placed on the ranks of one host.

The planner uses it to keep a wide table's traffic inside a host. Functionally it is column-wise
sharding whose shard ranks happen to share a host, so it runs the column-wise (= table-wise)
machinery; on one host it *is* column-wise sharding.
"""

from __future__ import annotations

from lightrec.distributed.sharding.column_wise import (
    CwEmbeddingSharding,
    CwPooledEmbeddingDist,
    CwSequenceEmbeddingDist,
    CwSparseFeaturesDist,
)

__all__ = [
    "TwcwEmbeddingSharding",
    "TwcwPooledEmbeddingDist",
    "TwcwSequenceEmbeddingDist",
    "TwcwSparseFeaturesDist",
]


class TwcwSparseFeaturesDist(CwSparseFeaturesDist):
    """Input dist of table-column-wise sharding."""


class TwcwPooledEmbeddingDist(CwPooledEmbeddingDist):
    """Output dist of table-column-wise pooled embeddings."""


class TwcwSequenceEmbeddingDist(CwSequenceEmbeddingDist):
    """Output dist of table-column-wise sequence embeddings."""


class TwcwEmbeddingSharding(CwEmbeddingSharding):
    """Column shards on the ranks of one host (validated like column-wise)."""

    name = "table_column_wise"
    input_dist_cls = TwcwSparseFeaturesDist
    pooled_dist_cls = TwcwPooledEmbeddingDist
    sequence_dist_cls = TwcwSequenceEmbeddingDist
