"""``open_updater``: the delta follower behind ``lightrec serve --deltas DIR``'s updater seam.

The server (``lightrec.serving.served_model``) asks each worker's updater for the next update with
``poll()`` -- on its follower thread, without the model's lock -- and applies what it returns
under the lock with ``ServedModel.apply(update)``, which calls ``update.apply(model)`` and then
takes ``update.version`` and ``update.published_at``. :class:`DeltaUpdater` is that updater over a
publish folder: ``poll`` reads, verifies and *prepares* the update (rows converted, id maps
computed: :meth:`PendingUpdate.prepare`), so that ``apply`` under the lock is copies only.

A served model at version 0 is the artifact as exported: the first update rebuilds the newest
version from its snapshot. Refusals reach the server as :class:`DeltaRefused` (an
``UpdateRefused``: the model is unchanged), naming the versions:

* a poll that refused versions (corrupt files, an update that does not fit the artifact) raises
  it, and hands the update it found besides, if any, to the next poll -- which the server makes
  at once, so every refused version is counted and the next good one still applied without delay;
* an ``apply`` that fails puts back what it wrote (``PendingUpdate.apply``) and raises it; its
  versions are refused and the next poll looks past them.
"""

from __future__ import annotations

import os
from typing import Protocol

from lightrec.distributed.deltas import DeltaApplyError, DeltaError
from lightrec.inference.predictor import Predictor
from lightrec.serving.deltas.apply import PendingUpdate
from lightrec.serving.deltas.follower import DeltaFollower
from lightrec.serving.served_model import UpdateRefused

__all__ = ["DeltaModelUpdate", "DeltaRefused", "DeltaUpdater", "ServedLike", "open_updater"]


class DeltaRefused(DeltaError, UpdateRefused):
    """Versions of the publish folder refused (``versions``): they failed verification, do not fit the
    artifact, or failed to apply and were put back. The served model and its version are unchanged."""


class ServedLike(Protocol):
    """What the updater reads of the server's ``ServedModel``."""

    @property
    def predictor(self) -> Predictor: ...

    @property
    def version(self) -> int: ...


class DeltaModelUpdate:
    """One prepared update: ``version``, ``published_at`` (the version's wall time), ``apply(model)``."""

    def __init__(self, update: PendingUpdate) -> None:
        self.update = update

    @property
    def version(self) -> int:
        return self.update.version

    @property
    def published_at(self) -> float:
        return self.update.state.wall_time

    def apply(self, model: ServedLike) -> None:
        """Write the update into ``model.predictor`` (under the server's lock); all or nothing.

        Raises:
            DeltaRefused: it failed and what it wrote was put back (``PendingUpdate.apply``).
        """
        try:
            self.update.apply(model.predictor)
        except DeltaApplyError as exc:
            raise DeltaRefused(f"version {self.version} not applied, still serving version {model.version}: {exc}",
                               self.update.versions) from exc

    def __repr__(self) -> str:
        return f"DeltaModelUpdate({self.update!r})"


class DeltaUpdater:
    """Polls a publish folder for the served model (see the module docstring).

    Args:
        directory: the publish folder.
        model: the worker's served model (``version`` 0: as exported, nothing applied yet).
        gaps: as :class:`DeltaFollower`'s.
    """

    def __init__(self, directory: str | os.PathLike[str], model: ServedLike, gaps: str = "wait") -> None:
        self.model = model
        # the server paces the polls: every call scans
        self.follower = DeltaFollower(directory, poll_interval_s=0.0, start_version=model.version or None, gaps=gaps)
        self._held: DeltaModelUpdate | None = None  # found by a poll that also refused versions

    def poll(self) -> DeltaModelUpdate | None:
        """The next update, prepared for the served predictor, or None when nothing newer is published.

        Raises:
            DeltaRefused: this poll refused versions (the update it found besides, if any, is what
                the next call returns).
        """
        if self._held is not None:
            held, self._held = self._held, None
            return held
        before = self.follower.refused_versions
        update = self.follower.poll(force=True)
        found = None
        if update is not None:
            try:
                update.prepare(self.model.predictor)
                found = DeltaModelUpdate(update)
            except DeltaApplyError:
                pass  # logged; the follower refused its versions, counted below
        refused = sorted(self.follower.refused_versions - before)
        if refused:
            self._held = found
            raise DeltaRefused(f"refused version(s) {refused} of {self.follower.reader.dirpath} (see the log); "
                               f"still serving version {self.model.version}", refused)  # fmt: skip
        return found


def open_updater(directory: str | os.PathLike[str], model: ServedLike) -> DeltaUpdater:
    """The updater of ``lightrec serve --deltas directory`` for one worker's ``model``."""
    return DeltaUpdater(directory, model)
