"""Sharding plans, in one home: what a plan is (``plan/``), the planner that builds one, its report.

=========================  ====================================================================
``plan/``                  the plan model, pure data: ``ShardingPlan`` ... ``ShardMetadata`` and
                           their JSON, ``ShardingType``, ``EmbeddingComputeKernel``, the shard-size
                           rules, the tiered kernels' ``CacheParams`` / ``KeyValueParams``,
                           ``ModuleSharder`` (what plans and the planner read of a sharder) and
                           hand-written plans (``construct_module_sharding_plan`` with
                           ``table_wise`` / ``row_wise`` / ..., ``balanced_table_wise_plan``)
``planning.py``            ``plan_sharding``, ``topology_for``, ``plan_report_for``: what every
                           entry point calls
``planners.py``            ``EmbeddingShardingPlanner``: tables + cluster -> plan + report
``types.py``               ``Topology``, ``ParameterConstraints``, ``PlannerError``; torchrec's
                           ``ShardingOption`` and the interfaces custom parts implement
``constants.py``           the planner's numbers (device defaults, optimizer state, cache sizes)
``tables.py``              a model's tables read into arrays
``enumerators.py``         every option of every table (``EmbeddingEnumerator``)
``options.py``             the option arrays, and torchrec's ``ShardingOption`` s over them
``shard_estimators.py``    the cost model: storage, cost and cache hit rate of every shard
                           (``ZipfCacheStatistics``), torchrec's ``EmbeddingPerfEstimator`` /
                           ``EmbeddingStorageEstimator``
``proposers.py``           one option per table (greedy, memory DP; torchrec's proposers)
``partitioners.py``        shards onto ranks, then refinement (``GreedyPerfPartitioner``,
                           ``MemoryBalancedPartitioner``)
``search.py``              the search through custom parts; ``NoopPerfModel``
``storage_reservations.py`` memory kept for everything but the tables
``errors.py``              the errors that say what to change (fast memory, host memory, SSD)
``report.py``              ``PlannerReport`` (text, markdown) and ``plan_chart``
``perf_models.py``         torchrec's path, a re-export
=========================  ====================================================================

torchrec's paths re-export from here: ``lightrec.distributed.types`` (the plan types and
``ModuleSharder``) and ``lightrec.distributed.sharding_plan`` (the per-table helpers). See
docs/planner.md for the cost model and the algorithm. ``PlanReport`` is the former name of
:class:`PlannerReport` (an alias).
"""

from lightrec.distributed.planner import plan
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.partitioners import GreedyPerfPartitioner, MemoryBalancedPartitioner, SortBy
from lightrec.distributed.planner.plan import *  # noqa: F403 - the plan model's names, listed in plan.__all__
from lightrec.distributed.planner.planners import EmbeddingShardingPlanner
from lightrec.distributed.planner.planning import PlanningResult, plan_report_for, plan_sharding, topology_for
from lightrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from lightrec.distributed.planner.report import PlannerReport, PlanReport, TableReport
from lightrec.distributed.planner.search import NoopPerfModel
from lightrec.distributed.planner.shard_estimators import (
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
    ZipfCacheStatistics,
)
from lightrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    InferenceStorageReservation,
)
from lightrec.distributed.planner.types import ParameterConstraints, PlannerError, ShardingOption, Topology

__all__ = [
    "EmbeddingEnumerator",
    "EmbeddingPerfEstimator",
    "EmbeddingShardingPlanner",
    "EmbeddingStorageEstimator",
    "FixedPercentageStorageReservation",
    "GreedyPerfPartitioner",
    "GreedyProposer",
    "GridSearchProposer",
    "HeuristicalStorageReservation",
    "InferenceStorageReservation",
    "MemoryBalancedPartitioner",
    "NoopPerfModel",
    "ParameterConstraints",
    "PlanReport",
    "PlannerError",
    "PlannerReport",
    "PlanningResult",
    "ShardingOption",
    "SortBy",
    "TableReport",
    "Topology",
    "UniformProposer",
    "ZipfCacheStatistics",
    "plan_report_for",
    "plan_sharding",
    "topology_for",
]
__all__ += plan.__all__
