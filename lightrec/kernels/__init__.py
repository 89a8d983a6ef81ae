"""Batched embedding kernels (fbgemm TBE, Triton and pure torch) and fused (in-backward) optimizers.

- ``EmbeddingKernel`` (``kernel_interface.py``): the one interface every backend implements;
  ``KERNELS`` / ``register_kernel`` / ``select_backend`` (``kernel_registry.py``): the backends by
  name and the ``kernel_backend="auto"`` rule.

- ``BatchedEmbeddingBag`` / ``BatchedEmbedding``: one kernel call per forward for a group of tables,
  fbgemm's flattened ``(indices, offsets, per_sample_weights)`` layout.
- ``FusedEmbeddingBagCollection`` / ``FusedEmbeddingCollection``: single-process collections that
  take a ``KeyedJaggedTensor`` and update their rows inside backward.
- ``TieringConfig`` (``tiering=`` of the modules above): tables larger than memory, every row in host
  memory or on SSD and a cache of hot rows on the device (``TieredBatchedLookup``; docs/tiered-tables.md).
"""

from lightrec.kernels.batched_embedding import (
    BatchedEmbedding,
    BatchedEmbeddingBag,
    BatchedTableSpec,
    EmbeddingFusedOptimizer,
    TableSpec,
)
from lightrec.kernels.fbgemm_backend import fbgemm_supports
from lightrec.kernels.fuse_optimizer import fuse_embedding_optimizer
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.kernels.kernel_interface import (
    EmbeddingKernel,
    KernelConfig,
    LookupBatch,
    ResidentRows,
    RowState,
)
from lightrec.kernels.kernel_registry import (
    KERNELS,
    build_kernel,
    check_kernel_backend,
    register_kernel,
    select_backend,
)
from lightrec.kernels.tiered.backend import TieredBatchedLookup, TieredCacheStats
from lightrec.kernels.tiered.cache import CacheFullError
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.kernels.tiered.store import TieredStorageError
from lightrec.kernels.triton_backend import triton_supports
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec, WeightDecayMode

__all__ = [
    "KERNELS",
    "BatchedEmbedding",
    "BatchedEmbeddingBag",
    "BatchedTableSpec",
    "CacheFullError",
    "EmbOptimType",
    "EmbeddingFusedOptimizer",
    "EmbeddingKernel",
    "FusedEmbeddingBagCollection",
    "FusedEmbeddingCollection",
    "FusedOptimizerSpec",
    "KernelConfig",
    "LookupBatch",
    "ResidentRows",
    "RowState",
    "TableSpec",  # the old name of BatchedTableSpec
    "TieredBatchedLookup",
    "TieredCacheStats",
    "TieredStorageError",
    "TieringConfig",
    "WeightDecayMode",
    "build_kernel",
    "check_kernel_backend",
    "fbgemm_supports",
    "fuse_embedding_optimizer",
    "register_kernel",
    "select_backend",
    "triton_supports",
]
