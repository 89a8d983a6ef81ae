"""``from lightrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection``
works as it does under torchrec: the names are the quantized collections."""

from lightrec.inference.quant_embedding_collection import QuantEmbeddingCollection
from lightrec.inference.quant_embedding_modules import QuantEmbeddingBagCollection

EmbeddingBagCollection = QuantEmbeddingBagCollection
EmbeddingCollection = QuantEmbeddingCollection

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "QuantEmbeddingBagCollection", "QuantEmbeddingCollection"]
