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

from collections.abc import Mapping
from typing import Any

from torch import nn

from lightrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = ["FusedEmbeddingBagCollectionSharder", "ShardedFusedEmbeddingBagCollection"]


class ShardedFusedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """A sharded ``FusedEmbeddingBagCollection`` (same behaviour as ``ShardedEmbeddingBagCollection``)."""


class FusedEmbeddingBagCollectionSharder(CollectionSharder):
    """Builds :class:`ShardedFusedEmbeddingBagCollection` s (arguments: ``CollectionSharder``)."""

    _module_class = FusedEmbeddingBagCollection
    _sharded_class = ShardedFusedEmbeddingBagCollection

    def _fused_params_for(self, module: nn.Module) -> Mapping[str, Any] | FusedOptimizerSpec | None:
        spec: FusedOptimizerSpec = module._spec  # type: ignore[assignment]  # a FusedEmbeddingBagCollection's
        return self.fused_params or spec
