"""Review of PlannerError: it names the table, and the memory needed against what the rank it must
go on has -- with uneven caps (row-wise shard i on rank i, a replica on every rank, a host's ranks),
a GPU whose memory is smaller than one table, and a tiered table whose SSD is too small."""

from __future__ import annotations

import pytest

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    Topology,
)
from tests.planner.stand_in import GiB, MiB, StandInSharder, tables


def _error(topo: Topology, constraints: dict, spec: list[tuple[int, int]]) -> PlannerError:
    with pytest.raises(PlannerError) as info:
        EmbeddingShardingPlanner(topology=topo, constraints=constraints).plan(tables(spec), [StandInSharder()])
    return info.value


@pytest.mark.parametrize(
    ("stype", "where"),
    [
        ("row_wise", "its shard 1 goes on rank 1, which has 0.098 GiB"),
        ("data_parallel", "every rank holds a replica and rank 1 has 0.098 GiB"),
        ("table_row_wise", "its shard 1 goes on rank 1, which has 0.098 GiB"),
    ],
)
def test_uneven_caps_name_the_rank_that_is_too_small(stype: str, where: str) -> None:
    # Ranks 0 and 2 have 4 GiB, ranks 1 and 3 have 100 MiB. A 2M x 64 table split row-wise needs
    # ~123 MiB per shard: it does not fit because shard 1 must go on rank 1. The message used to say
    # "needs at least 0.120 GiB ...; a rank has 4.000 GiB" (and needed_bytes < available_bytes).
    caps = [4096 * MiB, 100 * MiB, 4096 * MiB, 100 * MiB]
    topo = Topology(world_size=4, local_world_size=2, compute_device="cpu", ddr_cap=caps)
    kernels = ["dense"] if stype == "data_parallel" else ["fused"]
    err = _error(topo, {"t0": ParameterConstraints(sharding_types=[stype], compute_kernels=kernels)}, [(2_000_000, 64)])
    msg = str(err)
    assert "0.098 GiB to 4.000 GiB of DDR per rank" in msg and "of DDR each" not in msg
    assert "table 't0' [2000000 x 64]" in msg and where in msg
    assert err.tables == ["t0"]
    assert err.available_bytes == 100 * MiB
    assert err.needed_bytes > err.available_bytes


def test_equal_caps_keep_the_plain_message() -> None:
    err = _error(Topology(world_size=2, compute_device="cpu", ddr_cap=GiB),
                 {"t0": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["fused"])}, [(10_000_000, 64)])  # fmt: skip
    assert "with 1.000 GiB of DDR each" in str(err) and "; a rank has 1.000 GiB" in str(err)
    assert err.available_bytes == GiB and err.needed_bytes > GiB


def test_gpu_smaller_than_one_table() -> None:
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=10 * MiB)
    err = _error(topo, {"t0": ParameterConstraints(compute_kernels=["fused"])}, [(1_000_000, 64), (100, 8)])
    msg = str(err)
    assert err.tables == ["t0"] and "'t1'" not in msg
    assert "with 0.010 GiB of HBM each" in msg and "Topology(hbm_cap=...)" in msg
    assert err.available_bytes == 10 * MiB
    # the smallest option splits the 244 MiB table in two: at least half of it on one rank
    assert err.needed_bytes > 1_000_000 * 64 * 4 / 2
    # with the tiered kernels allowed the table keeps its rows in host memory behind a cache
    planner = EmbeddingShardingPlanner(topology=topo)
    plan = planner.plan(tables([(1_000_000, 64), (100, 8)]), [StandInSharder()])
    assert plan.plan[""]["t0"].compute_kernel in ("fused_uvm_caching", "key_value")
    assert (planner.last_report.hbm_bytes <= 10 * MiB).all()


def test_tiered_table_whose_ssd_is_too_small_reports_the_ssd() -> None:
    # The cache fits in DDR; the rows (2.4 GiB) do not fit the 1 GiB SSD: needed/available are the SSD's.
    topo = Topology(world_size=1, compute_device="cpu", ddr_cap=2 * GiB, ssd_cap=GiB)
    err = _error(topo, {"t0": ParameterConstraints(sharding_types=["table_wise"])}, [(10_000_000, 64)])
    assert err.tables == ["t0"] and "GiB of SSD" in str(err)
    assert err.available_bytes == GiB
    assert err.needed_bytes >= 10_000_000 * 64 * 4
