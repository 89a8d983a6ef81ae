"""torchrec's ``torchrec.distributed.types`` path: plan types, the sharder interface, the sharding
environment and the awaitables, re-exported.

Nothing is defined here. The plan types and their JSON form live in
:mod:`lightrec.distributed.planner.plan`, ``ModuleSharder`` in :mod:`lightrec.distributed.planner.sharder`,
``ShardingEnv`` in :mod:`lightrec.distributed.sharding_env` and the awaitables in
:mod:`lightrec.distributed.comm.awaitable`; lightrec's own files import them from there.
"""

from lightrec.distributed.comm.awaitable import Awaitable, LazyAwaitable, LazyGetItemMixin, LazyNoWait, NoWait
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.planner.plan import (
    CacheAlgorithm,
    CacheParams,
    CacheStatistics,
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    KeyValueParams,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    column_wise_shard_sizes,
    placement_for,
    row_wise_shard_sizes,
)
from lightrec.distributed.planner.sharder import ModuleSharder
from lightrec.distributed.sharding_env import ShardingEnv, as_env, resolve_group

__all__ = [
    "Awaitable",
    "CacheAlgorithm",
    "CacheParams",
    "CacheStatistics",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "KeyValueParams",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "ModuleSharder",
    "NoWait",
    "ParameterSharding",
    "QuantizedCommCodecs",
    "ShardMetadata",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
    "as_env",
    "column_wise_shard_sizes",
    "placement_for",
    "resolve_group",
    "row_wise_shard_sizes",
]
