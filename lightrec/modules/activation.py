"""torchrec's ``torchrec.modules.activation``: ``SwishLayerNorm``, the ``"swish_layernorm"`` activation.

``SwishLayerNorm(input_dims)(x) = x * sigmoid(LayerNorm(input_dims)(x))`` for ``x`` of shape
``[*, *input_dims]``. The attribute ``norm`` (``Sequential(LayerNorm, Sigmoid)``) gives torchrec's
state-dict keys ``norm.0.weight`` / ``norm.0.bias``, so an ``MLP(..., activation="swish_layernorm")``
layer saves ``_activation_fn.norm.0.weight`` as torchrec's does.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SwishLayerNorm"]


class SwishLayerNorm(nn.Module):
    """``x * sigmoid(LayerNorm(x))`` over the last ``input_dims`` dimensions.

    Args:
        input_dims: the normalized shape (an int for the last dimension, or the trailing shape).
        device: where the LayerNorm's weight and bias live.
        dtype: their dtype (lightrec's addition; torchrec's takes ``device`` only).
    """

    def __init__(
        self,
        input_dims: int | list[int] | torch.Size,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.norm = nn.Sequential(nn.LayerNorm(input_dims, device=device, dtype=dtype), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torchrec's argument name
        out: torch.Tensor = input * self.norm(input)
        return out
