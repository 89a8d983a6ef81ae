"""Slot bookkeeping of ``MCHManagedCollisionModule``: giving rows to new ids, and eviction rounds.

The module keeps its state slot-ordered (``mc_ops``: ``slot_ids[s]`` is the raw id in slot ``s``);
the functions here decide, vectorised over ids and looping only over *buckets* (a handful), which
slot each new id gets and which resident loses its slot. Every decision depends only on the ids of
a bucket, their counts and the iteration -- never on the order ids arrived in -- so a table split
over ranks (whole buckets per rank) decides exactly as the unsharded table does.

Priority of new ids within a bucket: more lookups in the step first, then smaller id.
Ranking at a round (per bucket): higher policy score first, residents before waiting ids on ties,
then smaller id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec.modules.mc_ops import EMPTY_ID

__all__ = ["BucketLayout", "priority_order", "round_order", "take_free_slots", "take_victims"]


@dataclass
class BucketLayout:
    """The local buckets of a module: slot segments and default rows (local slot numbers).

    Attributes:
        bounds: ``[b + 1]`` local slot offsets of the ``b`` local bucket segments.
        start_bucket: global index of the first local bucket.
        total_buckets: buckets of the whole table.
    """

    bounds: list[int]
    start_bucket: int
    total_buckets: int

    @property
    def num_local(self) -> int:
        return len(self.bounds) - 1

    def default_slot(self, b: int) -> int:
        """The default row of local bucket ``b`` (its segment's last slot)."""
        return self.bounds[b + 1] - 1

    def capacity(self, b: int) -> int:
        """Slots an id may hold in local bucket ``b`` (the segment minus its default row)."""
        return self.bounds[b + 1] - self.bounds[b] - 1

    def default_slots(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([self.default_slot(b) for b in range(self.num_local)], dtype=torch.int64, device=device)

    def bucket_of_slot(self, slots: torch.Tensor) -> torch.Tensor:
        """``[n]`` local bucket of local slots."""
        if self.num_local == 1:
            return torch.zeros_like(slots)
        inner = torch.tensor(self.bounds[1:-1], dtype=torch.int64, device=slots.device)
        return torch.searchsorted(inner, slots, right=True)


def take_victims(
    victim_rank: torch.Tensor,
    slot_ids: torch.Tensor,
    last_seen: torch.Tensor,
    round_iter: int,
    layout: BucketLayout,
    b: int,
    n: int,
) -> torch.Tensor:
    """Up to ``n`` rows of local bucket ``b`` that new ids may take now, lowest-ranked first.

    ``victim_rank[s]`` is the rank of slot ``s`` among the residents of its bucket that ranked
    lowest at the last round (the module's ``immediate_eviction_fraction`` of the bucket), -1 for
    the others. A victim looked up after the round (``last_seen > round_iter``) keeps its row. Every
    victim looked at is struck off (``-1``), taken or not.
    """
    lo, default = layout.bounds[b], layout.default_slot(b)
    if n <= 0:
        return torch.zeros(0, dtype=torch.int64, device=slot_ids.device)
    ranks = victim_rank[lo:default]
    queued = torch.nonzero(ranks >= 0).flatten()
    if queued.numel() == 0:
        return queued
    queue = queued.index_select(0, torch.sort(ranks.index_select(0, queued)).indices) + lo
    valid = (slot_ids.index_select(0, queue) != EMPTY_ID) & (last_seen.index_select(0, queue) <= round_iter)
    picked = torch.nonzero(valid).flatten()[:n]
    looked = queue.numel() if picked.numel() < n else int(picked[-1]) + 1
    victim_rank[queue[:looked]] = -1
    return queue.index_select(0, picked)


def priority_order(counts: torch.Tensor, buckets: torch.Tensor | None) -> torch.Tensor:
    """Order of new ids (given ascending by id): by bucket, then more lookups first, then id.

    Args:
        counts: ``[n]`` lookups of each id in this step.
        buckets: ``[n]`` local bucket of each id, or None for a single bucket.

    Returns:
        ``[n]`` permutation.
    """
    order = torch.sort(-counts, stable=True).indices
    if buckets is not None:
        order = order.index_select(0, torch.sort(buckets.index_select(0, order), stable=True).indices)
    return order


def round_order(
    buckets: torch.Tensor, scores: torch.Tensor, waiting: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Order of a round's entries: bucket ascending, score descending, residents first, id ascending.

    Args:
        buckets, scores, waiting, ids: ``[n]`` per entry (``waiting``: 1 for an id without a row).

    Returns:
        ``[n]`` permutation.
    """
    order = torch.sort(ids, stable=True).indices
    for key in (waiting, -scores, buckets):
        order = order.index_select(0, torch.sort(key.index_select(0, order), stable=True).indices)
    return order


def take_free_slots(slot_ids: torch.Tensor, layout: BucketLayout, b: int, n: int) -> torch.Tensor:
    """The first ``n`` (or fewer) free slots of local bucket ``b``, ascending."""
    lo, default = layout.bounds[b], layout.default_slot(b)
    if n <= 0:
        return torch.zeros(0, dtype=torch.int64, device=slot_ids.device)
    free = torch.nonzero(slot_ids[lo:default] == EMPTY_ID).flatten()[:n]
    return free + lo
