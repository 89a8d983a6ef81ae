"""``FeatureProcessedEmbeddingBagCollection.feature_names()`` is its ``EmbeddingBagCollection``'s:
table by table, a feature read by several tables once per table (lightrec's convention for every
collection), whichever kind of processors it holds. (torchrec's FP-EBC keeps a private, unordered
set of names and has no ``feature_names()``.)"""

from __future__ import annotations

import pytest

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection


@pytest.mark.parametrize("collection", [False, True])
def test_feature_names_are_the_collections(collection: bool) -> None:
    tables = [
        EmbeddingBagConfig(name="t0", num_embeddings=5, embedding_dim=2, feature_names=["b", "a"]),
        EmbeddingBagConfig(name="t1", num_embeddings=5, embedding_dim=2, feature_names=["c", "b"]),  # b: shared
    ]
    ebc = EmbeddingBagCollection(tables, is_weighted=True)
    processors = PositionWeightedModuleCollection({f: 3 for f in "abc"}) if collection else {
        f: PositionWeightedModule(3) for f in "abc"
    }
    fp = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    assert fp.feature_names() == ebc.feature_names() == ["b", "a", "c", "b"]
