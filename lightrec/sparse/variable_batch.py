"""Tensor work behind variable-batch ``KeyedJaggedTensor`` s (torchrec's "VBE" input).

A variable-batch KJT gives each key its own batch size, split by the rank its samples came from
(``stride_per_key_per_rank``, ``[F][R]``). The lengths stay key-major, but key ``k`` now owns
``B_k = sum_r stride_per_key_per_rank[k][r]`` entries instead of ``B``::

    keys                 |  u (B_u = 2)  |  i (B_i = 3)
    lengths              |  2     1      |  1    0    2        lengths = [2, 1, 1, 0, 2]
    values               |  7, 8  9      |  4         5, 6     values  = [7, 8, 9, 4, 5, 6]
    stride_per_key_per_rank = [[2], [3]]     lengths_offset_per_key = [0, 2, 5]

``inverse_indices = (keys, [F, B])`` map every sample ``b`` of the full batch to the row of each
key's (deduplicated) batch it uses: pooled embeddings ``[B_k, D]`` become ``[B, D]`` by
``index_select(0, inverse_indices[1][k])``. That is how a model with a user tower computed once
per user and an item tower per impression feeds one output row per impression.

The functions here take and return tensors and host lists only (no ``KeyedJaggedTensor``), so
the KJT class imports them without an import circle.
"""

from typing import List, Optional, Tuple

import torch

from lightrec.sparse._ops import complete_cumsum

__all__ = [
    "cumsum_list",
    "expand_segment",
    "permute_segments",
    "regroup_received",
    "segment_sums",
    "strides_from_rank_major",
]


def cumsum_list(xs: List[int]) -> List[int]:
    """``[0, x0, x0 + x1, ...]`` (``len(xs) + 1`` entries) of a host list."""
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def segment_sums(lengths: torch.Tensor, segment_sizes: List[int]) -> List[int]:
    """Sum of ``lengths`` over consecutive segments of ``segment_sizes`` entries (one host sync).

    Used for ``length_per_key`` of a variable-batch KJT (segments = each key's batch size).
    """
    if len(segment_sizes) == 0:
        return []
    bounds = torch.tensor(cumsum_list(segment_sizes), device=lengths.device, dtype=torch.long)
    running = complete_cumsum(lengths.long())
    sums: List[int] = (running.index_select(0, bounds[1:]) - running.index_select(0, bounds[:-1])).tolist()
    return sums


def permute_segments(
    order: List[int],
    segment_sizes: List[int],
    tensor: torch.Tensor,
    weights: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Reorder consecutive segments of ``tensor`` (and ``weights``): output segment ``i`` is input
    segment ``order[i]`` (segments may repeat or be left out).

    Args:
        order: ``[S_out]`` index of the input segment at each output position.
        segment_sizes: ``[S_in]`` entries of each input segment (host list: no device sync).
        tensor / weights: ``[sum(segment_sizes), ...]``.
    """
    starts = cumsum_list(segment_sizes)
    parts: List[torch.Tensor] = []
    weight_parts: List[torch.Tensor] = []
    for s in order:
        parts.append(tensor.narrow(0, starts[s], segment_sizes[s]))
        if weights is not None:
            weight_parts.append(weights.narrow(0, starts[s], segment_sizes[s]))
    if len(parts) == 0:
        empty_weights: Optional[torch.Tensor] = None
        if weights is not None:
            empty_weights = weights[:0]
        return tensor[:0], empty_weights
    out_weights: Optional[torch.Tensor] = None
    if weights is not None:
        out_weights = torch.cat(weight_parts)
    return torch.cat(parts), out_weights


def expand_segment(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    rows: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The bags ``rows`` of one key, in that order (bags may repeat): a jagged ``index_select``.

    Args:
        lengths: ``[B_k]`` ids per bag of the key.
        values / weights: ``[sum(lengths)]`` the key's ids (and per-id weights).
        rows: ``[B]`` bag taken for each output bag (a row of ``inverse_indices[1]``).

    Returns:
        ``(lengths [B], values, weights)`` of the expanded bags.
    """
    rows = rows.long()
    out_lengths = lengths.index_select(0, rows)
    starts = complete_cumsum(lengths.long())[:-1].index_select(0, rows)
    out_starts = complete_cumsum(out_lengths.long())
    total = int(out_starts[-1]) if out_starts.numel() > 0 else 0
    counts = out_lengths.long()
    # value j of output bag b reads input position starts[b] + (j - out_starts[b])
    shift = torch.repeat_interleave(starts - out_starts[:-1], counts, output_size=total)
    index = torch.arange(total, device=values.device, dtype=torch.long) + shift
    out_weights: Optional[torch.Tensor] = None
    if weights is not None:
        out_weights = weights.index_select(0, index)
    return out_lengths, values.index_select(0, index), out_weights


def strides_from_rank_major(
    stride_per_rank_per_key: torch.Tensor, num_workers: int, num_keys: int
) -> List[List[int]]:
    """``[R * F]`` batch sizes received rank by rank -> ``stride_per_key_per_rank`` ``[F][R]``."""
    if stride_per_rank_per_key.numel() == 0:
        return [[0] for _ in range(num_keys)]
    table: List[List[int]] = stride_per_rank_per_key.view(num_workers, num_keys).t().tolist()
    return table


def regroup_received(
    num_keys: int,
    tensors: List[torch.Tensor],
    variable_stride_per_key: bool,
    num_workers: int,
    recat: Optional[torch.Tensor],
    stride_per_rank: Optional[List[int]],
    stagger: int,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[int], Optional[List[List[int]]]]:
    """The tensor work of ``KeyedJaggedTensor.dist_init``: received rank-major blocks, key-major.

    Args:
        num_keys: keys of the received KJT.
        tensors: ``[lengths, values, (per-key batch sizes,) (weights)]`` of every source rank, end to end.
        variable_stride_per_key: the batch sizes travel in ``tensors[2]`` (``[R * F]``, rank-major).
        num_workers: source ranks ``R``.
        recat: ``[F * R]`` order of the ``(rank, key)`` blocks in the output, or None (kept as received).
            A fixed-batch KJT from ranks of different batch sizes also takes torchrec's per-sample
            form, ``[F * sum(stride_per_rank)]``: the source position of each output length.
        stride_per_rank: each source rank's batch size (fixed-batch only).
        stagger: torchrec's 2-D sharding rank interleave (1: none).

    Returns:
        ``(lengths, values, weights, stride, stride_per_key_per_rank)``: ``stride`` (the sum of
        ``stride_per_rank``) for a fixed-batch KJT, ``stride_per_key_per_rank`` ``[F][R]`` for a
        variable-batch one; the other is None.
    """
    if len(tensors) not in (2, 3, 4):
        raise ValueError(f"dist_init takes 2 to 4 tensors (lengths, values, [strides], [weights]), got {len(tensors)}")
    lengths = tensors[0]
    values = tensors[1]
    weights: Optional[torch.Tensor] = None
    if len(tensors) == (4 if variable_stride_per_key else 3):
        weights = tensors[-1]
    table: Optional[List[List[int]]] = None  # typed, and loops below: TorchScript compiles dist_init
    block_sizes: List[int] = []
    if variable_stride_per_key:
        strides_flat = tensors[2]
        received: List[int] = strides_flat.tolist()
        block_sizes = received
        rank_table = strides_from_rank_major(strides_flat, num_workers, num_keys)
        if stagger > 1:
            ranks: List[int] = torch.arange(num_workers).view(stagger, -1).t().reshape(-1).tolist()
            rank_table = [[per_rank[r] for r in ranks] for per_rank in rank_table]
        table = rank_table
    else:
        if stride_per_rank is None:
            raise ValueError("dist_init of a fixed-batch KJT needs stride_per_rank (each source rank's batch size)")
        for b in stride_per_rank:
            block_sizes.extend([b] * num_keys)
    if recat is not None and num_keys > 0:
        if table is None and recat.numel() != len(block_sizes) and recat.numel() == lengths.numel():
            # torchrec's recat for source ranks of different batch sizes (``_get_recat`` expanded by
            # ``expand_into_jagged_permute``): one entry per (key, sample) length, not per block
            lengths, values, weights = expand_segment(lengths, values, weights, recat)
        else:
            order: List[int] = recat.tolist()
            block_lengths = segment_sums(lengths, block_sizes)
            lengths, _ = permute_segments(order, block_sizes, lengths, None)
            values, weights = permute_segments(order, block_lengths, values, weights)
    stride: Optional[int] = None  # variable-batch: the batch sizes are in the table
    if table is None and stride_per_rank is not None:  # raised above if both are None
        stride = sum(stride_per_rank)
    return lengths, values, weights, stride, table
