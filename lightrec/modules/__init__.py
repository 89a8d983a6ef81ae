"""Model building blocks: table configs, embedding collections, dense blocks (MLP, interactions).

Imports only ``lightrec.sparse`` (and torch): kernels, sharding and Lightning sit above.
"""

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

__all__ = [
    "BaseEmbeddingConfig",
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
