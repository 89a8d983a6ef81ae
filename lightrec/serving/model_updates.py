"""Follow an updater: poll it on a thread of the worker and apply what it returns between batches.

:class:`UpdateFollower` is the loop around a :class:`~lightrec.serving.served_model.ModelUpdater`,
and the only thread that does so in a worker (``lightrec.serving.deltas``' follower polls when it
is asked to and owns no thread)::

    catch_up()            at worker start-up, before the worker reports ready: poll + apply until
                          nothing newer is published (a worker started late serves the newest version)
    start()               a daemon thread: every ``interval_s``, poll + apply until nothing is newer
    stop()                ends the thread (at most one interval later)

A refusal -- ``poll`` raises (a checksum mismatch, a partial folder, a gap), or ``apply`` raises
:class:`~lightrec.serving.served_model.UpdateRefused` having left the model as it was -- is logged
and counted (``lightrec_serving_updates_total{outcome="refused"}``, one per refused version, one per failed
poll that names none -- an unreadable folder counts at every interval); the
served version stays. After an ``UpdateRefused`` that names versions the follower polls again at
once (the source never offers a refused version again, so the next good one is applied now);
after any other error it waits for the next interval. An ``apply`` that fails part way
(:class:`~lightrec.serving.served_model.UpdateFailed`) marks the worker damaged (its ``/health``
turns 503) and stops following.

:func:`delta_updater_factory` is what ``lightrec serve --deltas DIR`` uses: the updater of
``lightrec.serving.deltas`` over a publish folder (format in ``docs/deltas.md``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

from lightrec.serving.deltas.updater import open_updater
from lightrec.serving.metrics import WorkerMetrics
from lightrec.serving.served_model import (
    ModelUpdater,
    ServedModel,
    UpdateFailed,
    UpdateRefused,
    UpdaterFactory,
)

__all__ = ["UpdateFollower", "delta_updater_factory"]

log = logging.getLogger(__name__)

# Polls in one catch-up at most: a follower never loops forever on an updater that keeps
# returning updates (a bug), and a long chain is still applied over a few intervals.
_MAX_POLLS_PER_CATCH_UP = 10_000


def delta_updater_factory(directory: str | os.PathLike[str]) -> UpdaterFactory:
    """The :data:`~lightrec.serving.served_model.UpdaterFactory` of ``--deltas DIR`` (picklable:
    a partial of a module-level function, sent to every worker process)."""
    return functools.partial(open_updater, os.fspath(directory))


class UpdateFollower:
    """Polls ``updater`` and applies its updates to ``model`` (see the module docstring).

    Args:
        model: the worker's served model.
        updater: where updates come from.
        interval_s: seconds between polls once caught up.
        metrics: the worker's metrics slot (version, freshness lag, applied/refused counts).
    """

    def __init__(self, model: ServedModel, updater: ModelUpdater, interval_s: float, metrics: WorkerMetrics) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.model = model
        self.updater = updater
        self.interval_s = float(interval_s)
        self.metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def catch_up(self) -> int:
        """Poll and apply until the updater has nothing newer (or fails in a way that says nothing new).

        Returns:
            How many updates were applied.

        Raises:
            UpdateFailed: an apply failed part way (the worker is marked damaged first).
        """
        applied = 0
        for _ in range(_MAX_POLLS_PER_CATCH_UP):
            if self._stop.is_set():
                break
            try:
                update = self.updater.poll()
                if update is None:
                    break
                self.model.apply(update)
            except UpdateFailed as exc:
                log.error("%s", exc)
                self.metrics.set_damaged()
                raise
            except Exception as exc:  # a refused version must never stop the server: log, count, go on
                versions = exc.versions if isinstance(exc, UpdateRefused) else ()
                log.warning("update refused; still serving version %d: %s: %s", self.model.version,
                            type(exc).__name__, exc)
                self.metrics.update_refused(max(1, len(versions)))
                if not versions:
                    break  # nothing learned: the same poll would fail again; retry at the next interval
                continue
            self.metrics.update_applied(self.model.version, self.model.published_at, time.time())
            applied += 1
        return applied

    def start(self) -> None:
        """Follow on a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lightrec-update-follower", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop following (the thread ends after its current poll)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.catch_up()
            except UpdateFailed:
                return  # damaged: stop writing into a model nobody can trust; /health reports it
