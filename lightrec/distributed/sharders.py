"""``get_default_sharders``: the sharders of lightrec's embedding collections (managed-collision
twins included).

What every entry point that shards a model uses when it is given no sharders:
``DistributedModelParallel``, ``RecStrategy``, ``lightrec plan`` and the ``PlanReport`` callback.
torchrec's path for it, ``lightrec.distributed.sharding_plan``, re-exports it.
"""

from __future__ import annotations

from lightrec.distributed.embedding import EmbeddingCollectionSharder
from lightrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from lightrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from lightrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder
from lightrec.distributed.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
)
from lightrec.distributed.planner.plan import ModuleSharder
from lightrec.distributed.planner.plan.sharder import FusedParamsLike

__all__ = ["get_default_sharders"]


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
