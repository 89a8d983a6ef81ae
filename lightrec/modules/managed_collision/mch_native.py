"""The lookup-and-insert of ``MCHManagedCollisionModule``'s training step as one native CPU op.

The torch-op step (``mch_step.MCHSteps._lookup_and_insert``) is some forty small tensor operations
per table and step; on a CPU each costs 10-20 µs of dispatch whatever the batch, which made a
managed-collision step twice the plain collection's. ``torch.ops.lightrec_mch.lookup_insert``
(``lightrec/csrc/mch_step.cpp``, built with lightrec's other native ops by ``lightrec._native``)
does the same work in one pass over the ids, with exactly the same decisions -- rows, evictions,
waiting ids, counters and the index -- which ``tests/modules/managed_collision/test_mch_native.py`` checks against
the torch path over many steps with every policy, buckets, admission and rows running short.

It serves CPU state only. The torch path runs instead on other devices, when the native library
could not be built (``lightrec._native``: one warning), with ``LIGHTREC_NATIVE=0``, and
with ``LIGHTREC_MCH_NATIVE=0`` (for comparisons). Eviction rounds and the frozen (eval and
serving) lookups are torch ops on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec import _switches
from lightrec._native import native_ops
from lightrec.modules.managed_collision.mch_index import SlotIndex
from lightrec.modules.managed_collision.mch_slots import BucketLayout

__all__ = ["NativeInsert", "native_hash_bytes_per_row", "native_lookup_insert", "native_step_available"]


def native_step_available(device: torch.device) -> bool:
    """Whether the native step serves a module whose state lives on ``device`` in this process."""
    if device.type != "cpu" or not _switches.MCH_NATIVE.read():
        return False
    ops = native_ops()
    return ops is not None and ops.mch_step


@dataclass
class NativeInsert:
    """What one native lookup-and-insert did (the index and its cursors are updated in place).

    Attributes:
        rows: ``[N]`` local row of every id (its own, or its bucket's default row).
        evicted: ``[E]`` rows whose residents lost them to new ids (to reset before the lookup).
        waiting_ids / waiting_counts: ``[W]`` new ids that found no row (rows ran short) and their
            lookups in the step: they wait for the next round.
        unplaced: ids of the batch (with repeats) left in a default row.
        inserted: new ids that got a row.
    """

    rows: torch.Tensor
    evicted: torch.Tensor
    waiting_ids: torch.Tensor
    waiting_counts: torch.Tensor
    unplaced: int
    inserted: int


def native_lookup_insert(
    values: torch.Tensor,
    index: SlotIndex,
    layout: BucketLayout,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    routing: tuple[int, int],
    it: int,
    admission_threshold: int,
) -> NativeInsert:
    """Look ``values`` up and give new ids rows (``mch_step._lookup_and_insert``'s decisions).

    Args:
        values: ``[N]`` int64 raw ids (CPU).
        index: the module's slot index (built; its hash, pending entries and cursors are updated).
        layout: the module's local buckets.
        state: ``(slot_ids [Z], last_access [Z], counts [Z] | None, admission_counts [Z] | None)``,
            updated in place.
        routing: ``(buckets of the whole table, id-space block per bucket)`` (``ops.block_bucket``).
        it: the step's iteration.
        admission_threshold: lookups before an id gets a row (1: at once).
    """
    slot_ids, last_access, counts, admission_counts = state
    buckets, block = routing
    n = values.numel()
    if index.hash is None or index.hash.shape[0] < 2 * (slot_ids.numel() + n):
        index.hash, index.hash_ok = torch.empty((_hash_size(slot_ids.numel() + n), 2), dtype=torch.int64), False
    rebuild = not index.hash_ok or index.hash_count > 3 * index.hash.shape[0] // 4 - n
    if rebuild:
        index.fold()  # the hash is rebuilt from the whole sorted index
    rows, ids, slots, evicted, wait_ids, wait_counts, info = torch.ops.lightrec_mch.lookup_insert(
        values, slot_ids, last_access, counts, admission_counts, index.hash, index.hash_count, index.ids,
        index.slots, rebuild, index.queue_flat, index.queue_starts, index.free_len, index.cursor, layout.bounds,
        layout.start_bucket, buckets, block, it, index.round_iter, admission_threshold,
    )  # fmt: skip
    unplaced, inserted, index.hash_count, *cursor = info.tolist()
    index.cursor, index.hash_ok = cursor, True
    if inserted:
        index.pending.append((ids, slots))
    return NativeInsert(rows, evicted, wait_ids, wait_counts, unplaced, inserted)


def _hash_size(entries: int) -> int:
    """Entries of a hash for ``entries`` ids (the rows, plus the ids one step may place): a power of
    two of at least twice that, so that it is at most half full after a rebuild (which drops the stale
    entries; one happens before it is three quarters full)."""
    return 1 << max(4, (2 * entries - 1).bit_length())


def native_hash_bytes_per_row(rows: int) -> float:
    """Bytes per row of the native step's hash for a table of ``rows`` rows (``[H, 2]`` int64 entries,
    ``H`` a power of two of at least twice the rows: 32 to 64 bytes a row; a batch larger than the
    table grows it further at run time). The planner counts it in the table's memory on CPU."""
    return 16.0 * _hash_size(rows) / max(rows, 1)
