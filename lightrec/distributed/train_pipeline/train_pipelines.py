"""torchrec's training loop: ``TrainPipelineSparseDist``, ``EvalPipelineSparseDist`` and ``TrainPipelineBase``.

::

    pipeline = TrainPipelineSparseDist(model, optimizer, device)      # model: a DistributedModelParallel
    it = iter(dataloader)
    while True:
        try:
            loss, (loss, logits, labels) = pipeline.progress(it)       # one training step
        except StopIteration:
            break

``model(batch)`` must return ``(losses, output)`` (torchrec's contract, e.g. ``DLRMTrain``);
``progress`` zeroes the gradients, runs the forward, ``sum(losses).backward()`` and
``optimizer.step()`` when the model is in training mode, and returns ``output``. With
``TrainPipelineSparseDist`` step ``i`` runs, on every rank in the same order::

    batch i+1: its input dist started (the splits exchange), through the one pipelining seam of the
               sharded collections (``SparseDistPipeline``, which ``DistributedModelParallel``'s
               look-ahead and ``SparseDistPrefetch`` drive too)
    batch i+2: read from the iterator and copied to the device
    batch i:   forward (its input dist was started a step earlier: only its last exchange is waited)
    batch i+1: the lengths/values exchange started, travelling during the backward of batch i
    batch i:   backward, optimizer step

The input dist only reads ids, never the rows the backward updates, so the losses and tables are
bit-identical to an unpipelined loop (tested on 2 gloo ranks). Every sharded collection of the
model whose features a KJT of the batch holds exactly is pipelined; a collection that receives
another KJT (the model rebuilds or splits it) runs its input dist in its forward, as without the
pipeline, and the pipeline stops starting input dists early (a warning says so). On CUDA the copies run on a side
stream and the input dists on another (the collections hand their results to the main stream);
on CPU there are no streams. ``StopIteration`` is raised by the first ``progress`` after the data
ran out: with ``execute_all_batches`` (default) once every fetched batch was trained, without it
as soon as the iterator is exhausted (the batches in flight are dropped, as torchrec does).
Either pipeline, and ``TrainPipelineBase``, then reads a new iterator (the next epoch) from its start.

A ``progress`` whose forward or backward raises leaves its batch at the head: the next call trains
it again, then the batches already read after it (none is lost, and a retry reads no further). On
several ranks every rank must read the same number of batches (every step is collective): a rank
with fewer batches stops while the others exchange their next batch's ids, and the transport
reports the ranks' disagreement (or the collective times out) rather than training past it.
"""

from __future__ import annotations

import abc
import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic

import torch
from torch import nn

from lightrec.distributed.comm.awaitable import AwaitableList
from lightrec.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from lightrec.distributed.train_pipeline.runtime_forwards import BaseForward
from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline, sharded_collections
from lightrec.distributed.train_pipeline.utils import StartedSplits, _to_device, _wait_for_batch, unwrap_model

__all__ = [
    "EvalPipelineSparseDist",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineSparseDist",
]

logger = logging.getLogger(__name__)

class TrainPipeline(abc.ABC, Generic[In, Out]):
    """One training (or evaluation) step per :meth:`progress` call."""

    @abc.abstractmethod
    def progress(self, dataloader_iter: Iterator[In]) -> Out: ...

    def _bind_model(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        custom_model_fwd: Callable[[In], tuple[torch.Tensor, Out]] | None,
    ) -> None:
        """Keep what every pipeline steps: the model (and the forward it calls), the optimizer, the
        device, and on CUDA the side stream batches are copied on."""
        self._model, self._optimizer, self._device = model, optimizer, torch.device(device)
        self._custom_model_fwd = custom_model_fwd
        self._model_fwd = custom_model_fwd or model
        self._memcpy_stream = torch.cuda.Stream(device=self._device) if self._device.type == "cuda" else None
        self._dataloader_iter: Iterator[In] | None = None  # the iterator read last (see _next_batch)
        self._exhausted = False

    def _next_batch(self, dataloader_iter: Iterator[In]) -> In | None:
        """The next batch of ``dataloader_iter``, None once it ran out; a new iterator (a new epoch)
        is read from its start even after the previous one ran out."""
        if dataloader_iter is not self._dataloader_iter:
            self._dataloader_iter, self._exhausted = dataloader_iter, False
        if self._exhausted:
            return None
        batch = next(dataloader_iter, None)
        self._exhausted = batch is None
        return batch


class TrainPipelineBase(TrainPipeline[In, Out]):
    """Copy batch i+1 to the device while batch i trains (no input-dist overlap).

    Args:
        model: returns ``(losses, output)`` for a batch.
        optimizer: stepped after every backward (in training mode).
        device: where batches go.
        custom_model_fwd: called instead of ``model(batch)``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        custom_model_fwd: Callable[[In], tuple[torch.Tensor, Out]] | None = None,
    ) -> None:
        self._bind_model(model, optimizer, device, custom_model_fwd)
        self._cur: Any = None  # the next batch to train, on the device (None: none read yet)
        # The batch read after ``_cur`` by a step whose forward or backward raised: the retry of
        # ``_cur`` trains it next instead of reading another (it was read from the iterator already).
        self._read_ahead: tuple[In | None] | None = None

    def _copy(self, batch: In) -> In:
        if self._memcpy_stream is None:
            return _to_device(batch, self._device, non_blocking=False)
        with torch.cuda.stream(self._memcpy_stream):
            return _to_device(batch, self._device, non_blocking=True)

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        """One step on the batch read by the previous call (the first call reads it now) while the
        next one is read and copied; ``StopIteration`` once every batch was trained. When the forward
        or backward raises, the next call trains the same batch again (as
        :class:`TrainPipelineSparseDist` does) and then the one read after it: no batch is lost."""
        if self._cur is None:
            first = self._next_batch(dataloader_iter)
            if first is None:
                raise StopIteration
            self._cur = self._copy(first)
        if self._read_ahead is not None:  # a failed step read it already
            (upcoming,), self._read_ahead = self._read_ahead, None
        else:
            upcoming = self._next_batch(dataloader_iter)
        training = self._model.training
        cur = self._cur
        try:
            if training:
                self._optimizer.zero_grad()
            _wait_for_batch(cur, self._memcpy_stream)
            losses, output = self._model_fwd(cur)
            if training:
                torch.sum(losses, dim=0).backward()
        except BaseException:
            self._read_ahead = (upcoming,)
            raise
        self._cur = self._copy(upcoming) if upcoming is not None else None
        if training:
            self._optimizer.step()
        return output


class TrainPipelineSparseDist(TrainPipeline[In, Out]):
    """Start the next batch's input dist while the current batch trains (see the module docstring).

    Each batch in flight has a ``context_type`` instance beside it (``contexts``, aligned with
    ``batches``): its copy event and its collections' input dists, by fqn
    (:mod:`lightrec.distributed.train_pipeline.pipeline_context`). A subclass may override
    :meth:`progress` with torchrec's methods: ``fill_pipeline``, ``_set_module_context``,
    ``_wait_for_batch``, ``start_sparse_data_dist``, ``enqueue_batch``, ``wait_sparse_data_dist``,
    ``_backward``, ``dequeue_batch``.

    Args:
        model: usually a ``DistributedModelParallel``; returns ``(losses, output)`` for a batch.
        optimizer: stepped after every backward (in training mode).
        device: where batches go and the model runs.
        execute_all_batches: train the batches in flight once the iterator is exhausted.
        context_type: the ``TrainPipelineContext`` (sub)class made for each batch in flight.
        apply_jit, pipeline_postproc: accepted for torchrec's signature (lightrec does not trace
            or script the model; it has no post-processing modules to pipeline).
        custom_model_fwd: called instead of ``model(batch)``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        execute_all_batches: bool = True,
        apply_jit: bool = False,
        context_type: type[TrainPipelineContext] = TrainPipelineContext,
        pipeline_postproc: bool = False,
        custom_model_fwd: Callable[[In], tuple[torch.Tensor, Out]] | None = None,
    ) -> None:
        self._bind_model(model, optimizer, device, custom_model_fwd)
        self._execute_all_batches = execute_all_batches
        self._context_type = context_type
        cuda = self._device.type == "cuda"
        self._data_dist_stream = torch.cuda.Stream(device=self._device) if cuda else None
        self.batches: deque[In] = deque()
        self.contexts: deque[TrainPipelineContext] = deque()
        self._sparse_dist: SparseDistPipeline | None = None
        self._names: dict[int, str] | None = None
        self._pipelining = True
        self._next_index = 0
        self._attached = True

    # ---- batches in flight ------------------------------------------------------------------
    def _pipeline(self) -> SparseDistPipeline:
        """The seam over the model's sharded collections (a ``DistributedModelParallel``'s own one)."""
        if self._sparse_dist is None:
            own = getattr(self._model, "pipeline", None)
            self._sparse_dist = own if isinstance(own, SparseDistPipeline) else SparseDistPipeline(
                sharded_collections(self._model)
            )
        return self._sparse_dist

    def copy_batch_to_gpu(self, dataloader_iter: Iterator[In]) -> tuple[In | None, TrainPipelineContext | None]:
        """Read the next batch, copy it to the device (on the copy stream on CUDA, its event in the
        new context's ``events``) and return it with its context; ``(None, None)`` after the data."""
        batch = self._next_batch(dataloader_iter)
        if batch is None:
            return None, None
        context = self._context_type(index=self._next_index, version=1)
        self._next_index += 1
        if self._memcpy_stream is None:
            return _to_device(batch, self._device, non_blocking=False), context
        with torch.cuda.stream(self._memcpy_stream):
            batch = _to_device(batch, self._device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._memcpy_stream)
            context.events.append(copied)
        return batch, context

    def enqueue_batch(self, dataloader_iter: Iterator[In]) -> bool:
        """:meth:`copy_batch_to_gpu` and append the batch and its context to ``batches`` / ``contexts``."""
        batch, context = self.copy_batch_to_gpu(dataloader_iter)
        if batch is None or context is None:
            if not self._execute_all_batches:
                self._drop_in_flight()
                raise StopIteration
            return False
        self.batches.append(batch)
        self.contexts.append(context)
        return True

    def dequeue_batch(self) -> None:
        self.batches.popleft()
        self.contexts.popleft()

    def fill_pipeline(self, dataloader_iter: Iterator[In]) -> None:
        """First call: read batch 0, run its whole input dist, read batch 1."""
        if self.batches:
            return
        if not self.enqueue_batch(dataloader_iter):
            return
        self.start_sparse_data_dist(self.batches[0], self.contexts[0])
        self.wait_sparse_data_dist(self.contexts[0])
        self.enqueue_batch(dataloader_iter)

    # ---- input dists ahead of their forward ---------------------------------------------------
    def _collection_names(self) -> dict[int, str]:
        """``{id(collection): its fqn}`` in the unwrapped model (the context's keys)."""
        if self._names is None:
            self._names = {id(m): n for n, m in unwrap_model(self._model).named_modules()}
        return self._names

    def start_sparse_data_dist(self, batch: object, context: TrainPipelineContext) -> None:
        """Stage 1 of the input dist of ``batch`` for every collection a KJT of it feeds
        (collective), recorded in ``context`` by the collections' fqns: ``module_contexts`` (the
        started input dists), ``input_dist_splits_requests`` and ``fused_splits_awaitables``."""
        if batch is None or not self._pipelining:
            return
        stream = self._data_dist_stream
        if stream is not None:
            for event in context.events:  # the ids must have arrived before the input dist reads them
                stream.wait_event(event)
        names = self._collection_names()
        fused: list[str] = []
        for collection, started in self._pipeline().start_each(batch, stream=stream):
            name = names.get(id(collection), f"<collection {len(context.module_contexts)}>")
            context.module_contexts[name] = started
            context.input_dist_splits_requests[name] = StartedSplits(started)
            fused.append(name)
        if fused:  # one wait runs stage 2 of all of them (wait_sparse_data_dist)
            requests = [context.input_dist_splits_requests[n] for n in fused]
            context.fused_splits_awaitables.append((fused, AwaitableList(requests)))

    def wait_sparse_data_dist(self, context: TrainPipelineContext) -> None:
        """Stage 2 (the lengths/values exchange) of the input dists ``context`` holds (collective):
        each stage-1 request moves to ``input_dist_tensors_requests``."""
        for names, awaitable in context.fused_splits_awaitables:
            for name, request in zip(names, awaitable.wait(), strict=True):
                context.input_dist_tensors_requests[name] = request
        context.fused_splits_awaitables.clear()
        context.input_dist_splits_requests.clear()

    def _wait_for_batch(self, batch: object = None, context: TrainPipelineContext | None = None) -> None:
        """Make the main stream wait for the copy of ``batch`` (default: the current batch)."""
        batch = self.batches[0] if batch is None else batch
        context = self.contexts[0] if context is None else context
        if not context.events:
            return
        main = torch.cuda.current_stream(self._device)
        for event in context.events:  # kept: a later stage of this batch may wait for them too
            main.wait_event(event)
        record = getattr(batch, "record_stream", None)
        if callable(record):
            record(main)

    def _backward(self, losses: torch.Tensor) -> None:
        torch.sum(losses, dim=0).backward()

    @property
    def _pipelined_modules(self) -> list[nn.Module]:
        """The sharded collections whose input dists this pipeline starts (torchrec's name)."""
        return list(self._pipeline().collections)

    @property
    def _model_attached(self) -> bool:
        return self._attached

    def _set_module_context(self, context: TrainPipelineContext) -> None:
        """torchrec's hook before a forward: hand ``context`` to pipelined forwards. lightrec's
        collections take their started input dists by the batch's KJT, so only forwards a custom
        ``_rewrite_model`` installed (``set_context``) receive it."""
        for module in unwrap_model(self._model).modules():
            forward = vars(module).get("forward")
            if isinstance(forward, BaseForward):
                forward.set_context(context)

    def _check_consumed(self, batch: object, context: TrainPipelineContext) -> None:
        """Input dists started for a KJT the forward did not pass to its collection are completed
        and dropped, and the pipeline stops starting them (the model rebuilt the features)."""
        if not context.has_input_dists() or not self._pipeline().started_for(batch):
            context.clear_input_dists()  # the forward took them
            return
        self._pipeline().cancel(wait=True)  # also the next batch's: it runs its input dist in its forward
        for later in self.contexts:
            later.clear_input_dists()
        self._pipelining = False
        logger.warning(
            "TrainPipelineSparseDist: the model did not pass the batch's KeyedJaggedTensor to its sharded "
            "collection(s) unchanged, so their input dists are no longer started ahead (results are unchanged)"
        )

    def _drop_in_flight(self) -> None:
        if any(context.has_input_dists() for context in self.contexts):
            self._pipeline().cancel(wait=True)
        self.batches.clear()
        self.contexts.clear()

    # ---- one step -----------------------------------------------------------------------------
    def _step(self, dataloader_iter: Iterator[In], training: bool) -> Out:
        if not self._attached:
            self.attach()
        self.fill_pipeline(dataloader_iter)
        if not self.batches:
            raise StopIteration
        if training:
            self._optimizer.zero_grad()
        self._wait_for_batch()
        if len(self.batches) >= 2:
            self.start_sparse_data_dist(self.batches[1], self.contexts[1])
        if len(self.batches) < 3:  # 3: a step that raised read it already (the retry reads no more)
            self.enqueue_batch(dataloader_iter)
        losses, output = self._model_fwd(self.batches[0])
        self._check_consumed(self.batches[0], self.contexts[0])
        if len(self.batches) >= 2:
            self.wait_sparse_data_dist(self.contexts[1])
        if training:
            self._backward(losses)
            self._optimizer.step()
        self.dequeue_batch()
        return output

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        """One step (training when the model is in training mode); ``StopIteration`` after the data."""
        return self._step(dataloader_iter, self._model.training)

    def detach(self) -> nn.Module:
        """Complete the input dists in flight (collective) and return the model, e.g. to evaluate it
        between training steps; the next ``progress`` re-attaches (batches in flight are kept)."""
        if any(context.has_input_dists() for context in self.contexts):
            self._pipeline().cancel(wait=True)
        for context in self.contexts:
            context.clear_input_dists()
        self._attached = False
        return self._model

    def attach(self, model: nn.Module | None = None, sparse_dist: bool = True) -> None:
        """Use ``model`` (default: the same) again; restart the input dist of the next batch. A
        ``custom_model_fwd`` given at construction stays the forward called."""
        if model is not None:
            self._model, self._sparse_dist, self._names = model, None, None
            self._model_fwd = self._custom_model_fwd or model
            self._pipelining = True  # the new model's collections may take the batch's KJTs
        self._attached = True
        if sparse_dist and self.batches:
            self.start_sparse_data_dist(self.batches[0], self.contexts[0])
            self.wait_sparse_data_dist(self.contexts[0])


class EvalPipelineSparseDist(TrainPipelineSparseDist[In, Out]):
    """The same pipeline without backward or optimizer step (run it under ``torch.no_grad()``).

    Args:
        model, optimizer, device: as :class:`TrainPipelineSparseDist` (``optimizer`` is not used).
        apply_jit: accepted for torchrec's signature.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 apply_jit: bool = False) -> None:  # fmt: skip
        super().__init__(model, optimizer, device, execute_all_batches=True, apply_jit=apply_jit)

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        return self._step(dataloader_iter, training=False)
