"""Sharding planner: decide the sharding type, kernel and ranks of every embedding table.

See docs/planner.md for the cost model and the algorithm. ``PlanReport`` is the former name of
:class:`PlannerReport` (an alias). torchrec's planner classes live at torchrec's paths
(``enumerators``, ``shard_estimators``, ``proposers``, ``partitioners``, ``storage_reservations``,
``perf_models``, ``types``) and are re-exported here.
"""

from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.partitioners import GreedyPerfPartitioner, SortBy
from lightrec.distributed.planner.perf_models import NoopPerfModel
from lightrec.distributed.planner.planners import EmbeddingShardingPlanner
from lightrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from lightrec.distributed.planner.report import PlannerReport, PlanReport, TableReport
from lightrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from lightrec.distributed.planner.sharding_plan import (
    ParameterShardingGenerator,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from lightrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
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
    "NoopPerfModel",
    "ParameterConstraints",
    "ParameterShardingGenerator",
    "PlanReport",
    "PlannerReport",
    "PlannerError",
    "ShardingOption",
    "SortBy",
    "TableReport",
    "Topology",
    "UniformProposer",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "row_wise",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]
