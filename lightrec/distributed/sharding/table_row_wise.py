"""Table-row-wise sharding: a table's rows split over the ranks of one host.

torchrec runs it as an intra-host row-wise lookup followed by a cross-host exchange; lightrec
runs the row-wise machinery (``row_wise.py``: its input dist, lookup and output dist) with blocks
only on the host's ranks: the other ranks own empty blocks, receive no ids for the table and add
zeros in the reduce-scatter. The result is identical; on one host (every CPU test) it is exactly
row-wise sharding over the local ranks.
"""

from __future__ import annotations

from lightrec.distributed.sharding.row_wise import RwEmbeddingSharding

__all__ = ["TwrwEmbeddingSharding"]


class TwrwEmbeddingSharding(RwEmbeddingSharding):
    """Row blocks on the ranks of one host."""

    name = "table_row_wise"
