"""torchrec's planner classes under lightrec: EmbeddingEnumerator, estimators, proposers,
partitioners, storage reservations, perf models and ParameterConstraints' fields, each checked for
the effect it must have on the plan."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    Topology,
)
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.partitioners import GreedyPerfPartitioner, SortBy
from lightrec.distributed.planner.perf_models import NoopPerfModel
from lightrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from lightrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from lightrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from lightrec.distributed.planner.types import PerfModel, ShardEstimator, ShardingOption
from lightrec.distributed.types import ShardingPlan
from tests.planner.stand_in import StandInSharder, tables

MiB = 1024**2
SHARDERS = [StandInSharder()]


def _types(plan: ShardingPlan) -> dict[str, str]:
    return {name: ps.sharding_type for name, ps in plan.plan["ebc"].items()}


def _topo(world: int = 4, ddr: int = 1024 * MiB) -> Topology:
    return Topology(world_size=world, compute_device="cpu", ddr_cap=ddr)


class _Model(nn.Module):
    """Tables plus a dense part the heuristic reservation must count."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = tables([(1000, 16), (50_000, 64), (300, 8)])
        self.dense = nn.Linear(256, 512)  # 131_584 parameters


def test_enumerator_lists_estimated_options_and_feeds_the_planner() -> None:
    topo = _topo()
    constraints = {"t1": ParameterConstraints(sharding_types=["row_wise", "table_wise"])}
    enumerator = EmbeddingEnumerator(topology=topo, batch_size=256, constraints=constraints,
                                     estimator=[EmbeddingPerfEstimator(topo), EmbeddingStorageEstimator(topo)])  # fmt: skip
    options = enumerator.enumerate(_Model(), SHARDERS)
    t1 = [so for so in options if so.name == "t1"]
    assert {so.sharding_type for so in t1} == {"row_wise", "table_wise"} and all(so.path == "ebc" for so in t1)
    rw = next(so for so in t1 if so.sharding_type == "row_wise")
    assert rw.num_shards == 4 and [s.offset[0] for s in rw.shards] == [0, 12_500, 25_000, 37_500]
    assert all(s.perf.total > 0 and s.storage.ddr > 0 and s.storage.hbm == 0 for s in rw.shards)
    # The enumerator's topology, batch size and constraints fill in the planner's.
    via_enumerator = EmbeddingShardingPlanner(enumerator=enumerator).plan(_Model(), SHARDERS)
    direct = EmbeddingShardingPlanner(topology=topo, batch_size=256, constraints=constraints).plan(_Model(), SHARDERS)
    assert via_enumerator.to_dict() == direct.to_dict()
    foreign = ShardingOption("t0", torch.empty(0), ("ebc", nn.Module()), [1.0], 1, "table_wise", "device", "fused")
    with pytest.raises(ValueError, match="built elsewhere"):
        EmbeddingPerfEstimator(topo).estimate([foreign])


class _TableWiseOnly(EmbeddingEnumerator):
    def enumerate(self, module: nn.Module, sharders: list) -> list[ShardingOption]:
        return [so for so in super().enumerate(module, sharders) if so.sharding_type == "table_wise"]


class _SlowKind(ShardEstimator):
    """Makes one sharding type 1000x as expensive."""

    def __init__(self, topology: Topology, kind: str) -> None:
        super().__init__(topology)
        self.kind = kind

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict | None = None) -> None:
        for so in sharding_options:
            for shard in so.shards:
                if so.sharding_type == self.kind:
                    shard.perf.fwd_compute *= 1000.0


def test_custom_enumerator_and_estimator_change_the_plan() -> None:
    topo = _topo()
    only_tw = EmbeddingShardingPlanner(topology=topo, enumerator=_TableWiseOnly(topo)).plan(_Model(), SHARDERS)
    assert set(_types(only_tw).values()) == {"table_wise"}
    constraints = {"t1": ParameterConstraints(sharding_types=["row_wise", "column_wise"])}
    default = EmbeddingShardingPlanner(topology=topo, constraints=constraints).plan(_Model(), SHARDERS)
    chosen = _types(default)["t1"]  # the cheaper of the two for the big table with lightrec's numbers
    slowed = EmbeddingEnumerator(topo, constraints=constraints, estimator=[EmbeddingPerfEstimator(topo), _SlowKind(topo, chosen)])
    other = ({"row_wise", "column_wise"} - {chosen}).pop()
    assert _types(EmbeddingShardingPlanner(enumerator=slowed).plan(_Model(), SHARDERS))["t1"] == other


def test_heuristical_reservation_counts_the_dense_part_and_batch() -> None:
    topo = _topo(ddr=64 * MiB)
    reservation = HeuristicalStorageReservation(percentage=0.15, parameter_multiplier=6.0)
    reserved = reservation.reserve(topo, 128, _Model(), SHARDERS, {})
    dense = 6.0 * 131_584 * 4
    kjt = 20 * (12.0 * 128 * 3 + 4.0 * 128 * 3)  # 3 features, pooling factor 1
    assert reservation.last_reserved_bytes == {"dense": dense, "kjt": kjt}
    assert reserved.ddr_caps.tolist() == pytest.approx([(64 * MiB - dense - kjt) * 0.85] * 4)
    by_object = EmbeddingShardingPlanner(topology=topo, batch_size=128, storage_reservation=reservation)
    by_caps = EmbeddingShardingPlanner(topology=Topology(world_size=4, compute_device="cpu",
                                                         ddr_cap=int(reserved.ddr_caps[0])), batch_size=128)  # fmt: skip
    assert by_object.plan(_Model(), SHARDERS).to_dict() == by_caps.plan(_Model(), SHARDERS).to_dict()
    fixed = FixedPercentageStorageReservation(0.5).reserve(topo, 128, _Model(), SHARDERS)
    assert fixed.ddr_caps.tolist() == [32 * MiB] * 4
    with pytest.raises(PlannerError, match="no memory is left"):
        HeuristicalStorageReservation(0.1, dense_tensor_estimate=100 * MiB).reserve(topo, 128, _Model(), SHARDERS)


def test_uniform_and_grid_search_proposers() -> None:
    topo = _topo()
    uniform = EmbeddingShardingPlanner(topology=topo, proposer=UniformProposer())
    kinds = set(_types(uniform.plan(_Model(), SHARDERS)).values())
    assert len(kinds) == 1 and uniform.last_report is not None and uniform.last_report.proposer == "UniformProposer"
    grid = EmbeddingShardingPlanner(topology=topo, proposer=[GridSearchProposer(max_proposals=10_000)])
    grid_plan = grid.plan(_Model(), SHARDERS)
    assert grid.last_report is not None
    assert grid.last_report.cost_s.max() <= uniform.last_report.cost_s.max() + 1e-12  # the grid contains the uniform ones
    assert set(_types(grid_plan)) == {"t0", "t1", "t2"}
    with pytest.warns(UserWarning, match="exceed max_proposals=2"), pytest.raises(PlannerError, match="none of the proposals"):
        EmbeddingShardingPlanner(topology=topo, proposer=GridSearchProposer(max_proposals=2)).plan(_Model(), SHARDERS)


class _FavourRankOne(PerfModel):
    def rate(self, plan: list[ShardingOption]) -> float:
        return -sum(1 for so in plan for s in so.shards if s.rank == 1)


class _AllOnRankZero(GreedyPerfPartitioner):
    def partition(self, proposal: list[ShardingOption], storage_constraint: Topology) -> list[ShardingOption]:
        for so in proposal:
            for shard in so.shards:
                shard.rank = None if so.sharding_type == "data_parallel" else (0 if so.partition_by == "device" else shard.rank)
        return super().partition(proposal, storage_constraint) if any(
            so.partition_by != "device" for so in proposal) else proposal  # fmt: skip


def test_partitioners_and_perf_models() -> None:
    topo = _topo()
    constraints = {t: ParameterConstraints(sharding_types=["table_wise"]) for t in ("t0", "t1", "t2")}
    packed = EmbeddingShardingPlanner(topology=topo, constraints=constraints, partitioner=_AllOnRankZero()).plan(_Model(), SHARDERS)
    assert {ps.ranks[0] for ps in packed.plan["ebc"].values()} == {0}
    rated = EmbeddingShardingPlanner(topology=topo, constraints=constraints, proposer=GreedyProposer(),
                                     performance_model=_FavourRankOne(), partitioner=_AllOnRankZero())  # fmt: skip
    assert {ps.ranks[0] for ps in rated.plan(_Model(), SHARDERS).plan["ebc"].values()} == {0}
    balanced = EmbeddingShardingPlanner(topology=topo, partitioner=GreedyPerfPartitioner(SortBy.PERF, balance_modules=True))
    plan = balanced.plan(_Model(), SHARDERS)
    assert balanced.last_report is not None and (balanced.last_report.ddr_bytes <= topo.ddr_caps).all()
    for sort_by in SortBy:
        EmbeddingShardingPlanner(topology=topo, partitioner=GreedyPerfPartitioner(sort_by)).plan(_Model(), SHARDERS)
    # Called directly on the enumerator's options, as torchrec's tests do.
    options = EmbeddingEnumerator(topo).enumerate(_Model(), SHARDERS)
    proposal = [next(so for so in options if so.name == t and so.sharding_type == "table_wise") for t in ("t0", "t1", "t2")]
    placed = GreedyPerfPartitioner().partition(proposal, topo)
    assert sorted(so.shards[0].rank for so in placed) == [0, 1, 2]  # three tables, least-loaded ranks
    assert NoopPerfModel(topo).rate(placed) == max(so.total_perf for so in placed)
    assert set(_types(plan)) == {"t0", "t1", "t2"}


def test_parameter_constraints_torchrec_fields() -> None:
    c = ParameterConstraints(sharding_types=["table_wise"], pooling_factors=[2.0], num_poolings=[2.0], is_weighted=True,
                             enforce_hbm=True, stochastic_rounding=False, feature_names=["t0f0"], use_virtual_table=False)  # fmt: skip
    assert c.num_poolings == [2.0] and c.is_weighted
    topo = _topo()
    one = EmbeddingShardingPlanner(topology=topo, constraints={"t0": ParameterConstraints(sharding_types=["table_wise"])})
    two = EmbeddingShardingPlanner(topology=topo, constraints={"t0": ParameterConstraints(sharding_types=["table_wise"],
                                                                                          num_poolings=[2.0])})  # fmt: skip
    one.plan(_Model(), SHARDERS)
    two.plan(_Model(), SHARDERS)
    cost = {p: next(t.cost_s for t in p.last_report.tables if t.table == "t0") for p in (one, two)}
    assert cost[two] > cost[one]
    with pytest.raises(ValueError, match="num_poolings must be positive"):
        ParameterConstraints(num_poolings=[0.0])
    with pytest.raises(TypeError, match="enumerator must be a Enumerator"):
        EmbeddingShardingPlanner(enumerator=object())  # type: ignore[arg-type]
