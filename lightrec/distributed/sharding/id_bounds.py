"""The unsharded collection's ``bounds_check`` policy, applied to a sharded collection's input.

``"clamp"`` and ``"skip"`` rewrite the KJT *before* the input dist, so every sharding type sees
exactly the ids the unsharded module would look up (and MEAN bags under ``"skip"`` average over
the ids kept, as there). ``"error"`` changes nothing here: the kernels reject out-of-range ids
with an ``EmbeddingIdError`` that names the feature.
"""

from __future__ import annotations

import torch

from lightrec.sparse import KeyedJaggedTensor

__all__ = ["IdBounds"]


class IdBounds:
    """Apply ``mode`` to the ids of every feature against its table's row count.

    Args:
        mode: ``"error"``, ``"clamp"`` or ``"skip"`` (the collection's ``bounds_check``).
        rows_per_feature: ``{feature: num_embeddings of its table}``.
    """

    def __init__(self, mode: str, rows_per_feature: dict[str, int]) -> None:
        self.mode = mode
        self._rows = dict(rows_per_feature)
        self._limits: dict[tuple[str, ...], torch.Tensor] = {}

    def __call__(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if self.mode == "error" or kjt.values().numel() == 0:
            return kjt
        keys = tuple(kjt.keys())
        values, lengths = kjt.values(), kjt.lengths()
        rows = self._limits.get(keys)
        if rows is None or rows.device != values.device:
            rows = self._limits[keys] = torch.tensor([self._rows[k] for k in keys], device=values.device)
        per_key = torch.tensor(kjt.length_per_key(), device=values.device)
        limit = torch.repeat_interleave(rows, per_key, output_size=values.numel()).to(values.dtype)
        bad = (values < 0) | (values >= limit)
        if not bool(bad.any()):
            return kjt
        weights = kjt.weights_or_none()
        if self.mode == "clamp":
            values = torch.minimum(values.clamp(min=0), limit - 1)
        else:  # skip: drop the ids, shorten their bags
            bag = torch.repeat_interleave(
                torch.arange(lengths.numel(), device=lengths.device), lengths.long(), output_size=values.numel()
            )
            lengths = lengths - torch.bincount(bag[bad], minlength=lengths.numel()).to(lengths.dtype)
            keep = ~bad
            values = values[keep]
            weights = weights[keep] if weights is not None else None
        return KeyedJaggedTensor(list(keys), values, weights, lengths=lengths, stride=kjt.stride())
