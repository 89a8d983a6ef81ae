"""Table-column-wise sharding: column shards placed on the ranks of one host.

The planner uses it to keep a wide table's traffic inside a host. Functionally it is column-wise
sharding whose shard ranks happen to share a host, so it runs the column-wise (= table-wise)
machinery and validation; on one host it *is* column-wise sharding.
"""

from __future__ import annotations

from lightrec.distributed.sharding.column_wise import CwEmbeddingSharding

__all__ = ["TwcwEmbeddingSharding"]


class TwcwEmbeddingSharding(CwEmbeddingSharding):
    """Column shards on the ranks of one host (validated like column-wise)."""

    name = "table_column_wise"
