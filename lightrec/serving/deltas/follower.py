"""``DeltaFollower``: follow a publish folder and hand a server the next version to apply.

The seam a server uses (between two batches, under the lock that also guards scoring)::

    follower = DeltaFollower("publish/", poll_interval_s=2.0)
    ...
    update = follower.poll()              # file I/O and checksums; no model mutation; None: nothing new
    if update is not None:
        update.prepare(predictor)         # optional, off the hot path: conversions, id maps
        try:
            update.apply(predictor)       # copies only; all or nothing
        except DeltaApplyError:
            pass                          # logged; the served model and follower.version are unchanged

Which versions an update holds: the newest version ``v`` that can be rebuilt exactly, as the served
version ``c`` plus the deltas ``c+1..v`` when ``c`` is in ``v``'s chain, else as ``v``'s snapshot
plus the deltas after it (a worker that starts -- ``c`` unknown -- or falls behind retention catches
up that way). Every worker reading the same folder picks the same ``v``.

A version whose files fail verification, or whose update fails to apply, is *refused*: logged once,
not read again while its folder stays as it was. One whose files change -- a version copied in by
``rsync`` or ``cp -r`` shows its folder before all of its files -- is read again once they have stayed
unchanged from one poll to the next (not at every poll while a copy runs). With ``gaps="wait"``
(default) no update goes through a refused version: the follower stays at its version (exact) until
a snapshot after it arrives. ``gaps="skip"`` applies the versions around it instead -- fresher, but
the rows only that version changed keep older values until they change again or the next snapshot.

The follower remembers the manifest of the version it serves. When that version's folder holds
another manifest, or is gone while older versions are listed -- the folder was emptied and published
anew (a restarted trainer numbers from 1 again) -- the served version is in no chain of the folder:
the next update rebuilds the newest version from its snapshot, even one numbered at or below the
served one, and the old history's refusals are forgotten. A folder that is gone altogether (an
unmounted share) changes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from lightrec.distributed.deltas import (
    DeltaApplyError,
    DeltaChainError,
    DeltaNotFoundError,
    DeltaReader,
    DeltaVerificationError,
    Manifest,
    Version,
    merge_versions,
)
from lightrec.distributed.deltas.reader import Stamp
from lightrec.inference.predictor import Predictor
from lightrec.serving.deltas.apply import PendingUpdate

__all__ = ["GAPS", "DeltaFollower"]

logger = logging.getLogger(__name__)

GAPS = ("wait", "skip")


class DeltaFollower:
    """Polls a publish folder for versions newer than the one served (see the module docstring).

    Args:
        dirpath: the publish folder (it may not exist yet).
        poll_interval_s: :meth:`poll` scans the folder at most this often (cheap to call every batch).
        start_version: the version the artifact already serves (e.g. it was exported at that
            version); None: unknown, the first update starts from a snapshot.
        gaps: ``"wait"`` or ``"skip"``: what to do about a refused version (module docstring).

    Thread safety: ``poll`` may run on another thread than ``apply``; the state is locked.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str],
        poll_interval_s: float = 2.0,
        start_version: int | None = None,
        gaps: str = "wait",
    ) -> None:
        if not isinstance(poll_interval_s, (int, float)) or poll_interval_s < 0:
            raise ValueError(f"poll_interval_s must be a number >= 0, got {poll_interval_s!r}")
        if gaps not in GAPS:
            raise ValueError(f"gaps must be one of {GAPS}, got {gaps!r}")
        if start_version is not None and (isinstance(start_version, bool) or not isinstance(start_version, int)
                                          or start_version < 1):  # fmt: skip
            raise ValueError(f"start_version must be None or a version >= 1, got {start_version!r}")
        self.reader = DeltaReader(dirpath)
        self.poll_interval_s = float(poll_interval_s)
        self.gaps = gaps
        self._lock = threading.RLock()
        self._version = start_version
        # version -> what its folder held when refused (reader.stamp); the refused versions whose folder
        # changed since -> as the last poll saw it; the newer versions' -> as taken before the last poll read them
        self._refused: dict[int, Stamp | None] = {}
        self._changed: dict[int, Stamp | None] = {}
        self._stamps: dict[int, Stamp | None] = {}
        self._last_scan: float | None = None
        self._wall_times: dict[int, float] = {}  # of the listed versions newer than the served one
        self._served: Manifest | None = None  # the manifest of the served version (None: not known)
        self._warned: Manifest | None = None  # the served manifest last reported gone from the folder
        # update -> (the manifest of its version, the served manifest it replaces when planned on another history)
        self._made: weakref.WeakKeyDictionary[PendingUpdate, tuple[Manifest, Manifest | None]]
        self._made = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ state
    @property
    def version(self) -> int | None:
        """The version the artifact serves (None: not known yet)."""
        with self._lock:
            return self._version

    @property
    def lag_seconds(self) -> float:
        """Seconds since the oldest version newer than the served one was published (0: up to date,
        as of the last scan)."""
        with self._lock:
            newer = [t for v, t in self._wall_times.items() if self._version is None or v > self._version]
        return max(0.0, time.time() - min(newer)) if newer else 0.0

    @property
    def refused_versions(self) -> frozenset[int]:
        """Versions refused (failed verification or application); not read again while their folder stays."""
        with self._lock:
            return frozenset(self._refused)

    # ------------------------------------------------------------------ polling
    def poll(self, force: bool = False) -> PendingUpdate | None:
        """The update to the newest version that can be rebuilt, or None (nothing new, not due yet, or
        only refused versions). Reads and verifies files; never touches a model.

        Args:
            force: scan now even if ``poll_interval_s`` has not passed since the last scan.
        """
        now = time.monotonic()
        if not force and self._last_scan is not None and now - self._last_scan < self.poll_interval_s:
            return None
        self._last_scan = now
        current = self.version
        listed = self.reader.versions()
        replaced = self._replaced(current, listed)
        if replaced is not None:
            current = None  # another history: rebuild from a snapshot
        newer = [v for v in listed if current is None or v > current]
        self._reconsider(newer)
        manifests = {v: self._manifest(v) for v in newer}
        with self._lock:
            self._wall_times = {v: m.wall_time for v, m in manifests.items() if m is not None}
        read: dict[int, Version] = {}
        for target in reversed(newer):
            refused = self.refused_versions  # grows as reads fail: later routes avoid those versions
            route = self._route(target, {v: m for v, m in manifests.items() if v not in refused}, current)
            if route is None:
                continue
            snapshot = manifests[route[0]]
            required = route[0] if snapshot is not None and snapshot.kind == "snapshot" else None
            versions = self._read_all(route, read, required)
            if versions is None:
                continue
            try:
                state = merge_versions(versions, allow_gaps=self.gaps == "skip")
            except DeltaChainError as exc:  # e.g. a delta whose tables differ from its snapshot's (another writer)
                chain = manifests[target]
                self._refuse(_misfits(versions, manifests.get(chain.base) if chain is not None else None), exc)
                continue  # an older target may still be rebuilt (its snapshot alone, say)
            from_version = None if versions[0].manifest.kind == "snapshot" else current
            update = PendingUpdate(state, from_version, listener=self)
            with self._lock:
                self._made[update] = (versions[-1].manifest, replaced)
            return update
        return None

    def _replaced(self, current: int | None, listed: list[int]) -> Manifest | None:
        """The served version's manifest when the folder no longer holds it (module docstring), else None."""
        with self._lock:
            served = self._served
        if current is None or not listed:
            return None  # nothing known, or the folder is gone altogether: keep the served version
        try:
            found = self.reader.manifest(current)
        except DeltaNotFoundError:
            found = None
        except DeltaVerificationError:
            return None  # unreadable now, not replaced: the deltas after it still build on it
        if served is None:  # started at a given version: take the folder's word for it
            with self._lock:
                self._served = found
            return None
        if found == served:
            return None
        if found is None:  # removed by retention, every older version with it (a snapshot follows)?
            # retention may have run since the listing: ask the folder again before calling it a new history
            fresh = listed if min(listed) > current else self.reader.versions()
            if min(fresh, default=current + 1) > current:
                return None
        with self._lock:
            if self._warned is not served:  # once per served version: forget the old history's refusals
                self._warned = served
                self._refused.clear()
                self._changed.clear()
                logger.warning("version %d (served) is %s %s: the folder was published anew; rebuilding its newest "
                               "version from its snapshot", current, "no longer in" if found is None else "another "
                               "version in", self.reader.dirpath)  # fmt: skip
        return served

    def sync(self, predictor: Predictor, force: bool = False) -> int | None:
        """Poll and apply what is found to ``predictor``; a failure is logged and the version kept.

        Returns:
            The version served afterwards.
        """
        update = self.poll(force=force)
        if update is not None:
            try:
                update.apply(predictor)
            except DeltaApplyError:
                pass  # logged by apply; its versions are refused and the next poll looks further
        return self.version

    def _manifest(self, version: int) -> Manifest | None:
        """The manifest of ``version``, or None when it is gone or refused (refusing it if corrupt)."""
        if version in self.refused_versions:
            return None
        try:
            return self.reader.manifest(version)
        except DeltaNotFoundError:
            return None
        except DeltaVerificationError as exc:
            self._refuse([version], exc)
            return None

    def _route(self, target: int, manifests: dict[int, Manifest | None], current: int | None) -> list[int] | None:
        """The versions that take the served version to ``target``: ``current+1..target`` when the served
        version is in ``target``'s chain, else its snapshot ``base..target``; None when one is missing
        or refused (``gaps="skip"``: only the snapshot, when the route starts there, is required)."""
        manifest = manifests.get(target)
        if manifest is None:
            return None
        base = manifest.base
        start = current + 1 if current is not None and base <= current < target else base
        route = []
        for v in range(start, target + 1):
            m = manifests.get(v)
            if m is not None and (v == base or (m.kind == "delta" and m.base == base)):
                route.append(v)
            elif self.gaps == "wait" or v == base:
                return None  # missing, refused, or of another chain
        return route or None

    def _read_all(self, route: list[int], read: dict[int, Version], required: int | None) -> list[Version] | None:
        """The verified versions of ``route`` (None when one is refused and gaps are not skipped, or it
        is ``required``: the snapshot the route starts from)."""
        versions = []
        for v in route:
            if v not in read:
                try:
                    read[v] = self.reader.read(v)
                except DeltaNotFoundError as exc:  # removed by retention since the listing: look again next poll
                    logger.info("version %d vanished while being read: %s", v, exc)
                    return None
                except DeltaVerificationError as exc:
                    self._refuse([v], exc)
                    if self.gaps == "wait" or v == required:
                        return None
                    continue
            versions.append(read[v])
        return versions or None

    def _reconsider(self, newer: list[int]) -> None:
        """Take the stamps of ``newer`` before anything of them is read, and forget the refusal of a
        version whose folder changed since, once it is unchanged from the previous poll (module docstring)."""
        stamps = {v: self.reader.stamp(v) for v in newer}
        again = []
        with self._lock:
            self._stamps = stamps
            for v, stamp in stamps.items():
                if v not in self._refused or self._refused[v] == stamp:
                    self._changed.pop(v, None)
                elif v in self._changed and self._changed[v] == stamp:
                    del self._refused[v], self._changed[v]
                    again.append(v)
                else:
                    self._changed[v] = stamp  # still changing (a copy running): look at the next poll
        if again:
            logger.info("reading version(s) %s of %s again: their files changed since they were refused", again,
                        self.reader.dirpath)  # fmt: skip

    def _refuse(self, versions: list[int] | range, error: Exception) -> None:
        with self._lock:
            new = [v for v in versions if v not in self._refused]
            # the stamp taken before the read: files that changed since make the version worth a new read
            self._refused.update({v: self._stamps.get(v) for v in new})
        if new:
            logger.warning("refusing version(s) %s of %s: %s", new, self.reader.dirpath, error)

    # ------------------------------------------------------------------ UpdateListener
    def check(self, update: PendingUpdate) -> None:
        with self._lock:
            current, served = self._version, self._served
        if update.from_version is not None and update.from_version != current:
            raise DeltaApplyError(f"update to version {update.version} was planned on version {update.from_version}, "
                                  f"but version {current} is served; poll again")  # fmt: skip
        made = self._made.get(update)
        replaces = made[1] if made is not None else None
        if current is not None and update.version <= current and (replaces is None or replaces is not served):
            raise DeltaApplyError(f"version {update.version} is not newer than the served version {current}")

    def applied(self, update: PendingUpdate) -> None:
        with self._lock:
            self._version = update.version
            made = self._made.get(update)
            self._served = made[0] if made is not None else None
        logger.info("serving version %d of %s (%r)", update.version, self.reader.dirpath, update)

    def failed(self, update: PendingUpdate, error: DeltaApplyError) -> None:
        self._refuse(update.versions, error)


def _misfits(versions: list[Version], snapshot: Manifest | None) -> list[int]:
    """The versions of a route that ``merge_versions`` cannot join: those with a table whose spec differs from
    the chain's snapshot's (``snapshot``; the route's first version where it is unknown); where none does
    (an ordering fault), every version after the first. Refusing them lets the follower serve what came
    before them (with ``gaps="wait"``, until the next snapshot)."""
    reference = (snapshot or versions[0].manifest).tables
    odd = [v.manifest.version for v in versions
           if any(reference.get(name, spec) != spec for name, spec in v.manifest.tables.items())]  # fmt: skip
    return odd or [v.manifest.version for v in versions[1:]] or [versions[0].manifest.version]
