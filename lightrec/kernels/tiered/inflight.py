"""The batches in flight of a tiered kernel, and the lookup count from which their cache slots stay put.

A batch is in flight from its admission until nothing will read or update its cache slots again: a
prefetched batch until its lookup, a looked-up training batch until its backward (or until its graph
is freed without one). Its slots must not be evicted meanwhile. Each admission is therefore told
``protect_from`` -- the lookup count (tick) of the oldest batch in flight -- and evicts no slot used at
that tick or later (``CacheIndex``'s module docstring: "Which slots stay put"). No counter is touched
per id when a batch comes in or goes.

A batch held much longer than the pipeline's own (a graph kept without its backward, a long gradient
accumulation) would hold back every slot used since it; after ``HOLD_LOOKUPS`` lookups, or as soon
as an admission finds no room, it pins its own slots instead (``CacheIndex.pin``), and the cache
serves the other batches around them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec.kernels.tiered.cache import CacheIndex

__all__ = ["HOLD_LOOKUPS", "BatchesInFlight", "Hold"]

# A batch in flight for more lookups than this pins its slots instead of holding back every slot
# used since: the pipeline keeps a lookup and up to 4 prefetched batches (TieredBatchedLookup's
# reservations) in flight, all within this many lookups.
HOLD_LOOKUPS = 8


@dataclass(eq=False)
class Hold:
    """A batch in flight: the lookup count it used its slots at, its ``[N]`` slots (-1: left out, no
    room), and whether they are pinned instead (:class:`BatchesInFlight`)."""

    tick: int
    slots: torch.Tensor
    pinned: bool = False


class BatchesInFlight:
    """The holds of one tiered kernel, oldest first (see the module docstring).

    The thread that runs the kernel's bookkeeping owns them; a hold ended on another thread (a
    finalizer run by the worker's garbage collection) is handed over with :meth:`drop_later`.
    """

    def __init__(self, index: CacheIndex) -> None:
        self.index = index
        self.holds: list[Hold] = []
        self._late: list[tuple[Hold, bool]] = []

    def add(self, tick: int, slots: torch.Tensor) -> Hold:
        hold = Hold(tick, slots)
        self.holds.append(hold)
        return hold

    def protect_from(self, tick: int) -> int:
        """The lookup count from which the slots stay put for an admission at ``tick``: the oldest
        batch in flight's (``tick`` when there is none). A hold older than ``HOLD_LOOKUPS`` lookups
        pins its slots instead, so the cache does not freeze behind it."""
        while self._late:
            self.drop(*self._late.pop())
        oldest = tick
        for hold in list(self.holds):  # (a copy: a finalizer may drop a hold meanwhile)
            if hold.pinned:
                continue
            if hold.tick < tick - HOLD_LOOKUPS:
                self._pin(hold)
            else:
                oldest = min(oldest, hold.tick)
        return oldest

    def pin_oldest(self) -> bool:
        """Pin the slots of the oldest batch in flight not pinned yet (an admission found no room:
        its tick may be holding back slots no batch in flight uses); False: there is none."""
        hold = next((h for h in self.holds if not h.pinned), None)
        if hold is None:
            return False
        self._pin(hold)
        return True

    def _pin(self, hold: Hold) -> None:
        hold.pinned = True
        self.index.pin(hold.slots[hold.slots >= 0])

    def drop(self, hold: Hold, updated: bool) -> None:
        """Forget ``hold`` (its slots were dirty since their admission; a pinned one is unpinned,
        and marked dirty when ``updated``)."""
        try:
            self.holds.remove(hold)
        except ValueError:  # dropped already (the cache was cleared in between)
            return
        if hold.pinned:
            self.index.release(hold.slots, updated)

    def drop_later(self, hold: Hold, updated: bool) -> None:
        """:meth:`drop` from another thread: done by the owner at its next :meth:`protect_from`."""
        self._late.append((hold, updated))

    def clear(self) -> None:
        """Forget every hold (the cache was cleared: nothing of theirs is left to keep)."""
        self.holds.clear()
        self._late.clear()
