"""``reset_rows``: give rows of a batched lookup new weights and a fresh optimizer state.

The one place that knows where each kernel backend keeps its per-row state, so evicting a
managed-collision id (``lightrec.modules.mc_embedding_modules``, the sharded collections) never
leaves the old id's momentum behind. Every backend exposes its storage as per-table views
(``table_weights()`` ``[rows, D]`` and ``table_states()`` ``{name: [rows] or [rows, D]}``):

========  ======================================  =========================================
backend   weights                                 optimizer state reset
========  ======================================  =========================================
torch     rows of the dim group's ``[R, D]``      rows of each state tensor (sparse_update)
triton    rows of the flat buffer (``view``)      rows of the flat ``[R]`` / ``[R * D]`` state
fbgemm    ``split_embedding_weights()`` views     ``split_optimizer_states()`` views
========  ======================================  =========================================

State shared by a whole kernel (Adam's ``step``, fbgemm's ``iter``) is not per row and is kept.
When the kernels gain a common protocol with a "reset rows" hook, this function is what it calls.
"""

from __future__ import annotations

import torch

from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag

__all__ = ["reset_rows"]


@torch.no_grad()
def reset_rows(
    lookup: BatchedEmbeddingBag | BatchedEmbedding, table: int, rows: torch.Tensor, values: torch.Tensor
) -> None:
    """Write ``values`` into ``rows`` of table ``table`` of ``lookup`` and zero their optimizer state.

    Args:
        lookup: a batched lookup (any backend).
        table: index of the table in ``lookup.table_names``.
        rows: ``[k]`` int64 rows local to that table.
        values: ``[k, D]`` new weights.
    """
    if rows.numel() == 0:
        return
    # The table's parameter and its fused optimizer state are views of the backend's storage
    # (kept current by the lookup's _relink); reading them avoids rebuilding every table's views.
    weight = lookup.weights[lookup.table_names[table]]
    index = rows.to(weight.device, torch.int64)
    weight.data.index_copy_(0, index, values.to(weight.device, weight.dtype))
    optimizer = lookup._fused_optimizer
    states = optimizer.state[weight] if optimizer is not None else {}
    for name, state in states.items():
        if not isinstance(state, torch.Tensor) or state.dim() == 0 or name == "step":
            continue  # one counter for the whole kernel
        state.index_fill_(0, index.to(state.device), 0)
