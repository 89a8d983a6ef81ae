"""The lookup of a batch of 0 samples: zeros of the right shape, one autograd node over the same inputs.

A rank whose batch holds no samples runs no kernel, but its output must look like a real lookup's
(the others exchange theirs with it) and its backward must reach the same parameters in the same
order (data-parallel replicas all-reduce there), and advance a fused optimizer's step counter as a
real backward does (:meth:`lightrec.kernels.kernel_interface.EmbeddingKernel.count_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

__all__ = ["EmptyLookup", "EmptyLookupContext"]


class EmptyLookupContext(Protocol):
    """What :class:`EmptyLookup`'s forward leaves on the autograd context for its backward."""

    inputs_meta: list[tuple[torch.Size, torch.dtype, torch.device]]  # (shape, dtype, device) per input
    count_step: Callable[[], None] | None  # the fused kernel's step counter, advanced by the backward


class EmptyLookup(torch.autograd.Function):
    """``[rows, width]`` zeros whose backward gives every input a zero gradient (a batch of 0).

    The zeros have the tables' dtype, as a real lookup's output does (a rank with an empty batch
    must send what the others send). With a fused optimizer the backward calls ``count_step``: the
    kernel's step counter (Adam's ``t``) advances as a lookup's backward advances it, so a rank that
    had no samples keeps the others' bias correction (fbgemm advances ``iter`` for a batch of 0 too).
    """

    @staticmethod
    def forward(
        ctx: EmptyLookupContext,
        rows: int,
        width: int,
        device: torch.device,
        dtype: torch.dtype,
        count_step: Callable[[], None] | None,
        *inputs: torch.Tensor,
    ) -> torch.Tensor:
        ctx.inputs_meta = [(t.shape, t.dtype, t.device) for t in inputs]
        ctx.count_step = count_step
        return torch.zeros(rows, width, device=device, dtype=dtype)

    @staticmethod
    def backward(ctx: EmptyLookupContext, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.count_step is not None:
            ctx.count_step()
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs_meta]
        return (None, None, None, None, None, *zeros)
