"""lightrec.distributed.planner's entry points (planning.py) and the default sharders: plan and plan report.

* ``get_default_sharders`` builds the EBC and EC sharders from ``fused_params`` + ``kernel_backend``
  (errors name a bad backend); ``topology_for`` maps a world onto a ``Topology``.
* ``plan_sharding`` gives the planner's plan and report; collectively on 2 gloo ranks every rank
  gets the same plan and report, and ``DistributedModelParallel`` without a plan uses exactly that
  plan. ``plan_report_for`` of the sharded model equals the planner's ``evaluate`` of the unsharded one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.multiprocess import run_ranks


def test_default_sharders_carry_fused_params_and_kernel_backend() -> None:
    from lightrec.distributed import (
        EmbeddingBagCollectionSharder,
        EmbeddingCollectionSharder,
        ManagedCollisionEmbeddingBagCollectionSharder,
        ManagedCollisionEmbeddingCollectionSharder,
        get_default_sharders,
    )
    from lightrec.distributed.sharding_plan import get_default_sharders as torchrec_path

    assert torchrec_path is get_default_sharders
    ebc, ec, fp, fused, mc_ebc, mc_ec = get_default_sharders(
        {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.05}, "torch"
    )
    assert isinstance(ebc, EmbeddingBagCollectionSharder) and isinstance(ec, EmbeddingCollectionSharder)
    assert fused.fused_params == {} and fused.kernel_backend == "torch"  # a fused collection keeps its optimizer
    assert isinstance(mc_ebc, ManagedCollisionEmbeddingBagCollectionSharder)
    assert isinstance(mc_ec, ManagedCollisionEmbeddingCollectionSharder)
    for sharder in (ebc, ec, fp, mc_ebc, mc_ec):
        assert sharder.kernel_backend == "torch"
        assert sharder.fused_params["optimizer"] == "ROWWISE_ADAGRAD"  # the enum name
        assert sharder.fused_params["learning_rate"] == 0.05
    assert all(s.fused_params == {} and s.kernel_backend == "auto" for s in get_default_sharders())
    with pytest.raises(ValueError, match="kernel_backend must be one of .* got 'cuda'"):
        get_default_sharders(kernel_backend="cuda")


def test_topology_for() -> None:
    from lightrec.distributed.planner import topology_for

    t = topology_for(8, "cuda", 4)
    assert (t.world_size, t.local_world_size, t.compute_device) == (8, 4, "cuda")
    t = topology_for(6, "cpu", 4)  # 4 does not divide 6: one host
    assert (t.world_size, t.local_world_size, t.compute_device) == (6, 6, "cpu")
    assert topology_for(2, "meta").compute_device == "cpu"


def test_plan_sharding_is_the_planners_plan_and_report() -> None:
    from lightrec.distributed import get_default_sharders
    from lightrec.distributed.planner import EmbeddingShardingPlanner, plan_sharding, topology_for
    from tests.distributed.test_dmp import _dlrm

    model, sharders, topology = _dlrm("meta"), get_default_sharders(), topology_for(3, "cpu")
    planned = plan_sharding(model, sharders, topology, batch_size=64)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=64)
    assert planned.plan.to_json() == planner.plan(model, sharders).to_json()
    assert planned.report is not None and planner.last_report is not None
    np.testing.assert_array_equal(planned.report.cost_s, planner.last_report.cost_s)
    assert [t.ranks for t in planned.report.tables] == [t.ranks for t in planner.last_report.tables]


def test_the_cpu_report_says_which_kernel_serves_the_fused_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per optimizer and dim bucket, the verdict the kernels take when built (and why); a sharder's
    own backend is named as its choice; tables that are not ``fused`` and CUDA plans have no lines."""
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec._fbgemm import fbgemm_available
    from lightrec.distributed import get_default_sharders
    from lightrec.distributed.planner import plan_report_for, plan_sharding, topology_for
    from lightrec.kernels.cpu_kernel_choice import forget_verdicts

    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(name=f"t{i}", num_embeddings=50_000, embedding_dim=d, feature_names=[f"f{i}"])
         for i, d in enumerate((16, 48, 64))], device="meta")  # fmt: skip
    adam = {"optimizer": "adam", "learning_rate": 0.01}
    adagrad = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.01}
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "torch")
    forget_verdicts()  # decided per process: forget the suite's pinned fbgemm verdicts
    try:
        report = plan_sharding(ebc, get_default_sharders(adam), topology_for(2, "cpu")).report
        # fbgemm has no CPU Adam (or, under LIGHTREC_BLOCK_FBGEMM=1, no fbgemm at all): the torch kernel
        why = "fbgemm has no CPU kernel for ADAM" if fbgemm_available() else "fbgemm is unavailable"
        assert report is not None and report.kernel_lines[0] == "fused adam, kernel_backend='auto':"
        assert [line.split(" (fbgemm ")[0] for line in report.kernel_lines[1:]] == [
            "  dim <= 16 (1 tables): torch: fbgemm unsupported", "  dim <= 64 (2 tables): torch: fbgemm unsupported",
        ] and all(why in line for line in report.kernel_lines[1:]), report.kernel_lines
        assert "CPU kernels of the fused tables:\nfused adam" in report.to_text()
        report = plan_sharding(ebc, get_default_sharders(adagrad), topology_for(2, "cpu")).report
        assert report is not None
        if not fbgemm_available():  # nothing to choose between: the torch kernel, said so
            assert all("torch: fbgemm unsupported (fbgemm is unavailable" in line for line in report.kernel_lines[1:])
        else:
            assert report.kernel_lines == [
                "fused row_wise_adagrad, kernel_backend='auto':",
                "  dim <= 16 (1 tables): torch: forced (LIGHTREC_CPU_KERNEL=torch)",
                "  dim <= 64 (2 tables): torch: forced (LIGHTREC_CPU_KERNEL=torch)",
            ], report.kernel_lines
    finally:
        forget_verdicts()
    planned = plan_sharding(ebc, get_default_sharders(adam, "fbgemm"), topology_for(2, "cpu"))
    assert planned.report is not None
    assert planned.report.kernel_lines == ["fused adam (3 tables): kernel_backend='fbgemm' (chosen by the sharder)"]
    # the report of a given plan (the PlanReport callback's) says the same
    given = plan_report_for(ebc, planned.plan, topology_for(2, "cpu"), get_default_sharders(adam, "fbgemm"))
    assert given.kernel_lines == planned.report.kernel_lines
    small = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])],
                                   device="meta")  # fmt: skip
    report = plan_sharding(small, get_default_sharders(adam), topology_for(2, "cpu")).report
    assert report is not None and report.kernel_lines == []  # planned data-parallel / dense: no fused kernel
    report = plan_sharding(ebc, get_default_sharders(adam), topology_for(2, "cuda")).report
    assert report is not None and report.kernel_lines == [] and "CPU kernels" not in report.to_text()


def _collective_body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel, get_default_sharders
    from lightrec.distributed.planner import plan_report_for, plan_sharding, topology_for
    from tests.distributed.test_dmp import _dlrm

    topology = topology_for(world_size, "cpu")
    planned = plan_sharding(_dlrm("meta"), get_default_sharders(), topology, collective=True)
    dmp = DistributedModelParallel(_dlrm("meta"), device="cpu")
    report = plan_report_for(dmp.module, dmp.plan, topology, get_default_sharders())
    assert planned.report is not None
    return {
        "plan": planned.plan.to_json(),
        "cost": torch.from_numpy(planned.report.cost_s),
        "dmp_plan": dmp.plan.to_json(),
        "evaluated_storage": torch.from_numpy(report.ddr_bytes),
        "evaluated_cost": torch.from_numpy(report.cost_s),
    }


def test_collective_plan_is_the_same_on_every_rank_and_what_dmp_uses() -> None:
    from lightrec.distributed import get_default_sharders
    from lightrec.distributed.planner import EmbeddingShardingPlanner, ShardingPlan, topology_for
    from tests.distributed.test_dmp import _dlrm

    r0, r1 = run_ranks(_collective_body, 2, timeout=120)
    assert r0["plan"] == r1["plan"] == r0["dmp_plan"] == r1["dmp_plan"]
    assert torch.equal(r0["cost"], r1["cost"])
    # the report of the plan in use, rebuilt from the sharded model, is the planner's estimate of it
    expected = EmbeddingShardingPlanner(topology=topology_for(2, "cpu")).evaluate(
        _dlrm("meta"), get_default_sharders(), ShardingPlan.from_json(r0["plan"])
    )
    for r in (r0, r1):
        np.testing.assert_allclose(r["evaluated_storage"].numpy(), expected.ddr_bytes)
        np.testing.assert_allclose(r["evaluated_cost"].numpy(), expected.cost_s)
