"""torchrec's ``torchrec.distributed.sharding_plan`` path: hand-written plans and the default
sharders, re-exported.

Nothing is defined here: the generators live in :mod:`lightrec.distributed.planner.plan_builders`
and the default sharders in :mod:`lightrec.distributed.sharders`.
"""

from lightrec.distributed.planner.plan_builders import (
    ParameterShardingGenerator,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from lightrec.distributed.sharders import get_default_sharders

__all__ = [
    "ParameterShardingGenerator",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "row_wise",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]
