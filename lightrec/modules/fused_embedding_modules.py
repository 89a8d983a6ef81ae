"""torchrec's ``torchrec.modules.fused_embedding_modules`` path, re-exported from ``lightrec.kernels``.

A *mirror*: the fused collections need the batched kernels, which sit one floor above
``lightrec.modules``, so this one file of ``modules`` imports ``kernels``. The exception is
written down in ``tests/test_architecture.py`` (``MIRRORS``) together with its guard: no file of
lightrec imports this one (only users do), so the upward import can never make a circle or a
hidden dependency of ``modules`` on ``kernels``.
"""

from lightrec.kernels.fuse_optimizer import fuse_embedding_optimizer
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection, FusedEmbeddingCollection

__all__ = ["FusedEmbeddingBagCollection", "FusedEmbeddingCollection", "fuse_embedding_optimizer"]
