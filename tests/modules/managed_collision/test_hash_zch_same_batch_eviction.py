"""LRU eviction of ``HashZchManagedCollisionModule`` never takes a row that an id of the same batch
holds: an id's row is stable within a step (as fbgemm's per-slot process lock guarantees), and an
id that finds no row it may take falls back to its first probe position."""

from __future__ import annotations

import pytest
import torch

import lightrec.modules.managed_collision.hash_zch_module as hash_zch_module
from lightrec.modules.managed_collision import (
    HashZchEvictionConfig,
    HashZchEvictionPolicyName,
    HashZchManagedCollisionModule,
)
from lightrec.modules.managed_collision.hash_zch_probe import murmur3_2x64, unsigned_mod

ZCH = 4  # one bucket of 4 rows, windows of 2 probes


def _ids_starting_at(position: int, count: int, skip: int = 0) -> list[int]:
    """The ``count`` smallest ids (after ``skip`` of them) whose first probe is ``position``."""
    candidates = torch.arange(1, 20_000)
    start = unsigned_mod(murmur3_2x64(candidates), torch.full_like(candidates, ZCH))
    return candidates[start == position][skip : skip + count].tolist()


@pytest.fixture
def full_table(monkeypatch: pytest.MonkeyPatch) -> tuple[HashZchManagedCollisionModule, list[int]]:
    """An LRU table whose 4 rows are held by ids seen in the same hour (equal expiries: ties)."""
    monkeypatch.setattr(hash_zch_module, "now_hours", lambda: 1000)
    module = HashZchManagedCollisionModule(
        ZCH, "cpu", total_num_buckets=1, max_probe=2, input_hash_size=0,
        eviction_policy_name=HashZchEvictionPolicyName.LRU_EVICTION,
        eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1),
    ).train()  # fmt: skip
    residents = [_ids_starting_at(p, 1)[0] for p in range(ZCH)]
    rows = module.remap_values(torch.tensor(residents))
    assert rows.tolist() == list(range(ZCH))
    module.evict()
    return module, residents


def _seated(module: HashZchManagedCollisionModule, ids: list[int], rows: torch.Tensor) -> list[int]:
    """The ids of the batch that the table holds at the row the step gave them."""
    identities = module._hash_zch_identities.view(-1)
    return [i for i, r in zip(ids, rows.tolist()) if int(identities[r]) == i]


def test_two_new_ids_racing_for_tied_rows_get_two_rows(
    full_table: tuple[HashZchManagedCollisionModule, list[int]],
) -> None:
    module, _ = full_table
    new = _ids_starting_at(0, 2, skip=1)  # both probe rows 0 and 1, whose expiries tie
    rows = module.remap_values(torch.tensor(new))
    assert sorted(rows.tolist()) == [0, 1]
    assert _seated(module, new, rows) == new
    evicted = module.evict()
    assert evicted is not None and evicted.tolist() == [0, 1]


def test_more_new_ids_than_probe_slots_seat_some_and_the_rest_fall_back(
    full_table: tuple[HashZchManagedCollisionModule, list[int]],
) -> None:
    module, _ = full_table
    new = _ids_starting_at(0, 3, skip=1)  # three ids for a window of two rows
    rows = module.remap_values(torch.tensor(new))
    assert _seated(module, new, rows) == new[:2]  # smallest ids first
    assert rows[2] == 0  # the third: its first probe position, as a lookup of an unknown id
    evicted = module.evict()
    assert evicted is not None and evicted.tolist() == [0, 1]  # each row evicted once, for a resident


def test_an_id_found_in_the_batch_keeps_its_row(full_table: tuple[HashZchManagedCollisionModule, list[int]]) -> None:
    module, residents = full_table
    new = _ids_starting_at(0, 1, skip=1)
    batch = [residents[0], *new]  # residents[0] lives in row 0, the new id's first choice
    rows = module.remap_values(torch.tensor(batch))
    assert rows.tolist() == [0, 1]
    assert _seated(module, batch, rows) == batch
