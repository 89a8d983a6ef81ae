"""Small jagged-layout helpers used by the sparse collectives (pure torch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec.sparse.variable_batch import cumsum_list, segment_sums
from lightrec.sparse.variable_batch import permute_segments as cut_and_concatenate

__all__ = ["HostSegmentOrder", "exclusive_cumsum", "permute_segments", "permute_segments_on_host"]


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


@dataclass(frozen=True)
class HostSegmentOrder:
    """Where the values of :func:`permute_segments_on_host`'s output came from, as host lists.

    Attributes:
        value_sizes: ``[S]`` values of each input segment.
        order: ``[S]`` input segment at each output position.
        device: the device of the batch.
    """

    value_sizes: list[int]
    order: list[int]
    device: torch.device

    def value_index(self) -> torch.Tensor:
        """``[N]`` for each output value its position in the input values (as :func:`permute_segments`)."""
        starts = cumsum_list(self.value_sizes)
        parts = [torch.arange(starts[s], starts[s] + self.value_sizes[s], device=self.device) for s in self.order]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=self.device)


def permute_segments_on_host(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    segment_sizes: list[int],
    order: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, HostSegmentOrder]:
    """:func:`permute_segments` for a batch in host memory, where reading sizes costs no device sync:
    each segment's value count is read once, and the segments are cut and concatenated instead of
    gathered through index tensors built per value (0.30 instead of 1.96 ms for 13 keys x 2 ranks x
    2048 one-id bags, one thread). The value index, which only sequence output dists read, is built
    on demand (``HostSegmentOrder.value_index``).
    """
    value_sizes = segment_sums(lengths, segment_sizes)
    out_lengths, _ = cut_and_concatenate(order, segment_sizes, lengths, None)
    out_values, out_weights = cut_and_concatenate(order, value_sizes, values, weights)
    return out_lengths, out_values, out_weights, HostSegmentOrder(value_sizes, order, values.device)
