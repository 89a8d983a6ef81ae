"""``CollectionSharder``: builds a sharded collection from an unsharded one and its module plan.

``EmbeddingBagCollectionSharder`` and ``EmbeddingCollectionSharder`` (``distributed/embeddingbag.py``,
``distributed/embedding.py``) are this class with their module types filled in;
``lightrec.distributed.dmp.default_sharders.get_default_sharders`` builds both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv, as_env
from lightrec.distributed.planner.plan import (
    ModuleSharder,
    ParameterSharding,
    StorageUsageType,
)
from lightrec.distributed.planner.plan.sharder import FusedParamsLike
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.tiering import tiering_params
from lightrec.kernels.kernel_registry import check_kernel_backend
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = ["CollectionSharder", "normalized_fused_params"]


def normalized_fused_params(
    fused_params: FusedParamsLike,
) -> dict[str, Any] | None:
    """Validate a sharder's ``fused_params`` (errors name the bad key) and return the full dict,
    with the optimizer spelled by its enum *name* (``"ROWWISE_ADAGRAD"``), the spelling every
    consumer (the fused spec, the planner's storage model) understands. The tiered tables' keys
    (``cache_load_factor``, ``cache_algorithm``, ``ssd_storage_directory``, ...) are kept."""
    spec = FusedOptimizerSpec.coerce(fused_params)
    if spec is None:
        return None
    params = spec.to_fused_params()
    params["optimizer"] = spec.optimizer.name
    params.update(tiering_params(fused_params if isinstance(fused_params, Mapping) else None))
    return params


class CollectionSharder(ModuleSharder):
    """Builds a sharded collection (``_sharded_class``) from an unsharded one (``_module_class``).

    Args:
        fused_params: the fused optimizer of tables not marked by ``apply_optimizer_in_backward``
            (torchrec-style dict, e.g. ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": 0.02, "eps": 0.002}``, or a ``FusedOptimizerSpec``); default SGD with
            learning rate 0.01, like torchrec.
        kernel_backend: lookup kernels of every shard: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"``.
        qcomm_codecs_registry: quantized communication of the output dists, by comm op
            (``lightrec.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry(QCommsConfig(...))``).
    """

    _module_class: type[nn.Module]
    _sharded_class: type[ShardedCollectionBase]
    storage_usage_type = StorageUsageType.BASE

    def __init__(
        self,
        fused_params: FusedParamsLike = None,
        kernel_backend: str = "auto",
        qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
    ) -> None:
        super().__init__(normalized_fused_params(fused_params))
        check_kernel_backend(kernel_backend)
        self.kernel_backend = kernel_backend
        self._qcomm_codecs_registry = dict(qcomm_codecs_registry) if qcomm_codecs_registry else None

    @property
    def qcomm_codecs_registry(self) -> dict[str, QuantizedCommCodecs] | None:
        return self._qcomm_codecs_registry

    @property
    def module_type(self) -> type[nn.Module]:
        return self._module_class

    def shard(
        self,
        module: nn.Module,
        params: Mapping[str, ParameterSharding],
        env: ShardingEnv | dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        module_fqn: str | None = None,
        seed: int = 0,
    ) -> ShardedCollectionBase:
        """Shard ``module`` by ``params`` (its entry of the plan) over ``env`` (collective).

        Args:
            module: the collection (on ``meta`` or materialised; materialised weights are kept).
            params: ``plan.plan["<module path>"]``.
            env: ``ShardingEnv`` (or a process group; default: the world).
            device: where the local shards live (default CPU).
            module_fqn: the module's path (for messages only).
            seed: base seed of shard initialisation of ``meta`` tables.
        """
        if not isinstance(module, self._module_class):
            raise TypeError(
                f"{type(self).__name__} shards {self._module_class.__name__}, got {type(module).__name__}"
                + (f" at {module_fqn!r}" if module_fqn else "")
            )
        device = torch.device(device) if device is not None else torch.device("cpu")
        return self._sharded_class(
            module, params, as_env(env), device, self._fused_params_for(module), seed, self.kernel_backend,
            self._qcomm_codecs_registry,
        )  # fmt: skip

    def _fused_params_for(self, module: nn.Module) -> FusedParamsLike:
        """The fused optimizer of ``module``'s tables not marked by ``apply_optimizer_in_backward``."""
        return self.fused_params or None
