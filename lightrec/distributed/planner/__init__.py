"""Sharding planner: decide the sharding type, kernel and ranks of every embedding table.

See docs/planner.md for the cost model and the algorithm. ``PlanReport`` is the former name of
:class:`PlannerReport` (an alias).
"""

from lightrec.distributed.planner.planners import EmbeddingShardingPlanner
from lightrec.distributed.planner.report import PlannerReport, PlanReport, TableReport
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
from lightrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology

__all__ = [
    "EmbeddingShardingPlanner",
    "ParameterConstraints",
    "ParameterShardingGenerator",
    "PlanReport",
    "PlannerReport",
    "PlannerError",
    "TableReport",
    "Topology",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "row_wise",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]
