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
    from lightrec.distributed.dmp.fingerprint import RankMismatchError

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
    from lightrec.distributed.dmp.fingerprint import first_difference

    assert first_difference({"a": {"x": 1}}, {"a": {"x": 1}}) is None
    assert first_difference({"a": {"x": 1}}, {"a": {"y": 1}}) == ("a['x']", 1, "<missing>")


# ------------------------------------------------------------------ the same through RecStrategy
def _strategy_rank(
    rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any
) -> None:
    from tests.reliability.torchrun_rank import run_as_torchrun_rank

    run_as_torchrun_rank(rank, world_size, port, reports, lambda: _fit_with_rows(rank, world_size, tmp))


def _fit_with_rows(rank: int, world_size: int, tmp: str) -> str:
    from datetime import timedelta

    import lightning.pytorch as pl

    from lightrec import EmbeddingBagCollection
    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import DIM, ToyDLRM, toy_data

    module = ToyDLRM(device="meta", dense_optimizer="sgd")
    tables = toy_data().table_configs(DIM)
    if rank == 1:
        tables[3].num_embeddings += 1  # another config file on rank 1
    module.model.sparse_arch.embedding_bag_collection = EmbeddingBagCollection(tables, device="meta")
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=2, strategy=RecStrategy(timeout=timedelta(seconds=60)),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp,
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=8))
    return "trained"


def test_rec_strategy_ranks_with_different_tables_fail_fast(tmp_path) -> None:  # noqa: ANN001
    from tests.lightning.test_rank_failure import _launch

    run = _launch(2, -1, "tables", str(tmp_path), target=_strategy_rank)
    for rank in (0, 1):
        status, text, _ = run["reports"][rank]
        assert status == "raised" and text.startswith(
            "RankMismatchError: ranks disagree before training: rank 1"
        ), text
        assert "['t_cat_3']['num_embeddings']" in text.splitlines()[0], text.splitlines()[0]
