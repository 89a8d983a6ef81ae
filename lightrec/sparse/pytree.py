"""The sparse types as pytree nodes: ``torch.export``, ``torch.compile`` and DataLoader collation see
through them.

Each type flattens to its tensors (leaves) and keeps the host-side layout as the context::

    JaggedTensor       leaves [values, weights, lengths, offsets]     context None
    KeyedJaggedTensor  leaves [values, weights, lengths]              context keys
                       (variable-batch: + [inverse_indices tensor]    context (keys, strides, inverse keys))
    KeyedTensor        leaves [values]                                context (keys, length_per_key, key_dim)

``flatten_with_keys`` names every leaf by its attribute (what ``torch.export`` needs to describe
inputs), and the fx flatten specs let an exported program take these types as inputs: a
``KeyedTensor`` whose keys come in another order than at export time is regrouped to that order
(torchrec does the same). Registration happens once, when ``lightrec.sparse`` is imported.

The three types are also safe globals of ``torch.load(weights_only=True)``: ``torch.export.save``
pickles a program's example inputs, and without this ``torch.export.load`` of a program traced on
a KJT falls back to unpickling with code execution. They hold tensors, lists and strings only.
"""

from typing import Any, List, Optional, Tuple

import torch
from torch.fx._pytree import register_pytree_flatten_spec
from torch.utils._pytree import GetAttrKey, TreeSpec, register_pytree_node

from lightrec.sparse.jagged import JaggedTensor
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.keyed_tensor import KeyedTensor

__all__: List[str] = []

_JT_FIELDS = ("_values", "_weights", "_lengths", "_offsets")
_KJT_FIELDS = ("_values", "_weights", "_lengths", "_inverse_indices")


# ------------------------------------------------------------------------------ JaggedTensor
def _jt_flatten(jt: JaggedTensor) -> Tuple[List[Optional[torch.Tensor]], None]:
    return [jt.values(), jt.weights_or_none(), jt.lengths_or_none(), jt.offsets_or_none()], None


def _jt_flatten_with_keys(jt: JaggedTensor) -> Tuple[List[Tuple[Any, Any]], Any]:
    leaves, context = _jt_flatten(jt)
    return [(GetAttrKey(name), leaf) for name, leaf in zip(_JT_FIELDS, leaves, strict=True)], context


def _jt_unflatten(leaves: Any, context: None) -> JaggedTensor:
    values, weights, lengths, offsets = list(leaves)
    return JaggedTensor(values=values, weights=weights, lengths=lengths, offsets=offsets)


# ------------------------------------------------------------------------------ KeyedJaggedTensor
def _kjt_flatten(kjt: KeyedJaggedTensor) -> Tuple[List[Optional[torch.Tensor]], Any]:
    leaves: List[Optional[torch.Tensor]] = [kjt.values(), kjt.weights_or_none(), kjt.lengths()]
    if not kjt.variable_stride_per_key():
        return leaves, kjt.keys()
    inverse = kjt.inverse_indices_or_none()
    leaves.append(inverse[1] if inverse is not None else None)
    context = (kjt.keys(), kjt.stride_per_key_per_rank(), inverse[0] if inverse is not None else None)
    return leaves, context


def _kjt_flatten_with_keys(kjt: KeyedJaggedTensor) -> Tuple[List[Tuple[Any, Any]], Any]:
    leaves, context = _kjt_flatten(kjt)
    return [(GetAttrKey(name), leaf) for name, leaf in zip(_KJT_FIELDS, leaves, strict=False)], context


def _kjt_unflatten(leaves: Any, context: Any) -> KeyedJaggedTensor:
    tensors = list(leaves)
    if not isinstance(context, tuple):
        return KeyedJaggedTensor(keys=context, values=tensors[0], weights=tensors[1], lengths=tensors[2])
    keys, strides, inverse_keys = context
    inverse = (inverse_keys, tensors[3]) if inverse_keys is not None else None
    return KeyedJaggedTensor(
        keys=keys,
        values=tensors[0],
        weights=tensors[1],
        lengths=tensors[2],
        stride_per_key_per_rank=strides,
        inverse_indices=inverse,
    )


def _kjt_flatten_spec(kjt: KeyedJaggedTensor, spec: TreeSpec) -> List[Optional[torch.Tensor]]:
    return _kjt_flatten(kjt)[0]


# ------------------------------------------------------------------------------ KeyedTensor
def _kt_flatten(kt: KeyedTensor) -> Tuple[List[torch.Tensor], Tuple[List[str], List[int], int]]:
    return [kt.values()], (kt.keys(), kt.length_per_key(), kt.key_dim())


def _kt_flatten_with_keys(kt: KeyedTensor) -> Tuple[List[Tuple[Any, Any]], Any]:
    leaves, context = _kt_flatten(kt)
    return [(GetAttrKey("_values"), leaves[0])], context


def _kt_unflatten(leaves: Any, context: Tuple[List[str], List[int], int]) -> KeyedTensor:
    keys, length_per_key, key_dim = context
    return KeyedTensor(keys=keys, length_per_key=length_per_key, values=list(leaves)[0], key_dim=key_dim)


def _kt_flatten_spec(kt: KeyedTensor, spec: TreeSpec) -> List[torch.Tensor]:
    keys = spec.context[0]
    if kt.keys() == keys:
        return [kt.values()]
    # the exported program was traced with another key order: hand it the blocks in that order
    return [KeyedTensor.regroup([kt], [list(keys)])[0]]


register_pytree_node(
    JaggedTensor,
    _jt_flatten,
    _jt_unflatten,
    flatten_with_keys_fn=_jt_flatten_with_keys,
    serialized_type_name="lightrec.JaggedTensor",
)
register_pytree_node(
    KeyedJaggedTensor,
    _kjt_flatten,
    _kjt_unflatten,
    flatten_with_keys_fn=_kjt_flatten_with_keys,
    serialized_type_name="lightrec.KeyedJaggedTensor",
)
register_pytree_node(
    KeyedTensor,
    _kt_flatten,
    _kt_unflatten,
    flatten_with_keys_fn=_kt_flatten_with_keys,
    serialized_type_name="lightrec.KeyedTensor",
)
register_pytree_flatten_spec(JaggedTensor, lambda jt, spec: _jt_flatten(jt)[0])
register_pytree_flatten_spec(KeyedJaggedTensor, _kjt_flatten_spec)
register_pytree_flatten_spec(KeyedTensor, _kt_flatten_spec)
torch.serialization.add_safe_globals([JaggedTensor, KeyedJaggedTensor, KeyedTensor])
