"""Following a folder: an unbounded Parquet source that reads files as they land.

``ParquetDataModule(..., follow=True)`` trains on what is there, then keeps polling the path for new
files, for online training.

**The start** (:func:`following_source`) is the complete files there: with ``marker``, those of
marked folders only (a folder still being written is left for the poll that finds its marker, as in
1. below). When there is none yet -- an empty folder, a glob that matches nothing, no folder marked
yet: files will land -- the path is listed every ``poll_interval`` seconds for the first one, and
after ``idle_timeout`` seconds without one it is a ``FileNotFoundError`` naming the path (the
features are read from the first file: nothing can start before it). A first file whose footer cannot
be read yet (written in place) is retried like a later one (1. below). Every rank waits for its own
first file in the same way, with no collective: a rank that listed the folder empty a moment before
a file landed starts with the others instead of failing alone while they wait for it.

The stream is then read in *rounds*:

1. **list** the path (every ``poll_interval`` seconds) for files not seen before that are
   *complete*: names starting with ``.`` or ``_`` are skipped (write a file under such a name, then
   rename it -- an atomic rename is how Spark, DuckDB and ``lightrec data convert`` publish files);
   with ``marker="_SUCCESS"``, a file counts only once its folder holds that marker file (a writer
   that writes in place and marks the folder when done). A listed file whose footer cannot be read
   yet is retried at the next polls (and keeps the wait from ending as idle); one that stays unreadable and
   unchanged for three polls is a
   :class:`~lightrec.data.parquet.errors.ParquetFileError`. Files that ``val`` or ``test`` select
   (by path, glob or partition values: :class:`~lightrec.data.parquet.splits.HeldOut`) are left out,
   those there at the start and those that land later; a new file must give the features with
   columns of the first file's kinds (:func:`~lightrec.data.parquet.spec.check_schema`);
2. **order**: the new files of one poll are read in the order of their paths (sorted as strings:
   zero-pad partition values and numbers); files of a later poll come after them, whatever their
   names -- a late file of an earlier hour is read when it arrives;
3. **plan** the round like an epoch (:mod:`~lightrec.data.parquet.sharding`): the rows left over by
   the previous round (fewer than ``world_size * batch_size``) and the new files' rows, in order,
   ``steps = rows // (world_size * batch_size)`` per rank; what is left over waits for the next round;
4. **stop** when no new file came for ``idle_timeout`` seconds (``None``: never), which ends the
   epoch (and the fit, with ``max_epochs=1``), or when ``max_steps`` ends training -- or, while waiting,
   once the loader's ``stop_waiting()`` is true on any rank: ``ParquetDataModule`` sets it to whether the
   process got SIGTERM, so a SIGTERM (a scheduler stopping the job, or a signal to one rank) ends the wait within
   ``_STOP_CHECK`` seconds plus one poll of the other ranks, instead of after ``idle_timeout`` or never, by
   raising Lightning's ``SIGTERMException`` (``on_stop``) on every rank: the epoch is not completed, the batch
   Lightning read ahead is not trained, and the position -- the round still in progress at that batch -- has a
   checkpoint taken at the stop train it on resume. While it waits, ``on_wait()`` runs after each empty
   poll on every rank: ``ParquetDataModule`` calls the trainer's :class:`WaitsForData` callbacks there, so
   ``DeltaPublisher`` publishes the steps trained before the wait when its ``every_seconds`` comes, not when
   the next file lands.

Every rank must see the same files in the same rounds (they run the same steps): rank 0 lists, and sends
what it found to the others (broadcasts on the data's gloo group,
:func:`~lightrec.data.parquet.ranks.data_group`, so an NCCL training group is left alone; a poll's waited
for in short sleeps, :func:`~lightrec.data.parquet.ranks.rank0_json`, so signal handlers run meanwhile). The first
round too: a ``ParquetDataModule`` gives every rank rank 0's listing of the start
(:func:`~lightrec.data.parquet.ranks.agree_on_files`), and a loader built directly from a
:class:`~lightrec.data.parquet.source.ParquetSource` that each rank listed itself starts every iteration
with rank 0's round (one broadcast, as in a poll): a rank reads the footer of a file there that it did
not list itself, and a file only it listed (or whose folder rank 0 found unmarked) waits for the poll in
which rank 0 finds it. Reading footers of files rank 0 named (and checking their schema) ends in one
``all_gather_object`` of every rank's outcome, and rank 0 sends a failure of its own listing with the
poll: a file one rank cannot read stops every rank at once, none waits for a poll that never comes. A
loader of ``world_size=1`` follows alone (no collective). The group is one per default group, made by
the first agreement (a collective of every rank: the ranks set up and iterate in step) and ended with
the default group (``destroy_process_group()``): a process that builds loaders again and again (every
fit, a test suite) holds one such group, not one per loader, and no loader destroys a group that another
rank may still be receiving on. The position in a checkpoint names the files finished, the round in
progress and the leftover rows, so a resumed run continues exactly; files that arrived meanwhile are
read in the next round. Files are known by their paths, so the position also keeps the sizes of the files
its round and leftover rows are in (its ``fingerprint``, ``"sizes:<bytes>,..."``): a file replaced at its
path since the checkpoint (another size) is a :class:`~lightrec.data.parquet.state.ResumeMismatchError`
naming it when the run resumes, as are leftover rows the file there no longer has, instead of rows of the
new file read from the old one's position. (A file replaced after it was read, while the run goes on, is
not read again: publish new data under new names.)
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import pyarrow.fs as pafs
import torch.distributed as dist
from typing_extensions import Unpack

from lightrec.data.batch import Batch
from lightrec.data.parquet.errors import ParquetFileError
from lightrec.data.parquet.loader import LoaderBase, LoaderOptions
from lightrec.data.parquet.ranks import (
    RankDataMismatchError,
    any_rank,
    distributed,
    on_every_rank,
    rank0_json,
    rank0_value,
)
from lightrec.data.parquet.sharding import Slice, plan_epoch, slices_of, take_rows
from lightrec.data.parquet.source import (
    ParquetFileInfo,
    ParquetSource,
    complete_files,
    list_files,
    listing_root,
    read_file_info,
    resolve_filesystem,
)
from lightrec.data.parquet.spec import FeatureSpec, check_schema
from lightrec.data.parquet.state import (
    FollowedRounds,
    FollowState,
    LoaderPosition,
    LoaderState,
    ResumeMismatchError,
    check_named_files,
    named_files,
    sizes_fingerprint,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["FolderWatcher", "FollowOptions", "FollowStopped", "FollowingParquetLoader", "WaitsForData", "following_source"]

logger = logging.getLogger(__name__)

_SETTLE_POLLS = 3
_STOP_CHECK = 0.2  # seconds between checks of ``stop_waiting`` while a poll sleeps
_T = TypeVar("_T")


class _UnreadableFiles:
    """Listed files whose footer could not be read yet: a writer may still be writing them in place. A file
    is given ``_SETTLE_POLLS`` polls: once it stayed unreadable and unchanged (size, modification time) for
    that many, its :class:`ParquetFileError` is raised; a file that changed starts its count again.

    Args:
        filesystem: where the files are (stamped with ``get_file_info``).
    """

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.filesystem = filesystem
        self._polls: dict[str, tuple[tuple[int, int | None], int]] = {}  # path -> (stamp, polls unreadable)

    @property
    def pending(self) -> bool:
        """Whether a listed file is still unreadable (not yet settled either way): one is on its way, so a wait
        for new files is not idle."""
        return bool(self._polls)

    def readable(self, path: str) -> None:
        """``path``'s footer was read: forget its count."""
        self._polls.pop(path, None)

    def listed(self, paths: set[str]) -> None:
        """Forget the files no longer listed (removed or renamed before they settled): none is on its way."""
        for path in [p for p in self._polls if p not in paths]:
            del self._polls[path]

    def unreadable(self, path: str, error: ParquetFileError) -> None:
        """``path``'s footer could not be read (``error``) at this poll: raise ``error`` once the file has stayed
        unreadable and unchanged for ``_SETTLE_POLLS`` polls, else count this one."""
        info = self.filesystem.get_file_info(path)
        stamp = (int(info.size or 0), info.mtime_ns if info.mtime is not None else None)
        before, polls = self._polls.get(path, (stamp, 0))
        polls = polls + 1 if before == stamp else 1
        if polls >= _SETTLE_POLLS:
            raise error
        self._polls[path] = (stamp, polls)


class FollowStopped(Exception):
    """A stop request (``stop_waiting``) ended a wait for new files (raised on every rank, after rank 0's poll)."""


@runtime_checkable
class WaitsForData(Protocol):
    """A Lightning callback with work to do while a followed folder has no new file: ``on_data_wait`` runs on
    every rank after each empty poll (all ranks at the same poll, between training batches -- the batches
    before the wait trained, the one Lightning read ahead not yet -- so it may run collectives)."""

    def on_data_wait(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None: ...


class FollowLoaderOptions(LoaderOptions, total=False):
    """:class:`FollowingParquetLoader`'s keywords: :class:`LoaderBase`'s, ``rank`` and ``world_size`` included."""

    rank: int
    world_size: int


@dataclass(frozen=True)
class FollowOptions:
    """How a following source polls (module docstring).

    Args:
        poll_interval: seconds between listings when there is nothing new.
        idle_timeout: seconds without a new file after which the stream ends (None: never).
        marker: a file name (e.g. ``"_SUCCESS"``) a folder must hold before its files are read.
    """

    poll_interval: float = 10.0
    idle_timeout: float | None = 600.0
    marker: str | None = None

    def __post_init__(self) -> None:
        if not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {self.poll_interval!r}")
        if self.idle_timeout is not None and self.idle_timeout < 0:
            raise ValueError(f"idle_timeout must be >= 0 seconds or None (never), got {self.idle_timeout!r}")


class FolderWatcher:
    """Finds complete files under the source's paths that were not read yet (module docstring).

    Args:
        filesystem: where the files are.
        paths: the paths (inside ``filesystem``) to list: folders, files or globs.
        options: polling settings.
        leave_out: ``leave_out(path)`` is True for a file that is not training data (the ``val`` and
            ``test`` selections: :class:`~lightrec.data.parquet.splits.HeldOut`); never returned.
        ranks: the ranks that follow together: more than one are ``torch.distributed``'s world once it runs
            (rank 0 lists and tells the others: collectives of every rank); 1: this process lists alone.
    """

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        paths: Sequence[str],
        options: FollowOptions,
        leave_out: Callable[[str], bool] | None = None,
        ranks: int = 1,
    ) -> None:
        self.filesystem, self.paths, self.options = filesystem, list(paths), options
        self.leave_out = leave_out
        self.ranks = ranks
        self._unreadable = _UnreadableFiles(filesystem)

    @property
    def shared(self) -> bool:
        """Whether the ranks follow together now (decided at each use: a loader may be built before
        ``torch.distributed`` starts, as Lightning starts it in ``trainer.fit``)."""
        return self.ranks > 1 and distributed()

    def list_new(self, known: set[str]) -> list[ParquetFileInfo]:
        """The complete, readable files not in ``known``, sorted by path (this process's view)."""
        listed = sorted({p for path in self.paths for p in list_files(self.filesystem, path)} - known)
        wanted = [p for p in listed if self.leave_out is None or not self.leave_out(p)]
        self._unreadable.listed(set(wanted))
        out = []
        for path in complete_files(self.filesystem, wanted, self.options.marker):
            try:
                out.append(read_file_info(self.filesystem, path))
                self._unreadable.readable(path)
            except ParquetFileError as exc:
                self._unreadable.unreadable(path, exc)
        return out

    def agree_round(self, paths: list[str]) -> list[str]:
        """Rank 0's ``paths`` (a round's files) on every rank: a collective of every rank when shared."""
        return rank0_value(list(paths)) if self.shared else list(paths)

    def footers(self, paths: Sequence[str], held: Sequence[ParquetFileInfo] = ()) -> list[ParquetFileInfo]:
        """The footers of ``paths``: those in ``held`` as they are, the others read now."""
        by_path = {f.path: f for f in held}
        return [by_path.get(p) or read_file_info(self.filesystem, p) for p in paths]

    def read_agreed(self, read: Callable[[], _T]) -> _T:
        """``read()`` (footers of files rank 0 named); when shared, a rank that cannot read them (a mount that
        does not show them) stops every rank with its error rather than leaving them waiting in the next poll."""
        return on_every_rank(read, "reading the footers of the files rank 0 listed") if self.shared else read()

    def wait_for_new(
        self, known: set[str], stop: Callable[[], bool] | None = None, idle: Callable[[], None] | None = None
    ) -> list[ParquetFileInfo] | None:
        """New files, polling until some arrive; None when ``idle_timeout`` passed without any.
        :class:`FollowStopped` on every rank when ``stop()`` turned true on any rank while none had (every rank
        asks its own at each poll and they agree, :func:`~lightrec.data.parquet.ranks.any_rank`; each rank's own
        cuts its sleep between polls short, checked every ``_STOP_CHECK`` seconds). ``idle()`` runs on every
        rank after each poll that found nothing and did not
        end the wait, before the sleep: every rank is at the same poll then (each poll is a collective when
        shared), so it may run collectives of its own."""
        started = time.monotonic()
        shared = self.shared
        logger.info("following %s: waiting for new files (listing every %g s, idle_timeout=%s s)",
                    self.paths, self.options.poll_interval, self.options.idle_timeout)  # fmt: skip
        while True:
            mine: list[ParquetFileInfo] = []
            failure: Exception | None = None
            stopping = False
            if not shared or dist.get_rank() == 0:
                try:
                    mine = self.list_new(known)
                except Exception as exc:  # noqa: BLE001 -- sent to the other ranks with the poll, then raised
                    if not shared:
                        raise
                    failure = exc
            stopping = stop is not None and stop()
            waited = time.monotonic() - started
            timeout = self.options.idle_timeout
            # a file listed but not readable yet is one on its way: no idle end before it settles (_UnreadableFiles)
            expired = not mine and not self._unreadable.pending and timeout is not None and waited >= timeout
            poll = ([f.path for f in mine], expired, None if failure is None else f"{type(failure).__name__}: {failure}")
            found, stop_now, error = rank0_json(poll) if shared else poll
            # a stop asked of any one rank (a SIGTERM that reached it alone) ends every rank's wait
            stop_requested = (any_rank(stopping) if shared else stopping) and not found
            if failure is not None:
                raise failure
            if error is not None:  # rank 0's listing failed: every rank stops with it, none waits for the next poll
                raise RankDataMismatchError(f"rank 0 failed while listing {self.paths} for new files: {error}")
            if found:
                return self.read_agreed(functools.partial(self.footers, found, mine))
            if stop_requested:
                raise FollowStopped(f"following {self.paths}: stop requested while waiting for new files")
            if stop_now:
                return None
            if idle is not None:
                idle()
            _sleep_unless(stop, self.options.poll_interval)


def _sleep_unless(stop: Callable[[], bool] | None, seconds: float) -> None:
    """Sleep ``seconds``, waking early once ``stop()`` is true (checked every ``_STOP_CHECK`` seconds)."""
    if stop is None:
        time.sleep(seconds)
        return
    until = time.monotonic() + seconds
    while not stop() and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, _STOP_CHECK))


def following_source(
    path: str | Sequence[str],
    follow: FollowOptions,
    filesystem: pafs.FileSystem | None = None,
    unmarked: Sequence[str] = (),
) -> ParquetSource:
    """The files there at the start of following ``path`` (module docstring): the complete ones, or the first to land.

    A :class:`~lightrec.data.parquet.source.ParquetSource` with ``follow.marker``; while a path gives no
    complete file, it is listed again every ``follow.poll_interval`` seconds, for ``follow.idle_timeout``
    seconds at most (None: for ever). Each rank waits for its own listing: no collective. The paths in
    ``unmarked`` (fixed ``val`` / ``test`` selections) are listed without the marker.

    On a local disk, a path whose folder does not exist (for a glob, the folder before its first
    wildcard) is refused at once rather than waited for: that is a mistyped path far more often than a
    writer yet to start. On object stores (where an empty prefix does not exist either) it is waited for.

    Raises:
        FileNotFoundError: a path's folder does not exist, or a path still gives no complete file after
            ``follow.idle_timeout`` seconds.
        ParquetFileError: a file is not readable Parquet and stayed so, unchanged, for three polls (a first file
            written in place can be listed before its footer is written, as a later file can).
    """
    first_fs: pafs.FileSystem | None = None  # the source's filesystem: its first path's (ParquetSource)
    for p in [path] if isinstance(path, str) else [str(q) for q in path]:
        fs, inner = resolve_filesystem(p) if filesystem is None else (filesystem, p)
        first_fs = first_fs or fs
        root = listing_root(inner)
        # Local disks only: on an object store a prefix with no object yet "does not exist" either, and
        # waiting for the first file there is the normal start of following it.
        if fs.type_name == "local" and fs.get_file_info(root).type == pafs.FileType.NotFound:
            raise FileNotFoundError(
                f"cannot follow {p!r}: {root!r} does not exist. Check the path, or create the folder the files "
                "will land in before starting (following waits for files in an existing folder, not for the folder)"
            )
    started, warned = time.monotonic(), False
    timeout = follow.idle_timeout
    unreadable: _UnreadableFiles | None = None
    while True:
        try:
            return ParquetSource(path, filesystem, marker=follow.marker, unmarked=unmarked)
        except ParquetFileError as exc:  # a first file written in place, listed before its footer is written
            if unreadable is None:
                assert first_fs is not None  # a file was listed, so a path was resolved
                unreadable = _UnreadableFiles(first_fs)
            unreadable.unreadable(exc.path, exc)  # given the polls a later file gets
            left = follow.poll_interval
        except FileNotFoundError as exc:
            waited = time.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise FileNotFoundError(
                    f"{exc}. Following waited {waited:.1f} s (idle_timeout={timeout:g}) for a first file there; "
                    "start when the first file has landed, or raise idle_timeout (None: wait for ever)"
                ) from exc
            if not warned:
                logger.warning(
                    "following %s: no complete Parquet file there yet; listing it every %g s for the first one "
                    "(idle_timeout=%s s)", path, follow.poll_interval, timeout,
                )  # fmt: skip
                warned = True
            left = follow.poll_interval if timeout is None else min(follow.poll_interval, timeout - waited)
        time.sleep(max(left, 0.0))


class FollowingParquetLoader(LoaderBase):
    """An unbounded loader over a growing folder (module docstring); no ``len()``.

    Args:
        source: the files there at the start (:func:`following_source`): rank 0's are read in the first
            round (module docstring). With ``follow.marker``, files of a folder without the marker are
            left for the poll that finds it, also when the source was listed without the marker.
        spec / batch_size: see :class:`~lightrec.data.parquet.loader.LoaderBase`.
        follow: polling settings.
        leave_out: ``leave_out(path)`` is True for a file that is not training data (the ``val`` and
            ``test`` selections, :func:`~lightrec.data.parquet.splits.held_out`): left out of every
            round, whether it is there at the start or lands later.
        **options: ``LoaderBase``'s (``rank``, ``world_size``, ``num_workers``, ...).
    """

    def __init__(
        self,
        source: ParquetSource,
        spec: FeatureSpec,
        batch_size: int,
        follow: FollowOptions | None = None,
        leave_out: Callable[[str], bool] | None = None,
        **options: Unpack[FollowLoaderOptions],
    ) -> None:
        super().__init__(source, spec, batch_size, **options)
        self.follow = follow or FollowOptions()
        self.watcher = FolderWatcher(source.filesystem, source.inner_paths, self.follow, leave_out, self.world_size)
        self.files = self.reader.files  # grows as files arrive; slices index it
        self._by_path = {f.path: i for i, f in enumerate(self.files)}
        self._done: list[str] = []
        first = [f.path for f in source.files if leave_out is None or not leave_out(f.path)]
        if source.marker != self.follow.marker:  # a folder not marked yet waits for the poll that finds its marker
            first = complete_files(source.filesystem, first, self.follow.marker)
        self._round: list[str] = first
        self._carry: list[Slice] = []
        self._ended = False
        self._rounds = FollowedRounds()
        self._resume: LoaderPosition | None = None
        self.stop_waiting: Callable[[], bool] | None = None
        """While waiting for new files, a true ``stop_waiting()`` ends the wait (any rank's, for every rank):
        ``on_stop`` is called, and where it returns the stream ends as after ``idle_timeout``.
        ``ParquetDataModule`` sets it to whether the process got SIGTERM (``trainer.received_sigterm``, or the
        signal ``RecStrategy``'s handler noted)."""
        self.on_stop: Callable[[], None] | None = None
        """Called on every rank when ``stop_waiting`` ended a wait, before the stream would end there (the round
        in progress, its last batch held by Lightning untrained); ``ParquetDataModule`` raises Lightning's
        ``SIGTERMException`` from it, so the epoch is not completed and a checkpoint at the stop resumes it."""
        self.on_wait: Callable[[], None] | None = None
        """Called on every rank after each poll that found no new file (all ranks at the same poll: it may run
        collectives); ``ParquetDataModule`` calls the trainer's :class:`WaitsForData` callbacks there."""

    def __len__(self) -> int:
        raise TypeError("a following Parquet loader is unbounded: it has no length")

    def _index(self, info: ParquetFileInfo) -> int:
        """The file's index in ``files``: appended when new, its footer replaced when the file changed since it was
        listed (the source listed it before its folder was marked; no round read it)."""
        index = self._by_path.get(info.path)
        if index is not None and (self.files[index].size, self.files[index].mtime_ns) == (info.size, info.mtime_ns):
            return index
        first = self.files[0]  # a new file must give the same features, of the same kinds
        check_schema(self.spec, info.schema, info.path, first=(first.schema, first.path))
        if index is None:
            self.files.append(info)
            index = self._by_path[info.path] = len(self.files) - 1
        else:
            self.files[index] = info
        return index

    def _index_all(self, infos: Sequence[ParquetFileInfo]) -> list[int]:
        return [self._index(info) for info in infos]

    def _index_of(self, path: str) -> int:
        """The index in ``files`` of a file rank 0 or a checkpoint named (its footer read when this rank has not)."""
        if path in self._by_path:
            return self._by_path[path]
        return self._index(read_file_info(self.source.filesystem, path))

    def _agree_round(self) -> None:
        """Start from rank 0's round: each rank listed the path itself, not at the same moment (module docstring)."""
        mine = set(self._round)  # indexed already
        agreed = self.watcher.agree_round(self._round)
        # listed later, or its folder marked since: its footer as it is now
        later = [p for p in agreed if p not in mine]
        # footers and schema checks of files this rank had not listed: a failure on one rank stops every rank
        self.watcher.read_agreed(lambda: self._index_all(self.watcher.footers(later)))
        self._round = agreed

    def _round_slices(self) -> list[Slice]:
        return self._carry + slices_of(self.files, [self._by_path[p] for p in self._round])

    def _check_world(self) -> None:
        """Refuse a width that is neither 1 (following alone) nor the running ``torch.distributed`` world's."""
        if self.world_size > 1 and distributed() and self.world_size != dist.get_world_size():
            raise ValueError(
                f"a following loader of world_size={self.world_size} in a torch.distributed world of "
                f"{dist.get_world_size()} ranks: its rank 0 tells the others what it lists, on every rank of that "
                f"world. Build it on every rank with world_size={dist.get_world_size()} (rank=dist.get_rank()), or "
                "with world_size=1 for a process that follows alone"
            )

    def __iter__(self) -> Iterator[Batch]:
        self._check_world()  # here, not when built: Lightning starts torch.distributed after the loader is made
        start = self.watcher.read_agreed(self._restore)  # a checkpoint's file one rank cannot read stops every rank
        self._agree_round()
        self._ended = False
        self._yielded, self.prefetched = start, 0
        self._rounds.restart()
        while True:
            self._begin_round(start)
            slices = self._round_slices()
            plan = plan_epoch(slices, self.batch_size, self.rank, self.world_size)
            used = plan.steps * self.batch_size * self.world_size
            yield from self._batches(plan.units_from(start))
            start = 0
            leftover = take_rows(slices, used)
            # Files listed at start but not in a resumed position count as new: read in the next round.
            known = set(self._done) | set(self._round) | {self.files[s.file].path for s in leftover}
            # While waiting, Lightning holds this round's last batch (read ahead, not trained), or an earlier
            # round's when this one made no batch: a position taken now -- a checkpoint at a stop -- names the
            # round of that batch (``FollowedRounds``), so a resume trains it.
            try:
                new = self.watcher.wait_for_new(known, self.stop_waiting, self.on_wait)
            except FollowStopped:
                if self.on_stop is not None:
                    self.on_stop()  # Lightning's SIGTERM stop: raises, the round still in progress
                new = None
            self._done += self._round
            self._carry = leftover
            self._round = []
            if new is None:
                # The stream ended: Lightning trains what it held, and the position is "batch 0 of the next
                # round" (the empty round, with the rows carried).
                self._ended = True
                self._begin_round(0)
                self.skipped.log(f"{self.name} data (followed)")
                return
            indices = self.watcher.read_agreed(functools.partial(self._index_all, new))  # schema checks, every rank
            self._round = [self.files[i].path for i in indices]
            logger.info("following %s: %d new file(s), from %s", self.source.paths, len(new), new[0].path)

    def _begin_round(self, start: int) -> None:
        """Note the round in progress starting at its batch ``start`` (``position`` may name it later)."""
        self._rounds.begin(self._yielded, self._held(), start, self._done, self._round, self._carry_rows())
        self._yielded = start

    def _held(self) -> int:
        """Batches read but not trained: Lightning reads one ahead of an unsized loader until the stream ends."""
        return (0 if self._ended else 1) + self.prefetched

    def _carry_rows(self) -> list[list[str | int]]:
        return [[self.files[s.file].path, s.row_group, s.lo, s.hi] for s in self._carry]

    def _restore(self) -> int:
        resume = self._resume
        if resume is None or resume.follow is None:
            self._resume = None
            return 0
        state = resume.follow
        named = named_files(state)
        for path in named:
            self._index_of(path)  # may raise: the position is kept, and iterating again resumes it again
        # the same files as at the checkpoint (may raise, as above)
        check_named_files(resume, named, [self.files[self._by_path[p]] for p in named])
        self._resume = None
        self._done, self._round = list(state["done"]), list(state["round"])
        self._carry = [Slice(self._by_path[str(p)], int(g), int(lo), int(hi)) for p, g, lo, hi in state["carry"]]
        return resume.batch

    def _fingerprint(self, state: FollowState) -> str:
        """The sizes of the files ``state`` names (checked on resume: :func:`~lightrec.data.parquet.state.check_named_files`)."""
        return sizes_fingerprint(self.files[self._by_path[p]] for p in named_files(state))

    def position(self) -> LoaderPosition:
        """The round of the first batch not trained yet, and that batch's index in it (``FollowedRounds``)."""
        if self._resume is not None:  # a position loaded and not iterated yet is where this loader is
            return self._resume
        if self._rounds.empty:  # not iterated yet: the start
            state: FollowState = {"done": list(self._done), "round": list(self._round), "carry": self._carry_rows()}
            return LoaderPosition(0, 0, self.world_size, self.batch_size, self._fingerprint(state), state)
        batch, state = self._rounds.position(self._yielded, self._held(), self._done)
        return LoaderPosition(0, batch, self.world_size, self.batch_size, self._fingerprint(state), state)

    def state_dict(self) -> LoaderState:
        return self.position().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        position = LoaderPosition.from_dict(state)
        if position.follow is None:
            raise ResumeMismatchError("the checkpoint's data position is not a following loader's; resume without follow")
        position.check_fits(self.world_size, self.batch_size, "")
        self._resume = position

