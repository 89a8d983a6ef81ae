"""The tensor work of a ``KeyedJaggedTensor`` all-to-all (torchrec's ``dist_*`` helpers).

A KJT crosses ranks as up to four flat tensors, sent in this order::

    label     | tensor                               | entries to rank r (keys split into groups)
    ----------+--------------------------------------+---------------------------------------------
    lengths   | lengths()              [sum B_k]     | sum of the batch sizes of group r's keys
    values    | values()               [N]           | sum of the ids of group r's keys
    strides   | stride_per_key()       [F] (int64)   | number of keys in group r (variable-batch only)
    weights   | weights()              [N]           | as values (weighted KJTs only)

The receiving side (``KeyedJaggedTensor.dist_init``,
:func:`lightrec.sparse.variable_batch.regroup_received`) gets each tensor's
blocks rank-major (rank 0's keys, then rank 1's ...); ``recat`` (``[F * R]``, an index of
``(rank, key)`` blocks) reorders them key-major. Its batch size is the sum of ``stride_per_rank``
(each source rank's batch size), or, with ``variable_stride_per_key``, the per-key batch sizes
travel in the ``strides`` tensor. ``stagger`` reorders the ranks as torchrec's 2-D sharding does.

The functions take the KJT's parts (tensors and host lists), never a ``KeyedJaggedTensor``:
TorchScript compiles them from the class's methods without compiling the class a second time.
"""

from typing import List, Optional

import torch

__all__ = ["dist_labels", "dist_splits", "dist_tensors", "sum_by_splits"]


def sum_by_splits(xs: List[int], splits: List[int]) -> List[int]:
    """Sums of consecutive groups of ``splits[i]`` entries of ``xs`` (``len(splits)`` sums)."""
    out: List[int] = []
    start = 0
    for n in splits:
        out.append(sum(xs[start : start + n]))
        start += n
    return out


def dist_labels(variable_stride_per_key: bool, weighted: bool) -> List[str]:
    """Names of the tensors :func:`dist_tensors` returns, in order."""
    labels = ["lengths", "values"]
    if variable_stride_per_key:
        labels.append("strides")
    if weighted:
        labels.append("weights")
    return labels


def dist_splits(
    stride_per_key: List[int],
    length_per_key: List[int],
    key_splits: List[int],
    variable_stride_per_key: bool,
    weighted: bool,
) -> List[List[int]]:
    """Entries of each :func:`dist_tensors` tensor that go to each destination.

    Args:
        stride_per_key: ``[F]`` batch size of each key.
        length_per_key: ``[F]`` ids of each key.
        key_splits: ``[R]`` keys of each consecutive group (group ``r`` goes to rank ``r``).
        variable_stride_per_key / weighted: which optional tensors travel.

    Returns:
        One ``[R]`` list per sent tensor, in :func:`dist_labels` order.
    """
    batch_size_per_split = sum_by_splits(stride_per_key, key_splits)
    length_per_split = sum_by_splits(length_per_key, key_splits)
    splits = [batch_size_per_split, length_per_split]
    if variable_stride_per_key:
        splits.append(key_splits)
    if weighted:
        splits.append(length_per_split)
    return splits


def dist_tensors(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    stride_per_key: Optional[List[int]],
) -> List[torch.Tensor]:
    """The tensors an all-to-all sends: lengths, values, [per-key batch sizes ``[F]`` int64], [weights].

    ``stride_per_key`` is given for a variable-batch KJT only (a fixed-batch one sends no batch sizes).
    """
    tensors = [lengths, values]
    if stride_per_key is not None:
        tensors.append(torch.tensor(stride_per_key, dtype=torch.int64, device=values.device))
    if weights is not None:
        tensors.append(weights)
    return tensors

