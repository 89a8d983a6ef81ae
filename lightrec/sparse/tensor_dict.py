"""``maybe_td_to_kjt``: a ``tensordict.TensorDict`` of jagged features as a ``KeyedJaggedTensor``
(torchrec's ``torchrec.sparse.tensor_dict``).

Pipelines built on TensorDict keep one jagged nested tensor per feature (``layout=torch.jagged``,
``[B, j]``: sample ``b`` holds its ids); the embedding collections read a KJT. The conversion lays
the features out key-major, without copying more than one ``cat`` of the values and of the lengths::

    td["f"] = [[1, 2], [3]]      td["g"] = [[], [4, 5, 6]]      (B = 2)
    ->  keys ["f", "g"]   values [1, 2, 3, 4, 5, 6]   lengths [2, 1, 0, 3]

tensordict is optional: without it installed nothing can be a TensorDict, and every input is
returned as it came (the module never imports tensordict itself).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor

__all__ = ["is_tensor_dict", "maybe_td_to_kjt"]


def is_tensor_dict(value: object) -> bool:
    """Whether ``value`` is a ``tensordict.TensorDict`` (False when tensordict was never imported)."""
    module = sys.modules.get("tensordict")
    tensor_dict = getattr(module, "TensorDict", None) if module is not None else None
    return tensor_dict is not None and isinstance(value, tensor_dict)


def _lengths_of(key: str, feature: Any) -> torch.Tensor:
    """Per-sample lengths ``[B]`` of one jagged nested tensor."""
    if not isinstance(feature, torch.Tensor) or not feature.is_nested or feature.layout != torch.jagged:
        raise TypeError(
            f"maybe_td_to_kjt: feature {key!r} must be a jagged nested tensor (torch.nested.nested_tensor(..., "
            f"layout=torch.jagged)), got {type(feature).__name__}"
            + (f" with layout {feature.layout}" if isinstance(feature, torch.Tensor) else "")
        )
    # a jagged nested tensor keeps its layout as lengths or offsets (NestedTensor's methods)
    lengths: torch.Tensor | None = feature.lengths()  # type: ignore[attr-defined]
    return lengths if lengths is not None else torch.diff(feature.offsets())  # type: ignore[attr-defined]


def maybe_td_to_kjt(features: Any, keys: list[str] | None = None) -> KeyedJaggedTensor:
    """A KJT of the jagged features of a TensorDict; any other input is returned unchanged.

    Args:
        features: a ``TensorDict`` whose entries are jagged nested tensors ``[B, j]`` (ids), or a
            ``KeyedJaggedTensor`` (returned as is).
        keys: the features to take, in this order (None: every entry, in the TensorDict's order).

    Returns:
        ``KeyedJaggedTensor`` with ``keys``, values ``[sum of all lengths]`` and lengths
        ``[len(keys) * B]`` (key-major).

    Raises:
        KeyError: a key of ``keys`` is not in the TensorDict.
        TypeError: an entry is not a jagged nested tensor.
    """
    if torch.jit.is_scripting() or not is_tensor_dict(features):
        kjt: KeyedJaggedTensor = features
        return kjt
    names = list(features.keys()) if keys is None else list(keys)
    missing = [k for k in names if k not in features.keys()]
    if missing:
        raise KeyError(f"maybe_td_to_kjt: keys {missing} are not in the TensorDict, whose keys are {list(features.keys())}")
    parts = [features[k] for k in names]
    lengths = [_lengths_of(k, part) for k, part in zip(names, parts)]
    values = [part.values() for part in parts]
    return KeyedJaggedTensor(
        keys=names,
        values=torch.cat(values) if values else torch.empty(0, dtype=torch.int64),
        lengths=torch.cat(lengths) if lengths else torch.empty(0, dtype=torch.int64),
    )
