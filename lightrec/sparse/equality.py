"""``jt_is_equal`` / ``kjt_is_equal``: torchrec's structural equality of sparse batches.

Two JaggedTensors are equal when their values, weights, lengths and offsets are (``allclose``
for tensors, so float weights compare with a tolerance); a missing optional part equals only
another missing one. Lengths and offsets are completed from each other first, since the same
batch can be built from either. Two KeyedJaggedTensors are equal when, on top of that, their keys
(in order), per-key lengths and offsets and stride agree. Anything that is not of the type
compares unequal (no exception), as in torchrec; tensors of different dtypes compare by value.

Both are ``torch.fx.wrap``-ed: a traced model keeps them as one call each.
"""

from collections.abc import Callable
from typing import Any

import torch

from lightrec.sparse.jagged import JaggedTensor
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor

__all__ = ["jt_is_equal", "kjt_is_equal"]


def _same(a: Any, b: Any) -> bool:
    """Both missing, or both present and equal (tensors: same shape and ``allclose``).

    Tensors of different dtypes (int32 against int64 lengths) are compared in their common dtype,
    as ``torch.equal`` does (``allclose`` alone raises on them).
    """
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.size() != b.size():
            return False
        common = torch.promote_types(a.dtype, b.dtype)
        return bool(torch.allclose(a.to(common), b.to(common)))
    return bool(a == b)


def _complete_lengths_offsets(jagged: JaggedTensor | KeyedJaggedTensor) -> None:
    if jagged.offsets_or_none() is not None and jagged.lengths_or_none() is None:
        jagged.lengths()
    elif jagged.lengths_or_none() is not None and jagged.offsets_or_none() is None:
        jagged.offsets()


def _all_same(pairs: list[tuple[Any, Any]], same: Callable[[Any, Any], bool] = _same) -> bool:
    return all(same(a, b) for a, b in pairs)


@torch.fx.wrap
def jt_is_equal(jt_1: JaggedTensor, jt_2: JaggedTensor) -> bool:
    """Whether two JaggedTensors hold the same values, weights, lengths and offsets."""
    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    if not _same(jt_1.values(), jt_2.values()):
        return False
    _complete_lengths_offsets(jt_1)
    _complete_lengths_offsets(jt_2)
    return _all_same(
        [
            (jt_1.weights_or_none(), jt_2.weights_or_none()),
            (jt_1.lengths_or_none(), jt_2.lengths_or_none()),
            (jt_1.offsets_or_none(), jt_2.offsets_or_none()),
        ]
    )


@torch.fx.wrap
def kjt_is_equal(kjt_1: KeyedJaggedTensor, kjt_2: KeyedJaggedTensor) -> bool:
    """Whether two KeyedJaggedTensors have the same keys (in order) and the same jagged data."""
    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    if kjt_1.keys() != kjt_2.keys():
        return False
    if not _same(kjt_1.values(), kjt_2.values()):
        return False
    _complete_lengths_offsets(kjt_1)
    _complete_lengths_offsets(kjt_2)
    kjt_1.sync()
    kjt_2.sync()
    return _all_same(
        [
            (kjt_1.lengths_or_none(), kjt_2.lengths_or_none()),
            (kjt_1.weights_or_none(), kjt_2.weights_or_none()),
            (kjt_1.offsets_or_none(), kjt_2.offsets_or_none()),
            (kjt_1.length_per_key_or_none(), kjt_2.length_per_key_or_none()),
            (kjt_1.offset_per_key_or_none(), kjt_2.offset_per_key_or_none()),
            (kjt_1.stride(), kjt_2.stride()),
        ]
    )
