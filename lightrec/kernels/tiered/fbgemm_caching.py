"""fbgemm's own HBM cache over host memory (``EmbeddingLocation.MANAGED_CACHING``), where its CUDA build is installed.

On a GPU with fbgemm's CUDA build, a table tiered over *host memory* (``fused_uvm_caching``) runs
as fbgemm's TBE with the rows in unified memory and a set-associative cache in HBM -- torchrec's
``fused_uvm_caching`` exactly (``cache_load_factor``, ``cache_algorithm`` LRU / LFU, prefetch
pipeline). Everywhere else (CPU, no fbgemm, fbgemm's CPU build, SSD backing, an optimizer fbgemm
lacks) lightrec's own :class:`~lightrec.kernels.tiered.backend.TieredBatchedLookup` serves it.

Not verified on a GPU in this repository's CI (the CPU machines have no CUDA): the ``gpu``-marked
tests in ``tests/kernels/tiered/test_cuda.py`` are what checks it where a GPU is lent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from lightrec._fbgemm import fbgemm_serves_cuda
from lightrec.kernels.fbgemm_backend import FbgemmBatchedLookup
from lightrec.kernels.kernel_interface import KernelConfig, RowState

if TYPE_CHECKING:  # fbgemm is optional; the kernel imports it on construction
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

__all__ = ["FbgemmManagedCachingLookup"]


class FbgemmManagedCachingLookup(FbgemmBatchedLookup):
    """fbgemm TBE with ``EmbeddingLocation.MANAGED_CACHING`` (an ``EmbeddingKernel``; see the module docstring)."""

    name: ClassVar[str] = "fbgemm_managed_caching"
    prefetches = True

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        tiering = config.tiering
        if tiering is None or tiering.backing != "host":
            return "fbgemm's managed caching serves tables tiered over host memory (fused_uvm_caching) only"
        if config.device.type != "cuda" or not fbgemm_serves_cuda():
            return "fbgemm's managed caching needs a CUDA device and fbgemm's CUDA build"
        return super().supports(config)

    def _location(self, locations: type[EmbeddingLocation], on_cuda: bool) -> EmbeddingLocation:
        return locations.MANAGED_CACHING

    def _storage_options(self, config: KernelConfig) -> dict[str, object]:
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm

        tiering = config.tiering
        assert tiering is not None  # supports() checked it
        rows = sum(config.rows)
        cached = sum(tiering.cache_rows_for(r) for r in config.rows)
        return {
            "cache_load_factor": cached / max(rows, 1),
            "cache_algorithm": CacheAlgorithm.LFU if tiering.algorithm == "lfu" else CacheAlgorithm.LRU,
            "prefetch_pipeline": tiering.prefetch,
            "gather_uvm_cache_stats": True,
        }

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """fbgemm's own prefetch: the rows a later batch misses, brought into the HBM cache now."""
        if self.tbe.prefetch_pipeline:
            self.tbe.prefetch(indices.long(), offsets.long())

    def flush(self) -> None:
        """Dirty cache lines back to the unified-memory rows (``split_embedding_weights``)."""
        self.tbe.flush()

    def invalidate(self) -> None:
        """Forget the cache after the rows were loaded from outside."""
        self.tbe.reset_cache_states()

    def read_rows(self, table: int, rows: torch.Tensor) -> RowState:
        self.flush()
        return super().read_rows(table, rows)

    def write_rows(self, table: int, rows: torch.Tensor, state: RowState) -> None:
        self.flush()
        super().write_rows(table, rows, state)
        self.invalidate()
