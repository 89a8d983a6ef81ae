"""lightrec: Lightning-based framework for large-scale recommendation models.

The flat namespace mirrors torchrec's, so ``import lightrec as torchrec``-style code works:
``lightrec.KeyedJaggedTensor``, ``lightrec.EmbeddingBagCollection``, ``lightrec.EmbeddingBagConfig``...
"""

from lightrec.modules import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__version__ = "0.1.0.dev0"

__all__ = [
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PoolingType",
    "__version__",
]
