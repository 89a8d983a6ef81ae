"""Fresh rows for evicted ids: deterministic re-initialisation and optimizer-state reset.

When a managed-collision table evicts an id, its row goes to another id; the row must not carry
the old id's weights or optimizer state (momentum, Adagrad sums) into the new one. This file holds
the two halves for plain-PyTorch collections; fused and sharded collections reset their kernels'
storage through the kernels' ``reset_rows`` (``lightrec.kernels.kernel_interface``) with the same values.

New values are drawn uniformly from the table's init range, a pure function of a seed made of
``(seed, table name, iteration, bucket)`` (``ops.uniform_block``: a counter-based draw, native on
CPU -- ``torch.ops.lightrec_mch.uniform_rows``, the same bits -- a few microseconds for the rows a
step evicts), for the rows of each bucket in the order the module evicted them. Buckets decide
independently and a sharded table holds whole buckets, so a row is re-initialised with the same
values whether the table is sharded or not, on any number of ranks. A table with an ``init_fn``
gets it applied to the evicted rows of each bucket under a torch generator seeded the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.managed_collision.mch_native import native_step_available
from lightrec.modules.managed_collision.ops import uniform_block

__all__ = ["reinit_values", "reset_collection_rows", "reset_optimizer_rows", "uniform_reset_seed"]

_M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _seed(seed: int, table: str, iteration: int, bucket: int) -> int:
    """A 63-bit generator seed of ``(seed, table, iteration, bucket)`` (Python integers: no tensor work)."""
    mixed = _splitmix((zlib.crc32(table.encode()) << 32) ^ (seed * 0x9E3779B1) ^ (iteration * 0x632BE5AB)
                      ^ (bucket * 0x2545F491))  # fmt: skip
    return mixed & 0x7FFF_FFFF_FFFF_FFFF


def uniform_reset_seed(config: BaseEmbeddingConfig, iteration: int, seed: int = 0, bucket: int = 0) -> int | None:
    """The ``ops.uniform_block`` seed that :func:`reinit_values` draws the rows of one bucket with,
    or None when the table draws otherwise (an ``init_fn``): a kernel can then write the fresh values
    straight into its rows (``reset_tables_uniform``), the same values."""
    return None if config.init_fn is not None else _seed(seed, config.name, iteration, bucket)


def _draw(config: BaseEmbeddingConfig, n: int, generator_seed: int, dtype: torch.dtype) -> torch.Tensor:
    if config.init_fn is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(generator_seed)
            block = torch.empty(n, config.embedding_dim, dtype=dtype)
            config.init_fn(block)
        return block
    lo, hi = config.get_weight_init_min(), config.get_weight_init_max()
    if dtype in (torch.float32, torch.float64) and native_step_available(torch.device("cpu")):
        out: torch.Tensor = torch.ops.lightrec_mch.uniform_rows(n, config.embedding_dim, generator_seed, lo, hi - lo, dtype)
        return out
    return uniform_block(n, config.embedding_dim, generator_seed, lo, hi, dtype)


@torch.no_grad()
def reinit_values(
    config: BaseEmbeddingConfig,
    rows: torch.Tensor,
    iteration: int,
    seed: int = 0,
    bucket_bounds: Sequence[int] | None = None,
    first_bucket: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[k, embedding_dim]`` fresh values of the evicted global ``rows`` of table ``config``.

    Args:
        config: the table (its init range or ``init_fn``).
        rows: ``[k]`` int64 global rows, each bucket's in the order its module evicted them.
        iteration: the managed-collision module's training step.
        seed: base seed.
        bucket_bounds: global row offsets of the buckets ``rows`` may fall in (the module's
            ``reset_buckets()``); None: one bucket.
        first_bucket: global index of the first of those buckets.
        dtype: dtype of the result.
    """
    bounds = list(bucket_bounds) if bucket_bounds is not None else [0, config.num_embeddings]
    if len(bounds) == 2:
        values = _draw(config, rows.numel(), _seed(seed, config.name, iteration, first_bucket), dtype)
        return values.to(rows.device)
    inner = torch.tensor(bounds[1:-1], dtype=torch.int64, device=rows.device)
    buckets = torch.searchsorted(inner, rows, right=True)
    values = torch.empty(rows.numel(), config.embedding_dim, dtype=dtype)
    for b in torch.unique(buckets).tolist():
        mine = torch.nonzero(buckets == b).flatten().cpu()
        values[mine] = _draw(config, mine.numel(), _seed(seed, config.name, iteration, first_bucket + b), dtype)
    return values.to(rows.device)


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
