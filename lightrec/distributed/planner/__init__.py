"""Sharding plans, in one home: their types and JSON form, hand-written plans, the planner, its
report and the per-rank chart.

=====================  =======================================================================
``plan.py``            ``ShardingPlan`` / ``EmbeddingModuleShardingPlan`` / ``ParameterSharding`` /
                       ``ShardMetadata`` (JSON round-trip, atomic ``save``), ``ShardingType``,
                       ``EmbeddingComputeKernel``, the shard-size rules; ``cache_params.py``: the
                       tiered kernels' ``CacheParams`` / ``KeyValueParams`` / ``CacheAlgorithm``
``sharder.py``         ``ModuleSharder``: what the planner reads about a sharder
``plan_builders.py``   ``construct_module_sharding_plan`` with ``table_wise`` / ``row_wise`` / ...,
                       ``balanced_table_wise_plan``, ``shardable_modules``
``planners.py``        ``EmbeddingShardingPlanner`` (enumerators, estimators, proposers,
                       partitioners, tables: its parts); ``types.py``: ``Topology``,
                       ``ParameterConstraints``, ``PlannerError``
``planning.py``        ``plan_sharding``, ``topology_for``, ``plan_report_for``: what every entry
                       point calls
``report.py``          ``PlannerReport`` (text and markdown); ``chart.py``: ``plan_chart``
``cache_stats.py``     how tiered tables' caches are priced: ``ZipfCacheStatistics``, ``cache_model``
``errors.py``          the errors that say what to change (fast memory, host memory, SSD)
torchrec's classes     ``enumerators.py`` (``EmbeddingEnumerator``), ``shard_estimators.py``,
                       ``proposers.py``, ``partitioners.py`` (``GreedyPerfPartitioner``),
                       ``storage_reservations.py``, ``perf_models.py``, ``types.py``
                       (``ShardingOption`` and the interfaces), over ``options.py``,
                       ``sharding_options.py``, ``search.py``
=====================  =======================================================================

torchrec's paths re-export from here: ``lightrec.distributed.types`` (the plan types and
``ModuleSharder``) and ``lightrec.distributed.sharding_plan`` (the per-table helpers). See
docs/planner.md for the cost model and the algorithm. ``PlanReport`` is the former name of
:class:`PlannerReport` (an alias).
"""

from lightrec.distributed.planner.cache_stats import ZipfCacheStatistics
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.partitioners import GreedyPerfPartitioner, SortBy
from lightrec.distributed.planner.perf_models import NoopPerfModel
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
from lightrec.distributed.planner.plan_builders import (
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
from lightrec.distributed.planner.planners import EmbeddingShardingPlanner
from lightrec.distributed.planner.planning import PlanningResult, plan_report_for, plan_sharding, topology_for
from lightrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from lightrec.distributed.planner.report import PlannerReport, PlanReport, TableReport
from lightrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from lightrec.distributed.planner.sharder import ModuleSharder
from lightrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from lightrec.distributed.planner.types import ParameterConstraints, PlannerError, ShardingOption, Topology

__all__ = [
    "CacheAlgorithm",
    "CacheParams",
    "CacheStatistics",
    "EmbeddingComputeKernel",
    "EmbeddingEnumerator",
    "EmbeddingModuleShardingPlan",
    "EmbeddingPerfEstimator",
    "EmbeddingShardingPlanner",
    "EmbeddingStorageEstimator",
    "EnumerableShardingSpec",
    "KeyValueParams",
    "FixedPercentageStorageReservation",
    "GreedyPerfPartitioner",
    "GreedyProposer",
    "GridSearchProposer",
    "HeuristicalStorageReservation",
    "ModuleSharder",
    "NoopPerfModel",
    "ParameterConstraints",
    "ParameterSharding",
    "ParameterShardingGenerator",
    "PlanReport",
    "PlannerError",
    "PlannerReport",
    "PlanningResult",
    "ShardMetadata",
    "ShardingOption",
    "ShardingPlan",
    "ShardingType",
    "SortBy",
    "TableReport",
    "Topology",
    "ZipfCacheStatistics",
    "UniformProposer",
    "balanced_table_wise_plan",
    "column_wise",
    "column_wise_shard_sizes",
    "construct_module_sharding_plan",
    "data_parallel",
    "placement_for",
    "plan_report_for",
    "plan_sharding",
    "row_wise",
    "row_wise_shard_sizes",
    "shardable_modules",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
    "topology_for",
]
