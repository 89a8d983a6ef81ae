"""Follow an updater: poll it on a thread of the worker and apply what it returns between batches.

:class:`UpdateFollower` is the loop around a :class:`~lightrec.serving.served_model.ModelUpdater`::

    catch_up()            at worker start-up, before the worker reports ready: poll + apply until
                          nothing newer is published (a worker started late serves the newest version)
    start()               a daemon thread: every ``interval_s``, poll + apply until nothing is newer
    stop()                ends the thread (at most one interval later)

A version the updater refuses (``poll`` raises: a checksum mismatch, a partial folder, a gap) is
logged and counted (``lightrec_serving_updates_total{outcome="refused"}``); the served version
stays, and the next poll tries again, so the next good version is applied. An ``apply`` that fails
part way marks the worker damaged (its ``/health`` turns 503) and stops following.

:func:`delta_updater_factory` is what ``lightrec serve --deltas DIR`` uses: the updater of
``lightrec.serving.deltas`` over a publish folder (format in ``docs/serving.md``), imported when the
first worker starts, so that a server without ``--deltas`` never needs it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
import time
from pathlib import Path

from lightrec.serving.metrics import WorkerMetrics
from lightrec.serving.served_model import ModelUpdater, ServedModel, UpdateFailed, UpdaterFactory

__all__ = ["DELTAS_MODULE", "DeltasUnavailable", "UpdateFollower", "check_deltas_available", "delta_updater_factory"]

log = logging.getLogger(__name__)

# The package that applies published deltas to a served model; it provides
# ``open_updater(directory: Path, model: ServedModel) -> ModelUpdater``.
DELTAS_MODULE = "lightrec.serving.deltas"

# Versions applied in one catch-up at most: a follower never loops forever on an updater that
# keeps returning updates (a bug), and a long chain is still applied over a few intervals.
_MAX_UPDATES_PER_POLL = 10_000


class DeltasUnavailable(ImportError):
    """``--deltas`` was given but ``lightrec.serving.deltas`` cannot be imported."""


def check_deltas_available() -> None:
    """Raise :class:`DeltasUnavailable` (with what to do) unless :data:`DELTAS_MODULE` imports and
    provides ``open_updater``; the server calls it before starting any worker."""
    try:
        module = importlib.import_module(DELTAS_MODULE)
    except ImportError as exc:
        raise DeltasUnavailable(
            f"--deltas needs {DELTAS_MODULE} (applying published deltas to a served model), which this lightrec "
            f"cannot import ({type(exc).__name__}: {exc}); update lightrec, or serve the artifact without --deltas"
        ) from exc
    if not callable(vars(module).get("open_updater")):
        raise DeltasUnavailable(f"{DELTAS_MODULE} has no open_updater(directory, model); update lightrec")


def _open_delta_updater(directory: str, model: ServedModel) -> ModelUpdater:
    module = importlib.import_module(DELTAS_MODULE)
    updater: ModelUpdater = module.open_updater(Path(directory), model)
    return updater


def delta_updater_factory(directory: str | os.PathLike[str]) -> UpdaterFactory:
    """The :data:`~lightrec.serving.served_model.UpdaterFactory` of ``--deltas DIR`` (picklable:
    a partial of a module-level function, sent to every worker process)."""
    check_deltas_available()
    return functools.partial(_open_delta_updater, os.fspath(directory))


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
        """Poll and apply until the updater has nothing newer (or refuses a version).

        Returns:
            How many updates were applied.

        Raises:
            UpdateFailed: an apply failed part way (the worker is marked damaged first).
        """
        applied = 0
        while applied < _MAX_UPDATES_PER_POLL and not self._stop.is_set():
            try:
                update = self.updater.poll()
            except Exception as exc:  # a refused version must never stop the server: log, count, retry later
                log.warning("update refused; still serving version %d: %s: %s", self.model.version,
                            type(exc).__name__, exc)
                self.metrics.update_refused()
                return applied
            if update is None:
                return applied
            try:
                self.model.apply(update)
            except UpdateFailed as exc:
                log.error("%s", exc)
                self.metrics.set_damaged()
                raise
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
