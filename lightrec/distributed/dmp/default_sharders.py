"""``get_default_sharders``: the sharders of lightrec's embedding collections (managed-collision
twins included), and torchrec's helpers over them (``get_module_to_default_sharders``,
``apply_to_all``).

What every entry point that shards a model uses when it is given no sharders:
``DistributedModelParallel``, ``RecStrategy``, ``lightrec plan`` and the ``PlanReport`` callback.
torchrec's path for it, ``lightrec.distributed.sharding_plan``, re-exports it.
"""

from __future__ import annotations

from torch import nn

from lightrec.distributed.embedding import EmbeddingCollectionSharder
from lightrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from lightrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from lightrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder
from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
)
from lightrec.distributed.planner.plan import ModuleSharder, ParameterShardingGenerator
from lightrec.distributed.planner.plan.sharder import FusedParamsLike, register_default_sharders

__all__ = ["apply_to_all", "get_default_sharders", "get_module_to_default_sharders"]


def get_default_sharders(
    fused_params: FusedParamsLike = None, kernel_backend: str = "auto"
) -> list[ModuleSharder]:
    """Sharders of ``EmbeddingBagCollection``, ``EmbeddingCollection``,
    ``FeatureProcessedEmbeddingBagCollection``, ``FusedEmbeddingBagCollection`` (whose own fused
    optimizer is kept; ``fused_params`` do not override it) and the managed-collision twins of the
    first two.

    Args:
        fused_params: the fused optimizer of every table not marked with
            ``apply_optimizer_in_backward`` (torchrec-style dict or ``FusedOptimizerSpec``);
            default SGD with learning rate 0.01, like torchrec.
        kernel_backend: lookup kernels of every shard: ``"auto"``, ``"fbgemm"``, ``"triton"`` or
            ``"torch"`` (see ``CollectionSharder``).
    """
    return [
        EmbeddingBagCollectionSharder(fused_params=fused_params, kernel_backend=kernel_backend),
        EmbeddingCollectionSharder(fused_params=fused_params, kernel_backend=kernel_backend),
        FeatureProcessedEmbeddingBagCollectionSharder(fused_params=fused_params, kernel_backend=kernel_backend),
        FusedEmbeddingBagCollectionSharder(kernel_backend=kernel_backend),
        ManagedCollisionEmbeddingBagCollectionSharder(fused_params=fused_params, kernel_backend=kernel_backend),
        ManagedCollisionEmbeddingCollectionSharder(fused_params=fused_params, kernel_backend=kernel_backend),
    ]


register_default_sharders(get_default_sharders)


def get_module_to_default_sharders() -> dict[type[nn.Module], ModuleSharder]:
    """``{module type: its default sharder}`` (torchrec's helper over :func:`get_default_sharders`)."""
    return {sharder.module_type: sharder for sharder in get_default_sharders()}


def apply_to_all(
    module: nn.Module,
    parameter_sharding_generator: ParameterShardingGenerator,
    sharder: ModuleSharder | None = None,
) -> dict[str, ParameterShardingGenerator]:
    """One generator for every table of ``module``, for ``construct_module_sharding_plan``::

        plan = construct_module_sharding_plan(ebc, apply_to_all(ebc, row_wise()), world_size=2)

    Args:
        module: the collection whose tables to shard.
        parameter_sharding_generator: e.g. ``row_wise()`` or ``table_wise(rank=0)``.
        sharder: reads the module's tables (default: the default sharder of its type).

    Raises:
        ValueError: no default sharder shards ``module``'s type, or ``sharder`` shards another type.
    """
    if sharder is None:
        by_type = get_module_to_default_sharders()
        sharder = by_type.get(type(module))
        if sharder is None:
            raise ValueError(
                f"no default sharder shards {type(module).__name__}; pass sharder= (the sharders of "
                f"{sorted(t.__name__ for t in by_type)} are built in)"
            )
    elif not isinstance(module, sharder.module_type):
        raise ValueError(
            f"sharder {type(sharder).__name__} shards {sharder.module_type.__name__}, got {type(module).__name__}"
        )
    return {name: parameter_sharding_generator for name in sharder.shardable_parameters(module)}
