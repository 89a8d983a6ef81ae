"""torchrec's ``ShardingOption`` s to plans and back: :func:`to_sharding_plan` turns partitioned
options into a ``ShardingPlan``; :func:`extract_plan` lays a stored plan's shards over freshly
enumerated options.

lightrec's own planner builds its plans from its option arrays (``planners.py``); these are the
functions torchrec's planner parts and extensions call on ``ShardingOption`` s directly, e.g. a
custom proposer/partitioner pipeline that ends with ``to_sharding_plan(best, topology)``, or a
plan loader that matches stored options to enumerated ones by ``ShardingOption.storage_hash()``.
``planners.py`` re-exports both (torchrec's path).
"""

from __future__ import annotations

import copy
import dataclasses

from lightrec.distributed.planner.plan import (
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    placement,
)
from lightrec.distributed.planner.types import PlannerError, ShardingOption, Topology

__all__ = ["extract_plan", "to_sharding_plan"]


def to_sharding_plan(sharding_options: list[ShardingOption], topology: Topology) -> ShardingPlan:
    """The plan of partitioned options: one ``ParameterSharding`` per option, its shards placed on
    their ranks (``rank:<r>/<device>``; data-parallel options have no spec and every rank).

    Raises:
        ValueError: a shard has no rank (the options were not partitioned).
    """
    device, local = str(topology.compute_device), int(topology.local_world_size or topology.world_size)
    plan = ShardingPlan()
    for option in sharding_options:
        unplaced = [i for i, shard in enumerate(option.shards) if shard.rank is None]
        if unplaced:
            raise ValueError(
                f"shards {unplaced} of {option.fqn!r} have no rank; partition the options before to_sharding_plan"
            )
        ranks = [int(shard.rank) for shard in option.shards if shard.rank is not None]
        data_parallel = option.sharding_type == ShardingType.DATA_PARALLEL.value
        spec = None if data_parallel else [
            ShardMetadata(list(shard.offset), list(shard.size), placement(device, rank, local))
            for shard, rank in zip(option.shards, ranks)
        ]  # fmt: skip
        cache = None if option.cache_params is None else dataclasses.replace(option.cache_params, stats=None)
        module_plan = plan.plan.setdefault(option.path, EmbeddingModuleShardingPlan())
        module_plan[option.name] = ParameterSharding(
            sharding_type=option.sharding_type,
            compute_kernel=option.compute_kernel,
            ranks=list(range(topology.world_size)) if data_parallel else ranks,
            sharding_spec=spec,
            cache_params=cache,
        )
    return plan


def extract_plan(
    search_space: list[ShardingOption], loaded_sharding_options: dict[int, ShardingOption]
) -> list[ShardingOption]:
    """The options of ``search_space`` that a stored plan chose, with the stored plan's shards.

    Args:
        search_space: freshly enumerated options.
        loaded_sharding_options: the stored plan's options by ``storage_hash()``.

    Raises:
        PlannerError: two options of the search space share a hash, or the stored plan has
            options the search space lacks (the model or topology changed since it was stored).
    """
    seen: set[int] = set()
    chosen: list[ShardingOption] = []
    for option in search_space:
        key = option.storage_hash()
        if key in seen:
            raise PlannerError(
                f"two options of the search space share storage hash {key} ({option.fqn!r}, "
                f"{option.sharding_type}/{option.compute_kernel}); the search space lists an option twice",
                [option.name], 0.0, 0.0,
            )  # fmt: skip
        seen.add(key)
        loaded = loaded_sharding_options.get(key)
        if loaded is not None:
            fresh = copy.copy(option)
            fresh.shards = copy.deepcopy(loaded.shards)
            chosen.append(fresh)
    if len(chosen) != len(loaded_sharding_options):
        missing = sorted({o.fqn for o in loaded_sharding_options.values()} - {o.fqn for o in chosen})
        raise PlannerError(
            f"the stored plan has {len(loaded_sharding_options)} options but only {len(chosen)} are in the "
            f"search space (not found: {missing}); the model, constraints or topology changed: plan again",
            missing, 0.0, 0.0,
        )  # fmt: skip
    return chosen
