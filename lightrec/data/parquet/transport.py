"""Memory for units on their way from a loader worker to the training process, reused, never page-faulted twice.

A unit's flat tensors (dense, labels, lengths, values, weights: ~260 bytes a row for Criteo-shaped
rows) are written once by the worker and read once by the training process, which copies each
batch out of them (:class:`~lightrec.data.parquet.batches.BatchAssembler`). Fresh memory for every
unit would cost a page fault per 4 KiB on both sides (measured here: ~1 GB/s, as much time as
decoding the Parquet pages), so each worker writes its units into an :class:`UnitArena`: a few
slots of one shared-memory buffer, allocated once and reused round-robin. torch sends a view of the
arena as a handle to the same memory; the training process maps it once and keeps it mapped.

A slot is reused only after the training process has copied every batch out of the unit in it: it
then writes the slot's sequence number into the :class:`ReleaseBoard` (one shared int64 per worker), which
the worker reads before it overwrites the slot (waiting, rarely, in short sleeps). Nothing the
training process hands on refers to an arena, so no batch can change under a model's feet.

With ``num_workers=0`` the same arena (one slot, private memory) is reused for every unit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

__all__ = ["ReleaseBoard", "UnitArena"]

_ALIGN = 64
_WAIT_S = 0.0002
_GIVE_UP_S = 3600.0
STOPPED = 2**62  # written to the board when the training process stops reading: workers stop waiting


class ReleaseBoard:
    """Per worker, the number of its last unit the training process has copied out (shared memory).

    Args:
        workers: loader workers (one entry each).
    """

    def __init__(self, workers: int) -> None:
        self.released = torch.full((max(workers, 1),), -1, dtype=torch.int64).share_memory_()

    def release(self, worker: int, seq: int) -> None:
        """The training process is done with worker ``worker``'s slot number ``seq`` (and all before)."""
        self.released[worker] = seq

    def stop(self) -> None:
        """No unit will be released any more (the epoch was abandoned): let waiting workers go on."""
        self.released.fill_(STOPPED)

    def wait_for(self, worker: int, seq: int) -> None:
        """Block until unit ``seq`` of ``worker`` is released (a short sleep loop)."""
        if seq < 0 or int(self.released[worker]) >= seq:
            return
        deadline = time.monotonic() + _GIVE_UP_S
        while int(self.released[worker]) < seq:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"loader worker {worker}: the training process did not take unit {seq} for {_GIVE_UP_S:.0f} s"
                )
            time.sleep(_WAIT_S)


def _shared_bytes(size: int) -> torch.Tensor:
    """``[size]`` uint8 in new shared memory, untouched (its pages are faulted in as they are written).

    ``Tensor.share_memory_()`` would allocate private memory first and copy it over; torch's own
    ``UntypedStorage._new_shared`` (what it calls underneath) makes the shared storage directly.
    """
    storage = torch.UntypedStorage._new_shared(size)
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,), (1,))


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class UnitArena:
    """A worker's reusable memory for its units' tensors (module docstring).

    Args:
        shared: shared memory (a loader worker) or private memory (the training process itself).
        slots: units that may be in flight at once (in the queue, or being copied out).
        board: where the training process reports released units (None: reuse at once).
        worker: this worker's entry of the board.
    """

    def __init__(self, shared: bool, slots: int = 1, board: ReleaseBoard | None = None, worker: int = 0) -> None:
        self.shared, self.slots, self.board, self.worker = shared, max(slots, 1), board, worker
        self._buffer: torch.Tensor | None = None
        self._slot_bytes = 0
        self._seq = 0
        self._first_seq_of_buffer = 0

    def _grow(self, nbytes: int) -> None:
        self._slot_bytes = _round_up(int(nbytes * 1.25) + _ALIGN)
        size = self._slot_bytes * self.slots
        self._buffer = _shared_bytes(size) if self.shared else torch.empty(size, dtype=torch.uint8)
        self._first_seq_of_buffer = self._seq  # earlier units live in the old buffer, which nobody overwrites

    def tensors(self, shapes: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> tuple[int, list[torch.Tensor]]:
        """Uninitialised tensors of the given shapes and dtypes for the next unit (or part), in one slot.

        Returns the slot's sequence number (0, 1, ... per arena: what the training process releases
        on the board) and the tensors in order.
        """
        sizes = [_round_up(max(int(torch.Size(shape).numel()), 1) * dtype.itemsize) for shape, dtype in shapes]
        if self._buffer is None or sum(sizes) > self._slot_bytes:
            self._grow(sum(sizes))
        seq, self._seq = self._seq, self._seq + 1
        if self.board is not None and seq - self.slots >= self._first_seq_of_buffer:
            self.board.wait_for(self.worker, seq - self.slots)
        assert self._buffer is not None
        at = (seq % self.slots) * self._slot_bytes
        out = []
        for (shape, dtype), size in zip(shapes, sizes):
            count = int(torch.Size(shape).numel())
            out.append(self._buffer[at : at + count * dtype.itemsize].view(dtype).view(shape))
            at += size
        return seq, out
