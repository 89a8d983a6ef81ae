"""The tensor work of reshaping a ``KeyedJaggedTensor``: stacking, permuting and expanding keys.

Every function takes a KJT's parts -- ``values`` ``[N]``, ``weights`` ``[N]`` or None, key-major
``lengths`` ``[sum B_k]``, host lists such as ``length_per_key`` ``[F]`` -- and returns new parts;
``KeyedJaggedTensor`` builds the result. Taking parts rather than a KJT keeps TorchScript from
compiling the class twice (it compiles these functions from the class's methods) and keeps the
imports one way (``keyed_jagged_tensor`` imports this file, never the reverse)::

    key        |  a (B_a = 2)  |  b (B_b = 2)
    lengths    |  2      1     |  0      1         permute([1, 0]) moves whole key blocks:
    values     |  7, 8   9     |         4         lengths [0, 1, 2, 1], values [4, 7, 8, 9]
"""

from typing import Dict, List, Optional, Tuple

import torch

from lightrec.sparse._ops import complete_cumsum, permute_2d_sparse
from lightrec.sparse.jagged import SparseValueError
from lightrec.sparse.variable_batch import expand_segment, permute_segments

__all__ = [
    "check_concat_inputs",
    "check_permute_indices",
    "check_split_segments",
    "checked_inverse_indices",
    "concat_inverse_indices",
    "concat_key_lists",
    "expand_to_fixed_batch",
    "key_positions",
    "offsets_per_key",
    "permute_fixed_batch",
    "permute_variable_batch",
    "slice_per_key",
    "split_bounds",
    "stack_features",
]


def stack_features(
    keys: List[str],
    values: List[torch.Tensor],
    weights: List[Optional[torch.Tensor]],
    lengths: List[torch.Tensor],
    variable_batch: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, Optional[int], Optional[List[List[int]]]]:
    """One KJT's parts from the parts of one ``JaggedTensor`` per key (``from_jt_dict``).

    Features of different batch sizes are refused (``SparseValueError`` naming them), or, with
    ``variable_batch``, make a variable-batch KJT (``stride_per_key_per_rank`` ``[[B_k]]``).
    Either every feature has weights or none has.

    Args:
        keys: ``[F]`` feature names, at least one.
        values / weights / lengths: ``[F]`` lists of each feature's ``[N_k]`` ids, ``[N_k]``
            weights (or None) and ``[B_k]`` lengths.
        variable_batch: accept different batch sizes (a variable-batch KJT).

    Returns:
        ``(values [N], weights [N] or None, lengths [sum B_k], stride or None,
        stride_per_key_per_rank or None)``.
    """
    strides = [feature_lengths.numel() for feature_lengths in lengths]
    stride: Optional[int] = strides[0]
    stride_per_key_per_rank: Optional[List[List[int]]] = None
    for b in strides:
        if b != strides[0]:
            if not variable_batch:
                sizes = {k: n for k, n in zip(keys, strides)}
                raise SparseValueError(
                    f"from_jt_dict: the JaggedTensors have different batch sizes {sizes}; every feature needs one "
                    "length per sample of the batch, 0 for a sample without ids. Pad the shorter ones with zero "
                    "lengths, or pass variable_batch=True for a variable-batch KeyedJaggedTensor"
                )
            stride = None
            stride_per_key_per_rank = [[b] for b in strides]
            break
    weighted = [w is not None for w in weights]
    if any(weighted) and not all(weighted):
        missing: List[str] = []  # a loop: TorchScript compiles no comprehension with an ``if``
        for k, has_weights in zip(keys, weighted):
            if not has_weights:
                missing.append(k)
        raise SparseValueError(
            f"from_jt_dict: features {missing} have no weights while others do; weight all or none"
        )
    out_weights: Optional[torch.Tensor] = None
    if all(weighted):
        present: List[torch.Tensor] = []
        for w in weights:
            if w is not None:
                present.append(w)
        out_weights = torch.cat(present)
    return torch.cat(values), out_weights, torch.cat(lengths), stride, stride_per_key_per_rank


def check_split_segments(segments: List[int], num_keys: int) -> None:
    """Raise ``ValueError`` unless the groups of ``segments[i] >= 0`` keys cover the ``num_keys`` keys."""
    for seg in segments:
        if seg < 0:
            raise ValueError(f"split(segments={segments}): a segment is a number of keys, got {seg}")
    if sum(segments) != num_keys:
        raise ValueError(
            f"split(segments={segments}) must cover the {num_keys} keys exactly, "
            f"but the segments sum to {sum(segments)}"
        )


def split_bounds(segments: List[int], length_per_key: List[int]) -> List[Tuple[int, int, int, int]]:
    """``(first key, end key, first value, end value)`` of each consecutive group of ``segments[i]`` keys.

    Args:
        segments: ``[S]`` keys per group, summing to ``F`` (:func:`check_split_segments`).
        length_per_key: ``[F]`` ids of each key.
    """
    bounds: List[Tuple[int, int, int, int]] = []
    key_start = 0
    value_start = 0
    for seg in segments:
        key_end = key_start + seg
        value_end = value_start + sum(length_per_key[key_start:key_end])
        bounds.append((key_start, key_end, value_start, value_end))
        key_start = key_end
        value_start = value_end
    return bounds


def slice_per_key(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: torch.Tensor,
    offset_per_key: List[int],
    lengths_offset_per_key: List[int],
) -> List[Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]]:
    """``(values, weights, lengths)`` views of each key (``to_dict``): no copies.

    Args:
        values / weights: ``[N]``; lengths ``[sum B_k]``, key-major.
        offset_per_key: ``[F + 1]`` start of each key's ids; lengths_offset_per_key ``[F + 1]`` of its lengths.
    """
    parts: List[Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]] = []
    for i in range(len(offset_per_key) - 1):
        start = offset_per_key[i]
        end = offset_per_key[i + 1]
        parts.append(
            (
                values[start:end],
                weights[start:end] if weights is not None else None,
                lengths[lengths_offset_per_key[i] : lengths_offset_per_key[i + 1]],
            )
        )
    return parts


def offsets_per_key(
    lengths_per_key: List[torch.Tensor], lengths: torch.Tensor, stride: int, variable_batch: bool
) -> List[torch.Tensor]:
    """``[B_k + 1]`` offsets of each key's lengths, each from 0 (``to_dict``'s JaggedTensors).

    A fixed-batch KJT gets them in one running sum over its ``[F, B]`` lengths (as torchrec);
    a variable-batch one key by key.

    Args:
        lengths_per_key: ``[F]`` each key's ``[B_k]`` lengths (views of ``lengths``).
        lengths: ``[sum B_k]`` key-major lengths; stride: ``B`` of a fixed-batch KJT.
    """
    num_keys = len(lengths_per_key)
    if not variable_batch and num_keys > 0 and lengths.numel() == num_keys * stride:
        running = torch.cumsum(lengths.view(num_keys, stride), 1).to(lengths.dtype)
        return list(torch.unbind(torch.nn.functional.pad(running, [1, 0]), 0))
    offsets: List[torch.Tensor] = []
    for key_lengths in lengths_per_key:
        offsets.append(complete_cumsum(key_lengths))
    return offsets


def key_positions(keys: List[str], index_per_key: Dict[str, int], own_keys: List[str]) -> List[int]:
    """Position of each of ``keys`` among ``own_keys`` (``permute_to_keys``).

    Raises ``KeyError`` naming the first key of ``keys`` that is not one of ``own_keys``.
    """
    indices: List[int] = []
    for k in keys:
        if k not in index_per_key:
            raise KeyError(
                "feature " + k + " is not in this KeyedJaggedTensor; its keys are " + ", ".join(own_keys)
            )
        indices.append(index_per_key[k])
    return indices


def check_concat_inputs(variable: List[bool], strides: List[int], weighted: List[bool]) -> None:
    """Raise ``ValueError`` unless KJTs can be put side by side (``KeyedJaggedTensor.concat``).

    Args:
        variable: whether each KJT is variable-batch; all must agree.
        strides: each KJT's batch size, all equal (empty for variable-batch KJTs: not compared).
        weighted: whether each KJT has weights; all must agree.
    """
    for i in range(len(variable)):
        if variable[i] != variable[0]:
            raise ValueError("KeyedJaggedTensor.concat needs all inputs variable-batch or all fixed-batch")
        if len(strides) > 0 and strides[i] != strides[0]:
            raise ValueError(f"KeyedJaggedTensor.concat needs one batch size, got strides {strides}")
        if weighted[i] != weighted[0]:
            raise ValueError("KeyedJaggedTensor.concat needs all inputs weighted or all unweighted")


def concat_inverse_indices(
    inverses: List[Optional[Tuple[List[str], torch.Tensor]]],
) -> Optional[Tuple[List[str], torch.Tensor]]:
    """The inverse indices of KJTs put side by side: their keys and ``[F_i, B]`` rows stacked
    (None when none has any).

    A key's row is taken once, from the first KJT that has it: the parts of a ``split`` or
    ``permute`` each carry the whole ``(keys, [F, B])`` of their source, and concatenating them
    gives back that source's inverse indices, not ``F`` rows per part.
    """
    keys: List[str] = []
    rows: List[torch.Tensor] = []
    for inverse in inverses:
        if inverse is not None:
            inverse_keys = inverse[0]
            fresh: List[int] = []
            for i in range(len(inverse_keys)):
                if inverse_keys[i] not in keys:
                    keys.append(inverse_keys[i])
                    fresh.append(i)
            if len(fresh) == len(inverse_keys):
                rows.append(inverse[1])
            elif len(fresh) > 0:
                rows.append(inverse[1].index_select(0, torch.tensor(fresh, dtype=torch.long, device=inverse[1].device)))
    if len(rows) == 0:
        return None
    return keys, torch.cat(rows)


def concat_key_lists(
    keys: List[List[str]], length_per_key: List[List[int]], stride_per_key_per_rank: List[List[List[int]]]
) -> Tuple[List[str], List[int], List[List[int]]]:
    """The per-key host lists of KJTs put side by side, each list of lists joined in order."""
    out_keys: List[str] = []
    out_lengths: List[int] = []
    out_strides: List[List[int]] = []
    for i in range(len(keys)):
        out_keys.extend(keys[i])
        out_lengths.extend(length_per_key[i])
        out_strides.extend(stride_per_key_per_rank[i])
    return out_keys, out_lengths, out_strides


def check_permute_indices(indices: List[int], keys: List[str]) -> None:
    """Raise ``IndexError`` naming the first of ``indices`` that is not a position in ``keys``."""
    num_keys = len(keys)
    for i in indices:
        if i < 0 or i >= num_keys:
            raise IndexError(f"permute: index {i} is out of range for {num_keys} keys {keys}")


def permute_fixed_batch(
    indices: List[int],
    indices_tensor: Optional[torch.Tensor],
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    length_per_key: List[int],
    stride: int,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Key ``i`` of the output is key ``indices[i]`` of a fixed-batch KJT (one kernel call).

    Args:
        indices: ``[F_out]`` source key of each output key (keys may repeat or be left out).
        indices_tensor: ``indices`` already on the device as int32, or None to build it.
        lengths: ``[F * stride]`` key-major lengths; values / weights ``[N]``.
        length_per_key: ``[F]`` ids of each key (host list: sizes the output without a sync).

    Returns:
        ``(lengths [F_out * stride], values, weights)``.
    """
    if indices_tensor is None:
        indices_tensor = torch.tensor(indices, dtype=torch.int32, device=values.device)
    lengths2d = lengths.view(len(length_per_key), stride)
    # The output size from the host-side sizes: the kernel need not read it from the device.
    total = 0
    for i in indices:
        total += length_per_key[i]
    out_lengths, out_values, out_weights = permute_2d_sparse(indices_tensor, lengths2d, values, weights, total)
    return out_lengths.view(-1), out_values, out_weights


def permute_variable_batch(
    indices: List[int],
    stride_per_key: List[int],
    length_per_key: List[int],
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``permute`` of a variable-batch KJT: whole key segments moved (no ``[K, B]`` view), any device.

    Returns:
        ``(lengths, values, weights)`` with key ``i`` holding source key ``indices[i]``.
    """
    out_lengths, _ = permute_segments(indices, stride_per_key, lengths, None)
    out_values, out_weights = permute_segments(indices, length_per_key, values, weights)
    return out_lengths, out_values, out_weights


@torch.jit.unused
def checked_inverse_indices(
    keys: List[str],
    stride_per_key_per_rank: List[List[int]],
    inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
) -> Tuple[List[str], torch.Tensor]:
    """``to_fixed_batch``'s check: the inverse indices exist and hold a row for every key.

    Args:
        keys: ``[F]`` the variable-batch KJT's keys.
        stride_per_key_per_rank: ``[F][R]`` its batch sizes (named in the error).
        inverse_indices: ``(keys, [F', B])`` or None.

    Returns:
        ``inverse_indices``, known present.
    """
    if inverse_indices is None:
        raise ValueError(
            f"to_fixed_batch: this variable-batch KeyedJaggedTensor (stride_per_key_per_rank="
            f"{stride_per_key_per_rank}) has no inverse_indices to expand it by; pass "
            "inverse_indices=(keys, [len(keys), B])"
        )
    inverse_keys = inverse_indices[0]
    missing = [k for k in keys if k not in inverse_keys]
    if len(missing) > 0:
        raise ValueError(
            f"to_fixed_batch: inverse_indices has no row for keys {missing}; its keys are {inverse_keys}"
        )
    return inverse_indices


@torch.jit.unused
def expand_to_fixed_batch(
    keys: List[str],
    jt_parts: List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]],
    inverse_keys: List[str],
    rows: torch.Tensor,
    values_if_no_keys: torch.Tensor,
    lengths_if_no_keys: torch.Tensor,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """The tensor work of ``to_fixed_batch``: each key's bags picked by its row of inverse indices.

    Args:
        keys: ``[F]`` the KJT's keys, each in ``inverse_keys`` (see :func:`checked_inverse_indices`).
        jt_parts: ``(lengths [B_k], values, weights or None)`` of each key, in key order.
        inverse_keys / rows: the inverse indices, ``rows`` ``[F', B]``.
        values_if_no_keys / lengths_if_no_keys: the (empty) KJT's own tensors, returned when there
            are no keys to expand.

    Returns:
        ``(values, weights or None, lengths [F * B])``.
    """
    row_of_key: Dict[str, int] = {k: i for i, k in enumerate(inverse_keys)}
    lengths: List[torch.Tensor] = []
    values: List[torch.Tensor] = []
    weights: List[torch.Tensor] = []
    for key, (key_lengths, key_values, key_weights) in zip(keys, jt_parts):
        out_lengths, out_values, out_weights = expand_segment(
            key_lengths, key_values, key_weights, rows[row_of_key[key]]
        )
        lengths.append(out_lengths)
        values.append(out_values)
        if out_weights is not None:
            weights.append(out_weights)
    return (
        torch.cat(values) if len(values) > 0 else values_if_no_keys,
        torch.cat(weights) if len(weights) > 0 else None,
        torch.cat(lengths) if len(lengths) > 0 else lengths_if_no_keys,
    )

