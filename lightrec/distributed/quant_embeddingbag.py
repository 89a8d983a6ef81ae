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

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightrec.distributed.types import EmbeddingComputeKernel, ModuleSharder, ShardingEnv, ShardingType
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.sharded_embedding_bag import ShardedQuantEmbeddingBagCollection, shard_for_inference

__all__ = ["QuantEmbeddingBagCollectionSharder", "ShardedQuantEmbeddingBagCollection", "inference_devices"]


def inference_devices(world_size: int, device: torch.device | str | None) -> list[torch.device]:
    """``world_size`` serving devices: ``cuda:0 .. cuda:n-1`` for a CUDA ``device``, else ``device`` n times."""
    base = torch.device(device) if device is not None else torch.device("cpu")
    if base.type == "cuda":
        return [torch.device("cuda", i) for i in range(world_size)]
    return [base] * world_size


class QuantEmbeddingBagCollectionSharder(ModuleSharder):
    """Inference sharder of ``QuantEmbeddingBagCollection`` (table-wise, quantized kernel).

    Args:
        fused_params: accepted for torchrec's signature (quantized tables have no optimizer).
        shardable_params: accepted for torchrec's signature; every table is sharded.
    """

    def __init__(self, fused_params: dict[str, Any] | None = None, shardable_params: list[str] | None = None) -> None:
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
        params: Mapping[str, Any],
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
