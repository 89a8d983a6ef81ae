"""torchrec's ``torchrec.distributed.sharding_plan`` path: hand-written plans, the default
sharders and torchrec's shard-layout helpers, re-exported.

Nothing is defined here: the generators live in :mod:`lightrec.distributed.planner.plan`
(``builders.py``), the shard-layout rules and ``placement`` in its ``shard_layouts.py`` (the
private ``_calculate_*_shard_sizes_and_offsets`` helpers torchrec's extensions import included;
torchrec has no table-wise twin: a table-wise table is one ``[rows, cols]`` shard at ``[0, 0]``,
``calculate_shard_sizes_and_offsets(..., "table_wise")``), and the default sharders with
``apply_to_all`` in :mod:`lightrec.distributed.dmp.default_sharders`.
"""

from lightrec.distributed.dmp.default_sharders import (
    apply_to_all,
    get_default_sharders,
    get_module_to_default_sharders,
)
from lightrec.distributed.planner.plan import builders
from lightrec.distributed.planner.plan.builders import *  # noqa: F403 - the generators, listed in builders.__all__
from lightrec.distributed.planner.plan.shard_layouts import (
    MIN_CW_DIM,
    _calculate_cw_shard_sizes_and_offsets,
    _calculate_grid_shard_sizes_and_offsets,
    _calculate_rw_shard_sizes_and_offsets,
    _calculate_uneven_rw_shard_sizes_and_offsets,
    _find_base_dim,
    _get_block_size_for_cw_shard,
    calculate_shard_sizes_and_offsets,
    placement,
)

__all__ = [
    "MIN_CW_DIM",
    "_calculate_cw_shard_sizes_and_offsets",
    "_calculate_grid_shard_sizes_and_offsets",
    "_calculate_rw_shard_sizes_and_offsets",
    "_calculate_uneven_rw_shard_sizes_and_offsets",
    "_find_base_dim",
    "_get_block_size_for_cw_shard",
    "apply_to_all",
    "calculate_shard_sizes_and_offsets",
    "get_default_sharders",
    "get_module_to_default_sharders",
    "placement",
]
__all__ += builders.__all__
