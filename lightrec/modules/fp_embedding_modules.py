"""``FeatureProcessedEmbeddingBagCollection`` (torchrec's ``torchrec.modules.fp_embedding_modules``):
feature processors, then a weighted ``EmbeddingBagCollection``.

::

    fp_ebc = FeatureProcessedEmbeddingBagCollection(
        EmbeddingBagCollection(tables, is_weighted=True),
        {"f1": PositionWeightedModule(max_feature_length=10), "f2": PositionWeightedModule(10)},
    )   # or a PositionWeightedModuleCollection({"f1": 10, "f2": 10})
    kt = fp_ebc(kjt)                          # KeyedTensor [B, sum D], as the EBC's

State-dict keys are torchrec's: ``_embedding_bag_collection.embedding_bags.<table>.weight`` and
``_feature_processors.<feature>.position_weight`` (a dict of processors) or
``_feature_processors.position_weights.<feature>`` (a collection). The weights flow into the pooled
sum, so the position weights learn with the tables (autograd through ``per_sample_weights``).
``DistributedModelParallel`` shards the collection with ``FeatureProcessedEmbeddingBagCollectionSharder``.
"""

from __future__ import annotations

import torch
from torch import nn

from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.modules.feature_processor_ import (
    FeatureProcessor,
    FeatureProcessorError,
    FeatureProcessorsCollection,
    with_weights,
)
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["FeatureProcessedEmbeddingBagCollection", "FeatureProcessorDictWrapper", "apply_feature_processors_to_kjt"]


def apply_feature_processors_to_kjt(
    features: KeyedJaggedTensor, feature_processors: nn.ModuleDict | dict[str, nn.Module]
) -> KeyedJaggedTensor:
    """Each key's processor (weight 1 for keys without one) on its ``JaggedTensor``; same KJT layout."""
    jts = features.to_dict()
    weights = []
    for key in features.keys():
        jt = jts[key]
        if key in feature_processors:
            try:
                weights.append(feature_processors[key](jt).weights())
            except FeatureProcessorError as error:  # a processor sees one JaggedTensor: add the feature's name
                raise FeatureProcessorError(f"feature {key!r}: {error}") from error
        else:
            weights.append(torch.ones(jt.values().numel(), device=jt.values().device))
    if not weights:
        return features
    flat = torch.cat(weights)
    if torch.compiler.is_compiling():
        # torch.export sizes each feature's part by data (its lengths): state that they add up to the ids
        torch._check(flat.numel() == features.values().numel())
    return with_weights(features, flat)


class FeatureProcessorDictWrapper(FeatureProcessorsCollection):
    """A ``{feature: FeatureProcessor}`` dict as a :class:`FeatureProcessorsCollection`."""

    def __init__(self, feature_processors: nn.ModuleDict) -> None:
        super().__init__()
        self._feature_processors = feature_processors

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return apply_feature_processors_to_kjt(features, self._feature_processors)


class FeatureProcessedEmbeddingBagCollection(nn.Module):
    """Feature processors, then a weighted ``EmbeddingBagCollection`` (see the module docstring).

    Args:
        embedding_bag_collection: the tables; must be built with ``is_weighted=True``.
        feature_processors: ``{feature: FeatureProcessor}`` naming every feature of the
            collection, or one :class:`FeatureProcessorsCollection`.

    Raises:
        ValueError: the collection is not weighted, or the dict's features differ from the
            collection's.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        feature_processors: dict[str, FeatureProcessor] | FeatureProcessorsCollection,
    ) -> None:
        super().__init__()
        if not isinstance(embedding_bag_collection, EmbeddingBagCollection):
            raise TypeError(
                f"embedding_bag_collection must be an EmbeddingBagCollection, got {type(embedding_bag_collection).__name__}"
            )
        if not embedding_bag_collection.is_weighted():
            raise ValueError(
                "FeatureProcessedEmbeddingBagCollection needs EmbeddingBagCollection(..., is_weighted=True): the "
                "feature processors' weights are its per-id weights"
            )
        self._embedding_bag_collection = embedding_bag_collection
        features = [f for c in embedding_bag_collection.embedding_bag_configs() for f in c.feature_names]
        if isinstance(feature_processors, FeatureProcessorsCollection):
            self._feature_processors: nn.Module = feature_processors
        else:
            if set(feature_processors) != set(features):
                raise ValueError(
                    f"feature_processors name {sorted(feature_processors)} but the collection reads {sorted(set(features))}; "
                    "give one processor per feature (or a FeatureProcessorsCollection)"
                )
            self._feature_processors = nn.ModuleDict(feature_processors)
        self._feature_names = features

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._embedding_bag_collection.embedding_bag_configs()

    def is_weighted(self) -> bool:
        return True

    def feature_names(self) -> list[str]:
        return list(self._feature_names)

    def split(self) -> tuple[FeatureProcessorsCollection, EmbeddingBagCollection]:
        """``(the processors as a collection, the EmbeddingBagCollection)``."""
        processors = self._feature_processors
        if isinstance(processors, nn.ModuleDict):
            return FeatureProcessorDictWrapper(processors), self._embedding_bag_collection
        assert isinstance(processors, FeatureProcessorsCollection)  # the only other kind accepted
        return processors, self._embedding_bag_collection

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features`` (this collection's keys, any order) -> ``KeyedTensor`` ``[B, sum D]``."""
        processors = self._feature_processors
        if isinstance(processors, nn.ModuleDict):
            weighted = apply_feature_processors_to_kjt(features, processors)
        else:
            weighted = processors(features)
        out: KeyedTensor = self._embedding_bag_collection(weighted)
        return out
