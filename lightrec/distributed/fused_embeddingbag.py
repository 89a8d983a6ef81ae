"""torchrec's ``torchrec.distributed.fused_embeddingbag``: shard a ``FusedEmbeddingBagCollection``.

A fused collection already trains its tables inside backward with its own optimizer; sharded, it
becomes a :class:`ShardedFusedEmbeddingBagCollection` (a ``ShardedEmbeddingBagCollection``) whose
shards keep the collection's weights and apply the *collection's* fused optimizer (its
``FusedOptimizerSpec``; a ``fused_params`` given to the sharder overrides it). The optimizer state
(moments, step) starts fresh on the shards: load an optimizer checkpoint after sharding to keep it.
``get_default_sharders()`` includes this sharder, so ``DistributedModelParallel`` shards fused
collections like plain ones.
"""

from __future__ import annotations

from torch import nn

from lightrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from lightrec.distributed.planner.plan.sharder import FusedParamsLike
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection

__all__ = ["FusedEmbeddingBagCollectionSharder", "ShardedFusedEmbeddingBagCollection"]


class ShardedFusedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """A sharded ``FusedEmbeddingBagCollection`` (same behaviour as ``ShardedEmbeddingBagCollection``)."""


class FusedEmbeddingBagCollectionSharder(CollectionSharder):
    """Builds :class:`ShardedFusedEmbeddingBagCollection` s (arguments: ``CollectionSharder``)."""

    _module_class = FusedEmbeddingBagCollection
    _sharded_class = ShardedFusedEmbeddingBagCollection

    def _fused_params_for(self, module: nn.Module) -> FusedParamsLike:
        if not isinstance(module, FusedEmbeddingBagCollection):  # _module_class: shard() got one
            raise TypeError(f"{type(self).__name__} shards FusedEmbeddingBagCollections, got {type(module).__name__}")
        return self.fused_params or module._spec
