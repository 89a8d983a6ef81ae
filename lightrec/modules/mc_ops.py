"""Tensor operations of managed-collision tables: id lookup, bucket routing, hashing, row re-init.

Everything here is vectorised over ids (no Python loop per id) and written in plain torch ops, so
the same code runs on CPU and GPU, and the lookup half (:func:`lookup_sorted`, :func:`block_bucket`,
:func:`mix64`) compiles under TorchScript for the frozen serving remapper.

A managed-collision table gives each raw id its own *slot* (a row of the embedding table). Its
state is kept **slot-ordered** -- ``slot_ids[s]`` is the raw id living in slot ``s`` (``EMPTY_ID``
when the slot is free) -- plus a search index over it::

    slot_ids      [zch]   raw id per slot            e.g. [ 91, EMPTY, 7, EMPTY(default row) ]
    sorted_ids    [zch]   slot_ids sorted ascending       [  7,  91, EMPTY, EMPTY ]
    sorted_slots  [zch]   the slot of each sorted id      [  2,   0,   1,     3   ]

A lookup is one ``searchsorted`` of the ids into ``sorted_ids``. Empty slots hold ``EMPTY_ID`` =
``2**63 - 1``, which sorts last and is never a valid id (ids are below ``input_hash_size <= 2**63 - 1``).

Buckets: a table's slots are split into ``B`` contiguous *segments* and a raw id may only live in
the segment of its bucket (``block_bucket``: ``id // ceil(input_hash_size / B)``, torchrec's rule).
Buckets are independent sub-tables, so a row-wise sharded table (whole buckets per rank) makes
exactly the decisions of the unsharded one, and resharding moves whole buckets: every id keeps its
slot. The last slot of every segment is that bucket's *default row*, where ids without a slot go.
"""

from __future__ import annotations

import torch

__all__ = [
    "EMPTY_ID",
    "block_bucket",
    "bucket_segments",
    "hashed_uniform",
    "lookup_sorted",
    "index_positions_of_free",
    "mix64",
    "mix64_hash",
    "rank_within_groups",
    "replace_in_index",
    "sort_slots",
]

EMPTY_ID = 2**63 - 1
"""Raw id of a free slot (``torch.iinfo(torch.int64).max``, torchrec's marker too)."""

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors: a well-mixed 64-bit hash (two's-complement wrapping
    arithmetic, as torch's integer kernels do on every backend; ``tests/modules/test_mc_ops.py``
    checks it against Python's unbounded integers).

    Args:
        x: int64 tensor of any shape.

    Returns:
        int64 tensor of the same shape (all 64 bits mixed; may be negative).
    """
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def hashed_uniform(bits: torch.Tensor) -> torch.Tensor:
    """Uniform float64 values in ``[0, 1)`` from 64-bit hashes (their top 53 bits)."""
    return _shr(bits, 11).to(torch.float64) * (1.0 / (1 << 53))


def block_bucket(values: torch.Tensor, input_hash_size: int, buckets: int) -> torch.Tensor:
    """Bucket of each raw id: ``id // ceil(input_hash_size / buckets)`` (torchrec's routing rule).

    With ``input_hash_size == 0`` (torchrec's "unbounded" for the hash module) the bucket is
    ``id % buckets`` instead.

    Args:
        values: ``[N]`` int64 ids in ``[0, input_hash_size)``.
        input_hash_size: size of the id space.
        buckets: number of buckets ``B``.

    Returns:
        ``[N]`` int64 bucket indices in ``[0, B)``.
    """
    if buckets == 1:
        return torch.zeros_like(values)
    if input_hash_size == 0:
        return torch.remainder(values, buckets)
    block = -(-input_hash_size // buckets)
    return torch.div(values, block, rounding_mode="floor").clamp_(max=buckets - 1)


def bucket_segments(zch_size: int, buckets: int) -> list[int]:
    """``B + 1`` slot offsets of the bucket segments: ``[b * zch_size // B for b in 0..B]``.

    Raises:
        ValueError: fewer than two slots per bucket (a bucket needs a default row and a slot).
    """
    if buckets < 1 or zch_size < 2 * buckets:
        raise ValueError(
            f"zch_size={zch_size} cannot be split into buckets={buckets} segments of at least 2 slots "
            "(each bucket keeps one default row); use fewer buckets or a larger table"
        )
    return [b * zch_size // buckets for b in range(buckets + 1)]


def lookup_sorted(
    sorted_ids: torch.Tensor, sorted_slots: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot of each id that has one.

    Args:
        sorted_ids: ``[Z]`` int64, ascending (free slots as ``EMPTY_ID`` at the end), ``Z >= 1``.
        sorted_slots: ``[Z]`` int64 slot of each sorted id.
        values: ``[N]`` int64 raw ids.

    Returns:
        ``(slots [N], hit [N] bool)``; ``slots`` is only meaningful where ``hit``.
    """
    pos = torch.searchsorted(sorted_ids, values).clamp_(max=sorted_ids.numel() - 1)
    hit = sorted_ids.index_select(0, pos) == values
    return sorted_slots.index_select(0, pos), hit


def sort_slots(slot_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The search index of slot-ordered ids: ``(sorted_ids, sorted_slots)`` (stable)."""
    sorted_ids, order = torch.sort(slot_ids, stable=True)
    return sorted_ids, order


def replace_in_index(
    sorted_ids: torch.Tensor,
    sorted_slots: torch.Tensor,
    removed: torch.Tensor,
    new_ids: torch.Tensor,
    new_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Swap ``k`` entries of the search index for ``k`` new ``(id, slot)`` pairs, keeping it sorted.

    O(Z) copies and an O(k log Z) search -- no sort of the whole index -- which is what a training
    step pays when new ids take rows (the removed entries are the ``EMPTY_ID`` entries of the free
    slots taken, and the entries of the ids evicted to make room).

    Args:
        sorted_ids / sorted_slots: the index ``[Z]``.
        removed: ``[Z]`` bool, exactly ``k`` entries set.
        new_ids: ``[k]`` int64 ids, ascending, none of them in the index.
        new_slots: ``[k]`` slot of each new id.

    Returns:
        The new ``(sorted_ids, sorted_slots)``.
    """
    k = new_ids.numel()
    if k == 0:
        return sorted_ids, sorted_slots
    keep_ids, keep_slots = sorted_ids[~removed], sorted_slots[~removed]
    # Final position of new id j: (number of kept ids below it) + j.
    pos = torch.searchsorted(keep_ids, new_ids) + torch.arange(k, device=new_ids.device)
    is_new = torch.zeros(sorted_ids.numel(), dtype=torch.bool, device=sorted_ids.device)
    is_new[pos] = True
    out_ids = torch.empty_like(sorted_ids)
    out_slots = torch.empty_like(sorted_slots)
    out_ids[pos] = new_ids
    out_slots[pos] = new_slots
    out_ids[~is_new] = keep_ids
    out_slots[~is_new] = keep_slots
    return out_ids, out_slots


def index_positions_of_free(sorted_ids: torch.Tensor, sorted_slots: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[Z]`` bool: the ``EMPTY_ID`` entries of the index whose slot is one of ``slots``."""
    empty_start = int(torch.searchsorted(sorted_ids, torch.tensor(EMPTY_ID, device=sorted_ids.device)))
    mask = torch.zeros(sorted_ids.numel(), dtype=torch.bool, device=sorted_ids.device)
    mask[empty_start:] = torch.isin(sorted_slots[empty_start:], slots)
    return mask


def rank_within_groups(groups: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position of every element inside its group, for elements already ordered group by group
    (``groups`` non-decreasing) or not: element ``i`` gets the number of earlier elements of its group.

    Args:
        groups: ``[N]`` int64 group index of each element, in ``[0, num_groups)``.
        num_groups: number of groups.

    Returns:
        ``(rank [N], count [num_groups])``.
    """
    count = torch.bincount(groups, minlength=num_groups)
    order = torch.sort(groups, stable=True).indices
    start = torch.cumsum(count, 0) - count
    sorted_rank = torch.arange(groups.numel(), device=groups.device) - start.index_select(0, groups.index_select(0, order))
    rank = torch.empty_like(sorted_rank)
    rank[order] = sorted_rank
    return rank, count


def check_input_hash_size(input_hash_size: int, where: str) -> None:
    """``input_hash_size`` must be an int in ``[0, 2**63 - 1]`` (0: unbounded, hash module only)."""
    if isinstance(input_hash_size, bool) or not isinstance(input_hash_size, int):
        raise TypeError(f"{where}: input_hash_size must be an int, got {input_hash_size!r}")
    if not 0 <= input_hash_size <= EMPTY_ID:
        raise ValueError(
            f"{where}: input_hash_size must be in [0, 2**63 - 1] (ids are int64 below it), got {input_hash_size}"
        )


def mix64_hash(values: torch.Tensor, input_hash_size: int) -> torch.Tensor:
    """An ``input_hash_func`` that spreads any int64 ids over ``[0, input_hash_size)``.

    Managed-collision tables split the id space into equal blocks (their buckets, and ranks when
    sharded); ids that all sit at one end of it (small sequential ids) would share one block. Pass
    ``input_hash_func=mix64_hash`` to spread them (collisions among 2**63 values are negligible).
    """
    return torch.remainder(mix64(values.long()), input_hash_size)
