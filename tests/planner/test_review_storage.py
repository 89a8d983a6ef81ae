"""Review of the storage model against the formulas of docs/planner.md, computed here by hand:
per-feature pooling factors, batch sizes and poolings, optimizer state, weighted tables (a weight
per id), the storage reservation's input batch, and the report's per-rank totals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    HeuristicalStorageReservation,
    ParameterConstraints,
    Topology,
)
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from tests.planner.stand_in import StandInEBC, StandInSharder, tables

R, D, W = 1000, 16, 2
# two features: pooling 2 and 3, batch 10 and 20, poolings 1 and 2 (torchrec's per-feature lists)
N = 10 * 1 * 2 + 20 * 2 * 3  # ids per rank per step: 140
BF = 10 * 1 + 20 * 2  # bags per rank per step: 50
OPT = {"sgd": (0, 0), "rowwise_adagrad": (0, 1), "adam": (2, 0), "partial_rowwise_adam": (1, 1)}


def _module() -> StandInEBC:
    return StandInEBC([EmbeddingBagConfig(name="t", num_embeddings=R, embedding_dim=D, feature_names=["a", "b"])])


def _constraints(stype: str, **kw: object) -> dict[str, ParameterConstraints]:
    return {"t": ParameterConstraints(sharding_types=[stype], pooling_factors=[2.0, 3.0], batch_sizes=[10, 20],
                                      num_poolings=[1.0, 2.0], **kw)}  # type: ignore[arg-type]  # fmt: skip


def _storage(stype: str, optimizer: str, module: object = None, **kw: object) -> tuple[float, np.ndarray]:
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=W, compute_device="cpu"), constraints=_constraints(stype, **kw))
    sharder = StandInSharder(type(module) if module is not None else StandInEBC, fused_params={"optimizer": optimizer})
    planner.plan(module if module is not None else _module(), [sharder])
    report = planner.last_report
    return report.tables[0].storage_bytes, report.ddr_bytes


def _by_hand(stype: str, optimizer: str, id_bytes: int = 8) -> float:
    """docs/planner.md, "Storage": weights + optimizer + dense gradient + buffers, summed over shards/replicas."""
    s_elem, s_row = OPT[optimizer]
    if stype == "data_parallel":  # one replica per rank, dense kernel
        r, n, b, o = R, N, 0, BF
        one = r * D * 4 + 4 * (r * D * s_elem + r * s_row) + 4 * r * D + id_bytes * n + 4 * BF + 4 * o * D * 2
        return W * one
    shards = [R // W] * W if stype == "row_wise" else [R]
    total = 0.0
    for r in shards:
        n = W * N * r / R
        b = o = W * BF
        total += r * D * 4 + 4 * (r * D * s_elem + r * s_row) + id_bytes * n + 4 * b + 4 * o * D * 2
    return total


@pytest.mark.parametrize("optimizer", sorted(OPT))
@pytest.mark.parametrize("stype", ["table_wise", "row_wise", "data_parallel"])
def test_storage_counts_weights_optimizer_state_and_buffers(stype: str, optimizer: str) -> None:
    got, per_rank = _storage(stype, optimizer)
    assert got == pytest.approx(_by_hand(stype, optimizer), rel=1e-12)
    assert per_rank.sum() == pytest.approx(got, rel=1e-12)


@pytest.mark.parametrize("stype", ["table_wise", "row_wise", "data_parallel"])
def test_weighted_tables_count_a_float32_weight_per_id(stype: str) -> None:
    # torchrec's ParameterConstraints(is_weighted=True): every id travels with a weight. Used to be ignored.
    plain, _ = _storage(stype, "sgd")
    weighted, _ = _storage(stype, "sgd", is_weighted=True)
    assert weighted == pytest.approx(_by_hand(stype, "sgd", id_bytes=12), rel=1e-12)
    assert weighted - plain == pytest.approx(W * 4 * N, rel=1e-12)  # every replica, or the W ranks' ids
    # a weighted collection (is_weighted() True) counts the same without a constraint
    configs = [EmbeddingBagConfig(name="t", num_embeddings=R, embedding_dim=D, feature_names=["a", "b"])]
    from_module, _ = _storage(stype, "sgd", module=EmbeddingBagCollection(configs, is_weighted=True, device="meta"))
    unweighted, _ = _storage(stype, "sgd", module=EmbeddingBagCollection(configs, is_weighted=False, device="meta"))
    assert from_module == pytest.approx(weighted, rel=1e-12) and unweighted == pytest.approx(plain, rel=1e-12)


def test_weighted_tables_cost_more_to_send() -> None:
    costs = []
    for weighted in (False, True):
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=W, compute_device="cpu"),
                                           constraints=_constraints("table_wise", is_weighted=weighted))  # fmt: skip
        planner.plan(_module(), [StandInSharder()])
        costs.append(planner.last_report.tables[0].cost_s)
    assert costs[1] > costs[0]


def test_heuristical_reservation_counts_the_constraints_batch() -> None:
    # ids and bags of the input batch from the per-feature batch sizes and poolings (used to take the
    # planner's batch size for every feature and ignore num_poolings: 9520 bytes instead of 37600)
    reservation = HeuristicalStorageReservation(0.0, dense_tensor_estimate=0)
    EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), batch_size=7,
                             storage_reservation=reservation, constraints=_constraints("table_wise")).plan(
        _module(), [StandInSharder()])  # fmt: skip
    assert reservation.last_reserved_bytes == {"dense": 0.0, "kjt": 20 * (12 * N + 4 * BF)}


def test_report_totals_and_idle_ranks_are_exact() -> None:
    # 9 ranks, 3 per host; the old partition/refine kept running sums (cap - free, mem - old + new)
    # and reported ~1e-8 bytes on a rank that holds nothing ("9.77e-15 MiB" in the text).
    module = tables([(7, 8), (2_000_000, 36), (100, 100)])
    constraints = {
        "t0": ParameterConstraints(sharding_types=["row_wise", "table_column_wise"]),
        "t2": ParameterConstraints(sharding_types=["table_row_wise", "table_wise"], pooling_factors=[27.225604402145244]),
    }
    topo = Topology(world_size=9, local_world_size=3, compute_device="cpu", ddr_cap=512 * 1024**2)
    planner = EmbeddingShardingPlanner(topology=topo, constraints=constraints)
    plan = planner.plan(module, [StandInSharder()])
    report = planner.last_report
    evaluated = planner.evaluate(module, [StandInSharder()], plan)
    held = {r for ps in plan.plan[""].values() for r in ps.ranks}
    for r in range(9):
        if r not in held:
            assert report.ddr_bytes[r] == 0.0 and report.cost_s[r] == 0.0
    np.testing.assert_allclose(report.ddr_bytes, evaluated.ddr_bytes, rtol=1e-12, atol=0)
    np.testing.assert_allclose(report.cost_s, evaluated.cost_s, rtol=1e-12, atol=0)
    assert math.isclose(sum(t.storage_bytes for t in report.tables), float(report.ddr_bytes.sum()), rel_tol=1e-12)
    assert math.isclose(sum(t.cost_s for t in report.tables), float(report.cost_s.sum()), rel_tol=1e-12)
    text = str(report).splitlines()
    for r in sorted(set(range(9)) - held):
        assert text[2 + r].split("|")[2].strip() == "0 MiB / 512 MiB", text[2 + r]
    summary = "\n".join(text)
    assert "3 tables on 9 ranks (cpu)" in summary
    assert f"max {report.cost_s.max() * 1e3:.4g} ms, mean {report.cost_s.mean() * 1e3:.4g} ms" in summary
    assert f"imbalance (max/mean) {report.cost_s.max() / report.cost_s.mean():.3f}" in summary
