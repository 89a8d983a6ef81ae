"""DistributedModelParallel around a module that is already sharded (what RecStrategy does for
every stage after the first): the sharded collections are kept -- same objects, values and plan --
the dense part is wrapped anew, and a plan, world or device that does not fit is refused by name.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int) -> dict[str, Any]:
    import copy

    from lightrec.distributed import DistributedModelParallel, ShardingPlan
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from tests.distributed.test_dmp import _batch, _dlrm, _mixed_plan, _sharders, _slice, _tables

    plan = _mixed_plan(world_size)
    first = DistributedModelParallel(
        copy.deepcopy(_dlrm("cpu")), device="cpu", plan=plan, sharders=_sharders()
    )
    x, kjt, _ = _batch(0, 4 * world_size)
    x, kjt = x[rank * 4 : rank * 4 + 4], _slice(kjt, rank * 4, 4)
    with torch.no_grad():
        expected = first(x, kjt)
    sharded = first.module.sparse_arch.embedding_bag_collection

    # no plan given: the sharded collection's own plan is taken over; no DDP (evaluation stage)
    again = DistributedModelParallel(
        first.module, device="cpu", sharders=_sharders(), init_data_parallel=False
    )
    with torch.no_grad():
        out = again(x, kjt)
    errors = {}
    other = ShardingPlan({
        "sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
            _tables("meta"), {t: table_wise(rank=0) for t in ("t0", "t1", "t2", "t3")}, world_size=world_size)
    })  # fmt: skip
    for name, kwargs in {"plan": {"plan": other}, "device": {"device": "meta"}}.items():
        try:
            DistributedModelParallel(
                first.module, sharders=_sharders(), init_data_parallel=False, **{"device": "cpu", **kwargs}
            )
        except ValueError as exc:
            errors[name] = str(exc)
    same_plan = DistributedModelParallel(
        first.module, device="cpu", plan=plan, sharders=_sharders(), init_data_parallel=False
    )
    return {
        "same_object": again.module.sparse_arch.embedding_bag_collection is sharded,
        "plan_equal": again.plan.plan == plan.plan and same_plan.plan.plan == plan.plan,
        "fused_params": sorted(again.fused_optimizer.params) == sorted(first.fused_optimizer.params),
        "out": out,
        "expected": expected,
        "errors": errors,
    }


def test_an_already_sharded_module_is_kept_not_resharded() -> None:
    for rank, r in enumerate(run_ranks(_body, 2, timeout=120)):
        assert r["same_object"] and r["plan_equal"] and r["fused_params"], f"rank {rank}"
        assert torch.equal(r["out"], r["expected"])
        assert "sharded by another plan" in r["errors"]["plan"] and "resharded" in r["errors"]["plan"]
        assert "shards live on cpu" in r["errors"]["device"] and "device=meta" in r["errors"]["device"]


def _other_world_body(rank: int, world_size: int) -> str:
    import copy

    import torch.distributed as dist

    from lightrec.distributed import DistributedModelParallel, ShardingEnv
    from tests.distributed.test_dmp import _dlrm, _mixed_plan, _sharders

    model = DistributedModelParallel(
        copy.deepcopy(_dlrm("cpu")), device="cpu", plan=_mixed_plan(world_size), sharders=_sharders()
    )
    alone = [dist.new_group(ranks=[r]) for r in range(world_size)]  # every rank creates every group
    try:
        DistributedModelParallel(model.module, env=ShardingEnv.from_process_group(alone[rank]), device="cpu",
                                 sharders=_sharders(), init_data_parallel=False)  # fmt: skip
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_a_module_sharded_for_another_world_is_refused() -> None:
    for message in run_ranks(_other_world_body, 2, timeout=120):
        assert "sharded for rank" in message and "of 2" in message and "of 1" in message, message
