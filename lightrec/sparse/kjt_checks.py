"""``KeyedJaggedTensor.validate``: the layout checks, on the KJT's parts (no KJT import, no circle).

A KJT is consistent when its keys are unique, its lengths hold one entry per (key, sample) --
``stride`` per key, or ``sum(stride_per_key_per_rank[k])`` for key ``k`` of a variable-batch KJT --,
the lengths are non-negative and count every value once, the offsets are their running sum and
there is one weight per value (:func:`lightrec.sparse.jagged._check_lengths_offsets`).
"""

from typing import List, Optional, Tuple

import torch

from lightrec.sparse.jagged import SparseValueError, _check_lengths_offsets

__all__ = ["validate_kjt_layout"]


@torch.jit.unused
def validate_kjt_layout(
    keys: List[str],
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: torch.Tensor,
    offsets: Optional[torch.Tensor],
    stride: Optional[int],
    stride_per_key_per_rank: Optional[List[List[int]]],
    inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
) -> None:
    """Raise ``SparseValueError`` naming the first inconsistency of a KJT's layout."""
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise SparseValueError(f"KeyedJaggedTensor keys must be unique; duplicated: {dupes}")
    if len(keys) == 0:
        if lengths.numel() != 0 or values.numel() != 0:
            raise SparseValueError(
                f"KeyedJaggedTensor has no keys but {lengths.numel()} lengths and {values.numel()} values"
            )
        return
    if stride_per_key_per_rank is not None:
        _check_variable_batch(keys, lengths, stride_per_key_per_rank, inverse_indices)
    elif lengths.numel() % len(keys) != 0:
        raise SparseValueError(
            f"KeyedJaggedTensor has {lengths.numel()} lengths, not divisible by its {len(keys)} keys {keys}; "
            "lengths must hold batch_size entries per key"
        )
    elif stride is not None and stride * len(keys) != lengths.numel():
        raise SparseValueError(
            f"KeyedJaggedTensor stride={stride} with {len(keys)} keys needs {stride * len(keys)} "
            f"lengths, got {lengths.numel()}"
        )
    _check_lengths_offsets(values, weights, lengths, offsets, "KeyedJaggedTensor")


def _check_variable_batch(
    keys: List[str],
    lengths: torch.Tensor,
    strides: List[List[int]],
    inverse: Optional[Tuple[List[str], torch.Tensor]],
) -> None:
    if len(strides) != len(keys):
        raise SparseValueError(
            f"stride_per_key_per_rank has {len(strides)} rows for {len(keys)} keys {keys}; give one per key"
        )
    samples = sum(sum(per_rank) for per_rank in strides)
    if samples != lengths.numel():
        raise SparseValueError(
            f"stride_per_key_per_rank {strides} counts {samples} samples but there are {lengths.numel()} "
            "lengths; key k needs sum(stride_per_key_per_rank[k]) lengths"
        )
    if inverse is not None and (inverse[1].dim() != 2 or inverse[1].size(0) != len(inverse[0])):
        raise SparseValueError(
            f"inverse_indices must be (keys, [len(keys), B]), got {len(inverse[0])} keys and a tensor of "
            f"shape {list(inverse[1].shape)}"
        )
