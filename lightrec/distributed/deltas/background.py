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
is a snapshot (``publish_changes``' rule: a failure in the read at the step or in the thread marks
the tracker's consumer, and rank 0 makes the next publish reading it a snapshot).

``close`` waits for the version in flight, as the end of training should. After an exception --
when a peer may be dead and a collective would wait for it until the process group's timeout --
``abort`` (what leaving a ``with`` block by an exception does) stops the thread without waiting on
anyone: a version not yet started is dropped, and the thread is joined for a bounded time (one
stuck in a collective with a dead peer ends, freeing its group, when that collective times out).

Exactly what ``publish_changes`` writes: the same versions, bit for bit (the rows are copied at the
call; tests compare them with the model at that step).

::

    publisher = BackgroundPublisher(dmp)              # collective: every rank of the default group
    for step, batch in enumerate(batches, 1):
        train(dmp, batch)
        if step % 100 == 0:
            publisher.publish("publish/", tracker, consumer="publish", global_step=step)
    publisher.close()                                  # waits for the last one; raises its error
    # on an exception instead: publisher.abort()      # waits for nobody
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
    abandon_publish,
    finish_publish,
    prepare_publish,
    publish_group,
)
from lightrec.distributed.deltas.sharded_rows import DeltaPublishError, PublishGroup
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
        self._aborted = threading.Event()  # set by abort(): the thread starts no further version
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
        before it first (raising its error, if it failed; the next publish is then a snapshot, as
        it is after a failure of this call's own read: ``publish_changes``' rule).

        Returns:
            The pending version (:meth:`PendingPublish.result` gives its number).
        """
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("this BackgroundPublisher is closed")
        self.wait()
        start = time.perf_counter()
        prepared = prepare_publish(self.model, target, tracker, **options)  # a failure marks the tracker
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

    def close(self) -> int | None:
        """Wait for the publish in flight, stop the thread, free the group. Returns (raises) as :meth:`wait`."""
        try:
            return self.wait()
        finally:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._jobs.put(None)
                thread.join()

    def abort(self, timeout: float = 5.0) -> bool:
        """Stop the thread without waiting on any peer (after an exception, when one may be dead).

        The version in flight is given up (its outcome is not raised here; ``PendingPublish.result``
        still reports it once the thread settles it); one the thread has not started yet is dropped
        (failed with ``DeltaPublishError``), as its collectives could wait for a dead peer. Then the
        thread is told to stop and joined for at most ``timeout`` seconds. The tracker's consumer is
        left marked when the version fails, so a later publish with it is a snapshot.

        Returns:
            True: the thread has ended and destroyed its group. False: it is still inside a collective
            of the version in flight (a peer stuck or dead); it ends, destroying its group, when that
            collective completes or fails by the process group's timeout (a daemon thread: it never
            holds the process open).
        """
        self._aborted.set()
        self._pending = None
        thread, self._thread = self._thread, None
        if thread is None or not thread.is_alive():
            return True
        self._jobs.put(None)
        thread.join(timeout)
        return not thread.is_alive()

    def __enter__(self) -> BackgroundPublisher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # leaving by an exception: a peer may be gone, so wait for nobody
            self.abort()

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
                version: int | None = None
                error: BaseException | None = None
                if self._aborted.is_set():  # its collectives could wait for a dead peer: never start it
                    error = DeltaPublishError(f"the publish of step {pending.global_step} was dropped: "
                                              "BackgroundPublisher.abort() came first; nothing was written")  # fmt: skip
                    abandon_publish(prepared)
                else:
                    try:
                        version = finish_publish(prepared, own)
                    except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread by result()
                        error = exc
                del job, prepared  # the rows: free them before waiting for the next job
                pending._settle(version, error, time.perf_counter() - start)
        finally:
            if pg is not None:
                dist.destroy_process_group(pg)
