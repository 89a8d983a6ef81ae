"""torchrec's ``torchrec.streamable``: what a pipelined batch must offer.

A training pipeline copies batch ``i + 1`` to the device on a side stream while batch ``i``
trains, then hands it to the main stream. For that a batch needs two methods::

    batch.to(device, non_blocking=True)   # Pipelineable: a copy of the batch on ``device``
    batch.record_stream(stream)           # Multistreamable: its tensors are used on ``stream``

``torch.Tensor``, lightrec's ``JaggedTensor`` / ``KeyedJaggedTensor`` / ``KeyedTensor`` and
``lightrec.Batch`` have both. In torchrec these are abstract base classes a batch class derives
from; here they are ``runtime_checkable`` Protocols, so a torchrec batch class that derives from
them keeps working (its abstract methods must still be implemented) and ``isinstance(x,
Pipelineable)`` is true of every object that has the methods, whatever its base classes. This
module imports nothing of lightrec's: every room may build on it.
"""

from __future__ import annotations

import abc
from typing import Protocol, runtime_checkable

import torch
from typing_extensions import Self

__all__ = ["Multistreamable", "Pipelineable"]


@runtime_checkable
class Multistreamable(Protocol):
    """An object whose tensors may be produced on one CUDA stream and used on another."""

    @abc.abstractmethod
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as used on ``stream`` (``torch.Tensor.record_stream``)."""


@runtime_checkable
class Pipelineable(Multistreamable, Protocol):
    """A :class:`Multistreamable` object that can also be copied to another device."""

    @abc.abstractmethod
    def to(self, device: torch.device, non_blocking: bool) -> Self:
        """A copy on ``device`` (``non_blocking``: the copy may overlap other work)."""
