"""Table-row-wise sharding: a table's rows split over the ranks of one host.

torchrec runs it as an intra-host row-wise lookup followed by a cross-host exchange; lightrec
runs the row-wise machinery (``row_wise.py``) with blocks only on the host's ranks: the other
ranks own empty blocks, receive no ids for the table and add zeros in the reduce-scatter. The
result is identical; on one host (every CPU test) it is exactly row-wise sharding over the local
ranks.
"""

from __future__ import annotations

from lightrec.distributed.sharding.row_wise import (
    RwEmbeddingSharding,
    RwPooledEmbeddingDist,
    RwSequenceEmbeddingDist,
    RwSparseFeaturesDist,
)

__all__ = [
    "TwrwEmbeddingSharding",
    "TwrwPooledEmbeddingDist",
    "TwrwSequenceEmbeddingDist",
    "TwrwSparseFeaturesDist",
]


class TwrwSparseFeaturesDist(RwSparseFeaturesDist):
    """Input dist of table-row-wise sharding (bucketize over the host's row blocks)."""


class TwrwPooledEmbeddingDist(RwPooledEmbeddingDist):
    """Output dist of table-row-wise pooled embeddings (reduce-scatter)."""


class TwrwSequenceEmbeddingDist(RwSequenceEmbeddingDist):
    """Output dist of table-row-wise sequence embeddings."""


class TwrwEmbeddingSharding(RwEmbeddingSharding):
    """Row blocks on the ranks of one host."""

    name = "table_row_wise"
    input_dist_cls = TwrwSparseFeaturesDist
    pooled_dist_cls = TwrwPooledEmbeddingDist
    sequence_dist_cls = TwrwSequenceEmbeddingDist
