"""Review: ``planner.plan`` and ``planner.collective_plan`` on 2 real gloo ranks plan the same cluster
and give the same plan on every rank -- with no topology given, also on a host where CUDA is visible
(``plan`` used to plan for ``cuda`` there while ``collective_plan`` planned for the gloo group's ``cpu``)
-- and an error on rank 0 is raised on every rank.

lightrec is imported inside the functions: spawned ranks unpickle this module before they install
the fbgemm block of the ``LIGHTREC_BLOCK_FBGEMM=1`` CI run.
"""

from __future__ import annotations

from tests.multiprocess import run_ranks


def _model():  # noqa: ANN202
    from tests.planner.stand_in import tables

    return tables([(40_000 * (i + 1), 16 * (1 + i % 4)) for i in range(9)] + [(3, 8)])


def _constraints() -> dict:
    from lightrec.distributed.planner import ParameterConstraints

    return {
        "t0": ParameterConstraints(sharding_types=["row_wise"]),
        "t1": ParameterConstraints(sharding_types=["column_wise"], min_partition=12),
        "t9": ParameterConstraints(sharding_types=["row_wise"]),  # 3 rows on 2 ranks
    }


def _body(rank: int, world_size: int, cuda_visible: bool) -> dict:
    import torch
    import torch.distributed as dist

    from lightrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from tests.planner.stand_in import StandInSharder

    available = torch.cuda.is_available
    if cuda_visible:  # a GPU host whose process group runs gloo
        torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    try:
        out: dict = {}
        for name, topo in (("default", None), ("given", Topology(world_size=world_size, compute_device="cpu"))):
            planner = EmbeddingShardingPlanner(topology=topo, constraints=_constraints())
            local = planner.plan(_model(), [StandInSharder()])
            local_report = str(planner.last_report).rsplit("planned in", 1)[0]
            collective = planner.collective_plan(_model(), [StandInSharder()], dist.group.WORLD)
            out[name] = (local.to_json(), collective.to_json(), local_report,
                         str(planner.last_report).rsplit("planned in", 1)[0])  # fmt: skip
        errors = []
        for constraints in ({"no_such_table": ParameterConstraints()},
                            {"t0": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])}):  # fmt: skip
            planner = EmbeddingShardingPlanner(
                topology=Topology(world_size=world_size, compute_device="cpu", ddr_cap=2 * 1024**2),
                constraints=constraints,
            )
            try:
                planner.collective_plan(_model(), [StandInSharder()])
            except Exception as exc:  # noqa: BLE001 - compared across ranks below
                errors.append((type(exc).__name__, str(exc), getattr(exc, "tables", None)))
        out["errors"] = errors
        return out
    finally:
        torch.cuda.is_available = available  # type: ignore[assignment]


def _check(results: list[dict]) -> None:
    from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from lightrec.distributed.types import ShardingPlan
    from tests.planner.stand_in import StandInSharder

    alone = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=_constraints())
    expected = alone.plan(_model(), [StandInSharder()])
    for r in results:
        for name in ("default", "given"):
            local, collective, local_report, collective_report = r[name]
            assert local == collective, name  # plan == collective_plan on this rank
            assert local_report == collective_report
            assert ShardingPlan.from_json(collective) == expected  # the gloo group's cpu ranks
            assert "rank:1/cpu" in collective and "cuda" not in collective
    assert results[0] == results[1]
    errors = results[0]["errors"]
    assert [e[0] for e in errors] == ["KeyError", "PlannerError"]
    assert "no_such_table" in errors[0][1]
    assert "'t0'" in errors[1][1] and "t0" in errors[1][2]


def test_plan_and_collective_plan_agree_on_two_gloo_ranks() -> None:
    _check(run_ranks(_body, world_size=2, args=(False,)))


def test_plan_and_collective_plan_agree_where_cuda_is_visible() -> None:
    _check(run_ranks(_body, world_size=2, args=(True,)))
