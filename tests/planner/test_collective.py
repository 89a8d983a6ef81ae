"""collective_plan on 2 real gloo ranks: identical plans everywhere, errors raised on every rank.

lightrec is imported inside the functions: spawned ranks unpickle this module before they install
the fbgemm block of the ``LIGHTREC_BLOCK_FBGEMM=1`` CI run.
"""

from __future__ import annotations

from tests.multiprocess import run_ranks


def _model():  # noqa: ANN202
    from tests.planner.stand_in import tables

    return tables([(50_000 * (i + 1), 32 * (1 + i % 4)) for i in range(12)])


def _body(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from lightrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        PlannerError,
        Topology,
    )
    from lightrec.distributed.types import ShardingEnv
    from tests.planner.stand_in import StandInSharder

    env = ShardingEnv.from_process_group(dist.group.WORLD)
    planner = EmbeddingShardingPlanner()  # topology from the process group: 2 CPU ranks
    plan = planner.collective_plan(_model(), [StandInSharder()], dist.group.WORLD)
    error = None
    try:
        EmbeddingShardingPlanner(
            topology=Topology(world_size=world_size, compute_device="cpu", ddr_cap=1024**2),
            constraints={"t0": ParameterConstraints(sharding_types=["table_wise"])},
        ).collective_plan(_model(), [StandInSharder()])
    except PlannerError as exc:
        error = (str(exc), exc.tables)
    return {
        "env": (env.world_size, env.rank),
        "plan": plan.to_json(),
        "report_ranks": planner.last_report.world_size,
        "error": error,
    }


def test_collective_plan_on_two_gloo_ranks() -> None:
    from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from lightrec.distributed.types import ShardingPlan
    from tests.planner.stand_in import StandInSharder

    results = run_ranks(_body, world_size=2)
    assert [r["env"] for r in results] == [(2, 0), (2, 1)]
    assert results[0]["plan"] == results[1]["plan"]
    local = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
        _model(), [StandInSharder()]
    )
    assert ShardingPlan.from_json(results[0]["plan"]) == local
    assert all(r["report_ranks"] == 2 for r in results)
    assert results[0]["error"] is not None and results[0]["error"] == results[1]["error"]
    assert "No sharding plan fits" in results[1]["error"][0] and "t0" in results[1]["error"][1]
