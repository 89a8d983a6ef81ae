"""``KeyedJaggedTensor.validate``: the layout checks, on the KJT's parts (no KJT import, no circle).

A KJT is consistent when its keys are unique, its values (and weights) are 1-D, its lengths hold one
entry per (key, sample) -- ``stride`` per key, or ``sum(stride_per_key_per_rank[k])`` for key ``k``
of a variable-batch KJT --, ids and lengths are int32/int64, the lengths are non-negative (the
feature, sample and value are named) and count every value once (surplus values are named, never
dropped), the offsets are their running sum and there is one finite weight per value.

The checks come in two costs, used separately by the collections' always-on input check
(``lightrec.modules.feature_checks.check_collection_input``):

* :func:`check_layout_sizes` and :func:`check_id_dtypes` read host metadata only (shapes, dtypes,
  the stride): free, on every call and every device;
* :func:`check_lengths_and_weights` reads the data (one host read): negative lengths and
  non-finite weights. Free of device syncs only where the tensors are on the host.
"""

from typing import List, Optional, Tuple

import torch

from lightrec.sparse.jagged import (
    SparseValueError,
    _check_lengths_offsets,
    check_offsets_start,
    check_same_device,
)

__all__ = ["check_id_dtypes", "check_layout_sizes", "check_lengths_and_weights", "validate_kjt_layout"]


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
    inverse_rows = inverse_indices[1] if inverse_indices is not None else None
    tensors = {"weights": weights, "lengths": lengths, "offsets": offsets, "inverse_indices": inverse_rows}
    check_same_device(values, tensors, "KeyedJaggedTensor")
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise SparseValueError(f"KeyedJaggedTensor keys must be unique; duplicated: {dupes}")
    if len(keys) == 0:
        if lengths.numel() != 0 or values.numel() != 0:
            raise SparseValueError(
                f"KeyedJaggedTensor has no keys but {lengths.numel()} lengths and {values.numel()} values"
            )
        return
    check_layout_sizes(keys, values, weights, lengths, stride, stride_per_key_per_rank)
    check_id_dtypes(keys, values, lengths)
    check_offsets_start(offsets, "KeyedJaggedTensor")
    strides = [sum(per_rank) for per_rank in stride_per_key_per_rank] if stride_per_key_per_rank is not None else None
    check_lengths_and_weights(keys, lengths, weights, strides)
    _check_surplus(keys, values, lengths)
    _check_inverse_indices(keys, inverse_indices, strides)
    _check_lengths_offsets(values, weights, lengths, offsets, "KeyedJaggedTensor")


@torch.jit.unused
def check_layout_sizes(
    keys: List[str],
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: torch.Tensor,
    stride: Optional[int],
    stride_per_key_per_rank: Optional[List[List[int]]],
) -> None:
    """The sizes of a KJT's parts agree: host metadata only (no device read), so free on every call.

    ``values`` and ``lengths`` are 1-D, ``weights`` (if any) holds one entry per value, and
    ``lengths`` holds ``B`` entries per key (``sum(stride_per_key_per_rank[k])`` for key ``k`` of a
    variable-batch KJT), ``B`` being ``stride`` when the KJT was given one.

    Args:
        keys: ``[F]`` feature names, at least one.
        values / weights / lengths: the KJT's tensors.
        stride: the batch size the KJT was built with (None: inferred, so consistent by definition).
        stride_per_key_per_rank: ``[F][R]`` of a variable-batch KJT, else None.
    """
    if values.dim() != 1:
        raise SparseValueError(
            f"KeyedJaggedTensor values of features {keys} must be 1-D (one id per entry, key-major), got shape "
            f"{list(values.shape)}; flatten them (values.reshape(-1)) and give one length per (feature, sample)"
        )
    if lengths.dim() != 1:
        raise SparseValueError(
            f"KeyedJaggedTensor lengths of features {keys} must be 1-D ([len(keys) * batch_size], key-major), "
            f"got shape {list(lengths.shape)}; flatten them"
        )
    if weights is not None and (weights.dim() != 1 or weights.numel() != values.numel()):
        raise SparseValueError(
            f"KeyedJaggedTensor weights of features {keys} has {weights.numel()} entries (shape "
            f"{list(weights.shape)}) but values has {values.numel()}: give one weight per id, or weights=None"
        )
    if stride_per_key_per_rank is not None:
        if len(stride_per_key_per_rank) != len(keys):
            raise SparseValueError(
                f"stride_per_key_per_rank has {len(stride_per_key_per_rank)} rows for {len(keys)} keys {keys}; "
                "give one per key"
            )
        samples = sum(sum(per_rank) for per_rank in stride_per_key_per_rank)
        if samples != lengths.numel():
            raise SparseValueError(
                f"stride_per_key_per_rank {stride_per_key_per_rank} counts {samples} samples but there are "
                f"{lengths.numel()} lengths; key k needs sum(stride_per_key_per_rank[k]) lengths"
            )
        return
    if lengths.numel() % len(keys) != 0:
        raise SparseValueError(
            f"KeyedJaggedTensor has {lengths.numel()} lengths, not divisible by its {len(keys)} keys {keys}; "
            "lengths must hold batch_size entries per key (key-major: all of the first key's samples, then the "
            "next key's)"
        )
    if stride is not None and stride * len(keys) != lengths.numel():
        raise SparseValueError(
            f"KeyedJaggedTensor stride={stride} (the batch size) with {len(keys)} keys {keys} needs "
            f"{stride * len(keys)} lengths, got {lengths.numel()} (a batch of {lengths.numel() // len(keys)}); "
            "pass the batch's real size as stride, or leave stride out to infer it from the lengths"
        )


@torch.jit.unused
def check_lengths_and_weights(
    keys: List[str], lengths: torch.Tensor, weights: Optional[torch.Tensor], stride_per_key: Optional[List[int]]
) -> None:
    """No negative length, no NaN or infinite weight: reads the data (one host read each).

    A negative length whose neighbours make the lengths still sum to the number of values used
    to fail inside the lookup kernel; a NaN weight made every pooled output of its sample NaN.
    Raises ``SparseValueError`` naming the feature, the sample and the value.

    Args:
        keys: ``[F]`` feature names, at least one; ``lengths`` is key-major.
        lengths: ``[sum B_k]`` lengths (sizes already checked by :func:`check_layout_sizes`).
        weights: ``[N]`` per-id weights, or None to skip the weight check.
        stride_per_key: ``[F]`` batch size of each key of a variable-batch KJT, else None (equal batches).
    """
    # min(): one pass, no temporary. On the host it is ~4x cheaper than (lengths < 0).any(), and than
    # amin() for int64 lengths (53k int64: 12 against 52 and 62 us; torch 2.13, one thread).
    if lengths.numel() > 0 and int(lengths.min()) < 0:
        strides = stride_per_key if stride_per_key is not None else [lengths.numel() // len(keys)] * len(keys)
        position = int(torch.nonzero(lengths < 0)[0, 0])
        key, sample = _key_and_sample(keys, strides, position)
        raise SparseValueError(
            f"KeyedJaggedTensor feature {key!r} has a negative length: {int(lengths[position])} ids for sample "
            f"{sample} (lengths[{position}]); a length counts the ids of one sample and must be non-negative. Fix how "
            "the batch's lengths are built (the lengths of a feature are the sizes of its samples' id lists)"
        )
    if weights is None or weights.numel() == 0 or not weights.is_floating_point():
        return
    if bool(torch.isfinite(weights).all()):
        return
    strides = stride_per_key if stride_per_key is not None else [lengths.numel() // len(keys)] * len(keys)
    bad = int(torch.nonzero(torch.logical_not(torch.isfinite(weights)))[0, 0])
    ends = torch.cumsum(lengths.long(), 0)
    bag = int(torch.searchsorted(ends, torch.tensor(bad, dtype=ends.dtype, device=ends.device), right=True))
    key, sample = _key_and_sample(keys, strides, bag)
    raise SparseValueError(
        f"KeyedJaggedTensor feature {key!r} has a non-finite weight {float(weights[bad])} for sample {sample} "
        f"(weights[{bad}]); per-id weights must be finite numbers (a NaN or infinite weight makes the pooled "
        "embedding of the sample NaN). Replace or drop it where the weights are computed"
    )


def _key_and_sample(keys: List[str], strides: List[int], position: int) -> Tuple[str, int]:
    """The key and sample of entry ``position`` of key-major ``lengths`` with ``strides[k]`` entries per key."""
    start = 0
    for key, stride in zip(keys, strides):
        if position < start + stride:
            return key, position - start
        start += stride
    return keys[-1], position - start


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


def _check_surplus(keys: List[str], values: torch.Tensor, lengths: torch.Tensor) -> None:
    """Name the surplus of values beyond the lengths (``_check_lengths_offsets`` catches a shortfall)."""
    total = int(lengths.sum()) if lengths.numel() > 0 else 0
    if total < values.size(0):
        raise SparseValueError(
            f"KeyedJaggedTensor has {values.size(0) - total} values beyond the last feature {keys[-1]!r}: "
            f"lengths sum to {total} but values has {values.size(0)} entries, so the surplus ids would be "
            "dropped silently; lengths must count every value exactly once"
        )


def _check_inverse_indices(
    keys: List[str], inverse: Optional[Tuple[List[str], torch.Tensor]], stride_per_key: Optional[List[int]]
) -> None:
    """``(keys, [F', B])``, and, for a variable-batch KJT, each row of a key of the KJT picks bags of
    that key's own batch: ``0 <= inverse_indices[1][i] < B_k`` (an index past it fails in the lookup's
    ``index_select``, on CUDA as a device-side assert)."""
    if inverse is None:
        return
    if inverse[1].dim() != 2 or inverse[1].size(0) != len(inverse[0]):
        raise SparseValueError(
            f"inverse_indices must be (keys, [len(keys), B]), got {len(inverse[0])} keys and a tensor of "
            f"shape {list(inverse[1].shape)}"
        )
    if stride_per_key is None or inverse[1].numel() == 0:
        return
    batch_of = dict(zip(keys, stride_per_key))
    for row, key in enumerate(inverse[0]):
        if key not in batch_of:
            continue
        low, high = (int(v) for v in inverse[1][row].aminmax())
        if low < 0 or high >= batch_of[key]:
            raise SparseValueError(
                f"inverse_indices row of feature {key!r} holds indices in [{low}, {high}] but the feature has "
                f"{batch_of[key]} bags (sum(stride_per_key_per_rank[k])); each entry picks one of its bags"
            )
