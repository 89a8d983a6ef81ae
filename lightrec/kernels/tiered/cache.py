"""Which rows of a tiered kernel's tables sit in which cache slot, and which slot to give up next.

The tables of one kernel share one slot space; table ``t`` owns the slots
``[cache_offset[t], cache_offset[t] + C_t)`` and its rows are the global rows
``[row_offset[t], row_offset[t] + R_t)``::

    slot_of    [sum R]  global slot of a global row, -1 when not cached   (4 bytes per row)
    row_of     [sum C]  table-local row a slot holds, -1 when free
    last_used  [sum C]  the lookup count at the slot's last use             (LRU, LFU's tie-break)
    freq       [sum C]  ids that read the slot since its row came in        (LFU)
    pins       [sum C]  explicit holds on the slot: a pinned slot is never evicted
    dirty      [sum C]  its row may differ from the store's: used by a training batch since it
                        came in (written back when evicted or flushed)
    free_ring  [sum C]  per table, a ring of its free global slots over its slot range
    free_state [2, T]   per table, the ring's head (offset in the range) and count (on the CPU)

**Which slots stay put.** The batches in flight -- prefetched and not yet looked up, or looked up
with their backward still to run -- must keep their rows in their slots. Every admission takes
``protect_from``, the lookup count of the oldest of them: a slot used at that count or later is
not evicted (nor is the batch's own hits, used at ``tick``). A batch in flight used all its slots
at its own count or later, so this keeps them without touching a counter per id when the batch
comes in and again when it goes; it keeps the slots of the finished batches newer than it too,
which are the ones LRU and LFU would evict last anyway. A batch held much longer than the others
(a graph kept without its backward) is given ``pins`` instead (``TieredBatchedLookup``), so the
cache is not frozen behind it. A training batch marks its slots dirty when it is admitted -- its
backward will update them -- rather than when its backward runs; a batch whose backward never
runs costs a write-back of unchanged rows, nothing else.

Everything else is a tensor on the cache's device. On CPU a batch's bookkeeping is one native call
(``tiered_admit``; a lookup of a batch its prefetch admitted, ``tiered_touch``); elsewhere a few
scatters per batch, plus a ``torch.unique`` of the batch's missing rows. Eviction runs
only when a table's free slots run out and then frees at least ``headroom`` of its cache at once:
the ``k`` evictable slots (not kept, above) with the lowest score (``last_used``, or ``freq`` then
``last_used``), found in a pass or two over the table's slots, so its cost is paid once per many
misses (``evict`` frees them ahead of need). Ties are
broken by the lower slot and the victims join the table's free slots in slot order, so the
decisions are deterministic: the same on every run and on both paths below.

A batch's bookkeeping is one call, :meth:`CacheIndex.admit_batch` (gather every id's slot, admit
the missing rows, touch the slots and mark a training batch's dirty). On CPU it is one native op
(``torch.ops.lightrec_tiered.tiered_admit``, ``lightrec/csrc/tiered_cache.cpp``) instead of a few
dozen small torch ops and host syncs, which cost more than the lookup itself; elsewhere, without
the native library (``lightrec._native``) or with ``LIGHTREC_TIERED_NATIVE=0``, the torch ops
below run, with the same slots, evictions and state (the tests compare both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lightrec import _switches
from lightrec._native import native_ops

__all__ = ["Admission", "BatchAdmission", "CacheFullError", "CacheIndex", "native_tiered_available"]

_INFO_HEAD = 6  # tiered_admit's info: missed ids, refused table, its need, free, evictable, kept


def native_tiered_available(device: torch.device) -> bool:
    """Whether the native ops serve a cache on ``device`` in this process: its bookkeeping, its row
    copies and the SSD store's read-ahead announcements (``LIGHTREC_TIERED_NATIVE=0``: never)."""
    if device.type != "cpu" or not _switches.TIERED_NATIVE.read():
        return False
    ops = native_ops()
    return ops is not None and ops.tiered


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


@dataclass
class BatchAdmission:
    """What :meth:`CacheIndex.admit_batch` did for one batch.

    Attributes:
        slots: ``[N]`` int64 global slot of each id after the admission (-1: not cached, only
            when a best-effort admission had no room for its row).
        missed_ids: ids whose row was not cached before the admission.
        parts: ``(table, Admission)`` of every table that admitted rows, in table order.
    """

    slots: torch.Tensor
    missed_ids: int
    parts: list[tuple[int, Admission]] = field(default_factory=list)


class CacheIndex:
    """The slot bookkeeping of one tiered kernel (see the module docstring).

    Args:
        rows: ``[T]`` rows of each table.
        cache_rows: ``[T]`` slots of each table's cache.
        algorithm: ``"lru"`` or ``"lfu"``.
        headroom: share of a table's cache an eviction frees at least.
        names: ``[T]`` table names (messages).
        device: where the bookkeeping lives (the cache's device).
        native: run :meth:`admit_batch` and :meth:`release` as native ops (CPU only); None: when
            available (:func:`native_tiered_available`).
    """

    def __init__(
        self,
        rows: Sequence[int],
        cache_rows: Sequence[int],
        algorithm: str,
        headroom: float,
        names: Sequence[str],
        device: torch.device,
        native: bool | None = None,
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
        # per table, a ring of its free global slots over the table's slot range: admission takes
        # from the head without scanning the cache for them (a scan per batch would cost O(cache)
        # on every step), evictions append their victims at the tail. free_state[:, t] = (head
        # offset in the table's range, count); on the CPU whatever the device (read as ints)
        self.free_ring = torch.arange(total_slots, dtype=torch.int64, device=device)
        self.free_state = torch.tensor([[0] * len(self.cache_rows), self.cache_rows], dtype=torch.int64)
        self._row_bounds = [*self.row_offset, total_rows]
        self._cache_bounds = [*self.cache_offset, total_slots]
        self.native = native_tiered_available(device) if native is None else native
        if self.native and not native_tiered_available(device):
            raise ValueError(f"CacheIndex(native=True) needs a CPU cache and lightrec's native ops (device {device})")

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

    def release(self, slots: torch.Tensor, updated: bool) -> None:
        """Unpin ``slots`` (one entry per pin; entries < 0 are skipped), first marking them dirty
        when ``updated``."""
        if self.native:
            torch.ops.lightrec_tiered.tiered_release(self.pins, self.dirty, slots.long().contiguous(), -1, updated)
            return
        slots = slots[slots >= 0]
        if updated:
            self.mark_dirty(slots)
        self.pin(slots, -1)

    def touch_reserved(self, slots: torch.Tensor, tick: int) -> None:
        """The lookup of a batch whose prefetch admitted every row (``slots``, one per id): touch them
        at ``tick`` -- the state admitting the batch again leaves (its slots are dirty already when
        the prefetch was for training)."""
        if self.native:
            torch.ops.lightrec_tiered.tiered_touch(
                self.last_used, self.freq, self.pins, slots.long().contiguous(), tick, self.algorithm == "lfu", 0
            )
            return
        self.touch(slots, tick)

    # ---- one batch -----------------------------------------------------------------------------
    def admit_batch(
        self, global_rows: torch.Tensor, tick: int, best_effort: bool, pin: bool, protect_from: int | None = None
    ) -> BatchAdmission:
        """Admit the uncached rows among ``global_rows`` (``[N]`` int64, one per id), then touch the
        slot of every id at lookup count ``tick`` and, when ``pin`` (a training batch: its backward
        will update them), mark it dirty.

        The batch's cached rows are never evicted for its other rows, nor any slot used at
        ``protect_from`` or later (the batches in flight; see the module docstring; None: only
        this batch's); the missing rows are admitted in increasing row order, per table.

        Args:
            best_effort: admit only as many rows of a table as there is room for (a prefetch; the
                ids left out get slot -1 and are neither touched nor marked) instead of raising.

        Raises:
            CacheFullError: not ``best_effort`` and some table cannot hold the batch's rows at once
                (checked for every table before anything changes).
        """
        protect = tick if protect_from is None else min(protect_from, tick)
        if self.native:
            return self._admit_batch_native(global_rows, tick, protect, best_effort, pin)
        slots = self.slots(global_rows)
        missed = slots < 0
        missed_ids = int(missed.sum())
        parts: list[tuple[int, Admission]] = []
        if missed_ids:
            wanted = torch.unique(global_rows[missed])
            if len(self.rows) == 1:
                wanted_by_table = [(0, wanted)]
            else:
                tables = self.table_of_rows(wanted)
                wanted_by_table = [(t, wanted[tables == t] - self.row_offset[t]) for t in torch.unique(tables).tolist()]
            hits = slots[~missed]
            self.pin(hits)  # (the native op touches a prefetch's hits instead: the same decisions)
            try:
                if not best_effort:
                    for t, rows in wanted_by_table:
                        if rows.numel() > int(self.free_state[1, t]):
                            self.check_room(t, rows.numel(), protect)
                for t, rows in wanted_by_table:
                    admission = self.admit(t, rows, protect, best_effort=best_effort)
                    if admission.rows.numel():
                        parts.append((t, admission))
            finally:
                self.pin(hits, -1)
            slots = self.slots(global_rows)
        slots = slots.long()
        used = slots[slots >= 0] if best_effort and missed_ids else slots
        self.touch(used, tick)
        if pin:
            self.mark_dirty(used)
        return BatchAdmission(slots, missed_ids, parts)

    def _admit_batch_native(
        self, global_rows: torch.Tensor, tick: int, protect: int, best_effort: bool, pin: bool
    ) -> BatchAdmission:
        slots, info_t, fetch_rows, fetch_slots, wb_rows, wb_slots = torch.ops.lightrec_tiered.tiered_admit(
            self.slot_of, self.row_of, self.last_used, self.freq, self.pins, self.dirty, self.free_ring,
            self.free_state, self._row_bounds, self._cache_bounds, global_rows.long().contiguous(), tick, protect,
            self.algorithm == "lfu", float(self.headroom), best_effort, pin,
        )  # fmt: skip
        info = info_t.tolist()
        if info[1] >= 0:
            raise self._cache_full(info[1], info[2], info[3], info[4], info[5])
        tables = len(self.rows)
        fetched, written = info[_INFO_HEAD : _INFO_HEAD + tables], info[_INFO_HEAD + tables :]
        if tables == 1:
            parts = [(0, Admission(fetch_rows, fetch_slots, wb_slots, wb_rows))] if fetched[0] else []
        else:
            by_table = zip(
                fetch_rows.split(fetched), fetch_slots.split(fetched), wb_slots.split(written), wb_rows.split(written),
                strict=True,
            )
            parts = [(t, Admission(*p)) for t, p in enumerate(by_table) if fetched[t]]
        return BatchAdmission(slots, info[0], parts)

    # ---- admission and eviction ---------------------------------------------------------------
    def table_of_rows(self, global_rows: torch.Tensor) -> torch.Tensor:
        """``[n]`` table index of each global row."""
        bounds = torch.tensor(self.row_offset[1:], dtype=torch.int64, device=global_rows.device)
        return torch.bucketize(global_rows, bounds, right=True)

    def kept(self, protect: int, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Bool per slot (every one, ``[sum C]``, or ``slots``'): must it stay put -- pinned, or used
        at ``protect`` or later?"""
        if slots is None:
            return (self.pins > 0) | (self.last_used >= protect)
        return (self.pins.index_select(0, slots) > 0) | (self.last_used.index_select(0, slots) >= protect)

    def room(self, table: int, protect: int) -> tuple[int, int, int]:
        """``(free, evictable, kept)`` slots of ``table``'s cache (:meth:`kept`)."""
        lo, size = self.cache_offset[table], self.cache_rows[table]
        held = self.row_of[lo : lo + size] >= 0
        kept = self.kept(protect)[lo : lo + size]
        return int((~held).sum()), int((held & ~kept).sum()), int((held & kept).sum())

    def check_room(self, table: int, need: int, protect: int) -> None:
        """Raise :class:`CacheFullError` unless ``need`` more rows of ``table`` fit in its cache now."""
        free, evictable, kept = self.room(table, protect)
        if need > free + evictable:
            raise self._cache_full(table, need, free, evictable, kept)

    def _cache_full(self, table: int, need: int, free: int, evictable: int, kept: int) -> CacheFullError:
        return CacheFullError(
            f"table {self.names[table]!r}: a batch needs {need} more of its rows in the cache at once, but its "
            f"cache holds {self.cache_rows[table]} rows of which {free} are free and {evictable} evictable "
            f"({kept} are in use by this batch, by lookups whose backward has not run or by prefetched "
            "batches); raise cache_load_factor (or cache_rows / min_cache_rows)"
        )

    def admit(self, table: int, rows: torch.Tensor, protect: int, best_effort: bool = False) -> Admission:
        """Give slots of ``table`` to ``rows`` (unique table-local rows, none cached), evicting the
        lowest-scored slots not kept (:meth:`kept` at ``protect``) when the free ones do not suffice.

        Args:
            best_effort: admit only as many rows as there is room for (a prefetch) instead of raising.

        Raises:
            CacheFullError: not ``best_effort`` and fewer slots are free or evictable than ``rows``.
        """
        lo, size = self.cache_offset[table], self.cache_rows[table]
        head, count = (int(v) for v in self.free_state[:, table])
        need = rows.numel()
        victims = torch.empty(0, dtype=torch.int64, device=self.device)
        if count < need:
            evictable = (self.row_of[lo : lo + size] >= 0) & ~self.kept(protect)[lo : lo + size]
            available = int(evictable.sum())
            short = need - count
            if available < short:
                if not best_effort:
                    self.check_room(table, need, protect)
                short = available
            k = min(available, max(short, math.ceil(self.headroom * size)))
            if k:
                victims = self._lowest(self._score(lo, size), evictable, k) + lo
                at = (head + count + torch.arange(k, device=self.device)) % size + lo
                self.free_ring.index_copy_(0, at, victims)
                count += k
            need = min(need, count)
        rows = rows[:need]
        slots = self.free_ring.index_select(0, (head + torch.arange(need, device=self.device)) % size + lo)
        self.free_state[0, table], self.free_state[1, table] = (head + need) % size, count - need
        victim_rows = self.row_of.index_select(0, victims)
        dirty = self.dirty.index_select(0, victims)
        # unmap the victims, map the newcomers
        self.slot_of.index_fill_(0, victim_rows + self.row_offset[table], -1)
        self.row_of.index_fill_(0, victims, -1)
        self.slot_of.index_copy_(0, rows + self.row_offset[table], slots.to(self.slot_dtype))
        self.row_of.index_copy_(0, slots, rows)
        for buffer in (self.dirty, self.freq):
            buffer.index_fill_(0, victims, 0)
            buffer.index_fill_(0, slots, 0)
        return Admission(rows, slots, victims[dirty], victim_rows[dirty])

    def evict(self, table: int, k: int, tick: int, protect: int) -> Admission:
        """Evict ahead of need: free at least ``k`` of ``table``'s evictable slots (as many as there
        are; those an admission short of free slots would take, :meth:`kept` at ``protect``). Returns
        an :class:`Admission` without rows: the dirty victims to write back before their slots are
        reused. ``tick``: the lookup count now (the native op's LRU window)."""
        if self.native:
            wb_rows, wb_slots = torch.ops.lightrec_tiered.tiered_evict(
                self.slot_of, self.row_of, self.last_used, self.freq, self.pins, self.dirty, self.free_ring,
                self.free_state, self._row_bounds, self._cache_bounds, table, k, tick, protect, self.algorithm == "lfu",
            )  # fmt: skip
            empty = wb_rows.new_empty(0)
            return Admission(empty, empty, wb_slots, wb_rows)
        lo, size = self.cache_offset[table], self.cache_rows[table]
        head, count = (int(v) for v in self.free_state[:, table])
        evictable = (self.row_of[lo : lo + size] >= 0) & ~self.kept(protect)[lo : lo + size]
        k = min(k, int(evictable.sum()))
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        if not k:
            return Admission(empty, empty, empty, empty)
        victims = self._lowest(self._score(lo, size), evictable, k) + lo
        self.free_ring.index_copy_(0, (head + count + torch.arange(k, device=self.device)) % size + lo, victims)
        self.free_state[1, table] = count + k
        victim_rows = self.row_of.index_select(0, victims)
        dirty = self.dirty.index_select(0, victims)
        self.slot_of.index_fill_(0, victim_rows + self.row_offset[table], -1)
        self.row_of.index_fill_(0, victims, -1)
        for buffer in (self.dirty, self.freq):
            buffer.index_fill_(0, victims, 0)
        return Admission(empty, empty, victims[dirty], victim_rows[dirty])

    def free_slots(self, table: int) -> int:
        """Free slots of ``table``'s cache (on the host: no device sync)."""
        return int(self.free_state[1, table])

    @staticmethod
    def _lowest(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
        """The ``k`` (>= 1, <= eligible count) eligible positions of lowest ``(score, position)``, ascending."""
        masked = score.masked_fill(~eligible, torch.iinfo(torch.int64).max)
        threshold = torch.kthvalue(masked, k).values
        below = torch.nonzero(masked < threshold).flatten()
        ties = torch.nonzero(masked == threshold).flatten()[: k - below.numel()]
        return torch.sort(torch.cat([below, ties])).values

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
        torch.arange(self.free_ring.numel(), out=self.free_ring)
        self.free_state[0].zero_()
        self.free_state[1].copy_(torch.tensor(self.cache_rows, dtype=torch.int64))
        for buffer in (self.last_used, self.freq, self.pins, self.dirty):
            buffer.zero_()
