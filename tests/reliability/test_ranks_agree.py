"""Deliver 3: ranks set up with different plans or table configs fail fast, on every rank, by name.

Real gloo ranks (``tests/multiprocess.run_ranks``) build ``DistributedModelParallel`` with a
process-group timeout of 60 s; each must raise ``RankMismatchError`` within seconds naming rank 1
and the first entry that differs. Before this check, different plans blocked until the timeout
and different table configs trained without an error.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.multiprocess import run_ranks

FAST_S = 10.0


def _model(rows: int) -> Any:
    import torch

    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig

    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(num_embeddings=rows, embedding_dim=4, name="t0", feature_names=["f0"]),
        EmbeddingBagConfig(num_embeddings=20, embedding_dim=4, name="t1", feature_names=["f1"]),
    ]
    return torch.nn.ModuleDict({"ebc": EmbeddingBagCollection(tables, device="meta")})


def _plan(owner_of_t0: int) -> Any:
    from lightrec.distributed import ShardingPlan
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise

    gens = {"t0": table_wise(rank=owner_of_t0), "t1": table_wise(rank=1)}
    module_plan = construct_module_sharding_plan(_model(10)["ebc"], gens, world_size=2)
    return ShardingPlan({"ebc": module_plan})


def _body(rank: int, world_size: int, case: str) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.fingerprint import RankMismatchError

    rows = 11 if (case == "tables" and rank == 1) else 10
    plan = _plan(owner_of_t0=rank) if case == "plan" else None  # rank 0 puts t0 on 0, rank 1 on 1
    started = time.monotonic()
    try:
        DistributedModelParallel(_model(rows), device="cpu", plan=plan)
    except RankMismatchError as exc:
        return {"raised": str(exc), "seconds": time.monotonic() - started}
    return {"raised": None, "seconds": time.monotonic() - started}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "plan",
            r"rank 1 differs from rank 0 at plan\['plan'\]\['ebc'\]\['t0'\]\['ranks'\]: rank 0 has \[0\], rank 1 has \[1\]",
        ),
        (
            "tables",
            r"rank 1 differs from rank 0 at tables\['ebc'\]\['t0'\]\['num_embeddings'\]: rank 0 has 10, rank 1 has 11",
        ),
    ],
)
def test_ranks_with_different_set_ups_fail_fast_on_every_rank(case: str, expected: str) -> None:
    results = run_ranks(_body, world_size=2, args=(case,), timeout=60)
    for rank, result in enumerate(results):
        assert result["raised"] is not None, f"rank {rank} did not raise"
        assert re.search(expected, result["raised"]), result["raised"]
        assert result["seconds"] < FAST_S, result


def test_ranks_with_the_same_set_up_pass() -> None:
    results = run_ranks(_body, world_size=2, args=("same",), timeout=60)
    assert [r["raised"] for r in results] == [None, None]


def test_first_difference_reports_missing_keys() -> None:
    from lightrec.distributed.fingerprint import first_difference

    assert first_difference({"a": {"x": 1}}, {"a": {"x": 1}}) is None
    assert first_difference({"a": {"x": 1}}, {"a": {"y": 1}}) == ("a['x']", 1, "<missing>")
