"""``SlotIndex``: what ``MCHManagedCollisionModule`` derives from its slot-ordered state to be fast.

The saved state is ``slot_ids [Z]`` (the raw id in each slot, ``EMPTY_ID`` when free); a training
step must find ids, hand out rows and evict low-ranked residents without touching all ``Z`` slots.
The index keeps:

* a **sorted index** ``(ids, slots)`` of the resident ids. A lookup is one ``searchsorted`` whose
  candidate is *verified* against ``slot_ids`` -- so an evicted id's stale entry simply stops
  matching and an eviction costs no index update. A new id is merged in after any stale entry of
  the same id (a lookup takes the last entry of an id: the newest); rounds drop stale entries.
  (A separate small index of the new ids would spare the merge's vector passes over the index,
  but costs more tensor operations per lookup, and on CPU the number of operations dominates.)
* per bucket, a **queue of rows to hand out**: the free slots (ascending), then the victims (the
  residents that ranked lowest at the last round, lowest first), consumed from a cursor. A victim
  looked up after the round keeps its row: it is skipped.
* for the native CPU step (``mch_native``) only: a **hash table** ``id -> slot`` (open addressing,
  verified against ``slot_ids`` like the sorted index: a hit touches one random cache line where a
  binary search touches a dozen), and the entries that step placed since the last fold into the
  sorted index (``pending``: merging them at every step would copy the whole index each time; they
  are folded in when a torch-op path reads the sorted index -- a round, a frozen lookup).

A step therefore costs ``O(N log Z)`` for ``N`` ids plus a few vector passes over the index when
new ids are merged in, and a round ``O(Z)`` plus a sort of its lowest-ranked entries, once per
``eviction_interval`` steps. The queues are written back to the per-slot
``victim_rank`` buffer (``write_victim_ranks``) whenever the state is read, so they are saved and
resharded with the rows.
"""

from __future__ import annotations

import torch

from lightrec.modules.managed_collision.mch_slots import BucketLayout
from lightrec.modules.managed_collision.ops import EMPTY_ID

__all__ = ["SlotIndex"]


def _empty(device: torch.device) -> torch.Tensor:
    return torch.zeros(0, dtype=torch.int64, device=device)


class SlotIndex:
    """The derived structures of one module's slots (see the module docstring).

    Args:
        layout: the module's local buckets.
    """

    def __init__(self, layout: BucketLayout) -> None:
        self.layout = layout
        self.device = torch.device("meta")
        self.ids = self.slots = _empty(self.device)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids ascending, slots) not in ids/slots yet
        self.hash: torch.Tensor | None = None  # [H, 2] (id, slot) of the native step (CPU), EMPTY_ID: free
        self.hash_ok = False  # the hash holds every resident id's slot
        self.hash_count = 0  # used entries of the hash
        self.queues: list[torch.Tensor] = []
        self.queue_flat = _empty(self.device)  # the queues one after the other (``queues`` are views of it)
        self.queue_starts: list[int] = [0]
        self.free_len: list[int] = []
        self.cursor: list[int] = []
        self.round_iter = 0

    # ---- building ------------------------------------------------------------------------------
    def rebuild(self, slot_ids: torch.Tensor, victim_rank: torch.Tensor, round_iter: int) -> None:
        """Everything from the state: the index of the residents, the free slots, the victim queues.

        Args:
            slot_ids: ``[Z]`` id of each slot.
            victim_rank: ``[Z]`` rank of each slot in its bucket's victim queue (-1: not queued).
            round_iter: iteration of the last round (victims seen after it keep their rows).
        """
        self.device = slot_ids.device
        self.pending, self.hash, self.hash_ok = [], None, False  # (the native step builds a new hash)
        occupied = torch.nonzero(slot_ids != EMPTY_ID).flatten()
        self.ids, order = torch.sort(slot_ids.index_select(0, occupied))
        self.slots = occupied.index_select(0, order)
        queues, free_len = [], []
        for b in range(self.layout.num_local):
            lo, default = self.layout.bounds[b], self.layout.default_slot(b)
            free = torch.nonzero(slot_ids[lo:default] == EMPTY_ID).flatten() + lo
            ranks = victim_rank[lo:default]
            queued = torch.nonzero(ranks >= 0).flatten()
            victims = queued.index_select(0, torch.sort(ranks.index_select(0, queued)).indices) + lo
            queues.append(torch.cat([free, victims]))
            free_len.append(free.numel())
        self.set_queues(queues, free_len, round_iter)

    def set_queues(self, queues: list[torch.Tensor], free_len: list[int], round_iter: int) -> None:
        """New hand-out queues, one per local bucket: ``free_len[b]`` free slots, then victims."""
        self.queue_flat = torch.cat(queues) if queues else _empty(self.device)
        self.queue_starts = [0]
        for queue in queues:
            self.queue_starts.append(self.queue_starts[-1] + queue.numel())
        self.queues = [self.queue_flat[a:b] for a, b in zip(self.queue_starts[:-1], self.queue_starts[1:])]
        self.free_len, self.cursor = list(free_len), [0] * len(queues)
        self.round_iter = round_iter

    def compact(self, slot_ids: torch.Tensor) -> None:
        """Drop the entries of ids that left their slot (the index stays sorted)."""
        self.fold()
        live = torch.nonzero(slot_ids.index_select(0, self.slots) == self.ids).flatten()
        self.ids, self.slots = self.ids.index_select(0, live), self.slots.index_select(0, live)

    def write_victim_ranks(self, victim_rank: torch.Tensor, last_seen: torch.Tensor) -> None:
        """Store the queues' victims still to come (not looked up since the round) as ranks in the
        per-slot buffer, the state that is saved."""
        victim_rank.fill_(-1)
        for queue, cursor, free in zip(self.queues, self.cursor, self.free_len):
            rest = queue[max(cursor, free) :]
            rest = rest[last_seen.index_select(0, rest) <= self.round_iter]
            victim_rank[rest] = torch.arange(rest.numel(), device=rest.device)

    # ---- lookups -------------------------------------------------------------------------------
    def lookup(self, slot_ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slot [N], hit [N])``: each id's slot (the newest entry of the id), verified against ``slot_ids``."""
        self.fold()
        if self.ids.numel() == 0:
            return torch.zeros_like(values), torch.zeros_like(values, dtype=torch.bool)
        pos = torch.searchsorted(self.ids, values, right=True).sub_(1).clamp_(min=0)
        slot = self.slots.index_select(0, pos)
        return slot, slot_ids.index_select(0, slot) == values

    def insert(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Merge ids just placed in ``slots`` (``ids`` ascending) into the index, each after any stale
        entry of the same id."""
        self.fold()
        self._merge(ids, slots)
        self.hash_ok = False  # (placed outside the native step: rebuilt at its next call)

    def fold(self) -> None:
        """Merge the native step's ``pending`` entries into the sorted index (in the order they were
        placed: a later entry of an id goes after an earlier one)."""
        if not self.pending:
            return
        ids = torch.cat([p[0] for p in self.pending])
        slots = torch.cat([p[1] for p in self.pending])
        self.pending = []
        if ids.numel():
            by_id = torch.sort(ids, stable=True)
            self._merge(by_id.values, slots.index_select(0, by_id.indices))

    def entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The sorted index ``(ids, slots)`` with every pending entry in it."""
        self.fold()
        return self.ids, self.slots

    def _merge(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        if ids.numel() == 0:
            return
        dest = torch.searchsorted(self.ids, ids, right=True).add_(torch.arange(ids.numel(), device=ids.device))
        total = self.ids.numel() + ids.numel()
        old = torch.ones(total, dtype=torch.bool, device=ids.device).index_fill_(0, dest, False)
        merged_ids = torch.empty(total, dtype=torch.int64, device=ids.device).index_copy_(0, dest, ids)
        merged_slots = torch.empty(total, dtype=torch.int64, device=ids.device).index_copy_(0, dest, slots)
        self.ids = merged_ids.masked_scatter_(old, self.ids)
        self.slots = merged_slots.masked_scatter_(old, self.slots)

    # ---- handing out rows ----------------------------------------------------------------------
    def free_count(self, b: int) -> int:
        return max(self.free_len[b] - self.cursor[b], 0)

    def total_free(self) -> int:
        return sum(self.free_count(b) for b in range(len(self.queues)))

    def take(self, b: int, n: int, last_seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``n`` rows of local bucket ``b`` for new ids: ``(free slots, victim slots)``.

        Free slots come first; then victims not looked up since the round (``last_seen <=
        round_iter``), lowest-ranked first. Every queue entry looked at is used up.
        """
        queue, cursor, free_end = self.queues[b], self.cursor[b], self.free_len[b]
        if cursor + n <= free_end:  # the common case while the table fills: a slice
            self.cursor[b] = cursor + n
            return queue[cursor : cursor + n], queue[:0]
        free = queue[cursor:free_end]
        start = max(cursor, free_end)
        need, window = n - free.numel(), 2 * (n - free.numel()) + 16
        while True:
            part = queue[start : start + window]
            picked = torch.nonzero(last_seen.index_select(0, part) <= self.round_iter).flatten()[:need]
            if picked.numel() == need or start + window >= queue.numel():
                break
            window *= 4
        self.cursor[b] = start + (int(picked[-1]) + 1 if picked.numel() == need else part.numel())
        return free, part.index_select(0, picked)
