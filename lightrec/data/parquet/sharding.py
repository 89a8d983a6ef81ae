"""Ranks and loader workers -> disjoint rows, equal step counts, an order that does not depend on workers.

One epoch of a split, for ``W`` ranks and ``B`` samples per rank and step::

    slices (row groups, in path order)       | rg0 | rg1 | rg2 | rg3 | rg4 | rg5 |
    shuffle=True: the slices permuted per     | rg3 | rg0 | rg5 | rg1 | rg4 | rg2 |
      epoch, cut into blocks of               |  block 0  |  block 1  |  block 2  |
      shuffle_window slices whose rows are
      permuted together (the shuffle buffer)
    the stream: N rows, steps = N // (W * B)  |<- rank 0: steps*B ->|<- rank 1 ->|..| dropped (< W*B)
    a rank's units: its part of each block    | u0 | u1 | u2 |          (a block on a rank
                                                                          boundary: both read it)

* every rank runs ``steps`` steps (a rank with one more step would wait forever in a collective);
  the last ``N mod (W * B)`` rows of the epoch are left out (fewer than one global batch);
* a rank's batch ``k`` is rows ``[k * B, (k + 1) * B)`` of its part of the stream. Its units (the
  rows of one block it owns) go round-robin to the loader workers -- unit ``j`` to worker
  ``j mod num_workers`` -- and the loader reassembles them in unit order, so the batches (content and
  order) are the same for any ``num_workers``;
* without ``shuffle``, blocks are single row groups read in path order and rows in file order;
* a resume from batch ``k`` starts at row ``k * B`` of the rank's part: :meth:`EpochPlan.units_from`.

Everything here is plain arithmetic on row counts taken from the files' footers: no data is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightrec.data.parquet.source import ParquetFileInfo
from lightrec.data.rank_sampling import check_rank

__all__ = ["Block", "EpochPlan", "Slice", "Unit", "plan_epoch", "slices_of", "take_rows"]


class _RowSpan:
    """Rows ``[lo, hi)`` of something (the dataclasses below declare the two fields)."""

    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Slice(_RowSpan):
    """Rows ``[lo, hi)`` of row group ``row_group`` of file ``file`` (an index into the source's files)."""

    file: int
    row_group: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Block:
    """Slices read together; with a ``seed`` their rows are permuted by ``default_rng(seed).permutation``."""

    slices: tuple[Slice, ...]
    seed: int | None = None

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)


@dataclass(frozen=True)
class Unit(_RowSpan):
    """Rows ``[lo, hi)`` of a block (in its permuted order), at row ``start`` of the rank's stream."""

    block: Block
    lo: int
    hi: int
    start: int


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: ``steps`` batches of ``batch_size`` rows, read from ``units`` in order."""

    steps: int
    batch_size: int
    units: tuple[Unit, ...]

    def units_from(self, batch: int) -> tuple[Unit, ...]:
        """The units from batch ``batch`` on (the first one trimmed to start at its first row)."""
        if not 0 <= batch <= self.steps:
            raise ValueError(f"batch must be in [0, {self.steps}], got {batch}")
        row = batch * self.batch_size
        out = []
        for unit in self.units:
            if unit.start + unit.rows <= row:
                continue
            if unit.start < row:
                cut = row - unit.start
                unit = Unit(unit.block, unit.lo + cut, unit.hi, row)
            out.append(unit)
        return tuple(out)


def slices_of(files: Sequence[ParquetFileInfo], indices: Sequence[int] | None = None) -> list[Slice]:
    """Whole row groups of the files (all, or those at ``indices``), in file order."""
    chosen = range(len(files)) if indices is None else indices
    return [Slice(i, g, 0, n) for i in chosen for g, n in enumerate(files[i].row_groups) if n > 0]


def take_rows(slices: Sequence[Slice], start: int, stop: int | None = None) -> list[Slice]:
    """Rows ``[start, stop)`` of the stream the slices make, as slices (the ends cut)."""
    out, at = [], 0
    for s in slices:
        lo, hi = max(start, at), s.rows + at if stop is None else min(stop, at + s.rows)
        if lo < hi:
            out.append(Slice(s.file, s.row_group, s.lo + lo - at, s.lo + hi - at))
        at += s.rows
    return out


def _blocks(slices: Sequence[Slice], epoch: int, shuffle: bool, seed: int, window: int) -> list[Block]:
    if not shuffle:
        return [Block((s,)) for s in slices]
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(slices))
    groups = [tuple(slices[i] for i in order[k : k + window]) for k in range(0, len(order), window)]
    seeds = rng.integers(0, 2**63 - 1, size=len(groups))
    return [Block(g, int(s)) for g, s in zip(groups, seeds)]


def plan_epoch(
    slices: Sequence[Slice],
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    epoch: int = 0,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_window: int = 1,
) -> EpochPlan:
    """This rank's :class:`EpochPlan` of one epoch over ``slices`` (module docstring).

    Args:
        slices: the split's rows, in path order.
        batch_size: rows per batch per rank.
        rank / world_size: this rank and the number of ranks.
        epoch: the epoch (shuffles differ per epoch; the same on every rank).
        shuffle: permute the slices, and the rows of each block, per epoch.
        seed: the shuffle seed.
        shuffle_window: slices per block (rows of a block are permuted together; a loader worker
            holds one block's columns in memory).
    """
    check_rank(rank, world_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if shuffle_window < 1:
        raise ValueError(f"shuffle_window must be >= 1 (row groups whose rows are mixed), got {shuffle_window!r}")
    blocks = _blocks(slices, epoch, shuffle, seed, shuffle_window)
    total = sum(b.rows for b in blocks)
    steps = total // (world_size * batch_size)
    first, last = rank * steps * batch_size, (rank + 1) * steps * batch_size
    units, at = [], 0
    for block in blocks:
        lo, hi = max(first, at), min(last, at + block.rows)
        if lo < hi:
            units.append(Unit(block, lo - at, hi - at, lo - first))
        at += block.rows
    return EpochPlan(steps=steps, batch_size=batch_size, units=tuple(units))
