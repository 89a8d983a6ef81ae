"""``RecStrategy(plan=...)`` from a recipe config: ``plan: plan.json`` (what ``lightrec plan --json``
writes) reaches the strategy as the plan, whether Lightning's parser hands over the path or the file's
JSON object (it reads a file a config value names)."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonargparse import ActionConfigFile
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser

from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
from lightrec.distributed.types import ShardingPlan
from lightrec.lightning import RecStrategy
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig


def _plan() -> ShardingPlan:
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(name=f"t{i}", num_embeddings=10, embedding_dim=4, feature_names=[f"f{i}"]) for i in range(2)],
        device="meta",
    )
    per_table = {"t0": table_wise(rank=0), "t1": table_wise(rank=1)}
    return ShardingPlan({"model.ebc": construct_module_sharding_plan(ebc, per_table, world_size=2, local_size=2,
                                                                     device_type="cpu")})  # fmt: skip


def test_a_config_naming_the_plan_json_gives_the_strategy_that_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan()
    plan.save(tmp_path / "plan.json")
    (tmp_path / "my.yaml").write_text(
        "trainer:\n  strategy:\n    class_path: lightrec.lightning.RecStrategy\n    init_args:\n      plan: plan.json\n"
    )
    monkeypatch.chdir(tmp_path)
    parser = LightningArgumentParser()
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_lightning_class_args(Trainer, "trainer")
    for args in (["--config", "my.yaml"],
                 ["--trainer.strategy=lightrec.lightning.RecStrategy", "--trainer.strategy.plan=plan.json"]):  # fmt: skip
        strategy = parser.instantiate_classes(parser.parse_args(args)).trainer.strategy
        # the parser read the file: the strategy gets its JSON object (it used to get the object's repr as a path)
        assert isinstance(strategy, RecStrategy)
        assert strategy._plan is not None and strategy._plan.to_dict() == plan.to_dict()
    assert RecStrategy(plan=str(tmp_path / "plan.json"))._plan.to_dict() == plan.to_dict()
    assert RecStrategy(plan=plan)._plan is plan


def test_a_json_object_that_is_not_a_plan_is_refused_naming_the_file_to_give() -> None:
    with pytest.raises(ValueError, match=r"RecStrategy\(plan=...\) got a JSON object that is not a sharding plan"):
        RecStrategy(plan={"version": 1, "tables": {}})
