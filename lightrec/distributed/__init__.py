"""Model-parallel embeddings: plans, collectives, sharded collections, DistributedModelParallel.

torchrec users switch by changing imports: ``torchrec.distributed.X`` -> ``lightrec.distributed.X``
for the names below (``EmbeddingBagCollectionSharder``, ``ShardingEnv``, ``ShardingType``,
``DistributedModelParallel``, ``LazyAwaitable`` ...). The planner lives in
``lightrec.distributed.planner`` (re-exported here when importable).
"""

from lightrec.distributed.comm import (
    Awaitable,
    KJTAllToAll,
    LazyAwaitable,
    LazyNoWait,
    NoWait,
    PooledEmbeddingsAllGather,
    PooledEmbeddingsAllToAll,
    PooledEmbeddingsReduceScatter,
    SequenceEmbeddingsAllToAll,
    bucketize_kjt_row_wise,
)
from lightrec.distributed.embedding import (
    EmbeddingCollectionAwaitable,
    EmbeddingCollectionSharder,
    ShardedEmbeddingCollection,
)
from lightrec.distributed.embeddingbag import (
    EmbeddingBagCollectionAwaitable,
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from lightrec.distributed.model_parallel import (
    DistributedModelParallel,
    balanced_table_wise_plan,
    get_default_sharders,
)
from lightrec.distributed.state_dict import ShardedTableState, gather_full_state_dict
from lightrec.distributed.types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ParameterSharding,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    column_wise_shard_sizes,
    row_wise_shard_sizes,
)

__all__ = [
    "Awaitable",
    "DistributedModelParallel",
    "EmbeddingBagCollectionAwaitable",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionSharder",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "KJTAllToAll",
    "LazyAwaitable",
    "LazyNoWait",
    "ModuleSharder",
    "NoWait",
    "ParameterSharding",
    "PooledEmbeddingsAllGather",
    "PooledEmbeddingsAllToAll",
    "PooledEmbeddingsReduceScatter",
    "SequenceEmbeddingsAllToAll",
    "ShardMetadata",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedTableState",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
    "balanced_table_wise_plan",
    "bucketize_kjt_row_wise",
    "column_wise_shard_sizes",
    "gather_full_state_dict",
    "get_default_sharders",
    "row_wise_shard_sizes",
]

try:  # the planner is optional at import time (it needs numpy)
    from lightrec.distributed.planner import (  # noqa: F401
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_column_wise,
        table_row_wise,
        table_wise,
    )

    __all__ += [
        "EmbeddingShardingPlanner",
        "ParameterConstraints",
        "Topology",
        "column_wise",
        "construct_module_sharding_plan",
        "data_parallel",
        "row_wise",
        "table_column_wise",
        "table_row_wise",
        "table_wise",
    ]
except ImportError:  # pragma: no cover - exercised only without numpy
    pass
