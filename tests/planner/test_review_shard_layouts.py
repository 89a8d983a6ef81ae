"""Review of the planner's shard layouts against an independent computation: every table tiled
exactly once (row-wise with fewer rows than ranks, column-wise with a ``min_partition`` that is not
a multiple of 4, one rank), placements, and the constraints honoured."""

from __future__ import annotations

import numpy as np
import pytest

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    Topology,
)
from lightrec.distributed.types import ShardingPlan
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from tests.planner.stand_in import StandInEBC, StandInSharder, tables

STYPES = ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel"]


def _plan(module, topo: Topology, constraints: dict | None = None) -> tuple[ShardingPlan, EmbeddingShardingPlanner]:  # noqa: ANN001
    planner = EmbeddingShardingPlanner(topology=topo, constraints=constraints or {})
    return planner.plan(module, [StandInSharder()]), planner


def _layout_rule(cols: int, n: int) -> list[int]:
    """docs/planner.md "Shard layout rules", written out again: units of 4 columns when ``cols % 4 == 0``
    and there are at least ``n`` units, else units of 1; the first ``units % n`` shards one unit wider."""
    unit = 4 if cols % 4 == 0 and cols // 4 >= n else 1
    units = cols // unit
    return [(units // n + (1 if i < units % n else 0)) * unit for i in range(n)]


def _check_tiling(rows: int, cols: int, shards: list) -> None:  # noqa: ANN001
    """Every cell of the ``rows x cols`` table is covered by exactly one shard (compressed grid)."""
    rs = sorted({0, rows} | {s.shard_offsets[0] for s in shards} | {s.shard_offsets[0] + s.shard_sizes[0] for s in shards})
    cs = sorted({0, cols} | {s.shard_offsets[1] for s in shards} | {s.shard_offsets[1] + s.shard_sizes[1] for s in shards})
    assert rs[-1] == rows and cs[-1] == cols, (rows, cols, [(s.shard_offsets, s.shard_sizes) for s in shards])
    cover = np.zeros((len(rs) - 1, len(cs) - 1), dtype=int)
    for s in shards:
        if s.shard_sizes[0] and s.shard_sizes[1]:
            r0, r1 = rs.index(s.shard_offsets[0]), rs.index(s.shard_offsets[0] + s.shard_sizes[0])
            c0, c1 = cs.index(s.shard_offsets[1]), cs.index(s.shard_offsets[1] + s.shard_sizes[1])
            cover[r0:r1, c0:c1] += 1
    assert (cover == 1).all(), [(s.shard_offsets, s.shard_sizes) for s in shards]


def _check_plan(module: StandInEBC, plan: ShardingPlan, topo: Topology, constraints: dict) -> None:
    W, L = topo.world_size, topo.local_size
    for cfg in module.embedding_bag_configs():
        ps = plan.plan[""][cfg.name]
        c = constraints.get(cfg.name)
        if c is not None and c.sharding_types:
            assert ps.sharding_type in c.sharding_types
        if ps.sharding_type == "data_parallel":
            assert ps.ranks == list(range(W)) and ps.sharding_spec is None
            continue
        spec = ps.sharding_spec
        assert [s.rank for s in spec] == ps.ranks and all(0 <= r < W for r in ps.ranks)
        device = (lambda r: f"cuda:{r % L}") if topo.compute_device == "cuda" else (lambda r: "cpu")
        assert [s.placement for s in spec] == [f"rank:{r}/{device(r)}" for r in ps.ranks]
        _check_tiling(cfg.num_embeddings, cfg.embedding_dim, spec)
        if ps.sharding_type == "row_wise":
            block = -(-cfg.num_embeddings // W)
            assert ps.ranks == list(range(W))
            assert [s.shard_sizes[0] for s in spec] == [max(0, min(block, cfg.num_embeddings - i * block)) for i in range(W)]
        if ps.sharding_type in ("table_row_wise", "table_column_wise"):
            host = ps.ranks[0] // L
            assert ps.ranks == [host * L + i for i in range(len(spec))]
        if ps.sharding_type == "table_row_wise":
            assert len(spec) == L
        if ps.sharding_type in ("column_wise", "table_column_wise"):
            widest = min((c.min_partition if c is not None and c.min_partition else 32), cfg.embedding_dim)
            widths = [s.shard_sizes[1] for s in spec]
            assert min(widths) >= widest, (cfg.name, cfg.embedding_dim, widest, widths)
            assert widths == _layout_rule(cfg.embedding_dim, len(widths))


@pytest.mark.parametrize("stype", ["column_wise", "table_column_wise"])
@pytest.mark.parametrize(
    ("dim", "min_partition", "world_size"),
    [(120, 30, 4), (24, 5, 4), (36, 9, 4), (100, 33, 4), (40, 6, 8), (130, 32, 4), (10, 3, 3), (4, 4, 3)],
)
def test_column_shards_are_never_narrower_than_min_partition(stype: str, dim: int, min_partition: int, world_size: int) -> None:
    # 120 columns, min_partition 30, 4 ranks used to give [32, 32, 28, 28]: 4-column units took a
    # shard below the minimum. Every shard is now at least min_partition wide (here [40, 40, 40]).
    module = tables([(1000, dim)])
    cons = {"t0": ParameterConstraints(sharding_types=[stype], min_partition=min_partition)}
    topo = Topology(world_size=world_size, compute_device="cpu")
    plan, _ = _plan(module, topo, cons)
    widths = [s.shard_sizes[1] for s in plan.plan[""]["t0"].sharding_spec]
    assert min(widths) >= min_partition, widths
    _check_plan(module, plan, topo, cons)


def test_dim_4_min_partition_4_on_3_ranks_is_one_whole_shard() -> None:
    topo = Topology(world_size=3, compute_device="cpu")
    for stype in ("column_wise", "table_column_wise"):
        plan, _ = _plan(tables([(1000, 4)]), topo, {"t0": ParameterConstraints(sharding_types=[stype], min_partition=4)})
        ps = plan.plan[""]["t0"]
        assert ps.sharding_type == stype and len(ps.ranks) == 1
        assert [(s.shard_offsets, s.shard_sizes) for s in ps.sharding_spec] == [([0, 0], [1000, 4])]


def test_row_wise_with_fewer_rows_than_ranks_covers_every_row_once() -> None:
    topo = Topology(world_size=8, local_world_size=4, compute_device="cuda", hbm_cap=2**30)
    cons = {"t0": ParameterConstraints(sharding_types=["row_wise"]), "t1": ParameterConstraints(sharding_types=["table_row_wise"])}
    module = tables([(3, 16), (2, 8)])
    plan, _ = _plan(module, topo, cons)
    t0 = plan.plan[""]["t0"]
    assert [s.shard_sizes for s in t0.sharding_spec] == [[1, 16]] * 3 + [[0, 16]] * 5
    assert [s.shard_offsets[0] for s in t0.sharding_spec] == [0, 1, 2, 3, 3, 3, 3, 3]
    assert [s.placement for s in t0.sharding_spec] == [f"rank:{r}/cuda:{r % 4}" for r in range(8)]
    t1 = plan.plan[""]["t1"]
    assert [s.shard_sizes[0] for s in t1.sharding_spec] == [1, 1, 0, 0] and t1.ranks in ([0, 1, 2, 3], [4, 5, 6, 7])
    _check_plan(module, plan, topo, cons)


def test_world_size_one_puts_everything_on_rank_0() -> None:
    module = tables([(1000, 64), (5, 8), (20_000, 128)])
    for stype in STYPES:
        cons = {"t0": ParameterConstraints(sharding_types=[stype])}
        topo = Topology(world_size=1, compute_device="cpu")
        plan, planner = _plan(module, topo, cons)
        assert all(ps.ranks == [0] for ps in plan.plan[""].values())
        _check_plan(module, plan, topo, cons)
        assert planner.last_report.world_size == 1


def test_random_tables_and_constraints_tile_exactly() -> None:
    """Random tables, constraints and topologies: every plan tiles each table exactly, keeps its
    constraints, column shards at least min_partition wide, and the report matches evaluate()."""
    rng = np.random.default_rng(2024)
    for _ in range(60):
        L, H = int(rng.choice([1, 2, 3, 4])), int(rng.choice([1, 2, 3]))
        topo = Topology(world_size=L * H, local_world_size=L, compute_device=str(rng.choice(["cpu", "cuda"])),
                        hbm_cap=2**30, ddr_cap=8 * 2**30)  # fmt: skip
        cfgs, cons = [], {}
        for i in range(int(rng.integers(1, 9))):
            rows = int(rng.choice([1, 3, 7, 100, 5000, 200_000]))
            dim = int(rng.choice([3, 4, 6, 10, 24, 36, 64, 100, 120, 130]))
            cfgs.append(EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"]))
            if rng.random() < 0.7:
                kinds = list(rng.choice(STYPES, size=int(rng.integers(1, 3)), replace=False))
                mp = int(rng.choice([1, 3, 5, 6, 9, 16, 30, 33])) if rng.random() < 0.6 else None
                cons[f"t{i}"] = ParameterConstraints(sharding_types=kinds, min_partition=mp,
                                                     pooling_factors=[float(rng.uniform(0.5, 20))])  # fmt: skip
        module = StandInEBC(cfgs)
        plan, planner = _plan(module, topo, cons)
        _check_plan(module, plan, topo, cons)
        assert ShardingPlan.from_json(plan.to_json()) == plan
        evaluated = planner.evaluate(module, [StandInSharder()], plan)
        report = planner.last_report
        np.testing.assert_allclose(evaluated.cost_s, report.cost_s, rtol=1e-9)
        np.testing.assert_allclose(evaluated.hbm_bytes, report.hbm_bytes, rtol=1e-9)
        np.testing.assert_allclose(evaluated.ddr_bytes, report.ddr_bytes, rtol=1e-9)


def test_constraints_the_sharder_cannot_meet_name_the_table() -> None:
    class TableWiseOnly(StandInSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return ["table_wise"]

    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                       constraints={"t1": ParameterConstraints(sharding_types=["row_wise"])})  # fmt: skip
    with pytest.raises(ValueError, match=r"table 't1' has no allowed .*row_wise.*TableWiseOnly offers \['table_wise'\]"):
        planner.plan(tables([(10, 4), (20, 4)]), [TableWiseOnly()])
    # one allowed type among unsupported ones: the supported one is used
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                       constraints={"t1": ParameterConstraints(sharding_types=["row_wise", "table_wise"])})  # fmt: skip
    assert planner.plan(tables([(10, 4), (20, 4)]), [TableWiseOnly()]).plan[""]["t1"].sharding_type == "table_wise"


def test_constraints_naming_a_missing_table_are_a_key_error_naming_it() -> None:
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                       constraints={"t0": ParameterConstraints(), "no_such_table": ParameterConstraints()})  # fmt: skip
    with pytest.raises(KeyError, match="no_such_table") as info:
        planner.plan(tables([(10, 4)]), [StandInSharder()])
    assert "'t0'" in str(info.value)  # the tables that exist are listed
    with pytest.raises(PlannerError):  # a real shortage is a PlannerError, not a KeyError
        EmbeddingShardingPlanner(
            topology=Topology(world_size=1, compute_device="cpu", ddr_cap=1024),
            constraints={"t0": ParameterConstraints(compute_kernels=["fused"])},
        ).plan(tables([(10_000, 64)]), [StandInSharder()])
