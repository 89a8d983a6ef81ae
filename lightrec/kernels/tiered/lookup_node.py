"""The autograd node of one training lookup of a tiered table, and the end of its hold on its cache slots.

A training lookup of :class:`~lightrec.kernels.tiered.backend.TieredBatchedLookup` runs the cache
kernel inside one node (:class:`TieredLookupNode`) whose backward runs that kernel's own backward --
the fused update of the cached rows -- then ends the lookup's :class:`~lightrec.kernels.tiered.inflight.Hold`
(the slots may be evicted again). A graph freed without a backward (a loss never backpropagated)
ends the hold too, through a finalizer, as not updated. A hold of an older generation (the
cache was invalidated since: a checkpoint load) is neither run nor released.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

import torch

from lightrec.kernels.kernel_interface import EmbeddingKernel, LookupBatch
from lightrec.kernels.tiered.inflight import Hold

__all__ = ["HoldOwner", "TieredLookupNode"]


class HoldOwner(Protocol):
    """What the node needs of its :class:`~lightrec.kernels.tiered.backend.TieredBatchedLookup`."""

    inner: EmbeddingKernel  # the in-memory kernel serving the cache slots
    generation: int  # bumped when the cache is invalidated

    def release_hold(self, hold: Hold, updated: bool) -> None: ...


class _LookupNodeContext(Protocol):
    """What :class:`TieredLookupNode`'s forward leaves on the autograd context for its backward."""

    inner_out: torch.Tensor | None  # the inner kernel's output (graph attached); dropped after backward
    release: _Release


class TieredLookupNode(torch.autograd.Function):
    """The cache kernel's lookup as one autograd node whose backward runs the cache kernel's own
    backward (the fused update of the cached rows), then ends the lookup's hold on its slots."""

    @staticmethod
    def forward(
        ctx: _LookupNodeContext,
        kernel: HoldOwner,
        request: LookupBatch,
        hold: Hold,
        lr: Callable[[], float],
        placeholder: torch.Tensor,
    ) -> torch.Tensor:
        inner_input = torch.zeros(0, device=placeholder.device, requires_grad=True)
        with torch.enable_grad():
            out = kernel.inner.lookup(request, [inner_input], lr)
        ctx.inner_out = out
        ctx.release = _Release(kernel, hold)
        return out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: _LookupNodeContext, grad: torch.Tensor) -> tuple[None, ...]:
        release: _Release = ctx.release
        if release.kernel is not None and release.generation == release.kernel.generation:
            inner_out = ctx.inner_out
            assert inner_out is not None  # set by forward; only this (single) backward clears it
            torch.autograd.backward(inner_out, grad)
        ctx.inner_out = None
        release(updated=True)
        return (None, None, None, None, None)


class _Release:
    """Ends a lookup's hold once: after its backward, or when its graph is freed without one."""

    def __init__(self, kernel: HoldOwner, hold: Hold) -> None:
        self.kernel: HoldOwner | None = kernel
        self.hold, self.generation = hold, kernel.generation
        self._finalizer = weakref.finalize(self, _release_unused, weakref.ref(kernel), hold, kernel.generation)

    def __call__(self, updated: bool) -> None:
        kernel, self.kernel = self.kernel, None
        self._finalizer.detach()
        if kernel is not None and kernel.generation == self.generation:
            kernel.release_hold(self.hold, updated)


def _release_unused(kernel_ref: weakref.ref[HoldOwner], hold: Hold, generation: int) -> None:
    kernel = kernel_ref()
    if kernel is not None and kernel.generation == generation:
        kernel.release_hold(hold, updated=False)
