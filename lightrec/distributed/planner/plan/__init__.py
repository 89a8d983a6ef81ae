"""The plan model: what a sharding plan is, and how to write one by hand. Pure data, no planner.

==================  ==========================================================================
``plan_types.py``   ``ShardingPlan`` / ``EmbeddingModuleShardingPlan`` / ``ParameterSharding`` /
                    ``ShardMetadata`` / ``EnumerableShardingSpec`` (JSON round-trip, atomic
                    ``save``), ``ShardingType``, ``EmbeddingComputeKernel``, the shard-size rules
``cache_params.py`` the tiered kernels' ``CacheParams`` / ``KeyValueParams`` / ``CacheAlgorithm`` /
                    ``CacheStatistics``
``sharder.py``      ``ModuleSharder``: what plans and the planner read about a sharder
``builders.py``     hand-written plans: ``construct_module_sharding_plan`` with ``table_wise`` /
                    ``row_wise`` / ..., ``balanced_table_wise_plan``, ``shardable_modules``
==================  ==========================================================================

The sharding code, the checkpoints and ``DistributedModelParallel`` read plans from here; the
planner (``lightrec.distributed.planner``, one folder up) builds them. Nothing in this folder
imports the planner. Until this folder existed ``lightrec.distributed.planner.plan`` was one
module, and checkpoints written then name its types by that path (``checkpoint/safe_load.py``
still accepts them).

Importing this package registers the plan types with ``torch.serialization.add_safe_globals``, so a
plan -- or a checkpoint holding one -- loads with ``torch.load(..., weights_only=True)``.
"""

import torch

from lightrec.distributed.planner.plan.builders import (
    ParameterShardingGenerator,
    balanced_table_wise_plan,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    shardable_modules,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from lightrec.distributed.planner.plan.cache_params import (
    CacheAlgorithm,
    CacheParams,
    CacheStatistics,
    KeyValueParams,
)
from lightrec.distributed.planner.plan.option_enums import BoundsCheckMode, PipelineType, StorageUsageType
from lightrec.distributed.planner.plan.plan_types import (
    TIERED_KERNELS,
    UNIMPLEMENTED_SHARDING_TYPES,
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    column_wise_shard_sizes,
    enum_value,
    placement_for,
    row_wise_shard_sizes,
)
from lightrec.distributed.planner.plan.shard_layouts import calculate_shard_sizes_and_offsets, placement
from lightrec.distributed.planner.plan.sharder import ModuleSharder

__all__ = [
    "BoundsCheckMode",
    "CacheAlgorithm",
    "CacheParams",
    "CacheStatistics",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "KeyValueParams",
    "ModuleSharder",
    "ParameterSharding",
    "ParameterShardingGenerator",
    "PipelineType",
    "SAFE_PLAN_TYPES",
    "ShardMetadata",
    "ShardingPlan",
    "ShardingType",
    "StorageUsageType",
    "TIERED_KERNELS",
    "UNIMPLEMENTED_SHARDING_TYPES",
    "balanced_table_wise_plan",
    "calculate_shard_sizes_and_offsets",
    "column_wise",
    "column_wise_shard_sizes",
    "construct_module_sharding_plan",
    "data_parallel",
    "enum_value",
    "placement",
    "placement_for",
    "row_wise",
    "row_wise_shard_sizes",
    "shardable_modules",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]

#: The plan types a plan or a checkpoint holds; none carries code of its own (registered as safe
#: globals here; ``checkpoint/safe_load.py`` also registers them under their former module path).
SAFE_PLAN_TYPES: list[type] = [
    ShardMetadata, ParameterSharding, ShardingPlan, EmbeddingModuleShardingPlan, ShardingType, EmbeddingComputeKernel,
    EnumerableShardingSpec, CacheParams, KeyValueParams, CacheAlgorithm,
]  # fmt: skip
torch.serialization.add_safe_globals(list(SAFE_PLAN_TYPES))
