"""The planner and tables larger than memory: tiered kernels only when memory demands them, a cache
size chosen by the expected misses, bytes per tier and hit rates in the report, refusals with the
numbers when nothing fits."""

from __future__ import annotations

import numpy as np
import pytest

from lightrec.distributed.planner import (
    CacheParams,
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    ShardingPlan,
    Topology,
    ZipfCacheStatistics,
)
from lightrec.distributed.planner.plan import CacheStatistics
from lightrec.distributed.planner.shard_estimators import cache_model
from tests.planner.stand_in import StandInSharder, tables

GiB = 1024**3
BIG = [(64_000_000, 64), (1_000_000, 64), (100_000, 64)]  # 15.5 GiB + 0.24 GiB + 24 MiB of fp32 rows
SHARDER = StandInSharder(fused_params={"optimizer": "rowwise_adagrad"})


def _plan(topo: Topology, constraints: dict | None = None, sharder: StandInSharder = SHARDER) -> tuple[ShardingPlan, object]:
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=2048, constraints=constraints)
    plan = planner.plan(tables(BIG), [sharder])
    return plan, planner.last_report


def _kernels(plan: ShardingPlan) -> dict[str, tuple[str, float | None]]:
    return {
        name: (ps.compute_kernel, None if ps.cache_params is None else ps.cache_params.load_factor)
        for name, ps in plan.plan[""].items()
    }


def test_tables_that_fit_stay_in_memory() -> None:
    plan, report = _plan(Topology(world_size=2, compute_device="cpu", ddr_cap=40 * GiB))
    assert {k for k, _ in _kernels(plan).values()} == {"fused"}
    assert not report.tiered_tables and "SSD" not in str(report)


def test_a_table_larger_than_memory_goes_to_ssd_with_a_cache_sized_by_the_cost_model() -> None:
    chosen = {}
    for cap in (4, 1):
        plan, report = _plan(Topology(world_size=1, compute_device="cpu", ddr_cap=cap * GiB))
        kernels = _kernels(plan)
        assert kernels["t0"][0] == "key_value" and kernels["t1"] == ("fused", None)  # only the big one
        chosen[cap] = kernels["t0"][1]
        (t0,) = report.tiered_tables
        assert t0.ssd_bytes == pytest.approx(64_000_000 * (64 + 1) * 4)  # rows and row-wise state on SSD
        assert 0.5 < t0.expected_hit_rate < 1.0 and t0.storage_bytes < cap * GiB
        assert report.ddr_bytes[0] <= cap * GiB and report.ssd_bytes[0] == pytest.approx(t0.ssd_bytes)
        text = str(report)
        assert "SSD used / cap" in text and f"cache load factor {chosen[cap]:g}, expected hit rate" in text
        assert ShardingPlan.from_json(plan.to_json()) == plan  # the chosen cache size is in the plan
    assert chosen[4] > chosen[1]  # the biggest cache that fits: fewer misses are cheaper


def test_gpu_prefers_host_memory_over_ssd() -> None:
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=2 * GiB, ddr_cap=64 * GiB)
    plan, report = _plan(topo)
    assert _kernels(plan)["t0"][0] == "fused_uvm_caching"  # PCIe beats the SSD for the misses
    (t0,) = report.tiered_tables
    assert t0.host_bytes > 15 * GiB and t0.ssd_bytes == 0
    assert report.ddr_bytes.sum() == pytest.approx(t0.host_bytes)  # DDR behind the GPU holds the rows


def test_constraints_force_and_size_a_tiered_kernel() -> None:
    stats = ZipfCacheStatistics(alpha=1.2)
    constraints = {
        "t2": ParameterConstraints(compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.3, stats=stats))
    }
    plan, report = _plan(Topology(world_size=1, compute_device="cpu", ddr_cap=64 * GiB), constraints)
    assert _kernels(plan) == {"t0": ("fused", None), "t1": ("fused", None), "t2": ("key_value", 0.3)}
    hit = next(t for t in report.tables if t.table == "t2").expected_hit_rate
    assert hit == pytest.approx(stats.model(0.3, 100_000, 2048)[0])
    again = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu", ddr_cap=64 * GiB), batch_size=2048, constraints=constraints
    ).evaluate(tables(BIG), [SHARDER], plan)
    assert [t.expected_hit_rate for t in again.tables] == [t.expected_hit_rate for t in report.tables]
    assert again.ssd_bytes == pytest.approx(report.ssd_bytes)


def test_nothing_fits_is_refused_with_the_numbers() -> None:
    topo = Topology(world_size=1, compute_device="cpu", ddr_cap=2 * GiB, ssd_cap=8 * GiB)
    with pytest.raises(PlannerError, match=r"(?s)table 't0'.*key_value.*15\.\d+ GiB of SSD.*a rank has 8\.000 GiB of SSD"
                       r".*Topology\(ssd_cap=\.\.\.\)") as info:  # fmt: skip
        _plan(topo)
    assert info.value.tables == ["t0"]
    with pytest.raises(PlannerError, match=r"(?s)needs at least 0\.4\d+ GiB on one rank.*key_value"):
        _plan(Topology(world_size=1, compute_device="cpu", ddr_cap=GiB // 5))  # even its slot index does not fit
    no_tiering = {"t0": ParameterConstraints(compute_kernels=["fused"])}
    with pytest.raises(PlannerError, match=r"allow a tiered kernel for these tables"):
        _plan(Topology(world_size=1, compute_device="cpu", ddr_cap=2 * GiB), no_tiering)


class _Measured(CacheStatistics):
    """torchrec-style statistics: a measured miss-rate curve."""

    @property
    def expected_lookups(self) -> float:
        return 1000.0

    def expected_miss_rate(self, clf: float) -> float:
        return 0.5 * (1.0 - clf)

    @property
    def cacheability(self) -> float:
        return 0.5


def test_cache_statistics() -> None:
    zipf = ZipfCacheStatistics(alpha=1.05, rows=1_000_000, ids_per_step=20_000)
    rates = [zipf.expected_miss_rate(c) for c in (0.0, 0.01, 0.1, 0.5, 1.0)]
    assert rates[0] == pytest.approx(1.0) and rates[-1] == pytest.approx(0.0)
    assert np.all(np.diff(rates) < 0)
    assert 0 < zipf.expected_lookups < 20_000  # repeats among the ids of a step
    hit, fetched = cache_model(_Measured(), 0.2, shard_rows=500, table_rows=1000, shard_ids=10)
    assert hit == pytest.approx(0.6) and fetched == pytest.approx(0.4 * 1000 * 0.5)
    with pytest.raises(ValueError, match="alpha"):
        ZipfCacheStatistics(alpha=0.0)


def test_torchrec_planner_parts_see_and_keep_tiered_options() -> None:
    """torchrec's planner classes over tiered options: the enumerator's ShardingOptions carry the cache
    load factor, and a custom proposer/partitioner pair (the ShardingOption protocol) plans the big table
    on SSD within the SSD and memory caps, with the same bytes per tier in the report."""
    from lightrec.distributed.planner import GreedyPerfPartitioner, SortBy, UniformProposer
    from lightrec.distributed.planner.enumerators import enumerate_options
    from lightrec.distributed.planner.options import option_index, to_sharding_options
    from lightrec.distributed.planner.tables import collect_tables, find_shardable_modules

    topo = Topology(world_size=1, compute_device="cpu", ddr_cap=5 * GiB)
    model = tables(BIG)
    modules = find_shardable_modules(model, [SHARDER])
    arrays = collect_tables(modules, topo, {}, 2048, tiered=True)
    opts = enumerate_options(arrays, topo)
    sos = to_sharding_options(arrays, opts, modules, topo, 2048)
    tiered = [so for so in sos if so.compute_kernel == "key_value"]
    assert tiered and all(so.cache_load_factor is not None and so.cache_load_factor > 0 for so in tiered)
    assert len({so.cache_load_factor for so in tiered if so.name == "t0"}) > 1  # several cache sizes offered
    for so in tiered:  # a copy without its recorded index maps back to the option of its cache size
        so._option_index = None
        assert opts.clf[option_index(so, arrays, opts)] == pytest.approx(so.cache_load_factor)
    assert all(so.cache_params is None for so in sos if so.compute_kernel == "fused")

    planner = EmbeddingShardingPlanner(
        topology=topo, batch_size=2048, proposer=UniformProposer(), partitioner=GreedyPerfPartitioner(SortBy.PERF)
    )
    plan = planner.plan(model, [SHARDER])
    assert _kernels(plan)["t0"][0] == "key_value"
    report = planner.last_report
    assert report.ssd_bytes[0] == pytest.approx(64_000_000 * (64 + 1) * 4)
    assert report.ddr_bytes[0] <= 5 * GiB
