"""``SparseDistPrefetch``: pipelined training -- the next batch's input dist travels during this step.

A sharded embedding step is *input dist* (the KJT all-to-alls that send every id to the rank
owning its row: a splits exchange, then lengths / values / weights), *lookup* (reads the rows;
the fused optimizer updates them in backward) and *output dist*. The input dist only reads the
ids, so it may run early; the lookup may not (it must see the rows the previous backward wrote).
With this callback, training step ``i`` runs, on every rank in the same order::

    on_train_batch_start(i)  take batch i+1 from the fit loop's data fetcher, move it to the
                             device and start its splits exchange (CUDA: both on a side stream)
    training_step(i)         forward of batch i: its input dist is already done (wait for the last
                             exchange), lookup, output dist, dense layers
    on_before_backward(i)    wait for batch i+1's splits, start its lengths/values/weights exchange
                             (CUDA: on the side stream, so the host waits for the splits only)
    backward(i)              the exchange travels while gradients flow; rows are updated
    on_train_batch_end(i)    CUDA: the main stream waits for batch i+1's copy
    training_step(i+1)       lookup of batch i+1 reads the updated rows (CUDA: after the main
                             stream waited for its input dist)

so the losses and tables are bit-identical to training without the callback (tested). Batches
with no successor (the last of an epoch) simply are not prefetched; a validation loop between two
training steps runs its own forwards while batch i+1's exchange waits; anything started for a batch
that is never trained (``max_steps`` reached mid-epoch, early stopping) is completed and dropped at
the end of the epoch.

Requirements (otherwise the callback warns once and does nothing): the model holds sharded
collections (``ShardedEmbeddingBagCollection`` / ``ShardedEmbeddingCollection``, as ``RecStrategy``
builds), the world size is above 1, or the model is on a GPU (one GPU still has a host-to-device
copy and a host sync to take off the critical path), or it has tiered tables (one CPU process:
their next batch's rows are fetched from SSD during this backward), the batch holds a ``KeyedJaggedTensor`` with
exactly the features of a sharded collection, and ``training_step`` takes a batch (not
``dataloader_iter``).

The stages run through the one pipelining seam of the sharded collections,
``lightrec.distributed.train_pipeline.sparse_dist_pipeline.SparseDistPipeline`` (``DistributedModelParallel``'s
look-ahead and a train pipeline use it too); the forward of batch i+1 takes the work started for
it by its KJT's tensors. Where batch i+1 comes from, and how it replaces the batch Lightning would
otherwise move itself, is ``lightrec/lightning/callbacks/next_batch.py`` -- the one place that reaches into
Lightning's data fetcher, which has no public hook for it.

CUDA streams (``lightrec/distributed/comm/streams.py``): the copy of batch i+1 and both stages of its
input dist are issued on one side stream, so they overlap step i's kernels on the main stream. The
side stream first waits for what is already queued on the main stream (batch i+1 may be on the
device already, drawn there by kernels queued during step i-1); step i's kernels come later. The
stage-2 host sync (the receive sizes) waits for the count exchange only, not for step i's queued
work. The main stream waits for the copy (an event recorded right after it) at the end of step i,
once step i's kernels are queued, and for the input dist inside the forward of batch i+1;
``record_stream`` marks the copied batch and everything the input dist produced as used by the
main stream, so the caching allocator does not hand their memory to the side stream while the
main stream still reads it. On CPU nothing of this applies and the pipeline is bit-identical to
training without it.

Interaction with Lightning's batch hooks: batch i+1 is moved with ``strategy.batch_to_device``
one step early; Lightning then still runs ``convert_input``, ``on_before_batch_transfer`` and
``batch_to_device`` on it when its turn comes (they find it on the device already, and
``RecStrategy.batch_to_device`` reuses the same tensors, in a new ``KeyedJaggedTensor``). A hook
that rebuilds the sparse features out of new tensors defeats the pipeline: at
``on_train_batch_start(i+1)`` no started work matches the batch, and the callback warns and turns
itself off.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightrec.distributed.comm.streams import record_stream_all, wait_for_current
from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline, sharded_collections
from lightrec.lightning.callbacks.next_batch import NextTrainingBatch, UnsupportedFetch

__all__ = ["SparseDistPrefetch"]


class SparseDistPrefetch(pl.Callback):
    """Start the next batch's embedding input dist while the current batch trains (see the module docstring).

    Example::

        trainer = Trainer(strategy=RecStrategy(), accelerator="cpu", devices=2,
                          callbacks=[SparseDistPrefetch()])

    Results are identical with and without it; what it saves per step is the input dist's
    latency (two all-to-all round trips and a host sync), which otherwise sits between the
    start of the forward and the lookup.
    """

    def __init__(self) -> None:
        # The pipeline over the model's sharded collections (None: the callback is off).
        self._pipeline: SparseDistPipeline | None = None
        self._next = NextTrainingBatch()
        # Whether the input dist of the next training batch is in flight (its forward takes it).
        self._started = False
        self._copy_stream: torch.cuda.Stream | None = None
        # CUDA: events recorded on the side stream right after the copies of batches read ahead
        self._copied: list[torch.cuda.Event] = []
        self._warned: set[str] = set()

    @property
    def side_stream(self) -> torch.cuda.Stream | None:
        """The CUDA stream the next batch's copy and input dist are issued on (None on CPU)."""
        return self._copy_stream

    # ------------------------------------------------------------------ set-up
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(f"SparseDistPrefetch: {message}", category=UserWarning)

    def _stop(self, wait: bool) -> None:
        """Complete (``wait``, collective) or forget the started input dists; turn the pipeline off.

        A batch already copied on the side stream stays in ``_copied``: the main stream must still
        wait for its copy at the end of the step.
        """
        if self._pipeline is not None:
            self._pipeline.cancel(wait=wait)
        self._pipeline = None
        self._started = False

    def _disable(self, key: str, message: str) -> None:
        self._warn_once(key, message + "; the callback does nothing for the rest of this fit")
        self._stop(wait=True)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(wait=False)  # nothing is in flight between two fits
        self._copied = []
        collections = sharded_collections(pl_module)
        if not collections:
            self._warn_once(
                "collections",
                "the model holds 0 sharded embedding collections (train with RecStrategy, which shards the "
                "EmbeddingBagCollection/EmbeddingCollection) -- nothing to prefetch, the callback does nothing",
            )
            return
        root = trainer.strategy.root_device
        if trainer.world_size == 1 and root.type != "cuda" and not any(c.prefetches for c in collections):
            self._warn_once(
                "world",
                "world size is 1 on CPU: there is no all-to-all to overlap, the callback does nothing",
            )
            return
        self._pipeline = SparseDistPipeline(collections)
        if root.type == "cuda" and (self._copy_stream is None or self._copy_stream.device != root):
            self._copy_stream = torch.cuda.Stream(device=root)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(wait=True)
        self._copied = []

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop(wait=False)  # other ranks may be gone: no collective
        self._copied = []

    # ------------------------------------------------------------------ the pipeline
    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        pipeline = self._pipeline
        if pipeline is None:
            return
        if self._started and not pipeline.started_for(batch):
            self._disable(
                "rebuilt",
                "the batch reaching training_step does not hold the sparse features whose input dist was "
                "started (does on_before_batch_transfer/transfer_batch_to_device build new tensors?)",
            )
            return
        self._started = False
        try:
            slot = self._next.slot(trainer)
        except UnsupportedFetch as exc:
            self._disable("fetch", str(exc))
            return
        if slot is None:
            return  # last batch of the epoch
        next_batch, put = slot
        next_batch = self._to_device(trainer, next_batch)
        put(next_batch)
        if self._copy_stream is not None:
            copied = torch.cuda.Event()
            copied.record(self._copy_stream)
            self._copied.append(copied)
        if not pipeline.start(next_batch, stream=self._copy_stream):
            features = [c.feature_names() for c in pipeline.collections]
            self._disable(
                "keys",
                f"the batch holds no KeyedJaggedTensor with exactly the features of a sharded collection "
                f"({features})",
            )
            return
        self._started = True

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        # CUDA: batch i+1 was copied on the side stream during step i. The main stream waits for
        # that copy now -- after step i's kernels, so the copy overlapped them, and before Lightning's
        # batch hooks or a validation loop may read batch i+1 on the main stream. (The forward of
        # batch i+1 waits for its input dist.)
        if self._copied:
            main = torch.cuda.current_stream(trainer.strategy.root_device)
            for copied in self._copied:
                main.wait_event(copied)
            self._copied = []

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._pipeline is not None:
            self._pipeline.progress()
            self._pipeline.prefetch()  # tables behind a cache fetch batch i+1's rows during backward i

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The epoch ended before the prefetched batch was trained (max_steps, early stopping, a
        # hook returning -1): complete its exchanges on every rank and forget it.
        if self._pipeline is not None:
            self._pipeline.cancel(wait=True)
        self._started = False
        self._copied = []

    # ------------------------------------------------------------------ helpers
    def _to_device(self, trainer: pl.Trainer, batch: object) -> object:
        strategy = trainer.strategy
        if self._copy_stream is None or strategy.root_device.type != "cuda":
            return strategy.batch_to_device(batch, dataloader_idx=0)
        # A batch already on the device (drawn on the GPU, or a loader yielding CUDA tensors) may
        # be written by kernels still queued on the main stream: the side stream reads it only
        # after them (step i's kernels, queued later, still overlap the copy and input dist).
        wait_for_current(self._copy_stream, strategy.root_device)
        # Host memory the copy reads must not be reused before the side stream ran the copy. The
        # fetcher then holds the *moved* batch, so nothing of ours keeps the host tensors alive:
        # torch's pinned-memory allocator does (it records an event on every non-blocking copy
        # from memory it pinned and reuses the block only after it). Memory pinned elsewhere (a
        # loader's own registered buffers) is not protected that way; such a loader must keep
        # its buffers until the copy ran.
        with torch.cuda.stream(self._copy_stream):
            moved = strategy.batch_to_device(batch, dataloader_idx=0)
        # The main stream reads these tensors from the end of step i on (it waits for the copy
        # then): the allocator must not recycle them before the main stream is done with them.
        record_stream_all(moved, torch.cuda.current_stream(strategy.root_device))
        return moved
