"""One module per sharding type; each builds an input dist, a local lookup and an output dist.
What the sharded collections share sits beside them (``collection.py``, ``common.py``,
``lookups.py``, ``work_ahead.py``, ``embedding_groups.py``, ``mean_pooling.py``; ``state_dict.py``: their state dicts and ``ShardedTableState``).

``SHARDING_CLASSES`` maps a ``ShardingType`` value to its :class:`EmbeddingSharding` class.
"""

from lightrec.distributed.planner.plan import ShardingType
from lightrec.distributed.sharding.column_wise import CwEmbeddingSharding
from lightrec.distributed.sharding.common import (
    EmbeddingSharding,
    ShardedTable,
    ShardSlot,
    init_shard_,
)
from lightrec.distributed.sharding.data_parallel import DpEmbeddingSharding
from lightrec.distributed.sharding.lookups import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup
from lightrec.distributed.sharding.row_wise import RwEmbeddingSharding
from lightrec.distributed.sharding.table_column_wise import TwcwEmbeddingSharding
from lightrec.distributed.sharding.table_row_wise import TwrwEmbeddingSharding
from lightrec.distributed.sharding.table_wise import TwEmbeddingSharding

SHARDING_CLASSES: dict[str, type[EmbeddingSharding]] = {
    ShardingType.DATA_PARALLEL.value: DpEmbeddingSharding,
    ShardingType.TABLE_WISE.value: TwEmbeddingSharding,
    ShardingType.ROW_WISE.value: RwEmbeddingSharding,
    ShardingType.COLUMN_WISE.value: CwEmbeddingSharding,
    ShardingType.TABLE_ROW_WISE.value: TwrwEmbeddingSharding,
    ShardingType.TABLE_COLUMN_WISE.value: TwcwEmbeddingSharding,
}

__all__ = [
    "SHARDING_CLASSES",
    "CwEmbeddingSharding",
    "DpEmbeddingSharding",
    "EmbeddingSharding",
    "GroupedEmbeddingsLookup",
    "GroupedPooledEmbeddingsLookup",
    "RwEmbeddingSharding",
    "ShardSlot",
    "ShardedTable",
    "TwEmbeddingSharding",
    "TwcwEmbeddingSharding",
    "TwrwEmbeddingSharding",
    "init_shard_",
]
