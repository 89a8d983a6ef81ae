"""Regrouping pooled embeddings: the helpers behind ``KeyedTensor.regroup`` that torchrec's tests and
extensions call by name (``torchrec.sparse.jagged_tensor`` re-exports them).

A regroup takes the key blocks of one or more ``KeyedTensor`` s (``key_dim=1``) and lays them out
again, one output tensor per group of keys::

    inputs   kt0: | a (1) | b (2) |      kt1: | c (3) |          groups = [["c", "a"], ["b", "a"], ["a"]]
    outputs  0: | c | a |    1: | b | a |    2: | a |             widths [4, 3, 1]

* :func:`_all_keys_used_once` -- whether the groups use every key exactly once (a permutation);
* :func:`_fbgemm_permute_pooled_embs` -- the regroup as one column permutation of the concatenated
  values (fbgemm's ``permute_pooled_embs_auto_grad`` for a permutation when fbgemm is loaded, else
  one ``index_select``); differentiable either way;
* :func:`_kt_regroup_arguments` -- the ``[P, 6]`` plan fbgemm's ``permute_multi_embedding`` reads
  (computed here in Python, so it needs no fbgemm).

:func:`~lightrec.sparse.keyed_tensor._regroup_keyed_tensors` (concatenation) is the reference all of
them are tested against.
"""

from typing import Dict, List, Tuple

import torch

from lightrec._fbgemm import has_fbgemm_op
from lightrec.sparse.keyed_tensor import KeyedTensor

__all__ = ["_all_keys_used_once", "_fbgemm_permute_pooled_embs", "_kt_regroup_arguments"]

# fbgemm's permute op moves whole column blocks; chosen once, like lightrec.sparse._ops.
_FBGEMM_PERMUTE: bool = has_fbgemm_op("permute_pooled_embs_auto_grad")

# The columns of one row of the plan ``_kt_regroup_arguments`` returns.
IN_TENSOR, OUT_TENSOR, IN_START, OUT_START, LENGTH, JUMP = range(6)


def _running_sum(xs: List[int]) -> List[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


@torch.fx.wrap
def _all_keys_used_once(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> bool:
    """Whether no key repeats (across the inputs, and across the groups) and the groups hold as many
    keys as the inputs: then a regroup is a permutation of the input columns."""
    flat_keys: List[str] = []
    for kt in keyed_tensors:
        flat_keys.extend(kt.keys())
    flat_groups: List[str] = []
    for group in groups:
        flat_groups.extend(group)
    distinct_keys = len(set(flat_keys))
    distinct_groups = len(set(flat_groups))
    return distinct_keys == len(flat_keys) == distinct_groups == len(flat_groups)


def _column_plan(
    keyed_tensors: List[KeyedTensor], groups: List[List[str]]
) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``(key order, key widths, key starts in the concatenated values, group widths)``.

    Raises:
        KeyError: a group names a key that no input holds.
    """
    start_of: Dict[str, int] = {}
    width_of: Dict[str, int] = {}
    index_of: Dict[str, int] = {}
    offset = 0
    for kt in keyed_tensors:
        for key, width in zip(kt.keys(), kt.length_per_key()):
            index_of[key] = len(index_of) if key not in index_of else index_of[key]
            start_of[key], width_of[key] = offset, width
            offset += width
    order: List[int] = []
    group_widths: List[int] = []
    for group in groups:
        total = 0
        for key in group:
            if key not in start_of:
                raise KeyError(f"regroup: key {key!r} is in no KeyedTensor; the inputs hold {sorted(start_of)}")
            order.append(index_of[key])
            total += width_of[key]
        group_widths.append(total)
    widths = [width_of[k] for k in index_of]
    starts = [start_of[k] for k in index_of]
    return order, widths, starts, group_widths


@torch.fx.wrap
def _fbgemm_permute_pooled_embs(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> List[torch.Tensor]:
    """``KeyedTensor.regroup`` as one column permutation of the inputs' concatenated values.

    Args:
        keyed_tensors: ``KeyedTensor`` s with ``key_dim=1`` and the same batch ``B``.
        groups: the keys of each output, in order (a key may be used by several groups).

    Returns:
        One ``[B, sum of the group's widths]`` tensor per group; gradients flow back to the inputs.
    """
    order, widths, starts, group_widths = _column_plan(keyed_tensors, groups)
    values = torch.cat([kt.values() for kt in keyed_tensors], dim=1)
    device = values.device
    if _FBGEMM_PERMUTE and _all_keys_used_once(keyed_tensors, groups):
        # a permutation of whole key blocks: fbgemm moves them without building a column index
        permuted_widths = [widths[i] for i in order]
        inverse = [0] * len(order)
        for position, key in enumerate(order):
            inverse[key] = position
        permuted = torch.ops.fbgemm.permute_pooled_embs_auto_grad(
            values,
            torch.tensor(_running_sum(widths), dtype=torch.int64, device=device),
            torch.tensor(order, dtype=torch.int64, device=device),
            torch.tensor(_running_sum(permuted_widths), dtype=torch.int64, device=device),
            torch.tensor(inverse, dtype=torch.int64, device=device),
        )
    else:  # repeated or left-out keys: gather the columns
        columns: List[int] = []
        for key in order:
            columns.extend(range(starts[key], starts[key] + widths[key]))
        permuted = values.index_select(1, torch.tensor(columns, dtype=torch.int64, device=device))
    return list(torch.split(permuted, group_widths, dim=1))


def _kt_regroup_arguments(
    value: torch.Tensor,
    keys: List[List[str]],
    key_lengths: List[List[int]],
    groups: List[List[str]],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
    """The plan of fbgemm's ``permute_multi_embedding`` for a regroup.

    Args:
        value: any tensor on the device the plan is for.
        keys: ``keys[t]``: the keys of input tensor ``t``, in column order.
        key_lengths: ``key_lengths[t][k]``: the width of key ``k`` of input ``t``.
        groups: the keys of each output, in order.

    Returns:
        ``(permutes [P, 6] int32, in_shapes [T] int32, out_shapes [G] int32, out_lengths)``: one row
        of ``permutes`` per (group, key) in output order, holding the input tensor, the output
        tensor, the input column, the output column, the width and the *jump*; ``in_shapes`` /
        ``out_shapes`` / ``out_lengths`` are the widths of the inputs and of the outputs.

        The jump chains the rows that copy the same key (fbgemm's backward sums their gradients):
        0 for a key used once; for a key used ``n > 1`` times, its first row holds the index of
        its second row, every later row but the last ``-(index of the next row)``, and the last
        ``-P``.
    """
    where: Dict[str, Tuple[int, int]] = {}
    for t, tensor_keys in enumerate(keys):
        for k, key in enumerate(tensor_keys):
            where[key] = (t, k)
    in_starts = [_running_sum(lengths) for lengths in key_lengths]
    total = sum(len(group) for group in groups)
    rows: List[List[int]] = []
    out_lengths: List[int] = []
    first: Dict[str, int] = {}  # key -> the first row that copies it
    previous: Dict[str, int] = {}  # key -> the row that copied it last
    for g, group in enumerate(groups):
        out_start = 0
        for key in group:
            if key not in where:
                raise KeyError(f"_kt_regroup_arguments: key {key!r} is in none of the inputs' keys {keys}")
            t, k = where[key]
            width = key_lengths[t][k]
            row = len(rows)
            jump = 0
            if key in previous:
                before = previous[key]
                # the first row points forward with a positive index, later ones with a negative one
                rows[before][JUMP] = row if before == first[key] else -row
                jump = -total
            else:
                first[key] = row
            previous[key] = row
            rows.append([t, g, in_starts[t][k], out_start, width, jump])
            out_start += width
        out_lengths.append(out_start)
    device = value.device
    permutes = torch.tensor(rows, dtype=torch.int32).reshape(-1, 6).to(device)
    in_shapes = torch.tensor([sum(lengths) for lengths in key_lengths], dtype=torch.int32).to(device)
    out_shapes = torch.tensor(out_lengths, dtype=torch.int32).to(device)
    return permutes, in_shapes, out_shapes, out_lengths

