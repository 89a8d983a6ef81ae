"""The training step and the eviction rounds of ``MCHManagedCollisionModule`` (a mixin of it).

A step on ids ``[N]`` of one table::

    1. look every id up (SlotIndex.lookup: one searchsorted, verified against the slot state)
    2. ids without a row take at once, per bucket, the next rows of the bucket's queue -- free rows,
       then residents that ranked lowest at the last round and were not seen since; when the queue
       runs dry the ids with more lookups in the step go first, the others wait in the default row
    3. every eviction_interval steps, a round per bucket: the policy ranks residents and waiting
       ids; the lowest are evicted (or keep waiting), waiting ids that made the cut get free rows,
       the next-lowest residents form the new victim queue

Everything is vectorised over ids; Python loops run over buckets (a handful) only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec.modules.managed_collision.mch_eviction import MCHEvictionPolicy
from lightrec.modules.managed_collision.mch_index import SlotIndex
from lightrec.modules.managed_collision.mch_native import native_lookup_insert, native_step_available
from lightrec.modules.managed_collision.mch_slots import BucketLayout, priority_order, round_cut
from lightrec.modules.managed_collision.ops import EMPTY_ID, block_bucket, mix64

__all__ = ["MCHSteps", "StepStats"]


@dataclass
class StepStats:
    """Counters since the module was built (``mc_stats``)."""

    lookups: int = 0
    default_lookups: int = 0
    inserted: int = 0
    evicted: int = 0
    rounds: int = 0


class MCHSteps:
    """The step and round of ``MCHManagedCollisionModule``; every attribute below is the module's."""

    _layout: BucketLayout
    _index: SlotIndex
    _eviction_policy: MCHEvictionPolicy
    _eviction_interval: int
    _immediate_fraction: float
    _admission_threshold: int
    _input_hash_size: int
    _buckets: int
    _output_global_offset: int
    _current_iter: int
    _history: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    _pending_evictions: list[torch.Tensor]
    _stats: StepStats
    _mch_sorted_raw_ids: torch.Tensor
    _mch_last_access_iter: torch.Tensor
    _current_iter_tensor: torch.Tensor
    _default_slots: torch.Tensor
    _mch_victim_rank: torch.Tensor
    _mch_admission_counts: torch.Tensor  # only with admission_threshold > 1

    _buffers: dict[str, torch.Tensor | None]  # nn.Module's

    def _counts(self) -> torch.Tensor | None:
        return self._buffers.get("_mch_counts")  # (not getattr: a missing buffer raises inside nn.Module)

    def _local_bucket(self, values: torch.Tensor) -> torch.Tensor:
        if self._layout.num_local == 1:
            return torch.zeros_like(values)
        buckets = block_bucket(values, self._input_hash_size, self._buckets)
        return (buckets - self._layout.start_bucket).clamp_(0, self._layout.num_local - 1)

    def _last_round(self, it: int) -> int:
        return it - it % self._eviction_interval

    def _ensure_index(self) -> SlotIndex:
        """The slot index, (re)built when it is not on the state's device (first use, ``.to()``)."""
        if self._index.device != self._mch_sorted_raw_ids.device:
            self._index.rebuild(self._mch_sorted_raw_ids, self._mch_victim_rank, self._last_round(self._current_iter))
        return self._index

    def _default_of(self, values: torch.Tensor) -> torch.Tensor | int:
        """The default row of each id's bucket (a plain int with one local bucket: no tensor built)."""
        if self._layout.num_local == 1:
            return self._layout.default_slot(0)
        return self._default_slots.index_select(0, self._local_bucket(values))

    @torch.no_grad()
    def _frozen(self, values: torch.Tensor) -> torch.Tensor:
        slots, hit = self._ensure_index().lookup(self._mch_sorted_raw_ids, values)
        return torch.where(hit, slots, self._default_of(values)) + self._output_global_offset

    def _train_step(self, values: torch.Tensor) -> torch.Tensor:
        it = self._current_iter = self._current_iter + 1
        n = values.numel()
        if n and values.device.type == "cpu" and native_step_available(self._mch_sorted_raw_ids.device):
            local = self._native_lookup_and_insert(values, it)  # (no autograd in it: no no_grad context)
            self._current_iter_tensor.fill_(it)
            if it % self._eviction_interval:
                self._stats.lookups += n
                return local + self._output_global_offset if self._output_global_offset else local
        else:
            local = None
        with torch.no_grad():
            return self._torch_step_and_round(values, local, it)

    def _torch_step_and_round(self, values: torch.Tensor, local: torch.Tensor | None, it: int) -> torch.Tensor:
        """The rest of a step: the torch-op lookup-and-insert (unless ``local`` is already known) and
        the round every ``eviction_interval`` steps."""
        self._current_iter_tensor.fill_(it)
        n = values.numel()
        if local is None:
            local = self._lookup_and_insert(values, self._default_of(values), it) if n else values.clone()
        if it % self._eviction_interval == 0:  # on a fixed schedule: a resumed run keeps it
            self._round(it)
            if n:  # the round moved ids: look them up again
                slots, hit = self._index.lookup(self._mch_sorted_raw_ids, values)
                local = torch.where(hit, slots, self._default_of(values))
                self._stats.default_lookups += n - int(hit.sum())
        self._stats.lookups += n
        return local + self._output_global_offset if self._output_global_offset else local

    def _lookup_and_insert(self, values: torch.Tensor, default: torch.Tensor | int, it: int) -> torch.Tensor:
        slots, hit = self._ensure_index().lookup(self._mch_sorted_raw_ids, values)
        local = torch.where(hit, slots, default)
        self._mch_last_access_iter.index_fill_(0, local, it)  # default rows too: they are never victims
        counts = self._counts()
        if counts is not None:
            counts.index_add_(0, local, hit.to(torch.int64))
        missed = torch.nonzero(~hit).flatten()
        if missed.numel() == 0:
            return local
        uniq, inverse, cnt = torch.unique(values.index_select(0, missed), return_inverse=True, return_counts=True)
        got, all_placed = self._insert(uniq, cnt, it)
        got = got.index_select(0, inverse)
        if not all_placed:
            placed = got >= 0
            if it % self._eviction_interval:  # (a round follows otherwise, and counts them itself)
                self._stats.default_lookups += missed.numel() - int(placed.sum())
            got = torch.where(placed, got, default if isinstance(default, int) else default.index_select(0, missed))
        return local.index_copy_(0, missed, got)

    def _native_lookup_and_insert(self, values: torch.Tensor, it: int) -> torch.Tensor:
        """``_lookup_and_insert`` as one native op (``mch_native``): the same decisions."""
        block = -(-self._input_hash_size // self._buckets)
        state = (self._mch_sorted_raw_ids, self._mch_last_access_iter, self._counts(),
                 self._buffers.get("_mch_admission_counts"))  # fmt: skip
        done = native_lookup_insert(values.contiguous(), self._ensure_index(), self._layout, state,
                                    (self._buckets, block), it, self._admission_threshold)  # fmt: skip
        if done.evicted.numel():
            self._pending_evictions.append(done.evicted)
            self._stats.evicted += done.evicted.numel()
        if done.waiting_ids.numel():
            self._history.append((done.waiting_ids, done.waiting_counts, torch.full_like(done.waiting_ids, it)))
        self._stats.inserted += done.inserted
        if it % self._eviction_interval:  # (a round follows otherwise, and counts them itself)
            self._stats.default_lookups += done.unplaced
        return done.rows

    def _insert(self, uniq: torch.Tensor, cnt: torch.Tensor, it: int) -> tuple[torch.Tensor, bool]:
        """Rows for new ids ``uniq`` (ascending) seen ``cnt`` times: ``([U] local slot or -1, all placed)``."""
        index, nb = self._index, self._layout.num_local
        cand: torch.Tensor | None = None  # None: every new id, in id order
        if self._admission_threshold > 1:
            sketch = self._sketch_index(uniq)
            self._mch_admission_counts.index_add_(0, sketch, cnt)
            cand = torch.nonzero(self._mch_admission_counts.index_select(0, sketch) >= self._admission_threshold)
            cand = cand.flatten()
            if cand.numel() == 0:
                return torch.full_like(uniq, -1), False
        ids = uniq if cand is None else uniq.index_select(0, cand)
        # ids ascending are grouped by bucket (buckets are blocks of the id space)
        per_bucket = [ids.numel()] if nb == 1 else torch.bincount(self._local_bucket(ids), minlength=nb).tolist()
        slots, victims, parts = [], [], []  # parts: (first position in `ids`, ids of the bucket, rows got)
        start = 0
        for b, n in enumerate(per_bucket):
            if n:
                free, evict = index.take(b, n, self._mch_last_access_iter)
                slots += [free, evict]
                if evict.numel():
                    victims.append(evict)
                parts.append((start, n, free.numel() + evict.numel()))
                start += n
        slot = torch.cat(slots)
        if victims:  # their ids leave; the rows are overwritten just below and reset before the lookup
            evicted = victims[0] if len(victims) == 1 else torch.cat(victims)
            self._pending_evictions.append(evicted)
            self._stats.evicted += evicted.numel()
        shortage = any(got < n for _, n, got in parts)
        placed = None  # None: every id of `ids` got a row, in id order; else their positions in slot order
        if shortage or cand is not None:
            who, waiting = [], []
            for first, n, got in parts:
                mine = torch.arange(first, first + n, device=uniq.device)
                if got < n:  # rows ran short: the ids with more lookups in the step go first
                    of_uniq = mine if cand is None else cand.index_select(0, mine)
                    mine = mine.index_select(0, priority_order(cnt.index_select(0, of_uniq)))
                    waiting.append(mine[got:])
                    mine = mine[:got]
                who.append(mine)
            placed = torch.cat(who)
            if waiting:
                wait = torch.cat(waiting)
                self._add_waiting(uniq, cnt, wait if cand is None else cand.index_select(0, wait), it)
        placed_ids = ids if placed is None else ids.index_select(0, placed)
        placed_cnt = cnt if cand is None else cnt.index_select(0, cand)
        self._occupy(slot, placed_ids, placed_cnt if placed is None else placed_cnt.index_select(0, placed), it)
        if placed is None:
            index.insert(placed_ids, slot)
            return slot, True
        by_id = torch.sort(placed_ids)
        index.insert(by_id.values, slot.index_select(0, by_id.indices))
        positions = placed if cand is None else cand.index_select(0, placed)
        # ids not admitted yet (cand) are not placed either: they go to the default row
        all_placed = not shortage and (cand is None or cand.numel() == uniq.numel())
        return torch.full_like(uniq, -1).index_copy_(0, positions, slot), all_placed

    def _sketch_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Admission counter of each id: a hashed slot inside its bucket's segment (so that the
        counters shard and reshard with the rows)."""
        bounds = torch.tensor(self._layout.bounds, dtype=torch.int64, device=ids.device)
        b = self._local_bucket(ids)
        lo = bounds.index_select(0, b)
        return lo + torch.remainder(mix64(ids), bounds.index_select(0, b + 1) - lo)

    def _add_waiting(self, uniq: torch.Tensor, cnt: torch.Tensor, which: torch.Tensor, it: int) -> None:
        self._history.append((uniq.index_select(0, which), cnt.index_select(0, which), torch.full_like(which, it)))

    def _occupy(self, slots: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, last: torch.Tensor | int) -> None:
        self._mch_sorted_raw_ids.index_copy_(0, slots, ids)
        if isinstance(last, int):
            self._mch_last_access_iter.index_fill_(0, slots, last)
        else:
            self._mch_last_access_iter.index_copy_(0, slots, last)
        slot_counts = self._counts()
        if slot_counts is not None:
            slot_counts.index_copy_(0, slots, counts)
        self._stats.inserted += slots.numel()

    # ---- eviction rounds -----------------------------------------------------------------------
    def _round(self, it: int) -> None:
        layout, policy = self._layout, self._eviction_policy
        slot_ids, last_seen, counts = self._mch_sorted_raw_ids, self._mch_last_access_iter, self._counts()
        index = self._ensure_index()
        w_ids, w_cnt, w_last = self._waiting_ids(it)
        w_bucket = torch.bincount(self._local_bucket(w_ids), minlength=layout.num_local).tolist() if w_ids.numel() \
            else [0] * layout.num_local  # fmt: skip
        queues, free_len, admitted = [], [], []
        w_start = 0
        for b in range(layout.num_local):
            lo, default = layout.bounds[b], layout.default_slot(b)
            res = torch.nonzero(slot_ids[lo:default] != EMPTY_ID).flatten().add_(lo)
            r_last = last_seen.index_select(0, res)
            r_score = policy.scores(counts.index_select(0, res) if counts is not None else torch.zeros_like(res),
                                    r_last, it)  # fmt: skip
            expired = policy.expired(r_last, it)
            forced = 0
            if expired is not None:
                r_score = r_score.masked_fill(expired, -float("inf"))
                forced = int(expired.sum())
            w = slice(w_start, w_start + w_bucket[b])
            w_start += w_bucket[b]
            scores = torch.cat([r_score, policy.scores(w_cnt[w], w_last[w], it)]) if w_bucket[b] else r_score
            budget = int(self._immediate_fraction * layout.capacity(b))
            cut = round_cut(scores, res.numel(), layout.capacity(b), forced, budget)
            dropped = cut.dropped
            self._release(res.index_select(0, dropped[dropped < res.numel()]))
            keep = torch.ones(w_bucket[b], dtype=torch.bool, device=res.device)
            keep[dropped[dropped >= res.numel()] - res.numel()] = False
            free = torch.nonzero(slot_ids[lo:default] == EMPTY_ID).flatten().add_(lo)
            chosen = torch.nonzero(keep).flatten()  # waiting ids that made the cut, in id order
            if chosen.numel():
                got = free[: chosen.numel()]
                admitted.append((w_ids[w].index_select(0, chosen), got))
                self._occupy(got, w_ids[w].index_select(0, chosen), w_cnt[w].index_select(0, chosen),
                             w_last[w].index_select(0, chosen))  # fmt: skip
                free = free[chosen.numel() :]
            queues.append(torch.cat([free, res.index_select(0, cut.victims)]))
            free_len.append(free.numel())
        index.compact(slot_ids)
        for ids, slots in admitted:
            index.insert(ids, slots)
        index.set_queues(queues, free_len, it)
        self._history = []
        self._stats.rounds += 1

    def _waiting_ids(self, it: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids, counts, last seen)`` of the ids that waited since the last round, still without a row
        (ids ascending; the round of iteration ``it`` filters them)."""
        empty = torch.zeros(0, dtype=torch.int64, device=self._mch_sorted_raw_ids.device)
        if not self._history:
            return empty, empty, empty
        ids = torch.cat([h[0] for h in self._history])
        uniq, inverse = torch.unique(ids, return_inverse=True)
        cnt = torch.zeros_like(uniq).index_add_(0, inverse, torch.cat([h[1] for h in self._history]))
        last = torch.zeros_like(uniq).scatter_reduce_(0, inverse, torch.cat([h[2] for h in self._history]), "amax")
        _, resident = self._index.lookup(self._mch_sorted_raw_ids, uniq)
        keep = ~resident
        uniq, cnt, last = uniq[keep], cnt[keep], last[keep]
        kept = self._filter_per_bucket(uniq, cnt, it)
        if kept is not None:
            uniq, cnt, last = uniq[kept], cnt[kept], last[kept]
        return uniq, cnt, last

    def _filter_per_bucket(self, ids: torch.Tensor, cnt: torch.Tensor, it: int) -> torch.Tensor | None:
        """Keep-mask of the policy's threshold filter over waiting ``ids`` (ascending) seen ``cnt``
        times at the round of iteration ``it`` (None: no filter), applied to each bucket's ids on their own.

        A filter's threshold depends on the counts it is given (the mean count, for the ready-made
        ones): given every local bucket's ids at once, a shard holding some of the buckets would
        keep other ids than the whole table does. The ids and the iteration go along (see
        ``threshold_filter_context``) so that a random filter draws per id, not per call.
        """
        if self._layout.num_local == 1:
            return self._eviction_policy.filter_candidates(cnt, ids, it)
        sizes = torch.bincount(self._local_bucket(ids), minlength=self._layout.num_local).tolist()
        masks: list[torch.Tensor] = []
        for part, part_ids in zip(cnt.split(sizes), ids.split(sizes)):  # ids ascending: buckets are contiguous
            if part.numel() == 0:
                continue
            mask = self._eviction_policy.filter_candidates(part, part_ids, it)
            if mask is None:
                return None
            masks.append(mask)
        return torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool, device=ids.device)

    def _release(self, slots: torch.Tensor) -> None:
        """Evict the ids of ``slots`` (their rows are reset before the next lookup)."""
        if slots.numel() == 0:
            return
        self._mch_sorted_raw_ids.index_fill_(0, slots, EMPTY_ID)
        self._mch_last_access_iter.index_fill_(0, slots, 0)
        counts = self._counts()
        if counts is not None:
            counts.index_fill_(0, slots, 0)
        self._pending_evictions.append(slots)
        self._stats.evicted += slots.numel()
