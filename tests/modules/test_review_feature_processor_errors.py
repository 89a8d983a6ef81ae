"""Feature-processor errors name the feature and the argument (PositionWeightedModule in a dict
given to FeatureProcessedEmbeddingBagCollection; bool lengths)."""

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.feature_processor_ import (
    FeatureProcessorError,
    PositionWeightedModule,
    PositionWeightedModuleCollection,
)
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection


def test_dict_of_processors_names_the_feature_whose_bag_is_too_long() -> None:
    tables = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=2, feature_names=["f", "g"])]
    ebc = EmbeddingBagCollection(tables, is_weighted=True)
    fp = FeatureProcessedEmbeddingBagCollection(ebc, {"f": PositionWeightedModule(4), "g": PositionWeightedModule(2)})
    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.arange(6), lengths=torch.tensor([1, 2, 3, 0]))
    with pytest.raises(FeatureProcessorError, match=r"feature 'g'.* 3 ids .*max_feature_length=2"):
        fp(kjt)


@pytest.mark.parametrize("make", [lambda: PositionWeightedModule(True),
                                  lambda: PositionWeightedModuleCollection({"f": True})])  # fmt: skip
def test_bool_max_feature_length_is_a_value_error_naming_the_argument(make) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="max_feature_length"):
        make()
