"""Small jagged-layout helpers used by the sparse collectives (pure torch, device agnostic)."""

from __future__ import annotations

import torch

__all__ = ["exclusive_cumsum", "permute_segments"]


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``[0, x0, x0+x1, ...]`` without the grand total (same length as ``x``)."""
    return torch.cumsum(x, 0) - x


def _gather_index(starts: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """Positions ``starts[j] .. starts[j] + sizes[j] - 1`` for every j, concatenated: ``[total]``."""
    out_starts = exclusive_cumsum(sizes)
    shift = torch.repeat_interleave(starts - out_starts, sizes, output_size=total)
    return torch.arange(total, device=starts.device, dtype=shift.dtype) + shift


def permute_segments(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    segment_sizes: list[int],
    order: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Reorder consecutive groups of bags of a jagged batch.

    ``lengths`` (``[sum(segment_sizes)]``) is cut into consecutive segments of ``segment_sizes[j]``
    bags; the output lists segment ``order[0]``, then ``order[1]`` ... with each segment's bags and
    their values (and weights) unchanged. Unlike a 2-D key permute, segments may have different
    numbers of bags (per-rank batch sizes).

    Returns:
        ``(lengths, values, weights, value_index)`` where ``value_index`` (``[len(values)]``) gives,
        for each output value, its position in the input ``values``.
    """
    device = lengths.device
    sizes = torch.tensor(segment_sizes, dtype=torch.int64, device=device)
    order_t = torch.tensor(order, dtype=torch.int64, device=device)
    bag_starts = exclusive_cumsum(sizes)
    bag_index = _gather_index(bag_starts[order_t], sizes[order_t], int(sum(segment_sizes)))
    out_lengths = lengths.index_select(0, bag_index)

    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(lengths.to(torch.int64), 0, out=offsets[1:])
    value_starts = offsets.index_select(0, bag_starts)
    value_sizes = offsets.index_select(0, bag_starts + sizes) - value_starts
    value_index = _gather_index(value_starts[order_t], value_sizes[order_t], values.numel())
    out_values = values.index_select(0, value_index)
    out_weights = weights.index_select(0, value_index) if weights is not None else None
    return out_lengths, out_values, out_weights, value_index
