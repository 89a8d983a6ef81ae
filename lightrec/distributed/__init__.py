"""Model-parallel embeddings: plans, collectives, sharded collections, DistributedModelParallel.

torchrec users switch by changing imports: ``torchrec.distributed.X`` -> ``lightrec.distributed.X``
for the names below (``EmbeddingBagCollectionSharder``, ``ShardingEnv``, ``ShardingType``,
``DistributedModelParallel``, ``LazyAwaitable`` ...). Plans -- their types, hand-written plans, the
planner, its report and chart -- live in ``lightrec.distributed.planner`` (the main names are
re-exported here); the default sharders come from ``lightrec.distributed.dmp.default_sharders``.
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
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.dmp.default_sharders import get_default_sharders
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
from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingCollection,
)
from lightrec.distributed.mc_modules import (
    InferManagedCollisionCollectionSharder,
    ManagedCollisionCollectionSharder,
    ShardedManagedCollisionCollection,
)
from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.planner import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EmbeddingShardingPlanner,
    ModuleSharder,
    ParameterConstraints,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    Topology,
    balanced_table_wise_plan,
    column_wise,
    column_wise_shard_sizes,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    row_wise_shard_sizes,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from lightrec.distributed.sharding.state_dict import ShardedTableState, gather_full_state_dict
from lightrec.distributed.train_pipeline import (
    EvalPipelineSparseDist,
    TrainPipelineBase,
    TrainPipelineSparseDist,
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
    "EvalPipelineSparseDist",
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
    "TrainPipelineBase",
    "TrainPipelineSparseDist",
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
