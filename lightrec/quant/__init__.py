"""torchrec-compatible import path for quantized modules (``torchrec.quant`` -> ``lightrec.quant``).

The implementation lives in :mod:`lightrec.inference`.
"""

from lightrec.quant.embedding_modules import EmbeddingBagCollection, QuantEmbeddingBagCollection

__all__ = ["EmbeddingBagCollection", "QuantEmbeddingBagCollection"]
