"""torchrec's ``torchrec.distributed.quant_embeddingbag``: shard a quantized ``EmbeddingBagCollection``
for serving.

Serving has no training process group: one process looks every table up, its tables spread over
``env.world_size`` local devices (GPUs ``cuda:0 ..``, or groups on the CPU) -- lightrec's
:func:`~lightrec.quant.sharded_embedding_bag.shard_for_inference`. The plan's table-wise ranks
choose each table's device; the result is a ``ShardedQuantEmbeddingBagCollection`` whose outputs
equal the unsharded quantized collection's. Only table-wise plans apply (a quantized table is
looked up whole on one device), as in torchrec's inference sharding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    ModuleSharder,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    StorageUsageType,
)
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.sharded_embedding_bag import (
    ShardedQuantEmbeddingBagCollection,
    inference_devices,
    shard_for_inference,
    shard_modules,
)

__all__ = [
    "QuantEmbeddingBagCollectionSharder",
    "ShardedQuantEmbeddingBagCollection",
    "inference_devices",
    "shard_quantized_modules",
]


class QuantEmbeddingBagCollectionSharder(ModuleSharder):
    """Inference sharder of ``QuantEmbeddingBagCollection`` (table-wise, quantized kernel).

    Args:
        fused_params: accepted for torchrec's signature (quantized tables have no optimizer).
        shardable_params: accepted for torchrec's signature; every table is sharded.
    """

    storage_usage_type = StorageUsageType.BASE_QUANT

    def __init__(self, fused_params: dict[str, object] | None = None, shardable_params: list[str] | None = None) -> None:
        super().__init__(None)

    @property
    def module_type(self) -> type[nn.Module]:
        return QuantEmbeddingBagCollection

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [ShardingType.TABLE_WISE.value]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [EmbeddingComputeKernel.QUANT.value]

    def shard(
        self,
        module: nn.Module,
        params: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | str | None = None,
        module_fqn: str | None = None,
    ) -> ShardedQuantEmbeddingBagCollection:
        """Spread ``module``'s tables over ``env.world_size`` devices by the plan's table-wise ranks."""
        if not isinstance(module, QuantEmbeddingBagCollection):
            raise TypeError(f"QuantEmbeddingBagCollectionSharder shards QuantEmbeddingBagCollection, got {type(module).__name__}")
        assignment = {}
        for table, ps in params.items():
            if ps.sharding_type != ShardingType.TABLE_WISE.value or not ps.ranks:
                raise ValueError(
                    f"table {table!r} is planned {ps.sharding_type}; inference sharding of quantized tables is "
                    "table-wise: plan it with lightrec.distributed.sharding_plan.table_wise(rank)"
                )
            assignment[table] = int(ps.ranks[0])
        devices = inference_devices(env.world_size, device)
        sharded = shard_for_inference(module, devices=devices, assignment=assignment)
        assert isinstance(sharded, ShardedQuantEmbeddingBagCollection)  # a collection in, a sharded one out
        return sharded


def shard_quantized_modules(
    module: nn.Module,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    plan: ShardingPlan | None = None,
    sharders: Sequence[ModuleSharder] | None = None,
    init_params: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Shard ``module``'s quantized collections over ``env.world_size`` serving devices, in place.

    Args:
        module: a quantized model (``quantize_embeddings`` / ``lightrec.inference.quantize`` output).
        env: how many devices (``ShardingEnv.from_local(world_size, 0)``; default one).
        device: ``cuda`` (tables on ``cuda:0 ..``) or ``cpu``.
        plan: table-wise placement per collection path (default: tables spread by size).
        sharders: accepted for torchrec's signature; only ``QuantEmbeddingBagCollectionSharder`` s
            (or None) are meaningful here.
        init_params: accepted for torchrec's signature (quantized tables are already materialised).

    Raises:
        TypeError: a sharder of another kind was given (training sharding is ``DistributedModelParallel``).
    """
    for sharder in sharders or ():
        if not isinstance(sharder, QuantEmbeddingBagCollectionSharder):
            raise TypeError(
                f"_shard_modules shards quantized models for inference and takes QuantEmbeddingBagCollectionSharder, "
                f"got {type(sharder).__name__}; shard a training model with DistributedModelParallel"
            )
    if plan is None:
        return shard_modules(module, device=device, env=env)
    world = env.world_size if env is not None else 1
    sharder = QuantEmbeddingBagCollectionSharder()
    for path, sub in list(module.named_modules()):
        module_plan = plan.get_plan_for_module(path)
        if module_plan is None or not isinstance(sub, QuantEmbeddingBagCollection):
            continue
        sharded = sharder.shard(sub, module_plan, ShardingEnv.from_local(world, 0), device)
        if path == "":
            return sharded
        parent, _, name = path.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, name, sharded)
    return module
