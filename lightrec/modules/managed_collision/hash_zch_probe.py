"""Multi-probe zero-collision hashing in plain torch: the lookup and insertion of
``HashZchManagedCollisionModule``, vectorised over ids.

Layout (fbgemm's, so torchrec's state dicts mean the same here): ``identities [Z, 1]`` int64 holds
the raw id living in each slot (``-1``: empty). An id's probe sequence inside its bucket segment
``[offset, offset + size)`` starts at ``murmur3(id) mod size`` and walks forward circularly for at
most ``max_probe`` slots. A lookup stops at the id, or at the first empty slot; an id found in no
probed slot *falls back* to its first probe position (sharing that row, like a plain hash).

Training inserts an id that was not found into the first probed slot that is empty -- or, with
eviction, whose metadata says it expired (TTL: ``metadata < threshold``) -- or, under LRU, into the
least recently seen probed slot when none is free. Where fbgemm's CUDA kernel resolves two new ids
racing for one slot with atomics (any may win), the smaller id wins here, so the result does not
depend on the order of the ids (nor on how a table is sharded).

A slot that an id of the batch holds -- found there, or seated there earlier in the same call -- is
never taken by another id of that batch (fbgemm locks such a slot for the step): every id keeps one
row for the whole step, and two ids of a batch never train one row as if it were theirs alone. A
new id whose probed slots are all held by the batch is not seated; it falls back (see above).

``murmur3_2x64`` is MurmurHash3's x64 mixing of the 128-bit block ``(id, 0)`` with seed 0, as
fbgemm's ``zero_collision_hash`` computes it (``tests/modules/managed_collision/test_hash_zch_module.py`` checks the
positions against fbgemm's op where it is installed).
"""

from __future__ import annotations

import torch

__all__ = ["EMPTY_IDENTITY", "murmur3_2x64", "probe_insert", "probe_lookup", "unsigned_mod"]

EMPTY_IDENTITY = -1

# MurmurHash3's 64-bit constants are written as signed int64 literals in the functions below:
# TorchScript compiles literals, not module-level globals (a frozen remapper scripted directly failed).


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _rotl(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x << bits) | _shr(x, 64 - bits)


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ _shr(h, 33)
    h = h * -49064778989728563  # 0xff51afd7ed558ccd
    h = h ^ _shr(h, 33)
    h = h * -4265267296055464877  # 0xc4ceb9fe1a85ec53
    return h ^ _shr(h, 33)


def murmur3_2x64(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 x64 of the block ``(x, 0)``, seed 0, as int64 bit patterns (wrapping arithmetic)."""
    k1 = _rotl(x.long() * -8663945395140668459, 31) * 5545529020109919103  # 0x87c37b91114253d5, 0x4cf5ad432745937f
    h1 = _rotl(k1, 27) * 5 + 0x52DCE729
    h2 = h1 * 5 + 0x38495AB5
    h1 = h1 ^ 16
    h2 = h2 ^ 16
    h1 = h1 + h2
    h2 = h2 + h1
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = h1 + h2
    h2 = h2 + h1
    return h1 ^ h2


def unsigned_mod(bits: torch.Tensor, modulo: torch.Tensor) -> torch.Tensor:
    """``bits`` read as unsigned 64-bit integers, modulo the positive ``modulo`` (per element)."""
    # u = bits + 2**64 for negative bits; (u mod m) = (bits mod m + 2**64 mod m) mod m.
    wrap = torch.remainder(torch.remainder(torch.full_like(modulo, 2**62), modulo) * 4, modulo)
    base = torch.remainder(bits, modulo)
    return torch.where(bits < 0, torch.remainder(base + wrap, modulo), base)


def _probe(
    identities: torch.Tensor, start: torch.Tensor, offset: torch.Tensor, size: torch.Tensor, active: torch.Tensor,
    p: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Probe ``p`` of the ids at positions ``active``: their slots ``[A]`` (probe windows wrap inside
    each id's segment) and the identities held there ``[A]``."""
    slot = offset[active] + torch.remainder(start[active] + p, size[active])
    return slot, identities.index_select(0, slot)


def probe_lookup(
    identities: torch.Tensor, ids: torch.Tensor, start: torch.Tensor, offset: torch.Tensor, size: torch.Tensor,
    max_probe: int,
) -> torch.Tensor:  # fmt: skip
    """Slot of every id found within its probe window (``-1``: not found).

    Args:
        identities: ``[Z]`` slot identities (a view of the ``[Z, 1]`` buffer).
        ids: ``[U]`` int64 ids.
        start: ``[U]`` first probe position inside the segment; offset / size: ``[U]`` segment.
        max_probe: probes per id.
    """
    found = torch.full_like(ids, -1)
    active = torch.arange(ids.numel(), device=ids.device)
    for p in range(max_probe):
        if active.numel() == 0:
            break
        slot, current = _probe(identities, start, offset, size, active, p)
        hit = current == ids[active]
        found[active[hit]] = slot[hit]
        active = active[~hit & (current != EMPTY_IDENTITY)]
    return found


def probe_insert(
    identities: torch.Tensor,
    metadata: torch.Tensor | None,
    ids: torch.Tensor,
    start: torch.Tensor,
    offset: torch.Tensor,
    size: torch.Tensor,
    max_probe: int,
    expired_before: int,
    lru: bool,
    new_metadata: torch.Tensor | None = None,
    held: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Insert ids that were not found (module docstring); returns ``(slot [U] or -1, evicted slots)``.

    Args:
        identities: ``[Z]`` slot identities, updated in place.
        metadata: ``[Z]`` slot metadata (expiry or last-seen hour), or None without eviction;
            a seated id's slot gets its ``new_metadata`` at once (so later probes see it live).
        ids, start, offset, size, max_probe: as :func:`probe_lookup` (ids not present, in ascending
            order of their raw ids: the order decides which id wins a contested slot).
        expired_before: a slot whose metadata is below this may be taken over (-1: never).
        lru: when no probed slot is free, evict the probed slot seen least recently.
        held: ``[Z]`` bool, slots that ids of this batch already hold (found there); updated in place
            with the slots seated here. None: no slot is held yet.
    """
    if held is None:
        held = torch.zeros_like(identities, dtype=torch.bool)
    slot_of = torch.full_like(ids, -1)
    evicted: list[torch.Tensor] = []
    active = torch.arange(ids.numel(), device=ids.device)
    for p in range(max_probe):
        if active.numel() == 0:
            break
        slot, current = _probe(identities, start, offset, size, active, p)
        free = current == EMPTY_IDENTITY
        stale = torch.zeros_like(free)
        if metadata is not None and expired_before > 0:
            # (a held slot is live by construction -- its expiry was just refreshed -- unless a TTL
            # is not positive; the mask keeps the batch's own rows safe whatever the TTLs)
            stale = ~free & (metadata.index_select(0, slot) < expired_before) & ~held.index_select(0, slot)
        want = free | stale
        won = _claim(slot, want)
        take = active[won]
        taken = slot[won]
        identities[taken] = ids[take]
        held[taken] = True
        if metadata is not None and new_metadata is not None:
            metadata[taken] = new_metadata[take]
        slot_of[take] = taken
        if bool(stale[won].any()):
            evicted.append(taken[stale[won]])
        active = active[~won]
    if lru and metadata is not None and active.numel():
        got, out = _lru_fallback(identities, metadata, held, ids, active, start, offset, size, max_probe,
                                 new_metadata)  # fmt: skip
        slot_of[active] = got
        evicted.append(out)
    empty = torch.zeros(0, dtype=torch.int64, device=ids.device)
    return slot_of, torch.cat(evicted) if evicted else empty


def _claim(slot: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: the entries that get their slot -- per contested slot, the first wanting entry
    (entries are in ascending raw id order, so the smallest id wins)."""
    if slot.numel() == 0:
        return want
    order = torch.sort(torch.where(want, slot, torch.full_like(slot, -1)), stable=True).indices
    sorted_slots = slot.index_select(0, order)
    first = torch.ones_like(want)
    first[1:] = sorted_slots[1:] != sorted_slots[:-1]
    won = torch.zeros_like(want)
    won[order] = first
    return won & want


def _lru_fallback(
    identities: torch.Tensor, metadata: torch.Tensor, held: torch.Tensor, ids: torch.Tensor, active: torch.Tensor,
    start: torch.Tensor, offset: torch.Tensor, size: torch.Tensor, max_probe: int, new_metadata: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """LRU: each remaining id takes the slot of its window whose expiry is earliest (smaller id first),
    among the slots no id of the batch holds; an id whose window is all held stays unseated (-1)."""
    got = torch.full_like(active, -1)
    remaining = torch.arange(active.numel(), device=ids.device)
    evicted: list[torch.Tensor] = []
    probes = torch.arange(max_probe, device=ids.device)
    # Above any int32 expiry: a held slot is never the oldest, and an all-held window is seen as such.
    unavailable = torch.iinfo(torch.int64).max
    # Each pass seats the first contender of every chosen slot and holds that slot, so every id left
    # loses at least one candidate per pass: max_probe passes seat or exhaust them all.
    for _ in range(max_probe):
        if remaining.numel() == 0:
            break
        idx = active[remaining]
        window = offset[idx].unsqueeze(1) + torch.remainder(start[idx].unsqueeze(1) + probes, size[idx].unsqueeze(1))
        flat = window.reshape(-1)
        age = torch.where(held.index_select(0, flat), unavailable, metadata.index_select(0, flat).long())
        pick = age.view_as(window).argmin(1, keepdim=True)  # (ties: the earliest probe)
        open_ = age.view_as(window).gather(1, pick).squeeze(1) != unavailable
        remaining, idx, slot = remaining[open_], idx[open_], window.gather(1, pick).squeeze(1)[open_]
        won = _claim(slot, torch.ones_like(slot, dtype=torch.bool))
        taken = slot[won]
        evicted.append(taken)
        identities[taken] = ids[idx[won]]
        held[taken] = True
        # The new id's expiry (or, without one, "newest"): the slot is not the oldest any more.
        fresh = new_metadata[idx[won]] if new_metadata is not None else torch.iinfo(torch.int32).max
        metadata[taken] = fresh
        got[remaining[won]] = taken
        remaining = remaining[~won]
    return got, torch.cat(evicted) if evicted else got[:0]
