"""Look-ahead of a sharded collection: work started before the forward that consumes it.

A sharded collection's forward is *input dist* (the KJT all-to-alls: a splits exchange, then
lengths / values / weights), *lookup* and *output dist*. Two callers start some of it early:

* ``SparseDistPrefetch`` starts the **input dist** of batch i+1 while batch i trains (stage 1
  :meth:`InputDistPipeline.start`, stage 2 :meth:`InputDistPipeline.progress` before backward i);
  the lookup must wait for backward i, which updates the rows, so only the input dist runs early.
* ``DistributedModelParallel`` starts the **whole forward** of the batch it was given
  (:meth:`InputDistPipeline.launch`) before running the model, so the embedding all-to-alls
  overlap the dense layers.

Both go through one :class:`InputDistPipeline` per collection, which keeps the work *keyed by the
KJT object the consuming forward receives* and hands it to that forward exactly once::

    key (the forward's KJT)   started input dist        launched forward
    ------------------------  ------------------------  -------------------------------
    batch i+1's KJT           splits exchange (stage 1)  -
                              lengths/values (stage 2)   -
    batch i's KJT             (consumed by launch)       output awaitable (DMP prefetch)

``forward(kjt)`` takes the entry of ``kjt``: a launched forward is returned as is, a started input
dist is finished (lookup, output dist), no entry means a plain forward. A launched forward is only
valid for the *next* forward (the one after it may follow a backward that changed the rows), so
the next forward drops any other launched forward. A caller whose batch reaches the forward as a
new KJT object (Lightning's ``batch_to_device`` rebuilds it around the same tensors) re-keys the
started work explicitly with :meth:`InputDistPipeline.hand_over`, which checks that both KJTs hold
the very same id tensors.

Side streams (CUDA, ``lightrec/distributed/streams.py``): an input dist started with ``stream=``
runs both stages there; the forward waits for it on its own stream and ``record_stream``s what it
received. On CPU there are no streams and the pipelined forward is bit-identical to a plain one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.sharding.common import DistContext
from lightrec.distributed.streams import handoff, on_stream, wait_for_current
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["InputDistPipeline", "StartedInputDist", "find_kjts", "same_features"]


def find_kjts(obj: Any, depth: int = 3) -> list[KeyedJaggedTensor]:
    """Every ``KeyedJaggedTensor`` in a batch or an argument list: ``obj`` itself, or inside
    dataclasses (``lightrec.Batch``), mappings, lists and tuples, up to ``depth`` levels down."""
    if isinstance(obj, KeyedJaggedTensor):
        return [obj]
    if depth == 0 or isinstance(obj, (torch.Tensor, str, bytes)):
        return []
    children: Any
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, Mapping):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    else:
        return []
    return [k for child in children for k in find_kjts(child, depth - 1)]


def same_features(a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> bool:
    """Whether KJTs ``a`` and ``b`` hold the very same tensors (``b`` may be ``a.to(its device)``,
    which builds a new KJT around the same tensors, as Lightning's ``batch_to_device`` does)."""
    if a is b:
        return True
    if a.values() is not b.values() or a.weights_or_none() is not b.weights_or_none() or a.keys() != b.keys():
        return False
    la, lb, oa, ob = a.lengths_or_none(), b.lengths_or_none(), a.offsets_or_none(), b.offsets_or_none()
    return (la is not None and la is lb) or (oa is not None and oa is ob)


@dataclass
class StartedInputDist:
    """The input dist of one forward, started (stage 1: every sharding's splits exchange in flight).

    Attributes:
        features: the KJT it was started for.
        positions: key index in ``features`` of each collection feature (None: same order).
        contexts: one per sharding type; their splits exchanges are in flight.
        bounded: ``features`` after the ``bounds_check`` rewrite (what the input dist sent).
        tensors: one lengths/values exchange awaitable per sharding type once the splits were
            waited (:meth:`progress`, stage 2), else None.
        stream: the side CUDA stream its work is issued on, or None (the current stream).
    """

    features: KeyedJaggedTensor
    positions: list[int] | None
    contexts: list[DistContext]
    bounded: KeyedJaggedTensor
    tensors: list[Any] | None = None
    stream: torch.cuda.Stream | None = None

    def progress(self) -> list[Any]:
        """Stage 2 (once): wait for the splits (a host sync), start the lengths/values exchange."""
        if self.tensors is None:
            with on_stream(self.stream), collective_guard("splits all-to-all of an embedding input dist"):
                self.tensors = [c.splits.wait() for c in self.contexts]
        return self.tensors

    def received(self, device: torch.device) -> list[KeyedJaggedTensor]:
        """The KJT each sharding looks up (waits for the exchanges). With a side stream: waited
        there, then handed to the current stream of ``device`` (``lightrec.distributed.streams``)."""
        tensors = self.progress()
        with on_stream(self.stream), collective_guard("lengths/values all-to-all of an embedding input dist"):
            kjts = [t.wait() for t in tensors]
        handoff((kjts, tensors, self.contexts, self.bounded), self.stream, device)
        return kjts


@dataclass
class _LookAhead:
    """Work started ahead for the forward of ``features``: an input dist, or the whole forward."""

    features: KeyedJaggedTensor
    input_dist: StartedInputDist | None = None
    output: Any = None


class InputDistPipeline:
    """The look-ahead entries of one sharded collection (see the module docstring).

    Args:
        accepts: whether a KJT has exactly the collection's features (others are never started).
        begin: starts stage 1 of the input dist of a KJT, on a side stream or None.
        finish: the rest of a forward (every stage not yet run) -> the forward's output awaitable;
            takes the KJT and its started input dist, or None to run the input dist too.
        device: where the collection's shards live (the forward's stream there receives the work
            of side streams).
    """

    def __init__(
        self,
        accepts: Callable[[KeyedJaggedTensor], bool],
        begin: Callable[[KeyedJaggedTensor, torch.cuda.Stream | None], StartedInputDist],
        finish: Callable[[KeyedJaggedTensor, StartedInputDist | None], Any],
        device: torch.device,
    ) -> None:
        self._accepts = accepts
        self._begin = begin
        self._finish = finish
        self._device = device
        # id(KJT) -> entry; the entry holds the KJT, so the id is not reused while it is there.
        self._ahead: dict[int, _LookAhead] = {}  # oldest first

    # ---- SparseDistPrefetch: input dists of later forwards ---------------------------------------
    def start(self, features: KeyedJaggedTensor, stream: torch.cuda.Stream | None = None) -> bool:
        """Stage 1 of the input dist of a later ``forward(features)`` (collective).

        Returns False (and does nothing) when ``features`` does not have exactly the collection's
        keys; True when it was started (or already was).
        """
        if not self._accepts(features):
            return False
        entry = self._ahead.get(id(features))
        if entry is None or entry.input_dist is None:
            # The ids may be on the device already, written by kernels still queued on the
            # current stream: the side stream must not read them before those ran.
            wait_for_current(stream, self._device)
            self._ahead[id(features)] = _LookAhead(features, self._begin(features, stream))
        return True

    def progress(self) -> None:
        """Stage 2 of every started input dist (collective; a no-op when none is started)."""
        for entry in self._ahead.values():
            if entry.input_dist is not None:
                entry.input_dist.progress()

    def hand_over(self, started_for: KeyedJaggedTensor, features: KeyedJaggedTensor) -> bool:
        """Let ``forward(features)`` consume the input dist started for ``started_for``.

        Returns False (and keeps the entry of ``started_for``) when nothing was started for it or
        ``features`` does not hold the very same id tensors (see :func:`same_features`).
        """
        entry = self._ahead.get(id(started_for))
        if entry is None or entry.input_dist is None or not same_features(started_for, features):
            return False
        if features is not started_for:
            del self._ahead[id(started_for)]
            entry.features = features
            self._ahead[id(features)] = entry
        return True

    def pending(self, features: KeyedJaggedTensor | None = None) -> bool:
        """Whether an input dist started ahead (for ``features``, or any) waits for its forward."""
        if features is None:
            return any(e.input_dist is not None for e in self._ahead.values())
        entry = self._ahead.get(id(features))
        return entry is not None and entry.input_dist is not None

    def cancel(self, wait: bool = True) -> int:
        """Drop every started input dist and return how many there were.

        With ``wait`` (collective: every rank must call it together) each is completed first, so no
        exchange is left in flight; ``wait=False`` only forgets them (after an error, when the other
        ranks may not take part any more).
        """
        started = [(key, e.input_dist) for key, e in self._ahead.items() if e.input_dist is not None]
        for key, input_dist in started:
            del self._ahead[key]
            if wait:
                input_dist.received(self._device)
        return len(started)

    # ---- DistributedModelParallel: the whole forward, before the model runs ---------------------
    def launch(self, features: KeyedJaggedTensor) -> bool:
        """Run the forward of ``features`` now (finishing an input dist started for it); the next
        ``forward(features)`` returns its output. False (nothing run) when the keys differ."""
        if not self._accepts(features):
            return False
        entry = self._take(features)
        started = entry.input_dist if entry is not None else None
        self._ahead[id(features)] = _LookAhead(features, output=self._finish(features, started))
        return True

    # ---- the forward ----------------------------------------------------------------------------
    def forward(self, features: KeyedJaggedTensor) -> Any:
        """The collection's forward: consume what was started ahead for ``features`` (once)."""
        entry = self._take(features)
        if entry is not None and entry.output is not None:
            return entry.output
        return self._finish(features, entry.input_dist if entry is not None else None)

    def _take(self, features: KeyedJaggedTensor) -> _LookAhead | None:
        """Remove the entry of ``features``; launched forwards of other KJTs are stale from now on
        (only the very next forward may use one), so they are dropped too."""
        entry = self._ahead.pop(id(features), None)
        for key in [k for k, e in self._ahead.items() if e.output is not None]:
            del self._ahead[key]
        return entry
