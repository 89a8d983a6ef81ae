"""Work issued on a side CUDA stream and consumed on another: ordering and allocator safety.

Pipelined training (``SparseDistPrefetch``) copies batch i+1 to the GPU and runs its input dist
(the KJT all-to-alls, their count exchange and the permutes around them) on a side stream while the
main stream computes batch i. Two rules make that correct::

    side stream     copy(i+1) ── input dist(i+1) ── [event]
                                                       │ wait_stream: the main stream waits here
    main stream     fwd(i) ── bwd(i) ─────────────────── lookup(i+1) ── ...

0. **Inputs** -- before the side stream reads a tensor that may already be on the device (a
   batch drawn on the GPU, a loader yielding CUDA tensors), it calls ``side.wait_stream(main)``
   (:func:`wait_for_current`): that tensor may be written by kernels still queued on the main
   stream. Work queued on the main stream later (step i) still overlaps;
1. **Order** -- before the consumer stream uses anything the side stream produced, it calls
   ``consumer.wait_stream(side)`` (no host sync; only the GPU queue waits);
2. **Lifetime** -- a tensor allocated on the side stream is recycled by the caching allocator as
   soon as it is freed *as seen from the side stream*; ``tensor.record_stream(consumer)`` makes the
   allocator also wait for the consumer's work queued at that time. :func:`record_stream_all`
   does it for every CUDA tensor of a result (tensors, KJTs, dataclasses, containers, awaitables).

On CPU there are no streams: ``stream`` is None everywhere and these helpers do nothing, so CPU
runs are bit-identical with and without pipelining.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import torch

from lightrec.distributed.comm.awaitable import Awaitable

__all__ = ["handoff", "on_stream", "record_stream_all", "wait_for_current"]


@contextlib.contextmanager
def on_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Issue the block's GPU work on ``stream`` (a ``torch.cuda.Stream``); no-op for None."""
    if stream is None:
        yield
        return
    with torch.cuda.stream(stream):
        yield


def record_stream_all(
    obj: object, stream: torch.cuda.Stream, depth: int = 6, _seen: set[int] | None = None
) -> None:
    """``record_stream(stream)`` on every CUDA tensor reachable from ``obj``.

    Follows tensors, objects with a ``record_stream`` method (``KeyedJaggedTensor``,
    ``JaggedTensor``, ``KeyedTensor``, ``Batch``), dataclass fields, mappings, lists and tuples,
    and the attributes of lightrec ``Awaitable``s (their buffers and results), up to ``depth``
    levels. CPU tensors and anything else are ignored.
    """
    seen = set() if _seen is None else _seen
    if id(obj) in seen or obj is None:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
        return
    record = getattr(obj, "record_stream", None)
    if callable(record):
        tensors = (
            [t for t in vars(obj).values() if isinstance(t, torch.Tensor)] if hasattr(obj, "__dict__") else []
        )
        if all(t.is_cuda for t in tensors):  # a CPU batch has nothing to protect
            record(stream)
        return
    if depth == 0:
        return
    if isinstance(obj, Awaitable):
        children: Iterable[object] = list(vars(obj).values())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, Mapping):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = obj
    else:
        return
    for child in children:
        record_stream_all(child, stream, depth - 1, seen)


def wait_for_current(side: torch.cuda.Stream | None, device: torch.device) -> None:
    """Order ``side`` after everything already queued on the current stream of ``device`` (rule 0
    of the module docstring); no-op when ``side`` is None."""
    if side is None:
        return
    side.wait_stream(torch.cuda.current_stream(device))


def handoff(result: object, side: torch.cuda.Stream | None, device: torch.device) -> None:
    """Make the current stream of ``device`` wait for ``side`` and keep ``result``'s tensors alive
    for it (rules 1 and 2 of the module docstring); no-op when ``side`` is None."""
    if side is None:
        return
    consumer = torch.cuda.current_stream(device)
    consumer.wait_stream(side)
    record_stream_all(result, consumer)
