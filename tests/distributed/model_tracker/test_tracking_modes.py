"""The tracker's state modes on 2 gloo ranks: ``EMBEDDING`` keeps each row as the window first looked
it up (a sequence collection's rows, before the window's updates); ``ROWWISE_ADAGRAD`` gives how
much each row's accumulator grew over the window; ``MOMENTUM_LAST`` the norm of each row's first moment when read; a mode a table cannot give is refused, naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.distributed.model_tracker.helpers import train_step
from tests.multiprocess import run_ranks


def _read(table: Any, ids: torch.Tensor, state: str | None) -> torch.Tensor:
    shard = table.local[0]
    found = shard.kernel.kernel.read_rows(shard.kernel_table, ids - shard.row_offset)
    value = (found.weights if state is None else found.states[state]).float()
    return value.reshape(ids.numel(), -1) if ids.numel() else value


def _all_rows(table: Any, state: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    if not table.local:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0)
    shard = table.local[0]
    ids = torch.arange(shard.row_offset, shard.row_offset + shard.rows)
    return ids, _read(table, ids, state)


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    import pytest

    from lightrec.distributed.model_tracker import (
        ModelDeltaTrackerTrec,
        TrackingMode,
        UnsupportedTrackingError,
    )
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd-{rank}", world_size)
    with pytest.raises(UnsupportedTrackingError, match="no fused kernel holding optimizer state"):
        ModelDeltaTrackerTrec(model, mode=TrackingMode.ROWWISE_ADAGRAD)  # the data-parallel / dense tables
    with pytest.raises(UnsupportedTrackingError, match="keeps no \\[rows, dim\\] first moment"):
        ModelDeltaTrackerTrec(model, mode=TrackingMode.MOMENTUM_LAST, fqns_to_skip=["ebc"])  # adagrad has none
    with pytest.raises(UnsupportedTrackingError, match="pooled"):
        ModelDeltaTrackerTrec(model, mode=TrackingMode.EMBEDDING, fqns_to_skip=["ec"])
    rows = ModelDeltaTrackerTrec(model, mode=TrackingMode.EMBEDDING, fqns_to_skip=["ebc", "mc"])
    adagrad = ModelDeltaTrackerTrec(model, mode=TrackingMode.ROWWISE_ADAGRAD, fqns_to_skip=["ebc"])
    assert sorted(t.name for t in rows.tables.values()) == ["s_cw", "s_rw"]
    assert sorted(t.name for t in adagrad.tables.values()) == ["m_rw", "m_tw", "s_cw", "s_rw"]
    checked = 0
    for window in ((1, 2), (3, 4)):
        before = {fqn: _all_rows(t, None) for fqn, t in rows.tables.items()}
        momentum = {fqn: _all_rows(t, "momentum1") for fqn, t in adagrad.tables.items()}
        for step in window:
            train_step(model, step, rank)
        for fqn, found in rows.get_unique().items():
            ids, values = before[fqn]
            assert found.states is not None and found.states.shape == (found.ids.numel(), rows.tables[fqn].local[0].cols)
            assert torch.equal(found.states, values[found.ids - ids[0]] if ids.numel() else values), (window, fqn)
            assert not torch.equal(found.states, _read(rows.tables[fqn], found.ids, None)) or found.ids.numel() == 0
            checked += found.ids.numel()
        for fqn, found in adagrad.get_unique().items():
            if not adagrad.tables[fqn].local:
                continue
            if adagrad.tables[fqn].managed:  # an eviction resets rows mid-window: growth since the reset
                assert found.states is not None and bool(found.states.isfinite().all()), (window, fqn)
                continue
            ids, start = momentum[fqn]
            grown = _read(adagrad.tables[fqn], found.ids, "momentum1").reshape(-1) - start[found.ids - ids[0]].reshape(-1)
            assert found.states is not None and torch.equal(found.states, grown), (window, fqn)
            # every row whose accumulator grew is reported
            _, now = _all_rows(adagrad.tables[fqn], "momentum1")
            assert set((now.reshape(-1) != start.reshape(-1)).nonzero().squeeze(1).add(ids[0]).tolist()) <= set(
                found.ids.tolist()
            ), (window, fqn)
            checked += found.ids.numel()
    rows.close()
    adagrad.close()
    return {"checked": checked}


def test_embedding_and_rowwise_adagrad_modes_keep_the_states_of_the_window(tmp_path: Path) -> None:
    results = run_ranks(_body, 2, args=(str(tmp_path),), timeout=300)
    assert results[0]["checked"] > 0 and results[1]["checked"] > 0


def _momentum_last_body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    from lightrec.distributed.model_tracker import ModelDeltaTrackerTrec, TrackingMode
    from tests.distributed.model_tracker.helpers import batch, sharded

    # Adam keeps a [rows, dim] first moment; the managed-collision tables keep their row-wise Adagrad
    # (their sharder's own optimizer), and the pooled collection holds data-parallel and dense tables.
    model = sharded(f"{tmp}/ssd-{rank}", world_size, fused={"optimizer": "adam", "learning_rate": 0.05})
    tracker = ModelDeltaTrackerTrec(model, mode=TrackingMode.MOMENTUM_LAST, fqns_to_skip=["ebc", "mc"])
    assert sorted(t.name for t in tracker.tables.values()) == ["s_cw", "s_rw"]
    checked = 0
    for window in ((1, 2), (3, 4)):
        touched: dict[str, set[int]] = {fqn: set() for fqn in tracker.tables}
        for step in window:
            for r in range(world_size):  # every rank's rows of the sequence collection, by feature
                f_ec = batch(step, r)[1]
                for fqn, t in tracker.tables.items():
                    touched[fqn] |= set(f_ec[f"f_{t.name}"].values().tolist())
            train_step(model, step, rank)
        for fqn, found in tracker.get_unique().items():
            table = tracker.tables[fqn]
            if not table.local:
                continue
            shard = table.local[0]
            mine = {i for i in touched[fqn] if shard.row_offset <= i < shard.row_offset + shard.rows}
            assert set(found.ids.tolist()) == mine, (window, fqn)
            # the first moment's L2 norm per row, as it is when read (after the window's updates)
            norms = _read(table, found.ids, "momentum1").norm(dim=1)
            assert found.states is not None and torch.equal(found.states, norms), (window, fqn)
            assert bool((norms > 0).all()), (window, fqn)  # Adam moved every looked-up row's moment
            checked += found.ids.numel()
    tracker.close()
    return {"checked": checked}


def test_momentum_last_reports_the_first_moment_norm_of_each_row_looked_up(tmp_path: Path) -> None:
    results = run_ranks(_momentum_last_body, 2, args=(str(tmp_path),), timeout=300)
    assert results[0]["checked"] > 0 and results[1]["checked"] > 0
