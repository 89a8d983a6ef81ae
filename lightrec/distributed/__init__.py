"""Model-parallel embeddings: plans, collectives, sharded collections, DistributedModelParallel.

torchrec users switch by changing imports: ``torchrec.distributed.X`` -> ``lightrec.distributed.X``
for the names below (``EmbeddingBagCollectionSharder``, ``ShardingEnv``, ``ShardingType``,
``DistributedModelParallel``, ``LazyAwaitable`` ...). The planner lives in
``lightrec.distributed.planner`` (its main names are re-exported here); sharders, plan and report
for a model come from ``lightrec.distributed.planning``.
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
from lightrec.distributed.mc_embedding import (
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingCollection,
)
from lightrec.distributed.mc_embeddingbag import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
)
from lightrec.distributed.mc_modules import (
    InferManagedCollisionCollectionSharder,
    ManagedCollisionCollectionSharder,
    ShardedManagedCollisionCollection,
)
from lightrec.distributed.model_parallel import DistributedModelParallel, balanced_table_wise_plan
from lightrec.distributed.planner import (
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
from lightrec.distributed.planning import get_default_sharders
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
    "EmbeddingShardingPlanner",
    "InferManagedCollisionCollectionSharder",
    "KJTAllToAll",
    "LazyAwaitable",
    "LazyNoWait",
    "ManagedCollisionCollectionSharder",
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ModuleSharder",
    "NoWait",
    "ParameterConstraints",
    "ParameterSharding",
    "PooledEmbeddingsAllGather",
    "PooledEmbeddingsAllToAll",
    "PooledEmbeddingsReduceScatter",
    "SequenceEmbeddingsAllToAll",
    "ShardMetadata",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedManagedCollisionCollection",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
    "ShardedTableState",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
    "Topology",
    "balanced_table_wise_plan",
    "bucketize_kjt_row_wise",
    "column_wise",
    "column_wise_shard_sizes",
    "construct_module_sharding_plan",
    "data_parallel",
    "gather_full_state_dict",
    "get_default_sharders",
    "row_wise",
    "row_wise_shard_sizes",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]
