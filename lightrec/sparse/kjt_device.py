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

__all__ = [
    "copy_into",
    "empty_like_tensors",
    "inverse_indices_empty_like",
    "inverse_indices_pinned",
    "inverse_indices_to",
    "num_bytes",
    "pin_tensors",
    "tensors_to",
]


def tensors_to(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
    device: torch.device,
    non_blocking: bool,
    weights_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(values, weights, lengths, offsets)`` on ``device`` (None stays None); ``weights_dtype``
    converts the weights too (torchrec's ``KeyedJaggedTensor.to(..., dtype=)``)."""
    return (
        values.to(device, non_blocking=non_blocking),
        weights.to(device=device, dtype=weights_dtype, non_blocking=non_blocking) if weights is not None else None,
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


def inverse_indices_empty_like(
    inverse: Optional[Tuple[List[str], torch.Tensor]], device: torch.device
) -> Optional[Tuple[List[str], torch.Tensor]]:
    """``inverse_indices`` with an uninitialised ``[F, B]`` tensor of the same shape on ``device``."""
    if inverse is None:
        return None
    return inverse[0], torch.empty_like(inverse[1], device=device)


@torch.jit.unused
def inverse_indices_pinned(
    inverse: Optional[Tuple[List[str], torch.Tensor]],
) -> Optional[Tuple[List[str], torch.Tensor]]:
    """``inverse_indices`` with its ``[F, B]`` tensor copied into page-locked host memory."""
    if inverse is None:
        return None
    return inverse[0], inverse[1].pin_memory()


def copy_into(dst: Optional[torch.Tensor], src: Optional[torch.Tensor], non_blocking: bool) -> None:
    """``dst.copy_(src)`` when both exist (torchrec's ``copy_``: a part only one side has is left alone)."""
    if dst is not None and src is not None:
        dst.copy_(src, non_blocking=non_blocking)


def num_bytes(tensors: List[Optional[torch.Tensor]]) -> int:
    """Bytes held by the tensors that exist (``size_in_bytes``)."""
    total = 0
    for t in tensors:
        if t is not None:
            total += t.element_size() * t.numel()
    return total
