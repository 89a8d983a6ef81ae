"""``DeltaPublisher`` callback: publish the rows that training changed, every few steps or seconds.

::

    trainer = Trainer(strategy=RecStrategy(), devices=2, callbacks=[
        DeltaPublisher("publish/", every_n_steps=100, snapshot_every=50, dense_every=10, keep=2)])
    trainer.fit(module)      # publish/v000000001 (snapshot), v000000002 (delta), ...  LATEST

The folder is the format of ``docs/deltas.md`` (safetensors + JSON; ``lightrec serve --deltas``
follows it). What the callback does, on every rank of a ``RecStrategy`` fit (or a module holding
sharded collections):

1. at ``on_train_start``: the model's delta tracker (``DistributedModelParallel.
   init_torchrec_delta_tracker``, consumer ``"delta_publisher"``; an existing tracker is reused
   when it has that consumer) and, on rank 0, the ``DeltaWriter`` (every rank raises when rank 0
   cannot open it); then a snapshot (every row, the dense weights), so the chain starts from what
   training starts from (a resumed fit too);
2. after each training batch, when a publish is due (``every_n_steps`` global steps, or
   ``every_seconds`` since the last publish, rank 0's clock, broadcast so every rank agrees):
   :func:`lightrec.distributed.deltas.publish_changes` -- the rows the tracker saw since the last
   publish, gathered from the ranks that own them, written by rank 0 as the next version. Every
   ``snapshot_every``-th publish is a snapshot; every ``dense_every``-th carries the dense weights;
   the writer keeps ``keep`` snapshots and what follows them. With ``background=True`` (the
   default) the step only reads the rows: a :class:`~lightrec.distributed.deltas.BackgroundPublisher`
   sends and writes them while the next steps train, and its error, if any, is raised at the next
   publish. While a followed Parquet folder waits for its next file no batch ends: ``on_data_wait``
   (called by ``ParquetDataModule`` after each empty poll) checks ``every_seconds`` there too;
3. at ``on_train_end``: a last version if any step trained since the previous one, waited for;
   then the publish thread stops and a tracker the callback built stops recording (and leaves
   the DMP: the next fit builds a fresh one).

On an exception Lightning calls ``on_exception`` instead of ``on_train_end``, and a peer may be dead:
the callback waits for no version and makes no collective there -- the publish thread is told to
stop and joined for a few seconds (one stuck in a collective with a dead peer ends, freeing its
group, at the process group's timeout) -- and the tracker it built stops recording as at the end.
Lightning's SIGTERM stop (``SIGTERMException``) is the one exception after which the version in flight is
waited for (up to ``STOP_SECONDS``): every rank queued it at the same step and none is dead. No new
version is started then (which steps each rank trained before it stopped is not agreed).

A version holds the model after the step it names (``global_step``), bit for bit in fp32.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
from collections.abc import Mapping
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn
from typing_extensions import override

from lightrec.distributed.deltas import (
    BackgroundPublisher,
    DeltaFormatError,
    DeltaPublishError,
    DeltaWriter,
    publish_changes,
    sharded_table_specs,
)
from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.model_tracker import DeltaTrackerConfig, ModelDeltaTracker, ModelDeltaTrackerTrec
from lightrec.lightning.rec_strategy import RecStrategy

__all__ = ["DeltaPublisher"]

CONSUMER = "delta_publisher"
ABORT_SECONDS = 5.0  # on_exception's bound on joining the publish thread (a version in flight may finish)
STOP_SECONDS = 20.0  # on a SIGTERM stop, the bound on waiting for the version in flight (Kubernetes grants 30 s)

logger = logging.getLogger(__name__)


def _count(name: str, value: int | None) -> int | None:
    """``value`` as a plain int > 0, or None. A step count given as ``"100"``, ``2.5`` or ``True`` used to
    fail later, at a comparison (``TypeError``) or in the writer (naming its ``retention``, not ``keep``),
    or to be taken as a cadence of 1 (``True``); a numpy int is taken (the writer checks for ``int``)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f"DeltaPublisher({name}={value!r}): must be an int > 0 (or None to turn it off)")
    _positive(name, value)
    return None if value is None else int(value)


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise ValueError(f"DeltaPublisher({name}={value!r}): must be a number > 0 (or None to turn it off)")
    if value is not None and not value > 0:
        raise ValueError(f"DeltaPublisher({name}={value!r}): must be > 0 (or None to turn it off)")


class DeltaPublisher(pl.Callback):
    """Publish a sharded model's changed rows as versions of ``dirpath`` (see the module docstring).

    Args:
        dirpath: the publish folder (rank 0 writes it; created when missing). None: ``publish/`` in the
            trainer's log folder (beside ``checkpoints/``, as ``ModelCheckpoint`` places its own).
        every_n_steps: publish after every N-th global step.
        every_seconds: publish when this many seconds passed since the last publish (checked after
            each batch). At least one of the two must be given.
        snapshot_every: every N-th publish is a full snapshot (bounds the chain a reader applies);
            None: only the first.
        dense_every: every N-th publish carries the dense weights (snapshots always do); None: only
            snapshots.
        keep: snapshots kept, with the deltas after them (``DeltaWriter``'s retention); None keeps all.
        row_format: the rows' format (``"fp32"``, ``"fp16"``, ``"int8"``, ``"int4"``) or ``{table: format}``.
        model_attr: the LightningModule's attribute holding the model a serving artifact is exported
            from (``QuantizedExport``'s); the dense weights are named as in its state dict.
        background: send and write each version from a background thread at idle priority while
            training goes on (the step pays for reading the rows only); False: the step waits
            for the write (``publish_changes``).

    Attributes:
        versions: ``[(version, global_step)]`` written so far (on every rank; with ``background``,
            a version is listed once the next publish, or the end of training, has waited for it).
        seconds: wall-clock seconds each publish held the training step, in order (this rank's).
        background_seconds: with ``background``, the wall-clock seconds of each version's
            background part (send, write), in order.

    Raises:
        ValueError: no cadence, a cadence <= 0, or (at train start) a model without sharded tables.
        DeltaFormatError / DeltaPublishError: (at train start, on every rank) rank 0 could not open the
            folder: ``row_format`` names a table the model does not have, the folder is not writable, ...
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        every_n_steps: int | None = None,
        every_seconds: float | None = None,
        snapshot_every: int | None = None,
        dense_every: int | None = None,
        keep: int | None = 2,
        row_format: str | Mapping[str, str] = "fp32",
        model_attr: str = "model",
        background: bool = True,
    ) -> None:
        if every_n_steps is None and every_seconds is None:
            raise ValueError("DeltaPublisher needs a cadence: every_n_steps=N and/or every_seconds=S")
        _positive("every_seconds", every_seconds)
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.every_n_steps = _count("every_n_steps", every_n_steps)
        self.every_seconds = every_seconds
        self.snapshot_every = _count("snapshot_every", snapshot_every)
        self.dense_every = _count("dense_every", dense_every)
        self.keep = _count("keep", keep)
        self.row_format = row_format
        self.model_attr = model_attr
        self.background = background
        self.background_seconds: list[float] = []
        self._publisher: BackgroundPublisher | None = None
        self._dense: nn.Module | None = None
        self.versions: list[tuple[int, int]] = []
        self.seconds: list[float] = []
        self._model: nn.Module | None = None
        self._tracker: ModelDeltaTracker | None = None
        self._built: ModelDeltaTrackerTrec | None = None  # the tracker this callback made (closed at the end)
        self._writer: DeltaWriter | None = None
        self._last_time = 0.0
        self._last_step = -1
        self._last_dense = False  # whether the newest version carries the dense weights (a snapshot does)

    # ---- set-up -----------------------------------------------------------------------------
    @staticmethod
    def _sharded_model(trainer: pl.Trainer, pl_module: pl.LightningModule) -> nn.Module:
        strategy = trainer.strategy
        if isinstance(strategy, RecStrategy) and strategy.dmp is not None:
            return strategy.dmp
        return pl_module  # sharded by the user (its collections are sharded modules)

    def _make_tracker(self, model: nn.Module) -> ModelDeltaTracker:
        self._built = None
        if not isinstance(model, DistributedModelParallel):
            self._built = ModelDeltaTrackerTrec(model, consumers=[CONSUMER])
            return self._built
        existing = model.get_delta_tracker()
        if existing is None:
            made = model.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=[CONSUMER]))
            self._built = made if isinstance(made, ModelDeltaTrackerTrec) else None
            return made
        if not isinstance(existing, ModelDeltaTrackerTrec) or CONSUMER not in existing.per_consumer_batch_idx:
            raise ValueError(f"the model already has a delta tracker without the consumer {CONSUMER!r}; build it "
                             f"with DeltaTrackerConfig(consumers=[..., {CONSUMER!r}]) or let DeltaPublisher build it")  # fmt: skip
        return existing

    def _release_tracker(self) -> None:
        """Stop the tracker this callback built from recording: read by no one after training, it would
        keep every training lookup. It leaves its DMP too, so that a later fit builds a live one
        instead of reusing a closed one. A tracker the user built is left as it is."""
        built, self._built, self._tracker = self._built, None, None
        if built is None:
            return
        built.close()
        if isinstance(self._model, DistributedModelParallel):
            for name, held in list(self._model.model_trackers.items()):
                if held is built:
                    del self._model.model_trackers[name]

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._model = self._sharded_model(trainer, pl_module)
        try:
            self._dense = pl_module.get_submodule(self.model_attr)
        except AttributeError as exc:
            raise ValueError(f"DeltaPublisher(model_attr={self.model_attr!r}): {type(pl_module).__name__} has no module "
                             "there; pass model_attr='<attribute holding the model>'") from exc  # fmt: skip
        self._tracker = self._make_tracker(self._model)
        # trainer.log_dir broadcasts rank 0's folder (a collective): every rank must ask, or rank 0 waits in that
        # broadcast while the others wait in publish_changes' all_gather (a hang until the process-group timeout)
        log_dir = trainer.log_dir if self.dirpath is None else None
        self._open_writer(trainer, self._model, log_dir)
        if self.background:
            self._publisher = BackgroundPublisher(self._model)
        self._publish(trainer, snapshot=True)

    def _open_writer(self, trainer: pl.Trainer, model: nn.Module, log_dir: str | None) -> None:
        """Rank 0 opens the ``DeltaWriter``; every rank learns whether it could (a collective).

        Only rank 0 checks ``row_format`` against the tables and touches the folder, so without the
        agreement a bad ``row_format`` or a folder rank 0 may not write failed rank 0 alone, and the
        other ranks waited in the publisher's first collective until a timeout, with no word of why.

        Raises:
            DeltaFormatError: rank 0 refused the arguments (``row_format`` naming no table, ...).
            DeltaPublishError: rank 0 could not open the folder (on rank 0: its own error, e.g. ``OSError``).
        """
        failure: Exception | None = None
        if trainer.is_global_zero:
            try:
                specs = sharded_table_specs(model, self.row_format)
                if self.dirpath is None:
                    self.dirpath = Path(log_dir or trainer.default_root_dir) / "publish"
                self._writer = DeltaWriter(self.dirpath, specs, retention=self.keep)
            except Exception as exc:  # noqa: BLE001 - told to every rank below, then raised
                failure = exc
        described = None if failure is None else (type(failure).__name__, str(failure))
        described = trainer.strategy.broadcast(described, src=0)
        if failure is not None:
            raise failure
        if described is not None:
            kind, message = described
            if kind == "DeltaFormatError":
                raise DeltaFormatError(f"rank 0 refused the DeltaPublisher's arguments: {message}")
            raise DeltaPublishError(f"rank 0 could not open the publish folder ({kind}: {message}); make it writable "
                                    "on rank 0's host, or pass another dirpath")  # fmt: skip

    # ---- cadence ------------------------------------------------------------------------------
    def _due(self, trainer: pl.Trainer) -> bool:
        step = trainer.global_step
        if step == self._last_step:
            # one version per global step (under gradient accumulation several batches end at one step);
            # every rank has the same step and _last_step, so all skip the broadcast below alike
            return False
        due = self.every_n_steps is not None and step % self.every_n_steps == 0
        if self.every_seconds is not None:
            timed = trainer.is_global_zero and time.monotonic() - self._last_time >= self.every_seconds
            due = due or bool(trainer.strategy.broadcast(timed, src=0))  # rank 0's clock decides for all
        return due

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object, batch: object,
                           batch_idx: int) -> None:  # fmt: skip
        self._publish_if_due(trainer)

    def _publish_if_due(self, trainer: pl.Trainer) -> None:
        """The next version, where the cadence says one is due (collective where ``_due`` is)."""
        if self._model is not None and self._due(trainer):
            count = len(self.seconds)  # publishes so far, written or in flight (the first was a snapshot)
            snapshot = self.snapshot_every is not None and count % self.snapshot_every == 0
            dense = self.dense_every is not None and count % self.dense_every == 0
            self._publish(trainer, snapshot=snapshot, dense=dense)

    def on_data_wait(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """While a followed folder has no new file (``lightrec.data.parquet.WaitsForData``; every rank after each
        empty poll): publish the steps trained since the last version once ``every_seconds`` has come, rather
        than when the next file lands and a batch ends. ``every_n_steps`` alone: nothing (no step ends here)."""
        if self.every_seconds is not None:
            self._publish_if_due(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._model is not None and (
            trainer.global_step != self._last_step or (self.dense_every is not None and not self._last_dense)
        ):
            # The last version holds the final rows and, where dense weights are published at all, the final
            # dense weights: a version the cadence wrote at this very step without them would leave a server
            # with the dense layers of an older version (measured: all 10 dense tensors stale at step 100).
            self._publish(trainer, snapshot=False, dense=self.dense_every is not None)
        try:
            if self._publisher is not None:
                try:
                    self._wait_for_pending(trainer)  # the last version (raises its error)
                finally:
                    publisher, self._publisher = self._publisher, None
                    publisher.close()  # stops the thread, frees its group
        finally:
            self._release_tracker()
            self._model = self._dense = None

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # No on_train_end follows, and a peer may be dead: wait for no version, make no collective
        # (abort's join is bounded); without this the thread would sit on its queue forever, holding
        # its gloo group, and the tracker would keep every training lookup
        publisher, self._publisher = self._publisher, None
        if publisher is not None and isinstance(exception, SIGTERMException):
            self._finish_in_flight(trainer, publisher)
        if publisher is not None and not publisher.abort(ABORT_SECONDS):
            logger.warning("DeltaPublisher: the publish thread is still inside a collective %.0f s after the "
                           "exception (a peer stuck or dead); it ends, freeing its process group, at the group's "
                           "timeout", ABORT_SECONDS)  # fmt: skip
        self._release_tracker()
        self._model = self._dense = None

    def _finish_in_flight(self, trainer: pl.Trainer, publisher: BackgroundPublisher) -> None:
        """On Lightning's SIGTERM stop, let the version in flight land (for at most ``STOP_SECONDS``): every
        rank queued it at the same step, and a stopped job's peers are alive, so its collectives complete --
        where ``abort`` alone would drop a version queued by the step before the stop (measured: the
        2-rank online recipe stopped right after a batch-end publish left only the start's snapshot)."""
        pending = publisher.pending
        try:
            version = publisher.wait(STOP_SECONDS)
        except Exception as exc:  # noqa: BLE001 -- the stop goes on; abort gives the version up
            logger.warning("DeltaPublisher: the version in flight at SIGTERM did not land: %s", exc)
            return
        if pending is not None and version is not None:
            self._record(trainer, version, pending.global_step, pending.finish_seconds)

    # ---- publish ------------------------------------------------------------------------------
    def _publish(self, trainer: pl.Trainer, snapshot: bool, dense: bool = False) -> None:
        assert self._model is not None
        start = time.perf_counter()
        step = trainer.global_step
        if self._publisher is not None:
            self._wait_for_pending(trainer)  # the version before, with its error
            self._publisher.publish(self._writer, self._tracker, consumer=CONSUMER, dense=dense,
                                                    snapshot=snapshot, global_step=step, dense_module=self._dense)  # fmt: skip
        else:
            version = publish_changes(self._model, self._writer, self._tracker, consumer=CONSUMER, dense=dense,
                                      snapshot=snapshot, global_step=step, dense_module=self._dense)  # fmt: skip
            self._record(trainer, version, trainer.global_step, None)
        elapsed = time.perf_counter() - start
        self.seconds.append(elapsed)
        self._last_time = time.monotonic()
        self._last_step = trainer.global_step
        self._last_dense = snapshot or dense
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({"publish/seconds": elapsed}, step=trainer.global_step)
            rank_zero_info(f"DeltaPublisher: {'snapshot' if snapshot else 'delta'} of step {trainer.global_step} read "
                           f"in {elapsed:.3f}s{', writing it in the background' if self._publisher else ''} -> "
                           f"{self.dirpath}")  # fmt: skip

    def _wait_for_pending(self, trainer: pl.Trainer) -> None:
        """Wait for the publisher's version in flight (raising its error) and record it."""
        assert self._publisher is not None
        pending = self._publisher.pending
        version = self._publisher.wait()
        if pending is not None and version is not None:
            self._record(trainer, version, pending.global_step, pending.finish_seconds)

    def _record(self, trainer: pl.Trainer, version: int, step: int, background: float | None) -> None:
        self.versions.append((version, step))
        metrics = {"publish/version": float(version)}
        if background is not None:
            self.background_seconds.append(background)
            metrics["publish/background_seconds"] = background
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
