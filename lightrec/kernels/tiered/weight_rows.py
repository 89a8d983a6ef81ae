"""What the gradient of learned per-sample weights reads on a tiered table: rows through its cache.

``with_weight_grad`` (``lightrec.kernels.weight_grad``) reads a kernel's rows with
``split_embedding_weights()``; a tiered kernel's split views are its backing store, behind the cache
where the rows updated since their admission (dirty) live, so :func:`rows_through_cache` gives it
rows read through the cache instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lightrec.kernels.kernel_interface import EmbeddingKernel
from lightrec.kernels.tiered.backend import TieredBatchedLookup

__all__ = ["rows_through_cache"]


def rows_through_cache(
    kernel: EmbeddingKernel, indices: torch.Tensor, offsets: torch.Tensor, batch: int, feature_table_map: Sequence[int]
) -> tuple[torch.Tensor, Callable[[], list[torch.Tensor]], list[int]]:
    """What ``with_weight_grad`` reads for a tiered kernel, whose ``split_embedding_weights()`` is the
    backing store -- behind the cache, where the rows updated since their admission (dirty) live.

    One "table" per feature instead: feature ``f``'s ``[n_f, D]`` rows, read through the cache when
    the backward runs, and each id's position in its feature as its index.

    Args:
        kernel: the tiered kernel.
        indices, offsets: the lookup's ids ``[N]`` and bag offsets ``[F * B + 1]`` (feature-major).
        batch: ``B``.
        feature_table_map: table of each feature.

    Returns:
        ``(positions [N], rows, range(F))`` -- what ``with_weight_grad`` takes as indices, tables and
        feature-to-table map: ``positions[i]`` is ``i`` minus the start of its feature's ids, ``rows()``
        the per-feature rows, and feature ``f`` reads "table" ``f``.
    """
    starts = offsets[::batch].long()  # [F + 1]: where each feature's ids start (no host read here)
    n = indices.numel()
    per_feature = starts[1:] - starts[:-1]
    positions = torch.arange(n, device=indices.device) - torch.repeat_interleave(starts[:-1], per_feature, output_size=n)

    def read(table: int, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(kernel, TieredBatchedLookup):  # the cached rows only from the cache, on its device
            return kernel.read_weights(table, ids)
        return kernel.read_rows(table, ids.long()).weights.to(indices.device)  # (fbgemm's cache: flushed first)

    def rows() -> list[torch.Tensor]:
        bounds = starts.tolist()  # one host read, in the backward that needs it
        return [read(t, indices[bounds[f] : bounds[f + 1]]) for f, t in enumerate(feature_table_map)]

    return positions, rows, list(range(len(feature_table_map)))
