"""Slot bookkeeping of ``MCHManagedCollisionModule``: buckets, who gets a row, who loses one.

The module keeps its state slot-ordered (``ops``: ``slot_ids[s]`` is the raw id in slot ``s``);
the functions here decide, vectorised over ids and looping only over *buckets* (a handful), which
new ids get rows when rows run short and which residents lose theirs at a round. Every decision
depends only on the ids of a bucket, their slots, counts and the iteration -- never on the order
ids arrived in -- so a table split over ranks (whole buckets per rank) decides exactly as the
unsharded table does.

Priority of new ids within a bucket when rows run short: more lookups in the step first, then
smaller id. Ranking at a round (per bucket): higher policy score first, residents before waiting
ids on ties, then smaller slot (residents) or smaller id (waiting ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BucketLayout", "RoundCut", "priority_order", "round_cut"]


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


def priority_order(counts: torch.Tensor) -> torch.Tensor:
    """Order of new ids of one bucket (given ascending by id): more lookups first, then id.

    Args:
        counts: ``[n]`` lookups of each id in this step.

    Returns:
        ``[n]`` permutation.
    """
    return torch.sort(counts, descending=True, stable=True).indices


@dataclass
class RoundCut:
    """What a round decides for one bucket (indices into the bucket's entries: residents ``[0, R)``
    in slot order, then waiting ids ``[R, R + W)`` in id order).

    Attributes:
        dropped: ``[d]`` entries that lose (residents) or do not get (waiting ids) a row.
        victims: ``[v]`` residents that keep their row but rank lowest, lowest first: the rows new
            ids may take before the next round.
    """

    dropped: torch.Tensor
    victims: torch.Tensor


def round_cut(scores: torch.Tensor, residents: int, capacity: int, forced: int, budget: int) -> RoundCut:
    """Rank one bucket's entries and cut: the lowest ones go, the next lowest residents are victims.

    Only the lowest entries are ordered (a ``kthvalue`` threshold, then a sort of those below it),
    so a round over a full table costs ``O(Z)`` plus a sort of about ``budget`` entries.

    Args:
        scores: ``[R + W]`` policy score of each entry (residents first, in slot order; then waiting
            ids in id order); ``-inf`` for residents that must go (expired).
        residents: ``R``.
        capacity: rows of the bucket ids may hold.
        forced: number of ``-inf`` residents (they go even when rows are left).
        budget: victims to queue.

    Returns:
        The cut (see ``RoundCut``).
    """
    n = scores.numel()
    waiting = n - residents
    drop = max(n - capacity, forced, 0)
    k = min(n, drop + budget + waiting)
    if k == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=scores.device)
        return RoundCut(empty, empty)
    if k < n:  # the k lowest, with every entry tied with the k-th
        threshold = torch.kthvalue(scores, k).values
        low = torch.nonzero(scores <= threshold).flatten()
    else:
        low = torch.arange(n, device=scores.device)
    # worst first: score ascending; ties: waiting ids before residents, larger id / slot first
    # (the reverse of the ranking), which the flipped entry order gives a stable sort
    low = low.flip(0)
    worst = low.index_select(0, torch.sort(scores.index_select(0, low), stable=True).indices)
    rest = worst[drop:]
    victims = rest[rest < residents][:budget]
    return RoundCut(worst[:drop], victims)
