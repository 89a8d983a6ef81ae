"""torchrec's ``torchrec.distributed.quant_embedding`` path for the managed-collision sharder.

``QuantManagedCollisionEmbeddingCollectionSharder(e_sharder, mc_sharder)`` shards a quantized
managed-collision ``EmbeddingCollection`` for serving: its tables table-wise over the local
devices of ``env`` (``ShardingEnv.from_local(world_size, 0)``, as the TorchRec tutorial passes),
its frozen id maps whole on the first device (``lightrec.quant.sharded_managed_collision``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    ModuleSharder,
    ParameterSharding,
    ShardingType,
    StorageUsageType,
)
from lightrec.quant.managed_collision import QuantManagedCollisionEmbeddingCollection
from lightrec.quant.sharded_embedding_bag import inference_devices
from lightrec.quant.sharded_managed_collision import (
    ShardedQuantManagedCollisionEmbeddingCollection,
    shard_managed_collection_for_inference,
)

__all__ = ["QuantManagedCollisionEmbeddingCollectionSharder"]


class QuantManagedCollisionEmbeddingCollectionSharder(ModuleSharder):
    """Inference sharder of ``QuantManagedCollisionEmbeddingCollection`` (see the module docstring).

    Args:
        e_sharder / mc_sharder: torchrec's arguments (the quantized-collection and managed-collision
            sharders); accepted and kept, the layout is decided here.
    """

    storage_usage_type = StorageUsageType.BASE_QUANT

    def __init__(self, e_sharder: object = None, mc_sharder: object = None) -> None:
        super().__init__()
        self._e_sharder = e_sharder
        self._mc_sharder = mc_sharder

    @property
    def module_type(self) -> type[nn.Module]:
        return QuantManagedCollisionEmbeddingCollection

    def sharding_types(self, compute_device_type: str) -> list[str]:
        super().sharding_types(compute_device_type)
        return [ShardingType.TABLE_WISE.value]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        super().compute_kernels(sharding_type, compute_device_type)
        return [EmbeddingComputeKernel.QUANT.value]

    def shard(
        self,
        module: nn.Module,
        params: Mapping[str, ParameterSharding] | None = None,
        env: ShardingEnv | None = None,
        device: torch.device | str | None = None,
        module_fqn: str | None = None,
    ) -> ShardedQuantManagedCollisionEmbeddingCollection:
        """Spread ``module``'s tables over ``env.world_size`` devices (``cuda:0..n-1`` when ``device``
        is CUDA, else ``n`` groups on ``device``); ``params`` is accepted for torchrec's signature."""
        if not isinstance(module, QuantManagedCollisionEmbeddingCollection):
            raise TypeError(f"{type(self).__name__} shards QuantManagedCollisionEmbeddingCollection, got "
                            f"{type(module).__name__}" + (f" at {module_fqn!r}" if module_fqn else ""))  # fmt: skip
        world_size = env.world_size if env is not None else 1
        return shard_managed_collection_for_inference(module, inference_devices(world_size, device))
