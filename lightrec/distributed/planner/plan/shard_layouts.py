"""torchrec's shard-layout rules: the ``[rows, cols]`` size and ``[row, col]`` offset of every
shard of a table for a sharding type, and the placement string of a shard.

These are the rules of torchrec's ``torchrec.distributed.sharding_plan`` (its private
``_calculate_*_shard_sizes_and_offsets`` helpers, which extensions and tests import), written
for lightrec. Row blocks follow the rule lightrec's sharders use too
(:func:`~lightrec.distributed.planner.plan.plan_types.row_wise_shard_sizes`: blocks of
``ceil(rows / n)``, the last ones short or empty)::

    rows 10, 4 devices   sizes [[3, D], [3, D], [3, D], [1, D]]   offsets [[0, 0], [3, 0], [6, 0], [9, 0]]

Column blocks differ from lightrec's own column-wise helper (which deals ``n`` shards in units of
4): torchrec cuts blocks of a fixed width -- the first multiple of 4 at or above
``col_wise_shard_dim`` (default :data:`MIN_CW_DIM`, 128) that divides the table's width, or the
whole width -- however many blocks that makes::

    cols 256, rows R   sizes [[R, 128], [R, 128]]               offsets [[0, 0], [0, 128]]

Grid layouts (``grid_shard``) are the column blocks, each split row-wise over one host's ranks;
lightrec computes them for plans written elsewhere but does not shard by them.
"""

from __future__ import annotations

import warnings

import torch

from lightrec.distributed.planner.plan.plan_types import ShardingType, enum_value, row_wise_shard_sizes

__all__ = [
    "MIN_CW_DIM",
    "calculate_shard_sizes_and_offsets",
    "placement",
]

#: torchrec's narrowest column block.
MIN_CW_DIM = 128

Layout = tuple[list[list[int]], list[list[int]]]


def placement(compute_device: str, rank: int, local_size: int) -> str:
    """``"rank:<rank>/<device>"``; CUDA and MTIA ranks use local device ``rank % local_size``."""
    if local_size <= 0:
        raise ValueError(f"local_size must be positive, got {local_size}")
    if compute_device in ("cuda", "mtia"):
        return f"rank:{rank}/{compute_device}:{rank % local_size}"
    return f"rank:{rank}/{compute_device}"


def _calculate_rw_shard_sizes_and_offsets(hash_size: int, num_devices: int, columns: int) -> Layout:
    """Row blocks of ``ceil(hash_size / num_devices)`` rows (``hash_size=5, num_devices=4``: rows
    ``[2, 2, 1, 0]``), each spanning all ``columns``."""
    rows = row_wise_shard_sizes(hash_size, num_devices)
    offsets = [sum(rows[:i]) for i in range(num_devices)]
    return [[r, columns] for r in rows], [[o, 0] for o in offsets]


def _calculate_uneven_rw_shard_sizes_and_offsets(
    hash_size: int, num_devices: int, columns: int, device_memory_sizes: list[int]
) -> Layout:
    """Row blocks proportional to each device's memory (the last device takes the remainder)."""
    if len(device_memory_sizes) != num_devices:
        raise ValueError(
            f"device_memory_sizes must give one size per device ({num_devices}), got {len(device_memory_sizes)}"
        )
    total = sum(device_memory_sizes)
    if total <= 0:
        raise ValueError(f"device_memory_sizes must add up to a positive size, got {device_memory_sizes}")
    rows = [int(hash_size * (size / total)) for size in device_memory_sizes[:-1]]
    rows.append(hash_size - sum(rows))
    offsets = [sum(rows[:i]) for i in range(num_devices)]
    return [[r, columns] for r in rows], [[o, 0] for o in offsets]


def _find_base_dim(lower_bound: int, dim: int) -> int:
    """The first multiple of 4 in ``[lower_bound, dim)`` that divides ``dim``, else ``dim``."""
    for width in range(lower_bound, dim):
        if dim % width == 0 and width % 4 == 0:
            return width
    return dim


def _get_block_size_for_cw_shard(columns: int, column_wise_shard_dim: int | None) -> int:
    """Width of torchrec's column blocks (a warning, and the whole width, when it does not divide)."""
    block = min(_find_base_dim(column_wise_shard_dim or MIN_CW_DIM, columns), columns)
    if columns % block != 0:
        warnings.warn(
            f"a width of {columns} columns cannot be cut into blocks of {column_wise_shard_dim}; "
            f"using one block of {columns} columns",
            UserWarning,
            stacklevel=3,
        )
        block = columns
    return block


def _calculate_cw_shard_sizes_and_offsets(columns: int, rows: int, col_wise_shard_dim: int | None = None) -> Layout:
    """Column blocks of one fixed width (see the module docstring), each spanning all ``rows``."""
    block = _get_block_size_for_cw_shard(columns, col_wise_shard_dim)
    count = columns // block
    return [[rows, block] for _ in range(count)], [[0, block * i] for i in range(count)]


def _calculate_grid_shard_sizes_and_offsets(
    hash_size: int, num_device: int, columns: int, col_wise_shard_dim: int | None = None
) -> Layout:
    """Every column block split into ``num_device`` row blocks, column block by column block."""
    row_sizes, row_offsets = _calculate_rw_shard_sizes_and_offsets(hash_size, num_device, columns)
    block = _get_block_size_for_cw_shard(columns, col_wise_shard_dim)
    sizes, offsets = [], []
    for col in range(columns // block):
        for size, offset in zip(row_sizes, row_offsets):
            sizes.append([size[0], block])
            offsets.append([offset[0], block * col])
    return sizes, offsets


def calculate_shard_sizes_and_offsets(
    tensor: torch.Tensor,
    world_size: int,
    local_world_size: int,
    sharding_type: str,
    col_wise_shard_dim: int | None = None,
    device_memory_sizes: list[int] | None = None,
) -> Layout:
    """``(shard sizes, shard offsets)`` of a ``[rows, cols]`` table for ``sharding_type``.

    Data parallel: one whole copy per rank; table-wise: the whole table once; row-wise: blocks over
    ``world_size`` ranks (proportional to ``device_memory_sizes`` when given); table-row-wise: over
    ``local_world_size`` ranks; (table-)column-wise: column blocks; grid: column blocks of row blocks.

    Raises:
        ValueError: ``sharding_type`` is not a ``ShardingType`` value.
    """
    rows, columns = tensor.shape
    kind = enum_value(sharding_type, ShardingType, "sharding_type")
    if kind == ShardingType.DATA_PARALLEL.value:
        return [[rows, columns] for _ in range(world_size)], [[0, 0] for _ in range(world_size)]
    if kind == ShardingType.TABLE_WISE.value:
        return [[rows, columns]], [[0, 0]]
    if kind == ShardingType.ROW_WISE.value:
        if device_memory_sizes:
            return _calculate_uneven_rw_shard_sizes_and_offsets(rows, world_size, columns, device_memory_sizes)
        return _calculate_rw_shard_sizes_and_offsets(rows, world_size, columns)
    if kind == ShardingType.TABLE_ROW_WISE.value:
        return _calculate_rw_shard_sizes_and_offsets(rows, local_world_size, columns)
    if kind in (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value):
        return _calculate_cw_shard_sizes_and_offsets(columns, rows, col_wise_shard_dim)
    return _calculate_grid_shard_sizes_and_offsets(rows, local_world_size, columns, col_wise_shard_dim)
