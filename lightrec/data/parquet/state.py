"""The loader's position in a checkpoint: where a resumed run starts reading again.

Lightning saves ``state_dict()`` of every training loader that has one in the checkpoint (its fit
loop's ``combined_loader`` entry) and hands it back to ``load_state_dict`` on resume, before the
first batch is read. A Parquet loader's position is::

    {"epoch": 3, "batch": 117, "world_size": 2, "batch_size": 1024, "fingerprint": "9c1e..."}

``batch`` counts the batches of the epoch this rank *trained* -- read, minus those a pipelining
callback (``SparseDistPrefetch``) holds but has not trained yet (the loader's ``prefetched``). A
resume re-plans the same epoch (same files, same shuffle) and starts at row ``batch * batch_size`` of
the rank's part, so it trains exactly the batches the uninterrupted run would have. As with
:class:`~lightrec.data.RankDataLoader`, the position belongs to its epoch: when Lightning announces
another epoch (a checkpoint written at the end of an epoch resumes into the next), reading starts
at that epoch's beginning.

The same ranks and batch size are needed (each rank's part of the stream depends on both), and the
same data: the fingerprint hashes the files (paths, row groups, sizes) and the shuffle settings. A
mismatch raises :class:`ResumeMismatchError` with the fix. A following loader
(:mod:`lightrec.data.parquet.follow`) adds the files it has finished and the round in progress, and
:class:`FollowedRounds` finds the round that the first untrained batch belongs to; its fingerprint is the
sizes of the files of that round and of the rows it carries (``"sizes:1234,5678"``), so that a file
replaced at the same path before the resume is refused, naming it.

:func:`check_named_files` is that resume check: a file of another size now (replaced at its path since
the checkpoint), or one that no longer has the carried rows, is a :class:`ResumeMismatchError` naming
the file, instead of its new rows read from the old one's position. A position written before sizes
were kept (fingerprint ``""``) is checked for its carried rows only.
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from lightrec.data.errors import ResumeMismatchError
from lightrec.data.parquet.sharding import Slice
from lightrec.data.parquet.source import ParquetFileInfo

__all__ = [
    "FollowState",
    "FollowedRounds",
    "LoaderPosition",
    "LoaderState",
    "ResumeMismatchError",
    "check_named_files",
    "fingerprint",
    "named_files",
    "sizes_fingerprint",
]


class FollowState(TypedDict):
    """A following loader's extra state: files finished, the round in progress, slices carried to the next batch.

    ``carry`` rows are ``[path, row_group, lo, hi]`` lists (lists, not tuples, so the state stays JSON-shaped).
    """

    done: list[str]
    round: list[str]
    carry: list[list[str | int]]


class _LoaderStateRequired(TypedDict):
    epoch: int
    batch: int
    world_size: int
    batch_size: int
    fingerprint: str


class LoaderState(_LoaderStateRequired, total=False):
    """:meth:`LoaderPosition.to_dict`: what a Parquet loader's ``state_dict`` holds (``follow`` only when following)."""

    follow: FollowState


def fingerprint(files: Sequence[ParquetFileInfo], slices: Sequence[Slice], settings: Mapping[str, object]) -> str:
    """A short hash of the rows a loader reads (files, row groups, the split's slices) and its settings."""
    digest = hashlib.sha1()
    for s in slices:
        info = files[s.file]
        digest.update(f"{info.path}|{info.size}|{s.row_group}|{s.lo}|{s.hi};".encode())
    digest.update(json.dumps(dict(settings), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


@dataclass
class LoaderPosition:
    """Where a loader is: ``batch`` batches of ``epoch`` trained (module docstring).

    Args:
        epoch: the epoch the position belongs to.
        batch: batches of that epoch trained on this rank.
        world_size / batch_size: the ranks and per-rank batch size that read it.
        fingerprint: :func:`fingerprint` of the loader's data and settings (a following loader's: the sizes of
            the files its position names, module docstring).
        follow: a following loader's extra state (files done, round in progress), else None.
    """

    epoch: int = 0
    batch: int = 0
    world_size: int = 1
    batch_size: int = 1
    fingerprint: str = ""
    follow: FollowState | None = field(default=None)

    def to_dict(self) -> LoaderState:
        state: LoaderState = {
            "epoch": self.epoch, "batch": self.batch, "world_size": self.world_size, "batch_size": self.batch_size,
            "fingerprint": self.fingerprint,
        }  # fmt: skip
        if self.follow is not None:
            state["follow"] = copy.deepcopy(self.follow)
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderPosition:
        missing = [k for k in ("epoch", "batch", "world_size", "batch_size") if k not in state]
        if missing:
            raise ResumeMismatchError(
                f"the checkpoint's data loader state lacks {missing}: it was not written by a Parquet loader "
                f"(got keys {sorted(state)}); resume with the data it was trained on"
            )
        return cls(
            epoch=int(state["epoch"]), batch=int(state["batch"]), world_size=int(state["world_size"]),
            batch_size=int(state["batch_size"]), fingerprint=str(state.get("fingerprint", "")),
            follow=cast(FollowState, dict(state["follow"])) if state.get("follow") is not None else None,
        )  # fmt: skip

    def check_fits(self, world_size: int, batch_size: int, fingerprint: str) -> None:
        """Raise :class:`ResumeMismatchError` unless the position can be resumed by this loader."""
        if (self.world_size, self.batch_size) != (world_size, batch_size):
            raise ResumeMismatchError(
                f"the checkpoint read its Parquet data on {self.world_size} rank(s) x batch_size {self.batch_size}, this "
                f"run on {world_size} x {batch_size}: each rank's part of the data depends on both, so the position "
                f"cannot be carried over; resume with {self.world_size} device(s) and --data.batch_size "
                f"{self.batch_size}"
            )
        if self.fingerprint and fingerprint and self.fingerprint != fingerprint:
            raise ResumeMismatchError(
                "the Parquet data (files, row groups, split or shuffle settings) differs from the data the checkpoint "
                "was trained on, so its position in the epoch means other rows now; resume with the same files and "
                "settings, or start a new run (a following loader picks up new files by itself)"
            )


@dataclass(frozen=True)
class _RoundStart:
    first: int  # batches yielded in this iteration before the round's first one
    start: int  # the round's first batch (past 0 in a round a position resumed)
    done: int  # how many files were finished then (the list of finished files only grows)
    round: list[str]
    carry: list[list[str | int]]


class FollowedRounds:
    """Which round of a followed stream, and which batch of it, the first batch not trained yet is in.

    The batches read but not trained (Lightning's one read ahead, and any a pipelining callback holds) can
    belong to a round before the one in progress. A round whose rows make no global batch yields nothing,
    so while the loader waits after it, Lightning still holds the last batch of the round before; a
    checkpoint taken then (at a SIGTERM) must resume that round at that batch, and read the small round's
    files as new ones. So each round's start is kept, in the order of the batches, until no untrained batch
    can be before it::

        round      a (batches 0, 1)   b (no batch)   c (batches 0, ...)
        first      0                  2              2
        yielded 2, held 1 -> trained 1 -> round a, batch 1

    ``yielded`` below is the loader's count for the round in progress: its batches yielded, plus its
    ``start``.
    """

    def __init__(self) -> None:
        self._starts: list[_RoundStart] = []

    @property
    def empty(self) -> bool:
        """No round begun: the loader has not been iterated."""
        return not self._starts

    def restart(self) -> None:
        """Forget every round: an iteration starts counting its batches from 0."""
        self._starts.clear()

    def begin(
        self, yielded: int, held: int, start: int, done: Sequence[str], round: Sequence[str],
        carry: list[list[str | int]],
    ) -> None:  # fmt: skip
        """A round begins at its batch ``start``, after the round before yielded up to ``yielded``."""
        first = self._total(yielded)
        if self._starts and self._starts[-1].first == first:
            self._starts.pop()  # the round before yielded no batch: no untrained batch can be in it
        self._starts.append(_RoundStart(first, start, len(done), list(round), copy.deepcopy(carry)))
        # The batches trained only grow: the rounds before the one holding the first untrained batch are done with.
        del self._starts[: self._index(max(first - held, 0))]

    def position(self, yielded: int, held: int, done: Sequence[str]) -> tuple[int, FollowState]:
        """The first untrained batch: its index in its round, and the state that resumes that round."""
        trained = max(self._total(yielded) - held, 0)
        s = self._starts[self._index(trained)]
        state: FollowState = {"done": list(done[: s.done]), "round": list(s.round), "carry": copy.deepcopy(s.carry)}
        return s.start + max(trained - s.first, 0), state

    def _total(self, yielded: int) -> int:
        """Batches yielded in this iteration, given the count of the round in progress."""
        if not self._starts:
            return 0
        last = self._starts[-1]
        return last.first + yielded - last.start

    def _index(self, trained: int) -> int:
        return max(bisect.bisect_right([s.first for s in self._starts], trained) - 1, 0)


# ---- a following position's file sizes, checked on resume -------------------------------------------
_SIZES = "sizes:"  # the start of a following position's fingerprint: the sizes of the files it names


def named_files(state: FollowState) -> list[str]:
    """The files a following position reads from: its round's, then its carried rows', each once, in that order."""
    return list(dict.fromkeys([*state["round"], *(str(c[0]) for c in state["carry"])]))


def sizes_fingerprint(files: Iterable[ParquetFileInfo]) -> str:
    """The fingerprint of a position naming ``files`` (in :func:`named_files` order): their sizes."""
    return _SIZES + ",".join(str(f.size) for f in files)


def check_named_files(resume: LoaderPosition, named: list[str], files: Sequence[ParquetFileInfo]) -> None:
    """Refuse a position whose files are not the files it counted rows of: a file replaced at its path since
    the checkpoint would be read from the old file's row on (rows skipped or read twice), or its carried rows
    would not exist.

    Args:
        resume: the position being resumed (a following loader's).
        named: :func:`named_files` of its state.
        files: the files at those paths now, aligned with ``named``.

    Raises:
        ResumeMismatchError: a named file has another size than the position kept (positions written before
            sizes were kept have none to compare), or a carried slice lies outside the file's row groups.
    """
    sizes = _sizes_in(resume.fingerprint)
    if sizes is not None and len(sizes) != len(named):
        raise ResumeMismatchError(
            f"the checkpoint's data position names {len(named)} file(s) but keeps {len(sizes)} size(s) "
            f"({resume.fingerprint!r}): it was not written by this loader, or was edited; resume from a checkpoint "
            "as it was written, or start a new run"
        )
    fix = (
        "Put back the file the checkpoint read, or start a new run; publish new data under new file names "
        "(write hidden, then rename), never over a file the run has read"
    )
    by_path = dict(zip(named, files, strict=True))
    for path, size in zip(named, sizes or []):
        now = by_path[path].size
        if now != size:
            raise ResumeMismatchError(
                f"the checkpoint's data position counts rows of {path}, {size} bytes then but {now} bytes now: the "
                "file was replaced or rewritten at its path since, and resuming would read its rows from the old "
                f"file's position (rows skipped or read twice). {fix}"
            )
    for path, group, lo, hi in _carry_of(resume):
        rows = by_path[path].row_groups
        if not (0 <= group < len(rows) and 0 <= lo < hi <= rows[group]):
            have = f"{rows[group]} rows" if 0 <= group < len(rows) else f"{len(rows)} row group(s)"
            raise ResumeMismatchError(
                f"the checkpoint's data position carries rows {lo}-{hi} of row group {group} of {path} to the next "
                f"round, but the file there now has {have}: it was replaced or rewritten since. {fix}"
            )


def _carry_of(position: LoaderPosition) -> list[tuple[str, int, int, int]]:
    """A following position's carried rows as ``(path, row_group, lo, hi)``."""
    carry = position.follow["carry"] if position.follow is not None else []
    return [(str(p), int(g), int(lo), int(hi)) for p, g, lo, hi in carry]


def _sizes_in(fingerprint: str) -> list[int] | None:
    """The file sizes a following position's ``fingerprint`` keeps; None for one that keeps none (a position
    written before sizes were kept: ``""``)."""
    if not fingerprint.startswith(_SIZES):
        return None
    body = fingerprint[len(_SIZES) :]
    try:
        return [int(x) for x in body.split(",")] if body else []
    except ValueError:
        raise ResumeMismatchError(
            f"the checkpoint's data position has the fingerprint {fingerprint!r}, which is not a list of file sizes: "
            "it was not written by a following loader, or was edited; resume from a checkpoint as it was written"
        ) from None
