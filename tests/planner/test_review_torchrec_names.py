"""torchrec's MemoryBalancedPartitioner and InferenceStorageReservation under lightrec: placements
and reserved bytes checked against values worked out here by hand from torchrec's rules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    GreedyPerfPartitioner,
    InferenceStorageReservation,
    MemoryBalancedPartitioner,
    ParameterConstraints,
    PlannerError,
    SortBy,
    Topology,
)
from lightrec.distributed.planner.partitioners import MemoryBalancedPartitioner as FromPartitioners
from lightrec.distributed.planner.storage_reservations import InferenceStorageReservation as FromReservations
from lightrec.distributed.planner.types import Perf, Shard, ShardingOption, Storage
from tests.planner.stand_in import MiB, StandInSharder, tables

SHARDERS = [StandInSharder()]


def _option(name: str, mib: int, perf: float, on_hbm: bool = False) -> ShardingOption:
    """A one-shard table-wise option of ``mib`` MiB whose shard costs ``perf`` s."""
    storage = Storage(hbm=mib * MiB, ddr=0) if on_hbm else Storage(hbm=0, ddr=mib * MiB)
    shard = Shard([10, 4], [0, 0], storage=storage, perf=Perf(perf, 0.0, 0.0, 0.0))
    return ShardingOption(name, torch.empty(0), ("ebc", nn.Module()), [1.0], 8, "table_wise", "device", "fused",
                          shards=[shard])  # fmt: skip


def _ranks(proposal: list[ShardingOption]) -> dict[str, int | None]:
    return {so.name: so.shards[0].rank for so in proposal}


def _proposal(t3_perf: float, t2_perf: float, on_hbm: bool = False) -> list[ShardingOption]:
    return [_option("t0", 500, 10.0, on_hbm), _option("t1", 10, 9.0, on_hbm), _option("t2", 10, t2_perf, on_hbm),
            _option("t3", 400, t3_perf, on_hbm)]  # fmt: skip


TOPO = Topology(world_size=2, compute_device="cpu", ddr_cap=1024 * MiB)


def test_memory_balanced_moves_memory_when_the_rating_holds() -> None:
    # Greedy by perf: t0 -> 0, t1 -> 1, t2 -> 1 (loads 10, 10), t3 -> 0 (tie: lowest rank):
    # ranks hold 900 and 20 MiB. t3 on rank 1 rates the same (busiest rank 11), with 500 / 420 MiB.
    greedy = GreedyPerfPartitioner(SortBy.PERF).partition(_proposal(1.0, 1.0), TOPO)
    assert _ranks(greedy) == {"t0": 0, "t1": 1, "t2": 1, "t3": 0}
    balanced = MemoryBalancedPartitioner().partition(_proposal(1.0, 1.0), TOPO)
    assert _ranks(balanced) == {"t0": 0, "t1": 1, "t2": 1, "t3": 1}
    assert MemoryBalancedPartitioner is FromPartitioners


@pytest.mark.parametrize(("tolerance", "t3_rank"), [(0.02, 0), (0.05, 1)])
def test_memory_balanced_keeps_the_greedy_plan_beyond_tolerance(tolerance: float, t3_rank: int) -> None:
    # t2 costs 1.5: t2 -> 1 (10.5), t3 -> 0 (10 < 10.5), rated 11; t3 on rank 1 rates 11.5, 4.5% worse.
    placed = MemoryBalancedPartitioner(tolerance=tolerance).partition(_proposal(1.0, 1.5), TOPO)
    assert _ranks(placed) == {"t0": 0, "t1": 1, "t2": 1, "t3": t3_rank}


def test_memory_balanced_search_count_and_hbm() -> None:
    # No capped partition tried: the greedy plan stays.
    assert _ranks(MemoryBalancedPartitioner(max_search_count=0).partition(_proposal(1.0, 1.0), TOPO))["t3"] == 0
    cuda = Topology(world_size=2, compute_device="cuda", hbm_cap=1024 * MiB)
    assert _ranks(MemoryBalancedPartitioner().partition(_proposal(1.0, 1.0, on_hbm=True), cuda))["t3"] == 1


def test_greedy_hbm_per_device_caps_every_rank() -> None:
    capped = GreedyPerfPartitioner(SortBy.PERF).partition(_proposal(1.0, 1.0), TOPO, hbm_per_device=700 * MiB)
    assert _ranks(capped) == {"t0": 0, "t1": 1, "t2": 1, "t3": 1}
    with pytest.raises(PlannerError, match="no rank has room for shard 0 of table 'ebc.t0'"):
        GreedyPerfPartitioner(SortBy.PERF).partition(_proposal(1.0, 1.0), TOPO, hbm_per_device=400 * MiB)
    with pytest.raises(ValueError, match="hbm_per_device=-5"):
        GreedyPerfPartitioner().partition(_proposal(1.0, 1.0), TOPO, hbm_per_device=-5)


def test_memory_balanced_in_the_planner() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=1024 * MiB)
    constraints = {f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(4)}
    planner = EmbeddingShardingPlanner(topology=topo, constraints=constraints, partitioner=MemoryBalancedPartitioner())
    model = nn.Module()
    model.ebc = tables([(1000, 16), (50_000, 64), (300, 8), (2000, 32)])
    plan = planner.plan(model, SHARDERS)
    assert sorted(plan.plan["ebc"]) == ["t0", "t1", "t2", "t3"]
    assert all(len(ps.ranks) == 1 and ps.ranks[0] in (0, 1) for ps in plan.plan["ebc"].values())
    assert planner.last_report is not None and (planner.last_report.ddr_bytes <= topo.ddr_caps).all()


def test_memory_balanced_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"max_search_count=-1\)"):
        MemoryBalancedPartitioner(max_search_count=-1)
    with pytest.raises(ValueError, match=r"tolerance=-0.1\)"):
        MemoryBalancedPartitioner(tolerance=-0.1)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = tables([(1000, 16), (50_000, 64), (300, 8)])
        self.dense = nn.Linear(256, 512)  # 131_584 float32 parameters
        self.register_buffer("steps", torch.zeros(10, dtype=torch.int64))  # 80 bytes


DENSE = 131_584 * 4 + 80


def test_inference_reservation_percentage_then_dense_then_ids() -> None:
    topo = Topology(world_size=4, compute_device="cpu", ddr_cap=64 * MiB)
    reservation = InferenceStorageReservation(percentage=0.15)
    assert reservation.last_reserved_topology is None
    reserved = reservation.reserve(topo, 128, _Model(), SHARDERS)
    kjt = 8 * 128 * 3  # 3 tables of one feature, pooling factor 1
    assert reservation.last_reserved_bytes == {"dense": DENSE, "kjt": kjt}
    assert reserved.ddr_caps.tolist() == [math.floor(64 * MiB * 0.85) - DENSE - kjt] * 4
    assert reservation.last_reserved_topology is not None
    assert reservation.last_reserved_topology.ddr_caps.tolist() == reserved.ddr_caps.tolist()
    assert FromReservations is InferenceStorageReservation
    # The constraints' pooling factors and batch sizes count ids; an estimate replaces the dense part.
    constraints = {"t0": ParameterConstraints(pooling_factors=[2.5], batch_sizes=[64])}
    given = InferenceStorageReservation(0.0, dense_tensor_estimate=1000)
    out = given.reserve(topo, 128, _Model(), SHARDERS, constraints)
    ids = 64 * 2.5 + 128 + 128
    assert given.last_reserved_bytes == {"dense": 1000.0, "kjt": 8 * ids}
    assert out.ddr_caps.tolist() == [64 * MiB - 1000 - 8 * ids] * 4


def test_inference_reservation_on_cuda_and_in_the_planner() -> None:
    cuda = Topology(world_size=2, compute_device="cuda", hbm_cap=32 * MiB, ddr_cap=256 * MiB)
    reserved = InferenceStorageReservation(0.1).reserve(cuda, 64, _Model(), SHARDERS)
    assert reserved.hbm_caps.tolist() == [math.floor(32 * MiB * 0.9) - DENSE - 8 * 64 * 3] * 2
    assert reserved.ddr_caps.tolist() == [256 * MiB] * 2
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=64 * MiB)
    by_object = EmbeddingShardingPlanner(topology=topo, batch_size=64, storage_reservation=InferenceStorageReservation(0.1))
    caps = math.floor(64 * MiB * 0.9) - DENSE - 8 * 64 * 3
    by_caps = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu", ddr_cap=caps), batch_size=64)
    assert by_object.plan(_Model(), SHARDERS).to_dict() == by_caps.plan(_Model(), SHARDERS).to_dict()


def test_inference_reservation_bad_input() -> None:
    with pytest.raises(ValueError, match=r"InferenceStorageReservation\(percentage=1.0\)"):
        InferenceStorageReservation(1.0)
    with pytest.raises(ValueError, match="dense_tensor_estimate=-1"):
        InferenceStorageReservation(0.1, dense_tensor_estimate=-1)
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=64 * MiB)
    with pytest.raises(PlannerError, match="no memory is left"):
        InferenceStorageReservation(0.1, dense_tensor_estimate=100 * MiB).reserve(topo, 64, _Model(), SHARDERS)
