"""Plans from the planner feed DistributedModelParallel on 2 gloo ranks and train like one process."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.multiprocess import run_ranks

_CONSTRAINTS = {  # one table per sharding type, so the planner's plan mixes them
    "t0": ["row_wise"],
    "t1": ["data_parallel"],
    "t2": ["table_wise"],
    "t3": ["column_wise"],
}


def _body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter
    from tests.distributed.test_dmp import DIM, LR, _dlrm, _rank_loss, _sharders
    from tests.distributed.test_sharded_embeddings import reference_update

    constraints = {
        t: ParameterConstraints(sharding_types=s, min_partition=4) for t, s in _CONSTRAINTS.items()
    }
    plan = EmbeddingShardingPlanner(constraints=constraints).collective_plan(_dlrm("meta"), _sharders())
    module_plan = plan.plan["sparse_arch.embedding_bag_collection"]
    reference = _dlrm("cpu")
    model = DistributedModelParallel(copy.deepcopy(reference), device="cpu", plan=plan, sharders=_sharders())
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [model.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=LR))]
    )
    ref_opt = torch.optim.SGD(
        [p for n, p in reference.named_parameters() if "embedding_bags" not in n], lr=LR
    )
    bce = torch.nn.BCEWithLogitsLoss()
    batch, losses, ref_losses, states = 4, [], [], {}
    t3_blocks = [
        (s.shard_offsets[1], s.shard_offsets[1] + s.shard_sizes[1]) for s in module_plan["t3"].sharding_spec
    ]
    for step in range(3):
        loss, (x, kjt, y) = _rank_loss(model, step, rank, world_size, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        logits = reference(x, kjt).squeeze(1)
        per_rank = [
            bce(logits[r * batch : (r + 1) * batch], y[r * batch : (r + 1) * batch])
            for r in range(world_size)
        ]
        ref_losses.append(per_rank[rank].item())
        ref_opt.zero_grad()
        reference.sparse_arch.embedding_bag_collection.zero_grad()
        (sum(per_rank) / world_size).backward()
        ref_opt.step()
        for name, bag in reference.sparse_arch.embedding_bag_collection.embedding_bags.items():
            blocks = t3_blocks if name == "t3" else [(0, DIM)]
            reference_update(
                bag.weight, bag.weight.grad, states.setdefault(name, {}), "rowwise_adagrad", blocks
            )
    full = model.gather_full_state_dict()
    ref_sd = reference.state_dict()
    return {
        "types": {n: ps.sharding_type for n, ps in module_plan.items()},
        "plan": plan.to_json(),
        "losses": losses,
        "ref_losses": ref_losses,
        "state_err": max((full[k] - ref_sd[k]).abs().max().item() for k in ref_sd),
    }


def test_planner_plan_trains_under_dmp_on_two_ranks() -> None:
    results = run_ranks(_body, 2, timeout=180)
    assert results[0]["plan"] == results[1]["plan"]
    assert results[0]["types"] == {t: s[0] for t, s in _CONSTRAINTS.items()}
    for rank, r in enumerate(results):
        assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5), f"rank {rank}"
        assert r["state_err"] < 1e-5, f"rank {rank}"
