"""``gather_full_state_dict`` of a float64 model on 2 real gloo ranks.

Every table sits on one rank only (table-wise), so the other rank holds no shard of it and used to
build its reduce buffer as float32 while the owner sent float64: gloo failed on the size (or the sum
was garbage). The ranks now agree on each table's dtype first.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.test_dmp import LR, _dlrm, _tables
from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int, dst: int | None) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder, ShardingPlan
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    # t0, t2 on rank 1 only and t1, t3 on rank 0 only: each rank is the non-owner of some tables.
    gens = {"t0": table_wise(rank=1), "t1": table_wise(rank=0), "t2": table_wise(rank=1), "t3": table_wise(rank=0)}
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
        _tables("meta"), gens, world_size=world_size)})  # fmt: skip
    # the torch kernels can change dtype after construction (fbgemm's cannot)
    sharders = [EmbeddingBagCollectionSharder({"optimizer": "exact_row_wise_adagrad", "learning_rate": LR},
                                              kernel_backend="torch")]  # fmt: skip
    model = DistributedModelParallel(_dlrm("meta"), device="cpu", plan=plan, sharders=sharders)
    model.double()
    own = {}
    for key, value in model.state_dict().items():
        if isinstance(value, ShardedTableState):
            for meta, tensor in value.shards:
                own[key] = (meta.shard_offsets, meta.shard_sizes, tensor.detach().clone())
    full = model.gather_full_state_dict(dst=dst)
    return {"own": own, "full": full}


@pytest.mark.parametrize("dst", [0, None])
def test_gather_of_a_float64_model_uses_the_table_dtype_on_every_rank(dst: int | None) -> None:
    results = run_ranks(_body, 2, args=(dst,), timeout=180)
    receivers = [0] if dst == 0 else [0, 1]
    owned = {key: entry for r in results for key, entry in r["own"].items()}
    assert len(owned) == 4 and all(t.dtype == torch.float64 for _, _, t in owned.values())
    for rank in receivers:
        full = results[rank]["full"]
        for key, ((r, c), (nr, nc), shard) in owned.items():
            assert full[key].dtype == torch.float64, (rank, key, full[key].dtype)
            assert torch.equal(full[key][r : r + nr, c : c + nc], shard), (rank, key)
    if dst == 0:
        assert results[1]["full"] == {}
