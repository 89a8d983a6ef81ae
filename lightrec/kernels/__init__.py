"""Batched embedding kernels (fbgemm TBE, Triton and pure torch) and fused (in-backward) optimizers.

- ``BatchedEmbeddingBag`` / ``BatchedEmbedding``: one kernel call per forward for a group of tables,
  fbgemm's flattened ``(indices, offsets, per_sample_weights)`` layout.
- ``FusedEmbeddingBagCollection`` / ``FusedEmbeddingCollection``: single-process collections that
  take a ``KeyedJaggedTensor`` and update their rows inside backward.
"""

from lightrec.kernels.batched_embedding import (
    BatchedEmbedding,
    BatchedEmbeddingBag,
    BatchedTableSpec,
    EmbeddingFusedOptimizer,
    TableSpec,
    select_backend,
)
from lightrec.kernels.fbgemm_backend import fbgemm_supports
from lightrec.kernels.fuse_optimizer import fuse_embedding_optimizer
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.kernels.triton_backend import triton_supports
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec, WeightDecayMode

__all__ = [
    "BatchedEmbedding",
    "BatchedEmbeddingBag",
    "BatchedTableSpec",
    "EmbOptimType",
    "EmbeddingFusedOptimizer",
    "FusedEmbeddingBagCollection",
    "FusedEmbeddingCollection",
    "FusedOptimizerSpec",
    "TableSpec",  # the old name of BatchedTableSpec
    "WeightDecayMode",
    "fbgemm_supports",
    "fuse_embedding_optimizer",
    "select_backend",
    "triton_supports",
]
