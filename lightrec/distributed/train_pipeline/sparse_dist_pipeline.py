"""``SparseDistPipeline``: the one object that runs sharded collections' stages ahead of their forwards.

A sharded collection exposes its forward as explicit stages (``ShardedCollectionBase``)::

    collection.input_dist(kjt, stream)        stage 1: every sharding's splits exchange in flight
      started.progress()                      stage 2: lengths / values / weights exchange in flight
    collection.prefetch(started)              the kernels' prefetch hooks (tables behind a cache)
    collection.compute_and_output_dist(started)   lookups, then output dists -> the forward's awaitable

and a queue of work started for its later forwards (``collection.ahead``, see
``sharding/work_ahead.py``), which its forward takes by the KJT's tensors. This class is what
starts that work, for every caller:

==============================  ==============================================================
``DistributedModelParallel``    :meth:`launch`: the whole forward of the batch it was given,
                                before the model runs (the all-to-alls overlap the dense layers)
``SparseDistPrefetch``          :meth:`start` batch i+1 at step i's start, :meth:`progress`
                                (and :meth:`prefetch`) before backward i, :meth:`cancel` at the
                                end of an epoch or fit
a train pipeline                the same three calls around its own loop (torchrec's
(``TrainPipelineSparseDist``)   ``TrainPipelineSparseDist`` shape: copy and start batch i+1,
                                forward/backward/step batch i)
==============================  ==============================================================

A batch may be a KJT, or hold KJTs in dataclass fields (``lightrec.Batch``), mappings, lists and
tuples (:func:`find_kjts`); each collection takes the batch's one KJT whose keys are exactly its
features (in any order), and is skipped when there is none. Every call is collective: every rank
must make it at the same point. The pipeline keeps no state of its own -- the collections' queues
hold the started work -- so several pipelines over the same collections see the same work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from lightrec.distributed.comm.streams import wait_for_current
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.work_ahead import StartedInputDist, WorkAhead, same_features
from lightrec.distributed.train_pipeline.runtime_forwards import BaseForward
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["SparseDistPipeline", "find_kjts", "sharded_collections"]


def find_kjts(obj: object, depth: int = 3) -> list[KeyedJaggedTensor]:
    """Every ``KeyedJaggedTensor`` in a batch or an argument list: ``obj`` itself, or inside
    dataclasses (``lightrec.Batch``), mappings, lists and tuples, up to ``depth`` levels down."""
    if isinstance(obj, KeyedJaggedTensor):
        return [obj]
    if depth == 0 or isinstance(obj, (torch.Tensor, str, bytes)):
        return []
    children: Iterable[object]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, Mapping):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    else:
        return []
    return [k for child in children for k in find_kjts(child, depth - 1)]


def sharded_collections(module: nn.Module) -> list[ShardedCollectionBase]:
    """The sharded collections of ``module`` (itself included), in ``modules()`` order."""
    return [m for m in module.modules() if isinstance(m, ShardedCollectionBase)]


class SparseDistPipeline:
    """Runs the stages of ``collections`` ahead of their forwards (see the module docstring).

    Args:
        collections: the sharded collections to pipeline (e.g. ``sharded_collections(model)``).
    """

    def __init__(self, collections: Iterable[ShardedCollectionBase]) -> None:
        self.collections = list(collections)

    def _fed_by(self, batch: object) -> list[tuple[ShardedCollectionBase, KeyedJaggedTensor]]:
        """``(collection, its KJT)`` for every collection the batch has exactly one KJT for. A
        collection whose forward a custom pipeline replaced (``_rewrite_model``'s pipelined forward,
        which takes its input dist from the pipeline's context) is left to that pipeline: work
        started here would never be taken, and its exchanges would stay unread."""
        kjts = find_kjts(batch)
        out = []
        for collection in self.collections:
            if isinstance(vars(collection).get("forward"), BaseForward):  # set on the instance
                continue
            mine = [k for k in kjts if collection.accepts(k)]
            if len(mine) == 1:
                out.append((collection, mine[0]))
        return out

    # ---- input dists of later forwards -----------------------------------------------------
    def start(self, batch: object, stream: torch.cuda.Stream | None = None) -> int:
        """Stage 1 of the input dist of a later forward of ``batch`` (a KJT or a batch holding KJTs).

        Args:
            batch: what the later forward's collections will receive (the very same id tensors).
            stream: a side ``torch.cuda.Stream`` to issue both stages on (the forward then makes its
                stream wait for it and ``record_stream``\\ s what it receives); None: the current one.

        Returns:
            How many collections it was started for (0: the batch feeds none of them).
        """
        return len(self.start_each(batch, stream))

    def start_each(
        self, batch: object, stream: torch.cuda.Stream | None = None
    ) -> list[tuple[ShardedCollectionBase, StartedInputDist]]:
        """:meth:`start`, returning ``(collection, its started input dist)`` for every collection
        the batch feeds (one started earlier for the same tensors is returned, not restarted)."""
        out = []
        for collection, kjt in self._fed_by(batch):
            earlier = [e.started for e in collection.ahead.entries if e.started is not None
                       and same_features(e.features, kjt)]  # fmt: skip
            if earlier:
                out.append((collection, earlier[0]))
                continue
            # The ids may be on the device already, written by kernels still queued on the current
            # stream: the side stream must not read them before those ran.
            wait_for_current(stream, collection.device)
            started = collection.input_dist(kjt, stream)
            collection.ahead.put(WorkAhead(kjt, started=started))
            out.append((collection, started))
        return out

    def progress(self) -> None:
        """Stage 2 of every started input dist: wait for its splits exchange (a host sync), start
        its lengths/values/weights exchange. A no-op when nothing was started."""
        for collection in self.collections:
            for started in collection.ahead.started():
                started.progress()

    def prefetch(self) -> None:
        """The kernels' prefetch hooks with the ids every started input dist brings (tables behind
        a cache fetch the rows they miss). Nothing for in-memory kernels: it does not even wait
        for the exchanges then."""
        for collection in self.collections:
            for started in collection.ahead.started():
                collection.prefetch(started)

    def started_for(self, batch: object = None) -> bool:
        """Whether an input dist started ahead waits for the forward of ``batch`` (None: any batch)."""
        if batch is None:
            return any(c.ahead.started_for() for c in self.collections)
        return any(collection.ahead.started_for(kjt) for collection, kjt in self._fed_by(batch))

    def cancel(self, wait: bool = True) -> int:
        """Drop the work started ahead (input dists and launched forwards); return how many input
        dists there were. With ``wait`` (collective) each is completed first, so no exchange is
        left in flight; ``wait=False`` only forgets them (after an error, other ranks may be gone)."""
        return sum(c.ahead.drop(c.device, wait) for c in self.collections)

    # ---- DistributedModelParallel's look-ahead -----------------------------------------------
    def launch(self, batch: object) -> int:
        """Run the forward of ``batch``'s KJTs now (finishing input dists started for them); the next
        forward of each collection returns its output. Returns how many were launched."""
        fed = self._fed_by(batch)
        for collection, kjt in fed:
            work = collection.ahead.take(kjt)
            started = work.started if work is not None and work.started is not None else collection.input_dist(kjt)
            collection.ahead.put(WorkAhead(kjt, output=collection.compute_and_output_dist(started)))
        return len(fed)
