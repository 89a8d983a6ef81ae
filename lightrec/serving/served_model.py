"""The model a serving worker scores with, its version, and the contract of live updates.

A worker holds one :class:`ServedModel`: a :class:`~lightrec.inference.Predictor` (the loaded
artifact), the version it holds and a lock. Every batch is scored under the lock, and every update
is written under it, so a batch sees the model either wholly before or wholly after an update --
never half-applied rows::

    worker thread (LitServe loop)            follower thread (model_updates.UpdateFollower)
    ------------------------------            ------------------------------------------------
    decode, assemble batch                    update = updater.poll()    # read + verify, no lock
    with lock: forward -> (scores, version)   model.apply(update)        # with lock: write rows
    encode responses with that version

Live updates come from a :class:`ModelUpdater` (``lightrec.serving.deltas.open_updater``
implements it over a publish folder; tests use fakes). ``poll`` does the slow, fallible part --
reading the files, checking their checksums, decoding rows -- outside the lock and returns a
:class:`ModelUpdate`, or None when nothing new is published; ``ModelUpdate.apply`` then only
writes what ``poll`` prepared (rows in place, or :meth:`ServedModel.replace_predictor` for a whole
new module), so the lock is held for copies, not for I/O, and a batch waits at most for one copy.

Two ways an update can fail, told apart by what they leave behind:

* :class:`UpdateRefused` -- raised by ``poll`` (a version failed its checks) or by ``apply`` when it
  wrote nothing or put back what it wrote: the model is the served version, which stays; the
  follower counts the refusal and looks for the next good version;
* any other exception out of ``apply`` -- the model may be half-written: :meth:`ServedModel.apply`
  raises :class:`UpdateFailed`, the model refuses to score from then on (:meth:`ServedModel.score`
  raises :class:`ModelDamaged`: requests get 503, never a score of a model that is neither version)
  and the worker reports itself damaged (``/health`` and ``/ready`` 503).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

import torch

from lightrec.inference.predictor import Predictor

__all__ = ["ModelDamaged", "ModelUpdate", "ModelUpdater", "PredictorMismatch", "ServedModel", "UpdateFailed",
           "UpdateRefused", "UpdaterFactory"]


class UpdateRefused(RuntimeError):
    """Versions that were not applied, leaving the served model exactly as it was: they failed their
    checks (corrupt, partial, a gap in the chain), or ``ModelUpdate.apply`` found they do not fit and
    wrote nothing -- or put back everything it had written. The worker keeps serving its version,
    counts the refusal and looks for the next good version.

    Args:
        message: what was refused and why.
        versions: the versions refused (empty when the source cannot tell).
    """

    def __init__(self, message: str, versions: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.versions = tuple(int(v) for v in versions)


class PredictorMismatch(UpdateRefused, ValueError):
    """:meth:`ServedModel.replace_predictor` was given a predictor that accepts other requests than the
    served one (features, dense width, weighting, table sizes or id spaces, missing-feature rule). It
    swapped nothing, so the update is refused and the served version stays."""


class UpdateFailed(RuntimeError):
    """``ModelUpdate.apply`` raised after it may have written part of an update: the model refuses to
    score from then on (:class:`ModelDamaged`) and the worker reports itself unhealthy (``/health``
    answers 503) so that it gets replaced, instead of scoring with a model that is neither the old
    version nor the new one."""


class ModelDamaged(RuntimeError):
    """:meth:`ServedModel.score` on a model an update failed to write (:class:`UpdateFailed`): it is no
    published version any more, so it scores nothing. Replace the worker (restart the replica)."""


class ModelUpdate(Protocol):
    """One new version, read and verified by :meth:`ModelUpdater.poll`, ready to be written.

    Attributes:
        version: the version the served model holds once :meth:`apply` returns (responses carry it).
        published_at: wall time (``time.time()``) at which training published that version; the
            freshness lag reported by ``/metrics`` is the time from it to the apply.
    """

    @property
    def version(self) -> int: ...

    @property
    def published_at(self) -> float: ...

    def apply(self, model: ServedModel) -> None:
        """Write the update into ``model`` (rows of ``model.predictor.module`` in place, or
        ``model.replace_predictor(...)``). Called with ``model``'s lock held, between two batches;
        must not do I/O (verification belongs to ``poll``).

        Raises:
            UpdateRefused: the update does not fit and the model is unchanged (nothing written, or
                all of it put back). Every other exception means the model may be half-written.
        """
        ...


class ModelUpdater(Protocol):
    """A source of updates for one served model (one per worker, built by an :data:`UpdaterFactory`)."""

    def poll(self) -> ModelUpdate | None:
        """The next update to apply on top of the served model's current version, or None when
        nothing newer is published. Called from the follower thread, never concurrently with itself.

        Raises:
            UpdateRefused: versions that cannot be applied (corrupt, partial, a gap in the chain): the
                follower logs them, counts each as refused and polls again at once -- so the source
                must not refuse the same version twice -- keeping the current version until a good
                one comes.
            Exception: anything else is counted as one refusal and retried at the next interval.
        """
        ...


class UpdaterFactory(Protocol):
    """Builds the updater of one worker's model, in the worker process. It is pickled into the
    worker processes: a module-level function or a ``functools.partial`` of one."""

    def __call__(self, model: ServedModel) -> ModelUpdater: ...


class ServedModel:
    """A predictor, the version it holds and the lock that keeps batches and updates apart.

    Args:
        predictor: the loaded artifact.
        version: the version of the artifact as loaded (0: as exported, before any delta).
        published_at: wall time the loaded version was written (for an artifact, its file's mtime).
    """

    def __init__(self, predictor: Predictor, version: int = 0, published_at: float = 0.0) -> None:
        self._predictor = predictor
        self._version = int(version)
        self._published_at = float(published_at)
        self._lock = threading.Lock()
        self._damage: str | None = None  # why the model is no published version any more (UpdateFailed's message)

    @property
    def predictor(self) -> Predictor:
        """The predictor batches are scored with (its ``module``, ``meta`` and ``device``)."""
        return self._predictor

    @property
    def version(self) -> int:
        """The version every batch scored from now on carries."""
        return self._version

    @property
    def published_at(self) -> float:
        """Wall time at which the served version was published."""
        return self._published_at

    @property
    def damaged(self) -> str | None:
        """Why the model refuses to score (an update failed part way), or None while it serves."""
        return self._damage

    def score(self, dense_features: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """Probabilities of one batch (``Predictor.probabilities``) and the version that produced them.

        Args:
            dense_features: ``[B, I]`` float32; values: ``[N]`` key-major ids; lengths: ``[F * B]``;
                weights: ``[N]`` or None (layout in :mod:`lightrec.inference.export`).

        Returns:
            ``([B]`` or ``[B, K]`` CPU probabilities, the version``)``, read under the same lock hold.

        Raises:
            ModelDamaged: an update failed part way into this model; it scores nothing any more.
        """
        with self._lock:
            if self._damage is not None:
                raise ModelDamaged(f"this worker's model scores nothing: {self._damage}; replace the worker "
                                   "(restart the replica)")
            return self._predictor.probabilities(dense_features, values, lengths, weights), self._version

    def apply(self, update: ModelUpdate) -> None:
        """Write ``update`` between two batches and take its version.

        Raises:
            UpdateRefused: ``update.apply`` refused it; the model and its version are unchanged.
            UpdateFailed: ``update.apply`` raised anything else; the model may be partly written.
        """
        with self._lock:
            try:
                update.apply(self)
            except UpdateRefused:
                raise
            except Exception as exc:
                self._damage = (f"applying version {update.version} failed part way ({type(exc).__name__}: {exc}); "
                                f"the model is no longer a published version")
                raise UpdateFailed(self._damage) from exc
            self._version = int(update.version)
            self._published_at = float(update.published_at)

    def replace_predictor(self, predictor: Predictor) -> None:
        """Serve ``predictor`` from the next batch on: for a :meth:`ModelUpdate.apply` that swaps the
        whole module. It must accept exactly the requests the served one accepts (equal
        :attr:`~lightrec.inference.Predictor.rules`: features, dense width, weighting, table sizes and
        id spaces, missing-feature rule): requests of a batch are validated against the predictor of
        the moment, before the batch takes the lock, and may be scored by the new one.

        Raises:
            RuntimeError: called outside :meth:`apply` (without the lock held).
            PredictorMismatch: ``predictor`` accepts other requests; nothing was swapped.
        """
        if not self._lock.locked():
            raise RuntimeError("replace_predictor is called from ModelUpdate.apply, under ServedModel.apply's lock")
        new, old = predictor.rules, self._predictor.rules
        if new != old:
            changed = [f"{name} {getattr(new, name)!r} (served: {getattr(old, name)!r})"
                       for name in new._fields if getattr(new, name) != getattr(old, name)]  # fmt: skip
            raise PredictorMismatch(f"the new predictor accepts other requests than the served one: {'; '.join(changed)}"
                                    "; an update cannot change the inputs: re-export the new model with the served "
                                    "one's tables and features, or start a new server for it")
        self._predictor = predictor
