"""Model building blocks: table configs, embedding collections, dense blocks (MLP, interactions).

Imports only ``lightrec.sparse`` (and torch): kernels, sharding and Lightning sit above.
"""

from lightrec.modules._dense_checks import DenseShapeError
from lightrec.modules.crossnet import CrossNet, LowRankCrossNet, VectorCrossNet
from lightrec.modules.deepfm import DeepFM, FactorizationMachine
from lightrec.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
    data_type_to_dtype,
    pooling_type_to_str,
)
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_checks import EmbeddingIdError, FeatureKeyError
from lightrec.modules.interaction import InteractionArch, InteractionDCNArch
from lightrec.modules.mlp import MLP, Perceptron

__all__ = [
    "MLP",
    "BaseEmbeddingConfig",
    "CrossNet",
    "DeepFM",
    "DenseShapeError",
    "FactorizationMachine",
    "InteractionArch",
    "InteractionDCNArch",
    "LowRankCrossNet",
    "Perceptron",
    "VectorCrossNet",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "EmbeddingIdError",
    "FeatureKeyError",
    "PoolingType",
    "data_type_to_dtype",
    "pooling_type_to_str",
]
