"""Copies of a ``KeyedJaggedTensor``'s tensors: to another device, into pinned memory, empty alike.

A KJT holds up to four tensors of its own (``values`` ``[N]``, ``weights`` ``[N]``, ``lengths``
``[sum B_k]``, ``offsets`` ``[sum B_k + 1]``; the last three may be None) plus the ``[F, B]``
tensor of its inverse indices. ``to``, ``pin_memory`` and ``empty_like(kjt, device)`` copy each
present one and keep the host-side caches (sizes do not change), so none of them syncs.

The functions take the tensors, never a ``KeyedJaggedTensor`` (TorchScript compiles them from the
class's methods without compiling the class twice; see ``kjt_transforms``).
"""

from typing import List, Optional, Tuple

import torch

__all__ = ["empty_like_tensors", "inverse_indices_to", "pin_tensors", "tensors_to"]

def tensors_to(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
    device: torch.device,
    non_blocking: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(values, weights, lengths, offsets)`` on ``device`` (None stays None)."""
    return (
        values.to(device, non_blocking=non_blocking),
        weights.to(device, non_blocking=non_blocking) if weights is not None else None,
        lengths.to(device, non_blocking=non_blocking) if lengths is not None else None,
        offsets.to(device, non_blocking=non_blocking) if offsets is not None else None,
    )


@torch.jit.unused
def pin_tensors(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(values, weights, lengths, offsets)`` copied into page-locked host memory (None stays None)."""
    return (
        values.pin_memory(),
        weights.pin_memory() if weights is not None else None,
        lengths.pin_memory() if lengths is not None else None,
        offsets.pin_memory() if offsets is not None else None,
    )


def empty_like_tensors(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: torch.Tensor,
    offsets: Optional[torch.Tensor],
    device: torch.device,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Uninitialised tensors of the same shapes and dtypes on ``device`` (None stays None)."""
    return (
        torch.empty_like(values, device=device),
        torch.empty_like(weights, device=device) if weights is not None else None,
        torch.empty_like(lengths, device=device),
        torch.empty_like(offsets, device=device) if offsets is not None else None,
    )


def inverse_indices_to(
    inverse: Optional[Tuple[List[str], torch.Tensor]], device: torch.device, non_blocking: bool
) -> Optional[Tuple[List[str], torch.Tensor]]:
    """``inverse_indices`` with its ``[F, B]`` tensor copied to ``device`` (None stays None)."""
    if inverse is None:
        return None
    return inverse[0], inverse[1].to(device, non_blocking=non_blocking)
