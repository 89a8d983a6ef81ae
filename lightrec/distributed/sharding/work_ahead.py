"""Work started for a sharded collection's later forward, and where it waits for that forward.

A sharded collection's forward is three stages (``ShardedCollectionBase``): *input dist* (the KJT
all-to-alls: a splits exchange, then lengths / values / weights), *lookup* and *output dist*. A
pipeline (``lightrec.distributed.train_pipeline.sparse_dist_pipeline``) may run some of them before the forward
that needs them:

* the **input dist of a later batch** (``SparseDistPrefetch``, a train pipeline): a
  :class:`StartedInputDist` -- stage 1 at once, stage 2 (:meth:`StartedInputDist.progress`) before
  the current backward; the lookup must wait for that backward, which updates the rows;
* the **whole forward of the batch about to run** (``DistributedModelParallel``'s look-ahead): its
  output awaitable, so the embedding all-to-alls overlap the dense layers.

Either goes into the collection's :class:`AheadQueue` as a :class:`WorkAhead` and is taken by the
forward whose KJT holds the very same tensors (:func:`same_features`): Lightning's
``batch_to_device`` and a variable-batch expansion build new KJT objects, so the object itself
cannot be the key, its id tensors can. A forward of other tensors (a validation batch in between)
runs normally and leaves the work waiting. A launched forward is valid only for the very next
forward (the one after may follow a backward that changed the rows): any forward drops the
launched outputs it does not take.

Side streams (CUDA, ``lightrec/distributed/comm/streams.py``): an input dist started with ``stream=``
runs both stages there; :meth:`StartedInputDist.received` waits for it on that stream and hands
what it received to the consumer's stream. On CPU there are no streams and a pipelined forward is
bit-identical to a plain one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightrec.distributed.comm.awaitable import Awaitable
from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.comm.streams import handoff, on_stream
from lightrec.distributed.sharding.common import DistContext
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["AheadQueue", "StartedInputDist", "WorkAhead", "same_features"]


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
    tensors: list[Awaitable[KeyedJaggedTensor]] | None = None
    stream: torch.cuda.Stream | None = None

    def progress(self) -> list[Awaitable[KeyedJaggedTensor]]:
        """Stage 2 (once): wait for the splits (a host sync), start the lengths/values exchange."""
        if self.tensors is None:
            with on_stream(self.stream), collective_guard("splits all-to-all of an embedding input dist"):
                self.tensors = [c.splits.wait() for c in self.contexts]
        return self.tensors

    def received(self, device: torch.device) -> list[KeyedJaggedTensor]:
        """The KJT each sharding looks up (waits for the exchanges). With a side stream: waited
        there, then handed to the current stream of ``device`` (``lightrec.distributed.comm.streams``)."""
        tensors = self.progress()
        with on_stream(self.stream), collective_guard("lengths/values all-to-all of an embedding input dist"):
            kjts = [t.wait() for t in tensors]
        handoff((kjts, tensors, self.contexts, self.bounded), self.stream, device)
        return kjts


@dataclass
class WorkAhead:
    """Work started for the forward of ``features``: an input dist, or the whole forward (its output)."""

    features: KeyedJaggedTensor
    started: StartedInputDist | None = None
    output: object = None  # the forward's result, cast back to the collection's output type


@dataclass
class AheadQueue:
    """The work started ahead for one collection's forwards, oldest first (module docstring)."""

    entries: list[WorkAhead] = field(default_factory=list)

    def put(self, work: WorkAhead) -> None:
        """Queue ``work`` for the forward of ``work.features`` (replacing earlier work for the same tensors)."""
        self.entries = [e for e in self.entries if not same_features(e.features, work.features)]
        self.entries.append(work)

    def take(self, features: KeyedJaggedTensor) -> WorkAhead | None:
        """The work of the forward of ``features``, removed from the queue; launched outputs of other
        KJTs are dropped too (only the very next forward may use one)."""
        found = next((e for e in self.entries if same_features(e.features, features)), None)
        self.entries = [e for e in self.entries if e is not found and e.output is None]
        return found

    def started_for(self, features: KeyedJaggedTensor | None = None) -> bool:
        """Whether an input dist started ahead (for the tensors of ``features``, or any) waits."""
        return any(
            e.started is not None and (features is None or same_features(e.features, features)) for e in self.entries
        )

    def started(self) -> list[StartedInputDist]:
        """Every input dist started ahead, oldest first."""
        return [e.started for e in self.entries if e.started is not None]

    def drop(self, device: torch.device, wait: bool = True) -> int:
        """Drop every queued entry; return how many started input dists there were.

        With ``wait`` (collective: every rank must call it together) each started input dist is
        completed first, so no exchange is left in flight; ``wait=False`` only forgets them (after
        an error, when the other ranks may not take part any more).
        """
        started = self.started()
        self.entries = []
        if wait:
            for input_dist in started:
                input_dist.received(device)
        return len(started)
