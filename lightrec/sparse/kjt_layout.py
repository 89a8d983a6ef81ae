"""The per-key sizes of a ``KeyedJaggedTensor``, computed from its parts (the lazy caches).

For keys ``a`` (batch 2) and ``b`` (batch 2), ``lengths = [2, 1, 0, 1]``::

    stride                  2              the batch size B
    length_per_key          [3, 1]         ids of each key (one host sync to compute)
    lengths_offset_per_key  [0, 2, 4]      where each key's lengths start in ``lengths``

A variable-batch KJT has a batch size per key (``stride_per_key`` = row sums of
``stride_per_key_per_rank``), so its lengths offsets are a running sum rather than multiples of B.
The functions take tensors and host lists, never a ``KeyedJaggedTensor`` (TorchScript compiles
them from the class's methods; see ``kjt_transforms``).
"""

from typing import Dict, List, Optional, Tuple

import torch

from lightrec.sparse.variable_batch import segment_sums

__all__ = ["infer_stride", "meta_length_per_key", "multiples", "positions_of", "row_sums", "sum_length_per_key"]


def infer_stride(
    num_keys: int,
    stride_per_key_per_rank: Optional[List[List[int]]],
    inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
    num_lengths: int,
) -> int:
    """Batch size ``B`` of a KJT built without one (torchrec's rule).

    Args:
        num_keys: ``F``; no keys means ``B = 0``.
        stride_per_key_per_rank: ``[F][R]`` of a variable-batch KJT, else None.
        inverse_indices: ``(keys, [F, B])`` or None; its width is ``B`` of a variable-batch KJT.
        num_lengths: entries of ``lengths`` (``F * B`` for a fixed-batch KJT).

    Returns:
        ``num_lengths // F`` for a fixed-batch KJT; for a variable-batch one the width of its
        inverse indices, else the largest batch of a key.
    """
    if num_keys == 0:
        return 0
    if stride_per_key_per_rank is None:
        return num_lengths // num_keys
    if inverse_indices is not None and inverse_indices[1].numel() > 0:
        return inverse_indices[1].size(-1)
    stride = 0
    for per_rank in stride_per_key_per_rank:
        stride = max(stride, sum(per_rank))
    return stride


def meta_length_per_key(num_values: int, num_keys: int) -> List[int]:
    """Placeholder ids per key where nothing can be read (``meta``): dealt evenly, like torchrec.

    The first key takes the remainder, so the list sums to ``num_values``.
    """
    if num_keys == 0:
        return []
    lpk = [num_values // num_keys] * num_keys
    lpk[0] += num_values % num_keys
    return lpk


def sum_length_per_key(lengths: torch.Tensor, num_keys: int, stride_per_key: Optional[List[int]]) -> List[int]:
    """Ids of each key: sums of the key-major ``lengths`` (one host sync).

    Args:
        lengths: ``[sum B_k]`` key-major lengths.
        num_keys: ``F``, at least one.
        stride_per_key: ``[F]`` batch sizes of a variable-batch KJT, or None (``F`` equal blocks).
    """
    if stride_per_key is not None:
        return segment_sums(lengths, stride_per_key)
    sums: List[int] = lengths.view(num_keys, -1).sum(dim=1).tolist()
    return sums



def row_sums(stride_per_key_per_rank: List[List[int]]) -> List[int]:
    """``stride_per_key`` ``[F]`` of a variable-batch KJT: each key's batch over all ranks."""
    return [sum(per_rank) for per_rank in stride_per_key_per_rank]


def multiples(stride: int, count: int) -> List[int]:
    """``[0, stride, 2 * stride, ...]`` (``count`` entries): ``lengths_offset_per_key`` of a fixed batch."""
    return [i * stride for i in range(count)]


def positions_of(keys: List[str]) -> Dict[str, int]:
    """``index_per_key``: ``{key: position}``."""
    positions: Dict[str, int] = {}
    for i, k in enumerate(keys):
        positions[k] = i
    return positions
