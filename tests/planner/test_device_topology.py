"""Topology(compute_device="cuda") reads each rank's HBM from the GPU, and the plan report shows it.

The device-property query is not a collective; it is patched here to stand for GPUs of known sizes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    Topology,
)
from lightrec.distributed.planner.types import device_hbm_caps
from tests.planner.stand_in import StandInSharder, tables

GiB = 1024**3


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """This host has an 80 GiB and a 40 GiB GPU."""
    sizes = [80 * GiB, 40 * GiB]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(sizes))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=sizes[i]))
    return sizes


def test_hbm_cap_defaults_to_each_ranks_device(two_gpus: list[int]) -> None:
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda")
    assert topo.hbm_caps.tolist() == [80 * GiB, 40 * GiB, 80 * GiB, 40 * GiB]  # rank r -> local GPU r % 2
    assert topo.storage_caps.tolist() == topo.hbm_caps.tolist()


def test_a_given_hbm_cap_wins_and_cpu_topologies_ignore_the_gpu(two_gpus: list[int]) -> None:
    assert Topology(world_size=2, compute_device="cuda", hbm_cap=GiB).hbm_caps.tolist() == [GiB, GiB]
    assert Topology(world_size=2, compute_device="cpu").hbm_caps.tolist() == [0, 0]
    assert Topology(world_size=2).compute_device == "cuda"  # None picks the visible GPU


def test_local_ranks_beyond_the_visible_gpus_take_device_0(two_gpus: list[int]) -> None:
    assert device_hbm_caps(world_size=3, local_world_size=3) == [80 * GiB, 40 * GiB, 80 * GiB]


def test_without_a_gpu_the_default_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_hbm_caps(2, 2) is None
    assert Topology(world_size=2, compute_device="cuda").hbm_caps.tolist() == [32 * GiB, 32 * GiB]


def test_the_planner_uses_the_measured_hbm_and_the_report_shows_it(two_gpus: list[int]) -> None:
    # one 50 GiB table (fp32, no optimizer state): fits the 80 GiB GPU, not the 32 GiB default
    module = tables([(200 * 1024**2 + 1024**2 * 5, 64)])
    sharders = [StandInSharder(fused_params={"optimizer": "sgd"})]
    in_memory = {"t0": ParameterConstraints(compute_kernels=["fused"])}  # not tiered over host memory
    with pytest.raises(PlannerError):
        EmbeddingShardingPlanner(
            topology=Topology(world_size=1, compute_device="cuda", hbm_cap=32 * GiB), constraints=in_memory
        ).plan(module, sharders)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cuda"))
    plan = planner.plan(module, sharders)
    assert plan.plan[""]["t0"].ranks == [0]
    report = planner.last_report
    assert report.hbm_caps.tolist() == [80 * GiB] and report.hbm_bytes[0] > 32 * GiB
    text = report.to_text()
    header, _, row = text.splitlines()[:3]
    assert [c.strip() for c in header.split("|")][:3] == ["rank", "HBM used / cap", "DDR used / cap"]
    assert row.split("|")[1].strip().endswith("/ 80 GiB"), row
