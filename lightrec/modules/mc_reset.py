"""Fresh rows for evicted ids: deterministic re-initialisation and optimizer-state reset.

When a managed-collision table evicts an id, its row goes to another id; the row must not carry
the old id's weights or optimizer state (momentum, Adagrad sums) into the new one. This file holds
the two halves for plain-PyTorch collections; fused and sharded collections reset their kernels'
storage through ``lightrec.kernels.row_reset`` with the same values.

The new values of a row depend only on ``(seed, table name, global row, iteration)``::

    value[r, c] = lo + (hi - lo) * U(mix64(mix64(r + key(seed, table, iteration)) + c * GOLDEN))

(``U``: the top 53 bits as a float in ``[0, 1)``; ``[lo, hi]``: the table's init range) -- so a
table re-initialises a row identically whether it is sharded or not, on any number of ranks. A
table with an ``init_fn`` gets it applied to the evicted rows under a seed derived the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import torch
from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.mc_ops import hashed_uniform, mix64

__all__ = ["reinit_values", "reset_collection_rows", "reset_optimizer_rows"]

_GOLDEN = -7046029254386353131


def _key(seed: int, table: str, iteration: int) -> int:
    mixed = (zlib.crc32(table.encode()) << 31) ^ (seed * 0x9E3779B1) ^ (iteration * 0x632BE5AB)
    return int(mix64(torch.tensor(mixed & 0x7FFF_FFFF_FFFF_FFFF, dtype=torch.int64)))


@torch.no_grad()
def reinit_values(
    config: BaseEmbeddingConfig, rows: torch.Tensor, iteration: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[k, embedding_dim]`` fresh values of global ``rows`` of table ``config`` (module docstring).

    Args:
        config: the table (its init range or ``init_fn``).
        rows: ``[k]`` int64 global row indices.
        iteration: the managed-collision module's training step.
        seed: base seed.
        dtype: dtype of the result.
    """
    dim = config.embedding_dim
    key = _key(seed, config.name, iteration)
    if config.init_fn is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(key & 0x7FFF_FFFF)
            block = torch.empty(rows.numel(), dim, dtype=dtype)
            config.init_fn(block)
        return block.to(rows.device)
    per_row = mix64(rows.long() + key)
    bits = mix64(per_row.unsqueeze(1) + torch.arange(dim, device=rows.device, dtype=torch.int64) * _GOLDEN)
    lo, hi = config.get_weight_init_min(), config.get_weight_init_max()
    return (lo + (hi - lo) * hashed_uniform(bits)).to(dtype)


@torch.no_grad()
def reset_optimizer_rows(optimizer: torch.optim.Optimizer, param: torch.Tensor, rows: torch.Tensor) -> None:
    """Zero the per-row optimizer state of ``rows`` of ``param`` in ``optimizer`` (if it has any).

    Every state tensor whose first dimension is the parameter's rows is reset (Adagrad's ``sum``,
    Adam's moments, row-wise Adagrad's ``[rows]`` sums); scalars shared by the whole table (Adam's
    ``step``) are left alone.
    """
    state = optimizer.state.get(param)
    if not state:
        return
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == param.shape[0]:
            value.index_fill_(0, rows.to(value.device), 0)


@torch.no_grad()
def reset_collection_rows(
    collection: nn.Module,
    table: str,
    rows: torch.Tensor,
    values: torch.Tensor,
    optimizers: Iterable[torch.optim.Optimizer] = (),
) -> None:
    """Write ``values`` into ``rows`` of a plain collection's table and reset their optimizer state.

    Args:
        collection: an ``EmbeddingBagCollection`` (``embedding_bags``) or ``EmbeddingCollection``
            (``embeddings``).
        table: the table's name.
        rows: ``[k]`` int64 rows.
        values: ``[k, D]`` new weights.
        optimizers: optimizers stepping the table besides those ``apply_optimizer_in_backward``
            attached to its weight (which are found on the weight itself).
    """
    holders = getattr(collection, "embedding_bags", None)
    if holders is None:
        holders = getattr(collection, "embeddings")  # noqa: B009 - the sequence collection's holder
    weight = holders[table].weight
    weight.index_copy_(0, rows.to(weight.device), values.to(weight.device, weight.dtype))
    in_backward = getattr(weight, "_in_backward_optimizers", [])
    for optimizer in [*in_backward, *optimizers]:
        reset_optimizer_rows(optimizer, weight, rows)
