"""Write a plan by hand, or ask for a simple one.

Each per-table helper returns a *generator*: ``gen(config, local_size, world_size, device_type) ->
ParameterSharding``. :func:`construct_module_sharding_plan` applies one generator per table::

    plan = construct_module_sharding_plan(
        ebc,
        {"product_table": table_wise(rank=1), "user_table": row_wise()},
        world_size=2,
    )

Shard shapes follow :mod:`lightrec.distributed.planner.plan` (row blocks of ``ceil(rows / n)``,
4-aligned column splits). ``config`` may also be a 2-D tensor (only its shape is read).
:func:`balanced_table_wise_plan` plans a whole model table-wise without the planner's cost model;
:func:`shardable_modules` finds what a set of sharders would shard in a model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.planner.plan.plan_types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    column_wise_shard_sizes,
    placement_for,
    row_wise_shard_sizes,
)
from lightrec.distributed.planner.plan.sharder import ModuleSharder, table_configs, tables_of
from lightrec.modules.embedding_configs import BaseEmbeddingConfig

__all__ = [
    "ParameterShardingGenerator",
    "balanced_table_wise_plan",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "row_wise",
    "shardable_modules",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]

ParameterShardingGenerator = Callable[[BaseEmbeddingConfig | torch.Tensor, int, int, str], ParameterSharding]
_FUSED = EmbeddingComputeKernel.FUSED.value


def _shape(table: BaseEmbeddingConfig | torch.Tensor) -> tuple[int, int]:
    if isinstance(table, torch.Tensor):
        if table.dim() != 2:
            raise ValueError(f"a table tensor must be 2-D [rows, cols], got shape {tuple(table.shape)}")
        return int(table.shape[0]), int(table.shape[1])
    return table.num_embeddings, table.embedding_dim


def _check_rank(rank: int, world_size: int, arg: str) -> None:
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{arg} must be a rank in [0, {world_size}), got {rank!r}")


def _rows_split(sizes: list[int], cols: int, devices: list[str]) -> list[ShardMetadata]:
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [ShardMetadata([o, 0], [s, cols], d) for o, s, d in zip(offsets, sizes, devices, strict=False)]


def _cols_split(sizes: list[int], rows: int, devices: list[str]) -> list[ShardMetadata]:
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [ShardMetadata([0, o], [rows, s], d) for o, s, d in zip(offsets, sizes, devices, strict=False)]


def table_wise(rank: int, device: str | None = None, compute_kernel: str = _FUSED) -> ParameterShardingGenerator:
    """The whole table on ``rank``.

    Args:
        rank: the owning rank.
        device: device type of the shard (``"cpu"``, ``"cuda"``); default: the plan's device type.
        compute_kernel: an ``EmbeddingComputeKernel`` value.
    """

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        _check_rank(rank, world_size, "table_wise(rank=...)")
        rows, cols = _shape(table)
        spec = [ShardMetadata([0, 0], [rows, cols], placement_for(rank, device or device_type, local_size))]
        return ParameterSharding(ShardingType.TABLE_WISE, compute_kernel, [rank], spec)

    return gen


def row_wise(
    sizes_placement: tuple[list[int], str | list[str]] | None = None, compute_kernel: str = _FUSED
) -> ParameterShardingGenerator:
    """Rows split over all ranks (blocks of ``ceil(rows / world_size)``).

    Args:
        sizes_placement: ``(rows per shard, device type or one per shard)`` to choose the split
            yourself: shard ``i`` goes to rank ``i``; the sizes must add up to the table's rows.
    """

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        rows, cols = _shape(table)
        if sizes_placement is None:
            sizes, devices = row_wise_shard_sizes(rows, world_size), [device_type] * world_size
        else:
            sizes, dev = list(sizes_placement[0]), sizes_placement[1]
            devices = [dev] * len(sizes) if isinstance(dev, str) else list(dev)
            if sum(sizes) != rows or any(s < 0 for s in sizes) or len(sizes) > world_size:
                raise ValueError(
                    f"row_wise(sizes_placement=...) sizes {sizes} must be >= 0, add up to the table's {rows} rows "
                    f"and have at most world_size={world_size} entries"
                )
            if len(devices) != len(sizes):
                raise ValueError(
                    f"row_wise(sizes_placement=...) gives {len(devices)} devices for {len(sizes)} shards"
                )
        ranks = list(range(len(sizes)))
        placements = [placement_for(r, d, local_size) for r, d in zip(ranks, devices, strict=False)]
        return ParameterSharding(
            ShardingType.ROW_WISE, compute_kernel, ranks, _rows_split(sizes, cols, placements)
        )

    return gen


def column_wise(
    ranks: list[int] | None = None,
    size_per_rank: list[int] | None = None,
    compute_kernel: str = _FUSED,
    device_types: list[str] | None = None,
) -> ParameterShardingGenerator:
    """Columns split into shards, as torchrec's ``column_wise``.

    Args:
        ranks: shard ``i`` on ``ranks[i]`` (a rank may repeat); columns split evenly (4-aligned).
        size_per_rank: instead of ``ranks``: shard ``i`` holds ``size_per_rank[i]`` columns and
            lives on rank ``i``; the sizes must add up to the table's columns.
        compute_kernel: an ``EmbeddingComputeKernel`` value.
        device_types: device type of each shard (default: the plan's device type for all).
    """
    if (ranks is None) == (size_per_rank is None):
        raise ValueError(
            f"column_wise needs exactly one of ranks=... or size_per_rank=..., got ranks={ranks!r}, "
            f"size_per_rank={size_per_rank!r}"
        )

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        rows, cols = _shape(table)
        if size_per_rank is not None:
            sizes, shard_ranks = list(size_per_rank), list(range(len(size_per_rank)))
            if sum(sizes) != cols or any(s <= 0 for s in sizes):
                raise ValueError(
                    f"column_wise(size_per_rank={sizes}) must be positive and add up to the table's {cols} columns"
                )
        else:
            assert ranks is not None  # checked above
            if not ranks:
                raise ValueError("column_wise(ranks=...) needs at least one rank")
            shard_ranks, sizes = list(ranks), column_wise_shard_sizes(cols, len(ranks))
        for r in shard_ranks:
            _check_rank(r, world_size, "column_wise shard rank")
        devices = list(device_types) if device_types is not None else [device_type] * len(shard_ranks)
        if len(devices) != len(shard_ranks):
            raise ValueError(f"column_wise(device_types=...) gives {len(devices)} devices for {len(shard_ranks)} shards")
        placements = [placement_for(r, d, local_size) for r, d in zip(shard_ranks, devices, strict=True)]
        return ParameterSharding(ShardingType.COLUMN_WISE, compute_kernel, shard_ranks, _cols_split(sizes, rows, placements))

    return gen


def _host_ranks(host_index: int, local_size: int, world_size: int, arg: str) -> list[int]:
    hosts = world_size // local_size
    if not isinstance(host_index, int) or not 0 <= host_index < hosts:
        raise ValueError(
            f"{arg}(host_index=...) must be in [0, {hosts}) for {hosts} host(s), got {host_index!r}"
        )
    return list(range(host_index * local_size, (host_index + 1) * local_size))


def table_row_wise(host_index: int, compute_kernel: str = _FUSED) -> ParameterShardingGenerator:
    """Rows split over the ``local_size`` ranks of host ``host_index``."""

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        ranks = _host_ranks(host_index, local_size, world_size, "table_row_wise")
        rows, cols = _shape(table)
        sizes = row_wise_shard_sizes(rows, len(ranks))
        placements = [placement_for(r, device_type, local_size) for r in ranks]
        return ParameterSharding(
            ShardingType.TABLE_ROW_WISE, compute_kernel, ranks, _rows_split(sizes, cols, placements)
        )

    return gen


def table_column_wise(host_index: int, compute_kernel: str = _FUSED) -> ParameterShardingGenerator:
    """Columns split over the ranks of host ``host_index`` (fewer shards if the table is narrow)."""

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        rows, cols = _shape(table)
        ranks = _host_ranks(host_index, local_size, world_size, "table_column_wise")[
            : max(1, min(local_size, cols))
        ]
        sizes = column_wise_shard_sizes(cols, len(ranks))
        spec = _cols_split(sizes, rows, [placement_for(r, device_type, local_size) for r in ranks])
        return ParameterSharding(ShardingType.TABLE_COLUMN_WISE, compute_kernel, ranks, spec)

    return gen


def data_parallel(compute_kernel: str = EmbeddingComputeKernel.DENSE.value) -> ParameterShardingGenerator:
    """A full replica on every rank (gradients all-reduced like dense parameters)."""

    def gen(table, local_size: int, world_size: int, device_type: str) -> ParameterSharding:  # noqa: ANN001
        _shape(table)
        return ParameterSharding(ShardingType.DATA_PARALLEL, compute_kernel, list(range(world_size)), None)

    return gen


def _module_tables(module: nn.Module, sharder: ModuleSharder | None) -> dict[str, BaseEmbeddingConfig]:
    if sharder is not None:
        return sharder.shardable_parameters(module)
    configs = tables_of(module)
    if configs is not None:
        return {cfg.name: cfg for cfg in configs}
    raise TypeError(
        f"construct_module_sharding_plan: {type(module).__name__} has no embedding_bag_configs() or "
        "embedding_configs(); pass an embedding collection (or a sharder that knows the module)"
    )


def construct_module_sharding_plan(
    module: nn.Module,
    per_param_sharding: dict[str, ParameterShardingGenerator],
    sharder: ModuleSharder | None = None,
    local_size: int | None = None,
    world_size: int | None = None,
    device_type: str = "cpu",
) -> EmbeddingModuleShardingPlan:
    """Plan of one collection from one generator per table (tables not named stay unsharded).

    Args:
        module: the embedding collection.
        per_param_sharding: ``{table name: table_wise(rank=0) | row_wise() | ...}``.
        sharder: reads the tables through ``sharder.shardable_parameters`` when given.
        local_size: ranks per host (default: ``world_size``).
        world_size: default: the process group's size, or 1.
        device_type: ``"cpu"`` or ``"cuda"`` (placements ``rank:r/cpu`` or ``rank:r/cuda:<local>``).
    """
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_initialized() else 1
    local_size = local_size or world_size
    if world_size % local_size:
        raise ValueError(f"local_size={local_size} must divide world_size={world_size}")
    if device_type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"device_type must be 'cpu', 'cuda' or 'meta', got {device_type!r}")
    tables = _module_tables(module, sharder)
    unknown = sorted(set(per_param_sharding) - set(tables))
    if unknown:
        raise KeyError(
            f"per_param_sharding names tables not in the module: {unknown}; its tables are {sorted(tables)}"
        )
    return EmbeddingModuleShardingPlan(
        {
            name: gen(tables[name], local_size, world_size, device_type)
            for name, gen in per_param_sharding.items()
        }
    )


def shardable_modules(module: nn.Module, sharders: list[ModuleSharder]) -> dict[str, tuple[nn.Module, ModuleSharder]]:
    """``{module path: (module, its sharder)}`` of the outermost modules of ``module`` that one of
    ``sharders`` shards (by exact type), in ``named_modules`` order."""
    out: dict[str, tuple[nn.Module, ModuleSharder]] = {}
    for path, m in module.named_modules():
        if any(path.startswith(p + ".") or p == "" for p in out) and path:
            continue  # inside a module that will be sharded
        sharder = next((s for s in sharders if type(m) is s.module_type), None)
        if sharder is not None:
            out[path] = (m, sharder)
    return out


def balanced_table_wise_plan(
    module: nn.Module, sharders: list[ModuleSharder], world_size: int, device_type: str = "cpu"
) -> ShardingPlan:
    """Table-wise plan: each collection's tables, in order, cut into ``world_size`` contiguous runs
    of about equal size (rows x dim). Contiguous runs keep the output columns in feature order."""
    plan = ShardingPlan()
    for path, (m, sharder) in shardable_modules(module, sharders).items():
        configs = list(table_configs(sharder, m).values())
        sizes = [c.num_embeddings * c.embedding_dim for c in configs]
        total, before = float(sum(sizes)), 0.0
        module_plan = EmbeddingModuleShardingPlan()
        for c, size in zip(configs, sizes):
            rank = min(world_size - 1, int((before + size / 2) * world_size / total))
            before += size
            placement = placement_for(rank, device_type, world_size)
            module_plan[c.name] = ParameterSharding(
                ShardingType.TABLE_WISE, EmbeddingComputeKernel.FUSED, [rank],
                [ShardMetadata([0, 0], [c.num_embeddings, c.embedding_dim], placement)],
            )  # fmt: skip
        plan.plan[path] = module_plan
    return plan
