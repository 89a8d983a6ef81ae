"""The delta tracker on 2 gloo ranks: per consumer, its ids are the rows the batches since that
consumer's previous read looked up on this rank -- for every sharding type (table-, row-, column-,
table-row-, table-column-wise, data-parallel), fused, tiered and dense-kernel tables, a sequence
collection, and managed-collision tables (the rows the raw ids were mapped to, each now holding one
of those raw ids). Several consumers, delete-on-read and compaction included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.distributed.model_tracker.helpers import MC, batch, touched, train_step
from tests.multiprocess import run_ranks


def _expected(tracker: Any, steps: range, world_size: int, rank: int) -> dict[str, torch.Tensor]:
    """``{fqn: sorted ids}`` the batches of ``steps`` looked up in this rank's shards (EBC and EC tables)."""
    out: dict[str, torch.Tensor] = {}
    for fqn, t in tracker.tables.items():
        if t.managed:
            continue
        if t.data_parallel:  # a replica records what this rank's own batches looked up
            ids = [jt.values() for s in steps for kjt in batch(s, rank)[:2] for k, jt in kjt.to_dict().items()
                   if k == f"f_{t.name}"]  # fmt: skip
        else:
            ids = [touched(s, world_size)[t.name] for s in steps]
        flat = torch.unique(torch.cat(ids)) if ids else torch.zeros(0, dtype=torch.int64)
        mine = torch.zeros_like(flat, dtype=torch.bool)
        for shard in t.local:
            mine |= (flat >= shard.row_offset) & (flat < shard.row_offset + shard.rows)
        out[fqn] = flat[mine]
    return out


def _managed_raw(steps: range, world_size: int) -> dict[str, set[int]]:
    """``{table: raw ids}`` every rank's batches of ``steps`` sent to the managed tables."""
    out: dict[str, set[int]] = {t: set() for t in MC}
    for s in steps:
        for r in range(world_size):
            for key, jt in batch(s, r)[2].to_dict().items():
                out[key[2:]].update(jt.values().tolist())
    return out


def _check(tracker: Any, got: dict[str, torch.Tensor], steps: range, world_size: int, rank: int, what: str,
           managed_rows: dict[str, int]) -> None:  # fmt: skip
    expected = _expected(tracker, steps, world_size, rank)
    raw = _managed_raw(steps, world_size)
    assert set(got) == set(tracker.tables), what
    for fqn, ids in got.items():
        t = tracker.tables[fqn]
        assert ids.dtype == torch.int64 and torch.equal(ids, torch.unique(ids)), (what, fqn)
        if not t.managed:
            assert torch.equal(ids, expected[fqn]), (what, fqn, ids, expected[fqn])
            continue
        held = t.raw_ids(ids).tolist() if ids.numel() else []
        # every reported row holds a raw id of the window (or none: a row read for ids it did not admit);
        # every raw id of the window held here is reported
        assert set(held) <= raw[t.name] | {-1}, (what, fqn, held)
        if t.id_map is not None:
            every = torch.arange(t.local[0].row_offset, t.local[0].row_offset + t.local[0].rows)
            holding = {int(r) for r, i in zip(every, t.raw_ids(every).tolist(), strict=True) if i in raw[t.name]}
            assert holding <= set(ids.tolist()), (what, fqn)
        managed_rows[f"{what}/{t.name}"] = ids.numel()


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    import pytest

    from lightrec.distributed.model_tracker import DeltaTrackerConfig, ModelDeltaTrackerTrec
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd-{rank}", world_size)
    config = DeltaTrackerConfig(consumers=["publish", "checkpoint"], auto_compact=True)
    tracker = model.init_torchrec_delta_tracker(config)
    assert isinstance(tracker, ModelDeltaTrackerTrec) and model.get_delta_tracker() is tracker
    assert model.init_torchrec_delta_tracker(DeltaTrackerConfig()) is tracker  # one tracker, as torchrec's
    counts: dict[str, int] = {}
    for step in (1, 2):
        train_step(model, step, rank)
    _check(tracker, tracker.get_unique_ids("publish"), range(1, 3), world_size, rank, "publish after 2", counts)
    model.eval()
    with torch.no_grad():
        model(*batch(99, rank))  # an evaluation forward changes no row: not recorded
    model.train()
    for step in (3, 4, 5):
        train_step(model, step, rank)
    _check(tracker, tracker.get_unique_ids("publish"), range(3, 6), world_size, rank, "publish after 5", counts)
    unique = tracker.get_unique("checkpoint")
    _check(tracker, {f: r.ids for f, r in unique.items()}, range(1, 6), world_size, rank, "checkpoint after 5", counts)
    assert all(r.states is None for r in unique.values())
    stored = sum(e.ids.numel() for entries in tracker.store.per_fqn_lookups.values() for e in entries)
    again = tracker.get_unique_ids("publish")  # nothing since the previous read
    assert all(ids.numel() == 0 for ids in again.values())
    with pytest.raises(KeyError, match="'serving' is not one of this tracker's consumers"):
        tracker.get_unique_ids("serving")
    with pytest.raises(ValueError, match="TrackingMode.ID_ONLY keeps none"):
        tracker.get_unique("publish", top_percentage=0.5)
    with pytest.raises(ValueError, match="distinct non-empty names"):
        ModelDeltaTrackerTrec(model, consumers=["a", "a"])
    return {"stored_after_reads": stored, "fqns": sorted(tracker.tables), "managed_rows": counts}


def test_tracker_ids_per_consumer_are_the_rows_the_batches_looked_up(tmp_path: Path) -> None:
    results = run_ranks(_body, 2, args=(str(tmp_path),), timeout=300)
    assert results[0]["fqns"] == results[1]["fqns"]
    assert len(results[0]["fqns"]) == 13
    # delete-on-read: once both consumers have read, nothing is kept
    for key, count in results[0]["managed_rows"].items():  # the managed tables' rows, over both ranks
        assert count + results[1]["managed_rows"][key] > 0, key
    assert results[0]["stored_after_reads"] == results[1]["stored_after_reads"] == 0
