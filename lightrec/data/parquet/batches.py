"""A unit's checked columns -> its batches, laid out so the training process only slices views.

A unit covers rows ``[start, start + rows)`` of its rank's stream, where batch ``k`` is rows
``[k * B, (k + 1) * B)``: the unit cuts into *pieces* at multiples of ``B`` -- whole batches inside,
partial ones at its ends. The worker lays every piece out exactly as its ``Batch`` needs it, in five
flat tensors in a slot of its :class:`~lightrec.data.parquet.transport.UnitArena` (shared memory in
a loader worker: nothing is copied on the way to the training process)::

    dense    [r, D]   float32   rows in order; piece p is rows [row_p, row_p + n_p)
    labels   [r]      float32
    lengths  [F * r]  int32     piece after piece, each key-major: [key 0: n_p lengths | key 1 | ...]
    values   [V]      int64     piece after piece, each key-major (one np.concatenate of slices)
    weights  [V]      float32   only when a feature is weighted (1.0 for unweighted features' ids)

and a small table of pieces (batch index, planned rows, row, rows, lengths and values offsets) with
each piece's ``length_per_key``. :class:`BatchAssembler` copies each piece out into the tensors of
its own ``Batch`` -- one contiguous copy per tensor, into memory the allocator recycles -- so the
slot can be reused, and joins the partial pieces of a batch that spans units
(:func:`~lightrec.data.concat_batches`). With ``on_error="skip"`` a piece keeps its place on the
grid but holds fewer rows: a batch that had bad rows is that many samples smaller, every rank still
runs the same number of steps, and a resume still starts at the right row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from lightrec.data.batch import Batch, concat_batches
from lightrec.data.parquet.columns import UnitColumns, mapped_ids
from lightrec.data.parquet.errors import ParquetValueError
from lightrec.data.parquet.spec import FeatureSpec
from lightrec.data.parquet.transport import UnitArena
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["BatchAssembler", "UnitBatches", "lay_out"]

# Columns of UnitBatches.pieces.
BATCH, START, END, ROW, ROWS, LEN_AT, VAL_AT = range(7)


@dataclass
class UnitBatches:
    """One unit's pieces in flat tensors (module docstring), as a worker hands them over.

    Args:
        index: the unit's place in the rank's epoch (units arrive in this order).
        dense / labels / lengths / values / weights: the flat tensors; ``lengths`` is None when every
            feature has one id per row (all lengths are 1).
        pieces: ``[P, 7]`` int64: batch index, planned first and end row in the rank's stream (a
            whole batch spans ``[batch * B, (batch + 1) * B)``), first row in the tensors, rows,
            offset into ``lengths``, offset into ``values``.
        length_per_key: ``[P, F]`` ids per key of each piece.
        skipped: rows left out (``on_error="skip"``); skip_examples: their first messages.
        part / last: which part of the unit this is, and whether it is the unit's last (a worker
            hands a unit over in parts: :func:`~lightrec.data.parquet.loader.read_unit`).
        seq: the arena slot's sequence number (what the training process releases), -1 for none.
    """

    index: int
    dense: torch.Tensor
    labels: torch.Tensor
    lengths: torch.Tensor | None
    values: torch.Tensor
    weights: torch.Tensor | None
    pieces: np.ndarray
    length_per_key: np.ndarray
    skipped: int = 0
    skip_examples: list[str] = field(default_factory=list)
    part: int = 0
    last: bool = True
    seq: int = -1


def _piece_bounds(start: int, planned: int, batch_size: int, positions: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Batch index, planned start and end, and row bounds ``[P + 1]`` of the pieces of a unit."""
    end = start + planned
    first, last = start // batch_size, (end - 1) // batch_size
    batches = np.arange(first, last + 1, dtype=np.int64)
    planned_ends = np.minimum((batches + 1) * batch_size, end)
    cuts = np.concatenate([[start], planned_ends])
    if positions is None:  # no row was dropped: bounds are the planned ones
        bounds = cuts - start
    else:
        bounds = np.searchsorted(positions, cuts, side="left")
    return batches, cuts[:-1], planned_ends, bounds.astype(np.int64)


def _lengths(columns: UnitColumns, starts: np.ndarray, stops: np.ndarray, out: np.ndarray) -> None:
    """Write ``[F * r]`` int32 lengths into ``out``: piece after piece, key-major."""
    nf, r = len(columns.sparse), columns.rows
    for f, col in enumerate(columns.sparse):
        feature = col.lengths(r)
        for a, b in zip(starts.tolist(), stops.tolist()):
            out[nf * a + f * (b - a) : nf * a + (f + 1) * (b - a)] = 1 if feature is None else feature[a:b]


def _gather(
    sources: list[np.ndarray],
    offsets: list[np.ndarray | None],
    starts: np.ndarray,
    stops: np.ndarray,
    out: np.ndarray,
    sizes: np.ndarray,
    batch_size: int,
) -> None:
    """Write each piece's values key-major into ``out`` (pieces one after the other).

    Features with one id per row copy the whole batches in the middle of the unit at once (a
    strided copy per feature); everything else is one ``np.concatenate`` of slices.
    """
    nf = len(sources)
    if nf == 0:
        return
    full = np.flatnonzero(sizes == batch_size)
    middle = (
        all(o is None for o in offsets)
        and full.size > 1
        and full[-1] - full[0] + 1 == full.size  # consecutive whole batches
    )
    if not middle:
        slices = [
            src[a:b] if off is None else src[off[a] : off[b]]
            for a, b in zip(starts.tolist(), stops.tolist())
            for src, off in zip(sources, offsets)
        ]
        np.concatenate(slices, out=out)
        return
    first, last = int(full[0]), int(full[-1]) + 1
    lo, hi = int(starts[first]), int(stops[last - 1])
    n = last - first
    head, tail = nf * lo, nf * hi
    if first:
        _gather(sources, offsets, starts[:first], stops[:first], out[:head], sizes[:first], batch_size)
    block = out[head:tail].reshape(n, nf, batch_size)
    for f, src in enumerate(sources):
        block[:, f, :] = src[lo:hi].reshape(n, batch_size)
    if last < len(starts):
        _gather(sources, offsets, starts[last:], stops[last:], out[tail:], sizes[last:], batch_size)


def lay_out(
    index: int,
    start: int,
    planned: int,
    columns: UnitColumns,
    spec: FeatureSpec,
    batch_size: int,
    arena: UnitArena,
    positions: np.ndarray | None = None,
) -> UnitBatches:
    """Lay a unit's columns out as pieces in a slot of ``arena`` (module docstring).

    Args:
        index: the unit's place in the epoch.
        start: the unit's first row in the rank's stream; planned: its rows before any was skipped.
        columns: the unit's checked columns (bad rows already dropped).
        spec: the feature spec (sized: id mappings need ``num_embeddings``).
        batch_size: ``B``.
        arena: where the tensors go.
        positions: stream positions of the kept rows when rows were dropped, else None.
    """
    r, features = columns.rows, spec.sparse
    nf = len(features)
    batches, planned_starts, ends, bounds = _piece_bounds(start, planned, batch_size, positions)
    starts, stops = bounds[:-1], bounds[1:]
    sizes = stops - starts
    offsets = [c.offsets for c in columns.sparse]
    per_key = np.empty((len(sizes), nf), dtype=np.int64)
    for f, feature_offsets in enumerate(offsets):
        per_key[:, f] = sizes if feature_offsets is None else feature_offsets[stops] - feature_offsets[starts]
    counts = per_key.sum(axis=1)
    value_at = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(counts[:-1], out=value_at[1:])
    total = int(counts.sum())
    # Every feature one id per row: the lengths are all ones, which the assembler makes itself.
    one_each = all(o is None for o in offsets)
    shapes = [((r, len(spec.dense)), torch.float32), ((r,), torch.float32), ((total,), torch.int64)]
    shapes += [((0 if one_each else nf * r,), torch.int32)]
    shapes += [((total,), torch.float32)] if spec.weighted else []
    seq, (dense, labels, values, lengths, *weights) = arena.tensors(shapes)
    if columns.dense:
        np.stack(columns.dense, axis=1, out=dense.numpy())
    labels.numpy()[:] = columns.labels
    if not one_each:
        _lengths(columns, starts, stops, lengths.numpy())
    ids = [mapped_ids(f, c.values) for f, c in zip(features, columns.sparse)]
    _gather(ids, offsets, starts, stops, values.numpy(), sizes, batch_size)
    if spec.weighted:
        ones = np.ones(max([len(v) for v in ids] or [0]), dtype=np.float32)
        w = [c.weights if c.weights is not None else ones[: len(v)] for c, v in zip(columns.sparse, ids)]
        _gather(w, offsets, starts, stops, weights[0].numpy(), sizes, batch_size)
    pieces = np.stack([batches, planned_starts, ends, starts, sizes, nf * starts, value_at], axis=1)
    return UnitBatches(
        index, dense, labels, None if one_each else lengths, values, weights[0] if weights else None, pieces, per_key,
        seq=seq,
    )  # fmt: skip


class BatchAssembler:
    """Units in epoch order -> ``Batch`` es with memory of their own; partial pieces joined.

    Args:
        keys: the KJT keys.
        batch_size: ``B`` (a piece is a whole batch when it spans all ``B`` planned rows).
        pin_memory: copy the batches into page-locked memory (for asynchronous copies to a GPU).
    """

    def __init__(self, keys: list[str], batch_size: int, pin_memory: bool = False) -> None:
        self.keys = keys
        self.batch_size = batch_size
        self.pin_memory = pin_memory
        self._partial: list[Batch] = []
        self._partial_batch = -1

    def _copy(self, source: torch.Tensor) -> torch.Tensor:
        out = torch.empty(source.shape, dtype=source.dtype, pin_memory=self.pin_memory)
        return out.copy_(source)

    def _piece(self, unit: UnitBatches, p: int) -> Batch:
        """Piece ``p`` of the unit as a ``Batch`` of its own memory (copied out of the unit's slot)."""
        _, _, _, row, rows, len_at, val_at = (int(x) for x in unit.pieces[p])
        per_key = unit.length_per_key[p].tolist()
        count = sum(per_key)
        nf = len(self.keys)
        if unit.lengths is None:
            lengths = torch.ones(nf * rows, dtype=torch.int32, pin_memory=self.pin_memory)
        else:
            lengths = self._copy(unit.lengths[len_at : len_at + nf * rows])
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=self._copy(unit.values[val_at : val_at + count]),
            weights=None if unit.weights is None else self._copy(unit.weights[val_at : val_at + count]),
            lengths=lengths,
            stride=rows,
            length_per_key=per_key,
        )
        return Batch(self._copy(unit.dense[row : row + rows]), kjt, self._copy(unit.labels[row : row + rows]))

    def add(self, unit: UnitBatches) -> Iterator[Batch]:
        """The batches the unit completes, in order."""
        size = self.batch_size
        for p in range(unit.pieces.shape[0]):
            batch, start, end = (int(x) for x in unit.pieces[p, :3])
            piece = self._piece(unit, p)
            if not (start == batch * size and end == (batch + 1) * size):  # part of a batch that spans units
                if self._partial and batch != self._partial_batch:
                    raise RuntimeError(f"batch {self._partial_batch} was left incomplete before batch {batch}")
                self._partial.append(piece)
                self._partial_batch = batch
                if end != (batch + 1) * size:
                    continue
                piece = concat_batches(self._partial) if len(self._partial) > 1 else self._partial[0]
                self._partial = []
            if piece.batch_size == 0:
                raise ParquetValueError(
                    f"every row of batch {batch} was bad and skipped: there is nothing to train on in it. Fix the data "
                    "(lightrec data inspect shows id ranges and nulls)"
                )
            yield piece
