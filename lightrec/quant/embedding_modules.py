"""``from lightrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection``
works as it does under torchrec: the name is the quantized collection."""

from lightrec.inference.quant_embedding_modules import QuantEmbeddingBagCollection

EmbeddingBagCollection = QuantEmbeddingBagCollection

__all__ = ["EmbeddingBagCollection", "QuantEmbeddingBagCollection"]
