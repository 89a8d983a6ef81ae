"""Which rows of a tiered kernel's tables sit in which cache slot, and which slot to give up next.

The tables of one kernel share one slot space; table ``t`` owns the slots
``[cache_offset[t], cache_offset[t] + C_t)`` and its rows are the global rows
``[row_offset[t], row_offset[t] + R_t)``::

    slot_of    [sum R]  global slot of a global row, -1 when not cached   (4 bytes per row)
    row_of     [sum C]  table-local row a slot holds, -1 when free
    last_used  [sum C]  the lookup count at the slot's last use             (LRU, LFU's tie-break)
    freq       [sum C]  ids that read the slot since its row came in        (LFU)
    pins       [sum C]  lookups whose backward has not run yet, and prefetched batches not yet
                        looked up, that use the slot: a pinned slot is never evicted
    dirty      [sum C]  updated since its row came in (written back when evicted or flushed)

Everything is a tensor on the cache's device and every per-id update is one scatter (no sort, no
unique) so that a lookup whose rows are all cached costs a gather and a few scatters. Eviction runs
only when a table's free slots run out and then frees at least ``headroom`` of its cache at once:
the ``k`` unpinned slots with the lowest score (``last_used``, or ``freq`` then ``last_used``),
found with one ``topk`` over the table's slots, so its cost is paid once per many misses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Admission", "CacheFullError", "CacheIndex"]


class CacheFullError(RuntimeError):
    """A batch needs more rows of a table in the cache at once than the cache can hold."""


@dataclass
class Admission:
    """Slots given to rows entering one table's cache, and the rows they displaced.

    Attributes:
        rows: ``[n]`` table-local rows admitted, in the order of ``slots``.
        slots: ``[n]`` their global slots.
        victim_slots: ``[v]`` global slots whose dirty rows must be written back before reuse.
        victim_rows: ``[v]`` the table-local rows those slots held.
    """

    rows: torch.Tensor
    slots: torch.Tensor
    victim_slots: torch.Tensor
    victim_rows: torch.Tensor


class CacheIndex:
    """The slot bookkeeping of one tiered kernel (see the module docstring).

    Args:
        rows: ``[T]`` rows of each table.
        cache_rows: ``[T]`` slots of each table's cache.
        algorithm: ``"lru"`` or ``"lfu"``.
        headroom: share of a table's cache an eviction frees at least.
        names: ``[T]`` table names (messages).
        device: where the bookkeeping lives (the cache's device).
    """

    def __init__(
        self,
        rows: Sequence[int],
        cache_rows: Sequence[int],
        algorithm: str,
        headroom: float,
        names: Sequence[str],
        device: torch.device,
    ) -> None:
        self.rows, self.cache_rows, self.names = list(rows), list(cache_rows), list(names)
        self.algorithm, self.headroom, self.device = algorithm, headroom, device
        self.row_offset = [sum(self.rows[:t]) for t in range(len(self.rows))]
        self.cache_offset = [sum(self.cache_rows[:t]) for t in range(len(self.rows))]
        total_rows, total_slots = sum(self.rows), sum(self.cache_rows)
        self.slot_dtype = torch.int32 if total_slots < 2**31 else torch.int64
        self.slot_of = torch.full((total_rows,), -1, dtype=self.slot_dtype, device=device)
        self.row_of = torch.full((total_slots,), -1, dtype=torch.int64, device=device)
        self.last_used = torch.zeros(total_slots, dtype=torch.int64, device=device)
        self.freq = torch.zeros(total_slots, dtype=torch.int64, device=device)
        self.pins = torch.zeros(total_slots, dtype=torch.int32, device=device)
        self.dirty = torch.zeros(total_slots, dtype=torch.bool, device=device)
        self.tick = 0
        # per table, its free slots (table-local): admission takes from the front without scanning
        # the whole cache for them (a scan per batch would cost O(cache) on every step)
        self._free = [torch.arange(c, dtype=torch.int64, device=device) for c in self.cache_rows]

    # ---- per-id bookkeeping (the hot path) ------------------------------------------------
    def slots(self, global_rows: torch.Tensor) -> torch.Tensor:
        """``[N]`` global slot of each global row (-1: not cached)."""
        return self.slot_of.index_select(0, global_rows)

    def touch(self, slots: torch.Tensor, tick: int) -> None:
        """Record a use of ``slots`` (one entry per id) at lookup count ``tick``."""
        self.last_used.index_fill_(0, slots.long(), tick)
        if self.algorithm == "lfu":
            self.freq.index_add_(0, slots.long(), torch.ones_like(slots, dtype=torch.int64))

    def pin(self, slots: torch.Tensor, delta: int = 1) -> None:
        """Pin (``delta=1``) or release (``-1``) ``slots``, counted per entry."""
        if slots.numel():
            self.pins.index_add_(0, slots.long(), torch.full_like(slots, delta, dtype=torch.int32))

    def mark_dirty(self, slots: torch.Tensor) -> None:
        self.dirty.index_fill_(0, slots.long(), True)

    # ---- admission and eviction ---------------------------------------------------------------
    def table_of_rows(self, global_rows: torch.Tensor) -> torch.Tensor:
        """``[n]`` table index of each global row."""
        bounds = torch.tensor(self.row_offset[1:], dtype=torch.int64, device=global_rows.device)
        return torch.bucketize(global_rows, bounds, right=True)

    def room(self, table: int) -> tuple[int, int, int]:
        """``(free, evictable, pinned)`` slots of ``table``'s cache."""
        lo, size = self.cache_offset[table], self.cache_rows[table]
        held = self.row_of[lo : lo + size] >= 0
        pinned = self.pins[lo : lo + size] > 0
        return int((~held).sum()), int((held & ~pinned).sum()), int((held & pinned).sum())

    def check_room(self, table: int, need: int) -> None:
        """Raise :class:`CacheFullError` unless ``need`` more rows of ``table`` fit in its cache now."""
        free, evictable, pinned = self.room(table)
        if need > free + evictable:
            raise CacheFullError(
                f"table {self.names[table]!r}: a batch needs {need} more of its rows in the cache at once, but its "
                f"cache holds {self.cache_rows[table]} rows of which {free} are free and {evictable} evictable "
                f"({pinned} are in use by this batch, by lookups whose backward has not run or by prefetched "
                "batches); raise cache_load_factor (or cache_rows / min_cache_rows)"
            )

    def admit(self, table: int, rows: torch.Tensor, best_effort: bool = False) -> Admission:
        """Give slots of ``table`` to ``rows`` (unique table-local rows, none cached), evicting the
        lowest-scored unpinned slots when the free ones do not suffice.

        Args:
            best_effort: admit only as many rows as there is room for (a prefetch) instead of raising.

        Raises:
            CacheFullError: not ``best_effort`` and fewer slots are free or evictable than ``rows``.
        """
        lo, size = self.cache_offset[table], self.cache_rows[table]
        free = self._free[table]
        need = rows.numel()
        victims = torch.empty(0, dtype=torch.int64, device=self.device)
        if free.numel() < need:
            evictable = (self.row_of[lo : lo + size] >= 0) & (self.pins[lo : lo + size] == 0)
            available = int(evictable.sum())
            short = need - free.numel()
            if available < short:
                if not best_effort:
                    self.check_room(table, need)
                short = available
            count = min(available, max(short, math.ceil(self.headroom * size)))
            if count:
                score = self._score(lo, size).masked_fill(~evictable, torch.iinfo(torch.int64).max)
                victims = torch.topk(score, count, largest=False, sorted=False).indices
                free = torch.cat([free, victims])
            need = min(need, free.numel())
        rows = rows[:need]
        slots = free[:need] + lo
        self._free[table] = free[need:]
        victim_slots = victims + lo
        victim_rows = self.row_of.index_select(0, victim_slots)
        dirty = self.dirty.index_select(0, victim_slots)
        # unmap the victims, map the newcomers
        self.slot_of.index_fill_(0, victim_rows + self.row_offset[table], -1)
        self.row_of.index_fill_(0, victim_slots, -1)
        self.slot_of.index_copy_(0, rows + self.row_offset[table], slots.to(self.slot_dtype))
        self.row_of.index_copy_(0, slots, rows)
        for buffer in (self.dirty, self.freq):
            buffer.index_fill_(0, victim_slots, 0)
            buffer.index_fill_(0, slots, 0)
        return Admission(rows, slots, victim_slots[dirty], victim_rows[dirty])

    def _score(self, lo: int, size: int) -> torch.Tensor:
        last = self.last_used[lo : lo + size]
        if self.algorithm == "lfu":  # frequency first, recency breaks ties (both fit: ticks < 2^32)
            return (self.freq[lo : lo + size].clamp(max=2**30) << 32) | last.clamp(max=2**32 - 1)
        return last.clone()

    # ---- whole-cache views ----------------------------------------------------------------------
    def cached(self, table: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global slots, table-local rows)`` of every cached row of ``table``."""
        lo, size = self.cache_offset[table], self.cache_rows[table]
        slots = torch.nonzero(self.row_of[lo : lo + size] >= 0).flatten() + lo
        return slots, self.row_of.index_select(0, slots)

    def dirty_rows(self, table: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global slots, table-local rows)`` of the dirty cached rows of ``table``."""
        lo, size = self.cache_offset[table], self.cache_rows[table]
        slots = torch.nonzero(self.dirty[lo : lo + size]).flatten() + lo
        return slots, self.row_of.index_select(0, slots)

    def occupancy(self) -> int:
        """Cached rows over every table."""
        return int((self.row_of >= 0).sum())

    def clear(self) -> None:
        """Forget every cached row (nothing is written back: see ``TieredBatchedLookup.invalidate``)."""
        self.slot_of.fill_(-1)
        self.row_of.fill_(-1)
        self._free = [torch.arange(c, dtype=torch.int64, device=self.device) for c in self.cache_rows]
        for buffer in (self.last_used, self.freq, self.pins, self.dirty):
            buffer.zero_()
