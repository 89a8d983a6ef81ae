"""Column-wise sharding: a table's columns split into shards placed on (possibly repeated) ranks.

A column shard ``[rows, cols_i]`` is looked up exactly like a table-wise table on its rank; the
feature's ids are sent once per shard. The pooled outputs of the shards are laid side by side in
column order, so ``output[:, table block]`` equals the unsharded lookup (SUM and MEAN alike: each
shard pools whole bags). Sequence outputs concatenate the shards' row pieces in column order.

Every mechanism -- input dist, lookup, output dist -- is the table-wise one (``table_wise.py``);
this file only validates the shards.
"""

from __future__ import annotations

from lightrec.distributed.sharding.common import ShardedTable, check_blocks
from lightrec.distributed.sharding.table_wise import TwEmbeddingSharding

__all__ = ["CwEmbeddingSharding"]


class CwEmbeddingSharding(TwEmbeddingSharding):
    """Column-wise sharding: every shard spans all rows and a contiguous range of columns."""

    name = "column_wise"

    def check_table(self, table: ShardedTable) -> None:
        rows = table.config.num_embeddings
        bad = [s.shard_offsets for s in table.shards if s.shard_offsets[0] != 0 or s.shard_sizes[0] != rows]
        if not table.shards or bad:
            raise ValueError(
                f"{self.name} table {table.name!r}: every shard must span all {rows} rows (row offset 0); "
                f"shards at {bad} do not. Use row_wise to split rows"
            )
        check_blocks(table, self.name)
