"""torchrec's ``torchrec.distributed.quant_embedding_kernel`` path: the helpers that turn a
``KeyedJaggedTensor`` into the ``(indices, offsets, per_sample_weights)`` triple a batched
embedding kernel (fbgemm's TBE) takes.

lightrec's quantized kernels (``lightrec.quant``) unpack their input themselves; these two are
here for code written against torchrec's kernels.
"""

from __future__ import annotations

import torch

from lightrec.sparse import KeyedJaggedTensor

__all__ = ["_unwrap_kjt", "_unwrap_kjt_for_cpu"]


def _unwrap_kjt(features: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(values as int32 [N], offsets as int32 [F*B + 1], weights [N] or None)`` of ``features``:
    the layout of the GPU inference kernels, which take 32-bit indices."""
    return features.values().int(), features.offsets().int(), features.weights_or_none()


def _unwrap_kjt_for_cpu(
    features: KeyedJaggedTensor, weighted: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(values [N], offsets [F*B + 1] in the values' dtype, weights [N] or None)`` of ``features``:
    the CPU kernels take indices and offsets of one dtype (int64 Criteo ids stay int64).

    Args:
        features: the batch.
        weighted: torchrec's older form: ``True`` returns the weights (which must exist),
            ``False`` drops them; None (torchrec's newer one-argument form) returns them if present.

    Raises:
        ValueError: ``weighted=True`` for a batch without weights.
    """
    indices = features.values()
    offsets = features.offsets().to(indices.dtype)
    if weighted is None:
        return indices, offsets, features.weights_or_none()
    if weighted and features.weights_or_none() is None:
        raise ValueError("weighted=True but the KeyedJaggedTensor has no weights; pass weighted=False or add weights")
    return indices, offsets, features.weights() if weighted else None
