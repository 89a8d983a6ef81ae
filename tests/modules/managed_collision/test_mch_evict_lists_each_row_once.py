"""``MCHManagedCollisionModule.evict()`` lists each evicted row once, however many steps ran since the last
call: a row was listed again whenever the id that took it was evicted too (churn with a small table),
so callers that count evictions or reset the listed rows saw a row several times."""

from __future__ import annotations

import torch

from lightrec.modules.managed_collision import MCHManagedCollisionModule
from lightrec.modules.managed_collision.ops import EMPTY_ID
from tests.modules.managed_collision.test_mch_module import mch, step


def _row_of_id(module: MCHManagedCollisionModule) -> dict[int, int]:
    """raw id -> its row, read from the module's torchrec-form state (sorted ids and their rows)."""
    ids, rows = module._mch_sorted_raw_ids.tolist(), module._mch_remapped_ids_mapping.tolist()
    return {i: r for i, r in zip(ids, rows) if i != EMPTY_ID}


def test_evict_lists_each_row_once_after_many_steps() -> None:
    g = torch.Generator().manual_seed(0)
    module = mch(zch=6, interval=3, immediate_eviction_fraction=0.5)  # 5 rows + the default row
    lost: set[int] = set()  # reference: rows whose id lost them, seen from the state around each step
    for _ in range(12):
        before = _row_of_id(module)
        step(module, *torch.randint(0, 31, (3,), generator=g).tolist())
        after = _row_of_id(module)
        lost |= {row for raw, row in before.items() if after.get(raw) != row}
    evicted = module.evict()
    assert evicted is not None
    rows = evicted.tolist()
    assert len(rows) == len(set(rows)), f"rows listed more than once: {rows}"
    assert set(rows) >= lost and module.evict() is None
