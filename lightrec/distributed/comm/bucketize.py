"""Row-wise input bucketization: route every id to the rank that owns its row, as a local row.

Row-wise sharding gives rank ``r`` a contiguous block of each table's rows. With the default
blocks, ``block_size = ceil(num_rows / W)`` and rank ``r`` owns rows
``[r * block_size, min((r + 1) * block_size, num_rows))`` — the last block is shorter, and a table
with fewer rows than ranks leaves the last ranks empty. Explicit ``block_bounds`` (``W + 1`` row
offsets per key) describe any other contiguous split.

Bucketizing a KJT (T keys, batch B) gives a KJT with the keys repeated once per rank,
bucket-major, whose ids are shard-local rows; every bag keeps its position, so rank r's bucket is
a complete ``[T, B]`` batch (bags whose ids all live elsewhere are empty)::

    input  (W = 2, key f: 5 rows -> block 3: rank 0 rows 0-2, rank 1 rows 3-4)
      f   sample 0: [4, 0, 2]   sample 1: [3]
    output keys [f, f]  (stride 2)
      bucket 0 (f): sample 0: [0, 2]   sample 1: []          lengths [2, 0, 1, 1]
      bucket 1 (f): sample 0: [1]      sample 1: [0]         values  [0, 2, 1, 0]

    unbucketize_permute = [2, 0, 1, 3]: input id i sits at output position permute[i]

Send the result with ``KJTAllToAll(pg, key_splits=[T] * W)``. Weights move with their ids.
``unbucketize_permute`` (sequence / unpooled embeddings) restores the input order of per-id
outputs: ``out_in_input_order = out_bucketed[unbucketize_permute]``.

Ids must lie in ``[0, num_rows)``; pass ``num_rows`` to have that checked (one host sync). Without
the check, ids at or beyond ``W * block_size`` are wrapped cyclically (rank ``id % W``, row
``id // W``) as fbgemm does; with ``block_bounds``, out-of-range ids are undefined.

fbgemm's ``block_bucketize_sparse_features`` is used when ``lightrec._fbgemm`` reports it; the
pure-torch path gives identical results (``tests/distributed/test_comm_bucketize.py``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from lightrec._fbgemm import has_fbgemm_op
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "RowWiseBucketized",
    "bucketize_kjt_by_rank",
    "IdOutOfRangeError",
    "bucketize_kjt_row_wise",
    "row_wise_block_size",
    "row_wise_block_bounds",
]


class IdOutOfRangeError(IndexError):
    """An id of a sparse feature is negative or not below its table's number of rows."""


class RowWiseBucketized(NamedTuple):
    """Result of :func:`bucketize_kjt_row_wise`.

    Attributes:
        kjt: keys ``keys * W`` (bucket-major), stride ``B``, ids rebased to shard-local rows.
        unbucketize_permute: ``[N]`` output position of each input id (when requested), else None.
    """

    kjt: KeyedJaggedTensor
    unbucketize_permute: torch.Tensor | None


def row_wise_block_size(num_rows: int, world_size: int) -> int:
    """Rows per rank in the default row-wise split: ``ceil(num_rows / world_size)`` (at least 1)."""
    return max(1, math.ceil(num_rows / world_size))


def row_wise_block_bounds(num_rows: int, world_size: int) -> list[int]:
    """``W + 1`` row offsets of the default split: rank r owns ``[bounds[r], bounds[r + 1])``."""
    block = row_wise_block_size(num_rows, world_size)
    return [min(r * block, num_rows) for r in range(world_size + 1)]


def _check_args(
    kjt: KeyedJaggedTensor,
    world_size: int,
    block_sizes: list[int],
    block_bounds: list[list[int]] | None,
    num_rows: list[int] | None,
) -> None:
    num_keys = len(kjt.keys())
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(block_sizes) != num_keys or any(b < 1 for b in block_sizes):
        raise ValueError(
            f"block_sizes must give one positive block size per key ({num_keys} keys: "
            f"{kjt.keys()}), got {block_sizes!r}; use row_wise_block_size(num_rows, world_size)"
        )
    if block_bounds is not None:
        for key, bounds in zip(kjt.keys(), block_bounds, strict=False):
            if len(bounds) != world_size + 1 or bounds[0] != 0 or bounds != sorted(bounds):
                raise ValueError(
                    f"block_bounds for key {key!r} must be {world_size + 1} non-decreasing row "
                    f"offsets starting at 0 (rank r owns [bounds[r], bounds[r+1])), got {bounds!r}"
                )
        if len(block_bounds) != num_keys:
            raise ValueError(
                f"block_bounds must have one entry per key ({num_keys}), got {len(block_bounds)}"
            )
    if num_rows is not None and len(num_rows) != num_keys:
        raise ValueError(f"num_rows must give one row count per key ({num_keys}), got {num_rows!r}")


def _check_ids(kjt: KeyedJaggedTensor, num_rows: list[int]) -> None:
    """Raise :class:`IdOutOfRangeError` naming the first key with an id outside its table."""
    values = kjt.values()
    for key, rows, start, end in zip(
        kjt.keys(), num_rows, kjt.offset_per_key()[:-1], kjt.offset_per_key()[1:], strict=True
    ):
        ids = values[start:end]
        if ids.numel() == 0:
            continue
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= rows:
            bad = lo if lo < 0 else hi
            raise IdOutOfRangeError(
                f"feature {key!r} has id {bad}, outside its table's rows [0, {rows}); "
                "ids must index the table (hash or clip them before the model)"
            )


def _bucketize_torch(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    num_keys: int,
    batch: int,
    world_size: int,
    block_sizes: list[int],
    block_bounds: list[list[int]] | None,
    sequence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Pure-torch twin of fbgemm's op: same outputs (``unbucketize`` only when ``sequence``)."""
    device, n = values.device, values.numel()
    num_bags = num_keys * batch
    bag = torch.repeat_interleave(
        torch.arange(num_bags, device=device), lengths.to(torch.int64), output_size=n
    )
    ids = values.to(torch.int64)
    if block_bounds is None:
        if len(set(block_sizes)) == 1:  # the common case: no per-value block-size gather
            block: torch.Tensor | int = block_sizes[0]
        else:
            key = torch.div(bag, batch, rounding_mode="floor")
            block = torch.tensor(block_sizes, dtype=torch.int64, device=device).index_select(0, key)
        rank = torch.div(ids, block, rounding_mode="floor")
        local = ids - rank * block
        # Ids past the last block wrap cyclically, as fbgemm does (for identical results).
        wrap = rank >= world_size
        rank = torch.where(wrap, ids % world_size, rank)
        local = torch.where(wrap, torch.div(ids, world_size, rounding_mode="floor"), local)
    else:
        key = torch.div(bag, batch, rounding_mode="floor")
        bounds = torch.tensor(block_bounds, dtype=torch.int64, device=device)  # [T, W + 1]
        # Rank = number of inner bounds <= id; shift each key's bounds apart so one flat
        # searchsorted serves every key (ids are < bounds[-1] <= span for valid input).
        span = int(bounds.max()) + 1 if bounds.numel() else 1
        inner = (bounds[:, 1:world_size] + torch.arange(num_keys, device=device).unsqueeze(1) * span).reshape(
            -1
        )
        shifted = ids.clamp(0, span - 1) + key * span
        rank = torch.searchsorted(inner, shifted, right=True) - key * (world_size - 1)
        local = ids - bounds.view(-1).index_select(0, key * (world_size + 1) + rank)
    return _group_by_rank(rank, local, bag, lengths, values.dtype, weights, num_bags, world_size, sequence)


def _group_by_rank(
    rank: torch.Tensor,
    new_ids: torch.Tensor,
    bag: torch.Tensor,
    lengths: torch.Tensor,
    dtype: torch.dtype,
    weights: torch.Tensor | None,
    num_bags: int,
    world_size: int,
    sequence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Lay the ids out rank by rank (``rank[i]`` the destination of id ``i``, ``bag[i]`` its bag)."""
    # Stable by rank: within a bucket, values stay in (key, sample, position) order. Sorting a
    # narrow dtype is several times faster than int64 (ranks are < W).
    narrow = torch.int16 if world_size <= torch.iinfo(torch.int16).max else torch.int64
    perm = torch.sort(rank.to(narrow), stable=True).indices
    new_lengths = torch.bincount(rank * num_bags + bag, minlength=world_size * num_bags).to(lengths.dtype)
    new_values = new_ids.index_select(0, perm).to(dtype)
    new_weights = weights.index_select(0, perm) if weights is not None else None
    if not sequence:
        return new_lengths, new_values, new_weights, None
    unbucketize = torch.empty_like(perm)
    unbucketize[perm] = torch.arange(rank.numel(), device=rank.device)
    return new_lengths, new_values, new_weights, unbucketize.to(dtype)


def bucketize_kjt_by_rank(
    kjt: KeyedJaggedTensor, rank: torch.Tensor, world_size: int, output_permute: bool = False
) -> RowWiseBucketized:
    """Split the ids of ``kjt`` into ``world_size`` buckets by a given destination, values unchanged.

    Managed-collision tables route *raw* ids by their id-space bucket (the owning rank remaps
    them itself), so the destination is computed by the caller and the ids travel as they are.

    Args:
        kjt: ``T`` keys, stride ``B``.
        rank: ``[N]`` int64 destination rank of every id.
        world_size: number of buckets ``W``.
        output_permute: also return ``unbucketize_permute``.

    Returns:
        :class:`RowWiseBucketized` with a ``T * W``-key KJT (bucket-major, stride ``B``).
    """
    lengths, values, weights = kjt.lengths(), kjt.values(), kjt.weights_or_none()
    num_bags = len(kjt.keys()) * kjt.stride()
    bag = torch.repeat_interleave(
        torch.arange(num_bags, device=values.device), lengths.to(torch.int64), output_size=values.numel()
    )
    new_lengths, new_values, new_weights, unbucketize = _group_by_rank(
        rank, values, bag, lengths, values.dtype, weights, num_bags, world_size, output_permute
    )
    out = KeyedJaggedTensor(
        keys=list(kjt.keys()) * world_size, values=new_values, weights=new_weights, lengths=new_lengths,
        stride=kjt.stride(),
    )  # fmt: skip
    return RowWiseBucketized(out, unbucketize)


def _bucketize_fbgemm(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    world_size: int,
    block_sizes: list[int],
    block_bounds: list[list[int]] | None,
    sequence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    # fbgemm wants block sizes (and bounds) in the ids' dtype.
    sizes = torch.tensor(block_sizes, dtype=values.dtype, device=values.device)
    pos = (
        [torch.tensor(b, dtype=values.dtype, device=values.device) for b in block_bounds]
        if block_bounds is not None
        else None
    )
    new_lengths, new_values, new_weights, _pos, unbucketize = (
        torch.ops.fbgemm.block_bucketize_sparse_features(
            lengths, values, False, sequence, sizes, world_size, weights, None, -1, pos
        )
    )
    return new_lengths, new_values, new_weights, unbucketize


def bucketize_kjt_row_wise(
    kjt: KeyedJaggedTensor,
    world_size: int,
    block_sizes: list[int],
    *,
    block_bounds: list[list[int]] | None = None,
    num_rows: list[int] | None = None,
    output_permute: bool = False,
) -> RowWiseBucketized:
    """Split every id of ``kjt`` into the bucket of the rank owning its row (module docstring).

    Args:
        kjt: ``T`` keys, stride ``B``, ids in ``[0, num_rows)`` of each key's table.
        world_size: number of buckets ``W`` (ranks sharing the tables).
        block_sizes: ``[T]`` rows per rank for each key (``row_wise_block_size``); ids below
            ``W * block_size`` go to rank ``id // block_size`` as row ``id % block_size``.
        block_bounds: optional ``[T][W + 1]`` row offsets for a non-default split (rank r owns
            ``[bounds[r], bounds[r + 1])``); replaces the block-size rule for in-range ids.
        num_rows: optional ``[T]`` table sizes; when given, ids are checked (one host sync) and an
            :class:`IdOutOfRangeError` names the first bad one.
        output_permute: also return ``unbucketize_permute`` (for sequence embeddings).

    Returns:
        :class:`RowWiseBucketized` with a ``T * W``-key KJT (stride ``B``, lengths ``[W * T * B]``).
    """
    _check_args(kjt, world_size, block_sizes, block_bounds, num_rows)
    if num_rows is not None:
        _check_ids(kjt, num_rows)
    lengths, values, weights = kjt.lengths(), kjt.values(), kjt.weights_or_none()
    num_keys, batch = len(kjt.keys()), kjt.stride()
    if has_fbgemm_op("block_bucketize_sparse_features") and values.numel() > 0:
        new_lengths, new_values, new_weights, unbucketize = _bucketize_fbgemm(
            lengths, values, weights, world_size, block_sizes, block_bounds, output_permute
        )
    else:
        new_lengths, new_values, new_weights, unbucketize = _bucketize_torch(
            lengths, values, weights, num_keys, batch, world_size, block_sizes, block_bounds, output_permute
        )
    out = KeyedJaggedTensor(
        keys=list(kjt.keys()) * world_size,
        values=new_values,
        weights=new_weights,
        lengths=new_lengths,
        stride=batch,
    )
    return RowWiseBucketized(out, unbucketize if output_permute else None)
