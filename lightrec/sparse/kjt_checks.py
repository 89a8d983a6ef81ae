"""``KeyedJaggedTensor.validate``: the layout checks, on the KJT's parts (no KJT import, no circle).

A KJT is consistent when its keys are unique, its lengths hold one entry per (key, sample) --
``stride`` per key, or ``sum(stride_per_key_per_rank[k])`` for key ``k`` of a variable-batch KJT --,
ids and lengths are int32/int64, the lengths are non-negative (the feature is named) and count
every value once (surplus values are named, never dropped), the offsets are their running sum and
there is one weight per value (:func:`lightrec.sparse.jagged._check_lengths_offsets`).
"""

from typing import List, Optional, Tuple

import torch

from lightrec.sparse.jagged import SparseValueError, _check_lengths_offsets

__all__ = ["check_id_dtypes", "validate_kjt_layout"]


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
    check_id_dtypes(keys, values, lengths)
    _check_per_feature_counts(keys, values, lengths, stride_per_key_per_rank)
    _check_lengths_offsets(values, weights, lengths, offsets, "KeyedJaggedTensor")


_ID_DTYPES = (torch.int32, torch.int64)


def check_id_dtypes(keys: List[str], values: torch.Tensor, lengths: torch.Tensor) -> None:
    """Ids and lengths are int32/int64: what every lookup kernel indexes with (no silent casts).

    Reads only dtypes (no device sync), so collections call it on every input.
    """
    for name, tensor in (("values (the ids)", values), ("lengths", lengths)):
        if tensor.dtype not in _ID_DTYPES:
            raise SparseValueError(
                f"KeyedJaggedTensor {name} of features {keys} must be int64 or int32, got {tensor.dtype}; "
                "convert them with .long() (ids must be whole numbers: a float id is not an embedding row)"
            )


def _check_per_feature_counts(
    keys: List[str], values: torch.Tensor, lengths: torch.Tensor, strides: Optional[List[List[int]]]
) -> None:
    """Name the feature whose lengths are negative, and the surplus of values beyond the lengths."""
    if lengths.numel() > 0:
        if strides is None:
            per_key = list(lengths.reshape(len(keys), -1))
        else:
            per_key = list(torch.split(lengths, [sum(per_rank) for per_rank in strides]))
        for key, key_lengths in zip(keys, per_key):
            if bool((key_lengths < 0).any()):
                raise SparseValueError(
                    f"KeyedJaggedTensor feature {key!r} has a negative length (lengths must be "
                    "non-negative: every sample needs a count >= 0 of ids)"
                )
    total = int(lengths.sum()) if lengths.numel() > 0 else 0
    if total < values.size(0):
        raise SparseValueError(
            f"KeyedJaggedTensor has {values.size(0) - total} values beyond the last feature {keys[-1]!r}: "
            f"lengths sum to {total} but values has {values.size(0)} entries, so the surplus ids would be "
            "dropped silently; lengths must count every value exactly once"
        )


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
