"""The torchrec-style scripts of docs/examples run with only the word replaced, on 2 gloo ranks:
two-tower retrieval (training, then serving from quantized tables), pretrained rows written into
each rank's shards through ``local_shards()``, and managed-collision training on drifting raw ids."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch

from tests.docs.test_migration_example import check_torchrec_paths
from tests.multiprocess import run_ranks

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
TWO_TOWER = EXAMPLES / "torchrec_two_tower_retrieval.py"
PRETRAINED = EXAMPLES / "torchrec_pretrained_shards.py"
MANAGED_COLLISION = EXAMPLES / "torchrec_managed_collision.py"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _two_tower(rank: int, world_size: int) -> dict:
    return _load(TWO_TOWER).train_and_serve(steps=60)


def test_two_tower_trains_and_serves() -> None:
    results = run_ranks(_two_tower, world_size=2, timeout=300)
    for res in results:
        losses = res["losses"]
        assert len(losses) == 60 and sum(losses[-5:]) / 5 < 0.75 * sum(losses[:5]) / 5
    served, floating = results[0]["served_top_k"], results[0]["float_top_k"]
    users = torch.arange(served.shape[0]).unsqueeze(1)
    assert (served % 2 == users % 2).float().mean() > 0.9  # retrieves the items the planted users like
    assert (served == floating).float().mean() > 0.8  # int8 tables keep the float model's ranking
    check_torchrec_paths(TWO_TOWER)


def _pretrained(rank: int, world_size: int) -> dict:
    return _load(PRETRAINED).load_pretrained_shards()


def test_pretrained_rows_written_into_local_shards() -> None:
    results = run_ranks(_pretrained, world_size=2, timeout=240)
    assert [r["shards_written"] for r in results] == [2, 3]  # rank 1 also holds the table-wise table
    for res in results:
        assert res["max_difference"] < 1e-5
        assert sorted(res["all_shards"].values()) == [1, 2, 2]  # metadata() lists every rank's shards
    check_torchrec_paths(PRETRAINED)


def _managed_collision(rank: int, world_size: int) -> dict:
    return _load(MANAGED_COLLISION).train(steps=32)


def test_managed_collision_training_evicts_and_learns_the_live_ids() -> None:
    results = run_ranks(_managed_collision, world_size=2, timeout=300)
    for res in results:
        losses = res["losses"]
        assert len(losses) == 32 and sum(losses[-5:]) / 5 < 0.4 * sum(losses[:5]) / 5
        assert res["evictions"][-1] > 50  # several times more distinct ids than rows passed through
        assert res["live_accuracy"] > 0.9  # the ids live now kept (or got) rows of their own, and learned
        assert res["evicted_accuracy"] < 0.7  # the first window's ids were evicted: default rows, a guess
    assert results[0]["evictions"] == results[1]["evictions"]  # one count, summed over ranks
    # Row-wise: each rank owns a bucket of the user ids and evicts in it; table-wise: rank 1 owns the item table.
    assert all(res["local_evictions"]["t_user_id"] > 0 for res in results)
    assert "t_item_id" not in results[0]["local_evictions"] and results[1]["local_evictions"]["t_item_id"] > 0
    for name, value in results[0]["dense"].items():
        assert torch.equal(value, results[1]["dense"][name]), name  # data-parallel layers stay replicated
    check_torchrec_paths(MANAGED_COLLISION)
