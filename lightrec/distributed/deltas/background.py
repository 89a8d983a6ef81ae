"""``BackgroundPublisher``: publish versions while training goes on; the step pays only for reading the rows.

A publish (:func:`~lightrec.distributed.deltas.publish_changes`) has a part that must happen at the
step the version holds and a part that need not::

    at the step (the caller's thread, every rank)         later (this publisher's thread, every rank)
    -----------------------------------------------       ---------------------------------------------
    the tracker's changed rows, their union over ranks    the rows' blocks and values to rank 0, over
    each rank copies the rows it owns (and rank 0 the     the publisher's own gloo group; rank 0 writes
    dense weights) -- the version is fixed here           the version (encode, hash, fsync, rename)

so :meth:`BackgroundPublisher.publish` returns as soon as the rows are copied, with a
:class:`PendingPublish`; training steps overlap the send and the write. The thread runs at the
lowest CPU priority by default (Linux ``SCHED_IDLE``; the gloo group's own threads are made from
it and inherit it): it takes the cycles training leaves idle -- a spare core, waits in collectives
-- rather than compete with it; if it starves, the next publish waits for it, and the core that
wait frees finishes it. Measured on the 2-rank DLRM (docs/deltas.md): where a core is spare the
step pays little more than the read (+2.7 % against +8.9 % for ``publish_changes``); where the
ranks use every core the write still costs about as much as when the step waits for it.

One publish is in flight at a time: the next ``publish`` waits for the one before and raises its
error there, so a failure (``ENOSPC``, a dead peer) stops training at the latest one cadence
later. Because the failed version's rows were taken from the tracker, the publish after a failure
is a snapshot.

Exactly what ``publish_changes`` writes: the same versions, bit for bit (the rows are copied at the
call; tests compare them with the model at that step).

::

    publisher = BackgroundPublisher(dmp)              # collective: every rank of the default group
    for step, batch in enumerate(batches, 1):
        train(dmp, batch)
        if step % 100 == 0:
            publisher.publish("publish/", tracker, consumer="publish", global_step=step)
    publisher.close()                                  # waits for the last one; raises its error
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import Unpack

from lightrec.distributed.comm.failures import timeout_of
from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.deltas.errors import DeltaFormatError
from lightrec.distributed.deltas.sharded_publish import (
    PreparedPublish,
    PublishOptions,
    finish_publish,
    prepare_publish,
    publish_group,
)
from lightrec.distributed.deltas.sharded_rows import PublishGroup
from lightrec.distributed.deltas.writer import DeltaWriter
from lightrec.distributed.model_tracker import ModelDeltaTracker

__all__ = ["PRIORITIES", "BackgroundPublisher", "PendingPublish"]

logger = logging.getLogger(__name__)


class PendingPublish:
    """A version being sent and written in the background (returned by :meth:`BackgroundPublisher.publish`).

    Attributes:
        global_step: the step the version holds.
        prepare_seconds: what the call took on the caller's thread (reading the rows).
        finish_seconds: the background part's wall time (None until done).
    """

    def __init__(self, global_step: int, prepare_seconds: float) -> None:
        self.global_step = global_step
        self.prepare_seconds = prepare_seconds
        self.finish_seconds: float | None = None
        self._done = threading.Event()
        self._version: int | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the version is written (or failed)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> int:
        """The version, once written. Raises what failed (as ``publish_changes`` would), or
        ``TimeoutError`` when ``timeout`` seconds pass first."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the publish of step {self.global_step} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._version is not None
        return self._version

    def _settle(self, version: int | None, error: BaseException | None, seconds: float) -> None:
        self._version, self._error, self.finish_seconds = version, error, seconds
        self._done.set()


PRIORITIES = ("idle", "low", "normal")
_LOW_NICE = 10  # CFS weight 110 against a training thread's 1024: ~10 % of a contended core, all of an idle one


def _lower_priority(priority: str) -> None:
    """This thread at ``priority`` (threads it starts inherit it); best effort (logged when refused)."""
    try:
        if priority == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # pid 0: this thread on Linux
        elif priority == "low":
            os.setpriority(os.PRIO_PROCESS, 0, _LOW_NICE)  # who 0: this thread on Linux
    except (AttributeError, OSError) as exc:  # not Linux, or refused
        logger.info("BackgroundPublisher: the publish thread keeps its priority (%s: %s)", priority, exc)


class BackgroundPublisher:
    """Publish a sharded model's versions from a background thread (see the module docstring).

    Args:
        model: a ``DistributedModelParallel`` or a module holding sharded collections, sharded over
            the whole default process group (or not distributed at all).
        priority: the CPU priority of the thread (and of its gloo group's threads, which inherit
            it): ``"idle"`` (Linux ``SCHED_IDLE``: idle cycles only; measured best when the ranks
            use every core), ``"low"`` (nice 10: idle cycles and about a tenth of a contended
            core), ``"normal"`` (a fair share, as training's).

    The constructor is collective over the default process group (it makes the publisher's gloo
    group of the model's ranks, from its own thread); so is :meth:`publish`, like ``publish_changes``.

    Raises:
        DeltaFormatError: the model holds no sharded collection, or is sharded over a subgroup.
    """

    def __init__(self, model: nn.Module, priority: str = "idle") -> None:
        if priority not in PRIORITIES:
            raise DeltaFormatError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        self.model = model
        self.priority = priority
        self._main = publish_group(model)
        if self._main.world > 1 and dist.get_world_size() != self._main.world:
            raise DeltaFormatError(f"BackgroundPublisher needs the model sharded over the whole default group "
                                   f"({dist.get_world_size()} ranks), not {self._main.world}; use publish_changes")  # fmt: skip
        self._jobs: queue.Queue[tuple[PreparedPublish, PendingPublish] | None] = queue.Queue()
        self._pending: PendingPublish | None = None
        self._snapshot_next = False
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="lightrec-delta-publisher",
                                                                 daemon=True)  # fmt: skip
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    # ---- the caller's side --------------------------------------------------------------------
    def publish(
        self,
        target: DeltaWriter | str | os.PathLike[str] | None,
        tracker: ModelDeltaTracker | None = None,
        **options: Unpack[PublishOptions],
    ) -> PendingPublish:
        """Read the rows of the next version now and send and write them in the background.

        Arguments as :func:`~lightrec.distributed.deltas.publish_changes`. Waits for the publish
        before it first (raising its error, if it failed; this publish is then a snapshot).

        Returns:
            The pending version (:meth:`PendingPublish.result` gives its number).
        """
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("this BackgroundPublisher is closed")
        self.wait()
        if self._snapshot_next:
            options["snapshot"] = True
        start = time.perf_counter()
        prepared = prepare_publish(self.model, target, tracker, **options)
        self._snapshot_next = False
        pending = PendingPublish(prepared.global_step, time.perf_counter() - start)
        self._pending = pending
        self._jobs.put((prepared, pending))
        return pending

    @property
    def pending(self) -> PendingPublish | None:
        """The publish in flight (None: none, or it was waited for)."""
        return self._pending

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the publish in flight; its version (None: none was in flight). Raises its error
        (once: the next publish is then a snapshot, as the failed version's rows were read)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            return pending.result(timeout)
        except TimeoutError:
            self._pending = pending
            raise
        except BaseException:
            self._snapshot_next = True
            raise

    def close(self) -> int | None:
        """Wait for the publish in flight, stop the thread, free the group. Returns (raises) as :meth:`wait`."""
        try:
            return self.wait()
        finally:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._jobs.put(None)
                thread.join()

    def __enter__(self) -> BackgroundPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            _lower_priority(self.priority)
            pg = None
            if self._main.world > 1:  # made here so that its transport threads inherit the priority
                ranks = dist.get_process_group_ranks(resolve_group(self._main.pg))
                pg = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout_of(self._main.pg))
            own = PublishGroup(pg, self._main.rank, self._main.world, torch.device("cpu"))  # gloo: host buffers
        except BaseException as exc:  # noqa: BLE001 - raised by the constructor
            self._start_error = exc
            return
        finally:
            self._started.set()
        try:
            while (job := self._jobs.get()) is not None:
                prepared, pending = job
                start = time.perf_counter()
                try:
                    version: int | None = finish_publish(prepared, own)
                    error: BaseException | None = None
                except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread by result()
                    version, error = None, exc
                del job, prepared  # the rows: free them before waiting for the next job
                pending._settle(version, error, time.perf_counter() - start)
        finally:
            if pg is not None:
                dist.destroy_process_group(pg)
