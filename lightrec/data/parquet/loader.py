"""``ParquetLoader``: one rank's batches of a Parquet split, read by loader workers, resumable mid-epoch.

::

    ParquetLoader  (in the training process: iterable, len() = steps per epoch, state_dict)
      ├─ plan the epoch (sharding.plan_epoch): this rank's units, from the resume position on
      ├─ num_workers = 0: read each unit here            ┐  unit j -> worker j mod num_workers;
      │  num_workers > 0: a torch DataLoader of workers   ┘  in parts; put back in unit order here
      │     worker: read_unit = BlockReader.read -> read_columns (checks) -> lay_out of each part (shm)
      └─ BatchAssembler: pieces -> Batch (views; a batch spanning two units joined)

It is not a ``torch.utils.data.DataLoader`` (Lightning would re-create one of those with a sampler of
its own); Lightning takes any iterable, sizes the epoch by ``len()``, calls ``sampler.set_epoch`` at
every epoch and checkpoints ``state_dict()`` (:mod:`lightrec.data.parquet.state`). Workers are
started for every epoch and stop when it ends or is abandoned, or, with ``persistent_workers``, are
kept across completed epochs: each plans its next epoch itself from the epoch and first batch the
training process writes into shared memory before it restarts them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypedDict, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from typing_extensions import Unpack

from lightrec.data.batch import Batch
from lightrec.data.errors import OnError, check_at_least, check_on_error
from lightrec.data.parquet.batches import BatchAssembler, UnitBatches, lay_out
from lightrec.data.parquet.columns import raise_first, read_columns, skip_messages
from lightrec.data.parquet.errors import SkippedRows
from lightrec.data.parquet.reader import BlockReader
from lightrec.data.parquet.sharding import EpochPlan, Slice, Unit, plan_epoch
from lightrec.data.parquet.source import ParquetSource
from lightrec.data.parquet.spec import FeatureSpec
from lightrec.data.parquet.state import LoaderPosition, LoaderState, fingerprint
from lightrec.data.parquet.transport import ReleaseBoard, UnitArena

__all__ = ["LoaderBase", "LoaderOptions", "ParquetLoader", "UnitStream", "epoch_units", "part_bounds", "read_unit"]

_SKIP_EXAMPLES = 5


class LoaderOptions(TypedDict, total=False):
    """:class:`LoaderBase`'s keywords after ``rank``/``world_size`` (what a subclass passes through)."""

    num_workers: int
    on_error: OnError
    pin_memory: bool
    prefetch_factor: int
    name: str
    persistent_workers: bool


def part_bounds(start: int, rows: int, parts: int, batch_size: int) -> np.ndarray:
    """``[parts + 1]`` row offsets in a unit of ``rows`` rows at stream row ``start``: its parts.

    Interior cuts fall on batch boundaries of the stream (nearest to an even split), so parts add
    no partial batches; a part may be empty when the unit is short.
    """
    ideal = start + np.arange(parts + 1) * (rows / parts)
    cuts = np.clip(np.round(ideal / batch_size) * batch_size, start, start + rows).astype(np.int64)
    cuts[0], cuts[-1] = start, start + rows
    return np.maximum.accumulate(cuts) - start


def _empty_part(index: int, part: int, last: bool, features: int) -> UnitBatches:
    """A part with no rows (a short unit): keeps every unit at the same number of parts."""
    empty = torch.empty(0)
    pieces, per_key = np.empty((0, 7), dtype=np.int64), np.empty((0, features), dtype=np.int64)
    return UnitBatches(index, empty, empty, None, empty, None, pieces, per_key, part=part, last=last)


def read_unit(
    reader: BlockReader,
    spec: FeatureSpec,
    unit: Unit,
    index: int,
    batch_size: int,
    on_error: OnError,
    arena: UnitArena,
    parts: int = 1,
) -> Iterator[UnitBatches]:
    """Read and check one unit, then lay it out in ``parts`` parts (what a loader worker does per unit).

    The unit is read and checked whole (a row group is decoded at once), and handed over part by
    part: the training process starts on the first part while the rest is laid out, and the
    arena's slots hold parts, not units (less shared memory to fault in when a worker starts).
    """
    rows = reader.read(unit)
    columns = read_columns(rows, spec)
    positions, skipped, examples = None, 0, []
    if columns.bad:
        if on_error == "raise":
            raise_first(rows, columns.bad)
        bad = np.logical_or.reduce([b.mask for b in columns.bad])
        examples = skip_messages(rows, columns.bad, _SKIP_EXAMPLES)
        skipped = int(bad.sum())
        positions = unit.start + np.flatnonzero(~bad)
        columns = columns.keep(~bad)
    cuts = part_bounds(unit.start, unit.rows, parts, batch_size)
    kept = cuts if positions is None else np.searchsorted(positions, unit.start + cuts, side="left")
    for k in range(parts):
        a, b, lo, hi = int(cuts[k]), int(cuts[k + 1]), int(kept[k]), int(kept[k + 1])
        if a == b:
            out = _empty_part(index, k, k == parts - 1, len(spec.sparse))
        else:
            part = columns if (lo, hi) == (0, columns.rows) else columns.rows_between(lo, hi)
            at = None if positions is None else positions[lo:hi]
            out = lay_out(index, unit.start + a, b - a, part, spec, batch_size, arena, at)
            out.part, out.last = k, k == parts - 1
        if k == 0:
            out.skipped, out.skip_examples = skipped, examples
        yield out


class UnitStream(IterableDataset):
    """The units of one epoch as ``UnitBatches``, ``parts`` per unit; in worker ``w`` of ``n``, units ``w, w + n, ...``.

    Args:
        reader / spec / units / batch_size / on_error: what to read and how.
        board: where the training process releases parts (workers reuse their arena's slots after it).
        slots: arena slots per worker.
        parts: parts per unit (the same for every unit, so torch's round-robin over the workers
            stays aligned with the units: worker ``w``'s ``m``-th part is part ``m mod parts`` of its
            ``m // parts``-th unit).
        planner / control: for workers kept across epochs: ``planner(epoch, batch)`` gives the units
            from batch ``batch`` of epoch ``epoch``, which the training process writes into the
            shared ``control`` ``[2]`` int64 before each epoch (``units`` is then ignored).
    """

    def __init__(
        self,
        reader: BlockReader,
        spec: FeatureSpec,
        units: Sequence[Unit],
        batch_size: int,
        on_error: OnError,
        board: ReleaseBoard | None = None,
        slots: int = 1,
        parts: int = 1,
        planner: Callable[[int, int], Sequence[Unit]] | None = None,
        control: torch.Tensor | None = None,
    ) -> None:
        self.reader, self.spec, self.units = reader, spec, list(units)
        self.batch_size, self.on_error = batch_size, on_error
        self.board, self.slots, self.parts = board, slots, parts
        self.planner, self.control = planner, control
        self._arena: UnitArena | None = None  # kept for the worker's life: its slots are faulted in once

    def __iter__(self) -> Iterator[UnitBatches]:
        worker = get_worker_info()
        first, step = (0, 1) if worker is None else (worker.id, worker.num_workers)
        if self._arena is None:
            self._arena = (
                UnitArena(shared=False)
                if worker is None
                else UnitArena(shared=True, slots=self.slots, board=self.board, worker=worker.id)
            )
        units = self.units
        if self.planner is not None and self.control is not None:
            units = list(self.planner(int(self.control[0]), int(self.control[1])))
        for j in range(first, len(units), step):
            yield from read_unit(self.reader, self.spec, units[j], j, self.batch_size, self.on_error, self._arena, self.parts)


def epoch_units(
    slices: Sequence[Slice],
    batch_size: int,
    rank: int,
    world_size: int,
    shuffle: bool,
    seed: int,
    shuffle_window: int,
    epoch: int,
    batch: int,
) -> tuple[Unit, ...]:
    """The units of ``epoch`` from batch ``batch`` on (what kept workers plan for themselves)."""
    plan = plan_epoch(slices, batch_size, rank, world_size, epoch, shuffle, seed, shuffle_window)
    return plan.units_from(batch)


_T = TypeVar("_T")


def _as_is(item: _T) -> _T:
    """The DataLoader's collate function: a unit is handed over as the worker made it."""
    return item


class _Epoch:
    """What Lightning calls ``set_epoch`` on (a loader's ``sampler``) at the start of every epoch."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)


@dataclass
class _Workers:
    """Loader workers of one epoch, or kept across epochs (``persistent_workers``).

    Args:
        loader: torch's DataLoader over the :class:`UnitStream`.
        board: where the training process releases the workers' arena slots.
        count: the number of workers.
        control: ``[2]`` int64 in shared memory: the epoch and first batch kept workers read next.
        held: each worker's latest part (keeps its arena mapped in the training process).
        busy: an epoch is reading from them and its last part has not arrived yet.
        generation: the epochs handed to them so far (an older epoch's generator, closed late,
            leaves a newer epoch's workers alone).
    """

    loader: DataLoader
    board: ReleaseBoard
    count: int
    control: torch.Tensor
    held: dict[int, UnitBatches] = field(default_factory=dict)
    busy: bool = True
    generation: int = 0


class LoaderBase:
    """What both Parquet loaders share: reading units (here or in workers) and assembling batches.

    Args:
        source: the files.
        spec: the feature spec, sized (every sparse feature has ``num_embeddings`` or maps no ids).
        batch_size: samples per batch on this rank.
        rank / world_size: this rank and the number of ranks.
        num_workers: loader processes (0: read in this process).
        on_error: ``"raise"`` at the first bad row, or ``"skip"`` bad rows (counted: ``skipped``).
        pin_memory: build the batches in page-locked memory (for asynchronous copies to a GPU).
        prefetch_factor: parts each worker lays out ahead.
        name: the split, for messages.
        persistent_workers: keep the workers across epochs (they plan each epoch themselves, so
            they are not started again and their shared memory stays mapped); an epoch abandoned
            midway shuts them down. A following loader starts its workers per round.
    """

    def __init__(
        self,
        source: ParquetSource,
        spec: FeatureSpec,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        on_error: OnError = "raise",
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        name: str = "train",
        persistent_workers: bool = False,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0: read in the training process), got {num_workers!r}")
        check_at_least(1, prefetch_factor=prefetch_factor)
        self.source, self.spec = source, spec
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.num_workers, self.on_error = num_workers, check_on_error(on_error)
        self.pin_memory, self.prefetch_factor, self.name = pin_memory, prefetch_factor, name
        self.persistent_workers = persistent_workers
        self._kept: _Workers | None = None
        self.reader = BlockReader(source.filesystem, source.files, spec.columns())
        self.sampler = _Epoch()
        self.batch_sampler = None  # Lightning reads both attributes of anything with a sampler
        #: Batches read ahead by a pipelining callback and not trained yet (SparseDistPrefetch sets it).
        self.prefetched = 0
        #: Rows left out under on_error="skip", over the loader's life.
        self.skipped = SkippedRows()
        #: Called with the new total whenever rows were skipped (the DataModule logs it).
        self.on_skip: Callable[[int], None] | None = None
        self._yielded = 0

    #: Rows per part in which a worker hands a unit over (rounded up to whole batches). Smaller parts
    #: reach the training process sooner and need less shared memory; a unit is still decoded whole.
    part_rows = 32_768

    def _parts_of(self, rows: int) -> int:
        """Parts of a unit of ``rows`` rows: about ``part_rows`` rows each, whole batches (at least 1)."""
        part_rows = -(-max(self.part_rows, 1) // self.batch_size) * self.batch_size
        return max(-(-rows // part_rows), 1)

    def _parts(self, units: Sequence[Unit]) -> int:
        """Parts per unit this epoch: as many as the largest unit needs."""
        return self._parts_of(max([u.rows for u in units] or [0]))

    def _planner(self) -> Callable[[int, int], Sequence[Unit]] | None:
        """``(epoch, batch) -> units`` for workers kept across epochs; None: workers per epoch."""
        return None

    def _workers_for(self, units: Sequence[Unit], parts: int, where: tuple[int, int] | None) -> _Workers | None:
        """The epoch's loader workers: none (``num_workers=0``), the kept ones, or new ones."""
        if self.num_workers == 0 or not units:
            return None
        planner = self._planner() if self.persistent_workers and where is not None else None
        kept = self._kept
        if planner is not None and kept is not None and where is not None:
            if not kept.busy:  # the last epoch got every part: the workers wait for the next one
                kept.control[0], kept.control[1] = where  # read by the workers as they restart
                kept.busy, kept.generation = True, kept.generation + 1
                return kept
            kept.board.stop()  # an abandoned epoch not closed yet: its workers may wait for slots
            self._kept = None
        count = self.num_workers if planner is not None else min(self.num_workers, len(units))
        board = ReleaseBoard(count)
        # Queued, being copied out, one to write into; with several workers, the parts of one unit
        # that arrive (round-robin) while an earlier worker's unit is still being copied out.
        slots = self.prefetch_factor + 2 + (parts if count > 1 else 0)
        control = torch.tensor(where or (0, 0), dtype=torch.int64).share_memory_()
        stream = UnitStream(
            self.reader, self.spec, units, self.batch_size, self.on_error, board, slots, parts, planner, control
        )
        loader = DataLoader(
            stream, batch_size=None, num_workers=count, collate_fn=_as_is, prefetch_factor=self.prefetch_factor,
            persistent_workers=planner is not None,
        )  # fmt: skip
        workers = _Workers(loader, board, count, control)
        if planner is not None:
            self._kept = workers
        return workers

    def _batches(self, units: Sequence[Unit], where: tuple[int, int] | None = None) -> Iterator[Batch]:
        """The batches of ``units``; ``where`` = (epoch, first batch) where workers may be kept across epochs."""
        pin = self.pin_memory and torch.cuda.is_available()
        assembler = BatchAssembler(self.spec.keys, self.batch_size, pin_memory=pin)
        parts = self._parts(units)
        workers = self._workers_for(units, parts, where)
        generation = workers.generation if workers is not None else 0
        expected, expected_part = 0, 0
        try:
            for piece in self._read(units, workers, parts):
                if (piece.index, piece.part) != (expected, expected_part):
                    raise RuntimeError(
                        f"loader workers delivered part {piece.part} of unit {piece.index} where part {expected_part} "
                        f"of unit {expected} was due"
                    )
                if workers is not None and piece.last and piece.index == len(units) - 1:
                    workers.busy = False  # every part is here (before its batches go out: the last may be abandoned)
                if piece.skipped:
                    self.skipped.add(piece.skipped, piece.skip_examples)
                    if self.on_skip is not None:
                        self.on_skip(self.skipped.count)
                for batch in assembler.add(piece):
                    self._yielded += 1
                    yield batch
                if workers is not None and piece.seq >= 0:  # every batch of the part is copied out: reuse its slot
                    workers.board.release(piece.index % workers.count, piece.seq)
                expected, expected_part = (expected + 1, 0) if piece.last else (expected, expected_part + 1)
        finally:
            if workers is not None and workers.busy and workers.generation == generation:
                workers.board.stop()  # an abandoned epoch: workers waiting for a slot go on, and end
                if workers is self._kept:
                    self._kept = None

    def _read(self, units: Sequence[Unit], workers: _Workers | None, parts: int) -> Iterator[UnitBatches]:
        """The units' parts in order (from the workers, or read here without them)."""
        if workers is None:
            yield from UnitStream(self.reader, self.spec, units, self.batch_size, self.on_error, parts=parts)
            return
        waiting: list[deque[UnitBatches]] = [deque() for _ in range(workers.count)]
        due = 0  # the unit whose parts go out next
        for piece in workers.loader:
            worker = piece.index % workers.count
            workers.held[worker] = piece  # keep the worker's latest part here: its arena stays mapped
            waiting[worker].append(piece)
            while waiting[due % workers.count]:
                piece = waiting[due % workers.count].popleft()
                due += piece.last
                yield piece

    def close(self) -> None:
        """Shut down workers kept across epochs (they also end with the loader)."""
        self._kept = None


class ParquetLoader(LoaderBase):
    """This rank's batches of a Parquet split, epoch after epoch (module docstring).

    Args:
        source / spec / batch_size / rank / world_size / num_workers / on_error / pin_memory /
            prefetch_factor / name: see :class:`LoaderBase`.
        slices: the split's rows (``sharding.slices_of`` and the splits).
        shuffle / seed / shuffle_window: see :func:`~lightrec.data.parquet.sharding.plan_epoch`.
    """

    def __init__(
        self,
        source: ParquetSource,
        spec: FeatureSpec,
        slices: Sequence[Slice],
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_window: int = 1,
        **options: Unpack[LoaderOptions],
    ) -> None:
        super().__init__(source, spec, batch_size, rank, world_size, **options)
        self.slices = list(slices)
        self.shuffle, self.seed, self.shuffle_window = shuffle, seed, shuffle_window
        self._steps = self.plan(0).steps  # the same every epoch: the rows do not change
        self._resume: LoaderPosition | None = None
        settings = {"shuffle": shuffle, "seed": seed, "window": shuffle_window}
        self.fingerprint = fingerprint(source.files, self.slices, settings)

    def plan(self, epoch: int) -> EpochPlan:
        """This rank's plan of ``epoch``."""
        return plan_epoch(
            self.slices, self.batch_size, self.rank, self.world_size, epoch, self.shuffle, self.seed,
            self.shuffle_window,
        )  # fmt: skip

    def _planner(self) -> Callable[[int, int], Sequence[Unit]]:
        return partial(
            epoch_units, tuple(self.slices), self.batch_size, self.rank, self.world_size, self.shuffle, self.seed,
            self.shuffle_window,
        )  # fmt: skip

    def _parts(self, units: Sequence[Unit]) -> int:
        # The same every epoch (kept workers size their arenas once): a unit is at most one block.
        return self._parts_of(max([s.rows for s in self.slices] or [0]) * self.shuffle_window)

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.sampler.epoch
        resume, self._resume = self._resume, None
        start = resume.batch if resume is not None and resume.epoch == epoch else 0
        plan = self.plan(epoch)
        self._yielded, self.prefetched = start, 0
        yield from self._batches(plan.units_from(start), (epoch, start))
        self.skipped.log(f"{self.name} data")

    def position(self) -> LoaderPosition:
        """Where the loader is: batches of the current epoch trained (read minus ``prefetched``)."""
        return LoaderPosition(
            epoch=self.sampler.epoch, batch=max(self._yielded - self.prefetched, 0), world_size=self.world_size,
            batch_size=self.batch_size, fingerprint=self.fingerprint,
        )  # fmt: skip

    def state_dict(self) -> LoaderState:
        return self.position().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        position = LoaderPosition.from_dict(state)
        position.check_fits(self.world_size, self.batch_size, self.fingerprint)
        if position.batch > self._steps:
            raise ValueError(f"the checkpoint's position, batch {position.batch}, is past the epoch's {self._steps} batches")
        self._resume = position
