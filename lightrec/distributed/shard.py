"""torchrec's ``torchrec.distributed.shard._shard_modules`` call shape, for inference sharding.

The TorchRec tutorial shards a *quantized* model for serving with
``_shard_modules(module=qmodel, device=..., env=ShardingEnv.from_local(world_size, 0))``. That is
inference sharding -- spreading the quantized tables over local serving devices -- which lives in
:mod:`lightrec.quant.sharded_embedding_bag`, one floor down; this module gives it torchrec's path
and arguments: a ``plan`` places tables by its table-wise ranks (:class:`QuantEmbeddingBagCollectionSharder`),
otherwise tables are spread by size. Model-parallel *training* sharding is
``DistributedModelParallel`` (``lightrec.distributed``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
from lightrec.distributed.types import ModuleSharder, ShardingEnv, ShardingPlan
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.sharded_embedding_bag import shard_modules

__all__ = ["_shard_modules", "shard_modules"]


def _shard_modules(
    module: nn.Module,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    plan: ShardingPlan | None = None,
    sharders: list[ModuleSharder] | None = None,
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
